/*
 * purge.c: dboxadm purge STORE [--timeout=SECONDS] - give back the bytes
 * of expunged and overwritten messages (index/purge.h):
 *
 *   not mounted  the store is opened (lock, recovery) and purged here;
 *   mounted      the mount is asked to purge: its daemon wrote its pid
 *                into STORE/lock; after checking that this process really
 *                holds STORE/lock open, SIGUSR1 is sent and the index
 *                (read without the lock) is polled until it records a
 *                requested purge that started after the signal, or the
 *                timeout passes (the purge then goes on in the daemon).
 *
 * Prints what was removed and moved on stdout, the same lines either way
 * (the mount records the outcome of a requested purge in the index).
 * Exit status: 0 purged, 1 some m.N could not be purged (or the mount
 * went away, or did not finish in time), 2 usage error or store refused.
 */
#include "dboxadm.h"

#include "index/index-stats.h"
#include "index/index.h"
#include "index/purge.h"
#include "index/store.h"
#include "index/store-lock.h"

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

/* Does process pid hold `path` open?  (Rules out a pid reused by an
   unrelated process after the mount went away.) */
static bool holds_open(pid_t pid, const char *path)
{
	char dirname[64], link[PATH_MAX + 1], fdpath[320];
	struct dirent *de;
	bool found = false;
	DIR *dir;

	snprintf(dirname, sizeof(dirname), "/proc/%d/fd", (int)pid);
	if ((dir = opendir(dirname)) == NULL)
		return false;
	while (!found && (de = readdir(dir)) != NULL) {
		ssize_t n;

		snprintf(fdpath, sizeof(fdpath), "%s/%s", dirname, de->d_name);
		n = readlink(fdpath, link, sizeof(link) - 1);
		if (n > 0) {
			link[n] = '\0';
			found = strcmp(link, path) == 0;
		}
	}
	closedir(dir);
	return found;
}

/* The pid of the mount of store, from STORE/lock.  Returns it, or 0 after
   reporting why there is none. */
static pid_t mount_pid(const char *lock_path)
{
	char buf[32] = "", *real;
	long pid = 0;
	ssize_t n;
	int fd;

	fd = open(lock_path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		n = read(fd, buf, sizeof(buf) - 1);
		buf[n > 0 ? n : 0] = '\0';
		close(fd);
		pid = strtol(buf, NULL, 10);
	}
	if (pid <= 0 || pid > INT_MAX) {
		adm_error("%s: the store is in use, but not by a dboxfs mount "
			  "that takes purge requests (another dboxadm?)",
			  lock_path);
		return 0;
	}
	real = realpath(lock_path, NULL);
	if (real == NULL || !holds_open((pid_t)pid, real)) {
		adm_error("%s: process %ld does not hold the store (%s)",
			  lock_path, pid, errno == EACCES || errno == EPERM ?
			  "permission denied: run as the mount's owner" :
			  "stale pid");
		free(real);
		return 0;
	}
	free(real);
	return (pid_t)pid;
}

static int64_t meta(struct dbox_index *index, const char *key)
{
	int64_t value = 0;

	return dbox_index_meta_get(index, key, &value) == 0 ? value : 0;
}

/* The outcome of the last requested purge, as the mount recorded it
   (index/purge.h), read in one snapshot.  Returns 0 or -EIO. */
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

static int purge_online(const char *store, const char *lock_path,
			unsigned int timeout)
{
	struct dbox_index *index = NULL;
	struct dbox_purge_result res;
	int64_t t0, deadline;
	pid_t pid = mount_pid(lock_path);
	int ret;

	if (pid == 0)
		return ADM_EXIT_USAGE;
	if ((ret = adm_open_index(store, &index)) != 0)
		return ret;
	t0 = dbox_now_ns();
	if (kill(pid, SIGUSR1) < 0) {
		adm_error("%s: cannot signal the mount (pid %d): %s", store,
			  (int)pid, strerror(errno));
		dbox_index_close(&index);
		return ADM_EXIT_FAILED;
	}
	deadline = t0 + (int64_t)timeout * 1000000000;
	for (;;) {
		struct timespec ts = { 0, POLL_MS * 1000000L };

		if (meta(index, DBOX_META_PURGE_REQUEST_START) >= t0)
			break;
		if (kill(pid, 0) < 0 && errno == ESRCH) {
			adm_error("%s: the mount (pid %d) went away during the "
				  "purge", store, (int)pid);
			dbox_index_close(&index);
			return ADM_EXIT_FAILED;
		}
		if (dbox_now_ns() > deadline) {
			adm_error("%s: the mount has not finished purging after "
				  "%u s; it goes on in the background", store,
				  timeout);
			dbox_index_close(&index);
			return ADM_EXIT_FAILED;
		}
		nanosleep(&ts, NULL);
	}
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

static int purge_main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "timeout", required_argument, NULL, 't' },
		{ 0 },
	};
	unsigned long timeout = DEFAULT_TIMEOUT;
	char *lock_path, *end;
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
	if (asprintf(&lock_path, "%s/lock", argv[optind]) < 0)
		return ADM_EXIT_FAILED;
	/* Held by a mount (or another dboxadm): ask it.  Free, or held by a
	   mount that is closing: purge here (opening the store waits for
	   the closing mount); should a mount take the lock in between, ask
	   that one. */
	fd = open(lock_path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) < 0 && errno == EWOULDBLOCK &&
	    !dbox_store_lock_is_closing(fd)) {
		ret = purge_online(argv[optind], lock_path, timeout);
	} else {
		if (fd >= 0)
			close(fd);
		fd = -1;
		ret = purge_offline(argv[optind]);
		if (ret == -EBUSY)
			ret = purge_online(argv[optind], lock_path, timeout);
		else if (ret < 0)
			ret = ADM_EXIT_USAGE; /* refused; the store said why */
	}
	if (fd >= 0)
		close(fd);
	free(lock_path);
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
