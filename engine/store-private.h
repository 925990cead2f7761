#ifndef DBOXFS_STORE_PRIVATE_H
#define DBOXFS_STORE_PRIVATE_H

/*
 * store-private: what the files of the store engine share (store.c,
 * store-pool.c, store-recover.c, store-restore.c, store-read.c,
 * store-sync.c, save.c).  Not for fs/ or
 * tools/: they use store.h.
 */

#include "engine/store.h"

/* store-recover.c: crash recovery at open (store.h, dbox_store_open):
   the tails of the m.N files past their committed ends, the index's own
   recovery (WRITING rows, unlinked inodes), files/, and the m.N files the
   index does not know.  *writing_r gets the number of unfinished
   deliveries dropped.  Needs st->lock.  Returns 0 or a negative errno. */
int dbox_store_recover(struct dbox_store *st, unsigned int *writing_r);

/* m.N files changed less than this many seconds ago are synced when a
   process that died left the WAL (dbox_store_sync_left). */
#define DBOX_STORE_LEFT_AGE 600

/* Sync (fdatasync) every m.N of storage/ changed in the last
   DBOX_STORE_LEFT_AGE seconds: for an open that finds the WAL a process
   that died left (a crash), before anything syncs the WAL.  That
   process's commits are in the WAL, and the message bytes they point at
   may still be only in the page cache; the first WAL sync of this open
   (recovery's durable commits, the timed sync) would put the rows on
   disk ahead of them, and a power loss then left messages reading EIO
   (helper-68 #2).  Errors are logged. */
void dbox_store_sync_left(struct dbox_store *st);

/* store-restore.c: crash recovery of mail that fsync() synced with its
   path (L) but whose index rows the crash lost: the whole records of
   m.<file_id> (open as fd; in ALT storage when alt) from its committed
   end `committed` up to the last one with a path (or with the GUID of
   one), stopping before `stop` (a copy's mark, dbox_store_copy_mark;
   UINT64_MAX: none), are matched to the index by GUID and put back (a
   WRITING delivery finished, a message a purge moved pointed at its
   record, the rest made at its path or in its B folder's cur/), copies
   of messages the index has left out, and the committed end moves past
   them, in one commit made durable.  Returns the committed end after
   it (committed when nothing was put back; failures are logged and
   leave the index as it was).  Needs st->lock. */
uint64_t dbox_store_restore_sealed(struct dbox_store *st, int fd,
				   uint32_t file_id, bool alt,
				   uint64_t committed, uint64_t stop);

/* store-pool.c: put m.<file_id>, the last m.N the index knows, back into
   the append pool when it is below the rotate size and its bytes end at
   its committed end (walk: and its records are whole).  Best effort: it
   stays out otherwise.  Needs st->lock. */
void dbox_store_pool_adopt(struct dbox_store *st, uint32_t file_id, bool walk);

/* store-pool.c: an m.N of the append pool with room, or a new one
   (entered in the index, inside the caller's transaction), now owned
   (busy) by the caller; not marked in flight.  Given back by
   dbox_store_mfile_release.  Needs st->lock.  Returns 0 and *mf_r, or a
   negative errno. */
int dbox_store_pool_take(struct dbox_store *st, struct dbox_mfile **mf_r);

/* store-sync.c: list mf for the checkpointer's next timed sync: a finish
   wrote a record into it without syncing it (nothing when no
   checkpointer runs).  Needs st->lock.  Never fails (out of memory:
   logged, and the bytes reach the disk with the kernel's writeback). */
void dbox_store_note_unsynced(struct dbox_store *st, struct dbox_mfile *mf);

#endif
