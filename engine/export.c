/*
 * export.c: the walk of a store's namespace for dboxadm export
 * (export.h).  Reads only: one snapshot of the index, m.N records and
 * STORE/files/<ino>, never through a symbolic link.
 */
#include "engine/export.h"
#include "engine/maildir.h"
#include "engine/store-dirs.h"
#include "engine/mfile-read.h"
#include "engine/store-layout.h"
#include "engine/store.h"

#include "index/index-stats.h"
#include "storage/dbox-read.h"
#include "storage/fd-cache.h"
#include "storage/io.h"
#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Directory entries read from the index at a time. */
#define PAGE_ENTRIES 512

struct dbox_export {
	struct dbox_view *view;
	int files_fd;              /* STORE/files/, or -1 */
	struct dbox_fd_cache mfds; /* m.N O_RDONLY, bounded */
	char *path;                /* of the current item, from the root */
	size_t path_len, path_size;
	/* The directories being walked, root first: a hostile or damaged
	   index may name a directory inside itself. */
	uint64_t ancestors[DBOX_TREE_MAX_DEPTH];
	size_t depth;
	uint64_t reached;          /* names the walk listed */
	/* The index as it is now, opened the first time an m.N of the
	   snapshot is gone (a mount's purge moved its records), to find
	   where they went; NULL until then. */
	struct dbox_view *now;
	const struct dbox_export_ops *ops;
	void *ctx;
};

struct page {
	struct {
		char *name;
		struct dbox_attr attr;
	} ents[PAGE_ENTRIES];
	size_t n;
	uint64_t last_cookie;
};

/* A dbox time (index.h) as a struct timespec. */
static struct timespec ns_ts(int64_t t)
{
	int64_t sec, nsec;

	dbox_time_split(t, &sec, &nsec);
	return (struct timespec){ .tv_sec = sec, .tv_nsec = nsec };
}

/* An item for attr, its times the index's. */
static struct dbox_export_item item_of(const char *name, const char *path,
				       const struct dbox_attr *attr)
{
	return (struct dbox_export_item){
		.name = name, .path = path, .attr = *attr,
		.atime = ns_ts(attr->atime_ns), .mtime = ns_ts(attr->mtime_ns),
		.parent_fd = -1, .dir_fd = -1, .fd = -1,
	};
}

int dbox_export_begin(struct dbox_view *view, struct dbox_export **ex_r,
		      struct dbox_export_item *root_r)
{
	struct dbox_export *ex;
	struct dbox_attr root;
	int ret;

	*ex_r = NULL;
	if ((ex = calloc(1, sizeof(*ex))) == NULL)
		return -ENOMEM;
	ex->view = view;
	if ((ret = dbox_index_snapshot_begin(view->index)) < 0 ||
	    (ret = dbox_index_getattr(view->index, DBOX_ROOT_INO, &root)) < 0) {
		dbox_index_snapshot_end(view->index);
		free(ex);
		return ret == -ENOMEM ? ret : -EIO;
	}
	ex->files_fd = dbox_store_open_in(view->path, DBOX_STORE_FILES, NULL, 0);
	if (ex->files_fd < 0)
		ex->files_fd = -1;
	dbox_fd_cache_init(&ex->mfds, 0);
	*root_r = item_of("", "", &root);
	*ex_r = ex;
	return 0;
}

void dbox_export_end(struct dbox_export **exp)
{
	struct dbox_export *ex = *exp;

	if (ex == NULL)
		return;
	dbox_index_snapshot_end(ex->view->index);
	dbox_view_close(&ex->now);
	dbox_fd_cache_deinit(&ex->mfds);
	if (ex->files_fd >= 0)
		close(ex->files_fd);
	free(ex->path);
	free(ex);
	*exp = NULL;
}

/* Append "/name" (just name at the root) to the path.  Returns the old
   length, for path_pop, or -ENOMEM. */
static int64_t path_push(struct dbox_export *ex, const char *name)
{
	size_t old = ex->path_len, len = strlen(name);
	size_t need = old + len + 2;

	if (need > ex->path_size) {
		char *p = realloc(ex->path, need * 2);

		if (p == NULL)
			return -ENOMEM;
		ex->path = p;
		ex->path_size = need * 2;
	}
	if (old > 0)
		ex->path[ex->path_len++] = '/';
	memcpy(ex->path + ex->path_len, name, len + 1);
	ex->path_len += len;
	return (int64_t)old;
}

static void path_pop(struct dbox_export *ex, int64_t len)
{
	ex->path_len = (size_t)len;
	ex->path[len] = '\0';
}

static int index_failed(struct dbox_export *ex, const char *what, int err)
{
	ex->ops->index_failed(ex->ctx, ex->path != NULL ? ex->path : "",
			      what, err);
	return err;
}

/* The item at ex->path has damaged rows: skipped (returns 0), or the
   walk stops (ENOMEM; no item_damaged op) with err. */
static int item_damaged(struct dbox_export *ex, const char *what, int err)
{
	if (err == -ENOMEM || ex->ops->item_damaged == NULL)
		return index_failed(ex, what, err);
	ex->ops->item_damaged(ex->ctx, ex->path != NULL ? ex->path : "", what,
			      err);
	return 0;
}

static int walk_dir(struct dbox_export *ex, uint64_t dir, int dir_fd);

/* The index's facts a non-directory item needs before its callback: a
   message's location (or that it is unfinished), a link's target.
   Returns 0, 1 when the item is skipped (its rows damaged: said), or a
   negative errno (the walk stops). */
static int item_prepare(struct dbox_export *ex, struct dbox_export_item *item,
			char **target_r)
{
	struct dbox_index *index = ex->view->index;
	int ret;

	if (item->attr.kind == DBOX_KIND_MESSAGE) {
		char key[48];
		int64_t v;

		ret = dbox_index_msg_get(index, item->attr.ino, &item->loc);
		if (ret == -ENOENT ||
		    (ret == 0 && item->loc.state != DBOX_MSG_COMMITTED))
			item->unfinished = true;
		else if (ret < 0)
			return item_damaged(ex, "message", ret) == 0 ? 1 : ret;
		dbox_save_acked_empty_key(key, item->attr.ino);
		if (ret == 0 && dbox_index_meta_get(index, key, &v) == 0) {
			item->acked_empty = true;
			item->unfinished = false;
			item->attr.size = 0;
		}
	} else if (item->attr.kind == DBOX_KIND_SYMLINK) {
		ret = dbox_index_readlink(index, item->attr.ino, target_r);
		if (ret < 0)
			return item_damaged(ex, "readlink", ret) == 0 ? 1 : ret;
		item->target = *target_r;
	}
	return 0;
}

static int walk_entry(struct dbox_export *ex, const char *name,
		      const struct dbox_attr *attr, int parent_fd)
{
	struct dbox_export_item item = item_of(name, ex->path, attr);
	char *target = NULL;
	int ret;

	item.parent_fd = parent_fd;
	if (attr->kind == DBOX_KIND_DIR) {
		for (size_t i = 0; i < ex->depth; i++)
			if (ex->ancestors[i] == attr->ino) {
				dbox_error("%s: directory inode %llu is inside "
					   "itself (the index's tree has a "
					   "cycle; run 'dboxadm check'); not "
					   "entered", ex->path,
					   (unsigned long long)attr->ino);
				return item_damaged(ex, "cycle", -ELOOP);
			}
		if (ex->depth == DBOX_TREE_MAX_DEPTH)
			return item_damaged(ex, "depth", -ELOOP);
		if ((ret = ex->ops->dir_begin(ex->ctx, &item)) != 0)
			return ret < 0 ? ret : 0;
		ex->ancestors[ex->depth++] = attr->ino;
		ret = walk_dir(ex, attr->ino, item.dir_fd);
		ex->depth--;
		item.path = ex->path; /* may have moved while growing */
		ex->ops->dir_end(ex->ctx, &item);
		return ret;
	}
	if ((ret = item_prepare(ex, &item, &target)) == 0)
		ret = ex->ops->entry(ex->ctx, &item);
	else if (ret == 1)
		ret = 0; /* skipped */
	dbox_export_item_close(&item);
	free(target);
	return ret;
}

static int page_cb(void *ctx, const struct dbox_dirent *ent)
{
	struct page *page = ctx;

	/* An empty name's blob is NULL (a hostile index); name checks
	   downstream refuse "". */
	page->ents[page->n].name = ent->namelen == 0 ? strdup("") :
		strndup(ent->name, ent->namelen);
	if (page->ents[page->n].name == NULL)
		return -ENOMEM;
	page->ents[page->n].attr = ent->attr;
	page->last_cookie = ent->cookie;
	return ++page->n == PAGE_ENTRIES ? 1 : 0;
}

/* The entries of index directory dir, a page at a time (no statement
   stays open across a callback). */
static int walk_dir(struct dbox_export *ex, uint64_t dir, int dir_fd)
{
	struct page *page = malloc(sizeof(*page));
	uint64_t after = 0;
	int64_t old;
	int ret;

	if (page == NULL)
		return index_failed(ex, "readdir", -ENOMEM);
	do {
		page->n = 0;
		if ((ret = dbox_index_readdir(ex->view->index, dir, after,
					      page_cb, page)) < 0)
			index_failed(ex, "readdir", ret);
		ex->reached += page->n;
		for (size_t i = 0; i < page->n; i++) {
			if (ret >= 0 &&
			    (old = path_push(ex, page->ents[i].name)) < 0) {
				ret = index_failed(ex, "readdir", (int)old);
			} else if (ret >= 0) {
				ret = walk_entry(ex, page->ents[i].name,
						 &page->ents[i].attr, dir_fd);
				path_pop(ex, old);
			}
			free(page->ents[i].name);
		}
		after = page->last_cookie;
	} while (ret >= 0 && page->n == PAGE_ENTRIES);
	free(page);
	return ret < 0 ? ret : 0;
}

int dbox_export_walk(struct dbox_export *ex, const struct dbox_export_ops *ops,
		     void *ctx, int root_fd)
{
	ex->ops = ops;
	ex->ctx = ctx;
	ex->path_len = 0;
	if (path_push(ex, "") < 0)
		return -ENOMEM;
	ex->ancestors[0] = DBOX_ROOT_INO;
	ex->depth = 1;
	return walk_dir(ex, DBOX_ROOT_INO, root_fd);
}

/* The m.N of item in the snapshot is gone: the mount's purge (or
   altmove) moved its record verbatim to another m.N and removed the
   file after the snapshot began (helper-86: an export run with an online
   purge dropped such messages as unreadable).  Where it is now, from
   the index as it is now: *fd_r (of ex->mfds) and item->loc.  Returns 0,
   or -ENOENT when the message has no other record there (then it is
   gone: expunged meanwhile, or a loss check reports). */
static int relocate(struct dbox_export *ex, struct dbox_export_item *item,
		    int *fd_r, bool *alt_r)
{
	struct dbox_msgloc now;
	int fd;

	if (ex->now == NULL && dbox_view_open(ex->view->path, &ex->now) < 0)
		return -ENOENT;
	if (dbox_index_msg_get(ex->now->index, item->attr.ino, &now) < 0 ||
	    now.file_id == item->loc.file_id ||
	    now.body_size != item->loc.body_size)
		return -ENOENT;
	fd = dbox_view_mfile_fd(ex->now, &ex->mfds, now.file_id, alt_r);
	if (fd < 0)
		return -ENOENT;
	item->loc = now;
	*fd_r = fd;
	return 0;
}

/* Has inode ino gone from the index as it is now (deleted after the
   walk's snapshot was taken: its m.N or backing file may be gone
   too)?  false when that cannot be told. */
static bool gone_now(struct dbox_export *ex, uint64_t ino)
{
	struct dbox_attr attr;

	if (ex->now == NULL && dbox_view_open(ex->view->path, &ex->now) < 0)
		return false;
	return dbox_index_getattr(ex->now->index, ino, &attr) == -ENOENT;
}

static int open_message(struct dbox_export *ex, struct dbox_export_item *item)
{
	const struct dbox_msgloc *loc = &item->loc;
	bool alt;
	int fd, ret;

	fd = dbox_view_mfile_fd(ex->view, &ex->mfds, loc->file_id, &alt);
	if (fd == -ENOENT && relocate(ex, item, &fd, &alt) < 0 &&
	    gone_now(ex, item->attr.ino))
		return -ESTALE; /* expunged since, and purged (helper-87) */
	if (fd < 0) {
		dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u: %s%s",
			   alt && ex->view->alt_path != NULL ?
			   ex->view->alt_path : ex->view->path,
			   loc->file_id, strerror(-fd), alt && ex->view->alt_fd < 0 ?
			   " (the alternate storage is not available)" : "");
		return -EIO;
	}
	ret = dbox_record_open_reader(fd, loc->file_id, loc->offset,
				      loc->body_size, item->attr.size,
				      &item->reader, NULL);
	return ret == 0 || ret == -ENOMEM ? ret : -EIO;
}

static int open_file(struct dbox_export *ex, struct dbox_export_item *item)
{
	char backing[24];
	struct stat sb;
	int fd;

	if (ex->files_fd < 0)
		return -ENOENT;
	dbox_files_name(backing, item->attr.ino);
	fd = openat(ex->files_fd, backing, O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
		    O_CLOEXEC);
	if (fd < 0 && errno == ENOENT && gone_now(ex, item->attr.ino))
		return -ESTALE;
	if (fd < 0)
		return -errno;
	if ((fd = dbox_fd_regular(fd, &sb)) < 0)
		return fd;
	item->fd = fd;
	item->atime = sb.st_atim;
	item->mtime = sb.st_mtim;
	return 0;
}

int dbox_export_item_open(struct dbox_export *ex, struct dbox_export_item *item)
{
	item->off = 0;
	if (item->acked_empty)
		return 0;
	if (item->attr.kind == DBOX_KIND_MESSAGE)
		return item->unfinished ? -EINVAL : open_message(ex, item);
	if (item->attr.kind == DBOX_KIND_DIR ||
	    item->attr.kind == DBOX_KIND_SYMLINK ||
	    item->attr.kind == DBOX_KIND_SPECIAL)
		return -EINVAL;
	return open_file(ex, item);
}

ssize_t dbox_export_item_read(struct dbox_export_item *item, void *buf,
			      size_t len)
{
	ssize_t n;

	if (item->acked_empty)
		return 0;
	if (item->reader != NULL) {
		if (item->off >= item->attr.size)
			return 0;
		n = dbox_reader_pread(item->reader, buf, len, item->off);
		if (n <= 0)
			return n < 0 ? dbox_corrupt_as_eio((int)n) : -EIO;
	} else if (item->fd >= 0) {
		while ((n = read(item->fd, buf, len)) < 0 && errno == EINTR)
			;
		if (n < 0)
			return -errno;
	} else {
		return -EBADF;
	}
	item->off += (uint64_t)n;
	return n;
}

void dbox_export_item_close(struct dbox_export_item *item)
{
	dbox_reader_free(&item->reader);
	if (item->fd >= 0)
		close(item->fd);
	item->fd = -1;
}

int dbox_export_xattrs(struct dbox_export *ex, uint64_t ino,
		       dbox_export_xattr_cb_t *cb, void *ctx)
{
	struct dbox_index *index = ex->view->index;
	char *names = NULL;
	size_t len = 0;
	int ret;

	if ((ret = dbox_index_xattr_list(index, ino, &names, &len)) < 0)
		return ret;
	for (char *n = names; ret == 0 && n < names + len; n += strlen(n) + 1) {
		void *value = NULL;
		size_t vlen = 0;

		ret = dbox_index_xattr_get(index, ino, n, &value, &vlen);
		if (ret == 0)
			ret = cb(ctx, n, value != NULL ? value : "", vlen);
		free(value);
	}
	free(names);
	return ret;
}

int dbox_export_unreached(struct dbox_export *ex, uint64_t *count_r)
{
	uint64_t total;
	int ret;

	*count_r = 0;
	if ((ret = dbox_index_entry_count(ex->view->index, &total)) < 0)
		return ret;
	*count_r = total > ex->reached ? total - ex->reached : 0;
	return 0;
}
