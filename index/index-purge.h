#ifndef DBOXFS_INDEX_PURGE_H
#define DBOXFS_INDEX_PURGE_H

/*
 * index-purge: the index side of purge (engine/purge.h) and of the per-file
 * numbers `dboxadm stats --files` shows: which records of an m.N are
 * still referenced, moving message rows to new locations when they did
 * not change, dropping an m.N from the index, and meta counters.
 *
 * Not for the FUSE hot path: statements are prepared per call (a move of
 * n records prepares once for all n).  Every function runs inside the
 * caller's transaction (or, for the read-only ones, in autocommit or a
 * read snapshot); none starts one.  Return convention as in index.h: 0 or
 * a count on success, a negative errno on failure (-EIO for any SQLite
 * error, logged; -ENOMEM).
 */

#include "index.h"

#include <stddef.h>
#include <stdint.h>

/* One message row in an m.N, for purge. */
struct dbox_file_rec {
	uint64_t ino;
	uint64_t offset;       /* record start, bytes */
	uint64_t body_size;    /* stored body bytes */
	uint64_t record_size;  /* header + body + metadata bytes */
	int64_t mtime_ns;      /* the inode's mtime (received date), ns */
	enum dbox_msg_state state;
	char guid[33];         /* the GUID the row gives its record */
};

/* Every message row whose record is in m.<file_id>, by offset, into a
   malloc()ed array *recs_r (caller frees; NULL when none) of *count_r
   entries.  Rows in any state, also of inodes with no name left (still
   open on the mount): all of them are bytes someone may read.  Returns 0,
   -ENOMEM or -EIO. */
int dbox_index_file_records(struct dbox_index *index, uint32_t file_id,
			    struct dbox_file_rec **recs_r, size_t *count_r);

/* What the index says about one m.N.  Bytes are bytes. */
struct dbox_file_usage {
	uint32_t file_id;
	uint64_t committed;   /* committed end (mfile row) */
	uint64_t live_bytes;  /* sum of record_size of its message rows */
	uint64_t records;     /* its message rows */
	uint64_t writing;     /* of those, still being written */
};

/* A committed message row whose record lies outside every m.N the index
   knows - in a file it has no row for, or past that file's committed end
   - which only a damaged index has (dbox_index_check_namespace reports
   it too): its real record would look like garbage to a purge.  Returns
   1 with the first such row's inode and file into *ino_r and
   *file_id_r, 0 when there is none, or -EIO.  One scan of the message
   table (O(messages)). */
int dbox_index_misplaced_row(struct dbox_index *index, uint64_t *ino_r,
			     uint64_t *file_id_r);

/* Usage of m.<file_id>.  Returns 0, -ENOENT when the index does not know
   the file. */
int dbox_index_file_usage(struct dbox_index *index, uint32_t file_id,
			  struct dbox_file_usage *usage_r);

/* Called by dbox_index_file_usage_all per m.N; return 0 to go on,
   non-zero to stop (that value is returned). */
typedef int dbox_file_usage_cb_t(void *ctx, const struct dbox_file_usage *u);

/* Usage of every m.N the index knows, by file_id, in one scan of the
   message table (O(messages)).  The rows are read before the first
   callback.  Returns 0, the value of the callback that stopped it,
   -ENOMEM or -EIO. */
int dbox_index_file_usage_all(struct dbox_index *index,
			      dbox_file_usage_cb_t *cb, void *ctx);

/* One record copied by purge: where it was, where its copy is. */
struct dbox_msg_move {
	uint64_t ino;
	uint64_t old_offset, record_size;
	uint32_t new_file_id;
	uint64_t new_offset;
	int64_t mtime_ns;  /* in: the mtime when copied; out: the current
			      one (differs when a client set it meanwhile) */
	bool moved;        /* out: the row now points at the copy */
};

/* Point the message rows at their copies, each only if it still is the
   committed record copied (same file, offset, record size; not WRITING):
   a row expunged or rewritten meanwhile is left alone (moved = false; its
   copy is garbage).  *left_r gets the number of message rows still in
   m.<old_file_id> afterwards (0 when every live record moved).  Returns 0
   or -EIO. */
int dbox_index_msg_move(struct dbox_index *index, uint32_t old_file_id,
			struct dbox_msg_move *moves, size_t count,
			uint64_t *left_r);

/* Forget m.<file_id> (its mfile row), remembering it as the highest
   number handed out when it is (meta key DBOX_META_MFILE_HIGH), so that
   dbox_index_mfile_max never goes down and the number is not handed
   out again once a purge removed every m.N above it (helper-87: after
   one that emptied the store, the next delivery went to m.1 again).
   Returns 0 or -EIO. */
int dbox_index_mfile_delete(struct dbox_index *index, uint32_t file_id);

/* Does any message row point into m.<file_id>?  Returns 1, 0 or -EIO. */
int dbox_index_file_has_records(struct dbox_index *index, uint32_t file_id);

/* Has message inode ino a name in folder dir (dir itself or its cur/,
   new/ or tmp/)?  For altmove --folder.  Returns 1, 0 or -EIO. */
int dbox_index_ino_in_folder(struct dbox_index *index, uint64_t ino,
			     uint64_t dir);

#endif
