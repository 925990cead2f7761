/*
 * backup-manifest.c: DEST/backup-manifest, the list of what a backup
 * wrote, one line a file: kind ('m' or 'f'), id, bytes in the backup, the
 * source's device, inode, size, mtime and ctime (ns), whether a later
 * backup may hard-link the copy, and the copy's own mtime (ns; missing
 * in manifests from before 2026-12-07) (backup.h, Incremental).  A line is
 * written after its file is on disk, so a killed run's manifest names
 * only files a rerun can keep.
 */
#include "engine/backup-private.h"

#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int ment_cmp(const void *a, const void *b)
{
	const struct bk_ment *x = a, *y = b;

	if (x->kind != y->kind)
		return x->kind < y->kind ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

const struct bk_ment *bk_manifest_find(const struct bk_manifest *m,
				       char kind, uint64_t id)
{
	struct bk_ment key = { .kind = kind, .id = id };

	return m->n == 0 ? NULL :
		bsearch(&key, m->v, m->n, sizeof(*m->v), ment_cmp);
}

/* One line into *e; false when it does not parse. */
static bool parse_line(const char *line, struct bk_ment *e)
{
	char kind;
	int n = 0;

	memset(e, 0, sizeof(*e));
	if (sscanf(line, "%c %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64
		   " %" SCNu64 " %" SCNd64 " %" SCNd64 " %d%n", &kind, &e->id,
		   &e->len, &e->dev, &e->ino, &e->size, &e->mtime, &e->ctime,
		   &e->linkable, &n) != 9 ||
	    (kind != 'm' && kind != 'f'))
		return false;
	e->copy_mtime = -1;
	if (line[n] == ' ') {
		int more = 0;

		if (sscanf(line + n, " %" SCNd64 "%n", &e->copy_mtime,
			   &more) != 1)
			return false;
		n += more;
	}
	if (line[n] != '\n')
		return false;
	e->kind = kind;
	return true;
}

int bk_manifest_read(int dir_fd, struct bk_manifest *m)
{
	char line[512];
	FILE *f;
	int fd;

	fd = openat(dir_fd, DBOX_BACKUP_MANIFEST, O_RDONLY | O_NOFOLLOW |
		    O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	if ((f = fdopen(fd, "r")) == NULL) {
		close(fd);
		return -errno;
	}
	if (fgets(line, sizeof(line), f) == NULL ||
	    strcmp(line, BK_MANIFEST_HEADER) != 0) {
		fclose(f);
		return -EINVAL;
	}
	while (fgets(line, sizeof(line), f) != NULL) {
		struct bk_ment e;

		if (!parse_line(line, &e))
			continue;
		if (bk_reserve((void **)&m->v, &m->size, m->n,
			       sizeof(*m->v)) < 0) {
			fclose(f);
			return -ENOMEM;
		}
		m->v[m->n++] = e;
	}
	fclose(f);
	if (m->n > 1)
		qsort(m->v, m->n, sizeof(*m->v), ment_cmp);
	return 0;
}

int bk_manifest_create(struct bk *b)
{
	static const char tmp[] = DBOX_BACKUP_MANIFEST ".new";
	int fd;

	/* A new file (whatever a killed run left is removed first): never
	   an existing node, a FIFO whose open would wait included. */
	if (unlinkat(b->part.dir, tmp, 0) < 0 && errno != ENOENT)
		fd = -1;
	else
		fd = openat(b->part.dir, tmp, O_WRONLY | O_CREAT | O_EXCL |
			    O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0 || (b->manifest = fdopen(fd, "w")) == NULL ||
	    fputs(BK_MANIFEST_HEADER, b->manifest) == EOF ||
	    fflush(b->manifest) != 0 ||
	    renameat(b->part.dir, tmp, b->part.dir, DBOX_BACKUP_MANIFEST) < 0) {
		int ret = -errno;

		dbox_error("%s/%s: %s", b->partial, DBOX_BACKUP_MANIFEST,
			   strerror(errno));
		if (b->manifest == NULL && fd >= 0)
			close(fd);
		return ret < 0 ? ret : -EIO;
	}
	return 0;
}

void bk_manifest_add(struct bk *b, const struct bk_ment *e)
{
	fprintf(b->manifest, "%c %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64
		" %" PRIu64 " %" PRId64 " %" PRId64 " %d %" PRId64 "\n",
		e->kind, e->id, e->len, e->dev, e->ino, e->size, e->mtime,
		e->ctime, e->linkable, e->copy_mtime);
	if (fflush(b->manifest) != 0 && b->failed == 0)
		b->failed = -errno;
}

bool bk_same_source(const struct bk_ment *e, const struct stat *st)
{
	return e->dev == (uint64_t)st->st_dev &&
		e->ino == (uint64_t)st->st_ino &&
		e->size == (uint64_t)st->st_size &&
		e->mtime == bk_ts_ns(&st->st_mtim) &&
		e->ctime == bk_ts_ns(&st->st_ctim);
}
