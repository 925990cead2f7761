/*
 * codec-zstd.c: zstd bodies with libzstd (dbox-codec.h), read only.
 *
 * Dovecot (zlib_save = zstd) writes a zstd frame per body, magic
 * 28 B5 2F FD (src/lib-compression/ostream-zstd.c, 2.3.21).  A frame may
 * be followed by further frames; each ends with DBOX_CODEC_END and the
 * reader goes on with the next.
 */
#include "dbox-codec.h"

#include <errno.h>
#include <stdlib.h>
#include <zstd.h>
#include <zstd_errors.h>

static int zstd_decoder_new(void **state_r)
{
	ZSTD_DStream *ds = ZSTD_createDStream();

	if (ds == NULL)
		return -ENOMEM;
	*state_r = ds;
	return 0;
}

static int zstd_decoder_reset(void *state)
{
	if (ZSTD_isError(ZSTD_DCtx_reset(state, ZSTD_reset_session_only)))
		return -EINVAL;
	return 0;
}

static enum dbox_codec_ret zstd_decode(void *state, struct dbox_codec_io *io)
{
	ZSTD_inBuffer in = { io->in, io->in_len, 0 };
	ZSTD_outBuffer out = { io->out, io->out_len, 0 };
	size_t ret;

	ret = ZSTD_decompressStream(state, &out, &in);
	dbox_codec_io_advance(io, in.pos, out.pos);
	if (ZSTD_isError(ret)) {
		if (ZSTD_getErrorCode(ret) == ZSTD_error_memory_allocation)
			return DBOX_CODEC_NOMEM;
		io->error = ZSTD_getErrorName(ret);
		return DBOX_CODEC_ERROR;
	}
	/* 0: a frame is complete and all of its plaintext is out. */
	return ret == 0 ? DBOX_CODEC_END : DBOX_CODEC_OK;
}

static void zstd_decoder_free(void *state)
{
	ZSTD_freeDStream(state); /* accepts NULL */
}

const struct dbox_codec dbox_codec_zstd = {
	.compression = DBOX_COMPRESSION_ZSTD,
	.name = "zstd",
	.long_name = "zstd",
	.decoder_new = zstd_decoder_new,
	.decoder_reset = zstd_decoder_reset,
	.decode = zstd_decode,
	.decoder_free = zstd_decoder_free,
};
