/*
 * main.c: the dboxadm command line: global options, the verb table,
 * per-verb --help, the log sink (stderr, "dboxadm: ...") and the helpers
 * shared by the verbs (argument parsing, error messages, opening an index
 * without the store lock).
 *
 *   dboxadm [--help | --version]
 *   dboxadm VERB [--help] ARGS...
 */
#include "dboxadm.h"
#include "engine/store-dirs.h"
#include "engine/store-layout.h"
#include "progress.h"

#include "engine/view.h"
#include "storage/log.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct adm_verb *const verbs[] = {
	&adm_verb_import, &adm_verb_export, &adm_verb_stats, &adm_verb_dump,
	&adm_verb_purge, &adm_verb_altmove, &adm_verb_import_dovecot,
	&adm_verb_cat,
	&adm_verb_check, &adm_verb_rebuild,
	&adm_verb_backup,
};
#define N_VERBS (sizeof(verbs) / sizeof(verbs[0]))

static void usage(FILE *out)
{
	fprintf(out,
		"usage: dboxadm VERB [--help] ARGS...\n"
		"       dboxadm --help | --version\n"
		"\n"
		"Administer a dboxfs store (a Dovecot multi-dbox store with a SQLite\n"
		"index).  Verbs:\n");
	for (size_t i = 0; i < N_VERBS; i++)
		fprintf(out, "  %-15s %s\n", verbs[i]->name, verbs[i]->summary);
	fprintf(out,
		"\n"
		"'dboxadm VERB --help' describes a verb.  Exit status: 0 done, 1 some\n"
		"items failed (each reported), 2 usage error or store refused.\n");
}

/* One line on stderr, escaped (dbox_log_escape): messages carry names
   and bytes from the store. */
static void vmessage(const char *prefix, const char *fmt, va_list args)
{
	char *text = NULL, *escaped = NULL;
	int len = vasprintf(&text, fmt, args);

	progress_clear();
	if (len >= 0)
		escaped = malloc(DBOX_LOG_ESCAPED_SIZE((size_t)len));
	if (escaped != NULL)
		dbox_log_escape(escaped, DBOX_LOG_ESCAPED_SIZE((size_t)len), text);
	fprintf(stderr, "dboxadm: %s%s\n", prefix,
		escaped != NULL ? escaped : "(out of memory formatting a message)");
	free(escaped);
	free(text);
}

void adm_error(const char *fmt, ...)
{
	va_list args;

	va_start(args, fmt);
	vmessage("", fmt, args);
	va_end(args);
}

void adm_warning(const char *fmt, ...)
{
	va_list args;

	va_start(args, fmt);
	vmessage("warning: ", fmt, args);
	va_end(args);
}

int adm_usage_error(const struct adm_verb *verb, const char *fmt, ...)
{
	const char *nl;
	va_list args;

	va_start(args, fmt);
	vmessage("", fmt, args);
	va_end(args);
	/* The first line of the verb's usage is its synopsis. */
	nl = strchr(verb->usage, '\n');
	fprintf(stderr, "%.*s\n(dboxadm %s --help for more)\n",
		nl != NULL ? (int)(nl - verb->usage) : (int)strlen(verb->usage),
		verb->usage, verb->name);
	return ADM_EXIT_USAGE;
}

int adm_parse_args(const struct adm_verb *verb, int argc, char **argv,
		   const char *const *flags, bool **flag_r, int *npos_r)
{
	struct option opts[8];
	int nflags = 0, c, npos = 0;

	while (flags != NULL && flags[nflags] != NULL && nflags < 7) {
		opts[nflags] = (struct option){ flags[nflags] + 2, no_argument,
						NULL, 'A' + nflags };
		nflags++;
	}
	opts[nflags] = (struct option){ 0 };
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c >= 'A' && c < 'A' + nflags) {
			*flag_r[c - 'A'] = true;
			continue;
		}
		return adm_usage_error(verb, "%s: unknown option '%s'",
				       verb->name, argv[optind - 1]);
	}
	for (int i = optind; i < argc; i++)
		argv[npos++] = argv[i];
	*npos_r = npos;
	return ADM_EXIT_OK;
}

int adm_open_view(const char *store, struct dbox_view **view_r)
{
	int ret = dbox_view_open(store, view_r);

	if (ret == -ENOMEDIUM)
		adm_error("%s: not a dbox store (no " DBOX_STORE_INDEX ")", store);
	else if (ret == -ENOTDIR)
		adm_error("%s: not a directory", store);
	else if (ret == -ENOENT || ret == -EACCES || ret == -ENOMEM)
		adm_error("%s: %s", store, strerror(-ret));
	else if (ret == -EIO)
		adm_error("%s: cannot open the index: %s; run 'dboxadm rebuild "
			  "%s' (it recreates the index from " DBOX_STORE_STORAGE
			  "/)", store, strerror(-ret), store);
	else if (ret < 0)
		adm_error("%s: cannot open the index: %s", store, strerror(-ret));
	if (ret == 0 && (*view_r)->alt_err < 0)
		adm_error("%s: alternate storage %s/storage: %s; the messages "
			  "in it are unreadable", store, (*view_r)->alt_path,
			  dbox_view_alt_why((*view_r)->alt_err));
	return ret < 0 ? ADM_EXIT_USAGE : ADM_EXIT_OK;
}

/* The uid adm_store_enter switched to, for adm_denied_why; -1: none.
   switched_for_new: the store did not exist; its parent's owner's. */
static uid_t switched_uid = (uid_t)-1;
static bool switched_for_new;

const char *adm_denied_why(int err, char *buf, size_t size)
{
	if (switched_uid != (uid_t)-1 && (err == EACCES || err == EPERM))
		snprintf(buf, size, " (dboxadm runs as uid %u, who owns %s)",
			 (unsigned)switched_uid, switched_for_new ?
			 "the directory the new store is made in" :
			 "the store");
	else if (size > 0)
		buf[0] = '\0';
	return buf;
}

/* Give up root for good and become uid: the groups and gid of its
   passwd entry (gid alone, no supplementary groups, without one).
   Returns 0 or -errno. */
static int drop_to(uid_t uid, gid_t gid)
{
	struct passwd *pw = getpwuid(uid);

	if (pw != NULL)
		gid = pw->pw_gid;
	else if (gid == (gid_t)-1)
		return -ENOENT; /* no group known for uid */
	if ((pw != NULL ? initgroups(pw->pw_name, gid) :
	     setgroups(0, NULL)) < 0 ||
	    setgid(gid) < 0 || setuid(uid) < 0)
		return -errno;
	/* For good: no way back to root (setuid() from root sets all three
	   uids; this checks it did). */
	if (setuid(0) == 0 || geteuid() != uid || getuid() != uid ||
	    getegid() != gid)
		return -EPERM;
	switched_uid = uid;
	return 0;
}

int adm_source_check(const char *path, const char *what, struct stat *sb_r)
{
	uid_t way = 0;
	int ret;

	memset(sb_r, 0, sizeof(*sb_r));
	if (geteuid() != 0 || stat(path, sb_r) < 0) {
		sb_r->st_ino = 0;
		return ADM_EXIT_OK;
	}
	/* Strict: a step gone since the stat refuses (a lax walk skips
	   it, and a link that vanished meanwhile passed: helper-93). */
	if ((ret = dbox_path_way_owner(path, sb_r->st_uid, sb_r, &way)) < 0) {
		adm_error("%s %s: %s while dboxadm looked at it; nothing was "
			  "done", what, path, ret == -ENOENT ? "went away" :
			  ret == -ESTALE ? "changed" : strerror(-ret));
		return ADM_EXIT_USAGE;
	}
	if (way == 0)
		return ADM_EXIT_OK;
	adm_error("%s %s: owned by uid %u but reached through a symbolic "
		  "link or directory of uid %u; refusing it (name it by its "
		  "own path, or run dboxadm as that user)", what, path,
		  (unsigned)sb_r->st_uid, (unsigned)way);
	return ADM_EXIT_USAGE;
}

bool adm_source_same(int fd, const char *path, const struct stat *checked)
{
	struct stat sb;

	if (checked->st_ino == 0)
		return true;
	if (fstat(fd, &sb) == 0 && sb.st_dev == checked->st_dev &&
	    sb.st_ino == checked->st_ino)
		return true;
	adm_error("%s: changed while dboxadm looked at it; nothing was "
		  "done", path);
	return false;
}

int adm_store_enter(const char *store)
{
	struct dbox_store_owner o;
	int ret;

	if (geteuid() != 0)
		return ADM_EXIT_OK;
	/* Root acts on nothing it could not tell the owner of: a path that
	   is missing, not a directory or switched while it was looked at
	   would be opened again by name, as root. */
	switch ((ret = dbox_store_owner_find(store, &o))) {
	case 0:
		break;
	case -ESTALE:
		adm_error("%s: changed while dboxadm looked at it; nothing "
			  "was done", o.what);
		dbox_store_owner_free(&o);
		return ADM_EXIT_USAGE;
	case -EPERM:
		if (o.shared_dir && o.new_store) {
			/* check or stats of a mistyped name too (helper-90:
			   it read as a refusal of a store that exists). */
			adm_error("%s: %s, and root makes no store in a "
				  "directory other users may write to (one of "
				  "them could put a link to another store at "
				  "its name first); use a directory only root "
				  "writes to", store, strerror(ENOENT));
			dbox_store_owner_free(&o);
			return ADM_EXIT_USAGE;
		}
		if (o.shared_dir) {
			adm_error("%s: in a directory other users may write "
				  "to, one of them could put a link to another "
				  "store at its name before root opens it; use "
				  "a directory only root writes to", store);
			dbox_store_owner_free(&o);
			return ADM_EXIT_USAGE;
		}
		/* A link of one user's to another user's store. */
		adm_error("%s: owned by uid %u but reached through a symbolic "
			  "link or directory of uid %u; refusing it (name the "
			  "store by its own path)", o.what, (unsigned)o.uid,
			  (unsigned)o.way);
		dbox_store_owner_free(&o);
		return ADM_EXIT_USAGE;
	default:
		adm_error("%s: %s", o.what != NULL ? o.what : store,
			  strerror(-ret));
		dbox_store_owner_free(&o);
		return ret == -ENOMEM ? ADM_EXIT_FAILED : ADM_EXIT_USAGE;
	}
	if (o.uid == 0) {
		dbox_store_owner_free(&o);
		return ADM_EXIT_OK;
	}
	switched_for_new = o.new_store;
	if ((ret = drop_to(o.uid, o.gid)) < 0) {
		adm_error("%s: owned by uid %u: cannot switch to that user "
			  "(%s); nothing was done", o.what, (unsigned)o.uid,
			  strerror(-ret));
		dbox_store_owner_free(&o);
		return ADM_EXIT_USAGE;
	}
	/* The path must still name the directory the decision was made on
	   (now resolved with the owner's rights). */
	if ((ret = dbox_store_owner_still(&o)) == -ESTALE)
		adm_error("%s: changed while dboxadm switched to its owner "
			  "(uid %u); nothing was done", o.what, (unsigned)o.uid);
	else if (ret < 0)
		adm_error("%s: %s (dboxadm runs as uid %u, who owns the "
			  "store or the way to it); nothing was done", o.what,
			  strerror(-ret), (unsigned)o.uid);
	dbox_store_owner_free(&o);
	return ret < 0 ? ADM_EXIT_USAGE : ADM_EXIT_OK;
}

int adm_path_init(struct adm_path *path, const char *root)
{
	path->len = strlen(root);
	path->size = path->len + 1;
	if ((path->buf = strdup(root)) == NULL)
		return -ENOMEM;
	while (path->len > 1 && path->buf[path->len - 1] == '/')
		path->buf[--path->len] = '\0';
	return 0;
}

size_t adm_path_push(struct adm_path *path, const char *name)
{
	size_t old = path->len, len = strlen(name);

	if (old + len + 2 > path->size) {
		size_t size = (old + len + 2) * 2;
		char *p = realloc(path->buf, size);

		if (p == NULL)
			return old;
		path->buf = p;
		path->size = size;
	}
	path->buf[old] = '/';
	memcpy(path->buf + old + 1, name, len + 1);
	path->len = old + 1 + len;
	return old;
}

void adm_path_pop(struct adm_path *path, size_t len)
{
	path->len = len;
	path->buf[len] = '\0';
}

void adm_path_free(struct adm_path *path)
{
	free(path->buf);
	path->buf = NULL;
}

int adm_check_npos(const struct adm_verb *verb, char **args, int got,
		   int npos, const char *need)
{
	if (got > npos)
		return adm_usage_error(verb, "%s: unexpected argument '%s'",
				       verb->name, args[npos]);
	if (got < npos)
		return adm_usage_error(verb, "%s: need %s", verb->name, need);
	return ADM_EXIT_OK;
}

int adm_verb_begin(const struct adm_verb *verb, int argc, char **argv,
		   const char *const *flags, bool **flag_r, int npos,
		   const char *need)
{
	int got, ret;

	if ((ret = adm_parse_args(verb, argc, argv, flags, flag_r, &got)) != 0)
		return ret;
	if ((ret = adm_check_npos(verb, argv, got, npos, need)) != 0)
		return ret;
	return adm_store_enter(argv[0]);
}

int adm_write_full(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len > 0) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Log sink for storage/ and index/: the same "dboxadm: " form. */
static void log_sink(enum dbox_log_level level, const char *fmt, va_list args)
{
	if (level == DBOX_LOG_DEBUG && getenv("DBOXADM_DEBUG") == NULL)
		return;
	vmessage(level == DBOX_LOG_WARNING ? "warning: " : "", fmt, args);
}

static bool is_help(const char *arg)
{
	return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0;
}

int main(int argc, char *argv[])
{
	const struct adm_verb *verb = NULL;

	dbox_log_set_sink(log_sink);
	if (argc < 2) {
		usage(stderr);
		return ADM_EXIT_USAGE;
	}
	if (is_help(argv[1])) {
		usage(stdout);
		return ADM_EXIT_OK;
	}
	if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0) {
		printf("dboxadm %s (index format %d)\n", DBOXADM_VERSION,
		       DBOX_INDEX_FORMAT);
		return ADM_EXIT_OK;
	}
	for (size_t i = 0; i < N_VERBS; i++)
		if (strcmp(argv[1], verbs[i]->name) == 0)
			verb = verbs[i];
	if (verb == NULL) {
		adm_error("unknown verb '%s'", argv[1]);
		usage(stderr);
		return ADM_EXIT_USAGE;
	}
	for (int i = 2; i < argc && strcmp(argv[i], "--") != 0; i++) {
		if (is_help(argv[i])) {
			fputs(verb->usage, stdout);
			return ADM_EXIT_OK;
		}
	}
	return verb->run(argc - 1, argv + 1);
}
