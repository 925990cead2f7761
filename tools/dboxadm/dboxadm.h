#ifndef DBOXADM_H
#define DBOXADM_H

/*
 * dboxadm: the store administration command.  main.c parses the verb and
 * the common options (--help, --version) and calls one adm_<verb>()
 * function, each in its own file (import.c, export.c, stats.c, dump.c,
 * purge.c, altmove.c, import-dovecot.c, cat.c, check.c, rebuild.c,
 * backup.c).
 *
 * Exit codes, returned by every adm_<verb>():
 *   ADM_EXIT_OK      everything done
 *   ADM_EXIT_FAILED  some items failed (each reported on stderr)
 *   ADM_EXIT_USAGE   bad command line, or the store was refused (locked,
 *                    not a store, unreadable)
 * Every message goes to stderr as "dboxadm: ..."; stdout is for the
 * verb's output only (stats, dump).  --json output follows json.h.
 */

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

#define DBOXADM_VERSION "0.1"

enum {
	ADM_EXIT_OK = 0,
	ADM_EXIT_FAILED = 1,
	ADM_EXIT_USAGE = 2,
};

/* One verb.  run() gets argv[0] = the verb name and its own arguments
   (options not yet parsed; --help was handled by main). */
struct adm_verb {
	const char *name;
	const char *summary;                 /* one line for dboxadm --help */
	const char *usage;                   /* full text for VERB --help */
	int (*run)(int argc, char **argv);
};

extern const struct adm_verb adm_verb_import, adm_verb_export,
	adm_verb_stats, adm_verb_dump, adm_verb_purge,
	adm_verb_import_dovecot, adm_verb_cat, adm_verb_check,
	adm_verb_rebuild, adm_verb_altmove, adm_verb_backup;

/* Print "dboxadm: <message>\n" on stderr (after erasing a progress line).
   adm_warning prefixes "warning: ". */
void adm_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void adm_warning(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Report a bad command line for verb: the reason, then the verb's usage
   line, on stderr.  Returns ADM_EXIT_USAGE. */
int adm_usage_error(const struct adm_verb *verb, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Parse verb options with getopt_long: only the listed flags are known
   (each a NULL-terminated "--name" list entry; *flag_r[i] set to true when
   given).  Positional arguments are moved to argv[0..*npos_r).  Returns 0,
   or ADM_EXIT_USAGE after reporting an unknown option. */
int adm_parse_args(const struct adm_verb *verb, int argc, char **argv,
		   const char *const *flags, bool **flag_r, int *npos_r);

/* Check that a verb got exactly npos positional arguments (args: the
   got ones): ADM_EXIT_OK, or the usage error "VERB: unexpected argument
   'X'" for the first one too many, "VERB: need <need>" for too few
   (returns ADM_EXIT_USAGE). */
int adm_check_npos(const struct adm_verb *verb, char **args, int got,
		   int npos, const char *need);

/* The start of a verb on STORE (argv[0]): its options parsed as
   adm_parse_args does, exactly npos positional arguments (else the usage
   error of adm_check_npos), then adm_store_enter(argv[0]).  Returns
   ADM_EXIT_OK, or the exit code after reporting. */
int adm_verb_begin(const struct adm_verb *verb, int argc, char **argv,
		   const char *const *flags, bool **flag_r, int npos,
		   const char *need);

/* Write all len bytes of buf to fd (retrying short writes and EINTR).
   Returns 0 or a negative errno. */
int adm_write_full(int fd, const void *buf, size_t len);

/* A path being built while walking a tree, for messages and links. */
struct adm_path {
	char *buf;        /* NUL-terminated */
	size_t len, size;
};

/* Start the path at root (copied, trailing slashes dropped).  Returns 0
   or -ENOMEM. */
int adm_path_init(struct adm_path *path, const char *root);

/* Append "/name"; returns the previous length, for adm_path_pop().  On
   allocation failure the path stays as it was (messages then name the
   parent directory). */
size_t adm_path_push(struct adm_path *path, const char *name);

/* Cut the path back to len (a value adm_path_push returned). */
void adm_path_pop(struct adm_path *path, size_t len);

/* Free the buffer. */
void adm_path_free(struct adm_path *path);

/* Every verb calls this with its STORE before it opens anything in it.
   Run by root on a store owned by another uid (for a store not made yet:
   its parent directory's owner; decided by dbox_store_owner_find, as the
   mount decides it), dboxadm becomes that user for good, as
   Dovecot drops to mail_uid: the groups and gid of the owner's passwd
   entry (or the directory's gid, without supplementary groups, when
   there is none), then the uid.  Whatever it makes then belongs to the
   owner, and whatever the owner planted in the store (symbolic links,
   a hostile index) reaches only what the owner may reach anyway.  Run
   by anyone else, or on a store of root's (or no such directory, or not
   a directory: the verb reports it), nothing changes.  Returns
   ADM_EXIT_OK, or ADM_EXIT_USAGE after reporting why (unreadable, the
   switch failed, or the path was switched to another directory
   meanwhile). */
int adm_store_enter(const char *store);

/* Before root reads a source tree (import's MAILDIR, import-dovecot's
   DOVECOT_MDBOX_ROOT and ALT): the source must not be reached through a
   directory or symbolic link of a user other than the source's owner
   (dbox_path_foreign_owner), or that user could point root's reads at
   anything root may read (a root-only maildir, another user's mail).
   Run as anyone but root, or on a missing path (the verb reports it),
   nothing is checked.  what names the argument in the message.  *sb_r
   gets what path named when checked (st_ino 0: nothing checked), for
   adm_source_same once the verb opened it.  Returns ADM_EXIT_OK, or
   ADM_EXIT_USAGE after saying why. */
int adm_source_check(const char *path, const char *what, struct stat *sb_r);

/* Is fd, the source the verb opened by path, the directory
   adm_source_check judged (checked: its sb)?  Says so on stderr when not
   (a step of the way was switched meanwhile).  Returns true when it is
   or nothing was checked. */
bool adm_source_same(int fd, const char *path, const struct stat *checked);

/* Why err denied a path outside the store, for an error message: after
   adm_store_enter switched to the store's owner and err is EACCES or
   EPERM, " (dboxadm runs as uid N, who owns the store)" (or "the
   directory the new store is made in") in buf (size
   bytes), else "".  Returns buf. */
const char *adm_denied_why(int err, char *buf, size_t size);

/* Open STORE for reading (engine/view.h, dbox_view_open), reporting why
   not; an alternate storage that cannot be opened is reported too (its
   messages are unreadable) but is no failure.  Returns ADM_EXIT_OK and
   *view_r, or ADM_EXIT_USAGE. */
struct dbox_view;
int adm_open_view(const char *store, struct dbox_view **view_r);

#endif
