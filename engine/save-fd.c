/*
 * save-fd.c: an open file descriptor into a message record or a plain
 * file's backing file (save-fd.h).  The one copy loop both the mount and
 * dboxadm import use.
 */
#include "engine/save-fd.h"
#include "engine/store-dirs.h"
#include "storage/io.h"
#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Bytes per read(2): large enough that a message is a few calls, small
   enough to stay off the stack of a FUSE worker thread. */
#define SAVE_FD_CHUNK (256 * 1024)

/* Where copy_loop puts each chunk read: buf[0..len) at byte off of the
   copy.  Returns 0 or a negative errno. */
typedef int sink_t(void *ctx, const char *buf, size_t len, uint64_t off);

/* Read fd from its offset to its end (retrying EINTR) into sink, asking
   stop (may be NULL) between chunks.  Returns the byte count or a
   negative errno (the read's or the sink's, -EINTR when stopped). */
static int64_t copy_loop(int fd, sink_t *sink, void *ctx,
			 const struct dbox_copy_stop *stop)
{
	char *buf = malloc(SAVE_FD_CHUNK);
	uint64_t off = 0;
	ssize_t n;
	int ret = 0;

	if (buf == NULL)
		return -ENOMEM;
	while (ret == 0 && (n = read(fd, buf, SAVE_FD_CHUNK)) != 0) {
		if (n < 0) {
			if (errno != EINTR)
				ret = -errno;
			continue;
		}
		if ((ret = sink(ctx, buf, (size_t)n, off)) == 0)
			off += (uint64_t)n;
		if (ret == 0 && stop != NULL && stop->stop != NULL &&
		    stop->stop(stop->ctx))
			ret = -EINTR;
	}
	free(buf);
	return ret < 0 ? ret : (int64_t)off;
}

static int save_sink(void *ctx, const char *buf, size_t len, uint64_t off)
{
	return dbox_save_write(ctx, buf, len, off);
}

int64_t dbox_save_copy_fd(struct dbox_save *save, int fd)
{
	return copy_loop(fd, save_sink, save, NULL);
}

int64_t dbox_save_from_fd(struct dbox_store *st, uint64_t ino,
			  const char *mailbox, int fd, time_t received,
			  const struct dbox_copy_stop *stop,
			  struct dbox_msgloc *loc_r)
{
	struct dbox_save *save = NULL;
	int64_t size;
	int ret;

	/* No WRITING row: the index learns of the record at its finish,
	   so a failed copy leaves no row to take back. */
	if ((ret = dbox_save_begin_unindexed(st, ino, mailbox, &save)) < 0)
		return ret;
	size = copy_loop(fd, save_sink, save, stop);
	if (size >= 0 &&
	    (ret = dbox_save_finish(save, received, false, loc_r)) < 0)
		size = ret;
	dbox_save_free(&save); /* unfinished: its bytes are cut off */
	return size;
}

int dbox_store_file_create(struct dbox_store *st, uint64_t ino, bool append)
{
	char name[24];
	int fd;

	dbox_files_name(name, ino);
	fd = openat(st->files_fd, name, O_WRONLY | O_CREAT | O_TRUNC |
		    O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC |
		    (append ? O_APPEND : 0), 0600);
	if (fd < 0)
		return -errno;
	/* The umask may have taken bits off; the mode is 0600 whatever. */
	if (fchmod(fd, 0600) < 0) {
		int err = errno;

		close(fd);
		return -err;
	}
	return fd;
}

/* Append buf[0..len) to the file ctx points at (an int descriptor).
   Returns 0 or a negative errno. */
static int fd_sink(void *ctx, const char *buf, size_t len, uint64_t off)
{
	int fd = *(int *)ctx;
	ssize_t w;

	for (size_t done = 0; done < len; done += (size_t)w) {
		if ((w = write(fd, buf + done, len - done)) < 0) {
			if (errno != EINTR)
				return -errno;
			w = 0;
		}
	}
	return 0;
}

int64_t dbox_store_file_from_fd(struct dbox_store *st, uint64_t ino, int fd,
				const struct timespec times[2],
				const struct dbox_copy_stop *stop)
{
	int out = dbox_store_file_create(st, ino, false);
	int64_t size;

	if (out < 0)
		return out;
	size = copy_loop(fd, fd_sink, &out, stop);
	if (size >= 0 && futimens(out, times) < 0)
		size = -errno;
	close(out);
	if (size < 0)
		dbox_store_file_remove(st, ino);
	return size;
}

int dbox_store_file_remove(struct dbox_store *st, uint64_t ino)
{
	char name[24];

	dbox_files_name(name, ino);
	if (unlinkat(st->files_fd, name, 0) < 0 && errno != ENOENT)
		return -errno;
	return 0;
}

int dbox_store_file_open(struct dbox_store *st, uint64_t ino, int flags,
			 struct stat *stat_r)
{
	int access = st->readonly ? O_RDONLY : O_RDWR;
	char name[24];
	int fd, err;

	dbox_files_name(name, ino);
	/* O_NOFOLLOW: files/ holds files by inode number, never a symlink
	   out of the store (ELOOP -> EIO). */
	fd = openat(st->files_fd, name, flags | O_NOFOLLOW | O_NONBLOCK |
		    O_CLOEXEC | access, 0600);
	if (fd < 0 && errno == EPERM && (flags & O_NOATIME)) {
		/* O_NOATIME needs the file's owner (or CAP_FOWNER). */
		fd = openat(st->files_fd, name, (flags & ~O_NOATIME) |
			    O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | access,
			    0600);
	}
	if (fd >= 0 && (fd = dbox_fd_regular(fd, stat_r)) == -EIO) {
		dbox_error("%s/" DBOX_STORE_FILES "/%s: not a regular file", st->path,
			   name);
		return -EIO;
	}
	if (fd >= 0)
		return fd;
	err = errno;
	dbox_error("%s/" DBOX_STORE_FILES "/%s: %s", st->path, name,
		   strerror(err));
	return err == ENOSPC || err == EDQUOT || err == EMFILE ||
		err == ENFILE ? -err : -EIO;
}

int dbox_store_file_open_ro(struct dbox_store *st, uint64_t ino,
			    struct stat *stat_r)
{
	char name[24];
	int fd;

	dbox_files_name(name, ino);
	if ((fd = openat(st->files_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
			 O_CLOEXEC)) < 0)
		return -errno;
	return dbox_fd_regular(fd, stat_r);
}
