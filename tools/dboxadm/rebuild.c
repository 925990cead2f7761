/*
 * rebuild.c: dboxadm rebuild STORE [--restore-all] [--alt=PATH] - the
 * front end of the engine's rebuild (engine/rebuild.h says what it
 * does): options, the messages, exit codes.
 */
#include "dboxadm.h"
#include "progress.h"

#include "engine/rebuild.h"
#include "engine/store-layout.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void progress_cb(void *ctx, uint64_t record_bytes)
{
	progress_add(ctx, 1, record_bytes);
}

/* Why nothing was rebuilt (the store is as it was), on stderr. */
static void report_refusal(const char *store,
			   const struct dbox_rebuild_report *rep, int err)
{
	switch (rep->stage) {
	case DBOX_REBUILD_OPEN_STORE:
		adm_error("%s: %s", store, strerror(-err));
		break;
	case DBOX_REBUILD_NO_STORAGE:
		adm_error("%s: not a dbox store (no %s/): %s", store,
			  DBOX_STORE_STORAGE, strerror(-err));
		break;
	case DBOX_REBUILD_LOCK:
		/* The store lock said who holds it (engine/store-lock.c),
		   or why it could not be taken. */
		break;
	case DBOX_REBUILD_FILES:
		adm_error("%s/%s: %s; nothing was rebuilt", store,
			  DBOX_STORE_FILES, err == -ELOOP ?
			  "a symbolic link (refused)" : strerror(-err));
		break;
	case DBOX_REBUILD_ALT_UNKNOWN:
		adm_error("%s: the index to be replaced has %lu m.N in the "
			  "alternate storage but records no path for it; "
			  "nothing was rebuilt (give --alt=PATH, or their "
			  "messages are left out)", store, rep->alt_files);
		break;
	case DBOX_REBUILD_ALT_OPEN:
		adm_error("%s: alternate storage %s/%s: %s; nothing was "
			  "rebuilt (%lu m.N of the index to be replaced are "
			  "there; give --alt=PATH where it is now)",
			  store, rep->alt_path, DBOX_STORE_STORAGE,
			  err == -EPERM ?
			  "not owned by the store's owner, or reached through "
			  "another user's directory (refused)" :
			  strerror(-err), rep->alt_files);
		break;
	case DBOX_REBUILD_NEWER_INDEX:
		adm_error("%s: the index was made by a newer dboxfs (format "
			  "above %d); rebuild it with that version", store,
			  rep->index_format);
		break;
	default:
		break;
	}
}

/* What the rebuild did, on stdout. */
static void report_done(const char *store,
			const struct dbox_rebuild_report *rep)
{
	printf("%s: rebuilt from %lu m.N files: %lu messages kept with "
	       "their names (%lu names of the old tree kept: messages, "
	       "folders and files), %lu restored "
	       "with new names, "
	       "%lu duplicate records, %lu expunged records left for "
	       "purge; %lu plain files put in " DBOX_STORE_LOST_FOUND "/\n", store,
	       rep->mfiles, rep->kept, rep->names, rep->restored,
	       rep->duplicates, rep->expunged, rep->orphans);
	if (rep->unknown_restored > 0)
		printf("%s: recovered %lu messages the old index did "
		       "not know (past its end of their m.N: an index "
		       "older than " DBOX_STORE_STORAGE "/)\n", store, rep->unknown_restored);
	if (rep->import_left > 0)
		printf("%s: %lu records of an import killed before it "
		       "finished were not restored: they are not mail of "
		       "the store yet; run that import again to finish it "
		       "(a purge gives their bytes back)\n", store,
		       rep->import_left);
	else if (rep->import_killed)
		printf("%s: the old index says an import was killed before "
		       "it finished; run that import again to finish it\n",
		       store);
	if (rep->unplaced_restored > 0)
		printf("%s: %lu messages of the old index whose names could "
		       "not be kept (a folder no path reaches, a name no "
		       "directory can hold) restored with new names into "
		       "the cur/ of their folder\n", store,
		       rep->unplaced_restored);
	if (rep->damaged_kept > 0)
		printf("%s: %lu messages kept under their names with a "
		       "damaged record field (see the warnings; "
		       "'dboxadm check' names them)\n", store,
		       rep->damaged_kept);
	if (rep->old_damaged)
		printf("%s: the old index was damaged: names of "
		       "messages it no longer had are new\n", store);
	if (rep->lost_msgs > 0 || rep->lost_files > 0)
		printf("%s: lost: %lu messages of the old index have no "
		       "whole record in " DBOX_STORE_STORAGE "/, %lu plain files no "
		       DBOX_STORE_FILES "/<ino>\n", store, rep->lost_msgs,
		       rep->lost_files);
	if (rep->acked_empty > 0)
		printf("%s: %lu messages had been acknowledged empty by a "
		       "close while they were still being written when the "
		       "store was last used; their empty version has no "
		       "record, so each is back with its bytes before that "
		       "close, or lost when it was new (a mount before the "
		       "rebuild stores them empty)\n", store,
		       rep->acked_empty);
}

/* --alt=PATH (the one option with a value), taken out of argv before the
   flags are parsed; *alt_r gets it absolute (malloc()ed).  Returns 0 or
   ADM_EXIT_USAGE. */
static int take_alt(int *argc, char **argv, char **alt_r)
{
	for (int i = 1; i < *argc; i++) {
		if (strncmp(argv[i], "--alt=", 6) != 0)
			continue;
		free(*alt_r);
		*alt_r = argv[i][6] == '/' ? strdup(argv[i] + 6) :
			realpath(argv[i] + 6, NULL);
		if (*alt_r == NULL) {
			adm_error("%s: %s", argv[i], strerror(errno));
			return ADM_EXIT_USAGE;
		}
		memmove(&argv[i], &argv[i + 1], (*argc - i) * sizeof(*argv));
		(*argc)--;
		i--;
	}
	return 0;
}

static int rebuild_main(int argc, char **argv)
{
	static const char *const flags[] = { "--restore-all", NULL };
	struct dbox_rebuild_opts opts = { .progress = progress_cb };
	struct dbox_rebuild_report rep = { 0 };
	bool *flag_r[] = { &opts.restore_all };
	struct progress progress;
	char *alt = NULL;
	int npos, ret;

	if ((ret = take_alt(&argc, argv, &alt)) == 0 &&
	    (ret = adm_parse_args(&adm_verb_rebuild, argc, argv, flags, flag_r,
				  &npos)) == 0)
		ret = adm_check_npos(&adm_verb_rebuild, argv, npos, 1, "STORE");
	if (ret == 0)
		ret = adm_store_enter(argv[0]);
	if (ret != 0) {
		free(alt);
		return ret;
	}
	umask(077);
	opts.alt_path = alt;
	opts.progress_ctx = &progress;
	progress_init(&progress, "scanned");
	ret = dbox_rebuild(argv[0], &opts, &rep);
	progress_finish(&progress);
	free(alt);
	if (rep.old_index_earlier)
		fprintf(stderr, "dboxadm: no %s: names are read from the "
			"newest index an earlier rebuild kept, %s/%s (its "
			"names may be older than the mail)\n",
			DBOX_STORE_INDEX, argv[0], rep.old_index);
	else if (rep.old_index != NULL)
		fprintf(stderr, "dboxadm: the old index is kept as %s/%s\n",
			argv[0], rep.old_index);
	for (size_t i = 0; i < rep.nnotes; i++)
		adm_warning("%s", rep.notes[i].text);
	if (rep.stage == DBOX_REBUILD_DONE) {
		report_done(argv[0], &rep);
		ret = ADM_EXIT_OK;
	} else if (rep.stage == DBOX_REBUILD_RUN) {
		adm_error("%s: rebuild failed: %s; the store is left without "
			  "%s (run 'dboxadm rebuild' again)", argv[0],
			  strerror(-ret), DBOX_STORE_INDEX);
		ret = ret == -EPROTO ? ADM_EXIT_USAGE : ADM_EXIT_FAILED;
	} else {
		report_refusal(argv[0], &rep, ret);
		ret = rep.stage == DBOX_REBUILD_FILES ? ADM_EXIT_FAILED :
			ADM_EXIT_USAGE;
	}
	dbox_rebuild_report_free(&rep);
	return ret;
}

const struct adm_verb adm_verb_rebuild = {
	.name = "rebuild",
	.summary = "recreate the index from " DBOX_STORE_STORAGE "/m.N (not mounted)",
	.usage =
	"usage: dboxadm rebuild STORE [--restore-all] [--alt=PATH]\n"
	"\n"
	"Make a new " DBOX_STORE_INDEX " from the " DBOX_STORE_STORAGE "/m.N files alone, as Dovecot's\n"
	"force-resync does, keeping whatever the old index still knows.  The old\n"
	"index is moved aside as " DBOX_STORE_INDEX ".broken-<UTC time> and never\n"
	"deleted; nothing in " DBOX_STORE_STORAGE "/ is changed.\n"
	"\n"
	"Messages the old index can still name keep their names (and so their\n"
	"flags), folders, hard links, modes, mtimes and inode numbers; so do\n"
	"directories and plain files.  Messages it does not know are restored\n"
	"into the cur/ of the folder they were saved to (B metadata: INBOX ->\n"
	"the root, A/B -> .A.B), named <received>.G<GUID>.rebuild:2, with the\n"
	"received date as mtime - unless the old index was read whole and the\n"
	"record lies within the end it knew for its m.N, which means it was\n"
	"expunged and waits for purge (a record past that end is restored: the\n"
	"index was older than " DBOX_STORE_STORAGE "/) - or the old index says an import\n"
	"was killed before it finished: then a record it does not know is that\n"
	"import's uncommitted work, left for purge, which the import run again\n"
	"imports.  A message whose record has a damaged\n"
	"field where the old index had it keeps its names (reported).  Plain\n"
	"files in " DBOX_STORE_FILES "/ that no plain file of the index owns are put in\n"
	DBOX_STORE_LOST_FOUND "/.\n"
	"\n"
	"  --restore-all   restore unknown messages even when the old index is\n"
	"                  whole (brings back expunged mail not yet purged)\n"
	"  --alt=PATH      the alternate storage: its " DBOX_STORE_STORAGE "/m.N are scanned\n"
	"                  too (default: the one the old index recorded)\n"
	"\n"
	"The store must not be mounted.  Progress is shown when stderr is a\n"
	"terminal.  Exit status: 0 rebuilt, 1 failed (the store then has no\n"
	DBOX_STORE_INDEX "; run it again), 2 usage error or store refused.\n",
	.run = rebuild_main,
};
