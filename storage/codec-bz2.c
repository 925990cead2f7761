/*
 * codec-bz2.c: bzip2 bodies with libbz2 (dbox-codec.h), read only.
 *
 * Dovecot (zlib_save = bz2) writes one bzip2 stream per body, magic "BZh"
 * and the block size digit (src/lib-compression/ostream-bzlib.c, 2.3.21).
 */
#include "dbox-codec.h"

#include <bzlib.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct bz2_decoder {
	bz_stream bz;
	bool init;   /* BZ2_bzDecompressInit done */
};

static int bz2_init(struct bz2_decoder *d)
{
	int ret;

	memset(&d->bz, 0, sizeof(d->bz));
	/* verbosity 0, small 0 (the faster, larger decoder) */
	ret = BZ2_bzDecompressInit(&d->bz, 0, 0);
	if (ret != BZ_OK)
		return -(ret == BZ_MEM_ERROR ? ENOMEM : EINVAL);
	d->init = true;
	return 0;
}

static int bz2_decoder_new(void **state_r)
{
	struct bz2_decoder *d = calloc(1, sizeof(*d));
	int ret;

	if (d == NULL)
		return -ENOMEM;
	if ((ret = bz2_init(d)) < 0) {
		free(d);
		return ret;
	}
	*state_r = d;
	return 0;
}

static int bz2_decoder_reset(void *state)
{
	struct bz2_decoder *d = state;

	/* libbz2 has no reset: end and start again. */
	if (d->init)
		BZ2_bzDecompressEnd(&d->bz);
	d->init = false;
	return bz2_init(d);
}

static enum dbox_codec_ret bz2_decode(void *state, struct dbox_codec_io *io)
{
	struct bz2_decoder *d = state;
	unsigned int in_len, out_len;
	int ret;

	if (!d->init) {
		io->error = "decoder not initialised";
		return DBOX_CODEC_ERROR;
	}
	if (io->out_len == 0)
		return DBOX_CODEC_OK;
	in_len = dbox_codec_chunk(io->in_len);
	out_len = dbox_codec_chunk(io->out_len);
	d->bz.next_in = (char *)io->in;
	d->bz.avail_in = in_len;
	d->bz.next_out = (char *)io->out;
	d->bz.avail_out = out_len;
	ret = BZ2_bzDecompress(&d->bz);
	dbox_codec_io_advance(io, in_len - d->bz.avail_in,
			      out_len - d->bz.avail_out);
	switch (ret) {
	case BZ_OK:
		return DBOX_CODEC_OK;
	case BZ_STREAM_END:
		return DBOX_CODEC_END;
	case BZ_MEM_ERROR:
		return DBOX_CODEC_NOMEM;
	case BZ_DATA_ERROR_MAGIC:
		io->error = "bad bzip2 magic";
		return DBOX_CODEC_ERROR;
	case BZ_DATA_ERROR:
		io->error = "data integrity error (bad block or CRC)";
		return DBOX_CODEC_ERROR;
	default:
		io->error = "BZ2_bzDecompress failed";
		return DBOX_CODEC_ERROR;
	}
}

static void bz2_decoder_free(void *state)
{
	struct bz2_decoder *d = state;

	if (d == NULL)
		return;
	if (d->init)
		BZ2_bzDecompressEnd(&d->bz);
	free(d);
}

const struct dbox_codec dbox_codec_bz2 = {
	.compression = DBOX_COMPRESSION_BZ2,
	.name = "bz2",
	.long_name = "bzip2",
	.decoder_new = bz2_decoder_new,
	.decoder_reset = bz2_decoder_reset,
	.decode = bz2_decode,
	.decoder_free = bz2_decoder_free,
};
