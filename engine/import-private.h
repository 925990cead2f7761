#ifndef DBOXFS_IMPORT_PRIVATE_H
#define DBOXFS_IMPORT_PRIVATE_H

/*
 * import-private: the state of one maildir import (engine/import.h),
 * shared by import-tree.c (the walk of the source tree) and
 * import-item.c (one file, link or batch).  Not for other callers.
 */

#include "engine/import.h"
#include "engine/inomap.h"
#include "engine/save-fd.h"

#include <sys/stat.h>

/* A directory whose times (and for the root mode and owner) are set at
   the end, when nothing is created in it any more. */
struct import_dir_time {
	uint64_t ino;
	int64_t mtime_ns, atime_ns;
	bool set_owner_mode;  /* also mode, uid, gid (the root) */
	uint32_t mode, uid, gid;
};

struct dbox_import {
	struct dbox_store *st;
	struct dbox_index *index;    /* st->index */
	const struct dbox_import_ops *ops;
	struct dbox_copy_stop copy_stop; /* ops->stop for save-fd.h */
	struct dbox_import_counts *counts;
	struct inomap links;         /* source (st_dev, st_ino) -> ino */
	bool keep_owner;             /* keep source uid/gid */
	dev_t store_dev;             /* the store directory, never imported */
	ino_t store_ino;

	/* The current transaction. */
	struct dbox_import_counts committed; /* *counts when it began: what
						a rollback leaves made */
	unsigned int batch;          /* items in it */
	uint32_t *touched;           /* m.N ids written in it */
	size_t ntouched, touched_size;
	uint64_t *new_files;         /* plain-file inodes created in it */
	size_t nnew_files, new_files_size;

	struct import_dir_time *dirs;
	size_t ndirs, dirs_size;

	/* Importing into a cur/ or new/ the store had before: that folder's
	   cur/ and new/ (0: none), where a message may be already under
	   another name (import_present_renamed). */
	uint64_t renamed_dirs[2];

	/* The source path of the current item: root, then names. */
	const char *root;
	const char **names;
	size_t depth, names_size;
	char *path;                  /* built for a note */

	char *buf;                   /* IMPORT_CMP_SIZE bytes for compares */
	bool fatal;                  /* index failure: stop, roll back */
};

#define IMPORT_CMP_SIZE (512 * 1024)

/* import-item.c.  Errors of single items are noted (ops->note) and
   counted; index errors set fatal (noted once), after which the caller
   stops and rolls the batch back. */

/* The source path of the current item, for a note (valid until the next
   call; the root when out of memory). */
const char *import_path(struct dbox_import *imp);
/* Send a note of kind about the current item (what: a step, or NULL). */
void import_note(struct dbox_import *imp, enum dbox_import_note_kind kind,
		 const char *what, int err);
/* The current item failed at step what with errno err: noted, counted. */
void import_item_failed(struct dbox_import *imp, const char *what, int err);
/* The index failed at step what with errno err: the import stops. */
void import_index_failed(struct dbox_import *imp, const char *what, int err);
/* Is the message name (source fd, sb) in the store already under its
   unique name with other flags, with the same bytes, in one of
   imp->renamed_dirs?  Then it is counted as present (and renamed) and
   true is returned; the caller imports it otherwise.  Errors of the
   lookup count as not found (an index failure is fatal, noted). */
bool import_present_renamed(struct dbox_import *imp, int fd,
			    const struct stat *sb, const char *name);
/* Sync the m.N files and files/ the batch wrote, then commit it (final:
   durably, and no new transaction).  Returns 0 or a negative errno
   (noted; fatal). */
int import_batch_commit(struct dbox_import *imp, bool final);
/* Roll the batch back with the backing files it created. */
void import_batch_rollback(struct dbox_import *imp);
/* One more item in the batch; commits it at DBOX_IMPORT_BATCH. */
void import_batch_item(struct dbox_import *imp);
/* Is dir/name free in the store?  0 yes; -EEXIST with *attr_r; another
   negative errno after an index failure (noted). */
int import_check_free(struct dbox_import *imp, uint64_t dir,
		      const char *name, struct dbox_attr *attr_r);
/* The owner a new inode gets for source sb: its own (keep_owner) or the
   caller's. */
uint32_t import_uid(const struct dbox_import *imp, const struct stat *sb);
uint32_t import_gid(const struct dbox_import *imp, const struct stat *sb);
/* Source inode sb (with more names) is index inode ino from now on. */
void import_remember_link(struct dbox_import *imp, const struct stat *sb,
			  uint64_t ino);
/* The user.* extended attributes of source fd onto inode ino. */
void import_xattrs(struct dbox_import *imp, int fd, uint64_t ino);
/* Source file fd (sb) as message dir/name saved to folder mailbox. */
void import_message(struct dbox_import *imp, int fd, const struct stat *sb,
		    uint64_t dir, const char *name, const char *mailbox);
/* Source file fd (sb) as plain file dir/name. */
void import_file(struct dbox_import *imp, int fd, const struct stat *sb,
		 uint64_t dir, const char *name);
/* Another name dir/name of inode ino. */
void import_link(struct dbox_import *imp, uint64_t ino, uint64_t dir,
		 const char *name);
/* Source file fd (sb) whose name the store has as attr: present when
   the bytes are the same, else a failed item. */
void import_present(struct dbox_import *imp, int fd, const struct stat *sb,
		    const struct dbox_attr *attr);

#endif
