#ifndef DBOXFS_CHECKPOINT_H
#define DBOXFS_CHECKPOINT_H

/*
 * checkpoint: WAL checkpoints off the request path.  By default SQLite
 * checkpoints inside the COMMIT that pushes the WAL past 1000 pages: that
 * commit then copies the WAL into index.sqlite and fsyncs both, while the
 * caller holds the store lock.  With a checkpointer started, commits only
 * note the WAL size; a thread with its own connection to the index runs
 * PASSIVE checkpoints (copy what no reader needs, never block writers)
 * once the WAL passes DBOX_CHECKPOINT_BYTES.  A WAL that grows past
 * DBOX_CHECKPOINT_INLINE_BYTES anyway (the thread cannot keep up) is
 * checkpointed by the committing thread as before (so is one past
 * DBOX_CHECKPOINT_SHORT_BYTES while the disk is full); while the
 * thread's own checkpoint runs, new changes wait for it first
 * (dbox_index_wal_throttle).  Each time the WAL
 * starts over, SQLite cuts it to DBOX_WAL_KEEP bytes.  The bounds are WAL
 * file sizes, whatever the index's page size (index-private.h: 1024
 * bytes, or 4096 in an index created before 2026-12-02).
 *
 * Durability is SQLite's: a checkpoint syncs the WAL before copying and
 * the database after, so no commit depends on the thread being alive.
 * With a sync hook, every sync SQLite makes of the WAL, on either
 * connection, runs the hook instead (reserve.h,
 * dbox_reserve_wal_sync_by), so the rows a checkpoint makes durable
 * name message bytes already on disk.
 *
 * The thread also bounds how long a commit stays unsynced when nobody
 * asks for a sync (no fsync, fsyncdir or checkpoint comes): the first
 * commit after a sync wakes it, and DBOX_WAL_SYNC_DELAY_MS later it
 * syncs the WAL (wal-sync.h), so a rename, link or unlink is on disk
 * within that time, as ext4 commits its journal every 5 s.  An idle
 * index costs no wakeup.
 */

#include <stdint.h>

#define DBOX_CHECKPOINT_BYTES (4 * 1024 * 1024)
#define DBOX_CHECKPOINT_INLINE_BYTES (8 * 1024 * 1024)
/* WAL growth (bytes) after which a checkpoint that did not reach the end
   of the WAL is tried again. */
#define DBOX_CHECKPOINT_RETRY_BYTES (2 * 1024 * 1024)
/* A checkpoint of the thread's that was busy (SQLite's checkpoint lock
   taken, or the WAL-index header being written by a commit) is tried
   again this many times, this many milliseconds apart. */
#define DBOX_CHECKPOINT_BUSY_TRIES 20
#define DBOX_CHECKPOINT_BUSY_WAIT_MS 5
/* While the index reserve is in use (reserve.h: the disk is full), the
   committing thread checkpoints at this WAL size, so the WAL starts
   over in its own blocks instead of asking for more. */
#define DBOX_CHECKPOINT_SHORT_BYTES (256 * 1024)
/* Bytes the WAL keeps when it starts over (PRAGMA journal_size_limit):
   the WAL stays below about DBOX_CHECKPOINT_INLINE_BYTES under load and
   goes back to 4 MiB after each checkpoint.  Before, it grew to 64 MiB
   and kept that size. */
#define DBOX_WAL_KEEP (4 * 1024 * 1024)
/* Longest time in milliseconds a commit waits for the thread's sync of
   the WAL (docs/durability.md: power loss). */
#define DBOX_WAL_SYNC_DELAY_MS 1000

struct dbox_index;

/* What syncs the WAL while the checkpointer runs, with ctx, holding no
   lock of the index's: the thread's timed sync and every durable commit
   (dbox_index_commit, dbox_index_sync) call it instead of syncing the
   WAL themselves.  It syncs what the commits so far point at (the
   store's message bytes), then the WAL (dbox_index_sync_written), so
   that no row reaches the disk before them.  Returns 0 or -EIO. */
typedef int dbox_index_sync_fn(void *ctx);

/* Start the checkpointer of index (opened read-write); sync (or NULL:
   the WAL alone is synced) makes each timed sync and durable commit.  Returns 0, or a negative errno (-EIO
   when its connection cannot be opened; logged): the index then keeps
   checkpointing inline and makes no timed syncs.  Call once per open
   index, and only in the process that goes on using it (not before
   fork()). */
int dbox_index_checkpointer_start(struct dbox_index *index,
				  dbox_index_sync_fn *sync, void *ctx);

/* Wait while the WAL is past DBOX_CHECKPOINT_INLINE_BYTES and the
   thread's checkpoint, which the commit that found it so could not
   wait for (its WAL sync takes the store lock, engine/store.h), still
   runs: then the next commit checkpoints inline and the WAL stops
   growing.  Call without the store lock, before a change (fs/ calls it
   before every request takes the lock).  Returns at once in the usual
   case (one atomic load), and when no checkpointer runs. */
void dbox_index_wal_throttle(struct dbox_index *index);

/* Stop the checkpointer and close its connection (waits for a running
   checkpoint).  Safe when none was started.  dbox_index_close calls it. */
void dbox_index_checkpointer_stop(struct dbox_index *index);

#endif
