/*
 * test-safety.c: unit tests (cmocka) of what keeps a store safe from
 * damage: scanning a damaged m.N (storage/dbox-scan.h), salvaging a
 * damaged index (index/index-rebuild.h), the index checks
 * (index/index-check.h), and the recovery of files/ at open
 * (engine/store.c).
 *
 * Each test works in its own mkdtemp() directory, removed in teardown.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "index/index-check.h"
#include "index/index-rebuild.h"
#include "index/index.h"
#include "engine/store.h"
#include "storage/dbox-file.h"
#include "storage/dbox-scan.h"
#include "storage/log.h"
#include "test-common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct fix {
	char dir[64];
	char path[128];
};

static int setup(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	tmpdir_make(f->dir, sizeof(f->dir), "test-safety");
	error_count = 0;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fix *f = *state;

	rm_rf(f->dir);
	free(f);
	return 0;
}

/* --- scanning damaged m.N files ---------------------------------------- */

#define NREC 5

struct recs {
	uint64_t offset[16], size[16];
	char guid[16][33];
	size_t n;
	uint64_t bad_start[16], bad_end[16];
	char bad_reason[16][200];
	size_t nbad;
};

static int rec_cb(void *ctx, uint64_t offset, uint64_t body_size,
		  const struct dbox_metadata *md, uint64_t record_size)
{
	struct recs *r = ctx;

	(void)body_size;
	assert_true(r->n < 16);
	r->offset[r->n] = offset;
	r->size[r->n] = record_size;
	memcpy(r->guid[r->n], md->guid, 32);
	r->guid[r->n][32] = '\0';
	r->n++;
	return 0;
}

static int bad_cb(void *ctx, uint64_t start, uint64_t end,
		  const struct dbox_fault *fault)
{
	struct recs *r = ctx;

	assert_true(r->nbad < 16);
	assert_true(start < end);
	/* What is wrong at the region's start, as data. */
	assert_int_equal(fault->offset, start);
	assert_true(fault->reason[0] != '\0');
	r->bad_start[r->nbad] = start;
	r->bad_end[r->nbad] = end;
	snprintf(r->bad_reason[r->nbad], sizeof(r->bad_reason[0]), "%s",
		 fault->reason);
	r->nbad++;
	return 0;
}

/* An m.1 in dir with NREC records; their offsets and sizes in *r. */
static int make_mfile(const char *dir, struct recs *r)
{
	int dfd = open(dir, O_RDONLY | O_DIRECTORY);
	uint64_t size;
	int fd = dbox_file_create(dfd, 1, &size);

	assert_true(fd >= 0);
	close(dfd);
	memset(r, 0, sizeof(*r));
	for (int i = 0; i < NREC; i++) {
		struct dbox_append ap;
		struct dbox_metadata md = { .received = 1700000000 + i };
		char body[3000];

		memset(body, 'a' + i, sizeof(body));
		/* A body that holds the message header magic, to tempt a
		   resync into it. */
		memcpy(body + 100, "\x01\x02N ", 4);
		snprintf(md.guid, sizeof(md.guid), "%032x", i + 1);
		assert_int_equal(dbox_append_begin(&ap, fd, size), 0);
		assert_int_equal(dbox_append_pwrite(&ap, body, 500 + 400 * i, 0), 0);
		assert_int_equal(dbox_append_finish(&ap, &md), 0);
		r->offset[i] = size;
		r->size[i] = ap.record_size;
		memcpy(r->guid[i], md.guid, 33);
		size += ap.record_size;
	}
	r->n = NREC;
	return fd;
}

static void scan(int fd, uint64_t end, struct recs *got, bool *header_ok)
{
	memset(got, 0, sizeof(*got));
	assert_int_equal(dbox_file_scan(fd, 1, end, rec_cb, bad_cb, got,
					header_ok), 0);
}

static void test_scan_whole_file(void **state)
{
	struct fix *f = *state;
	struct recs want, got;
	bool header_ok = false;
	int fd = make_mfile(f->dir, &want);

	scan(fd, UINT64_MAX, &got, &header_ok);
	assert_true(header_ok);
	assert_int_equal(got.n, NREC);
	assert_int_equal(got.nbad, 0);
	for (size_t i = 0; i < NREC; i++) {
		assert_int_equal(got.offset[i], want.offset[i]);
		assert_int_equal(got.size[i], want.size[i]);
		assert_string_equal(got.guid[i], want.guid[i]);
	}
	/* Up to an end inside record 3: records 0-2 only, nothing bad. */
	scan(fd, want.offset[3] + 10, &got, &header_ok);
	assert_int_equal(got.n, 3);
	assert_int_equal(got.nbad, 1);
	assert_int_equal(got.bad_start[0], want.offset[3]);
	close(fd);
}

static void test_scan_resyncs_after_damage(void **state)
{
	struct fix *f = *state;
	struct recs want, got;
	bool header_ok;
	int fd = make_mfile(f->dir, &want);
	struct stat st;

	/* Record 1: bad magic.  Record 3: metadata garbage.  The file ends
	   inside record 4. */
	assert_int_equal(pwrite(fd, "XX", 2, want.offset[1]), 2);
	assert_int_equal(pwrite(fd, "\0\0", 2, want.offset[3] + want.size[3] - 10), 2);
	assert_int_equal(ftruncate(fd, want.offset[4] + 100), 0);
	error_count = 0;
	scan(fd, UINT64_MAX, &got, &header_ok);
	assert_true(header_ok);
	/* Nothing is logged: what is wrong where each region starts comes
	   as data (the truncated record 4 lies in the region that starts at
	   record 3). */
	assert_int_equal(error_count, 0);
	assert_int_equal(got.n, 2);
	assert_int_equal(got.offset[0], want.offset[0]);
	assert_int_equal(got.offset[1], want.offset[2]);
	assert_string_equal(got.guid[1], want.guid[2]);
	/* The unreadable regions are exactly the damaged records. */
	assert_int_equal(got.nbad, 2);
	assert_int_equal(got.bad_start[0], want.offset[1]);
	assert_int_equal(got.bad_end[0], want.offset[2]);
	assert_int_equal(got.bad_start[1], want.offset[3]);
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(got.bad_end[1], (uint64_t)st.st_size);
	assert_non_null(strstr(got.bad_reason[0], "corrupt message header"));
	assert_non_null(strstr(got.bad_reason[1], "corrupt metadata block"));

	/* A bad file header line: the scan still finds the records. */
	assert_int_equal(pwrite(fd, "9", 1, 0), 1);
	scan(fd, UINT64_MAX, &got, &header_ok);
	assert_false(header_ok);
	assert_int_equal(got.n, 2);
	assert_int_equal(got.bad_start[0], 0);
	assert_int_equal(got.bad_end[0], want.offset[0]);
	assert_string_equal(got.bad_reason[0], "not a dbox v2 file header");
	close(fd);
}

static void test_scan_garbage_ends(void **state)
{
	struct fix *f = *state;
	struct recs got;
	char path[160], buf[65536];
	uint64_t x = 88172645463325252ULL;
	bool header_ok;
	int fd;

	snprintf(path, sizeof(path), "%s/m.1", f->dir);
	fd = open(path, O_RDWR | O_CREAT, 0600);
	assert_true(fd >= 0);
	/* Random bytes, thick with 0x01 0x02 'N' and metadata magics. */
	for (size_t i = 0; i < sizeof(buf); i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		buf[i] = (char)(x % 7 == 0 ? 1 : x % 7 == 1 ? 2 : x % 7 == 2 ?
				'N' : x % 7 == 3 ? '\n' : x >> 24);
	}
	assert_int_equal(write(fd, buf, sizeof(buf)), (ssize_t)sizeof(buf));
	scan(fd, UINT64_MAX, &got, &header_ok);
	assert_false(header_ok);
	assert_int_equal(got.n, 0);
	assert_int_equal(got.nbad, 1);
	assert_int_equal(got.bad_start[0], 0);
	assert_int_equal(got.bad_end[0], sizeof(buf));
	close(fd);
}

/* --- salvaging a damaged index ------------------------------------------ */

static uint64_t add(struct dbox_index *ix, uint64_t parent, const char *name,
		    enum dbox_kind kind)
{
	struct dbox_attr attr;

	assert_int_equal(dbox_index_create(ix, parent, name, strlen(name), kind,
					   (kind == DBOX_KIND_DIR ? S_IFDIR :
					    S_IFREG) | 0600, 0, 0,
					   dbox_now_ns(), &attr), 0);
	if (kind == DBOX_KIND_MESSAGE) {
		struct dbox_msgloc loc = {
			.file_id = 1, .offset = attr.ino * 100,
			.state = DBOX_MSG_COMMITTED,
		};

		snprintf(loc.guid, sizeof(loc.guid), "%032llx",
			 (unsigned long long)attr.ino);
		assert_int_equal(dbox_index_msg_set(ix, attr.ino, &loc), 0);
	}
	return attr.ino;
}

static void problem_cb(void *ctx, const char *text)
{
	(void)text;
	(*(int *)ctx)++;
}

static void test_salvage(void **state)
{
	struct fix *f = *state;
	struct dbox_index *ix;
	struct dbox_salvage *s = NULL;
	uint64_t cur, keep = 0;
	char name[300];
	int problems = 0;

	snprintf(f->path, sizeof(f->path), "%s/index.sqlite", f->dir);
	assert_int_equal(dbox_index_open(f->path, true, &ix), 0);
	assert_int_equal(dbox_index_begin(ix), 0);
	cur = add(ix, DBOX_ROOT_INO, "cur", DBOX_KIND_DIR);
	for (int i = 0; i < 2000; i++) {
		snprintf(name, sizeof(name), "%d.M%06dP1.some-host.example.org:2,S",
			 1700000000 + i, i);
		keep = add(ix, cur, name, DBOX_KIND_MESSAGE);
	}
	assert_int_equal(dbox_index_mfile_set(ix, 1, UINT32_MAX), 0);
	assert_int_equal(dbox_index_commit(ix, true), 0);
	assert_int_equal(dbox_index_check_namespace(ix, problem_cb, &problems), 0);
	assert_int_equal(problems, 0);
	dbox_index_close(&ix);

	assert_int_equal(dbox_index_salvage(f->path, NULL, &s), 0);
	assert_true(s->opened && s->complete);
	assert_int_equal(s->ninodes, 2002);
	assert_int_equal(s->nentries, 2001);
	assert_int_equal(s->nmsgs, 2000);
	assert_int_equal(s->msgs[1999].ino, keep);
	dbox_index_salvage_free(&s);
	assert_null(s);
	/* The salvage left no -wal or -shm behind. */
	snprintf(name, sizeof(name), "%s-wal", f->path);
	assert_int_equal(access(name, F_OK), -1);

	/* Wreck a table leaf page in the middle of the file: part of the
	   rows are read, the salvage says it is not complete.  (SQLite file
	   format: the page size is the big-endian 16-bit number at offset 16
	   of the header; a table b-tree leaf page starts with the byte 13.
	   Looking for one keeps the test independent of which index pages
	   sit where.) */
	{
		struct stat st;
		unsigned char hdr[18], type;
		char junk[4096];
		off_t page_size, page;
		int fd = open(f->path, O_RDWR);

		assert_true(fd >= 0);
		assert_int_equal(fstat(fd, &st), 0);
		assert_int_equal(pread(fd, hdr, sizeof(hdr), 0), (ssize_t)sizeof(hdr));
		page_size = hdr[16] << 8 | hdr[17];
		assert_true(page_size >= 512 && page_size <= (off_t)sizeof(junk));
		for (page = st.st_size / 2 / page_size; ; page++) {
			assert_true((page + 1) * page_size <= st.st_size);
			assert_int_equal(pread(fd, &type, 1, page * page_size), 1);
			if (type == 13)
				break;
		}
		memset(junk, 0x5a, sizeof(junk));
		assert_int_equal(pwrite(fd, junk, page_size, page * page_size),
				 (ssize_t)page_size);
		close(fd);
	}
	error_count = 0;
	assert_int_equal(dbox_index_salvage(f->path, NULL, &s), 0);
	assert_true(s->opened);
	assert_false(s->complete);
	assert_true(error_count >= 1);
	assert_true(s->ninodes + s->nentries + s->nmsgs < 2002 + 2001 + 2000);
	assert_true(s->ninodes + s->nentries + s->nmsgs > 2000);
	dbox_index_salvage_free(&s);

	/* Not an index at all. */
	{
		int fd = open(f->path, O_WRONLY | O_TRUNC);

		assert_int_equal(write(fd, "garbage garbage garbage", 23), 23);
		close(fd);
	}
	assert_int_equal(dbox_index_salvage(f->path, NULL, &s), 0);
	assert_false(s->complete);
	assert_int_equal(s->ninodes + s->nentries + s->nmsgs, 0);
	dbox_index_salvage_free(&s);
}

static void test_check_namespace_finds_damage(void **state)
{
	struct fix *f = *state;
	struct dbox_index *ix;
	struct dbox_attr attr;
	uint64_t cur, a;
	int n, problems = 0;

	snprintf(f->path, sizeof(f->path), "%s/index.sqlite", f->dir);
	assert_int_equal(dbox_index_open(f->path, true, &ix), 0);
	assert_int_equal(dbox_index_begin(ix), 0);
	cur = add(ix, DBOX_ROOT_INO, "cur", DBOX_KIND_DIR);
	a = add(ix, cur, "a", DBOX_KIND_MESSAGE);
	add(ix, cur, "b", DBOX_KIND_MESSAGE);
	/* Break three invariants: a's link count, a name with '/', a
	   message row for a directory. */
	assert_int_equal(dbox_index_getattr(ix, a, &attr), 0);
	assert_int_equal(dbox_index_rebuild_entry(ix, cur, "x/y", 3, a), -EINVAL);
	assert_int_equal(dbox_index_rebuild_entry(ix, cur, "..", 2, a), -EINVAL);
	assert_int_equal(dbox_index_rebuild_entry(ix, cur, "c", 1, a), 0);
	assert_int_equal(dbox_index_msg_set(ix, cur, &(struct dbox_msgloc){
		.file_id = 1, .offset = 5, .state = DBOX_MSG_COMMITTED }), 0);
	assert_int_equal(dbox_index_commit(ix, false), 0);
	n = dbox_index_check_namespace(ix, problem_cb, &problems);
	/* a: 1 link, 2 names; the dir has a message row; m.1 is not in
	   the mfile table (3 records past no committed end). */
	assert_int_equal(n, problems);
	assert_int_equal(problems, 1 + 1 + 3);
	/* The fix: link counts from the names. */
	assert_int_equal(dbox_index_begin(ix), 0);
	assert_int_equal(dbox_index_rebuild_nlinks(ix), 0);
	assert_int_equal(dbox_index_commit(ix, false), 0);
	problems = 0;
	assert_int_equal(dbox_index_check_namespace(ix, problem_cb, &problems), 4);
	dbox_index_close(&ix);
}

/* --- recovery of files/ --------------------------------------------------- */

static void test_recover_stray_backing_files(void **state)
{
	struct fix *f = *state;
	struct dbox_store_settings set = { .create = true };
	struct dbox_store *st = NULL;
	struct dbox_attr attr, next;
	char name[24];
	int fd;

	snprintf(f->path, sizeof(f->path), "%s/store", f->dir);
	assert_int_equal(dbox_store_open(f->path, &set, &st), 0);
	/* A plain file created in a transaction that never commits (the
	   process dies): its backing file stays, its number is free. */
	assert_int_equal(dbox_index_begin(st->index), 0);
	assert_int_equal(dbox_index_create(st->index, DBOX_ROOT_INO, ".state",
					   6, DBOX_KIND_FILE, S_IFREG | 0600, 0,
					   0, dbox_now_ns(), &attr), 0);
	dbox_index_rollback(st->index);
	snprintf(name, sizeof(name), "%llu", (unsigned long long)attr.ino);
	fd = openat(st->files_fd, name, O_CREAT | O_EXCL | O_WRONLY, 0600);
	assert_true(fd >= 0);
	close(fd);
	dbox_store_close(&st);

	/* Empty: removed at the next open; the number serves again. */
	assert_int_equal(dbox_store_open(f->path, &set, &st), 0);
	assert_int_equal(faccessat(st->files_fd, name, F_OK, 0), -1);
	assert_int_equal(dbox_index_begin(st->index), 0);
	assert_int_equal(dbox_index_create(st->index, DBOX_ROOT_INO, ".state",
					   6, DBOX_KIND_FILE, S_IFREG | 0600, 0,
					   0, dbox_now_ns(), &next), 0);
	assert_int_equal(next.ino, attr.ino);
	dbox_index_rollback(st->index);

	/* With bytes (an import batch cut by a crash): kept, and its
	   number is never handed out again. */
	fd = openat(st->files_fd, name, O_CREAT | O_EXCL | O_WRONLY, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "data", 4), 4);
	close(fd);
	dbox_store_close(&st);
	assert_int_equal(dbox_store_open(f->path, &set, &st), 0);
	assert_int_equal(faccessat(st->files_fd, name, F_OK, 0), 0);
	assert_int_equal(dbox_index_begin(st->index), 0);
	assert_int_equal(dbox_index_create(st->index, DBOX_ROOT_INO, ".state",
					   6, DBOX_KIND_FILE, S_IFREG | 0600, 0,
					   0, dbox_now_ns(), &next), 0);
	assert_true(next.ino > attr.ino);
	assert_int_equal(dbox_index_commit(st->index, false), 0);

	/* The backing file of a plain file turned into a message (renamed
	   to a message name), whose removal the crash cut: it goes. */
	assert_int_equal(dbox_index_begin(st->index), 0);
	assert_int_equal(dbox_index_create(st->index, DBOX_ROOT_INO, "msg", 3,
					   DBOX_KIND_MESSAGE, S_IFREG | 0600, 0,
					   0, dbox_now_ns(), &next), 0);
	assert_int_equal(dbox_index_commit(st->index, false), 0);
	snprintf(name, sizeof(name), "%llu", (unsigned long long)next.ino);
	fd = openat(st->files_fd, name, O_CREAT | O_EXCL | O_WRONLY, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "converted", 9), 9);
	close(fd);
	dbox_store_close(&st);
	assert_int_equal(dbox_store_open(f->path, &set, &st), 0);
	assert_int_equal(faccessat(st->files_fd, name, F_OK, 0), -1);
	dbox_store_close(&st);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_scan_whole_file),
		T(test_scan_resyncs_after_damage),
		T(test_scan_garbage_ends),
		T(test_salvage),
		T(test_check_namespace_finds_damage),
		T(test_recover_stray_backing_files),
	};

	/* error_count counts warnings too (damage found and handled). */
	capture_level = DBOX_LOG_WARNING;
	dbox_log_set_sink(capture_sink);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
