/*
 * fs-stop.c: write back the kernel's cached writes before an orderly
 * stop of a writeback_cache mount (fs-stop.h).
 *
 * The handler only writes the signal's number into a pipe (async-signal
 * safe); the thread reads it, has the kernel write back the open files
 * and re-raises the signal in the session loop's thread with libfuse's
 * handler back in place.
 */
#include "fs/fs.h"
#include "fs/fs-stop.h"

#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
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
   bytes with it.  What fails is logged; the stop goes on. */
static void write_back_open_files(struct fs *fs)
{
	fuse_ino_t *inos = NULL;
	size_t n = 0, size = 0;
	int ret;

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
	fs_unlock(fs);
	for (size_t i = 0; i < n; i++) {
		/* Several handles of one inode: once is enough. */
		bool seen = false;

		for (size_t j = 0; j < i && !seen; j++)
			seen = inos[j] == inos[i];
		if (seen)
			continue;
		ret = fuse_lowlevel_notify_inval_inode(fs->se, inos[i], 0, 0);
		if (ret < 0 && ret != -ENOENT) {
			dbox_error("inode %llu: writing back its cached writes "
				   "before unmounting: %s",
				   (unsigned long long)inos[i], strerror(-ret));
		}
	}
	free(inos);
}

static void *stop_thread(void *arg)
{
	struct fs_stop *s = arg;
	unsigned char b;
	ssize_t n;

	while ((n = read(s->pipe[0], &b, 1)) < 0 && errno == EINTR)
		;
	if (n != 1)
		return NULL; /* fs_stop_finish: the session ended otherwise */
	dbox_info("%s received; writing back the kernel's cached writes, then "
		  "unmounting", strsignal(b));
	write_back_open_files(s->fs);
	give_back_signals(s);
	pthread_kill(s->loop, b);
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
