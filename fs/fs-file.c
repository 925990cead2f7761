/*
 * fs-file.c: FUSE operations on open files: create, mknod, open, read,
 * write, flush, release, fsync, setattr.
 *
 * A message is written straight into an m.N record owned by its inode's
 * save (inode->save, shared by every handle open for writing).  The record
 * is finished - metadata written, index row COMMITTED - at flush (close)
 * and fsync; a write after that reopens it.  A write to a committed
 * message starts a new save with a copy of its bytes (copy-on-write): the
 * index keeps the old record until the copy is finished, and the old
 * record becomes garbage for purge then.
 *
 * Plain files are pread/pwrite on STORE/files/<ino>.
 */
#include "fs.h"
#include "fs-purge.h"

#include "storage/dbox-read.h"
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
	fd = openat(fs->st->files_fd, name, flags | O_RDWR | O_NOFOLLOW |
		    O_CLOEXEC, 0600);
	if (fd < 0) {
		int err = errno;

		dbox_error("%s/files/%s: %s", fs->st->path, name, strerror(err));
		return err == ENOSPC || err == EMFILE || err == ENFILE ?
			-err : -EIO;
	}
	return fd;
}

/* Start writing ino's message: a new save, holding a copy of the first
   copy_bytes bytes of the committed message.  In the caller's
   transaction. */
static int message_begin_write(struct fs *fs, struct fs_inode *inode,
			       uint64_t copy_bytes)
{
	struct dbox_store *st = fs->st;
	struct dbox_reader *reader = NULL;
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
	    dbox_index_mailbox_name(st->index, parent, &mailbox) < 0)
		mailbox = NULL;
	if (copy_bytes > attr.size)
		copy_bytes = attr.size;
	if (copy_bytes > 0 &&
	    (ret = dbox_store_open_reader(st, &loc, attr.size, &reader)) < 0)
		goto out;
	if ((ret = dbox_save_begin(st, inode->ino,
				   mailbox != NULL ? mailbox : "INBOX",
				   &inode->save)) < 0)
		goto out;
	/* Until the copy is finished, the index keeps the old record: a
	   crash in between leaves the message as it was (recovery cuts the
	   unfinished copy), instead of dropping it with all its names. */
	if (loc.state == DBOX_MSG_COMMITTED &&
	    (ret = dbox_index_msg_set(st->index, inode->ino, &loc)) < 0) {
		dbox_save_free(&inode->save);
		goto out;
	}
	while (off < copy_bytes) {
		size_t want = copy_bytes - off < sizeof(buf) ?
			copy_bytes - off : sizeof(buf);
		ssize_t n = dbox_reader_pread(reader, buf, want, off);

		if (n <= 0) {
			ret = n < 0 ? -errno : -EIO;
			break;
		}
		if ((ret = dbox_save_write(inode->save, buf, n, off)) < 0)
			break;
		off += n;
	}
	if (ret < 0) {
		dbox_save_free(&inode->save);
	} else {
		__atomic_add_fetch(&inode->gen, 1, __ATOMIC_RELEASE);
		fs_purge_note(fs, loc.file_id); /* the old record is garbage */
	}
out:
	dbox_reader_free(&reader);
	free(mailbox);
	return ret;
}

/* message_begin_write in a transaction of its own. */
static int start_write(struct fs *fs, struct fs_inode *inode,
		       uint64_t copy_bytes)
{
	int ret;

	if ((ret = dbox_index_begin(fs->st->index)) < 0)
		return ret;
	ret = fs_tx_end(fs, message_begin_write(fs, inode, copy_bytes), false);
	if (ret < 0)
		dbox_save_free(&inode->save);
	return ret;
}

/* Finish the message being written: record on disk, index COMMITTED with
   its size.  sync: data and index on disk before returning.  Opens and
   commits its own transaction. */
static int message_finish(struct fs *fs, struct fs_inode *inode, bool sync)
{
	struct dbox_index *index = fs->st->index;
	struct dbox_attr attr;
	struct dbox_msgloc loc;
	int ret;

	if (inode->save->finished && !sync)
		return 0;
	if ((ret = dbox_index_begin(index)) < 0)
		return ret;
	ret = dbox_index_getattr(index, inode->ino, &attr);
	if (ret == 0)
		ret = dbox_save_finish(inode->save, attr.mtime_ns / 1000000000,
				       sync, &loc);
	if (ret == 0 && attr.size != dbox_save_size(inode->save)) {
		attr.size = dbox_save_size(inode->save);
		ret = dbox_index_setattr(index, &attr);
	}
	return fs_tx_end(fs, ret, sync);
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
	enum dbox_kind kind;
	int fd = -1, ret;

	*h_r = NULL;
	if ((ret = dbox_index_begin(st->index)) < 0)
		return ret;
	kind = fs_is_message_name(fs, parent, name) ? DBOX_KIND_MESSAGE :
		DBOX_KIND_FILE;
	ret = dbox_index_create(st->index, parent, name, strlen(name), kind,
				S_IFREG | (mode & ~ctx->umask & 07777),
				ctx->uid, ctx->gid, dbox_now_ns(), attr_r);
	if (ret < 0)
		return fs_tx_end(fs, ret, false);
	if ((inode = fs_inode_add(&fs->inodes, attr_r->ino)) == NULL) {
		ret = -ENOMEM;
	} else if (kind == DBOX_KIND_MESSAGE) {
		ret = dbox_index_mailbox_name(st->index, parent, &mailbox);
		if (ret == 0)
			ret = dbox_save_begin(st, attr_r->ino, mailbox, &inode->save);
		free(mailbox);
		if (ret == 0 && !open) {
			ret = dbox_save_finish(inode->save,
					       attr_r->mtime_ns / 1000000000,
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

void fs_mknod(fuse_req_t req, fuse_ino_t parent, const char *name,
	      mode_t mode, dev_t rdev)
{
	struct fs *fs = req_fs(req);
	struct fuse_entry_param e;
	struct dbox_attr attr;
	struct fs_handle *h;
	int ret;

	if (!S_ISREG(mode)) {
		fuse_reply_err(req, EPERM);
		return;
	}
	fs_lock(fs);
	ret = create_file(fs, req, parent, name, mode, false, &attr, &h);
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
			ret = inode->save == NULL ? start_write(fs, inode, 0) :
				dbox_save_truncate(inode->save, 0);
			if (ret < 0)
				return ret;
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
	   from the lookup, sparing an index query per open. */
	inode = fs_inode_get(&fs->inodes, ino);
	if (inode != NULL && inode->kind != 0) {
		kind = inode->kind;
	} else {
		ret = dbox_index_getattr(fs->st->index, ino, &attr);
		kind = ret == 0 ? attr.kind : DBOX_KIND_FILE;
	}
	if (ret == 0 && kind == DBOX_KIND_DIR)
		ret = -EISDIR;
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
		} else {
			h->fd = ret = open_backing(fs, ino, 0);
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
	fi->keep_cache = 1;
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
			if (h->inode->save != NULL) {
				n = dbox_save_read(h->inode->save, buf, size, off);
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
		ret = pwrite(h->fd, buf, size, off);
		if (ret < 0)
			ret = -errno;
	} else if (!h->writer) {
		ret = -EBADF;
	} else {
		fs_lock(fs);
		ret = 0;
		if (inode->save == NULL) {
			/* First write to a committed message: a new copy. */
			ret = start_write(fs, inode, UINT64_MAX);
		} else if (inode->save->finished) {
			/* Committed at a flush or fsync: WRITING again. */
			ret = dbox_index_begin(fs->st->index);
			if (ret == 0)
				ret = fs_tx_end(fs, dbox_save_reopen(inode->save),
						false);
		}
		if (ret == 0)
			ret = dbox_save_write(inode->save, buf, size, off);
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
		if (h->inode->save != NULL)
			ret = message_finish(fs, h->inode, false);
		fs_unlock(fs);
	}
	fuse_reply_err(req, -ret);
}

/* A plain file renamed to a message name while open (rename converts only
   closed files) becomes a message at its last close, as rename would have
   made it.  Needs the lock. */
static void file_closed(struct fs *fs, uint64_t ino)
{
	struct dbox_index *index = fs->st->index;
	struct dbox_attr attr;
	uint64_t parent;
	char *name = NULL, file[24];
	int ret;

	if (dbox_index_getattr(index, ino, &attr) < 0 ||
	    attr.kind != DBOX_KIND_FILE || attr.nlink != 1 ||
	    dbox_index_parent(index, ino, &parent) < 0 ||
	    dbox_index_name_of(index, ino, &name) < 0)
		return;
	if (fs_is_message_name(fs, parent, name) &&
	    dbox_index_begin(index) == 0) {
		ret = fs_tx_end(fs, fs_file_to_message(fs, ino, parent), false);
		fs_file_name(file, ino);
		if (ret == 0)
			unlinkat(fs->st->files_fd, file, 0);
		else
			dbox_error("%s/files/%s: not turned into a message: %s",
				   fs->st->path, file, strerror(-ret));
	}
	free(name);
}

void fs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = req_fs(req);
	struct fs_handle *h = handle_of(fi);
	struct fs_inode *inode = h->inode;

	fs_lock(fs);
	if (h->kind == DBOX_KIND_FILE && inode->nopen == 1)
		file_closed(fs, ino);
	if (h->writer && --inode->nwriters == 0 && inode->save != NULL) {
		bool discard = inode->unlinked && inode->nopen == 1 &&
			inode->nlookup == 0;

		/* An unlinked message nobody can see any more is dropped
		   unfinished, giving its bytes back; others are finished. */
		if (!discard && message_finish(fs, inode, false) < 0)
			dbox_error("%s: message inode %llu could not be "
				   "finished at close", fs->st->path,
				   (unsigned long long)ino);
		dbox_save_free(&inode->save);
	}
	handle_free(h);
	fs_inode_unref(fs, ino, 0, true);
	fs_unlock(fs);
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
	uint64_t seq, seals;
	int fd, ret;

	fs_lock(fs);
	save = inode->save;
	if (save == NULL) {
		/* Committed earlier without sync: its record and the index. */
		struct dbox_msgloc loc;

		ret = dbox_index_msg_get(index, inode->ino, &loc);
		fd = ret < 0 ? ret : dbox_store_read_fd(fs->st, loc.file_id);
		seq = dbox_index_commit_seq(index);
		fs_unlock(fs);
		if (fd < 0)
			return fd;
		if (fdatasync(fd) < 0)
			return -errno;
		return dbox_index_sync_upto(index, seq);
	}
	if (!h->writer) {
		ret = message_finish(fs, inode, true);
		fs_unlock(fs);
		return ret;
	}
	ret = dbox_index_getattr(index, inode->ino, &attr);
	if (ret == 0)
		ret = dbox_save_seal(save, attr.mtime_ns / 1000000000);
	fd = save->mf->fd;
	seals = save->seals;
	fs_unlock(fs);
	if (ret < 0)
		return ret;
	if (fdatasync(fd) < 0) {
		ret = -errno;
		dbox_error("%s/storage/m.%u: fdatasync: %s", fs->st->path,
			   save->mf->file_id, strerror(errno));
		return ret;
	}
	fs_lock(fs);
	/* Written to (and maybe finished by a flush) since the seal: those
	   bytes are not synced yet. */
	ret = message_finish(fs, inode, !save->sealed || save->seals != seals);
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
	int ret = 0;

	if (inode->save == NULL)
		ret = start_write(fs, inode, size);
	if (ret == 0)
		ret = dbox_save_truncate(inode->save, size);
	/* Without an open writer the truncate is complete now. */
	if (ret == 0 && (inode->nwriters == 0 || inode->save->finished))
		ret = message_finish(fs, inode, false);
	if (inode->nwriters == 0)
		dbox_save_free(&inode->save);
	return ret;
}

/* The received date (R) in the message's record follows its mtime, so
   Dovecot reading the store sees the INTERNALDATE clients set with
   utime().  A record still being written gets R when it is finished. */
static void set_received(struct fs *fs, const struct dbox_attr *attr)
{
	struct fs_inode *inode = fs_inode_get(&fs->inodes, attr->ino);
	struct dbox_msgloc loc;

	if (inode != NULL && inode->save != NULL && !inode->save->finished) {
		inode->save->sealed = false; /* R is written at the finish */
		return;
	}
	if (dbox_index_msg_get(fs->st->index, attr->ino, &loc) == 0)
		dbox_store_set_received(fs->st, &loc, attr->mtime_ns / 1000000000);
}

static int ts_ns(const struct timespec *ts, int64_t *ns_r)
{
	if (ts->tv_nsec == UTIME_NOW)
		*ns_r = dbox_now_ns();
	else if (ts->tv_nsec != UTIME_OMIT)
		*ns_r = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec;
	return 0;
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
	int ret;

	fs_lock(fs);
	ret = dbox_index_getattr(index, ino, &attr);
	if (ret < 0)
		goto out;
	fs_file_name(name, ino);
	if (to_set & FUSE_SET_ATTR_SIZE) {
		if (attr.kind == DBOX_KIND_DIR) {
			ret = -EISDIR;
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
			if (fs_inode_unused(inode))
				fs_inode_remove(&fs->inodes, ino);
		}
		if (ret < 0)
			goto out;
		/* message_finish stored the size; read it back. */
		if ((ret = dbox_index_getattr(index, ino, &attr)) < 0)
			goto out;
	}
	if (attr.kind == DBOX_KIND_FILE &&
	    (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME))) {
		struct timespec times[2] = {
			{ .tv_nsec = UTIME_OMIT }, { .tv_nsec = UTIME_OMIT },
		};

		if (to_set & FUSE_SET_ATTR_ATIME)
			times[0] = to_set & FUSE_SET_ATTR_ATIME_NOW ?
				(struct timespec){ .tv_nsec = UTIME_NOW } : in->st_atim;
		if (to_set & FUSE_SET_ATTR_MTIME)
			times[1] = to_set & FUSE_SET_ATTR_MTIME_NOW ?
				(struct timespec){ .tv_nsec = UTIME_NOW } : in->st_mtim;
		if (utimensat(fs->st->files_fd, name, times,
			      AT_SYMLINK_NOFOLLOW) < 0) {
			ret = -errno;
			goto out;
		}
	} else if (to_set & FUSE_SET_ATTR_MTIME) {
		if (to_set & FUSE_SET_ATTR_MTIME_NOW)
			attr.mtime_ns = dbox_now_ns();
		else
			ts_ns(&in->st_mtim, &attr.mtime_ns);
	}
	if (to_set & FUSE_SET_ATTR_MODE)
		attr.mode = (attr.mode & S_IFMT) | (in->st_mode & 07777);
	if (to_set & FUSE_SET_ATTR_UID)
		attr.uid = in->st_uid;
	if (to_set & FUSE_SET_ATTR_GID)
		attr.gid = in->st_gid;
	attr.ctime_ns = dbox_now_ns();
	if ((ret = dbox_index_begin(index)) == 0)
		ret = fs_tx_end(fs, dbox_index_setattr(index, &attr), false);
	if (ret == 0 && attr.kind == DBOX_KIND_MESSAGE &&
	    (to_set & FUSE_SET_ATTR_MTIME))
		set_received(fs, &attr);
out:
	if (ret == 0)
		ret = fs_stat(fs, &attr, &stbuf);
	fs_unlock(fs);
	if (ret < 0)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_attr(req, &stbuf, fs->opts.attr_timeout);
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
