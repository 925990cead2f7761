/*
 * io.c: system-call helpers shared by storage/ (see io.h).
 */
#include "io.h"

#include <errno.h>
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
