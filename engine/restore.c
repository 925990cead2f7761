/*
 * restore.c: a record put back as a message (restore.h): its folder,
 * name, owner and mode, for rebuild and for crash recovery alike.
 */
#include "engine/restore.h"
#include "engine/maildir.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int dbox_restore_flat_folder(const char *mailbox, char **dir_r)
{
	char *utf8 = NULL;
	int ret = maildir_mutf7_to_utf8(mailbox, &utf8);

	if (ret == 0) {
		ret = maildir_folder_of_mailbox(utf8, dir_r);
		free(utf8);
	}
	if (ret == -ENOMEM || ret == 0)
		return ret;
	if (asprintf(dir_r, ".%s", mailbox) < 0)
		return -ENOMEM;
	for (char *p = *dir_r; *p != '\0'; p++)
		if (*p == '/')
			*p = '.';
	if (strlen(*dir_r) <= DBOX_NAME_MAX && strcmp(*dir_r, ".") != 0 &&
	    strcmp(*dir_r, "..") != 0)
		return 0;
	free(*dir_r);
	*dir_r = NULL;
	return -EINVAL;
}

/* Directory name in dir: 1 and *ino_r, 0 when it is no directory there
   (also a name no directory can have: a B's bytes are the store owner's,
   and one bad component must not stop the records after it; helper-67
   #F3).  Returns the index's errno otherwise. */
static int find_dir(struct dbox_index *index, uint64_t dir, const char *name,
		    uint64_t *ino_r)
{
	struct dbox_attr attr;
	int ret = dbox_index_lookup(index, dir, name, strlen(name), &attr);

	if (ret == -ENOENT || ret == -ENAMETOOLONG || ret == -EINVAL ||
	    (ret == 0 && attr.kind != DBOX_KIND_DIR))
		return 0;
	if (ret < 0)
		return ret;
	*ino_r = attr.ino;
	return 1;
}

/* The folder of mailbox, looked up: see dbox_restore_find_cur. */
static int find_folder(struct dbox_index *index, const char *mailbox,
		       uint64_t *folder_r)
{
	char *copy, *comp, *save = NULL, *flat = NULL;
	uint64_t dir = DBOX_ROOT_INO;
	int ret = 1;

	*folder_r = DBOX_ROOT_INO;
	if (mailbox == NULL || mailbox[0] == '\0' ||
	    strcmp(mailbox, "INBOX") == 0)
		return 0;
	if ((copy = strdup(mailbox)) == NULL)
		return -ENOMEM;
	for (comp = strtok_r(copy, "/", &save); comp != NULL && ret == 1;
	     comp = strtok_r(NULL, "/", &save))
		ret = find_dir(index, dir, comp, &dir);
	free(copy);
	if (ret < 0)
		return ret;
	if (ret == 1) {
		*folder_r = dir;
		return 0;
	}
	ret = dbox_restore_flat_folder(mailbox, &flat);
	if (ret == -EINVAL)
		return 0;
	if (ret == 0)
		ret = find_dir(index, DBOX_ROOT_INO, flat, folder_r);
	free(flat);
	return ret < 0 ? ret : 0;
}

int dbox_restore_find_cur(struct dbox_index *index, const char *mailbox,
			  uint64_t *cur_r)
{
	uint64_t folder;
	int ret;

	if ((ret = find_folder(index, mailbox, &folder)) < 0)
		return ret;
	ret = find_dir(index, folder, "cur", cur_r);
	if (ret == 0 && folder != DBOX_ROOT_INO)
		ret = find_dir(index, DBOX_ROOT_INO, "cur", cur_r);
	return ret < 0 ? ret : ret == 0 ? -ENOENT : 0;
}

void dbox_restored_name(time_t received, const char *guid, uint32_t file_id,
			uint64_t offset, unsigned int n,
			char name[DBOX_RESTORED_NAME_SIZE])
{
	const size_t size = DBOX_RESTORED_NAME_SIZE;
	int len = snprintf(name, size, "%lld.G%s.rebuild", (long long)received,
			   guid[0] != '\0' ? guid : "none");

	if (guid[0] == '\0' || n > 0)
		len += snprintf(name + len, size - (size_t)len, "_%u_%llu_%u",
				file_id, (unsigned long long)offset, n);
	snprintf(name + len, size - (size_t)len, ":2,");
	for (char *p = name; *p != '\0'; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') ||
		      (*p >= 'A' && *p <= 'Z') || strchr("._-:,", *p) != NULL))
			*p = '_';
}

int dbox_restore_message(struct dbox_index *index, uint64_t dir,
			 const struct dbox_attr *dirattr, const char *name,
			 const struct dbox_msgloc *loc, uint64_t plain_size,
			 time_t received, const struct dbox_owner *owner,
			 struct dbox_attr *attr_r)
{
	struct dbox_attr attr;
	int ret;

	if (owner != NULL && owner->set)
		ret = dbox_index_create(index, dir, name, strlen(name),
					DBOX_KIND_MESSAGE,
					S_IFREG | (owner->mode & 0777),
					owner->uid, owner->gid, dbox_now_ns(),
					&attr);
	else
		ret = dbox_index_create(index, dir, name, strlen(name),
					DBOX_KIND_MESSAGE,
					S_IFREG | 0600 | (dirattr->mode & 0066),
					dirattr->uid, dirattr->gid,
					dbox_now_ns(), &attr);
	if (ret < 0)
		return ret;
	attr.size = plain_size;
	attr.mtime_ns = attr.atime_ns = dbox_time_make(received, 0);
	if ((ret = dbox_index_setattr(index, &attr)) < 0 ||
	    (ret = dbox_index_msg_set(index, attr.ino, loc)) < 0)
		return ret;
	if (attr_r != NULL)
		*attr_r = attr;
	return 0;
}
