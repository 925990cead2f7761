/*
 * rebuild-tree.c: rebuild step 4, second half (engine/rebuild.h): the
 * tree of the old index put back from the root down, breadth first -
 * directories, names (so flags), hard links, modes, owners, mtimes, inode
 * numbers, symlink targets, device numbers and extended attributes - for
 * every message whose record was found (or is damaged in place), every
 * plain file whose files/<ino> is there, and every directory reachable
 * from the root.
 */
#include "engine/rebuild-private.h"
#include "engine/store-dirs.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

size_t rebuild_old_inode(const struct rebuild *rb, uint64_t ino)
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

	dbox_files_name(name, ino);
	return rb->files_fd >= 0 &&
		fstatat(rb->files_fd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
		S_ISREG(sb.st_mode);
}

/* The message inode *attr into the new index: at its whole record, or
   where the old index had it when the record is damaged in place.
   Returns 1 placed, 0 lost, or a negative errno. */
static int place_message(struct rebuild *rb, struct dbox_attr *attr)
{
	size_t m = old_msg(rb, attr->ino);
	const struct dbox_salvage_msg *om = m == SIZE_MAX ? NULL :
		&rb->old->msgs[m];
	struct dbox_msgloc loc;
	struct rrec *r = NULL;
	int ret;

	if (om == NULL || (rb->msg_rec[m] == SIZE_MAX &&
			   !rebuild_damaged_in_place(rb, om))) {
		rb->rep->lost_msgs++;
		return 0;
	}
	if (rb->msg_rec[m] == SIZE_MAX) {
		/* As the old index had it: size, location, GUID. */
		rebuild_loc(om->file_id, om->offset, om->body_size,
			    om->record_size, om->vsize, om->guid, &loc);
		rb->rep->damaged_kept++;
	} else {
		r = &rb->recs[rb->msg_rec[m]];
		attr->size = r->plain_size;
		rebuild_loc(r->file_id, r->offset, r->body_size,
			    r->record_size, r->vsize, r->guid, &loc);
	}
	if ((ret = dbox_index_rebuild_inode(rb->index, attr)) < 0 ||
	    (ret = dbox_index_msg_set(rb->index, attr->ino, &loc)) < 0)
		return ret;
	if (r != NULL)
		r->placed = true;
	rb->rep->kept++;
	return 1;
}

/* Put old inode i into the new index, once.  Returns 1 placed (now or
   before), 0 when it cannot be (its message or file is lost), or a
   negative errno. */
static int place_inode(struct rebuild *rb, size_t i)
{
	const struct dbox_attr *oi = &rb->old->inodes[i];
	struct dbox_attr attr = *oi;
	const char *target;
	int ret;

	if (rb->placed[i] != 0)
		return rb->placed[i] == 1;
	rb->placed[i] = 2;
	switch (oi->kind) {
	case DBOX_KIND_MESSAGE:
		if ((ret = place_message(rb, &attr)) <= 0)
			return ret;
		break;
	case DBOX_KIND_SYMLINK:
		target = dbox_salvage_symlink_target(rb->old, oi->ino);
		if (target == NULL) {
			rb->rep->lost_files++;
			return 0;
		}
		if ((ret = dbox_index_rebuild_inode(rb->index, &attr)) < 0 ||
		    (ret = dbox_index_symlink_set(rb->index, oi->ino, target,
						  strlen(target))) < 0)
			return ret;
		break;
	case DBOX_KIND_FILE:
		if (!backing_file_ok(rb, oi->ino)) {
			rb->rep->lost_files++;
			return 0;
		}
		/* fall through */
	default:
		/* setattr: the device number of a special file too */
		if ((ret = dbox_index_rebuild_inode(rb->index, &attr)) < 0 ||
		    (oi->kind == DBOX_KIND_SPECIAL &&
		     (ret = dbox_index_setattr(rb->index, &attr)) < 0))
			return ret;
		break;
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
		size_t i = rebuild_old_inode(rb, x->ino);

		if (i == SIZE_MAX || rb->placed[i] != 1)
			continue;
		ret = dbox_index_xattr_set(rb->index, x->ino, x->name, x->value,
					   x->len, 0);
		if (ret < 0 && ret != -ERANGE && ret != -ENOSPC)
			return ret;
	}
	return 0;
}

/* The first entry of directory dir in the old index (entries are sorted
   by parent). */
static size_t first_entry(const struct dbox_salvage *old, uint64_t dir)
{
	size_t lo = 0, hi = old->nentries;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (old->entries[mid].parent < dir)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Put back the names of old directory dir; subdirectories placed are
   queued.  Returns 0 or a negative errno. */
static int place_dir(struct rebuild *rb, uint64_t dir, uint64_t *queue,
		     size_t *tail)
{
	const struct dbox_salvage *old = rb->old;
	int ret;

	for (size_t e = first_entry(old, dir); e < old->nentries &&
		     old->entries[e].parent == dir; e++) {
		const struct dbox_salvage_entry *ent = &old->entries[e];
		size_t i = rebuild_old_inode(rb, ent->ino);

		if (i == SIZE_MAX || ent->ino == DBOX_ROOT_INO ||
		    (old->inodes[i].kind == DBOX_KIND_DIR &&
		     rb->placed[i] != 0)) {
			rb->rep->lost_names++;
			continue;
		}
		if ((ret = place_inode(rb, i)) < 0)
			return ret;
		if (ret == 0) {
			rb->rep->lost_names++;
			continue;
		}
		ret = dbox_index_rebuild_entry(rb->index, dir, ent->name,
					       ent->namelen, ent->ino);
		if (ret < 0)
			return ret;
		rb->rep->names++;
		if (old->inodes[i].kind == DBOX_KIND_DIR)
			queue[(*tail)++] = ent->ino;
	}
	return 0;
}

int rebuild_tree(struct rebuild *rb)
{
	const struct dbox_salvage *old = rb->old;
	size_t head = 0, tail = 0, i;
	uint64_t *queue;
	int ret = 0;

	rb->placed = calloc(old->ninodes + 1, 1);
	queue = malloc((old->ninodes + 1) * sizeof(*queue));
	if (rb->placed == NULL || queue == NULL) {
		free(queue);
		return -ENOMEM;
	}
	if ((i = rebuild_old_inode(rb, DBOX_ROOT_INO)) != SIZE_MAX &&
	    old->inodes[i].kind == DBOX_KIND_DIR)
		ret = place_inode(rb, i);
	queue[tail++] = DBOX_ROOT_INO;
	while (ret >= 0 && head < tail)
		ret = place_dir(rb, queue[head++], queue, &tail);
	free(queue);
	if (ret < 0)
		return ret;
	return restore_xattrs(rb);
}
