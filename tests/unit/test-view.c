/*
 * test-view.c: unit tests, with cmocka, of what dboxadm's reading verbs
 * use on a store opened without the lock: the view (engine/view.h), the
 * m.N files as a reader sees them (engine/mfile-read.h), the export walk
 * (engine/export.h).
 *
 * Each test builds a real store (test-common.h's tree: messages
 * gz-compressed, so every read decompresses) in its own mkdtemp()
 * directory, and reads it back through a view; the directory is removed
 * in teardown.  engine/stats.h is tested in test-stats.c.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "engine/export.h"
#include "engine/mfile-read.h"
#include "engine/view.h"
#include "storage/dbox-file.h"
#include "storage/dbox-read.h"
#include "storage/fd-cache.h"
#include "storage/log.h"
#include "test-common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* --- the view ---------------------------------------------------------- */

static void test_view_open(void **state)
{
	struct tree_fix *f = *state;
	struct dbox_view *view = NULL;
	char *path;
	int fd;

	tree_build(f, false);
	tree_open_view(f);
	assert_true(f->view->storage_fd >= 0);
	assert_int_equal(f->view->storage_err, 0);
	assert_int_equal(f->view->alt_fd, -1);
	assert_null(f->view->alt_path);

	/* A directory without index.sqlite is no store. */
	path = tree_path(f, "sub-not-a-store");
	assert_int_equal(mkdir(path, 0700), 0);
	assert_int_equal(dbox_view_open(path, &view), -ENOMEDIUM);
	assert_null(view);
	free(path);
	/* A file is no directory; a missing path is missing. */
	path = tree_path(f, "index.sqlite");
	assert_int_equal(dbox_view_open(path, &view), -ENOTDIR);
	assert_null(view);
	free(path);
	path = tree_path(f, "nothing-here");
	assert_int_equal(dbox_view_open(path, &view), -ENOENT);
	free(path);

	/* An m.N is found by name; a missing one is -ENOENT. */
	fd = dbox_view_mfile_open(f->view, "m.1");
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(dbox_view_mfile_open(f->view, "m.99"), -ENOENT);
}

/* --- the m.N walk ------------------------------------------------------ */

struct seen_mfile {
	uint32_t id;
	bool alt;
	mode_t type;
	uint64_t size;
};

struct mfile_list {
	struct seen_mfile got[8];
	size_t n;
};

static int list_cb(void *ctx, const struct dbox_mfile_ent *ent)
{
	struct mfile_list *l = ctx;
	char name[16];

	assert_true(l->n < 8);
	dbox_file_name(name, ent->file_id);
	assert_string_equal(ent->name, name);
	l->got[l->n++] = (struct seen_mfile){ ent->file_id, ent->alt,
					      ent->st.st_mode & S_IFMT,
					      (uint64_t)ent->st.st_size };
	return 0;
}

static int stop_cb(void *ctx, const struct dbox_mfile_ent *ent)
{
	return 5;
}

static const struct seen_mfile *find_mfile(const struct mfile_list *l,
					   uint32_t id)
{
	for (size_t i = 0; i < l->n; i++)
		if (l->got[i].id == id)
			return &l->got[i];
	return NULL;
}

static void test_mfile_walk(void **state)
{
	struct tree_fix *f = *state;
	struct mfile_list l = { .n = 0 };
	const struct seen_mfile *s;
	char *path = tree_path(f, "storage/m.1");
	struct stat sb;
	uint64_t size;
	int fd, afd, sfd;

	tree_build(f, true);
	assert_int_equal(stat(path, &sb), 0);
	free(path);
	/* ALT holds m.7; beside it names that are no m.N, and a link. */
	afd = open(f->alt, O_RDONLY | O_DIRECTORY);
	assert_true(afd >= 0);
	sfd = dbox_store_open_in(f->alt, "storage", NULL, 0);
	assert_true(sfd >= 0);
	fd = dbox_file_create(sfd, 7, &size);
	assert_true(fd >= 0);
	close(fd);
	close(sfd);
	assert_int_equal(symlinkat("m.7", afd, "storage/m.9"), 0);
	fd = openat(afd, "storage/m.01", O_CREAT | O_WRONLY, 0600);
	assert_true(fd >= 0);
	close(fd);
	fd = openat(afd, "storage/notes", O_CREAT | O_WRONLY, 0600);
	assert_true(fd >= 0);
	close(fd);
	close(afd);

	tree_open_view(f);
	assert_true(f->view->alt_fd >= 0);
	assert_int_equal(dbox_view_mfile_walk(f->view, list_cb, &l), 0);
	assert_int_equal(l.n, 3);
	assert_non_null(s = find_mfile(&l, 1));
	assert_false(s->alt);
	assert_int_equal(s->type, S_IFREG);
	assert_int_equal(s->size, (uint64_t)sb.st_size);
	assert_non_null(s = find_mfile(&l, 7));
	assert_true(s->alt);
	assert_int_equal(s->type, S_IFREG);
	assert_int_equal(s->size, size);
	assert_non_null(s = find_mfile(&l, 9));
	assert_true(s->alt);
	assert_int_equal(s->type, S_IFLNK);
	/* A callback's non-zero value stops the walk and comes back. */
	assert_int_equal(dbox_mfile_walk_dir(f->view->storage_fd, false,
					     stop_cb, NULL), 5);
}

/* --- the export walk --------------------------------------------------- */

struct visit {
	char path[32];
	uint64_t ino;
	enum dbox_kind kind;
	bool end;                /* a dir_end */
	int parent_fd;
	int dir_fd;              /* a directory's token (dir_begin) */
};

struct walk_log {
	struct tree_fix *f;
	struct dbox_export *ex;
	struct visit v[32];
	size_t n;
	int next_fd;             /* tokens handed out as dir_fd */
	int failed;
	int skip_sub;            /* dir_begin returns 1 for "sub" */
};

static struct visit *log_visit(struct walk_log *w,
			       const struct dbox_export_item *item, bool end)
{
	struct visit *v = &w->v[w->n++];

	assert_true(w->n < 32);
	assert_true(strlen(item->path) < sizeof(v->path));
	strcpy(v->path, item->path);
	v->ino = item->attr.ino;
	v->kind = item->attr.kind;
	v->end = end;
	v->parent_fd = item->parent_fd;
	/* The path ends in the name. */
	assert_string_equal(item->path + strlen(item->path) - strlen(item->name),
			    item->name);
	return v;
}

static int on_dir_begin(void *ctx, struct dbox_export_item *item)
{
	struct walk_log *w = ctx;

	struct visit *v;

	assert_int_equal(item->dir_fd, -1);
	v = log_visit(w, item, false);
	if (w->skip_sub && strcmp(item->path, "sub") == 0)
		return 1;
	v->dir_fd = item->dir_fd = w->next_fd++;
	return 0;
}

static void on_dir_end(void *ctx, struct dbox_export_item *item)
{
	struct walk_log *w = ctx;

	assert_true(item->dir_fd >= 100);
	log_visit(w, item, true)->dir_fd = item->dir_fd;
}

/* Read all of an item's bytes into a malloc()ed buffer; *len_r. */
static char *read_item(struct walk_log *w, struct dbox_export_item *item,
		       size_t *len_r)
{
	size_t size = 1 << 20, len = 0;
	char *buf = malloc(size);
	ssize_t n;

	assert_non_null(buf);
	assert_int_equal(dbox_export_item_open(w->ex, item), 0);
	while ((n = dbox_export_item_read(item, buf + len, 4096)) > 0) {
		len += (size_t)n;
		assert_true(len + 4096 <= size);
	}
	assert_int_equal(n, 0);
	dbox_export_item_close(item);
	*len_r = len;
	return buf;
}

static int on_entry(void *ctx, struct dbox_export_item *item)
{
	struct walk_log *w = ctx;
	struct tree_fix *f = w->f;
	size_t len;
	char *bytes;

	log_visit(w, item, false);
	if (item->attr.kind == DBOX_KIND_MESSAGE) {
		int i;

		if (item->attr.ino == f->writing_ino) {
			assert_true(item->unfinished);
			assert_int_equal(dbox_export_item_open(w->ex, item),
					 -EINVAL);
			return 0;
		}
		assert_false(item->unfinished);
		for (i = 0; i < TREE_NMSG && f->msg_ino[i] != item->attr.ino; i++)
			;
		assert_true(i < TREE_NMSG);
		assert_int_equal(item->attr.size, f->len[i]);
		assert_int_equal(item->attr.mode, S_IFREG | 0640);
		assert_int_equal(item->attr.nlink, i == 1 ? 2 : 1);
		bytes = read_item(w, item, &len);
		assert_int_equal(len, f->len[i]);
		assert_memory_equal(bytes, f->body[i], len);
		free(bytes);
	} else if (item->attr.kind == DBOX_KIND_FILE) {
		struct stat sb;
		char *backing;

		assert_true(asprintf(&backing, "%s/files/%llu", f->store,
				     (unsigned long long)item->attr.ino) > 0);
		assert_int_equal(stat(backing, &sb), 0);
		free(backing);
		bytes = read_item(w, item, &len);
		assert_int_equal(len, strlen(tree_plain_bytes));
		assert_memory_equal(bytes, tree_plain_bytes, len);
		free(bytes);
		/* The copy gets the backing file's times. */
		assert_int_equal(item->mtime.tv_sec, sb.st_mtim.tv_sec);
		assert_int_equal(item->mtime.tv_nsec, sb.st_mtim.tv_nsec);
	} else {
		assert_int_equal(item->attr.kind, DBOX_KIND_SYMLINK);
		assert_string_equal(item->target, tree_link_target);
		assert_int_equal(dbox_export_item_open(w->ex, item), -EINVAL);
	}
	return 0;
}

static void on_index_failed(void *ctx, const char *path, const char *what,
			    int err)
{
	struct walk_log *w = ctx;

	w->failed = err;
}

static const struct dbox_export_ops log_ops = {
	.dir_begin = on_dir_begin,
	.dir_end = on_dir_end,
	.entry = on_entry,
	.index_failed = on_index_failed,
};

/* The first visit of path (not a dir_end), or NULL. */
static const struct visit *visit_of(const struct walk_log *w, const char *path,
				    bool end, size_t *at_r)
{
	const struct visit *found = NULL;

	for (size_t i = 0; i < w->n; i++) {
		if (strcmp(w->v[i].path, path) != 0 || w->v[i].end != end)
			continue;
		assert_null(found); /* once */
		found = &w->v[i];
		if (at_r != NULL)
			*at_r = i;
	}
	return found;
}

static void walk(struct tree_fix *f, struct walk_log *w)
{
	struct dbox_export_item root;

	w->f = f;
	w->next_fd = 100;
	assert_int_equal(dbox_export_begin(f->view, &w->ex, &root), 0);
	assert_int_equal(root.attr.ino, DBOX_ROOT_INO);
	assert_int_equal(root.attr.kind, DBOX_KIND_DIR);
	assert_string_equal(root.path, "");
	assert_int_equal(dbox_export_walk(w->ex, &log_ops, w, 42), 0);
	assert_int_equal(w->failed, 0);
	dbox_export_end(&w->ex);
	assert_null(w->ex);
}

static void test_export_walk(void **state)
{
	static const char *const names[] = {
		"cur", "cur/m0", "cur/m1", "cur/m1-link", "new", "new/m2",
		"new/w", "sub", "sub/deep", "notes", "ln",
	};
	struct tree_fix *f = *state;
	struct walk_log w = { .n = 0 };
	const struct visit *v, *cur, *sub;
	size_t at_begin = 0, at_end = 0, at = 0;

	tree_build(f, false);
	tree_open_view(f);
	walk(f, &w);
	/* Every name once; directories twice (begin, end); nothing else. */
	assert_int_equal(w.n, 11 + 4);
	for (size_t i = 0; i < 11; i++)
		assert_non_null(visit_of(&w, names[i], false, NULL));
	assert_non_null(cur = visit_of(&w, "cur", false, &at_begin));
	assert_int_equal(cur->ino, f->cur);
	assert_int_equal(cur->parent_fd, 42);
	assert_non_null(visit_of(&w, "cur", true, &at_end));
	/* A directory's entries come between its begin and its end, with
	   its dir_fd as their parent_fd. */
	v = visit_of(&w, "cur/m0", false, &at);
	assert_true(at_begin < at && at < at_end);
	assert_int_equal(v->ino, f->msg_ino[0]);
	assert_true(cur->dir_fd >= 100);
	assert_int_equal(v->parent_fd, cur->dir_fd);
	assert_int_equal(w.v[at_end].dir_fd, cur->dir_fd);
	assert_int_equal(visit_of(&w, "cur/m1-link", false, NULL)->ino,
			 f->msg_ino[1]);
	sub = visit_of(&w, "sub", false, NULL);
	assert_int_equal(sub->ino, f->sub);
	v = visit_of(&w, "sub/deep", false, NULL);
	assert_int_equal(v->ino, f->deep);
	assert_int_equal(v->kind, DBOX_KIND_DIR);
	assert_int_equal(visit_of(&w, "notes", false, NULL)->ino, f->file_ino);
	assert_int_equal(visit_of(&w, "ln", false, NULL)->parent_fd, 42);

	/* A directory dir_begin skips is not entered and not ended. */
	memset(&w, 0, sizeof(w));
	w.skip_sub = 1;
	walk(f, &w);
	assert_int_equal(w.n, 11 + 4 - 3);
	assert_non_null(visit_of(&w, "sub", false, NULL));
	assert_null(visit_of(&w, "sub", true, NULL));
	assert_null(visit_of(&w, "sub/deep", false, NULL));
	assert_int_equal(error_count, 0);
}

/* --- a symbolic link in storage/ --------------------------------------- */

static int read_m1_cb(void *ctx, struct dbox_export_item *item)
{
	struct walk_log *w = ctx;

	if (item->attr.kind == DBOX_KIND_MESSAGE && !item->unfinished) {
		assert_int_equal(dbox_export_item_open(w->ex, item), -EIO);
		w->failed--;
	}
	return 0;
}

static void test_symlinked_mfile_refused(void **state)
{
	struct tree_fix *f = *state;
	struct dbox_export_ops ops = log_ops;
	struct dbox_export_item root;
	struct walk_log w = { .n = 0 };
	struct dbox_mfile_ref ref;
	struct dbox_fd_cache cache;

	tree_build(f, false);
	tree_symlink_m1(f);
	tree_open_view(f);
	assert_int_equal(dbox_view_mfile_open(f->view, "m.1"), -ELOOP);
	dbox_fd_cache_init(&cache, 0);
	assert_int_equal(dbox_view_mfile_fd(f->view, &cache, 1, NULL), -ELOOP);
	dbox_fd_cache_deinit(&cache);
	assert_int_equal(dbox_mfile_open_id(f->store, 1, &ref, NULL), -ELOOP);

	/* Export: every message of m.1 is unreadable (-EIO), and each
	   refusal is logged naming the file. */
	ops.entry = read_m1_cb;
	w.f = f;
	w.next_fd = 100;
	assert_int_equal(dbox_export_begin(f->view, &w.ex, &root), 0);
	assert_int_equal(dbox_export_walk(w.ex, &ops, &w, 42), 0);
	dbox_export_end(&w.ex);
	assert_int_equal(w.failed, -4); /* m0, m1, m1-link, m2 */
	assert_int_equal(error_count, 4);
	assert_non_null(strstr(last_error, "storage/m.1"));
	assert_non_null(strstr(last_error, strerror(ELOOP)));
}

/* --- one m.N, one record ----------------------------------------------- */

static void test_mfile_open_and_record(void **state)
{
	struct tree_fix *f = *state;
	struct dbox_mfile_ref ref;
	struct dbox_reader *reader = NULL;
	uint64_t committed, plain_size = 0;
	char *path, *buf;
	uint32_t id = 0;

	assert_true(dbox_mfile_arg_id("m.5", &id) && id == 5);
	assert_true(dbox_mfile_arg_id("12", &id) && id == 12);
	assert_true(dbox_mfile_arg_id("m.4294967295", &id) && id == UINT32_MAX);
	assert_false(dbox_mfile_arg_id("m.4294967296", &id));
	assert_false(dbox_mfile_arg_id("m.x", &id));
	assert_false(dbox_mfile_arg_id("", &id));
	assert_false(dbox_mfile_arg_id("-1", &id));
	assert_false(dbox_mfile_arg_id("5x", &id));

	tree_build(f, false);
	tree_open_view(f);
	assert_int_equal(dbox_index_mfile_get(f->view->index, 1, &committed), 0);
	dbox_view_close(&f->view);

	assert_int_equal(dbox_mfile_open_id(f->store, 1, &ref, NULL), 0);
	assert_int_equal(ref.committed_end, committed);
	assert_true(ref.size >= committed);
	/* The record of m0: checked whole, read as plaintext. */
	assert_int_equal(dbox_record_open_reader(ref.fd, 1, f->loc[0].offset,
						 UINT64_MAX, UINT64_MAX,
						 &reader, &plain_size), 0);
	assert_int_equal(plain_size, f->len[0]);
	buf = malloc(f->len[0]);
	assert_non_null(buf);
	assert_int_equal(dbox_reader_pread(reader, buf, f->len[0], 0),
			 (ssize_t)f->len[0]);
	assert_memory_equal(buf, f->body[0], f->len[0]);
	free(buf);
	dbox_reader_free(&reader);
	/* No record starts one byte further: -EIO, logged. */
	errors_reset();
	assert_int_equal(dbox_record_open_reader(ref.fd, 1, f->loc[0].offset + 1,
						 UINT64_MAX, UINT64_MAX,
						 &reader, NULL), -EIO);
	assert_null(reader);
	assert_true(error_count > 0);
	/* Another body size than the index's: -EIO. */
	assert_int_equal(dbox_record_open_reader(ref.fd, 1, f->loc[0].offset,
						 f->loc[0].body_size + 1,
						 UINT64_MAX, &reader, NULL), -EIO);
	close(ref.fd);

	/* By path: the committed end only when it is the store's m.N. */
	path = tree_path(f, "storage/m.1");
	assert_int_equal(dbox_mfile_open_path(f->store, path, 1, &ref), 0);
	assert_int_equal(ref.committed_end, committed);
	close(ref.fd);
	assert_int_equal(dbox_mfile_open_path(f->store, path, 0, &ref), 0);
	assert_int_equal(ref.committed_end, UINT64_MAX);
	close(ref.fd);
	free(path);
	assert_int_equal(dbox_mfile_open_path(f->store, f->store, 1, &ref),
			 -EINVAL);
	assert_int_equal(dbox_mfile_open_id(f->store, 2, &ref, NULL), -ENOENT);
	/* A Dovecot mdbox root has no index: the file opens, end unknown. */
	path = tree_path(f, "index.sqlite");
	assert_int_equal(unlink(path), 0);
	free(path);
	assert_int_equal(dbox_mfile_open_id(f->store, 1, &ref, NULL), 0);
	assert_int_equal(ref.committed_end, UINT64_MAX);
	close(ref.fd);
}

#define T(f) cmocka_unit_test_setup_teardown(f, tree_setup, tree_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_view_open),
		T(test_mfile_walk),
		T(test_export_walk),
		T(test_symlinked_mfile_refused),
		T(test_mfile_open_and_record),
	};

	dbox_log_set_sink(capture_sink);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
