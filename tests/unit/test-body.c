/*
 * test-body.c: unit tests of writing message bodies, compressed or not
 * (storage/dbox-body.h), with cmocka.
 *
 * What is stored is checked independently of our reader: a compressed
 * body must be one gzip member that zlib inflates to exactly the
 * plaintext, ending exactly at the body end, with Z and V right in the
 * metadata.  How it got there is checked with /proc/self/io wchar:
 * sequential writes must write the compressed bytes only (compressed as
 * they arrive), not the plaintext first.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "storage/dbox-body.h"
#include "storage/dbox-file.h"
#include "storage/dbox-format.h"
#include "storage/dbox-read.h"
#include "storage/log.h"
#include "test-common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* --- helpers ---------------------------------------------------------- */

static uint64_t rng_state = 0x853c49e6748fea9bULL;

/* Mail-like text of exactly `size` bytes, LF line ends and a few CRLF. */
static uint8_t *make_text(size_t size)
{
	static const char *const words[] = {
		"Received:", "patch", "mutex", "the", "of", "scheduler",
		"fuse", "dovecot", "a", "to", "\r\n", "\n",
	};

	return (uint8_t *)mail_text(&rng_state, size, "Subject: y", words,
				    sizeof(words) / sizeof(words[0]));
}

/* Bytes this process wrote to files so far (write + pwrite). */
static uint64_t wchar(void)
{
	return proc_self_io("wchar");
}

/* A temporary directory with storage file m.1 and one record being
   written in it. */
struct fix {
	char dir[64];
	int dir_fd, fd;
	uint64_t end;              /* file end before the record */
	struct dbox_append ap;
	struct dbox_body body;
};

static int fix_setup(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	tmpdir_make(f->dir, sizeof(f->dir), "test-body");
	f->dir_fd = open(f->dir, O_RDONLY | O_DIRECTORY);
	assert_true(f->dir_fd >= 0);
	f->fd = dbox_file_create(f->dir_fd, 1, &f->end);
	assert_true(f->fd >= 0);
	error_count = 0;
	*state = f;
	return 0;
}

static int fix_teardown(void **state)
{
	struct fix *f = *state;

	dbox_body_free(&f->body);
	close(f->fd);
	close(f->dir_fd);
	rm_rf(f->dir);
	free(f);
	return 0;
}

/* Begin a record at the file end with compression spec ("none", "gz",
   "gz:9"). */
static void begin(struct fix *f, const char *spec)
{
	struct dbox_compress_settings set;

	assert_int_equal(dbox_compress_parse(spec, &set), 0);
	assert_int_equal(dbox_append_begin(&f->ap, f->fd, f->end), 0);
	dbox_body_init(&f->body, &f->ap, &set);
}

static void finish(struct fix *f)
{
	struct dbox_metadata md = { .guid = "0123456789abcdef0123456789abcdef",
				    .received = 1700000000 };

	assert_int_equal(dbox_body_finish(&f->body, &md), 0);
	dbox_metadata_clear(&md);
}

/* Write text[0..len) in pieces of `chunk` bytes, in order. */
static void write_seq(struct fix *f, const uint8_t *text, size_t len,
		      size_t chunk, uint64_t at)
{
	for (size_t off = 0; off < len; off += chunk) {
		size_t n = len - off < chunk ? len - off : chunk;

		assert_int_equal(dbox_body_pwrite(&f->body, text + off, n,
						  at + off), 0);
	}
}

struct record {
	uint64_t offset, body_size, record_size;
	struct dbox_metadata md;
};

static int last_record_cb(void *ctx, uint64_t offset, uint64_t body_size,
			  const struct dbox_metadata *md, uint64_t record_size)
{
	struct record *r = ctx;

	dbox_metadata_clear(&r->md);
	r->offset = offset;
	r->body_size = body_size;
	r->record_size = record_size;
	r->md = *md;
	r->md.mailbox = NULL;
	r->md.extra = NULL;
	return 0;
}

/* Walk the file (it must be whole) and return its last record. */
static void last_record(struct fix *f, struct record *r)
{
	struct stat st;

	memset(r, 0, sizeof(*r));
	assert_int_equal(dbox_file_walk(f->fd, 1, last_record_cb, r, NULL), 0);
	assert_int_equal(fstat(f->fd, &st), 0);
	assert_int_equal(r->offset + r->record_size, (uint64_t)st.st_size);
}

static uint8_t *read_stored(struct fix *f, const struct record *r)
{
	uint8_t *buf = malloc(r->body_size + 1);

	assert_non_null(buf);
	assert_int_equal(pread(f->fd, buf, r->body_size,
			       (off_t)(r->offset + DBOX_MSG_HEADER_SIZE)),
			 (ssize_t)r->body_size);
	return buf;
}

/* The last record must hold text[0..len) as one gzip member, with Z and
   V of the plaintext.  Inflated with zlib directly. */
static void expect_gz_record(struct fix *f, const uint8_t *text, size_t len)
{
	struct record r;
	uint8_t *stored, *plain = malloc(len + 1);
	z_stream zs;

	last_record(f, &r);
	assert_int_equal(r.offset, f->end);
	stored = read_stored(f, &r);
	/* gzip header as Dovecot writes: 1f 8b, deflate, no flags, OS 3 */
	assert_true(r.body_size > 18);
	assert_memory_equal(stored, "\x1f\x8b\x08\x00", 4);
	assert_int_equal(stored[9], 3);
	memset(&zs, 0, sizeof(zs));
	assert_int_equal(inflateInit2(&zs, 31), Z_OK);
	zs.next_in = stored;
	zs.avail_in = (uInt)r.body_size;
	zs.next_out = plain;
	zs.avail_out = (uInt)len + 1;
	assert_int_equal(inflate(&zs, Z_FINISH), Z_STREAM_END);
	assert_int_equal(zs.avail_in, 0);      /* one member, nothing after */
	assert_int_equal(zs.total_out, len);
	inflateEnd(&zs);
	assert_memory_equal(plain, text, len);
	assert_true(r.md.has_plain_size);
	assert_int_equal(r.md.plain_size, len);
	assert_true(r.md.has_vsize);
	assert_int_equal(r.md.vsize, dbox_vsize_add(text, len, false, NULL));
	assert_int_equal(dbox_body_size(&f->body), len);
	free(stored);
	free(plain);
	dbox_metadata_clear(&r.md);
}

/* The last record must hold text[0..len) plain. */
static void expect_plain_record(struct fix *f, const uint8_t *text,
				size_t len)
{
	struct record r;
	uint8_t *stored;

	last_record(f, &r);
	assert_int_equal(r.body_size, len);
	assert_false(r.md.has_plain_size);
	assert_int_equal(r.md.vsize, dbox_vsize_add(text, len, false, NULL));
	stored = read_stored(f, &r);
	assert_memory_equal(stored, text, len);
	free(stored);
	dbox_metadata_clear(&r.md);
}

/* dbox_body_pread over the whole body, in 3000-byte reads. */
static void expect_body_reads(struct fix *f, const uint8_t *text, size_t len)
{
	uint8_t *buf = malloc(len + 1);
	uint64_t off = 0;
	ssize_t ret;

	while ((ret = dbox_body_pread(&f->body, buf + off, 3000, off)) > 0)
		off += (uint64_t)ret;
	assert_int_equal(ret, 0);
	assert_int_equal(off, len);
	assert_memory_equal(buf, text, len);
	free(buf);
}

#define SIZE (700 * 1024 + 3)

/* --- tests ------------------------------------------------------------ */

static void test_parse(void **state)
{
	struct dbox_compress_settings set;
	char buf[32];

	(void)state;
	assert_int_equal(dbox_compress_parse("gz", &set), 0);
	assert_int_equal(set.method, DBOX_COMPRESSION_GZ);
	assert_int_equal(set.level, 0);
	dbox_compress_format(&set, buf, sizeof(buf));
	assert_string_equal(buf, "gz:6");
	assert_int_equal(dbox_compress_parse("gz:9", &set), 0);
	assert_int_equal(set.level, 9);
	assert_int_equal(dbox_compress_parse("gz:1", &set), 0);
	assert_int_equal(set.level, 1);
	assert_int_equal(dbox_compress_parse("none", &set), 0);
	assert_int_equal(set.method, DBOX_COMPRESSION_NONE);
	dbox_compress_format(&set, buf, sizeof(buf));
	assert_string_equal(buf, "none");
	static const char *const bad[] = {
		"gz:0", "gz:10", "gz:", "gz:5x", "gz:-1", "zip", "", "gzip",
		"bz2", "xz", "zstd", "lz4", /* read, never written */
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(dbox_compress_parse(bad[i], &set), -EINVAL);
	}
}

/* The normal case: written front to back, compressed as it arrives. */
static void test_sequential_gz(void **state)
{
	struct fix *f = *state;
	uint8_t *text = make_text(SIZE);
	uint64_t before, written;
	struct record r;

	begin(f, "gz");
	before = wchar();
	write_seq(f, text, SIZE, 4096, 0);
	finish(f);
	written = wchar() - before;
	expect_gz_record(f, text, SIZE);
	last_record(f, &r);
	/* Only the compressed bytes, header and metadata were written (the
	   plaintext never was): less than the plaintext size by far. */
	assert_true(r.body_size < SIZE / 2);
	assert_true(written <= r.record_size + 4096);
	/* Reading the finished body back does not change it. */
	expect_body_reads(f, text, SIZE);
	expect_gz_record(f, text, SIZE);
	dbox_metadata_clear(&r.md);
	free(text);
}

/* Reverse order, overwrites and gaps: stored compressed all the same. */
static void test_out_of_order(void **state)
{
	struct fix *f = *state;
	uint8_t *text = make_text(SIZE);
	uint8_t *zeros = calloc(1, SIZE);

	begin(f, "gz");
	/* Second half first, then the first half. */
	write_seq(f, text + SIZE / 2, SIZE - SIZE / 2, 10000, SIZE / 2);
	write_seq(f, text, SIZE / 2, 10000, 0);
	finish(f);
	expect_gz_record(f, text, SIZE);

	/* Sequential, then an overwrite in the middle (decompress, patch,
	   recompress at finish). */
	dbox_body_free(&f->body);
	f->end = f->ap.offset + f->ap.record_size;
	begin(f, "gz");
	write_seq(f, text, SIZE, 65536, 0);
	assert_int_equal(dbox_body_pwrite(&f->body, "PATCHED", 7, 1000), 0);
	memcpy(text + 1000, "PATCHED", 7);
	write_seq(f, text + SIZE - 10, 10, 10, SIZE - 10); /* rewrite end */
	finish(f);
	expect_gz_record(f, text, SIZE);

	/* A gap reads as zeros. */
	dbox_body_free(&f->body);
	f->end = f->ap.offset + f->ap.record_size;
	begin(f, "gz");
	assert_int_equal(dbox_body_pwrite(&f->body, "tail", 4, 100000), 0);
	memcpy(zeros + 100000, "tail", 4);
	finish(f);
	expect_gz_record(f, zeros, 100004);
	assert_int_equal(error_count, 0);
	free(zeros);
	free(text);
}

/* Reads while the body is being written see the bytes written so far. */
static void test_read_while_writing(void **state)
{
	struct fix *f = *state;
	uint8_t *text = make_text(SIZE);
	uint8_t buf[100];

	begin(f, "gz");
	write_seq(f, text, 300000, 8192, 0);
	assert_int_equal(dbox_body_size(&f->body), 300000);
	assert_int_equal(dbox_body_pread(&f->body, buf, 100, 1000), 100);
	assert_memory_equal(buf, text + 1000, 100);
	assert_int_equal(dbox_body_pread(&f->body, buf, 100, 299950), 50);
	assert_memory_equal(buf, text + 299950, 50);
	assert_int_equal(dbox_body_pread(&f->body, buf, 100, 300000), 0);
	/* ... and writing goes on. */
	write_seq(f, text + 300000, SIZE - 300000, 8192, 300000);
	expect_body_reads(f, text, SIZE);
	finish(f);
	expect_gz_record(f, text, SIZE);
	expect_body_reads(f, text, SIZE);
	free(text);
}

/* More writes after a finish (a client that closes a dup and writes on),
   and a second finish. */
static void test_write_after_finish(void **state)
{
	struct fix *f = *state;
	uint8_t *text = make_text(SIZE);

	begin(f, "gz");
	write_seq(f, text, 200000, 4096, 0);
	finish(f);
	expect_gz_record(f, text, 200000);
	write_seq(f, text + 200000, SIZE - 200000, 4096, 200000);
	finish(f);
	expect_gz_record(f, text, SIZE);
	finish(f); /* nothing changed: the same record again */
	expect_gz_record(f, text, SIZE);
	free(text);
}

static void test_truncate(void **state)
{
	struct fix *f = *state;
	uint8_t *text = make_text(SIZE);
	uint8_t *grown = calloc(1, 500000);

	begin(f, "gz");
	write_seq(f, text, 400000, 4096, 0);
	assert_int_equal(dbox_body_truncate(&f->body, 400000), 0); /* same */
	assert_int_equal(dbox_body_truncate(&f->body, 300000), 0);
	assert_int_equal(dbox_body_size(&f->body), 300000);
	assert_int_equal(dbox_body_truncate(&f->body, 500000), 0);
	memcpy(grown, text, 300000);
	finish(f);
	expect_gz_record(f, grown, 500000);

	/* O_TRUNC then a new sequential write: compressed as it arrives. */
	assert_int_equal(dbox_body_truncate(&f->body, 0), 0);
	assert_int_equal(dbox_body_size(&f->body), 0);
	uint64_t before = wchar();
	write_seq(f, text, SIZE, 4096, 0);
	assert_true(wchar() - before < SIZE / 2);
	finish(f);
	expect_gz_record(f, text, SIZE);
	free(grown);
	free(text);
}

/* An empty message stays empty; no Z. */
static void test_empty(void **state)
{
	struct fix *f = *state;

	begin(f, "gz");
	finish(f);
	expect_plain_record(f, (const uint8_t *)"", 0);
}

/* Compression off: plain bytes, except a body that would be mistaken for
   a compressed one, which is stored gz so that it reads back. */
static void test_plain_and_lookalikes(void **state)
{
	struct fix *f = *state;
	uint8_t *text = make_text(100000);
	static const char *const heads[] = {
		"\x1f\x8b", "BZh9", "\xfd" "7zXZ", "\x28\xb5\x2f\xfd",
		"Dovecot-LZ4\r\x2a\x9b\xc5",
	};
	static const size_t head_len[] = { 2, 4, 6, 4, 15 };

	begin(f, "none");
	write_seq(f, text, 100000, 4096, 0);
	finish(f);
	expect_plain_record(f, text, 100000);
	expect_body_reads(f, text, 100000);

	for (size_t i = 0; i < sizeof(heads) / sizeof(heads[0]); i++) {
		struct dbox_reader *reader;
		struct record r;
		uint8_t buf[100];

		memcpy(text, heads[i], head_len[i]);
		dbox_body_free(&f->body);
		f->end = f->ap.offset + f->ap.record_size;
		begin(f, "none");
		write_seq(f, text, 100000, 4096, 0);
		finish(f);
		expect_gz_record(f, text, 100000);
		/* Our reader gives the plaintext back, look-alike head and
		   all. */
		last_record(f, &r);
		assert_int_equal(dbox_reader_open(f->fd, r.offset +
						  DBOX_MSG_HEADER_SIZE,
						  r.body_size, 100000,
						  &reader), 0);
		assert_int_equal(dbox_reader_pread(reader, buf, 100, 0), 100);
		assert_memory_equal(buf, text, 100);
		dbox_reader_free(&reader);
		dbox_metadata_clear(&r.md);
	}
	free(text);
}

/* Read syscalls made by fn(f), less those of reading the counter. */
static uint64_t reads_during(struct fix *f, void (*fn)(struct fix *))
{
	uint64_t base = proc_self_io("syscr");
	uint64_t idle = proc_self_io("syscr") - base;

	base = proc_self_io("syscr");
	fn(f);
	return proc_self_io("syscr") - base - idle;
}

/* A plain body written in order (a delivery) is sealed without reading
   anything back: its V and first bytes were kept while it was written.
   Written out of order, sealing reads it, and V comes out the same. */
static void test_in_order_seal_reads_nothing(void **state)
{
	struct fix *f = *state;
	size_t len = 50001;
	uint8_t *text = make_text(len);

	text[4095] = '\r'; /* a CRLF across two writes */
	text[4096] = '\n';
	begin(f, "none");
	write_seq(f, text, len, 4096, 0);
	assert_int_equal(reads_during(f, finish), 0);
	expect_plain_record(f, text, len);

	dbox_body_free(&f->body);
	f->end = f->ap.offset + f->ap.record_size;
	begin(f, "none");
	write_seq(f, text + 4096, len - 4096, 4096, 4096);
	write_seq(f, text, 4096, 4096, 0);
	assert_true(reads_during(f, finish) > 0);
	expect_plain_record(f, text, len);

	/* Emptied and written again in order: nothing read either. */
	dbox_body_free(&f->body);
	f->end = f->ap.offset + f->ap.record_size;
	begin(f, "none");
	write_seq(f, text + 7, 1000, 100, 0);
	assert_int_equal(dbox_body_truncate(&f->body, 0), 0);
	write_seq(f, text, len, 1000, 0);
	assert_int_equal(reads_during(f, finish), 0);
	expect_plain_record(f, text, len);
	free(text);
}

/* Higher levels compress at least as well; all are gzip. */
static void test_levels(void **state)
{
	struct fix *f = *state;
	uint8_t *text = make_text(SIZE);
	uint64_t size1, size9;
	struct record r;

	begin(f, "gz:1");
	write_seq(f, text, SIZE, 65536, 0);
	finish(f);
	expect_gz_record(f, text, SIZE);
	last_record(f, &r);
	size1 = r.body_size;
	dbox_metadata_clear(&r.md);

	dbox_body_free(&f->body);
	f->end = f->ap.offset + f->ap.record_size;
	begin(f, "gz:9");
	write_seq(f, text, SIZE, 65536, 0);
	finish(f);
	expect_gz_record(f, text, SIZE);
	last_record(f, &r);
	size9 = r.body_size;
	dbox_metadata_clear(&r.md);
	assert_true(size9 < size1);
	free(text);
}

/* A descriptor of m.1 opened read-only, for writes that must fail. */
static int open_ro(struct fix *f)
{
	int fd = openat(f->dir_fd, "m.1", O_RDONLY | O_CLOEXEC);

	assert_true(fd >= 0);
	return fd;
}

/* A write error while compressed bytes go out breaks the body: that call
   and every later one return the same negative errno (-EBADF here, a
   read-only descriptor; ENOSPC in life), reads say -EIO, and the record
   can still be dropped. */
static void test_broken_stream_errors(void **state)
{
	struct fix *f = *state;
	uint8_t *text = make_text(SIZE), buf[16];
	struct dbox_metadata md = { .guid = "g" };
	int ro = open_ro(f), ret = 0;
	size_t off;

	begin(f, "gz");
	f->ap.fd = ro;
	for (off = 0; off < SIZE && ret == 0; off += 8192)
		ret = dbox_body_pwrite(&f->body, text + off,
				       SIZE - off < 8192 ? SIZE - off : 8192,
				       off);
	assert_int_equal(ret, -EBADF);
	assert_int_equal(f->body.mode, DBOX_BODY_BROKEN);
	assert_int_equal(error_count, 1);
	assert_non_null(strstr(last_error, "message body lost"));
	errno = 0;
	assert_int_equal(dbox_body_pwrite(&f->body, "x", 1, off), -EBADF);
	assert_int_equal(dbox_body_pwrite(&f->body, "x", 1, 0), -EBADF);
	assert_int_equal(dbox_body_truncate(&f->body, 5), -EBADF);
	assert_int_equal(dbox_body_finish(&f->body, &md), -EBADF);
	assert_int_equal(dbox_body_pread(&f->body, buf, sizeof(buf), 0), -EIO);
	f->ap.fd = f->fd;
	assert_int_equal(dbox_append_abort(&f->ap), 0);
	close(ro);
	free(text);
}

/* A plain write that fails leaves the body usable. */
static void test_plain_write_error(void **state)
{
	struct fix *f = *state;
	int ro = open_ro(f);

	begin(f, "none");
	f->ap.fd = ro;
	assert_int_equal(dbox_body_pwrite(&f->body, "Subject: x\n\nhi\n", 15,
					  0), -EBADF);
	f->ap.fd = f->fd;
	assert_int_equal(dbox_body_pwrite(&f->body, "Subject: x\n\nhi\n", 15,
					  0), 0);
	finish(f);
	expect_plain_record(f, (const uint8_t *)"Subject: x\n\nhi\n", 15);
	close(ro);
}

/* A finished gz body whose stored bytes are damaged (its CRC32, so the
   damage shows at the stream's end): reading it through and turning it
   plain (a write elsewhere) return -EIO, and the plaintext size stays
   what it was. */
static void test_corrupt_stream_errors(void **state)
{
	struct fix *f = *state;
	uint8_t *text = make_text(200000), *buf = malloc(200000);
	uint64_t off = 0;
	struct record r;
	ssize_t ret;

	assert_non_null(buf);
	begin(f, "gz");
	write_seq(f, text, 200000, 8192, 0);
	finish(f);
	last_record(f, &r);
	dbox_metadata_clear(&r.md);
	assert_int_equal(pwrite(f->fd, "\xde\xad\xbe\xef", 4,
				(off_t)(r.offset + DBOX_MSG_HEADER_SIZE +
					r.body_size - 8)), 4);
	errno = 0;
	while ((ret = dbox_body_pread(&f->body, buf + off, 200000 - off,
				      off)) > 0)
		off += (uint64_t)ret;
	assert_int_equal(ret, -EIO);
	errno = 0;
	assert_int_equal(dbox_body_pwrite(&f->body, "X", 1, 10), -EIO);
	assert_int_equal(dbox_body_size(&f->body), 200000);
	assert_true(error_count > 0);
	free(buf);
	free(text);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, fix_setup, fix_teardown)
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse),
		T(test_sequential_gz),
		T(test_out_of_order),
		T(test_read_while_writing),
		T(test_write_after_finish),
		T(test_truncate),
		T(test_empty),
		T(test_plain_and_lookalikes),
		T(test_in_order_seal_reads_nothing),
		T(test_levels),
		T(test_broken_stream_errors),
		T(test_plain_write_error),
		T(test_corrupt_stream_errors),
	};

	dbox_log_set_sink(capture_sink);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
