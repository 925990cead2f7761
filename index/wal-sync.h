#ifndef DBOXFS_WAL_SYNC_H
#define DBOXFS_WAL_SYNC_H

/*
 * wal-sync: group commit for the index.  An index commit (WAL mode,
 * synchronous=NORMAL) is written to STORE/index.sqlite-wal but not synced;
 * it is durable once the WAL file is.  Threads that need their commits on
 * disk (fsync, fsyncdir) note the commit sequence number under the store
 * lock and then wait here WITHOUT the lock: one of them fdatasync()s the
 * WAL for all commits made so far while the others wait for it, and the
 * store stays usable meanwhile.  SQLite's own syncs (checkpoints) are
 * unaffected: we only add syncs of a file it wrote.
 *
 * Thread-safe (its own mutex, a leaf of the lock order in
 * engine/store.h); dbox_index_commit_seq needs the store lock like every
 * other index call.
 */

#include <stdbool.h>
#include <stdint.h>

struct dbox_index;

/* Number of transactions committed on this connection so far: the value
   to pass to dbox_index_sync_upto for "everything I committed".  Needs
   the store lock. */
uint64_t dbox_index_commit_seq(struct dbox_index *index);

/* Return once the first seq commits of this connection are on disk:
   by one fdatasync of the WAL shared with concurrent callers (group
   commit).  Needs no lock, and must be called without the store lock for
   the grouping to work.  Returns 0, or -EIO when the WAL cannot be synced
   (logged). */
int dbox_index_sync_upto(struct dbox_index *index, uint64_t seq);

/* Sync the WAL with every commit so far by the checkpointer's sync hook
   when one is set (checkpoint.h: the store's message bytes first), else
   alone (dbox_index_sync_written).  For durable commits and the timed
   sync.  Returns 0, or -EIO (logged). */
int dbox_index_sync_all(struct dbox_index *index);

/* Are the first seq commits of this connection on disk already?  Needs
   no lock. */
bool dbox_index_synced_upto(struct dbox_index *index, uint64_t seq);

/* Sync the WAL now, whatever the commit count says: one fdatasync that
   starts after every frame written to the WAL before the call (it waits
   for a sync already running, which may have started earlier).  For a
   caller that knows frames are there whose commit is not counted yet
   (the WAL hook runs inside the commit, before dbox_index_commit counts
   it: checkpoint.c's timed sync).  Needs no lock; call it without the
   store lock.  Returns 0, or -EIO (logged). */
int dbox_index_sync_written(struct dbox_index *index);

#endif
