/*
 * test-common.c: helpers shared by the unit tests (see test-common.h).
 * Not a test itself: the Makefile leaves it out of the test binaries.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "engine/namespace.h"
#include "engine/store.h"
#include "engine/view.h"
#include "storage/dbox-read.h"
#include "test-common.h"

#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char last_error[512];
int error_count;
enum dbox_log_level capture_level = DBOX_LOG_ERROR;

void capture_sink(enum dbox_log_level level, const char *fmt, va_list args)
{
	if (level > capture_level)
		return;
	vsnprintf(last_error, sizeof(last_error), fmt, args);
	error_count++;
}

void errors_reset(void)
{
	last_error[0] = '\0';
	error_count = 0;
}

uint64_t xorshift64(uint64_t *state)
{
	*state ^= *state << 13;
	*state ^= *state >> 7;
	*state ^= *state << 17;
	return *state;
}

char *mail_text(uint64_t *rng_state, size_t size, const char *subject,
		const char *const words[], size_t nwords)
{
	/* The longest piece appended is a 16-digit hex number and LF, or a
	   word and a space: the text overshoots size by less than that. */
	char *buf = malloc(size + 64);
	size_t len;

	assert_non_null(buf);
	len = (size_t)sprintf(buf, "From: Test <t@example.org>\n%s\n\n",
			      subject);
	while (len < size) {
		if (xorshift64(rng_state) % 8 == 0)
			len += (size_t)sprintf(buf + len, "%llx\n",
					       (unsigned long long)
					       xorshift64(rng_state));
		else
			len += (size_t)sprintf(buf + len, "%s ",
					       words[xorshift64(rng_state) %
						     nwords]);
	}
	buf[size] = '\0';
	return buf;
}

void tmpdir_make(char *dir, size_t size, const char *name)
{
	assert_true((size_t)snprintf(dir, size, "/tmp/%s.XXXXXX", name) < size);
	assert_non_null(mkdtemp(dir));
}

static int rm_entry(const char *path, const struct stat *st, int type,
		    struct FTW *ftw)
{
	(void)st;
	(void)type;
	(void)ftw;
	remove(path);
	return 0;
}

void rm_rf(const char *path)
{
	nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

uint64_t proc_self_io(const char *field)
{
	char line[128];
	unsigned long long n = 0;
	size_t flen = strlen(field);
	FILE *f = fopen("/proc/self/io", "r");

	assert_non_null(f);
	while (fgets(line, sizeof(line), f) != NULL) {
		if (strncmp(line, field, flen) == 0 && line[flen] == ':' &&
		    sscanf(line + flen + 1, "%llu", &n) == 1)
			break;
	}
	fclose(f);
	return n;
}

/* --- a small real store ------------------------------------------------ */

const char tree_plain_bytes[] = "plain file bytes\n";
const char tree_link_target[] = "../elsewhere";

int tree_setup(void **state)
{
	struct tree_fix *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	tmpdir_make(f->dir, sizeof(f->dir), "test-tree");
	snprintf(f->store, sizeof(f->store), "%s/store", f->dir);
	snprintf(f->alt, sizeof(f->alt), "%s/alt", f->dir);
	errors_reset();
	*state = f;
	return 0;
}

int tree_teardown(void **state)
{
	struct tree_fix *f = *state;

	dbox_view_close(&f->view);
	dbox_store_close(&f->st);
	for (int i = 0; i < TREE_NMSG; i++)
		free(f->body[i]);
	rm_rf(f->dir);
	free(f);
	return 0;
}

static uint64_t create(struct tree_fix *f, uint64_t parent, const char *name,
		       enum dbox_kind kind, uint32_t mode)
{
	struct dbox_attr attr;

	assert_int_equal(dbox_index_create(f->st->index, parent, name,
					   strlen(name), kind, mode, getuid(),
					   getgid(), dbox_now_ns(), &attr), 0);
	return attr.ino;
}

/* Message i, of len bytes, saved and committed as parent/name. */
static void save_msg(struct tree_fix *f, int i, uint64_t parent, const char *name,
		     size_t len)
{
	struct dbox_save *save = NULL;
	struct dbox_attr attr;
	uint64_t rng = 0x5eed0000 + (uint64_t)i;
	static const char *const words[] = { "alpha", "beta", "gamma" };

	f->body[i] = mail_text(&rng, len, "Subject: view test", words, 3);
	f->len[i] = len;
	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	f->msg_ino[i] = create(f, parent, name, DBOX_KIND_MESSAGE,
			       S_IFREG | 0640);
	assert_int_equal(dbox_save_begin(f->st, f->msg_ino[i], "INBOX",
					 &save), 0);
	assert_int_equal(dbox_save_write(save, f->body[i], len, 0), 0);
	assert_int_equal(dbox_save_finish(save, 1700000000, false,
					  &f->loc[i]), 0);
	assert_int_equal(dbox_index_getattr(f->st->index, f->msg_ino[i],
					    &attr), 0);
	attr.size = len;
	assert_int_equal(dbox_index_setattr(f->st->index, &attr), 0);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	dbox_save_free(&save);
	dbox_store_mutex_unlock(f->st);
}

/* A message left WRITING: its save began and was committed, never
   finished. */
static void save_unfinished(struct tree_fix *f, uint64_t parent, const char *name)
{
	struct dbox_save *save = NULL;

	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	f->writing_ino = create(f, parent, name, DBOX_KIND_MESSAGE,
				S_IFREG | 0600);
	assert_int_equal(dbox_save_begin(f->st, f->writing_ino, "INBOX",
					 &save), 0);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	dbox_save_free(&save);
	dbox_store_mutex_unlock(f->st);
}

/* The tree every test reads:
     cur/ m0 m1 (m1 also as cur/m1-link) new/ (m2, unfinished "w")
     notes (plain file)  ln -> ../elsewhere  sub/deep/ (empty) */
void tree_build(struct tree_fix *f, bool with_alt)
{
	struct dbox_store_settings set = {
		.create = true,
		.compress = { .method = DBOX_COMPRESSION_GZ },
		.alt_path = with_alt ? f->alt : NULL,
	};
	struct dbox_attr attr;
	uint64_t newdir;
	char name[24];
	int fd;

	if (with_alt)
		assert_int_equal(mkdir(f->alt, 0700), 0);
	assert_int_equal(dbox_store_open(f->store, &set, &f->st), 0);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	f->cur = create(f, DBOX_ROOT_INO, "cur", DBOX_KIND_DIR, S_IFDIR | 0700);
	newdir = create(f, DBOX_ROOT_INO, "new", DBOX_KIND_DIR, S_IFDIR | 0750);
	f->sub = create(f, DBOX_ROOT_INO, "sub", DBOX_KIND_DIR, S_IFDIR | 0755);
	f->deep = create(f, f->sub, "deep", DBOX_KIND_DIR, S_IFDIR | 0700);
	f->file_ino = create(f, DBOX_ROOT_INO, "notes", DBOX_KIND_FILE,
			     S_IFREG | 0644);
	f->link_ino = create(f, DBOX_ROOT_INO, "ln", DBOX_KIND_SYMLINK,
			     S_IFLNK | 0777);
	assert_int_equal(dbox_index_symlink_set(f->st->index, f->link_ino,
						tree_link_target,
						strlen(tree_link_target)), 0);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	snprintf(name, sizeof(name), "%llu", (unsigned long long)f->file_ino);
	fd = openat(f->st->files_fd, name, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, tree_plain_bytes, strlen(tree_plain_bytes)),
			 (ssize_t)strlen(tree_plain_bytes));
	close(fd);

	save_msg(f, 0, f->cur, "m0", 5000);
	save_msg(f, 1, f->cur, "m1", 70000);
	save_msg(f, 2, newdir, "m2", 100);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_index_link(f->st->index, f->msg_ino[1], f->cur,
					 "m1-link", 7, dbox_now_ns(), &attr), 0);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	save_unfinished(f, newdir, "w");
	dbox_store_close(&f->st);
}

char *tree_path(const struct tree_fix *f, const char *rel)
{
	char *path;

	assert_true(asprintf(&path, "%s/%s", f->store, rel) > 0);
	return path;
}

void tree_open_view(struct tree_fix *f)
{
	assert_int_equal(dbox_view_open(f->store, &f->view), 0);
	assert_non_null(f->view);
}

/* Replace STORE/storage/m.1 by a symbolic link to a copy of it. */
void tree_symlink_m1(struct tree_fix *f)
{
	char *m1 = tree_path(f, "storage/m.1");
	char copy[160], cmd[400];

	snprintf(copy, sizeof(copy), "%s/m.1-copy", f->dir);
	snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", m1, copy);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(unlink(m1), 0);
	assert_int_equal(symlink(copy, m1), 0);
	free(m1);
}

void inbox_fix_open(struct inbox_fix *f, const char *name)
{
	struct dbox_store_settings set = { .create = true };
	struct dbox_attr attr;

	tmpdir_make(f->dir, sizeof(f->dir), name);
	snprintf(f->store, sizeof(f->store), "%s/store", f->dir);
	assert_int_equal(dbox_store_open(f->store, &set, &f->st), 0);
	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_ns_make_inbox(f->st, getuid(), getgid()), 0);
	assert_int_equal(dbox_ns_lookup(f->st, DBOX_ROOT_INO, "cur", &attr), 0);
	f->cur = attr.ino;
}

void inbox_fix_close(struct inbox_fix *f)
{
	if (dbox_store_mutex_held(f->st))
		dbox_store_mutex_unlock(f->st);
	dbox_store_close(&f->st);
	rm_rf(f->dir);
}
