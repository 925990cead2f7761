#ifndef DBOXFS_DBOX_FAULT_H
#define DBOXFS_DBOX_FAULT_H

/*
 * dbox-fault: the one error convention of storage/, index/ and engine/,
 * and how corruption is reported.
 *
 * Every function returns 0 (or a count, a size, a descriptor) on success
 * and a negative errno on failure.  errno itself is never the result: a
 * caller reads the return value only.
 *
 * Corruption - bytes in a store that are not what the dbox format
 * (docs/dbox-format.md) or the index says they are - is DBOX_ECORRUPT,
 * -EUCLEAN ("Structure needs cleaning"), the code ext4 and XFS give for
 * on-disk corruption.  Its reason travels as data: a function that can
 * find corruption takes a struct dbox_fault * (NULL when the caller does
 * not want it) and fills it in, so `dboxadm check` and rebuild report the
 * reason without reading the log.  The mount logs it.
 */

#include <errno.h>
#include <stdint.h>

#define DBOX_ECORRUPT EUCLEAN

struct dbox_fault {
	uint64_t offset;   /* where in the file the damage is, in bytes */
	char reason[200];  /* one line, e.g. "bad record header magic" */
};

/* Fill in *fault (when not NULL): offset and a printf-style reason (cut to
   fit).  Returns -DBOX_ECORRUPT, so a parser can write
   `return dbox_fault_set(fault, off, "...");`. */
int dbox_fault_set(struct dbox_fault *fault, uint64_t offset,
		   const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* A negative errno as the mount and the tools report it outside the
   store: -DBOX_ECORRUPT becomes -EIO (what read(2) returns for data that
   cannot be read); any other value is returned as it is. */
static inline int dbox_corrupt_as_eio(int err)
{
	return err == -DBOX_ECORRUPT ? -EIO : err;
}

#endif
