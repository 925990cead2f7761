/*
 * index-stats.c: whole-index totals, read snapshots and guest-reader setup
 * for dboxadm (see index-stats.h).
 *
 * These run once per dboxadm command, so their SQL is prepared here at
 * call time (sqlite3_prepare_v2) rather than with the hot-path statements
 * in index.c.  Nothing here writes to the index.
 */
#include "index-private.h"
#include "index-stats.h"

#include "storage/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dbox_index_reader_setup(struct dbox_index *index)
{
	int on = 1;

	if (sqlite3_db_config(index->db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1,
			      &on) != SQLITE_OK)
		return index_sql_error(index, "no checkpoint on close");
	return 0;
}

int dbox_index_snapshot_begin(struct dbox_index *index)
{
	char *err = NULL;

	/* A deferred BEGIN takes no lock; the first read starts the WAL
	   snapshot, which then holds until COMMIT. */
	if (sqlite3_exec(index->db,
			 "BEGIN DEFERRED; SELECT count(*) FROM meta;",
			 NULL, NULL, &err) != SQLITE_OK) {
		dbox_error("index %s: read snapshot: %s", index->path,
			   err != NULL ? err : sqlite3_errmsg(index->db));
		sqlite3_free(err);
		dbox_index_snapshot_end(index);
		return -EIO;
	}
	return 0;
}

void dbox_index_snapshot_end(struct dbox_index *index)
{
	if (!sqlite3_get_autocommit(index->db))
		sqlite3_exec(index->db, "COMMIT", NULL, NULL, NULL);
}

/* Run sql (one row of integer columns expected) into out[0..ncols).
   Missing or NULL values read as 0. */
static int query_row(struct dbox_index *index, const char *sql,
		     uint64_t *out, int ncols)
{
	sqlite3_stmt *stmt;
	int rc;

	if (sqlite3_prepare_v2(index->db, sql, -1, &stmt, NULL) != SQLITE_OK)
		return index_sql_error(index, "stats");
	rc = sqlite3_step(stmt);
	for (int i = 0; i < ncols; i++)
		out[i] = rc == SQLITE_ROW ?
			(uint64_t)sqlite3_column_int64(stmt, i) : 0;
	sqlite3_finalize(stmt);
	if (rc != SQLITE_ROW && rc != SQLITE_DONE)
		return index_sql_error(index, "stats");
	return 0;
}

int dbox_index_stats_get(struct dbox_index *index,
			 struct dbox_index_stats *stats_r)
{
	char sql[512];
	uint64_t row[5];
	int ret;

	memset(stats_r, 0, sizeof(*stats_r));
	snprintf(sql, sizeof(sql),
		 "SELECT count(*), sum(i.nlink), sum(m.record_size), sum(i.size),"
		 " sum(m.body_size) FROM message m JOIN inode i ON i.ino = m.ino"
		 " WHERE m.state = %d AND i.nlink > 0", DBOX_MSG_COMMITTED);
	if ((ret = query_row(index, sql, row, 5)) < 0)
		return ret;
	stats_r->messages = row[0];
	stats_r->message_names = row[1];
	stats_r->live_record_bytes = row[2];
	stats_r->plain_bytes = row[3];
	stats_r->body_bytes = row[4];

	snprintf(sql, sizeof(sql),
		 "SELECT count(*), sum(m.record_size) FROM message m"
		 " JOIN inode i ON i.ino = m.ino"
		 " WHERE m.state = %d AND i.nlink = 0", DBOX_MSG_COMMITTED);
	if ((ret = query_row(index, sql, row, 2)) < 0)
		return ret;
	stats_r->unlinked = row[0];
	stats_r->unlinked_bytes = row[1];

	snprintf(sql, sizeof(sql),
		 "SELECT count(*) FROM message WHERE state = %d",
		 DBOX_MSG_WRITING);
	if ((ret = query_row(index, sql, row, 1)) < 0)
		return ret;
	stats_r->writing = row[0];

	snprintf(sql, sizeof(sql),
		 "SELECT (SELECT count(*) FROM inode WHERE kind = %d),"
		 " (SELECT count(*) FROM inode WHERE kind = %d)",
		 DBOX_KIND_DIR, DBOX_KIND_FILE);
	if ((ret = query_row(index, sql, row, 2)) < 0)
		return ret;
	stats_r->dirs = row[0];
	stats_r->files = row[1];

	if ((ret = query_row(index, "SELECT count(*), sum(size) FROM mfile",
			     row, 2)) < 0)
		return ret;
	stats_r->mfiles = row[0];
	stats_r->committed_bytes = row[1];
	return 0;
}

/* Run sql, whose rows are (dir) or (dir, count), and call cb per row with
   count 0 when there is none.  Every row is read first: the callback may
   run other statements. */
static int dir_counts(struct dbox_index *index, const char *sql,
		      const char *what, dbox_dir_count_cb_t *cb, void *ctx)
{
	struct dir_count {
		uint64_t dir, count;
	} *rows = NULL;
	size_t nrows = 0, size = 0;
	sqlite3_stmt *stmt;
	int rc, ret = 0;

	if (sqlite3_prepare_v2(index->db, sql, -1, &stmt, NULL) != SQLITE_OK)
		return index_sql_error(index, what);
	while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
		if (nrows == size) {
			struct dir_count *n;

			size = size == 0 ? 64 : size * 2;
			if ((n = realloc(rows, size * sizeof(*rows))) == NULL) {
				ret = -ENOMEM;
				break;
			}
			rows = n;
		}
		rows[nrows].dir = sqlite3_column_int64(stmt, 0);
		rows[nrows].count = sqlite3_column_count(stmt) > 1 ?
			(uint64_t)sqlite3_column_int64(stmt, 1) : 0;
		nrows++;
	}
	if (ret == 0 && rc != SQLITE_DONE)
		ret = index_sql_error(index, what);
	sqlite3_finalize(stmt);
	for (size_t i = 0; ret == 0 && i < nrows; i++)
		ret = cb(ctx, rows[i].dir, rows[i].count);
	free(rows);
	return ret;
}

int dbox_index_stats_per_dir(struct dbox_index *index,
			     dbox_dir_count_cb_t *cb, void *ctx)
{
	char sql[256];

	snprintf(sql, sizeof(sql),
		 "SELECT e.parent, count(*) FROM entry e"
		 " JOIN message m ON m.ino = e.ino"
		 " WHERE m.state = %d GROUP BY e.parent ORDER BY e.parent",
		 DBOX_MSG_COMMITTED);
	return dir_counts(index, sql, "stats per dir", cb, ctx);
}

int dbox_index_stats_maildirs(struct dbox_index *index,
			      dbox_dir_count_cb_t *cb, void *ctx)
{
	char sql[256];

	/* entry.name is a BLOB: compared with the bytes of "cur". */
	snprintf(sql, sizeof(sql),
		 "SELECT e.ino FROM entry e JOIN inode i ON i.ino = e.ino"
		 " WHERE e.name = x'637572' AND i.kind = %d ORDER BY e.ino",
		 DBOX_KIND_DIR);
	return dir_counts(index, sql, "stats maildirs", cb, ctx);
}
