#ifndef DBOXFS_INDEX_BACKUP_H
#define DBOXFS_INDEX_BACKUP_H

/*
 * index-backup: copy an index as it is at one instant, with SQLite's
 * online backup API (sqlite3_backup_init/step/finish), while a mounted
 * dboxfs goes on committing - the index half of `dboxadm backup`.
 *
 * The copy and the lists in struct dbox_index_snapshot come from ONE read
 * snapshot (the lists are read from the copy): the m.N files with their
 * committed ends and the plain files listed are exactly those the copied
 * index refers to.  Reads only; never
 * touches m.N or plain files.
 *
 * Return convention as in index.h (0, or a negative errno; -EIO for a
 * SQLite error, logged).
 */

#include "index.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One storage/m.N of the snapshot: its committed end (bytes; 0 for a
   negative one) and the end of the last committed record the index names
   in it (0: none).  In a sound index records_end <= size; a larger one
   is a damaged index (or one its owner wrote so). */
struct dbox_snapshot_mfile {
	uint32_t file_id;
	uint64_t size;
	uint64_t records_end;
	bool size_bad;         /* the row's size was negative */
};

/* What one snapshot of the index refers to.  Arrays malloc()ed, sorted
   ascending; freed by dbox_index_snapshot_free(). */
struct dbox_index_snapshot {
	struct dbox_snapshot_mfile *mfiles;
	size_t nmfiles;
	uint64_t *files;       /* plain-file inodes with a name (STORE/files/<ino>) */
	size_t nfiles;
	uint64_t messages;     /* committed messages (message rows) */
};

/* Copy the index src (opened without the store lock: dbox_index_open +
   dbox_index_reader_setup) to a new SQLite file at dest_path (must not
   exist; created with mode 0600) as one snapshot, and fill
   *snap_r with what that snapshot refers to.  The copy is complete and on
   disk (SQLite's synchronous commit) when this returns 0.  When src is
   inside a read transaction (dbox_index_snapshot_begin), the copy is that
   snapshot; else it is the index at one instant during the call.  Returns 0, -EEXIST when dest_path
   exists, -ENOMEM, or -EIO (logged). */
int dbox_index_backup(struct dbox_index *src, const char *dest_path,
		      struct dbox_index_snapshot *snap_r);

/* Make the copied index (opened with dbox_index_open, so at the current
   format) describe a self-contained store whose m.N are all in its own
   storage/, in one transaction: every mfile row's alt flag cleared and
   the alternate storage path and id (DBOX_SETTING_ALT_PATH, _ALT_ID:
   the copy, given an ALT of its own, marks a new one) forgotten, as the
   backup copies ALT/storage/m.N into DEST/storage/; the crash-recovery
   marks inflight.m.N, kept.m.N and uncut.m.N deleted, as each m.N is copied only up
   to its committed end (nothing is in flight in the copy, and whole
   records a recovery of the source kept past that end are not in it).
   purged.m.N stay (those numbers are still not the copy's files).
   Returns 0 or -EIO (logged). */
int dbox_index_backup_detach(struct dbox_index *index);

/* Free the arrays of *snap and zero it.  Safe on a zeroed struct. */
void dbox_index_snapshot_free(struct dbox_index_snapshot *snap);

#endif
