/*
 * rebuild-restore.c: rebuild steps 5 and 6 (engine/rebuild.h): records no
 * old message claims put into the cur/ of their B folder under a new
 * name (engine/maildir.h says which folder a mailbox name is), and plain
 * files of files/ no old plain file claims put into lost+found/.
 */
#include "engine/maildir.h"
#include "engine/rebuild-private.h"
#include "engine/restore.h"
#include "engine/store-dirs.h"
#include "engine/store-layout.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int rebuild_mkdir(struct rebuild *rb, uint64_t parent, const char *name,
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
	dbox_files_name(backing, attr.ino);
	fd = openat(rb->files_fd, backing, O_WRONLY | O_CREAT | O_TRUNC |
		    O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (fchown(fd, rb->uid, rb->gid) < 0 && errno != EPERM)
		ret = -errno;
	close(fd);
	return ret;
}

/* The nested directory A/B of the tree for mailbox "A/B" when every
   component is a directory there: *dir_r, else DBOX_ROOT_INO. */
static int nested_folder(struct rebuild *rb, const char *mailbox,
			 uint64_t *dir_r)
{
	char *copy = strdup(mailbox), *comp, *save = NULL;
	uint64_t dir = DBOX_ROOT_INO;
	struct dbox_attr attr;

	if (copy == NULL)
		return -ENOMEM;
	for (comp = strtok_r(copy, "/", &save); comp != NULL;
	     comp = strtok_r(NULL, "/", &save)) {
		if (dbox_index_lookup(rb->index, dir, comp, strlen(comp),
				      &attr) != 0 || attr.kind != DBOX_KIND_DIR) {
			dir = DBOX_ROOT_INO;
			break;
		}
		dir = attr.ino;
	}
	free(copy);
	*dir_r = dir;
	return 0;
}

/* The folder directory of mailbox (not INBOX): a nested folder A/B that
   the tree has, else the Maildir++ folder .A.B, made with maildirfolder
   when missing.  Returns 0 (*dir_r DBOX_ROOT_INO when the mailbox has no
   valid name: INBOX takes its messages), or a negative errno. */
static int folder_dir(struct rebuild *rb, const char *mailbox,
		      uint64_t *dir_r)
{
	char *flat = NULL;
	int ret;

	if ((ret = nested_folder(rb, mailbox, dir_r)) < 0 ||
	    *dir_r != DBOX_ROOT_INO)
		return ret;
	if ((ret = dbox_restore_flat_folder(mailbox, &flat)) == -EINVAL) {
		rebuild_note(rb, DBOX_REBUILD_NOTE_FOLDER, 0, 0,
			     "no Maildir++ name", "folder '%s' has no valid "
			     "Maildir++ name; its messages go to INBOX",
			     mailbox);
		return 0;
	}
	if (ret == 0)
		ret = rebuild_mkdir(rb, DBOX_ROOT_INO, flat, dir_r);
	if (ret == 0)
		ret = make_plain_file(rb, *dir_r, "maildirfolder");
	free(flat);
	return ret;
}

int rebuild_folder_cur(struct rebuild *rb, const char *mailbox,
		       uint64_t *cur_r)
{
	uint64_t folder = DBOX_ROOT_INO, ino;
	struct rfolder *v;
	int ret;

	if (mailbox == NULL || mailbox[0] == '\0')
		mailbox = "INBOX";
	for (size_t i = 0; i < rb->nfolders; i++) {
		if (strcmp(rb->folders[i].mailbox, mailbox) == 0) {
			*cur_r = rb->folders[i].cur;
			return 0;
		}
	}
	if (strcmp(mailbox, "INBOX") != 0 &&
	    (ret = folder_dir(rb, mailbox, &folder)) < 0)
		return ret;
	for (size_t i = 0; i < MAILDIR_SUBDIR_COUNT; i++) {
		if ((ret = rebuild_mkdir(rb, folder, maildir_subdirs[i],
					 &ino)) < 0)
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

/* A record no old message claimed: a new message in its folder, owned
   as the folder's cur/ is and with its mode less the execute bits (as
   Dovecot makes its mail files): a store of root's that Dovecot serves
   as user mail got restored messages of root's, mode 0600, which
   Dovecot could not read (helper-62). */
static int restore(struct rebuild *rb, struct rrec *r)
{
	struct dbox_attr dir;
	struct dbox_msgloc loc;
	char name[DBOX_RESTORED_NAME_SIZE];
	uint64_t cur;
	int ret;

	if ((ret = rebuild_folder_cur(rb, r->mailbox, &cur)) < 0 ||
	    (ret = dbox_index_getattr(rb->index, cur, &dir)) < 0)
		return ret;
	rebuild_loc(r->file_id, r->offset, r->body_size, r->record_size,
		    r->vsize, r->guid, &loc);
	for (unsigned int n = 0; ; n++) {
		dbox_restored_name(r->received, r->guid, r->file_id, r->offset,
				   n, name);
		ret = dbox_restore_message(rb->index, cur, &dir, name, &loc,
					   r->plain_size, r->received,
					   &r->owner, NULL);
		if (ret != -EEXIST)
			break;
	}
	if (ret < 0)
		return ret;
	r->placed = true;
	rb->rep->restored++;
	return 0;
}

static int mfile_cmp(const void *key, const void *elem)
{
	uint32_t id = *(const uint32_t *)key,
		 at = ((const struct dbox_salvage_mfile *)elem)->file_id;

	return id < at ? -1 : id > at;
}

/* Did the old index know record r: is it inside the committed end the
   old index had for its m.N?  Only such a record, named by no message,
   was expunged; one past that end (an index older than storage/: a
   restored backup, a lost WAL) was never known to it. */
static bool old_knew(const struct rebuild *rb, const struct rrec *r)
{
	const struct dbox_salvage_mfile *f = rb->old->nmfiles == 0 ? NULL :
		bsearch(&r->file_id, rb->old->mfiles, rb->old->nmfiles,
			sizeof(*f), mfile_cmp);

	return f != NULL && r->offset + r->record_size <= f->size;
}

/* The records by_guid[p, q) share one GUID: restore the first that is
   not placed when none is, count the others. */
static int restore_group(struct rebuild *rb, size_t p, size_t q)
{
	struct dbox_rebuild_report *rep = rb->rep;
	bool has = false;
	int ret;

	for (size_t k = p; k < q; k++)
		has |= rb->recs[rb->by_guid[k]].placed;
	for (size_t k = p; k < q; k++) {
		struct rrec *r = &rb->recs[rb->by_guid[k]];

		/* A record no name of the old index reaches: when that
		   index is whole, its message was expunged (or unlinked
		   while open); else its names may just be lost.  One a live
		   message of the old index claims was not expunged: its
		   names could not be placed (a folder cut off the root by a
		   cycle, a name no directory can hold), and it is restored
		   (counting it expunged let the next purge delete it:
		   helper-61). */
		if (r->placed)
			continue;
		if (has) {
			rep->duplicates++;
		} else if (!rb->opts->restore_all && rb->old->complete &&
			   old_knew(rb, r) && !r->live) {
			rep->expunged++;
		} else if (!rb->opts->restore_all && rb->old->complete &&
			   rep->import_killed && !r->live) {
			/* Not mail of the store yet: the killed import's,
			   which it imports again when run again (restored,
			   it came twice: helper-85). */
			rep->import_left++;
		} else {
			if (rb->old->complete && !old_knew(rb, r))
				rep->unknown_restored++;
			if (r->live)
				rep->unplaced_restored++;
			if ((ret = restore(rb, r)) < 0)
				return ret;
			has = true;
		}
	}
	return 0;
}

int rebuild_restore_unclaimed(struct rebuild *rb)
{
	int ret = 0;

	for (size_t p = 0, q; p < rb->nrecs && ret == 0; p = q) {
		const char *guid = rb->recs[rb->by_guid[p]].guid;

		/* A group of records with one GUID (empty GUIDs: alone). */
		q = p + 1;
		while (guid[0] != '\0' && q < rb->nrecs &&
		       rebuild_guid_cmp(rb->recs[rb->by_guid[q]].guid,
					guid) == 0)
			q++;
		ret = restore_group(rb, p, q);
	}
	return ret;
}

/* files/<name> (sb), whose number ino the new index has for no plain
   file, into lost+found/: under its own number when that is free, else
   under a new one (the file is renamed to it).  Returns 0 or a negative
   errno. */
static int adopt_orphan(struct rebuild *rb, const char *name, uint64_t ino,
			const struct stat *sb)
{
	struct dbox_attr attr;
	char renamed[24];
	int ret = dbox_index_getattr(rb->index, ino, &attr);

	if (ret == 0 && attr.kind == DBOX_KIND_FILE)
		return 0; /* placed */
	if (ret < 0 && ret != -ENOENT)
		return ret;
	if (rb->lost_found == 0 &&
	    (ret = rebuild_mkdir(rb, DBOX_ROOT_INO, DBOX_STORE_LOST_FOUND,
				 &rb->lost_found)) < 0)
		return ret;
	if (ret == -ENOENT) {
		attr = (struct dbox_attr){
			.ino = ino, .kind = DBOX_KIND_FILE,
			.mode = S_IFREG | (sb->st_mode & 07777),
			.uid = sb->st_uid, .gid = sb->st_gid,
			.mtime_ns = dbox_time_make(sb->st_mtim.tv_sec,
						   sb->st_mtim.tv_nsec),
			.atime_ns = dbox_time_make(sb->st_atim.tv_sec,
						   sb->st_atim.tv_nsec),
		};
		attr.ctime_ns = attr.mtime_ns;
		if ((ret = dbox_index_rebuild_inode(rb->index, &attr)) == 0)
			ret = dbox_index_rebuild_entry(rb->index, rb->lost_found,
						       name, strlen(name), ino);
	} else {
		/* The number is a directory or message now: the file takes
		   a new one. */
		ret = dbox_index_create(rb->index, rb->lost_found, name,
					strlen(name), DBOX_KIND_FILE,
					S_IFREG | 0600, sb->st_uid, sb->st_gid,
					dbox_now_ns(), &attr);
		dbox_files_name(renamed, attr.ino);
		if (ret == 0 && renameat(rb->files_fd, name, rb->files_fd,
					 renamed) < 0)
			ret = -errno;
	}
	if (ret == 0)
		rb->rep->orphans++;
	return ret;
}

/* Is ino a plain file of the new index (its files/<ino> placed)? */
static bool placed_file(struct rebuild *rb, uint64_t ino)
{
	struct dbox_attr attr;

	return dbox_index_getattr(rb->index, ino, &attr) == 0 &&
	       attr.kind == DBOX_KIND_FILE;
}

/* files/<name> (sb), which no plain file of a whole old index that says
   an import was killed owns: the import's uncommitted file (run again,
   the import makes it again), kept out of the tree as crash recovery
   keeps it (store-recover.c): copied to the store's lost+found/ as
   files-<ino> and removed; an empty one only removed.  Returns 0, or
   a negative errno when no copy could be kept (the file stays, and is
   adopted). */
static int import_orphan(struct rebuild *rb, const char *name, uint64_t ino,
			 const struct stat *sb)
{
	char base[48], copy[DBOX_LOST_FOUND_NAME_SIZE];
	int fd, ret = 0;

	if (sb->st_size > 0) {
		fd = openat(rb->files_fd, name, O_RDONLY | O_NOFOLLOW |
			    O_NONBLOCK | O_CLOEXEC);
		if (fd < 0)
			return -errno;
		snprintf(base, sizeof(base), "files-%llu",
			 (unsigned long long)ino);
		ret = dbox_lost_found_keep(rb->dir_fd, fd, 0,
					   (uint64_t)sb->st_size, base, copy);
		close(fd);
		if (ret < 0)
			return ret;
		rb->rep->lost_found_copies++;
		rebuild_note(rb, DBOX_REBUILD_NOTE_FILES, 0, 0, "killed import",
			     "%s/%s: the killed import's uncommitted file, kept "
			     "in %s/%s (the import run again makes it again)",
			     DBOX_STORE_FILES, name, DBOX_STORE_LOST_FOUND, copy);
	}
	if (unlinkat(rb->files_fd, name, 0) < 0)
		return -errno;
	return 0;
}

/* dbox_dir_walk callback over files/: each plain file no plain file of
   the new index owns into lost+found/.  Stops (1) with rb->walk_err set
   on an error. */
static int orphan_cb(void *ctx, const char *name)
{
	struct rebuild *rb = ctx;
	struct stat sb;
	uint64_t ino;

	if (!dbox_files_name_ino(name, &ino) ||
	    fstatat(rb->files_fd, name, &sb, AT_SYMLINK_NOFOLLOW) < 0 ||
	    !S_ISREG(sb.st_mode)) {
		rebuild_note(rb, DBOX_REBUILD_NOTE_FILES, 0, 0,
			     "not a plain file of dboxfs", "%s/%s: not a plain "
			     "file of dboxfs; left alone", DBOX_STORE_FILES,
			     name);
		return 0;
	}
	if (rb->rep->import_killed && rb->old->complete &&
	    !rb->opts->restore_all && !placed_file(rb, ino) &&
	    import_orphan(rb, name, ino, &sb) == 0)
		return 0;
	rb->walk_err = adopt_orphan(rb, name, ino, &sb);
	return rb->walk_err < 0;
}

int rebuild_adopt_orphans(struct rebuild *rb)
{
	int ret;

	if (rb->files_fd < 0)
		return 0;
	rb->walk_err = 0;
	ret = dbox_dir_walk(rb->files_fd, orphan_cb, rb);
	if (ret < 0)
		rebuild_note(rb, DBOX_REBUILD_NOTE_FILES, 0, 0, "unreadable",
			     "%s/: %s; plain files not read may be missing from "
			     "the index", DBOX_STORE_FILES, strerror(-ret));
	return rb->walk_err;
}
