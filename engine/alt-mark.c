/*
 * alt-mark.c: the mark that says which store an alternate storage
 * belongs to (alt-mark.h has the rules).
 */
#include "engine/alt-mark.h"
#include "engine/store-dirs.h"
#include "engine/store-layout.h"
#include "storage/dbox-file.h"
#include "storage/dbox-record.h"
#include "storage/guid.h"
#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ALT_ID_LEN 32

/* Are the first ALT_ID_LEN bytes of s lowercase hex digits? */
static bool id_valid(const char *s)
{
	for (int i = 0; i < ALT_ID_LEN; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return true;
}

int dbox_alt_mark_load(struct dbox_index *index, struct dbox_alt_mark *mark)
{
	uint32_t first;
	char *id = NULL;
	int ret;

	memset(mark, 0, sizeof(*mark));
	ret = dbox_index_setting_get(index, DBOX_SETTING_ALT_ID, &id);
	if (ret < 0 && ret != -ENOENT)
		return ret;
	/* A damaged setting is no id: the ALT's mark (if any) is judged
	   by whether the index places m.N there. */
	if (id != NULL && strlen(id) == ALT_ID_LEN && id_valid(id))
		memcpy(mark->index_id, id, ALT_ID_LEN + 1);
	free(id);
	ret = dbox_index_mfile_alt_first(index, &first);
	if (ret < 0 && ret != -ENOENT)
		return ret;
	mark->index_places = ret == 0;
	mark->first = ret == 0 ? first : 0;
	if (!mark->index_places)
		return 0;
	ret = dbox_index_alt_first_msg(index, &mark->msg);
	mark->has_msg = ret == 1;
	return ret < 0 ? ret : 0;
}

/* dbox_dir_walk callback: stop (1) at the first m.N name. */
static int is_mfile_cb(void *ctx, const char *name)
{
	uint32_t id;

	(void)ctx;
	return dbox_mfile_parse_name(name, &id) ? 1 : 0;
}

/* Does storage/ (open as storage_fd) hold any m.N?  (A directory that
   cannot be read holds none that could be told.) */
static bool holds_mfiles(int storage_fd)
{
	return dbox_dir_walk(storage_fd, is_mfile_cb, NULL) == 1;
}

/* Is the ALT whose storage/ is open as storage_fd this store's by its
   content: does the record at the index's first ALT message hold that
   message's GUID?  A whole record with another GUID is another store's
   mail (-EXDEV, logged); no such message, a missing m.N or a record that
   does not read whole prove nothing (0). */
static int content_proof(int storage_fd, const char *alt,
			 const struct dbox_alt_mark *mark)
{
	struct dbox_metadata md;
	uint64_t body, size;
	char name[16];
	bool other;
	int fd, ret;

	if (!mark->has_msg || storage_fd < 0)
		return 0;
	dbox_file_name(name, mark->msg.file_id);
	fd = openat(storage_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
		    O_NOCTTY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	memset(&md, 0, sizeof(md));
	ret = dbox_record_verify(fd, mark->msg.offset, UINT64_MAX, &body, &md,
				 &size, NULL);
	close(fd);
	if (ret < 0)
		return 0;
	other = strcmp(md.guid, mark->msg.guid) != 0;
	if (other)
		dbox_error("%s/" DBOX_STORE_STORAGE "/%s: offset %llu holds "
			   "message %s, where this store's index has %s: the "
			   "alternate storage of another store; refused", alt,
			   name, (unsigned long long)mark->msg.offset, md.guid,
			   mark->msg.guid);
	dbox_metadata_clear(&md);
	return other ? -EXDEV : 0;
}

/* Read ALT's mark into mark->alt_id ("" when none or damaged).  The file
   is the ALT owner's: not followed when a link, not waited on when a
   FIFO, at most a line read. */
static void read_mark(int alt_fd, struct dbox_alt_mark *mark)
{
	char buf[ALT_ID_LEN + 2];
	struct stat sb;
	ssize_t n = -1;
	int fd;

	mark->alt_id[0] = '\0';
	fd = openat(alt_fd, DBOX_ALT_MARK, O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
		    O_NOCTTY | O_CLOEXEC);
	if (fd < 0)
		return;
	if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode))
		n = pread(fd, buf, sizeof(buf), 0);
	close(fd);
	if (n == ALT_ID_LEN + 1 && buf[ALT_ID_LEN] == '\n' && id_valid(buf)) {
		memcpy(mark->alt_id, buf, ALT_ID_LEN);
		mark->alt_id[ALT_ID_LEN] = '\0';
	}
}

/* Write id as ALT's mark: a fresh temporary file (whatever had its name
   removed first, never followed), fsynced, renamed over the mark, the
   directory fsynced.  Returns 0 or -errno. */
static int write_mark(int alt_fd, const char *id)
{
	static const char tmp[] = DBOX_ALT_MARK ".new";
	char line[ALT_ID_LEN + 1];
	int fd, ret = 0;

	memcpy(line, id, ALT_ID_LEN);
	line[ALT_ID_LEN] = '\n';
	if (unlinkat(alt_fd, tmp, 0) < 0 && errno != ENOENT)
		return -errno;
	fd = openat(alt_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW |
		    O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (write(fd, line, sizeof(line)) != (ssize_t)sizeof(line))
		ret = errno != 0 ? -errno : -EIO;
	if (ret == 0 && fsync(fd) < 0)
		ret = -errno;
	close(fd);
	if (ret == 0 && renameat(alt_fd, tmp, alt_fd, DBOX_ALT_MARK) < 0)
		ret = -errno;
	if (ret == 0 && fsync(alt_fd) < 0)
		ret = -errno;
	if (ret < 0)
		unlinkat(alt_fd, tmp, 0);
	return ret;
}

int dbox_alt_mark_judge(int alt_fd, int storage_fd, const char *alt,
			struct dbox_alt_mark *mark)
{
	read_mark(alt_fd, mark);
	if (mark->alt_id[0] != '\0' && mark->index_id[0] != '\0') {
		if (strcmp(mark->alt_id, mark->index_id) == 0)
			return 0;
		dbox_error("%s: the alternate storage of another store (its %s "
			   "is %s, this store's is %s); refused", alt,
			   DBOX_ALT_MARK, mark->alt_id, mark->index_id);
		return -EXDEV;
	}
	if (mark->index_places)
		return content_proof(storage_fd, alt, mark);
	if (mark->alt_id[0] != '\0') {
		dbox_error("%s: the alternate storage of another store (it has "
			   "a %s, and this store has no mail there; give a new, "
			   "empty directory); refused", alt, DBOX_ALT_MARK);
		return -EXDEV;
	}
	if (storage_fd >= 0 && holds_mfiles(storage_fd)) {
		dbox_error("%s/" DBOX_STORE_STORAGE ": holds m.N files this "
			   "store's index does not place there: the alternate "
			   "storage of another store (give a new, empty "
			   "directory); refused", alt);
		return -EXDEV;
	}
	return 0;
}

void dbox_alt_mark_write(int alt_fd, const char *alt, struct dbox_alt_mark *mark)
{
	char id[ALT_ID_LEN + 1];
	int ret;

	if (mark->alt_id[0] != '\0' || !mark->write)
		return;
	if (mark->index_id[0] != '\0')
		memcpy(id, mark->index_id, sizeof(id));
	else
		dbox_guid_generate(id);
	/* An ALT that cannot be written to (a read-only disk) still
	   holds mail to read: used unmarked. */
	if ((ret = write_mark(alt_fd, id)) < 0) {
		dbox_warning("%s/%s: not written: %s", alt, DBOX_ALT_MARK,
			     strerror(-ret));
		return;
	}
	memcpy(mark->alt_id, id, sizeof(id));
}

int dbox_alt_mark_record(struct dbox_index *index,
			 const struct dbox_alt_mark *mark)
{
	if (mark->alt_id[0] == '\0' ||
	    strcmp(mark->alt_id, mark->index_id) == 0)
		return 0;
	return dbox_index_setting_set(index, DBOX_SETTING_ALT_ID, mark->alt_id);
}
