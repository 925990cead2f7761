#ifndef DBOXFS_LOST_FOUND_H
#define DBOXFS_LOST_FOUND_H

/*
 * lost-found: STORE/lost+found/ (engine/store-layout.h), where bytes a
 * store gives up are kept before they are cut: crash recovery's cuts
 * (store-recover.c) and rebuild's bytes that are no whole record
 * (rebuild-scan.c).  A copy there may be the only copy of a delivery, so
 * a copy is never replaced: two cuts at the same offset of one m.N (the
 * append pool writes there again after the first) give two files.
 */

#include <stdint.h>

/* Room for a copy's name: "m.N-OFFSET" and a ".K" suffix. */
#define DBOX_LOST_FOUND_NAME_SIZE 64

/* Keep bytes [from, end) of src_fd in STORE/lost+found/ (made, 0700, when
   missing) of the store whose directory is open as store_fd: as a new
   file named base (e.g. "m.5-4096"), else base.1, base.2, ... when that
   name holds other bytes.  A file of one of those names that holds these
   very bytes already is the copy (a rebuild or recovery run again), and
   nothing is written.  Holes stay holes (dbox_copy_range).  The copy and
   its name are on disk (fsync) before this returns.  The name used goes
   into name_r.  Returns 0, or a negative errno: nothing was kept. */
int dbox_lost_found_keep(int store_fd, int src_fd, uint64_t from,
			 uint64_t end, const char *base,
			 char name_r[DBOX_LOST_FOUND_NAME_SIZE]);

#endif
