#ifndef DBOXFS_INODE_TABLE_H
#define DBOXFS_INODE_TABLE_H

/*
 * inode-table: what the daemon must remember about inodes the kernel
 * holds: lookup counts (nlookup, as passthrough_ll keeps them), open
 * handles, and the save of a message being written.  Inodes the kernel
 * has forgotten and nobody has open are not in the table; everything else
 * about an inode lives in the index.
 *
 * An open-addressing hash (linear probing, backward-shift deletion) of
 * pointers, so a million cached inodes cost about 56 MB.  Not thread-safe:
 * used under the store lock.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct dbox_save;

struct fs_inode {
	/* 8-byte fields first, then 4-byte, then 1-byte: 72 bytes with no
	   padding, a 80-byte malloc chunk (it was 96: the kernel keeps an
	   inode per name listed, so a million-message `ls -l` holds a
	   million of these). */
	uint64_t ino;
	uint64_t nlookup;        /* references the kernel holds */
	struct dbox_save *save;  /* the message being written, or NULL */
	uint64_t gen;            /* bumped when the message gets a new record
				    (copy-on-write): readers of the old one
				    must reopen (atomic: read without lock) */
	int64_t wtime;           /* dbox time of the last write (written) */
	uint64_t name_seq;       /* a plain file: the commit
				    (dbox_ns_sync_point) of its last create,
				    link or rename by this mount, or 0; its
				    fsync syncs the index up to it, as ext4's
				    fsync of a new file makes its name
				    durable too */
	uint64_t busy_size;      /* busy: the save's size when it began, for
				    stat (the save is not to be read) */
	uint32_t nopen;          /* open file handles */
	uint32_t nwriters;       /* of those, open for writing a message */
	uint32_t nlisting;       /* a directory: its open handles the
				    kernel may fill its listing cache by
				    (cache_readdir; fs-dir.c) */
	bool unlinked;           /* no names left: delete when unreferenced */
	uint8_t kind;            /* enum dbox_kind as the index has it, or 0
				    when not known; whoever changes an
				    inode's kind in the index updates it */
	bool written;            /* a message written to since its mtime was
				    last stored: mtime = ctime = wtime, stored
				    when the record is finished */
	bool busy;               /* a thread works on its bytes without the
				    store lock (a write, a finish, a copy):
				    everything else that touches them waits
				    (fs.h) */
};

struct fs_inode_table {
	struct fs_inode **slots;
	size_t size;  /* power of two */
	size_t count;
};

/* Initialise an empty table.  Returns 0 or -ENOMEM. */
int fs_inode_table_init(struct fs_inode_table *table);

/* Free every entry and the table. */
void fs_inode_table_deinit(struct fs_inode_table *table);

/* The entry of ino, or NULL. */
struct fs_inode *fs_inode_get(struct fs_inode_table *table, uint64_t ino);

/* The entry of ino, added (zeroed) if absent.  NULL on ENOMEM. */
struct fs_inode *fs_inode_add(struct fs_inode_table *table, uint64_t ino);

/* True when nothing refers to the entry any more (no lookups, no opens,
   not busy). */
bool fs_inode_unused(const struct fs_inode *inode);

/* Remove and free the entry of ino (no-op if absent). */
void fs_inode_remove(struct fs_inode_table *table, uint64_t ino);

#endif
