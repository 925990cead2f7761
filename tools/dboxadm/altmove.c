/*
 * altmove.c: dboxadm altmove STORE [--older-than=DAYS] [--folder=DIR]
 * [--alt=PATH] [--timeout=SECONDS] - move messages to the alternate
 * storage (engine/purge.h dbox_altmove), here when STORE is not mounted,
 * else by the mount (the request goes into the index, then SIGUSR1, as
 * for purge: mount-ask.h).
 */
#include "engine/purge.h"
#include "engine/store-layout.h"
#include "engine/store.h"
#include "engine/view.h"
#include "dboxadm.h"
#include "mount-ask.h"
#include "progress.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct altmove_args {
	const char *store, *folder, *alt;
	int64_t before_ns;
	unsigned long timeout;
};

/* What the move did, and the purge after it. */
static void print_altmove(const struct dbox_purge_result *res,
			  const struct dbox_purge_result *purged)
{
	printf("records moved       %llu (%llu bytes)\n"
	       "files emptied       %llu (%llu bytes, removed)\n",
	       (unsigned long long)res->records_moved,
	       (unsigned long long)res->bytes_moved,
	       /* A file of the append pool emptied is removed as one the
		  index no longer knows (garbage): emptied all the same. */
	       (unsigned long long)(res->files_purged + res->garbage_files),
	       (unsigned long long)res->bytes_freed);
	/* The files the move left partly dead, purged (helper-85: a
	   removed source showed nowhere; helper-90: nor did the mount's). */
	printf("files purged after  %llu (%llu bytes removed, %llu "
	       "bytes of records left in them copied)\n",
	       (unsigned long long)(purged->files_purged +
				    purged->garbage_files),
	       (unsigned long long)purged->bytes_freed,
	       (unsigned long long)purged->bytes_moved);
}

/* The directory ino of a->folder in index (0: every folder, no --folder).
   Returns 0 and *ino_r, or -1 after reporting that there is none. */
static int folder_ino(struct dbox_index *index, const struct altmove_args *a,
		      uint64_t *ino_r)
{
	*ino_r = 0;
	if (a->folder == NULL)
		return 0;
	if (dbox_altmove_folder(index, a->folder, ino_r) == 0)
		return 0;
	adm_error("%s: no folder '%s'", a->store, a->folder);
	return -1;
}

struct altmove_progress {
	struct progress pr;
	uint64_t records, bytes;
};

static void altmove_progress_cb(void *ctx, const struct dbox_purge_result *res)
{
	struct altmove_progress *ap = ctx;

	if (res->records_moved < ap->records || res->bytes_moved < ap->bytes)
		return;
	progress_add(&ap->pr, res->records_moved - ap->records,
		     res->bytes_moved - ap->bytes);
	ap->records = res->records_moved;
	ap->bytes = res->bytes_moved;
}

static int altmove_offline(void *ctx)
{
	const struct altmove_args *a = ctx;
	struct dbox_store_settings set = { .create = false,
					   .alt_path = a->alt };
	struct dbox_purge_settings ps = { .altmove = true, .quiet = true,
					  .check_rows = true,
					  .altmove_before_ns = a->before_ns,
					  .progress = altmove_progress_cb };
	struct altmove_progress ap = { 0 };
	struct dbox_purge_result res, purged = { 0 };
	struct dbox_store *st = NULL;
	int ret;

	if ((ret = dbox_store_open(a->store, &set, &st)) < 0)
		return ret; /* logged */
	if (st->alt_path == NULL) {
		if (a->alt != NULL)
			adm_error("%s: --alt=%s not taken (see above); nothing "
				  "moved", a->store, a->alt);
		else
			adm_error("%s: no alternate storage: give --alt=PATH "
				  "(it is recorded in the store)", a->store);
		dbox_store_close(&st);
		return ADM_EXIT_USAGE;
	}
	if ((a->alt != NULL && strcmp(st->alt_path, a->alt) != 0) ||
	    folder_ino(st->index, a, &ps.altmove_folder) < 0) {
		/* Refused (logged): nothing moved, nothing recorded. */
		dbox_store_close(&st);
		return ADM_EXIT_USAGE;
	}
	ps.hook_ctx = &ap;
	progress_init(&ap.pr, "moved");
	ret = dbox_altmove(st, &ps, &res, &purged);
	progress_finish(&ap.pr);
	dbox_store_close(&st);
	print_altmove(&res, &purged);
	if (ret == -ENOENT)
		return ADM_EXIT_USAGE; /* no usable ALT: logged */
	if (ret < 0) {
		adm_error("%s: altmove failed: %s (see above); run it again "
			  "to finish", a->store, strerror(-ret));
		return ADM_EXIT_FAILED;
	}
	return ADM_EXIT_OK;
}

struct altmove_poll {
	const struct altmove_args *a;
	struct dbox_view *view;
	int64_t t0;
	struct altmove_progress ap;
	struct dbox_purge_result res, purged;
};

static int altmove_poll(void *ctx)
{
	struct altmove_poll *mp = ctx;
	int ret = dbox_altmove_request_poll(mp->view, mp->t0, &mp->res,
					    &mp->purged);

	if (ret == 0)
		altmove_progress_cb(&mp->ap, &mp->res);
	return ret;
}

/* Ask the mount h for the altmove mp->a, through view.  Returns the exit
   code; mp->res the outcome. */
static int altmove_ask(void *ctx, struct dbox_view *view,
		       const struct dbox_holder *h)
{
	struct altmove_poll *mp = ctx;
	const struct altmove_args *a = mp->a;
	struct mount_wait w = { a->store, "the altmove; run it again",
				"the altmove", a->timeout, altmove_poll, mp };
	uint64_t folder;
	int ret;

	mp->view = view;
	if (view->alt_path == NULL ||
	    (a->alt != NULL && strcmp(view->alt_path, a->alt) != 0)) {
		adm_error("%s: the mount %s; mount it with -o alt=%s", a->store,
			  view->alt_path == NULL ? "has no alternate storage" :
			  "uses another alternate storage",
			  a->alt != NULL ? a->alt : "PATH");
		return ADM_EXIT_USAGE;
	}
	if (folder_ino(view->index, a, &folder) < 0)
		return ADM_EXIT_USAGE;
	/* The mount takes one request at a time: another dboxadm's, not
	   run yet, first (signalled, in case its dboxadm died before). */
	for (int64_t until = dbox_now_ns() + (int64_t)a->timeout * 1000000000;
	     (ret = dbox_altmove_request(view, a->before_ns, folder,
					 &mp->t0)) == -EBUSY &&
	     dbox_now_ns() < until;) {
		struct timespec ts = { 0, 100 * 1000000L };

		if (dbox_holder_signal(h, SIGUSR1) == -ESRCH) {
			adm_error("%s: the mount (pid %d) went away before "
				  "it took the altmove; run it again",
				  a->store, (int)h->pid);
			return ADM_EXIT_FAILED;
		}
		nanosleep(&ts, NULL);
	}
	if (ret == -EBUSY) {
		adm_error("%s: another altmove request is still waiting for "
			  "the mount after %lu s; run it again later",
			  a->store, a->timeout);
		return ADM_EXIT_FAILED;
	}
	if (ret < 0) {
		adm_error("%s: cannot write the request into the index: %s",
			  a->store, strerror(-ret));
		return ADM_EXIT_FAILED;
	}
	progress_init(&mp->ap.pr, "moved");
	ret = adm_ask_mount(h, mp->t0, &w);
	progress_finish(&mp->ap.pr); /* the line ends before we return */
	return ret;
}

static int altmove_online(void *ctx, int lock_fd)
{
	const struct altmove_args *a = ctx;
	struct altmove_poll mp = { .a = a };
	pid_t pid = 0;
	int ret = adm_mount_request(a->store, lock_fd, altmove_ask, &mp, &pid);

	if (ret != 0)
		return ret;
	printf("moved by the mount (pid %d)\n", (int)pid);
	print_altmove(&mp.res, &mp.purged);
	if (mp.res.error == 0)
		return ADM_EXIT_OK;
	adm_error("%s: the mount's altmove failed (%s); the mount's log "
		  "(syslog) says why", a->store, strerror(-mp.res.error));
	return ADM_EXIT_FAILED;
}

/* --older-than=DAYS into a->before_ns (the index's time encoding, index.h
   dbox_time_make); false when bad. */
static bool parse_age(const char *arg, struct altmove_args *a)
{
	unsigned long days;
	char *end;

	errno = 0;
	days = strtoul(arg, &end, 10);
	if (*arg == '\0' || *end != '\0' || errno != 0 || days > 100000)
		return false;
	a->before_ns = dbox_time_make(dbox_time_sec(dbox_now_ns()) -
				      (int64_t)days * 86400, 0);
	return true;
}

/* The options of altmove into *a.  Returns 0 or ADM_EXIT_USAGE after
   reporting. */
static int altmove_args(int argc, char **argv, struct altmove_args *a)
{
	static const struct option opts[] = {
		{ "older-than", required_argument, NULL, 'o' },
		{ "folder", required_argument, NULL, 'f' },
		{ "alt", required_argument, NULL, 'a' },
		{ "timeout", required_argument, NULL, 't' },
		{ 0 },
	};
	const struct adm_verb *verb = &adm_verb_altmove;
	bool have_age = false;
	int c;

	/* INT64_MAX: no age limit. */
	a->before_ns = INT64_MAX;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 'o' && !(have_age = parse_age(optarg, a)))
			return adm_usage_error(verb, "altmove: bad --older-than "
					       "'%s'", optarg);
		if (c == 't' && (a->timeout = adm_parse_timeout(optarg)) == 0)
			return adm_usage_error(verb, "altmove: bad --timeout "
					       "'%s'", optarg);
		if (c == 'f')
			a->folder = optarg;
		else if (c == 'a')
			a->alt = optarg;
		else if (c != 'o' && c != 't')
			return adm_usage_error(verb, "altmove: unknown option "
					       "'%s'", argv[optind - 1]);
	}
	if (adm_check_npos(verb, argv + optind, argc - optind, 1,
			   "STORE") != 0)
		return ADM_EXIT_USAGE;
	if (!have_age && a->folder == NULL)
		return adm_usage_error(verb, "altmove: need --older-than=DAYS "
				       "and/or --folder=DIR");
	return 0;
}

static int altmove_main(int argc, char **argv)
{
	struct altmove_args a = { .timeout = ADM_MOUNT_TIMEOUT };
	struct here_or_mount v = { .verb = "altmove", .here = altmove_offline,
				   .mount = altmove_online, .ctx = &a };
	char *abs_alt = NULL;
	int ret;

	if ((ret = altmove_args(argc, argv, &a)) != 0)
		return ret;
	if (a.alt != NULL && a.alt[0] != '/') {
		if ((abs_alt = realpath(a.alt, NULL)) == NULL) {
			adm_error("--alt=%s: %s", a.alt, strerror(errno));
			return ADM_EXIT_USAGE;
		}
		a.alt = abs_alt;
	}
	if ((ret = adm_store_enter(argv[optind])) == 0) {
		a.store = v.store = argv[optind];
		ret = adm_here_or_mount(&v);
	}
	free(abs_alt);
	return ret;
}

const struct adm_verb adm_verb_altmove = {
	.name = "altmove",
	.summary = "move old messages to the alternate storage (mounted or not)",
	.usage =
	"usage: dboxadm altmove STORE [--older-than=DAYS] [--folder=DIR]\n"
	"                       [--alt=PATH] [--timeout=SECONDS]\n"
	"\n"
	"Move messages received more than DAYS days ago (and/or those with a name\n"
	"in folder DIR: \"INBOX\", \".Sent\", a nested \"a/b\") to new m.N files in\n"
	"the alternate storage ALT/" DBOX_STORE_STORAGE "/, as Dovecot's 'doveadm altmove' does\n"
	"for mdbox ALT=.  Each m.N's moved records are copied and synced, then\n"
	"its index rows switched in one transaction; a file left empty is\n"
	"removed, one left partly dead is purged afterwards.  Killed at any\n"
	"moment, nothing is lost or doubled: run it again.  Names, inodes,\n"
	"sizes and dates do not change.\n"
	"\n"
	"--alt=PATH sets the alternate storage and records it in the store\n"
	"(dboxfs -o alt= does the same); without it the recorded one is used.\n"
	"When STORE is mounted, the mount does the move (it must have been\n"
	"mounted with that ALT) and dboxadm waits up to --timeout seconds\n"
	"(default 600).\n"
	"\n"
	"Exit status: 0 moved, 1 some m.N could not be moved (named on stderr or\n"
	"in the mount's log), 2 usage error, store refused or no alternate\n"
	"storage.\n",
	.run = altmove_main,
};
