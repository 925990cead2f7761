/*
 * verify.c: the background check of a whole index (verify.h).
 */
#include "index-private.h"
#include "verify.h"

#include "index/reserve.h"
#include "storage/log.h"

#include <errno.h>
#include <string.h>

/* The thread: PRAGMA quick_check on its own connection.  Its first row
   is "ok" for a sound index; anything else, or SQLite's "database disk
   image is malformed" on the way, is damage.  An interrupt (close) is
   not. */
static void *verify_thread(void *arg)
{
	struct dbox_index *index = arg;
	sqlite3 *db = index->verifier.db;
	sqlite3_stmt *stmt = NULL;
	int rc;

	rc = sqlite3_prepare_v2(db, "PRAGMA quick_check(1)", -1, &stmt, NULL);
	if (rc == SQLITE_OK)
		rc = sqlite3_step(stmt);
	if (rc == SQLITE_ROW) {
		const char *row = (const char *)sqlite3_column_text(stmt, 0);

		if (row == NULL || strcmp(row, "ok") != 0)
			index_mark_damaged(index, row != NULL ? row :
					   "quick_check gave no answer");
		else
			dbox_info("index %s: checked after the crash: sound",
				  index->path);
	} else if ((rc & 0xff) == SQLITE_CORRUPT || (rc & 0xff) == SQLITE_NOTADB) {
		index_mark_damaged(index, sqlite3_errmsg(db));
	} else if (rc != SQLITE_INTERRUPT && rc != SQLITE_DONE) {
		dbox_warning("index %s: its check did not run: %s", index->path,
			     sqlite3_errmsg(db));
	}
	sqlite3_finalize(stmt);
	return NULL;
}

int dbox_index_verify_start(struct dbox_index *index)
{
	struct index_verifier *v = &index->verifier;
	int ret;

	if (v->running)
		return 0;
	if (sqlite3_open_v2(index->path, &v->db, SQLITE_OPEN_READONLY |
			    SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_NOFOLLOW,
			    dbox_reserve_vfs()) != SQLITE_OK) {
		dbox_error("index %s: check: %s", index->path, v->db != NULL ?
			   sqlite3_errmsg(v->db) : "out of memory");
		sqlite3_close(v->db);
		v->db = NULL;
		return -EIO;
	}
	if ((ret = pthread_create(&v->thread, NULL, verify_thread, index)) != 0) {
		dbox_error("index %s: check: %s", index->path, strerror(ret));
		sqlite3_close(v->db);
		v->db = NULL;
		return -ret;
	}
	v->running = true;
	return 0;
}

void dbox_index_verify_stop(struct dbox_index *index)
{
	struct index_verifier *v = &index->verifier;

	if (!v->running)
		return;
	sqlite3_interrupt(v->db);
	pthread_join(v->thread, NULL);
	sqlite3_close(v->db);
	v->db = NULL;
	v->running = false;
}
