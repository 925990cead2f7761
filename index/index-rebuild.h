#ifndef DBOXFS_INDEX_REBUILD_H
#define DBOXFS_INDEX_REBUILD_H

/*
 * index-rebuild: what `dboxadm rebuild` needs from the index layer:
 *
 *  - salvage: read whatever rows can still be read from an old, possibly
 *    corrupt index.sqlite (names, inodes, where messages were), without
 *    trusting it to be whole;
 *  - writing a new index with given inode numbers, so that a rebuilt
 *    store keeps the inode numbers of everything the old index still
 *    knew (clients order by them; plain files live in files/<ino>).
 *
 * Never reads m.N files.  The writer functions run inside the caller's
 * transaction (dbox_index_begin/commit), on an index no mount uses.
 * Return convention as in index.h.
 */

#include "index.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One inode, one name and one message row read from an old index. */
struct dbox_salvage_entry {
	uint64_t id;          /* entry.id: readdir order within parent */
	uint64_t parent, ino;
	char *name;           /* not NUL-terminated; namelen bytes */
	size_t namelen;
};

struct dbox_salvage_msg {
	uint64_t ino;
	uint32_t file_id;
	uint64_t offset;
	uint64_t body_size, record_size, vsize; /* bytes, as the index had them */
	enum dbox_msg_state state;
	char guid[33];        /* as struct dbox_msgloc has it */
};

/* A symbolic link's target (format 2 table symlink). */
struct dbox_salvage_symlink {
	uint64_t ino;
	char *target;         /* NUL-terminated, malloc()ed */
};

/* An extended attribute (format 2 table xattr). */
struct dbox_salvage_xattr {
	uint64_t ino;
	char *name;           /* NUL-terminated, malloc()ed */
	void *value;          /* malloc()ed, len bytes (NULL when 0) */
	size_t len;
};

/* One m.N the old index knew, and its committed end (bytes): a record
   past it is one the old index never knew, not an expunged one. */
struct dbox_salvage_mfile {
	uint32_t file_id;
	uint64_t size;
};

/* Everything salvaged; arrays sorted by ino (inodes, msgs) and by
   (parent, name) (entries).  complete is true when every table was read
   to its end without an error and SQLite's quick check found nothing:
   then the old index is whole, and a record of storage/ it does not
   know is an expunged message waiting for purge. */
struct dbox_salvage {
	struct dbox_attr *inodes;
	size_t ninodes;
	struct dbox_salvage_entry *entries;
	size_t nentries;
	struct dbox_salvage_msg *msgs;
	size_t nmsgs;
	struct dbox_salvage_symlink *symlinks; /* sorted by ino */
	size_t nsymlinks;
	struct dbox_salvage_xattr *xattrs;     /* by ino, then name */
	size_t nxattrs;
	struct dbox_salvage_mfile *mfiles; /* sorted by file_id */
	size_t nmfiles;
	int64_t uidvalidity;   /* 0 when unreadable */
	uint64_t prefixed;     /* meta keys that start with the caller's
				  count_prefix (0 when unreadable) */
	int64_t value;         /* the meta value of the caller's value_key
				  (0 when absent or unreadable) */
	bool opened;           /* SQLite could open it as a database */
	bool complete;
	unsigned int read_errors; /* tables or row ranges that failed */
};

/* What the caller's meta keys dbox_index_salvage reads (each may be
   NULL): how many keys start with count_prefix (-> prefixed), and the
   value of value_key (-> value). */
struct dbox_salvage_keys {
	const char *count_prefix;
	const char *value_key;
};

/* Salvage the index at path (which nobody uses), reading each table in
   rowid order and, at a damaged page, going on after it where SQLite
   can find later rows.  The file is not changed (the WAL next to it,
   path + "-wal", is read but never checkpointed into it).  keys (may be
   NULL) names meta keys to read.  Returns 0
   and *salvage_r (possibly empty when nothing was readable; the caller
   frees it with dbox_index_salvage_free), or -ENOMEM.  Problems found
   are logged as warnings. */
int dbox_index_salvage(const char *path, const struct dbox_salvage_keys *keys,
		       struct dbox_salvage **salvage_r);

/* The salvaged target of symbolic link ino, or NULL when it was not
   read (then the symlink is lost, as a message whose record is). */
const char *dbox_salvage_symlink_target(const struct dbox_salvage *s,
					uint64_t ino);

/* Free a salvage and set *salvage to NULL.  Safe on NULL. */
void dbox_index_salvage_free(struct dbox_salvage **salvage);

/* Insert inode attr->ino with all of attr (kind, mode, uid, gid, nlink,
   size, mtime, ctime); the root (DBOX_ROOT_INO), which a new index
   already has, is updated instead.  Later dbox_index_create() calls
   number above every inode inserted so.  Returns 0, -EEXIST when the
   number is taken. */
int dbox_index_rebuild_inode(struct dbox_index *index,
			     const struct dbox_attr *attr);

/* Insert the name parent/name for ino, without touching link counts or
   times.  Returns 0, -EEXIST (name taken), -ENAMETOOLONG, -EINVAL (not a
   valid name: empty, ".", "..", with '/' or NUL). */
int dbox_index_rebuild_entry(struct dbox_index *index, uint64_t parent,
			     const char *name, size_t namelen, uint64_t ino);

/* Make inode numbers handed out later (dbox_index_create) larger than
   ino, e.g. when STORE/files/<ino> exists for no inode: a transaction
   that created it was rolled back, and SQLite would hand the number out
   again.  In the caller's transaction.  Returns 0 or -EIO. */
int dbox_index_reserve_ino(struct dbox_index *index, uint64_t ino);

/* Make every link count match the names (non-directories: names;
   directories: 2 + subdirectories).  Returns 0 or -EIO. */
int dbox_index_rebuild_nlinks(struct dbox_index *index);

#endif
