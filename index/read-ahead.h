#ifndef DBOXFS_READ_AHEAD_H
#define DBOXFS_READ_AHEAD_H

/*
 * read-ahead: reads of an index database file in chunks, for the reserve
 * VFS (reserve.c).  SQLite reads one page per read() and has no
 * read-ahead of its own; with 1024-byte pages (index-private.h) a
 * listing of a big folder by a fresh daemon made some 184,000 reads per
 * million names.  A read that lands at or shortly after the previous one
 * fills a buffer of READ_AHEAD_BYTES from there, and the reads after it
 * that fall inside are served from the buffer; a read elsewhere goes
 * straight to the file, as before.
 *
 * Correctness rests on when the buffer is dropped (read_ahead_forget):
 * at every lock change of the database or its wal-index (the start and
 * end of every transaction) and at every write or truncate of the file
 * through this file object.  Inside one read transaction the pages
 * SQLite reads from the database file (those without a WAL frame in its
 * snapshot) do not change: a checkpoint copies only frames that every
 * reader's snapshot holds, and a page read from the file has none.
 *
 * Not thread-safe: one per SQLite file object, which its connection uses
 * from one thread at a time (reserve.c).
 */

#include <sqlite3.h>
#include <stdbool.h>

/* Bytes read at once (16 pages of 1024 bytes). */
#define READ_AHEAD_BYTES (16 * 1024)

struct read_ahead {
	char *buf;              /* READ_AHEAD_BYTES, or NULL until needed */
	sqlite3_int64 off;      /* file offset of buf[0] */
	int len;                /* valid bytes in buf; 0: nothing held */
	sqlite3_int64 next;     /* end of the previous read; -1: none */
};

/* An empty read-ahead (no allocation). */
void read_ahead_init(struct read_ahead *ra);

/* Read amt bytes at off of file (a database file of the default VFS)
   into buf, through ra.  Returns what file's xRead returns (SQLITE_OK,
   SQLITE_IOERR_SHORT_READ with the rest of buf zeroed, or an error);
   a chunk that cannot be read whole is not kept, and the read then goes
   to the file as asked. */
int read_ahead_read(struct read_ahead *ra, sqlite3_file *file, void *buf,
		    int amt, sqlite3_int64 off);

/* Drop what ra holds (the file may change, or has). */
void read_ahead_forget(struct read_ahead *ra);

/* Free ra's buffer. */
void read_ahead_free(struct read_ahead *ra);

#endif
