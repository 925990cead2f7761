/*
 * test-store-owner.c: unit tests of whose store a path names for a
 * process of root's (engine/store-dirs.h, dbox_store_owner_find), the one
 * decision the mount (fs/main.c) and dboxadm (tools/dboxadm/main.c) both
 * act on: root's own directory, a user's, a store to be made in a user's
 * directory, root's directory reached through a user's link, a user's
 * reached through a third user's (refused), and a path switched after
 * the decision.  Users here are uids without a passwd entry, so the group
 * is the directory's; needs root (chown), skipped otherwise.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "engine/store-dirs.h"
#include "test-common.h"

#include <errno.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Two uids and a gid that no passwd entry on a test machine has. */
enum { USER_A = 54321, USER_B = 54322, GROUP_A = 54323 };

static char top[64];

static char *at(const char *name)
{
	static char buf[4][160];
	static int next;
	char *p = buf[next++ % 4];

	snprintf(p, sizeof(buf[0]), "%s/%s", top, name);
	return p;
}

static void mkdir_owned(const char *name, uid_t uid, gid_t gid)
{
	assert_int_equal(mkdir(at(name), 0755), 0);
	assert_int_equal(chown(at(name), uid, gid), 0);
}

static void link_owned(const char *target, const char *name, uid_t uid)
{
	assert_int_equal(symlink(at(target), at(name)), 0);
	assert_int_equal(lchown(at(name), uid, (gid_t)-1), 0);
}

static int setup(void **state)
{
	(void)state;
	if (geteuid() != 0)
		return 0;
	if (getpwuid(USER_A) != NULL || getpwuid(USER_B) != NULL)
		return -1; /* the test needs uids without an entry */
	tmpdir_make(top, sizeof(top), "test-store-owner");
	mkdir_owned("rootstore", 0, 0);
	mkdir_owned("a", USER_A, GROUP_A);
	mkdir_owned("a/store", USER_A, GROUP_A);
	mkdir_owned("b", USER_B, USER_B);
	link_owned("rootstore", "a/rootlink", USER_A);
	link_owned("a/store", "b/alink", USER_B);
	link_owned("a", "b/adir", USER_B);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	if (top[0] != '\0')
		rm_rf(top);
	return 0;
}

static void need_root(void)
{
	if (geteuid() != 0)
		skip();
}

static void test_roots_own_store(void **state)
{
	struct dbox_store_owner o;

	(void)state;
	need_root();
	assert_int_equal(dbox_store_owner_find(at("rootstore"), &o), 0);
	assert_int_equal(o.uid, 0);
	assert_false(o.new_store);
	dbox_store_owner_free(&o);
}

static void test_users_store_and_a_new_one_in_their_directory(void **state)
{
	struct dbox_store_owner o;

	(void)state;
	need_root();
	assert_int_equal(dbox_store_owner_find(at("a/store"), &o), 0);
	assert_int_equal(o.uid, USER_A);
	assert_int_equal(o.gid, GROUP_A);
	assert_false(o.new_store);
	assert_int_equal(dbox_store_owner_still(&o), 0);
	dbox_store_owner_free(&o);

	/* Not there yet: the directory it is to be made in decides. */
	assert_int_equal(dbox_store_owner_find(at("a/new//"), &o), 0);
	assert_int_equal(o.uid, USER_A);
	assert_true(o.new_store);
	assert_string_equal(o.what, at("a"));
	dbox_store_owner_free(&o);
	dbox_store_owner_free(&o); /* twice is harmless */
}

static void test_roots_directory_through_a_users_link_is_theirs(void **state)
{
	struct dbox_store_owner o;

	(void)state;
	need_root();
	assert_int_equal(dbox_store_owner_find(at("a/rootlink"), &o), 0);
	assert_int_equal(o.uid, USER_A);
	/* No passwd entry, and root's directory's group is not theirs. */
	assert_int_equal(o.gid, (gid_t)-1);
	dbox_store_owner_free(&o);
}

static void test_a_third_users_way_is_refused(void **state)
{
	struct dbox_store_owner o;

	(void)state;
	need_root();
	assert_int_equal(dbox_store_owner_find(at("b/alink"), &o), -EPERM);
	assert_int_equal(o.uid, USER_A);
	assert_int_equal(o.way, USER_B);
	dbox_store_owner_free(&o);
}

/* A third user's link anywhere on the way, not only as the last name
   (it was let through: the walk's first owner was the store's own). */
static void test_a_third_users_link_in_the_middle_is_refused(void **state)
{
	static const char *const ways[] = {
		"b/adir/store", "b/adir/store/", "b/adir/./store",
		"b/adir/../a/store", "b/alink/.", "b/adir/newstore",
	};
	struct dbox_store_owner o;
	char cwd[256];

	(void)state;
	need_root();
	for (size_t i = 0; i < sizeof(ways) / sizeof(ways[0]); i++) {
		assert_int_equal(dbox_store_owner_find(at(ways[i]), &o), -EPERM);
		assert_int_equal(o.uid, USER_A);
		assert_int_equal(o.way, USER_B);
		dbox_store_owner_free(&o);
	}
	/* Relative: the working directory's steps count too.  Root's
	   directory in a's directory is a's to switch: a's store (it was
	   root's, the cwd's steps unseen). */
	mkdir_owned("a/rootdir", 0, 0);
	assert_non_null(getcwd(cwd, sizeof(cwd)));
	assert_int_equal(chdir(at("a")), 0);
	assert_int_equal(dbox_store_owner_find("rootdir", &o), 0);
	assert_int_equal(o.uid, USER_A);
	dbox_store_owner_free(&o);
	assert_int_equal(chdir(cwd), 0);
}

/* Root's store acted on by name: its name must lie where no one else can
   put a link to another store first (a new store in /tmp lost that race
   to a user: helper-60).  A sticky directory keeps root's existing
   entry. */
static void test_roots_store_in_a_directory_others_write(void **state)
{
	struct dbox_store_owner o;

	(void)state;
	need_root();
	mkdir_owned("sticky", 0, 0);
	assert_int_equal(chmod(at("sticky"), 01777), 0);
	mkdir_owned("sticky/store", 0, 0);
	mkdir_owned("open", 0, 0);
	assert_int_equal(chmod(at("open"), 0777), 0);
	mkdir_owned("open/store", 0, 0);

	assert_int_equal(dbox_store_owner_find(at("sticky/store"), &o), 0);
	assert_int_equal(o.uid, 0);
	dbox_store_owner_free(&o);
	assert_int_equal(dbox_store_owner_find(at("sticky/new"), &o), -EPERM);
	assert_true(o.shared_dir);
	dbox_store_owner_free(&o);
	assert_int_equal(dbox_store_owner_find(at("open/store"), &o), -EPERM);
	assert_true(o.shared_dir);
	dbox_store_owner_free(&o);
	/* Group-writable: only a group other than root's counts. */
	mkdir_owned("rootgroup", 0, 0);
	assert_int_equal(chmod(at("rootgroup"), 0775), 0);
	assert_int_equal(dbox_store_owner_find(at("rootgroup/new"), &o), 0);
	dbox_store_owner_free(&o);
	mkdir_owned("usergroup", 0, GROUP_A);
	assert_int_equal(chmod(at("usergroup"), 0775), 0);
	assert_int_equal(dbox_store_owner_find(at("usergroup/new"), &o), -EPERM);
	assert_true(o.shared_dir);
	dbox_store_owner_free(&o);
	/* A user's store there is acted on as that user: no such rule. */
	mkdir_owned("sticky/astore", USER_A, GROUP_A);
	assert_int_equal(dbox_store_owner_find(at("sticky/astore"), &o), 0);
	assert_int_equal(o.uid, USER_A);
	dbox_store_owner_free(&o);
}

static void test_missing_and_not_a_directory_decide_nothing(void **state)
{
	struct dbox_store_owner o;
	FILE *f;

	(void)state;
	need_root();
	assert_int_equal(dbox_store_owner_find(at("none/store"), &o), -ENOENT);
	assert_int_equal(o.uid, 0);
	dbox_store_owner_free(&o);
	assert_non_null(f = fopen(at("plain"), "w"));
	fclose(f);
	assert_int_equal(dbox_store_owner_find(at("plain"), &o), -ENOTDIR);
	assert_int_equal(o.uid, 0);
	dbox_store_owner_free(&o);
}

static void test_a_path_switched_after_the_decision(void **state)
{
	struct dbox_store_owner o;

	(void)state;
	need_root();
	mkdir_owned("a/moving", USER_A, GROUP_A);
	assert_int_equal(dbox_store_owner_find(at("a/moving"), &o), 0);
	assert_int_equal(rename(at("a/moving"), at("a/moved")), 0);
	assert_int_equal(dbox_store_owner_still(&o), -ENOENT);
	mkdir_owned("a/moving", USER_A, GROUP_A);
	assert_int_equal(dbox_store_owner_still(&o), -ESTALE);
	dbox_store_owner_free(&o);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roots_own_store),
		cmocka_unit_test(test_users_store_and_a_new_one_in_their_directory),
		cmocka_unit_test(test_roots_directory_through_a_users_link_is_theirs),
		cmocka_unit_test(test_a_third_users_way_is_refused),
		cmocka_unit_test(test_a_third_users_link_in_the_middle_is_refused),
		cmocka_unit_test(test_roots_store_in_a_directory_others_write),
		cmocka_unit_test(test_missing_and_not_a_directory_decide_nothing),
		cmocka_unit_test(test_a_path_switched_after_the_decision),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
