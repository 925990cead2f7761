/*
 * import-tree.c: the walk of the source tree of a maildir import
 * (engine/import.h): directories made or merged into, each name sent to
 * the right kind of item (import-item.c), directory times restored at
 * the end.
 */
#include "engine/import-private.h"
#include "storage/grow.h"
#include "engine/maildir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int64_t ts_ns(const struct timespec *ts)
{
	return dbox_time_make(ts->tv_sec, ts->tv_nsec);
}

static void import_dir(struct dbox_import *imp, int fd, uint64_t dir,
		       const char *mailbox);

/* The source path one name deeper; returns the depth to go back to.  Out
   of memory, notes name the parent directory. */
static size_t path_push(struct dbox_import *imp, const char *name)
{
	size_t old = imp->depth;
	const char **names = dbox_grow(imp->names, imp->depth,
				       &imp->names_size, sizeof(*names));

	if (names != NULL) {
		imp->names = names;
		imp->names[imp->depth++] = name;
	}
	return old;
}

static bool is_maildir_sub(const char *name)
{
	return maildir_is_subdir(name, strlen(name));
}

/* A regular file: present, another name, a message or a plain file. */
static void import_reg(struct dbox_import *imp, int dirfd, const char *name,
		       uint64_t dir, const char *mailbox)
{
	struct inomap_entry *link;
	struct dbox_attr attr;
	struct stat sb;
	int fd, ret;

	fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
		    O_NOCTTY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &sb) < 0) {
		import_item_failed(imp, "", errno);
		if (fd >= 0)
			close(fd);
		return;
	}
	if (!S_ISREG(sb.st_mode)) {
		/* Replaced since the directory was read. */
		import_item_failed(imp, "", EAGAIN);
	} else if ((ret = dbox_index_lookup(imp->index, dir, name, strlen(name),
					    &attr)) == 0) {
		import_present(imp, fd, &sb, &attr);
	} else if (ret != -ENOENT) {
		import_index_failed(imp, "lookup", -ret);
	} else if (sb.st_nlink > 1 &&
		   (link = inomap_get(&imp->links, sb.st_dev, sb.st_ino)) != NULL) {
		import_link(imp, link->value, dir, name);
	} else if (mailbox != NULL && name[0] != '.') {
		if (!import_present_renamed(imp, fd, &sb, name))
			import_message(imp, fd, &sb, dir, name, mailbox);
	} else {
		import_file(imp, fd, &sb, dir, name);
	}
	close(fd);
}

static struct import_dir_time *add_dir_time(struct dbox_import *imp,
					    uint64_t ino, const struct stat *sb)
{
	struct import_dir_time *dirs = dbox_grow(imp->dirs, imp->ndirs,
						 &imp->dirs_size, sizeof(*dirs));

	if (dirs == NULL)
		return NULL;
	imp->dirs = dirs;
	memset(&dirs[imp->ndirs], 0, sizeof(dirs[0]));
	dirs[imp->ndirs].ino = ino;
	dirs[imp->ndirs].mtime_ns = ts_ns(&sb->st_mtim);
	dirs[imp->ndirs].atime_ns = ts_ns(&sb->st_atim);
	return &dirs[imp->ndirs++];
}

/* dir/name as a new directory of the source's mode (its times are set
   at the end).  Returns 0 or a negative errno (noted). */
static int make_dir(struct dbox_import *imp, uint64_t dir, const char *name,
		    const struct stat *sb, struct dbox_attr *attr_r)
{
	int ret = dbox_index_create(imp->index, dir, name, strlen(name),
				    DBOX_KIND_DIR,
				    S_IFDIR | (sb->st_mode & 07777),
				    import_uid(imp, sb), import_gid(imp, sb),
				    dbox_now_ns(), attr_r);

	if (ret < 0) {
		import_index_failed(imp, "mkdir", -ret);
		return ret;
	}
	if (add_dir_time(imp, attr_r->ino, sb) == NULL)
		import_note(imp, DBOX_IMPORT_TIME_LOST, "", ENOMEM);
	imp->counts->dirs_made++;
	import_batch_item(imp);
	return 0;
}

/* What renamed_dirs_enter replaced, to put back. */
struct renamed_saved {
	uint64_t dirs[2];
};

/* Before the messages of a cur/, new/ or tmp/ of folder are imported:
   when that directory was in the store already (merged), the folder's
   cur/ and new/ become imp->renamed_dirs, else none.  Returns what to
   put back after the directory. */
static struct renamed_saved renamed_dirs_enter(struct dbox_import *imp,
					       uint64_t folder, bool merged)
{
	static const char *const subs[2] = { "cur", "new" };
	struct renamed_saved saved;
	struct dbox_attr attr;

	memcpy(saved.dirs, imp->renamed_dirs, sizeof(saved.dirs));
	for (size_t i = 0; i < 2; i++) {
		imp->renamed_dirs[i] = 0;
		if (merged && dbox_index_lookup(imp->index, folder, subs[i],
						strlen(subs[i]), &attr) == 0 &&
		    attr.kind == DBOX_KIND_DIR)
			imp->renamed_dirs[i] = attr.ino;
	}
	return saved;
}

/* A directory: made, or merged into when the store has one of that name
   (which keeps its own times). */
static void import_subdir(struct dbox_import *imp, int dirfd, const char *name,
			  const struct stat *sb, uint64_t dir)
{
	struct renamed_saved saved;
	struct dbox_attr attr;
	char *mailbox = NULL;
	bool merged;
	int fd, ret;

	if (sb->st_dev == imp->store_dev && sb->st_ino == imp->store_ino) {
		import_note(imp, DBOX_IMPORT_IS_STORE, "", 0);
		imp->counts->skipped++;
		return;
	}
	/* Opened first: a directory that cannot be read is not made in the
	   store, empty. */
	fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		import_item_failed(imp, "", errno);
		return;
	}
	ret = import_check_free(imp, dir, name, &attr);
	merged = ret == -EEXIST;
	if (ret == -EEXIST && attr.kind != DBOX_KIND_DIR) {
		import_item_failed(imp, "", EEXIST);
		close(fd);
		return;
	}
	if ((ret == 0 && make_dir(imp, dir, name, sb, &attr) < 0) ||
	    (ret < 0 && ret != -EEXIST)) {
		close(fd);
		return; /* fatal, noted */
	}
	if (ret == 0)
		import_xattrs(imp, fd, attr.ino);
	if (is_maildir_sub(name) &&
	    (ret = maildir_mailbox_name(imp->index, attr.ino, &mailbox)) < 0) {
		import_index_failed(imp, "mailbox name", -ret);
		close(fd);
		return;
	}
	saved = renamed_dirs_enter(imp, dir, mailbox != NULL && merged);
	import_dir(imp, fd, attr.ino, mailbox);
	memcpy(imp->renamed_dirs, saved.dirs, sizeof(saved.dirs));
	free(mailbox);
	close(fd);
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_names(char **names, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

/* The names in directory fd, sorted (byte order), without "." and "..":
   a malloc()ed array of malloc()ed strings.  Returns the count or a
   negative errno. */
static ssize_t read_names(int fd, char ***names_r)
{
	DIR *d;
	struct dirent *de;
	char **names = NULL, **grown;
	size_t n = 0, size = 0;
	int dupfd = dup(fd), err = 0;

	if (dupfd < 0 || (d = fdopendir(dupfd)) == NULL) {
		err = errno;
		if (dupfd >= 0)
			close(dupfd);
		return -err;
	}
	errno = 0;
	while ((de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		grown = dbox_grow(names, n, &size, sizeof(*names));
		if (grown == NULL || (grown[n] = strdup(de->d_name)) == NULL) {
			names = grown != NULL ? grown : names;
			err = ENOMEM;
			break;
		}
		names = grown;
		n++;
		errno = 0;
	}
	if (err == 0 && errno != 0)
		err = errno;
	closedir(d);
	if (err != 0) {
		free_names(names, n);
		return -err;
	}
	if (n > 1)
		qsort(names, n, sizeof(*names), name_cmp);
	*names_r = names;
	return (ssize_t)n;
}

/* Is the special file sb (target: a symlink's) the same as the store's
   attr? */
static bool same_special(struct dbox_import *imp, const struct stat *sb,
			 const char *target, const struct dbox_attr *attr)
{
	enum dbox_kind kind = S_ISLNK(sb->st_mode) ? DBOX_KIND_SYMLINK :
		DBOX_KIND_SPECIAL;
	char *stored = NULL;
	bool same;

	if (attr->kind != kind ||
	    (attr->mode & S_IFMT) != (sb->st_mode & S_IFMT))
		return false;
	if (kind != DBOX_KIND_SYMLINK)
		return !(S_ISCHR(sb->st_mode) || S_ISBLK(sb->st_mode)) ||
			attr->rdev == sb->st_rdev;
	same = dbox_index_readlink(imp->index, attr->ino, &stored) == 0 &&
		strcmp(stored, target) == 0;
	free(stored);
	return same;
}

/* A new symlink or special inode dir/name for sb.  Returns 0 or a
   negative errno (noted). */
static int make_special(struct dbox_import *imp, uint64_t dir,
			const char *name, const struct stat *sb,
			const char *target, size_t target_len)
{
	bool symlink = S_ISLNK(sb->st_mode);
	struct dbox_attr attr;
	int ret;

	ret = dbox_index_create(imp->index, dir, name, strlen(name),
				symlink ? DBOX_KIND_SYMLINK : DBOX_KIND_SPECIAL,
				symlink ? S_IFLNK | 0777 :
				sb->st_mode & (S_IFMT | 07777),
				import_uid(imp, sb), import_gid(imp, sb),
				dbox_now_ns(), &attr);
	if (ret == 0 && symlink)
		ret = dbox_index_symlink_set(imp->index, attr.ino, target,
					     target_len);
	if (ret == 0)
		ret = dbox_index_getattr(imp->index, attr.ino, &attr);
	if (ret == 0) {
		attr.mtime_ns = ts_ns(&sb->st_mtim);
		if (S_ISCHR(sb->st_mode) || S_ISBLK(sb->st_mode))
			attr.rdev = sb->st_rdev;
		ret = dbox_index_setattr(imp->index, &attr);
	}
	if (ret < 0) {
		import_index_failed(imp, "create", -ret);
		return ret;
	}
	import_remember_link(imp, sb, attr.ino);
	imp->counts->others++;
	import_batch_item(imp);
	return 0;
}

/* A symbolic link, fifo, socket or device: an inode with mode (rdev,
   target), owner and mtime, anywhere (in cur/new/tmp too: not a message).
   Present with the same kind and target/rdev counts as present. */
static void import_other(struct dbox_import *imp, int dirfd, const char *name,
			 const struct stat *sb, uint64_t dir)
{
	struct inomap_entry *link;
	struct dbox_attr attr;
	char *target = NULL;
	ssize_t n = 0;
	int ret;

	if (S_ISLNK(sb->st_mode)) {
		if ((target = malloc((size_t)sb->st_size + 2)) == NULL ||
		    (n = readlinkat(dirfd, name, target,
				    (size_t)sb->st_size + 1)) < 0 ||
		    n > sb->st_size) {
			import_item_failed(imp, "readlink", target == NULL ?
					   ENOMEM : n < 0 ? errno : EAGAIN);
			free(target);
			return;
		}
		target[n] = '\0';
	}
	ret = dbox_index_lookup(imp->index, dir, name, strlen(name), &attr);
	if (ret == 0 && same_special(imp, sb, target, &attr)) {
		imp->counts->present++;
	} else if (ret == 0) {
		import_note(imp, DBOX_IMPORT_OTHER_KIND, "", 0);
		imp->counts->failed++;
	} else if (ret != -ENOENT) {
		import_index_failed(imp, "lookup", -ret);
	} else if (sb->st_nlink > 1 &&
		   (link = inomap_get(&imp->links, sb->st_dev, sb->st_ino)) != NULL) {
		import_link(imp, link->value, dir, name);
	} else {
		make_special(imp, dir, name, sb, target, (size_t)n);
	}
	free(target);
}

/* A directory deeper than any walk of the index goes fails as one item.
   Not inlined: its buffer stays off the frames of the recursive walk. */
static __attribute__((noinline)) void too_deep(struct dbox_import *imp)
{
	char what[80];

	snprintf(what, sizeof(what), "more directories above it than a store "
		 "holds (%d)", DBOX_TREE_MAX_DEPTH);
	import_item_failed(imp, what, ENAMETOOLONG);
}

/* One name of source directory fd, by its type. */
static void import_name(struct dbox_import *imp, int fd, const char *name,
			uint64_t dir, const char *mailbox)
{
	struct stat sb;

	if (fstatat(fd, name, &sb, AT_SYMLINK_NOFOLLOW) < 0) {
		import_item_failed(imp, "", errno);
	} else if (S_ISDIR(sb.st_mode) && imp->depth >= DBOX_TREE_MAX_DEPTH) {
		/* Deeper than any walk of the index goes (and than a path of
		   PATH_MAX bytes reaches): that directory fails, not the
		   import. */
		too_deep(imp);
	} else if (S_ISDIR(sb.st_mode)) {
		import_subdir(imp, fd, name, &sb, dir);
	} else if (S_ISREG(sb.st_mode)) {
		import_reg(imp, fd, name, dir, mailbox);
	} else if (S_ISLNK(sb.st_mode) || S_ISFIFO(sb.st_mode) ||
		   S_ISSOCK(sb.st_mode) ||
		   ((S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode)) &&
		    imp->keep_owner)) {
		import_other(imp, fd, name, &sb, dir);
	} else {
		struct dbox_import_note note = {
			.kind = DBOX_IMPORT_SKIPPED, .path = import_path(imp),
			.what = "", .mode = sb.st_mode,
		};

		if (imp->ops->note != NULL)
			imp->ops->note(imp->ops->ctx, &note);
		imp->counts->skipped++;
	}
}

static bool stopped(struct dbox_import *imp)
{
	return imp->fatal ||
		(imp->ops->stop != NULL && imp->ops->stop(imp->ops->ctx));
}

/* Import the contents of source directory fd into index directory dir;
   mailbox is the folder's mailbox name when dir is a cur/new/tmp. */
static void import_dir(struct dbox_import *imp, int fd, uint64_t dir,
		       const char *mailbox)
{
	char **names = NULL;
	ssize_t n = read_names(fd, &names);
	size_t old;

	if (n < 0) {
		import_item_failed(imp, "reading the directory", (int)-n);
		return;
	}
	for (ssize_t i = 0; i < n && !stopped(imp); i++) {
		old = path_push(imp, names[i]);
		import_name(imp, fd, names[i], dir, mailbox);
		imp->depth = old;
	}
	free_names(names, (size_t)n);
}

/* Is index directory dir empty? */
static int dir_empty_cb(void *ctx, const struct dbox_dirent *ent)
{
	*(bool *)ctx = false;
	return 1;
}

/* Give every directory created the mtime and ctime of its source
   directory, and a root that was empty its mode and owner too.  One
   durable transaction. */
static int restore_dir_times(struct dbox_import *imp)
{
	struct dbox_attr attr;
	int ret;

	if ((ret = dbox_index_begin(imp->index)) < 0)
		return ret;
	for (size_t i = 0; i < imp->ndirs && ret == 0; i++) {
		const struct import_dir_time *d = &imp->dirs[i];

		if ((ret = dbox_index_getattr(imp->index, d->ino, &attr)) < 0)
			break;
		attr.mtime_ns = attr.ctime_ns = d->mtime_ns;
		attr.atime_ns = d->atime_ns;
		if (d->set_owner_mode) {
			attr.mode = S_IFDIR | d->mode;
			attr.uid = d->uid;
			attr.gid = d->gid;
		}
		ret = dbox_index_setattr(imp->index, &attr);
	}
	if (ret < 0) {
		dbox_index_rollback(imp->index);
		return ret;
	}
	return dbox_index_commit(imp->index, true);
}

/* A store root that holds nothing yet becomes the source's root: its
   mode, owner and times at the end.  Returns 0 or a negative errno. */
static int adopt_root(struct dbox_import *imp, int srcfd)
{
	struct import_dir_time *d;
	bool root_empty = true;
	struct stat sb;
	int ret;

	if ((ret = dbox_index_readdir(imp->index, DBOX_ROOT_INO, 0,
				      dir_empty_cb, &root_empty)) < 0)
		return ret;
	if (!root_empty || fstat(srcfd, &sb) < 0)
		return 0;
	if ((d = add_dir_time(imp, DBOX_ROOT_INO, &sb)) == NULL)
		return -ENOMEM;
	d->set_owner_mode = true;
	d->mode = sb.st_mode & 07777;
	d->uid = import_uid(imp, &sb);
	d->gid = import_gid(imp, &sb);
	return 0;
}

static int run_import(struct dbox_import *imp, int srcfd)
{
	struct stat sb;
	int ret;

	if (fstat(imp->st->dir_fd, &sb) == 0) {
		imp->store_dev = sb.st_dev;
		imp->store_ino = sb.st_ino;
	}
	/* Before the first byte: should the import be killed, recovery
	   knows what the index does not know is its uncommitted work. */
	if ((ret = adopt_root(imp, srcfd)) < 0 ||
	    (ret = dbox_store_import_mark_commit(imp->st, true)) < 0 ||
	    (ret = dbox_index_begin(imp->index)) < 0)
		return ret;
	import_dir(imp, srcfd, DBOX_ROOT_INO, NULL);
	if (imp->fatal) {
		import_batch_rollback(imp);
		(void)dbox_store_import_mark_commit(imp->st, false); /* the rollback cut it all */
		return -EIO;
	}
	/* Cleared with the last batch, in its transaction. */
	if ((ret = dbox_store_import_mark(imp->st, false)) < 0 ||
	    (ret = import_batch_commit(imp, true)) < 0) {
		import_batch_rollback(imp);
		(void)dbox_store_import_mark_commit(imp->st, false);
		return ret;
	}
	imp->depth = 0;
	if ((ret = restore_dir_times(imp)) < 0)
		import_note(imp, DBOX_IMPORT_DIR_TIMES, "", -ret);
	return ret;
}

int dbox_import_maildir(struct dbox_store *st, int srcfd, const char *src,
			bool keep_owner, const struct dbox_import_ops *ops,
			struct dbox_import_counts *counts_r)
{
	static const struct dbox_import_ops no_ops = { 0 };
	struct dbox_import imp = {
		.st = st, .index = st->index, .keep_owner = keep_owner,
		.ops = ops != NULL ? ops : &no_ops, .counts = counts_r,
		.root = src,
	};
	int ret;

	/* A long copy stops when the import is asked to. */
	imp.copy_stop = (struct dbox_copy_stop){ imp.ops->stop, imp.ops->ctx };

	memset(counts_r, 0, sizeof(*counts_r));
	imp.buf = malloc(IMPORT_CMP_SIZE);
	dbox_store_mutex_lock(st);
	ret = imp.buf == NULL ? -ENOMEM : run_import(&imp, srcfd);
	dbox_store_mutex_unlock(st);
	inomap_free(&imp.links);
	free(imp.touched);
	free(imp.new_files);
	free(imp.dirs);
	free(imp.names);
	free(imp.path);
	free(imp.buf);
	return ret;
}

/* Does source directory fd hold a cur/, new/ or tmp/ directory, at any
   depth (symbolic links not followed)?  Unreadable directories count as
   not holding one. */
static bool has_maildir_sub(int fd, unsigned int depth)
{
	struct dirent *de;
	struct stat sb;
	bool found = false;
	/* Its own open file: a dup() would share (and leave at the end)
	   the directory offset that the import then reads from. */
	int own = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC), sub;
	DIR *d;

	if (own < 0 || (d = fdopendir(own)) == NULL) {
		if (own >= 0)
			close(own);
		return false;
	}
	while (!found && (de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 ||
		    (de->d_type != DT_DIR && de->d_type != DT_UNKNOWN) ||
		    fstatat(fd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISDIR(sb.st_mode))
			continue;
		if (is_maildir_sub(de->d_name)) {
			found = true;
		} else if (depth < 64 &&
			   (sub = openat(fd, de->d_name, O_RDONLY | O_DIRECTORY |
					 O_NOFOLLOW | O_CLOEXEC)) >= 0) {
			found = has_maildir_sub(sub, depth + 1);
			close(sub);
		}
	}
	closedir(d);
	return found;
}

bool dbox_import_is_maildir(int fd)
{
	return has_maildir_sub(fd, 0);
}
