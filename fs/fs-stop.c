/*
 * fs-stop.c: the orderly stop of a mount (fs-stop.h).
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/stat.h>
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
	char nonce[33];               /* in the name the stop looks up */
	pid_t asker;                  /* the thread asking (atomic), or 0 */
	bool took_unmount;            /* root's stop dealt with the unmount
					 (detached the mount, or found another
					 at its path): none by path after it
					 (atomic) */
	bool detached;                /* the mount is detached: the session
					 ends when nothing uses it (atomic) */
};

/* The name the stop looks up in the mount point to know it is this
   mount: STOP_NAME_PREFIX and the nonce (no such name is stored: '/'
   free, but a client could never have made it without the nonce). */
#define STOP_NAME_PREFIX ".dboxfs-stop."

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
   daemon's read of /dev/fuse fails with ENODEV).  A user's mount has
   fusermount3 do it (which unmounts only that user's FUSE mounts).  Root
   detaches it itself, but never by the path alone: the path is the one
   given at mount time, and whoever owns a directory on it (the store's
   owner, say) may have put another mount there meanwhile, which root
   would then take away (an attack run detached a tmpfs so).  So the path
   is opened (O_PATH), a lookup of STOP_NAME_PREFIX and this mount's
   nonce in it must fail with FS_STOP_ANSWER (only this daemon, to this
   thread, answers so), and the mount of that descriptor is the one
   detached.  Returns 0 or -1 (errno
   set; EXDEV: something else is mounted there now). */
static int detach_mount(struct fs_stop *s)
{
	const char *mountpoint = s->fs->mountpoint;
	char *const argv[] = { "fusermount3", "-u", "-z", "-q",
			       (char *)mountpoint, NULL };
	extern char **environ;
	char proc[64], probe[128];
	struct stat sb;
	uid_t fsuid;
	gid_t fsgid;
	pid_t pid;
	int status, fd, ret, err;

	if (geteuid() != 0) {
		if (posix_spawnp(&pid, "fusermount3", NULL, NULL, argv,
				 environ) != 0)
			return -1;
		while (waitpid(pid, &status, 0) < 0)
			if (errno != EINTR)
				return -1;
		return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
	}
	/* The mount point is root's to reach, whatever filesystem identity
	   the daemon took for the store (main.c). */
	fsuid = (uid_t)setfsuid(0);
	fsgid = (gid_t)setfsgid(0);
	fd = open(mountpoint, O_PATH | O_DIRECTORY | O_CLOEXEC);
	err = errno;
	if (fd >= 0) {
		snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
		snprintf(probe, sizeof(probe), "%s/" STOP_NAME_PREFIX "%s",
			 proc, s->nonce);
		__atomic_store_n(&s->asker, (pid_t)syscall(SYS_gettid),
				 __ATOMIC_RELEASE);
		ret = fstatat(AT_FDCWD, probe, &sb, AT_SYMLINK_NOFOLLOW);
		err = errno;
		__atomic_store_n(&s->asker, 0, __ATOMIC_RELEASE);
		if (ret == 0 || err != FS_STOP_ANSWER) {
			err = EXDEV;
			ret = -1;
		} else {
			ret = umount2(proc, MNT_DETACH);
			err = errno;
		}
		close(fd);
	} else {
		ret = -1;
	}
	setfsgid(fsgid);
	setfsuid(fsuid);
	/* Detached, or the path holds another mount now: either way libfuse
	   must not unmount the path afterwards. */
	if (ret == 0 || err == EXDEV)
		__atomic_store_n(&s->took_unmount, true, __ATOMIC_RELEASE);
	errno = err;
	return ret;
}

bool fs_stop_is_asking(struct fs *fs, fuse_req_t req, const char *name)
{
	struct fs_stop *s = fs->stop;
	pid_t asker;

	if (s == NULL ||
	    strncmp(name, STOP_NAME_PREFIX, strlen(STOP_NAME_PREFIX)) != 0 ||
	    strcmp(name + strlen(STOP_NAME_PREFIX), s->nonce) != 0)
		return false;
	asker = __atomic_load_n(&s->asker, __ATOMIC_ACQUIRE);
	return asker != 0 && fuse_req_ctx(req)->pid == asker;
}

bool fs_stop_detached(const struct fs *fs)
{
	return fs->stop != NULL &&
		__atomic_load_n(&fs->stop->detached, __ATOMIC_ACQUIRE);
}

bool fs_stop_took_unmount(const struct fs *fs)
{
	return fs->stop != NULL &&
		__atomic_load_n(&fs->stop->took_unmount, __ATOMIC_ACQUIRE);
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
	if (detach_mount(s) < 0) {
		/* Not this mount at the path any more (EXDEV): ending the
		   session would lose the files' cached writes, and libfuse
		   would unmount the path, whatever is there. */
		dbox_error("%s: cannot detach it (%s)%s", s->fs->mountpoint,
			   strerror(errno), errno == EXDEV ? "; another mount "
			   "is there now: this one is served until it is "
			   "unmounted" : "; unmounting now: writes to files "
			   "still open are lost");
		if (errno != EXDEV) {
			give_back_signals(s);
			pthread_kill(s->loop, sig);
			return NULL;
		}
	} else {
		__atomic_store_n(&s->detached, true, __ATOMIC_RELEASE);
		dbox_info("%s: detached; the mount stops when nothing uses it "
			  "any more (%d open files; a working directory in it "
			  "counts too)", s->fs->mountpoint, open_files);
	}
	said = time(NULL);
	while ((sig = next_signal(s, 1000)) >= 0) {
		if (sig > 0)
			continue; /* stopping already */
		open_files = write_back_open_files(s->fs);
		if (time(NULL) >= said + 60) {
			dbox_info("%s: detached and still in use (%d open files, "
				  "or a working directory in it); stopping when "
				  "nothing uses it", s->fs->mountpoint,
				  open_files);
			said = time(NULL);
		}
	}
	return NULL;
}

int fs_stop_start(struct fs *fs)
{
	struct sigaction sa = { .sa_handler = on_stop_signal };
	struct fs_stop *s = calloc(1, sizeof(*s));
	unsigned char rnd[16];
	int ret;

	if (s == NULL) {
		ret = -ENOMEM;
		goto fail;
	}
	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
		ret = -EIO;
		free(s);
		goto fail;
	}
	for (size_t i = 0; i < sizeof(rnd); i++)
		snprintf(s->nonce + 2 * i, 3, "%02x", rnd[i]);
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
	dbox_error("cannot wait for a stop signal (%s): libfuse stops the "
		   "mount (cached writes may be lost)", strerror(-ret));
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
