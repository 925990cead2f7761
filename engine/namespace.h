#ifndef DBOXFS_NAMESPACE_H
#define DBOXFS_NAMESPACE_H

/*
 * namespace: the store operations that read or change the tree of names
 * (create, link, unlink, rmdir, rename, setattr, xattrs), each one whole:
 * every change is ONE index transaction begun and ended here (committed,
 * not synced: fsyncdir or an fsync makes it durable), and returns the
 * attributes the caller's reply needs.  fs/ calls these instead of
 * composing index calls; so may any other writer of a store.
 *
 * Locking: every function here needs st->lock held by the caller (it
 * serialises the index; engine/store.h), except dbox_ns_file_unlink
 * (needs no lock) and dbox_ns_sync_upto (best called without it).
 * None of them takes or drops it.  The hooks below are called with it
 * held and must not take it.
 *
 * Errors: 0 (or 1 where said) on success, a negative errno on failure,
 * as POSIX has them for the operation (index.h lists them), -EIO for a
 * failed index statement (logged), -ENOSPC/-EDQUOT when the disk or quota
 * is full.  On failure nothing has changed (the transaction is rolled
 * back).
 */

#include "engine/store.h"

#include <stdbool.h>
#include <stdint.h>

/* Called when a name of ino went away and ino has no names left: true when
   the caller still holds ino (open, or known to the kernel), so that it
   must stay until the caller lets go (it deletes it then with
   dbox_ns_delete_orphan; the callee remembers that).  false: ino is
   deleted now, in the same transaction. */
typedef bool dbox_ns_held_cb_t(void *ctx, uint64_t ino);

/* Called inside dbox_ns_rename's transaction once the name has moved,
   with the moved inode's attributes (ctime updated), its new directory
   and name.  It may change the store in that transaction (the mount
   turns a plain file renamed into cur/ into a message).  Returns 0; a
   negative errno, which rolls the rename back and is returned; or 1:
   roll back and make dbox_ns_rename return 1 (the caller prepares what
   it needs without the transaction and calls again). */
typedef int dbox_ns_moved_cb_t(void *ctx, const struct dbox_attr *moved,
			       uint64_t newparent, const char *newname);

/* What the caller tells the namespace about the inodes it holds; ctx is
   passed to both callbacks.  A NULL hooks pointer (or NULL members)
   means: nothing is held, no moved callback. */
struct dbox_ns_hooks {
	dbox_ns_held_cb_t *held;
	dbox_ns_moved_cb_t *moved;
	void *ctx;
};

/* What an operation that drops a name left behind. */
struct dbox_ns_gone {
	uint64_t ino;             /* non-directory that lost a name; 0: none */
	uint32_t nlink;           /* the names it has left */
	bool deleted;             /* no names and not held: deleted */
	uint32_t garbage_file_id; /* m.N whose record of the deleted message
				     is now garbage for purge; 0: none */
};

/* --- reading --------------------------------------------------------- */

/* Attributes of the name parent/name.  Returns 0, -ENOENT,
   -ENAMETOOLONG, -EIO. */
int dbox_ns_lookup(struct dbox_store *st, uint64_t parent, const char *name,
		   struct dbox_attr *attr_r);

/* Attributes of ino.  Returns 0, -ENOENT, -EIO. */
int dbox_ns_getattr(struct dbox_store *st, uint64_t ino,
		    struct dbox_attr *attr_r);

/* Attributes of directory dir and of its parent (the root's parent is
   the root), for a listing's "." and "..".  Returns 0, -ENOENT, -EIO. */
int dbox_ns_dir_self(struct dbox_store *st, uint64_t dir,
		     struct dbox_attr *self_r, struct dbox_attr *parent_r);

/* List directory dir after cookie `after` (0: from the start), as
   dbox_index_readdir.  Returns 0 when done or stopped, or a negative
   errno (the callback's, or -EIO). */
int dbox_ns_readdir(struct dbox_store *st, uint64_t dir, uint64_t after,
		    dbox_readdir_cb_t *cb, void *ctx);

/* The target of symbolic link ino, malloc()ed and NUL-terminated (caller
   frees).  Returns 0, -EINVAL (not a symlink), -ENOMEM, -EIO. */
int dbox_ns_readlink(struct dbox_store *st, uint64_t ino, char **target_r);

/* Extended attribute name of ino (malloc()ed value, caller frees; NULL
   for an empty one) and the list of names (NUL-separated, malloc()ed),
   as dbox_index_xattr_get / dbox_index_xattr_list.  Return 0, -ENODATA
   (get), -ENOMEM, -EIO. */
int dbox_ns_xattr_get(struct dbox_store *st, uint64_t ino, const char *name,
		      void **value_r, size_t *len_r);
int dbox_ns_xattr_list(struct dbox_store *st, uint64_t ino, char **list_r,
		       size_t *len_r);

/* Is a regular file named name in directory parent a message: parent is
   a cur/, new/ or tmp/ (engine/maildir.h) and name does not start with
   '.'?  false also when parent has no name (the root) or on an error. */
bool dbox_ns_is_message_name(struct dbox_store *st, uint64_t parent,
			     const char *name);

/* dbox_ns_is_message_name, and when true the folder directory (parent's
   own parent) into *folder_r (may be NULL): one read of the index, for a
   create that names the message's mailbox next. */
bool dbox_ns_message_dir(struct dbox_store *st, uint64_t parent,
			 const char *name, uint64_t *folder_r);

/* Owner group and mode of a new inode in directory parent, by Linux's
   rule for a setgid directory (ext4's inode_init_owner): in a directory
   with S_ISGID the inode takes the directory's gid and a new directory
   keeps S_ISGID; elsewhere *gid (the caller's) stays.  *mode carries the
   type bits.  Returns 0, -ENOENT, -ENOTDIR (parent), -EIO. */
int dbox_ns_new_owner(struct dbox_store *st, uint64_t parent,
		      uint32_t *mode, uint32_t *gid);

/* --- durability (fsyncdir) ------------------------------------------- */

/* The point an fsyncdir waits for into *point_r: the number of index
   commits made so far (every namespace change before it; deferred flag
   renames are committed first, store-commit.c).  Needs st->lock.
   Returns 0, or the error of that commit (-ENOSPC, -EDQUOT, -EIO: the
   deferred renames are undone, logged); *point_r is set either way. */
int dbox_ns_sync_point(struct dbox_store *st, uint64_t *point_r);

/* Return once every commit up to point is on disk, by one fdatasync of
   the WAL shared with concurrent callers (group commit).  Call it
   without st->lock so others go on meanwhile and share the sync; with
   the lock held it is still correct, but the store waits for the sync
   (the mount does so only on a rare path: an fsync of a reader of a
   message another descriptor is rewriting).  Returns 0 or -EIO
   (logged). */
int dbox_ns_sync_upto(struct dbox_store *st, uint64_t point);

/* --- changing -------------------------------------------------------- */

/* What dbox_ns_create makes. */
struct dbox_ns_new {
	enum dbox_kind kind; /* DIR, SYMLINK or SPECIAL (messages and plain
				files have bytes: the mount's create) */
	uint32_t mode;       /* type bits and permissions, umask applied */
	uint32_t uid, gid;   /* the caller's; gid as dbox_ns_new_owner */
	uint64_t rdev;       /* SPECIAL: device number (makedev), else 0 */
	const char *target;  /* SYMLINK: the target (NUL-terminated) */
};

/* Create parent/name as *nw says, with the setgid rule
   (dbox_ns_new_owner), times now, in one transaction; *attr_r gets the
   new inode's attributes.  Returns 0, -EEXIST, -ENOENT, -ENOTDIR,
   -ENAMETOOLONG (name, or a symlink target of PATH_MAX or more), -EINVAL
   (kind), -EIO. */
int dbox_ns_create(struct dbox_store *st, uint64_t parent, const char *name,
		   const struct dbox_ns_new *nw, struct dbox_attr *attr_r);

/* Create cur/ new/ tmp/ in the root (an empty INBOX: the first mount of a
   new store), owned by uid/gid, mode 0700, in one durable transaction.
   Returns 0 or a negative errno (-EEXIST when one exists). */
int dbox_ns_make_inbox(struct dbox_store *st, uint32_t uid, uint32_t gid);

/* link(2): a new name newparent/name for non-directory ino.  *attr_r: its
   attributes after (nlink, ctime).  Returns 0, -EEXIST, -EPERM (a
   directory), -ENOENT (ino has no names left), -ENOTDIR, -EIO. */
int dbox_ns_link(struct dbox_store *st, uint64_t ino, uint64_t newparent,
		 const char *name, struct dbox_attr *attr_r);

/* unlink(2) (dir false) or rmdir(2) (dir true) of parent/name.  A
   non-directory left without names and not held (hooks->held) is deleted
   in the same transaction: its index rows; its backing file in files/
   after the commit; a message's record becomes garbage (gone_r says
   which m.N).  Returns 0, -ENOENT, -EISDIR, -ENOTDIR, -ENOTEMPTY, -EIO. */
int dbox_ns_remove(struct dbox_store *st, uint64_t parent, const char *name,
		   bool dir, const struct dbox_ns_hooks *hooks,
		   struct dbox_ns_gone *gone_r);

/* rename(2)/renameat2 (flags RENAME_NOREPLACE, RENAME_EXCHANGE) of
   parent/name to newparent/newname, in one transaction: the names move,
   a replaced target loses its name as in dbox_ns_remove (gone_r), the
   hooks->moved callback runs, and *moved_r gets the moved inode's
   attributes (number, size, mtime kept; ctime now).  Returns 0; 1 when
   the moved callback asked for a retry (nothing changed); -ENOENT,
   -EEXIST, -ENOTDIR, -EISDIR, -ENOTEMPTY, -EINVAL (a directory into
   itself or below, bad flags), -ENAMETOOLONG, -EIO. */
int dbox_ns_rename(struct dbox_store *st, uint64_t parent, const char *name,
		   uint64_t newparent, const char *newname, unsigned int flags,
		   const struct dbox_ns_hooks *hooks, struct dbox_attr *moved_r,
		   struct dbox_ns_gone *gone_r);

/* Delete ino, an inode with no names the caller held until now (see
   dbox_ns_held_cb_t), in a transaction of its own: index rows, then its
   backing file; gone_r as in dbox_ns_remove.  An inode already gone
   (or one that has names again) is left alone: returns 0. */
int dbox_ns_delete_orphan(struct dbox_store *st, uint64_t ino,
			  struct dbox_ns_gone *gone_r);

/* Which attributes dbox_ns_setattr sets (bits of dbox_ns_set.what). */
#define DBOX_NS_SET_MODE  (1u << 0) /* the permission bits (07777) */
#define DBOX_NS_SET_UID   (1u << 1)
#define DBOX_NS_SET_GID   (1u << 2)
#define DBOX_NS_SET_MTIME (1u << 3)
#define DBOX_NS_SET_ATIME (1u << 4)
#define DBOX_NS_SET_CTIME (1u << 5)
#define DBOX_NS_SET_SIZE  (1u << 6) /* the stored size (only the index's
				       number: the bytes are the caller's) */

/* New attribute values for dbox_ns_setattr; times are dbox times. */
struct dbox_ns_set {
	unsigned int what;
	uint32_t mode, uid, gid;
	uint64_t size;
	int64_t mtime_ns, atime_ns, ctime_ns;
};

/* chmod/chown/utimens/atime of ino: the attributes `set->what` names, in
   one transaction; *attr_r (may be NULL) gets the attributes after.
   Returns 0, -ENOENT, -EIO. */
int dbox_ns_setattr(struct dbox_store *st, uint64_t ino,
		    const struct dbox_ns_set *set, struct dbox_attr *attr_r);

/* The atime a read moved (the caller judged it due, relatime): ino's
   atime = atime_ns (a dbox time).  Its commit is deferred, as a flag
   rename's (store-commit.c): a daemon killed within DBOX_DEFER_MS keeps
   the atime before, as a power loss may on ext4.  Returns 0, -ENOENT,
   -EIO. */
int dbox_ns_touch_atime(struct dbox_store *st, uint64_t ino, int64_t atime_ns);

/* setxattr(2) of ino (flags XATTR_CREATE / XATTR_REPLACE) and
   removexattr(2), with ctime = now, in one transaction.  Returns 0,
   -EEXIST, -ENODATA, -ERANGE, -ENOSPC, -ENOENT, -EIO (as
   dbox_index_xattr_set / _remove). */
int dbox_ns_xattr_set(struct dbox_store *st, uint64_t ino, const char *name,
		      const void *value, size_t len, int flags);
int dbox_ns_xattr_remove(struct dbox_store *st, uint64_t ino,
			 const char *name);

/* End the transaction a caller began (dbox_index_begin) for an operation
   whose outcome is ret: commit when ret is 0 (durable: on disk before
   returning), else roll back.  Returns ret or the commit's error (the
   transaction is then rolled back). */
int dbox_ns_tx_end(struct dbox_store *st, int ret, bool durable);

/* Remove the backing file STORE/files/<ino> of a plain file (one that
   became a message, or was deleted); a failure other than ENOENT is
   logged.  Needs no lock: the inode has no plain file any more. */
void dbox_ns_file_unlink(struct dbox_store *st, uint64_t ino);

/* Index meta keys "file_gone.<ino>.": plain file ino was deleted by the
   transaction that set the key.  Its backing file is removed once that
   commit is durable (dbox_store_doom_file), and the key by a later
   deleting transaction (or the next open), so a daemon that dies in
   between leaves files only recovery knows to remove (store-recover.c).
   A backing file of no plain file without its key is kept (an index
   older than files/).  DBOX_META_FILE_GONE is the one key of indexes
   written before 2026-12-06: the last such ino, its file removed right
   after the commit. */
#define DBOX_META_FILE_GONE_PREFIX "file_gone."
#define DBOX_META_FILE_GONE "file_gone_ino"

/* Did a committed transaction delete plain file ino, whose backing file
   may then still be there (either key above)?  Reads index (the store
   lock, or a reader's connection). */
bool dbox_ns_file_gone(struct dbox_index *index, uint64_t ino);

#endif
