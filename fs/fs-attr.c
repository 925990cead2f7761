/*
 * fs-attr.c: attributes, entries and the life of inodes as the kernel sees
 * them (lookup counts, deletion of unlinked inodes), shared by the
 * directory and file operations.
 */
#include "engine/store-dirs.h"
#include "engine/store-layout.h"
#include "engine/save-fd.h"
#include "fs.h"
#include "fs-purge.h"

#include "storage/log.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct timespec fs_time_ts(int64_t t)
{
	int64_t sec, nsec;

	dbox_time_split(t, &sec, &nsec);
	return (struct timespec){ .tv_sec = sec, .tv_nsec = nsec };
}

int64_t fs_ts_time(const struct timespec *ts)
{
	return dbox_time_make(ts->tv_sec, ts->tv_nsec);
}

int64_t fs_message_mtime(struct fs *fs, const struct dbox_attr *attr)
{
	struct fs_inode *inode = fs_inode_get(&fs->inodes, attr->ino);

	return inode != NULL && inode->written ? inode->wtime : attr->mtime_ns;
}

/* Linux's relatime_need_update(), ext4's default. */
static bool relatime_due(int64_t atime, int64_t mtime, int64_t ctime,
			 int64_t now)
{
	return dbox_time_cmp(mtime, atime) >= 0 ||
		dbox_time_cmp(ctime, atime) >= 0 ||
		dbox_time_sec(now) - dbox_time_sec(atime) >= 24 * 3600;
}

bool fs_atime_due(struct fs *fs, const struct dbox_attr *attr, int64_t now)
{
	int64_t mtime = attr->kind == DBOX_KIND_MESSAGE ?
		fs_message_mtime(fs, attr) : attr->mtime_ns;

	/* A read-only mount stores no atime (as ext4 mounted ro). */
	return !fs->opts.noatime && !fs->opts.readonly &&
		relatime_due(attr->atime_ns, mtime, attr->ctime_ns, now);
}

bool fs_backing_atime_due(struct fs *fs, const struct stat *st)
{
	return !fs->opts.noatime && !fs->opts.readonly &&
		relatime_due(fs_ts_time(&st->st_atim), fs_ts_time(&st->st_mtim),
			     fs_ts_time(&st->st_ctim), dbox_now_ns());
}

int fs_atime_touch(struct fs *fs, uint64_t ino)
{
	int64_t now = dbox_now_ns();
	struct dbox_attr attr;
	int ret;

	/* The lock is held from the look to the change: nothing else
	   writes the index meanwhile. */
	if ((ret = dbox_ns_getattr(fs->st, ino, &attr)) < 0 ||
	    !fs_atime_due(fs, &attr, now))
		return ret;
	return dbox_ns_touch_atime(fs->st, ino, now);
}

/* In a store another user owns (root mounted it, fs/owner.h), every
   mode, owner and device number is that user's to write: the mount
   (nosuid, nodev) gives them no power, but root copying the tree (cp -a,
   rsync -a, tar) would make them real files - a root-owned setuid shell
   the user wrote into the index (helper-83), or a device node of root's
   disk the user may read.  So only what ext4 would let that user make
   is served: setuid on their own files, setgid on their group's, and a
   device node as root's with no permission bits. */
static void others_store_claims(const struct fs *fs, struct stat *stbuf)
{
	if (!fs->others_store)
		return;
	if (stbuf->st_uid != fs->store_uid)
		stbuf->st_mode &= ~S_ISUID;
	if (!S_ISDIR(stbuf->st_mode) && stbuf->st_gid != fs->store_gid)
		stbuf->st_mode &= ~S_ISGID;
	if (S_ISCHR(stbuf->st_mode) || S_ISBLK(stbuf->st_mode)) {
		stbuf->st_mode &= S_IFMT;
		stbuf->st_uid = 0;
		stbuf->st_gid = 0;
	}
}

int fs_stat(struct fs *fs, const struct dbox_attr *attr, struct stat *stbuf)
{
	struct fs_inode *inode;
	char name[24];

	memset(stbuf, 0, sizeof(*stbuf));
	stbuf->st_ino = attr->ino;
	stbuf->st_mode = attr->mode;
	stbuf->st_nlink = attr->nlink;
	stbuf->st_uid = attr->uid;
	stbuf->st_gid = attr->gid;
	stbuf->st_blksize = 4096;
	stbuf->st_size = attr->size;
	stbuf->st_mtim = fs_time_ts(attr->mtime_ns);
	stbuf->st_atim = fs_time_ts(attr->atime_ns);
	stbuf->st_ctim = fs_time_ts(attr->ctime_ns);
	/* 512-byte units of what the inode's data takes in the store. */
	stbuf->st_blocks = (attr->size + 511) / 512;

	switch (attr->kind) {
	case DBOX_KIND_DIR:
		stbuf->st_size = 4096;
		stbuf->st_blocks = 8;
		break;
	case DBOX_KIND_MESSAGE:
		inode = fs_inode_get(&fs->inodes, attr->ino);
		if (inode != NULL && inode->save != NULL) {
			/* Busy: the save is not to be read; its size from
			   before the unlocked work. */
			stbuf->st_size = inode->busy ? inode->busy_size :
				dbox_save_size(inode->save);
			stbuf->st_blocks = (stbuf->st_size + 511) / 512;
		} else if (attr->stored >= attr->size) {
			/* The record as it lies in its m.N: header, body,
			   metadata; rounded up, so a stored-plain message
			   never looks sparse (st_blocks * 512 < st_size) to
			   cp, tar or rsync. */
			stbuf->st_blocks = (attr->stored + 511) / 512;
		} else if (attr->stored > 0) {
			/* Compressed (-o compress): the body as stored.
			   Records are packed back to back, so rounding each
			   to the nearest unit (not up) keeps du's sum over a
			   folder equal to the bytes the m.N files hold, where
			   rounding up would add 256 bytes per message; a
			   record never counts as 0. */
			stbuf->st_blocks = (attr->stored + 256) / 512;
			if (stbuf->st_blocks == 0)
				stbuf->st_blocks = 1;
		}
		/* A write not stored yet: its time, but a later ctime (a
		   link or rename since) stays (helper-78). */
		if (inode != NULL && inode->written) {
			stbuf->st_mtim = fs_time_ts(inode->wtime);
			stbuf->st_ctim = fs_time_ts(inode->wtime > attr->ctime_ns ?
						    inode->wtime : attr->ctime_ns);
		}
		break;
	case DBOX_KIND_SYMLINK:
		break; /* st_size: the target's length, as ext4 */
	case DBOX_KIND_SPECIAL:
		stbuf->st_rdev = attr->rdev;
		break;
	case DBOX_KIND_FILE: {
		struct stat backing;

		dbox_files_name(name, attr->ino);
		/* Never through a symlink planted in files/. */
		if (fstatat(fs->st->files_fd, name, &backing,
			    AT_SYMLINK_NOFOLLOW) < 0) {
			dbox_error("%s/" DBOX_STORE_FILES "/%s: %s", fs->st->path, name,
				   strerror(errno));
			return -EIO;
		}
		if (!S_ISREG(backing.st_mode)) {
			/* Never followed or opened: planted in files/. */
			dbox_error("%s/" DBOX_STORE_FILES "/%s: not a regular file "
				   "(%s)", fs->st->path, name,
				   S_ISLNK(backing.st_mode) ? "a symbolic link" :
				   S_ISFIFO(backing.st_mode) ? "a FIFO" :
				   S_ISDIR(backing.st_mode) ? "a directory" :
				   "a special file");
			return -EIO;
		}
		stbuf->st_size = backing.st_size;
		stbuf->st_blocks = backing.st_blocks;
		stbuf->st_atim = backing.st_atim;
		stbuf->st_mtim = backing.st_mtim;
		/* A write changes the backing file's ctime, a rename or
		   link the index's: the later one. */
		if (dbox_time_cmp(fs_ts_time(&backing.st_ctim),
				  attr->ctime_ns) > 0)
			stbuf->st_ctim = backing.st_ctim;
		break;
	}
	}
	others_store_claims(fs, stbuf);
	return 0;
}

void fs_reply_attr_unlock(fuse_req_t req, struct fs *fs, int ret,
			  const struct dbox_attr *attr)
{
	struct stat stbuf;

	if (ret == 0)
		ret = fs_stat(fs, attr, &stbuf);
	fs_unlock(fs);
	fs_reply_attr(req, fs, ret, &stbuf);
}

int fs_entry(struct fs *fs, const struct dbox_attr *attr,
	     struct fuse_entry_param *e)
{
	struct fs_inode *inode;
	int ret;

	memset(e, 0, sizeof(*e));
	if ((ret = fs_stat(fs, attr, &e->attr)) < 0)
		return ret;
	if ((inode = fs_inode_add(&fs->inodes, attr->ino)) == NULL)
		return -ENOMEM;
	inode->nlookup++;
	inode->kind = attr->kind;
	e->ino = attr->ino;
	e->attr_timeout = fs->opts.attr_timeout;
	e->entry_timeout = fs->opts.entry_timeout;
	return 0;
}

bool fs_inode_held(void *ctx, uint64_t ino)
{
	struct fs *fs = ctx;
	struct fs_inode *inode = fs_inode_get(&fs->inodes, ino);

	if (inode == NULL || fs_inode_unused(inode))
		return false;
	inode->unlinked = true;
	return true;
}

struct dbox_ns_hooks fs_ns_hooks(struct fs *fs)
{
	return (struct dbox_ns_hooks){ .held = fs_inode_held, .ctx = fs };
}

void fs_inode_gone(struct fs *fs, const struct dbox_ns_gone *gone)
{
	if (gone->garbage_file_id != 0)
		fs_purge_note(fs, gone->garbage_file_id); /* its record */
}

void fs_inode_unref(struct fs *fs, uint64_t ino, uint64_t nlookup,
		    bool close)
{
	struct fs_inode *inode = fs_inode_get(&fs->inodes, ino);

	if (inode == NULL)
		return;
	inode->nlookup = nlookup > inode->nlookup ? 0 : inode->nlookup - nlookup;
	if (close)
		inode->nopen--;
	if (!fs_inode_unused(inode))
		return;
	if (inode->unlinked) {
		/* The last holder of an unlinked inode went away. */
		struct dbox_ns_gone gone;

		if (dbox_ns_delete_orphan(fs->st, ino, &gone) == 0)
			fs_inode_gone(fs, &gone);
	}
	fs_inode_remove(&fs->inodes, ino);
}

bool fs_is_message_name(struct fs *fs, uint64_t parent, const char *name)
{
	return dbox_ns_is_message_name(fs->st, parent, name);
}

struct fs_inode *fs_inode_wait_idle(struct fs *fs, uint64_t ino)
{
	struct fs_inode *inode;

	while ((inode = fs_inode_get(&fs->inodes, ino)) != NULL && inode->busy)
		dbox_store_mutex_wait(fs->st, &fs->idle);
	return inode;
}

void fs_busy_begin(struct fs *fs, struct fs_inode *inode)
{
	/* Lock order (fs.h): busy only from idle, one holder. */
	assert(!inode->busy);
	inode->busy = true;
	inode->busy_size = inode->save != NULL ? dbox_save_size(inode->save) : 0;
	fs_unlock(fs);
}

void fs_busy_end(struct fs *fs, struct fs_inode *inode)
{
	fs_lock(fs);
	assert(inode->busy);
	inode->busy = false;
	pthread_cond_broadcast(&fs->idle);
}

int fs_file_copy_out(struct fs *fs, uint64_t ino, uint64_t parent,
		     struct dbox_save **save_r)
{
	struct dbox_store *st = fs->st;
	struct dbox_save *save = NULL;
	struct fs_inode *inode;
	struct stat backing;
	char *mailbox = NULL;
	uint64_t mark_seq;
	int64_t n;
	int fd, ret;

	*save_r = NULL;
	if ((fd = dbox_store_file_open_ro(st, ino, &backing)) < 0)
		return fd;
	/* No WRITING row names the copy: its in-flight mark is committed
	   and synced before its first byte, so recovery cuts it, not keeps
	   it as a message the index lost. */
	if ((ret = dbox_msg_dir_mailbox(st, parent, &mailbox)) < 0 ||
	    (ret = dbox_save_begin_copy(st, ino, mailbox, &save)) < 0)
		goto out;
	if ((inode = fs_inode_add(&fs->inodes, ino)) == NULL) {
		ret = -ENOMEM;
		goto out;
	}
	mark_seq = dbox_save_inflight_seq(save);
	fs_busy_begin(fs, inode);
	/* The mark on disk before the copy's first byte, as for a
	   message's copy (fs-write.c, start_write). */
	n = dbox_ns_sync_upto(st, mark_seq);
	if (n == 0)
		n = dbox_save_copy_fd(save, fd);
	ret = n < 0 ? (int)n :
		dbox_save_seal(save, dbox_time_sec(fs_ts_time(&backing.st_mtim)),
			       NULL, NULL);
	fs_busy_end(fs, inode);
	if (fs_inode_unused(inode))
		fs_inode_remove(&fs->inodes, ino);
out:
	if (ret < 0)
		dbox_save_free(&save);
	close(fd);
	free(mailbox);
	*save_r = save;
	return ret;
}

int fs_file_to_message(struct fs *fs, uint64_t ino, uint64_t parent,
		       struct dbox_save *copied, bool own_tx)
{
	struct fs_inode *inode = fs_inode_get(&fs->inodes, ino);

	if (inode != NULL)
		inode->kind = 0; /* known again at the next lookup */
	return own_tx ? dbox_msg_from_file(fs->st, ino, parent, copied) :
		dbox_msg_from_file_in_tx(fs->st, ino, parent, copied);
}
