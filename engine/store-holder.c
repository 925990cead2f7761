/*
 * store-holder.c: proving and signalling the dboxfs mount that holds a
 * store's lock (store-holder.h).
 */
#include "engine/store-holder.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

int dbox_holder_read_pid(int lock_fd, pid_t *pid_r)
{
	char buf[32], *end;
	ssize_t n = pread(lock_fd, buf, sizeof(buf) - 1, 0);
	long pid;

	buf[n > 0 ? n : 0] = '\0';
	errno = 0;
	pid = strtol(buf, &end, 10);
	if (n <= 0 || errno != 0 || end == buf || *end != '\n' || pid <= 1 ||
	    pid > INT_MAX)
		return -EINVAL;
	*pid_r = (pid_t)pid;
	return 0;
}

int dbox_holder_read_mountpoint(int lock_fd, char *buf, size_t size)
{
	char text[PATH_MAX + 32];
	const char *line, *end;
	ssize_t n = pread(lock_fd, text, sizeof(text) - 1, 0);

	text[n > 0 ? n : 0] = '\0';
	if (n <= 0 || (line = strchr(text, '\n')) == NULL)
		return -EINVAL;
	line++;
	if (line[0] != '/' || (end = strchr(line, '\n')) == NULL ||
	    (size_t)(end - line) >= size)
		return -EINVAL;
	memcpy(buf, line, (size_t)(end - line));
	buf[end - line] = '\0';
	return 0;
}

int dbox_holder_runs_dboxfs(pid_t pid)
{
	char path[64], exe[PATH_MAX + 1];
	const char *base;
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/%d/exe", (int)pid);
	if ((n = readlink(path, exe, sizeof(exe) - 1)) < 0)
		return -errno;
	exe[n] = '\0';
	base = strrchr(exe, '/');
	base = base != NULL ? base + 1 : exe;
	return strcmp(base, "dboxfs") == 0 ||
		strcmp(base, "dboxfs (deleted)") == 0;
}

int dbox_holder_holds(pid_t pid, const struct stat *lock)
{
	char dirname[64], fdpath[320];
	struct stat fuse, sb;
	bool has_lock = false, has_fuse = false;
	struct dirent *de;
	DIR *dir;

	if (stat("/dev/fuse", &fuse) < 0 || !S_ISCHR(fuse.st_mode))
		return -ENODEV;
	snprintf(dirname, sizeof(dirname), "/proc/%d/fd", (int)pid);
	if ((dir = opendir(dirname)) == NULL)
		return -errno;
	while ((de = readdir(dir)) != NULL) {
		snprintf(fdpath, sizeof(fdpath), "%s/%s", dirname, de->d_name);
		if (de->d_name[0] == '.' || stat(fdpath, &sb) < 0)
			continue;
		if (S_ISREG(sb.st_mode) && sb.st_dev == lock->st_dev &&
		    sb.st_ino == lock->st_ino)
			has_lock = true;
		if (S_ISCHR(sb.st_mode) && sb.st_rdev == fuse.st_rdev)
			has_fuse = true;
	}
	closedir(dir);
	return has_lock && has_fuse;
}

long dbox_holder_euid(pid_t pid)
{
	char path[64], line[256];
	unsigned long real, eff;
	long ret = -ENOENT;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	if ((f = fopen(path, "re")) == NULL)
		return -errno;
	while (fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "Uid: %lu %lu", &real, &eff) == 2) {
			ret = (long)eff;
			break;
		}
	fclose(f);
	return ret;
}

int dbox_holder_signal(const struct dbox_holder *h, int sig)
{
	return syscall(SYS_pidfd_send_signal, h->pidfd, sig, NULL, 0) < 0 ?
		-errno : 0;
}

void dbox_holder_release(struct dbox_holder *h)
{
	if (h->pidfd >= 0)
		close(h->pidfd);
	h->pidfd = -1;
}

/* Refuse h for why (err: its errno); the pidfd closed.  Returns the
   negative errno dbox_holder_prove gives for it. */
static int refuse(struct dbox_holder *h, enum dbox_holder_why why, int err)
{
	static const int ret[] = {
		[DBOX_HOLDER_NO_PID] = -EINVAL, [DBOX_HOLDER_STALE] = -ESRCH,
		[DBOX_HOLDER_GONE] = -ESRCH, [DBOX_HOLDER_NOT_MOUNT] = -EPERM,
		[DBOX_HOLDER_NOT_OWNER] = -EPERM,
	};

	dbox_holder_release(h);
	h->why = why;
	h->err = err;
	return why == DBOX_HOLDER_UNREADABLE ? err : ret[why];
}

int dbox_holder_prove(int lock_fd, struct dbox_holder *h_r)
{
	struct stat lock;
	long pidfd, euid = 0;
	int ret;

	*h_r = (struct dbox_holder){ .pidfd = -1 };
	if (dbox_holder_read_pid(lock_fd, &h_r->pid) < 0 ||
	    fstat(lock_fd, &lock) < 0)
		return refuse(h_r, DBOX_HOLDER_NO_PID, 0);
	if ((pidfd = syscall(SYS_pidfd_open, h_r->pid, 0)) < 0)
		return refuse(h_r, DBOX_HOLDER_STALE, -errno);
	h_r->pidfd = (int)pidfd;
	if ((ret = dbox_holder_runs_dboxfs(h_r->pid)) == 1)
		ret = dbox_holder_holds(h_r->pid, &lock);
	if (ret == 1)
		euid = dbox_holder_euid(h_r->pid);
	if (ret == 1 && euid >= 0 && (uid_t)euid == lock.st_uid)
		return 0;
	/* It died while it was being looked at (a killed mount)? */
	if (dbox_holder_signal(h_r, 0) == -ESRCH)
		return refuse(h_r, DBOX_HOLDER_GONE, -ESRCH);
	if (ret < 0)
		return refuse(h_r, DBOX_HOLDER_UNREADABLE, ret);
	return refuse(h_r, ret == 0 ? DBOX_HOLDER_NOT_MOUNT :
		      DBOX_HOLDER_NOT_OWNER, 0);
}
