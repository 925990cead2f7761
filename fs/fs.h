#ifndef DBOXFS_FS_H
#define DBOXFS_FS_H

/*
 * fs: the FUSE low-level filesystem over a dbox store.
 *
 * struct fs is the one mounted-store context: passed to libfuse as the
 * userdata of the session and reached from every request with
 * fuse_req_userdata().  Every callback answers its request exactly once.
 *
 * Locking: fs->st->lock guards the index, the inode table and the append
 * pool; callbacks take it for their whole index work and drop it before
 * replying.
 */

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include "fs/inode-table.h"
#include "index/store.h"

#include <stdbool.h>

struct fs_options {
	char *store;             /* STORE path (first non-option argument) */
	uint64_t rotate_size;    /* -o rotate_size=BYTES */
	double entry_timeout;    /* -o entry_timeout=SECONDS */
	double attr_timeout;     /* -o attr_timeout=SECONDS */
	unsigned int purge_threshold; /* -o purge_threshold=PERCENT (0 off) */
	char *compress;          /* -o compress=none|gz[:LEVEL] */
	int writeback_cache;     /* -o writeback_cache: the kernel caches
				    writes (FUSE_CAP_WRITEBACK_CACHE) */
	int foreground, debug;
};

struct fs {
	struct dbox_store *st;
	struct fs_inode_table inodes;
	struct fs_options opts;
	struct fuse_session *se;
	struct fs_purge *purge;    /* background purge (fs-purge.h) */
};

/* An open file: fi->fh points at one. */
struct fs_handle {
	enum dbox_kind kind;
	struct fs_inode *inode;    /* holds nopen; stays in the table */
	int fd;                    /* plain file: its backing fd */
	bool writer;               /* message opened for writing */
	struct dbox_reader *reader;/* committed message: plaintext reader */
	uint64_t reader_gen;       /* inode->gen the reader was opened at */
	pthread_mutex_t read_lock; /* the reader keeps stream state */
};

/* Take and drop the store lock. */
void fs_lock(struct fs *fs);
void fs_unlock(struct fs *fs);

/* End the transaction of an operation that returned ret: commit (durable:
   on disk before returning) when ret is 0, else roll back.  Returns ret or
   the commit's error. */
int fs_tx_end(struct fs *fs, int ret, bool durable);

/* The operations table (fs-dir.c, fs-file.c). */
extern const struct fuse_lowlevel_ops fs_ops;

/* fs-attr.c: fill a struct stat for attr (plain files take size and times
   from their backing file).  Returns 0 or a negative errno. */
int fs_stat(struct fs *fs, const struct dbox_attr *attr, struct stat *stbuf);

/* Fill a fuse_entry_param for attr and count a lookup of it (the caller
   replies with it).  Returns 0 or a negative errno. */
int fs_entry(struct fs *fs, const struct dbox_attr *attr,
	     struct fuse_entry_param *e);

/* Drop n kernel references to ino; an unlinked inode nobody holds any more
   is deleted (index row, backing file).  Needs the lock. */
void fs_inode_unref(struct fs *fs, uint64_t ino, uint64_t nlookup,
		    bool close);

/* After a name of ino went away leaving nlink: delete the inode now when
   nothing holds it, else when the last holder goes. Needs the lock. */
void fs_inode_unlinked(struct fs *fs, uint64_t ino, uint32_t nlink);

/* Name of the backing file of plain-file inode ino in STORE/files/. */
void fs_file_name(char buf[24], uint64_t ino);

/* True when a regular file named name created in directory parent is a
   message: parent is a cur/, new/ or tmp/ and name does not start with
   '.'.  Needs the lock. */
bool fs_is_message_name(struct fs *fs, uint64_t parent, const char *name);

/* Turn plain file ino (closed) into a message: its bytes are saved as an
   m.N record and the index says it is a message, inside the caller's
   transaction; the caller removes the backing file after the commit.
   Needs the lock. */
int fs_file_to_message(struct fs *fs, uint64_t ino, uint64_t parent);

#endif
