/*
 * read-ahead.c: chunked reads of an index database file (read-ahead.h).
 */
#include "read-ahead.h"

#include <stdlib.h>
#include <string.h>

void read_ahead_init(struct read_ahead *ra)
{
	ra->buf = NULL;
	ra->off = 0;
	ra->len = 0;
	ra->next = -1;
}

/* Whether [off, off + amt) is inside what ra holds. */
static bool holds(const struct read_ahead *ra, int amt, sqlite3_int64 off)
{
	return ra->len > 0 && off >= ra->off &&
	       off + amt <= ra->off + ra->len;
}

int read_ahead_read(struct read_ahead *ra, sqlite3_file *file, void *buf,
		    int amt, sqlite3_int64 off)
{
	/* At the previous read's end or a little past it: a walk through
	   neighbouring pages (a B-tree's leaves, written one after the
	   other, lie close together with other trees' pages between). */
	bool near = ra->next >= 0 && off >= ra->next &&
		    off - ra->next < READ_AHEAD_BYTES;

	ra->next = off + amt;
	if (holds(ra, amt, off)) {
		memcpy(buf, ra->buf + (off - ra->off), (size_t)amt);
		return SQLITE_OK;
	}
	if (!near || amt >= READ_AHEAD_BYTES)
		return file->pMethods->xRead(file, buf, amt, off);
	if (ra->buf == NULL && (ra->buf = malloc(READ_AHEAD_BYTES)) == NULL)
		return file->pMethods->xRead(file, buf, amt, off);
	ra->len = 0;
	if (file->pMethods->xRead(file, ra->buf, READ_AHEAD_BYTES, off) !=
	    SQLITE_OK)
		/* The end of the file (or an error): as asked. */
		return file->pMethods->xRead(file, buf, amt, off);
	ra->off = off;
	ra->len = READ_AHEAD_BYTES;
	memcpy(buf, ra->buf, (size_t)amt);
	return SQLITE_OK;
}

void read_ahead_forget(struct read_ahead *ra)
{
	ra->len = 0;
	ra->next = -1;
}

void read_ahead_free(struct read_ahead *ra)
{
	free(ra->buf);
	read_ahead_init(ra);
}
