/*
 * fs-purge.c: the daemon's purge thread (see fs-purge.h).
 *
 * The thread sleeps in poll() on an eventfd.  The SIGUSR1 handler and the
 * first note of a burst write to it.  Notes collect the ids of m.N files
 * that gained garbage in a small set (its own mutex, taken after the
 * store lock, never the other way round); a set that overflows turns into
 * "look at every sealed file".
 */
#include "fs/fs-purge.h"

#include "engine/purge.h"
#include "storage/log.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* Wait after the first note before purging, so a burst of expunges is
   handled in one run. */
#define NOTE_DELAY_MS 2000
/* Files remembered; more turn the next automatic run into a scan. */
#define MAX_DIRTY 1024

struct fs_purge {
	struct fs *fs;
	pthread_t thread;
	int efd;
	bool stop;  /* set by fs_purge_stop, read atomically */

	pthread_mutex_t lock;        /* guards the fields below */
	uint32_t dirty[MAX_DIRTY];
	size_t ndirty;
	bool dirty_all;              /* overflowed: scan every file */
	int64_t first_note_ns;       /* 0: no note pending */
};

/* The eventfd the signal handler writes to (one mount per process). */
static int signal_efd = -1; /* atomic */
/* Set by the handler, taken by the purge thread: atomics (lock-free for
   int, so safe in a signal handler), as the thread is not the one the
   signal interrupts. */
static int purge_requested;

static void wake(int efd)
{
	uint64_t one = 1;
	ssize_t n = write(efd, &one, sizeof(one));

	(void)n; /* the counter saturates only after 2^64 - 1 wakes */
}

static void on_sigusr1(int sig)
{
	int saved = errno, efd;

	(void)sig;
	__atomic_store_n(&purge_requested, 1, __ATOMIC_RELEASE);
	efd = __atomic_load_n(&signal_efd, __ATOMIC_ACQUIRE);
	if (efd >= 0)
		wake(efd);
	errno = saved;
}

void fs_purge_note(struct fs *fs, uint32_t file_id)
{
	struct fs_purge *p = fs->purge;
	bool first;

	if (p == NULL || fs->opts.purge_threshold == 0)
		return;
	pthread_mutex_lock(&p->lock);
	first = p->first_note_ns == 0;
	if (first)
		p->first_note_ns = dbox_now_ns();
	if (!p->dirty_all) {
		size_t i;

		for (i = 0; i < p->ndirty && p->dirty[i] != file_id; i++)
			;
		if (i == p->ndirty) {
			if (p->ndirty < MAX_DIRTY)
				p->dirty[p->ndirty++] = file_id;
			else
				p->dirty_all = true;
		}
	}
	pthread_mutex_unlock(&p->lock);
	if (first)
		wake(p->efd);
}

static void log_result(const char *what, int ret,
		       const struct dbox_purge_result *res)
{
	if (res->files_purged == 0 && res->garbage_files == 0 && ret == 0)
		return;
	dbox_info("%s purge: %llu files removed (%llu bytes), %llu records "
		  "(%llu bytes) moved, %llu files kept busy, %llu failed%s",
		  what, (unsigned long long)(res->files_purged +
					     res->garbage_files),
		  (unsigned long long)res->bytes_freed,
		  (unsigned long long)res->records_moved,
		  (unsigned long long)res->bytes_moved,
		  (unsigned long long)res->files_busy,
		  (unsigned long long)res->files_failed,
		  ret == -ECANCELED ? " (cancelled)" : "");
}

/* Progress of a requested altmove, written to the index for dboxadm at
   most every PROGRESS_MS. */
#define PROGRESS_MS 300
struct altmove_progress {
	struct dbox_store *st;
	int64_t request_ns, last_ns;
};

static void altmove_progress_cb(void *ctx, const struct dbox_purge_result *res)
{
	struct altmove_progress *ap = ctx;
	int64_t now = dbox_now_ns();

	if (now - ap->last_ns < (int64_t)PROGRESS_MS * 1000000)
		return;
	ap->last_ns = now;
	(void)dbox_altmove_progress(ap->st, ap->request_ns, res);
}

/* An altmove `dboxadm altmove` asked for (engine/purge.h): pending when
   the request time in the index is newer than the last one done.
   Returns true when there was one (then it was run and recorded). */
static bool run_altmove(struct fs_purge *p)
{
	struct dbox_store *st = p->fs->st;
	struct dbox_purge_settings set = { .altmove = true,
					   .check_rows = true,
					   .cancel = &p->stop };
	struct dbox_purge_result res, purged;
	struct altmove_progress ap = { 0 };
	int64_t request, before;
	uint64_t folder;
	int ret;

	dbox_store_mutex_lock(st);
	ret = dbox_altmove_pending(st, &request, &before, &folder);
	dbox_store_mutex_unlock(st);
	if (ret <= 0)
		return false;
	set.altmove_before_ns = before;
	set.altmove_folder = folder;
	ap.st = st;
	ap.request_ns = request;
	set.progress = altmove_progress_cb;
	set.hook_ctx = &ap;
	ret = dbox_altmove(st, &set, &res, &purged);
	dbox_info("requested altmove: %llu records (%llu bytes) moved to %s, "
		  "%llu files emptied%s%s", (unsigned long long)res.records_moved,
		  (unsigned long long)res.bytes_moved,
		  st->alt_path != NULL ? st->alt_path : "(no ALT)",
		  (unsigned long long)res.files_purged,
		  ret < 0 ? ": " : "", ret < 0 ? strerror(-ret) : "");
	res.error = ret;
	if (ret != -ECANCELED && dbox_altmove_record(st, request, &res,
						      &purged) < 0)
		dbox_error("%s: altmove done, but not recorded in the index "
			   "(dboxadm altmove will time out)", st->path);
	return true;
}

/* The purge `dboxadm purge` asked for: every file with a dead byte. */
static void run_requested(struct fs_purge *p)
{
	struct dbox_purge_settings set = { .threshold = 0,
					   .check_rows = true,
					   .cancel = &p->stop };
	struct dbox_purge_result res;
	int ret = dbox_purge(p->fs->st, &set, &res);

	log_result("requested", ret, &res);
	if (ret != -ECANCELED && dbox_purge_record(p->fs->st, &res, true) < 0)
		dbox_error("%s: purge done, but not recorded in the index "
			   "(dboxadm purge will time out)", p->fs->st->path);
}

/* The automatic purge of the noted sealed files past the threshold. */
static void run_noted(struct fs_purge *p)
{
	struct dbox_purge_settings set = {
		.threshold = p->fs->opts.purge_threshold,
		.sealed_only = true,
		.cancel = &p->stop,
	};
	struct dbox_purge_result res;
	uint32_t ids[MAX_DIRTY];
	bool all;
	int ret;

	pthread_mutex_lock(&p->lock);
	all = p->dirty_all;
	set.only_count = p->ndirty;
	memcpy(ids, p->dirty, p->ndirty * sizeof(ids[0]));
	p->ndirty = 0;
	p->dirty_all = false;
	p->first_note_ns = 0;
	pthread_mutex_unlock(&p->lock);
	if (!all && set.only_count == 0)
		return;
	set.only = all ? NULL : ids;
	ret = dbox_purge(p->fs->st, &set, &res);
	log_result("automatic", ret, &res);
	if (ret != -ECANCELED &&
	    (res.files_purged > 0 || res.garbage_files > 0))
		dbox_purge_record(p->fs->st, &res, false);
}

static void *purge_thread(void *arg)
{
	struct fs_purge *p = arg;
	sigset_t set;

	/* Signals go to the other threads (libfuse's handlers). */
	sigfillset(&set);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	while (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) {
		struct pollfd pfd = { .fd = p->efd, .events = POLLIN };
		int64_t first, wait_ms = -1;
		uint64_t count;

		pthread_mutex_lock(&p->lock);
		first = p->first_note_ns;
		pthread_mutex_unlock(&p->lock);
		if (first != 0) {
			wait_ms = NOTE_DELAY_MS -
				(dbox_now_ns() - first) / 1000000;
			if (wait_ms < 0)
				wait_ms = 0;
		}
		if (!__atomic_load_n(&purge_requested, __ATOMIC_ACQUIRE) &&
		    poll(&pfd, 1, (int)wait_ms) > 0 &&
		    read(p->efd, &count, sizeof(count)) < 0 && errno != EAGAIN)
			dbox_warning("purge thread: eventfd: %s", strerror(errno));
		if (__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE))
			break;
		if (__atomic_exchange_n(&purge_requested, 0, __ATOMIC_ACQ_REL)) {
			if (!p->fs->opts.readonly && run_altmove(p))
				continue;
			run_requested(p);
			continue;
		}
		pthread_mutex_lock(&p->lock);
		first = p->first_note_ns;
		pthread_mutex_unlock(&p->lock);
		if (first != 0 &&
		    dbox_now_ns() - first >= (int64_t)NOTE_DELAY_MS * 1000000)
			run_noted(p);
	}
	return NULL;
}

/* Write "<pid>\n<mount point>\n" into STORE/lock (store-lock.h; the
   mount point left out when it holds a newline), or empty it (pid 0). */
static void write_pid(struct dbox_store *st, pid_t pid, const char *mnt)
{
	char buf[PATH_MAX + 32];
	int len = 0;

	if (pid != 0 && mnt != NULL && strchr(mnt, '\n') == NULL)
		len = snprintf(buf, sizeof(buf), "%d\n%s\n", (int)pid, mnt);
	if (pid != 0 && (len <= 0 || (size_t)len >= sizeof(buf)))
		len = snprintf(buf, sizeof(buf), "%d\n", (int)pid);
	if (ftruncate(st->lock_fd, 0) < 0 ||
	    (len > 0 && pwrite(st->lock_fd, buf, (size_t)len, 0) != len))
		dbox_warning("%s/lock: writing the pid: %s; 'dboxadm purge' "
			     "cannot reach this mount", st->path,
			     strerror(errno));
}

int fs_purge_start(struct fs *fs)
{
	struct sigaction sa = { .sa_handler = on_sigusr1,
				.sa_flags = SA_RESTART };
	struct fs_purge *p = calloc(1, sizeof(*p));
	int ret;

	if (p == NULL)
		return -ENOMEM;
	p->fs = fs;
	pthread_mutex_init(&p->lock, NULL);
	p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (p->efd < 0) {
		ret = -errno;
		goto fail;
	}
	__atomic_store_n(&signal_efd, p->efd, __ATOMIC_RELEASE);
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGUSR1, &sa, NULL) < 0) {
		ret = -errno;
		goto fail;
	}
	if ((ret = -pthread_create(&p->thread, NULL, purge_thread, p)) < 0) {
		signal(SIGUSR1, SIG_IGN);
		goto fail;
	}
	fs->purge = p;
	write_pid(fs->st, getpid(), fs->mountpoint);
	return 0;
fail:
	dbox_error("%s: cannot start the purge thread: %s", fs->st->path,
		   strerror(-ret));
	__atomic_store_n(&signal_efd, -1, __ATOMIC_RELEASE);
	if (p->efd >= 0)
		close(p->efd);
	pthread_mutex_destroy(&p->lock);
	free(p);
	return ret;
}

void fs_purge_stop(struct fs *fs)
{
	struct fs_purge *p = fs->purge;

	if (p == NULL)
		return;
	write_pid(fs->st, 0, NULL);
	signal(SIGUSR1, SIG_IGN);
	__atomic_store_n(&p->stop, true, __ATOMIC_RELEASE);
	wake(p->efd);
	pthread_join(p->thread, NULL);
	fs->purge = NULL;
	__atomic_store_n(&signal_efd, -1, __ATOMIC_RELEASE);
	close(p->efd);
	pthread_mutex_destroy(&p->lock);
	free(p);
}
