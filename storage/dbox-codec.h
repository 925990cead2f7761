#ifndef DBOXFS_DBOX_CODEC_H
#define DBOXFS_DBOX_CODEC_H

/*
 * dbox-codec: the small interface between the body reader/writer
 * (dbox-read.c, dbox-body.c) and one compression library.  One file per
 * codec implements it: codec-gz.c (zlib), codec-bz2.c (libbz2),
 * codec-xz.c (liblzma), codec-zstd.c (libzstd), codec-lz4.c (liblz4, in
 * Dovecot's own container format).  These are the five formats Dovecot
 * 2.3's zlib plugin reads and writes (src/lib-compression/compression.c,
 * 2.3.21; docs/dbox-format.md section 7).
 *
 * Both directions are streaming and incremental, in the style of zlib:
 * a call consumes what it can of io->in and produces what it can into
 * io->out, advancing both, and returns when the input is used up, the
 * output is full, or the stream ended.  The caller owns both buffers.
 * States are opaque, one per stream, not thread-safe.
 */

#include "dbox-read.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum dbox_codec_ret {
	DBOX_CODEC_OK = 0,     /* progress made, or more input / output room
				  needed */
	DBOX_CODEC_END = 1,    /* the stream ended: a decoder produced all
				  its plaintext (io->in may hold bytes after
				  the stream), an encoder all its output */
	DBOX_CODEC_ERROR = -1, /* corrupt input or library failure; io->error
				  says what */
	DBOX_CODEC_NOMEM = -2, /* the library could not allocate */
};

struct dbox_codec_io {
	const uint8_t *in;
	size_t in_len;
	uint8_t *out;
	size_t out_len;
	/* Decoder: no input follows in[0..in_len) (the body ends there).
	   Encoder: finish the stream once in[] is consumed. */
	bool in_end;
	/* On DBOX_CODEC_ERROR: what went wrong (static or owned by the
	   state, valid until the next call). */
	const char *error;
};

struct dbox_codec {
	enum dbox_compression compression;
	const char *name;       /* zlib_save name: "gz", "bz2", ... */
	const char *long_name;  /* for messages: "gzip", "bzip2", ... */

	/* Decoder.  new: 0 and *state_r, or -ENOMEM.  reset: back to the
	   state of a new decoder (start of a stream); 0, -ENOMEM or -EINVAL
	   (the library refused).  decode: see enum dbox_codec_ret.
	   free: safe on NULL. */
	int (*decoder_new)(void **state_r);
	int (*decoder_reset)(void *state);
	enum dbox_codec_ret (*decode)(void *state, struct dbox_codec_io *io);
	void (*decoder_free)(void *state);

	/* Encoder, NULL when dboxfs does not write this format.  new: 0 and
	   *state_r, or -ENOMEM; level is min_level..max_level.  encode returns DBOX_CODEC_END once io->in_end
	   was set, all input was consumed and the whole stream (trailer
	   included) is in the output. */
	int (*encoder_new)(int level, void **state_r);
	enum dbox_codec_ret (*encode)(void *state, struct dbox_codec_io *io);
	void (*encoder_free)(void *state);
	int min_level, max_level, default_level;
};

extern const struct dbox_codec dbox_codec_gz, dbox_codec_bz2, dbox_codec_xz,
	dbox_codec_zstd, dbox_codec_lz4;

/* The codec of a compression, or NULL for DBOX_COMPRESSION_NONE. */
const struct dbox_codec *dbox_codec_get(enum dbox_compression compression);

/* The codec whose name is name[0..len) ("gz", "bz2", "xz", "zstd",
   "lz4"), or NULL. */
const struct dbox_codec *dbox_codec_by_name(const char *name, size_t len);

/* For the codecs (codec-common.c). */

/* Largest length handed to a library whose lengths are unsigned int
   (zlib's uInt, libbz2): 1 GiB; bigger buffers are fed in pieces. */
#define DBOX_CODEC_CHUNK_MAX (1U << 30)

/* len clamped to DBOX_CODEC_CHUNK_MAX. */
unsigned int dbox_codec_chunk(size_t len);

/* A library call took in_used bytes of io->in and wrote out_made bytes to
   io->out: advance both. */
void dbox_codec_io_advance(struct dbox_codec_io *io, size_t in_used,
			   size_t out_made);


#endif
