/*
 * store-commit.c: deferred commits of the mount (docs/durability.md,
 * "Deferred commits").  An operation whose loss at the death of the
 * daemon is harmless - a message's rename within its directory, a flag
 * change, the atime a read moves, the create of a message whose close
 * will commit - ends without a COMMIT
 * (dbox_index_commit_later); the next commit of any operation carries
 * it, and this file's thread commits it
 * at the latest DBOX_DEFER_MS after the first deferred one.  A COMMIT
 * costs some eight fcntl() locks of SQLite's WAL-index and a write of
 * the WAL; a mail reader marking messages makes one per batch instead
 * of one per rename.
 *
 * Another process that writes the index of the mounted store (dboxadm
 * altmove's request) would find the write lock held from one deferred
 * commit to the next under a storm of flag renames: SQLite's busy
 * handler sleeps and tries again, and the gaps between the thread's
 * COMMIT and the next rename's BEGIN are microseconds (helper-86: 5 of 8
 * online altmoves failed with "database is locked" after 5 s).  So that
 * process leaves a mark (DBOX_STORE_WAITING) first; the thread looks for
 * it before each commit it makes, and on seeing it nothing is deferred
 * for DBOX_DEFER_HOLD_MS: each operation commits at once, and the lock
 * is free between them as without deferred commits.
 *
 * The thread is woken only by a first deferral that finds it waiting
 * without a deadline (st->defer.idle): one waiting for an older
 * deadline takes the new one from since_ns when it wakes.  A delivery
 * defers its create, and woke it once per delivery before.
 *
 * Invariants:
 *  - operations defer only while the thread runs (st->defer.on), so a
 *    deferred change is never older than DBOX_DEFER_MS plus the time
 *    the thread waits for st->lock;
 *  - st->defer.since_ns is the time of the oldest deferred operation
 *    whenever the index holds one (set when the first defers);
 *  - the thread takes st->lock and nothing else; it commits only
 *    between operations (every operation runs its transaction inside one
 *    hold of st->lock).
 */
#include "engine/store-layout.h"
#include "engine/store-private.h"

#include "index/reserve.h"
#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* CLOCK_MONOTONIC now, in nanoseconds. */
static int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Is there a fresh mark of a process waiting to write the index?  One
   dated in the future (set so by the store's owner, or left before the
   clock was set back) is no fresh one: it would stop deferred commits
   for as long (helper-87). */
static bool writer_waits(const struct dbox_store *st)
{
	struct stat sb;
	time_t age;

	if (fstatat(st->dir_fd, DBOX_STORE_WAITING, &sb,
		    AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(sb.st_mode))
		return false;
	age = time(NULL) - sb.st_mtime;
	return age >= -1 && age < DBOX_WAITING_STALE_SEC;
}

void dbox_store_writer_waits(int dir_fd)
{
	int fd = openat(dir_fd, DBOX_STORE_WAITING, O_WRONLY | O_CREAT |
			O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);

	if (fd < 0)
		return;
	(void)futimens(fd, NULL); /* fresh, also when it was there */
	close(fd);
}

void dbox_store_writer_done(int dir_fd)
{
	(void)unlinkat(dir_fd, DBOX_STORE_WAITING, 0);
}

static void *defer_main(void *arg)
{
	struct dbox_store *st = arg;
	struct dbox_store_defer *d = &st->defer;

	dbox_store_mutex_lock(st);
	while (!d->stop) {
		int64_t due = d->since_ns + (int64_t)DBOX_DEFER_MS * 1000000;
		struct timespec ts;

		if (st->index == NULL || !dbox_index_deferred(st->index)) {
			d->idle = true;
			dbox_store_mutex_wait(st, &d->cond);
			d->idle = false;
			continue;
		}
		if (mono_ns() < due) {
			ts.tv_sec = due / 1000000000;
			ts.tv_nsec = due % 1000000000;
			(void)dbox_store_mutex_timedwait(st, &d->cond, &ts);
			continue;
		}
		/* Between deferred commits the lock is free only for
		   microseconds: a waiting writer gets a pause. */
		if (writer_waits(st))
			d->hold_until_ns = mono_ns() +
				(int64_t)DBOX_DEFER_HOLD_MS * 1000000;
		(void)dbox_store_commit_deferred(st);
	}
	if (st->index != NULL)
		(void)dbox_store_commit_deferred(st);
	dbox_store_mutex_unlock(st);
	return NULL;
}

int dbox_store_defer_start(struct dbox_store *st)
{
	struct dbox_store_defer *d = &st->defer;
	pthread_condattr_t attr;
	int ret;

	dbox_store_assert_unlocked(st);
	assert(!d->on && !st->readonly);
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&d->cond, &attr);
	pthread_condattr_destroy(&attr);
	d->stop = false;
	dbox_store_mutex_lock(st);
	ret = pthread_create(&d->thread, NULL, defer_main, st);
	if (ret == 0)
		d->on = true;
	dbox_store_mutex_unlock(st);
	if (ret != 0) {
		pthread_cond_destroy(&d->cond);
		dbox_warning("%s: no thread for deferred commits (%s): every "
			     "rename commits at once", st->path, strerror(ret));
		return -ret;
	}
	return 0;
}

void dbox_store_defer_stop(struct dbox_store *st)
{
	struct dbox_store_defer *d = &st->defer;

	if (!d->on)
		return;
	dbox_store_assert_unlocked(st);
	dbox_store_mutex_lock(st);
	d->stop = true;
	pthread_cond_signal(&d->cond);
	dbox_store_mutex_unlock(st);
	pthread_join(d->thread, NULL);
	dbox_store_mutex_lock(st);
	d->on = false;
	dbox_store_mutex_unlock(st);
	pthread_cond_destroy(&d->cond);
}

int dbox_store_commit_later(struct dbox_store *st, bool made_inodes)
{
	struct dbox_store_defer *d = &st->defer;
	bool first;
	int ret;

	dbox_store_assert_locked(st);
	/* Not while the disk is full (the index reserve in use): a commit
	   may fail then, and a failed deferred one would undo renames
	   already acknowledged; committed now, the rename itself says
	   ENOSPC (helper-84). */
	if (!d->on || d->stop || dbox_index_reserve_short(st->index))
		return dbox_index_commit(st->index, false);
	first = !dbox_index_deferred(st->index);
	/* Another process waits to write (defer_main): at once. */
	if (first && d->hold_until_ns != 0 && mono_ns() < d->hold_until_ns)
		return dbox_index_commit(st->index, false);
	if ((ret = dbox_index_commit_later(st->index, made_inodes)) < 0)
		return ret;
	if (first) {
		d->since_ns = mono_ns();
		/* A thread waiting for an older deadline finds this one when
		   it wakes (defer_main takes the deadline from since_ns): no
		   wakeup, which costs the futex calls of two threads. */
		if (d->idle)
			pthread_cond_signal(&d->cond);
	}
	return 0;
}

int dbox_store_commit_deferred(struct dbox_store *st)
{
	dbox_store_assert_locked(st);
	return dbox_index_commit_deferred(st->index);
}
