/*
 * import.c: dboxadm import STORE MAILDIR - the front end of the maildir
 * import (engine/import.h says what becomes of each file): arguments,
 * the checks before the store is touched, signals, progress, and the
 * report of what happened to single items.
 *
 * SIGINT/SIGTERM/SIGHUP stop the import cleanly: what was imported so
 * far is committed.
 */
#include "dboxadm.h"
#include "progress.h"

#include "engine/import.h"
#include "engine/store-layout.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The front end's side of one import (dbox_import_ops.ctx). */
struct import_ui {
	struct progress progress;
	const char *store;
};

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
	interrupted = sig;
}

static bool import_stopped(void *ctx)
{
	return interrupted != 0;
}

static void import_progress(void *ctx, unsigned int messages, uint64_t bytes)
{
	progress_add(&((struct import_ui *)ctx)->progress, messages, bytes);
}

static const char *type_name(mode_t mode)
{
	return S_ISLNK(mode) ? "symbolic link" : S_ISFIFO(mode) ? "fifo" :
		S_ISSOCK(mode) ? "socket" : S_ISCHR(mode) ? "character device" :
		S_ISBLK(mode) ? "block device" : "special file";
}

/* What the engine says about one item, in dboxadm's words. */
static void import_note(void *ctx, const struct dbox_import_note *n)
{
	const char *store = ((struct import_ui *)ctx)->store;
	char why[80];

	switch (n->kind) {
	case DBOX_IMPORT_FAILED:
		adm_error("%s: %s%s%s%s", n->path, n->what,
			  *n->what != '\0' ? ": " : "", strerror(n->err),
			  adm_denied_why(n->err, why, sizeof(why)));
		break;
	case DBOX_IMPORT_DIFFERENT:
		adm_error("%s: exists in the store with different content; "
			  "not imported", n->path);
		break;
	case DBOX_IMPORT_OTHER_KIND:
		adm_error("%s: exists in the store as something else; not "
			  "imported", n->path);
		break;
	case DBOX_IMPORT_SKIPPED:
		adm_warning("%s: %s skipped", n->path, type_name(n->mode));
		break;
	case DBOX_IMPORT_IS_STORE:
		adm_warning("%s: is the store itself; skipped", n->path);
		break;
	case DBOX_IMPORT_LINKS_LOST:
		adm_warning("%s: out of memory: its other hard links are "
			    "imported as copies", n->path);
		break;
	case DBOX_IMPORT_TIME_LOST:
		adm_warning("%s: out of memory: its mtime is not restored",
			    n->path);
		break;
	case DBOX_IMPORT_INDEX:
		adm_error("%s: %s: index error (%s); stopping the import, the "
			  "last batch is rolled back", n->path, n->what,
			  strerror(n->err));
		break;
	case DBOX_IMPORT_SYNC:
		adm_error("%s/" DBOX_STORE_STORAGE ": sync before commit: %s",
			  store, strerror(n->err));
		break;
	case DBOX_IMPORT_DIR_TIMES:
		adm_error("%s: restoring directory times: %s", store,
			  strerror(n->err));
		break;
	}
}

/* Is path the store directory or below it? */
static bool inside_store(const char *path, const char *store)
{
	char *p = realpath(path, NULL), *s = realpath(store, NULL);
	size_t len = s != NULL ? strlen(s) : 0;
	bool inside = p != NULL && s != NULL && strncmp(p, s, len) == 0 &&
		(p[len] == '\0' || p[len] == '/' || strcmp(s, "/") == 0);

	free(p);
	free(s);
	return inside;
}

/* Take --compress=SPEC (or --compress SPEC) out of argv, before the flag
   parser sees it, into set (compress, compress_given).  Returns 0 or
   ADM_EXIT_USAGE. */
static int take_compress(int *argc, char **argv,
			 struct dbox_store_settings *set)
{
	int i = 1;

	while (i < *argc && strcmp(argv[i], "--") != 0) {
		const char *spec = NULL;
		int taken = 1;

		if (strncmp(argv[i], "--compress=", 11) == 0) {
			spec = argv[i] + 11;
		} else if (strcmp(argv[i], "--compress") == 0) {
			if (i + 1 >= *argc)
				return adm_usage_error(&adm_verb_import,
					"import: --compress needs a value");
			spec = argv[i + 1];
			taken = 2;
		}
		if (spec == NULL) {
			i++;
			continue;
		}
		set->compress_given = true;
		if (dbox_compress_parse(spec, &set->compress) < 0)
			return adm_usage_error(&adm_verb_import,
				"import: --compress=%s: want none, gz or "
				"gz:LEVEL (1-9)", spec);
		memmove(argv + i, argv + i + taken,
			(size_t)(*argc - i - taken + 1) * sizeof(*argv));
		*argc -= taken;
	}
	return ADM_EXIT_OK;
}

/* The summary lines after the import. */
static void import_summary(const struct dbox_import_counts *c, int ret,
			   const char *store)
{
	if (interrupted)
		adm_error("interrupted: %lu messages imported and committed; "
			  "the rest was not imported (run the same import "
			  "again to finish it)", c->messages);
	if (ret == -ENOMEM)
		adm_error("out of memory");
	if (c->skipped > 0)
		adm_warning("%lu items skipped (see above)", c->skipped);
	if (c->present > 0)
		fprintf(stderr, "dboxadm: %lu items already present in the "
			"store with the same bytes, skipped\n", c->present);
	if (c->renamed > 0)
		fprintf(stderr, "dboxadm: %lu of them are messages the store "
			"has under their unique name with other flags (renamed "
			"since the last import), not imported again\n",
			c->renamed);
	if (c->failed > 0)
		adm_error("%lu items failed", c->failed);
	/* Always, on stdout like the other verbs' summaries (stderr is for
	   problems); progress only on a terminal. */
	printf("%s: %lu messages, %lu plain files, ", store, c->messages,
	       c->files);
	if (c->others > 0)
		printf("%lu symbolic links and special files, ", c->others);
	printf("%lu directories, %lu hard links imported\n", c->dirs_made,
	       c->linked);
}

/* Open the source directory (the one adm_source_check judged as
   checked) and the store, the source checked first.  Returns ADM_EXIT_OK with *srcfd_r and *st_r, or ADM_EXIT_USAGE after
   saying why. */
static int import_open(const char *store, const char *src,
		       const struct stat *checked, int *srcfd_r,
		       const struct dbox_store_settings *set,
		       struct dbox_store **st_r)
{
	char why[80];
	int srcfd = open(src, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (srcfd < 0) {
		adm_error("%s: %s%s", src, strerror(errno),
			  adm_denied_why(errno, why, sizeof(why)));
		return ADM_EXIT_USAGE;
	}
	if (!adm_source_same(srcfd, src, checked)) {
		close(srcfd);
		return ADM_EXIT_USAGE;
	}
	if (!dbox_import_is_maildir(srcfd)) {
		adm_error("%s: not a maildir: no cur/, new/ or tmp/ directory in "
			  "it or below; nothing imported", src);
		close(srcfd);
		return ADM_EXIT_USAGE;
	}
	umask(077);
	if (dbox_store_open(store, set, st_r) < 0) {
		/* The store logged why (locked, not a store, ...). */
		close(srcfd);
		return ADM_EXIT_USAGE;
	}
	if (inside_store(src, store)) {
		adm_error("%s: is inside the store %s; refusing to import it",
			  src, store);
		close(srcfd);
		dbox_store_close(st_r);
		return ADM_EXIT_USAGE;
	}
	*srcfd_r = srcfd;
	return ADM_EXIT_OK;
}

static int import_main(int argc, char **argv)
{
	struct dbox_store_settings set = { .create = true };
	struct sigaction sa = { .sa_handler = on_signal,
				.sa_flags = SA_RESTART };
	struct dbox_import_counts counts;
	struct import_ui ui = { .store = NULL };
	struct dbox_import_ops ops = {
		.note = import_note, .progress = import_progress,
		.stop = import_stopped,
	};
	struct dbox_store *st = NULL;
	struct stat src_sb;
	int npos, srcfd, ret;

	if ((ret = take_compress(&argc, argv, &set)) != 0 ||
	    (ret = adm_parse_args(&adm_verb_import, argc, argv, NULL, NULL,
				  &npos)) != 0)
		return ret;
	if ((ret = adm_check_npos(&adm_verb_import, argv, npos, 2,
				  "STORE and MAILDIR")) != 0)
		return ret;
	if ((ret = adm_source_check(argv[1], "MAILDIR", &src_sb)) != 0 ||
	    (ret = adm_store_enter(argv[0])) != 0 ||
	    (ret = import_open(argv[0], argv[1], &src_sb, &srcfd, &set,
			       &st)) != 0)
		return ret;

	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	progress_init(&ui.progress, "imported");
	ui.store = argv[0];
	ops.ctx = &ui;

	ret = dbox_import_maildir(st, srcfd, argv[1], geteuid() == 0, &ops,
				  &counts);

	progress_finish(&ui.progress);
	import_summary(&counts, ret, argv[0]);
	close(srcfd);
	dbox_store_close(&st);
	return ret < 0 || counts.failed > 0 || interrupted ? ADM_EXIT_FAILED :
		ADM_EXIT_OK;
}

const struct adm_verb adm_verb_import = {
	.name = "import",
	.summary = "copy a Maildir++ tree into a store (not mounted)",
	.usage =
	"usage: dboxadm import [--compress=gz[:LEVEL]] STORE MAILDIR\n"
	"\n"
	"Copy the Maildir++ tree MAILDIR into the store STORE, created when it\n"
	"does not exist, without mounting it (refused while it is mounted).\n"
	"\n"
	"  --compress=gz[:LEVEL]  store each message body gzip-compressed, as\n"
	"      Dovecot's zlib plugin does (LEVEL 1-9, default 6); 'none' (the\n"
	"      default) stores them plain.  Sizes and mtimes stay the plaintext's.\n"
	"\n"
	"  files in cur/ new/ tmp/ (not dot-files)  become messages in " DBOX_STORE_STORAGE "/m.N,\n"
	"      keeping name, size, mtime (also the received date) and mode\n"
	"  other regular files (dovecot-uidlist, .mbsyncstate, maildirfolder, ...)\n"
	"      become plain files in STORE/" DBOX_STORE_FILES "/\n"
	"  directories keep their names, modes and mtimes (the root's too, when\n"
	"      the store is empty); hard links stay links\n"
	"  symbolic links (targets as they are, never followed), fifos and\n"
	"      sockets are kept as such, anywhere; devices too as root (else\n"
	"      skipped with a warning)\n"
	"\n"
	"MAILDIR must hold a cur/, new/ or tmp/ directory somewhere, else it is\n"
	"refused (exit 2) before the store is touched.  A name that already\n"
	"exists in the store with the same bytes (an import run again, or\n"
	"resumed after an interruption) is skipped and counted in one summary\n"
	"line; with other bytes, or as a directory, it fails and is not\n"
	"imported.  Exit status: 0 all imported or already present, 1 some\n"
	"items failed, 2 usage error, not a maildir, or store refused.\n"
	"Progress is shown when stderr is a terminal.\n",
	.run = import_main,
};
