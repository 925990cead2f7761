/*
 * dbox-read.c: read the plaintext of one message body (see dbox-read.h).
 *
 * A plain body is read straight with pread.  A compressed body is decoded
 * by its codec (dbox-codec.h); the decoder state is kept between calls, so
 * a sequence of forward reads decodes the body once.  Invariant of a
 * compressed reader with `started` set: the decoder has been given body
 * bytes [0, in_pos) (of which in_buf[in_next, in_next + in_len) are not
 * consumed yet) and has produced plaintext [0, out_pos), the last win_len
 * bytes of which are in the window ring (plaintext offset p at
 * window[p % DBOX_READ_WINDOW]).
 *
 * A read behind out_pos is served from the window when it can be, else
 * the decoder starts again from the body start.  A read that reaches the
 * plaintext size also runs the decoder to the end of the body, so the
 * codec's own checks (gzip CRC32 and length, xz and zstd checksums, bzip2
 * block CRCs) run on every full read and a stream longer than the index
 * says is caught.  A body holding several streams one after another (as
 * gzip -d accepts concatenated members) is read as their concatenation.
 *
 * Corruption (bad or truncated data, a body shorter or longer than the
 * index says) is returned as -DBOX_ECORRUPT: its reason goes to the
 * caller's struct dbox_fault (dbox_reader_pread_fault), or is logged once
 * per occurrence when the caller gave none.
 */
#include "dbox-read.h"

#include "dbox-codec.h"
#include "io.h"
#include "log.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Compressed bytes read per pread, and plaintext decoded at once when
   skipping forward. */
#define IN_BUF_SIZE (64 * 1024)
#define SKIP_BUF_SIZE (64 * 1024)

struct dbox_reader {
	int fd;
	bool own_fd;           /* close fd at free (dbox_reader_own_fd) */
	uint64_t body_offset, body_size, plain_size;
	enum dbox_compression compression;
	const struct dbox_codec *codec; /* NULL: plain body */

	/* compressed bodies only */
	void *state;           /* decoder, from the first read on */
	bool started;          /* the invariant above holds */
	bool stream_end;       /* the last stream ended at the body end */
	uint64_t in_pos, out_pos;
	size_t in_next, in_len;
	uint8_t *in_buf;       /* IN_BUF_SIZE */
	uint8_t *window;       /* DBOX_READ_WINDOW */
	size_t win_len;
	uint8_t *skip_buf;     /* SKIP_BUF_SIZE, when first skipping */
	char *name;            /* log prefix (dbox_reader_set_name), or NULL */
	struct dbox_fault *fault; /* the caller's, during one read, or NULL:
				     corruption is then logged */
	char offset_name[40];  /* "body at offset N", the default prefix */
};

/* compression_detect_handler()'s magics (docs/dbox-format.md section 7). */
static const struct {
	enum dbox_compression compression;
	const char *magic;
	size_t len;
} magics[] = {
	{ DBOX_COMPRESSION_GZ, "\x1f\x8b", 2 },
	{ DBOX_COMPRESSION_XZ, "\xfd" "7zXZ\0", 6 },
	{ DBOX_COMPRESSION_ZSTD, "\x28\xb5\x2f\xfd", 4 },
	{ DBOX_COMPRESSION_LZ4, "Dovecot-LZ4\r\x2a\x9b\xc5", 15 },
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
		return DBOX_COMPRESSION_BZ2;
	return DBOX_COMPRESSION_NONE;
}

const struct dbox_codec *dbox_codec_get(enum dbox_compression compression)
{
	switch (compression) {
	case DBOX_COMPRESSION_NONE:
		break;
	case DBOX_COMPRESSION_GZ:
		return &dbox_codec_gz;
	case DBOX_COMPRESSION_BZ2:
		return &dbox_codec_bz2;
	case DBOX_COMPRESSION_XZ:
		return &dbox_codec_xz;
	case DBOX_COMPRESSION_ZSTD:
		return &dbox_codec_zstd;
	case DBOX_COMPRESSION_LZ4:
		return &dbox_codec_lz4;
	}
	return NULL;
}

const struct dbox_codec *dbox_codec_by_name(const char *name, size_t len)
{
	static const struct dbox_codec *const all[] = {
		&dbox_codec_gz, &dbox_codec_bz2, &dbox_codec_xz,
		&dbox_codec_zstd, &dbox_codec_lz4,
	};

	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		if (strlen(all[i]->name) == len &&
		    memcmp(all[i]->name, name, len) == 0)
			return all[i];
	}
	return NULL;
}

int dbox_reader_open(int fd, uint64_t body_offset, uint64_t body_size,
		     uint64_t plain_size, struct dbox_reader **reader_r)
{
	char head[16];
	size_t want = body_size < sizeof(head) ? (size_t)body_size : sizeof(head);
	ssize_t len = dbox_pread_full(fd, head, want, body_offset);
	struct dbox_reader *reader;

	if (len < 0)
		return (int)len;
	reader = calloc(1, sizeof(*reader));
	if (reader == NULL)
		return -ENOMEM;
	reader->fd = fd;
	reader->body_offset = body_offset;
	snprintf(reader->offset_name, sizeof(reader->offset_name),
		 "body at offset %llu", (unsigned long long)body_offset);
	reader->body_size = body_size;
	reader->plain_size = plain_size;
	reader->compression = dbox_detect_compression(head, (size_t)len);
	reader->codec = dbox_codec_get(reader->compression);
	*reader_r = reader;
	return 0;
}

enum dbox_compression dbox_reader_compression(const struct dbox_reader *reader)
{
	return reader->compression;
}

/* The log prefix: the name the caller set, else the body offset. */
static const char *where(const struct dbox_reader *reader)
{
	return reader->name != NULL ? reader->name : reader->offset_name;
}

/* The body is corrupt: the reason (printf-style) into the caller's fault,
   or logged after the reader's name.  Returns -DBOX_ECORRUPT. */
static int fault(struct dbox_reader *reader, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static int fault(struct dbox_reader *reader, const char *fmt, ...)
{
	char reason[sizeof(reader->fault->reason)];
	va_list args;

	va_start(args, fmt);
	vsnprintf(reason, sizeof(reason), fmt, args);
	va_end(args);
	if (reader->fault != NULL)
		return dbox_fault_set(reader->fault, reader->body_offset, "%s",
				      reason);
	dbox_error("%s: %s", where(reader), reason);
	return -DBOX_ECORRUPT;
}

static ssize_t plain_pread(struct dbox_reader *reader, void *buf, size_t len,
			   uint64_t off)
{
	ssize_t ret;

	if (off + len > reader->body_size)
		return fault(reader, "plaintext size %llu is past the stored "
			     "size %llu", (unsigned long long)reader->plain_size,
			     (unsigned long long)reader->body_size);
	ret = dbox_pread_full(reader->fd, buf, len, reader->body_offset + off);
	if (ret < 0)
		return (int)ret;
	if ((size_t)ret < len)
		return fault(reader, "file ends inside the body");
	return ret;
}

/* A corrupt body (fault); the next read restarts. */
static int corrupt(struct dbox_reader *reader, const char *what)
{
	reader->started = false;
	return fault(reader, "corrupt %s stream at plaintext offset %llu: %s",
		     reader->codec->long_name,
		     (unsigned long long)reader->out_pos, what);
}

/* A failure that is not the body's fault (-ENOMEM, a pread error). */
static int failed(struct dbox_reader *reader, int ret)
{
	reader->started = false;
	return ret;
}

/* (Re)start decoding from the first byte of the body.  Returns 0 or a
   negative errno. */
static int restart(struct dbox_reader *reader)
{
	const struct dbox_codec *codec = reader->codec;
	int ret;

	if (reader->in_buf == NULL &&
	    (reader->in_buf = malloc(IN_BUF_SIZE)) == NULL)
		return -ENOMEM;
	if (reader->window == NULL &&
	    (reader->window = malloc(DBOX_READ_WINDOW)) == NULL)
		return -ENOMEM;
	ret = reader->state == NULL ? codec->decoder_new(&reader->state) :
		codec->decoder_reset(reader->state);
	if (ret < 0)
		return ret;
	reader->in_pos = reader->out_pos = 0;
	reader->in_next = reader->in_len = 0;
	reader->win_len = 0;
	reader->stream_end = false;
	reader->started = true;
	return 0;
}

/* Remember plaintext [out_pos, out_pos + len) = data in the window. */
static void window_add(struct dbox_reader *reader, const uint8_t *data,
		       size_t len)
{
	uint64_t pos = reader->out_pos;
	size_t at, n;

	if (len > DBOX_READ_WINDOW) {
		data += len - DBOX_READ_WINDOW;
		pos += len - DBOX_READ_WINDOW;
		len = DBOX_READ_WINDOW;
	}
	at = (size_t)(pos % DBOX_READ_WINDOW);
	n = DBOX_READ_WINDOW - at < len ? DBOX_READ_WINDOW - at : len;
	memcpy(reader->window + at, data, n);
	memcpy(reader->window, data + n, len - n);
	reader->win_len += len;
	if (reader->win_len > DBOX_READ_WINDOW)
		reader->win_len = DBOX_READ_WINDOW;
}

/* Copy plaintext [off, off + len) from the window (it must be there). */
static void window_get(const struct dbox_reader *reader, void *buf,
		       size_t len, uint64_t off)
{
	size_t at = (size_t)(off % DBOX_READ_WINDOW);
	size_t n = DBOX_READ_WINDOW - at < len ? DBOX_READ_WINDOW - at : len;

	memcpy(buf, reader->window + at, n);
	memcpy((uint8_t *)buf + n, reader->window, len - n);
}

/* Read the next compressed bytes into in_buf.  Returns 0 or a negative
   errno (-DBOX_ECORRUPT: the file ends inside the body). */
static int refill(struct dbox_reader *reader)
{
	uint64_t left = reader->body_size - reader->in_pos;
	size_t want = left < IN_BUF_SIZE ? (size_t)left : IN_BUF_SIZE;
	ssize_t got = dbox_pread_full(reader->fd, reader->in_buf, want,
				      reader->body_offset + reader->in_pos);

	if (got < 0)
		return failed(reader, (int)got);
	if ((size_t)got < want)
		return corrupt(reader, "file ends inside the body");
	reader->in_next = 0;
	reader->in_len = (size_t)got;
	reader->in_pos += (uint64_t)got;
	return 0;
}

/* One decoder call producing into out[0..*len); *len is reduced by what
   was produced.  Returns 0 (progress, or the stream ended) or a negative
   errno. */
static int decode_step(struct dbox_reader *reader, uint8_t *out, size_t *len)
{
	struct dbox_codec_io io;
	enum dbox_codec_ret ret;
	size_t consumed, produced;
	int err;

	if (reader->in_len == 0 && reader->in_pos < reader->body_size &&
	    (err = refill(reader)) < 0)
		return err;
	io = (struct dbox_codec_io){
		.in = reader->in_buf + reader->in_next,
		.in_len = reader->in_len,
		.out = out,
		.out_len = *len,
		.in_end = reader->in_pos == reader->body_size,
	};
	ret = reader->codec->decode(reader->state, &io);
	consumed = reader->in_len - io.in_len;
	produced = *len - io.out_len;
	reader->in_next += consumed;
	reader->in_len -= consumed;
	window_add(reader, out, produced);
	reader->out_pos += produced;
	*len -= produced;

	switch (ret) {
	case DBOX_CODEC_ERROR:
		return corrupt(reader, io.error != NULL ? io.error :
			       "decoder failed");
	case DBOX_CODEC_NOMEM:
		return failed(reader, -ENOMEM);
	case DBOX_CODEC_END:
		if (reader->in_len == 0 && reader->in_pos == reader->body_size) {
			reader->stream_end = true;
			return 0;
		}
		/* More bytes follow the stream: the next stream. */
		if ((err = reader->codec->decoder_reset(reader->state)) < 0)
			return failed(reader, err);
		return 0;
	case DBOX_CODEC_OK:
		break;
	}
	if (consumed == 0 && produced == 0) {
		if (reader->in_len == 0 && reader->in_pos == reader->body_size)
			return corrupt(reader, "truncated stream");
		if (reader->in_len > 0 && *len > 0)
			return corrupt(reader, "decoder stalled");
	}
	return 0;
}

/* Decode exactly len plaintext bytes into out.  Returns 0 or a negative
   errno. */
static int decode(struct dbox_reader *reader, void *out, size_t len)
{
	uint8_t *p = out;
	int ret;

	while (len > 0) {
		size_t before = len;

		if (reader->stream_end)
			return corrupt(reader, "stream ends before the "
				       "plaintext size from the index");
		if ((ret = decode_step(reader, p, &len)) < 0)
			return ret;
		p += before - len;
	}
	return 0;
}

/* All plaintext was produced: run the decoder to the end of the body, so
   trailers and checksums are checked and extra plaintext shows up. */
static int decode_finish(struct dbox_reader *reader)
{
	uint8_t byte;
	size_t len;
	int ret;

	while (!reader->stream_end) {
		len = 1;
		if ((ret = decode_step(reader, &byte, &len)) < 0)
			return ret;
		if (len == 0)
			return corrupt(reader, "stream is longer than the "
				       "plaintext size from the index");
	}
	return 0;
}

static ssize_t codec_pread(struct dbox_reader *reader, void *buf, size_t len,
			   uint64_t off)
{
	size_t done = 0;
	int ret;

	if (!reader->started && (ret = restart(reader)) < 0)
		return ret;
	if (off < reader->out_pos) {
		if (off >= reader->out_pos - reader->win_len) {
			done = reader->out_pos - off < len ?
				(size_t)(reader->out_pos - off) : len;
			window_get(reader, buf, done, off);
		} else {
			dbox_debug("%s: read at %llu is %llu "
				   "bytes behind the stream; restarting it",
				   where(reader),
				   (unsigned long long)off,
				   (unsigned long long)(reader->out_pos - off));
			if ((ret = restart(reader)) < 0)
				return ret;
		}
	}
	if (done < len && off + done > reader->out_pos) {
		if (reader->skip_buf == NULL &&
		    (reader->skip_buf = malloc(SKIP_BUF_SIZE)) == NULL)
			return -ENOMEM;
		while (off + done > reader->out_pos) {
			uint64_t gap = off + done - reader->out_pos;
			size_t n = gap < SKIP_BUF_SIZE ? (size_t)gap
						       : SKIP_BUF_SIZE;
			if ((ret = decode(reader, reader->skip_buf, n)) < 0)
				return ret;
		}
	}
	if (done < len &&
	    (ret = decode(reader, (uint8_t *)buf + done, len - done)) < 0)
		return ret;
	if (reader->out_pos == reader->plain_size &&
	    (ret = decode_finish(reader)) < 0)
		return ret;
	return (ssize_t)len;
}

ssize_t dbox_reader_pread_fault(struct dbox_reader *reader, void *buf,
				size_t len, uint64_t off,
				struct dbox_fault *fault)
{
	ssize_t ret;

	if (off >= reader->plain_size || len == 0)
		return 0;
	if (len > reader->plain_size - off)
		len = (size_t)(reader->plain_size - off);
	if (len > SSIZE_MAX)
		len = SSIZE_MAX;

	reader->fault = fault;
	if (reader->codec != NULL)
		ret = codec_pread(reader, buf, len, off);
	else
		ret = plain_pread(reader, buf, len, off);
	reader->fault = NULL;
	return ret;
}

ssize_t dbox_reader_pread(struct dbox_reader *reader, void *buf, size_t len,
			  uint64_t off)
{
	return dbox_reader_pread_fault(reader, buf, len, off, NULL);
}

void dbox_reader_free(struct dbox_reader **reader)
{
	struct dbox_reader *r;

	if (reader == NULL || *reader == NULL)
		return;
	r = *reader;
	if (r->state != NULL)
		r->codec->decoder_free(r->state);
	free(r->in_buf);
	free(r->window);
	free(r->skip_buf);
	free(r->name);
	if (r->own_fd)
		close(r->fd);
	free(r);
	*reader = NULL;
}

void dbox_reader_own_fd(struct dbox_reader *reader)
{
	reader->own_fd = true;
}

int dbox_reader_set_name(struct dbox_reader *reader, const char *fmt, ...)
{
	va_list args;
	char *name;
	int ret;

	va_start(args, fmt);
	ret = vasprintf(&name, fmt, args);
	va_end(args);
	if (ret < 0)
		return -ENOMEM;
	free(reader->name);
	reader->name = name;
	return 0;
}
