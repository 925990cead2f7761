#ifndef DBOXADM_DOVEADM_RUN_H
#define DBOXADM_DOVEADM_RUN_H

/*
 * doveadm-run: Dovecot's own view of an mdbox root, read by running
 * `doveadm -c CONF -f tab ...` in direct mode (no Dovecot server) with a
 * temporary dovecot.conf: the root as the only namespace, '/' as the
 * separator, doveadm's privileges = the owner of the root (doveadm drops
 * to them when run as root), and Dovecot's zlib plugin, so compressed
 * mail is read as Dovecot wrote it.  For import-dovecot.c.
 */

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct doveadm_run {
	const char *doveadm;     /* the program ("doveadm": found in PATH) */
	char *location;          /* mail_location (the caller's) */
	uid_t owner_uid;         /* mail_uid/mail_gid: the root's owner */
	gid_t owner_gid;
	bool zlib;               /* load Dovecot's zlib plugin */
	bool zlib_missing;       /* doveadm said it cannot load that plugin */
	unsigned int errors;     /* Error/Fatal/Panic lines of its last run */
	char tmpdir[64];         /* a mkdtemp() template, then the directory
				    (ours: it holds the config) */
	bool tmpdir_made;
	char home[80];           /* tmpdir/home: doveadm's home, base_dir and
				    state_dir (the owner's when run as root) */
	char *conf;              /* tmpdir/dovecot.conf, owned */
};

/* Write (again: after zlib changed) the temporary dovecot.conf, making
   tmpdir and tmpdir/home the first time.  Run as root, doveadm reads
   the config as root and then works as the owner of the mdbox root, so
   only home is given to the owner: tmpdir and the config stay root's,
   or the owner could put a config of their own in its place (mail_uid
   of another user) for root's doveadm.  Returns 0 or a negative errno. */
int doveadm_config_write(struct doveadm_run *d);

/* Remove the config, what doveadm left in home (never following a
   symbolic link: home is the owner's), home and tmpdir; free conf. */
void doveadm_config_remove(struct doveadm_run *d);

/* Called for every line of doveadm's output after the header, with the
   fields in the order the caller named them.  Returns 0, or a negative
   errno to stop (the rest of the output is read and dropped). */
typedef int doveadm_line_cb_t(void *ctx, char **fields, size_t nfields);

/* Run `doveadm -c CONF -f tab ARGS...` (args: NULL-terminated, at most
   10) and call cb(ctx, ...) for every line after the header, with the
   fields in the order of names (nnames <= 16; columns found by the
   header).  doveadm's stderr is passed on to ours (and zlib_missing set
   when it says the zlib plugin cannot be loaded).  Returns 0, -EPROTO
   when a column is missing, -EIO when doveadm failed - a non-zero exit,
   or errors logged and no line listed with exit 0, as doveadm does when
   it cannot lock an index (both reported; errors with lines listed are
   only warned about: Dovecot logs damage it repairs as errors) -, a
   negative errno from cb, or one of starting doveadm. */
int doveadm_run(struct doveadm_run *d, const char *const *args,
		const char *const *names, size_t nnames,
		doveadm_line_cb_t *cb, void *ctx);

#endif
