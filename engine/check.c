/*
 * check.c: dbox_check_store (check.h): open the store (a view, the store
 * lock tried shared), the index side of the check, and reporting.  The
 * m.N side is check-mfile.c and check-records.c, files/ and lost+found/
 * check-files.c.
 */
#include "engine/check-private.h"
#include "engine/store-layout.h"
#include "engine/store-lock.h"
#include "engine/store.h"

#include "index/index-check.h"
#include "index/index-stats.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void check_say(struct check *c, enum dbox_check_severity severity,
	       enum dbox_check_kind kind, const struct check_at *at,
	       const char *fmt, ...)
{
	char text[2048];
	struct dbox_check_item item = {
		.severity = severity,
		.kind = kind,
		.reason = "",
		.text = text,
	};
	va_list args;

	if (at != NULL) {
		item.file_id = at->file_id;
		item.offset = at->offset;
		item.end = at->end;
		item.ino = at->ino;
		if (at->reason != NULL)
			item.reason = at->reason;
	}
	va_start(args, fmt);
	vsnprintf(text, sizeof(text), fmt, args);
	va_end(args);
	if (severity == DBOX_CHECK_PROBLEM)
		c->sum->problems++;
	else
		c->sum->notes++;
	c->report(c->ctx, &item);
}

static void index_problem_cb(void *ctx, const char *text)
{
	check_problem(ctx, DBOX_CHECK_INDEX, NULL, "%s", text);
}

/* The index's own questions (index-check.h): SQLite's integrity, the
   namespace, and what crash recovery would clean up. */
static int check_index(struct check *c)
{
	uint64_t writing = 0, kept = 0, unnamed = 0;
	int ret;

	if ((ret = dbox_index_check_integrity(c->index, index_problem_cb,
					      c)) < 0 ||
	    (ret = dbox_index_check_namespace(c->index, index_problem_cb,
					      c)) < 0 ||
	    (ret = dbox_index_check_pending(c->index, DBOX_META_ACKED_EMPTY,
					    &writing, &kept, &unnamed)) < 0)
		return ret;
	/* An import holding the lock marks the index too: only offline is
	   the mark a killed import's. */
	c->import_killed = c->offline && dbox_store_import_marked(c->index);
	c->sum->import_killed = c->import_killed;
	if (c->import_killed)
		check_note(c, DBOX_CHECK_PENDING, NULL, "an import was killed "
			   "before it finished: what it had not committed (the "
			   "bytes of " DBOX_STORE_STORAGE "/ and " DBOX_STORE_FILES
			   "/ the index does not know) the next mount or import "
			   "cuts, keeping a copy in " DBOX_STORE_LOST_FOUND "/");
	if (writing > kept)
		check_note(c, DBOX_CHECK_PENDING, NULL, "%llu messages %s",
			   (unsigned long long)(writing - kept), c->offline ?
			   "were being written when the store was last used: "
			   "the next mount drops them (crash recovery)" :
			   "are being written");
	if (kept > 0)
		check_note(c, DBOX_CHECK_PENDING, NULL, "%llu messages %s",
			   (unsigned long long)kept, c->offline ?
			   "were being written after a close that acknowledged "
			   "them empty: the next mount stores them empty "
			   "(crash recovery)" : "are being written after a "
			   "close that acknowledged them empty");
	if (unnamed > 0 && c->offline)
		check_note(c, DBOX_CHECK_PENDING, NULL, "%llu files have no "
			   "name left (unlinked while open when the store was "
			   "last used): the next mount deletes them",
			   (unsigned long long)unnamed);
	return 0;
}

/* Everything, inside one snapshot of the index. */
static int run(struct check *c)
{
	int ret;

	if ((ret = dbox_index_snapshot_begin(c->index)) < 0)
		return ret;
	if ((ret = check_index(c)) == 0 &&
	    (ret = check_mfiles_list(c)) == 0 &&
	    (ret = check_messages(c)) == 0)
		ret = check_plain_files(c);
	dbox_index_snapshot_end(c->index);
	return ret;
}

/* Open the view of path.  A store whose index cannot be opened is a
   problem when storage/ is there (rebuild recreates the index): 1.
   Else 0, or a negative errno for dbox_check_store to return. */
static int open_view(struct check *c, const char *path, int dir_fd)
{
	int ret = dbox_view_open(path, &c->view);

	if (ret == 0) {
		c->index = c->view->index;
		return 0;
	}
	if (faccessat(dir_fd, DBOX_STORE_STORAGE, F_OK, 0) < 0)
		return -ENOMEDIUM;
	/* A newer format, or a path SQLite cannot take (logged; a rebuild
	   could not make an index there either): refused, no advice. */
	if (ret == -EPROTO || ret == -ENAMETOOLONG)
		return ret;
	check_problem(c, DBOX_CHECK_INDEX, NULL, "%s is %s: 'dboxadm rebuild "
		      "%s' recreates it from %s/", DBOX_STORE_INDEX,
		      ret == -ENOMEDIUM ? "missing" : "unreadable", path,
		      DBOX_STORE_STORAGE);
	return 1;
}

/* What the view could not open: storage/, the recorded alternate
   storage. */
static void report_dirs(struct check *c)
{
	const struct dbox_view *v = c->view;

	if (v->storage_err < 0)
		check_problem(c, DBOX_CHECK_STORAGE, NULL, "%s/: %s",
			      DBOX_STORE_STORAGE, strerror(-v->storage_err));
	if (v->alt_err < 0)
		check_problem(c, DBOX_CHECK_STORAGE, NULL, "alternate storage "
			      "%s/%s: %s; the messages in it are unreadable",
			      v->alt_path, DBOX_STORE_STORAGE,
			      dbox_view_alt_why(v->alt_err));
	/* Named by their ALT path even while it is not there (a problem
	   above says why), never as storage/m.N of the store. */
	c->alt_shown = v->alt_path;
}

static void check_free(struct check *c)
{
	check_mfiles_free(c);
	free(c->file_inos);
	if (c->files_fd >= 0)
		close(c->files_fd);
	if (c->body_fd >= 0)
		close(c->body_fd);
	free(c->body_buf);
	dbox_view_close(&c->view);
}

int dbox_check_store(const char *path, dbox_check_report_t *report,
		     dbox_check_progress_t *progress, void *ctx,
		     struct dbox_check_summary *sum)
{
	struct check c = {
		.report = report, .progress = progress, .ctx = ctx, .sum = sum,
		.files_fd = -1, .body_fd = -1, .offline = true,
	};
	int dir_fd, lock_fd, ret;
	bool held = false;

	memset(sum, 0, sizeof(*sum));
	if ((dir_fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		return -errno;
	/* Offline: hold the lock shared, so no mount starts meanwhile.  No
	   lock file (or one that is no regular file) is no holder. */
	lock_fd = dbox_store_lock_try(dir_fd, true, &held);
	c.offline = lock_fd < 0 || held;
	sum->mounted = !c.offline;
	ret = open_view(&c, path, dir_fd);
	if (ret == 0) {
		sum->opened = true;
		report_dirs(&c);
		c.files_fd = dbox_store_open_in(path, DBOX_STORE_FILES, NULL, 0);
		c.files_err = c.files_fd < 0 ? c.files_fd : 0;
		if ((ret = run(&c)) == 0)
			check_lost_found(&c);
		sum->mfiles = c.nfiles;
		sum->plain_files = c.nfile_inos;
	} else if (ret > 0) {
		sum->opened = true;
		ret = 0;
	}
	check_free(&c);
	if (lock_fd >= 0)
		close(lock_fd);
	close(dir_fd);
	return ret;
}
