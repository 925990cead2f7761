/*
 * codec-common.c: the small pieces every codec (codec-*.c) needs the same
 * way: feeding a library whose lengths are unsigned int, moving the
 * dbox_codec_io buffers past what a library call used, and the result of
 * a failed setup.  What differs between codecs (return codes, error texts,
 * framing) stays in each codec's file.
 */
#include "dbox-codec.h"

#include <errno.h>

unsigned int dbox_codec_chunk(size_t len)
{
	return len > DBOX_CODEC_CHUNK_MAX ? DBOX_CODEC_CHUNK_MAX :
		(unsigned int)len;
}

void dbox_codec_io_advance(struct dbox_codec_io *io, size_t in_used,
			   size_t out_made)
{
	io->in += in_used;
	io->in_len -= in_used;
	io->out += out_made;
	io->out_len -= out_made;
}
