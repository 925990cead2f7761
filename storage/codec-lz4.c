/*
 * codec-lz4.c: Dovecot's lz4 container with liblz4 (dbox-codec.h), read
 * only.
 *
 * This is not the LZ4 frame format of the lz4 tool but Dovecot's own
 * (src/lib-compression/iostream-lz4.h, istream-lz4.c, 2.3.21):
 *
 *     magic "Dovecot-LZ4\r\x2a\x9b\xc5" (15 bytes)
 *     max plaintext chunk size, 4 bytes big-endian (65536 as written)
 *     repeated: compressed chunk length, 4 bytes big-endian; an LZ4 block
 *
 * Every chunk is an independent LZ4 block (LZ4_decompress_safe) of at
 * most the max chunk size of plaintext.  There is no end marker: the
 * stream ends where the body ends, at a chunk boundary.  Like Dovecot we
 * refuse a max chunk size or a chunk length above 1 MiB
 * (ISTREAM_LZ4_CHUNK_SIZE) and a zero chunk length.
 */
#include "dbox-codec.h"

#include <errno.h>
#include <lz4.h>
#include <stdlib.h>
#include <string.h>

#define LZ4_MAGIC "Dovecot-LZ4\r\x2a\x9b\xc5"
#define LZ4_MAGIC_LEN 15
#define LZ4_HEADER_LEN (LZ4_MAGIC_LEN + 4)
#define LZ4_CHUNK_PREFIX_LEN 4
#define LZ4_CHUNK_MAX (1024 * 1024)

enum lz4_phase {
	LZ4_PHASE_HEADER,     /* collecting the 19-byte header */
	LZ4_PHASE_CHUNK_LEN,  /* collecting a 4-byte chunk length */
	LZ4_PHASE_CHUNK_DATA, /* collecting chunk_size compressed bytes */
	LZ4_PHASE_OUTPUT,     /* handing out plain[plain_pos..plain_len) */
};

struct lz4_decoder {
	enum lz4_phase phase;
	uint8_t head[LZ4_HEADER_LEN]; /* header, then chunk lengths */
	size_t head_len;
	uint32_t max_chunk;
	uint8_t *chunk;
	uint32_t chunk_size, chunk_have, chunk_alloc;
	uint8_t *plain;
	uint32_t plain_alloc;
	size_t plain_len, plain_pos;
};

static uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
		(uint32_t)p[2] << 8 | p[3];
}

static int lz4_decoder_new(void **state_r)
{
	struct lz4_decoder *d = calloc(1, sizeof(*d));

	if (d == NULL)
		return -ENOMEM;
	*state_r = d;
	return 0;
}

static int lz4_decoder_reset(void *state)
{
	struct lz4_decoder *d = state;

	/* Keep the buffers; plain grows if a stream needs a larger one. */
	d->phase = LZ4_PHASE_HEADER;
	d->head_len = 0;
	d->chunk_size = d->chunk_have = 0;
	d->plain_len = d->plain_pos = 0;
	return 0;
}

/* Move up to want - *have bytes from io->in into buf + *have.  Returns
   true when buf holds want bytes. */
static bool collect(struct dbox_codec_io *io, uint8_t *buf, size_t *have,
		    size_t want)
{
	size_t n = want - *have < io->in_len ? want - *have : io->in_len;

	memcpy(buf + *have, io->in, n);
	*have += n;
	io->in += n;
	io->in_len -= n;
	return *have == want;
}

/* Make *buf (of *alloc bytes) hold at least size bytes; its contents
   need not survive.  False when out of memory (*buf unchanged). */
static bool grow(uint8_t **buf, uint32_t *alloc, uint32_t size)
{
	uint8_t *p;

	if (*buf != NULL && size <= *alloc)
		return true;
	if ((p = realloc(*buf, size)) == NULL)
		return false;
	*buf = p;
	*alloc = size;
	return true;
}

static enum dbox_codec_ret lz4_error(struct dbox_codec_io *io, const char *what)
{
	io->error = what;
	return DBOX_CODEC_ERROR;
}

/* The header is complete: check it and size the plaintext buffer. */
static enum dbox_codec_ret lz4_header(struct lz4_decoder *d,
				      struct dbox_codec_io *io)
{
	uint32_t max_chunk = be32(d->head + LZ4_MAGIC_LEN);

	if (memcmp(d->head, LZ4_MAGIC, LZ4_MAGIC_LEN) != 0)
		return lz4_error(io, "wrong magic in the lz4 header");
	if (max_chunk == 0 || max_chunk > LZ4_CHUNK_MAX)
		return lz4_error(io, "lz4 max chunk size is 0 or above 1 MiB");
	if (!grow(&d->plain, &d->plain_alloc, max_chunk))
		return DBOX_CODEC_NOMEM;
	d->max_chunk = max_chunk;
	return DBOX_CODEC_OK;
}

/* A chunk length is complete: check it and size the chunk buffer. */
static enum dbox_codec_ret lz4_chunk_len(struct lz4_decoder *d,
					 struct dbox_codec_io *io)
{
	uint32_t size = be32(d->head);

	if (size == 0 || size > LZ4_CHUNK_MAX)
		return lz4_error(io, "lz4 chunk length is 0 or above 1 MiB");
	if (!grow(&d->chunk, &d->chunk_alloc, size))
		return DBOX_CODEC_NOMEM;
	d->chunk_size = size;
	d->chunk_have = 0;
	return DBOX_CODEC_OK;
}

/* A chunk is complete: decompress it, straight into io->out when the
   largest possible chunk fits there. */
static enum dbox_codec_ret lz4_chunk(struct lz4_decoder *d,
				     struct dbox_codec_io *io)
{
	bool direct = io->out_len >= d->max_chunk;
	int n = LZ4_decompress_safe((const char *)d->chunk,
				    (char *)(direct ? io->out : d->plain),
				    (int)d->chunk_size, (int)d->max_chunk);

	if (n < 0)
		return lz4_error(io, "corrupt lz4 chunk");
	if (direct) {
		io->out += n;
		io->out_len -= (size_t)n;
		d->plain_len = d->plain_pos = 0;
	} else {
		d->plain_len = (size_t)n;
		d->plain_pos = 0;
	}
	return DBOX_CODEC_OK;
}

static enum dbox_codec_ret lz4_decode(void *state, struct dbox_codec_io *io)
{
	struct lz4_decoder *d = state;
	enum dbox_codec_ret ret;
	size_t have, n;

	for (;;) {
		switch (d->phase) {
		case LZ4_PHASE_HEADER:
			if (!collect(io, d->head, &d->head_len, LZ4_HEADER_LEN))
				return DBOX_CODEC_OK;
			if ((ret = lz4_header(d, io)) != DBOX_CODEC_OK)
				return ret;
			d->head_len = 0;
			d->phase = LZ4_PHASE_CHUNK_LEN;
			break;
		case LZ4_PHASE_CHUNK_LEN:
			if (d->head_len == 0 && io->in_len == 0 && io->in_end)
				return DBOX_CODEC_END;
			if (!collect(io, d->head, &d->head_len,
				     LZ4_CHUNK_PREFIX_LEN))
				return DBOX_CODEC_OK;
			if ((ret = lz4_chunk_len(d, io)) != DBOX_CODEC_OK)
				return ret;
			d->head_len = 0;
			d->phase = LZ4_PHASE_CHUNK_DATA;
			break;
		case LZ4_PHASE_CHUNK_DATA:
			have = d->chunk_have;
			if (!collect(io, d->chunk, &have, d->chunk_size)) {
				d->chunk_have = (uint32_t)have;
				return DBOX_CODEC_OK;
			}
			d->chunk_have = (uint32_t)have;
			if (io->out_len == 0)
				return DBOX_CODEC_OK; /* decode when room */
			if ((ret = lz4_chunk(d, io)) != DBOX_CODEC_OK)
				return ret;
			d->phase = LZ4_PHASE_OUTPUT;
			break;
		case LZ4_PHASE_OUTPUT:
			n = d->plain_len - d->plain_pos;
			if (n > io->out_len)
				n = io->out_len;
			memcpy(io->out, d->plain + d->plain_pos, n);
			io->out += n;
			io->out_len -= n;
			d->plain_pos += n;
			if (d->plain_pos < d->plain_len)
				return DBOX_CODEC_OK; /* output full */
			d->phase = LZ4_PHASE_CHUNK_LEN;
			break;
		}
	}
}

static void lz4_decoder_free(void *state)
{
	struct lz4_decoder *d = state;

	if (d == NULL)
		return;
	free(d->chunk);
	free(d->plain);
	free(d);
}

const struct dbox_codec dbox_codec_lz4 = {
	.compression = DBOX_COMPRESSION_LZ4,
	.name = "lz4",
	.long_name = "lz4",
	.decoder_new = lz4_decoder_new,
	.decoder_reset = lz4_decoder_reset,
	.decode = lz4_decode,
	.decoder_free = lz4_decoder_free,
};
