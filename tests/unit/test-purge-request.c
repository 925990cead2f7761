/*
 * test-purge-request.c: unit tests of the purge and altmove requests
 * dboxadm makes of a mounted store (engine/purge.h, purge-meta.c), with
 * cmocka on a real store: the store open read-write (the mount's side)
 * and a view of it (dboxadm's side, no lock).  A requested purge is seen
 * done only once the mount recorded one that started after the request,
 * with its outcome; an altmove request reads as running (with the
 * progress the mount recorded) until the mount records its outcome; a
 * folder path finds its directory, a missing one is -ENOENT.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "engine/purge.h"
#include "engine/store.h"
#include "engine/view.h"
#include "index/index.h"
#include "storage/log.h"
#include "test-common.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct fix {
	char dir[64];
	char store[128];
	struct dbox_store *st;
	struct dbox_view *view;
};

static int fix_setup(void **state)
{
	static struct fix f;
	struct dbox_store_settings set = { .create = true };

	memset(&f, 0, sizeof(f));
	dbox_log_set_sink(capture_sink);
	tmpdir_make(f.dir, sizeof(f.dir), "test-purge-request");
	snprintf(f.store, sizeof(f.store), "%s/store", f.dir);
	assert_int_equal(dbox_store_open(f.store, &set, &f.st), 0);
	assert_int_equal(dbox_view_open(f.store, &f.view), 0);
	*state = &f;
	return 0;
}

static int fix_teardown(void **state)
{
	struct fix *f = *state;

	dbox_view_close(&f->view);
	dbox_store_close(&f->st);
	rm_rf(f->dir);
	return 0;
}

static void test_purge_request_done(void **state)
{
	struct fix *f = *state;
	struct dbox_purge_result res = { .bytes_freed = 4096,
					 .bytes_moved = 100,
					 .files_purged = 2, .garbage_files = 1,
					 .records_moved = 3, .files_failed = 1,
					 .files_busy = 4, .error = -EIO };
	struct dbox_purge_result got;
	int64_t t0 = dbox_now_ns();

	assert_int_equal(dbox_purge_request_done(f->view, t0, &got), 0);
	/* An automatic run is no answer to the request. */
	res.start_ns = t0 + 1;
	assert_int_equal(dbox_purge_record(f->st, &res, false), 0);
	assert_int_equal(dbox_purge_request_done(f->view, t0, &got), 0);
	/* A requested run that started before it is none either. */
	res.start_ns = t0 - 1;
	assert_int_equal(dbox_purge_record(f->st, &res, true), 0);
	assert_int_equal(dbox_purge_request_done(f->view, t0, &got), 0);
	res.start_ns = t0 + 1;
	assert_int_equal(dbox_purge_record(f->st, &res, true), 0);
	assert_int_equal(dbox_purge_request_done(f->view, t0, &got), 1);
	assert_int_equal(got.error, -EIO);
	assert_int_equal(got.bytes_freed, 4096);
	assert_int_equal(got.bytes_moved, 100);
	assert_int_equal(got.files_purged, 3); /* purged + garbage */
	assert_int_equal(got.records_moved, 3);
	assert_int_equal(got.files_failed, 1);
	assert_int_equal(got.files_busy, 4);
}

static void test_altmove_request_poll(void **state)
{
	struct fix *f = *state;
	struct dbox_purge_result res = { 0 }, got, purged = { 0 }, got_purged;
	int64_t t0 = 0, value = 0;

	assert_int_equal(dbox_altmove_request(f->view, 12345, 7, &t0), 0);
	assert_true(t0 > 0);
	/* The mount sees the request. */
	assert_int_equal(dbox_index_meta_get(f->st->index,
					     DBOX_META_ALTMOVE_REQUEST, &value), 0);
	assert_int_equal(value, t0);
	assert_int_equal(dbox_index_meta_get(f->st->index,
					     DBOX_META_ALTMOVE_BEFORE, &value), 0);
	assert_int_equal(value, 12345);
	assert_int_equal(dbox_index_meta_get(f->st->index,
					     DBOX_META_ALTMOVE_FOLDER, &value), 0);
	assert_int_equal(value, 7);
	assert_int_equal(dbox_altmove_request_poll(f->view, t0, &got,
						   &got_purged), 0);
	assert_int_equal(got.records_moved, 0);
	/* Progress of another request is not this one's. */
	res.records_moved = 9;
	assert_int_equal(dbox_altmove_progress(f->st, t0 - 1, &res), 0);
	assert_int_equal(dbox_altmove_request_poll(f->view, t0, &got,
						   &got_purged), 0);
	assert_int_equal(got.records_moved, 0);
	res.records_moved = 5;
	res.bytes_moved = 500;
	assert_int_equal(dbox_altmove_progress(f->st, t0, &res), 0);
	assert_int_equal(dbox_altmove_request_poll(f->view, t0, &got,
						   &got_purged), 0);
	assert_int_equal(got.records_moved, 5);
	assert_int_equal(got.bytes_moved, 500);
	res.records_moved = 6;
	res.bytes_moved = 600;
	res.files_purged = 2;
	res.error = -ENOSPC;
	purged.files_purged = 3;
	purged.garbage_files = 1;
	purged.bytes_freed = 4000;
	purged.bytes_moved = 700;
	assert_int_equal(dbox_altmove_record(f->st, t0, &res, &purged), 0);
	assert_int_equal(dbox_altmove_request_poll(f->view, t0, &got,
						   &got_purged), 1);
	assert_int_equal(got.records_moved, 6);
	assert_int_equal(got.bytes_moved, 600);
	assert_int_equal(got.files_purged, 2);
	assert_int_equal(got.error, -ENOSPC);
	/* The purge after the move, as the offline altmove prints it. */
	assert_int_equal(got_purged.files_purged, 4);
	assert_int_equal(got_purged.bytes_freed, 4000);
	assert_int_equal(got_purged.bytes_moved, 700);
}

static void test_altmove_folder(void **state)
{
	struct fix *f = *state;
	struct dbox_attr sent, sub;
	uint64_t ino = 0;

	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_index_create(f->st->index, DBOX_ROOT_INO, ".Sent",
					   5, DBOX_KIND_DIR, S_IFDIR | 0700,
					   getuid(), getgid(), dbox_now_ns(),
					   &sent), 0);
	assert_int_equal(dbox_index_create(f->st->index, sent.ino, "b", 1,
					   DBOX_KIND_DIR, S_IFDIR | 0700,
					   getuid(), getgid(), dbox_now_ns(),
					   &sub), 0);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	assert_int_equal(dbox_altmove_folder(f->view->index, "INBOX", &ino), 0);
	assert_int_equal(ino, DBOX_ROOT_INO);
	assert_int_equal(dbox_altmove_folder(f->view->index, "", &ino), 0);
	assert_int_equal(ino, DBOX_ROOT_INO);
	assert_int_equal(dbox_altmove_folder(f->view->index, ".Sent", &ino), 0);
	assert_int_equal(ino, sent.ino);
	assert_int_equal(dbox_altmove_folder(f->view->index, ".Sent/b/", &ino),
			 0);
	assert_int_equal(ino, sub.ino);
	assert_int_equal(dbox_altmove_folder(f->view->index, ".Trash", &ino),
			 -ENOENT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_purge_request_done,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_altmove_request_poll,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_altmove_folder, fix_setup,
						fix_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
