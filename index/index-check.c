/*
 * index-check.c: read-only consistency checks of an index (see
 * index-check.h), for dboxadm check.
 *
 * These run once per command, so their SQL is prepared at call time
 * (sqlite3_prepare_v2), like index-stats.c.  Nothing here writes.
 */
#include "index-private.h"
#include "index-check.h"

#include "storage/log.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Append text to buf (o bytes used, size in all); false when it did not
   fit whole (then cut at a character boundary, with "..."). */
static bool append_cut(char *buf, size_t size, size_t *o, const char *text)
{
	size_t n = strlen(text);

	if (*o + n + 4 <= size) {
		memcpy(buf + *o, text, n + 1);
		*o += n;
		return true;
	}
	n = size - *o >= 4 ? size - *o - 4 : 0;
	while (n > 0 && ((unsigned char)text[n] & 0xc0) == 0x80)
		n--;
	memcpy(buf + *o, text, n);
	memcpy(buf + *o + n, "...", 4);
	*o += n + 3;
	return false;
}

/* A name (blob) as printable text, as the log writes names
   (dbox_log_escape: UTF-8 kept, control bytes, C1 controls and
   malformed bytes as \xNN), a NUL byte in it as \x00.  Cut (with "...")
   to fit buf (size >= 4). */
static const char *escape(const void *blob, size_t len, char *buf,
			  size_t size)
{
	const char *p = blob;
	size_t o = 0;

	buf[0] = '\0';
	while (len > 0) {
		size_t seg = strnlen(p, len);
		char *text = strndup(p, seg);
		char *esc = malloc(DBOX_LOG_ESCAPED_SIZE(seg));
		bool whole;

		if (text == NULL || esc == NULL) {
			free(text);
			free(esc);
			snprintf(buf, size, "(out of memory)");
			return buf;
		}
		dbox_log_escape(esc, DBOX_LOG_ESCAPED_SIZE(seg), text);
		whole = append_cut(buf, size, &o, esc) &&
			(seg == len || append_cut(buf, size, &o, "\\x00"));
		free(text);
		free(esc);
		if (!whole)
			return buf;
		p += seg < len ? seg + 1 : seg;
		len -= seg < len ? seg + 1 : seg;
	}
	return buf;
}

static void report(dbox_problem_cb_t *cb, void *ctx, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void report(dbox_problem_cb_t *cb, void *ctx, const char *fmt, ...)
{
	char text[1024];
	va_list args;

	va_start(args, fmt);
	vsnprintf(text, sizeof(text), fmt, args);
	va_end(args);
	cb(ctx, text);
}

int dbox_index_check_integrity(struct dbox_index *index,
			       dbox_problem_cb_t *cb, void *ctx)
{
	sqlite3_stmt *stmt;
	int rc, count = 0;

	if (sqlite3_prepare_v2(index->db, "PRAGMA integrity_check", -1, &stmt,
			       NULL) != SQLITE_OK)
		return index_sql_error(index, "integrity check");
	while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
		const char *line = (const char *)sqlite3_column_text(stmt, 0);

		if (line != NULL && strcmp(line, "ok") == 0)
			continue;
		report(cb, ctx, "SQLite integrity check: %s",
		       line != NULL ? line : "?");
		count++;
	}
	sqlite3_finalize(stmt);
	if (rc != SQLITE_DONE) {
		report(cb, ctx, "SQLite integrity check failed: %s",
		       sqlite3_errmsg(index->db));
		count++;
	}
	return count;
}

/* One namespace check: sql yields rows, describe() turns each into a
   problem.  Returns the row count or -EIO. */
typedef void describe_t(sqlite3_stmt *stmt, char *buf, size_t size);

static int check_rows(struct dbox_index *index, const char *sql,
		      describe_t *describe, dbox_problem_cb_t *cb, void *ctx)
{
	sqlite3_stmt *stmt;
	char text[1024];
	int rc, count = 0;

	if (sqlite3_prepare_v2(index->db, sql, -1, &stmt, NULL) != SQLITE_OK)
		return index_sql_error(index, sql);
	while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
		describe(stmt, text, sizeof(text));
		cb(ctx, text);
		count++;
	}
	sqlite3_finalize(stmt);
	if (rc != SQLITE_DONE)
		return index_sql_error(index, sql);
	return count;
}

/* Column col as an escaped name. */
static const char *name_col(sqlite3_stmt *stmt, int col, char *buf,
			    size_t size)
{
	return escape(sqlite3_column_blob(stmt, col),
		      (size_t)sqlite3_column_bytes(stmt, col), buf, size);
}

#define I64(col) ((long long)sqlite3_column_int64(stmt, col))

static void d_entry_no_inode(sqlite3_stmt *stmt, char *buf, size_t size)
{
	char name[600];

	snprintf(buf, size, "entry '%s' in directory %lld names inode %lld, "
		 "which does not exist", name_col(stmt, 1, name, sizeof(name)),
		 I64(0), I64(2));
}

static void d_entry_bad_parent(sqlite3_stmt *stmt, char *buf, size_t size)
{
	char name[600];

	snprintf(buf, size, "entry '%s' (inode %lld) is in %lld, which is not "
		 "a directory", name_col(stmt, 1, name, sizeof(name)), I64(2),
		 I64(0));
}

static void d_bad_name(sqlite3_stmt *stmt, char *buf, size_t size)
{
	char name[600];

	snprintf(buf, size, "entry '%s' (%lld bytes) in directory %lld: not a "
		 "valid file name", name_col(stmt, 1, name, sizeof(name)),
		 (long long)sqlite3_column_bytes(stmt, 1), I64(0));
}

static void d_nlink(sqlite3_stmt *stmt, char *buf, size_t size)
{
	snprintf(buf, size, "inode %lld: link count %lld, but %lld names",
		 I64(0), I64(1), I64(2));
}

static void d_dir_nlink(sqlite3_stmt *stmt, char *buf, size_t size)
{
	snprintf(buf, size, "directory %lld: link count %lld, but 2 + %lld "
		 "subdirectories", I64(0), I64(1), I64(2));
}

static void d_dir_names(sqlite3_stmt *stmt, char *buf, size_t size)
{
	snprintf(buf, size, "directory %lld has %lld names (%s)", I64(0),
		 I64(1), I64(0) == DBOX_ROOT_INO ? "the root has none" :
		 "must have one");
}

static void d_unreachable(sqlite3_stmt *stmt, char *buf, size_t size)
{
	snprintf(buf, size, "directory %lld cannot be reached from the root "
		 "(a cycle of renames?)", I64(0));
}

static void d_msg_no_row(sqlite3_stmt *stmt, char *buf, size_t size)
{
	snprintf(buf, size, "message inode %lld has no storage location "
		 "(message row)", I64(0));
}

static void d_symlink_no_target(sqlite3_stmt *stmt, char *buf, size_t size)
{
	snprintf(buf, size, "symbolic link inode %lld has no target", I64(0));
}

static void d_target_no_symlink(sqlite3_stmt *stmt, char *buf, size_t size)
{
	snprintf(buf, size, "symlink target of inode %lld, which is %s", I64(0),
		 sqlite3_column_type(stmt, 1) == SQLITE_NULL ? "gone" :
		 "not a symbolic link");
}

static void d_row_no_msg(sqlite3_stmt *stmt, char *buf, size_t size)
{
	snprintf(buf, size, "message row of inode %lld, which is %s", I64(0),
		 sqlite3_column_type(stmt, 1) == SQLITE_NULL ? "gone" :
		 "not a message");
}

static void d_shared_record(sqlite3_stmt *stmt, char *buf, size_t size)
{
	snprintf(buf, size, "m.%lld offset %lld: record of %lld messages "
		 "(inodes %s)", I64(0), I64(1), I64(2),
		 (const char *)sqlite3_column_text(stmt, 3));
}

static void d_past_end(sqlite3_stmt *stmt, char *buf, size_t size)
{
	if (sqlite3_column_type(stmt, 4) == SQLITE_NULL)
		snprintf(buf, size, "message inode %lld is in m.%lld, which the "
			 "index does not know", I64(0), I64(1));
	else
		snprintf(buf, size, "message inode %lld: record m.%lld "
			 "[%lld, %llu) is past the committed end %lld", I64(0),
			 I64(1), I64(2), (unsigned long long)I64(2) +
			 (unsigned long long)I64(3), I64(4));
}

static void d_format(sqlite3_stmt *stmt, char *buf, size_t size)
{
	snprintf(buf, size, "meta: format is %s", sqlite3_column_type(stmt, 0) ==
		 SQLITE_NULL ? "missing" : "unknown");
}

int dbox_index_check_namespace(struct dbox_index *index,
			       dbox_problem_cb_t *cb, void *ctx)
{
	char sql[10][512];
	struct {
		const char *sql;
		describe_t *describe;
	} checks[18];
	size_t n = 0;
	int total = 0, ret;

	checks[n++] = (typeof(checks[0])){
		"SELECT e.parent, e.name, e.ino FROM entry e"
		" LEFT JOIN inode i ON i.ino = e.ino WHERE i.ino IS NULL",
		d_entry_no_inode };
	snprintf(sql[0], sizeof(sql[0]),
		 "SELECT e.parent, e.name, e.ino FROM entry e"
		 " LEFT JOIN inode p ON p.ino = e.parent"
		 " WHERE p.ino IS NULL OR p.kind != %d", DBOX_KIND_DIR);
	checks[n++] = (typeof(checks[0])){ sql[0], d_entry_bad_parent };
	snprintf(sql[1], sizeof(sql[1]),
		 "SELECT parent, name FROM entry WHERE length(name) = 0"
		 " OR length(name) > %d OR name IN (x'2e', x'2e2e', '.', '..')"
		 " OR instr(name, x'2f') > 0 OR instr(name, x'00') > 0",
		 DBOX_NAME_MAX);
	checks[n++] = (typeof(checks[0])){ sql[1], d_bad_name };
	snprintf(sql[2], sizeof(sql[2]),
		 "SELECT i.ino, i.nlink, (SELECT count(*) FROM entry e"
		 " WHERE e.ino = i.ino) AS c FROM inode i"
		 " WHERE i.kind != %d AND i.nlink != c", DBOX_KIND_DIR);
	checks[n++] = (typeof(checks[0])){ sql[2], d_nlink };
	snprintf(sql[3], sizeof(sql[3]),
		 "SELECT i.ino, i.nlink, (SELECT count(*) FROM entry e"
		 " JOIN inode c ON c.ino = e.ino WHERE e.parent = i.ino"
		 " AND c.kind = %d) AS s FROM inode i"
		 " WHERE i.kind = %d AND i.nlink != 2 + s",
		 DBOX_KIND_DIR, DBOX_KIND_DIR);
	checks[n++] = (typeof(checks[0])){ sql[3], d_dir_nlink };
	snprintf(sql[4], sizeof(sql[4]),
		 "SELECT i.ino, (SELECT count(*) FROM entry e WHERE e.ino = i.ino)"
		 " AS c FROM inode i WHERE i.kind = %d"
		 " AND c != (CASE WHEN i.ino = %d THEN 0 ELSE 1 END)",
		 DBOX_KIND_DIR, DBOX_ROOT_INO);
	checks[n++] = (typeof(checks[0])){ sql[4], d_dir_names };
	snprintf(sql[5], sizeof(sql[5]),
		 "WITH RECURSIVE r(ino) AS (VALUES(%d) UNION SELECT e.ino"
		 " FROM entry e JOIN r ON e.parent = r.ino"
		 " JOIN inode d ON d.ino = e.ino AND d.kind = %d)"
		 " SELECT ino FROM inode WHERE kind = %d AND ino NOT IN r",
		 DBOX_ROOT_INO, DBOX_KIND_DIR, DBOX_KIND_DIR);
	checks[n++] = (typeof(checks[0])){ sql[5], d_unreachable };
	snprintf(sql[6], sizeof(sql[6]),
		 "SELECT i.ino FROM inode i LEFT JOIN message m ON m.ino = i.ino"
		 " WHERE i.kind = %d AND m.ino IS NULL", DBOX_KIND_MESSAGE);
	checks[n++] = (typeof(checks[0])){ sql[6], d_msg_no_row };
	snprintf(sql[7], sizeof(sql[7]),
		 "SELECT m.ino, i.kind FROM message m LEFT JOIN inode i"
		 " ON i.ino = m.ino WHERE i.ino IS NULL OR i.kind != %d",
		 DBOX_KIND_MESSAGE);
	checks[n++] = (typeof(checks[0])){ sql[7], d_row_no_msg };
	snprintf(sql[8], sizeof(sql[8]),
		 "SELECT i.ino FROM inode i LEFT JOIN symlink s ON s.ino = i.ino"
		 " WHERE i.kind = %d AND s.ino IS NULL", DBOX_KIND_SYMLINK);
	checks[n++] = (typeof(checks[0])){ sql[8], d_symlink_no_target };
	snprintf(sql[9], sizeof(sql[9]),
		 "SELECT s.ino, i.kind FROM symlink s LEFT JOIN inode i"
		 " ON i.ino = s.ino WHERE i.ino IS NULL OR i.kind != %d",
		 DBOX_KIND_SYMLINK);
	checks[n++] = (typeof(checks[0])){ sql[9], d_target_no_symlink };
	checks[n++] = (typeof(checks[0])){
		"SELECT file_id, offset, count(*), group_concat(ino, ' ')"
		" FROM message WHERE state = 0 GROUP BY file_id, offset"
		" HAVING count(*) > 1", d_shared_record };
	checks[n++] = (typeof(checks[0])){
		"SELECT m.ino, m.file_id, m.offset, m.record_size, f.size"
		" FROM message m LEFT JOIN mfile f ON f.file_id = m.file_id"
		" WHERE m.state = 0 AND (f.file_id IS NULL"
		" OR m.offset + m.record_size > f.size)", d_past_end };
	checks[n++] = (typeof(checks[0])){
		"SELECT (SELECT value FROM meta WHERE key = 'format') AS f"
		" WHERE f IS NULL OR f < 1", d_format };

	for (size_t i = 0; i < n; i++) {
		if ((ret = check_rows(index, checks[i].sql, checks[i].describe,
				      cb, ctx)) < 0)
			return ret;
		total += ret;
	}
	return total;
}

int dbox_index_check_pending(struct dbox_index *index, const char *keep_prefix,
			     uint64_t *writing_r, uint64_t *kept_r,
			     uint64_t *unnamed_r)
{
	sqlite3_stmt *stmt;
	char sql[512];
	int rc;

	assert(strchr(keep_prefix, '\'') == NULL);
	snprintf(sql, sizeof(sql),
		 "SELECT (SELECT count(*) FROM message WHERE state = %d),"
		 " (SELECT count(*) FROM message WHERE state = %d AND EXISTS"
		 " (SELECT 1 FROM meta WHERE key = '%s' || message.ino)),"
		 " (SELECT count(*) FROM inode WHERE nlink = 0 AND kind != %d)",
		 DBOX_MSG_WRITING, DBOX_MSG_WRITING, keep_prefix,
		 DBOX_KIND_DIR);
	if (sqlite3_prepare_v2(index->db, sql, -1, &stmt, NULL) != SQLITE_OK)
		return index_sql_error(index, "pending");
	rc = sqlite3_step(stmt);
	if (rc == SQLITE_ROW) {
		*writing_r = (uint64_t)sqlite3_column_int64(stmt, 0);
		*kept_r = (uint64_t)sqlite3_column_int64(stmt, 1);
		*unnamed_r = (uint64_t)sqlite3_column_int64(stmt, 2);
	}
	sqlite3_finalize(stmt);
	return rc == SQLITE_ROW ? 0 : index_sql_error(index, "pending");
}

int dbox_index_check_messages(struct dbox_index *index,
			      dbox_check_msg_cb_t *cb, void *ctx)
{
	struct dbox_check_msg msg;
	sqlite3_stmt *stmt;
	int rc, ret = 0;

	if (sqlite3_prepare_v2(index->db,
			       "SELECT m.ino, i.nlink, i.size, m.file_id, m.offset,"
			       " m.body_size, m.record_size, m.vsize, m.state, m.guid"
			       " FROM message m JOIN inode i ON i.ino = m.ino"
			       " ORDER BY m.file_id, m.offset", -1, &stmt,
			       NULL) != SQLITE_OK)
		return index_sql_error(index, "messages");
	while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
		const unsigned char *guid = sqlite3_column_text(stmt, 9);

		memset(&msg, 0, sizeof(msg));
		msg.ino = (uint64_t)sqlite3_column_int64(stmt, 0);
		msg.nlink = (uint32_t)sqlite3_column_int64(stmt, 1);
		msg.size = (uint64_t)sqlite3_column_int64(stmt, 2);
		msg.loc.file_id = (uint32_t)sqlite3_column_int64(stmt, 3);
		msg.loc.offset = (uint64_t)sqlite3_column_int64(stmt, 4);
		msg.loc.body_size = (uint64_t)sqlite3_column_int64(stmt, 5);
		msg.loc.record_size = (uint64_t)sqlite3_column_int64(stmt, 6);
		msg.loc.vsize = (uint64_t)sqlite3_column_int64(stmt, 7);
		msg.loc.state = sqlite3_column_int(stmt, 8);
		snprintf(msg.loc.guid, sizeof(msg.loc.guid), "%s",
			 guid != NULL ? (const char *)guid : "");
		if ((ret = cb(ctx, &msg)) != 0)
			break;
	}
	sqlite3_finalize(stmt);
	if (ret == 0 && rc != SQLITE_DONE)
		return index_sql_error(index, "messages");
	return ret;
}

int dbox_index_check_files(struct dbox_index *index,
			   dbox_check_ino_cb_t *cb, void *ctx)
{
	sqlite3_stmt *stmt;
	char sql[128];
	int rc, ret = 0;

	snprintf(sql, sizeof(sql), "SELECT ino FROM inode WHERE kind = %d"
		 " ORDER BY ino", DBOX_KIND_FILE);
	if (sqlite3_prepare_v2(index->db, sql, -1, &stmt, NULL) != SQLITE_OK)
		return index_sql_error(index, "plain files");
	while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
		if ((ret = cb(ctx, (uint64_t)sqlite3_column_int64(stmt, 0))) != 0)
			break;
	}
	sqlite3_finalize(stmt);
	if (ret == 0 && rc != SQLITE_DONE)
		return index_sql_error(index, "plain files");
	return ret;
}

int dbox_index_check_path(struct dbox_index *index, uint64_t ino,
			  char **path_r)
{
	char *path = strdup(""), *name = NULL, *joined, buf[1100];
	unsigned int depth = 0;
	uint64_t parent;
	int ret;

	if (path == NULL)
		return -ENOMEM;
	while (ino != DBOX_ROOT_INO) {
		ret = dbox_index_name_of(index, ino, &name);
		if (ret == -ENOENT && depth == 0) {
			free(path);
			*path_r = strdup("(no name)");
			return *path_r == NULL ? -ENOMEM : 0;
		}
		/* A broken chain (or a cycle) ends the path where it breaks. */
		if (ret < 0 || ++depth > 1000 ||
		    dbox_index_parent(index, ino, &parent) < 0) {
			free(name);
			break;
		}
		escape(name, strlen(name), buf, sizeof(buf));
		free(name);
		name = NULL; /* a failing name_of above leaves it as it was */
		if (asprintf(&joined, "/%s%s", buf, path) < 0) {
			free(path);
			return -ENOMEM;
		}
		free(path);
		path = joined;
		ino = parent;
	}
	*path_r = path;
	return 0;
}
