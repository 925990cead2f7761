/*
 * index-rebuild.c: salvaging rows from an old index and writing a new one
 * with given inode numbers (see index-rebuild.h), for dboxadm rebuild.
 *
 * The salvage never trusts the old file: every row is checked (kinds,
 * names) before it is kept, a damaged page ends a scan only where SQLite
 * cannot find rows after it, and the connection is opened so that
 * closing it never checkpoints the WAL into the old file.
 *
 * Runs once per rebuild, so SQL is prepared at call time.
 */
#include "index-private.h"
#include "reserve.h"
#include "index-rebuild.h"

#include "storage/grow.h"
#include "storage/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Row ranges tried after a damaged page: rowid + 2^k for k below this. */
#define SKIP_PROBES 48

struct salvage_ctx {
	sqlite3 *db;
	const char *path;
	struct dbox_salvage *s;
	size_t inodes_size, entries_size, msgs_size, mfiles_size, symlinks_size;
	struct { uint64_t ino, rdev; } *rdevs; /* special files' rdev */
	size_t nrdevs, rdevs_size;
};

static bool valid_name(const void *name, size_t len)
{
	return len > 0 && len <= DBOX_NAME_MAX &&
		memchr(name, '/', len) == NULL && memchr(name, '\0', len) == NULL &&
		!(len == 1 && memcmp(name, ".", 1) == 0) &&
		!(len == 2 && memcmp(name, "..", 2) == 0);
}

typedef int row_cb_t(struct salvage_ctx *ctx, sqlite3_stmt *stmt);

static int inode_row(struct salvage_ctx *ctx, sqlite3_stmt *stmt)
{
	struct dbox_salvage *s = ctx->s;
	struct dbox_attr attr;
	struct dbox_attr *v;

	memset(&attr, 0, sizeof(attr));
	index_row_attr(stmt, 0, &attr);
	if (attr.kind != DBOX_KIND_DIR && attr.kind != DBOX_KIND_MESSAGE &&
	    attr.kind != DBOX_KIND_FILE && attr.kind != DBOX_KIND_SYMLINK &&
	    attr.kind != DBOX_KIND_SPECIAL)
		return 0;
	/* rdev comes from rdev_row (a format 1 index has no such column);
	   atime is read as index_row_attr reads it (NULL: the mtime). */
	attr.rdev = 0;
	if ((v = dbox_grow(s->inodes, s->ninodes, &ctx->inodes_size,
		      sizeof(*v))) == NULL)
		return -ENOMEM;
	s->inodes = v;
	s->inodes[s->ninodes++] = attr;
	return 0;
}

static int entry_row(struct salvage_ctx *ctx, sqlite3_stmt *stmt)
{
	struct dbox_salvage *s = ctx->s;
	struct dbox_salvage_entry *v, *e;
	const void *name = sqlite3_column_blob(stmt, 3);
	size_t len = (size_t)sqlite3_column_bytes(stmt, 3);

	if (!valid_name(name, len)) {
		dbox_warning("old index %s: entry %lld has an invalid name; "
			     "dropped", ctx->path,
			     (long long)sqlite3_column_int64(stmt, 0));
		return 0;
	}
	if ((v = dbox_grow(s->entries, s->nentries, &ctx->entries_size,
		      sizeof(*v))) == NULL)
		return -ENOMEM;
	s->entries = v;
	e = &s->entries[s->nentries];
	e->id = (uint64_t)sqlite3_column_int64(stmt, 0);
	e->parent = (uint64_t)sqlite3_column_int64(stmt, 1);
	e->ino = (uint64_t)sqlite3_column_int64(stmt, 2);
	e->namelen = len;
	if ((e->name = malloc(len)) == NULL)
		return -ENOMEM;
	memcpy(e->name, name, len);
	s->nentries++;
	return 0;
}

static int symlink_row(struct salvage_ctx *ctx, sqlite3_stmt *stmt)
{
	struct dbox_salvage *s = ctx->s;
	struct dbox_salvage_symlink *v;
	const void *target = sqlite3_column_blob(stmt, 1);
	size_t len = (size_t)sqlite3_column_bytes(stmt, 1);

	if (len == 0 || len >= 4096 || memchr(target, '\0', len) != NULL)
		return 0; /* not a target symlink(2) could have made */
	if ((v = dbox_grow(s->symlinks, s->nsymlinks, &ctx->symlinks_size,
		      sizeof(*v))) == NULL)
		return -ENOMEM;
	s->symlinks = v;
	v = &s->symlinks[s->nsymlinks];
	v->ino = (uint64_t)sqlite3_column_int64(stmt, 0);
	if ((v->target = strndup(target, len)) == NULL)
		return -ENOMEM;
	s->nsymlinks++;
	return 0;
}

/* The xattr table has no rowid (WITHOUT ROWID): read in one pass; a
   damaged table keeps what was read before the damage. */
static int read_xattrs(struct salvage_ctx *ctx)
{
	struct dbox_salvage *s = ctx->s;
	size_t size = 0;
	sqlite3_stmt *stmt;
	int rc;

	if (sqlite3_prepare_v2(ctx->db, "SELECT ino, name, value FROM xattr"
			       " ORDER BY ino, name", -1, &stmt, NULL) != SQLITE_OK) {
		dbox_warning("old index %s: table xattr unreadable: %s",
			     ctx->path, sqlite3_errmsg(ctx->db));
		s->read_errors++;
		return 0;
	}
	while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
		const void *name = sqlite3_column_blob(stmt, 1);
		size_t nlen = (size_t)sqlite3_column_bytes(stmt, 1);
		size_t vlen = (size_t)sqlite3_column_bytes(stmt, 2);
		struct dbox_salvage_xattr *v;

		if (nlen == 0 || nlen > DBOX_XATTR_NAME_MAX ||
		    memchr(name, '\0', nlen) != NULL || vlen > DBOX_XATTR_SIZE_MAX)
			continue;
		if ((v = dbox_grow(s->xattrs, s->nxattrs, &size, sizeof(*v))) == NULL)
			goto nomem;
		s->xattrs = v;
		v = &s->xattrs[s->nxattrs];
		memset(v, 0, sizeof(*v));
		v->ino = (uint64_t)sqlite3_column_int64(stmt, 0);
		if ((v->name = strndup(name, nlen)) == NULL ||
		    (vlen > 0 && (v->value = malloc(vlen)) == NULL)) {
			free(v->name);
			goto nomem;
		}
		if (vlen > 0)
			memcpy(v->value, sqlite3_column_blob(stmt, 2), vlen);
		v->len = vlen;
		s->nxattrs++;
	}
	if (rc != SQLITE_DONE) {
		dbox_warning("old index %s: table xattr damaged: %s", ctx->path,
			     sqlite3_errmsg(ctx->db));
		s->read_errors++;
	}
	sqlite3_finalize(stmt);
	return 0;
nomem:
	sqlite3_finalize(stmt);
	return -ENOMEM;
}

static int rdev_row(struct salvage_ctx *ctx, sqlite3_stmt *stmt)
{
	void *v;

	if (sqlite3_column_int64(stmt, 1) == 0)
		return 0;
	if ((v = dbox_grow(ctx->rdevs, ctx->nrdevs, &ctx->rdevs_size,
		      sizeof(*ctx->rdevs))) == NULL)
		return -ENOMEM;
	ctx->rdevs = v;
	ctx->rdevs[ctx->nrdevs].ino = (uint64_t)sqlite3_column_int64(stmt, 0);
	ctx->rdevs[ctx->nrdevs].rdev = (uint64_t)sqlite3_column_int64(stmt, 1);
	ctx->nrdevs++;
	return 0;
}

static int msg_row(struct salvage_ctx *ctx, sqlite3_stmt *stmt)
{
	struct dbox_salvage *s = ctx->s;
	struct dbox_salvage_msg *v, *m;
	const unsigned char *guid = sqlite3_column_text(stmt, 4);

	if ((v = dbox_grow(s->msgs, s->nmsgs, &ctx->msgs_size, sizeof(*v))) == NULL)
		return -ENOMEM;
	s->msgs = v;
	m = &s->msgs[s->nmsgs++];
	m->ino = (uint64_t)sqlite3_column_int64(stmt, 0);
	m->file_id = (uint32_t)sqlite3_column_int64(stmt, 1);
	m->offset = (uint64_t)sqlite3_column_int64(stmt, 2);
	m->state = sqlite3_column_int(stmt, 3);
	snprintf(m->guid, sizeof(m->guid), "%s",
		 guid != NULL ? (const char *)guid : "");
	m->body_size = (uint64_t)sqlite3_column_int64(stmt, 5);
	m->record_size = (uint64_t)sqlite3_column_int64(stmt, 6);
	m->vsize = (uint64_t)sqlite3_column_int64(stmt, 7);
	return 0;
}

static int mfile_row(struct salvage_ctx *ctx, sqlite3_stmt *stmt)
{
	struct dbox_salvage *s = ctx->s;
	struct dbox_salvage_mfile *v;

	if ((v = dbox_grow(s->mfiles, s->nmfiles, &ctx->mfiles_size,
		      sizeof(*v))) == NULL)
		return -ENOMEM;
	s->mfiles = v;
	v[s->nmfiles].file_id = (uint32_t)sqlite3_column_int64(stmt, 0);
	v[s->nmfiles].size = (uint64_t)sqlite3_column_int64(stmt, 1);
	s->nmfiles++;
	return 0;
}

/* The first rowid >= probe in table, as a step result: SQLITE_ROW with
   *rowid_r, SQLITE_DONE (none), or an error. */
static int probe_rowid(sqlite3 *db, const char *table, int64_t probe,
		       int64_t *rowid_r)
{
	char sql[128];
	sqlite3_stmt *stmt;
	int rc;

	snprintf(sql, sizeof(sql), "SELECT rowid FROM %s WHERE rowid >= ?1"
		 " ORDER BY rowid LIMIT 1", table);
	if (sqlite3_prepare_v2(db, sql, -1, &stmt, NULL) != SQLITE_OK)
		return SQLITE_ERROR;
	sqlite3_bind_int64(stmt, 1, probe);
	rc = sqlite3_step(stmt);
	if (rc == SQLITE_ROW)
		*rowid_r = sqlite3_column_int64(stmt, 0);
	sqlite3_finalize(stmt);
	return rc;
}

/* Read table (columns cols, rowid first) row by row into the salvage.
   Returns 0 (also after damage: what could be read was read) or
   -ENOMEM. */
static int read_table(struct salvage_ctx *ctx, const char *table,
		      const char *cols, row_cb_t *row)
{
	char sql[512];
	sqlite3_stmt *stmt;
	int64_t after = 0, failed_after = -1;
	bool stuck;
	int rc, ret;

	snprintf(sql, sizeof(sql), "SELECT %s FROM %s WHERE rowid > ?1"
		 " ORDER BY rowid", cols, table);
	for (;;) {
		if (sqlite3_prepare_v2(ctx->db, sql, -1, &stmt, NULL) != SQLITE_OK) {
			dbox_warning("old index %s: table %s unreadable: %s",
				     ctx->path, table, sqlite3_errmsg(ctx->db));
			ctx->s->read_errors++;
			return 0;
		}
		sqlite3_bind_int64(stmt, 1, after);
		while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
			after = sqlite3_column_int64(stmt, 0);
			if ((ret = row(ctx, stmt)) < 0) {
				sqlite3_finalize(stmt);
				return ret;
			}
		}
		sqlite3_finalize(stmt);
		if (rc == SQLITE_DONE)
			return 0;
		dbox_warning("old index %s: table %s damaged after row %lld: %s",
			     ctx->path, table, (long long)after,
			     sqlite3_errmsg(ctx->db));
		ctx->s->read_errors++;
		/* Find a later row SQLite can still reach.  Failing again
		   where the last try failed (stuck), the next row is one the
		   probe reaches but whose columns cannot be read: skip it, so
		   that every round moves on (it looped for ever). */
		stuck = after == failed_after;
		failed_after = after;
		rc = SQLITE_ERROR;
		for (int k = 0; k < SKIP_PROBES && rc != SQLITE_ROW &&
			     rc != SQLITE_DONE; k++) {
			int64_t next;

			rc = probe_rowid(ctx->db, table, after + ((int64_t)1 << k),
					 &next);
			if (rc == SQLITE_ROW)
				after = stuck ? next : next - 1;
		}
		if (rc != SQLITE_ROW)
			return 0;
	}
}

static int inode_cmp(const void *a, const void *b)
{
	uint64_t x = ((const struct dbox_attr *)a)->ino,
		 y = ((const struct dbox_attr *)b)->ino;

	return x < y ? -1 : x > y;
}

static int entry_cmp(const void *a, const void *b)
{
	const struct dbox_salvage_entry *x = a, *y = b;

	if (x->parent != y->parent)
		return x->parent < y->parent ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

static int symlink_cmp(const void *a, const void *b)
{
	uint64_t x = ((const struct dbox_salvage_symlink *)a)->ino,
		 y = ((const struct dbox_salvage_symlink *)b)->ino;

	return x < y ? -1 : x > y;
}

const char *dbox_salvage_symlink_target(const struct dbox_salvage *s,
					uint64_t ino)
{
	struct dbox_salvage_symlink key = { .ino = ino }, *found;

	found = s->nsymlinks == 0 ? NULL :
		bsearch(&key, s->symlinks, s->nsymlinks, sizeof(key), symlink_cmp);
	return found != NULL ? found->target : NULL;
}

/* Does the old index have table (format 2 added symlink and xattr)? */
static bool has_table(sqlite3 *db, const char *table)
{
	sqlite3_stmt *stmt;
	bool found = false;

	if (sqlite3_prepare_v2(db, "SELECT 1 FROM sqlite_master WHERE"
			       " type = 'table' AND name = ?1", -1, &stmt,
			       NULL) != SQLITE_OK)
		return false;
	sqlite3_bind_text(stmt, 1, table, -1, SQLITE_STATIC);
	found = sqlite3_step(stmt) == SQLITE_ROW;
	sqlite3_finalize(stmt);
	return found;
}

static int msg_cmp(const void *a, const void *b)
{
	uint64_t x = ((const struct dbox_salvage_msg *)a)->ino,
		 y = ((const struct dbox_salvage_msg *)b)->ino;

	return x < y ? -1 : x > y;
}

/* SQLite's quick check; true when it says "ok". */
static bool quick_check_ok(sqlite3 *db)
{
	sqlite3_stmt *stmt;
	bool ok = false;

	if (sqlite3_prepare_v2(db, "PRAGMA quick_check", -1, &stmt, NULL) !=
	    SQLITE_OK)
		return false;
	if (sqlite3_step(stmt) == SQLITE_ROW) {
		const char *line = (const char *)sqlite3_column_text(stmt, 0);

		ok = line != NULL && strcmp(line, "ok") == 0;
	}
	sqlite3_finalize(stmt);
	return ok;
}

int dbox_index_salvage(const char *path, const struct dbox_salvage_keys *keys,
		       struct dbox_salvage **salvage_r)
{
	struct salvage_ctx ctx = { .path = path };
	sqlite3_stmt *stmt;
	bool has_atime = false;
	int on = 1, ret = 0;

	char *aux[2] = { NULL, NULL }, *real = NULL;
	bool aux_existed[2] = { false, false };

	ctx.s = calloc(1, sizeof(*ctx.s));
	if (ctx.s == NULL)
		return -ENOMEM;
	*salvage_r = ctx.s;
	for (int i = 0; i < 2; i++) {
		if (asprintf(&aux[i], "%s%s", path, i == 0 ? "-wal" : "-shm") < 0)
			aux[i] = NULL;
		aux_existed[i] = aux[i] == NULL || access(aux[i], F_OK) == 0;
	}
	/* Through the index's VFS: the old index may come with a planted
	   rollback journal, whose rollback must not delete what it names
	   (reserve.c). */
	real = index_dir_real(path);
	if (real == NULL ||
	    sqlite3_open_v2(real, &ctx.db, SQLITE_OPEN_READWRITE |
			    SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_NOFOLLOW,
			    dbox_reserve_vfs()) != SQLITE_OK) {
		dbox_warning("old index %s: cannot open: %s", path,
			     ctx.db != NULL ? sqlite3_errmsg(ctx.db) : "no memory");
		goto out;
	}
	sqlite3_db_config(ctx.db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, &on);
	sqlite3_busy_timeout(ctx.db, 5000);
	/* The old index may be hostile (a rebuild is the remedy for one):
	   a table replaced by an endless view would hang the salvage. */
	if (index_guard(ctx.db) < 0) {
		dbox_warning("old index %s: cannot switch its triggers and "
			     "views off; not read", path);
		ctx.s->read_errors++;
		goto out;
	}
	if (sqlite3_prepare_v2(ctx.db, "SELECT value FROM meta WHERE key ="
			       " 'uidvalidity'", -1, &stmt, NULL) == SQLITE_OK) {
		ctx.s->opened = true;
		if (sqlite3_step(stmt) == SQLITE_ROW)
			ctx.s->uidvalidity = sqlite3_column_int64(stmt, 0);
		sqlite3_finalize(stmt);
		if (keys != NULL && keys->count_prefix != NULL &&
		    sqlite3_prepare_v2(ctx.db, "SELECT count(*) FROM meta WHERE"
				       " substr(key, 1, length(?1)) = ?1", -1,
				       &stmt, NULL) == SQLITE_OK) {
			sqlite3_bind_text(stmt, 1, keys->count_prefix, -1,
					  SQLITE_STATIC);
			if (sqlite3_step(stmt) == SQLITE_ROW)
				ctx.s->prefixed = (uint64_t)
					sqlite3_column_int64(stmt, 0);
			sqlite3_finalize(stmt);
		}
		if (keys != NULL && keys->value_key != NULL &&
		    sqlite3_prepare_v2(ctx.db, "SELECT value FROM meta WHERE"
				       " key = ?1", -1, &stmt,
				       NULL) == SQLITE_OK) {
			sqlite3_bind_text(stmt, 1, keys->value_key, -1,
					  SQLITE_STATIC);
			if (sqlite3_step(stmt) == SQLITE_ROW)
				ctx.s->value = sqlite3_column_int64(stmt, 0);
			sqlite3_finalize(stmt);
		}
	} else {
		dbox_warning("old index %s: not readable as an index: %s", path,
			     sqlite3_errmsg(ctx.db));
		ctx.s->read_errors++;
	}
	/* atime came with format 2: an older index has none (NULL reads
	   as mtime, as in a format 2 index). */
	if (ctx.s->opened &&
	    sqlite3_prepare_v2(ctx.db, "SELECT atime FROM inode LIMIT 0", -1,
			       &stmt, NULL) == SQLITE_OK) {
		has_atime = true;
		sqlite3_finalize(stmt);
	}
	if (ctx.s->opened &&
	    ((ret = read_table(&ctx, "inode", has_atime ?
			       "ino, kind, mode, uid, gid, nlink, size, mtime,"
			       " ctime, coalesce(atime, mtime), 0, 0" :
			       "ino, kind, mode, uid, gid, nlink, size, mtime,"
			       " ctime, mtime, 0, 0", inode_row)) < 0 ||
	     (ret = read_table(&ctx, "entry", "id, parent, ino, name",
			       entry_row)) < 0 ||
	     (ret = read_table(&ctx, "message", "ino, file_id, offset, state,"
			       " guid, body_size, record_size, vsize",
			       msg_row)) < 0 ||
	     (ret = read_table(&ctx, "mfile", "file_id, size", mfile_row)) < 0))
		goto out;
	/* Format 2: symlink targets and device numbers. */
	if (ctx.s->opened && has_table(ctx.db, "symlink") &&
	    ((ret = read_table(&ctx, "symlink", "ino, target", symlink_row)) < 0 ||
	     (ret = read_table(&ctx, "inode", "ino, rdev", rdev_row)) < 0 ||
	     (ret = read_xattrs(&ctx)) < 0))
		goto out;
	ctx.s->complete = ctx.s->opened && ctx.s->read_errors == 0 &&
		quick_check_ok(ctx.db);
	if (ctx.s->ninodes > 1)
		qsort(ctx.s->inodes, ctx.s->ninodes, sizeof(*ctx.s->inodes),
		      inode_cmp);
	if (ctx.s->nentries > 1)
		qsort(ctx.s->entries, ctx.s->nentries, sizeof(*ctx.s->entries),
		      entry_cmp);
	if (ctx.s->nmsgs > 1)
		qsort(ctx.s->msgs, ctx.s->nmsgs, sizeof(*ctx.s->msgs), msg_cmp);
	if (ctx.s->nsymlinks > 1)
		qsort(ctx.s->symlinks, ctx.s->nsymlinks, sizeof(*ctx.s->symlinks),
		      symlink_cmp);
	for (size_t i = 0; i < ctx.nrdevs; i++) {
		struct dbox_attr key = { .ino = ctx.rdevs[i].ino }, *a;

		a = bsearch(&key, ctx.s->inodes, ctx.s->ninodes,
			    sizeof(key), inode_cmp);
		if (a != NULL && a->kind == DBOX_KIND_SPECIAL)
			a->rdev = ctx.rdevs[i].rdev;
	}
out:
	free(ctx.rdevs);
	free(real);
	sqlite3_close(ctx.db);
	/* Reading a WAL-mode file made its -wal and -shm: leave the old
	   index as it was found. */
	for (int i = 0; i < 2; i++) {
		if (aux[i] != NULL && !aux_existed[i])
			unlink(aux[i]);
		free(aux[i]);
	}
	if (ret < 0)
		dbox_index_salvage_free(salvage_r);
	return ret;
}

void dbox_index_salvage_free(struct dbox_salvage **salvage)
{
	struct dbox_salvage *s = *salvage;

	if (s == NULL)
		return;
	*salvage = NULL;
	for (size_t i = 0; i < s->nentries; i++)
		free(s->entries[i].name);
	free(s->entries);
	for (size_t i = 0; i < s->nsymlinks; i++)
		free(s->symlinks[i].target);
	free(s->symlinks);
	for (size_t i = 0; i < s->nxattrs; i++) {
		free(s->xattrs[i].name);
		free(s->xattrs[i].value);
	}
	free(s->xattrs);
	free(s->inodes);
	free(s->msgs);
	free(s->mfiles);
	free(s);
}

/* Prepare sql into *stmt_r (the caller binds, steps, finalizes). */
static int prepare(struct dbox_index *index, const char *sql,
		    sqlite3_stmt **stmt_r)
{
	if (sqlite3_prepare_v2(index->db, sql, -1, stmt_r, NULL) != SQLITE_OK) {
		*stmt_r = NULL;
		return SQLITE_ERROR;
	}
	return SQLITE_OK;
}

int dbox_index_rebuild_inode(struct dbox_index *index,
			     const struct dbox_attr *attr)
{
	sqlite3_stmt *stmt;
	int rc;

	if (prepare(index, attr->ino == DBOX_ROOT_INO ?
		     "UPDATE inode SET kind = ?2, mode = ?3, uid = ?4, gid = ?5,"
		     " nlink = ?6, size = ?7, mtime = ?8, ctime = ?9, atime = ?10"
		     " WHERE ino = ?1" :
		     "INSERT INTO inode (ino, kind, mode, uid, gid, nlink, size,"
		     " mtime, ctime, atime)"
		     " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
		     &stmt) != SQLITE_OK)
		return index_sql_error(index, "rebuild inode");
	index_bind_attr(stmt, attr);
	rc = sqlite3_step(stmt);
	sqlite3_finalize(stmt);
	if (rc == SQLITE_CONSTRAINT_PRIMARYKEY || rc == SQLITE_CONSTRAINT)
		return -EEXIST;
	return rc == SQLITE_DONE ? 0 : index_sql_error(index, "rebuild inode");
}

int dbox_index_rebuild_entry(struct dbox_index *index, uint64_t parent,
			     const char *name, size_t namelen, uint64_t ino)
{
	sqlite3_stmt *stmt;
	int rc;

	if (namelen > DBOX_NAME_MAX)
		return -ENAMETOOLONG;
	if (!valid_name(name, namelen))
		return -EINVAL;
	if (prepare(index, "INSERT INTO entry (parent, name, ino)"
		     " VALUES (?1, ?2, ?3)", &stmt) != SQLITE_OK)
		return index_sql_error(index, "rebuild entry");
	sqlite3_bind_int64(stmt, 1, (int64_t)parent);
	sqlite3_bind_blob(stmt, 2, name, (int)namelen, SQLITE_STATIC);
	sqlite3_bind_int64(stmt, 3, (int64_t)ino);
	rc = sqlite3_step(stmt);
	sqlite3_finalize(stmt);
	if (rc == SQLITE_CONSTRAINT_UNIQUE)
		return -EEXIST;
	return rc == SQLITE_DONE ? 0 : index_sql_error(index, "rebuild entry");
}

int dbox_index_reserve_ino(struct dbox_index *index, uint64_t ino)
{
	sqlite3_stmt *stmt;
	int rc;

	if (prepare(index, "UPDATE sqlite_sequence SET seq = max(seq, ?1)"
		    " WHERE name = 'inode'", &stmt) != SQLITE_OK)
		return index_sql_error(index, "reserve inode");
	sqlite3_bind_int64(stmt, 1, (int64_t)ino);
	rc = sqlite3_step(stmt);
	sqlite3_finalize(stmt);
	if (rc == SQLITE_DONE && sqlite3_changes(index->db) == 0) {
		if (prepare(index, "INSERT INTO sqlite_sequence (name, seq)"
			    " VALUES ('inode', ?1)", &stmt) != SQLITE_OK)
			return index_sql_error(index, "reserve inode");
		sqlite3_bind_int64(stmt, 1, (int64_t)ino);
		rc = sqlite3_step(stmt);
		sqlite3_finalize(stmt);
	}
	return rc == SQLITE_DONE ? 0 : index_sql_error(index, "reserve inode");
}

int dbox_index_rebuild_nlinks(struct dbox_index *index)
{
	char sql[512];

	snprintf(sql, sizeof(sql),
		 "UPDATE inode SET nlink = (SELECT count(*) FROM entry e"
		 " WHERE e.ino = inode.ino) WHERE kind != %d;"
		 "UPDATE inode SET nlink = 2 + (SELECT count(*) FROM entry e"
		 " JOIN inode c ON c.ino = e.ino WHERE e.parent = inode.ino"
		 " AND c.kind = %d) WHERE kind = %d;",
		 DBOX_KIND_DIR, DBOX_KIND_DIR, DBOX_KIND_DIR);
	return index_exec_sql(index, DBOX_LOG_ERROR, "link counts", sql);
}
