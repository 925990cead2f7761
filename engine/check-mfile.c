/*
 * check-mfile.c: the m.N side of dbox_check_store (check.h): the files the
 * index knows and the files storage/ and ALT/storage/ hold, each scanned
 * record by record (storage/dbox-scan.h), its damaged regions and the
 * bytes past its committed end judged.
 */
#include "engine/check-private.h"
#include "engine/store-layout.h"
#include "engine/store.h"

#include "index/index-stats.h"
#include "storage/dbox-file.h"
#include "storage/dbox-scan.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct check_mfile *check_mfile_get(struct check *c, uint32_t id)
{
	for (size_t i = 0; i < c->nfiles; i++)
		if (c->files[i].id == id)
			return &c->files[i];
	return NULL;
}

/* The m.N of id, added when new.  NULL: out of memory. */
static struct check_mfile *file_add(struct check *c, uint32_t id)
{
	struct check_mfile *f = check_mfile_get(c, id);

	if (f != NULL)
		return f;
	if (c->nfiles == c->files_size) {
		size_t size = c->files_size == 0 ? 64 : c->files_size * 2;

		f = realloc(c->files, size * sizeof(*f));
		if (f == NULL)
			return NULL;
		c->files = f;
		c->files_size = size;
	}
	f = &c->files[c->nfiles++];
	memset(f, 0, sizeof(*f));
	f->id = id;
	return f;
}

void check_mfiles_free(struct check *c)
{
	for (size_t i = 0; i < c->nfiles; i++) {
		free(c->files[i].recs);
		for (size_t j = 0; j < c->files[i].nbads; j++)
			free(c->files[i].bads[j].reason);
		free(c->files[i].bads);
	}
	free(c->files);
	c->files = NULL;
	c->nfiles = 0;
}

static int known_cb(void *ctx, uint32_t file_id, uint64_t size)
{
	struct check *c = ctx;
	struct check_mfile *f = file_add(c, file_id);

	if (f == NULL)
		return -ENOMEM;
	f->known = true;
	f->committed = size;
	(void)dbox_index_mfile_where(c->index, file_id, &size, &f->alt);
	return 0;
}

static const char *where_name(bool alt)
{
	return alt ? "the alternate storage" : DBOX_STORE_STORAGE "/";
}

/* One entry of storage/ (or ALT/storage/): an m.N into c->files. */
static int list_one(struct check *c, int dir_fd, bool alt, const char *name)
{
	struct check_mfile *f;
	struct stat sb;
	uint32_t id;

	if (!dbox_mfile_parse_name(name, &id) ||
	    fstatat(dir_fd, name, &sb, AT_SYMLINK_NOFOLLOW) < 0)
		return 0; /* no m.N, or gone since readdir (a purge) */
	if (!S_ISREG(sb.st_mode)) {
		check_problem(c, DBOX_CHECK_MFILE, &(struct check_at){
				      .file_id = id },
			      "%s%s%s/%s is not a regular file (%s); dboxfs "
			      "never follows it", alt && c->alt_shown ?
			      c->alt_shown : "", alt && c->alt_shown ? "/" : "",
			      DBOX_STORE_STORAGE, name, S_ISLNK(sb.st_mode) ?
			      "a symbolic link" : "a special file");
		return 0;
	}
	if ((f = file_add(c, id)) == NULL)
		return -ENOMEM;
	if (f->exists) {
		check_problem(c, DBOX_CHECK_MFILE, &(struct check_at){
				      .file_id = id },
			      "m.%u is both in %s/ and in the alternate "
			      "storage", id, DBOX_STORE_STORAGE);
		return 0;
	}
	f->exists = true;
	f->on_alt = alt;
	f->size = (uint64_t)sb.st_size;
	f->purged = !f->known && dbox_store_purged_file(c->index, f->id, &sb);
	if (f->known && f->alt != alt)
		check_problem(c, DBOX_CHECK_MFILE, &(struct check_at){
				      .file_id = id },
			      "%s/%s: the index says it is in %s, but it is "
			      "in %s", DBOX_STORE_STORAGE, name,
			      where_name(f->alt), where_name(alt));
	return 0;
}

/* What storage/ (or ALT/storage/) holds. */
static int list_storage(struct check *c, bool alt)
{
	int dir_fd = alt ? c->view->alt_fd : c->view->storage_fd;
	DIR *d = fdopendir(dup(dir_fd));
	struct dirent *de;
	int ret = 0;

	if (d == NULL)
		return -errno;
	rewinddir(d);
	while (ret == 0 && (de = readdir(d)) != NULL)
		ret = list_one(c, dir_fd, alt, de->d_name);
	closedir(d);
	return ret;
}

static int file_cmp(const void *a, const void *b)
{
	uint32_t x = ((const struct check_mfile *)a)->id,
		 y = ((const struct check_mfile *)b)->id;

	return x < y ? -1 : x > y;
}

int check_mfiles_list(struct check *c)
{
	int ret;

	if ((ret = dbox_index_mfile_list(c->index, known_cb, c)) < 0)
		return ret;
	if (c->view->storage_fd >= 0 && (ret = list_storage(c, false)) < 0)
		return ret;
	if (c->view->alt_fd >= 0 && (ret = list_storage(c, true)) < 0)
		return ret;
	if (c->nfiles > 1)
		qsort(c->files, c->nfiles, sizeof(*c->files), file_cmp);
	return 0;
}

int check_mfile_open(const struct check *c, const struct check_mfile *f)
{
	char name[16];
	int fd;

	dbox_file_name(name, f->id);
	fd = openat(f->on_alt ? c->view->alt_fd : c->view->storage_fd, name,
		    O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

bool check_mfile_away(const struct check *c, const struct check_mfile *f)
{
	return f->alt ? c->view->alt_err < 0 : c->view->storage_err < 0;
}

void check_mfile_shown(const struct check *c, const struct check_mfile *f,
		       char *buf, size_t size)
{
	bool alt = f->exists ? f->on_alt : f->alt;

	if (alt && c->alt_shown != NULL)
		snprintf(buf, size, "%s/%s/m.%u", c->alt_shown,
			 DBOX_STORE_STORAGE, f->id);
	else
		snprintf(buf, size, "%s/m.%u", DBOX_STORE_STORAGE, f->id);
}

static int rec_cb(void *ctx, uint64_t offset, uint64_t body_size,
		  const struct dbox_metadata *md, uint64_t record_size)
{
	struct check *c = ctx;
	struct check_mfile *f = &c->files[c->next_scan];
	struct check_rec *r;

	if (f->nrecs == f->recs_size) {
		size_t size = f->recs_size == 0 ? 64 : f->recs_size * 2;

		r = realloc(f->recs, size * sizeof(*r));
		if (r == NULL)
			return -ENOMEM;
		f->recs = r;
		f->recs_size = size;
	}
	r = &f->recs[f->nrecs++];
	r->offset = offset;
	r->body_size = body_size;
	r->record_size = record_size;
	r->vsize = md->vsize;
	r->has_vsize = md->has_vsize;
	r->plain_size = md->plain_size;
	r->has_plain_size = md->has_plain_size;
	memcpy(r->guid, md->guid, sizeof(r->guid));
	c->sum->records++;
	if (c->progress != NULL)
		c->progress(c->ctx, 1, record_size);
	return 0;
}

static int bad_cb(void *ctx, uint64_t start, uint64_t end,
		  const struct dbox_fault *fault)
{
	struct check *c = ctx;
	struct check_mfile *f = &c->files[c->next_scan];
	struct check_bad *b = realloc(f->bads, (f->nbads + 1) * sizeof(*b));

	if (b == NULL)
		return -ENOMEM;
	f->bads = b;
	b += f->nbads;
	memset(b, 0, sizeof(*b));
	b->start = start;
	b->end = end;
	if (asprintf(&b->reason, "m.%u offset %llu: %s", f->id,
		     (unsigned long long)fault->offset, fault->reason) < 0)
		b->reason = NULL;
	f->nbads++;
	return 0;
}

/* Report the damaged regions of a scanned file whose messages were all
   verified: damage where a message of the index (or of no index, for an
   unknown file) lives is a problem; damage in bytes no message uses (a
   record a crash cut while it was being rewritten) loses nothing. */
static void report_bads(struct check *c, const struct check_mfile *f)
{
	char shown[PATH_MAX + 32];

	check_mfile_shown(c, f, shown, sizeof(shown));
	for (size_t i = 0; i < f->nbads; i++) {
		const struct check_bad *b = &f->bads[i];
		const char *reason = b->reason != NULL ? b->reason : "";
		const char *sep = *reason ? ": " : "";
		struct check_at at = { .file_id = f->id, .offset = b->start,
				       .end = b->end, .reason = reason };

		if (b->used)
			check_problem(c, DBOX_CHECK_REGION, &at, "%s: bytes "
				      "[%llu, %llu) are no whole record%s%s",
				      shown, (unsigned long long)b->start,
				      (unsigned long long)b->end, sep, reason);
		else if (!f->known)
			/* A file whose creation never committed: a record cut
			   by a crash while it was written, like the others in
			   it uncommitted (the next mount cuts the file). */
			check_note(c, DBOX_CHECK_REGION, &at, "%s: bytes [%llu, "
				   "%llu) are an unfinished record in a file the "
				   "index does not know%s%s", shown,
				   (unsigned long long)b->start,
				   (unsigned long long)b->end, sep, reason);
		else
			check_note(c, DBOX_CHECK_REGION, &at, "%s: bytes [%llu, "
				   "%llu) are damaged but hold no message of the "
				   "index%s%s", shown, (unsigned long long)b->start,
				   (unsigned long long)b->end, sep, reason);
	}
}

/* The bytes of a known m.N past its committed end, judged as the next
   mount's recovery judges them (engine/store.c): whole records before the
   record in flight (a WRITING row's, or inflight.m.N), or kept by an
   earlier recovery (kept.m.N), are messages the index does not know - an
   index older than storage/ - and a problem ('dboxadm rebuild' brings
   them back); the rest is an unfinished write, which the mount cuts.
   While mounted, only what recovery kept is judged: the rest is the
   mount's own work. */
static void check_tail(struct check *c, const struct check_mfile *f, int fd,
		       const char *name)
{
	int64_t inflight, mark;
	uint64_t start, end, committed = f->committed;
	long whole = 0, kept_whole = 0;
	struct check_at at = { .file_id = f->id, .offset = f->committed };

	/* Records sealed with their path, whose rows a crash took (the
	   create of a delivery is a deferred commit: a kill between its
	   close's seal and commit leaves one), the next mount puts back
	   first (store-restore.c): a note, and the rest judged from after
	   them, as recovery does. */
	if (c->offline && !c->import_killed) {
		size_t back;

		mark = dbox_store_copy_mark(c->index, f->id, committed, f->size);
		end = dbox_store_restorable_end(fd, f->id, committed, mark < 0 ?
						UINT64_MAX : (uint64_t)mark,
						&back);
		if (back > 0) {
			at.end = end;
			check_note(c, DBOX_CHECK_TAIL, &at, "%s: %zu records "
				   "after the committed end %llu are mail "
				   "whose index rows a crash lost; the next "
				   "mount puts them back at their paths",
				   name, back, (unsigned long long)committed);
			committed = end;
			at.offset = end;
		}
	}
	if (f->size <= committed)
		return;
	dbox_store_tail_state(c->index, f->id, committed, f->size, &inflight,
			      &start);
	/* A killed import's records are in flight from the committed end
	   on, as recovery takes them (store-recover.c). */
	if (c->import_killed && inflight < 0)
		inflight = (int64_t)start;
	if (start > committed)
		kept_whole = dbox_file_tail_records(fd, f->id, committed,
						    start, &end, NULL, NULL);
	if (c->offline && (inflight < 0 || (uint64_t)inflight > start))
		whole = dbox_file_tail_records(fd, f->id, start, inflight < 0 ?
					       UINT64_MAX : (uint64_t)inflight,
					       &end, NULL, NULL);
	else
		end = start;
	whole = (whole > 0 ? whole : 0) + (kept_whole > 0 ? kept_whole : 0);
	at.end = f->size;
	if (whole > 0)
		check_problem(c, DBOX_CHECK_TAIL, &at, "%s: %ld whole records "
			      "after the committed end %llu are unknown to the "
			      "index (is the index older than "
			      DBOX_STORE_STORAGE "/?); "
			      "'dboxadm rebuild' brings them back", name, whole,
			      (unsigned long long)committed);
	if (c->offline && f->size > end) {
		uint64_t e;
		/* As recovery judges it (store-recover.c): only a record in
		   flight that is not whole yet, or whole copies of messages
		   the index has, go without a copy; one with no row is told
		   by its placeholder header. */
		bool at_mark, only_inflight, copies = false;
		long n = 0;

		if (inflight < 0 && dbox_append_unsealed_at(fd, end))
			inflight = (int64_t)end;
		at_mark = inflight >= 0 && (uint64_t)inflight == end;
		only_inflight = at_mark &&
			dbox_file_tail_records(fd, f->id, end, UINT64_MAX, &e,
					       NULL, NULL) == 0;
		if (at_mark && !only_inflight)
			copies = dbox_store_tail_copies(c->index,
							c->view->storage_fd,
							c->view->alt_fd, fd,
							f->id, end, &n);

		at.offset = end;
		if (copies)
			check_note(c, DBOX_CHECK_TAIL, &at, "%s: %llu bytes after "
				   "%llu, an unfinished purge or rewrite: %ld "
				   "whole records are copies of messages the "
				   "index has at their old place (the next "
				   "mount cuts them; nothing is lost)", name,
				   (unsigned long long)(f->size - end),
				   (unsigned long long)end, n);
		else
			check_note(c, DBOX_CHECK_TAIL, &at, "%s: %llu bytes "
				   "after %llu, an unfinished write (the next "
				   "mount cuts them%s)", name,
				   (unsigned long long)(f->size - end),
				   (unsigned long long)end, only_inflight ? "" :
				   ", keeping a copy in "
				   DBOX_STORE_LOST_FOUND "/");
	}
}

/* What the scan of f found that concerns the file as a whole. */
static void judge_file(struct check *c, const struct check_mfile *f,
		       const char *shown, bool header_ok)
{
	struct check_at at = { .file_id = f->id };

	if (!header_ok)
		check_problem(c, DBOX_CHECK_MFILE, &at, "%s: the file header "
			      "line is not \"2 M1e C...\"", shown);
	else if (!f->known && f->nrecs > 0 &&
		 f->purged)
		check_note(c, DBOX_CHECK_MFILE, &at, "%s was purged: its %zu "
			   "records are copies left by a crash before its "
			   "removal (the next purge removes it)", shown,
			   f->nrecs);
	else if (!f->known && f->nrecs > 0 && c->import_killed)
		check_note(c, DBOX_CHECK_MFILE, &at, "%s is not in the index: "
			   "its %zu whole records are the killed import's "
			   "uncommitted work (the next mount or import cuts "
			   "them, keeping a copy in " DBOX_STORE_LOST_FOUND "/; "
			   "the import run again imports them again)", shown,
			   f->nrecs);
	else if (!f->known && f->nrecs > 0)
		/* A file whose creation never committed holds no whole
		   record (a save commits its file before writing to it):
		   these are messages of an index newer than this one. */
		check_problem(c, DBOX_CHECK_MFILE, &at, "%s is not in the "
			      "index: its %zu whole records are unknown to the "
			      "index (is the index older than "
			      DBOX_STORE_STORAGE "/?); "
			      "'dboxadm rebuild' brings them back", shown,
			      f->nrecs);
	else if (!f->known && f->nbads > 0)
		check_note(c, DBOX_CHECK_MFILE, &at, "%s is not in the index: "
			   "bytes of an uncommitted write, which the next mount "
			   "cuts off", shown);
	else if (!f->known)
		check_note(c, DBOX_CHECK_MFILE, &at, "%s is not in the index "
			   "and holds no record (a new file whose creation a "
			   "crash cut)", shown);
}

bool check_mfile_vanished(struct check *c, struct check_mfile *f)
{
	struct dbox_view *now;
	uint64_t size;

	if (c->offline || !f->known)
		return false;
	if (!f->vanish_asked) {
		f->vanish_asked = true;
		if (dbox_view_open(c->view->path, &now) == 0) {
			f->vanished = dbox_index_mfile_get(now->index, f->id,
							   &size) == -ENOENT;
			dbox_view_close(&now);
		}
	}
	return f->vanished;
}

/* The note for an m.N the mount's purge removed while check ran. */
static void note_vanished(struct check *c, const struct check_mfile *f,
			  const char *shown)
{
	check_note(c, DBOX_CHECK_MFILE, &(struct check_at){ .file_id = f->id },
		   "%s was purged by the mount while check ran; its messages "
		   "are checked in their new place by the next check", shown);
}

/* Whether to scan f, and up to where (*end_r); why not is reported
   here. */
static bool scan_end(struct check *c, struct check_mfile *f,
		     const char *shown, uint64_t *end_r)
{
	struct check_at at = { .file_id = f->id };

	if (!f->exists && check_mfile_vanished(c, f)) {
		note_vanished(c, f, shown);
		return false;
	}
	if (!f->exists) {
		/* Messages in it are reported one by one; without any the
		   file is no loss. */
		check_note(c, DBOX_CHECK_MFILE, &at, "the index knows %s, which "
			   "is %s", shown, check_mfile_away(c, f) ?
			   "not reachable (see above)" : "not there");
		return false;
	}
	if (!f->known && !c->offline) {
		check_note(c, DBOX_CHECK_MFILE, &at, "%s is not in this "
			   "snapshot of the index (being created by the "
			   "mount?); not checked", shown);
		return false;
	}
	if (!f->known && f->size == 0) {
		check_note(c, DBOX_CHECK_MFILE, &at, "%s is empty and not in "
			   "the index (a new file whose creation a crash cut)",
			   shown);
		return false;
	}
	*end_r = f->known && f->size >= f->committed ? f->committed : f->size;
	if (f->known && f->size < f->committed)
		check_problem(c, DBOX_CHECK_MFILE, &at, "%s is %llu bytes, "
			      "shorter than its committed end %llu: its end is "
			      "lost", shown, (unsigned long long)f->size,
			      (unsigned long long)f->committed);
	return true;
}

/* Scan files[next_scan] and report what is wrong with it as a file. */
static int scan_one(struct check *c)
{
	struct check_mfile *f = &c->files[c->next_scan];
	char shown[PATH_MAX + 32];
	bool header_ok = true;
	uint64_t end;
	int fd, ret;

	check_mfile_shown(c, f, shown, sizeof(shown));
	if (!scan_end(c, f, shown, &end))
		return 0;
	if ((fd = check_mfile_open(c, f)) < 0) {
		if (fd == -ENOENT && check_mfile_vanished(c, f))
			note_vanished(c, f, shown);
		else
			check_problem(c, DBOX_CHECK_MFILE, &(struct check_at){
					      .file_id = f->id },
				      "%s: %s", shown, strerror(-fd));
		return 0;
	}
	if (f->known && f->size > f->committed)
		check_tail(c, f, fd, shown);
	ret = dbox_file_scan(fd, f->id, end, rec_cb, bad_cb, c, &header_ok);
	if (ret < 0 && ret != -ENOMEM) {
		check_problem(c, DBOX_CHECK_MFILE, &(struct check_at){
				      .file_id = f->id },
			      "%s: reading: %s", shown, strerror(-ret));
		ret = 0;
	}
	judge_file(c, f, shown, header_ok);
	close(fd);
	return ret;
}

int check_mfiles_scan_upto(struct check *c, uint32_t id)
{
	int ret;

	while (c->next_scan < c->nfiles && c->files[c->next_scan].id <= id) {
		if (c->next_scan > 0)
			report_bads(c, &c->files[c->next_scan - 1]);
		if ((ret = scan_one(c)) != 0)
			return ret;
		c->next_scan++;
	}
	if (id == UINT32_MAX && c->next_scan > 0)
		report_bads(c, &c->files[c->next_scan - 1]);
	return 0;
}
