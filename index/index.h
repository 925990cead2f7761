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
 *           past it is an unfinished write, cut off by recovery; and
 *           whether it lives in the alternate storage (ALT/storage/).
 *   setting text settings of the store (the ALT path).
 *
 * Never does file I/O on m.N files and never includes FUSE headers.
 *
 * Return convention: 0 (or a count / 1 = found) on success, a negative
 * errno on failure: -ENOENT, -EEXIST, -ENOTEMPTY, -ENOTDIR, -EISDIR,
 * -EINVAL as POSIX has them for the operation, -EIO for any SQLite error
 * (logged with the SQLite message; -ENOSPC when the disk is full, -EDQUOT
 * when the quota is: index_sql_error).  A comment below that names no
 * return value means 0 or one of these SQLite errnos.  Callers bracket each client-visible
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
   refused (-EPROTO), an older one is upgraded when opened read-write. */
#define DBOX_INDEX_FORMAT 3
/* The root directory (INBOX of the Maildir++ tree) = FUSE_ROOT_ID. */
#define DBOX_ROOT_INO 1
/* Longest name in bytes (NAME_MAX); a longer one is -ENAMETOOLONG.  The
   kernel leaves this check to FUSE filesystems (its own limit is 1024). */
#define DBOX_NAME_MAX 255

/* Directories on the way from any inode up to the root, at the most: a
   path of PATH_MAX (4096) bytes has no more than 2048 components.  Walks
   up or down the tree stop there (-EIO, or -ELOOP where said): a damaged
   or hostile index may hold a cycle. */
#define DBOX_TREE_MAX_DEPTH 2048

enum dbox_kind {
	DBOX_KIND_DIR = 1,
	DBOX_KIND_MESSAGE = 2,
	DBOX_KIND_FILE = 3, /* plain file, bytes in STORE/files/<ino> */
	DBOX_KIND_SYMLINK = 4, /* symbolic link, target in table symlink,
				  size = target length */
	DBOX_KIND_SPECIAL = 5, /* fifo, socket, character or block device:
				  mode and rdev only, no bytes (the kernel
				  serves their I/O) */
};

enum dbox_msg_state {
	DBOX_MSG_COMMITTED = 0,
	DBOX_MSG_WRITING = 1,
};

/* Times.  Every inode time (struct dbox_attr's *_ns, the inode table's
   mtime/ctime/atime columns) is a dbox time: nanoseconds since the epoch
   modulo 2^64 in an int64, read in the window that starts at
   DBOX_TIME_MIN_SEC (index-time.c).  Between 1901 and 2262 that is plain
   nanoseconds; later times (to ext4's limit, 2446) wrap to values below the
   window's start.  So never divide or compare them directly: use the
   functions below.  The range is ext4's (256-byte inodes): seconds
   -2^31 .. 2^34 - 2^31 - 1, nanoseconds kept. */
#define DBOX_TIME_MIN_SEC (-2147483648LL)  /* 1901-12-13T20:45:52Z */
#define DBOX_TIME_MAX_SEC 15032385535LL    /* 2446-05-10T22:38:55Z */

/* The dbox time of sec + nsec (any nsec: it is normalised), clamped to
   ext4's range as the kernel clamps it for ext4: a second outside it
   becomes the nearest end, and a time at either end loses its
   nanoseconds. */
int64_t dbox_time_make(int64_t sec, int64_t nsec);

/* Seconds (floor: -1.5 s is -2 s + 500000000 ns) and nanoseconds
   (0..999999999) of dbox time t. */
void dbox_time_split(int64_t t, int64_t *sec_r, int64_t *nsec_r);

/* Whole seconds of t, rounded down (what time_t holds for it). */
int64_t dbox_time_sec(int64_t t);

/* -1, 0 or 1 as a is earlier than, equal to or later than b. */
int dbox_time_cmp(int64_t a, int64_t b);

/* Attributes of one inode, as stored.  Times are dbox times (above).  For
   DBOX_KIND_FILE size/mtime/atime are not kept here (the backing file has
   them). */
struct dbox_attr {
	uint64_t ino;
	enum dbox_kind kind;
	uint32_t mode; /* with the S_IFMT type bits */
	uint32_t uid, gid;
	uint32_t nlink;
	uint64_t size; /* bytes: plaintext size for a message */
	int64_t mtime_ns, ctime_ns, atime_ns;
	uint64_t rdev; /* device number (makedev) of a special file, else 0 */
	uint64_t stored; /* bytes its data takes in the store: a message's
			    record in its m.N (compressed body included);
			    0 for others and a message not yet finished */
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
   -EACCES (or another -errno) when the path cannot be looked up,
   -EPROTO if the format is newer than DBOX_INDEX_FORMAT, -EIO when the file
   is not a readable index (corrupt; logged).  Without create, on a store
   whose directory this process cannot write (read-only media, a
   read-only bind mount, no permission) it opens read-only, as
   dbox_index_open_readonly. */
int dbox_index_open(const char *path, bool create, struct dbox_index **index_r);

/* Open the index at path for reading only; nothing is written, not even
   index.sqlite-shm.  SQLite's mode=ro first (it sees what the WAL holds,
   and needs index.sqlite-shm to exist, as it does while the store is
   mounted); when that cannot open, immutable=1 (reads index.sqlite alone:
   a WAL left with transactions in it is then not seen, which is logged as
   a warning).  Returns as dbox_index_open. */
int dbox_index_open_readonly(const char *path, struct dbox_index **index_r);

/* Rewrite an index created with another page size (before 2026-12-02:
   4096 bytes) with the page size new indexes get (index-private.h: each
   commit then writes a quarter of the WAL bytes), by SQLite's VACUUM in
   rollback-journal mode, then back to WAL.  About 0.7 s per 100,000
   messages, once; a crash meanwhile leaves index.sqlite-journal, which
   SQLite rolls back at the next open (the old index, whole).  Needs the
   store lock, and no other connection of this process (call before the
   checkpointer starts).  Returns 0 (also when there is nothing to do),
   or a negative errno: -EBUSY when another process reads the index
   (dboxadm check of a store being opened), -ENOSPC when the disk has
   less than twice the index's size free (the journal and the new file;
   the index reserve, reserve.h, is not counted as room) or fills
   meanwhile (the reserve may then be drawn on, as by any index write),
   -EFBIG when the index is larger than the rewrite builds in memory
   (index-private.h: 512 MiB; nothing is written to /var/tmp), -EAGAIN
   when SQLite could not do it (a damaged index: VACUUM reads every
   page; logged); the index is then unchanged and fully usable, and
   the next open tries again.  -EIO (logged) only if the index could not
   be put back in WAL mode: then close it. */
int dbox_index_convert_pages(struct dbox_index *index);

/* Keep the attributes of recently read inodes in memory, so that
   dbox_index_getattr() answers them without a read transaction.  Only for
   the connection of the store's one writer (the store lock held): the
   cache follows every change this connection makes (and drops all at a
   rollback) but not commits of other connections. */
void dbox_index_cache_attrs(struct dbox_index *index);

/* Can SQLite open an index at path (absolute, as the store layer makes
   it)?  SQLite refuses a database whose full path leaves no room for
   its "-journal" name in the VFS's mxPathname bytes (512 for the unix
   VFS: a path of at most 504 bytes), with an error that reads as an
   unreadable index.  Returns 0, or -ENAMETOOLONG after saying so (the
   length and the limit; what names the path: store, for the store's
   directory). */
int dbox_index_path_check(const char *path, const char *store);

/* Close the index and set *index to NULL.  Safe on NULL. */
void dbox_index_close(struct dbox_index **index);

/* Transactions.  begin: BEGIN IMMEDIATE.  commit: durable=true makes this
   commit reach the disk (and every earlier one) before returning, by
   dbox_index_sync().  On a failed commit the transaction is rolled back.
   rollback never fails and is a no-op outside a transaction.  Without
   durable, a commit survives the death of the process (it is in the WAL)
   but not necessarily a power loss.  begin and commit return 0, -ENOSPC
   or -EDQUOT (the disk or the quota is full) or -EIO (logged). */
int dbox_index_begin(struct dbox_index *index);
int dbox_index_commit(struct dbox_index *index, bool durable);
void dbox_index_rollback(struct dbox_index *index);

/* Deferred commits (docs/durability.md, "Deferred commits"): for
   operations whose loss at the death of the process is harmless (a
   flag rename), so that many share one COMMIT, which costs some eight
   fcntl() locks of the WAL-index and a WAL write.
   - dbox_index_commit_later ends the operation begun by
     dbox_index_begin without committing: the transaction stays open,
     and the connection's later reads see its changes; other
     connections do not until a commit.  made_inodes: the operation
     made inodes (a create), whose numbers its caller hands out before
     the commit.  Undone, they would be handed out again (AUTOINCREMENT
     counts in the transaction) while the kernel still knows the first
     ones, so a transaction holding such an operation that is undone
     (a failed COMMIT or release, SQLite's own rollback after an error)
     makes the index refuse every later write transaction (-EIO,
     logged: the store must be mounted again).  Returns 0, or -EIO
     (logged: the release failed, or SQLite rolled the transaction back
     after an error; the deferred operations are then undone).
   - While operations are deferred, dbox_index_begin opens a savepoint
     in the open transaction: dbox_index_rollback undoes that operation
     only, dbox_index_commit commits it with every deferred one, and
     dbox_index_rollback outside an operation is a no-op.
   - dbox_index_commit_deferred commits the deferred operations, outside
     an operation; 0 when there are none, else as dbox_index_commit.
     dbox_index_close calls it.
   - dbox_index_rollback_all rolls the whole transaction back, deferred
     operations too: only for a failed commit.
   The owner of the connection (engine/store-commit.c) bounds how long
   a change stays deferred.  Needs what the connection needs (the
   store lock). */
int dbox_index_commit_later(struct dbox_index *index, bool made_inodes);
bool dbox_index_deferred(const struct dbox_index *index);
int dbox_index_commit_deferred(struct dbox_index *index);
void dbox_index_rollback_all(struct dbox_index *index);

/* Put every committed transaction on disk (fsync of the WAL), outside a
   transaction.  Returns 0, -ENOSPC or -EDQUOT (the disk or the quota is
   full) or -EIO (logged). */
int dbox_index_sync(struct dbox_index *index);

/* Current time (CLOCK_REALTIME) as a dbox time. */
int64_t dbox_now_ns(void);

/* Look up a maildir message by its unique name (len bytes, the name up
   to its ":2,flags", not NUL-terminated) in directory parent: an entry
   named unique, or unique followed by ':' and anything.  Returns 0 and
   fills *attr_r (the first such name in byte order), -ENOENT when there
   is none, -ENAMETOOLONG, or -EIO (logged). */
int dbox_index_lookup_unique(struct dbox_index *index, uint64_t parent,
			     const char *unique, size_t len,
			     struct dbox_attr *attr_r);

/* Look up name (namelen bytes, not NUL-terminated) in directory parent.
   Returns 0 and fills *attr_r, -ENOENT when absent, -ENAMETOOLONG for a
   name longer than DBOX_NAME_MAX. */
int dbox_index_lookup(struct dbox_index *index, uint64_t parent,
		      const char *name, size_t namelen,
		      struct dbox_attr *attr_r);

/* attr is what inode attr->ino holds after this connection's last change
   to it, in the transaction open now: keep it in the attribute cache
   (dbox_index_cache_attrs; nothing when the cache is off), so a change of
   its message row that leaves the attributes as they were (a WRITING
   row, whose record counts as 0 stored bytes) or one whose result the
   caller computed costs no read afterwards.  A rollback drops it with the
   rest. */
void dbox_index_attr_known(struct dbox_index *index,
			   const struct dbox_attr *attr);

/* Attributes of ino.  Returns 0 or -ENOENT. */
int dbox_index_getattr(struct dbox_index *index, uint64_t ino,
		       struct dbox_attr *attr_r);

/* Create a new inode of kind with mode (type bits included), uid, gid,
   mtime = ctime = atime = now_ns, nlink 1 (2 for a directory), named name
   in parent.  Sets parent's mtime and ctime to now_ns (and adds to its
   nlink for a directory).  Returns 0 and
   fills *attr_r (without reading it back); -EEXIST when the name exists,
   -ENAMETOOLONG, -ENOENT/-ENOTDIR when parent is not a directory.  A
   failure leaves nothing behind in the caller's transaction. */
int dbox_index_create(struct dbox_index *index, uint64_t parent,
		      const char *name, size_t namelen, enum dbox_kind kind,
		      uint32_t mode, uint32_t uid, uint32_t gid, int64_t now_ns,
		      struct dbox_attr *attr_r);

/* Add the name newparent/name for the existing non-directory ino; nlink+1,
   ino's ctime and newparent's mtime and ctime set to now_ns.  Returns 0
   and the new attributes in *attr_r; -EEXIST (name taken), -EPERM (ino
   is a directory), -ENOENT (no inode ino). */
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
   -EINVAL.  Both directories' mtime and ctime and the moved inode's ctime
   become now_ns.  The moved inode keeps its number, size and mtime; its
   attributes after the rename go to *moved_r (NULL: not wanted), from the
   lookup the rename makes anyway (no second read).  Errors: -ENOENT,
   -EEXIST (NOREPLACE), -ENOTDIR, -EISDIR, -ENOTEMPTY, -EINVAL,
   -ENAMETOOLONG, -EIO. */
int dbox_index_rename(struct dbox_index *index, uint64_t parent,
		      const char *name, size_t namelen, uint64_t newparent,
		      const char *newname, size_t newnamelen,
		      unsigned int flags, int64_t now_ns, struct dbox_attr *moved_r,
		      uint64_t *replaced_ino_r, uint32_t *replaced_nlink_r);

/* Store the attributes kind, mode, uid, gid, size, mtime_ns, ctime_ns,
   atime_ns and rdev from attr for attr->ino (nlink is not touched).  Returns 0 or -ENOENT. */
int dbox_index_setattr(struct dbox_index *index, const struct dbox_attr *attr);

/* Set the target of symbolic link inode ino to target (len bytes, no
   NUL; 1..PATH_MAX-1) and its size to len, inside the caller's
   transaction.  Returns 0, -ENAMETOOLONG, -ENOENT. */
int dbox_index_symlink_set(struct dbox_index *index, uint64_t ino,
			   const char *target, size_t len);

/* The target of symbolic link ino, malloc()ed and NUL-terminated into
   *target_r (caller frees).  Returns 0, -EINVAL when ino is not a
   symbolic link (readlink(2)'s errno), -EIO when its stored target is
   empty (a damaged row; logged), -ENOMEM. */
int dbox_index_readlink(struct dbox_index *index, uint64_t ino,
			char **target_r);

/* Extended attributes of an inode (table xattr), names with their
   namespace prefix ("user.x").  Limits, as the kernel's for every
   filesystem (linux/limits.h): a name of at most DBOX_XATTR_NAME_MAX
   bytes, a value of at most DBOX_XATTR_SIZE_MAX bytes; and per inode, as
   ext4 with large xattrs (ea_inode): the list of names (with their NULs)
   fits in DBOX_XATTR_SIZE_MAX bytes, names and values together in
   DBOX_XATTR_TOTAL_MAX bytes, else -ENOSPC. */
#define DBOX_XATTR_NAME_MAX 255
#define DBOX_XATTR_SIZE_MAX 65536
#define DBOX_XATTR_TOTAL_MAX (1024 * 1024)

/* The value of attribute name of ino, malloc()ed into *value_r (caller
   frees; NULL for an empty value) with its length in *len_r.  Returns 0,
   -ENODATA when ino has no such attribute, -ENOMEM. */
int dbox_index_xattr_get(struct dbox_index *index, uint64_t ino,
			 const char *name, void **value_r, size_t *len_r);

/* Set attribute name of ino to value (len bytes), inside the caller's
   transaction.  flags as setxattr(2): XATTR_CREATE (-EEXIST when it
   exists), XATTR_REPLACE (-ENODATA when it does not), 0 either.  Returns
   0, -ERANGE (name or value too long), -ENOSPC (the inode's limit). */
int dbox_index_xattr_set(struct dbox_index *index, uint64_t ino,
			 const char *name, const void *value, size_t len,
			 int flags);

/* Remove attribute name of ino.  Returns 0 or -ENODATA. */
int dbox_index_xattr_remove(struct dbox_index *index, uint64_t ino,
			    const char *name);

/* The one namespace of extended attributes dboxfs stores. */
#define DBOX_XATTR_USER_PREFIX "user."

/* The names of ino's attributes as listxattr(2) returns them (each
   NUL-terminated, in name order), malloc()ed into *list_r (NULL when
   none; caller frees) with the total length in *len_r.  Only user.*
   names of at most DBOX_XATTR_NAME_MAX bytes are listed: rows of other
   names (written into the index by hand) are left out.  Returns 0 or
   -ENOMEM. */
int dbox_index_xattr_list(struct dbox_index *index, uint64_t ino,
			  char **list_r, size_t *len_r);

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

/* How many names (entry rows) the index holds, every directory's: what a
   walk from the root must reach (dbox_export_unreached).  Returns 0 and
   *count_r, or -EIO. */
int dbox_index_entry_count(struct dbox_index *index, uint64_t *count_r);

/* List directory dir in entry.id order, starting after cookie `after` (0 =
   from the start).  Returns 0 when done or stopped, or a negative errno. */
int dbox_index_readdir(struct dbox_index *index, uint64_t dir, uint64_t after,
		       dbox_readdir_cb_t *cb, void *ctx);

/* The directory that holds directory dir (its ".."); the root's parent is
   the root.  Returns 0 and *parent_r, or -ENOENT. */
int dbox_index_parent(struct dbox_index *index, uint64_t dir,
		      uint64_t *parent_r);

/* The name of directory dir (its one entry), malloc()ed into *name_r
   (caller frees).  Returns 0, -ENOENT (the root has no name), -ENOMEM or
   -EIO. */
int dbox_index_name_of(struct dbox_index *index, uint64_t dir, char **name_r);

/* The path of inode ino below the root: the names of one of its
   entries and of the directories above it, joined by '/' ("tmp/1.host",
   ".A/cur/2.h:2,S"), malloc()ed into *path_r (caller frees); one read
   transaction.  Returns 0, -ENOENT (no name: the root, or unlinked),
   -EINVAL (a name holds '/', CR, LF or NUL: a damaged row, or a name no
   metadata line can carry), -ENOMEM, or -EIO (the way up does not reach
   the root within DBOX_TREE_MAX_DEPTH directories: a cycle). */
int dbox_index_path(struct dbox_index *index, uint64_t ino, char **path_r);

/* Name and parent of an entry of inode ino in one query (for an inode
   with several names, one of them): the name malloc()ed into *name_r
   (caller frees), the parent into *parent_r (NULL: not wanted).  Returns 0,
   -ENOENT (no name: the root, or unlinked), -ENOMEM or -EIO. */
int dbox_index_entry_of(struct dbox_index *index, uint64_t ino,
			uint64_t *parent_r, char **name_r);


/* Message location of ino.  Returns 0, or -ENOENT when ino is not a
   message. */
int dbox_index_msg_get(struct dbox_index *index, uint64_t ino,
		       struct dbox_msgloc *loc_r);

/* Insert or replace the message location of ino. */
int dbox_index_msg_set(struct dbox_index *index, uint64_t ino,
		       const struct dbox_msgloc *loc);

/* Delete meta key key (nothing when it is not there).  Returns 0, -ENOSPC
   or -EDQUOT (the disk or the quota is full) or -EIO (logged). */
int dbox_index_meta_delete(struct dbox_index *index, const char *key);

/* Called by dbox_index_meta_list with each key and its value; non-zero
   stops the walk. */
typedef int dbox_meta_cb_t(void *ctx, const char *key, int64_t value);

/* Every meta key that starts with prefix, in no order.  Returns 0, the
   callback's non-zero value, or -EIO (logged). */
int dbox_index_meta_list(struct dbox_index *index, const char *prefix,
			 dbox_meta_cb_t *cb, void *ctx);

/* Delete every meta key that starts with prefix.  Returns 0, -ENOSPC or
   -EDQUOT (the disk or the quota is full) or -EIO (logged). */
int dbox_index_meta_delete_prefix(struct dbox_index *index, const char *prefix);

/* The lowest record offset >= from in m.<file_id> of a message still
   WRITING (a delivery in flight), for crash recovery before
   dbox_index_recover drops those rows.  Returns 1 and *offset_r, 0 when
   there is none, or -EIO. */
int dbox_index_writing_offset(struct dbox_index *index, uint32_t file_id,
			      uint64_t from, uint64_t *offset_r);

/* The committed message the index places first in the alternate storage
   (lowest file_id, then offset) into *loc_r: a record whose GUID tells
   this store's ALT m.N from another store's of the same number
   (engine/alt-mark.h).  Returns 1, 0 when the ALT holds no committed
   message, or -EIO. */
int dbox_index_alt_first_msg(struct dbox_index *index,
			     struct dbox_msgloc *loc_r);

/* Called by dbox_index_msg_rows with each message row; non-zero stops. */
typedef int dbox_msg_row_cb_t(void *ctx, uint64_t ino,
			      const struct dbox_msgloc *loc);

/* Every message row (committed and WRITING), in no order, for crash
   recovery: which message a record past a committed end belongs to, by
   its GUID.  One scan of the message table.  Returns 0, the callback's
   non-zero value, or -EIO. */
int dbox_index_msg_rows(struct dbox_index *index, dbox_msg_row_cb_t *cb,
			void *ctx);

/* The end (bytes) of the last record in m.<file_id> that a committed
   message row names (max of offset + record_size; 0 when none): a
   committed end below it is a damaged mfile row.  Returns 0 or -EIO. */
int dbox_index_mfile_rows_end(struct dbox_index *index, uint32_t file_id,
			      uint64_t *end_r);

/* As dbox_index_msg_set, for the end of a save: when ino's row names
   the same record (file_id, offset, guid: the WRITING row its save
   began) it is updated in place (sizes and state), else it is set as
   dbox_index_msg_set does.  Inside a transaction (dbox_index_begin).
   Returns 0, -ENOSPC or -EDQUOT (the disk or the quota is full) or
   -EIO. */
int dbox_index_msg_finish(struct dbox_index *index, uint64_t ino,
			  const struct dbox_msgloc *loc);

/* Set only the state of ino's message row (the tests make the WRITING
   row of a finished record with it, as a damaged index may hold). */
int dbox_index_msg_set_state(struct dbox_index *index, uint64_t ino,
			     enum dbox_msg_state state);

/* Committed end (bytes) of m.<file_id>; returns 0, -ENOENT if unknown. */
int dbox_index_mfile_get(struct dbox_index *index, uint32_t file_id,
			 uint64_t *size_r);

/* Set the committed end of m.<file_id> (inserting the row if new). */
int dbox_index_mfile_set(struct dbox_index *index, uint32_t file_id,
			 uint64_t size);

/* *file_id_r: the lowest m.N the index places in the alternate storage.
   Returns 0, -ENOENT when there is none, -EIO. */
int dbox_index_mfile_alt_first(struct dbox_index *index, uint32_t *file_id_r);

/* Committed end of m.<file_id> and whether it lives in the alternate
   storage (ALT/storage/m.N, as opposed to STORE/storage/m.N).  Returns
   0, -ENOENT if unknown, -EIO. */
int dbox_index_mfile_where(struct dbox_index *index, uint32_t file_id,
			   uint64_t *size_r, bool *alt_r);

/* Record a new m.<file_id> in the alternate storage with committed end
   size (bytes).  Returns 0, -EIO (also when the row exists). */
int dbox_index_mfile_add_alt(struct dbox_index *index, uint32_t file_id,
			     uint64_t size);

/* A text setting of the store (e.g. DBOX_SETTING_ALT_PATH) into *value_r
   (malloc()ed, caller frees).  Returns 0, -ENOENT, -ENOMEM, -EIO. */
int dbox_index_setting_get(struct dbox_index *index, const char *key,
			   char **value_r);

/* Set a text setting of the store.  Returns 0, -ENOSPC or -EDQUOT (the
   disk or the quota is full) or -EIO (logged). */
int dbox_index_setting_set(struct dbox_index *index, const char *key,
			   const char *value);

/* Key of the alternate storage path (absolute), recorded by the first
   open that names one (dboxfs -o alt=, dboxadm altmove --alt=). */
#define DBOX_SETTING_ALT_PATH "alt_path"

/* Key of the id of the store's alternate storage, which its root's mark
   carries too (engine/alt-mark.h). */
#define DBOX_SETTING_ALT_ID "alt_id"

/* Key of the compression of new message bodies, as dbox_compress_format
   writes it ("none", "gz:6"), recorded by the last open that chose one
   (engine/store.h, dbox_store_settings.compress_given). */
#define DBOX_SETTING_COMPRESS "compress"

/* Meta key: the highest m.N number a purge forgot
   (dbox_index_mfile_delete). */
#define DBOX_META_MFILE_HIGH "mfile_high"

/* Highest file_id known - of an m.N the index has, or one a purge
   forgot (DBOX_META_MFILE_HIGH) - into *file_id_r (0 when none).
   Returns 0 or -EIO. */
int dbox_index_mfile_max(struct dbox_index *index, uint32_t *file_id_r);

/* Called per m.N file by dbox_index_mfile_list with its committed end
   (bytes); returns 0 to go on, anything else to stop the list. */
typedef int dbox_mfile_cb_t(void *ctx, uint32_t file_id, uint64_t size);

/* List every m.N the index knows, by file_id.  Returns 0, the value of
   the callback that stopped it, or -EIO. */
int dbox_index_mfile_list(struct dbox_index *index, dbox_mfile_cb_t *cb,
			  void *ctx);

/* Crash recovery, run once at open by the owner of the store lock: delete
   messages still WRITING (unfinished deliveries; their names go too, and
   their directories' mtime and ctime become now) - but for those with a
   meta key keep_prefix<ino> (an empty version a close acknowledged: the
   caller stores it, dbox_msg_restore_empty) - and every inode with nlink 0
   (unlinked while open when the process died).  keep_prefix is SQL text
   without quotes.  *writing_r and *orphans_r count the dropped ones;
   *files_r receives a malloc()ed array of plain-file inode numbers whose
   backing files the caller removes (count in *nfiles_r), and frees.
   Returns 0, -ENOMEM or the convention's SQLite errno (nothing in
   *files_r then). */
int dbox_index_recover(struct dbox_index *index, const char *keep_prefix,
		       unsigned int *writing_r, unsigned int *orphans_r,
		       uint64_t **files_r, size_t *nfiles_r);

/* A key in the meta table (format, uidvalidity, ...) as int64.
   Returns 0, -ENOENT. */
int dbox_index_meta_get(struct dbox_index *index, const char *key,
			int64_t *value_r);

/* Set a key of the meta table to value (inserting it if new).  Returns
   0 or the convention's SQLite errno. */
int dbox_index_meta_set(struct dbox_index *index, const char *key,
			int64_t value);

#endif
