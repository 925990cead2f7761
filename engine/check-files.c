/*
 * check-files.c: the plain-file side of dbox_check_store (check.h): every
 * plain file of the index has its regular file STORE/files/<ino>, every
 * file there belongs to one; and the copies crash recovery kept in
 * STORE/lost+found/.
 */
#include "engine/check-private.h"
#include "engine/namespace.h"
#include "engine/store-dirs.h"
#include "engine/store-layout.h"

#include "index/index-check.h"
#include "storage/dbox-file.h"
#include "storage/dbox-scan.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MISSING "is missing"

/* What is wrong with files/<name> of a plain file, or NULL. */
static const char *plain_file_fault(int files_fd, const char *name)
{
	struct stat sb;

	if (fstatat(files_fd, name, &sb, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? MISSING : strerror(errno);
	if (S_ISLNK(sb.st_mode))
		return "is a symbolic link (never followed)";
	if (!S_ISREG(sb.st_mode))
		return "is not a regular file";
	return NULL;
}

/* On a mounted store: is ino still a plain file, by an index opened now?
   The check reads the index in a snapshot, and the mount may have
   deleted that file since (a rename over it, as Dovecot renames
   dovecot-uidlist.lock): its backing file goes once the deleting commit
   is on disk, so a backing file missing now with its row gone now is no
   problem (helper-75: 4 of 10 checks said "files/N is missing").  A row
   still there means the file was missing while its row lived.  true
   also when the fresh look fails: the problem is reported then. */
static bool still_plain_file(const struct check *c, uint64_t ino)
{
	struct dbox_view *now = NULL;
	struct dbox_attr attr;
	bool still;
	int ret;

	if (dbox_view_open(c->view->path, &now) < 0)
		return true;
	ret = dbox_index_getattr(now->index, ino, &attr);
	still = ret < 0 ? ret != -ENOENT : attr.kind == DBOX_KIND_FILE;
	dbox_view_close(&now);
	return still;
}

static int file_ino_cb(void *ctx, uint64_t ino)
{
	struct check *c = ctx;
	char name[24], why[128], *path = NULL;
	const char *what;

	if (c->nfile_inos == c->file_inos_size) {
		size_t size = c->file_inos_size == 0 ? 64 :
			c->file_inos_size * 2;
		uint64_t *v = realloc(c->file_inos, size * sizeof(*v));

		if (v == NULL)
			return -ENOMEM;
		c->file_inos = v;
		c->file_inos_size = size;
	}
	c->file_inos[c->nfile_inos++] = ino;
	dbox_files_name(name, ino);
	/* No files/ (missing, a symbolic link: never followed) is a
	   problem of every plain file: each reads EIO on the mount
	   (helper-79 F3: check said 0 problems). */
	if (c->files_fd < 0) {
		snprintf(why, sizeof(why), "cannot be read: its directory %s",
			 c->files_err == -ENOENT ? "is missing" :
			 c->files_err == -ENOTDIR || c->files_err == -ELOOP ?
			 "is a symbolic link (never followed) or no directory" :
			 strerror(-c->files_err));
		what = why;
	} else if ((what = plain_file_fault(c->files_fd, name)) == NULL) {
		return 0;
	}
	if (!c->offline && strcmp(what, MISSING) == 0 &&
	    !still_plain_file(c, ino))
		return 0;
	dbox_index_check_path(c->index, ino, &path);
	check_problem(c, DBOX_CHECK_PLAIN_FILE, &(struct check_at){
			      .ino = ino },
		      "plain file %s (inode %llu): %s/%s %s", path != NULL ?
		      path : "?", (unsigned long long)ino, DBOX_STORE_FILES,
		      name, what);
	free(path);
	return 0;
}

static bool is_file_ino(const struct check *c, uint64_t ino)
{
	size_t lo = 0, hi = c->nfile_inos;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (c->file_inos[mid] == ino)
			return true;
		if (c->file_inos[mid] < ino)
			lo = mid + 1;
		else
			hi = mid;
	}
	return false;
}

/* files/<name>, which no plain file of the index owns (offline only: a
   mount may be creating one). */
static void stray_file(struct check *c, const char *name)
{
	unsigned long long ino;
	struct dbox_attr attr;
	struct stat sb;
	char *end;

	errno = 0;
	ino = strtoull(name, &end, 10);
	if (*end == '\0' && errno == 0 && name[0] != '0' && is_file_ino(c, ino))
		return;
	if (!c->offline)
		return;
	if (*end == '\0' && dbox_index_getattr(c->index, ino, &attr) == 0)
		check_note(c, DBOX_CHECK_PLAIN_FILE, &(struct check_at){
				   .ino = ino },
			   "%s/%s belongs to inode %s, which is no plain file "
			   "(a plain file turned into a message; the next mount "
			   "removes it)", DBOX_STORE_FILES, name, name);
	else if (*end == '\0' && dbox_ns_file_gone(c->index, ino))
		check_note(c, DBOX_CHECK_PLAIN_FILE, NULL, "%s/%s belongs to a "
			   "plain file deleted just before a crash (the next "
			   "mount removes it)", DBOX_STORE_FILES, name);
	else if (fstatat(c->files_fd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
		 S_ISREG(sb.st_mode) && sb.st_size == 0 && *end == '\0')
		check_note(c, DBOX_CHECK_PLAIN_FILE, NULL, "%s/%s is empty and "
			   "belongs to no plain file (a create cut by a crash; "
			   "the next mount removes it)", DBOX_STORE_FILES, name);
	else if (c->import_killed && *end == '\0' &&
		 fstatat(c->files_fd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
		 S_ISREG(sb.st_mode))
		check_note(c, DBOX_CHECK_PLAIN_FILE, NULL, "%s/%s belongs to no "
			   "plain file: the killed import's (the next mount or "
			   "import moves it to " DBOX_STORE_LOST_FOUND "/)",
			   DBOX_STORE_FILES, name);
	else
		check_problem(c, DBOX_CHECK_PLAIN_FILE, NULL, "%s/%s belongs to "
			      "no plain file of the index", DBOX_STORE_FILES,
			      name);
}

int check_plain_files(struct check *c)
{
	struct dirent *de;
	DIR *d;
	int ret;

	if ((ret = dbox_index_check_files(c->index, file_ino_cb, c)) != 0)
		return ret;
	if (c->files_fd < 0 || (d = fdopendir(dup(c->files_fd))) == NULL)
		return 0;
	rewinddir(d);
	while ((de = readdir(d)) != NULL)
		if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
			stray_file(c, de->d_name);
	closedir(d);
	return 0;
}

/* How many whole records the copy lost+found/<name> (crash recovery's
   m.N-OFFSET) holds from its start: 0 for none, for a name of another
   form or for anything but a regular file (never followed, never a
   FIFO's open that would wait). */
static long lost_found_whole(struct check *c, int dir_fd, const char *name,
			     bool *copies_r)
{
	char mfile[16];
	uint32_t id;
	uint64_t end;
	struct stat sb;
	const char *dash = strrchr(name, '-');
	long whole = 0;
	int fd;

	if (dash == NULL || (size_t)(dash - name) >= sizeof(mfile))
		return 0;
	memcpy(mfile, name, (size_t)(dash - name));
	mfile[dash - name] = '\0';
	if (!dbox_mfile_parse_name(mfile, &id))
		return 0;
	fd = openat(dir_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
		    O_CLOEXEC);
	if (fd < 0)
		return 0;
	if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode))
		whole = dbox_file_tail_records(fd, id, 0, UINT64_MAX, &end,
					       NULL, NULL);
	/* Copies of messages the index has, byte for byte (an older
	   recovery kept a killed purge's copies: helper-92). */
	*copies_r = whole > 0 &&
		dbox_store_tail_copies(c->index, c->view->storage_fd,
				       c->view->alt_fd, fd, id, 0, &whole);
	close(fd);
	return whole > 0 ? whole : 0;
}

void check_lost_found(struct check *c)
{
	int fd = dbox_store_open_in(c->view->path, DBOX_STORE_LOST_FOUND,
				    NULL, 0);
	struct dirent *de;
	DIR *d;

	if (fd < 0)
		return;
	if ((d = fdopendir(fd)) == NULL) {
		close(fd);
		return;
	}
	while ((de = readdir(d)) != NULL) {
		struct stat sb;
		bool copies = false;
		long whole;

		if (de->d_name[0] == '.' ||
		    fstatat(fd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		/* files-<ino>: a plain file a killed import had not
		   committed (store-recover.c), or one written since an index
		   was copied, if this one was put back: a client's data. */
		if (strncmp(de->d_name, "files-", 6) == 0) {
			check_note(c, DBOX_CHECK_LOST_FOUND, NULL, "%s/%s: %llu "
				   "bytes of a plain file (" DBOX_STORE_FILES
				   "/<ino>) the index does not know, kept by "
				   "crash recovery: a killed import's (it makes "
				   "it again), or written after the index was "
				   "copied, if it was put back; look at it before "
				   "you delete it", DBOX_STORE_LOST_FOUND,
				   de->d_name, (unsigned long long)sb.st_size);
			continue;
		}
		whole = lost_found_whole(c, fd, de->d_name, &copies);
		if (copies)
			check_note(c, DBOX_CHECK_LOST_FOUND, NULL, "%s/%s: %llu "
				   "bytes crash recovery cut off an m.N, kept as "
				   "a copy; its %ld whole message records are "
				   "all copies of messages the index has (a "
				   "purge a crash cut short): nothing in it is "
				   "needed", DBOX_STORE_LOST_FOUND, de->d_name,
				   (unsigned long long)sb.st_size, whole);
		else if (whole > 0)
			check_note(c, DBOX_CHECK_LOST_FOUND, NULL, "%s/%s: %llu bytes crash recovery "
				   "or rebuild cut off an m.N, kept as a copy; it holds %ld "
				   "whole message records: a save a crash cut "
				   "short, a killed import's (run again, it "
				   "imported them again), or mail delivered after "
				   "the index was copied ('dboxadm cat %s %s/%s/%s 0' shows the "
				   "first); delete it once you know it is not "
				   "needed", DBOX_STORE_LOST_FOUND, de->d_name,
				   (unsigned long long)sb.st_size, whole,
				   c->view->path, c->view->path,
				   DBOX_STORE_LOST_FOUND, de->d_name);
		else
			check_note(c, DBOX_CHECK_LOST_FOUND, NULL, "%s/%s: %llu bytes crash recovery "
				   "or rebuild cut off an m.N, kept as a copy; delete it "
				   "once check finds no problem",
				   DBOX_STORE_LOST_FOUND, de->d_name,
				   (unsigned long long)sb.st_size);
	}
	closedir(d);
}
