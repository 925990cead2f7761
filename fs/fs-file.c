/*
 * fs-file.c: FUSE operations on open files, the opening side: create,
 * mknod, open, read, fallocate, and init (the capabilities wanted).
 * Writing a message (write, truncate, flush, release, fsync) is
 * fs-write.c; setattr fs-setattr.c.
 *
 * Plain files are pread/pwrite on STORE/files/<ino>; a message is read
 * through a reader of its committed record, or from its save while it is
 * being written.
 */
#include "engine/store-dirs.h"
#include "engine/store-layout.h"
#include "engine/perm.h"
#include "engine/save-fd.h"
#include "fs-file.h"

#include "storage/dbox-read.h"
#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A new handle of inode, in fs->handles.  Needs the lock. */
static struct fs_handle *handle_new(struct fs *fs, enum dbox_kind kind,
				    struct fs_inode *inode)
{
	struct fs_handle *h = calloc(1, sizeof(*h));

	if (h == NULL)
		return NULL;
	h->kind = kind;
	h->inode = inode;
	h->fd = -1;
	pthread_mutex_init(&h->read_lock, NULL);
	inode->nopen++;
	h->next = fs->handles;
	if (h->next != NULL)
		h->next->prev = h;
	fs->handles = h;
	return h;
}

void fs_handle_free(struct fs *fs, struct fs_handle *h)
{
	if (h->prev != NULL)
		h->prev->next = h->next;
	else
		fs->handles = h->next;
	if (h->next != NULL)
		h->next->prev = h->prev;
	if (h->fd >= 0)
		close(h->fd);
	dbox_reader_free(&h->reader);
	pthread_mutex_destroy(&h->read_lock);
	free(h);
}

void fs_handles_free(struct fs *fs)
{
	while (fs->handles != NULL)
		fs_handle_free(fs, fs->handles);
}

/* The owner of a new inode: the caller's uid and gid (the engine
   applies the parent's setgid rule), and mode's permission bits less
   the caller's umask. */
static struct dbox_ns_new new_inode(fuse_req_t req, enum dbox_kind kind,
				    mode_t mode)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);

	return (struct dbox_ns_new){
		.kind = kind,
		.mode = (mode & S_IFMT) | (mode & ~ctx->umask & 07777),
		.uid = ctx->uid, .gid = ctx->gid,
	};
}

/* Create a regular file (dbox_msg_create: a message in cur/new/tmp, else
   a plain file), with its handle *h_r when open.  Needs the lock. */
static int create_file(struct fs *fs, fuse_req_t req, fuse_ino_t parent,
		       const char *name, mode_t mode, bool open,
		       struct dbox_attr *attr_r, struct fs_handle **h_r)
{
	struct dbox_ns_new nw = new_inode(req, DBOX_KIND_FILE, S_IFREG | mode);
	struct dbox_save *save;
	struct fs_inode *inode;
	struct dbox_ns_gone gone;
	int fd, ret;

	*h_r = NULL;
	if ((ret = dbox_msg_create(fs->st, parent, name, &nw, open, &save,
				   &fd, attr_r)) < 0)
		return ret;
	if ((inode = fs_inode_add(&fs->inodes, attr_r->ino)) != NULL) {
		inode->save = save;
		save = NULL;
		if (attr_r->kind == DBOX_KIND_FILE)
			(void)dbox_ns_sync_point(fs->st,
						 &inode->name_seq);
	}
	if (inode != NULL && open &&
	    (*h_r = handle_new(fs, attr_r->kind, inode)) != NULL) {
		(*h_r)->fd = fd;
		fd = -1;
		if (attr_r->kind == DBOX_KIND_MESSAGE) {
			(*h_r)->writer = true;
			inode->nwriters++;
		}
	}
	if (inode != NULL && (!open || *h_r != NULL))
		return 0;
	/* Out of memory: the new file goes again, as if never made. */
	if (fd >= 0)
		close(fd);
	dbox_save_free(&save);
	if (inode != NULL) {
		dbox_save_free(&inode->save);
		if (fs_inode_unused(inode))
			fs_inode_remove(&fs->inodes, attr_r->ino);
	}
	(void)dbox_ns_remove(fs->st, parent, name, false, NULL, &gone);
	return -ENOMEM;
}

/* A fifo, socket (bind() of a unix socket), character or block device:
   an inode with mode and rdev only, anywhere (in cur/new/tmp too, where
   it is not a message); the kernel serves its I/O and never sends an
   OPEN for it.  CAP_MKNOD for devices is checked by the kernel. */
static int create_special(struct fs *fs, fuse_req_t req, fuse_ino_t parent,
			  const char *name, mode_t mode, dev_t rdev,
			  struct dbox_attr *attr_r)
{
	struct dbox_ns_new nw = new_inode(req, DBOX_KIND_SPECIAL, mode);

	if (S_ISCHR(mode) || S_ISBLK(mode))
		nw.rdev = rdev;
	return dbox_ns_create(fs->st, parent, name, &nw, attr_r);
}

/* Create name in parent under the lock: a regular file (create_file,
   opened when open) or a fifo, socket or device (create_special), and
   its entry for the reply in *e.  Returns 0 or a negative errno. */
static int make_node(struct fs *fs, fuse_req_t req, fuse_ino_t parent,
		     const char *name, mode_t mode, dev_t rdev, bool open,
		     struct fuse_entry_param *e, struct fs_handle **h_r)
{
	struct dbox_attr attr;
	struct dbox_cred c;
	bool listed = false;
	int ret;

	*h_r = NULL;
	fs_perm_begin(req, &c);
	fs_lock(fs);
	/* mknod(2)'s EINVAL for an unknown type comes first. */
	if (!S_ISREG(mode) && !S_ISFIFO(mode) && !S_ISSOCK(mode) &&
	    !S_ISCHR(mode) && !S_ISBLK(mode))
		ret = -EINVAL;
	else
		ret = fs_perm_create(fs, &c, parent);
	if (ret == 0 && S_ISREG(mode))
		ret = create_file(fs, req, parent, name, mode, open, &attr, h_r);
	else if (ret == 0)
		ret = create_special(fs, req, parent, name, mode, rdev, &attr);
	if (ret == 0) {
		listed = fs_dir_listed(fs, parent);
		ret = fs_entry(fs, &attr, e);
	}
	fs_unlock(fs);
	dbox_cred_release(&c);
	/* Before the reply (which the caller makes). */
	if (listed)
		fs_dir_drop_listing(fs, parent);
	return ret;
}

void fs_create(fuse_req_t req, fuse_ino_t parent, const char *name,
	       mode_t mode, struct fuse_file_info *fi)
{
	struct fuse_entry_param e;
	struct fs_handle *h;
	int ret = make_node(fs_from_req(req), req, parent, name,
			    S_IFREG | (mode & ~S_IFMT), 0, true, &e, &h);

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
	struct fuse_entry_param e;
	struct fs_handle *h;
	int ret = make_node(fs_from_req(req), req, parent, name, mode, rdev,
			    false, &e, &h);

	if (ret < 0)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_entry(req, &e);
}

static int open_message(struct fs *fs, struct fs_inode *inode, int flags,
			struct fs_handle *h)
{
	int ret;

	if ((flags & O_TRUNC) && (flags & O_ACCMODE) == O_RDONLY) {
		/* Linux truncates at O_TRUNC whatever the access mode (ext4
		   does for O_RDONLY too): complete now, as a truncate(), and
		   with its mtime and ctime (helper-78: they stayed). */
		fs_message_written(inode);
		if ((ret = fs_message_truncate(fs, inode, 0)) < 0)
			return ret;
	}
	if ((flags & O_ACCMODE) != O_RDONLY) {
		/* The copy (copy-on-write) is made at the first write, so an
		   open for writing that writes nothing costs nothing. */
		if (flags & O_TRUNC) {
			ret = fs_message_writable(fs, inode, 0);
			if (ret == 0)
				ret = dbox_save_truncate(inode->save, 0);
			if (ret < 0)
				return ret;
			fs_message_written(inode);
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

/* open(O_TRUNC) by a caller without CAP_FSETID (here: not root) drops
   the file's set-user-ID bit, and its set-group-ID bit when group
   execute is set or the caller is not in the file's group, as ext4's
   truncate does (setattr_should_drop_suidgid, Linux 6.x): the kernel
   leaves that to the daemon when it sends O_TRUNC with the OPEN
   (FUSE_CAP_ATOMIC_O_TRUNC), and the bits stayed (helper-79 F5).  A
   failure is logged; the open stands.  Needs the lock. */
static void truncate_drops_privs(struct fs *fs, struct dbox_cred *c,
				 uint64_t ino)
{
	struct dbox_ns_set set = { .what = DBOX_NS_SET_MODE };
	struct dbox_attr attr;
	int ret;

	if (c->privileged || dbox_ns_getattr(fs->st, ino, &attr) < 0 ||
	    !(attr.mode & (S_ISUID | S_ISGID)))
		return;
	set.mode = attr.mode & 07777 & ~S_ISUID;
	if ((set.mode & S_ISGID) &&
	    ((set.mode & S_IXGRP) || !dbox_perm_in_group(c, attr.gid)))
		set.mode &= ~S_ISGID;
	if (set.mode != (attr.mode & 07777) &&
	    (ret = dbox_ns_setattr(fs->st, ino, &set, NULL)) < 0)
		dbox_error("inode %llu: dropping set-user-ID and set-group-ID "
			   "at a truncating open: %s", (unsigned long long)ino,
			   strerror(-ret));
}

void fs_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_from_req(req);
	struct fs_inode *inode;
	struct dbox_attr attr;
	struct fs_handle *h = NULL;
	struct stat backing;
	struct dbox_cred c;
	enum dbox_kind kind;
	int ret = 0;

	fs_perm_begin(req, &c);
	fs_lock(fs);
	/* The kernel opens what it looked up: the kind is usually known
	   from the lookup, sparing an index query per open.  A message
	   being finished or copied, or a plain file being turned into one,
	   is opened once that is done. */
	inode = fs_inode_wait_idle(fs, ino);
	if (inode != NULL && inode->kind != 0) {
		kind = inode->kind;
	} else {
		ret = dbox_ns_getattr(fs->st, ino, &attr);
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
	if (ret == 0)
		ret = fs_perm_open(fs, &c, ino, fi->flags);
	if (ret == 0 && (inode = fs_inode_add(&fs->inodes, ino)) == NULL)
		ret = -ENOMEM;
	if (ret == 0) {
		inode->kind = kind;
		if ((h = handle_new(fs, kind, inode)) == NULL)
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
			    dbox_ns_getattr(fs->st, ino, &attr) == 0)
				h->atime_due = fs_atime_due(fs, &attr,
							    dbox_now_ns());
		} else {
			/* The backing file's atime is the file's: reads
			   move it by the backing mount's rule, or not at
			   all with -o noatime or O_NOATIME. */
			h->fd = ret = dbox_store_file_open(fs->st, ino,
						   fs->opts.noatime ||
						   (fi->flags & O_NOATIME) ?
						   O_NOATIME : 0, &backing);
			/* A read that moves atime must reach the backing
			   file: no cached pages then (as for messages). */
			if (ret >= 0 && (fi->flags & O_ACCMODE) != O_WRONLY &&
			    !(fi->flags & O_NOATIME))
				h->atime_due = fs_backing_atime_due(fs,
								    &backing);
			if (ret >= 0 && (fi->flags & O_TRUNC) &&
			    ftruncate(h->fd, 0) < 0)
				ret = -errno;
			ret = ret < 0 ? ret : 0;
		}
		if (ret < 0) {
			fs_handle_free(fs, h);
			fs_inode_unref(fs, ino, 0, true);
		} else if (fi->flags & O_TRUNC) {
			truncate_drops_privs(fs, &c, ino);
		}
	}
	fs_unlock(fs);
	dbox_cred_release(&c);
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
	struct fs *fs = fs_from_req(req);
	struct fs_handle *h = fs_handle_of(fi);
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
				n = dbox_corrupt_as_eio((int)n);
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
				dbox_reader_free(&h->reader);
				h->reader_gen = h->inode->gen;
				n = dbox_msg_open_reader(fs->st, ino, &h->reader);
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

/* fallocate(2) on a plain file: passed to its backing file (every mode
   the kernel sends: allocate, KEEP_SIZE, PUNCH_HOLE, ZERO_RANGE), as on
   ext4.  A message's bytes are a record in an m.N, so there is nothing
   to reserve: EOPNOTSUPP, after which posix_fallocate(3) writes the
   zeros itself (glibc's fallback), which works on a message as any
   write does. */
void fs_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset,
		  off_t length, struct fuse_file_info *fi)
{
	struct fs_handle *h = fs_handle_of(fi);
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

