/*
 * wal-sync.c: group commit of index commits by fdatasync of the WAL (see
 * wal-sync.h).
 *
 * Invariants (under ws->mutex):
 *  - synced <= index->commits: commits [1, synced] are durable;
 *  - at most one thread (the leader, syncing = true) runs fdatasync; it
 *    reads the commit count BEFORE syncing, so every commit it claims
 *    had finished writing its WAL frames when the sync started.
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

/* Sync the WAL as the leader: claim every commit finished so far, run one
   fdatasync without the mutex, and wake the waiters.  Called and returns
   with ws->mutex held and no leader running.  Returns 0, or -EIO
   (logged). */
static int lead_sync(struct dbox_index *index)
{
	struct index_wal_sync *ws = &index->wal_sync;
	uint64_t target;
	int fd, ret = 0;

	assert(!ws->syncing);
	ws->syncing = true;
	target = dbox_index_commit_seq(index);
	fd = wal_fd(index);
	pthread_mutex_unlock(&ws->mutex);
	if (fd < 0) {
		ret = fd;
	} else if (fdatasync(fd) < 0) {
		dbox_error("index %s-wal: fdatasync: %s", index->path,
			   strerror(errno));
		ret = -EIO;
	}
	pthread_mutex_lock(&ws->mutex);
	ws->syncing = false;
	if (ret == 0 && target > ws->synced)
		ws->synced = target;
	pthread_cond_broadcast(&ws->cond);
	return ret;
}

int dbox_index_sync_upto(struct dbox_index *index, uint64_t seq)
{
	struct index_wal_sync *ws = &index->wal_sync;
	int ret = 0;

	pthread_mutex_lock(&ws->mutex);
	while (ws->synced < seq && ret == 0) {
		if (ws->syncing)
			pthread_cond_wait(&ws->cond, &ws->mutex);
		else
			ret = lead_sync(index);
	}
	pthread_mutex_unlock(&ws->mutex);
	return ret;
}

int dbox_index_sync_all(struct dbox_index *index)
{
	struct index_checkpointer *ck = &index->ckpt;

	return ck->sync != NULL ? ck->sync(ck->sync_ctx) :
		dbox_index_sync_written(index);
}

bool dbox_index_synced_upto(struct dbox_index *index, uint64_t seq)
{
	struct index_wal_sync *ws = &index->wal_sync;
	bool synced;

	pthread_mutex_lock(&ws->mutex);
	synced = ws->synced >= seq;
	pthread_mutex_unlock(&ws->mutex);
	return synced;
}

int dbox_index_sync_written(struct dbox_index *index)
{
	struct index_wal_sync *ws = &index->wal_sync;
	int ret;

	pthread_mutex_lock(&ws->mutex);
	/* A sync running now may have started before the frames the
	   caller wants synced were written: wait it out, then sync. */
	while (ws->syncing)
		pthread_cond_wait(&ws->cond, &ws->mutex);
	ret = lead_sync(index);
	pthread_mutex_unlock(&ws->mutex);
	return ret;
}
