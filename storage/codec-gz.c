/*
 * codec-gz.c: gzip bodies with zlib (dbox-codec.h).
 *
 * Dovecot's zlib plugin writes (zlib_save = gz) one standard single-member
 * gzip stream per message body: 10-byte header, raw deflate, CRC32 and
 * ISIZE trailer (RFC 1952; src/lib-compression/ostream-zlib.c, 2.3.21).
 * zlib's own gzip wrapper (windowBits 16 + 15) reads and writes exactly
 * that, checking the trailer on reading.  Levels 1-9, default 6 as
 * Dovecot's zlib_save_level.
 */
#include "dbox-codec.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define GZ_WINDOW_BITS (16 + MAX_WBITS) /* gzip wrapper, 32 KiB window */

static int gz_decoder_new(void **state_r)
{
	z_stream *zs = calloc(1, sizeof(*zs));

	if (zs == NULL)
		return -ENOMEM;
	if (inflateInit2(zs, GZ_WINDOW_BITS) != Z_OK) {
		free(zs);
		return -ENOMEM;
	}
	*state_r = zs;
	return 0;
}

static int gz_decoder_reset(void *state)
{
	return inflateReset(state) != Z_OK ? -EINVAL : 0;
}

/* Run fn (inflate or deflate) once over io, advancing it, and map its
   result (what names the call in the error text). */
static enum dbox_codec_ret gz_run(z_stream *zs, struct dbox_codec_io *io,
				  int (*fn)(z_streamp, int), int flush,
				  const char *what)
{
	uInt in_len = dbox_codec_chunk(io->in_len);
	uInt out_len = dbox_codec_chunk(io->out_len);
	int ret;

	zs->next_in = (Bytef *)io->in;
	zs->avail_in = in_len;
	zs->next_out = io->out;
	zs->avail_out = out_len;
	ret = fn(zs, flush);
	dbox_codec_io_advance(io, in_len - zs->avail_in,
			      out_len - zs->avail_out);
	switch (ret) {
	case Z_OK:
	case Z_BUF_ERROR: /* no progress possible: the caller decides */
		return DBOX_CODEC_OK;
	case Z_STREAM_END:
		return DBOX_CODEC_END;
	case Z_MEM_ERROR:
		return DBOX_CODEC_NOMEM;
	default: /* Z_DATA_ERROR, Z_NEED_DICT, Z_STREAM_ERROR */
		io->error = zs->msg != NULL ? zs->msg : what;
		return DBOX_CODEC_ERROR;
	}
}

static enum dbox_codec_ret gz_decode(void *state, struct dbox_codec_io *io)
{
	return gz_run(state, io, inflate, Z_NO_FLUSH, "inflate failed");
}

static void gz_decoder_free(void *state)
{
	if (state == NULL)
		return;
	inflateEnd(state);
	free(state);
}

static int gz_encoder_new(int level, void **state_r)
{
	z_stream *zs = calloc(1, sizeof(*zs));

	if (zs == NULL)
		return -ENOMEM;
	/* memLevel 8 and the default strategy, as zlib's gzip writer. */
	if (deflateInit2(zs, level, Z_DEFLATED, GZ_WINDOW_BITS, 8,
			 Z_DEFAULT_STRATEGY) != Z_OK) {
		free(zs);
		return -ENOMEM;
	}
	*state_r = zs;
	return 0;
}

static enum dbox_codec_ret gz_encode(void *state, struct dbox_codec_io *io)
{
	/* Z_FINISH only with the last of the input in this call. */
	bool finish = io->in_end && io->in_len <= DBOX_CODEC_CHUNK_MAX;

	return gz_run(state, io, deflate, finish ? Z_FINISH : Z_NO_FLUSH,
		      "deflate failed");
}

static void gz_encoder_free(void *state)
{
	if (state == NULL)
		return;
	deflateEnd(state);
	free(state);
}

const struct dbox_codec dbox_codec_gz = {
	.compression = DBOX_COMPRESSION_GZ,
	.name = "gz",
	.long_name = "gzip",
	.decoder_new = gz_decoder_new,
	.decoder_reset = gz_decoder_reset,
	.decode = gz_decode,
	.decoder_free = gz_decoder_free,
	.encoder_new = gz_encoder_new,
	.encode = gz_encode,
	.encoder_free = gz_encoder_free,
	.min_level = 1,
	.max_level = 9,
	.default_level = 6,
};
