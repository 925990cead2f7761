/*
 * stats.c: what a store holds and what purge could give back (stats.h).
 * Reads only: one index snapshot, then the m.N on disk.
 */
#include "engine/stats.h"
#include "engine/maildir.h"
#include "engine/mfile-read.h"
#include "engine/purge.h"

#include "storage/dbox-file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct gather {
	struct dbox_stats *st;
	struct dbox_index *index;
	const char *path;    /* the store, for a fresh look (known_cb) */
	size_t folders_size, files_size;
	bool per_file;
	uint32_t *seen;      /* file_id of every m.N on disk (sorted after
				the walk) */
	size_t nseen, seen_size;
};

/* Room for one more element in *array (n used of *size, elem bytes
   each): doubled when full.  Returns 0 or -ENOMEM (the array as it
   was). */
static int grow(void **array, size_t n, size_t *size, size_t elem)
{
	size_t new_size = *size == 0 ? 16 : *size * 2;
	void *p;

	if (n < *size)
		return 0;
	if ((p = realloc(*array, new_size * elem)) == NULL)
		return -ENOMEM;
	*array = p;
	*size = new_size;
	return 0;
}

static int add_folder(struct gather *g, const char *name, uint64_t count)
{
	struct dbox_stats *st = g->st;
	struct dbox_stats_folder *f;

	for (size_t i = 0; i < st->nfolders; i++) {
		if (strcmp(st->folders[i].name, name) == 0) {
			st->folders[i].count += count;
			return 0;
		}
	}
	if (grow((void **)&st->folders, st->nfolders, &g->folders_size,
		 sizeof(*f)) < 0)
		return -ENOMEM;
	f = &st->folders[st->nfolders];
	if ((f->name = strdup(name)) == NULL)
		return -ENOMEM;
	f->display = NULL;
	f->count = count;
	st->nfolders++;
	return 0;
}

/* Messages in directory dir: counted for the folder it belongs to. */
static int dir_count_cb(void *ctx, uint64_t dir, uint64_t count)
{
	struct gather *g = ctx;
	char *dirname = NULL, *mailbox = NULL;
	bool maildir_sub;
	int ret;

	if ((ret = dbox_index_name_of(g->index, dir, &dirname)) < 0 &&
	    ret != -ENOENT)
		return ret;
	maildir_sub = dirname != NULL &&
		maildir_is_subdir(dirname, strlen(dirname));
	free(dirname);
	if (!maildir_sub)
		return add_folder(g, DBOX_STATS_OUTSIDE_MAILDIR, count);
	if ((ret = maildir_mailbox_name(g->index, dir, &mailbox)) < 0)
		return ret;
	ret = add_folder(g, mailbox, count);
	free(mailbox);
	return ret;
}

static int folder_cmp(const void *a, const void *b)
{
	return strcmp(((const struct dbox_stats_folder *)a)->display,
		      ((const struct dbox_stats_folder *)b)->display);
}

/* Give every folder its UTF-8 name, and sort by it.  A name that is not
   modified UTF-7 (a folder made with a UTF-8 name on the mount) is shown
   as it is; should two folders then show the same, both are shown as
   stored, so no two lines (JSON keys) are the same. */
static int decode_folders(struct dbox_stats *st)
{
	char *utf8;
	int ret;

	for (size_t i = 0; i < st->nfolders; i++) {
		struct dbox_stats_folder *f = &st->folders[i];

		ret = maildir_mutf7_to_utf8(f->name, &utf8);
		if (ret == -ENOMEM)
			return ret;
		f->display = ret == 0 ? utf8 : f->name;
	}
	qsort(st->folders, st->nfolders, sizeof(*st->folders), folder_cmp);
	for (size_t i = 1; i < st->nfolders; i++) {
		struct dbox_stats_folder *a = &st->folders[i - 1];
		struct dbox_stats_folder *b = &st->folders[i];

		if (strcmp(a->display, b->display) != 0)
			continue;
		if (a->display != a->name)
			free(a->display);
		if (b->display != b->name)
			free(b->display);
		a->display = a->name;
		b->display = b->name;
	}
	qsort(st->folders, st->nfolders, sizeof(*st->folders), folder_cmp);
	return 0;
}

static int add_file(struct gather *g, uint32_t file_id, uint64_t bytes,
		    uint64_t header_bytes, bool alt)
{
	struct dbox_stats *st = g->st;
	struct dbox_stats_mfile *m;

	if (grow((void **)&st->files, st->nfiles, &g->files_size,
		 sizeof(*m)) < 0)
		return -ENOMEM;
	m = &st->files[st->nfiles++];
	memset(m, 0, sizeof(*m));
	m->file_id = file_id;
	m->bytes = bytes;
	m->header_bytes = header_bytes;
	m->alt = alt;
	return 0;
}

static int file_cmp(const void *a, const void *b)
{
	uint32_t x = ((const struct dbox_stats_mfile *)a)->file_id;
	uint32_t y = ((const struct dbox_stats_mfile *)b)->file_id;

	return x < y ? -1 : x > y;
}

/* The index's view of each m.N, joined to the files on disk. */
static int usage_cb(void *ctx, const struct dbox_file_usage *u)
{
	struct gather *g = ctx;
	struct dbox_stats *st = g->st;
	struct dbox_stats_mfile key = { .file_id = u->file_id }, *m;
	uint64_t committed;
	bool alt = false;

	m = bsearch(&key, st->files, st->nfiles, sizeof(*m), file_cmp);
	if (m == NULL) {
		/* Known to the index, missing on disk. */
		if (dbox_index_mfile_where(g->index, u->file_id, &committed,
					   &alt) < 0)
			alt = false;
		if (add_file(g, u->file_id, 0, 0, alt) < 0)
			return -ENOMEM;
		st->files[st->nfiles - 1].usage = *u;
		st->files[st->nfiles - 1].in_index = true;
		qsort(st->files, st->nfiles, sizeof(*st->files), file_cmp);
		return 0;
	}
	m->usage = *u;
	m->in_index = true;
	return 0;
}

uint64_t dbox_stats_mfile_dead(const struct dbox_stats_mfile *m)
{
	uint64_t used;

	if (!m->in_index)
		return m->bytes > m->header_bytes ? m->bytes - m->header_bytes : 0;
	used = m->header_bytes + m->usage.live_bytes;
	return m->usage.committed > used ? m->usage.committed - used : 0;
}

/* One m.N on disk, compared with the committed end the index knows. */
static int disk_cb(void *ctx, const struct dbox_mfile_ent *ent)
{
	struct gather *g = ctx;
	struct dbox_stats *st = g->st;
	uint64_t size = (uint64_t)ent->st.st_size, committed;
	size_t header_len = 0;
	int fd;

	if (!S_ISREG(ent->st.st_mode))
		return 0; /* never read by dboxfs (check reports it) */
	if (grow((void **)&g->seen, g->nseen, &g->seen_size,
		 sizeof(*g->seen)) < 0)
		return -ENOMEM;
	g->seen[g->nseen++] = ent->file_id;
	st->mfiles++;
	st->mfile_bytes += size;
	if (ent->alt) {
		st->alt_mfiles++;
		st->alt_bytes += size;
	}
	st->disk_bytes += (uint64_t)ent->st.st_blocks * 512;
	fd = openat(ent->dir_fd, ent->name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
		    O_CLOEXEC);
	if (fd >= 0) {
		if (dbox_file_read_header(fd, &header_len) == 0)
			st->header_bytes += header_len;
		else
			header_len = 0;
		close(fd);
	}
	if (g->per_file && add_file(g, ent->file_id, size, header_len,
					ent->alt) < 0)
		return -ENOMEM;
	/* An m.N the index does not know is all dead. */
	if (dbox_index_mfile_get(g->index, ent->file_id, &committed) == 0 &&
	    size > committed)
		st->pending_bytes += size - committed;
	return 0;
}

static int id_cmp(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* Does an index opened now still know m.<file_id>?  The figures come
   from one snapshot, and a purge of the mount may have removed the file
   since: it goes once the commit that forgets it is on disk (helper-76:
   stats exited 1, "1 m.N the index knows are not on disk", 8 times in
   520 runs beside automatic purges).  true also when the look fails. */
static bool still_known(const char *path, uint32_t file_id)
{
	struct dbox_view *now = NULL;
	uint64_t committed;
	bool known;

	if (dbox_view_open(path, &now) < 0)
		return true;
	known = dbox_index_mfile_get(now->index, file_id, &committed) != -ENOENT;
	dbox_view_close(&now);
	return known;
}

/* One m.N of the index: counted as missing when the walk did not see it
   on disk (and it was not purged meanwhile). */
static int known_cb(void *ctx, uint32_t file_id, uint64_t size)
{
	struct gather *g = ctx;
	struct dbox_stats *st = g->st;
	uint64_t committed;
	bool alt = false;

	if (g->nseen > 0 && /* else g->seen is NULL */
	    bsearch(&file_id, g->seen, g->nseen, sizeof(*g->seen),
		    id_cmp) != NULL)
		return 0;
	if (!still_known(g->path, file_id))
		return 0;
	st->missing_mfiles++;
	st->missing_bytes += size;
	if (dbox_index_mfile_where(g->index, file_id, &committed, &alt) == 0 &&
	    alt)
		st->missing_alt_mfiles++;
	return 0;
}

/* The purge totals (absent keys stay 0). */
static void purge_totals(struct dbox_index *index, struct dbox_stats *st)
{
	dbox_index_meta_get(index, DBOX_META_PURGE_RUNS, &st->purge_runs);
	dbox_index_meta_get(index, DBOX_META_PURGE_FREED, &st->purge_freed);
	dbox_index_meta_get(index, DBOX_META_PURGE_FILES, &st->purge_files);
	dbox_index_meta_get(index, DBOX_META_PURGE_END, &st->purge_end_ns);
	st->purge_moved_known = dbox_index_meta_get(
		index, DBOX_META_PURGE_MOVED, &st->purge_moved) == 0;
	dbox_index_meta_get(index, DBOX_META_PURGE_RECORDS, &st->purge_records);
	if (st->purge_runs == 0)
		st->purge_moved_known = true; /* nothing to know */
}

int dbox_stats_get(struct dbox_view *view, bool per_file, struct dbox_stats *st)
{
	struct gather g = { .st = st, .index = view->index,
			    .path = view->path, .per_file = per_file };
	uint64_t used;
	int ret;

	memset(st, 0, sizeof(*st));
	ret = dbox_index_snapshot_begin(g.index);
	if (ret == 0)
		ret = dbox_index_stats_get(g.index, &st->ix);
	if (ret == 0)
		ret = dbox_index_stats_per_dir(g.index, dir_count_cb, &g);
	if (ret == 0) /* empty folders too, with 0 */
		ret = dbox_index_stats_maildirs(g.index, dir_count_cb, &g);
	if (ret == 0)
		ret = dbox_view_mfile_walk(view, disk_cb, &g);
	if (ret == 0) {
		if (g.nseen > 1) /* no m.N on disk: g.seen is NULL */
			qsort(g.seen, g.nseen, sizeof(*g.seen), id_cmp);
		ret = dbox_index_mfile_list(g.index, known_cb, &g);
	}
	if (ret == 0 && st->nfiles > 1)
		qsort(st->files, st->nfiles, sizeof(*st->files), file_cmp);
	if (ret == 0 && per_file)
		ret = dbox_index_file_usage_all(g.index, usage_cb, &g);
	if (ret == 0)
		purge_totals(g.index, st);
	dbox_index_snapshot_end(g.index);
	free(g.seen);
	if (ret != 0)
		return ret;
	/* The live records of a missing m.N count in live_record_bytes: its
	   committed end stands in for its size (its header is not known). */
	used = st->header_bytes + st->ix.live_record_bytes + st->pending_bytes;
	st->dead_bytes = st->mfile_bytes + st->missing_bytes > used ?
		st->mfile_bytes + st->missing_bytes - used : 0;
	return decode_folders(st);
}

void dbox_stats_free(struct dbox_stats *st)
{
	for (size_t i = 0; i < st->nfolders; i++) {
		if (st->folders[i].display != st->folders[i].name)
			free(st->folders[i].display);
		free(st->folders[i].name);
	}
	free(st->folders);
	free(st->files);
	st->folders = NULL;
	st->files = NULL;
	st->nfolders = st->nfiles = 0;
}
