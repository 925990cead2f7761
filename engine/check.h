#ifndef DBOXFS_CHECK_H
#define DBOXFS_CHECK_H

/*
 * check: verify a store without changing anything, and hand every problem
 * found to the caller as data (`dboxadm check` prints them).
 *
 *   index.sqlite  SQLite's integrity check; the namespace invariants
 *                 (index/index-check.h): names, link counts, directories,
 *                 message rows, committed ends
 *   storage/m.N   every file scanned record by record (storage/
 *                 dbox-scan.h): bytes that are no whole record are
 *                 reported with storage/'s reason; each committed message
 *                 of the index must have its record at its offset with
 *                 the same body size, record size, GUID, V (virtual size)
 *                 and plaintext size (Z, or the body size of an
 *                 uncompressed body); every compressed body is decoded to
 *                 its end; files shorter than their committed end; m.N
 *                 files the index does not know; bytes past a committed
 *                 end judged as the next mount's crash recovery judges
 *                 them (engine/store.c)
 *   files/        every plain file of the index has its regular file
 *                 STORE/files/<ino>, and every file there belongs to one
 *   lost+found/   the copies crash recovery kept (notes)
 *
 * Offline (nobody holds the store lock) check holds the lock shared, so
 * no mount starts meanwhile, and everything is checked.  While the store
 * is mounted (engine/store-lock.h: the lock is held by another process)
 * it reads one snapshot of the index (engine/view.h) and each m.N up to
 * the committed end of that snapshot; what a live mount is in the middle
 * of is not checked.  States crash recovery cleans up at the next mount
 * are notes, not problems.
 *
 * Nothing is printed; storage/'s reasons arrive as struct dbox_fault
 * (storage/dbox-fault.h) and are passed on in each item.  Opening the
 * index may log (engine/view.h).
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum dbox_check_severity {
	DBOX_CHECK_PROBLEM,   /* something is wrong or lost */
	DBOX_CHECK_NOTE,      /* cleaned up by the next mount, or harmless */
};

enum dbox_check_kind {
	DBOX_CHECK_INDEX,       /* index.sqlite missing or unreadable, SQLite
				   integrity, namespace invariants */
	DBOX_CHECK_PENDING,     /* messages being written, files without a
				   name left */
	DBOX_CHECK_STORAGE,     /* storage/ or the alternate storage cannot
				   be opened */
	DBOX_CHECK_MFILE,       /* an m.N as a file: missing, not a regular
				   file, in two places, shorter than its
				   committed end, unknown to the index, bad
				   file header line */
	DBOX_CHECK_REGION,      /* bytes [offset, end) of an m.N that are no
				   whole record */
	DBOX_CHECK_TAIL,        /* bytes of an m.N after its committed end */
	DBOX_CHECK_MESSAGE,     /* a message of the index against its record */
	DBOX_CHECK_BODY,        /* a compressed body that does not decode */
	DBOX_CHECK_PLAIN_FILE,  /* files/<ino> against the plain files */
	DBOX_CHECK_LOST_FOUND,  /* a copy kept in lost+found/ */
};

/* One thing found.  Pointers are valid during the report call only. */
struct dbox_check_item {
	enum dbox_check_severity severity;
	enum dbox_check_kind kind;
	uint32_t file_id;     /* the m.N concerned, or 0 */
	uint64_t offset;      /* byte offset in it: the record (MESSAGE,
				 BODY), the start (REGION, TAIL); else 0 */
	uint64_t end;         /* end of the bytes (REGION, TAIL), or 0 */
	uint64_t ino;         /* the inode (MESSAGE, BODY, PLAIN_FILE), or 0 */
	const char *reason;   /* storage/'s reason (struct dbox_fault), or "" */
	const char *text;     /* one line for people saying all of it, e.g.
				 "storage/m.1: bytes [40, 90) are no whole
				 record: m.1 offset 40: corrupt message
				 header (bad magic, type or size)" */
};

/* Called for each item, in the order found. */
typedef void dbox_check_report_t(void *ctx, const struct dbox_check_item *item);

/* Called as records are scanned: how many more, and their bytes. */
typedef void dbox_check_progress_t(void *ctx, uint64_t records,
				   uint64_t bytes);

/* What a check covered. */
struct dbox_check_summary {
	bool opened;          /* the store was opened: an error after this
				 stopped the check midway */
	bool mounted;         /* another process holds the store lock: one
				 snapshot was checked */
	uint64_t messages;    /* committed messages of the index checked */
	size_t mfiles;        /* m.N files, in the index or on disk */
	uint64_t records;     /* whole records found in them */
	size_t plain_files;   /* plain files of the index */
	bool import_killed;   /* offline, the index says an import was
				 killed before it finished
				 (DBOX_META_IMPORT_RUNNING, engine/store.h):
				 bytes it does not know are that import's,
				 which the next mount or import cuts and the
				 import run again imports again */
	size_t problems;      /* items of severity DBOX_CHECK_PROBLEM */
	size_t notes;         /* items of severity DBOX_CHECK_NOTE */
};

/* Check the store at path (a directory), calling report (not NULL) for
   every problem and note and progress (may be NULL) as records are
   scanned, both with ctx; *sum (zeroed first) says what was covered.  A
   missing or unreadable index.sqlite next to a storage/ is a problem
   item, not an error.  Returns 0 when the check ran to its end (problems
   or not); before anything is checked (sum->opened false): -ENOENT,
   -ENOTDIR, -EACCES... (the directory), -ENOMEDIUM (no index.sqlite and
   no storage/: not a store), -EPROTO (an index from a newer dboxfs);
   after (sum->opened true): a negative errno that stopped the check
   (-ENOMEM, a read error, -EIO from SQLite). */
int dbox_check_store(const char *path, dbox_check_report_t *report,
		     dbox_check_progress_t *progress, void *ctx,
		     struct dbox_check_summary *sum);

#endif
