#ifndef DBOXFS_WAL_WRITE_H
#define DBOXFS_WAL_WRITE_H

/*
 * wal-write: the SQLite VFS the index opens its connection with: SQLite's
 * own "unix" VFS, except that the WAL frames a transaction appends (two
 * pwrite()s per page: the 24-byte frame header and the page) are gathered
 * in memory and written to STORE/index.sqlite-wal with one pwrite() per
 * commit instead of two per page.
 *
 * Why this is safe: a commit is visible to other connections (the
 * checkpointer, dboxadm in another process) only once SQLite has updated
 * the WAL-index header in shared memory, and SQLite calls the database
 * file's xShmBarrier between the two copies of that header that a reader
 * compares; the gathered frames are written before that barrier, so
 * every reader that can see a commit finds its frames in the file.  They
 * are also written before any sync, read, truncate or size query of the
 * WAL and before it is closed, so SQLite itself never sees the
 * difference.  A process that dies with frames gathered dies before its
 * COMMIT returned: the transaction was never committed.  The file format
 * is SQLite's, byte for byte: other programs read the store as before.
 */

/* Name of the VFS, for sqlite3_open_v2(). */
#define DBOX_WAL_VFS "dboxfs-wal"

/* Register the VFS once per process (thread-safe; later calls return the
   first result).  Returns 0, or -ENOMEM / -EIO when SQLite has no "unix"
   VFS or refuses the registration; the caller then opens with the default
   VFS (correct, only slower). */
int dbox_wal_vfs_register(void);

#endif
