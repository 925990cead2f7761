#ifndef DBOXADM_MOUNT_ASK_H
#define DBOXADM_MOUNT_ASK_H

/*
 * mount-ask: dboxadm verbs that work on a store here when nobody holds it
 * and otherwise ask its mount (purge, altmove): the lock probed, the
 * mount proven to be the dboxfs serving the store
 * (engine/store-holder.h), signalled with SIGUSR1, and waited for.
 */

#include "engine/store-holder.h"

#include <stdint.h>

/* Seconds dboxadm waits for a mount by default (--timeout). */
#define ADM_MOUNT_TIMEOUT 600

/* What waiting on a mount's request says, and how it polls. */
struct mount_wait {
	const char *store;
	const char *gone;      /* "the mount went away during <gone>" */
	const char *late;      /* "has not finished <late> after N s" */
	unsigned long timeout; /* seconds */
	/* 1 done, 0 not yet (errors: not yet, the timeout ends it) */
	int (*poll)(void *ctx);
	void *ctx;
};

/* A verb that works here on a store nobody holds, else asks its mount. */
struct here_or_mount {
	const char *store, *verb;
	int (*here)(void *ctx);    /* an exit code, or a negative errno of
				      opening the store (-EBUSY: taken) */
	int (*mount)(void *ctx, int lock_fd);   /* an exit code */
	void *ctx;
};

/* Signal the mount h (SIGUSR1) and wait for the request made at t0 (ns)
   to be done, as w says.  Returns 0, or ADM_EXIT_FAILED after reporting
   why not (the mount went away, the timeout passed). */
int adm_ask_mount(const struct dbox_holder *h, int64_t t0,
		  const struct mount_wait *w);

/* Prove the mount of store from its lock lock_fd (held by someone else),
   open a view of store (engine/view.h) and run ask(ctx, view, h), which
   makes the request and waits (adm_ask_mount); then let go of both.
   Returns what ask returned (an exit code) and *pid_r the mount's pid,
   or ADM_EXIT_USAGE after reporting a mount not proven or a store that
   does not open. */
struct dbox_view;
int adm_mount_request(const char *store, int lock_fd,
		      int (*ask)(void *ctx, struct dbox_view *view,
				 const struct dbox_holder *h),
		      void *ctx, pid_t *pid_r);

/* Held by a mount (or another dboxadm): ask it.  Free, or held by a mount
   that is closing: work here (opening the store waits for the closing
   mount); should a mount take the lock in between, ask that one.  A lock
   that is no plain file, or a read-only mount, refuses the store.
   Returns the exit code. */
int adm_here_or_mount(const struct here_or_mount *v);

/* A --timeout value (seconds, 1 to a week), or 0 when it is bad. */
unsigned long adm_parse_timeout(const char *arg);

#endif
