/*
 * dbox-scan.c: find every whole record of a possibly damaged m.N (see
 * dbox-scan.h).
 *
 * Invariant: the scan position only moves forward, to the end of a whole
 * record or to the next candidate found by the search, so a scan of a
 * file of n bytes reads each byte a bounded number of times and always
 * ends, whatever the bytes are.
 */
#include "dbox-scan.h"

#include "dbox-record.h"
#include "io.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Bytes searched per pread when looking for the next record. */
#define SCAN_CHUNK (64 * 1024)

/* Is there plausibly a record at `offset`: a message header that parses
   and, right after its body, the metadata magic?  Cheap checks before
   dbox_record_verify reads the whole record.  Returns 1, 0, or a negative
   errno on a read error. */
static int candidate(int fd, uint64_t offset, uint64_t end)
{
	uint8_t header[DBOX_MSG_HEADER_SIZE];
	char magic[DBOX_MAGIC_POST_LEN];
	uint64_t body_size, pos;
	ssize_t n;

	if (end - offset < DBOX_MSG_HEADER_SIZE + DBOX_MAGIC_POST_LEN)
		return 0;
	n = dbox_pread_full(fd, header, sizeof(header), offset);
	if (n < 0)
		return (int)n;
	if ((size_t)n < sizeof(header) ||
	    dbox_msg_header_parse(header, &body_size, NULL) < 0 ||
	    body_size > end - offset - DBOX_MSG_HEADER_SIZE - DBOX_MAGIC_POST_LEN)
		return 0;
	pos = offset + DBOX_MSG_HEADER_SIZE + body_size;
	n = dbox_pread_full(fd, magic, sizeof(magic), pos);
	if (n < 0)
		return (int)n;
	return (size_t)n == sizeof(magic) &&
		memcmp(magic, DBOX_MAGIC_POST, DBOX_MAGIC_POST_LEN) == 0;
}

/* Try to read a whole record at offset, ending at or before end.  Returns
   1 (filled), 0 (none there), or a negative errno on a read error. */
static int record_at(int fd, uint64_t offset, uint64_t end,
		     uint64_t *body_size_r, struct dbox_metadata *md_r,
		     uint64_t *record_size_r)
{
	int ret = candidate(fd, offset, end);

	if (ret <= 0)
		return ret;
	ret = dbox_record_verify(fd, offset, UINT64_MAX, body_size_r, md_r,
				 record_size_r, NULL);
	if (ret < 0)
		return ret == -DBOX_ECORRUPT ? 0 : ret;
	if (*record_size_r > end - offset) {
		dbox_metadata_clear(md_r);
		return 0;
	}
	return 1;
}

/* The first offset in [from, end) where a whole record starts, or end,
   into *next_r.  Holes of a sparse file are skipped (SEEK_DATA): they
   read as zeros, where no record starts, and a store's owner can make
   one of a terabyte on a few blocks.  Returns 0 or a negative errno. */
static int find_next(int fd, uint64_t from, uint64_t end, uint64_t *next_r)
{
	char *buf = malloc(SCAN_CHUNK);
	uint64_t pos = from;
	int ret;

	if (buf == NULL)
		return -ENOMEM;
	while (pos < end) {
		off_t data = lseek(fd, (off_t)pos, SEEK_DATA);
		size_t want;
		ssize_t n;
		size_t i = 0;

		if (data < 0 && errno == ENXIO)
			break; /* only a hole up to the end of the file */
		if (data > (off_t)pos)
			pos = (uint64_t)data;
		if (pos >= end)
			break;
		want = end - pos < SCAN_CHUNK ? (size_t)(end - pos) : SCAN_CHUNK;
		n = dbox_pread_full(fd, buf, want, pos);

		if (n < 0) {
			ret = (int)n;
			goto fail;
		}
		if (n == 0)
			break;
		while (i + 1 < (size_t)n) {
			char *hit = memchr(buf + i, 0x01, (size_t)n - i - 1);

			if (hit == NULL)
				break;
			i = (size_t)(hit - buf);
			if (hit[1] == 0x02) {
				ret = candidate(fd, pos + i, end);
				if (ret < 0)
					goto fail;
				if (ret > 0) {
					struct dbox_metadata md;
					uint64_t body_size, record_size;

					ret = record_at(fd, pos + i, end,
							&body_size, &md,
							&record_size);
					if (ret < 0)
						goto fail;
					if (ret > 0) {
						dbox_metadata_clear(&md);
						free(buf);
						*next_r = pos + i;
						return 0;
					}
				}
			}
			i++;
		}
		/* The last byte may be the 0x01 of a magic split by the
		   chunk boundary: look at it again. */
		pos += (size_t)n > 1 ? (size_t)n - 1 : (size_t)n;
	}
	free(buf);
	*next_r = end;
	return 0;
fail:
	free(buf);
	return ret;
}

/* The record at pos of a scan: 1 and its parts when a whole record
   ending at or before end is there, 0 with *fault saying why when not, or
   a negative errno on a read error. */
static int scan_record(int fd, uint64_t pos, uint64_t end,
		       uint64_t *body_size_r, struct dbox_metadata *md_r,
		       uint64_t *record_size_r, struct dbox_fault *fault)
{
	int ret = dbox_record_verify(fd, pos, UINT64_MAX, body_size_r, md_r,
				     record_size_r, fault);

	if (ret == -DBOX_ECORRUPT)
		return 0;
	if (ret < 0)
		return ret;
	if (*record_size_r <= end - pos)
		return 1;
	dbox_metadata_clear(md_r);
	dbox_fault_set(fault, pos, "the record runs past the end (%llu)",
		       (unsigned long long)end);
	return 0;
}

int dbox_file_scan(int fd, uint32_t file_id, uint64_t end,
		   dbox_walk_cb_t *cb, dbox_bad_cb_t *bad_cb, void *ctx,
		   bool *header_ok_r)
{
	struct dbox_fault fault;
	struct dbox_metadata md;
	struct stat st;
	size_t header_len;
	uint64_t pos, body_size, record_size, next = end;
	int ret;

	if (fstat(fd, &st) < 0)
		return -errno;
	if (end > (uint64_t)st.st_size)
		end = (uint64_t)st.st_size;
	if ((ret = dbox_file_read_header(fd, &header_len)) == 0) {
		pos = header_len < end ? header_len : end;
		if (header_ok_r != NULL)
			*header_ok_r = true;
	} else {
		if (ret != -EIO)
			return ret;
		dbox_fault_set(&fault, 0, "not a dbox v2 file header");
		pos = 0;
		if (header_ok_r != NULL)
			*header_ok_r = false;
	}
	while (pos < end) {
		/* Where a record should start, read it with its reason, so
		   a bad region says what is wrong at its start. */
		ret = pos == 0 ? 0 : scan_record(fd, pos, end, &body_size, &md,
						 &record_size, &fault);
		if (ret < 0)
			return ret;
		if (ret > 0) {
			ret = cb(ctx, pos, body_size, &md, record_size);
			dbox_metadata_clear(&md);
			if (ret != 0)
				return ret;
			pos += record_size;
			continue;
		}
		if ((ret = find_next(fd, pos + 1, end, &next)) < 0)
			return ret;
		if (bad_cb != NULL &&
		    (ret = bad_cb(ctx, pos, next, &fault)) != 0)
			return ret;
		pos = next;
	}
	return 0;
}

long dbox_file_tail_records(int fd, uint32_t file_id, uint64_t start,
			    uint64_t stop, uint64_t *end_r,
			    dbox_walk_cb_t *cb, void *ctx)
{
	struct stat sb;
	uint64_t off = start;
	long count = 0;

	*end_r = start;
	if (fstat(fd, &sb) < 0)
		return -errno;
	while (off < (uint64_t)sb.st_size && off < stop) {
		struct dbox_metadata md;
		uint64_t body_size, record_size;
		int ret;

		memset(&md, 0, sizeof(md));
		ret = dbox_record_verify(fd, off, UINT64_MAX, &body_size, &md,
					 &record_size, NULL);
		if (ret == -DBOX_ECORRUPT)
			break;
		if (ret < 0) {
			*end_r = off;
			return ret;
		}
		if (off + record_size > stop) {
			dbox_metadata_clear(&md);
			break;
		}
		if (cb != NULL)
			(void)cb(ctx, off, body_size, &md, record_size);
		dbox_metadata_clear(&md);
		off += record_size;
		count++;
	}
	*end_r = off;
	return count;
}
