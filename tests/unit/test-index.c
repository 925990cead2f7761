/*
 * test-index.c: unit tests of the SQLite index (index/index.h) with cmocka.
 *
 * Each test opens a fresh index in its own mkdtemp() directory, removed in
 * teardown.  Changes go through begin/commit like fs/ does them (tx_*
 * helpers: commit on success, roll back on error), so a failed operation
 * is also checked to leave nothing behind.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "engine/maildir.h"
#include "index/checkpoint.h"
#include "index/index.h"
#include "index/index-private.h"
#include "index/reserve.h"
#include "index/wal-sync.h"
#include "storage/log.h"
#include "test-common.h"

#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

/* --- helpers ---------------------------------------------------------- */

struct fix {
	char dir[64];
	char path[128];
	struct dbox_index *index;
};

static int fix_setup(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	tmpdir_make(f->dir, sizeof(f->dir), "test-index");
	snprintf(f->path, sizeof(f->path), "%s/index.sqlite", f->dir);
	assert_int_equal(dbox_index_open(f->path, true, &f->index), 0);
	assert_non_null(f->index);
	errors_reset();
	*state = f;
	return 0;
}

static int fix_teardown(void **state)
{
	struct fix *f = *state;

	dbox_index_close(&f->index);
	rm_rf(f->dir);
	free(f);
	return 0;
}

static void reopen(struct fix *f)
{
	dbox_index_close(&f->index);
	assert_null(f->index);
	assert_int_equal(dbox_index_open(f->path, false, &f->index), 0);
}

/* Run SQL directly on the index file on a connection of its own (with
   the index closed, or in a change the open index reads at its next
   statement). */
static void raw_sql(const char *path, const char *sql)
{
	sqlite3 *db;
	char *err = NULL;

	assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
	if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK)
		fail_msg("%s: %s", sql, err);
	sqlite3_close(db);
}

static void tx_begin(struct fix *f)
{
	assert_int_equal(dbox_index_begin(f->index), 0);
}

/* End a transaction as fs/ does: commit on success, roll back on error. */
static int tx_end(struct fix *f, int ret)
{
	if (ret < 0) {
		dbox_index_rollback(f->index);
		return ret;
	}
	assert_int_equal(dbox_index_commit(f->index, false), 0);
	return 0;
}

static uint32_t default_mode(enum dbox_kind kind)
{
	return kind == DBOX_KIND_DIR ? S_IFDIR | 0755 :
	       kind == DBOX_KIND_MESSAGE ? S_IFREG | 0600 : S_IFREG | 0644;
}

static int tx_create_at(struct fix *f, uint64_t parent, const char *name,
			enum dbox_kind kind, int64_t now,
			struct dbox_attr *attr_r)
{
	tx_begin(f);
	return tx_end(f, dbox_index_create(f->index, parent, name,
					   strlen(name), kind,
					   default_mode(kind), getuid(),
					   getgid(), now, attr_r));
}

static int tx_create(struct fix *f, uint64_t parent, const char *name,
		     enum dbox_kind kind, struct dbox_attr *attr_r)
{
	return tx_create_at(f, parent, name, kind, dbox_now_ns(), attr_r);
}

/* Create and return the new inode number. */
static uint64_t mk(struct fix *f, uint64_t parent, const char *name,
		   enum dbox_kind kind)
{
	struct dbox_attr attr;

	assert_int_equal(tx_create(f, parent, name, kind, &attr), 0);
	assert_true(attr.ino > DBOX_ROOT_INO);
	return attr.ino;
}

static struct dbox_attr attr_of(struct fix *f, uint64_t ino)
{
	struct dbox_attr attr;

	assert_int_equal(dbox_index_getattr(f->index, ino, &attr), 0);
	assert_int_equal(attr.ino, ino);
	return attr;
}

/* Field by field: the structs have padding. */
static void assert_attr_equal(const struct dbox_attr *a,
			      const struct dbox_attr *b)
{
	assert_int_equal(a->ino, b->ino);
	assert_int_equal(a->kind, b->kind);
	assert_int_equal(a->mode, b->mode);
	assert_int_equal(a->uid, b->uid);
	assert_int_equal(a->gid, b->gid);
	assert_int_equal(a->nlink, b->nlink);
	assert_int_equal(a->size, b->size);
	assert_int_equal(a->mtime_ns, b->mtime_ns);
	assert_int_equal(a->ctime_ns, b->ctime_ns);
}

static void assert_loc_equal(const struct dbox_msgloc *a,
			     const struct dbox_msgloc *b)
{
	assert_int_equal(a->file_id, b->file_id);
	assert_int_equal(a->offset, b->offset);
	assert_int_equal(a->body_size, b->body_size);
	assert_int_equal(a->record_size, b->record_size);
	assert_int_equal(a->vsize, b->vsize);
	assert_int_equal(a->state, b->state);
	assert_string_equal(a->guid, b->guid);
}

static bool exists(struct fix *f, uint64_t ino)
{
	struct dbox_attr attr;
	int ret = dbox_index_getattr(f->index, ino, &attr);

	assert_true(ret == 0 || ret == -ENOENT);
	return ret == 0;
}

/* The inode named parent/name, or 0 when there is none. */
static uint64_t ino_at(struct fix *f, uint64_t parent, const char *name)
{
	struct dbox_attr attr;
	int ret = dbox_index_lookup(f->index, parent, name, strlen(name),
				    &attr);

	if (ret == -ENOENT)
		return 0;
	assert_int_equal(ret, 0);
	return attr.ino;
}

static int tx_rename_at(struct fix *f, uint64_t parent, const char *name,
			uint64_t newparent, const char *newname,
			unsigned int flags, int64_t now, uint64_t *rino_r,
			uint32_t *rnlink_r)
{
	uint64_t rino = 12345;
	uint32_t rnlink = 12345;
	int ret;

	tx_begin(f);
	ret = dbox_index_rename(f->index, parent, name, strlen(name),
				newparent, newname, strlen(newname), flags,
				now, NULL, &rino, &rnlink);
	if (rino_r != NULL)
		*rino_r = rino;
	if (rnlink_r != NULL)
		*rnlink_r = rnlink;
	return tx_end(f, ret);
}

static int tx_rename(struct fix *f, uint64_t parent, const char *name,
		     uint64_t newparent, const char *newname,
		     unsigned int flags, uint64_t *rino_r, uint32_t *rnlink_r)
{
	return tx_rename_at(f, parent, name, newparent, newname, flags,
			    dbox_now_ns(), rino_r, rnlink_r);
}

static int tx_remove_at(struct fix *f, uint64_t parent, const char *name,
			bool dir, int64_t now, uint64_t *ino_r,
			uint32_t *nlink_r)
{
	uint64_t ino = 0;
	uint32_t nlink = 12345;
	int ret;

	tx_begin(f);
	ret = dbox_index_remove(f->index, parent, name, strlen(name), dir,
				now, &ino, &nlink);
	if (ino_r != NULL)
		*ino_r = ino;
	if (nlink_r != NULL)
		*nlink_r = nlink;
	return tx_end(f, ret);
}

static int tx_remove(struct fix *f, uint64_t parent, const char *name,
		     bool dir, uint64_t *ino_r, uint32_t *nlink_r)
{
	return tx_remove_at(f, parent, name, dir, dbox_now_ns(), ino_r,
			    nlink_r);
}

static int tx_link_at(struct fix *f, uint64_t ino, uint64_t newparent,
		      const char *name, int64_t now, struct dbox_attr *attr_r)
{
	struct dbox_attr attr;

	tx_begin(f);
	return tx_end(f, dbox_index_link(f->index, ino, newparent, name,
					 strlen(name), now,
					 attr_r != NULL ? attr_r : &attr));
}

static int tx_link(struct fix *f, uint64_t ino, uint64_t newparent,
		   const char *name, struct dbox_attr *attr_r)
{
	return tx_link_at(f, ino, newparent, name, dbox_now_ns(), attr_r);
}

static uint64_t parent_of(struct fix *f, uint64_t dir)
{
	uint64_t parent = 0;

	assert_int_equal(dbox_index_parent(f->index, dir, &parent), 0);
	return parent;
}

/* Readdir collector. */
#define MAX_LIST 1100
struct listing {
	uint64_t cookie[MAX_LIST];
	uint64_t ino[MAX_LIST];
	char name[MAX_LIST][256];
	size_t namelen[MAX_LIST];
	struct dbox_attr attr[MAX_LIST];
	unsigned int count;
	unsigned int stop_after; /* stop (return 1) after this many; 0 = never */
	unsigned int this_call;
};

static int collect_cb(void *ctx, const struct dbox_dirent *ent)
{
	struct listing *l = ctx;

	assert_true(l->count < MAX_LIST);
	assert_true(ent->namelen > 0 && ent->namelen <= 255);
	l->cookie[l->count] = ent->cookie;
	l->ino[l->count] = ent->attr.ino;
	memcpy(l->name[l->count], ent->name, ent->namelen);
	l->name[l->count][ent->namelen] = '\0';
	l->namelen[l->count] = ent->namelen;
	l->attr[l->count] = ent->attr;
	l->count++;
	l->this_call++;
	return l->stop_after != 0 && l->this_call >= l->stop_after ? 1 : 0;
}

static struct listing *listing_new(unsigned int stop_after)
{
	struct listing *l = calloc(1, sizeof(*l));

	assert_non_null(l);
	l->stop_after = stop_after;
	return l;
}

/* One readdir call after `after`; returns the last cookie seen (or
   `after` when nothing came). */
static uint64_t list_page(struct fix *f, uint64_t dir, uint64_t after,
			  struct listing *l)
{
	l->this_call = 0;
	assert_int_equal(dbox_index_readdir(f->index, dir, after, collect_cb,
					    l), 0);
	return l->this_call == 0 ? after : l->cookie[l->count - 1];
}

static int find_name(const struct listing *l, const char *name)
{
	for (unsigned int i = 0; i < l->count; i++)
		if (strcmp(l->name[i], name) == 0)
			return (int)i;
	return -1;
}

/* --- open, format ----------------------------------------------------- */

static void test_open_create(void **state)
{
	struct fix *f = *state;
	struct dbox_attr root;
	struct dbox_index *other = NULL;
	int64_t value, before = dbox_now_ns();
	char missing[160];

	root = attr_of(f, DBOX_ROOT_INO);
	assert_int_equal(root.kind, DBOX_KIND_DIR);
	assert_true(S_ISDIR(root.mode));
	assert_int_equal(root.nlink, 2);
	assert_int_equal(root.uid, getuid());
	assert_int_equal(root.gid, getgid());
	assert_true(root.mtime_ns > 0 && root.mtime_ns <= before);
	assert_int_equal(root.ctime_ns, root.mtime_ns);

	assert_int_equal(dbox_index_meta_get(f->index, "format", &value), 0);
	assert_int_equal(value, DBOX_INDEX_FORMAT);
	assert_int_equal(dbox_index_meta_get(f->index, "uidvalidity",
					     &value), 0);
	assert_true(value > 1500000000 && value <= before / 1000000000);
	assert_int_equal(dbox_index_meta_get(f->index, "nonexistent",
					     &value), -ENOENT);

	/* The root has no name; its parent is itself. */
	char *name = NULL;
	assert_int_equal(dbox_index_name_of(f->index, DBOX_ROOT_INO, &name),
			 -ENOENT);
	assert_null(name);
	assert_int_equal(parent_of(f, DBOX_ROOT_INO), DBOX_ROOT_INO);

	/* Empty root. */
	struct listing *l = listing_new(0);
	list_page(f, DBOX_ROOT_INO, 0, l);
	assert_int_equal(l->count, 0);
	free(l);

	/* Without create, a missing index is -ENOENT and is not created. */
	snprintf(missing, sizeof(missing), "%s/missing.sqlite", f->dir);
	assert_int_equal(dbox_index_open(missing, false, &other), -ENOENT);
	assert_null(other);
	assert_int_equal(access(missing, F_OK), -1);

	/* Closing NULL is safe. */
	dbox_index_close(&other);
	assert_null(other);
}

static void test_reopen_keeps_data(void **state)
{
	struct fix *f = *state;
	struct dbox_attr d, m, back;
	struct dbox_msgloc loc = { .file_id = 3, .offset = 16, .body_size = 5,
				   .record_size = 100, .vsize = 6,
				   .state = DBOX_MSG_COMMITTED,
				   .guid = "0123456789abcdef0123456789abcdef" };
	struct dbox_msgloc loc_back;
	uint64_t last, mfile_size;
	int64_t uidvalidity, uidvalidity2;

	assert_int_equal(tx_create(f, DBOX_ROOT_INO, "d", DBOX_KIND_DIR, &d),
			 0);
	assert_int_equal(tx_create(f, d.ino, "m", DBOX_KIND_MESSAGE, &m), 0);
	tx_begin(f);
	assert_int_equal(dbox_index_msg_set(f->index, m.ino, &loc), 0);
	assert_int_equal(dbox_index_mfile_set(f->index, 3, 116), 0);
	assert_int_equal(tx_end(f, 0), 0);
	assert_int_equal(dbox_index_meta_get(f->index, "uidvalidity",
					     &uidvalidity), 0);
	d = attr_of(f, d.ino);
	m = attr_of(f, m.ino);
	last = mk(f, DBOX_ROOT_INO, "last", DBOX_KIND_FILE);
	assert_int_equal(tx_remove(f, DBOX_ROOT_INO, "last", false, NULL,
				   NULL), 0);
	tx_begin(f);
	assert_int_equal(tx_end(f, dbox_index_delete_inode(f->index, last)),
			 0);

	reopen(f);
	assert_int_equal(attr_of(f, DBOX_ROOT_INO).nlink, 3);
	assert_int_equal(dbox_index_lookup(f->index, DBOX_ROOT_INO, "d", 1,
					   &back), 0);
	assert_attr_equal(&back, &d);
	assert_int_equal(dbox_index_lookup(f->index, d.ino, "m", 1, &back), 0);
	assert_attr_equal(&back, &m);
	assert_int_equal(dbox_index_msg_get(f->index, m.ino, &loc_back), 0);
	assert_loc_equal(&loc_back, &loc);
	assert_int_equal(dbox_index_mfile_get(f->index, 3, &mfile_size), 0);
	assert_int_equal(mfile_size, 116);
	assert_int_equal(dbox_index_meta_get(f->index, "uidvalidity",
					     &uidvalidity2), 0);
	assert_int_equal(uidvalidity2, uidvalidity);
	assert_false(exists(f, last));

	/* Inode numbers are never reused, even the deleted highest one. */
	assert_true(mk(f, DBOX_ROOT_INO, "new", DBOX_KIND_MESSAGE) > last);
}

static void test_format_newer(void **state)
{
	struct fix *f = *state;
	struct dbox_index *index = NULL;
	char sql[256];

	mk(f, DBOX_ROOT_INO, "d", DBOX_KIND_DIR);
	dbox_index_close(&f->index);

	snprintf(sql, sizeof(sql),
		 "UPDATE meta SET value = %d WHERE key = 'format'",
		 DBOX_INDEX_FORMAT + 1);
	raw_sql(f->path, sql);
	errors_reset();
	assert_int_equal(dbox_index_open(f->path, false, &index), -EPROTO);
	assert_null(index);
	assert_int_equal(error_count, 1);
	assert_non_null(strstr(last_error, "newer"));
	assert_int_equal(dbox_index_open(f->path, true, &index), -EPROTO);
	assert_null(index);

	/* A newer format may have a schema this code's statements do not
	   fit: still -EPROTO (upgrade), not -EIO ("corrupt, rebuild"). */
	raw_sql(f->path, "DROP TABLE mfile; ALTER TABLE entry RENAME TO names");
	errors_reset();
	assert_int_equal(dbox_index_open(f->path, false, &index), -EPROTO);
	assert_null(index);
	assert_non_null(strstr(last_error, "newer"));

	/* The current format opens again. */
	snprintf(sql, sizeof(sql),
		 "UPDATE meta SET value = %d WHERE key = 'format';"
		 "CREATE TABLE mfile (file_id INTEGER PRIMARY KEY,"
		 " size INTEGER NOT NULL, alt INTEGER NOT NULL DEFAULT 0);"
		 "ALTER TABLE names RENAME TO entry", DBOX_INDEX_FORMAT);
	raw_sql(f->path, sql);
	assert_int_equal(dbox_index_open(f->path, false, &f->index), 0);
	assert_true(ino_at(f, DBOX_ROOT_INO, "d") > DBOX_ROOT_INO);
}

/* A format 1 index (no atime/rdev columns, no symlink/xattr tables) is
   upgraded in place at a read-write open: names and times are kept, and
   every inode's atime reads as its mtime. */
static void test_format1_upgrade(void **state)
{
	struct fix *f = *state;
	struct dbox_attr before, after;
	uint64_t ino = mk(f, DBOX_ROOT_INO, "d", DBOX_KIND_DIR);
	int64_t format;

	assert_int_equal(dbox_index_getattr(f->index, ino, &before), 0);
	assert_int_equal(before.atime_ns, before.mtime_ns);
	dbox_index_close(&f->index);
	raw_sql(f->path, "DROP TRIGGER inode_gone;"
			 "DROP TABLE symlink; DROP TABLE xattr;"
			 "DROP TABLE setting; ALTER TABLE mfile DROP COLUMN alt;"
			 "ALTER TABLE inode DROP COLUMN atime;"
			 "ALTER TABLE inode DROP COLUMN rdev;"
			 "UPDATE inode SET mtime = 1234567890123456789 WHERE ino = 2;"
			 "UPDATE meta SET value = 1 WHERE key = 'format'");

	assert_int_equal(dbox_index_open(f->path, false, &f->index), 0);
	assert_int_equal(dbox_index_meta_get(f->index, "format", &format), 0);
	assert_int_equal(format, DBOX_INDEX_FORMAT);
	assert_int_equal(ino_at(f, DBOX_ROOT_INO, "d"), ino);
	assert_int_equal(dbox_index_getattr(f->index, ino, &after), 0);
	assert_int_equal(after.mtime_ns, 1234567890123456789LL);
	assert_int_equal(after.atime_ns, after.mtime_ns);
	assert_int_equal(after.rdev, 0);
	assert_int_equal(after.nlink, before.nlink);
}

/* A format 2 index (no mfile.alt, no setting table) is upgraded to
   format 3 in place: every m.N it knows stays in STORE/storage/ (alt 0),
   committed ends are kept, and the new columns and table work. */
static void test_format2_upgrade(void **state)
{
	struct fix *f = *state;
	uint64_t size;
	char *value = NULL;
	int64_t format;
	bool alt = true;

	assert_int_equal(dbox_index_mfile_set(f->index, 7, 4321), 0);
	dbox_index_close(&f->index);
	raw_sql(f->path, "DROP TABLE setting; ALTER TABLE mfile DROP COLUMN alt;"
			 "UPDATE meta SET value = 2 WHERE key = 'format'");

	assert_int_equal(dbox_index_open(f->path, false, &f->index), 0);
	assert_int_equal(dbox_index_meta_get(f->index, "format", &format), 0);
	assert_int_equal(format, 3);
	assert_int_equal(dbox_index_mfile_where(f->index, 7, &size, &alt), 0);
	assert_int_equal(size, 4321);
	assert_false(alt);
	/* mfile_set keeps the flag of a row in ALT (an upsert). */
	assert_int_equal(dbox_index_mfile_add_alt(f->index, 8, 34), 0);
	assert_int_equal(dbox_index_mfile_set(f->index, 8, 99), 0);
	assert_int_equal(dbox_index_mfile_where(f->index, 8, &size, &alt), 0);
	assert_int_equal(size, 99);
	assert_true(alt);
	assert_int_equal(dbox_index_setting_get(f->index, DBOX_SETTING_ALT_PATH,
						&value), -ENOENT);
	assert_int_equal(dbox_index_setting_set(f->index, DBOX_SETTING_ALT_PATH,
						"/slow/mdbox"), 0);
	assert_int_equal(dbox_index_setting_get(f->index, DBOX_SETTING_ALT_PATH,
						&value), 0);
	assert_string_equal(value, "/slow/mdbox");
	free(value);
}

static void test_not_an_index(void **state)
{
	struct fix *f = *state;
	struct dbox_index *index = NULL;
	char path[160], garbage[8192], back[8192];
	int fd;

	/* A garbage file: -EIO, logged, and left as it was. */
	for (size_t i = 0; i < sizeof(garbage); i++)
		garbage[i] = (char)(i * 7 + 3);
	snprintf(path, sizeof(path), "%s/garbage.sqlite", f->dir);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, garbage, sizeof(garbage)), sizeof(garbage));
	close(fd);
	errors_reset();
	assert_int_equal(dbox_index_open(path, false, &index), -EIO);
	assert_null(index);
	assert_true(error_count >= 1);
	assert_int_equal(dbox_index_open(path, true, &index), -EIO);
	assert_null(index);
	fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(read(fd, back, sizeof(back)), sizeof(back));
	assert_int_equal(read(fd, back, 1), 0);
	close(fd);
	assert_memory_equal(back, garbage, sizeof(garbage));

	/* A SQLite database that is not a dboxfs index. */
	snprintf(path, sizeof(path), "%s/other.sqlite", f->dir);
	raw_sql(path, "CREATE TABLE t (x)");
	errors_reset();
	assert_int_equal(dbox_index_open(path, false, &index), -EIO);
	assert_null(index);
	assert_true(error_count >= 1);

	/* One with a meta table but no format. */
	dbox_index_close(&f->index);
	raw_sql(f->path, "DELETE FROM meta WHERE key = 'format'");
	errors_reset();
	assert_int_equal(dbox_index_open(f->path, false, &index), -EIO);
	assert_null(index);
	assert_non_null(strstr(last_error, "format"));
}

/* --- create, lookup, getattr ------------------------------------------ */

static void test_create_lookup_getattr(void **state)
{
	struct fix *f = *state;
	const int64_t t1 = 4102444800123456789LL; /* 2100, beats "now" */
	struct dbox_attr root0 = attr_of(f, DBOX_ROOT_INO), d, m, p, back;

	assert_int_equal(dbox_index_begin(f->index), 0);
	assert_int_equal(dbox_index_create(f->index, DBOX_ROOT_INO, "dir", 3,
					   DBOX_KIND_DIR, S_IFDIR | 0751, 1000,
					   1001, t1, &d), 0);
	assert_int_equal(dbox_index_commit(f->index, false), 0);
	assert_true(d.ino > DBOX_ROOT_INO);
	assert_int_equal(d.kind, DBOX_KIND_DIR);
	assert_int_equal(d.mode, S_IFDIR | 0751);
	assert_int_equal(d.uid, 1000);
	assert_int_equal(d.gid, 1001);
	assert_int_equal(d.nlink, 2);
	assert_int_equal(d.size, 0);
	assert_int_equal(d.mtime_ns, t1);
	assert_int_equal(d.ctime_ns, t1);

	/* The root gained a subdirectory; its mtime is now t1 (ns exact). */
	back = attr_of(f, DBOX_ROOT_INO);
	assert_int_equal(back.nlink, root0.nlink + 1);
	assert_int_equal(back.mtime_ns, t1);
	assert_int_equal(back.ctime_ns, t1);

	assert_int_equal(dbox_index_begin(f->index), 0);
	assert_int_equal(dbox_index_create(f->index, d.ino,
					   "1700000000.M1P2.host,S=12:2,S", 29,
					   DBOX_KIND_MESSAGE, S_IFREG | 0640,
					   1000, 1001, t1 + 7, &m), 0);
	assert_int_equal(dbox_index_create(f->index, d.ino, "plain", 5,
					   DBOX_KIND_FILE, S_IFREG | 0604, 0,
					   0, t1 + 9, &p), 0);
	assert_int_equal(dbox_index_commit(f->index, false), 0);
	assert_int_equal(m.kind, DBOX_KIND_MESSAGE);
	assert_int_equal(m.mode, S_IFREG | 0640);
	assert_int_equal(m.nlink, 1);
	assert_int_equal(m.size, 0);
	assert_int_equal(m.mtime_ns, t1 + 7);
	assert_int_equal(m.ctime_ns, t1 + 7);
	assert_int_equal(p.kind, DBOX_KIND_FILE);
	assert_int_equal(p.mode, S_IFREG | 0604);
	assert_int_equal(p.nlink, 1);
	assert_int_equal(p.uid, 0);
	assert_true(p.ino > m.ino && m.ino > d.ino);

	/* Files do not change the parent's link count. */
	back = attr_of(f, d.ino);
	assert_int_equal(back.nlink, 2);
	assert_int_equal(back.mtime_ns, t1 + 9);
	assert_int_equal(attr_of(f, DBOX_ROOT_INO).nlink, 3);

	/* lookup == getattr. */
	assert_int_equal(dbox_index_lookup(f->index, d.ino,
					   "1700000000.M1P2.host,S=12:2,S", 29,
					   &back), 0);
	assert_attr_equal(&back, &m);
	back = attr_of(f, m.ino);
	assert_attr_equal(&back, &m);
	assert_int_equal(dbox_index_lookup(f->index, DBOX_ROOT_INO, "dir", 3,
					   &back), 0);
	assert_int_equal(back.ino, d.ino);

	/* Exact names only, and only in their own directory. */
	assert_int_equal(dbox_index_lookup(f->index, d.ino, "plai", 4, &back),
			 -ENOENT);
	assert_int_equal(dbox_index_lookup(f->index, d.ino, "plainx", 6,
					   &back), -ENOENT);
	assert_int_equal(dbox_index_lookup(f->index, d.ino, "PLAIN", 5,
					   &back), -ENOENT);
	assert_int_equal(dbox_index_lookup(f->index, DBOX_ROOT_INO, "plain",
					   5, &back), -ENOENT);
	/* namelen counts, not NUL termination. */
	assert_int_equal(dbox_index_lookup(f->index, d.ino, "plainxyz", 5,
					   &back), 0);
	assert_int_equal(back.ino, p.ino);
	assert_int_equal(dbox_index_getattr(f->index, p.ino + 100, &back),
			 -ENOENT);
	assert_int_equal(dbox_index_getattr(f->index, 0, &back), -ENOENT);
}

/* A message by its unique name: the name itself or the name with
   ":2,flags", never a longer unique name that starts the same. */
static void test_lookup_unique(void **state)
{
	struct fix *f = *state;
	uint64_t d = mk(f, DBOX_ROOT_INO, "cur", DBOX_KIND_DIR);
	uint64_t longer = mk(f, d, "1001.M1.host.2:2,S", DBOX_KIND_MESSAGE);
	uint64_t flagged = mk(f, d, "1001.M1.host:2,RS", DBOX_KIND_MESSAGE);
	uint64_t bare = mk(f, d, "1002.M2.host", DBOX_KIND_MESSAGE);
	struct dbox_attr attr;

	(void)longer;
	assert_int_equal(dbox_index_lookup_unique(f->index, d, "1001.M1.host",
						  12, &attr), 0);
	assert_int_equal(attr.ino, flagged);
	assert_int_equal(dbox_index_lookup_unique(f->index, d, "1002.M2.host",
						  12, &attr), 0);
	assert_int_equal(attr.ino, bare);
	assert_int_equal(dbox_index_lookup_unique(f->index, d, "1001.M1.hos",
						  11, &attr), -ENOENT);
	assert_int_equal(dbox_index_lookup_unique(f->index, d, "1003", 4,
						  &attr), -ENOENT);
	assert_int_equal(dbox_index_lookup_unique(f->index, DBOX_ROOT_INO,
						  "1002.M2.host", 12, &attr),
			 -ENOENT);
}

static void test_create_errors(void **state)
{
	struct fix *f = *state;
	struct dbox_attr attr, root0;
	uint64_t d = mk(f, DBOX_ROOT_INO, "d", DBOX_KIND_DIR);
	uint64_t m = mk(f, d, "m", DBOX_KIND_MESSAGE);
	uint64_t p = mk(f, d, "p", DBOX_KIND_FILE);
	struct dbox_attr d0 = attr_of(f, d);
	struct listing *l = listing_new(0);

	root0 = attr_of(f, DBOX_ROOT_INO);
	/* Duplicate names of any kind. */
	assert_int_equal(tx_create(f, DBOX_ROOT_INO, "d", DBOX_KIND_DIR,
				   &attr), -EEXIST);
	assert_int_equal(tx_create(f, DBOX_ROOT_INO, "d", DBOX_KIND_MESSAGE,
				   &attr), -EEXIST);
	assert_int_equal(tx_create(f, d, "m", DBOX_KIND_MESSAGE, &attr),
			 -EEXIST);
	assert_int_equal(tx_create(f, d, "m", DBOX_KIND_DIR, &attr), -EEXIST);
	assert_int_equal(tx_create(f, d, "p", DBOX_KIND_FILE, &attr), -EEXIST);

	/* The parent is not a directory. */
	assert_int_equal(tx_create(f, m, "x", DBOX_KIND_MESSAGE, &attr),
			 -ENOTDIR);
	assert_int_equal(tx_create(f, m, "x", DBOX_KIND_DIR, &attr), -ENOTDIR);
	assert_int_equal(tx_create(f, p, "x", DBOX_KIND_FILE, &attr),
			 -ENOTDIR);
	/* or does not exist. */
	assert_int_equal(tx_create(f, p + 1000, "x", DBOX_KIND_FILE, &attr),
			 -ENOENT);

	/* Nothing changed. */
	attr = attr_of(f, DBOX_ROOT_INO);
	assert_attr_equal(&attr, &root0);
	attr = attr_of(f, d);
	assert_attr_equal(&attr, &d0);
	assert_int_equal(attr_of(f, m).nlink, 1);
	list_page(f, d, 0, l);
	assert_int_equal(l->count, 2);
	free(l);
}

static void test_names_arbitrary_bytes(void **state)
{
	struct fix *f = *state;
	static const char *const text[] = {
		"1700000000.M123P456.host,S=4096,W=4190:2,FRS",
		"a:b,c", ":", ",", ".", "..x", " leading space", "tab\there",
		"new\nline", "\xff\xfe\x80 not utf-8",
	};
	const size_t ntext = sizeof(text) / sizeof(text[0]);
	char bin[255], bin2[255];
	struct dbox_attr attr, a1, a2;
	struct listing *l = listing_new(0);
	uint64_t d = mk(f, DBOX_ROOT_INO, "d", DBOX_KIND_DIR);

	/* 255 bytes, every byte value but NUL. */
	for (size_t i = 0; i < sizeof(bin); i++)
		bin[i] = (char)(i + 1);
	memcpy(bin2, bin, sizeof(bin));
	bin2[254] = 'x';

	for (size_t i = 0; i < ntext; i++)
		mk(f, d, text[i], i % 2 ? DBOX_KIND_MESSAGE : DBOX_KIND_FILE);
	tx_begin(f);
	assert_int_equal(dbox_index_create(f->index, d, bin, sizeof(bin),
					   DBOX_KIND_MESSAGE, S_IFREG | 0600,
					   0, 0, dbox_now_ns(), &a1), 0);
	/* Prefixes and one-byte differences are other names. */
	assert_int_equal(dbox_index_create(f->index, d, bin2, sizeof(bin2),
					   DBOX_KIND_MESSAGE, S_IFREG | 0600,
					   0, 0, dbox_now_ns(), &a2), 0);
	assert_int_equal(dbox_index_create(f->index, d, bin, sizeof(bin) - 1,
					   DBOX_KIND_DIR, S_IFDIR | 0700,
					   0, 0, dbox_now_ns(), &attr), 0);
	assert_int_equal(dbox_index_create(f->index, d, bin, sizeof(bin),
					   DBOX_KIND_MESSAGE, S_IFREG | 0600,
					   0, 0, dbox_now_ns(), &attr), -EEXIST);
	dbox_index_rollback(f->index);
	tx_begin(f);
	assert_int_equal(dbox_index_create(f->index, d, bin, sizeof(bin),
					   DBOX_KIND_MESSAGE, S_IFREG | 0600,
					   0, 0, dbox_now_ns(), &a1), 0);
	assert_int_equal(dbox_index_create(f->index, d, bin2, sizeof(bin2),
					   DBOX_KIND_MESSAGE, S_IFREG | 0600,
					   0, 0, dbox_now_ns(), &a2), 0);
	assert_int_equal(dbox_index_commit(f->index, false), 0);
	assert_true(a1.ino != a2.ino);

	for (size_t i = 0; i < ntext; i++)
		assert_true(ino_at(f, d, text[i]) != 0);
	assert_int_equal(dbox_index_lookup(f->index, d, bin, sizeof(bin),
					   &attr), 0);
	assert_int_equal(attr.ino, a1.ino);
	assert_int_equal(dbox_index_lookup(f->index, d, bin2, sizeof(bin2),
					   &attr), 0);
	assert_int_equal(attr.ino, a2.ino);
	assert_int_equal(dbox_index_lookup(f->index, d, bin, 254, &attr),
			 -ENOENT);

	/* readdir gives the same bytes back. */
	list_page(f, d, 0, l);
	assert_int_equal(l->count, ntext + 2);
	for (size_t i = 0; i < ntext; i++) {
		assert_int_equal(l->namelen[i], strlen(text[i]));
		assert_memory_equal(l->name[i], text[i], strlen(text[i]));
	}
	assert_int_equal(l->namelen[ntext], 255);
	assert_memory_equal(l->name[ntext], bin, 255);
	assert_int_equal(l->ino[ntext], a1.ino);
	assert_int_equal(l->namelen[ntext + 1], 255);
	assert_memory_equal(l->name[ntext + 1], bin2, 255);

	/* Rename to and from binary names. */
	assert_int_equal(tx_rename(f, d, text[1], d, "plain", 0, NULL, NULL),
			 0);
	tx_begin(f);
	uint64_t rino;
	uint32_t rnlink;
	assert_int_equal(dbox_index_rename(f->index, d, bin, sizeof(bin), d,
					   "a:b,c", 5, 0, dbox_now_ns(), NULL,
					   &rino, &rnlink), 0);
	assert_int_equal(dbox_index_commit(f->index, false), 0);
	assert_int_equal(ino_at(f, d, "a:b,c"), a1.ino);
	assert_int_equal(dbox_index_lookup(f->index, d, bin, sizeof(bin),
					   &attr), -ENOENT);

	/* DBOX_NAME_MAX bytes and no more, for every way to make a name. */
	char longname[DBOX_NAME_MAX + 1];
	memset(longname, 'L', sizeof(longname));
	tx_begin(f);
	assert_int_equal(dbox_index_create(f->index, d, longname,
					   DBOX_NAME_MAX + 1,
					   DBOX_KIND_FILE, S_IFREG | 0600,
					   0, 0, dbox_now_ns(), &attr),
			 -ENAMETOOLONG);
	dbox_index_rollback(f->index);
	assert_int_equal(dbox_index_lookup(f->index, d, longname,
					   DBOX_NAME_MAX + 1, &attr),
			 -ENAMETOOLONG);
	tx_begin(f);
	assert_int_equal(dbox_index_link(f->index, a2.ino, d, longname,
					 DBOX_NAME_MAX + 1, dbox_now_ns(),
					 &attr), -ENAMETOOLONG);
	assert_int_equal(dbox_index_rename(f->index, d, "a:b,c", 5, d,
					   longname, DBOX_NAME_MAX + 1, 0,
					   dbox_now_ns(), NULL, &rino, &rnlink),
			 -ENAMETOOLONG);
	dbox_index_rollback(f->index);
	assert_int_equal(ino_at(f, d, "a:b,c"), a1.ino);
	assert_int_equal(attr_of(f, a2.ino).nlink, 1);
	free(l);
}

/* --- link, remove ----------------------------------------------------- */

static void test_link(void **state)
{
	struct fix *f = *state;
	uint64_t d1 = mk(f, DBOX_ROOT_INO, "d1", DBOX_KIND_DIR);
	uint64_t d2 = mk(f, DBOX_ROOT_INO, "d2", DBOX_KIND_DIR);
	uint64_t m = mk(f, d1, "a", DBOX_KIND_MESSAGE);
	uint64_t p = mk(f, d1, "p", DBOX_KIND_FILE);
	struct dbox_attr attr, before = attr_of(f, m);
	struct dbox_attr d1_0 = attr_of(f, d1);
	int64_t now = dbox_now_ns() + 1000000000;
	uint64_t ino;
	uint32_t nlink;

	assert_int_equal(tx_link_at(f, m, d2, "b", now, &attr), 0);
	assert_int_equal(attr.ino, m);
	assert_int_equal(attr.nlink, 2);
	assert_int_equal(attr.ctime_ns, now);
	assert_int_equal(attr.mtime_ns, before.mtime_ns); /* data unchanged */
	assert_int_equal(ino_at(f, d2, "b"), m);
	assert_int_equal(ino_at(f, d1, "a"), m);
	assert_int_equal(attr_of(f, d2).mtime_ns, now);
	assert_int_equal(attr_of(f, d2).nlink, 2);
	attr = attr_of(f, d1);
	assert_attr_equal(&attr, &d1_0);

	/* A third name in the same directory. */
	assert_int_equal(tx_link(f, m, d1, "c", &attr), 0);
	assert_int_equal(attr.nlink, 3);
	assert_int_equal(tx_link(f, p, d2, "p2", &attr), 0);
	assert_int_equal(attr.nlink, 2);

	/* Errors change nothing. */
	assert_int_equal(tx_link(f, d2, d1, "dirlink", &attr), -EPERM);
	assert_int_equal(tx_link(f, DBOX_ROOT_INO, d1, "rootlink", &attr),
			 -EPERM);
	assert_int_equal(tx_link(f, m, d1, "p", &attr), -EEXIST);
	assert_int_equal(tx_link(f, m, d2, "b", &attr), -EEXIST);
	assert_int_equal(tx_link(f, m, m, "x", &attr), -ENOTDIR);
	assert_int_equal(tx_link(f, p + 100, d1, "x", &attr), -ENOENT);
	assert_int_equal(attr_of(f, m).nlink, 3);
	assert_int_equal(ino_at(f, d1, "dirlink"), 0);
	assert_int_equal(attr_of(f, d1).nlink, 2);

	/* Unlinking names counts down; the inode stays at nlink 0 until the
	   caller deletes it, and cannot get a new name then. */
	assert_int_equal(tx_remove(f, d1, "a", false, &ino, &nlink), 0);
	assert_int_equal(ino, m);
	assert_int_equal(nlink, 2);
	assert_int_equal(ino_at(f, d2, "b"), m);
	assert_int_equal(tx_remove(f, d2, "b", false, &ino, &nlink), 0);
	assert_int_equal(nlink, 1);
	assert_int_equal(tx_remove(f, d1, "c", false, &ino, &nlink), 0);
	assert_int_equal(ino, m);
	assert_int_equal(nlink, 0);
	assert_int_equal(attr_of(f, m).nlink, 0);
	assert_int_equal(tx_link(f, m, d1, "again", &attr), -ENOENT);
	tx_begin(f);
	assert_int_equal(tx_end(f, dbox_index_delete_inode(f->index, m)), 0);
	assert_false(exists(f, m));
}

static void test_remove(void **state)
{
	struct fix *f = *state;
	uint64_t d = mk(f, DBOX_ROOT_INO, "d", DBOX_KIND_DIR);
	uint64_t sub = mk(f, d, "sub", DBOX_KIND_DIR);
	uint64_t empty = mk(f, d, "empty", DBOX_KIND_DIR);
	uint64_t m = mk(f, sub, "m", DBOX_KIND_MESSAGE);
	uint64_t p = mk(f, d, "p", DBOX_KIND_FILE);
	struct dbox_msgloc loc = { .file_id = 1, .offset = 16,
				   .guid = "00000000000000000000000000000001" };
	struct dbox_attr d0;
	uint64_t ino;
	uint32_t nlink;
	int64_t now;

	assert_int_equal(attr_of(f, d).nlink, 4);
	tx_begin(f);
	assert_int_equal(tx_end(f, dbox_index_msg_set(f->index, m, &loc)), 0);

	d0 = attr_of(f, d);
	assert_int_equal(tx_remove(f, d, "sub", false, &ino, &nlink), -EISDIR);
	assert_int_equal(tx_remove(f, d, "p", true, &ino, &nlink), -ENOTDIR);
	assert_int_equal(tx_remove(f, sub, "m", true, &ino, &nlink), -ENOTDIR);
	assert_int_equal(tx_remove(f, d, "sub", true, &ino, &nlink),
			 -ENOTEMPTY);
	assert_int_equal(tx_remove(f, d, "nope", true, &ino, &nlink), -ENOENT);
	assert_int_equal(tx_remove(f, d, "nope", false, &ino, &nlink),
			 -ENOENT);
	assert_int_equal(tx_remove(f, m, "x", false, &ino, &nlink), -ENOENT);
	struct dbox_attr attr = attr_of(f, d);
	assert_attr_equal(&attr, &d0);
	assert_true(exists(f, sub) && exists(f, m) && exists(f, p));

	/* rmdir of an empty directory deletes it and its parent's link. */
	now = d0.mtime_ns + 5000;
	assert_int_equal(tx_remove_at(f, d, "empty", true, now, &ino, &nlink),
			 0);
	assert_int_equal(ino, empty);
	assert_int_equal(nlink, 0);
	assert_false(exists(f, empty));
	attr = attr_of(f, d);
	assert_int_equal(attr.nlink, 3);
	assert_int_equal(attr.mtime_ns, now);
	assert_int_equal(ino_at(f, d, "empty"), 0);

	/* unlink of a message: the inode (and its location) stay for the
	   caller to delete. */
	assert_int_equal(tx_remove(f, sub, "m", false, &ino, &nlink), 0);
	assert_int_equal(ino, m);
	assert_int_equal(nlink, 0);
	assert_int_equal(attr_of(f, m).nlink, 0);
	assert_int_equal(dbox_index_msg_get(f->index, m, &loc), 0);
	tx_begin(f);
	assert_int_equal(tx_end(f, dbox_index_delete_inode(f->index, m)), 0);
	assert_false(exists(f, m));
	assert_int_equal(dbox_index_msg_get(f->index, m, &loc), -ENOENT);

	/* Now sub is empty. */
	assert_int_equal(tx_remove(f, d, "sub", true, &ino, &nlink), 0);
	assert_int_equal(ino, sub);
	assert_int_equal(attr_of(f, d).nlink, 2);
	assert_int_equal(tx_remove(f, d, "p", false, &ino, &nlink), 0);
	assert_int_equal(ino, p);
	assert_int_equal(tx_remove(f, DBOX_ROOT_INO, "d", true, &ino, &nlink),
			 0);
	assert_int_equal(attr_of(f, DBOX_ROOT_INO).nlink, 2);
}

/* --- rename ----------------------------------------------------------- */

static void test_rename_same_dir(void **state)
{
	struct fix *f = *state;
	uint64_t d = mk(f, DBOX_ROOT_INO, "d", DBOX_KIND_DIR);
	uint64_t m = mk(f, d, "a", DBOX_KIND_MESSAGE);
	uint64_t sub = mk(f, d, "sub", DBOX_KIND_DIR);
	struct dbox_attr m0 = attr_of(f, m), d0 = attr_of(f, d), attr;
	struct dbox_attr root0 = attr_of(f, DBOX_ROOT_INO);
	int64_t now = d0.mtime_ns + 1000;
	uint64_t rino;
	uint32_t rnlink;

	assert_int_equal(tx_rename_at(f, d, "a", d, "a:2,S", 0, now, &rino,
				      &rnlink), 0);
	assert_int_equal(rino, 0);
	assert_int_equal(rnlink, 0);
	assert_int_equal(ino_at(f, d, "a"), 0);
	assert_int_equal(ino_at(f, d, "a:2,S"), m);
	attr = attr_of(f, m);
	assert_int_equal(attr.mtime_ns, m0.mtime_ns);
	assert_int_equal(attr.size, m0.size);
	assert_int_equal(attr.nlink, 1);
	assert_int_equal(attr.ctime_ns, now);
	attr = attr_of(f, d);
	assert_int_equal(attr.mtime_ns, now);
	assert_int_equal(attr.nlink, 3);

	/* A directory renamed within its parent: no link count changes. */
	assert_int_equal(tx_rename(f, d, "sub", d, "sub2", 0, &rino, &rnlink),
			 0);
	assert_int_equal(ino_at(f, d, "sub2"), sub);
	assert_int_equal(attr_of(f, d).nlink, 3);
	assert_int_equal(parent_of(f, sub), d);
	attr = attr_of(f, DBOX_ROOT_INO);
	assert_attr_equal(&attr, &root0);

	/* Missing source; target directory missing or not a directory. */
	assert_int_equal(tx_rename(f, d, "a", d, "b", 0, &rino, &rnlink),
			 -ENOENT);
	assert_int_equal(tx_rename(f, d, "a:2,S", m, "b", 0, &rino, &rnlink),
			 -ENOTDIR);
	assert_int_equal(tx_rename(f, d, "a:2,S", sub + 100, "b", 0, &rino,
				   &rnlink), -ENOENT);
	/* Unknown flags, or both. */
	assert_int_equal(tx_rename(f, d, "a:2,S", d, "b", 1u << 2, &rino,
				   &rnlink), -EINVAL);
	assert_int_equal(tx_rename(f, d, "a:2,S", d, "b",
				   RENAME_NOREPLACE | RENAME_EXCHANGE, &rino,
				   &rnlink), -EINVAL);
	assert_int_equal(ino_at(f, d, "a:2,S"), m);
}

static void test_rename_across_dirs(void **state)
{
	struct fix *f = *state;
	uint64_t d1 = mk(f, DBOX_ROOT_INO, "d1", DBOX_KIND_DIR);
	uint64_t d2 = mk(f, DBOX_ROOT_INO, "d2", DBOX_KIND_DIR);
	uint64_t m = mk(f, d1, "m", DBOX_KIND_MESSAGE);
	uint64_t sub = mk(f, d1, "sub", DBOX_KIND_DIR);
	uint64_t deep = mk(f, sub, "deep", DBOX_KIND_DIR);
	struct dbox_attr d1_0 = attr_of(f, d1), d2_0 = attr_of(f, d2);
	int64_t now = (d1_0.mtime_ns > d2_0.mtime_ns ? d1_0.mtime_ns :
		       d2_0.mtime_ns) + 1000;
	uint64_t rino;
	uint32_t rnlink;

	assert_int_equal(tx_rename_at(f, d1, "m", d2, "m2", 0, now, &rino,
				      &rnlink), 0);
	assert_int_equal(rino, 0);
	assert_int_equal(ino_at(f, d1, "m"), 0);
	assert_int_equal(ino_at(f, d2, "m2"), m);
	assert_int_equal(attr_of(f, d1).mtime_ns, now);
	assert_int_equal(attr_of(f, d2).mtime_ns, now);
	assert_int_equal(attr_of(f, d1).nlink, 3);
	assert_int_equal(attr_of(f, d2).nlink, 2);

	/* A directory (with its subtree) moves: link counts follow. */
	assert_int_equal(tx_rename(f, d1, "sub", d2, "sub", 0, &rino,
				   &rnlink), 0);
	assert_int_equal(attr_of(f, d1).nlink, 2);
	assert_int_equal(attr_of(f, d2).nlink, 3);
	assert_int_equal(attr_of(f, sub).nlink, 3);
	assert_int_equal(parent_of(f, sub), d2);
	assert_int_equal(parent_of(f, deep), sub);
	assert_int_equal(ino_at(f, sub, "deep"), deep);

	/* Up to the root and down again. */
	assert_int_equal(tx_rename(f, sub, "deep", DBOX_ROOT_INO, "top", 0,
				   &rino, &rnlink), 0);
	assert_int_equal(attr_of(f, DBOX_ROOT_INO).nlink, 5);
	assert_int_equal(attr_of(f, sub).nlink, 2);
	assert_int_equal(parent_of(f, deep), DBOX_ROOT_INO);
	assert_int_equal(tx_rename(f, DBOX_ROOT_INO, "top", d1, "x", 0, &rino,
				   &rnlink), 0);
	assert_int_equal(attr_of(f, DBOX_ROOT_INO).nlink, 4);
	assert_int_equal(attr_of(f, d1).nlink, 3);
	assert_int_equal(parent_of(f, deep), d1);
}

static void test_rename_replace_file(void **state)
{
	struct fix *f = *state;
	uint64_t d1 = mk(f, DBOX_ROOT_INO, "d1", DBOX_KIND_DIR);
	uint64_t d2 = mk(f, DBOX_ROOT_INO, "d2", DBOX_KIND_DIR);
	uint64_t a = mk(f, d1, "a", DBOX_KIND_MESSAGE);
	uint64_t b = mk(f, d2, "b", DBOX_KIND_MESSAGE);
	uint64_t x = mk(f, d1, "x", DBOX_KIND_FILE);
	struct dbox_attr attr;
	uint64_t rino;
	uint32_t rnlink;

	assert_int_equal(tx_link(f, b, d1, "c", &attr), 0);
	assert_int_equal(attr.nlink, 2);

	/* b loses one of its two names. */
	assert_int_equal(tx_rename(f, d1, "a", d2, "b", 0, &rino, &rnlink), 0);
	assert_int_equal(rino, b);
	assert_int_equal(rnlink, 1);
	assert_int_equal(ino_at(f, d2, "b"), a);
	assert_int_equal(ino_at(f, d1, "a"), 0);
	assert_int_equal(ino_at(f, d1, "c"), b);
	assert_int_equal(attr_of(f, b).nlink, 1);
	assert_int_equal(attr_of(f, a).nlink, 1);

	/* and then its last: left at nlink 0 for the caller. */
	assert_int_equal(tx_rename(f, d1, "x", d1, "c", 0, &rino, &rnlink), 0);
	assert_int_equal(rino, b);
	assert_int_equal(rnlink, 0);
	assert_int_equal(attr_of(f, b).nlink, 0);
	assert_int_equal(ino_at(f, d1, "c"), x);
	assert_int_equal(ino_at(f, d1, "x"), 0);

	/* The directory link counts are untouched by files. */
	assert_int_equal(attr_of(f, d1).nlink, 2);
	assert_int_equal(attr_of(f, d2).nlink, 2);
	assert_int_equal(attr_of(f, DBOX_ROOT_INO).nlink, 4);
}

static void test_rename_replace_dir(void **state)
{
	struct fix *f = *state;
	uint64_t d1 = mk(f, DBOX_ROOT_INO, "d1", DBOX_KIND_DIR);
	uint64_t d2 = mk(f, DBOX_ROOT_INO, "d2", DBOX_KIND_DIR);
	uint64_t src = mk(f, d1, "src", DBOX_KIND_DIR);
	uint64_t inner = mk(f, src, "inner", DBOX_KIND_MESSAGE);
	uint64_t empty = mk(f, d2, "empty", DBOX_KIND_DIR);
	uint64_t full = mk(f, d2, "full", DBOX_KIND_DIR);
	uint64_t m = mk(f, d2, "m", DBOX_KIND_MESSAGE);
	uint64_t rino;
	uint32_t rnlink;

	mk(f, full, "child", DBOX_KIND_FILE);
	assert_int_equal(attr_of(f, d1).nlink, 3);
	assert_int_equal(attr_of(f, d2).nlink, 4);

	/* Type mismatches and a non-empty target change nothing. */
	assert_int_equal(tx_rename(f, d1, "src", d2, "full", 0, &rino,
				   &rnlink), -ENOTEMPTY);
	assert_int_equal(tx_rename(f, d1, "src", d2, "m", 0, &rino, &rnlink),
			 -ENOTDIR);
	assert_int_equal(tx_rename(f, d2, "m", d2, "empty", 0, &rino,
				   &rnlink), -EISDIR);
	assert_int_equal(tx_rename(f, src, "inner", d2, "full", 0, &rino,
				   &rnlink), -EISDIR);
	assert_int_equal(ino_at(f, d1, "src"), src);
	assert_int_equal(ino_at(f, d2, "full"), full);
	assert_int_equal(ino_at(f, d2, "m"), m);
	assert_int_equal(ino_at(f, d2, "empty"), empty);
	assert_int_equal(attr_of(f, d1).nlink, 3);
	assert_int_equal(attr_of(f, d2).nlink, 4);

	/* Replacing an empty directory across parents. */
	assert_int_equal(tx_rename(f, d1, "src", d2, "empty", 0, &rino,
				   &rnlink), 0);
	assert_int_equal(ino_at(f, d2, "empty"), src);
	assert_int_equal(ino_at(f, d1, "src"), 0);
	assert_false(exists(f, empty));
	assert_int_equal(attr_of(f, d1).nlink, 2);
	assert_int_equal(attr_of(f, d2).nlink, 4);
	assert_int_equal(parent_of(f, src), d2);
	assert_int_equal(ino_at(f, src, "inner"), inner);

	/* Replacing an empty directory in the same parent. */
	uint64_t e2 = mk(f, d2, "e2", DBOX_KIND_DIR);
	assert_int_equal(attr_of(f, d2).nlink, 5);
	assert_int_equal(tx_rename(f, d2, "empty", d2, "e2", 0, &rino,
				   &rnlink), 0);
	assert_false(exists(f, e2));
	assert_int_equal(ino_at(f, d2, "e2"), src);
	assert_int_equal(attr_of(f, d2).nlink, 4);
	assert_int_equal(attr_of(f, DBOX_ROOT_INO).nlink, 4);
}

static void test_rename_into_itself(void **state)
{
	struct fix *f = *state;
	uint64_t a = mk(f, DBOX_ROOT_INO, "a", DBOX_KIND_DIR);
	uint64_t b = mk(f, a, "b", DBOX_KIND_DIR);
	uint64_t c = mk(f, b, "c", DBOX_KIND_DIR);
	uint64_t file = mk(f, c, "file", DBOX_KIND_FILE);
	uint64_t rino;
	uint32_t rnlink;

	assert_int_equal(tx_rename(f, DBOX_ROOT_INO, "a", a, "x", 0, &rino,
				   &rnlink), -EINVAL);
	assert_int_equal(tx_rename(f, DBOX_ROOT_INO, "a", c, "x", 0, &rino,
				   &rnlink), -EINVAL);
	assert_int_equal(tx_rename(f, a, "b", c, "x", 0, &rino, &rnlink),
			 -EINVAL);
	assert_int_equal(tx_rename(f, a, "b", b, "x", 0, &rino, &rnlink),
			 -EINVAL);
	/* RENAME_EXCHANGE must not build a cycle either: a directory with
	   a file below it, or with a directory below it. */
	assert_int_equal(tx_rename(f, DBOX_ROOT_INO, "a", c, "file",
				   RENAME_EXCHANGE, &rino, &rnlink), -EINVAL);
	assert_int_equal(tx_rename(f, c, "file", DBOX_ROOT_INO, "a",
				   RENAME_EXCHANGE, &rino, &rnlink), -EINVAL);
	assert_int_equal(tx_rename(f, DBOX_ROOT_INO, "a", b, "c",
				   RENAME_EXCHANGE, &rino, &rnlink), -EINVAL);
	assert_int_equal(tx_rename(f, b, "c", DBOX_ROOT_INO, "a",
				   RENAME_EXCHANGE, &rino, &rnlink), -EINVAL);
	assert_int_equal(tx_rename(f, DBOX_ROOT_INO, "a", a, "b",
				   RENAME_EXCHANGE, &rino, &rnlink), -EINVAL);

	/* Nothing moved. */
	assert_int_equal(parent_of(f, a), DBOX_ROOT_INO);
	assert_int_equal(parent_of(f, b), a);
	assert_int_equal(parent_of(f, c), b);
	assert_int_equal(ino_at(f, c, "file"), file);
	assert_int_equal(attr_of(f, DBOX_ROOT_INO).nlink, 3);
	assert_int_equal(attr_of(f, a).nlink, 3);
	assert_int_equal(attr_of(f, b).nlink, 3);
	assert_int_equal(attr_of(f, c).nlink, 2);

	/* Moving a directory up within its own subtree is fine. */
	assert_int_equal(tx_rename(f, b, "c", a, "c", 0, &rino, &rnlink), 0);
	assert_int_equal(parent_of(f, c), a);
	assert_int_equal(attr_of(f, b).nlink, 2);
	assert_int_equal(attr_of(f, a).nlink, 4);
}

static void test_rename_same_inode(void **state)
{
	struct fix *f = *state;
	uint64_t d = mk(f, DBOX_ROOT_INO, "d", DBOX_KIND_DIR);
	uint64_t m = mk(f, d, "a", DBOX_KIND_MESSAGE);
	uint64_t sub = mk(f, d, "sub", DBOX_KIND_DIR);
	struct dbox_attr d0, m0, attr;
	uint64_t rino;
	uint32_t rnlink;

	assert_int_equal(tx_link(f, m, d, "b", NULL), 0);
	d0 = attr_of(f, d);
	m0 = attr_of(f, m);

	/* Two names of one inode: POSIX says do nothing. */
	assert_int_equal(tx_rename_at(f, d, "a", d, "b", 0, d0.mtime_ns + 99,
				      &rino, &rnlink), 0);
	assert_int_equal(rino, 0);
	assert_int_equal(ino_at(f, d, "a"), m);
	assert_int_equal(ino_at(f, d, "b"), m);
	attr = attr_of(f, m);
	assert_attr_equal(&attr, &m0);
	attr = attr_of(f, d);
	assert_attr_equal(&attr, &d0);

	/* A name onto itself, file or directory. */
	assert_int_equal(tx_rename(f, d, "a", d, "a", 0, &rino, &rnlink), 0);
	assert_int_equal(tx_rename(f, d, "sub", d, "sub", 0, &rino, &rnlink),
			 0);
	assert_int_equal(ino_at(f, d, "a"), m);
	assert_int_equal(ino_at(f, d, "sub"), sub);
	assert_int_equal(attr_of(f, m).nlink, 2);
	assert_int_equal(attr_of(f, d).nlink, 3);
	assert_int_equal(rino, 0);
}

static void test_rename_noreplace(void **state)
{
	struct fix *f = *state;
	uint64_t d = mk(f, DBOX_ROOT_INO, "d", DBOX_KIND_DIR);
	uint64_t a = mk(f, d, "a", DBOX_KIND_MESSAGE);
	uint64_t b = mk(f, d, "b", DBOX_KIND_MESSAGE);
	struct dbox_attr d0 = attr_of(f, d), attr;
	uint64_t rino;
	uint32_t rnlink;

	assert_int_equal(tx_rename(f, d, "a", d, "b", RENAME_NOREPLACE, &rino,
				   &rnlink), -EEXIST);
	assert_int_equal(ino_at(f, d, "a"), a);
	assert_int_equal(ino_at(f, d, "b"), b);
	assert_int_equal(attr_of(f, b).nlink, 1);
	attr = attr_of(f, d);
	assert_attr_equal(&attr, &d0);

	assert_int_equal(tx_rename(f, d, "a", d, "c", RENAME_NOREPLACE, &rino,
				   &rnlink), 0);
	assert_int_equal(rino, 0);
	assert_int_equal(ino_at(f, d, "c"), a);
	assert_int_equal(ino_at(f, d, "a"), 0);
}

static void test_rename_exchange(void **state)
{
	struct fix *f = *state;
	uint64_t d1 = mk(f, DBOX_ROOT_INO, "d1", DBOX_KIND_DIR);
	uint64_t d2 = mk(f, DBOX_ROOT_INO, "d2", DBOX_KIND_DIR);
	uint64_t a = mk(f, d1, "a", DBOX_KIND_MESSAGE);
	uint64_t b = mk(f, d2, "b", DBOX_KIND_FILE);
	uint64_t s1 = mk(f, d1, "s1", DBOX_KIND_DIR);
	uint64_t s2 = mk(f, d2, "s2", DBOX_KIND_DIR);
	struct dbox_attr d1_0 = attr_of(f, d1), d2_0 = attr_of(f, d2);
	struct dbox_attr a0 = attr_of(f, a), b0 = attr_of(f, b), attr;
	int64_t now = (d1_0.mtime_ns > d2_0.mtime_ns ? d1_0.mtime_ns :
		       d2_0.mtime_ns) + 777;
	uint64_t rino;
	uint32_t rnlink;

	/* Two files across directories swap; nothing loses a name. */
	assert_int_equal(tx_rename_at(f, d1, "a", d2, "b", RENAME_EXCHANGE,
				      now, &rino, &rnlink), 0);
	assert_int_equal(rino, 0);
	assert_int_equal(rnlink, 0);
	assert_int_equal(ino_at(f, d1, "a"), b);
	assert_int_equal(ino_at(f, d2, "b"), a);
	attr = attr_of(f, a);
	assert_int_equal(attr.nlink, 1);
	assert_int_equal(attr.kind, a0.kind);
	attr = attr_of(f, b);
	assert_int_equal(attr.nlink, 1);
	assert_int_equal(attr.kind, b0.kind);
	assert_int_equal(attr_of(f, d1).mtime_ns, now);
	assert_int_equal(attr_of(f, d2).mtime_ns, now);
	assert_int_equal(attr_of(f, d1).nlink, 3);
	assert_int_equal(attr_of(f, d2).nlink, 3);

	/* The target must exist. */
	assert_int_equal(tx_rename(f, d1, "a", d2, "nope", RENAME_EXCHANGE,
				   &rino, &rnlink), -ENOENT);
	assert_int_equal(ino_at(f, d1, "a"), b);
	assert_int_equal(ino_at(f, d2, "nope"), 0);

	/* A directory (in d1) with a file (in d2): d1 loses a
	   subdirectory, d2 gains one. */
	assert_int_equal(tx_rename(f, d1, "s1", d2, "b", RENAME_EXCHANGE,
				   &rino, &rnlink), 0);
	assert_int_equal(ino_at(f, d1, "s1"), a);
	assert_int_equal(ino_at(f, d2, "b"), s1);
	assert_int_equal(parent_of(f, s1), d2);
	assert_int_equal(attr_of(f, d1).nlink, 2);
	assert_int_equal(attr_of(f, d2).nlink, 4);
	assert_int_equal(attr_of(f, s1).nlink, 2);

	/* and the other way round (file first). */
	assert_int_equal(tx_rename(f, d1, "s1", d2, "b", RENAME_EXCHANGE,
				   &rino, &rnlink), 0);
	assert_int_equal(ino_at(f, d1, "s1"), s1);
	assert_int_equal(ino_at(f, d2, "b"), a);
	assert_int_equal(parent_of(f, s1), d1);
	assert_int_equal(attr_of(f, d1).nlink, 3);
	assert_int_equal(attr_of(f, d2).nlink, 3);

	/* Two directories across parents: counts unchanged. */
	assert_int_equal(tx_rename(f, d1, "s1", d2, "s2", RENAME_EXCHANGE,
				   &rino, &rnlink), 0);
	assert_int_equal(ino_at(f, d1, "s1"), s2);
	assert_int_equal(ino_at(f, d2, "s2"), s1);
	assert_int_equal(parent_of(f, s1), d2);
	assert_int_equal(parent_of(f, s2), d1);
	assert_int_equal(attr_of(f, d1).nlink, 3);
	assert_int_equal(attr_of(f, d2).nlink, 3);

	/* A directory and a file within one directory: unchanged. */
	assert_int_equal(tx_rename(f, d2, "s2", d2, "b", RENAME_EXCHANGE,
				   &rino, &rnlink), 0);
	assert_int_equal(ino_at(f, d2, "s2"), a);
	assert_int_equal(ino_at(f, d2, "b"), s1);
	assert_int_equal(attr_of(f, d2).nlink, 3);
	assert_int_equal(attr_of(f, DBOX_ROOT_INO).nlink, 4);

	/* The exchanged entries keep their place in readdir order. */
	struct listing *l = listing_new(0);
	list_page(f, d2, 0, l);
	assert_int_equal(l->count, 2);
	assert_string_equal(l->name[0], "b");
	assert_int_equal(l->ino[0], s1);
	assert_string_equal(l->name[1], "s2");
	assert_int_equal(l->ino[1], a);
	free(l);
}

/* --- directory mtimes ------------------------------------------------- */

/* dbox times: ext4's range to the nanosecond, clamped as the kernel
   clamps for ext4 (values taken from utimensat() on ext4, kernel 6.18),
   the old plain-nanosecond values reading as they did. */
static void test_time_range(void **state)
{
	static const struct {
		int64_t sec, nsec;      /* asked for */
		int64_t want_sec, want_nsec;
	} cases[] = {
		{ 1, 0, 1, 0 },
		{ -1, 999999999, -1, 999999999 },        /* -1 ns */
		{ -2, 500000000, -2, 500000000 },        /* -1.5 s */
		{ 10413792000LL, 123, 10413792000LL, 123 },      /* 2300 */
		{ 15032385534LL, 999999999, 15032385534LL, 999999999 },
		{ 15032385535LL, 5, 15032385535LL, 0 },  /* the end */
		{ 253402300799LL, 0, 15032385535LL, 0 }, /* 9999 */
		{ INT64_MAX, 999999999, 15032385535LL, 0 },
		{ -2147483648LL, 5, -2147483648LL, 0 },  /* the start */
		{ -2147483647LL, 5, -2147483647LL, 5 },
		{ -58979923200LL, 0, -2147483648LL, 0 }, /* year 101 */
		{ INT64_MIN, 0, -2147483648LL, 0 },
		{ 7, 1500000000, 8, 500000000 },         /* normalised */
		{ 7, -1, 6, 999999999 },
	};
	int64_t sec, nsec, t;

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		t = dbox_time_make(cases[i].sec, cases[i].nsec);
		dbox_time_split(t, &sec, &nsec);
		assert_int_equal(sec, cases[i].want_sec);
		assert_int_equal(nsec, cases[i].want_nsec);
		assert_int_equal(dbox_time_sec(t), cases[i].want_sec);
	}
	/* 1901..2262: the nanoseconds as format 1 stored them. */
	assert_int_equal(dbox_time_make(1234567890, 123456789),
			 1234567890123456789LL);
	assert_int_equal(dbox_time_make(-1, 0), -1000000000LL);
	/* Order across the wrap at 2262. */
	assert_true(dbox_time_cmp(dbox_time_make(10413792000LL, 0),
				  dbox_time_make(9000000000LL, 0)) > 0);
	assert_true(dbox_time_cmp(dbox_time_make(-5, 0),
				  dbox_time_make(10413792000LL, 0)) < 0);
	assert_int_equal(dbox_time_cmp(dbox_time_make(3, 3),
				       dbox_time_make(3, 3)), 0);
}

/* A directory's mtime and ctime become the operation's now_ns, as ext4
   sets them: also when that is earlier than before (a clock stepped back,
   a directory touched into the future). */
static void test_dir_mtime_now(void **state)
{
	struct fix *f = *state;
	const int64_t t = dbox_now_ns() + 3600 * 1000000000LL;
	int64_t k = 0;
	struct dbox_attr attr;
	uint64_t d1, d2, m, rino, ino;
	uint32_t rnlink, nlink;

	assert_int_equal(tx_create_at(f, DBOX_ROOT_INO, "d1", DBOX_KIND_DIR,
				      t, &attr), 0);
	d1 = attr.ino;
	assert_int_equal(tx_create_at(f, DBOX_ROOT_INO, "d2", DBOX_KIND_DIR,
				      t, &attr), 0);
	d2 = attr.ino;
	assert_int_equal(attr.mtime_ns, t);
	/* The root saw two creates at the same t: t, not t + 1. */
	assert_int_equal(attr_of(f, DBOX_ROOT_INO).mtime_ns, t);

	/* Each step at its own now, t + k; checks each dir it changes. */
#define AT (t + ++k)
#define CHANGED(dir) do {                                          \
		assert_int_equal(attr_of(f, (dir)).mtime_ns, t + k); \
		assert_int_equal(attr_of(f, (dir)).ctime_ns, t + k); \
	} while (0)

	assert_int_equal(tx_create_at(f, d1, "m", DBOX_KIND_MESSAGE, AT, &attr), 0);
	CHANGED(d1);
	m = attr.ino;
	assert_int_equal(tx_create_at(f, d1, "sub", DBOX_KIND_DIR, AT, &attr), 0);
	CHANGED(d1);
	assert_int_equal(tx_link_at(f, m, d1, "m2", AT, NULL), 0);
	CHANGED(d1);
	assert_int_equal(attr_of(f, m).ctime_ns, t + k);
	assert_int_equal(tx_link_at(f, m, d2, "m3", AT, NULL), 0);
	CHANGED(d2);
	assert_int_equal(tx_rename_at(f, d1, "m", d1, "mm", 0, AT, &rino,
				      &rnlink), 0);
	CHANGED(d1);
	assert_int_equal(tx_rename_at(f, d1, "mm", d2, "mm", 0, AT, &rino,
				      &rnlink), 0);
	CHANGED(d1);
	CHANGED(d2);
	assert_int_equal(attr_of(f, m).ctime_ns, t + k);
	assert_int_equal(tx_rename_at(f, d2, "mm", d1, "mback", 0, AT, &rino,
				      &rnlink), 0);
	CHANGED(d1);
	CHANGED(d2);
	assert_int_equal(tx_rename_at(f, d1, "sub", d2, "m3", RENAME_EXCHANGE,
				      AT, &rino, &rnlink), 0);
	CHANGED(d1);
	CHANGED(d2);
	assert_int_equal(tx_remove_at(f, d2, "m3", true, AT, &ino, &nlink), 0);
	CHANGED(d2);
	assert_int_equal(tx_remove_at(f, d1, "m2", false, AT, &ino, &nlink), 0);
	CHANGED(d1);
	assert_int_equal(tx_remove_at(f, d1, "sub", false, AT, &ino, &nlink), 0);
	CHANGED(d1);
	/* An earlier now_ns (the clock stepped back) is taken as it is. */
	assert_int_equal(tx_create_at(f, d1, "old", DBOX_KIND_FILE, 1000, &attr), 0);
	assert_int_equal(attr.mtime_ns, 1000);
	assert_int_equal(attr_of(f, d1).mtime_ns, 1000);
	assert_int_equal(attr_of(f, d1).ctime_ns, 1000);
#undef AT
#undef CHANGED
	/* Lookups and failed operations do not touch it. */
	assert_int_equal(tx_create_at(f, d1, "old", DBOX_KIND_FILE, t, &attr),
			 -EEXIST);
	ino_at(f, d1, "old");
	assert_int_equal(attr_of(f, d1).mtime_ns, 1000);
}

/* --- readdir ---------------------------------------------------------- */

static void test_readdir_order_resume(void **state)
{
	struct fix *f = *state;
	uint64_t d = mk(f, DBOX_ROOT_INO, "d", DBOX_KIND_DIR);
	uint64_t other = mk(f, DBOX_ROOT_INO, "other", DBOX_KIND_DIR);
	uint64_t c = mk(f, d, "c", DBOX_KIND_MESSAGE);
	uint64_t a = mk(f, d, "a", DBOX_KIND_DIR);
	uint64_t b = mk(f, d, "b", DBOX_KIND_FILE);
	struct listing *l = listing_new(0);
	uint64_t cookie;

	mk(f, other, "elsewhere", DBOX_KIND_MESSAGE);
	assert_int_equal(tx_link(f, c, d, "c-link", NULL), 0);

	/* Creation order, not name order; attributes come along. */
	list_page(f, d, 0, l);
	assert_int_equal(l->count, 4);
	assert_string_equal(l->name[0], "c");
	assert_string_equal(l->name[1], "a");
	assert_string_equal(l->name[2], "b");
	assert_string_equal(l->name[3], "c-link");
	assert_int_equal(l->ino[0], c);
	assert_int_equal(l->ino[1], a);
	assert_int_equal(l->ino[2], b);
	assert_int_equal(l->ino[3], c);
	for (unsigned int i = 0; i < 4; i++) {
		struct dbox_attr attr = attr_of(f, l->ino[i]);

		assert_attr_equal(&l->attr[i], &attr);
		assert_true(l->cookie[i] > 0);
		if (i > 0)
			assert_true(l->cookie[i] > l->cookie[i - 1]);
	}

	/* Resume after each cookie. */
	for (unsigned int i = 0; i < 4; i++) {
		struct listing *r = listing_new(0);

		list_page(f, d, l->cookie[i], r);
		assert_int_equal(r->count, 3 - i);
		for (unsigned int j = 0; j < r->count; j++) {
			assert_int_equal(r->cookie[j], l->cookie[i + 1 + j]);
			assert_string_equal(r->name[j], l->name[i + 1 + j]);
		}
		free(r);
	}

	/* Stopping early (buffer full) and resuming. */
	struct listing *s = listing_new(1);
	cookie = list_page(f, d, 0, s);
	assert_int_equal(s->count, 1);
	cookie = list_page(f, d, cookie, s);
	cookie = list_page(f, d, cookie, s);
	cookie = list_page(f, d, cookie, s);
	assert_int_equal(s->count, 4);
	assert_int_equal(list_page(f, d, cookie, s), cookie);
	assert_int_equal(s->count, 4);
	for (unsigned int i = 0; i < 4; i++)
		assert_string_equal(s->name[i], l->name[i]);
	free(s);

	/* A removed entry disappears; a new one comes last. */
	assert_int_equal(tx_remove(f, d, "a", true, NULL, NULL), 0);
	mk(f, d, "0", DBOX_KIND_MESSAGE);
	free(l);
	l = listing_new(0);
	list_page(f, d, 0, l);
	assert_int_equal(l->count, 4);
	assert_string_equal(l->name[1], "b");
	assert_string_equal(l->name[3], "0");

	/* Empty directories and non-directories list nothing. */
	free(l);
	l = listing_new(0);
	list_page(f, b, 0, l);
	assert_int_equal(l->count, 0);
	free(l);
}

static int fail_cb(void *ctx, const struct dbox_dirent *ent)
{
	unsigned int *calls = ctx;

	(void)ent;
	(*calls)++;
	return -EIO;
}

static void test_readdir_cb_error(void **state)
{
	struct fix *f = *state;
	unsigned int calls = 0;

	mk(f, DBOX_ROOT_INO, "a", DBOX_KIND_FILE);
	mk(f, DBOX_ROOT_INO, "b", DBOX_KIND_FILE);
	assert_int_equal(dbox_index_readdir(f->index, DBOX_ROOT_INO, 0,
					    fail_cb, &calls), -EIO);
	assert_int_equal(calls, 1);
	/* The index is usable afterwards (the statement was reset). */
	mk(f, DBOX_ROOT_INO, "c", DBOX_KIND_FILE);
}

static void test_readdir_rename_during(void **state)
{
	struct fix *f = *state;
	uint64_t d = mk(f, DBOX_ROOT_INO, "d", DBOX_KIND_DIR);
	uint64_t ino[10];
	struct listing *l = listing_new(5);
	uint64_t cookie, rino;
	uint32_t rnlink;
	char name[16];

	for (int i = 0; i < 10; i++) {
		snprintf(name, sizeof(name), "n%d", i);
		ino[i] = mk(f, d, name, DBOX_KIND_MESSAGE);
	}
	cookie = list_page(f, d, 0, l);
	assert_int_equal(l->count, 5);

	/* n1 was listed, n7 was not; both are renamed (as a Maildir client
	   renames to set flags) before the listing goes on. */
	assert_int_equal(tx_rename(f, d, "n1", d, "n1:2,S", 0, &rino, &rnlink),
			 0);
	assert_int_equal(tx_rename(f, d, "n7", d, "n7:2,S", 0, &rino, &rnlink),
			 0);
	/* And one entry replaces another not yet listed. */
	assert_int_equal(tx_rename(f, d, "n2", d, "n9", 0, &rino, &rnlink), 0);
	assert_int_equal(rino, ino[9]);

	l->stop_after = 0;
	list_page(f, d, cookie, l);
	/* n0..n4 then n5, n6, n7:2,S, n8: each inode once. */
	assert_int_equal(l->count, 9);
	for (int i = 0; i < 9; i++)
		assert_int_equal(l->ino[i], ino[i]);
	assert_string_equal(l->name[1], "n1");
	assert_string_equal(l->name[7], "n7:2,S");
	assert_int_equal(find_name(l, "n1:2,S"), -1);
	free(l);
}

static void test_readdir_many(void **state)
{
	struct fix *f = *state;
	enum { N = 1000 };
	uint64_t d = mk(f, DBOX_ROOT_INO, "d", DBOX_KIND_DIR);
	static uint64_t ino[N];
	static unsigned char seen[N];
	struct listing *l;
	uint64_t cookie = 0, last;
	char name[64];

	tx_begin(f);
	for (int i = 0; i < N; i++) {
		struct dbox_attr attr;

		snprintf(name, sizeof(name), "%d.M%dP1.host:2,", 1700000000 + i,
			 i);
		assert_int_equal(dbox_index_create(f->index, d, name,
						   strlen(name),
						   DBOX_KIND_MESSAGE,
						   S_IFREG | 0600, 0, 0,
						   dbox_now_ns(), &attr), 0);
		ino[i] = attr.ino;
	}
	assert_int_equal(dbox_index_commit(f->index, false), 0);

	/* All at once (several internal pages). */
	l = listing_new(0);
	list_page(f, d, 0, l);
	assert_int_equal(l->count, N);
	for (int i = 0; i < N; i++)
		assert_int_equal(l->ino[i], ino[i]);
	free(l);

	/* In small and odd-sized pieces, resuming by cookie. */
	l = listing_new(7);
	memset(seen, 0, sizeof(seen));
	for (int calls = 0;; calls++) {
		assert_true(calls < N);
		last = cookie;
		cookie = list_page(f, d, cookie, l);
		if (cookie == last)
			break;
	}
	assert_int_equal(l->count, N);
	for (int i = 0; i < N; i++) {
		assert_int_equal(l->ino[i], ino[i]);
		snprintf(name, sizeof(name), "%d.M%dP1.host:2,",
			 1700000000 + i, i);
		assert_string_equal(l->name[i], name);
		seen[i]++;
	}
	for (int i = 0; i < N; i++)
		assert_int_equal(seen[i], 1);
	free(l);

	/* Pieces of exactly the internal page size and one more. */
	l = listing_new(256);
	cookie = list_page(f, d, 0, l);
	cookie = list_page(f, d, cookie, l);
	assert_int_equal(l->count, 512);
	l->stop_after = 257;
	cookie = list_page(f, d, cookie, l);
	cookie = list_page(f, d, cookie, l);
	assert_int_equal(l->count, N);
	for (int i = 0; i < N; i++)
		assert_int_equal(l->ino[i], ino[i]);
	free(l);
}

/* --- names of directories and mailboxes ------------------------------- */

static void expect_mailbox(struct fix *f, uint64_t dir, const char *expected)
{
	char *name = NULL;

	assert_int_equal(maildir_mailbox_name(f->index, dir, &name), 0);
	assert_non_null(name);
	assert_string_equal(name, expected);
	free(name);
}

static void test_mailbox_name(void **state)
{
	struct fix *f = *state;
	uint64_t cur = mk(f, DBOX_ROOT_INO, "cur", DBOX_KIND_DIR);
	uint64_t newd = mk(f, DBOX_ROOT_INO, "new", DBOX_KIND_DIR);
	uint64_t ab = mk(f, DBOX_ROOT_INO, ".A.B", DBOX_KIND_DIR);
	uint64_t ab_cur = mk(f, ab, "cur", DBOX_KIND_DIR);
	uint64_t sent = mk(f, DBOX_ROOT_INO, ".Sent", DBOX_KIND_DIR);
	uint64_t sent_tmp = mk(f, sent, "tmp", DBOX_KIND_DIR);
	uint64_t x = mk(f, DBOX_ROOT_INO, "x", DBOX_KIND_DIR);
	uint64_t y = mk(f, x, "y", DBOX_KIND_DIR);
	uint64_t xy_cur = mk(f, y, "cur", DBOX_KIND_DIR);
	char *name = NULL;

	expect_mailbox(f, cur, "INBOX");
	expect_mailbox(f, newd, "INBOX");
	expect_mailbox(f, ab_cur, "A/B");
	expect_mailbox(f, sent_tmp, "Sent");
	expect_mailbox(f, xy_cur, "x/y");

	assert_int_equal(dbox_index_name_of(f->index, ab, &name), 0);
	assert_string_equal(name, ".A.B");
	free(name);
	assert_int_equal(parent_of(f, xy_cur), y);
	assert_int_equal(parent_of(f, y), x);
	assert_int_equal(parent_of(f, x), DBOX_ROOT_INO);
	uint64_t parent;
	assert_int_equal(dbox_index_parent(f->index, xy_cur + 100, &parent),
			 -ENOENT);

	/* A renamed folder gives the new name. */
	assert_int_equal(tx_rename(f, DBOX_ROOT_INO, ".A.B", DBOX_ROOT_INO,
				   ".A.C", 0, NULL, NULL), 0);
	expect_mailbox(f, ab_cur, "A/C");
	assert_int_equal(tx_rename(f, x, "y", DBOX_ROOT_INO, "z", 0, NULL,
				   NULL), 0);
	expect_mailbox(f, xy_cur, "z");
}

/* dbox_index_path: a name per step up, in the caller's transaction or
   in its own; what is no way up to the root is refused. */
static void test_path(void **state)
{
	struct fix *f = *state;
	uint64_t a = mk(f, DBOX_ROOT_INO, ".A", DBOX_KIND_DIR);
	uint64_t cur = mk(f, a, "cur", DBOX_KIND_DIR);
	uint64_t m = mk(f, cur, "1.host:2,S", DBOX_KIND_MESSAGE);
	uint64_t top = mk(f, DBOX_ROOT_INO, "t", DBOX_KIND_MESSAGE);
	char *path = NULL, sql[128];

	assert_int_equal(dbox_index_path(f->index, m, &path), 0);
	assert_string_equal(path, ".A/cur/1.host:2,S");
	free(path);
	assert_true(sqlite3_get_autocommit(f->index->db));
	assert_int_equal(dbox_index_path(f->index, top, &path), 0);
	assert_string_equal(path, "t");
	free(path);
	tx_begin(f);
	assert_int_equal(dbox_index_path(f->index, m, &path), 0);
	assert_string_equal(path, ".A/cur/1.host:2,S");
	free(path);
	assert_false(sqlite3_get_autocommit(f->index->db));
	dbox_index_rollback(f->index);
	assert_int_equal(dbox_index_path(f->index, DBOX_ROOT_INO, &path),
			 -ENOENT);
	assert_null(path);
	assert_int_equal(dbox_index_path(f->index, m + 100, &path), -ENOENT);
	/* Damaged rows: a name no path component can be, a cycle, a lost
	   parent. */
	snprintf(sql, sizeof(sql), "UPDATE entry SET name = "
		 "CAST('c' || char(10) || 'r' AS BLOB) WHERE ino = %llu",
		 (unsigned long long)cur);
	raw_sql(f->path, sql);
	assert_int_equal(dbox_index_path(f->index, m, &path), -EINVAL);
	snprintf(sql, sizeof(sql), "UPDATE entry SET name = CAST('cur' AS "
		 "BLOB) WHERE ino = %llu", (unsigned long long)cur);
	raw_sql(f->path, sql);
	snprintf(sql, sizeof(sql), "UPDATE entry SET parent = %llu WHERE "
		 "ino = %llu", (unsigned long long)cur, (unsigned long long)a);
	raw_sql(f->path, sql);
	assert_int_equal(dbox_index_path(f->index, m, &path), -EIO);
	snprintf(sql, sizeof(sql), "UPDATE entry SET parent = 999999 WHERE "
		 "ino = %llu", (unsigned long long)a);
	raw_sql(f->path, sql);
	assert_int_equal(dbox_index_path(f->index, m, &path), -EIO);
	assert_null(path);
	assert_true(sqlite3_get_autocommit(f->index->db));
}

/* --- message locations and m.N files ---------------------------------- */

static void test_msg_roundtrip(void **state)
{
	struct fix *f = *state;
	uint64_t m = mk(f, DBOX_ROOT_INO, "m", DBOX_KIND_MESSAGE);
	uint64_t p = mk(f, DBOX_ROOT_INO, "p", DBOX_KIND_FILE);
	struct dbox_msgloc loc = {
		.file_id = 4000000000u,
		.offset = 0xfffffff0ULL,
		.body_size = 123456789,
		.record_size = 123456999,
		.vsize = 130000000,
		.state = DBOX_MSG_WRITING,
		.guid = "d6f1ab0a1b840c6b4e6e000083ecc375",
	};
	struct dbox_msgloc back;

	assert_int_equal(dbox_index_msg_get(f->index, m, &back), -ENOENT);
	assert_int_equal(dbox_index_msg_get(f->index, p, &back), -ENOENT);
	tx_begin(f);
	assert_int_equal(dbox_index_msg_set(f->index, m, &loc), 0);
	assert_int_equal(tx_end(f, 0), 0);
	memset(&back, 0xaa, sizeof(back));
	assert_int_equal(dbox_index_msg_get(f->index, m, &back), 0);
	assert_int_equal(back.file_id, loc.file_id);
	assert_int_equal(back.offset, loc.offset);
	assert_int_equal(back.body_size, loc.body_size);
	assert_int_equal(back.record_size, loc.record_size);
	assert_int_equal(back.vsize, loc.vsize);
	assert_int_equal(back.state, DBOX_MSG_WRITING);
	assert_string_equal(back.guid, loc.guid);

	/* State only. */
	tx_begin(f);
	assert_int_equal(dbox_index_msg_set_state(f->index, m,
						  DBOX_MSG_COMMITTED), 0);
	assert_int_equal(tx_end(f, 0), 0);
	assert_int_equal(dbox_index_msg_get(f->index, m, &back), 0);
	assert_int_equal(back.state, DBOX_MSG_COMMITTED);
	assert_int_equal(back.offset, loc.offset);

	/* Replace. */
	loc.file_id = 2;
	loc.offset = 16;
	loc.state = DBOX_MSG_COMMITTED;
	strcpy(loc.guid, "00000000000000000000000000000002");
	tx_begin(f);
	assert_int_equal(dbox_index_msg_set(f->index, m, &loc), 0);
	assert_int_equal(tx_end(f, 0), 0);
	assert_int_equal(dbox_index_msg_get(f->index, m, &back), 0);
	assert_int_equal(back.file_id, 2);
	assert_int_equal(back.offset, 16);
	assert_string_equal(back.guid, loc.guid);

	/* A rolled-back set leaves the old location. */
	loc.offset = 999;
	tx_begin(f);
	assert_int_equal(dbox_index_msg_set(f->index, m, &loc), 0);
	dbox_index_rollback(f->index);
	assert_int_equal(dbox_index_msg_get(f->index, m, &back), 0);
	assert_int_equal(back.offset, 16);

	/* delete_inode takes the location with it. */
	assert_int_equal(tx_remove(f, DBOX_ROOT_INO, "m", false, NULL, NULL),
			 0);
	tx_begin(f);
	assert_int_equal(tx_end(f, dbox_index_delete_inode(f->index, m)), 0);
	assert_int_equal(dbox_index_msg_get(f->index, m, &back), -ENOENT);
}

struct mfiles {
	uint32_t id[16];
	uint64_t size[16];
	unsigned int count, stop_at;
};

static int mfile_cb(void *ctx, uint32_t file_id, uint64_t size)
{
	struct mfiles *m = ctx;

	assert_true(m->count < 16);
	m->id[m->count] = file_id;
	m->size[m->count] = size;
	m->count++;
	return m->stop_at != 0 && m->count == m->stop_at ? 42 : 0;
}

static void test_mfile(void **state)
{
	struct fix *f = *state;
	struct mfiles list;
	uint32_t max = 99;
	uint64_t size;

	assert_int_equal(dbox_index_mfile_max(f->index, &max), 0);
	assert_int_equal(max, 0);
	assert_int_equal(dbox_index_mfile_get(f->index, 1, &size), -ENOENT);
	memset(&list, 0, sizeof(list));
	assert_int_equal(dbox_index_mfile_list(f->index, mfile_cb, &list), 0);
	assert_int_equal(list.count, 0);

	tx_begin(f);
	assert_int_equal(dbox_index_mfile_set(f->index, 3, 300), 0);
	assert_int_equal(dbox_index_mfile_set(f->index, 1, 100), 0);
	assert_int_equal(dbox_index_mfile_set(f->index, 2, 200), 0);
	assert_int_equal(dbox_index_mfile_set(f->index, 2, 250), 0);
	assert_int_equal(dbox_index_mfile_set(f->index, 4000000000u,
					      0x123456789ULL), 0);
	assert_int_equal(tx_end(f, 0), 0);

	assert_int_equal(dbox_index_mfile_get(f->index, 2, &size), 0);
	assert_int_equal(size, 250);
	assert_int_equal(dbox_index_mfile_get(f->index, 4000000000u, &size),
			 0);
	assert_int_equal(size, 0x123456789ULL);
	assert_int_equal(dbox_index_mfile_get(f->index, 5, &size), -ENOENT);
	assert_int_equal(dbox_index_mfile_max(f->index, &max), 0);
	assert_int_equal(max, 4000000000u);

	memset(&list, 0, sizeof(list));
	assert_int_equal(dbox_index_mfile_list(f->index, mfile_cb, &list), 0);
	assert_int_equal(list.count, 4);
	assert_int_equal(list.id[0], 1);
	assert_int_equal(list.size[0], 100);
	assert_int_equal(list.id[1], 2);
	assert_int_equal(list.size[1], 250);
	assert_int_equal(list.id[2], 3);
	assert_int_equal(list.size[2], 300);
	assert_int_equal(list.id[3], 4000000000u);

	/* A callback stopping the list: its value comes back. */
	memset(&list, 0, sizeof(list));
	list.stop_at = 2;
	assert_int_equal(dbox_index_mfile_list(f->index, mfile_cb, &list), 42);
	assert_int_equal(list.count, 2);
	/* and the index is still usable. */
	tx_begin(f);
	assert_int_equal(dbox_index_mfile_set(f->index, 1, 101), 0);
	assert_int_equal(tx_end(f, 0), 0);
	assert_int_equal(dbox_index_mfile_get(f->index, 1, &size), 0);
	assert_int_equal(size, 101);
}

/* --- recovery --------------------------------------------------------- */

static void msg_set_state(struct fix *f, uint64_t ino,
			  enum dbox_msg_state state, uint64_t offset)
{
	struct dbox_msgloc loc = { .file_id = 1, .offset = offset,
				   .body_size = 10, .record_size = 100,
				   .vsize = 10, .state = state,
				   .guid = "0123456789abcdef0123456789abcdef" };

	tx_begin(f);
	assert_int_equal(tx_end(f, dbox_index_msg_set(f->index, ino, &loc)),
			 0);
}

static void test_recover(void **state)
{
	struct fix *f = *state;
	uint64_t cur = mk(f, DBOX_ROOT_INO, "cur", DBOX_KIND_DIR);
	uint64_t other = mk(f, DBOX_ROOT_INO, "other", DBOX_KIND_DIR);
	uint64_t quiet = mk(f, DBOX_ROOT_INO, "quiet", DBOX_KIND_DIR);
	uint64_t keep = mk(f, cur, "keep", DBOX_KIND_MESSAGE);
	uint64_t w1 = mk(f, cur, "w1", DBOX_KIND_MESSAGE);
	uint64_t w2 = mk(f, other, "w2", DBOX_KIND_MESSAGE);
	uint64_t acked = mk(f, other, "acked", DBOX_KIND_MESSAGE);
	uint64_t gone = mk(f, quiet, "gone", DBOX_KIND_MESSAGE);
	uint64_t f_gone = mk(f, quiet, "f-gone", DBOX_KIND_FILE);
	uint64_t f_keep = mk(f, quiet, "f-keep", DBOX_KIND_FILE);
	uint64_t empty_dir = mk(f, quiet, "emptydir", DBOX_KIND_DIR);
	struct dbox_attr cur0, other0, quiet0, attr;
	struct dbox_msgloc loc;
	unsigned int writing = 99, orphans = 99;
	uint64_t *files = NULL;
	size_t nfiles = 99;

	msg_set_state(f, keep, DBOX_MSG_COMMITTED, 16);
	msg_set_state(f, w1, DBOX_MSG_WRITING, 116);
	msg_set_state(f, w2, DBOX_MSG_WRITING, 216);
	msg_set_state(f, gone, DBOX_MSG_COMMITTED, 316);
	/* acked: WRITING, but a close acknowledged its empty version (the
	   key names it; keys of other numbers do not count). */
	msg_set_state(f, acked, DBOX_MSG_WRITING, 416);
	{
		char key[48], near[48];

		snprintf(key, sizeof(key), "acked_empty.%llu",
			 (unsigned long long)acked);
		snprintf(near, sizeof(near), "acked_empty.%llu0",
			 (unsigned long long)w2);
		tx_begin(f);
		assert_int_equal(dbox_index_meta_set(f->index, key, 1), 0);
		assert_int_equal(dbox_index_meta_set(f->index, near, 1), 0);
		assert_int_equal(tx_end(f, 0), 0);
	}
	/* w1 has a second name elsewhere; gone and f-gone were unlinked
	   while open. */
	assert_int_equal(tx_link(f, w1, other, "w1-link", NULL), 0);
	assert_int_equal(tx_remove(f, quiet, "gone", false, NULL, NULL), 0);
	assert_int_equal(tx_remove(f, quiet, "f-gone", false, NULL, NULL), 0);
	cur0 = attr_of(f, cur);
	other0 = attr_of(f, other);
	quiet0 = attr_of(f, quiet);

	dbox_index_close(&f->index);
	assert_int_equal(dbox_index_open(f->path, false, &f->index), 0);
	assert_int_equal(dbox_index_recover(f->index, "acked_empty.", &writing,
					    &orphans, &files, &nfiles), 0);
	assert_int_equal(writing, 2);
	assert_int_equal(orphans, 2);
	assert_int_equal(nfiles, 1);
	assert_non_null(files);
	assert_int_equal(files[0], f_gone);
	free(files);

	/* Unfinished messages: inode, location and every name gone. */
	assert_false(exists(f, w1));
	assert_false(exists(f, w2));
	assert_int_equal(dbox_index_msg_get(f->index, w1, &loc), -ENOENT);
	assert_int_equal(dbox_index_msg_get(f->index, w2, &loc), -ENOENT);
	assert_int_equal(ino_at(f, cur, "w1"), 0);
	assert_int_equal(ino_at(f, other, "w1-link"), 0);
	assert_int_equal(ino_at(f, other, "w2"), 0);
	assert_true(attr_of(f, cur).mtime_ns > cur0.mtime_ns);
	assert_true(attr_of(f, other).mtime_ns > other0.mtime_ns);
	assert_int_equal(attr_of(f, cur).nlink, 2);

	/* Orphans (nlink 0) gone, no directory change for them. */
	assert_false(exists(f, gone));
	assert_int_equal(dbox_index_msg_get(f->index, gone, &loc), -ENOENT);
	assert_false(exists(f, f_gone));
	attr = attr_of(f, quiet);
	assert_attr_equal(&attr, &quiet0);

	/* The rest untouched. */
	assert_int_equal(ino_at(f, cur, "keep"), keep);
	assert_int_equal(dbox_index_msg_get(f->index, keep, &loc), 0);
	assert_int_equal(loc.state, DBOX_MSG_COMMITTED);
	assert_int_equal(loc.offset, 16);
	assert_int_equal(ino_at(f, quiet, "f-keep"), f_keep);
	assert_int_equal(ino_at(f, quiet, "emptydir"), empty_dir);
	assert_int_equal(ino_at(f, other, "acked"), acked);
	assert_int_equal(dbox_index_msg_get(f->index, acked, &loc), 0);
	assert_int_equal(loc.state, DBOX_MSG_WRITING);
	assert_int_equal(attr_of(f, empty_dir).nlink, 2);

	/* It is durable and idempotent. */
	reopen(f);
	writing = orphans = 99;
	assert_int_equal(dbox_index_recover(f->index, "acked_empty.", &writing,
					    &orphans, &files, &nfiles), 0);
	assert_int_equal(writing, 0);
	assert_int_equal(orphans, 0);
	assert_int_equal(nfiles, 0);
	free(files);
	assert_false(exists(f, w1));
	assert_int_equal(ino_at(f, cur, "keep"), keep);
	/* and leaves no transaction open. */
	mk(f, cur, "after", DBOX_KIND_MESSAGE);
}

/* --- transactions ----------------------------------------------------- */

static void test_commit_sync(void **state)
{
	struct fix *f = *state;
	struct dbox_attr attr;
	char wal[160];

	assert_int_equal(dbox_index_begin(f->index), 0);
	assert_int_equal(dbox_index_create(f->index, DBOX_ROOT_INO, "a", 1,
					   DBOX_KIND_MESSAGE, S_IFREG | 0600,
					   0, 0, dbox_now_ns(), &attr), 0);
	assert_int_equal(dbox_index_commit(f->index, true), 0);
	assert_int_equal(dbox_index_sync(f->index), 0);
	assert_int_equal(dbox_index_sync(f->index), 0);

	/* The index is in WAL mode. */
	snprintf(wal, sizeof(wal), "%s-wal", f->path);
	assert_int_equal(access(wal, F_OK), 0);

	/* After a durable commit, another commit is usable as usual. */
	assert_int_equal(dbox_index_begin(f->index), 0);
	assert_int_equal(dbox_index_create(f->index, DBOX_ROOT_INO, "b", 1,
					   DBOX_KIND_MESSAGE, S_IFREG | 0600,
					   0, 0, dbox_now_ns(), &attr), 0);
	assert_int_equal(dbox_index_commit(f->index, false), 0);

	/* A commit without a transaction fails (logged). */
	errors_reset();
	assert_int_equal(dbox_index_commit(f->index, false), -EIO);
	assert_true(error_count >= 1);

	/* Another connection sees the committed data. */
	struct dbox_index *other;
	assert_int_equal(dbox_index_open(f->path, false, &other), 0);
	assert_int_equal(dbox_index_lookup(other, DBOX_ROOT_INO, "a", 1,
					   &attr), 0);
	assert_int_equal(dbox_index_lookup(other, DBOX_ROOT_INO, "b", 1,
					   &attr), 0);
	dbox_index_close(&other);
	assert_null(other);

	reopen(f);
	assert_true(ino_at(f, DBOX_ROOT_INO, "a") != 0);
	assert_true(ino_at(f, DBOX_ROOT_INO, "b") != 0);
}

static off_t file_size(const char *path)
{
	struct stat st;

	assert_int_equal(stat(path, &st), 0);
	return st.st_size;
}

/* Commit one new message row at a time until the WAL file holds bytes
   bytes. */
static void fill_wal(struct fix *f, const char *wal, off_t bytes)
{
	struct dbox_attr attr;
	char name[32];
	int i;

	for (i = 0; file_size(wal) < bytes; i++) {
		snprintf(name, sizeof(name), "message-%d", i);
		assert_int_equal(dbox_index_begin(f->index), 0);
		assert_int_equal(dbox_index_create(f->index, DBOX_ROOT_INO,
						   name, strlen(name),
						   DBOX_KIND_MESSAGE,
						   S_IFREG | 0600, 0, 0,
						   dbox_now_ns(), &attr), 0);
		assert_int_equal(dbox_index_commit(f->index, false), 0);
	}
}

/* Wait until the index file grows past size, with no commit meanwhile:
   only the checkpointer thread can make it grow.  The thread runs when
   the scheduler lets it, so a loaded machine gets up to 30 s. */
static void wait_copied(struct fix *f, const char *wal, off_t size)
{
	int i;

	for (i = 0; i < 3000 && file_size(f->path) == size; i++)
		usleep(10000);
	if (file_size(f->path) == size)
		print_error("index %lld bytes, WAL %lld bytes: nothing copied\n",
			    (long long)size, (long long)file_size(wal));
	assert_true(file_size(f->path) > size);
}

/* The checkpointer thread copies the WAL into the index once it passes
   DBOX_CHECKPOINT_BYTES, long before the committing thread would do it
   itself at DBOX_CHECKPOINT_INLINE_BYTES.  (Its connection had never read
   the index, so its checkpoints did nothing: the index file kept its size
   until the inline checkpoint.) */
static void test_checkpointer_copies_the_wal(void **state)
{
	struct fix *f = *state;
	char wal[160];
	off_t db_before;

	snprintf(wal, sizeof(wal), "%s-wal", f->path);
	assert_int_equal(dbox_index_checkpointer_start(f->index, NULL, NULL), 0);
	db_before = file_size(f->path);
	fill_wal(f, wal, DBOX_CHECKPOINT_BYTES + 50 * 1024);
	/* Below the inline bound: only the thread can have copied. */
	assert_true(file_size(wal) < DBOX_CHECKPOINT_INLINE_BYTES);
	wait_copied(f, wal, db_before);
	dbox_index_checkpointer_stop(f->index);
	assert_int_equal(error_count, 0);
}

/* A checkpoint of the thread's that finds SQLite's checkpoint lock taken
   is tried again shortly, not only after DBOX_CHECKPOINT_RETRY_BYTES
   more pages (which an idle mailbox may never write).  The lock is
   byte 120 + 1 of the -shm file (SQLite's file format, "WAL-Index
   Format": the locks are bytes 120..127, the checkpoint lock second);
   an open file description lock conflicts with SQLite's own fcntl()
   locks even in this process (fcntl(2)). */
static void test_checkpointer_busy_tried_again(void **state)
{
	struct fix *f = *state;
	struct flock lock = {
		.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 121, .l_len = 1,
	};
	char wal[160], shm[160];
	off_t db_before;
	int fd;

	snprintf(wal, sizeof(wal), "%s-wal", f->path);
	snprintf(shm, sizeof(shm), "%s-shm", f->path);
	assert_int_equal(dbox_index_checkpointer_start(f->index, NULL, NULL), 0);
	fd = open(shm, O_RDWR | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(fcntl(fd, F_OFD_SETLK, &lock), 0);
	db_before = file_size(f->path);
	fill_wal(f, wal, DBOX_CHECKPOINT_BYTES + 10 * 1024);
	usleep(DBOX_CHECKPOINT_BUSY_WAIT_MS * 1000 * 4);
	assert_int_equal(file_size(f->path), db_before);
	lock.l_type = F_UNLCK;
	assert_int_equal(fcntl(fd, F_OFD_SETLK, &lock), 0);
	close(fd);
	wait_copied(f, wal, db_before);
	assert_true(file_size(wal) <
		    DBOX_CHECKPOINT_BYTES + DBOX_CHECKPOINT_RETRY_BYTES);
	dbox_index_checkpointer_stop(f->index);
	assert_int_equal(error_count, 0);
}

/* A reserve seen whole is trusted for DBOX_RESERVE_RECHECK_NS, then
   looked at again: cut from outside (as another process's index writes
   on a full disk do), it is found short and, the disk having room,
   filled again by the next check after that time. */
static void test_reserve_looked_at_again(void **state)
{
	struct fix *f = *state;
	char reserve[160];

	snprintf(reserve, sizeof(reserve), "%s" DBOX_RESERVE_SUFFIX, f->path);
	assert_int_equal(dbox_index_reserve_open(f->index), 0);
	assert_false(dbox_index_reserve_short(f->index));
	assert_int_equal(dbox_index_reserve_check(f->index), 0);
	off_t full = file_size(reserve);

	assert_true(full > 0);
	assert_int_equal(truncate(reserve, full / 2), 0);
	/* Trusted: no look at the file yet. */
	assert_int_equal(dbox_index_reserve_check(f->index), 0);
	assert_int_equal(file_size(reserve), full / 2);
	usleep(DBOX_RESERVE_RECHECK_NS / 1000 + 100000);
	assert_true(dbox_index_reserve_short(f->index));
	assert_int_equal(dbox_index_reserve_check(f->index), 0);
	assert_int_equal(file_size(reserve), full);
	assert_false(dbox_index_reserve_short(f->index));
}

/* A reader with its own connection, as dboxadm in another process, sees
   every commit whole as soon as it returned, with commits small, and
   large enough to need several WAL writes (more than 120 KiB of frames). */
static void test_commit_visible_to_other_connection(void **state)
{
	struct fix *f = *state;
	struct dbox_attr attr;
	sqlite3 *raw;
	sqlite3_stmt *count;
	char name[64];
	int64_t want = 0;

	assert_int_equal(sqlite3_open_v2(f->path, &raw, SQLITE_OPEN_READONLY,
					 NULL), SQLITE_OK);
	assert_int_equal(sqlite3_prepare_v2(raw, "SELECT count(*) FROM entry",
					    -1, &count, NULL), SQLITE_OK);
	for (int i = 0; i < 200; i++) {
		/* Every 20th transaction carries 500 names (about 60 pages). */
		int n = i % 20 == 19 ? 500 : 1;

		assert_int_equal(dbox_index_begin(f->index), 0);
		for (int k = 0; k < n; k++) {
			snprintf(name, sizeof(name), "m%d.%d.example.org:2,S", i, k);
			assert_int_equal(dbox_index_create(f->index, DBOX_ROOT_INO,
							   name, strlen(name),
							   DBOX_KIND_MESSAGE,
							   S_IFREG | 0600, 0, 0,
							   dbox_now_ns(), &attr), 0);
		}
		assert_int_equal(dbox_index_commit(f->index, i % 7 == 0), 0);
		want += n;
		assert_int_equal(sqlite3_step(count), SQLITE_ROW);
		assert_int_equal(sqlite3_column_int64(count, 0), want);
		sqlite3_reset(count);
	}
	sqlite3_finalize(count);
	assert_int_equal(sqlite3_prepare_v2(raw, "PRAGMA quick_check", -1,
					    &count, NULL), SQLITE_OK);
	assert_int_equal(sqlite3_step(count), SQLITE_ROW);
	assert_string_equal((const char *)sqlite3_column_text(count, 0), "ok");
	sqlite3_finalize(count);
	sqlite3_close(raw);
	reopen(f);
	assert_true(ino_at(f, DBOX_ROOT_INO, "m199.499.example.org:2,S") != 0);
}

static void assert_attr_same(const struct dbox_attr *a,
			     const struct dbox_attr *b)
{
	assert_attr_equal(a, b);
	assert_int_equal(a->atime_ns, b->atime_ns);
	assert_int_equal(a->rdev, b->rdev);
	assert_int_equal(a->stored, b->stored);
}


/* The first column of the first row of sql, read by a connection of its
   own: what is committed to f's index file. */
static int64_t committed_int(struct fix *f, const char *sql)
{
	sqlite3 *db;
	sqlite3_stmt *stmt;
	int64_t n;

	assert_int_equal(sqlite3_open_v2(f->path, &db, SQLITE_OPEN_READONLY,
					 NULL), SQLITE_OK);
	assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &stmt, NULL),
			 SQLITE_OK);
	assert_int_equal(sqlite3_step(stmt), SQLITE_ROW);
	n = sqlite3_column_int64(stmt, 0);
	sqlite3_finalize(stmt);
	sqlite3_close(db);
	return n;
}

/* Counts the UPDATEs of message rows (sqlite3_update_hook, set on the
   index's connection by test_msg_finish_in_place: a REPLACE is reported
   as an INSERT).  A trigger cannot count them: none fires (index_guard). */
static void count_msg_updates(void *ctx, int op, const char *db,
			      const char *table, sqlite3_int64 rowid)
{
	(void)db;
	(void)rowid;
	if (op == SQLITE_UPDATE && strcmp(table, "message") == 0)
		(*(int *)ctx)++;
}

/* The count of names in the root that is committed. */
static int64_t committed_names(struct fix *f)
{
	return committed_int(f, "SELECT count(*) FROM entry WHERE parent = 1");
}

/* The page size of f's index file. */
static int file_page_size(struct fix *f)
{
	return (int)committed_int(f, "PRAGMA page_size");
}

/* dbox_index_msg_finish: the WRITING row of the same record is updated in
   place (a trigger on UPDATE sees it; a REPLACE is a delete and an
   insert, which it does not see); a row of another record is replaced,
   and a missing row is inserted. */
static void test_msg_finish_in_place(void **state)
{
	struct fix *f = *state;
	struct dbox_msgloc loc = { .file_id = 2, .offset = 10,
				   .state = DBOX_MSG_WRITING,
				   .guid = "00000000000000000000000000000001" };
	struct dbox_msgloc back;
	uint64_t m = mk(f, DBOX_ROOT_INO, "m", DBOX_KIND_MESSAGE);
	uint64_t m2 = mk(f, DBOX_ROOT_INO, "m2", DBOX_KIND_MESSAGE);
	int updates = 0;

	tx_begin(f);
	assert_int_equal(tx_end(f, dbox_index_msg_set(f->index, m, &loc)), 0);
	sqlite3_update_hook(f->index->db, count_msg_updates, &updates);
	loc.body_size = 5;
	loc.record_size = 90;
	loc.vsize = 6;
	loc.state = DBOX_MSG_COMMITTED;
	tx_begin(f);
	assert_int_equal(tx_end(f, dbox_index_msg_finish(f->index, m, &loc)), 0);
	assert_int_equal(updates, 1);
	assert_int_equal(dbox_index_msg_get(f->index, m, &back), 0);
	assert_loc_equal(&back, &loc);

	/* Another record (a copy written elsewhere): set whole. */
	loc.file_id = 3;
	loc.offset = 400;
	memcpy(loc.guid, "00000000000000000000000000000002", 33);
	tx_begin(f);
	assert_int_equal(tx_end(f, dbox_index_msg_finish(f->index, m, &loc)), 0);
	assert_int_equal(dbox_index_msg_get(f->index, m, &back), 0);
	assert_loc_equal(&back, &loc);

	/* No row yet. */
	tx_begin(f);
	assert_int_equal(tx_end(f, dbox_index_msg_finish(f->index, m2, &loc)), 0);
	assert_int_equal(dbox_index_msg_get(f->index, m2, &back), 0);
	assert_loc_equal(&back, &loc);
	assert_int_equal(updates, 1);
}

/* With the attribute cache on (dbox_index_cache_attrs, as a mounted
   store has it), dbox_index_getattr answers what the index holds after
   every kind of change, committed or rolled back: checked against a
   second connection without the cache after each step of a random mix
   of creates, mkdirs, renames, removes, links and setattrs. */
static void test_attr_cache_follows_changes(void **state)
{
	struct fix *f = *state;
	struct dbox_index *plain;
	uint64_t dirs[4], files[64], seed = 7;
	size_t nfiles = 0;
	char name[32], name2[32];

	dbox_index_cache_attrs(f->index);
	assert_int_equal(dbox_index_open(f->path, false, &plain), 0);
	dirs[0] = DBOX_ROOT_INO;
	assert_int_equal(dbox_index_begin(f->index), 0);
	for (int d = 1; d < 4; d++) {
		struct dbox_attr attr;

		snprintf(name, sizeof(name), "d%d", d);
		assert_int_equal(dbox_index_create(f->index, DBOX_ROOT_INO, name,
						   strlen(name), DBOX_KIND_DIR,
						   S_IFDIR | 0700, 0, 0,
						   dbox_now_ns(), &attr), 0);
		dirs[d] = attr.ino;
	}
	assert_int_equal(dbox_index_commit(f->index, false), 0);
	for (int step = 0; step < 400; step++) {
		uint64_t r = xorshift64(&seed);
		uint64_t dir = dirs[r % 4], dir2 = dirs[(r >> 8) % 4];
		bool rollback = (r >> 16) % 5 == 0;
		struct dbox_attr attr, a, b;
		uint64_t ino = 0;
		uint32_t nlink;

		snprintf(name, sizeof(name), "f%llu", (unsigned long long)(r >> 20) % 40);
		snprintf(name2, sizeof(name2), "f%llu", (unsigned long long)(r >> 30) % 40);
		/* Read first, so the cache holds the values before the change. */
		for (int d = 0; d < 4; d++)
			assert_int_equal(dbox_index_getattr(f->index, dirs[d], &a), 0);
		assert_int_equal(dbox_index_begin(f->index), 0);
		switch ((r >> 40) % 6) {
		case 0:
			if (dbox_index_create(f->index, dir, name, strlen(name),
					      DBOX_KIND_MESSAGE, S_IFREG | 0600,
					      0, 0, dbox_now_ns(), &attr) == 0 &&
			    nfiles < 64)
				files[nfiles++] = attr.ino;
			break;
		case 1:
			dbox_index_rename(f->index, dir, name, strlen(name), dir2,
					  name2, strlen(name2), 0, dbox_now_ns(),
					  NULL, &ino, &nlink);
			break;
		case 2:
			dbox_index_remove(f->index, dir, name, strlen(name), false,
					  dbox_now_ns(), &ino, &nlink);
			break;
		case 3:
			if (dbox_index_lookup(f->index, dir, name, strlen(name),
					      &attr) == 0)
				dbox_index_link(f->index, attr.ino, dir2, name2,
						strlen(name2), dbox_now_ns(), &attr);
			break;
		case 4:
			if (dbox_index_getattr(f->index, dir, &attr) == 0) {
				attr.mode = S_IFDIR | (0700 ^ (r & 0077));
				attr.mtime_ns += 1000;
				dbox_index_setattr(f->index, &attr);
			}
			break;
		case 5:
			/* A message row alone: its record size is the
			   attributes' stored bytes. */
			if (nfiles > 0) {
				struct dbox_msgloc loc = {
					.file_id = 1, .offset = r % 1000,
					.record_size = 100 + (r >> 8) % 5000,
					.state = (r >> 20) % 3 == 0 ?
						DBOX_MSG_WRITING : DBOX_MSG_COMMITTED,
				};

				snprintf(loc.guid, sizeof(loc.guid), "%032llu",
					 (unsigned long long)step);
				/* Read first: the cache holds the old value. */
				dbox_index_getattr(f->index, files[r % nfiles], &attr);
				dbox_index_msg_set(f->index, files[r % nfiles], &loc);
			}
			break;
		}
		/* Inside the transaction: the cache sees the change too. */
		for (int d = 0; d < 4; d++) {
			assert_int_equal(dbox_index_getattr(f->index, dirs[d], &a), 0);
			assert_int_equal(a.ino, dirs[d]);
		}
		if (rollback)
			dbox_index_rollback(f->index);
		else
			assert_int_equal(dbox_index_commit(f->index, false), 0);
		for (int d = 0; d < 4; d++) {
			assert_int_equal(dbox_index_getattr(f->index, dirs[d], &a), 0);
			assert_int_equal(dbox_index_getattr(plain, dirs[d], &b), 0);
			assert_attr_same(&a, &b);
		}
		for (size_t k = 0; k < nfiles; k++) {
			int ra = dbox_index_getattr(f->index, files[k], &a);

			assert_int_equal(ra, dbox_index_getattr(plain, files[k], &b));
			if (ra == 0)
				assert_attr_same(&a, &b);
		}
	}
	dbox_index_close(&plain);
}

static void test_rollback(void **state)
{
	struct fix *f = *state;
	struct dbox_attr root0, attr, d;
	uint64_t keep = mk(f, DBOX_ROOT_INO, "keep", DBOX_KIND_MESSAGE);

	root0 = attr_of(f, DBOX_ROOT_INO);
	assert_int_equal(dbox_index_begin(f->index), 0);
	assert_int_equal(dbox_index_create(f->index, DBOX_ROOT_INO, "d", 1,
					   DBOX_KIND_DIR, S_IFDIR | 0700, 0, 0,
					   root0.mtime_ns + 10, &d), 0);
	assert_int_equal(dbox_index_create(f->index, d.ino, "m", 1,
					   DBOX_KIND_MESSAGE, S_IFREG | 0600,
					   0, 0, root0.mtime_ns + 10, &attr),
			 0);
	assert_int_equal(dbox_index_lookup(f->index, DBOX_ROOT_INO, "d", 1,
					   &attr), 0);
	dbox_index_rollback(f->index);

	assert_int_equal(dbox_index_lookup(f->index, DBOX_ROOT_INO, "d", 1,
					   &attr), -ENOENT);
	assert_false(exists(f, d.ino));
	attr = attr_of(f, DBOX_ROOT_INO);
	assert_attr_equal(&attr, &root0);
	assert_int_equal(ino_at(f, DBOX_ROOT_INO, "keep"), keep);

	/* Rollback outside a transaction is a no-op; begin works after. */
	dbox_index_rollback(f->index);
	dbox_index_rollback(f->index);
	mk(f, DBOX_ROOT_INO, "d", DBOX_KIND_DIR);
	reopen(f);
	assert_true(ino_at(f, DBOX_ROOT_INO, "d") != 0);
}


/* Create name in the root as one operation, ended by commit_later
   (made_inodes: as the mount's create of a message says); its inode. */
static uint64_t create_later_as(struct fix *f, const char *name,
				bool made_inodes)
{
	struct dbox_attr attr;

	assert_int_equal(dbox_index_begin(f->index), 0);
	assert_int_equal(dbox_index_create(f->index, DBOX_ROOT_INO, name,
					   strlen(name), DBOX_KIND_MESSAGE,
					   S_IFREG | 0600, 0, 0, dbox_now_ns(),
					   &attr), 0);
	assert_int_equal(dbox_index_commit_later(f->index, made_inodes), 0);
	return attr.ino;
}

static void create_later(struct fix *f, const char *name)
{
	create_later_as(f, name, false);
}

/* Deferred commits: operations ended by commit_later are seen by this
   connection at once and by others only after a commit (of another
   operation, commit_deferred or the close); a rollback of a later
   operation undoes that one only; a failed operation leaves the
   deferred ones alone. */
static void test_deferred_commits(void **state)
{
	struct fix *f = *state;
	struct dbox_attr attr;
	uint64_t seq = dbox_index_commit_seq(f->index);
	int64_t names0 = committed_names(f);

	assert_false(dbox_index_deferred(f->index));
	create_later(f, "a");
	create_later(f, "b");
	assert_true(dbox_index_deferred(f->index));
	assert_int_equal(dbox_index_commit_seq(f->index), seq);
	assert_true(ino_at(f, DBOX_ROOT_INO, "b") != 0);
	assert_int_equal(committed_names(f), names0);

	/* An operation that fails is undone alone. */
	assert_int_equal(dbox_index_begin(f->index), 0);
	assert_int_equal(dbox_index_create(f->index, DBOX_ROOT_INO, "c", 1,
					   DBOX_KIND_MESSAGE, S_IFREG | 0600,
					   0, 0, dbox_now_ns(), &attr), 0);
	assert_int_equal(dbox_index_create(f->index, DBOX_ROOT_INO, "a", 1,
					   DBOX_KIND_MESSAGE, S_IFREG | 0600,
					   0, 0, dbox_now_ns(), &attr), -EEXIST);
	dbox_index_rollback(f->index);
	assert_true(dbox_index_deferred(f->index));
	assert_int_equal(dbox_index_lookup(f->index, DBOX_ROOT_INO, "c", 1,
					   &attr), -ENOENT);
	assert_true(ino_at(f, DBOX_ROOT_INO, "a") != 0);
	/* A rollback outside an operation leaves the deferred ones. */
	dbox_index_rollback(f->index);
	assert_true(ino_at(f, DBOX_ROOT_INO, "b") != 0);

	/* An operation that commits takes the deferred ones with it. */
	assert_int_equal(tx_create(f, DBOX_ROOT_INO, "d", DBOX_KIND_MESSAGE,
				   &attr), 0);
	assert_false(dbox_index_deferred(f->index));
	assert_int_equal(dbox_index_commit_seq(f->index), seq + 1);
	assert_int_equal(committed_names(f), names0 + 3);

	/* commit_deferred, and nothing to do without deferred ones. */
	create_later(f, "e");
	assert_int_equal(committed_names(f), names0 + 3);
	assert_int_equal(dbox_index_commit_deferred(f->index), 0);
	assert_int_equal(committed_names(f), names0 + 4);
	assert_int_equal(dbox_index_commit_deferred(f->index), 0);
	assert_int_equal(dbox_index_commit_seq(f->index), seq + 2);

	/* A write outside an operation (a purge's in-flight mark, written
	   without a transaction of its own) is committed when it returns,
	   with the deferred ones before it: it joined them and a kill lost
	   it (a purge's copies without their mark, test_crash.py). */
	create_later(f, "g");
	assert_int_equal(dbox_index_meta_set(f->index, "test.mark", 7), 0);
	assert_false(dbox_index_deferred(f->index));
	assert_int_equal(committed_int(f, "SELECT value FROM meta WHERE "
				       "key = 'test.mark'"), 7);
	assert_int_equal(committed_names(f), names0 + 5);
	create_later(f, "h");
	assert_int_equal(dbox_index_meta_delete(f->index, "test.mark"), 0);
	assert_int_equal(committed_int(f, "SELECT count(*) FROM meta WHERE "
				       "key = 'test.mark'"), 0);
	assert_int_equal(committed_names(f), names0 + 6);

	/* The close commits what is deferred. */
	create_later(f, "f");
	reopen(f);
	assert_int_equal(committed_names(f), names0 + 7);
	assert_true(ino_at(f, DBOX_ROOT_INO, "f") != 0);
	assert_int_equal(error_count, 0);
}

/* Deferred operations that made inodes, undone (here by a ROLLBACK as
   SQLite makes one after an I/O error): the next create would get the
   same inode number while the kernel still knows the first, so no write
   transaction begins any more (EIO, said once) until the index is
   opened again; reads go on.  Undone deferred operations that made no
   inode (flag renames) stop nothing. */
static void test_undone_deferred_creates_stop_writes(void **state)
{
	struct fix *f = *state;
	struct dbox_attr attr;
	uint64_t ino;

	create_later(f, "flag");
	assert_int_equal(sqlite3_exec(f->index->db, "ROLLBACK", NULL, NULL,
				      NULL), SQLITE_OK);
	errors_reset();
	mk(f, DBOX_ROOT_INO, "after-flag", DBOX_KIND_FILE);
	assert_int_equal(error_count, 1); /* "the last renames ... undone" */

	ino = create_later_as(f, "new", true);
	assert_int_equal(sqlite3_exec(f->index->db, "ROLLBACK", NULL, NULL,
				      NULL), SQLITE_OK);
	errors_reset();
	assert_int_equal(dbox_index_begin(f->index), -EIO);
	assert_non_null(strstr(last_error, "mount it again"));
	assert_int_equal(dbox_index_begin(f->index), -EIO);
	assert_int_equal(dbox_index_lookup(f->index, DBOX_ROOT_INO, "new", 3,
					   &attr), -ENOENT);
	assert_true(ino_at(f, DBOX_ROOT_INO, "after-flag") != 0);
	/* Opened again: writes go on (the kernel of a new mount knows no
	   inode of the old one). */
	reopen(f);
	assert_true(mk(f, DBOX_ROOT_INO, "later", DBOX_KIND_FILE) >= ino);
	errors_reset();
}

/* An index holding a trigger or view dboxfs did not make - the store
   owner's, run inside root's dboxadm (one that never ends hung purge
   and the mount: helper-83) - is refused at open, read-only too, with
   its name in the message; dboxfs's own trigger, as it made it, is
   accepted, a changed one is not. */
static void test_foreign_trigger_refused(void **state)
{
	static const char *const hostile[] = {
		"CREATE TRIGGER evil AFTER INSERT ON inode BEGIN"
		" SELECT 1; END;",
		"CREATE VIEW evil AS SELECT 1;",
		"DROP TRIGGER inode_gone; CREATE TRIGGER inode_gone AFTER DELETE"
		" ON inode BEGIN SELECT 1; END;",
	};
	struct fix *f = *state;
	struct dbox_index *index = NULL;
	char path[160];

	for (size_t i = 0; i < sizeof(hostile) / sizeof(hostile[0]); i++) {
		snprintf(path, sizeof(path), "%s/hostile%zu.sqlite", f->dir, i);
		assert_int_equal(dbox_index_open(path, true, &index), 0);
		dbox_index_close(&index);
		raw_sql(path, hostile[i]);
		errors_reset();
		assert_int_equal(dbox_index_open(path, false, &index), -EIO);
		assert_null(index);
		assert_non_null(strstr(last_error, "did not make"));
		assert_non_null(strstr(last_error, i == 2 ? "inode_gone" :
					"evil"));
		assert_int_equal(dbox_index_open_readonly(path, &index), -EIO);
		assert_null(index);
	}
	/* The fixture's index, with dboxfs's own trigger, opens. */
	reopen(f);
	errors_reset();
	assert_int_equal(error_count, 0);
}

/* A trigger or view the store's owner adds while the index is open -
   after the check at open, between root's dboxadm's check and its
   writes - does nothing (index_guard): a foreign trigger does not run,
   nor does a replaced inode_gone (an inode's symlink and xattr rows go
   with it all the same), and a table replaced by a view (here an endless
   one, which would hang the process) makes its statements fail at
   once. */
static void test_trigger_added_while_open_does_nothing(void **state)
{
	struct fix *f = *state;
	uint64_t keep = mk(f, DBOX_ROOT_INO, "keep", DBOX_KIND_FILE);
	uint64_t gone = mk(f, DBOX_ROOT_INO, "gone", DBOX_KIND_FILE);
	int64_t format = 0;
	uint32_t nlink;
	uint64_t ino;
	void *value = NULL;
	size_t len;

	tx_begin(f);
	assert_int_equal(dbox_index_xattr_set(f->index, gone, "user.a", "1", 1,
					      0), 0);
	assert_int_equal(dbox_index_xattr_set(f->index, keep, "user.b", "2", 1,
					      0), 0);
	assert_int_equal(tx_end(f, 0), 0);
	raw_sql(f->path, "CREATE TABLE evil_log (x);"
		"CREATE TRIGGER evil AFTER INSERT ON inode BEGIN"
		" INSERT INTO evil_log VALUES (1);"
		" UPDATE meta SET value = 99 WHERE key = 'format'; END;"
		"DROP TRIGGER inode_gone;"
		"CREATE TRIGGER inode_gone AFTER DELETE ON inode BEGIN"
		" DELETE FROM entry; DELETE FROM xattr; END;");
	mk(f, DBOX_ROOT_INO, "new", DBOX_KIND_FILE);
	assert_int_equal(committed_int(f, "SELECT count(*) FROM evil_log"), 0);
	assert_int_equal(dbox_index_meta_get(f->index, "format", &format), 0);
	assert_int_not_equal(format, 99);

	tx_begin(f);
	assert_int_equal(dbox_index_remove(f->index, DBOX_ROOT_INO, "gone", 4,
					   false, dbox_now_ns(), &ino, &nlink),
			 0);
	assert_int_equal(dbox_index_delete_inode(f->index, ino), 0);
	assert_int_equal(tx_end(f, 0), 0);
	/* keep's attribute only; keep and new still named. */
	assert_int_equal(committed_int(f, "SELECT count(*) FROM xattr"), 1);
	assert_int_equal(ino_at(f, DBOX_ROOT_INO, "keep"), keep);
	assert_int_equal(committed_int(f, "SELECT count(*) FROM entry"), 2);
	assert_int_equal(dbox_index_xattr_get(f->index, gone, "user.a", &value,
					      &len), -ENODATA);
	assert_int_equal(dbox_index_xattr_get(f->index, keep, "user.b", &value,
					      &len), 0);
	free(value);

	raw_sql(f->path, "DROP TABLE xattr; CREATE VIEW xattr AS"
		" WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1"
		" FROM r) SELECT n AS ino, 'user.b' AS name, 'x' AS value"
		" FROM r WHERE n < 0;");
	errors_reset();
	value = NULL;
	assert_true(dbox_index_xattr_get(f->index, keep, "user.b", &value,
					  &len) < 0);
	assert_null(value);
	assert_true(error_count > 0);
	errors_reset();
}

static void test_setattr(void **state)
{
	struct fix *f = *state;
	uint64_t p = mk(f, DBOX_ROOT_INO, "p", DBOX_KIND_FILE);
	struct dbox_attr attr = attr_of(f, p), back;

	assert_int_equal(tx_link(f, p, DBOX_ROOT_INO, "p2", NULL), 0);
	attr.kind = DBOX_KIND_MESSAGE;
	attr.mode = S_IFREG | 0400;
	attr.uid = 7;
	attr.gid = 8;
	attr.size = 1ULL << 40;
	attr.mtime_ns = 111;
	attr.ctime_ns = 222;
	attr.nlink = 99; /* ignored */
	tx_begin(f);
	assert_int_equal(tx_end(f, dbox_index_setattr(f->index, &attr)), 0);
	back = attr_of(f, p);
	assert_int_equal(back.kind, DBOX_KIND_MESSAGE);
	assert_int_equal(back.mode, S_IFREG | 0400);
	assert_int_equal(back.uid, 7);
	assert_int_equal(back.gid, 8);
	assert_int_equal(back.size, 1ULL << 40);
	assert_int_equal(back.mtime_ns, 111);
	assert_int_equal(back.ctime_ns, 222);
	assert_int_equal(back.nlink, 2);

	attr.ino = p + 100;
	tx_begin(f);
	assert_int_equal(tx_end(f, dbox_index_setattr(f->index, &attr)),
			 -ENOENT);
}

/* A symlink's target: stored byte for byte with its length as size,
   readlink of anything else is -EINVAL, the row goes with the inode. */
static void test_symlink(void **state)
{
	struct fix *f = *state;
	char *target = NULL;
	char longest[4096];
	uint64_t l, p = mk(f, DBOX_ROOT_INO, "p", DBOX_KIND_FILE);
	struct dbox_attr attr;
	uint32_t nlink;
	uint64_t ino;

	tx_begin(f);
	assert_int_equal(dbox_index_create(f->index, DBOX_ROOT_INO, "l", 1,
					   DBOX_KIND_SYMLINK, S_IFLNK | 0777,
					   0, 0, dbox_now_ns(), &attr), 0);
	l = attr.ino;
	assert_int_equal(dbox_index_symlink_set(f->index, l, "../x y\n", 7), 0);
	assert_int_equal(tx_end(f, 0), 0);
	assert_int_equal(attr_of(f, l).size, 7);
	assert_int_equal(attr_of(f, l).kind, DBOX_KIND_SYMLINK);
	reopen(f);
	assert_int_equal(dbox_index_readlink(f->index, l, &target), 0);
	assert_string_equal(target, "../x y\n");
	free(target);
	assert_int_equal(dbox_index_readlink(f->index, p, &target), -EINVAL);

	memset(longest, 'a', sizeof(longest));
	tx_begin(f);
	assert_int_equal(dbox_index_symlink_set(f->index, l, longest, 4095), 0);
	assert_int_equal(dbox_index_symlink_set(f->index, l, longest, 4096),
			 -ENAMETOOLONG);
	assert_int_equal(tx_end(f, 0), 0);
	assert_int_equal(attr_of(f, l).size, 4095);

	tx_begin(f);
	assert_int_equal(dbox_index_remove(f->index, DBOX_ROOT_INO, "l", 1, false,
					   dbox_now_ns(), &ino, &nlink), 0);
	assert_int_equal(nlink, 0);
	assert_int_equal(dbox_index_delete_inode(f->index, ino), 0);
	assert_int_equal(tx_end(f, 0), 0);
	dbox_index_close(&f->index);
	raw_sql(f->path, "CREATE TABLE t AS SELECT count(*) AS n FROM symlink;"
		"INSERT INTO meta VALUES ('symlinks_left', (SELECT n FROM t));");
	assert_int_equal(dbox_index_open(f->path, false, &f->index), 0);
	{
		int64_t left = -1;

		assert_int_equal(dbox_index_meta_get(f->index, "symlinks_left",
						     &left), 0);
		assert_int_equal(left, 0);
	}
}

/* user.* attributes: set/get/list/remove with setxattr(2)'s flags and
   errors, limits, and the rows going with the inode. */
static void test_xattr(void **state)
{
	struct fix *f = *state;
	uint64_t p = mk(f, DBOX_ROOT_INO, "p", DBOX_KIND_FILE);
	static char big[DBOX_XATTR_SIZE_MAX + 1];
	char name[300], *list = NULL;
	void *value = NULL;
	size_t len = 0;
	uint32_t nlink;
	uint64_t ino;

	assert_int_equal(dbox_index_xattr_get(f->index, p, "user.a", &value, &len),
			 -ENODATA);
	assert_int_equal(dbox_index_xattr_list(f->index, p, &list, &len), 0);
	assert_null(list);
	assert_int_equal(len, 0);
	tx_begin(f);
	assert_int_equal(dbox_index_xattr_set(f->index, p, "user.b", "v\0w", 3, 0), 0);
	assert_int_equal(dbox_index_xattr_set(f->index, p, "user.a", NULL, 0,
					      XATTR_CREATE), 0);
	assert_int_equal(dbox_index_xattr_set(f->index, p, "user.a", "x", 1,
					      XATTR_CREATE), -EEXIST);
	assert_int_equal(dbox_index_xattr_set(f->index, p, "user.c", "x", 1,
					      XATTR_REPLACE), -ENODATA);
	assert_int_equal(dbox_index_xattr_set(f->index, p, "user.b", "vw", 2,
					      XATTR_REPLACE), 0);
	assert_int_equal(tx_end(f, 0), 0);
	reopen(f);
	assert_int_equal(dbox_index_xattr_get(f->index, p, "user.b", &value, &len), 0);
	assert_int_equal(len, 2);
	assert_memory_equal(value, "vw", 2);
	free(value);
	assert_int_equal(dbox_index_xattr_get(f->index, p, "user.a", &value, &len), 0);
	assert_int_equal(len, 0);
	assert_null(value);
	assert_int_equal(dbox_index_xattr_list(f->index, p, &list, &len), 0);
	assert_int_equal(len, 14);
	assert_memory_equal(list, "user.a\0user.b\0", 14);
	free(list);

	/* Limits. */
	memset(name, 'n', sizeof(name));
	memcpy(name, "user.", 5);
	name[DBOX_XATTR_NAME_MAX] = '\0';
	tx_begin(f);
	assert_int_equal(dbox_index_xattr_set(f->index, p, name, "", 0, 0), 0);
	name[DBOX_XATTR_NAME_MAX] = 'n';
	name[DBOX_XATTR_NAME_MAX + 1] = '\0';
	assert_int_equal(dbox_index_xattr_set(f->index, p, name, "", 0, 0), -ERANGE);
	assert_int_equal(dbox_index_xattr_set(f->index, p, "user.big", big,
					      DBOX_XATTR_SIZE_MAX, 0), 0);
	assert_int_equal(dbox_index_xattr_set(f->index, p, "user.big", big,
					      DBOX_XATTR_SIZE_MAX + 1, 0), -ERANGE);
	/* The total per inode: 1 MiB of names and values. */
	for (int i = 0; i < 14; i++) {
		char n[24];

		snprintf(n, sizeof(n), "user.v%d", i);
		assert_int_equal(dbox_index_xattr_set(f->index, p, n, big,
						      DBOX_XATTR_SIZE_MAX, 0), 0);
	}
	assert_int_equal(dbox_index_xattr_set(f->index, p, "user.v14", big,
					      DBOX_XATTR_SIZE_MAX, 0), -ENOSPC);
	/* Replacing one within the total is fine. */
	assert_int_equal(dbox_index_xattr_set(f->index, p, "user.v0", big, 10, 0), 0);
	assert_int_equal(dbox_index_xattr_remove(f->index, p, "user.a"), 0);
	assert_int_equal(dbox_index_xattr_remove(f->index, p, "user.a"), -ENODATA);
	assert_int_equal(tx_end(f, 0), 0);

	/* Gone with the inode. */
	tx_begin(f);
	assert_int_equal(dbox_index_remove(f->index, DBOX_ROOT_INO, "p", 1, false,
					   dbox_now_ns(), &ino, &nlink), 0);
	assert_int_equal(dbox_index_delete_inode(f->index, ino), 0);
	assert_int_equal(tx_end(f, 0), 0);
	assert_int_equal(dbox_index_xattr_list(f->index, p, &list, &len), 0);
	assert_null(list);
}


/* f's index closed and rewritten with 4096-byte pages, as indexes were
   made before 2026-12-02, then opened again (dbox_index_open keeps the
   page size it finds). */
static void make_old_page_size(struct fix *f)
{
	sqlite3 *db;

	dbox_index_close(&f->index);
	assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
	assert_int_equal(sqlite3_exec(db, "PRAGMA journal_mode=DELETE;"
				      "PRAGMA page_size=4096; VACUUM;"
				      "PRAGMA journal_mode=WAL;", NULL, NULL,
				      NULL), SQLITE_OK);
	sqlite3_close(db);
	assert_int_equal(file_page_size(f), 4096);
	assert_int_equal(dbox_index_open(f->path, false, &f->index), 0);
	assert_int_equal(file_page_size(f), 4096);
}

/* A new index has 1024-byte pages; an older one with 4096-byte pages is
   rewritten with 1024-byte ones by dbox_index_convert_pages, keeping
   every row (inode numbers and readdir order included), and stays in
   WAL mode. */
static void test_convert_pages(void **state)
{
	struct fix *f = *state;
	struct dbox_attr d, m, back;
	struct listing *l = listing_new(0);
	uint64_t names[3];
	char name[8];

	assert_int_equal(file_page_size(f), 1024);
	assert_int_equal(dbox_index_convert_pages(f->index), 0); /* no-op */
	assert_int_equal(tx_create(f, DBOX_ROOT_INO, "d", DBOX_KIND_DIR, &d),
			 0);
	for (int i = 0; i < 3; i++) {
		snprintf(name, sizeof(name), "m%d", 2 - i);
		assert_int_equal(tx_create(f, d.ino, name, DBOX_KIND_MESSAGE,
					   &m), 0);
		names[i] = m.ino;
	}
	make_old_page_size(f);
	assert_int_equal(dbox_index_convert_pages(f->index), 0);
	assert_int_equal(file_page_size(f), 1024);
	assert_int_equal(error_count, 0);
	/* The rows, with their numbers and order, and the index writable. */
	assert_int_equal(dbox_index_lookup(f->index, d.ino, "m0", 2, &back), 0);
	assert_int_equal(back.ino, names[2]);
	list_page(f, d.ino, 0, l);
	assert_int_equal(l->count, 3);
	for (int i = 0; i < 3; i++)
		assert_int_equal(l->ino[i], names[i]); /* creation order */
	free(l);
	assert_int_equal(tx_create(f, d.ino, "after", DBOX_KIND_MESSAGE, &m), 0);
	reopen(f);
	assert_int_equal(file_page_size(f), 1024);
	assert_int_equal(dbox_index_lookup(f->index, d.ino, "after", 5, &back),
			 0);
	assert_int_equal(back.ino, m.ino);
}

/* Another process reading the old index: it is left as it is (-EBUSY
   after SQLite's busy wait), in WAL mode and writable; the next try,
   with the reader gone, rewrites it. */
static void test_convert_pages_busy(void **state)
{
	struct fix *f = *state;
	struct dbox_attr m;
	sqlite3_stmt *stmt;
	sqlite3 *reader;

	make_old_page_size(f);
	assert_int_equal(sqlite3_open_v2(f->path, &reader,
					 SQLITE_OPEN_READONLY, NULL),
			 SQLITE_OK);
	assert_int_equal(sqlite3_prepare_v2(reader, "SELECT ino FROM inode",
					    -1, &stmt, NULL), SQLITE_OK);
	assert_int_equal(sqlite3_step(stmt), SQLITE_ROW); /* reading */
	assert_int_equal(dbox_index_convert_pages(f->index), -EBUSY);
	assert_int_equal(file_page_size(f), 4096);
	assert_int_equal(tx_create(f, DBOX_ROOT_INO, "m", DBOX_KIND_MESSAGE,
				   &m), 0);
	sqlite3_finalize(stmt);
	sqlite3_close(reader);
	errors_reset();
	assert_int_equal(dbox_index_convert_pages(f->index), 0);
	assert_int_equal(file_page_size(f), 1024);
	assert_int_equal(error_count, 0);
}

/* A damaged old index (a page of garbage past what opening it reads):
   the rewrite fails, is not taken for an unusable index (-EIO: the
   store would not open), and leaves it in WAL mode with its old
   pages. */
static void test_convert_pages_damaged(void **state)
{
	struct fix *f = *state;
	struct dbox_attr m;
	char garbage[4096], name[24];
	sqlite3_stmt *stmt;
	sqlite3 *db;
	off_t size;
	int fd;

	for (int i = 0; i < 400; i++) {
		snprintf(name, sizeof(name), "message-%d", i);
		assert_int_equal(tx_create(f, DBOX_ROOT_INO, name,
					   DBOX_KIND_MESSAGE, &m), 0);
	}
	make_old_page_size(f);
	dbox_index_close(&f->index);
	size = file_size(f->path);
	memset(garbage, 0x5a, sizeof(garbage));
	fd = open(f->path, O_WRONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, garbage, sizeof(garbage),
				size - (off_t)sizeof(garbage)),
			 (ssize_t)sizeof(garbage));
	close(fd);
	assert_int_equal(dbox_index_open(f->path, false, &f->index), 0);
	errors_reset();
	assert_int_equal(dbox_index_convert_pages(f->index), -EAGAIN);
	assert_int_equal(file_page_size(f), 4096);
	assert_int_equal(sqlite3_open_v2(f->path, &db, SQLITE_OPEN_READONLY,
					 NULL), SQLITE_OK);
	assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1,
					    &stmt, NULL), SQLITE_OK);
	assert_int_equal(sqlite3_step(stmt), SQLITE_ROW);
	assert_string_equal((const char *)sqlite3_column_text(stmt, 0), "wal");
	sqlite3_finalize(stmt);
	sqlite3_close(db);
}

#define T(f) cmocka_unit_test_setup_teardown(f, fix_setup, fix_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_open_create),
		T(test_reopen_keeps_data),
		T(test_format_newer),
		T(test_format1_upgrade),
		T(test_format2_upgrade),
		T(test_not_an_index),
		T(test_create_lookup_getattr),
		T(test_lookup_unique),
		T(test_create_errors),
		T(test_names_arbitrary_bytes),
		T(test_link),
		T(test_remove),
		T(test_rename_same_dir),
		T(test_rename_across_dirs),
		T(test_rename_replace_file),
		T(test_rename_replace_dir),
		T(test_rename_into_itself),
		T(test_rename_same_inode),
		T(test_rename_noreplace),
		T(test_rename_exchange),
		T(test_time_range),
		T(test_dir_mtime_now),
		T(test_readdir_order_resume),
		T(test_readdir_cb_error),
		T(test_readdir_rename_during),
		T(test_readdir_many),
		T(test_mailbox_name),
		T(test_path),
		T(test_msg_roundtrip),
		T(test_mfile),
		T(test_recover),
		T(test_commit_sync),
		T(test_checkpointer_copies_the_wal),
		T(test_checkpointer_busy_tried_again),
		T(test_reserve_looked_at_again),
		T(test_commit_visible_to_other_connection),
		T(test_msg_finish_in_place),
		T(test_attr_cache_follows_changes),
		T(test_rollback),
		T(test_deferred_commits),
		T(test_foreign_trigger_refused),
		T(test_trigger_added_while_open_does_nothing),
		T(test_undone_deferred_creates_stop_writes),
		T(test_setattr),
		T(test_symlink),
		T(test_xattr),
		T(test_convert_pages),
		T(test_convert_pages_busy),
		T(test_convert_pages_damaged),
	};

	dbox_log_set_sink(capture_sink);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
