/*
 * view.c: a store opened for reading without the store lock (view.h).
 */
#include "engine/view.h"
#include "engine/alt-mark.h"
#include "engine/store-dirs.h"
#include "engine/store-layout.h"

#include "index/index-stats.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int dbox_store_open_in(const char *store, const char *sub, const char *name,
		       int flags)
{
	int dir_fd, sub_fd, fd, ret;

	if ((dir_fd = open(store, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		return -errno;
	sub_fd = openat(dir_fd, sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
			O_CLOEXEC);
	ret = -errno;
	close(dir_fd);
	if (sub_fd < 0)
		return ret;
	if (name == NULL)
		return sub_fd;
	fd = openat(sub_fd, name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	ret = -errno;
	close(sub_fd);
	return fd < 0 ? ret : fd;
}

int dbox_store_open_alt_dir(const char *store, const char *alt,
			    struct dbox_alt_mark *mark)
{
	struct stat store_sb;
	bool way;
	uid_t uid;

	if (stat(store, &store_sb) < 0)
		return -errno;
	return dbox_alt_storage_open(alt, store_sb.st_uid, false, mark, &uid,
				     &way);
}

int dbox_view_open(const char *path, struct dbox_view **view_r)
{
	struct dbox_view *view;
	struct stat sb;
	char *index_path;
	int ret;

	*view_r = NULL;
	if (stat(path, &sb) < 0)
		return -errno;
	if (!S_ISDIR(sb.st_mode))
		return -ENOTDIR;
	if ((view = calloc(1, sizeof(*view))) == NULL ||
	    (view->path = strdup(path)) == NULL ||
	    asprintf(&index_path, "%s/" DBOX_STORE_INDEX, path) < 0) {
		if (view != NULL)
			free(view->path);
		free(view);
		return -ENOMEM;
	}
	view->storage_fd = view->alt_fd = -1;
	ret = dbox_index_open(index_path, false, &view->index);
	free(index_path);
	if (ret == 0)
		ret = dbox_index_reader_setup(view->index);
	if (ret < 0) {
		dbox_view_close(&view);
		return ret == -ENOENT ? -ENOMEDIUM : ret;
	}
	view->storage_fd = dbox_store_open_in(path, DBOX_STORE_STORAGE, NULL, 0);
	if (view->storage_fd < 0) {
		view->storage_err = view->storage_fd;
		view->storage_fd = -1;
	}
	if (dbox_index_setting_get(view->index, DBOX_SETTING_ALT_PATH,
				   &view->alt_path) == 0 &&
	    view->alt_path != NULL) {
		struct dbox_alt_mark mark;

		view->alt_fd = dbox_alt_mark_load(view->index, &mark);
		if (view->alt_fd == 0)
			view->alt_fd = dbox_store_open_alt_dir(path,
						view->alt_path, &mark);
		if (view->alt_fd < 0) {
			view->alt_err = view->alt_fd;
			view->alt_fd = -1;
		}
	}
	*view_r = view;
	return 0;
}

const char *dbox_view_alt_why(int alt_err)
{
	if (alt_err == -EPERM)
		return "not owned by the store's owner, or reached through "
			"another user's directory (refused)";
	if (alt_err == -EXDEV)
		return "another store's alternate storage, by its "
			DBOX_ALT_MARK " (refused)";
	return strerror(-alt_err);
}

void dbox_view_close(struct dbox_view **viewp)
{
	struct dbox_view *view = *viewp;

	if (view == NULL)
		return;
	dbox_index_close(&view->index);
	if (view->storage_fd >= 0)
		close(view->storage_fd);
	if (view->alt_fd >= 0)
		close(view->alt_fd);
	free(view->alt_path);
	free(view->path);
	free(view);
	*viewp = NULL;
}

int dbox_view_mfile_open(struct dbox_view *view, const char *name)
{
	int fd = -ENOENT;

	if (view->storage_fd >= 0) {
		fd = openat(view->storage_fd, name,
			    O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
		fd = fd < 0 ? -errno : fd;
	}
	if (fd == -ENOENT && view->alt_fd >= 0) {
		fd = openat(view->alt_fd, name,
			    O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
		fd = fd < 0 ? -errno : fd;
	}
	return fd;
}
