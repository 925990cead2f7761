#ifndef DBOXFS_ENGINE_PERM_H
#define DBOXFS_ENGINE_PERM_H

/*
 * perm: the POSIX permission rules of a local Linux filesystem, for a
 * mount that checks them itself instead of leaving them to the kernel
 * (fs/fs-perm.c: a mount only its owner can reach).  Pure functions of
 * a caller's credentials and an inode's attributes; no lock, no index.
 *
 * The rules are Linux's (fs/namei.c generic_permission, may_delete,
 * may_linkat; fs/attr.c setattr_prepare, may_setattr; Linux 6.18; the
 * rules in words: docs/design.md, "Permission checks"), for a
 * filesystem without ACLs:
 *  - the class is the owner's when the caller's fsuid is the file's uid,
 *    else the group's when the file's gid is the caller's fsgid or one of
 *    its supplementary groups, else other's; only that class's bits count
 *    (an owner without r is refused even when others have r);
 *  - a privileged caller (uid 0: CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_CHOWN
 *    and CAP_FSETID assumed) reads and writes anything and searches any
 *    directory, and executes a file only when some x bit is set.
 */

#include "index/index.h"

#include <stdbool.h>
#include <stdint.h>

/* Access masks, the values of access(2)'s R_OK, W_OK, X_OK. */
#define DBOX_MAY_READ  4
#define DBOX_MAY_WRITE 2
#define DBOX_MAY_EXEC  1

struct dbox_cred;

/* Fetch the caller's supplementary groups into c->groups/c->ngroups
   (malloc'ed, freed by dbox_cred_release); returns 0 or a negative
   errno, and then the caller counts as in no supplementary group. */
typedef int dbox_cred_groups_cb_t(struct dbox_cred *c);

/* Who asks.  groups are fetched on first need only: most checks are
   decided by the owner class. */
struct dbox_cred {
	uint32_t uid, gid;        /* fsuid and fsgid */
	bool privileged;          /* uid 0 */
	int ngroups;              /* -1: not fetched yet */
	uint32_t *groups;
	dbox_cred_groups_cb_t *fetch;
	void *ctx;                /* fetch's (the mount: a fuse_req_t) */
};

/* Free what c fetched. */
void dbox_cred_release(struct dbox_cred *c);

/* Is gid c's fsgid or one of its supplementary groups? */
bool dbox_perm_in_group(struct dbox_cred *c, uint32_t gid);

/* May c access inode a for mask (DBOX_MAY_*, or'ed; 0 always may)?
   Returns 0 or -EACCES. */
int dbox_perm_may(struct dbox_cred *c, const struct dbox_attr *a, int mask);

/* May c create a name in directory dir (w and x on it)?  Returns 0,
   -ENOTDIR or -EACCES. */
int dbox_perm_may_create(struct dbox_cred *c, const struct dbox_attr *dir);

/* May c remove (or rename away, or replace) victim's name in dir: w and
   x on dir, and in a sticky dir the caller owns victim or dir?  Returns
   0, -EACCES or -EPERM (sticky). */
int dbox_perm_may_delete(struct dbox_cred *c, const struct dbox_attr *dir,
			 const struct dbox_attr *victim);

/* May c give a a new name (link(2))?  With protected hardlinks (the
   sysctl fs.protected_hardlinks, protected true) a caller who does not
   own a needs a regular file without setuid (or setgid with group x)
   that it may read and write.  Returns 0 or -EPERM. */
int dbox_perm_may_link(struct dbox_cred *c, const struct dbox_attr *a,
		       bool protected);

/* chmod of a to *mode (permission bits): the owner or privileged only,
   and S_ISGID is dropped from *mode when c is neither privileged nor in
   a's group (gid: the group a has after the same setattr).  Returns 0
   or -EPERM. */
int dbox_perm_chmod(struct dbox_cred *c, const struct dbox_attr *a,
		    uint32_t gid, uint32_t *mode);

/* chown of a to uid and gid (UINT32_MAX: unchanged): a new owner only
   when privileged (the owner may "change" it to itself); a new group by
   the owner to a group of its own, or privileged.  Returns 0 or
   -EPERM. */
int dbox_perm_chown(struct dbox_cred *c, const struct dbox_attr *a,
		    uint32_t uid, uint32_t gid);

/* Setting a's times: explicit times (or one time only) need the owner
   or privilege (-EPERM); both set to now (touch, utime(NULL)) need the
   owner, privilege or write access (-EACCES).  Returns 0 or the errno
   named. */
int dbox_perm_times(struct dbox_cred *c, const struct dbox_attr *a,
		    bool touch);

#endif
