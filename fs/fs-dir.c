/*
 * fs-dir.c: FUSE operations on names and directories: lookup, forget,
 * getattr, mkdir, rmdir, unlink, rename, link, symlink, readlink,
 * readdir(plus), fsyncdir, statfs.  Each client-visible change is one
 * engine call (engine/namespace.h), one index transaction.
 */
#include "fs.h"
#include "fs-stop.h"

#include "engine/namespace.h"
#include "engine/perm.h"
#include "storage/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

static struct fs *req_fs(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

void fs_lock(struct fs *fs)
{
	dbox_store_wal_throttle(fs->st);
	dbox_store_mutex_lock(fs->st);
}

void fs_unlock(struct fs *fs)
{
	dbox_store_mutex_unlock(fs->st);
}

bool fs_dir_listed(struct fs *fs, uint64_t dir)
{
	struct fs_inode *inode = fs_inode_get(&fs->inodes, dir);

	dbox_store_assert_locked(fs->st);
	return inode != NULL && inode->nlisting > 0;
}

void fs_dir_drop_listing(struct fs *fs, uint64_t dir)
{
	int ret;

	/* -ENOENT: the kernel holds no inode of dir, so no listing. */
	ret = fuse_lowlevel_notify_inval_inode(fs->se, dir, 0, 0);
	if (ret < 0 && ret != -ENOENT &&
	    !__atomic_exchange_n(&fs->no_listing_cache, true,
				 __ATOMIC_RELAXED))
		dbox_warning("the kernel did not drop a cached directory "
			     "listing (%s); listings are not cached from "
			     "now on", strerror(-ret));
}

int fs_tx_end(struct fs *fs, int ret, bool durable)
{
	return dbox_ns_tx_end(fs->st, ret, durable);
}

static void reply_entry_or_err(fuse_req_t req, int ret,
			       const struct fuse_entry_param *e)
{
	if (ret < 0)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_entry(req, e);
}

static void fs_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fs *fs = req_fs(req);
	struct fuse_entry_param e;
	struct dbox_attr attr;
	struct dbox_cred c;
	int ret;

	/* The stop asking whether a path is this very mount (fs-stop.c). */
	if (parent == FUSE_ROOT_ID && fs_stop_is_asking(fs, req, name)) {
		fuse_reply_err(req, FS_STOP_ANSWER);
		return;
	}

	fs_perm_begin(req, &c);
	fs_lock(fs);
	ret = fs_perm_search(fs, &c, parent);
	if (ret == 0)
		ret = dbox_ns_lookup(fs->st, parent, name, &attr);
	if (ret == 0)
		ret = fs_entry(fs, &attr, &e);
	fs_unlock(fs);
	dbox_cred_release(&c);
	reply_entry_or_err(req, ret, &e);
}

static void fs_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	struct fs *fs = req_fs(req);

	fs_lock(fs);
	fs_inode_unref(fs, ino, nlookup, false);
	fs_unlock(fs);
	fuse_reply_none(req);
}

static void fs_forget_multi(fuse_req_t req, size_t count,
			    struct fuse_forget_data *forgets)
{
	struct fs *fs = req_fs(req);

	fs_lock(fs);
	for (size_t i = 0; i < count; i++)
		fs_inode_unref(fs, forgets[i].ino, forgets[i].nlookup, false);
	fs_unlock(fs);
	fuse_reply_none(req);
}

static void fs_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = req_fs(req);
	struct dbox_attr attr;

	fs_lock(fs);
	fs_reply_attr_unlock(req, fs, dbox_ns_getattr(fs->st, ino, &attr), &attr);
}

/* access(2), faccessat(2), chdir(2): the kernel asks only a mount that
   checks permissions itself (fs-perm.c). */
static void fs_access(fuse_req_t req, fuse_ino_t ino, int mask)
{
	struct fs *fs = req_fs(req);
	struct dbox_cred c;
	int ret;

	fs_perm_begin(req, &c);
	fs_lock(fs);
	ret = fs_perm_access(fs, &c, ino, mask);
	fs_unlock(fs);
	dbox_cred_release(&c);
	fuse_reply_err(req, -ret);
}

/* mkdir, symlink and mknod of a special file: create what nw says (its
   gid and mode by the setgid rule) and reply with its entry. */
void fs_create_node(fuse_req_t req, fuse_ino_t parent, const char *name,
		    struct dbox_ns_new *nw)
{
	struct fs *fs = req_fs(req);
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct fuse_entry_param e;
	struct dbox_attr attr;
	struct dbox_cred c;
	bool listed = false;
	int ret;

	nw->uid = ctx->uid;
	nw->gid = ctx->gid;
	fs_perm_begin(req, &c);
	fs_lock(fs);
	ret = fs_perm_create(fs, &c, parent);
	if (ret == 0)
		ret = dbox_ns_create(fs->st, parent, name, nw, &attr);
	if (ret == 0) {
		listed = fs_dir_listed(fs, parent);
		ret = fs_entry(fs, &attr, &e);
	}
	fs_unlock(fs);
	dbox_cred_release(&c);
	if (listed)
		fs_dir_drop_listing(fs, parent);
	reply_entry_or_err(req, ret, &e);
}

static void fs_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name,
		     mode_t mode)
{
	struct dbox_ns_new nw = {
		.kind = DBOX_KIND_DIR,
		.mode = S_IFDIR | (mode & ~fuse_req_ctx(req)->umask & 07777),
	};

	fs_create_node(req, parent, name, &nw);
}

/* unlink and rmdir. */
static void remove_name(fuse_req_t req, fuse_ino_t parent, const char *name,
			bool dir)
{
	struct fs *fs = req_fs(req);
	struct dbox_ns_hooks hooks = fs_ns_hooks(fs);
	struct dbox_ns_gone gone = { 0 };
	struct dbox_cred c;
	bool listed = false;
	int ret;

	fs_perm_begin(req, &c);
	fs_lock(fs);
	ret = fs_perm_delete(fs, &c, parent, name);
	if (ret == 0) {
		ret = dbox_ns_remove(fs->st, parent, name, dir, &hooks, &gone);
		fs_inode_gone(fs, &gone);
	}
	listed = ret == 0 && fs_dir_listed(fs, parent);
	fs_unlock(fs);
	dbox_cred_release(&c);
	if (listed)
		fs_dir_drop_listing(fs, parent);
	fuse_reply_err(req, -ret);
}

static void fs_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	remove_name(req, parent, name, false);
}

static void fs_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	remove_name(req, parent, name, true);
}

/* May plain file ino be turned into a message now: not open, and no
   other thread copying it? */
static bool convertible(struct fs *fs, uint64_t ino)
{
	struct fs_inode *inode = fs_inode_get(&fs->inodes, ino);

	return inode == NULL || (inode->nopen == 0 && !inode->busy);
}

/* What fs_rename's moved callback knows: a plain file (rsync's
   .name.XXXXXX) renamed to a message name in cur/new/tmp becomes a
   message; its bytes are copied into a record first, without the lock
   (fs_file_copy_out), and the rename takes the copy if it still renames
   that file. */
struct rename_ctx {
	struct fs *fs;
	struct dbox_cred *cred;     /* the caller (fs_perm_moved) */
	bool new_parent;            /* moved to another directory */
	struct dbox_save *copied;   /* the copy, of copied_ino */
	uint64_t copied_ino;
	uint64_t want_copy;         /* the moved callback asked for a copy
				       of this inode first */
	uint64_t converted;         /* turned into a message */
	bool tried;                 /* one copy asked for already */
};

static int rename_moved(void *vctx, const struct dbox_attr *moved,
			uint64_t newparent, const char *newname)
{
	struct rename_ctx *rc = vctx;
	struct fs *fs = rc->fs;
	int ret;

	if ((ret = fs_perm_moved(fs, rc->cred, moved, rc->new_parent)) < 0)
		return ret;
	if (moved->kind != DBOX_KIND_FILE || moved->nlink != 1 ||
	    !convertible(fs, moved->ino) ||
	    !fs_is_message_name(fs, newparent, newname))
		return 0;
	if (moved->ino != rc->copied_ino && !rc->tried) {
		rc->want_copy = moved->ino;
		return 1; /* copy unlocked first, then again */
	}
	ret = fs_file_to_message(fs, moved->ino, newparent,
				 moved->ino == rc->copied_ino ? rc->copied : NULL,
				 false);
	if (ret == 0)
		rc->converted = moved->ino;
	return ret;
}

/* Inode attr got a name just now (the commit made last): a plain file's
   fsync syncs the index up to it (fs_inode.name_seq). */
static void note_name_change(struct fs *fs, const struct dbox_attr *attr)
{
	struct fs_inode *inode;

	if (attr->kind == DBOX_KIND_FILE &&
	    (inode = fs_inode_get(&fs->inodes, attr->ino)) != NULL)
		(void)dbox_ns_sync_point(fs->st, &inode->name_seq);
}

/* The held hook of a rename, whose ctx is the rename's. */
static bool rename_held(void *vctx, uint64_t ino)
{
	return fs_inode_held(((struct rename_ctx *)vctx)->fs, ino);
}

static void fs_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
		      fuse_ino_t newparent, const char *newname,
		      unsigned int flags)
{
	struct fs *fs = req_fs(req);
	struct dbox_cred c;
	struct rename_ctx rc = {
		.fs = fs, .cred = &c, .new_parent = parent != newparent,
	};
	struct dbox_ns_hooks hooks = {
		.held = rename_held, .moved = rename_moved, .ctx = &rc,
	};
	struct dbox_ns_gone gone = { 0 };
	struct dbox_attr moved;
	bool listed[2] = { false, false };
	int ret;

	fs_perm_begin(req, &c);
	fs_lock(fs);
	ret = fs_perm_rename(fs, &c, parent, name, newparent, newname, flags);
	while (ret == 0 && (ret = dbox_ns_rename(fs->st, parent, name, newparent, newname,
				     flags, &hooks, &moved, &gone)) == 1) {
		rc.tried = true;
		dbox_save_free(&rc.copied);
		rc.copied_ino = rc.want_copy;
		ret = fs_file_copy_out(fs, rc.want_copy, newparent, &rc.copied);
		if (ret < 0)
			break;
	}
	if (ret == 0)
		note_name_change(fs, &moved);
	/* A plain file renamed over another: its bytes reach the disk
	   before the rename does (store.h). */
	if (ret == 0 && gone.ino != 0 && moved.kind == DBOX_KIND_FILE)
		dbox_store_note_unsynced_file(fs->st, moved.ino);
	fs_inode_gone(fs, &gone);
	dbox_save_free(&rc.copied);
	/* The inode is a message now: its plain file goes once that is
	   durable (a power loss before would bring the plain file back
	   without its bytes), by a WAL sync round, without the lock
	   (freeing a big file's blocks takes a while).  Its number is never
	   reused; recovery removes the file if this never happens. */
	if (ret == 0 && rc.converted != 0)
		dbox_store_doom_file(fs->st, rc.converted);
	if (ret == 0) {
		listed[0] = fs_dir_listed(fs, parent);
		listed[1] = newparent != parent && fs_dir_listed(fs, newparent);
	}
	fs_unlock(fs);
	dbox_cred_release(&c);
	if (listed[0])
		fs_dir_drop_listing(fs, parent);
	if (listed[1])
		fs_dir_drop_listing(fs, newparent);
	fuse_reply_err(req, -ret);
}

static void fs_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent,
		    const char *newname)
{
	struct fs *fs = req_fs(req);
	struct fuse_entry_param e;
	struct dbox_attr attr;
	struct dbox_cred c;
	bool listed = false;
	int ret;

	fs_perm_begin(req, &c);
	fs_lock(fs);
	ret = fs_perm_link(fs, &c, ino, newparent);
	if (ret == 0)
		ret = dbox_ns_link(fs->st, ino, newparent, newname, &attr);
	if (ret == 0) {
		note_name_change(fs, &attr);
		listed = fs_dir_listed(fs, newparent);
		ret = fs_entry(fs, &attr, &e);
	}
	fs_unlock(fs);
	dbox_cred_release(&c);
	if (listed)
		fs_dir_drop_listing(fs, newparent);
	reply_entry_or_err(req, ret, &e);
}

/* A symbolic link is an inode of its own, its target in the index (as
   ext4 stores a short one in the inode): mode 0777, st_size the target's
   length, named in any directory (in cur/new/tmp too, where it is a
   symlink and not a message).  The daemon never follows one; the kernel
   does, with the target it gets from fs_readlink. */
static void fs_symlink(fuse_req_t req, const char *link, fuse_ino_t parent,
		       const char *name)
{
	struct dbox_ns_new nw = {
		.kind = DBOX_KIND_SYMLINK, .mode = S_IFLNK | 0777, .target = link,
	};

	fs_create_node(req, parent, name, &nw);
}

static void fs_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct fs *fs = req_fs(req);
	char *target = NULL;
	int ret;

	fs_lock(fs);
	ret = dbox_ns_readlink(fs->st, ino, &target);
	fs_unlock(fs);
	if (ret < 0)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_readlink(req, target);
	free(target);
}

/* An open directory: the reply buffer of its listing, kept between
   READDIR requests.  The kernel asks for up to 128 KiB or more at a
   time; a fresh malloc() of that much per request is an mmap() and
   page faults each time (a tenth of the time of listing a big folder).
   lock: requests for one handle may come on different threads. */
struct fs_dirhandle {
	pthread_mutex_t lock;
	char *buf;
	size_t size;
	uint64_t listing;  /* the directory whose nlisting it counts
			      (opened with cache_readdir), or 0 */
	struct fs_dirhandle *prev, *next; /* in fs->dirs (st->lock) */
};

/* Link dh into fs->dirs, or unlink it.  Linked, it may fill the
   kernel's listing cache of dir (returns true; counted in the
   directory's nlisting) unless listings are not cached or the
   directory is not in the inode table. */
static bool dirhandle_link(struct fs *fs, struct fs_dirhandle *dh,
			   uint64_t dir)
{
	struct fs_inode *inode;

	fs_lock(fs);
	dh->prev = NULL;
	dh->next = fs->dirs;
	if (fs->dirs != NULL)
		fs->dirs->prev = dh;
	fs->dirs = dh;
	if (!__atomic_load_n(&fs->no_listing_cache, __ATOMIC_RELAXED) &&
	    (inode = fs_inode_get(&fs->inodes, dir)) != NULL) {
		inode->nlisting++;
		dh->listing = dir;
	}
	fs_unlock(fs);
	return dh->listing != 0;
}

static void dirhandle_unlink(struct fs *fs, struct fs_dirhandle *dh)
{
	struct fs_inode *inode;

	fs_lock(fs);
	if (dh->prev != NULL)
		dh->prev->next = dh->next;
	else
		fs->dirs = dh->next;
	if (dh->next != NULL)
		dh->next->prev = dh->prev;
	if (dh->listing != 0 &&
	    (inode = fs_inode_get(&fs->inodes, dh->listing)) != NULL) {
		inode->nlisting--;
		fs_inode_unref(fs, dh->listing, 0, false);
	}
	fs_unlock(fs);
}

static void dirhandle_free(struct fs_dirhandle *dh)
{
	pthread_mutex_destroy(&dh->lock);
	free(dh->buf);
	free(dh);
}

void fs_dirhandles_free(struct fs *fs)
{
	while (fs->dirs != NULL) {
		struct fs_dirhandle *dh = fs->dirs;

		fs->dirs = dh->next;
		dirhandle_free(dh);
	}
}

static struct fs_dirhandle *dirhandle_of(struct fuse_file_info *fi)
{
	return (struct fs_dirhandle *)(uintptr_t)fi->fh;
}

static void fs_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = req_fs(req);
	struct fs_dirhandle *dh = NULL;
	struct dbox_attr attr;
	struct dbox_cred c;
	int ret;

	fs_perm_begin(req, &c);
	fs_lock(fs);
	ret = dbox_ns_getattr(fs->st, ino, &attr);
	/* Reading it needs r (O_WRONLY is the kernel's EISDIR). */
	if (ret == 0 && attr.kind == DBOX_KIND_DIR && fs->own_checks)
		ret = dbox_perm_may(&c, &attr, DBOX_MAY_READ);
	/* Listing a directory reads it: its atime moves by relatime (at
	   the open, as the listing itself may come from the kernel's
	   cache). */
	if (ret == 0 && attr.kind == DBOX_KIND_DIR &&
	    !(fi->flags & O_NOATIME) &&
	    fs_atime_due(fs, &attr, dbox_now_ns()) &&
	    fs_atime_touch(fs, ino) < 0)
		dbox_warning("%s: directory inode %llu: atime not stored",
			     fs->st->path, (unsigned long long)ino);
	fs_unlock(fs);
	dbox_cred_release(&c);
	if (ret == 0 && attr.kind != DBOX_KIND_DIR)
		ret = -ENOTDIR;
	if (ret == 0 && (dh = calloc(1, sizeof(*dh))) == NULL)
		ret = -ENOMEM;
	if (ret < 0) {
		fuse_reply_err(req, -ret);
		return;
	}
	pthread_mutex_init(&dh->lock, NULL);
	fi->fh = (uintptr_t)dh;
	/* The kernel may keep listings (cache_readdir): every change to a
	   directory goes through this mount.  The kernel checks that its
	   cached listing is current (iversion, mtime) only for a read from
	   offset 0: a listing that began while another process filled the
	   cache goes on from it once filled, and a fill begun before a
	   rename lists the old name, after the rename returned and before
	   this opendir (helper-70; test_concurrency.py).  So while a handle
	   that may fill the cache is open (nlisting), each change drops
	   the cached pages before its reply (fs_dir_drop_listing): the
	   change holds the directory's lock, which a fill holds shared
	   across each READDIR and its caching, so a fill begun before it
	   is left with a missing page, and the kernel then reads the
	   daemon's listing instead.  With no such handle open, nothing
	   fills the cache, and the kernel's own check at offset 0 finds a
	   cached listing stale; a handle opened during a change reads
	   after it (the directory's lock). */
	if (dirhandle_link(fs, dh, ino)) {
		fi->cache_readdir = 1;
		fi->keep_cache = 1;
	}
	if (fuse_reply_open(req, fi) != 0) {
		/* The open was interrupted: no RELEASEDIR will come. */
		dirhandle_unlink(fs, dh);
		dirhandle_free(dh);
	}
}

/* Readdir offsets: 1 after ".", 2 after "..", entry.id + 2 after an entry. */
#define DIRENT_OFF(cookie) ((off_t)(cookie) + 2)

struct readdir_ctx {
	fuse_req_t req;
	struct fs *fs;
	bool plus;
	bool names_only;  /* plus, for a caller without search permission */
	char *buf;
	size_t size, pos;
};

/* Add one entry; returns 1 when the buffer is full. */
static int add_entry(struct readdir_ctx *ctx, const char *name,
		     const struct dbox_attr *attr, off_t next_off, bool counted)
{
	size_t room = ctx->size - ctx->pos, len;
	struct fuse_entry_param e;
	int ret;

	if (!ctx->plus) {
		struct stat stbuf = {
			.st_ino = attr->ino,
			.st_mode = attr->mode,
		};
		len = fuse_add_direntry(ctx->req, ctx->buf + ctx->pos, room,
					name, &stbuf, next_off);
		if (len > room)
			return 1;
		ctx->pos += len;
		return 0;
	}
	memset(&e, 0, sizeof(e));
	if ((ret = fs_stat(ctx->fs, attr, &e.attr)) < 0)
		return ret;
	/* names_only: node ID 0, so the kernel lists the name and makes no
	   dentry (fuse_direntplus_link) nor takes a reference; a later walk
	   through the name still comes to LOOKUP, where search permission
	   is checked (fs-perm.c).  Entries it made walked into a directory
	   its owner had chmod'ed 600 after one ls (helper-91 F2). */
	if (!ctx->names_only) {
		e.ino = attr->ino;
		e.attr_timeout = ctx->fs->opts.attr_timeout;
		e.entry_timeout = ctx->fs->opts.entry_timeout;
	}
	len = fuse_add_direntry_plus(ctx->req, ctx->buf + ctx->pos, room,
				     name, &e, next_off);
	if (len > room)
		return 1;
	ctx->pos += len;
	if (counted && !ctx->names_only) {
		/* The kernel now holds a reference, as after a lookup. */
		struct fs_inode *inode = fs_inode_add(&ctx->fs->inodes, attr->ino);

		if (inode == NULL)
			return -ENOMEM;
		inode->nlookup++;
		inode->kind = attr->kind;
	}
	return 0;
}

/* Can a directory entry have this name?  The kernel fails the whole
   listing (EIO) on a name that is empty, too long, holds '/' or NUL, or
   is "." or "..": one such row of a damaged index hid every message of
   its folder (helper-61). */
static bool listable_name(const char *name, size_t len)
{
	return len > 0 && len <= DBOX_NAME_MAX &&
	       memchr(name, '/', len) == NULL && memchr(name, '\0', len) == NULL &&
	       !(len == 1 && name[0] == '.') &&
	       !(len == 2 && name[0] == '.' && name[1] == '.');
}

static int readdir_cb(void *vctx, const struct dbox_dirent *ent)
{
	static bool said; /* atomic: once per daemon, not per listing */
	char name[DBOX_NAME_MAX + 1];

	if (!listable_name(ent->name, ent->namelen)) {
		if (!__atomic_exchange_n(&said, true, __ATOMIC_RELAXED))
			dbox_error("the index has names no directory can hold "
				   "(empty, '/', too long); listings leave them "
				   "out ('dboxadm check' names them, 'dboxadm "
				   "rebuild' gives them new names)");
		return 0;
	}
	memcpy(name, ent->name, ent->namelen);
	name[ent->namelen] = '\0';
	return add_entry(vctx, name, &ent->attr, DIRENT_OFF(ent->cookie), true);
}

static void do_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi, bool plus)
{
	struct fs *fs = req_fs(req);
	struct fs_dirhandle *dh = dirhandle_of(fi);
	struct readdir_ctx ctx = {
		.req = req, .fs = fs, .plus = plus, .size = size,
	};
	struct dbox_attr self, parent;
	struct dbox_cred c;
	int ret = 0;

	pthread_mutex_lock(&dh->lock);
	if (dh->size < size) {
		char *buf = realloc(dh->buf, size);

		if (buf == NULL) {
			pthread_mutex_unlock(&dh->lock);
			fuse_reply_err(req, ENOMEM);
			return;
		}
		dh->buf = buf;
		dh->size = size;
	}
	ctx.buf = dh->buf;
	fs_perm_begin(req, &c);
	fs_lock(fs);
	ctx.names_only = plus && fs_perm_search(fs, &c, ino) < 0;
	if (off < 2) {
		ret = dbox_ns_dir_self(fs->st, ino, &self, &parent);
		if (ret == 0 && off < 1)
			ret = add_entry(&ctx, ".", &self, 1, false);
		if (ret == 0)
			ret = add_entry(&ctx, "..", &parent, 2, false);
	}
	if (ret == 0)
		ret = dbox_ns_readdir(fs->st, ino,
					 off < 2 ? 0 : (uint64_t)off - 2,
					 readdir_cb, &ctx);
	fs_unlock(fs);
	dbox_cred_release(&c);
	if (ret < 0 && ctx.pos == 0)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_buf(req, ctx.buf, ctx.pos);
	pthread_mutex_unlock(&dh->lock);
}

static void fs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, false);
}

static void fs_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size,
			   off_t off, struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, true);
}

static void fs_releasedir(fuse_req_t req, fuse_ino_t ino,
			  struct fuse_file_info *fi)
{
	struct fs_dirhandle *dh = dirhandle_of(fi);

	/* The reply of the last READDIR may have let the client close the
	   directory before that request's thread let go of the handle:
	   wait for it. */
	pthread_mutex_lock(&dh->lock);
	pthread_mutex_unlock(&dh->lock);
	dirhandle_unlink(req_fs(req), dh);
	dirhandle_free(dh);
	fuse_reply_err(req, 0);
}

static void fs_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync,
			struct fuse_file_info *fi)
{
	struct fs *fs = req_fs(req);
	uint64_t seq;
	int ret;

	/* Every index change made so far, synced by group commit; a
	   deferred flag rename whose commit failed now is undone, and the
	   fsyncdir says so (helper-84). */
	fs_lock(fs);
	ret = dbox_ns_sync_point(fs->st, &seq);
	fs_unlock(fs);
	if (ret == 0)
		ret = dbox_ns_sync_upto(fs->st, seq);
	fuse_reply_err(req, -ret);
}

static void fs_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct fs *fs = req_fs(req);
	struct statvfs sv;

	if (fstatvfs(fs->st->dir_fd, &sv) < 0)
		fuse_reply_err(req, errno);
	else
		fuse_reply_statfs(req, &sv);
}

/* fs-xattr.c */
void fs_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
		 const char *value, size_t size, int flags);
void fs_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
		 size_t size);
void fs_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size);
void fs_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name);

/* fs-file.c */
void fs_create(fuse_req_t req, fuse_ino_t parent, const char *name,
	       mode_t mode, struct fuse_file_info *fi);
void fs_mknod(fuse_req_t req, fuse_ino_t parent, const char *name,
	      mode_t mode, dev_t rdev);
void fs_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
	     struct fuse_file_info *fi);
void fs_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size,
	      off_t off, struct fuse_file_info *fi);
void fs_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
	      struct fuse_file_info *fi);
void fs_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
		int to_set, struct fuse_file_info *fi);
void fs_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset,
		  off_t length, struct fuse_file_info *fi);
void fs_init(void *userdata, struct fuse_conn_info *conn);

const struct fuse_lowlevel_ops fs_ops = {
	.init = fs_init,
	.lookup = fs_lookup,
	.forget = fs_forget,
	.forget_multi = fs_forget_multi,
	.getattr = fs_getattr,
	.access = fs_access,
	.setattr = fs_setattr,
	.mknod = fs_mknod,
	.mkdir = fs_mkdir,
	.unlink = fs_unlink,
	.rmdir = fs_rmdir,
	.rename = fs_rename,
	.link = fs_link,
	.symlink = fs_symlink,
	.readlink = fs_readlink,
	.setxattr = fs_setxattr,
	.getxattr = fs_getxattr,
	.listxattr = fs_listxattr,
	.removexattr = fs_removexattr,
	.open = fs_open,
	.read = fs_read,
	.write = fs_write,
	.flush = fs_flush,
	.release = fs_release,
	.fsync = fs_fsync,
	.opendir = fs_opendir,
	.readdir = fs_readdir,
	.readdirplus = fs_readdirplus,
	.releasedir = fs_releasedir,
	.fsyncdir = fs_fsyncdir,
	.statfs = fs_statfs,
	.create = fs_create,
	.fallocate = fs_fallocate,
};
