/*
 * export.c: dboxadm export STORE DIR - write the store's tree out as a
 * real maildir: directories, messages (plaintext, decompressed), plain
 * files, symlinks, fifos, sockets and (as root) devices, hard links as
 * hard links, modes, and mtimes from the index
 * (directories after their contents, so creating the contents does not
 * move them).  Never set-user-ID or set-group-ID bits: the index is
 * written by whoever owns the store, and a root-owned setuid program
 * made from it would be theirs to run.  Owners only when asked
 * (--same-owner), and only by root on a store of root's (adm_store_enter
 * has made anyone else the store's owner by then).
 *
 * Works on a mounted store: it takes no lock; the engine's walk
 * (engine/export.h) reads the index inside one read snapshot and
 * committed m.N records, which never change.  Messages still being
 * written are skipped with a warning.  This file writes the output tree.
 *
 * A message whose bytes cannot be read (EIO: corrupt or missing m.N) is
 * reported, its partial output removed, and the export goes on (exit 1).
 */
#include "engine/export.h"
#include "engine/store-dirs.h"
#include "engine/store-layout.h"
#include "dboxadm.h"
#include "engine/inomap.h"
#include "progress.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#define COPY_SIZE (1024 * 1024)

struct export {
	struct dbox_export *walk;
	const char *store;
	struct inomap links;       /* (0, index ino) -> the first exported
				      name (below DIR) and its inode number */
	int out_fd;                /* DIR */
	struct progress progress;
	struct adm_path path;      /* output path of the current item */
	size_t root_len;           /* of DIR in path */
	bool keep_owner;           /* --same-owner: owners from the index */
	char *buf;                 /* COPY_SIZE bytes */
	unsigned long messages, files, dirs, linked, failed, unfinished;
	unsigned long gone;     /* deleted since the snapshot: left out */
	unsigned long others;  /* symbolic links, FIFOs, sockets, devices */
	bool fatal;                /* index failure: stop */
};

/* The output path of rel (names below DIR), in ex->path. */
static const char *at(struct export *ex, const char *rel)
{
	adm_path_pop(&ex->path, ex->root_len);
	if (*rel != '\0')
		adm_path_push(&ex->path, rel);
	return ex->path.buf;
}

static void item_failed(struct export *ex, const char *what, int err)
{
	char why[80];

	adm_error("%s: %s%s%s%s", ex->path.buf, what, *what != '\0' ? ": " : "",
		  strerror(err), adm_denied_why(err, why, sizeof(why)));
	ex->failed++;
}

static void on_index_failed(void *ctx, const char *path, const char *what,
			    int err)
{
	struct export *ex = ctx;

	if (!ex->fatal)
		adm_error("%s: %s: index error (%s); stopping the export",
			  at(ex, path), what, strerror(-err));
	ex->fatal = true;
}

static void on_item_damaged(void *ctx, const char *path, const char *what,
			    int err)
{
	struct export *ex = ctx;

	adm_error("%s: %s: damaged index rows (%s); not exported (run "
		  "'dboxadm check')", at(ex, path), what, strerror(-err));
	ex->failed++;
}

/* Permission bits export gives: the index's without set-user-ID and
   set-group-ID (sticky and rwx kept). */
#define EXPORT_MODE_MASK 01777

struct xattr_out {
	struct export *ex;
	int fd;
};

/* One stored (user.*) extended attribute onto the output file.  One the
   output filesystem refuses (EOPNOTSUPP, ENOSPC) is a warning: the file
   is exported without it. */
static int xattr_cb(void *ctx, const char *name, const void *value, size_t len)
{
	struct xattr_out *o = ctx;

	if (fsetxattr(o->fd, name, value, len, 0) < 0)
		adm_warning("%s: extended attribute %s not kept: %s",
			    o->ex->path.buf, name, strerror(errno));
	return 0;
}

/* Owner, mode, extended attributes and times of a finished output file
   or directory.  Owner first: chown may clear set-id bits that the mode
   then sets. */
static int set_attrs(struct export *ex, int fd, const struct dbox_attr *attr,
		     const struct timespec times[2])
{
	struct xattr_out o = { .ex = ex, .fd = fd };
	int ret;

	if (ex->keep_owner && fchown(fd, attr->uid, attr->gid) < 0)
		return -errno;
	if ((ret = dbox_export_xattrs(ex->walk, attr->ino, xattr_cb, &o)) < 0)
		return ret;
	if (fchmod(fd, attr->mode & EXPORT_MODE_MASK) < 0 ||
	    futimens(fd, times) < 0)
		return -errno;
	return 0;
}

/* Copy the item's bytes (a message's plaintext, a plain file's) to out;
   *total_r counts them.  Returns 0 or a negative errno. */
static int copy_bytes(struct export *ex, struct dbox_export_item *item,
		      int out, uint64_t *total_r)
{
	ssize_t n;
	int ret;

	while ((n = dbox_export_item_read(item, ex->buf, COPY_SIZE)) > 0) {
		if ((ret = adm_write_full(out, ex->buf, (size_t)n)) < 0)
			return ret;
		*total_r += (uint64_t)n;
	}
	return (int)n;
}

/* A message or plain file: its bytes into a new file, then its owner,
   mode, extended attributes and times.  A partial copy is removed. */
static void export_bytes(struct export *ex, struct dbox_export_item *item)
{
	bool message = item->attr.kind == DBOX_KIND_MESSAGE;
	uint64_t total = 0;
	int out, ret;

	if ((ret = dbox_export_item_open(ex->walk, item)) == -ESTALE) {
		/* A live store changes while it is exported, as a tree a
		   tar(1) reads does: what was deleted meanwhile is no
		   failure. */
		adm_warning("%s: deleted since the export began; left out",
			    ex->path.buf);
		ex->gone++;
		return;
	}
	if (ret < 0) {
		if (message) {
			item_failed(ex, "", -ret);
			return;
		}
		adm_error("%s: %s/" DBOX_STORE_FILES "/%llu: %s", ex->path.buf,
			  ex->store, (unsigned long long)item->attr.ino,
			  strerror(-ret));
		ex->failed++;
		return;
	}
	out = openat(item->parent_fd, item->name, O_WRONLY | O_CREAT | O_EXCL |
		     O_NOFOLLOW | O_CLOEXEC, 0600);
	if (out < 0) {
		item_failed(ex, "", errno);
		return;
	}
	ret = copy_bytes(ex, item, out, &total);
	if (ret == 0)
		ret = set_attrs(ex, out, &item->attr, (struct timespec[2]){
					item->atime, item->mtime });
	if (close(out) < 0 && ret == 0)
		ret = -errno;
	if (ret < 0) {
		item_failed(ex, "", -ret);
		unlinkat(item->parent_fd, item->name, 0);
		return;
	}
	if (message)
		ex->messages++;
	else
		ex->files++;
	progress_add(&ex->progress, message ? 1 : 0, total);
}

/* Owner (keep_owner), mode (not of a symbolic link) and times of the
   node of type type (S_IFMT bits) just made as name in dirfd, set through
   a descriptor of that very node: DIR may be writable by another user,
   who could put a symbolic link or a hard link of someone else's file
   under that name between the mknod and a call by name (an attack run
   made root's export chmod a file of root's that way).  The descriptor
   must be a node of that type with one name, made by us.  Returns 0 or a
   negative errno (-EAGAIN: the name no longer is our node). */
static int node_attrs(int dirfd, const char *name, mode_t type,
		      const struct dbox_attr *attr, bool keep_owner,
		      const struct timespec times[2])
{
	int fd = openat(dirfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	char proc[40];
	struct stat sb;
	int ret = 0;

	if (fd < 0)
		return -errno;
	if (fstat(fd, &sb) < 0)
		ret = -errno;
	else if ((sb.st_mode & S_IFMT) != type || sb.st_nlink != 1 ||
		 sb.st_uid != geteuid())
		ret = -EAGAIN;
	/* Owner before mode (chown may clear set-id bits); a symlink has
	   no mode of its own.  /proc/self/fd/N names the node itself. */
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	if (ret == 0 && keep_owner &&
	    fchownat(fd, "", attr->uid, attr->gid, AT_EMPTY_PATH) < 0)
		ret = -errno;
	if (ret == 0 && type != S_IFLNK &&
	    chmod(proc, attr->mode & EXPORT_MODE_MASK) < 0)
		ret = -errno;
	if (ret == 0 && utimensat(fd, "", times, AT_EMPTY_PATH) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

/* A symbolic link (its target from the index, never followed) or a
   fifo, socket or device (mknod: devices need root), with its owner as
   root, mode and mtime. */
static void export_other(struct export *ex, struct dbox_export_item *item)
{
	const struct dbox_attr *attr = &item->attr;
	struct timespec times[2] = { item->atime, item->mtime };
	int dirfd = item->parent_fd;
	const char *name = item->name;
	mode_t type = attr->kind == DBOX_KIND_SYMLINK ? S_IFLNK :
		attr->mode & S_IFMT;
	int ret;

	if (attr->kind == DBOX_KIND_SYMLINK)
		ret = symlinkat(item->target, dirfd, name) < 0 ? -errno : 0;
	else
		ret = mknodat(dirfd, name, attr->mode & (S_IFMT | EXPORT_MODE_MASK),
			      (dev_t)attr->rdev) < 0 ? -errno : 0;
	if (ret < 0) {
		item_failed(ex, "", -ret);
		return;
	}
	if ((ret = node_attrs(dirfd, name, type, attr, ex->keep_owner,
			      times)) < 0)
		item_failed(ex, ret == -EAGAIN ? "setting owner, mode and "
			    "times: the name was changed meanwhile" :
			    "setting owner, mode and times", -ret);
	ex->others++;
}

/* A damaged or hostile index must not make us write outside DIR: a name
   is one path component.  Reports and returns false when it is not. */
static bool name_ok(struct export *ex, const char *name)
{
	if (name[0] != '\0' && strchr(name, '/') == NULL &&
	    strcmp(name, ".") != 0 && strcmp(name, "..") != 0)
		return true;
	item_failed(ex, "not a valid file name in the index; skipped", EINVAL);
	return false;
}

static int on_dir_begin(void *ctx, struct dbox_export_item *item)
{
	struct export *ex = ctx;
	int fd;

	at(ex, item->path);
	if (!name_ok(ex, item->name))
		return 1;
	if (mkdirat(item->parent_fd, item->name, 0700) < 0 ||
	    (fd = openat(item->parent_fd, item->name, O_RDONLY | O_DIRECTORY |
			 O_NOFOLLOW | O_CLOEXEC)) < 0) {
		item_failed(ex, "", errno);
		return 1;
	}
	item->dir_fd = fd;
	return 0;
}

static void on_dir_end(void *ctx, struct dbox_export_item *item)
{
	struct export *ex = ctx;
	struct timespec times[2] = { item->atime, item->mtime };
	int ret;

	at(ex, item->path);
	/* After the contents: creating them moved the mtime. */
	if ((ret = set_attrs(ex, item->dir_fd, &item->attr, times)) < 0)
		item_failed(ex, "setting mode and times", -ret);
	close(item->dir_fd);
	ex->dirs++;
}

/* The directory holding rel (names below DIR, '/'-separated), opened
   from DIR one name at a time and never through a symbolic link: whoever
   may write in DIR could switch a directory on the way for a link to
   anywhere (a linkat() by path made /etc/shadow a name of root's export
   that way).  *name_r: rel's last name.  Returns the fd or -errno. */
static int open_parent(int root_fd, const char *rel, const char **name_r)
{
	const char *p = rel, *slash;
	int fd = fcntl(root_fd, F_DUPFD_CLOEXEC, 0);

	while (fd >= 0 && (slash = strchr(p, '/')) != NULL) {
		char part[NAME_MAX + 1];
		size_t len = (size_t)(slash - p);
		int next;

		if (len == 0 || len > NAME_MAX) {
			close(fd);
			return -EINVAL;
		}
		memcpy(part, p, len);
		part[len] = '\0';
		next = openat(fd, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
			      O_CLOEXEC);
		close(fd);
		fd = next;
		p = slash + 1;
	}
	*name_r = p;
	return fd < 0 ? -errno : fd;
}

/* Another name of a file exported already (link): a hard link to it,
   made from its directory's descriptor, never following a link, and
   checked to be the very file exported. */
static void export_link(struct export *ex, struct dbox_export_item *item,
			const struct inomap_entry *link)
{
	const char *name;
	struct stat sb;
	int dir = open_parent(ex->out_fd, link->path, &name);

	if (dir < 0) {
		item_failed(ex, "link", -dir);
		return;
	}
	if (linkat(dir, name, item->parent_fd, item->name, 0) < 0) {
		item_failed(ex, "link", errno);
	} else if (fstatat(item->parent_fd, item->name, &sb,
			   AT_SYMLINK_NOFOLLOW) < 0 || sb.st_ino != link->value) {
		unlinkat(item->parent_fd, item->name, 0);
		adm_error("%s: link: its other name %s was changed meanwhile; "
			  "not exported", ex->path.buf, link->path);
		ex->failed++;
	} else {
		ex->linked++;
	}
	close(dir);
}

static int on_entry(void *ctx, struct dbox_export_item *item)
{
	struct export *ex = ctx;
	const struct dbox_attr *attr = &item->attr;
	struct inomap_entry *link;
	struct stat sb;

	at(ex, item->path);
	if (!name_ok(ex, item->name))
		return 0;
	if (attr->nlink > 1 &&
	    (link = inomap_get(&ex->links, 0, attr->ino)) != NULL) {
		export_link(ex, item, link);
		return 0;
	}
	if (attr->kind == DBOX_KIND_MESSAGE && item->unfinished) {
		adm_warning("%s: still being written; skipped", ex->path.buf);
		ex->unfinished++;
		return 0;
	}
	if (attr->kind == DBOX_KIND_SYMLINK || attr->kind == DBOX_KIND_SPECIAL)
		export_other(ex, item);
	else
		export_bytes(ex, item);
	if (attr->nlink > 1 &&
	    fstatat(item->parent_fd, item->name, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
	    inomap_put(&ex->links, 0, attr->ino, sb.st_ino, item->path) < 0)
		adm_warning("%s: out of memory: its other names are exported "
			    "as copies", ex->path.buf);
	return 0;
}

static const struct dbox_export_ops export_ops = {
	.dir_begin = on_dir_begin,
	.dir_end = on_dir_end,
	.entry = on_entry,
	.index_failed = on_index_failed,
	.item_damaged = on_item_damaged,
};

/* Is the directory at path empty?  Sets errno when it cannot be read. */
static bool dir_is_empty(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct dirent *de;
	bool empty = true;
	DIR *d;

	if (fd < 0 || (d = fdopendir(fd)) == NULL) {
		if (fd >= 0)
			close(fd);
		return false;
	}
	while ((de = readdir(d)) != NULL)
		if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
			empty = false;
	closedir(d);
	return empty;
}

/* For root: is the way to dir (as given and real; dir opened as fd, or
   its parent while dir does not exist yet, fd -1) free of other users'
   directories and symbolic links?  Walked strictly: a step gone refuses
   (a lax walk skips it, and a user's link that took the open elsewhere
   and vanished passed: helper-93, for backup's DEST), and an opened dir
   must still be what the path names.  Returns true, or false after
   reporting. */
static bool way_is_roots(const char *dir, int fd)
{
	char *path;
	struct stat opened;
	uid_t foreign = 0;
	int ret;

	if (geteuid() != 0)
		return true;
	path = fd >= 0 ? strdup(dir) : dbox_path_parent(dir);
	if (path == NULL) {
		adm_error("%s: %s", dir, strerror(ENOMEM));
		return false;
	}
	ret = fd >= 0 && fstat(fd, &opened) < 0 ? -errno :
		dbox_path_way_owner(path, 0, fd >= 0 ? &opened : NULL,
				    &foreign);
	free(path);
	if (ret < 0) {
		adm_error("%s: the way to it %s; nothing was exported", dir,
			  ret == -ENOENT ? "went away while dboxadm looked at it" :
			  ret == -ESTALE ? "changed while dboxadm looked at it" :
			  strerror(-ret));
		return false;
	}
	if (foreign == 0)
		return true;
	adm_error("%s: reached through a directory or symbolic link of uid "
		  "%u, who could switch where root writes; export into a "
		  "directory only root controls (or as that user)", dir,
		  (unsigned)foreign);
	return false;
}

/* May this process write its export into dir, open as fd?  Whoever
   could swap a step of the way, or what lies in dir, chooses where its
   files go: root writing through a user's symbolic link or directory,
   or into an empty directory a user made in /tmp, put root's mail tree
   where that user wanted, readable by them (helper-79 F1).  So dir must
   be this process's own directory that no one else may write in (root:
   group writers neither), and for root every directory and symbolic
   link on the way to it root's (dbox_path_foreign_owner), as for a
   backup's DEST.partial and a store's ALT.  Returns true, or false after
   reporting. */
static bool output_is_ours(const char *dir, int fd)
{
	uid_t euid = geteuid();
	struct stat sb;

	if (fstat(fd, &sb) < 0) {
		adm_error("%s: %s", dir, strerror(errno));
		return false;
	}
	if (!way_is_roots(dir, fd))
		return false;
	if (sb.st_uid != euid || (sb.st_mode & (euid == 0 ? 022 : 002))) {
		adm_error("%s: belongs to uid %u or others may write in it "
			  "(mode %o); export into a new directory, or an empty "
			  "one of your own", dir, (unsigned)sb.st_uid,
			  (unsigned)(sb.st_mode & 07777));
		return false;
	}
	return true;
}

/* The output directory: created (mode 0700 until the end), or an
   existing empty one of ours (output_is_ours).  Returns its fd, or -1
   after reporting. */
static int open_output(const char *dir)
{
	struct stat sb;
	char why[80];
	int fd;

	/* Nothing made through another user's way either. */
	if (!way_is_roots(dir, -1))
		return -1;
	if (mkdir(dir, 0700) < 0) {
		if (errno != EEXIST) {
			adm_error("%s: %s%s", dir, strerror(errno),
				  adm_denied_why(errno, why, sizeof(why)));
			return -1;
		}
		if (stat(dir, &sb) < 0 || !S_ISDIR(sb.st_mode)) {
			adm_error("%s: exists and is not a directory", dir);
			return -1;
		}
		if (!dir_is_empty(dir)) {
			adm_error("%s: exists and is not empty; export needs a "
				  "new or empty directory", dir);
			return -1;
		}
	}
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		adm_error("%s: %s%s", dir, strerror(errno),
			  adm_denied_why(errno, why, sizeof(why)));
	if (fd >= 0 && !output_is_ours(dir, fd)) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Walk the store into outfd (DIR), then give DIR the root's attributes,
   as cp -a src/. DIR/ would. */
static void export_tree(struct export *ex, int outfd, const char *dir,
			const struct dbox_export_item *root)
{
	struct timespec times[2] = { root->atime, root->mtime };
	int ret;

	progress_init(&ex->progress, "exported");
	ex->out_fd = outfd;
	if (dbox_export_walk(ex->walk, &export_ops, ex, outfd) < 0)
		ex->fatal = true;
	if (!ex->fatal) {
		uint64_t unreached = 0;

		if (dbox_export_unreached(ex->walk, &unreached) == 0 &&
		    unreached > 0) {
			adm_error("%llu names of the index were not reached "
				  "from its root (below a directory left out "
				  "above, or in a part of the tree a damaged "
				  "index detached: run 'dboxadm check %s'); "
				  "not exported", (unsigned long long)unreached,
				  ex->store);
			ex->failed++;
		}
	}
	at(ex, "");
	if ((ret = set_attrs(ex, outfd, &root->attr, times)) < 0) {
		adm_error("%s: setting mode and times: %s", dir, strerror(-ret));
		ex->failed++;
	}
	progress_finish(&ex->progress);
}

static void export_report(const struct export *ex, const char *dir)
{
	if (ex->unfinished > 0)
		adm_warning("%lu messages still being written were not "
			    "exported", ex->unfinished);
	if (ex->gone > 0)
		adm_warning("%lu messages and files deleted since the export "
			    "began were left out", ex->gone);
	if (ex->failed > 0)
		adm_error("%lu items failed", ex->failed);
	/* Always, on stdout, as import's summary. */
	printf("%s: %lu messages, %lu plain files, ", ex->store, ex->messages,
	       ex->files);
	if (ex->others > 0)
		printf("%lu symbolic links and special files, ", ex->others);
	printf("%lu directories, %lu hard links exported to %s\n", ex->dirs,
	       ex->linked, dir);
}

static int export_main(int argc, char **argv)
{
	static const char *const flags[] = { "--same-owner", NULL };
	struct export ex = { 0 };
	bool same_owner = false, *flag_r[] = { &same_owner };
	struct dbox_view *view = NULL;
	struct dbox_export_item root;
	int outfd, ret;

	if ((ret = adm_verb_begin(&adm_verb_export, argc, argv, flags, flag_r,
				  2, "STORE and DIR")) != 0)
		return ret;
	if (same_owner && geteuid() != 0) {
		adm_error("%s: --same-owner needs root and a store owned by "
			  "root (the owners in the index of a user's store are "
			  "that user's claims); nothing was exported", argv[0]);
		return ADM_EXIT_USAGE;
	}
	ex.store = argv[0];
	ex.keep_owner = same_owner;
	if ((ret = adm_open_view(ex.store, &view)) != 0)
		return ret;
	ret = ADM_EXIT_USAGE;
	if (dbox_export_begin(view, &ex.walk, &root) < 0)
		adm_error("%s: the index is unreadable", ex.store);
	else if ((outfd = open_output(argv[1])) >= 0) {
		ex.buf = malloc(COPY_SIZE);
		if (ex.buf == NULL || adm_path_init(&ex.path, argv[1]) < 0) {
			adm_error("out of memory");
			ret = ADM_EXIT_FAILED;
		} else {
			ex.root_len = ex.path.len;
			export_tree(&ex, outfd, argv[1], &root);
			export_report(&ex, argv[1]);
			ret = ex.failed > 0 || ex.fatal ? ADM_EXIT_FAILED :
				ADM_EXIT_OK;
		}
		close(outfd);
	}
	dbox_export_end(&ex.walk);
	dbox_view_close(&view);
	inomap_free(&ex.links);
	adm_path_free(&ex.path);
	free(ex.buf);
	return ret;
}

const struct adm_verb adm_verb_export = {
	.name = "export",
	.summary = "write a store out as a maildir tree (mounted or not)",
	.usage =
	"usage: dboxadm export STORE DIR [--same-owner]\n"
	"\n"
	"Write the tree of STORE into DIR (which must not exist, or be empty) as a\n"
	"real maildir: directories, messages (plaintext), plain files, with hard\n"
	"links, modes and mtimes as the mount shows them, but never set-user-ID\n"
	"or set-group-ID bits.  The files belong to whoever runs the export; run\n"
	"by root on a store owned by another user, that is the store's owner\n"
	"(dboxadm becomes that user first).  --same-owner (root, on a store owned\n"
	"by root only) sets the owners the index records.\n"
	"Works while STORE is mounted: it reads one consistent snapshot of the\n"
	"index and skips messages still being written (with a warning).\n"
	"\n"
	"A message whose stored bytes cannot be read is reported, left out, and\n"
	"the export goes on.  Exit status: 0 all exported, 1 some items failed,\n"
	"2 usage error or store refused.  Progress is shown when stderr is a\n"
	"terminal.\n",
	.run = export_main,
};
