/*
 * import-dovecot.c: dboxadm import-dovecot STORE DOVECOT_MDBOX_ROOT - the
 * front end of adopting a Dovecot mdbox store in place
 * (engine/import-dovecot.h says what is made and how it stays crash
 * safe): options, running `doveadm` for Dovecot's view of the mailboxes
 * (direct mode: no Dovecot server; a temporary dovecot.conf with
 * mail_location=mdbox:ROOT), handing each line to the engine, and the
 * report.  Dovecot reads its own map and mailbox indexes - base files
 * plus transaction logs - the only place these facts are kept;
 * docs/dovecot.md says why this beats parsing those files here.
 */
#include "dboxadm.h"
#include "doveadm-run.h"
#include "dovecot-names.h"
#include "progress.h"

#include "engine/import-dovecot.h"
#include "engine/store-dirs.h"
#include "engine/store-layout.h"
#include "engine/view.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FETCH_FIELDS "uid guid flags refcount date.received.unixtime " \
	"size.physical size.virtual mailbox"

struct imp {
	struct dbox_store *st;
	struct dbox_adopt *adopt;
	struct doveadm_run run;  /* Dovecot's view of the root */
	const char *root;
	struct stat root_sb;     /* root as adm_source_check judged it */
	struct stat dalt_sb;     /* dalt as adm_source_check judged it */
	int storage_dfd;         /* ROOT/storage */
	int alt_dfd;             /* Dovecot's ALT/storage, or -1 */
	const char *dalt;        /* Dovecot's ALT root (--dovecot-alt) */
	bool fatal;              /* a fatal error was reported */
	bool refused;            /* the root was refused as a whole before
				    anything changed (adopted already) */
	struct progress progress;
};

/* --- what the engine says ----------------------------------------------- */

/* Errors about one m.N file of the Dovecot root (or the store). */
static bool note_file(struct imp *imp, const struct dbox_adopt_note *n)
{
	const char *msg = strerror(n->err);

	switch (n->kind) {
	case DBOX_ADOPT_MFILE_UNREADABLE:
		adm_error("%s/" DBOX_STORE_STORAGE "/m.%u: %s", n->root,
			  n->file, msg);
		return true;
	case DBOX_ADOPT_ADOPTED_ALREADY:
		adm_error("%s/" DBOX_STORE_STORAGE "/m.%u is %s/"
			  DBOX_STORE_STORAGE "/m.%u already: an earlier "
			  "import-dovecot adopted this root into the store; "
			  "nothing done", n->root, n->file, n->where,
			  (unsigned)n->count);
		imp->fatal = true;
		imp->refused = true;
		return true;
	case DBOX_ADOPT_NO_ALT:
		adm_error("%s/" DBOX_STORE_STORAGE "/m.%u: in Dovecot's "
			  "alternate storage, and the store has none: give "
			  "--alt=PATH", n->root, n->file);
		return true;
	case DBOX_ADOPT_LINK_FAILED:
		adm_error("%s/" DBOX_STORE_STORAGE "/m.%u: cannot link it into "
			  "%s/" DBOX_STORE_STORAGE ": %s%s", n->root, n->file,
			  n->where, msg, n->err == EXDEV ? " (the store must "
			  "be on the same filesystem as the Dovecot root: "
			  "adopting moves no bytes)" : "");
		return true;
	case DBOX_ADOPT_NOT_WRITABLE:
		adm_error("%s/" DBOX_STORE_STORAGE "/m.%u: %s (run as root or "
			  "as the owner of the Dovecot files)", n->root, n->file,
			  msg);
		return true;
	case DBOX_ADOPT_RENAME_FAILED:
		adm_error("%s/" DBOX_STORE_STORAGE "/%s: rename to m.%u: %s "
			  "(run import-dovecot again to finish)", n->where,
			  n->name, n->file, msg);
		return true;
	case DBOX_ADOPT_NOT_OURS:
		adm_warning("%s/" DBOX_STORE_STORAGE "/m.%u: belongs to uid %u, "
			    "not to the store's owner (uid %u): adopted, but its "
			    "owner can rewrite the store's mail through their "
			    "own name of it; to prevent that, import into a "
			    "store of that user's, or copy the Dovecot root "
			    "first", n->root, n->file, n->owner,
			    (unsigned)geteuid());
		return true;
	case DBOX_ADOPT_CORRUPT:
		adm_warning("%s/" DBOX_STORE_STORAGE "/m.%u: corrupt record at "
			    "%llu; messages after it cannot be found (run "
			    "'doveadm force-resync' first)", n->root, n->file,
			    (unsigned long long)n->offset);
		return true;
	case DBOX_ADOPT_FINISHED:
		adm_warning("%s/" DBOX_STORE_STORAGE "/m.%u: finished the "
			    "adoption an earlier run began", n->where, n->file);
		return true;
	default:
		return false;
	}
}

/* Errors about one mailbox or message. */
static bool note_mail(struct imp *imp, const struct dbox_adopt_note *n)
{
	switch (n->kind) {
	case DBOX_ADOPT_BAD_MAILBOX:
		adm_error("mailbox '%s': no Maildir++ name for it (%s); its "
			  "messages are not adopted", n->mailbox,
			  strerror(n->err));
		return true;
	case DBOX_ADOPT_FOLDER_FAILED:
		adm_error("mailbox '%s' -> %s: %s", n->mailbox, n->name,
			  strerror(n->err));
		return true;
	case DBOX_ADOPT_NOT_LISTED:
		adm_error("mailbox '%s' uid %lu: mailbox not listed by doveadm "
			  "mailbox status", n->mailbox, n->uid);
		return true;
	case DBOX_ADOPT_NOT_FOUND:
		adm_error("mailbox '%s' uid %lu: message %s (%llu bytes) not "
			  "found in %s/" DBOX_STORE_STORAGE "%s", n->mailbox,
			  n->uid, n->guid, (unsigned long long)n->size, n->root,
			  imp->dalt != NULL ? " nor in the alternate storage" :
			  " (alternate storage: --dovecot-alt=PATH)");
		return true;
	case DBOX_ADOPT_EXTERNAL:
		adm_error("mailbox '%s' uid %lu: stored with external "
			  "attachments (mail_attachment_dir), which dboxfs "
			  "cannot read; not adopted", n->mailbox, n->uid);
		return true;
	case DBOX_ADOPT_EXISTS:
		adm_error("mailbox '%s' uid %lu: %s exists already", n->mailbox,
			  n->uid, n->name);
		return true;
	default:
		return false;
	}
}

/* Warnings about folders and messages, and the fatal stop. */
static void note_other(struct imp *imp, const struct dbox_adopt_note *n)
{
	switch (n->kind) {
	case DBOX_ADOPT_HAS_UIDLIST:
		adm_warning("%s: has a dovecot-uidlist already; not written",
			    n->name);
		break;
	case DBOX_ADOPT_HAS_KEYWORDS:
		adm_warning("mailbox '%s': has a dovecot-keywords file already; "
			    "keyword letters follow the new order and it is not "
			    "rewritten", n->mailbox);
		break;
	case DBOX_ADOPT_KEYWORDS_FULL:
		adm_warning("mailbox '%s': more than %d keywords; maildir names "
			    "cannot carry '%s' and later ones", n->mailbox,
			    DBOX_ADOPT_MAX_KEYWORDS, n->name);
		break;
	case DBOX_ADOPT_REFCOUNT:
		adm_warning("message %s: Dovecot counts %u references, %u found "
			    "in the mailboxes listed", n->guid, n->count,
			    n->found);
		break;
	default: /* DBOX_ADOPT_FATAL */
		adm_error("%s: %s", n->name, strerror(n->err));
		imp->fatal = true;
		break;
	}
}

static void adopt_note_cb(void *ctx, const struct dbox_adopt_note *n)
{
	if (!note_file(ctx, n) && !note_mail(ctx, n))
		note_other(ctx, n);
}

static void adopt_progress_cb(void *ctx, uint64_t bytes)
{
	progress_add(&((struct imp *)ctx)->progress, 1, bytes);
}

/* --- doveadm's lines to the engine --------------------------------------- */

/* `doveadm mailbox status`: one folder per mailbox. */
static int status_cb(void *ctx, char **f, size_t n)
{
	struct imp *imp = ctx;

	return dbox_adopt_mailbox(imp->adopt, f[0],
				  (uint32_t)strtoul(f[1], NULL, 10),
				  (uint32_t)strtoul(f[2], NULL, 10), f[3]);
}

struct letters_ctx {
	struct imp *imp;
	const char *mailbox;
	const struct dovecot_flags *flags;
};

static char keyword_letter(void *ctx, const char *kw)
{
	struct letters_ctx *l = ctx;

	return dbox_adopt_keyword_letter(l->imp->adopt, l->mailbox, kw);
}

static void letters_cb(void *ctx, char buf[32])
{
	struct letters_ctx *l = ctx;

	dovecot_flags_letters(l->flags, keyword_letter, l, buf);
}

/* `doveadm fetch`: one message in one mailbox. */
static int fetch_cb(void *ctx, char **f, size_t n)
{
	struct imp *imp = ctx;
	struct dovecot_flags flags;
	struct letters_ctx l = { .imp = imp, .mailbox = f[7], .flags = &flags };
	struct dbox_adopt_msg m = {
		.mailbox = f[7], .uid = strtoul(f[0], NULL, 10), .guid = f[1],
		.size = strtoull(f[5], NULL, 10),
		.vsize = strtoull(f[6], NULL, 10),
		.received = strtoll(f[4], NULL, 10),
		.refcount = (unsigned int)strtoul(f[3], NULL, 10),
		.letters = letters_cb, .letters_ctx = &l,
	};
	int ret;

	if ((ret = dovecot_flags_parse(f[2], &flags)) < 0)
		return ret;
	m.to_new = flags.recent && !flags.seen && !flags.answered &&
		!flags.flagged && !flags.deleted && !flags.draft &&
		flags.nkeywords == 0;
	ret = dbox_adopt_message(imp->adopt, &m);
	dovecot_flags_free(&flags);
	return ret;
}

static int run(struct imp *imp)
{
	static const char *const status_args[] = {
		"mailbox", "status", "uidvalidity uidnext guid", "*", NULL };
	static const char *const status_cols[] = {
		"mailbox", "uidvalidity", "uidnext", "guid" };
	static const char *const fetch_args[] = {
		"fetch", FETCH_FIELDS, "mailbox", "*", "all", NULL };
	static const char *const fetch_cols[] = {
		"uid", "guid", "flags", "refcount", "date.received.unixtime",
		"size.physical", "size.virtual", "mailbox" };
	const struct dbox_adopt_ops ops = {
		.note = adopt_note_cb, .progress = adopt_progress_cb, .ctx = imp,
	};
	const struct dbox_adopt_source src = {
		.root = imp->root, .storage_fd = imp->storage_dfd,
		.alt = imp->dalt, .alt_fd = imp->alt_dfd,
	};
	int ret;

	if ((ret = dbox_adopt_begin(imp->st, &src, &ops, &imp->adopt)) < 0)
		return ret;
	ret = doveadm_run(&imp->run, status_args, status_cols, 4, status_cb,
			  imp);
	if (ret == -EIO && imp->run.zlib && imp->run.zlib_missing &&
	    dbox_adopt_counts(imp->adopt)->folders == 0) {
		adm_warning("retrying without Dovecot's zlib plugin; "
			    "compressed mail may not be adopted");
		imp->run.zlib = false;
		if ((ret = doveadm_config_write(&imp->run)) == 0)
			ret = doveadm_run(&imp->run, status_args, status_cols,
					  4, status_cb, imp);
	}
	if (ret == 0 && !imp->fatal)
		ret = doveadm_run(&imp->run, fetch_args, fetch_cols, 8,
				  fetch_cb, imp);
	if (ret < 0 || imp->fatal)
		return ret < 0 ? ret : -EIO;
	return dbox_adopt_commit(imp->adopt);
}

/* The options into imp and set.  Returns ADM_EXIT_OK (and *npos_r, the
   index of STORE in argv) or ADM_EXIT_USAGE after saying why. */
static int parse_options(int argc, char **argv, struct imp *imp,
			 const char **location_r, struct dbox_store_settings *set)
{
	static const struct option opts[] = {
		{ "doveadm", required_argument, NULL, 'd' },
		{ "mail-location", required_argument, NULL, 'l' },
		{ "dovecot-alt", required_argument, NULL, 'D' },
		{ "alt", required_argument, NULL, 'a' },
		{ 0 },
	};
	int c;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 'd')
			imp->run.doveadm = optarg;
		else if (c == 'l')
			*location_r = optarg;
		else if (c == 'D')
			imp->dalt = optarg;
		else if (c == 'a')
			set->alt_path = optarg;
		else
			return adm_usage_error(&adm_verb_import_dovecot,
					       "import-dovecot: unknown option "
					       "'%s'", argv[optind - 1]);
	}
	if (adm_check_npos(&adm_verb_import_dovecot, argv + optind,
			   argc - optind, 2, "STORE and DOVECOT_MDBOX_ROOT") != 0)
		return ADM_EXIT_USAGE;
	return ADM_EXIT_OK;
}

/* Can s go as it is into the one-run dovecot.conf doveadm reads?  Its
   config parser (Dovecot 2.3, config-parser.c) reads a value to the end
   of the line, cuts it at '#', takes quotes, '\\', '$' and '{' '}' as
   syntax and '<' as an include, so a newline in a path a user named
   would add settings of the user's choosing (mail_uid: doveadm reading
   as another user).  mail_location splits at ':' (ROOT:ALT=...:INDEX=...)
   and expands '%': a path, unlike root's own --mail-location, may hold
   neither, nor a space.  Returns the first byte that cannot go, or 0. */
static int conf_unsafe(const char *s, bool path)
{
	for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
		if (*p < 0x20 || *p == 0x7f || strchr("#\"'\\${}<", *p) != NULL ||
		    (path && strchr(":% ", *p) != NULL))
			return *p;
	}
	return 0;
}

/* Dovecot's ALT/storage/ (dalt_real is the real path of imp->dalt):
   ALT the directory adm_source_check judged, storage/ in it never
   through a symbolic link.  Returns the fd, -ESTALE when ALT changed
   meanwhile (said), or -errno. */
static int open_dalt_storage(struct imp *imp, const char *dalt_real)
{
	int dfd = open(dalt_real, O_RDONLY | O_DIRECTORY | O_CLOEXEC), sfd;

	if (dfd < 0)
		return -errno;
	if (!adm_source_same(dfd, imp->dalt, &imp->dalt_sb)) {
		close(dfd);
		return -ESTALE;
	}
	sfd = dbox_storage_dir_open(dfd);
	close(dfd);
	return sfd;
}

/* The Dovecot root, opened once as the directory adm_source_check judged:
   its owner (doveadm's mail_uid), its storage/ (never through a symbolic
   link: the owner could point it at another user's files, which root
   would link into the store), and its real path for the mail_location,
   checked to name that directory.  Returns the real path (malloc()ed)
   with imp->storage_dfd and the owner set, or NULL after saying why. */
static char *open_root(struct imp *imp)
{
	int dfd = open(imp->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	char *real = NULL;
	struct stat sb, named;

	if (dfd < 0) {
		adm_error("%s: %s", imp->root, strerror(errno));
		return NULL;
	}
	if (!adm_source_same(dfd, imp->root, &imp->root_sb) ||
	    fstat(dfd, &sb) < 0) {
		close(dfd);
		return NULL;
	}
	imp->run.owner_uid = sb.st_uid;
	imp->run.owner_gid = sb.st_gid;
	imp->storage_dfd = dbox_storage_dir_open(dfd);
	if (imp->storage_dfd < 0)
		adm_error("%s/" DBOX_STORE_STORAGE ": %s (not a Dovecot mdbox "
			  "root?)", imp->root, strerror(-imp->storage_dfd));
	else if ((real = realpath(imp->root, NULL)) == NULL ||
		 stat(real, &named) < 0 || named.st_dev != sb.st_dev ||
		 named.st_ino != sb.st_ino) {
		adm_error("%s: changed while dboxadm looked at it; nothing was "
			  "done", imp->root);
		free(real);
		real = NULL;
	}
	close(dfd);
	return real;
}

/* The Dovecot root and its ALT: their owner, Dovecot's storage/ and
   ALT/storage/ opened, the mail_location.  Returns ADM_EXIT_OK or
   ADM_EXIT_USAGE (ADM_EXIT_FAILED out of memory) after saying why. */
static int open_source(struct imp *imp, const char *location,
		       const char *alt_path)
{
	char *root_real = open_root(imp), *dalt_real = NULL;
	const char *bad;
	int ret = ADM_EXIT_USAGE;

	if (root_real == NULL)
		goto out;
	if (imp->dalt != NULL &&
	    ((dalt_real = realpath(imp->dalt, NULL)) == NULL ||
	     (imp->alt_dfd = open_dalt_storage(imp, dalt_real)) < 0)) {
		if (imp->alt_dfd != -ESTALE)
			adm_error("%s/" DBOX_STORE_STORAGE ": %s (not Dovecot's "
				  "ALT= root?)", imp->dalt, dalt_real == NULL ?
				  strerror(errno) : strerror(-imp->alt_dfd));
		goto out;
	}
	if (alt_path != NULL && alt_path[0] != '/') {
		adm_error("--alt=%s: the store's alternate storage must be an "
			  "absolute path", alt_path);
		goto out;
	}
	bad = location != NULL ?
		(conf_unsafe(location, false) != 0 ? location : NULL) :
		conf_unsafe(root_real, true) != 0 ? root_real :
		dalt_real != NULL && conf_unsafe(dalt_real, true) != 0 ?
		dalt_real : NULL;
	if (bad != NULL) {
		adm_error("%s: holds a character doveadm's configuration "
			  "cannot carry as it is (a control character, space, "
			  "':', '%%', '#', a quote, '\\', '$', '{', '}' or "
			  "'<'); rename the directory (or give a plain "
			  "--mail-location); nothing was imported", bad);
		ret = ADM_EXIT_USAGE;
		goto out;
	}
	ret = location != NULL ? asprintf(&imp->run.location, "%s", location) :
		dalt_real != NULL ?
		asprintf(&imp->run.location, "mdbox:%s:ALT=%s", root_real, dalt_real) :
		asprintf(&imp->run.location, "mdbox:%s", root_real);
	ret = ret < 0 ? ADM_EXIT_FAILED : ADM_EXIT_OK;
out:
	free(root_real);
	free(dalt_real);
	return ret;
}

/* The root's owner is one Dovecot reads mail as.  Returns ADM_EXIT_OK or
   ADM_EXIT_USAGE after saying why. */
static int check_owner(const struct imp *imp)
{
	if (imp->run.owner_uid == 0) {
		/* doveadm runs as mail_uid = the root's owner, and Dovecot
		   never opens mail as root ("Mail access not allowed for
		   root"): refuse before anything is made. */
		adm_error("%s: owned by root (uid 0); doveadm reads the mdbox "
			  "as the owner of the root and Dovecot refuses mail "
			  "access as root, so nothing was imported or created. "
			  "Give the root to the user Dovecot used for it, e.g. "
			  "'chown -R mail:mail %s' (or its real owner), and run "
			  "import-dovecot again", imp->root, imp->root);
		return ADM_EXIT_USAGE;
	}
	return ADM_EXIT_OK;
}

static void imp_free(struct imp *imp)
{
	dbox_adopt_free(&imp->adopt);
	dbox_store_close(&imp->st);
	free(imp->run.location);
	if (imp->storage_dfd >= 0)
		close(imp->storage_dfd);
	if (imp->alt_dfd >= 0)
		close(imp->alt_dfd);
}

/* Open (or create) the store; *store_new_r: it had no index before. */
static int open_store(struct imp *imp, const char *store,
		      const struct dbox_store_settings *set, bool *dir_made_r,
		      bool *store_new_r)
{
	const struct dbox_adopt_ops ops = { .note = adopt_note_cb, .ctx = imp };
	char *index_path = NULL;

	umask(077);
	*dir_made_r = access(store, F_OK) < 0 && errno == ENOENT;
	if (asprintf(&index_path, "%s/" DBOX_STORE_INDEX, store) < 0)
		return ADM_EXIT_FAILED;
	*store_new_r = access(index_path, F_OK) < 0 && errno == ENOENT;
	free(index_path);
	if (dbox_store_open(store, set, &imp->st) < 0)
		return ADM_EXIT_USAGE; /* the store said why */
	dbox_adopt_finish_staged(imp->st, &ops);
	return ADM_EXIT_OK;
}

/* Run the adoption with a doveadm config of its own; the report. */
static int adopt_and_report(struct imp *imp)
{
	const struct dbox_adopt_counts *c;
	int ret;

	strcpy(imp->run.tmpdir, "/tmp/dboxadm-dovecot.XXXXXX");
	signal(SIGPIPE, SIG_IGN);
	progress_init(&imp->progress, "adopted");
	ret = doveadm_config_write(&imp->run);
	if (ret < 0)
		adm_error("writing a doveadm config in /tmp: %s", strerror(-ret));
	else
		ret = run(imp);
	progress_finish(&imp->progress);
	doveadm_config_remove(&imp->run);
	if (ret < 0 && !imp->fatal && ret != -EIO && ret != -EPROTO)
		adm_error("%s: %s", imp->root, strerror(-ret));
	if (imp->adopt == NULL)
		return ret;
	c = dbox_adopt_counts(imp->adopt);
	if (ret == 0)
		printf("adopted %lu messages (%lu more names for copies) in %zu "
		       "folders from %zu m.N files, without copying them\n",
		       c->messages, c->links, c->folders, c->files);
	if (c->failed > 0) {
		adm_error("%lu messages or folders failed (see above)",
			  c->failed);
		if (ret == 0)
			ret = -EIO;
	}
	return ret;
}

static int import_dovecot_main(int argc, char **argv)
{
	struct dbox_store_settings set = { .create = true };
	struct imp imp = { .run = { .doveadm = "doveadm", .zlib = true },
			   .storage_dfd = -1, .alt_dfd = -1 };
	const char *location = NULL, *store;
	bool store_new, dir_made, committed;
	int ret;

	if ((ret = parse_options(argc, argv, &imp, &location, &set)) != 0)
		return ret;
	store = argv[optind];
	imp.root = argv[optind + 1];
	if ((ret = adm_source_check(imp.root, "DOVECOT_MDBOX_ROOT",
				    &imp.root_sb)) != 0 ||
	    (imp.dalt != NULL &&
	     (ret = adm_source_check(imp.dalt, "--dovecot-alt",
				     &imp.dalt_sb)) != 0) ||
	    (ret = adm_store_enter(store)) != 0 ||
	    (ret = open_source(&imp, location, set.alt_path)) != 0 ||
	    (ret = check_owner(&imp)) != 0 ||
	    (ret = open_store(&imp, store, &set, &dir_made, &store_new)) != 0) {
		imp_free(&imp);
		return ret;
	}
	ret = adopt_and_report(&imp);
	committed = imp.adopt != NULL && dbox_adopt_committed(imp.adopt);
	imp_free(&imp);
	if (ret < 0 && !committed && store_new) {
		dbox_adopt_remove_store(store, dir_made);
		adm_error("%s: removed the store this run had created (nothing "
			  "was adopted)", store);
	}
	if (ret < 0)
		return imp.refused && !committed ? ADM_EXIT_USAGE
						 : ADM_EXIT_FAILED;
	return ADM_EXIT_OK;
}

const struct adm_verb adm_verb_import_dovecot = {
	.name = "import-dovecot",
	.summary = "adopt a Dovecot mdbox store in place (no bytes copied)",
	.usage =
	"usage: dboxadm import-dovecot STORE DOVECOT_MDBOX_ROOT\n"
	"         [--doveadm=PATH] [--mail-location=LOCATION]\n"
	"         [--dovecot-alt=PATH --alt=PATH]\n"
	"\n"
	"Adopt the Dovecot mdbox store at DOVECOT_MDBOX_ROOT (what Dovecot's\n"
	"mail_location = mdbox:DOVECOT_MDBOX_ROOT points at) into STORE, created\n"
	"when missing, without copying message bytes: its " DBOX_STORE_STORAGE "/m.N files are\n"
	"hard-linked into STORE/storage (same filesystem needed), and Dovecot's\n"
	"mailboxes, UIDs, flags, keywords and received dates - as `doveadm`\n"
	"reports them - become the Maildir++ tree of the mount.  Messages\n"
	"expunged but not purged are left out; a message in several mailboxes\n"
	"becomes one inode with several names.  Stop Dovecot for this root\n"
	"first, and do not use the root with Dovecot afterwards (its m.N files\n"
	"are shared with STORE until you delete the root).\n"
	"\n"
	"  --doveadm=PATH           the doveadm to run (default: doveadm in PATH)\n"
	"  --mail-location=LOC      Dovecot's mail_location, when it has more than\n"
	"                           the root (e.g. mdbox:/r:INDEX=/i)\n"
	"  --dovecot-alt=PATH       Dovecot's alternate storage (mail_location's\n"
	"                           ALT=PATH): its " DBOX_STORE_STORAGE "/m.N are adopted too,\n"
	"                           hard-linked into the store's alternate storage\n"
	"  --alt=PATH               the store's alternate storage (recorded in the\n"
	"                           store; on the filesystem of --dovecot-alt)\n",
	.run = import_dovecot_main,
};
