#ifndef DBOXFS_INDEX_CHECK_H
#define DBOXFS_INDEX_CHECK_H

/*
 * index-check: read-only consistency questions about a whole index, for
 * `dboxadm check`.  Each check states the invariant it verifies (the ones
 * index.h, index-ns.c and index-msg.c keep) and reports every row that
 * breaks it, as one line of text, to a callback.
 *
 * Nothing here writes, and nothing here reads m.N files (dboxadm does
 * that part).  May run on a guest connection inside a read snapshot
 * (index-stats.h), so it works while the store is mounted.  O(rows).
 *
 * Return convention as in index.h: a count (>= 0) or a negative errno
 * (-EIO for an SQLite error, logged).
 */

#include "index.h"

#include <stdint.h>

/* One problem found, as text (valid during the call only). */
typedef void dbox_problem_cb_t(void *ctx, const char *text);

/* SQLite's own check of the file (PRAGMA integrity_check: pages, b-trees,
   indexes against their tables).  Each line it reports goes to cb.
   Returns the number of problems, or -EIO when the check cannot run. */
int dbox_index_check_integrity(struct dbox_index *index,
			       dbox_problem_cb_t *cb, void *ctx);

/* The namespace and bookkeeping invariants:
   - every entry names an existing inode, in an existing directory;
   - names are 1..255 bytes, not "." or "..", without '/' or NUL;
   - a non-directory's nlink is its number of names; a directory's is
     2 + its subdirectories; every directory but the root has one name
     and is reachable from the root;
   - a message inode has a message row and a message row a message inode;
   - no two committed messages share one record (file, offset);
   - a committed record lies within the committed end of a known m.N;
   - the format is known.
   Rows in states a live mount passes through (messages being written,
   inodes with no name left that a client still holds open) are not
   problems; dbox_index_check_pending() counts them.
   Returns the number of problems or a negative errno. */
int dbox_index_check_namespace(struct dbox_index *index,
			       dbox_problem_cb_t *cb, void *ctx);

/* What crash recovery at the next mount would clean up: messages still
   WRITING (*kept_r of them with a meta key keep_prefix<ino>, which
   recovery keeps: dbox_index_recover), and non-directory inodes without a
   name.  keep_prefix is SQL text without quotes.  Returns 0 or a negative
   errno. */
int dbox_index_check_pending(struct dbox_index *index, const char *keep_prefix,
			     uint64_t *writing_r, uint64_t *kept_r,
			     uint64_t *unnamed_r);

/* One message row with what its inode says. */
struct dbox_check_msg {
	uint64_t ino;
	uint32_t nlink;
	uint64_t size;          /* plaintext bytes (inode size) */
	struct dbox_msgloc loc;
};

/* Called per message by dbox_index_check_messages; may call other index
   functions.  Return 0 to go on, non-zero to stop (returned). */
typedef int dbox_check_msg_cb_t(void *ctx, const struct dbox_check_msg *msg);

/* Every message row (both states), ordered by (file_id, offset).  Returns
   0, the callback's non-zero value, or a negative errno. */
int dbox_index_check_messages(struct dbox_index *index,
			      dbox_check_msg_cb_t *cb, void *ctx);

/* Called per plain-file inode number by dbox_index_check_files. */
typedef int dbox_check_ino_cb_t(void *ctx, uint64_t ino);

/* Every plain-file inode (STORE/files/<ino> must exist), ascending.
   Returns 0, the callback's non-zero value, or a negative errno. */
int dbox_index_check_files(struct dbox_index *index,
			   dbox_check_ino_cb_t *cb, void *ctx);

/* The path of inode ino from the root ("/.Sent/cur/1.host:2,S"; one of
   its names when it has several; "(no name)" when it has none), for
   messages.  Non-printable bytes are written as \xNN.  malloc()ed into
   *path_r.  Returns 0 or a negative errno. */
int dbox_index_check_path(struct dbox_index *index, uint64_t ino,
			  char **path_r);

#endif
