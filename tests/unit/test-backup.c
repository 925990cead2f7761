/*
 * test-backup.c: unit tests of the engine's backup (engine/backup.h) with
 * cmocka, on real stores in mkdtemp() directories, the source store held
 * open (as a mount holds it) while it is backed up: the backup opens as
 * a store holding the same names with the same bytes; a second backup
 * after an expunge and a new message holds the new state, while the
 * first is unchanged; an interrupted run is resumed keeping what it
 * wrote; with the previous backup unchanged m.N are hard links; an m.N
 * the index refers to that is missing is reported as damage (data, not a
 * log line) and left out; a DEST that exists, and a DEST.partial another
 * backup holds locked, are refused with nothing written.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "engine/store-layout.h"
#include "engine/backup.h"
#include "engine/store-lock.h"
#include "engine/store.h"
#include "engine/view.h"
#include "index/index.h"
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

#define NMSG 10
#define ROTATE 4000

struct msg {
	char name[32];
	char *body;
	size_t len;
	bool expunged;
};

struct fix {
	char dir[64];
	char store[128];
	struct dbox_store *st;
	uint64_t cur;
	struct msg msgs[NMSG + 1];
	unsigned int nmsgs;
	/* what the damage callback saw */
	struct dbox_backup_damage damage[4];
	unsigned int ndamage;
};

static char *make_body(unsigned int seed, size_t len)
{
	uint64_t x = 0x2545f4914f6cdd1dULL ^ seed;
	char *buf = malloc(len + 1);

	assert_non_null(buf);
	for (size_t i = 0; i < len; i++) {
		uint64_t r = xorshift64(&x);

		buf[i] = r % 23 == 0 ? '\n' : (char)('a' + r % 26);
	}
	buf[len] = '\0';
	return buf;
}

/* Save m as cur/<name> in one transaction, as fs/ does. */
static void save_msg(struct dbox_store *st, uint64_t dir, const struct msg *m)
{
	struct dbox_save *save = NULL;
	struct dbox_attr attr;
	struct dbox_msgloc loc;

	dbox_store_mutex_lock(st);
	assert_int_equal(dbox_index_begin(st->index), 0);
	assert_int_equal(dbox_index_create(st->index, dir, m->name,
					   strlen(m->name), DBOX_KIND_MESSAGE,
					   S_IFREG | 0600, getuid(), getgid(),
					   dbox_now_ns(), &attr), 0);
	assert_int_equal(dbox_save_begin(st, attr.ino, "INBOX", &save), 0);
	assert_int_equal(dbox_save_write(save, m->body, m->len, 0), 0);
	assert_int_equal(dbox_save_finish(save, 1600000000, false, &loc), 0);
	attr.size = m->len;
	assert_int_equal(dbox_index_setattr(st->index, &attr), 0);
	assert_int_equal(dbox_index_commit(st->index, false), 0);
	dbox_save_free(&save);
	dbox_store_mutex_unlock(st);
}

static void add_msg(struct fix *f, unsigned int seed)
{
	struct msg *m = &f->msgs[f->nmsgs++];

	m->len = 700 + (seed * 263) % 1300;
	m->body = make_body(seed, m->len);
	snprintf(m->name, sizeof(m->name), "%u.M%uP1.host:2,S", seed, seed);
	save_msg(f->st, f->cur, m);
}

static int fix_setup(void **state)
{
	struct dbox_store_settings set = { .rotate_size = ROTATE,
					   .create = true };
	struct fix *f = calloc(1, sizeof(*f));
	struct dbox_attr attr;

	assert_non_null(f);
	dbox_log_set_sink(capture_sink);
	errors_reset();
	tmpdir_make(f->dir, sizeof(f->dir), "test-backup");
	snprintf(f->store, sizeof(f->store), "%s/store", f->dir);
	assert_int_equal(dbox_store_open(f->store, &set, &f->st), 0);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_index_create(f->st->index, DBOX_ROOT_INO, "cur",
					   3, DBOX_KIND_DIR, S_IFDIR | 0700,
					   getuid(), getgid(), dbox_now_ns(),
					   &attr), 0);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	f->cur = attr.ino;
	for (unsigned int i = 0; i < NMSG; i++)
		add_msg(f, i + 1);
	*state = f;
	return 0;
}

static int fix_teardown(void **state)
{
	struct fix *f = *state;

	dbox_store_close(&f->st);
	rm_rf(f->dir);
	for (unsigned int i = 0; i < f->nmsgs; i++)
		free(f->msgs[i].body);
	free(f);
	return 0;
}

static void damage_cb(void *ctx, const struct dbox_backup_damage *d)
{
	struct fix *f = ctx;

	if (f->ndamage < sizeof(f->damage) / sizeof(f->damage[0]))
		f->damage[f->ndamage] = *d;
	f->ndamage++;
}

/* Back up f's store (open, as mounted) to dir/<dest>. */
static int backup(struct fix *f, const char *dest, const char *prev,
		  struct dbox_backup_result *res)
{
	char dpath[256], ppath[256];
	struct dbox_backup_settings set = { .dest = dpath, .damage = damage_cb,
					    .ctx = f };
	struct dbox_view *view = NULL;
	int ret;

	snprintf(dpath, sizeof(dpath), "%s/%s", f->dir, dest);
	if (prev != NULL) {
		snprintf(ppath, sizeof(ppath), "%s/%s", f->dir, prev);
		set.prev = ppath;
	}
	assert_int_equal(dbox_view_open(f->store, &view), 0);
	ret = dbox_backup(view, &set, res);
	dbox_view_close(&view);
	return ret;
}

/* The store dir/<name> holds, in cur/, exactly the live messages of f
   with their bytes. */
static void expect_store(struct fix *f, const char *name)
{
	struct dbox_store_settings set = { .create = false };
	struct dbox_store *st = NULL;
	struct dbox_attr dir, attr;
	char path[256];

	snprintf(path, sizeof(path), "%s/%s", f->dir, name);
	assert_int_equal(dbox_store_open(path, &set, &st), 0);
	assert_int_equal(dbox_index_lookup(st->index, DBOX_ROOT_INO, "cur", 3,
					   &dir), 0);
	for (unsigned int i = 0; i < f->nmsgs; i++) {
		const struct msg *m = &f->msgs[i];
		struct dbox_reader *reader = NULL;
		struct dbox_msgloc loc;
		char *buf;
		int ret = dbox_index_lookup(st->index, dir.ino, m->name,
					    strlen(m->name), &attr);

		if (m->expunged) {
			assert_int_equal(ret, -ENOENT);
			continue;
		}
		assert_int_equal(ret, 0);
		assert_int_equal(attr.size, m->len);
		assert_int_equal(dbox_index_msg_get(st->index, attr.ino, &loc), 0);
		dbox_store_mutex_lock(st);
		assert_int_equal(dbox_store_open_reader(st, &loc, m->len,
							&reader), 0);
		dbox_store_mutex_unlock(st);
		assert_non_null(buf = malloc(m->len + 16));
		assert_int_equal(dbox_reader_pread(reader, buf, m->len + 16, 0),
				 (ssize_t)m->len);
		assert_memory_equal(buf, m->body, m->len);
		free(buf);
		dbox_reader_free(&reader);
	}
	dbox_store_close(&st);
}

static bool exists(const struct fix *f, const char *name)
{
	char path[256];
	struct stat sb;

	snprintf(path, sizeof(path), "%s/%s", f->dir, name);
	return lstat(path, &sb) == 0;
}

static void test_backup_restores_names_and_bytes(void **state)
{
	struct fix *f = *state;
	struct dbox_backup_result res;

	assert_int_equal(backup(f, "bk", NULL, &res), 0);
	assert_int_equal(res.messages, NMSG);
	assert_true(res.mfiles >= 2);
	assert_int_equal(res.copied, res.mfiles + res.plain_files);
	assert_int_equal(res.source_errors, 0);
	assert_int_equal(f->ndamage, 0);
	assert_false(exists(f, "bk.partial"));
	assert_true(exists(f, "bk/" DBOX_BACKUP_MANIFEST));
	expect_store(f, "bk");
}

static void expunge(struct fix *f, struct msg *m)
{
	struct dbox_store *st = f->st;
	uint64_t ino;
	uint32_t nlink;

	dbox_store_mutex_lock(st);
	assert_int_equal(dbox_index_begin(st->index), 0);
	assert_int_equal(dbox_index_remove(st->index, f->cur, m->name,
					   strlen(m->name), false,
					   dbox_now_ns(), &ino, &nlink), 0);
	assert_int_equal(dbox_index_delete_inode(st->index, ino), 0);
	assert_int_equal(dbox_index_commit(st->index, false), 0);
	dbox_store_mutex_unlock(st);
	m->expunged = true;
}

static void test_second_backup_after_changes(void **state)
{
	struct fix *f = *state;
	struct dbox_backup_result res1, res2;

	assert_int_equal(backup(f, "bk1", NULL, &res1), 0);
	expunge(f, &f->msgs[0]);
	add_msg(f, 100);
	assert_int_equal(backup(f, "bk2", "bk1", &res2), 0);
	assert_int_equal(res2.messages, NMSG);
	assert_int_equal(res2.copied + res2.linked, res2.mfiles +
			 res2.plain_files);
	expect_store(f, "bk2");
	/* The first backup is as it was: the expunged message there, the
	   new one not. */
	f->msgs[0].expunged = false;
	f->nmsgs--;
	expect_store(f, "bk1");
	f->nmsgs++;
}

/* A killed run's DEST.partial (here: a finished backup renamed back) is
   taken up again: what it holds and still matches is kept, not copied;
   the highest m.N is always copied (a mount of the backup appends
   there). */
static void test_interrupted_backup_resumed(void **state)
{
	struct fix *f = *state;
	struct dbox_backup_result res;
	char from[256], to[256];

	assert_int_equal(backup(f, "bk", NULL, &res), 0);
	snprintf(from, sizeof(from), "%s/bk", f->dir);
	snprintf(to, sizeof(to), "%s/bk.partial", f->dir);
	assert_int_equal(rename(from, to), 0);
	assert_int_equal(backup(f, "bk", NULL, &res), 0);
	assert_true(res.resumed);
	assert_int_equal(res.kept, res.mfiles - 1);
	assert_int_equal(res.copied, 1);
	expect_store(f, "bk");
}

/* With the previous backup, the m.N unchanged since (older than the
   timestamp tick) are hard links into it, the highest one is copied. */
static void test_link_dest_links_unchanged(void **state)
{
	struct fix *f = *state;
	struct dbox_backup_result res1, res2;
	char path[256];
	struct stat sb;

	/* Past DBOX_BACKUP_LINK_AGE_NS: the m.N are old enough to link. */
	sleep(3);
	assert_int_equal(backup(f, "bk1", NULL, &res1), 0);
	assert_int_equal(backup(f, "bk2", "bk1", &res2), 0);
	assert_int_equal(res2.linked, res2.mfiles - 1);
	assert_int_equal(res2.copied, 1);
	snprintf(path, sizeof(path), "%s/bk2/" DBOX_STORE_STORAGE "/m.1",
		 f->dir);
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal(sb.st_nlink, 2);
	expect_store(f, "bk2");
}

static void test_missing_mfile_is_damage(void **state)
{
	struct fix *f = *state;
	struct dbox_backup_result res;
	char path[256];

	snprintf(path, sizeof(path), "%s/" DBOX_STORE_STORAGE "/m.1", f->store);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(backup(f, "bk", NULL, &res), 0);
	assert_int_equal(res.source_errors, 1);
	assert_int_equal(f->ndamage, 1);
	assert_int_equal(f->damage[0].what, DBOX_BACKUP_MISSING);
	assert_int_equal(f->damage[0].kind, 'm');
	assert_int_equal(f->damage[0].id, 1);
	assert_int_equal(res.copied, res.mfiles + res.plain_files - 1);
	assert_false(exists(f, "bk/" DBOX_STORE_STORAGE "/m.1"));
	assert_true(exists(f, "bk/" DBOX_STORE_STORAGE "/m.2"));
}

static void test_locked_destination_is_busy(void **state)
{
	struct fix *f = *state;
	struct dbox_backup_result res;
	char path[256];
	int fd;

	snprintf(path, sizeof(path), "%s/bk.partial", f->dir);
	assert_int_equal(mkdir(path, 0700), 0);
	fd = open(path, O_RDONLY | O_DIRECTORY);
	assert_true(fd >= 0);
	assert_int_equal(dbox_dir_lock_try(fd), 0);
	errors_reset();
	assert_int_equal(backup(f, "bk", NULL, &res), -EBUSY);
	assert_true(res.refused);
	assert_non_null(strstr(last_error, "another dboxadm backup"));
	assert_false(exists(f, "bk"));
	assert_false(exists(f, "bk.partial/" DBOX_BACKUP_MANIFEST));
	close(fd);
	/* Let go, the same DEST works. */
	assert_int_equal(backup(f, "bk", NULL, &res), 0);
	expect_store(f, "bk");
}

static void test_existing_destination_refused(void **state)
{
	struct fix *f = *state;
	struct dbox_backup_result res;
	char path[256];

	snprintf(path, sizeof(path), "%s/bk", f->dir);
	assert_int_equal(mkdir(path, 0700), 0);
	assert_int_equal(backup(f, "bk", NULL, &res), -EEXIST);
	assert_true(res.refused);
	assert_false(exists(f, "bk.partial"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_backup_restores_names_and_bytes,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_second_backup_after_changes,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_interrupted_backup_resumed,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_link_dest_links_unchanged,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_missing_mfile_is_damage,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_locked_destination_is_busy,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_existing_destination_refused,
						fix_setup, fix_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
