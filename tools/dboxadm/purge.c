/*
 * purge.c: dboxadm purge STORE [--timeout=SECONDS] - give back the bytes
 * of expunged and overwritten messages (engine/purge.h) - and dboxadm
 * altmove (altmove.c):
 *
 *   not mounted  the store is opened (lock, recovery) and purged here;
 *   mounted      the mount is asked to purge: once the process named by
 *                STORE/lock is proven to be the dboxfs serving this store
 *                (engine/store-holder.h), SIGUSR1 is sent and the index
 *                (read without the lock) is polled until it records a
 *                requested purge that started after the signal, or the
 *                timeout passes (the purge then goes on in the daemon).
 *
 * STORE/lock is opened relative to the store directory, once, with
 * O_NOFOLLOW (dbox_store_lock_try): a lock that is a symbolic link (to
 * some daemon's locked pid file, say) is refused, never followed.
 *
 * Prints what was removed and moved on stdout, the same lines either way
 * (the mount records the outcome of a requested purge in the index).
 * Exit status: 0 purged, 1 some m.N could not be purged (or the mount
 * went away, or did not finish in time), 2 usage error or store refused.
 */
#include "engine/purge.h"
#include "engine/store-layout.h"
#include "engine/store.h"
#include "engine/view.h"
#include "dboxadm.h"
#include "mount-ask.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

static void print_result(const struct dbox_purge_result *res)
{
	printf("files removed       %llu (%llu bytes)\n"
	       "records moved       %llu (%llu bytes)\n"
	       "bytes given back    %lld\n",
	       (unsigned long long)(res->files_purged + res->garbage_files),
	       (unsigned long long)res->bytes_freed,
	       (unsigned long long)res->records_moved,
	       (unsigned long long)res->bytes_moved,
	       (long long)res->bytes_freed - (long long)res->bytes_moved);
	if (res->files_busy > 0)
		printf("files being written %llu (left for the next purge)\n",
		       (unsigned long long)res->files_busy);
}

struct purge_args {
	const char *store;
	unsigned long timeout;
};

static int purge_offline(void *ctx)
{
	const char *store = ((const struct purge_args *)ctx)->store;
	struct dbox_store_settings set = { .create = false };
	struct dbox_purge_settings ps = { .threshold = 0, .quiet = true,
					  .check_rows = true };
	struct dbox_purge_result res;
	struct dbox_store *st = NULL;
	int ret;

	if ((ret = dbox_store_open(store, &set, &st)) < 0)
		return ret; /* logged */
	ret = dbox_purge(st, &ps, &res);
	if (dbox_purge_record(st, &res, true) < 0)
		adm_warning("%s: purge not recorded in the index", store);
	dbox_store_close(&st);
	print_result(&res);
	if (ret < 0 && res.files_failed > 0)
		adm_error("%s: %llu files could not be purged (see above)",
			  store, (unsigned long long)res.files_failed);
	else if (ret < 0)
		adm_error("%s: nothing purged (%s; see above)", store,
			  strerror(-ret));
	return ret < 0 ? 1 : 0;
}

struct purge_poll {
	const struct purge_args *a;
	struct dbox_view *view;
	int64_t t0;
	struct dbox_purge_result res;
};

static int purge_poll(void *ctx)
{
	struct purge_poll *pp = ctx;

	return dbox_purge_request_done(pp->view, pp->t0, &pp->res);
}

static int purge_ask(void *ctx, struct dbox_view *view,
		     const struct dbox_holder *h)
{
	struct purge_poll *pp = ctx;
	struct mount_wait w = { pp->a->store, "the purge", "purging",
				pp->a->timeout, purge_poll, pp };

	pp->view = view;
	pp->t0 = dbox_now_ns();
	return adm_ask_mount(h, pp->t0, &w);
}

static int purge_online(void *ctx, int lock_fd)
{
	const struct purge_args *a = ctx;
	struct purge_poll pp = { .a = a };
	pid_t pid = 0;
	int ret = adm_mount_request(a->store, lock_fd, purge_ask, &pp, &pid);

	if (ret != 0)
		return ret;
	printf("purged by the mount (pid %d)\n", (int)pid);
	print_result(&pp.res);
	if (pp.res.error != 0 && pp.res.files_failed > 0) {
		adm_error("%s: the mount's purge failed (%s): %llu files could "
			  "not be purged; the mount's log (syslog) names them",
			  a->store, strerror(-pp.res.error),
			  (unsigned long long)pp.res.files_failed);
		return ADM_EXIT_FAILED;
	}
	if (pp.res.error != 0) {
		adm_error("%s: the mount's purge failed (%s); the mount's log "
			  "(syslog) says why", a->store,
			  strerror(-pp.res.error));
		return ADM_EXIT_FAILED;
	}
	return ADM_EXIT_OK;
}

static int purge_main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "timeout", required_argument, NULL, 't' },
		{ 0 },
	};
	struct purge_args a = { .timeout = ADM_MOUNT_TIMEOUT };
	struct here_or_mount v = { .verb = "purge", .here = purge_offline,
				   .mount = purge_online, .ctx = &a };
	int c, ret;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c != 't')
			return adm_usage_error(&adm_verb_purge,
					       "purge: unknown option '%s'",
					       argv[optind - 1]);
		if ((a.timeout = adm_parse_timeout(optarg)) == 0)
			return adm_usage_error(&adm_verb_purge,
					       "purge: bad --timeout '%s'",
					       optarg);
	}
	if ((ret = adm_check_npos(&adm_verb_purge, argv + optind,
				  argc - optind, 1, "STORE")) != 0)
		return ret;
	if ((ret = adm_store_enter(argv[optind])) != 0)
		return ret;
	a.store = v.store = argv[optind];
	return adm_here_or_mount(&v);
}

const struct adm_verb adm_verb_purge = {
	.name = "purge",
	.summary = "give back the space of expunged messages (mounted or not)",
	.usage =
	"usage: dboxadm purge STORE [--timeout=SECONDS]\n"
	"\n"
	"Copy the live messages of every " DBOX_STORE_STORAGE "/m.N that holds expunged or\n"
	"overwritten ones to new m.N files, switch the index to the copies in\n"
	"one transaction per file, and delete the old file.  Names, inode\n"
	"numbers, sizes and dates of messages do not change; files open on the\n"
	"mount go on reading the same bytes.\n"
	"\n"
	"When STORE is mounted, the mount does the purge (dboxadm signals it and\n"
	"waits up to --timeout seconds, default 600, for it to finish); else it\n"
	"is done here.  A mount also purges a full m.N by itself once its dead\n"
	"share passes -o purge_threshold (see dboxfs --help).\n"
	"\n"
	"Exit status: 0 purged, 1 some m.N could not be purged (each is named\n"
	"on stderr, or in the mount's log), the mount went away or did not finish\n"
	"within --timeout, 2 usage error or store refused.\n",
	.run = purge_main,
};

