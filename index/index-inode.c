/*
 * index-inode.c: what the index keeps per inode besides its names (see
 * index.h): attributes (with the attribute cache of the store's writer),
 * a symbolic link's target, extended attributes, and the deletion of an
 * inode that has no names left.
 *
 * Invariants kept here:
 *  - a cached attribute is dropped whenever this connection changes its
 *    inode or message row, and every one at a rollback (index-private.h);
 *  - an inode's symlink and xattr rows go with it (deleted here: no
 *    trigger runs, index_guard).
 */
#include "index-private.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>

void index_attr_cache_put(struct dbox_index *index,
			  const struct dbox_attr *attr)
{
	if (index->attrs.enabled && attr->ino != 0)
		index->attrs.attr[attr->ino % INDEX_ATTR_CACHE] = *attr;
}

bool index_attr_cache_get(struct dbox_index *index, uint64_t ino,
			  struct dbox_attr *attr_r)
{
	const struct dbox_attr *c = &index->attrs.attr[ino % INDEX_ATTR_CACHE];

	if (ino == 0 || c->ino != ino || !index->attrs.enabled)
		return false;
	*attr_r = *c;
	return true;
}

void dbox_index_attr_known(struct dbox_index *index,
			   const struct dbox_attr *attr)
{
	index_attr_cache_put(index, attr);
}

/* A change of row ino of inode, or of message (its record size is the
   attributes' stored bytes), by this connection (sqlite3_update_hook;
   both tables are keyed by ino). */
static void attr_cache_changed(void *arg, int op, const char *db,
			       const char *table, sqlite3_int64 rowid)
{
	struct dbox_index *index = arg;
	struct dbox_attr *c;

	(void)op;
	(void)db;
	if (strcmp(table, "inode") != 0 && strcmp(table, "message") != 0)
		return;
	c = &index->attrs.attr[(uint64_t)rowid % INDEX_ATTR_CACHE];
	if (c->ino == (uint64_t)rowid)
		c->ino = 0;
}

void index_attr_cache_drop(struct dbox_index *index)
{
	for (size_t i = 0; i < INDEX_ATTR_CACHE; i++)
		index->attrs.attr[i].ino = 0;
}

/* A rollback (explicit or automatic): values read inside the transaction
   may be gone. */
static void attr_cache_rollback(void *arg)
{
	index_attr_cache_drop(arg);
}

void dbox_index_cache_attrs(struct dbox_index *index)
{
	attr_cache_rollback(index);
	sqlite3_update_hook(index->db, attr_cache_changed, index);
	sqlite3_rollback_hook(index->db, attr_cache_rollback, index);
	index->attrs.enabled = true;
}

/* From the cache when there: a GETATTR of a directory the kernel asks
   for again after each change in it (default_permissions) costs no
   SQLite read transaction (two fcntl() locks of the WAL-index each). */
int dbox_index_getattr(struct dbox_index *index, uint64_t ino,
		       struct dbox_attr *attr_r)
{
	sqlite3_stmt *stmt;
	int ret;

	if (index_attr_cache_get(index, ino, attr_r))
		return 0;
	stmt = index_stmt(index, ST_GETATTR);
	sqlite3_bind_int64(stmt, 1, ino);
	ret = index_done(stmt, index_step_attr(index, stmt, 0, attr_r, "getattr"));
	if (ret == 0 && attr_r->ino == ino)
		index_attr_cache_put(index, attr_r);
	return ret;
}

int dbox_index_delete_inode(struct dbox_index *index, uint64_t ino)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_MSG_DELETE);
	int ret;

	sqlite3_bind_int64(stmt, 1, ino);
	if ((ret = index_exec_stmt(index, stmt, "message delete")) < 0)
		return ret;
	stmt = index_stmt(index, ST_SYMLINK_DROP);
	sqlite3_bind_int64(stmt, 1, ino);
	if ((ret = index_exec_stmt(index, stmt, "symlink delete")) < 0)
		return ret;
	stmt = index_stmt(index, ST_XATTR_DROP);
	sqlite3_bind_int64(stmt, 1, ino);
	if ((ret = index_exec_stmt(index, stmt, "xattr delete")) < 0)
		return ret;
	stmt = index_stmt(index, ST_INODE_DELETE);
	sqlite3_bind_int64(stmt, 1, ino);
	return index_exec_stmt(index, stmt, "inode delete");
}

int dbox_index_setattr(struct dbox_index *index, const struct dbox_attr *attr)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_SETATTR);
	int ret;

	index_bind_attr(stmt, attr);
	sqlite3_bind_int64(stmt, 11, (int64_t)attr->rdev);
	if ((ret = index_exec_stmt(index, stmt, "setattr")) < 0)
		return ret;
	return sqlite3_changes(index->db) == 1 ? 0 : -ENOENT;
}

int dbox_index_symlink_set(struct dbox_index *index, uint64_t ino,
			   const char *target, size_t len)
{
	sqlite3_stmt *stmt;
	struct dbox_attr attr;
	int ret;

	if (len == 0 || len >= 4096)
		return len == 0 ? -ENOENT : -ENAMETOOLONG;
	if ((ret = dbox_index_getattr(index, ino, &attr)) < 0)
		return ret;
	stmt = index_stmt(index, ST_SYMLINK_SET);
	sqlite3_bind_int64(stmt, 1, ino);
	sqlite3_bind_blob(stmt, 2, target, len, SQLITE_STATIC);
	if ((ret = index_exec_stmt(index, stmt, "symlink set")) < 0)
		return ret;
	attr.size = len;
	return dbox_index_setattr(index, &attr);
}

int dbox_index_readlink(struct dbox_index *index, uint64_t ino,
			char **target_r)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_SYMLINK_GET);
	int rc;

	sqlite3_bind_int64(stmt, 1, ino);
	rc = sqlite3_step(stmt);
	if (rc == SQLITE_ROW) {
		const void *target = sqlite3_column_blob(stmt, 0);
		int len = sqlite3_column_bytes(stmt, 0);

		/* symlink(2) makes no empty target (ENOENT); SQLite gives
		   NULL for an empty blob. */
		if (target == NULL || len == 0) {
			dbox_error("index %s: symbolic link inode %llu has an "
				   "empty target (a damaged row)", index->path,
				   (unsigned long long)ino);
			return index_done(stmt, -EIO);
		}
		*target_r = strndup(target, (size_t)len);
		return index_done(stmt, *target_r == NULL ? -ENOMEM : 0);
	}
	return rc == SQLITE_DONE ? -EINVAL : index_sql_error(index, "readlink");
}

int dbox_index_xattr_get(struct dbox_index *index, uint64_t ino,
			 const char *name, void **value_r, size_t *len_r)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_XATTR_GET);
	size_t len;
	int rc;

	*value_r = NULL;
	*len_r = 0;
	sqlite3_bind_int64(stmt, 1, ino);
	sqlite3_bind_blob(stmt, 2, name, strlen(name), SQLITE_STATIC);
	rc = sqlite3_step(stmt);
	if (rc == SQLITE_DONE)
		return index_done(stmt, -ENODATA);
	if (rc != SQLITE_ROW)
		return index_done(stmt, index_sql_error(index, "xattr get"));
	len = (size_t)sqlite3_column_bytes(stmt, 0);
	if (len > 0) {
		if ((*value_r = malloc(len)) == NULL)
			return index_done(stmt, -ENOMEM);
		memcpy(*value_r, sqlite3_column_blob(stmt, 0), len);
	}
	*len_r = len;
	return index_done(stmt, 0);
}

int dbox_index_xattr_set(struct dbox_index *index, uint64_t ino,
			 const char *name, const void *value, size_t len,
			 int flags)
{
	size_t namelen = strlen(name);
	sqlite3_stmt *stmt;
	int64_t names, total;
	int rc;

	if (namelen == 0 || namelen > DBOX_XATTR_NAME_MAX ||
	    len > DBOX_XATTR_SIZE_MAX)
		return -ERANGE;
	/* What the inode holds besides this name, checked against the
	   limits before anything is written. */
	stmt = index_stmt(index, ST_XATTR_USAGE);
	sqlite3_bind_int64(stmt, 1, ino);
	sqlite3_bind_blob(stmt, 2, name, namelen, SQLITE_STATIC);
	if ((rc = sqlite3_step(stmt)) != SQLITE_ROW)
		return index_done(stmt, index_sql_error(index, "xattr usage"));
	names = sqlite3_column_int64(stmt, 0);
	total = sqlite3_column_int64(stmt, 1);
	index_done(stmt, 0);
	if (names + (int64_t)namelen + 1 > DBOX_XATTR_SIZE_MAX ||
	    total + (int64_t)namelen + (int64_t)len > DBOX_XATTR_TOTAL_MAX)
		return -ENOSPC;
	/* An empty value is a zero-length blob, never NULL (NOT NULL). */
	if (value == NULL)
		value = "";
	stmt = index_stmt(index, flags & XATTR_REPLACE ?
			  ST_XATTR_UPDATE : ST_XATTR_INSERT);
	sqlite3_bind_int64(stmt, 1, ino);
	sqlite3_bind_blob(stmt, 2, name, namelen, SQLITE_STATIC);
	sqlite3_bind_blob(stmt, 3, value, len, SQLITE_STATIC);
	rc = sqlite3_step(stmt);
	sqlite3_reset(stmt);
	if (rc == SQLITE_CONSTRAINT_PRIMARYKEY || rc == SQLITE_CONSTRAINT) {
		if (flags & XATTR_CREATE)
			return -EEXIST;
		stmt = index_stmt(index, ST_XATTR_UPDATE);
		sqlite3_bind_int64(stmt, 1, ino);
		sqlite3_bind_blob(stmt, 2, name, namelen, SQLITE_STATIC);
		sqlite3_bind_blob(stmt, 3, value, len, SQLITE_STATIC);
		rc = sqlite3_step(stmt);
		sqlite3_reset(stmt);
	}
	if (rc != SQLITE_DONE)
		return index_sql_error(index, "xattr set");
	if ((flags & XATTR_REPLACE) && sqlite3_changes(index->db) == 0)
		return -ENODATA;
	return 0;
}

int dbox_index_xattr_remove(struct dbox_index *index, uint64_t ino,
			    const char *name)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_XATTR_DELETE);
	int ret;

	sqlite3_bind_int64(stmt, 1, ino);
	sqlite3_bind_blob(stmt, 2, name, strlen(name), SQLITE_STATIC);
	if ((ret = index_exec_stmt(index, stmt, "xattr remove")) < 0)
		return ret;
	return sqlite3_changes(index->db) == 1 ? 0 : -ENODATA;
}

int dbox_index_xattr_list(struct dbox_index *index, uint64_t ino,
			  char **list_r, size_t *len_r)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_XATTR_LIST);
	char *list = NULL, *grown;
	size_t len = 0;
	int rc;

	sqlite3_bind_int64(stmt, 1, ino);
	while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
		size_t n = (size_t)sqlite3_column_bytes(stmt, 0);
		const char *name = sqlite3_column_blob(stmt, 0);

		/* Only what dboxfs stores: a user.* name of at most
		   DBOX_XATTR_NAME_MAX bytes without a NUL.  Other rows come from
		   whoever wrote the index (a store's owner can): listed, they
		   were names getxattr refuses, which failed root's rsync -X,
		   and export wrote security.capability and trusted.* from
		   them (helper-91). */
		if (n <= strlen(DBOX_XATTR_USER_PREFIX) || n > DBOX_XATTR_NAME_MAX ||
		    memcmp(name, DBOX_XATTR_USER_PREFIX,
			   strlen(DBOX_XATTR_USER_PREFIX)) != 0 ||
		    memchr(name, '\0', n) != NULL)
			continue;
		if ((grown = realloc(list, len + n + 1)) == NULL) {
			free(list);
			return index_done(stmt, -ENOMEM);
		}
		list = grown;
		memcpy(list + len, name, n);
		list[len + n] = '\0';
		len += n + 1;
	}
	sqlite3_reset(stmt);
	if (rc != SQLITE_DONE) {
		free(list);
		return index_sql_error(index, "xattr list");
	}
	*list_r = list;
	*len_r = len;
	return 0;
}