/*
 * fs-stop.c: the orderly stop of a writeback_cache mount (fs-stop.h).
 *
 * The handler only writes the signal's number into a pipe (async-signal
 * safe); the thread reads it, has the kernel write back the open files,
 * detaches the mount and lets the session run until the kernel ends it
 * (the last open file closed).
 */
#include "fs/fs.h"
#include "fs/fs-stop.h"

#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const int stop_signals[] = { SIGTERM, SIGINT, SIGHUP };
#define NSIGNALS (sizeof(stop_signals) / sizeof(stop_signals[0]))

struct fs_stop {
	int pipe[2];                  /* the handler writes, the thread reads */
	pthread_t thread;
	pthread_t loop;               /* the session loop's thread */
	struct fs *fs;
	struct sigaction fuse_sa[NSIGNALS]; /* libfuse's handlers */
};

/* The write end of the pipe for the handler, or -1 (atomic). */
static int stop_pipe = -1;

static void on_stop_signal(int sig)
{
	int fd = __atomic_load_n(&stop_pipe, __ATOMIC_ACQUIRE);
	unsigned char b = (unsigned char)sig;
	int saved = errno;

	if (fd >= 0 && write(fd, &b, 1) < 0) {
		/* Full: a stop is on its way already. */
	}
	errno = saved;
}

static void give_back_signals(struct fs_stop *s)
{
	for (size_t i = 0; i < NSIGNALS; i++)
		sigaction(stop_signals[i], &s->fuse_sa[i], NULL);
}

/* Have the kernel write back the cached pages of every regular file a
   client holds open (a closed one was written back at its close: FUSE's
   flush does that with the writeback cache).  Invalidating an inode's
   pages makes the kernel write each dirty one first and wait for the
   WRITE's reply (launder), which the request threads serve meanwhile; a
   syncfs() of the mount point does not wait for them (FUSE ends a page's
   writeback before the daemon has it), and an attack run still lost
   bytes with it.  What fails is logged; the stop goes on.  Returns how
   many files were open. */
static int write_back_open_files(struct fs *fs)
{
	fuse_ino_t *inos = NULL;
	size_t n = 0, size = 0;
	int ret, open_files;

	fs_lock(fs);
	for (struct fs_handle *h = fs->handles; h != NULL; h = h->next) {
		fuse_ino_t *v;

		if (n == size) {
			size = size == 0 ? 64 : size * 2;
			if ((v = realloc(inos, size * sizeof(*v))) == NULL) {
				dbox_error("writing back cached writes before "
					   "unmounting: out of memory; %zu open "
					   "files only", n);
				break;
			}
			inos = v;
		}
		inos[n++] = h->inode->ino;
	}
	open_files = (int)n;
	fs_unlock(fs);
	for (size_t i = 0; i < n; i++) {
		/* Several handles of one inode: once is enough. */
		bool seen = false;

		for (size_t j = 0; j < i && !seen; j++)
			seen = inos[j] == inos[i];
		if (seen)
			continue;
		ret = fuse_lowlevel_notify_inval_inode(fs->se, inos[i], 0, 0);
		/* ENODEV, ENOTCONN: the kernel has just ended the session
		   (the last file was closed). */
		if (ret < 0 && ret != -ENOENT && ret != -ENODEV &&
		    ret != -ENOTCONN) {
			dbox_error("inode %llu: writing back its cached writes "
				   "before unmounting: %s",
				   (unsigned long long)inos[i], strerror(-ret));
		}
	}
	free(inos);
	return open_files;
}

/* Detach the mount from the tree (umount -l): no new open, no new path
   walk; files open on it go on working, their writes reach the daemon,
   and the kernel ends the session when the last of them is closed (the
   daemon's read of /dev/fuse fails with ENODEV).  Root detaches it
   itself; a user's mount has fusermount3 do it.  Returns 0 or -1. */
static int detach_mount(const char *mountpoint)
{
	char *const argv[] = { "fusermount3", "-u", "-z", "-q",
			       (char *)mountpoint, NULL };
	extern char **environ;
	pid_t pid;
	int status;

	if (geteuid() == 0) {
		/* The mount point is root's to reach, whatever filesystem
		   identity the daemon took for the store (main.c). */
		uid_t fsuid = (uid_t)setfsuid(0);
		gid_t fsgid = (gid_t)setfsgid(0);
		int ret = umount2(mountpoint, MNT_DETACH), err = errno;

		setfsgid(fsgid);
		setfsuid(fsuid);
		errno = err;
		return ret;
	}
	if (posix_spawnp(&pid, "fusermount3", NULL, NULL, argv, environ) != 0)
		return -1;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* Wait for a stop byte (timeout_ms < 0: for ever).  Returns the signal,
   0 on timeout, or -1 when the pipe was closed (fs_stop_finish). */
static int next_signal(struct fs_stop *s, int timeout_ms)
{
	struct pollfd pfd = { .fd = s->pipe[0], .events = POLLIN };
	unsigned char b;
	ssize_t n;
	int ret;

	while ((ret = poll(&pfd, 1, timeout_ms)) < 0 && errno == EINTR)
		;
	if (ret == 0)
		return 0;
	while ((n = read(s->pipe[0], &b, 1)) < 0 && errno == EINTR)
		;
	return n == 1 ? b : -1;
}

/* The stop: the open files written back, the mount detached, and the
   session served on until the last file on it is closed (the kernel ends
   it then), so a write(2) that returns during the stop is not lost
   either: an attack run lost megabytes its writers had been told were
   written once libfuse had unmounted while they wrote on.  Their pages
   are written back every second meanwhile (a SIGKILL then loses less);
   further stop signals are ignored.  Should the detach fail, libfuse
   ends the session as before, after the write-back. */
static void *stop_thread(void *arg)
{
	struct fs_stop *s = arg;
	int sig, open_files;
	time_t said;

	if ((sig = next_signal(s, -1)) <= 0)
		return NULL; /* fs_stop_finish: the session ended otherwise */
	dbox_info("%s received; writing back the kernel's cached writes and "
		  "detaching the mount", strsignal(sig));
	open_files = write_back_open_files(s->fs);
	if (detach_mount(s->fs->mountpoint) < 0) {
		dbox_error("%s: cannot detach it (%s); unmounting now: writes "
			   "to files still open are lost", s->fs->mountpoint,
			   strerror(errno));
		give_back_signals(s);
		pthread_kill(s->loop, sig);
		return NULL;
	}
	if (open_files > 0)
		dbox_info("%s: detached; %d files are open on it: the mount "
			  "stops when the last of them is closed", s->fs->mountpoint,
			  open_files);
	said = time(NULL);
	while ((sig = next_signal(s, 1000)) >= 0) {
		if (sig > 0)
			continue; /* stopping already */
		open_files = write_back_open_files(s->fs);
		if (open_files > 0 && time(NULL) >= said + 60) {
			dbox_info("%s: still %d open files; stopping when they "
				  "are closed", s->fs->mountpoint, open_files);
			said = time(NULL);
		}
	}
	return NULL;
}

int fs_stop_start(struct fs *fs)
{
	struct sigaction sa = { .sa_handler = on_stop_signal };
	struct fs_stop *s = calloc(1, sizeof(*s));
	int ret;

	if (s == NULL) {
		ret = -ENOMEM;
		goto fail;
	}
	s->fs = fs;
	if (pipe2(s->pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
		ret = -errno;
		free(s);
		goto fail;
	}
	/* The thread's end blocks; the handler's never does. */
	fcntl(s->pipe[0], F_SETFL, 0);
	s->loop = pthread_self();
	if ((ret = -pthread_create(&s->thread, NULL, stop_thread, s)) < 0) {
		close(s->pipe[0]);
		close(s->pipe[1]);
		free(s);
		goto fail;
	}
	__atomic_store_n(&stop_pipe, s->pipe[1], __ATOMIC_RELEASE);
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < NSIGNALS; i++)
		sigaction(stop_signals[i], &sa, &s->fuse_sa[i]);
	fs->stop = s;
	return 0;
fail:
	dbox_error("cannot wait for a stop signal (%s): cached writes may be "
		   "lost on SIGTERM", strerror(-ret));
	return ret;
}

void fs_stop_finish(struct fs *fs)
{
	struct fs_stop *s = fs->stop;

	if (s == NULL)
		return;
	give_back_signals(s);
	__atomic_store_n(&stop_pipe, -1, __ATOMIC_RELEASE);
	close(s->pipe[1]); /* the thread reads end of file, or is done */
	pthread_join(s->thread, NULL);
	close(s->pipe[0]);
	free(s);
	fs->stop = NULL;
}
