/*
 * wal-batch.c: one write per transaction to the WAL (see wal-batch.h).
 *
 * Only appending writes are held: a write at another offset (the WAL's
 * header when it starts over, a page SQLite rewrites in place, the frame
 * headers it rewrites with new checksums) is written at once, after what
 * the batch held.  So a commit frame's header that is not followed by its
 * page (SQLite's checksum rewrite) is never held, and every held commit
 * header is followed by the page that flushes it.
 *
 * Never holds bytes that SQLite could need from the file: the caller
 * flushes before any other method of the file (reserve.c).
 */
#include "wal-batch.h"

#include <stdlib.h>
#include <string.h>

void wal_batch_init(struct wal_batch *b, wal_batch_write_fn *write,
		    void *ctx)
{
	memset(b, 0, sizeof(*b));
	b->write = write;
	b->ctx = ctx;
	b->next = -1;
}

/* Whether the frame header hdr (WAL_FRAME_HEADER bytes) is a commit
   frame's: its database size after commit (bytes 4..7) is not zero. */
static bool is_commit_header(const unsigned char *hdr)
{
	return (hdr[4] | hdr[5] | hdr[6] | hdr[7]) != 0;
}

int wal_batch_flush(struct wal_batch *b)
{
	int rc;

	if (b->len == 0)
		return SQLITE_OK;
	rc = b->write(b->ctx, b->buf, (int)b->len, b->off);
	/* Kept on failure: SQLite took these writes as done, and may still
	   commit after them (a statement that fails rolls back only
	   itself); the next flush writes them first. */
	if (rc == SQLITE_OK)
		b->len = 0;
	return rc;
}

void wal_batch_drop(struct wal_batch *b)
{
	b->len = 0;
	b->next = -1;
	b->commit = false;
}

int wal_batch_write(struct wal_batch *b, const void *buf, int n,
		    sqlite3_int64 off)
{
	bool header = n == WAL_FRAME_HEADER;
	/* This write is the page of the commit frame whose header came
	   last: the transaction is complete with it. */
	bool commit_page = !header && b->commit;
	bool append = n > 0 && off == b->next && (size_t)n <= WAL_BATCH_CAP;
	int rc;

	b->commit = false;
	if (!append || b->len + (size_t)n > WAL_BATCH_CAP) {
		if ((rc = wal_batch_flush(b)) != SQLITE_OK) {
			/* A commit that fails is rolled back whole: none of
			   its frames may reach the file later. */
			if (commit_page)
				wal_batch_drop(b);
			return rc;
		}
	}
	if (append && b->buf == NULL)
		b->buf = malloc(WAL_BATCH_CAP);
	if (!append || b->buf == NULL) {
		/* Written at once (also without memory for a batch). */
		rc = b->write(b->ctx, buf, n, off);
		b->next = rc == SQLITE_OK ? off + n : -1;
		b->commit = rc == SQLITE_OK && header && is_commit_header(buf);
		return rc;
	}
	if (b->len == 0)
		b->off = off;
	memcpy(b->buf + b->len, buf, (size_t)n);
	b->len += (size_t)n;
	b->next = off + n;
	b->commit = header && is_commit_header(buf);
	if (commit_page && (rc = wal_batch_flush(b)) != SQLITE_OK) {
		wal_batch_drop(b);
		return rc;
	}
	return SQLITE_OK;
}

void wal_batch_free(struct wal_batch *b)
{
	free(b->buf);
	b->buf = NULL;
	b->len = 0;
}
