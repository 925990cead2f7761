/*
 * test-wal-batch.c: the WAL's writes gathered per transaction
 * (index/wal-batch.h) with cmocka, through real SQLite and the reserve VFS
 * (index/reserve.h) that uses them.  The unix VFS's pwrite/pwrite64/write
 * system calls are replaced (xSetSystemCall) by counting ones that pass
 * the call on, so the tests see each write that reaches the WAL.  One
 * test drives a batch alone over a plain file, for what SQLite cannot
 * show: that a commit is in the file when the write of its page returns.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "index/reserve.h"
#include "index/wal-batch.h"
#include "test-common.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* --- counting the writes that reach a WAL ------------------------------ */

static int wal_writes;           /* write system calls on a *-wal file */
static long wal_write_max;       /* the longest of them, in bytes */
static int wal_fail;             /* so many next WAL writes fail: ENOSPC */

static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static ssize_t (*real_write)(int, const void *, size_t);

/* Count a write of n bytes to fd when fd is a WAL; false when the write
   is to fail with ENOSPC (wal_fail), errno set. */
static bool count(int fd, size_t n)
{
	char link[64], target[PATH_MAX];
	ssize_t len;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	len = readlink(link, target, sizeof(target) - 1);
	if (len < 4 || memcmp(target + len - 4, "-wal", 4) != 0)
		return true;
	if (wal_fail > 0) {
		wal_fail--;
		errno = ENOSPC;
		return false;
	}
	wal_writes++;
	if ((long)n > wal_write_max)
		wal_write_max = (long)n;
	return true;
}

static ssize_t counting_pwrite(int fd, const void *buf, size_t n, off_t off)
{
	if (!count(fd, n))
		return -1;
	return real_pwrite(fd, buf, n, off);
}

static ssize_t counting_pwrite64(int fd, const void *buf, size_t n, off_t off)
{
	if (!count(fd, n))
		return -1;
	return real_pwrite64(fd, buf, n, off);
}

static ssize_t counting_write(int fd, const void *buf, size_t n)
{
	if (!count(fd, n))
		return -1;
	return real_write(fd, buf, n);
}

/* Put the counting system calls under the unix VFS (which the reserve VFS
   passes its files to). */
static void counting_install(void)
{
	sqlite3_vfs *unix_vfs = sqlite3_vfs_find("unix");

	assert_non_null(unix_vfs);
	real_pwrite = (void *)unix_vfs->xGetSystemCall(unix_vfs, "pwrite");
	real_pwrite64 = (void *)unix_vfs->xGetSystemCall(unix_vfs, "pwrite64");
	real_write = (void *)unix_vfs->xGetSystemCall(unix_vfs, "write");
	/* A build has pwrite or pwrite64 (Debian's: pwrite64 only). */
	assert_true(real_pwrite != NULL || real_pwrite64 != NULL);
	assert_non_null(real_write);
	if (real_pwrite != NULL)
		assert_int_equal(unix_vfs->xSetSystemCall(unix_vfs, "pwrite",
			(sqlite3_syscall_ptr)counting_pwrite), SQLITE_OK);
	if (real_pwrite64 != NULL)
		assert_int_equal(unix_vfs->xSetSystemCall(unix_vfs, "pwrite64",
			(sqlite3_syscall_ptr)counting_pwrite64), SQLITE_OK);
	assert_int_equal(unix_vfs->xSetSystemCall(unix_vfs, "write",
		(sqlite3_syscall_ptr)counting_write), SQLITE_OK);
}

/* --- a database through the reserve VFS -------------------------------- */

struct fix {
	char dir[64];
	char db[128];
};

static int fix_setup(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	tmpdir_make(f->dir, sizeof(f->dir), "test-wal-batch");
	snprintf(f->db, sizeof(f->db), "%s/t.sqlite", f->dir);
	*state = f;
	return 0;
}

static int fix_teardown(void **state)
{
	struct fix *f = *state;

	rm_rf(f->dir);
	free(f);
	return 0;
}

static void exec(sqlite3 *db, const char *sql)
{
	char *err = NULL;

	if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK)
		fail_msg("%s: %s", sql, err != NULL ? err : "?");
}

/* Open path as the index does (WAL, synchronous=NORMAL) through vfs (the
   reserve VFS, or NULL for the default one). */
static sqlite3 *db_open(const char *path, const char *vfs)
{
	sqlite3 *db = NULL;

	assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE |
					 SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
					 vfs), SQLITE_OK);
	sqlite3_extended_result_codes(db, 1);
	sqlite3_busy_timeout(db, 5000);
	exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
	     "CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v BLOB);");
	return db;
}

static int64_t query_int(sqlite3 *db, const char *sql)
{
	sqlite3_stmt *st;
	int64_t v;

	assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
	assert_int_equal(sqlite3_step(st), SQLITE_ROW);
	v = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	return v;
}

/* One transaction: row id with a blob of size bytes whose bytes are id's
   (zeroblob, then filled with a statement). */
static void insert_row(sqlite3 *db, int id, int size)
{
	char sql[160];

	snprintf(sql, sizeof(sql), "INSERT INTO t VALUES (%d, "
		 "CAST(replace(hex(zeroblob(%d)), '00', printf('%%02X', %d %% 256)) "
		 "AS TEXT))", id, size / 2 > 0 ? size / 2 : 1, id);
	exec(db, sql);
}

/* The rows 1..n are all there, each with its own bytes. */
static void check_rows(sqlite3 *db, int n)
{
	char sql[160];

	assert_int_equal(query_int(db, "SELECT count(*) FROM t"), n);
	assert_int_equal(query_int(db, "SELECT coalesce(sum(id), 0) FROM t"),
			 (int64_t)n * (n + 1) / 2);
	snprintf(sql, sizeof(sql), "SELECT count(*) FROM t WHERE "
		 "v != replace(hex(zeroblob(length(v) / 2)), '00', "
		 "printf('%%02X', id %% 256))");
	assert_int_equal(query_int(db, sql), 0);
}

static void integrity_ok(sqlite3 *db)
{
	sqlite3_stmt *st;

	assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1,
					    &st, NULL), SQLITE_OK);
	assert_int_equal(sqlite3_step(st), SQLITE_ROW);
	assert_string_equal((const char *)sqlite3_column_text(st, 0), "ok");
	sqlite3_finalize(st);
}

/* --- the batch alone, over a plain file -------------------------------- */

struct plain {
	int fd;
	int writes;      /* calls of plain_write */
	bool fail;       /* plain_write answers SQLITE_IOERR_WRITE */
};

/* wal_batch_write_fn over a plain file descriptor. */
static int plain_write(void *ctx, const void *buf, int n, sqlite3_int64 off)
{
	struct plain *p = ctx;

	p->writes++;
	if (p->fail)
		return SQLITE_IOERR_WRITE;
	return pwrite(p->fd, buf, (size_t)n, off) == n ? SQLITE_OK :
		SQLITE_IOERR_WRITE;
}

static off_t fd_size(int fd)
{
	struct stat sb;

	assert_int_equal(fstat(fd, &sb), 0);
	return sb.st_size;
}

/* Frame header of page pgno; commit: the database's size after it. */
static void frame_header(unsigned char *hdr, uint32_t pgno, uint32_t commit)
{
	memset(hdr, 0xa5, WAL_FRAME_HEADER);
	for (int i = 0; i < 4; i++) {
		hdr[i] = (unsigned char)(pgno >> (24 - 8 * i));
		hdr[4 + i] = (unsigned char)(commit >> (24 - 8 * i));
	}
}

/* A commit frame's page is in the file when its write returns, with the
   frames before it, in one write; frames before a commit are held; a
   rewritten header goes out at once; a failed commit drops the batch,
   a failed write of other frames keeps them. */
static void test_commit_reaches_file_on_return(void **state)
{
	struct fix *f = *state;
	enum { PAGE = 4096, FRAME = WAL_FRAME_HEADER + PAGE };
	static unsigned char page[PAGE];
	unsigned char hdr[WAL_FRAME_HEADER], whdr[32] = { 0x37 };
	struct plain p = { .fd = -1 };
	struct wal_batch b;
	char path[160];

	snprintf(path, sizeof(path), "%s/plain-wal", f->dir);
	p.fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	assert_true(p.fd >= 0);
	wal_batch_init(&b, plain_write, &p);

	/* The WAL header: nothing to append to, written at once. */
	assert_int_equal(wal_batch_write(&b, whdr, 32, 0), SQLITE_OK);
	assert_int_equal(fd_size(p.fd), 32);
	/* Two frames of a transaction: held. */
	for (uint32_t i = 0; i < 2; i++) {
		frame_header(hdr, i + 1, 0);
		assert_int_equal(wal_batch_write(&b, hdr, WAL_FRAME_HEADER,
						 32 + i * FRAME), SQLITE_OK);
		assert_int_equal(wal_batch_write(&b, page, PAGE,
						 32 + i * FRAME + WAL_FRAME_HEADER),
				 SQLITE_OK);
	}
	assert_int_equal(fd_size(p.fd), 32);
	/* The commit frame: its header held, its page writes all three. */
	frame_header(hdr, 3, 3);
	assert_int_equal(wal_batch_write(&b, hdr, WAL_FRAME_HEADER,
					 32 + 2 * FRAME), SQLITE_OK);
	assert_int_equal(fd_size(p.fd), 32);
	assert_int_equal(wal_batch_write(&b, page, PAGE,
					 32 + 2 * FRAME + WAL_FRAME_HEADER),
			 SQLITE_OK);
	assert_int_equal(fd_size(p.fd), 32 + 3 * FRAME);
	assert_int_equal(p.writes, 2);
	/* SQLite rewriting the commit frame's header (new checksums): at
	   once, though no page follows. */
	assert_int_equal(wal_batch_write(&b, hdr, WAL_FRAME_HEADER,
					 32 + 2 * FRAME), SQLITE_OK);
	assert_int_equal(p.writes, 3);
	/* A failed write: its error, and nothing held afterwards. */
	frame_header(hdr, 4, 0);
	assert_int_equal(wal_batch_write(&b, hdr, WAL_FRAME_HEADER,
					 32 + 3 * FRAME), SQLITE_OK);
	assert_int_equal(wal_batch_write(&b, page, PAGE,
					 32 + 3 * FRAME + WAL_FRAME_HEADER), SQLITE_OK);
	p.fail = true;
	frame_header(hdr, 5, 5);
	assert_int_equal(wal_batch_write(&b, hdr, WAL_FRAME_HEADER,
					 32 + 4 * FRAME), SQLITE_OK);
	assert_int_equal(wal_batch_write(&b, page, PAGE,
					 32 + 4 * FRAME + WAL_FRAME_HEADER),
			 SQLITE_IOERR_WRITE);
	p.fail = false;
	assert_int_equal(wal_batch_flush(&b), SQLITE_OK);
	/* Frame 4's header went out at once (it did not follow the rewrite);
	   its page and frame 5 were dropped. */
	assert_int_equal(fd_size(p.fd), 32 + 3 * FRAME + WAL_FRAME_HEADER);
	/* A failed write of frames that are not a commit keeps them (SQLite
	   took them as written): the next flush writes them. */
	frame_header(hdr, 4, 0);
	assert_int_equal(wal_batch_write(&b, hdr, WAL_FRAME_HEADER,
					 32 + 3 * FRAME), SQLITE_OK);
	assert_int_equal(wal_batch_write(&b, page, PAGE,
					 32 + 3 * FRAME + WAL_FRAME_HEADER), SQLITE_OK);
	p.fail = true;
	assert_int_equal(wal_batch_flush(&b), SQLITE_IOERR_WRITE);
	p.fail = false;
	assert_int_equal(fd_size(p.fd), 32 + 3 * FRAME + WAL_FRAME_HEADER);
	assert_int_equal(wal_batch_flush(&b), SQLITE_OK);
	assert_int_equal(fd_size(p.fd), 32 + 4 * FRAME);
	wal_batch_free(&b);
	close(p.fd);
}

/* --- tests through SQLite ---------------------------------------------- */

/* Many small transactions, then a new connection reads them all back. */
static void test_many_transactions_read_back(void **state)
{
	struct fix *f = *state;
	sqlite3 *db = db_open(f->db, dbox_reserve_vfs());

	for (int i = 1; i <= 400; i++)
		insert_row(db, i, 100 + (i * 37) % 3000);
	check_rows(db, 400);
	assert_int_equal(sqlite3_close(db), SQLITE_OK);

	db = db_open(f->db, NULL);
	check_rows(db, 400);
	integrity_ok(db);
	assert_int_equal(sqlite3_close(db), SQLITE_OK);
}

/* One transaction of many times the batch's size: it reaches the file in
   several writes, none bigger than the cap, and reads back whole. */
static void test_transaction_bigger_than_cap(void **state)
{
	struct fix *f = *state;
	sqlite3 *db = db_open(f->db, dbox_reserve_vfs());

	exec(db, "PRAGMA wal_autocheckpoint=0");
	wal_writes = 0;
	wal_write_max = 0;
	exec(db, "BEGIN");
	for (int i = 1; i <= 40; i++)
		insert_row(db, i, 20000);
	exec(db, "COMMIT");
	/* 800 KB of rows: at least 800 KB / WAL_BATCH_CAP writes. */
	assert_true(wal_writes >= 800000 / WAL_BATCH_CAP);
	assert_true(wal_write_max <= WAL_BATCH_CAP);
	assert_int_equal(sqlite3_close(db), SQLITE_OK);

	db = db_open(f->db, NULL);
	check_rows(db, 40);
	integrity_ok(db);
	assert_int_equal(sqlite3_close(db), SQLITE_OK);
}

/* A process killed right after its commits (no close, no checkpoint)
   leaves a WAL from which another process reads every one of them. */
static void test_killed_after_commit(void **state)
{
	struct fix *f = *state;
	const int n = 60;
	sqlite3 *db;
	pid_t pid;
	int status;

	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		sqlite3 *cdb = NULL;

		if (sqlite3_open_v2(f->db, &cdb, SQLITE_OPEN_READWRITE |
				    SQLITE_OPEN_CREATE, dbox_reserve_vfs()) != SQLITE_OK ||
		    sqlite3_exec(cdb, "PRAGMA journal_mode=WAL;"
				 "PRAGMA synchronous=NORMAL;"
				 "PRAGMA wal_autocheckpoint=0;"
				 "CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB);",
				 NULL, NULL, NULL) != SQLITE_OK)
			_exit(2);
		for (int i = 1; i <= n; i++) {
			char sql[160];

			snprintf(sql, sizeof(sql), "INSERT INTO t VALUES (%d, "
				 "CAST(replace(hex(zeroblob(%d)), '00', "
				 "printf('%%02X', %d %% 256)) AS TEXT))",
				 i, 500 + i * 41, i);
			if (sqlite3_exec(cdb, sql, NULL, NULL, NULL) != SQLITE_OK)
				_exit(3);
		}
		kill(getpid(), SIGKILL);
		_exit(4);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFSIGNALED(status));
	assert_int_equal(WTERMSIG(status), SIGKILL);

	db = db_open(f->db, NULL);
	check_rows(db, n);
	integrity_ok(db);
	assert_int_equal(sqlite3_close(db), SQLITE_OK);
}

/* A second connection (another file object of the WAL, through the
   default VFS) sees each commit as soon as it returns. */
static void test_reader_sees_each_commit(void **state)
{
	struct fix *f = *state;
	sqlite3 *w = db_open(f->db, dbox_reserve_vfs());
	sqlite3 *r = db_open(f->db, NULL);

	exec(w, "PRAGMA wal_autocheckpoint=0");
	for (int i = 1; i <= 100; i++) {
		exec(w, "BEGIN");
		insert_row(w, i, 200 + i * 53);
		exec(w, "COMMIT");
		check_rows(r, i);
	}
	assert_int_equal(sqlite3_close(r), SQLITE_OK);
	assert_int_equal(sqlite3_close(w), SQLITE_OK);
}

/* The WAL gets one write per transaction where SQLite alone makes two per
   frame (its header and its page). */
static void test_fewer_writes_than_frames(void **state)
{
	struct fix *f = *state;
	const int txns = 50;
	struct stat sb;
	char wal[160];
	long frames;
	sqlite3 *db = db_open(f->db, dbox_reserve_vfs());

	/* No checkpoint: the WAL only grows, one frame after the other. */
	exec(db, "PRAGMA wal_autocheckpoint=0");
	insert_row(db, 1, 10);
	wal_writes = 0;
	for (int i = 2; i <= txns + 1; i++)
		insert_row(db, i, 3000 + i);
	snprintf(wal, sizeof(wal), "%s-wal", f->db);
	assert_int_equal(stat(wal, &sb), 0);
	frames = (long)(sb.st_size - 32) /
		(WAL_FRAME_HEADER + query_int(db, "PRAGMA page_size"));
	print_message("%d transactions, %ld frames in all, %d WAL writes\n",
		      txns, frames, wal_writes);
	assert_true(frames > txns);
	assert_int_equal(wal_writes, txns);
	assert_int_equal(sqlite3_close(db), SQLITE_OK);
}

/* A transaction that spilled frames into the WAL and rolled back leaves
   nothing that lands later over another connection's commit. */
static void test_rolled_back_spill(void **state)
{
	struct fix *f = *state;
	sqlite3 *a = db_open(f->db, dbox_reserve_vfs());
	sqlite3 *b = db_open(f->db, dbox_reserve_vfs());
	sqlite3 *r;

	exec(a, "PRAGMA wal_autocheckpoint=0; PRAGMA cache_size=10");
	exec(b, "PRAGMA wal_autocheckpoint=0");
	insert_row(a, 1, 10);
	/* More pages than a's cache: frames spill before the commit. */
	exec(a, "BEGIN");
	for (int i = 1000; i < 1030; i++)
		insert_row(a, i, 3000);
	exec(a, "ROLLBACK");
	for (int i = 2; i <= 30; i++)
		insert_row(b, i, 1000 + i);
	/* a writes again (somewhere after b's frames). */
	insert_row(a, 31, 10);
	assert_int_equal(sqlite3_close(a), SQLITE_OK);
	assert_int_equal(sqlite3_close(b), SQLITE_OK);

	r = db_open(f->db, NULL);
	integrity_ok(r);
	check_rows(r, 31);
	assert_int_equal(sqlite3_close(r), SQLITE_OK);
}

/* A write that fails when SQLite reads its WAL in the middle of a
   transaction (the read writes the frames spilled before it) must not
   lose those frames: a statement that fails with a full disk rolls back
   only itself, and the transaction's COMMIT then relies on them. */
static void test_failed_flush_keeps_spilled_frames(void **state)
{
	struct fix *f = *state;
	sqlite3 *db = db_open(f->db, dbox_reserve_vfs());
	int rc, committed;

	exec(db, "PRAGMA wal_autocheckpoint=0; PRAGMA cache_size=10;"
	     "CREATE TABLE u (id INTEGER PRIMARY KEY, k TEXT UNIQUE, v BLOB)");
	insert_row(db, 1, 10);
	/* More pages than the cache: they spill into the WAL's batch. */
	exec(db, "BEGIN");
	for (int i = 2; i <= 21; i++)
		insert_row(db, i, 3000);
	/* Reading the spilled pages back writes the batch: the disk is full
	   for that write.  A statement with a UNIQUE column rolls back only
	   itself. */
	wal_fail = 1;
	rc = sqlite3_exec(db, "INSERT INTO u SELECT id, 'k' || id, v FROM t",
			  NULL, NULL, NULL);
	print_message("INSERT ... SELECT: %s, %d write(s) left to fail\n",
		      sqlite3_errstr(rc), wal_fail);
	assert_int_equal(rc & 0xff, SQLITE_FULL);
	assert_int_equal(wal_fail, 0);
	wal_fail = 0;
	/* The transaction is still open; its COMMIT either fails or keeps
	   every row. */
	assert_int_equal(sqlite3_get_autocommit(db), 0);
	committed = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) == SQLITE_OK;
	print_message("COMMIT %s\n", committed ? "done" : "failed");
	if (!committed)
		exec(db, "ROLLBACK");
	check_rows(db, committed ? 21 : 1);
	integrity_ok(db);
	assert_int_equal(sqlite3_close(db), SQLITE_OK);

	db = db_open(f->db, NULL);
	integrity_ok(db);
	check_rows(db, committed ? 21 : 1);
	assert_int_equal(sqlite3_close(db), SQLITE_OK);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_commit_reaches_file_on_return,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_many_transactions_read_back,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_transaction_bigger_than_cap,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_killed_after_commit,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_reader_sees_each_commit,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_fewer_writes_than_frames,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_rolled_back_spill,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_failed_flush_keeps_spilled_frames,
						fix_setup, fix_teardown),
	};

	dbox_log_set_sink(capture_sink);
	counting_install();
	assert_non_null(dbox_reserve_vfs());
	return cmocka_run_group_tests(tests, NULL, NULL);
}
