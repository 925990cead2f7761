#ifndef DBOXFS_SAVE_FD_H
#define DBOXFS_SAVE_FD_H

/*
 * save-fd: the bytes of an open file descriptor into the store, as a
 * message (a new dbox record in an m.N, engine/store.h) or as the backing
 * file of a plain file (STORE/files/<ino>).  Used by `dboxadm import` for
 * every file of a maildir and by the mount when a plain file becomes a
 * message (a rename into cur/ or new/, an rsync temporary renamed into
 * place).
 *
 * The descriptor is read with read(2) from its current offset to its end
 * (a pipe works too); it stays the caller's.  Sizes are in bytes,
 * received dates in UNIX seconds.
 */

#include "engine/store.h"

#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

/* Asked between the chunks of a long copy (may be NULL): true stops it
   with -EINTR.  dboxadm import's SIGINT and SIGTERM reach a copy of a
   huge (or endless) source file this way. */
struct dbox_copy_stop {
	bool (*stop)(void *ctx);
	void *ctx;
};

/* Write everything fd holds from its offset to its end into save as the
   message's plaintext from offset 0 (compressed as the store says).  No
   store lock needed: the caller owns save (one caller per save at a
   time).  Returns the byte count, or a negative errno: the read's
   (-EISDIR for a directory, -EIO) or the write's (-ENOSPC, -EFBIG,
   -EIO); the save then holds part of the bytes and is the caller's to
   free (dbox_save_free cuts them). */
int64_t dbox_save_copy_fd(struct dbox_save *save, int fd);

/* Save the bytes of fd (dbox_save_copy_fd) as the message of inode ino,
   saved to folder mailbox (the B metadata; maildir_mailbox_name), in a
   new record of an m.N with room: the record gets a new GUID and the
   received date received (R), and is recorded COMMITTED in the index
   (message row and the m.N's committed end) inside the caller's
   transaction.  The m.N bytes are not synced (the caller syncs the m.N
   before it commits: *loc_r names it).  The inode's own attributes
   (size, times) are the caller's to set.  Needs st->lock and a
   transaction.  Returns the byte count and *loc_r, or a negative errno
   (as dbox_save_copy_fd, or the index's -EIO): then its bytes are cut
   off the m.N again and the index holds no row of it (after an index
   error the caller rolls its transaction back, as after any); -EINTR
   when stop said so. */
int64_t dbox_save_from_fd(struct dbox_store *st, uint64_t ino,
			  const char *mailbox, int fd, time_t received,
			  const struct dbox_copy_stop *stop,
			  struct dbox_msgloc *loc_r);

/* Create (or truncate: an inode number handed out again after a rolled
   back run may have left its file behind) the backing file
   STORE/files/<ino> of plain file ino, mode 0600, never through a
   symbolic link, open for writing (O_APPEND too when append).  Returns
   the descriptor (the caller's to close) or a negative errno. */
int dbox_store_file_create(struct dbox_store *st, uint64_t ino, bool append);

/* Write the bytes of fd (from its offset to its end) as the backing file
   of plain file ino (dbox_store_file_create), then give it the access
   and modification times times[0] and times[1] (as futimens(2); NULL:
   now).  Not synced: the caller syncs files/ before it commits.  Returns
   the byte count, or a negative errno (-EINTR when stop said so); on
   error the backing file is removed again. */
int64_t dbox_store_file_from_fd(struct dbox_store *st, uint64_t ino, int fd,
				const struct timespec times[2],
				const struct dbox_copy_stop *stop);

/* Open the backing file STORE/files/<ino> of plain file ino with open(2)
   flags (O_CREAT | O_EXCL for a new one, mode 0600; O_NOATIME, dropped
   again when the caller may not use it), read-write, or read-only in a
   store opened readonly; never through a symbolic link.  Needs no lock.
   stat_r (may be NULL) gets its fstat.  Returns the descriptor (the
   caller's to close), -ENOSPC, -EDQUOT, -EMFILE, -ENFILE, or -EIO for
   any other failure, a file that is not a regular one included (logged
   with the path). */
int dbox_store_file_open(struct dbox_store *st, uint64_t ino, int flags,
			 struct stat *stat_r);

/* Open the backing file of plain file ino read-only (never through a
   symbolic link) and fstat it into *stat_r.  Needs no lock.  Returns the
   descriptor (the caller's to close) or the negative errno of the open
   or fstat (not logged). */
int dbox_store_file_open_ro(struct dbox_store *st, uint64_t ino,
			    struct stat *stat_r);

/* Remove the backing file of plain file ino (a name taken back by a
   rollback).  A missing file is no error.  Returns 0 or a negative
   errno. */
int dbox_store_file_remove(struct dbox_store *st, uint64_t ino);

#endif
