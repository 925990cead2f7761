#ifndef DBOXFS_BACKUP_H
#define DBOXFS_BACKUP_H

/*
 * backup: a consistent copy of a store, mounted or not, that is itself a
 * store (`dboxadm backup STORE DEST [--link-dest=PREV]`).
 *
 * One instant.  The copy holds what the index held at one read snapshot
 * (index/index-backup.h: SQLite's online backup API).  The m.N and plain
 * files that snapshot refers to must still be readable when they are
 * copied, although a purge (the mount's, or `dboxadm purge`) may unlink an
 * m.N the moment a later commit stops referring to it.  So, without any
 * lock:
 *   1. every storage/m.N, ALT/storage/m.N (the alternate storage the
 *      index records) and files/<ino> on disk is opened (O_NOFOLLOW,
 *      regular files only) - an open descriptor keeps an unlinked file
 *      readable (file ids are unique across storage/ and ALT, so an m.N
 *      altmove moves meanwhile is the same file id in the other one);
 *   2. the index is copied as one snapshot;
 *   3. every file the snapshot refers to and step 1 did not see (created
 *      between 1 and 2) is opened now; if one is already gone (created and
 *      purged in that short window), steps 1-3 run again.
 * A file the snapshot refers to existed when the snapshot was taken (the
 * store unlinks an m.N only after the commit that stops referring to it),
 * so it was open after step 1 or is found in step 3.  Should a name have
 * come to mean another file since step 1 (a store reopened hands out the
 * id of a purged last m.N again), the file is opened anew and steps 1-3
 * run again too.  Purge is never blocked, and never blocks the backup.
 * Each m.N is copied up to its committed end in the snapshot (bytes past
 * it belong to writes not committed then); a plain file as it is when
 * copied (plain files are not versioned by the index).  Finally crash
 * recovery runs on the copied index (messages being written at the
 * snapshot instant, and unlinked-while-open files, go), as the first mount
 * of a crashed store would.  DEST is self-contained: ALT m.N are copied
 * into DEST/storage/ and the copy's index forgets the alternate storage;
 * its inflight.m.N and kept.m.N marks go too (dbox_index_backup_detach:
 * every m.N is cut at its committed end, so nothing past it is in flight
 * or kept).  Neither lost+found/ nor index.sqlite-reserve is copied.
 *
 * Never a store that looks whole.  Everything is written into DEST.partial
 * with the index as index.sqlite.partial (so neither dboxfs nor `dboxadm
 * check` takes it for a store); only when every file is on disk is the
 * index renamed, recovered, and DEST.partial renamed to DEST.  A rerun
 * after a kill takes a new snapshot and keeps what the first run already
 * copied and still matches (DEST.partial/backup-manifest).  One backup at
 * a time writes a DEST.partial (dbox_dir_lock_try, store-lock.h).
 *
 * Incremental.  DEST/backup-manifest lists every file copied with the
 * identity of its source (device, inode, size, mtime and ctime in ns) and
 * the length copied.  With a previous backup PREV, an m.N whose source
 * identity is the one PREV's manifest recorded, that was copied whole,
 * and whose ctime was at least DBOX_BACKUP_LINK_AGE_NS older than that
 * backup's start (a write in the same timestamp tick would not move
 * ctime), is hard-linked from PREV instead of copied - if PREV's copy
 * still has the mtime its manifest recorded for it (a mount of PREV
 * rewrites received dates in place).  Any write to the
 * source (an append, the received date rewritten in place by utimens, a
 * cut by recovery) moves its ctime, which the store owner cannot set.
 * The highest m.N of the snapshot is always copied: a mount of the backup
 * appends to that one.  Plain files are always copied: a mount writes them
 * in place.
 *
 * Hostile store.  The caller runs as the store's owner (dboxadm drops
 * root to them first), so DEST must be writable by that owner; files
 * inside STORE are opened with O_NOFOLLOW and fstat()ed to be regular
 * files, lengths never exceed the real file, DEST files are created 0600
 * by this process (no chown, no mode from the store), and nothing in
 * STORE is written.
 *
 * Descriptors.  Steps 1-3 hold one descriptor per m.N and plain file at
 * once (that is what survives a purge); the soft RLIMIT_NOFILE is raised
 * to the hard one first, and running out still fails clearly (-EMFILE
 * logged with the limit; DEST.partial is left for a rerun).
 *
 * Errors are logged (storage/log.h) naming the path; damage of the source
 * reaches the caller as data (struct dbox_backup_damage).
 */

#include "engine/view.h"

#include <stdbool.h>
#include <stdint.h>

/* A file whose ctime is this close to the backup's start may still change
   without its ctime moving (timestamps advance by the kernel's tick). */
#define DBOX_BACKUP_LINK_AGE_NS (2LL * 1000000000)
/* The list of what a backup wrote, in DEST (and DEST.partial). */
#define DBOX_BACKUP_MANIFEST "backup-manifest"

/* Damage of the source store met while backing it up (the backup holds the
   file as it is, or leaves it out; `dboxadm check` on the backup then
   names it, as on the store). */
struct dbox_backup_damage {
	enum {
		DBOX_BACKUP_MISSING,  /* in the index, but no readable regular
					 file: left out */
		DBOX_BACKUP_SHORT,    /* an m.N shorter (have) than its
					 committed end (want): copied as is */
		DBOX_BACKUP_ENDED,    /* ended after have of want bytes while
					 it was copied */
		DBOX_BACKUP_CHANGED,  /* a plain file written while it was
					 copied, every try: the copy may mix
					 old and new bytes (not counted in
					 source_errors) */
		DBOX_BACKUP_INDEX_SHORT, /* the index's committed end of an
					 m.N (have) is short of the records
					 it names there (want): copied up to
					 want, a damaged index */
	} what;
	char kind;                /* 'm': storage/m.<id>, 'f': files/<id> */
	uint64_t id;
	uint64_t have, want;      /* bytes */
};

struct dbox_backup_settings {
	const char *dest;         /* DEST: a new directory (trailing slashes
				     ignored); the work is done in
				     DEST.partial */
	const char *prev;         /* a finished backup to hard-link unchanged
				     m.N from, or NULL */
	/* Appended to the message of DEST or DEST.partial denied (EACCES,
	   EPERM), e.g. why the caller runs as the store's owner; or NULL. */
	const char *denied_hint;
	/* Each file done: files (1) and bytes copied now (may be 0). */
	void (*progress)(void *ctx, uint64_t files, uint64_t bytes);
	/* Each damage of the source. */
	void (*damage)(void *ctx, const struct dbox_backup_damage *damage);
	/* Test hook: called at the named points "opened" (step 1 done),
	   "indexed" (step 2), "snapshot" (steps done), "copied" (a file
	   copied), so a test can purge or kill at an exact step. */
	void (*hook)(void *ctx, const char *point);
	void *ctx;
};

struct dbox_backup_result {
	uint64_t messages;        /* committed messages of the snapshot */
	size_t mfiles, plain_files;   /* files of the snapshot */
	uint64_t copied, linked, kept;   /* files copied, linked from PREV,
					    kept from an interrupted run */
	uint64_t bytes_copied, bytes_linked, bytes_kept;
	unsigned int snapshots;   /* snapshots taken (steps 1-3 runs) */
	unsigned int source_errors;   /* damage counted (see above) */
	bool resumed;             /* an interrupted run's work was found */
	bool prev_missing;        /* set->prev does not exist (warned):
				     nothing was linked */
	bool refused;             /* the failure is a refusal (DEST exists,
				     PREV or DEST.partial no backup of ours,
				     another backup writes it...): nothing
				     was written */
};

/* Back up the store src (opened with dbox_view_open; its index is read
   as one snapshot, its storage/, alternate storage and files/ through
   the view's directories) to set->dest, as described above.  Returns 0
   with DEST in place (*res_r counts; res_r->source_errors > 0 when the
   store has damaged files, each given to set->damage), or a negative
   errno (logged): with res_r->refused -EEXIST (DEST exists), -EBUSY
   (another backup writes DEST.partial), -ENOTEMPTY (DEST.partial is no
   interrupted backup), -EINVAL (PREV is no finished backup; a PREV
   that does not exist is no error: see prev_missing), -ENOTDIR
   (src has no storage/), -ENOMEDIUM (its index.sqlite is no regular
   file), or what opening a directory gave; else the
   backup failed after starting (DEST.partial is left for a rerun):
   -EMFILE (more files than descriptors), -EAGAIN (files kept
   disappearing between snapshots), -EIO, -ENOSPC, ... */
int dbox_backup(struct dbox_view *src, const struct dbox_backup_settings *set,
		struct dbox_backup_result *res_r);

#endif
