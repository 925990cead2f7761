#ifndef DBOXFS_REBUILD_H
#define DBOXFS_REBUILD_H

/*
 * rebuild: make a new index from the m.N files, as Dovecot's `doveadm
 * force-resync` rebuilds its map (dovecot/core 2.3.21
 * mdbox-storage-rebuild.c; docs/dbox-format.md section 12), keeping what
 * the old index still knows.  The store must not be mounted: rebuild
 * takes the store lock.
 *
 *  1. The old index.sqlite (with -wal, -shm) is moved aside as
 *     index.sqlite.broken-<UTC time>; it is never deleted.  From then on
 *     a mount refuses the store until the rebuild finished.
 *  2. Whatever rows of the old index can be read are salvaged
 *     (index/index-rebuild.h).  Without index.sqlite (a rebuild cut
 *     short), the newest index.sqlite.broken-* is read instead.
 *  3. Every m.N of storage/ and of the alternate storage is scanned for
 *     whole records (rebuild-scan.c), damaged files too; bytes that are no
 *     whole record are copied to lost+found/.  Every m.N is entered with
 *     its whole size as committed end, so the next mount cuts nothing.
 *  4. The old messages are matched to records by location and GUID, else
 *     by GUID alone (rebuild-match.c), and the old tree is rebuilt from
 *     the root down - names (so flags), hard links, modes, owners, mtimes,
 *     inode numbers, symlink targets, device numbers, extended attributes
 *     (rebuild-tree.c).  A message whose record is still at its old
 *     location with a damaged field keeps its names; the damage is
 *     reported.
 *  5. Records no old message claims are restored (rebuild-restore.c)
 *     into the cur/ of their B folder (engine/maildir.h), unless the old
 *     index was read whole and either knew them (expunged messages
 *     waiting for purge) or says an import was killed before it
 *     finished (DBOX_META_IMPORT_RUNNING: the records it does not know
 *     are that import's uncommitted work, which the import run again
 *     imports); restore_all restores both kinds anyway.  Named
 *     "<R>.G<GUID>.rebuild:2," with the received date R as mtime; one
 *     message per GUID.
 *  6. Plain files in files/ that no old plain file claims go to
 *     lost+found/.
 *  7. The new index is written as index.sqlite.rebuilding and renamed to
 *     index.sqlite only when complete and on disk.
 *
 * Nothing in storage/ is changed; files/ only when a lost plain file's
 * number is taken (it is renamed to its new number).  The engine prints
 * nothing: what it did and every problem it met are in the report.
 */

#include "engine/lost-found.h"
#include "storage/dbox-fault.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct dbox_rebuild_opts {
	/* The alternate storage (an absolute path) whose storage/m.N are
	   scanned too, or NULL: the one the index to be replaced recorded. */
	const char *alt_path;
	/* Restore records the old index knew as expunged too. */
	bool restore_all;
	/* Called after each whole record found (may be NULL): one record
	   of record_bytes bytes. */
	void (*progress)(void *ctx, uint64_t record_bytes);
	void *progress_ctx;
};

/* Where a rebuild stopped (struct dbox_rebuild_report.stage). */
enum dbox_rebuild_stage {
	DBOX_REBUILD_DONE = 0,
	DBOX_REBUILD_OPEN_STORE,   /* STORE cannot be opened */
	DBOX_REBUILD_NO_STORAGE,   /* STORE has no storage/ */
	DBOX_REBUILD_LOCK,         /* the store lock (-EBUSY: mounted) */
	DBOX_REBUILD_FILES,        /* files/ cannot be opened */
	DBOX_REBUILD_ALT_UNKNOWN,  /* the old index has alt_files m.N in an
				      ALT whose path it does not record */
	DBOX_REBUILD_ALT_OPEN,     /* the ALT (alt_path) cannot be opened */
	DBOX_REBUILD_NEWER_INDEX,  /* index.sqlite is of a newer format */
	DBOX_REBUILD_RUN,          /* the rebuild itself failed: the store is
				      left without index.sqlite */
};

/* What kind of problem a note reports. */
enum dbox_rebuild_note_kind {
	DBOX_REBUILD_NOTE_BAD_BYTES,     /* bytes of an m.N that are no whole
					    record; copy names the copy kept
					    in lost+found/ ("" when none
					    could be kept) */
	DBOX_REBUILD_NOTE_DAMAGED_FIELD, /* a message kept under its names
					    whose record has a damaged field
					    (GUID, metadata, message header) */
	DBOX_REBUILD_NOTE_SIZE,          /* a body size taken as stored */
	DBOX_REBUILD_NOTE_MFILE,         /* an m.N left out or read in part */
	DBOX_REBUILD_NOTE_FOLDER,        /* a B folder without a Maildir++
					    name: its messages go to INBOX */
	DBOX_REBUILD_NOTE_FILES,         /* something in files/ left alone */
};

/* One problem rebuild met and what it did about it. */
struct dbox_rebuild_note {
	enum dbox_rebuild_note_kind kind;
	uint32_t file_id;          /* the m.N, or 0 */
	struct dbox_fault fault;   /* offset in the m.N and a short reason
				      ("damaged GUID field") */
	char copy[DBOX_LOST_FOUND_NAME_SIZE]; /* BAD_BYTES: "m.N-<start>" (or
				      with a ".K" suffix) in lost+found/,
				      or "" */
	char *text;                /* one line for people (with the m.N, the
				      bytes read escaped), malloc()ed */
};

/* What a rebuild did (counts) and the problems it met. */
struct dbox_rebuild_report {
	enum dbox_rebuild_stage stage; /* DBOX_REBUILD_DONE when rebuilt */
	char *old_index;          /* the name (in STORE) the old index is kept
				     as, or NULL when there was none */
	bool old_index_earlier;   /* no index.sqlite: old_index is the newest
				     one an earlier rebuild kept, read again */
	bool old_damaged;         /* it opened but was not read whole */
	int index_format;         /* the index format this dboxfs writes
				     (NEWER_INDEX: the old one is above) */
	char *alt_path;           /* the alternate storage used, or NULL */
	char *compress;           /* the old index's recorded compression
				     (DBOX_SETTING_COMPRESS), carried into
				     the new one, or NULL */
	unsigned long alt_files;  /* m.N the old index has in the ALT */
	unsigned long mfiles;     /* m.N scanned */
	unsigned long damaged_mfiles; /* m.N whose file header is damaged */
	unsigned long kept;       /* messages kept with their names */
	unsigned long names;      /* names of the old tree kept */
	unsigned long restored;   /* messages restored with new names */
	unsigned long unknown_restored; /* of them, past the old index's end
					   of their m.N (it did not know them) */
	bool import_killed;       /* the old index says an import was killed
				     before it finished
				     (DBOX_META_IMPORT_RUNNING): records it
				     does not know are that import's
				     uncommitted work */
	unsigned long import_left; /* such records not restored (when the old
				      index was read whole, without
				      restore_all): the import run again
				      imports them; they wait for purge */
	unsigned long unplaced_restored; /* of them, messages of the old
					    index whose names could not be
					    placed (their folder unreachable,
					    a name no directory can hold) */
	unsigned long duplicates; /* records of a GUID already placed */
	unsigned long expunged;   /* records left for purge */
	unsigned long damaged_kept; /* messages kept with a damaged field */
	unsigned long lost_msgs;  /* old messages without a whole record */
	unsigned long acked_empty; /* old messages a close acknowledged
				      empty while they were written on
				      (DBOX_META_ACKED_EMPTY): their empty
				      version has no record, so rebuild
				      keeps their version before or loses
				      them; a mount's recovery first stores
				      them empty */
	unsigned long lost_files; /* old plain files without files/<ino>,
				     symlinks without target */
	unsigned long lost_names; /* old names that could not be kept */
	unsigned long orphans;    /* plain files put in lost+found/ */
	unsigned long lost_found_copies; /* byte ranges copied there */
	struct dbox_rebuild_note *notes; /* in the order met */
	size_t nnotes;
};

/* Rebuild the index of the store at store (a directory) as described
   above.  *report is filled in (zero it first; free it with
   dbox_rebuild_report_free) whether it succeeds or not: report->stage
   says where it stopped.  New inodes belong to the owner of store.
   Returns 0 when rebuilt, or a negative errno: what opening failed with
   (-ENOENT, -ENOTDIR, -ELOOP for files/ a symbolic link, -EBUSY when the
   store is in use), -EPERM for an ALT of another owner,
   -EPROTO for an index of a newer format or an ALT the old index does not
   name, -ENOMEM, -EIO, -ENOSPC. */
int dbox_rebuild(const char *store, const struct dbox_rebuild_opts *opts,
		 struct dbox_rebuild_report *report);

/* Free what *report holds and zero it. */
void dbox_rebuild_report_free(struct dbox_rebuild_report *report);

#endif
