/*
 * rebuild.c: one rebuild run (engine/rebuild.h): the store opened and
 * locked, the alternate storage found, the old index moved aside and
 * salvaged, the steps of rebuild-scan.c, rebuild-match.c, rebuild-tree.c
 * and rebuild-restore.c run inside one transaction of the new index,
 * which replaces index.sqlite only when complete and on disk.
 */
#include "storage/grow.h"
#include "engine/alt-mark.h"
#include "engine/rebuild-private.h"
#include "engine/store-dirs.h"
#include "engine/store-layout.h"
#include "engine/store-lock.h"
#include "engine/store.h"
#include "engine/view.h"
#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define REBUILDING_NAME DBOX_STORE_INDEX ".rebuilding"
#define BROKEN_PREFIX DBOX_STORE_INDEX ".broken-"

struct dbox_rebuild_note *rebuild_note(struct rebuild *rb,
				       enum dbox_rebuild_note_kind kind,
				       uint32_t file_id, uint64_t offset,
				       const char *reason, const char *fmt, ...)
{
	struct dbox_rebuild_report *rep = rb->rep;
	struct dbox_rebuild_note *notes, *note;
	char *text;
	va_list ap;
	int len;

	va_start(ap, fmt);
	len = vasprintf(&text, fmt, ap);
	va_end(ap);
	if (len < 0)
		return NULL;
	if ((notes = dbox_grow(rep->notes, rep->nnotes, &rb->notes_size,
			       sizeof(*notes))) == NULL) {
		free(text);
		return NULL;
	}
	rep->notes = notes;
	note = &rep->notes[rep->nnotes++];
	*note = (struct dbox_rebuild_note){ .kind = kind, .file_id = file_id,
					    .text = text };
	dbox_fault_set(&note->fault, offset, "%s", reason);
	return note;
}

void dbox_rebuild_report_free(struct dbox_rebuild_report *report)
{
	for (size_t i = 0; i < report->nnotes; i++)
		free(report->notes[i].text);
	free(report->notes);
	free(report->old_index);
	free(report->alt_path);
	free(report->compress);
	memset(report, 0, sizeof(*report));
}

/* A new name index.sqlite.broken-<UTC time>[-n] that is not taken, into
   *name_r (malloc()ed).  Returns 0 or -ENOMEM. */
static int broken_name(int dir_fd, char **name_r)
{
	time_t now = time(NULL);
	char stamp[32];
	struct tm tm;

	gmtime_r(&now, &tm);
	strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &tm);
	*name_r = NULL;
	for (int n = 0; ; n++) {
		free(*name_r);
		if ((n == 0 ? asprintf(name_r, BROKEN_PREFIX "%s", stamp) :
		     asprintf(name_r, BROKEN_PREFIX "%s-%d", stamp, n)) < 0) {
			*name_r = NULL;
			return -ENOMEM;
		}
		if (faccessat(dir_fd, *name_r, F_OK, AT_SYMLINK_NOFOLLOW) < 0)
			return 0;
	}
}

/* dbox_dir_walk callback: the newest index.sqlite.broken-* (by name: a
   UTC time) into *(char **)ctx.  1 to stop when out of memory. */
static int newest_cb(void *ctx, const char *name)
{
	char **best = ctx;
	size_t len = strlen(name);

	if (strncmp(name, BROKEN_PREFIX, strlen(BROKEN_PREFIX)) != 0 ||
	    (len > 4 && (strcmp(name + len - 4, "-wal") == 0 ||
			 strcmp(name + len - 4, "-shm") == 0)) ||
	    (*best != NULL && strcmp(name, *best) <= 0))
		return 0;
	free(*best);
	return (*best = strdup(name)) == NULL;
}

/* Rename index.sqlite (and its -wal, -shm) to a new broken name, which
   report->old_index gets.  Without index.sqlite, report->old_index gets
   the newest index.sqlite.broken-* (or NULL).  Returns 0 or a negative
   errno. */
static int move_old_index(struct rebuild *rb)
{
	static const char *const ext[] = { "", "-wal", "-shm" };
	char *name;
	struct stat sb;
	int ret;

	if (fstatat(rb->dir_fd, DBOX_STORE_INDEX, &sb, AT_SYMLINK_NOFOLLOW) < 0) {
		/* A rebuild cut short: read the newest kept index
		   again. */
		(void)dbox_dir_walk(rb->dir_fd, newest_cb, &rb->rep->old_index);
		rb->rep->old_index_earlier = rb->rep->old_index != NULL;
		return 0;
	}
	if ((ret = broken_name(rb->dir_fd, &name)) < 0)
		return ret;
	for (int i = 0; i < 3; i++) {
		char from[64], to[128];

		snprintf(from, sizeof(from), DBOX_STORE_INDEX "%s", ext[i]);
		snprintf(to, sizeof(to), "%s%s", name, ext[i]);
		if (renameat(rb->dir_fd, from, rb->dir_fd, to) < 0 &&
		    (i == 0 || errno != ENOENT)) {
			ret = -errno;
			dbox_error("%s/%s: cannot move it aside: %s", rb->store,
				   from, strerror(-ret));
			free(name);
			return ret;
		}
	}
	fsync(rb->dir_fd);
	rb->rep->old_index = name;
	return 0;
}

static void remove_rebuilding(int dir_fd)
{
	unlinkat(dir_fd, REBUILDING_NAME, 0);
	unlinkat(dir_fd, REBUILDING_NAME "-wal", 0);
	unlinkat(dir_fd, REBUILDING_NAME "-shm", 0);
}

/* Open the index file name of the store (create: a new one).  Returns 0
   or as dbox_index_open. */
static int open_index_file(struct rebuild *rb, const char *name, bool create,
			   bool readonly, struct dbox_index **index_r)
{
	char *path;
	int ret;

	if (asprintf(&path, "%s/%s", rb->store, name) < 0)
		return -ENOMEM;
	ret = readonly ? dbox_index_open_readonly(path, index_r) :
		dbox_index_open(path, create, index_r);
	free(path);
	return ret;
}

/* The old index moved aside and salvaged (an empty salvage without
   one).  Returns 0 or a negative errno. */
static int salvage_old(struct rebuild *rb)
{
	char *path;
	int ret;

	if ((ret = move_old_index(rb)) < 0)
		return ret;
	if (rb->rep->old_index != NULL) {
		if (asprintf(&path, "%s/%s", rb->store, rb->rep->old_index) < 0)
			return -ENOMEM;
		ret = dbox_index_salvage(path, &(struct dbox_salvage_keys){
			.count_prefix = DBOX_META_ACKED_EMPTY,
			.value_key = DBOX_META_IMPORT_RUNNING,
		}, &rb->old);
		if (ret == 0) {
			rb->rep->acked_empty = rb->old->prefixed;
			rb->rep->import_killed = rb->old->value != 0;
		}
		free(path);
		if (ret < 0)
			return ret;
	}
	if (rb->old == NULL && (rb->old = calloc(1, sizeof(*rb->old))) == NULL)
		return -ENOMEM;
	rb->rep->old_damaged = rb->old->opened && !rb->old->complete;
	return 0;
}

/* The steps of engine/rebuild.h inside the open transaction. */
static int rebuild_steps(struct rebuild *rb)
{
	uint64_t inbox;
	int ret;

	if ((ret = rebuild_scan_storage(rb)) < 0 ||
	    (ret = rebuild_match_old(rb)) < 0 ||
	    (ret = rebuild_tree(rb)) < 0 ||
	    (ret = rebuild_adopt_orphans(rb)) < 0 ||
	    (ret = rebuild_restore_unclaimed(rb)) < 0 ||
	    (ret = rebuild_folder_cur(rb, "INBOX", &inbox)) < 0 ||
	    (ret = dbox_index_rebuild_nlinks(rb->index)) < 0)
		return ret;
	if (rb->old->uidvalidity > 0)
		ret = dbox_index_meta_set(rb->index, "uidvalidity",
					  rb->old->uidvalidity);
	return ret;
}

/* Write the new index as index.sqlite.rebuilding and rename it to
   index.sqlite when complete.  Returns 0 or a negative errno. */
static int run(struct rebuild *rb)
{
	int ret;

	if ((ret = salvage_old(rb)) < 0)
		return ret;
	remove_rebuilding(rb->dir_fd);
	if ((ret = open_index_file(rb, REBUILDING_NAME, true, false,
				   &rb->index)) < 0 ||
	    (ret = dbox_index_begin(rb->index)) < 0)
		return ret;
	if ((ret = rebuild_steps(rb)) < 0) {
		dbox_index_rollback(rb->index);
		return ret;
	}
	ret = dbox_index_commit(rb->index, true);
	dbox_index_close(&rb->index);
	if (ret < 0)
		return ret;
	unlinkat(rb->dir_fd, REBUILDING_NAME "-wal", 0);
	unlinkat(rb->dir_fd, REBUILDING_NAME "-shm", 0);
	if (renameat(rb->dir_fd, REBUILDING_NAME, rb->dir_fd,
		     DBOX_STORE_INDEX) < 0)
		return -errno;
	fsync(rb->dir_fd);
	return 0;
}

/* Counts the m.N an index records in the alternate storage. */
struct alt_count {
	struct dbox_index *index;
	unsigned long files;
};

static int count_alt_cb(void *ctx, uint32_t file_id, uint64_t size)
{
	struct alt_count *ac = ctx;
	bool alt;

	if (dbox_index_mfile_where(ac->index, file_id, &size, &alt) == 0 && alt)
		ac->files++;
	return 0;
}

/* The name (in the store directory, malloc()ed into *name_r) of the
   index the rebuild reads names from: index.sqlite, or without one the
   newest index.sqlite.broken-* an earlier rebuild kept (as
   move_old_index picks it); NULL when there is neither.  Returns 0 or
   -ENOMEM. */
static int old_index_name(struct rebuild *rb, char **name_r)
{
	struct stat sb;

	*name_r = NULL;
	if (fstatat(rb->dir_fd, DBOX_STORE_INDEX, &sb, AT_SYMLINK_NOFOLLOW) == 0)
		return (*name_r = strdup(DBOX_STORE_INDEX)) == NULL ? -ENOMEM : 0;
	return dbox_dir_walk(rb->dir_fd, newest_cb, name_r) == 1 ? -ENOMEM : 0;
}

/* Read the index to be replaced (when it opens; the newest kept one when
   index.sqlite is gone): refused when of a newer format; else the
   alternate storage it records (unless one was given) and how many m.N
   it has there.  Then open that ALT.  Returns 0 (rb->alt_fd set when
   there is an ALT) or a negative errno with rep->stage set. */
static int open_alt(struct rebuild *rb)
{
	struct dbox_rebuild_report *rep = rb->rep;
	struct alt_count ac = { NULL, 0 };
	struct dbox_alt_mark mark = { .index_id = "" };
	char *name, aux[2][128];
	bool had[2];
	int ret, fd;

	if ((ret = old_index_name(rb, &name)) < 0)
		return ret;
	if (name != NULL) {
		snprintf(aux[0], sizeof(aux[0]), "%s-wal", name);
		snprintf(aux[1], sizeof(aux[1]), "%s-shm", name);
		for (int i = 0; i < 2; i++)
			had[i] = faccessat(rb->dir_fd, aux[i], F_OK,
					   AT_SYMLINK_NOFOLLOW) == 0;
		ret = open_index_file(rb, name, false, true, &ac.index);
		free(name);
		if (ret == 0) {
			/* A damaged one: no id (the ALT's mark decides). */
			if (dbox_alt_mark_load(ac.index, &mark) < 0)
				memset(&mark, 0, sizeof(mark));
			if (rep->alt_path == NULL)
				(void)dbox_index_setting_get(
					ac.index, DBOX_SETTING_ALT_PATH,
					&rep->alt_path);
			(void)dbox_index_setting_get(ac.index,
						     DBOX_SETTING_COMPRESS,
						     &rep->compress);
			(void)dbox_index_mfile_list(ac.index, count_alt_cb,
						    &ac);
			dbox_index_close(&ac.index);
		}
		/* The store as it was (a refusal changes nothing): without
		   the -wal and -shm a read-only open may make. */
		for (int i = 0; i < 2; i++)
			if (!had[i])
				unlinkat(rb->dir_fd, aux[i], 0);
	}
	if (ret == -EPROTO) {
		rep->stage = DBOX_REBUILD_NEWER_INDEX;
		return ret;
	}
	rep->alt_files = ac.files;
	if (rep->alt_path == NULL && ac.files > 0) {
		rep->stage = DBOX_REBUILD_ALT_UNKNOWN;
		return -EPROTO;
	}
	if (rep->alt_path == NULL)
		return 0;
	/* An ALT the admin names is taken as the store's, unless its mark
	   says it is another's than the old index's. */
	mark.index_places = ac.files > 0 || rb->opts->alt_path != NULL;
	if ((fd = dbox_store_open_alt_dir(rb->store, rep->alt_path,
					  &mark)) < 0) {
		rep->stage = DBOX_REBUILD_ALT_OPEN;
		return fd;
	}
	memcpy(rb->alt_id, mark.alt_id[0] != '\0' ? mark.alt_id :
	       mark.index_id, sizeof(rb->alt_id));
	rb->alt_fd = fd;
	return 0;
}

/* Open STORE, its storage/ and files/ (made when missing), take the
   lock.  Returns 0 or a negative errno with rep->stage set. */
static int open_store(struct rebuild *rb)
{
	struct dbox_rebuild_report *rep = rb->rep;
	struct stat sb;
	int ret;

	rep->stage = DBOX_REBUILD_OPEN_STORE;
	/* Before the old index is set aside: a new one could not be made
	   there either. */
	if ((ret = dbox_store_path_fits(rb->store)) < 0)
		return ret;
	rb->dir_fd = open(rb->store, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rb->dir_fd < 0 || fstat(rb->dir_fd, &sb) < 0)
		return -errno;
	rb->uid = sb.st_uid;
	rb->gid = sb.st_gid;
	rep->stage = DBOX_REBUILD_NO_STORAGE;
	rb->storage_fd = openat(rb->dir_fd, DBOX_STORE_STORAGE, O_RDONLY |
				O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (rb->storage_fd < 0)
		return -errno;
	rep->stage = DBOX_REBUILD_LOCK;
	if ((rb->lock_fd = dbox_store_lock(rb->dir_fd, rb->store)) < 0)
		return rb->lock_fd;
	if (mkdirat(rb->dir_fd, DBOX_STORE_FILES, 0700) < 0 && errno != EEXIST)
		dbox_warning("%s/%s: %s", rb->store, DBOX_STORE_FILES,
			     strerror(errno));
	rep->stage = DBOX_REBUILD_FILES;
	rb->files_fd = openat(rb->dir_fd, DBOX_STORE_FILES, O_RDONLY |
			      O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	/* Without files/, its plain files would be lost from the new
	   index. */
	if (rb->files_fd < 0 && errno != ENOENT)
		return -errno;
	rep->stage = DBOX_REBUILD_DONE;
	return 0;
}

static void rebuild_free(struct rebuild *rb)
{
	for (size_t i = 0; i < rb->nrecs; i++)
		free(rb->recs[i].mailbox);
	free(rb->recs);
	free(rb->by_guid);
	free(rb->msg_rec);
	free(rb->placed);
	for (size_t i = 0; i < rb->nfolders; i++)
		free(rb->folders[i].mailbox);
	free(rb->folders);
	dbox_index_close(&rb->index);
	dbox_index_salvage_free(&rb->old);
	if (rb->alt_fd >= 0)
		close(rb->alt_fd);
	if (rb->files_fd >= 0)
		close(rb->files_fd);
	if (rb->storage_fd >= 0)
		close(rb->storage_fd);
	if (rb->lock_fd >= 0)
		close(rb->lock_fd);
	if (rb->dir_fd >= 0)
		close(rb->dir_fd);
}

int dbox_rebuild(const char *store, const struct dbox_rebuild_opts *opts,
		 struct dbox_rebuild_report *report)
{
	struct rebuild rb = { .store = store, .opts = opts, .rep = report,
			      .dir_fd = -1, .storage_fd = -1, .files_fd = -1,
			      .alt_fd = -1, .lock_fd = -1, .scan_fd = -1 };
	int ret;

	report->index_format = DBOX_INDEX_FORMAT;
	if (opts->alt_path != NULL &&
	    (report->alt_path = strdup(opts->alt_path)) == NULL)
		return -ENOMEM;
	if ((ret = open_store(&rb)) == 0 && (ret = open_alt(&rb)) == 0) {
		report->stage = DBOX_REBUILD_RUN;
		if ((ret = run(&rb)) < 0) {
			dbox_index_close(&rb.index);
			remove_rebuilding(rb.dir_fd);
		} else {
			report->stage = DBOX_REBUILD_DONE;
		}
	}
	rebuild_free(&rb);
	return ret;
}
