/*
 * index.c: opening the SQLite index, prepared statements, transactions
 * and error mapping.  The schema and its upgrades are in index-schema.c,
 * the namespace operations in index-ns.c and index-inode.c, message and
 * m.N bookkeeping in index-msg.c.
 *
 * Invariant: every statement is prepared here once and reused; nothing
 * else in the index prepares SQL at run time.
 */
#include "index-private.h"
#include "wal-sync.h"
#include "checkpoint.h"
#include "reserve.h"
#include "verify.h"

#include "storage/log.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

static const char *const stmt_sql[ST_COUNT] = {
	[ST_BEGIN] = "BEGIN IMMEDIATE",
	[ST_COMMIT] = "COMMIT",
	[ST_ROLLBACK] = "ROLLBACK",
	[ST_SAVEPOINT] = "SAVEPOINT op",
	[ST_RELEASE] = "RELEASE op",
	[ST_ROLLBACK_TO] = "ROLLBACK TO op",
	[ST_LOOKUP] = "SELECT " INDEX_ATTR_COLS " FROM entry e JOIN inode i ON i.ino = e.ino"
		      " WHERE e.parent = ?1 AND e.name = ?2",
	/* Names from ?2 up to (not with) ?3, in byte order: a range of the
	   entry_name index. */
	[ST_LOOKUP_RANGE] = "SELECT e.name, " INDEX_ATTR_COLS " FROM entry e"
			    " JOIN inode i ON i.ino = e.ino"
			    " WHERE e.parent = ?1 AND e.name >= ?2 AND e.name < ?3"
			    " ORDER BY e.name",
	[ST_GETATTR] = "SELECT " INDEX_ATTR_COLS " FROM inode i WHERE i.ino = ?1",
	/* Parameters as index_bind_attr() binds them (?1, ino, unused:
	   the row gets a new one). */
	[ST_INODE_INSERT] = "INSERT INTO inode (kind, mode, uid, gid, nlink, size, mtime, ctime, atime)"
			    " VALUES (?2, ?3, ?4, ?5, ?6, 0, ?8, ?9, ?10)",
	[ST_ENTRY_INSERT] = "INSERT INTO entry (parent, name, ino) VALUES (?1, ?2, ?3)",
	[ST_ENTRY_GET] = "SELECT e.id, " INDEX_ATTR_COLS " FROM entry e JOIN inode i ON i.ino = e.ino"
			 " WHERE e.parent = ?1 AND e.name = ?2",
	/* Both ends of a rename: which end a row is, then as ST_ENTRY_GET
	   (each term uses the entry_name index: MULTI-INDEX OR). */
	[ST_RENAME_ENDS] = "SELECT e.id, e.parent = ?1 AND e.name = ?2,"
			   " e.parent = ?3 AND e.name = ?4, " INDEX_ATTR_COLS
			   " FROM entry e JOIN inode i ON i.ino = e.ino"
			   " WHERE (e.parent = ?1 AND e.name = ?2)"
			   " OR (e.parent = ?3 AND e.name = ?4)",
	[ST_ENTRY_DELETE] = "DELETE FROM entry WHERE id = ?1",
	[ST_ENTRY_MOVE] = "UPDATE entry SET parent = ?2, name = ?3 WHERE id = ?1",
	[ST_ENTRY_SET_INO] = "UPDATE entry SET ino = ?2 WHERE id = ?1",
	[ST_DIR_HAS_ENTRIES] = "SELECT 1 FROM entry WHERE parent = ?1 LIMIT 1",
	[ST_NAME_OF] = "SELECT name, parent FROM entry WHERE ino = ?1 LIMIT 1",
	[ST_PARENT_OF] = "SELECT parent FROM entry WHERE ino = ?1 LIMIT 1",
	/* The read transaction of dbox_index_path when none is open: its
	   steps up read one snapshot, with one read of the WAL-index. */
	[ST_PATH_BEGIN] = "SAVEPOINT path",
	[ST_PATH_END] = "RELEASE path",
	/* One row by its key: no RETURNING and no IN list, each of which
	   costs SQLite an ephemeral table per run (the caller knows the
	   attributes after). */
	/* A NULL atime (it reads as the mtime) keeps the value it read as
	   before: the new mtime is no access. */
	[ST_TOUCH_DIR] = "UPDATE inode SET mtime = ?2, ctime = ?2,"
			 " atime = coalesce(atime, mtime) WHERE ino = ?1",
	[ST_SET_CTIME] = "UPDATE inode SET ctime = ?2 WHERE ino = ?1",
	[ST_NLINK_ADD] = "UPDATE inode SET nlink = nlink + ?2, ctime = ?3 WHERE ino = ?1",
	/* Parameters as index_bind_attr() binds them (?6, nlink, unused),
	   and ?11 rdev. */
	[ST_SETATTR] = "UPDATE inode SET kind = ?2, mode = ?3, uid = ?4, gid = ?5, size = ?7,"
		       " mtime = ?8, ctime = ?9, atime = ?10, rdev = ?11 WHERE ino = ?1",
	[ST_INODE_DELETE] = "DELETE FROM inode WHERE ino = ?1",
	[ST_MSG_DELETE] = "DELETE FROM message WHERE ino = ?1",
	[ST_READDIR] = "SELECT e.id, e.name, " INDEX_ATTR_COLS " FROM entry e"
		       " JOIN inode i ON i.ino = e.ino"
		       " WHERE e.parent = ?1 AND e.id > ?2 ORDER BY e.id LIMIT 256",
	[ST_MSG_GET] = "SELECT file_id, offset, body_size, record_size, vsize, state, guid"
		       " FROM message WHERE ino = ?1",
	[ST_MSG_SET] = "INSERT OR REPLACE INTO message"
		       " (ino, file_id, offset, body_size, record_size, vsize, state, guid)"
		       " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
	/* The record a save began (same place and guid) now finished: the
	   row changes in place, the message_file index stays as it is. */
	[ST_MSG_FINISH] = "UPDATE message SET body_size = ?4, record_size = ?5,"
			  " vsize = ?6, state = ?7"
			  " WHERE ino = ?1 AND file_id = ?2 AND offset = ?3 AND guid = ?8",
	[ST_MSG_SET_STATE] = "UPDATE message SET state = ?2 WHERE ino = ?1",
	/* An upsert, not a REPLACE: the row keeps its alt flag. */
	[ST_MFILE_SET] = "INSERT INTO mfile (file_id, size) VALUES (?1, ?2)"
			 " ON CONFLICT (file_id) DO UPDATE SET size = excluded.size",
	[ST_MFILE_MAX] = "SELECT max(coalesce((SELECT max(file_id) FROM mfile), 0),"
			 " coalesce((SELECT value FROM meta WHERE key = '"
			 DBOX_META_MFILE_HIGH "'), 0))",
	[ST_MFILE_LIST] = "SELECT file_id, size FROM mfile ORDER BY file_id",
	[ST_MFILE_WHERE] = "SELECT size, alt FROM mfile WHERE file_id = ?1",
	[ST_MFILE_ADD_ALT] = "INSERT INTO mfile (file_id, size, alt) VALUES (?1, ?2, 1)",
	[ST_SETTING_GET] = "SELECT value FROM setting WHERE key = ?1",
	[ST_SETTING_SET] = "INSERT OR REPLACE INTO setting (key, value) VALUES (?1, ?2)",
	[ST_META_GET] = "SELECT value FROM meta WHERE key = ?1",
	[ST_META_SET] = "INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)",
	[ST_SYMLINK_SET] = "INSERT OR REPLACE INTO symlink (ino, target) VALUES (?1, ?2)",
	[ST_SYMLINK_GET] = "SELECT target FROM symlink WHERE ino = ?1",
	[ST_XATTR_GET] = "SELECT value FROM xattr WHERE ino = ?1 AND name = ?2",
	[ST_XATTR_INSERT] = "INSERT INTO xattr (ino, name, value) VALUES (?1, ?2, ?3)",
	[ST_XATTR_UPDATE] = "UPDATE xattr SET value = ?3 WHERE ino = ?1 AND name = ?2",
	[ST_XATTR_DELETE] = "DELETE FROM xattr WHERE ino = ?1 AND name = ?2",
	[ST_XATTR_LIST] = "SELECT name FROM xattr WHERE ino = ?1 ORDER BY name",
	[ST_XATTR_USAGE] = "SELECT coalesce(sum(length(name) + 1), 0),"
			   " coalesce(sum(length(name) + length(value)), 0)"
			   " FROM xattr WHERE ino = ?1 AND name != ?2",
	/* An inode's other rows, deleted with it (dbox_index_delete_inode;
	   no trigger runs: index_guard). */
	[ST_SYMLINK_DROP] = "DELETE FROM symlink WHERE ino = ?1",
	[ST_XATTR_DROP] = "DELETE FROM xattr WHERE ino = ?1",
};

void index_mark_damaged(struct dbox_index *index, const char *why)
{
	/* A read-only connection (dboxadm check, stats, ...) changes
	   nothing anyway: its caller reports the error. */
	if (__atomic_exchange_n(&index->damaged, 1, __ATOMIC_ACQ_REL) == 0 &&
	    !index->readonly)
		dbox_error("index %s is damaged (%s): no change is made to it "
			   "from now on (EIO); 'dboxadm check' names the damage "
			   "and 'dboxadm rebuild', with the store unmounted, "
			   "repairs it", index->path, why);
}

int index_sql_error(struct dbox_index *index, const char *what)
{
	int code = sqlite3_errcode(index->db) & 0xff;

	dbox_error("index %s: %s: %s", index->path, what,
		   sqlite3_errmsg(index->db));
	if (code == SQLITE_CORRUPT || code == SQLITE_NOTADB)
		index_mark_damaged(index, sqlite3_errmsg(index->db));
	/* A full disk is the client's to know (ENOSPC), not an I/O error;
	   so is a full quota, which SQLite reports as a write error with the
	   system errno EDQUOT. */
	if ((sqlite3_errcode(index->db) & 0xff) == SQLITE_FULL)
		return -ENOSPC;
	if ((sqlite3_errcode(index->db) & 0xff) == SQLITE_IOERR &&
	    (sqlite3_system_errno(index->db) == EDQUOT ||
	     sqlite3_system_errno(index->db) == ENOSPC))
		return -sqlite3_system_errno(index->db);
	return -EIO;
}

void index_autocommit_point(struct dbox_index *index, sqlite3_stmt *stmt)
{
	if (index->deferred && !index->in_op && !sqlite3_stmt_readonly(stmt))
		(void)dbox_index_commit_deferred(index);
}

sqlite3_stmt *index_stmt(struct dbox_index *index, enum index_stmt id)
{
	sqlite3_stmt *stmt = index->stmt[id];

	sqlite3_reset(stmt);
	sqlite3_clear_bindings(stmt);
	index_autocommit_point(index, stmt);
	return stmt;
}

int index_done(sqlite3_stmt *stmt, int ret)
{
	sqlite3_reset(stmt);
	return ret;
}

int index_exec_stmt(struct dbox_index *index, sqlite3_stmt *stmt,
		    const char *what)
{
	int rc = sqlite3_step(stmt);

	sqlite3_reset(stmt);
	if (rc != SQLITE_DONE && rc != SQLITE_ROW)
		return index_sql_error(index, what);
	return 0;
}

void index_row_attr(sqlite3_stmt *stmt, int col, struct dbox_attr *attr_r)
{
	attr_r->ino = sqlite3_column_int64(stmt, col);
	attr_r->kind = sqlite3_column_int(stmt, col + 1);
	attr_r->mode = sqlite3_column_int64(stmt, col + 2);
	attr_r->uid = sqlite3_column_int64(stmt, col + 3);
	attr_r->gid = sqlite3_column_int64(stmt, col + 4);
	attr_r->nlink = sqlite3_column_int64(stmt, col + 5);
	attr_r->size = sqlite3_column_int64(stmt, col + 6);
	attr_r->mtime_ns = sqlite3_column_int64(stmt, col + 7);
	attr_r->ctime_ns = sqlite3_column_int64(stmt, col + 8);
	attr_r->atime_ns = sqlite3_column_int64(stmt, col + 9);
	attr_r->rdev = sqlite3_column_int64(stmt, col + 10);
	attr_r->stored = sqlite3_column_int64(stmt, col + 11);
}

int index_step_attr(struct dbox_index *index, sqlite3_stmt *stmt, int col,
		    struct dbox_attr *attr_r, const char *what)
{
	int rc = sqlite3_step(stmt);

	if (rc == SQLITE_ROW) {
		index_row_attr(stmt, col, attr_r);
		return 0; /* the caller resets: it may read more columns */
	}
	return rc == SQLITE_DONE ? -ENOENT : index_sql_error(index, what);
}

void index_bind_attr(sqlite3_stmt *stmt, const struct dbox_attr *attr)
{
	sqlite3_bind_int64(stmt, 1, (int64_t)attr->ino);
	sqlite3_bind_int(stmt, 2, attr->kind);
	sqlite3_bind_int64(stmt, 3, attr->mode);
	sqlite3_bind_int64(stmt, 4, attr->uid);
	sqlite3_bind_int64(stmt, 5, attr->gid);
	sqlite3_bind_int64(stmt, 6, attr->nlink);
	sqlite3_bind_int64(stmt, 7, (int64_t)attr->size);
	sqlite3_bind_int64(stmt, 8, attr->mtime_ns);
	sqlite3_bind_int64(stmt, 9, attr->ctime_ns);
	sqlite3_bind_int64(stmt, 10, attr->atime_ns);
}

int64_t dbox_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return dbox_time_make(ts.tv_sec, ts.tv_nsec);
}

int index_exec_sql(struct dbox_index *index, enum dbox_log_level level,
		   const char *what, const char *sql)
{
	char *err = NULL;

	if (sqlite3_exec(index->db, sql, NULL, NULL, &err) != SQLITE_OK) {
		dbox_log(level, "index %s: %s%s%s", index->path,
			 what != NULL ? what : "", what != NULL ? ": " : "",
			 err != NULL ? err : "?");
		sqlite3_free(err);
		return -EIO;
	}
	return 0;
}

static int prepare_stmt(struct dbox_index *index, enum index_stmt id)
{
	if (sqlite3_prepare_v3(index->db, stmt_sql[id], -1,
			       SQLITE_PREPARE_PERSISTENT, &index->stmt[id],
			       NULL) != SQLITE_OK)
		return index_sql_error(index, stmt_sql[id]);
	return 0;
}

/* May this process create files in the directory of path (the -shm and
   -wal of a WAL database)? */
static bool dir_writable(const char *path)
{
	char *dir = strdup(path), *slash;
	bool ok;

	if (dir == NULL)
		return true;
	slash = strrchr(dir, '/');
	if (slash == dir)
		slash[1] = '\0';
	else if (slash != NULL)
		*slash = '\0';
	ok = faccessat(AT_FDCWD, slash != NULL ? dir : ".", W_OK,
		       AT_EACCESS) == 0;
	free(dir);
	return ok;
}

/* "file:" URI of path (characters outside [A-Za-z0-9/._~-] %-encoded,
   so '?', '#' and '%' in a store path stay the path's) with query, or
   NULL when out of memory. */
static char *file_uri(const char *path, const char *query)
{
	size_t len = strlen(path);
	char *uri = malloc(5 + len * 3 + 1 + strlen(query) + 1), *out;

	if (uri == NULL)
		return NULL;
	out = uri + sprintf(uri, "file:");
	for (const unsigned char *p = (const unsigned char *)path; *p != '\0'; p++) {
		if ((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
		    (*p >= '0' && *p <= '9') || strchr("/._~-", *p) != NULL)
			*out++ = (char)*p;
		else
			out += sprintf(out, "%%%02X", *p);
	}
	sprintf(out, "?%s", query);
	return uri;
}

/* Open index->db read-only (see dbox_index_open_readonly).  immutable=1
   promises SQLite that nobody changes the file: used when there is no
   WAL (so no connection is open on it, and the caller's store lock keeps
   writers away), where mode=ro would make index.sqlite-wal and -shm in
   a store that should be left as it is (helper-80: a backup mounted -o
   ro kept both), and on a read-only filesystem, where mode=ro fails
   without index.sqlite-shm.  Returns 0 or -EIO (logged). */
static int open_db_readonly(struct dbox_index *index, const char *path)
{
	static const char *const queries[] = { "mode=ro", "immutable=1" };
	const int flags = SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX |
		SQLITE_OPEN_NOFOLLOW | SQLITE_OPEN_URI;
	char *wal = NULL;
	struct statvfs vfs;
	struct stat sb;
	bool has_wal;

	if (asprintf(&wal, "%s-wal", path) < 0)
		return -ENOMEM;
	has_wal = stat(wal, &sb) == 0;
	for (size_t i = has_wal ? 0 : 1; i < 2; i++) {
		char *uri;
		int rc;

		if (i == 1 && has_wal &&
		    (statvfs(path, &vfs) < 0 || !(vfs.f_flag & ST_RDONLY))) {
			dbox_error("index %s: cannot open it read-only: %s-shm "
				   "is missing or unreadable, and with %s the "
				   "store may be in use", path, path, wal);
			free(wal);
			return -EIO;
		}
		if ((uri = file_uri(path, queries[i])) == NULL) {
			free(wal);
			return -ENOMEM;
		}
		rc = sqlite3_open_v2(uri, &index->db, flags, NULL);
		free(uri);
		/* The first read maps index.sqlite-shm (mode=ro). */
		if (rc == SQLITE_OK)
			rc = sqlite3_exec(index->db, "SELECT count(*) FROM "
					  "sqlite_master", NULL, NULL, NULL);
		if (rc == SQLITE_OK) {
			if (i == 1 && has_wal && sb.st_size > 0)
				dbox_warning("index %s: opened read-only without "
					     "its WAL (%s, %lld bytes, cannot be "
					     "read without %s-shm): what it "
					     "holds is not shown", path, wal,
					     (long long)sb.st_size, path);
			free(wal);
			return 0;
		}
		if (i == 1) {
			free(wal);
			return index_sql_error(index, "open read-only");
		}
		sqlite3_close(index->db);
		index->db = NULL;
	}
	free(wal);
	return -EIO;
}

static int index_open(const char *path, bool create, bool readonly,
		      struct dbox_index **index_r);

/* index->page_size from the file (PRAGMA page_size). */
static int read_page_size(struct dbox_index *index)
{
	sqlite3_stmt *stmt;
	int rc;

	if (sqlite3_prepare_v2(index->db, "PRAGMA page_size", -1, &stmt,
			       NULL) != SQLITE_OK)
		return index_sql_error(index, "page size");
	rc = sqlite3_step(stmt);
	if (rc == SQLITE_ROW)
		index->page_size = sqlite3_column_int(stmt, 0);
	sqlite3_finalize(stmt);
	if (rc != SQLITE_ROW || index->page_size < 512)
		return index_sql_error(index, "page size");
	return 0;
}

/* PRAGMA journal_mode=mode; 0 once the index is in that mode, -EBUSY
   when SQLite kept the one it had (another connection reads it). */
static int set_journal_mode(struct dbox_index *index, const char *mode)
{
	char sql[48];
	sqlite3_stmt *stmt;
	bool changed;
	int rc;

	snprintf(sql, sizeof(sql), "PRAGMA journal_mode=%s", mode);
	if (sqlite3_prepare_v2(index->db, sql, -1, &stmt, NULL) != SQLITE_OK)
		return index_sql_error(index, "journal mode");
	rc = sqlite3_step(stmt);
	changed = rc == SQLITE_ROW &&
		strcasecmp((const char *)sqlite3_column_text(stmt, 0), mode) == 0;
	sqlite3_finalize(stmt);
	if ((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED)
		return -EBUSY;
	if (rc != SQLITE_ROW && rc != SQLITE_DONE)
		return index_sql_error(index, "journal mode");
	return changed ? 0 : -EBUSY;
}

int dbox_index_convert_pages(struct dbox_index *index)
{
	struct statvfs fs;
	struct stat st;
	char sql[80];
	int ret, back;

	if (index->page_size == INDEX_PAGE_SIZE)
		return 0;
	if (stat(index->path, &st) < 0 || statvfs(index->path, &fs) < 0)
		return -errno;
	if ((uint64_t)st.st_size > INDEX_REWRITE_MAX) {
		dbox_warning("index %s: not rewritten with %d-byte pages: it "
			     "is %llu MiB, and the rewrite builds the new "
			     "one in memory (at most %d MiB); 'dboxadm "
			     "rebuild' writes a new index with them",
			     index->path, INDEX_PAGE_SIZE,
			     (unsigned long long)(st.st_size >> 20),
			     INDEX_REWRITE_MAX >> 20);
		return -EFBIG;
	}
	/* Room for the rollback journal (up to the whole file) and the
	   new file's growth, without the index reserve (reserve.h): that
	   is for clients' changes on a full disk, not for this. */
	if ((uint64_t)fs.f_bavail * fs.f_frsize < 2 * (uint64_t)st.st_size) {
		dbox_warning("index %s: not rewritten with %d-byte pages: "
			     "that needs %llu MiB free, the disk has %llu; "
			     "the next open tries again", index->path,
			     INDEX_PAGE_SIZE,
			     (unsigned long long)(2 * (uint64_t)st.st_size >> 20) + 1,
			     (unsigned long long)((uint64_t)fs.f_bavail *
						  fs.f_frsize >> 20));
		return -ENOSPC;
	}
	dbox_info("index %s: rewriting its %d-byte pages as %d-byte ones "
		  "(once; about 0.7 s per 100,000 messages)", index->path,
		  index->page_size, INDEX_PAGE_SIZE);
	if ((ret = set_journal_mode(index, "DELETE")) == 0) {
		/* VACUUM builds the new file as a temporary database, by
		   default a file in /var/tmp: in memory instead, so that a
		   store's owner cannot make root fill another filesystem
		   (the size is bounded above). */
		snprintf(sql, sizeof(sql), "PRAGMA temp_store=MEMORY;"
			 " PRAGMA page_size=%d; VACUUM;", INDEX_PAGE_SIZE);
		ret = index_exec_sql(index, DBOX_LOG_ERROR, NULL, sql);
		/* A failed VACUUM is rolled back and leaves the index as
		   it was: not -EIO, which the caller takes for an index
		   it cannot use. */
		if (ret < 0)
			ret = (sqlite3_errcode(index->db) & 0xff) ==
				SQLITE_FULL ? -ENOSPC : -EAGAIN;
		index_exec_sql(index, DBOX_LOG_ERROR, NULL,
			       "PRAGMA temp_store=DEFAULT;");
	} else if (ret != -EBUSY) {
		ret = -EAGAIN; /* still in WAL mode, as it was */
	}
	/* Back to WAL in any case: SQLite has rolled a failed VACUUM back. */
	if ((back = set_journal_mode(index, "WAL")) < 0 ||
	    (back = read_page_size(index)) < 0) {
		dbox_error("index %s: not back in WAL mode after rewriting "
			   "its pages", index->path);
		return -EIO;
	}
	if (ret < 0)
		dbox_warning("index %s: not rewritten (%s); it works as it "
			     "is, and the next open tries again", index->path,
			     strerror(-ret));
	return ret;
}

int dbox_index_open(const char *path, bool create, struct dbox_index **index_r)
{
	return index_open(path, create, !create && !dir_writable(path), index_r);
}

int dbox_index_open_readonly(const char *path, struct dbox_index **index_r)
{
	return index_open(path, false, true, index_r);
}

char *index_dir_real(const char *path)
{
	const char *slash = strrchr(path, '/');
	char *dir, *real, *out = NULL;

	if (slash == NULL)
		dir = strdup(".");
	else if (slash == path)
		dir = strdup("/");
	else
		dir = strndup(path, (size_t)(slash - path));
	real = dir != NULL ? realpath(dir, NULL) : NULL;
	if (real != NULL && asprintf(&out, "%s/%s", strcmp(real, "/") == 0 ?
				     "" : real, slash != NULL ? slash + 1 :
				     path) < 0)
		out = NULL;
	free(dir);
	free(real);
	return out;
}

/* Is path (not followed) a FIFO, socket or device?  (A symbolic link
   is SQLite's to refuse: SQLITE_OPEN_NOFOLLOW.) */
static bool special_file(const char *path)
{
	struct stat sb;

	return lstat(path, &sb) == 0 && !S_ISREG(sb.st_mode) &&
		!S_ISLNK(sb.st_mode);
}

/* index_open with path as index_dir_real made it. */
static int open_resolved(const char *path, bool create, bool readonly,
			 struct dbox_index **index_r)
{
	struct dbox_index *index;
	int64_t format;
	bool is_new;
	/* NOFOLLOW: an index that is a symbolic link is refused (the store's
	   owner could point it anywhere). */
	int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX |
		SQLITE_OPEN_NOFOLLOW;
	char pragma_sql[64];
	int ret;

	/* Only a missing file is "new": any other failure (EACCES on the
	   store directory, ELOOP...) is reported as itself. */
	is_new = access(path, F_OK) != 0;
	if (is_new && errno != ENOENT)
		return -errno;
	if (is_new && !create)
		return -ENOENT;
	/* Not a regular file (a FIFO the store's owner planted): SQLite's
	   open or first read would wait forever for a writer.  The reserve
	   VFS checks again at its own opens (index/reserve.c). */
	if (!is_new && special_file(path)) {
		dbox_error("%s: not a regular file; refusing it", path);
		return -EIO;
	}
	if (is_new)
		flags |= SQLITE_OPEN_CREATE;

	index = calloc(1, sizeof(*index));
	if (index == NULL || (index->path = strdup(path)) == NULL) {
		free(index);
		return -ENOMEM;
	}
	index->wal_sync.fd = -1;
	index->reserve_fd = -1;
	index->readonly = readonly;
	pthread_mutex_init(&index->wal_sync.mutex, NULL);
	pthread_cond_init(&index->wal_sync.cond, NULL);
	pthread_mutex_init(&index->ckpt.mutex, NULL);
	pthread_cond_init(&index->ckpt.cond, NULL);
	/* Read-only: the default VFS (nothing is written, no reserve). */
	if (readonly) {
		if ((ret = open_db_readonly(index, path)) < 0)
			goto fail;
	} else if (sqlite3_open_v2(path, &index->db, flags,
				   dbox_reserve_vfs()) != SQLITE_OK) {
		ret = index_sql_error(index, "open");
		goto fail;
	}
	sqlite3_extended_result_codes(index->db, 1);
	sqlite3_busy_timeout(index->db, 5000);
	if (index_guard(index->db) < 0) {
		ret = index_sql_error(index, "guard");
		goto fail;
	}
	/* Before anything writes the new file: the WAL fixes the page
	   size. */
	snprintf(pragma_sql, sizeof(pragma_sql), "PRAGMA page_size=%d;",
		 INDEX_PAGE_SIZE);
	if (is_new && (ret = index_exec_sql(index, DBOX_LOG_ERROR, NULL,
					    pragma_sql)) < 0)
		goto fail;
	/* journal_size_limit: each time the WAL starts over (after a
	   checkpoint) it is cut to DBOX_WAL_KEEP bytes; the blocks below
	   stay allocated for the next transactions (checkpoint.h).  A
	   read-only connection writes no WAL. */
	if ((ret = index_exec_sql(index, DBOX_LOG_ERROR, NULL, readonly ?
				  "PRAGMA cache_size=-32768;" :
				  "PRAGMA journal_mode=WAL;"
				  "PRAGMA synchronous=NORMAL;"
				  "PRAGMA foreign_keys=OFF;"
				  "PRAGMA cache_size=-32768;")) < 0)
		goto fail;
	snprintf(pragma_sql, sizeof(pragma_sql), "PRAGMA journal_size_limit=%d;",
		 DBOX_WAL_KEEP);
	if (!readonly && (ret = index_exec_sql(index, DBOX_LOG_ERROR, NULL,
					       pragma_sql)) < 0)
		goto fail;
	if (is_new && (ret = index_create_schema(index)) < 0)
		goto fail;
	/* The format before the other statements: a newer index may have a
	   schema they do not fit, and is refused as newer (-EPROTO), not as
	   unreadable (-EIO). */
	if ((ret = prepare_stmt(index, ST_META_GET)) < 0 ||
	    (ret = index_check_format(index, &format)) < 0 ||
	    (ret = index_upgrade_format(index, format)) < 0 ||
	    (ret = index_check_schema(index)) < 0 ||
	    (ret = read_page_size(index)) < 0)
		goto fail;
	if (!readonly)
		index_add_recovery_indexes(index);
	for (int i = 0; i < ST_COUNT; i++) {
		if (i != ST_META_GET && (ret = prepare_stmt(index, i)) < 0)
			goto fail;
	}
	*index_r = index;
	return 0;
fail:
	dbox_index_close(&index);
	return ret;
}

/* Room SQLite keeps after a database's path for the names of its side
   files ("-journal" is the longest): sqlite3PagerOpen refuses a path
   that leaves less in mxPathname. */
#define INDEX_SIDE_SUFFIX_MAX 8

int dbox_index_path_check(const char *path, const char *store)
{
	sqlite3_vfs *vfs = sqlite3_vfs_find(dbox_reserve_vfs());
	size_t len = strlen(path), max;

	if (vfs == NULL && (vfs = sqlite3_vfs_find(NULL)) == NULL)
		return 0;
	max = (size_t)vfs->mxPathname - INDEX_SIDE_SUFFIX_MAX;
	if (len <= max)
		return 0;
	if (store != NULL)
		dbox_error("%s: the store's path is too long for SQLite: its "
			   "index's path would be %zu bytes, at most %zu work;"
			   " move the store to a shorter path", store, len, max);
	else
		dbox_error("index %s: its path is too long for SQLite (%zu "
			   "bytes, at most %zu): move the store to a shorter "
			   "path", path, len, max);
	return -ENAMETOOLONG;
}

static int index_open(const char *path, bool create, bool readonly,
		      struct dbox_index **index_r)
{
	char *real = index_dir_real(path);
	int ret;

	if (real == NULL)
		return -errno;
	if ((ret = dbox_index_path_check(real, NULL)) < 0) {
		free(real);
		return ret;
	}
	ret = open_resolved(real, create, readonly, index_r);
	free(real);
	return ret;
}

void dbox_index_close(struct dbox_index **indexp)
{
	struct dbox_index *index = *indexp;

	if (index == NULL)
		return;
	*indexp = NULL;
	/* Deferred operations were acknowledged: commit them (a close
	   would roll them back). */
	assert(!index->in_op);
	(void)dbox_index_commit_deferred(index);
	dbox_index_verify_stop(index);
	dbox_index_checkpointer_stop(index);
	for (int i = 0; i < ST_COUNT; i++)
		sqlite3_finalize(index->stmt[i]);
	sqlite3_close(index->db);
	if (index->wal_sync.fd >= 0)
		close(index->wal_sync.fd);
	if (index->reserve_fd >= 0)
		close(index->reserve_fd);
	pthread_mutex_destroy(&index->wal_sync.mutex);
	pthread_cond_destroy(&index->wal_sync.cond);
	pthread_mutex_destroy(&index->ckpt.mutex);
	pthread_cond_destroy(&index->ckpt.cond);
	free(index->path);
	free(index);
}

/* Deferred operations were undone.  When some made inodes, the kernel
   still knows their numbers, which the next creates would be given
   again: no write transaction from now on (dbox_index_commit_later). */
static void index_deferred_undone(struct dbox_index *index)
{
	if (!index->deferred_inodes)
		return;
	index->deferred_inodes = false;
	if (__atomic_exchange_n(&index->stopped, 1, __ATOMIC_ACQ_REL) == 0)
		dbox_error("index %s: a failed commit undid files just created,"
			   " whose inode numbers the kernel still knows: no"
			   " change is made from now on (EIO); unmount the"
			   " store and mount it again", index->path);
}

/* SQLite rolls a transaction back by itself after some errors (a full
   disk or an I/O error in a statement or the COMMIT).  Deferred
   operations went with it: say so once, and forget them.  Returns
   whether they were lost. */
static bool index_deferred_lost(struct dbox_index *index)
{
	if (!index->deferred || !sqlite3_get_autocommit(index->db))
		return false;
	dbox_error("index %s: deferred changes rolled back by an error:"
		   " the last renames and creates may be undone", index->path);
	index->deferred = index->in_op = false;
	index_deferred_undone(index);
	return true;
}

int dbox_index_begin(struct dbox_index *index)
{
	int ret;

	/* A damaged index takes no more changes: a message acknowledged
	   into it could be lost to the damage (docs/durability.md). */
	if (index->in_op) {
		/* Operations do not nest; BEGIN inside BEGIN fails alike. */
		dbox_error("index %s: begin inside an operation", index->path);
		return -EIO;
	}
	(void)index_deferred_lost(index);
	if (__atomic_load_n(&index->damaged, __ATOMIC_ACQUIRE) ||
	    __atomic_load_n(&index->stopped, __ATOMIC_ACQUIRE))
		return -EIO;
	if (!index->deferred)
		return index_exec_stmt(index, index_stmt(index, ST_BEGIN),
				       "begin");
	/* Inside the deferred transaction: a savepoint, so that a rollback
	   undoes this operation only. */
	ret = index_exec_stmt(index, index_stmt(index, ST_SAVEPOINT), "begin");
	if (ret == 0)
		index->in_op = true;
	return ret;
}

/* Make every committed transaction durable: one fdatasync of the WAL
   (wal-sync.h, shared with syncs running at the same time; while the
   checkpointer runs, by its sync hook, which syncs the store's message
   bytes the rows name first), which holds every commit made so far (synchronous=NORMAL writes a commit's frames
   before it returns).  It used to commit a touch of the meta table
   under synchronous=FULL, relying on SQLite to sync the WAL for it; a
   touch that changed nothing wrote no frame and synced nothing, so a
   purge could remove an m.N before the switch naming its copies was on
   disk (helper-63). */
static int index_sync(struct dbox_index *index)
{
	return dbox_index_sync_all(index);
}

/* End the operation's savepoint, keeping its changes in the deferred
   transaction.  Returns 0 or -EIO (the whole transaction is then rolled
   back). */
static int index_release_op(struct dbox_index *index)
{
	int ret;

	if (!index->in_op)
		return 0;
	index->in_op = false;
	ret = index_exec_stmt(index, index_stmt(index, ST_RELEASE), "release");
	if (ret < 0)
		dbox_index_rollback_all(index);
	return ret;
}

int dbox_index_commit(struct dbox_index *index, bool durable)
{
	int ret;

	if ((ret = index_release_op(index)) < 0)
		return ret;
	ret = index_exec_stmt(index, index_stmt(index, ST_COMMIT), "commit");
	if (ret < 0) {
		if (index->deferred)
			dbox_error("index %s: the commit failed: the flag renames"
				   " deferred to it are undone", index->path);
		dbox_index_rollback_all(index);
		return ret;
	}
	index->deferred = index->deferred_inodes = false;
	__atomic_add_fetch(&index->commits, 1, __ATOMIC_RELEASE);
	return durable ? index_sync(index) : 0;
}

int dbox_index_commit_later(struct dbox_index *index, bool made_inodes)
{
	int ret;

	if (index_deferred_lost(index))
		return -EIO;
	/* Before the release: a failed release undoes this operation's
	   inodes too. */
	index->deferred_inodes |= made_inodes;
	if ((ret = index_release_op(index)) < 0)
		return ret;
	assert(!sqlite3_get_autocommit(index->db));
	index->deferred = true;
	return 0;
}

bool dbox_index_deferred(const struct dbox_index *index)
{
	return index->deferred;
}

int dbox_index_commit_deferred(struct dbox_index *index)
{
	assert(!index->in_op);
	if (!index->deferred || index_deferred_lost(index))
		return 0;
	return dbox_index_commit(index, false);
}

int dbox_index_sync(struct dbox_index *index)
{
	return index_sync(index);
}

void dbox_index_rollback(struct dbox_index *index)
{
	if (index->in_op) {
		/* This operation only: the deferred ones before it stay.
		   ROLLBACK TO calls no rollback hook: the attribute cache
		   drops what it read inside, as a rollback makes it. */
		index->in_op = false;
		sqlite3_step(index_stmt(index, ST_ROLLBACK_TO));
		sqlite3_reset(index->stmt[ST_ROLLBACK_TO]);
		sqlite3_step(index_stmt(index, ST_RELEASE));
		sqlite3_reset(index->stmt[ST_RELEASE]);
		index_attr_cache_drop(index);
		(void)index_deferred_lost(index);
		return;
	}
	if (index->deferred)
		return; /* no operation open: the deferred ones are not its */
	dbox_index_rollback_all(index);
}

void dbox_index_rollback_all(struct dbox_index *index)
{
	index_deferred_undone(index);
	index->deferred = index->in_op = false;
	if (!sqlite3_get_autocommit(index->db))
		sqlite3_step(index_stmt(index, ST_ROLLBACK));
	sqlite3_reset(index->stmt[ST_ROLLBACK]);
}

int dbox_index_meta_get(struct dbox_index *index, const char *key,
			int64_t *value_r)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_META_GET);
	int rc;

	sqlite3_bind_text(stmt, 1, key, -1, SQLITE_STATIC);
	rc = sqlite3_step(stmt);
	if (rc == SQLITE_ROW) {
		*value_r = sqlite3_column_int64(stmt, 0);
		return index_done(stmt, 0);
	}
	return rc == SQLITE_DONE ? -ENOENT : index_sql_error(index, "meta");
}

int dbox_index_meta_set(struct dbox_index *index, const char *key,
			int64_t value)
{
	sqlite3_stmt *stmt = index_stmt(index, ST_META_SET);

	sqlite3_bind_text(stmt, 1, key, -1, SQLITE_STATIC);
	sqlite3_bind_int64(stmt, 2, value);
	return index_exec_stmt(index, stmt, "meta");
}
