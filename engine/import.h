#ifndef DBOXFS_IMPORT_H
#define DBOXFS_IMPORT_H

/*
 * import: a Maildir++ tree copied into a store that is not mounted, as
 * the mount itself would have stored it (`dboxadm import`):
 *
 *   regular file in a cur/ new/ tmp/, name not starting with '.'
 *       -> a message: bytes in a new record of an m.N (save-fd.h), inode
 *          of kind MESSAGE, size = bytes, mtime/atime = the file's (ns),
 *          received date R = mtime seconds, B = the folder's mailbox name
 *          (engine/maildir.h)
 *   any other regular file (dovecot-uidlist, .mbsyncstate, maildirfolder)
 *       -> a plain file: bytes in STORE/files/<ino>, times kept
 *   directory -> directory; at the end its mtime/ctime = the source's
 *   second name of one source inode (a hard link) -> a second name
 *   symlink -> a symlink inode, target kept byte for byte (never followed)
 *   fifo, socket, device -> a special inode with its mode and rdev
 *       (devices only with keep_owner: root, as mknod(2) on the mount)
 *
 * Names are kept byte for byte, permission bits in the index mode, with
 * keep_owner the owner too (as cp -a does), and the user.* extended
 * attributes of files and directories.  Work is committed in batches of
 * DBOX_IMPORT_BATCH items; before each commit the m.N files written in
 * the batch (and files/) are synced, so the index never points at bytes
 * not on disk.
 *
 * A name already in the store with the same bytes counts as present and
 * is skipped (a resumed import); with other bytes it fails.  Failure of
 * one item (unreadable, another file of that name, disk full) undoes that
 * item alone and the import goes on.  An index failure stops the import:
 * the current batch is rolled back.  A stop asked for by the caller
 * (ops->stop) commits what was imported so far.
 *
 * Nothing is printed: what happens to single items reaches the caller as
 * notes (struct dbox_import_note), the totals as counts.
 */

#include "engine/store.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* Items (messages, files, links, directories) per transaction. */
#define DBOX_IMPORT_BATCH 1000

/* What happened to one item, for the caller to report. */
enum dbox_import_note_kind {
	DBOX_IMPORT_FAILED,     /* not imported: step `what` ("" for the
				   item itself) failed with err */
	DBOX_IMPORT_DIFFERENT,  /* the name is in the store with other bytes:
				   not imported */
	DBOX_IMPORT_OTHER_KIND, /* the name is in the store as another kind
				   of file: not imported */
	DBOX_IMPORT_SKIPPED,    /* a device without keep_owner (or another
				   type the store cannot hold): mode */
	DBOX_IMPORT_IS_STORE,   /* the store's own directory: skipped */
	DBOX_IMPORT_LINKS_LOST, /* out of memory: its other hard links are
				   imported as copies */
	DBOX_IMPORT_TIME_LOST,  /* out of memory: its mtime is not restored */
	DBOX_IMPORT_INDEX,      /* the index failed at step `what` with err:
				   the import stops, the batch is rolled
				   back (noted once) */
	DBOX_IMPORT_SYNC,       /* syncing storage/ before a commit failed
				   with err: the import stops */
	DBOX_IMPORT_DIR_TIMES,  /* restoring the directories' times failed
				   with err (everything else is committed) */
};

struct dbox_import_note {
	enum dbox_import_note_kind kind;
	const char *path;  /* the source path of the item (valid during the
			      call) */
	const char *what;  /* the step that failed, or "" */
	int err;           /* a positive errno, or 0 */
	mode_t mode;       /* the source's st_mode (DBOX_IMPORT_SKIPPED) */
};

/* The caller's side of an import; every member may be NULL. */
struct dbox_import_ops {
	void (*note)(void *ctx, const struct dbox_import_note *note);
	/* messages (0 or 1) and bytes just imported */
	void (*progress)(void *ctx, unsigned int messages, uint64_t bytes);
	/* true: stop now (a signal), committing what was imported */
	bool (*stop)(void *ctx);
	void *ctx;
};

/* Totals of one import. */
struct dbox_import_counts {
	unsigned long messages, files, dirs_made, linked; /* made */
	unsigned long others;   /* symbolic links, FIFOs, sockets, devices */
	unsigned long present;  /* same name, same bytes: skipped */
	unsigned long renamed;  /* of present: a message found under another
				   name (its unique name with other flags, in
				   the folder's cur/ or new/): a client renamed
				   it on the mount since the last import */
	unsigned long skipped;  /* types not imported, the store itself */
	unsigned long failed;   /* items not imported (noted) */
};

/* Import the tree of source directory srcfd (named src in notes) into
   the root of the store st (opened read-write, not mounted: this process
   holds STORE/lock, store-lock.h).  A store root that holds nothing yet takes the
   source root's mode, owner and times.  keep_owner: keep the source's
   uid/gid (root), else the caller's.  The source must not be inside the
   store (the caller checks; its directory is skipped if met).  Takes
   st->lock for the run (the caller must not hold it) and needs no
   transaction open.  Returns 0 (also when single items failed: see
   counts), or a negative errno: -EIO after an index failure or a failed
   sync (noted; the last batch rolled back), -ENOMEM, or what reading the
   store root or the final commit gave. */
int dbox_import_maildir(struct dbox_store *st, int srcfd, const char *src,
			bool keep_owner, const struct dbox_import_ops *ops,
			struct dbox_import_counts *counts_r);

/* Does source directory fd hold a cur/, new/ or tmp/ directory, at any
   depth up to 64 (symbolic links not followed)?  A tree without one is
   not a maildir: importing it would make no message.  Unreadable
   directories count as not holding one.  fd's offset is not moved. */
bool dbox_import_is_maildir(int fd);

#endif
