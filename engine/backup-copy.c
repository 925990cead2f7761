/*
 * backup-copy.c: one file of the snapshot into DEST.partial: kept from an
 * interrupted run, hard-linked from the previous backup, or copied
 * (backup.h, Incremental).
 */
#include "engine/backup-private.h"
#include "engine/store-layout.h"

#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define COPY_TRIES 3
#define CHUNK ((size_t)8 << 20)

static void progress(struct bk *b, uint64_t files, uint64_t bytes)
{
	if (b->set->progress != NULL)
		b->set->progress(b->set->ctx, files, bytes);
}

/* Write n bytes of buf to out at off, whole.  0 or a negative errno. */
static int write_all(int out, const char *buf, size_t n, off_t off)
{
	for (size_t done = 0; done < n;) {
		ssize_t w = pwrite(out, buf + done, n - done,
				   off + (off_t)done);

		if (w < 0 && errno != EINTR)
			return -errno;
		if (w > 0)
			done += (size_t)w;
	}
	return 0;
}

/* One step of copying, by read/write: up to want bytes at *off.
   Returns the bytes copied (0 at the end of in), -EINTR to try again, or
   a negative errno. */
static ssize_t copy_step_plain(struct bk *b, int in, int out, loff_t *off,
			       size_t want)
{
	ssize_t n;
	int ret;

	if (want > BK_BUF_SIZE)
		want = BK_BUF_SIZE;
	if ((n = pread(in, b->buf, want, *off)) < 0)
		return -errno;
	if (n > 0 && (ret = write_all(out, b->buf, (size_t)n, *off)) < 0)
		return ret;
	*off += n;
	return n;
}

/* Copy len bytes from in (from offset 0) to the new file out: in-kernel
   (copy_file_range: a reflink where the filesystem shares blocks) or by
   read/write.  Returns the bytes copied (fewer when in ended early), or
   a negative errno of a read or write error. */
static int64_t copy_bytes(struct bk *b, int in, int out, uint64_t len)
{
	loff_t off_in = 0, off_out = 0;
	bool plain = false;

	while ((uint64_t)off_in < len) {
		/* Holes stay holes: a store's owner can make a terabyte of
		   hole on a few blocks, which a plain copy would write out
		   in full (out is extended to len at the end). */
		off_t data = lseek(in, off_in, SEEK_DATA);
		size_t want;
		ssize_t n;

		if (data < 0 && errno == ENXIO)
			break; /* a hole up to the end of the file */
		if (data > off_in) {
			off_in = off_out = data < (off_t)len ? data : (off_t)len;
			continue;
		}
		want = len - (uint64_t)off_in > CHUNK ? CHUNK :
			(size_t)(len - (uint64_t)off_in);
		if (plain) {
			n = copy_step_plain(b, in, out, &off_in, want);
			off_out = off_in;
		} else {
			n = copy_file_range(in, &off_in, out, &off_out, want, 0);
			n = n < 0 ? -errno : n;
			if (n == -EXDEV || n == -EINVAL || n == -ENOSYS ||
			    n == -EOPNOTSUPP) {
				plain = true;
				continue;
			}
		}
		if (n == -EINTR)
			continue;
		if (n < 0)
			return n;
		if (n == 0)
			return off_in; /* the source ended early */
		progress(b, 0, (uint64_t)n);
	}
	/* Only holes after off_in (or none): the copy is as long as the
	   source's len bytes, unless the source ended before len. */
	if ((uint64_t)off_in < len) {
		struct stat sb;

		if (fstat(in, &sb) < 0)
			return -errno;
		off_in = (uint64_t)sb.st_size < len ? sb.st_size : (off_t)len;
	}
	if (ftruncate(out, off_in) < 0)
		return -errno;
	return off_in;
}

/* Copy len bytes of the source fd to dst_dir/name, replacing what is
   there (unlinked first: it may be a hard link into PREV).  The copy is on
   disk when this returns len.  Returns the bytes copied, or a negative
   errno. */
static int64_t copy_file(struct bk *b, int fd, int dst_dir, const char *name,
			 uint64_t len)
{
	int64_t n;
	int out;

	if (unlinkat(dst_dir, name, 0) < 0 && errno != ENOENT)
		return -errno;
	out = openat(dst_dir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW |
		     O_CLOEXEC, 0600);
	if (out < 0)
		return -errno;
	n = copy_bytes(b, fd, out, len);
	if (n >= 0 && fdatasync(out) < 0)
		n = -errno;
	if (close(out) < 0 && n >= 0)
		n = -errno;
	return n;
}

/* The manifest entry of the source st, len bytes to back up. */
static void ment_of(struct bk *b, struct bk_ment *rec, const struct stat *st,
		    uint64_t len)
{
	rec->len = len;
	rec->dev = (uint64_t)st->st_dev;
	rec->ino = (uint64_t)st->st_ino;
	rec->size = (uint64_t)st->st_size;
	rec->mtime = bk_ts_ns(&st->st_mtim);
	rec->ctime = bk_ts_ns(&st->st_ctim);
	rec->linkable = len == (uint64_t)st->st_size &&
		rec->ctime + DBOX_BACKUP_LINK_AGE_NS <= b->start_ns;
}

/* Is dir_fd/name a regular file (not a symlink) of exactly len bytes? */
static bool has_copy(int dir_fd, const char *name, uint64_t len)
{
	struct stat st;

	return dir_fd >= 0 &&
		fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
		S_ISREG(st.st_mode) && (uint64_t)st.st_size == len;
}

/* Does m has the copy of rec (the source st) in dir_fd/name? */
static const struct bk_ment *has_entry(const struct bk_manifest *m,
				       const struct bk_ment *rec,
				       const struct stat *st, int dir_fd,
				       const char *name)
{
	const struct bk_ment *e = bk_manifest_find(m, rec->kind, rec->id);

	return e != NULL && bk_same_source(e, st) && e->len == rec->len &&
		has_copy(dir_fd, name, rec->len) ? e : NULL;
}

/* The same bytes in the previous backup, linked.  Only m.N: their
   committed bytes never change, but a plain file of a mounted backup is
   written in place, which would change it in PREV too.  An m.N of PREV
   is no longer what its manifest says when its mtime moved: a mount of
   that backup rewrites a received date in place (helper-77: the
   link shared a date PREV's mount had changed, at the same size).
   Returns 1 when linked, 0 when it must be copied, or a negative errno. */
static int link_prev(struct bk *b, const struct bk_ment *rec,
		     const struct stat *st, const char *name)
{
	int dst_dir = b->part.storage, prev_dir = b->prevs.storage;
	const struct bk_ment *e;
	struct stat pst;

	if (rec->kind == 'm' && prev_dir >= 0) {
		e = bk_manifest_find(&b->prevm, 'm', rec->id);
		b->prev_named += e != NULL;
		if (e != NULL && e->dev == (uint64_t)st->st_dev &&
		    e->ino == (uint64_t)st->st_ino)
			b->prev_kin++;
	}
	if (rec->kind != 'm' || !rec->linkable ||
	    (e = has_entry(&b->prevm, rec, st, prev_dir, name)) == NULL ||
	    !e->linkable || e->copy_mtime < 0 ||
	    fstatat(prev_dir, name, &pst, AT_SYMLINK_NOFOLLOW) < 0 ||
	    bk_ts_ns(&pst.st_mtim) != e->copy_mtime)
		return 0;
	if (unlinkat(dst_dir, name, 0) < 0 && errno != ENOENT)
		return -errno;
	/* EXDEV, EMLINK, EPERM (protected_hardlinks): copy. */
	return linkat(prev_dir, name, dst_dir, name, 0) == 0 ? 1 : 0;
}

/* Copy s to dst_dir/name (rec: its entry, updated).  Returns the bytes
   copied or a negative errno (logged). */
static int64_t copy_src(struct bk *b, const struct bk_src *s, int dst_dir,
			const char *name, struct bk_ment *rec)
{
	const char *what = rec->kind == 'm' ? DBOX_STORE_STORAGE :
		DBOX_STORE_FILES;
	struct stat st2;
	int64_t n = 0;
	int stat_ret;

	for (int i = 0; i < COPY_TRIES; i++) {
		n = copy_file(b, s->fd, dst_dir, name, rec->len);
		if (n < 0) {
			dbox_error("%s/%s/%s: cannot copy %s/%s/%s there: %s",
				   b->partial, what, name, b->store, what, name,
				   strerror((int)-n));
			return n;
		}
		stat_ret = fstat(s->fd, &st2);
		if (stat_ret == 0 && bk_same_source(rec, &st2))
			break;
		/* Written while copied: an m.N only past the committed end
		   (the copy is right, but not whole); a plain file anywhere
		   (copy again). */
		rec->linkable = 0;
		if (rec->kind == 'm' || stat_ret < 0)
			break;
		if (i + 1 == COPY_TRIES) {
			bk_damage(b, DBOX_BACKUP_CHANGED, rec->kind, rec->id,
				  (uint64_t)n, rec->len);
			break;
		}
		rec->len = rec->size = (uint64_t)st2.st_size;
		rec->mtime = bk_ts_ns(&st2.st_mtim);
		rec->ctime = bk_ts_ns(&st2.st_ctim);
	}
	return n;
}

/* The record (with the mtime of its copy, dir_fd/name), the bytes (how),
   counted. */
static void done(struct bk *b, struct bk_ment *rec, int dir_fd,
		 const char *name, uint64_t *files, uint64_t *bytes,
		 uint64_t len)
{
	struct stat st;

	rec->copy_mtime = fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 ?
		bk_ts_ns(&st.st_mtim) : -1;
	++*files;
	*bytes += len;
	progress(b, 1, 0);
	bk_manifest_add(b, rec);
}

void bk_backup_file(struct bk *b, char kind, uint64_t id, uint64_t committed)
{
	struct dbox_backup_result *res = b->res;
	int dst_dir = kind == 'm' ? b->part.storage : b->part.files;
	struct bk_src *s = bk_src_find(kind == 'm' ? &b->msrc : &b->fsrc, id);
	struct bk_ment rec = { .kind = kind, .id = id };
	const struct bk_ment *e;
	struct stat st;
	char name[32];
	uint64_t len;
	int64_t n;
	bool last = kind == 'm' && id == b->last_mfile;
	int ret;

	bk_file_name(name, sizeof(name), kind, id);
	if (s == NULL || fstat(s->fd, &st) < 0) {
		b->failed = -EIO; /* cannot happen: every file was opened */
		return;
	}
	len = (uint64_t)st.st_size;
	if (kind == 'm' && committed > len)
		bk_damage(b, DBOX_BACKUP_SHORT, kind, id, len, committed);
	else if (kind == 'm')
		len = committed;
	ment_of(b, &rec, &st, len);

	/* What an interrupted run of this backup already wrote. */
	if (!last && (e = has_entry(&b->old, &rec, &st, dst_dir, name)) != NULL) {
		rec.linkable = e->linkable;
		done(b, &rec, dst_dir, name, &res->kept, &res->bytes_kept,
		     len);
		return;
	}
	if (!last && (ret = link_prev(b, &rec, &st, name)) != 0) {
		if (ret < 0)
			b->failed = ret;
		else
			done(b, &rec, dst_dir, name, &res->linked,
			     &res->bytes_linked, len);
		return;
	}
	if ((n = copy_src(b, s, dst_dir, name, &rec)) < 0) {
		b->failed = (int)n;
		return;
	}
	if ((uint64_t)n < rec.len) {
		bk_damage(b, DBOX_BACKUP_ENDED, kind, id, (uint64_t)n, rec.len);
		rec.len = (uint64_t)n;
		rec.linkable = 0;
	}
	done(b, &rec, dst_dir, name, &res->copied, &res->bytes_copied,
	     (uint64_t)n);
	bk_hook(b, "copied");
}
