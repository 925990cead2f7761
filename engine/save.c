/*
 * save.c: saving one message (struct dbox_save, store.h): its record is
 * appended to an m.N of the append pool (store-pool.c) that the save owns
 * until its last reference goes; begin, write, read back, seal, finish
 * (the index names the record), free.
 *
 * Invariants (save_check):
 *  - refs > 0 while anyone may use the save;
 *  - finished implies sealed: a finished record's metadata and header
 *    are on disk as the index names them; a write or truncate clears
 *    both;
 *  - a finished save is not in flight: the finish forgot the mark
 *    (inflight.m.N) in the same transaction;
 *  - the save owns its m.N (busy) from begin to its last free.
 */
#include "engine/store-private.h"
#include "engine/store-layout.h"

#include "index/reserve.h"
#include "index/wal-sync.h"
#include "storage/guid.h"
#include "storage/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct dbox_save {
	struct dbox_store *st;
	struct dbox_mfile *mf;
	struct dbox_append ap;
	struct dbox_body body; /* plaintext view of ap's body (compression) */
	uint64_t ino;
	char guid[33];
	char *mailbox;   /* B metadata, owned */
	uint64_t vsize;  /* V of the last finish */
	unsigned int refs; /* references (dbox_save_ref); under st->lock */
	bool finished;   /* the record on disk matches the index */
	bool sealed;     /* metadata and header written for the body as it
			    stands (finished implies sealed) */
	uint64_t seals;  /* times the record was written (dbox_save_seal
			    callers compare it to see a reseal meanwhile) */
	uint64_t synced_seal; /* the seal whose bytes are on disk (a finish
				 with sync, dbox_save_synced; 0: none) */
	uint64_t path_seal; /* the seal that wrote the message's path (L,
			       dbox_save_seal; 0: none) */
	bool indexed;    /* save_begin wrote this record's WRITING row */
	bool made_mfile; /* save_begin's pool take made mf */
	bool inflight;   /* inflight.m.N names this record (a copy) */
	bool owns_tail;  /* mf is busy for this save: nobody else appends
			    (until dbox_save_yield; purge may take the
			    m.N's tail after that, busy then for purge) */
	uint64_t inflight_seq; /* dbox_index_commit_seq of the commit that
				  marked it in flight (dbox_save_begin_copy;
				  0: none) */
	bool acked_empty; /* its empty version is acknowledged: the meta
			     key DBOX_META_ACKED_EMPTY<ino> is set until the
			     finish (dbox_save_ack_empty) */
};

/* The invariants above (assert(3): active unless NDEBUG). */
static void save_check(const struct dbox_save *save)
{
	assert(save->refs > 0);
	assert(!save->finished || save->sealed);
	assert(!(save->finished && save->inflight));
	assert(!(save->finished && save->acked_empty));
	/* Until finished it owns its m.N's tail; after, it may have given
	   the tail back (dbox_save_yield) and holds only the file. */
	assert(save->mf == NULL || save->finished || save->owns_tail);
	/* (mf's refs are not looked at here: other saves of the same m.N
	   change them under st->lock, and this runs unlocked too.) */
	assert(!save->owns_tail || save->mf->busy);
	(void)save;
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

	dbox_store_assert_locked(st);
	save = calloc(1, sizeof(*save));
	if (save == NULL || (save->mailbox = strdup(mailbox)) == NULL) {
		free(save);
		return -ENOMEM;
	}
	save->st = st;
	save->refs = 1;
	save->ino = ino;
	dbox_guid_generate(save->guid);
	if ((ret = dbox_store_pool_take(st, &save->mf)) < 0)
		goto fail;
	save->made_mfile = save->mf->fresh;
	save->mf->fresh = false;
	save->owns_tail = true;
	if ((ret = dbox_append_begin(&save->ap, save->mf->fd,
				     save->mf->size)) < 0)
		goto fail;
	dbox_body_init(&save->body, &save->ap, &st->compress);
	save_loc(save, DBOX_MSG_WRITING, 0, &loc);
	if (indexed && (ret = dbox_index_msg_set(st->index, ino, &loc)) < 0)
		goto fail;
	save->indexed = indexed;
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

	save_check(save);
	save->finished = false;
	save->sealed = false;
	/* The disk space the index reserve gave back is the index's. */
	if ((ret = dbox_index_reserve_check(save->st->index)) < 0)
		return ret;
	return dbox_body_pwrite(&save->body, buf, len, off);
}

int dbox_save_truncate(struct dbox_save *save, uint64_t size)
{
	save_check(save);
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

/* Write the record's metadata and header for the body as it stands,
   with L = msg_path and A = owner when msg_path is not NULL. */
static int save_write_record(struct dbox_save *save, time_t received_sec,
			     const char *msg_path,
			     const struct dbox_owner *owner)
{
	struct dbox_store *st = save->st;
	struct dbox_metadata md;
	int ret;

	if (!save->sealed) {
		memset(&md, 0, sizeof(md));
		memcpy(md.guid, save->guid, sizeof(save->guid));
		md.received = received_sec;
		md.mailbox = save->mailbox;
		md.msg_path = (char *)msg_path;
		if (msg_path != NULL && owner != NULL)
			md.owner = *owner;
		ret = dbox_body_finish(&save->body, &md);
		md.mailbox = NULL;
		md.msg_path = NULL;
		if (ret < 0) {
			dbox_metadata_clear(&md);
			dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u: finishing message at %llu: %s",
				   st->path, save->mf->file_id,
				   (unsigned long long)save->ap.offset,
				   strerror(-ret));
			return ret;
		}
		save->vsize = md.vsize;
		dbox_metadata_clear(&md);
		save->sealed = true;
		save->seals++;
		if (msg_path != NULL)
			save->path_seal = save->seals;
	}
	return 0;
}

int dbox_save_seal(struct dbox_save *save, time_t received_sec,
		   const char *msg_path, const struct dbox_owner *owner)
{
	save_check(save);
	return save_write_record(save, received_sec, msg_path, owner);
}

bool dbox_save_sealed_with_path(const struct dbox_save *save)
{
	return save->sealed && save->path_seal == save->seals;
}

uint64_t dbox_save_mark_seq(const struct dbox_save *save)
{
	dbox_store_assert_locked(save->st);
	return save->mf != NULL ? save->mf->mark_seq : 0;
}

void dbox_save_acked_empty_key(char key[48], uint64_t ino)
{
	snprintf(key, 48, DBOX_META_ACKED_EMPTY "%llu", (unsigned long long)ino);
}

int dbox_save_ack_empty(struct dbox_save *save, int64_t mtime_ns)
{
	char key[48];
	int ret;

	dbox_store_assert_locked(save->st);
	save_check(save);
	assert(!save->finished && dbox_body_size(&save->body) == 0);
	/* A body a failed write broke is no empty message: its error
	   again, as a finish would return it. */
	if ((ret = dbox_body_error(&save->body)) < 0)
		return ret;
	dbox_save_acked_empty_key(key, save->ino);
	if ((ret = dbox_index_meta_set(save->st->index, key, mtime_ns)) < 0)
		return ret;
	save->acked_empty = true;
	return 0;
}

bool dbox_save_acked_empty(const struct dbox_save *save)
{
	save_check(save);
	return save->acked_empty;
}

int dbox_save_finish(struct dbox_save *save, time_t received_sec, bool sync,
		     struct dbox_msgloc *loc_r)
{
	struct dbox_store *st = save->st;
	int ret;

	dbox_store_assert_locked(st);
	save_check(save);
	if ((ret = save_write_record(save, received_sec, NULL, NULL)) < 0 ||
	    (sync && (ret = dbox_save_sync(save)) < 0))
		return ret;
	save_loc(save, DBOX_MSG_COMMITTED, save->vsize, loc_r);
	/* Finished and given back (dbox_save_yield: its commit went
	   through): others may have appended past it since and a purge
	   may have moved it, so the index and the m.N's end are not this
	   save's to write any more. */
	if (save->finished && !save->owns_tail)
		return 0;
	/* The save's own WRITING row is updated in place; a copy or an
	   unindexed save sets the row whole (a probe would not find it). */
	if ((ret = save->indexed ?
	     dbox_index_msg_finish(st->index, save->ino, loc_r) :
	     dbox_index_msg_set(st->index, save->ino, loc_r)) < 0)
		return ret;
	if ((ret = dbox_index_mfile_set(st->index, save->mf->file_id,
					save->ap.offset + save->ap.record_size)) < 0)
		return ret;
	if (save->inflight) {
		dbox_store_clear_inflight(st, save->mf);
		save->inflight = false;
	}
	if (save->acked_empty) {
		char key[48];

		dbox_save_acked_empty_key(key, save->ino);
		if ((ret = dbox_index_meta_delete(st->index, key)) < 0)
			return ret;
		save->acked_empty = false;
	}
	save->mf->size = save->ap.offset + save->ap.record_size;
	if (sync)
		save->synced_seal = save->seals;
	else if (save->synced_seal != save->seals)
		dbox_store_note_unsynced(st, save->mf);
	save->finished = true;
	save_check(save);
	return 0;
}

void dbox_save_yield(struct dbox_save *save)
{
	dbox_store_assert_locked(save->st);
	save_check(save);
	assert(save->finished);
	if (save->owns_tail) {
		dbox_store_mfile_yield(save->st, save->mf);
		save->owns_tail = false;
	}
}

int dbox_save_reopen(struct dbox_save *save)
{
	dbox_store_assert_locked(save->st);
	return dbox_index_msg_set_state(save->st->index, save->ino,
					DBOX_MSG_WRITING);
}

void dbox_save_free(struct dbox_save **savep)
{
	struct dbox_save *save = *savep;

	if (save == NULL)
		return;
	*savep = NULL;
	dbox_store_assert_locked(save->st);
	save_check(save);
	if (--save->refs > 0)
		return;
	if (save->mf != NULL) {
		if (!save->finished) {
			/* Never committed: give the bytes back. */
			if (dbox_append_abort(&save->ap) < 0)
				save->mf->cut_failed = true;
			save->mf->size = save->ap.offset;
			if (save->inflight)
				dbox_store_clear_inflight(save->st, save->mf);
		}
		if (save->owns_tail)
			dbox_store_mfile_yield(save->st, save->mf);
		dbox_store_mfile_put(save->st, save->mf);
	}
	dbox_body_free(&save->body);
	free(save->mailbox);
	free(save);
}

int dbox_save_note_inflight(struct dbox_save *save)
{
	int ret;

	save_check(save);
	ret = dbox_store_note_inflight(save->st, save->mf);
	if (ret == 0)
		save->inflight = true;
	return ret;
}

void dbox_save_inflight_lost(struct dbox_save *save)
{
	dbox_store_assert_locked(save->st);
	save->inflight = false;
	save->inflight_seq = 0;
}

int dbox_save_begin_copy(struct dbox_store *st, uint64_t ino,
			 const char *mailbox, struct dbox_save **save_r)
{
	struct dbox_save *save = NULL;
	int ret;

	dbox_store_assert_locked(st);
	*save_r = NULL;
	/* A new m.N is entered in the index in this transaction, and the
	   copy's in-flight mark before its first byte. */
	if ((ret = dbox_index_begin(st->index)) < 0)
		return ret;
	ret = save_begin(st, ino, mailbox, false, &save);
	if (ret == 0)
		ret = dbox_save_note_inflight(save);
	if (ret < 0)
		dbox_index_rollback(st->index);
	else
		ret = dbox_index_commit(st->index, false);
	if (ret < 0) {
		if (save != NULL)
			dbox_save_inflight_lost(save); /* rolled back */
		dbox_save_free(&save);
		return ret;
	}
	save->inflight_seq = dbox_index_commit_seq(st->index);
	*save_r = save;
	return 0;
}

bool dbox_save_made_mfile(const struct dbox_save *save)
{
	return save->made_mfile;
}

bool dbox_save_finished(const struct dbox_save *save)
{
	save_check(save);
	return save->finished;
}

bool dbox_save_sealed(const struct dbox_save *save)
{
	save_check(save);
	return save->sealed;
}

void dbox_save_synced(struct dbox_save *save, uint64_t seals)
{
	dbox_store_assert_locked(save->st);
	if (seals == save->seals)
		save->synced_seal = seals;
}

uint64_t dbox_save_seals(const struct dbox_save *save)
{
	return save->seals;
}

void dbox_save_unseal(struct dbox_save *save)
{
	save_check(save);
	if (!save->finished)
		save->sealed = false;
}

uint64_t dbox_save_inflight_seq(const struct dbox_save *save)
{
	dbox_store_assert_locked(save->st);
	return save->inflight ? save->inflight_seq : 0;
}

int dbox_save_sync(struct dbox_save *save)
{
	/* Only mf: a writer may change the rest meanwhile. */
	const struct dbox_mfile *mf = save->mf;

	if (fdatasync(mf->fd) < 0) {
		int ret = -errno;

		dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u: fdatasync: %s", save->st->path,
			   mf->file_id, strerror(-ret));
		return ret;
	}
	return 0;
}

void dbox_save_ref(struct dbox_save *save)
{
	dbox_store_assert_locked(save->st);
	save_check(save);
	save->refs++;
}

void dbox_save_where(const struct dbox_save *save, struct dbox_msgloc *loc_r)
{
	save_check(save);
	save_loc(save, save->finished ? DBOX_MSG_COMMITTED : DBOX_MSG_WRITING,
		 save->vsize, loc_r);
}
