/*
 * index-msg.c: where messages live (message rows), the committed end of
 * each m.N (mfile rows), and crash recovery of the index.
 *
 * Invariant: for every committed message, offset + record_size <= the
 * committed end of its m.N; bytes past the committed end belong to no
 * committed message and recovery may cut them off.
 */
#include "index-private.h"

#include "storage/log.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The record of a message row from the columns file_id, offset,
   body_size, record_size, vsize, state, guid of stmt's row, from column
   first on (as ST_MSG_GET selects them). */
static void column_msgloc(sqlite3_stmt *stmt, int first,
			  struct dbox_msgloc *loc_r)
{
	const unsigned char *guid = sqlite3_column_text(stmt, first + 6);

	loc_r->file_id = (uint32_t)sqlite3_column_int64(stmt, first);
	loc_r->offset = (uint64_t)sqlite3_column_int64(stmt, first + 1);
	loc_r->body_size = (uint64_t)sqlite3_column_int64(stmt, first + 2);
	loc_r->record_size = (uint64_t)sqlite3_column_int64(stmt, first + 3);
	loc_r->vsize = (uint64_t)sqlite3_column_int64(stmt, first + 4);
	loc_r->state = (enum dbox_msg_state)sqlite3_column_int(stmt, first + 5);
	snprintf(loc_r->guid, sizeof(loc_r->guid), "%s",
		 guid != NULL ? (const char *)guid : "");
}

int dbox_index_msg_get(struct dbox_index *index, uint64_t ino,
		       struct dbox_msgloc *loc_r)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_MSG_GET);
	int rc;

	sqlite3_bind_int64(stmt, 1, ino);
	rc = sqlite3_step(stmt);
	if (rc != SQLITE_ROW)
		return rc == SQLITE_DONE ? -ENOENT : index_sql_error(index, "message");
	column_msgloc(stmt, 0, loc_r);
	return index_done(stmt, 0);
}

/* Bind ?1 ino and ?2..?8 the record of loc, as ST_MSG_SET and
   ST_MSG_FINISH both number them. */
static void bind_msgloc(sqlite3_stmt *stmt, uint64_t ino,
			const struct dbox_msgloc *loc)
{
	sqlite3_bind_int64(stmt, 1, ino);
	sqlite3_bind_int64(stmt, 2, loc->file_id);
	sqlite3_bind_int64(stmt, 3, loc->offset);
	sqlite3_bind_int64(stmt, 4, loc->body_size);
	sqlite3_bind_int64(stmt, 5, loc->record_size);
	sqlite3_bind_int64(stmt, 6, loc->vsize);
	sqlite3_bind_int(stmt, 7, loc->state);
	sqlite3_bind_text(stmt, 8, loc->guid, -1, SQLITE_STATIC);
}

int dbox_index_msg_set(struct dbox_index *index, uint64_t ino,
		       const struct dbox_msgloc *loc)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_MSG_SET);

	bind_msgloc(stmt, ino, loc);
	return index_exec_stmt(index, stmt, "message set");
}

int dbox_index_msg_finish(struct dbox_index *index, uint64_t ino,
			  const struct dbox_msgloc *loc)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_MSG_FINISH);
	int ret;

	bind_msgloc(stmt, ino, loc);
	if ((ret = index_exec_stmt(index, stmt, "message finish")) < 0)
		return ret;
	if (sqlite3_changes(index->db) == 1)
		return 0;
	/* No row of this record: a copy over an older one, or none. */
	return dbox_index_msg_set(index, ino, loc);
}

int dbox_index_msg_set_state(struct dbox_index *index, uint64_t ino,
			     enum dbox_msg_state state)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_MSG_SET_STATE);

	sqlite3_bind_int64(stmt, 1, ino);
	sqlite3_bind_int(stmt, 2, state);
	return index_exec_stmt(index, stmt, "message state");
}

int dbox_index_mfile_get(struct dbox_index *index, uint32_t file_id,
			 uint64_t *size_r)
{
	bool alt;

	return dbox_index_mfile_where(index, file_id, size_r, &alt);
}

int dbox_index_mfile_alt_first(struct dbox_index *index, uint32_t *file_id_r)
{
	sqlite3_stmt *stmt;
	int rc;

	/* Once per open of an alternate storage: not worth a prepared
	   statement of the connection's. */
	if (sqlite3_prepare_v2(index->db, "SELECT min(file_id) FROM mfile "
			       "WHERE alt != 0", -1, &stmt, NULL) != SQLITE_OK)
		return index_sql_error(index, "mfile alt");
	rc = sqlite3_step(stmt);
	if (rc == SQLITE_ROW && sqlite3_column_type(stmt, 0) != SQLITE_NULL) {
		*file_id_r = (uint32_t)sqlite3_column_int64(stmt, 0);
		sqlite3_finalize(stmt);
		return 0;
	}
	sqlite3_finalize(stmt);
	return rc == SQLITE_ROW || rc == SQLITE_DONE ? -ENOENT :
		index_sql_error(index, "mfile alt");
}

int dbox_index_mfile_where(struct dbox_index *index, uint32_t file_id,
			   uint64_t *size_r, bool *alt_r)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_MFILE_WHERE);
	int rc;

	sqlite3_bind_int64(stmt, 1, file_id);
	rc = sqlite3_step(stmt);
	if (rc == SQLITE_ROW) {
		*size_r = sqlite3_column_int64(stmt, 0);
		*alt_r = sqlite3_column_int(stmt, 1) != 0;
		return index_done(stmt, 0);
	}
	return rc == SQLITE_DONE ? -ENOENT : index_sql_error(index, "mfile");
}

/* Insert (or replace) m.<file_id>'s row: ST_MFILE_SET in the store's own
   storage/, ST_MFILE_ADD_ALT in the alternate one. */
static int mfile_put(struct dbox_index *index, enum index_stmt id,
		     uint32_t file_id, uint64_t size, const char *what)
{
	sqlite3_stmt *stmt = index_stmt(index, id);

	sqlite3_bind_int64(stmt, 1, file_id);
	sqlite3_bind_int64(stmt, 2, size);
	return index_exec_stmt(index, stmt, what);
}

int dbox_index_mfile_set(struct dbox_index *index, uint32_t file_id,
			 uint64_t size)
{
	return mfile_put(index, ST_MFILE_SET, file_id, size, "mfile set");
}

int dbox_index_mfile_add_alt(struct dbox_index *index, uint32_t file_id,
			     uint64_t size)
{
	return mfile_put(index, ST_MFILE_ADD_ALT, file_id, size, "mfile add alt");
}

int dbox_index_setting_get(struct dbox_index *index, const char *key,
			   char **value_r)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_SETTING_GET);
	int rc;

	sqlite3_bind_text(stmt, 1, key, -1, SQLITE_STATIC);
	rc = sqlite3_step(stmt);
	if (rc == SQLITE_ROW) {
		const void *v = sqlite3_column_blob(stmt, 0);
		int len = sqlite3_column_bytes(stmt, 0);
		char *value = malloc((size_t)len + 1);

		if (value == NULL)
			return index_done(stmt, -ENOMEM);
		if (len > 0)
			memcpy(value, v, (size_t)len);
		value[len] = '\0';
		*value_r = value;
		return index_done(stmt, 0);
	}
	return rc == SQLITE_DONE ? -ENOENT : index_sql_error(index, "setting");
}

int dbox_index_setting_set(struct dbox_index *index, const char *key,
			   const char *value)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_SETTING_SET);

	sqlite3_bind_text(stmt, 1, key, -1, SQLITE_STATIC);
	sqlite3_bind_blob(stmt, 2, value, (int)strlen(value), SQLITE_STATIC);
	return index_exec_stmt(index, stmt, "setting set");
}

int dbox_index_mfile_max(struct dbox_index *index, uint32_t *file_id_r)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_MFILE_MAX);

	if (sqlite3_step(stmt) != SQLITE_ROW)
		return index_sql_error(index, "mfile max");
	*file_id_r = sqlite3_column_int64(stmt, 0);
	return index_done(stmt, 0);
}

int dbox_index_mfile_list(struct dbox_index *index, dbox_mfile_cb_t *cb,
			  void *ctx)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_MFILE_LIST);
	int rc, ret;

	while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
		ret = cb(ctx, sqlite3_column_int64(stmt, 0),
			 sqlite3_column_int64(stmt, 1));
		if (ret != 0) {
			sqlite3_reset(stmt);
			return ret;
		}
	}
	return rc == SQLITE_DONE ? 0 : index_sql_error(index, "mfile list");
}

/* Recovery runs once per open, so its SQL is not worth preparing up front. */
static int exec(struct dbox_index *index, const char *sql)
{
	char *err = NULL;

	if (sqlite3_exec(index->db, sql, NULL, NULL, &err) != SQLITE_OK) {
		dbox_error("index %s: recovery: %s", index->path, err);
		sqlite3_free(err);
		return -EIO;
	}
	return 0;
}

int dbox_index_recover(struct dbox_index *index, const char *keep_prefix,
		       unsigned int *writing_r, unsigned int *orphans_r,
		       uint64_t **files_r, size_t *nfiles_r)
{
	sqlite3_stmt *stmt;
	uint64_t *files = NULL;
	size_t nfiles = 0;
	int64_t now = dbox_now_ns();
	char sql[1024];
	int ret;

	*files_r = NULL;
	*nfiles_r = 0;
	if ((ret = dbox_index_begin(index)) < 0)
		return ret;
	/* Unfinished deliveries: their names go, their directories change.
	   Not those whose empty version a close acknowledged. */
	assert(strchr(keep_prefix, '\'') == NULL);
	snprintf(sql, sizeof(sql),
		 "CREATE TEMP TABLE dead AS SELECT ino FROM message WHERE state = %d"
		 " AND NOT EXISTS (SELECT 1 FROM meta"
		 " WHERE key = '%s' || message.ino);"
		 "UPDATE inode SET mtime = %lld, ctime = %lld"
		 " WHERE ino IN (SELECT parent FROM entry WHERE ino IN dead);"
		 "DELETE FROM entry WHERE ino IN dead;",
		 DBOX_MSG_WRITING, keep_prefix, (long long)now, (long long)now);
	if ((ret = exec(index, sql)) < 0)
		goto fail;
	/* Then the inodes unlinked while open: a link count of 0 with no
	   name left.  One that still has names is a damaged count, not an
	   unlinked file (its message was deleted for it: helper-61): the
	   count is set from its names first.  When that cannot be read (a
	   damaged index: the background check will say so), nothing is
	   dropped as unlinked this time. */
	snprintf(sql, sizeof(sql),
		 "CREATE TEMP TABLE orphan AS SELECT ino FROM inode"
		 " WHERE nlink = 0 AND kind != %d AND ino NOT IN dead;",
		 DBOX_KIND_DIR);
	if ((ret = exec(index, sql)) < 0)
		goto fail;
	if (exec(index, "UPDATE inode SET nlink = (SELECT count(*) FROM entry e"
			" WHERE e.ino = inode.ino) WHERE ino IN orphan AND"
			" EXISTS (SELECT 1 FROM entry e WHERE e.ino = inode.ino);"
			"DELETE FROM orphan WHERE EXISTS"
			" (SELECT 1 FROM entry e WHERE e.ino = orphan.ino);"
			"INSERT INTO dead SELECT ino FROM orphan;") < 0)
		dbox_warning("index %s: recovery: the link counts could not "
			     "be checked against the names; no file is dropped "
			     "as unlinked this time", index->path);
	if ((ret = exec(index, "DROP TABLE orphan")) < 0)
		goto fail;
	*writing_r = 0;
	*orphans_r = 0;
	if (sqlite3_prepare_v2(index->db,
			       "SELECT d.ino, i.kind, m.state FROM dead d"
			       " JOIN inode i ON i.ino = d.ino"
			       " LEFT JOIN message m ON m.ino = d.ino",
			       -1, &stmt, NULL) != SQLITE_OK) {
		ret = index_sql_error(index, "recover");
		goto fail;
	}
	while (sqlite3_step(stmt) == SQLITE_ROW) {
		if (sqlite3_column_type(stmt, 2) != SQLITE_NULL &&
		    sqlite3_column_int(stmt, 2) == DBOX_MSG_WRITING)
			(*writing_r)++;
		else
			(*orphans_r)++;
		if (sqlite3_column_int(stmt, 1) == DBOX_KIND_FILE) {
			uint64_t *n = realloc(files, (nfiles + 1) * sizeof(*n));

			if (n == NULL) {
				ret = -ENOMEM;
				sqlite3_finalize(stmt);
				goto fail;
			}
			files = n;
			files[nfiles++] = sqlite3_column_int64(stmt, 0);
		}
	}
	sqlite3_finalize(stmt);
	if ((ret = exec(index, "DELETE FROM message WHERE ino IN dead;"
			       "DELETE FROM symlink WHERE ino IN dead;"
			       "DELETE FROM xattr WHERE ino IN dead;"
			       "DELETE FROM inode WHERE ino IN dead;"
			       "DROP TABLE dead;")) < 0)
		goto fail;
	if ((ret = dbox_index_commit(index, true)) < 0)
		goto fail_free;
	*files_r = files;
	*nfiles_r = nfiles;
	return 0;
fail:
	dbox_index_rollback(index);
	exec(index, "DROP TABLE IF EXISTS temp.dead;"
		    "DROP TABLE IF EXISTS temp.orphan");
fail_free:
	free(files);
	return ret;
}

/* One integer of the message rows of m.<file_id>: sql's single column
   (?1 the file, ?2 from, ?3 DBOX_MSG_WRITING; a parameter sql does not
   use stays unbound).  Returns 1 and *value_r,
   0 when it is NULL (no row), or -EIO (what names the query in the log). */
static int file_rows_value(struct dbox_index *index, const char *sql,
			   uint32_t file_id, uint64_t from, const char *what,
			   uint64_t *value_r)
{
	sqlite3_stmt *stmt;
	int rc, ret = 0;

	if (sqlite3_prepare_v2(index->db, sql, -1, &stmt, NULL) != SQLITE_OK)
		return index_sql_error(index, what);
	sqlite3_bind_int64(stmt, 1, file_id);
	sqlite3_bind_int64(stmt, 2, (int64_t)from);
	sqlite3_bind_int(stmt, 3, DBOX_MSG_WRITING);
	rc = sqlite3_step(stmt);
	if (rc == SQLITE_ROW && sqlite3_column_type(stmt, 0) != SQLITE_NULL) {
		*value_r = (uint64_t)sqlite3_column_int64(stmt, 0);
		ret = 1;
	} else if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
		ret = index_sql_error(index, what);
	}
	sqlite3_finalize(stmt);
	return ret;
}

int dbox_index_msg_rows(struct dbox_index *index, dbox_msg_row_cb_t *cb,
			void *ctx)
{
	sqlite3_stmt *stmt;
	int rc = SQLITE_DONE, ret = 0;

	if (sqlite3_prepare_v2(index->db, "SELECT ino, file_id, offset,"
			       " body_size, record_size, vsize, state, guid"
			       " FROM message", -1, &stmt, NULL) != SQLITE_OK)
		return index_sql_error(index, "message rows");
	while (ret == 0 && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
		struct dbox_msgloc loc;

		column_msgloc(stmt, 1, &loc);
		ret = cb(ctx, (uint64_t)sqlite3_column_int64(stmt, 0), &loc);
	}
	if (ret == 0 && rc != SQLITE_DONE)
		ret = index_sql_error(index, "message rows");
	sqlite3_finalize(stmt);
	return ret;
}

int dbox_index_alt_first_msg(struct dbox_index *index,
			     struct dbox_msgloc *loc_r)
{
	sqlite3_stmt *stmt;
	int rc;

	if (sqlite3_prepare_v2(index->db, "SELECT m.file_id, m.offset,"
			       " m.body_size, m.record_size, m.vsize, m.state,"
			       " m.guid FROM message m JOIN mfile f"
			       " ON f.file_id = m.file_id WHERE f.alt <> 0"
			       " AND m.state = ?1 ORDER BY m.file_id, m.offset"
			       " LIMIT 1", -1, &stmt, NULL) != SQLITE_OK)
		return index_sql_error(index, "first message");
	sqlite3_bind_int(stmt, 1, DBOX_MSG_COMMITTED);
	rc = sqlite3_step(stmt);
	if (rc == SQLITE_ROW)
		column_msgloc(stmt, 0, loc_r);
	sqlite3_finalize(stmt);
	if (rc == SQLITE_ROW)
		return 1;
	return rc == SQLITE_DONE ? 0 : index_sql_error(index, "first message");
}

int dbox_index_writing_offset(struct dbox_index *index, uint32_t file_id,
			      uint64_t from, uint64_t *offset_r)
{
	return file_rows_value(index, "SELECT min(offset) FROM message"
			       " WHERE file_id = ?1 AND offset >= ?2 AND"
			       " state = ?3", file_id, from, "writing",
			       offset_r);
}

int dbox_index_mfile_rows_end(struct dbox_index *index, uint32_t file_id,
			      uint64_t *end_r)
{
	int ret;

	*end_r = 0;
	ret = file_rows_value(index, "SELECT max(offset + record_size)"
			      " FROM message WHERE file_id = ?1"
			      " AND state != ?3", file_id, 0, "rows end", end_r);
	return ret < 0 ? ret : 0;
}

int dbox_index_meta_delete(struct dbox_index *index, const char *key)
{
	sqlite3_stmt *stmt;
	int rc;

	if (sqlite3_prepare_v2(index->db, "DELETE FROM meta WHERE key = ?1",
			       -1, &stmt, NULL) != SQLITE_OK)
		return index_sql_error(index, "meta");
	index_autocommit_point(index, stmt);
	sqlite3_bind_text(stmt, 1, key, -1, SQLITE_STATIC);
	rc = sqlite3_step(stmt);
	sqlite3_finalize(stmt);
	return rc == SQLITE_DONE ? 0 : index_sql_error(index, "meta");
}

int dbox_index_meta_list(struct dbox_index *index, const char *prefix,
			 dbox_meta_cb_t *cb, void *ctx)
{
	sqlite3_stmt *stmt;
	int rc, ret = 0;

	if (sqlite3_prepare_v2(index->db, "SELECT key, value FROM meta WHERE"
			       " substr(key, 1, length(?1)) = ?1", -1, &stmt,
			       NULL) != SQLITE_OK)
		return index_sql_error(index, "meta");
	index_autocommit_point(index, stmt);
	sqlite3_bind_text(stmt, 1, prefix, -1, SQLITE_STATIC);
	while (ret == 0 && (rc = sqlite3_step(stmt)) == SQLITE_ROW)
		ret = cb(ctx, (const char *)sqlite3_column_text(stmt, 0),
			 sqlite3_column_int64(stmt, 1));
	if (ret == 0 && rc != SQLITE_DONE)
		ret = index_sql_error(index, "meta");
	sqlite3_finalize(stmt);
	return ret;
}

int dbox_index_meta_delete_prefix(struct dbox_index *index, const char *prefix)
{
	sqlite3_stmt *stmt;
	int rc;

	if (sqlite3_prepare_v2(index->db, "DELETE FROM meta WHERE"
			       " substr(key, 1, length(?1)) = ?1", -1, &stmt,
			       NULL) != SQLITE_OK)
		return index_sql_error(index, "meta");
	sqlite3_bind_text(stmt, 1, prefix, -1, SQLITE_STATIC);
	rc = sqlite3_step(stmt);
	sqlite3_finalize(stmt);
	return rc == SQLITE_DONE ? 0 : index_sql_error(index, "meta");
}
