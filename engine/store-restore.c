/*
 * store-restore.c: crash recovery of mail whose index row a power loss
 * took (store-private.h, dbox_store_restore_sealed).
 *
 * The record a close or an fsync of a new message seals carries the
 * message's path below the maildir root (metadata L, dbox_save_seal).
 * An fsync syncs that m.N only, and its index row reaches the disk with
 * the next WAL sync (the timed one within a second, an fsyncdir,
 * another fsync); the timed sync flushes a closed message's m.N before
 * the WAL.  A power loss between the two leaves the record past its
 * m.N's committed end and the index without its row.  Recovery
 * (store-recover.c) calls this before it judges those bytes.  Each
 * record up to the last one with a path is put back, by what the index
 * still knows of its GUID:
 *
 *  - a committed message whose record is there and whole: the record is
 *    a copy of it (a purge's, whose in-flight mark the loss took):
 *    left out;
 *  - a committed message whose record is gone (an index older than a
 *    purge that moved it): that message, moved here: its row points here;
 *  - a delivery still WRITING (its create reached the disk, the commit
 *    of its close or fsync did not; or the daemon died between the
 *    two): finished in place, whatever its name now, and moved from
 *    tmp/ to new/ (an empty version a close acknowledged before is not
 *    restored then);
 *  - nothing: made again at its path (in new/ for a path in tmp/; in
 *    the folder's cur/ or new/ when the loss took the mkdir of the one
 *    named), else as 'dboxadm rebuild' would, in its B folder's cur/
 *    (restore.h).
 *
 * Of several records with one GUID (a purge's copies) the newest is the
 * message, under the path of the newest that has one.  Records without
 * a path before the last one put back (a message with two names at its
 * seal, one Dovecot or an older dboxfs wrote) are put back the same way,
 * as the committed end cannot move over them otherwise.
 *
 * Invariants: records at or after an in-flight mark of a copy or purge
 * are never looked at (an fsync makes the mark's last change durable
 * before it relies on its record's path: fs/fs-write.c); the committed
 * end moves only over records put back or left out as copies, in the
 * same durable commit.  What cannot be put back stays past the committed
 * end for store-recover.c to keep or copy, as before.
 */
#include "engine/maildir.h"
#include "engine/restore.h"
#include "engine/store-layout.h"
#include "engine/store-private.h"

#include "index/wal-sync.h"
#include "storage/dbox-record.h"
#include "storage/dbox-scan.h"
#include "storage/grow.h"
#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* At most this many records of one m.N are put back at one recovery
   (the rest stay for the next, or for rebuild), and a path or B longer
   than this is taken as none: what a hostile store can make recovery
   hold in memory is bounded. */
#define RESTORE_MAX_RECORDS 65536
#define RESTORE_MAX_TEXT DBOX_SEAL_PATH_MAX
/* ... and at most this many bytes of paths and Bs in all (65,536 records
   at both caps held 540 MB: helper-67). */
#define RESTORE_MAX_TEXT_TOTAL (32 * 1024 * 1024)

/* One whole record past the committed end. */
struct tail_rec {
	uint64_t offset, body_size, record_size, plain_size, vsize;
	time_t received;
	char guid[DBOX_GUID_HEX_LEN * 2 + 1];
	char *mailbox;  /* B, or NULL */
	char *path;     /* L, or NULL */
	struct dbox_owner owner; /* A */
	bool copy;      /* a committed message's record is there and whole */
	uint64_t moved; /* the committed message whose record is gone, or 0 */
	uint64_t writing; /* the WRITING message of its GUID, or 0 */
};

/* What the first pass keeps of a record. */
struct scan_rec {
	uint64_t end;
	char guid[DBOX_GUID_HEX_LEN * 2 + 1];
	bool path;
};

struct tail {
	struct tail_rec *v;     /* second pass: the records */
	struct scan_rec *s;     /* first pass */
	size_t n, size;
	uint64_t last_end;      /* end of the last record to put back */
	size_t count;           /* records up to it */
	size_t text;            /* first pass: bytes of L and B kept */
	bool full;              /* first pass: a cap is reached */
	bool path_beyond;       /* first pass: a record past the caps has
				   a path */
	bool collect;           /* second pass: keep the records */
	int err;                /* what stopped the collection, or 0 */
};

static void tail_free(struct tail *t)
{
	if (t->collect) {
		for (size_t i = 0; i < t->n; i++) {
			free(t->v[i].mailbox);
			free(t->v[i].path);
		}
	}
	free(t->v);
	free(t->s);
}

/* Bytes recovery keeps of an L or B value s: 0 for one it takes as
   none. */
static size_t text_len(const char *s)
{
	size_t len = s == NULL ? 0 : strlen(s);

	return len > RESTORE_MAX_TEXT ? 0 : len;
}

static char *text_dup(const char *s, int *err)
{
	char *d;

	if (s == NULL || strlen(s) > RESTORE_MAX_TEXT)
		return NULL;
	if ((d = strdup(s)) == NULL)
		*err = -ENOMEM;
	return d;
}

/* dbox_file_tail_records callback.  First pass: the GUID, end and path
   of each record (up to the caps).  Second pass: keep the
   records up to the last one to put back. */
static int tail_cb(void *ctx, uint64_t offset, uint64_t body_size,
		   const struct dbox_metadata *md, uint64_t record_size)
{
	struct tail *t = ctx;
	struct tail_rec *r;

	if (t->err != 0)
		return 0;
	if (!t->collect) {
		size_t text = text_len(md->msg_path) +
			      text_len(md->mailbox);
		struct scan_rec *sr;

		if (!t->full && (t->n >= RESTORE_MAX_RECORDS ||
				 t->text + text > RESTORE_MAX_TEXT_TOTAL))
			t->full = true;
		if (t->full) {
			/* Past a cap only whether a path follows: then the
			   records kept go back now (they are before it),
			   and the rest at the next recovery. */
			t->path_beyond |= md->msg_path != NULL &&
				strlen(md->msg_path) <= RESTORE_MAX_TEXT;
			return 0;
		}
		if ((sr = dbox_grow(t->s, t->n, &t->size,
				    sizeof(*t->s))) == NULL) {
			t->err = -ENOMEM;
			return 0;
		}
		t->s = sr;
		t->text += text;
		sr = &t->s[t->n++];
		sr->end = offset + record_size;
		memcpy(sr->guid, md->guid, sizeof(sr->guid));
		sr->path = md->msg_path != NULL &&
			strlen(md->msg_path) <= RESTORE_MAX_TEXT;
		return 0;
	}
	if (offset + record_size > t->last_end)
		return 0;
	if ((r = dbox_grow(t->v, t->n, &t->size, sizeof(*t->v))) == NULL) {
		t->err = -ENOMEM;
		return 0;
	}
	t->v = r;
	r = &t->v[t->n];
	*r = (struct tail_rec){
		.offset = offset, .body_size = body_size,
		.record_size = record_size,
		.plain_size = md->has_plain_size ? md->plain_size : body_size,
		.vsize = md->has_vsize ? md->vsize : body_size,
		.received = md->received,
	};
	memcpy(r->guid, md->guid, sizeof(r->guid));
	r->mailbox = text_dup(md->mailbox, &t->err);
	r->path = text_dup(md->msg_path, &t->err);
	r->owner = md->owner;
	t->n++;
	return 0;
}

static int scan_cmp(const void *a, const void *b)
{
	const struct scan_rec *x = *(struct scan_rec *const *)a,
			      *y = *(struct scan_rec *const *)b;
	int c = strcmp(x->guid, y->guid);

	return c != 0 ? c : (x->end > y->end) - (x->end < y->end);
}

/* After the first pass: how many records to put back - up to the last
   one with a path, or with the GUID of one with a path (a copy of it);
   all it kept when one past them has a path (helper-67 #F5: else a tail
   of more records than the cap before its first path never moved).
   Sets t->count and t->last_end; 0 records: none. */
static int tail_extent(struct tail *t)
{
	struct scan_rec **by = malloc((t->n + 1) * sizeof(*by));
	size_t last = 0;

	if (by == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < t->n; i++) {
		by[i] = &t->s[i];
		if (t->s[i].path)
			last = i + 1;
	}
	qsort(by, t->n, sizeof(*by), scan_cmp);
	for (size_t p = 0, q; p < t->n; p = q) {
		bool path = false;

		for (q = p; q < t->n && (q == p || (by[p]->guid[0] != '\0' &&
						     strcmp(by[q]->guid,
							    by[p]->guid) == 0)); q++)
			path |= by[q]->path;
		if (path && (size_t)(by[q - 1] - t->s) + 1 > last)
			last = (size_t)(by[q - 1] - t->s) + 1;
	}
	free(by);
	if (t->path_beyond)
		last = t->n;
	t->count = last;
	t->last_end = last > 0 ? t->s[last - 1].end : 0;
	return 0;
}

/* By GUID, then by place in the file. */
static int guid_cmp(const void *a, const void *b)
{
	const struct tail_rec *x = *(struct tail_rec *const *)a,
			      *y = *(struct tail_rec *const *)b;
	int c = strcmp(x->guid, y->guid);

	return c != 0 ? c : (x->offset > y->offset) - (x->offset < y->offset);
}

/* By GUID only (bsearch of a row's GUID). */
static int guid_key_cmp(const void *a, const void *b)
{
	return strcmp((*(struct tail_rec *const *)a)->guid,
		      (*(struct tail_rec *const *)b)->guid);
}

struct guid_set {
	struct dbox_store *st;
	struct tail_rec **by_guid;
	size_t n;
};

/* Is the record loc names there, whole, with loc's GUID? */
static bool record_present(struct dbox_store *st,
			   const struct dbox_msgloc *loc)
{
	struct dbox_metadata md = { 0 };
	uint64_t body_size, record_size;
	char name[16];
	bool alt, ok;
	int dir = dbox_store_mfile_dir(st, loc->file_id, &alt), fd;

	if (dir < 0)
		return false;
	dbox_file_name(name, loc->file_id);
	fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return false;
	ok = dbox_record_verify(fd, loc->offset, loc->body_size, &body_size,
				&md, &record_size, NULL) == 0 &&
		strncmp(md.guid, loc->guid, sizeof(loc->guid) - 1) == 0;
	dbox_metadata_clear(&md);
	close(fd);
	return ok;
}

/* dbox_index_msg_rows callback: what the index knows of each record's
   GUID. */
static int row_cb(void *ctx, uint64_t ino, const struct dbox_msgloc *loc)
{
	struct guid_set *g = ctx;
	struct tail_rec key, *kp = &key, **hit;
	int present = -1; /* record_present(loc), looked at once per row */
	size_t i, j;

	if (loc->guid[0] == '\0')
		return 0;
	memcpy(key.guid, loc->guid, sizeof(loc->guid));
	key.guid[sizeof(loc->guid) - 1] = '\0';
	hit = bsearch(&kp, g->by_guid, g->n, sizeof(*g->by_guid),
		      guid_key_cmp);
	if (hit == NULL)
		return 0;
	/* Every record of that GUID (bsearch finds one of them). */
	for (i = (size_t)(hit - g->by_guid);
	     i > 0 && strcmp(g->by_guid[i - 1]->guid, key.guid) == 0; i--)
		;
	for (j = i; j < g->n && strcmp(g->by_guid[j]->guid, key.guid) == 0;
	     j++) {
		struct tail_rec *r = g->by_guid[j];

		if (loc->state == DBOX_MSG_WRITING) {
			if (r->writing == 0)
				r->writing = ino;
		} else if (!r->copy) {
			/* Once per row: a crafted store of many rows and
			   records of one GUID made this rows x records file
			   opens (helper-67 #F3). */
			if (present < 0)
				present = record_present(g->st, loc);
			if (present) {
				r->copy = true;
				r->moved = 0;
			} else if (r->moved == 0) {
				r->moved = ino;
			}
		}
	}
	return 0;
}

/* What the index knows of the GUIDs of t->v[0, n) (one scan of its
   message rows).  Of several records with one GUID only the last (the
   newest) becomes the message; the others are left out as copies. */
static int match_rows(struct dbox_store *st, struct tail *t, size_t n)
{
	struct guid_set g = { .st = st,
			      .by_guid = malloc(n * sizeof(*g.by_guid)) };
	int ret;

	if (g.by_guid == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		if (t->v[i].guid[0] != '\0')
			g.by_guid[g.n++] = &t->v[i];
	qsort(g.by_guid, g.n, sizeof(*g.by_guid), guid_cmp);
	ret = g.n == 0 ? 0 : dbox_index_msg_rows(st->index, row_cb, &g);
	for (size_t i = 0; ret == 0 && i + 1 < g.n; i++) {
		struct tail_rec *r = g.by_guid[i], *next = g.by_guid[i + 1];

		if (guid_key_cmp(&r, &next) != 0)
			continue;
		/* An older version: the newest takes its path, when it
		   has none (sealed by the close after the fsync). */
		r->copy = true;
		if (next->path == NULL) {
			next->path = r->path;
			r->path = NULL;
		}
	}
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

/* new/ beside dir, when dir is a folder's tmp/ (parent up, name tmp):
   *dir_r; else *dir_r stays.  Returns 0 or the index's errno. */
static int new_for_tmp(struct dbox_index *index, uint64_t up,
		       const char *name, size_t len, uint64_t *dir_r)
{
	struct dbox_attr attr;
	int ret;

	if (len != 3 || memcmp(name, "tmp", 3) != 0)
		return 0;
	ret = dbox_index_lookup(index, up, "new", 3, &attr);
	if (ret == 0 && attr.kind == DBOX_KIND_DIR)
		*dir_r = attr.ino;
	return ret == -ENOENT ? 0 : ret;
}

/* The directory of folder that takes a message whose path named its
   subdirectory sub (sub_len bytes: cur, new or tmp): cur/ for cur/, new/
   for new/ and tmp/ (see place_at_path); when that one is gone (the loss
   took its mkdir, made just before), the other, so the message keeps its
   name.  Returns 0 with *dir_r, -ENOENT when the folder has neither, or
   the index's errno. */
static int folder_subdir(struct dbox_index *index, uint64_t folder,
			 const char *sub, size_t sub_len, uint64_t *dir_r)
{
	bool cur = sub_len == 3 && memcmp(sub, "cur", 3) == 0;
	const char *order[] = { cur ? "cur" : "new", cur ? "new" : "cur" };
	struct dbox_attr attr;
	int ret;

	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		ret = dbox_index_lookup(index, folder, order[i], 3, &attr);
		if (ret == 0 && attr.kind == DBOX_KIND_DIR) {
			*dir_r = attr.ino;
			return 0;
		}
		if (ret < 0 && ret != -ENOENT)
			return ret;
	}
	return -ENOENT;
}

/* Put r (at loc) back at its path.  A name the index lost with the rest
   of its commits is made again - in new/ when it was in a folder's tmp/:
   a maildir delivery syncs its message in tmp/ to rename it into new/
   next, and back in tmp/, where no reader looks and clients delete what
   is old, it would be lost all the same (docs/limits.md).  Returns 0,
   -ENOENT or -EINVAL when the path names no folder that exists, no cur/,
   new/ or tmp/ or no valid name, -EEXIST when the name is taken, or the
   index's errno. */
static int place_at_path(struct dbox_index *index, const struct tail_rec *r,
			 const struct dbox_msgloc *loc)
{
	const char *name = strrchr(r->path, '/'), *sub, *p, *slash;
	struct dbox_attr attr, dirattr;
	uint64_t folder = DBOX_ROOT_INO, dir;
	unsigned int depth = 1; /* sub */
	size_t sub_len;
	int ret;

	if (name == NULL)
		return -EINVAL;
	for (sub = name; sub > r->path && sub[-1] != '/'; sub--)
		;
	sub_len = (size_t)(name - sub);
	name++;
	/* Messages live in a folder's cur/, new/ or tmp/ only. */
	if (!good_name(name, strlen(name)) || !maildir_is_subdir(sub, sub_len))
		return -EINVAL;
	for (p = r->path; p < sub; p = slash + 1) {
		slash = strchr(p, '/');
		if (!good_name(p, (size_t)(slash - p)) ||
		    ++depth > DBOX_TREE_MAX_DEPTH)
			return -EINVAL;
		if ((ret = dbox_index_lookup(index, folder, p,
					     (size_t)(slash - p), &attr)) < 0)
			return ret;
		if (attr.kind != DBOX_KIND_DIR)
			return -ENOENT;
		folder = attr.ino;
	}
	if ((ret = folder_subdir(index, folder, sub, sub_len, &dir)) < 0 ||
	    (ret = dbox_index_getattr(index, dir, &dirattr)) < 0)
		return ret;
	return dbox_restore_message(index, dir, &dirattr, name, loc,
				    r->plain_size, r->received, &r->owner, NULL);
}

/* The delivery ino the index has as WRITING, finished with r (at loc)
   under the name it has; from a folder's tmp/ into its new/ (see
   place_at_path) when that name is free there. */
static int finish_writing(struct dbox_index *index, uint64_t ino,
			  const struct tail_rec *r,
			  const struct dbox_msgloc *loc)
{
	struct dbox_attr attr;
	uint64_t parent, up, dir, replaced;
	uint32_t replaced_nlink;
	char *name = NULL, *dirname = NULL, key[48];
	int ret;

	if ((ret = dbox_index_getattr(index, ino, &attr)) < 0)
		return ret;
	attr.size = r->plain_size;
	attr.mtime_ns = dbox_time_make(r->received, 0);
	/* The record is newer than an empty version a close acknowledged
	   before (its fsync sealed it later): not stored empty after all
	   (dbox_msg_restore_empty). */
	dbox_save_acked_empty_key(key, ino);
	if ((ret = dbox_index_msg_set(index, ino, loc)) < 0 ||
	    (ret = dbox_index_setattr(index, &attr)) < 0 ||
	    (ret = dbox_index_meta_delete(index, key)) < 0)
		return ret;
	if (dbox_index_entry_of(index, ino, &parent, &name) < 0)
		return 0; /* no name: the index's recovery drops it */
	if ((ret = dbox_index_entry_of(index, parent, &up, &dirname)) == 0) {
		dir = parent;
		ret = new_for_tmp(index, up, dirname, strlen(dirname), &dir);
		if (ret == 0 && dir != parent) {
			ret = dbox_index_rename(index, parent, name, strlen(name),
						dir, name, strlen(name),
						RENAME_NOREPLACE, dbox_now_ns(),
						NULL, &replaced, &replaced_nlink);
			if (ret == -EEXIST)
				ret = 0; /* stays in tmp/ */
		}
	} else if (ret == -ENOENT) {
		ret = 0;
	}
	free(name);
	free(dirname);
	return ret;
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

	ret = dbox_restore_find_cur(index, r->mailbox, &cur);
	if (ret == -ENOENT) {
		/* Not even INBOX has a cur/ (the mount makes one at its
		   start; this runs before): made as the mount would. */
		struct dbox_attr root;

		if ((ret = dbox_index_getattr(index, DBOX_ROOT_INO, &root)) < 0 ||
		    (ret = dbox_index_create(index, DBOX_ROOT_INO, "cur", 3,
					     DBOX_KIND_DIR, S_IFDIR | 0700,
					     root.uid, root.gid, dbox_now_ns(),
					     &dir)) < 0)
			return ret;
		cur = dir.ino;
	}
	if (ret < 0 || (ret = dbox_index_getattr(index, cur, &dir)) < 0)
		return ret;
	for (unsigned int n = 0; ; n++) {
		dbox_restored_name(r->received, r->guid, file_id, r->offset, n,
				   name);
		ret = dbox_restore_message(index, cur, &dir, name, loc,
					   r->plain_size, r->received,
					   &r->owner, NULL);
		if (ret != -EEXIST || n == 1000)
			return ret;
	}
}

struct counts {
	unsigned int at_path, in_folder, finished, moved, copies;
};

/* Put t->v[0, n) back in st's index (a transaction is open).  Returns 0,
   or a negative errno with *failed_r the record it failed at. */
static int place_all(struct dbox_store *st, uint32_t file_id,
		     const struct tail *t, size_t n, struct counts *c,
		     size_t *failed_r)
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

		*failed_r = i;
		memcpy(loc.guid, r->guid, sizeof(loc.guid));
		if (r->copy) {
			c->copies++;
			continue;
		}
		if (r->moved != 0) {
			if ((ret = dbox_index_msg_set(st->index, r->moved,
						      &loc)) < 0)
				return ret;
			c->moved++;
			continue;
		}
		if (r->writing != 0) {
			if ((ret = finish_writing(st->index, r->writing, r,
						  &loc)) < 0)
				return ret;
			c->finished++;
			continue;
		}
		if (r->path != NULL)
			ret = place_at_path(st->index, r, &loc);
		if (ret == 0) {
			c->at_path++;
			continue;
		}
		if (ret != -ENOENT && ret != -EINVAL && ret != -EEXIST &&
		    ret != -ENOTDIR && ret != -ENAMETOOLONG)
			return ret;
		if ((ret = place_in_folder(st->index, file_id, r, &loc)) < 0)
			return ret;
		c->in_folder++;
	}
	return 0;
}

/* Put back t->v[0, n) with the committed end moved to its end, in one
   durable commit.  Returns 0, or a negative errno with *failed_r the
   record that could not be put back (nothing is changed then). */
static int restore_records(struct dbox_store *st, uint32_t file_id,
			   const struct tail *t, size_t n, struct counts *c,
			   size_t *failed_r)
{
	uint64_t end = t->v[n - 1].offset + t->v[n - 1].record_size;
	int ret;

	*c = (struct counts){ 0 };
	*failed_r = n;
	if ((ret = dbox_index_begin(st->index)) < 0)
		return ret;
	if ((ret = place_all(st, file_id, t, n, c, failed_r)) < 0 ||
	    (ret = dbox_index_mfile_set(st->index, file_id, end)) < 0 ||
	    (ret = dbox_index_commit(st->index, false)) < 0) {
		dbox_index_rollback(st->index);
		return ret;
	}
	/* Committed: what follows judges the file by the new end, whether
	   this sync works or not (it is retried by every later one). */
	(void)dbox_index_sync_upto(st->index, dbox_index_commit_seq(st->index));
	return 0;
}

/* The first pass of a restore: t->count and t->last_end of the records
   from committed to put back.  Returns 0 or a negative errno. */
static int restorable(struct tail *t, int fd, uint32_t file_id,
		      uint64_t committed, uint64_t stop)
{
	uint64_t end;
	long whole = dbox_file_tail_records(fd, file_id, committed, stop,
					    &end, tail_cb, t);
	int ret = whole < 0 ? (int)whole : t->err;

	if (ret == 0 && whole > 0)
		ret = tail_extent(t);
	free(t->s);
	t->s = NULL;
	return ret;
}

uint64_t dbox_store_restorable_end(int fd, uint32_t file_id,
				   uint64_t committed, uint64_t stop,
				   size_t *count_r)
{
	struct tail t = { 0 };

	*count_r = 0;
	if (restorable(&t, fd, file_id, committed, stop) < 0 || t.count == 0)
		return committed;
	*count_r = t.count;
	return t.last_end;
}

uint64_t dbox_store_restore_sealed(struct dbox_store *st, int fd,
				    uint32_t file_id, bool alt,
				    uint64_t committed, uint64_t stop)
{
	struct tail t = { 0 };
	struct counts c = { 0 };
	uint64_t end;
	size_t n, failed;
	long whole;
	int ret;

	dbox_store_assert_locked(st);
	ret = restorable(&t, fd, file_id, committed, stop);
	if (ret == 0 && t.count == 0)
		return committed;
	if (ret == 0) {
		t.n = t.size = 0;
		t.collect = true;
		whole = dbox_file_tail_records(fd, file_id, committed,
					       t.last_end, &end, tail_cb, &t);
		ret = whole < 0 ? (int)whole : t.err;
	}
	if (ret == 0 && t.n != t.count)
		ret = -EIO; /* the file changed under us */
	if (ret == 0)
		ret = match_rows(st, &t, t.n);
	n = t.n;
	/* A record that cannot be put back: the ones before it are, and it
	   and the rest stay past the committed end. */
	while (ret == 0 &&
	       (ret = restore_records(st, file_id, &t, n, &c, &failed)) < 0 &&
	       failed > 0 && failed < n) {
		dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u: the record at %llu "
			   "cannot be put back (%s); it stays past the "
			   "committed end", dbox_store_dir_name(st, alt),
			   file_id, (unsigned long long)t.v[failed].offset,
			   strerror(-ret));
		n = failed;
		ret = 0;
	}
	if (ret < 0) {
		dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u: putting back the records "
			   "past the committed end %llu: %s; they are kept for "
			   "'dboxadm rebuild'", dbox_store_dir_name(st, alt),
			   file_id, (unsigned long long)committed,
			   strerror(-ret));
		tail_free(&t);
		return committed;
	}
	end = t.v[n - 1].offset + t.v[n - 1].record_size;
	dbox_warning("%s/" DBOX_STORE_STORAGE "/m.%u: %u messages whose index "
		     "rows the crash lost put back at their paths, %u in their folder's cur/, %u unfinished "
		     "deliveries finished, %u messages a purge had moved "
		     "found (%u copies of messages the index has left out); "
		     "committed end %llu -> %llu", dbox_store_dir_name(st, alt),
		     file_id, c.at_path, c.in_folder, c.finished, c.moved,
		     c.copies, (unsigned long long)committed,
		     (unsigned long long)end);
	tail_free(&t);
	return end;
}
