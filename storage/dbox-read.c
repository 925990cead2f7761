/*
 * dbox-read.c: read the plaintext of one message body (see dbox-read.h).
 *
 * A plain body is read straight with pread.  A gzip body is inflated with
 * zlib; the inflate state is kept between calls, so a sequence of forward
 * reads inflates the body once.  Invariant of a gz reader with `started`
 * set: the zlib stream has consumed compressed bytes [0, in_pos) of the
 * body (part of them may still wait in zs.next_in) and produced plaintext
 * [0, out_pos).  A read behind out_pos resets the stream to the start.
 * A read that reaches the plaintext size also runs the stream to its end,
 * so the gzip trailer (CRC32, length) is checked on every full read.
 *
 * Corruption (bad or truncated gzip data, a body shorter than the index
 * says) is logged once per occurrence and returned as EIO.
 */
#include "dbox-read.h"

#include "log.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

/* Compressed bytes read per pread, and plaintext skipped per inflate when
   seeking forward. */
#define IN_BUF_SIZE (32 * 1024)
#define SKIP_BUF_SIZE (32 * 1024)

struct dbox_reader {
	int fd;
	bool own_fd;           /* close fd at free (dbox_reader_own_fd) */
	uint64_t body_offset, body_size, plain_size;
	enum dbox_compression compression;

	/* gz only */
	z_stream zs;
	bool zs_init;          /* inflateInit2 done (inflateEnd needed) */
	bool started;          /* zs is positioned as described above */
	bool stream_end;       /* inflate returned Z_STREAM_END */
	uint64_t in_pos, out_pos;
	uint8_t in_buf[IN_BUF_SIZE];
};

/* The magics of compression_detect_handler() (reference section 7). */
static const struct {
	enum dbox_compression compression;
	const char *magic;
	size_t len;
} magics[] = {
	{ DBOX_COMPRESSION_GZ, "\x1f\x8b", 2 },
	{ DBOX_COMPRESSION_UNKNOWN, "\xfd" "7zXZ\0", 6 },         /* xz */
	{ DBOX_COMPRESSION_UNKNOWN, "\x28\xb5\x2f\xfd", 4 },      /* zstd */
	{ DBOX_COMPRESSION_UNKNOWN, "Dovecot-LZ4\r\x2a\x9b\xc5", 15 },
};

enum dbox_compression dbox_detect_compression(const void *head, size_t len)
{
	const char *p = head;

	for (size_t i = 0; i < sizeof(magics) / sizeof(magics[0]); i++) {
		if (len >= magics[i].len &&
		    memcmp(p, magics[i].magic, magics[i].len) == 0)
			return magics[i].compression;
	}
	/* bzip2: "BZh" and the block size digit */
	if (len >= 4 && memcmp(p, "BZh", 3) == 0 && p[3] >= '1' && p[3] <= '9')
		return DBOX_COMPRESSION_UNKNOWN;
	return DBOX_COMPRESSION_NONE;
}

/* pread up to len bytes, stopping early only at EOF. */
static ssize_t pread_full(int fd, void *buf, size_t len, uint64_t off)
{
	char *p = buf;
	size_t done = 0;

	while (done < len) {
		ssize_t ret = pread(fd, p + done, len - done, (off_t)(off + done));
		if (ret < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		if (ret == 0)
			break;
		done += (size_t)ret;
	}
	return (ssize_t)done;
}

int dbox_reader_open(int fd, uint64_t body_offset, uint64_t body_size,
		     uint64_t plain_size, struct dbox_reader **reader_r)
{
	char head[16];
	size_t want = body_size < sizeof(head) ? (size_t)body_size : sizeof(head);
	ssize_t len = pread_full(fd, head, want, body_offset);
	struct dbox_reader *reader;

	if (len < 0)
		return -1;
	reader = calloc(1, sizeof(*reader));
	if (reader == NULL)
		return -1;
	reader->fd = fd;
	reader->body_offset = body_offset;
	reader->body_size = body_size;
	reader->plain_size = plain_size;
	reader->compression = dbox_detect_compression(head, (size_t)len);
	if (reader->compression == DBOX_COMPRESSION_UNKNOWN) {
		dbox_error("body at offset %llu: compressed with a codec "
			   "dboxfs cannot read yet",
			   (unsigned long long)body_offset);
		free(reader);
		errno = EIO;
		return -1;
	}
	*reader_r = reader;
	return 0;
}

static ssize_t plain_pread(struct dbox_reader *reader, void *buf, size_t len,
			   uint64_t off)
{
	ssize_t ret;

	if (off + len > reader->body_size) {
		dbox_error("body at offset %llu: plaintext size %llu is past "
			   "the stored size %llu",
			   (unsigned long long)reader->body_offset,
			   (unsigned long long)reader->plain_size,
			   (unsigned long long)reader->body_size);
		errno = EIO;
		return -1;
	}
	ret = pread_full(reader->fd, buf, len, reader->body_offset + off);
	if (ret >= 0 && (size_t)ret < len) {
		dbox_error("body at offset %llu: file ends inside the body",
			   (unsigned long long)reader->body_offset);
		errno = EIO;
		return -1;
	}
	return ret;
}

/* Log a corrupt gzip body and fail with EIO. */
static int gz_corrupt(struct dbox_reader *reader, const char *what)
{
	dbox_error("body at offset %llu: corrupt gzip stream at plaintext "
		   "offset %llu: %s", (unsigned long long)reader->body_offset,
		   (unsigned long long)reader->out_pos, what);
	reader->started = false; /* restart on the next read */
	errno = EIO;
	return -1;
}

/* (Re)start inflating from the first byte of the body. */
static int gz_restart(struct dbox_reader *reader)
{
	int ret;

	if (!reader->zs_init) {
		ret = inflateInit2(&reader->zs, 16 + MAX_WBITS);
		if (ret == Z_OK)
			reader->zs_init = true;
	} else {
		ret = inflateReset(&reader->zs);
	}
	if (ret != Z_OK) {
		errno = ret == Z_MEM_ERROR ? ENOMEM : EIO;
		return -1;
	}
	reader->zs.avail_in = 0;
	reader->in_pos = 0;
	reader->out_pos = 0;
	reader->stream_end = false;
	reader->started = true;
	return 0;
}

/* Feed input if needed and run inflate once on zs's output window.
   Returns 0 (progress or stream end) or -1. */
static int gz_step(struct dbox_reader *reader)
{
	z_stream *zs = &reader->zs;
	uInt avail_out = zs->avail_out;
	int ret;

	if (zs->avail_in == 0 && reader->in_pos < reader->body_size) {
		uint64_t left = reader->body_size - reader->in_pos;
		size_t want = left < IN_BUF_SIZE ? (size_t)left : IN_BUF_SIZE;
		ssize_t got = pread_full(reader->fd, reader->in_buf, want,
					 reader->body_offset + reader->in_pos);
		if (got < 0)
			return -1;
		if ((size_t)got < want)
			return gz_corrupt(reader, "file ends inside the body");
		zs->next_in = reader->in_buf;
		zs->avail_in = (uInt)got;
		reader->in_pos += (uint64_t)got;
	}

	ret = inflate(zs, Z_NO_FLUSH);
	reader->out_pos += avail_out - zs->avail_out;
	switch (ret) {
	case Z_OK:
		return 0;
	case Z_STREAM_END:
		reader->stream_end = true;
		return 0;
	case Z_BUF_ERROR:
		/* No progress possible: the input is used up mid-stream. */
		if (zs->avail_in == 0 && reader->in_pos >= reader->body_size)
			return gz_corrupt(reader, "truncated stream");
		return 0;
	case Z_MEM_ERROR:
		reader->started = false;
		errno = ENOMEM;
		return -1;
	default: /* Z_DATA_ERROR, Z_NEED_DICT, Z_STREAM_ERROR */
		return gz_corrupt(reader, zs->msg != NULL ? zs->msg :
				  "inflate failed");
	}
}

/* Inflate exactly len plaintext bytes into out.  Returns 0 or -1. */
static int gz_inflate(struct dbox_reader *reader, void *out, size_t len)
{
	reader->zs.next_out = out;
	reader->zs.avail_out = (uInt)len;
	while (reader->zs.avail_out > 0) {
		if (reader->stream_end)
			return gz_corrupt(reader, "stream ends before the "
					  "plaintext size from the index");
		if (gz_step(reader) < 0)
			return -1;
	}
	return 0;
}

/* All plaintext was produced: run the stream to its end, so that zlib
   checks the gzip trailer (CRC32 and length) and extra data shows up. */
static int gz_finish(struct dbox_reader *reader)
{
	uint8_t byte;

	while (!reader->stream_end) {
		reader->zs.next_out = &byte;
		reader->zs.avail_out = 1;
		if (gz_step(reader) < 0)
			return -1;
		if (reader->zs.avail_out == 0)
			return gz_corrupt(reader, "stream is longer than the "
					  "plaintext size from the index");
	}
	return 0;
}

static ssize_t gz_pread(struct dbox_reader *reader, void *buf, size_t len,
			uint64_t off)
{
	if ((!reader->started || off < reader->out_pos) &&
	    gz_restart(reader) < 0)
		return -1;

	if (off > reader->out_pos) {
		char *skip = malloc(SKIP_BUF_SIZE);

		if (skip == NULL)
			return -1;
		while (off > reader->out_pos) {
			uint64_t gap = off - reader->out_pos;
			size_t n = gap < SKIP_BUF_SIZE ? (size_t)gap
						       : SKIP_BUF_SIZE;
			if (gz_inflate(reader, skip, n) < 0) {
				free(skip);
				return -1;
			}
		}
		free(skip);
	}
	/* avail_out is a uInt: inflate in pieces that fit. */
	for (size_t done = 0; done < len; ) {
		size_t n = len - done < UINT32_MAX / 2 ? len - done
						       : UINT32_MAX / 2;
		if (gz_inflate(reader, (char *)buf + done, n) < 0)
			return -1;
		done += n;
	}
	if (reader->out_pos == reader->plain_size && gz_finish(reader) < 0)
		return -1;
	return (ssize_t)len;
}

ssize_t dbox_reader_pread(struct dbox_reader *reader, void *buf, size_t len,
			  uint64_t off)
{
	if (off >= reader->plain_size || len == 0)
		return 0;
	if (len > reader->plain_size - off)
		len = (size_t)(reader->plain_size - off);
	if (len > SSIZE_MAX)
		len = SSIZE_MAX;

	if (reader->compression == DBOX_COMPRESSION_GZ)
		return gz_pread(reader, buf, len, off);
	return plain_pread(reader, buf, len, off);
}

void dbox_reader_free(struct dbox_reader **reader)
{
	if (reader == NULL || *reader == NULL)
		return;
	if ((*reader)->zs_init)
		inflateEnd(&(*reader)->zs);
	if ((*reader)->own_fd)
		close((*reader)->fd);
	free(*reader);
	*reader = NULL;
}

void dbox_reader_own_fd(struct dbox_reader *reader)
{
	reader->own_fd = true;
}
