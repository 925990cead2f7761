/*
 * doveadm-run.c: running Dovecot's `doveadm` for import-dovecot
 * (doveadm-run.h): its temporary dovecot.conf, the child process, its
 * tab output split into fields (dovecot-names.h), its stderr passed on.
 * Touches no store.
 */
#include "doveadm-run.h"
#include "dboxadm.h"
#include "dovecot-names.h"

#include "storage/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* The temporary dovecot.conf doveadm runs with: the root as its only
   namespace, '/' as separator, doveadm's privileges = the owner of the
   root (doveadm drops to them when run as root), and the zlib plugin, so
   that compressed mail is read as Dovecot wrote it (without it Dovecot
   takes a compressed body for a broken one and drops cached sizes). */
int doveadm_config_write(struct doveadm_run *d)
{
	FILE *f;

	if (!d->tmpdir_made) {
		if (mkdtemp(d->tmpdir) == NULL)
			return -errno;
		d->tmpdir_made = true;
		snprintf(d->home, sizeof(d->home), "%s/home", d->tmpdir);
		/* The owner goes through tmpdir to home, and reads the
		   config only as root. */
		if (chmod(d->tmpdir, 0711) < 0 || mkdir(d->home, 0700) < 0)
			return -errno;
		/* doveadm chdirs to its home as the owner. */
		if (geteuid() == 0 &&
		    chown(d->home, d->owner_uid, d->owner_gid) < 0)
			return -errno;
	}
	if (d->conf == NULL &&
	    asprintf(&d->conf, "%s/dovecot.conf", d->tmpdir) < 0) {
		d->conf = NULL;
		return -ENOMEM;
	}
	if ((f = fopen(d->conf, "w")) == NULL)
		return -errno;
	fprintf(f,
		"# written by dboxadm import-dovecot for one run\n"
		"mail_location = %s\n"
		"base_dir = %s\n"
		"state_dir = %s\n"
		"log_path = /dev/stderr\n"
		/* No stats-writer socket: doveadm (root until it drops to
		   mail_uid) would connect to one in base_dir, which is the
		   owner's. */
		"stats_writer_socket_path =\n"
		"protocols =\n"
		"ssl = no\n"
		"mail_uid = %u\n"
		"mail_gid = %u\n"
		"first_valid_uid = %u\n"
		"first_valid_gid = %u\n"
		"%s"
		"namespace inbox {\n"
		"  inbox = yes\n"
		"  separator = /\n"
		"}\n",
		d->location, d->home, d->home,
		(unsigned)d->owner_uid, (unsigned)d->owner_gid,
		(unsigned)d->owner_uid, (unsigned)d->owner_gid,
		d->zlib ? "mail_plugins = zlib\n" : "");
	if (fclose(f) != 0)
		return -errno;
	return 0;
}

/* Remove what dir_fd holds and, depth levels down, what its directories
   hold, by name relative to dir_fd: never through a symbolic link (one is
   removed as a name), so the owner of the directory cannot send the
   removal elsewhere.  Deeper directories are left (doveadm makes none). */
static void remove_below(int dir_fd, int depth)
{
	DIR *dir = fdopendir(dir_fd);
	struct dirent *de;

	if (dir == NULL) {
		close(dir_fd);
		return;
	}
	while ((de = readdir(dir)) != NULL) {
		int sub;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (unlinkat(dirfd(dir), de->d_name, 0) == 0 || depth == 0)
			continue;
		sub = openat(dirfd(dir), de->d_name, O_RDONLY | O_DIRECTORY |
			     O_NOFOLLOW | O_CLOEXEC);
		if (sub >= 0) {
			remove_below(sub, depth - 1);
			unlinkat(dirfd(dir), de->d_name, AT_REMOVEDIR);
		}
	}
	closedir(dir);
}

void doveadm_config_remove(struct doveadm_run *d)
{
	if (d->conf != NULL)
		unlink(d->conf);
	if (d->tmpdir_made) {
		int home = open(d->home, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
				O_CLOEXEC);

		if (home >= 0)
			remove_below(home, 2);
		rmdir(d->home);
		rmdir(d->tmpdir);
	}
	free(d->conf);
}

/* Pass what doveadm wrote to stderr (the memfd errfd) on to ours, each
   line escaped (dbox_log_escape: it names mailboxes the store's owner
   named, and a name with terminal escapes must not reach root's
   terminal as they are), and note whether it says the zlib plugin cannot be loaded: Dovecot's
   module loader names the plugin ("Plugin 'zlib' not found from
   directory ...") or its file (lib20_zlib_plugin.so, when dlopen
   fails).  Any other error is doveadm's own and is not retried.  Lines
   of Dovecot's levels Error, Fatal and Panic ("doveadm(USER): Error:
   ...") are counted in d->errors. */
static void doveadm_errors(struct doveadm_run *d, int errfd)
{
	char buf[4096], *text = NULL;
	size_t len = 0;
	FILE *mem = open_memstream(&text, &len);
	ssize_t n;
	off_t off = 0;

	d->errors = 0;
	while ((n = pread(errfd, buf, sizeof(buf), off)) > 0) {
		if (mem != NULL)
			fwrite(buf, 1, (size_t)n, mem);
		off += n;
	}
	if (mem == NULL || fclose(mem) != 0)
		return;
	if (strstr(text, "Plugin 'zlib'") != NULL ||
	    strstr(text, "_zlib_plugin") != NULL)
		d->zlib_missing = true;
	for (char *line = text, *end; line < text + len; line = end + 1) {
		char *escaped;

		if ((end = memchr(line, '\n', (size_t)(text + len - line))) == NULL)
			end = text + len;
		*end = '\0';
		if (strstr(line, "Error: ") != NULL ||
		    strstr(line, "Fatal: ") != NULL ||
		    strstr(line, "Panic: ") != NULL)
			d->errors++;
		escaped = malloc(DBOX_LOG_ESCAPED_SIZE((size_t)(end - line)));
		if (escaped != NULL) {
			fprintf(stderr, "%s\n", dbox_log_escape(escaped,
				DBOX_LOG_ESCAPED_SIZE((size_t)(end - line)), line));
			free(escaped);
		}
	}
	free(text);
}

/* Run `doveadm -c CONF -f tab ARGS...` and call cb for every line after
   the header, with the fields in the order of names (columns found by
   the header; -EPROTO when one is missing).  Returns 0 or a negative
   errno (reported). */
int doveadm_run(struct doveadm_run *d, const char *const *args,
		const char *const *names, size_t nnames,
		doveadm_line_cb_t *cb, void *ctx)
{
	const char *argv[16];
	size_t argc = 0, col[16], ncols = 0;
	char *line = NULL, *fields[32], *ordered[16];
	size_t line_size = 0;
	int pipefd[2], errfd, status, ret = 0;
	bool header = true;
	size_t rows = 0;
	ssize_t len;
	pid_t pid;
	FILE *in;

	argv[argc++] = d->doveadm;
	argv[argc++] = "-c";
	argv[argc++] = d->conf;
	argv[argc++] = "-f";
	argv[argc++] = "tab";
	for (size_t i = 0; args[i] != NULL && argc < 15; i++)
		argv[argc++] = args[i];
	argv[argc] = NULL;
	/* doveadm's stderr is kept to be told apart (see doveadm_errors)
	   and then passed on as it was. */
	if ((errfd = memfd_create("doveadm-stderr", MFD_CLOEXEC)) < 0)
		return -errno;
	if (pipe2(pipefd, O_CLOEXEC) < 0) {
		ret = -errno;
		close(errfd);
		return ret;
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		ret = -errno;
		close(pipefd[0]);
		close(pipefd[1]);
		close(errfd);
		return ret;
	}
	if (pid == 0) {
		/* doveadm runs as the store's owner when root imports a
		   user's store (dboxadm switched to them): a process that
		   user may attach to.  So it gets nothing of the caller's
		   session - no controlling terminal (through it the user
		   could read root's keys or push input into root's shell,
		   TIOCSTI; helper-83), stdin from /dev/null, no descriptor
		   but its stdout and stderr. */
		int null = open("/dev/null", O_RDONLY);

		if (null < 0 || dup2(null, STDIN_FILENO) < 0 ||
		    dup2(pipefd[1], STDOUT_FILENO) < 0 ||
		    dup2(errfd, STDERR_FILENO) < 0 || setsid() < 0) {
			dprintf(errfd, "dboxadm: cannot start %s: %s\n",
				argv[0], strerror(errno));
			_exit(127);
		}
		close_range(STDERR_FILENO + 1, ~0U, 0);
		/* Only what doveadm needs; USER names the (static) user. */
		clearenv();
		setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:"
		       "/usr/bin:/sbin:/bin", 1);
		setenv("USER", "dboxadm", 1);
		setenv("HOME", d->home, 1);
		execvp(argv[0], (char *const *)argv);
		dprintf(STDERR_FILENO, "dboxadm: cannot run %s: %s%s\n",
			argv[0], strerror(errno), errno == ENOENT ?
			" (install Dovecot: apt-get install dovecot-core, or "
			"give --doveadm=PATH)" : "");
		_exit(127);
	}
	close(pipefd[1]);
	in = fdopen(pipefd[0], "r");
	if (in == NULL) {
		ret = -errno;
		close(pipefd[0]);
	}
	while (in != NULL && (len = getline(&line, &line_size, in)) >= 0) {
		size_t n;

		if (len > 0 && line[len - 1] == '\n')
			line[--len] = '\0';
		if (ret < 0)
			continue; /* drain, so doveadm is not killed by EPIPE */
		n = dovecot_tab_split(line, fields, 32);
		if (header) {
			header = false;
			for (size_t i = 0; i < nnames && ret == 0; i++) {
				size_t c;

				for (c = 0; c < n && strcmp(fields[c], names[i]) != 0; c++)
					;
				if (c == n) {
					adm_error("doveadm %s printed no '%s' "
						  "column", args[0], names[i]);
					ret = -EPROTO;
				}
				col[ncols++] = c;
			}
			continue;
		}
		if (n < ncols || (n == 1 && *fields[0] == '\0'))
			continue;
		for (size_t i = 0; i < nnames; i++)
			ordered[i] = fields[col[i]];
		rows++;
		ret = cb(ctx, ordered, nnames);
	}
	free(line);
	if (in != NULL)
		fclose(in);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	doveadm_errors(d, errfd);
	close(errfd);
	if (ret == 0 && (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
		adm_error("doveadm %s failed (exit %d; its messages are above)",
			  args[0], WIFEXITED(status) ? WEXITSTATUS(status) : -1);
		ret = -EIO;
	} else if (ret == 0 && d->errors > 0 && rows == 0) {
		/* Exit 0 after errors and nothing listed: an index it could
		   not lock (a read-only mdbox) lists no mailbox at all. */
		adm_error("doveadm %s reported %u error%s (above) and listed "
			  "nothing, although it exited 0; nothing is taken: fix "
			  "what it names (an mdbox it cannot lock or write) and "
			  "run again", args[0], d->errors,
			  d->errors == 1 ? "" : "s");
		ret = -EIO;
	} else if (ret == 0 && d->errors > 0) {
		/* Dovecot logs the damage it repairs itself (a corrupted
		   cache file) as errors too. */
		adm_warning("doveadm %s reported %u error%s (above); compare "
			    "the counts below with the mdbox's before you "
			    "remove it", args[0], d->errors,
			    d->errors == 1 ? "" : "s");
	}
	return ret;
}

