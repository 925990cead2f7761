/*
 * test-save-seal.c: unit tests (cmocka) of the pieces fsync is built
 * from: dbox_save_seal (the record written, the index untouched; a write
 * undoes it, a reseal is counted) and dbox_index_sync_upto (group commit:
 * returns at once for commits already synced, and concurrent callers all
 * return with their commits on disk); the state of a save as callers see
 * it (struct dbox_save is opaque: dbox_save_begin_copy, _ref, _unseal,
 * _where, _inflight_seq); and the checks of the lock order (store.h): an
 * entry point that needs st->lock aborts when called without it.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "test-common.h"

#include "index/index.h"
#include "engine/purge.h"
#include "engine/store.h"
#include "index/wal-sync.h"
#include "storage/dbox-file.h"
#include "storage/dbox-read.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

struct fix {
	char dir[64];
	char store[128];
	struct dbox_store *st;
};

static int setup(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));
	struct dbox_store_settings set = { .create = true };

	assert_non_null(f);
	tmpdir_make(f->dir, sizeof(f->dir), "test-seal");
	snprintf(f->store, sizeof(f->store), "%s/store", f->dir);
	assert_int_equal(dbox_store_open(f->store, &set, &f->st), 0);
	/* One thread: the store lock is held all along. */
	dbox_store_mutex_lock(f->st);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fix *f = *state;

	dbox_store_mutex_unlock(f->st);
	dbox_store_close(&f->st);
	rm_rf(f->dir);
	free(f);
	return 0;
}

/* A new message inode in the root, being saved. */
static struct dbox_save *begin(struct fix *f, const char *name, uint64_t *ino_r)
{
	struct dbox_save *save = NULL;
	struct dbox_attr attr;

	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_index_create(f->st->index, DBOX_ROOT_INO, name,
					   strlen(name), DBOX_KIND_MESSAGE,
					   S_IFREG | 0600, 0, 0, dbox_now_ns(),
					   &attr), 0);
	assert_int_equal(dbox_save_begin(f->st, attr.ino, "INBOX", &save), 0);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	*ino_r = attr.ino;
	return save;
}

static void test_seal_writes_record_not_index(void **state)
{
	struct fix *f = *state;
	struct dbox_msgloc loc, where;
	struct dbox_reader *reader = NULL;
	uint64_t ino, body_size, record_size;
	int fd;
	struct dbox_metadata md;
	char buf[64];
	struct dbox_save *save = begin(f, "a", &ino);

	assert_int_equal(dbox_save_write(save, "hello\n", 6, 0), 0);
	assert_false(dbox_save_sealed(save));
	assert_int_equal(dbox_save_seal(save, 1700000000, NULL, NULL), 0);
	assert_true(dbox_save_sealed(save));
	assert_false(dbox_save_finished(save));
	assert_int_equal(dbox_save_seals(save), 1);
	/* The record on disk is whole, with its metadata... */
	memset(&md, 0, sizeof(md));
	dbox_save_where(save, &where);
	assert_true((fd = dbox_store_mfile_open(f->st, where.file_id,
						O_RDONLY)) >= 0);
	assert_int_equal(dbox_record_read(fd, where.file_id, where.offset, 6,
					  &body_size, &md, &record_size), 0);
	close(fd);
	assert_int_equal(md.received, 1700000000);
	assert_string_equal(md.guid, where.guid);
	dbox_metadata_clear(&md);
	/* ... but the index still says WRITING. */
	assert_int_equal(dbox_index_msg_get(f->st->index, ino, &loc), 0);
	assert_int_equal(loc.state, DBOX_MSG_WRITING);

	/* A reseal with nothing written is no new record. */
	assert_int_equal(dbox_save_seal(save, 1700000000, NULL, NULL), 0);
	assert_int_equal(dbox_save_seals(save), 1);
	/* A write undoes the seal; sealing again is counted. */
	assert_int_equal(dbox_save_write(save, "world\n", 6, 6), 0);
	assert_false(dbox_save_sealed(save));
	assert_int_equal(dbox_save_seal(save, 1700000000, NULL, NULL), 0);
	assert_int_equal(dbox_save_seals(save), 2);

	/* The finish after a seal commits what was sealed. */
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_save_finish(save, 1700000000, false, &loc), 0);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	assert_int_equal(dbox_save_seals(save), 2);
	dbox_save_free(&save);
	assert_int_equal(dbox_index_msg_get(f->st->index, ino, &loc), 0);
	assert_int_equal(loc.state, DBOX_MSG_COMMITTED);
	assert_int_equal(dbox_store_open_reader(f->st, &loc, 12, &reader), 0);
	assert_int_equal(dbox_reader_pread(reader, buf, sizeof(buf), 0), 12);
	assert_memory_equal(buf, "hello\nworld\n", 12);
	dbox_reader_free(&reader);
}

struct syncer {
	struct dbox_index *index;
	uint64_t seq;
	int ret;
};

static void *sync_thread(void *arg)
{
	struct syncer *s = arg;

	s->ret = dbox_index_sync_upto(s->index, s->seq);
	return NULL;
}

static void test_sync_upto(void **state)
{
	struct fix *f = *state;
	struct dbox_index *index = f->st->index;
	struct syncer s[4];
	pthread_t t[4];
	uint64_t seq0 = dbox_index_commit_seq(index), ino;
	struct dbox_save *save;

	/* Nothing committed on this connection yet: nothing to wait for. */
	assert_int_equal(dbox_index_sync_upto(index, seq0), 0);
	save = begin(f, "b", &ino); /* one commit */
	dbox_save_free(&save);
	assert_int_equal(dbox_index_commit_seq(index), seq0 + 1);
	for (int i = 0; i < 4; i++) {
		s[i] = (struct syncer){ .index = index, .seq = seq0 + 1, .ret = -1 };
		assert_int_equal(pthread_create(&t[i], NULL, sync_thread, &s[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		assert_int_equal(s[i].ret, 0);
	}
	/* Synced already: returns without syncing again. */
	assert_int_equal(dbox_index_sync_upto(index, seq0 + 1), 0);
}

/* The meta inflight.m.<file_id>, or -2 when absent. */
static int64_t inflight_mark(struct fix *f, uint32_t file_id)
{
	char inflight[32], kept[32];
	int64_t v;

	dbox_store_tail_keys(file_id, inflight, kept);
	if (dbox_index_meta_get(f->st->index, inflight, &v) < 0)
		return -2;
	return v;
}

/* A copy (dbox_save_begin_copy) is marked in flight by a commit of its
   own before its first byte, leaves the index's record of the inode as
   it was, and forgets the mark when finished. */
static void test_begin_copy(void **state)
{
	struct fix *f = *state;
	uint64_t ino, seq;
	struct dbox_save *save = begin(f, "c", &ino), *copy = NULL;
	struct dbox_msgloc loc, where, old;

	/* A committed message first. */
	dbox_save_where(save, &where);
	assert_int_equal(where.state, DBOX_MSG_WRITING);
	assert_int_equal(dbox_save_write(save, "old\n", 4, 0), 0);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_save_finish(save, 1700000000, false, &old), 0);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	assert_true(dbox_save_finished(save));
	assert_int_equal(dbox_save_inflight_seq(save), 0);
	dbox_save_where(save, &loc);
	assert_int_equal(loc.state, DBOX_MSG_COMMITTED);
	assert_int_equal(loc.offset, where.offset);
	dbox_save_free(&save);

	seq = dbox_index_commit_seq(f->st->index);
	assert_int_equal(dbox_save_begin_copy(f->st, ino, "INBOX", &copy), 0);
	/* Its own commit, with the mark at the copy's offset. */
	assert_int_equal(dbox_index_commit_seq(f->st->index), seq + 1);
	assert_int_equal(dbox_save_inflight_seq(copy), seq + 1);
	dbox_save_where(copy, &where);
	assert_int_equal(where.state, DBOX_MSG_WRITING);
	assert_int_equal(inflight_mark(f, where.file_id), (int64_t)where.offset);
	/* The index still names the old record. */
	assert_int_equal(dbox_index_msg_get(f->st->index, ino, &loc), 0);
	assert_int_equal(loc.offset, old.offset);
	assert_int_equal(loc.state, DBOX_MSG_COMMITTED);

	assert_int_equal(dbox_save_write(copy, "new!\n", 5, 0), 0);
	assert_int_equal(dbox_save_sync(copy), 0);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_save_finish(copy, 1700000000, true, &loc), 0);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	assert_int_equal(loc.offset, where.offset);
	assert_int_equal(dbox_save_inflight_seq(copy), 0);
	assert_int_equal(inflight_mark(f, where.file_id), -1);
	assert_int_equal(dbox_index_msg_get(f->st->index, ino, &loc), 0);
	assert_int_equal(loc.offset, where.offset);
	dbox_save_free(&copy);
}

/* The size of m.<file_id> on disk. */
static int64_t mfile_bytes(struct fix *f, uint32_t file_id)
{
	char path[256];
	struct stat sb;

	snprintf(path, sizeof(path), "%s/storage/m.%u", f->store, file_id);
	return stat(path, &sb) < 0 ? -1 : (int64_t)sb.st_size;
}

/* A second reference keeps an unfinished save (and its bytes) until the
   last one goes; unseal forgets the seal of an unfinished save only. */
static void test_ref_and_unseal(void **state)
{
	struct fix *f = *state;
	uint64_t ino;
	struct dbox_save *save = begin(f, "r", &ino), *other;
	struct dbox_msgloc where, loc;

	dbox_save_where(save, &where);
	assert_int_equal(dbox_save_write(save, "bytes\n", 6, 0), 0);
	assert_int_equal(dbox_save_seal(save, 1700000000, NULL, NULL), 0);
	assert_true(dbox_save_sealed(save));
	dbox_save_unseal(save);
	assert_false(dbox_save_sealed(save));
	assert_int_equal(dbox_save_seals(save), 1);

	other = save;
	dbox_save_ref(other);
	dbox_save_free(&save);
	assert_null(save);
	/* Still there: its bytes are not cut. */
	assert_true(mfile_bytes(f, where.file_id) > (int64_t)where.offset);
	assert_int_equal(dbox_save_size(other), 6);
	/* A finished save stays finished (and sealed) through unseal. */
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_save_finish(other, 1700000000, false, &loc), 0);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	dbox_save_unseal(other);
	assert_true(dbox_save_finished(other));
	assert_true(dbox_save_sealed(other));
	dbox_save_free(&other);
	assert_int_equal(mfile_bytes(f, where.file_id),
			 (int64_t)(loc.offset + loc.record_size));

	/* The last reference of an unfinished save gives its bytes back. */
	save = begin(f, "s", &ino);
	dbox_save_where(save, &where);
	assert_int_equal(dbox_save_write(save, "gone\n", 5, 0), 0);
	other = save;
	dbox_save_ref(other);
	dbox_save_free(&save);
	assert_true(mfile_bytes(f, where.file_id) > (int64_t)where.offset);
	dbox_save_free(&other);
	assert_int_equal(mfile_bytes(f, where.file_id), (int64_t)where.offset);
}

/* --- the lock order's checks (store.h) -------------------------------- */

enum misuse {
	MISUSE_READ_FD,        /* needs st->lock, called without */
	MISUSE_SAVE_BEGIN,
	MISUSE_SAVE_FREE,
	MISUSE_MFILE_ACQUIRE,
	MISUSE_UNLOCK,         /* dropping a lock not held */
	MISUSE_LOCK_TWICE,     /* taking it again: would deadlock */
	MISUSE_PURGE_LOCKED,   /* takes st->lock itself, called with it */
	MISUSE_COUNT
};

/* Run the misuse in a child; returns the signal it died of (0: it
   lived).  Called with the lock held, as the fixture holds it. */
static int misuse_signal(struct fix *f, enum misuse m, struct dbox_save *save)
{
	struct dbox_purge_settings set = { .threshold = 0 };
	struct dbox_purge_result res;
	struct dbox_mfile *mf;
	int status;
	pid_t pid;

	dbox_store_mutex_unlock(f->st);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		/* No core files, and the assertion's message is expected. */
		signal(SIGABRT, SIG_DFL);
		if (freopen("/dev/null", "w", stderr) == NULL)
			_exit(3);
		switch (m) {
		case MISUSE_READ_FD:
			(void)dbox_store_read_fd(f->st, 1);
			break;
		case MISUSE_SAVE_BEGIN:
			(void)dbox_save_begin(f->st, 1, "INBOX", &save);
			break;
		case MISUSE_SAVE_FREE:
			dbox_save_free(&save);
			break;
		case MISUSE_MFILE_ACQUIRE:
			(void)dbox_store_mfile_acquire(f->st, &mf);
			break;
		case MISUSE_UNLOCK:
			dbox_store_mutex_unlock(f->st);
			break;
		case MISUSE_LOCK_TWICE:
			dbox_store_mutex_lock(f->st);
			dbox_store_mutex_lock(f->st);
			break;
		case MISUSE_PURGE_LOCKED:
			dbox_store_mutex_lock(f->st);
			(void)dbox_purge(f->st, &set, &res);
			break;
		default:
			break;
		}
		_exit(0);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	dbox_store_mutex_lock(f->st);
	return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

/* With assertions on (no NDEBUG: the default, ASan and TSan builds), an
   entry point that needs st->lock aborts when the calling thread does
   not hold it, as do a second lock by the holder, an unlock by a thread
   that does not hold it, and purge entered with the lock.  Each misuse
   runs in a child that must die by SIGABRT. */
static void test_lock_misuse_aborts(void **state)
{
	struct fix *f = *state;
	uint64_t ino;
	struct dbox_save *save = begin(f, "l", &ino);

#ifdef NDEBUG
	skip();
#endif
	assert_true(dbox_store_mutex_held(f->st));
	for (int m = 0; m < MISUSE_COUNT; m++) {
		print_message("misuse %d\n", m);
		assert_int_equal(misuse_signal(f, (enum misuse)m, save),
				 SIGABRT);
	}
	/* The right use, for contrast: the lock held, no abort. */
	assert_true(dbox_store_read_fd(f->st, 1) >= 0);
	dbox_save_free(&save);
	dbox_store_mutex_unlock(f->st);
	assert_false(dbox_store_mutex_held(f->st));
	dbox_store_mutex_lock(f->st);
}

/* A thread that does not hold st->lock is not its holder, while another
   thread holds it. */
static void *held_elsewhere(void *arg)
{
	struct fix *f = arg;

	return (void *)(uintptr_t)dbox_store_mutex_held(f->st);
}

static void test_holder_is_per_thread(void **state)
{
	struct fix *f = *state;
	pthread_t t;
	void *held = (void *)1;

	assert_true(dbox_store_mutex_held(f->st));
	assert_int_equal(pthread_create(&t, NULL, held_elsewhere, f), 0);
	assert_int_equal(pthread_join(t, &held), 0);
	assert_null(held);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_seal_writes_record_not_index,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_sync_upto, setup, teardown),
		cmocka_unit_test_setup_teardown(test_begin_copy, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ref_and_unseal, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_lock_misuse_aborts, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_holder_is_per_thread, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
