/*
 * test-check.c: unit tests of the store check (engine/check.h) with
 * cmocka, on real stores made in mkdtemp() directories and damaged the
 * way disks and crashes damage them.  Every assertion is on the items the
 * check hands back (kind, m.N, offset, inode, reason), never on log
 * output: a clean store reports nothing; a damaged record header, a
 * damaged metadata block, a changed GUID, an index row past the end of
 * its m.N and a lost+found copy are each reported as what they are; the
 * store lock decides between the offline check and the one-snapshot
 * check of a mounted store.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "engine/check.h"
#include "engine/namespace.h"
#include "engine/purge.h"
#include "engine/store-layout.h"
#include "engine/store.h"
#include "index/index.h"
#include "storage/dbox-fault.h"
#include "storage/log.h"
#include "test-common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define NMSG 3
#define MAX_ITEMS 64

struct msg {
	uint64_t ino;
	struct dbox_msgloc loc;
};

struct fix {
	char dir[64];
	char store[128];
	char mfile[192];       /* STORE/storage/m.N of the messages */
	struct msg msgs[NMSG];
};

/* The items of one check, copied. */
struct got {
	size_t n;
	struct dbox_check_item item[MAX_ITEMS];
	char text[MAX_ITEMS][512];
	char reason[MAX_ITEMS][256];
	uint64_t progress_records;
	struct dbox_check_summary sum;
};

static void report_cb(void *ctx, const struct dbox_check_item *item)
{
	struct got *g = ctx;

	assert_true(g->n < MAX_ITEMS);
	assert_non_null(item->text);
	assert_non_null(item->reason);
	g->item[g->n] = *item;
	snprintf(g->text[g->n], sizeof(g->text[0]), "%s", item->text);
	snprintf(g->reason[g->n], sizeof(g->reason[0]), "%s", item->reason);
	g->item[g->n].text = g->text[g->n];
	g->item[g->n].reason = g->reason[g->n];
	g->n++;
}

static void progress_cb(void *ctx, uint64_t records, uint64_t bytes)
{
	struct got *g = ctx;

	assert_true(bytes > 0);
	g->progress_records += records;
}

/* Check f's store into *g; returns what dbox_check_store did. */
static int run_check(const struct fix *f, struct got *g)
{
	memset(g, 0, sizeof(*g));
	return dbox_check_store(f->store, report_cb, progress_cb, g, &g->sum);
}

/* The first item of severity and kind, or NULL. */
static const struct dbox_check_item *find(const struct got *g,
					  enum dbox_check_severity severity,
					  enum dbox_check_kind kind)
{
	for (size_t i = 0; i < g->n; i++)
		if (g->item[i].severity == severity && g->item[i].kind == kind)
			return &g->item[i];
	return NULL;
}

/* The first problem of kind about message m: it must be there, naming
   m's inode, m.N and record offset. */
static const struct dbox_check_item *expect_msg(const struct got *g,
						enum dbox_check_kind kind,
						const struct msg *m)
{
	const struct dbox_check_item *it = find(g, DBOX_CHECK_PROBLEM, kind);

	assert_non_null(it);
	assert_int_equal(it->ino, m->ino);
	assert_int_equal(it->file_id, m->loc.file_id);
	assert_int_equal(it->offset, m->loc.offset);
	return it;
}

static void save_msg(struct dbox_store *st, uint64_t dir, unsigned int i,
		     struct msg *m)
{
	struct dbox_save *save = NULL;
	struct dbox_attr attr;
	char name[32], body[300];
	int len = snprintf(body, sizeof(body), "From: t@example.org\r\n"
			   "Subject: %u\r\n\r\nbody of message %u\r\n", i, i);

	snprintf(name, sizeof(name), "%u.M%uP1.host:2,S", i, i);
	dbox_store_mutex_lock(st);
	assert_int_equal(dbox_index_begin(st->index), 0);
	assert_int_equal(dbox_index_create(st->index, dir, name, strlen(name),
					   DBOX_KIND_MESSAGE, S_IFREG | 0600,
					   getuid(), getgid(), dbox_now_ns(),
					   &attr), 0);
	m->ino = attr.ino;
	assert_int_equal(dbox_save_begin(st, m->ino, "INBOX", &save), 0);
	assert_int_equal(dbox_save_write(save, body, (size_t)len, 0), 0);
	assert_int_equal(dbox_save_finish(save, 1600000000, false, &m->loc), 0);
	attr.size = (uint64_t)len;
	assert_int_equal(dbox_index_setattr(st->index, &attr), 0);
	assert_int_equal(dbox_index_commit(st->index, false), 0);
	dbox_save_free(&save);
	dbox_store_mutex_unlock(st);
}

/* A store with NMSG messages in cur/, all in one m.N, closed again. */
static int fix_setup(void **state)
{
	struct dbox_store_settings set = { .create = true };
	struct fix *f = calloc(1, sizeof(*f));
	struct dbox_store *st = NULL;
	struct dbox_attr attr;

	assert_non_null(f);
	dbox_log_set_sink(capture_sink);
	tmpdir_make(f->dir, sizeof(f->dir), "test-check");
	snprintf(f->store, sizeof(f->store), "%s/store", f->dir);
	assert_int_equal(dbox_store_open(f->store, &set, &st), 0);
	assert_int_equal(dbox_index_begin(st->index), 0);
	assert_int_equal(dbox_index_create(st->index, DBOX_ROOT_INO, "cur", 3,
					   DBOX_KIND_DIR, S_IFDIR | 0700,
					   getuid(), getgid(), dbox_now_ns(),
					   &attr), 0);
	assert_int_equal(dbox_index_commit(st->index, false), 0);
	for (unsigned int i = 0; i < NMSG; i++)
		save_msg(st, attr.ino, i, &f->msgs[i]);
	dbox_store_close(&st);
	for (unsigned int i = 1; i < NMSG; i++)
		assert_int_equal(f->msgs[i].loc.file_id, f->msgs[0].loc.file_id);
	snprintf(f->mfile, sizeof(f->mfile), "%s/%s/m.%u", f->store,
		 DBOX_STORE_STORAGE, f->msgs[0].loc.file_id);
	errors_reset();
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

/* Overwrite len bytes at off of f's m.N. */
static void damage(const struct fix *f, uint64_t off, const void *bytes,
		   size_t len)
{
	int fd = open(f->mfile, O_WRONLY);

	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, bytes, len, (off_t)off), (ssize_t)len);
	close(fd);
}

/* Where in f's m.N the metadata line "<key>..." of message m starts. */
static uint64_t meta_line_at(const struct fix *f, const struct msg *m,
			     char key)
{
	char buf[4096], want[3] = { '\n', key, '\0' };
	int fd = open(f->mfile, O_RDONLY);
	ssize_t n;
	char *hit;

	assert_true(fd >= 0);
	n = pread(fd, buf, sizeof(buf) - 1, (off_t)m->loc.offset);
	close(fd);
	assert_true(n > 0);
	buf[n] = '\0';
	/* After the body: the metadata magic ends with '\n'. */
	hit = strstr(buf + 30 + m->loc.body_size, want);
	assert_non_null(hit);
	return m->loc.offset + (uint64_t)(hit - buf) + 1;
}

/* --- tests ------------------------------------------------------------- */

static void test_clean_store_reports_nothing(void **state)
{
	struct fix *f = *state;
	struct got g;

	assert_int_equal(run_check(f, &g), 0);
	for (size_t i = 0; i < g.n; i++)
		print_message("unexpected: %s\n", g.text[i]);
	assert_int_equal(g.n, 0);
	assert_true(g.sum.opened);
	assert_false(g.sum.mounted);
	assert_int_equal(g.sum.problems, 0);
	assert_int_equal(g.sum.notes, 0);
	assert_int_equal(g.sum.messages, NMSG);
	assert_int_equal(g.sum.records, NMSG);
	assert_int_equal(g.progress_records, NMSG);
	assert_int_equal(g.sum.mfiles, 1);
	/* Nothing printed or logged on the way. */
	assert_int_equal(error_count, 0);
}

static void test_damaged_record_header(void **state)
{
	struct fix *f = *state;
	const struct msg *m = &f->msgs[1];
	const struct dbox_check_item *it;
	struct got g;

	damage(f, m->loc.offset, "XX", 2); /* the 0x01 0x02 magic */
	assert_int_equal(run_check(f, &g), 0);
	assert_true(g.sum.problems >= 1);
	it = expect_msg(&g, DBOX_CHECK_MESSAGE, m);
	assert_non_null(strstr(it->reason, "corrupt message header"));
	assert_non_null(strstr(it->text, "the record is damaged"));
	/* The bytes themselves: one region, starting at the record. */
	it = find(&g, DBOX_CHECK_PROBLEM, DBOX_CHECK_REGION);
	assert_non_null(it);
	assert_int_equal(it->offset, m->loc.offset);
	assert_int_equal(it->end, f->msgs[2].loc.offset);
	assert_non_null(strstr(it->reason, "corrupt message header"));
	/* The other messages are whole. */
	assert_int_equal(g.sum.records, NMSG - 1);
	assert_int_equal(error_count, 0);
}

static void test_damaged_metadata(void **state)
{
	struct fix *f = *state;
	const struct msg *m = &f->msgs[0];
	const struct dbox_check_item *it;
	struct got g;

	/* A key that is no uppercase letter: the block is corrupt. */
	damage(f, meta_line_at(f, m, 'G'), "g", 1);
	assert_int_equal(run_check(f, &g), 0);
	it = expect_msg(&g, DBOX_CHECK_MESSAGE, m);
	assert_non_null(strstr(it->reason, "corrupt metadata block"));
	assert_int_equal(error_count, 0);
}

static void test_changed_guid(void **state)
{
	struct fix *f = *state;
	const struct msg *m = &f->msgs[2];
	const struct dbox_check_item *it;
	struct got g;
	char other = m->loc.guid[0] == '0' ? '1' : '0';

	/* Still a well-formed record, but not the message the index knows. */
	damage(f, meta_line_at(f, m, 'G') + 1, &other, 1);
	assert_int_equal(run_check(f, &g), 0);
	assert_int_equal(g.sum.problems, 1);
	assert_int_equal(g.sum.records, NMSG);
	it = expect_msg(&g, DBOX_CHECK_MESSAGE, m);
	assert_non_null(strstr(it->text, "GUID"));
	assert_non_null(strstr(it->text, m->loc.guid));
}

static void test_index_row_past_file_end(void **state)
{
	struct fix *f = *state;
	const struct msg *m = &f->msgs[2];
	const struct dbox_check_item *it;
	struct got g;

	assert_int_equal(truncate(f->mfile, (off_t)m->loc.offset), 0);
	assert_int_equal(run_check(f, &g), 0);
	it = expect_msg(&g, DBOX_CHECK_MESSAGE, m);
	assert_non_null(strstr(it->text, "past the end of the file"));
	/* And the file itself is shorter than the index says. */
	it = find(&g, DBOX_CHECK_PROBLEM, DBOX_CHECK_MFILE);
	assert_non_null(it);
	assert_int_equal(it->file_id, m->loc.file_id);
	assert_non_null(strstr(it->text, "shorter than its committed end"));
	assert_int_equal(g.sum.records, NMSG - 1);
}

static void test_lost_found_copy_is_a_note(void **state)
{
	struct fix *f = *state;
	const struct dbox_check_item *it;
	char path[256];
	struct got g;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", f->store, DBOX_STORE_LOST_FOUND);
	assert_true(mkdir(path, 0700) == 0 || errno == EEXIST);
	snprintf(path, sizeof(path), "%s/%s/m.1.cut", f->store,
		 DBOX_STORE_LOST_FOUND);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "0123456789", 10), 10);
	close(fd);
	assert_int_equal(run_check(f, &g), 0);
	assert_int_equal(g.sum.problems, 0);
	assert_int_equal(g.sum.notes, 1);
	it = find(&g, DBOX_CHECK_NOTE, DBOX_CHECK_LOST_FOUND);
	assert_non_null(it);
	assert_non_null(strstr(it->text, "m.1.cut"));
	assert_non_null(strstr(it->text, "10 bytes"));
}

static void test_stale_lock_file_is_offline(void **state)
{
	struct fix *f = *state;
	char path[256];
	struct got g;
	int fd;

	/* A crash leaves the text of a holder long gone, and no flock. */
	snprintf(path, sizeof(path), "%s/%s", f->store, DBOX_STORE_LOCK);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "999999999\n", 10), 10);
	close(fd);
	assert_int_equal(run_check(f, &g), 0);
	assert_false(g.sum.mounted);
	assert_int_equal(g.n, 0);
}

static void test_held_lock_checks_one_snapshot(void **state)
{
	struct fix *f = *state;
	const struct dbox_check_item *it;
	char path[256];
	struct got g;
	int fd;

	/* A mount holds the lock: the check probes it and goes on in
	   snapshot mode, where an m.N the snapshot does not know is the
	   mount's work in progress, not a problem. */
	snprintf(path, sizeof(path), "%s/%s", f->store, DBOX_STORE_LOCK);
	fd = open(path, O_RDWR | O_CREAT, 0600);
	assert_true(fd >= 0);
	assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), 0);
	snprintf(path, sizeof(path), "%s/%s/m.%u", f->store,
		 DBOX_STORE_STORAGE, f->msgs[0].loc.file_id + 1);
	close(open(path, O_WRONLY | O_CREAT, 0600));
	assert_int_equal(run_check(f, &g), 0);
	assert_true(g.sum.mounted);
	assert_int_equal(g.sum.problems, 0);
	it = find(&g, DBOX_CHECK_NOTE, DBOX_CHECK_MFILE);
	assert_non_null(it);
	assert_int_equal(it->file_id, f->msgs[0].loc.file_id + 1);
	assert_non_null(strstr(it->text, "not in this snapshot"));
	close(fd);
	/* Let go: the same m.N offline is an empty file a crash cut. */
	assert_int_equal(run_check(f, &g), 0);
	assert_false(g.sum.mounted);
	it = find(&g, DBOX_CHECK_NOTE, DBOX_CHECK_MFILE);
	assert_non_null(it);
	assert_non_null(strstr(it->text, "is empty and not in the index"));
}

/* A check of a mounted store whose mount purges an m.N after check's
   snapshot and file listing but before check reads that file. */
struct purge_during {
	struct got g;            /* first: report_cb takes the context as it */
	struct dbox_store *st;
	uint32_t file_id;
	bool done;
};

static void purge_progress_cb(void *ctx, uint64_t records, uint64_t bytes)
{
	struct purge_during *p = ctx;
	struct dbox_purge_settings set = { .only = &p->file_id,
					   .only_count = 1 };
	struct dbox_purge_result res;

	progress_cb(&p->g, records, bytes);
	if (p->done)
		return;
	p->done = true;
	assert_int_equal(dbox_purge(p->st, &set, &res), 0);
	assert_int_equal(res.files_purged, 1);
}

static void test_mfile_purged_while_checking_is_a_note(void **state)
{
	struct fix *f = *state;
	struct dbox_store_settings set = { .rotate_size = 1 };
	struct purge_during p = { 0 };
	const struct dbox_check_item *it;
	struct dbox_ns_hooks hooks = { 0 };
	struct dbox_ns_gone gone;
	struct dbox_attr cur;
	struct msg a, b;
	char name[32];

	/* The store stays open (locked), as a mount keeps it.  With a
	   rotate size of one byte every message gets an m.N of its own: a
	   in m.2, b in m.3.  a's name goes, so m.2 holds only dead bytes. */
	assert_int_equal(dbox_store_open(f->store, &set, &p.st), 0);
	dbox_store_mutex_lock(p.st);
	assert_int_equal(dbox_ns_lookup(p.st, DBOX_ROOT_INO, "cur", &cur), 0);
	dbox_store_mutex_unlock(p.st);
	save_msg(p.st, cur.ino, NMSG, &a);
	save_msg(p.st, cur.ino, NMSG + 1, &b);
	assert_int_not_equal(a.loc.file_id, f->msgs[0].loc.file_id);
	assert_int_not_equal(b.loc.file_id, a.loc.file_id);
	snprintf(name, sizeof(name), "%u.M%uP1.host:2,S", NMSG, NMSG);
	dbox_store_mutex_lock(p.st);
	assert_int_equal(dbox_ns_remove(p.st, cur.ino, name, false, &hooks,
					&gone), 0);
	dbox_store_mutex_unlock(p.st);
	assert_true(gone.deleted);
	/* The purge runs while check reads m.1, the first file. */
	p.file_id = a.loc.file_id;
	assert_int_equal(dbox_check_store(f->store, report_cb,
					  purge_progress_cb, &p, &p.g.sum), 0);
	assert_true(p.done);
	assert_true(p.g.sum.mounted);
	assert_int_equal(p.g.sum.problems, 0);
	it = find(&p.g, DBOX_CHECK_NOTE, DBOX_CHECK_MFILE);
	assert_non_null(it);
	assert_int_equal(it->file_id, a.loc.file_id);
	assert_non_null(strstr(it->text, "purged by the mount"));
	dbox_store_close(&p.st);
}

static void test_missing_index_or_no_store(void **state)
{
	struct fix *f = *state;
	const struct dbox_check_item *it;
	char path[256];
	struct got g;

	snprintf(path, sizeof(path), "%s/%s", f->store, DBOX_STORE_INDEX);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(run_check(f, &g), 0);
	assert_true(g.sum.opened);
	assert_int_equal(g.sum.problems, 1);
	it = find(&g, DBOX_CHECK_PROBLEM, DBOX_CHECK_INDEX);
	assert_non_null(it);
	assert_non_null(strstr(it->text, "is missing"));
	/* Without storage/ either, it is no store at all. */
	snprintf(path, sizeof(path), "%s/%s", f->store, DBOX_STORE_STORAGE);
	rm_rf(path);
	assert_int_equal(run_check(f, &g), -ENOMEDIUM);
	assert_false(g.sum.opened);
	assert_int_equal(g.n, 0);
	snprintf(path, sizeof(path), "%s/nowhere", f->dir);
	assert_int_equal(dbox_check_store(path, report_cb, NULL, &g, &g.sum),
			 -ENOENT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
#define T(fn) cmocka_unit_test_setup_teardown(fn, fix_setup, fix_teardown)
		T(test_clean_store_reports_nothing),
		T(test_damaged_record_header),
		T(test_damaged_metadata),
		T(test_changed_guid),
		T(test_index_row_past_file_end),
		T(test_lost_found_copy_is_a_note),
		T(test_stale_lock_file_is_offline),
		T(test_held_lock_checks_one_snapshot),
		T(test_mfile_purged_while_checking_is_a_note),
		T(test_missing_index_or_no_store),
#undef T
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
