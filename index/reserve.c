/*
 * reserve.c: the index reserve and the SQLite VFS that draws on it (see
 * reserve.h).
 *
 * The VFS wraps every file SQLite opens through it: a struct rfile
 * followed by the default VFS's own file object.  Every method is passed
 * through; writes (and the size hint and shared-memory growth, which
 * allocate too) that fail with a full disk release a chunk of the reserve
 * and run again.  The VFS keeps no state of its own: the reserve of a
 * file is <its database's name>-reserve, opened only when needed.
 *
 * The writes of a WAL go through a wal_batch (wal-batch.h): one write per
 * transaction instead of two per frame.  Its file flushes the batch before
 * every other method, and the database file flushes its WAL's batch before
 * it releases a wal-index lock (a transaction that wrote frames without
 * committing, then rolled back, leaves them held; once the write lock is
 * free another connection may write there, and they must not land later).
 *
 * Threads: a connection's database and WAL file objects are used by one
 * thread at a time.  The index opens its connections with
 * SQLITE_OPEN_NOMUTEX and calls each from one thread at a time (the main
 * one under the store lock, the checkpointer's from its own thread,
 * checkpoint.c); the link between a database and its WAL file objects
 * below is touched only by calls on that one connection.
 */
#include "index-private.h"
#include "read-ahead.h"
#include "reserve.h"
#include "wal-batch.h"

#include "storage/log.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

/* What a failed write of the reserve VFS's files needs: more space. */
static bool is_full(int rc)
{
	return rc == SQLITE_FULL || rc == SQLITE_IOERR_SHMSIZE;
}

/* Chunks of any reserve this process gave back (atomic): a change tells
   dbox_index_reserve_check to look at its reserve again at once. */
static uint64_t releases;

/* Give DBOX_RESERVE_CHUNK bytes of the reserve at path back to the
   filesystem.  Returns true when something was given back. */
static bool reserve_release(const char *path)
{
	struct stat st;
	off_t size;
	int fd;

	if (path == NULL)
		return false;
	fd = open(path, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return false;
	if (fstat(fd, &st) < 0 || st.st_size <= 0) {
		close(fd);
		return false;
	}
	size = st.st_size > DBOX_RESERVE_CHUNK ?
		st.st_size - DBOX_RESERVE_CHUNK : 0;
	if (ftruncate(fd, size) < 0) {
		dbox_error("%s: ftruncate: %s", path, strerror(errno));
		close(fd);
		return false;
	}
	/* ext4 reuses freed blocks only once the freeing is committed. */
	fsync(fd);
	close(fd);
	__atomic_add_fetch(&releases, 1, __ATOMIC_RELEASE);
	dbox_warning("%s: the disk is full; %lld KiB of the index reserve "
		     "used for the index (%lld KiB left); new mail waits until "
		     "there is room again (expunge and purge)", path,
		     (long long)(st.st_size - size) / 1024, (long long)size / 1024);
	return true;
}

struct rfile {
	sqlite3_file base;
	char *reserve;        /* path of the reserve, or NULL */
	sqlite3_file *real;   /* the default VFS's file, right after us */
	bool batched;         /* a WAL whose writes go through batch */
	struct wal_batch batch;
	struct rfile *wal;    /* database: its WAL's file object, or NULL */
	struct rfile *db;     /* WAL: its database's file object, or NULL */
	bool is_db;           /* a main database: reads through ra */
	bool is_wal;          /* a WAL */
	int (*sync_by)(void *ctx); /* WAL: what its syncs run instead of
				      fdatasync (dbox_reserve_wal_sync_by),
				      or NULL */
	void *sync_ctx;
	struct read_ahead ra; /* read-ahead.h; dropped at every lock change,
				 write and truncate */
};

/* The file object sizes are multiples of 8: real stays aligned. */
#define RFILE_SIZE ((sizeof(struct rfile) + 7) & ~(size_t)7)

static sqlite3_vfs *real_vfs;

static sqlite3_file *real_of(sqlite3_file *f)
{
	return ((struct rfile *)f)->real;
}

/* Write what the WAL batch of rf holds (nothing for other files): before
   any method but xWrite, so SQLite never finds the file without its
   writes.  Returns SQLITE_OK or the write's result code; the batch keeps
   what a failed write did not write, for the next flush. */
static int flush(struct rfile *rf)
{
	return rf->batched ? wal_batch_flush(&rf->batch) : SQLITE_OK;
}

static int r_close(sqlite3_file *f)
{
	struct rfile *rf = (struct rfile *)f;
	int frc = flush(rf);
	int rc = rf->real->pMethods->xClose(rf->real);

	if (rf->batched)
		wal_batch_free(&rf->batch);
	read_ahead_free(&rf->ra);
	if (rf->db != NULL)
		rf->db->wal = NULL;
	if (rf->wal != NULL)
		rf->wal->db = NULL;
	free(rf->reserve);
	rf->reserve = NULL;
	return frc != SQLITE_OK ? frc : rc;
}

/* The real write, run again while the disk is full and the reserve gives
   a chunk back (the write function of the WAL batch, too). */
static int write_real(void *ctx, const void *buf, int amt, sqlite3_int64 off)
{
	struct rfile *rf = ctx;
	int rc;

	while (is_full(rc = rf->real->pMethods->xWrite(rf->real, buf, amt, off)) &&
	       reserve_release(rf->reserve))
		;
	return rc;
}

static int r_write(sqlite3_file *f, const void *buf, int amt,
		   sqlite3_int64 off)
{
	struct rfile *rf = (struct rfile *)f;

	if (rf->batched)
		return wal_batch_write(&rf->batch, buf, amt, off);
	read_ahead_forget(&rf->ra);
	return write_real(rf, buf, amt, off);
}

static int r_read(sqlite3_file *f, void *buf, int amt, sqlite3_int64 off)
{
	struct rfile *rf = (struct rfile *)f;
	int rc = flush(rf);

	if (rc != SQLITE_OK)
		return rc;
	if (rf->is_db)
		return read_ahead_read(&rf->ra, rf->real, buf, amt, off);
	return rf->real->pMethods->xRead(rf->real, buf, amt, off);
}

/* The methods the reserve leaves alone: each writes what a WAL batch
   holds (a failure is the method's result) and passes the call through
   to the same method of the real file.  One entry each: the name, the
   method, the parameters after the file and their names (LIST() groups
   several). */
#define PASS_THROUGH(name, method, params, args)			\
	static int name(sqlite3_file *f, params)			\
	{								\
		int rc = flush((struct rfile *)f);			\
									\
		if (rc != SQLITE_OK)					\
			return rc;					\
		return real_of(f)->pMethods->method(real_of(f), args);	\
	}
/* Methods that only describe the device: nothing to flush (and no way to
   return a failure). */
#define PASS_THROUGH_NO_ARGS(type, name, method)			\
	static type name(sqlite3_file *f)				\
	{								\
		return real_of(f)->pMethods->method(real_of(f));	\
	}
#define LIST(...) __VA_ARGS__

PASS_THROUGH(r_file_size, xFileSize, sqlite3_int64 *size_r, size_r)
PASS_THROUGH(r_check_reserved_lock, xCheckReservedLock, int *out, out)
PASS_THROUGH(r_shm_unmap, xShmUnmap, int delete_flag, delete_flag)
PASS_THROUGH_NO_ARGS(int, r_sector_size, xSectorSize)
PASS_THROUGH_NO_ARGS(int, r_device_characteristics, xDeviceCharacteristics)

/* A sync passes through, but a WAL's runs its sync_by instead when it
   has one: SQLite's own syncs of the WAL (a checkpoint's, before it
   copies; the header's at a restart) then sync what its rows point at
   first (dbox_reserve_wal_sync_by). */
static int r_sync(sqlite3_file *f, int flags)
{
	struct rfile *rf = (struct rfile *)f;
	int rc = flush(rf);

	if (rc != SQLITE_OK)
		return rc;
	if (rf->sync_by != NULL)
		return rf->sync_by(rf->sync_ctx) == 0 ? SQLITE_OK :
							SQLITE_IOERR_FSYNC;
	return rf->real->pMethods->xSync(rf->real, flags);
}

/* Truncate and lock changes pass through as above, and drop what the
   database's read-ahead holds: a lock change starts or ends a
   transaction (read-ahead.h). */
#define PASS_THROUGH_FORGET(name, method, type, param)			\
	static int name(sqlite3_file *f, type param)			\
	{								\
		struct rfile *rf = (struct rfile *)f;			\
		int rc = flush(rf);					\
									\
		read_ahead_forget(&rf->ra);				\
		if (rc != SQLITE_OK)					\
			return rc;					\
		return rf->real->pMethods->method(rf->real, param);	\
	}
PASS_THROUGH_FORGET(r_truncate, xTruncate, sqlite3_int64, size)
PASS_THROUGH_FORGET(r_lock, xLock, int, lock)
PASS_THROUGH_FORGET(r_unlock, xUnlock, int, lock)

/* The shared-memory methods are the database's (SQLite calls none on a
   WAL).  Before a wal-index lock is released, the WAL's batch is written:
   then it holds at most the frames of a transaction that did not commit
   (a commit flushes), which SQLite wrote, as before, while it held the
   write lock; a failure drops them (once the lock is free, another
   connection may write there), and the lock is released all the same
   (SQLite does not check an unlock's result). */
static int r_shm_lock(sqlite3_file *f, int offset, int n, int flags)
{
	struct rfile *rf = (struct rfile *)f;
	int frc = SQLITE_OK, rc;

	/* The shm methods are the database file's, which holds no batch
	   (only a WAL file does): nothing of its own to flush here. */
	assert(!rf->batched);
	read_ahead_forget(&rf->ra);
	if ((flags & SQLITE_SHM_UNLOCK) && rf->wal != NULL &&
	    (frc = flush(rf->wal)) != SQLITE_OK)
		wal_batch_drop(&rf->wal->batch);
	rc = rf->real->pMethods->xShmLock(rf->real, offset, n, flags);
	return frc != SQLITE_OK ? frc : rc;
}

static int r_file_control(sqlite3_file *f, int op, void *arg)
{
	struct rfile *rf = (struct rfile *)f;
	int rc;

	if ((rc = flush(rf)) != SQLITE_OK)
		return rc;
	/* The size hint allocates (fallocate) where the VFS does that. */
	while (is_full(rc = rf->real->pMethods->xFileControl(rf->real, op, arg)) &&
	       op == SQLITE_FCNTL_SIZE_HINT && reserve_release(rf->reserve))
		;
	return rc;
}

static int r_shm_map(sqlite3_file *f, int region, int size, int extend,
		     void volatile **p)
{
	struct rfile *rf = (struct rfile *)f;
	int rc;

	if ((rc = flush(rf)) != SQLITE_OK)
		return rc;
	while (is_full(rc = rf->real->pMethods->xShmMap(rf->real, region, size,
							extend, p)) &&
	       reserve_release(rf->reserve))
		;
	return rc;
}

static void r_shm_barrier(sqlite3_file *f)
{
	real_of(f)->pMethods->xShmBarrier(real_of(f));
}

static int r_fetch(sqlite3_file *f, sqlite3_int64 off, int amt, void **pp)
{
	sqlite3_file *real = real_of(f);
	int rc;

	if ((rc = flush((struct rfile *)f)) != SQLITE_OK) {
		*pp = NULL;
		return rc;
	}
	if (real->pMethods->iVersion < 3) {
		*pp = NULL;
		return SQLITE_OK;
	}
	return real->pMethods->xFetch(real, off, amt, pp);
}

static int r_unfetch(sqlite3_file *f, sqlite3_int64 off, void *p)
{
	sqlite3_file *real = real_of(f);
	int rc;

	if ((rc = flush((struct rfile *)f)) != SQLITE_OK)
		return rc;
	if (real->pMethods->iVersion < 3)
		return SQLITE_OK;
	return real->pMethods->xUnfetch(real, off, p);
}

/* Version 3; xFetch and xUnfetch fall back for an older real VFS. */
static const sqlite3_io_methods rfile_methods = {
	.iVersion = 3,
	.xClose = r_close,
	.xRead = r_read,
	.xWrite = r_write,
	.xTruncate = r_truncate,
	.xSync = r_sync,
	.xFileSize = r_file_size,
	.xLock = r_lock,
	.xUnlock = r_unlock,
	.xCheckReservedLock = r_check_reserved_lock,
	.xFileControl = r_file_control,
	.xSectorSize = r_sector_size,
	.xDeviceCharacteristics = r_device_characteristics,
	.xShmMap = r_shm_map,
	.xShmLock = r_shm_lock,
	.xShmBarrier = r_shm_barrier,
	.xShmUnmap = r_shm_unmap,
	.xFetch = r_fetch,
	.xUnfetch = r_unfetch,
};

/* <database>-reserve for the files of a database (the database itself,
   its WAL and journal); NULL for temporary files. */
static char *reserve_path_of(const char *name, int flags)
{
	const char *db;
	char *path;

	if (name == NULL)
		return NULL;
	if (flags & SQLITE_OPEN_MAIN_DB)
		db = name;
	else if (flags & (SQLITE_OPEN_WAL | SQLITE_OPEN_MAIN_JOURNAL))
		db = sqlite3_filename_database(name);
	else
		return NULL;
	if (db == NULL || asprintf(&path, "%s" DBOX_RESERVE_SUFFIX, db) < 0)
		return NULL;
	return path;
}

/* Batch the writes of rf, the WAL named name, when SQLite writes each of
   its frames as a header and a page (wal-batch.h): when its database
   has powersafe overwrite (else SQLite pads a commit to a sector and cuts
   a write at the sync point).  Links the database's file object to rf. */
static void wal_start_batch(struct rfile *rf, sqlite3_filename name)
{
	sqlite3_file *db = sqlite3_database_file_object(name);
	struct rfile *dbrf;

	/* A database opened through another VFS is not ours to link. */
	if (db == NULL || db->pMethods != &rfile_methods)
		return;
	dbrf = (struct rfile *)db;
	if (!(dbrf->real->pMethods->xDeviceCharacteristics(dbrf->real) &
	      SQLITE_IOCAP_POWERSAFE_OVERWRITE))
		return;
	wal_batch_init(&rf->batch, write_real, rf);
	rf->batched = true;
	rf->db = dbrf;
	dbrf->wal = rf;
}

static int r_open(sqlite3_vfs *vfs, sqlite3_filename name, sqlite3_file *f,
		  int flags, int *out_flags)
{
	struct rfile *rf = (struct rfile *)f;
	struct stat sb;
	int rc;

	memset(rf, 0, sizeof(*rf));
	rf->real = (sqlite3_file *)((char *)f + RFILE_SIZE);
	if (flags & SQLITE_OPEN_SUPER_JOURNAL) {
		/* The index never writes a transaction over two database
		   files, so none of its journals names a super-journal: one
		   that does was planted, and SQLite would delete the file it
		   names (any file, as whoever runs us) after rolling the
		   journal back.  Refused: the index then fails to open. */
		dbox_error("%s: a rollback journal of the index names it as "
			   "its super-journal; the index never writes one: "
			   "refusing it (remove the planted %s-journal)",
			   name != NULL ? name : "?", "index.sqlite");
		rf->base.pMethods = NULL;
		return SQLITE_CANTOPEN;
	}
	if (name != NULL && lstat(name, &sb) == 0 && !S_ISREG(sb.st_mode) &&
	    !S_ISLNK(sb.st_mode)) {
		/* A FIFO (or device) planted as the index or one of its
		   files: SQLite's reads of it would wait forever (a FIFO
		   opened read-write never ends).  Refused.  (A symbolic
		   link: SQLITE_OPEN_NOFOLLOW refuses the database; the
		   store refuses planted side files, engine/store.c.) */
		dbox_error("%s: not a regular file; refusing it", name);
		rf->base.pMethods = NULL;
		return SQLITE_CANTOPEN;
	}
	rc = real_vfs->xOpen(real_vfs, name, rf->real, flags, out_flags);
	if (rc != SQLITE_OK || rf->real->pMethods == NULL) {
		/* SQLite calls no method of a file whose open failed. */
		rf->base.pMethods = NULL;
		return rc;
	}
	rf->reserve = reserve_path_of(name, flags);
	rf->is_db = (flags & SQLITE_OPEN_MAIN_DB) != 0;
	read_ahead_init(&rf->ra);
	rf->base.pMethods = &rfile_methods;
	rf->is_wal = (flags & SQLITE_OPEN_WAL) != 0;
	if (rf->is_wal)
		wal_start_batch(rf, name);
	return SQLITE_OK;
}

int dbox_reserve_wal_sync_by(sqlite3 *db, int (*sync)(void *ctx), void *ctx)
{
	sqlite3_file *wal = NULL;
	struct rfile *rf;

	if (sqlite3_file_control(db, "main", SQLITE_FCNTL_JOURNAL_POINTER,
				 &wal) != SQLITE_OK || wal == NULL ||
	    wal->pMethods != &rfile_methods || !((struct rfile *)wal)->is_wal)
		return -ENOENT;
	rf = (struct rfile *)wal;
	rf->sync_by = sync;
	rf->sync_ctx = ctx;
	return 0;
}

/* Whether path ends with suffix. */
static bool ends_with(const char *path, const char *suffix)
{
	size_t n = strlen(path), k = strlen(suffix);

	return n > k && strcmp(path + n - k, suffix) == 0;
}

/* SQLite deletes a database's rollback journal and, at the last close,
   its WAL; nothing else of the index's (its temporary files are unlinked
   at open).  Any other name would come from a planted journal's
   super-journal record (r_open refuses those too). */
static int r_delete(sqlite3_vfs *vfs, const char *name, int sync_dir)
{
	if (!ends_with(name, "-journal") && !ends_with(name, "-wal")) {
		dbox_error("%s: SQLite was asked to delete it; not a journal or "
			   "WAL of the index: refused", name);
		return SQLITE_IOERR_DELETE;
	}
	return real_vfs->xDelete(real_vfs, name, sync_dir);
}

static int r_access(sqlite3_vfs *vfs, const char *name, int flags, int *out)
{
	return real_vfs->xAccess(real_vfs, name, flags, out);
}

static int r_full_pathname(sqlite3_vfs *vfs, const char *name, int n,
			   char *out)
{
	return real_vfs->xFullPathname(real_vfs, name, n, out);
}

static void *r_dl_open(sqlite3_vfs *vfs, const char *name)
{
	return real_vfs->xDlOpen(real_vfs, name);
}

static void r_dl_error(sqlite3_vfs *vfs, int n, char *msg)
{
	real_vfs->xDlError(real_vfs, n, msg);
}

static void (*r_dl_sym(sqlite3_vfs *vfs, void *h, const char *sym))(void)
{
	return real_vfs->xDlSym(real_vfs, h, sym);
}

static void r_dl_close(sqlite3_vfs *vfs, void *h)
{
	real_vfs->xDlClose(real_vfs, h);
}

static int r_randomness(sqlite3_vfs *vfs, int n, char *out)
{
	return real_vfs->xRandomness(real_vfs, n, out);
}

static int r_sleep(sqlite3_vfs *vfs, int us)
{
	return real_vfs->xSleep(real_vfs, us);
}

static int r_current_time(sqlite3_vfs *vfs, double *t)
{
	return real_vfs->xCurrentTime(real_vfs, t);
}

static int r_get_last_error(sqlite3_vfs *vfs, int n, char *msg)
{
	return real_vfs->xGetLastError(real_vfs, n, msg);
}

static int r_current_time_int64(sqlite3_vfs *vfs, sqlite3_int64 *t)
{
	return real_vfs->xCurrentTimeInt64(real_vfs, t);
}

static sqlite3_vfs reserve_vfs = {
	.iVersion = 2,
	.zName = DBOX_RESERVE_VFS,
	.xOpen = r_open,
	.xDelete = r_delete,
	.xAccess = r_access,
	.xFullPathname = r_full_pathname,
	.xDlOpen = r_dl_open,
	.xDlError = r_dl_error,
	.xDlSym = r_dl_sym,
	.xDlClose = r_dl_close,
	.xRandomness = r_randomness,
	.xSleep = r_sleep,
	.xCurrentTime = r_current_time,
	.xGetLastError = r_get_last_error,
	.xCurrentTimeInt64 = r_current_time_int64,
};

static pthread_once_t vfs_once = PTHREAD_ONCE_INIT;
static bool vfs_ok;

static void vfs_register(void)
{
	real_vfs = sqlite3_vfs_find(NULL);
	if (real_vfs == NULL || real_vfs->iVersion < 2)
		return;
	reserve_vfs.szOsFile = (int)RFILE_SIZE + real_vfs->szOsFile;
	reserve_vfs.mxPathname = real_vfs->mxPathname;
	vfs_ok = sqlite3_vfs_register(&reserve_vfs, 0) == SQLITE_OK;
}

const char *dbox_reserve_vfs(void)
{
	pthread_once(&vfs_once, vfs_register);
	return vfs_ok ? DBOX_RESERVE_VFS : NULL;
}

/* Bytes of free space the process may use on the filesystem of fd
   (root may use the blocks reserved for root), and its size.  Returns 0
   or -errno. */
static int fs_space(int fd, uint64_t *avail_r, uint64_t *total_r)
{
	struct statvfs sv;

	if (fstatvfs(fd, &sv) < 0)
		return -errno;
	*avail_r = (uint64_t)(geteuid() == 0 ? sv.f_bfree : sv.f_bavail) *
		sv.f_frsize;
	*total_r = (uint64_t)sv.f_blocks * sv.f_frsize;
	return 0;
}

/* Grow the reserve to its full size: fallocate, or zeros written where
   the filesystem has no fallocate.  Returns 0 or -errno. */
static int reserve_fill(struct dbox_index *index)
{
	static const char zeros[65536];
	struct stat st;
	off_t off;

	if (fallocate(index->reserve_fd, 0, 0, (off_t)index->reserve_size) == 0)
		return 0;
	if (errno != EOPNOTSUPP)
		return -errno;
	if (fstat(index->reserve_fd, &st) < 0)
		return -errno;
	for (off = st.st_size; (uint64_t)off < index->reserve_size; ) {
		size_t n = index->reserve_size - (uint64_t)off < sizeof(zeros) ?
			(size_t)(index->reserve_size - (uint64_t)off) :
			sizeof(zeros);
		ssize_t w = pwrite(index->reserve_fd, zeros, n, off);

		if (w < 0)
			return -errno;
		off += w;
	}
	return fdatasync(index->reserve_fd) < 0 ? -errno : 0;
}

int dbox_index_reserve_open(struct dbox_index *index)
{
	uint64_t avail, total;
	char *path;
	int fd, ret;

	if (index->reserve_fd >= 0)
		return 0;
	if (asprintf(&path, "%s" DBOX_RESERVE_SUFFIX, index->path) < 0)
		return -ENOMEM;
	fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK |
		    O_CLOEXEC, 0600);
	if (fd < 0) {
		ret = -errno;
		dbox_error("%s: %s; the index has no reserve for a full disk",
			   path, strerror(errno));
		free(path);
		return ret;
	}
	if (fs_space(fd, &avail, &total) < 0)
		total = (uint64_t)DBOX_RESERVE_MAX * 16;
	index->reserve_size = total / 16 < DBOX_RESERVE_MAX ?
		(total / 16) & ~(uint64_t)4095 : DBOX_RESERVE_MAX;
	index->reserve_fd = fd;
	if (!dbox_index_reserve_short(index)) {
		free(path);
		return 0;
	}
	if ((ret = reserve_fill(index)) < 0)
		dbox_warning("%s: %s; the index reserve is not whole: new mail "
			     "waits until there is room", path, strerror(-ret));
	free(path);
	return 0;
}

static uint64_t monotonic_ns(void)
{
	struct timespec ts;

	/* Served by the vDSO without a syscall where the clock source
	   allows it (tsc, kvm-clock: this machine's). */
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Whether the reserve of index (open) is whole: taken from the last look
   when that found it whole less than DBOX_RESERVE_RECHECK_NS ago and no
   reserve was used in this process since, else looked at (fstat) and
   remembered when whole.  Returns 1 (whole), 0 (short: *size_r is its
   size) or -errno of fstat. */
static int reserve_whole(struct dbox_index *index, uint64_t *size_r)
{
	uint64_t now, seen, rel;
	struct stat st;

	/* The release count is read before the fstat: a release after it
	   makes the next call look again. */
	rel = __atomic_load_n(&releases, __ATOMIC_ACQUIRE);
	now = monotonic_ns();
	seen = __atomic_load_n(&index->reserve_whole_ns, __ATOMIC_ACQUIRE);
	if (seen != 0 && now - seen < DBOX_RESERVE_RECHECK_NS &&
	    __atomic_load_n(&index->reserve_whole_releases,
			    __ATOMIC_RELAXED) == rel)
		return 1;
	if (fstat(index->reserve_fd, &st) < 0)
		return -errno;
	if ((uint64_t)st.st_size >= index->reserve_size) {
		__atomic_store_n(&index->reserve_whole_releases, rel,
				 __ATOMIC_RELAXED);
		__atomic_store_n(&index->reserve_whole_ns, now,
				 __ATOMIC_RELEASE);
		return 1;
	}
	__atomic_store_n(&index->reserve_whole_ns, 0, __ATOMIC_RELEASE);
	*size_r = (uint64_t)st.st_size;
	return 0;
}

bool dbox_index_reserve_short(struct dbox_index *index)
{
	uint64_t size;

	return index->reserve_fd >= 0 && reserve_whole(index, &size) != 1;
}

int dbox_index_reserve_check(struct dbox_index *index)
{
	uint64_t avail, total, missing, size = 0;
	int ret;

	if (index->reserve_fd < 0 || (ret = reserve_whole(index, &size)) == 1)
		return 0;
	if (ret < 0)
		return ret;
	/* Refill only with room to spare, or each delivery would take back
	   what the index just freed. */
	missing = index->reserve_size - size;
	if (fs_space(index->reserve_fd, &avail, &total) < 0 ||
	    avail < missing + DBOX_RESERVE_CHUNK || reserve_fill(index) < 0)
		return -ENOSPC;
	dbox_info("%s%s: refilled; the disk has room again", index->path,
		  DBOX_RESERVE_SUFFIX);
	return 0;
}
