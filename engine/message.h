#ifndef DBOXFS_MESSAGE_H
#define DBOXFS_MESSAGE_H

/*
 * message: the store operations on one message (or on a plain file
 * becoming one) that the mount makes between a client's create, write,
 * close, fsync and read: each reads or changes the index as one whole
 * operation - a change is ONE transaction begun and ended here, unless
 * its name says "in_tx" - and returns what the caller's reply needs.
 * fs/ calls these instead of composing index calls.  The bytes of a
 * message are written through its save (engine/store.h, struct
 * dbox_save); these functions name the save's record in the index.
 *
 * Locking: every function here needs st->lock held by the caller
 * (engine/store.h) unless it says otherwise; none takes or drops it.
 *
 * Errors: 0 (or what is said) on success, a negative errno on failure:
 * -ENOENT (no such inode or record), -ENOMEM, -EIO (a failed index
 * statement or an unreadable m.N; logged), -ENOSPC/-EDQUOT (a full disk
 * or quota).  A failed change has changed nothing (rolled back).
 *
 * Times are dbox times (index/index.h) unless a name says _sec
 * (UNIX seconds).
 */

#include "engine/namespace.h"
#include "engine/store.h"

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

struct dbox_reader;

/* --- reading ------------------------------------------------------- */

/* Attributes and committed record of message ino.  Returns 0, -ENOENT
   (no inode, or no record: a plain file), -EIO. */
int dbox_msg_locate(struct dbox_store *st, uint64_t ino,
		    struct dbox_attr *attr_r, struct dbox_msgloc *loc_r);

/* A reader of message ino's committed record (dbox_store_open_reader;
   *reader_r is the caller's, to dbox_reader_free; it reads on without
   the lock).  Returns 0, -ENOENT, -EMFILE/-ENFILE, -EIO. */
int dbox_msg_open_reader(struct dbox_store *st, uint64_t ino,
			 struct dbox_reader **reader_r);

/* A descriptor of the m.N holding message ino's committed record, for
   an fdatasync outside the lock (a dup of the store's cached one: the
   caller's to close).  Returns the fd, -ENOENT, -EMFILE/-ENFILE, -EIO. */
int dbox_msg_record_fd(struct dbox_store *st, uint64_t ino);

/* The mailbox name (the B metadata; maildir_mailbox_name) of the folder
   whose cur/, new/ or tmp/ is directory dir (malloc()ed, caller frees).
   Returns 0, -ENOENT, -ENOMEM, -EIO. */
int dbox_msg_dir_mailbox(struct dbox_store *st, uint64_t dir,
			 char **mailbox_r);

/* The same for the directory holding inode ino's name (its first one).
   Returns 0, -ENOENT (no name), -ENOMEM, -EIO. */
int dbox_msg_mailbox(struct dbox_store *st, uint64_t ino, char **mailbox_r);

/* What the close or fsync() of new message ino seals its record with
   (dbox_save_seal): its path below the root, for L (dbox_index_path: one
   statement), into *path_r (malloc()ed), and its mode, owner and group,
   for A, into *owner_r.  Needs st->lock.  Returns 0, -ENAMETOOLONG when
   the path is longer than DBOX_SEAL_PATH_MAX (recovery would not follow
   it), -EMLINK when ino has more than one name (L holds one) - the
   record is sealed without L, and an fsync must sync the index instead
   - or -ENOENT, -ENOMEM, -EIO. */
int dbox_msg_seal_note(struct dbox_store *st, uint64_t ino, char **path_r,
		       struct dbox_owner *owner_r);

/* The received date (R, UNIX seconds) a finish of message ino's save
   writes: its mtime, or written_ns (the time of a write not stored yet)
   when not NULL.  Returns 0, -ENOENT, -EIO. */
int dbox_msg_received(struct dbox_store *st, uint64_t ino,
		      const int64_t *written_ns, time_t *received_r);

/* --- changing ------------------------------------------------------ */

/* Finish save, the save of message ino, and make its record the one the
   index names, in one transaction: dbox_save_finish (R as
   dbox_msg_received says; with sync the m.N bytes are fdatasync()ed
   first and the commit is durable), and the inode's size the save's, and
   with written_ns not NULL its mtime and ctime *written_ns.  A save
   finished before, with nothing changed since, costs one empty
   transaction.  Returns 0 or a negative errno. */
int dbox_msg_finish(struct dbox_store *st, uint64_t ino,
		    struct dbox_save *save, bool sync,
		    const int64_t *written_ns);

/* A close of message ino whose save is unfinished and empty (nothing
   written yet, or truncated to 0): its empty version is acknowledged
   (dbox_save_ack_empty) in a commit of its own that also stores
   *written_ns (when not NULL: the time of the write or truncation) as
   the inode's mtime and ctime, and the save goes on unfinished, so
   writes through another descriptor continue it.  Nothing is committed
   when it was acknowledged before and written_ns is NULL (no write or
   truncation since: the caller stored the time of the one before).
   Returns 0 or a negative errno (rolled back; -ENOSPC for a body a
   failed write broke). */
int dbox_msg_ack_empty(struct dbox_store *st, uint64_t ino,
		       struct dbox_save *save, const int64_t *written_ns);

/* Crash recovery's last step, once the pool is ready (dbox_store_open):
   every message with a DBOX_META_ACKED_EMPTY key - a close acknowledged
   it empty and the process died before the finish - is stored empty, in
   a new record synced to disk, with its inode's mtime (the close stored
   the truncation's; a utime() after it its own); the record it had
   (a delivery cut as in flight, or the version before an O_TRUNC) is
   garbage.  Keys of inodes gone are deleted.  *restored_r counts the
   messages.  Returns 0 or a negative errno (-ENOSPC, -EIO: the open
   fails; the next one tries again). */
int dbox_msg_restore_empty(struct dbox_store *st, unsigned int *restored_r);

/* Patch the received date (R) of message ino's committed record to
   received_sec in place (dbox_store_set_received).  Returns 0 (also when
   ino has no record yet), -ERANGE when the new date needs another width
   or the m.N is linked into another store (the caller rewrites the
   record: a copy), or another negative errno. */
int dbox_msg_set_received(struct dbox_store *st, uint64_t ino,
			  time_t received_sec);

/* Create a regular file parent/name as nw says (nw->kind ignored; mode
   with its type bits; the setgid rule of dbox_ns_new_owner), in one
   transaction: a message when the name is a message name
   (dbox_ns_is_message_name), its record started (dbox_save_begin: a
   WRITING row) and, unless keep_save, finished empty at once; else a
   plain file with a new backing file STORE/files/<ino> (O_EXCL).
   *attr_r gets the new inode's attributes; *save_r the message's save
   when keep_save (else NULL: the caller's, to dbox_save_free); *fd_r the
   plain file's backing file open read-write (else -1: the caller's to
   close).  Returns 0, -EEXIST, -ENOENT, -ENOTDIR, -ENAMETOOLONG, -ENOSPC,
   -EDQUOT, -EMFILE, -ENFILE, -EIO; on failure nothing was created. */
int dbox_msg_create(struct dbox_store *st, uint64_t parent, const char *name,
		    const struct dbox_ns_new *nw, bool keep_save,
		    struct dbox_save **save_r, int *fd_r,
		    struct dbox_attr *attr_r);

/* Is ino a plain file with one name, and that name a message name
   (dbox_ns_is_message_name)?  *parent_r gets the directory of the name.
   false also on an error. */
bool dbox_msg_file_wants(struct dbox_store *st, uint64_t ino,
			 uint64_t *parent_r);

/* Turn plain file ino, named in directory parent, into a message inside
   the caller's transaction: its bytes become a record (the one copied
   holds, sealed from the backing file outside the lock, or copied now
   when copied is NULL) with R = the backing file's mtime, finished, and
   the inode a message whose size, mtime and atime are the backing
   file's.  copied stays the caller's.  The backing file is left for the
   caller to remove after the commit (dbox_ns_file_unlink).  Returns 0 or
   a negative errno (then the caller rolls back). */
int dbox_msg_from_file_in_tx(struct dbox_store *st, uint64_t ino,
			     uint64_t parent, struct dbox_save *copied);

/* dbox_msg_from_file_in_tx in a transaction of its own (committed, not
   synced).  Returns 0 or a negative errno (rolled back). */
int dbox_msg_from_file(struct dbox_store *st, uint64_t ino, uint64_t parent,
		       struct dbox_save *copied);

#endif
