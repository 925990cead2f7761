/*
 * purge-meta.c: purge and altmove bookkeeping in the index meta
 * (purge.h): what a purge or altmove records (totals, the outcome of a
 * requested run, altmove progress), and the other side, `dboxadm purge`
 * and `dboxadm altmove` on a mounted store: the request written, the
 * outcome read, through a view (view.h) that reads without the lock.
 */
#include "engine/purge.h"
#include "engine/view.h"
#include "engine/maildir.h"
#include "engine/store.h"

#include "index/index-purge.h"
#include "index/index-stats.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct meta_kv {
	const char *key;
	int64_t value;
};

struct meta_kvs {
	const struct meta_kv *v;
	size_t n;
};

#define KVS(array) (&(struct meta_kvs){ array, sizeof(array) / sizeof(array[0]) })

/* Run fn(index, ctx) in one write transaction of index: committed when it
   returns 0 (durable: on disk), else rolled back.  Returns what fn
   returned, or the negative errno of begin/commit. */
static int in_txn(struct dbox_index *index, int (*fn)(struct dbox_index *,
						      const void *),
		  const void *ctx, bool durable)
{
	int ret = dbox_index_begin(index);

	if (ret < 0)
		return ret;
	if ((ret = fn(index, ctx)) == 0)
		return dbox_index_commit(index, durable);
	dbox_index_rollback(index);
	return ret;
}

/* The same under st->lock. */
static int store_txn(struct dbox_store *st, int (*fn)(struct dbox_index *,
						      const void *),
		     const void *ctx, bool durable)
{
	int ret;

	dbox_store_mutex_lock(st);
	ret = in_txn(st->index, fn, ctx, durable);
	dbox_store_mutex_unlock(st);
	return ret;
}

/* A meta value, 0 when it is not there or unreadable. */
static int64_t meta(struct dbox_index *index, const char *key)
{
	int64_t value = 0;

	return dbox_index_meta_get(index, key, &value) == 0 ? value : 0;
}

static int set_kvs(struct dbox_index *index, const void *ctx)
{
	const struct meta_kvs *kvs = ctx;
	int ret = 0;

	for (size_t i = 0; i < kvs->n && ret == 0; i++)
		ret = dbox_index_meta_set(index, kvs->v[i].key, kvs->v[i].value);
	return ret;
}

int dbox_altmove_progress(struct dbox_store *st, int64_t request_ns,
			  const struct dbox_purge_result *res)
{
	const struct meta_kv kv[] = {
		{ DBOX_META_ALTMOVE_PROGRESS_RECORDS, (int64_t)res->records_moved },
		{ DBOX_META_ALTMOVE_PROGRESS_BYTES, (int64_t)res->bytes_moved },
		{ DBOX_META_ALTMOVE_PROGRESS_REQUEST, request_ns },
	};

	return store_txn(st, set_kvs, KVS(kv), false);
}

int dbox_altmove_record(struct dbox_store *st, int64_t request_ns,
			const struct dbox_purge_result *res,
			const struct dbox_purge_result *purged)
{
	const struct meta_kv kv[] = {
		{ DBOX_META_ALTMOVE_ERROR, res->error },
		{ DBOX_META_ALTMOVE_RECORDS, (int64_t)res->records_moved },
		{ DBOX_META_ALTMOVE_BYTES, (int64_t)res->bytes_moved },
		{ DBOX_META_ALTMOVE_FILES,
		  (int64_t)(res->files_purged + res->garbage_files) },
		{ DBOX_META_ALTMOVE_FREED, (int64_t)res->bytes_freed },
		{ DBOX_META_ALTMOVE_PURGED_FILES,
		  (int64_t)(purged->files_purged + purged->garbage_files) },
		{ DBOX_META_ALTMOVE_PURGED_FREED, (int64_t)purged->bytes_freed },
		{ DBOX_META_ALTMOVE_PURGED_COPIED,
		  (int64_t)purged->bytes_moved },
		{ DBOX_META_ALTMOVE_DONE, request_ns },
	};

	return store_txn(st, set_kvs, KVS(kv), true);
}

static int meta_add(struct dbox_index *index, const char *key, int64_t add)
{
	int64_t value = 0;
	int ret = dbox_index_meta_get(index, key, &value);

	if (ret < 0 && ret != -ENOENT)
		return ret;
	return dbox_index_meta_set(index, key, value + add);
}

/* The outcome of a requested run, for `dboxadm purge` waiting on a
   mount; the start last, though the transaction makes the order moot. */
static int record_request(struct dbox_index *index,
			  const struct dbox_purge_result *res)
{
	const struct meta_kv kv[] = {
		{ DBOX_META_PURGE_REQUEST_ERROR, res->error },
		{ DBOX_META_PURGE_REQUEST_FREED, (int64_t)res->bytes_freed },
		{ DBOX_META_PURGE_REQUEST_MOVED, (int64_t)res->bytes_moved },
		{ DBOX_META_PURGE_REQUEST_FILES,
		  (int64_t)(res->files_purged + res->garbage_files) },
		{ DBOX_META_PURGE_REQUEST_RECORDS, (int64_t)res->records_moved },
		{ DBOX_META_PURGE_REQUEST_FAILED, (int64_t)res->files_failed },
		{ DBOX_META_PURGE_REQUEST_BUSY, (int64_t)res->files_busy },
		{ DBOX_META_PURGE_REQUEST_START, res->start_ns },
	};

	return set_kvs(index, KVS(kv));
}

/* The moved totals, kept only when they cover every run: started by the
   first run, or by one finding them there already (an index purged by an
   older dboxfs has runs without them and so never gets them). */
static int record_moved(struct dbox_index *index,
			const struct dbox_purge_result *res)
{
	int64_t runs = 0, moved;
	int ret = dbox_index_meta_get(index, DBOX_META_PURGE_MOVED, &moved);

	if (ret == -ENOENT) {
		ret = dbox_index_meta_get(index, DBOX_META_PURGE_RUNS, &runs);
		if (ret < 0 && ret != -ENOENT)
			return ret;
		if (runs > 0)
			return 0;
	} else if (ret < 0) {
		return ret;
	}
	if ((ret = meta_add(index, DBOX_META_PURGE_MOVED,
			    (int64_t)res->bytes_moved)) < 0)
		return ret;
	return meta_add(index, DBOX_META_PURGE_RECORDS,
			(int64_t)res->records_moved);
}

struct purge_record {
	const struct dbox_purge_result *res;
	bool requested;
};

static int record_run(struct dbox_index *index, const void *ctx)
{
	const struct purge_record *r = ctx;
	const struct dbox_purge_result *res = r->res;
	int ret;

	if ((ret = record_moved(index, res)) == 0 &&
	    (ret = meta_add(index, DBOX_META_PURGE_RUNS, 1)) == 0 &&
	    (ret = meta_add(index, DBOX_META_PURGE_FREED,
			    (int64_t)res->bytes_freed)) == 0 &&
	    (ret = meta_add(index, DBOX_META_PURGE_FILES,
			    (int64_t)(res->files_purged +
				      res->garbage_files))) == 0 &&
	    (ret = dbox_index_meta_set(index, DBOX_META_PURGE_END,
				       res->end_ns)) == 0 && r->requested)
		ret = record_request(index, res);
	return ret;
}

int dbox_purge_record(struct dbox_store *st,
		      const struct dbox_purge_result *res, bool requested)
{
	struct purge_record r = { res, requested };

	return store_txn(st, record_run, &r, true);
}

/* --- dboxadm's side: requests to a mount -------------------------------- */

int dbox_purge_request_done(struct dbox_view *view, int64_t since_ns,
			    struct dbox_purge_result *res_r)
{
	struct dbox_index *index = view->index;
	int ret = dbox_index_snapshot_begin(index);

	memset(res_r, 0, sizeof(*res_r));
	if (ret < 0)
		return ret;
	if (meta(index, DBOX_META_PURGE_REQUEST_START) < since_ns) {
		dbox_index_snapshot_end(index);
		return 0;
	}
	res_r->error = (int)meta(index, DBOX_META_PURGE_REQUEST_ERROR);
	res_r->bytes_freed = (uint64_t)meta(index, DBOX_META_PURGE_REQUEST_FREED);
	res_r->bytes_moved = (uint64_t)meta(index, DBOX_META_PURGE_REQUEST_MOVED);
	res_r->files_purged = (uint64_t)meta(index, DBOX_META_PURGE_REQUEST_FILES);
	res_r->records_moved =
		(uint64_t)meta(index, DBOX_META_PURGE_REQUEST_RECORDS);
	res_r->files_failed =
		(uint64_t)meta(index, DBOX_META_PURGE_REQUEST_FAILED);
	res_r->files_busy = (uint64_t)meta(index, DBOX_META_PURGE_REQUEST_BUSY);
	dbox_index_snapshot_end(index);
	return 1;
}

/* The request kvs into the one slot, unless another dboxadm's request
   there has not run yet (-EBUSY): overwritten, it was never run, and
   both dboxadm took the one outcome for theirs (helper-77). */
static int set_request(struct dbox_index *index, const void *ctx)
{
	if (meta(index, DBOX_META_ALTMOVE_REQUEST) >
	    meta(index, DBOX_META_ALTMOVE_DONE))
		return -EBUSY;
	return set_kvs(index, ctx);
}

int dbox_altmove_request(struct dbox_view *view, int64_t before_ns,
			 uint64_t folder, int64_t *request_ns_r)
{
	int64_t now = dbox_now_ns();
	const struct meta_kv kv[] = {
		{ DBOX_META_ALTMOVE_BEFORE, before_ns },
		{ DBOX_META_ALTMOVE_FOLDER, (int64_t)folder },
		{ DBOX_META_ALTMOVE_REQUEST, now },
	};
	int dir_fd = open(view->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int ret;

	*request_ns_r = now;
	/* The mount defers no commit while this waits for the write lock
	   (engine/store-commit.c; helper-86). */
	if (dir_fd >= 0)
		dbox_store_writer_waits(dir_fd);
	ret = in_txn(view->index, set_request, KVS(kv), true);
	if (dir_fd >= 0) {
		dbox_store_writer_done(dir_fd);
		close(dir_fd);
	}
	return ret;
}

int dbox_altmove_pending(struct dbox_store *st, int64_t *request_ns_r,
			 int64_t *before_ns_r, uint64_t *folder_r)
{
	int64_t request = 0;
	int ret;

	dbox_store_assert_locked(st);
	*request_ns_r = *before_ns_r = 0;
	*folder_r = 0;
	ret = dbox_index_meta_get(st->index, DBOX_META_ALTMOVE_REQUEST,
				  &request);
	if (ret < 0)
		return ret == -ENOENT ? 0 : ret;
	if (request <= meta(st->index, DBOX_META_ALTMOVE_DONE))
		return 0;
	*request_ns_r = request;
	*before_ns_r = meta(st->index, DBOX_META_ALTMOVE_BEFORE);
	*folder_r = (uint64_t)meta(st->index, DBOX_META_ALTMOVE_FOLDER);
	return 1;
}

int dbox_altmove_request_poll(struct dbox_view *view, int64_t request_ns,
			      struct dbox_purge_result *res_r,
			      struct dbox_purge_result *purged_r)
{
	struct dbox_index *index = view->index;
	int ret = dbox_index_snapshot_begin(index);
	bool done;

	memset(res_r, 0, sizeof(*res_r));
	memset(purged_r, 0, sizeof(*purged_r));
	if (ret < 0)
		return ret;
	done = meta(index, DBOX_META_ALTMOVE_DONE) >= request_ns;
	if (done) {
		res_r->error = (int)meta(index, DBOX_META_ALTMOVE_ERROR);
		res_r->records_moved =
			(uint64_t)meta(index, DBOX_META_ALTMOVE_RECORDS);
		res_r->bytes_moved = (uint64_t)meta(index, DBOX_META_ALTMOVE_BYTES);
		res_r->files_purged = (uint64_t)meta(index, DBOX_META_ALTMOVE_FILES);
		res_r->bytes_freed = (uint64_t)meta(index, DBOX_META_ALTMOVE_FREED);
		purged_r->files_purged = (uint64_t)meta(index,
			DBOX_META_ALTMOVE_PURGED_FILES);
		purged_r->bytes_freed = (uint64_t)meta(index,
			DBOX_META_ALTMOVE_PURGED_FREED);
		purged_r->bytes_moved = (uint64_t)meta(index,
			DBOX_META_ALTMOVE_PURGED_COPIED);
	} else if (meta(index, DBOX_META_ALTMOVE_PROGRESS_REQUEST) == request_ns) {
		res_r->records_moved = (uint64_t)meta(index,
			DBOX_META_ALTMOVE_PROGRESS_RECORDS);
		res_r->bytes_moved = (uint64_t)meta(index,
			DBOX_META_ALTMOVE_PROGRESS_BYTES);
	}
	dbox_index_snapshot_end(index);
	return done;
}

/* The directory at path (components '/'-separated, from the root) into
   *ino_r.  Returns 0 or -ENOENT (also when one is no directory). */
static int dir_at(struct dbox_index *index, const char *path, uint64_t *ino_r)
{
	uint64_t ino = DBOX_ROOT_INO;
	const char *p = path;

	while (*p != '\0') {
		size_t len = strcspn(p, "/");
		struct dbox_attr attr;

		if (len > 0) {
			if (dbox_index_lookup(index, ino, p, len, &attr) < 0 ||
			    attr.kind != DBOX_KIND_DIR)
				return -ENOENT;
			ino = attr.ino;
		}
		p += len;
		if (*p == '/')
			p++;
	}
	*ino_r = ino;
	return 0;
}

int dbox_altmove_folder(struct dbox_index *index, const char *folder,
			uint64_t *ino_r)
{
	char *dir = NULL;
	int ret;

	*ino_r = DBOX_ROOT_INO;
	if (strcmp(folder, "INBOX") == 0)
		return 0;
	if (dir_at(index, folder, ino_r) == 0)
		return 0;
	/* A mailbox name as stats shows it ("Lists/Käse"): first the
	   Maildir++ directory named as it is (".Lists.Käse", a folder a
	   client made with a UTF-8 name, which stats shows so), then the
	   one in modified UTF-7 (".Lists.K&AOQ-se"), as stats does when
	   both exist (engine/stats.c, decode_folders). */
	if (strchr(folder, '.') == NULL && folder[0] != '\0' &&
	    asprintf(&dir, ".%s", folder) > 0) {
		for (char *p = dir; *p != '\0'; p++)
			if (*p == '/')
				*p = '.';
		ret = dir_at(index, dir, ino_r);
		free(dir);
		dir = NULL;
		if (ret == 0)
			return 0;
	}
	if (maildir_folder_of_mailbox(folder, &dir) < 0 || dir[0] == '\0') {
		free(dir);
		return -ENOENT;
	}
	ret = dir_at(index, dir, ino_r);
	free(dir);
	return ret;
}
