/*
 * store-sync.c: the message bytes behind the index's timed sync
 * (index/checkpoint.h).  A message closed without fsync() has its index
 * row committed at once and its bytes in its m.N's page cache.  The
 * checkpointer syncs the WAL about a second after such a commit, by
 * store_sync_hook, which first syncs every m.N a finish wrote into since
 * the last round, so a row reaches the disk after the bytes it names,
 * not before (a row without its bytes is a message that reads as EIO
 * after a power loss).
 *
 * The list holds file numbers, not descriptors: with a small rotate size
 * a second of deliveries fills hundreds of m.N files, and a descriptor
 * held for each would run the daemon out of them.  A round opens each
 * again by name in storage/, where every finish writes (ALT takes only
 * purge's copies, which purge syncs itself); one purged meanwhile is
 * gone, and its copies were synced by the purge.  Numbers are never used
 * again, so the name cannot mean another file.
 *
 * A plain file renamed over another name is listed the same way (by inode
 * number, st->unsynced_files): the WAL sync that makes the rename durable
 * must find its bytes on disk, as ext4 flushes such a file before the
 * rename's commit (auto_da_alloc).  helper-69: Dovecot's dovecot.index,
 * written and renamed over the old one without fsync, came back empty.
 *
 * fsync() and fsyncdir() sync the WAL by a round too (namespace.c,
 * dbox_ns_sync_upto): their WAL sync carries the rows of
 * messages other writers closed a moment before, and those rows must not
 * reach the disk ahead of their bytes either.  In an fsync'ing workload
 * the list is empty (a finish by fsync syncs its own m.N and lists
 * nothing), and a round costs a lock.
 *
 * Invariants (under st->lock): st->unsynced lists each m.N at most once
 * per round: an m.N of the append pool is listed exactly when its
 * unsynced flag is set; one out of the pool takes no more records, so
 * its flag, once set, stays set.  Only the mount lists (st->timed_sync:
 * its checkpointer runs the rounds); dboxadm's saves sync themselves.
 */
#include "engine/namespace.h"
#include "engine/store-dirs.h"
#include "engine/store-layout.h"
#include "engine/store-private.h"

#include "index/checkpoint.h"
#include "index/wal-sync.h"
#include "storage/grow.h"
#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void dbox_store_note_unsynced(struct dbox_store *st, struct dbox_mfile *mf)
{
	uint32_t *list;

	dbox_store_assert_locked(st);
	if (!st->timed_sync || mf->unsynced)
		return;
	list = dbox_grow(st->unsynced, st->unsynced_count, &st->unsynced_size,
			 sizeof(*list));
	if (list == NULL) {
		/* Its bytes then reach the disk with the kernel's
		   writeback, as before the timed sync existed. */
		dbox_warning("%s/" DBOX_STORE_STORAGE "/m.%u: out of memory: its "
			     "new messages are not synced within a second",
			     st->path, mf->file_id);
		return;
	}
	st->unsynced = list;
	st->unsynced[st->unsynced_count++] = mf->file_id;
	mf->unsynced = true;
}

void dbox_store_note_unsynced_file(struct dbox_store *st, uint64_t ino)
{
	uint64_t *list;

	dbox_store_assert_locked(st);
	if (!st->timed_sync)
		return;
	list = dbox_grow(st->unsynced_files, st->unsynced_files_count,
			 &st->unsynced_files_size, sizeof(*list));
	if (list == NULL) {
		dbox_warning("%s/" DBOX_STORE_FILES "/%llu: out of memory: its "
			     "bytes are not synced before its rename",
			     st->path, (unsigned long long)ino);
		return;
	}
	st->unsynced_files = list;
	st->unsynced_files[st->unsynced_files_count++] = ino;
}

/* What a round syncs: the m.N files and plain files listed. */
struct sync_lists {
	uint32_t *ids;
	size_t count;
	uint64_t *files;
	size_t files_count;
};

/* fdatasync dir_name/name (dir_fd) by a descriptor of its own (any
   descriptor of a file syncs its data).  A file gone meanwhile is
   skipped: an m.N purged (its copies were synced by the purge), a plain
   file deleted.  Errors are logged. */
static void sync_name(struct dbox_store *st, int dir_fd, const char *dir_name,
		      const char *name)
{
	int fd = openat(dir_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
			O_CLOEXEC);

	if (fd < 0) {
		if (errno != ENOENT)
			dbox_error("%s/%s/%s: %s", st->path, dir_name, name,
				   strerror(errno));
		return;
	}
	if (fdatasync(fd) < 0)
		dbox_error("%s/%s/%s: fdatasync: %s", st->path, dir_name, name,
			   strerror(errno));
	close(fd);
}

/* fdatasync files/<ino> for each of inos[0..count). */
static void sync_files(struct dbox_store *st, const uint64_t *inos,
		       size_t count)
{
	for (size_t i = 0; i < count; i++) {
		char name[DBOX_FILES_NAME_SIZE];

		dbox_files_name(name, inos[i]);
		sync_name(st, st->files_fd, DBOX_STORE_FILES, name);
	}
}

/* fdatasync storage/m.<id> for each of ids[0..count). */
static void sync_ids(struct dbox_store *st, const uint32_t *ids, size_t count)
{
	for (size_t i = 0; i < count; i++) {
		char name[16];

		dbox_file_name(name, ids[i]);
		sync_name(st, st->storage_fd, DBOX_STORE_STORAGE, name);
	}
}

void dbox_store_doom_file(struct dbox_store *st, uint64_t ino)
{
	uint64_t *list;

	dbox_store_assert_locked(st);
	if (!st->timed_sync ||
	    (list = dbox_grow(st->doomed, st->doomed_count, &st->doomed_size,
			      sizeof(*list))) == NULL) {
		dbox_ns_file_unlink(st, ino);
		return;
	}
	st->doomed = list;
	st->doomed[st->doomed_count++] = ino;
}

/* Remove the backing files of ids[0..count), whose deletions a WAL sync
   has just made durable (without st->lock: freeing a big file's blocks
   takes a while), and hand them to the next deleting transaction, which
   drops their file_gone keys (namespace.c). */
static void unlink_doomed(struct dbox_store *st, uint64_t *ids, size_t count)
{
	uint64_t *list;

	for (size_t i = 0; i < count; i++)
		dbox_ns_file_unlink(st, ids[i]);
	dbox_store_mutex_lock(st);
	if (st->unlinked == NULL) {
		st->unlinked = ids;
		st->unlinked_count = st->unlinked_size = count;
		ids = NULL;
	} else {
		for (size_t i = 0; i < count; i++) {
			list = dbox_grow(st->unlinked, st->unlinked_count,
					 &st->unlinked_size, sizeof(*list));
			if (list == NULL)
				break; /* the key stays until the next open */
			st->unlinked = list;
			st->unlinked[st->unlinked_count++] = ids[i];
		}
	}
	dbox_store_mutex_unlock(st);
	free(ids);
}

/* Take st->unsynced and st->unsynced_files (under st->lock) into *l:
   the caller syncs them (sync_lists) and frees them (free_lists). */
static void take_lists(struct dbox_store *st, struct sync_lists *l)
{
	dbox_store_assert_locked(st);
	l->ids = st->unsynced;
	l->count = st->unsynced_count;
	st->unsynced = NULL;
	st->unsynced_count = st->unsynced_size = 0;
	for (size_t i = 0; i < st->append_count; i++)
		st->append[i]->unsynced = false;
	l->files = st->unsynced_files;
	l->files_count = st->unsynced_files_count;
	st->unsynced_files = NULL;
	st->unsynced_files_count = st->unsynced_files_size = 0;
}

static void sync_lists(struct dbox_store *st, const struct sync_lists *l)
{
	sync_ids(st, l->ids, l->count);
	sync_files(st, l->files, l->files_count);
}

static void free_lists(struct sync_lists *l)
{
	free(l->ids);
	free(l->files);
}

/* Sync every m.N listed so far, then (wal) the WAL with every row
   committed so far.  presync_mutex across the round: a caller that finds
   the list empty because another round took it waits for that round's
   syncs before it goes on.  The bulk is synced without st->lock; the
   m.N listed meanwhile and the WAL under it, so that no commit lands
   between the last m.N sync and the WAL's: a row that the WAL sync
   carries never names bytes that are not on disk (helper-63 saw one
   committed between a round and its WAL sync).  A caller holding
   st->lock (a durable commit: a purge's switch; dbox_ns_sync_upto's rare
   locked path) cannot wait for presync_mutex (lock order): it syncs
   what is listed and, again, what a round running meanwhile took
   (st->round_ids), then the WAL (helper-65: a purge's switch carried
   rows of messages closed into an m.N nobody had synced).  point: the WAL sync is left out when a sync that covered commit
   point ran meanwhile (0: never).  Returns 0, or the WAL sync's error
   (m.N errors are logged). */
static int sync_round(struct dbox_store *st, bool wal, uint64_t point)
{
	bool held = dbox_store_mutex_held(st);
	struct sync_lists l;
	int ret = 0;

	if (held) {
		/* What is listed, and what a round running meanwhile is
		   syncing (again: its syncs may not be done). */
		take_lists(st, &l);
		sync_lists(st, &l);
		free_lists(&l);
		sync_ids(st, st->round_ids, st->round_count);
		sync_files(st, st->round_files, st->round_files_count);
		return wal ? dbox_index_sync_written(st->index) : 0;
	}
	pthread_mutex_lock(&st->presync_mutex);
	dbox_store_mutex_lock(st);
	take_lists(st, &l);
	st->round_ids = l.ids;
	st->round_count = l.count;
	st->round_files = l.files;
	st->round_files_count = l.files_count;
	dbox_store_mutex_unlock(st);
	sync_lists(st, &l);
	dbox_store_mutex_lock(st);
	st->round_ids = NULL;
	st->round_count = 0;
	st->round_files = NULL;
	st->round_files_count = 0;
	dbox_store_mutex_unlock(st);
	free_lists(&l);
	if (wal && (point == 0 ||
		    !dbox_index_synced_upto(st->index, point))) {
		uint64_t *doomed = NULL;
		size_t ndoomed = 0;

		dbox_store_mutex_lock(st);
		take_lists(st, &l);
		sync_lists(st, &l);
		free_lists(&l);
		ret = dbox_index_sync_written(st->index);
		if (ret == 0) {
			/* Every deletion listed was committed before this
			   sync: durable now. */
			doomed = st->doomed;
			ndoomed = st->doomed_count;
			st->doomed = NULL;
			st->doomed_count = st->doomed_size = 0;
		}
		dbox_store_mutex_unlock(st);
		if (ndoomed > 0)
			unlink_doomed(st, doomed, ndoomed);
		else
			free(doomed);
	}
	pthread_mutex_unlock(&st->presync_mutex);
	return ret;
}

/* The index's sync hook (index/checkpoint.h): the checkpointer's timed
   sync (its thread, no lock held) and every durable commit (under
   st->lock: a purge's switch, its counters, a durable namespace change;
   helper-65). */
static int store_sync_hook(void *ctx)
{
	return sync_round(ctx, true, 0);
}

int dbox_store_checkpointer_start(struct dbox_store *st)
{
	int ret = dbox_index_checkpointer_start(st->index, store_sync_hook,
						 st);

	if (ret == 0) {
		dbox_store_mutex_lock(st);
		st->timed_sync = true;
		dbox_store_mutex_unlock(st);
	}
	return ret;
}

void dbox_store_sync_unsynced(struct dbox_store *st)
{
	(void)sync_round(st, false, 0);
}

void dbox_store_wal_throttle(struct dbox_store *st)
{
	dbox_store_assert_unlocked(st);
	dbox_index_wal_throttle(st->index);
}

int dbox_store_sync_wal(struct dbox_store *st, uint64_t point)
{
	return sync_round(st, true, point);
}
