/*
 * test-stats.c: unit tests, with cmocka, of engine/stats.h (what dboxadm
 * stats prints) on a real store (test-common.h's tree): the index's
 * totals, the m.N on disk joined to the index, the folders, bytes past a
 * committed end (pending) and in an m.N the index does not know (dead),
 * and an unreadable storage/.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "engine/stats.h"
#include "engine/view.h"
#include "storage/dbox-file.h"
#include "test-common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static void test_stats(void **state)
{
	struct tree_fix *f = *state;
	struct dbox_stats st;
	uint64_t live = 0, committed;
	char *path;
	struct stat sb;
	int fd;

	tree_build(f, false);
	tree_open_view(f);
	assert_int_equal(dbox_stats_get(f->view, true, &st), 0);
	for (int i = 0; i < TREE_NMSG; i++)
		live += f->loc[i].record_size;
	assert_int_equal(st.ix.messages, 3);
	assert_int_equal(st.ix.message_names, 4);
	assert_int_equal(st.ix.writing, 1);
	assert_int_equal(st.ix.live_record_bytes, live);
	assert_int_equal(st.ix.files, 1);
	assert_int_equal(st.mfiles, 1);
	assert_int_equal(st.alt_mfiles, 0);
	path = tree_path(f, "storage/m.1");
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal(st.mfile_bytes, (uint64_t)sb.st_size);
	assert_int_equal(st.dead_bytes, 0);
	assert_int_equal(st.pending_bytes, 0);
	assert_int_equal(st.nfolders, 1);
	assert_string_equal(st.folders[0].name, "INBOX");
	assert_string_equal(st.folders[0].display, "INBOX");
	assert_int_equal(st.folders[0].count, 4);
	assert_int_equal(st.nfiles, 1);
	assert_int_equal(st.files[0].file_id, 1);
	assert_true(st.files[0].in_index);
	assert_int_equal(st.files[0].usage.live_bytes, live);
	assert_int_equal(dbox_stats_mfile_dead(&st.files[0]), 0);
	assert_int_equal(st.purge_runs, 0);
	assert_true(st.purge_moved_known);
	dbox_stats_free(&st);

	/* Bytes past the committed end are pending, not dead; an m.N the
	   index does not know is dead all but its header. */
	assert_int_equal(dbox_index_mfile_get(f->view->index, 1, &committed), 0);
	fd = open(path, O_WRONLY | O_APPEND);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "partial", 7), 7);
	close(fd);
	free(path);
	fd = dbox_file_create(f->view->storage_fd, 5, &committed);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, "garbage", 7, (off_t)committed), 7);
	close(fd);
	assert_int_equal(dbox_stats_get(f->view, true, &st), 0);
	assert_int_equal(st.mfiles, 2);
	assert_int_equal(st.pending_bytes, 7);
	assert_int_equal(st.dead_bytes, 7);
	assert_int_equal(st.nfiles, 2);
	assert_int_equal(st.files[1].file_id, 5);
	assert_false(st.files[1].in_index);
	assert_int_equal(dbox_stats_mfile_dead(&st.files[1]), 7);
	dbox_stats_free(&st);

	/* storage/ that is no directory: the error comes back. */
	dbox_view_close(&f->view);
	path = tree_path(f, "storage");
	rm_rf(path);
	close(open(path, O_CREAT | O_WRONLY, 0600));
	free(path);
	tree_open_view(f);
	assert_int_equal(f->view->storage_err, -ENOTDIR);
	assert_int_equal(dbox_stats_get(f->view, false, &st), -ENOTDIR);
	dbox_stats_free(&st);
}

#define T(f) cmocka_unit_test_setup_teardown(f, tree_setup, tree_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_stats),
	};

	dbox_log_set_sink(capture_sink);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
