#ifndef DBOX_STORE_LOCK_H
#define DBOX_STORE_LOCK_H
/*
 * store-lock: the lock of a store, STORE/lock.  One process uses a store
 * at a time: it holds flock(LOCK_EX) on STORE/lock for as long as it has
 * the store open (a mount, or dboxadm working offline).  The file's text
 * says what the holder is doing:
 *
 *   "<pid>\n<mount point>\n"
 *                a mount that takes purge requests (dboxadm purge), and
 *                where it is mounted (absolute; for messages only, and
 *                only once /proc/<pid>/mountinfo agrees);
 *   "closing\n"  a mount that was unmounted and is finishing its last
 *                writes (WAL checkpoint, closing m.N files) - this takes
 *                a moment after fusermount3 -u has already returned;
 *   empty        anything else.
 *
 * The text is advice only; the flock decides.  A crash leaves stale text
 * and no lock, which is harmless.
 */
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Seconds a process waits for a store whose mount is closing. */
#define DBOX_STORE_LOCK_WAIT 60

/* Take the lock of the store whose directory is dir_fd (path only for
   messages), creating STORE/lock (0600) if needed.  A holder that is
   closing is waited for, up to DBOX_STORE_LOCK_WAIT seconds, so a mount
   or dboxadm run right after an unmount works; any other holder makes it
   fail after half a second (time for a mount unmounted a moment ago to
   say it is closing).  The lock is opened with O_NOFOLLOW: a symbolic
   link (-ELOOP) or anything but a regular file (-EINVAL) is refused.
   Once taken, the lock's text is emptied (what an earlier holder left
   is not this holder's).  Returns the lock's descriptor (the caller
   closes it to let go), -EBUSY when the store is in use, or -errno;
   every failure is logged. */
int dbox_store_lock(int dir_fd, const char *path);

/* Take the lock shared, for a process that only reads the store (on
   read-only media): STORE/lock opened read-only, created (0600) when
   missing and the store's directory takes it - a fresh backup has none,
   and a read-write mount or dboxadm would create one and take it while
   the reader holds nothing (helper-90) -; only a store that can take no
   file (read-only media, no write permission, immutable, full) is used
   without a lock.
   Never through a symbolic link.
   Fails like dbox_store_lock while a writer holds the store (-EBUSY,
   logged), after the same wait for a writer that is closing.  Returns the
   descriptor, -ENOENT (not logged) when there is no lock file, or -errno
   (logged). */
int dbox_store_lock_shared(int dir_fd, const char *path);

/* Try the lock of the store whose directory is dir_fd once, without
   waiting and without logging: shared (LOCK_SH) or exclusive.  STORE/lock
   is opened read-only and never created, never through a symbolic link.
   Returns its descriptor with *held_r = true when this process now holds
   the lock (close the descriptor, or dbox_store_lock_release, to let
   go), or with *held_r = false when another process holds it (the
   descriptor then serves dbox_store_lock_holder and friends); -ENOENT
   when there is no lock file, -ELOOP for a symbolic link, -EINVAL for
   anything but a regular file, or another negative errno. */
int dbox_store_lock_try(int dir_fd, bool shared, bool *held_r);

/* Let go of a lock this process holds on lock_fd (dbox_store_lock_try),
   keeping the descriptor open. */
void dbox_store_lock_release(int lock_fd);

/* Take an exclusive lock of the open directory dir_fd once, without
   waiting: one writer at a time into a directory that is no store (a
   backup's DEST.partial).  The lock lasts until every descriptor of that
   open is closed.  Returns 0, -EBUSY when another open of it holds the
   lock, or another negative errno. */
int dbox_dir_lock_try(int dir_fd);

/* Write "closing\n" into the lock file lock_fd (held by this process).
   Returns 0 or -errno. */
int dbox_store_lock_set_closing(int lock_fd);

/* Another process holding the flock on the lock file lock_fd, from
   /proc/locks (best effort): its pid, and *shared_r whether it holds it
   shared (LOCK_SH: a -o ro mount or a read-only verb).  0 when none is
   found (no holder, or /proc unreadable). */
pid_t dbox_store_lock_holder(int lock_fd, bool *shared_r);

/* Describe the holder of lock_fd for a message, into buf (size bytes):
   "pid N", "pid N, a dboxfs mount on MOUNTPOINT" (the mount point the
   lock's text names, else the one absolute argument of its command line
   that is one; either only when it is a fuse.dboxfs mount point in
   /proc/N/mountinfo), or "" when unknown.
   N is the pid the lock's text names when that process holds the lock
   file and a FUSE device (a mount in the background: /proc/locks names
   the parent that took the flock and exited), else the flock's taker
   while it lives.  Returns buf. */
const char *dbox_store_lock_holder_text(int lock_fd, char *buf, size_t size);

/* Whether the text of the lock file lock_fd says its holder is closing. */
bool dbox_store_lock_is_closing(int lock_fd);

#endif
