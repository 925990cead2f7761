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
 * Works on a mounted store: it takes no lock, reads the index inside one
 * read snapshot (index-stats.h) and reads committed m.N records, which
 * never change.  Messages still being written are skipped with a warning.
 *
 * A message whose bytes cannot be read (EIO: corrupt or missing m.N) is
 * reported, its partial output removed, and the export goes on (exit 1).
 */
#include "engine/store-layout.h"
#include "dboxadm.h"
#include "engine/inomap.h"
#include "progress.h"

#include "index/index-stats.h"
#include "index/index.h"
#include "storage/dbox-file.h"
#include "storage/dbox-read.h"
#include "storage/fd-cache.h"
#include "storage/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#define COPY_SIZE (1024 * 1024)
/* Directory entries read from the index at a time. */
#define PAGE_SIZE_ENTRIES 512

struct export {
	struct dbox_index *index;
	const char *store;
	int storage_fd, files_fd;  /* STORE/storage, STORE/files, or -1 */
	int alt_fd;                /* ALT/storage (alternate storage), or -1 */
	struct dbox_fd_cache mfds; /* m.N O_RDONLY, bounded (fd-cache.h) */
	struct inomap links;       /* (0, index ino) -> exported path */
	struct progress progress;
	struct adm_path path;      /* output path of the current item */
	bool keep_owner;           /* --same-owner: owners from the index */
	char *buf;                 /* COPY_SIZE bytes */
	unsigned long messages, files, dirs, linked, failed, unfinished;
	bool fatal;                /* index failure: stop */
};

struct page_entry {
	char *name;
	struct dbox_attr attr;
};

struct page {
	struct page_entry ents[PAGE_SIZE_ENTRIES];
	size_t n;
	uint64_t last_cookie;
	bool nomem;
};

/* A dbox time (index.h) as a struct timespec. */
static struct timespec ns_ts(int64_t t)
{
	int64_t sec, nsec;

	dbox_time_split(t, &sec, &nsec);
	return (struct timespec){ .tv_sec = sec, .tv_nsec = nsec };
}

static void item_failed(struct export *ex, const char *what, int err)
{
	char why[80];

	adm_error("%s: %s%s%s%s", ex->path.buf, what, *what != '\0' ? ": " : "",
		  strerror(err), adm_denied_why(err, why, sizeof(why)));
	ex->failed++;
}

static void index_failed(struct export *ex, const char *what, int err)
{
	if (!ex->fatal)
		adm_error("%s: %s: index error (%s); stopping the export",
			  ex->path.buf, what, strerror(err));
	ex->fatal = true;
}

/* The read descriptor of m.<file_id>, from the bounded cache (valid
   until the next call).  -errno on failure (logged by the caller). */
static int mfile_fd(struct export *ex, uint32_t file_id)
{
	uint64_t size;
	bool alt;

	if (dbox_index_mfile_where(ex->index, file_id, &size, &alt) < 0)
		alt = false;
	return dbox_fd_cache_get(&ex->mfds, alt ? ex->alt_fd : ex->storage_fd,
				 file_id);
}

static int write_full(int fd, const char *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, buf, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		buf += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Permission bits export gives: the index's without set-user-ID and
   set-group-ID (sticky and rwx kept). */
#define EXPORT_MODE_MASK 01777

/* The stored (user.*) extended attributes of attr's inode onto fd.  One
   the output filesystem refuses (EOPNOTSUPP, ENOSPC) is a warning: the
   file is exported without it.  Returns 0 or an index error. */
static int set_xattrs(struct export *ex, int fd, const struct dbox_attr *attr)
{
	char *names = NULL;
	size_t len = 0;
	int ret;

	if ((ret = dbox_index_xattr_list(ex->index, attr->ino, &names, &len)) < 0)
		return ret;
	for (char *n = names; ret == 0 && n < names + len; n += strlen(n) + 1) {
		void *value = NULL;
		size_t vlen;

		ret = dbox_index_xattr_get(ex->index, attr->ino, n, &value, &vlen);
		if (ret == 0 && fsetxattr(fd, n, value != NULL ? value : "",
					  vlen, 0) < 0)
			adm_warning("%s: extended attribute %s not kept: %s",
				    ex->path.buf, n, strerror(errno));
		free(value);
	}
	free(names);
	return ret;
}

/* Owner, mode, extended attributes and times of a finished output file
   or directory.  Owner first: chown may clear set-id bits that the mode
   then sets. */
static int set_attrs(struct export *ex, int fd, const struct dbox_attr *attr,
		     const struct timespec times[2])
{
	int ret;

	if (ex->keep_owner && fchown(fd, attr->uid, attr->gid) < 0)
		return -errno;
	if ((ret = set_xattrs(ex, fd, attr)) < 0)
		return ret;
	if (fchmod(fd, attr->mode & EXPORT_MODE_MASK) < 0 ||
	    futimens(fd, times) < 0)
		return -errno;
	return 0;
}

/* Copy the plaintext of the message to out.  Returns the byte count or a
   negative errno (-EIO for unreadable stored bytes). */
static int64_t copy_message(struct export *ex, const struct dbox_msgloc *loc,
			    uint64_t size, int out)
{
	struct dbox_reader *reader = NULL;
	struct dbox_metadata md = { 0 };
	uint64_t body_size, record_size, off = 0;
	ssize_t n;
	int fd, ret = 0;

	fd = mfile_fd(ex, loc->file_id);
	if (fd < 0) {
		adm_error("%s/storage/m.%u: %s", ex->store, loc->file_id,
			  strerror(-fd));
		return -EIO;
	}
	/* The whole record is checked (header, size, metadata) before any
	   byte is trusted; the storage layer logs what is wrong. */
	if ((ret = dbox_record_read(fd, loc->file_id, loc->offset,
				    loc->body_size, &body_size, &md,
				    &record_size)) < 0) {
		dbox_metadata_clear(&md);
		return ret == -ENOMEM ? -ENOMEM : -EIO;
	}
	dbox_metadata_clear(&md);
	if ((ret = dbox_reader_open(fd, loc->offset + DBOX_MSG_HEADER_SIZE,
				    loc->body_size, size, &reader)) < 0)
		return ret;
	while (off < size) {
		n = dbox_reader_pread(reader, ex->buf, COPY_SIZE, off);
		if (n <= 0) {
			ret = n < 0 ? dbox_corrupt_as_eio((int)n) : -EIO;
			break;
		}
		if ((ret = write_full(out, ex->buf, (size_t)n)) < 0)
			break;
		off += (uint64_t)n;
	}
	dbox_reader_free(&reader);
	return ret < 0 ? ret : (int64_t)off;
}

static void export_message(struct export *ex, int dirfd, const char *name,
			   const struct dbox_attr *attr)
{
	struct timespec times[2] = { ns_ts(attr->atime_ns), ns_ts(attr->mtime_ns) };
	struct dbox_msgloc loc;
	int64_t size;
	int out, ret;

	ret = dbox_index_msg_get(ex->index, attr->ino, &loc);
	if (ret == -ENOENT || (ret == 0 && loc.state != DBOX_MSG_COMMITTED)) {
		adm_warning("%s: still being written; skipped", ex->path.buf);
		ex->unfinished++;
		return;
	}
	if (ret < 0) {
		index_failed(ex, "message", -ret);
		return;
	}
	out = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW |
		     O_CLOEXEC, 0600);
	if (out < 0) {
		item_failed(ex, "", errno);
		return;
	}
	size = copy_message(ex, &loc, attr->size, out);
	ret = size < 0 ? (int)size : set_attrs(ex, out, attr, times);
	if (close(out) < 0 && ret == 0)
		ret = -errno;
	if (ret < 0) {
		item_failed(ex, "", -ret);
		unlinkat(dirfd, name, 0);
		return;
	}
	ex->messages++;
	progress_add(&ex->progress, 1, (uint64_t)size);
}

static void export_file(struct export *ex, int dirfd, const char *name,
			const struct dbox_attr *attr)
{
	struct timespec times[2];
	struct stat sb;
	char backing[24];
	int in = -1, out, ret = 0;
	uint64_t total = 0;
	ssize_t n;

	snprintf(backing, sizeof(backing), "%llu", (unsigned long long)attr->ino);
	if (ex->files_fd < 0 ||
	    (in = openat(ex->files_fd, backing, O_RDONLY | O_NOFOLLOW |
			 O_CLOEXEC)) < 0 ||
	    fstat(in, &sb) < 0) {
		ret = ex->files_fd < 0 ? ENOENT : errno;
		adm_error("%s: %s/files/%s: %s", ex->path.buf, ex->store, backing,
			  strerror(ret));
		ex->failed++;
		if (in >= 0)
			close(in);
		return;
	}
	out = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW |
		     O_CLOEXEC, 0600);
	if (out < 0) {
		item_failed(ex, "", errno);
		close(in);
		return;
	}
	while ((n = read(in, ex->buf, COPY_SIZE)) != 0) {
		if (n < 0) {
			if (errno == EINTR)
				continue;
			ret = -errno;
			break;
		}
		if ((ret = write_full(out, ex->buf, (size_t)n)) < 0)
			break;
		total += (uint64_t)n;
	}
	times[0] = sb.st_atim;
	times[1] = sb.st_mtim;
	if (ret == 0)
		ret = set_attrs(ex, out, attr, times);
	if (close(out) < 0 && ret == 0)
		ret = -errno;
	close(in);
	if (ret < 0) {
		item_failed(ex, "", -ret);
		unlinkat(dirfd, name, 0);
		return;
	}
	ex->files++;
	progress_add(&ex->progress, 0, total);
}

/* A symbolic link (its target from the index, never followed) or a
   fifo, socket or device (mknod: devices need root), with its owner as
   root, mode and mtime. */
static void export_other(struct export *ex, int dirfd, const char *name,
			 const struct dbox_attr *attr)
{
	struct timespec times[2] = { ns_ts(attr->atime_ns), ns_ts(attr->mtime_ns) };
	char *target = NULL;
	int ret;

	if (attr->kind == DBOX_KIND_SYMLINK) {
		if ((ret = dbox_index_readlink(ex->index, attr->ino, &target)) < 0) {
			index_failed(ex, "readlink", -ret);
			return;
		}
		ret = symlinkat(target, dirfd, name) < 0 ? -errno : 0;
		free(target);
	} else {
		ret = mknodat(dirfd, name, attr->mode & (S_IFMT | EXPORT_MODE_MASK),
			      (dev_t)attr->rdev) < 0 ? -errno : 0;
	}
	if (ret < 0) {
		item_failed(ex, "", -ret);
		return;
	}
	/* Owner before mode (chown may clear set-id bits); a symlink has
	   no mode of its own. */
	if ((ex->keep_owner &&
	     fchownat(dirfd, name, attr->uid, attr->gid, AT_SYMLINK_NOFOLLOW) < 0) ||
	    (attr->kind != DBOX_KIND_SYMLINK &&
	     fchmodat(dirfd, name, attr->mode & EXPORT_MODE_MASK, 0) < 0) ||
	    utimensat(dirfd, name, times, AT_SYMLINK_NOFOLLOW) < 0)
		item_failed(ex, "setting owner, mode and times", errno);
	ex->files++;
}

static void export_dir(struct export *ex, int fd, uint64_t dir);

static void export_subdir(struct export *ex, int dirfd, const char *name,
			  const struct dbox_attr *attr)
{
	struct timespec times[2] = { ns_ts(attr->atime_ns), ns_ts(attr->mtime_ns) };
	int fd, ret;

	if (mkdirat(dirfd, name, 0700) < 0 ||
	    (fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
			 O_CLOEXEC)) < 0) {
		item_failed(ex, "", errno);
		return;
	}
	export_dir(ex, fd, attr->ino);
	/* After the contents: creating them moved the mtime. */
	if ((ret = set_attrs(ex, fd, attr, times)) < 0)
		item_failed(ex, "setting mode and times", -ret);
	close(fd);
	ex->dirs++;
}

static void export_entry(struct export *ex, int dirfd, const char *name,
			 const struct dbox_attr *attr)
{
	struct inomap_entry *link;

	/* A damaged or hostile index must not make us write outside DIR:
	   a name is one path component. */
	if (name[0] == '\0' || strchr(name, '/') != NULL ||
	    strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
		item_failed(ex, "not a valid file name in the index; skipped",
			    EINVAL);
		return;
	}
	if (attr->kind == DBOX_KIND_DIR) {
		export_subdir(ex, dirfd, name, attr);
		return;
	}
	if (attr->nlink > 1 &&
	    (link = inomap_get(&ex->links, 0, attr->ino)) != NULL) {
		if (linkat(AT_FDCWD, link->path, dirfd, name, 0) < 0)
			item_failed(ex, "link", errno);
		else
			ex->linked++;
		return;
	}
	if (attr->kind == DBOX_KIND_MESSAGE)
		export_message(ex, dirfd, name, attr);
	else if (attr->kind == DBOX_KIND_SYMLINK ||
		 attr->kind == DBOX_KIND_SPECIAL)
		export_other(ex, dirfd, name, attr);
	else
		export_file(ex, dirfd, name, attr);
	if (attr->nlink > 1 && faccessat(dirfd, name, F_OK, AT_SYMLINK_NOFOLLOW) == 0 &&
	    inomap_put(&ex->links, 0, attr->ino, 0, ex->path.buf) < 0)
		adm_warning("%s: out of memory: its other names are exported "
			    "as copies", ex->path.buf);
}

static int page_cb(void *ctx, const struct dbox_dirent *ent)
{
	struct page *page = ctx;
	struct page_entry *e = &page->ents[page->n];

	if ((e->name = strndup(ent->name, ent->namelen)) == NULL) {
		page->nomem = true;
		return -ENOMEM;
	}
	e->attr = ent->attr;
	page->last_cookie = ent->cookie;
	return ++page->n == PAGE_SIZE_ENTRIES ? 1 : 0;
}

/* Export the contents of index directory dir into output directory fd. */
static void export_dir(struct export *ex, int fd, uint64_t dir)
{
	struct page *page = malloc(sizeof(*page));
	uint64_t after = 0;
	size_t old;
	int ret;

	if (page == NULL) {
		index_failed(ex, "readdir", ENOMEM);
		return;
	}
	do {
		page->n = 0;
		page->nomem = false;
		ret = dbox_index_readdir(ex->index, dir, after, page_cb, page);
		if (ret < 0)
			index_failed(ex, "readdir", -ret);
		for (size_t i = 0; i < page->n; i++) {
			if (!ex->fatal) {
				old = adm_path_push(&ex->path, page->ents[i].name);
				export_entry(ex, fd, page->ents[i].name,
					     &page->ents[i].attr);
				adm_path_pop(&ex->path, old);
			}
			free(page->ents[i].name);
		}
		after = page->last_cookie;
	} while (!ex->fatal && page->n == PAGE_SIZE_ENTRIES);
	free(page);
}

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

/* The output directory: created (mode 0700 until the end), or an
   existing empty one.  Returns its fd, or -1 after reporting. */
static int open_output(const char *dir)
{
	struct stat sb;
	char why[80];
	int fd;

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
	return fd;
}

static int open_store_dir(const char *store, const char *name)
{
	int fd = adm_open_in_store(store, name, NULL, 0);

	return fd < 0 ? -1 : fd;
}

static void export_free(struct export *ex)
{
	dbox_fd_cache_deinit(&ex->mfds);
	if (ex->storage_fd >= 0)
		close(ex->storage_fd);
	if (ex->alt_fd >= 0)
		close(ex->alt_fd);
	if (ex->files_fd >= 0)
		close(ex->files_fd);
	inomap_free(&ex->links);
	adm_path_free(&ex->path);
	free(ex->buf);
	dbox_index_close(&ex->index);
}

static int export_main(int argc, char **argv)
{
	static const char *const flags[] = { "--same-owner", NULL };
	struct export ex = { .storage_fd = -1, .files_fd = -1, .alt_fd = -1 };
	bool same_owner = false, *flag_r[] = { &same_owner };
	struct dbox_attr root;
	struct timespec times[2];
	int npos, outfd, ret;

	if ((ret = adm_parse_args(&adm_verb_export, argc, argv, flags, flag_r,
				  &npos)) != 0)
		return ret;
	if (npos != 2)
		return adm_usage_error(&adm_verb_export,
				       "export: need STORE and DIR");
	if ((ret = adm_store_enter(argv[0])) != 0)
		return ret;
	if (same_owner && geteuid() != 0) {
		adm_error("%s: --same-owner needs root and a store owned by "
			  "root (the owners in the index of a user's store are "
			  "that user's claims); nothing was exported", argv[0]);
		return ADM_EXIT_USAGE;
	}
	ex.store = argv[0];
	if ((ret = adm_open_index(ex.store, &ex.index)) != 0)
		return ret;
	if (dbox_index_snapshot_begin(ex.index) < 0 ||
	    dbox_index_getattr(ex.index, DBOX_ROOT_INO, &root) < 0) {
		adm_error("%s: the index is unreadable", ex.store);
		export_free(&ex);
		return ADM_EXIT_USAGE;
	}
	if ((outfd = open_output(argv[1])) < 0) {
		export_free(&ex);
		return ADM_EXIT_USAGE;
	}
	ex.storage_fd = open_store_dir(ex.store, DBOX_STORE_STORAGE);
	dbox_fd_cache_init(&ex.mfds, 0);
	ex.alt_fd = adm_open_alt_storage(ex.store, ex.index);
	ex.files_fd = open_store_dir(ex.store, DBOX_STORE_FILES);
	ex.keep_owner = same_owner;
	ex.buf = malloc(COPY_SIZE);
	if (ex.buf == NULL || adm_path_init(&ex.path, argv[1]) < 0) {
		adm_error("out of memory");
		close(outfd);
		export_free(&ex);
		return ADM_EXIT_FAILED;
	}
	progress_init(&ex.progress, "exported");

	export_dir(&ex, outfd, DBOX_ROOT_INO);

	/* DIR becomes the root, as cp -a src/. DIR/ would make it. */
	times[0] = ns_ts(root.atime_ns);
	times[1] = ns_ts(root.mtime_ns);
	if (set_attrs(&ex, outfd, &root, times) < 0) {
		adm_error("%s: setting mode and times: %s", argv[1],
			  strerror(errno));
		ex.failed++;
	}
	close(outfd);
	dbox_index_snapshot_end(ex.index);
	progress_finish(&ex.progress);
	if (ex.unfinished > 0)
		adm_warning("%lu messages still being written were not "
			    "exported", ex.unfinished);
	if (ex.failed > 0)
		adm_error("%lu items failed", ex.failed);
	if (isatty(STDERR_FILENO))
		fprintf(stderr, "dboxadm: %lu messages, %lu plain files, %lu "
			"directories, %lu hard links exported to %s\n",
			ex.messages, ex.files, ex.dirs, ex.linked, argv[1]);
	ret = ex.failed > 0 || ex.fatal ? ADM_EXIT_FAILED : ADM_EXIT_OK;
	export_free(&ex);
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
