/*
 * test-rebuild.c: unit tests of rebuild (engine/rebuild.h) with cmocka, on
 * real stores in mkdtemp() directories: a store is made with the engine
 * (messages saved into INBOX and two folders, names with flags),
 * closed, damaged or not, rebuilt, and opened again to compare.
 *
 *   - an intact store keeps its names, flags (in the names), folders and
 *     inode numbers, and reads byte-exact;
 *   - with the index deleted, every message comes back from the B
 *     metadata of its record into the cur/ of its folder (.Sent, .A.B,
 *     a folder whose B is in modified UTF-7);
 *   - a record whose GUID field is damaged keeps its names, and the
 *     report names it (kind, m.N, offset, reason);
 *   - a torn tail (half a record at the end of an m.N) is copied to
 *     lost+found/ and reported, the messages before it are kept;
 *   - a store in use is refused (the lock), nothing changed.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "engine/rebuild.h"
#include "engine/store-layout.h"
#include "engine/store.h"
#include "index/index.h"
#include "storage/dbox-file.h"
#include "storage/dbox-read.h"
#include "storage/log.h"
#include "test-common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NMSG 6

struct msg {
	const char *dir;     /* folder directory ("" for INBOX) */
	const char *mailbox; /* B, as fs/ writes it */
	const char *name;    /* in cur/ */
	char body[200];
	uint64_t ino;
};

struct fix {
	char dir[64];
	char store[128];
	struct dbox_store *st;
	struct msg msgs[NMSG];
	struct dbox_rebuild_report rep;
};

static const struct {
	const char *dir, *mailbox, *name;
} layout[NMSG] = {
	{ "", "INBOX", "1600000000.a.host:2,S" },
	{ "", "INBOX", "1600000001.b.host:2,FS" },
	{ ".Sent", "Sent", "1600000002.c.host:2,RS" },
	{ ".A.B", "A/B", "1600000003.d.host:2," },
	{ ".A.B", "A/B", "1600000004.e.host:2,T" },
	/* The folder "Ärger.2024": B in modified UTF-7, '.' too. */
	{ ".&AMQ-rger&AC4-2024", "&AMQ-rger&AC4-2024", "1600000005.f.host:2,S" },
};

static void open_store(struct fix *f)
{
	struct dbox_store_settings set = { .rotate_size = 1 << 20,
					   .create = true };

	assert_null(f->st);
	assert_int_equal(dbox_store_open(f->store, &set, &f->st), 0);
}

/* The directory name in parent, made when missing. */
static uint64_t mkdir_in(struct fix *f, uint64_t parent, const char *name)
{
	struct dbox_attr attr;
	int ret = dbox_index_lookup(f->st->index, parent, name, strlen(name),
				    &attr);

	if (ret == -ENOENT)
		ret = dbox_index_create(f->st->index, parent, name,
					strlen(name), DBOX_KIND_DIR,
					S_IFDIR | 0700, getuid(), getgid(),
					dbox_now_ns(), &attr);
	assert_int_equal(ret, 0);
	return attr.ino;
}

/* The cur/ of folder dir ("" for the root), made with new/ and tmp/. */
static uint64_t folder_cur(struct fix *f, const char *dir)
{
	uint64_t folder = dir[0] == '\0' ? DBOX_ROOT_INO :
		mkdir_in(f, DBOX_ROOT_INO, dir);

	mkdir_in(f, folder, "new");
	mkdir_in(f, folder, "tmp");
	return mkdir_in(f, folder, "cur");
}

/* Save m into the cur/ of its folder in one transaction, as fs/ does. */
static void save_msg(struct fix *f, struct msg *m, time_t received)
{
	struct dbox_store *st = f->st;
	struct dbox_save *save = NULL;
	struct dbox_attr attr;
	struct dbox_msgloc loc;
	uint64_t cur;

	dbox_store_mutex_lock(st);
	assert_int_equal(dbox_index_begin(st->index), 0);
	cur = folder_cur(f, m->dir);
	assert_int_equal(dbox_index_create(st->index, cur, m->name,
					   strlen(m->name), DBOX_KIND_MESSAGE,
					   S_IFREG | 0600, getuid(), getgid(),
					   dbox_now_ns(), &attr), 0);
	m->ino = attr.ino;
	assert_int_equal(dbox_save_begin(st, m->ino, m->mailbox, &save), 0);
	assert_int_equal(dbox_save_write(save, m->body, strlen(m->body), 0), 0);
	assert_int_equal(dbox_save_finish(save, received, false, &loc), 0);
	attr.size = strlen(m->body);
	assert_int_equal(dbox_index_setattr(st->index, &attr), 0);
	assert_int_equal(dbox_index_commit(st->index, false), 0);
	dbox_save_free(&save);
	dbox_store_mutex_unlock(st);
}

/* A store with the messages of layout[], closed. */
static int fix_setup(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	dbox_log_set_sink(capture_sink);
	capture_level = DBOX_LOG_ERROR;
	errors_reset();
	tmpdir_make(f->dir, sizeof(f->dir), "test-rebuild");
	snprintf(f->store, sizeof(f->store), "%s/store", f->dir);
	open_store(f);
	for (size_t i = 0; i < NMSG; i++) {
		struct msg *m = &f->msgs[i];

		m->dir = layout[i].dir;
		m->mailbox = layout[i].mailbox;
		m->name = layout[i].name;
		snprintf(m->body, sizeof(m->body), "From: t@example.org\r\n"
			 "Subject: message %zu\r\n\r\nbody of %s\r\n", i,
			 m->name);
		save_msg(f, m, 1600000000 + (time_t)i);
	}
	dbox_store_close(&f->st);
	*state = f;
	return 0;
}

static int fix_teardown(void **state)
{
	struct fix *f = *state;

	dbox_rebuild_report_free(&f->rep);
	dbox_store_close(&f->st);
	rm_rf(f->dir);
	free(f);
	return 0;
}

static int rebuild(struct fix *f)
{
	struct dbox_rebuild_opts opts = { 0 };

	dbox_rebuild_report_free(&f->rep);
	return dbox_rebuild(f->store, &opts, &f->rep);
}

/* The entry name in parent of the reopened store, asserted to exist. */
static struct dbox_attr lookup(struct fix *f, uint64_t parent,
			       const char *name)
{
	struct dbox_attr attr;

	assert_int_equal(dbox_index_lookup(f->st->index, parent, name,
					   strlen(name), &attr), 0);
	return attr;
}

/* The cur/ of folder dir in the reopened store. */
static uint64_t cur_of(struct fix *f, const char *dir)
{
	uint64_t folder = dir[0] == '\0' ? DBOX_ROOT_INO :
		lookup(f, DBOX_ROOT_INO, dir).ino;

	assert_int_equal(lookup(f, folder, "new").kind, DBOX_KIND_DIR);
	assert_int_equal(lookup(f, folder, "tmp").kind, DBOX_KIND_DIR);
	return lookup(f, folder, "cur").ino;
}

/* Message ino of the reopened store reads as m's body. */
static void expect_body(struct fix *f, uint64_t ino, const struct msg *m)
{
	struct dbox_reader *reader = NULL;
	struct dbox_msgloc loc;
	size_t len = strlen(m->body);
	char buf[256];

	assert_int_equal(dbox_index_msg_get(f->st->index, ino, &loc), 0);
	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_store_open_reader(f->st, &loc, len, &reader), 0);
	dbox_store_mutex_unlock(f->st);
	assert_int_equal(dbox_reader_pread(reader, buf, sizeof(buf), 0),
			 (ssize_t)len);
	assert_memory_equal(buf, m->body, len);
	dbox_reader_free(&reader);
}

/* Every message under its old name and inode number, reading whole. */
static void expect_old_names(struct fix *f)
{
	for (size_t i = 0; i < NMSG; i++) {
		const struct msg *m = &f->msgs[i];
		struct dbox_attr attr = lookup(f, cur_of(f, m->dir), m->name);

		assert_int_equal(attr.ino, m->ino);
		assert_int_equal(attr.kind, DBOX_KIND_MESSAGE);
		assert_int_equal(attr.size, strlen(m->body));
		expect_body(f, attr.ino, m);
	}
}

/* The location of message m in the store (open). */
static struct dbox_msgloc loc_of(struct fix *f, const struct msg *m)
{
	struct dbox_msgloc loc;

	assert_int_equal(dbox_index_msg_get(f->st->index, m->ino, &loc), 0);
	return loc;
}

static char *store_path(const struct fix *f, const char *rel)
{
	char *path;

	assert_true(asprintf(&path, "%s/%s", f->store, rel) > 0);
	return path;
}

static char *mfile_path(const struct fix *f, uint32_t file_id)
{
	char name[16], rel[48];

	dbox_file_name(name, file_id);
	snprintf(rel, sizeof(rel), "%s/%s", DBOX_STORE_STORAGE, name);
	return store_path(f, rel);
}

static size_t count_notes(const struct fix *f, enum dbox_rebuild_note_kind k)
{
	size_t n = 0;

	for (size_t i = 0; i < f->rep.nnotes; i++)
		n += f->rep.notes[i].kind == k;
	return n;
}

/* --- tests ------------------------------------------------------------- */

static void test_intact_store_keeps_everything(void **state)
{
	struct fix *f = *state;

	assert_int_equal(rebuild(f), 0);
	assert_int_equal(f->rep.stage, DBOX_REBUILD_DONE);
	assert_int_equal(f->rep.kept, NMSG);
	assert_int_equal(f->rep.restored, 0);
	assert_int_equal(f->rep.expunged, 0);
	assert_int_equal(f->rep.lost_msgs, 0);
	assert_int_equal(f->rep.damaged_kept, 0);
	assert_int_equal(f->rep.nnotes, 0);
	assert_false(f->rep.old_damaged);
	assert_non_null(f->rep.old_index);
	assert_int_equal(strncmp(f->rep.old_index, DBOX_STORE_INDEX ".broken-",
				 strlen(DBOX_STORE_INDEX ".broken-")), 0);
	open_store(f);
	expect_old_names(f);
}

/* readdir callback: every entry of a cur/ rebuilt from the m.N alone is a
   message named "<received>.G<GUID>.rebuild:2,"; their inode numbers. */
static int entry_cb(void *ctx, const struct dbox_dirent *ent)
{
	const char *name = ent->name;
	size_t namelen = ent->namelen;
	const struct dbox_attr *attr = &ent->attr;
	struct { uint64_t inos[NMSG]; size_t n; } *seen = ctx;
	const char *suffix = ".rebuild:2,";
	size_t slen = strlen(suffix);

	assert_true(namelen > slen);
	assert_memory_equal(name + namelen - slen, suffix, slen);
	assert_int_equal(attr->kind, DBOX_KIND_MESSAGE);
	assert_true(seen->n < NMSG);
	seen->inos[seen->n++] = attr->ino;
	return 0;
}

static void test_deleted_index_restores_into_folders(void **state)
{
	static const char *const aux[] = { "", "-wal", "-shm" };
	struct fix *f = *state;

	for (size_t i = 0; i < 3; i++) {
		char *path, rel[32];

		snprintf(rel, sizeof(rel), DBOX_STORE_INDEX "%s", aux[i]);
		path = store_path(f, rel);
		unlink(path);
		free(path);
	}
	assert_int_equal(rebuild(f), 0);
	assert_int_equal(f->rep.stage, DBOX_REBUILD_DONE);
	assert_null(f->rep.old_index);
	assert_int_equal(f->rep.kept, 0);
	assert_int_equal(f->rep.restored, NMSG);
	assert_int_equal(f->rep.expunged, 0);
	open_store(f);
	/* Each message in the cur/ of the folder its B names, once. */
	for (size_t i = 0; i < NMSG; i++) {
		const struct msg *m = &f->msgs[i];
		struct { uint64_t inos[NMSG]; size_t n; } seen = { .n = 0 };
		bool found = false;

		assert_int_equal(dbox_index_readdir(f->st->index,
						    cur_of(f, m->dir), 0,
						    entry_cb, &seen), 0);
		for (size_t k = 0; k < seen.n && !found; k++) {
			struct dbox_msgloc loc;
			struct dbox_reader *reader = NULL;
			char buf[256];
			ssize_t n;

			assert_int_equal(dbox_index_msg_get(f->st->index,
							    seen.inos[k],
							    &loc), 0);
			dbox_store_mutex_lock(f->st);
			assert_int_equal(dbox_store_open_reader(f->st, &loc,
				strlen(m->body), &reader), 0);
			dbox_store_mutex_unlock(f->st);
			n = dbox_reader_pread(reader, buf, sizeof(buf), 0);
			found = n == (ssize_t)strlen(m->body) &&
				memcmp(buf, m->body, (size_t)n) == 0;
			dbox_reader_free(&reader);
		}
		assert_true(found);
	}
	/* A Maildir++ folder gets its maildirfolder file. */
	assert_int_equal(lookup(f, lookup(f, DBOX_ROOT_INO, ".A.B").ino,
				"maildirfolder").kind, DBOX_KIND_FILE);
	assert_int_equal(lookup(f, lookup(f, DBOX_ROOT_INO, ".Sent").ino,
				"maildirfolder").kind, DBOX_KIND_FILE);
}

static void test_damaged_guid_is_kept_and_reported(void **state)
{
	struct fix *f = *state;
	const struct msg *m = &f->msgs[2];
	struct dbox_msgloc loc;
	struct stat sb;
	char *path, *data, *at;
	int fd;

	open_store(f);
	loc = loc_of(f, m);
	dbox_store_close(&f->st);
	/* Change one hex digit of the record's GUID in its metadata. */
	path = mfile_path(f, loc.file_id);
	assert_true((fd = open(path, O_RDWR)) >= 0);
	assert_int_equal(fstat(fd, &sb), 0);
	assert_non_null(data = malloc((size_t)sb.st_size));
	assert_int_equal(pread(fd, data, (size_t)sb.st_size, 0), sb.st_size);
	at = memmem(data + loc.offset, (size_t)sb.st_size - loc.offset,
		    loc.guid, strlen(loc.guid));
	assert_non_null(at);
	*at = *at == '0' ? '1' : '0';
	assert_int_equal(pwrite(fd, at, 1, at - data), 1);
	close(fd);
	free(data);
	free(path);

	assert_int_equal(rebuild(f), 0);
	assert_int_equal(f->rep.kept, NMSG);
	assert_int_equal(f->rep.damaged_kept, 1);
	assert_int_equal(f->rep.restored, 0);
	assert_int_equal(count_notes(f, DBOX_REBUILD_NOTE_DAMAGED_FIELD), 1);
	for (size_t i = 0; i < f->rep.nnotes; i++) {
		const struct dbox_rebuild_note *n = &f->rep.notes[i];

		if (n->kind != DBOX_REBUILD_NOTE_DAMAGED_FIELD)
			continue;
		assert_int_equal(n->file_id, loc.file_id);
		assert_int_equal(n->fault.offset, loc.offset);
		assert_string_equal(n->fault.reason, "damaged GUID field");
		assert_non_null(strstr(n->text, loc.guid));
	}
	open_store(f);
	/* Its names, inode number and bytes; the others untouched. */
	expect_old_names(f);
}

static void test_torn_tail_goes_to_lost_found(void **state)
{
	struct fix *f = *state;
	const struct msg *m = &f->msgs[NMSG - 1];
	struct dbox_msgloc loc;
	char torn[64], copy[64], got[64], *path, *lf;
	struct stat sb;
	int fd;

	open_store(f);
	loc = loc_of(f, m);
	dbox_store_close(&f->st);
	/* The first bytes of the last record again at the end: half a
	   record, as a save cut by a crash leaves. */
	path = mfile_path(f, loc.file_id);
	assert_true((fd = open(path, O_RDWR)) >= 0);
	assert_int_equal(fstat(fd, &sb), 0);
	assert_int_equal(pread(fd, torn, sizeof(torn), (off_t)loc.offset),
			 (ssize_t)sizeof(torn));
	assert_int_equal(pwrite(fd, torn, sizeof(torn), sb.st_size),
			 (ssize_t)sizeof(torn));
	close(fd);
	free(path);

	assert_int_equal(rebuild(f), 0);
	assert_int_equal(f->rep.kept, NMSG);
	assert_int_equal(f->rep.lost_found_copies, 1);
	assert_int_equal(count_notes(f, DBOX_REBUILD_NOTE_BAD_BYTES), 1);
	snprintf(copy, sizeof(copy), "m.%u-%lld", loc.file_id,
		 (long long)sb.st_size);
	for (size_t i = 0; i < f->rep.nnotes; i++) {
		if (f->rep.notes[i].kind != DBOX_REBUILD_NOTE_BAD_BYTES)
			continue;
		assert_string_equal(f->rep.notes[i].copy, copy);
		assert_int_equal(f->rep.notes[i].fault.offset,
				 (uint64_t)sb.st_size);
	}
	assert_true(asprintf(&lf, "%s/%s/%s", f->store, DBOX_STORE_LOST_FOUND,
			     copy) > 0);
	assert_true((fd = open(lf, O_RDONLY)) >= 0);
	assert_int_equal(read(fd, got, sizeof(got)), (ssize_t)sizeof(torn));
	assert_memory_equal(got, torn, sizeof(torn));
	close(fd);
	free(lf);
	open_store(f);
	expect_old_names(f);
}

static void test_store_in_use_is_refused(void **state)
{
	struct fix *f = *state;
	struct stat before, after;
	char *index = store_path(f, DBOX_STORE_INDEX);

	open_store(f);
	assert_int_equal(stat(index, &before), 0);
	assert_int_equal(rebuild(f), -EBUSY);
	assert_int_equal(f->rep.stage, DBOX_REBUILD_LOCK);
	assert_null(f->rep.old_index);
	assert_int_equal(stat(index, &after), 0);
	assert_int_equal(before.st_ino, after.st_ino);
	free(index);
	expect_old_names(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_intact_store_keeps_everything,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_deleted_index_restores_into_folders,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_damaged_guid_is_kept_and_reported,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_torn_tail_goes_to_lost_found,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_store_in_use_is_refused,
						fix_setup, fix_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
