/*
 * fs-perm.c: the permission checks a mount makes itself (fs.h,
 * fs_perm_*).  Only a mount that no one but its owner can reach makes
 * them: there the kernel lets the owner's processes (and no one else's)
 * through, and the daemon applies the rules of engine/perm.h to each
 * request that names an inode.  Every other mount (allow_other,
 * allow_root, or default_permissions asked for) leaves the checks to the
 * kernel, and these functions return 0 at once.
 *
 * Why: with default_permissions the kernel asks for a directory's
 * attributes again after every change inside it, three GETATTR requests
 * per maildir delivery and one per flag rename (docs/design.md,
 * "Permission checks").  What the daemon cannot check: a path walk
 * through names the kernel has cached sends no request, so search (x)
 * permission on a directory is checked at LOOKUP only, and a listing
 * (READDIRPLUS) of a directory the caller may read but not search hands
 * the kernel names without nodes (fs-dir.c), so none is cached there.  The one way the
 * owner loses search permission on a directory is a chmod or chown made
 * through this mount (no one else reaches it), and after one the kernel
 * is told to drop the names it has cached below that directory
 * (fs-walkcut.c), so the next walk asks again.
 *
 * Every function needs the lock (index reads).
 */
#include "fs.h"

#include "engine/perm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

/* dbox_cred_groups_cb_t of a request: libfuse reads them from
   /proc/PID/task/TID/status. */
static int req_groups(struct dbox_cred *c)
{
	fuse_req_t req = c->ctx;
	gid_t *list = NULL;
	int n = 32, got;

	for (;;) {
		gid_t *more = realloc(list, (size_t)n * sizeof(*list));

		if (more == NULL) {
			free(list);
			return -ENOMEM;
		}
		list = more;
		got = fuse_req_getgroups(req, n, list);
		if (got < 0) {
			free(list);
			return got;
		}
		if (got <= n)
			break;
		n = got;
	}
	/* + 1: no malloc(0) for a caller in no supplementary group. */
	c->groups = malloc(((size_t)got + 1) * sizeof(*c->groups));
	if (c->groups == NULL) {
		free(list);
		return -ENOMEM;
	}
	for (int i = 0; i < got; i++)
		c->groups[i] = list[i];
	c->ngroups = got;
	free(list);
	return 0;
}

void fs_perm_begin(fuse_req_t req, struct dbox_cred *c)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);

	*c = (struct dbox_cred){
		.uid = ctx->uid, .gid = ctx->gid, .privileged = ctx->uid == 0,
		.ngroups = -1, .fetch = req_groups, .ctx = req,
	};
}

int fs_perm_inode(struct fs *fs, struct dbox_cred *c, uint64_t ino,
		  int mask)
{
	struct dbox_attr attr;
	int ret;

	if (!fs->own_checks || mask == 0)
		return 0;
	/* A privileged caller may do everything to a directory; a file's
	   execute bits are the kernel's to check. */
	if (c->privileged && !(mask & DBOX_MAY_EXEC))
		return 0;
	if ((ret = dbox_ns_getattr(fs->st, ino, &attr)) < 0)
		return ret;
	return dbox_perm_may(c, &attr, mask);
}

int fs_perm_search(struct fs *fs, struct dbox_cred *c, uint64_t dir)
{
	/* A privileged caller searches every directory. */
	if (!fs->own_checks || c->privileged)
		return 0;
	return fs_perm_inode(fs, c, dir, DBOX_MAY_EXEC);
}

int fs_perm_create(struct fs *fs, struct dbox_cred *c, uint64_t parent)
{
	struct dbox_attr dir;
	int ret;

	if (!fs->own_checks || c->privileged)
		return 0;
	if ((ret = dbox_ns_getattr(fs->st, parent, &dir)) < 0)
		return ret;
	return dbox_perm_may_create(c, &dir);
}

/* May c remove name from directory dir (w and x on it, and the sticky
   rule)?  dir's attributes go to *dir_r.  0, -EACCES, -EPERM, -ENOTDIR,
   or the index's error. */
static int delete_in(struct fs *fs, struct dbox_cred *c, uint64_t dir,
		     const char *name, struct dbox_attr *dir_r)
{
	struct dbox_attr victim;
	int ret;

	if ((ret = dbox_ns_getattr(fs->st, dir, dir_r)) < 0)
		return ret;
	if (!(dir_r->mode & S_ISVTX) || dir_r->uid == c->uid)
		return dbox_perm_may_create(c, dir_r);
	/* Sticky, and not the directory's owner: the victim's owner
	   counts.  No such name: the operation itself says ENOENT. */
	ret = dbox_ns_lookup(fs->st, dir, name, &victim);
	if (ret == -ENOENT)
		return dbox_perm_may_create(c, dir_r);
	if (ret < 0)
		return ret;
	return dbox_perm_may_delete(c, dir_r, &victim);
}

int fs_perm_delete(struct fs *fs, struct dbox_cred *c, uint64_t parent,
		   const char *name)
{
	struct dbox_attr dir;

	if (!fs->own_checks || c->privileged)
		return 0;
	return delete_in(fs, c, parent, name, &dir);
}

/* Do parent/name and newparent/newname name the same inode?  rename(2)
   of one hard link onto another does nothing and checks nothing. */
static bool same_inode(struct fs *fs, uint64_t parent, const char *name,
		       uint64_t newparent, const char *newname)
{
	struct dbox_attr a, b;

	return dbox_ns_lookup(fs->st, parent, name, &a) == 0 &&
		dbox_ns_lookup(fs->st, newparent, newname, &b) == 0 &&
		a.ino == b.ino;
}

static int rename_checks(struct fs *fs, struct dbox_cred *c, uint64_t parent,
			 const char *name, uint64_t newparent,
			 const char *newname, unsigned int flags);

int fs_perm_rename(struct fs *fs, struct dbox_cred *c, uint64_t parent,
		   const char *name, uint64_t newparent, const char *newname,
		   unsigned int flags)
{
	int ret;

	if (!fs->own_checks || c->privileged)
		return 0;
	ret = rename_checks(fs, c, parent, name, newparent, newname, flags);
	if (ret < 0 && same_inode(fs, parent, name, newparent, newname))
		return 0;
	return ret;
}

/* fs_perm_rename's checks, in vfs_rename's order. */
static int rename_checks(struct fs *fs, struct dbox_cred *c, uint64_t parent,
			 const char *name, uint64_t newparent,
			 const char *newname, unsigned int flags)
{
	struct dbox_attr dir, target;
	int ret;

	/* vfs_rename: may_delete of the source, then may_delete (an
	   existing target) or may_create of the target. */
	if ((ret = delete_in(fs, c, parent, name, &dir)) < 0)
		return ret;
	if ((newparent != parent || (dir.mode & S_ISVTX)) &&
	    (ret = delete_in(fs, c, newparent, newname, &dir)) < 0)
		return ret;
	/* Moving a directory to another parent rewrites its "..": w on
	   it (fs_perm_moved, once the engine knows what moved), and on
	   the target too when RENAME_EXCHANGE moves that one back. */
	if (parent != newparent && (flags & RENAME_EXCHANGE) &&
	    dbox_ns_lookup(fs->st, newparent, newname, &target) == 0 &&
	    target.kind == DBOX_KIND_DIR)
		return dbox_perm_may(c, &target, DBOX_MAY_WRITE);
	return 0;
}

int fs_perm_moved(struct fs *fs, struct dbox_cred *c,
		  const struct dbox_attr *moved, bool new_parent)
{
	if (!fs->own_checks || c->privileged || !new_parent ||
	    moved->kind != DBOX_KIND_DIR)
		return 0;
	return dbox_perm_may(c, moved, DBOX_MAY_WRITE);
}

int fs_perm_xattr_write(struct fs *fs, struct dbox_cred *c, uint64_t ino)
{
	struct dbox_attr attr;
	int ret;

	if (!fs->own_checks)
		return 0;
	if ((ret = dbox_ns_getattr(fs->st, ino, &attr)) < 0)
		return ret;
	if (attr.kind != DBOX_KIND_MESSAGE && attr.kind != DBOX_KIND_FILE &&
	    attr.kind != DBOX_KIND_DIR)
		return -EPERM;
	if (attr.kind == DBOX_KIND_DIR && (attr.mode & S_ISVTX) &&
	    attr.uid != c->uid && !c->privileged)
		return -EPERM;
	return dbox_perm_may(c, &attr, DBOX_MAY_WRITE);
}

int fs_perm_link(struct fs *fs, struct dbox_cred *c, uint64_t ino,
		 uint64_t newparent)
{
	struct dbox_attr attr;
	int ret;

	if (!fs->own_checks || c->privileged)
		return 0;
	/* may_linkat before vfs_link's may_create. */
	if ((ret = dbox_ns_getattr(fs->st, ino, &attr)) < 0 ||
	    (ret = dbox_perm_may_link(c, &attr, fs->protected_hardlinks)) < 0)
		return ret;
	return fs_perm_create(fs, c, newparent);
}

int fs_perm_open(struct fs *fs, struct dbox_cred *c, uint64_t ino, int flags)
{
	int mask = 0;

	switch (flags & O_ACCMODE) {
	case O_RDONLY:
		mask = DBOX_MAY_READ;
		break;
	case O_WRONLY:
		mask = DBOX_MAY_WRITE;
		break;
	default:
		mask = DBOX_MAY_READ | DBOX_MAY_WRITE;
		break;
	}
	if (flags & O_TRUNC)
		mask |= DBOX_MAY_WRITE;
	/* An open for execve() (__FMODE_EXEC) needs x instead of r; the
	   kernel has checked that some x bit is set. */
	if (flags & FS_FMODE_EXEC)
		mask = (mask & ~DBOX_MAY_READ) | DBOX_MAY_EXEC;
	return fs_perm_inode(fs, c, ino, mask);
}

/* Is mode what old is with setuid or setgid (or both) dropped? */
static bool kills_privs_only(uint32_t old, uint32_t mode)
{
	const uint32_t privs = S_ISUID | S_ISGID;

	old &= 07777;
	mode &= 07777;
	return mode != old && (mode & ~privs) == (old & ~privs) &&
		(mode & ~old) == 0;
}

int fs_perm_setattr(struct fs *fs, struct dbox_cred *c,
		    const struct dbox_attr *attr, const struct stat *in,
		    int to_set, bool by_handle, uint32_t *mode)
{
	const int times = FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME;
	const int now = FUSE_SET_ATTR_ATIME_NOW | FUSE_SET_ATTR_MTIME_NOW;
	uint32_t uid = UINT32_MAX, gid = UINT32_MAX;
	int ret;

	if (!fs->own_checks)
		return 0;
	/* truncate(path): vfs_truncate wants w first (ftruncate's file
	   was opened for writing). */
	if ((to_set & FUSE_SET_ATTR_SIZE) && !by_handle &&
	    (ret = dbox_perm_may(c, attr, DBOX_MAY_WRITE)) < 0)
		return ret;
	/* utime(NULL) and touch: both times now (may_setattr). */
	if ((to_set & times) == times && (to_set & now) == now &&
	    (ret = dbox_perm_times(c, attr, true)) < 0)
		return ret;
	if (to_set & FUSE_SET_ATTR_UID)
		uid = in->st_uid;
	if (to_set & FUSE_SET_ATTR_GID)
		gid = in->st_gid;
	if ((ret = dbox_perm_chown(c, attr, uid, gid)) < 0)
		return ret;
	if (to_set & FUSE_SET_ATTR_MODE) {
		ret = dbox_perm_chmod(c, attr, gid != UINT32_MAX ? gid :
				      attr->gid, mode);
		/* The kernel drops setuid and setgid itself when a writer
		   who does not own the file writes to it (file_remove_privs,
		   sent as a chmod without the file handle): allowed.  The
		   write was allowed at the open, whatever the mode says now
		   (root's process that opened it may have switched its
		   fsuid since: a refusal failed the write, helper-78), and
		   only the owner and root reach a mount that checks here. */
		if (ret == -EPERM && kills_privs_only(attr->mode, *mode))
			ret = 0;
		if (ret < 0)
			return ret;
	}
	if ((to_set & times) && !((to_set & times) == times &&
				   (to_set & now) == now))
		return dbox_perm_times(c, attr, false);
	return 0;
}

int fs_perm_access(struct fs *fs, struct dbox_cred *c, uint64_t ino, int mask)
{
	struct dbox_attr attr;
	int ret;

	if ((ret = dbox_ns_getattr(fs->st, ino, &attr)) < 0)
		return ret;
	if (!fs->own_checks)
		return 0;
	return dbox_perm_may(c, &attr, mask);
}
