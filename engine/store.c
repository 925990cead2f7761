/*
 * store.c: opening a store directory (layout, lock, index, the alternate
 * storage) and closing it, and the store lock st->lock with its holder
 * (see store.h for the lock order).  Crash recovery at open is
 * store-recover.c, the pool of m.N files taking new messages
 * store-pool.c, reading m.N files store-read.c, saving one message
 * save.c.
 *
 * Invariants:
 *  - a file id is never reused: next_file_id is above every m.N on disk
 *    and in the index;
 *  - st->lock.owner is the holder's thread token while it is held, 0
 *    otherwise: it changes only through dbox_store_mutex_*.
 */
#include "engine/alt-mark.h"
#include "engine/maildir.h"
#include "engine/message.h"
#include "engine/store-dirs.h"
#include "engine/namespace.h"
#include "engine/store-layout.h"
#include "engine/store-lock.h"
#include "engine/store-private.h"

#include "index/checkpoint.h"
#include "index/reserve.h"
#include "index/verify.h"
#include "storage/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* A token naming the calling thread: the address of a thread-local
   variable, never 0 and distinct for every live thread. */
static uintptr_t thread_token(void)
{
	static __thread char token;

	return (uintptr_t)&token;
}

void dbox_store_mutex_lock(struct dbox_store *st)
{
	/* A second lock by its holder would deadlock: say so instead. */
	dbox_store_assert_unlocked(st);
	if (pthread_mutex_lock(&st->lock.mutex) != 0)
		abort();
	__atomic_store_n(&st->lock.owner, thread_token(), __ATOMIC_RELAXED);
}

void dbox_store_mutex_unlock(struct dbox_store *st)
{
	dbox_store_assert_locked(st);
	__atomic_store_n(&st->lock.owner, 0, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&st->lock.mutex);
}

void dbox_store_mutex_wait(struct dbox_store *st, pthread_cond_t *cond)
{
	dbox_store_assert_locked(st);
	__atomic_store_n(&st->lock.owner, 0, __ATOMIC_RELAXED);
	pthread_cond_wait(cond, &st->lock.mutex);
	__atomic_store_n(&st->lock.owner, thread_token(), __ATOMIC_RELAXED);
}

int dbox_store_mutex_timedwait(struct dbox_store *st, pthread_cond_t *cond,
			       const struct timespec *abstime)
{
	int ret;

	dbox_store_assert_locked(st);
	__atomic_store_n(&st->lock.owner, 0, __ATOMIC_RELAXED);
	ret = pthread_cond_timedwait(cond, &st->lock.mutex, abstime);
	__atomic_store_n(&st->lock.owner, thread_token(), __ATOMIC_RELAXED);
	return ret;
}

bool dbox_store_mutex_held(const struct dbox_store *st)
{
	/* Only this thread ever stores its own token: a stale value read
	   here is 0 or another thread's, never ours. */
	return __atomic_load_n(&st->lock.owner, __ATOMIC_RELAXED) ==
		thread_token();
}

/* Is the directory (open as fd) empty? */
static bool dir_is_empty(int fd)
{
	DIR *dir = fdopendir(dup(fd));
	struct dirent *d;
	bool empty = true;

	if (dir == NULL)
		return false;
	rewinddir(dir); /* the dup shares fd's offset */
	while ((d = readdir(dir)) != NULL) {
		if (strcmp(d->d_name, ".") != 0 && strcmp(d->d_name, "..") != 0) {
			empty = false;
			break;
		}
	}
	closedir(dir);
	return empty;
}

/* Does the directory (open as fd) look like a Maildir++ tree: cur/ new/
   tmp/ at its top, or a ".Folder" with cur/? */
static bool dir_is_maildir(int fd)
{
	DIR *dir;
	struct dirent *d;
	char sub[NAME_MAX + 8];
	bool found = false;
	size_t n = 0;

	while (n < MAILDIR_SUBDIR_COUNT &&
	       faccessat(fd, maildir_subdirs[n], F_OK, 0) == 0)
		n++;
	if (n == MAILDIR_SUBDIR_COUNT)
		return true;
	if ((dir = fdopendir(dup(fd))) == NULL)
		return false;
	rewinddir(dir); /* the dup shares fd's offset */
	while (!found && (d = readdir(dir)) != NULL) {
		if (d->d_name[0] != '.' || strcmp(d->d_name, ".") == 0 ||
		    strcmp(d->d_name, "..") == 0)
			continue;
		snprintf(sub, sizeof(sub), "%s/cur", d->d_name);
		found = faccessat(fd, sub, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
	}
	closedir(dir);
	return found;
}

/* May this process not write the store (open as dir_fd) or its index:
   read-only media (EROFS), or no write permission (EACCES)? */
static bool store_is_read_only(int dir_fd)
{
	static const char *const names[] = { ".", DBOX_STORE_INDEX };

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (faccessat(dir_fd, names[i], W_OK, AT_EACCESS) < 0 &&
		    (errno == EROFS || errno == EACCES))
			return true;
	}
	return false;
}

/* Open or create STORE/name as a directory (mode 0700). */
static int open_subdir(int dir_fd, const char *name, bool create)
{
	int fd;

	if (create && mkdirat(dir_fd, name, 0700) < 0 && errno != EEXIST)
		return -errno;
	fd = openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

/* Is path the directory open as fd?  0 or -ESTALE. */
static int same_dir(int fd, const char *path)
{
	struct stat a, b;

	if (fstat(fd, &a) < 0 || stat(path, &b) < 0 || a.st_dev != b.st_dev ||
	    a.st_ino != b.st_ino)
		return -ESTALE;
	return 0;
}

static int open_layout(struct dbox_store *st, const char *path, bool create)
{
	bool is_store;

	if (st->readonly)
		create = false;
	if (create && mkdir(path, 0700) < 0 && errno != EEXIST) {
		dbox_error("%s: cannot create store: %s", path, strerror(errno));
		return -errno;
	}
	st->dir_fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (st->dir_fd < 0) {
		dbox_error("%s: cannot open store: %s", path, strerror(errno));
		return -errno;
	}
	is_store = faccessat(st->dir_fd, DBOX_STORE_INDEX, F_OK, 0) == 0;
	if (!is_store && dir_is_maildir(st->dir_fd)) {
		dbox_error("%s: this is a maildir, not a store: 'dboxadm import "
			   "STORE %s' copies it into a new store STORE, which "
			   "dboxfs then mounts", path, path);
		return -ENOTEMPTY;
	}
	if (!is_store && !dir_is_empty(st->dir_fd)) {
		/* The rebuild advice only where there is something to
		   rebuild from (helper-90: it was given for any directory). */
		bool had_storage = faccessat(st->dir_fd, DBOX_STORE_STORAGE,
					     F_OK, AT_SYMLINK_NOFOLLOW) == 0;

		if (had_storage)
			dbox_error("%s: not a dbox store (no " DBOX_STORE_INDEX
				   ") and not empty; refusing to use it (if it "
				   "was a store, run 'dboxadm rebuild %s')", path,
				   path);
		else
			dbox_error("%s: not a dbox store (no " DBOX_STORE_INDEX
				   ", no " DBOX_STORE_STORAGE "/) and not empty; "
				   "refusing to use it (a new store goes into a "
				   "new or empty directory)", path);
		return -ENOTEMPTY;
	}
	if (!is_store && !create) {
		dbox_error("%s: no store here", path);
		return -ENOENT;
	}
	if (st->readonly) {
		st->lock_fd = dbox_store_lock_shared(st->dir_fd, path);
		if (st->lock_fd == -ENOENT)
			st->lock_fd = -1; /* none, and none can be made */
		else if (st->lock_fd < 0)
			return st->lock_fd;
	} else if ((st->lock_fd = dbox_store_lock(st->dir_fd, path)) < 0) {
		return st->lock_fd;
	}
	if ((st->storage_fd = open_subdir(st->dir_fd, DBOX_STORE_STORAGE,
					  !st->readonly)) < 0 ||
	    (st->files_fd = open_subdir(st->dir_fd, DBOX_STORE_FILES,
					!st->readonly)) < 0) {
		int ret = st->storage_fd < 0 ? st->storage_fd : st->files_fd;

		dbox_error("%s: cannot open " DBOX_STORE_STORAGE "/ or " DBOX_STORE_FILES "/: %s", path,
			   strerror(-ret));
		return ret;
	}
	return 0;
}

/* Highest N of the storage/m.N files on disk. */
static uint32_t max_file_on_disk(int storage_fd)
{
	DIR *dir = fdopendir(dup(storage_fd));
	struct dirent *d;
	uint32_t max = 0, id;

	if (dir == NULL)
		return 0;
	rewinddir(dir); /* the dup shares storage_fd's offset */
	while ((d = readdir(dir)) != NULL) {
		if (dbox_mfile_parse_name(d->d_name, &id) && id > max)
			max = id;
	}
	closedir(dir);
	return max;
}

const char *dbox_store_dir_name(const struct dbox_store *st, bool alt)
{
	return alt && st->alt_path != NULL ? st->alt_path : st->path;
}

/* Open ALT/storage/ for the store: ALT itself is an admin's path (like
   STORE: symbolic links on the way are followed); storage/ inside it is
   not followed.  Only an ALT dbox_alt_owner_check accepts, and while the
   index places m.N in ALT, only one that holds the first of them: the
   recorded ALT's disk may not be mounted yet (its mount point an empty
   directory), and a new path given for it may be a typo; taken, it
   split the ALT mail between two directories, with EIO for the half not
   there (helper-77).  Nor one whose mark says it is another store's
   (engine/alt-mark.h); a writable open marks it as this store's.
   Returns the fd of storage/ or -errno (-EPERM: refused; -ENOENT: not
   the ALT; -EXDEV: another store's; all logged). */
static int open_alt_storage(struct dbox_store *st, const char *alt)
{
	struct dbox_alt_mark mark;
	struct stat store_sb;
	bool way;
	uid_t uid;
	int ret;

	if (fstat(st->dir_fd, &store_sb) < 0)
		return -errno;
	if ((ret = dbox_alt_mark_load(st->index, &mark)) < 0)
		return ret;
	mark.write = !st->readonly;
	mark.want_first = true;
	/* Nothing is made in an ALT that should hold mail already; the
	   recorded one is tried again later (dbox_store_alt_fd). */
	ret = dbox_alt_storage_open(alt, store_sb.st_uid,
				    !st->readonly && !mark.index_places,
				    &mark, &uid, &way);
	if (ret == -EPERM)
		dbox_error("%s: the alternate storage %s %s uid %u, the store "
			   "belongs to uid %u; refused", st->path, alt,
			   way ? "is reached through a directory or symbolic "
			   "link of" : "belongs to", (unsigned)uid,
			   (unsigned)store_sb.st_uid);
	if (ret >= 0 && mark.write) {
		int err = dbox_alt_mark_record(st->index, &mark);

		if (err < 0) {
			close(ret);
			ret = err;
		}
	}
	return ret;
}

/* CLOCK_MONOTONIC in whole seconds. */
static int64_t monotonic_sec(void)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (int64_t)now.tv_sec;
}

int dbox_store_alt_fd(struct dbox_store *st)
{
	int64_t now;
	int fd;

	dbox_store_assert_locked(st);
	if (st->alt_fd >= 0 || st->alt_path == NULL || st->alt_err == EPERM)
		return st->alt_fd;
	now = monotonic_sec();
	if (now < st->alt_tried + DBOX_ALT_RETRY_SECONDS)
		return -1;
	st->alt_tried = now;
	if ((fd = open_alt_storage(st, st->alt_path)) < 0) {
		st->alt_err = -fd;
		return -1;
	}
	st->alt_fd = fd;
	st->alt_err = 0;
	dbox_info("%s/storage: the alternate storage is back; its messages "
		  "read again", st->alt_path);
	return fd;
}

/* The compression of new bodies: the one the caller chose, recorded
   for later opens (not by a read-only one), else the recorded one, else
   set->compress as a default (none unless the caller set one).  A
   recorded value this dboxfs cannot write is logged and the default
   (plain for the mount and dboxadm) is used.  Only an index error on
   reading fails. */
static int open_compress(struct dbox_store *st,
			 const struct dbox_store_settings *set)
{
	char spec[32], *recorded = NULL;
	int ret;

	ret = dbox_index_setting_get(st->index, DBOX_SETTING_COMPRESS,
				     &recorded);
	if (ret < 0 && ret != -ENOENT)
		return ret;
	st->compress = set->compress;
	if (set->compress_given) {
		dbox_compress_format(&set->compress, spec, sizeof(spec));
		/* Not recorded (logged by the index): this open still
		   compresses as asked. */
		if (!st->readonly &&
		    (recorded == NULL || strcmp(recorded, spec) != 0))
			(void)dbox_index_setting_set(st->index,
						     DBOX_SETTING_COMPRESS, spec);
	} else if (recorded != NULL &&
		   dbox_compress_parse(recorded, &st->compress) < 0) {
		/* Its first bytes only: the owner may have recorded
		   megabytes (helper-87: 10 MB on root's terminal). */
		dbox_warning("%s: the recorded compression '%.40s%s' is "
			     "unknown to this dboxfs; new messages are stored "
			     "plain", st->path, recorded,
			     strlen(recorded) > 40 ? "..." : "");
		st->compress = set->compress;
	}
	free(recorded);
	return 0;
}

/* Why open_alt_storage failed with err, for a log line: a refusal it
   logged itself (-EPERM, -EXDEV) only points there. */
static const char *alt_why(int err)
{
	return err == -EPERM || err == -EXDEV ? "refused (see above)" :
		strerror(-err);
}

/* The alternate storage: set->alt_path, else the recorded one.  A new
   path given is recorded only once it opened and was accepted; a refused
   one changes nothing (the recorded one stays in use, and both are
   logged).  A missing or refused ALT is logged and leaves st->alt_fd at
   -1 (its messages fail with EIO); only an index error fails. */
static int open_alt(struct dbox_store *st, const struct dbox_store_settings *set)
{
	char *recorded = NULL;
	int ret, fd;

	ret = dbox_index_setting_get(st->index, DBOX_SETTING_ALT_PATH, &recorded);
	if (ret < 0 && ret != -ENOENT)
		return ret;
	if (set->alt_path != NULL && set->alt_path[0] != '/') {
		dbox_error("%s: the alternate storage path '%s' is not "
			   "absolute", st->path, set->alt_path);
		free(recorded);
		return -EINVAL;
	}
	if (set->alt_path != NULL &&
	    (recorded == NULL || strcmp(recorded, set->alt_path) != 0)) {
		fd = open_alt_storage(st, set->alt_path);
		if (fd < 0) {
			if (recorded != NULL)
				dbox_error("%s/storage: alternate storage not "
					   "available: %s; not recorded: the "
					   "store keeps %s (give alt=%s, or "
					   "none, to go on using it)",
					   set->alt_path, alt_why(fd),
					   recorded, recorded);
			else
				dbox_error("%s/storage: alternate storage not "
					   "available: %s; not recorded",
					   set->alt_path, alt_why(fd));
			/* fall through to the recorded one */
		} else {
			if (!st->readonly &&
			    (ret = dbox_index_setting_set(st->index,
					DBOX_SETTING_ALT_PATH,
					set->alt_path)) < 0) {
				close(fd);
				free(recorded);
				return ret;
			}
			if (recorded != NULL)
				dbox_warning("%s: alternate storage changed "
					     "from %s to %s (to go back: give "
					     "alt=%s again)", st->path,
					     recorded, set->alt_path, recorded);
			free(recorded);
			if ((st->alt_path = strdup(set->alt_path)) == NULL) {
				close(fd);
				return -ENOMEM;
			}
			st->alt_fd = fd;
			return 0;
		}
	}
	st->alt_path = recorded;
	if (recorded == NULL)
		return 0;
	if ((fd = open_alt_storage(st, recorded)) < 0) {
		st->alt_err = -fd;
		st->alt_tried = monotonic_sec();
		st->alt_said = st->alt_tried + 1; /* said here */
		dbox_error("%s/storage: alternate storage not available: %s; "
			   "messages stored there fail with EIO", recorded,
			   alt_why(-st->alt_err));
	} else {
		st->alt_fd = fd;
	}
	return 0;
}

/* close(fd) unless it is -1 (never opened). */
static void close_if_open(int fd)
{
	if (fd >= 0)
		close(fd);
}

void dbox_store_close(struct dbox_store **stp)
{
	struct dbox_store *st = *stp;

	if (st == NULL)
		return;
	*stp = NULL;
	/* Deferred operations are committed first: what follows syncs. */
	dbox_store_defer_stop(st);
	/* The checkpointer's round syncs what it listed: stop it first,
	   then sync the rest here (the index's close syncs the WAL). */
	if (st->index != NULL)
		dbox_index_checkpointer_stop(st->index);
	/* Files whose deletion waits for a WAL sync: this one. */
	if (st->doomed_count > 0)
		(void)dbox_store_sync_wal(st, 0);
	else
		dbox_store_sync_unsynced(st);
	assert(st->unsynced == NULL);
	/* Their files are gone, unless that sync failed. */
	if (st->index != NULL && !st->readonly && st->doomed_count == 0)
		(void)dbox_index_meta_delete_prefix(st->index,
						    DBOX_META_FILE_GONE_PREFIX);
	assert(st->unsynced_files == NULL);
	free(st->doomed);
	free(st->unlinked);
	for (size_t i = 0; i < st->append_count; i++) {
		close(st->append[i]->fd);
		free(st->append[i]);
	}
	free(st->append);
	dbox_fd_cache_deinit(&st->read_fds);
	/* Nothing is in flight any more, but what recovery could not judge
	   (ALT missing). */
	if (st->index != NULL && !st->readonly)
		dbox_store_drop_inflight_marks(st);
	free(st->unjudged);
	dbox_index_close(&st->index);
	close_if_open(st->storage_fd);
	close_if_open(st->alt_fd);
	free(st->alt_path);
	close_if_open(st->files_fd);
	close_if_open(st->dir_fd);
	close_if_open(st->lock_fd); /* releases the flock */
	pthread_mutex_destroy(&st->lock.mutex);
	pthread_mutex_destroy(&st->presync_mutex);
	free(st->index_path);
	free(st->path);
	free(st);
}

void dbox_store_close_new(struct dbox_store **stp, bool dir_made)
{
	struct dbox_store *st = *stp;
	char *path;
	int lock_fd;

	if (st == NULL)
		return;
	if ((path = strdup(st->path)) == NULL) {
		dbox_store_close(stp);
		return; /* the store stays: nothing lost */
	}
	/* Removed before the lock goes, so no other open finds half. */
	lock_fd = st->lock_fd;
	st->lock_fd = -1;
	dbox_store_close(stp);
	dbox_store_remove_new(path, dir_made);
	close_if_open(lock_fd);
	free(path);
}

/* The next file id: above every m.N on disk (both storages) and every
   one the index knows (max_index); 0 when none is left (an m.4294967295
   is there: the numbers do not wrap to 0 and then to m.1 again). */
static uint32_t next_file_id(const struct dbox_store *st, uint32_t max_index)
{
	uint32_t next = max_file_on_disk(st->storage_fd);

	if (st->alt_fd >= 0 && max_file_on_disk(st->alt_fd) > next)
		next = max_file_on_disk(st->alt_fd);
	if (max_index > next)
		next = max_index;
	return next == UINT32_MAX ? 0 : next + 1;
}

/* The first of the index's side files (journal, WAL, shared memory)
   that is not a regular file: planted (a symlink), never made by SQLite.
   NULL when there is none. */
static const char *odd_index_file(const struct dbox_store *st)
{
	static const char *const side[] = {
		DBOX_STORE_INDEX "-journal", DBOX_STORE_INDEX "-wal",
		DBOX_STORE_INDEX "-shm",
	};
	struct stat sb;

	for (size_t i = 0; i < sizeof(side) / sizeof(side[0]); i++)
		if (fstatat(st->dir_fd, side[i], &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
		    !S_ISREG(sb.st_mode))
			return side[i];
	return NULL;
}

/* Open the index of st (at st->index_path), logging why it cannot be. */
static int open_index(struct dbox_store *st, const char *path)
{
	const char *odd;
	struct stat wal;
	int ret;

	st->wal_left = fstatat(st->dir_fd, DBOX_STORE_INDEX "-wal", &wal,
			       AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(wal.st_mode) &&
		wal.st_size > 0;
	/* The bytes its commits point at first, before this open syncs the
	   WAL (store-private.h). */
	if (st->wal_left && !st->readonly)
		dbox_store_sync_left(st);
	ret = st->readonly ?
		dbox_index_open_readonly(st->index_path, &st->index) :
		dbox_index_open(st->index_path, true, &st->index);

	/* We hold the store lock, and no other connection is open yet. */
	if (ret == 0 && !st->readonly &&
	    dbox_index_convert_pages(st->index) == -EIO) {
		dbox_index_close(&st->index);
		ret = -EIO;
	}
	if (ret == 0 && !st->readonly)
		dbox_index_cache_attrs(st->index);
	if (ret < 0 && !st->readonly && store_is_read_only(st->dir_fd))
		dbox_error("the store is read-only (%s): mount it with -o ro",
			   path);
	else if (ret == -EIO && (odd = odd_index_file(st)) != NULL)
		dbox_error("%s: %s is not a regular file (SQLite never makes "
			   "one so; planted?): the index is not opened through "
			   "it; remove it and open the store again", path, odd);
	else if (ret == -EIO)
		dbox_error("%s: the index is unreadable; 'dboxadm rebuild %s' "
			   "recreates it from " DBOX_STORE_STORAGE "/", path, path);
	return ret;
}

int dbox_store_path_fits(const char *path)
{
	char *cwd = NULL, *index_path;
	int ret;

	if (path[0] != '/' && (cwd = getcwd(NULL, 0)) == NULL)
		return -errno;
	if (asprintf(&index_path, "%s%s%s/" DBOX_STORE_INDEX,
		     cwd != NULL ? cwd : "", cwd != NULL ? "/" : "",
		     path) < 0) {
		free(cwd);
		return -ENOMEM;
	}
	ret = dbox_index_path_check(index_path, path);
	free(index_path);
	free(cwd);
	return ret;
}

/* Everything dbox_store_open does to a new st, under st->lock. */
static int store_open(struct dbox_store *st, const char *path,
		      const struct dbox_store_settings *set)
{
	uint32_t max_index;
	unsigned int writing = 0;
	int ret;

	if ((ret = dbox_store_path_fits(path)) < 0 ||
	    (ret = open_layout(st, path, set->create)) < 0)
		return ret;
	/* Absolute, so the store survives a chdir (daemons chdir to /); and
	   the directory opened above, not one switched in meanwhile. */
	if ((st->path = realpath(path, NULL)) == NULL)
		return -errno;
	if (asprintf(&st->index_path, "%s/" DBOX_STORE_INDEX, st->path) < 0) {
		st->index_path = NULL;
		return -ENOMEM;
	}
	if ((ret = same_dir(st->dir_fd, st->path)) < 0) {
		dbox_error("%s: the store directory changed while it was opened",
			   path);
		return ret;
	}
	if ((ret = open_index(st, path)) < 0)
		return ret;
	/* Without a reserve the store works as before: logged, not fatal.
	   A read-only store writes nothing, a reserve neither. */
	if (!st->readonly)
		(void)dbox_index_reserve_open(st->index);
	if ((ret = open_alt(st, set)) < 0 ||
	    (ret = open_compress(st, set)) < 0 ||
	    (!st->readonly && (ret = dbox_store_recover(st, &writing)) < 0) ||
	    (ret = dbox_index_mfile_max(st->index, &max_index)) < 0)
		return ret;
	/* Recovery judged them; stale marks must not outlive it (a failure
	   only leaves marks below the committed ends, which are ignored),
	   but those of m.N it could not reach (ALT missing). */
	if (!st->readonly)
		dbox_store_drop_inflight_marks(st);
	st->next_file_id = next_file_id(st, max_index);
	if (max_index != 0 && !st->readonly)
		dbox_store_pool_adopt(st, max_index, writing > 0);
	/* Last, with the pool ready: the messages a close acknowledged
	   empty before the process died (dbox_msg_restore_empty). */
	if (!st->readonly) {
		unsigned int restored;

		if ((ret = dbox_msg_restore_empty(st, &restored)) < 0)
			return ret;
		if (restored > 0)
			dbox_info("%s: recovery: stored %u messages empty, as "
				  "their last close acknowledged them",
				  st->path, restored);
	}
	return 0;
}

int dbox_store_open(const char *path, const struct dbox_store_settings *set,
		    struct dbox_store **st_r)
{
	struct dbox_store *st = calloc(1, sizeof(*st));
	int ret;

	*st_r = NULL;
	if (st == NULL)
		return -ENOMEM;
	st->dir_fd = st->storage_fd = st->files_fd = st->lock_fd = -1;
	st->alt_fd = -1;
	st->readonly = set->readonly;
	pthread_mutex_init(&st->lock.mutex, NULL);
	pthread_mutex_init(&st->presync_mutex, NULL);
	st->rotate_size = set->rotate_size != 0 ? set->rotate_size :
		DBOX_DEFAULT_ROTATE_SIZE;
	dbox_fd_cache_init(&st->read_fds, 0);
	/* Recovery uses the entry points that need the lock. */
	dbox_store_mutex_lock(st);
	ret = store_open(st, path, set);
	dbox_store_mutex_unlock(st);
	if (ret < 0)
		dbox_store_close(&st);
	*st_r = st;
	return ret;
}

void dbox_store_index_suspend(struct dbox_store *st)
{
	dbox_index_close(&st->index);
}

int dbox_store_index_resume(struct dbox_store *st)
{
	int ret;

	if (st->readonly)
		return dbox_index_open_readonly(st->index_path, &st->index);
	ret = dbox_index_open(st->index_path, false, &st->index);
	if (ret == 0) {
		(void)dbox_index_reserve_open(st->index);
		dbox_index_cache_attrs(st->index); /* the store lock is ours */
	}
	return ret;
}

int dbox_store_verify_start(struct dbox_store *st)
{
	if (!st->wal_left || st->readonly)
		return 0;
	return dbox_index_verify_start(st->index);
}

int dbox_store_data_room(struct dbox_store *st)
{
	return dbox_index_reserve_check(st->index);
}
