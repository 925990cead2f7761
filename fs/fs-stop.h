#ifndef DBOXFS_FS_STOP_H
#define DBOXFS_FS_STOP_H

/*
 * fs-stop: an orderly stop (SIGTERM, SIGINT, SIGHUP; systemd's stop) of
 * a mount, as a local filesystem's `umount -l`: the mount leaves the tree
 * at once, and files open on it go on working until they are closed.
 * libfuse's own signal handlers end the session at once: with -o
 * writeback_cache the bytes write(2) took into the kernel's page cache
 * (sent later as WRITE requests) were lost with the unmount although
 * every write() had returned (attack runs: Dovecot's index log cut
 * short, acknowledged flag changes and expunges undone; megabytes
 * written during the stop gone), and without it every client with a
 * file open got ENOTCONN in the middle of its read or delivery
 * (helper-80).  Here the signal wakes a thread that has the kernel write
 * back the cached pages of every file a client holds open
 * (fuse_lowlevel_notify_inval_inode: the kernel writes each dirty page
 * and waits for its WRITE, which the request threads serve meanwhile),
 * then detaches the mount (umount -l) and lets the session run until the
 * kernel ends it, when the last file open on the mount is closed: writes
 * to those files, even after the signal, reach the store.  Root detaches
 * only after checking that the mount point still holds this very mount,
 * which libfuse's unmount by path does not.  A killed daemon (SIGKILL)
 * still loses what the kernel had not sent: dboxfs(1), -o
 * writeback_cache.
 */

#include <fuse_lowlevel.h>
#include <stdbool.h>

struct fs;

/* Take over SIGTERM, SIGINT and SIGHUP from libfuse's handlers (already
   installed: fuse_set_signal_handlers) for fs's mount, made and serving
   from now on, whose session loop runs in the calling thread: at one of
   them, write back, detach, serve until the last file is closed.
   Returns 0, or a negative errno (logged): the stop then stays
   libfuse's. */
int fs_stop_start(struct fs *fs);

/* Is req (a LOOKUP of name in the mount's root) the stop's own question
   whether the mount point is this mount?  Then the lookup is answered
   with the error FS_STOP_ANSWER, which no lookup of a name answers
   otherwise.  Any thread. */
bool fs_stop_is_asking(struct fs *fs, fuse_req_t req, const char *name);
#define FS_STOP_ANSWER ENOTUNIQ

/* Has the stop detached the mount (the session then ends when the last
   file open on it is closed)?  Any thread. */
bool fs_stop_detached(const struct fs *fs);

/* Did root's stop deal with the unmount itself (detached the mount, or
   found another mount at the mount point)?  Then nothing may unmount the
   mount point by its path afterwards (libfuse's fuse_session_unmount
   would take whatever is mounted there now).  Before fs_stop_finish. */
bool fs_stop_took_unmount(const struct fs *fs);

/* Give the signals back to libfuse's handlers and end the thread.  Safe
   when fs_stop_start was not called or failed. */
void fs_stop_finish(struct fs *fs);

#endif
