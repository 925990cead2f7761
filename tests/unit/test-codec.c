/*
 * test-codec.c: unit tests of reading compressed bodies (storage/dbox-read.h
 * over the codecs of storage/dbox-codec.h) with cmocka.
 *
 * Each codec gets bodies made by its own library here, the way Dovecot's
 * zlib plugin writes them: gzip (zlib), bzip2 (libbz2), xz (liblzma:
 * Debian's Dovecot cannot write xz, so these are the only xz bodies we
 * test), zstd (libzstd), and Dovecot's lz4 container (liblz4, 64 KiB
 * chunks).  Bodies Dovecot itself wrote are read in test-storage.c (the
 * fixtures) and tests/mounted/test_dovecot.py (live).
 *
 * The cost tests count the bytes this process read from files
 * (/proc/self/io rchar): sequential reads must read each compressed byte
 * once, a read inside the window none, a read far behind restarts.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "storage/dbox-codec.h"
#include "storage/dbox-file.h"
#include "storage/dbox-format.h"
#include "storage/dbox-read.h"
#include "storage/log.h"
#include "test-common.h"

#include <bzlib.h>
#include <errno.h>
#include <fcntl.h>
#include <lz4.h>
#include <lzma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

/* --- helpers ---------------------------------------------------------- */

/* Deterministic pseudo-random numbers (xorshift64). */
static uint64_t rng_state = 0x2545f4914f6cdd1dULL;
static uint64_t rng(void)
{
	return xorshift64(&rng_state);
}

/* Mail-like text of exactly `size` bytes, LF line ends, some CRLF. */
static uint8_t *make_text(size_t size)
{
	static const char *const words[] = {
		"kernel", "patch", "mutex", "Signed-off-by:", "the", "of",
		"scheduler", "fuse", "dovecot", "a", "to", "[PATCH]", "\t",
		"\r\n",
	};

	return (uint8_t *)mail_text(&rng_state, size, "Subject: x", words,
				    sizeof(words) / sizeof(words[0]));
}

/* A growing byte buffer. */
struct bytes {
	uint8_t *data;
	size_t len, size;
};

static void bytes_add(struct bytes *b, const void *data, size_t len)
{
	if (b->len + len > b->size) {
		b->size = (b->len + len) * 2;
		b->data = realloc(b->data, b->size);
		assert_non_null(b->data);
	}
	memcpy(b->data + b->len, data, len);
	b->len += len;
}

static void compress_gz(struct bytes *out, const uint8_t *in, size_t len)
{
	z_stream zs;
	uLong bound;

	memset(&zs, 0, sizeof(zs));
	assert_int_equal(deflateInit2(&zs, 6, Z_DEFLATED, 31, 8,
				      Z_DEFAULT_STRATEGY), Z_OK);
	bound = deflateBound(&zs, len);
	out->data = realloc(out->data, out->len + bound);
	assert_non_null(out->data);
	zs.next_in = (Bytef *)in;
	zs.avail_in = (uInt)len;
	zs.next_out = out->data + out->len;
	zs.avail_out = (uInt)bound;
	assert_int_equal(deflate(&zs, Z_FINISH), Z_STREAM_END);
	out->len += zs.total_out;
	out->size = out->len;
	deflateEnd(&zs);
}

static void compress_bz2(struct bytes *out, const uint8_t *in, size_t len)
{
	unsigned int dest_len = (unsigned int)(len + len / 100 + 600);

	out->data = realloc(out->data, out->len + dest_len);
	assert_non_null(out->data);
	assert_int_equal(BZ2_bzBuffToBuffCompress((char *)out->data + out->len,
						  &dest_len, (char *)in,
						  (unsigned int)len, 9, 0, 0),
			 BZ_OK);
	out->len += dest_len;
	out->size = out->len;
}

static void compress_xz(struct bytes *out, const uint8_t *in, size_t len)
{
	size_t bound = lzma_stream_buffer_bound(len), pos = out->len;

	out->data = realloc(out->data, out->len + bound);
	assert_non_null(out->data);
	/* Preset 1 keeps the test fast; CRC64 as xz(1) writes. */
	assert_int_equal(lzma_easy_buffer_encode(1, LZMA_CHECK_CRC64, NULL,
						 in, len, out->data, &pos,
						 out->len + bound), LZMA_OK);
	out->len = pos;
	out->size = out->len;
}

static void compress_zstd(struct bytes *out, const uint8_t *in, size_t len)
{
	size_t bound = ZSTD_compressBound(len), ret;
	ZSTD_CCtx *cctx = ZSTD_createCCtx();

	out->data = realloc(out->data, out->len + bound);
	assert_non_null(out->data);
	/* A content checksum, so that damage is always detected. */
	assert_false(ZSTD_isError(ZSTD_CCtx_setParameter(
		cctx, ZSTD_c_checksumFlag, 1)));
	ret = ZSTD_compress2(cctx, out->data + out->len, bound, in, len);
	assert_false(ZSTD_isError(ret));
	out->len += ret;
	out->size = out->len;
	ZSTD_freeCCtx(cctx);
}

static void put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

/* Dovecot's lz4 container (iostream-lz4.h): magic, BE max chunk size,
   then (BE length, LZ4 block) per 64 KiB of plaintext. */
static void compress_lz4(struct bytes *out, const uint8_t *in, size_t len)
{
	uint8_t head[19], prefix[4];
	int bound = LZ4_compressBound(65536);
	char *block = malloc((size_t)bound);

	assert_non_null(block);
	memcpy(head, "Dovecot-LZ4\r\x2a\x9b\xc5", 15);
	put_be32(head + 15, 65536);
	bytes_add(out, head, sizeof(head));
	for (size_t off = 0; off < len; off += 65536) {
		int n = (int)(len - off < 65536 ? len - off : 65536);
		int c = LZ4_compress_default((const char *)in + off, block, n,
					     bound);

		assert_true(c > 0);
		put_be32(prefix, (uint32_t)c);
		bytes_add(out, prefix, 4);
		bytes_add(out, block, (size_t)c);
	}
	free(block);
}

struct codec_case {
	const char *name;      /* codec long name, as in error messages */
	enum dbox_compression compression;
	void (*compress)(struct bytes *out, const uint8_t *in, size_t len);
	bool concatenates;     /* several streams in a row are one body */
};

static const struct codec_case cases[] = {
	{ "gzip", DBOX_COMPRESSION_GZ, compress_gz, true },
	{ "bzip2", DBOX_COMPRESSION_BZ2, compress_bz2, true },
	{ "xz", DBOX_COMPRESSION_XZ, compress_xz, true },
	{ "zstd", DBOX_COMPRESSION_ZSTD, compress_zstd, true },
	{ "lz4", DBOX_COMPRESSION_LZ4, compress_lz4, false },
};
#define N_CASES (sizeof(cases) / sizeof(cases[0]))

/* One m.1 in a temporary directory with a plain record, then one record
   holding a compressed body. */
struct body_file {
	char dir[64];
	int dir_fd, fd;
	uint64_t body_offset, body_size;
};

static void body_file_make(struct body_file *f, const struct bytes *body)
{
	struct dbox_metadata md = { .guid = "0123456789abcdef0123456789abcdef" };
	struct dbox_append ap;
	uint64_t offset;

	tmpdir_make(f->dir, sizeof(f->dir), "test-codec");
	f->dir_fd = open(f->dir, O_RDONLY | O_DIRECTORY);
	assert_true(f->dir_fd >= 0);
	f->fd = dbox_file_create(f->dir_fd, 1, &offset);
	assert_true(f->fd >= 0);
	assert_int_equal(dbox_append_begin(&ap, f->fd, offset), 0);
	assert_int_equal(dbox_append_pwrite(&ap, "plain\n", 6, 0), 0);
	assert_int_equal(dbox_append_finish(&ap, &md), 0);
	offset += ap.record_size;
	md.has_vsize = true; /* not the point here */
	assert_int_equal(dbox_append_begin(&ap, f->fd, offset), 0);
	assert_int_equal(dbox_append_pwrite(&ap, body->data, body->len, 0), 0);
	assert_int_equal(dbox_append_finish(&ap, &md), 0);
	f->body_offset = offset + DBOX_MSG_HEADER_SIZE;
	f->body_size = body->len;
}

static void body_file_free(struct body_file *f)
{
	close(f->fd);
	close(f->dir_fd);
	rm_rf(f->dir);
}

/* Bytes this process has read from files so far (read + pread). */
static uint64_t rchar(void)
{
	return proc_self_io("rchar");
}

static void expect_read(struct dbox_reader *reader, const uint8_t *text,
			uint64_t text_len, uint64_t off, size_t len)
{
	uint8_t *buf = malloc(len + 1);
	size_t expect = off >= text_len ? 0 :
		(len < text_len - off ? len : (size_t)(text_len - off));

	assert_non_null(buf);
	assert_int_equal(dbox_reader_pread(reader, buf, len, off),
			 (ssize_t)expect);
	if (expect > 0)
		assert_memory_equal(buf, text + off, expect);
	free(buf);
}

#define TEXT_SIZE (1536 * 1024 + 7)

/* --- tests ------------------------------------------------------------ */

/* Every codec: detected, read sequentially in several chunk sizes, each
   compressed byte read once. */
static void test_sequential(void **state)
{
	uint8_t *text = make_text(TEXT_SIZE);

	(void)state;
	for (size_t c = 0; c < N_CASES; c++) {
		struct bytes body = { 0 };
		struct body_file f;
		static const size_t chunks[] = { 4096, 131072, 1000, 7 };

		cases[c].compress(&body, text, TEXT_SIZE);
		body_file_make(&f, &body);
		for (size_t k = 0; k < sizeof(chunks) / sizeof(chunks[0]); k++) {
			struct dbox_reader *reader;
			uint8_t *buf = malloc(TEXT_SIZE);
			uint64_t off = 0, before;
			ssize_t ret;
			/* 7-byte reads only over the first 100 KB */
			uint64_t limit = chunks[k] == 7 ? 100000 : TEXT_SIZE;

			assert_int_equal(dbox_reader_open(f.fd, f.body_offset,
							  f.body_size, TEXT_SIZE,
							  &reader), 0);
			assert_int_equal(dbox_reader_compression(reader),
					 cases[c].compression);
			before = rchar();
			while (off < limit &&
			       (ret = dbox_reader_pread(reader, buf + off,
							chunks[k], off)) > 0)
				off += (uint64_t)ret;
			if (limit == TEXT_SIZE) {
				assert_int_equal(off, TEXT_SIZE);
				assert_memory_equal(buf, text, TEXT_SIZE);
				/* O(size): each stored byte read once (plus
				   /proc/self/io itself). */
				assert_true(rchar() - before <=
					    f.body_size + 4096);
			} else {
				assert_memory_equal(buf, text, off);
			}
			dbox_reader_free(&reader);
			free(buf);
		}
		body_file_free(&f);
		free(body.data);
	}
	free(text);
}

/* Random reads are correct; reads inside the window cost no file reads,
   reads behind it restart from the body start. */
static void test_random_and_window(void **state)
{
	uint8_t *text = make_text(TEXT_SIZE);

	(void)state;
	for (size_t c = 0; c < N_CASES; c++) {
		struct bytes body = { 0 };
		struct body_file f;
		struct dbox_reader *reader;
		uint64_t before;

		cases[c].compress(&body, text, TEXT_SIZE);
		body_file_make(&f, &body);
		assert_int_equal(dbox_reader_open(f.fd, f.body_offset,
						  f.body_size, TEXT_SIZE,
						  &reader), 0);
		for (int i = 0; i < 40; i++) {
			uint64_t off = rng() % (TEXT_SIZE + 100);
			size_t len = 1 + rng() % (i % 5 == 0 ? 300000 : 5000);

			expect_read(reader, text, TEXT_SIZE, off, len);
		}

		/* From the start forward to 1 MB, then back inside the
		   window: no reads. */
		expect_read(reader, text, TEXT_SIZE, 0, 10);
		expect_read(reader, text, TEXT_SIZE, 1000000, 65536);
		before = rchar();
		expect_read(reader, text, TEXT_SIZE,
			    1000000 + 65536 - DBOX_READ_WINDOW + 10, 4096);
		expect_read(reader, text, TEXT_SIZE, 1000000, 65536);
		/* Straddling the window end: the rest is decoded on. */
		expect_read(reader, text, TEXT_SIZE, 1000000 + 60000, 100000);
		assert_true(rchar() - before < f.body_size / 2);
		/* Far behind: a restart reads the body again up to there. */
		before = rchar();
		expect_read(reader, text, TEXT_SIZE, 1000, 100);
		expect_read(reader, text, TEXT_SIZE, 900000, 100);
		assert_true(rchar() - before > f.body_size / 3);
		/* The end, twice, and past it. */
		expect_read(reader, text, TEXT_SIZE, TEXT_SIZE - 50, 100);
		expect_read(reader, text, TEXT_SIZE, TEXT_SIZE - 50, 100);
		expect_read(reader, text, TEXT_SIZE, TEXT_SIZE, 100);
		dbox_reader_free(&reader);
		body_file_free(&f);
		free(body.data);
	}
	free(text);
}

/* Two streams one after the other read as their concatenation (gzip
   members, bzip2 and xz streams, zstd frames). */
static void test_concatenated(void **state)
{
	uint8_t *text = make_text(300000);

	(void)state;
	for (size_t c = 0; c < N_CASES; c++) {
		struct bytes body = { 0 };
		struct body_file f;
		struct dbox_reader *reader;
		uint8_t *buf;
		uint64_t off = 0;
		ssize_t ret;

		if (!cases[c].concatenates)
			continue;
		buf = malloc(300000);
		cases[c].compress(&body, text, 100000);
		cases[c].compress(&body, text + 100000, 200000);
		body_file_make(&f, &body);
		assert_int_equal(dbox_reader_open(f.fd, f.body_offset,
						  f.body_size, 300000,
						  &reader), 0);
		while ((ret = dbox_reader_pread(reader, buf + off, 65536,
						off)) > 0)
			off += (uint64_t)ret;
		assert_int_equal(ret, 0);
		assert_int_equal(off, 300000);
		assert_memory_equal(buf, text, 300000);
		dbox_reader_free(&reader);
		body_file_free(&f);
		free(body.data);
		free(buf);
	}
	free(text);
}

/* Read everything; expect -DBOX_ECORRUPT (EIO to a reader of the
   mount), one logged error naming the codec and containing `what`, or
   the same reason as data when asked for. */
static void expect_eio(const struct body_file *f, uint64_t body_size,
		       uint64_t plain_size, const char *codec,
		       const char *what)
{
	struct dbox_fault fault;
	struct dbox_reader *reader;
	uint8_t *buf = malloc(65536);
	char expect[64];
	uint64_t off = 0;
	ssize_t ret;

	assert_int_equal(dbox_reader_open(f->fd, f->body_offset, body_size,
					  plain_size, &reader), 0);
	errors_reset();
	while ((ret = dbox_reader_pread(reader, buf, 65536, off)) > 0)
		off += (uint64_t)ret;
	assert_int_equal(ret, -DBOX_ECORRUPT);
	assert_int_equal(error_count, 1);
	snprintf(expect, sizeof(expect), "corrupt %s stream", codec);
	if (strstr(last_error, expect) == NULL ||
	    strstr(last_error, what) == NULL)
		fail_msg("error \"%s\" lacks \"%s\" / \"%s\"", last_error,
			 expect, what);
	/* It restarts on the next read and fails the same way. */
	errors_reset();
	off = 0;
	while ((ret = dbox_reader_pread(reader, buf, 65536, off)) > 0)
		off += (uint64_t)ret;
	assert_int_equal(ret, -DBOX_ECORRUPT);
	/* Asked for as data, the reason is the caller's and not logged. */
	errors_reset();
	off = 0;
	memset(&fault, 0, sizeof(fault));
	while ((ret = dbox_reader_pread_fault(reader, buf, 65536, off,
					      &fault)) > 0)
		off += (uint64_t)ret;
	assert_int_equal(ret, -DBOX_ECORRUPT);
	assert_int_equal(error_count, 0);
	if (strstr(fault.reason, expect) == NULL ||
	    strstr(fault.reason, what) == NULL)
		fail_msg("fault \"%s\" lacks \"%s\" / \"%s\"", fault.reason,
			 expect, what);
	assert_int_equal(fault.offset, f->body_offset);
	dbox_reader_free(&reader);
	free(buf);
}

/* Damage of every kind is EIO and a log line, never wrong bytes: plain
   size off by one either way, a truncated body, garbage in the middle
   (every codec here has a checksum or structure that catches it), and
   garbage after the stream. */
static void test_corrupt(void **state)
{
	const size_t size = 200000;
	uint8_t *text = make_text(size);

	(void)state;
	for (size_t c = 0; c < N_CASES; c++) {
		const char *name = cases[c].name;
		struct bytes body = { 0 };
		struct body_file f;
		uint8_t junk[64];

		cases[c].compress(&body, text, size);
		body_file_make(&f, &body);
		expect_eio(&f, f.body_size, size + 1, name,
			   "stream ends before");
		expect_eio(&f, f.body_size, size - 1, name, "longer than");
		expect_eio(&f, f.body_size - 5, size, name, "");
		expect_eio(&f, f.body_size + 1000, size, name, "file ends");
		body_file_free(&f);

		if (cases[c].compression == DBOX_COMPRESSION_LZ4) {
			/* No checksum in Dovecot's lz4: damage the second
			   chunk's length instead. */
			size_t second = 19 + 4 + ((size_t)body.data[19] << 24 |
				(size_t)body.data[20] << 16 |
				(size_t)body.data[21] << 8 | body.data[22]);
			put_be32(body.data + second, 2 * 1024 * 1024);
		} else {
			/* Junk over the middle. */
			memset(junk, 0xa5, sizeof(junk));
			memcpy(body.data + body.len / 2, junk, sizeof(junk));
		}
		body_file_make(&f, &body);
		expect_eio(&f, f.body_size, size, name, "");
		body_file_free(&f);
		free(body.data);

		/* Bytes after the stream that are no stream. */
		body = (struct bytes){ 0 };
		cases[c].compress(&body, text, size);
		bytes_add(&body, "\0\0\0\0garbage", 11);
		body_file_make(&f, &body);
		expect_eio(&f, f.body_size, size, name, "");
		body_file_free(&f);
		free(body.data);
	}
	free(text);
}

/* Dovecot's lz4 container limits, checked as Dovecot checks them. */
static void test_lz4_container(void **state)
{
	uint8_t *text = make_text(100000);
	struct bytes body;
	struct body_file f;

	(void)state;
	/* Max chunk size above 1 MiB in the header. */
	body = (struct bytes){ 0 };
	compress_lz4(&body, text, 100000);
	put_be32(body.data + 15, 2 * 1024 * 1024);
	body_file_make(&f, &body);
	expect_eio(&f, f.body_size, 100000, "lz4", "max chunk size");
	body_file_free(&f);
	free(body.data);

	/* A chunk length of 0. */
	body = (struct bytes){ 0 };
	compress_lz4(&body, text, 100000);
	put_be32(body.data + 19, 0);
	body_file_make(&f, &body);
	expect_eio(&f, f.body_size, 100000, "lz4", "chunk length");
	body_file_free(&f);
	free(body.data);

	/* A chunk whose plaintext would pass the max chunk size. */
	body = (struct bytes){ 0 };
	compress_lz4(&body, text, 100000);
	put_be32(body.data + 15, 1000);
	body_file_make(&f, &body);
	expect_eio(&f, f.body_size, 100000, "lz4", "corrupt lz4 chunk");
	body_file_free(&f);
	free(body.data);

	/* The header alone: an empty message. */
	body = (struct bytes){ 0 };
	compress_lz4(&body, text, 0);
	assert_int_equal(body.len, 19);
	body_file_make(&f, &body);
	{
		struct dbox_reader *reader;
		uint8_t byte;

		assert_int_equal(dbox_reader_open(f.fd, f.body_offset,
						  f.body_size, 0, &reader), 0);
		assert_int_equal(dbox_reader_compression(reader),
				 DBOX_COMPRESSION_LZ4);
		assert_int_equal(dbox_reader_pread(reader, &byte, 1, 0), 0);
		dbox_reader_free(&reader);
	}
	expect_eio(&f, f.body_size, 1, "lz4", "stream ends before");
	body_file_free(&f);
	free(body.data);
	free(text);
}

static void test_codec_names(void **state)
{
	(void)state;
	assert_ptr_equal(dbox_codec_by_name("gz", 2), &dbox_codec_gz);
	assert_ptr_equal(dbox_codec_by_name("bz2", 3), &dbox_codec_bz2);
	assert_ptr_equal(dbox_codec_by_name("xz", 2), &dbox_codec_xz);
	assert_ptr_equal(dbox_codec_by_name("zstd", 4), &dbox_codec_zstd);
	assert_ptr_equal(dbox_codec_by_name("lz4", 3), &dbox_codec_lz4);
	assert_null(dbox_codec_by_name("gzip", 4));
	assert_null(dbox_codec_by_name("g", 1));
	assert_null(dbox_codec_get(DBOX_COMPRESSION_NONE));
	for (size_t c = 0; c < N_CASES; c++) {
		const struct dbox_codec *codec =
			dbox_codec_get(cases[c].compression);

		assert_non_null(codec);
		assert_int_equal(codec->compression, cases[c].compression);
		assert_string_equal(codec->long_name, cases[c].name);
	}
	/* dboxfs writes gz only. */
	assert_non_null(dbox_codec_gz.encoder_new);
	assert_null(dbox_codec_bz2.encoder_new);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_codec_names),
		cmocka_unit_test(test_sequential),
		cmocka_unit_test(test_random_and_window),
		cmocka_unit_test(test_concatenated),
		cmocka_unit_test(test_corrupt),
		cmocka_unit_test(test_lz4_container),
	};

	dbox_log_set_sink(capture_sink);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
