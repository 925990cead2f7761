/*
 * store.c: opening a store directory (layout, lock, index, crash
 * recovery), the pool of m.N files taking new messages, and saving one
 * message (see store.h).
 *
 * Invariants:
 *  - an m.N in st->append is owned by at most one dbox_save (busy), and
 *    only that save writes to it, only past its committed end;
 *  - a file id is never reused: next_file_id is above every m.N on disk
 *    and in the index;
 *  - an m.N is appended to only after whole records: at open, the last
 *    m.N rejoins the pool only if its records run to its committed end.
 */
#include "engine/maildir.h"
#include "engine/store-layout.h"
#include "engine/store.h"
#include "engine/store-lock.h"

#include "index/index-rebuild.h"
#include "index/reserve.h"
#include "storage/dbox-read.h"
#include "storage/dbox-scan.h"
#include "storage/guid.h"
#include "storage/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* Is the directory (open as fd) empty? */
static bool dir_is_empty(int fd)
{
	DIR *dir = fdopendir(dup(fd));
	struct dirent *d;
	bool empty = true;

	if (dir == NULL)
		return false;
	rewinddir(dir); /* the dup shares fd's offset */
	while ((d = readdir(dir)) != NULL) {
		if (strcmp(d->d_name, ".") != 0 && strcmp(d->d_name, "..") != 0) {
			empty = false;
			break;
		}
	}
	closedir(dir);
	return empty;
}

/* Does the directory (open as fd) look like a Maildir++ tree: cur/ new/
   tmp/ at its top, or a ".Folder" with cur/? */
static bool dir_is_maildir(int fd)
{
	DIR *dir;
	struct dirent *d;
	char sub[NAME_MAX + 8];
	bool found = false;
	size_t n = 0;

	while (n < MAILDIR_SUBDIR_COUNT &&
	       faccessat(fd, maildir_subdirs[n], F_OK, 0) == 0)
		n++;
	if (n == MAILDIR_SUBDIR_COUNT)
		return true;
	if ((dir = fdopendir(dup(fd))) == NULL)
		return false;
	rewinddir(dir); /* the dup shares fd's offset */
	while (!found && (d = readdir(dir)) != NULL) {
		if (d->d_name[0] != '.' || strcmp(d->d_name, ".") == 0 ||
		    strcmp(d->d_name, "..") == 0)
			continue;
		snprintf(sub, sizeof(sub), "%s/cur", d->d_name);
		found = faccessat(fd, sub, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
	}
	closedir(dir);
	return found;
}

/* May this process not write the store (open as dir_fd) or its index:
   read-only media (EROFS), or no write permission (EACCES)? */
static bool store_is_read_only(int dir_fd)
{
	static const char *const names[] = { ".", DBOX_STORE_INDEX };

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (faccessat(dir_fd, names[i], W_OK, AT_EACCESS) < 0 &&
		    (errno == EROFS || errno == EACCES))
			return true;
	}
	return false;
}

/* Open or create STORE/name as a directory (mode 0700). */
static int open_subdir(int dir_fd, const char *name, bool create)
{
	int fd;

	if (create && mkdirat(dir_fd, name, 0700) < 0 && errno != EEXIST)
		return -errno;
	fd = openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

/* Is path the directory open as fd?  0 or -ESTALE. */
static int same_dir(int fd, const char *path)
{
	struct stat a, b;

	if (fstat(fd, &a) < 0 || stat(path, &b) < 0 || a.st_dev != b.st_dev ||
	    a.st_ino != b.st_ino)
		return -ESTALE;
	return 0;
}

static int open_layout(struct dbox_store *st, const char *path, bool create)
{
	bool is_store;

	if (st->readonly)
		create = false;
	if (create && mkdir(path, 0700) < 0 && errno != EEXIST) {
		dbox_error("%s: cannot create store: %s", path, strerror(errno));
		return -errno;
	}
	st->dir_fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (st->dir_fd < 0) {
		dbox_error("%s: cannot open store: %s", path, strerror(errno));
		return -errno;
	}
	is_store = faccessat(st->dir_fd, DBOX_STORE_INDEX, F_OK, 0) == 0;
	if (!is_store && dir_is_maildir(st->dir_fd)) {
		dbox_error("%s: this is a maildir, not a store: 'dboxadm import "
			   "STORE %s' copies it into a new store STORE, which "
			   "dboxfs then mounts", path, path);
		return -ENOTEMPTY;
	}
	if (!is_store && !dir_is_empty(st->dir_fd)) {
		dbox_error("%s: not a dbox store (no index.sqlite) and not empty; "
			   "refusing to use it (if it was a store, run "
			   "'dboxadm rebuild %s')", path, path);
		return -ENOTEMPTY;
	}
	if (!is_store && !create) {
		dbox_error("%s: no store here", path);
		return -ENOENT;
	}
	if (st->readonly) {
		st->lock_fd = dbox_store_lock_shared(st->dir_fd, path);
		if (st->lock_fd == -ENOENT)
			st->lock_fd = -1; /* nobody can have it: no lock */
		else if (st->lock_fd < 0)
			return st->lock_fd;
	} else if ((st->lock_fd = dbox_store_lock(st->dir_fd, path)) < 0) {
		return st->lock_fd;
	}
	if ((st->storage_fd = open_subdir(st->dir_fd, DBOX_STORE_STORAGE,
					  !st->readonly)) < 0 ||
	    (st->files_fd = open_subdir(st->dir_fd, DBOX_STORE_FILES,
					!st->readonly)) < 0) {
		int ret = st->storage_fd < 0 ? st->storage_fd : st->files_fd;

		dbox_error("%s: cannot open storage/ or files/: %s", path,
			   strerror(-ret));
		return ret;
	}
	return 0;
}

/* The N of a file name "m.N", or false when it is no m.N. */
static bool mfile_name_id(const char *name, uint32_t *file_id_r)
{
	return dbox_mfile_parse_name(name, file_id_r);
}

/* Highest N of the storage/m.N files on disk. */
static uint32_t max_file_on_disk(int storage_fd)
{
	DIR *dir = fdopendir(dup(storage_fd));
	struct dirent *d;
	uint32_t max = 0, id;

	if (dir == NULL)
		return 0;
	rewinddir(dir); /* the dup shares storage_fd's offset */
	while ((d = readdir(dir)) != NULL) {
		if (mfile_name_id(d->d_name, &id) && id > max)
			max = id;
	}
	closedir(dir);
	return max;
}

const char *dbox_store_dir_name(const struct dbox_store *st, bool alt)
{
	return alt && st->alt_path != NULL ? st->alt_path : st->path;
}

int dbox_store_mfile_dir(struct dbox_store *st, uint32_t file_id, bool *alt_r)
{
	uint64_t size;
	int ret = dbox_index_mfile_where(st->index, file_id, &size, alt_r);

	if (ret == -ENOENT) {
		*alt_r = false;
		return -ENOENT;
	}
	if (ret < 0)
		return ret;
	if (!*alt_r)
		return st->storage_fd;
	if (st->alt_fd >= 0)
		return st->alt_fd;
	if (st->alt_path == NULL)
		dbox_error("%s: m.%u is in the alternate storage, and the store "
			   "has no ALT path (dboxfs -o alt=PATH); its messages "
			   "fail with EIO", st->path, file_id);
	else
		dbox_error("%s/storage/m.%u: the alternate storage %s/storage "
			   "is not available (%s); its messages fail with EIO",
			   st->alt_path, file_id, st->alt_path,
			   strerror(st->alt_err));
	return -EIO;
}

int dbox_store_mfile_open(struct dbox_store *st, uint32_t file_id, int flags)
{
	char name[16];
	bool alt;
	int dir = dbox_store_mfile_dir(st, file_id, &alt), fd;

	if (dir == -ENOENT)
		dir = st->storage_fd;
	if (dir < 0)
		return -EIO;
	dbox_file_name(name, file_id);
	fd = openat(dir, name, flags | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		dbox_error("%s/storage/%s: %s", dbox_store_dir_name(st, alt),
			   name, strerror(errno));
		return -EIO;
	}
	return fd;
}


void dbox_store_tail_keys(uint32_t file_id, char inflight[32], char kept[32])
{
	snprintf(inflight, 32, "inflight.m.%u", file_id);
	snprintf(kept, 32, "kept.m.%u", file_id);
}

/* Copy bytes [from, end) of storage/name (open as fd; ALT/storage/name
   when alt) to STORE/lost+found/name-<from> before recovery cuts them.  Returns 0 or
   a negative errno (logged): then nothing is cut. */
static int save_cut_bytes(struct dbox_store *st, int fd, const char *name,
			  bool alt, uint64_t from, uint64_t end)
{
	char copy[48], buf[65536];
	int dir, out, ret = 0;

	if (mkdirat(st->dir_fd, DBOX_STORE_LOST_FOUND, 0700) < 0 &&
	    errno != EEXIST)
		ret = -errno;
	dir = ret < 0 ? -1 : openat(st->dir_fd, DBOX_STORE_LOST_FOUND,
				    O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
				    O_CLOEXEC);
	snprintf(copy, sizeof(copy), "%s-%llu", name, (unsigned long long)from);
	out = dir < 0 ? -1 : openat(dir, copy, O_WRONLY | O_CREAT | O_TRUNC |
				    O_NOFOLLOW | O_CLOEXEC, 0600);
	if (out < 0 && ret == 0)
		ret = -errno;
	for (uint64_t off = from; ret == 0 && off < end; ) {
		size_t want = end - off < sizeof(buf) ? end - off : sizeof(buf);
		ssize_t n = pread(fd, buf, want, (off_t)off);

		if (n <= 0 || write(out, buf, (size_t)n) != n)
			ret = n < 0 ? -errno : -EIO;
		off += n > 0 ? (uint64_t)n : 0;
	}
	if (ret == 0 && fsync(out) < 0)
		ret = -errno;
	if (out >= 0)
		close(out);
	if (dir >= 0)
		close(dir);
	if (ret < 0)
		dbox_error("%s/%s/%s: cannot keep the bytes recovery would cut "
			   "(%s); storage/%s is left as it is", st->path,
			   DBOX_STORE_LOST_FOUND, copy, strerror(-ret), name);
	else
		dbox_info("%s/storage/%s: the %llu bytes cut after %llu are kept "
			  "in %s/%s/%s until 'dboxadm check' finds the store "
			  "clean", dbox_store_dir_name(st, alt), name, (unsigned long long)(end - from),
			  (unsigned long long)from, st->path, DBOX_STORE_LOST_FOUND,
			  copy);
	return ret;
}

/* Recovery of one m.N past its committed end `size`, before the index's
   own recovery drops the WRITING rows.  The record a save or purge had in
   flight starts where its m.N ended when it took the file: a delivery's
   WRITING row says where, as inflight.m.N does for a copy-on-write copy
   or a purge's copies (committed before their first byte is written).
   That record and what follows nobody was told is stored, and is cut.
   Whole records before it are no unfinished write but messages an older
   index does not know (a restored backup, a lost WAL): they are never
   cut; kept.m.N remembers them, the file takes no new records, and
   'dboxadm rebuild' brings them back into their folders.  Other bytes (a
   torn record) are cut after a copy is kept in lost+found/. */
static int recover_mfile(void *ctx, uint32_t file_id, uint64_t size)
{
	struct dbox_store *st = ctx;
	char name[16], inflight_key[32], kept_key[32];
	int64_t inflight = -1, kept = 0;
	uint64_t start, keep_end, writing;
	struct stat stbuf;
	long whole = 0;
	bool alt;
	int fd, dir;

	dbox_file_name(name, file_id);
	dir = dbox_store_mfile_dir(st, file_id, &alt);
	if (dir < 0)
		return 0; /* logged: ALT is missing */
	fd = openat(dir, name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		dbox_error("%s/storage/%s: %s; its messages will fail with EIO "
			   "(run 'dboxadm check')", dbox_store_dir_name(st, alt),
			   name, strerror(errno));
		return 0;
	}
	if (fstat(fd, &stbuf) < 0 || (uint64_t)stbuf.st_size <= size) {
		close(fd);
		return 0;
	}
	dbox_store_tail_keys(file_id, inflight_key, kept_key);
	if (dbox_index_meta_get(st->index, inflight_key, &inflight) < 0 ||
	    (uint64_t)inflight < size)
		inflight = -1;
	/* A delivery in flight: its WRITING row says where it starts. */
	if (dbox_index_writing_offset(st->index, file_id, size, &writing) == 1 &&
	    (inflight < 0 || writing < (uint64_t)inflight))
		inflight = (int64_t)writing;
	if (dbox_index_meta_get(st->index, kept_key, &kept) < 0 ||
	    (uint64_t)kept < size)
		kept = (int64_t)size;
	start = (uint64_t)kept;
	keep_end = start;
	if (inflight < 0 || (uint64_t)inflight > start) {
		whole = dbox_file_tail_records(fd, file_id, start, inflight < 0 ?
					       UINT64_MAX : (uint64_t)inflight,
					       &keep_end, NULL, NULL);
		if (whole < 0)
			whole = 0;
	}
	if (whole > 0) {
		dbox_info("%s/storage/%s: %ld whole records after the committed "
			  "end %llu that the index does not know (is the index "
			  "older than storage/?) are kept; 'dboxadm check' "
			  "names them and 'dboxadm rebuild' brings them back",
			  dbox_store_dir_name(st, alt), name, whole,
			  (unsigned long long)size);
		if (dbox_index_set_meta(st->index, kept_key,
					(int64_t)keep_end) < 0) {
			close(fd);
			return 0; /* nothing cut */
		}
		st->kept_records += (unsigned long)whole;
	}
	if ((uint64_t)stbuf.st_size > keep_end) {
		/* The record in flight is dropped as its delivery is; other
		   bytes only after a copy: also more than one whole record
		   from the in-flight mark on (purge copies; or a mark an older
		   copy of the index kept while later saves went on). */
		uint64_t end;
		bool only_inflight = inflight >= 0 &&
			(uint64_t)inflight == keep_end &&
			dbox_file_tail_records(fd, file_id, keep_end, UINT64_MAX,
					       &end, NULL, NULL) < 2;

		if (!only_inflight &&
		    save_cut_bytes(st, fd, name, alt, keep_end, stbuf.st_size) < 0) {
			close(fd);
			return 0;
		}
		dbox_info("%s/storage/%s: cutting %llu bytes of unfinished "
			  "writes after %llu", dbox_store_dir_name(st, alt), name,
			  (unsigned long long)(stbuf.st_size - keep_end),
			  (unsigned long long)keep_end);
		if (ftruncate(fd, keep_end) < 0)
			dbox_error("%s/storage/%s: ftruncate: %s",
				   dbox_store_dir_name(st, alt), name, strerror(errno));
	}
	close(fd);
	return 0;
}

int dbox_store_purged_key(struct dbox_index *index, uint32_t file_id, bool set)
{
	char key[32];
	int64_t v;

	snprintf(key, sizeof(key), "purged.m.%u", file_id);
	if (set)
		return dbox_index_set_meta(index, key, 1);
	return dbox_index_meta_get(index, key, &v) == 0 && v == 1;
}

int dbox_store_unknown_records(struct dbox_store *st, int fd, uint32_t file_id)
{
	size_t header_len;
	uint64_t end;
	struct stat sb;

	if (dbox_store_purged_key(st->index, file_id, false) == 1 ||
	    (fstat(fd, &sb) == 0 && sb.st_size == 0))
		return 0;
	if (dbox_file_read_header(fd, &header_len) < 0)
		return 1;
	return dbox_file_tail_records(fd, file_id, header_len, UINT64_MAX, &end,
				      NULL, NULL) != 0;
}

/* Recovery of the m.N files the index does not know.  Their creation
   was in a transaction that never committed - a save commits the file
   before writing to it, so such a file holds no whole record -, or this
   index purged them (purged.m.N: a crash between the switch and the
   unlink left copies), or they come from a later life of the store than
   this index (a restored backup, a lost WAL).  Whole records are kept in
   the last case (check reports them, rebuild brings them back); other
   bytes are cut to the header line, after a copy when they follow kept
   records.  They keep their number, which is never reused. */
static void recover_unknown_mfiles(struct dbox_store *st, bool alt)
{
	int dir_fd = alt ? st->alt_fd : st->storage_fd;
	const char *root = dbox_store_dir_name(st, alt);
	DIR *dir = dir_fd >= 0 ? fdopendir(dup(dir_fd)) : NULL;
	struct dirent *d;

	if (dir == NULL)
		return;
	rewinddir(dir); /* the dup shares storage_fd's offset */
	while ((d = readdir(dir)) != NULL) {
		struct stat stbuf;
		size_t header_len;
		uint64_t size;
		uint32_t id;
		int fd;

		if (!mfile_name_id(d->d_name, &id) ||
		    dbox_index_mfile_get(st->index, id, &size) != -ENOENT)
			continue;
		fd = openat(dir_fd, d->d_name, O_RDWR | O_NOFOLLOW |
			    O_CLOEXEC);
		if (fd < 0)
			continue;
		if (fstat(fd, &stbuf) == 0 &&
		    dbox_file_read_header(fd, &header_len) == 0 &&
		    (uint64_t)stbuf.st_size > header_len) {
			/* Whole records: messages of an index newer than this
			   one (a save commits its file first, so a file whose
			   creation never committed holds none). */
			uint64_t keep_end;
			long whole = dbox_file_tail_records(fd, id, header_len,
							    UINT64_MAX, &keep_end,
							    NULL, NULL);

			/* A file this index purged (a crash between the
			   switch and the unlink) holds copies: garbage.  Any
			   other may hold the only copy of a message the index
			   lost (purge copies of an index older than storage/
			   carry GUIDs the index has, at locations that are
			   gone), so its whole records are kept. */
			if (dbox_store_purged_key(st->index, id, false) == 1)
				whole = 0;
			if (whole > 0) {
				dbox_info("%s/storage/%s: unknown to the index; its "
					  "%ld whole records are kept ('dboxadm "
					  "rebuild' brings them back)", root,
					  d->d_name, whole);
				st->kept_records += (unsigned long)whole;
			} else {
				keep_end = header_len;
			}
			if ((uint64_t)stbuf.st_size > keep_end &&
			    (keep_end == header_len ||
			     save_cut_bytes(st, fd, d->d_name, alt, keep_end,
					    stbuf.st_size) == 0)) {
				dbox_info("%s/storage/%s: unknown to the index; "
					  "cutting %llu bytes of uncommitted "
					  "writes", root, d->d_name,
					  (unsigned long long)
					  (stbuf.st_size - keep_end));
				if (ftruncate(fd, keep_end) < 0)
					dbox_error("%s/storage/%s: ftruncate: %s",
						   root, d->d_name,
						   strerror(errno));
			}
		}
		close(fd);
	}
	closedir(dir);
}

/* Recovery of files/: a backing file of an inode that is no plain file
   any more was turned into a message (its unlink cut by the crash) and
   goes.  One that belongs to no inode was created by a transaction that
   never committed (the create of a plain file cut by a crash: always
   empty, as the client only writes after the create returned; or an
   import batch).  SQLite hands its number out
   again, and the next create of a plain file would find the name taken.
   An empty one is removed; one with bytes is kept for 'dboxadm check' and
   'rebuild' (lost+found/), and its number is never handed out. */
static int recover_files(struct dbox_store *st)
{
	DIR *dir = fdopendir(dup(st->files_fd));
	struct dirent *d;
	int ret = 0;

	if (dir == NULL)
		return 0;
	rewinddir(dir); /* the dup shares files_fd's offset */
	while ((d = readdir(dir)) != NULL && ret == 0) {
		unsigned long long ino;
		struct dbox_attr attr;
		struct stat stbuf;
		char *end;

		errno = 0;
		ino = strtoull(d->d_name, &end, 10);
		if (*end != '\0' || errno != 0 || d->d_name[0] < '1' ||
		    d->d_name[0] > '9' ||
		    fstatat(st->files_fd, d->d_name, &stbuf, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		ret = dbox_index_getattr(st->index, ino, &attr);
		if (ret == 0 && attr.kind != DBOX_KIND_FILE) {
			/* A plain file renamed to a message name became a
			   message (its bytes are in an m.N now); the crash
			   came before its backing file was removed. */
			dbox_info("%s/files/%s: left over from a plain file "
				  "turned into a message; removed", st->path,
				  d->d_name);
			unlinkat(st->files_fd, d->d_name, 0);
		}
		if (ret != -ENOENT) {
			ret = ret == 0 ? 0 : ret;
			continue;
		}
		ret = 0;
		if (S_ISREG(stbuf.st_mode) && stbuf.st_size == 0) {
			dbox_info("%s/files/%s: empty and of no plain file (a "
				  "create cut by a crash); removed", st->path,
				  d->d_name);
			unlinkat(st->files_fd, d->d_name, 0);
			continue;
		}
		dbox_warning("%s/files/%s: belongs to no plain file; kept "
			     "('dboxadm rebuild' puts it in lost+found/)",
			     st->path, d->d_name);
		if ((ret = dbox_index_begin(st->index)) == 0) {
			ret = dbox_index_reserve_ino(st->index, ino);
			if (ret == 0)
				ret = dbox_index_commit(st->index, true);
			else
				dbox_index_rollback(st->index);
		}
	}
	closedir(dir);
	return ret;
}

static int recover(struct dbox_store *st, unsigned int *writing_r)
{
	unsigned int writing, orphans;
	uint64_t *files;
	size_t nfiles;
	char name[32];
	int ret;

	/* Tails first: they need the WRITING rows recovery drops. */
	if ((ret = dbox_index_mfile_list(st->index, recover_mfile, st)) < 0)
		return ret;
	ret = dbox_index_recover(st->index, &writing, &orphans, &files, &nfiles);
	if (ret < 0)
		return ret;
	for (size_t i = 0; i < nfiles; i++) {
		snprintf(name, sizeof(name), "%llu", (unsigned long long)files[i]);
		unlinkat(st->files_fd, name, 0);
	}
	free(files);
	*writing_r = writing;
	if (writing > 0 || orphans > 0)
		dbox_info("%s: recovery: dropped %u unfinished deliveries and "
			  "%u unlinked files", st->path, writing, orphans);
	if ((ret = recover_files(st)) < 0)
		return ret;
	recover_unknown_mfiles(st, false);
	recover_unknown_mfiles(st, true);
	if (st->kept_records > 0)
		dbox_warning("%s: recovery: %lu whole records in storage/ are "
			     "unknown to the index and were kept, not cut; run "
			     "'dboxadm rebuild %s' (unmounted) to bring them "
			     "back into their folders", st->path,
			     st->kept_records, st->path);
	return 0;
}

static int adopt_walk_cb(void *ctx, uint64_t offset, uint64_t body_size,
			 const struct dbox_metadata *md, uint64_t record_size)
{
	return 0;
}

/* Put the last m.N back into the append pool if it has room, so every
   mount does not start a new file.  walk: check that its records are
   whole first (needed only when recovery dropped messages that were
   being written: one of them may have been rewritten in place). */
static void adopt_mfile(struct dbox_store *st, uint32_t file_id, bool walk)
{
	struct dbox_mfile *mf, **append;
	struct stat stbuf;
	uint64_t size, bad = 0;
	char name[16];
	int fd;

	if (dbox_index_mfile_get(st->index, file_id, &size) < 0 ||
	    size >= st->rotate_size)
		return;
	dbox_file_name(name, file_id);
	fd = openat(st->storage_fd, name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return;
	/* Recovery cut the file to its committed end; anything else means
	   someone else wrote to it: leave it alone. */
	if (fstat(fd, &stbuf) < 0 || (uint64_t)stbuf.st_size != size) {
		close(fd);
		return;
	}
	/* Every record up to that end must be whole.  A message written
	   again after its commit (WRITING when the process died) is dropped
	   by recovery, but its record is inside the committed end, possibly
	   damaged; new records after it would be out of reach of any walk
	   of the file (dump, rebuild, Dovecot). */
	if (walk && dbox_file_walk(fd, file_id, adopt_walk_cb, NULL, &bad) != 0) {
		dbox_info("%s/storage/%s: record at %llu unreadable; new "
			  "messages go to a new file", st->path, name,
			  (unsigned long long)bad);
		close(fd);
		return;
	}
	mf = calloc(1, sizeof(*mf));
	append = realloc(st->append, (st->append_count + 1) * sizeof(*append));
	if (mf == NULL || append == NULL) {
		if (append != NULL)
			st->append = append;
		free(mf);
		close(fd);
		return;
	}
	st->append = append;
	mf->file_id = file_id;
	mf->fd = fd;
	mf->size = size;
	st->append[st->append_count++] = mf;
}

/* Open ALT/storage/ for the store: ALT itself is an admin's path (like
   STORE: symbolic links on the way are followed); storage/ inside it is
   not followed.  Owned by the store's owner: a path recorded in an index
   its user may write must not make a process of another user (root) read
   or create m.N files where that user could not.  Returns the fd of
   storage/ or -errno (-EPERM: another owner, logged). */
static int open_alt_storage(struct dbox_store *st, const char *alt)
{
	struct stat store_sb, alt_sb;
	int ret, fd;

	fd = open(alt, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &alt_sb) < 0 || fstat(st->dir_fd, &store_sb) < 0) {
		ret = -errno;
	} else if (alt_sb.st_uid != store_sb.st_uid) {
		ret = -EPERM;
		dbox_error("%s: the alternate storage %s belongs to uid %u, the "
			   "store to uid %u; refused", st->path, alt,
			   (unsigned)alt_sb.st_uid, (unsigned)store_sb.st_uid);
	} else {
		ret = open_subdir(fd, DBOX_STORE_STORAGE, !st->readonly);
	}
	close(fd);
	return ret;
}

/* The alternate storage: set->alt_path, else the recorded one.  A new
   path given is recorded only once it opened and was accepted; a refused
   one changes nothing (the recorded one stays in use, and both are
   logged).  A missing or refused ALT is logged and leaves st->alt_fd at
   -1 (its messages fail with EIO); only an index error fails. */
static int open_alt(struct dbox_store *st, const struct dbox_store_settings *set)
{
	char *recorded = NULL;
	int ret, fd;

	ret = dbox_index_setting_get(st->index, DBOX_SETTING_ALT_PATH, &recorded);
	if (ret < 0 && ret != -ENOENT)
		return ret;
	if (set->alt_path != NULL && set->alt_path[0] != '/') {
		dbox_error("%s: the alternate storage path '%s' is not "
			   "absolute", st->path, set->alt_path);
		free(recorded);
		return -EINVAL;
	}
	if (set->alt_path != NULL &&
	    (recorded == NULL || strcmp(recorded, set->alt_path) != 0)) {
		fd = open_alt_storage(st, set->alt_path);
		if (fd < 0) {
			if (recorded != NULL)
				dbox_error("%s/storage: alternate storage not "
					   "available: %s; not recorded: the "
					   "store keeps %s (give alt=%s, or "
					   "none, to go on using it)",
					   set->alt_path, strerror(-fd),
					   recorded, recorded);
			else
				dbox_error("%s/storage: alternate storage not "
					   "available: %s; not recorded",
					   set->alt_path, strerror(-fd));
			/* fall through to the recorded one */
		} else {
			if (!st->readonly &&
			    (ret = dbox_index_setting_set(st->index,
					DBOX_SETTING_ALT_PATH,
					set->alt_path)) < 0) {
				close(fd);
				free(recorded);
				return ret;
			}
			if (recorded != NULL)
				dbox_warning("%s: alternate storage changed "
					     "from %s to %s (to go back: give "
					     "alt=%s again)", st->path,
					     recorded, set->alt_path, recorded);
			free(recorded);
			if ((st->alt_path = strdup(set->alt_path)) == NULL) {
				close(fd);
				return -ENOMEM;
			}
			st->alt_fd = fd;
			return 0;
		}
	}
	st->alt_path = recorded;
	if (recorded == NULL)
		return 0;
	if ((fd = open_alt_storage(st, recorded)) < 0) {
		st->alt_err = -fd;
		dbox_error("%s/storage: alternate storage not available: %s; "
			   "messages stored there fail with EIO", recorded,
			   strerror(st->alt_err));
	} else {
		st->alt_fd = fd;
	}
	return 0;
}

int dbox_store_open(const char *path, const struct dbox_store_settings *set,
		    struct dbox_store **st_r)
{
	struct dbox_store *st;
	char *index_path = NULL;
	uint32_t max_index;
	unsigned int writing = 0;
	int ret;

	st = calloc(1, sizeof(*st));
	if (st == NULL)
		return -ENOMEM;
	st->dir_fd = st->storage_fd = st->files_fd = st->lock_fd = -1;
	st->alt_fd = -1;
	st->readonly = set->readonly;
	pthread_mutex_init(&st->lock, NULL);
	st->rotate_size = set->rotate_size != 0 ? set->rotate_size :
		DBOX_DEFAULT_ROTATE_SIZE;
	st->compress = set->compress;
	dbox_fd_cache_init(&st->read_fds, 0);
	if ((ret = open_layout(st, path, set->create)) < 0)
		goto fail;
	/* Absolute, so the store survives a chdir (daemons chdir to /); and
	   the directory opened above, not one switched in meanwhile. */
	if ((st->path = realpath(path, NULL)) == NULL ||
	    asprintf(&index_path, "%s/" DBOX_STORE_INDEX, st->path) < 0) {
		index_path = NULL;
		ret = st->path == NULL ? -errno : -ENOMEM;
		goto fail;
	}
	if ((ret = same_dir(st->dir_fd, st->path)) < 0) {
		dbox_error("%s: the store directory changed while it was opened",
			   path);
		goto fail;
	}
	ret = st->readonly ? dbox_index_open_readonly(index_path, &st->index) :
		dbox_index_open(index_path, true, &st->index);
	if (ret == 0 && !st->readonly)
		dbox_index_cache_attrs(st->index); /* we hold the store lock */
	if (ret < 0) {
		if (!st->readonly && store_is_read_only(st->dir_fd))
			dbox_error("the store is read-only (%s): mount it with "
				   "-o ro", path);
		else if (ret == -EIO)
			dbox_error("%s: the index is unreadable; "
				   "'dboxadm rebuild %s' recreates it from "
				   "storage/", path, path);
		goto fail;
	}
	/* Without a reserve the store works as before: logged, not fatal.
	   A read-only store writes nothing, a reserve neither. */
	if (!st->readonly)
		(void)dbox_index_reserve_open(st->index);
	if ((ret = open_alt(st, set)) < 0 ||
	    (!st->readonly && (ret = recover(st, &writing)) < 0) ||
	    (ret = dbox_index_mfile_max(st->index, &max_index)) < 0)
		goto fail;
	/* Recovery judged them; stale marks must not outlive it (a failure
	   only leaves marks below the committed ends, which are ignored). */
	if (!st->readonly)
		(void)dbox_index_meta_delete_prefix(st->index, "inflight.");
	st->next_file_id = max_file_on_disk(st->storage_fd);
	if (st->alt_fd >= 0 && max_file_on_disk(st->alt_fd) > st->next_file_id)
		st->next_file_id = max_file_on_disk(st->alt_fd);
	if (max_index > st->next_file_id)
		st->next_file_id = max_index;
	st->next_file_id++;
	if (max_index != 0 && !st->readonly)
		adopt_mfile(st, max_index, writing > 0);
	st->index_path = index_path;
	*st_r = st;
	return 0;
fail:
	free(index_path);
	dbox_store_close(&st);
	return ret;
}

void dbox_store_close(struct dbox_store **stp)
{
	struct dbox_store *st = *stp;

	if (st == NULL)
		return;
	*stp = NULL;
	for (size_t i = 0; i < st->append_count; i++) {
		close(st->append[i]->fd);
		free(st->append[i]);
	}
	free(st->append);
	dbox_fd_cache_deinit(&st->read_fds);
	/* Nothing is in flight any more (recovery reads none of these). */
	if (st->index != NULL && !st->readonly)
		(void)dbox_index_meta_delete_prefix(st->index, "inflight.");
	dbox_index_close(&st->index);
	if (st->storage_fd >= 0)
		close(st->storage_fd);
	if (st->alt_fd >= 0)
		close(st->alt_fd);
	free(st->alt_path);
	if (st->files_fd >= 0)
		close(st->files_fd);
	if (st->dir_fd >= 0)
		close(st->dir_fd);
	if (st->lock_fd >= 0)
		close(st->lock_fd); /* releases the flock */
	pthread_mutex_destroy(&st->lock);
	free(st->index_path);
	free(st->path);
	free(st);
}

void dbox_store_index_suspend(struct dbox_store *st)
{
	dbox_index_close(&st->index);
}

int dbox_store_index_resume(struct dbox_store *st)
{
	int ret;

	if (st->readonly)
		return dbox_index_open_readonly(st->index_path, &st->index);
	ret = dbox_index_open(st->index_path, false, &st->index);
	if (ret == 0) {
		(void)dbox_index_reserve_open(st->index);
		dbox_index_cache_attrs(st->index); /* the store lock is ours */
	}
	return ret;
}

int dbox_store_read_fd(struct dbox_store *st, uint32_t file_id)
{
	char name[16];
	bool alt = false;
	/* The one place an m.N is opened for reading: wherever it lives
	   (the index says; one it does not know is in storage/). */
	int dir = dbox_store_mfile_dir(st, file_id, &alt), fd;

	if (dir == -ENOENT)
		dir = st->storage_fd;
	if (dir < 0)
		return -EIO; /* logged: the alternate storage is missing */
	fd = dbox_fd_cache_get(&st->read_fds, dir, file_id);
	if (fd >= 0)
		return fd;
	dbox_file_name(name, file_id);
	dbox_error("%s/storage/%s: %s", dbox_store_dir_name(st, alt), name,
		   strerror(-fd));
	return fd == -EMFILE || fd == -ENFILE ? fd : -EIO;
}

/* A file of the pool with room for another message, or a new m.N. */
static int mfile_acquire(struct dbox_store *st, struct dbox_mfile **mf_r)
{
	struct dbox_mfile *mf, **append;
	uint64_t size;
	int fd, ret;

	for (size_t i = 0; i < st->append_count; i++) {
		mf = st->append[i];
		if (!mf->busy && mf->size < st->rotate_size) {
			mf->busy = true;
			*mf_r = mf;
			return 0;
		}
	}
	fd = dbox_file_create(st->storage_fd, st->next_file_id, &size);
	if (fd < 0) {
		dbox_error("%s/storage/m.%u: create: %s", st->path,
			   st->next_file_id, strerror(-fd));
		return fd;
	}
	mf = calloc(1, sizeof(*mf));
	append = realloc(st->append, (st->append_count + 1) * sizeof(*append));
	if (mf == NULL || append == NULL) {
		free(mf);
		close(fd);
		return -ENOMEM;
	}
	st->append = append;
	mf->file_id = st->next_file_id++;
	mf->fd = fd;
	mf->size = size;
	mf->busy = true;
	if ((ret = dbox_index_mfile_set(st->index, mf->file_id, size)) < 0) {
		close(fd);
		free(mf);
		return ret;
	}
	st->append[st->append_count++] = mf;
	*mf_r = mf;
	return 0;
}

/* Give a file back to the pool; a full one leaves it (it is sealed). */
static void mfile_release(struct dbox_store *st, struct dbox_mfile *mf)
{
	mf->busy = false;
	if (mf->size < st->rotate_size)
		return;
	for (size_t i = 0; i < st->append_count; i++) {
		if (st->append[i] == mf) {
			st->append[i] = st->append[--st->append_count];
			break;
		}
	}
	close(mf->fd);
	free(mf);
}

static void save_loc(const struct dbox_save *save, enum dbox_msg_state state,
		     uint64_t vsize, struct dbox_msgloc *loc_r)
{
	memset(loc_r, 0, sizeof(*loc_r));
	loc_r->file_id = save->mf->file_id;
	loc_r->offset = save->ap.offset;
	loc_r->body_size = save->ap.body_size;
	loc_r->record_size = save->ap.record_size;
	loc_r->vsize = vsize;
	loc_r->state = state;
	memcpy(loc_r->guid, save->guid, sizeof(loc_r->guid));
}

static int save_begin(struct dbox_store *st, uint64_t ino, const char *mailbox,
		      bool indexed, struct dbox_save **save_r)
{
	struct dbox_save *save;
	struct dbox_msgloc loc;
	int ret;

	save = calloc(1, sizeof(*save));
	if (save == NULL || (save->mailbox = strdup(mailbox)) == NULL) {
		free(save);
		return -ENOMEM;
	}
	save->st = st;
	save->ino = ino;
	dbox_guid_generate(save->guid);
	if ((ret = mfile_acquire(st, &save->mf)) < 0)
		goto fail;
	if ((ret = dbox_append_begin(&save->ap, save->mf->fd,
				     save->mf->size)) < 0)
		goto fail;
	dbox_body_init(&save->body, &save->ap, &st->compress);
	save_loc(save, DBOX_MSG_WRITING, 0, &loc);
	if (indexed && (ret = dbox_index_msg_set(st->index, ino, &loc)) < 0)
		goto fail;
	*save_r = save;
	return 0;
fail:
	dbox_save_free(&save);
	return ret;
}

int dbox_save_begin(struct dbox_store *st, uint64_t ino, const char *mailbox,
		    struct dbox_save **save_r)
{
	return save_begin(st, ino, mailbox, true, save_r);
}

int dbox_save_begin_unindexed(struct dbox_store *st, uint64_t ino,
			      const char *mailbox, struct dbox_save **save_r)
{
	return save_begin(st, ino, mailbox, false, save_r);
}

int dbox_save_write(struct dbox_save *save, const void *buf, size_t len,
		    uint64_t off)
{
	/* Not finished from the first attempt on: a failed write may have
	   changed the record (dbox-body.h), so the next finish rewrites it. */
	int ret;

	save->finished = false;
	save->sealed = false;
	/* The disk space the index reserve gave back is the index's. */
	if ((ret = dbox_index_reserve_check(save->st->index)) < 0)
		return ret;
	return dbox_body_pwrite(&save->body, buf, len, off);
}

int dbox_save_truncate(struct dbox_save *save, uint64_t size)
{
	save->finished = false;
	save->sealed = false;
	return dbox_body_truncate(&save->body, size);
}

ssize_t dbox_save_read(struct dbox_save *save, void *buf, size_t len,
		       uint64_t off)
{
	return dbox_body_pread(&save->body, buf, len, off);
}

uint64_t dbox_save_size(const struct dbox_save *save)
{
	return dbox_body_size(&save->body);
}

/* Write the record's metadata and header for the body as it stands. */
static int save_write_record(struct dbox_save *save, time_t received_sec)
{
	struct dbox_store *st = save->st;
	struct dbox_metadata md;
	int ret;

	if (!save->sealed) {
		memset(&md, 0, sizeof(md));
		memcpy(md.guid, save->guid, sizeof(save->guid));
		md.received = received_sec;
		md.mailbox = save->mailbox;
		ret = dbox_body_finish(&save->body, &md);
		md.mailbox = NULL;
		if (ret < 0) {
			dbox_metadata_clear(&md);
			dbox_error("%s/storage/m.%u: finishing message at %llu: %s",
				   st->path, save->mf->file_id,
				   (unsigned long long)save->ap.offset,
				   strerror(-ret));
			return ret;
		}
		save->vsize = md.vsize;
		dbox_metadata_clear(&md);
		save->sealed = true;
		save->seals++;
	}
	return 0;
}

int dbox_save_seal(struct dbox_save *save, time_t received_sec)
{
	return save_write_record(save, received_sec);
}

int dbox_save_finish(struct dbox_save *save, time_t received_sec, bool sync,
		     struct dbox_msgloc *loc_r)
{
	struct dbox_store *st = save->st;
	int ret;

	if ((ret = save_write_record(save, received_sec)) < 0)
		return ret;
	if (sync && fdatasync(save->mf->fd) < 0) {
		ret = -errno;
		dbox_error("%s/storage/m.%u: fdatasync: %s", st->path,
			   save->mf->file_id, strerror(errno));
		return ret;
	}
	save_loc(save, DBOX_MSG_COMMITTED, save->vsize, loc_r);
	if ((ret = dbox_index_msg_set(st->index, save->ino, loc_r)) < 0 ||
	    (ret = dbox_index_mfile_set(st->index, save->mf->file_id,
					save->ap.offset + save->ap.record_size)) < 0)
		return ret;
	if (save->inflight) {
		dbox_store_clear_inflight(st, save->mf->file_id);
		save->inflight = false;
	}
	save->mf->size = save->ap.offset + save->ap.record_size;
	save->finished = true;
	return 0;
}

int dbox_save_reopen(struct dbox_save *save)
{
	return dbox_index_msg_set_state(save->st->index, save->ino,
					DBOX_MSG_WRITING);
}

void dbox_save_free(struct dbox_save **savep)
{
	struct dbox_save *save = *savep;

	if (save == NULL)
		return;
	*savep = NULL;
	if (save->mf != NULL) {
		if (!save->finished) {
			/* Never committed: give the bytes back. */
			dbox_append_abort(&save->ap);
			save->mf->size = save->ap.offset;
			if (save->inflight)
				dbox_store_clear_inflight(save->st,
							  save->mf->file_id);
		}
		mfile_release(save->st, save->mf);
	}
	dbox_body_free(&save->body);
	free(save->mailbox);
	free(save);
}

int dbox_store_open_reader(struct dbox_store *st, const struct dbox_msgloc *loc,
			   uint64_t plain_size, struct dbox_reader **reader_r)
{
	struct dbox_metadata md;
	uint64_t body_size, record_size;
	int fd = dbox_store_read_fd(st, loc->file_id), ret;

	if (fd < 0)
		return fd;
	/* The reader reads through a descriptor of its own, so a purge may
	   unlink the m.N and close the store's descriptor under it. */
	if ((fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) {
		int err = errno;

		dbox_error("%s/storage/m.%u: dup: %s", st->path, loc->file_id,
			   strerror(err));
		return err == EMFILE || err == ENFILE ? -err : -EIO;
	}
	/* The whole record, not just its header: a damaged metadata block
	   or a body size field that does not fit means the bytes at this
	   offset are not (all) the message the index knows; so does another
	   GUID (the index keeps its first 32 characters). */
	memset(&md, 0, sizeof(md));
	if ((ret = dbox_record_read(fd, loc->file_id, loc->offset,
				    loc->body_size, &body_size, &md,
				    &record_size)) < 0) {
		/* Corruption was logged, naming file and offset. */
		if (ret != -EIO)
			dbox_error("%s/storage/m.%u offset %llu: %s", st->path,
				   loc->file_id, (unsigned long long)loc->offset,
				   strerror(-ret));
		close(fd);
		return -EIO;
	}
	if (strncmp(md.guid, loc->guid, sizeof(loc->guid) - 1) != 0) {
		dbox_error("%s/storage/m.%u offset %llu: record has GUID '%s', "
			   "the index says '%s'; run 'dboxadm check'", st->path,
			   loc->file_id, (unsigned long long)loc->offset,
			   md.guid, loc->guid);
		dbox_metadata_clear(&md);
		close(fd);
		return -EIO;
	}
	dbox_metadata_clear(&md);
	if ((ret = dbox_reader_open(fd, loc->offset + DBOX_MSG_HEADER_SIZE,
				    loc->body_size, plain_size, reader_r)) < 0) {
		close(fd);
		return ret;
	}
	dbox_reader_own_fd(*reader_r);
	/* Log lines name the record as the other read errors do (a name
	   that cannot be allocated leaves the body offset). */
	(void)dbox_reader_set_name(*reader_r, "%s/storage/m.%u offset %llu",
				   st->path, loc->file_id,
				   (unsigned long long)loc->offset);
	return 0;
}

int dbox_store_set_received(struct dbox_store *st, const struct dbox_msgloc *loc,
			    time_t received)
{
	char name[16];
	int fd, ret = 0;

	dbox_file_name(name, loc->file_id);
	/* Read-write: the record is read to find its R line. */
	fd = dbox_store_mfile_open(st, loc->file_id, O_RDWR);
	if (fd < 0)
		return -EIO; /* logged */
	if ((ret = dbox_record_set_received(fd, loc->file_id, loc->offset,
					    received)) < 0) {
		if (ret != -ERANGE)
			dbox_warning("%s/storage/%s offset %llu: received date "
				     "not updated: %s", st->path, name,
				     (unsigned long long)loc->offset,
				     strerror(-ret));
	}
	if (fd >= 0)
		close(fd);
	return ret;
}

int dbox_store_note_inflight(struct dbox_store *st, const struct dbox_mfile *mf)
{
	char inflight_key[32], kept_key[32];

	dbox_store_tail_keys(mf->file_id, inflight_key, kept_key);
	return dbox_index_set_meta(st->index, inflight_key, (int64_t)mf->size);
}

void dbox_store_clear_inflight(struct dbox_store *st, uint32_t file_id)
{
	char inflight_key[32], kept_key[32];
	int64_t v;

	dbox_store_tail_keys(file_id, inflight_key, kept_key);
	if (dbox_index_meta_get(st->index, inflight_key, &v) == 0 && v != -1)
		(void)dbox_index_set_meta(st->index, inflight_key, -1);
}

int dbox_save_note_inflight(struct dbox_save *save)
{
	int ret = dbox_store_note_inflight(save->st, save->mf);

	if (ret == 0)
		save->inflight = true;
	return ret;
}

int dbox_store_mfile_acquire(struct dbox_store *st, struct dbox_mfile **mf_r)
{
	int ret = mfile_acquire(st, mf_r);

	/* Purge copies: recovery cuts them if the switch never happens. */
	if (ret == 0 && (ret = dbox_store_note_inflight(st, *mf_r)) < 0) {
		mfile_release(st, *mf_r);
		*mf_r = NULL;
	}
	return ret;
}

void dbox_store_mfile_release(struct dbox_store *st, struct dbox_mfile *mf)
{
	mfile_release(st, mf);
}

int dbox_store_mfile_seal(struct dbox_store *st, uint32_t file_id)
{
	for (size_t i = 0; i < st->append_count; i++) {
		struct dbox_mfile *mf = st->append[i];

		if (mf->file_id != file_id)
			continue;
		if (mf->busy)
			return -EBUSY;
		st->append[i] = st->append[--st->append_count];
		close(mf->fd);
		free(mf);
		return 0;
	}
	return 0;
}

void dbox_store_read_fd_forget(struct dbox_store *st, uint32_t file_id)
{
	dbox_fd_cache_forget(&st->read_fds, file_id);
}

int dbox_store_alt_create(struct dbox_store *st, struct dbox_mfile **mf_r)
{
	struct dbox_mfile *mf;
	uint64_t size;
	int fd, ret;

	if (st->alt_fd < 0) {
		dbox_error("%s: no alternate storage to move messages to (%s)",
			   st->path, st->alt_path == NULL ? "no ALT path set" :
			   strerror(st->alt_err));
		return -ENOENT;
	}
	fd = dbox_file_create(st->alt_fd, st->next_file_id, &size);
	if (fd < 0) {
		dbox_error("%s/storage/m.%u: create: %s", st->alt_path,
			   st->next_file_id, strerror(-fd));
		return fd;
	}
	if ((mf = calloc(1, sizeof(*mf))) == NULL) {
		close(fd);
		return -ENOMEM;
	}
	mf->file_id = st->next_file_id++;
	mf->fd = fd;
	mf->size = size;
	mf->busy = true;
	if ((ret = dbox_index_mfile_add_alt(st->index, mf->file_id, size)) < 0) {
		close(fd);
		free(mf);
		return ret;
	}
	*mf_r = mf;
	return 0;
}

/* --- m.N numbers for files made outside the append pool ----------------
   (engine/import-dovecot-files.c: adopted Dovecot m.N files) */

uint32_t dbox_store_file_id_take(struct dbox_store *st)
{
	return st->next_file_id++;
}
