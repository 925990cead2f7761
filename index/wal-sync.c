/*
 * wal-sync.c: group commit of index commits by fdatasync of the WAL, or a
 * syncfs of the store's filesystem (see wal-sync.h).
 *
 * Invariants (under ws->mutex):
 *  - synced <= index->commits: commits [1, synced] are durable;
 *  - at most one thread (the leader, syncing = true) runs the sync; it
 *    reads the commit count BEFORE syncing, so every commit it claims
 *    had finished writing its WAL frames when the sync started (and, for
 *    a syncfs, every byte its callers wrote before their commit).
 * The WAL file descriptor is opened on first use (the connection creates
 * the WAL) and reopened when the path names another file (SQLite deletes
 * the WAL only when the last connection closes).
 */
#include "index-private.h"
#include "wal-sync.h"

#include "storage/log.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

uint64_t dbox_index_commit_seq(struct dbox_index *index)
{
	return __atomic_load_n(&index->commits, __ATOMIC_ACQUIRE);
}

/* The WAL's descriptor, (re)opened when needed.  Under ws->mutex. */
static int wal_fd(struct dbox_index *index)
{
	struct index_wal_sync *ws = &index->wal_sync;
	struct stat st;
	char *path;

	if (asprintf(&path, "%s-wal", index->path) < 0)
		return -ENOMEM;
	if (stat(path, &st) < 0) {
		int err = errno;

		dbox_error("index %s-wal: %s", index->path, strerror(err));
		free(path);
		return -EIO;
	}
	if (ws->fd >= 0 && ws->ino == st.st_ino && ws->dev == st.st_dev) {
		free(path);
		return ws->fd;
	}
	if (ws->fd >= 0)
		close(ws->fd);
	ws->fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (ws->fd < 0) {
		dbox_error("index %s: %s", path, strerror(errno));
		free(path);
		return -EIO;
	}
	ws->ino = st.st_ino;
	ws->dev = st.st_dev;
	free(path);
	return ws->fd;
}

int dbox_index_sync_whole_fs(struct dbox_index *index, int fd)
{
	struct index_wal_sync *ws = &index->wal_sync;
	struct stat st;
	int dup_fd;

	assert(ws->fs_fd < 0 && ws->synced == 0);
	if (fstat(fd, &st) < 0)
		return -errno;
	if ((dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0)
		return -errno;
	ws->fs_fd = dup_fd;
	ws->fs_dev = st.st_dev;
	return 0;
}

/* The one sync of a leader: syncfs of the whole filesystem (fs_fd),
   which covers the WAL when it is there (same_fs), else (also) an
   fdatasync of the WAL.  Returns 0 or -EIO (logged). */
static int sync_once(struct dbox_index *index, int wal_fd, int fs_fd,
		     bool same_fs)
{
	if (fs_fd >= 0 && syncfs(fs_fd) < 0) {
		dbox_error("index %s: syncfs: %s", index->path, strerror(errno));
		return -EIO;
	}
	if (same_fs)
		return 0;
	if (fdatasync(wal_fd) < 0) {
		dbox_error("index %s-wal: fdatasync: %s", index->path,
			   strerror(errno));
		return -EIO;
	}
	return 0;
}

int dbox_index_sync_upto(struct dbox_index *index, uint64_t seq)
{
	struct index_wal_sync *ws = &index->wal_sync;
	int ret = 0;

	pthread_mutex_lock(&ws->mutex);
	while (ws->synced < seq && ret == 0) {
		uint64_t target;
		bool same_fs;
		int fd;

		if (ws->syncing) {
			pthread_cond_wait(&ws->cond, &ws->mutex);
			continue;
		}
		/* Lead: claim every commit finished so far. */
		ws->syncing = true;
		target = dbox_index_commit_seq(index);
		fd = wal_fd(index);
		same_fs = ws->fs_fd >= 0 && ws->dev == ws->fs_dev;
		pthread_mutex_unlock(&ws->mutex);
		ret = fd < 0 ? fd : sync_once(index, fd, ws->fs_fd, same_fs);
		pthread_mutex_lock(&ws->mutex);
		ws->syncing = false;
		if (ret == 0 && target > ws->synced)
			ws->synced = target;
		pthread_cond_broadcast(&ws->cond);
	}
	pthread_mutex_unlock(&ws->mutex);
	return ret;
}
