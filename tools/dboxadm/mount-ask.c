/*
 * mount-ask.c: what dboxadm purge and dboxadm altmove share
 * (mount-ask.h): the store's lock probed, the verb run here or asked of
 * the mount, the mount proven (engine/store-holder.h), signalled and
 * waited for.
 */
#include "engine/store-holder.h"
#include "engine/store-layout.h"
#include "engine/store-lock.h"
#include "engine/store.h"
#include "engine/view.h"
#include "dboxadm.h"
#include "mount-ask.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_TIMEOUT (86400 * 7)
#define POLL_MS 100

/* The mount of the store, from its lock lock_fd (held by someone else),
   proven (engine/store-holder.h) before anything is sent to it.  Returns
   0 with *h proven, or -1 after reporting why not. */
static int prove_mount(const char *store, int lock_fd, struct dbox_holder *h)
{
	const char *why;

	if (dbox_holder_prove(lock_fd, h) == 0)
		return 0;
	switch (h->why) {
	case DBOX_HOLDER_NO_PID:
		adm_error("%s: the store is in use, but not by a dboxfs mount "
			  "that takes purge requests (another dboxadm?)", store);
		return -1;
	case DBOX_HOLDER_STALE:
	case DBOX_HOLDER_GONE:
		adm_error("%s: process %d named by STORE/" DBOX_STORE_LOCK
			  " is gone%s", store, (int)h->pid,
			  h->why == DBOX_HOLDER_STALE ? " (stale pid)" : "");
		return -1;
	case DBOX_HOLDER_UNREADABLE:
		if (h->err == -EACCES || h->err == -EPERM) {
			/* Root's dboxadm acts as a user's store's owner, who
			   may not look at (nor signal) a mount root runs
			   (helper-87: the advice was to run as the owner). */
			adm_error("%s: not signalling process %d named by "
				  "STORE/" DBOX_STORE_LOCK ": it runs as another "
				  "user than uid %u, which dboxadm runs as for "
				  "this store (a user's store root mounted?); "
				  "such a mount takes no online request: "
				  "unmount it and run this again, or have the "
				  "store's owner mount it", store, (int)h->pid,
				  (unsigned)getuid());
			return -1;
		}
		why = strerror(-h->err);
		break;
	case DBOX_HOLDER_NOT_MOUNT:
		why = "it is not a dboxfs mount of this store";
		break;
	default:
		why = "it does not run as the owner of STORE/" DBOX_STORE_LOCK;
		break;
	}
	adm_error("%s: not signalling process %d named by STORE/" DBOX_STORE_LOCK
		  ": %s", store, (int)h->pid, why);
	return -1;
}


/* Signal the mount h (SIGUSR1) and wait for the request made at t0 to be
   done.  Returns 0, or ADM_EXIT_FAILED after reporting why not. */
int adm_ask_mount(const struct dbox_holder *h, int64_t t0,
		     const struct mount_wait *w)
{
	int64_t deadline = t0 + (int64_t)w->timeout * 1000000000;
	int ret;

	if ((ret = dbox_holder_signal(h, SIGUSR1)) < 0) {
		adm_error("%s: cannot signal the mount (pid %d): %s", w->store,
			  (int)h->pid, strerror(-ret));
		return ADM_EXIT_FAILED;
	}
	while (w->poll(w->ctx) != 1) {
		struct timespec ts = { 0, POLL_MS * 1000000L };

		if (dbox_holder_signal(h, 0) == -ESRCH) {
			adm_error("%s: the mount (pid %d) went away during %s",
				  w->store, (int)h->pid, w->gone);
			return ADM_EXIT_FAILED;
		}
		if (dbox_now_ns() > deadline) {
			adm_error("%s: the mount has not finished %s after %lu s; "
				  "it goes on in the background", w->store,
				  w->late, w->timeout);
			return ADM_EXIT_FAILED;
		}
		nanosleep(&ts, NULL);
	}
	return 0;
}

int adm_mount_request(const char *store, int lock_fd,
		      int (*ask)(void *ctx, struct dbox_view *view,
				 const struct dbox_holder *h),
		      void *ctx, pid_t *pid_r)
{
	struct dbox_view *view = NULL;
	struct dbox_holder h;
	int ret;

	if (prove_mount(store, lock_fd, &h) < 0)
		return ADM_EXIT_USAGE;
	*pid_r = h.pid;
	if ((ret = adm_open_view(store, &view)) == ADM_EXIT_OK)
		ret = ask(ctx, view, &h);
	dbox_holder_release(&h);
	dbox_view_close(&view);
	return ret;
}

/* STORE/lock, opened for reading relative to the store directory and
   never through a symbolic link (nor a FIFO or device), and tried once:
   *busy_r when another process holds it.  Returns its fd, -1 when there
   is none (no mount holds the store), or -2 after reporting a store or
   lock that is refused, or one held by a read-only mount (which cannot
   do verb's work). */
static int open_lock(const char *store, const char *verb, bool *busy_r)
{
	char who[4200];
	bool held, shared;
	int dir_fd, fd;

	*busy_r = false;
	if ((dir_fd = open(store, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		adm_error("%s: %s", store, strerror(errno));
		return -2;
	}
	fd = dbox_store_lock_try(dir_fd, false, &held);
	close(dir_fd);
	if (fd == -ENOENT)
		return -1;
	if (fd < 0) {
		adm_error("%s/" DBOX_STORE_LOCK ": %s; a store's lock is a plain "
			  "file, so the store is refused", store,
			  fd == -ELOOP ? "a symbolic link" : fd == -EINVAL ?
			  "not a regular file" : strerror(-fd));
		return -2;
	}
	if (held) {
		dbox_store_lock_release(fd); /* free: the caller decides */
		return fd;
	}
	/* A -o ro mount holds the lock shared and writes no pid: no waiting
	   for a close it does not announce, no request it cannot take. */
	if (dbox_store_lock_holder(fd, &shared) > 0 && shared) {
		const char *text = dbox_store_lock_holder_text(fd, who,
							       sizeof(who));

		adm_error("%s is mounted read-only%s%s%s: %s needs a "
			  "read-write mount of it or the store unmounted",
			  store, text[0] ? " (" : "", text, text[0] ? ")" : "",
			  verb);
		close(fd);
		return -2;
	}
	*busy_r = true;
	return fd;
}


/* Held by a mount (or another dboxadm): ask it.  Free, or held by a mount
   that is closing: work here (opening the store waits for the closing
   mount); should a mount take the lock in between, ask that one.  Returns
   the exit code. */
int adm_here_or_mount(const struct here_or_mount *v)
{
	bool busy;
	int fd, ret;

	if ((fd = open_lock(v->store, v->verb, &busy)) == -2)
		return ADM_EXIT_USAGE;
	if (fd >= 0 && busy && !dbox_store_lock_is_closing(fd)) {
		ret = v->mount(v->ctx, fd);
	} else {
		if (fd >= 0)
			close(fd);
		fd = -1;
		ret = v->here(v->ctx);
		if (ret == -EBUSY) {
			if ((fd = open_lock(v->store, v->verb, &busy)) < 0)
				ret = ADM_EXIT_USAGE;
			else
				ret = v->mount(v->ctx, fd);
		} else if (ret < 0) {
			ret = ADM_EXIT_USAGE; /* refused; the store said why */
		}
	}
	if (fd >= 0)
		close(fd);
	if (ret == 0 && fflush(stdout) != 0)
		ret = ADM_EXIT_FAILED;
	return ret;
}

/* A --timeout value (seconds), or 0 when bad. */
unsigned long adm_parse_timeout(const char *arg)
{
	unsigned long v;
	char *end;

	errno = 0;
	v = strtoul(arg, &end, 10);
	if (*arg == '\0' || *end != '\0' || errno != 0 || v > MAX_TIMEOUT)
		return 0;
	return v;
}

