/*
 * rebuild.c: dboxadm rebuild STORE [--restore-all] - make a new index
 * from the m.N files, as Dovecot's `doveadm force-resync` rebuilds its
 * map (dovecot/core 2.3.21 mdbox-storage-rebuild.c; docs/dbox-format.md
 * section 12), keeping what the old index still knows:
 *
 *  1. Take the store lock (the store must not be mounted).  Move the old
 *     index.sqlite (with its -wal and -shm) aside as
 *     index.sqlite.broken-<UTC time>; it is never deleted.  From then on
 *     a mount refuses the store until the rebuild finished.
 *  2. Salvage from the old index whatever rows can be read
 *     (index-rebuild.h).  When there is no index.sqlite (a rebuild that
 *     was cut short), the newest index.sqlite.broken-* is read instead.
 *  3. Scan every storage/m.N for whole records (dbox-scan.h), damaged
 *     files too.  Every m.N is entered with its whole size as committed
 *     end, so the next mount cuts nothing.
 *  4. Match the old index's messages to records: by location and GUID,
 *     else by GUID alone.  The tree is rebuilt from the root down as the
 *     old index had it - directories, names (so flags, which live in
 *     names), hard links, modes, owners, mtimes, inode numbers, symlink
 *     targets, device numbers and extended attributes - for
 *     every message whose record was found, every plain file whose
 *     files/<ino> is there, and every directory reachable from the root.
 *     A message whose record is still at its old location but has a
 *     damaged field (GUID, metadata) keeps its names there; the damage
 *     is reported (one damaged field is not an expunge).
 *  5. Records no old message claims are restored, unless the old index
 *     was read whole and knew them (within its committed end of their
 *     m.N: then they are expunged messages waiting for purge;
 *     --restore-all restores them anyway): into the cur/ of their B
 *     folder (INBOX -> the root, "A/B" -> the Maildir++ folder .A.B, or
 *     a nested A/B that exists), named "<R>.G<GUID>.rebuild:2," with the
 *     received date R as mtime; one message per GUID.
 *  6. Plain files in files/ no old plain file claims go to lost+found/.
 *  7. The new index is written as index.sqlite.rebuilding and renamed to
 *     index.sqlite only when complete and on disk.
 *
 * Nothing in storage/ is changed; files/ only when a lost plain file's
 * number is taken (it is renamed to its new number).
 */
#include "engine/maildir.h"
#include "engine/store-layout.h"
#include "dboxadm.h"
#include "progress.h"

#include "index/index-rebuild.h"
#include "index/index.h"
#include "engine/store-lock.h"
#include "engine/store.h"
#include "storage/dbox-file.h"
#include "storage/dbox-read.h"
#include "storage/dbox-scan.h"
#include "storage/log.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define INDEX_NAME DBOX_STORE_INDEX
#define REBUILDING_NAME DBOX_STORE_INDEX ".rebuilding"
#define BROKEN_PREFIX DBOX_STORE_INDEX ".broken-"
#define IO_SIZE (64 * 1024)

/* One whole record found in storage/. */
struct rrec {
	uint32_t file_id;
	uint64_t offset, body_size, record_size;
	uint64_t plain_size, vsize;
	time_t received;
	char guid[DBOX_GUID_HEX_LEN * 2 + 1];
	char *mailbox;           /* B, or NULL */
	bool claimed;            /* by a message row of the old index */
	bool placed;             /* in the new index */
};

/* A B folder's cur/ in the new index. */
struct folder {
	char *mailbox;
	uint64_t cur;
};

struct rebuild {
	const char *store;
	int dir_fd, storage_fd, files_fd;
	char *alt_path;          /* the alternate storage, or NULL */
	int alt_fd;              /* ALT/storage, or -1 */
	uid_t uid;               /* owner of STORE: owner of new inodes */
	gid_t gid;
	struct dbox_index *index;
	struct dbox_salvage *old;
	bool restore_all;
	struct progress progress;

	struct rrec *recs;       /* in (file_id, offset) order */
	size_t nrecs, recs_size;
	size_t *by_guid;         /* indices of recs, by GUID */
	size_t *msg_rec;         /* old->msgs[i] -> recs index or SIZE_MAX */
	uint8_t *placed;         /* old->inodes[i] placed in the new index */
	struct folder *folders;
	size_t nfolders;
	uint64_t lost_found;     /* lost+found/ ino, 0 until made */

	int scan_fd;             /* the m.N being scanned */
	uint32_t scan_id;
	unsigned long mfiles, damaged, kept, names, restored, duplicates,
		expunged, lost_msgs, lost_names, lost_files, orphans,
		damaged_kept, unknown_restored;
	bool fatal;
};

/* --- scanning storage/ ------------------------------------------------- */

/* Plaintext size and virtual size of a body without Z or V, by reading
   it through the reader the mount uses (every codec).  A compressed body
   without Z has no known plaintext size: it is taken as stored. */
static void body_sizes(struct rebuild *rb, struct rrec *r, bool need_plain,
		       bool need_vsize)
{
	uint64_t body = r->offset + DBOX_MSG_HEADER_SIZE, off = 0, vsize = 0;
	struct dbox_reader *reader = NULL;
	uint8_t head[16], *buf = NULL;
	bool prev_cr = false;
	ssize_t n;

	n = pread(rb->scan_fd, head, r->body_size < sizeof(head) ?
		  r->body_size : sizeof(head), (off_t)body);
	if (n > 0 && need_plain &&
	    dbox_detect_compression(head, (size_t)n) != DBOX_COMPRESSION_NONE) {
		adm_warning("storage/m.%u offset %llu: compressed body without "
			    "Z: size taken as stored", r->file_id,
			    (unsigned long long)r->offset);
		return;
	}
	if (need_plain)
		r->plain_size = r->body_size;
	if (!need_vsize)
		return;
	if ((buf = malloc(IO_SIZE)) == NULL ||
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
		adm_warning("storage/m.%u offset %llu: unreadable body: V "
			    "taken as stored size", r->file_id,
			    (unsigned long long)r->offset);
out:
	dbox_reader_free(&reader);
	free(buf);
}

static int scan_cb(void *ctx, uint64_t offset, uint64_t body_size,
		   const struct dbox_metadata *md, uint64_t record_size)
{
	struct rebuild *rb = ctx;
	struct rrec *r;

	if (rb->nrecs == rb->recs_size) {
		size_t size = rb->recs_size == 0 ? 1024 : rb->recs_size * 2;

		r = realloc(rb->recs, size * sizeof(*r));
		if (r == NULL)
			return -ENOMEM;
		rb->recs = r;
		rb->recs_size = size;
	}
	r = &rb->recs[rb->nrecs];
	memset(r, 0, sizeof(*r));
	r->file_id = rb->scan_id;
	r->offset = offset;
	r->body_size = body_size;
	r->record_size = record_size;
	r->received = md->received;
	memcpy(r->guid, md->guid, sizeof(r->guid));
	if (md->mailbox != NULL && (r->mailbox = strdup(md->mailbox)) == NULL)
		return -ENOMEM;
	r->plain_size = md->has_plain_size ? md->plain_size : body_size;
	r->vsize = md->has_vsize ? md->vsize : r->plain_size;
	if (!md->has_plain_size || !md->has_vsize)
		body_sizes(rb, r, !md->has_plain_size, !md->has_vsize);
	rb->nrecs++;
	progress_add(&rb->progress, 1, record_size);
	return 0;
}

/* Copy bytes [start, end) of the m.N being scanned to
   STORE/lost+found/m.N-<start> (as crash recovery keeps the bytes it
   cuts), so that a purge of that m.N cannot take the only copy of a body
   whose record no longer parses.  An existing copy of that name is kept.
   Returns 0 or a negative errno. */
static int keep_bad_bytes(struct rebuild *rb, uint64_t start, uint64_t end,
			  char copy[48])
{
	char buf[65536];
	int dir, out, ret = 0;

	snprintf(copy, 48, "m.%u-%llu", rb->scan_id, (unsigned long long)start);
	if (mkdirat(rb->dir_fd, DBOX_STORE_LOST_FOUND, 0700) < 0 &&
	    errno != EEXIST)
		return -errno;
	dir = openat(rb->dir_fd, DBOX_STORE_LOST_FOUND, O_RDONLY | O_DIRECTORY |
		     O_NOFOLLOW | O_CLOEXEC);
	if (dir < 0)
		return -errno;
	out = openat(dir, copy, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW |
		     O_CLOEXEC, 0600);
	if (out < 0) {
		ret = errno == EEXIST ? 0 : -errno;
		close(dir);
		return ret;
	}
	for (uint64_t off = start; ret == 0 && off < end; ) {
		size_t want = end - off < sizeof(buf) ? end - off : sizeof(buf);
		ssize_t n = pread(rb->scan_fd, buf, want, (off_t)off);

		if (n <= 0 || write(out, buf, (size_t)n) != n)
			ret = n < 0 ? -errno : -EIO;
		off += n > 0 ? (uint64_t)n : 0;
	}
	if (ret == 0 && fsync(out) < 0)
		ret = -errno;
	close(out);
	if (ret < 0)
		unlinkat(dir, copy, 0);
	close(dir);
	return ret;
}

static int scan_bad_cb(void *ctx, uint64_t start, uint64_t end,
		       const struct dbox_fault *fault)
{
	struct rebuild *rb = ctx;
	char copy[48];
	int ret = keep_bad_bytes(rb, start, end, copy);

	adm_error("m.%u offset %llu: %s", rb->scan_id,
		  (unsigned long long)fault->offset, fault->reason);
	if (ret < 0)
		adm_warning("storage/m.%u: bytes [%llu, %llu) are no whole "
			    "record, and no copy could be kept in %s/ (%s)",
			    rb->scan_id, (unsigned long long)start,
			    (unsigned long long)end, DBOX_STORE_LOST_FOUND,
			    strerror(-ret));
	else
		adm_warning("storage/m.%u: bytes [%llu, %llu) are no whole "
			    "record; a copy is kept in %s/%s until 'dboxadm "
			    "check' finds the store clean", rb->scan_id,
			    (unsigned long long)start, (unsigned long long)end,
			    DBOX_STORE_LOST_FOUND, copy);
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

/* Add the m.N of storage/ (or ALT/storage/) to *ids_r. */
static int list_mfiles(int dir_fd, bool alt, struct mfile_id **ids_r,
		       size_t *nids_r, size_t *size_r)
{
	DIR *d = fdopendir(dup(dir_fd));
	struct dirent *de;
	uint32_t id;
	int ret = 0;

	if (d == NULL)
		return -errno;
	rewinddir(d);
	while ((de = readdir(d)) != NULL) {
		if (!dbox_mfile_parse_name(de->d_name, &id))
			continue;
		if (*nids_r == *size_r) {
			size_t n = *size_r ? *size_r * 2 : 64;
			struct mfile_id *v = realloc(*ids_r, n * sizeof(*v));

			if (v == NULL) {
				ret = -ENOMEM;
				break;
			}
			*ids_r = v;
			*size_r = n;
		}
		(*ids_r)[(*nids_r)++] = (struct mfile_id){ id, alt };
	}
	closedir(d);
	return ret;
}

/* Scan every m.N (of storage/ and of the alternate storage) in id order;
   enter each in the new index. */
static int scan_storage(struct rebuild *rb)
{
	struct mfile_id *ids = NULL;
	size_t nids = 0, size = 0;
	int ret;

	ret = list_mfiles(rb->storage_fd, false, &ids, &nids, &size);
	if (ret == 0 && rb->alt_fd >= 0)
		ret = list_mfiles(rb->alt_fd, true, &ids, &nids, &size);
	if (nids > 1)
		qsort(ids, nids, sizeof(*ids), id_cmp);
	for (size_t i = 0; i < nids && ret == 0; i++) {
		char name[16];
		struct stat sb;
		size_t before = rb->nrecs;
		bool header_ok = true;
		int fd;

		if (i > 0 && ids[i].id == ids[i - 1].id) {
			adm_warning("m.%u is both in storage/ and in the "
				    "alternate storage; the one in %s is "
				    "ignored", ids[i].id, ids[i].alt ?
				    "the alternate storage" : "storage/");
			continue;
		}
		dbox_file_name(name, ids[i].id);
		fd = openat(ids[i].alt ? rb->alt_fd : rb->storage_fd, name,
			    O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0 || fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
			adm_warning("%sstorage/%s: %s; skipped",
				    ids[i].alt ? "ALT/" : "", name, fd < 0 ?
				    strerror(errno) : "not a regular file");
			if (fd >= 0)
				close(fd);
			continue;
		}
		if (sb.st_size == 0) {
			/* Created by a save that a crash cut before its
			   header line: no record, and no m.N of the index
			   (check calls it a note, purge removes it). */
			adm_warning("storage/%s: empty; left out of the index",
				    name);
			close(fd);
			continue;
		}
		rb->scan_fd = fd;
		rb->scan_id = ids[i].id;
		ret = dbox_file_scan(fd, ids[i].id, UINT64_MAX, scan_cb,
				     scan_bad_cb, rb, &header_ok);
		close(fd);
		if (ret < 0) {
			adm_warning("%sstorage/%s: reading: %s; %zu records "
				    "found before", ids[i].alt ? "ALT/" : "",
				    name, strerror(-ret), rb->nrecs - before);
			ret = ret == -ENOMEM ? -ENOMEM : 0;
		}
		if (!header_ok)
			rb->damaged++;
		if (ret == 0)
			ret = ids[i].alt ?
				dbox_index_mfile_add_alt(rb->index, ids[i].id,
							 (uint64_t)sb.st_size) :
				dbox_index_mfile_set(rb->index, ids[i].id,
						     (uint64_t)sb.st_size);
		rb->mfiles++;
	}
	if (ret == 0 && rb->alt_path != NULL)
		ret = dbox_index_setting_set(rb->index, DBOX_SETTING_ALT_PATH,
					     rb->alt_path);
	free(ids);
	return ret;
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

/* The alternate storage: --alt=PATH, else the one the index to be
   replaced recorded (none when it is unreadable or older than format 3).
   Returns 0 (rb->alt_fd set when there is one) or ADM_EXIT_USAGE after
   reporting an ALT that cannot be opened, or m.N of the old index in an
   ALT whose path it does not record (their messages would be lost from
   the new index). */
static int open_alt(struct rebuild *rb)
{
	struct alt_count ac = { NULL, 0 };
	char *path;
	int fd;

	if (asprintf(&path, "%s/" INDEX_NAME, rb->store) >= 0) {
		if (dbox_index_open_readonly(path, &ac.index) == 0) {
			if (rb->alt_path == NULL)
				(void)dbox_index_setting_get(ac.index,
					DBOX_SETTING_ALT_PATH, &rb->alt_path);
			(void)dbox_index_mfile_list(ac.index, count_alt_cb, &ac);
			dbox_index_close(&ac.index);
		}
		free(path);
	}
	if (rb->alt_path == NULL && ac.files > 0) {
		adm_error("%s: the index to be replaced has %lu m.N in the "
			  "alternate storage but records no path for it; "
			  "nothing was rebuilt (give --alt=PATH, or their "
			  "messages are left out)", rb->store, ac.files);
		return ADM_EXIT_USAGE;
	}
	if (rb->alt_path == NULL)
		return 0;
	if ((fd = adm_open_alt_dir(rb->store, rb->alt_path)) < 0) {
		adm_error("%s: alternate storage %s/storage: %s; nothing was "
			  "rebuilt (%lu m.N of the index to be replaced are "
			  "there; give --alt=PATH where it is now)",
			  rb->store, rb->alt_path, fd == -EPERM ?
			  "not owned by the store's owner (refused)" :
			  strerror(-fd), ac.files);
		return ADM_EXIT_USAGE;
	}
	rb->alt_fd = fd;
	return 0;
}

/* --- matching old messages to records ---------------------------------- */

/* The index keeps a GUID's first 32 characters (foreign GUIDs may be
   longer). */
static void copy_guid(struct dbox_msgloc *loc, const char *guid)
{
	size_t len = strnlen(guid, sizeof(loc->guid) - 1);

	memcpy(loc->guid, guid, len);
	loc->guid[len] = '\0';
}

/* The index location of record r, as a committed message. */
static void rrec_loc(const struct rrec *r, struct dbox_msgloc *loc_r)
{
	memset(loc_r, 0, sizeof(*loc_r));
	loc_r->file_id = r->file_id;
	loc_r->offset = r->offset;
	loc_r->body_size = r->body_size;
	loc_r->record_size = r->record_size;
	loc_r->vsize = r->vsize;
	loc_r->state = DBOX_MSG_COMMITTED;
	copy_guid(loc_r, r->guid);
}

/* GUIDs compared as the index keeps them. */
static int guid_cmp(const char *a, const char *b)
{
	return strncmp(a, b, sizeof(((struct dbox_msgloc *)0)->guid) - 1);
}

static int by_guid_cmp(const void *a, const void *b, void *recs)
{
	const struct rrec *x = (const struct rrec *)recs + *(const size_t *)a,
			  *y = (const struct rrec *)recs + *(const size_t *)b;
	int c = guid_cmp(x->guid, y->guid);

	if (c != 0)
		return c;
	if (x->file_id != y->file_id)
		return x->file_id < y->file_id ? -1 : 1;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* The record at (file_id, offset), or SIZE_MAX. */
static size_t rec_at(const struct rebuild *rb, uint32_t file_id,
		     uint64_t offset)
{
	size_t lo = 0, hi = rb->nrecs;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct rrec *r = &rb->recs[mid];

		if (r->file_id == file_id && r->offset == offset)
			return mid;
		if (r->file_id < file_id ||
		    (r->file_id == file_id && r->offset < offset))
			lo = mid + 1;
		else
			hi = mid;
	}
	return SIZE_MAX;
}

/* The first position in by_guid whose GUID is >= guid. */
static size_t guid_lower(const struct rebuild *rb, const char *guid)
{
	size_t lo = 0, hi = rb->nrecs;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (guid_cmp(rb->recs[rb->by_guid[mid]].guid, guid) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* in as printable ASCII into out (size bytes): other bytes, and '\\',
   as \\xNN, cut short when out is full.  Bytes read from a damaged file
   never reach a terminal raw. */
static void escape_bytes(char *out, size_t size, const char *in)
{
	size_t o = 0;

	for (; *in != '\0' && o + 5 < size; in++) {
		unsigned char c = (unsigned char)*in;

		if (c >= 0x20 && c < 0x7f && c != '\\')
			out[o++] = (char)c;
		else
			o += (size_t)snprintf(out + o, size - o, "\\x%02x", c);
	}
	out[o] = '\0';
}

static int match_old(struct rebuild *rb)
{
	const struct dbox_salvage *old = rb->old;

	rb->by_guid = malloc((rb->nrecs + 1) * sizeof(*rb->by_guid));
	rb->msg_rec = malloc((old->nmsgs + 1) * sizeof(*rb->msg_rec));
	if (rb->by_guid == NULL || rb->msg_rec == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < rb->nrecs; i++)
		rb->by_guid[i] = i;
	if (rb->nrecs > 1)
		qsort_r(rb->by_guid, rb->nrecs, sizeof(*rb->by_guid), by_guid_cmp,
			rb->recs);
	/* Exact locations first, so a GUID-only match cannot take a
	   record another message sits on. */
	for (size_t i = 0; i < old->nmsgs; i++) {
		const struct dbox_salvage_msg *m = &old->msgs[i];
		size_t r = rec_at(rb, m->file_id, m->offset);

		rb->msg_rec[i] = SIZE_MAX;
		if (m->state != DBOX_MSG_COMMITTED || r == SIZE_MAX ||
		    rb->recs[r].claimed || guid_cmp(rb->recs[r].guid, m->guid) != 0)
			continue;
		rb->recs[r].claimed = true;
		rb->msg_rec[i] = r;
	}
	for (size_t i = 0; i < old->nmsgs; i++) {
		const struct dbox_salvage_msg *m = &old->msgs[i];

		if (rb->msg_rec[i] != SIZE_MAX || m->state != DBOX_MSG_COMMITTED ||
		    m->guid[0] == '\0')
			continue;
		for (size_t p = guid_lower(rb, m->guid); p < rb->nrecs; p++) {
			struct rrec *r = &rb->recs[rb->by_guid[p]];

			if (guid_cmp(r->guid, m->guid) != 0)
				break;
			if (!r->claimed) {
				r->claimed = true;
				rb->msg_rec[i] = rb->by_guid[p];
				break;
			}
		}
	}
	/* Last, a whole record still at the old location whose GUID
	   differs: the GUID field is damaged (a committed record never
	   moves and its bytes are never reused), not another message. */
	for (size_t i = 0; i < old->nmsgs; i++) {
		const struct dbox_salvage_msg *m = &old->msgs[i];
		size_t r = rb->msg_rec[i] != SIZE_MAX || m->state !=
			DBOX_MSG_COMMITTED ? SIZE_MAX :
			rec_at(rb, m->file_id, m->offset);
		char shown[2 * sizeof(rb->recs[0].guid) * 4], had[sizeof(shown)];

		if (r == SIZE_MAX || rb->recs[r].claimed)
			continue;
		rb->recs[r].claimed = true;
		rb->msg_rec[i] = r;
		escape_bytes(shown, sizeof(shown), rb->recs[r].guid);
		escape_bytes(had, sizeof(had), m->guid);
		adm_warning("storage/m.%u offset %llu: damaged GUID field "
			    "(the index had '%s', the record says '%s'); the "
			    "message keeps its names", m->file_id,
			    (unsigned long long)m->offset, had, shown);
		rb->damaged_kept++;
	}
	return 0;
}

/* Does a whole record the scan found in m.N file_id overlap the bytes
   [start, end)?  rb->recs is sorted by file and offset. */
static bool overlaps_scanned(const struct rebuild *rb, uint32_t file_id,
			     uint64_t start, uint64_t end)
{
	size_t lo = 0, hi = rb->nrecs;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct rrec *r = &rb->recs[mid];

		if (r->file_id < file_id ||
		    (r->file_id == file_id && r->offset < start))
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo > 0 && rb->recs[lo - 1].file_id == file_id &&
	    rb->recs[lo - 1].offset + rb->recs[lo - 1].record_size > start)
		return true;
	return lo < rb->nrecs && rb->recs[lo].file_id == file_id &&
		rb->recs[lo].offset < end;
}

/* Is the record of old message m still in its m.N, whole in length at
   the location the old index gives, but damaged (its message header or
   its metadata block, so no scan finds it whole), with no whole record
   of the scan on its bytes?  A committed record never moves and its bytes
   are never reused, so those bytes are still that message: it keeps its
   names and location, reads fail with EIO (and check reports it) until
   the record is repaired, but no purge drops it. */
static bool damaged_in_place(struct rebuild *rb,
			     const struct dbox_salvage_msg *m)
{
	uint8_t hdr[DBOX_MSG_HEADER_SIZE];
	uint64_t body_size = 0;
	bool ok, header_ok;
	struct stat sb;
	char name[16];
	int fd;

	if (m->state != DBOX_MSG_COMMITTED || m->record_size <
	    DBOX_MSG_HEADER_SIZE + m->body_size ||
	    m->offset + m->record_size < m->offset ||
	    overlaps_scanned(rb, m->file_id, m->offset,
			     m->offset + m->record_size))
		return false;
	dbox_file_name(name, m->file_id);
	fd = openat(rb->storage_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT && rb->alt_fd >= 0)
		fd = openat(rb->alt_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return false;
	ok = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) &&
		m->offset + m->record_size <= (uint64_t)sb.st_size &&
		pread(fd, hdr, sizeof(hdr), (off_t)m->offset) ==
		(ssize_t)sizeof(hdr);
	header_ok = ok && dbox_msg_header_parse(hdr, &body_size, NULL) == 0 &&
		body_size == m->body_size;
	close(fd);
	if (ok)
		adm_warning("storage/m.%u offset %llu: damaged %s (size and "
			    "location as the index had them); the message "
			    "keeps its names and reads fail with EIO until it "
			    "is repaired", m->file_id,
			    (unsigned long long)m->offset, header_ok ?
			    "metadata block (message header intact)" :
			    "message header");
	return ok;
}

/* --- the tree of the old index ----------------------------------------- */

/* Binary search of n elements of `size` bytes at base, sorted by the
   uint64_t ino at byte ino_off of each, for ino.  Returns its index or
   SIZE_MAX. */
static size_t find_ino(const void *base, size_t n, size_t size,
		       size_t ino_off, uint64_t ino)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		uint64_t at;

		memcpy(&at, (const char *)base + mid * size + ino_off,
		       sizeof(at));
		if (at == ino)
			return mid;
		if (at < ino)
			lo = mid + 1;
		else
			hi = mid;
	}
	return SIZE_MAX;
}

static size_t old_inode(const struct rebuild *rb, uint64_t ino)
{
	return find_ino(rb->old->inodes, rb->old->ninodes,
			sizeof(rb->old->inodes[0]),
			offsetof(struct dbox_attr, ino), ino);
}

static size_t old_msg(const struct rebuild *rb, uint64_t ino)
{
	return find_ino(rb->old->msgs, rb->old->nmsgs,
			sizeof(rb->old->msgs[0]),
			offsetof(struct dbox_salvage_msg, ino), ino);
}

static bool backing_file_ok(const struct rebuild *rb, uint64_t ino)
{
	char name[24];
	struct stat sb;

	snprintf(name, sizeof(name), "%llu", (unsigned long long)ino);
	return rb->files_fd >= 0 &&
		fstatat(rb->files_fd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
		S_ISREG(sb.st_mode);
}

/* Put old inode i into the new index, once.  Returns 1 placed (now or
   before), 0 when it cannot be (its message or file is lost), or a
   negative errno. */
static int place_inode(struct rebuild *rb, size_t i)
{
	const struct dbox_attr *oi = &rb->old->inodes[i];
	struct dbox_attr attr = *oi;
	struct dbox_msgloc loc;
	struct rrec *r;
	size_t m;
	int ret;

	if (rb->placed[i] != 0)
		return rb->placed[i] == 1;
	rb->placed[i] = 2;
	if (oi->kind == DBOX_KIND_FILE && !backing_file_ok(rb, oi->ino)) {
		rb->lost_files++;
		return 0;
	}
	if (oi->kind == DBOX_KIND_MESSAGE) {
		m = old_msg(rb, oi->ino);
		if (m != SIZE_MAX && rb->msg_rec[m] == SIZE_MAX &&
		    damaged_in_place(rb, &rb->old->msgs[m])) {
			const struct dbox_salvage_msg *om = &rb->old->msgs[m];

			/* As the old index had it: size, location, GUID. */
			memset(&loc, 0, sizeof(loc));
			loc.file_id = om->file_id;
			loc.offset = om->offset;
			loc.body_size = om->body_size;
			loc.record_size = om->record_size;
			loc.vsize = om->vsize;
			loc.state = DBOX_MSG_COMMITTED;
			copy_guid(&loc, om->guid);
			if ((ret = dbox_index_rebuild_inode(rb->index, &attr)) < 0 ||
			    (ret = dbox_index_msg_set(rb->index, oi->ino, &loc)) < 0)
				return ret;
			rb->damaged_kept++;
			rb->kept++;
			rb->placed[i] = 1;
			return 1;
		}
		if (m == SIZE_MAX || rb->msg_rec[m] == SIZE_MAX) {
			rb->lost_msgs++;
			return 0;
		}
		r = &rb->recs[rb->msg_rec[m]];
		attr.size = r->plain_size;
		rrec_loc(r, &loc);
		if ((ret = dbox_index_rebuild_inode(rb->index, &attr)) < 0 ||
		    (ret = dbox_index_msg_set(rb->index, oi->ino, &loc)) < 0)
			return ret;
		r->placed = true;
		rb->kept++;
	} else if (oi->kind == DBOX_KIND_SYMLINK) {
		const char *target = dbox_salvage_symlink_target(rb->old, oi->ino);

		if (target == NULL) {
			rb->lost_files++;
			return 0;
		}
		if ((ret = dbox_index_rebuild_inode(rb->index, &attr)) < 0 ||
		    (ret = dbox_index_symlink_set(rb->index, oi->ino, target,
						  strlen(target))) < 0)
			return ret;
	} else if ((ret = dbox_index_rebuild_inode(rb->index, &attr)) < 0 ||
		   (oi->kind == DBOX_KIND_SPECIAL &&
		    (ret = dbox_index_setattr(rb->index, &attr)) < 0)) {
		/* setattr: the device number too */
		return ret;
	}
	rb->placed[i] = 1;
	return 1;
}

/* The extended attributes of every old inode that was placed. */
static int restore_xattrs(struct rebuild *rb)
{
	const struct dbox_salvage *old = rb->old;
	int ret;

	for (size_t k = 0; k < old->nxattrs; k++) {
		const struct dbox_salvage_xattr *x = &old->xattrs[k];
		size_t i = old_inode(rb, x->ino);

		if (i == SIZE_MAX || rb->placed[i] != 1)
			continue;
		ret = dbox_index_xattr_set(rb->index, x->ino, x->name, x->value,
					   x->len, 0);
		if (ret < 0 && ret != -ERANGE && ret != -ENOSPC)
			return ret;
	}
	return 0;
}

/* Rebuild the old tree from the root down, breadth first. */
static int rebuild_tree(struct rebuild *rb)
{
	const struct dbox_salvage *old = rb->old;
	uint64_t *queue;
	size_t head = 0, tail = 0, i;
	int ret = 0;

	rb->placed = calloc(old->ninodes + 1, 1);
	queue = malloc((old->ninodes + 1) * sizeof(*queue));
	if (rb->placed == NULL || queue == NULL) {
		free(queue);
		return -ENOMEM;
	}
	if ((i = old_inode(rb, DBOX_ROOT_INO)) != SIZE_MAX &&
	    old->inodes[i].kind == DBOX_KIND_DIR &&
	    (ret = place_inode(rb, i)) < 0)
		goto out;
	queue[tail++] = DBOX_ROOT_INO;
	while (head < tail && ret >= 0) {
		uint64_t dir = queue[head++];
		size_t lo = 0, hi = old->nentries;

		while (lo < hi) { /* first entry of dir */
			size_t mid = lo + (hi - lo) / 2;

			if (old->entries[mid].parent < dir)
				lo = mid + 1;
			else
				hi = mid;
		}
		for (size_t e = lo; e < old->nentries &&
			     old->entries[e].parent == dir; e++) {
			const struct dbox_salvage_entry *ent = &old->entries[e];

			i = old_inode(rb, ent->ino);
			if (i == SIZE_MAX || ent->ino == DBOX_ROOT_INO ||
			    (old->inodes[i].kind == DBOX_KIND_DIR &&
			     rb->placed[i] != 0)) {
				rb->lost_names++;
				continue;
			}
			if ((ret = place_inode(rb, i)) < 0)
				goto out;
			if (ret == 0) {
				rb->lost_names++;
				continue;
			}
			ret = dbox_index_rebuild_entry(rb->index, dir, ent->name,
						       ent->namelen, ent->ino);
			if (ret < 0)
				goto out;
			rb->names++;
			if (old->inodes[i].kind == DBOX_KIND_DIR)
				queue[tail++] = ent->ino;
		}
	}
out:
	free(queue);
	return ret < 0 ? ret : 0;
}

/* --- new names --------------------------------------------------------- */

static int mkdir_in(struct rebuild *rb, uint64_t parent, const char *name,
		    uint64_t *ino_r)
{
	struct dbox_attr attr;
	int ret = dbox_index_lookup(rb->index, parent, name, strlen(name), &attr);

	if (ret == 0) {
		*ino_r = attr.ino;
		return attr.kind == DBOX_KIND_DIR ? 0 : -ENOTDIR;
	}
	if (ret != -ENOENT)
		return ret;
	ret = dbox_index_create(rb->index, parent, name, strlen(name),
				DBOX_KIND_DIR, S_IFDIR | 0700, rb->uid, rb->gid,
				dbox_now_ns(), &attr);
	*ino_r = attr.ino;
	return ret;
}

/* An empty plain file parent/name (Maildir++'s maildirfolder). */
static int make_plain_file(struct rebuild *rb, uint64_t parent,
			   const char *name)
{
	struct dbox_attr attr;
	char backing[24];
	int fd, ret;

	ret = dbox_index_lookup(rb->index, parent, name, strlen(name), &attr);
	if (ret != -ENOENT)
		return ret;
	if ((ret = dbox_index_create(rb->index, parent, name, strlen(name),
				     DBOX_KIND_FILE, S_IFREG | 0600, rb->uid,
				     rb->gid, dbox_now_ns(), &attr)) < 0)
		return ret;
	snprintf(backing, sizeof(backing), "%llu", (unsigned long long)attr.ino);
	fd = openat(rb->files_fd, backing, O_WRONLY | O_CREAT | O_TRUNC |
		    O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (fchown(fd, rb->uid, rb->gid) < 0 && errno != EPERM)
		ret = -errno;
	close(fd);
	return ret;
}

/* The cur/ directory for mailbox (B), created with new/ tmp/ (and
   maildirfolder for a Maildir++ folder) when missing. */
static int folder_cur(struct rebuild *rb, const char *mailbox, uint64_t *cur_r)
{
	uint64_t folder = DBOX_ROOT_INO, ino;
	char *flat = NULL, *copy, *comp, *save = NULL;
	bool nested = true;
	struct folder *v;
	int ret;

	if (mailbox == NULL || mailbox[0] == '\0' ||
	    strcmp(mailbox, "INBOX") == 0)
		mailbox = "INBOX";
	for (size_t i = 0; i < rb->nfolders; i++) {
		if (strcmp(rb->folders[i].mailbox, mailbox) == 0) {
			*cur_r = rb->folders[i].cur;
			return 0;
		}
	}
	if (strcmp(mailbox, "INBOX") != 0) {
		/* A nested folder A/B that the tree has, else .A.B. */
		if ((copy = strdup(mailbox)) == NULL)
			return -ENOMEM;
		for (comp = strtok_r(copy, "/", &save); comp != NULL && nested;
		     comp = strtok_r(NULL, "/", &save)) {
			struct dbox_attr attr;

			if (dbox_index_lookup(rb->index, folder, comp,
					      strlen(comp), &attr) == 0 &&
			    attr.kind == DBOX_KIND_DIR)
				folder = attr.ino;
			else
				nested = false;
		}
		free(copy);
		if (!nested || folder == DBOX_ROOT_INO) {
			if (asprintf(&flat, ".%s", mailbox) < 0)
				return -ENOMEM;
			for (char *p = flat; *p != '\0'; p++)
				if (*p == '/')
					*p = '.';
			if (strlen(flat) > DBOX_NAME_MAX ||
			    strcmp(flat, ".") == 0 || strcmp(flat, "..") == 0) {
				adm_warning("folder '%s' has no valid Maildir++ "
					    "name; its messages go to INBOX",
					    mailbox);
				free(flat);
				return folder_cur(rb, "INBOX", cur_r);
			}
			ret = mkdir_in(rb, DBOX_ROOT_INO, flat, &folder);
			if (ret == 0)
				ret = make_plain_file(rb, folder, "maildirfolder");
			free(flat);
			if (ret < 0)
				return ret;
		}
	}
	for (size_t i = 0; i < MAILDIR_SUBDIR_COUNT; i++) {
		if ((ret = mkdir_in(rb, folder, maildir_subdirs[i], &ino)) < 0)
			return ret;
		if (i == 0)
			*cur_r = ino;
	}
	v = realloc(rb->folders, (rb->nfolders + 1) * sizeof(*v));
	if (v == NULL)
		return -ENOMEM;
	rb->folders = v;
	if ((v[rb->nfolders].mailbox = strdup(mailbox)) == NULL)
		return -ENOMEM;
	v[rb->nfolders++].cur = *cur_r;
	return 0;
}

/* A record no old message claimed: a new message in its folder. */
static int restore(struct rebuild *rb, struct rrec *r)
{
	struct dbox_attr attr;
	struct dbox_msgloc loc;
	char name[160];
	uint64_t cur;
	time_t when = r->received;
	int ret;

	if ((ret = folder_cur(rb, r->mailbox, &cur)) < 0)
		return ret;
	for (unsigned int n = 0; ; n++) {
		int len = snprintf(name, sizeof(name), "%lld.G%s.rebuild",
				   (long long)when, r->guid[0] != '\0' ? r->guid :
				   "none");

		if (r->guid[0] == '\0' || n > 0)
			len += snprintf(name + len, sizeof(name) - (size_t)len,
					"_%u_%llu_%u", r->file_id,
					(unsigned long long)r->offset, n);
		snprintf(name + len, sizeof(name) - (size_t)len, ":2,");
		/* A foreign or damaged GUID may hold any byte: a name gets
		   letters, digits and "._-:," only. */
		for (char *p = name; *p != '\0'; p++)
			if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') ||
			      (*p >= 'A' && *p <= 'Z') || strchr("._-:,", *p) != NULL))
				*p = '_';
		ret = dbox_index_create(rb->index, cur, name, strlen(name),
					DBOX_KIND_MESSAGE, S_IFREG | 0600,
					rb->uid, rb->gid, dbox_now_ns(), &attr);
		if (ret != -EEXIST)
			break;
	}
	if (ret < 0)
		return ret;
	attr.size = r->plain_size;
	attr.mtime_ns = attr.atime_ns = dbox_time_make(when, 0);
	rrec_loc(r, &loc);
	if ((ret = dbox_index_setattr(rb->index, &attr)) < 0 ||
	    (ret = dbox_index_msg_set(rb->index, attr.ino, &loc)) < 0)
		return ret;
	r->placed = true;
	rb->restored++;
	return 0;
}

/* Did the old index know record r: is it inside the committed end the
   old index had for its m.N?  Only such a record, named by no message,
   was expunged; one past that end (an index older than storage/: a
   restored backup, a lost WAL) was never known to it. */
static bool old_knew(const struct rebuild *rb, const struct rrec *r)
{
	size_t lo = 0, hi = rb->old->nmfiles;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct dbox_salvage_mfile *f = &rb->old->mfiles[mid];

		if (f->file_id == r->file_id)
			return r->offset + r->record_size <= f->size;
		if (f->file_id < r->file_id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return false;
}

/* Restore every record no message of the new index has, one per GUID. */
static int restore_unclaimed(struct rebuild *rb)
{
	int ret;

	for (size_t p = 0; p < rb->nrecs; ) {
		size_t q = p + 1;
		bool has = false;

		/* A group of records with one GUID (empty GUIDs: alone). */
		if (rb->recs[rb->by_guid[p]].guid[0] != '\0')
			while (q < rb->nrecs &&
			       guid_cmp(rb->recs[rb->by_guid[q]].guid,
					rb->recs[rb->by_guid[p]].guid) == 0)
				q++;
		for (size_t k = p; k < q; k++)
			has |= rb->recs[rb->by_guid[k]].placed;
		for (size_t k = p; k < q; k++) {
			struct rrec *r = &rb->recs[rb->by_guid[k]];

			/* A record no name of the old index reaches: when that
			   index is whole, its message was expunged (or unlinked
			   while open); else its names may just be lost. */
			if (r->placed)
				continue;
			if (has) {
				rb->duplicates++;
			} else if (!rb->restore_all && rb->old->complete &&
				   old_knew(rb, r)) {
				rb->expunged++;
			} else {
				if (rb->old->complete && !old_knew(rb, r))
					rb->unknown_restored++;
				if ((ret = restore(rb, r)) < 0)
					return ret;
				has = true;
			}
		}
		p = q;
	}
	return 0;
}

/* Plain files in files/ that no plain file of the new index owns:
   named by their number in lost+found/. */
static int adopt_orphans(struct rebuild *rb)
{
	DIR *d;
	struct dirent *de;
	int ret = 0;

	if (rb->files_fd < 0 || (d = fdopendir(dup(rb->files_fd))) == NULL)
		return 0;
	rewinddir(d);
	while ((de = readdir(d)) != NULL && ret == 0) {
		unsigned long long ino;
		struct dbox_attr attr;
		struct stat sb;
		char *end, name[24];

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		errno = 0;
		ino = strtoull(de->d_name, &end, 10);
		if (*end != '\0' || errno != 0 || de->d_name[0] == '0' ||
		    fstatat(rb->files_fd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISREG(sb.st_mode)) {
			adm_warning("files/%s: not a plain file of dboxfs; left "
				    "alone", de->d_name);
			continue;
		}
		ret = dbox_index_getattr(rb->index, ino, &attr);
		if (ret == 0 && attr.kind == DBOX_KIND_FILE)
			continue; /* placed */
		if (ret < 0 && ret != -ENOENT)
			break;
		if (rb->lost_found == 0 &&
		    (ret = mkdir_in(rb, DBOX_ROOT_INO, "lost+found",
				    &rb->lost_found)) < 0)
			break;
		if (ret == -ENOENT) {
			memset(&attr, 0, sizeof(attr));
			attr.ino = ino;
			attr.kind = DBOX_KIND_FILE;
			attr.mode = S_IFREG | (sb.st_mode & 07777);
			attr.uid = sb.st_uid;
			attr.gid = sb.st_gid;
			attr.mtime_ns = attr.ctime_ns =
				dbox_time_make(sb.st_mtim.tv_sec,
					       sb.st_mtim.tv_nsec);
			attr.atime_ns = dbox_time_make(sb.st_atim.tv_sec,
						       sb.st_atim.tv_nsec);
			ret = dbox_index_rebuild_inode(rb->index, &attr);
		} else {
			/* The number is a directory or message now: the file
			   takes a new one. */
			ret = dbox_index_create(rb->index, rb->lost_found,
						de->d_name, strlen(de->d_name),
						DBOX_KIND_FILE, S_IFREG | 0600,
						sb.st_uid, sb.st_gid,
						dbox_now_ns(), &attr);
			snprintf(name, sizeof(name), "%llu",
				 (unsigned long long)attr.ino);
			if (ret == 0 && renameat(rb->files_fd, de->d_name,
						 rb->files_fd, name) < 0)
				ret = -errno;
			if (ret == 0)
				rb->orphans++;
			continue;
		}
		if (ret == 0)
			ret = dbox_index_rebuild_entry(rb->index, rb->lost_found,
						       de->d_name,
						       strlen(de->d_name), ino);
		if (ret == 0)
			rb->orphans++;
	}
	closedir(d);
	return ret;
}

/* --- the index files --------------------------------------------------- */

static void quiet_sink(enum dbox_log_level level, const char *fmt,
		       va_list args)
{
}

/* Rename index.sqlite (and its -wal, -shm) to a new broken name; *old_r
   gets that name.  Without index.sqlite, *old_r gets the newest
   index.sqlite.broken-* (or NULL).  Returns 0 or -errno. */
static int move_old_index(struct rebuild *rb, char **old_r)
{
	char stamp[32], *name = NULL, *best = NULL;
	struct stat sb;
	time_t now = time(NULL);
	struct tm tm;
	DIR *d;
	struct dirent *de;

	*old_r = NULL;
	if (fstatat(rb->dir_fd, INDEX_NAME, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
		gmtime_r(&now, &tm);
		strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &tm);
		for (int n = 0; ; n++) {
			free(name);
			if ((n == 0 ? asprintf(&name, BROKEN_PREFIX "%s", stamp) :
			     asprintf(&name, BROKEN_PREFIX "%s-%d", stamp, n)) < 0)
				return -ENOMEM;
			if (faccessat(rb->dir_fd, name, F_OK, AT_SYMLINK_NOFOLLOW) < 0)
				break;
		}
		for (int i = 0; i < 3; i++) {
			static const char *const ext[] = { "", "-wal", "-shm" };
			char from[64], to[128];

			snprintf(from, sizeof(from), INDEX_NAME "%s", ext[i]);
			snprintf(to, sizeof(to), "%s%s", name, ext[i]);
			if (renameat(rb->dir_fd, from, rb->dir_fd, to) < 0 &&
			    (i == 0 || errno != ENOENT)) {
				int err = errno;

				adm_error("%s/%s: cannot move it aside: %s",
					  rb->store, from, strerror(err));
				free(name);
				return -err;
			}
		}
		fsync(rb->dir_fd);
		*old_r = name;
		return 0;
	}
	/* A rebuild cut short: read the newest kept index again. */
	if ((d = fdopendir(dup(rb->dir_fd))) == NULL)
		return 0;
	rewinddir(d);
	while ((de = readdir(d)) != NULL) {
		size_t len = strlen(de->d_name);

		if (strncmp(de->d_name, BROKEN_PREFIX, strlen(BROKEN_PREFIX)) != 0 ||
		    (len > 4 && (strcmp(de->d_name + len - 4, "-wal") == 0 ||
				 strcmp(de->d_name + len - 4, "-shm") == 0)))
			continue;
		if (best == NULL || strcmp(de->d_name, best) > 0) {
			free(best);
			best = strdup(de->d_name);
		}
	}
	closedir(d);
	*old_r = best;
	return 0;
}

static void remove_rebuilding(int dir_fd)
{
	unlinkat(dir_fd, REBUILDING_NAME, 0);
	unlinkat(dir_fd, REBUILDING_NAME "-wal", 0);
	unlinkat(dir_fd, REBUILDING_NAME "-shm", 0);
}

static int run(struct rebuild *rb)
{
	char *old_name = NULL, *path = NULL;
	uint64_t inbox;
	int ret;

	if ((ret = move_old_index(rb, &old_name)) < 0)
		return ret;
	if (old_name != NULL) {
		if (asprintf(&path, "%s/%s", rb->store, old_name) < 0) {
			free(old_name);
			return -ENOMEM;
		}
		fprintf(stderr, "dboxadm: the old index is kept as %s/%s\n",
			rb->store, old_name);
		ret = dbox_index_salvage(path, &rb->old);
		free(path);
		path = NULL;
		if (ret < 0) {
			free(old_name);
			return ret;
		}
	}
	free(old_name);
	if (rb->old == NULL && (rb->old = calloc(1, sizeof(*rb->old))) == NULL)
		return -ENOMEM;
	remove_rebuilding(rb->dir_fd);
	if (asprintf(&path, "%s/" REBUILDING_NAME, rb->store) < 0)
		return -ENOMEM;
	ret = dbox_index_open(path, true, &rb->index);
	free(path);
	if (ret < 0)
		return ret;
	if ((ret = dbox_index_begin(rb->index)) < 0)
		return ret;
	progress_init(&rb->progress, "scanned");
	if ((ret = scan_storage(rb)) < 0 ||
	    (ret = match_old(rb)) < 0 ||
	    (ret = rebuild_tree(rb)) < 0 ||
	    (ret = restore_xattrs(rb)) < 0 ||
	    (ret = adopt_orphans(rb)) < 0 ||
	    (ret = restore_unclaimed(rb)) < 0 ||
	    (ret = folder_cur(rb, "INBOX", &inbox)) < 0 ||
	    (ret = dbox_index_rebuild_nlinks(rb->index)) < 0 ||
	    (rb->old->uidvalidity > 0 &&
	     (ret = dbox_index_set_meta(rb->index, "uidvalidity",
					rb->old->uidvalidity)) < 0)) {
		progress_finish(&rb->progress);
		dbox_index_rollback(rb->index);
		return ret;
	}
	progress_finish(&rb->progress);
	ret = dbox_index_commit(rb->index, true);
	dbox_index_close(&rb->index);
	if (ret < 0)
		return ret;
	unlinkat(rb->dir_fd, REBUILDING_NAME "-wal", 0);
	unlinkat(rb->dir_fd, REBUILDING_NAME "-shm", 0);
	if (renameat(rb->dir_fd, REBUILDING_NAME, rb->dir_fd, INDEX_NAME) < 0)
		return -errno;
	fsync(rb->dir_fd);
	return 0;
}

/* Is STORE/index.sqlite a readable index of a newer format?  (A newer
   dboxfs may keep what this one cannot rebuild: refuse.) */
static bool newer_index(struct rebuild *rb)
{
	struct dbox_index *index = NULL;
	char *path;
	int ret;

	if (asprintf(&path, "%s/" INDEX_NAME, rb->store) < 0)
		return false;
	/* Quietly: an unreadable index is why we are here. */
	dbox_log_sink_t *sink = dbox_log_get_sink();

	dbox_log_set_sink(quiet_sink);
	ret = dbox_index_open(path, false, &index);
	dbox_log_set_sink(sink);
	dbox_index_close(&index);
	free(path);
	return ret == -EPROTO;
}

static int rebuild_main(int argc, char **argv)
{
	static const char *const flags[] = { "--restore-all", NULL };
	struct rebuild rb = { .dir_fd = -1, .storage_fd = -1, .files_fd = -1,
			      .alt_fd = -1 };
	bool *flag_r[] = { &rb.restore_all };
	struct stat sb;
	int npos, lock_fd, ret;

	/* --alt=PATH (the one option with a value) before the flags. */
	for (int i = 1; i < argc; i++) {
		if (strncmp(argv[i], "--alt=", 6) != 0)
			continue;
		free(rb.alt_path);
		rb.alt_path = argv[i][6] == '/' ? strdup(argv[i] + 6) :
			realpath(argv[i] + 6, NULL);
		if (rb.alt_path == NULL) {
			adm_error("%s: %s", argv[i], strerror(errno));
			return ADM_EXIT_USAGE;
		}
		memmove(&argv[i], &argv[i + 1], (argc - i) * sizeof(*argv));
		argc--;
		i--;
	}
	if ((ret = adm_parse_args(&adm_verb_rebuild, argc, argv, flags, flag_r,
				  &npos)) == 0 && npos != 1)
		ret = adm_usage_error(&adm_verb_rebuild, "rebuild: need STORE");
	if (ret == 0)
		ret = adm_store_enter(argv[0]);
	if (ret != 0) {
		free(rb.alt_path);
		return ret;
	}
	rb.store = argv[0];
	rb.dir_fd = open(rb.store, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rb.dir_fd < 0 || fstat(rb.dir_fd, &sb) < 0) {
		adm_error("%s: %s", rb.store, strerror(errno));
		return ADM_EXIT_USAGE;
	}
	rb.uid = sb.st_uid;
	rb.gid = sb.st_gid;
	rb.storage_fd = openat(rb.dir_fd, DBOX_STORE_STORAGE, O_RDONLY | O_DIRECTORY |
			       O_NOFOLLOW | O_CLOEXEC);
	if (rb.storage_fd < 0) {
		adm_error("%s: not a dbox store (no storage/): %s", rb.store,
			  strerror(errno));
		close(rb.dir_fd);
		return ADM_EXIT_USAGE;
	}
	umask(077);
	if ((lock_fd = dbox_store_lock(rb.dir_fd, rb.store)) < 0) {
		if (lock_fd == -EBUSY)
			adm_error("%s: unmount it first", rb.store);
		close(rb.storage_fd);
		close(rb.dir_fd);
		return ADM_EXIT_USAGE;
	}
	if (mkdirat(rb.dir_fd, DBOX_STORE_FILES, 0700) < 0 && errno != EEXIST)
		adm_warning("%s/files: %s", rb.store, strerror(errno));
	rb.files_fd = openat(rb.dir_fd, DBOX_STORE_FILES, O_RDONLY | O_DIRECTORY |
			     O_NOFOLLOW | O_CLOEXEC);
	if (rb.files_fd < 0 && errno != ENOENT) {
		/* Its plain files would be lost from the new index. */
		adm_error("%s/files: %s; nothing was rebuilt", rb.store,
			  errno == ELOOP ? "a symbolic link (refused)" :
			  strerror(errno));
		ret = -errno;
		goto out;
	}
	if ((ret = open_alt(&rb)) != 0) {
		ret = -EPROTO; /* exit 2 */
		goto out;
	}
	if (newer_index(&rb)) {
		adm_error("%s: the index was made by a newer dboxfs (format "
			  "above %d); rebuild it with that version", rb.store,
			  DBOX_INDEX_FORMAT);
		ret = -EPROTO;
		goto out;
	}

	ret = run(&rb);
	if (ret < 0) {
		adm_error("%s: rebuild failed: %s; the store is left without "
			  "index.sqlite (run 'dboxadm rebuild' again)", rb.store,
			  strerror(-ret));
		dbox_index_close(&rb.index);
		remove_rebuilding(rb.dir_fd);
	} else {
		printf("%s: rebuilt from %lu m.N files: %lu messages kept with "
		       "their names (%lu names), %lu restored with new names, "
		       "%lu duplicate records, %lu expunged records left for "
		       "purge; %lu plain files put in lost+found/\n", rb.store,
		       rb.mfiles, rb.kept, rb.names, rb.restored,
		       rb.duplicates, rb.expunged, rb.orphans);
		if (rb.unknown_restored > 0)
			printf("%s: recovered %lu messages the old index did "
			       "not know (past its end of their m.N: an index "
			       "older than storage/)\n", rb.store,
			       rb.unknown_restored);
		if (rb.damaged_kept > 0)
			printf("%s: %lu messages kept under their names with a "
			       "damaged record field (see the warnings; "
			       "'dboxadm check' names them)\n", rb.store,
			       rb.damaged_kept);
		if (rb.old != NULL && rb.old->opened && !rb.old->complete)
			printf("%s: the old index was damaged: names of "
			       "messages it no longer had are new\n", rb.store);
		if (rb.lost_msgs > 0 || rb.lost_files > 0)
			printf("%s: lost: %lu messages of the old index have no "
			       "whole record in storage/, %lu plain files no "
			       "files/<ino>\n", rb.store, rb.lost_msgs,
			       rb.lost_files);
	}
out:
	for (size_t i = 0; i < rb.nrecs; i++)
		free(rb.recs[i].mailbox);
	free(rb.recs);
	free(rb.by_guid);
	free(rb.msg_rec);
	free(rb.placed);
	for (size_t i = 0; i < rb.nfolders; i++)
		free(rb.folders[i].mailbox);
	free(rb.folders);
	dbox_index_salvage_free(&rb.old);
	if (rb.alt_fd >= 0)
		close(rb.alt_fd);
	free(rb.alt_path);
	if (rb.files_fd >= 0)
		close(rb.files_fd);
	close(rb.storage_fd);
	close(lock_fd);
	close(rb.dir_fd);
	return ret == -EPROTO ? ADM_EXIT_USAGE : ret < 0 ? ADM_EXIT_FAILED :
		ADM_EXIT_OK;
}

const struct adm_verb adm_verb_rebuild = {
	.name = "rebuild",
	.summary = "recreate the index from storage/m.N (not mounted)",
	.usage =
	"usage: dboxadm rebuild STORE [--restore-all] [--alt=PATH]\n"
	"\n"
	"Make a new index.sqlite from the storage/m.N files alone, as Dovecot's\n"
	"force-resync does, keeping whatever the old index still knows.  The old\n"
	"index is moved aside as index.sqlite.broken-<UTC time> and never\n"
	"deleted; nothing in storage/ is changed.\n"
	"\n"
	"Messages the old index can still name keep their names (and so their\n"
	"flags), folders, hard links, modes, mtimes and inode numbers; so do\n"
	"directories and plain files.  Messages it does not know are restored\n"
	"into the cur/ of the folder they were saved to (B metadata: INBOX ->\n"
	"the root, A/B -> .A.B), named <received>.G<GUID>.rebuild:2, with the\n"
	"received date as mtime - unless the old index was read whole and the\n"
	"record lies within the end it knew for its m.N, which means it was\n"
	"expunged and waits for purge (a record past that end is restored: the\n"
	"index was older than storage/).  A message whose record has a damaged\n"
	"field where the old index had it keeps its names (reported).  Plain\n"
	"files in files/ that no plain file of the index owns are put in\n"
	"lost+found/.\n"
	"\n"
	"  --restore-all   restore unknown messages even when the old index is\n"
	"                  whole (brings back expunged mail not yet purged)\n"
	"  --alt=PATH      the alternate storage: its storage/m.N are scanned\n"
	"                  too (default: the one the old index recorded)\n"
	"\n"
	"The store must not be mounted.  Progress is shown when stderr is a\n"
	"terminal.  Exit status: 0 rebuilt, 1 failed (the store then has no\n"
	"index.sqlite; run it again), 2 usage error or store refused.\n",
	.run = rebuild_main,
};
