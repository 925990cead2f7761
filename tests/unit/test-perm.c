/*
 * test-perm.c: unit tests (cmocka) of the POSIX permission rules the
 * daemon applies on a mount only its owner reaches (engine/perm.h).  The
 * same rules run against ext4 as real users in
 * tests/mounted/test_permissions_owner.py; these pin the corners a
 * mounted test reaches with difficulty (root's execute rule, when the
 * supplementary groups are asked for, the setgid drop).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "engine/perm.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>

enum { ALICE = 1000, BOB = 1001, TEAM = 2000, ALICE_G = 1000, CAROL_G = 3000 };

static int fetches;

/* dbox_cred_groups_cb_t: alice's supplementary group is TEAM. */
static int team_groups(struct dbox_cred *c)
{
	fetches++;
	c->groups = malloc(sizeof(*c->groups));
	if (c->groups == NULL)
		return -ENOMEM;
	c->groups[0] = TEAM;
	c->ngroups = 1;
	return 0;
}

static int failing_groups(struct dbox_cred *c)
{
	(void)c;
	fetches++;
	return -ESRCH;
}

static struct dbox_cred alice(void)
{
	fetches = 0;
	return (struct dbox_cred){
		.uid = ALICE, .gid = ALICE_G, .ngroups = -1, .fetch = team_groups,
	};
}

static struct dbox_cred root(void)
{
	return (struct dbox_cred){ .privileged = true, .ngroups = -1 };
}

static struct dbox_attr file(uint32_t uid, uint32_t gid, uint32_t mode)
{
	return (struct dbox_attr){
		.kind = DBOX_KIND_MESSAGE, .uid = uid, .gid = gid,
		.mode = S_IFREG | mode,
	};
}

static struct dbox_attr dir(uint32_t uid, uint32_t gid, uint32_t mode)
{
	return (struct dbox_attr){
		.kind = DBOX_KIND_DIR, .uid = uid, .gid = gid,
		.mode = S_IFDIR | mode,
	};
}

static void test_owner_class_wins(void **state)
{
	struct dbox_cred c = alice();
	struct dbox_attr a = file(ALICE, TEAM, 0077);

	(void)state;
	assert_int_equal(dbox_perm_may(&c, &a, DBOX_MAY_READ), -EACCES);
	a.mode = S_IFREG | 0400;
	assert_int_equal(dbox_perm_may(&c, &a, DBOX_MAY_READ), 0);
	assert_int_equal(dbox_perm_may(&c, &a, DBOX_MAY_WRITE), -EACCES);
	assert_int_equal(dbox_perm_may(&c, &a, 0), 0);
	assert_int_equal(fetches, 0); /* the owner needs no groups */
	dbox_cred_release(&c);
}

static void test_groups_fetched_once_and_only_when_they_matter(void **state)
{
	struct dbox_cred c = alice();
	struct dbox_attr same = file(BOB, CAROL_G, 0644);  /* group = other */
	struct dbox_attr team = file(BOB, TEAM, 0640);
	struct dbox_attr carol = file(BOB, CAROL_G, 0640);

	(void)state;
	assert_int_equal(dbox_perm_may(&c, &same, DBOX_MAY_READ), 0);
	assert_int_equal(fetches, 0);
	assert_int_equal(dbox_perm_may(&c, &team, DBOX_MAY_READ), 0);
	assert_int_equal(dbox_perm_may(&c, &carol, DBOX_MAY_READ), -EACCES);
	assert_int_equal(fetches, 1);
	dbox_cred_release(&c);
	assert_null(c.groups);
	assert_int_equal(c.ngroups, -1);
}

static void test_groups_unknown_count_as_none(void **state)
{
	struct dbox_cred c = alice();
	struct dbox_attr team = file(BOB, TEAM, 0640);

	(void)state;
	c.fetch = failing_groups;
	assert_int_equal(dbox_perm_may(&c, &team, DBOX_MAY_READ), -EACCES);
	assert_int_equal(dbox_perm_may(&c, &team, DBOX_MAY_READ), -EACCES);
	assert_int_equal(fetches, 1);
	/* The primary group needs no fetch. */
	team.gid = ALICE_G;
	assert_int_equal(dbox_perm_may(&c, &team, DBOX_MAY_READ), 0);
	dbox_cred_release(&c);
}

static void test_root_executes_only_with_an_x_bit(void **state)
{
	struct dbox_cred c = root();
	struct dbox_attr a = file(ALICE, TEAM, 0600);
	struct dbox_attr d = dir(ALICE, TEAM, 0);

	(void)state;
	assert_int_equal(dbox_perm_may(&c, &a, DBOX_MAY_READ | DBOX_MAY_WRITE), 0);
	assert_int_equal(dbox_perm_may(&c, &a, DBOX_MAY_EXEC), -EACCES);
	a.mode = S_IFREG | 0001;
	assert_int_equal(dbox_perm_may(&c, &a, DBOX_MAY_EXEC), 0);
	assert_int_equal(dbox_perm_may_create(&c, &d), 0);
	assert_int_equal(dbox_perm_may(&c, &d, DBOX_MAY_EXEC | DBOX_MAY_READ), 0);
}

static void test_create_and_delete(void **state)
{
	struct dbox_cred c = alice();
	struct dbox_attr d = dir(ALICE, ALICE_G, 0500);
	struct dbox_attr sticky = dir(BOB, TEAM, 01777);
	struct dbox_attr bobs = file(BOB, TEAM, 0666), mine = file(ALICE, TEAM, 0);
	struct dbox_attr f = file(ALICE, ALICE_G, 0777);

	(void)state;
	assert_int_equal(dbox_perm_may_create(&c, &d), -EACCES);
	assert_int_equal(dbox_perm_may_create(&c, &f), -ENOTDIR);
	d.mode = S_IFDIR | 0300;
	assert_int_equal(dbox_perm_may_create(&c, &d), 0);
	assert_int_equal(dbox_perm_may_delete(&c, &d, &bobs), 0);
	/* Sticky: the victim's or the directory's owner only, EPERM. */
	assert_int_equal(dbox_perm_may_delete(&c, &sticky, &bobs), -EPERM);
	assert_int_equal(dbox_perm_may_delete(&c, &sticky, &mine), 0);
	sticky.uid = ALICE;
	assert_int_equal(dbox_perm_may_delete(&c, &sticky, &bobs), 0);
	/* EACCES (no w) comes before EPERM (sticky). */
	sticky = dir(BOB, CAROL_G, 01755);
	assert_int_equal(dbox_perm_may_delete(&c, &sticky, &bobs), -EACCES);
	dbox_cred_release(&c);
}

static void test_protected_hardlinks(void **state)
{
	struct dbox_cred c = alice();
	struct dbox_attr rw = file(BOB, TEAM, 0660), ro = file(BOB, TEAM, 0640);
	struct dbox_attr suid = file(BOB, TEAM, 04666);

	(void)state;
	assert_int_equal(dbox_perm_may_link(&c, &rw, true), 0);
	assert_int_equal(dbox_perm_may_link(&c, &ro, true), -EPERM);
	assert_int_equal(dbox_perm_may_link(&c, &suid, true), -EPERM);
	assert_int_equal(dbox_perm_may_link(&c, &ro, false), 0);
	ro.uid = ALICE;
	assert_int_equal(dbox_perm_may_link(&c, &ro, true), 0);
	dbox_cred_release(&c);
}

static void test_chmod_drops_setgid_outside_the_group(void **state)
{
	struct dbox_cred c = alice(), r = root();
	struct dbox_attr a = file(ALICE, CAROL_G, 0644), bobs = file(BOB, TEAM, 0666);
	uint32_t mode = 02644;

	(void)state;
	assert_int_equal(dbox_perm_chmod(&c, &a, a.gid, &mode), 0);
	assert_int_equal(mode, 0644);
	mode = 02644;
	assert_int_equal(dbox_perm_chmod(&c, &a, TEAM, &mode), 0);
	assert_int_equal(mode, 02644);
	mode = 0600;
	assert_int_equal(dbox_perm_chmod(&c, &bobs, bobs.gid, &mode), -EPERM);
	mode = 02644;
	assert_int_equal(dbox_perm_chmod(&r, &a, a.gid, &mode), 0);
	assert_int_equal(mode, 02644);
	dbox_cred_release(&c);
}

static void test_chown_rules(void **state)
{
	struct dbox_cred c = alice(), r = root();
	struct dbox_attr a = file(ALICE, ALICE_G, 0644), bobs = file(BOB, TEAM, 0666);

	(void)state;
	assert_int_equal(dbox_perm_chown(&c, &a, ALICE, UINT32_MAX), 0);
	assert_int_equal(dbox_perm_chown(&c, &a, BOB, UINT32_MAX), -EPERM);
	assert_int_equal(dbox_perm_chown(&c, &a, UINT32_MAX, TEAM), 0);
	assert_int_equal(dbox_perm_chown(&c, &a, UINT32_MAX, CAROL_G), -EPERM);
	assert_int_equal(dbox_perm_chown(&c, &bobs, UINT32_MAX, TEAM), -EPERM);
	assert_int_equal(dbox_perm_chown(&r, &bobs, ALICE, CAROL_G), 0);
	dbox_cred_release(&c);
}

static void test_times(void **state)
{
	struct dbox_cred c = alice();
	struct dbox_attr mine = file(ALICE, ALICE_G, 0444);
	struct dbox_attr writable = file(BOB, TEAM, 0660), other = file(BOB, TEAM, 0644);

	(void)state;
	assert_int_equal(dbox_perm_times(&c, &mine, false), 0);
	assert_int_equal(dbox_perm_times(&c, &writable, true), 0);
	assert_int_equal(dbox_perm_times(&c, &writable, false), -EPERM);
	assert_int_equal(dbox_perm_times(&c, &other, true), -EACCES);
	dbox_cred_release(&c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_owner_class_wins),
		cmocka_unit_test(test_groups_fetched_once_and_only_when_they_matter),
		cmocka_unit_test(test_groups_unknown_count_as_none),
		cmocka_unit_test(test_root_executes_only_with_an_x_bit),
		cmocka_unit_test(test_create_and_delete),
		cmocka_unit_test(test_protected_hardlinks),
		cmocka_unit_test(test_chmod_drops_setgid_outside_the_group),
		cmocka_unit_test(test_chown_rules),
		cmocka_unit_test(test_times),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
