/*
 * dbox-file.c: the I/O on one storage/m.N file (see dbox-file.h): create it
 * with its header line, append one record at a time, read a record back
 * and walk all records.
 *
 * Invariants kept here:
 * - Every offset we write, and the end of every record we finish, stays
 *   below DBOX_FILE_SIZE_MAX: the map index stores offsets and sizes as
 *   uint32_t (docs/dbox-format.md section 6).  Past it we fail with EFBIG.
 * - While a record is open for appending, the file ends at the body end
 *   (offset + 30 + body_size), except after a finish, when the metadata
 *   block follows; any write that would leave old metadata bytes inside
 *   the body drops that block first, so gaps in the body read as zeros.
 * - Corruption is reported as -EIO and logged once, here, as
 *   "m.<id> offset <n>: <what>".
 * - Every function returns 0 (or a descriptor) or a negative errno
 *   (storage/dbox-fault.h).  The read functions dbox-scan.c calls
 *   (dbox_file_read_header, dbox_record_read) set errno to the same code
 *   as well, until that file reads the return value (issue #13).
 */
#include "dbox-file.h"

#include "dbox-record.h"
#include "io.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Largest file offset a record may reach (map offsets are uint32_t). */
#define DBOX_FILE_SIZE_MAX ((uint64_t)UINT32_MAX)
/* Bytes read at once when computing a vsize or reading metadata. */
#define IO_CHUNK (64 * 1024)
/* How much of a file's start we read to find its header line. */
#define FILE_HEADER_READ 512

/* pwrite all of buf.  Returns 0 or -errno of pwrite. */
static int pwrite_full(int fd, const void *buf, size_t len, uint64_t off)
{
	const char *p = buf;

	while (len > 0) {
		ssize_t ret = pwrite(fd, p, len, (off_t)off);
		if (ret < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += ret;
		len -= (size_t)ret;
		off += (uint64_t)ret;
	}
	return 0;
}

/* ftruncate to `size` bytes.  Returns 0 or -errno of ftruncate. */
static int truncate_to(int fd, uint64_t size)
{
	return ftruncate(fd, (off_t)size) < 0 ? -errno : 0;
}

void dbox_file_name(char *buf, uint32_t file_id)
{
	snprintf(buf, 16, "m.%u", file_id);
}

bool dbox_mfile_parse_name(const char *name, uint32_t *file_id_r)
{
	const char *p = name + 2;
	uint64_t id = 0;

	if (strncmp(name, "m.", 2) != 0 || *p < '1' || *p > '9')
		return false;
	for (; *p >= '0' && *p <= '9'; p++) {
		id = id * 10 + (uint64_t)(*p - '0');
		if (id > UINT32_MAX)
			return false;
	}
	if (*p != '\0')
		return false;
	*file_id_r = (uint32_t)id;
	return true;
}

int dbox_file_create(int dirfd, uint32_t file_id, uint64_t *size_r)
{
	char name[16], header[DBOX_FILE_HEADER_MAX];
	size_t len = dbox_file_header_format(header, time(NULL));
	int fd, ret;

	dbox_file_name(name, file_id);
	fd = openat(dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if ((ret = pwrite_full(fd, header, len, 0)) < 0) {
		/* Leave no headerless m.N behind to trip EEXIST later. */
		unlinkat(dirfd, name, 0);
		close(fd);
		return ret;
	}
	*size_r = len;
	return fd;
}

/* dbox_file_read_header, logging corruption when file_id is known. */
static int read_header(int fd, const uint32_t *file_id, size_t *header_len_r)
{
	char buf[FILE_HEADER_READ];
	unsigned int msg_header_size;
	time_t created;
	ssize_t len = dbox_pread_full(fd, buf, sizeof(buf), 0);

	if (len < 0)
		return (int)len;
	if (dbox_file_header_parse(buf, (size_t)len, header_len_r,
				   &msg_header_size, &created, NULL) < 0) {
		if (file_id != NULL) {
			dbox_error("m.%u offset 0: not a dbox v2 file header "
				   "(need \"2 M1e ...\\n\")", *file_id);
		}
		return -EIO;
	}
	return 0;
}

int dbox_file_read_header(int fd, size_t *header_len_r)
{
	return read_header(fd, NULL, header_len_r);
}

/* -EFBIG unless the record may extend to file offset `end`, else 0. */
static int check_end(uint64_t end)
{
	return end > DBOX_FILE_SIZE_MAX ? -EFBIG : 0;
}

/* Body byte `off` of the record as a file offset. */
static uint64_t body_pos(const struct dbox_append *ap, uint64_t off)
{
	return ap->offset + DBOX_MSG_HEADER_SIZE + off;
}

bool dbox_append_unsealed_at(int fd, uint64_t offset)
{
	uint8_t buf[DBOX_MSG_HEADER_SIZE];

	return dbox_pread_full(fd, buf, sizeof(buf), offset) ==
		(ssize_t)sizeof(buf) && dbox_msg_header_is_unsealed(buf);
}

int dbox_append_begin(struct dbox_append *ap, int fd, uint64_t offset)
{
	uint8_t placeholder[DBOX_MSG_HEADER_SIZE];

	dbox_msg_header_unsealed(placeholder);
	memset(ap, 0, sizeof(*ap));
	ap->fd = fd;
	ap->offset = offset;
	ap->end = body_pos(ap, 0);
	if (offset > DBOX_FILE_SIZE_MAX || check_end(body_pos(ap, 0)) < 0)
		return -EFBIG;
	return pwrite_full(fd, placeholder, sizeof(placeholder), offset);
}

/* pwrite all of buf at file offset off for the record, noting how far
   the file may reach now (before the write: a failed write may have
   written part of it). */
static int record_pwrite(struct dbox_append *ap, const void *buf,
			 size_t len, uint64_t off)
{
	if (off + len > ap->end)
		ap->end = off + len;
	return pwrite_full(ap->fd, buf, len, off);
}

/* ftruncate the record's file to size: the file ends there now. */
static int record_truncate(struct dbox_append *ap, uint64_t size)
{
	int ret = truncate_to(ap->fd, size);

	if (ret == 0)
		ap->end = size;
	return ret;
}

/* After a finish, the metadata block follows the body.  Before the body
   grows past its old end with a gap, drop the block so the gap reads as
   zeros, not as stale metadata. */
static int drop_metadata(struct dbox_append *ap)
{
	if (ap->record_size == 0)
		return 0;
	return record_truncate(ap, body_pos(ap, ap->body_size));
}

int dbox_append_pwrite(struct dbox_append *ap, const void *buf, size_t len,
		       uint64_t off)
{
	int ret;

	if (off > DBOX_FILE_SIZE_MAX || len > DBOX_FILE_SIZE_MAX ||
	    check_end(body_pos(ap, off + len)) < 0)
		return -EFBIG;
	if ((off > ap->body_size && (ret = drop_metadata(ap)) < 0) ||
	    (ret = record_pwrite(ap, buf, len, body_pos(ap, off))) < 0)
		return ret;
	if (off + len > ap->body_size)
		ap->body_size = off + len;
	return 0;
}

int dbox_append_truncate(struct dbox_append *ap, uint64_t size)
{
	int ret;

	if (size > DBOX_FILE_SIZE_MAX || check_end(body_pos(ap, size)) < 0)
		return -EFBIG;
	if ((size > ap->body_size && (ret = drop_metadata(ap)) < 0) ||
	    (ret = record_truncate(ap, body_pos(ap, size))) < 0)
		return ret;
	ap->body_size = size;
	return 0;
}

/* Compute the vsize of the record's body by reading it back.  Returns 0,
   -ENOMEM, -EIO (the file is shorter than the body) or -errno of pread. */
static int body_vsize(const struct dbox_append *ap, uint64_t *vsize_r)
{
	char *buf = malloc(IO_CHUNK);
	uint64_t off = 0, vsize = 0;
	bool prev_cr = false;

	if (buf == NULL)
		return -ENOMEM;
	while (off < ap->body_size) {
		uint64_t left = ap->body_size - off;
		size_t want = left < IO_CHUNK ? (size_t)left : IO_CHUNK;
		ssize_t ret = dbox_pread_full(ap->fd, buf, want,
					      body_pos(ap, off));

		if (ret <= 0) {
			free(buf);
			/* 0: the file is shorter than the body */
			return ret == 0 ? -EIO : (int)ret;
		}
		vsize += dbox_vsize_add(buf, (size_t)ret, prev_cr, &prev_cr);
		off += (uint64_t)ret;
	}
	free(buf);
	*vsize_r = vsize;
	return 0;
}

int dbox_append_finish(struct dbox_append *ap, struct dbox_metadata *md)
{
	uint8_t header[DBOX_MSG_HEADER_SIZE];
	uint64_t meta_pos = body_pos(ap, ap->body_size);
	char *block;
	long block_len;
	int ret;

	if (!md->has_vsize) {
		if ((ret = body_vsize(ap, &md->vsize)) < 0)
			return ret;
		md->has_vsize = true;
	}
	block_len = dbox_metadata_format(md, &block);
	if (block_len < 0)
		return -ENOMEM; /* its only failure */
	dbox_msg_header_format(header, ap->body_size);

	/* Metadata first, then the real header over the placeholder, as
	   Dovecot does: a reader never sees a header without its block. */
	if ((ret = check_end(meta_pos + (uint64_t)block_len)) == 0 &&
	    (ret = record_pwrite(ap, block, (size_t)block_len,
				 meta_pos)) == 0 &&
	    (ret = record_pwrite(ap, header, sizeof(header),
				 ap->offset)) == 0 &&
	    (ap->end == meta_pos + (uint64_t)block_len ||
	     (ret = record_truncate(ap, meta_pos + (uint64_t)block_len)) == 0))
		ap->record_size = meta_pos + (uint64_t)block_len - ap->offset;
	free(block);
	return ret;
}

int dbox_append_abort(struct dbox_append *ap)
{
	return record_truncate(ap, ap->offset);
}

int dbox_record_read(int fd, uint32_t file_id, uint64_t offset,
		     uint64_t expected_body_size, uint64_t *body_size_r,
		     struct dbox_metadata *md_r, uint64_t *record_size_r)
{
	struct dbox_fault fault;
	int ret = dbox_record_verify(fd, offset, expected_body_size,
				     body_size_r, md_r, record_size_r, &fault);

	if (ret == -DBOX_ECORRUPT) {
		/* File 0 is no m.N (a lost+found copy): its caller names it. */
		if (file_id != 0)
			dbox_error("m.%u offset %llu: %s", file_id,
				   (unsigned long long)offset, fault.reason);
		ret = -EIO;
	}
	return ret;
}

int dbox_file_walk(int fd, uint32_t file_id, dbox_walk_cb_t *cb, void *ctx,
		   uint64_t *bad_offset_r)
{
	struct dbox_metadata md;
	struct stat st;
	size_t header_len;
	uint64_t offset = 0, body_size, record_size;
	int ret;

	if (fstat(fd, &st) < 0) {
		ret = -errno;
		goto failed;
	}
	if ((ret = read_header(fd, &file_id, &header_len)) < 0)
		goto failed;
	for (offset = header_len; offset < (uint64_t)st.st_size;
	     offset += record_size) {
		if ((ret = dbox_record_read(fd, file_id, offset, UINT64_MAX,
					    &body_size, &md,
					    &record_size)) < 0)
			goto failed;
		ret = cb(ctx, offset, body_size, &md, record_size);
		dbox_metadata_clear(&md);
		if (ret != 0)
			return ret;
	}
	return 0;

failed:
	if (bad_offset_r != NULL)
		*bad_offset_r = offset;
	return ret;
}

int dbox_record_set_received(int fd, uint32_t file_id, uint64_t offset,
			     time_t received)
{
	uint8_t header[DBOX_MSG_HEADER_SIZE];
	char block[4096], value[32];
	uint64_t body_size, pos;
	ssize_t len;
	size_t line;
	int width;

	len = dbox_pread_full(fd, header, sizeof(header), offset);
	if (len < 0)
		return (int)len;
	if (len != sizeof(header) ||
	    dbox_msg_header_parse(header, &body_size, NULL) < 0)
		return -EIO;
	pos = offset + DBOX_MSG_HEADER_SIZE + body_size;
	len = dbox_pread_full(fd, block, sizeof(block), pos);
	if (len < 0)
		return (int)len;
	if (len < DBOX_MAGIC_POST_LEN ||
	    memcmp(block, DBOX_MAGIC_POST, DBOX_MAGIC_POST_LEN) != 0)
		return -EIO;
	/* Find the R line among "<key><value>\n" lines, before the empty
	   line that ends the block. */
	for (line = DBOX_MAGIC_POST_LEN; line < (size_t)len && block[line] != '\n';) {
		char *nl = memchr(block + line, '\n', (size_t)len - line);

		if (nl == NULL)
			break;
		if (block[line] == 'R') {
			width = snprintf(value, sizeof(value), "%llx",
					 (unsigned long long)received);
			if (width != nl - (block + line + 1))
				return -ERANGE;
			return pwrite_full(fd, value, (size_t)width,
					   pos + line + 1);
		}
		line = (size_t)(nl - block) + 1;
	}
	return -ENOENT;
}
