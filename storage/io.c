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

int dbox_fd_regular(int fd)
{
	struct stat sb;
	int ret;

	if (fd < 0)
		return fd;
	if (fstat(fd, &sb) < 0)
		ret = -errno;
	else if (!S_ISREG(sb.st_mode))
		ret = -EIO;
	else
		return fd;
	close(fd);
	return ret;
}
