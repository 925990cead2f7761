#ifndef DBOXFS_VERIFY_H
#define DBOXFS_VERIFY_H

/*
 * verify: a check of the whole index (SQLite's PRAGMA quick_check) in a
 * thread of its own, for a mount that found a WAL left by a crash.  That
 * WAL is replayed onto index.sqlite as it lies, and SQLite cannot tell
 * whether it belongs to it: a backup's index.sqlite copied over such a
 * store gets pages of another state, and the damage shows only where a
 * request happens to read.  The check reads every page (seconds per
 * 100,000 messages with a cold cache), so the mount does not wait for
 * it; damage it finds marks the index damaged, and from then on no
 * change is made to it (dbox_index_begin returns -EIO), so no client is
 * told a message is stored in an index that may lose it.
 */

struct dbox_index;

/* Start the check of index (opened read-write, the WAL replayed).
   Returns 0, or a negative errno when the thread or its read-only
   connection cannot be made (logged; the mount goes on unchecked).  Call
   once per open index, in the process that goes on using it. */
int dbox_index_verify_start(struct dbox_index *index);

/* Stop a running check (interrupted) and close its connection; safe when
   none was started.  dbox_index_close calls it. */
void dbox_index_verify_stop(struct dbox_index *index);

#endif
