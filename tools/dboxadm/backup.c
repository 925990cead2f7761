/*
 * backup.c: dboxadm backup STORE DEST [--link-dest=PREV] [--json] - a
 * consistent copy of a store, mounted or not, that is itself a store
 * (engine/backup.h says how).  This file: the command line, the store's
 * owner (root on a user's store becomes that user first, so DEST must be
 * writable by them and is theirs), the progress line, the messages about
 * damage of the store, the summary and the exit status.
 */
#include "engine/backup.h"
#include "engine/store-layout.h"
#include "dboxadm.h"
#include "json.h"
#include "progress.h"

#include "storage/dbox-file.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct backup_cli {
	const char *store;
	struct progress progress;
};

/* Test hook: with DBOXADM_BACKUP_HOOK=DIR in the environment, stop at the
   named point: create DIR/<point>.reached, wait (at most a minute) for
   DIR/<point>.go.  Lets the mounted tests purge or kill at an exact step. */
static void hook(void *ctx, const char *point)
{
	const struct timespec tick = { 0, 10 * 1000 * 1000 };
	const char *dir = getenv("DBOXADM_BACKUP_HOOK");
	char *reached, *go;
	int fd;

	if (dir == NULL || asprintf(&reached, "%s/%s.reached", dir, point) < 0)
		return;
	if (asprintf(&go, "%s/%s.go", dir, point) < 0) {
		free(reached);
		return;
	}
	if ((fd = open(reached, O_WRONLY | O_CREAT | O_CLOEXEC, 0600)) >= 0)
		close(fd);
	for (int i = 0; i < 6000 && access(go, F_OK) < 0; i++)
		nanosleep(&tick, NULL);
	free(reached);
	free(go);
}

static void progress_cb(void *ctx, uint64_t files, uint64_t bytes)
{
	struct backup_cli *cli = ctx;

	progress_add(&cli->progress, files, bytes);
}

static void damage_cb(void *ctx, const struct dbox_backup_damage *d)
{
	const struct backup_cli *cli = ctx;
	const char *sub = d->kind == 'm' ? DBOX_STORE_STORAGE : DBOX_STORE_FILES;
	char name[32];

	if (d->kind == 'm')
		dbox_file_name(name, (uint32_t)d->id);
	else
		snprintf(name, sizeof(name), "%" PRIu64, d->id);
	switch (d->what) {
	case DBOX_BACKUP_MISSING:
		adm_warning("%s/%s/%s: in the index, but not a readable "
			    "regular file; not in the backup", cli->store, sub,
			    name);
		break;
	case DBOX_BACKUP_SHORT:
		adm_warning("%s/%s/%s: %" PRIu64 " bytes, shorter than its "
			    "committed end %" PRIu64 " (copied as it is; "
			    "'dboxadm check' names the messages lost)",
			    cli->store, sub, name, d->have, d->want);
		break;
	case DBOX_BACKUP_ENDED:
		adm_warning("%s/%s/%s: ended after %" PRIu64 " of %" PRIu64
			    " bytes while it was copied", cli->store, sub, name,
			    d->have, d->want);
		break;
	case DBOX_BACKUP_CHANGED:
		adm_warning("%s/%s/%s: changed while it was copied; the copy "
			    "may mix old and new bytes", cli->store, sub, name);
		break;
	case DBOX_BACKUP_INDEX_SHORT:
		adm_warning("%s/%s/%s: the index says its committed end is %"
			    PRIu64 " bytes, short of the records it names there"
			    " (%" PRIu64 "): a damaged index; copied up to its "
			    "records ('dboxadm check' says more)", cli->store,
			    sub, name, d->have, d->want);
		break;
	}
}

static void print_json(const char *store, const char *dest,
		       const struct dbox_backup_result *r, double secs)
{
	printf("{\"store\": ");
	adm_json_string(stdout, store);
	printf(", \"dest\": ");
	adm_json_string(stdout, dest);
	printf(", \"messages\": %" PRIu64 ", \"mfiles\": %zu, "
	       "\"plain_files\": %zu, \"files_copied\": %" PRIu64
	       ", \"files_linked\": %" PRIu64 ", \"files_kept\": %"
	       PRIu64 ", \"bytes_copied\": %" PRIu64
	       ", \"bytes_linked\": %" PRIu64 ", \"bytes_kept\": %"
	       PRIu64 ", \"snapshots\": %u, \"source_errors\": %u, "
	       "\"seconds\": %.3f}\n", r->messages, r->mfiles,
	       r->plain_files, r->copied, r->linked, r->kept,
	       r->bytes_copied, r->bytes_linked, r->bytes_kept,
	       r->snapshots, r->source_errors, secs);
}

static void print_text(const char *store, const char *dest, const char *prev,
		       const struct dbox_backup_result *r, double secs)
{
	printf("backed up %s to %s: %" PRIu64 " messages in %zu m.N files, "
	       "%zu plain files\n"
	       "copied   %" PRIu64 " files, %" PRIu64 " bytes\n"
	       "linked   %" PRIu64 " files, %" PRIu64 " bytes (from %s)\n",
	       store, dest, r->messages, r->mfiles, r->plain_files,
	       r->copied, r->bytes_copied, r->linked, r->bytes_linked,
	       prev == NULL ? "no --link-dest" :
	       r->prev_missing ? "none: no such backup" : prev);
	if (r->kept > 0)
		printf("kept     %" PRIu64 " files, %" PRIu64 " bytes (from the "
		       "interrupted run)\n", r->kept, r->bytes_kept);
	printf("seconds  %.3f\n", secs);
}

static double mono_secs(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Back up store (entered already) as set says, but for the callbacks. */
static int run_backup(const char *store, struct dbox_backup_settings *set,
		      bool json)
{
	struct backup_cli cli = { .store = store };
	struct dbox_backup_result res;
	struct dbox_view *view = NULL;
	double t0 = mono_secs();
	int ret;

	if ((ret = adm_open_view(store, &view)) != ADM_EXIT_OK)
		return ret;
	set->ctx = &cli;
	set->progress = progress_cb;
	set->damage = damage_cb;
	set->hook = hook;
	progress_init(&cli.progress, "backed up");
	cli.progress.unit = "files";
	ret = dbox_backup(view, set, &res);
	progress_finish(&cli.progress);
	dbox_view_close(&view);
	if (ret < 0)
		return res.refused ? ADM_EXIT_USAGE : ADM_EXIT_FAILED;
	if (json)
		print_json(cli.store, set->dest, &res, mono_secs() - t0);
	else
		print_text(cli.store, set->dest, set->prev, &res,
			   mono_secs() - t0);
	if (fflush(stdout) != 0)
		return ADM_EXIT_FAILED;
	return res.source_errors > 0 ? ADM_EXIT_FAILED : ADM_EXIT_OK;
}

static int backup_main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "link-dest", required_argument, NULL, 'l' },
		{ "json", no_argument, NULL, 'j' },
		{ 0 },
	};
	struct dbox_backup_settings set = { 0 };
	char hint[200];
	bool json = false, root = geteuid() == 0;
	size_t len;
	int c, ret;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'l':
			set.prev = optarg;
			break;
		case 'j':
			json = true;
			break;
		default:
			return adm_usage_error(&adm_verb_backup, "backup: unknown "
					       "option or missing value '%s'",
					       argv[optind - 1]);
		}
	}
	if ((ret = adm_check_npos(&adm_verb_backup, argv + optind,
				  argc - optind, 2, "STORE and DEST")) != 0)
		return ret;
	/* As the store's owner (root on a user's store drops to them for
	   good): everything read is what they may read, DEST is theirs. */
	if ((ret = adm_store_enter(argv[optind])) != ADM_EXIT_OK)
		return ret;
	if (root && geteuid() != 0) {
		snprintf(hint, sizeof(hint), "(dboxadm backs up another user's "
			 "store as that user, uid %u, the store's owner: DEST "
			 "must be in a directory that user may write)",
			 (unsigned)geteuid());
		set.denied_hint = hint;
	}
	len = strlen(argv[optind + 1]);
	while (len > 1 && argv[optind + 1][len - 1] == '/')
		argv[optind + 1][--len] = '\0';
	set.dest = argv[optind + 1];
	return run_backup(argv[optind], &set, json);
}

const struct adm_verb adm_verb_backup = {
	.name = "backup",
	.summary = "a consistent, incremental copy of a store (mounted or not)",
	.usage =
	"usage: dboxadm backup STORE DEST [--link-dest=PREV] [--json]\n"
	"\n"
	"Copy STORE to the new directory DEST as it was at one instant: the\n"
	"index with SQLite's online backup, each " DBOX_STORE_STORAGE "/m.N up to its\n"
	"committed end, the plain files of " DBOX_STORE_FILES "/.  Works while STORE is\n"
	"mounted and written to, and beside a purge; takes no lock.  DEST is a\n"
	"self-contained store (m.N of the alternate storage are copied into\n"
	"DEST/" DBOX_STORE_STORAGE "/): mount it, or copy it back, to restore.  Run by root on\n"
	"a user's store, it runs as that user: DEST must be writable by them.\n"
	"DEST's directory must be yours or root's, and no one else's to write in\n"
	"(a sticky one, /tmp, is fine).\n"
	"\n"
	"The work is done in DEST.partial, renamed to DEST at the end; an\n"
	"interrupted backup is completed by running the same command again.\n"
	"\n"
	"  --link-dest=PREV  hard-link files unchanged since the backup PREV\n"
	"                    (on the same filesystem) instead of copying them\n"
	"  --json            print the summary as one JSON object\n"
	"\n"
	"Exit status: 0 done, 1 the backup failed (DEST.partial is left) or the\n"
	"store has damaged files (the backup holds them as they are), 2 usage\n"
	"error or store refused.\n",
	.run = backup_main,
};
