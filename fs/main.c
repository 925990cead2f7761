/*
 * main.c: the dboxfs command: options, store open, mount, daemonize, the
 * session loop, unmount.
 *
 *   dboxfs STORE MOUNTPOINT [-f] [-d] [-s] [-o opt,...]
 */
#include "engine/store-layout.h"
#include "fs.h"
#include "fs-purge.h"
#include "fs-stop.h"
#include "owner.h"
#include "options.h"

#include "engine/store-dirs.h"
#include "engine/store-lock.h"
#include "engine/purge.h"
#include "storage/log.h"

#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/vfs.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#define DBOXFS_VERSION "0.1"

enum { KEY_HELP, KEY_VERSION, KEY_RO, KEY_RW, KEY_NOATIME, KEY_KERNEL_CHECKS,
       KEY_SUID, KEY_NOSUID, KEY_DEV, KEY_NODEV, KEY_FSNAME };

#define FS_OPT(t, p) { t, offsetof(struct fs_options, p), 1 }

/* Every dboxfs option, with the default set in main(). */
static const struct fuse_opt fs_opt_spec[] = {
	FS_OPT("rotate_size=%lu", rotate_size),
	FS_OPT("entry_timeout=%lf", entry_timeout),
	FS_OPT("attr_timeout=%lf", attr_timeout),
	FS_OPT("purge_threshold=%u", purge_threshold),
	FS_OPT("compress=%s", compress),
	FS_OPT("alt=%s", alt),
	FUSE_OPT_KEY("ro", KEY_RO),
	FUSE_OPT_KEY("rw", KEY_RW),
	FS_OPT("user_xattr", user_xattr),
	FS_OPT("writeback_cache", writeback_cache),
	FS_OPT("nonempty", nonempty),
	FUSE_OPT_KEY("-h", KEY_HELP),
	FUSE_OPT_KEY("--help", KEY_HELP),
	FUSE_OPT_KEY("-V", KEY_VERSION),
	FUSE_OPT_KEY("noatime", KEY_NOATIME),
	FUSE_OPT_KEY("suid", KEY_SUID),
	FUSE_OPT_KEY("nosuid", KEY_NOSUID),
	FUSE_OPT_KEY("dev", KEY_DEV),
	FUSE_OPT_KEY("nodev", KEY_NODEV),
	FUSE_OPT_KEY("allow_other", KEY_KERNEL_CHECKS),
	FUSE_OPT_KEY("allow_root", KEY_KERNEL_CHECKS),
	FUSE_OPT_KEY("default_permissions", KEY_KERNEL_CHECKS),
	FUSE_OPT_KEY("fsname=", KEY_FSNAME),
	FUSE_OPT_KEY("--version", KEY_VERSION),
	FUSE_OPT_END
};

static void usage(const char *prog)
{
	printf("usage: %s STORE MOUNTPOINT [options]\n"
	       "\n"
	       "Mount the dbox store STORE (created when missing) as a Maildir++ tree.\n"
	       "\n"
	       "dboxfs options:\n"
	       "    -o rotate_size=BYTES   start a new " DBOX_STORE_STORAGE "/m.N past this size (10485760)\n"
	       "    -o entry_timeout=SECS  kernel name cache time (3600)\n"
	       "    -o attr_timeout=SECS   kernel attribute cache time (3600)\n"
	       "    -o purge_threshold=PCT purge a sealed m.N by itself once this\n"
	       "                           share of it is dead (50; 0 = never)\n"
	       "    -o ro                  read-only: the store is only read (it may be\n"
	       "                           on read-only media); changes fail (EROFS)\n"
	       "    -o rw                  read-write (the default)\n"
	       "    -o compress=gz[:LEVEL] store new messages gzip-compressed, as\n"
	       "                           Dovecot's zlib plugin (LEVEL 1-9, default 6;\n"
	       "                           'none' is the default)\n"
	       "    -o alt=PATH            alternate storage (Dovecot's mdbox ALT=):\n"
	       "                           m.N moved by 'dboxadm altmove' live in\n"
	       "                           PATH/" DBOX_STORE_STORAGE "/; recorded in the store, so\n"
	       "                           later mounts may leave it out\n"
	       "    -o user_xattr          store user.* extended attributes (off:\n"
	       "                           EOPNOTSUPP; on, every write(2) costs the\n"
	       "                           kernel's security.capability query)\n"
	       "    -o noatime             reads never change atime (default:\n"
	       "                           relatime, as ext4)\n"
	       "    -o suid, -o dev        (root) honour set-user-ID bits and\n"
	       "                           device nodes; never for another user's\n"
	       "                           store (default: -o nosuid, -o nodev)\n"
	       "    -o nosuid, -o nodev    the default\n"
	       "    -o writeback_cache     the kernel caches writes and keeps file\n"
	       "                           sizes itself: processes reading a file\n"
	       "                           another one appends to without a lock\n"
	       "                           (Dovecot's index) see sizes they can read;\n"
	       "                           the kernel then checks permissions\n"
	       "    -o nonempty            mount over a directory that is not empty\n"
	       "                           (hiding what is in it; refused otherwise)\n"
	       "    -o fsname=NAME         the mount's source in /proc/mounts and\n"
	       "                           df (default: STORE's absolute path)\n"
	       "    -o default_permissions the kernel checks permissions (always\n"
	       "                           with allow_other, allow_root or\n"
	       "                           writeback_cache; otherwise dboxfs does,\n"
	       "                           saving requests)\n"
	       "\n"
	       "general options:\n"
	       "    -f                     stay in the foreground, log to stderr too\n"
	       "    -d                     debug output (implies -f)\n"
	       "    -s                     single-threaded\n"
	       "    -h, --help             this help\n"
	       "    -V, --version          version\n"
	       "\n", prog);
}

/* Positional arguments: the first is STORE, the rest go to libfuse. */
static int opt_proc(void *data, const char *arg, int key,
		    struct fuse_args *outargs)
{
	struct fs_options *opts = data;

	switch (key) {
	case FUSE_OPT_KEY_NONOPT:
		if (opts->store == NULL) {
			opts->store = strdup(arg);
			return 0;
		}
		if (opts->mountpoint_arg == NULL)
			opts->mountpoint_arg = strdup(arg);
		return 1;
	case KEY_RO:
	case KEY_RW:
		/* Kept for libfuse too: the kernel refuses every change to a
		   read-only mount with EROFS. */
		opts->readonly = key == KEY_RO;
		return 1;
	case KEY_HELP:
		usage(outargs->argv[0]);
		fuse_opt_add_arg(outargs, "-ho");
		fuse_lowlevel_help();
		exit(0);
	case KEY_NOATIME:
		/* Ours, and the kernel's too (kept: /proc/mounts shows
		   it). */
		opts->noatime = 1;
		return 1;
	case KEY_KERNEL_CHECKS:
		/* Kept for libfuse: other users reach the mount, or the
		   kernel's checks were asked for (see main). */
		opts->kernel_checks = 1;
		return 1;
	case KEY_SUID:
	case KEY_NOSUID:
		opts->suid = key == KEY_SUID; /* kept for libfuse */
		return 1;
	case KEY_DEV:
	case KEY_NODEV:
		opts->dev = key == KEY_DEV;
		return 1;
	case KEY_FSNAME:
		opts->fsname_given = 1; /* kept for libfuse: it wins */
		return 1;
	case KEY_VERSION:
		printf("dboxfs %s\n", DBOXFS_VERSION);
		fflush(stdout); /* before fusermount3 --version writes */
		fuse_lowlevel_version();
		exit(0);
	}
	return 1;
}

/* Log sink: syslog always, stderr too while in the foreground. */
static bool log_to_stderr = true;  /* atomic both: every thread logs */
static bool log_debug;
static unsigned long errors_logged; /* so an exit says why once */

static void syslog_sink(enum dbox_log_level level, const char *fmt,
			va_list args)
{
	static const int prio[] = {
		[DBOX_LOG_ERROR] = LOG_ERR, [DBOX_LOG_WARNING] = LOG_WARNING,
		[DBOX_LOG_INFO] = LOG_INFO, [DBOX_LOG_DEBUG] = LOG_DEBUG,
	};
	va_list copy;

	if (level == DBOX_LOG_DEBUG && !log_debug)
		return;
	if (level == DBOX_LOG_ERROR)
		__atomic_add_fetch(&errors_logged, 1, __ATOMIC_RELAXED);
	if (__atomic_load_n(&log_to_stderr, __ATOMIC_RELAXED)) {
		va_copy(copy, args);
		fprintf(stderr, "dboxfs: ");
		vfprintf(stderr, fmt, copy);
		fputc('\n', stderr);
		va_end(copy);
	}
	vsyslog(prio[level], fmt, args);
}

/* Say why dboxfs stops (what failed, and the error), unless an error
   was logged since errors_before, which said it already. */
static void exit_reason(unsigned long errors_before, const char *what, int err)
{
	if (__atomic_load_n(&errors_logged, __ATOMIC_RELAXED) != errors_before)
		return;
	if (err != 0)
		dbox_error("%s: %s; exiting", what, strerror(err));
	else
		dbox_error("%s; exiting", what);
}

/* The absolute path of store, which need not exist yet (a new store):
   its parent's real path and its last component.  malloc()ed; NULL when
   out of memory.  Falls back to store as given. */
static char *store_abs(const char *store)
{
	char *abs = realpath(store, NULL), *dir, *base, *real;

	if (abs != NULL)
		return abs;
	if ((dir = strdup(store)) == NULL || (base = strdup(store)) == NULL) {
		free(dir);
		return NULL;
	}
	real = realpath(dirname(dir), NULL);
	if (real == NULL || asprintf(&abs, "%s/%s", strcmp(real, "/") == 0 ?
				     "" : real, basename(base)) < 0)
		abs = strdup(store);
	free(real);
	free(dir);
	free(base);
	return abs;
}

/* "-ofsname=STORE" with STORE made absolute (store_abs) and libfuse's
   option separators escaped: /proc/mounts, df and findmnt then name the
   store a mount serves (helper-85: every mount said "dboxfs"; helper-87:
   a new store's "./sub/../s" was shown so).  NULL when out of memory. */
static char *fsname_arg(const char *store)
{
	char *abs = store_abs(store), *arg, *p;

	if (abs == NULL)
		return NULL;
	/* Each ',' and '\\' escaped: twice the length at most. */
	arg = malloc(strlen("-ofsname=") + 2 * strlen(abs) + 1);
	if (arg != NULL) {
		p = stpcpy(arg, "-ofsname=");
		for (const char *s = abs; *s != '\0'; s++) {
			if (*s == ',' || *s == '\\')
				*p++ = '\\';
			*p++ = *s;
		}
		*p = '\0';
	}
	free(abs);
	return arg;
}

/* sysctl fs.protected_hardlinks (1 unless set to 0): the rule
   fs_perm_link applies as the kernel would. */
static bool protected_hardlinks(void)
{
	FILE *f = fopen("/proc/sys/fs/protected_hardlinks", "re");
	int c = f != NULL ? fgetc(f) : '1';

	if (f != NULL)
		fclose(f);
	return c != '0';
}

/* Plenty of descriptors (the soft limit up to the hard one): open
   handles read through descriptors of their own; cached m.N descriptors
   take at most a quarter of the limit (storage/fd-cache.h). */
static void raise_nofile(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/* dbox_ns_readdir callback: any entry sets *(bool *)ctx and stops. */
static int any_entry_cb(void *ctx, const struct dbox_dirent *ent)
{
	*(bool *)ctx = true;
	return 1;
}

/* A store with nothing in it (this mount created it, with the lock held:
   decided after the open, not before, when another process may still be
   making or removing it) is an empty INBOX (docs/design.md section 1):
   the root gets cur/ new/ tmp/, so maildir clients find a mailbox.  They
   and the root are the caller's, or the store owner's when root's mount
   works as that user (fs_owner_enter), as dboxadm import makes them. */
static int create_inbox(struct dbox_store *st, uid_t uid, gid_t gid)
{
	struct dbox_ns_set set = { .what = DBOX_NS_SET_UID | DBOX_NS_SET_GID,
				   .uid = uid, .gid = gid };
	bool used = false;
	int ret;

	dbox_store_mutex_lock(st);
	ret = dbox_ns_readdir(st, DBOX_ROOT_INO, 0, any_entry_cb, &used);
	if (ret == 0 && !used)
		ret = dbox_ns_make_inbox(st, uid, gid);
	if (ret == 0 && !used)
		ret = dbox_ns_setattr(st, DBOX_ROOT_INO, &set, NULL);
	dbox_store_mutex_unlock(st);
	return ret;
}

/* statfs() f_type of a FUSE mount (linux/magic.h). */
/* The first entry of directory path but "." and ".." into name (size
   bytes, cut short if need be).  Returns 1 when there is one, 0 when the
   directory is empty, -errno when it cannot be read. */
static int dir_first_entry(const char *path, char *name, size_t size)
{
	DIR *d = opendir(path);
	struct dirent *de;
	int ret = 0;

	if (d == NULL)
		return -errno;
	while ((de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) {
			snprintf(name, size, "%s", de->d_name);
			ret = 1;
			break;
		}
	}
	closedir(d);
	return ret;
}

#ifndef FUSE_SUPER_MAGIC
#define FUSE_SUPER_MAGIC 0x65735546
#endif

/* Refuse mount points that cannot work: a dead mount still there (its
   daemon was killed; stat says ENOTCONN), and a store inside the mount
   point (every access to the store would go through the mount being
   set up, and hang), and a FUSE mount there already.  Returns 0, or
   -ENOTCONN (a dead mount), -EBUSY (a FUSE mount) or -EINVAL (the store
   inside), reported on stderr. */
static int check_mountpoint(const char *store, const char *mnt)
{
	char *abs_store, *parent = NULL;
	struct statfs sfs;
	struct stat stbuf, parent_sb;
	size_t len = strlen(mnt);
	int ret = 0;

	/* statfs() too: stat() of a dead mount may be answered from the
	   kernel's attribute cache, statfs() always asks the daemon. */
	if ((stat(mnt, &stbuf) < 0 && errno == ENOTCONN) ||
	    (statfs(mnt, &sfs) < 0 && errno == ENOTCONN)) {
		fprintf(stderr, "dboxfs: %s: a dead mount is still there (its "
			"daemon died); run 'fusermount3 -u %s' first\n",
			mnt, mnt);
		return -ENOTCONN;
	}
	abs_store = realpath(store, NULL);
	/* Mounting over a FUSE mount hides it, and takes two fusermount3
	   -u to undo: most likely dboxfs was run twice. */
	if (statfs(mnt, &sfs) == 0 && sfs.f_type == FUSE_SUPER_MAGIC &&
	    stat(mnt, &stbuf) == 0 && asprintf(&parent, "%s/..", mnt) > 0 &&
	    stat(parent, &parent_sb) == 0 && parent_sb.st_dev != stbuf.st_dev) {
		fprintf(stderr, "dboxfs: %s is a FUSE mount already; unmount "
			"it first ('fusermount3 -u %s') or choose another mount "
			"point\n", mnt, mnt);
		free(parent);
		free(abs_store);
		return -EBUSY;
	}
	free(parent);
	parent = NULL;
	if (abs_store == NULL) {
		/* A new store: where it will be is below its parent. */
		char *slash;

		parent = strdup(store);
		slash = parent != NULL ? strrchr(parent, '/') : NULL;
		if (slash != NULL)
			*slash = '\0';
		abs_store = realpath(slash == NULL ? "." :
				     parent[0] == '\0' ? "/" : parent, NULL);
	}
	if (abs_store != NULL && strncmp(abs_store, mnt, len) == 0 &&
	    (abs_store[len] == '\0' || abs_store[len] == '/' ||
	     strcmp(mnt, "/") == 0)) {
		fprintf(stderr, "dboxfs: the store %s is inside the mount "
			"point %s; put it elsewhere\n", store, mnt);
		ret = -EINVAL;
	}
	free(parent);
	free(abs_store);
	return ret;
}

/* Unless nonempty_ok (-o nonempty), refuse a mount point that is not
   empty: the mount would hide what is there - mail a delivery agent put
   into the bare directory while the store was not mounted (a dead mount
   taken away by -o auto_unmount), or a maildir not imported yet
   (helper-80).  Looked at once root's checks of the mount point passed
   (fs_owner_check_mountpoint: a refusal there says more); one that
   cannot be read is refused too (helper-81: a mount point of mode 0333
   holding a file was taken).  Returns 0 or -ENOTEMPTY, reported on
   stderr. */
static int check_mountpoint_empty(const char *mnt, bool nonempty_ok)
{
	char first[256], shown[sizeof(first) * 4];
	int ret;

	/* /dev/fd/N: mount.fuse3 made the mount before dboxfs started. */
	if (nonempty_ok || strncmp(mnt, "/dev/fd/", 8) == 0)
		return 0;
	ret = dir_first_entry(mnt, first, sizeof(first));
	if (ret == 0 || ret == -ENOENT) /* missing: libfuse says so */
		return 0;
	if (ret < 0)
		fprintf(stderr, "dboxfs: %s cannot be read (%s), so whether it "
			"is empty cannot be told; give -o nonempty to mount "
			"over it all the same\n", mnt, strerror(-ret));
	else
		fprintf(stderr, "dboxfs: %s is not empty (it holds '%s'): the "
			"mount would hide what is there, such as mail "
			"delivered while the store was not mounted; move it "
			"away or into the store (dboxadm import), or give -o "
			"nonempty\n", mnt,
			dbox_log_escape(shown, sizeof(shown), first));
	return -ENOTEMPTY;
}

/* The store settings from the -o options: rotate size, read-only, the
   compression of new bodies, the alternate storage (made absolute: the
   daemon changes directory).  Returns 0, or -1 after saying what is
   wrong on stderr. */
static int store_settings(struct fs_options *opts,
			  struct dbox_store_settings *set)
{
	set->rotate_size = opts->rotate_size;
	set->readonly = opts->readonly;
	set->create = !opts->readonly;
	set->compress_given = opts->compress != NULL;
	if (opts->compress != NULL &&
	    dbox_compress_parse(opts->compress, &set->compress) < 0) {
		fprintf(stderr, "dboxfs: -o compress=%s: want none, gz or "
			"gz:LEVEL (1-9)\n", opts->compress);
		return -1;
	}
	if (opts->alt != NULL && opts->alt[0] != '/') {
		char *abs = realpath(opts->alt, NULL);

		if (abs == NULL) {
			fprintf(stderr, "dboxfs: -o alt=%s: %s\n", opts->alt,
				strerror(errno));
			return -1;
		}
		free(opts->alt);
		opts->alt = abs;
	}
	set->alt_path = opts->alt;
	return 0;
}

/* What was at the store's path before this mount opened it: nothing
   (dir_made) or an empty directory (made_all: whatever is in it after
   the open is this mount's, so a mount that fails may take it away). */
struct store_birth {
	bool made_all, dir_made;
};

static void store_birth_note(const char *store, struct store_birth *b)
{
	char first[256];
	int ret = dir_first_entry(store, first, sizeof(first));

	b->dir_made = ret == -ENOENT;
	b->made_all = b->dir_made || ret == 0;
}

/* Close the store; a mount that failed before it was up takes back the
   store it made (no client saw it), so a mistyped path or a refused
   mount point leaves no empty store behind. */
static void close_store(struct fs *fs, const struct store_birth *b)
{
	if (!b->made_all || fs->st == NULL) {
		dbox_store_close(&fs->st);
		return;
	}
	dbox_store_close_new(&fs->st, b->dir_made);
	dbox_info("%s: removed the new store this mount had made",
		  fs->opts.store);
}

/* Open (or create) the store into fs->st; a store this mount created
   gets its INBOX.  Returns 0, or -1 after logging why (the store is
   closed again, and removed when this call made it: *birth). */
static int open_store(struct fs *fs, const struct dbox_store_settings *set,
		      unsigned long errors_before, struct store_birth *birth,
		      const struct fs_owner *owner)
{
	int ret;

	store_birth_note(fs->opts.store, birth);
	if (fs->opts.readonly)
		birth->made_all = false; /* nothing is made */
	/* A refusal (locked by another mount, not a store) removes
	   nothing: this process never had the store. */
	if ((ret = dbox_store_open(fs->opts.store, set, &fs->st)) < 0) {
		exit_reason(errors_before, fs->opts.store, -ret);
		return -1;
	}
	if (!fs->opts.readonly &&
	    (ret = create_inbox(fs->st, owner->active ? owner->uid : getuid(),
				owner->active ? owner->gid : getgid())) < 0) {
		exit_reason(errors_before, "creating the INBOX of a new store",
			    -ret);
		close_store(fs, birth);
		return -1;
	}
	return 0;
}

/* End the session's connection by closing its /dev/fuse descriptor
   (files still open on the mount get ENOTCONN, as when libfuse closes
   it), putting in its place the write end of a pipe without readers:
   fuse_session_unmount polls that descriptor, takes POLLERR for a
   connection already gone (libfuse's fuse_kern_unmount) and then
   unmounts no path, only closing it and freeing what it holds. */
static void sever_session(struct fuse_session *se)
{
	int fd = fuse_session_fd(se), p[2];

	if (fd < 0 || pipe2(p, O_CLOEXEC) < 0)
		return;
	close(p[0]);
	if (dup3(p[1], fd, O_CLOEXEC) < 0)
		dbox_warning("ending the FUSE connection: %s", strerror(errno));
	close(p[1]);
}

/* Fixed malloc thresholds for the request threads.  Request threads
   mostly get malloc arenas of their own (glibc hands out up to 8 per
   core), and glibc's default trim threshold (128 KiB at first) gives the
   free pages at the top of an arena back to the kernel as soon as a
   request's buffers are freed: madvise calls (1.4 per
   delivery in tools/bench/b_counts.py) and page faults for the next
   request to take the same pages again.  Keeping 4 MiB per arena before
   trimming, and mmapping only blocks above 1 MiB (a fixed value also
   stops glibc from moving the thresholds by itself), turns that into
   reuse; the cost is at most a few MiB of resident memory per request
   thread.  mallopt(3) gives these meanings.  Its result is not looked
   at: a refusal (ASan's allocator refuses both) only costs speed, and
   says nothing a user could act on. */
static void malloc_tune(void)
{
	(void)mallopt(M_TRIM_THRESHOLD, 4 << 20);
	(void)mallopt(M_MMAP_THRESHOLD, 1 << 20);
}

/* Going to the background.  fuse_daemonize() lets the parent exit as
   soon as the child exists: a script that ran dboxadm purge right after
   dboxfs returned found no pid in STORE/lock yet, and a failure of the
   child (opening the index again) reached neither the terminal nor the
   exit status.  Here the parent waits until the child says that it
   serves (index open again, threads started, pid in STORE/lock) or that
   it failed, and exits 0 or 1; the child's messages reach the terminal
   until then.  Returns 0 in the child with *ready_fd for
   background_ready (-1 in the foreground), or -errno (nothing forked). */
static int background_fork(bool foreground, int *ready_fd)
{
	int pipefd[2], err;
	pid_t pid;

	*ready_fd = -1;
	if (foreground)
		return chdir("/") < 0 ? -errno : 0;
	if (pipe2(pipefd, O_CLOEXEC) < 0)
		return -errno;
	if ((pid = fork()) < 0) {
		err = -errno;
		close(pipefd[0]);
		close(pipefd[1]);
		return err;
	}
	if (pid > 0) {
		char status = 1;
		ssize_t n;

		close(pipefd[1]);
		do
			n = read(pipefd[0], &status, 1);
		while (n < 0 && errno == EINTR);
		_exit(n == 1 && status == 0 ? 0 : 1);
	}
	close(pipefd[0]);
	/* A new session (a fork's child leads no group, so this cannot
	   fail), no working directory kept busy. */
	(void)setsid();
	if (chdir("/") < 0) {
		err = -errno;
		close(pipefd[1]);
		return err;
	}
	*ready_fd = pipefd[1];
	return 0;
}

/* Tell the parent waiting in background_fork how the start went (ok:
   serving), and leave the terminal: stdin, stdout and stderr go to
   /dev/null.  A no-op in the foreground (ready_fd -1). */
static void background_ready(int ready_fd, bool ok)
{
	char status = ok ? 0 : 1;
	int nullfd;

	if (ready_fd < 0)
		return;
	if (ok && (nullfd = open("/dev/null", O_RDWR | O_CLOEXEC)) >= 0) {
		(void)dup2(nullfd, STDIN_FILENO);
		(void)dup2(nullfd, STDOUT_FILENO);
		(void)dup2(nullfd, STDERR_FILENO);
		if (nullfd > STDERR_FILENO)
			close(nullfd);
	}
	if (write(ready_fd, &status, 1) != 1)
		dbox_warning("telling the starting process: %s", strerror(errno));
	close(ready_fd);
}

/* The threads beside the request loop.  Without the purge thread the
   mount still works; only purging it on request or by itself does not.
   WAL checkpoints run in a thread of their own, off the request path
   (commits checkpoint themselves when it cannot start), and one commits
   deferred renames (engine/store-commit.c).  A read-only mount does
   none of these. */
static void start_threads(struct fs *fs)
{
	if (fs->opts.readonly) {
		signal(SIGUSR1, SIG_IGN); /* a purge request is no reason to die */
		return;
	}
	fs_purge_start(fs);
	dbox_store_checkpointer_start(fs->st);
	(void)dbox_store_defer_start(fs->st); /* logs why when it fails */
	dbox_store_verify_start(fs->st);
	if (fs_walkcut_start(fs) < 0)
		dbox_warning("%s: no thread to drop cached names after a chmod "
			     "that takes search permission away: such a walk "
			     "may go on through cached names", fs->st->path);
}

/* Serve requests until unmounted or signalled.  Returns the exit status:
   0 for an unmount, 1 otherwise (logged). */
static int run_loop(struct fs *fs, const struct fuse_cmdline_opts *cmd)
{
	struct fuse_loop_config *loop;
	int ret;

	if (cmd->singlethread) {
		ret = fuse_session_loop(fs->se);
	} else {
		loop = fuse_loop_cfg_create();
		fuse_loop_cfg_set_clone_fd(loop, cmd->clone_fd);
		fuse_loop_cfg_set_max_threads(loop, cmd->max_threads);
		/* libfuse 3.14 leaves max_idle_threads at UINT_MAX unless -o
		   max_idle_threads= was given, and warns about that value. */
		if (cmd->max_idle_threads != UINT_MAX)
			fuse_loop_cfg_set_idle_threads(loop, cmd->max_idle_threads);
		ret = fuse_session_loop_mt(fs->se, loop);
		fuse_loop_cfg_destroy(loop);
	}
	/* libfuse: a negative errno, or the number of the signal that
	   ended the loop (SIGTERM, SIGINT, SIGHUP).  A mount the stop
	   detached ends when the kernel ends the session: a read then fails
	   with ENODEV, which libfuse takes for the end, or at times with
	   ECONNABORTED, the connection torn down under it (helper-89: 2 of
	   160 SIGTERMs exited 1, nothing lost). */
	if (ret == -ECONNABORTED && fs_stop_detached(fs))
		ret = 0;
	if (ret < 0)
		dbox_error("the FUSE session failed: %s; unmounting",
			   strerror(-ret));
	else if (ret > 0)
		dbox_info("%s received; unmounting", strsignal(ret));
	/* A signal is an orderly stop (systemd's, a ^C): exit 0. */
	return ret < 0;
}

int main(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct fuse_cmdline_opts cmd;
	struct dbox_store_settings set = { .create = true };
	struct store_birth birth = { false, false };
	struct fs_owner owner = { false, 0, 0 };
	bool mounted, detached = false;
	struct fs fs = {
		.idle = PTHREAD_COND_INITIALIZER,
		.opts = {
			.rotate_size = DBOX_DEFAULT_ROTATE_SIZE,
			.entry_timeout = 3600,
			.attr_timeout = 3600,
			.purge_threshold = DBOX_PURGE_DEFAULT_THRESHOLD,
			.suid = -1,
			.dev = -1,
		},
	};
	unsigned long errors_before;
	int ret = 1, ready_fd = -1;

	umask(077); /* store files 0600, directories 0700 */
	malloc_tune();
	openlog("dboxfs", LOG_PID, LOG_MAIL);
	dbox_log_set_sink(syslog_sink);
	if (fs_options_check(argc, argv) < 0 ||
	    fuse_opt_parse(&args, &fs.opts, fs_opt_spec, opt_proc) < 0)
		return 1;
	/* Who checks permissions.  A mount others may reach (allow_other,
	   allow_root) leaves them to the kernel (default_permissions),
	   which checks every path walk.  One only its owner reaches checks
	   them in the daemon (fs/fs-perm.c): the kernel then spares the
	   directory GETATTRs its own checks cost after every change.  With
	   writeback_cache the kernel keeps mtimes itself and sends them as
	   explicit times, which the daemon could not tell from a utime() by
	   a writer who is not the owner: the kernel checks there too. */
	if (fs.opts.writeback_cache)
		fs.opts.kernel_checks = 1;
	if (fs.opts.kernel_checks)
		fuse_opt_add_arg(&args, "-odefault_permissions");
	fs.protected_hardlinks = protected_hardlinks();
	if (fs.opts.store != NULL && !fs.opts.fsname_given) {
		char *fsname = fsname_arg(fs.opts.store);

		if (fsname == NULL || fuse_opt_add_arg(&args, fsname) < 0) {
			free(fsname);
			fprintf(stderr, "dboxfs: out of memory\n");
			return 1;
		}
		free(fsname);
	}
	fuse_opt_add_arg(&args, "-osubtype=dboxfs");
	if (fuse_parse_cmdline(&args, &cmd) != 0)
		return 1;
	/* A mount made before dboxfs started (mount.fuse3's
	   drop_privileges passes /dev/fd/N) has whatever options it was
	   made with: the daemon checks in any case. */
	fs.own_checks = !fs.opts.kernel_checks ||
		(cmd.mountpoint != NULL &&
		 strncmp(cmd.mountpoint, "/dev/fd/", 8) == 0);
	if (fs.opts.store == NULL || cmd.mountpoint == NULL) {
		fprintf(stderr, "usage: %s STORE MOUNTPOINT [options] "
			"(--help for more)\n", argv[0]);
		goto out_args;
	}
	log_debug = cmd.debug;
	raise_nofile();
	if (check_mountpoint(fs.opts.store, cmd.mountpoint) < 0)
		goto out_args;

	/* Open the store before mounting, so a refusal (locked, not a
	   store, newer format) is reported here and nothing is mounted. */
	if (store_settings(&fs.opts, &set) < 0)
		goto out_args;
	/* Whose store it is decides the mount's options: before the
	   session, which takes them. */
	errors_before = __atomic_load_n(&errors_logged, __ATOMIC_RELAXED);
	if (fs_owner_enter(fs.opts.store, &owner) < 0 ||
	    fs_owner_mount_options(&owner, &fs.opts, &args, cmd.mountpoint) < 0)
		goto out_args;
	fs.others_store = owner.active;
	fs.store_uid = owner.uid;
	fs.store_gid = owner.gid;
	/* The session next: it rejects unknown -o options before the
	   store is created or opened. */
	fs.se = fuse_session_new(&args, &fs_ops, sizeof(fs_ops), &fs);
	if (fs.se == NULL)
		goto out_args;
	if (fs_owner_check_mountpoint(&owner, fs.opts.mountpoint_arg) < 0 ||
	    check_mountpoint_empty(cmd.mountpoint, fs.opts.nonempty) < 0 ||
	    open_store(&fs, &set, errors_before, &birth, &owner) < 0)
		goto out_session;
	if (fs_inode_table_init(&fs.inodes) < 0) {
		exit_reason(errors_before, "the inode table", ENOMEM);
		goto out_store;
	}
	if (fuse_set_signal_handlers(fs.se) != 0) {
		exit_reason(errors_before, "installing signal handlers", errno);
		goto out_inodes;
	}
	/* The owner's data can make the open above as slow as they like
	   (recovery scans what they wrote): the mount point is checked
	   again right before the mount, or they would have all that time
	   to swap it for a link to a directory of root's (helper-61). */
	if (fs_owner_check_mountpoint(&owner, fs.opts.mountpoint_arg) < 0)
		goto out_signals;
	/* libfuse names what is wrong with the mount point on stderr (and
	   only there): the log gets a line too. */
	/* /dev/fuse and the mount point are root's business. */
	mounted = fs_owner_switch(&owner, false) == 0 &&
		fuse_session_mount(fs.se, cmd.mountpoint) == 0;
	if (fs_owner_switch(&owner, true) < 0 && mounted)
		goto out_unmount; /* ret is 1 */
	if (!mounted) {
		dbox_error("%s: cannot mount (the reason is on stderr, from "
			   "libfuse); exiting", cmd.mountpoint);
		/* The usual reason a user's mount fails where root's works. */
		if (access("/dev/fuse", R_OK | W_OK) < 0)
			fprintf(stderr, "dboxfs: /dev/fuse is not open to you "
				"(%s); see dboxfs(1), FILES\n",
				strerror(errno));
		goto out_signals;
	}
	{
		/* Both paths absolute, as libfuse made the mount point.  A
		   new store is said so: a mistyped STORE is one. */
		char spec[32], *store = realpath(fs.opts.store, NULL);

		/* The store's: -o compress=, else the recorded one. */
		dbox_compress_format(&fs.st->compress, spec, sizeof(spec));
		dbox_info("mounted %s on %s (compress=%s%s%s)",
			  store != NULL ? store : fs.opts.store, cmd.mountpoint,
			  spec, fs.opts.readonly ? ", read-only" : "",
			  birth.made_all ? "; a new, empty store" : "");
		free(store);
	}
	birth.made_all = false; /* up: clients may have used it */
	/* SQLite connections must not cross fork(): background_fork()
	   forks and the parent exits, so the connection is closed here and
	   opened again in the child.  The store lock (STORE/lock) is
	   inherited. */
	dbox_store_index_suspend(fs.st);
	errors_before = __atomic_load_n(&errors_logged, __ATOMIC_RELAXED);
	if ((ret = background_fork(cmd.foreground, &ready_fd)) < 0) {
		exit_reason(errors_before, "going to the background", -ret);
		ret = 1;
		goto out_unmount;
	}
	if (dbox_store_index_resume(fs.st) < 0) {
		exit_reason(errors_before, "opening the index again after "
			    "going to the background", EIO);
		background_ready(ready_fd, false);
		ret = 1;
		goto out_unmount;
	}
	/* Before the threads start: they log (the index check, purge). */
	__atomic_store_n(&log_to_stderr, cmd.foreground, __ATOMIC_RELAXED);
	fs.mountpoint = cmd.mountpoint; /* the purge thread names it */
	start_threads(&fs);
	fs_stop_start(&fs);
	background_ready(ready_fd, true);
	ret = run_loop(&fs, &cmd);
	detached = fs_stop_took_unmount(&fs);
	fs_stop_finish(&fs);
	/* The stop is under way: more of these signals (a storm of SIGHUP)
	   must not kill the daemon while it closes the store. */
	signal(SIGTERM, SIG_IGN);
	signal(SIGINT, SIG_IGN);
	signal(SIGHUP, SIG_IGN);
out_unmount:
	fs_purge_stop(&fs);
	fs_walkcut_stop(&fs);
	/* Unmounted: from here to exit the store is still locked while the
	   index is checkpointed and closed; a mount or dboxadm started now
	   waits for that instead of failing (store-lock.h). */
	if (!fs.opts.readonly)
		dbox_store_lock_set_closing(fs.st->lock_fd);
	/* After root's checked stop libfuse must not unmount the path: the
	   connection is ended first, and libfuse, seeing it gone, only
	   frees what it holds. */
	if (detached)
		sever_session(fs.se);
	fuse_session_unmount(fs.se);
out_signals:
	fuse_remove_signal_handlers(fs.se);
	fs_handles_release(&fs);
out_inodes:
	fs_handles_free(&fs);
	fs_dirhandles_free(&fs);
	fs_inode_table_deinit(&fs.inodes);
out_store:
	close_store(&fs, &birth);
out_session:
	fuse_session_destroy(fs.se);
out_args:
	free(cmd.mountpoint);
	free(fs.opts.store);
	free(fs.opts.mountpoint_arg);
	free(fs.opts.compress);
	free(fs.opts.alt);
	fuse_opt_free_args(&args);
	return ret;
}
