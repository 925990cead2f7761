/*
 * test-store-holder.c: unit tests of the proof that the process named by
 * a store's lock is its dboxfs mount (engine/store-holder.h), the parts
 * that run without a mount: the pid in the lock text, a stale pid, a live
 * process that holds the lock but is no dboxfs (refused, and not
 * signalled: it is still alive), and the /proc readers on this process.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "engine/store-holder.h"
#include "engine/store-layout.h"
#include "engine/store-lock.h"
#include "test-common.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

struct fix {
	char dir[64];
	char lock[128];
	int fd;
};

static int fix_setup(void **state)
{
	static struct fix f;

	tmpdir_make(f.dir, sizeof(f.dir), "test-store-holder");
	snprintf(f.lock, sizeof(f.lock), "%s/" DBOX_STORE_LOCK, f.dir);
	f.fd = open(f.lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	assert_true(f.fd >= 0);
	*state = &f;
	return 0;
}

static int fix_teardown(void **state)
{
	struct fix *f = *state;

	close(f->fd);
	rm_rf(f->dir);
	return 0;
}

static void set_text(struct fix *f, const char *text)
{
	assert_int_equal(ftruncate(f->fd, 0), 0);
	assert_int_equal(pwrite(f->fd, text, strlen(text), 0),
			 (ssize_t)strlen(text));
}

static void test_read_pid(void **state)
{
	struct fix *f = *state;
	pid_t pid = 0;

	set_text(f, "4242\n");
	assert_int_equal(dbox_holder_read_pid(f->fd, &pid), 0);
	assert_int_equal(pid, 4242);
	for (size_t i = 0; i < 5; i++) {
		static const char *const bad[] = {
			"", "closing\n", "4242", "1\n", "42x\n",
		};

		set_text(f, bad[i]);
		assert_int_equal(dbox_holder_read_pid(f->fd, &pid), -EINVAL);
	}
}

/* The mount point line after the pid (store-lock.h): absolute, whole,
   fitting the buffer, or none. */
static void test_read_mountpoint(void **state)
{
	struct fix *f = *state;
	char buf[16];
	pid_t pid = 0;

	set_text(f, "4242\n/home/u/mnt\n");
	assert_int_equal(dbox_holder_read_pid(f->fd, &pid), 0);
	assert_int_equal(pid, 4242);
	assert_int_equal(dbox_holder_read_mountpoint(f->fd, buf, sizeof(buf)), 0);
	assert_string_equal(buf, "/home/u/mnt");
	assert_int_equal(dbox_holder_read_mountpoint(f->fd, buf, 11), -EINVAL);
	for (size_t i = 0; i < 5; i++) {
		static const char *const bad[] = {
			"4242\n", "4242\nmnt\n", "4242\n/mnt", "closing\n", "",
		};

		set_text(f, bad[i]);
		assert_int_equal(dbox_holder_read_mountpoint(f->fd, buf,
							     sizeof(buf)),
				 -EINVAL);
	}
}

static void test_no_pid_refused(void **state)
{
	struct fix *f = *state;
	struct dbox_holder h;

	set_text(f, "closing\n");
	assert_int_equal(dbox_holder_prove(f->fd, &h), -EINVAL);
	assert_int_equal(h.why, DBOX_HOLDER_NO_PID);
	assert_int_equal(h.pidfd, -1);
}

static void test_stale_pid_refused(void **state)
{
	struct fix *f = *state;
	struct dbox_holder h;
	char text[32];
	pid_t pid = fork();

	assert_true(pid >= 0);
	if (pid == 0)
		_exit(0);
	assert_int_equal(waitpid(pid, NULL, 0), pid);
	snprintf(text, sizeof(text), "%d\n", (int)pid);
	set_text(f, text);
	assert_int_equal(dbox_holder_prove(f->fd, &h), -ESRCH);
	assert_int_equal(h.why, DBOX_HOLDER_STALE);
	assert_int_equal(h.pid, pid);
	assert_int_equal(h.pidfd, -1);
}

/* A live process that holds the lock (flock) and a FUSE device and names
   itself in the lock, as a mount does, but is no dboxfs: refused, and
   never signalled. */
static void test_holder_not_dboxfs_refused(void **state)
{
	struct fix *f = *state;
	struct dbox_holder h;
	struct stat sb;
	char text[32];
	int ready[2], status;
	pid_t pid;

	assert_int_equal(pipe(ready), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		/* Gone with the test, should an assertion end it first. */
		int dies = prctl(PR_SET_PDEATHSIG, SIGKILL);
		int dir = open(f->dir, O_RDONLY | O_DIRECTORY);
		bool held = false;
		int fd = dbox_store_lock_try(dir, false, &held);
		int fuse = open("/dev/fuse", O_RDWR);

		if (dies < 0 || fd < 0 || !held)
			_exit(1);
		(void)write(ready[1], fuse >= 0 ? "f" : "x", 1);
		pause();
		_exit(0);
	}
	close(ready[1]);
	assert_int_equal(read(ready[0], text, 1), 1);
	close(ready[0]);
	assert_int_equal(fstat(f->fd, &sb), 0);
	/* Holding both is not enough: the program must be dboxfs. */
	if (text[0] == 'f')
		assert_int_equal(dbox_holder_holds(pid, &sb), 1);
	snprintf(text, sizeof(text), "%d\n", (int)pid);
	set_text(f, text);
	assert_int_equal(dbox_holder_runs_dboxfs(pid), 0);
	assert_int_equal(dbox_holder_prove(f->fd, &h), -EPERM);
	assert_int_equal(h.why, DBOX_HOLDER_NOT_MOUNT);
	assert_int_equal(h.pidfd, -1);
	/* Still alive: nothing was sent to it. */
	assert_int_equal(waitpid(pid, &status, WNOHANG), 0);
	assert_int_equal(kill(pid, SIGTERM), 0);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
}

/* This process holds the lock file open but no FUSE device. */
static void test_proc_readers_on_self(void **state)
{
	struct fix *f = *state;
	struct stat sb, other;
	int fd, ret;

	assert_int_equal(fstat(f->fd, &sb), 0);
	ret = dbox_holder_holds(getpid(), &sb);
	assert_true(ret == 0 || ret == -ENODEV);
	assert_int_equal(dbox_holder_runs_dboxfs(getpid()), 0);
	assert_int_equal(dbox_holder_euid(getpid()), (long)geteuid());
	/* A file this process does not hold is not the lock it holds. */
	fd = open(f->dir, O_RDONLY | O_DIRECTORY);
	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &other), 0);
	close(fd);
	ret = dbox_holder_holds(getpid(), &other);
	assert_true(ret == 0 || ret == -ENODEV);
	assert_true(dbox_holder_euid(-1) < 0);
}

/* A "closing" a mount left in STORE/lock after its unmount is emptied by
   the next process that takes the lock exclusively (an offline dboxadm):
   a third process then finds the store in use, not a mount closing. */
static void test_lock_empties_stale_text(void **state)
{
	struct fix *f = *state;
	int dir_fd = open(f->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct stat sb;
	int fd;

	assert_true(dir_fd >= 0);
	set_text(f, "closing\n");
	assert_true(dbox_store_lock_is_closing(f->fd));
	fd = dbox_store_lock(dir_fd, f->dir);
	assert_true(fd >= 0);
	assert_int_equal(fstat(f->fd, &sb), 0);
	assert_int_equal(sb.st_size, 0);
	assert_false(dbox_store_lock_is_closing(f->fd));
	assert_int_equal(dbox_store_lock(dir_fd, f->dir), -EBUSY);
	close(fd);
	close(dir_fd);
}

/* A holder may remove STORE/lock while it holds it (a failed first mount
   takes its new store away): a process waiting for the lock then gets
   the lock of the unlinked file, which the next process never opens.
   dbox_store_lock must lock the store's lock file anew then. */
static void test_waiter_locks_a_replaced_lock_file_anew(void **state)
{
	struct fix *f = *state;
	int dir_fd = open(f->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int sync_pipe[2], fd;
	struct stat a, b;
	char c;
	pid_t pid;

	assert_true(dir_fd >= 0);
	assert_int_equal(pipe(sync_pipe), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int held = dbox_store_lock(dir_fd, f->dir);

		if (held < 0 || write(sync_pipe[1], "x", 1) != 1)
			_exit(1);
		usleep(200 * 1000); /* the parent waits (500 ms at most) */
		unlink(f->lock);
		_exit(0);           /* the lock goes with the process */
	}
	close(sync_pipe[1]);
	assert_int_equal(read(sync_pipe[0], &c, 1), 1);
	close(sync_pipe[0]);
	fd = dbox_store_lock(dir_fd, f->dir);
	assert_int_equal(waitpid(pid, NULL, 0), pid);
	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &a), 0);
	assert_int_equal(stat(f->lock, &b), 0);
	assert_int_equal(a.st_nlink, 1);
	assert_true(a.st_ino == b.st_ino && a.st_dev == b.st_dev);
	close(fd);
	close(dir_fd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_read_pid, fix_setup,
						fix_teardown),
		cmocka_unit_test_setup_teardown(test_read_mountpoint, fix_setup,
						fix_teardown),
		cmocka_unit_test_setup_teardown(test_no_pid_refused, fix_setup,
						fix_teardown),
		cmocka_unit_test_setup_teardown(test_stale_pid_refused,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_holder_not_dboxfs_refused,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_proc_readers_on_self,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_lock_empties_stale_text,
						fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(
			test_waiter_locks_a_replaced_lock_file_anew, fix_setup,
			fix_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
