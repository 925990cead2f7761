#ifndef DBOXFS_WAL_BATCH_H
#define DBOXFS_WAL_BATCH_H

/*
 * wal-batch: the writes SQLite makes to one WAL file object, gathered into
 * one write per transaction.  SQLite writes each WAL frame as two writes,
 * its 24-byte header and then its page; a delivery's transaction of some
 * twenty frames was some forty pwrite() calls.  The reserve VFS
 * (reserve.c) hands every write of a WAL file to wal_batch_write(), which
 * keeps writes that append to the ones it holds and writes them at once:
 *
 *   - right after the page of a commit frame (the whole transaction
 *     reaches the kernel in one write before the commit's xWrite returns);
 *   - before a write that does not append (another offset), or that would
 *     make the batch bigger than WAL_BATCH_CAP;
 *   - when the caller asks (wal_batch_flush): reserve.c does before every
 *     other method of the file and when its database releases a wal-index
 *     lock, so SQLite never reads, syncs, truncates or measures the file
 *     with writes still held, and no other connection can write where
 *     stale bytes would later land.
 *
 * Format facts (SQLite's file format document, "WAL File Format"; what
 * dboxfs relies on is in docs/durability.md, "The WAL's writes"): the
 * WAL starts with a 32-byte header; each frame is a 24-byte header (page
 * number, size of the database in pages after commit, two salts, two
 * checksums; 32-bit big-endian) followed by one page.  The second field
 * is not zero only in a commit frame.  With powersafe overwrite (the
 * unix VFS's default) SQLite writes a frame as exactly those two writes;
 * reserve.c batches only then.
 *
 * Not thread-safe: a batch belongs to one SQLite file object, which
 * SQLite uses from one thread at a time (its connection's calls are
 * serialised; see reserve.c).
 */

#include <sqlite3.h>
#include <stdbool.h>
#include <stddef.h>

/* Largest batch, in bytes.  The unix VFS passes a write's length through
   "n & 0x1ffff" before pwrite() (os_unix.c, seekAndWriteFd) and its
   unixWrite stops on a write of 0 bytes with SQLITE_FULL: a write of
   128 KiB or more would be cut, or fail as a full disk.  120 KiB stays
   below that with room for one more frame header. */
#define WAL_BATCH_CAP (120 * 1024)

/* Size of a WAL frame header in bytes (SQLite's file format document). */
#define WAL_FRAME_HEADER 24

/* Writes n bytes from buf at offset off of the file behind ctx, as the
   xWrite of a sqlite3_io_methods does; returns an SQLite result code. */
typedef int wal_batch_write_fn(void *ctx, const void *buf, int n,
			       sqlite3_int64 off);

struct wal_batch {
	wal_batch_write_fn *write;
	void *ctx;
	char *buf;           /* WAL_BATCH_CAP bytes, allocated at first use */
	size_t len;          /* bytes held in buf */
	sqlite3_int64 off;   /* file offset of buf[0] */
	sqlite3_int64 next;  /* where an appending write starts, or -1 */
	bool commit;         /* the last write was a commit frame's header */
};

/* Start an empty batch that writes through write(ctx, ...).  Allocates
   nothing. */
void wal_batch_init(struct wal_batch *b, wal_batch_write_fn *write,
		    void *ctx);

/* A write of n bytes at off to the WAL: held, or written (with what the
   batch held first) by the rules above.  Returns SQLITE_OK or the
   result code of the write that failed.  When writing what the batch
   held fails, this write is refused and the batch keeps what it held
   (SQLite took those writes as done); when the commit frame's write
   fails, the batch is emptied: SQLite rolls that transaction back, and
   none of its frames may reach the file later. */
int wal_batch_write(struct wal_batch *b, const void *buf, int n,
		    sqlite3_int64 off);

/* Write what the batch holds, in one write; the batch is empty after it
   succeeds, and keeps what it held when it fails (SQLite may still
   commit after those writes: a statement that fails with a full disk
   rolls back only itself).  Returns SQLITE_OK (also for an empty batch)
   or the write's result code. */
int wal_batch_flush(struct wal_batch *b);

/* Empty the batch without writing it: for a caller that cannot report a
   failed flush and after which the held bytes must never land (the
   write lock is released; another connection may write there). */
void wal_batch_drop(struct wal_batch *b);

/* Free the batch's buffer.  What it holds is dropped: flush first. */
void wal_batch_free(struct wal_batch *b);

#endif
