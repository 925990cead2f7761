/*
 * backup.c: a consistent copy of a store (backup.h): DEST.partial made
 * (or an interrupted run's reused), the snapshot taken
 * (backup-snapshot.c), every file of it backed up (backup-copy.c), the
 * copy's index recovered and DEST put in place.
 */
#include "engine/backup-private.h"
#include "engine/store-dirs.h"
#include "engine/store-layout.h"
#include "engine/store-lock.h"
#include "engine/store.h"

#include "index/index-stats.h"
#include "storage/dbox-file.h"
#include "storage/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define PARTIAL_INDEX DBOX_STORE_INDEX ".partial"

int bk_reserve(void **v, size_t *size, size_t n, size_t elem)
{
	size_t want = *size == 0 ? 64 : *size * 2;
	void *grown;

	if (n < *size)
		return 0;
	if ((grown = reallocarray(*v, want, elem)) == NULL)
		return -ENOMEM;
	*v = grown;
	*size = want;
	return 0;
}

int64_t bk_ts_ns(const struct timespec *ts)
{
	return (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec;
}

void bk_hook(struct bk *b, const char *point)
{
	if (b->set->hook != NULL)
		b->set->hook(b->set->ctx, point);
}

void bk_file_name(char *buf, size_t size, char kind, uint64_t id)
{
	if (kind == 'm')
		dbox_file_name(buf, (uint32_t)id);
	else
		snprintf(buf, size, "%" PRIu64, id);
}

void bk_damage(struct bk *b, int what, char kind, uint64_t id,
	       uint64_t have, uint64_t want)
{
	struct dbox_backup_damage d = {
		.what = what, .kind = kind, .id = id, .have = have,
		.want = want,
	};

	if (what != DBOX_BACKUP_CHANGED)
		b->res->source_errors++;
	if (b->set->damage != NULL)
		b->set->damage(b->set->ctx, &d);
}

/* --- the sides ---------------------------------------------------------- */

static void side_close(struct bk_side *s)
{
	int *fds[] = { &s->storage, &s->files, &s->alt, &s->dir };

	for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++) {
		if (*fds[i] >= 0)
			close(*fds[i]);
		*fds[i] = -1;
	}
}

/* Open sub of the directory dir_fd (no symlink), into *fd_r; missing_ok:
   a missing one is -1 and no error.  Returns 0 or a negative errno
   (logged, naming path/sub). */
static int sub_open(int dir_fd, const char *path, const char *sub,
		    bool missing_ok, int *fd_r)
{
	*fd_r = openat(dir_fd, sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
		       O_CLOEXEC);
	if (*fd_r >= 0 || (missing_ok && errno == ENOENT))
		return 0;
	dbox_error("%s/%s: %s", path, sub, strerror(errno));
	return -errno;
}

struct alt_count {
	struct dbox_index *index;
	unsigned long files;
};

static int alt_count_cb(void *ctx, uint32_t file_id, uint64_t size)
{
	struct alt_count *ac = ctx;
	bool alt = false;

	(void)size;
	if (dbox_index_mfile_where(ac->index, file_id, &size, &alt) == 0 && alt)
		ac->files++;
	return 0;
}

/* The source: the view's storage/ and alternate storage, and files/ (a
   missing one is an empty one).  An alternate storage that holds m.N of
   the index but cannot be opened (its disk not mounted, refused) refuses
   the backup: without its files it would be half a store that looks
   whole (-ENODEV, logged). */
static int src_open(struct bk *b)
{
	struct dbox_view *v = b->view;
	int ret;

	struct stat st;

	b->src.storage = v->storage_fd;
	b->src.alt = v->alt_fd;
	ret = dbox_store_open_in(b->store, ".", DBOX_STORE_INDEX, O_RDONLY |
				 O_NONBLOCK | O_NOCTTY);
	if (ret >= 0 && (fstat(ret, &st) < 0 || !S_ISREG(st.st_mode))) {
		close(ret);
		ret = -EINVAL;
	}
	if (ret < 0) {
		dbox_error("%s: not a dbox store (no %s, or not a regular "
			   "file)", b->store, DBOX_STORE_INDEX);
		return -ENOMEDIUM;
	}
	close(ret);
	if (v->alt_path != NULL && v->alt_fd < 0) {
		struct alt_count ac = { .index = v->index };

		if ((ret = dbox_index_mfile_list(v->index, alt_count_cb,
						 &ac)) < 0)
			return ret;
		if (ac.files > 0) {
			dbox_error("%s: the alternate storage %s/%s is not "
				   "available (%s) and holds %lu m.N of the "
				   "store: nothing was backed up", b->store,
				   v->alt_path, DBOX_STORE_STORAGE,
				   dbox_view_alt_why(v->alt_err), ac.files);
			return -ENODEV;
		}
	}
	if (v->storage_fd < 0) {
		dbox_error("%s/%s: %s", b->store, DBOX_STORE_STORAGE,
			   strerror(-v->storage_err));
		return v->storage_err < 0 ? v->storage_err : -ENOTDIR;
	}
	ret = dbox_store_open_in(b->store, DBOX_STORE_FILES, NULL, 0);
	if (ret < 0 && ret != -ENOENT) {
		dbox_error("%s/%s: %s", b->store, DBOX_STORE_FILES,
			   strerror(-ret));
		return ret;
	}
	b->src.files = ret >= 0 ? ret : -1;
	return 0;
}

/* PREV, a finished backup, and its manifest.  A PREV that does not exist
   is warned about and left out (b->prevs.dir stays -1, the manifest
   empty). */
static int prev_open(struct bk *b, const char *prev)
{
	int ret;

	if ((b->prevs.dir = open(prev, O_RDONLY | O_DIRECTORY |
				 O_CLOEXEC)) < 0) {
		ret = -errno;
		/* A daily job's first run, or the day after a skipped one:
		   nothing to link from, everything is copied. */
		if (ret == -ENOENT) {
			dbox_warning("%s: no such backup; copying everything",
				     prev);
			b->res->prev_missing = true;
			return 0;
		}
		dbox_error("%s: %s", prev, strerror(errno));
		return ret;
	}
	/* The manifest first: what a backup writes last, so a DEST.partial
	   (an interrupted backup) or any other directory is named as what
	   it is, not by the first file it lacks. */
	if (faccessat(b->prevs.dir, DBOX_BACKUP_MANIFEST, F_OK,
		      AT_SYMLINK_NOFOLLOW) < 0 ||
	    bk_manifest_read(b->prevs.dir, &b->prevm) < 0) {
		dbox_error("%s: not a finished dboxadm backup (no %s); give "
			   "--link-dest the newest finished one (a .partial "
			   "directory is an interrupted backup)", prev,
			   DBOX_BACKUP_MANIFEST);
		return -EINVAL;
	}
	if ((ret = sub_open(b->prevs.dir, prev, DBOX_STORE_STORAGE, false,
			    &b->prevs.storage)) < 0 ||
	    (ret = sub_open(b->prevs.dir, prev, DBOX_STORE_FILES, true,
			    &b->prevs.files)) < 0)
		return ret;
	return 0;
}

/* --- DEST.partial -------------------------------------------------------- */

/* Log errno on path (DEST or DEST.partial), with the settings' hint when
   it was denied.  Returns -errno. */
static int dest_error(const struct bk *b, const char *path, const char *what)
{
	int err = errno;
	const char *hint = b->set->denied_hint;

	if (hint != NULL && (err == EACCES || err == EPERM))
		dbox_error("%s: %s%s %s", path, what, strerror(err), hint);
	else
		dbox_error("%s: %s%s", path, what, strerror(err));
	return -err;
}

/* Is the directory dir_fd empty? */
static bool dir_empty(int dir_fd)
{
	DIR *d = fdopendir(dup(dir_fd));
	struct dirent *de;
	bool empty = true;

	while (d != NULL && (de = readdir(d)) != NULL)
		if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
			empty = false;
	if (d != NULL)
		closedir(d);
	return empty;
}

/* An existing DEST.partial must be one of ours: an interrupted run's
   (its manifest read into b->old), or empty. */
static int partial_check(struct bk *b)
{
	int ret = bk_manifest_read(b->part.dir, &b->old);

	if (ret < 0) {
		dbox_error("%s: exists and is no interrupted dboxadm backup (%s); "
			   "remove it or choose another DEST", b->partial,
			   ret == -EINVAL ? "bad " DBOX_BACKUP_MANIFEST :
			   strerror(-ret));
		return -ENOTEMPTY;
	}
	if (faccessat(b->part.dir, DBOX_BACKUP_MANIFEST, F_OK,
		      AT_SYMLINK_NOFOLLOW) < 0) {
		if (!dir_empty(b->part.dir)) {
			dbox_error("%s: exists and is no interrupted dboxadm "
				   "backup; remove it or choose another DEST",
				   b->partial);
			return -ENOTEMPTY;
		}
	} else if (b->old.n > 0) {
		b->res->resumed = true;
		dbox_warning("%s: resuming an interrupted backup", b->partial);
	}
	return 0;
}

char *bk_part_path(const struct bk *b, const char *name)
{
	char *path;

	return asprintf(&path, "/proc/self/fd/%d/%s", b->part.dir, name) < 0 ?
		NULL : path;
}

/* Open DEST's directory into b->parent.  Every step after this one is
   made in it by name (DEST.partial made and renamed, DEST looked for),
   so nobody else may write in it: they could swap DEST.partial for a
   link to another store between two steps, and root's backup recovered
   and rewrote that store's index (helper-91 F1).  A sticky directory
   (/tmp) is fine: nobody renames another's entries there.  For root,
   every directory and symbolic link on the way must be root's, as for
   an export's DIR.  Returns 0 or a negative errno (logged). */
static int parent_open(struct bk *b)
{
	uid_t euid = geteuid(), foreign = 0;
	struct stat st;
	char *parent = dbox_path_parent(b->dest);
	int ret;

	if (parent == NULL)
		return -ENOMEM;
	b->parent = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (b->parent < 0 || fstat(b->parent, &st) < 0) {
		free(parent);
		return dest_error(b, b->dest, "its directory: ");
	}
	bk_hook(b, "parent");
	if ((st.st_uid != euid && st.st_uid != 0) ||
	    ((st.st_mode & (euid == 0 ? 022 : 002)) != 0 &&
	     (st.st_mode & S_ISVTX) == 0)) {
		dbox_error("%s: its directory belongs to uid %u or others may "
			   "write in it (mode %o): they could swap what the "
			   "backup writes; back up into a directory only you "
			   "(or root) write in", b->dest, (unsigned)st.st_uid,
			   (unsigned)(st.st_mode & 07777));
		free(parent);
		return -EPERM;
	}
	if (euid != 0) {
		free(parent);
		return 0;
	}
	/* Strict: a user's link that took the open elsewhere and is gone
	   now fails the walk (a lax one skipped the missing step: helper-93,
	   21 of 400 runs wrote where the vanished link had pointed); then
	   the path must still name the directory opened. */
	ret = dbox_path_way_owner(parent, 0, &st, &foreign);
	free(parent);
	if (ret == -ESTALE || ret == -ENOENT) {
		dbox_error("%s: its directory %s while dboxadm looked at it; "
			   "nothing was done", b->dest, ret == -ESTALE ?
			   "changed" : "went away");
		return ret;
	}
	if (ret < 0) {
		dbox_error("%s: the way to its directory: %s; nothing was done",
			   b->dest, strerror(-ret));
		return ret;
	}
	if (foreign != 0) {
		dbox_error("%s: reached through a directory or symbolic link "
			   "of uid %u, who could switch where root writes; "
			   "back up into a directory only root controls (or as "
			   "that user)", b->dest, (unsigned)foreign);
		return -EPERM;
	}
	return 0;
}

/* Would DEST lie in the store's directory or ALT's, or below one?  A
   backup there became a directory among the m.N (STORE/storage/m.999),
   which the store's check then reported for good (helper-77).  Looks at
   the directories from DEST's parent (b->parent, the one opened) up to
   /, by device and inode. */
static bool dest_inside_source(const struct bk *b)
{
	struct stat own[2];
	int nown = 0, fd;

	/* The store's directory (storage/'s parent) and ALT's. */
	for (int i = 0; i < 2; i++) {
		int sfd = i == 0 ? b->src.storage : b->src.alt;
		int pfd = sfd < 0 ? -1 : openat(sfd, "..", O_RDONLY |
						O_DIRECTORY | O_CLOEXEC);

		if (pfd >= 0 && fstat(pfd, &own[nown]) == 0)
			nown++;
		if (pfd >= 0)
			close(pfd);
	}
	fd = dup(b->parent);
	for (int depth = 0; fd >= 0 && depth < 4096; depth++) {
		struct stat st, up;
		int ufd;

		if (fstat(fd, &st) < 0)
			break;
		for (int i = 0; i < nown; i++)
			if (st.st_dev == own[i].st_dev &&
			    st.st_ino == own[i].st_ino) {
				close(fd);
				return true;
			}
		ufd = openat(fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		close(fd);
		fd = ufd;
		if (fd >= 0 && fstat(fd, &up) == 0 && up.st_dev == st.st_dev &&
		    up.st_ino == st.st_ino)
			break; /* / */
	}
	if (fd >= 0)
		close(fd);
	return false;
}

/* Create (or, from an interrupted run, reuse) DEST.partial, locked for
   this run, with its manifest, storage/ and files/.  Returns 0 or a
   negative errno (logged; res->refused unless it failed writing). */
static int partial_open(struct bk *b)
{
	struct stat st;
	int ret;

	b->res->refused = true;
	if (b->dest_name[0] == '\0' || strcmp(b->dest_name, ".") == 0 ||
	    strcmp(b->dest_name, "..") == 0) {
		dbox_error("%s: a backup goes to a new directory", b->dest);
		return -EEXIST;
	}
	if ((ret = parent_open(b)) < 0)
		return ret;
	if (dest_inside_source(b)) {
		dbox_error("%s: inside the store %s or its alternate storage; "
			   "a backup goes elsewhere", b->dest, b->store);
		return -EINVAL;
	}
	if (fstatat(b->parent, b->dest_name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		dbox_error("%s: exists; a backup goes to a new directory", b->dest);
		return -EEXIST;
	}
	if (errno != ENOENT)
		return dest_error(b, b->dest, "");
	if (mkdirat(b->parent, b->partial_name, 0700) < 0 && errno != EEXIST)
		return dest_error(b, b->partial, "cannot create: ");
	b->part.dir = openat(b->parent, b->partial_name, O_RDONLY |
			     O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (b->part.dir < 0) {
		ret = -errno;
		dbox_error("%s: %s", b->partial, strerror(errno));
		return ret;
	}
	/* A DEST.partial left by an earlier run is resumed only if it is
	   ours and no one else may write in it: one another user made (in a
	   shared directory) would let them swap what this backup writes. */
	if (fstat(b->part.dir, &st) < 0)
		return dest_error(b, b->partial, "");
	if (st.st_uid != geteuid() || (st.st_mode & 022) != 0) {
		dbox_error("%s: exists, but belongs to uid %u or others may "
			   "write in it (mode %o); not used (remove it)",
			   b->partial, (unsigned)st.st_uid,
			   (unsigned)(st.st_mode & 07777));
		return -EPERM;
	}
	/* One backup at a time into it (held until the end). */
	if ((ret = dbox_dir_lock_try(b->part.dir)) < 0) {
		dbox_error("%s: %s", b->partial, ret == -EBUSY ?
			   "another dboxadm backup is writing it" :
			   strerror(-ret));
		return ret;
	}
	if ((ret = partial_check(b)) < 0)
		return ret;
	/* From now on DEST.partial is recognisably ours, whenever this
	   run is killed. */
	b->res->refused = false;
	if ((ret = bk_manifest_create(b)) < 0)
		return ret;
	b->res->refused = true;
	for (int i = 0; i < 2; i++) {
		const char *sub = i == 0 ? DBOX_STORE_STORAGE : DBOX_STORE_FILES;

		if (mkdirat(b->part.dir, sub, 0700) < 0 && errno != EEXIST) {
			ret = -errno;
			dbox_error("%s/%s: %s", b->partial, sub, strerror(errno));
			return ret;
		}
		if ((ret = sub_open(b->part.dir, b->partial, sub, false,
				    i == 0 ? &b->part.storage :
				    &b->part.files)) < 0)
			return ret;
	}
	b->res->refused = false;
	return 0;
}

/* --- finishing ------------------------------------------------------------ */

/* Crash recovery on the copied index (dbox_index_recover), as the first
   mount of the backup would run it. */
static int recover_copy(struct bk *b)
{
	struct dbox_index *index = NULL;
	unsigned int writing = 0, orphans = 0;
	uint64_t *files = NULL;
	size_t nfiles = 0;
	char *path;
	int ret;

	if ((path = bk_part_path(b, DBOX_STORE_INDEX)) == NULL)
		return -ENOMEM;
	ret = dbox_index_open(path, false, &index);
	free(path);
	if (ret == 0)
		ret = dbox_index_backup_detach(index);
	if (ret == 0)
		ret = dbox_index_recover(index, DBOX_META_ACKED_EMPTY,
					 &writing, &orphans, &files, &nfiles);
	for (size_t i = 0; ret == 0 && i < nfiles; i++) {
		char name[32];

		bk_file_name(name, sizeof(name), 'f', files[i]);
		unlinkat(b->part.files, name, 0);
	}
	free(files);
	dbox_index_close(&index); /* checkpoints: one file, no -wal */
	return ret;
}

static int fsync_dir(int fd)
{
	return fd >= 0 && fsync(fd) < 0 ? -errno : 0;
}

/* Put DEST in place: index renamed and recovered, directories synced,
   DEST.partial renamed to DEST. */
static int finish(struct bk *b)
{
	static const char *const side_files[] = {
		DBOX_STORE_INDEX "-wal", DBOX_STORE_INDEX "-shm",
		DBOX_STORE_INDEX "-journal",
	};
	int ret;

	if (fflush(b->manifest) != 0 || fsync(fileno(b->manifest)) < 0)
		return -errno;
	/* A WAL or journal left by a run killed in recover_copy() belongs
	   to the old copy; SQLite would apply it to the new one. */
	for (size_t i = 0; i < sizeof(side_files) / sizeof(side_files[0]); i++)
		if (unlinkat(b->part.dir, side_files[i], 0) < 0 &&
		    errno != ENOENT)
			return -errno;
	if (renameat(b->part.dir, PARTIAL_INDEX, b->part.dir,
		     DBOX_STORE_INDEX) < 0)
		return -errno;
	if ((ret = recover_copy(b)) < 0)
		return ret;
	if ((ret = fsync_dir(b->part.storage)) < 0 ||
	    (ret = fsync_dir(b->part.files)) < 0 ||
	    (ret = fsync_dir(b->part.dir)) < 0)
		return ret;
	/* Never onto something that appeared meanwhile (rename() would
	   replace an empty directory). */
	if (renameat2(b->parent, b->partial_name, b->parent, b->dest_name,
		      RENAME_NOREPLACE) < 0)
		return -errno;
	return fsync_dir(b->parent);
}

/* --- the run -------------------------------------------------------------- */

/* Let this process open every file of a large store at once. */
static void raise_nofile(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

static int u64_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Remove from dir (DEST.partial's storage/ or files/) every file of ours
   (an m.N; a files/<ino>) whose id is not in ids[n] (sorted): a resumed
   run's DEST.partial holds what the interrupted run copied, and the
   store may have dropped some of it since (a purge, an altmove, a
   deleted plain file).  Left there, the backup failed check for an m.N
   its index does not know, and rebuild brought expunged mail back
   (helper-77).  Returns 0 or a negative errno. */
static int prune_dir(int dir_fd, bool mfiles, const uint64_t *ids, size_t n)
{
	int fd = dup(dir_fd), ret = 0;
	DIR *d = fd < 0 ? NULL : fdopendir(fd);
	struct dirent *de;

	if (d == NULL) {
		if (fd >= 0)
			close(fd);
		return -errno;
	}
	while ((de = readdir(d)) != NULL) {
		uint64_t id;
		uint32_t file_id;
		char *end;

		if (mfiles) {
			if (!dbox_mfile_parse_name(de->d_name, &file_id))
				continue;
			id = file_id;
		} else {
			if (de->d_name[0] < '0' || de->d_name[0] > '9')
				continue;
			errno = 0;
			id = strtoull(de->d_name, &end, 10);
			if (*end != '\0' || errno != 0)
				continue;
		}
		if (bsearch(&id, ids, n, sizeof(*ids), u64_cmp) == NULL &&
		    unlinkat(dir_fd, de->d_name, 0) < 0 && errno != ENOENT) {
			ret = -errno;
			break;
		}
	}
	closedir(d);
	return ret;
}

/* Only the snapshot's files in DEST.partial (prune_dir).  Returns 0 or
   a negative errno. */
static int prune_partial(struct bk *b, const struct dbox_index_snapshot *snap)
{
	uint64_t *ids = malloc((snap->nmfiles + snap->nfiles + 1) *
			       sizeof(*ids));
	int ret;

	if (ids == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < snap->nmfiles; i++)
		ids[i] = snap->mfiles[i].file_id;
	qsort(ids, snap->nmfiles, sizeof(*ids), u64_cmp);
	ret = prune_dir(b->part.storage, true, ids, snap->nmfiles);
	if (ret == 0) {
		if (snap->nfiles > 0)
			memcpy(ids, snap->files, snap->nfiles * sizeof(*ids));
		qsort(ids, snap->nfiles, sizeof(*ids), u64_cmp);
		ret = prune_dir(b->part.files, false, ids, snap->nfiles);
	}
	free(ids);
	return ret;
}

/* Every file of the snapshot into DEST.partial, then DEST in place. */
static int copy_all(struct bk *b, const struct dbox_index_snapshot *snap)
{
	for (size_t i = 0; i < snap->nmfiles + snap->nfiles && b->failed == 0;
	     i++) {
		char kind = i < snap->nmfiles ? 'm' : 'f';
		uint64_t id = kind == 'm' ? snap->mfiles[i].file_id :
			snap->files[i - snap->nmfiles];

		uint64_t size = kind == 'm' ? snap->mfiles[i].size : 0;

		/* An index whose committed end is short of its records
		   would make a backup without them that looks whole
		   (helper-83): the records are copied, and it is said. */
		if (kind == 'm' && (snap->mfiles[i].size_bad ||
				    snap->mfiles[i].records_end > size)) {
			bk_damage(b, DBOX_BACKUP_INDEX_SHORT, kind, id, size,
				  snap->mfiles[i].records_end);
			if (snap->mfiles[i].records_end > size)
				size = snap->mfiles[i].records_end;
		}
		if (bk_src_find(kind == 'm' ? &b->msrc : &b->fsrc, id) == NULL)
			bk_damage(b, DBOX_BACKUP_MISSING, kind, id, 0, 0);
		else
			bk_backup_file(b, kind, id, size);
	}
	if (b->failed == 0)
		b->failed = prune_partial(b, snap);
	if (b->failed == 0)
		b->failed = finish(b);
	if (b->failed != 0)
		dbox_error("%s: backup not finished (%s); %s is incomplete, "
			   "run the same command again to complete it",
			   b->dest, strerror(-b->failed), b->partial);
	return b->failed;
}

static int run(struct bk *b, const char *prev)
{
	struct dbox_index_snapshot snap = { 0 };
	struct timespec now;
	int ret;

	clock_gettime(CLOCK_REALTIME, &now);
	b->start_ns = bk_ts_ns(&now);
	raise_nofile();
	b->res->refused = true;
	if ((ret = src_open(b)) < 0 ||
	    (prev != NULL && (ret = prev_open(b, prev)) < 0) ||
	    (ret = partial_open(b)) < 0)
		return ret;
	if ((b->buf = malloc(BK_BUF_SIZE)) == NULL)
		return -ENOMEM;
	if ((ret = bk_take_snapshot(b, &snap)) < 0)
		return ret;
	b->last_mfile = snap.nmfiles > 0 ?
		snap.mfiles[snap.nmfiles - 1].file_id : 0;
	b->res->messages = snap.messages;
	b->res->mfiles = snap.nmfiles;
	b->res->plain_files = snap.nfiles;
	bk_hook(b, "snapshot");
	ret = copy_all(b, &snap);
	dbox_index_snapshot_free(&snap);
	if (ret == 0 && b->prev_named > 0 && b->prev_kin == 0)
		/* The common slip: --link-dest of another store's backups.
		   Not an error (everything was copied), but said. */
		dbox_warning("%s: none of its m.N is a copy of this store's "
			     "(a backup of another store, or of this one "
			     "before it was copied or restored): nothing "
			     "linked from it", prev);
	return ret;
}

int dbox_backup(struct dbox_view *src, const struct dbox_backup_settings *set,
		struct dbox_backup_result *res_r)
{
	struct bk b = {
		.set = set, .res = res_r, .view = src, .store = src->path,
		.src = { -1, -1, -1, -1 }, .part = { -1, -1, -1, -1 },
		.prevs = { -1, -1, -1, -1 }, .parent = -1,
	};
	const char *slash;
	size_t len = strlen(set->dest);
	int ret;

	memset(res_r, 0, sizeof(*res_r));
	while (len > 1 && set->dest[len - 1] == '/')
		len--;
	if ((b.dest = strndup(set->dest, len)) == NULL ||
	    asprintf(&b.partial, "%s.partial", b.dest) < 0) {
		free(b.dest);
		return -ENOMEM;
	}
	/* The names in DEST's directory (parent_open). */
	slash = strrchr(b.dest, '/');
	b.dest_name = slash != NULL ? slash + 1 : b.dest;
	slash = strrchr(b.partial, '/');
	b.partial_name = slash != NULL ? slash + 1 : b.partial;
	ret = run(&b, set->prev);
	if (b.manifest != NULL)
		fclose(b.manifest);
	bk_src_free(&b.msrc);
	bk_src_free(&b.fsrc);
	free(b.old.v);
	free(b.prevm.v);
	b.src.storage = b.src.alt = -1;   /* the view's */
	side_close(&b.src);
	side_close(&b.part);
	side_close(&b.prevs);
	if (b.parent >= 0)
		close(b.parent);
	free(b.buf);
	free(b.partial);
	free(b.dest);
	return ret;
}
