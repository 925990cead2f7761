/*
 * rebuild-scan.c: rebuild step 3 (engine/rebuild.h): every storage/m.N
 * (and ALT/storage/m.N) scanned for whole records (storage/dbox-scan.h),
 * bytes that are no whole record copied to lost+found/, every m.N entered
 * in the new index with its whole size as committed end.
 *
 * Every call into storage/'s parsers (dbox-scan, dbox-read, dbox-format)
 * of a rebuild is in this file.
 */
#include "storage/grow.h"
#include "engine/rebuild-private.h"
#include "engine/store-dirs.h"
#include "engine/store-layout.h"
#include "storage/dbox-file.h"
#include "storage/dbox-read.h"
#include "storage/dbox-scan.h"
#include "storage/io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define IO_SIZE (64 * 1024)

/* The virtual size (CRLF line ends) of a body without V, by reading it
   through the reader the mount uses (every codec); r->vsize is left as
   it is when the body does not read whole. */
static void body_vsize(struct rebuild *rb, struct rrec *r)
{
	uint64_t body = r->offset + DBOX_MSG_HEADER_SIZE, off = 0, vsize = 0;
	struct dbox_reader *reader = NULL;
	uint8_t *buf = malloc(IO_SIZE);
	bool prev_cr = false;
	ssize_t n;

	if (buf == NULL ||
	    dbox_reader_open(rb->scan_fd, body, r->body_size, r->plain_size,
			     &reader) < 0)
		goto out;
	while ((n = dbox_reader_pread(reader, buf, IO_SIZE, off)) > 0) {
		vsize += dbox_vsize_add(buf, (size_t)n, prev_cr, &prev_cr);
		off += (uint64_t)n;
	}
	if (n == 0 && off == r->plain_size)
		r->vsize = vsize;
	else
		rebuild_note(rb, DBOX_REBUILD_NOTE_SIZE, r->file_id, r->offset,
			     "unreadable body", DBOX_STORE_STORAGE "/m.%u offset %llu: "
			     "unreadable body: V taken as stored size",
			     r->file_id, (unsigned long long)r->offset);
out:
	dbox_reader_free(&reader);
	free(buf);
}

/* Plaintext size and virtual size of a body without Z or V.  A
   compressed body without Z has no known plaintext size: it is taken as
   stored. */
static void body_sizes(struct rebuild *rb, struct rrec *r, bool need_plain,
		       bool need_vsize)
{
	uint8_t head[16];
	ssize_t n;

	n = pread(rb->scan_fd, head, r->body_size < sizeof(head) ?
		  r->body_size : sizeof(head),
		  (off_t)(r->offset + DBOX_MSG_HEADER_SIZE));
	if (n > 0 && need_plain &&
	    dbox_detect_compression(head, (size_t)n) != DBOX_COMPRESSION_NONE) {
		rebuild_note(rb, DBOX_REBUILD_NOTE_SIZE, r->file_id, r->offset,
			     "compressed body without Z", DBOX_STORE_STORAGE "/m.%u offset "
			     "%llu: compressed body without Z: size taken as "
			     "stored", r->file_id,
			     (unsigned long long)r->offset);
		return;
	}
	if (need_plain)
		r->plain_size = r->body_size;
	if (need_vsize)
		body_vsize(rb, r);
}

static int scan_cb(void *ctx, uint64_t offset, uint64_t body_size,
		   const struct dbox_metadata *md, uint64_t record_size)
{
	struct rebuild *rb = ctx;
	struct rrec *r;

	if ((r = dbox_grow(rb->recs, rb->nrecs, &rb->recs_size,
			   sizeof(*rb->recs))) == NULL)
		return -ENOMEM;
	rb->recs = r;
	r = &rb->recs[rb->nrecs];
	*r = (struct rrec){
		.file_id = rb->scan_id, .offset = offset,
		.body_size = body_size, .record_size = record_size,
		.received = md->received,
		.plain_size = md->has_plain_size ? md->plain_size : body_size,
		.owner = md->owner,
	};
	r->vsize = md->has_vsize ? md->vsize : r->plain_size;
	memcpy(r->guid, md->guid, sizeof(r->guid));
	if (md->mailbox != NULL && (r->mailbox = strdup(md->mailbox)) == NULL)
		return -ENOMEM;
	if (!md->has_plain_size || !md->has_vsize)
		body_sizes(rb, r, !md->has_plain_size, !md->has_vsize);
	rb->nrecs++;
	if (rb->opts->progress != NULL)
		rb->opts->progress(rb->opts->progress_ctx, record_size);
	return 0;
}

static int scan_bad_cb(void *ctx, uint64_t start, uint64_t end,
		       const struct dbox_fault *fault)
{
	struct rebuild *rb = ctx;
	struct dbox_rebuild_note *note;
	char base[32], copy[DBOX_LOST_FOUND_NAME_SIZE];
	int ret;

	/* As crash recovery keeps the bytes it cuts: a purge of this m.N
	   must not take the only copy of a body whose record no longer
	   parses. */
	snprintf(base, sizeof(base), "m.%u-%llu", rb->scan_id,
		 (unsigned long long)start);
	ret = dbox_lost_found_keep(rb->dir_fd, rb->scan_fd, start, end, base,
				   copy);
	if (ret < 0) {
		rebuild_note(rb, DBOX_REBUILD_NOTE_BAD_BYTES, rb->scan_id,
			     fault->offset, fault->reason, DBOX_STORE_STORAGE "/m.%u: "
			     "bytes [%llu, %llu) are no whole record (%s), and "
			     "no copy could be kept in %s/ (%s)", rb->scan_id,
			     (unsigned long long)start, (unsigned long long)end,
			     fault->reason, DBOX_STORE_LOST_FOUND,
			     strerror(-ret));
		return 0;
	}
	rb->rep->lost_found_copies++;
	note = rebuild_note(rb, DBOX_REBUILD_NOTE_BAD_BYTES, rb->scan_id,
			    fault->offset, fault->reason, DBOX_STORE_STORAGE "/m.%u: bytes "
			    "[%llu, %llu) are no whole record (%s); a copy is "
			    "kept in %s/%s (delete it once 'dboxadm check' "
			    "finds the store clean)", rb->scan_id,
			    (unsigned long long)start, (unsigned long long)end,
			    fault->reason, DBOX_STORE_LOST_FOUND, copy);
	if (note != NULL)
		memcpy(note->copy, copy, sizeof(copy));
	return 0;
}

/* An m.N on disk: its id and whether it is in ALT/storage/. */
struct mfile_id {
	uint32_t id;
	bool alt;
};

static int id_cmp(const void *a, const void *b)
{
	uint32_t x = ((const struct mfile_id *)a)->id,
		 y = ((const struct mfile_id *)b)->id;

	return x < y ? -1 : x > y;
}

/* The m.N of one directory, added to ids. */
struct mfile_list {
	struct mfile_id *ids;
	size_t n, size;
	bool alt;                /* the directory is ALT/storage/ */
};

static int list_cb(void *ctx, const char *name)
{
	struct mfile_list *l = ctx;
	struct mfile_id *ids;
	uint32_t id;

	if (!dbox_mfile_parse_name(name, &id))
		return 0;
	if ((ids = dbox_grow(l->ids, l->n, &l->size, sizeof(*ids))) == NULL)
		return -ENOMEM;
	l->ids = ids;
	l->ids[l->n++] = (struct mfile_id){ id, l->alt };
	return 0;
}

/* Open m.N f for the scan: rb->scan_fd, and its size.  Returns 1 when it
   is to be scanned, 0 when it is left out (noted), or a negative errno. */
static int open_mfile(struct rebuild *rb, const struct mfile_id *f,
		      uint64_t *size_r)
{
	const char *where = f->alt ? "ALT/storage" : DBOX_STORE_STORAGE;
	struct stat sb;
	char name[16];
	int fd;

	dbox_file_name(name, f->id);
	fd = openat(f->alt ? rb->alt_fd : rb->storage_fd, name,
		    O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
		const char *why = fd < 0 ? strerror(errno) :
			"not a regular file";

		rebuild_note(rb, DBOX_REBUILD_NOTE_MFILE, f->id, 0, "skipped",
			     "%s/%s: %s; skipped", where, name, why);
		if (fd >= 0)
			close(fd);
		return 0;
	}
	if (sb.st_size == 0) {
		/* Created by a save that a crash cut before its header
		   line: no record, and no m.N of the index (check calls it
		   a note, purge removes it). */
		rebuild_note(rb, DBOX_REBUILD_NOTE_MFILE, f->id, 0, "empty",
			     "%s/%s: empty; left out of the index", where,
			     name);
		close(fd);
		return 0;
	}
	rb->scan_fd = fd;
	rb->scan_id = f->id;
	*size_r = (uint64_t)sb.st_size;
	return 1;
}

/* Scan one m.N and enter it in the new index.  Returns 0 or a negative
   errno. */
static int scan_mfile(struct rebuild *rb, const struct mfile_id *f)
{
	size_t before = rb->nrecs;
	bool header_ok = true;
	uint64_t size;
	int ret, err;

	if ((ret = open_mfile(rb, f, &size)) <= 0)
		return ret;
	ret = dbox_file_scan(rb->scan_fd, f->id, UINT64_MAX, scan_cb,
			     scan_bad_cb, rb, &header_ok);
	close(rb->scan_fd);
	rb->scan_fd = -1;
	if (ret < 0) {
		/* A read error or a callback's negative errno. */
		err = -ret;
		if (err == ENOMEM)
			return -ENOMEM;
		rebuild_note(rb, DBOX_REBUILD_NOTE_MFILE, f->id, 0,
			     "read error", "%sstorage/m.%u: reading: %s; %zu "
			     "records found before", f->alt ? "ALT/" : "",
			     f->id, strerror(err), rb->nrecs - before);
	}
	if (!header_ok)
		rb->rep->damaged_mfiles++;
	rb->rep->mfiles++;
	return f->alt ? dbox_index_mfile_add_alt(rb->index, f->id, size) :
		dbox_index_mfile_set(rb->index, f->id, size);
}

int rebuild_scan_storage(struct rebuild *rb)
{
	struct mfile_list l = { NULL, 0, 0, false };
	struct mfile_id *ids;
	size_t nids;
	int ret;

	ret = dbox_dir_walk(rb->storage_fd, list_cb, &l);
	l.alt = true;
	if (ret == 0 && rb->alt_fd >= 0)
		ret = dbox_dir_walk(rb->alt_fd, list_cb, &l);
	ids = l.ids;
	nids = l.n;
	if (nids > 1)
		qsort(ids, nids, sizeof(*ids), id_cmp);
	for (size_t i = 0; i < nids && ret == 0; i++) {
		if (i > 0 && ids[i].id == ids[i - 1].id) {
			rebuild_note(rb, DBOX_REBUILD_NOTE_MFILE, ids[i].id, 0,
				     "in " DBOX_STORE_STORAGE "/ and ALT", "m.%u is both in "
				     DBOX_STORE_STORAGE "/ and in the alternate storage; "
				     "the one in %s is ignored", ids[i].id,
				     ids[i].alt ? "the alternate storage" :
				     DBOX_STORE_STORAGE "/");
			continue;
		}
		ret = scan_mfile(rb, &ids[i]);
	}
	if (ret == 0 && rb->rep->alt_path != NULL)
		ret = dbox_index_setting_set(rb->index, DBOX_SETTING_ALT_PATH,
					     rb->rep->alt_path);
	if (ret == 0 && rb->alt_id[0] != '\0')
		ret = dbox_index_setting_set(rb->index, DBOX_SETTING_ALT_ID,
					     rb->alt_id);
	if (ret == 0 && rb->rep->compress != NULL)
		ret = dbox_index_setting_set(rb->index, DBOX_SETTING_COMPRESS,
					     rb->rep->compress);
	free(ids);
	return ret;
}

int rebuild_record_in_place(struct rebuild *rb,
			    const struct dbox_salvage_msg *m,
			    bool *header_ok_r)
{
	uint8_t hdr[DBOX_MSG_HEADER_SIZE];
	uint64_t body_size = 0;
	struct stat sb;
	char name[16];
	bool ok;
	int fd;

	dbox_file_name(name, m->file_id);
	fd = openat(rb->storage_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
		    O_CLOEXEC);
	if (fd < 0 && errno == ENOENT && rb->alt_fd >= 0)
		fd = openat(rb->alt_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
			    O_CLOEXEC);
	if (fd < 0)
		return 0;
	ok = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) &&
		m->offset + m->record_size <= (uint64_t)sb.st_size &&
		pread(fd, hdr, sizeof(hdr), (off_t)m->offset) ==
		(ssize_t)sizeof(hdr);
	*header_ok_r = ok && dbox_msg_header_parse(hdr, &body_size, NULL) == 0 &&
		body_size == m->body_size;
	close(fd);
	return ok;
}
