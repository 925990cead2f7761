/*
 * fs-walkcut.c: after a chmod or chown that took the owner's search
 * permission on a directory away, have the kernel drop the names it has
 * cached in that directory, so that the next path walk through it sends
 * a LOOKUP, which the daemon refuses (fs-perm.c explains why only such a
 * change needs it; fs.h, fs_walkcut_*).
 *
 * The kernel drops a name (fuse_lowlevel_notify_inval_entry) only with
 * the directory's lock, and a request in that directory (LOOKUP,
 * READDIR, the SETATTR itself until its reply) holds that lock while it
 * waits for the daemon.  So the notifications are sent by a thread of
 * their own, never by a request thread: a request thread waiting there
 * could be the one the lock holder waits for, and with every worker
 * waiting so, the mount stops (found by a stress test of chmods against
 * listings).  The cost: a walk in the moments between the SETATTR's
 * reply and the drop still uses the cached names.
 *
 * Lock order: the queue's mutex is a leaf; it is never held across a
 * notification or an index call.
 */
#include "fs.h"

#include "engine/perm.h"
#include "storage/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Names of directory dir the kernel may have cached. */
struct fs_walkcut_job {
	uint64_t dir;
	char **names;
	size_t n;
	struct fs_walkcut_job *next;
};

struct fs_walkcut {
	struct fuse_session *se;
	char *store;                   /* for log lines: a copy of the path */
	pthread_t thread;
	pthread_mutex_t lock;          /* guards the fields below */
	pthread_cond_t wake;
	struct fs_walkcut_job *head, *tail;
	bool stop, done;
};

static void job_free(struct fs_walkcut_job *job)
{
	if (job == NULL)
		return;
	for (size_t i = 0; i < job->n; i++)
		free(job->names[i]);
	free(job->names);
	free(job);
}

/* dbox_readdir_cb_t: note ent's name when the kernel holds its inode. */
struct collect_ctx {
	struct fs *fs;
	struct fs_walkcut_job *job;
};

static int collect_child(void *vctx, const struct dbox_dirent *ent)
{
	struct collect_ctx *ctx = vctx;
	struct fs_walkcut_job *job = ctx->job;
	struct fs_inode *inode = fs_inode_get(&ctx->fs->inodes, ent->attr.ino);
	char **more;

	if (inode == NULL || inode->nlookup == 0)
		return 0;
	more = realloc(job->names, (job->n + 1) * sizeof(*job->names));
	if (more == NULL)
		return -ENOMEM;
	job->names = more;
	if ((job->names[job->n] = strndup(ent->name, ent->namelen)) == NULL)
		return -ENOMEM;
	job->n++;
	return 0;
}

int fs_walkcut_collect(struct fs *fs, struct dbox_cred *c,
		       const struct dbox_attr *before,
		       const struct dbox_attr *after,
		       struct fs_walkcut_job **job_r)
{
	struct collect_ctx ctx = { .fs = fs };
	int ret;

	*job_r = NULL;
	if (!fs->own_checks || fs->walkcut == NULL ||
	    after->kind != DBOX_KIND_DIR ||
	    dbox_perm_may(c, before, DBOX_MAY_EXEC) < 0 ||
	    dbox_perm_may(c, after, DBOX_MAY_EXEC) == 0)
		return 0;
	if ((ctx.job = calloc(1, sizeof(*ctx.job))) == NULL)
		return -ENOMEM;
	ctx.job->dir = after->ino;
	ret = dbox_ns_readdir(fs->st, after->ino, 0, collect_child, &ctx);
	if (ctx.job->n == 0) {
		job_free(ctx.job);
		ctx.job = NULL;
	}
	*job_r = ctx.job;
	return ret;
}

void fs_walkcut_queue(struct fs *fs, struct fs_walkcut_job *job)
{
	struct fs_walkcut *wc = fs->walkcut;

	if (job == NULL)
		return;
	pthread_mutex_lock(&wc->lock);
	if (wc->stop) {
		pthread_mutex_unlock(&wc->lock);
		job_free(job);
		return;
	}
	if (wc->tail != NULL)
		wc->tail->next = job;
	else
		wc->head = job;
	wc->tail = job;
	pthread_cond_signal(&wc->wake);
	pthread_mutex_unlock(&wc->lock);
}

static void send_job(struct fs_walkcut *wc, struct fs_walkcut_job *job)
{
	for (size_t i = 0; i < job->n; i++) {
		int ret = fuse_lowlevel_notify_inval_entry(wc->se, job->dir,
							  job->names[i],
							  strlen(job->names[i]));

		/* -ENOENT: the kernel had dropped it already; -ENOTCONN,
		   -ENODEV: unmounted meanwhile. */
		if (ret < 0 && ret != -ENOENT && ret != -ENOTCONN &&
		    ret != -ENODEV)
			dbox_warning("%s: directory inode %llu: a cached name "
				     "was not dropped after its search "
				     "permission went: %s", wc->store,
				     (unsigned long long)job->dir,
				     strerror(-ret));
	}
}

static void *walkcut_main(void *arg)
{
	struct fs_walkcut *wc = arg;
	struct fs_walkcut_job *job;

	pthread_mutex_lock(&wc->lock);
	for (;;) {
		while (wc->head == NULL && !wc->stop)
			pthread_cond_wait(&wc->wake, &wc->lock);
		if (wc->stop)
			break;
		job = wc->head;
		wc->head = job->next;
		if (wc->head == NULL)
			wc->tail = NULL;
		pthread_mutex_unlock(&wc->lock);
		send_job(wc, job);
		job_free(job);
		pthread_mutex_lock(&wc->lock);
	}
	wc->done = true;
	pthread_cond_broadcast(&wc->wake);
	pthread_mutex_unlock(&wc->lock);
	return NULL;
}

int fs_walkcut_start(struct fs *fs)
{
	struct fs_walkcut *wc;
	int ret;

	if (!fs->own_checks)
		return 0;
	if ((wc = calloc(1, sizeof(*wc))) == NULL ||
	    (wc->store = strdup(fs->st->path)) == NULL) {
		if (wc != NULL)
			free(wc);
		return -ENOMEM;
	}
	wc->se = fs->se;
	pthread_mutex_init(&wc->lock, NULL);
	pthread_cond_init(&wc->wake, NULL);
	if ((ret = pthread_create(&wc->thread, NULL, walkcut_main, wc)) != 0) {
		pthread_cond_destroy(&wc->wake);
		pthread_mutex_destroy(&wc->lock);
		free(wc->store);
		free(wc);
		return -ret;
	}
	fs->walkcut = wc;
	return 0;
}

void fs_walkcut_stop(struct fs *fs)
{
	struct fs_walkcut *wc = fs->walkcut;
	struct fs_walkcut_job *job;
	struct timespec deadline;
	bool done;

	if (wc == NULL)
		return;
	fs->walkcut = NULL;
	pthread_mutex_lock(&wc->lock);
	wc->stop = true;
	pthread_cond_broadcast(&wc->wake);
	/* A notification may wait for a directory lock whose holder no
	   request thread serves any more (the loop ended on a signal): give
	   it a second, then leave the thread to exit() with its queue. */
	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += 1;
	while (!wc->done &&
	       pthread_cond_timedwait(&wc->wake, &wc->lock, &deadline) == 0)
		;
	done = wc->done;
	pthread_mutex_unlock(&wc->lock);
	if (!done) {
		dbox_warning("%s: cached names still being dropped at exit",
			     wc->store);
		return;
	}
	pthread_join(wc->thread, NULL);
	while ((job = wc->head) != NULL) {
		wc->head = job->next;
		job_free(job);
	}
	pthread_cond_destroy(&wc->wake);
	pthread_mutex_destroy(&wc->lock);
	free(wc->store);
	free(wc);
}
