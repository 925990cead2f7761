#ifndef DBOXFS_IO_H
#define DBOXFS_IO_H

/*
 * io: the small system-call helpers storage/ shares.  No dbox format
 * knowledge here; only the byte I/O the format code builds on.
 */

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* pread len bytes of fd at byte offset off into buf, retrying after EINTR
   and short reads, stopping early only at EOF.  Returns the byte count
   read (less than len only at EOF, 0 when off is at or past EOF), or
   -errno of pread (never -EINTR). */
ssize_t dbox_pread_full(int fd, void *buf, size_t len, uint64_t off);

/* Copy bytes [start, end) of in to out from out's offset 0, leaving the
   holes of a sparse in as holes (SEEK_DATA/SEEK_HOLE: a store's owner
   can make a terabyte of hole on a few blocks, which a plain copy would
   write out in full); out ends up end - start bytes long.  Returns 0, -EIO
   when in ends before end, or -errno of a read or write. */
int dbox_copy_range(int in, uint64_t start, uint64_t end, int out);

/* fd, just opened (with O_NONBLOCK, so that opening a FIFO did not wait)
   where a store keeps a regular file, if it is one; else fd is closed and
   -EIO returned (a FIFO or device planted by whoever owns the store: its
   reads would wait forever or mean nothing), as for -errno of fstat.
   sb_r (may be NULL) gets the fstat of a regular file, so the caller
   needs no second one.  Takes ownership of fd; fd < 0 is returned as it
   is. */
struct stat;
int dbox_fd_regular(int fd, struct stat *sb_r);

#endif
