/*
 * mfile-read.c: the m.N files of a store as a reader sees them
 * (mfile-read.h).  Reads only; never follows a link inside the store.
 */
#include "engine/mfile-read.h"
#include "engine/store-dirs.h"
#include "engine/store-layout.h"

#include "storage/dbox-file.h"
#include "storage/dbox-read.h"
#include "storage/fd-cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* dbox_mfile_walk_dir's walk: one directory entry. */
struct mfile_walk {
	struct dbox_mfile_ent ent;
	dbox_mfile_walk_cb_t *cb;
	void *ctx;
};

static int mfile_walk_cb(void *ctx, const char *name)
{
	struct mfile_walk *w = ctx;

	if (!dbox_mfile_parse_name(name, &w->ent.file_id) ||
	    fstatat(w->ent.dir_fd, name, &w->ent.st, AT_SYMLINK_NOFOLLOW) < 0)
		return 0; /* not an m.N, or gone since the listing */
	w->ent.name = name;
	return w->cb(w->ctx, &w->ent);
}

int dbox_mfile_walk_dir(int dir_fd, bool alt, dbox_mfile_walk_cb_t *cb,
			void *ctx)
{
	struct mfile_walk w = {
		.ent = { .dir_fd = dir_fd, .alt = alt }, .cb = cb, .ctx = ctx,
	};

	return dbox_dir_walk(dir_fd, mfile_walk_cb, &w);
}

int dbox_view_mfile_walk(struct dbox_view *view, dbox_mfile_walk_cb_t *cb,
			 void *ctx)
{
	int ret;

	if (view->storage_fd >= 0) {
		ret = dbox_mfile_walk_dir(view->storage_fd, false, cb, ctx);
		if (ret != 0)
			return ret;
	} else if (view->storage_err != -ENOENT) {
		return view->storage_err;
	}
	if (view->alt_fd >= 0)
		return dbox_mfile_walk_dir(view->alt_fd, true, cb, ctx);
	return 0;
}

int dbox_view_mfile_fd(struct dbox_view *view, struct dbox_fd_cache *cache,
		       uint32_t file_id, bool *alt_r)
{
	uint64_t size;
	bool alt = false;

	if (dbox_index_mfile_where(view->index, file_id, &size, &alt) < 0)
		alt = false;
	if (alt_r != NULL)
		*alt_r = alt;
	if (alt && view->alt_fd < 0 && view->alt_err < 0)
		return view->alt_err;
	return dbox_fd_cache_get(cache, alt ? view->alt_fd : view->storage_fd,
				 file_id);
}

int dbox_record_open_reader(int fd, uint32_t file_id, uint64_t offset,
			    uint64_t expected_body_size, uint64_t plain_size,
			    struct dbox_reader **reader_r,
			    uint64_t *plain_size_r)
{
	struct dbox_metadata md;
	uint64_t body_size, record_size;
	int ret = 0;

	*reader_r = NULL;
	memset(&md, 0, sizeof(md));
	/* The whole record is checked (header, size, metadata) before any
	   byte is trusted; storage/ logs what is wrong. */
	ret = dbox_record_read(fd, file_id, offset, expected_body_size,
			       &body_size, &md, &record_size);
	if (ret == 0 && plain_size == UINT64_MAX)
		plain_size = md.has_plain_size ? md.plain_size : body_size;
	dbox_metadata_clear(&md);
	if (ret == 0)
		ret = dbox_corrupt_as_eio(dbox_reader_open(fd,
				offset + DBOX_MSG_HEADER_SIZE, body_size,
				plain_size, reader_r));
	if (ret == 0 && plain_size_r != NULL)
		*plain_size_r = plain_size;
	return ret;
}

bool dbox_mfile_arg_id(const char *arg, uint32_t *file_id_r)
{
	const char *p = strncmp(arg, "m.", 2) == 0 ? arg + 2 : arg;
	unsigned long long id;
	char *end;

	if (*p < '0' || *p > '9')
		return false;
	errno = 0;
	id = strtoull(p, &end, 10);
	if (*end != '\0' || errno != 0 || id > UINT32_MAX)
		return false;
	*file_id_r = (uint32_t)id;
	return true;
}

/* Fill *ref_r for the open fd (closed on failure).  Returns 0 or a
   negative errno (-EINVAL: not a regular file). */
static int ref_set(int fd, struct dbox_mfile_ref *ref_r)
{
	struct stat sb;
	int ret = 0;

	if (fstat(fd, &sb) < 0)
		ret = -errno;
	else if (!S_ISREG(sb.st_mode))
		ret = -EINVAL;
	if (ret < 0) {
		close(fd);
		return ret;
	}
	ref_r->fd = fd;
	ref_r->size = (uint64_t)sb.st_size;
	ref_r->committed_end = UINT64_MAX;
	return 0;
}

/* The committed end of m.<file_id> of store when fd is that file (storage/
   or the alternate storage) and the index knows it; else UINT64_MAX. */
static uint64_t committed_end(const char *store, uint32_t file_id, int fd)
{
	struct dbox_view *view;
	struct stat a, b;
	uint64_t end = UINT64_MAX, size;
	char name[16];
	int mfd;

	if (dbox_view_open(store, &view) < 0)
		return end;
	dbox_file_name(name, file_id);
	mfd = dbox_view_mfile_open(view, name);
	if (mfd >= 0 && fstat(mfd, &a) == 0 && fstat(fd, &b) == 0 &&
	    a.st_dev == b.st_dev && a.st_ino == b.st_ino &&
	    dbox_index_mfile_get(view->index, file_id, &size) == 0)
		end = size;
	if (mfd >= 0)
		close(mfd);
	dbox_view_close(&view);
	return end;
}

int dbox_mfile_open_id(const char *store, uint32_t file_id,
		       struct dbox_mfile_ref *ref_r, char **path_r)
{
	struct dbox_view *view;
	const char *dir = store;
	char *alt = NULL, *path = NULL;
	char name[16];
	int fd, ret;

	if (path_r != NULL)
		*path_r = NULL;
	dbox_file_name(name, file_id);
	fd = dbox_store_open_in(store, DBOX_STORE_STORAGE, name, O_RDONLY);
	if (fd == -ENOENT && dbox_view_open(store, &view) == 0) {
		/* Not in storage/: in the alternate storage, if anywhere. */
		fd = dbox_view_mfile_open(view, name);
		if (fd >= 0 && view->alt_path != NULL &&
		    (alt = strdup(view->alt_path)) == NULL) {
			close(fd);
			fd = -ENOMEM;
		}
		dir = alt;
		dbox_view_close(&view);
	}
	if (fd >= 0 && path_r != NULL &&
	    asprintf(&path, "%s/" DBOX_STORE_STORAGE "/%s",
		     dir != NULL ? dir : store, name) < 0) {
		close(fd);
		fd = -ENOMEM;
		path = NULL;
	}
	free(alt);
	if (fd < 0)
		return fd;
	if ((ret = ref_set(fd, ref_r)) == 0)
		ref_r->committed_end = committed_end(store, file_id, fd);
	if (ret == 0 && path_r != NULL)
		*path_r = path;
	else
		free(path);
	return ret;
}

int dbox_mfile_open_path(const char *store, const char *path,
			 uint32_t file_id, struct dbox_mfile_ref *ref_r)
{
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC), ret;

	if (fd < 0)
		return -errno;
	if ((ret = ref_set(fd, ref_r)) == 0 && file_id != 0)
		ref_r->committed_end = committed_end(store, file_id, fd);
	return ret;
}
