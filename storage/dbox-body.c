/*
 * dbox-body.c: the plaintext view of a record body being written (see
 * dbox-body.h for the policy).
 *
 * Invariants, by mode:
 *  PLAIN   the record body is plaintext [0, plain_size) and
 *          ap->body_size == plain_size.
 *  STREAM  the encoder has been given plaintext [0, plain_size) and the
 *          record body [0, ap->body_size) holds the compressed output it
 *          produced so far (the rest waits inside the encoder); vsize and
 *          prev_cr describe the plaintext.
 *  SEALED  compressed: the body [0, ap->body_size) is one whole stream of
 *          the codec holding plain_size bytes, vsize is their V; plain: as
 *          PLAIN.  The metadata block may follow (after a finish).
 *  BROKEN  compressed bytes were lost; only dbox_body_free is useful,
 *          every other call fails with the error that broke it (error).
 *
 * Every function returns 0 (or a byte count) or a negative errno
 * (storage/dbox-fault.h).
 *
 * Conversions use the tail of the record, which the writer owns (nothing
 * follows the record in the m.N while it is being written): plaintext is
 * decompressed or compressed to just after the current body and then
 * moved down to the body start, front to back (the destination always
 * lies below the source, so no byte is overwritten before it is read).
 */
#include "dbox-body.h"

#include "dbox-codec.h"
#include "io.h"
#include "log.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Work buffer: compressed output, and chunks of decompressing and moving. */
#define BODY_BUF_SIZE (64 * 1024)

int dbox_compress_parse(const char *spec, struct dbox_compress_settings *set_r)
{
	const char *colon = strchr(spec, ':');
	size_t name_len = colon != NULL ? (size_t)(colon - spec) : strlen(spec);
	const struct dbox_codec *codec;
	char *end;
	long level;

	memset(set_r, 0, sizeof(*set_r));
	if (strcmp(spec, "none") == 0)
		return 0;
	codec = dbox_codec_by_name(spec, name_len);
	if (codec == NULL || codec->encoder_new == NULL)
		return -EINVAL;
	set_r->method = codec->compression;
	if (colon == NULL)
		return 0;
	errno = 0;
	level = strtol(colon + 1, &end, 10);
	if (errno != 0 || end == colon + 1 || *end != '\0' ||
	    level < codec->min_level || level > codec->max_level)
		return -EINVAL;
	set_r->level = (int)level;
	return 0;
}

void dbox_compress_format(const struct dbox_compress_settings *set, char *buf,
			  size_t size)
{
	const struct dbox_codec *codec = dbox_codec_get(set->method);

	if (codec == NULL)
		snprintf(buf, size, "none");
	else
		snprintf(buf, size, "%s:%d", codec->name, set->level != 0 ?
			 set->level : codec->default_level);
}

/* File offset of body byte off. */
static uint64_t body_pos(const struct dbox_body *body, uint64_t off)
{
	return body->ap->offset + DBOX_MSG_HEADER_SIZE + off;
}

/* Read body bytes [off, off+len) exactly.  Returns 0, -EIO (short) or
   -errno of pread. */
static int body_read(const struct dbox_body *body, void *buf, size_t len,
		     uint64_t off)
{
	ssize_t ret = dbox_pread_full(body->ap->fd, buf, len,
				      body_pos(body, off));

	if (ret < 0)
		return (int)ret;
	return (size_t)ret < len ? -EIO : 0;
}

void dbox_body_init(struct dbox_body *body, struct dbox_append *ap,
		    const struct dbox_compress_settings *set)
{
	memset(body, 0, sizeof(*body));
	body->ap = ap;
	if (set != NULL)
		body->set = *set;
	body->mode = DBOX_BODY_PLAIN;
	body->in_order = true;
}

/* Plain bytes written at off: keep the in-order V and head, or give up on
   them for this body. */
static void note_plain_write(struct dbox_body *body, const void *buf,
			     size_t len, uint64_t off)
{
	if (!body->in_order || off != body->plain_size) {
		body->in_order = false;
		return;
	}
	if (off < sizeof(body->head))
		memcpy(body->head + off, buf,
		       len < sizeof(body->head) - off ? len :
		       sizeof(body->head) - (size_t)off);
	body->in_order_vsize += dbox_vsize_add(buf, len, body->in_order_cr,
					       &body->in_order_cr);
}

static void encoder_free(struct dbox_body *body)
{
	if (body->encoder != NULL)
		body->codec->encoder_free(body->encoder);
	body->encoder = NULL;
}

/* Give up on the body: compressed bytes are gone.  Returns err (a
   negative errno), which every later call returns too. */
static int broken(struct dbox_body *body, int err)
{
	encoder_free(body);
	dbox_reader_free(&body->reader);
	body->mode = DBOX_BODY_BROKEN;
	body->error = err;
	dbox_error("m.N record at offset %llu: message body lost while "
		   "writing it compressed: %s",
		   (unsigned long long)body->ap->offset, strerror(-err));
	return err;
}

/* Start a new encoder: the codec of the settings, or gz when compression
   is off (a plain body that must not stay plain). */
static int encoder_start(struct dbox_body *body)
{
	const struct dbox_codec *codec = dbox_codec_get(body->set.method);
	int level = body->set.level, ret;

	if (codec == NULL || codec->encoder_new == NULL) {
		codec = &dbox_codec_gz;
		level = 0;
	}
	if (body->buf == NULL && (body->buf = malloc(BODY_BUF_SIZE)) == NULL)
		return -ENOMEM;
	if ((ret = codec->encoder_new(level != 0 ? level :
				      codec->default_level,
				      &body->encoder)) < 0)
		return ret;
	body->codec = codec;
	body->vsize = 0;
	body->prev_cr = false;
	return 0;
}

/* Run the encoder over in[0..len) (finish: and end the stream), appending
   its output to the stored body.  Returns 0, -ENOMEM, -EIO (the encoder
   failed; logged) or the error of dbox_append_pwrite. */
static int encode(struct dbox_body *body, const void *in, size_t len,
		  bool finish)
{
	struct dbox_codec_io io = { .in = in, .in_len = len, .in_end = finish };
	struct dbox_append *ap = body->ap;
	enum dbox_codec_ret ret;
	size_t produced;
	int err;

	for (;;) {
		size_t in_before = io.in_len;

		io.out = body->buf;
		io.out_len = BODY_BUF_SIZE;
		ret = body->codec->encode(body->encoder, &io);
		if (ret == DBOX_CODEC_NOMEM)
			return -ENOMEM;
		if (ret == DBOX_CODEC_ERROR) {
			dbox_error("m.N record at offset %llu: %s encoder: %s",
				   (unsigned long long)ap->offset,
				   body->codec->long_name, io.error);
			return -EIO;
		}
		produced = BODY_BUF_SIZE - io.out_len;
		if (produced > 0 &&
		    (err = dbox_append_pwrite(ap, body->buf, produced,
					      ap->body_size)) < 0)
			return err;
		if (ret == DBOX_CODEC_END)
			return 0;
		if (!finish && io.in_len == 0 && io.out_len > 0)
			return 0; /* all input taken, no output pending */
		if (produced == 0 && io.in_len == in_before) {
			dbox_error("m.N record at offset %llu: %s encoder "
				   "stalled", (unsigned long long)ap->offset,
				   body->codec->long_name);
			return -EIO;
		}
	}
}

/* Copy body [src, src+len) down to [dst, dst+len), dst < src, front to
   back.  Returns 0 or a negative errno (body_read, dbox_append_pwrite). */
static int body_move(struct dbox_body *body, uint64_t dst, uint64_t src,
		     uint64_t len)
{
	int ret;

	for (uint64_t done = 0; done < len; ) {
		size_t n = len - done < BODY_BUF_SIZE ? (size_t)(len - done) :
			BODY_BUF_SIZE;

		if ((ret = body_read(body, body->buf, n, src + done)) < 0 ||
		    (ret = dbox_append_pwrite(body->ap, body->buf, n,
					      dst + done)) < 0)
			return ret;
		done += n;
	}
	return 0;
}

/* STREAM -> SEALED compressed: end the stream. */
static int stream_finish(struct dbox_body *body)
{
	int ret;

	if ((ret = encode(body, NULL, 0, true)) < 0)
		return broken(body, ret);
	encoder_free(body);
	body->mode = DBOX_BODY_SEALED;
	body->compressed = true;
	return 0;
}

/* SEALED compressed -> PLAIN: decompress [0, C) to [C, C+P), move it
   down to [0, P), cut the rest. */
static int decompress_to_plain(struct dbox_body *body)
{
	struct dbox_append *ap = body->ap;
	uint64_t csize = ap->body_size, psize = body->plain_size;
	struct dbox_reader *reader;
	int ret;

	dbox_reader_free(&body->reader);
	if ((ret = dbox_reader_open(ap->fd, body_pos(body, 0), csize, psize,
				    &reader)) < 0)
		return dbox_corrupt_as_eio(ret);
	for (uint64_t off = 0; off < psize; ) {
		size_t want = psize - off < BODY_BUF_SIZE ?
			(size_t)(psize - off) : BODY_BUF_SIZE;
		ssize_t n = dbox_reader_pread(reader, body->buf, want, off);

		ret = n < 0 ? dbox_corrupt_as_eio(n) : n == 0 ? -EIO :
			dbox_append_pwrite(ap, body->buf, (size_t)n,
					   csize + off);
		if (ret < 0) {
			/* Nothing below csize was touched: undo. */
			dbox_reader_free(&reader);
			dbox_append_truncate(ap, csize);
			return ret;
		}
		off += (uint64_t)n;
	}
	dbox_reader_free(&reader);
	if ((ret = body_move(body, 0, csize, psize)) < 0 ||
	    (ret = dbox_append_truncate(ap, psize)) < 0)
		return broken(body, ret);
	body->mode = DBOX_BODY_PLAIN;
	body->compressed = false;
	return 0;
}

/* Any mode -> PLAIN. */
static int to_plain(struct dbox_body *body)
{
	int ret;

	switch (body->mode) {
	case DBOX_BODY_PLAIN:
		return 0;
	case DBOX_BODY_BROKEN:
		return body->error;
	case DBOX_BODY_STREAM:
		body->in_order = false;
		if ((ret = stream_finish(body)) < 0)
			return ret;
		return decompress_to_plain(body);
	case DBOX_BODY_SEALED:
		if (body->compressed) {
			body->in_order = false;
			return decompress_to_plain(body);
		}
		body->mode = DBOX_BODY_PLAIN;
		return 0;
	}
	return 0;
}

/* PLAIN -> SEALED compressed: compress [0, P) to [P, P+C), move it down
   to [0, C), cut the rest. */
static int compress_plain(struct dbox_body *body)
{
	struct dbox_append *ap = body->ap;
	uint64_t psize = body->plain_size;
	uint8_t *in = malloc(BODY_BUF_SIZE);
	int ret = in == NULL ? -ENOMEM : encoder_start(body);

	if (ret < 0) {
		free(in);
		return ret;
	}
	for (uint64_t off = 0; off <= psize; ) {
		size_t n = psize - off < BODY_BUF_SIZE ?
			(size_t)(psize - off) : BODY_BUF_SIZE;
		bool last = off + n == psize;

		if ((n > 0 && (ret = body_read(body, in, n, off)) < 0) ||
		    (ret = encode(body, in, n, last)) < 0) {
			/* The plaintext below psize is intact: undo. */
			free(in);
			encoder_free(body);
			dbox_append_truncate(ap, psize);
			return ret;
		}
		body->vsize += dbox_vsize_add(in, n, body->prev_cr,
					      &body->prev_cr);
		if (last)
			break;
		off += n;
	}
	free(in);
	encoder_free(body);
	if ((ret = body_move(body, 0, psize, ap->body_size - psize)) < 0 ||
	    (ret = dbox_append_truncate(ap, ap->body_size - psize)) < 0)
		return broken(body, ret);
	body->mode = DBOX_BODY_SEALED;
	body->compressed = true;
	return 0;
}

/* Does the plain body start like a compressed stream? */
static bool looks_compressed(const struct dbox_body *body)
{
	uint8_t head[16];
	size_t len = body->plain_size < sizeof(head) ?
		(size_t)body->plain_size : sizeof(head);

	if (body->in_order)
		return dbox_detect_compression(body->head, len) !=
			DBOX_COMPRESSION_NONE;
	return body_read(body, head, len, 0) == 0 &&
		dbox_detect_compression(head, len) != DBOX_COMPRESSION_NONE;
}

int dbox_body_pwrite(struct dbox_body *body, const void *buf, size_t len,
		     uint64_t off)
{
	int ret;

	if (len == 0)
		return 0;
	if (body->mode == DBOX_BODY_STREAM && off == body->plain_size) {
		if ((ret = encode(body, buf, len, false)) < 0)
			return broken(body, ret);
		body->vsize += dbox_vsize_add(buf, len, body->prev_cr,
					      &body->prev_cr);
		body->plain_size += len;
		return 0;
	}
	if ((ret = to_plain(body)) < 0)
		return ret;
	if (body->plain_size == 0 && off == 0 &&
	    body->set.method != DBOX_COMPRESSION_NONE) {
		/* A fresh (or emptied) body written from its start. */
		if ((ret = encoder_start(body)) < 0)
			return ret;
		body->mode = DBOX_BODY_STREAM;
		return dbox_body_pwrite(body, buf, len, off);
	}
	if ((ret = dbox_append_pwrite(body->ap, buf, len, off)) < 0) {
		body->in_order = false; /* part of it may be written */
		return ret;
	}
	note_plain_write(body, buf, len, off);
	body->plain_size = body->ap->body_size;
	return 0;
}

int dbox_body_truncate(struct dbox_body *body, uint64_t size)
{
	int ret;

	if (body->mode == DBOX_BODY_BROKEN)
		return body->error;
	if (size == body->plain_size)
		return 0;
	if (size == 0) {
		/* Nothing to keep: drop any stream state. */
		encoder_free(body);
		dbox_reader_free(&body->reader);
		if ((ret = dbox_append_truncate(body->ap, 0)) < 0)
			return broken(body, ret);
		body->mode = DBOX_BODY_PLAIN;
		body->compressed = false;
		body->plain_size = 0;
		body->in_order = true;
		body->in_order_cr = false;
		body->in_order_vsize = 0;
		return 0;
	}
	body->in_order = false;
	if ((ret = to_plain(body)) < 0 ||
	    (ret = dbox_append_truncate(body->ap, size)) < 0)
		return ret;
	body->plain_size = body->ap->body_size;
	return 0;
}

ssize_t dbox_body_pread(struct dbox_body *body, void *buf, size_t len,
			uint64_t off)
{
	ssize_t ret;

	if (body->mode == DBOX_BODY_BROKEN)
		return -EIO; /* the bytes are gone */
	if (off >= body->plain_size || len == 0)
		return 0;
	if (len > body->plain_size - off)
		len = (size_t)(body->plain_size - off);
	if (len > SSIZE_MAX)
		len = SSIZE_MAX;
	if (body->mode == DBOX_BODY_SEALED && body->compressed) {
		if (body->reader == NULL &&
		    (ret = dbox_reader_open(body->ap->fd, body_pos(body, 0),
					    body->ap->body_size,
					    body->plain_size,
					    &body->reader)) < 0)
			return dbox_corrupt_as_eio(ret);
		ret = dbox_reader_pread(body->reader, buf, len, off);
		return ret < 0 ? dbox_corrupt_as_eio(ret) : ret;
	}
	/* A stream being written cannot be read back: go plain. */
	if ((ret = to_plain(body)) < 0 ||
	    (ret = body_read(body, buf, len, off)) < 0)
		return ret;
	return (ssize_t)len;
}

uint64_t dbox_body_size(const struct dbox_body *body)
{
	return body->plain_size;
}

int dbox_body_error(const struct dbox_body *body)
{
	return body->mode == DBOX_BODY_BROKEN ? body->error : 0;
}

int dbox_body_finish(struct dbox_body *body, struct dbox_metadata *md)
{
	int ret;

	switch (body->mode) {
	case DBOX_BODY_BROKEN:
		return body->error;
	case DBOX_BODY_STREAM:
		if ((ret = stream_finish(body)) < 0)
			return ret;
		break;
	case DBOX_BODY_PLAIN:
		if (body->plain_size > 0 &&
		    (body->set.method != DBOX_COMPRESSION_NONE ||
		     looks_compressed(body))) {
			if ((ret = compress_plain(body)) < 0)
				return ret;
		} else {
			body->mode = DBOX_BODY_SEALED;
			body->compressed = false;
		}
		break;
	case DBOX_BODY_SEALED:
		break;
	}
	if (body->compressed) {
		md->vsize = body->vsize;
		md->has_vsize = true;
		/* Z only when it differs, as Dovecot writes it. */
		md->plain_size = body->plain_size;
		md->has_plain_size = body->ap->body_size != body->plain_size;
	} else if (body->in_order) {
		md->vsize = body->in_order_vsize; /* no need to read it back */
		md->has_vsize = true;
	}
	return dbox_append_finish(body->ap, md);
}

void dbox_body_free(struct dbox_body *body)
{
	encoder_free(body);
	dbox_reader_free(&body->reader);
	free(body->buf);
	body->buf = NULL;
}
