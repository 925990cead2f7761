#ifndef DBOXFS_VIEW_H
#define DBOXFS_VIEW_H

/*
 * view: a store opened for reading without the store lock, by the dboxadm
 * verbs that read while the store may be mounted (check, stats, export,
 * dump, cat, backup, purge's planning).  The index connection reads in
 * snapshots (dbox_index_reader_setup), so it sees committed transactions
 * only and never blocks the mount's writer.
 *
 * Every open inside the store is relative to the store directory and
 * never follows a symbolic link (O_NOFOLLOW): a store is a user's, and
 * root may be the one reading it (docs/durability.md, "Privileges and safety of the store").
 * The layout is engine/store-layout.h's.
 */

#include "index/index.h"

struct dbox_view {
	char *path;               /* STORE, as given */
	struct dbox_index *index; /* reads in snapshots */
	int storage_fd;           /* STORE/storage/, or -1: storage_err */
	int storage_err;          /* negative errno of opening it, or 0 */
	char *alt_path;           /* the alternate storage the index
				     records, or NULL */
	int alt_fd;               /* ALT/storage/, or -1: alt_err */
	int alt_err;              /* negative errno (-EPERM: ALT belongs to
				     another owner than STORE; -EXDEV: its
				     mark is another store's), or 0 */
};

/* Open the store at path for reading.  Returns 0 and *view_r (free with
   dbox_view_close), or a negative errno: -ENOENT (no such directory),
   -ENOTDIR, -ENOMEDIUM (a directory without index.sqlite: not a store),
   or what opening the index gave (-EIO: corrupt, -EPROTO: a newer index
   format; logged).  A missing storage/ or alternate storage is not an
   error here: see storage_err and alt_err. */
int dbox_view_open(const char *path, struct dbox_view **view_r);

/* Why the alternate storage did not open, for a message: view->alt_err
   (negative errno) in words, the refusals (-EPERM, -EXDEV) spelled out.
   A static string. */
const char *dbox_view_alt_why(int alt_err);

/* Close everything; *view = NULL.  Safe on NULL. */
void dbox_view_close(struct dbox_view **view);

/* Open the m.N file name ("m.7") for reading: in STORE/storage/, or when
   it is not there in the alternate storage.  Returns the fd (the
   caller's) or a negative errno (-ENOENT in neither, -ELOOP: a symbolic
   link). */
int dbox_view_mfile_open(struct dbox_view *view, const char *name);

/* Open STORE/sub (a directory), or STORE/sub/name with open(2) flags
   (O_CLOEXEC and O_NOFOLLOW added) when name is not NULL: each step
   relative to the one before and never through a symbolic link (-ELOOP).
   Needs no open store.  Returns the fd (the caller's) or a negative
   errno. */
int dbox_store_open_in(const char *store, const char *sub, const char *name,
		       int flags);

/* Open ALT/storage/ of the alternate storage alt of store: alt must be a
   directory owned by the owner of store and reached through no directory
   or symbolic link of a third user's (dbox_alt_owner_check; else
   -EPERM) and whose mark does not say it is another store's
   (dbox_alt_mark_judge with mark, filled by dbox_alt_mark_load: -EXDEV;
   nothing is written), storage/ in it is never followed through a
   symbolic link.  Returns the fd or a negative errno. */
struct dbox_alt_mark;
int dbox_store_open_alt_dir(const char *store, const char *alt,
			    struct dbox_alt_mark *mark);

#endif
