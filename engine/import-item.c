/*
 * import-item.c: one item of a maildir import (engine/import.h) - a
 * message, a plain file, a second name, the bytes of an item already
 * present - and the batches they are committed in.
 */
#include "engine/import-private.h"
#include "engine/store-dirs.h"
#include "storage/grow.h"
#include "engine/save-fd.h"
#include "storage/dbox-read.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <unistd.h>

/* A struct timespec as a dbox time (index.h), clamped as ext4 does. */
static int64_t ts_ns(const struct timespec *ts)
{
	return dbox_time_make(ts->tv_sec, ts->tv_nsec);
}

/* --- notes -------------------------------------------------------------- */

const char *import_path(struct dbox_import *imp)
{
	size_t len = strlen(imp->root) + 1;
	char *p;

	for (size_t i = 0; i < imp->depth; i++)
		len += strlen(imp->names[i]) + 1;
	if ((p = realloc(imp->path, len)) == NULL)
		return imp->root;
	imp->path = p;
	p = stpcpy(p, imp->root);
	for (size_t i = 0; i < imp->depth; i++) {
		*p++ = '/';
		p = stpcpy(p, imp->names[i]);
	}
	return imp->path;
}

void import_note(struct dbox_import *imp, enum dbox_import_note_kind kind,
		 const char *what, int err)
{
	struct dbox_import_note note = {
		.kind = kind, .what = what != NULL ? what : "", .err = err,
	};

	if (imp->ops->note == NULL)
		return;
	note.path = import_path(imp);
	imp->ops->note(imp->ops->ctx, &note);
}

/* One item failed: note, count, go on. */
void import_item_failed(struct dbox_import *imp, const char *what, int err)
{
	import_note(imp, DBOX_IMPORT_FAILED, what, err);
	imp->counts->failed++;
}

/* The index failed: nothing more can be trusted in this transaction. */
void import_index_failed(struct dbox_import *imp, const char *what, int err)
{
	if (!imp->fatal)
		import_note(imp, DBOX_IMPORT_INDEX, what, err);
	imp->fatal = true;
}

/* --- batches ------------------------------------------------------------ */

static int touch_file(struct dbox_import *imp, uint32_t file_id)
{
	uint32_t *touched;

	for (size_t i = 0; i < imp->ntouched; i++)
		if (imp->touched[i] == file_id)
			return 0;
	touched = dbox_grow(imp->touched, imp->ntouched, &imp->touched_size,
			    sizeof(*touched));
	if (touched == NULL)
		return -ENOMEM;
	imp->touched = touched;
	imp->touched[imp->ntouched++] = file_id;
	return 0;
}

/* The bytes the transaction refers to onto the disk.  Returns 0 or a
   negative errno. */
static int batch_sync(struct dbox_import *imp)
{
	struct dbox_store *st = imp->st;
	int fd;

	for (size_t i = 0; i < imp->ntouched; i++) {
		if ((fd = dbox_store_read_fd(st, imp->touched[i])) < 0)
			return fd;
		if (fdatasync(fd) < 0)
			return -errno;
	}
	if (imp->nnew_files > 0 && syncfs(st->files_fd) < 0)
		return -errno;
	return 0;
}

/* Commit the transaction, the bytes it refers to first; final: a durable
   commit and no new transaction. */
int import_batch_commit(struct dbox_import *imp, bool final)
{
	int ret = batch_sync(imp);

	if (ret < 0) {
		import_note(imp, DBOX_IMPORT_SYNC, "", -ret);
		imp->fatal = true;
		return ret;
	}
	if ((ret = dbox_index_commit(imp->index, final)) < 0) {
		import_index_failed(imp, "commit", -ret);
		return ret;
	}
	imp->batch = 0;
	imp->ntouched = 0;
	imp->nnew_files = 0;
	imp->committed = *imp->counts;
	if (!final && (ret = dbox_index_begin(imp->index)) < 0) {
		import_index_failed(imp, "begin", -ret);
		return ret;
	}
	return 0;
}

/* Drop the transaction after a fatal error, with the plain files created
   in it (their inode numbers will be handed out again). */
void import_batch_rollback(struct dbox_import *imp)
{
	dbox_index_rollback(imp->index);
	dbox_store_rolled_back(imp->st, imp->touched, imp->ntouched);
	imp->ntouched = 0;
	/* The summary counts what is in the store. */
	imp->counts->messages = imp->committed.messages;
	imp->counts->files = imp->committed.files;
	imp->counts->others = imp->committed.others;
	imp->counts->dirs_made = imp->committed.dirs_made;
	imp->counts->linked = imp->committed.linked;
	for (size_t i = 0; i < imp->nnew_files; i++)
		dbox_store_file_remove(imp->st, imp->new_files[i]);
	imp->nnew_files = 0;
}

void import_batch_item(struct dbox_import *imp)
{
	if (++imp->batch >= DBOX_IMPORT_BATCH)
		import_batch_commit(imp, false);
}

/* --- names and inodes --------------------------------------------------- */

/* Source name already in the store?  0 when free; -EEXIST (attr_r
   filled); other errors are fatal (noted). */
int import_check_free(struct dbox_import *imp, uint64_t dir,
		      const char *name, struct dbox_attr *attr_r)
{
	int ret = dbox_index_lookup(imp->index, dir, name, strlen(name),
				    attr_r);

	if (ret == -ENOENT)
		return 0;
	if (ret == 0)
		return -EEXIST;
	import_index_failed(imp, "lookup", -ret);
	return ret;
}

/* Take back the name dir/name and its inode, created by this import
   for an item that failed. */
static void undo_create(struct dbox_import *imp, uint64_t dir,
			const char *name)
{
	uint64_t ino;
	uint32_t nlink;
	int ret;

	ret = dbox_index_remove(imp->index, dir, name, strlen(name), false,
				dbox_now_ns(), &ino, &nlink);
	if (ret == 0 && nlink == 0)
		ret = dbox_index_delete_inode(imp->index, ino);
	if (ret < 0)
		import_index_failed(imp, "undo", -ret);
}

uint32_t import_uid(const struct dbox_import *imp, const struct stat *sb)
{
	return imp->keep_owner ? sb->st_uid : getuid();
}

uint32_t import_gid(const struct dbox_import *imp, const struct stat *sb)
{
	return imp->keep_owner ? sb->st_gid : getgid();
}

/* A source inode with more names becomes index inode ino: its other
   names become links to it. */
void import_remember_link(struct dbox_import *imp, const struct stat *sb,
			  uint64_t ino)
{
	if (sb->st_nlink > 1 &&
	    inomap_get(&imp->links, sb->st_dev, sb->st_ino) == NULL &&
	    inomap_put(&imp->links, sb->st_dev, sb->st_ino, ino, NULL) < 0)
		import_note(imp, DBOX_IMPORT_LINKS_LOST, "", ENOMEM);
}

/* Create the inode for a regular file.  Returns 0, or < 0 with the error
   already noted (item or fatal). */
static int create_reg(struct dbox_import *imp, uint64_t dir, const char *name,
		      const struct stat *sb, enum dbox_kind kind,
		      struct dbox_attr *attr_r)
{
	int ret = import_check_free(imp, dir, name, attr_r);

	if (ret == -EEXIST)
		import_item_failed(imp, "", EEXIST);
	if (ret < 0)
		return ret;
	ret = dbox_index_create(imp->index, dir, name, strlen(name), kind,
				S_IFREG | (sb->st_mode & 07777),
				import_uid(imp, sb), import_gid(imp, sb),
				dbox_now_ns(), attr_r);
	if (ret < 0)
		import_index_failed(imp, "create", -ret);
	return ret;
}

/* The user.* extended attributes of source fd into index inode ino (as
   cp -a and rsync -X copy them; other namespaces are not stored).  A
   source that has none, or cannot list them, imports without. */
void import_xattrs(struct dbox_import *imp, int fd, uint64_t ino)
{
	char *names = NULL, *value = NULL;
	ssize_t len = flistxattr(fd, NULL, 0), vlen;
	int ret;

	if (len <= 0)
		return;
	if ((names = malloc((size_t)len)) == NULL ||
	    (len = flistxattr(fd, names, (size_t)len)) < 0 ||
	    (value = malloc(DBOX_XATTR_SIZE_MAX)) == NULL) {
		import_item_failed(imp, "extended attributes", names == NULL ||
				   value == NULL ? ENOMEM : errno);
		goto out;
	}
	for (char *n = names; n < names + len; n += strlen(n) + 1) {
		if (strncmp(n, DBOX_XATTR_USER_PREFIX,
			    strlen(DBOX_XATTR_USER_PREFIX)) != 0)
			continue;
		vlen = fgetxattr(fd, n, value, DBOX_XATTR_SIZE_MAX);
		if (vlen < 0) {
			import_item_failed(imp, n, errno);
			continue;
		}
		ret = dbox_index_xattr_set(imp->index, ino, n, value,
					   (size_t)vlen, 0);
		if (ret == -ERANGE || ret == -ENOSPC) {
			import_item_failed(imp, n, -ret);
		} else if (ret < 0) {
			import_index_failed(imp, "xattr", -ret);
			break;
		}
	}
out:
	free(names);
	free(value);
}

/* The end of a message or plain file made of source fd (sb): its size
   and times (atime too, as cp -a keeps it), extended attributes, other
   names.  Returns 0 or a negative errno (noted). */
static int finish_reg(struct dbox_import *imp, int fd, const struct stat *sb,
		      struct dbox_attr *attr, uint64_t size)
{
	int ret;

	attr->size = size;
	attr->mtime_ns = ts_ns(&sb->st_mtim);
	attr->atime_ns = ts_ns(&sb->st_atim);
	if ((ret = dbox_index_setattr(imp->index, attr)) < 0) {
		import_index_failed(imp, "setattr", -ret);
		return ret;
	}
	import_xattrs(imp, fd, attr->ino);
	import_remember_link(imp, sb, attr->ino);
	if (imp->ops->progress != NULL)
		imp->ops->progress(imp->ops->ctx,
				   attr->kind == DBOX_KIND_MESSAGE, size);
	import_batch_item(imp);
	return 0;
}

/* A message: fd is the open source file, sb its fstat. */
void import_message(struct dbox_import *imp, int fd, const struct stat *sb,
		    uint64_t dir, const char *name, const char *mailbox)
{
	struct dbox_msgloc loc;
	struct dbox_attr attr;
	int64_t size;

	if (create_reg(imp, dir, name, sb, DBOX_KIND_MESSAGE, &attr) < 0)
		return;
	size = dbox_save_from_fd(imp->st, attr.ino, mailbox, fd,
				 dbox_time_sec(ts_ns(&sb->st_mtim)),
				 &imp->copy_stop, &loc);
	if (size < 0) {
		/* -EINTR: the import was stopped in its middle, which is
		   no failure of this item (helper-85). */
		if (size != -EINTR)
			import_item_failed(imp, "", (int)-size);
		undo_create(imp, dir, name);
		return;
	}
	if (touch_file(imp, loc.file_id) < 0) {
		import_index_failed(imp, "bookkeeping", ENOMEM);
		return;
	}
	if (finish_reg(imp, fd, sb, &attr, (uint64_t)size) == 0)
		imp->counts->messages++;
}

/* A plain file: bytes into STORE/files/<ino>. */
void import_file(struct dbox_import *imp, int fd, const struct stat *sb,
		 uint64_t dir, const char *name)
{
	struct timespec times[2] = { sb->st_atim, sb->st_mtim };
	struct dbox_attr attr;
	uint64_t *new_files;
	int64_t size;

	if (create_reg(imp, dir, name, sb, DBOX_KIND_FILE, &attr) < 0)
		return;
	size = dbox_store_file_from_fd(imp->st, attr.ino, fd, times,
					&imp->copy_stop);
	if (size < 0) {
		if (size != -EINTR) /* stopped: as for a message */
			import_item_failed(imp, "", (int)-size);
		undo_create(imp, dir, name);
		return;
	}
	new_files = dbox_grow(imp->new_files, imp->nnew_files,
			      &imp->new_files_size, sizeof(*new_files));
	if (new_files != NULL) {
		imp->new_files = new_files;
		imp->new_files[imp->nnew_files++] = attr.ino;
	}
	if (finish_reg(imp, fd, sb, &attr, (uint64_t)size) == 0)
		imp->counts->files++;
}

/* Another name of a source inode already imported as index inode ino. */
void import_link(struct dbox_import *imp, uint64_t ino, uint64_t dir,
		 const char *name)
{
	struct dbox_attr attr;
	int ret = import_check_free(imp, dir, name, &attr);

	if (ret == -EEXIST)
		import_item_failed(imp, "", EEXIST);
	if (ret < 0)
		return;
	ret = dbox_index_link(imp->index, ino, dir, name, strlen(name),
			      dbox_now_ns(), &attr);
	if (ret < 0) {
		import_index_failed(imp, "link", -ret);
		return;
	}
	imp->counts->linked++;
	import_batch_item(imp);
}

/* --- items already present ---------------------------------------------- */

/* Read the next len bytes (or up to the end) at off of the store's copy:
   its message reader, or its backing file fd.  Returns the byte count or
   a negative errno. */
static ssize_t read_stored(struct dbox_reader *reader, int fd, void *buf,
			   size_t len, uint64_t off)
{
	ssize_t n;

	if (reader != NULL) {
		n = dbox_reader_pread(reader, buf, len, off);
		return n < 0 ? dbox_corrupt_as_eio((int)n) : n;
	}
	do
		n = pread(fd, buf, len, (off_t)off);
	while (n < 0 && errno == EINTR);
	return n < 0 ? -errno : n;
}

/* The store's copy of attr, to read: *reader_r for a message, else the
   backing file's descriptor (returned).  Returns the fd, 0 with a reader,
   or a negative errno. */
static int open_stored(struct dbox_import *imp, const struct dbox_attr *attr,
		       struct dbox_reader **reader_r)
{
	struct dbox_msgloc loc;
	char backing[24];
	int ret, fd;

	if (attr->kind == DBOX_KIND_MESSAGE) {
		if ((ret = dbox_index_msg_get(imp->index, attr->ino, &loc)) < 0)
			return ret;
		return dbox_store_open_reader(imp->st, &loc, attr->size,
					      reader_r);
	}
	dbox_files_name(backing, attr->ino);
	fd = openat(imp->st->files_fd, backing,
		    O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

/* Are the bytes of source fd (sb) those the store holds for attr (a
   message or plain file)?  Returns 1 same, 0 different, or a negative
   errno when either side cannot be read. */
static int same_content(struct dbox_import *imp, int fd, const struct stat *sb,
			const struct dbox_attr *attr)
{
	struct dbox_reader *reader = NULL;
	char *a = imp->buf, *b = imp->buf + IMPORT_CMP_SIZE / 2;
	uint64_t off = 0;
	int stored, ret;

	if ((uint64_t)sb->st_size != attr->size)
		return 0;
	if ((stored = open_stored(imp, attr, &reader)) < 0)
		return stored;
	for (ret = 2; ret == 2;) {  /* 2: equal so far */
		ssize_t n = pread(fd, a, IMPORT_CMP_SIZE / 2, (off_t)off), m;

		if (n < 0) {
			if (errno != EINTR)
				ret = -errno;
			continue;
		}
		/* At the source's end, the stored copy must end too. */
		m = read_stored(reader, reader != NULL ? -1 : stored, b,
				n > 0 ? (size_t)n : 1, off);
		if (m < 0)
			ret = (int)m;
		else if (m != n || memcmp(a, b, (size_t)n) != 0)
			ret = 0;
		else if (n == 0)
			ret = 1;
		off += (uint64_t)n;
	}
	if (reader != NULL)
		dbox_reader_free(&reader);
	else
		close(stored);
	return ret;
}

bool import_present_renamed(struct dbox_import *imp, int fd,
			    const struct stat *sb, const char *name)
{
	size_t len = strcspn(name, ":");
	struct dbox_attr attr;

	for (size_t i = 0; i < 2; i++) {
		int ret;

		if (imp->renamed_dirs[i] == 0)
			continue;
		ret = dbox_index_lookup_unique(imp->index, imp->renamed_dirs[i],
					       name, len, &attr);
		if (ret == -EIO)
			import_index_failed(imp, "lookup", EIO);
		if (ret < 0 || attr.kind != DBOX_KIND_MESSAGE ||
		    same_content(imp, fd, sb, &attr) != 1)
			continue;
		import_remember_link(imp, sb, attr.ino);
		imp->counts->present++;
		imp->counts->renamed++;
		return true;
	}
	return false;
}

/* The source name is already in the store: a resumed or repeated import.
   The same bytes count as present (and the source inode maps to the
   stored one, for its other hard links); other bytes, or a directory of
   that name, fail the item. */
void import_present(struct dbox_import *imp, int fd, const struct stat *sb,
		    const struct dbox_attr *attr)
{
	int ret = attr->kind == DBOX_KIND_DIR ? 0 :
		same_content(imp, fd, sb, attr);

	if (ret < 0) {
		import_item_failed(imp, "exists in the store, and comparing "
				   "it failed", -ret);
		return;
	}
	if (ret == 0) {
		import_note(imp, DBOX_IMPORT_DIFFERENT, "", 0);
		imp->counts->failed++;
		return;
	}
	import_remember_link(imp, sb, attr->ino);
	imp->counts->present++;
}
