/*
 * test-purge.c: unit tests of purge (engine/purge.h) with cmocka, on real
 * stores in mkdtemp() directories: space of expunged messages comes back
 * (byte counts from the files and the index), live messages read
 * byte-exact afterwards with the same inode attributes, every m.N still
 * walks as valid dbox listing each live GUID once, a reader opened before
 * the purge reads the same bytes after it, changes made while records
 * are being copied win, the threshold is honoured, a file a save owns is
 * left alone, and a crash before or after the switch loses nothing.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "index/index-purge.h"
#include "index/index.h"
#include "engine/purge.h"
#include "engine/store.h"
#include "storage/dbox-file.h"
#include "storage/dbox-format.h"
#include "storage/dbox-read.h"
#include "storage/log.h"
#include "test-common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* --- helpers ---------------------------------------------------------- */

#define NMSG 12
#define ROTATE 6000

struct msg {
	uint64_t ino;
	char name[32];
	char *body;
	size_t len;
	time_t received;
	bool expunged;
};

struct fix {
	char dir[64];
	char store[128];
	struct dbox_store *st;
	uint64_t cur;
	struct msg msgs[NMSG];
};

static void open_store(struct fix *f)
{
	struct dbox_store_settings set = { .rotate_size = ROTATE,
					   .create = true };

	assert_null(f->st);
	assert_int_equal(dbox_store_open(f->store, &set, &f->st), 0);
}

/* Deterministic text of len bytes with LF and CRLF line ends. */
static char *make_body(unsigned int seed, size_t len)
{
	char *buf = malloc(len + 1);
	uint64_t x = 0x9e3779b97f4a7c15ULL ^ (seed * 7919u);

	assert_non_null(buf);
	for (size_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		buf[i] = x % 19 == 0 ? '\n' : x % 37 == 0 ? '\r' :
			(char)('a' + x % 26);
	}
	buf[len] = '\0';
	return buf;
}

/* Save m as cur/<name> in one transaction, as fs/ does. */
static void save_msg(struct fix *f, struct msg *m)
{
	struct dbox_store *st = f->st;
	struct dbox_save *save = NULL;
	struct dbox_attr attr;
	struct dbox_msgloc loc;

	dbox_store_mutex_lock(st);
	assert_int_equal(dbox_index_begin(st->index), 0);
	assert_int_equal(dbox_index_create(st->index, f->cur, m->name,
					   strlen(m->name), DBOX_KIND_MESSAGE,
					   S_IFREG | 0600, getuid(), getgid(),
					   dbox_now_ns(), &attr), 0);
	m->ino = attr.ino;
	assert_int_equal(dbox_save_begin(st, m->ino, "INBOX", &save), 0);
	assert_int_equal(dbox_save_write(save, m->body, m->len, 0), 0);
	assert_int_equal(dbox_save_finish(save, m->received, false, &loc), 0);
	attr.size = m->len;
	attr.mtime_ns = (int64_t)m->received * 1000000000;
	assert_int_equal(dbox_index_setattr(st->index, &attr), 0);
	assert_int_equal(dbox_index_commit(st->index, false), 0);
	dbox_save_free(&save);
	dbox_store_mutex_unlock(st);
}

/* A store with NMSG messages of 900..2000 bytes over several m.N. */
static int fix_setup(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));
	struct dbox_attr attr;

	assert_non_null(f);
	dbox_log_set_sink(capture_sink);
	tmpdir_make(f->dir, sizeof(f->dir), "test-purge");
	snprintf(f->store, sizeof(f->store), "%s/store", f->dir);
	open_store(f);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_index_create(f->st->index, DBOX_ROOT_INO, "cur",
					   3, DBOX_KIND_DIR, S_IFDIR | 0700,
					   getuid(), getgid(), dbox_now_ns(),
					   &attr), 0);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	f->cur = attr.ino;
	for (unsigned int i = 0; i < NMSG; i++) {
		struct msg *m = &f->msgs[i];

		m->len = 900 + (i * 337) % 1100;
		m->body = make_body(i + 1, m->len);
		m->received = 1600000000 + (time_t)i * 3600;
		snprintf(m->name, sizeof(m->name), "%u.M%uP1.host:2,S", i, i);
		save_msg(f, m);
	}
	*state = f;
	return 0;
}

static int fix_teardown(void **state)
{
	struct fix *f = *state;

	dbox_store_close(&f->st);
	rm_rf(f->dir);
	for (unsigned int i = 0; i < NMSG; i++)
		free(f->msgs[i].body);
	free(f);
	return 0;
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
	assert_int_equal(ino, m->ino);
	assert_int_equal(nlink, 0);
	assert_int_equal(dbox_index_delete_inode(st->index, ino), 0);
	assert_int_equal(dbox_index_commit(st->index, false), 0);
	dbox_store_mutex_unlock(st);
	m->expunged = true;
}

static struct dbox_msgloc loc_of(struct fix *f, const struct msg *m)
{
	struct dbox_msgloc loc;

	assert_int_equal(dbox_index_msg_get(f->st->index, m->ino, &loc), 0);
	return loc;
}

static void open_reader(struct fix *f, const struct msg *m,
			struct dbox_reader **reader_r)
{
	struct dbox_msgloc loc = loc_of(f, m);

	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_store_open_reader(f->st, &loc, m->len,
						reader_r), 0);
	dbox_store_mutex_unlock(f->st);
}

static void expect_bytes(struct dbox_reader *reader, const struct msg *m)
{
	char *buf = malloc(m->len + 16);

	assert_non_null(buf);
	assert_int_equal(dbox_reader_pread(reader, buf, m->len + 16, 0),
			 (ssize_t)m->len);
	assert_memory_equal(buf, m->body, m->len);
	free(buf);
}

/* Every live message reads byte-exact with its inode attributes intact;
   expunged ones are gone. */
static void expect_messages(struct fix *f)
{
	for (unsigned int i = 0; i < NMSG; i++) {
		struct msg *m = &f->msgs[i];
		struct dbox_reader *reader = NULL;
		struct dbox_attr attr;

		if (m->expunged) {
			assert_int_equal(dbox_index_getattr(f->st->index,
							    m->ino, &attr),
					 -ENOENT);
			continue;
		}
		assert_int_equal(dbox_index_lookup(f->st->index, f->cur,
						   m->name, strlen(m->name),
						   &attr), 0);
		assert_int_equal(attr.ino, m->ino);
		assert_int_equal(attr.size, m->len);
		assert_int_equal(attr.mtime_ns,
				 (int64_t)m->received * 1000000000);
		assert_int_equal(attr.nlink, 1);
		open_reader(f, m, &reader);
		expect_bytes(reader, m);
		dbox_reader_free(&reader);
	}
}

static int64_t file_size(const struct fix *f, uint32_t file_id)
{
	char path[256];
	struct stat sb;

	snprintf(path, sizeof(path), "%s/storage/m.%u", f->store, file_id);
	return stat(path, &sb) < 0 ? -1 : (int64_t)sb.st_size;
}

/* Length of the header line of m.<file_id>. */
static uint64_t header_len(const struct fix *f, uint32_t file_id)
{
	char path[256];
	size_t len;
	int fd;

	snprintf(path, sizeof(path), "%s/storage/m.%u", f->store, file_id);
	fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(dbox_file_read_header(fd, &len), 0);
	close(fd);
	return len;
}

/* Bytes of every m.* file in storage/. */
static uint64_t storage_bytes(const struct fix *f)
{
	char path[256];
	struct dirent *de;
	struct stat sb;
	uint64_t total = 0;
	DIR *dir;

	snprintf(path, sizeof(path), "%s/storage", f->store);
	assert_non_null(dir = opendir(path));
	while ((de = readdir(dir)) != NULL) {
		if (strncmp(de->d_name, "m.", 2) != 0)
			continue;
		assert_int_equal(fstatat(dirfd(dir), de->d_name, &sb, 0), 0);
		total += (uint64_t)sb.st_size;
	}
	closedir(dir);
	return total;
}

/* Per file: bytes on disk, committed end, live bytes, header. */
struct usage_sum {
	const struct fix *f;
	uint64_t disk, live, dead, files;
};

static int usage_cb(void *ctx, const struct dbox_file_usage *u)
{
	struct usage_sum *s = ctx;
	size_t header_len;
	struct stat sb;
	int fd;

	/* Wherever it lives: storage/ or the alternate storage. */
	fd = dbox_store_mfile_open(s->f->st, u->file_id, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(dbox_file_read_header(fd, &header_len), 0);
	assert_int_equal(fstat(fd, &sb), 0);
	close(fd);
	assert_int_equal(sb.st_size, (int64_t)u->committed);
	s->disk += u->committed;
	s->live += u->live_bytes;
	s->dead += u->committed - header_len - u->live_bytes;
	s->files++;
	return 0;
}

static struct usage_sum usage(struct fix *f)
{
	struct usage_sum s = { .f = f };

	dbox_store_mutex_lock(f->st); /* usage_cb opens m.N files */
	assert_int_equal(dbox_index_file_usage_all(f->st->index, usage_cb, &s),
			 0);
	dbox_store_mutex_unlock(f->st);
	return s;
}

/* GUIDs of the records of one m.N (walk). */
struct guids {
	char guid[NMSG * 4][DBOX_GUID_HEX_LEN * 2 + 1];
	unsigned int count;
};

static int guid_cb(void *ctx, uint64_t offset, uint64_t body_size,
		   const struct dbox_metadata *md, uint64_t record_size)
{
	struct guids *g = ctx;

	(void)offset;
	(void)body_size;
	(void)record_size;
	assert_true(g->count < NMSG * 4);
	snprintf(g->guid[g->count++], sizeof(g->guid[0]), "%s", md->guid);
	return 0;
}

struct walk_all {
	struct fix *f;
	struct guids g;
};

static int walk_file_cb(void *ctx, uint32_t file_id, uint64_t size)
{
	struct walk_all *w = ctx;
	char path[256];
	int fd;

	(void)size;
	(void)path;
	/* Wherever it lives: storage/ or the alternate storage. */
	fd = dbox_store_mfile_open(w->f->st, file_id, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(dbox_file_walk(fd, file_id, guid_cb, &w->g, NULL), 0);
	close(fd);
	return 0;
}

/* After a full purge, the m.N files hold each live GUID exactly once and
   nothing else. */
static void expect_guids_once(struct fix *f)
{
	struct walk_all w = { .f = f };
	unsigned int live = 0;

	dbox_store_mutex_lock(f->st); /* walk_file_cb opens m.N files */
	assert_int_equal(dbox_index_mfile_list(f->st->index, walk_file_cb, &w),
			 0);
	dbox_store_mutex_unlock(f->st);
	for (unsigned int i = 0; i < NMSG; i++) {
		unsigned int seen = 0;
		struct dbox_msgloc loc;

		if (f->msgs[i].expunged)
			continue;
		live++;
		loc = loc_of(f, &f->msgs[i]);
		for (unsigned int j = 0; j < w.g.count; j++)
			seen += strcmp(w.g.guid[j], loc.guid) == 0;
		assert_int_equal(seen, 1);
	}
	assert_int_equal(w.g.count, live);
}

/* --- tests ------------------------------------------------------------ */

static void test_purge_reclaims(void **state)
{
	struct fix *f = *state;
	struct dbox_purge_settings set = { .threshold = 0 };
	struct dbox_purge_result res;
	struct usage_sum before, after;
	uint64_t expunged_bytes = 0, removed_bytes = 0, disk_before;
	uint64_t headers_before, headers_after;
	uint64_t moved_bytes = 0, moved = 0;
	struct dbox_msgloc old_loc[NMSG];
	uint32_t max_before;

	assert_int_equal(usage(f).dead, 0);
	for (unsigned int i = 0; i < NMSG; i++)
		old_loc[i] = loc_of(f, &f->msgs[i]);
	for (unsigned int i = 0; i < NMSG; i += 3) {
		expunged_bytes += loc_of(f, &f->msgs[i]).record_size;
		expunge(f, &f->msgs[i]);
	}
	before = usage(f);
	disk_before = storage_bytes(f);
	assert_int_equal(disk_before, before.disk);
	assert_true(before.files >= 3);
	assert_int_equal(before.dead, expunged_bytes);
	assert_int_equal(dbox_index_mfile_max(f->st->index, &max_before), 0);
	int64_t sizes[max_before + 1];
	for (uint32_t id = 1; id <= max_before; id++)
		sizes[id] = file_size(f, id);

	assert_int_equal(dbox_purge(f->st, &set, &res), 0);
	after = usage(f);
	assert_int_equal(res.files_failed, 0);
	assert_int_equal(res.files_busy, 0);
	assert_int_equal(res.records_dropped, 0);
	assert_true(res.files_purged > 0);
	assert_int_equal(after.dead, 0);
	assert_int_equal(after.live, before.live);
	/* The files on disk (all of storage/, not just what the index
	   knows) shrank by exactly the expunged records and the headers of
	   the files removed, less the headers of files created. */
	headers_before = before.disk - before.live - before.dead;
	headers_after = after.disk - after.live;
	assert_int_equal(storage_bytes(f), after.disk);
	assert_int_equal(disk_before - storage_bytes(f),
			 expunged_bytes + headers_before - headers_after);
	for (uint32_t id = 1; id <= max_before; id++) {
		uint64_t end;

		/* A purged file is gone from the disk and the index. */
		if (dbox_index_mfile_get(f->st->index, id, &end) == -ENOENT) {
			assert_int_equal(file_size(f, id), -1);
			removed_bytes += (uint64_t)sizes[id];
		} else {
			assert_int_equal(file_size(f, id), sizes[id]);
		}
	}
	assert_int_equal(res.bytes_freed, removed_bytes);
	/* Moved: exactly the live records of the files removed. */
	for (unsigned int i = 0; i < NMSG; i++) {
		uint64_t end;

		if (!f->msgs[i].expunged &&
		    dbox_index_mfile_get(f->st->index, old_loc[i].file_id,
					 &end) == -ENOENT) {
			moved_bytes += old_loc[i].record_size;
			moved++;
		}
	}
	assert_int_equal(res.bytes_moved, moved_bytes);
	assert_int_equal(res.records_moved, moved);
	expect_messages(f);
	expect_guids_once(f);

	/* Nothing left to do: a second purge changes nothing. */
	assert_int_equal(dbox_purge(f->st, &set, &res), 0);
	assert_int_equal(res.files_purged, 0);
	assert_int_equal(res.records_moved, 0);

	/* And it all survives a reopen (recovery cuts nothing). */
	dbox_store_close(&f->st);
	open_store(f);
	assert_int_equal(storage_bytes(f), after.disk);
	expect_messages(f);
}

static void test_reader_survives(void **state)
{
	struct fix *f = *state;
	struct dbox_purge_settings set = { .threshold = 0 };
	struct dbox_purge_result res;
	struct dbox_reader *reader = NULL;
	struct msg *m = &f->msgs[1];
	uint32_t old_file = loc_of(f, m).file_id;

	expunge(f, &f->msgs[0]);
	open_reader(f, m, &reader);
	assert_int_equal(dbox_purge(f->st, &set, &res), 0);
	assert_int_equal(res.files_failed, 0);
	/* The file the reader was opened on is gone; the reader is not. */
	assert_int_equal(file_size(f, old_file), -1);
	assert_int_not_equal(loc_of(f, m).file_id, old_file);
	expect_bytes(reader, m);
	dbox_reader_free(&reader);
	expect_messages(f);
}

/* The hook runs between the copy and the switch, as a client of the
   mount would: expunge one message of the file being purged and set the
   received date (mtime, R) of another. */
struct hook {
	struct fix *f;
	uint32_t file_id;
	struct msg *expunge, *retime;
	time_t new_received;
	unsigned int calls;
};

static void hook_cb(void *ctx, uint32_t file_id)
{
	struct hook *h = ctx;
	struct dbox_store *st = h->f->st;
	struct dbox_msgloc loc;
	struct dbox_attr attr;

	if (file_id != h->file_id)
		return;
	h->calls++;
	expunge(h->f, h->expunge);
	dbox_store_mutex_lock(st);
	assert_int_equal(dbox_index_getattr(st->index, h->retime->ino, &attr),
			 0);
	attr.mtime_ns = (int64_t)h->new_received * 1000000000;
	assert_int_equal(dbox_index_begin(st->index), 0);
	assert_int_equal(dbox_index_setattr(st->index, &attr), 0);
	assert_int_equal(dbox_index_commit(st->index, false), 0);
	assert_int_equal(dbox_index_msg_get(st->index, h->retime->ino, &loc),
			 0);
	assert_int_equal(dbox_store_set_received(st, &loc, h->new_received),
			 0);
	dbox_store_mutex_unlock(st);
	h->retime->received = h->new_received;
}

static void test_changes_during_copy(void **state)
{
	struct fix *f = *state;
	struct hook h = { .f = f, .new_received = 1650000000 };
	struct dbox_purge_settings set = { .threshold = 0,
					   .after_copy = hook_cb,
					   .hook_ctx = &h };
	struct dbox_purge_result res;
	struct dbox_msgloc loc;
	struct dbox_metadata md = { 0 };
	uint64_t body_size, record_size;
	char path[256];
	int fd;

	/* msgs 0..2 share m.1 (sizes 900, 1237, 1574 under ROTATE). */
	h.file_id = loc_of(f, &f->msgs[0]).file_id;
	assert_int_equal(loc_of(f, &f->msgs[1]).file_id, h.file_id);
	assert_int_equal(loc_of(f, &f->msgs[2]).file_id, h.file_id);
	expunge(f, &f->msgs[0]);
	h.expunge = &f->msgs[1];
	h.retime = &f->msgs[2];
	set.only = &h.file_id;
	set.only_count = 1;
	assert_int_equal(dbox_purge(f->st, &set, &res), 0);
	assert_int_equal(h.calls, 1);
	assert_int_equal(res.files_purged, 1);
	assert_int_equal(res.records_dropped, 1);  /* expunged meanwhile */
	assert_true(res.records_moved >= 1);
	assert_int_equal(file_size(f, h.file_id), -1);
	expect_messages(f);

	/* The copy carries the received date set during the copy. */
	loc = loc_of(f, h.retime);
	snprintf(path, sizeof(path), "%s/storage/m.%u", f->store, loc.file_id);
	fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(dbox_record_read(fd, loc.file_id, loc.offset,
					  loc.body_size, &body_size, &md,
					  &record_size), 0);
	close(fd);
	assert_int_equal(md.received, h.new_received);
	assert_string_equal(md.guid, loc.guid);
	dbox_metadata_clear(&md);
}

static void test_threshold(void **state)
{
	struct fix *f = *state;
	struct dbox_purge_settings set = { 0 };
	struct dbox_purge_result res;
	struct dbox_file_usage u;
	uint32_t file_id = loc_of(f, &f->msgs[0]).file_id;
	unsigned int share;
	uint64_t data;

	/* One of the file's records dead: its share of the file. */
	expunge(f, &f->msgs[0]);
	assert_int_equal(dbox_index_file_usage(f->st->index, file_id, &u), 0);
	data = u.committed - header_len(f, file_id);
	share = (unsigned int)((data - u.live_bytes) * 100 / data);
	assert_true(share > 5 && share < 50);
	set.only = &file_id;
	set.only_count = 1;
	set.threshold = share + 1;
	assert_int_equal(dbox_purge(f->st, &set, &res), 0);
	assert_int_equal(res.files_purged, 0);
	assert_true(file_size(f, file_id) > 0);
	set.threshold = share;
	assert_int_equal(dbox_purge(f->st, &set, &res), 0);
	assert_int_equal(res.files_purged, 1);
	assert_int_equal(file_size(f, file_id), -1);
	expect_messages(f);
}

static void test_busy_file_left_alone(void **state)
{
	struct fix *f = *state;
	struct dbox_purge_settings set = { .threshold = 0 };
	struct dbox_purge_result res;
	struct msg *last = &f->msgs[NMSG - 1];
	uint32_t pool_file = loc_of(f, last).file_id;
	struct dbox_save *save = NULL;
	struct dbox_msgloc loc;
	struct dbox_attr attr;
	uint64_t end;

	/* Expunge the last message; then a delivery starts in the same
	   (pool) file and is still being written during the purge. */
	expunge(f, last);
	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_index_create(f->st->index, f->cur, "new1", 4,
					   DBOX_KIND_MESSAGE, S_IFREG | 0600,
					   getuid(), getgid(), dbox_now_ns(),
					   &attr), 0);
	assert_int_equal(dbox_save_begin(f->st, attr.ino, "INBOX", &save), 0);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	dbox_save_where(save, &loc);
	dbox_store_mutex_unlock(f->st);
	assert_int_equal(loc.file_id, pool_file);
	assert_int_equal(dbox_save_write(save, "Subject: x\n\nbody\n", 17, 0),
			 0);

	assert_int_equal(dbox_purge(f->st, &set, &res), 0);
	assert_int_equal(res.files_busy, 1);
	assert_true(file_size(f, pool_file) > 0);
	assert_int_equal(dbox_index_mfile_get(f->st->index, pool_file, &end),
			 0);

	/* The delivery ends; now the file can be purged. */
	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_save_finish(save, 1600000000, false, &loc), 0);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	dbox_save_free(&save);
	dbox_store_mutex_unlock(f->st);
	assert_int_equal(dbox_purge(f->st, &set, &res), 0);
	assert_int_equal(res.files_purged, 1);
	assert_int_equal(file_size(f, pool_file), -1);
	assert_int_equal(res.files_busy, 0);
	assert_int_equal(usage(f).dead, 0);
	expect_messages(f);
}

/* Entries of STORE/lost+found/ (0 when there is none). */
static int lost_found_count(const struct fix *f)
{
	char path[300];
	struct dirent *d;
	int n = 0;
	DIR *dir;

	snprintf(path, sizeof(path), "%s/lost+found", f->store);
	if ((dir = opendir(path)) == NULL)
		return 0;
	while ((d = readdir(dir)) != NULL)
		n += d->d_name[0] != '.';
	closedir(dir);
	return n;
}

static void crash_hook(void *ctx, uint32_t file_id)
{
	(void)ctx;
	(void)file_id;
	_exit(0); /* a crash: no cleanup, nothing switched */
}

static void test_crash_before_switch(void **state)
{
	struct fix *f = *state;
	struct dbox_purge_settings set = { .threshold = 0,
					   .after_copy = crash_hook };
	struct dbox_purge_result res;
	struct usage_sum before;
	int status;
	pid_t pid;

	expunge(f, &f->msgs[4]);
	before = usage(f);
	/* The index connection must not cross fork(); the child opens its
	   own store after the parent closed its. */
	dbox_store_close(&f->st);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct dbox_store *st = NULL;
		struct dbox_store_settings ss = { .rotate_size = ROTATE };

		if (dbox_store_open(f->store, &ss, &st) < 0)
			_exit(2);
		dbox_purge(st, &set, &res);
		_exit(3); /* the hook never ran */
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);

	/* Recovery cuts the copies; the index never switched (a pool file
	   the purge created may stay, as an empty m.N).  They repeat live
	   messages: no copy of them in lost+found/ (helper-92). */
	open_store(f);
	assert_int_equal(lost_found_count(f), 0);
	assert_int_equal(usage(f).live, before.live);
	assert_int_equal(usage(f).dead, before.dead);
	assert_int_equal(storage_bytes(f), usage(f).disk);
	expect_messages(f);
	set.after_copy = NULL;
	assert_int_equal(dbox_purge(f->st, &set, &res), 0);
	assert_int_equal(usage(f).dead, 0);
	expect_messages(f);
	expect_guids_once(f);
}

/* purged.m.<file_id> = ino in the index of the closed store: what a
   purge killed between its switch and its unlink leaves. */
static void set_purged_mark(struct fix *f, uint32_t file_id, uint64_t ino)
{
	struct dbox_index *index = NULL;
	char path[300];

	snprintf(path, sizeof(path), "%s/index.sqlite", f->store);
	assert_int_equal(dbox_index_open(path, false, &index), 0);
	assert_int_equal(dbox_index_begin(index), 0);
	assert_int_equal(dbox_store_purged_mark(index, file_id, ino), 0);
	assert_int_equal(dbox_index_commit(index, true), 0);
	dbox_index_close(&index);
}

static void test_crash_after_switch(void **state)
{
	struct fix *f = *state;
	struct dbox_purge_settings set = { .threshold = 0 };
	struct dbox_purge_result res;
	uint32_t file_id = loc_of(f, &f->msgs[0]).file_id;
	char path[256], link[300], copy[300], cmd[1200];
	struct stat sb;
	char key[32];
	int64_t mark = -1;
	int64_t size = file_size(f, file_id);

	/* A crash after the switch committed but before the unlink leaves
	   the old m.N behind, unknown to the index: make that state by
	   keeping a second name of the old file across a purge (and a copy
	   of its bytes, another inode, for the second half). */
	snprintf(path, sizeof(path), "%s/storage/m.%u", f->store, file_id);
	snprintf(link, sizeof(link), "%s/old-m", f->dir);
	snprintf(copy, sizeof(copy), "%s/old-m-copy", f->dir);
	snprintf(cmd, sizeof(cmd), "ln %s %s && cp %s %s", path, link, path,
		 copy);
	assert_int_equal(system(cmd), 0);
	expunge(f, &f->msgs[0]);
	assert_int_equal(dbox_purge(f->st, &set, &res), 0);
	assert_int_equal(file_size(f, file_id), -1);
	/* Unlinked: the mark no longer names an inode (the number may be
	   handed out again, to a file that must not be taken for it). */
	snprintf(key, sizeof(key), "purged.m.%u", file_id);
	assert_int_equal(dbox_index_meta_get(f->st->index, key, &mark), 0);
	assert_int_equal(mark, 0);
	dbox_store_close(&f->st);
	assert_int_equal(rename(link, path), 0);
	assert_int_equal(file_size(f, file_id), size);
	/* The purge forgot the mark after its unlink; a kill before the
	   unlink leaves it naming the file's inode. */
	assert_int_equal(stat(path, &sb), 0);
	set_purged_mark(f, file_id, (uint64_t)sb.st_ino);

	/* Recovery removes the very file the purge forgot (purged.m.N holds
	   its inode number); every message is intact. */
	open_store(f);
	assert_int_equal(file_size(f, file_id), -1);
	expect_messages(f);
	expect_guids_once(f);

	/* Once removed, the mark is forgotten: a file of that number later
	   (another inode, or that inode number handed out again: a copy
	   restored from elsewhere, another store's ALT) may hold the only
	   copy of mail, and recovery and purge keep it whole. */
	dbox_store_close(&f->st);
	assert_int_equal(rename(copy, path), 0);
	/* Even with a mark left naming the old inode (a kill between an
	   unlink and the forgetting), a file of another inode is not it. */
	set_purged_mark(f, file_id, (uint64_t)sb.st_ino);
	open_store(f);
	assert_int_equal(file_size(f, file_id), size);
	assert_int_equal(dbox_purge(f->st, &set, &res), 0);
	assert_int_equal(res.garbage_files, 0);
	assert_int_equal(file_size(f, file_id), size);
	expect_messages(f);
}

/* --- alternate storage (altmove) ---------------------------------------- */

/* Reopen the store with the alternate storage DIR/alt (made here). */
static void open_with_alt(struct fix *f, char *alt, size_t size)
{
	struct dbox_store_settings set = { .rotate_size = ROTATE,
					   .alt_path = alt };

	snprintf(alt, size, "%s/alt", f->dir);
	if (mkdir(alt, 0700) < 0)
		assert_int_equal(errno, EEXIST);
	dbox_store_close(&f->st);
	assert_int_equal(dbox_store_open(f->store, &set, &f->st), 0);
	assert_true(f->st->alt_fd >= 0);
}

/* Is m's m.N in the alternate storage? */
static bool in_alt(struct fix *f, const struct msg *m)
{
	uint64_t size;
	bool alt;

	assert_int_equal(dbox_index_mfile_where(f->st->index,
						loc_of(f, m).file_id, &size,
						&alt), 0);
	return alt;
}

static struct dbox_purge_settings altmove_set(const struct fix *f)
{
	/* The first half is older than the cutoff. */
	return (struct dbox_purge_settings){
		.altmove = true,
		.altmove_before_ns = (int64_t)f->msgs[NMSG / 2].received *
			1000000000,
	};
}

static void test_altmove_moves_old(void **state)
{
	struct fix *f = *state;
	struct dbox_purge_settings set = altmove_set(f);
	struct dbox_purge_result res, purged;
	char alt[128];

	expunge(f, &f->msgs[1]);
	open_with_alt(f, alt, sizeof(alt));
	assert_int_equal(dbox_altmove(f->st, &set, &res, &purged), 0);
	assert_int_equal(res.records_moved, NMSG / 2 - 1);
	for (unsigned int i = 0; i < NMSG; i++)
		if (!f->msgs[i].expunged)
			assert_true(in_alt(f, &f->msgs[i]) == (i < NMSG / 2));
	/* The files left partly dead were purged: nothing dead, each GUID
	   once, in either storage. */
	assert_int_equal(usage(f).dead, 0);
	expect_messages(f);
	expect_guids_once(f);
	/* Again: nothing to move; after a reopen (the ALT path is recorded)
	   everything still reads. */
	assert_int_equal(dbox_altmove(f->st, &set, &res, NULL), 0);
	assert_int_equal(res.records_moved, 0);
	dbox_store_close(&f->st);
	open_store(f);
	assert_non_null(f->st->alt_path);
	assert_string_equal(f->st->alt_path, alt);
	expect_messages(f);
	/* A purge of an ALT file (an expunge there) keeps the rest in ALT. */
	expunge(f, &f->msgs[0]);
	set = (struct dbox_purge_settings){ .threshold = 0 };
	assert_int_equal(dbox_purge(f->st, &set, &res), 0);
	assert_true(res.files_purged > 0);
	for (unsigned int i = 2; i < NMSG / 2; i++)
		assert_true(in_alt(f, &f->msgs[i]));
	assert_int_equal(usage(f).dead, 0);
	expect_messages(f);
	expect_guids_once(f);
}

static void test_altmove_crash_before_switch(void **state)
{
	struct fix *f = *state;
	struct dbox_purge_settings set = altmove_set(f);
	struct dbox_purge_result res;
	char alt[128];
	int status;
	pid_t pid;

	open_with_alt(f, alt, sizeof(alt));
	dbox_store_close(&f->st);
	set.after_copy = crash_hook;
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct dbox_store *st = NULL;
		struct dbox_store_settings ss = { .rotate_size = ROTATE };

		if (dbox_store_open(f->store, &ss, &st) < 0)
			_exit(2);
		dbox_altmove(st, &set, &res, NULL);
		_exit(3);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);

	/* Nothing switched: every message where it was, the copies cut by
	   recovery, without a copy in lost+found/; the rerun moves them,
	   each GUID stays once. */
	open_store(f);
	assert_int_equal(lost_found_count(f), 0);
	for (unsigned int i = 0; i < NMSG; i++)
		assert_false(in_alt(f, &f->msgs[i]));
	expect_messages(f);
	expect_guids_once(f);
	set.after_copy = NULL;
	assert_int_equal(dbox_altmove(f->st, &set, &res, NULL), 0);
	for (unsigned int i = 0; i < NMSG; i++)
		assert_true(in_alt(f, &f->msgs[i]) == (i < NMSG / 2));
	expect_messages(f);
}

static void test_missing_alt_is_eio_for_its_messages(void **state)
{
	struct fix *f = *state;
	struct dbox_purge_settings set = altmove_set(f);
	struct dbox_purge_result res;
	struct dbox_reader *reader = NULL;
	struct dbox_msgloc loc;
	char alt[128], away[160];

	open_with_alt(f, alt, sizeof(alt));
	assert_int_equal(dbox_altmove(f->st, &set, &res, NULL), 0);
	dbox_store_close(&f->st);
	snprintf(away, sizeof(away), "%s.away", alt);
	assert_int_equal(rename(alt, away), 0);

	errors_reset();
	open_store(f);   /* still opens; says why ALT is not there */
	assert_non_null(strstr(last_error, alt));
	/* Said once at the open: the reads of its messages (within the 10 s
	   before the next try of the ALT) fail without a line each. */
	errors_reset();
	for (unsigned int i = 0; i < NMSG; i++) {
		loc = loc_of(f, &f->msgs[i]);
		dbox_store_mutex_lock(f->st);
		assert_int_equal(dbox_store_open_reader(f->st, &loc,
							f->msgs[i].len, &reader),
				 i < NMSG / 2 ? -EIO : 0);
		dbox_store_mutex_unlock(f->st);
		if (i < NMSG / 2)
			continue;
		expect_bytes(reader, &f->msgs[i]);
		dbox_reader_free(&reader);
	}
	assert_int_equal(error_count, 0);
	/* No altmove without it. */
	assert_int_equal(dbox_altmove(f->st, &set, &res, NULL), -ENOENT);
	dbox_store_close(&f->st);
	assert_int_equal(rename(away, alt), 0);
	open_store(f);
	expect_messages(f);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, fix_setup, fix_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_purge_reclaims),
		T(test_reader_survives),
		T(test_changes_during_copy),
		T(test_threshold),
		T(test_busy_file_left_alone),
		T(test_crash_before_switch),
		T(test_crash_after_switch),
		T(test_altmove_moves_old),
		T(test_altmove_crash_before_switch),
		T(test_missing_alt_is_eio_for_its_messages),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
