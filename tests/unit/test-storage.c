/*
 * test-storage.c: unit tests of storage/ (dbox-format, dbox-file,
 * dbox-read, guid) with cmocka.
 *
 * The fixture tests read real m.1 files written by Dovecot 2.3.19 from
 * /work/shared/fixtures/dovecot-mdbox (override with DBOXFS_SHARED=<dir
 * holding fixtures/ and corpora/>) and are skipped when it is missing.
 * Write tests work in a fresh mkdtemp() directory each.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "storage/dbox-file.h"
#include "storage/dbox-format.h"
#include "storage/dbox-read.h"
#include "storage/fd-cache.h"
#include "storage/guid.h"
#include "storage/log.h"
#include "test-common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#define DEFAULT_SHARED "/work/shared"

/* --- helpers ---------------------------------------------------------- */

static const char *shared_dir(void)
{
	const char *dir = getenv("DBOXFS_SHARED");
	return dir != NULL ? dir : DEFAULT_SHARED;
}

/* Read a whole file into a malloc()ed, NUL-terminated buffer; NULL if
   it does not exist. */
static char *slurp(const char *path, size_t *len_r)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long len;

	if (f == NULL)
		return NULL;
	assert_int_equal(fseek(f, 0, SEEK_END), 0);
	len = ftell(f);
	assert_true(len >= 0);
	rewind(f);
	buf = malloc((size_t)len + 1);
	assert_non_null(buf);
	assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
	buf[len] = '\0';
	fclose(f);
	*len_r = (size_t)len;
	return buf;
}

/* Per-test temporary directory. */
struct tmpdir {
	char path[64];
	int fd;
};

static int tmpdir_setup(void **state)
{
	struct tmpdir *t = calloc(1, sizeof(*t));

	assert_non_null(t);
	tmpdir_make(t->path, sizeof(t->path), "test-storage");
	t->fd = open(t->path, O_RDONLY | O_DIRECTORY);
	assert_true(t->fd >= 0);
	*state = t;
	return 0;
}

static int tmpdir_teardown(void **state)
{
	struct tmpdir *t = *state;

	close(t->fd);
	rm_rf(t->path);
	free(t);
	return 0;
}

static uint64_t file_size(int fd)
{
	struct stat st;

	assert_int_equal(fstat(fd, &st), 0);
	return (uint64_t)st.st_size;
}

/* Records collected by dbox_file_walk. */
#define MAX_RECORDS 32
struct record {
	uint64_t offset, body_size, record_size;
	struct dbox_metadata md; /* deep copy */
};
struct walk {
	struct record rec[MAX_RECORDS];
	unsigned int count;
};

static int collect_cb(void *ctx, uint64_t offset, uint64_t body_size,
		      const struct dbox_metadata *md, uint64_t record_size)
{
	struct walk *w = ctx;
	struct record *r;

	assert_true(w->count < MAX_RECORDS);
	r = &w->rec[w->count++];
	r->offset = offset;
	r->body_size = body_size;
	r->record_size = record_size;
	r->md = *md;
	r->md.mailbox = md->mailbox == NULL ? NULL : strdup(md->mailbox);
	r->md.extra = md->extra == NULL ? NULL : strdup(md->extra);
	return 0;
}

static void walk_free(struct walk *w)
{
	for (unsigned int i = 0; i < w->count; i++)
		dbox_metadata_clear(&w->rec[i].md);
	w->count = 0;
}

/* Read body [off, off+len) of a record into a new buffer with pread. */
static char *read_body(int fd, const struct record *r)
{
	char *buf = malloc(r->body_size + 1);

	assert_non_null(buf);
	assert_int_equal(pread(fd, buf, r->body_size,
			       (off_t)(r->offset + DBOX_MSG_HEADER_SIZE)),
			 (ssize_t)r->body_size);
	buf[r->body_size] = '\0';
	return buf;
}

/* Read the whole plaintext of a record through dbox_reader, in chunks of
   `chunk` bytes, into a new buffer; checks the total is plain_size. */
static char *read_plain(int fd, const struct record *r, uint64_t plain_size,
			size_t chunk)
{
	struct dbox_reader *reader;
	char *buf = malloc(plain_size + 1);
	uint64_t off = 0;
	ssize_t ret;

	assert_non_null(buf);
	assert_int_equal(dbox_reader_open(fd, r->offset + DBOX_MSG_HEADER_SIZE,
					  r->body_size, plain_size, &reader), 0);
	while ((ret = dbox_reader_pread(reader, buf + off, chunk, off)) > 0)
		off += (uint64_t)ret;
	assert_int_equal(ret, 0);
	assert_int_equal(off, plain_size);
	dbox_reader_free(&reader);
	assert_null(reader);
	buf[plain_size] = '\0';
	return buf;
}

static uint64_t vsize_of(const char *buf, size_t len)
{
	return dbox_vsize_add(buf, len, false, NULL);
}

/* Deterministic pseudo-random numbers (xorshift64). */
static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rng(void)
{
	return xorshift64(&rng_state);
}

/* Mail-like text of about `size` bytes, LF line ends. */
static char *make_text(size_t size)
{
	static const char *const words[] = {
		"kernel", "patch", "mutex", "Signed-off-by:", "the", "of",
		"scheduler", "fuse", "dovecot", "a", "to", "[PATCH]", "\t",
	};

	return mail_text(&rng_state, size, "Subject: x", words,
			 sizeof(words) / sizeof(words[0]));
}

/* gzip `len` bytes the way zlib's gzip writer does (windowBits 31). */
static uint8_t *gzip(const void *in, size_t len, size_t *out_len_r)
{
	z_stream zs;
	uLong bound;
	uint8_t *out;

	memset(&zs, 0, sizeof(zs));
	assert_int_equal(deflateInit2(&zs, 6, Z_DEFLATED, 31, 8,
				      Z_DEFAULT_STRATEGY), Z_OK);
	bound = deflateBound(&zs, len);
	out = malloc(bound);
	assert_non_null(out);
	zs.next_in = (Bytef *)in;
	zs.avail_in = (uInt)len;
	zs.next_out = out;
	zs.avail_out = (uInt)bound;
	assert_int_equal(deflate(&zs, Z_FINISH), Z_STREAM_END);
	*out_len_r = zs.total_out;
	deflateEnd(&zs);
	return out;
}

/* Append one finished record with body[0..len) and md; returns its
   record size.  *offset is advanced past it. */
static uint64_t append_record(int fd, uint64_t *offset, const void *body,
			      size_t len, struct dbox_metadata *md)
{
	struct dbox_append ap;

	assert_int_equal(dbox_append_begin(&ap, fd, *offset), 0);
	assert_int_equal(dbox_append_pwrite(&ap, body, len, 0), 0);
	assert_int_equal(dbox_append_finish(&ap, md), 0);
	assert_int_equal(ap.body_size, len);
	assert_int_equal(file_size(fd), *offset + ap.record_size);
	*offset += ap.record_size;
	return ap.record_size;
}

/* --- dbox-format ------------------------------------------------------ */

static void test_file_header(void **state)
{
	(void)state;
	char buf[DBOX_FILE_HEADER_MAX];
	size_t len, header_len;
	unsigned int msg_size;
	time_t created;

	len = dbox_file_header_format(buf, 0x6b0c840f);
	assert_int_equal(len, 16);
	assert_memory_equal(buf, "2 M1e C6b0c840f\n", 16);
	assert_int_equal(dbox_file_header_parse(buf, len, &header_len,
						&msg_size, &created, NULL), 0);
	assert_int_equal(header_len, 16);
	assert_int_equal(msg_size, 30);
	assert_int_equal(created, 0x6b0c840f);

	/* Unknown and old (A) tokens are ignored; C is optional; the
	   first record starts right after the line. */
	const char *odd = "2 A1234 M1E Qzz\nXXXX";
	assert_int_equal(dbox_file_header_parse(odd, strlen(odd), &header_len,
						&msg_size, &created, NULL), 0);
	assert_int_equal(header_len, 16);
	assert_int_equal(created, 0);

	static const char *const bad[] = {
		"1 M1e C5\n",      /* version 1 */
		"2 C5\n",          /* M missing */
		"2 M20 C5\n",      /* wrong header size */
		"2 M C5\n",        /* empty M */
		"2 M1e C5",        /* no newline */
		"",
		"2M1e\n",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(dbox_file_header_parse(bad[i], strlen(bad[i]),
							&header_len, &msg_size,
							&created, NULL), -DBOX_ECORRUPT);
	}
	/* The '\n' must lie within len. */
	assert_int_equal(dbox_file_header_parse(buf, len - 1, &header_len,
						&msg_size, &created, NULL), -DBOX_ECORRUPT);
}

static void test_msg_header(void **state)
{
	(void)state;
	uint8_t hdr[DBOX_MSG_HEADER_SIZE];
	uint64_t size;

	dbox_msg_header_format(hdr, 0xF23);
	assert_memory_equal(hdr, "\x01\x02N          0000000000000F23\n", 30);
	assert_int_equal(dbox_msg_header_parse(hdr, &size, NULL), 0);
	assert_int_equal(size, 0xF23);

	static const uint64_t sizes[] = { 0, 1, 0xabcdef, UINT32_MAX,
					  UINT64_MAX };
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		dbox_msg_header_format(hdr, sizes[i]);
		for (int j = 13; j < 29; j++)
			assert_true(strchr("0123456789ABCDEF", hdr[j]) != NULL);
		assert_int_equal(dbox_msg_header_parse(hdr, &size, NULL), 0);
		assert_true(size == sizes[i]);
	}

	/* Lower case hex is accepted. */
	memcpy(hdr, "\x01\x02N          0000000000000f23\n", 30);
	assert_int_equal(dbox_msg_header_parse(hdr, &size, NULL), 0);
	assert_int_equal(size, 0xF23);

	static const char *const bad[] = {
		"\x01\x03N          0000000000000F23\n", /* magic */
		"\x00\x02N          0000000000000F23\n",
		"\x01\x02X          0000000000000F23\n", /* type */
		"\x01\x02N          0000000000000F2G\n", /* non-hex */
		"\x01\x02N          00000000000 0F23\n",
		"\x01\x02N          -000000000000F23\n",
		"\x01\x02N          0000000000000F23 ",  /* no LF */
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memcpy(hdr, bad[i], 30);
		assert_int_equal(dbox_msg_header_parse(hdr, &size, NULL), -DBOX_ECORRUPT);
	}
}

static void test_metadata_roundtrip(void **state)
{
	(void)state;
	static const char expected[] =
		"\n\x01\x03\n"
		"Zf23\n"
		"R6b0c841b\n"
		"Vf86\n"
		"Gd6f1ab0a1b840c6b4e6e000083ecc375\n"
		"BLists/Kernel\n"
		"L.Lists.Kernel/tmp/1.host\n"
		"P1234.5678\n"
		"O7\n"
		"\n";
	struct dbox_metadata md = {
		.received = 0x6b0c841b,
		.vsize = 0xf86, .has_vsize = true,
		.plain_size = 0xf23, .has_plain_size = true,
		.guid = "d6f1ab0a1b840c6b4e6e000083ecc375",
	};
	struct dbox_metadata back;
	size_t block_len;
	char *buf;
	long len;

	md.mailbox = strdup("Lists/Kernel");
	md.msg_path = strdup(".Lists.Kernel/tmp/1.host");
	md.extra = strdup("P1234.5678\nO7\n");
	len = dbox_metadata_format(&md, &buf);
	assert_int_equal(len, sizeof(expected) - 1);
	assert_memory_equal(buf, expected, sizeof(expected) - 1);

	assert_int_equal(dbox_metadata_parse(buf, (size_t)len, &back,
					     &block_len, NULL), 0);
	assert_int_equal(block_len, (size_t)len);
	assert_string_equal(back.guid, md.guid);
	assert_int_equal(back.received, md.received);
	assert_true(back.has_vsize && back.vsize == md.vsize);
	assert_true(back.has_plain_size && back.plain_size == md.plain_size);
	assert_string_equal(back.mailbox, "Lists/Kernel");
	assert_string_equal(back.msg_path, ".Lists.Kernel/tmp/1.host");
	assert_string_equal(back.extra, "P1234.5678\nO7\n");
	dbox_metadata_clear(&back);
	assert_null(back.mailbox);
	assert_null(back.msg_path);

	/* Every proper prefix asks for more; trailing bytes are not part
	   of the block. */
	for (long i = 0; i < len; i++) {
		assert_int_equal(dbox_metadata_parse(buf, (size_t)i, &back,
						     &block_len, NULL), 1);
		assert_null(back.mailbox);
		assert_null(back.extra);
	}
	char *longer = malloc((size_t)len + 10);
	memcpy(longer, buf, (size_t)len);
	memcpy(longer + len, "\x01\x02N  junk", 10);
	assert_int_equal(dbox_metadata_parse(longer, (size_t)len + 10, &back,
					     &block_len, NULL), 0);
	assert_int_equal(block_len, (size_t)len);
	dbox_metadata_clear(&back);
	free(longer);
	free(buf);

	/* No Z, no V, no G; a mailbox with LF is omitted; extra without a
	   final LF still makes a valid block. */
	dbox_metadata_clear(&md);
	md.received = 0x10;
	md.mailbox = strdup("bad\nname");
	md.msg_path = strdup("tmp/bad\rname");
	md.extra = strdup("Xsomething");
	len = dbox_metadata_format(&md, &buf);
	assert_int_equal(len, strlen("\n\x01\x03\nR10\nXsomething\n\n"));
	assert_memory_equal(buf, "\n\x01\x03\nR10\nXsomething\n\n", (size_t)len);
	assert_int_equal(dbox_metadata_parse(buf, (size_t)len, &back,
					     &block_len, NULL), 0);
	assert_false(back.has_vsize);
	assert_false(back.has_plain_size);
	assert_string_equal(back.guid, "");
	assert_null(back.mailbox);
	assert_null(back.msg_path);
	dbox_metadata_clear(&back);
	dbox_metadata_clear(&md);
	free(buf);

	/* A foreign GUID longer than the field is truncated. */
	char big[200] = "\n\x01\x03\nG";
	memset(big + 5, 'a', 100);
	strcpy(big + 105, "\n\n");
	assert_int_equal(dbox_metadata_parse(big, strlen(big), &back,
					     &block_len, NULL), 0);
	assert_int_equal(strlen(back.guid), DBOX_GUID_HEX_LEN * 2);
	dbox_metadata_clear(&back);

	/* Old v1 padding: a line starting with a space ends the block. */
	static const char v1[] = "\n\x01\x03\nGabc\n      \nnext";
	assert_int_equal(dbox_metadata_parse(v1, sizeof(v1) - 1, &back,
					     &block_len, NULL), 0);
	assert_int_equal(block_len, sizeof(v1) - 1 - 4);
	assert_string_equal(back.guid, "abc");
	dbox_metadata_clear(&back);
}

/* A (dboxfs's own key, docs/dbox-format.md section 5): mode in octal,
   owner and group in decimal, written after L; read back only when it
   reads exactly so, else kept as an unknown line (a copy keeps it). */
static void test_metadata_owner(void **state)
{
	(void)state;
	struct dbox_metadata md = { .received = 0x10 }, back;
	static const char *const bad[] = {
		"A", "A644", "A644 1", "A644 1 2 3", "A1644 1 2", "A8 1 2",
		"A644 4294967296 1", "A644  1 2", "A644 1 -2", "A644 01234567890 1",
	};
	size_t block_len;
	char *buf, blk[64];
	long len;

	md.msg_path = strdup("cur/1.host:2,S");
	md.owner = (struct dbox_owner){ .set = true, .mode = 0640,
					.uid = 1000, .gid = 4294967295u };
	len = dbox_metadata_format(&md, &buf);
	static const char expected[] = "\n\x01\x03\nR10\nLcur/1.host:2,S\n"
				       "A640 1000 4294967295\n\n";
	assert_int_equal(len, sizeof(expected) - 1);
	assert_memory_equal(buf, expected, sizeof(expected) - 1);
	assert_int_equal(dbox_metadata_parse(buf, (size_t)len, &back,
					     &block_len, NULL), 0);
	assert_true(back.owner.set);
	assert_int_equal(back.owner.mode, 0640);
	assert_int_equal(back.owner.uid, 1000);
	assert_int_equal(back.owner.gid, 4294967295u);
	assert_null(back.extra);
	dbox_metadata_clear(&back);
	dbox_metadata_clear(&md);
	free(buf);

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		snprintf(blk, sizeof(blk), "\n\x01\x03\n%s\n\n", bad[i]);
		assert_int_equal(dbox_metadata_parse(blk, strlen(blk), &back,
						     &block_len, NULL), 0);
		assert_false(back.owner.set);
		assert_non_null(back.extra);
		assert_int_equal(strncmp(back.extra, bad[i], strlen(bad[i])), 0);
		dbox_metadata_clear(&back);
	}
}

/* Many unknown lines are kept, in order, each once (they are gathered in
   linear time: helper-67 #F4 saw 520,000 of them take seconds). */
static void test_metadata_many_unknown_lines(void **state)
{
	(void)state;
	enum { LINES = 200000 };
	size_t size = 4 + LINES * 3 + 1, block_len;
	char *blk = malloc(size + 1), *p = blk;
	struct dbox_metadata back;

	assert_non_null(blk);
	memcpy(p, "\n\x01\x03\n", 4);
	p += 4;
	for (int i = 0; i < LINES; i++) {
		*p++ = 'X';
		*p++ = (char)('a' + i % 26);
		*p++ = '\n';
	}
	*p++ = '\n';
	assert_int_equal(dbox_metadata_parse(blk, size, &back, &block_len,
					     NULL), 0);
	assert_int_equal(block_len, size);
	assert_int_equal(strlen(back.extra), (size_t)LINES * 3);
	assert_memory_equal(back.extra, blk + 4, (size_t)LINES * 3);
	dbox_metadata_clear(&back);
	free(blk);
}

static void test_metadata_corrupt(void **state)
{
	(void)state;
	static const char *const bad[] = {
		"\n\x01\x04\nGabc\n\n",   /* magic */
		"X\x01\x03\n\n",
		"\n\x01\x03\ngabc\n\n",   /* lowercase key */
		"\n\x01\x03\n1abc\n\n",   /* digit key */
		"\n\x01\x03\nRxyz\n\n",   /* bad hex */
		"\n\x01\x03\nV\n\n",      /* empty number */
		"\n\x01\x03\nZ11112222333344445\n\n", /* > 64 bits */
		"\n\x01\x03\nBInbox\ngarbage\n\n",
	};
	struct dbox_metadata md;
	size_t block_len;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(dbox_metadata_parse(bad[i], strlen(bad[i]),
						     &md, &block_len, NULL), -DBOX_ECORRUPT);
		assert_null(md.mailbox);
	}
	/* Bad magic is seen even in a short buffer. */
	assert_int_equal(dbox_metadata_parse("\n\x02", 2, &md, &block_len, NULL), -DBOX_ECORRUPT);
	/* A NUL inside a line is corrupt. */
	assert_int_equal(dbox_metadata_parse("\n\x01\x03\nBa\0b\n\n", 10,
					     &md, &block_len, NULL), -DBOX_ECORRUPT);
}

static void test_vsize(void **state)
{
	(void)state;
	bool cr;

	assert_int_equal(dbox_vsize_add("", 0, false, &cr), 0);
	assert_false(cr);
	assert_int_equal(vsize_of("a\nb\r\nc\n", 7), 9);
	assert_int_equal(vsize_of("\n\n", 2), 4);
	/* CR at the end of one chunk, LF at the start of the next. */
	assert_int_equal(dbox_vsize_add("ab\r", 3, false, &cr), 3);
	assert_true(cr);
	assert_int_equal(dbox_vsize_add("\nx\n", 3, cr, &cr), 4);
	assert_false(cr);
	assert_int_equal(dbox_vsize_add("\n", 1, false, NULL), 2);
	/* An empty chunk between a CR and its LF keeps the CR. */
	assert_int_equal(dbox_vsize_add("a\r", 2, false, &cr), 2);
	assert_int_equal(dbox_vsize_add("", 0, cr, &cr), 0);
	assert_true(cr);
	assert_int_equal(dbox_vsize_add("\n", 1, cr, &cr), 1);
	/* Random text of CR, LF and x in random chunks, against the rule
	   counted byte by byte: each LF without a CR before it adds one. */
	srand(14);
	for (int round = 0; round < 200; round++) {
		char text[300];
		size_t len = (size_t)(rand() % (int)sizeof(text));
		uint64_t want = len, got = 0;
		size_t at = 0;

		for (size_t i = 0; i < len; i++) {
			text[i] = "\r\nxx"[rand() % 4];
			if (text[i] == '\n' && (i == 0 || text[i - 1] != '\r'))
				want++;
		}
		cr = false;
		while (at < len) {
			size_t n = (size_t)(rand() % 40);

			n = n > len - at ? len - at : n;
			got += dbox_vsize_add(text + at, n, cr, &cr);
			at += n;
		}
		assert_int_equal(got, want);
		assert_int_equal(cr, len > 0 && text[len - 1] == '\r');
	}
}

static void test_guid(void **state)
{
	(void)state;
	char a[33], b[33];

	dbox_guid_generate(a);
	dbox_guid_generate(b);
	assert_int_equal(strlen(a), 32);
	assert_int_equal(strspn(a, "0123456789abcdef"), 32);
	assert_int_equal(strspn(b, "0123456789abcdef"), 32);
	assert_string_not_equal(a, b);
}

static int cmp_str33(const void *a, const void *b)
{
	return memcmp(a, b, 33);
}

/* Many GUIDs of one process are all different, and a forked child does
   not repeat its parent's (the key is read again after fork()). */
static void test_guid_unique(void **state)
{
	(void)state;
	enum { N = 100000 };
	char (*g)[33] = malloc((size_t)(N + 1) * 33);
	int pipefd[2];
	pid_t pid;

	assert_non_null(g);
	for (int i = 0; i < N; i++)
		dbox_guid_generate(g[i]);
	assert_int_equal(pipe(pipefd), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		char c[33];

		dbox_guid_generate(c);
		_exit(write(pipefd[1], c, 33) == 33 ? 0 : 1);
	}
	close(pipefd[1]);
	assert_int_equal(read(pipefd[0], g[N], 33), 33);
	close(pipefd[0]);
	waitpid(pid, NULL, 0);
	qsort(g, N + 1, 33, cmp_str33);
	for (int i = 1; i <= N; i++)
		assert_string_not_equal(g[i - 1], g[i]);
	free(g);
}

static void test_detect_compression(void **state)
{
	(void)state;
	assert_int_equal(dbox_detect_compression("\x1f\x8b\x08", 3),
			 DBOX_COMPRESSION_GZ);
	assert_int_equal(dbox_detect_compression("\x1f", 1),
			 DBOX_COMPRESSION_NONE);
	assert_int_equal(dbox_detect_compression("BZh9", 4),
			 DBOX_COMPRESSION_BZ2);
	assert_int_equal(dbox_detect_compression("BZh0", 4),
			 DBOX_COMPRESSION_NONE);
	assert_int_equal(dbox_detect_compression("BZh", 3),
			 DBOX_COMPRESSION_NONE);
	assert_int_equal(dbox_detect_compression("\xfd" "7zXZ\0", 6),
			 DBOX_COMPRESSION_XZ);
	assert_int_equal(dbox_detect_compression("\xfd" "7zXZ", 5),
			 DBOX_COMPRESSION_NONE);
	assert_int_equal(dbox_detect_compression("\x28\xb5\x2f\xfd", 4),
			 DBOX_COMPRESSION_ZSTD);
	assert_int_equal(dbox_detect_compression(
				 "Dovecot-LZ4\r\x2a\x9b\xc5\0\0\0\0", 19),
			 DBOX_COMPRESSION_LZ4);
	assert_int_equal(dbox_detect_compression("Dovecot-LZ4\r", 12),
			 DBOX_COMPRESSION_NONE);
	assert_int_equal(dbox_detect_compression("Return-Path: <a>", 16),
			 DBOX_COMPRESSION_NONE);
	assert_int_equal(dbox_detect_compression("", 0),
			 DBOX_COMPRESSION_NONE);
}

/* --- Dovecot-written fixtures ----------------------------------------- */

struct source {
	char mailbox[64];
	char file[128];
};

/* Parse sources.txt ("<mailbox> <file>" per line, save order). */
static unsigned int read_sources(const char *dir, struct source *src,
				 unsigned int max)
{
	char path[512], line[256];
	unsigned int n = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/sources.txt", dir);
	f = fopen(path, "r");
	assert_non_null(f);
	while (n < max && fgets(line, sizeof(line), f) != NULL) {
		assert_int_equal(sscanf(line, "%63s %127s", src[n].mailbox,
					src[n].file), 2);
		n++;
	}
	fclose(f);
	return n;
}

/* Expected fetch entries ("guid:", "size.physical:", "size.virtual:",
   "date.received.unixtime:" per message). */
struct fetched {
	char guid[64];
	unsigned long long physical, virtual_size, received;
};

static unsigned int read_fetch(const char *dir, struct fetched *fe,
			       unsigned int max)
{
	char path[512], line[256];
	unsigned int n = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/expected-fetch.txt", dir);
	f = fopen(path, "r");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f) != NULL) {
		struct fetched *last = n > 0 ? &fe[n - 1] : NULL;

		if (sscanf(line, "guid: %63s", fe[n].guid) == 1)
			assert_true(++n < max);
		else if (last == NULL)
			continue;
		else if (sscanf(line, "size.physical: %llu",
				&last->physical) == 1)
			continue;
		else if (sscanf(line, "size.virtual: %llu",
				&last->virtual_size) == 1)
			continue;
		else
			sscanf(line, "date.received.unixtime: %llu",
			       &last->received);
	}
	fclose(f);
	return n;
}

/* Walk <shared>/fixtures/dovecot-mdbox/<name>/mdbox/storage/m.1 and check
   it against expected-fetch.txt and sources.txt.  Returns the open fd. */
static int check_fixture(const char *name, char *dir, size_t dir_size,
			 struct walk *w, struct source *src)
{
	struct fetched fe[16];
	unsigned int n_fetch, n_src, unmatched = 0;
	char path[600];
	uint64_t bad = 0;
	int fd;

	snprintf(dir, dir_size, "%s/fixtures/dovecot-mdbox/%s",
		 shared_dir(), name);
	snprintf(path, sizeof(path), "%s/mdbox/storage/m.1", dir);
	fd = open(path, O_RDONLY);
	if (fd < 0) {
		print_message("fixture %s missing, skipped\n", path);
		skip();
	}

	w->count = 0;
	assert_int_equal(dbox_file_walk(fd, 1, collect_cb, w, &bad), 0);
	/* 9 saves (the copy shares its record; the expunged one stays). */
	assert_int_equal(w->count, 9);
	assert_int_equal(w->rec[0].offset, 16);
	for (unsigned int i = 1; i < w->count; i++) {
		assert_int_equal(w->rec[i].offset,
				 w->rec[i - 1].offset + w->rec[i - 1].record_size);
	}
	assert_int_equal(w->rec[8].offset + w->rec[8].record_size,
			 file_size(fd));

	n_src = read_sources(dir, src, 16);
	assert_int_equal(n_src, 9);
	n_fetch = read_fetch(dir, fe, 16);
	assert_int_equal(n_fetch, 9);

	for (unsigned int i = 0; i < w->count; i++) {
		const struct dbox_metadata *md = &w->rec[i].md;
		bool found = false;

		assert_int_equal(strlen(md->guid), 32);
		assert_string_equal(md->mailbox, src[i].mailbox);
		assert_true(md->has_vsize);
		for (unsigned int j = 0; j < n_fetch; j++) {
			if (strcmp(fe[j].guid, md->guid) != 0)
				continue;
			found = true;
			assert_int_equal(md->received, fe[j].received);
			assert_int_equal(md->vsize, fe[j].virtual_size);
		}
		if (!found)
			unmatched++;
	}
	/* Only the expunged message is missing from the fetch output, and
	   every fetched GUID is in the file. */
	assert_int_equal(unmatched, 1);
	for (unsigned int j = 0; j < n_fetch; j++) {
		bool found = false;
		for (unsigned int i = 0; i < w->count; i++)
			found = found || strcmp(fe[j].guid, w->rec[i].md.guid) == 0;
		assert_true(found);
	}
	return fd;
}

/* The corpus file a record was saved from (already LF line ends, so it
   is what Dovecot stored). */
static char *source_text(const struct source *src, size_t *len_r)
{
	char path[512];
	char *text;

	snprintf(path, sizeof(path), "%s/corpora/notmuch-lkml/cur/%s",
		 shared_dir(), src->file);
	text = slurp(path, len_r);
	if (text == NULL) {
		print_message("corpus file %s missing, skipped\n", path);
		skip();
	}
	assert_null(memchr(text, '\r', *len_r));
	return text;
}

static void test_fixture_plain(void **state)
{
	(void)state;
	struct walk w;
	struct source src[16];
	char dir[512];
	int fd = check_fixture("plain", dir, sizeof(dir), &w, src);

	for (unsigned int i = 0; i < w.count; i++) {
		const struct record *r = &w.rec[i];
		size_t src_len;
		char *text = source_text(&src[i], &src_len);
		char *body = read_body(fd, r);
		char *plain = read_plain(fd, r, r->body_size, 1000);

		assert_false(r->md.has_plain_size);
		assert_int_equal(dbox_detect_compression(body, r->body_size),
				 DBOX_COMPRESSION_NONE);
		assert_int_equal(r->body_size, src_len);
		assert_memory_equal(body, text, src_len);
		assert_memory_equal(plain, text, src_len);
		assert_int_equal(r->md.vsize, vsize_of(body, r->body_size));
		free(text);
		free(body);
		free(plain);
	}
	walk_free(&w);
	close(fd);
}

/* A compressed fixture: every body is detected as `compression`, carries
   Z, and reads back byte-exact as the corpus file it was saved from, with
   V computed on the plaintext; read in chunks of 1000 and of 100000. */
static void check_compressed_fixture(const char *name,
				     enum dbox_compression compression)
{
	struct walk w;
	struct source src[16];
	char dir[512];
	int fd = check_fixture(name, dir, sizeof(dir), &w, src);

	for (unsigned int i = 0; i < w.count; i++) {
		const struct record *r = &w.rec[i];
		char *body = read_body(fd, r);
		size_t src_len;
		char *text, *plain, *plain2;

		assert_true(r->md.has_plain_size);
		assert_true(r->md.plain_size > r->body_size);
		assert_int_equal(dbox_detect_compression(body, r->body_size),
				 compression);
		plain = read_plain(fd, r, r->md.plain_size, 1000);
		plain2 = read_plain(fd, r, r->md.plain_size, 100000);
		assert_int_equal(r->md.vsize,
				 vsize_of(plain, r->md.plain_size));

		text = source_text(&src[i], &src_len);
		assert_int_equal(r->md.plain_size, src_len);
		assert_memory_equal(plain, text, src_len);
		assert_memory_equal(plain2, text, src_len);
		free(text);
		free(plain);
		free(plain2);
		free(body);
	}
	walk_free(&w);
	close(fd);
}

static void test_fixture_gz(void **state)
{
	(void)state;
	check_compressed_fixture("zlib-gz", DBOX_COMPRESSION_GZ);
}

static void test_fixture_bz2(void **state)
{
	(void)state;
	check_compressed_fixture("zlib-bz2", DBOX_COMPRESSION_BZ2);
}

static void test_fixture_zstd(void **state)
{
	(void)state;
	check_compressed_fixture("zlib-zstd", DBOX_COMPRESSION_ZSTD);
}

static void test_fixture_lz4(void **state)
{
	(void)state;
	check_compressed_fixture("zlib-lz4", DBOX_COMPRESSION_LZ4);
}

/* m.N names: only "m." and a decimal file_id without leading zeros. */
/* Open descriptors of the process, counted in /proc/self/fd. */
static int open_fds(void)
{
	int n = 0, fd = open("/proc/self/fd", O_RDONLY | O_DIRECTORY);
	DIR *d = fdopendir(fd);

	assert_non_null(d);
	while (readdir(d) != NULL)
		n++;
	closedir(d);
	return n;
}

/* The m.N descriptor cache keeps at most max open, closing the least
   recently used; each descriptor reads its own file; a forgotten or
   missing file is not served from the cache. */
static void test_fd_cache_bounded(void **state)
{
	struct tmpdir *t = *state;
	struct dbox_fd_cache cache;
	uint64_t size;
	int base, fd;

	for (uint32_t id = 1; id <= 40; id++) {
		fd = dbox_file_create(t->fd, id, &size);
		assert_true(fd >= 0);
		close(fd);
	}
	base = open_fds();
	dbox_fd_cache_init(&cache, 8);
	for (int round = 0; round < 3; round++) {
		for (uint32_t id = 1; id <= 40; id++) {
			size_t header_len;

			fd = dbox_fd_cache_get(&cache, t->fd, id);
			assert_true(fd >= 0);
			assert_int_equal(dbox_file_read_header(fd, &header_len), 0);
			assert_true(open_fds() <= base + 8);
		}
	}
	/* The most recent one is still cached: the same descriptor. */
	fd = dbox_fd_cache_get(&cache, t->fd, 40);
	assert_int_equal(dbox_fd_cache_get(&cache, t->fd, 40), fd);
	dbox_fd_cache_forget(&cache, 40);
	assert_int_equal(unlinkat(t->fd, "m.40", 0), 0);
	assert_int_equal(dbox_fd_cache_get(&cache, t->fd, 40), -ENOENT);
	dbox_fd_cache_deinit(&cache);
	assert_int_equal(open_fds(), base);
	dbox_fd_cache_deinit(&cache); /* safe twice */
	assert_true(dbox_fd_cache_default_max() >= 8 &&
		    dbox_fd_cache_default_max() <= 1024);
}

static void test_mfile_parse_name(void **state)
{
	static const char *const bad[] = {
		"m.", "m.0", "m.01", "m.4294967296", "m.99999999999999999999",
		"m.1.broken", "m.1.lock", "m.1x", "m.+1", "m.-1", "m. 1",
		"m1", "M.1", "x.1", ".temp.1", "",
	};
	uint32_t id;

	(void)state;
	assert_true(dbox_mfile_parse_name("m.1", &id));
	assert_int_equal(id, 1);
	assert_true(dbox_mfile_parse_name("m.4294967295", &id));
	assert_int_equal(id, 4294967295u);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		id = 7;
		errno = EBADF;
		assert_false(dbox_mfile_parse_name(bad[i], &id));
		assert_int_equal(id, 7);
		assert_int_equal(errno, EBADF);
	}
	errno = EBADF;
	assert_true(dbox_mfile_parse_name("m.120", &id));
	assert_int_equal(id, 120);
	assert_int_equal(errno, EBADF);
}

/* --- appending -------------------------------------------------------- */

static void test_create(void **state)
{
	struct tmpdir *t = *state;
	char name[16], header[64];
	uint64_t size;
	size_t header_len;
	int fd, fd2;
	struct stat st;

	dbox_file_name(name, 4294967295u);
	assert_string_equal(name, "m.4294967295");

	fd = dbox_file_create(t->fd, 12, &size);
	assert_true(fd >= 0);
	assert_int_equal(fstatat(t->fd, "m.12", &st, 0), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	assert_int_equal(st.st_size, size);
	assert_int_equal(pread(fd, header, size, 0), (ssize_t)size);
	assert_memory_equal(header, "2 M1e C", 7);
	assert_int_equal(header[size - 1], '\n');
	assert_int_equal(dbox_file_read_header(fd, &header_len), 0);
	assert_int_equal(header_len, size);

	/* O_EXCL */
	fd2 = dbox_file_create(t->fd, 12, &size);
	assert_int_equal(fd2, -EEXIST);

	/* An empty file is not an m.N. */
	assert_int_equal(ftruncate(fd, 0), 0);
	assert_int_equal(dbox_file_read_header(fd, &header_len), -EIO);

	/* A walk of a header-only file finds nothing. */
	close(fd);
	fd = dbox_file_create(t->fd, 13, &size);
	struct walk w = { .count = 0 };
	assert_int_equal(dbox_file_walk(fd, 13, collect_cb, &w, NULL), 0);
	assert_int_equal(w.count, 0);
	close(fd);
}

static void test_append_two_records(void **state)
{
	struct tmpdir *t = *state;
	static const char body1[] = "Subject: one\n\nhello\nworld\n";
	static const char body2[] = "Subject: two\r\n\r\nno final newline";
	struct dbox_metadata md1 = { .received = 1000,
				     .guid = "00112233445566778899aabbccddeeff" };
	struct dbox_metadata md2 = { .received = 2000, .guid = "g2" };
	uint64_t offset, rec1, rec2;
	struct walk w = { .count = 0 };
	int fd = dbox_file_create(t->fd, 1, &offset);

	assert_true(fd >= 0);
	md1.mailbox = strdup("INBOX");
	md2.extra = strdup("P1\nO2\n");
	rec1 = append_record(fd, &offset, body1, strlen(body1), &md1);
	/* finish filled in vsize by reading the body back */
	assert_true(md1.has_vsize);
	assert_int_equal(md1.vsize, strlen(body1) + 4);
	rec2 = append_record(fd, &offset, body2, strlen(body2), &md2);
	assert_int_equal(md2.vsize, strlen(body2));

	assert_int_equal(dbox_file_walk(fd, 1, collect_cb, &w, NULL), 0);
	assert_int_equal(w.count, 2);
	assert_int_equal(w.rec[0].offset, 16);
	assert_int_equal(w.rec[0].record_size, rec1);
	assert_int_equal(w.rec[1].offset, 16 + rec1);
	assert_int_equal(w.rec[1].record_size, rec2);

	char *b1 = read_body(fd, &w.rec[0]);
	char *b2 = read_body(fd, &w.rec[1]);
	assert_int_equal(w.rec[0].body_size, strlen(body1));
	assert_string_equal(b1, body1);
	assert_int_equal(w.rec[1].body_size, strlen(body2));
	assert_string_equal(b2, body2);
	free(b1);
	free(b2);
	b1 = read_plain(fd, &w.rec[0], strlen(body1), 3);
	assert_string_equal(b1, body1);
	free(b1);

	assert_string_equal(w.rec[0].md.guid, md1.guid);
	assert_string_equal(w.rec[0].md.mailbox, "INBOX");
	assert_int_equal(w.rec[0].md.received, 1000);
	assert_int_equal(w.rec[0].md.vsize, md1.vsize);
	assert_string_equal(w.rec[1].md.guid, "g2");
	assert_null(w.rec[1].md.mailbox);
	assert_string_equal(w.rec[1].md.extra, "P1\nO2\n");

	/* dbox_record_read agrees, and checks the expected size. */
	struct dbox_metadata md;
	uint64_t body_size, record_size;
	assert_int_equal(dbox_record_read(fd, 1, w.rec[1].offset,
					  strlen(body2), &body_size, &md,
					  &record_size), 0);
	assert_int_equal(record_size, rec2);
	assert_string_equal(md.guid, "g2");
	dbox_metadata_clear(&md);
	errors_reset();
	assert_int_equal(dbox_record_read(fd, 1, w.rec[1].offset, 5,
					  &body_size, &md, &record_size), -EIO);
	assert_int_equal(error_count, 1);
	assert_non_null(strstr(last_error, "m.1 offset "));

	/* The exact bytes of the first record. */
	char rec[256];
	static const char expected1[] =
		"\x01\x02N          000000000000001A\n"
		"Subject: one\n\nhello\nworld\n"
		"\n\x01\x03\nR3e8\nV1e\nG00112233445566778899aabbccddeeff\n"
		"BINBOX\n\n";
	assert_int_equal(rec1, sizeof(expected1) - 1);
	assert_int_equal(pread(fd, rec, rec1, 16), (ssize_t)rec1);
	assert_memory_equal(rec, expected1, rec1);

	walk_free(&w);
	dbox_metadata_clear(&md1);
	dbox_metadata_clear(&md2);
	close(fd);
}

/* Walk fd, expect one record and return its body. */
static char *single_body(int fd, uint64_t *len_r)
{
	struct walk w = { .count = 0 };
	char *body;

	assert_int_equal(dbox_file_walk(fd, 1, collect_cb, &w, NULL), 0);
	assert_int_equal(w.count, 1);
	body = read_body(fd, &w.rec[0]);
	*len_r = w.rec[0].body_size;
	assert_int_equal(w.rec[0].md.vsize,
			 vsize_of(body, w.rec[0].body_size));
	walk_free(&w);
	return body;
}

static void test_append_nonsequential(void **state)
{
	struct tmpdir *t = *state;
	struct dbox_append ap;
	struct dbox_metadata md = { .guid = "g" };
	uint64_t offset, len;
	int fd = dbox_file_create(t->fd, 1, &offset);
	char *body;

	/* Out of order, with a hole at [20, 30). */
	assert_int_equal(dbox_append_begin(&ap, fd, offset), 0);
	assert_int_equal(dbox_append_pwrite(&ap, "klmno\n", 6, 30), 0);
	assert_int_equal(ap.body_size, 36);
	assert_int_equal(dbox_append_pwrite(&ap, "0123456789", 10, 0), 0);
	assert_int_equal(dbox_append_pwrite(&ap, "abcdefghij", 10, 10), 0);
	assert_int_equal(dbox_append_pwrite(&ap, "XY", 2, 4), 0);
	assert_int_equal(ap.body_size, 36);
	assert_int_equal(dbox_append_finish(&ap, &md), 0);

	body = single_body(fd, &len);
	assert_int_equal(len, 36);
	assert_memory_equal(body, "0123XY6789abcdefghij\0\0\0\0\0\0\0\0\0\0"
			    "klmno\n", 36);
	free(body);

	/* truncate shrinks and grows with zeros */
	md.has_vsize = false;
	assert_int_equal(dbox_append_truncate(&ap, 8), 0);
	assert_int_equal(dbox_append_truncate(&ap, 12), 0);
	assert_int_equal(dbox_append_finish(&ap, &md), 0);
	body = single_body(fd, &len);
	assert_int_equal(len, 12);
	assert_memory_equal(body, "0123XY67\0\0\0\0", 12);
	free(body);
	dbox_metadata_clear(&md);
	close(fd);
}

/* A second finish whose metadata block is shorter than the first (the
   vsize shrank by a digit: eight LFs counted as CRLF rewritten in place
   as plain bytes) cuts the file at the new block's end: no byte of the
   old block stays after the record.  A first finish leaves the file
   ending at the record too. */
static void test_append_finish_shorter_block(void **state)
{
	struct tmpdir *t = *state;
	struct dbox_append ap;
	struct dbox_metadata md = { .guid = "g" };
	uint64_t offset, first_size;
	struct stat st;
	int fd = dbox_file_create(t->fd, 1, &offset);

	assert_true(fd >= 0);
	assert_int_equal(dbox_append_begin(&ap, fd, offset), 0);
	assert_int_equal(dbox_append_pwrite(&ap, "\n\n\n\n\n\n\n\n", 8, 0), 0);
	assert_int_equal(dbox_append_finish(&ap, &md), 0);
	assert_int_equal(md.vsize, 16);
	first_size = ap.record_size;
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal((uint64_t)st.st_size, offset + first_size);

	md.has_vsize = false;
	assert_int_equal(dbox_append_pwrite(&ap, "abcdefgh", 8, 0), 0);
	assert_int_equal(dbox_append_finish(&ap, &md), 0);
	assert_int_equal(md.vsize, 8);
	assert_true(ap.record_size < first_size);
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal((uint64_t)st.st_size, offset + ap.record_size);
	dbox_metadata_clear(&md);
	close(fd);
}

static void test_append_finish_twice(void **state)
{
	struct tmpdir *t = *state;
	struct dbox_append ap;
	struct dbox_metadata md = { .guid = "g" };
	uint64_t offset, len, first_size;
	int fd = dbox_file_create(t->fd, 1, &offset);
	char *body;

	assert_int_equal(dbox_append_begin(&ap, fd, offset), 0);
	assert_int_equal(dbox_append_pwrite(&ap, "abc\n", 4, 0), 0);
	assert_int_equal(dbox_append_finish(&ap, &md), 0);
	first_size = ap.record_size;
	body = single_body(fd, &len);
	assert_int_equal(len, 4);
	free(body);

	/* Write on at the end: the block is rewritten after the new end. */
	md.has_vsize = false;
	assert_int_equal(dbox_append_pwrite(&ap, "def\n", 4, 4), 0);
	assert_int_equal(dbox_append_finish(&ap, &md), 0);
	assert_int_equal(ap.record_size, first_size + 4);
	assert_int_equal(md.vsize, 10);
	body = single_body(fd, &len);
	assert_int_equal(len, 8);
	assert_memory_equal(body, "abc\ndef\n", 8);
	free(body);

	/* Write past the end after a finish: the gap is zeros, not the old
	   metadata block. */
	md.has_vsize = false;
	assert_int_equal(dbox_append_pwrite(&ap, "Z", 1, 30), 0);
	assert_int_equal(dbox_append_finish(&ap, &md), 0);
	body = single_body(fd, &len);
	assert_int_equal(len, 31);
	assert_memory_equal(body, "abc\ndef\n", 8);
	for (int i = 8; i < 30; i++)
		assert_int_equal(body[i], 0);
	assert_int_equal(body[30], 'Z');
	free(body);

	/* Grow by truncate after a finish: zeros too. */
	md.has_vsize = false;
	assert_int_equal(dbox_append_truncate(&ap, 40), 0);
	assert_int_equal(dbox_append_finish(&ap, &md), 0);
	body = single_body(fd, &len);
	assert_int_equal(len, 40);
	for (int i = 31; i < 40; i++)
		assert_int_equal(body[i], 0);
	free(body);

	/* A caller-set vsize (compressed body) is kept. */
	md.vsize = 12345;
	md.has_vsize = true;
	assert_int_equal(dbox_append_finish(&ap, &md), 0);
	assert_int_equal(md.vsize, 12345);
	dbox_metadata_clear(&md);
	close(fd);
}

static void test_append_abort(void **state)
{
	struct tmpdir *t = *state;
	struct dbox_append ap;
	struct dbox_metadata md = { .guid = "g" };
	uint64_t offset, len;
	int fd = dbox_file_create(t->fd, 1, &offset);
	char *body;

	append_record(fd, &offset, "kept\n", 5, &md);
	assert_int_equal(dbox_append_begin(&ap, fd, offset), 0);
	assert_int_equal(file_size(fd), offset + DBOX_MSG_HEADER_SIZE);
	assert_int_equal(dbox_append_pwrite(&ap, "dropped\n", 8, 0), 0);
	assert_int_equal(dbox_append_abort(&ap), 0);
	assert_int_equal(file_size(fd), offset);

	/* Also after a finish. */
	md.has_vsize = false;
	assert_int_equal(dbox_append_begin(&ap, fd, offset), 0);
	assert_int_equal(dbox_append_pwrite(&ap, "dropped\n", 8, 0), 0);
	assert_int_equal(dbox_append_finish(&ap, &md), 0);
	assert_int_equal(dbox_append_abort(&ap), 0);
	assert_int_equal(file_size(fd), offset);

	body = single_body(fd, &len);
	assert_int_equal(len, 5);
	assert_memory_equal(body, "kept\n", 5);
	free(body);
	dbox_metadata_clear(&md);
	close(fd);
}

static void test_append_efbig(void **state)
{
	struct tmpdir *t = *state;
	struct dbox_append ap;
	struct dbox_metadata md = { .guid = "g" };
	uint64_t offset;
	int fd = dbox_file_create(t->fd, 1, &offset);

	assert_int_equal(dbox_append_begin(&ap, fd, offset), 0);
	/* Nothing may pass file offset 4 GiB - 1. */
	assert_int_equal(dbox_append_pwrite(&ap, "x", 1, UINT32_MAX), -EFBIG);
	assert_int_equal(dbox_append_pwrite(&ap, "x", 1, UINT64_MAX - 1), -EFBIG);
	assert_int_equal(dbox_append_pwrite(&ap, "x", 1,
					    UINT32_MAX - offset - 30), -EFBIG);
	assert_int_equal(dbox_append_truncate(&ap, UINT32_MAX), -EFBIG);
	assert_int_equal(ap.body_size, 0);
	/* The body may reach the limit, but then the metadata cannot. */
	assert_int_equal(dbox_append_truncate(&ap, UINT32_MAX - offset - 30),
			 0);
	md.has_vsize = true;
	assert_int_equal(dbox_append_finish(&ap, &md), -EFBIG);
	assert_int_equal(dbox_append_abort(&ap), 0);
	assert_int_equal(file_size(fd), offset);

	assert_int_equal(dbox_append_begin(&ap, fd, (uint64_t)UINT32_MAX - 10),
			 -EFBIG);
	assert_int_equal(file_size(fd), offset);
	close(fd);
}

/* The error of ftruncate(fd, size) as a negative errno (0 if it works):
   what the kernel says, for the cases the append code passes through. */
static int ftruncate_error(int fd, uint64_t size)
{
	return ftruncate(fd, (off_t)size) < 0 ? -errno : 0;
}

/* Every dbox-file call returns the negative errno of the system call
   that failed, whatever errno held before (storage/dbox-fault.h): a
   record on a read-only descriptor, records read through a write-only
   one, a create in something that is not a directory. */
static void test_errors_negative_errno(void **state)
{
	struct tmpdir *t = *state;
	struct dbox_metadata md = { .guid = "g", .has_vsize = true,
				    .received = 1700000000 };
	struct dbox_append ap;
	uint64_t offset, end, body_size, record_size, bad = 7;
	struct walk w = { .count = 0 };
	size_t header_len;
	int fd = dbox_file_create(t->fd, 1, &offset);
	int ro = openat(t->fd, "m.1", O_RDONLY | O_CLOEXEC);
	int wo = openat(t->fd, "m.1", O_WRONLY | O_CLOEXEC);
	int trunc_err;

	assert_true(fd >= 0 && ro >= 0 && wo >= 0);
	end = offset;
	append_record(fd, &end, "hello\n", 6, &md);

	/* Writes through a read-only descriptor. */
	errno = 0;
	assert_int_equal(dbox_append_begin(&ap, ro, end), -EBADF);
	assert_int_equal(dbox_append_begin(&ap, fd, end), 0);
	ap.fd = ro;
	errno = 0;
	assert_int_equal(dbox_append_pwrite(&ap, "x", 1, 0), -EBADF);
	assert_int_equal(ap.body_size, 0);
	trunc_err = ftruncate_error(ro, end + 40);
	assert_true(trunc_err < 0);
	assert_int_equal(dbox_append_truncate(&ap, 10), trunc_err);
	assert_int_equal(dbox_append_finish(&ap, &md), -EBADF);
	assert_int_equal(dbox_append_abort(&ap), trunc_err);
	ap.fd = fd;
	assert_int_equal(dbox_append_abort(&ap), 0);
	assert_int_equal(file_size(fd), end);
	/* The R rewrite reads, then writes. */
	assert_int_equal(dbox_record_set_received(ro, 1, offset, 1700000001),
			 -EBADF);

	/* Reads through a write-only descriptor: the pread error, not
	   corruption. */
	errno = 0;
	assert_int_equal(dbox_file_read_header(wo, &header_len), -EBADF);
	assert_int_equal(dbox_record_read(wo, 1, offset, 6, &body_size, &md,
					  &record_size), -EBADF);
	assert_int_equal(dbox_file_walk(wo, 1, collect_cb, &w, &bad), -EBADF);
	assert_int_equal(bad, 0);
	assert_int_equal(w.count, 0);
	assert_int_equal(dbox_record_set_received(wo, 1, offset, 1700000001),
			 -EBADF);
	/* Through the right one: a record that is not there is -EIO. */
	assert_int_equal(dbox_record_set_received(fd, 1, offset + 1,
						  1700000001), -EIO);
	assert_int_equal(dbox_record_set_received(fd, 1, offset, 1700000001),
			 0);

	/* A create whose directory is a regular file. */
	assert_int_equal(dbox_file_create(fd, 2, &offset), -ENOTDIR);

	walk_free(&w);
	close(wo);
	close(ro);
	close(fd);
}

/* With the disk full (a tmpfs of a few pages, in a mount namespace of a
   child so nothing is left mounted): a create fails with -ENOSPC and
   leaves no headerless m.N behind, a body write fails with -ENOSPC and
   the record can be dropped.  The child reports the first check that
   failed as its exit status; skipped where mounts are not allowed. */
enum { FULL_OK, FULL_SKIP, FULL_FILL, FULL_CREATE, FULL_LEFT, FULL_CREATE2,
       FULL_BEGIN, FULL_PWRITE, FULL_ABORT };

static int full_disk_child(const char *dir)
{
	static char block[4096];
	struct dbox_append ap;
	uint64_t size;
	int dfd, filler, fd;

	if (unshare(CLONE_NEWNS) < 0 ||
	    mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
	    mount("tmpfs", dir, "tmpfs", 0, "size=64k,mode=0700") < 0)
		return FULL_SKIP;
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	filler = openat(dfd, "filler", O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	if (dfd < 0 || filler < 0)
		return FULL_FILL;
	while (write(filler, block, sizeof(block)) > 0)
		;
	if (errno != ENOSPC)
		return FULL_FILL;
	errno = 0;
	if (dbox_file_create(dfd, 1, &size) != -ENOSPC)
		return FULL_CREATE;
	if (faccessat(dfd, "m.1", F_OK, 0) == 0 || errno != ENOENT)
		return FULL_LEFT;
	/* Room for a header and a record header, not for a body. */
	if (ftruncate(filler, 0) < 0 ||
	    (fd = dbox_file_create(dfd, 2, &size)) < 0)
		return FULL_CREATE2;
	while (write(filler, block, sizeof(block)) > 0)
		;
	if (dbox_append_begin(&ap, fd, size) != 0)
		return FULL_BEGIN;
	errno = 0;
	if (dbox_append_pwrite(&ap, block, sizeof(block), 0) != -ENOSPC)
		return FULL_PWRITE;
	if (dbox_append_abort(&ap) != 0)
		return FULL_ABORT;
	return FULL_OK;
}

static void test_full_disk(void **state)
{
	struct tmpdir *t = *state;
	char dir[128];
	pid_t pid;
	int status;

	snprintf(dir, sizeof(dir), "%s/full", t->path);
	assert_int_equal(mkdir(dir, 0700), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(full_disk_child(dir));
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	if (WEXITSTATUS(status) == FULL_SKIP)
		skip();
	assert_int_equal(WEXITSTATUS(status), FULL_OK);
}

/* --- corrupt files ---------------------------------------------------- */

/* Write buf as m.3 (replacing it) and walk it: expect -1/EIO at bad_at,
   after `good` records, with an error logged naming m.3. */
static void expect_corrupt(struct tmpdir *t, const char *buf, size_t len,
			   unsigned int good, uint64_t bad_at)
{
	struct walk w = { .count = 0 };
	uint64_t bad = UINT64_MAX;
	int fd;

	unlinkat(t->fd, "m.3", 0);
	fd = openat(t->fd, "m.3", O_RDWR | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, buf, len), (ssize_t)len);

	errors_reset();
	assert_int_equal(dbox_file_walk(fd, 3, collect_cb, &w, &bad), -EIO);
	assert_int_equal(w.count, good);
	assert_int_equal(bad, bad_at);
	assert_int_equal(error_count, 1);
	char expect[64];
	snprintf(expect, sizeof(expect), "m.3 offset %llu: ",
		 (unsigned long long)bad_at);
	assert_non_null(strstr(last_error, expect));
	walk_free(&w);
	close(fd);
}

static void test_corrupt_files(void **state)
{
	struct tmpdir *t = *state;
	static const char good[] =
		"2 M1e C6b0c840f\n"
		"\x01\x02N          0000000000000005\nbody\n"
		"\n\x01\x03\nR1\nV6\nGaa\n\n"
		"\x01\x02N          0000000000000003\nxyz"
		"\n\x01\x03\nR2\nV3\nGbb\nBINBOX\n\n";
	const size_t len = sizeof(good) - 1;
	const size_t rec2 = 16 + 30 + 5 + 15; /* offset of record 2 */
	char buf[sizeof(good)];
	size_t header_len;
	struct walk w = { .count = 0 };
	int fd;

	/* The sample is valid. */
	fd = openat(t->fd, "m.2", O_RDWR | O_CREAT | O_EXCL, 0600);
	assert_int_equal(write(fd, good, len), (ssize_t)len);
	assert_int_equal(dbox_file_walk(fd, 2, collect_cb, &w, NULL), 0);
	assert_int_equal(w.count, 2);
	assert_int_equal(w.rec[1].offset, rec2);
	walk_free(&w);
	close(fd);

	/* Every truncation inside a record is corrupt. */
	for (size_t cut = 17; cut < len; cut++) {
		if (cut == rec2)
			continue; /* a clean end after record 1 */
		expect_corrupt(t, good, cut, cut < rec2 ? 0 : 1,
			       cut < rec2 ? 16 : rec2);
	}

	/* Bad magic in the message header of record 2. */
	memcpy(buf, good, len);
	buf[rec2 + 1] = 0x03;
	expect_corrupt(t, buf, len, 1, rec2);

	/* Non-hex in the size field. */
	memcpy(buf, good, len);
	buf[16 + 20] = 'x';
	expect_corrupt(t, buf, len, 0, 16);

	/* Metadata with a lowercase key. */
	memcpy(buf, good, len);
	buf[16 + 30 + 5 + 4] = 'r';
	expect_corrupt(t, buf, len, 0, 16);

	/* Size field one too big: no post magic after the body. */
	memcpy(buf, good, len);
	buf[16 + 28] = '6';
	expect_corrupt(t, buf, len, 0, 16);
	assert_non_null(strstr(last_error, "metadata magic"));

	/* Missing post magic (overwritten). */
	memcpy(buf, good, len);
	buf[rec2 + 30 + 3 + 1] = 'X';
	expect_corrupt(t, buf, len, 1, rec2);

	/* A size so large the body would pass the end of any file. */
	memcpy(buf, good, len);
	memcpy(buf + 16 + 13, "FFFFFFFFFFFFFFF0", 16);
	expect_corrupt(t, buf, len, 0, 16);

	/* Bad file header. */
	memcpy(buf, good, len);
	buf[0] = '1';
	expect_corrupt(t, buf, len, 0, 0);
	memcpy(buf, good, len);
	buf[3] = '2';
	expect_corrupt(t, buf, len, 0, 0);
	expect_corrupt(t, good, 10, 0, 0);

	fd = openat(t->fd, "m.3", O_RDONLY);
	assert_int_equal(dbox_file_read_header(fd, &header_len), -EIO);
	close(fd);
}

/* A callback's non-zero value stops the walk and is returned. */
static int stop_cb(void *ctx, uint64_t offset, uint64_t body_size,
		   const struct dbox_metadata *md, uint64_t record_size)
{
	unsigned int *count = ctx;

	(void)offset, (void)body_size, (void)md, (void)record_size;
	return ++*count == 2 ? 42 : 0;
}

static void test_walk_stop(void **state)
{
	struct tmpdir *t = *state;
	struct dbox_metadata md = { .guid = "g" };
	uint64_t offset;
	unsigned int count = 0;
	int fd = dbox_file_create(t->fd, 1, &offset);

	for (int i = 0; i < 3; i++) {
		md.has_vsize = false;
		append_record(fd, &offset, "x\n", 2, &md);
	}
	assert_int_equal(dbox_file_walk(fd, 1, stop_cb, &count, NULL), 42);
	assert_int_equal(count, 2);
	close(fd);
}

/* --- reading gzip bodies ---------------------------------------------- */

struct gz_file {
	char *text;
	size_t text_len;
	uint8_t *gz;
	size_t gz_len;
	int fd;
	uint64_t body_offset;
};

/* m.1 with a plain record, then a gzip record of ~300 KB of text. */
static void gz_file_make(struct tmpdir *t, struct gz_file *g)
{
	struct dbox_metadata md = { .guid = "g" };
	struct walk w = { .count = 0 };
	uint64_t offset;

	g->text_len = 300 * 1024 + 17;
	g->text = make_text(g->text_len);
	g->gz = gzip(g->text, g->text_len, &g->gz_len);
	assert_true(g->gz_len > 40 * 1024); /* several input chunks */

	g->fd = dbox_file_create(t->fd, 1, &offset);
	append_record(g->fd, &offset, "plain\n", 6, &md);
	md.has_plain_size = true;
	md.plain_size = g->text_len;
	md.has_vsize = true;
	md.vsize = vsize_of(g->text, g->text_len);
	append_record(g->fd, &offset, g->gz, g->gz_len, &md);
	assert_int_equal(md.vsize, vsize_of(g->text, g->text_len));

	assert_int_equal(dbox_file_walk(g->fd, 1, collect_cb, &w, NULL), 0);
	assert_int_equal(w.count, 2);
	assert_int_equal(w.rec[1].body_size, g->gz_len);
	assert_true(w.rec[1].md.has_plain_size);
	assert_int_equal(w.rec[1].md.plain_size, g->text_len);
	g->body_offset = w.rec[1].offset + DBOX_MSG_HEADER_SIZE;
	walk_free(&w);
}

static void gz_file_free(struct gz_file *g)
{
	free(g->text);
	free(g->gz);
	close(g->fd);
}

static void test_gz_sequential(void **state)
{
	struct gz_file g;
	struct dbox_reader *reader;
	char buf[1000];
	uint64_t off = 0;
	ssize_t ret;

	gz_file_make(*state, &g);
	assert_int_equal(dbox_reader_open(g.fd, g.body_offset, g.gz_len,
					  g.text_len, &reader), 0);
	while ((ret = dbox_reader_pread(reader, buf, sizeof(buf), off)) > 0) {
		assert_true(ret == sizeof(buf) ||
			    off + (uint64_t)ret == g.text_len);
		assert_memory_equal(buf, g.text + off, (size_t)ret);
		off += (uint64_t)ret;
	}
	assert_int_equal(ret, 0);
	assert_int_equal(off, g.text_len);
	assert_int_equal(dbox_reader_pread(reader, buf, sizeof(buf),
					   g.text_len + 1000), 0);
	dbox_reader_free(&reader);
	dbox_reader_free(&reader); /* safe on NULL */
	gz_file_free(&g);
}

static void test_gz_random(void **state)
{
	struct gz_file g;
	struct dbox_reader *reader;
	char *buf = malloc(70000);

	gz_file_make(*state, &g);
	assert_int_equal(dbox_reader_open(g.fd, g.body_offset, g.gz_len,
					  g.text_len, &reader), 0);
	for (int i = 0; i < 300; i++) {
		uint64_t off = rng() % (g.text_len + 100);
		size_t len = 1 + rng() % (i % 10 == 0 ? 70000 : 5000);
		size_t expect = off >= g.text_len ? 0 :
			(len < g.text_len - off ? len : g.text_len - off);
		ssize_t ret = dbox_reader_pread(reader, buf, len, off);

		assert_int_equal(ret, (ssize_t)expect);
		assert_memory_equal(buf, g.text + (off < g.text_len ? off : 0),
				    expect);
	}
	/* The same bytes read twice in a row (seek back by len). */
	assert_int_equal(dbox_reader_pread(reader, buf, 10, 5000), 10);
	assert_int_equal(dbox_reader_pread(reader, buf, 10, 5000), 10);
	assert_memory_equal(buf, g.text + 5000, 10);
	dbox_reader_free(&reader);
	free(buf);
	gz_file_free(&g);
}

/* Read all plaintext; expect EIO somewhere and a logged error. */
static void expect_gz_eio(int fd, uint64_t body_offset, uint64_t body_size,
			  uint64_t plain_size, const char *what)
{
	struct dbox_reader *reader;
	char buf[4096];
	uint64_t off = 0;
	ssize_t ret;

	assert_int_equal(dbox_reader_open(fd, body_offset, body_size,
					  plain_size, &reader), 0);
	errors_reset();
	while ((ret = dbox_reader_pread(reader, buf, sizeof(buf), off)) > 0)
		off += (uint64_t)ret;
	assert_int_equal(ret, -DBOX_ECORRUPT);
	assert_int_equal(error_count, 1);
	assert_non_null(strstr(last_error, what));
	/* The reader stays usable: it restarts and fails again. */
	ret = dbox_reader_pread(reader, buf, sizeof(buf), 0);
	assert_true(ret == 4096 || ret == -DBOX_ECORRUPT);
	dbox_reader_free(&reader);
}

static void test_gz_corrupt(void **state)
{
	struct tmpdir *t = *state;
	struct gz_file g;

	gz_file_make(t, &g);
	/* Plaintext size from the index too big / too small. */
	expect_gz_eio(g.fd, g.body_offset, g.gz_len, g.text_len + 1,
		      "stream ends before");
	expect_gz_eio(g.fd, g.body_offset, g.gz_len, g.text_len - 1,
		      "longer than");
	/* Truncated body. */
	expect_gz_eio(g.fd, g.body_offset, g.gz_len - 100, g.text_len,
		      "truncated");
	/* Body past the end of the file. */
	expect_gz_eio(g.fd, g.body_offset, g.gz_len + 1000, g.text_len,
		      "file ends");

	/* Damaged bytes: a data error or at least a CRC mismatch. */
	uint8_t junk[64];
	memset(junk, 0xa5, sizeof(junk));
	assert_int_equal(pwrite(g.fd, junk, sizeof(junk),
				(off_t)(g.body_offset + g.gz_len / 2)),
			 (ssize_t)sizeof(junk));
	expect_gz_eio(g.fd, g.body_offset, g.gz_len, g.text_len,
		      "corrupt gzip stream");
	/* Only the CRC32 in the trailer damaged. */
	assert_int_equal(pwrite(g.fd, g.gz + g.gz_len / 2, sizeof(junk),
				(off_t)(g.body_offset + g.gz_len / 2)),
			 (ssize_t)sizeof(junk));
	uint8_t crc0 = g.gz[g.gz_len - 8] ^ 0xff;
	assert_int_equal(pwrite(g.fd, &crc0, 1,
				(off_t)(g.body_offset + g.gz_len - 8)), 1);
	expect_gz_eio(g.fd, g.body_offset, g.gz_len, g.text_len,
		      "incorrect data check");

	/* Another codec's magic over gzip data: read as bzip2, which it is
	   not. */
	static const char bz[] = "BZh91AY&SY";
	assert_int_equal(pwrite(g.fd, bz, 10, (off_t)g.body_offset), 10);
	expect_gz_eio(g.fd, g.body_offset, g.gz_len, g.text_len,
		      "corrupt bzip2 stream");
	gz_file_free(&g);
}

static void test_plain_reader(void **state)
{
	struct tmpdir *t = *state;
	struct dbox_metadata md = { .guid = "g" };
	struct dbox_reader *reader;
	uint64_t offset, body_offset;
	char buf[16];
	int fd = dbox_file_create(t->fd, 1, &offset);

	body_offset = offset + DBOX_MSG_HEADER_SIZE;
	append_record(fd, &offset, "0123456789", 10, &md);
	assert_int_equal(dbox_reader_open(fd, body_offset, 10, 10, &reader), 0);
	assert_int_equal(dbox_reader_pread(reader, buf, 4, 3), 4);
	assert_memory_equal(buf, "3456", 4);
	assert_int_equal(dbox_reader_pread(reader, buf, 16, 8), 2);
	assert_memory_equal(buf, "89", 2);
	assert_int_equal(dbox_reader_pread(reader, buf, 4, 0), 4);
	assert_memory_equal(buf, "0123", 4);
	assert_int_equal(dbox_reader_pread(reader, buf, 4, 10), 0);
	assert_int_equal(dbox_reader_pread(reader, buf, 0, 0), 0);
	dbox_reader_free(&reader);

	/* The index claims more plaintext than is stored. */
	assert_int_equal(dbox_reader_open(fd, body_offset, 10, 12, &reader), 0);
	errors_reset();
	assert_int_equal(dbox_reader_pread(reader, buf, 16, 0), -DBOX_ECORRUPT);
	assert_int_equal(error_count, 1);
	dbox_reader_free(&reader);

	/* Stored size past the end of the file. */
	assert_int_equal(dbox_reader_open(fd, body_offset, 1000, 1000,
					  &reader), 0);
	errors_reset();
	assert_int_equal(dbox_reader_pread(reader, buf, 16, 990),
			 -DBOX_ECORRUPT);
	assert_int_equal(error_count, 1);
	dbox_reader_free(&reader);
	dbox_metadata_clear(&md);
	close(fd);
}

#define TMP_TEST(f) cmocka_unit_test_setup_teardown(f, tmpdir_setup, \
						    tmpdir_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_file_header),
		cmocka_unit_test(test_msg_header),
		cmocka_unit_test(test_metadata_roundtrip),
		cmocka_unit_test(test_metadata_owner),
		cmocka_unit_test(test_metadata_many_unknown_lines),
		cmocka_unit_test(test_metadata_corrupt),
		cmocka_unit_test(test_vsize),
		cmocka_unit_test(test_guid),
		cmocka_unit_test(test_guid_unique),
		cmocka_unit_test(test_detect_compression),
		cmocka_unit_test(test_fixture_plain),
		cmocka_unit_test(test_fixture_gz),
		cmocka_unit_test(test_fixture_bz2),
		cmocka_unit_test(test_fixture_zstd),
		cmocka_unit_test(test_fixture_lz4),
		cmocka_unit_test(test_mfile_parse_name),
		cmocka_unit_test_setup_teardown(test_fd_cache_bounded, tmpdir_setup,
						tmpdir_teardown),
		TMP_TEST(test_create),
		TMP_TEST(test_append_two_records),
		TMP_TEST(test_append_nonsequential),
		TMP_TEST(test_append_finish_twice),
		TMP_TEST(test_append_finish_shorter_block),
		TMP_TEST(test_append_abort),
		TMP_TEST(test_append_efbig),
		TMP_TEST(test_errors_negative_errno),
		TMP_TEST(test_full_disk),
		TMP_TEST(test_corrupt_files),
		TMP_TEST(test_walk_stop),
		TMP_TEST(test_gz_sequential),
		TMP_TEST(test_gz_random),
		TMP_TEST(test_gz_corrupt),
		TMP_TEST(test_plain_reader),
	};

	dbox_log_set_sink(capture_sink);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
