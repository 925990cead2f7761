/*
 * store-lock.c: the lock of a store (see store-lock.h).
 */
#include "store-lock.h"

#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CLOSING "closing\n"

bool dbox_store_lock_is_closing(int lock_fd)
{
	char buf[sizeof(CLOSING)];
	ssize_t n = pread(lock_fd, buf, sizeof(buf) - 1, 0);

	return n == (ssize_t)strlen(CLOSING) &&
		memcmp(buf, CLOSING, strlen(CLOSING)) == 0;
}

int dbox_store_lock_set_closing(int lock_fd)
{
	ssize_t len = (ssize_t)strlen(CLOSING);

	if (ftruncate(lock_fd, 0) < 0 || pwrite(lock_fd, CLOSING, len, 0) != len)
		return -errno;
	return 0;
}

/* Milliseconds since start. */
static long elapsed_ms(const struct timespec *start)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (now.tv_sec - start->tv_sec) * 1000 +
		(now.tv_nsec - start->tv_nsec) / 1000000;
}

/* Try the lock every 20 ms: for DBOX_STORE_LOCK_WAIT seconds while the
   holder says it is closing, for BUSY_WAIT_MS otherwise (a mount just
   unmounted says so only once its session loop has seen the unmount).
   Returns 0 with the lock taken, -EBUSY, or -errno. */
#define BUSY_WAIT_MS 500
static int wait_for_lock(int fd, const char *path, int how)
{
	const struct timespec tick = { 0, 20 * 1000 * 1000 };
	struct timespec start;
	bool said = false;

	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		bool closing;

		if (flock(fd, how | LOCK_NB) == 0)
			return 0;
		if (errno != EWOULDBLOCK)
			return -errno;
		closing = dbox_store_lock_is_closing(fd);
		if (elapsed_ms(&start) >= (closing ? DBOX_STORE_LOCK_WAIT * 1000L :
					   BUSY_WAIT_MS))
			return -EBUSY;
		if (closing && !said) {
			dbox_info("%s: the mount of this store is closing; "
				  "waiting for it", path);
			said = true;
		}
		nanosleep(&tick, NULL);
	}
}

/* Take the lock on fd (how: LOCK_EX or LOCK_SH), waiting as
   dbox_store_lock says.  Returns fd, or -errno with fd closed (logged). */
static int take_lock(int fd, const char *path, int how)
{
	int ret;

	if (flock(fd, how | LOCK_NB) == 0)
		return fd;
	ret = -errno;
	if (ret == -EWOULDBLOCK)
		ret = wait_for_lock(fd, path, how);
	if (ret == 0)
		return fd;
	if (ret == -EWOULDBLOCK || ret == -EBUSY)
		dbox_error("%s: store is in use by another process (mounted?)",
			   path);
	else
		dbox_error("%s: cannot lock the store: %s", path, strerror(-ret));
	close(fd);
	return ret == -EWOULDBLOCK ? -EBUSY : ret;
}

/* The lock file open as fd must be a regular file.  fd, or -EINVAL with
   fd closed (logged). */
static int check_regular(int fd, const char *path)
{
	struct stat sb;

	if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
		dbox_error("%s/lock: not a regular file; refusing the store",
			   path);
		close(fd);
		return -EINVAL;
	}
	return fd;
}

/* Log why STORE/lock did not open (errno ret). */
static int open_failed(const char *path, int ret)
{
	dbox_error("%s/lock: cannot open the lock of the store: %s", path,
		   ret == -ELOOP ? "it is a symbolic link (a store's lock is a "
		   "plain file)" : strerror(-ret));
	return ret;
}

int dbox_store_lock(int dir_fd, const char *path)
{
	int fd;

	fd = openat(dir_fd, "lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK |
		    O_NOCTTY | O_CLOEXEC, 0600);
	if (fd < 0 && (errno == EROFS || errno == EACCES)) {
		/* Read-only media, or a store its user may not write. */
		int ret = -errno;

		dbox_error("the store is read-only (%s): mount it with -o ro "
			   "(lock: %s)", path, strerror(-ret));
		return ret;
	}
	if (fd < 0)
		return open_failed(path, -errno);
	if ((fd = check_regular(fd, path)) < 0)
		return fd;
	return take_lock(fd, path, LOCK_EX);
}

int dbox_store_lock_shared(int dir_fd, const char *path)
{
	int fd;

	fd = openat(dir_fd, "lock", O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
		    O_NOCTTY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT)
		return -ENOENT;
	if (fd < 0)
		return open_failed(path, -errno);
	if ((fd = check_regular(fd, path)) < 0)
		return fd;
	return take_lock(fd, path, LOCK_SH);
}
