/*
 * backup.c: dboxadm backup STORE DEST [--link-dest=PREV] [--json] - a
 * consistent copy of a store, mounted or not, that is itself a store.
 *
 * One instant.  The copy holds what the index held at one read snapshot
 * (index-backup.h: SQLite's online backup API).  The m.N and plain files
 * that snapshot refers to must still be readable when they are copied,
 * although a purge (the mount's, or `dboxadm purge`) may unlink an m.N the
 * moment a later commit stops referring to it.  So, without any lock:
 *   1. every storage/m.N, ALT/storage/m.N (the alternate storage the
 *      index records) and files/<ino> on disk is opened (O_NOFOLLOW,
 *      regular files only) - an open descriptor keeps an unlinked file
 *      readable (file ids are unique across storage/ and ALT, so an m.N
 *      altmove moves meanwhile is the same file id in the other one);
 *   2. the index is copied as one snapshot;
 *   3. every file the snapshot refers to and step 1 did not see (created
 *      between 1 and 2) is opened now; if one is already gone (created and
 *      purged in that short window), steps 1-3 run again.
 * A file the snapshot refers to existed when the snapshot was taken (the
 * store unlinks an m.N only after the commit that stops referring to it),
 * so it was open after step 1 or is found in step 3.  Should a name have
 * come to mean another file since step 1 (a store reopened hands out the
 * id of a purged last m.N again), the file is opened anew and steps 1-3
 * run again too.  Purge is never blocked, and never blocks
 * the backup.  Each m.N is copied up to its committed end in the snapshot
 * (bytes past it belong to writes not committed then); a plain file as it
 * is when copied (plain files are not versioned by the index).  Finally
 * crash recovery runs on the copied index (messages being written at the
 * snapshot instant, and unlinked-while-open files, go), as the first mount
 * of a crashed store would.  DEST is self-contained: ALT m.N are copied
 * into DEST/storage/ and the copy's index forgets the alternate storage;
 * its inflight.m.N and kept.m.N marks go too (dbox_index_backup_detach:
 * every m.N is cut at its committed end, so nothing past it is in flight
 * or kept).  Neither lost+found/ nor index.sqlite-reserve is copied.
 *
 * Never a store that looks whole.  Everything is written into DEST.partial
 * with the index as index.sqlite.partial (so neither dboxfs nor `dboxadm
 * check` takes it for a store); only when every file is on disk is the
 * index renamed, recovered, and DEST.partial renamed to DEST.  A rerun
 * after a kill takes a new snapshot and keeps what the first run already
 * copied and still matches (DEST.partial/backup-manifest).
 *
 * Incremental.  DEST/backup-manifest lists every file copied with the
 * identity of its source (device, inode, size, mtime and ctime in ns) and
 * the length copied.  With --link-dest, an m.N whose source identity is
 * the one PREV's manifest recorded, that was copied whole, and whose ctime
 * was at least LINK_AGE_NS older than that backup's start (a write in the
 * same timestamp tick would not move ctime), is hard-linked from PREV
 * instead of copied.  Any write to the source (an append, the received
 * date rewritten in place by utimens, a cut by recovery) moves its ctime,
 * which the store owner cannot set.  The highest m.N of the snapshot is
 * always copied: a mount of the backup appends to that one.  Plain files
 * are always copied: a mount writes them in place.
 *
 * Hostile store.  Root on a user's store first becomes that user
 * (adm_store_enter), so DEST must be writable by the store's owner and
 * is theirs; files inside STORE are opened with O_NOFOLLOW and fstat()ed
 * to be regular files, lengths never exceed the real file, DEST files
 * are created 0600 by this process (no chown, no mode from the store),
 * and nothing in STORE is written.
 *
 * Descriptors.  Steps 1-3 hold one descriptor per m.N and plain file at
 * once (that is what survives a purge); the soft RLIMIT_NOFILE is raised
 * to the hard one first, and running out still fails clearly (-EMFILE
 * reported with the limit; DEST.partial is left for a rerun).
 */
#include "engine/store-layout.h"
#include "dboxadm.h"
#include "json.h"
#include "progress.h"

#include "index/index-backup.h"
#include "index/index-stats.h"
#include "index/index.h"
#include "storage/dbox-file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MANIFEST "backup-manifest"
#define MANIFEST_HEADER "dboxfs-backup 1\n"
#define PARTIAL_INDEX DBOX_STORE_INDEX ".partial"
/* A file whose ctime is this close to the backup's start may still change
   without its ctime moving (timestamps advance by the kernel's tick). */
#define LINK_AGE_NS (2LL * 1000000000)
#define SNAPSHOT_TRIES 10
#define COPY_TRIES 3
#define CHUNK ((size_t)8 << 20)

/* An open file of the source store: storage/m.<id> or files/<id>. */
struct src {
	uint64_t id;
	int fd;
	bool alt;              /* an m.N found in ALT/storage/ */
};

struct srctab {
	struct src *v;
	size_t n, size;
};

/* What a backup recorded about one file it wrote (one manifest line). */
struct ment {
	char kind;             /* 'm' m.N, 'f' plain file */
	uint64_t id;
	uint64_t len;          /* bytes in the backup */
	uint64_t dev, ino, size;   /* the source, fstat()ed before copying */
	int64_t mtime, ctime;
	int linkable;          /* a later backup may hard-link this copy */
};

struct manifest {
	struct ment *v;
	size_t n, size;
};

/* One side of the backup: a store directory and its storage/, files/,
   and (the source only) the alternate storage's ALT/storage/, or -1. */
struct side {
	int dir, storage, files, alt;
};

struct backup {
	const char *store, *dest, *prev;
	char *partial;
	bool json;
	bool dropped;          /* root became the store's owner */
	struct side src, part, prevs;
	struct srctab msrc, fsrc;
	struct manifest old, prevm;
	FILE *manifest;
	int64_t start_ns;
	uint32_t last_mfile;
	struct progress progress;
	unsigned int attempts;
	uint64_t copied, linked, kept;
	uint64_t bytes_copied, bytes_linked, bytes_kept;
	unsigned int source_errors;   /* damage of the source, reported */
	int failed;                   /* writing DEST failed: -errno */
};

static int64_t ts_ns(const struct timespec *ts)
{
	return (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec;
}

static int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts_ns(&ts);
}

/* Test hook: with DBOXADM_BACKUP_HOOK=DIR in the environment, stop at the
   named point: create DIR/<point>.reached, wait (at most a minute) for
   DIR/<point>.go.  Lets the mounted tests purge or kill at an exact step. */
static void hook(const char *point)
{
	const struct timespec tick = { 0, 10 * 1000 * 1000 };
	const char *dir = getenv("DBOXADM_BACKUP_HOOK");
	char *reached, *go;
	int fd;

	if (dir == NULL || asprintf(&reached, "%s/%s.reached", dir, point) < 0)
		return;
	if (asprintf(&go, "%s/%s.go", dir, point) < 0) {
		free(reached);
		return;
	}
	if ((fd = open(reached, O_WRONLY | O_CREAT | O_CLOEXEC, 0600)) >= 0)
		close(fd);
	for (int i = 0; i < 6000 && access(go, F_OK) < 0; i++)
		nanosleep(&tick, NULL);
	free(reached);
	free(go);
}

/* --- the table of open source files ------------------------------------ */

static int src_cmp(const void *a, const void *b)
{
	const struct src *x = a, *y = b;

	return x->id < y->id ? -1 : x->id > y->id;
}

static struct src *src_find(struct srctab *t, uint64_t id)
{
	struct src key = { .id = id };

	return t->n == 0 ? NULL :
		bsearch(&key, t->v, t->n, sizeof(*t->v), src_cmp);
}

/* Open name in dir_fd for reading if it is a regular file, never
   following a symlink and never blocking (a FIFO planted in the store).
   Returns the fd, -ENOENT when it is gone, or another -errno (-EINVAL: not
   a regular file). */
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
static int src_add(struct srctab *t, uint64_t id, int fd, bool alt,
		   bool sort)
{
	struct src *v = adm_grow(t->v, t->n, &t->size, sizeof(*v));

	if (v == NULL) {
		close(fd);
		return -ENOMEM;
	}
	t->v = v;
	v[t->n++] = (struct src){ id, fd, alt };
	if (sort)
		qsort(t->v, t->n, sizeof(*t->v), src_cmp);
	return 0;
}

/* Is the open s still the file named name in dir_fd?  A name that is gone
   counts as the same (the descriptor is what keeps it); one that now
   names another file (a file id handed out again after its m.N was
   purged and the store reopened) does not. */
static bool src_current(const struct src *s, int dir_fd, const char *name)
{
	struct stat a, b;

	if (fstatat(dir_fd, name, &b, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT;
	return fstat(s->fd, &a) == 0 && a.st_dev == b.st_dev &&
		a.st_ino == b.st_ino;
}

/* Close and forget the open file of id. */
static void src_drop(struct srctab *t, struct src *s)
{
	size_t i = (size_t)(s - t->v);

	close(s->fd);
	memmove(&t->v[i], &t->v[i + 1], (t->n - i - 1) * sizeof(*t->v));
	t->n--;
}

static void src_free(struct srctab *t)
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

static void file_name(char *buf, size_t size, char kind, uint64_t id)
{
	if (kind == 'm')
		dbox_file_name(buf, (uint32_t)id);
	else
		snprintf(buf, size, "%" PRIu64, id);
}

/* Step 1: open every file of dir_fd (storage/, ALT/storage/ when alt,
   or files/) not open yet.  Returns 0 or -errno (-EMFILE: more files
   than descriptors). */
static int open_all(struct srctab *t, int dir_fd, char kind, bool alt)
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

		if (id == 0)
			continue;
		if (src_find(t, id) != NULL)
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
   regular file, or another -errno. */
static int open_one(struct srctab *t, int dir_fd, int alt_fd, char kind,
		    uint64_t id)
{
	char name[32];
	bool alt = false;
	int fd = -ENOENT;

	if (src_find(t, id) != NULL)
		return 0;
	file_name(name, sizeof(name), kind, id);
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

/* --- manifests --------------------------------------------------------- */

static int ment_cmp(const void *a, const void *b)
{
	const struct ment *x = a, *y = b;

	if (x->kind != y->kind)
		return x->kind < y->kind ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

static const struct ment *ment_find(const struct manifest *m, char kind,
				    uint64_t id)
{
	struct ment key = { .kind = kind, .id = id };

	return m->n == 0 ? NULL :
		bsearch(&key, m->v, m->n, sizeof(*m->v), ment_cmp);
}

/* Read dir_fd/backup-manifest into *m (sorted).  A missing file is an
   empty manifest; lines that do not parse are skipped (so their files are
   copied again).  Returns 0, or -errno when the file exists but cannot be
   read, or does not start with the header (not ours). */
static int manifest_read(int dir_fd, struct manifest *m)
{
	char line[512];
	FILE *f;
	int fd;

	fd = openat(dir_fd, MANIFEST, O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
		    O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	if ((f = fdopen(fd, "r")) == NULL) {
		close(fd);
		return -errno;
	}
	if (fgets(line, sizeof(line), f) == NULL ||
	    strcmp(line, MANIFEST_HEADER) != 0) {
		fclose(f);
		return -EINVAL;
	}
	while (fgets(line, sizeof(line), f) != NULL) {
		struct ment e = { 0 };
		char kind, *v;
		int n = 0;

		if (sscanf(line, "%c %" SCNu64 " %" SCNu64 " %" SCNu64 " %"
			   SCNu64 " %" SCNu64 " %" SCNd64 " %" SCNd64 " %d%n",
			   &kind, &e.id, &e.len, &e.dev, &e.ino, &e.size,
			   &e.mtime, &e.ctime, &e.linkable, &n) != 9 ||
		    (kind != 'm' && kind != 'f') || line[n] != '\n')
			continue;
		e.kind = kind;
		if ((v = adm_grow(m->v, m->n, &m->size, sizeof(*m->v))) == NULL) {
			fclose(f);
			return -ENOMEM;
		}
		m->v = (struct ment *)v;
		m->v[m->n++] = e;
	}
	fclose(f);
	if (m->n > 1)
		qsort(m->v, m->n, sizeof(*m->v), ment_cmp);
	return 0;
}

static void ment_write(struct backup *b, const struct ment *e)
{
	fprintf(b->manifest, "%c %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64
		" %" PRIu64 " %" PRId64 " %" PRId64 " %d\n", e->kind, e->id,
		e->len, e->dev, e->ino, e->size, e->mtime, e->ctime,
		e->linkable);
	/* Each line after its file is on disk (fdatasync): a killed run's
	   manifest names only files a rerun can keep. */
	if (fflush(b->manifest) != 0 && b->failed == 0)
		b->failed = -errno;
}

/* Is the source (st) the very file e was copied from, unchanged? */
static bool same_source(const struct ment *e, const struct stat *st)
{
	return e->dev == (uint64_t)st->st_dev && e->ino == (uint64_t)st->st_ino &&
		e->size == (uint64_t)st->st_size &&
		e->mtime == ts_ns(&st->st_mtim) && e->ctime == ts_ns(&st->st_ctim);
}

/* Is dir_fd/name a regular file (not a symlink) of exactly len bytes? */
static bool has_copy(int dir_fd, const char *name, uint64_t len)
{
	struct stat st;

	return dir_fd >= 0 &&
		fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
		S_ISREG(st.st_mode) && (uint64_t)st.st_size == len;
}

/* --- copying ----------------------------------------------------------- */

/* Copy len bytes from in (from offset 0) to the new file out: in-kernel
   (copy_file_range: a reflink where the filesystem shares blocks) or by
   read/write.  Returns the bytes copied (fewer when in ended early), or
   -errno of a read or write error. */
static int64_t copy_bytes(struct backup *b, int in, int out, uint64_t len)
{
	static char buf[1 << 20];
	loff_t off_in = 0, off_out = 0;
	bool plain = false;

	while ((uint64_t)off_in < len) {
		size_t want = len - (uint64_t)off_in > CHUNK ? CHUNK :
			(size_t)(len - (uint64_t)off_in);
		ssize_t n;

		if (!plain) {
			n = copy_file_range(in, &off_in, out, &off_out, want, 0);
			if (n < 0 && (errno == EXDEV || errno == EINVAL ||
				      errno == ENOSYS || errno == EOPNOTSUPP)) {
				plain = true;
				continue;
			}
		} else {
			if (want > sizeof(buf))
				want = sizeof(buf);
			n = pread(in, buf, want, off_in);
			if (n > 0) {
				for (ssize_t done = 0; done < n;) {
					ssize_t w = pwrite(out, buf + done,
							   (size_t)(n - done),
							   off_out + done);
					if (w < 0) {
						if (errno == EINTR)
							continue;
						return -errno;
					}
					done += w;
				}
				off_in += n;
				off_out += n;
			}
		}
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			break; /* the source ended early */
		progress_add(&b->progress, 0, (uint64_t)n);
	}
	return off_in;
}

/* Copy len bytes of the source fd to dst_dir/name, replacing what is
   there (unlinked first: it may be a hard link into PREV).  The copy is on
   disk when this returns len.  Returns the bytes copied, or -errno. */
static int64_t copy_file(struct backup *b, int fd, int dst_dir,
			 const char *name, uint64_t len)
{
	int64_t n;
	int out;

	if (unlinkat(dst_dir, name, 0) < 0 && errno != ENOENT)
		return -errno;
	out = openat(dst_dir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW |
		     O_CLOEXEC, 0600);
	if (out < 0)
		return -errno;
	n = copy_bytes(b, fd, out, len);
	if (n >= 0 && fdatasync(out) < 0)
		n = -errno;
	if (close(out) < 0 && n >= 0)
		n = -errno;
	return n;
}

/* Back up one file: storage/m.<id> (committed = its committed end in the
   snapshot) or files/<id> (committed unused).  Keeps what an interrupted
   run wrote, links from PREV, or copies; records it in the manifest.
   Failures to write DEST go to b->failed; damage of the source is
   reported and counted. */
static void backup_file(struct backup *b, char kind, uint64_t id,
			uint64_t committed)
{
	int dst_dir = kind == 'm' ? b->part.storage : b->part.files;
	int prev_dir = kind == 'm' ? b->prevs.storage : b->prevs.files;
	struct src *s = src_find(kind == 'm' ? &b->msrc : &b->fsrc, id);
	const char *what = kind == 'm' ? DBOX_STORE_STORAGE : DBOX_STORE_FILES;
	const struct ment *e;
	struct ment rec = { .kind = kind, .id = id };
	struct stat st, st2;
	char name[32];
	uint64_t len;
	int64_t n = 0;
	bool last = kind == 'm' && id == b->last_mfile;

	file_name(name, sizeof(name), kind, id);
	if (s == NULL || fstat(s->fd, &st) < 0) {
		b->failed = -EIO; /* cannot happen: every file was opened */
		return;
	}
	len = (uint64_t)st.st_size;
	if (kind == 'm') {
		if (committed > len) {
			adm_warning("%s/storage/%s: %" PRIu64 " bytes, shorter than "
				    "its committed end %" PRIu64 " (copied as "
				    "it is; 'dboxadm check' names the messages "
				    "lost)", b->store, name, len, committed);
			b->source_errors++;
		} else {
			len = committed;
		}
	}
	rec.len = len;
	rec.dev = (uint64_t)st.st_dev;
	rec.ino = (uint64_t)st.st_ino;
	rec.size = (uint64_t)st.st_size;
	rec.mtime = ts_ns(&st.st_mtim);
	rec.ctime = ts_ns(&st.st_ctim);
	rec.linkable = len == (uint64_t)st.st_size &&
		rec.ctime + LINK_AGE_NS <= b->start_ns;

	/* What an interrupted run of this backup already wrote. */
	if (!last && (e = ment_find(&b->old, kind, id)) != NULL &&
	    same_source(e, &st) && e->len == len && has_copy(dst_dir, name, len)) {
		rec.linkable = e->linkable;
		b->kept++;
		b->bytes_kept += len;
		progress_add(&b->progress, 1, 0);
		ment_write(b, &rec);
		return;
	}
	/* The same bytes in the previous backup.  Only m.N: their committed
	   bytes never change, but a plain file of a mounted backup is
	   written in place, which would change it in PREV too. */
	if (kind == 'm' && !last && rec.linkable && (e = ment_find(&b->prevm, kind, id)) != NULL &&
	    e->linkable && same_source(e, &st) && e->len == len &&
	    has_copy(prev_dir, name, len)) {
		if (unlinkat(dst_dir, name, 0) < 0 && errno != ENOENT) {
			b->failed = -errno;
			return;
		}
		if (linkat(prev_dir, name, dst_dir, name, 0) == 0) {
			b->linked++;
			b->bytes_linked += len;
			progress_add(&b->progress, 1, 0);
			ment_write(b, &rec);
			return;
		}
		/* EXDEV, EMLINK, EPERM (protected_hardlinks): copy. */
	}
	for (int i = 0; i < COPY_TRIES; i++) {
		n = copy_file(b, s->fd, dst_dir, name, len);
		if (n < 0) {
			adm_error("%s/%s/%s: cannot copy %s/%s/%s there: %s",
				  b->partial, what, name, b->store, what, name,
				  strerror((int)-n));
			b->failed = (int)n;
			return;
		}
		if (fstat(s->fd, &st2) < 0 || !same_source(&rec, &st2)) {
			/* Written while copied: an m.N only past the
			   committed end (the copy is right, but not whole);
			   a plain file anywhere (copy again). */
			rec.linkable = 0;
			if (kind == 'f' && i + 1 < COPY_TRIES) {
				len = rec.len = rec.size = (uint64_t)st2.st_size;
				rec.mtime = ts_ns(&st2.st_mtim);
				rec.ctime = ts_ns(&st2.st_ctim);
				continue;
			}
			if (kind == 'f')
				adm_warning("%s/%s/%s: changed while it was "
					    "copied; the copy may mix old and "
					    "new bytes", b->store, what, name);
		}
		break;
	}
	if ((uint64_t)n < len) {
		adm_warning("%s/%s/%s: ended after %" PRId64 " of %" PRIu64
			    " bytes while it was copied", b->store, what, name,
			    n, len);
		b->source_errors++;
		rec.len = (uint64_t)n;
		rec.linkable = 0;
	}
	b->copied++;
	b->bytes_copied += (uint64_t)n;
	progress_add(&b->progress, 1, 0);
	ment_write(b, &rec);
	hook("copied");
}

/* --- setup and the steps ----------------------------------------------- */

static void side_close(struct side *s)
{
	if (s->storage >= 0)
		close(s->storage);
	if (s->files >= 0)
		close(s->files);
	if (s->alt >= 0)
		close(s->alt);
	if (s->dir >= 0)
		close(s->dir);
	s->dir = s->storage = s->files = s->alt = -1;
}

/* Open dir (a path given on the command line) and its storage/ and files/
   (no symlinks; a missing files/ is an empty one).  Returns 0 or -errno
   (reported). */
static int side_open(struct side *s, const char *dir)
{
	s->storage = s->files = s->alt = -1;
	s->dir = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (s->dir < 0) {
		adm_error("%s: %s", dir, strerror(errno));
		return -errno;
	}
	s->storage = openat(s->dir, DBOX_STORE_STORAGE, O_RDONLY | O_DIRECTORY |
			    O_NOFOLLOW | O_CLOEXEC);
	if (s->storage < 0) {
		adm_error("%s/storage: %s", dir, strerror(errno));
		return -errno;
	}
	s->files = openat(s->dir, DBOX_STORE_FILES, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
			  O_CLOEXEC);
	if (s->files < 0 && errno != ENOENT) {
		adm_error("%s/files: %s", dir, strerror(errno));
		return -errno;
	}
	return 0;
}

/* The manifest of this run: a new file, replacing the interrupted run's
   (whose lines are in b->old; a file kept from it is written again). */
static int manifest_create(struct backup *b)
{
	int fd;

	fd = openat(b->part.dir, MANIFEST ".new", O_WRONLY | O_CREAT | O_TRUNC |
		    O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0 || (b->manifest = fdopen(fd, "w")) == NULL ||
	    fputs(MANIFEST_HEADER, b->manifest) == EOF ||
	    fflush(b->manifest) != 0 ||
	    renameat(b->part.dir, MANIFEST ".new", b->part.dir, MANIFEST) < 0) {
		adm_error("%s/%s: %s", b->partial, MANIFEST, strerror(errno));
		if (b->manifest == NULL && fd >= 0)
			close(fd);
		return -EIO;
	}
	return 0;
}

/* Report errno on path (DEST or DEST.partial); when root dropped to the
   store's owner and was denied, say that DEST must be the owner's. */
static void dest_error(const struct backup *b, const char *path,
		       const char *what)
{
	int err = errno;

	if (b->dropped && (err == EACCES || err == EPERM))
		adm_error("%s: %s%s (dboxadm backs up another user's store as "
			  "that user, uid %u, the store's owner: DEST must be "
			  "in a directory that user may write)", path, what,
			  strerror(err), (unsigned)geteuid());
	else
		adm_error("%s: %s%s", path, what, strerror(err));
}

/* Create (or, from an interrupted run, reuse) DEST.partial.  Returns 0 or
   ADM_EXIT_USAGE after reporting why not. */
static int partial_open(struct backup *b)
{
	struct stat st;
	int ret;

	if (lstat(b->dest, &st) == 0) {
		adm_error("%s: exists; a backup goes to a new directory", b->dest);
		return ADM_EXIT_USAGE;
	}
	if (errno != ENOENT) {
		dest_error(b, b->dest, "");
		return ADM_EXIT_USAGE;
	}
	if (mkdir(b->partial, 0700) < 0 && errno != EEXIST) {
		dest_error(b, b->partial, "cannot create: ");
		return ADM_EXIT_USAGE;
	}
	b->part.dir = open(b->partial, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
			   O_CLOEXEC);
	if (b->part.dir < 0) {
		adm_error("%s: %s", b->partial, strerror(errno));
		return ADM_EXIT_USAGE;
	}
	/* One backup at a time into it (held until exit). */
	if (flock(b->part.dir, LOCK_EX | LOCK_NB) < 0) {
		adm_error("%s: %s", b->partial, errno == EWOULDBLOCK ?
			  "another dboxadm backup is writing it" :
			  strerror(errno));
		return ADM_EXIT_USAGE;
	}
	/* An existing DEST.partial must be one of ours. */
	if ((ret = manifest_read(b->part.dir, &b->old)) < 0) {
		adm_error("%s: exists and is no interrupted dboxadm backup (%s); "
			  "remove it or choose another DEST", b->partial,
			  ret == -EINVAL ? "bad " MANIFEST : strerror(-ret));
		return ADM_EXIT_USAGE;
	}
	if (faccessat(b->part.dir, MANIFEST, F_OK, AT_SYMLINK_NOFOLLOW) < 0) {
		DIR *d = fdopendir(dup(b->part.dir));
		struct dirent *de;
		bool empty = true;

		while (d != NULL && (de = readdir(d)) != NULL)
			if (strcmp(de->d_name, ".") != 0 &&
			    strcmp(de->d_name, "..") != 0)
				empty = false;
		if (d != NULL)
			closedir(d);
		if (!empty) {
			adm_error("%s: exists and is no interrupted dboxadm "
				  "backup; remove it or choose another DEST",
				  b->partial);
			return ADM_EXIT_USAGE;
		}
	} else if (b->old.n > 0) {
		adm_warning("%s: resuming an interrupted backup", b->partial);
	}
	/* From now on DEST.partial is recognisably ours, whenever this
	   run is killed. */
	if (manifest_create(b) < 0)
		return ADM_EXIT_FAILED;
	for (int i = 0; i < 2; i++) {
		const char *sub = i == 0 ? DBOX_STORE_STORAGE : DBOX_STORE_FILES;
		int *fd = i == 0 ? &b->part.storage : &b->part.files;

		if (mkdirat(b->part.dir, sub, 0700) < 0 && errno != EEXIST) {
			adm_error("%s/%s: %s", b->partial, sub, strerror(errno));
			return ADM_EXIT_USAGE;
		}
		*fd = openat(b->part.dir, sub, O_RDONLY | O_DIRECTORY |
			     O_NOFOLLOW | O_CLOEXEC);
		if (*fd < 0) {
			adm_error("%s/%s: %s", b->partial, sub, strerror(errno));
			return ADM_EXIT_USAGE;
		}
	}
	return 0;
}

/* A file of the snapshot, as one key: the kind in the top bit. */
#define MISSING_KEY(kind, id) ((kind) == 'm' ? (id) | (1ULL << 63) : (id))

static bool key_in(const uint64_t *keys, size_t n, uint64_t key)
{
	for (size_t i = 0; i < n; i++)
		if (keys[i] == key)
			return true;
	return false;
}

/* Step 3: open every file of snap not open yet.  A file not there
   (-ENOENT) is either gone since the snapshot (a purge, or a plain file
   removed) - *gone_r is set, and the caller takes another snapshot - or
   missing already in the previous attempt's snapshot: damage of the
   store, left for present() to report.  *missing / *nmissing: in, the
   files missing in the previous attempt; out, those missing in this one.
   A file that is no regular file is left for present() too.  Returns 0
   or -errno (-EMFILE, -ENOMEM, ...). */
static int open_referenced(struct backup *b,
			   const struct dbox_index_snapshot *snap,
			   uint64_t **missing, size_t *nmissing, bool *gone_r)
{
	uint64_t *now = NULL, *grown;
	size_t nnow = 0, total = snap->nmfiles + snap->nfiles;
	int ret = 0;

	*gone_r = false;
	for (size_t i = 0; i < total && ret == 0; i++) {
		char kind = i < snap->nmfiles ? 'm' : 'f';
		uint64_t id = kind == 'm' ? snap->mfiles[i].file_id :
			snap->files[i - snap->nmfiles];

		struct srctab *t = kind == 'm' ? &b->msrc : &b->fsrc;
		int dir_fd = kind == 'm' ? b->src.storage : b->src.files;
		int alt_fd = kind == 'm' ? b->src.alt : -1;
		struct src *open_src = src_find(t, id);
		char name[32];

		file_name(name, sizeof(name), kind, id);
		if (open_src != NULL &&
		    !src_current(open_src, open_src->alt ? alt_fd : dir_fd,
				 name)) {
			/* Which of the two the snapshot means is unknown:
			   take another one with the file open anew. */
			src_drop(t, open_src);
			*gone_r = true;
			continue;
		}
		ret = open_one(t, dir_fd, alt_fd, kind, id);
		if (ret == -EINVAL) {
			ret = 0;
		} else if (ret == -ENOENT) {
			ret = 0;
			if (!key_in(*missing, *nmissing, MISSING_KEY(kind, id)))
				*gone_r = true;
			grown = realloc(now, (nnow + 1) * sizeof(*now));
			if (grown == NULL) {
				ret = -ENOMEM;
				break;
			}
			now = grown;
			now[nnow++] = MISSING_KEY(kind, id);
		}
	}
	free(*missing);
	*missing = now;
	*nmissing = nnow;
	return ret;
}

/* Report that step 1 or 3 could not open the store's files (-errno).
   The backup holds one descriptor per m.N and plain file at once (that
   is what lets it survive a purge), and raise_nofile() already raised
   the soft limit to the hard one: on -EMFILE say so, with the numbers. */
static void report_open_failure(struct backup *b, int err)
{
	struct rlimit rl;

	if (err == -EMFILE && getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		adm_error("%s: cannot open the store's files: %s (the backup "
			  "holds every m.N and plain file open at once: %zu "
			  "open so far, open files limit %llu; raise the hard "
			  "limit, e.g. ulimit -Hn, or purge the store to fewer "
			  "m.N)", b->store, strerror(-err),
			  b->msrc.n + b->fsrc.n,
			  (unsigned long long)rl.rlim_cur);
		return;
	}
	adm_error("%s: cannot open the store's files: %s", b->store,
		  strerror(-err));
}

/* Steps 1-3 (see the top of the file).  Returns 0 with the index copied
   to DEST.partial/index.sqlite.partial and *snap filled, or an exit
   code after reporting. */
static int take_snapshot(struct backup *b, struct dbox_index *index,
			 struct dbox_index_snapshot *snap)
{
	uint64_t *missing = NULL;
	size_t nmissing = 0;
	char *path;
	int ret;

	if (asprintf(&path, "%s/" PARTIAL_INDEX, b->partial) < 0)
		return ADM_EXIT_FAILED;
	for (b->attempts = 1; b->attempts <= SNAPSHOT_TRIES; b->attempts++) {
		bool gone;

		if ((ret = open_all(&b->msrc, b->src.storage, 'm', false)) < 0 ||
		    (ret = open_all(&b->msrc, b->src.alt, 'm', true)) < 0 ||
		    (ret = open_all(&b->fsrc, b->src.files, 'f', false)) < 0) {
			report_open_failure(b, ret);
			free(path);
			return ADM_EXIT_FAILED;
		}
		hook("opened");
		if (unlinkat(b->part.dir, PARTIAL_INDEX, 0) < 0 &&
		    errno != ENOENT) {
			adm_error("%s: %s", path, strerror(errno));
			free(path);
			return ADM_EXIT_FAILED;
		}
		unlinkat(b->part.dir, PARTIAL_INDEX "-journal", 0);
		unlinkat(b->part.dir, PARTIAL_INDEX "-wal", 0);
		unlinkat(b->part.dir, PARTIAL_INDEX "-shm", 0);
		if ((ret = dbox_index_backup(index, path, snap)) < 0) {
			adm_error("%s: cannot copy the index: %s", b->store,
				  strerror(-ret));
			free(path);
			return ADM_EXIT_FAILED;
		}
		hook("indexed");
		ret = open_referenced(b, snap, &missing, &nmissing, &gone);
		if (ret < 0) {
			report_open_failure(b, ret);
			free(missing);
			free(path);
			return ADM_EXIT_FAILED;
		}
		if (!gone)
			break;
		dbox_index_snapshot_free(snap);
	}
	free(missing);
	free(path);
	if (b->attempts > SNAPSHOT_TRIES) {
		adm_error("%s: files the index refers to kept disappearing "
			  "(%d snapshots tried); try again", b->store,
			  SNAPSHOT_TRIES);
		return ADM_EXIT_FAILED;
	}
	return 0;
}

/* A file of the snapshot that is not a regular file in the store, or
   missing: reported, and left out (check on the backup then names it, as
   on the store). */
static bool present(struct backup *b, char kind, uint64_t id)
{
	char name[32];

	if (src_find(kind == 'm' ? &b->msrc : &b->fsrc, id) != NULL)
		return true;
	file_name(name, sizeof(name), kind, id);
	adm_warning("%s/%s/%s: in the index, but not a readable regular file; "
		    "not in the backup", b->store,
		    kind == 'm' ? DBOX_STORE_STORAGE : DBOX_STORE_FILES, name);
	b->source_errors++;
	return false;
}

/* Crash recovery on the copied index (dbox_index_recover), as the first
   mount of the backup would run it. */
static int recover_copy(struct backup *b)
{
	struct dbox_index *index = NULL;
	unsigned int writing = 0, orphans = 0;
	uint64_t *files = NULL;
	size_t nfiles = 0;
	char *path;
	int ret;

	if (asprintf(&path, "%s/" DBOX_STORE_INDEX, b->partial) < 0)
		return -ENOMEM;
	ret = dbox_index_open(path, false, &index);
	free(path);
	if (ret == 0)
		ret = dbox_index_backup_detach(index);
	if (ret == 0)
		ret = dbox_index_recover(index, &writing, &orphans, &files,
					 &nfiles);
	for (size_t i = 0; ret == 0 && i < nfiles; i++) {
		char name[32];

		snprintf(name, sizeof(name), "%" PRIu64, files[i]);
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
static int finish(struct backup *b)
{
	char *parent, *slash;
	int ret = 0, pfd;

	if (fflush(b->manifest) != 0 || fsync(fileno(b->manifest)) < 0)
		return -errno;
	/* A WAL or journal left by a run killed in recover_copy() belongs
	   to the old copy; SQLite would apply it to the new one. */
	for (int i = 0; i < 3; i++) {
		static const char *const side_files[] = {
			DBOX_STORE_INDEX "-wal", DBOX_STORE_INDEX "-shm",
			DBOX_STORE_INDEX "-journal",
		};

		if (unlinkat(b->part.dir, side_files[i], 0) < 0 && errno != ENOENT)
			return -errno;
	}
	if (renameat(b->part.dir, PARTIAL_INDEX, b->part.dir, DBOX_STORE_INDEX) < 0)
		return -errno;
	if ((ret = recover_copy(b)) < 0)
		return ret;
	if ((ret = fsync_dir(b->part.storage)) < 0 ||
	    (ret = fsync_dir(b->part.files)) < 0 ||
	    (ret = fsync_dir(b->part.dir)) < 0)
		return ret;
	/* Never onto something that appeared meanwhile (rename() would
	   replace an empty directory). */
	if (renameat2(AT_FDCWD, b->partial, AT_FDCWD, b->dest,
		      RENAME_NOREPLACE) < 0)
		return -errno;
	if ((parent = strdup(b->dest)) == NULL)
		return -ENOMEM;
	slash = strrchr(parent, '/');
	if (slash == parent)
		slash[1] = '\0';
	else if (slash != NULL)
		*slash = '\0';
	pfd = open(slash != NULL ? parent : ".", O_RDONLY | O_DIRECTORY |
		   O_CLOEXEC);
	free(parent);
	if (pfd >= 0) {
		ret = fsync_dir(pfd);
		close(pfd);
	}
	return ret;
}

static void print_summary(struct backup *b,
			  const struct dbox_index_snapshot *snap, double secs)
{
	if (b->json) {
		printf("{\"store\": ");
		adm_json_string(stdout, b->store);
		printf(", \"dest\": ");
		adm_json_string(stdout, b->dest);
		printf(", \"messages\": %" PRIu64 ", \"mfiles\": %zu, "
		       "\"plain_files\": %zu, \"files_copied\": %" PRIu64
		       ", \"files_linked\": %" PRIu64 ", \"files_kept\": %"
		       PRIu64 ", \"bytes_copied\": %" PRIu64
		       ", \"bytes_linked\": %" PRIu64 ", \"bytes_kept\": %"
		       PRIu64 ", \"snapshots\": %u, \"source_errors\": %u, "
		       "\"seconds\": %.3f}\n", snap->messages, snap->nmfiles,
		       snap->nfiles, b->copied, b->linked, b->kept,
		       b->bytes_copied, b->bytes_linked, b->bytes_kept,
		       b->attempts, b->source_errors, secs);
		return;
	}
	printf("backed up %s to %s: %" PRIu64 " messages in %zu m.N files, "
	       "%zu plain files\n"
	       "copied   %" PRIu64 " files, %" PRIu64 " bytes\n"
	       "linked   %" PRIu64 " files, %" PRIu64 " bytes (from %s)\n",
	       b->store, b->dest, snap->messages, snap->nmfiles, snap->nfiles,
	       b->copied, b->bytes_copied, b->linked, b->bytes_linked,
	       b->prev != NULL ? b->prev : "no --link-dest");
	if (b->kept > 0)
		printf("kept     %" PRIu64 " files, %" PRIu64 " bytes (from the "
		       "interrupted run)\n", b->kept, b->bytes_kept);
	printf("seconds  %.3f\n", secs);
}

/* Let this process open every file of a large store at once. */
static void raise_nofile(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

static int run_backup(struct backup *b)
{
	struct dbox_index_snapshot snap = { 0 };
	struct dbox_index *index = NULL;
	struct timespec now;
	struct stat st;
	int64_t t0 = mono_ns();
	int ret;

	clock_gettime(CLOCK_REALTIME, &now);
	b->start_ns = ts_ns(&now);
	raise_nofile();
	if (side_open(&b->src, b->store) < 0)
		return ADM_EXIT_USAGE;
	if (fstatat(b->src.dir, DBOX_STORE_INDEX, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
	    !S_ISREG(st.st_mode)) {
		adm_error("%s: not a dbox store (no index.sqlite, or not a "
			  "regular file)", b->store);
		return ADM_EXIT_USAGE;
	}
	if (b->prev != NULL) {
		if (side_open(&b->prevs, b->prev) < 0)
			return ADM_EXIT_USAGE;
		if ((ret = manifest_read(b->prevs.dir, &b->prevm)) < 0 ||
		    faccessat(b->prevs.dir, MANIFEST, F_OK, AT_SYMLINK_NOFOLLOW) < 0) {
			adm_error("%s: not a finished dboxadm backup (no %s)",
				  b->prev, MANIFEST);
			return ADM_EXIT_USAGE;
		}
	}
	if ((ret = partial_open(b)) != 0)
		return ret;
	if ((ret = adm_open_index(b->store, &index)) != 0)
		return ret;
	/* Where its m.N may also be (-1: none recorded; or one that cannot
	   be opened, reported: its m.N are then missing from the backup,
	   which says so). */
	b->src.alt = adm_open_alt_storage(b->store, index);
	ret = take_snapshot(b, index, &snap);
	dbox_index_close(&index);
	if (ret != 0)
		return ret;
	b->last_mfile = snap.nmfiles > 0 ?
		snap.mfiles[snap.nmfiles - 1].file_id : 0;
	hook("snapshot");
	progress_init(&b->progress, "backed up");
	b->progress.unit = "files";
	for (size_t i = 0; i < snap.nmfiles && b->failed == 0; i++)
		if (present(b, 'm', snap.mfiles[i].file_id))
			backup_file(b, 'm', snap.mfiles[i].file_id,
				    snap.mfiles[i].size);
	for (size_t i = 0; i < snap.nfiles && b->failed == 0; i++)
		if (present(b, 'f', snap.files[i]))
			backup_file(b, 'f', snap.files[i], 0);
	progress_finish(&b->progress);
	if (b->failed == 0)
		b->failed = finish(b);
	if (b->failed != 0) {
		adm_error("%s: backup not finished (%s); %s is incomplete, "
			  "run the same command again to complete it", b->dest,
			  strerror(-b->failed), b->partial);
		dbox_index_snapshot_free(&snap);
		return ADM_EXIT_FAILED;
	}
	print_summary(b, &snap, (mono_ns() - t0) / 1e9);
	dbox_index_snapshot_free(&snap);
	if (fflush(stdout) != 0)
		return ADM_EXIT_FAILED;
	return b->source_errors > 0 ? ADM_EXIT_FAILED : ADM_EXIT_OK;
}

static int backup_main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "link-dest", required_argument, NULL, 'l' },
		{ "json", no_argument, NULL, 'j' },
		{ 0 },
	};
	struct backup b = {
		.src = { -1, -1, -1, -1 }, .part = { -1, -1, -1, -1 },
		.prevs = { -1, -1, -1, -1 },
	};
	size_t len;
	int c, ret;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 'l')
			b.prev = optarg;
		else if (c == 'j')
			b.json = true;
		else
			return adm_usage_error(&adm_verb_backup,
					       "backup: unknown option or "
					       "missing value '%s'",
					       argv[optind - 1]);
	}
	if (argc - optind != 2)
		return adm_usage_error(&adm_verb_backup,
				       "backup: need STORE and DEST");
	b.store = argv[optind];
	b.dest = argv[optind + 1];
	/* As the store's owner (root on a user's store drops to them for
	   good): everything read is what they may read, DEST is theirs. */
	b.dropped = geteuid() == 0;
	if ((ret = adm_store_enter(b.store)) != ADM_EXIT_OK)
		return ret;
	b.dropped = b.dropped && geteuid() != 0;
	len = strlen(b.dest);
	while (len > 1 && b.dest[len - 1] == '/')
		len--;
	if (asprintf(&b.partial, "%.*s.partial", (int)len, b.dest) < 0)
		return ADM_EXIT_FAILED;
	argv[optind + 1][len] = '\0';
	ret = run_backup(&b);
	if (b.manifest != NULL)
		fclose(b.manifest);
	src_free(&b.msrc);
	src_free(&b.fsrc);
	free(b.old.v);
	free(b.prevm.v);
	side_close(&b.src);
	side_close(&b.part);
	side_close(&b.prevs);
	free(b.partial);
	return ret;
}

const struct adm_verb adm_verb_backup = {
	.name = "backup",
	.summary = "a consistent, incremental copy of a store (mounted or not)",
	.usage =
	"usage: dboxadm backup STORE DEST [--link-dest=PREV] [--json]\n"
	"\n"
	"Copy STORE to the new directory DEST as it was at one instant: the\n"
	"index with SQLite's online backup, each storage/m.N up to its\n"
	"committed end, the plain files of files/.  Works while STORE is\n"
	"mounted and written to, and beside a purge; takes no lock.  DEST is a\n"
	"self-contained store (m.N of the alternate storage are copied into\n"
	"DEST/storage/): mount it, or copy it back, to restore.  Run by root on\n"
	"a user's store, it runs as that user: DEST must be writable by them.\n"
	"\n"
	"The work is done in DEST.partial, renamed to DEST at the end; an\n"
	"interrupted backup is completed by running the same command again.\n"
	"\n"
	"  --link-dest=PREV  hard-link files unchanged since the backup PREV\n"
	"                    (on the same filesystem) instead of copying them\n"
	"  --json            print the summary as one JSON object\n"
	"\n"
	"Exit status: 0 done, 1 the backup failed (DEST.partial is left) or the\n"
	"store has damaged files (the backup holds them as they are), 2 usage\n"
	"error or store refused.\n",
	.run = backup_main,
};
