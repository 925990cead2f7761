#ifndef DBOXFS_INDEX_H
#define DBOXFS_INDEX_H

/*
 * index: the SQLite index of a dbox store (STORE/index.sqlite, WAL mode).
 *
 * The index is the source of truth for the namespace the mount shows:
 *   inode   one row per inode: the root, directories, messages, plain files.
 *           ino is the FUSE inode number; AUTOINCREMENT, so a number is
 *           never reused while the store lives.
 *   entry   one row per name: (parent, name) -> ino.  Several names may
 *           point at one message (hard links, Dovecot COPY); nlink counts
 *           them.  entry.id orders readdir and is kept across renames, so a
 *           listing running during renames shows each entry exactly once.
 *   message the dbox location of a message inode: m.N file, record offset,
 *           sizes, GUID; state WRITING while a writer still holds it.
 *   mfile   one row per storage/m.N: the committed end (bytes); anything
 *           past it is an unfinished write, cut off by recovery.
 *
 * Never does file I/O on m.N files and never includes FUSE headers.
 *
 * Return convention: 0 (or a count / 1 = found) on success, a negative
 * errno on failure: -ENOENT, -EEXIST, -ENOTEMPTY, -ENOTDIR, -EISDIR,
 * -EINVAL as POSIX has them for the operation, -EIO for any SQLite error
 * (logged with the SQLite message; -ENOSPC when the disk is full).  Callers bracket each client-visible
 * operation in dbox_index_begin()/dbox_index_commit(); the functions here
 * do not start transactions of their own.
 *
 * Not thread-safe: the caller serialises access (the store lock).
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Version of the schema this code writes; a store with a higher one is
   refused (-EPROTO). */
#define DBOX_INDEX_FORMAT 1
/* The root directory (INBOX of the Maildir++ tree) = FUSE_ROOT_ID. */
#define DBOX_ROOT_INO 1
/* Longest name in bytes (NAME_MAX); a longer one is -ENAMETOOLONG.  The
   kernel leaves this check to FUSE filesystems (its own limit is 1024). */
#define DBOX_NAME_MAX 255

enum dbox_kind {
	DBOX_KIND_DIR = 1,
	DBOX_KIND_MESSAGE = 2,
	DBOX_KIND_FILE = 3, /* plain file, bytes in STORE/files/<ino> */
};

enum dbox_msg_state {
	DBOX_MSG_COMMITTED = 0,
	DBOX_MSG_WRITING = 1,
};

/* Attributes of one inode, as stored.  Times are nanoseconds since the
   epoch.  For DBOX_KIND_FILE size/mtime are not kept here (the backing
   file has them). */
struct dbox_attr {
	uint64_t ino;
	enum dbox_kind kind;
	uint32_t mode; /* with the S_IFMT type bits */
	uint32_t uid, gid;
	uint32_t nlink;
	uint64_t size; /* bytes: plaintext size for a message */
	int64_t mtime_ns, ctime_ns;
};

/* Where a message's record is.  Sizes in bytes. */
struct dbox_msgloc {
	uint32_t file_id;      /* storage/m.<file_id> */
	uint64_t offset;       /* record start in the file */
	uint64_t body_size;    /* stored (possibly compressed) body bytes */
	uint64_t record_size;  /* header + body + metadata */
	uint64_t vsize;        /* plaintext size with LF counted as CRLF */
	enum dbox_msg_state state;
	char guid[33];
};

struct dbox_index;

/* Open (create=true: create if missing) the index at path, in WAL mode with
   synchronous=NORMAL, creating the schema and the root directory on a new
   file.  Returns 0 and sets *index_r; -ENOENT if missing and !create,
   -EPROTO if the format is newer than DBOX_INDEX_FORMAT, -EIO when the file
   is not a readable index (corrupt; logged). */
int dbox_index_open(const char *path, bool create, struct dbox_index **index_r);

/* Close the index and set *index to NULL.  Safe on NULL. */
void dbox_index_close(struct dbox_index **index);

/* Transactions.  begin: BEGIN IMMEDIATE.  commit: durable=true makes this
   commit reach the disk (and every earlier one) before returning, by
   dbox_index_sync().  On a failed commit the transaction is rolled back.
   rollback never fails and is a no-op outside a transaction.  Without
   durable, a commit survives the death of the process (it is in the WAL)
   but not necessarily a power loss. */
int dbox_index_begin(struct dbox_index *index);
int dbox_index_commit(struct dbox_index *index, bool durable);
void dbox_index_rollback(struct dbox_index *index);

/* Put every committed transaction on disk (fsync of the WAL), outside a
   transaction.  Returns 0 or -EIO. */
int dbox_index_sync(struct dbox_index *index);

/* Current time in nanoseconds since the epoch (CLOCK_REALTIME). */
int64_t dbox_now_ns(void);

/* Look up name (namelen bytes, not NUL-terminated) in directory parent.
   Returns 0 and fills *attr_r, -ENOENT when absent. */
int dbox_index_lookup(struct dbox_index *index, uint64_t parent,
		      const char *name, size_t namelen,
		      struct dbox_attr *attr_r);

/* Attributes of ino.  Returns 0 or -ENOENT. */
int dbox_index_getattr(struct dbox_index *index, uint64_t ino,
		       struct dbox_attr *attr_r);

/* Create a new inode of kind with mode (type bits included), uid, gid,
   mtime = ctime = now_ns, nlink 1 (2 for a directory), named name in
   parent.  Bumps parent's mtime (and nlink for a directory).  Returns 0 and
   fills *attr_r; -EEXIST when the name exists, -ENOENT/-ENOTDIR when parent
   is not a directory. */
int dbox_index_create(struct dbox_index *index, uint64_t parent,
		      const char *name, size_t namelen, enum dbox_kind kind,
		      uint32_t mode, uint32_t uid, uint32_t gid, int64_t now_ns,
		      struct dbox_attr *attr_r);

/* Add the name newparent/name for the existing non-directory ino; nlink+1,
   ctime and newparent's mtime bumped.  Returns 0 and the new attributes;
   -EEXIST, -EPERM for a directory. */
int dbox_index_link(struct dbox_index *index, uint64_t ino,
		    uint64_t newparent, const char *name, size_t namelen,
		    int64_t now_ns, struct dbox_attr *attr_r);

/* Remove the name parent/name.  dir=false (unlink): the name must not be a
   directory (-EISDIR); nlink-1.  dir=true (rmdir): it must be an empty
   directory (-ENOTDIR, -ENOTEMPTY) and its inode is deleted.  Sets *ino_r
   and *nlink_r (the remaining link count).  The caller deletes an inode
   left with nlink 0 (dbox_index_delete_inode) once nothing holds it. */
int dbox_index_remove(struct dbox_index *index, uint64_t parent,
		      const char *name, size_t namelen, bool dir,
		      int64_t now_ns, uint64_t *ino_r, uint32_t *nlink_r);

/* rename(2) of parent/name to newparent/newname with renameat2 flags
   (RENAME_NOREPLACE, RENAME_EXCHANGE).  An existing target is replaced
   atomically (its nlink drops; *replaced_ino_r / *replaced_nlink_r tell
   which inode lost a name, 0 if none).  Moving a directory below itself is
   -EINVAL.  Both directories' mtimes advance.  The moved inode keeps its
   number, size and mtime. */
int dbox_index_rename(struct dbox_index *index, uint64_t parent,
		      const char *name, size_t namelen, uint64_t newparent,
		      const char *newname, size_t newnamelen,
		      unsigned int flags, int64_t now_ns,
		      uint64_t *replaced_ino_r, uint32_t *replaced_nlink_r);

/* Store the attributes kind, mode, uid, gid, size, mtime_ns and ctime_ns
   from attr for attr->ino (nlink is not touched).  Returns 0 or -ENOENT. */
int dbox_index_setattr(struct dbox_index *index, const struct dbox_attr *attr);

/* Delete inode ino and its message row (its m.N bytes become garbage for
   purge).  Only for an inode with no names left. */
int dbox_index_delete_inode(struct dbox_index *index, uint64_t ino);

/* One directory entry for dbox_index_readdir.  name is not NUL-terminated
   and valid only during the callback. */
struct dbox_dirent {
	uint64_t cookie; /* entry.id: resume after it */
	const char *name;
	size_t namelen;
	struct dbox_attr attr;
};

/* Called per entry; return 0 to go on, 1 to stop (buffer full), or a
   negative errno to abort. */
typedef int dbox_readdir_cb_t(void *ctx, const struct dbox_dirent *ent);

/* List directory dir in entry.id order, starting after cookie `after` (0 =
   from the start).  Returns 0 when done or stopped, or a negative errno. */
int dbox_index_readdir(struct dbox_index *index, uint64_t dir, uint64_t after,
		       dbox_readdir_cb_t *cb, void *ctx);

/* The directory that holds directory dir (its ".."); the root's parent is
   the root.  Returns 0 and *parent_r, or -ENOENT. */
int dbox_index_parent(struct dbox_index *index, uint64_t dir,
		      uint64_t *parent_r);

/* The name of directory dir (its one entry), malloc()ed into *name_r
   (caller frees); the root has no name (-ENOENT). */
int dbox_index_name_of(struct dbox_index *index, uint64_t dir, char **name_r);

/* The Dovecot mailbox name a message created in directory dir (a cur/,
   new/ or tmp/) belongs to, for B metadata: "INBOX" for the root maildir,
   "A/B" for the Maildir++ folder ".A.B", "x/y" for nested folders x/y.
   malloc()ed into *name_r (caller frees).  Returns 0 or a negative errno. */
int dbox_index_mailbox_name(struct dbox_index *index, uint64_t dir,
			    char **name_r);

/* Message location of ino.  Returns 0, or -ENOENT when ino is not a
   message. */
int dbox_index_msg_get(struct dbox_index *index, uint64_t ino,
		       struct dbox_msgloc *loc_r);

/* Insert or replace the message location of ino. */
int dbox_index_msg_set(struct dbox_index *index, uint64_t ino,
		       const struct dbox_msgloc *loc);

/* Delete every meta key that starts with prefix.  Returns 0 or -EIO. */
int dbox_index_meta_delete_prefix(struct dbox_index *index, const char *prefix);

/* The lowest record offset >= from in m.<file_id> of a message still
   WRITING (a delivery in flight), for crash recovery before
   dbox_index_recover drops those rows.  Returns 1 and *offset_r, 0 when
   there is none, or -EIO. */
int dbox_index_writing_offset(struct dbox_index *index, uint32_t file_id,
			      uint64_t from, uint64_t *offset_r);

/* Set only the state of ino's message row. */
int dbox_index_msg_set_state(struct dbox_index *index, uint64_t ino,
			     enum dbox_msg_state state);

/* Committed end (bytes) of m.<file_id>; returns 0, -ENOENT if unknown. */
int dbox_index_mfile_get(struct dbox_index *index, uint32_t file_id,
			 uint64_t *size_r);

/* Set the committed end of m.<file_id> (inserting the row if new). */
int dbox_index_mfile_set(struct dbox_index *index, uint32_t file_id,
			 uint64_t size);

/* Highest file_id known (0 when none). */
int dbox_index_mfile_max(struct dbox_index *index, uint32_t *file_id_r);

/* Called per m.N file by dbox_index_mfile_list. */
typedef int dbox_mfile_cb_t(void *ctx, uint32_t file_id, uint64_t size);

/* List every m.N the index knows, by file_id. */
int dbox_index_mfile_list(struct dbox_index *index, dbox_mfile_cb_t *cb,
			  void *ctx);

/* Crash recovery, run once at open by the owner of the store lock: delete
   messages still WRITING (unfinished deliveries; their names go too, and
   their directories' mtimes advance) and every inode with nlink 0 (unlinked
   while open when the process died).  *writing_r and *orphans_r count them;
   *files_r receives a malloc()ed array of plain-file inode numbers whose
   backing files the caller removes (count in *nfiles_r). */
int dbox_index_recover(struct dbox_index *index, unsigned int *writing_r,
		       unsigned int *orphans_r, uint64_t **files_r,
		       size_t *nfiles_r);

/* A key in the meta table (format, uidvalidity, ...) as int64.
   Returns 0, -ENOENT. */
int dbox_index_meta_get(struct dbox_index *index, const char *key,
			int64_t *value_r);

#endif
