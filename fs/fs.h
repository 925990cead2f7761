#ifndef DBOXFS_FS_H
#define DBOXFS_FS_H

/*
 * fs: the FUSE low-level filesystem over a dbox store.
 *
 * struct fs is the one mounted-store context: passed to libfuse as the
 * userdata of the session and reached from every request with
 * fuse_req_userdata().  Every callback answers its request exactly once.
 *
 * Locking: fs->st->lock guards the index, the inode table and the append
 * pool; callbacks take it for their whole index work and drop it before
 * replying.  Work on a message's bytes that takes long - reading a body
 * back for its V, compressing it, copying a committed message before its
 * first write, copying a plain file into a message - runs without the
 * lock: the inode is marked busy meanwhile, and every request that would
 * touch its save or bytes waits for it (fs_inode_wait_idle), while
 * everything else (other files, stat, listings) goes on.
 *
 * The lock order (fs_handle.read_lock, fs_dirhandle.lock, inode busy,
 * st->lock, fs_purge.lock, the index mutexes) is written once, in
 * engine/store.h, and checked there: fs_lock and fs_unlock take st->lock
 * through dbox_store_mutex_lock/unlock, which record the holder, and
 * fs_busy_begin/end assert the busy rules.  A save's references (an
 * fsync using it between its steps outside the lock, fs-write.c:
 * dbox_save_ref) are no lock: nobody waits for them, and an fsync
 * holding one waits for idle like everyone else before it touches the
 * inode again.
 */

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include "fs/inode-table.h"
#include "engine/message.h"
#include "engine/namespace.h"
#include "engine/store.h"

#include <stdbool.h>

struct fs_options {
	char *store;             /* STORE path (first non-option argument) */
	char *mountpoint_arg;    /* MOUNTPOINT as given (libfuse resolves
				    it: cmd.mountpoint) */
	uint64_t rotate_size;    /* -o rotate_size=BYTES */
	double entry_timeout;    /* -o entry_timeout=SECONDS */
	double attr_timeout;     /* -o attr_timeout=SECONDS */
	unsigned int purge_threshold; /* -o purge_threshold=PERCENT (0 off) */
	char *compress;          /* -o compress=none|gz[:LEVEL] */
	char *alt;               /* -o alt=PATH: the alternate storage */
	bool readonly;           /* -o ro (also passed on to libfuse) */
	int user_xattr;          /* -o user_xattr: store user.* xattrs */
	int noatime;             /* -o noatime: reads never move atime */
	int writeback_cache;     /* -o writeback_cache: the kernel caches
				    writes (FUSE_CAP_WRITEBACK_CACHE) */
	int nonempty;            /* -o nonempty: mount over a directory
				    that is not empty */
	int kernel_checks;       /* -o allow_other, allow_root,
				    default_permissions or writeback_cache:
				    the kernel checks permissions (else
				    fs-perm.c does) */
	int suid, dev;           /* the last of -o suid/nosuid, dev/nodev:
				    1 or 0, -1 when not given (libfuse's
				    mount then has nosuid, nodev) */
	int fsname_given;        /* -o fsname=: the mount's source is that,
				    not the store's path */
	int foreground, debug;
};

struct fs {
	struct dbox_store *st;
	struct fs_inode_table inodes;
	struct fs_options opts;
	struct fuse_session *se;
	struct fs_purge *purge;    /* background purge (fs-purge.h) */
	struct fs_stop *stop;      /* writeback_cache's stop (fs-stop.h) */
	const char *mountpoint;    /* absolute (libfuse's realpath) */
	pthread_cond_t idle;       /* with st->lock: an inode stopped being
				      busy */
	struct fs_handle *handles; /* every open handle (st->lock): the ones
				      the kernel never released are freed
				      at exit (fs_handles_free) */
	struct fs_dirhandle *dirs; /* every open directory (st->lock), the
				      same way (fs_dirhandles_free) */
	bool own_checks;           /* the daemon checks permissions
				      (fs-perm.c), not the kernel */
	bool others_store;         /* root works on another user's store
				      (fs/owner.h): every mode, owner and
				      device number in it is that user's to
				      write (fs_stat serves only what they
				      could make) */
	uid_t store_uid;           /* that user and group, when */
	gid_t store_gid;           /* others_store */
	bool protected_hardlinks;  /* sysctl fs.protected_hardlinks at
				      mount time */
	struct fs_walkcut *walkcut;/* fs-walkcut.c's thread, or NULL */
	bool no_listing_cache;     /* a drop of a cached listing failed
				      (fs_dir_drop_listing): listings are
				      no longer cached (atomic) */
};

struct fs_dirhandle; /* fs-dir.c: an open directory */

/* An open file: fi->fh points at one. */
struct fs_handle {
	enum dbox_kind kind;
	struct fs_inode *inode;    /* holds nopen; stays in the table */
	int fd;                    /* plain file: its backing fd */
	bool writer;               /* message opened for writing */
	struct dbox_reader *reader;/* committed message: plaintext reader */
	uint64_t reader_gen;       /* inode->gen the reader was opened at */
	pthread_mutex_t read_lock; /* the reader keeps stream state */
	bool atime_due;            /* its first read moves atime (relatime) */
	struct fs_handle *prev, *next; /* in fs->handles */
};

/* fs-file.c: free the handles the kernel never released (a RELEASE
   still queued when the session ended at unmount).  At exit, after the
   request loop, on one thread. */
void fs_handles_free(struct fs *fs);

/* fs-write.c: release the handles the kernel never released as their
   RELEASE would have (a stop with files still open: SIGTERM without
   writeback_cache, the session ended): a message written through one is
   finished, keeping what write(2) returned, as for plain files.  At exit,
   after the request loop, on one thread, with the store open. */
void fs_handles_release(struct fs *fs);

/* fs-dir.c: the same for directory handles (a RELEASEDIR still queued:
   a directory open when the session ended). */
void fs_dirhandles_free(struct fs *fs);

/* Take and drop the store lock (st->lock, dbox_store_mutex_lock: lock
   order in engine/store.h).  fs_lock first waits while the WAL checkpoint
   is behind (dbox_store_wal_throttle). */
void fs_lock(struct fs *fs);
void fs_unlock(struct fs *fs);

/* Directory dir got or lost a name (create, mknod, mkdir, symlink, link,
   unlink, rmdir, rename): whether the kernel may be filling its listing
   cache now (a handle opened with cache_readdir is open; fs-dir.c,
   fs_opendir, says why it matters).  If so, the caller calls
   fs_dir_drop_listing(dir) after unlocking, before its reply.  Needs the
   lock. */
bool fs_dir_listed(struct fs *fs, uint64_t dir);

/* Drop the kernel's cached listing of dir (one write to /dev/fuse).
   Without the lock, before the reply of the change. */
void fs_dir_drop_listing(struct fs *fs, uint64_t dir);

/* End the transaction of an operation that returned ret: commit (durable:
   on disk before returning) when ret is 0, else roll back.  Returns ret or
   the commit's error. */
int fs_tx_end(struct fs *fs, int ret, bool durable);

/* fs-perm.c: permission checks made by the daemon on a mount only its
   owner can reach (fs->own_checks; see fs-perm.c for why).  Each returns
   0 at once on other mounts, where the kernel checks
   (default_permissions).  All but fs_perm_begin need the lock. */
struct dbox_cred;

/* __FMODE_EXEC in an OPEN's flags: an open for execve(). */
#define FS_FMODE_EXEC 040

/* Fill *c with req's caller (supplementary groups fetched on first
   need; dbox_cred_release frees them). */
void fs_perm_begin(fuse_req_t req, struct dbox_cred *c);

/* May c access ino for mask (DBOX_MAY_*)?  0, -EACCES, or the index's
   error (-ENOENT, -EIO). */
int fs_perm_inode(struct fs *fs, struct dbox_cred *c, uint64_t ino,
		  int mask);

/* May c look a name up in directory dir (x on it)?  Like fs_perm_inode
   with DBOX_MAY_EXEC, without an attribute lookup for a privileged
   caller. */
int fs_perm_search(struct fs *fs, struct dbox_cred *c, uint64_t dir);

/* ACCESS: like fs_perm_inode, and ino must exist on every mount. */
int fs_perm_access(struct fs *fs, struct dbox_cred *c, uint64_t ino,
		   int mask);

/* May c open ino with open(2) flags (access mode, O_TRUNC,
   FS_FMODE_EXEC)?  0 or -EACCES (or the index's error). */
int fs_perm_open(struct fs *fs, struct dbox_cred *c, uint64_t ino,
		 int flags);

/* May c create a name in parent?  0, -EACCES, -ENOTDIR. */
int fs_perm_create(struct fs *fs, struct dbox_cred *c, uint64_t parent);

/* May c remove parent/name (sticky rule included)?  0, -EACCES,
   -EPERM. */
int fs_perm_delete(struct fs *fs, struct dbox_cred *c, uint64_t parent,
		   const char *name);

/* May c rename parent/name to newparent/newname with rename flags?
   Both sides as removals (or a creation); a directory moved to another
   parent is checked by fs_perm_moved once known.  0, -EACCES, -EPERM. */
int fs_perm_rename(struct fs *fs, struct dbox_cred *c, uint64_t parent,
		   const char *name, uint64_t newparent, const char *newname,
		   unsigned int flags);

/* Inside a rename's transaction, once moved is known: a directory given
   a new parent needs w on itself.  0 or -EACCES. */
int fs_perm_moved(struct fs *fs, struct dbox_cred *c,
		  const struct dbox_attr *moved, bool new_parent);

/* May c set or remove a user.* extended attribute of ino: w on it, a
   regular file or directory, and of a sticky directory the owner only
   (xattr_permission)?  0, -EACCES, -EPERM. */
int fs_perm_xattr_write(struct fs *fs, struct dbox_cred *c, uint64_t ino);

/* May c link ino into newparent (protected hardlinks, then
   creation)?  0, -EPERM, -EACCES. */
int fs_perm_link(struct fs *fs, struct dbox_cred *c, uint64_t ino,
		 uint64_t newparent);

/* May c change attr as a SETATTR with to_set and in asks (through an
   open handle when by_handle)?  *mode is the new mode (permission
   bits), with setgid dropped as chmod drops it.  0, -EPERM, -EACCES. */
int fs_perm_setattr(struct fs *fs, struct dbox_cred *c,
		    const struct dbox_attr *attr, const struct stat *in,
		    int to_set, bool by_handle, uint32_t *mode);

/* fs-walkcut.c: after a chmod or chown that takes the owner's search
   permission on a directory away, the kernel is told (by a thread of
   its own) to drop the names it has cached in it. */
struct fs_walkcut_job;

/* Start the thread (mounts with own checks; fs->walkcut stays NULL on
   others).  Returns 0 or a negative errno. */
int fs_walkcut_start(struct fs *fs);

/* Stop it at exit (after the request loop): waits a second at most for
   a notification in progress.  Idempotent. */
void fs_walkcut_stop(struct fs *fs);

/* After a chmod or chown of directory before -> after (same inode):
   when it took c's search permission away, *job_r gets the names in it
   whose inodes the kernel holds, for fs_walkcut_queue; else NULL.  Needs
   the lock.  Returns 0 or a negative errno (then *job_r holds what was
   collected). */
int fs_walkcut_collect(struct fs *fs, struct dbox_cred *c,
		       const struct dbox_attr *before,
		       const struct dbox_attr *after,
		       struct fs_walkcut_job **job_r);

/* Hand job (may be NULL) to the thread, which frees it.  Call without
   the lock, after the SETATTR's reply. */
void fs_walkcut_queue(struct fs *fs, struct fs_walkcut_job *job);

/* The operations table (fs-dir.c, fs-file.c). */
extern const struct fuse_lowlevel_ops fs_ops;

/* fs-attr.c: fill a struct stat for attr (plain files take size and times
   from their backing file; in another user's store, fs->others_store,
   only the claims that user could make: setuid on their own files,
   setgid on their group's, a device node as root's without permission
   bits).  Returns 0 or a negative errno. */
int fs_stat(struct fs *fs, const struct dbox_attr *attr, struct stat *stbuf);

/* fs-setattr.c: answer an attribute request: the error -ret when ret < 0,
   else stbuf with the mount's attribute timeout.  Called without the
   lock. */
void fs_reply_attr(fuse_req_t req, struct fs *fs, int ret,
		   const struct stat *stbuf);

/* fs-attr.c: reply to a GETATTR/SETATTR whose outcome is ret with the
   struct stat of attr (fs_stat), dropping the store lock (held on entry)
   before the reply. */
void fs_reply_attr_unlock(fuse_req_t req, struct fs *fs, int ret,
			  const struct dbox_attr *attr);

/* fs-dir.c: create what nw says (a directory, symlink or special file;
   uid and gid are filled from the request) in parent and reply with its
   entry.  Takes the lock. */
void fs_create_node(fuse_req_t req, fuse_ino_t parent, const char *name,
		    struct dbox_ns_new *nw);

/* The namespace hooks of this mount (engine/namespace.h): an inode the
   kernel or a handle still holds is kept when its last name goes. */
struct dbox_ns_hooks fs_ns_hooks(struct fs *fs);

/* dbox_ns_held_cb_t of the mount (ctx: the struct fs): true, and the
   inode marked unlinked, when the kernel or a handle still holds ino; it
   is deleted when the last holder goes (fs_inode_unref).  Needs the
   lock. */
bool fs_inode_held(void *ctx, uint64_t ino);

/* fs-attr.c: a dbox time (index.h) as a struct timespec, and back
   (clamped to ext4's range as ext4 clamps). */
struct timespec fs_time_ts(int64_t t);
int64_t fs_ts_time(const struct timespec *ts);

/* The mtime of message attr as clients see it: the time of its last
   write while that is not yet stored (inode->written), else the index's.
   Needs the lock. */
int64_t fs_message_mtime(struct fs *fs, const struct dbox_attr *attr);

/* Should a read at now move attr's atime?  Linux's relatime rule (ext4's
   default): when atime is not later than mtime or ctime, or is a day old
   or more; never with -o noatime.  Needs the lock. */
bool fs_atime_due(struct fs *fs, const struct dbox_attr *attr, int64_t now);

/* Would a read of the plain file whose backing file has the attributes
   st (its fstat at open) move that file's atime (by the same rule; the
   read itself moves it, by the backing mount's rule)?  Never with -o
   noatime. */
bool fs_backing_atime_due(struct fs *fs, const struct stat *st);

/* A read of ino happened: set its atime to now when fs_atime_due, in a
   transaction of its own, not synced: a power loss may lose a read-driven
   atime (as ext4's lazytime would), never an explicit utime(), which
   setattr stores as every other attribute.  Returns 0 or a negative errno.  Needs the lock. */
int fs_atime_touch(struct fs *fs, uint64_t ino);

/* Fill a fuse_entry_param for attr and count a lookup of it (the caller
   replies with it).  Returns 0 or a negative errno. */
int fs_entry(struct fs *fs, const struct dbox_attr *attr,
	     struct fuse_entry_param *e);

/* Drop nlookup kernel references to ino (FORGET), and one open handle
   when close (RELEASE); an unlinked inode nobody holds any more is
   deleted (index row, backing file).  Needs the lock. */
void fs_inode_unref(struct fs *fs, uint64_t ino, uint64_t nlookup,
		    bool close);

/* After a namespace operation: tell background purge about the garbage
   a deleted message left (gone may be all zero).  Needs the lock. */
void fs_inode_gone(struct fs *fs, const struct dbox_ns_gone *gone);

/* The table entry of ino once it is not busy, waiting for that (the lock
   is released meanwhile, so anything may have changed), or NULL when ino
   is not in the table.  The pointer is valid while the lock is held.
   Needs the lock. */
struct fs_inode *fs_inode_wait_idle(struct fs *fs, uint64_t ino);

/* Mark inode busy and drop the lock (fs_busy_begin), or take the lock
   again and end it, waking waiters; an inode nobody holds any more then
   leaves the table (deleted when it has no names: fs_inode_unref).  The
   busy thread must hold the inode itself (a handle, or fs_inode_add). */
void fs_busy_begin(struct fs *fs, struct fs_inode *inode);
void fs_busy_end(struct fs *fs, struct fs_inode *inode);

/* True when a regular file named name created in directory parent is a
   message: parent is a cur/, new/ or tmp/ and name does not start with
   '.'.  Needs the lock. */
bool fs_is_message_name(struct fs *fs, uint64_t parent, const char *name);

/* Copy the bytes of plain file ino (closed) into a new, sealed message
   record of folder parent, not yet known to the index, for
   fs_file_to_message.  The copy runs without the lock (the inode is busy
   meanwhile; fs_busy_begin): called and returns with the lock held.
   Returns 0 and *save_r (the caller frees it), or a negative errno. */
int fs_file_copy_out(struct fs *fs, uint64_t ino, uint64_t parent,
		     struct dbox_save **save_r);

/* Turn plain file ino (closed) into a message: its bytes are saved as an
   m.N record (the one copied holds, from fs_file_copy_out, or copied now
   when copied is NULL) and the index says it is a message
   (dbox_msg_from_file), inside the caller's transaction or, with own_tx,
   one of its own; the caller removes the backing file after the commit
   and frees copied.  Needs the lock.  Returns 0 or a negative errno, as
   dbox_msg_from_file. */
int fs_file_to_message(struct fs *fs, uint64_t ino, uint64_t parent,
		       struct dbox_save *copied, bool own_tx);

#endif
