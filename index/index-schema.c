/*
 * index-schema.c: the schema of the SQLite index, and bringing an index of
 * an older format up to DBOX_INDEX_FORMAT (index-private.h).  The tables
 * and what each column means are described in docs/design.md section 3.
 */
#include "index-private.h"

#include "storage/log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char schema_sql[] =
	"CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;\n"
	"CREATE TABLE inode (\n"
	"  ino   INTEGER PRIMARY KEY AUTOINCREMENT,\n"
	"  kind  INTEGER NOT NULL,\n"   /* enum dbox_kind */
	"  mode  INTEGER NOT NULL,\n"   /* with S_IFMT bits */
	"  uid   INTEGER NOT NULL, gid INTEGER NOT NULL,\n"
	"  nlink INTEGER NOT NULL,\n"   /* names; dirs: 2 + subdirectories */
	"  size  INTEGER NOT NULL,\n"   /* plaintext bytes */
	"  mtime INTEGER NOT NULL,\n"   /* ns; a message's received time */
	"  ctime INTEGER NOT NULL,\n"   /* ns */
	INDEX_FORMAT2_INODE_COLS ");\n"
	INDEX_FORMAT2_TABLES
	"CREATE TABLE entry (\n"
	"  id     INTEGER PRIMARY KEY AUTOINCREMENT,\n" /* readdir order */
	"  parent INTEGER NOT NULL,\n"
	"  name   BLOB NOT NULL,\n"
	"  ino    INTEGER NOT NULL);\n"
	"CREATE UNIQUE INDEX entry_name ON entry (parent, name);\n"
	"CREATE INDEX entry_parent ON entry (parent);\n"
	"CREATE INDEX entry_ino ON entry (ino);\n"
	"CREATE TABLE message (\n"
	"  ino         INTEGER PRIMARY KEY,\n"
	"  guid        TEXT NOT NULL,\n"
	"  file_id     INTEGER NOT NULL,\n"
	"  offset      INTEGER NOT NULL,\n"
	"  body_size   INTEGER NOT NULL,\n"
	"  record_size INTEGER NOT NULL,\n"
	"  vsize       INTEGER NOT NULL,\n"
	"  state       INTEGER NOT NULL);\n" /* enum dbox_msg_state */
	"CREATE INDEX message_file ON message (file_id, offset);\n"
	"CREATE TABLE mfile (\n"
	"  file_id INTEGER PRIMARY KEY,\n"
	"  size    INTEGER NOT NULL" /* committed end */
	INDEX_FORMAT3_MFILE_COLS ");\n"
	INDEX_FORMAT3_TABLES;

static int exec_sql(struct dbox_index *index, const char *sql)
{
	return index_exec_sql(index, DBOX_LOG_ERROR, NULL, sql);
}

/* A new index: schema, format, uidvalidity and the root directory. */
int index_create_schema(struct dbox_index *index)
{
	int64_t now = dbox_now_ns();
	char sql[512];
	int ret;

	if ((ret = exec_sql(index, "BEGIN")) < 0)
		return ret;
	snprintf(sql, sizeof(sql),
		 "INSERT INTO meta VALUES ('format', %d), ('uidvalidity', %lld);"
		 "INSERT INTO inode (ino, kind, mode, uid, gid, nlink, size, mtime, ctime)"
		 " VALUES (%d, %d, %d, %u, %u, 2, 0, %lld, %lld);",
		 DBOX_INDEX_FORMAT, (long long)dbox_time_sec(now),
		 DBOX_ROOT_INO, DBOX_KIND_DIR, S_IFDIR | 0700,
		 (unsigned)getuid(), (unsigned)getgid(),
		 (long long)now, (long long)now);
	if ((ret = exec_sql(index, schema_sql)) < 0 ||
	    (ret = exec_sql(index, sql)) < 0 ||
	    (ret = exec_sql(index, "COMMIT")) < 0) {
		exec_sql(index, "ROLLBACK");
		return ret;
	}
	return 0;
}

int index_guard(sqlite3 *db)
{
	return sqlite3_db_config(db, SQLITE_DBCONFIG_DEFENSIVE, 1, NULL) ==
		SQLITE_OK &&
		sqlite3_db_config(db, SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0,
				  NULL) == SQLITE_OK &&
		sqlite3_db_config(db, SQLITE_DBCONFIG_ENABLE_TRIGGER, 0,
				  NULL) == SQLITE_OK &&
		sqlite3_db_config(db, SQLITE_DBCONFIG_ENABLE_VIEW, 0,
				  NULL) == SQLITE_OK ? 0 : -EIO;
}

int index_check_schema(struct dbox_index *index)
{
	sqlite3_stmt *stmt;
	int rc, ret = 0;

	if (sqlite3_prepare_v2(index->db, "SELECT type, name, sql FROM"
			       " sqlite_schema WHERE type IN ('trigger', 'view')",
			       -1, &stmt, NULL) != SQLITE_OK)
		return index_sql_error(index, "schema");
	while (ret == 0 && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
		const char *type = (const char *)sqlite3_column_text(stmt, 0);
		const char *name = (const char *)sqlite3_column_text(stmt, 1);
		const char *sql = (const char *)sqlite3_column_text(stmt, 2);

		if (type != NULL && strcmp(type, "trigger") == 0 &&
		    name != NULL && strcmp(name, "inode_gone") == 0 &&
		    sql != NULL && strcmp(sql, INDEX_TRIGGER_INODE_GONE) == 0)
			continue;
		/* Escaped by the log: the name is the owner's text. */
		dbox_error("index %s: holds a %s that dboxfs did not make (%s);"
			   " not opened: a hostile or foreign index (dboxadm "
			   "rebuild makes a new one from storage/)", index->path,
			   type != NULL ? type : "?", name != NULL ? name : "?");
		ret = -EIO;
	}
	if (ret == 0 && rc != SQLITE_DONE)
		ret = index_sql_error(index, "schema");
	sqlite3_finalize(stmt);
	return ret;
}

int index_check_format(struct dbox_index *index, int64_t *format_r)
{
	int64_t format;

	if (dbox_index_meta_get(index, "format", &format) < 0) {
		dbox_error("index %s: not a dboxfs index (no format)",
			   index->path);
		return -EIO;
	}
	if (format > DBOX_INDEX_FORMAT) {
		dbox_error("index %s: format %lld is newer than this dboxfs "
			   "(%d); upgrade dboxfs", index->path,
			   (long long)format, DBOX_INDEX_FORMAT);
		return -EPROTO;
	}
	*format_r = format;
	return 0;
}

/* The schema changes from format `from` to from + 1. */
static const char *const upgrade_sql[] = {
	/* 1 -> 2: inode.atime (NULL: "the same as mtime", so the upgrade
	   rewrites no row and costs the same on a million messages as on
	   ten), inode.rdev, the symlink and xattr tables. */
	[1] = "ALTER TABLE inode ADD COLUMN atime INTEGER;"
	      "ALTER TABLE inode ADD COLUMN rdev INTEGER NOT NULL DEFAULT 0;"
	      INDEX_FORMAT2_TABLES,
	/* 2 -> 3: mfile.alt (0: every m.N of an older store is in
	   STORE/storage/; again no row rewritten) and the setting table. */
	[2] = "ALTER TABLE mfile ADD COLUMN alt INTEGER NOT NULL DEFAULT 0;"
	      INDEX_FORMAT3_TABLES,
};

/* Bring an index of an older format up to DBOX_INDEX_FORMAT, one step
   per format (upgrade_sql), all in one transaction.  Returns 0, or a
   negative errno (-EROFS when the index cannot be written: an old store
   on read-only media is refused, never half upgraded). */
int index_upgrade_format(struct dbox_index *index, int64_t format)
{
	char sql[128];
	int ret = 0;

	if (format >= DBOX_INDEX_FORMAT)
		return 0;
	if (sqlite3_db_readonly(index->db, "main") == 1) {
		dbox_error("index %s: format %lld needs an upgrade to %d, and "
			   "the index is read-only; open it read-write once",
			   index->path, (long long)format, DBOX_INDEX_FORMAT);
		return -EROFS;
	}
	snprintf(sql, sizeof(sql),
		 "UPDATE meta SET value = %d WHERE key = 'format';",
		 DBOX_INDEX_FORMAT);
	if ((ret = exec_sql(index, "BEGIN IMMEDIATE")) < 0)
		return ret;
	for (int64_t from = format < 1 ? 1 : format;
	     ret == 0 && from < DBOX_INDEX_FORMAT; from++)
		ret = exec_sql(index, upgrade_sql[from]);
	if (ret < 0 || (ret = exec_sql(index, sql)) < 0 ||
	    (ret = exec_sql(index, "COMMIT")) < 0) {
		exec_sql(index, "ROLLBACK");
		return ret;
	}
	dbox_info("index %s: upgraded from format %lld to %d", index->path,
		  (long long)format, DBOX_INDEX_FORMAT);
	return 0;
}

/* Partial indexes that let crash recovery (dbox_index_recover) find the
   WRITING messages and the inodes without names without scanning every
   row: with a million messages those scans made each mount take seconds.
   They hold only the rare rows, so keeping them costs little.  Added to
   stores made before them at the first open; an index without them still
   works (recovery scans), so a failure here is not an error. */
void index_add_recovery_indexes(struct dbox_index *index)
{
	char sql[256];

	snprintf(sql, sizeof(sql),
		 "CREATE INDEX IF NOT EXISTS message_writing ON message (ino)"
		 " WHERE state = %d;"
		 "CREATE INDEX IF NOT EXISTS inode_orphan ON inode (ino)"
		 " WHERE nlink = 0;", DBOX_MSG_WRITING);
	(void)index_exec_sql(index, DBOX_LOG_DEBUG,
			     "recovery indexes not added", sql);
}
