/*
 * fs-xattr.c: FUSE extended attribute operations (setxattr, getxattr,
 * listxattr, removexattr), stored by the engine (engine/namespace.h).
 */
#include "fs.h"

#include "engine/perm.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static struct fs *req_fs(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

/* Extended attributes: the user.* namespace is stored in the index, as
   ext4 stores it; others are not (trusted.*, security.*: set gives
   EOPNOTSUPP, get ENODATA).  The kernel asks for security.capability at
   every write(2) to see whether it must drop capabilities: that answer
   (ENODATA) is given at once, without the store lock or an index query.
   ACLs (system.posix_acl_*) the kernel answers itself (EOPNOTSUPP): the
   mount does not ask for FUSE_POSIX_ACL.

   That query is a round trip per write(2) (about a third more time per
   4 KiB write to a plain file), so the attributes are stored only with
   -o user_xattr.  Without it every xattr request is answered ENOSYS,
   which the kernel remembers for the mount: it answers EOPNOTSUPP itself
   from then on and asks nothing at writes. */

/* Without -o user_xattr: ENOSYS (see above); returns true when it
   replied. */
static bool xattr_off(fuse_req_t req)
{
	if (req_fs(req)->opts.user_xattr)
		return false;
	fuse_reply_err(req, ENOSYS);
	return true;
}

static bool is_user_xattr(const char *name)
{
	return strncmp(name, DBOX_XATTR_USER_PREFIX,
		       sizeof(DBOX_XATTR_USER_PREFIX) - 1) == 0;
}

/* Reply to getxattr/listxattr with len bytes of buf (ret: the lookup's
   outcome): its size for a size probe (size 0), ERANGE when the caller's
   buffer is too small, as the kernel's own handlers do. */
static void reply_sized(fuse_req_t req, int ret, const void *buf,
			size_t len, size_t size)
{
	if (ret < 0)
		fuse_reply_err(req, -ret);
	else if (size == 0)
		fuse_reply_xattr(req, len);
	else if (len > size)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, buf, len);
}

/* setxattr, or removexattr when remove. */
static void xattr_write(fuse_req_t req, fuse_ino_t ino, const char *name,
			const char *value, size_t size, int flags, bool remove)
{
	struct fs *fs = req_fs(req);
	struct dbox_cred c;
	int ret;

	if (xattr_off(req))
		return;
	if (!is_user_xattr(name)) {
		/* Not stored: set says so, remove finds nothing. */
		fuse_reply_err(req, remove ? ENODATA : EOPNOTSUPP);
		return;
	}
	fs_perm_begin(req, &c);
	fs_lock(fs);
	ret = fs_perm_xattr_write(fs, &c, ino);
	if (ret == 0)
		ret = remove ? dbox_ns_xattr_remove(fs->st, ino, name) :
			dbox_ns_xattr_set(fs->st, ino, name, value, size,
					  flags);
	fs_unlock(fs);
	dbox_cred_release(&c);
	fuse_reply_err(req, -ret);
}

void fs_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
		 const char *value, size_t size, int flags)
{
	xattr_write(req, ino, name, value, size, flags, false);
}

/* getxattr of name, or listxattr when name is NULL. */
static void xattr_read(fuse_req_t req, fuse_ino_t ino, const char *name,
		       size_t size)
{
	struct fs *fs = req_fs(req);
	void *buf = NULL;
	size_t len = 0;
	struct dbox_cred c;
	int ret;

	if (xattr_off(req))
		return;
	if (name != NULL && !is_user_xattr(name)) {
		fuse_reply_err(req, ENODATA);
		return;
	}
	fs_perm_begin(req, &c);
	fs_lock(fs);
	if (name != NULL) {
		/* getxattr of user.* needs r (listxattr nothing). */
		ret = fs_perm_inode(fs, &c, ino, DBOX_MAY_READ);
		if (ret == 0)
			ret = dbox_ns_xattr_get(fs->st, ino, name, &buf, &len);
	} else {
		char *list = NULL;

		ret = dbox_ns_xattr_list(fs->st, ino, &list, &len);
		buf = list;
	}
	fs_unlock(fs);
	dbox_cred_release(&c);
	reply_sized(req, ret, buf, len, size);
	free(buf);
}

void fs_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
		 size_t size)
{
	xattr_read(req, ino, name, size);
}

void fs_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	xattr_read(req, ino, NULL, size);
}

void fs_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	xattr_write(req, ino, name, NULL, 0, 0, true);
}
