/*
 * fs-file.c: FUSE operations on open files: create, mknod, open, read,
 * write, flush, release, fsync, setattr.
 *
 * A message is written straight into an m.N record owned by its inode's
 * save (inode->save, shared by every handle open for writing).  The record
 * is finished - metadata written, index row COMMITTED - at flush (close)
 * and fsync.  A finished record is never written again: a write,
 * truncate or O_TRUNC open of a committed message - also one whose save
 * finished a moment ago at an fsync or a close - starts a new save with a
 * copy of its bytes (copy-on-write).  The index keeps naming the old
 * record until the copy is finished, so a crash in between leaves the
 * version the last close or fsync acknowledged; the old record becomes
 * garbage for purge then.
 *
 * Plain files are pread/pwrite on STORE/files/<ino>.
 */
#include "engine/maildir.h"
#include "fs.h"
#include "fs-purge.h"

#include "storage/dbox-read.h"
#include "index/reserve.h"
#include "index/wal-sync.h"
#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static struct fs *req_fs(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

static struct fs_handle *handle_of(struct fuse_file_info *fi)
{
	return (struct fs_handle *)(uintptr_t)fi->fh;
}

static struct fs_handle *handle_new(enum dbox_kind kind, struct fs_inode *inode)
{
	struct fs_handle *h = calloc(1, sizeof(*h));

	if (h == NULL)
		return NULL;
	h->kind = kind;
	h->inode = inode;
	h->fd = -1;
	pthread_mutex_init(&h->read_lock, NULL);
	inode->nopen++;
	return h;
}

static void handle_free(struct fs_handle *h)
{
	if (h->fd >= 0)
		close(h->fd);
	dbox_reader_free(&h->reader);
	pthread_mutex_destroy(&h->read_lock);
	free(h);
}

static int open_backing(struct fs *fs, uint64_t ino, int flags)
{
	char name[24];
	int fd;

	fs_file_name(name, ino);
	/* O_NOFOLLOW: files/ holds files by inode number, never a symlink
	   out of the store (ELOOP -> EIO). */
	fd = openat(fs->st->files_fd, name, flags | O_NOFOLLOW | O_CLOEXEC |
		    (fs->st->readonly ? O_RDONLY : O_RDWR), 0600);
	if (fd < 0 && errno == EPERM && (flags & O_NOATIME)) {
		/* O_NOATIME needs the file's owner (or CAP_FOWNER). */
		fd = openat(fs->st->files_fd, name, (flags & ~O_NOATIME) |
			    O_NOFOLLOW | O_CLOEXEC |
			    (fs->st->readonly ? O_RDONLY : O_RDWR), 0600);
	}
	if (fd < 0) {
		int err = errno;

		dbox_error("%s/files/%s: %s", fs->st->path, name, strerror(err));
		return err == ENOSPC || err == EDQUOT || err == EMFILE ||
			err == ENFILE ? -err : -EIO;
	}
	return fd;
}

/* Start writing ino's message: a new save (inode->save), holding a copy
   of the first copy_bytes bytes of the committed message.  The index
   keeps the committed record until the save's first finish: a crash
   before leaves the message as it was (recovery cuts the unfinished
   copy), instead of dropping it with all its names.  The copy's m.N row
   and its in-flight mark (inflight.m.N) are committed before its first
   byte; the copy itself runs without the lock, the inode busy meanwhile
   (inode->save is NULL until it is done): called and returns with the
   lock held, the inode idle. */
static int start_write(struct fs *fs, struct fs_inode *inode,
		       uint64_t copy_bytes)
{
	struct dbox_store *st = fs->st;
	struct dbox_reader *reader = NULL;
	struct dbox_save *save = NULL;
	struct dbox_msgloc loc;
	struct dbox_attr attr;
	uint64_t parent, off = 0;
	char *mailbox = NULL;
	char buf[65536];
	int ret;

	if ((ret = dbox_index_getattr(st->index, inode->ino, &attr)) < 0 ||
	    (ret = dbox_index_msg_get(st->index, inode->ino, &loc)) < 0)
		return ret;
	if (dbox_index_parent(st->index, inode->ino, &parent) < 0 ||
	    maildir_mailbox_name(st->index, parent, &mailbox) < 0)
		mailbox = NULL;
	if (copy_bytes > attr.size)
		copy_bytes = attr.size;
	if (copy_bytes > 0 &&
	    (ret = dbox_store_open_reader(st, &loc, attr.size, &reader)) < 0)
		goto out;
	/* No WRITING row: until the copy is finished the index keeps the
	   old record.  The copy's in-flight mark goes in with its m.N row:
	   recovery must know the copy for an unfinished write (and cut it),
	   not take it for a lost message. */
	if ((ret = dbox_save_begin_copy(st, inode->ino,
					mailbox != NULL ? mailbox : "INBOX",
					&save)) < 0)
		goto out;
	if (copy_bytes > 0) {
		fs_busy_begin(fs, inode);
		while (off < copy_bytes) {
			size_t want = copy_bytes - off < sizeof(buf) ?
				copy_bytes - off : sizeof(buf);
			ssize_t n = dbox_reader_pread(reader, buf, want, off);

			if (n <= 0) {
				ret = n < 0 ? -errno : -EIO;
				break;
			}
			if ((ret = dbox_save_write(save, buf, n, off)) < 0)
				break;
			off += n;
		}
		fs_busy_end(fs, inode);
	}
	if (ret == 0) {
		inode->save = save;
		save = NULL;
		__atomic_add_fetch(&inode->gen, 1, __ATOMIC_RELEASE);
		fs_purge_note(fs, loc.file_id); /* the old record is garbage */
	}
out:
	dbox_save_free(&save);
	dbox_reader_free(&reader);
	free(mailbox);
	return ret;
}

/* Let go of inode's save; an fsync still using it (between its steps,
   outside the lock: a reference of its own) frees it when done.  Needs
   the lock. */
static void save_drop(struct fs_inode *inode)
{
	dbox_save_free(&inode->save);
}

/* Make inode->save a save that may be written.  None, or one whose
   record is finished (committed at a close or fsync: a version a client
   was told is stored), gives way to a new save holding a copy of the
   first copy_bytes bytes of the committed message: the finished record
   stays what the index names until the copy is finished in its turn.
   Needs the lock and the inode idle; the copy runs unlocked with the
   inode busy (start_write), and it is idle again on return. */
static int message_writable(struct fs *fs, struct fs_inode *inode,
			    uint64_t copy_bytes)
{
	if (inode->save != NULL && !dbox_save_finished(inode->save))
		return 0;
	save_drop(inode);
	return start_write(fs, inode, copy_bytes);
}

/* Finish the message being written: record on disk, index COMMITTED with
   its size.  sync: data and index on disk before returning.  Opens and
   commits its own transaction.  The record is sealed without the lock
   (the inode busy meanwhile): called and returns with the lock held, the
   inode idle (fs_inode_wait_idle). */
static int message_finish(struct fs *fs, struct fs_inode *inode, bool sync)
{
	struct dbox_index *index = fs->st->index;
	struct dbox_attr attr;
	struct dbox_msgloc loc;
	int ret;

	if (dbox_save_finished(inode->save) && !sync)
		return 0;
	/* A copy's in-flight mark is durable before its bytes are (at
	   once when an fsync synced it already). */
	if (sync && dbox_save_inflight_seq(inode->save) != 0 &&
	    (ret = dbox_index_sync_upto(index,
			dbox_save_inflight_seq(inode->save))) < 0)
		return ret;
	if (!dbox_save_sealed(inode->save)) {
		/* The heavy part (V read back, compression), unlocked. */
		struct dbox_save *save = inode->save;
		time_t received;

		if ((ret = dbox_index_getattr(index, inode->ino, &attr)) < 0)
			return ret;
		/* R as the finish below would write it (h4's dbox time of
		   the last write, not yet stored); the finish keeps it. */
		received = dbox_time_sec(fs_message_mtime(fs, &attr));
		fs_busy_begin(fs, inode);
		ret = dbox_save_seal(save, received);
		fs_busy_end(fs, inode);
		if (ret < 0)
			return ret;
	}
	if ((ret = dbox_index_begin(index)) < 0)
		return ret;
	ret = dbox_index_getattr(index, inode->ino, &attr);
	if (ret == 0)
		ret = dbox_save_finish(inode->save,
				       dbox_time_sec(fs_message_mtime(fs, &attr)),
				       sync, &loc);
	if (ret == 0 && (attr.size != dbox_save_size(inode->save) ||
			 inode->written)) {
		attr.size = dbox_save_size(inode->save);
		if (inode->written)
			attr.mtime_ns = attr.ctime_ns = inode->wtime;
		ret = dbox_index_setattr(index, &attr);
	}
	ret = fs_tx_end(fs, ret, sync);
	if (ret == 0)
		inode->written = false;
	return ret;
}

/* A client wrote to (or truncated) message inode: its mtime and ctime
   are now, as on ext4; stored when the record is finished. */
static void message_written(struct fs_inode *inode)
{
	inode->wtime = dbox_now_ns();
	inode->written = true;
}

/* Create a regular file: a message in cur/new/tmp, else a plain file. */
static int create_file(struct fs *fs, fuse_req_t req, fuse_ino_t parent,
		       const char *name, mode_t mode, bool open,
		       struct dbox_attr *attr_r, struct fs_handle **h_r)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct dbox_store *st = fs->st;
	struct fs_inode *inode;
	struct dbox_msgloc loc;
	char *mailbox = NULL;
	uint32_t imode = S_IFREG | (mode & ~ctx->umask & 07777), gid;
	enum dbox_kind kind;
	int fd = -1, ret;

	*h_r = NULL;
	if ((ret = dbox_index_begin(st->index)) < 0)
		return ret;
	kind = fs_is_message_name(fs, parent, name) ? DBOX_KIND_MESSAGE :
		DBOX_KIND_FILE;
	ret = fs_new_owner(fs, ctx, parent, &imode, &gid);
	if (ret == 0)
		ret = dbox_index_create(st->index, parent, name, strlen(name),
					kind, imode, ctx->uid, gid,
					dbox_now_ns(), attr_r);
	if (ret < 0)
		return fs_tx_end(fs, ret, false);
	if ((inode = fs_inode_add(&fs->inodes, attr_r->ino)) == NULL) {
		ret = -ENOMEM;
	} else if (kind == DBOX_KIND_MESSAGE) {
		ret = maildir_mailbox_name(st->index, parent, &mailbox);
		if (ret == 0)
			ret = dbox_save_begin(st, attr_r->ino, mailbox, &inode->save);
		free(mailbox);
		if (ret == 0 && !open) {
			ret = dbox_save_finish(inode->save,
					       dbox_time_sec(attr_r->mtime_ns),
					       false, &loc);
			dbox_save_free(&inode->save);
		}
	} else {
		fd = ret = open_backing(fs, attr_r->ino, O_CREAT | O_EXCL);
	}
	if (ret >= 0 && open) {
		*h_r = handle_new(kind, inode);
		if (*h_r == NULL) {
			ret = -ENOMEM;
		} else {
			(*h_r)->fd = fd;
			fd = -1;
			if (kind == DBOX_KIND_MESSAGE) {
				(*h_r)->writer = true;
				inode->nwriters++;
			}
		}
	}
	if (fd >= 0)
		close(fd);
	ret = fs_tx_end(fs, ret < 0 ? ret : 0, false);
	if (ret < 0 && inode != NULL) {
		if (*h_r != NULL) {
			handle_free(*h_r);
			*h_r = NULL;
			inode->nopen--;
		}
		dbox_save_free(&inode->save);
		if (fs_inode_unused(inode))
			fs_inode_remove(&fs->inodes, attr_r->ino);
	}
	return ret;
}

void fs_create(fuse_req_t req, fuse_ino_t parent, const char *name,
	       mode_t mode, struct fuse_file_info *fi)
{
	struct fs *fs = req_fs(req);
	struct fuse_entry_param e;
	struct dbox_attr attr;
	struct fs_handle *h;
	int ret;

	fs_lock(fs);
	ret = create_file(fs, req, parent, name, mode, true, &attr, &h);
	if (ret == 0)
		ret = fs_entry(fs, &attr, &e);
	fs_unlock(fs);
	if (ret < 0) {
		fuse_reply_err(req, -ret);
		return;
	}
	fi->fh = (uintptr_t)h;
	fi->keep_cache = 1;
	fi->noflush = !h->writer;
	fuse_reply_create(req, &e, fi);
}

/* A fifo, socket (bind() of a unix socket), character or block device:
   an inode with mode and rdev only, anywhere (in cur/new/tmp too, where
   it is not a message); the kernel serves its I/O and never sends an
   OPEN for it.  CAP_MKNOD for devices is checked by the kernel. */
static int create_special(struct fs *fs, fuse_req_t req, fuse_ino_t parent,
			  const char *name, mode_t mode, dev_t rdev,
			  struct dbox_attr *attr_r)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct dbox_index *index = fs->st->index;
	uint32_t imode = (mode & S_IFMT) | (mode & ~ctx->umask & 07777), gid;
	int ret;

	if ((ret = dbox_index_begin(index)) < 0)
		return ret;
	ret = fs_new_owner(fs, ctx, parent, &imode, &gid);
	if (ret == 0)
		ret = dbox_index_create(index, parent, name, strlen(name),
					DBOX_KIND_SPECIAL, imode, ctx->uid,
					gid, dbox_now_ns(), attr_r);
	if (ret == 0 && (S_ISCHR(mode) || S_ISBLK(mode))) {
		attr_r->rdev = rdev;
		ret = dbox_index_setattr(index, attr_r);
	}
	return fs_tx_end(fs, ret, false);
}

void fs_mknod(fuse_req_t req, fuse_ino_t parent, const char *name,
	      mode_t mode, dev_t rdev)
{
	struct fs *fs = req_fs(req);
	struct fuse_entry_param e;
	struct dbox_attr attr;
	struct fs_handle *h;
	int ret;

	fs_lock(fs);
	if (S_ISREG(mode))
		ret = create_file(fs, req, parent, name, mode, false, &attr, &h);
	else if (S_ISFIFO(mode) || S_ISSOCK(mode) || S_ISCHR(mode) ||
		 S_ISBLK(mode))
		ret = create_special(fs, req, parent, name, mode, rdev, &attr);
	else
		ret = -EINVAL; /* mknod(2)'s answer to an unknown type */
	if (ret == 0)
		ret = fs_entry(fs, &attr, &e);
	fs_unlock(fs);
	if (ret < 0)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_entry(req, &e);
}

static int message_truncate(struct fs *fs, struct fs_inode *inode,
			    uint64_t size);

static int open_message(struct fs *fs, struct fs_inode *inode, int flags,
			struct fs_handle *h)
{
	int ret;

	if ((flags & O_TRUNC) && (flags & O_ACCMODE) == O_RDONLY) {
		/* Linux truncates at O_TRUNC whatever the access mode (ext4
		   does for O_RDONLY too): complete now, as a truncate(). */
		if ((ret = message_truncate(fs, inode, 0)) < 0)
			return ret;
	}
	if ((flags & O_ACCMODE) != O_RDONLY) {
		/* The copy (copy-on-write) is made at the first write, so an
		   open for writing that writes nothing costs nothing. */
		if (flags & O_TRUNC) {
			ret = message_writable(fs, inode, 0);
			if (ret == 0)
				ret = dbox_save_truncate(inode->save, 0);
			if (ret < 0)
				return ret;
			message_written(inode);
		}
		h->writer = true;
		inode->nwriters++;
		return 0;
	}
	/* The reader is opened at the first READ (fs_read), which also
	   reads from a save in progress: an open whose data the kernel
	   still has cached (keep_cache) costs no message lookup. */
	return 0;
}

void fs_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = req_fs(req);
	struct fs_inode *inode;
	struct dbox_attr attr;
	struct fs_handle *h = NULL;
	enum dbox_kind kind;
	int ret = 0;

	fs_lock(fs);
	/* The kernel opens what it looked up: the kind is usually known
	   from the lookup, sparing an index query per open.  A message
	   being finished or copied, or a plain file being turned into one,
	   is opened once that is done. */
	inode = fs_inode_wait_idle(fs, ino);
	if (inode != NULL && inode->kind != 0) {
		kind = inode->kind;
	} else {
		ret = dbox_index_getattr(fs->st->index, ino, &attr);
		kind = ret == 0 ? attr.kind : DBOX_KIND_FILE;
	}
	if (ret == 0 && kind == DBOX_KIND_DIR)
		ret = -EISDIR;
	/* The kernel opens neither (it follows a symlink; a fifo, socket or
	   device is its own): an OPEN for one is refused as Linux does. */
	if (ret == 0 && kind == DBOX_KIND_SYMLINK)
		ret = -ELOOP;
	if (ret == 0 && kind == DBOX_KIND_SPECIAL)
		ret = -ENXIO;
	if (ret == 0 && (inode = fs_inode_add(&fs->inodes, ino)) == NULL)
		ret = -ENOMEM;
	if (ret == 0) {
		inode->kind = kind;
		if ((h = handle_new(kind, inode)) == NULL)
			ret = -ENOMEM;
	}
	if (ret == 0) {
		if (kind == DBOX_KIND_MESSAGE) {
			ret = open_message(fs, inode, fi->flags, h);
			/* The kernel never moves a FUSE file's atime: a read
			   that would move it (relatime) must reach this
			   daemon, so the open drops the cached pages then
			   (rare: once after each change, or a day). */
			if (ret == 0 && (fi->flags & O_ACCMODE) != O_WRONLY &&
			    !(fi->flags & O_NOATIME) && !fs->opts.noatime &&
			    dbox_index_getattr(fs->st->index, ino, &attr) == 0)
				h->atime_due = fs_atime_due(fs, &attr,
							    dbox_now_ns());
		} else {
			/* The backing file's atime is the file's: reads
			   move it by the backing mount's rule, or not at
			   all with -o noatime or O_NOATIME. */
			h->fd = ret = open_backing(fs, ino,
						   fs->opts.noatime ||
						   (fi->flags & O_NOATIME) ?
						   O_NOATIME : 0);
			/* A read that moves atime must reach the backing
			   file: no cached pages then (as for messages). */
			if (ret >= 0 && (fi->flags & O_ACCMODE) != O_WRONLY &&
			    !(fi->flags & O_NOATIME))
				h->atime_due = fs_backing_atime_due(fs, h->fd);
			if (ret >= 0 && (fi->flags & O_TRUNC) &&
			    ftruncate(h->fd, 0) < 0)
				ret = -errno;
			ret = ret < 0 ? ret : 0;
		}
		if (ret < 0) {
			handle_free(h);
			fs_inode_unref(fs, ino, 0, true);
		}
	}
	fs_unlock(fs);
	if (ret < 0) {
		fuse_reply_err(req, -ret);
		return;
	}
	fi->fh = (uintptr_t)h;
	fi->keep_cache = !h->atime_due;
	/* Only a message writer does work at close (fs_flush): other
	   handles spare the kernel the FLUSH round trip. */
	fi->noflush = !h->writer;
	fuse_reply_open(req, fi);
}

void fs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
	     struct fuse_file_info *fi)
{
	struct fs *fs = req_fs(req);
	struct fs_handle *h = handle_of(fi);
	char *buf = malloc(size);
	bool opened = false;
	ssize_t n;

	if (buf == NULL) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	if (h->kind == DBOX_KIND_FILE) {
		n = pread(h->fd, buf, size, off);
		if (n < 0)
			n = -errno;
	} else {
		pthread_mutex_lock(&h->read_lock);
		if (h->reader != NULL && h->reader_gen ==
		    __atomic_load_n(&h->inode->gen, __ATOMIC_ACQUIRE)) {
			n = dbox_reader_pread(h->reader, buf, size, off);
			if (n < 0)
				n = errno == EIO || errno == 0 ? -EIO : -errno;
		} else {
			fs_lock(fs);
			fs_inode_wait_idle(fs, ino);
			if (h->atime_due) {
				h->atime_due = false;
				if (fs_atime_touch(fs, ino) < 0)
					dbox_warning("%s: inode %llu: atime not "
						     "stored", fs->st->path,
						     (unsigned long long)ino);
			}
			if (h->inode->save != NULL) {
				/* Unlocked: reading a body being compressed
				   turns it plain first (dbox-body.h). */
				struct dbox_save *save = h->inode->save;

				fs_busy_begin(fs, h->inode);
				n = dbox_save_read(save, buf, size, off);
				fs_busy_end(fs, h->inode);
			} else {
				/* The first read of this handle, or opened
				   while being written, or the message was
				   rewritten (copy-on-write) since: read its
				   current record. */
				struct dbox_msgloc loc;
				struct dbox_attr attr;

				dbox_reader_free(&h->reader);
				h->reader_gen = h->inode->gen;
				n = dbox_index_getattr(fs->st->index, ino, &attr);
				if (n == 0)
					n = dbox_index_msg_get(fs->st->index, ino, &loc);
				if (n == 0)
					n = dbox_store_open_reader(fs->st, &loc, attr.size,
								   &h->reader);
				opened = n == 0; /* read below, unlocked */
			}
			fs_unlock(fs);
			/* The reader is the handle's (read_lock): reading
			   the m.N, possibly from disk, holds up no one. */
			if (opened) {
				n = dbox_reader_pread(h->reader, buf, size, off);
				if (n < 0)
					n = -EIO;
			}
		}
		pthread_mutex_unlock(&h->read_lock);
	}
	if (n < 0)
		fuse_reply_err(req, -n);
	else
		fuse_reply_buf(req, buf, n);
	free(buf);
}

void fs_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size,
	      off_t off, struct fuse_file_info *fi)
{
	struct fs *fs = req_fs(req);
	struct fs_handle *h = handle_of(fi);
	struct fs_inode *inode = h->inode;
	ssize_t ret;

	if (h->kind == DBOX_KIND_FILE) {
		/* Plain files are data too: the index reserve is not theirs. */
		ret = dbox_index_reserve_check(fs->st->index);
		if (ret == 0 && (ret = pwrite(h->fd, buf, size, off)) < 0)
			ret = -errno;
	} else if (!h->writer) {
		ret = -EBADF;
	} else {
		fs_lock(fs);
		fs_inode_wait_idle(fs, inode->ino);
		/* The first write to a committed message, or the first after
		   a flush or fsync committed it: a new copy (made unlocked,
		   the inode busy). */
		ret = message_writable(fs, inode, UINT64_MAX);
		if (ret == 0) {
			/* The bytes go in without the lock: a write may
			   also turn a compressed body plain (all of it). */
			struct dbox_save *save = inode->save;

			fs_busy_begin(fs, inode);
			ret = dbox_save_write(save, buf, size, off);
			fs_busy_end(fs, inode);
		}
		if (ret >= 0)
			message_written(inode);
		fs_unlock(fs);
	}
	if (ret < 0)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_write(req, size);
}

void fs_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = req_fs(req);
	struct fs_handle *h = handle_of(fi);
	int ret = 0;

	if (h->writer) {
		/* close(): the message is complete as it stands; errors
		   (ENOSPC) reach the client here, not at release. */
		fs_lock(fs);
		fs_inode_wait_idle(fs, ino);
		if (h->inode->save != NULL)
			ret = message_finish(fs, h->inode, false);
		fs_unlock(fs);
	}
	fuse_reply_err(req, -ret);
}

/* Is ino a plain file with one name, a message name: parent gets its
   directory.  Needs the lock. */
static bool file_wants_message(struct fs *fs, uint64_t ino, uint64_t *parent_r)
{
	struct dbox_index *index = fs->st->index;
	struct dbox_attr attr;
	char *name = NULL;
	bool ret;

	if (dbox_index_getattr(index, ino, &attr) < 0 ||
	    attr.kind != DBOX_KIND_FILE || attr.nlink != 1 ||
	    dbox_index_entry_of(index, ino, parent_r, &name) < 0)
		return false;
	ret = fs_is_message_name(fs, *parent_r, name);
	free(name);
	return ret;
}

/* A plain file renamed to a message name while open (rename converts only
   closed files) becomes a message at its last close, as rename would have
   made it.  Its bytes are copied without the lock (fs_file_copy_out);
   called and returns with the lock held.  Returns true when it did: the
   caller then removes the backing file, after unlocking (freeing a big
   file's blocks takes a while). */
static bool file_closed(struct fs *fs, uint64_t ino)
{
	struct dbox_index *index = fs->st->index;
	struct dbox_save *copied = NULL;
	uint64_t parent, parent_now;
	char file[24];
	int ret;

	if (!file_wants_message(fs, ino, &parent))
		return false;
	ret = fs_file_copy_out(fs, ino, parent, &copied);
	/* Renamed or linked while it was copied (the lock was free): no
	   message any more, or one of another folder (its B metadata
	   differs: copied again, under the lock, in this rare case). */
	if (ret == 0 && !file_wants_message(fs, ino, &parent_now))
		ret = -EAGAIN;
	if (ret == 0 && parent_now != parent)
		dbox_save_free(&copied);
	if (ret == 0 && (ret = dbox_index_begin(index)) == 0)
		ret = fs_tx_end(fs, fs_file_to_message(fs, ino, parent_now,
						      copied), false);
	dbox_save_free(&copied);
	fs_file_name(file, ino);
	if (ret < 0 && ret != -EAGAIN)
		dbox_error("%s/files/%s: not turned into a message: %s",
			   fs->st->path, file, strerror(-ret));
	return ret == 0;
}

void fs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = req_fs(req);
	struct fs_handle *h = handle_of(fi);
	struct fs_inode *inode = h->inode;
	bool converted = false;

	fs_lock(fs);
	fs_inode_wait_idle(fs, ino);
	if (h->kind == DBOX_KIND_FILE && inode->nopen == 1)
		converted = file_closed(fs, ino);
	if (h->writer && --inode->nwriters == 0 && inode->save != NULL) {
		bool discard = inode->unlinked && inode->nopen == 1 &&
			inode->nlookup == 0;

		/* An unlinked message nobody can see any more is dropped
		   unfinished, giving its bytes back; others are finished. */
		if (!discard && message_finish(fs, inode, false) < 0)
			dbox_error("%s: message inode %llu could not be "
				   "finished at close", fs->st->path,
				   (unsigned long long)ino);
		save_drop(inode);
	}
	handle_free(h);
	fs_inode_unref(fs, ino, 0, true);
	fs_unlock(fs);
	if (converted) {
		char file[24];

		fs_file_name(file, ino);
		unlinkat(fs->st->files_fd, file, 0);
	}
	fuse_reply_err(req, 0);
}

/* fsync of a message.  Its m.N bytes are fdatasync()ed and its index
   row committed and synced before the reply, in that order (a durable
   index row never points at bytes that are not), but without holding the
   store lock across either sync: the record is sealed under the lock, its
   bytes synced outside it, the row committed under it, and the WAL synced
   by group commit with every other fsync in flight (wal-sync.h).  Only a
   writer's handle keeps the save alive outside the lock; other cases, and
   a write that lands between the steps, sync under the lock. */
static int message_fsync(struct fs *fs, struct fs_handle *h)
{
	struct dbox_index *index = fs->st->index;
	struct fs_inode *inode = h->inode;
	struct dbox_save *save;
	struct dbox_attr attr;
	uint64_t seq, seals, inflight_seq;
	bool resealed;
	int fd, ret;

	fs_lock(fs);
	fs_inode_wait_idle(fs, inode->ino);
	save = inode->save;
	if (save == NULL) {
		/* Committed earlier without sync: its record and the index. */
		struct dbox_msgloc loc;

		ret = dbox_index_msg_get(index, inode->ino, &loc);
		fd = ret < 0 ? ret : dbox_store_read_fd(fs->st, loc.file_id);
		/* The cached descriptor is the store's only under the lock. */
		if (fd >= 0 && (fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0)
			fd = -errno;
		seq = dbox_index_commit_seq(index);
		fs_unlock(fs);
		if (fd < 0)
			return fd;
		ret = fdatasync(fd) < 0 ? -errno : 0;
		close(fd);
		return ret < 0 ? ret : dbox_index_sync_upto(index, seq);
	}
	if (!h->writer) {
		ret = message_finish(fs, inode, true);
		fs_unlock(fs);
		return ret;
	}
	ret = dbox_index_getattr(index, inode->ino, &attr);
	if (ret == 0 && !dbox_save_sealed(save)) {
		/* R as message_finish writes it (the time of a write not
		   stored yet), taken under the lock. */
		time_t received = dbox_time_sec(fs_message_mtime(fs, &attr));

		fs_busy_begin(fs, inode);
		ret = dbox_save_seal(save, received);
		fs_busy_end(fs, inode);
	}
	seals = dbox_save_seals(save);
	if (ret < 0) {
		fs_unlock(fs);
		return ret;
	}
	/* A flush may finish the save meanwhile and a write replace it by
	   a new copy (message_writable): it stays ours until we let go. */
	dbox_save_ref(save);
	inflight_seq = dbox_save_inflight_seq(save);
	fs_unlock(fs);
	/* A copy: its in-flight mark durable before its bytes, so that
	   recovery after a power loss cuts a copy whose commit did not
	   reach the disk instead of keeping it as a message (group commit;
	   at once when synced already). */
	if (inflight_seq != 0)
		ret = dbox_index_sync_upto(index, inflight_seq);
	if (ret == 0)
		ret = dbox_save_sync(save);
	fs_lock(fs);
	/* Before anything else on the inode: a write may be copying into a
	   new save, or writing this one, unlocked.  The save stays ours
	   (our reference) across the wait. */
	fs_inode_wait_idle(fs, inode->ino);
	resealed = !dbox_save_sealed(save) || dbox_save_seals(save) != seals;
	if (inode->save != save) {
		/* Finished by a flush, then replaced by a copy: its record is
		   committed (and copied), and holds every byte written before
		   this fsync; resealed since, it needs another sync. */
		if (ret == 0 && dbox_save_seals(save) != seals)
			ret = dbox_save_sync(save);
		dbox_save_free(&save);
	} else {
		dbox_save_free(&save); /* the inode holds it still */
		/* Written to (and maybe finished by a flush) since the seal:
		   those bytes are not synced yet. */
		if (ret == 0)
			ret = message_finish(fs, inode, resealed);
	}
	seq = dbox_index_commit_seq(index);
	fs_unlock(fs);
	return ret < 0 ? ret : dbox_index_sync_upto(index, seq);
}

void fs_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
	      struct fuse_file_info *fi)
{
	struct fs *fs = req_fs(req);
	struct fs_handle *h = handle_of(fi);
	int ret = 0;

	if (h->kind == DBOX_KIND_FILE) {
		if ((datasync ? fdatasync(h->fd) : fsync(h->fd)) < 0)
			ret = -errno;
		fuse_reply_err(req, -ret);
		return;
	}
	ret = message_fsync(fs, h);
	fuse_reply_err(req, -ret);
}

/* Truncate a message to size bytes. */
static int message_truncate(struct fs *fs, struct fs_inode *inode,
			    uint64_t size)
{
	int ret;

	/* Committed (no save, or one finished at a close or fsync): the
	   truncate goes to a new copy, like any write. */
	ret = message_writable(fs, inode, size);
	if (ret == 0) {
		struct dbox_save *save = inode->save;

		/* Unlocked: a compressed body is turned plain first. */
		fs_busy_begin(fs, inode);
		ret = dbox_save_truncate(save, size);
		fs_busy_end(fs, inode);
	}
	/* Without an open writer the truncate is complete now; with one,
	   at its next close or fsync. */
	if (ret == 0 && inode->nwriters == 0)
		ret = message_finish(fs, inode, false);
	if (inode->nwriters == 0)
		save_drop(inode);
	return ret;
}

/* The received date (R) in the message's record follows its mtime, so
   Dovecot reading the store sees the INTERNALDATE clients set with
   utime().  A record still being written gets R when it is finished.  A
   date whose R value has another width than the one in the record (a
   year past 2106 or before 1970, or back) cannot be patched in place:
   the message gets a new record, as a write would make it.  Returns 0 or
   a negative errno.  Needs the lock. */
static int set_received(struct fs *fs, const struct dbox_attr *attr)
{
	struct fs_inode *inode = fs_inode_get(&fs->inodes, attr->ino);
	struct dbox_msgloc loc;
	int ret;

	if (inode != NULL && inode->save != NULL &&
	    !dbox_save_finished(inode->save)) {
		dbox_save_unseal(inode->save); /* R is written at the finish */
		return 0;
	}
	if (dbox_index_msg_get(fs->st->index, attr->ino, &loc) < 0)
		return 0; /* no record (yet) */
	ret = dbox_store_set_received(fs->st, &loc,
				      dbox_time_sec(attr->mtime_ns));
	if (ret != -ERANGE)
		return ret;
	if ((inode = fs_inode_add(&fs->inodes, attr->ino)) == NULL)
		return -ENOMEM;
	ret = message_truncate(fs, inode, attr->size);
	if (fs_inode_unused(inode))
		fs_inode_remove(&fs->inodes, attr->ino);
	return ret;
}

/* The dbox time a setattr asks for: now, or the given time clamped. */
static int64_t set_time(const struct timespec *ts, bool now, int64_t now_t)
{
	return now ? now_t : fs_ts_time(ts);
}

void fs_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *in,
		int to_set, struct fuse_file_info *fi)
{
	struct fs *fs = req_fs(req);
	struct dbox_index *index = fs->st->index;
	struct dbox_attr attr;
	struct fs_inode *inode;
	struct stat stbuf;
	char name[24];
	int64_t now, old_mtime;
	int ret;

	fs_lock(fs);
	fs_inode_wait_idle(fs, ino);
	now = dbox_now_ns();
	ret = dbox_index_getattr(index, ino, &attr);
	if (ret < 0)
		goto out;
	old_mtime = attr.mtime_ns;
	fs_file_name(name, ino);
	if (to_set & FUSE_SET_ATTR_SIZE) {
		if (attr.kind == DBOX_KIND_DIR) {
			ret = -EISDIR;
		} else if (attr.kind == DBOX_KIND_SYMLINK ||
			   attr.kind == DBOX_KIND_SPECIAL) {
			ret = -EINVAL; /* truncate(2) of a non-regular file */
		} else if (attr.kind == DBOX_KIND_FILE) {
			int fd = fi != NULL && handle_of(fi)->fd >= 0 ?
				dup(handle_of(fi)->fd) : open_backing(fs, ino, 0);

			if (fd < 0)
				ret = fd;
			else if (ftruncate(fd, in->st_size) < 0)
				ret = -errno;
			if (fd >= 0)
				close(fd);
		} else if ((inode = fs_inode_add(&fs->inodes, ino)) == NULL) {
			ret = -ENOMEM;
		} else {
			ret = message_truncate(fs, inode, in->st_size);
			/* Unlinked meanwhile (the copy ran unlocked): the
			   unref deletes it. */
			fs_inode_unref(fs, ino, 0, false);
		}
		if (ret < 0)
			goto out;
		/* message_finish stored the size; read it back.  A
		   truncate changes mtime and ctime, as ext4 does even to
		   the same size (ftruncate, O_TRUNC). */
		if ((ret = dbox_index_getattr(index, ino, &attr)) < 0)
			goto out;
		attr.mtime_ns = now;
	}
	if (attr.kind == DBOX_KIND_FILE &&
	    (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME))) {
		struct timespec times[2] = {
			{ .tv_nsec = UTIME_OMIT }, { .tv_nsec = UTIME_OMIT },
		};

		/* Clamped as for messages, whatever the backing
		   filesystem would do with the time. */
		if (to_set & FUSE_SET_ATTR_ATIME)
			times[0] = to_set & FUSE_SET_ATTR_ATIME_NOW ?
				(struct timespec){ .tv_nsec = UTIME_NOW } :
				fs_time_ts(fs_ts_time(&in->st_atim));
		if (to_set & FUSE_SET_ATTR_MTIME)
			times[1] = to_set & FUSE_SET_ATTR_MTIME_NOW ?
				(struct timespec){ .tv_nsec = UTIME_NOW } :
				fs_time_ts(fs_ts_time(&in->st_mtim));
		if (utimensat(fs->st->files_fd, name, times,
			      AT_SYMLINK_NOFOLLOW) < 0) {
			ret = -errno;
			goto out;
		}
	} else {
		if (to_set & FUSE_SET_ATTR_MTIME)
			attr.mtime_ns = set_time(&in->st_mtim,
						 to_set & FUSE_SET_ATTR_MTIME_NOW, now);
		if (to_set & FUSE_SET_ATTR_ATIME)
			attr.atime_ns = set_time(&in->st_atim,
						 to_set & FUSE_SET_ATTR_ATIME_NOW, now);
	}
	if (to_set & FUSE_SET_ATTR_MODE)
		attr.mode = (attr.mode & S_IFMT) | (in->st_mode & 07777);
	if (to_set & FUSE_SET_ATTR_UID)
		attr.uid = in->st_uid;
	if (to_set & FUSE_SET_ATTR_GID)
		attr.gid = in->st_gid;
	attr.ctime_ns = now;
	/* A write not yet stored (chmod while a writer has it open): its
	   time goes in with this change. */
	inode = attr.kind == DBOX_KIND_MESSAGE ?
		fs_inode_get(&fs->inodes, ino) : NULL;
	if (inode != NULL && inode->written &&
	    !(to_set & (FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_SIZE)))
		attr.mtime_ns = inode->wtime;
	if ((ret = dbox_index_begin(index)) == 0)
		ret = fs_tx_end(fs, dbox_index_setattr(index, &attr), false);
	if (ret == 0 && inode != NULL)
		inode->written = false; /* stored now */
	/* An mtime of the same second leaves R as it is: with -o
	   writeback_cache the kernel sends its own mtime and ctime back
	   after every write and rename (write_inode), most often
	   unchanged. */
	if (ret == 0 && attr.kind == DBOX_KIND_MESSAGE &&
	    ((to_set & FUSE_SET_ATTR_SIZE) ||
	     ((to_set & FUSE_SET_ATTR_MTIME) &&
	      dbox_time_sec(attr.mtime_ns) != dbox_time_sec(old_mtime))) &&
	    (ret = set_received(fs, &attr)) < 0)
		dbox_error("%s: message inode %llu: received date not set to "
			   "its mtime: %s", fs->st->path,
			   (unsigned long long)ino, strerror(-ret));
out:
	if (ret == 0)
		ret = fs_stat(fs, &attr, &stbuf);
	fs_unlock(fs);
	if (ret < 0)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_attr(req, &stbuf, fs->opts.attr_timeout);
}

/* fallocate(2) on a plain file: passed to its backing file (every mode
   the kernel sends: allocate, KEEP_SIZE, PUNCH_HOLE, ZERO_RANGE), as on
   ext4.  A message's bytes are a record in an m.N, so there is nothing
   to reserve: EOPNOTSUPP, after which posix_fallocate(3) writes the
   zeros itself (glibc's fallback), which works on a message as any
   write does. */
void fs_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset,
		  off_t length, struct fuse_file_info *fi)
{
	struct fs_handle *h = handle_of(fi);
	int ret = 0;

	if (h->kind != DBOX_KIND_FILE)
		ret = EOPNOTSUPP;
	else if (fallocate(h->fd, mode, offset, length) < 0)
		ret = errno;
	fuse_reply_err(req, ret);
}

void fs_init(void *userdata, struct fuse_conn_info *conn)
{
	struct fs *fs = userdata;

	/* READDIRPLUS in the kernel's adaptive mode: the first batch of a
	   listing comes with attributes, the rest only while the reader
	   stats the entries it gets (ls -l, NeoMutt).  A reader of names
	   alone (ls -f, scandir) gets plain READDIR, which the kernel caches
	   (cache_readdir) and which makes no inode per entry: always-plus
	   made listing a 1,000,000-message folder 19 s instead of 3 s, and
	   ls -l of 100,000 no faster.  Messages are immutable once
	   committed and every change goes through this daemon, so the page
	   cache may be kept (keep_cache at open). */
	if (conn->capable & FUSE_CAP_READDIRPLUS)
		conn->want |= FUSE_CAP_READDIRPLUS;
	if (conn->capable & FUSE_CAP_READDIRPLUS_AUTO)
		conn->want |= FUSE_CAP_READDIRPLUS_AUTO;
	if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC)
		conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
	/* A symlink's target never changes (symlink(2) makes a new inode):
	   the kernel may keep it in its page cache. */
	if (conn->capable & FUSE_CAP_CACHE_SYMLINKS)
		conn->want |= FUSE_CAP_CACHE_SYMLINKS;
	/* Without it, a GETATTR answered while another process's write is
	   in flight reaches the caller with the new size although the kernel
	   keeps its own (fuse_do_getattr fills the stat from the reply even
	   when it does not take it): fstat() then says more than pread()
	   gives, and a mapping of that size faults (SIGBUS) - Dovecot's
	   readers of dovecot.index.log take no lock.  With it, the kernel
	   reports its own size of a regular file, always in step with its
	   page cache; written data reaches the daemon at writeback, close
	   (FLUSH) and fsync. */
	if (fs->opts.writeback_cache &&
	    (conn->capable & FUSE_CAP_WRITEBACK_CACHE))
		conn->want |= FUSE_CAP_WRITEBACK_CACHE;
}
