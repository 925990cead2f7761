#ifndef DBOXFS_FS_FILE_H
#define DBOXFS_FS_FILE_H

/*
 * fs-file.h: what the operations on open files share: fs-file.c (create,
 * mknod, open, read, fallocate, init), fs-write.c (writing a message:
 * write, truncate, flush, release, fsync) and fs-setattr.c (setattr).
 * Not for the rest of fs/, which uses fs.h.  Locking: fs.h and the lock
 * order in engine/store.h.
 */

#include "fs.h"

#include <stdint.h>

/* The mount of a request (the session's userdata). */
static inline struct fs *fs_from_req(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

/* The open file of fi (set at open or create). */
static inline struct fs_handle *fs_handle_of(struct fuse_file_info *fi)
{
	return (struct fs_handle *)(uintptr_t)fi->fh;
}

/* Free an open file: its backing fd and reader, and take it out of
   fs->handles.  The caller drops its inode's nopen (fs_inode_unref, or by
   hand).  Needs the lock. */
void fs_handle_free(struct fs *fs, struct fs_handle *h);

/* fs-write.c: make inode->save a save that may be written: none, or one
   whose record is finished (a version a client was told is stored),
   gives way to a new save holding a copy of the first copy_bytes bytes
   of the committed message (copy-on-write).  Needs the lock and the
   inode idle; the copy runs unlocked with the inode busy, and it is idle
   again on return.  Returns 0 or a negative errno. */
int fs_message_writable(struct fs *fs, struct fs_inode *inode,
			uint64_t copy_bytes);

/* fs-write.c: a client wrote to (or truncated) message inode: its mtime
   and ctime are now, stored when the record is finished. */
void fs_message_written(struct fs_inode *inode);

/* fs-write.c: truncate message inode to size bytes (a new copy, like any
   write); finished now when no writer has it open, else at its next
   close or fsync.  Needs the lock and the inode idle.  Returns 0 or a
   negative errno. */
int fs_message_truncate(struct fs *fs, struct fs_inode *inode, uint64_t size);

/* fs-write.c: give committed message inode a new record whose R follows
   its mtime (a date of another width than the R its record has: no
   patch in place), finished now even while a writer has it open: the
   utime() that asks for it has returned, and the index must name the
   record with that date (a writer's next write makes another copy).
   size: its size in bytes (the caller has its attributes).  Needs the
   lock and the inode idle.  Returns 0 or a negative errno. */
int fs_message_redate(struct fs *fs, struct fs_inode *inode, uint64_t size);

#endif
