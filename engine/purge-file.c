/*
 * purge-file.c: one m.N of a purge or altmove (purge.h): its live (or
 * selected) records copied verbatim to m.N files of the append pool or of
 * the alternate storage and synced, the index switched to the copies in
 * one durable transaction, the old file removed.
 *
 * Invariants:
 *  - an m.N being purged is out of the append pool (sealed) before its
 *    record list is read, so no record is added to it afterwards;
 *  - copies are written only past the end of pool files this purge owns
 *    (busy), so nobody else writes there; a purge that does not switch
 *    truncates them back, so the pool files hold only whole records;
 *  - the switch re-checks every row under st->lock (dbox_index_msg_move)
 *    and refuses to forget a file that still has rows;
 *  - the old m.N is unlinked only after the switch is durable.
 */
#include "engine/store-layout.h"
#include "engine/purge-private.h"

#include "index/index-purge.h"
#include "index/reserve.h"
#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* dbox offsets are 32-bit in Dovecot's map: an m.N stays below 4 GiB. */
#define MFILE_MAX ((uint64_t)UINT32_MAX)

static bool cancelled(const struct purge *p)
{
	return p->set->cancel != NULL &&
		__atomic_load_n(p->set->cancel, __ATOMIC_ACQUIRE);
}


/* Is mf a destination of the file being purged already? */
static bool dest_used(const struct purge *p, const struct dbox_mfile *mf)
{
	for (size_t i = 0; i < p->ndests; i++)
		if (p->dests[i].mf == mf)
			return true;
	return false;
}

/* The pool file to copy a record of record_size bytes to: the current
   one while it has room, else a new one from the pool (locked).  A new
   one's in-flight mark is on disk before the first byte is copied to it:
   the timed round may sync the file before the switch's commit, and a
   power loss in between must find the mark and cut the copies, not keep
   them as records the index lost (as for a message's copy,
   fs/fs-write.c). */
static int dest_for(struct purge *p, uint64_t record_size, struct dest **d_r)
{
	struct dest *d = p->ndests > 0 ? &p->dests[p->ndests - 1] : NULL;
	struct dbox_mfile *mf;
	bool marked = false;
	int ret;

	if (d != NULL && d->mf->size < p->st->rotate_size &&
	    d->mf->size + record_size <= MFILE_MAX) {
		*d_r = d;
		return 0;
	}
	if (p->ndests == p->dests_size) {
		size_t size = p->dests_size == 0 ? 4 : p->dests_size * 2;
		struct dest *n = realloc(p->dests, size * sizeof(*n));

		if (n == NULL)
			return -ENOMEM;
		p->dests = n;
		p->dests_size = size;
	}
	purge_lock(p);
	if (!p->to_alt) {
		ret = dbox_store_mfile_acquire(p->st, &mf);
		marked = ret == 0;
	} else if (p->nalts > 0 && !dest_used(p, p->alts[p->nalts - 1]) &&
		   p->alts[p->nalts - 1]->size < p->st->rotate_size &&
		   p->alts[p->nalts - 1]->size + record_size <= MFILE_MAX) {
		/* The ALT file the previous file's copies went to. */
		mf = p->alts[p->nalts - 1];
		ret = 0;
	} else {
		struct dbox_mfile **alts = realloc(p->alts, (p->nalts + 1) *
						   sizeof(*alts));

		ret = -ENOMEM;
		if (alts != NULL) {
			p->alts = alts;
			ret = dbox_store_alt_create(p->st, &mf);
			if (ret == 0)
				p->alts[p->nalts++] = mf;
		}
	}
	/* An ALT file's copies are in flight until the switch, as pool
	   files' are (dbox_store_mfile_acquire notes those). */
	if (ret == 0 && p->to_alt) {
		ret = dbox_store_note_inflight(p->st, mf);
		marked = ret == 0;
	}
	purge_unlock(p);
	if (ret < 0)
		return ret;
	d = &p->dests[p->ndests++];
	d->mf = mf;
	d->start_size = mf->size;
	*d_r = d;
	/* The mark was autocommitted: a sync of all the WAL holds (its
	   round syncs the message bytes that commits before it name). */
	return marked ? dbox_store_sync_wal(p->st, 0) : 0;
}

/* Give the pool files back; keep=false first cuts off what was copied to
   them.  Needs st->lock. */
static void dests_release(struct purge *p, bool keep)
{
	for (size_t i = 0; i < p->ndests; i++) {
		struct dest *d = &p->dests[i];
		/* A cut that failed before (copy_records) leaves the
		   in-flight mark to recovery. */
		bool cut = !d->mf->cut_failed;

		if (!keep && d->mf->size != d->start_size) {
			if (ftruncate(d->mf->fd, d->start_size) < 0) {
				dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u: cutting purge copies "
					   "at %llu: %s (recovery cuts them at "
					   "the next open)",
					   dbox_store_dir_name(p->st, p->to_alt),
					   d->mf->file_id,
					   (unsigned long long)d->start_size,
					   strerror(errno));
				cut = false;
				d->mf->cut_failed = true;
			}
			d->mf->size = d->start_size;
		}
		/* Copies switched or given back: none in flight (a failed
		   cut leaves them to recovery, which needs to know). */
		if (!keep && cut)
			dbox_store_clear_inflight(p->st, d->mf);
		if (!p->to_alt) /* ALT files stay until the run ends */
			dbox_store_mfile_release(p->st, d->mf);
	}
	p->ndests = 0;
}

/* Copy len bytes from in at in_off to out at out_off. */
static int copy_range(struct purge *p, int in, uint64_t in_off, int out,
		      uint64_t out_off, uint64_t len)
{
	while (len > 0) {
		size_t want = len < COPY_SIZE ? (size_t)len : COPY_SIZE;
		ssize_t n = pread(in, p->buf, want, (off_t)in_off), w;

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		for (ssize_t done = 0; done < n; done += w) {
			w = pwrite(out, p->buf + done, n - done,
				   (off_t)(out_off + done));
			if (w < 0) {
				if (errno != EINTR)
					return -errno;
				w = 0;
			}
		}
		in_off += n;
		out_off += n;
		len -= n;
	}
	return 0;
}

/* The roots of the file being purged and of its copies, for log lines. */
static const char *src_root(const struct purge *p)
{
	return dbox_store_dir_name(p->st, p->from_alt);
}

static const char *dest_root(const struct purge *p)
{
	return dbox_store_dir_name(p->st, p->to_alt);
}

/* Copy the records to pool files and sync them; fills moves[]. */
static int copy_records(struct purge *p, uint32_t file_id, int fd,
			const struct dbox_file_rec *recs, size_t nrecs,
			struct dbox_msg_move *moves)
{
	for (size_t i = 0; i < nrecs; i++) {
		const struct dbox_file_rec *r = &recs[i];
		struct dbox_metadata md = { 0 };
		uint64_t body_size, record_size;
		struct dest *d;
		int ret;

		if (cancelled(p))
			return -ECANCELED;
		/* Copy only what reads as the record the index knows (its
		   size, and for a committed row its GUID, as check compares
		   them): a damaged record, or a row pointing at another
		   message's, keeps the file where it is - the record the
		   row should name may be one this purge would drop. */
		ret = dbox_record_read(fd, file_id, r->offset, r->body_size,
				       &body_size, &md, &record_size);
		if (ret == 0 && record_size != r->record_size)
			ret = 1;
		else if (ret == 0 && r->state == DBOX_MSG_COMMITTED &&
			 strncmp(md.guid, r->guid, sizeof(r->guid) - 1) != 0)
			ret = 2;
		dbox_metadata_clear(&md);
		if (ret != 0) {
			dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u offset %llu: record %s; "
				   "the file is not purged", src_root(p),
				   file_id, (unsigned long long)r->offset,
				   ret < 0 ? "unreadable" : ret == 1 ?
				   "size differs from the index" :
				   "GUID differs from the index");
			return -EIO;
		}
		/* Copies wait while the index uses its reserve: files
		   without live records (no copy) give space back first. */
		if ((ret = dbox_index_reserve_check(p->st->index)) < 0 ||
		    (ret = dest_for(p, record_size, &d)) < 0)
			return ret;
		ret = copy_range(p, fd, r->offset, d->mf->fd, d->mf->size,
				 record_size);
		if (ret < 0) {
			dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u -> %s/" DBOX_STORE_STORAGE
				   "/m.%u: copying the record at %llu: %s",
				   src_root(p), file_id, dest_root(p),
				   d->mf->file_id, (unsigned long long)r->offset,
				   strerror(-ret));
			/* The part copied lies past mf->size, where
			   dests_release does not look: cut it now. */
			if (ftruncate(d->mf->fd, (off_t)d->mf->size) < 0)
				d->mf->cut_failed = true; /* recovery cuts it */
			return ret;
		}
		moves[i] = (struct dbox_msg_move){
			.ino = r->ino, .old_offset = r->offset,
			.record_size = record_size,
			.new_file_id = d->mf->file_id,
			.new_offset = d->mf->size, .mtime_ns = r->mtime_ns,
		};
		d->mf->size += record_size;
	}
	for (size_t i = 0; i < p->ndests; i++) {
		if (fdatasync(p->dests[i].mf->fd) < 0) {
			int ret = -errno;

			dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u: fdatasync: %s", dest_root(p),
				   p->dests[i].mf->file_id, strerror(errno));
			return ret;
		}
	}
	return 0;
}

/* The file descriptor a copy went to, or -ENOENT. */
static int dest_fd(const struct purge *p, uint32_t file_id)
{
	for (size_t i = 0; i < p->ndests; i++)
		if (p->dests[i].mf->file_id == file_id)
			return p->dests[i].mf->fd;
	return -ENOENT;
}

/* One durable transaction: rows to their copies, the pool files' new
   committed ends, the old file (inode number ino) forgotten and marked
   purged.  Needs st->lock.  Returns 0
   when committed and on disk; 1 when committed but the sync failed (the
   copies are in use, but the old file must stay until a later sync);
   -EAGAIN when rows are left in the old file (nothing switched), or
   another negative errno (nothing switched).  An altmove (set->altmove)
   moves some records only: rows left in the old file are fine, and the
   file is forgotten only when none is left and it takes no new ones (out
   of the append pool); *forgot_r says whether it was. */
static int switch_file(struct purge *p, uint32_t file_id, uint64_t ino,
		       struct dbox_msg_move *moves, size_t nmoves,
		       bool *forgot_r)
{
	struct dbox_index *index = p->st->index;
	uint64_t left;
	int ret;

	*forgot_r = false;
	if ((ret = dbox_index_begin(index)) < 0)
		return ret;
	ret = dbox_index_msg_move(index, file_id, moves, nmoves, &left);
	if (ret == 0 && p->set->altmove) {
		*forgot_r = left == 0 && !purge_in_pool(p->st, file_id);
	} else if (ret == 0 && left > 0) {
		dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u: %llu records appeared in it during "
			   "the purge; the file is kept", src_root(p), file_id,
			   (unsigned long long)left);
		ret = -EAGAIN;
	}
	for (size_t i = 0; ret == 0 && i < p->ndests; i++) {
		ret = dbox_index_mfile_set(index, p->dests[i].mf->file_id,
					   p->dests[i].mf->size);
		dbox_store_clear_inflight(p->st, p->dests[i].mf);
	}
	if (ret == 0 && !p->set->altmove)
		*forgot_r = true;
	if (ret == 0 && *forgot_r)
		ret = dbox_index_mfile_delete(index, file_id);
	if (ret == 0 && *forgot_r)
		ret = dbox_store_purged_mark(index, file_id, ino);
	if (ret < 0 || (ret = dbox_index_commit(index, false)) < 0) {
		dbox_index_rollback(index);
		return ret;
	}
	if (dbox_index_sync(index) < 0) {
		dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u: purge switched but the index is "
			   "not on disk; the file stays until a later purge",
			   src_root(p), file_id);
		return 1;
	}
	return 0;
}

/* After the switch: the R of a copy follows a received date set while it
   was copied (the index has it; see dbox_store_set_received).  Needs
   st->lock. */
static void fix_received(struct purge *p, const struct dbox_file_rec *recs,
			 const struct dbox_msg_move *moves, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		int fd, ret;

		if (!moves[i].moved || moves[i].mtime_ns == recs[i].mtime_ns)
			continue;
		fd = dest_fd(p, moves[i].new_file_id);
		if (fd >= 0 &&
		    (ret = dbox_record_set_received(fd, moves[i].new_file_id,
				moves[i].new_offset,
				dbox_time_sec(moves[i].mtime_ns))) < 0 &&
		    ret != -ERANGE)
			dbox_warning("%s/" DBOX_STORE_STORAGE "/m.%u offset %llu: received "
				     "date not updated: %s", dest_root(p),
				     moves[i].new_file_id,
				     (unsigned long long)moves[i].new_offset,
				     strerror(-ret));
	}
}

/* The records an altmove takes from recs (committed, received before
   set->altmove_before_ns, in set->altmove_folder when set), packed at
   the start of recs; returns their count. */
static size_t altmove_select(struct purge *p, struct dbox_file_rec *recs,
			     size_t nrecs)
{
	size_t n = 0;

	for (size_t i = 0; i < nrecs; i++) {
		if (recs[i].state != DBOX_MSG_COMMITTED ||
		    (p->set->altmove_before_ns != INT64_MAX &&
		     dbox_time_cmp(recs[i].mtime_ns,
				   p->set->altmove_before_ns) >= 0))
			continue;
		if (p->set->altmove_folder != 0) {
			int in;

			purge_lock(p);
			in = dbox_index_ino_in_folder(p->st->index, recs[i].ino,
						      p->set->altmove_folder);
			purge_unlock(p);
			if (in <= 0)
				continue;
		}
		recs[n++] = recs[i];
	}
	return n;
}

/* Purge one sealed m.N (or, for an altmove, move its selected records to
   the alternate storage). */
int purge_file(struct purge *p, uint32_t file_id)
{
	struct dbox_store *st = p->st;
	struct dbox_file_rec *recs = NULL;
	struct dbox_msg_move *moves = NULL;
	struct stat sb;
	uint64_t committed = 0;
	size_t nrecs = 0;
	char name[16];
	bool alt = false, forgot = false, pooled;
	int fd, dir, ret;

	purge_lock(p);
	pooled = purge_in_pool(st, file_id);
	dir = dbox_store_mfile_dir(st, file_id, &alt);
	fd = dir >= 0 ? dbox_store_read_fd(st, file_id) : -EIO;
	if (fd >= 0)
		fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (fd < 0) {
		purge_unlock(p);
		return -EIO; /* logged by dbox_store_read_fd */
	}
	p->from_alt = alt;
	p->to_alt = alt || p->set->altmove;
	ret = dbox_index_file_records(st->index, file_id, &recs, &nrecs);
	if (ret == 0)
		ret = dbox_index_mfile_get(st->index, file_id, &committed);
	purge_unlock(p);
	if (ret == 0 && p->set->altmove)
		nrecs = altmove_select(p, recs, nrecs);
	if (ret == 0 && p->set->altmove && nrecs == 0) {
		close(fd);
		free(recs);
		return 0;
	}
	if (ret == 0 && fstat(fd, &sb) < 0)
		ret = -errno;
	/* Bytes past the committed end are records the index does not know
	   (an index older than storage/, or a crash recovery has not seen
	   yet), not expunged ones: the file is not removed.  An altmove also
	   takes from files of the append pool, where such bytes are saves in
	   flight: it copies the committed records only, and the file, still
	   in the pool or with their rows, is not forgotten (switch_file). */
	if (ret == 0 && (uint64_t)sb.st_size > committed &&
	    !(p->set->altmove && pooled)) {
		dbox_error("%s/" DBOX_STORE_STORAGE "/m.%u: %llu bytes past the end the index "
			   "knows; not purged (run 'dboxadm check')",
			   dbox_store_dir_name(st, alt), file_id, (unsigned long long)
			   ((uint64_t)sb.st_size - committed));
		ret = -EIO;
	}
	if (ret == 0 && nrecs > 0 &&
	    (moves = calloc(nrecs, sizeof(*moves))) == NULL)
		ret = -ENOMEM;
	if (ret == 0)
		ret = copy_records(p, file_id, fd, recs, nrecs, moves);
	if (ret == 0 && p->set->after_copy != NULL)
		p->set->after_copy(p->set->hook_ctx, file_id);

	purge_lock(p);
	if (ret == 0)
		ret = switch_file(p, file_id, (uint64_t)sb.st_ino, moves,
				  nrecs, &forgot);
	if (ret >= 0) {
		fix_received(p, recs, moves, nrecs);
		dbox_file_name(name, file_id);
		if (forgot)
			dbox_store_read_fd_forget(st, file_id);
		/* Not durable (1): the old file stays, as garbage that a
		   later full purge removes. */
		if (ret == 0 && forgot && unlinkat(dir, name, 0) < 0 &&
		    errno != ENOENT)
			dbox_error("%s/" DBOX_STORE_STORAGE "/%s: unlink after purge: %s "
				   "(the next full purge removes it)",
				   dbox_store_dir_name(st, alt), name,
				   strerror(errno));
		else if (ret == 0 && forgot)
			(void)dbox_store_purged_forget(st->index, file_id);
		for (size_t i = 0; i < nrecs; i++) {
			if (moves[i].moved) {
				p->res->records_moved++;
				p->res->bytes_moved += moves[i].record_size;
			} else {
				p->res->records_dropped++;
			}
		}
		if (ret == 0 && forgot) {
			p->res->files_purged++;
			p->res->bytes_freed += (uint64_t)sb.st_size;
			if (!p->set->quiet)
				dbox_info("%s/" DBOX_STORE_STORAGE "/%s: %s: "
					  "%zu records moved, %llu bytes freed",
					  dbox_store_dir_name(st, alt), name,
					  p->set->altmove ? "moved to the "
					  "alternate storage" : "purged", nrecs,
					  (unsigned long long)sb.st_size);
		} else if (ret == 0 && p->set->altmove) {
			p->res->files_partial++;
		}
		dests_release(p, true);
		ret = ret == 1 ? -EIO : 0;
	} else {
		dests_release(p, false);
	}
	purge_unlock(p);
	if (ret == 0 && p->set->progress != NULL)
		p->set->progress(p->set->hook_ctx, p->res);
	close(fd);
	free(recs);
	free(moves);
	return ret;
}
