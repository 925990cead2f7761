/*
 * store-read.c: where an m.N of a store lives (STORE/storage/ or the
 * alternate storage, as the index says) and reading it: the store's
 * bounded cache of read descriptors, a checked reader of a committed
 * message, and patching a record's received date in place (store.h).
 * Everything here needs st->lock.
 */
#include "engine/store-private.h"
#include "engine/store-layout.h"

#include "storage/dbox-read.h"
#include "storage/io.h"
#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int dbox_store_mfile_dir(struct dbox_store *st, uint32_t file_id, bool *alt_r)
{
	uint64_t size;
	int ret;

	dbox_store_assert_locked(st);
	ret = dbox_index_mfile_where(st->index, file_id, &size, alt_r);

	if (ret == -ENOENT) {
		*alt_r = false;
		return -ENOENT;
	}
	if (ret < 0)
		return ret;
	if (!*alt_r)
		return st->storage_fd;
	if (dbox_store_alt_fd(st) >= 0)
		return st->alt_fd;
	/* Said once per try of the ALT (every DBOX_ALT_RETRY_SECONDS while
	   something reads it), not once per message. */
	if (st->alt_said == st->alt_tried + 1)
		return -EIO;
	st->alt_said = st->alt_tried + 1;
	if (st->alt_path == NULL)
		dbox_error("%s: m.%u is in the alternate storage, and the store "
			   "has no ALT path (dboxfs -o alt=PATH); its messages "
			   "fail with EIO", st->path, file_id);
	else
		dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u: the alternate storage %s/storage "
			   "is not available (%s); its messages fail with EIO "
			   "(said again at each try, every %d s, while it is "
			   "missing)", st->alt_path, file_id, st->alt_path,
			   strerror(st->alt_err), DBOX_ALT_RETRY_SECONDS);
	return -EIO;
}

int dbox_store_mfile_open(struct dbox_store *st, uint32_t file_id, int flags)
{
	char name[16];
	bool alt;
	int dir, fd;

	dbox_store_assert_locked(st);
	dir = dbox_store_mfile_dir(st, file_id, &alt);
	if (dir == -ENOENT)
		dir = st->storage_fd;
	if (dir < 0)
		return -EIO;
	dbox_file_name(name, file_id);
	fd = openat(dir, name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0 || (fd = dbox_fd_regular(fd, NULL)) < 0) {
		dbox_error("%s/" DBOX_STORE_STORAGE "/%s: %s", dbox_store_dir_name(st, alt),
			   name, fd == -EIO ? "not a regular file" :
			   strerror(errno));
		return -EIO;
	}
	return fd;
}

/* dbox_store_read_fd, and in *alt_r where the file lives. */
static int read_fd(struct dbox_store *st, uint32_t file_id, bool *alt_r)
{
	char name[16];
	int dir, fd;

	dbox_store_assert_locked(st);
	/* The one place an m.N is opened for reading: wherever it lives
	   (the index says; one it does not know is in storage/). */
	*alt_r = false;
	dir = dbox_store_mfile_dir(st, file_id, alt_r);
	if (dir == -ENOENT)
		dir = st->storage_fd;
	if (dir < 0)
		return -EIO; /* logged: the alternate storage is missing */
	fd = dbox_fd_cache_get(&st->read_fds, dir, file_id);
	if (fd >= 0)
		return fd;
	dbox_file_name(name, file_id);
	dbox_error("%s/" DBOX_STORE_STORAGE "/%s: %s", dbox_store_dir_name(st, *alt_r),
		   name, strerror(-fd));
	return fd == -EMFILE || fd == -ENFILE ? fd : -EIO;
}

int dbox_store_read_fd(struct dbox_store *st, uint32_t file_id)
{
	bool alt;

	return read_fd(st, file_id, &alt);
}

const char *dbox_store_mfile_root(struct dbox_store *st, uint32_t file_id)
{
	uint64_t size;
	bool alt = false;

	dbox_store_assert_locked(st);
	if (dbox_index_mfile_where(st->index, file_id, &size, &alt) < 0)
		alt = false;
	return dbox_store_dir_name(st, alt);
}

void dbox_store_read_fd_forget(struct dbox_store *st, uint32_t file_id)
{
	dbox_store_assert_locked(st);
	dbox_fd_cache_forget(&st->read_fds, file_id);
}

int dbox_store_open_reader(struct dbox_store *st, const struct dbox_msgloc *loc,
			   uint64_t plain_size, struct dbox_reader **reader_r)
{
	struct dbox_metadata md;
	uint64_t body_size, record_size;
	const char *root;
	bool alt;
	int fd, ret;

	dbox_store_assert_locked(st);
	if ((fd = read_fd(st, loc->file_id, &alt)) < 0)
		return fd;
	root = dbox_store_dir_name(st, alt);
	/* The reader reads through a descriptor of its own, so a purge may
	   unlink the m.N and close the store's descriptor under it. */
	if ((fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) {
		int err = errno;

		dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u: dup: %s", root, loc->file_id,
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
			dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u offset %llu: %s", root,
				   loc->file_id, (unsigned long long)loc->offset,
				   strerror(-ret));
		close(fd);
		return -EIO;
	}
	if (strncmp(md.guid, loc->guid, sizeof(loc->guid) - 1) != 0) {
		dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u offset %llu: record has GUID '%s', "
			   "the index says '%s'; run 'dboxadm check'", root,
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
	(void)dbox_reader_set_name(*reader_r, "%s/" DBOX_STORE_STORAGE "/m.%u offset %llu",
				   root, loc->file_id,
				   (unsigned long long)loc->offset);
	return 0;
}

int dbox_store_set_received(struct dbox_store *st, const struct dbox_msgloc *loc,
			    time_t received)
{
	char name[16];
	struct stat sb;
	int fd, ret = 0;

	dbox_store_assert_locked(st);
	dbox_file_name(name, loc->file_id);
	/* Read-write: the record is read to find its R line. */
	fd = dbox_store_mfile_open(st, loc->file_id, O_RDWR);
	if (fd < 0)
		return -EIO; /* logged */
	/* A file with other names is another store's too (a backup's
	   --link-dest, a Dovecot store adopted in place): not written. */
	if (fstat(fd, &sb) == 0 && sb.st_nlink > 1)
		ret = -ERANGE;
	else if ((ret = dbox_record_set_received(fd, loc->file_id, loc->offset,
						 received)) < 0) {
		if (ret != -ERANGE)
			dbox_warning("%s/" DBOX_STORE_STORAGE "/%s offset %llu: received date "
				     "not updated: %s", st->path, name,
				     (unsigned long long)loc->offset,
				     strerror(-ret));
	}
	if (fd >= 0)
		close(fd);
	return ret;
}
