/*
 * backup-snapshot.c: steps 1-3 of a backup (backup.h): every file of the
 * source held open, the index copied as one snapshot, every file that
 * snapshot refers to open, again until none went missing in between.
 */
#include "engine/backup-private.h"
#include "engine/store-layout.h"

#include "storage/dbox-file.h"
#include "storage/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define PARTIAL_INDEX DBOX_STORE_INDEX ".partial"
#define SNAPSHOT_TRIES 10

static int src_cmp(const void *a, const void *b)
{
	const struct bk_src *x = a, *y = b;

	return x->id < y->id ? -1 : x->id > y->id;
}

struct bk_src *bk_src_find(struct bk_srctab *t, uint64_t id)
{
	struct bk_src key = { .id = id };

	return t->n == 0 ? NULL :
		bsearch(&key, t->v, t->n, sizeof(*t->v), src_cmp);
}

/* Open name in dir_fd for reading if it is a regular file, never
   following a symlink and never blocking (a FIFO planted in the store).
   Returns the fd, -ENOENT when it is gone, or another negative errno
   (-EINVAL: not a regular file). */
static int open_regular(int dir_fd, const char *name)
{
	struct stat st;
	int fd;

	/* No open() at all of a device node or FIFO (opening some devices
	   has side effects); the fstat below catches a swap in between. */
	if (fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode))
		return -EINVAL;
	fd = openat(dir_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
		    O_NOCTTY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return -EINVAL;
	}
	return fd;
}

/* Add an open fd for id (not in the table yet); keeps the table sorted
   when sort is set.  Returns 0 or -ENOMEM (fd closed). */
static int src_add(struct bk_srctab *t, uint64_t id, int fd, bool alt,
		   bool sort)
{
	if (bk_reserve((void **)&t->v, &t->size, t->n, sizeof(*t->v)) < 0) {
		close(fd);
		return -ENOMEM;
	}
	t->v[t->n++] = (struct bk_src){ id, fd, alt };
	if (sort)
		qsort(t->v, t->n, sizeof(*t->v), src_cmp);
	return 0;
}

/* Is the open s still the file named name in dir_fd?  A name that is gone
   counts as the same (the descriptor is what keeps it); one that now
   names another file (a file id handed out again after its m.N was
   purged and the store reopened) does not. */
static bool src_current(const struct bk_src *s, int dir_fd, const char *name)
{
	struct stat a, b;

	if (fstatat(dir_fd, name, &b, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT;
	return fstat(s->fd, &a) == 0 && a.st_dev == b.st_dev &&
		a.st_ino == b.st_ino;
}

/* Close and forget the open file s of t. */
static void src_drop(struct bk_srctab *t, struct bk_src *s)
{
	size_t i = (size_t)(s - t->v);

	close(s->fd);
	memmove(&t->v[i], &t->v[i + 1], (t->n - i - 1) * sizeof(*t->v));
	t->n--;
}

void bk_src_free(struct bk_srctab *t)
{
	for (size_t i = 0; i < t->n; i++)
		close(t->v[i].fd);
	free(t->v);
	memset(t, 0, sizeof(*t));
}

/* The id of a name in storage/ (m.N) or files/ (<ino>), or 0. */
static uint64_t name_id(char kind, const char *name)
{
	unsigned long long ino;
	uint32_t id;
	char *end;

	if (kind == 'm')
		return dbox_mfile_parse_name(name, &id) ? id : 0;
	if (name[0] < '1' || name[0] > '9')
		return 0;
	errno = 0;
	ino = strtoull(name, &end, 10);
	return *end == '\0' && errno == 0 ? ino : 0;
}

/* Step 1: open every file of dir_fd (storage/, ALT/storage/ when alt,
   or files/) not open yet.  Returns 0 or a negative errno (-EMFILE:
   more files than descriptors). */
static int open_all(struct bk_srctab *t, int dir_fd, char kind, bool alt)
{
	DIR *dir;
	struct dirent *d;
	int ret = 0;

	if (dir_fd < 0)
		return 0;
	if ((dir = fdopendir(dup(dir_fd))) == NULL)
		return -errno;
	rewinddir(dir);
	while (ret == 0 && (d = readdir(dir)) != NULL) {
		uint64_t id = name_id(kind, d->d_name);
		int fd;

		if (id == 0 || bk_src_find(t, id) != NULL)
			continue;
		fd = open_regular(dir_fd, d->d_name);
		if (fd == -EMFILE || fd == -ENFILE || fd == -ENOMEM)
			ret = fd;
		else if (fd >= 0)
			ret = src_add(t, id, fd, alt, false);
	}
	closedir(dir);
	if (t->n > 1)
		qsort(t->v, t->n, sizeof(*t->v), src_cmp);
	return ret;
}

/* Step 3: make sure id is open: in dir_fd, or else (an m.N) in alt_fd
   (-1: none).  Returns 0, -ENOENT when the file is gone (purged, or
   moved twice by altmove, since the snapshot), -EINVAL when it is no
   regular file, or another negative errno. */
static int open_one(struct bk_srctab *t, int dir_fd, int alt_fd, char kind,
		    uint64_t id)
{
	char name[32];
	bool alt = false;
	int fd = -ENOENT;

	if (bk_src_find(t, id) != NULL)
		return 0;
	bk_file_name(name, sizeof(name), kind, id);
	if (dir_fd >= 0)
		fd = open_regular(dir_fd, name);
	if (fd == -ENOENT && alt_fd >= 0) {
		fd = open_regular(alt_fd, name);
		alt = true;
	}
	if (fd < 0)
		return fd;
	return src_add(t, id, fd, alt, true);
}

/* A file of the snapshot, as one key: the kind in the top bit. */
#define MISSING_KEY(kind, id) ((kind) == 'm' ? (id) | (1ULL << 63) : (id))

/* The files missing from one snapshot. */
struct missing {
	uint64_t *keys;
	size_t n, size;
};

static bool key_in(const struct missing *m, uint64_t key)
{
	for (size_t i = 0; i < m->n; i++)
		if (m->keys[i] == key)
			return true;
	return false;
}

/* Step 3 for file i of snap (its m.N first, then its plain files).  A
   file not there (-ENOENT) is either gone since the snapshot (a purge,
   or a plain file removed) - *gone_r is set, and the caller takes
   another snapshot - or missing already in the previous attempt's
   snapshot (before): damage of the store, left for the copy to report;
   now collects the missing ones.  A file that is no regular file is left
   for the copy to report too.  Returns 0 or a negative errno. */
static int open_referenced_one(struct bk *b,
			       const struct dbox_index_snapshot *snap,
			       size_t i, const struct missing *before,
			       struct missing *now, bool *gone_r)
{
	char kind = i < snap->nmfiles ? 'm' : 'f';
	uint64_t id = kind == 'm' ? snap->mfiles[i].file_id :
		snap->files[i - snap->nmfiles];
	struct bk_srctab *t = kind == 'm' ? &b->msrc : &b->fsrc;
	int dir_fd = kind == 'm' ? b->src.storage : b->src.files;
	int alt_fd = kind == 'm' ? b->src.alt : -1;
	struct bk_src *open_src = bk_src_find(t, id);
	char name[32];
	int ret;

	bk_file_name(name, sizeof(name), kind, id);
	if (open_src != NULL &&
	    !src_current(open_src, open_src->alt ? alt_fd : dir_fd, name)) {
		/* Which of the two the snapshot means is unknown: take
		   another one with the file open anew. */
		src_drop(t, open_src);
		*gone_r = true;
		return 0;
	}
	ret = open_one(t, dir_fd, alt_fd, kind, id);
	if (ret == -EINVAL)
		return 0;
	if (ret != -ENOENT)
		return ret;
	if (!key_in(before, MISSING_KEY(kind, id)))
		*gone_r = true;
	if (bk_reserve((void **)&now->keys, &now->size, now->n,
		       sizeof(*now->keys)) < 0)
		return -ENOMEM;
	now->keys[now->n++] = MISSING_KEY(kind, id);
	return 0;
}

/* Step 3 for every file of snap; *missing: in, the files missing in the
   previous attempt; out, those missing in this one. */
static int open_referenced(struct bk *b,
			   const struct dbox_index_snapshot *snap,
			   struct missing *missing, bool *gone_r)
{
	struct missing now = { 0 };
	size_t total = snap->nmfiles + snap->nfiles;
	int ret = 0;

	*gone_r = false;
	for (size_t i = 0; i < total && ret == 0; i++)
		ret = open_referenced_one(b, snap, i, missing, &now, gone_r);
	free(missing->keys);
	*missing = now;
	return ret;
}

/* Log that step 1 or 3 could not open the store's files (err).  The
   backup holds one descriptor per m.N and plain file at once (that is
   what lets it survive a purge), and the soft limit was raised to the
   hard one already: on -EMFILE say so, with the numbers. */
static void open_failed(struct bk *b, int err)
{
	struct rlimit rl;

	if (err == -EMFILE && getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		dbox_error("%s: cannot open the store's files: %s (the backup "
			   "holds every m.N and plain file open at once: %zu "
			   "open so far, open files limit %llu; raise the hard "
			   "limit, e.g. ulimit -Hn, or purge the store to fewer "
			   "m.N)", b->store, strerror(-err),
			   b->msrc.n + b->fsrc.n,
			   (unsigned long long)rl.rlim_cur);
		return;
	}
	dbox_error("%s: cannot open the store's files: %s", b->store,
		   strerror(-err));
}

/* Step 2: the index copied to path, as one snapshot; what it held from
   an earlier attempt removed first. */
static int copy_index(struct bk *b, const char *path,
		      struct dbox_index_snapshot *snap)
{
	static const char *const sides[] = {
		PARTIAL_INDEX "-journal", PARTIAL_INDEX "-wal",
		PARTIAL_INDEX "-shm",
	};
	int ret;

	if (unlinkat(b->part.dir, PARTIAL_INDEX, 0) < 0 && errno != ENOENT) {
		ret = -errno;
		dbox_error("%s: %s", path, strerror(errno));
		return ret;
	}
	for (size_t i = 0; i < sizeof(sides) / sizeof(sides[0]); i++)
		unlinkat(b->part.dir, sides[i], 0);
	if ((ret = dbox_index_backup(b->view->index, path, snap)) < 0)
		dbox_error("%s: cannot copy the index: %s", b->store,
			   strerror(-ret));
	return ret;
}

/* One run of steps 1-3.  Returns 0 (*gone_r: take another snapshot) or a
   negative errno (logged). */
static int snapshot_once(struct bk *b, const char *path,
			 struct dbox_index_snapshot *snap,
			 struct missing *missing, bool *gone_r)
{
	int ret;

	if ((ret = open_all(&b->msrc, b->src.storage, 'm', false)) < 0 ||
	    (ret = open_all(&b->msrc, b->src.alt, 'm', true)) < 0 ||
	    (ret = open_all(&b->fsrc, b->src.files, 'f', false)) < 0) {
		open_failed(b, ret);
		return ret;
	}
	bk_hook(b, "opened");
	if ((ret = copy_index(b, path, snap)) < 0)
		return ret;
	bk_hook(b, "indexed");
	ret = open_referenced(b, snap, missing, gone_r);
	if (ret < 0) {
		open_failed(b, ret);
		dbox_index_snapshot_free(snap);
	}
	return ret;
}

int bk_take_snapshot(struct bk *b, struct dbox_index_snapshot *snap)
{
	struct missing missing = { 0 };
	unsigned int *tries = &b->res->snapshots;
	bool gone = true;
	char *path;
	int ret = 0;

	if ((path = bk_part_path(b, PARTIAL_INDEX)) == NULL)
		return -ENOMEM;
	for (*tries = 1; *tries <= SNAPSHOT_TRIES; ++*tries) {
		ret = snapshot_once(b, path, snap, &missing, &gone);
		if (ret < 0 || !gone)
			break;
		dbox_index_snapshot_free(snap);
	}
	free(missing.keys);
	free(path);
	if (ret == 0 && gone) {
		*tries = SNAPSHOT_TRIES;
		dbox_error("%s: files the index refers to kept disappearing "
			   "(%d snapshots tried); try again", b->store,
			   SNAPSHOT_TRIES);
		return -EAGAIN;
	}
	return ret;
}
