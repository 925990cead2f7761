/*
 * store-restore.c: crash recovery of mail a client fsync()ed (store-
 * private.h, dbox_store_restore_fsynced).
 *
 * An fsync of a new message syncs its m.N only: the record it seals
 * carries the message's path below the maildir root (metadata L,
 * dbox_save_seal), and its index row reaches the disk with the next WAL
 * sync (the timed one within a second, an fsyncdir, another fsync).  A
 * power loss before that leaves the record past its m.N's committed end
 * and the index without its row.  Recovery (store-recover.c) calls this
 * before it judges those bytes: each record up to the last one with a
 * path is put back - at its path when that directory still exists and
 * the name is free (or is the record's own unfinished delivery; a lost
 * name in tmp/ is made in new/, see place_at_path), else as 'dboxadm
 * rebuild' would, in its B folder's cur/ (restore.h) - and the committed
 * end moves past them.  Records without a path before it are
 * mail closed without fsync whose rows the same crash lost; they are put
 * back in their folder too, as the committed end cannot move over them
 * otherwise.
 *
 * Invariants: a record whose GUID a committed message of the index has
 * is a copy (a purge's, which keeps the GUID) or a message the index has
 * already, never put back; records at or after an in-flight mark of a
 * copy or purge are never looked at; everything is put back in one
 * transaction with the committed end, or nothing is.
 *
 * Not told apart: a copy-on-write copy (a message written again, which
 * gets a GUID of its own) whose in-flight mark the power loss took with
 * the rest; before the last record with a path it comes back as one
 * more message in its folder's cur/, as 'dboxadm rebuild' brings it
 * back.
 */
#include "engine/maildir.h"
#include "engine/restore.h"
#include "engine/store-layout.h"
#include "engine/store-private.h"

#include "storage/dbox-scan.h"
#include "storage/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* One whole record past the committed end. */
struct tail_rec {
	uint64_t offset, body_size, record_size, plain_size, vsize;
	time_t received;
	char guid[DBOX_GUID_HEX_LEN * 2 + 1];
	char *mailbox;  /* B, or NULL */
	char *path;     /* L, or NULL */
	bool copy;      /* a committed message of the index has its GUID */
};

struct tail {
	struct tail_rec *v;
	size_t n, size;
	int err;        /* what stopped the collection, or 0 */
};

static void tail_free(struct tail *t)
{
	for (size_t i = 0; i < t->n; i++) {
		free(t->v[i].mailbox);
		free(t->v[i].path);
	}
	free(t->v);
}

/* dbox_file_tail_records callback: keep the record. */
static int tail_cb(void *ctx, uint64_t offset, uint64_t body_size,
		   const struct dbox_metadata *md, uint64_t record_size)
{
	struct tail *t = ctx;
	struct tail_rec *r;

	if (t->err != 0)
		return 0;
	if (t->n == t->size) {
		size_t size = t->size == 0 ? 16 : t->size * 2;
		struct tail_rec *v = realloc(t->v, size * sizeof(*v));

		if (v == NULL) {
			t->err = -ENOMEM;
			return 0;
		}
		t->v = v;
		t->size = size;
	}
	r = &t->v[t->n];
	*r = (struct tail_rec){
		.offset = offset, .body_size = body_size,
		.record_size = record_size,
		.plain_size = md->has_plain_size ? md->plain_size : body_size,
		.vsize = md->has_vsize ? md->vsize : body_size,
		.received = md->received,
	};
	memcpy(r->guid, md->guid, sizeof(r->guid));
	if ((md->mailbox != NULL && (r->mailbox = strdup(md->mailbox)) == NULL) ||
	    (md->fsync_path != NULL &&
	     (r->path = strdup(md->fsync_path)) == NULL)) {
		free(r->mailbox);
		t->err = -ENOMEM;
		return 0;
	}
	t->n++;
	return 0;
}

static int guid_cmp(const void *a, const void *b)
{
	return strcmp((*(struct tail_rec *const *)a)->guid,
		      (*(struct tail_rec *const *)b)->guid);
}

struct guid_set {
	struct tail_rec **by_guid;
	size_t n;
};

/* dbox_index_msg_guids callback: a record with a message's GUID is a
   copy. */
static int guid_cb(void *ctx, const char *guid)
{
	struct guid_set *g = ctx;
	struct tail_rec key, *kp = &key, **hit;

	if (strlen(guid) >= sizeof(key.guid))
		return 0;
	strcpy(key.guid, guid);
	hit = bsearch(&kp, g->by_guid, g->n, sizeof(*g->by_guid), guid_cmp);
	if (hit != NULL) {
		/* Every record of that GUID (bsearch finds one of them). */
		size_t j = (size_t)(hit - g->by_guid);

		while (j > 0 && strcmp(g->by_guid[j - 1]->guid, guid) == 0)
			j--;
		for (; j < g->n && strcmp(g->by_guid[j]->guid, guid) == 0; j++)
			g->by_guid[j]->copy = true;
	}
	return 0;
}

/* Mark the copies among t->v[0, n) (one scan of the index). */
static int mark_copies(struct dbox_index *index, struct tail *t, size_t n)
{
	struct guid_set g = { .by_guid = malloc(n * sizeof(*g.by_guid)) };
	int ret;

	if (g.by_guid == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		if (t->v[i].guid[0] != '\0')
			g.by_guid[g.n++] = &t->v[i];
	qsort(g.by_guid, g.n, sizeof(*g.by_guid), guid_cmp);
	ret = g.n == 0 ? 0 : dbox_index_msg_guids(index, guid_cb, &g);
	free(g.by_guid);
	return ret;
}

/* Is comp (len bytes) a name a directory can hold? */
static bool good_name(const char *comp, size_t len)
{
	return len > 0 && len <= DBOX_NAME_MAX &&
		!(len == 1 && comp[0] == '.') &&
		!(len == 2 && comp[0] == '.' && comp[1] == '.');
}

/* Is the name dir/name r's own delivery, WRITING still in this index
   (its create reached the disk, the commit of its fsync did not; or the
   daemon died between the two)?  1 and *attr_r, 0 when the name is free,
   -EEXIST when it is something else's, or the index's errno. */
static int own_delivery(struct dbox_index *index, uint64_t dir,
			const char *name, const struct tail_rec *r,
			struct dbox_attr *attr_r)
{
	struct dbox_msgloc old;
	int ret = dbox_index_lookup(index, dir, name, strlen(name), attr_r);

	if (ret == -ENOENT)
		return 0;
	if (ret < 0)
		return ret;
	if (attr_r->kind != DBOX_KIND_MESSAGE ||
	    dbox_index_msg_get(index, attr_r->ino, &old) < 0 ||
	    old.state != DBOX_MSG_WRITING || strcmp(old.guid, r->guid) != 0)
		return -EEXIST;
	return 1;
}

/* Put r (at loc) back at its path.  The name of its own unfinished
   delivery is finished in place, as ext4 leaves a file whose writer died
   during its fsync.  A name the index lost with the rest of its commits
   (a power loss, an index older than storage/) is made again - in new/
   when it was in a folder's tmp/: a maildir delivery syncs its message
   in tmp/ to rename it into new/ next, and back in tmp/, where no reader
   looks and clients delete what is old, it would be lost all the same
   (README).  Returns 0, -ENOENT or -EINVAL when the path names no
   directory that exists or no valid name, -EEXIST when the name is
   another message's, or the index's errno. */
static int place_at_path(struct dbox_index *index, const struct tail_rec *r,
			 const struct dbox_msgloc *loc)
{
	struct dbox_attr attr, dirattr;
	uint64_t dir = DBOX_ROOT_INO, up = DBOX_ROOT_INO;
	const char *p = r->path, *slash, *last = NULL;
	size_t last_len = 0;
	unsigned int depth = 0;
	int ret;

	while ((slash = strchr(p, '/')) != NULL) {
		if (!good_name(p, (size_t)(slash - p)) ||
		    ++depth > DBOX_TREE_MAX_DEPTH)
			return -EINVAL;
		if ((ret = dbox_index_lookup(index, dir, p, (size_t)(slash - p),
					     &attr)) < 0)
			return ret;
		if (attr.kind != DBOX_KIND_DIR)
			return -ENOENT;
		up = dir;
		dir = attr.ino;
		last = p;
		last_len = (size_t)(slash - p);
		p = slash + 1;
	}
	/* Messages live in a folder's cur/, new/ or tmp/ only. */
	if (!good_name(p, strlen(p)) || !maildir_is_subdir(last, last_len))
		return -EINVAL;
	if ((ret = own_delivery(index, dir, p, r, &attr)) == 1) {
		attr.size = r->plain_size;
		attr.mtime_ns = dbox_time_make(r->received, 0);
		if ((ret = dbox_index_msg_set(index, attr.ino, loc)) < 0)
			return ret;
		return dbox_index_setattr(index, &attr);
	}
	if (ret < 0)
		return ret;
	if (last_len == 3 && memcmp(last, "tmp", 3) == 0) {
		if ((ret = dbox_index_lookup(index, up, "new", 3, &attr)) < 0)
			return ret;
		if (attr.kind != DBOX_KIND_DIR)
			return -ENOENT;
		dir = attr.ino;
	}
	if ((ret = dbox_index_getattr(index, dir, &dirattr)) < 0)
		return ret;
	return dbox_restore_message(index, dir, &dirattr, p, loc,
				    r->plain_size, r->received, NULL);
}

/* Put r (at loc) back in its B folder's cur/ under a new name. */
static int place_in_folder(struct dbox_index *index, uint32_t file_id,
			   const struct tail_rec *r,
			   const struct dbox_msgloc *loc)
{
	char name[DBOX_RESTORED_NAME_SIZE];
	struct dbox_attr dir;
	uint64_t cur;
	int ret;

	if ((ret = dbox_restore_find_cur(index, r->mailbox, &cur)) < 0 ||
	    (ret = dbox_index_getattr(index, cur, &dir)) < 0)
		return ret;
	for (unsigned int n = 0; ; n++) {
		dbox_restored_name(r->received, r->guid, file_id, r->offset, n,
				   name);
		ret = dbox_restore_message(index, cur, &dir, name, loc,
					   r->plain_size, r->received, NULL);
		if (ret != -EEXIST || n == 1000)
			return ret;
	}
}

/* Put t->v[0, n) back in st's index (a transaction is open): counts in
   at_path, in_folder and copies.  Returns 0 or a negative errno. */
static int place_all(struct dbox_store *st, uint32_t file_id,
		     const struct tail *t, size_t n, unsigned int *at_path,
		     unsigned int *in_folder, unsigned int *copies)
{
	for (size_t i = 0; i < n; i++) {
		const struct tail_rec *r = &t->v[i];
		struct dbox_msgloc loc = {
			.file_id = file_id, .offset = r->offset,
			.body_size = r->body_size,
			.record_size = r->record_size, .vsize = r->vsize,
			.state = DBOX_MSG_COMMITTED,
		};
		int ret = -ENOENT;

		if (r->copy) {
			(*copies)++;
			continue;
		}
		memcpy(loc.guid, r->guid, sizeof(loc.guid));
		if (r->path != NULL)
			ret = place_at_path(st->index, r, &loc);
		if (ret == 0) {
			(*at_path)++;
			continue;
		}
		if (ret != -ENOENT && ret != -EINVAL && ret != -EEXIST &&
		    ret != -ENOTDIR)
			return ret;
		if ((ret = place_in_folder(st->index, file_id, r, &loc)) < 0)
			return ret;
		(*in_folder)++;
	}
	return 0;
}

uint64_t dbox_store_restore_fsynced(struct dbox_store *st, int fd,
				    uint32_t file_id, bool alt,
				    uint64_t committed, uint64_t stop)
{
	struct tail t = { 0 };
	unsigned int at_path = 0, in_folder = 0, copies = 0;
	uint64_t end, new_end;
	size_t n = 0;
	int ret;

	dbox_store_assert_locked(st);
	(void)dbox_file_tail_records(fd, file_id, committed, stop, &end,
				     tail_cb, &t);
	for (size_t i = 0; i < t.n; i++)
		if (t.v[i].path != NULL)
			n = i + 1;
	if (n == 0 || t.err != 0) {
		if (t.err != 0)
			dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u: reading the "
				   "records past the committed end: %s",
				   dbox_store_dir_name(st, alt), file_id,
				   strerror(-t.err));
		tail_free(&t);
		return committed;
	}
	new_end = t.v[n - 1].offset + t.v[n - 1].record_size;
	if ((ret = mark_copies(st->index, &t, n)) < 0 ||
	    (ret = dbox_index_begin(st->index)) < 0)
		goto fail;
	if ((ret = place_all(st, file_id, &t, n, &at_path, &in_folder,
			     &copies)) < 0 ||
	    (ret = dbox_index_mfile_set(st->index, file_id, new_end)) < 0 ||
	    (ret = dbox_index_commit(st->index, true)) < 0) {
		dbox_index_rollback(st->index);
		goto fail;
	}
	dbox_warning("%s/" DBOX_STORE_STORAGE "/m.%u: %u messages synced by "
		     "fsync() whose index rows the crash lost put back at "
		     "their paths, %u in their folder's cur/ (%u copies of "
		     "messages the index has left out); committed end "
		     "%llu -> %llu", dbox_store_dir_name(st, alt), file_id,
		     at_path, in_folder, copies, (unsigned long long)committed,
		     (unsigned long long)new_end);
	tail_free(&t);
	return new_end;
fail:
	dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u: putting back the %zu records "
		   "past the committed end %llu: %s; they are kept for "
		   "'dboxadm rebuild'", dbox_store_dir_name(st, alt), file_id,
		   n, (unsigned long long)committed, strerror(-ret));
	tail_free(&t);
	return committed;
}
