/*
 * io.c: system-call helpers shared by storage/ (see io.h).
 */
#include "io.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

ssize_t dbox_pread_full(int fd, void *buf, size_t len, uint64_t off)
{
	char *p = buf;
	size_t done = 0;

	while (done < len) {
		ssize_t ret = pread(fd, p + done, len - done,
				    (off_t)(off + done));

		if (ret < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (ret == 0)
			break;
		done += (size_t)ret;
	}
	return (ssize_t)done;
}

int dbox_fd_regular(int fd, struct stat *sb_r)
{
	struct stat sb;
	int ret;

	if (fd < 0)
		return fd;
	if (fstat(fd, &sb) < 0) {
		ret = -errno;
	} else if (!S_ISREG(sb.st_mode)) {
		ret = -EIO;
	} else {
		if (sb_r != NULL)
			*sb_r = sb;
		return fd;
	}
	close(fd);
	return ret;
}

int dbox_copy_range(int in, uint64_t start, uint64_t end, int out)
{
	char buf[65536];
	uint64_t off = start;

	while (off < end) {
		off_t data = lseek(in, (off_t)off, SEEK_DATA), hole;

		if (data < 0 && errno == ENXIO)
			break; /* a hole up to the end of the file */
		if (data < 0)
			data = (off_t)off; /* no SEEK_DATA here: copy it all */
		if ((uint64_t)data >= end)
			break;
		hole = lseek(in, data, SEEK_HOLE);
		if (hole < 0 || (uint64_t)hole > end)
			hole = (off_t)end;
		for (off = (uint64_t)data; off < (uint64_t)hole; ) {
			size_t want = (uint64_t)hole - off < sizeof(buf) ?
				(size_t)((uint64_t)hole - off) : sizeof(buf);
			ssize_t n = pread(in, buf, want, (off_t)off);

			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				return n < 0 ? -errno : -EIO;
			for (ssize_t done = 0; done < n; ) {
				ssize_t w = pwrite(out, buf + done,
						   (size_t)(n - done),
						   (off_t)(off - start) + done);

				if (w < 0 && errno == EINTR)
					continue;
				if (w <= 0)
					return w < 0 ? -errno : -EIO;
				done += w;
			}
			off += (uint64_t)n;
		}
		off = (uint64_t)hole;
	}
	return ftruncate(out, (off_t)(end - start)) < 0 ? -errno : 0;
}
