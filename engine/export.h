#ifndef DBOXFS_EXPORT_H
#define DBOXFS_EXPORT_H

/*
 * export: the walk of a store's namespace for dboxadm export.  Inside one
 * read snapshot of the index (a mounted dboxfs goes on committing), every
 * name below the root is handed to the caller once, directories before
 * and after their contents, each with its attributes and, for a message
 * or plain file, a reader of its bytes: a message's plaintext
 * (decompressed, its record checked whole first) or the backing file
 * STORE/files/<ino>.  What to make of them (the export tree, its owners
 * and modes) is the caller's.
 *
 * The m.N descriptors come from a bounded storage/fd-cache.h cache, so
 * a store with thousands of m.N does not run out of descriptors; only
 * one item's bytes are open at a time.  Opens inside the store never
 * follow a symbolic link.  An m.N of the snapshot that the mount's purge
 * (or altmove) removed meanwhile is looked up again in the index as it
 * is now: its records were moved verbatim, and the message is read
 * where it went.
 */

#include "engine/view.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

struct dbox_export;
struct dbox_reader;

/* One name of the namespace, valid during the callback it is given to
   (dir_begin's until the matching dir_end). */
struct dbox_export_item {
	const char *name;     /* the entry name as the index has it (the
				 caller checks it is one path component) */
	const char *path;     /* names from the root down, '/'-separated */
	struct dbox_attr attr;/* the index's attributes */
	struct timespec atime, mtime; /* times for the copy: the index's; a
				 plain file's own after
				 dbox_export_item_open */
	const char *target;   /* DBOX_KIND_SYMLINK: its target */
	bool unfinished;      /* DBOX_KIND_MESSAGE still being written (or
				 gone meanwhile): it has no bytes yet */
	bool acked_empty;     /* a message a close acknowledged empty while
				 it was written on (DBOX_META_ACKED_EMPTY,
				 engine/store.h): it reads as empty, as the
				 next mount stores it */
	int parent_fd;        /* the caller's descriptor of the directory
				 holding it (dbox_export_walk's root_fd, or
				 what dir_begin put in dir_fd) */
	int dir_fd;           /* DBOX_KIND_DIR: set by dir_begin (-1 before) */
	/* private to export.c */
	struct dbox_msgloc loc;
	int fd;
	struct dbox_reader *reader;
	uint64_t off;
};

/* What the walk calls.  A negative errno returned by a callback stops
   the walk (returned by dbox_export_walk). */
struct dbox_export_ops {
	/* A directory, before its contents: return 0 to walk into it
	   (dir_end follows, also when the walk stops inside), 1 to skip
	   it. */
	int (*dir_begin)(void *ctx, struct dbox_export_item *item);
	void (*dir_end)(void *ctx, struct dbox_export_item *item);
	/* Any other name (message, plain file, symbolic link, special). */
	int (*entry)(void *ctx, struct dbox_export_item *item);
	/* The index failed (what: "readdir", ...) at path (the directory
	   being listed); the walk stops with err. */
	void (*index_failed)(void *ctx, const char *path, const char *what,
			     int err);
	/* The index's rows of the item at path are damaged (what:
	   "message", "readlink"; a directory inside itself, "cycle"): the
	   item is skipped and the walk goes on (helper-79 F4: one damaged
	   row stopped the export of everything after it).  NULL: as
	   index_failed. */
	void (*item_damaged)(void *ctx, const char *path, const char *what,
			     int err);
};

/* Start an export of the view's store: one read snapshot of the index,
   STORE/files/ opened.  *root_r gets the root as an item (name and path
   "", its attributes and times: the caller's copy of it gets them
   last).  Returns 0 and *ex_r (end with dbox_export_end), -EIO (the
   index is unreadable), -ENOMEM. */
int dbox_export_begin(struct dbox_view *view, struct dbox_export **ex_r,
		      struct dbox_export_item *root_r);

/* Walk the namespace below the root in directory order, each directory's
   entries after it and before its dir_end.  root_fd is handed to the
   root's entries as parent_fd.  Returns 0, or a negative errno (the
   index failed: index_failed was called; or a callback's). */
int dbox_export_walk(struct dbox_export *ex, const struct dbox_export_ops *ops,
		     void *ctx, int root_fd);

/* After dbox_export_walk: how many names of the index (in the walk's
   snapshot) the walk did not list: below a directory it left out (a
   cycle, too deep, one the caller skipped) or in a subtree the index's
   tree no longer joins to the root (a damaged parent; helper-79 F4:
   such names were left out with exit status 0).  Returns 0 and
   *count_r, or -EIO. */
int dbox_export_unreached(struct dbox_export *ex, uint64_t *count_r);

/* Open the bytes of a message or plain file item for
   dbox_export_item_read; a plain file's times become those of its
   backing file.  Returns 0; for a message -EIO when its m.N or record is
   missing, a symbolic link or corrupt (logged), -ENOMEM; for a plain
   file the errno of opening STORE/files/<ino> (not logged: -ENOENT when
   STORE/files/ is missing; any kind but message, directory, symbolic link
   and special is read as a plain file); -EINVAL for an unfinished
   message or a kind without bytes; -ESTALE (not logged) for one deleted
   since the snapshot whose bytes went with it (a mounted store's
   expunge and purge while the walk runs). */
int dbox_export_item_open(struct dbox_export *ex, struct dbox_export_item *item);

/* Read the next bytes of an opened item into buf (len bytes at most).
   Returns the count, 0 at the end (a message: its size), or a negative
   errno (-EIO: the stored bytes are corrupt or short, logged). */
ssize_t dbox_export_item_read(struct dbox_export_item *item, void *buf,
			      size_t len);

/* Close what dbox_export_item_open opened (also done after the entry
   callback returns).  Safe twice. */
void dbox_export_item_close(struct dbox_export_item *item);

/* Called per extended attribute by dbox_export_xattrs: name (with its
   namespace, "user.x"), value (len bytes; not NUL-terminated).  Return
   0 to go on, anything else stops and is returned. */
typedef int dbox_export_xattr_cb_t(void *ctx, const char *name,
				   const void *value, size_t len);

/* The stored extended attributes of inode ino, in name order.  Returns
   0, the callback's non-zero value, or a negative errno of the index. */
int dbox_export_xattrs(struct dbox_export *ex, uint64_t ino,
		       dbox_export_xattr_cb_t *cb, void *ctx);

/* End the snapshot, close and free; *ex = NULL.  Safe on NULL. */
void dbox_export_end(struct dbox_export **ex);

#endif
