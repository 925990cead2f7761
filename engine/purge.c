/*
 * purge.c: which m.N a purge or altmove takes, and in what order
 * (purge.h): the files of the index, or those asked for, each checked
 * (dead bytes past the threshold, no save owning it) and sealed, then
 * purged fewest live bytes first (purge-file.c); a full purge also
 * removes m.N files the index does not know.
 */
#include "engine/store-layout.h"
#include "engine/purge-private.h"

#include "index/index-purge.h"
#include "storage/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


bool purge_in_pool(const struct dbox_store *st, uint32_t file_id)
{
	for (size_t i = 0; i < st->append_count; i++)
		if (st->append[i]->file_id == file_id)
			return true;
	return false;
}


/* Does storage/name hold a whole record of a message the index does not
   have?  Such records are messages of an index newer than this one
   (recovery kept them for 'dboxadm rebuild'), not garbage; copies of
   messages the index has (a crash between a purge's switch and its
   unlink) are. */
static bool holds_records(struct dbox_store *st, int dir_fd, const char *name,
			  uint32_t id)
{
	int fd = openat(dir_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
		    O_CLOEXEC);
	bool ret = fd < 0 || dbox_store_unknown_records(st, fd, id) != 0;

	if (fd >= 0)
		close(fd);
	return ret;
}

/* Remove m.N files that the index does not know, that no save owns and
   that no message row points into: a file left after a crash between a
   purge's switch and its unlink (recovery cut it to its header), or after
   an import batch that never committed.  Needs st->lock. */
static void remove_garbage_files(struct purge *p, bool alt)
{
	struct dbox_store *st = p->st;
	int dir_fd = alt ? st->alt_fd : st->storage_fd;
	DIR *dir = dir_fd >= 0 ? fdopendir(dup(dir_fd)) : NULL;
	struct dirent *de;
	uint64_t size;
	uint32_t id;

	if (dir == NULL)
		return;
	rewinddir(dir);
	while ((de = readdir(dir)) != NULL) {
		struct stat sb;

		if (!dbox_mfile_parse_name(de->d_name, &id) ||
		    dbox_index_mfile_get(st->index, id, &size) != -ENOENT ||
		    purge_in_pool(st, id) ||
		    dbox_index_file_has_records(st->index, id) != 0 ||
		    fstatat(dir_fd, de->d_name, &sb, 0) < 0 ||
		    holds_records(st, dir_fd, de->d_name, id))
			continue;
		dbox_store_read_fd_forget(st, id);
		if (unlinkat(dir_fd, de->d_name, 0) == 0) {
			dbox_info("%s/" DBOX_STORE_STORAGE "/%s: not in the index; removed",
				  dbox_store_dir_name(st, alt), de->d_name);
			(void)dbox_store_purged_forget(st->index, id);
			p->res->garbage_files++;
			p->res->bytes_freed += (uint64_t)sb.st_size;
		}
	}
	closedir(dir);
}

struct candidates {
	uint32_t *ids;
	size_t count, size;
};

static int collect_cb(void *ctx, uint32_t file_id, uint64_t size)
{
	struct candidates *c = ctx;

	if (c->count == c->size) {
		size_t n = c->size == 0 ? 64 : c->size * 2;
		uint32_t *ids = realloc(c->ids, n * sizeof(*ids));

		if (ids == NULL)
			return -ENOMEM;
		c->ids = ids;
		c->size = n;
	}
	c->ids[c->count++] = file_id;
	return 0;
}

/* Does m.<file_id> need a purge under the settings?  Needs st->lock.
   Returns 1 yes (*live_r: its live bytes), 0 no, -EBUSY when a save owns
   it, or an error. */
static int wanted(struct purge *p, uint32_t file_id, uint64_t *live_r)
{
	struct dbox_store *st = p->st;
	struct dbox_file_usage u;
	uint64_t dead, data;
	size_t header_len;
	int fd, ret;

	if ((ret = dbox_index_file_usage(st->index, file_id, &u)) < 0)
		return ret == -ENOENT ? 0 : ret;
	if (u.writing > 0)
		return -EBUSY;
	if (p->set->sealed_only && purge_in_pool(st, file_id))
		return 0;
	if ((fd = dbox_store_read_fd(st, file_id)) < 0)
		return fd;
	if (dbox_file_read_header(fd, &header_len) < 0) {
		dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u: unreadable file header; not "
			   "purged", dbox_store_mfile_root(st, file_id), file_id);
		return -EIO;
	}
	data = u.committed > header_len ? u.committed - header_len : 0;
	dead = data > u.live_bytes ? data - u.live_bytes : 0;
	if (dead == 0 || dead * 100 < (uint64_t)p->set->threshold * data)
		return 0;
	*live_r = u.live_bytes;
	return 1;
}

struct candidate {
	uint32_t file_id;
	uint64_t live;
};

static int candidate_cmp(const void *a, const void *b)
{
	const struct candidate *x = a, *y = b;

	if (x->live != y->live)
		return x->live < y->live ? -1 : 1;
	return x->file_id < y->file_id ? -1 : x->file_id > y->file_id;
}

/* Purge judges a record garbage when no row names it, so every committed
   row must name a place inside a known m.N: a row a damaged index moved
   elsewhere (helper-75: file_id 77) would leave its real record looking
   expunged, and the purge of its file would destroy the one copy of the
   message.  The scan (about 0.5 s per million messages) reads a snapshot
   through a connection of its own, so a mount goes on serving; rows the
   mount changes meanwhile it keeps in place.  Returns 0, or -EUCLEAN
   (logged) when a row is out of place, or the open's or scan's errno.
   Without the lock. */
static int rows_in_place(struct dbox_store *st)
{
	struct dbox_index *index = NULL;
	uint64_t ino, file_id;
	int ret;

	dbox_store_assert_unlocked(st);
	if ((ret = dbox_index_open_readonly(st->index_path, &index)) < 0)
		return ret;
	ret = dbox_index_misplaced_row(index, &ino, &file_id);
	dbox_index_close(&index);
	if (ret <= 0)
		return ret;
	dbox_error("%s: the index places message inode %llu in m.%llu, outside "
		   "every m.N it knows: the index is damaged, and a purge "
		   "would take that message's record for garbage; nothing "
		   "purged (run 'dboxadm check %s', then 'dboxadm rebuild')",
		   st->path, (unsigned long long)ino,
		   (unsigned long long)file_id, st->path);
	return -EUCLEAN;
}

int dbox_purge(struct dbox_store *st, const struct dbox_purge_settings *set,
	       struct dbox_purge_result *res_r)
{
	struct purge p = { .st = st, .set = set, .res = res_r };
	struct candidates c = { 0 };
	struct candidate *todo = NULL;
	size_t n = 0;
	int ret = 0, first_failure = 0, r;

	dbox_store_assert_unlocked(st); /* taken as needed */
	memset(res_r, 0, sizeof(*res_r));
	res_r->start_ns = dbox_now_ns();
	if ((p.buf = malloc(COPY_SIZE)) == NULL)
		return res_r->error = -ENOMEM;
	if (set->check_rows && (ret = rows_in_place(st)) < 0) {
		free(p.buf);
		return res_r->error = ret;
	}
	purge_lock(&p);
	if (set->only == NULL) {
		ret = dbox_index_mfile_list(st->index, collect_cb, &c);
		if (!set->altmove) {
			remove_garbage_files(&p, false);
			remove_garbage_files(&p, true);
		}
	} else {
		for (size_t i = 0; i < set->only_count && ret == 0; i++)
			ret = collect_cb(&c, set->only[i], 0);
	}
	purge_unlock(&p);
	/* Seal every file to purge before copying anything, so no copy goes
	   to a file that is purged later in this run.  The lock is taken per
	   file: the mount keeps serving between them. */
	if (c.count > 0 && (todo = calloc(c.count, sizeof(*todo))) == NULL)
		ret = -ENOMEM;
	for (size_t i = 0; ret == 0 && i < c.count; i++) {
		uint64_t live = 0;
		bool alt = false;

		purge_lock(&p);
		if (set->altmove) {
			/* Not sealed: its committed records are copied, the
			   rows switched; the file goes only when empty. */
			r = dbox_store_mfile_dir(st, c.ids[i], &alt) >= 0 &&
				!alt ? 1 : 0;
			purge_unlock(&p);
			if (r == 1)
				todo[n++] = (struct candidate){ c.ids[i], 0 };
			continue;
		}
		r = wanted(&p, c.ids[i], &live);
		if (r == 1)
			r = dbox_store_mfile_seal(st, c.ids[i]) < 0 ? -EBUSY : 1;
		purge_unlock(&p);
		if (r == 0)
			continue;
		if (r == -EBUSY) {
			res_r->files_busy++;
		} else if (r < 0) {
			res_r->files_failed++;
			if (first_failure == 0)
				first_failure = r;
		} else
			todo[n++] = (struct candidate){ c.ids[i], live };
	}
	/* Fewest live bytes first: a file with none needs no room for
	   copies, and on a full disk it makes the room the others need. */
	if (n > 0)
		qsort(todo, n, sizeof(*todo), candidate_cmp);

	for (size_t i = 0; ret == 0 && i < n; i++) {
		r = purge_file(&p, todo[i].file_id);
		if (r == -ECANCELED) {
			ret = r;
		} else if (r < 0) {
			res_r->files_failed++;
			if (first_failure == 0)
				first_failure = r;
		}
	}
	/* A full disk says so (ENOSPC), not a bare EIO. */
	if (ret == 0 && res_r->files_failed > 0)
		ret = first_failure;
	res_r->end_ns = dbox_now_ns();
	res_r->error = ret;
	for (size_t i = 0; i < p.nalts; i++) {
		close(p.alts[i]->fd);
		free(p.alts[i]);
	}
	free(p.alts);
	free(c.ids);
	free(todo);
	free(p.dests);
	free(p.buf);
	return ret;
}

/* The move, then the files it left with dead bytes purged as `dboxadm
   purge` does (every m.N with a dead byte, in either storage). */
int dbox_altmove(struct dbox_store *st, const struct dbox_purge_settings *set,
		 struct dbox_purge_result *res_r,
		 struct dbox_purge_result *purge_r)
{
	struct dbox_purge_settings ps = { .threshold = 0,
					  .check_rows = set->check_rows,
					  .cancel = set->cancel,
					  .quiet = set->quiet };
	int ret;

	dbox_store_assert_unlocked(st); /* taken as needed */
	memset(res_r, 0, sizeof(*res_r));
	if (purge_r != NULL)
		memset(purge_r, 0, sizeof(*purge_r));
	dbox_store_mutex_lock(st);
	ret = dbox_store_alt_fd(st) >= 0 ? 0 : -ENOENT;
	if (ret < 0)
		dbox_error("%s: no alternate storage to move messages to (%s)",
			   st->path, st->alt_path == NULL ? "no ALT path set" :
			   strerror(st->alt_err));
	dbox_store_mutex_unlock(st);
	if (ret < 0)
		return res_r->error = ret;
	ret = dbox_purge(st, set, res_r);
	if (ret == 0 && res_r->files_partial > 0 && purge_r != NULL) {
		ret = dbox_purge(st, &ps, purge_r);
		if (ret == 0 || ret == -EIO)
			(void)dbox_purge_record(st, purge_r, false);
	}
	return ret;
}
