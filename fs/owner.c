/*
 * owner.c: root mounting another user's store works as that user
 * (owner.h).
 */
#include "fs/owner.h"

#include "engine/store-dirs.h"
#include "storage/log.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <unistd.h>

/* Filesystem identity of the calling thread: the store's owner (to_owner)
   or root.  Returns 0, or -EPERM (logged) when the switch did not hold. */
int fs_owner_switch(const struct fs_owner *o, bool to_owner)
{
	uid_t uid = to_owner ? o->uid : 0;
	gid_t gid = to_owner ? o->gid : 0;

	if (!o->active)
		return 0;
	setfsgid(gid);
	setfsuid(uid);
	/* Both return the previous value: asking again tells the current. */
	if ((uid_t)setfsuid((uid_t)-1) != uid || (gid_t)setfsgid((gid_t)-1) != gid) {
		dbox_error("cannot act as uid %u gid %u on the store",
			   (unsigned)uid, (unsigned)gid);
		return -EPERM;
	}
	return 0;
}

/* Take the supplementary groups of o's passwd entry (none without one).
   Returns 0 or -errno (logged). */
static int owner_groups(const struct fs_owner *o)
{
	struct passwd *pw = getpwuid(o->uid);

	if ((pw != NULL ? initgroups(pw->pw_name, o->gid) :
	     setgroups(0, NULL)) < 0) {
		int ret = -errno;

		dbox_error("cannot take the groups of uid %u: %s",
			   (unsigned)o->uid, strerror(-ret));
		return ret;
	}
	return 0;
}

/* Root mounting another user's store: every mode, owner and device
   number the mount serves comes from that user's index, so the mount is
   nosuid,nodev whatever the options say - a set-user-ID-root file or a
   device node of the owner's making was real on it, through mount.fuse3
   or fstab, which add dev,suid for root (helper-61).  A mount made before
   dboxfs started (/dev/fd/N: mount.fuse3 -o drop_privileges) cannot be
   changed here, and is refused unless its options say nosuid,nodev.
   Returns 0, -EPERM (said) or -ENOMEM. */
int fs_owner_mount_options(const struct fs_owner *o,
			   const struct fs_options *opts,
			   struct fuse_args *args, const char *mountpoint)
{
	if (!o->active)
		return 0;
	if (strncmp(mountpoint, "/dev/fd/", 8) == 0) {
		if (opts->suid == 0 && opts->dev == 0)
			return 0;
		dbox_error("%s: a store of uid %u is mounted nosuid,nodev, and "
			   "this mount was made before dboxfs started (%s, "
			   "mount.fuse3 -o drop_privileges) without both; "
			   "refusing it", opts->store, (unsigned)o->uid,
			   mountpoint);
		return -EPERM;
	}
	if (opts->suid == 1 || opts->dev == 1)
		dbox_info("%s: a store of uid %u is mounted nosuid,nodev (its "
			  "owner writes every mode and device number in it); "
			  "-o suid and -o dev are ignored", opts->store,
			  (unsigned)o->uid);
	return fuse_opt_add_arg(args, "-onosuid,nodev") < 0 ? -ENOMEM : 0;
}

#define MNT_RULE "root mounts the store of uid %u only on a directory of " \
	"that user's or of root's, reached through no link of a user's"

/* Root mounting o's user's store mounts as root (mount(2)): the mount
   point must be a directory of that user's or of root's, reached
   through no symbolic link of a user's and no directory of a third
   user's - the user's link to /etc made /etc show the user's store to
   root's processes.  (A directory of root's in one of the user's can
   still be swapped between this check and the mount: docs/durability.md.)
   mnt as given.  Returns 0 or -EPERM / -errno (said). */
int fs_owner_check_mountpoint(const struct fs_owner *o, const char *mnt)
{
	struct dbox_store_owner m;
	struct stat sb;
	uid_t link;
	int ret;

	if (!o->active || mnt == NULL)
		return 0;
	/* Looked at as root, who mounts there (a root-only directory of
	   root's is fine). */
	if ((ret = fs_owner_switch(o, false)) < 0)
		return ret;
	ret = dbox_store_owner_find(mnt, &m);
	if (ret == 0 && m.new_store)
		ret = -ENOENT;
	if (ret == 0 && fstat(m.fd, &sb) < 0)
		ret = -errno;
	if (ret == 0 && (link = dbox_path_link_owner(mnt)) != 0) {
		dbox_error("%s: reached through a symbolic link of uid %u; "
			   MNT_RULE, mnt, (unsigned)link, (unsigned)o->uid);
		ret = -EPERM;
	} else if (ret == 0 && sb.st_uid != o->uid && sb.st_uid != 0) {
		dbox_error("%s: a directory of uid %u; " MNT_RULE, mnt,
			   (unsigned)sb.st_uid, (unsigned)o->uid);
		ret = -EPERM;
	} else if (ret == -EPERM && m.shared_dir) {
		dbox_error("%s: in a directory other users may write to; "
			   MNT_RULE, mnt, (unsigned)o->uid);
	} else if (ret == -EPERM) {
		dbox_error("%s: reached through a symbolic link or directory "
			   "of uid %u; " MNT_RULE, mnt, (unsigned)m.way,
			   (unsigned)o->uid);
	} else if (ret < 0) {
		dbox_error("%s: %s; refusing it as a mount point", mnt,
			   ret == -ESTALE ? "changed while dboxfs looked at it" :
			   strerror(-ret));
	}
	dbox_store_owner_free(&m);
	if (fs_owner_switch(o, true) < 0 && ret == 0)
		ret = -EPERM;
	return ret;
}

/* Whose store this is, decided as dboxadm decides it
   (dbox_store_owner_find): the owner of STORE, or of its parent for a
   store this mount will create; root's reached through a user's
   directory or link is that user's; another user's reached through a
   third user's is refused (-EPERM, said).  Switches to the owner (o->active)
   and checks that the path still names the directory that decided. */
int fs_owner_enter(const char *store, struct fs_owner *o)
{
	struct dbox_store_owner found;
	int ret;

	o->active = false;
	if (geteuid() != 0)
		return 0;
	/* Root mounts nothing it could not tell the owner of: a path that
	   is missing, not a directory or switched while it was looked at
	   would be opened again by name, as root. */
	ret = dbox_store_owner_find(store, &found);
	if (ret == -EPERM && found.shared_dir)
		dbox_error("%s: in a directory other users may write to, one "
			   "of them could put a link to another store at its "
			   "name before root opens it; refusing it (use a "
			   "directory only root writes to)", store);
	else if (ret == -EPERM)
		dbox_error("%s: owned by uid %u but reached through a symbolic "
			   "link or directory of uid %u; refusing it (name the "
			   "store by its own path)", found.what,
			   (unsigned)found.uid, (unsigned)found.way);
	else if (ret < 0 && ret != -ENOMEM)
		dbox_error("%s: %s; refusing it", found.what != NULL ?
			   found.what : store, ret == -ESTALE ?
			   "changed while dboxfs looked at it" : strerror(-ret));
	else if (ret == 0 && found.uid != 0 && found.gid == (gid_t)-1) {
		dbox_error("%s: reached through a directory or link of uid %u, "
			   "who has no passwd entry; refusing it", found.what,
			   (unsigned)found.uid);
		ret = -EPERM;
	}
	if (ret == 0 && found.uid != 0) {
		o->uid = found.uid;
		o->gid = found.gid;
		o->active = true;
		/* The owner's groups for good, as dboxadm takes them: root's
		   supplementary groups (a login shell's 0) would reach what the
		   owner cannot; the daemon needs none of them as root. */
		ret = owner_groups(o);
		if (ret == 0)
			ret = fs_owner_switch(o, true);
		if (ret == 0 && (ret = dbox_store_owner_still(&found)) < 0)
			dbox_error("%s: %s while dboxfs switched to its owner "
				   "(uid %u); refusing it", found.what,
				   ret == -ESTALE ? "changed" : strerror(-ret),
				   (unsigned)found.uid);
	}
	dbox_store_owner_free(&found);
	return ret;
}
