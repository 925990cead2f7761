/*
 * message.c: one message's store operations for the mount (message.h):
 * locating and reading its record, finishing its save into the index,
 * its received date, creating a regular file, and a plain file turned
 * into a message.
 */
#include "engine/message.h"
#include "engine/maildir.h"
#include "engine/save-fd.h"
#include "storage/dbox-read.h"
#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int dbox_msg_locate(struct dbox_store *st, uint64_t ino,
		    struct dbox_attr *attr_r, struct dbox_msgloc *loc_r)
{
	int ret;

	dbox_store_assert_locked(st);
	if ((ret = dbox_index_getattr(st->index, ino, attr_r)) < 0)
		return ret;
	return dbox_index_msg_get(st->index, ino, loc_r);
}

int dbox_msg_open_reader(struct dbox_store *st, uint64_t ino,
			 struct dbox_reader **reader_r)
{
	struct dbox_msgloc loc;
	struct dbox_attr attr;
	int ret;

	dbox_store_assert_locked(st);
	if ((ret = dbox_msg_locate(st, ino, &attr, &loc)) < 0)
		return ret;
	return dbox_store_open_reader(st, &loc, attr.size, reader_r);
}

int dbox_msg_record_fd(struct dbox_store *st, uint64_t ino)
{
	struct dbox_msgloc loc;
	int fd;

	dbox_store_assert_locked(st);
	if ((fd = dbox_index_msg_get(st->index, ino, &loc)) < 0 ||
	    (fd = dbox_store_read_fd(st, loc.file_id)) < 0)
		return fd;
	/* The cached descriptor is the store's only under the lock. */
	if ((fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0)
		return -errno;
	return fd;
}

int dbox_msg_dir_mailbox(struct dbox_store *st, uint64_t dir,
			 char **mailbox_r)
{
	dbox_store_assert_locked(st);
	return maildir_mailbox_name(st->index, dir, mailbox_r);
}

int dbox_msg_mailbox(struct dbox_store *st, uint64_t ino, char **mailbox_r)
{
	uint64_t parent;
	int ret;

	dbox_store_assert_locked(st);
	*mailbox_r = NULL;
	if ((ret = dbox_index_parent(st->index, ino, &parent)) < 0)
		return ret;
	return maildir_mailbox_name(st->index, parent, mailbox_r);
}

int dbox_msg_seal_note(struct dbox_store *st, uint64_t ino, char **path_r,
			struct dbox_owner *owner_r)
{
	struct dbox_attr attr;
	int ret;

	dbox_store_assert_locked(st);
	*path_r = NULL;
	if ((ret = dbox_index_getattr(st->index, ino, &attr)) < 0)
		return ret;
	/* L holds one name: the others a link() gave it would be lost with
	   the index commits (helper-67 #F6), so the index must be synced. */
	if (attr.nlink > 1)
		return -EMLINK;
	if ((ret = dbox_index_path(st->index, ino, path_r)) < 0)
		return ret;
	if (strlen(*path_r) > DBOX_SEAL_PATH_MAX) {
		free(*path_r);
		*path_r = NULL;
		return -ENAMETOOLONG;
	}
	*owner_r = (struct dbox_owner){ .set = true, .mode = attr.mode & 0777,
					.uid = attr.uid, .gid = attr.gid };
	return 0;
}

/* The R of a finish: see dbox_msg_received. */
static time_t received_of(const struct dbox_attr *attr,
			  const int64_t *written_ns)
{
	return dbox_time_sec(written_ns != NULL ? *written_ns : attr->mtime_ns);
}

int dbox_msg_received(struct dbox_store *st, uint64_t ino,
		      const int64_t *written_ns, time_t *received_r)
{
	struct dbox_attr attr;
	int ret;

	dbox_store_assert_locked(st);
	if ((ret = dbox_index_getattr(st->index, ino, &attr)) < 0)
		return ret;
	*received_r = received_of(&attr, written_ns);
	return 0;
}

int dbox_msg_finish(struct dbox_store *st, uint64_t ino,
		    struct dbox_save *save, bool sync,
		    const int64_t *written_ns)
{
	struct dbox_attr attr;
	struct dbox_msgloc loc;
	int ret;

	dbox_store_assert_locked(st);
	if ((ret = dbox_index_begin(st->index)) < 0)
		return ret;
	ret = dbox_index_getattr(st->index, ino, &attr);
	if (ret == 0)
		ret = dbox_save_finish(save, received_of(&attr, written_ns),
				       sync, &loc);
	if (ret == 0 && (attr.size != dbox_save_size(save) ||
			 written_ns != NULL)) {
		attr.size = dbox_save_size(save);
		/* The write's time; a later ctime (a link or rename since
		   the write) stays. */
		if (written_ns != NULL) {
			attr.mtime_ns = *written_ns;
			if (attr.ctime_ns < *written_ns)
				attr.ctime_ns = *written_ns;
		}
		ret = dbox_index_setattr(st->index, &attr);
	}
	/* What the inode holds now, known without reading it back: the
	   kernel asks for it after the close. */
	if (ret == 0) {
		attr.stored = loc.record_size;
		dbox_index_attr_known(st->index, &attr);
	}
	/* Committed: the next message may go to the same m.N now. */
	if ((ret = dbox_ns_tx_end(st, ret, sync)) == 0)
		dbox_save_yield(save);
	return ret;
}

int dbox_msg_ack_empty(struct dbox_store *st, uint64_t ino,
		       struct dbox_save *save, const int64_t *written_ns)
{
	struct dbox_attr attr;
	int ret;

	dbox_store_assert_locked(st);
	if (dbox_save_acked_empty(save) && written_ns == NULL)
		return 0; /* acknowledged as it stands */
	if ((ret = dbox_index_begin(st->index)) < 0)
		return ret;
	ret = dbox_index_getattr(st->index, ino, &attr);
	/* The truncation's time is the inode's from now on, as a finish
	   would store it: a utime() after this close changes it as usual,
	   and recovery keeps whatever the inode has. */
	if (ret == 0 && written_ns != NULL) {
		attr.mtime_ns = *written_ns;
		if (attr.ctime_ns < *written_ns)
			attr.ctime_ns = *written_ns;
		ret = dbox_index_setattr(st->index, &attr);
	}
	if (ret == 0)
		ret = dbox_save_ack_empty(save, attr.mtime_ns);
	return dbox_ns_tx_end(st, ret, false);
}

/* dbox_msg_restore_empty's list: the inodes of the keys. */
struct acked_list {
	uint64_t *v;
	size_t n;
};

static int acked_cb(void *ctx, const char *key, int64_t value)
{
	struct acked_list *l = ctx;
	const char *num = key + strlen(DBOX_META_ACKED_EMPTY);
	uint64_t *v;
	char *end;
	unsigned long long ino;

	(void)value; /* the mtime then: the inode has it, or a later one */
	errno = 0;
	ino = strtoull(num, &end, 10);
	if (*num < '0' || *num > '9' || *end != '\0' || errno != 0)
		return 0; /* not one of ours: deleted with the rest */
	if ((v = realloc(l->v, (l->n + 1) * sizeof(*v))) == NULL)
		return -ENOMEM;
	l->v = v;
	l->v[l->n++] = ino;
	return 0;
}

/* Store message ino empty, with the mtime its inode has: a new empty
   record (a copy of nothing), finished and synced, that the index names
   instead of the one it had (a cut delivery's, or the version before an
   O_TRUNC).  Its key goes in the same commit. */
static int restore_empty(struct dbox_store *st, uint64_t ino,
			 int64_t mtime_ns)
{
	struct dbox_save *save = NULL;
	char *mailbox = NULL;
	int ret;

	if (dbox_msg_mailbox(st, ino, &mailbox) < 0)
		mailbox = NULL;
	ret = dbox_save_begin_copy(st, ino, mailbox != NULL ? mailbox :
				   "INBOX", &save);
	free(mailbox);
	/* The copy's mark on disk before its bytes, as for any copy
	   (fs/fs-write.c, start_write); the key again, so that the save
	   deletes it in its finish's commit. */
	if (ret == 0)
		ret = dbox_ns_sync_upto(st, dbox_save_inflight_seq(save));
	if (ret == 0 && (ret = dbox_index_begin(st->index)) == 0) {
		ret = dbox_save_ack_empty(save, mtime_ns);
		ret = dbox_ns_tx_end(st, ret, false);
	}
	if (ret == 0)
		ret = dbox_msg_finish(st, ino, save, true, NULL);
	dbox_save_free(&save);
	return ret;
}

int dbox_msg_restore_empty(struct dbox_store *st, unsigned int *restored_r)
{
	struct acked_list l = { NULL, 0 };
	int ret;

	dbox_store_assert_locked(st);
	*restored_r = 0;
	ret = dbox_index_meta_list(st->index, DBOX_META_ACKED_EMPTY,
				   acked_cb, &l);
	for (size_t i = 0; ret == 0 && i < l.n; i++) {
		struct dbox_msgloc loc;
		struct dbox_attr attr;

		/* Unlinked since (recovery dropped it), or no message. */
		if (dbox_msg_locate(st, l.v[i], &attr, &loc) < 0 ||
		    attr.nlink == 0)
			continue;
		if ((ret = restore_empty(st, l.v[i], attr.mtime_ns)) < 0)
			dbox_error("%s: recovery: message inode %llu could not "
				   "be stored as the empty version its last "
				   "close acknowledged: %s", st->path,
				   (unsigned long long)l.v[i], strerror(-ret));
		else
			(*restored_r)++;
	}
	free(l.v);
	/* Keys of inodes gone since, and any left by a failure above: that
	   one fails the open, and the next open finds its key again. */
	if (ret == 0)
		ret = dbox_index_meta_delete_prefix(st->index,
						    DBOX_META_ACKED_EMPTY);
	return ret;
}

int dbox_msg_set_received(struct dbox_store *st, uint64_t ino,
			  time_t received_sec)
{
	struct dbox_msgloc loc;

	dbox_store_assert_locked(st);
	if (dbox_index_msg_get(st->index, ino, &loc) < 0)
		return 0; /* no record (yet) */
	return dbox_store_set_received(st, &loc, received_sec);
}

/* The bytes of a new regular file ino (attr) whose directory is a
   cur/new/tmp of folder (a message) or any (a plain file), inside
   dbox_msg_create's transaction: see there. */
static int create_bytes(struct dbox_store *st, uint64_t folder,
			const struct dbox_attr *attr, bool keep_save,
			struct dbox_save **save_r, int *fd_r)
{
	struct dbox_msgloc loc;
	char *mailbox = NULL;
	int ret;

	if (attr->kind != DBOX_KIND_MESSAGE) {
		*fd_r = dbox_store_file_open(st, attr->ino, O_CREAT | O_EXCL,
					     NULL);
		return *fd_r < 0 ? *fd_r : 0;
	}
	ret = maildir_folder_mailbox(st->index, folder, &mailbox);
	if (ret == 0)
		ret = dbox_save_begin(st, attr->ino, mailbox, save_r);
	free(mailbox);
	if (ret == 0 && !keep_save) {
		ret = dbox_save_finish(*save_r, dbox_time_sec(attr->mtime_ns),
				       false, &loc);
		dbox_save_free(save_r);
	}
	return ret;
}

int dbox_msg_create(struct dbox_store *st, uint64_t parent, const char *name,
		    const struct dbox_ns_new *nw, bool keep_save,
		    struct dbox_save **save_r, int *fd_r,
		    struct dbox_attr *attr_r)
{
	enum dbox_kind kind;
	uint32_t mode = nw->mode, gid = nw->gid;
	uint64_t folder = 0;
	int ret;

	dbox_store_assert_locked(st);
	*save_r = NULL;
	*fd_r = -1;
	/* Everything read inside the write transaction: a read before it
	   would be a transaction (and its WAL-index locks) of its own. */
	if ((ret = dbox_index_begin(st->index)) < 0)
		return ret;
	kind = dbox_ns_message_dir(st, parent, name, &folder) ?
		DBOX_KIND_MESSAGE : DBOX_KIND_FILE;
	ret = dbox_ns_new_owner(st, parent, &mode, &gid);
	if (ret == 0)
		ret = dbox_index_create(st->index, parent, name, strlen(name),
					kind, mode, nw->uid, gid,
					dbox_now_ns(), attr_r);
	if (ret == 0)
		ret = create_bytes(st, folder, attr_r, keep_save, save_r, fd_r);
	/* A WRITING record leaves the attributes as created (0 stored
	   bytes): the close's and the kernel's reads need no SQLite read. */
	if (ret == 0 && kind == DBOX_KIND_MESSAGE && keep_save)
		dbox_index_attr_known(st->index, attr_r);
	/* A new message being written is no acknowledged mail until its
	   close or fsync, which commits: its create is a deferred commit
	   (store-commit.c), shared with that commit in a delivery.  Not
	   when its save made a new m.N, whose row must be on disk before
	   its first byte (dbox_save_made_mfile). */
	if (ret == 0 && kind == DBOX_KIND_MESSAGE && keep_save &&
	    !dbox_save_made_mfile(*save_r))
		ret = dbox_store_commit_later(st, true);
	else
		ret = dbox_ns_tx_end(st, ret, false);
	if (ret < 0) {
		dbox_save_free(save_r);
		if (*fd_r >= 0) {
			close(*fd_r);
			*fd_r = -1;
			/* The name went with the rollback: so goes its file. */
			dbox_ns_file_unlink(st, attr_r->ino);
		}
	}
	return ret;
}

bool dbox_msg_file_wants(struct dbox_store *st, uint64_t ino,
			 uint64_t *parent_r)
{
	struct dbox_attr attr;
	char *name = NULL;
	bool ret;

	dbox_store_assert_locked(st);
	if (dbox_index_getattr(st->index, ino, &attr) < 0 ||
	    attr.kind != DBOX_KIND_FILE || attr.nlink != 1 ||
	    dbox_index_entry_of(st->index, ino, parent_r, &name) < 0)
		return false;
	ret = dbox_ns_is_message_name(st, *parent_r, name);
	free(name);
	return ret;
}

int dbox_msg_from_file_in_tx(struct dbox_store *st, uint64_t ino,
			     uint64_t parent, struct dbox_save *copied)
{
	struct dbox_save *save = copied;
	struct dbox_msgloc loc;
	struct dbox_attr attr;
	struct stat backing;
	char *mailbox = NULL;
	int fd, ret;

	dbox_store_assert_locked(st);
	if ((fd = dbox_store_file_open_ro(st, ino, &backing)) < 0)
		return fd;
	if ((ret = dbox_index_getattr(st->index, ino, &attr)) < 0)
		goto out;
	if (save == NULL) {
		int64_t n = 0;

		if ((ret = maildir_mailbox_name(st->index, parent,
						&mailbox)) < 0 ||
		    (ret = dbox_save_begin(st, ino, mailbox, &save)) < 0 ||
		    (n = dbox_save_copy_fd(save, fd)) < 0) {
			ret = ret < 0 ? ret : (int)n;
			goto out;
		}
	}
	attr.mtime_ns = dbox_time_make(backing.st_mtim.tv_sec,
				       backing.st_mtim.tv_nsec);
	if ((ret = dbox_save_finish(save, dbox_time_sec(attr.mtime_ns),
				    false, &loc)) < 0)
		goto out;
	attr.kind = DBOX_KIND_MESSAGE;
	attr.size = dbox_save_size(save);
	attr.atime_ns = dbox_time_make(backing.st_atim.tv_sec,
				       backing.st_atim.tv_nsec);
	ret = dbox_index_setattr(st->index, &attr);
out:
	close(fd);
	if (save != copied)
		dbox_save_free(&save);
	free(mailbox);
	return ret;
}

int dbox_msg_from_file(struct dbox_store *st, uint64_t ino, uint64_t parent,
		       struct dbox_save *copied)
{
	int ret;

	dbox_store_assert_locked(st);
	if ((ret = dbox_index_begin(st->index)) < 0)
		return ret;
	return dbox_ns_tx_end(st, dbox_msg_from_file_in_tx(st, ino, parent,
							   copied), false);
}
