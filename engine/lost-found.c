/*
 * lost-found.c: keeping bytes in STORE/lost+found/ (lost-found.h).
 */
#include "engine/lost-found.h"
#include "engine/store-layout.h"

#include "storage/io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Suffixes tried after base itself: a store with this many cuts at one
   offset has a problem no further copy solves. */
#define MAX_SUFFIX 1000

/* Does the file open as fd hold exactly bytes [from, end) of src? */
static bool same_bytes(int fd, int src, uint64_t from, uint64_t end)
{
	char a[16384], b[sizeof(a)];
	struct stat sb;
	uint64_t off = 0;

	if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode) ||
	    (uint64_t)sb.st_size != end - from)
		return false;
	while (from + off < end) {
		size_t want = end - from - off < sizeof(a) ?
			(size_t)(end - from - off) : sizeof(a);
		ssize_t n = pread(fd, a, want, (off_t)off);

		if (n <= 0 || pread(src, b, (size_t)n, (off_t)(from + off)) != n ||
		    memcmp(a, b, (size_t)n) != 0)
			return false;
		off += (uint64_t)n;
	}
	return true;
}

/* A new file of a free name (base or base.K) in dir, into *out_r; or
   *out_r = -1 when a file of that name holds the bytes already.  Returns
   0 or a negative errno. */
static int new_copy(int dir, int src, uint64_t from, uint64_t end,
		    const char *base, char name_r[DBOX_LOST_FOUND_NAME_SIZE],
		    int *out_r)
{
	for (int k = 0; k <= MAX_SUFFIX; k++) {
		int fd;

		if (k == 0)
			snprintf(name_r, DBOX_LOST_FOUND_NAME_SIZE, "%s", base);
		else
			snprintf(name_r, DBOX_LOST_FOUND_NAME_SIZE, "%s.%d",
				 base, k);
		*out_r = openat(dir, name_r, O_WRONLY | O_CREAT | O_EXCL |
				O_NOFOLLOW | O_CLOEXEC, 0600);
		if (*out_r >= 0)
			return 0;
		if (errno != EEXIST)
			return -errno;
		fd = openat(dir, name_r, O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
			    O_CLOEXEC);
		if (fd >= 0) {
			bool same = same_bytes(fd, src, from, end);

			close(fd);
			if (same)
				return 0; /* *out_r is -1 */
		}
	}
	return -EEXIST;
}

int dbox_lost_found_keep(int store_fd, int src_fd, uint64_t from,
			 uint64_t end, const char *base,
			 char name_r[DBOX_LOST_FOUND_NAME_SIZE])
{
	int dir, out = -1, ret;

	if (mkdirat(store_fd, DBOX_STORE_LOST_FOUND, 0700) < 0 &&
	    errno != EEXIST)
		return -errno;
	dir = openat(store_fd, DBOX_STORE_LOST_FOUND, O_RDONLY | O_DIRECTORY |
		     O_NOFOLLOW | O_CLOEXEC);
	if (dir < 0)
		return -errno;
	ret = new_copy(dir, src_fd, from, end, base, name_r, &out);
	if (ret == 0 && out >= 0) {
		ret = dbox_copy_range(src_fd, from, end, out);
		if (ret == 0 && fsync(out) < 0)
			ret = -errno;
		close(out);
		if (ret < 0)
			unlinkat(dir, name_r, 0);
		else if (fsync(dir) < 0)
			ret = -errno;
	}
	close(dir);
	return ret;
}
