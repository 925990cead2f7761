/*
 * wal-write.c: a VFS over SQLite's "unix" VFS that gathers the WAL
 * frames of a commit into one write (wal-write.h says why it is safe).
 *
 * Facts used, from SQLite's documentation of the VFS interface
 * (sqlite.org/c3ref/vfs.html, c3ref/io_methods.html) and of the WAL
 * (sqlite.org/wal.html, fileformat2.html section 4): xOpen is given
 * SQLITE_OPEN_WAL for a WAL file; sqlite3_database_file_object() maps the
 * name xOpen got for a WAL to the database's sqlite3_file; a frame is a
 * 24-byte header and a page, and bytes 4-7 of the header (big-endian) are
 * the database size in pages for the commit frame of a transaction and
 * zero for every other frame; WAL-index readers compare two copies of
 * the header and writers separate them with xShmBarrier.
 *
 * Errors: the gathered bytes are written at the latest when the page of a
 * commit frame is written, in that xWrite, so a failure (a full disk)
 * fails the COMMIT as a failed pwrite() would, before anything announces
 * the transaction.
 */
#include "wal-write.h"

#include "storage/log.h"

#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Gathered bytes past this are written out (29 frames of 4 KiB pages).
   Below 128 KiB: SQLite's unix VFS (3.40, seekAndWriteFd) writes at most
   0x1ffff bytes of one xWrite and reports a longer one as a full disk. */
#define WAL_GATHER_MAX (120 * 1024)

struct wal_file;

/* Every file this VFS opens: the real (unix) file follows the struct. */
struct vfs_file {
	sqlite3_file base;
	sqlite3_file *real;
	struct wal_file *wal;  /* database file: its WAL file while open */
	struct vfs_file *db;   /* WAL file: its database file, or NULL */
};

/* A WAL file: the bytes gathered since the last write, from off. */
struct wal_file {
	struct vfs_file f;
	unsigned char *buf;
	size_t len;
	sqlite3_int64 off;
	bool commit_frame; /* the last write was a commit frame's header */
};

static sqlite3_vfs wal_vfs;
static sqlite3_vfs *unix_vfs;

#define REAL(file) (((struct vfs_file *)(file))->real)

/* Write the gathered bytes out.  SQLITE_OK or the write's error (the
   bytes are dropped then: SQLite fails the transaction). */
static int wal_flush(struct wal_file *w)
{
	int rc = SQLITE_OK;

	if (w->len > 0) {
		rc = w->f.real->pMethods->xWrite(w->f.real, w->buf, (int)w->len,
						 w->off);
		w->len = 0;
	}
	return rc;
}

static int x_close(sqlite3_file *file)
{
	struct vfs_file *f = (struct vfs_file *)file;
	int rc;

	if (f->db != NULL) {
		struct wal_file *w = (struct wal_file *)f;

		wal_flush(w);
		free(w->buf);
		if (f->db->wal == w)
			f->db->wal = NULL;
	}
	if (f->wal != NULL) {
		wal_flush(f->wal);
		f->wal->f.db = NULL;
	}
	rc = f->real->pMethods != NULL ? f->real->pMethods->xClose(f->real) :
		SQLITE_OK;
	return rc;
}

static int x_read(sqlite3_file *file, void *buf, int n, sqlite3_int64 off)
{
	struct vfs_file *f = (struct vfs_file *)file;
	int rc;

	if (f->db != NULL && (rc = wal_flush((struct wal_file *)f)) != SQLITE_OK)
		return rc;
	return f->real->pMethods->xRead(f->real, buf, n, off);
}

static int x_write(sqlite3_file *file, const void *buf, int n,
		   sqlite3_int64 off)
{
	struct vfs_file *f = (struct vfs_file *)file;
	struct wal_file *w = (struct wal_file *)f;
	int rc;

	if (f->db == NULL || w->buf == NULL)
		return f->real->pMethods->xWrite(f->real, buf, n, off);
	if (w->commit_frame) {
		/* The page of a commit frame: out with everything now. */
		w->commit_frame = false;
		if (w->len > 0 && off == w->off + (sqlite3_int64)w->len &&
		    w->len + (size_t)n <= WAL_GATHER_MAX) {
			memcpy(w->buf + w->len, buf, n);
			w->len += n;
			return wal_flush(w);
		}
		if ((rc = wal_flush(w)) != SQLITE_OK)
			return rc;
		return f->real->pMethods->xWrite(f->real, buf, n, off);
	}
	if (n == 24) {
		const unsigned char *h = buf;

		w->commit_frame = (h[4] | h[5] | h[6] | h[7]) != 0;
	}
	/* Not right after the gathered bytes, or past the limit: write the
	   gathered bytes first. */
	if (w->len > 0 && (off != w->off + (sqlite3_int64)w->len ||
			   w->len + (size_t)n > WAL_GATHER_MAX) &&
	    (rc = wal_flush(w)) != SQLITE_OK)
		return rc;
	if ((size_t)n > WAL_GATHER_MAX)
		return f->real->pMethods->xWrite(f->real, buf, n, off);
	if (w->len == 0)
		w->off = off;
	memcpy(w->buf + w->len, buf, n);
	w->len += n;
	return SQLITE_OK;
}

static int x_truncate(sqlite3_file *file, sqlite3_int64 size)
{
	struct vfs_file *f = (struct vfs_file *)file;
	int rc;

	if (f->db != NULL && (rc = wal_flush((struct wal_file *)f)) != SQLITE_OK)
		return rc;
	return f->real->pMethods->xTruncate(f->real, size);
}

static int x_sync(sqlite3_file *file, int flags)
{
	struct vfs_file *f = (struct vfs_file *)file;
	int rc;

	if (f->db != NULL && (rc = wal_flush((struct wal_file *)f)) != SQLITE_OK)
		return rc;
	return f->real->pMethods->xSync(f->real, flags);
}

static int x_file_size(sqlite3_file *file, sqlite3_int64 *size)
{
	struct vfs_file *f = (struct vfs_file *)file;
	int rc;

	if (f->db != NULL && (rc = wal_flush((struct wal_file *)f)) != SQLITE_OK)
		return rc;
	return f->real->pMethods->xFileSize(f->real, size);
}

static int x_lock(sqlite3_file *file, int lock)
{
	return REAL(file)->pMethods->xLock(REAL(file), lock);
}

static int x_unlock(sqlite3_file *file, int lock)
{
	return REAL(file)->pMethods->xUnlock(REAL(file), lock);
}

static int x_check_reserved(sqlite3_file *file, int *out)
{
	return REAL(file)->pMethods->xCheckReservedLock(REAL(file), out);
}

static int x_file_control(sqlite3_file *file, int op, void *arg)
{
	struct vfs_file *f = (struct vfs_file *)file;
	int rc;

	if (f->db != NULL && (rc = wal_flush((struct wal_file *)f)) != SQLITE_OK)
		return rc;
	return f->real->pMethods->xFileControl(f->real, op, arg);
}

static int x_sector_size(sqlite3_file *file)
{
	return REAL(file)->pMethods->xSectorSize(REAL(file));
}

static int x_device_characteristics(sqlite3_file *file)
{
	return REAL(file)->pMethods->xDeviceCharacteristics(REAL(file));
}

static int x_shm_map(sqlite3_file *file, int page, int size, int extend,
		     void volatile **p)
{
	return REAL(file)->pMethods->xShmMap(REAL(file), page, size, extend, p);
}

static int x_shm_lock(sqlite3_file *file, int offset, int n, int flags)
{
	return REAL(file)->pMethods->xShmLock(REAL(file), offset, n, flags);
}

/* Between the two copies of a new WAL-index header: the frames it
   announces are in the file already (written with the commit frame);
   anything still gathered goes out too, before a reader can look. */
static void x_shm_barrier(sqlite3_file *file)
{
	struct vfs_file *f = (struct vfs_file *)file;

	if (f->wal != NULL && f->wal->len > 0 && wal_flush(f->wal) != SQLITE_OK)
		dbox_error("index WAL: frames not written before a barrier");
	f->real->pMethods->xShmBarrier(f->real);
}

static int x_shm_unmap(sqlite3_file *file, int delete)
{
	return REAL(file)->pMethods->xShmUnmap(REAL(file), delete);
}

static int x_fetch(sqlite3_file *file, sqlite3_int64 off, int n, void **p)
{
	return REAL(file)->pMethods->xFetch(REAL(file), off, n, p);
}

static int x_unfetch(sqlite3_file *file, sqlite3_int64 off, void *p)
{
	return REAL(file)->pMethods->xUnfetch(REAL(file), off, p);
}

static const sqlite3_io_methods io_methods = {
	.iVersion = 3,
	.xClose = x_close,
	.xRead = x_read,
	.xWrite = x_write,
	.xTruncate = x_truncate,
	.xSync = x_sync,
	.xFileSize = x_file_size,
	.xLock = x_lock,
	.xUnlock = x_unlock,
	.xCheckReservedLock = x_check_reserved,
	.xFileControl = x_file_control,
	.xSectorSize = x_sector_size,
	.xDeviceCharacteristics = x_device_characteristics,
	.xShmMap = x_shm_map,
	.xShmLock = x_shm_lock,
	.xShmBarrier = x_shm_barrier,
	.xShmUnmap = x_shm_unmap,
	.xFetch = x_fetch,
	.xUnfetch = x_unfetch,
};

static int x_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *file,
		  int flags, int *out_flags)
{
	struct wal_file *w = (struct wal_file *)file;
	struct vfs_file *f = &w->f;
	int rc;

	(void)vfs;
	memset(w, 0, sizeof(*w));
	f->real = (sqlite3_file *)(w + 1);
	rc = unix_vfs->xOpen(unix_vfs, name, f->real, flags, out_flags);
	if (rc != SQLITE_OK)
		return rc;
	/* Only SQLite's own "unix" files of version 3 are wrapped (every
	   method above forwards to them). */
	if (f->real->pMethods == NULL || f->real->pMethods->iVersion < 3) {
		if (f->real->pMethods != NULL)
			f->real->pMethods->xClose(f->real);
		return SQLITE_CANTOPEN;
	}
	if ((flags & SQLITE_OPEN_WAL) && name != NULL) {
		struct vfs_file *db =
			(struct vfs_file *)sqlite3_database_file_object(name);

		/* Gathering needs the database file's barrier; without it
		   (a database of another VFS) writes go straight through. */
		if (db != NULL && db->base.pMethods == &io_methods &&
		    (w->buf = malloc(WAL_GATHER_MAX)) != NULL) {
			f->db = db;
			db->wal = w;
		}
	}
	f->base.pMethods = &io_methods;
	return SQLITE_OK;
}

static int x_delete(sqlite3_vfs *vfs, const char *name, int sync_dir)
{
	return unix_vfs->xDelete(unix_vfs, name, sync_dir);
}

static int x_access(sqlite3_vfs *vfs, const char *name, int flags, int *out)
{
	return unix_vfs->xAccess(unix_vfs, name, flags, out);
}

static int x_full_pathname(sqlite3_vfs *vfs, const char *name, int n,
			   char *out)
{
	return unix_vfs->xFullPathname(unix_vfs, name, n, out);
}

static int x_randomness(sqlite3_vfs *vfs, int n, char *out)
{
	return unix_vfs->xRandomness(unix_vfs, n, out);
}

static int x_sleep(sqlite3_vfs *vfs, int us)
{
	return unix_vfs->xSleep(unix_vfs, us);
}

static int x_current_time(sqlite3_vfs *vfs, double *t)
{
	return unix_vfs->xCurrentTime(unix_vfs, t);
}

static int x_get_last_error(sqlite3_vfs *vfs, int n, char *out)
{
	return unix_vfs->xGetLastError(unix_vfs, n, out);
}

static int x_current_time_int64(sqlite3_vfs *vfs, sqlite3_int64 *t)
{
	return unix_vfs->xCurrentTimeInt64(unix_vfs, t);
}

static int register_result = -EIO;
static pthread_once_t register_once = PTHREAD_ONCE_INIT;

static void do_register(void)
{
	unix_vfs = sqlite3_vfs_find("unix");
	if (unix_vfs == NULL || unix_vfs->iVersion < 2)
		return;
	wal_vfs = (sqlite3_vfs){
		.iVersion = 2,
		.szOsFile = (int)sizeof(struct wal_file) + unix_vfs->szOsFile,
		.mxPathname = unix_vfs->mxPathname,
		.zName = DBOX_WAL_VFS,
		.xOpen = x_open,
		.xDelete = x_delete,
		.xAccess = x_access,
		.xFullPathname = x_full_pathname,
		.xRandomness = x_randomness,
		.xSleep = x_sleep,
		.xCurrentTime = x_current_time,
		.xGetLastError = x_get_last_error,
		.xCurrentTimeInt64 = x_current_time_int64,
	};
	register_result = sqlite3_vfs_register(&wal_vfs, 0) == SQLITE_OK ?
		0 : -EIO;
}

int dbox_wal_vfs_register(void)
{
	pthread_once(&register_once, do_register);
	return register_result;
}
