#ifndef DBOXFS_STATS_H
#define DBOXFS_STATS_H

/*
 * stats: what a store holds and what purge could give back, for dboxadm
 * stats.  The index is read inside one snapshot (index/index-stats.h
 * asks it the SQL questions); storage/ and the alternate storage are
 * listed after it (dbox_view_mfile_walk), so on a busy mount the byte
 * split is approximate (dead bytes are clamped at 0).  Bytes are bytes.
 */

#include "engine/view.h"
#include "index/index-purge.h"
#include "index/index-stats.h"

#include <stdbool.h>
#include <stdint.h>

/* The folder of messages whose directory is no cur/, new/ or tmp/. */
#define DBOX_STATS_OUTSIDE_MAILDIR "(outside cur/new/tmp)"

/* Messages of one folder (a Maildir++ mailbox). */
struct dbox_stats_folder {
	char *name;       /* mailbox name as stored: components in modified
			     UTF-7 ("INBOX", "A/B") */
	char *display;    /* its UTF-8 form for people; name itself when it
			     is not modified UTF-7, or when two folders would
			     show the same */
	uint64_t count;   /* message names in its cur/, new/ and tmp/ */
};

/* One m.N, on disk and in the index. */
struct dbox_stats_mfile {
	uint32_t file_id;
	uint64_t bytes;         /* on disk (0: missing) */
	uint64_t header_bytes;  /* its file header line */
	bool in_index;          /* the index knows it (usage is valid) */
	bool alt;               /* in the alternate storage (one missing on
				   disk: where the index places it) */
	struct dbox_file_usage usage;
};

struct dbox_stats {
	struct dbox_index_stats ix;  /* the index's totals */
	uint64_t mfiles, mfile_bytes;/* m.N on disk (regular files) */
	uint64_t disk_bytes;         /* their allocated blocks */
	uint64_t alt_mfiles, alt_bytes; /* of those, in the alternate storage */
	/* m.N the index knows that are not on disk (deleted, or in an
	   alternate storage that is not available), with the bytes the index
	   counts in them (their committed ends); their messages cannot be
	   read. */
	uint64_t missing_mfiles, missing_bytes;
	uint64_t missing_alt_mfiles; /* of those, placed in the ALT storage */
	uint64_t header_bytes;       /* their file header lines */
	uint64_t pending_bytes;      /* past the committed ends: a write in
					progress, or a crash's leftovers */
	uint64_t dead_bytes;         /* in no live record nor header:
					reclaimable by purge */
	/* Totals of every purge so far (index meta, engine/purge.h). */
	int64_t purge_runs, purge_freed, purge_files, purge_end_ns;
	int64_t purge_moved, purge_records;
	bool purge_moved_known;      /* moved/records recorded (or no purge) */
	struct dbox_stats_folder *folders; /* sorted by display, empty
					      folders too */
	size_t nfolders;
	struct dbox_stats_mfile *files;  /* by file_id, when asked for */
	size_t nfiles;
};

/* Gather *st (zeroed first) for the view's store; per_file also fills
   files[] (every m.N on disk or in the index).  Returns 0, or a negative
   errno (-EIO: the index; -ENOMEM; storage/ unreadable); free *st with
   dbox_stats_free either way. */
int dbox_stats_get(struct dbox_view *view, bool per_file, struct dbox_stats *st);

/* Free what dbox_stats_get allocated in *st. */
void dbox_stats_free(struct dbox_stats *st);

/* Dead bytes of one m.N: committed bytes after its header that no live
   message record uses (all but the header when the index does not know
   the file). */
uint64_t dbox_stats_mfile_dead(const struct dbox_stats_mfile *m);

#endif
