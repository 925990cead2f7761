/*
 * store-sync.c: the message bytes behind the index's timed sync
 * (index/checkpoint.h).  A message closed without fsync() has its index
 * row committed at once and its bytes in its m.N's page cache.  The
 * checkpointer syncs the WAL about a second after such a commit; before
 * that it calls store_presync, which syncs every m.N a finish wrote since
 * the last round, so a row reaches the disk after the bytes it names,
 * not before (a row without its bytes is a message that reads as EIO
 * after a power loss).
 *
 * Invariants (under st->lock): an m.N is in st->unsynced at most once,
 * exactly when its unsynced flag is set, and the list holds a reference
 * on it (refs), so its descriptor stays open until the round that syncs
 * it; each round takes the whole list.
 */
#include "engine/store-layout.h"
#include "engine/store-private.h"

#include "index/checkpoint.h"
#include "storage/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void dbox_store_note_unsynced(struct dbox_store *st, struct dbox_mfile *mf)
{
	struct dbox_mfile **list;

	dbox_store_assert_locked(st);
	if (mf->unsynced)
		return;
	if (st->unsynced_count == st->unsynced_size) {
		size_t size = st->unsynced_size ? 2 * st->unsynced_size : 8;

		list = realloc(st->unsynced, size * sizeof(*list));
		if (list == NULL) {
			/* Its bytes then reach the disk with the kernel's
			   writeback, as before the timed sync existed. */
			dbox_warning("%s/" DBOX_STORE_STORAGE "/m.%u: out of memory: "
				     "its new messages are not synced within "
				     "a second", st->path, mf->file_id);
			return;
		}
		st->unsynced = list;
		st->unsynced_size = size;
	}
	st->unsynced[st->unsynced_count++] = mf;
	mf->unsynced = true;
	mf->refs++;
}

/* Sync and let go of every m.N listed so far.  Takes st->lock only to
   take the list and to drop the references, not across the syncs. */
static void sync_listed(struct dbox_store *st)
{
	struct dbox_mfile **list;
	size_t count;

	dbox_store_mutex_lock(st);
	list = st->unsynced;
	count = st->unsynced_count;
	st->unsynced = NULL;
	st->unsynced_count = st->unsynced_size = 0;
	for (size_t i = 0; i < count; i++)
		list[i]->unsynced = false;
	dbox_store_mutex_unlock(st);
	if (count == 0)
		return;

	/* fd and file_id do not change while a reference is held. */
	for (size_t i = 0; i < count; i++) {
		if (fdatasync(list[i]->fd) < 0)
			dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u: fdatasync: %s",
				   st->path, list[i]->file_id,
				   strerror(errno));
	}

	dbox_store_mutex_lock(st);
	for (size_t i = 0; i < count; i++)
		dbox_store_mfile_put(st, list[i]);
	dbox_store_mutex_unlock(st);
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
	return dbox_index_checkpointer_start(st->index, store_presync, st);
}

void dbox_store_sync_unsynced(struct dbox_store *st)
{
	dbox_store_assert_unlocked(st);
	sync_listed(st);
}
