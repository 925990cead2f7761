/*
 * fs-write.c: writing a message: write, truncate, flush (close), release
 * and fsync, and a plain file turned into a message at its last close.
 *
 * A message is written straight into an m.N record owned by its inode's
 * save (inode->save, shared by every handle open for writing).  The record
 * is finished - metadata written, index row COMMITTED - at flush (close)
 * and fsync.  A finished record is never written again: a write,
 * truncate or O_TRUNC open of a committed message - also one whose save
 * finished a moment ago at an fsync or a close - starts a new save with a
 * copy of its bytes (copy-on-write).  The index keeps naming the old
 * record until the copy is finished, so a crash in between leaves the
 * version the last close or fsync acknowledged; the old record becomes
 * garbage for purge then.
 */
#include "engine/store-dirs.h"
#include "engine/store-layout.h"
#include "fs-file.h"
#include "fs-purge.h"

#include "storage/dbox-read.h"
#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Start writing ino's message: a new save (inode->save), holding a copy
   of the first copy_bytes bytes of the committed message.  The index
   keeps the committed record until the save's first finish: a crash
   before leaves the message as it was (recovery cuts the unfinished
   copy), instead of dropping it with all its names.  The copy's m.N row
   and its in-flight mark (inflight.m.N) are committed and synced before
   its first byte; the copy itself runs without the lock, the inode busy
   meanwhile
   (inode->save is NULL until it is done): called and returns with the
   lock held, the inode idle. */
static int start_write(struct fs *fs, struct fs_inode *inode,
		       uint64_t copy_bytes)
{
	struct dbox_store *st = fs->st;
	struct dbox_reader *reader = NULL;
	struct dbox_save *save = NULL;
	struct dbox_msgloc loc;
	struct dbox_attr attr;
	uint64_t off = 0, mark_seq;
	char *mailbox = NULL;
	char buf[65536];
	int ret;

	if ((ret = dbox_msg_locate(st, inode->ino, &attr, &loc)) < 0)
		return ret;
	if (dbox_msg_mailbox(st, inode->ino, &mailbox) < 0)
		mailbox = NULL;
	if (copy_bytes > attr.size)
		copy_bytes = attr.size;
	if (copy_bytes > 0 &&
	    (ret = dbox_store_open_reader(st, &loc, attr.size, &reader)) < 0)
		goto out;
	/* No WRITING row: until the copy is finished the index keeps the
	   old record.  The copy's in-flight mark goes in with its m.N row:
	   recovery must know the copy for an unfinished write (and cut it),
	   not take it for a lost message. */
	if ((ret = dbox_save_begin_copy(st, inode->ino,
					mailbox != NULL ? mailbox : "INBOX",
					&save)) < 0)
		goto out;
	mark_seq = dbox_save_inflight_seq(save);
	fs_busy_begin(fs, inode);
	/* The mark reaches the disk before any byte of the copy can: a
	   sync of its m.N (the timed round's, another message's fsync)
	   may come before the commit that finishes the copy, and a power
	   loss in between must find the mark and cut the copy, not take
	   it for a message the index lost (helper-71: a second message).
	   One WAL sync per copy, shared with concurrent ones. */
	ret = dbox_ns_sync_upto(st, mark_seq);
	while (ret == 0 && off < copy_bytes) {
		size_t want = copy_bytes - off < sizeof(buf) ?
			copy_bytes - off : sizeof(buf);
		ssize_t n = dbox_reader_pread(reader, buf, want, off);

		if (n <= 0) {
			ret = n < 0 ? dbox_corrupt_as_eio((int)n) : -EIO;
			break;
		}
		if ((ret = dbox_save_write(save, buf, n, off)) < 0)
			break;
		off += n;
	}
	fs_busy_end(fs, inode);
	if (ret == 0) {
		inode->save = save;
		save = NULL;
		__atomic_add_fetch(&inode->gen, 1, __ATOMIC_RELEASE);
		fs_purge_note(fs, loc.file_id); /* the old record is garbage */
	}
out:
	dbox_save_free(&save);
	dbox_reader_free(&reader);
	free(mailbox);
	return ret;
}

/* Let go of inode's save; an fsync still using it (between its steps,
   outside the lock: a reference of its own) frees it when done.  Needs
   the lock. */
static void save_drop(struct fs_inode *inode)
{
	dbox_save_free(&inode->save);
}

/* Make inode->save a save that may be written.  None, or one whose
   record is finished (committed at a close or fsync: a version a client
   was told is stored), gives way to a new save holding a copy of the
   first copy_bytes bytes of the committed message: the finished record
   stays what the index names until the copy is finished in its turn.
   Needs the lock and the inode idle; the copy runs unlocked with the
   inode busy (start_write), and it is idle again on return. */
int fs_message_writable(struct fs *fs, struct fs_inode *inode,
			    uint64_t copy_bytes)
{
	if (inode->save != NULL && !dbox_save_finished(inode->save))
		return 0;
	save_drop(inode);
	return start_write(fs, inode, copy_bytes);
}

/* Seal the unsealed save of message inode (dbox_save_seal): R as the
   finish will write it (the time of a write not stored yet), and for a
   new message its path and owner (L, A), so that recovery can put the
   record back there when a power loss takes its row - not for a copy,
   whose old version is in the index under the same GUID, nor for a path
   L cannot hold.  The heavy part (V read back, compression) runs
   unlocked, the inode busy.  Called and returns with the lock held.
   Returns 0 or a negative errno. */
static int message_seal(struct fs *fs, struct fs_inode *inode)
{
	struct dbox_save *save = inode->save;
	struct dbox_owner owner = { 0 };
	time_t received;
	char *path = NULL;
	int ret;

	if ((ret = dbox_msg_received(fs->st, inode->ino, inode->written ?
				     &inode->wtime : NULL, &received)) < 0)
		return ret;
	if (dbox_save_inflight_seq(save) == 0 &&
	    dbox_msg_seal_note(fs->st, inode->ino, &path, &owner) < 0)
		path = NULL;
	fs_busy_begin(fs, inode);
	ret = dbox_save_seal(save, received, path, &owner);
	fs_busy_end(fs, inode);
	free(path);
	return ret;
}

/* Finish the message being written: record on disk, index COMMITTED with
   its size.  sync: data and index on disk before returning.  Opens and
   commits its own transaction.  The record is sealed without the lock
   (the inode busy meanwhile): called and returns with the lock held, the
   inode idle (fs_inode_wait_idle). */
static int message_finish(struct fs *fs, struct fs_inode *inode, bool sync)
{
	struct dbox_store *st = fs->st;
	int ret;

	if (dbox_save_finished(inode->save) && !sync)
		return 0;
	/* With its path, as an fsync's: the timed sync puts its m.N on
	   disk before the WAL, and a power loss between the two leaves the
	   record without its row. */
	if (!dbox_save_sealed(inode->save) &&
	    (ret = message_seal(fs, inode)) < 0)
		return ret;
	ret = dbox_msg_finish(st, inode->ino, inode->save, sync,
			      inode->written ? &inode->wtime : NULL);
	if (ret == 0)
		inode->written = false;
	return ret;
}

/* A client wrote to (or truncated) message inode: its mtime and ctime
   are now, as on ext4; stored when the record is finished. */
void fs_message_written(struct fs_inode *inode)
{
	inode->wtime = dbox_now_ns();
	inode->written = true;
}

void fs_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size,
	      off_t off, struct fuse_file_info *fi)
{
	struct fs *fs = fs_from_req(req);
	struct fs_handle *h = fs_handle_of(fi);
	struct fs_inode *inode = h->inode;
	ssize_t ret;

	if (h->kind == DBOX_KIND_FILE) {
		/* Plain files are data too: the index reserve is not theirs. */
		ret = dbox_store_data_room(fs->st);
		if (ret == 0 && (ret = pwrite(h->fd, buf, size, off)) < 0)
			ret = -errno;
	} else if (!h->writer) {
		ret = -EBADF;
	} else {
		fs_lock(fs);
		fs_inode_wait_idle(fs, inode->ino);
		/* The first write to a committed message, or the first after
		   a flush or fsync committed it: a new copy (made unlocked,
		   the inode busy). */
		ret = fs_message_writable(fs, inode, UINT64_MAX);
		if (ret == 0) {
			/* The bytes go in without the lock: a write may
			   also turn a compressed body plain (all of it). */
			struct dbox_save *save = inode->save;

			fs_busy_begin(fs, inode);
			ret = dbox_save_write(save, buf, size, off);
			fs_busy_end(fs, inode);
		}
		if (ret >= 0)
			fs_message_written(inode);
		fs_unlock(fs);
	}
	if (ret < 0)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_write(req, size);
}

/* close(): the message is acknowledged as it stands; errors (ENOSPC)
   reach the client here, not at release.  A message nobody has written
   yet (new, or just opened with O_TRUNC; truncated to nothing) is not
   finished: its empty version is acknowledged (dbox_msg_ack_empty) and
   its save goes on, because the close may be that of one descriptor of
   several - a shell's `prog > file` closes the one it opened once it is
   moved to 1, before prog writes; Python's mailbox.Maildir.add closes
   its first before it writes through a second - and a finish would make
   their writes a copy, leaving a dead empty record.  The last close's
   release finishes it.  Needs the lock, the inode idle. */
static int message_flush(struct fs *fs, struct fs_inode *inode)
{
	int ret;

	if (dbox_save_finished(inode->save) ||
	    dbox_save_size(inode->save) != 0)
		return message_finish(fs, inode, false);
	ret = dbox_msg_ack_empty(fs->st, inode->ino, inode->save,
				 inode->written ? &inode->wtime : NULL);
	if (ret == 0)
		inode->written = false; /* the time is stored */
	return ret;
}

void fs_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_from_req(req);
	struct fs_handle *h = fs_handle_of(fi);
	int ret = 0;

	if (h->writer) {
		fs_lock(fs);
		fs_inode_wait_idle(fs, ino);
		if (h->inode->save != NULL)
			ret = message_flush(fs, h->inode);
		fs_unlock(fs);
	}
	fuse_reply_err(req, -ret);
}

/* A plain file renamed to a message name while open (rename converts only
   closed files) becomes a message at its last close, as rename would have
   made it.  Its bytes are copied without the lock (fs_file_copy_out);
   called and returns with the lock held.  Its backing file goes once
   that is durable, as after a rename that converts (fs-dir.c): removed
   at once, a power loss that took the commit brought the plain file back
   without its bytes. */
static void file_closed(struct fs *fs, uint64_t ino)
{
	struct dbox_save *copied = NULL;
	uint64_t parent, parent_now;
	char file[24];
	int ret;

	if (!dbox_msg_file_wants(fs->st, ino, &parent))
		return;
	ret = fs_file_copy_out(fs, ino, parent, &copied);
	/* Renamed or linked while it was copied (the lock was free): no
	   message any more, or one of another folder (its B metadata
	   differs: copied again, under the lock, in this rare case). */
	if (ret == 0 && !dbox_msg_file_wants(fs->st, ino, &parent_now))
		ret = -EAGAIN;
	if (ret == 0 && parent_now != parent)
		dbox_save_free(&copied);
	if (ret == 0)
		ret = fs_file_to_message(fs, ino, parent_now, copied, true);
	if (ret == 0)
		dbox_store_doom_file(fs->st, ino);
	dbox_save_free(&copied);
	dbox_files_name(file, ino);
	if (ret < 0 && ret != -EAGAIN)
		dbox_error("%s/" DBOX_STORE_FILES "/%s: not turned into a message: %s",
			   fs->st->path, file, strerror(-ret));
}

/* The last close of handle h of inode ino: a plain file renamed to a
   message name becomes one, a message written through it is finished
   (an unlinked one nobody can see is dropped), and h is freed.  Needs
   the lock. */
static void handle_release(struct fs *fs, uint64_t ino, struct fs_handle *h)
{
	struct fs_inode *inode = h->inode;

	fs_inode_wait_idle(fs, ino);
	if (h->kind == DBOX_KIND_FILE && inode->nopen == 1)
		file_closed(fs, ino);
	if (h->writer && --inode->nwriters == 0 && inode->save != NULL) {
		bool discard = inode->unlinked && inode->nopen == 1 &&
			inode->nlookup == 0;

		/* An unlinked message nobody can see any more is dropped
		   unfinished, giving its bytes back; others are finished. */
		if (!discard && message_finish(fs, inode, false) < 0)
			dbox_error("%s: message inode %llu could not be "
				   "finished at close", fs->st->path,
				   (unsigned long long)ino);
		save_drop(inode);
	}
	fs_handle_free(fs, h);
	fs_inode_unref(fs, ino, 0, true);
}

void fs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_from_req(req);

	fs_lock(fs);
	handle_release(fs, ino, fs_handle_of(fi));
	fs_unlock(fs);
	fuse_reply_err(req, 0);
}

void fs_handles_release(struct fs *fs)
{
	fs_lock(fs);
	while (fs->handles != NULL)
		handle_release(fs, fs->handles->inode->ino, fs->handles);
	fs_unlock(fs);
}

/* fsync of a message.  Its m.N bytes are fdatasync()ed and its index
   row committed before the reply, in that order (a durable index row
   never points at bytes that are not), but without holding the store
   lock across the sync: the record is sealed under the lock, its bytes
   synced outside it, the row committed under it.  A new message's record
   carries its path (L: sealed so here, or by a close of another
   descriptor before), and that one flush is all: recovery puts the
   record back at its path if a power loss takes the row
   (engine/store-restore.c).  Otherwise (a copy, a record sealed
   without a path) the WAL is synced too, by group commit with every
   other fsync in flight (wal-sync.h).  Only a writer's handle keeps the
   save alive outside the lock; other cases, and a write that lands
   between the steps, sync under the lock. */
static int message_fsync(struct fs *fs, struct fs_handle *h)
{
	struct dbox_store *st = fs->st;
	struct fs_inode *inode = h->inode;
	struct dbox_save *save;
	uint64_t seq, seals, inflight_seq, mark_seq = 0;
	bool resealed, restorable = false;
	int fd, ret;

	fs_lock(fs);
	fs_inode_wait_idle(fs, inode->ino);
	save = inode->save;
	if (save == NULL) {
		/* Committed earlier without sync: its record and the index. */
		fd = dbox_msg_record_fd(st, inode->ino);
		(void)dbox_ns_sync_point(st, &seq); /* others' renames */
		fs_unlock(fs);
		if (fd < 0)
			return fd;
		ret = fdatasync(fd) < 0 ? -errno : 0;
		close(fd);
		return ret < 0 ? ret : dbox_ns_sync_upto(st, seq);
	}
	if (!h->writer) {
		ret = message_finish(fs, inode, true);
		fs_unlock(fs);
		return ret;
	}
	inflight_seq = dbox_save_inflight_seq(save);
	/* Sealed without a path (a copy, a path too long, more names than
	   L holds): not restorable below, the fsync syncs the index too. */
	ret = dbox_save_sealed(save) ? 0 : message_seal(fs, inode);
	seals = dbox_save_seals(save);
	if (ret < 0) {
		fs_unlock(fs);
		return ret;
	}
	/* A flush may finish the save meanwhile and a write replace it by
	   a new copy (message_writable): it stays ours until we let go. */
	dbox_save_ref(save);
	fs_unlock(fs);
	/* A copy's in-flight mark is on disk since the copy began
	   (start_write): a power loss before the commit below cuts it. */
	ret = dbox_save_sync(save);
	fs_lock(fs);
	/* Before anything else on the inode: a write may be copying into a
	   new save, or writing this one, unlocked.  The save stays ours
	   (our reference) across the wait. */
	fs_inode_wait_idle(fs, inode->ino);
	resealed = !dbox_save_sealed(save) || dbox_save_seals(save) != seals;
	if (inode->save != save) {
		/* Finished by a flush, then replaced by a copy: its record is
		   committed (and copied), and holds every byte written before
		   this fsync; resealed since, it needs another sync. */
		if (ret == 0 && dbox_save_seals(save) != seals)
			ret = dbox_save_sync(save);
		dbox_save_free(&save);
	} else {
		if (ret == 0 && !resealed) {
			dbox_save_synced(save, seals);
			restorable = inflight_seq == 0 &&
				dbox_save_sealed_with_path(save);
			mark_seq = dbox_save_mark_seq(save);
		}
		dbox_save_free(&save); /* the inode holds it still */
		/* Written to (and maybe finished by a flush) since the seal:
		   those bytes are not synced yet. */
		if (ret == 0)
			ret = message_finish(fs, inode, resealed);
	}
	(void)dbox_ns_sync_point(st, &seq); /* others' renames */
	fs_unlock(fs);
	if (ret < 0)
		return ret;
	/* One flush: the synced record names its path, and recovery puts
	   it back there if this commit does not reach the disk; the timed
	   sync, an fsyncdir or the next fsync carries the row.  Recovery
	   stops at an in-flight mark of the m.N, so the last change of one
	   (a copy's or purge's before this record) must be on disk: at
	   once when it is already (group commit), rare otherwise. */
	if (restorable)
		return mark_seq == 0 ? 0 :
			dbox_ns_sync_upto(st, mark_seq < seq ? mark_seq : seq);
	return dbox_ns_sync_upto(st, seq);
}

void fs_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
	      struct fuse_file_info *fi)
{
	struct fs *fs = fs_from_req(req);
	struct fs_handle *h = fs_handle_of(fi);
	int ret = 0;

	if (h->kind == DBOX_KIND_FILE) {
		uint64_t seq;

		if ((datasync ? fdatasync(h->fd) : fsync(h->fd)) < 0)
			ret = -errno;
		/* Its name too, when it changed lately (at once when a sync
		   covered that commit already): a plain file created and
		   fsynced must not vanish in a power loss a moment later. */
		fs_lock(fs);
		seq = h->inode->name_seq;
		fs_unlock(fs);
		if (ret == 0 && seq != 0)
			ret = dbox_ns_sync_upto(fs->st, seq);
		fuse_reply_err(req, -ret);
		return;
	}
	ret = message_fsync(fs, h);
	fuse_reply_err(req, -ret);
}

/* Truncate a message to size bytes. */
/* fs_message_truncate, finished now also with a writer when finish_now
   (fs_message_redate). */
static int truncate_copy(struct fs *fs, struct fs_inode *inode, uint64_t size,
			 bool finish_now)
{
	int ret;

	/* Committed (no save, or one finished at a close or fsync): the
	   truncate goes to a new copy, like any write. */
	ret = fs_message_writable(fs, inode, size);
	if (ret == 0) {
		struct dbox_save *save = inode->save;

		/* Unlocked: a compressed body is turned plain first. */
		fs_busy_begin(fs, inode);
		ret = dbox_save_truncate(save, size);
		fs_busy_end(fs, inode);
	}
	/* Without an open writer the truncate is complete now; with one,
	   at its next close or fsync. */
	if (ret == 0 && (inode->nwriters == 0 || finish_now))
		ret = message_finish(fs, inode, false);
	if (inode->nwriters == 0)
		save_drop(inode);
	return ret;
}

int fs_message_truncate(struct fs *fs, struct fs_inode *inode, uint64_t size)
{
	return truncate_copy(fs, inode, size, false);
}

int fs_message_redate(struct fs *fs, struct fs_inode *inode, uint64_t size)
{
	return truncate_copy(fs, inode, size, true);
}

