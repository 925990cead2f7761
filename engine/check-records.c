/*
 * check-records.c: each committed message of the index against the record
 * the scan of its m.N found at its offset (check-mfile.c), and every
 * compressed body decoded to its end (storage/dbox-read.h).
 */
#include "engine/check-private.h"
#include "engine/store-layout.h"

#include "index/index-check.h"
#include "storage/dbox-read.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const struct check_rec *rec_at(const struct check_mfile *f,
				      uint64_t offset)
{
	size_t lo = 0, hi = f->nrecs;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (f->recs[mid].offset == offset)
			return &f->recs[mid];
		if (f->recs[mid].offset < offset)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static struct check_bad *bad_at(const struct check_mfile *f, uint64_t offset)
{
	for (size_t i = 0; i < f->nbads; i++)
		if (offset >= f->bads[i].start && offset < f->bads[i].end)
			return &f->bads[i];
	return NULL;
}

/* A read-only descriptor of m.N of f for body reads, kept open for the
   messages of one file after another (messages come in file order).
   Returns the fd or a negative errno. */
static int body_fd(struct check *c, const struct check_mfile *f)
{
	if (c->body_fd >= 0 && c->body_fd_id == f->id)
		return c->body_fd;
	if (c->body_fd >= 0)
		close(c->body_fd);
	c->body_fd = check_mfile_open(c, f);
	c->body_fd_id = f->id;
	return c->body_fd;
}

/* Is the body at offset compressed (so its size says nothing)? */
static bool body_compressed(struct check *c, const struct check_mfile *f,
			    uint64_t offset)
{
	char head[16];
	ssize_t n = -1;
	int fd = body_fd(c, f);

	if (fd >= 0)
		n = pread(fd, head, sizeof(head), (off_t)(offset +
							 DBOX_MSG_HEADER_SIZE));
	return n > 0 && dbox_detect_compression(head, (size_t)n) !=
		DBOX_COMPRESSION_NONE;
}

static void msg_problem(struct check *c, const struct dbox_check_msg *m,
			enum dbox_check_kind kind, const char *reason,
			const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* A problem with message m, named by its path. */
static void msg_problem(struct check *c, const struct dbox_check_msg *m,
			enum dbox_check_kind kind, const char *reason,
			const char *fmt, ...)
{
	char what[1024], *path = NULL;
	struct check_at at = { .file_id = m->loc.file_id,
			       .offset = m->loc.offset, .ino = m->ino,
			       .reason = reason };
	va_list args;

	va_start(args, fmt);
	vsnprintf(what, sizeof(what), fmt, args);
	va_end(args);
	dbox_index_check_path(c->index, m->ino, &path);
	check_problem(c, kind, &at, "message %s (inode %llu, m.%u offset "
		      "%llu): %s", path != NULL ? path : "?",
		      (unsigned long long)m->ino, m->loc.file_id,
		      (unsigned long long)m->loc.offset, what);
	free(path);
}

/* Decode the compressed body of m's record r to its end through the
   mount's own reader (dbox-read.h), so the codec's own checks run (gzip
   CRC32 and ISIZE, bzip2 block CRCs, xz and zstd checksums; Dovecot's lz4
   container has none, only its structure is checked) and the plaintext
   must be exactly the size the mount reads (the inode size).  Memory: the
   reader's buffers and body_buf, whatever the body size. */
static void verify_body(struct check *c, const struct check_mfile *f,
			const struct dbox_check_msg *m,
			const struct check_rec *r)
{
	struct dbox_reader *reader = NULL;
	struct dbox_fault fault = { 0 };
	char reason[sizeof(fault.reason) + 64];
	uint64_t off = 0;
	ssize_t n = 0;
	int fd = body_fd(c, f);

	if (fd < 0 || (c->body_buf == NULL &&
		       (c->body_buf = malloc(CHECK_BODY_BUF)) == NULL))
		return;
	if (dbox_reader_open(fd, r->offset + DBOX_MSG_HEADER_SIZE,
			     r->body_size, m->size, &reader) < 0)
		return;
	if (dbox_reader_compression(reader) == DBOX_COMPRESSION_NONE) {
		dbox_reader_free(&reader);
		return;
	}
	while (off < m->size &&
	       (n = dbox_reader_pread_fault(reader, c->body_buf, CHECK_BODY_BUF,
					    off, &fault)) > 0)
		off += (uint64_t)n;
	dbox_reader_free(&reader);
	if (off >= m->size)
		return;
	if (n == -DBOX_ECORRUPT)
		snprintf(reason, sizeof(reason), "%s/m.%u offset %llu: %s",
			 DBOX_STORE_STORAGE, m->loc.file_id,
			 (unsigned long long)r->offset, fault.reason);
	else
		snprintf(reason, sizeof(reason), "%s",
			 strerror(n == 0 ? EIO : (int)-n));
	msg_problem(c, m, DBOX_CHECK_BODY, reason, "the compressed body is "
		    "damaged: %s: unreadable (EIO)", reason);
}

/* m has no whole record at its offset. */
static void no_record(struct check *c, struct check_mfile *f,
		      const struct dbox_check_msg *m)
{
	struct check_bad *b = bad_at(f, m->loc.offset);

	if (b != NULL)
		b->used = true;
	if (m->loc.offset >= f->size)
		msg_problem(c, m, DBOX_CHECK_MESSAGE, NULL, "the record is past "
			    "the end of the file: unreadable (EIO)");
	else if (b != NULL)
		msg_problem(c, m, DBOX_CHECK_MESSAGE, b->reason, "the record "
			    "is damaged%s%s: unreadable (EIO)", b->reason !=
			    NULL ? ": " : "", b->reason != NULL ? b->reason : "");
	else
		msg_problem(c, m, DBOX_CHECK_MESSAGE, NULL, "no record starts at "
			    "this offset");
}

/* m against its record r: sizes, GUID, V, plaintext size, the body. */
static void compare_record(struct check *c, const struct check_mfile *f,
			   const struct dbox_check_msg *m,
			   const struct check_rec *r)
{
	if (r->body_size != m->loc.body_size)
		msg_problem(c, m, DBOX_CHECK_MESSAGE, NULL, "body size %llu, "
			    "the index says %llu",
			    (unsigned long long)r->body_size,
			    (unsigned long long)m->loc.body_size);
	if (r->record_size != m->loc.record_size)
		msg_problem(c, m, DBOX_CHECK_MESSAGE, NULL, "record size %llu, "
			    "the index says %llu",
			    (unsigned long long)r->record_size,
			    (unsigned long long)m->loc.record_size);
	/* The index keeps a GUID's first 32 characters (foreign GUIDs may
	   be longer). */
	if (strncmp(r->guid, m->loc.guid, sizeof(m->loc.guid) - 1) != 0)
		msg_problem(c, m, DBOX_CHECK_MESSAGE, NULL, "GUID '%s', the "
			    "index says '%s'", r->guid, m->loc.guid);
	if (r->has_vsize && r->vsize != m->loc.vsize)
		msg_problem(c, m, DBOX_CHECK_MESSAGE, NULL, "virtual size (V) "
			    "%llu, the index says %llu",
			    (unsigned long long)r->vsize,
			    (unsigned long long)m->loc.vsize);
	if (r->has_plain_size ? r->plain_size != m->size :
	    r->body_size != m->size && !body_compressed(c, f, r->offset))
		msg_problem(c, m, DBOX_CHECK_MESSAGE, NULL, "plaintext size "
			    "%llu, the index says %llu",
			    (unsigned long long)(r->has_plain_size ?
						 r->plain_size : r->body_size),
			    (unsigned long long)m->size);
	if (r->body_size == m->loc.body_size)
		verify_body(c, f, m, r);
}

static int msg_cb(void *ctx, const struct dbox_check_msg *m)
{
	struct check *c = ctx;
	const struct check_rec *r;
	struct check_mfile *f;
	int ret;

	if (m->loc.state != DBOX_MSG_COMMITTED)
		return 0; /* being written: counted as pending */
	if ((ret = check_mfiles_scan_upto(c, m->loc.file_id)) != 0)
		return ret;
	c->sum->messages++;
	f = check_mfile_get(c, m->loc.file_id);
	if (f == NULL || !f->known)
		return 0; /* reported by the namespace check */
	if (f->vanished)
		return 0; /* purged meanwhile: noted once for the file */
	if (!f->exists) {
		char shown[PATH_MAX + 32];

		check_mfile_shown(c, f, shown, sizeof(shown));
		if (check_mfile_away(c, f))
			msg_problem(c, m, DBOX_CHECK_STORAGE, NULL, "%s is "
				    "not reachable: unreadable (EIO) until "
				    "its storage is back", shown);
		else
			msg_problem(c, m, DBOX_CHECK_MESSAGE, NULL, "%s is "
				    "missing: unreadable (EIO)", shown);
	} else if ((r = rec_at(f, m->loc.offset)) == NULL)
		no_record(c, f, m);
	else
		compare_record(c, f, m, r);
	return 0;
}

int check_messages(struct check *c)
{
	int ret = dbox_index_check_messages(c->index, msg_cb, c);

	if (ret == 0)
		ret = check_mfiles_scan_upto(c, UINT32_MAX);
	return ret;
}
