/*
 * codec-xz.c: xz bodies with liblzma (dbox-codec.h), read only.
 *
 * Dovecot (zlib_save = xz, where compiled in; Debian's 2.3 is not) writes
 * one .xz stream per body, magic FD 37 7A 58 5A 00
 * (src/lib-compression/ostream-lzma.c, 2.3.21).  The decoder memory is
 * capped, so a corrupt header cannot make us allocate without bound: xz -9
 * needs 65 MiB to decode.
 */
#include "dbox-codec.h"

#include <errno.h>
#include <lzma.h>
#include <stdlib.h>
#include <string.h>

#define XZ_MEMLIMIT (256 * 1024 * 1024)

/* Start a stream decoder on xs (new, or used: lzma_stream_decoder() on a
   used stream reuses its memory). */
static int xz_decoder_reset(void *state)
{
	lzma_ret ret = lzma_stream_decoder(state, XZ_MEMLIMIT, 0);

	if (ret != LZMA_OK)
		return -(ret == LZMA_MEM_ERROR ? ENOMEM :
					 EINVAL);
	return 0;
}

static int xz_decoder_new(void **state_r)
{
	lzma_stream *xs = malloc(sizeof(*xs));
	int ret;

	if (xs == NULL)
		return -ENOMEM;
	*xs = (lzma_stream)LZMA_STREAM_INIT;
	if ((ret = xz_decoder_reset(xs)) < 0) {
		free(xs);
		return ret;
	}
	*state_r = xs;
	return 0;
}

static enum dbox_codec_ret xz_decode(void *state, struct dbox_codec_io *io)
{
	lzma_stream *xs = state;
	lzma_ret ret;

	xs->next_in = io->in;
	xs->avail_in = io->in_len;
	xs->next_out = io->out;
	xs->avail_out = io->out_len;
	ret = lzma_code(xs, io->in_end ? LZMA_FINISH : LZMA_RUN);
	io->in = xs->next_in;
	io->in_len = xs->avail_in;
	io->out = xs->next_out;
	io->out_len = xs->avail_out;
	switch (ret) {
	case LZMA_OK:
	case LZMA_BUF_ERROR: /* no progress possible: the caller decides */
		return DBOX_CODEC_OK;
	case LZMA_STREAM_END:
		return DBOX_CODEC_END;
	case LZMA_MEM_ERROR:
		return DBOX_CODEC_NOMEM;
	case LZMA_MEMLIMIT_ERROR:
		io->error = "needs more memory than the 256 MiB allowed";
		return DBOX_CODEC_ERROR;
	case LZMA_FORMAT_ERROR:
		io->error = "not an xz stream";
		return DBOX_CODEC_ERROR;
	case LZMA_OPTIONS_ERROR:
		io->error = "unsupported xz options";
		return DBOX_CODEC_ERROR;
	case LZMA_DATA_ERROR:
		io->error = "corrupt data or check mismatch";
		return DBOX_CODEC_ERROR;
	default:
		io->error = "lzma_code failed";
		return DBOX_CODEC_ERROR;
	}
}

static void xz_decoder_free(void *state)
{
	if (state == NULL)
		return;
	lzma_end(state);
	free(state);
}

const struct dbox_codec dbox_codec_xz = {
	.compression = DBOX_COMPRESSION_XZ,
	.name = "xz",
	.long_name = "xz",
	.decoder_new = xz_decoder_new,
	.decoder_reset = xz_decoder_reset,
	.decode = xz_decode,
	.decoder_free = xz_decoder_free,
};
