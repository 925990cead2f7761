/*
 * store-recover.c: crash recovery when a store is opened (store.h,
 * dbox_store_open), and the index meta keys it reads: inflight.m.N (the
 * record a writer had in flight), kept.m.N (whole records recovery kept
 * past a committed end) and purged.m.N (a file a purge forgot).
 *
 * Nothing a client was told is stored is ever cut: the record in flight
 * is cut as its delivery is dropped (after a copy in lost+found/ when it
 * is whole: see recover_mfile); whole records the index does not know
 * are kept (an index older than storage/); any other byte cut is copied
 * to lost+found/ first.
 */
#include "engine/lost-found.h"
#include "engine/namespace.h"
#include "engine/store-layout.h"
#include "engine/store-dirs.h"
#include "engine/store-private.h"

#include "index/index-rebuild.h"
#include "index/wal-sync.h"
#include "storage/dbox-file.h"
#include "storage/dbox-scan.h"
#include "storage/io.h"
#include "storage/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void dbox_store_tail_keys(uint32_t file_id, char inflight[32], char kept[32])
{
	snprintf(inflight, 32, "inflight.m.%u", file_id);
	snprintf(kept, 32, "kept.m.%u", file_id);
}

/* The keys of the mark a cut recovery could not make leaves, for the next
   recovery (the inflight.m.N marks and WRITING rows it read are gone by
   then): uncut.m.N the in-flight offset it judged, uncut_size.m.N the
   file's size then.  The mark holds only while the file still has that
   size: a file with bytes past its end takes no new records, so a size
   that changed means the mark is stale (an index put back from a copy,
   a file number used again after a purge). */
static void uncut_keys(uint32_t file_id, char key[32], char size_key[32])
{
	snprintf(key, 32, "uncut.m.%u", file_id);
	snprintf(size_key, 32, "uncut_size.m.%u", file_id);
}

/* Leave the mark: the write in flight starts at offset, the file has
   size bytes. */
static void note_uncut(struct dbox_index *index, uint32_t file_id,
		       uint64_t offset, uint64_t size)
{
	char key[32], size_key[32];

	uncut_keys(file_id, key, size_key);
	(void)dbox_index_meta_set(index, key, (int64_t)offset);
	(void)dbox_index_meta_set(index, size_key, (int64_t)size);
}

/* Forget the mark once its cut is made (no row is left behind for every
   file ever cut). */
static void forget_uncut(struct dbox_index *index, uint32_t file_id)
{
	char key[32], size_key[32];
	int64_t v;

	uncut_keys(file_id, key, size_key);
	if (dbox_index_meta_get(index, key, &v) == 0 && v != -1)
		(void)dbox_index_meta_set(index, key, -1);
	if (dbox_index_meta_get(index, size_key, &v) == 0 && v != -1)
		(void)dbox_index_meta_set(index, size_key, -1);
}

int64_t dbox_store_copy_mark(struct dbox_index *index, uint32_t file_id,
			     uint64_t committed, uint64_t file_size)
{
	char inflight_key[32], kept_key[32], uncut[32], uncut_size[32];
	int64_t v, size, mark = -1;

	dbox_store_tail_keys(file_id, inflight_key, kept_key);
	uncut_keys(file_id, uncut, uncut_size);
	if (dbox_index_meta_get(index, inflight_key, &v) == 0 && v >= 0 &&
	    (uint64_t)v >= committed)
		mark = v;
	if (dbox_index_meta_get(index, uncut, &v) == 0 && v >= 0 &&
	    dbox_index_meta_get(index, uncut_size, &size) == 0 &&
	    size >= 0 && (uint64_t)size == file_size &&
	    (uint64_t)v >= committed && (mark < 0 || v < mark))
		mark = v;
	return mark;
}

void dbox_store_tail_state(struct dbox_index *index, uint32_t file_id,
			   uint64_t committed, uint64_t file_size,
			   int64_t *inflight_r, uint64_t *kept_r)
{
	char inflight_key[32], kept_key[32];
	int64_t kept;
	uint64_t writing;

	*inflight_r = dbox_store_copy_mark(index, file_id, committed,
					   file_size);
	dbox_store_tail_keys(file_id, inflight_key, kept_key);
	if (dbox_index_writing_offset(index, file_id, committed, &writing) == 1 &&
	    (*inflight_r < 0 || writing < (uint64_t)*inflight_r))
		*inflight_r = (int64_t)writing;
	if (dbox_index_meta_get(index, kept_key, &kept) < 0 || kept < 0 ||
	    (uint64_t)kept < committed)
		kept = (int64_t)committed;
	*kept_r = (uint64_t)kept;
}

/* Copy bytes [from, end) of storage/name (open as fd; ALT/storage/name
   when alt) to STORE/lost+found/name-<from> (lost-found.h; the name it
   got in copy) before recovery cuts them.  Returns 0 or a negative errno
   (logged): then nothing is cut. */
static int save_cut_bytes(struct dbox_store *st, int fd, const char *name,
			  bool alt, uint64_t from, uint64_t end,
			  char copy[DBOX_LOST_FOUND_NAME_SIZE])
{
	char base[48];
	int ret;

	snprintf(base, sizeof(base), "%s-%llu", name, (unsigned long long)from);
	ret = dbox_lost_found_keep(st->dir_fd, fd, from, end, base, copy);
	if (ret < 0)
		dbox_error("%s/%s/%s: cannot keep the bytes recovery would cut "
			   "(%s); " DBOX_STORE_STORAGE "/%s is left as it is", st->path,
			   DBOX_STORE_LOST_FOUND, base, strerror(-ret), name);
	else
		dbox_info("%s/" DBOX_STORE_STORAGE "/%s: the %llu bytes cut after %llu are kept "
			  "as a copy in %s/%s/%s (delete it once 'dboxadm "
			  "check' finds the store clean)", dbox_store_dir_name(st, alt), name, (unsigned long long)(end - from),
			  (unsigned long long)from, st->path, DBOX_STORE_LOST_FOUND,
			  copy);
	return ret;
}

/* Is the m.N sb (root/storage/name) linked under another name too - a
   backup made with --link-dest, a Dovecot store adopted in place
   (import-dovecot)?  Then its bytes are that name's as much as ours, and
   recovery cuts none of them: the store never appends to such a file
   (dbox_store_pool_adopt), so bytes past our committed end are not ours
   to cut.  Logged when true. */
static bool shared_file(const char *root, const char *name,
			const struct stat *sb)
{
	if (sb->st_nlink <= 1)
		return false;
	dbox_warning("%s/" DBOX_STORE_STORAGE "/%s: bytes past what the index knows, but the "
		     "file has %ju other names (hard links: a backup's "
		     "--link-dest, a Dovecot store adopted in place); left as "
		     "it is", root, name, (uintmax_t)(sb->st_nlink - 1));
	return true;
}

/* Remember m.<file_id> as one this recovery did not judge: its in-flight
   mark must outlive the open (dbox_store_drop_inflight_marks), or a copy
   an altmove or purge had in flight into an ALT that was not mounted
   then is kept for good when ALT is back, as mail the index does not
   know (helper-77).  Returns 0 or -ENOMEM. */
static int unjudged(struct dbox_store *st, uint32_t file_id)
{
	uint32_t *v = realloc(st->unjudged,
			      (st->unjudged_count + 1) * sizeof(*v));

	if (v == NULL)
		return -ENOMEM;
	st->unjudged = v;
	st->unjudged[st->unjudged_count++] = file_id;
	return 0;
}

/* dbox_store_drop_inflight_marks' walk: the marks of judged m.N. */
static int drop_mark_cb(void *ctx, const char *key, int64_t value)
{
	struct dbox_store *st = ctx;
	unsigned int id;
	int end = 0;

	(void)value;
	if (sscanf(key, "inflight.m.%u%n", &id, &end) == 1 &&
	    key[end] == '\0') {
		for (size_t i = 0; i < st->unjudged_count; i++)
			if (st->unjudged[i] == id)
				return 0;
	}
	return dbox_index_meta_delete(st->index, key) < 0 ? -EIO : 0;
}

void dbox_store_drop_inflight_marks(struct dbox_store *st)
{
	if (st->unjudged_count == 0)
		(void)dbox_index_meta_delete_prefix(st->index, "inflight.");
	else
		(void)dbox_index_meta_list(st->index, "inflight.",
					   drop_mark_cb, st);
}

/* Recovery of one m.N past its committed end `size`, before the index's
   own recovery drops the WRITING rows.  The record a save or purge had in
   flight starts where its m.N ended when it took the file: a delivery's
   WRITING row says where, as inflight.m.N does for a copy-on-write copy
   or a purge's copies (committed before their first byte is written).
   That record and what follows is cut: nobody was told it is stored,
   unless this index is a copy older than the record's finish (below).
   Whole records before it are no unfinished write but messages an older
   index does not know (a restored backup, a lost WAL): they are never
   cut; kept.m.N remembers them, the file takes no new records, and
   'dboxadm rebuild' brings them back into their folders.  Other bytes (a
   torn record) are cut after a copy is kept in lost+found/. */
static int recover_mfile(void *ctx, uint32_t file_id, uint64_t size)
{
	struct dbox_store *st = ctx;
	char name[16], inflight_key[32], kept_key[32];
	int64_t inflight;
	uint64_t start, keep_end, rows_end;
	struct stat stbuf;
	long whole = 0;
	bool alt;
	int fd, dir;

	dbox_file_name(name, file_id);
	dir = dbox_store_mfile_dir(st, file_id, &alt);
	if (dir < 0)
		return unjudged(st, file_id); /* logged: ALT is missing */
	fd = openat(dir, name, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0 && errno == EROFS)
		/* A read-only ALT: its records are read, never cut. */
		fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
			    O_CLOEXEC);
	if (fd < 0) {
		int err = errno;

		/* One no committed message names: made just before a crash
		   that took the file (a new m.N of the pool, or of a purge
		   or copy whose bytes the crash cut); nothing is lost.  Its
		   row stays: numbers are never handed out again. */
		if (err == ENOENT &&
		    dbox_index_mfile_rows_end(st->index, file_id, &rows_end) == 0 &&
		    rows_end == 0) {
			dbox_info("%s/" DBOX_STORE_STORAGE "/%s: not on disk, and no message "
				  "is stored in it (made just before a crash "
				  "that took it); nothing is lost",
				  dbox_store_dir_name(st, alt), name);
			return 0;
		}
		dbox_error("%s/" DBOX_STORE_STORAGE "/%s: %s; its messages will fail with EIO "
			   "(run 'dboxadm check')", dbox_store_dir_name(st, alt),
			   name, strerror(err));
		return unjudged(st, file_id);
	}
	if (fstat(fd, &stbuf) < 0 || (uint64_t)stbuf.st_size <= size ||
	    shared_file(dbox_store_dir_name(st, alt), name, &stbuf)) {
		close(fd);
		return 0;
	}
	/* Records committed messages name are never cut: a committed end
	   below them is a damaged row (one lowered number cut every
	   message after it out of the m.N: helper-61), and is raised. */
	if (dbox_index_mfile_rows_end(st->index, file_id, &rows_end) == 0 &&
	    rows_end > size && rows_end <= (uint64_t)stbuf.st_size) {
		dbox_warning("%s/" DBOX_STORE_STORAGE "/%s: the index puts its committed end "
			     "at %llu, before the end %llu of records its "
			     "messages name (a damaged row); set to %llu",
			     dbox_store_dir_name(st, alt), name,
			     (unsigned long long)size,
			     (unsigned long long)rows_end,
			     (unsigned long long)rows_end);
		if (dbox_index_begin(st->index) == 0 &&
		    (dbox_index_mfile_set(st->index, file_id, rows_end) < 0 ||
		     dbox_index_commit(st->index, false) < 0))
			dbox_index_rollback(st->index);
		size = rows_end;
		if ((uint64_t)stbuf.st_size <= size) {
			close(fd);
			return 0;
		}
	}
	/* Mail whose rows the crash lost: put back first, which moves
	   the committed end over it (store-restore.c). */
	if (!st->import_killed) {
		int64_t mark = dbox_store_copy_mark(st->index, file_id, size,
						    (uint64_t)stbuf.st_size);

		size = dbox_store_restore_sealed(st, fd, file_id, alt, size,
						 mark < 0 ? UINT64_MAX :
						 (uint64_t)mark);
		if ((uint64_t)stbuf.st_size <= size) {
			close(fd);
			return 0;
		}
	}
	dbox_store_tail_keys(file_id, inflight_key, kept_key);
	dbox_store_tail_state(st->index, file_id, size, (uint64_t)stbuf.st_size,
			      &inflight, &start);
	/* A killed import's uncommitted records: in flight, from the
	   committed end on (copied to lost+found/, then cut). */
	if (st->import_killed && inflight < 0)
		inflight = (int64_t)start;
	keep_end = start;
	if (inflight < 0 || (uint64_t)inflight > start) {
		whole = dbox_file_tail_records(fd, file_id, start, inflight < 0 ?
					       UINT64_MAX : (uint64_t)inflight,
					       &keep_end, NULL, NULL);
		if (whole < 0)
			whole = 0;
	}
	if (whole > 0) {
		dbox_info("%s/" DBOX_STORE_STORAGE "/%s: %ld whole records after the committed "
			  "end %llu that the index does not know (is the index "
			  "older than " DBOX_STORE_STORAGE "/?) are kept; 'dboxadm check' "
			  "names them and 'dboxadm rebuild' brings them back",
			  dbox_store_dir_name(st, alt), name, whole,
			  (unsigned long long)size);
		if (dbox_index_meta_set(st->index, kept_key,
					(int64_t)keep_end) < 0) {
			close(fd);
			return 0; /* nothing cut */
		}
		st->kept_records += (unsigned long)whole;
	}
	/* A delivery whose create was still a deferred commit has no
	   WRITING row: its record, not sealed yet, is told by the
	   placeholder it starts with. */
	if (inflight < 0 && dbox_append_unsealed_at(fd, keep_end))
		inflight = (int64_t)keep_end;
	if ((uint64_t)stbuf.st_size > keep_end) {
		/* The record in flight is dropped as its delivery is, when
		   it is no whole record (its header is written last).  Other
		   bytes only after a copy, and so is a whole record at the
		   in-flight mark: a save the crash cut between its seal and
		   its commit looks exactly like one finished, acknowledged
		   and renamed under a newer copy of the index (this one
		   restored from a copy taken while it was in flight), and
		   the second must not be lost. */
		char copy[DBOX_LOST_FOUND_NAME_SIZE];
		uint64_t end;
		long whole_inflight = inflight >= 0 &&
			(uint64_t)inflight == keep_end ?
			dbox_file_tail_records(fd, file_id, keep_end,
					       UINT64_MAX, &end, NULL, NULL) : -1;
		/* A purge's or rewrite's copies of messages the index has
		   whole at their old place: no mail of their own. */
		bool copies = whole_inflight > 0 &&
			dbox_store_tail_copies(st->index, st->storage_fd,
					       st->alt_fd, fd, file_id,
					       keep_end, &whole_inflight);
		bool only_inflight = whole_inflight == 0 || copies;

		if (!only_inflight &&
		    save_cut_bytes(st, fd, name, alt, keep_end, stbuf.st_size,
				   copy) < 0) {
			/* The next recovery must judge these bytes as this
			   one did: remember where the write in flight (or
			   the torn record) starts. */
			note_uncut(st->index, file_id, keep_end,
				   (uint64_t)stbuf.st_size);
			close(fd);
			return 0;
		}
		if (copies)
			dbox_info("%s/" DBOX_STORE_STORAGE "/%s: %ld whole records "
				  "from offset %llu are copies of messages the "
				  "index has at their old place (a purge or "
				  "rewrite the crash cut before its commit); "
				  "nothing is lost", dbox_store_dir_name(st, alt),
				  name, whole_inflight,
				  (unsigned long long)keep_end);
		else if (whole_inflight > 0)
			dbox_warning("%s/" DBOX_STORE_STORAGE "/%s: %ld whole records from "
				     "offset %llu, where the index has a write in "
				     "flight: a save the crash cut short, or mail "
				     "delivered after this index was copied (a "
				     "restored index); kept in %s/%s/%s "
				     "('dboxadm cat %s %s/%s/%s 0' shows the "
				     "first)", dbox_store_dir_name(st, alt), name,
				     whole_inflight, (unsigned long long)keep_end,
				     st->path, DBOX_STORE_LOST_FOUND, copy,
				     st->path, st->path, DBOX_STORE_LOST_FOUND,
				     copy);
		dbox_info("%s/" DBOX_STORE_STORAGE "/%s: cutting %llu bytes of unfinished "
			  "writes after %llu", dbox_store_dir_name(st, alt), name,
			  (unsigned long long)(stbuf.st_size - keep_end),
			  (unsigned long long)keep_end);
		if (ftruncate(fd, keep_end) < 0) {
			dbox_error("%s/" DBOX_STORE_STORAGE "/%s: ftruncate: %s",
				   dbox_store_dir_name(st, alt), name, strerror(errno));
			note_uncut(st->index, file_id, keep_end,
				   (uint64_t)stbuf.st_size);
		} else {
			forget_uncut(st->index, file_id);
		}
	}
	close(fd);
	return 0;
}

int dbox_store_purged_mark(struct dbox_index *index, uint32_t file_id,
			   uint64_t ino)
{
	char key[32];

	snprintf(key, sizeof(key), "purged.m.%u", file_id);
	return dbox_index_meta_set(index, key, (int64_t)ino);
}

int dbox_store_purged_forget(struct dbox_index *index, uint32_t file_id)
{
	char key[32];

	snprintf(key, sizeof(key), "purged.m.%u", file_id);
	return dbox_index_meta_set(index, key, 0);
}

bool dbox_store_purged_file(struct dbox_index *index, uint32_t file_id,
			    const struct stat *sb)
{
	char key[32];
	int64_t v;

	snprintf(key, sizeof(key), "purged.m.%u", file_id);
	return dbox_index_meta_get(index, key, &v) == 0 && v > 1 &&
		(uint64_t)v == (uint64_t)sb->st_ino;
}

int dbox_store_unknown_records(struct dbox_store *st, int fd, uint32_t file_id)
{
	size_t header_len;
	uint64_t end;
	struct stat sb;

	dbox_store_assert_locked(st);
	if (fstat(fd, &sb) < 0)
		return 1;
	if (sb.st_size == 0 || dbox_store_purged_file(st->index, file_id, &sb))
		return 0;
	if (dbox_file_read_header(fd, &header_len) < 0)
		return 1;
	return dbox_file_tail_records(fd, file_id, header_len, UINT64_MAX, &end,
				      NULL, NULL) != 0;
}

/* Recovery of the m.N files the index does not know.  Their creation
   was in a transaction that never committed - a save commits the file
   before writing to it, so such a file holds no whole record -, or this
   index purged them (purged.m.N: a crash between the switch and the
   unlink left copies), or they come from a later life of the store than
   this index (a restored backup, a lost WAL).  Whole records are kept in
   the last case (check reports them, rebuild brings them back); other
   bytes are cut to the header line, after a copy when they follow kept
   records.  They keep their number, which is never reused. */
static void recover_unknown_mfiles(struct dbox_store *st, bool alt)
{
	int dir_fd = alt ? st->alt_fd : st->storage_fd;
	const char *root = dbox_store_dir_name(st, alt);
	DIR *dir = dir_fd >= 0 ? fdopendir(dup(dir_fd)) : NULL;
	struct dirent *d;

	if (dir == NULL)
		return;
	rewinddir(dir); /* the dup shares storage_fd's offset */
	while ((d = readdir(dir)) != NULL) {
		struct stat stbuf;
		size_t header_len;
		uint64_t size;
		uint32_t id;
		int fd;

		if (!dbox_mfile_parse_name(d->d_name, &id) ||
		    dbox_index_mfile_get(st->index, id, &size) != -ENOENT)
			continue;
		fd = openat(dir_fd, d->d_name, O_RDWR | O_NOFOLLOW | O_NONBLOCK |
			    O_CLOEXEC);
		if (fd < 0)
			continue;
		if (fstat(fd, &stbuf) == 0 &&
		    dbox_file_read_header(fd, &header_len) == 0 &&
		    (uint64_t)stbuf.st_size > header_len) {
			/* Whole records: messages of an index newer than this
			   one (a save commits its file first, so a file whose
			   creation never committed holds none). */
			char copy[DBOX_LOST_FOUND_NAME_SIZE];
			uint64_t keep_end;
			long whole = dbox_file_tail_records(fd, id, header_len,
							    UINT64_MAX, &keep_end,
							    NULL, NULL);

			/* A file this index purged (a crash between the
			   switch and the unlink) holds copies: garbage, and
			   its name goes as the purge would have removed it
			   (only the name: the file may have other links, a
			   backup's --link-dest or a Dovecot store adopted in
			   place, whose records must stay).  Any other may
			   hold the only copy of a message the index lost
			   (purge copies of an index older than storage/
			   carry GUIDs the index has, at locations that are
			   gone), so its whole records are kept. */
			if (dbox_store_purged_file(st->index, id, &stbuf)) {
				dbox_info("%s/" DBOX_STORE_STORAGE "/%s: purged by this index (a "
					  "crash came before its removal); "
					  "removed", root, d->d_name);
				if (unlinkat(dir_fd, d->d_name, 0) < 0)
					dbox_error("%s/" DBOX_STORE_STORAGE "/%s: unlink: %s",
						   root, d->d_name,
						   strerror(errno));
				else
					(void)dbox_store_purged_forget(st->index,
								       id);
				close(fd);
				continue;
			}
			/* Mail sealed with its path into a file whose creation the
			   crash lost: put back, which enters the file in the
			   index (store-restore.c); what follows is judged as
			   a known file's tail. */
			if (!alt && !st->import_killed && stbuf.st_nlink <= 1) {
				uint64_t end = dbox_store_restore_sealed(
					st, fd, id, alt, header_len, UINT64_MAX);

				if (end > header_len) {
					close(fd);
					(void)recover_mfile(st, id, end);
					continue;
				}
			}
			/* A killed import's file: its records are the
			   import's uncommitted work, copied and cut.  Other
			   bytes are copied before the cut too: a file whose
			   creation a power loss took may hold mail fsync()
			   synced, behind a damaged first record (helper-63:
			   a NUL in its L line cut it all without a copy). */
			bool copy_first = true;

			if (whole > 0 && !st->import_killed) {
				dbox_info("%s/" DBOX_STORE_STORAGE "/%s: unknown to the index; its "
					  "%ld whole records are kept ('dboxadm "
					  "rebuild' brings them back)", root,
					  d->d_name, whole);
				st->kept_records += (unsigned long)whole;
			} else {
				keep_end = header_len;
			}
			/* The save that made the file, killed before the
			   commit of its row (a record's placeholder header:
			   never whole): dropped as its delivery is, without
			   a copy (helper-89: a 30-byte lost+found/m.N-16). */
			if (dbox_append_unsealed_at(fd, keep_end))
				copy_first = false;
			if ((uint64_t)stbuf.st_size > keep_end &&
			    !shared_file(root, d->d_name, &stbuf) &&
			    (!copy_first ||
			     save_cut_bytes(st, fd, d->d_name, alt, keep_end,
					    stbuf.st_size, copy) == 0)) {
				dbox_info("%s/" DBOX_STORE_STORAGE "/%s: unknown to the index; "
					  "cutting %llu bytes of uncommitted "
					  "writes", root, d->d_name,
					  (unsigned long long)
					  (stbuf.st_size - keep_end));
				if (ftruncate(fd, keep_end) < 0)
					dbox_error("%s/" DBOX_STORE_STORAGE "/%s: ftruncate: %s",
						   root, d->d_name,
						   strerror(errno));
			}
		}
		close(fd);
	}
	closedir(dir);
}

/* A killed import's plain file (files/<name>, of no inode): copied to
   lost+found/files-<ino>, then removed.  Returns 0, or a negative errno
   (nothing removed; logged). */
static int import_file_to_lost_found(struct dbox_store *st, const char *name,
				     unsigned long long ino)
{
	char base[48], copy[DBOX_LOST_FOUND_NAME_SIZE];
	struct stat sb;
	int fd, ret;

	fd = openat(st->files_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
		    O_CLOEXEC);
	if (fd < 0 || fstat(fd, &sb) < 0) {
		ret = -errno;
		if (fd >= 0)
			close(fd);
		return ret;
	}
	snprintf(base, sizeof(base), "files-%llu", ino);
	ret = dbox_lost_found_keep(st->dir_fd, fd, 0, (uint64_t)sb.st_size,
				   base, copy);
	close(fd);
	if (ret < 0) {
		dbox_error("%s/%s/%s: cannot keep a killed import's file (%s); "
			   DBOX_STORE_FILES "/%s is left as it is", st->path,
			   DBOX_STORE_LOST_FOUND, base, strerror(-ret), name);
		return ret;
	}
	dbox_info("%s/" DBOX_STORE_FILES "/%s: unknown to the index after an "
		  "import was killed (its uncommitted file, or one written "
		  "after this index was copied, if it was put back); kept in "
		  "%s/%s/%s", st->path, name, st->path, DBOX_STORE_LOST_FOUND,
		  copy);
	unlinkat(st->files_fd, name, 0);
	return 0;
}

/* Recovery of files/: a backing file of an inode that is no plain file
   any more was turned into a message (its unlink cut by the crash) and
   goes.  One that belongs to no inode was created by a transaction that
   never committed (the create of a plain file cut by a crash: always
   empty, as the client only writes after the create returned; or an
   import batch).  SQLite hands its number out
   again, and the next create of a plain file would find the name taken.
   An empty one is removed; one with bytes is kept for 'dboxadm check' and
   'rebuild' (lost+found/), and its number is never handed out. */
static int recover_files(struct dbox_store *st)
{
	DIR *dir = fdopendir(dup(st->files_fd));
	struct dirent *d;
	int ret = 0;

	if (dir == NULL)
		return 0;
	rewinddir(dir); /* the dup shares files_fd's offset */
	while ((d = readdir(dir)) != NULL && ret == 0) {
		unsigned long long ino;
		struct dbox_attr attr;
		struct stat stbuf;
		char *end;

		errno = 0;
		ino = strtoull(d->d_name, &end, 10);
		if (*end != '\0' || errno != 0 || d->d_name[0] < '1' ||
		    d->d_name[0] > '9' ||
		    fstatat(st->files_fd, d->d_name, &stbuf, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		ret = dbox_index_getattr(st->index, ino, &attr);
		if (ret == 0 && attr.kind != DBOX_KIND_FILE) {
			/* A plain file renamed to a message name became a
			   message (its bytes are in an m.N now); the crash
			   came before its backing file was removed. */
			dbox_info("%s/" DBOX_STORE_FILES "/%s: left over from a plain file "
				  "turned into a message; removed", st->path,
				  d->d_name);
			unlinkat(st->files_fd, d->d_name, 0);
		}
		if (ret != -ENOENT) {
			ret = ret == 0 ? 0 : ret;
			continue;
		}
		ret = 0;
		if (dbox_ns_file_gone(st->index, ino)) {
			dbox_info("%s/" DBOX_STORE_FILES "/%s: its plain file was deleted "
				  "and the daemon died before the file went; "
				  "removed", st->path, d->d_name);
			unlinkat(st->files_fd, d->d_name, 0);
			continue;
		}
		if (S_ISREG(stbuf.st_mode) && stbuf.st_size == 0) {
			dbox_info("%s/" DBOX_STORE_FILES "/%s: empty and of no plain file (a "
				  "create cut by a crash); removed", st->path,
				  d->d_name);
			unlinkat(st->files_fd, d->d_name, 0);
			continue;
		}
		if (st->import_killed && S_ISREG(stbuf.st_mode) &&
		    import_file_to_lost_found(st, d->d_name, ino) == 0)
			continue;
		dbox_warning("%s/" DBOX_STORE_FILES "/%s: belongs to no plain file; kept "
			     "('dboxadm rebuild' puts it in " DBOX_STORE_LOST_FOUND "/)",
			     st->path, d->d_name);
		if ((ret = dbox_index_begin(st->index)) == 0) {
			ret = dbox_index_reserve_ino(st->index, ino);
			if (ret == 0)
				ret = dbox_index_commit(st->index, true);
			else
				dbox_index_rollback(st->index);
		}
	}
	closedir(dir);
	/* Every file a key names is gone now. */
	if (ret == 0)
		ret = dbox_index_meta_delete_prefix(st->index,
						    DBOX_META_FILE_GONE_PREFIX);
	return ret;
}

/* fdatasync each regular file of dir (mfiles: m.N names only, else
   every name) changed since `since` (CLOCK_REALTIME seconds); returns
   how many. */
static unsigned int sync_changed(struct dbox_store *st, int dir_fd,
				 const char *dir_name, bool mfiles,
				 time_t since)
{
	DIR *dir = fdopendir(dup(dir_fd));
	unsigned int synced = 0;
	struct dirent *d;

	if (dir == NULL)
		return 0;
	rewinddir(dir); /* the dup shares dir_fd's offset */
	while ((d = readdir(dir)) != NULL) {
		uint32_t id;
		struct stat sb;
		int fd;

		if (d->d_name[0] == '.' ||
		    (mfiles && !dbox_mfile_parse_name(d->d_name, &id)) ||
		    fstatat(dir_fd, d->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISREG(sb.st_mode) || sb.st_mtime < since)
			continue;
		fd = openat(dir_fd, d->d_name, O_RDONLY | O_NOFOLLOW |
			    O_NONBLOCK | O_CLOEXEC);
		if (fd < 0)
			continue;
		if (fdatasync(fd) < 0)
			dbox_error("%s/%s/%s: fdatasync: %s", st->path, dir_name,
				   d->d_name, strerror(errno));
		else
			synced++;
		close(fd);
	}
	closedir(dir);
	return synced;
}

void dbox_store_sync_left(struct dbox_store *st)
{
	time_t since = time(NULL) - DBOX_STORE_LEFT_AGE;
	unsigned int n;

	n = sync_changed(st, st->storage_fd, DBOX_STORE_STORAGE, true, since);
	n += sync_changed(st, st->files_fd, DBOX_STORE_FILES, false, since);
	dbox_info("%s: recovery: a process that died left its WAL; synced "
		  "the %u files it changed in the last %d s before that WAL",
		  st->path, n, DBOX_STORE_LEFT_AGE);
}

int dbox_store_recover(struct dbox_store *st, unsigned int *writing_r)
{
	unsigned int writing, orphans;
	uint64_t *files;
	size_t nfiles;
	char name[32];
	int ret;

	dbox_store_assert_locked(st);

	/* An import killed (it commits the mark before its first byte and
	   clears it with its last commit): what the index does not know is
	   its uncommitted work. */
	st->import_killed = dbox_store_import_marked(st->index);
	if (st->import_killed)
		dbox_warning("%s: recovery: an import was killed before it "
			     "finished; what it had not committed is kept in "
			     "%s/ and cut (run the import again to finish it)",
			     st->path, DBOX_STORE_LOST_FOUND);
	/* Tails first: they need the WRITING rows recovery drops. */
	if ((ret = dbox_index_mfile_list(st->index, recover_mfile, st)) < 0)
		return ret;
	ret = dbox_index_recover(st->index, DBOX_META_ACKED_EMPTY, &writing,
				 &orphans, &files, &nfiles);
	if (ret < 0)
		return ret;
	for (size_t i = 0; i < nfiles; i++) {
		dbox_files_name(name, files[i]);
		unlinkat(st->files_fd, name, 0);
	}
	free(files);
	*writing_r = writing;
	if (writing > 0 || orphans > 0)
		dbox_info("%s: recovery: dropped %u unfinished deliveries and "
			  "%u unlinked files", st->path, writing, orphans);
	if ((ret = recover_files(st)) < 0)
		return ret;
	recover_unknown_mfiles(st, false);
	recover_unknown_mfiles(st, true);
	if (st->import_killed) {
		/* Judged: the next open must not judge a later life of the
		   store by it. */
		ret = dbox_store_import_mark_commit(st, false);
		st->import_killed = false;
		if (ret < 0)
			return ret;
	}
	if (st->kept_records > 0)
		dbox_warning("%s: recovery: %lu whole records in " DBOX_STORE_STORAGE "/ are "
			     "unknown to the index and were kept, not cut; run "
			     "'dboxadm rebuild %s' (unmounted) to bring them "
			     "back into their folders", st->path,
			     st->kept_records, st->path);
	return 0;
}

/* A mark of mf changes in the transaction open now: the commit that
   ends it is the next one (st->lock serialises them; one rolled back
   only makes an fsync sync a little more). */
static void mark_changed(struct dbox_store *st, struct dbox_mfile *mf)
{
	mf->mark_seq = dbox_index_commit_seq(st->index) + 1;
}

int dbox_store_note_inflight(struct dbox_store *st, struct dbox_mfile *mf)
{
	char inflight_key[32], kept_key[32];

	dbox_store_assert_locked(st);
	dbox_store_tail_keys(mf->file_id, inflight_key, kept_key);
	mark_changed(st, mf);
	return dbox_index_meta_set(st->index, inflight_key, (int64_t)mf->size);
}

void dbox_store_clear_inflight(struct dbox_store *st, struct dbox_mfile *mf)
{
	char inflight_key[32], kept_key[32];
	int64_t v;

	dbox_store_assert_locked(st);
	dbox_store_tail_keys(mf->file_id, inflight_key, kept_key);
	if (dbox_index_meta_get(st->index, inflight_key, &v) == 0 && v != -1) {
		mark_changed(st, mf);
		(void)dbox_index_meta_set(st->index, inflight_key, -1);
	}
}

bool dbox_store_import_marked(struct dbox_index *index)
{
	int64_t running = 0;

	return dbox_index_meta_get(index, DBOX_META_IMPORT_RUNNING,
				   &running) == 0 && running != 0;
}

int dbox_store_import_mark(struct dbox_store *st, bool running)
{
	dbox_store_assert_locked(st);
	return dbox_index_meta_set(st->index, DBOX_META_IMPORT_RUNNING,
				   running ? 1 : 0);
}

int dbox_store_import_mark_commit(struct dbox_store *st, bool running)
{
	int ret;

	dbox_store_assert_locked(st);
	if ((ret = dbox_index_begin(st->index)) < 0)
		return ret;
	if ((ret = dbox_store_import_mark(st, running)) < 0) {
		dbox_index_rollback(st->index);
		return ret;
	}
	return dbox_index_commit(st->index, true);
}
