/*
 * import.c: dboxadm import STORE MAILDIR - copy a Maildir++ tree into a
 * store directly (no FUSE), as dboxfs itself would have stored it:
 *
 *   regular file in a cur/ new/ tmp/, name not starting with '.'
 *       -> a message: bytes appended to an m.N (dbox_save_*), inode of kind
 *          MESSAGE, size = bytes, mtime = the file's mtime (ns), received
 *          R = mtime seconds, B = the folder's Dovecot mailbox name
 *   any other regular file (dovecot-uidlist, .mbsyncstate, maildirfolder)
 *       -> a plain file: bytes in STORE/files/<ino>, mtime kept
 *   directory -> directory; afterwards its mtime/ctime = the source's
 *   second name of one source inode (hard link) -> dbox_index_link
 *   symlink -> a symlink inode, target kept byte for byte (never followed)
 *   fifo, socket, device -> a special inode with its mode and rdev
 *       (devices need root, as mknod(2) does on the mount)
 *
 * Names are kept byte for byte, permission bits in the index mode; as root
 * the owner too (as cp -a does); user.* extended attributes of files and
 * directories.  Work is committed in batches of
 * BATCH_ITEMS; before each commit the m.N files written in the batch are
 * fdatasync()ed, so the index never points at bytes not on disk.
 *
 * A name already in the store with the same bytes is counted as present
 * and skipped (a resumed import); with other bytes it fails.  Failure of
 * one file (unreadable, different file of that name, disk full) undoes
 * that file alone and the import goes on (exit 1).  An index failure (SQLite) stops
 * the import: the current batch is rolled back.  SIGINT/SIGTERM stop it
 * cleanly: what was imported so far is committed.
 */
#include "engine/maildir.h"
#include "dboxadm.h"
#include "inomap.h"
#include "progress.h"

#include "engine/store.h"
#include "storage/dbox-read.h"
#include "storage/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

/* Items (messages, files, links, directories) per transaction. */
#define BATCH_ITEMS 1000
/* Copy buffer. */
#define COPY_SIZE (1024 * 1024)

struct dir_time {
	uint64_t ino;
	int64_t mtime_ns, atime_ns;
	bool set_owner_mode;  /* also mode, uid, gid (the root) */
	uint32_t mode, uid, gid;
};

struct import {
	struct dbox_store *st;
	struct dbox_index *index;   /* st->index */
	struct progress progress;
	struct inomap links;        /* source (st_dev, st_ino) -> index ino */
	bool keep_owner;            /* root: keep source uid/gid */
	dev_t store_dev;            /* the store directory, never imported */
	ino_t store_ino;

	/* The current transaction. */
	unsigned int batch;         /* items in it */
	uint32_t *touched;          /* m.N ids written in it */
	size_t ntouched, touched_size;
	uint64_t *new_files;        /* plain-file inodes created in it */
	size_t nnew_files, new_files_size;

	struct dir_time *dirs;      /* directories whose times to restore */
	size_t ndirs, dirs_size;

	struct adm_path path;       /* source path of the current item */
	char *buf;                  /* COPY_SIZE bytes */

	unsigned long messages, files, dirs_made, linked, failed, skipped;
	unsigned long present;      /* same name, same bytes: resumed */
	bool fatal;                 /* index failure: stop, roll back */
};

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
	interrupted = sig;
}

/* A struct timespec as a dbox time (index.h), clamped as ext4 does. */
static int64_t ts_ns(const struct timespec *ts)
{
	return dbox_time_make(ts->tv_sec, ts->tv_nsec);
}

/* One item failed: report, count, go on. */
static void item_failed(struct import *imp, const char *what, int err)
{
	char why[80];

	adm_error("%s: %s%s%s%s", imp->path.buf, what, *what != '\0' ? ": " : "",
		  strerror(err), adm_denied_why(err, why, sizeof(why)));
	imp->failed++;
}

/* The index failed: nothing more can be trusted in this transaction. */
static void index_failed(struct import *imp, const char *what, int err)
{
	if (!imp->fatal)
		adm_error("%s: %s: index error (%s); stopping the import, the "
			  "last batch is rolled back", imp->path.buf, what,
			  strerror(err));
	imp->fatal = true;
}

static int touch_file(struct import *imp, uint32_t file_id)
{
	uint32_t *touched;

	for (size_t i = 0; i < imp->ntouched; i++)
		if (imp->touched[i] == file_id)
			return 0;
	touched = adm_grow(imp->touched, imp->ntouched, &imp->touched_size,
			   sizeof(*touched));
	if (touched == NULL)
		return -ENOMEM;
	imp->touched = touched;
	imp->touched[imp->ntouched++] = file_id;
	return 0;
}

/* Commit the transaction: the bytes it refers to first reach the disk.
   final: durable commit, no new transaction. */
static int batch_commit(struct import *imp, bool final)
{
	struct dbox_store *st = imp->st;
	int fd, ret = 0;

	for (size_t i = 0; i < imp->ntouched && ret == 0; i++) {
		fd = dbox_store_read_fd(st, imp->touched[i]);
		if (fd < 0)
			ret = fd;
		else if (fdatasync(fd) < 0)
			ret = -errno;
	}
	if (ret == 0 && imp->nnew_files > 0 && syncfs(st->files_fd) < 0)
		ret = -errno;
	if (ret < 0) {
		adm_error("%s/storage: sync before commit: %s", st->path,
			  strerror(-ret));
		imp->fatal = true;
		return ret;
	}
	if ((ret = dbox_index_commit(imp->index, final)) < 0) {
		index_failed(imp, "commit", -ret);
		return ret;
	}
	imp->batch = 0;
	imp->ntouched = 0;
	imp->nnew_files = 0;
	if (!final && (ret = dbox_index_begin(imp->index)) < 0) {
		index_failed(imp, "begin", -ret);
		return ret;
	}
	return 0;
}

/* Drop the transaction after a fatal error, with the plain files created
   in it (their inode numbers will be handed out again). */
static void batch_rollback(struct import *imp)
{
	char name[24];

	dbox_index_rollback(imp->index);
	for (size_t i = 0; i < imp->nnew_files; i++) {
		snprintf(name, sizeof(name), "%llu",
			 (unsigned long long)imp->new_files[i]);
		unlinkat(imp->st->files_fd, name, 0);
	}
	imp->nnew_files = 0;
}

static void batch_item(struct import *imp)
{
	if (++imp->batch >= BATCH_ITEMS)
		batch_commit(imp, false);
}

/* Source name already in the store?  0 when free; -EEXIST reported as an
   item failure; other errors are fatal. */
static int check_free(struct import *imp, uint64_t dir, const char *name,
		      struct dbox_attr *attr_r)
{
	int ret = dbox_index_lookup(imp->index, dir, name, strlen(name),
				    attr_r);

	if (ret == -ENOENT)
		return 0;
	if (ret == 0)
		return -EEXIST;
	index_failed(imp, "lookup", -ret);
	return ret;
}

/* Take back the name dir/name and its inode, created by this import
   for an item that failed. */
static void undo_create(struct import *imp, uint64_t dir, const char *name)
{
	uint64_t ino;
	uint32_t nlink;
	int ret;

	ret = dbox_index_remove(imp->index, dir, name, strlen(name), false,
				dbox_now_ns(), &ino, &nlink);
	if (ret == 0 && nlink == 0)
		ret = dbox_index_delete_inode(imp->index, ino);
	if (ret < 0)
		index_failed(imp, "undo", -ret);
}

static uint32_t owner_uid(const struct import *imp, const struct stat *sb)
{
	return imp->keep_owner ? sb->st_uid : getuid();
}

static uint32_t owner_gid(const struct import *imp, const struct stat *sb)
{
	return imp->keep_owner ? sb->st_gid : getgid();
}

/* Create the inode for a regular file.  Returns 0, or < 0 with the error
   already reported (item or fatal). */
static int create_reg(struct import *imp, uint64_t dir, const char *name,
		      const struct stat *sb, enum dbox_kind kind,
		      struct dbox_attr *attr_r)
{
	int ret = check_free(imp, dir, name, attr_r);

	if (ret == -EEXIST)
		item_failed(imp, "", EEXIST);
	if (ret < 0)
		return ret;
	ret = dbox_index_create(imp->index, dir, name, strlen(name), kind,
				S_IFREG | (sb->st_mode & 07777),
				owner_uid(imp, sb), owner_gid(imp, sb),
				dbox_now_ns(), attr_r);
	if (ret < 0)
		index_failed(imp, "create", -ret);
	return ret;
}

/* Read all of fd into the message being saved.  Returns the byte count
   or a negative errno. */
static int64_t copy_to_save(struct import *imp, int fd, struct dbox_save *save)
{
	uint64_t off = 0;
	ssize_t n;
	int ret;

	while ((n = read(fd, imp->buf, COPY_SIZE)) != 0) {
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if ((ret = dbox_save_write(save, imp->buf, n, off)) < 0)
			return ret;
		off += n;
	}
	return (int64_t)off;
}

/* The user.* extended attributes of source fd into index inode ino (as
   cp -a and rsync -X copy them; other namespaces are not stored).  A
   source that has none, or cannot list them, imports without. */
static void import_xattrs(struct import *imp, int fd, uint64_t ino)
{
	char *names = NULL, *value = NULL;
	ssize_t len = flistxattr(fd, NULL, 0), vlen;
	int ret;

	if (len <= 0)
		return;
	if ((names = malloc((size_t)len)) == NULL ||
	    (len = flistxattr(fd, names, (size_t)len)) < 0 ||
	    (value = malloc(DBOX_XATTR_SIZE_MAX)) == NULL) {
		item_failed(imp, "extended attributes", names == NULL ||
			    value == NULL ? ENOMEM : errno);
		goto out;
	}
	for (char *n = names; n < names + len; n += strlen(n) + 1) {
		if (strncmp(n, "user.", 5) != 0)
			continue;
		vlen = fgetxattr(fd, n, value, DBOX_XATTR_SIZE_MAX);
		if (vlen < 0) {
			item_failed(imp, n, errno);
			continue;
		}
		ret = dbox_index_xattr_set(imp->index, ino, n, value,
					   (size_t)vlen, 0);
		if (ret == -ERANGE || ret == -ENOSPC) {
			item_failed(imp, n, -ret);
		} else if (ret < 0) {
			index_failed(imp, "xattr", -ret);
			break;
		}
	}
out:
	free(names);
	free(value);
}

/* A message: fd is the open source file, sb its fstat. */
static void import_message(struct import *imp, int fd, const struct stat *sb,
			   uint64_t dir, const char *name, const char *mailbox)
{
	struct dbox_save *save = NULL;
	struct dbox_msgloc loc;
	struct dbox_attr attr;
	int64_t size;
	int ret;

	if (create_reg(imp, dir, name, sb, DBOX_KIND_MESSAGE, &attr) < 0)
		return;
	if ((ret = dbox_save_begin(imp->st, attr.ino, mailbox, &save)) < 0) {
		item_failed(imp, "storing", -ret);
		undo_create(imp, dir, name);
		return;
	}
	size = copy_to_save(imp, fd, save);
	ret = size < 0 ? (int)size :
		dbox_save_finish(save, dbox_time_sec(ts_ns(&sb->st_mtim)),
				 false, &loc);
	if (ret < 0) {
		item_failed(imp, size < 0 ? "" : "storing", -ret);
		dbox_save_free(&save); /* unfinished: its bytes are cut off */
		undo_create(imp, dir, name);
		return;
	}
	dbox_save_free(&save);
	attr.size = (uint64_t)size;
	attr.mtime_ns = ts_ns(&sb->st_mtim);
	attr.atime_ns = ts_ns(&sb->st_atim); /* as cp -a keeps it */
	if ((ret = dbox_index_setattr(imp->index, &attr)) < 0) {
		index_failed(imp, "setattr", -ret);
		return;
	}
	import_xattrs(imp, fd, attr.ino);
	if (touch_file(imp, loc.file_id) < 0) {
		index_failed(imp, "bookkeeping", ENOMEM);
		return;
	}
	if (sb->st_nlink > 1 &&
	    inomap_put(&imp->links, sb->st_dev, sb->st_ino, attr.ino, NULL) < 0)
		adm_warning("%s: out of memory: its other hard links are "
			    "imported as copies", imp->path.buf);
	imp->messages++;
	progress_add(&imp->progress, 1, (uint64_t)size);
	batch_item(imp);
}

/* Copy all of in to out.  Returns the byte count or a negative errno. */
static int64_t copy_fd(struct import *imp, int in, int out)
{
	uint64_t total = 0;
	ssize_t n, w;

	while ((n = read(in, imp->buf, COPY_SIZE)) != 0) {
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		for (ssize_t done = 0; done < n; done += w) {
			w = write(out, imp->buf + done, n - done);
			if (w < 0) {
				if (errno == EINTR) {
					w = 0;
					continue;
				}
				return -errno;
			}
		}
		total += n;
	}
	return (int64_t)total;
}

/* A plain file: bytes into STORE/files/<ino>. */
static void import_file(struct import *imp, int fd, const struct stat *sb,
			uint64_t dir, const char *name)
{
	struct timespec times[2] = { sb->st_atim, sb->st_mtim };
	struct dbox_attr attr;
	uint64_t *new_files;
	char backing[24];
	int64_t size;
	int out, ret;

	if (create_reg(imp, dir, name, sb, DBOX_KIND_FILE, &attr) < 0)
		return;
	snprintf(backing, sizeof(backing), "%llu", (unsigned long long)attr.ino);
	/* O_TRUNC, not O_EXCL: an inode number rolled back by an earlier
	   failed run may have left its backing file behind. */
	out = openat(imp->st->files_fd, backing,
		     O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (out < 0) {
		item_failed(imp, "creating the backing file", errno);
		undo_create(imp, dir, name);
		return;
	}
	size = copy_fd(imp, fd, out);
	ret = size < 0 ? (int)size : 0;
	if (ret == 0 && (fchmod(out, 0600) < 0 || futimens(out, times) < 0))
		ret = -errno;
	close(out);
	if (ret < 0) {
		item_failed(imp, "", -ret);
		unlinkat(imp->st->files_fd, backing, 0);
		undo_create(imp, dir, name);
		return;
	}
	new_files = adm_grow(imp->new_files, imp->nnew_files,
			     &imp->new_files_size, sizeof(*new_files));
	if (new_files != NULL) {
		imp->new_files = new_files;
		imp->new_files[imp->nnew_files++] = attr.ino;
	}
	attr.size = (uint64_t)size;
	attr.mtime_ns = ts_ns(&sb->st_mtim);
	attr.atime_ns = ts_ns(&sb->st_atim); /* as cp -a keeps it */
	if ((ret = dbox_index_setattr(imp->index, &attr)) < 0) {
		index_failed(imp, "setattr", -ret);
		return;
	}
	import_xattrs(imp, fd, attr.ino);
	if (sb->st_nlink > 1 &&
	    inomap_put(&imp->links, sb->st_dev, sb->st_ino, attr.ino, NULL) < 0)
		adm_warning("%s: out of memory: its other hard links are "
			    "imported as copies", imp->path.buf);
	imp->files++;
	progress_add(&imp->progress, 0, (uint64_t)size);
	batch_item(imp);
}

/* Another name of a source inode already imported as index inode ino. */
static void import_link(struct import *imp, uint64_t ino, uint64_t dir,
			const char *name)
{
	struct dbox_attr attr;
	int ret = check_free(imp, dir, name, &attr);

	if (ret == -EEXIST)
		item_failed(imp, "", EEXIST);
	if (ret < 0)
		return;
	ret = dbox_index_link(imp->index, ino, dir, name, strlen(name),
			      dbox_now_ns(), &attr);
	if (ret < 0) {
		index_failed(imp, "link", -ret);
		return;
	}
	imp->linked++;
	batch_item(imp);
}

static bool is_maildir_sub(const char *name)
{
	return maildir_is_subdir(name, strlen(name));
}

/* Read the next len bytes (or up to the end) at off of the store's copy
   of attr: its message reader, or its backing file fd.  Returns the byte
   count or a negative errno. */
static ssize_t read_stored(struct dbox_reader *reader, int fd, void *buf,
			   size_t len, uint64_t off)
{
	ssize_t n;

	do
		n = reader != NULL ? dbox_reader_pread(reader, buf, len, off) :
			pread(fd, buf, len, (off_t)off);
	while (n < 0 && errno == EINTR);
	return n < 0 ? -errno : n;
}

/* Are the bytes of source fd (sb) those the store holds for attr (a
   message or plain file)?  Returns 1 same, 0 different, or a negative
   errno when either side cannot be read. */
static int same_content(struct import *imp, int fd, const struct stat *sb,
			const struct dbox_attr *attr)
{
	struct dbox_reader *reader = NULL;
	struct dbox_msgloc loc;
	char *a = imp->buf, *b = imp->buf + COPY_SIZE / 2, backing[24];
	uint64_t off = 0;
	int stored = -1, ret;

	if ((uint64_t)sb->st_size != attr->size)
		return 0;
	if (attr->kind == DBOX_KIND_MESSAGE) {
		if ((ret = dbox_index_msg_get(imp->index, attr->ino, &loc)) < 0 ||
		    (ret = dbox_store_open_reader(imp->st, &loc, attr->size,
						  &reader)) < 0)
			return ret;
	} else {
		snprintf(backing, sizeof(backing), "%llu",
			 (unsigned long long)attr->ino);
		stored = openat(imp->st->files_fd, backing,
				O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (stored < 0)
			return -errno;
	}
	for (ret = 2; ret == 2;) {  /* 2: equal so far */
		ssize_t n = pread(fd, a, COPY_SIZE / 2, (off_t)off), m;

		if (n < 0) {
			if (errno != EINTR)
				ret = -errno;
			continue;
		}
		/* At the source's end, the stored copy must end too. */
		m = read_stored(reader, stored, b, n > 0 ? (size_t)n : 1, off);
		if (m < 0)
			ret = (int)m;
		else if (m != n || memcmp(a, b, (size_t)n) != 0)
			ret = 0;
		else if (n == 0)
			ret = 1;
		off += (uint64_t)n;
	}
	dbox_reader_free(&reader);
	if (stored >= 0)
		close(stored);
	return ret;
}

/* The source name is already in the store: a resumed or repeated import.
   The same bytes count as present (and the source inode maps to the
   stored one, for its other hard links); other bytes, or a directory of
   that name, fail the item. */
static void import_present(struct import *imp, int fd, const struct stat *sb,
			   const struct dbox_attr *attr)
{
	int ret = attr->kind == DBOX_KIND_DIR ? 0 :
		same_content(imp, fd, sb, attr);

	if (ret < 0) {
		item_failed(imp, "exists in the store, and comparing it failed",
			    -ret);
		return;
	}
	if (ret == 0) {
		adm_error("%s: exists in the store with different content; "
			  "not imported", imp->path.buf);
		imp->failed++;
		return;
	}
	if (sb->st_nlink > 1 &&
	    inomap_get(&imp->links, sb->st_dev, sb->st_ino) == NULL &&
	    inomap_put(&imp->links, sb->st_dev, sb->st_ino, attr->ino, NULL) < 0)
		adm_warning("%s: out of memory: its other hard links are "
			    "imported as copies", imp->path.buf);
	imp->present++;
}

static void import_reg(struct import *imp, int dirfd, const char *name,
		       uint64_t dir, const char *mailbox)
{
	struct inomap_entry *link;
	struct dbox_attr attr;
	struct stat sb;
	int fd, ret;

	fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &sb) < 0) {
		item_failed(imp, "", errno);
		if (fd >= 0)
			close(fd);
		return;
	}
	if (!S_ISREG(sb.st_mode)) {
		/* Replaced since the directory was read. */
		item_failed(imp, "", EAGAIN);
	} else if ((ret = dbox_index_lookup(imp->index, dir, name, strlen(name),
					    &attr)) == 0) {
		import_present(imp, fd, &sb, &attr);
	} else if (ret != -ENOENT) {
		index_failed(imp, "lookup", -ret);
	} else if (sb.st_nlink > 1 &&
		   (link = inomap_get(&imp->links, sb.st_dev, sb.st_ino)) != NULL) {
		import_link(imp, link->value, dir, name);
	} else if (mailbox != NULL && name[0] != '.') {
		import_message(imp, fd, &sb, dir, name, mailbox);
	} else {
		import_file(imp, fd, &sb, dir, name);
	}
	close(fd);
}

static void import_dir(struct import *imp, int dirfd, uint64_t dir,
		       const char *mailbox);

static int add_dir_time(struct import *imp, uint64_t ino, int64_t mtime_ns,
			int64_t atime_ns)
{
	struct dir_time *dirs = adm_grow(imp->dirs, imp->ndirs,
					 &imp->dirs_size, sizeof(*dirs));

	if (dirs == NULL)
		return -ENOMEM;
	imp->dirs = dirs;
	memset(&imp->dirs[imp->ndirs], 0, sizeof(imp->dirs[0]));
	imp->dirs[imp->ndirs].ino = ino;
	imp->dirs[imp->ndirs].mtime_ns = mtime_ns;
	imp->dirs[imp->ndirs].atime_ns = atime_ns;
	imp->ndirs++;
	return 0;
}

static void import_subdir(struct import *imp, int dirfd, const char *name,
			  const struct stat *sb, uint64_t dir)
{
	struct dbox_attr attr;
	char *mailbox = NULL;
	bool made;
	int fd, ret;

	if (sb->st_dev == imp->store_dev && sb->st_ino == imp->store_ino) {
		adm_warning("%s: is the store itself; skipped", imp->path.buf);
		imp->skipped++;
		return;
	}
	ret = check_free(imp, dir, name, &attr);
	if (ret == -EEXIST && attr.kind != DBOX_KIND_DIR) {
		item_failed(imp, "", EEXIST);
		return;
	}
	if (ret == 0) {
		/* New: its time is restored at the end.  An existing
		   directory is merged into and keeps its own times. */
		ret = dbox_index_create(imp->index, dir, name, strlen(name),
					DBOX_KIND_DIR,
					S_IFDIR | (sb->st_mode & 07777),
					owner_uid(imp, sb), owner_gid(imp, sb),
					dbox_now_ns(), &attr);
		if (ret < 0) {
			index_failed(imp, "mkdir", -ret);
			return;
		}
		if (add_dir_time(imp, attr.ino, ts_ns(&sb->st_mtim),
				 ts_ns(&sb->st_atim)) < 0)
			adm_warning("%s: out of memory: its mtime is not "
				    "restored", imp->path.buf);
		imp->dirs_made++;
		batch_item(imp);
	} else if (ret != -EEXIST) {
		return; /* fatal, reported */
	}
	made = ret == 0;
	fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		item_failed(imp, "", errno);
		return;
	}
	if (made)
		import_xattrs(imp, fd, attr.ino);
	if (is_maildir_sub(name) &&
	    (ret = maildir_mailbox_name(imp->index, attr.ino, &mailbox)) < 0) {
		index_failed(imp, "mailbox name", -ret);
		close(fd);
		return;
	}
	import_dir(imp, fd, attr.ino, mailbox);
	free(mailbox);
	close(fd);
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
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
		grown = adm_grow(names, n, &size, sizeof(*names));
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
		for (size_t i = 0; i < n; i++)
			free(names[i]);
		free(names);
		return -err;
	}
	if (n > 1)
		qsort(names, n, sizeof(*names), name_cmp);
	*names_r = names;
	return (ssize_t)n;
}

/* A symbolic link, fifo, socket or device: an inode with mode (rdev,
   target), owner and mtime, anywhere (in cur/new/tmp too: not a message).
   Present with the same kind and target/rdev counts as present. */
static void import_other(struct import *imp, int dirfd, const char *name,
			 const struct stat *sb, uint64_t dir)
{
	enum dbox_kind kind = S_ISLNK(sb->st_mode) ? DBOX_KIND_SYMLINK :
		DBOX_KIND_SPECIAL;
	struct inomap_entry *link;
	struct dbox_attr attr;
	char *target = NULL, *stored = NULL;
	ssize_t n = 0;
	int ret;

	if (kind == DBOX_KIND_SYMLINK) {
		if ((target = malloc((size_t)sb->st_size + 2)) == NULL ||
		    (n = readlinkat(dirfd, name, target,
				    (size_t)sb->st_size + 1)) < 0 ||
		    n > sb->st_size) {
			item_failed(imp, "readlink", target == NULL ? ENOMEM :
				    n < 0 ? errno : EAGAIN);
			free(target);
			return;
		}
		target[n] = '\0';
	}
	ret = dbox_index_lookup(imp->index, dir, name, strlen(name), &attr);
	if (ret == 0) {
		bool same = attr.kind == kind &&
			(attr.mode & S_IFMT) == (sb->st_mode & S_IFMT) &&
			(kind == DBOX_KIND_SYMLINK ?
			 dbox_index_readlink(imp->index, attr.ino, &stored) == 0 &&
			 strcmp(stored, target) == 0 :
			 !(S_ISCHR(sb->st_mode) || S_ISBLK(sb->st_mode)) ||
			 attr.rdev == sb->st_rdev);

		if (same) {
			imp->present++;
		} else {
			adm_error("%s: exists in the store as something else; "
				  "not imported", imp->path.buf);
			imp->failed++;
		}
	} else if (ret != -ENOENT) {
		index_failed(imp, "lookup", -ret);
	} else if (sb->st_nlink > 1 &&
		   (link = inomap_get(&imp->links, sb->st_dev, sb->st_ino)) != NULL) {
		import_link(imp, link->value, dir, name);
	} else if ((ret = dbox_index_create(imp->index, dir, name, strlen(name),
					    kind, kind == DBOX_KIND_SYMLINK ?
					    S_IFLNK | 0777 :
					    sb->st_mode & (S_IFMT | 07777),
					    owner_uid(imp, sb), owner_gid(imp, sb),
					    dbox_now_ns(), &attr)) < 0) {
		index_failed(imp, "create", -ret);
	} else {
		if (kind == DBOX_KIND_SYMLINK)
			ret = dbox_index_symlink_set(imp->index, attr.ino,
						     target, (size_t)n);
		if (ret == 0)
			ret = dbox_index_getattr(imp->index, attr.ino, &attr);
		if (ret == 0) {
			attr.mtime_ns = ts_ns(&sb->st_mtim);
			if (S_ISCHR(sb->st_mode) || S_ISBLK(sb->st_mode))
				attr.rdev = sb->st_rdev;
			ret = dbox_index_setattr(imp->index, &attr);
		}
		if (ret < 0) {
			index_failed(imp, "setattr", -ret);
		} else {
			if (sb->st_nlink > 1 &&
			    inomap_put(&imp->links, sb->st_dev, sb->st_ino,
				       attr.ino, NULL) < 0)
				adm_warning("%s: out of memory: its other hard "
					    "links are imported as copies",
					    imp->path.buf);
			imp->files++;
			batch_item(imp);
		}
	}
	free(target);
	free(stored);
}

static const char *type_name(mode_t mode)
{
	return S_ISLNK(mode) ? "symbolic link" : S_ISFIFO(mode) ? "fifo" :
		S_ISSOCK(mode) ? "socket" : S_ISCHR(mode) ? "character device" :
		S_ISBLK(mode) ? "block device" : "special file";
}

/* Import the contents of source directory fd into index directory dir;
   mailbox is the folder's mailbox name when dir is a cur/new/tmp. */
static void import_dir(struct import *imp, int fd, uint64_t dir,
		       const char *mailbox)
{
	char **names = NULL;
	ssize_t n = read_names(fd, &names);
	struct stat sb;
	size_t old;

	if (n < 0) {
		item_failed(imp, "reading the directory", (int)-n);
		return;
	}
	for (ssize_t i = 0; i < n; i++) {
		if (!imp->fatal && !interrupted) {
			old = adm_path_push(&imp->path, names[i]);
			if (fstatat(fd, names[i], &sb, AT_SYMLINK_NOFOLLOW) < 0) {
				item_failed(imp, "", errno);
			} else if (S_ISDIR(sb.st_mode)) {
				import_subdir(imp, fd, names[i], &sb, dir);
			} else if (S_ISREG(sb.st_mode)) {
				import_reg(imp, fd, names[i], dir, mailbox);
			} else if (S_ISLNK(sb.st_mode) || S_ISFIFO(sb.st_mode) ||
				   S_ISSOCK(sb.st_mode) ||
				   ((S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode)) &&
				    imp->keep_owner)) {
				import_other(imp, fd, names[i], &sb, dir);
			} else {
				adm_warning("%s: %s skipped", imp->path.buf,
					    type_name(sb.st_mode));
				imp->skipped++;
			}
			adm_path_pop(&imp->path, old);
		}
		free(names[i]);
	}
	free(names);
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
static int restore_dir_times(struct import *imp)
{
	struct dbox_attr attr;
	int ret;

	if ((ret = dbox_index_begin(imp->index)) < 0)
		return ret;
	for (size_t i = 0; i < imp->ndirs && ret == 0; i++) {
		ret = dbox_index_getattr(imp->index, imp->dirs[i].ino, &attr);
		if (ret == 0) {
			attr.mtime_ns = attr.ctime_ns = imp->dirs[i].mtime_ns;
			attr.atime_ns = imp->dirs[i].atime_ns;
			if (imp->dirs[i].set_owner_mode) {
				attr.mode = S_IFDIR | imp->dirs[i].mode;
				attr.uid = imp->dirs[i].uid;
				attr.gid = imp->dirs[i].gid;
			}
			ret = dbox_index_setattr(imp->index, &attr);
		}
	}
	if (ret < 0) {
		dbox_index_rollback(imp->index);
		return ret;
	}
	return dbox_index_commit(imp->index, true);
}

static void import_free(struct import *imp)
{
	inomap_free(&imp->links);
	free(imp->touched);
	free(imp->new_files);
	free(imp->dirs);
	adm_path_free(&imp->path);
	free(imp->buf);
}

static int run_import(struct import *imp, int srcfd, const char *src)
{
	struct stat sb;
	bool root_empty = true;
	int ret;

	if (fstat(imp->st->dir_fd, &sb) == 0) {
		imp->store_dev = sb.st_dev;
		imp->store_ino = sb.st_ino;
	}
	if ((ret = dbox_index_readdir(imp->index, DBOX_ROOT_INO, 0,
				      dir_empty_cb, &root_empty)) < 0)
		return ret;
	/* A root that holds nothing yet becomes the source's root. */
	if (root_empty && fstat(srcfd, &sb) == 0) {
		if (add_dir_time(imp, DBOX_ROOT_INO, ts_ns(&sb.st_mtim),
				 ts_ns(&sb.st_atim)) < 0)
			return -ENOMEM;
		imp->dirs[imp->ndirs - 1].set_owner_mode = true;
		imp->dirs[imp->ndirs - 1].mode = sb.st_mode & 07777;
		imp->dirs[imp->ndirs - 1].uid = owner_uid(imp, &sb);
		imp->dirs[imp->ndirs - 1].gid = owner_gid(imp, &sb);
	}
	if (adm_path_init(&imp->path, src) < 0)
		return -ENOMEM;
	if ((ret = dbox_index_begin(imp->index)) < 0)
		return ret;
	import_dir(imp, srcfd, DBOX_ROOT_INO, NULL);
	if (imp->fatal) {
		batch_rollback(imp);
		return -EIO;
	}
	if ((ret = batch_commit(imp, true)) < 0) {
		batch_rollback(imp);
		return ret;
	}
	if ((ret = restore_dir_times(imp)) < 0)
		adm_error("%s: restoring directory times: %s", imp->st->path,
			  strerror(-ret));
	return ret;
}

/* Is path the store directory or below it? */
static bool inside_store(const char *path, const char *store)
{
	char *p = realpath(path, NULL), *s = realpath(store, NULL);
	size_t len = s != NULL ? strlen(s) : 0;
	bool inside = p != NULL && s != NULL && strncmp(p, s, len) == 0 &&
		(p[len] == '\0' || p[len] == '/' || strcmp(s, "/") == 0);

	free(p);
	free(s);
	return inside;
}

/* Does source directory fd hold a cur/, new/ or tmp/ directory, at any
   depth (symbolic links not followed)?  A tree without one is not a
   maildir: importing it would make no message.  Unreadable directories
   count as not holding one. */
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

/* Take --compress=SPEC (or --compress SPEC) out of argv, before the flag
   parser sees it, into *set.  Returns 0 or ADM_EXIT_USAGE. */
static int take_compress(int *argc, char **argv,
			 struct dbox_compress_settings *set)
{
	int i = 1;

	while (i < *argc && strcmp(argv[i], "--") != 0) {
		const char *spec = NULL;
		int taken = 1;

		if (strncmp(argv[i], "--compress=", 11) == 0) {
			spec = argv[i] + 11;
		} else if (strcmp(argv[i], "--compress") == 0) {
			if (i + 1 >= *argc)
				return adm_usage_error(&adm_verb_import,
					"import: --compress needs a value");
			spec = argv[i + 1];
			taken = 2;
		}
		if (spec == NULL) {
			i++;
			continue;
		}
		if (dbox_compress_parse(spec, set) < 0)
			return adm_usage_error(&adm_verb_import,
				"import: --compress=%s: want none, gz or "
				"gz:LEVEL (1-9)", spec);
		memmove(argv + i, argv + i + taken,
			(size_t)(*argc - i - taken + 1) * sizeof(*argv));
		*argc -= taken;
	}
	return ADM_EXIT_OK;
}

static int import_main(int argc, char **argv)
{
	struct dbox_store_settings set = { .create = true };
	struct import imp = { 0 };
	struct sigaction sa = { .sa_handler = on_signal,
				.sa_flags = SA_RESTART };
	struct stat sb;
	int npos, srcfd, ret;

	if ((ret = take_compress(&argc, argv, &set.compress)) != 0 ||
	    (ret = adm_parse_args(&adm_verb_import, argc, argv, NULL, NULL,
				  &npos)) != 0)
		return ret;
	if (npos != 2)
		return adm_usage_error(&adm_verb_import,
				       "import: need STORE and MAILDIR");
	if ((ret = adm_store_enter(argv[0])) != 0)
		return ret;
	srcfd = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (srcfd < 0 || fstat(srcfd, &sb) < 0) {
		char why[80];

		adm_error("%s: %s%s", argv[1], strerror(errno),
			  adm_denied_why(errno, why, sizeof(why)));
		return ADM_EXIT_USAGE;
	}
	if (!has_maildir_sub(srcfd, 0)) {
		adm_error("%s: not a maildir: no cur/, new/ or tmp/ directory in "
			  "it or below; nothing imported", argv[1]);
		close(srcfd);
		return ADM_EXIT_USAGE;
	}
	umask(077);
	if (dbox_store_open(argv[0], &set, &imp.st) < 0) {
		/* The store logged why (locked, not a store, ...). */
		close(srcfd);
		return ADM_EXIT_USAGE;
	}
	dbox_store_mutex_lock(imp.st); /* one thread: held all along */
	if (inside_store(argv[1], argv[0])) {
		adm_error("%s: is inside the store %s; refusing to import it",
			  argv[1], argv[0]);
		close(srcfd);
		dbox_store_mutex_unlock(imp.st);
		dbox_store_close(&imp.st);
		return ADM_EXIT_USAGE;
	}
	imp.index = imp.st->index;
	imp.keep_owner = geteuid() == 0;
	imp.buf = malloc(COPY_SIZE);
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	progress_init(&imp.progress, "imported");

	ret = imp.buf == NULL ? -ENOMEM : run_import(&imp, srcfd, argv[1]);

	progress_finish(&imp.progress);
	if (interrupted)
		adm_error("interrupted: %lu messages imported and committed; "
			  "the rest was not imported", imp.messages);
	if (ret == -ENOMEM)
		adm_error("out of memory");
	if (imp.skipped > 0)
		adm_warning("%lu items skipped (see above)", imp.skipped);
	if (imp.present > 0)
		fprintf(stderr, "dboxadm: %lu items already present in the "
			"store with the same bytes, skipped\n", imp.present);
	if (imp.failed > 0)
		adm_error("%lu items failed", imp.failed);
	if (isatty(STDERR_FILENO))
		fprintf(stderr, "dboxadm: %lu messages, %lu plain files, %lu "
			"directories, %lu hard links imported into %s\n",
			imp.messages, imp.files, imp.dirs_made, imp.linked,
			argv[0]);
	close(srcfd);
	dbox_store_mutex_unlock(imp.st);
	dbox_store_close(&imp.st);
	import_free(&imp);
	return ret < 0 || imp.failed > 0 || interrupted ? ADM_EXIT_FAILED :
		ADM_EXIT_OK;
}

const struct adm_verb adm_verb_import = {
	.name = "import",
	.summary = "copy a Maildir++ tree into a store (not mounted)",
	.usage =
	"usage: dboxadm import [--compress=gz[:LEVEL]] STORE MAILDIR\n"
	"\n"
	"Copy the Maildir++ tree MAILDIR into the store STORE, created when it\n"
	"does not exist, without mounting it (refused while it is mounted).\n"
	"\n"
	"  --compress=gz[:LEVEL]  store each message body gzip-compressed, as\n"
	"      Dovecot's zlib plugin does (LEVEL 1-9, default 6); 'none' (the\n"
	"      default) stores them plain.  Sizes and mtimes stay the plaintext's.\n"
	"\n"
	"  files in cur/ new/ tmp/ (not dot-files)  become messages in storage/m.N,\n"
	"      keeping name, size, mtime (also the received date) and mode\n"
	"  other regular files (dovecot-uidlist, .mbsyncstate, maildirfolder, ...)\n"
	"      become plain files in STORE/files/\n"
	"  directories keep their names, modes and mtimes (the root's too, when\n"
	"      the store is empty); hard links stay links\n"
	"  symbolic links (targets as they are, never followed), fifos and\n"
	"      sockets are kept as such, anywhere; devices too as root (else\n"
	"      skipped with a warning)\n"
	"\n"
	"MAILDIR must hold a cur/, new/ or tmp/ directory somewhere, else it is\n"
	"refused (exit 2) before the store is touched.  A name that already\n"
	"exists in the store with the same bytes (an import run again, or\n"
	"resumed after an interruption) is skipped and counted in one summary\n"
	"line; with other bytes, or as a directory, it fails and is not\n"
	"imported.  Exit status: 0 all imported or already present, 1 some\n"
	"items failed, 2 usage error, not a maildir, or store refused.\n"
	"Progress is shown when stderr is a terminal.\n",
	.run = import_main,
};
