/*
 * index-purge.c: per-file record lists and usage, moving message rows,
 * dropping mfile rows, meta counters (see index-purge.h).
 *
 * Purge runs rarely and in the background, so its SQL is prepared here
 * per call (as index-stats.c does), not with the hot-path statements of
 * index.c.  Invariant kept by dbox_index_msg_move: a row is moved only
 * from the exact record that was copied; anything else that happened to
 * it meanwhile wins.
 */
#include "index-private.h"
#include "index-purge.h"

#include "storage/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int prepare(struct dbox_index *index, const char *sql,
		   sqlite3_stmt **stmt_r)
{
	if (sqlite3_prepare_v2(index->db, sql, -1, stmt_r, NULL) != SQLITE_OK)
		return index_sql_error(index, sql);
	index_autocommit_point(index, *stmt_r);
	return 0;
}

int dbox_index_misplaced_row(struct dbox_index *index, uint64_t *ino_r,
			     uint64_t *file_id_r)
{
	sqlite3_stmt *stmt;
	int rc, ret;

	if ((ret = prepare(index,
			   "SELECT m.ino, m.file_id FROM message m"
			   " LEFT JOIN mfile f ON f.file_id = m.file_id"
			   " WHERE m.state = ?1 AND (f.file_id IS NULL"
			   " OR m.offset < 0 OR m.record_size < 0"
			   " OR m.offset + m.record_size > f.size) LIMIT 1",
			   &stmt)) < 0)
		return ret;
	sqlite3_bind_int(stmt, 1, DBOX_MSG_COMMITTED);
	rc = sqlite3_step(stmt);
	if (rc == SQLITE_ROW) {
		*ino_r = (uint64_t)sqlite3_column_int64(stmt, 0);
		*file_id_r = (uint64_t)sqlite3_column_int64(stmt, 1);
		ret = 1;
	} else if (rc == SQLITE_DONE) {
		ret = 0;
	} else {
		ret = index_sql_error(index, "misplaced rows");
	}
	sqlite3_finalize(stmt);
	return ret;
}

int dbox_index_file_records(struct dbox_index *index, uint32_t file_id,
			    struct dbox_file_rec **recs_r, size_t *count_r)
{
	struct dbox_file_rec *recs = NULL, *grown;
	size_t count = 0, size = 0;
	sqlite3_stmt *stmt;
	int rc, ret;

	*recs_r = NULL;
	*count_r = 0;
	if ((ret = prepare(index,
			   "SELECT m.ino, m.offset, m.body_size, m.record_size,"
			   " coalesce(i.mtime, 0), m.state, m.guid FROM message m"
			   " LEFT JOIN inode i ON i.ino = m.ino"
			   " WHERE m.file_id = ?1 ORDER BY m.offset", &stmt)) < 0)
		return ret;
	sqlite3_bind_int64(stmt, 1, file_id);
	while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
		if (count == size) {
			size = size == 0 ? 256 : size * 2;
			if ((grown = realloc(recs, size * sizeof(*recs))) == NULL) {
				ret = -ENOMEM;
				break;
			}
			recs = grown;
		}
		recs[count].ino = sqlite3_column_int64(stmt, 0);
		recs[count].offset = sqlite3_column_int64(stmt, 1);
		recs[count].body_size = sqlite3_column_int64(stmt, 2);
		recs[count].record_size = sqlite3_column_int64(stmt, 3);
		recs[count].mtime_ns = sqlite3_column_int64(stmt, 4);
		recs[count].state = sqlite3_column_int(stmt, 5);
		snprintf(recs[count].guid, sizeof(recs[count].guid), "%s",
			 sqlite3_column_text(stmt, 6) != NULL ?
			 (const char *)sqlite3_column_text(stmt, 6) : "");
		count++;
	}
	if (ret == 0 && rc != SQLITE_DONE)
		ret = index_sql_error(index, "file records");
	sqlite3_finalize(stmt);
	if (ret < 0) {
		free(recs);
		return ret;
	}
	*recs_r = recs;
	*count_r = count;
	return 0;
}

int dbox_index_file_usage(struct dbox_index *index, uint32_t file_id,
			  struct dbox_file_usage *usage_r)
{
	char sql[256];
	sqlite3_stmt *stmt;
	int rc, ret;

	memset(usage_r, 0, sizeof(*usage_r));
	usage_r->file_id = file_id;
	if ((ret = dbox_index_mfile_get(index, file_id,
					&usage_r->committed)) < 0)
		return ret;
	snprintf(sql, sizeof(sql),
		 "SELECT count(*), coalesce(sum(record_size), 0),"
		 " coalesce(sum(state = %d), 0) FROM message WHERE file_id = ?1",
		 DBOX_MSG_WRITING);
	if ((ret = prepare(index, sql, &stmt)) < 0)
		return ret;
	sqlite3_bind_int64(stmt, 1, file_id);
	rc = sqlite3_step(stmt);
	if (rc == SQLITE_ROW) {
		usage_r->records = sqlite3_column_int64(stmt, 0);
		usage_r->live_bytes = sqlite3_column_int64(stmt, 1);
		usage_r->writing = sqlite3_column_int64(stmt, 2);
	} else {
		ret = index_sql_error(index, "file usage");
	}
	sqlite3_finalize(stmt);
	return ret;
}

int dbox_index_file_usage_all(struct dbox_index *index,
			      dbox_file_usage_cb_t *cb, void *ctx)
{
	struct dbox_file_usage *rows = NULL, *grown;
	size_t count = 0, size = 0;
	sqlite3_stmt *stmt;
	char sql[512];
	int rc, ret;

	snprintf(sql, sizeof(sql),
		 "SELECT f.file_id, f.size, coalesce(u.n, 0), coalesce(u.bytes, 0),"
		 " coalesce(u.writing, 0) FROM mfile f LEFT JOIN"
		 " (SELECT file_id, count(*) AS n, sum(record_size) AS bytes,"
		 "  sum(state = %d) AS writing FROM message GROUP BY file_id) u"
		 " ON u.file_id = f.file_id ORDER BY f.file_id",
		 DBOX_MSG_WRITING);
	if ((ret = prepare(index, sql, &stmt)) < 0)
		return ret;
	while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
		if (count == size) {
			size = size == 0 ? 64 : size * 2;
			if ((grown = realloc(rows, size * sizeof(*rows))) == NULL) {
				ret = -ENOMEM;
				break;
			}
			rows = grown;
		}
		rows[count].file_id = sqlite3_column_int64(stmt, 0);
		rows[count].committed = sqlite3_column_int64(stmt, 1);
		rows[count].records = sqlite3_column_int64(stmt, 2);
		rows[count].live_bytes = sqlite3_column_int64(stmt, 3);
		rows[count].writing = sqlite3_column_int64(stmt, 4);
		count++;
	}
	if (ret == 0 && rc != SQLITE_DONE)
		ret = index_sql_error(index, "file usage");
	sqlite3_finalize(stmt);
	for (size_t i = 0; ret == 0 && i < count; i++)
		ret = cb(ctx, &rows[i]);
	free(rows);
	return ret;
}

int dbox_index_msg_move(struct dbox_index *index, uint32_t old_file_id,
			struct dbox_msg_move *moves, size_t count,
			uint64_t *left_r)
{
	sqlite3_stmt *upd = NULL, *mtime = NULL, *left = NULL;
	char sql[512];
	int ret;

	snprintf(sql, sizeof(sql),
		 "UPDATE message SET file_id = ?1, offset = ?2 WHERE ino = ?3"
		 " AND file_id = ?4 AND offset = ?5 AND record_size = ?6"
		 " AND state = %d", DBOX_MSG_COMMITTED);
	if ((ret = prepare(index, sql, &upd)) < 0 ||
	    (ret = prepare(index, "SELECT mtime FROM inode WHERE ino = ?1",
			   &mtime)) < 0 ||
	    (ret = prepare(index, "SELECT count(*) FROM message WHERE file_id = ?1",
			   &left)) < 0)
		goto out;
	for (size_t i = 0; i < count; i++) {
		struct dbox_msg_move *m = &moves[i];

		sqlite3_reset(upd);
		sqlite3_bind_int64(upd, 1, m->new_file_id);
		sqlite3_bind_int64(upd, 2, m->new_offset);
		sqlite3_bind_int64(upd, 3, m->ino);
		sqlite3_bind_int64(upd, 4, old_file_id);
		sqlite3_bind_int64(upd, 5, m->old_offset);
		sqlite3_bind_int64(upd, 6, m->record_size);
		if (sqlite3_step(upd) != SQLITE_DONE) {
			ret = index_sql_error(index, "purge move");
			goto out;
		}
		m->moved = sqlite3_changes(index->db) == 1;
		if (!m->moved)
			continue;
		sqlite3_reset(mtime);
		sqlite3_bind_int64(mtime, 1, m->ino);
		if (sqlite3_step(mtime) == SQLITE_ROW)
			m->mtime_ns = sqlite3_column_int64(mtime, 0);
	}
	sqlite3_bind_int64(left, 1, old_file_id);
	if (sqlite3_step(left) != SQLITE_ROW) {
		ret = index_sql_error(index, "purge left");
		goto out;
	}
	*left_r = sqlite3_column_int64(left, 0);
out:
	sqlite3_finalize(upd);
	sqlite3_finalize(mtime);
	sqlite3_finalize(left);
	return ret;
}

/* Run sql with one integer bound as ?1 (and a text ?2 when key != NULL),
   expecting no row. */
static int exec_bound(struct dbox_index *index, const char *sql,
		      int64_t value, const char *key)
{
	sqlite3_stmt *stmt;
	int ret, rc;

	if ((ret = prepare(index, sql, &stmt)) < 0)
		return ret;
	sqlite3_bind_int64(stmt, 1, value);
	if (key != NULL)
		sqlite3_bind_text(stmt, 2, key, -1, SQLITE_STATIC);
	rc = sqlite3_step(stmt);
	sqlite3_finalize(stmt);
	return rc == SQLITE_DONE ? 0 : index_sql_error(index, sql);
}

int dbox_index_ino_in_folder(struct dbox_index *index, uint64_t ino,
			     uint64_t dir)
{
	sqlite3_stmt *stmt;
	int ret, rc;

	if ((ret = prepare(index,
			   "SELECT 1 FROM entry e WHERE e.ino = ?1 AND"
			   " (e.parent = ?2 OR e.parent IN (SELECT s.ino FROM"
			   " entry s WHERE s.parent = ?2 AND s.name IN"
			   " (CAST('cur' AS BLOB), CAST('new' AS BLOB),"
			   " CAST('tmp' AS BLOB)))) LIMIT 1", &stmt)) < 0)
		return ret;
	sqlite3_bind_int64(stmt, 1, (int64_t)ino);
	sqlite3_bind_int64(stmt, 2, (int64_t)dir);
	rc = sqlite3_step(stmt);
	sqlite3_finalize(stmt);
	if (rc == SQLITE_ROW)
		return 1;
	return rc == SQLITE_DONE ? 0 : index_sql_error(index, "in folder");
}

int dbox_index_mfile_delete(struct dbox_index *index, uint32_t file_id)
{
	int ret = exec_bound(index, "INSERT INTO meta (key, value) VALUES"
			     " (?2, ?1) ON CONFLICT (key) DO UPDATE SET"
			     " value = max(value, excluded.value)", file_id,
			     DBOX_META_MFILE_HIGH);

	if (ret < 0)
		return ret;
	return exec_bound(index, "DELETE FROM mfile WHERE file_id = ?1",
			  file_id, NULL);
}

int dbox_index_file_has_records(struct dbox_index *index, uint32_t file_id)
{
	sqlite3_stmt *stmt;
	int ret, rc;

	if ((ret = prepare(index, "SELECT 1 FROM message WHERE file_id = ?1"
			   " LIMIT 1", &stmt)) < 0)
		return ret;
	sqlite3_bind_int64(stmt, 1, file_id);
	rc = sqlite3_step(stmt);
	sqlite3_finalize(stmt);
	if (rc == SQLITE_ROW)
		return 1;
	return rc == SQLITE_DONE ? 0 : index_sql_error(index, "has records");
}

