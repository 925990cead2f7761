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
   -errno of pread (never -EINTR); errno is left as pread set it. */
ssize_t dbox_pread_full(int fd, void *buf, size_t len, uint64_t off);

/* The negative errno a failed call (ret < 0) of a storage/ function
   means, whichever convention it follows: its result when below -1, else
   -errno (the old "-1 with errno").  For the calls into dbox-format.c and
   dbox-read.c while issue #13 moves them to the negative-errno
   convention; drop it once they all return one. */
static inline int dbox_neg_errno(long ret)
{
	return ret < -1 ? (int)ret : -errno;
}

#endif
