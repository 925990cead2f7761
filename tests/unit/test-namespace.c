/*
 * test-namespace.c: unit tests of the namespace operations of the engine
 * (engine/namespace.h) on a real store in a temporary directory: rename
 * over a message (the old one expunged, the moved inode's attributes
 * returned), a directory moved into its own child, unlink of the last
 * name of a message, link counts, rmdir and rename over non-empty
 * directories, inodes held by the caller, plain files' backing files,
 * the setgid rule, symlinks, special files, setattr and xattrs.
 *
 * Sticky directories (S_ISVTX) are not tested here: the namespace does not
 * check permissions; the kernel does (dboxfs mounts with
 * default_permissions), and tests/mounted/test_posix_conformance.py
 * covers it on the mount.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "engine/store-dirs.h"
#include "engine/namespace.h"
#include "engine/store.h"
#include "index/index.h"
#include "test-common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif

struct fix {
	struct inbox_fix s;
	uint64_t held;    /* the inode hook_held says is held, or 0 */
	unsigned int held_calls;
};

static int setup(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	inbox_fix_open(&f->s, "test-namespace");
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fix *f = *state;

	inbox_fix_close(&f->s);
	free(f);
	return 0;
}

static bool hook_held(void *ctx, uint64_t ino)
{
	struct fix *f = ctx;

	f->held_calls++;
	return ino == f->held;
}

static struct dbox_ns_hooks hooks_of(struct fix *f)
{
	return (struct dbox_ns_hooks){ .held = hook_held, .ctx = f };
}

/* A committed message parent/name with body text; its inode and m.N. */
static uint64_t add_msg(struct fix *f, uint64_t parent, const char *name,
			const char *text, uint32_t *file_id_r)
{
	struct dbox_store *st = f->s.st;
	struct dbox_save *save = NULL;
	struct dbox_msgloc loc;
	struct dbox_attr attr;

	assert_int_equal(dbox_index_begin(st->index), 0);
	assert_int_equal(dbox_index_create(st->index, parent, name,
					   strlen(name), DBOX_KIND_MESSAGE,
					   S_IFREG | 0600, getuid(), getgid(),
					   dbox_now_ns(), &attr), 0);
	assert_int_equal(dbox_save_begin(st, attr.ino, "INBOX", &save), 0);
	assert_int_equal(dbox_save_write(save, text, strlen(text), 0), 0);
	assert_int_equal(dbox_save_finish(save, 1700000000, false, &loc), 0);
	attr.size = strlen(text);
	attr.mtime_ns = dbox_time_make(1700000000, 0);
	assert_int_equal(dbox_index_setattr(st->index, &attr), 0);
	assert_int_equal(dbox_index_commit(st->index, false), 0);
	dbox_save_free(&save);
	if (file_id_r != NULL)
		*file_id_r = loc.file_id;
	return attr.ino;
}

static uint64_t add_dir(struct fix *f, uint64_t parent, const char *name)
{
	struct dbox_ns_new nw = {
		.kind = DBOX_KIND_DIR, .mode = S_IFDIR | 0755,
		.uid = getuid(), .gid = getgid(),
	};
	struct dbox_attr attr;

	assert_int_equal(dbox_ns_create(f->s.st, parent, name, &nw, &attr), 0);
	assert_int_equal(attr.kind, DBOX_KIND_DIR);
	assert_int_equal(attr.nlink, 2);
	return attr.ino;
}

/* A plain file parent/name with its backing file in files/. */
static uint64_t add_plain(struct fix *f, uint64_t parent, const char *name)
{
	struct dbox_attr attr;
	char file[24];
	int fd;

	assert_int_equal(dbox_index_begin(f->s.st->index), 0);
	assert_int_equal(dbox_index_create(f->s.st->index, parent, name,
					   strlen(name), DBOX_KIND_FILE,
					   S_IFREG | 0644, getuid(), getgid(),
					   dbox_now_ns(), &attr), 0);
	assert_int_equal(dbox_index_commit(f->s.st->index, false), 0);
	dbox_files_name(file, attr.ino);
	fd = openat(f->s.st->files_fd, file, O_CREAT | O_EXCL | O_WRONLY, 0600);
	assert_true(fd >= 0);
	close(fd);
	return attr.ino;
}

static bool backing_exists(struct fix *f, uint64_t ino)
{
	struct stat sb;
	char file[24];

	dbox_files_name(file, ino);
	return fstatat(f->s.st->files_fd, file, &sb, AT_SYMLINK_NOFOLLOW) == 0;
}

static void assert_gone_ino(struct fix *f, uint64_t ino)
{
	struct dbox_attr attr;
	struct dbox_msgloc loc;

	assert_int_equal(dbox_ns_getattr(f->s.st, ino, &attr), -ENOENT);
	assert_int_equal(dbox_index_msg_get(f->s.st->index, ino, &loc), -ENOENT);
}

/* --- rename ------------------------------------------------------------ */

static void test_rename_over_message(void **state)
{
	struct fix *f = *state;
	struct dbox_ns_hooks hooks = hooks_of(f);
	uint32_t old_file, new_file;
	uint64_t a = add_msg(f, f->s.cur, "a:2,", "From: a\n\nnew text\n", &new_file);
	uint64_t b = add_msg(f, f->s.cur, "b:2,S", "From: b\n\nold\n", &old_file);
	struct dbox_attr before, moved, attr;
	struct dbox_ns_gone gone;

	assert_int_equal(dbox_ns_getattr(f->s.st, a, &before), 0);
	assert_int_equal(dbox_ns_rename(f->s.st, f->s.cur, "a:2,", f->s.cur, "b:2,S",
					0, &hooks, &moved, &gone), 0);
	/* The moved inode's attributes: number, size, mtime kept; ctime
	   moved on. */
	assert_int_equal(moved.ino, a);
	assert_int_equal(moved.kind, DBOX_KIND_MESSAGE);
	assert_int_equal(moved.size, strlen("From: a\n\nnew text\n"));
	assert_int_equal(moved.nlink, 1);
	assert_true(moved.mtime_ns == before.mtime_ns);
	assert_true(dbox_time_cmp(moved.ctime_ns, before.ctime_ns) >= 0);
	/* ... and they are what the index holds now. */
	assert_int_equal(dbox_ns_getattr(f->s.st, a, &attr), 0);
	assert_int_equal(attr.ctime_ns, moved.ctime_ns);
	assert_int_equal(attr.size, moved.size);
	/* The old target is expunged: name, inode and message row. */
	assert_int_equal(gone.ino, b);
	assert_int_equal(gone.nlink, 0);
	assert_true(gone.deleted);
	assert_int_equal(gone.garbage_file_id, old_file);
	assert_int_equal(f->held_calls, 1);
	assert_gone_ino(f, b);
	assert_int_equal(dbox_ns_lookup(f->s.st, f->s.cur, "b:2,S", &attr), 0);
	assert_int_equal(attr.ino, a);
	assert_int_equal(dbox_ns_lookup(f->s.st, f->s.cur, "a:2,", &attr), -ENOENT);
}

static void test_rename_over_held_message(void **state)
{
	struct fix *f = *state;
	struct dbox_ns_hooks hooks = hooks_of(f);
	uint32_t file_b;
	uint64_t a = add_msg(f, f->s.cur, "a", "A\n", NULL);
	uint64_t b = add_msg(f, f->s.cur, "b", "B\n", &file_b);
	struct dbox_attr moved, attr;
	struct dbox_ns_gone gone;

	f->held = b; /* open, or known to the kernel */
	assert_int_equal(dbox_ns_rename(f->s.st, f->s.cur, "a", f->s.cur, "b", 0,
					&hooks, &moved, &gone), 0);
	assert_int_equal(moved.ino, a);
	assert_int_equal(gone.ino, b);
	assert_false(gone.deleted);
	assert_int_equal(gone.garbage_file_id, 0);
	/* Still readable by its holder, with no names. */
	assert_int_equal(dbox_ns_getattr(f->s.st, b, &attr), 0);
	assert_int_equal(attr.nlink, 0);
	/* The holder lets go. */
	assert_int_equal(dbox_ns_delete_orphan(f->s.st, b, &gone), 0);
	assert_true(gone.deleted);
	assert_int_equal(gone.garbage_file_id, file_b);
	assert_gone_ino(f, b);
	/* Again: nothing left to do. */
	assert_int_equal(dbox_ns_delete_orphan(f->s.st, b, &gone), 0);
	assert_false(gone.deleted);
}

static void test_rename_dir_into_child(void **state)
{
	struct fix *f = *state;
	uint64_t d = add_dir(f, DBOX_ROOT_INO, ".A");
	uint64_t c = add_dir(f, d, "child");
	struct dbox_attr moved, attr;
	struct dbox_ns_gone gone;

	assert_int_equal(dbox_ns_rename(f->s.st, DBOX_ROOT_INO, ".A", c, "x", 0,
					NULL, &moved, &gone), -EINVAL);
	assert_int_equal(dbox_ns_rename(f->s.st, DBOX_ROOT_INO, ".A", d, "x", 0,
					NULL, &moved, &gone), -EINVAL);
	/* Nothing moved. */
	assert_int_equal(dbox_ns_lookup(f->s.st, DBOX_ROOT_INO, ".A", &attr), 0);
	assert_int_equal(attr.ino, d);
	assert_int_equal(attr.nlink, 3);
	assert_int_equal(dbox_ns_lookup(f->s.st, d, "child", &attr), 0);
	assert_int_equal(dbox_ns_lookup(f->s.st, c, "x", &attr), -ENOENT);
	/* The other way round is fine: the child moves up. */
	assert_int_equal(dbox_ns_rename(f->s.st, d, "child", DBOX_ROOT_INO, ".B",
					0, NULL, &moved, &gone), 0);
	assert_int_equal(moved.ino, c);
	assert_int_equal(dbox_ns_getattr(f->s.st, d, &attr), 0);
	assert_int_equal(attr.nlink, 2);
}

static void test_rename_noreplace_and_dirs(void **state)
{
	struct fix *f = *state;
	uint64_t d1 = add_dir(f, DBOX_ROOT_INO, "d1");
	uint64_t d2 = add_dir(f, DBOX_ROOT_INO, "d2");
	uint64_t m = add_msg(f, d2, "m", "M\n", NULL);
	struct dbox_attr moved, attr;
	struct dbox_ns_gone gone;

	assert_int_equal(dbox_ns_rename(f->s.st, DBOX_ROOT_INO, "d1", DBOX_ROOT_INO,
					"d2", RENAME_NOREPLACE, NULL, &moved,
					&gone), -EEXIST);
	/* Over a non-empty directory: ENOTEMPTY; over a file: ENOTDIR. */
	assert_int_equal(dbox_ns_rename(f->s.st, DBOX_ROOT_INO, "d1", DBOX_ROOT_INO,
					"d2", 0, NULL, &moved, &gone), -ENOTEMPTY);
	assert_int_equal(dbox_ns_rename(f->s.st, DBOX_ROOT_INO, "d1", d2, "m",
					0, NULL, &moved, &gone), -ENOTDIR);
	assert_int_equal(dbox_ns_rename(f->s.st, d2, "m", DBOX_ROOT_INO, "d1",
					0, NULL, &moved, &gone), -EISDIR);
	/* Over an empty directory: it goes. */
	assert_int_equal(dbox_ns_remove(f->s.st, d2, "m", false, NULL, &gone), 0);
	assert_true(gone.deleted);
	assert_gone_ino(f, m);
	assert_int_equal(dbox_ns_rename(f->s.st, DBOX_ROOT_INO, "d1", DBOX_ROOT_INO,
					"d2", 0, NULL, &moved, &gone), 0);
	assert_int_equal(moved.ino, d1);
	assert_int_equal(gone.ino, 0); /* a directory is no name left over */
	assert_int_equal(dbox_ns_getattr(f->s.st, d2, &attr), -ENOENT);
	assert_int_equal(dbox_ns_lookup(f->s.st, DBOX_ROOT_INO, "d2", &attr), 0);
	assert_int_equal(attr.ino, d1);
}

static int moved_retry(void *ctx, const struct dbox_attr *moved,
		       uint64_t newparent, const char *newname)
{
	return *(int *)ctx;
}

static void test_rename_moved_callback(void **state)
{
	struct fix *f = *state;
	uint64_t a = add_msg(f, f->s.cur, "a", "A\n", NULL);
	int answer = 1;
	struct dbox_ns_hooks hooks = { .moved = moved_retry, .ctx = &answer };
	struct dbox_attr moved, attr;
	struct dbox_ns_gone gone;

	/* Retry asked: nothing changed. */
	assert_int_equal(dbox_ns_rename(f->s.st, f->s.cur, "a", f->s.cur, "b", 0,
					&hooks, &moved, &gone), 1);
	assert_int_equal(dbox_ns_lookup(f->s.st, f->s.cur, "a", &attr), 0);
	assert_int_equal(dbox_ns_lookup(f->s.st, f->s.cur, "b", &attr), -ENOENT);
	/* A failure of the callback rolls the rename back. */
	answer = -EIO;
	assert_int_equal(dbox_ns_rename(f->s.st, f->s.cur, "a", f->s.cur, "b", 0,
					&hooks, &moved, &gone), -EIO);
	assert_int_equal(dbox_ns_lookup(f->s.st, f->s.cur, "a", &attr), 0);
	answer = 0;
	assert_int_equal(dbox_ns_rename(f->s.st, f->s.cur, "a", f->s.cur, "b", 0,
					&hooks, &moved, &gone), 0);
	assert_int_equal(dbox_ns_lookup(f->s.st, f->s.cur, "b", &attr), 0);
	assert_int_equal(attr.ino, a);
}

/* --- link, unlink, rmdir ------------------------------------------------ */

static void test_link_count_and_last_unlink(void **state)
{
	struct fix *f = *state;
	struct dbox_ns_hooks hooks = hooks_of(f);
	uint32_t file_id;
	uint64_t m = add_msg(f, f->s.cur, "m", "text\n", &file_id);
	uint64_t d = add_dir(f, DBOX_ROOT_INO, ".Sent");
	struct dbox_attr attr;
	struct dbox_ns_gone gone;

	assert_int_equal(dbox_ns_link(f->s.st, m, d, "copy", &attr), 0);
	assert_int_equal(attr.ino, m);
	assert_int_equal(attr.nlink, 2);
	/* Failures leave the count alone. */
	assert_int_equal(dbox_ns_link(f->s.st, m, d, "copy", &attr), -EEXIST);
	assert_int_equal(dbox_ns_link(f->s.st, d, f->s.cur, "dirlink", &attr),
			 -EPERM);
	assert_int_equal(dbox_ns_getattr(f->s.st, m, &attr), 0);
	assert_int_equal(attr.nlink, 2);

	assert_int_equal(dbox_ns_remove(f->s.st, f->s.cur, "m", false, &hooks,
					&gone), 0);
	assert_int_equal(gone.ino, m);
	assert_int_equal(gone.nlink, 1);
	assert_false(gone.deleted);
	assert_int_equal(f->held_calls, 0); /* still named: not asked */
	assert_int_equal(dbox_ns_getattr(f->s.st, m, &attr), 0);
	assert_int_equal(attr.nlink, 1);

	/* The last name: the message is expunged, its record garbage. */
	assert_int_equal(dbox_ns_remove(f->s.st, d, "copy", false, &hooks,
					&gone), 0);
	assert_int_equal(gone.ino, m);
	assert_int_equal(gone.nlink, 0);
	assert_true(gone.deleted);
	assert_int_equal(gone.garbage_file_id, file_id);
	assert_gone_ino(f, m);
	/* A name without an inode cannot be linked to. */
	assert_int_equal(dbox_ns_link(f->s.st, m, d, "again", &attr), -ENOENT);
}

static void test_remove_errors(void **state)
{
	struct fix *f = *state;
	uint64_t d = add_dir(f, DBOX_ROOT_INO, "d");
	struct dbox_attr attr;
	struct dbox_ns_gone gone;

	add_msg(f, d, "m", "x\n", NULL);
	assert_int_equal(dbox_ns_remove(f->s.st, DBOX_ROOT_INO, "d", true, NULL,
					&gone), -ENOTEMPTY);
	assert_int_equal(dbox_ns_remove(f->s.st, DBOX_ROOT_INO, "d", false, NULL,
					&gone), -EISDIR);
	assert_int_equal(dbox_ns_remove(f->s.st, d, "m", true, NULL, &gone),
			 -ENOTDIR);
	assert_int_equal(dbox_ns_remove(f->s.st, d, "nope", false, NULL, &gone),
			 -ENOENT);
	assert_int_equal(dbox_ns_remove(f->s.st, d, "m", false, NULL, &gone), 0);
	assert_int_equal(dbox_ns_remove(f->s.st, DBOX_ROOT_INO, "d", true, NULL,
					&gone), 0);
	assert_int_equal(dbox_ns_getattr(f->s.st, d, &attr), -ENOENT);
	assert_int_equal(dbox_ns_getattr(f->s.st, DBOX_ROOT_INO, &attr), 0);
	assert_int_equal(attr.nlink, 2 + 3); /* cur new tmp */
}

static void test_plain_file_backing(void **state)
{
	struct fix *f = *state;
	struct dbox_ns_hooks hooks = hooks_of(f);
	uint64_t p = add_plain(f, DBOX_ROOT_INO, ".mbsyncstate");
	uint64_t q = add_plain(f, DBOX_ROOT_INO, ".held");
	struct dbox_ns_gone gone;

	assert_true(backing_exists(f, p));
	assert_int_equal(dbox_ns_remove(f->s.st, DBOX_ROOT_INO, ".mbsyncstate",
					false, &hooks, &gone), 0);
	assert_true(gone.deleted);
	assert_int_equal(gone.garbage_file_id, 0);
	assert_false(backing_exists(f, p));
	assert_gone_ino(f, p);

	/* A held one keeps its bytes until it is let go. */
	f->held = q;
	assert_int_equal(dbox_ns_remove(f->s.st, DBOX_ROOT_INO, ".held", false,
					&hooks, &gone), 0);
	assert_false(gone.deleted);
	assert_true(backing_exists(f, q));
	assert_int_equal(dbox_ns_delete_orphan(f->s.st, q, &gone), 0);
	assert_true(gone.deleted);
	assert_false(backing_exists(f, q));
}

/* --- create, setattr, xattr --------------------------------------------- */

static void test_create_kinds_and_setgid(void **state)
{
	struct fix *f = *state;
	uint64_t g = add_dir(f, DBOX_ROOT_INO, "shared");
	struct dbox_ns_set set = {
		.what = DBOX_NS_SET_MODE | DBOX_NS_SET_GID,
		.mode = 02775, .gid = 4242,
	};
	struct dbox_ns_new nw = {
		.kind = DBOX_KIND_DIR, .mode = S_IFDIR | 0700,
		.uid = 1000, .gid = 1000,
	};
	struct dbox_attr attr, dir;
	char *target = NULL;

	assert_int_equal(dbox_ns_setattr(f->s.st, g, &set, &dir), 0);
	assert_int_equal(dir.mode, S_IFDIR | 02775);
	assert_int_equal(dir.gid, 4242);
	/* In a setgid directory: the directory's group; a directory keeps
	   S_ISGID. */
	assert_int_equal(dbox_ns_create(f->s.st, g, "sub", &nw, &attr), 0);
	assert_int_equal(attr.gid, 4242);
	assert_int_equal(attr.uid, 1000);
	assert_int_equal(attr.mode, S_IFDIR | S_ISGID | 0700);
	/* Elsewhere: the caller's. */
	assert_int_equal(dbox_ns_create(f->s.st, DBOX_ROOT_INO, "own", &nw,
					&attr), 0);
	assert_int_equal(attr.gid, 1000);
	assert_int_equal(attr.mode, S_IFDIR | 0700);
	assert_int_equal(dbox_ns_create(f->s.st, DBOX_ROOT_INO, "own", &nw,
					&attr), -EEXIST);

	nw = (struct dbox_ns_new){ .kind = DBOX_KIND_SYMLINK,
				   .mode = S_IFLNK | 0777, .target = "../x y" };
	assert_int_equal(dbox_ns_create(f->s.st, g, "ln", &nw, &attr), 0);
	assert_int_equal(attr.size, 6);
	assert_int_equal(dbox_ns_readlink(f->s.st, attr.ino, &target), 0);
	assert_string_equal(target, "../x y");
	free(target);
	assert_int_equal(dbox_ns_getattr(f->s.st, attr.ino, &attr), 0);
	assert_int_equal(attr.size, 6);

	nw = (struct dbox_ns_new){ .kind = DBOX_KIND_SPECIAL,
				   .mode = S_IFCHR | 0600,
				   .rdev = makedev(1, 3) };
	assert_int_equal(dbox_ns_create(f->s.st, DBOX_ROOT_INO, "null", &nw,
					&attr), 0);
	assert_int_equal(dbox_ns_getattr(f->s.st, attr.ino, &attr), 0);
	assert_int_equal(attr.rdev, makedev(1, 3));
	assert_int_equal(attr.kind, DBOX_KIND_SPECIAL);

	/* In a non-directory: ENOTDIR; a message needs the mount. */
	nw = (struct dbox_ns_new){ .kind = DBOX_KIND_DIR, .mode = S_IFDIR | 0700 };
	assert_int_equal(dbox_ns_create(f->s.st, attr.ino, "x", &nw, &attr),
			 -ENOTDIR);
	nw.kind = DBOX_KIND_MESSAGE;
	assert_int_equal(dbox_ns_create(f->s.st, DBOX_ROOT_INO, "x", &nw, &attr),
			 -EINVAL);
}

static void test_setattr_and_xattr(void **state)
{
	struct fix *f = *state;
	uint64_t m = add_msg(f, f->s.cur, "m", "text\n", NULL);
	struct dbox_ns_set set = {
		.what = DBOX_NS_SET_MTIME | DBOX_NS_SET_ATIME | DBOX_NS_SET_UID,
		.mtime_ns = dbox_time_make(1234567890, 5),
		.atime_ns = dbox_time_make(1234567891, 6), .uid = 77,
	};
	struct dbox_attr attr, after;
	void *value = NULL;
	size_t len = 0;

	assert_int_equal(dbox_ns_setattr(f->s.st, m, &set, &attr), 0);
	assert_int_equal(attr.mtime_ns, set.mtime_ns);
	assert_int_equal(attr.atime_ns, set.atime_ns);
	assert_int_equal(attr.uid, 77);
	assert_int_equal(attr.size, 5); /* untouched */
	assert_int_equal(dbox_ns_getattr(f->s.st, m, &after), 0);
	assert_int_equal(after.mtime_ns, attr.mtime_ns);
	assert_int_equal(after.atime_ns, attr.atime_ns);
	assert_int_equal(after.ctime_ns, attr.ctime_ns);
	assert_int_equal(after.uid, 77);
	assert_int_equal(dbox_ns_setattr(f->s.st, 999999, &set, NULL), -ENOENT);

	/* An xattr change moves ctime (as ext4). */
	set = (struct dbox_ns_set){ .what = DBOX_NS_SET_CTIME,
				    .ctime_ns = dbox_time_make(1000000000, 0) };
	assert_int_equal(dbox_ns_setattr(f->s.st, m, &set, NULL), 0);
	assert_int_equal(dbox_ns_xattr_set(f->s.st, m, "user.k", "v", 1,
					   XATTR_CREATE), 0);
	assert_int_equal(dbox_ns_getattr(f->s.st, m, &attr), 0);
	assert_true(dbox_time_cmp(attr.ctime_ns, set.ctime_ns) > 0);
	assert_int_equal(dbox_ns_xattr_set(f->s.st, m, "user.k", "w", 1,
					   XATTR_CREATE), -EEXIST);
	assert_int_equal(dbox_ns_xattr_get(f->s.st, m, "user.k", &value, &len), 0);
	assert_int_equal(len, 1);
	assert_memory_equal(value, "v", 1);
	free(value);
	/* A failed change leaves ctime alone. */
	assert_int_equal(dbox_ns_setattr(f->s.st, m, &set, NULL), 0);
	assert_int_equal(dbox_ns_xattr_remove(f->s.st, m, "user.none"), -ENODATA);
	assert_int_equal(dbox_ns_getattr(f->s.st, m, &attr), 0);
	assert_int_equal(attr.ctime_ns, set.ctime_ns);
	assert_int_equal(dbox_ns_xattr_remove(f->s.st, m, "user.k"), 0);
	assert_int_equal(dbox_ns_xattr_get(f->s.st, m, "user.k", &value, &len),
			 -ENODATA);
}

static void test_message_name_and_dir_self(void **state)
{
	struct fix *f = *state;
	uint64_t d = add_dir(f, DBOX_ROOT_INO, ".Drafts");
	uint64_t c = add_dir(f, d, "cur");
	struct dbox_attr self, parent;

	assert_true(dbox_ns_is_message_name(f->s.st, f->s.cur, "1.M1.host:2,S"));
	assert_true(dbox_ns_is_message_name(f->s.st, c, "x"));
	assert_false(dbox_ns_is_message_name(f->s.st, c, ".x"));
	assert_false(dbox_ns_is_message_name(f->s.st, d, "x"));
	assert_false(dbox_ns_is_message_name(f->s.st, DBOX_ROOT_INO, "x"));
	assert_int_equal(dbox_ns_dir_self(f->s.st, c, &self, &parent), 0);
	assert_int_equal(self.ino, c);
	assert_int_equal(parent.ino, d);
	assert_int_equal(dbox_ns_dir_self(f->s.st, DBOX_ROOT_INO, &self, &parent), 0);
	assert_int_equal(parent.ino, DBOX_ROOT_INO);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_rename_over_message, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rename_over_held_message, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rename_dir_into_child, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rename_noreplace_and_dirs, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rename_moved_callback, setup, teardown),
		cmocka_unit_test_setup_teardown(test_link_count_and_last_unlink, setup, teardown),
		cmocka_unit_test_setup_teardown(test_remove_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_plain_file_backing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_create_kinds_and_setgid, setup, teardown),
		cmocka_unit_test_setup_teardown(test_setattr_and_xattr, setup, teardown),
		cmocka_unit_test_setup_teardown(test_message_name_and_dir_self, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
