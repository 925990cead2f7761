#ifndef DBOXFS_INDEX_STATS_H
#define DBOXFS_INDEX_STATS_H

/*
 * index-stats: read-only questions about a whole index, for dboxadm
 * (stats, export) - and read snapshots, so that such a reader sees one
 * consistent state while a mounted dboxfs keeps writing.
 *
 * These functions only read.  They may run on a connection opened without
 * the store lock (dbox_index_open(path, false, ...)): in WAL mode a reader
 * does not block the writer and is not blocked by it.  Each scan is O(rows);
 * none of this is for the FUSE hot path.
 *
 * Return convention as in index.h: 0 on success, a negative errno on
 * failure (-EIO for any SQLite error, logged).
 */

#include "index.h"

#include <stdint.h>

/* Make this connection a guest reader of an index another process (the
   mount) owns: closing it never checkpoints the WAL, and so never deletes
   it.  SQLite decides "I am the last connection, checkpoint and delete
   the WAL" from fcntl locks; a daemon whose connection was opened before
   fork() holds none, so without this a guest's close unlinks the WAL the
   daemon goes on writing to (its later commits then reach no reader and
   are lost if it crashes).  Call right after dbox_index_open().  Returns
   0 or -EIO. */
int dbox_index_reader_setup(struct dbox_index *index);

/* Start a read transaction (BEGIN DEFERRED, then a read that pins the
   snapshot): every later read on this connection sees the index as it was
   at this call, until dbox_index_snapshot_end().  Takes no write lock, so a
   mounted dboxfs goes on committing.  Returns 0 or -EIO.  Not to be mixed
   with dbox_index_begin() (a write transaction). */
int dbox_index_snapshot_begin(struct dbox_index *index);

/* End the read transaction started by dbox_index_snapshot_begin().  Never
   fails; a no-op outside a transaction. */
void dbox_index_snapshot_end(struct dbox_index *index);

/* Totals over the whole index.  Byte counts are bytes; "live" means a
   committed message that still has at least one name (nlink > 0). */
struct dbox_index_stats {
	uint64_t messages;        /* live message inodes */
	uint64_t message_names;   /* their names (a hard link counts again) */
	uint64_t live_record_bytes; /* sum of record_size (header + body +
				       metadata in m.N) of live messages */
	uint64_t plain_bytes;     /* sum of plaintext sizes of live messages */
	uint64_t body_bytes;      /* sum of stored (maybe compressed) body
				     sizes of live messages */
	uint64_t writing;         /* messages still being written */
	uint64_t unlinked;        /* committed messages with no name left
				     (held open by a client of the mount) */
	uint64_t unlinked_bytes;  /* their record bytes */
	uint64_t dirs;            /* directory inodes, the root included */
	uint64_t files;           /* plain-file inodes (STORE/files/<ino>) */
	uint64_t mfiles;          /* m.N files the index knows */
	uint64_t committed_bytes; /* sum of their committed ends */
};

/* Fill *stats_r.  Returns 0 or -EIO. */
int dbox_index_stats_get(struct dbox_index *index,
			 struct dbox_index_stats *stats_r);

/* Called by dbox_index_stats_per_dir for each directory holding committed
   messages: the directory's inode number and how many message names it
   holds.  Return 0 to go on, non-zero to stop (that value is returned). */
typedef int dbox_dir_count_cb_t(void *ctx, uint64_t dir, uint64_t count);

/* Message names per directory (committed messages only), by directory
   inode number.  The callback may call other index functions (the rows
   are read before the first call).  Returns 0, the callback's non-zero
   value, or a negative errno. */
int dbox_index_stats_per_dir(struct dbox_index *index,
			     dbox_dir_count_cb_t *cb, void *ctx);

/* Every maildir the index holds, messages or not: cb(ctx, dir, 0) for
   each directory named "cur" (the root's for INBOX, a Maildir++ folder's
   for the others), in inode order, so that a caller summing counts from
   dbox_index_stats_per_dir lists empty folders too.  The callback may
   call other index functions.  Returns 0, the callback's non-zero value,
   or a negative errno. */
int dbox_index_stats_maildirs(struct dbox_index *index,
			      dbox_dir_count_cb_t *cb, void *ctx);

#endif
