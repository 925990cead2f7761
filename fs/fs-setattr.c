/*
 * fs-setattr.c: the FUSE setattr operation (and fs_reply_attr, its
 * answer, which getattr can share): size (truncate), times,
 * mode and owner, in one index transaction; a message's received date
 * (dbox R) follows its mtime.
 */
#include "engine/perm.h"
#include "engine/save-fd.h"
#include "fs-file.h"
#include "engine/store-dirs.h"

#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
	int ret;

	if (inode != NULL && inode->save != NULL &&
	    !dbox_save_finished(inode->save)) {
		dbox_save_unseal(inode->save); /* R is written at the finish */
		return 0;
	}
	ret = dbox_msg_set_received(fs->st, attr->ino,
				    dbox_time_sec(attr->mtime_ns));
	if (ret != -ERANGE)
		return ret;
	if ((inode = fs_inode_add(&fs->inodes, attr->ino)) == NULL)
		return -ENOMEM;
	/* Finished now, also while a writer has it open: a utime() right
	   after a close() may come before that close's RELEASE, and the
	   index named the record with the old R until it came (a
	   sanitizer run of test_utime_whole_range_like_ext4). */
	ret = fs_message_redate(fs, inode, attr->size);
	if (fs_inode_unused(inode))
		fs_inode_remove(&fs->inodes, attr->ino);
	return ret;
}

/* The dbox time a setattr asks for: now, or the given time clamped. */
static int64_t set_time(const struct timespec *ts, bool now, int64_t now_t)
{
	return now ? now_t : fs_ts_time(ts);
}

/* Set mtime to t: in set, and in attr (what the checks below read). */
static void set_mtime(struct dbox_ns_set *set, struct dbox_attr *attr,
		      int64_t t)
{
	set->what |= DBOX_NS_SET_MTIME;
	set->mtime_ns = attr->mtime_ns = t;
}

/* chmod (to mode: permission bits) and chown's part of a setattr. */
static void set_owner(struct dbox_ns_set *set, const struct stat *in,
		      int to_set, uint32_t mode)
{
	if (to_set & FUSE_SET_ATTR_MODE) {
		set->what |= DBOX_NS_SET_MODE;
		set->mode = mode;
	}
	if (to_set & FUSE_SET_ATTR_UID) {
		set->what |= DBOX_NS_SET_UID;
		set->uid = in->st_uid;
	}
	if (to_set & FUSE_SET_ATTR_GID) {
		set->what |= DBOX_NS_SET_GID;
		set->gid = in->st_gid;
	}
}

void fs_reply_attr(fuse_req_t req, struct fs *fs, int ret,
		   const struct stat *stbuf)
{
	if (ret < 0)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_attr(req, stbuf, fs->opts.attr_timeout);
}

/* truncate(2) of the inode attr to size bytes (a plain file's backing
   file through the handle fi when it has one).  Needs the lock and the
   inode idle.  Returns 0 or a negative errno. */
static int set_size(struct fs *fs, const struct dbox_attr *attr,
		    uint64_t size, struct fuse_file_info *fi)
{
	struct fs_inode *inode;
	int fd, ret = 0;

	if (attr->kind == DBOX_KIND_DIR)
		return -EISDIR;
	if (attr->kind == DBOX_KIND_SYMLINK || attr->kind == DBOX_KIND_SPECIAL)
		return -EINVAL; /* truncate(2) of a non-regular file */
	if (attr->kind == DBOX_KIND_FILE) {
		fd = fi != NULL && fs_handle_of(fi)->fd >= 0 ?
			dup(fs_handle_of(fi)->fd) :
			dbox_store_file_open(fs->st, attr->ino, 0, NULL);
		if (fd < 0)
			return fd == -1 ? -errno : fd;
		if (ftruncate(fd, size) < 0)
			ret = -errno;
		close(fd);
		return ret;
	}
	if ((inode = fs_inode_add(&fs->inodes, attr->ino)) == NULL)
		return -ENOMEM;
	ret = fs_message_truncate(fs, inode, size);
	/* Unlinked meanwhile (the copy ran unlocked): the unref deletes
	   it. */
	fs_inode_unref(fs, attr->ino, 0, false);
	return ret;
}

void fs_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *in,
		int to_set, struct fuse_file_info *fi)
{
	struct fs *fs = fs_from_req(req);
	struct dbox_ns_set set = { .what = DBOX_NS_SET_CTIME };
	struct dbox_attr attr;
	struct fs_inode *inode;
	struct stat stbuf;
	struct dbox_cred c;
	struct dbox_attr before;
	struct fs_walkcut_job *cut = NULL;
	char name[24];
	int64_t now, old_mtime;
	uint32_t mode = in->st_mode & 07777;
	int ret;

	fs_perm_begin(req, &c);
	fs_lock(fs);
	fs_inode_wait_idle(fs, ino);
	now = dbox_now_ns();
	ret = dbox_ns_getattr(fs->st, ino, &attr);
	if (ret == 0)
		ret = fs_perm_setattr(fs, &c, &attr, in, to_set, fi != NULL,
				      &mode);
	if (ret < 0)
		goto out;
	before = attr;
	old_mtime = attr.mtime_ns;
	dbox_files_name(name, ino);
	if (to_set & FUSE_SET_ATTR_SIZE) {
		if ((ret = set_size(fs, &attr, in->st_size, fi)) < 0)
			goto out;
		/* message_finish stored the size; read it back.  A
		   truncate changes mtime and ctime, as ext4 does even to
		   the same size (ftruncate, O_TRUNC). */
		if ((ret = dbox_ns_getattr(fs->st, ino, &attr)) < 0)
			goto out;
		set_mtime(&set, &attr, now);
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
			set_mtime(&set, &attr, set_time(&in->st_mtim,
				  to_set & FUSE_SET_ATTR_MTIME_NOW, now));
		if (to_set & FUSE_SET_ATTR_ATIME) {
			set.what |= DBOX_NS_SET_ATIME;
			set.atime_ns = set_time(&in->st_atim,
						to_set & FUSE_SET_ATTR_ATIME_NOW, now);
		}
	}
	set_owner(&set, in, to_set, mode);
	set.ctime_ns = now;
	/* A write not yet stored (chmod while a writer has it open): its
	   time goes in with this change. */
	inode = attr.kind == DBOX_KIND_MESSAGE ?
		fs_inode_get(&fs->inodes, ino) : NULL;
	if (inode != NULL && inode->written &&
	    !(to_set & (FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_SIZE)))
		set_mtime(&set, &attr, inode->wtime);
	ret = dbox_ns_setattr(fs->st, ino, &set, &attr);
	if (ret == 0 && (to_set & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID |
				   FUSE_SET_ATTR_GID)) &&
	    fs_walkcut_collect(fs, &c, &before, &attr, &cut) < 0)
		dbox_warning("%s: directory inode %llu: its cached names "
			     "could not be listed to be dropped", fs->st->path,
			     (unsigned long long)ino);
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
	dbox_cred_release(&c);
	fs_reply_attr(req, fs, ret, &stbuf);
	fs_walkcut_queue(fs, cut);
}

