/*
 * namespace.c: whole namespace operations on a store (see namespace.h):
 * each change is one index transaction that begins and ends here, and the
 * attributes the caller replies with come back from it.
 *
 * Never includes FUSE headers; never takes st->lock (the caller holds it).
 */
#include "engine/namespace.h"
#include "engine/store-dirs.h"

#include "engine/maildir.h"
#include "index/wal-sync.h"
#include "storage/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

void dbox_ns_file_unlink(struct dbox_store *st, uint64_t ino)
{
	char name[24];

	dbox_files_name(name, ino);
	if (unlinkat(st->files_fd, name, 0) < 0 && errno != ENOENT)
		dbox_warning("%s/" DBOX_STORE_FILES "/%s: unlink: %s", st->path,
			     name, strerror(errno));
}

/* The DBOX_META_FILE_GONE_PREFIX key of plain file ino into key. */
static void file_gone_key(uint64_t ino, char key[40])
{
	snprintf(key, 40, DBOX_META_FILE_GONE_PREFIX "%llu.",
		 (unsigned long long)ino);
}

bool dbox_ns_file_gone(struct dbox_index *index, uint64_t ino)
{
	char key[40];
	int64_t v;

	file_gone_key(ino, key);
	return dbox_index_meta_get(index, key, &v) == 0 ||
		(dbox_index_meta_get(index, DBOX_META_FILE_GONE, &v) == 0 &&
		 v > 0 && (uint64_t)v == ino);
}

/* In a transaction deleting plain file ino: its key, and the keys of the
   files removed since the last one dropped (a rollback leaves them to
   the next open). */
static int file_gone_mark(struct dbox_store *st, uint64_t ino)
{
	char key[40];
	int ret = 0;

	for (size_t i = 0; i < st->unlinked_count && ret == 0; i++) {
		file_gone_key(st->unlinked[i], key);
		ret = dbox_index_meta_delete_prefix(st->index, key);
	}
	free(st->unlinked);
	st->unlinked = NULL;
	st->unlinked_count = st->unlinked_size = 0;
	file_gone_key(ino, key);
	return ret < 0 ? ret : dbox_index_meta_set(st->index, key, 1);
}

int dbox_ns_tx_end(struct dbox_store *st, int ret, bool durable)
{
	dbox_store_assert_locked(st);
	if (ret < 0) {
		dbox_index_rollback(st->index);
		return ret;
	}
	return dbox_index_commit(st->index, durable);
}

/* Begin the transaction of a namespace change; gone (may be NULL) starts
   empty. */
static int ns_begin(struct dbox_store *st, struct dbox_ns_gone *gone)
{
	if (gone != NULL)
		memset(gone, 0, sizeof(*gone));
	return dbox_index_begin(st->index);
}

/* End the transaction of an operation whose outcome is ret (0: commit,
   else roll back); a plain file deleted in it loses its backing file
   once the commit is durable (dbox_store_doom_file).  Returns ret or
   the commit's error. */
static int ns_end(struct dbox_store *st, int ret, struct dbox_ns_gone *gone,
		  uint64_t file_ino)
{
	if (ret != 0) {
		dbox_index_rollback(st->index);
		if (gone != NULL)
			memset(gone, 0, sizeof(*gone));
		return ret;
	}
	ret = dbox_index_commit(st->index, false);
	if (ret == 0 && file_ino != 0)
		dbox_store_doom_file(st, file_ino);
	return ret;
}

/* Delete ino (no names left) inside the transaction: its rows; a message's
   record becomes garbage (gone->garbage_file_id), a plain file's backing
   file is for the caller to remove after the commit (*file_ino_r). */
static int drop_inode(struct dbox_store *st, uint64_t ino,
		      struct dbox_ns_gone *gone, uint64_t *file_ino_r)
{
	struct dbox_msgloc loc;
	struct dbox_attr attr;
	int ret;

	if ((ret = dbox_index_getattr(st->index, ino, &attr)) < 0)
		return ret == -ENOENT ? 0 : ret;
	if (attr.nlink > 0)
		return 0; /* linked again meanwhile */
	if (attr.kind == DBOX_KIND_MESSAGE &&
	    dbox_index_msg_get(st->index, ino, &loc) == 0)
		gone->garbage_file_id = loc.file_id;
	if ((ret = dbox_index_delete_inode(st->index, ino)) < 0)
		return ret;
	gone->deleted = true;
	if (attr.kind == DBOX_KIND_FILE) {
		*file_ino_r = ino;
		/* Its backing file goes after the commit: say so in it. */
		return file_gone_mark(st, ino);
	}
	return 0;
}

/* A name of ino went away leaving nlink: delete ino now unless it still
   has names or the caller holds it. */
static int name_gone(struct dbox_store *st, uint64_t ino, uint32_t nlink,
		     const struct dbox_ns_hooks *hooks,
		     struct dbox_ns_gone *gone, uint64_t *file_ino_r)
{
	gone->ino = ino;
	gone->nlink = nlink;
	if (ino == 0 || nlink > 0)
		return 0;
	if (hooks != NULL && hooks->held != NULL && hooks->held(hooks->ctx, ino))
		return 0;
	return drop_inode(st, ino, gone, file_ino_r);
}

int dbox_ns_lookup(struct dbox_store *st, uint64_t parent, const char *name,
		   struct dbox_attr *attr_r)
{
	dbox_store_assert_locked(st);
	return dbox_index_lookup(st->index, parent, name, strlen(name), attr_r);
}

int dbox_ns_getattr(struct dbox_store *st, uint64_t ino,
		    struct dbox_attr *attr_r)
{
	dbox_store_assert_locked(st);
	return dbox_index_getattr(st->index, ino, attr_r);
}

int dbox_ns_dir_self(struct dbox_store *st, uint64_t dir,
		     struct dbox_attr *self_r, struct dbox_attr *parent_r)
{
	uint64_t parent;
	int ret;

	dbox_store_assert_locked(st);
	if ((ret = dbox_index_getattr(st->index, dir, self_r)) < 0 ||
	    (ret = dbox_index_parent(st->index, dir, &parent)) < 0)
		return ret;
	return dbox_index_getattr(st->index, parent, parent_r);
}

int dbox_ns_readdir(struct dbox_store *st, uint64_t dir, uint64_t after,
		    dbox_readdir_cb_t *cb, void *ctx)
{
	dbox_store_assert_locked(st);
	return dbox_index_readdir(st->index, dir, after, cb, ctx);
}

int dbox_ns_readlink(struct dbox_store *st, uint64_t ino, char **target_r)
{
	dbox_store_assert_locked(st);
	return dbox_index_readlink(st->index, ino, target_r);
}

int dbox_ns_xattr_get(struct dbox_store *st, uint64_t ino, const char *name,
		      void **value_r, size_t *len_r)
{
	dbox_store_assert_locked(st);
	return dbox_index_xattr_get(st->index, ino, name, value_r, len_r);
}

int dbox_ns_xattr_list(struct dbox_store *st, uint64_t ino, char **list_r,
		       size_t *len_r)
{
	dbox_store_assert_locked(st);
	return dbox_index_xattr_list(st->index, ino, list_r, len_r);
}

/* Which of its folder's cur/, new/, tmp/ directory dir is (enum
   maildir_subdir), with the folder into *folder_r; -1 when dir is none
   of them (the root, a folder, an error).  One read of the index. */
static int subdir_of(struct dbox_store *st, uint64_t dir, uint64_t *folder_r)
{
	char *name;
	int which;

	if (dbox_index_entry_of(st->index, dir, folder_r, &name) < 0)
		return -1;
	which = maildir_subdir_of(name, strlen(name));
	free(name);
	return which;
}

bool dbox_ns_message_dir(struct dbox_store *st, uint64_t parent,
			 const char *name, uint64_t *folder_r)
{
	uint64_t folder;

	dbox_store_assert_locked(st);
	if (name[0] == '.' || subdir_of(st, parent, &folder) < 0)
		return false;
	if (folder_r != NULL)
		*folder_r = folder;
	return true;
}

bool dbox_ns_is_message_name(struct dbox_store *st, uint64_t parent,
			     const char *name)
{
	return dbox_ns_message_dir(st, parent, name, NULL);
}

int dbox_ns_sync_point(struct dbox_store *st, uint64_t *point_r)
{
	int ret;

	dbox_store_assert_locked(st);
	/* Deferred operations were made before too: committed first. */
	ret = dbox_store_commit_deferred(st);
	*point_r = dbox_index_commit_seq(st->index);
	return ret;
}

int dbox_ns_sync_upto(struct dbox_store *st, uint64_t point)
{
	/* At once when a sync covered point already (group commit);
	   else the rows this sync carries name bytes that must be there
	   first: of messages closed without fsync by any writer
	   (store-sync.c). */
	if (dbox_index_synced_upto(st->index, point))
		return 0;
	return dbox_store_sync_wal(st, point);
}

int dbox_ns_new_owner(struct dbox_store *st, uint64_t parent,
		      uint32_t *mode, uint32_t *gid)
{
	struct dbox_attr dir;
	int ret;

	dbox_store_assert_locked(st);
	if ((ret = dbox_index_getattr(st->index, parent, &dir)) < 0)
		return ret;
	if (dir.kind != DBOX_KIND_DIR)
		return -ENOTDIR;
	if (dir.mode & S_ISGID) {
		*gid = dir.gid;
		if (S_ISDIR(*mode))
			*mode |= S_ISGID;
	}
	return 0;
}

/* dbox_ns_create inside the caller's transaction. */
static int create_in_tx(struct dbox_store *st, uint64_t parent,
			const char *name, const struct dbox_ns_new *nw,
			struct dbox_attr *attr_r)
{
	uint32_t mode = nw->mode, gid = nw->gid;
	int ret;

	if ((ret = dbox_ns_new_owner(st, parent, &mode, &gid)) < 0 ||
	    (ret = dbox_index_create(st->index, parent, name, strlen(name),
				     nw->kind, mode, nw->uid, gid,
				     dbox_now_ns(), attr_r)) < 0)
		return ret;
	if (nw->kind == DBOX_KIND_SYMLINK) {
		size_t len = strlen(nw->target);

		if ((ret = dbox_index_symlink_set(st->index, attr_r->ino,
						  nw->target, len)) < 0)
			return ret;
		attr_r->size = len;
	} else if (nw->kind == DBOX_KIND_SPECIAL && nw->rdev != 0) {
		attr_r->rdev = nw->rdev;
		return dbox_index_setattr(st->index, attr_r);
	}
	return 0;
}

int dbox_ns_create(struct dbox_store *st, uint64_t parent, const char *name,
		   const struct dbox_ns_new *nw, struct dbox_attr *attr_r)
{
	int ret;

	dbox_store_assert_locked(st);
	if (nw->kind != DBOX_KIND_DIR && nw->kind != DBOX_KIND_SYMLINK &&
	    nw->kind != DBOX_KIND_SPECIAL)
		return -EINVAL;
	if (nw->kind == DBOX_KIND_SYMLINK && nw->target == NULL)
		return -EINVAL;
	if ((ret = ns_begin(st, NULL)) < 0)
		return ret;
	return ns_end(st, create_in_tx(st, parent, name, nw, attr_r), NULL, 0);
}

int dbox_ns_make_inbox(struct dbox_store *st, uint32_t uid, uint32_t gid)
{
	struct dbox_attr attr;
	int ret;

	dbox_store_assert_locked(st);
	if ((ret = ns_begin(st, NULL)) < 0)
		return ret;
	for (size_t i = 0; i < 3 && ret == 0; i++)
		ret = dbox_index_create(st->index, DBOX_ROOT_INO,
					maildir_subdirs[i],
					strlen(maildir_subdirs[i]),
					DBOX_KIND_DIR, S_IFDIR | 0700, uid, gid,
					dbox_now_ns(), &attr);
	if (ret < 0) {
		dbox_index_rollback(st->index);
		return ret;
	}
	return dbox_index_commit(st->index, true);
}

int dbox_ns_link(struct dbox_store *st, uint64_t ino, uint64_t newparent,
		 const char *name, struct dbox_attr *attr_r)
{
	int ret;

	dbox_store_assert_locked(st);
	if ((ret = ns_begin(st, NULL)) < 0)
		return ret;
	ret = dbox_index_link(st->index, ino, newparent, name, strlen(name),
			      dbox_now_ns(), attr_r);
	return ns_end(st, ret, NULL, 0);
}

int dbox_ns_remove(struct dbox_store *st, uint64_t parent, const char *name,
		   bool dir, const struct dbox_ns_hooks *hooks,
		   struct dbox_ns_gone *gone_r)
{
	uint64_t ino = 0, file_ino = 0;
	uint32_t nlink = 0;
	int ret = ns_begin(st, gone_r);

	dbox_store_assert_locked(st);
	if (ret < 0)
		return ret;
	ret = dbox_index_remove(st->index, parent, name, strlen(name), dir,
				dbox_now_ns(), &ino, &nlink);
	/* A directory's inode went with its name (rmdir). */
	if (ret == 0 && !dir)
		ret = name_gone(st, ino, nlink, hooks, gone_r, &file_ino);
	return ns_end(st, ret, gone_r, file_ino);
}

/* Is a message's rename from directory parent to newparent (over
   nothing) a change of its flags or a move between new/ and cur/ of
   one folder?  Its loss at the death of the daemon leaves the message
   under its name before, so its commit may be deferred (store-commit.c).
   Any rename out of tmp/ is not: it is a delivery's acknowledgement. */
static bool flag_rename(struct dbox_store *st, uint64_t parent,
			uint64_t newparent)
{
	uint64_t folder, newfolder;
	int from = subdir_of(st, parent, &folder), to;

	if (from != MAILDIR_CUR && from != MAILDIR_NEW)
		return false;
	if (newparent == parent)
		return true;
	/* new/ -> cur/ of the same folder (cur/ -> new/ too: no delivery). */
	to = subdir_of(st, newparent, &newfolder);
	return (to == MAILDIR_CUR || to == MAILDIR_NEW) && newfolder == folder;
}

int dbox_ns_rename(struct dbox_store *st, uint64_t parent, const char *name,
		   uint64_t newparent, const char *newname, unsigned int flags,
		   const struct dbox_ns_hooks *hooks, struct dbox_attr *moved_r,
		   struct dbox_ns_gone *gone_r)
{
	uint64_t replaced = 0, file_ino = 0;
	uint32_t nlink = 0;
	int ret;

	dbox_store_assert_locked(st);
	if ((ret = ns_begin(st, gone_r)) == 0)
		ret = dbox_index_rename(st->index, parent, name, strlen(name),
					newparent, newname, strlen(newname),
					flags, dbox_now_ns(), moved_r, &replaced,
					&nlink);
	else
		return ret;
	/* The callback first: a retry it asks for must find nothing
	   marked held-and-unlinked by the caller. */
	if (ret == 0 && hooks != NULL && hooks->moved != NULL)
		ret = hooks->moved(hooks->ctx, moved_r, newparent, newname);
	if (ret == 0)
		ret = name_gone(st, replaced, nlink, hooks, gone_r, &file_ino);
	if (ret == 0 && replaced == 0 && file_ino == 0 &&
	    moved_r->kind == DBOX_KIND_MESSAGE &&
	    flag_rename(st, parent, newparent))
		return dbox_store_commit_later(st, false);
	return ns_end(st, ret, gone_r, file_ino);
}

int dbox_ns_delete_orphan(struct dbox_store *st, uint64_t ino,
			  struct dbox_ns_gone *gone_r)
{
	uint64_t file_ino = 0;
	int ret = ns_begin(st, gone_r);

	dbox_store_assert_locked(st);
	gone_r->ino = ino;
	if (ret < 0)
		return ret;
	ret = drop_inode(st, ino, gone_r, &file_ino);
	return ns_end(st, ret, gone_r, file_ino);
}

/* The attributes set->what names, applied to *attr. */
static void apply_set(struct dbox_attr *attr, const struct dbox_ns_set *set)
{
	if (set->what & DBOX_NS_SET_MODE)
		attr->mode = (attr->mode & S_IFMT) | (set->mode & 07777);
	if (set->what & DBOX_NS_SET_UID)
		attr->uid = set->uid;
	if (set->what & DBOX_NS_SET_GID)
		attr->gid = set->gid;
	if (set->what & DBOX_NS_SET_SIZE)
		attr->size = set->size;
	if (set->what & DBOX_NS_SET_MTIME)
		attr->mtime_ns = set->mtime_ns;
	if (set->what & DBOX_NS_SET_ATIME)
		attr->atime_ns = set->atime_ns;
	if (set->what & DBOX_NS_SET_CTIME)
		attr->ctime_ns = set->ctime_ns;
}

/* ino's attributes with set applied, written in the open transaction,
   into *attr_r.  Returns 0, -ENOENT, -EIO. */
static int setattr_in_tx(struct dbox_store *st, uint64_t ino,
			 const struct dbox_ns_set *set, struct dbox_attr *attr_r)
{
	int ret = dbox_index_getattr(st->index, ino, attr_r);

	if (ret == 0) {
		apply_set(attr_r, set);
		ret = dbox_index_setattr(st->index, attr_r);
	}
	return ret;
}

int dbox_ns_setattr(struct dbox_store *st, uint64_t ino,
		    const struct dbox_ns_set *set, struct dbox_attr *attr_r)
{
	struct dbox_attr attr;
	int ret;

	dbox_store_assert_locked(st);
	if ((ret = ns_begin(st, NULL)) < 0)
		return ret;
	ret = setattr_in_tx(st, ino, set, &attr);
	if ((ret = ns_end(st, ret, NULL, 0)) == 0 && attr_r != NULL)
		*attr_r = attr;
	return ret;
}

int dbox_ns_touch_atime(struct dbox_store *st, uint64_t ino, int64_t atime_ns)
{
	const struct dbox_ns_set set = {
		.what = DBOX_NS_SET_ATIME, .atime_ns = atime_ns,
	};
	struct dbox_attr attr;
	int ret;

	dbox_store_assert_locked(st);
	if ((ret = ns_begin(st, NULL)) < 0)
		return ret;
	if ((ret = setattr_in_tx(st, ino, &set, &attr)) < 0)
		return ns_end(st, ret, NULL, 0);
	return dbox_store_commit_later(st, false);
}

/* End an xattr change whose outcome is ret: when made, ctime = now (as
   ext4), in the same transaction. */
static int xattr_changed(struct dbox_store *st, uint64_t ino, int ret)
{
	struct dbox_attr attr;

	if (ret == 0 && (ret = dbox_index_getattr(st->index, ino, &attr)) == 0) {
		attr.ctime_ns = dbox_now_ns();
		ret = dbox_index_setattr(st->index, &attr);
	}
	return ns_end(st, ret, NULL, 0);
}

/* Does ino's attribute name hold exactly value[len]? */
static bool xattr_same(struct dbox_store *st, uint64_t ino, const char *name,
		       const void *value, size_t len)
{
	void *old = NULL;
	size_t old_len = 0;
	bool same = dbox_index_xattr_get(st->index, ino, name, &old,
					 &old_len) == 0 &&
		old_len == len && (len == 0 || memcmp(old, value, len) == 0);

	free(old);
	return same;
}

int dbox_ns_xattr_set(struct dbox_store *st, uint64_t ino, const char *name,
		      const void *value, size_t len, int flags)
{
	int ret;

	dbox_store_assert_locked(st);
	if ((ret = ns_begin(st, NULL)) < 0)
		return ret;
	/* The value it has already: nothing changes, ctime neither (as
	   ext4; helper-78).  XATTR_CREATE still says EEXIST. */
	if (!(flags & XATTR_CREATE) && xattr_same(st, ino, name, value, len))
		return ns_end(st, 0, NULL, 0);
	return xattr_changed(st, ino, dbox_index_xattr_set(st->index, ino, name,
							   value, len, flags));
}

int dbox_ns_xattr_remove(struct dbox_store *st, uint64_t ino,
			 const char *name)
{
	int ret;

	dbox_store_assert_locked(st);
	if ((ret = ns_begin(st, NULL)) < 0)
		return ret;
	return xattr_changed(st, ino, dbox_index_xattr_remove(st->index, ino,
							      name));
}
