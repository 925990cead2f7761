/*
 * check.c: dboxadm check STORE [--json] - verify a store and report every
 * problem, without changing anything:
 *
 *   index.sqlite  SQLite's integrity check; the namespace invariants
 *                 (index-check.h): names, link counts, directories,
 *                 message rows, committed ends
 *   storage/m.N   every file scanned record by record (dbox-scan.h):
 *                 bytes that are no whole record are reported; each
 *                 committed message of the index must have its record at
 *                 its offset with the same body size, record size, GUID,
 *                 V (virtual size) and plaintext size (Z, or the body size
 *                 of an uncompressed body); every compressed body is
 *                 decoded to its end (verify_body); files shorter than their
 *                 committed end; m.N files the index does not know
 *   files/        every plain file of the index has its regular file
 *                 STORE/files/<ino> (not a symlink), and every file there
 *                 belongs to a plain file
 *
 * Offline (nobody holds the store lock), check takes the lock shared, so
 * no mount starts meanwhile, and everything is checked.  While the store
 * is mounted it reads one snapshot of the index and each m.N up to the
 * committed end of that snapshot; what a live mount is in the middle of
 * (messages being written, m.N files and plain files being created) is
 * not checked.  States crash recovery cleans up at the next mount are
 * notes, not problems.
 *
 * Output: one "problem: ..." line per problem on stdout, notes as
 * "note: ...", then a summary line; with --json one JSON object.  Exit
 * status 0 clean, 1 problems found, 2 usage error or no store.
 */
#include "engine/store-layout.h"
#include "dboxadm.h"
#include "progress.h"

#include "index/index-check.h"
#include "index/index-stats.h"
#include "index/index.h"
#include "engine/store.h"
#include "storage/dbox-file.h"
#include "storage/dbox-read.h"
#include "storage/dbox-scan.h"
#include "storage/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* One whole record found in an m.N. */
struct rec {
	uint64_t offset, body_size, record_size;
	uint64_t vsize, plain_size;
	bool has_vsize, has_plain_size;
	char guid[DBOX_GUID_HEX_LEN * 2 + 1];
};

/* A region of an m.N that is no whole record, and why. */
struct bad {
	uint64_t start, end;
	char *reason;
	bool used;             /* a message of the index has its record here */
};

/* One m.N, as the index and the disk know it. */
struct mfile {
	uint32_t id;
	bool known;            /* in the index's mfile table */
	bool exists;           /* a regular file in storage/ or ALT/storage/ */
	bool alt;              /* the index says: in ALT/storage/ */
	bool on_alt;           /* found in ALT/storage/ */
	uint64_t committed;    /* the index's committed end */
	uint64_t size;         /* on disk */
	bool scanned;
	struct rec *recs;
	size_t nrecs, recs_size;
	struct bad *bads;
	size_t nbads;
};

struct strs {
	char **v;
	size_t n, size;
};

struct check {
	const char *store;
	struct dbox_index *index;
	bool offline;          /* we hold the store lock (shared) */
	bool json;
	int storage_fd, files_fd;
	int alt_fd;            /* ALT/storage/ of the recorded ALT, or -1 */
	char *alt_path;        /* that ALT (for messages), or NULL */
	struct progress progress;
	struct strs problems, notes;
	struct mfile *files;
	size_t nfiles, files_size;
	size_t next_scan;      /* files[] below this are scanned */
	uint64_t *file_inos;   /* plain-file inodes, ascending */
	size_t nfile_inos, file_inos_size;
	uint64_t messages, records, record_bytes;
	uint64_t decoded;      /* compressed bodies decoded to their end */
	int body_fd;           /* storage/m.<body_fd_id> for body reads, or -1 */
	uint32_t body_fd_id;
	uint8_t *body_buf;     /* VERIFY_BUF_SIZE */
};

/* Plaintext decoded per read when verifying a compressed body. */
#define VERIFY_BUF_SIZE (64 * 1024)

/* The log sink while scanning: storage/ says why a record is bad; keep
   those reasons, one per line, for the problem line instead of printing
   them.  A damaged region can log several (the read at its start, then
   reads of candidates inside it), so bad_cb picks the one about the
   region's own start.  At most CAPTURE_MAX bytes are kept. */
#define CAPTURE_MAX (64 * 1024)
static char *captured;
static size_t captured_len;
static bool capturing;
static dbox_log_sink_t *saved_sink;

static void capture_sink(enum dbox_log_level level, const char *fmt,
			 va_list args)
{
	char *line, *p;
	int len;

	if (!capturing || level > DBOX_LOG_WARNING) {
		va_list copy;

		va_copy(copy, args);
		progress_clear();
		fputs(level == DBOX_LOG_WARNING ? "dboxadm: warning: " :
		      "dboxadm: ", stderr);
		vfprintf(stderr, fmt, copy);
		fputc('\n', stderr);
		va_end(copy);
		return;
	}
	if ((len = vasprintf(&line, fmt, args)) < 0)
		return;
	for (p = line; (p = strchr(p, '\n')) != NULL; )
		*p = ' ';
	if (captured_len + (size_t)len + 2 <= CAPTURE_MAX &&
	    (p = realloc(captured, captured_len + (size_t)len + 2)) != NULL) {
		if (captured_len > 0)
			p[captured_len++] = '\n';
		memcpy(p + captured_len, line, (size_t)len + 1);
		captured_len += (size_t)len;
		captured = p;
	}
	free(line);
}

static void capture_begin(void)
{
	free(captured);
	captured = NULL;
	captured_len = 0;
	capturing = true;
}

/* The reasons logged since capture_begin, one per line (owned by the
   caller), or NULL. */
static char *capture_end(void)
{
	char *reason = captured;

	captured = NULL;
	captured_len = 0;
	capturing = false;
	return reason;
}

/* Of the reasons (one per line, freed), the one that names "m.<id> offset
   <offset>:", else the first; malloc()ed, or NULL. */
static char *reason_about(char *reasons, uint32_t id, uint64_t offset)
{
	char want[64], *line, *end, *pick = NULL;
	size_t want_len;

	if (reasons == NULL)
		return NULL;
	want_len = (size_t)snprintf(want, sizeof(want), "m.%u offset %llu:", id,
				    (unsigned long long)offset);
	for (line = reasons; line != NULL; line = end != NULL ? end + 1 : NULL) {
		end = strchr(line, '\n');
		if (strncmp(line, want, want_len) == 0) {
			pick = line;
			break;
		}
	}
	if (pick == NULL)
		pick = reasons;
	end = strchr(pick, '\n');
	pick = end != NULL ? strndup(pick, (size_t)(end - pick)) : strdup(pick);
	free(reasons);
	return pick;
}

static void strs_add(struct strs *s, const char *text)
{
	char *copy = strdup(text);

	if (copy == NULL)
		return;
	if (s->n == s->size) {
		size_t size = s->size == 0 ? 16 : s->size * 2;
		char **v = realloc(s->v, size * sizeof(*v));

		if (v == NULL) {
			free(copy);
			return;
		}
		s->v = v;
		s->size = size;
	}
	s->v[s->n++] = copy;
}

static void strs_free(struct strs *s)
{
	for (size_t i = 0; i < s->n; i++)
		free(s->v[i]);
	free(s->v);
}

static void problem(struct check *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void note(struct check *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void vadd(struct check *c, struct strs *s, const char *prefix,
		 const char *fmt, va_list args)
{
	char text[2048], escaped[DBOX_LOG_ESCAPED_SIZE(sizeof(text))];

	vsnprintf(text, sizeof(text), fmt, args);
	strs_add(s, text);
	if (!c->json) {
		progress_clear();
		printf("%s: %s\n", prefix,
		       dbox_log_escape(escaped, sizeof(escaped), text));
	}
}

static void problem(struct check *c, const char *fmt, ...)
{
	va_list args;

	va_start(args, fmt);
	vadd(c, &c->problems, "problem", fmt, args);
	va_end(args);
}

static void note(struct check *c, const char *fmt, ...)
{
	va_list args;

	va_start(args, fmt);
	vadd(c, &c->notes, "note", fmt, args);
	va_end(args);
}

static void index_problem_cb(void *ctx, const char *text)
{
	problem(ctx, "%s", text);
}

/* --- m.N files --------------------------------------------------------- */

static struct mfile *file_get(struct check *c, uint32_t id, bool add)
{
	for (size_t i = 0; i < c->nfiles; i++)
		if (c->files[i].id == id)
			return &c->files[i];
	if (!add)
		return NULL;
	if (c->nfiles == c->files_size) {
		size_t size = c->files_size == 0 ? 64 : c->files_size * 2;
		struct mfile *f = realloc(c->files, size * sizeof(*f));

		if (f == NULL)
			return NULL;
		c->files = f;
		c->files_size = size;
	}
	memset(&c->files[c->nfiles], 0, sizeof(c->files[0]));
	c->files[c->nfiles].id = id;
	return &c->files[c->nfiles++];
}

static int known_cb(void *ctx, uint32_t file_id, uint64_t size)
{
	struct mfile *f = file_get(ctx, file_id, true);

	if (f == NULL)
		return -ENOMEM;
	f->known = true;
	f->committed = size;
	(void)dbox_index_mfile_where(((struct check *)ctx)->index, file_id,
				     &size, &f->alt);
	return 0;
}

/* The directory holding f: ALT/storage/ when found there. */
static int file_dir(const struct check *c, const struct mfile *f)
{
	return f->on_alt ? c->alt_fd : c->storage_fd;
}

/* What storage/ (or ALT/storage/) holds. */
static int list_storage(struct check *c, bool alt)
{
	int dir_fd = alt ? c->alt_fd : c->storage_fd;
	DIR *d = fdopendir(dup(dir_fd));
	struct dirent *de;

	if (d == NULL)
		return -errno;
	rewinddir(d);
	while ((de = readdir(d)) != NULL) {
		struct stat sb;
		struct mfile *f;
		uint32_t id;

		if (!dbox_mfile_parse_name(de->d_name, &id))
			continue;
		if (fstatat(dir_fd, de->d_name, &sb,
			    AT_SYMLINK_NOFOLLOW) < 0)
			continue; /* gone since readdir (a purge) */
		if (!S_ISREG(sb.st_mode)) {
			problem(c, "%s%sstorage/%s is not a regular file (%s); "
				"dboxfs never follows it", alt && c->alt_path ?
				c->alt_path : "", alt && c->alt_path ? "/" : "",
				de->d_name,
				S_ISLNK(sb.st_mode) ? "a symbolic link" :
				"a special file");
			continue;
		}
		if ((f = file_get(c, id, true)) == NULL) {
			closedir(d);
			return -ENOMEM;
		}
		if (f->exists) {
			problem(c, "m.%u is both in storage/ and in the "
				"alternate storage", id);
			continue;
		}
		f->exists = true;
		f->on_alt = alt;
		f->size = (uint64_t)sb.st_size;
		if (f->known && f->alt != alt)
			problem(c, "storage/%s: the index says it is in %s, "
				"but it is in %s", de->d_name,
				f->alt ? "the alternate storage" : "storage/",
				alt ? "the alternate storage" : "storage/");
	}
	closedir(d);
	return 0;
}

static int file_cmp(const void *a, const void *b)
{
	uint32_t x = ((const struct mfile *)a)->id,
		 y = ((const struct mfile *)b)->id;

	return x < y ? -1 : x > y;
}

static int rec_cb(void *ctx, uint64_t offset, uint64_t body_size,
		  const struct dbox_metadata *md, uint64_t record_size)
{
	struct check *c = ctx;
	struct mfile *f = &c->files[c->next_scan];
	struct rec *r;

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
	c->records++;
	c->record_bytes += record_size;
	progress_add(&c->progress, 1, record_size);
	return 0;
}

static int bad_cb(void *ctx, uint64_t start, uint64_t end)
{
	struct check *c = ctx;
	struct mfile *f = &c->files[c->next_scan];
	struct bad *b = realloc(f->bads, (f->nbads + 1) * sizeof(*b));
	char *reason = reason_about(capture_end(), f->id, start);

	capture_begin();
	if (b == NULL) {
		free(reason);
		return -ENOMEM;
	}
	f->bads = b;
	b[f->nbads].start = start;
	b[f->nbads].end = end;
	b[f->nbads].reason = reason;
	b[f->nbads].used = false;
	f->nbads++;
	return 0;
}

/* How messages name m.N of f: "storage/m.N" for the store's own,
   "ALT/storage/m.N" (the ALT path) for one in the alternate storage. */
static void shown_name(const struct check *c, const struct mfile *f,
		       const char *name, char *buf, size_t size)
{
	if ((f->exists ? f->on_alt : f->alt) && c->alt_path != NULL)
		snprintf(buf, size, "%s/storage/%s", c->alt_path, name);
	else
		snprintf(buf, size, "storage/%s", name);
}

/* Report the damaged regions of a scanned file whose messages were all
   verified: damage where a message of the index (or of no index, for an
   unknown file) lives is a problem; damage in bytes no message uses (a
   record a crash cut while it was being rewritten) loses nothing. */
static void report_bads(struct check *c, const struct mfile *f)
{
	char name[16], shown[PATH_MAX + 32];

	dbox_file_name(name, f->id);
	shown_name(c, f, name, shown, sizeof(shown));
	for (size_t i = 0; i < f->nbads; i++) {
		const struct bad *b = &f->bads[i];
		const char *reason = b->reason != NULL ? b->reason : "";

		if (b->used)
			problem(c, "%s: bytes [%llu, %llu) are no whole "
				"record%s%s", shown, (unsigned long long)b->start,
				(unsigned long long)b->end, *reason ? ": " : "",
				reason);
		else if (!f->known)
			/* A file whose creation never committed: a record cut
			   by a crash while it was written, like the others in
			   it uncommitted (the next mount cuts the file). */
			note(c, "%s: bytes [%llu, %llu) are an "
			     "unfinished record in a file the index does not "
			     "know%s%s", shown, (unsigned long long)b->start,
			     (unsigned long long)b->end, *reason ? ": " : "",
			     reason);
		else
			note(c, "%s: bytes [%llu, %llu) are damaged but "
			     "hold no message of the index%s%s", shown,
			     (unsigned long long)b->start,
			     (unsigned long long)b->end, *reason ? ": " : "",
			     reason);
	}
}

/* The bytes of a known m.N past its committed end, judged as the next
   mount's recovery judges them (engine/store.c): whole records before the
   record in flight (a WRITING row's, or inflight.m.N), or kept by an earlier recovery
   (kept.m.N), are messages the index does not know - an index older than
   storage/ - and a problem ('dboxadm rebuild' brings them back); the rest
   is an unfinished write, which the mount cuts.  While mounted, only
   what recovery kept is judged: the rest is the mount's own work. */
static void check_tail(struct check *c, const struct mfile *f, int fd,
		       const char *name)
{
	char inflight_key[32], kept_key[32];
	int64_t inflight = -1, kept = 0;
	uint64_t start, end, writing;
	long whole = 0, kept_whole = 0;

	dbox_store_tail_keys(f->id, inflight_key, kept_key);
	if (dbox_index_meta_get(c->index, inflight_key, &inflight) < 0 ||
	    (uint64_t)inflight < f->committed)
		inflight = -1;
	if (dbox_index_writing_offset(c->index, f->id, f->committed,
				      &writing) == 1 &&
	    (inflight < 0 || writing < (uint64_t)inflight))
		inflight = (int64_t)writing;
	if (dbox_index_meta_get(c->index, kept_key, &kept) < 0 ||
	    (uint64_t)kept < f->committed)
		kept = (int64_t)f->committed;
	start = (uint64_t)kept;
	capture_begin();
	if (start > f->committed)
		kept_whole = dbox_file_tail_records(fd, f->id, f->committed,
						    start, &end, NULL, NULL);
	if (c->offline && (inflight < 0 || (uint64_t)inflight > start))
		whole = dbox_file_tail_records(fd, f->id, start, inflight < 0 ?
					       UINT64_MAX : (uint64_t)inflight,
					       &end, NULL, NULL);
	else
		end = start;
	free(capture_end());
	whole = (whole > 0 ? whole : 0) + (kept_whole > 0 ? kept_whole : 0);
	if (whole > 0)
		problem(c, "%s: %ld whole records after the committed "
			"end %llu are unknown to the index (is the index older "
			"than storage/?); 'dboxadm rebuild' brings them back",
			name, whole, (unsigned long long)f->committed);
	if (c->offline && f->size > end) {
		uint64_t e;
		bool only_inflight;

		capture_begin();
		only_inflight = inflight >= 0 && (uint64_t)inflight == end &&
			dbox_file_tail_records(fd, f->id, end, UINT64_MAX, &e,
					       NULL, NULL) < 2;
		free(capture_end());
		note(c, "%s: %llu bytes after %llu, an unfinished write "
		     "(the next mount cuts them%s)", name,
		     (unsigned long long)(f->size - end),
		     (unsigned long long)end, only_inflight ? "" :
		     ", keeping a copy in " DBOX_STORE_LOST_FOUND "/");
	}
}

/* Scan files[next_scan] and report what is wrong with it as a file. */
static int scan_one(struct check *c)
{
	struct mfile *f = &c->files[c->next_scan];
	char name[16], shown[PATH_MAX + 32];
	uint64_t end;
	bool header_ok = true;
	int fd, ret;

	f->scanned = true;
	dbox_file_name(name, f->id);
	shown_name(c, f, name, shown, sizeof(shown));
	if (!f->exists) {
		/* Messages in it are reported one by one; without any the
		   file is no loss. */
		note(c, "the index knows %s, which is not there", shown);
		return 0;
	}
	if (!f->known) {
		if (!c->offline) {
			note(c, "%s is not in this snapshot of the index "
			     "(being created by the mount?); not checked", shown);
			return 0;
		}
		if (f->size == 0) {
			note(c, "%s is empty and not in the index (a new "
			     "file whose creation a crash cut)", shown);
			return 0;
		}
		end = f->size;
	} else if (f->size < f->committed) {
		problem(c, "%s is %llu bytes, shorter than its committed "
			"end %llu: its end is lost", shown,
			(unsigned long long)f->size,
			(unsigned long long)f->committed);
		end = f->size;
	} else {
		end = f->committed;
	}
	fd = openat(file_dir(c, f), name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		problem(c, "%s: %s", shown, strerror(errno));
		return 0;
	}
	if (f->known && f->size > f->committed)
		check_tail(c, f, fd, shown);
	capture_begin();
	ret = dbox_file_scan(fd, f->id, end, rec_cb, bad_cb, c, &header_ok);
	free(capture_end());
	if (ret < 0 && errno != ENOMEM) {
		problem(c, "%s: reading: %s", shown, strerror(errno));
		ret = 0;
	}
	if (!header_ok)
		problem(c, "%s: the file header line is not \"2 M1e "
			"C...\"", shown);
	else if (!f->known && f->nrecs > 0 &&
		 dbox_store_purged_key(c->index, f->id, false) == 1)
		note(c, "%s was purged: its %zu records are copies "
		     "left by a crash before its removal (the next purge "
		     "removes it)", shown, f->nrecs);
	else if (!f->known && f->nrecs > 0)
		/* A file whose creation never committed holds no whole
		   record (a save commits its file before writing to it):
		   these are messages of an index newer than this one. */
		problem(c, "%s is not in the index: its %zu whole "
			"records are unknown to the index (is the index older "
			"than storage/?); 'dboxadm rebuild' brings them back",
			shown, f->nrecs);
	else if (!f->known && f->nbads > 0)
		note(c, "%s is not in the index: bytes of an "
		     "uncommitted write, which the next mount cuts off", shown);
	else if (!f->known)
		note(c, "%s is not in the index and holds no record (a "
		     "new file whose creation a crash cut)", shown);
	close(fd);
	return ret < 0 ? -ENOMEM : ret;
}

/* Scan every file up to and including id (all when id is UINT32_MAX). */
static int scan_upto(struct check *c, uint32_t id)
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

/* --- messages ---------------------------------------------------------- */

static const struct rec *rec_at(const struct mfile *f, uint64_t offset)
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

static const struct bad *bad_at(const struct mfile *f, uint64_t offset)
{
	for (size_t i = 0; i < f->nbads; i++)
		if (offset >= f->bads[i].start && offset < f->bads[i].end)
			return &f->bads[i];
	return NULL;
}

/* A read-only descriptor of storage/m.<id> for body reads, kept open for
   the messages of one file after another (messages come in file order).
   Returns the fd or -1. */
static int body_fd(struct check *c, uint32_t id)
{
	char name[16];

	if (c->body_fd >= 0 && c->body_fd_id == id)
		return c->body_fd;
	if (c->body_fd >= 0)
		close(c->body_fd);
	dbox_file_name(name, id);
	c->body_fd = -1;
	for (size_t i = 0; i < c->nfiles; i++)
		if (c->files[i].id == id)
			c->body_fd = openat(file_dir(c, &c->files[i]), name,
					    O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	c->body_fd_id = id;
	return c->body_fd;
}

/* Is the body at offset compressed (so its size says nothing)? */
static bool body_compressed(struct check *c, const struct mfile *f,
			    uint64_t offset)
{
	char head[16];
	ssize_t n = -1;
	int fd = body_fd(c, f->id);

	if (fd >= 0)
		n = pread(fd, head, sizeof(head), (off_t)(offset +
							 DBOX_MSG_HEADER_SIZE));
	return n > 0 && dbox_detect_compression(head, (size_t)n) !=
		DBOX_COMPRESSION_NONE;
}

static void msg_problem(struct check *c, const struct dbox_check_msg *m,
			const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void msg_problem(struct check *c, const struct dbox_check_msg *m,
			const char *fmt, ...)
{
	char what[1024], *path = NULL;
	va_list args;

	va_start(args, fmt);
	vsnprintf(what, sizeof(what), fmt, args);
	va_end(args);
	dbox_index_check_path(c->index, m->ino, &path);
	problem(c, "message %s (inode %llu, m.%u offset %llu): %s",
		path != NULL ? path : "?", (unsigned long long)m->ino,
		m->loc.file_id, (unsigned long long)m->loc.offset, what);
	free(path);
}

/* Decode the compressed body of m's record r to its end through the
   mount's own reader (dbox-read.h), so the codec's own checks run (gzip
   CRC32 and ISIZE, bzip2 block CRCs, xz and zstd checksums; Dovecot's lz4
   container has none, only its structure is checked) and the plaintext
   must be exactly the size the mount reads (the inode size).  Memory: the
   reader's buffers and body_buf, whatever the body size.  A damaged body
   is a problem naming the codec's error. */
static void verify_body(struct check *c, const struct dbox_check_msg *m,
			const struct rec *r)
{
	struct dbox_reader *reader = NULL;
	uint64_t off = 0;
	char *reason;
	int fd = body_fd(c, m->loc.file_id);

	if (fd < 0 || (c->body_buf == NULL &&
		       (c->body_buf = malloc(VERIFY_BUF_SIZE)) == NULL))
		return;
	if (dbox_reader_open(fd, r->offset + DBOX_MSG_HEADER_SIZE,
			     r->body_size, m->size, &reader) < 0)
		return;
	if (dbox_reader_compression(reader) == DBOX_COMPRESSION_NONE) {
		dbox_reader_free(&reader);
		return;
	}
	(void)dbox_reader_set_name(reader, "storage/m.%u offset %llu",
				   m->loc.file_id,
				   (unsigned long long)r->offset);
	c->decoded++;
	capture_begin();
	while (off < m->size) {
		ssize_t n = dbox_reader_pread(reader, c->body_buf,
					      VERIFY_BUF_SIZE, off);

		if (n <= 0) {
			if (n == 0)
				errno = EIO;
			break;
		}
		off += (uint64_t)n;
	}
	reason = reason_about(capture_end(), m->loc.file_id, r->offset);
	if (off < m->size)
		msg_problem(c, m, "the compressed body is damaged: %s: "
			    "unreadable (EIO)", reason != NULL ? reason :
			    strerror(errno));
	free(reason);
	dbox_reader_free(&reader);
}

static int msg_cb(void *ctx, const struct dbox_check_msg *m)
{
	struct check *c = ctx;
	const struct rec *r;
	const struct bad *b;
	struct mfile *f;
	int ret;

	if (m->loc.state != DBOX_MSG_COMMITTED)
		return 0; /* being written: counted as pending */
	if ((ret = scan_upto(c, m->loc.file_id)) != 0)
		return ret;
	c->messages++;
	f = file_get(c, m->loc.file_id, false);
	if (f == NULL || !f->known)
		return 0; /* reported by the namespace check */
	if (!f->exists) {
		msg_problem(c, m, "storage/m.%u is missing: unreadable (EIO)",
			    m->loc.file_id);
		return 0;
	}
	if ((r = rec_at(f, m->loc.offset)) == NULL) {
		b = bad_at(f, m->loc.offset);
		if (b != NULL)
			((struct bad *)b)->used = true;
		if (m->loc.offset >= f->size)
			msg_problem(c, m, "the record is past the end of the "
				    "file: unreadable (EIO)");
		else if (b != NULL)
			msg_problem(c, m, "the record is damaged%s%s: "
				    "unreadable (EIO)", b->reason != NULL ?
				    ": " : "", b->reason != NULL ? b->reason : "");
		else
			msg_problem(c, m, "no record starts at this offset");
		return 0;
	}
	if (r->body_size != m->loc.body_size)
		msg_problem(c, m, "body size %llu, the index says %llu",
			    (unsigned long long)r->body_size,
			    (unsigned long long)m->loc.body_size);
	if (r->record_size != m->loc.record_size)
		msg_problem(c, m, "record size %llu, the index says %llu",
			    (unsigned long long)r->record_size,
			    (unsigned long long)m->loc.record_size);
	/* The index keeps a GUID's first 32 characters (foreign GUIDs may
	   be longer). */
	if (strncmp(r->guid, m->loc.guid, sizeof(m->loc.guid) - 1) != 0)
		msg_problem(c, m, "GUID '%s', the index says '%s'", r->guid,
			    m->loc.guid);
	if (r->has_vsize && r->vsize != m->loc.vsize)
		msg_problem(c, m, "virtual size (V) %llu, the index says %llu",
			    (unsigned long long)r->vsize,
			    (unsigned long long)m->loc.vsize);
	if (r->has_plain_size ? r->plain_size != m->size :
	    r->body_size != m->size && !body_compressed(c, f, r->offset))
		msg_problem(c, m, "plaintext size %llu, the index says %llu",
			    (unsigned long long)(r->has_plain_size ?
						 r->plain_size : r->body_size),
			    (unsigned long long)m->size);
	if (r->body_size == m->loc.body_size)
		verify_body(c, m, r);
	return 0;
}

/* --- plain files ------------------------------------------------------- */

static int file_ino_cb(void *ctx, uint64_t ino)
{
	struct check *c = ctx;
	char name[24], *path = NULL;
	const char *what;
	struct stat sb;

	if (c->nfile_inos == c->file_inos_size) {
		size_t size = c->file_inos_size == 0 ? 64 : c->file_inos_size * 2;
		uint64_t *v = realloc(c->file_inos, size * sizeof(*v));

		if (v == NULL)
			return -ENOMEM;
		c->file_inos = v;
		c->file_inos_size = size;
	}
	c->file_inos[c->nfile_inos++] = ino;
	snprintf(name, sizeof(name), "%llu", (unsigned long long)ino);
	if (c->files_fd < 0)
		return 0;
	if (fstatat(c->files_fd, name, &sb, AT_SYMLINK_NOFOLLOW) < 0)
		what = errno == ENOENT ? "is missing" : strerror(errno);
	else if (S_ISLNK(sb.st_mode))
		what = "is a symbolic link (never followed)";
	else if (!S_ISREG(sb.st_mode))
		what = "is not a regular file";
	else
		return 0;
	dbox_index_check_path(c->index, ino, &path);
	problem(c, "plain file %s (inode %llu): files/%s %s", path != NULL ?
		path : "?", (unsigned long long)ino, name, what);
	free(path);
	return 0;
}

static bool is_file_ino(const struct check *c, uint64_t ino)
{
	size_t lo = 0, hi = c->nfile_inos;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (c->file_inos[mid] == ino)
			return true;
		if (c->file_inos[mid] < ino)
			lo = mid + 1;
		else
			hi = mid;
	}
	return false;
}

/* Files in files/ that no plain file of the index owns. */
static void check_files_dir(struct check *c)
{
	DIR *d = fdopendir(dup(c->files_fd));
	struct dirent *de;

	if (d == NULL)
		return;
	rewinddir(d);
	while ((de = readdir(d)) != NULL) {
		unsigned long long ino;
		struct dbox_attr attr;
		struct stat sb;
		char *end;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		errno = 0;
		ino = strtoull(de->d_name, &end, 10);
		if (*end == '\0' && errno == 0 && de->d_name[0] != '0' &&
		    is_file_ino(c, ino))
			continue;
		if (!c->offline)
			continue; /* may be a plain file being created */
		if (*end == '\0' && dbox_index_getattr(c->index, ino, &attr) == 0)
			note(c, "files/%s belongs to inode %s, which is no plain "
			     "file (a plain file turned into a message; the next "
			     "mount removes it)", de->d_name, de->d_name);
		else if (fstatat(c->files_fd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
		    S_ISREG(sb.st_mode) && sb.st_size == 0 && *end == '\0')
			note(c, "files/%s is empty and belongs to no plain file "
			     "(a create cut by a crash; the next mount removes "
			     "it)", de->d_name);
		else
			problem(c, "files/%s belongs to no plain file of the "
				"index", de->d_name);
	}
	closedir(d);
}

/* --- output ------------------------------------------------------------ */

static void json_str(const char *s)
{
	putchar('"');
	for (; *s != '\0'; s++) {
		if (*s == '"' || *s == '\\')
			printf("\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			printf("\\u%04x", (unsigned char)*s);
		else
			putchar(*s);
	}
	putchar('"');
}

static void json_strs(const char *key, const struct strs *s)
{
	printf("  \"%s\": [", key);
	for (size_t i = 0; i < s->n; i++) {
		printf("%s\n    ", i == 0 ? "" : ",");
		json_str(s->v[i]);
	}
	printf("%s],\n", s->n > 0 ? "\n  " : "");
}

static void print_result(struct check *c)
{
	if (c->json) {
		printf("{\n  \"store\": ");
		json_str(c->store);
		printf(",\n  \"mounted\": %s,\n", c->offline ? "false" : "true");
		json_strs("problems", &c->problems);
		json_strs("notes", &c->notes);
		printf("  \"messages\": %llu,\n  \"mfiles\": %zu,\n"
		       "  \"records\": %llu,\n  \"plain_files\": %zu\n}\n",
		       (unsigned long long)c->messages, c->nfiles,
		       (unsigned long long)c->records, c->nfile_inos);
		return;
	}
	printf("%s: %llu messages, %zu m.N files (%llu records), %zu plain "
	       "files checked%s: %zu problem%s\n", c->store,
	       (unsigned long long)c->messages, c->nfiles,
	       (unsigned long long)c->records, c->nfile_inos,
	       c->offline ? "" : " (mounted: one snapshot)", c->problems.n,
	       c->problems.n == 1 ? "" : "s");
}

/* --- main -------------------------------------------------------------- */

/* Take the store lock shared when nobody holds it.  Returns the lock fd
   (or -1 when there is no lock file) and sets c->offline. */
/* The copies crash recovery kept in STORE/lost+found/ of bytes it cut
   (engine/store.c): notes, to be deleted by hand once the store is clean
   (the bytes were no message any index knew). */
static void note_lost_found(struct check *c, int dir_fd)
{
	int fd = openat(dir_fd, DBOX_STORE_LOST_FOUND, O_RDONLY | O_DIRECTORY |
			O_NOFOLLOW | O_CLOEXEC);
	struct dirent *de;
	DIR *d;

	if (fd < 0 || (d = fdopendir(fd)) == NULL) {
		if (fd >= 0)
			close(fd);
		return;
	}
	while ((de = readdir(d)) != NULL) {
		struct stat sb;

		if (de->d_name[0] == '.' ||
		    fstatat(fd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		note(c, "%s/%s: %llu bytes crash recovery cut off an m.N, kept "
		     "as a copy; delete it once check finds no problem",
		     DBOX_STORE_LOST_FOUND, de->d_name,
		     (unsigned long long)sb.st_size);
	}
	closedir(d);
}

static int lock_store(struct check *c, int dir_fd)
{
	int fd = openat(dir_fd, DBOX_STORE_LOCK, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);

	c->offline = true;
	if (fd < 0)
		return -1;
	if (flock(fd, LOCK_SH | LOCK_NB) < 0)
		c->offline = false;
	return fd;
}

/* Open the index; a missing or unreadable one is a problem (exit 1)
   when storage/ is there, else there is no store (exit 2). */
static int open_index(struct check *c, int dir_fd)
{
	char *path;
	int ret;

	if (asprintf(&path, "%s/" DBOX_STORE_INDEX, c->store) < 0)
		return ADM_EXIT_FAILED;
	ret = dbox_index_open(path, false, &c->index);
	free(path);
	if (ret == 0 && (ret = dbox_index_reader_setup(c->index)) < 0)
		dbox_index_close(&c->index);
	if (ret == 0)
		return ADM_EXIT_OK;
	if (faccessat(dir_fd, DBOX_STORE_STORAGE, F_OK, 0) < 0) {
		adm_error("%s: not a dbox store (no index.sqlite, no storage/)",
			  c->store);
		return ADM_EXIT_USAGE;
	}
	if (ret == -EPROTO) {
		adm_error("%s: the index is from a newer dboxfs; this dboxadm "
			  "cannot check it", c->store);
		return ADM_EXIT_USAGE;
	}
	problem(c, "index.sqlite is %s: 'dboxadm rebuild %s' recreates it "
		"from storage/", ret == -ENOENT ? "missing" : "unreadable",
		c->store);
	return ADM_EXIT_FAILED;
}

/* The alternate storage the index recorded: ALT/storage/ into c->alt_fd
   (storage/ in it never through a symbolic link); a recorded one that
   cannot be opened is a problem (its messages are unreadable). */
static void open_alt(struct check *c)
{
	char *alt = NULL;
	int fd;

	if (dbox_index_setting_get(c->index, DBOX_SETTING_ALT_PATH, &alt) < 0)
		return;
	if ((fd = adm_open_alt_dir(c->store, alt)) < 0)
		problem(c, "alternate storage %s/storage: %s; the messages "
			"in it are unreadable", alt, fd == -EPERM ?
			"not owned by the store's owner (refused)" :
			strerror(-fd));
	else
		c->alt_fd = fd;
	if (fd >= 0)
		c->alt_path = alt;
	else
		free(alt);
}

static int run_check(struct check *c)
{
	uint64_t writing = 0, unnamed = 0;
	int ret;

	if ((ret = dbox_index_snapshot_begin(c->index)) < 0)
		return ret;
	if ((ret = dbox_index_check_integrity(c->index, index_problem_cb, c)) < 0 ||
	    (ret = dbox_index_check_namespace(c->index, index_problem_cb, c)) < 0 ||
	    (ret = dbox_index_check_pending(c->index, &writing, &unnamed)) < 0 ||
	    (ret = dbox_index_mfile_list(c->index, known_cb, c)) < 0)
		goto out;
	if (writing > 0)
		note(c, "%llu messages %s", (unsigned long long)writing,
		     c->offline ? "were being written when the store was last "
		     "used: the next mount drops them (crash recovery)" :
		     "are being written");
	if (unnamed > 0 && c->offline)
		note(c, "%llu files have no name left (unlinked while open "
		     "when the store was last used): the next mount deletes "
		     "them", (unsigned long long)unnamed);
	if (c->storage_fd >= 0 && (ret = list_storage(c, false)) < 0)
		goto out;
	if (c->alt_fd >= 0 && (ret = list_storage(c, true)) < 0)
		goto out;
	if (c->nfiles > 1)
		qsort(c->files, c->nfiles, sizeof(*c->files), file_cmp);
	if ((ret = dbox_index_check_messages(c->index, msg_cb, c)) != 0 ||
	    (ret = scan_upto(c, UINT32_MAX)) != 0)
		goto out;
	if ((ret = dbox_index_check_files(c->index, file_ino_cb, c)) != 0)
		goto out;
	if (c->files_fd >= 0)
		check_files_dir(c);
out:
	dbox_index_snapshot_end(c->index);
	return ret;
}

static int check_main(int argc, char **argv)
{
	static const char *const flags[] = { "--json", NULL };
	struct check c = { .storage_fd = -1, .files_fd = -1, .body_fd = -1,
			   .alt_fd = -1 };
	bool *flag_r[] = { &c.json };
	int npos, dir_fd, lock_fd, ret;

	if ((ret = adm_parse_args(&adm_verb_check, argc, argv, flags, flag_r,
				  &npos)) != 0)
		return ret;
	if (npos != 1)
		return adm_usage_error(&adm_verb_check, "check: need STORE");
	if ((ret = adm_store_enter(argv[0])) != 0)
		return ret;
	c.store = argv[0];
	dir_fd = open(c.store, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dir_fd < 0) {
		adm_error("%s: %s", c.store, strerror(errno));
		return ADM_EXIT_USAGE;
	}
	saved_sink = dbox_log_get_sink();
	dbox_log_set_sink(capture_sink);
	lock_fd = lock_store(&c, dir_fd);
	ret = open_index(&c, dir_fd);
	if (ret == ADM_EXIT_OK) {
		c.storage_fd = openat(dir_fd, DBOX_STORE_STORAGE, O_RDONLY | O_DIRECTORY |
				      O_NOFOLLOW | O_CLOEXEC);
		c.files_fd = openat(dir_fd, DBOX_STORE_FILES, O_RDONLY | O_DIRECTORY |
				    O_NOFOLLOW | O_CLOEXEC);
		if (c.storage_fd < 0)
			problem(&c, "storage/: %s", strerror(errno));
		open_alt(&c);
		progress_init(&c.progress, "checked");
		ret = run_check(&c);
		if (ret >= 0)
			note_lost_found(&c, dir_fd);
		progress_finish(&c.progress);
		if (ret < 0)
			adm_error("%s: checking stopped: %s", c.store,
				  strerror(-ret));
		ret = ret < 0 ? ADM_EXIT_USAGE : ADM_EXIT_OK;
	}
	if (ret != ADM_EXIT_USAGE) {
		print_result(&c);
		if (c.problems.n > 0)
			ret = ADM_EXIT_FAILED;
	}
	dbox_log_set_sink(saved_sink);
	dbox_index_close(&c.index);
	for (size_t i = 0; i < c.nfiles; i++) {
		free(c.files[i].recs);
		for (size_t j = 0; j < c.files[i].nbads; j++)
			free(c.files[i].bads[j].reason);
		free(c.files[i].bads);
	}
	free(c.files);
	free(c.file_inos);
	strs_free(&c.problems);
	strs_free(&c.notes);
	if (c.storage_fd >= 0)
		close(c.storage_fd);
	if (c.alt_fd >= 0)
		close(c.alt_fd);
	free(c.alt_path);
	if (c.files_fd >= 0)
		close(c.files_fd);
	if (c.body_fd >= 0)
		close(c.body_fd);
	free(c.body_buf);
	if (lock_fd >= 0)
		close(lock_fd);
	close(dir_fd);
	if (fflush(stdout) != 0)
		return ADM_EXIT_USAGE;
	return ret;
}

const struct adm_verb adm_verb_check = {
	.name = "check",
	.summary = "verify the index against storage/ and files/ (mounted or not)",
	.usage =
	"usage: dboxadm check STORE [--json]\n"
	"\n"
	"Verify STORE without changing it: SQLite's integrity check of\n"
	"index.sqlite; the namespace (names, link counts, directories); every\n"
	"storage/m.N record by record, and every message of the index against its\n"
	"record (offset, body and record size, GUID, V, plaintext size); every\n"
	"compressed body decoded to its end (the codec's own checksum); m.N files\n"
	"missing, shorter than their committed end, or unknown to the index; and\n"
	"files/ against the plain files of the index.  Each problem is printed as\n"
	"a line 'problem: ...'; states the next mount's crash recovery cleans up\n"
	"are 'note: ...' lines.\n"
	"\n"
	"Works while STORE is mounted (one snapshot of the index; what the mount\n"
	"is writing at that moment is not checked).  Offline it holds the store\n"
	"lock shared, so the store cannot be mounted until it is done.\n"
	"\n"
	"  --json   one JSON object (problems, notes, counts) instead of text\n"
	"\n"
	"Exit status: 0 no problem, 1 problems found (a missing or unreadable\n"
	"index is one: 'dboxadm rebuild' recreates it), 2 usage error or no store.\n",
	.run = check_main,
};
