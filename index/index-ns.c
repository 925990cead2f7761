/*
 * index-ns.c: the namespace: names, inodes, directories (see index.h).
 *
 * Invariants kept here:
 *  - inode.nlink of a non-directory = number of entry rows naming it;
 *    of a directory = 2 + number of subdirectories.
 *  - a directory has exactly one entry (no hard links to directories).
 *  - a directory's mtime and ctime become the current time on every add,
 *    remove or rename inside it, as ext4 sets them: also when they lay in
 *    the future (a stepped clock, touch -d), where "never earlier than
 *    before" would keep them there and clients comparing with the clock
 *    (notmuch) would never look again.
 *  - a rename keeps entry.id, so readdir by id sees a renamed entry once.
 */
#include "index-private.h"

#include "storage/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

int dbox_index_lookup(struct dbox_index *index, uint64_t parent,
		      const char *name, size_t namelen,
		      struct dbox_attr *attr_r)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_LOOKUP);

	if (namelen > DBOX_NAME_MAX)
		return -ENAMETOOLONG;
	sqlite3_bind_int64(stmt, 1, parent);
	sqlite3_bind_blob(stmt, 2, name, namelen, SQLITE_STATIC);
	return index_done(stmt, index_step_attr(index, stmt, 0, attr_r, "lookup"));
}

int dbox_index_lookup_unique(struct dbox_index *index, uint64_t parent,
			     const char *unique, size_t len,
			     struct dbox_attr *attr_r)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_LOOKUP_RANGE);
	char end[DBOX_NAME_MAX + 1];
	int rc;

	if (len == 0 || len >= DBOX_NAME_MAX)
		return len == 0 ? -ENOENT : -ENAMETOOLONG;
	/* [unique, unique";") holds unique, unique":..." and others (digits,
	   '.', '-' after it), told apart here. */
	memcpy(end, unique, len);
	end[len] = ':' + 1;
	sqlite3_bind_int64(stmt, 1, parent);
	sqlite3_bind_blob(stmt, 2, unique, len, SQLITE_STATIC);
	sqlite3_bind_blob(stmt, 3, end, len + 1, SQLITE_STATIC);
	while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
		const char *name = sqlite3_column_blob(stmt, 0);
		size_t n = (size_t)sqlite3_column_bytes(stmt, 0);

		if (n == len || (n > len && name[len] == ':')) {
			index_row_attr(stmt, 1, attr_r);
			return index_done(stmt, 0);
		}
	}
	return index_done(stmt, rc == SQLITE_DONE ? -ENOENT :
			  index_sql_error(index, "lookup by unique name"));
}

/* The entry parent/name: its id and the attributes of what it names. */
static int entry_get(struct dbox_index *index, uint64_t parent,
		     const char *name, size_t namelen, uint64_t *id_r,
		     struct dbox_attr *attr_r)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_ENTRY_GET);
	int ret;

	sqlite3_bind_int64(stmt, 1, parent);
	sqlite3_bind_blob(stmt, 2, name, namelen, SQLITE_STATIC);
	ret = index_step_attr(index, stmt, 1, attr_r, "entry");
	if (ret == 0)
		*id_r = sqlite3_column_int64(stmt, 0);
	return index_done(stmt, ret);
}

/* New mtime and ctime of a directory whose entries changed (its atime
   stays what it read as, also a NULL one).  Its attributes stay in the
   attribute cache when they were there: only those times changed. */
static int touch_dir(struct dbox_index *index, uint64_t dir, int64_t now_ns)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_TOUCH_DIR);
	struct dbox_attr attr;
	bool cached = index_attr_cache_get(index, dir, &attr);
	int ret;

	sqlite3_bind_int64(stmt, 1, dir);
	sqlite3_bind_int64(stmt, 2, now_ns);
	if ((ret = index_exec_stmt(index, stmt, "touch dir")) < 0)
		return ret;
	if (cached) {
		attr.mtime_ns = attr.ctime_ns = now_ns;
		index_attr_cache_put(index, &attr);
	}
	return 0;
}

/* The new ctime of a renamed inode whose attributes before were *attr,
   which become the ones after (and go to the attribute cache). */
static int touch_moved(struct dbox_index *index, struct dbox_attr *attr,
		       int64_t now_ns)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_SET_CTIME);
	int ret;

	sqlite3_bind_int64(stmt, 1, attr->ino);
	sqlite3_bind_int64(stmt, 2, now_ns);
	if ((ret = index_exec_stmt(index, stmt, "ctime")) < 0)
		return ret;
	attr->ctime_ns = now_ns;
	index_attr_cache_put(index, attr);
	return 0;
}

static int nlink_add(struct dbox_index *index, uint64_t ino, int delta,
		     int64_t now_ns)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_NLINK_ADD);

	sqlite3_bind_int64(stmt, 1, ino);
	sqlite3_bind_int(stmt, 2, delta);
	sqlite3_bind_int64(stmt, 3, now_ns);
	return index_exec_stmt(index, stmt, "nlink");
}

static int entry_insert(struct dbox_index *index, uint64_t parent,
			const char *name, size_t namelen, uint64_t ino)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_ENTRY_INSERT);
	int rc;

	if (namelen > DBOX_NAME_MAX)
		return -ENAMETOOLONG;
	sqlite3_bind_int64(stmt, 1, parent);
	sqlite3_bind_blob(stmt, 2, name, namelen, SQLITE_STATIC);
	sqlite3_bind_int64(stmt, 3, ino);
	rc = sqlite3_step(stmt);
	sqlite3_reset(stmt);
	if (rc == SQLITE_CONSTRAINT_UNIQUE)
		return -EEXIST;
	return rc == SQLITE_DONE ? 0 : index_sql_error(index, "entry insert");
}

static int entry_delete(struct dbox_index *index, uint64_t id)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_ENTRY_DELETE);

	sqlite3_bind_int64(stmt, 1, id);
	return index_exec_stmt(index, stmt, "entry delete");
}

/* Check that dir is a directory. */
static int check_dir(struct dbox_index *index, uint64_t dir)
{
	struct dbox_attr attr;
	int ret = dbox_index_getattr(index, dir, &attr);

	if (ret < 0)
		return ret;
	return attr.kind == DBOX_KIND_DIR ? 0 : -ENOTDIR;
}

/* The statements a create runs: the parent's kind (from the attribute
   cache, mostly), the inode row, its entry (whose UNIQUE key says
   whether the name exists), the parent's times (and nlink for a
   directory).  The new inode's attributes are known without reading
   them back. */
int dbox_index_create(struct dbox_index *index, uint64_t parent,
		      const char *name, size_t namelen, enum dbox_kind kind,
		      uint32_t mode, uint32_t uid, uint32_t gid, int64_t now_ns,
		      struct dbox_attr *attr_r)
{
	sqlite3_stmt *stmt;
	bool is_dir = kind == DBOX_KIND_DIR;
	struct dbox_attr attr = {
		.kind = kind, .mode = mode, .uid = uid, .gid = gid,
		.nlink = is_dir ? 2 : 1,
		.mtime_ns = now_ns, .ctime_ns = now_ns, .atime_ns = now_ns,
	};
	int ret;

	if (namelen > DBOX_NAME_MAX)
		return -ENAMETOOLONG;
	if ((ret = check_dir(index, parent)) < 0)
		return ret;
	stmt = index_stmt(index, ST_INODE_INSERT);
	index_bind_attr(stmt, &attr);
	if ((ret = index_exec_stmt(index, stmt, "inode insert")) < 0)
		return ret;
	attr.ino = sqlite3_last_insert_rowid(index->db);
	if ((ret = entry_insert(index, parent, name, namelen, attr.ino)) < 0) {
		/* The name exists: a failure leaves nothing behind, also in
		   a transaction the caller goes on with. */
		(void)dbox_index_delete_inode(index, attr.ino);
		return ret;
	}
	if ((ret = touch_dir(index, parent, now_ns)) < 0 ||
	    (is_dir && (ret = nlink_add(index, parent, 1, now_ns)) < 0))
		return ret;
	index_attr_cache_put(index, &attr);
	*attr_r = attr;
	return 0;
}

int dbox_index_link(struct dbox_index *index, uint64_t ino,
		    uint64_t newparent, const char *name, size_t namelen,
		    int64_t now_ns, struct dbox_attr *attr_r)
{
	struct dbox_attr attr;
	int ret;

	if ((ret = dbox_index_getattr(index, ino, &attr)) < 0)
		return ret;
	if (attr.kind == DBOX_KIND_DIR)
		return -EPERM;
	if (attr.nlink == 0)
		return -ENOENT;
	if ((ret = check_dir(index, newparent)) < 0 ||
	    (ret = entry_insert(index, newparent, name, namelen, ino)) < 0 ||
	    (ret = nlink_add(index, ino, 1, now_ns)) < 0 ||
	    (ret = touch_dir(index, newparent, now_ns)) < 0)
		return ret;
	/* What nlink_add changed, without reading it back. */
	attr.nlink++;
	attr.ctime_ns = now_ns;
	index_attr_cache_put(index, &attr);
	*attr_r = attr;
	return 0;
}

static int dir_is_empty(struct dbox_index *index, uint64_t dir)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_DIR_HAS_ENTRIES);
	int rc;

	sqlite3_bind_int64(stmt, 1, dir);
	rc = sqlite3_step(stmt);
	sqlite3_reset(stmt);
	if (rc == SQLITE_ROW)
		return -ENOTEMPTY;
	return rc == SQLITE_DONE ? 0 : index_sql_error(index, "dir empty");
}

int dbox_index_remove(struct dbox_index *index, uint64_t parent,
		      const char *name, size_t namelen, bool dir,
		      int64_t now_ns, uint64_t *ino_r, uint32_t *nlink_r)
{
	struct dbox_attr attr;
	uint64_t id = 0;
	int ret;

	if ((ret = entry_get(index, parent, name, namelen, &id, &attr)) < 0)
		return ret;
	if (dir && attr.kind != DBOX_KIND_DIR)
		return -ENOTDIR;
	if (!dir && attr.kind == DBOX_KIND_DIR)
		return -EISDIR;
	if (dir && (ret = dir_is_empty(index, attr.ino)) < 0)
		return ret;
	if ((ret = entry_delete(index, id)) < 0 ||
	    (ret = touch_dir(index, parent, now_ns)) < 0)
		return ret;
	*ino_r = attr.ino;
	if (dir) {
		*nlink_r = 0;
		if ((ret = nlink_add(index, parent, -1, now_ns)) < 0)
			return ret;
		return dbox_index_delete_inode(index, attr.ino);
	}
	*nlink_r = attr.nlink - 1;
	return nlink_add(index, attr.ino, -1, now_ns);
}

int dbox_index_parent(struct dbox_index *index, uint64_t dir,
		      uint64_t *parent_r)
{
	sqlite3_stmt *stmt;
	int rc;

	if (dir == DBOX_ROOT_INO) {
		*parent_r = DBOX_ROOT_INO;
		return 0;
	}
	stmt = index_stmt(index, ST_PARENT_OF);
	sqlite3_bind_int64(stmt, 1, dir);
	rc = sqlite3_step(stmt);
	if (rc == SQLITE_ROW) {
		*parent_r = sqlite3_column_int64(stmt, 0);
		return index_done(stmt, 0);
	}
	return rc == SQLITE_DONE ? -ENOENT : index_sql_error(index, "parent");
}

/* -EINVAL when dir is ancestor (or equal to) of node: a directory must not
   be moved below itself. */
static int check_not_ancestor(struct dbox_index *index, uint64_t dir,
			      uint64_t node)
{
	unsigned int depth = 0;
	int ret;

	while (node != DBOX_ROOT_INO) {
		if (node == dir)
			return -EINVAL;
		if (++depth > DBOX_TREE_MAX_DEPTH) {
			dbox_error("index: the directories above inode %llu "
				   "never reach the root (a cycle)",
				   (unsigned long long)node);
			return -EIO;
		}
		if ((ret = dbox_index_parent(index, node, &node)) < 0)
			return ret;
	}
	return dir == DBOX_ROOT_INO ? -EINVAL : 0;
}

static int entry_move(struct dbox_index *index, uint64_t id, uint64_t parent,
		      const char *name, size_t namelen)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_ENTRY_MOVE);

	sqlite3_bind_int64(stmt, 1, id);
	sqlite3_bind_int64(stmt, 2, parent);
	sqlite3_bind_blob(stmt, 3, name, namelen, SQLITE_STATIC);
	return index_exec_stmt(index, stmt, "entry move");
}

static int entry_set_ino(struct dbox_index *index, uint64_t id, uint64_t ino)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_ENTRY_SET_INO);

	sqlite3_bind_int64(stmt, 1, id);
	sqlite3_bind_int64(stmt, 2, ino);
	return index_exec_stmt(index, stmt, "entry set ino");
}

/* RENAME_EXCHANGE: swap what the two names point at. */
static int rename_exchange(struct dbox_index *index, uint64_t parent,
			   uint64_t newparent, uint64_t id,
			   const struct dbox_attr *src, uint64_t new_id,
			   const struct dbox_attr *dst, int64_t now_ns)
{
	int ret;
	int dirs_moved = (src->kind == DBOX_KIND_DIR) -
			 (dst->kind == DBOX_KIND_DIR);

	if (parent != newparent) {
		/* Either directory may be above the other's parent, also
		   when both are directories (no net link change). */
		if ((src->kind == DBOX_KIND_DIR &&
		     (ret = check_not_ancestor(index, src->ino, newparent)) < 0) ||
		    (dst->kind == DBOX_KIND_DIR &&
		     (ret = check_not_ancestor(index, dst->ino, parent)) < 0))
			return ret;
		if (dirs_moved != 0 &&
		    ((ret = nlink_add(index, parent, -dirs_moved, now_ns)) < 0 ||
		     (ret = nlink_add(index, newparent, dirs_moved, now_ns)) < 0))
			return ret;
	}
	if ((ret = entry_set_ino(index, id, dst->ino)) < 0 ||
	    (ret = entry_set_ino(index, new_id, src->ino)) < 0 ||
	    (ret = touch_dir(index, parent, now_ns)) < 0)
		return ret;
	return parent == newparent ? 0 : touch_dir(index, newparent, now_ns);
}

/* Both ends of a rename in one statement: the entry parent/name (its id
   and attributes into *id_r and *src_r) and newparent/newname (*new_id_r,
   *dst_r).  Returns 1 when the target exists, 0 when it does not,
   -ENOENT when the source does not, or -EIO. */
static int rename_ends(struct dbox_index *index, uint64_t parent,
		       const char *name, size_t namelen, uint64_t newparent,
		       const char *newname, size_t newnamelen, uint64_t *id_r,
		       struct dbox_attr *src_r, uint64_t *new_id_r,
		       struct dbox_attr *dst_r)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_RENAME_ENDS);
	bool have_src = false, have_dst = false;
	struct dbox_attr attr;
	int rc;

	sqlite3_bind_int64(stmt, 1, parent);
	sqlite3_bind_blob(stmt, 2, name, namelen, SQLITE_STATIC);
	sqlite3_bind_int64(stmt, 3, newparent);
	sqlite3_bind_blob(stmt, 4, newname, newnamelen, SQLITE_STATIC);
	while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
		index_row_attr(stmt, 3, &attr);
		/* One row may be both ends (a rename onto itself). */
		if (sqlite3_column_int(stmt, 1)) {
			*id_r = sqlite3_column_int64(stmt, 0);
			*src_r = attr;
			have_src = true;
		}
		if (sqlite3_column_int(stmt, 2)) {
			*new_id_r = sqlite3_column_int64(stmt, 0);
			*dst_r = attr;
			have_dst = true;
		}
	}
	sqlite3_reset(stmt);
	if (rc != SQLITE_DONE)
		return index_sql_error(index, "rename ends");
	if (!have_src)
		return -ENOENT;
	return have_dst ? 1 : 0;
}

int dbox_index_rename(struct dbox_index *index, uint64_t parent,
		      const char *name, size_t namelen, uint64_t newparent,
		      const char *newname, size_t newnamelen,
		      unsigned int flags, int64_t now_ns, struct dbox_attr *moved_r,
		      uint64_t *replaced_ino_r, uint32_t *replaced_nlink_r)
{
	struct dbox_attr src, dst = { 0 };
	uint64_t id = 0, new_id = 0;
	bool src_dir, replacing;
	int ret;

	*replaced_ino_r = 0;
	*replaced_nlink_r = 0;
	if ((flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE)) != 0 ||
	    (flags & RENAME_NOREPLACE && flags & RENAME_EXCHANGE))
		return -EINVAL;
	if (newnamelen > DBOX_NAME_MAX)
		return -ENAMETOOLONG;
	if ((ret = rename_ends(index, parent, name, namelen, newparent,
			       newname, newnamelen, &id, &src, &new_id,
			       &dst)) < 0)
		return ret;
	replacing = ret == 1;
	if (moved_r != NULL)
		*moved_r = src;
	if ((ret = check_dir(index, newparent)) < 0)
		return ret;
	src_dir = src.kind == DBOX_KIND_DIR;
	if (replacing) {
		if (flags & RENAME_NOREPLACE)
			return -EEXIST;
		if (flags & RENAME_EXCHANGE)
			return rename_exchange(index, parent, newparent, id,
					       &src, new_id, &dst, now_ns);
		if (dst.ino == src.ino)
			return 0; /* two names of one inode: POSIX no-op */
		if (src_dir && dst.kind != DBOX_KIND_DIR)
			return -ENOTDIR;
		if (!src_dir && dst.kind == DBOX_KIND_DIR)
			return -EISDIR;
		if (src_dir && (ret = dir_is_empty(index, dst.ino)) < 0)
			return ret;
	} else if (flags & RENAME_EXCHANGE) {
		return -ENOENT;
	}
	if (src_dir && parent != newparent &&
	    (ret = check_not_ancestor(index, src.ino, newparent)) < 0)
		return ret;

	if (replacing) {
		/* Replace the target: drop its name first. */
		if ((ret = entry_delete(index, new_id)) < 0)
			return ret;
		if (dst.kind == DBOX_KIND_DIR) {
			if ((ret = nlink_add(index, newparent, -1, now_ns)) < 0 ||
			    (ret = dbox_index_delete_inode(index, dst.ino)) < 0)
				return ret;
		} else {
			if ((ret = nlink_add(index, dst.ino, -1, now_ns)) < 0)
				return ret;
			*replaced_ino_r = dst.ino;
			*replaced_nlink_r = dst.nlink - 1;
		}
	}
	if ((ret = entry_move(index, id, newparent, newname, newnamelen)) < 0 ||
	    (ret = touch_dir(index, parent, now_ns)) < 0 ||
	    (ret = touch_moved(index, &src, now_ns)) < 0)
		return ret;
	if (moved_r != NULL)
		*moved_r = src;
	if (parent != newparent) {
		if ((ret = touch_dir(index, newparent, now_ns)) < 0)
			return ret;
		if (src_dir &&
		    ((ret = nlink_add(index, parent, -1, now_ns)) < 0 ||
		     (ret = nlink_add(index, newparent, 1, now_ns)) < 0))
			return ret;
	}
	return 0;
}

int dbox_index_readdir(struct dbox_index *index, uint64_t dir, uint64_t after,
		       dbox_readdir_cb_t *cb, void *ctx)
{
	sqlite3_stmt *stmt;
	struct dbox_dirent ent;
	int rc, ret;
	bool more = true;

	/* Pages of 256 rows, so the statement is never held open across a
	   callback that stops early. */
	while (more) {
		unsigned int rows = 0;

		stmt = index_stmt(index, ST_READDIR);
		sqlite3_bind_int64(stmt, 1, dir);
		sqlite3_bind_int64(stmt, 2, after);
		while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
			rows++;
			ent.cookie = sqlite3_column_int64(stmt, 0);
			ent.name = sqlite3_column_blob(stmt, 1);
			ent.namelen = sqlite3_column_bytes(stmt, 1);
			index_row_attr(stmt, 2, &ent.attr);
			after = ent.cookie;
			ret = cb(ctx, &ent);
			if (ret != 0) {
				sqlite3_reset(stmt);
				return ret < 0 ? ret : 0;
			}
		}
		if (rc != SQLITE_DONE)
			return index_sql_error(index, "readdir");
		more = rows == 256;
	}
	return 0;
}

int dbox_index_entry_of(struct dbox_index *index, uint64_t ino,
			uint64_t *parent_r, char **name_r)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_NAME_OF);
	int rc;

	sqlite3_bind_int64(stmt, 1, ino);
	rc = sqlite3_step(stmt);
	if (rc == SQLITE_ROW) {
		const char *name = sqlite3_column_blob(stmt, 0);

		/* NULL for an empty blob: a damaged row. */
		*name_r = strndup(name != NULL ? name : "",
				  (size_t)sqlite3_column_bytes(stmt, 0));
		if (parent_r != NULL)
			*parent_r = sqlite3_column_int64(stmt, 1);
		return index_done(stmt, *name_r == NULL ? -ENOMEM : 0);
	}
	return rc == SQLITE_DONE ? -ENOENT : index_sql_error(index, "dir name");
}

/* Put name[0..n) before *path ("a" + "b/c" -> "a/b/c"), a name of the
   way up: refused (-EINVAL) when it holds what no path component can. */
static int path_prepend(char **path, size_t *len, const char *name, size_t n)
{
	char *grown;

	if (n == 0 || memchr(name, '/', n) != NULL ||
	    memchr(name, '\r', n) != NULL || memchr(name, '\n', n) != NULL ||
	    memchr(name, '\0', n) != NULL)
		return -EINVAL;
	if ((grown = realloc(*path, n + 1 + *len + 1)) == NULL)
		return -ENOMEM;
	if (*len > 0) {
		memmove(grown + n + 1, grown, *len + 1);
		grown[n] = '/';
		*len += 1;
	} else {
		grown[n] = '\0';
	}
	memcpy(grown, name, n);
	*len += n;
	*path = grown;
	return 0;
}

/* The way up is a walk of single-row lookups (ST_NAME_OF), not one
   recursive statement: SQLite runs a recursive CTE through ephemeral
   tables, some 48,000 instructions for a delivery's "tmp/NAME" against
   some 4,000 per step (callgrind).  One read transaction holds the steps
   (the caller's, or ST_PATH_BEGIN's). */
int dbox_index_path(struct dbox_index *index, uint64_t ino, char **path_r)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_NAME_OF);
	bool own = sqlite3_get_autocommit(index->db);
	char *path = NULL;
	size_t len = 0;
	uint64_t at = ino;
	int depth, ret = 0;

	*path_r = NULL;
	if (own && (ret = index_exec_stmt(index, index_stmt(index,
			ST_PATH_BEGIN), "path")) < 0)
		return ret;
	for (depth = 0; ret == 0 && at != DBOX_ROOT_INO; depth++) {
		int rc;

		/* A cycle, or a way up longer than any tree may be. */
		if (depth > DBOX_TREE_MAX_DEPTH) {
			ret = -EIO;
			break;
		}
		sqlite3_bind_int64(stmt, 1, (sqlite3_int64)at);
		rc = sqlite3_step(stmt);
		if (rc == SQLITE_ROW) {
			ret = path_prepend(&path, &len,
					   sqlite3_column_blob(stmt, 0),
					   (size_t)sqlite3_column_bytes(stmt, 0));
			at = (uint64_t)sqlite3_column_int64(stmt, 1);
		} else if (rc == SQLITE_DONE) {
			/* No name: the root or unlinked (the first step), or
			   a lost parent (the way up is cut). */
			ret = depth == 0 ? -ENOENT : -EIO;
		} else {
			ret = index_sql_error(index, "path");
		}
		sqlite3_reset(stmt);
	}
	if (ret == 0 && path == NULL)
		ret = -ENOENT;
	if (own) {
		int end = index_exec_stmt(index, index_stmt(index, ST_PATH_END),
					  "path");

		if (ret == 0)
			ret = end;
	}
	if (ret < 0)
		free(path);
	else
		*path_r = path;
	return ret;
}

int dbox_index_name_of(struct dbox_index *index, uint64_t dir, char **name_r)
{
	return dbox_index_entry_of(index, dir, NULL, name_r);
}

int dbox_index_entry_count(struct dbox_index *index, uint64_t *count_r)
{
	sqlite3_stmt *stmt;
	int rc;

	if (sqlite3_prepare_v2(index->db, "SELECT count(*) FROM entry", -1,
			       &stmt, NULL) != SQLITE_OK)
		return index_sql_error(index, "entry count");
	rc = sqlite3_step(stmt);
	if (rc == SQLITE_ROW)
		*count_r = (uint64_t)sqlite3_column_int64(stmt, 0);
	sqlite3_finalize(stmt);
	return rc == SQLITE_ROW ? 0 : index_sql_error(index, "entry count");
}
