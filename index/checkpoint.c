/*
 * checkpoint.c: the WAL checkpointer thread (see checkpoint.h).
 *
 * The main connection's WAL hook (run inside each commit, under the store
 * lock) records the WAL size and wakes the thread; the thread never
 * touches the main connection, only its own.  Invariant: while the
 * checkpointer runs, index->ckpt.db is its connection and the WAL hook of
 * the main connection is wal_hook(); after stop, the default
 * auto-checkpoint hook is back.
 */
#include "index-private.h"
#include "checkpoint.h"
#include "reserve.h"
#include "wal-sync.h"

#include "storage/log.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

/* Size in bytes of a WAL file of frames frames of index's pages
   (SQLite's file format, "WAL File Format": a 32-byte header, then each
   frame a 24-byte header and a page). */
static int64_t wal_bytes(const struct dbox_index *index, int frames)
{
	return 32 + (int64_t)frames * (index->page_size + 24);
}

/* Wake the thread for its timed sync when this is the first commit since
   its last one (once per DBOX_WAL_SYNC_DELAY_MS at most, not per commit:
   a futex per delivery was measurable). */
static void note_commit(struct index_checkpointer *ck)
{
	if (__atomic_load_n(&ck->sync_pending, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&ck->mutex);
	if (!ck->sync_pending) {
		clock_gettime(CLOCK_REALTIME, &ck->sync_due);
		ck->sync_due.tv_sec += DBOX_WAL_SYNC_DELAY_MS / 1000;
		ck->sync_due.tv_nsec += (DBOX_WAL_SYNC_DELAY_MS % 1000) *
					1000000L;
		if (ck->sync_due.tv_nsec >= 1000000000L) {
			ck->sync_due.tv_sec++;
			ck->sync_due.tv_nsec -= 1000000000L;
		}
		__atomic_store_n(&ck->sync_pending, true, __ATOMIC_RELEASE);
		pthread_cond_broadcast(&ck->cond);
	}
	pthread_mutex_unlock(&ck->mutex);
}

/* Run by SQLite inside each commit of the main connection, after the
   commit's frames are in the WAL and before dbox_index_commit counts it
   (index->commits). */
static int wal_hook(void *arg, sqlite3 *db, const char *name, int pages)
{
	struct dbox_index *index = arg;
	struct index_checkpointer *ck = &index->ckpt;
	int64_t bytes = wal_bytes(index, pages);

	note_commit(ck);

	if (bytes >= DBOX_CHECKPOINT_INLINE_BYTES ||
	    (bytes >= DBOX_CHECKPOINT_SHORT_BYTES &&
	     dbox_index_reserve_short(index))) {
		/* The thread is behind, or the disk is full and the WAL
		   must start over in the blocks it has: do it here, as
		   SQLite would (the next commit starts the WAL over), unless
		   the thread is checkpointing already. */
		if (ck->running) {
			bool busy;

			pthread_mutex_lock(&ck->mutex);
			busy = ck->busy;
			if (!busy)
				ck->wanted = false; /* this one does it */
			else
				__atomic_store_n(&ck->behind, true,
						 __ATOMIC_RELEASE);
			pthread_mutex_unlock(&ck->mutex);
			/* The thread's checkpoint would make this one busy;
			   and its WAL sync (the hook's) waits for the
			   store lock this thread holds: never wait for it
			   here.  New changes wait for it instead, before
			   they take the store lock (behind); the first
			   commit after it checkpoints here. */
			if (busy)
				return SQLITE_OK;
		}
		sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE,
					  NULL, NULL);
		return SQLITE_OK;
	}
	/* Wake the thread once the WAL passes DBOX_CHECKPOINT_BYTES, and
	   again only after DBOX_CHECKPOINT_RETRY_BYTES more (a reader kept
	   the last checkpoint from reaching the end) or once the WAL has
	   started over: a wakeup per commit cost two context switches and
	   three futex calls per delivery.  Only this hook touches
	   woken_pages (the connection's commits, one at a time). */
	if (pages < ck->woken_pages)
		ck->woken_pages = 0;
	if (bytes >= DBOX_CHECKPOINT_BYTES &&
	    (ck->woken_pages == 0 ||
	     bytes >= wal_bytes(index, ck->woken_pages) +
		      DBOX_CHECKPOINT_RETRY_BYTES)) {
		ck->woken_pages = pages;
		pthread_mutex_lock(&ck->mutex);
		ck->wanted = true;
		pthread_cond_broadcast(&ck->cond);
		pthread_mutex_unlock(&ck->mutex);
	}
	return SQLITE_OK;
}

/* The thread's checkpoint is over (or waits): an inline one may run, and
   changes held back by behind go on.  Called with ck->mutex held. */
static void not_busy(struct index_checkpointer *ck)
{
	ck->busy = false;
	__atomic_store_n(&ck->behind, false, __ATOMIC_RELEASE);
	pthread_cond_broadcast(&ck->cond);
}

/* One PASSIVE checkpoint by the thread's connection.  Called with
   ck->mutex held and ck->busy set; returns with the mutex held.  A
   checkpoint that finds the WAL-index header changing under it (the
   committing thread is writing it) or another checkpoint running
   returns SQLITE_BUSY having copied nothing: it is tried again after
   DBOX_CHECKPOINT_BUSY_WAIT_MS, up to DBOX_CHECKPOINT_BUSY_TRIES times,
   instead of waiting DBOX_CHECKPOINT_RETRY_BYTES more WAL for the
   next wakeup. */
static void checkpoint_once(struct dbox_index *index)
{
	struct index_checkpointer *ck = &index->ckpt;
	int rc, log_pages, done, tries = 0;
	struct timespec until;

	for (;;) {
		pthread_mutex_unlock(&ck->mutex);
		rc = sqlite3_wal_checkpoint_v2(ck->db, NULL,
					       SQLITE_CHECKPOINT_PASSIVE,
					       &log_pages, &done);
		pthread_mutex_lock(&ck->mutex);
		if (rc != SQLITE_BUSY || ++tries > DBOX_CHECKPOINT_BUSY_TRIES)
			break;
		/* Not busy while it waits: an inline checkpoint
		   (wal_hook) need not wait for this one. */
		not_busy(ck);
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += DBOX_CHECKPOINT_BUSY_WAIT_MS * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		while (!ck->stop &&
		       pthread_cond_timedwait(&ck->cond, &ck->mutex,
					      &until) == 0)
			;
		if (ck->stop)
			return;
		ck->busy = true;
	}
	if (rc != SQLITE_OK && rc != SQLITE_BUSY)
		dbox_warning("index %s: checkpoint: %s", index->path,
			     sqlite3_errmsg(ck->db));
	else if (rc == SQLITE_OK && log_pages < 0)
		/* Not possible once the connection has read the index
		   (dbox_index_checkpointer_start). */
		dbox_warning("index %s: checkpoint: the checkpointer's "
			     "connection has no WAL", index->path);
}

static bool due(const struct timespec *when)
{
	struct timespec now;

	clock_gettime(CLOCK_REALTIME, &now);
	return now.tv_sec > when->tv_sec ||
	       (now.tv_sec == when->tv_sec && now.tv_nsec >= when->tv_nsec);
}

/* The timed sync.  Called and returns with ck->mutex held.  The flag is
   cleared first: a commit whose hook ran before has its frames in the WAL
   already, so the sync that follows covers it even when the commit is
   not counted yet (hence dbox_index_sync_written, not _upto); a commit
   whose hook runs after sets the flag again. */
static void timed_sync(struct dbox_index *index)
{
	struct index_checkpointer *ck = &index->ckpt;

	__atomic_store_n(&ck->sync_pending, false, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&ck->mutex);
	(void)dbox_index_sync_all(index); /* logged */
	pthread_mutex_lock(&ck->mutex);
}

static void *checkpointer(void *arg)
{
	struct dbox_index *index = arg;
	struct index_checkpointer *ck = &index->ckpt;

	pthread_mutex_lock(&ck->mutex);
	while (!ck->stop) {
		if (ck->wanted) {
			ck->wanted = false;
			ck->busy = true;
			checkpoint_once(index);
			not_busy(ck);
		} else if (!ck->sync_pending) {
			pthread_cond_wait(&ck->cond, &ck->mutex);
		} else if (!due(&ck->sync_due)) {
			pthread_cond_timedwait(&ck->cond, &ck->mutex,
					       &ck->sync_due);
		} else {
			timed_sync(index);
		}
	}
	pthread_mutex_unlock(&ck->mutex);
	return NULL;
}

void dbox_index_wal_throttle(struct dbox_index *index)
{
	struct index_checkpointer *ck = &index->ckpt;

	if (!__atomic_load_n(&ck->behind, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&ck->mutex);
	while (ck->behind && !ck->stop)
		pthread_cond_wait(&ck->cond, &ck->mutex);
	pthread_mutex_unlock(&ck->mutex);
}

int dbox_index_checkpointer_start(struct dbox_index *index,
				  dbox_index_sync_fn *sync, void *ctx)
{
	struct index_checkpointer *ck = &index->ckpt;

	if (ck->running)
		return 0;
	if (sqlite3_open_v2(index->path, &ck->db,
			    SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX |
			    SQLITE_OPEN_NOFOLLOW,
			    dbox_reserve_vfs()) != SQLITE_OK) {
		dbox_error("index %s: checkpointer: %s", index->path,
			   ck->db != NULL ? sqlite3_errmsg(ck->db) : "out of memory");
		sqlite3_close(ck->db);
		ck->db = NULL;
		return -EIO;
	}
	sqlite3_busy_timeout(ck->db, 5000);
	/* A connection opens the WAL when it first reads the database; until
	   then sqlite3_wal_checkpoint_v2() does nothing and says so only by
	   -1 frames ("the database is not in WAL mode" for it: SQLite's
	   documentation of sqlite3_wal_checkpoint_v2).  The checkpointer
	   was such a no-op before this read, and every checkpoint ran
	   inline at DBOX_CHECKPOINT_INLINE_BYTES. */
	if (sqlite3_exec(ck->db, "SELECT count(*) FROM sqlite_schema", NULL,
			 NULL, NULL) != SQLITE_OK) {
		dbox_error("index %s: checkpointer: %s", index->path,
			   sqlite3_errmsg(ck->db));
		sqlite3_close(ck->db);
		ck->db = NULL;
		return -EIO;
	}
	ck->stop = ck->wanted = ck->behind = false;
	ck->woken_pages = 0;
	ck->sync_pending = false;
	ck->sync = sync;
	ck->sync_ctx = ctx;
	/* SQLite's syncs of the WAL, on both connections, are the hook's:
	   a checkpoint then copies no row into the database, and syncs none
	   in the WAL, before the message bytes it points at are on disk.
	   The thread's checkpoint runs it holding no lock of ours; the main
	   connection's (an inline checkpoint, a WAL restart) under the store
	   lock. */
	if (sync != NULL &&
	    (dbox_reserve_wal_sync_by(ck->db, sync, ctx) < 0 ||
	     dbox_reserve_wal_sync_by(index->db, sync, ctx) < 0))
		dbox_warning("index %s: checkpointer: the WAL is not open "
			     "through the reserve VFS; checkpoints sync it "
			     "without the store's sync round", index->path);
	if (pthread_create(&ck->thread, NULL, checkpointer, index) != 0) {
		(void)dbox_reserve_wal_sync_by(index->db, NULL, NULL);
		sqlite3_close(ck->db);
		ck->db = NULL;
		return -ENOMEM;
	}
	ck->running = true;
	sqlite3_wal_hook(index->db, wal_hook, index);
	return 0;
}

void dbox_index_checkpointer_stop(struct dbox_index *index)
{
	struct index_checkpointer *ck = &index->ckpt;

	if (!ck->running)
		return;
	/* SQLite's own bound is in pages. */
	sqlite3_wal_autocheckpoint(index->db, (int)(DBOX_CHECKPOINT_BYTES /
						     index->page_size));
	pthread_mutex_lock(&ck->mutex);
	ck->stop = true;
	pthread_cond_broadcast(&ck->cond);
	pthread_mutex_unlock(&ck->mutex);
	pthread_join(ck->thread, NULL);
	(void)dbox_reserve_wal_sync_by(index->db, NULL, NULL);
	sqlite3_close(ck->db);
	ck->db = NULL;
	ck->running = false;
}
