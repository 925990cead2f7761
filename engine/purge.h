#ifndef DBOXFS_PURGE_H
#define DBOXFS_PURGE_H

/*
 * purge: give back the bytes of expunged, overwritten (copy-on-write) and
 * abandoned records in storage/m.N files, as Dovecot's `doveadm purge`
 * does for mdbox (mdbox-purge.c; docs/dbox-format.md section 11).
 *
 * Files go in order of their live bytes, fewest first: those with none
 * need no room for copies, so on a full disk they make the room the
 * others need (copies wait while the index reserve is in use, reserve.h).
 *
 * For each m.N with dead bytes: take it out of the append pool, copy its
 * live records verbatim (header + body + metadata, no recompression) to
 * the end of m.N files of the append pool - chosen exactly as a new save
 * chooses them - fdatasync the copies, then in ONE durable index
 * transaction point every message row still at its copied record to the
 * copy and forget the old file, and only then unlink it.  A message's
 * inode, names, size and mtime never change; only its (file, offset).
 * An m.N in the alternate storage (store.h) is purged the same way into
 * new m.N files there (dbox_store_alt_create), so what was moved to ALT
 * stays in ALT.
 *
 * Concurrency: runs beside a mounted, multithreaded dboxfs.  st->lock is
 * taken for the index work only; bytes are copied without it (lock
 * order: engine/store.h; the entry points assert the caller does not
 * hold it).  A message
 * expunged or rewritten while its record was being copied keeps its new
 * state (the copy is garbage); a received date set meanwhile (dbox R
 * rewritten in place) is written into the copy too.  Readers that opened a
 * message before keep their own descriptor of the old m.N (see
 * dbox_store_open_reader) and read the same bytes until they close.
 *
 * Crash safety: the old m.N is unlinked only after the commit that stops
 * referring to it is on disk; copies past an m.N's committed end are cut
 * by recovery when the switch never committed; an old m.N left behind
 * (unknown to the index) is cut by recovery and removed by the next full
 * purge.  Nothing is lost at any point.
 *
 * One purge at a time per store (the caller's job: the daemon has one
 * purge thread, dboxadm holds the store lock).
 */

#include "engine/store.h"

#include <stdbool.h>
#include <stdint.h>

/* Default share of dead bytes (percent) that makes the mount purge a
   sealed m.N by itself (-o purge_threshold). */
#define DBOX_PURGE_DEFAULT_THRESHOLD 50

struct dbox_purge_result;

struct dbox_purge_settings {
	/* Purge an m.N when dead bytes are at least this percent of its
	   bytes after the file header; 0 = any dead byte at all. */
	unsigned int threshold;
	/* Only these files (file ids), or NULL for every m.N.  A full run
	   (NULL) also removes m.N files the index does not know and no save
	   owns: leftovers of a crash after a switch committed. */
	const uint32_t *only;
	size_t only_count;
	/* Leave files of the append pool alone (the automatic purge: a file
	   still taking messages is not "sealed"). */
	bool sealed_only;
	/* Before anything, make sure every committed row names a record
	   inside a known m.N (dbox_index_misplaced_row, one scan of the
	   message table on a read-only connection), else purge nothing and
	   fail with
	   -EUCLEAN: a row a damaged index put elsewhere leaves its real
	   record looking like garbage.  dboxadm's purges set it; the mount's
	   automatic purge, on an index only the mount has changed since it
	   opened it, does not. */
	bool check_rows;
	/* Checked between records: stop (the file being purged is kept
	   whole) when it becomes true. */
	const bool *cancel; /* read atomically; set by another thread */
	/* No info line per file purged or moved (dboxadm, which prints a
	   summary of its own: a cron job mails only a failure); the mount
	   logs them. */
	bool quiet;
	/* Altmove (Dovecot's `doveadm altmove`): instead of purging, copy
	   the committed records received before altmove_before_ns (inode
	   mtime, in the index's time encoding: compared with dbox_time_cmp;
	   INT64_MAX: no age limit), and when altmove_folder is not 0 only those with a
	   name in that folder (the directory or its cur/ new/ tmp/), of
	   every m.N in STORE/storage/ to new m.N files in ALT/storage/ (see
	   dbox_store_alt_create), synced, then switch their rows in one
	   durable transaction per file, exactly as a purge does.  Files are
	   not sealed; an old file is removed when no row is left in it and
	   it takes no new messages; one with rows left keeps dead bytes (see
	   dbox_altmove).  threshold, only and sealed_only are ignored. */
	bool altmove;
	int64_t altmove_before_ns;
	uint64_t altmove_folder;
	/* Test hook: called after a file's records were copied and synced,
	   before the switch, without st->lock. */
	void (*after_copy)(void *ctx, uint32_t file_id);
	/* Called after each file's switch with the counts so far, without
	   st->lock. */
	void (*progress)(void *ctx, const struct dbox_purge_result *res);
	void *hook_ctx;
};

struct dbox_purge_result {
	uint64_t files_purged;     /* m.N removed after their records moved */
	uint64_t files_failed;     /* kept: unreadable record, I/O error */
	uint64_t files_busy;       /* kept: a save owned them */
	uint64_t garbage_files;    /* m.N unknown to the index, removed */
	uint64_t records_moved;    /* records copied and switched */
	uint64_t records_dropped;  /* copied, but changed meanwhile */
	uint64_t bytes_moved;      /* bytes of the records moved */
	uint64_t bytes_freed;      /* bytes of the removed m.N files */
	uint64_t files_partial;    /* altmove: kept, some rows left in it */
	int64_t start_ns, end_ns;  /* CLOCK_REALTIME */
	int error;                 /* what dbox_purge returned */
};

/* Purge the store.  Takes st->lock as needed (the caller must not hold
   it).  Returns 0 when every file was handled (purged, or skipped because
   it needs no purge or a save owns it), -ECANCELED when cancelled, or the
   first error (-EIO, -ENOSPC, ...) after trying the other files; *res_r
   counts what was done in any case.  Errors are logged naming the file. */
int dbox_purge(struct dbox_store *st, const struct dbox_purge_settings *set,
	       struct dbox_purge_result *res_r);

/* Move old messages to the alternate storage (set->altmove must be
   true; see there), then purge the files they left partly dead (every
   m.N with a dead byte in either storage).  Takes st->lock as needed.
   Returns 0, -ENOENT when the store has no usable alternate storage,
   -ECANCELED, or the first error; *res_r counts the moves (records_moved,
   bytes_moved, files_purged: primary files emptied and removed), and
   *purge_r what the purge after it did (NULL: no purge). */
int dbox_altmove(struct dbox_store *st, const struct dbox_purge_settings *set,
		 struct dbox_purge_result *res_r,
		 struct dbox_purge_result *purge_r);

/* Meta keys of a requested altmove (`dboxadm altmove` on a mounted
   store): dboxadm sets the cutoff (ns), the folder (ino, 0 = all) and,
   last, the request time (ns) in one transaction and signals the mount;
   the mount runs dbox_altmove and records DONE = the request time with
   the outcome (error, records and bytes moved, files removed), in one
   durable transaction. */
#define DBOX_META_ALTMOVE_REQUEST "altmove_request_ns"
#define DBOX_META_ALTMOVE_BEFORE "altmove_request_before_ns"
#define DBOX_META_ALTMOVE_FOLDER "altmove_request_folder"
#define DBOX_META_ALTMOVE_DONE "altmove_done_request_ns"
#define DBOX_META_ALTMOVE_ERROR "altmove_done_error"
#define DBOX_META_ALTMOVE_RECORDS "altmove_done_records"
#define DBOX_META_ALTMOVE_BYTES "altmove_done_bytes"
#define DBOX_META_ALTMOVE_FILES "altmove_done_files"
#define DBOX_META_ALTMOVE_FREED "altmove_done_freed"
/* ... and of the purge after it (files_purged + garbage_files,
   bytes_freed, bytes_moved of its dbox_altmove *purged_r). */
#define DBOX_META_ALTMOVE_PURGED_FILES "altmove_done_purged_files"
#define DBOX_META_ALTMOVE_PURGED_FREED "altmove_done_purged_freed"
#define DBOX_META_ALTMOVE_PURGED_COPIED "altmove_done_purged_copied"
/* Progress of the request being run, for dboxadm's progress line: the
   request time it belongs to, records and bytes moved so far (written
   by the mount now and then, without waiting for the disk). */
#define DBOX_META_ALTMOVE_PROGRESS_REQUEST "altmove_progress_request_ns"
#define DBOX_META_ALTMOVE_PROGRESS_RECORDS "altmove_progress_records"
#define DBOX_META_ALTMOVE_PROGRESS_BYTES "altmove_progress_bytes"
/* The altmove request the mount has not run yet, read by the mount
   itself (its own connection; needs st->lock): pending when the request
   time is newer than the last one done.  Returns 1 with *request_ns_r,
   *before_ns_r and *folder_r (see dbox_altmove_request), 0 when nothing
   is pending, or -EIO. */
int dbox_altmove_pending(struct dbox_store *st, int64_t *request_ns_r,
			 int64_t *before_ns_r, uint64_t *folder_r);
/* Record the progress (res so far) of the request made at request_ns;
   takes st->lock.  Returns 0 or -EIO. */
int dbox_altmove_progress(struct dbox_store *st, int64_t request_ns,
			  const struct dbox_purge_result *res);
/* Record the outcome of the request made at request_ns (see above):
   res the move, purged the purge after it; takes st->lock.  Returns 0
   or -EIO. */
int dbox_altmove_record(struct dbox_store *st, int64_t request_ns,
			const struct dbox_purge_result *res,
			const struct dbox_purge_result *purged);

/* Meta keys (dbox_index_meta_get) the purge keeps, for `dboxadm purge`
   waiting on a mount and for `dboxadm stats`: number of runs, the end
   (ns) of the last one, bytes freed and files removed by all runs
   together, and the start (ns) of the last run made on request (a full
   purge asked for by `dboxadm purge`, as opposed to an automatic one).
   dbox_purge_record() adds a result to them in its own durable
   transaction; it takes st->lock.  Returns 0 or -EIO.

   A requested run also leaves its own outcome, in the same transaction
   and so complete once DBOX_META_PURGE_REQUEST_START is there: res->error
   (0 or the negative errno dbox_purge returned), bytes freed and moved,
   files removed, records moved, files failed and files busy. */
#define DBOX_META_PURGE_RUNS "purge_runs"
#define DBOX_META_PURGE_END "purge_last_end_ns"
#define DBOX_META_PURGE_FREED "purge_bytes_freed"
#define DBOX_META_PURGE_FILES "purge_files_removed"
/* Totals of records moved and their bytes, kept since the first run of a
   dboxfs that records them: absent (not 0) in an index purged before,
   whose moved totals are unknown. */
#define DBOX_META_PURGE_MOVED "purge_bytes_moved"
#define DBOX_META_PURGE_RECORDS "purge_records_moved"
#define DBOX_META_PURGE_REQUEST_START "purge_request_start_ns"
#define DBOX_META_PURGE_REQUEST_ERROR "purge_request_error"
#define DBOX_META_PURGE_REQUEST_FREED "purge_request_bytes_freed"
#define DBOX_META_PURGE_REQUEST_MOVED "purge_request_bytes_moved"
#define DBOX_META_PURGE_REQUEST_FILES "purge_request_files_removed"
#define DBOX_META_PURGE_REQUEST_RECORDS "purge_request_records_moved"
#define DBOX_META_PURGE_REQUEST_FAILED "purge_request_files_failed"
#define DBOX_META_PURGE_REQUEST_BUSY "purge_request_files_busy"
/* Add res to the keys above (and, when requested, leave its outcome
   too) in one durable transaction; takes st->lock.  Returns 0 or -EIO. */
int dbox_purge_record(struct dbox_store *st,
		      const struct dbox_purge_result *res, bool requested);

/*
 * The other side: `dboxadm purge` and `dboxadm altmove` asking a mount
 * (the request goes into the index, then the mount is signalled:
 * store-holder.h) and reading the outcome, through a view (view.h) that
 * reads in snapshots without the store lock (engine/purge-meta.c).
 */
struct dbox_view;

/* Has the mount recorded a requested purge that started at since_ns (ns,
   dbox_now_ns) or later?  Read in one snapshot.  Returns 1 with *res_r
   its outcome (error, bytes freed and moved, files removed, records
   moved, files failed and busy), 0 when not yet (*res_r zeroed), or
   -EIO. */
int dbox_purge_request_done(struct dbox_view *view, int64_t since_ns,
			    struct dbox_purge_result *res_r);

/* Ask for an altmove of the records received before before_ns (the
   index's time encoding; INT64_MAX: any age) in folder (an ino from
   dbox_altmove_folder, 0: every folder): the DBOX_META_ALTMOVE_ keys
   written in one durable transaction, the request time last.  *request_ns_r
   is the request time (ns), set in any case.  Returns 0, -EBUSY when
   another request is there that the mount has not run yet (one at a
   time: wait for it, signalling the mount, and ask again), or -EIO. */
int dbox_altmove_request(struct dbox_view *view, int64_t before_ns,
			 uint64_t folder, int64_t *request_ns_r);

/* The state of the altmove requested at request_ns, in one snapshot.
   Returns 1 when done, *res_r its outcome (error, records and bytes
   moved, files removed) and *purged_r the purge's after it (files
   removed, bytes freed and copied); 0 while it runs, *res_r the progress
   the mount recorded (records and bytes moved; 0 before the first); or
   -EIO. */
int dbox_altmove_request_poll(struct dbox_view *view, int64_t request_ns,
			      struct dbox_purge_result *res_r,
			      struct dbox_purge_result *purged_r);

/* The directory ino of folder, a path as on the mount ("INBOX" or "" the
   root, ".Sent" a Maildir++ folder, "a/b" a nested one) or, when no
   directory has that path, a mailbox name as `dboxadm stats` and Dovecot
   show it (UTF-8, "Lists/dboxfs": the Maildir++ folder ".Lists.dboxfs"),
   looked up in index (a view's or an open store's).  Returns 0 and
   *ino_r, or -ENOENT when there is no such directory. */
int dbox_altmove_folder(struct dbox_index *index, const char *folder,
			uint64_t *ino_r);

#endif
