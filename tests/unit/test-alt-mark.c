/*
 * test-alt-mark.c: unit tests (cmocka) of the judgement of an alternate
 * storage by its mark (engine/alt-mark.h): every row of the table there,
 * the writes of a writable opener, and hostile marks (a link, a FIFO, a
 * damaged line).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/unit/test-common.h"
#include "engine/alt-mark.h"
#include "engine/store-layout.h"
#include "storage/dbox-file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ID_I "0123456789abcdef0123456789abcdef"
#define ID_J "fedcba9876543210fedcba9876543210"

struct fixture {
	char dir[256];
	int fd;          /* the ALT root */
	int storage_fd;  /* its storage/ */
};

static int setup(void **state)
{
	static struct fixture f;

	tmpdir_make(f.dir, sizeof(f.dir), "dboxfs-alt-mark");
	f.fd = open(f.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(f.fd >= 0);
	assert_int_equal(mkdirat(f.fd, DBOX_STORE_STORAGE, 0700), 0);
	f.storage_fd = openat(f.fd, DBOX_STORE_STORAGE, O_RDONLY | O_DIRECTORY);
	assert_true(f.storage_fd >= 0);
	dbox_log_set_sink(capture_sink);
	errors_reset();
	*state = &f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;

	close(f->storage_fd);
	close(f->fd);
	rm_rf(f->dir);
	return 0;
}

/* Put text as the ALT's mark. */
static void put_mark(struct fixture *f, const char *text)
{
	int fd = openat(f->fd, DBOX_ALT_MARK, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
}

/* The ALT's mark file as text ("" when none). */
static const char *mark_text(struct fixture *f)
{
	static char buf[128];
	int fd = openat(f->fd, DBOX_ALT_MARK, O_RDONLY);
	ssize_t n = fd < 0 ? 0 : read(fd, buf, sizeof(buf) - 1);

	if (fd >= 0)
		close(fd);
	buf[n > 0 ? n : 0] = '\0';
	return buf;
}

static int judge(struct fixture *f, const char *index_id, bool places,
		 bool write, struct dbox_alt_mark *mark)
{
	int ret;

	struct dbox_msgloc msg = mark->msg;
	bool has_msg = mark->has_msg;

	memset(mark, 0, sizeof(*mark));
	strcpy(mark->index_id, index_id);
	mark->index_places = places;
	mark->has_msg = has_msg;
	mark->msg = msg;
	mark->write = write;
	ret = dbox_alt_mark_judge(f->fd, f->storage_fd, f->dir, mark);
	if (ret == 0)
		dbox_alt_mark_write(f->fd, f->dir, mark);
	return ret;
}

static void test_the_table(void **state)
{
	struct fixture *f = *state;
	struct dbox_alt_mark m = { 0 };

	/* none, none: this store's; nothing written read-only. */
	assert_int_equal(judge(f, "", false, false, &m), 0);
	assert_string_equal(m.alt_id, "");
	assert_string_equal(mark_text(f), "");
	/* I, none: this store's. */
	assert_int_equal(judge(f, ID_I, true, false, &m), 0);
	put_mark(f, ID_I "\n");
	/* I, I: this store's, whether or not it places mail there. */
	assert_int_equal(judge(f, ID_I, true, false, &m), 0);
	assert_string_equal(m.alt_id, ID_I);
	assert_int_equal(judge(f, ID_I, false, false, &m), 0);
	/* J, I: another store's, either way, and said so. */
	errors_reset();
	assert_int_equal(judge(f, ID_J, true, false, &m), -EXDEV);
	assert_int_equal(judge(f, ID_J, false, true, &m), -EXDEV);
	assert_int_equal(error_count, 2);
	assert_non_null(strstr(last_error, "another store"));
	assert_string_equal(mark_text(f), ID_I "\n"); /* not overwritten */
	/* none, I: adopted when the index places mail there, else refused. */
	assert_int_equal(judge(f, "", true, false, &m), 0);
	assert_string_equal(m.alt_id, ID_I);
	assert_int_equal(judge(f, "", false, true, &m), -EXDEV);
}

/* Put m.<file_id> into the ALT's storage/ with one record of guid;
   returns the record's offset. */
static uint64_t put_record(struct fixture *f, uint32_t file_id,
			   const char *guid)
{
	struct dbox_metadata md = { 0 };
	struct dbox_append ap;
	uint64_t offset;
	int fd = dbox_file_create(f->storage_fd, file_id, &offset);

	assert_true(fd >= 0);
	snprintf(md.guid, sizeof(md.guid), "%s", guid);
	assert_int_equal(dbox_append_begin(&ap, fd, offset), 0);
	assert_int_equal(dbox_append_pwrite(&ap, "Subject: x\n\nbody\n", 18, 0), 0);
	assert_int_equal(dbox_append_finish(&ap, &md), 0);
	close(fd);
	return offset;
}

static void test_unmarked_alts_by_content(void **state)
{
	struct fixture *f = *state;
	struct dbox_alt_mark m = { 0 };

	/* The index's first ALT message is in this ALT: this store's, and
	   a writable open marks it. */
	m.has_msg = true;
	m.msg.file_id = 3;
	m.msg.offset = put_record(f, 3, ID_I);
	snprintf(m.msg.guid, sizeof(m.msg.guid), "%s", ID_I);
	assert_int_equal(judge(f, ID_J, true, true, &m), 0);
	assert_string_equal(mark_text(f), ID_J "\n");
	/* Another store's mail at that place (a typo, a switched link, an
	   ALT moved without its mark: helper-81): refused, not marked. */
	unlinkat(f->fd, DBOX_ALT_MARK, 0);
	snprintf(m.msg.guid, sizeof(m.msg.guid), "%s", ID_J);
	errors_reset();
	assert_int_equal(judge(f, ID_J, true, true, &m), -EXDEV);
	assert_int_equal(judge(f, "", true, true, &m), -EXDEV);
	assert_non_null(strstr(last_error, "another store"));
	assert_string_equal(mark_text(f), "");
	/* A record that does not read whole proves nothing: taken. */
	m.msg.offset += 5;
	assert_int_equal(judge(f, ID_J, true, false, &m), 0);
	/* No index mail there, but m.N in it: another store's. */
	m.has_msg = false;
	assert_int_equal(judge(f, ID_J, false, true, &m), -EXDEV);
	assert_int_equal(judge(f, "", false, true, &m), -EXDEV);
	assert_string_equal(mark_text(f), "");
	/* An empty storage/: a new ALT, marked. */
	assert_int_equal(unlinkat(f->storage_fd, "m.3", 0), 0);
	assert_int_equal(judge(f, "", false, true, &m), 0);
	assert_int_equal(strlen(mark_text(f)), 33);
}

static void test_writes_of_a_writable_open(void **state)
{
	struct fixture *f = *state;
	struct dbox_alt_mark m = { 0 };
	char first[33];

	/* Neither has one: a new id, written and reported. */
	assert_int_equal(judge(f, "", false, true, &m), 0);
	assert_int_equal(strlen(m.alt_id), 32);
	snprintf(first, sizeof(first), "%s", m.alt_id);
	assert_int_equal(strncmp(mark_text(f), first, 32), 0);
	assert_int_equal(strlen(mark_text(f)), 33);
	assert_int_equal(faccessat(f->fd, DBOX_ALT_MARK ".new", F_OK,
				   AT_SYMLINK_NOFOLLOW), -1);
	/* The index's id goes into an unmarked ALT. */
	unlinkat(f->fd, DBOX_ALT_MARK, 0);
	assert_int_equal(judge(f, ID_J, true, true, &m), 0);
	assert_string_equal(m.alt_id, ID_J);
	assert_string_equal(mark_text(f), ID_J "\n");
	/* Marked already: judged, not written again. */
	assert_int_equal(judge(f, ID_J, true, true, &m), 0);
	assert_string_equal(m.index_id, m.alt_id);
}

static void test_hostile_marks(void **state)
{
	struct fixture *f = *state;
	struct dbox_alt_mark m = { 0 };
	char target[300];

	/* Damaged lines are no mark: rewritten by a writable open. */
	put_mark(f, ID_I);                 /* no newline */
	assert_int_equal(judge(f, ID_J, true, false, &m), 0);
	assert_string_equal(m.alt_id, "");
	put_mark(f, "0123456789ABCDEF0123456789ABCDEF\n"); /* upper case */
	assert_int_equal(judge(f, ID_J, true, true, &m), 0);
	assert_string_equal(mark_text(f), ID_J "\n");
	put_mark(f, ID_I "\nmore\n");     /* longer than a line */
	assert_int_equal(judge(f, ID_J, true, false, &m), 0);
	assert_string_equal(m.alt_id, "");
	/* A symbolic link is not followed, read or written: its target,
	   a file of the right shape, stays as it was. */
	unlinkat(f->fd, DBOX_ALT_MARK, 0);
	snprintf(target, sizeof(target), "%s/elsewhere", f->dir);
	put_mark(f, ID_I "\n");
	assert_int_equal(renameat(f->fd, DBOX_ALT_MARK, f->fd, "elsewhere"), 0);
	assert_int_equal(symlinkat(target, f->fd, DBOX_ALT_MARK), 0);
	assert_int_equal(judge(f, ID_J, true, false, &m), 0);
	assert_string_equal(m.alt_id, "");
	assert_int_equal(symlinkat(target, f->fd, DBOX_ALT_MARK ".new"), 0);
	assert_int_equal(judge(f, ID_J, true, true, &m), 0);
	assert_string_equal(mark_text(f), ID_J "\n");
	{
		int fd = openat(f->fd, "elsewhere", O_RDONLY);
		char buf[64] = { 0 };

		assert_true(fd >= 0);
		assert_true(read(fd, buf, sizeof(buf) - 1) == 33);
		close(fd);
		assert_string_equal(buf, ID_I "\n");
	}
	/* A FIFO is not waited on. */
	unlinkat(f->fd, DBOX_ALT_MARK, 0);
	assert_int_equal(mkfifoat(f->fd, DBOX_ALT_MARK, 0600), 0);
	assert_int_equal(judge(f, ID_J, true, false, &m), 0);
	assert_string_equal(m.alt_id, "");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_the_table, setup, teardown),
		cmocka_unit_test_setup_teardown(test_writes_of_a_writable_open,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_unmarked_alts_by_content,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_hostile_marks, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
