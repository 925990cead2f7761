#ifndef DBOXFS_RESERVE_H
#define DBOXFS_RESERVE_H

/*
 * reserve: disk space kept for index transactions, so that expunge,
 * rename, mkdir and purge still work once the filesystem under STORE is
 * full (and purge can then give space back).
 *
 * STORE/index.sqlite-reserve is a file of DBOX_RESERVE_MAX bytes (at most
 * 1/16 of the filesystem) allocated with fallocate().  Every connection to
 * the index goes through a thin SQLite VFS over the default one: a write
 * of the index, its WAL or its shared memory file that fails because the
 * disk is full (SQLITE_FULL) gives DBOX_RESERVE_CHUNK bytes of the reserve
 * back to the filesystem (ftruncate) and is tried again, until the
 * reserve is empty.  SQLite never sees the full disk while the reserve
 * lasts.
 *
 * While the reserve is not whole, message bytes do not take disk space
 * (dbox_index_reserve_check answers -ENOSPC): what the index freed stays
 * free for the index.  The first data write that finds room again refills
 * the reserve and goes on.  The WAL is checkpointed after every few
 * pages meanwhile (checkpoint.c), so it starts over in the blocks it
 * already has instead of growing.
 *
 * The VFS also writes each transaction's WAL frames in one write instead
 * of two writes per frame (wal-batch.h), and refuses what a planted
 * rollback journal could make SQLite do to other files: open a
 * super-journal (SQLite deletes the one a rolled-back journal names; the
 * index never writes one) or delete anything but a journal or a WAL.
 * Every read-write connection to an index or a copy of one opens through
 * it.
 *
 * The VFS is registered once per process under the name DBOX_RESERVE_VFS
 * (a table of functions, no state: the reserve of a file is found by its
 * name, <database>-reserve).  Indexes without a reserve file (a rebuild's
 * new index, a test's) simply fail with SQLITE_FULL as before.
 */

#include <sqlite3.h>
#include <stdbool.h>
#include <stdint.h>

#define DBOX_RESERVE_MAX (8 * 1024 * 1024)
#define DBOX_RESERVE_CHUNK (256 * 1024)
#define DBOX_RESERVE_SUFFIX "-reserve"
#define DBOX_RESERVE_VFS "dboxfs-reserve"
/* How long a reserve seen whole is trusted (ns): every WRITE of a
   delivery asks, and an fstat each time is a syscall per request. */
#define DBOX_RESERVE_RECHECK_NS 1000000000ull

struct dbox_index;

/* Register the VFS (once per process; later calls return at once).
   Returns its name, or NULL when SQLite has no default VFS (then the
   index opens with the default one). */
const char *dbox_reserve_vfs(void);

/* Open the reserve of index (<index path>-reserve), creating it when
   missing, and fill it to its full size when there is room.  A reserve
   that cannot be filled is logged and left as it is (filled later by
   dbox_index_reserve_check).  Returns 0 or a negative errno (-errno of
   the open; the index then works without a reserve). */
int dbox_index_reserve_open(struct dbox_index *index);

/* Whether data (message bytes, plain files) may take disk space now: 0
   when the reserve is whole, or was refilled now because the filesystem
   has room for it again; -ENOSPC while it is not.  0 also for an index
   without a reserve.  A reserve seen whole is taken as whole, without a
   look at its file, for DBOX_RESERVE_RECHECK_NS unless this process gave
   a part of any reserve back meanwhile: another process (dboxadm on the
   same store) using the reserve is noticed within that time.
   Thread-safe; no lock needed. */
int dbox_index_reserve_check(struct dbox_index *index);

/* True when the reserve of index is not whole (a part of it was used for
   index writes on a full disk), or its size cannot be read.  Seen whole,
   it is trusted as dbox_index_reserve_check says.  Thread-safe. */
bool dbox_index_reserve_short(struct dbox_index *index);

/* Make SQLite's syncs of db's WAL (a checkpoint's, before it copies
   frames into the database; the WAL header's when it starts over) call
   sync(ctx) instead of syncing the file: the checkpointer's hook
   (checkpoint.h), which syncs the store's message bytes the rows point
   at and then the WAL.  sync returns 0 or a negative errno (SQLite then
   sees SQLITE_IOERR_FSYNC); NULL makes the syncs plain again.  db must
   have read the index (its WAL is open) and no other thread may use it
   meanwhile.  Returns 0, or -ENOENT when db has no WAL open through this
   VFS (nothing changed). */
int dbox_reserve_wal_sync_by(sqlite3 *db, int (*sync)(void *ctx), void *ctx);

#endif
