#ifndef DBOXFS_IMPORT_PRIVATE_H
#define DBOXFS_IMPORT_PRIVATE_H

/*
 * import-private: the state of one maildir import (engine/import.h),
 * shared by import-tree.c (the walk of the source tree) and
 * import-item.c (one file, link or batch).  Not for other callers.
 */

#include "engine/import.h"
#include "engine/inomap.h"

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
	struct dbox_import_counts *counts;
	struct inomap links;         /* source (st_dev, st_ino) -> ino */
	bool keep_owner;             /* keep source uid/gid */
	dev_t store_dev;             /* the store directory, never imported */
	ino_t store_ino;

	/* The current transaction. */
	unsigned int batch;          /* items in it */
	uint32_t *touched;           /* m.N ids written in it */
	size_t ntouched, touched_size;
	uint64_t *new_files;         /* plain-file inodes created in it */
	size_t nnew_files, new_files_size;

	struct import_dir_time *dirs;
	size_t ndirs, dirs_size;

	/* The source path of the current item: root, then names. */
	const char *root;
	const char **names;
	size_t depth, names_size;
	char *path;                  /* built for a note */

	char *buf;                   /* IMPORT_CMP_SIZE bytes for compares */
	bool fatal;                  /* index failure: stop, roll back */
};

#define IMPORT_CMP_SIZE (512 * 1024)

/* import-item.c */
const char *import_path(struct dbox_import *imp);
void import_note(struct dbox_import *imp, enum dbox_import_note_kind kind,
		 const char *what, int err);
void import_item_failed(struct dbox_import *imp, const char *what, int err);
void import_index_failed(struct dbox_import *imp, const char *what, int err);
int import_batch_commit(struct dbox_import *imp, bool final);
void import_batch_rollback(struct dbox_import *imp);
void import_batch_item(struct dbox_import *imp);
int import_check_free(struct dbox_import *imp, uint64_t dir,
		      const char *name, struct dbox_attr *attr_r);
uint32_t import_uid(const struct dbox_import *imp, const struct stat *sb);
uint32_t import_gid(const struct dbox_import *imp, const struct stat *sb);
void import_remember_link(struct dbox_import *imp, const struct stat *sb,
			  uint64_t ino);
void import_xattrs(struct dbox_import *imp, int fd, uint64_t ino);
void import_message(struct dbox_import *imp, int fd, const struct stat *sb,
		    uint64_t dir, const char *name, const char *mailbox);
void import_file(struct dbox_import *imp, int fd, const struct stat *sb,
		 uint64_t dir, const char *name);
void import_link(struct dbox_import *imp, uint64_t ino, uint64_t dir,
		 const char *name);
void import_present(struct dbox_import *imp, int fd, const struct stat *sb,
		    const struct dbox_attr *attr);

#endif
