/*
 * purge.c: dboxadm purge STORE [--timeout=SECONDS] - give back the bytes
 * of expunged and overwritten messages (engine/purge.h):
 *
 *   not mounted  the store is opened (lock, recovery) and purged here;
 *   mounted      the mount is asked to purge: its daemon wrote its pid
 *                into STORE/lock; once that process is proven to be the
 *                dboxfs serving this store (mount_pid), SIGUSR1 is sent
 *                and the index (read without the lock) is polled until it
 *                records a requested purge that started after the
 *                signal, or the timeout passes (the purge then goes on in
 *                the daemon).
 *
 * SIGUSR1 kills a process that does not handle it, so the pid in the
 * lock file is trusted only once proven; and STORE/lock is opened
 * relative to the store directory, opened once, with O_NOFOLLOW: a lock
 * that is a symbolic link (to some daemon's flock()ed pid file, say) is
 * refused, never followed.
 *
 * Prints what was removed and moved on stdout, the same lines either way
 * (the mount records the outcome of a requested purge in the index).
 * Exit status: 0 purged, 1 some m.N could not be purged (or the mount
 * went away, or did not finish in time), 2 usage error or store refused.
 */
#include "engine/store-layout.h"
#include "dboxadm.h"
#include "progress.h"

#include "index/index-purge.h"
#include "index/index-stats.h"
#include "index/index.h"
#include "engine/purge.h"
#include "engine/store.h"
#include "engine/store-lock.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_TIMEOUT 600
#define POLL_MS 100

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

static int purge_offline(const char *store)
{
	struct dbox_store_settings set = { .create = false };
	struct dbox_purge_settings ps = { .threshold = 0 };
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
	if (ret < 0)
		adm_error("%s: %llu files could not be purged (see above)",
			  store, (unsigned long long)res.files_failed);
	return ret < 0 ? 1 : 0;
}

/* A descriptor of process pid that stays with that process (its pid is
   not reused while it is open), or -errno. */
static int pid_open(pid_t pid)
{
	long fd = syscall(SYS_pidfd_open, pid, 0);

	return fd < 0 ? -errno : (int)fd;
}

/* Send sig to the process of pidfd; 0 or -errno (-ESRCH: it exited). */
static int pid_signal(int pidfd, int sig)
{
	return syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0) < 0 ?
		-errno : 0;
}

/* Is /proc/<pid>/exe a program named dboxfs?  -errno when unreadable. */
static int runs_dboxfs(pid_t pid)
{
	char path[64], exe[PATH_MAX + 1];
	const char *base;
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/%d/exe", (int)pid);
	if ((n = readlink(path, exe, sizeof(exe) - 1)) < 0)
		return -errno;
	exe[n] = '\0';
	base = strrchr(exe, '/');
	base = base != NULL ? base + 1 : exe;
	return strcmp(base, "dboxfs") == 0 ||
		strcmp(base, "dboxfs (deleted)") == 0;
}

/* Does process pid hold open both the file lock (the store's lock, by
   device and inode) and a FUSE device (the character device of
   /dev/fuse)?  -errno when its descriptors cannot be read. */
static int holds_store_and_fuse(pid_t pid, const struct stat *lock)
{
	char dirname[64], fdpath[320];
	struct stat fuse, sb;
	bool has_lock = false, has_fuse = false;
	struct dirent *de;
	DIR *dir;

	if (stat("/dev/fuse", &fuse) < 0 || !S_ISCHR(fuse.st_mode))
		return -ENODEV;
	snprintf(dirname, sizeof(dirname), "/proc/%d/fd", (int)pid);
	if ((dir = opendir(dirname)) == NULL)
		return -errno;
	while ((de = readdir(dir)) != NULL) {
		snprintf(fdpath, sizeof(fdpath), "%s/%s", dirname, de->d_name);
		if (de->d_name[0] == '.' || stat(fdpath, &sb) < 0)
			continue;
		if (S_ISREG(sb.st_mode) && sb.st_dev == lock->st_dev &&
		    sb.st_ino == lock->st_ino)
			has_lock = true;
		if (S_ISCHR(sb.st_mode) && sb.st_rdev == fuse.st_rdev)
			has_fuse = true;
	}
	closedir(dir);
	return has_lock && has_fuse;
}

/* The effective uid of process pid, from /proc/<pid>/status; -errno. */
static long process_euid(pid_t pid)
{
	char path[64], line[256];
	unsigned long real, eff;
	long ret = -ENOENT;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	if ((f = fopen(path, "re")) == NULL)
		return -errno;
	while (fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "Uid: %lu %lu", &real, &eff) == 2) {
			ret = (long)eff;
			break;
		}
	fclose(f);
	return ret;
}

/* The mount of the store, from its lock lock_fd (held by someone else):
   the pid the lock file names, proven to be the dboxfs serving this
   store before anything is sent to it:
     - it is a live process (held by a pidfd from here on, so the number
       cannot pass to another process before the signal);
     - its program is named dboxfs (/proc/PID/exe);
     - it holds this very lock file open (same device and inode, not the
       same path name) and a FUSE device: a mount of this store holds
       both, and only one process holds the lock;
     - it runs as the owner of the lock file (whoever mounts a store owns
       its lock).
   Returns a pidfd and *pid_r, or -1 after reporting why there is none. */
static int mount_pid(const char *store, int lock_fd, pid_t *pid_r)
{
	char buf[32] = "", *end;
	struct stat lock;
	const char *why;
	long pid = 0, euid;
	ssize_t n;
	int pidfd, ret;

	n = pread(lock_fd, buf, sizeof(buf) - 1, 0);
	buf[n > 0 ? n : 0] = '\0';
	errno = 0;
	pid = strtol(buf, &end, 10);
	if (n <= 0 || errno != 0 || end == buf || *end != '\n' || pid <= 1 ||
	    pid > INT_MAX || fstat(lock_fd, &lock) < 0) {
		adm_error("%s: the store is in use, but not by a dboxfs mount "
			  "that takes purge requests (another dboxadm?)",
			  store);
		return -1;
	}
	if ((pidfd = pid_open((pid_t)pid)) < 0) {
		adm_error("%s: process %ld named by STORE/lock is gone (stale "
			  "pid)", store, pid);
		return -1;
	}
	if ((ret = runs_dboxfs((pid_t)pid)) == 1)
		ret = holds_store_and_fuse((pid_t)pid, &lock);
	euid = ret == 1 ? process_euid((pid_t)pid) : 0;
	if (ret == 1 && euid >= 0 && (uid_t)euid == lock.st_uid) {
		*pid_r = (pid_t)pid;
		return pidfd;
	}
	if (pid_signal(pidfd, 0) == -ESRCH) {
		/* It died while it was being looked at (a killed mount). */
		adm_error("%s: process %ld named by STORE/lock is gone", store,
			  pid);
		close(pidfd);
		return -1;
	}
	if (ret == -EACCES || ret == -EPERM)
		why = "permission denied: run as the mount's owner";
	else if (ret < 0)
		why = strerror(-ret);
	else if (ret == 0)
		why = "it is not a dboxfs mount of this store";
	else
		why = "it does not run as the owner of STORE/lock";
	adm_error("%s: not signalling process %ld named by STORE/lock: %s",
		  store, pid, why);
	close(pidfd);
	return -1;
}

static int64_t meta(struct dbox_index *index, const char *key)
{
	int64_t value = 0;

	return dbox_index_meta_get(index, key, &value) == 0 ? value : 0;
}

/* The outcome of the last requested purge, as the mount recorded it
   (engine/purge.h), read in one snapshot.  Returns 0 or -EIO. */
static int request_result(struct dbox_index *index,
			  struct dbox_purge_result *res_r)
{
	int ret = dbox_index_snapshot_begin(index);

	memset(res_r, 0, sizeof(*res_r));
	if (ret < 0)
		return ret;
	res_r->error = (int)meta(index, DBOX_META_PURGE_REQUEST_ERROR);
	res_r->bytes_freed = (uint64_t)meta(index, DBOX_META_PURGE_REQUEST_FREED);
	res_r->bytes_moved = (uint64_t)meta(index, DBOX_META_PURGE_REQUEST_MOVED);
	res_r->files_purged = (uint64_t)meta(index, DBOX_META_PURGE_REQUEST_FILES);
	res_r->records_moved =
		(uint64_t)meta(index, DBOX_META_PURGE_REQUEST_RECORDS);
	res_r->files_failed =
		(uint64_t)meta(index, DBOX_META_PURGE_REQUEST_FAILED);
	res_r->files_busy = (uint64_t)meta(index, DBOX_META_PURGE_REQUEST_BUSY);
	dbox_index_snapshot_end(index);
	return 0;
}

static int purge_online(const char *store, int lock_fd, unsigned int timeout)
{
	struct dbox_index *index = NULL;
	struct dbox_purge_result res;
	int64_t t0, deadline;
	pid_t pid = 0;
	int pidfd = mount_pid(store, lock_fd, &pid);
	int ret;

	if (pidfd < 0)
		return ADM_EXIT_USAGE;
	if ((ret = adm_open_index(store, &index)) != 0) {
		close(pidfd);
		return ret;
	}
	t0 = dbox_now_ns();
	if ((ret = pid_signal(pidfd, SIGUSR1)) < 0) {
		adm_error("%s: cannot signal the mount (pid %d): %s", store,
			  (int)pid, strerror(-ret));
		dbox_index_close(&index);
		close(pidfd);
		return ADM_EXIT_FAILED;
	}
	deadline = t0 + (int64_t)timeout * 1000000000;
	for (;;) {
		struct timespec ts = { 0, POLL_MS * 1000000L };

		if (meta(index, DBOX_META_PURGE_REQUEST_START) >= t0)
			break;
		if (pid_signal(pidfd, 0) == -ESRCH) {
			adm_error("%s: the mount (pid %d) went away during the "
				  "purge", store, (int)pid);
			dbox_index_close(&index);
			close(pidfd);
			return ADM_EXIT_FAILED;
		}
		if (dbox_now_ns() > deadline) {
			adm_error("%s: the mount has not finished purging after "
				  "%u s; it goes on in the background", store,
				  timeout);
			dbox_index_close(&index);
			close(pidfd);
			return ADM_EXIT_FAILED;
		}
		nanosleep(&ts, NULL);
	}
	close(pidfd);
	if ((ret = request_result(index, &res)) < 0) {
		adm_error("%s: the mount purged, but its result cannot be read "
			  "from the index: %s", store, strerror(-ret));
		dbox_index_close(&index);
		return ADM_EXIT_FAILED;
	}
	dbox_index_close(&index);
	printf("purged by the mount (pid %d)\n", (int)pid);
	print_result(&res);
	if (res.error != 0) {
		adm_error("%s: the mount's purge failed (%s): %llu files could "
			  "not be purged; the mount's log (syslog) names them",
			  store, strerror(-res.error),
			  (unsigned long long)res.files_failed);
		return ADM_EXIT_FAILED;
	}
	return ADM_EXIT_OK;
}

/* STORE/lock, opened for reading relative to the store directory and
   never through a symbolic link (nor a FIFO or device).  Returns its fd,
   -1 when there is none (no mount holds the store), or -2 after
   reporting a store or lock that is refused, or one held by a read-only
   mount (which cannot do verb's work). */
static int open_lock(const char *store, const char *verb)
{
	char who[4200];
	bool shared;
	struct stat sb;
	int dir_fd, fd;

	dir_fd = open(store, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dir_fd < 0) {
		adm_error("%s: %s", store, strerror(errno));
		return -2;
	}
	fd = openat(dir_fd, DBOX_STORE_LOCK, O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
		    O_NOCTTY | O_CLOEXEC);
	close(dir_fd);
	if (fd < 0 && errno == ENOENT)
		return -1;
	if (fd < 0 || fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
		adm_error("%s/lock: %s; a store's lock is a plain file, so "
			  "the store is refused", store,
			  fd < 0 && errno == ELOOP ? "a symbolic link" :
			  fd < 0 ? strerror(errno) : "not a regular file");
		if (fd >= 0)
			close(fd);
		return -2;
	}
	/* A -o ro mount holds the lock shared and writes no pid: no waiting
	   for a close it does not announce, no request it cannot take. */
	if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
		(void)flock(fd, LOCK_UN); /* free: the caller decides */
	} else if (errno == EWOULDBLOCK &&
		   dbox_store_lock_holder(fd, &shared) > 0 && shared) {
		adm_error("%s is mounted read-only (%s): %s needs a read-write "
			  "mount or the store unmounted", store,
			  dbox_store_lock_holder_text(fd, who, sizeof(who)),
			  verb);
		close(fd);
		return -2;
	}
	return fd;
}

static int purge_main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "timeout", required_argument, NULL, 't' },
		{ 0 },
	};
	unsigned long timeout = DEFAULT_TIMEOUT;
	const char *store;
	char *end;
	int c, fd, ret;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 't') {
			errno = 0;
			timeout = strtoul(optarg, &end, 10);
			if (*optarg == '\0' || *end != '\0' || errno != 0 ||
			    timeout == 0 || timeout > 86400 * 7)
				return adm_usage_error(&adm_verb_purge,
						       "purge: bad --timeout '%s'",
						       optarg);
			continue;
		}
		return adm_usage_error(&adm_verb_purge,
				       "purge: unknown option '%s'",
				       argv[optind - 1]);
	}
	if (argc - optind != 1)
		return adm_usage_error(&adm_verb_purge, "purge: need STORE");
	if ((ret = adm_store_enter(argv[optind])) != 0)
		return ret;
	store = argv[optind];
	/* Held by a mount (or another dboxadm): ask it.  Free, or held by a
	   mount that is closing: purge here (opening the store waits for
	   the closing mount); should a mount take the lock in between, ask
	   that one. */
	if ((fd = open_lock(store, "purge")) == -2)
		return ADM_EXIT_USAGE;
	if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) < 0 && errno == EWOULDBLOCK &&
	    !dbox_store_lock_is_closing(fd)) {
		ret = purge_online(store, fd, timeout);
	} else {
		if (fd >= 0)
			close(fd);
		fd = -1;
		ret = purge_offline(store);
		if (ret == -EBUSY) {
			if ((fd = open_lock(store, "purge")) < 0)
				ret = ADM_EXIT_USAGE;
			else
				ret = purge_online(store, fd, timeout);
		} else if (ret < 0) {
			ret = ADM_EXIT_USAGE; /* refused; the store said why */
		}
	}
	if (fd >= 0)
		close(fd);
	if (ret == 0 && fflush(stdout) != 0)
		ret = ADM_EXIT_FAILED;
	return ret;
}

const struct adm_verb adm_verb_purge = {
	.name = "purge",
	.summary = "give back the space of expunged messages (mounted or not)",
	.usage =
	"usage: dboxadm purge STORE [--timeout=SECONDS]\n"
	"\n"
	"Copy the live messages of every storage/m.N that holds expunged or\n"
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

/*
 * dboxadm altmove STORE --older-than=DAYS [--folder=DIR] [--alt=PATH]
 *                 [--timeout=SECONDS]
 * Move messages to the alternate storage (engine/purge.h dbox_altmove),
 * here when STORE is not mounted, else by the mount (the request goes
 * into the index, then SIGUSR1, as for purge).
 */

struct altmove_args {
	const char *store, *folder, *alt;
	int64_t before_ns;
	unsigned long timeout;
};

static void print_altmove(const struct dbox_purge_result *res)
{
	printf("records moved       %llu (%llu bytes)\n"
	       "files emptied       %llu (%llu bytes, removed)\n",
	       (unsigned long long)res->records_moved,
	       (unsigned long long)res->bytes_moved,
	       (unsigned long long)res->files_purged,
	       (unsigned long long)res->bytes_freed);
}

/* The directory ino of folder (a path as on the mount: "INBOX" or "" is
   the root, ".Sent" a Maildir++ folder, "a/b" a nested one), or 0 after
   reporting that there is none. */
static uint64_t folder_ino(struct dbox_index *index, const char *store,
			   const char *folder)
{
	uint64_t ino = DBOX_ROOT_INO;
	const char *p = folder;

	if (strcmp(folder, "INBOX") == 0)
		return ino;
	while (*p != '\0') {
		size_t len = strcspn(p, "/");
		struct dbox_attr attr;

		if (len > 0) {
			if (dbox_index_lookup(index, ino, p, len, &attr) < 0 ||
			    attr.kind != DBOX_KIND_DIR) {
				adm_error("%s: no folder '%s'", store, folder);
				return 0;
			}
			ino = attr.ino;
		}
		p += len;
		if (*p == '/')
			p++;
	}
	return ino;
}

struct altmove_progress {
	struct progress pr;
	uint64_t records, bytes;
};

static void altmove_progress_cb(void *ctx, const struct dbox_purge_result *res)
{
	struct altmove_progress *ap = ctx;

	progress_add(&ap->pr, res->records_moved - ap->records,
		     res->bytes_moved - ap->bytes);
	ap->records = res->records_moved;
	ap->bytes = res->bytes_moved;
}

static int altmove_offline(const struct altmove_args *a)
{
	struct dbox_store_settings set = { .create = false,
					   .alt_path = a->alt };
	struct dbox_purge_settings ps = { .altmove = true,
					  .altmove_before_ns = a->before_ns,
					  .progress = altmove_progress_cb };
	struct altmove_progress ap = { 0 };
	struct dbox_purge_result res, purged;
	struct dbox_store *st = NULL;
	int ret;

	if ((ret = dbox_store_open(a->store, &set, &st)) < 0)
		return ret; /* logged */
	if (st->alt_path == NULL) {
		adm_error("%s: no alternate storage: give --alt=PATH (it is "
			  "recorded in the store)", a->store);
		dbox_store_close(&st);
		return ADM_EXIT_USAGE;
	}
	if (a->alt != NULL && strcmp(st->alt_path, a->alt) != 0) {
		/* Refused (logged): nothing moved, nothing recorded. */
		dbox_store_close(&st);
		return ADM_EXIT_USAGE;
	}
	if (a->folder != NULL &&
	    (ps.altmove_folder = folder_ino(st->index, a->store,
					    a->folder)) == 0) {
		dbox_store_close(&st);
		return ADM_EXIT_USAGE;
	}
	ps.hook_ctx = &ap;
	progress_init(&ap.pr, "moved");
	ret = dbox_altmove(st, &ps, &res, &purged);
	progress_finish(&ap.pr);
	dbox_store_close(&st);
	print_altmove(&res);
	if (ret == -ENOENT)
		return ADM_EXIT_USAGE; /* no usable ALT: logged */
	if (ret < 0) {
		adm_error("%s: altmove failed: %s (see above); run it again "
			  "to finish", a->store, strerror(-ret));
		return ADM_EXIT_FAILED;
	}
	return ADM_EXIT_OK;
}

static int altmove_online(const struct altmove_args *a, int lock_fd)
{
	struct dbox_index *index = NULL;
	struct dbox_purge_result res = { 0 };
	struct altmove_progress ap = { 0 };
	uint64_t folder = 0;
	int64_t t0, deadline;
	char *recorded = NULL;
	pid_t pid = 0;
	int pidfd = mount_pid(a->store, lock_fd, &pid);
	int ret;

	if (pidfd < 0)
		return ADM_EXIT_USAGE;
	if ((ret = adm_open_index(a->store, &index)) != 0) {
		close(pidfd);
		return ret;
	}
	ret = dbox_index_setting_get(index, DBOX_SETTING_ALT_PATH, &recorded);
	if (ret < 0 || (a->alt != NULL && strcmp(recorded, a->alt) != 0)) {
		adm_error("%s: the mount %s; mount it with -o alt=%s", a->store,
			  ret < 0 ? "has no alternate storage" :
			  "uses another alternate storage",
			  a->alt != NULL ? a->alt : "PATH");
		ret = ADM_EXIT_USAGE;
		goto out;
	}
	if (a->folder != NULL &&
	    (folder = folder_ino(index, a->store, a->folder)) == 0) {
		ret = ADM_EXIT_USAGE;
		goto out;
	}
	t0 = dbox_now_ns();
	if ((ret = dbox_index_begin(index)) == 0) {
		if ((ret = dbox_index_meta_set(index, DBOX_META_ALTMOVE_BEFORE,
					       a->before_ns)) == 0 &&
		    (ret = dbox_index_meta_set(index, DBOX_META_ALTMOVE_FOLDER,
					       (int64_t)folder)) == 0 &&
		    (ret = dbox_index_meta_set(index, DBOX_META_ALTMOVE_REQUEST,
					       t0)) == 0)
			ret = dbox_index_commit(index, true);
		else
			dbox_index_rollback(index);
	}
	if (ret < 0) {
		adm_error("%s: cannot write the request into the index: %s",
			  a->store, strerror(-ret));
		ret = ADM_EXIT_FAILED;
		goto out;
	}
	if ((ret = pid_signal(pidfd, SIGUSR1)) < 0) {
		adm_error("%s: cannot signal the mount (pid %d): %s", a->store,
			  (int)pid, strerror(-ret));
		ret = ADM_EXIT_FAILED;
		goto out;
	}
	deadline = t0 + (int64_t)a->timeout * 1000000000;
	progress_init(&ap.pr, "moved");
	for (;;) {
		struct timespec ts = { 0, POLL_MS * 1000000L };

		if (meta(index, DBOX_META_ALTMOVE_DONE) >= t0)
			break;
		if (dbox_index_snapshot_begin(index) == 0) {
			if (meta(index, DBOX_META_ALTMOVE_PROGRESS_REQUEST) == t0) {
				res.records_moved = (uint64_t)meta(index,
					DBOX_META_ALTMOVE_PROGRESS_RECORDS);
				res.bytes_moved = (uint64_t)meta(index,
					DBOX_META_ALTMOVE_PROGRESS_BYTES);
				altmove_progress_cb(&ap, &res);
			}
			dbox_index_snapshot_end(index);
		}
		if (pid_signal(pidfd, 0) == -ESRCH) {
			adm_error("%s: the mount (pid %d) went away during the "
				  "altmove; run it again", a->store, (int)pid);
			ret = ADM_EXIT_FAILED;
			goto out;
		}
		if (dbox_now_ns() > deadline) {
			adm_error("%s: the mount has not finished the altmove "
				  "after %lu s; it goes on in the background",
				  a->store, a->timeout);
			ret = ADM_EXIT_FAILED;
			goto out;
		}
		nanosleep(&ts, NULL);
	}
	progress_finish(&ap.pr);
	ap.pr.enabled = false; /* finished: not again at out */
	if ((ret = dbox_index_snapshot_begin(index)) == 0) {
		res.error = (int)meta(index, DBOX_META_ALTMOVE_ERROR);
		res.records_moved = (uint64_t)meta(index, DBOX_META_ALTMOVE_RECORDS);
		res.bytes_moved = (uint64_t)meta(index, DBOX_META_ALTMOVE_BYTES);
		res.files_purged = (uint64_t)meta(index, DBOX_META_ALTMOVE_FILES);
		dbox_index_snapshot_end(index);
	}
	printf("moved by the mount (pid %d)\n", (int)pid);
	print_altmove(&res);
	ret = ADM_EXIT_OK;
	if (res.error != 0) {
		adm_error("%s: the mount's altmove failed (%s); the mount's log "
			  "(syslog) says why", a->store, strerror(-res.error));
		ret = ADM_EXIT_FAILED;
	}
out:
	progress_finish(&ap.pr); /* the line ends before we return */
	free(recorded);
	dbox_index_close(&index);
	close(pidfd);
	return ret;
}

static int altmove_main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "older-than", required_argument, NULL, 'o' },
		{ "folder", required_argument, NULL, 'f' },
		{ "alt", required_argument, NULL, 'a' },
		{ "timeout", required_argument, NULL, 't' },
		{ 0 },
	};
	struct altmove_args a = { .timeout = DEFAULT_TIMEOUT };
	char *end, *abs_alt = NULL;
	unsigned long days = 0;
	bool have_age = false;
	int c, fd, ret;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'o':
			errno = 0;
			days = strtoul(optarg, &end, 10);
			if (*optarg == '\0' || *end != '\0' || errno != 0 ||
			    days > 100000)
				return adm_usage_error(&adm_verb_altmove,
						       "altmove: bad --older-than "
						       "'%s'", optarg);
			have_age = true;
			continue;
		case 'f':
			a.folder = optarg;
			continue;
		case 'a':
			a.alt = optarg;
			continue;
		case 't':
			errno = 0;
			a.timeout = strtoul(optarg, &end, 10);
			if (*optarg == '\0' || *end != '\0' || errno != 0 ||
			    a.timeout == 0 || a.timeout > 86400 * 7)
				return adm_usage_error(&adm_verb_altmove,
						       "altmove: bad --timeout "
						       "'%s'", optarg);
			continue;
		}
		return adm_usage_error(&adm_verb_altmove,
				       "altmove: unknown option '%s'",
				       argv[optind - 1]);
	}
	if (argc - optind != 1)
		return adm_usage_error(&adm_verb_altmove, "altmove: need STORE");
	if (!have_age && a.folder == NULL)
		return adm_usage_error(&adm_verb_altmove, "altmove: need "
				       "--older-than=DAYS and/or --folder=DIR");
	/* In the index's time encoding (index.h, dbox_time_make); INT64_MAX:
	   no age limit. */
	a.before_ns = have_age ? dbox_time_make(dbox_time_sec(dbox_now_ns()) -
						(int64_t)days * 86400, 0) :
		INT64_MAX;
	if (a.alt != NULL && a.alt[0] != '/') {
		if ((abs_alt = realpath(a.alt, NULL)) == NULL) {
			adm_error("--alt=%s: %s", a.alt, strerror(errno));
			return ADM_EXIT_USAGE;
		}
		a.alt = abs_alt;
	}
	if ((ret = adm_store_enter(argv[optind])) != 0) {
		free(abs_alt);
		return ret;
	}
	a.store = argv[optind];
	if ((fd = open_lock(a.store, "altmove")) == -2) {
		free(abs_alt);
		return ADM_EXIT_USAGE;
	}
	if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) < 0 && errno == EWOULDBLOCK &&
	    !dbox_store_lock_is_closing(fd)) {
		ret = altmove_online(&a, fd);
	} else {
		if (fd >= 0)
			close(fd);
		fd = -1;
		ret = altmove_offline(&a);
		if (ret == -EBUSY) {
			if ((fd = open_lock(a.store, "altmove")) < 0)
				ret = ADM_EXIT_USAGE;
			else
				ret = altmove_online(&a, fd);
		} else if (ret < 0) {
			ret = ADM_EXIT_USAGE; /* refused; the store said why */
		}
	}
	if (fd >= 0)
		close(fd);
	free(abs_alt);
	if (ret == 0 && fflush(stdout) != 0)
		ret = ADM_EXIT_FAILED;
	return ret;
}

const struct adm_verb adm_verb_altmove = {
	.name = "altmove",
	.summary = "move old messages to the alternate storage (mounted or not)",
	.usage =
	"usage: dboxadm altmove STORE --older-than=DAYS [--folder=DIR]\n"
	"                       [--alt=PATH] [--timeout=SECONDS]\n"
	"\n"
	"Move messages received more than DAYS days ago (and/or those with a name\n"
	"in folder DIR: \"INBOX\", \".Sent\", a nested \"a/b\") to new m.N files in\n"
	"the alternate storage ALT/storage/, as Dovecot's 'doveadm altmove' does\n"
	"for mdbox ALT=.  Each m.N's moved records are copied and synced, then\n"
	"its index rows switched in one transaction; a file left empty is\n"
	"removed, one left partly dead is purged afterwards.  Killed at any\n"
	"moment, nothing is lost or doubled: run it again.  Names, inodes,\n"
	"sizes and dates do not change.\n"
	"\n"
	"--alt=PATH sets the alternate storage and records it in the store\n"
	"(dboxfs -o alt= does the same); without it the recorded one is used.\n"
	"When STORE is mounted, the mount does the move (it must have been\n"
	"mounted with that ALT) and dboxadm waits up to --timeout seconds\n"
	"(default 600).\n"
	"\n"
	"Exit status: 0 moved, 1 some m.N could not be moved (named on stderr or\n"
	"in the mount's log), 2 usage error, store refused or no alternate\n"
	"storage.\n",
	.run = altmove_main,
};
