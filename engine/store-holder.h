#ifndef DBOXFS_STORE_HOLDER_H
#define DBOXFS_STORE_HOLDER_H

/*
 * store-holder: proving that the process holding a store's lock is the
 * dboxfs mount of that store, before anything is sent to it, and
 * signalling it (`dboxadm purge` and `dboxadm altmove` ask a mount with
 * SIGUSR1; store-lock.h: the mount writes its pid into STORE/lock).
 *
 * SIGUSR1 kills a process that does not handle it, so the pid in the lock
 * file is trusted only once proven:
 *   - it is a live process, held by a pidfd from then on, so the number
 *     cannot pass to another process before the signal;
 *   - its program is named dboxfs (/proc/PID/exe);
 *   - it holds this very lock file open (same device and inode, not the
 *     same path name) and a FUSE device (/dev/fuse): a mount of this
 *     store holds both, and only one process holds the lock;
 *   - it runs as the owner of the lock file (whoever mounts a store owns
 *     its lock).
 * Linux only (/proc, pidfd_open, pidfd_send_signal).
 */

#include <stdbool.h>
#include <sys/stat.h>
#include <sys/types.h>

/* Why a holder was not proven. */
enum dbox_holder_why {
	DBOX_HOLDER_PROVEN,
	DBOX_HOLDER_NO_PID,     /* the lock names no pid: not a mount that
				   takes requests (another dboxadm?) */
	DBOX_HOLDER_STALE,      /* no process has the pid (a stale pid) */
	DBOX_HOLDER_GONE,       /* it exited while it was looked at */
	DBOX_HOLDER_UNREADABLE, /* its /proc entries could not be read (err:
				   -EACCES or -EPERM when this process may
				   not look: not the mount's owner) */
	DBOX_HOLDER_NOT_MOUNT,  /* not dboxfs, or not holding this lock and
				   a FUSE device */
	DBOX_HOLDER_NOT_OWNER,  /* not running as the owner of the lock */
};

/* The holder of a store's lock, as dbox_holder_prove found it. */
struct dbox_holder {
	pid_t pid;              /* from the lock file, or 0 */
	int pidfd;              /* the caller's once proven, else -1 */
	enum dbox_holder_why why;
	int err;                /* DBOX_HOLDER_UNREADABLE: negative errno */
};

/* The pid the lock file lock_fd names ("<pid>\n", the first line).
   Returns 0 and *pid_r, or -EINVAL when its text is no such line (empty,
   "closing", a pid of 0 or 1). */
int dbox_holder_read_pid(int lock_fd, pid_t *pid_r);

/* The mount point the lock file lock_fd names after its pid (the second
   line, store-lock.h), into buf (size bytes, NUL-terminated).  Only what
   the holder wrote: check it before use.  Returns 0, or -EINVAL when
   there is none or it does not fit. */
int dbox_holder_read_mountpoint(int lock_fd, char *buf, size_t size);

/* Whether /proc/<pid>/exe is a program named dboxfs (a deleted one
   too).  Returns 1, 0, or a negative errno when it cannot be read
   (-ENOENT: no such process, -EACCES: another user's). */
int dbox_holder_runs_dboxfs(pid_t pid);

/* Whether process pid holds open both the file lock (by device and inode)
   and a FUSE device (the character device of /dev/fuse).  Returns 1, 0,
   -ENODEV when this system has no /dev/fuse, or another negative errno
   when its descriptors cannot be read. */
int dbox_holder_holds(pid_t pid, const struct stat *lock);

/* The effective uid of process pid, from /proc/<pid>/status.  Returns it
   (>= 0) or a negative errno. */
long dbox_holder_euid(pid_t pid);

/* Prove the holder of the lock file lock_fd (held by another process) as
   above.  Returns 0 with *h_r proven (h_r->pidfd open: release it with
   dbox_holder_release), or a negative errno with h_r->why saying why not
   (-EINVAL no pid, -ESRCH stale or gone, -EPERM not a mount of this store
   or not its owner's, or the errno of reading /proc). */
int dbox_holder_prove(int lock_fd, struct dbox_holder *h_r);

/* Send sig to the proven holder h (0: only check it lives).  Returns 0 or
   a negative errno (-ESRCH: it exited). */
int dbox_holder_signal(const struct dbox_holder *h, int sig);

/* Close h's pidfd, if any.  Safe to call twice. */
void dbox_holder_release(struct dbox_holder *h);

#endif
