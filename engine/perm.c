/*
 * perm.c: POSIX permission rules (perm.h).  Each function follows the
 * Linux function named in its comment, in the same order of checks, so
 * that the first rule that refuses gives the same errno as on ext4.
 */
#include "engine/perm.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>

void dbox_cred_release(struct dbox_cred *c)
{
	free(c->groups);
	c->groups = NULL;
	c->ngroups = -1;
}

bool dbox_perm_in_group(struct dbox_cred *c, uint32_t gid)
{
	if (gid == c->gid)
		return true;
	if (c->ngroups < 0 && (c->fetch == NULL || c->fetch(c) < 0)) {
		free(c->groups);
		c->groups = NULL;
		c->ngroups = 0;
	}
	for (int i = 0; i < c->ngroups; i++)
		if (c->groups[i] == gid)
			return true;
	return false;
}

static bool owner_or_privileged(const struct dbox_cred *c,
				const struct dbox_attr *a)
{
	return c->uid == a->uid || c->privileged;
}

/* generic_permission without ACLs: the class's bits, then the
   capabilities' overrides.  Groups are asked for only when the group's
   and other's bits differ for mask (as acl_permission_check does). */
int dbox_perm_may(struct dbox_cred *c, const struct dbox_attr *a, int mask)
{
	uint32_t mode = a->mode;

	mask &= DBOX_MAY_READ | DBOX_MAY_WRITE | DBOX_MAY_EXEC;
	if (c->uid == a->uid) {
		mode >>= 6;
	} else if ((mask & (mode ^ (mode >> 3))) != 0 &&
		   dbox_perm_in_group(c, a->gid)) {
		mode >>= 3;
	}
	if ((mask & ~mode & 7) == 0)
		return 0;
	if (!c->privileged)
		return -EACCES;
	/* CAP_DAC_OVERRIDE: everything on a directory; read and write on
	   anything else, and execute when some x bit is set. */
	if (a->kind == DBOX_KIND_DIR || !(mask & DBOX_MAY_EXEC) ||
	    (a->mode & (S_IXUSR | S_IXGRP | S_IXOTH)) != 0)
		return 0;
	return -EACCES;
}

/* may_create. */
int dbox_perm_may_create(struct dbox_cred *c, const struct dbox_attr *dir)
{
	if (dir->kind != DBOX_KIND_DIR)
		return -ENOTDIR;
	return dbox_perm_may(c, dir, DBOX_MAY_WRITE | DBOX_MAY_EXEC);
}

/* may_delete: w and x on the directory first (EACCES), then the sticky
   rule (check_sticky: EPERM). */
int dbox_perm_may_delete(struct dbox_cred *c, const struct dbox_attr *dir,
			 const struct dbox_attr *victim)
{
	int ret = dbox_perm_may_create(c, dir);

	if (ret < 0)
		return ret;
	if ((dir->mode & S_ISVTX) && c->uid != victim->uid &&
	    c->uid != dir->uid && !c->privileged)
		return -EPERM;
	return 0;
}

/* may_linkat and safe_hardlink_source. */
int dbox_perm_may_link(struct dbox_cred *c, const struct dbox_attr *a,
		       bool protected)
{
	bool safe;

	if (!protected || owner_or_privileged(c, a))
		return 0;
	safe = a->kind != DBOX_KIND_DIR && a->kind != DBOX_KIND_SYMLINK &&
		a->kind != DBOX_KIND_SPECIAL && !(a->mode & S_ISUID) &&
		(a->mode & (S_ISGID | S_IXGRP)) != (S_ISGID | S_IXGRP);
	if (safe && dbox_perm_may(c, a, DBOX_MAY_READ | DBOX_MAY_WRITE) == 0)
		return 0;
	return -EPERM;
}

/* setattr_prepare, ATTR_MODE. */
int dbox_perm_chmod(struct dbox_cred *c, const struct dbox_attr *a,
		    uint32_t gid, uint32_t *mode)
{
	if (!owner_or_privileged(c, a))
		return -EPERM;
	if (!c->privileged && !dbox_perm_in_group(c, gid))
		*mode &= ~(uint32_t)S_ISGID;
	return 0;
}

/* setattr_prepare, ATTR_UID (chown_ok) and ATTR_GID (chgrp_ok). */
int dbox_perm_chown(struct dbox_cred *c, const struct dbox_attr *a,
		    uint32_t uid, uint32_t gid)
{
	if (c->privileged)
		return 0;
	if (uid != UINT32_MAX && !(c->uid == a->uid && uid == a->uid))
		return -EPERM;
	if (gid != UINT32_MAX &&
	    !(c->uid == a->uid && (gid == a->gid || dbox_perm_in_group(c, gid))))
		return -EPERM;
	return 0;
}

/* may_setattr (ATTR_TOUCH) and setattr_prepare (ATTR_TIMES_SET). */
int dbox_perm_times(struct dbox_cred *c, const struct dbox_attr *a,
		    bool touch)
{
	if (owner_or_privileged(c, a))
		return 0;
	if (!touch)
		return -EPERM;
	return dbox_perm_may(c, a, DBOX_MAY_WRITE);
}
