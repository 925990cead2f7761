/*
 * index-backup.c: one-snapshot copy of the index with SQLite's online
 * backup API (see index-backup.h).
 *
 * One sqlite3_backup_step(-1) copies every page inside one read
 * transaction of the source: one WAL snapshot, no restart when the mount
 * commits meanwhile (a WAL reader is never disturbed by a writer), and
 * the mount's checkpoints wait for nothing longer than the page copy.
 * The lists are then read from the copy itself, which is that snapshot.
 */
#include "index-backup.h"
#include "index-private.h"
#include "reserve.h"

#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The SQL below spells these out. */
_Static_assert(DBOX_KIND_FILE == 3, "kind = 3 in the SQL");
_Static_assert(DBOX_MSG_COMMITTED == 0, "state = 0 in the SQL");

void dbox_index_snapshot_free(struct dbox_index_snapshot *snap)
{
	free(snap->mfiles);
	free(snap->files);
	memset(snap, 0, sizeof(*snap));
}

/* Run sql on db (the copy at path) and call row(snap, stmt) per row.
   Returns 0 or -EIO (logged) / -ENOMEM. */
static int each_row(sqlite3 *db, const char *path, const char *sql,
		    int (*row)(struct dbox_index_snapshot *, sqlite3_stmt *),
		    struct dbox_index_snapshot *snap)
{
	sqlite3_stmt *stmt;
	int rc = SQLITE_OK, ret = 0;

	if (sqlite3_prepare_v2(db, sql, -1, &stmt, NULL) != SQLITE_OK) {
		dbox_error("index copy %s: %s", path, sqlite3_errmsg(db));
		return -EIO;
	}
	while (ret == 0 && (rc = sqlite3_step(stmt)) == SQLITE_ROW)
		ret = row(snap, stmt);
	if (ret == 0 && rc != SQLITE_DONE) {
		dbox_error("index copy %s: %s", path, sqlite3_errmsg(db));
		ret = -EIO;
	}
	sqlite3_finalize(stmt);
	return ret;
}

static int mfile_row(struct dbox_index_snapshot *snap, sqlite3_stmt *stmt)
{
	struct dbox_snapshot_mfile *m;
	sqlite3_int64 id = sqlite3_column_int64(stmt, 0);
	sqlite3_int64 size = sqlite3_column_int64(stmt, 1);
	sqlite3_int64 end = sqlite3_column_int64(stmt, 2);

	if (id <= 0 || id > UINT32_MAX)
		return 0; /* not a file this store can have; check reports it */
	m = realloc(snap->mfiles, (snap->nmfiles + 1) * sizeof(*m));
	if (m == NULL)
		return -ENOMEM;
	snap->mfiles = m;
	m[snap->nmfiles].file_id = (uint32_t)id;
	m[snap->nmfiles].size = size < 0 ? 0 : (uint64_t)size;
	m[snap->nmfiles].records_end = end < 0 ? 0 : (uint64_t)end;
	m[snap->nmfiles].size_bad = size < 0;
	snap->nmfiles++;
	return 0;
}

static int file_row(struct dbox_index_snapshot *snap, sqlite3_stmt *stmt)
{
	sqlite3_int64 ino = sqlite3_column_int64(stmt, 0);
	uint64_t *f;

	if (ino <= 0)
		return 0;
	f = realloc(snap->files, (snap->nfiles + 1) * sizeof(*f));
	if (f == NULL)
		return -ENOMEM;
	snap->files = f;
	f[snap->nfiles++] = (uint64_t)ino;
	return 0;
}

static int count_row(struct dbox_index_snapshot *snap, sqlite3_stmt *stmt)
{
	snap->messages = (uint64_t)sqlite3_column_int64(stmt, 0);
	return 0;
}

/* Copy every page of src's main database into a new file dest_path, in
   one step (one read transaction on src), and list what it refers to. */
static int copy_pages(struct dbox_index *src, const char *dest_path,
		      struct dbox_index_snapshot *snap_r)
{
	sqlite3_backup *bk;
	sqlite3 *dest = NULL;
	char *real;
	int fd, rc, ret = 0;

	/* Created here, private (0600) whatever the umask: the index holds
	   every name of the store. */
	fd = open(dest_path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW |
		  O_CLOEXEC, 0600);
	if (fd < 0) {
		if (errno != EEXIST)
			dbox_error("index copy %s: %s", dest_path,
				   strerror(errno));
		return -errno;
	}
	close(fd);
	if ((real = index_dir_real(dest_path)) == NULL)
		return -errno;
	rc = sqlite3_open_v2(real, &dest, SQLITE_OPEN_READWRITE |
			     SQLITE_OPEN_CREATE | SQLITE_OPEN_NOFOLLOW,
			     dbox_reserve_vfs());
	free(real);
	if (rc != SQLITE_OK) {
		dbox_error("index copy %s: open: %s", dest_path,
			   dest != NULL ? sqlite3_errmsg(dest) :
			   sqlite3_errstr(rc));
		sqlite3_close(dest);
		return -EIO;
	}
	bk = sqlite3_backup_init(dest, "main", src->db, "main");
	if (bk == NULL) {
		dbox_error("index copy %s: %s", dest_path, sqlite3_errmsg(dest));
		sqlite3_close(dest);
		return -EIO;
	}
	rc = sqlite3_backup_step(bk, -1);
	if (rc != SQLITE_DONE) {
		dbox_error("index copy %s: %s", dest_path, sqlite3_errstr(rc));
		ret = (rc & 0xff) == SQLITE_FULL ? -ENOSPC : -EIO;
	}
	rc = sqlite3_backup_finish(bk);
	if (ret == 0 && rc != SQLITE_OK) {
		dbox_error("index copy %s: %s", dest_path, sqlite3_errmsg(dest));
		ret = -EIO;
	}
	/* What the snapshot refers to, read from the copy: the same rows,
	   and its pages were just written (in the page cache), while the
	   source's may have to come from disk (scans of 1M rows). */
	if (ret == 0)
		ret = each_row(dest, dest_path, "SELECT f.file_id, f.size,"
			       " (SELECT max(m.offset + m.record_size) FROM"
			       " message m WHERE m.file_id = f.file_id AND"
			       " m.state = 0) FROM mfile f ORDER BY f.file_id",
			       mfile_row, snap_r);
	if (ret == 0)
		ret = each_row(dest, dest_path, "SELECT ino FROM inode WHERE"
			       " kind = 3 AND nlink > 0 ORDER BY ino", file_row,
			       snap_r);
	if (ret == 0)
		ret = each_row(dest, dest_path, "SELECT count(*) FROM message"
			       " WHERE state = 0", count_row, snap_r);
	if (sqlite3_close(dest) != SQLITE_OK && ret == 0)
		ret = -EIO;
	return ret;
}

int dbox_index_backup(struct dbox_index *src, const char *dest_path,
		      struct dbox_index_snapshot *snap_r)
{
	int ret;

	memset(snap_r, 0, sizeof(*snap_r));
	ret = copy_pages(src, dest_path, snap_r);
	if (ret < 0)
		dbox_index_snapshot_free(snap_r);
	return ret;
}

int dbox_index_backup_detach(struct dbox_index *index)
{
	char *err = NULL;

	if (sqlite3_exec(index->db, "BEGIN IMMEDIATE;"
			 "UPDATE mfile SET alt = 0 WHERE alt <> 0;"
			 "DELETE FROM setting WHERE key IN ('"
			 DBOX_SETTING_ALT_PATH "', '" DBOX_SETTING_ALT_ID "');"
			 "DELETE FROM meta WHERE key LIKE 'inflight.m.%'"
			 " OR key LIKE 'kept.m.%' OR key LIKE 'uncut.m.%'"
			 " OR key LIKE 'uncut_size.m.%';"
			 "COMMIT", NULL, NULL, &err) != SQLITE_OK) {
		dbox_error("index copy: %s", err != NULL ? err :
			   sqlite3_errmsg(index->db));
		sqlite3_free(err);
		(void)sqlite3_exec(index->db, "ROLLBACK", NULL, NULL, NULL);
		return -EIO;
	}
	return 0;
}
