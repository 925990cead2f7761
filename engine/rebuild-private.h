#ifndef DBOXFS_REBUILD_PRIVATE_H
#define DBOXFS_REBUILD_PRIVATE_H

/*
 * rebuild-private: the state one rebuild shares between its files
 * (engine/rebuild.h says what each step does):
 *
 *   rebuild.c          the run: store, lock, the old and new index files
 *   rebuild-scan.c     storage/m.N read into records (every call into
 *                      storage/'s parsers is there)
 *   rebuild-match.c    old messages matched to records
 *   rebuild-tree.c     the old tree put back
 *   rebuild-restore.c  records nobody claims put into their B folder,
 *                      lost plain files into lost+found/
 */

#include "engine/rebuild.h"
#include "index/index-rebuild.h"
#include "index/index.h"
#include "storage/dbox-format.h"

#include <sys/types.h>
#include <time.h>

/* One whole record found in storage/. */
struct rrec {
	uint32_t file_id;
	uint64_t offset, body_size, record_size;
	uint64_t plain_size, vsize;
	time_t received;
	char guid[DBOX_GUID_HEX_LEN * 2 + 1];
	char *mailbox;           /* B, or NULL */
	struct dbox_owner owner; /* A (an fsync's seal), or unset */
	bool claimed;            /* by a message row of the old index */
	bool live;               /* ... whose inode had links (not one
				    unlinked while open) */
	bool placed;             /* in the new index */
};

/* A B folder's cur/ in the new index. */
struct rfolder {
	char *mailbox;
	uint64_t cur;
};

struct rebuild {
	const char *store;
	const struct dbox_rebuild_opts *opts;
	struct dbox_rebuild_report *rep;
	int dir_fd, storage_fd, files_fd;
	int alt_fd;              /* ALT/storage, or -1 */
	char alt_id[33];         /* its id for the new index (engine/
				    alt-mark.h), or "" */
	int lock_fd;             /* the store lock, held */
	size_t notes_size;       /* allocated of rep->notes */
	uid_t uid;               /* owner of STORE: owner of new inodes */
	gid_t gid;
	struct dbox_index *index; /* the new one */
	struct dbox_salvage *old;

	struct rrec *recs;       /* in (file_id, offset) order */
	size_t nrecs, recs_size;
	size_t *by_guid;         /* indices of recs, by GUID */
	size_t *msg_rec;         /* old->msgs[i] -> recs index or SIZE_MAX */
	uint8_t *placed;         /* old->inodes[i]: 0 not yet, 1 placed,
				    2 lost */
	struct rfolder *folders;
	size_t nfolders;
	uint64_t lost_found;     /* lost+found/ ino, 0 until made */

	int walk_err;            /* what stopped a dbox_dir_walk, or 0 */
	int scan_fd;             /* the m.N being scanned */
	uint32_t scan_id;
};

/* rebuild.c: add a note to the report (see struct dbox_rebuild_note):
   reason is the short reason, fmt the line for people.  Returns the note
   (its copy is the caller's to fill) or NULL when out of memory (the
   problem then goes unreported; the rebuild goes on). */
struct dbox_rebuild_note *rebuild_note(struct rebuild *rb,
				       enum dbox_rebuild_note_kind kind,
				       uint32_t file_id, uint64_t offset,
				       const char *reason, const char *fmt, ...)
	__attribute__((format(printf, 6, 7)));

/* rebuild-scan.c: scan every m.N (of storage/ and the alternate storage)
   in id order into rb->recs, entering each in the new index.  Returns 0
   or a negative errno. */
int rebuild_scan_storage(struct rebuild *rb);

/* rebuild-scan.c: is the record of old message m whole in length in its
   m.N (storage/, else ALT) at the location the old index gives?  Then 1,
   and *header_ok_r says whether its message header still parses with the
   body size the index had; else 0. */
int rebuild_record_in_place(struct rebuild *rb,
			    const struct dbox_salvage_msg *m,
			    bool *header_ok_r);

/* rebuild-tree.c: the index in rb->old->inodes of inode ino, or
   SIZE_MAX. */
size_t rebuild_old_inode(const struct rebuild *rb, uint64_t ino);

/* rebuild-match.c: match the old messages to records (rb->msg_rec,
   rb->by_guid).  Returns 0 or -ENOMEM. */
int rebuild_match_old(struct rebuild *rb);

/* rebuild-match.c: whether old message m, claimed by no record, is still
   in place with a damaged field (reported when it is). */
bool rebuild_damaged_in_place(struct rebuild *rb,
			      const struct dbox_salvage_msg *m);

/* rebuild-match.c: GUIDs compared as the index keeps them (the first 32
   characters), as strcmp: <0, 0 or >0. */
int rebuild_guid_cmp(const char *a, const char *b);

/* rebuild-match.c: the index location of a committed message. */
void rebuild_loc(uint32_t file_id, uint64_t offset, uint64_t body_size,
		 uint64_t record_size, uint64_t vsize, const char *guid,
		 struct dbox_msgloc *loc_r);

/* rebuild-tree.c: put the old tree back from the root down, then the
   extended attributes of what was placed.  Returns 0 or a negative
   errno. */
int rebuild_tree(struct rebuild *rb);

/* rebuild-restore.c: the cur/ of mailbox (B; NULL or "" for INBOX),
   made with new/ tmp/ (and maildirfolder for a Maildir++ folder) when
   missing.  Returns 0 or a negative errno. */
int rebuild_folder_cur(struct rebuild *rb, const char *mailbox,
		       uint64_t *cur_r);

/* rebuild-restore.c: every record no message of the new index has, one
   per GUID, into its folder (or counted as expunged or duplicate).
   Returns 0 or a negative errno. */
int rebuild_restore_unclaimed(struct rebuild *rb);

/* rebuild-restore.c: plain files of files/ no plain file of the new
   index owns, into lost+found/.  Returns 0 or a negative errno. */
int rebuild_adopt_orphans(struct rebuild *rb);

/* rebuild-restore.c: the directory name in parent, made (0700, the
   store's owner) when missing.  Returns 0, -ENOTDIR when name is not a
   directory, or a negative errno. */
int rebuild_mkdir(struct rebuild *rb, uint64_t parent, const char *name,
		  uint64_t *ino_r);

#endif
