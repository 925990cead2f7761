/*
 * store-copies.c: are the records past an m.N's in-flight mark copies of
 * messages the index still has (engine/store.h, dbox_store_tail_copies)?
 *
 * A purge (and a copy-on-write rewrite) marks the place of its copies
 * in flight, commits that, then copies whole records there; the commit
 * that points the messages at them comes last.  A crash in between
 * leaves whole records from the mark on, each the same bytes as a
 * message the index still names at its old place (helper-92: 977
 * records in 81 lost+found files over 150 killed online purges, every
 * one of them a live message).  Recovery keeps a copy of whole records
 * it cuts there, since a save the crash cut between its seal and its
 * commit, under an index restored from a copy, may be the only copy of
 * acknowledged mail; these are not, and need none.
 *
 * A record counts as a copy only when a committed (not WRITING) row of
 * its GUID names a record elsewhere whose body has the same bytes:
 * the GUID alone would take a rewrite (new bytes, same GUID) for its
 * old version.  One scan of the message rows; each row's body is read
 * at most once.
 *
 * Invariants: a record is never judged a copy of itself (a row pointing
 * at or past `from` in the same m.N is no place elsewhere); the work is
 * bounded by the tail, not by what a hostile index holds: a row costs a
 * binary search, and only one whose GUID still has records that are no
 * copy goes on, at most twice the tail's records (and 16) times, with
 * at most twice its bytes (and 1 MiB) compared and four times its
 * records (and 1024) looked at, past which the answer is "not copies"
 * (a lost+found copy, as before; helper-93: 100,000 rows of one GUID
 * against 65,535 records took 37 s before this).
 */
#include "engine/store-layout.h"
#include "engine/store-private.h"

#include "storage/dbox-file.h"
#include "storage/dbox-format.h"
#include "storage/dbox-record.h"
#include "storage/dbox-scan.h"
#include "storage/grow.h"
#include "storage/io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* At most this many records are judged (more: not copies, so kept):
   what a hostile store makes recovery hold is bounded. */
#define COPIES_MAX_RECORDS 65536

struct copy_rec {
	uint64_t offset, body_size;
	char guid[DBOX_GUID_HEX_LEN * 2 + 1];
	bool copy;
	size_t group_left;  /* the first of a GUID's records: how many of
			       them are no copy yet */
};

struct copies {
	struct dbox_index *index;
	int tail_fd, storage_fd, alt_fd;
	uint32_t file_id;
	uint64_t from;
	struct copy_rec *v;
	size_t n, size;
	bool fail;      /* a record cannot be a copy (no GUID, a cap) */
	uint64_t compare_left, opens_left, steps_left; /* the budget */
};

/* dbox_file_tail_records callback: each whole record's place and GUID. */
static int rec_cb(void *ctx, uint64_t offset, uint64_t body_size,
		  const struct dbox_metadata *md, uint64_t record_size)
{
	struct copies *c = ctx;
	struct copy_rec *v;

	(void)record_size;
	if (c->fail)
		return 0;
	if (md->guid[0] == '\0' || c->n >= COPIES_MAX_RECORDS ||
	    (v = dbox_grow(c->v, c->n, &c->size, sizeof(*c->v))) == NULL) {
		c->fail = true;
		return 0;
	}
	c->v = v;
	v = &c->v[c->n++];
	*v = (struct copy_rec){ .offset = offset, .body_size = body_size };
	memcpy(v->guid, md->guid, sizeof(v->guid));
	v->guid[sizeof(v->guid) - 1] = '\0';
	return 0;
}

static int guid_cmp(const void *a, const void *b)
{
	return strcmp(((const struct copy_rec *)a)->guid,
		      ((const struct copy_rec *)b)->guid);
}

/* m.<file_id> from storage/ or ALT (numbers are unique across both),
   read-only; negative when neither has it as a regular file. */
static int open_mfile(const struct copies *c, uint32_t file_id)
{
	char name[16];
	int fd = -1;

	dbox_file_name(name, file_id);
	if (c->storage_fd >= 0)
		fd = openat(c->storage_fd, name, O_RDONLY | O_NOFOLLOW |
			    O_NONBLOCK | O_CLOEXEC);
	if (fd < 0 && c->alt_fd >= 0)
		fd = openat(c->alt_fd, name, O_RDONLY | O_NOFOLLOW |
			    O_NONBLOCK | O_CLOEXEC);
	return dbox_fd_regular(fd, NULL); /* closes what is no file */
}

/* Do the bodies of size bytes at a_off in a and at b_off in b hold the
   same bytes? */
static bool same_body(int a, uint64_t a_off, int b, uint64_t b_off,
		      uint64_t size)
{
	static const size_t chunk = 65536;
	char *x = malloc(chunk), *y = malloc(chunk);
	bool same = x != NULL && y != NULL;

	for (uint64_t done = 0; same && done < size; ) {
		size_t n = size - done < chunk ? (size_t)(size - done) : chunk;

		same = dbox_pread_full(a, x, n, a_off + done) == (ssize_t)n &&
		       dbox_pread_full(b, y, n, b_off + done) == (ssize_t)n &&
		       memcmp(x, y, n) == 0;
		done += n;
	}
	free(x);
	free(y);
	return same;
}

/* The first of the records (sorted by GUID) with guid, or c->n: a
   binary search. */
static size_t group_of(const struct copies *c, const char *guid)
{
	size_t lo = 0, hi = c->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (strcmp(c->v[mid].guid, guid) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < c->n && strcmp(c->v[lo].guid, guid) == 0 ? lo : c->n;
}

/* dbox_index_msg_rows callback: mark the records of this committed
   row's GUID whose body its record repeats. */
static int row_cb(void *ctx, uint64_t ino, const struct dbox_msgloc *loc)
{
	struct copies *c = ctx;
	struct copy_rec key = { 0 };
	struct dbox_metadata md = { 0 };
	uint64_t body_size, record_size;
	size_t first;
	int fd;

	(void)ino;
	if (loc->state == DBOX_MSG_WRITING || loc->guid[0] == '\0' ||
	    (loc->file_id == c->file_id && loc->offset >= c->from))
		return 0;
	memcpy(key.guid, loc->guid, sizeof(loc->guid));
	key.guid[sizeof(key.guid) - 1] = '\0';
	first = group_of(c, key.guid);
	if (first == c->n || c->v[first].group_left == 0)
		return 0; /* not in the tail, or each a copy already */
	if (c->opens_left == 0)
		return 1; /* over budget: stop, not copies */
	c->opens_left--;
	fd = open_mfile(c, loc->file_id);
	if (fd < 0)
		return 0;
	/* The row's record must be whole and of its GUID to count. */
	if (dbox_record_verify(fd, loc->offset, loc->body_size, &body_size,
			       &md, &record_size, NULL) == 0 &&
	    strncmp(md.guid, loc->guid, sizeof(loc->guid) - 1) == 0) {
		for (size_t i = first; i < c->n &&
		     strcmp(c->v[i].guid, key.guid) == 0; i++) {
			struct copy_rec *r = &c->v[i];

			if (c->steps_left == 0) {
				c->fail = true;
				break;
			}
			c->steps_left--;
			if (r->copy || r->body_size != body_size)
				continue;
			if (body_size > c->compare_left) {
				c->fail = true;
				break;
			}
			c->compare_left -= body_size;
			r->copy = same_body(
					fd, loc->offset + DBOX_MSG_HEADER_SIZE,
					c->tail_fd,
					r->offset + DBOX_MSG_HEADER_SIZE,
					body_size);
			if (r->copy)
				c->v[first].group_left--;
		}
	}
	dbox_metadata_clear(&md);
	close(fd);
	return c->fail ? 1 : 0;
}

bool dbox_store_tail_copies(struct dbox_index *index, int storage_fd,
			    int alt_fd, int fd, uint32_t file_id,
			    uint64_t from, long *count_r)
{
	struct copies c = { .index = index, .tail_fd = fd,
			    .storage_fd = storage_fd, .alt_fd = alt_fd,
			    .file_id = file_id, .from = from };
	uint64_t end;
	long whole = dbox_file_tail_records(fd, file_id, from, UINT64_MAX,
					    &end, rec_cb, &c);
	bool all = whole > 0 && !c.fail && (size_t)whole == c.n;

	if (all) {
		c.compare_left = 2 * (end - from) + (1u << 20);
		c.opens_left = 2 * c.n + 16;
		c.steps_left = 4 * c.n + 1024;
		qsort(c.v, c.n, sizeof(*c.v), guid_cmp);
		for (size_t i = 0, first = 0; i < c.n; i++) {
			if (i > 0 && strcmp(c.v[i].guid, c.v[i - 1].guid) != 0)
				first = i;
			c.v[first].group_left++;
		}
		all = dbox_index_msg_rows(index, row_cb, &c) == 0;
	}
	for (size_t i = 0; all && i < c.n; i++)
		all = c.v[i].copy;
	free(c.v);
	*count_r = whole > 0 ? whole : 0;
	return all;
}
