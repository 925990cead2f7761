/*
 * test-save-seal.c: unit tests (cmocka) of the pieces fsync is built
 * from: dbox_save_seal (the record written, the index untouched; a write
 * undoes it, a reseal is counted) and dbox_index_sync_upto (group commit:
 * returns at once for commits already synced, and concurrent callers all
 * return with their commits on disk).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "test-common.h"

#include "index/index.h"
#include "engine/store.h"
#include "index/wal-sync.h"
#include "storage/dbox-file.h"
#include "storage/dbox-read.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
	assert_int_equal(dbox_save_seal(save, 1700000000), 0);
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
	assert_int_equal(dbox_save_seal(save, 1700000000), 0);
	assert_int_equal(dbox_save_seals(save), 1);
	/* A write undoes the seal; sealing again is counted. */
	assert_int_equal(dbox_save_write(save, "world\n", 6, 6), 0);
	assert_false(dbox_save_sealed(save));
	assert_int_equal(dbox_save_seal(save, 1700000000), 0);
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_seal_writes_record_not_index,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_sync_upto, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
