/*
 * store-dirs.c: walking a directory of a store, the names of files/, and
 * removing a store just made (store-dirs.h).
 */
#include "engine/store-dirs.h"
#include "engine/alt-mark.h"
#include "engine/store-layout.h"
#include "storage/dbox-file.h"
#include "storage/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int dbox_dir_walk(int dir_fd, dbox_dir_walk_cb_t *cb, void *ctx)
{
	int fd = dup(dir_fd), ret = 0;
	struct dirent *de;
	DIR *d;

	if (fd < 0)
		return -errno;
	if ((d = fdopendir(fd)) == NULL) {
		ret = -errno;
		close(fd);
		return ret;
	}
	/* The duplicate shares its offset with dir_fd: from the start. */
	rewinddir(d);
	while (ret == 0) {
		errno = 0;
		if ((de = readdir(d)) == NULL) {
			ret = -errno;
			break;
		}
		if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
			ret = cb(ctx, de->d_name);
	}
	closedir(d);
	return ret;
}

bool dbox_files_name_ino(const char *name, uint64_t *ino_r)
{
	unsigned long long ino;
	char *end;

	if (name[0] < '1' || name[0] > '9')
		return false;
	errno = 0;
	ino = strtoull(name, &end, 10);
	if (*end != '\0' || errno != 0)
		return false;
	*ino_r = ino;
	return true;
}

void dbox_files_name(char buf[DBOX_FILES_NAME_SIZE], uint64_t ino)
{
	snprintf(buf, DBOX_FILES_NAME_SIZE, "%llu", (unsigned long long)ino);
}

int dbox_storage_dir_open(int dir_fd)
{
	int fd = openat(dir_fd, DBOX_STORE_STORAGE, O_RDONLY | O_DIRECTORY |
			O_NOFOLLOW | O_CLOEXEC);

	return fd < 0 ? -errno : fd;
}

int dbox_alt_owner_check(int alt_fd, const char *alt, uid_t owner,
			 uid_t *uid_r, bool *way_r)
{
	struct stat sb;
	int ret;

	*uid_r = 0;
	*way_r = false;
	if (fstat(alt_fd, &sb) < 0)
		return -errno;
	if (sb.st_uid != owner) {
		*uid_r = sb.st_uid;
		return -EPERM;
	}
	/* Strict, and the path must still name the directory opened: a
	   link that took the open elsewhere and vanished passed a lax walk
	   (helper-93, for backup's DEST). */
	if ((ret = dbox_path_way_owner(alt, owner, &sb, uid_r)) < 0)
		return ret;
	*way_r = *uid_r != 0;
	return *way_r ? -EPERM : 0;
}

/* lstat() each prefix of path p (longest first; p is put back as it
   was): *owner_r gets the first owner that is neither root nor except
   (left alone when there is none), of a symbolic link only when
   links_only.  strict: a prefix that cannot be looked at fails the walk
   (returns -errno), else it is skipped. */
static int walk_prefixes(char *p, uid_t except, bool strict, bool links_only,
			 uid_t *owner_r)
{
	struct stat sb;

	for (size_t len = strlen(p); len > 0; len--) {
		char saved;
		int ret = 0;

		if (p[len] != '/' && p[len] != '\0')
			continue;
		if (len > 1 && p[len - 1] == '/')
			continue;
		saved = p[len];
		p[len] = '\0';
		if (lstat(p, &sb) < 0)
			ret = strict ? -errno : 0;
		else if (sb.st_uid != 0 && sb.st_uid != except && *owner_r == 0 &&
			 (!links_only || S_ISLNK(sb.st_mode)))
			*owner_r = sb.st_uid;
		p[len] = saved;
		if (ret < 0)
			return ret;
	}
	return 0;
}

uid_t dbox_path_foreign_owner(const char *path, uid_t except)
{
	char *paths[2] = { strdup(path), realpath(path, NULL) };
	uid_t owner = 0;

	for (int i = 0; i < 2; i++)
		if (paths[i] != NULL)
			(void)walk_prefixes(paths[i], except, false, false,
					    &owner);
	free(paths[0]);
	free(paths[1]);
	return owner;
}

uid_t dbox_path_link_owner(const char *path)
{
	char *p = strdup(path);
	uid_t owner = 0;

	if (p != NULL)
		(void)walk_prefixes(p, 0, false, true, &owner);
	free(p);
	return owner;
}

int dbox_path_way_owner(const char *path, uid_t except,
			const struct stat *opened, uid_t *owner_r)
{
	char *paths[2] = { NULL, realpath(path, NULL) };
	int ret = paths[1] == NULL ? -errno : 0;

	*owner_r = 0;
	if (ret == 0 && path[0] != '/') {
		char *cwd = getcwd(NULL, 0);

		if (cwd == NULL ||
		    asprintf(&paths[0], "%s/%s", cwd, path) < 0) {
			ret = cwd == NULL ? -errno : -ENOMEM;
			paths[0] = NULL;
		}
		free(cwd);
	} else if (ret == 0 && (paths[0] = strdup(path)) == NULL) {
		ret = -ENOMEM;
	}
	for (int i = 0; ret == 0 && i < 2; i++)
		ret = walk_prefixes(paths[i], except, true, false, owner_r);
	free(paths[0]);
	free(paths[1]);
	if (ret == 0 && opened != NULL) {
		struct stat now;

		if (stat(path, &now) < 0 || now.st_dev != opened->st_dev ||
		    now.st_ino != opened->st_ino)
			ret = -ESTALE;
	}
	return ret;
}

char *dbox_path_parent(const char *path)
{
	char *copy = strdup(path), *slash;
	size_t len;

	if (copy == NULL)
		return NULL;
	len = strlen(copy);
	while (len > 1 && copy[len - 1] == '/')
		copy[--len] = '\0';
	slash = strrchr(copy, '/');
	if (slash == NULL) {
		free(copy);
		return strdup(".");
	}
	slash[slash == copy ? 1 : 0] = '\0';
	return copy;
}

/* For a decision that root acts on by name: can nobody but root put
   something at path's name before the store is opened?  Its directory
   (dir_sb when the store is new: the directory opened) must be writable
   by root and group root alone, or sticky with the name there already (a sticky
   directory keeps root's entry from others: /tmp with a store of
   root's).  Returns 0, or -EPERM: another user could put a link to
   their or a third user's store there (a race won in /tmp). */
static int name_held(const char *path, bool new_store,
		     const struct stat *dir_sb)
{
	struct stat sb;
	char *parent;

	if (!new_store) {
		if ((parent = dbox_path_parent(path)) == NULL)
			return -ENOMEM;
		if (stat(parent, &sb) < 0) {
			int ret = -errno;

			free(parent);
			return ret;
		}
		free(parent);
		dir_sb = &sb;
	}
	/* Writable by others, or by a group other than root's (a umask of
	   002 makes root's directories group-writable for group root). */
	if (((dir_sb->st_mode & S_IWOTH) == 0 &&
	     ((dir_sb->st_mode & S_IWGRP) == 0 || dir_sb->st_gid == 0)) ||
	    (!new_store && (dir_sb->st_mode & S_ISVTX)))
		return 0;
	return -EPERM;
}

int dbox_store_owner_find(const char *path, struct dbox_store_owner *o)
{
	struct passwd *pw;
	struct stat sb;
	uid_t way;
	int ret;

	memset(o, 0, sizeof(*o));
	o->fd = -1;
	if ((o->what = strdup(path)) == NULL)
		return -ENOMEM;
	o->fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (o->fd < 0 && errno == ENOENT) {
		free(o->what);
		if ((o->what = dbox_path_parent(path)) == NULL)
			return -ENOMEM;
		o->new_store = true;
		o->fd = open(o->what, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	}
	if (o->fd < 0 || fstat(o->fd, &sb) < 0)
		return -errno;
	o->dev = sb.st_dev;
	o->ino = sb.st_ino;
	o->uid = sb.st_uid;
	o->gid = sb.st_gid;
	/* Steps of the store's owner are not "another's": a step of anyone
	   else's (a link or directory in the middle of the path too) is. */
	if ((ret = dbox_path_way_owner(o->what, sb.st_uid, NULL, &way)) < 0)
		return ret;
	if (sb.st_uid == 0 && way != 0) {
		o->uid = way;
		o->gid = (gid_t)-1; /* root's directory's group is not theirs */
	} else if (sb.st_uid != 0 && way != 0) {
		o->way = way;
		return -EPERM;
	}
	/* The walk looked at the path: it must still name what was opened
	   (a root decision is acted on by name, with nothing to switch). */
	if ((ret = dbox_store_owner_still(o)) < 0)
		return ret;
	if (o->uid == 0 && (ret = name_held(path, o->new_store, &sb)) < 0) {
		o->shared_dir = true;
		return ret;
	}
	if (o->uid != 0 && (pw = getpwuid(o->uid)) != NULL)
		o->gid = pw->pw_gid;
	return 0;
}

int dbox_store_owner_still(const struct dbox_store_owner *o)
{
	struct stat sb;

	if (stat(o->what, &sb) < 0)
		return -errno;
	return sb.st_dev == o->dev && sb.st_ino == o->ino ? 0 : -ESTALE;
}

void dbox_store_owner_free(struct dbox_store_owner *o)
{
	if (o->fd >= 0)
		close(o->fd);
	o->fd = -1;
	free(o->what);
	o->what = NULL;
}

int dbox_alt_storage_open(const char *alt, uid_t owner, bool create,
			  struct dbox_alt_mark *mark, uid_t *uid_r, bool *way_r)
{
	int fd, sfd = -1, ret;

	*uid_r = 0;
	*way_r = false;
	if ((fd = open(alt, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		return -errno;
	ret = dbox_alt_owner_check(fd, alt, owner, uid_r, way_r);
	if (ret == 0) {
		sfd = dbox_storage_dir_open(fd); /* -1: none yet */
		ret = dbox_alt_mark_judge(fd, sfd, alt, mark);
		if (ret < 0 && sfd >= 0) {
			close(sfd);
			sfd = -1;
		}
	}
	if (ret == 0 && sfd < 0 && create &&
	    mkdirat(fd, DBOX_STORE_STORAGE, 0700) < 0 && errno != EEXIST)
		ret = -errno;
	if (ret == 0 && sfd < 0)
		sfd = ret = dbox_storage_dir_open(fd);
	if (sfd >= 0 && mark->want_first && mark->index_places) {
		char name[16];
		struct stat sb;

		dbox_file_name(name, mark->first);
		if (fstatat(sfd, name, &sb, AT_SYMLINK_NOFOLLOW) < 0 &&
		    errno == ENOENT) {
			dbox_error("%s/" DBOX_STORE_STORAGE ": holds no %s, "
				   "which the index places there: not the "
				   "alternate storage (its disk not mounted "
				   "yet?)", alt, name);
			close(sfd);
			sfd = ret = -ENOENT;
		}
	}
	/* Marked only once it is known to be this store's. */
	if (sfd >= 0)
		dbox_alt_mark_write(fd, alt, mark);
	close(fd);
	return ret < 0 ? ret : sfd;
}

/* Unlink the m.N of storage/ (plain: the files/<ino> of files/) open as
   sfd; closes sfd. */
static void remove_store_files(int sfd, bool plain)
{
	DIR *dir = fdopendir(sfd);
	struct dirent *de;
	uint64_t ino;
	uint32_t id;

	if (dir == NULL) {
		close(sfd);
		return;
	}
	while ((de = readdir(dir)) != NULL) {
		if (plain ? dbox_files_name_ino(de->d_name, &ino) :
		    dbox_mfile_parse_name(de->d_name, &id))
			unlinkat(sfd, de->d_name, 0);
	}
	closedir(dir);
}

void dbox_store_remove_new(const char *path, bool dir_made)
{
	static const char *const names[] = {
		DBOX_STORE_INDEX, DBOX_STORE_INDEX "-wal", DBOX_STORE_INDEX "-shm",
		DBOX_STORE_INDEX "-journal", DBOX_STORE_INDEX "-reserve",
		DBOX_STORE_LOCK };
	int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int sfd;

	if (dfd < 0)
		return;
	sfd = openat(dfd, DBOX_STORE_STORAGE, O_RDONLY | O_DIRECTORY |
		     O_NOFOLLOW | O_CLOEXEC);
	if (sfd >= 0)
		remove_store_files(sfd, false);
	sfd = openat(dfd, DBOX_STORE_FILES, O_RDONLY | O_DIRECTORY |
		     O_NOFOLLOW | O_CLOEXEC);
	if (sfd >= 0)
		remove_store_files(sfd, true);
	unlinkat(dfd, DBOX_STORE_STORAGE, AT_REMOVEDIR);
	unlinkat(dfd, DBOX_STORE_FILES, AT_REMOVEDIR);
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		unlinkat(dfd, names[i], 0);
	close(dfd);
	if (dir_made)
		rmdir(path);
}
