/*
 * store-sync.c: the message bytes behind the index's timed sync
 * (index/checkpoint.h).  A message closed without fsync() has its index
 * row committed at once and its bytes in its m.N's page cache.  The
 * checkpointer syncs the WAL about a second after such a commit; before
 * that it calls store_presync, which syncs every m.N a finish wrote into
 * since the last round, so a row reaches the disk after the bytes it
 * names, not before (a row without its bytes is a message that reads as
 * EIO after a power loss).
 *
 * The list holds file numbers, not descriptors: with a small rotate size
 * a second of deliveries fills hundreds of m.N files, and a descriptor
 * held for each would run the daemon out of them.  A round opens each
 * again by name in storage/, where every finish writes (ALT takes only
 * purge's copies, which purge syncs itself); one purged meanwhile is
 * gone, and its copies were synced by the purge.  Numbers are never used
 * again, so the name cannot mean another file.
 *
 * fsync() and fsyncdir() run a round too before they sync the WAL
 * (namespace.c, dbox_ns_sync_upto): their WAL sync carries the rows of
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
#include "engine/store-layout.h"
#include "engine/store-private.h"

#include "index/checkpoint.h"
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

/* fdatasync storage/m.<id> for each of ids[0..count), by a descriptor of
   its own (any descriptor of a file syncs its data). */
static void sync_ids(struct dbox_store *st, const uint32_t *ids, size_t count)
{
	for (size_t i = 0; i < count; i++) {
		char name[16];
		int fd;

		dbox_file_name(name, ids[i]);
		fd = openat(st->storage_fd, name, O_RDONLY | O_NOFOLLOW |
			    O_NONBLOCK | O_CLOEXEC);
		if (fd < 0) {
			if (errno != ENOENT) /* ENOENT: purged, synced then */
				dbox_error("%s/" DBOX_STORE_STORAGE "/%s: %s", st->path,
					   name, strerror(errno));
			continue;
		}
		if (fdatasync(fd) < 0)
			dbox_error("%s/" DBOX_STORE_STORAGE "/%s: fdatasync: %s",
				   st->path, name, strerror(errno));
		close(fd);
	}
}

/* Sync every m.N listed so far.  Takes st->lock only to take the list,
   not across the syncs; presync_mutex across the round: a caller that
   finds the list empty because another round took it waits for that
   round's syncs before it goes on to sync the WAL.  A caller holding
   st->lock (dbox_ns_sync_upto's rare locked path) cannot wait for
   presync_mutex (lock order): it syncs what is listed under st->lock,
   or nothing when another round runs, whose files may then reach the
   disk after its WAL sync. */
static void sync_listed(struct dbox_store *st)
{
	bool held = dbox_store_mutex_held(st);
	uint32_t *list;
	size_t count;

	if (!held) {
		pthread_mutex_lock(&st->presync_mutex);
		dbox_store_mutex_lock(st);
	} else if (pthread_mutex_trylock(&st->presync_mutex) != 0) {
		return;
	}
	list = st->unsynced;
	count = st->unsynced_count;
	st->unsynced = NULL;
	st->unsynced_count = st->unsynced_size = 0;
	for (size_t i = 0; i < st->append_count; i++)
		st->append[i]->unsynced = false;
	if (!held)
		dbox_store_mutex_unlock(st);

	sync_ids(st, list, count);
	pthread_mutex_unlock(&st->presync_mutex);
	free(list);
}

/* The checkpointer's presync (index/checkpoint.h): its thread, no lock
   held. */
static void store_presync(void *ctx)
{
	sync_listed(ctx);
}

int dbox_store_checkpointer_start(struct dbox_store *st)
{
	int ret = dbox_index_checkpointer_start(st->index, store_presync, st);

	if (ret == 0) {
		dbox_store_mutex_lock(st);
		st->timed_sync = true;
		dbox_store_mutex_unlock(st);
	}
	return ret;
}

void dbox_store_sync_unsynced(struct dbox_store *st)
{
	sync_listed(st);
}
