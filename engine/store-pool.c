/*
 * store-pool.c: the append pool, the m.N files of a store that take new
 * messages (see store.h): taking one with room or creating the next
 * m.N, giving it back, sealing one for purge, the last m.N rejoining the
 * pool at open, and new m.N files in the alternate storage.
 *
 * Invariants:
 *  - an m.N in st->append is owned by at most one writer (busy: a
 *    dbox_save, or a purge's copies), and only that writer appends to
 *    it, only past its committed end;
 *  - an m.N is appended to only after whole records: at open, the last
 *    m.N rejoins the pool only if its records run to its committed end;
 *  - an m.N with other names (hard links) is never appended to: it is
 *    another store's file too;
 *  - a full m.N (past the rotate size) leaves the pool when given back;
 *  - an m.N is closed and freed only when it is in no pool (pooled) and
 *    no save holds it (refs): a finished save that gave its tail back
 *    may still fsync it.
 */
#include "engine/store-private.h"
#include "engine/store-layout.h"

#include "storage/dbox-scan.h"
#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Close and free an m.N that is in no pool, once nobody holds it. */
static void mfile_discard(struct dbox_mfile *mf)
{
	assert(!mf->pooled);
	if (mf->refs > 0)
		return; /* the last holder's dbox_store_mfile_put */
	close(mf->fd);
	free(mf);
}

/* Enter mf into the append pool.  Returns 0 or -ENOMEM. */
static int pool_add(struct dbox_store *st, struct dbox_mfile *mf)
{
	struct dbox_mfile **append;

	append = realloc(st->append, (st->append_count + 1) * sizeof(*append));
	if (append == NULL)
		return -ENOMEM;
	st->append = append;
	st->append[st->append_count++] = mf;
	mf->pooled = true;
	return 0;
}

/* Take the pool's slot i out of the pool (the order is not kept). */
static void pool_remove(struct dbox_store *st, size_t i)
{
	st->append[i]->pooled = false;
	st->append[i] = st->append[--st->append_count];
}

/* Create m.<next id> in the directory dir_fd (root/storage/, for log
   lines): its header written, owned (busy) by the caller, in no pool and
   not in the index.  The id is used up even when the caller drops the
   file.  Returns 0 and *mf_r, or a negative errno (logged). */
static int mfile_create(struct dbox_store *st, int dir_fd, const char *root,
			struct dbox_mfile **mf_r)
{
	struct dbox_mfile *mf;
	uint64_t size;
	uint32_t id;
	int fd;

	/* Taken even when the create fails: a name someone put there
	   (EEXIST) is not tried again by every later save. */
	if ((fd = dbox_store_file_id_take(st, &id)) < 0)
		return fd;
	if ((fd = dbox_file_create(dir_fd, id, &size)) < 0) {
		dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u: create: %s", root, id,
			   strerror(-fd));
		return fd;
	}
	/* The header on disk before the index names the file: the next
	   WAL sync (a copy's mark, an fsyncdir) makes that row durable,
	   and a power loss must not leave an m.N emptier than its
	   committed end, which check reports for good (helper-74).  One
	   flush per new file. */
	if (fdatasync(fd) < 0) {
		int ret = -errno;
		char name[16];

		dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u: fdatasync: %s", root, id,
			   strerror(-ret));
		dbox_file_name(name, id);
		unlinkat(dir_fd, name, 0);
		close(fd);
		return ret;
	}
	if ((mf = calloc(1, sizeof(*mf))) == NULL) {
		close(fd);
		return -ENOMEM;
	}
	mf->file_id = id;
	mf->fd = fd;
	mf->size = size;
	mf->busy = true;
	mf->refs = 1;
	*mf_r = mf;
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
void dbox_store_pool_adopt(struct dbox_store *st, uint32_t file_id, bool walk)
{
	struct dbox_mfile *mf;
	struct stat stbuf;
	uint64_t size, bad = 0;
	char name[16];
	int fd;

	dbox_store_assert_locked(st);
	if (dbox_index_mfile_get(st->index, file_id, &size) < 0 ||
	    size >= st->rotate_size)
		return;
	dbox_file_name(name, file_id);
	fd = openat(st->storage_fd, name, O_RDWR | O_NOFOLLOW | O_NONBLOCK |
		    O_CLOEXEC);
	if (fd < 0)
		return;
	/* Recovery cut the file to its committed end; anything else means
	   someone else wrote to it: leave it alone.  So is a file with other
	   names (a backup's --link-dest, a Dovecot store adopted in place):
	   appending would write into the other store's file too. */
	if (fstat(fd, &stbuf) < 0 || (uint64_t)stbuf.st_size != size ||
	    stbuf.st_nlink != 1) {
		close(fd);
		return;
	}
	/* Every record up to that end must be whole.  A message written
	   again after its commit (WRITING when the process died) is dropped
	   by recovery, but its record is inside the committed end, possibly
	   damaged; new records after it would be out of reach of any walk
	   of the file (dump, rebuild, Dovecot). */
	if (walk && dbox_file_walk(fd, file_id, adopt_walk_cb, NULL, &bad) != 0) {
		dbox_info("%s/" DBOX_STORE_STORAGE "/%s: record at %llu unreadable; new "
			  "messages go to a new file", st->path, name,
			  (unsigned long long)bad);
		close(fd);
		return;
	}
	if ((mf = calloc(1, sizeof(*mf))) == NULL) {
		close(fd);
		return;
	}
	mf->file_id = file_id;
	mf->fd = fd;
	mf->size = size;
	if (pool_add(st, mf) < 0)
		mfile_discard(mf);
}

int dbox_store_pool_take(struct dbox_store *st, struct dbox_mfile **mf_r)
{
	struct dbox_mfile *mf;
	int ret;

	dbox_store_assert_locked(st);
	for (size_t i = 0; i < st->append_count; i++) {
		mf = st->append[i];
		if (!mf->busy && mf->size < st->rotate_size) {
			mf->busy = true;
			mf->refs++;
			*mf_r = mf;
			return 0;
		}
	}
	if ((ret = mfile_create(st, st->storage_fd, st->path, &mf)) < 0)
		return ret;
	if ((ret = dbox_index_mfile_set(st->index, mf->file_id, mf->size)) < 0 ||
	    (ret = pool_add(st, mf)) < 0) {
		mf->refs = 0;
		mfile_discard(mf);
		return ret;
	}
	mf->fresh = true;
	*mf_r = mf;
	return 0;
}

void dbox_store_mfile_yield(struct dbox_store *st, struct dbox_mfile *mf)
{
	dbox_store_assert_locked(st);
	assert(mf->busy && mf->refs > 0);
	mf->busy = false;
	if (mf->size < st->rotate_size && !mf->cut_failed)
		return;
	/* Full: it leaves the pool (it is sealed).  So does a file with
	   bytes past its end: a record begun there would not cut them
	   (dbox_append_finish cuts only past what the record wrote). */
	for (size_t i = 0; i < st->append_count; i++) {
		if (st->append[i] == mf) {
			pool_remove(st, i);
			break;
		}
	}
}

void dbox_store_mfile_put(struct dbox_store *st, struct dbox_mfile *mf)
{
	dbox_store_assert_locked(st);
	assert(mf->refs > 0);
	if (--mf->refs == 0 && !mf->pooled)
		mfile_discard(mf);
}

void dbox_store_mfile_release(struct dbox_store *st, struct dbox_mfile *mf)
{
	dbox_store_mfile_yield(st, mf);
	dbox_store_mfile_put(st, mf);
}

int dbox_store_mfile_acquire(struct dbox_store *st, struct dbox_mfile **mf_r)
{
	int ret = dbox_store_pool_take(st, mf_r);

	/* Purge copies: recovery cuts them if the switch never happens. */
	if (ret == 0 && (ret = dbox_store_note_inflight(st, *mf_r)) < 0) {
		dbox_store_mfile_release(st, *mf_r);
		*mf_r = NULL;
	}
	return ret;
}

int dbox_store_mfile_seal(struct dbox_store *st, uint32_t file_id)
{
	dbox_store_assert_locked(st);
	for (size_t i = 0; i < st->append_count; i++) {
		struct dbox_mfile *mf = st->append[i];

		if (mf->file_id != file_id)
			continue;
		if (mf->busy)
			return -EBUSY;
		pool_remove(st, i);
		mfile_discard(mf);
		return 0;
	}
	return 0;
}

/* dbox_store_rolled_back for one m.N. */
static void rolled_back_one(struct dbox_store *st, uint32_t file_id)
{
	struct dbox_mfile *mf = NULL;
	size_t slot = 0;
	char name[16];
	uint64_t end;
	int fd, ret;

	for (size_t i = 0; i < st->append_count; i++) {
		if (st->append[i]->file_id == file_id) {
			mf = st->append[i];
			slot = i;
		}
	}
	if (mf != NULL && mf->busy)
		return;
	dbox_file_name(name, file_id);
	ret = dbox_index_mfile_get(st->index, file_id, &end);
	if (ret == 0 && mf != NULL && end >= mf->size)
		return;
	fd = mf != NULL ? mf->fd :
		openat(st->storage_fd, name, O_RDWR | O_NOFOLLOW | O_NONBLOCK |
		       O_CLOEXEC);
	if (ret == 0 && fd >= 0 && ftruncate(fd, (off_t)end) == 0) {
		if (mf != NULL)
			mf->size = end;
		else
			close(fd);
		return;
	}
	if (ret == 0)
		dbox_error("%s/" DBOX_STORE_STORAGE "/%s: cutting the records of a "
			   "rolled-back transaction at %llu: %s", st->path, name,
			   (unsigned long long)end, strerror(errno));
	else if (ret == -ENOENT && unlinkat(st->storage_fd, name, 0) < 0)
		dbox_error("%s/" DBOX_STORE_STORAGE "/%s: removing the file of a "
			   "rolled-back transaction: %s", st->path, name,
			   strerror(errno));
	if (mf != NULL) {
		pool_remove(st, slot);
		mfile_discard(mf);
	} else if (fd >= 0) {
		close(fd);
	}
}

void dbox_store_rolled_back(struct dbox_store *st, const uint32_t *ids,
			    size_t n)
{
	dbox_store_assert_locked(st);
	for (size_t i = 0; i < n; i++)
		rolled_back_one(st, ids[i]);
}

int dbox_store_alt_create(struct dbox_store *st, struct dbox_mfile **mf_r)
{
	struct dbox_mfile *mf;
	int ret;

	dbox_store_assert_locked(st);
	if (dbox_store_alt_fd(st) < 0) {
		dbox_error("%s: no alternate storage to move messages to (%s)",
			   st->path, st->alt_path == NULL ? "no ALT path set" :
			   strerror(st->alt_err));
		return -ENOENT;
	}
	if ((ret = mfile_create(st, st->alt_fd, st->alt_path, &mf)) < 0)
		return ret;
	if ((ret = dbox_index_mfile_add_alt(st->index, mf->file_id,
					    mf->size)) < 0) {
		mf->refs = 0;
		mfile_discard(mf);
		return ret;
	}
	*mf_r = mf;
	return 0;
}

int dbox_store_file_id_take(struct dbox_store *st, uint32_t *id_r)
{
	dbox_store_assert_locked(st);
	if (st->next_file_id == 0) {
		dbox_error("%s/" DBOX_STORE_STORAGE "/: no m.N number is left (m.%u "
			   "is there; numbers are never used again)", st->path,
			   UINT32_MAX);
		return -ENOSPC;
	}
	*id_r = st->next_file_id;
	/* UINT32_MAX handed out: none is left (0 is no m.N number). */
	st->next_file_id = st->next_file_id == UINT32_MAX ? 0 :
			   st->next_file_id + 1;
	return 0;
}
