/*
 * store-lock.c: the lock of a store (see store-lock.h).
 */
#include "engine/store-layout.h"
#include "engine/store-holder.h"
#include "engine/store-lock.h"

#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
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

pid_t dbox_store_lock_holder(int lock_fd, bool *shared_r)
{
	char line[256], kind[16], mode[16];
	unsigned int maj, min;
	unsigned long long ino;
	struct stat sb;
	pid_t found = 0;
	int pid;
	FILE *f;

	*shared_r = false;
	if (fstat(lock_fd, &sb) < 0 || (f = fopen("/proc/locks", "re")) == NULL)
		return 0;
	/* "1: FLOCK  ADVISORY  WRITE 21584 fe:00:13430338 0 EOF" */
	while (found == 0 && fgets(line, sizeof(line), f) != NULL) {
		if (sscanf(line, "%*d: %15s %*s %15s %d %x:%x:%llu", kind, mode,
			   &pid, &maj, &min, &ino) != 6 ||
		    strcmp(kind, "FLOCK") != 0 || pid == getpid() ||
		    ino != (unsigned long long)sb.st_ino ||
		    makedev(maj, min) != sb.st_dev)
			continue;
		found = (pid_t)pid;
		*shared_r = strcmp(mode, "READ") == 0;
	}
	fclose(f);
	return found;
}

/* Is mnt a fuse.dboxfs mount point in the mount table of process pid? */
static bool dboxfs_mounted_at(pid_t pid, const char *mnt)
{
	char path[64], line[4096], point[4096], fstype[64];
	const char *sep;
	bool found = false;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/mountinfo", (int)pid);
	if ((f = fopen(path, "re")) == NULL)
		return false;
	/* "36 35 0:42 / /home/u/Maildir rw,... - fuse.dboxfs dboxfs rw,..." */
	while (!found && fgets(line, sizeof(line), f) != NULL)
		found = sscanf(line, "%*s %*s %*s %*s %4095s", point) == 1 &&
			(sep = strstr(line, " - ")) != NULL &&
			sscanf(sep, " - %63s", fstype) == 1 &&
			strcmp(fstype, "fuse.dboxfs") == 0 &&
			strcmp(point, mnt) == 0;
	fclose(f);
	return found;
}

/* The mount point of the dboxfs process pid, into buf (size bytes): the
   one the lock's text names when pid wrote it (named), else the last
   absolute argument of its command line; either only when it is a
   fuse.dboxfs mount point in pid's mount table.  A relative argument
   tells nothing: it named a directory of the working directory the
   mount was started in, and "mnt" would match the end of every .../mnt
   (it named another user's mount once).  False when none is found. */
static bool holder_mountpoint(pid_t pid, int lock_fd, bool named,
			      char *buf, size_t size)
{
	char path[64], args[4096];
	const char *arg, *end;
	bool found = false;
	ssize_t n;
	int fd;

	if (named && dbox_holder_read_mountpoint(lock_fd, buf, size) == 0 &&
	    dboxfs_mounted_at(pid, buf))
		return true;
	snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return false;
	n = read(fd, args, sizeof(args) - 1);
	close(fd);
	if (n <= 0)
		return false;
	args[n] = '\0';
	end = args + n;
	for (arg = args; arg < end; arg += strlen(arg) + 1) {
		if (arg[0] == '/' && strlen(arg) < size &&
		    dboxfs_mounted_at(pid, arg)) {
			memcpy(buf, arg, strlen(arg) + 1);
			found = true;
		}
	}
	return found;
}

const char *dbox_store_lock_holder_text(int lock_fd, char *buf, size_t size)
{
	char exe[64], target[4096], mnt[2048];
	const char *base;
	bool shared;
	pid_t pid = dbox_store_lock_holder(lock_fd, &shared), named = 0;
	struct stat sb;
	ssize_t n;

	buf[0] = '\0';
	/* /proc/locks names the process that took the flock: a mount that
	   went to the background took it before it forked, so that pid has
	   exited.  The pid the lock's text names is the holder when it holds
	   this very file open, and a FUSE device (store-holder.h). */
	if (dbox_holder_read_pid(lock_fd, &named) == 0 && named != pid &&
	    fstat(lock_fd, &sb) == 0 && dbox_holder_holds(named, &sb) == 1)
		pid = named;
	else if (pid > 0 && kill(pid, 0) < 0 && errno == ESRCH)
		pid = 0; /* a -o ro mount in the background names none */
	if (pid <= 0)
		return buf;
	snprintf(exe, sizeof(exe), "/proc/%d/exe", (int)pid);
	n = readlink(exe, target, sizeof(target) - 1);
	target[n > 0 ? n : 0] = '\0';
	base = strrchr(target, '/');
	base = base != NULL ? base + 1 : target;
	if (strncmp(base, "dboxfs", 6) == 0 &&
	    holder_mountpoint(pid, lock_fd, pid == named, mnt, sizeof(mnt)))
		snprintf(buf, size, "pid %d, a dboxfs mount on %s", (int)pid,
			 mnt);
	else
		snprintf(buf, size, "pid %d", (int)pid);
	return buf;
}

/* Milliseconds since start. */
static long elapsed_ms(const struct timespec *start)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (now.tv_sec - start->tv_sec) * 1000 +
		(now.tv_nsec - start->tv_nsec) / 1000000;
}

int dbox_store_lock_try(int dir_fd, bool shared, bool *held_r)
{
	struct stat sb;
	int fd, ret;

	*held_r = false;
	/* O_NONBLOCK: a FIFO planted as the lock must not hang the open. */
	fd = openat(dir_fd, DBOX_STORE_LOCK, O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
		    O_NOCTTY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
		ret = fstat(fd, &sb) < 0 ? -errno : -EINVAL;
		close(fd);
		return ret;
	}
	if (flock(fd, (shared ? LOCK_SH : LOCK_EX) | LOCK_NB) == 0) {
		*held_r = true;
	} else if (errno != EWOULDBLOCK) {
		ret = -errno;
		close(fd);
		return ret;
	}
	return fd;
}

void dbox_store_lock_release(int lock_fd)
{
	(void)flock(lock_fd, LOCK_UN);
}

int dbox_dir_lock_try(int dir_fd)
{
	if (flock(dir_fd, LOCK_EX | LOCK_NB) == 0)
		return 0;
	return errno == EWOULDBLOCK ? -EBUSY : -errno;
}

/* Is the lock of fd held shared by another process? */
static bool holder_is_shared(int fd)
{
	bool shared;

	return dbox_store_lock_holder(fd, &shared) > 0 && shared;
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
		/* A shared holder (-o ro) writes no text: any is stale. */
		closing = dbox_store_lock_is_closing(fd) &&
			!(how == LOCK_EX && holder_is_shared(fd));
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

	ret = flock(fd, how | LOCK_NB) == 0 ? 0 : -errno;
	if (ret == -EWOULDBLOCK)
		ret = wait_for_lock(fd, path, how);
	if (ret == 0) {
		struct stat sb;

		/* The text is only ever the current holder's: a "closing"
		   a mount left behind would make the next process wait for
		   this one as if it were closing. */
		if (how == LOCK_EX && fstat(fd, &sb) == 0 && sb.st_size > 0 &&
		    ftruncate(fd, 0) < 0)
			dbox_warning("%s/" DBOX_STORE_LOCK ": emptying it: %s",
				     path, strerror(errno));
		return fd;
	}
	if (ret == -EWOULDBLOCK || ret == -EBUSY) {
		char who[2200];

		if (how == LOCK_EX && holder_is_shared(fd)) {
			/* A -o ro mount writes no holder text. */
			const char *text = dbox_store_lock_holder_text(
				fd, who, sizeof(who));

			dbox_error("%s is mounted read-only%s%s%s: nothing can "
				   "change it until that mount is unmounted",
				   path, text[0] ? " (" : "", text,
				   text[0] ? ")" : "");
		}
		else if (dbox_store_lock_holder_text(fd, who, sizeof(who))[0])
			dbox_error("%s: store is in use by another process "
				   "(%s); unmount it or wait for it", path,
				   who);
		else
			dbox_error("%s: store is in use by another process "
				   "(mounted?); unmount it or wait for it",
				   path);
	} else
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

/* Is fd, locked, still STORE/lock?  A holder may unlink the file while
   it holds it (a failed first mount takes its new store away,
   store-dirs.h); whoever was waiting on it then holds the lock of a file
   nobody else will open, and must lock the store's lock anew. */
static bool still_the_lock(int dir_fd, int fd)
{
	struct stat a, b;

	return fstat(fd, &a) == 0 && a.st_nlink > 0 &&
		fstatat(dir_fd, DBOX_STORE_LOCK, &b, AT_SYMLINK_NOFOLLOW) == 0 &&
		a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

static int lock_once(int dir_fd, const char *path);

int dbox_store_lock(int dir_fd, const char *path)
{
	int fd;

	/* The file locked must be the one in the store still (a few tries:
	   each means another process removed a store under us). */
	for (int tries = 0; tries < 8; tries++) {
		if ((fd = lock_once(dir_fd, path)) < 0 ||
		    still_the_lock(dir_fd, fd))
			return fd;
		close(fd);
	}
	dbox_error("%s: the store's lock file keeps being replaced; try "
		   "again", path);
	return -EBUSY;
}

/* Open (creating) STORE/lock and lock it exclusively, as
   dbox_store_lock. */
static int lock_once(int dir_fd, const char *path)
{
	int fd;

	fd = openat(dir_fd, DBOX_STORE_LOCK, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK |
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

	fd = openat(dir_fd, DBOX_STORE_LOCK, O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
		    O_NOCTTY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT) {
		/* None yet (a fresh backup): made, if the directory takes a
		   file.  Whatever stops that (read-only media, no write
		   permission, an immutable directory, a full disk or quota:
		   helper-93) leaves the store readable without a lock, as
		   before. */
		fd = openat(dir_fd, DBOX_STORE_LOCK, O_RDONLY | O_CREAT |
			    O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
			    0600);
		if (fd < 0 && errno != ELOOP)
			return -ENOENT;
	}
	if (fd < 0)
		return open_failed(path, -errno);
	if ((fd = check_regular(fd, path)) < 0)
		return fd;
	if ((fd = take_lock(fd, path, LOCK_SH)) >= 0 &&
	    !still_the_lock(dir_fd, fd)) {
		/* The store went away while we waited (store-dirs.h). */
		close(fd);
		return -ENOENT;
	}
	return fd;
}
