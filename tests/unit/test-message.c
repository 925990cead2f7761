/*
 * test-message.c: unit tests of the message operations of the engine
 * (engine/message.h) on a real store in a temporary directory: a message
 * created, written and finished (its record, size, mtime and received
 * date), read back; a plain file created with its backing file and
 * turned into a message; refusals that change nothing; and the altmove
 * request as the mount reads it (engine/purge.h, dbox_altmove_pending).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "engine/message.h"
#include "engine/namespace.h"
#include "engine/purge.h"
#include "engine/save-fd.h"
#include "engine/store-dirs.h"
#include "engine/store.h"
#include "index/index-purge.h"
#include "index/index.h"
#include "storage/dbox-read.h"
#include "test-common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int setup(void **state)
{
	struct inbox_fix *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	inbox_fix_open(f, "test-message");
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	inbox_fix_close(*state);
	free(*state);
	return 0;
}

static const struct dbox_ns_new new_file = {
	.kind = DBOX_KIND_FILE, .mode = S_IFREG | 0640,
};

/* The plaintext of message ino, read through its committed record. */
static void assert_message_text(struct inbox_fix *f, uint64_t ino, const char *text)
{
	struct dbox_reader *reader = NULL;
	char buf[256];
	ssize_t n;

	assert_int_equal(dbox_msg_open_reader(f->st, ino, &reader), 0);
	n = dbox_reader_pread(reader, buf, sizeof(buf), 0);
	assert_int_equal(n, (ssize_t)strlen(text));
	assert_memory_equal(buf, text, strlen(text));
	dbox_reader_free(&reader);
}

/* A message created in cur/, written and finished: its record is
   COMMITTED with the save's size, mtime is the time of the write, ctime
   the later of the write and the inode's last change (its create, which
   came after the made-up write time here), and the received date
   follows the mtime. */
static void test_create_write_finish(void **state)
{
	struct inbox_fix *f = *state;
	static const char text[] = "Subject: hi\n\nbody\n";
	struct dbox_save *save = NULL;
	struct dbox_attr attr, now;
	struct dbox_msgloc loc;
	int64_t written = dbox_time_make(1700000000, 5);
	char *mailbox = NULL;
	time_t received;
	int fd;

	assert_int_equal(dbox_msg_create(f->st, f->cur, "1:2,", &new_file,
					 true, &save, &fd, &attr), 0);
	assert_int_equal(attr.kind, DBOX_KIND_MESSAGE);
	assert_int_equal(fd, -1);
	assert_non_null(save);
	/* Begun, not finished: the index has a WRITING row. */
	assert_int_equal(dbox_msg_locate(f->st, attr.ino, &now, &loc), 0);
	assert_int_equal(loc.state, DBOX_MSG_WRITING);

	assert_int_equal(dbox_save_write(save, text, strlen(text), 0), 0);
	assert_int_equal(dbox_msg_finish(f->st, attr.ino, save, false,
					 &written), 0);
	assert_int_equal(dbox_msg_locate(f->st, attr.ino, &now, &loc), 0);
	assert_int_equal(loc.state, DBOX_MSG_COMMITTED);
	assert_int_equal(now.size, strlen(text));
	assert_true(now.mtime_ns == written && now.ctime_ns == attr.ctime_ns);
	assert_true(attr.ctime_ns > written);
	assert_int_equal(dbox_msg_received(f->st, attr.ino, NULL, &received), 0);
	assert_int_equal(received, 1700000000);
	dbox_save_free(&save);
	assert_message_text(f, attr.ino, text);

	assert_int_equal(dbox_msg_mailbox(f->st, attr.ino, &mailbox), 0);
	assert_string_equal(mailbox, "INBOX");
	free(mailbox);
	fd = dbox_msg_record_fd(f->st, attr.ino);
	assert_true(fd >= 0);
	assert_int_equal(fdatasync(fd), 0);
	close(fd);
	/* The received date moves in place (same width). */
	assert_int_equal(dbox_msg_set_received(f->st, attr.ino, 1600000000), 0);
}

/* Created without keeping the save: an empty message, finished in the
   create's transaction. */
static void test_create_closed(void **state)
{
	struct inbox_fix *f = *state;
	struct dbox_save *save = NULL;
	struct dbox_attr attr, now;
	struct dbox_msgloc loc;
	int fd;

	assert_int_equal(dbox_msg_create(f->st, f->cur, "2:2,", &new_file,
					 false, &save, &fd, &attr), 0);
	assert_null(save);
	assert_int_equal(dbox_msg_locate(f->st, attr.ino, &now, &loc), 0);
	assert_int_equal(loc.state, DBOX_MSG_COMMITTED);
	assert_int_equal(now.size, 0);
}

/* A plain file has a backing file and no record; renamed into cur/ it
   wants to be a message, and becomes one with its bytes and times. */
static void test_plain_file_to_message(void **state)
{
	struct inbox_fix *f = *state;
	struct dbox_save *save = NULL;
	struct dbox_attr attr, moved, now;
	struct dbox_msgloc loc;
	struct dbox_ns_gone gone;
	struct timespec times[2] = { { 1500000000, 0 }, { 1500000100, 0 } };
	uint64_t parent;
	int fd;

	assert_int_equal(dbox_msg_create(f->st, DBOX_ROOT_INO, "notes",
					 &new_file, true, &save, &fd, &attr), 0);
	assert_int_equal(attr.kind, DBOX_KIND_FILE);
	assert_null(save);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "hello\n", 6), 6);
	assert_int_equal(futimens(fd, times), 0);
	close(fd);
	assert_int_equal(dbox_msg_locate(f->st, attr.ino, &now, &loc), -ENOENT);
	assert_false(dbox_msg_file_wants(f->st, attr.ino, &parent));

	assert_int_equal(dbox_ns_rename(f->st, DBOX_ROOT_INO, "notes", f->cur,
					"3:2,", 0, NULL, &moved, &gone), 0);
	assert_true(dbox_msg_file_wants(f->st, attr.ino, &parent));
	assert_true(parent == f->cur);
	assert_int_equal(dbox_msg_from_file(f->st, attr.ino, parent, NULL), 0);
	assert_int_equal(dbox_ns_getattr(f->st, attr.ino, &now), 0);
	assert_int_equal(now.kind, DBOX_KIND_MESSAGE);
	assert_int_equal(now.size, 6);
	assert_true(now.mtime_ns == dbox_time_make(1500000100, 0));
	assert_message_text(f, attr.ino, "hello\n");
	assert_false(dbox_msg_file_wants(f->st, attr.ino, &parent));
	dbox_ns_file_unlink(f->st, attr.ino);
}

/* Refusals change nothing: a name that exists, a plain file whose
   backing file is gone (its conversion fails and is rolled back). */
static void test_refusals(void **state)
{
	struct inbox_fix *f = *state;
	struct dbox_save *save = NULL;
	struct dbox_attr attr, again, now;
	struct dbox_ns_gone gone;
	uint64_t parent;
	int fd;

	assert_int_equal(dbox_msg_create(f->st, f->cur, "4:2,", &new_file,
					 false, &save, &fd, &attr), 0);
	assert_int_equal(dbox_msg_create(f->st, f->cur, "4:2,", &new_file,
					 true, &save, &fd, &again), -EEXIST);
	assert_null(save);
	assert_int_equal(fd, -1);
	assert_int_equal(dbox_msg_create(f->st, 999999, "x", &new_file, true,
					 &save, &fd, &again), -ENOENT);

	assert_int_equal(dbox_msg_create(f->st, DBOX_ROOT_INO, "lost",
					 &new_file, true, &save, &fd, &attr), 0);
	close(fd);
	assert_int_equal(dbox_ns_rename(f->st, DBOX_ROOT_INO, "lost", f->cur,
					"5:2,", 0, NULL, &now, &gone), 0);
	assert_int_equal(dbox_store_file_remove(f->st, attr.ino), 0);
	assert_true(dbox_msg_from_file(f->st, attr.ino, f->cur, NULL) < 0);
	assert_int_equal(dbox_ns_getattr(f->st, attr.ino, &now), 0);
	assert_int_equal(now.kind, DBOX_KIND_FILE);
	assert_true(dbox_msg_file_wants(f->st, attr.ino, &parent));
}

/* The altmove request as the mount reads it: none, then pending with
   its cutoff and folder, then done once recorded. */
static void test_altmove_pending(void **state)
{
	struct inbox_fix *f = *state;
	struct dbox_index *index = f->st->index;
	struct dbox_purge_result res = { 0 };
	int64_t request, before;
	uint64_t folder;

	assert_int_equal(dbox_altmove_pending(f->st, &request, &before,
					      &folder), 0);
	assert_int_equal(dbox_index_begin(index), 0);
	assert_int_equal(dbox_index_meta_set(index, DBOX_META_ALTMOVE_BEFORE,
					     1234), 0);
	assert_int_equal(dbox_index_meta_set(index, DBOX_META_ALTMOVE_FOLDER,
					     (int64_t)f->cur), 0);
	assert_int_equal(dbox_index_meta_set(index, DBOX_META_ALTMOVE_REQUEST,
					     5000), 0);
	assert_int_equal(dbox_index_commit(index, false), 0);
	assert_int_equal(dbox_altmove_pending(f->st, &request, &before,
					      &folder), 1);
	assert_true(request == 5000 && before == 1234 && folder == f->cur);

	dbox_store_mutex_unlock(f->st);
	assert_int_equal(dbox_altmove_record(f->st, 5000, &res, &res), 0);
	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_altmove_pending(f->st, &request, &before,
					      &folder), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_create_write_finish, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_create_closed, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_plain_file_to_message,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
		cmocka_unit_test_setup_teardown(test_altmove_pending, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
