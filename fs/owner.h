#ifndef DBOXFS_FS_OWNER_H
#define DBOXFS_FS_OWNER_H

/*
 * owner: root mounting a store another user owns works on it as that
 * user, as dboxadm does (it drops to the owner).  The files the daemon
 * makes there are the owner's (root's m.N were unreadable to the owner's
 * dboxadm), and the store's bytes and names, the owner's to plant, reach
 * nothing the owner could not.  Only the filesystem identity changes
 * (setfsuid, setfsgid: per thread, so before any thread starts; threads
 * inherit it); the daemon is root again for the mount(2) itself.  The
 * owner's group is the gid of its passwd entry, else the store's group.
 *
 * Order in main(): fs_owner_enter, fs_owner_mount_options (before the
 * session takes the options), fs_owner_check_mountpoint before the store
 * is opened and again right before the mount, which runs between
 * fs_owner_switch(o, false) and fs_owner_switch(o, true).  A user's own
 * mount (not root) leaves o inactive and every call here does nothing.
 */

#include "fs/fs.h"

#include <stdbool.h>
#include <sys/types.h>

struct fs_owner {
	bool active; /* root works on a store of uid as that user */
	uid_t uid;
	gid_t gid;
};

/* Decide whose store STORE is, as dboxadm decides it
   (dbox_store_owner_find): the owner of STORE, or of its parent for a
   store the mount will create; root's reached through a user's directory
   or link is that user's.  For another user's store, takes that user's
   supplementary groups for good, switches the filesystem identity to
   the user (o->active) and checks that the path still names the
   directory that decided.  Does nothing (o inactive) unless the process
   is root.  Returns 0, or -EPERM (a third user's directory or link on
   the way, a directory others may write to, an owner without a passwd
   entry), -ESTALE (the path changed meanwhile) or another -errno; every
   refusal is logged. */
int fs_owner_enter(const char *store, struct fs_owner *o);

/* Set the filesystem identity of the calling thread to the store's
   owner (to_owner) or to root.  Returns 0, or -EPERM (logged) when the
   switch did not hold. */
int fs_owner_switch(const struct fs_owner *o, bool to_owner);

/* Add nosuid,nodev to args for a mount of another user's store: every
   mode, owner and device number it serves is the owner's to write.  A
   mount made before dboxfs started (mountpoint /dev/fd/N) is refused
   unless opts already say both.  Returns 0, -EPERM (logged) or
   -ENOMEM. */
int fs_owner_mount_options(const struct fs_owner *o,
			   const struct fs_options *opts,
			   struct fuse_args *args, const char *mountpoint);

/* Check the mount point mnt (as the user gave it) of another user's
   store, looking as root: a directory of that user's or of root's,
   reached through no symbolic link of a user's and no directory of a
   third user's.  Returns 0, or -EPERM / -ENOENT / -ESTALE / -errno
   (logged); the identity is the owner's again on return (-EPERM when
   that switch fails). */
int fs_owner_check_mountpoint(const struct fs_owner *o, const char *mnt);

#endif
