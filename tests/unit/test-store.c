/*
 * test-store.c: unit tests of the store (engine/store.h) with cmocka: the
 * directory layout and lock, saving messages into m.N files inside index
 * transactions, reading them back, rotation, appending to the last m.N
 * after a reopen, and crash recovery.
 *
 * Each test works in its own mkdtemp() directory (the store is a
 * not-yet-existing "store" inside it), removed in teardown.  Crashes are
 * simulated by a fork()ed child that saves and then _exit()s without any
 * cleanup, as a killed process would.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "engine/maildir.h"
#include "index/index.h"
#include "engine/store.h"
#include "storage/dbox-file.h"
#include "storage/dbox-format.h"
#include "storage/dbox-read.h"
#include "storage/log.h"
#include "test-common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* --- helpers ---------------------------------------------------------- */

struct fix {
	char dir[64];
	char store[128];
	struct dbox_store *st;
};

static int fix_setup(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	tmpdir_make(f->dir, sizeof(f->dir), "test-store");
	snprintf(f->store, sizeof(f->store), "%s/store", f->dir);
	errors_reset();
	*state = f;
	return 0;
}

static int fix_teardown(void **state)
{
	struct fix *f = *state;

	dbox_store_close(&f->st);
	rm_rf(f->dir);
	free(f);
	return 0;
}

static int store_open(const char *path, uint64_t rotate, bool create,
		      struct dbox_store **st_r)
{
	struct dbox_store_settings set = { .rotate_size = rotate,
					   .create = create };

	*st_r = NULL;
	return dbox_store_open(path, &set, st_r);
}

static void open_fix(struct fix *f, uint64_t rotate)
{
	assert_null(f->st);
	assert_int_equal(store_open(f->store, rotate, true, &f->st), 0);
	assert_non_null(f->st);
}

static void close_fix(struct fix *f)
{
	dbox_store_close(&f->st);
	assert_null(f->st);
}

static char *store_file(const struct fix *f, const char *rel)
{
	char *path;

	assert_true(asprintf(&path, "%s/%s", f->store, rel) > 0);
	return path;
}

static mode_t mode_of(const struct fix *f, const char *rel)
{
	char *path = store_file(f, rel);
	struct stat st;

	assert_int_equal(lstat(path, &st), 0);
	free(path);
	return st.st_mode;
}

/* Size of storage/m.<id>, or -1 when it does not exist. */
static int64_t mfile_size(const struct fix *f, uint32_t file_id)
{
	char name[16], rel[32];
	char *path;
	struct stat st;
	int ret;

	dbox_file_name(name, file_id);
	snprintf(rel, sizeof(rel), "storage/%s", name);
	path = store_file(f, rel);
	ret = stat(path, &st);
	free(path);
	return ret < 0 ? -1 : (int64_t)st.st_size;
}

static uint64_t committed_end(struct dbox_store *st, uint32_t file_id)
{
	uint64_t size = 0;

	assert_int_equal(dbox_index_mfile_get(st->index, file_id, &size), 0);
	return size;
}

/* Deterministic message text of `size` bytes: header lines, LF and CRLF
   line ends, and some 8-bit bytes. */
static char *make_body(unsigned int seed, size_t size)
{
	char *buf = malloc(size + 1);
	uint64_t x = 0x9e3779b97f4a7c15ULL ^ seed;

	assert_non_null(buf);
	for (size_t i = 0; i < size; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		switch (x % 23) {
		case 0: buf[i] = '\n'; break;
		case 1: buf[i] = '\r'; break;
		case 2: buf[i] = (char)(0x80 + x % 128); break;
		default: buf[i] = (char)('a' + x % 26); break;
		}
	}
	if (size > 12)
		memcpy(buf, "Subject: x\r\n", 12);
	buf[size] = '\0';
	return buf;
}

/* Size with every LF not preceded by CR counted as CRLF. */
static uint64_t vsize_of(const char *buf, size_t len)
{
	uint64_t v = len;

	for (size_t i = 0; i < len; i++)
		if (buf[i] == '\n' && (i == 0 || buf[i - 1] != '\r'))
			v++;
	return v;
}

struct saved {
	uint64_t ino;
	struct dbox_msgloc loc;
	char *body;
	size_t len;
	time_t received;
};

/* Save body as a new message parent/name inside one transaction, the way
   fs/ does: create the inode, save, finish, commit, free. */
static void save_msg(struct dbox_store *st, uint64_t parent, const char *name,
		     const char *mailbox, struct saved *m)
{
	struct dbox_save *save = NULL;
	struct dbox_attr attr;
	struct dbox_msgloc loc;
	size_t half = m->len / 2;
	char *readback = malloc(m->len + 1);

	assert_non_null(readback);
	dbox_store_mutex_lock(st);
	assert_int_equal(dbox_index_begin(st->index), 0);
	assert_int_equal(dbox_index_create(st->index, parent, name,
					   strlen(name), DBOX_KIND_MESSAGE,
					   S_IFREG | 0600, getuid(), getgid(),
					   dbox_now_ns(), &attr), 0);
	m->ino = attr.ino;
	assert_int_equal(dbox_save_begin(st, m->ino, mailbox, &save), 0);
	assert_non_null(save);
	/* The row is WRITING until finished. */
	assert_int_equal(dbox_index_msg_get(st->index, m->ino, &loc), 0);
	assert_int_equal(loc.state, DBOX_MSG_WRITING);

	/* Second half first, then the first: writes may come in any order. */
	assert_int_equal(dbox_save_write(save, m->body + half, m->len - half,
					 half), 0);
	assert_int_equal(dbox_save_size(save), m->len);
	assert_int_equal(dbox_save_write(save, m->body, half, 0), 0);
	assert_int_equal(dbox_save_size(save), m->len);
	assert_int_equal(dbox_save_read(save, readback, m->len + 10, 0),
			 (ssize_t)m->len);
	assert_memory_equal(readback, m->body, m->len);
	free(readback);

	assert_int_equal(dbox_save_finish(save, m->received, m->len % 2 == 0,
					  &m->loc), 0);
	attr.size = m->len;
	assert_int_equal(dbox_index_setattr(st->index, &attr), 0);
	assert_int_equal(dbox_index_commit(st->index, false), 0);
	dbox_save_free(&save);
	assert_null(save);
	dbox_store_mutex_unlock(st);
}

static struct saved *new_msg(unsigned int seed, size_t len)
{
	struct saved *m = calloc(1, sizeof(*m));

	assert_non_null(m);
	m->len = len;
	m->body = make_body(seed, len);
	m->received = 1700000000 + (time_t)seed;
	return m;
}

static void free_msg(struct saved *m)
{
	free(m->body);
	free(m);
}

/* Read the whole message through the store's reader in `chunk` pieces and
   compare byte for byte. */
static void expect_content(struct dbox_store *st, const struct saved *m,
			   size_t chunk)
{
	struct dbox_reader *reader = NULL;
	char *buf = malloc(m->len + 1);
	uint64_t off = 0;
	ssize_t n;

	assert_non_null(buf);
	dbox_store_mutex_lock(st);
	assert_int_equal(dbox_store_open_reader(st, &m->loc, m->len, &reader),
			 0);
	dbox_store_mutex_unlock(st);
	while ((n = dbox_reader_pread(reader, buf + off, chunk, off)) > 0)
		off += (uint64_t)n;
	assert_int_equal(n, 0);
	assert_int_equal(off, m->len);
	assert_memory_equal(buf, m->body, m->len);
	/* A read in the middle, and one running past the end. */
	if (m->len > 14) {
		assert_int_equal(dbox_reader_pread(reader, buf, 7,
						   m->len / 2),
				 7);
		assert_memory_equal(buf, m->body + m->len / 2, 7);
	}
	if (m->len > 0) {
		assert_int_equal(dbox_reader_pread(reader, buf, 100,
						   m->len - 1), 1);
		assert_int_equal(buf[0], m->body[m->len - 1]);
	}
	dbox_reader_free(&reader);
	assert_null(reader);
	free(buf);
}

/* Records of one m.N as dbox_file_walk sees them. */
#define MAX_RECORDS 64
struct record {
	uint64_t offset, body_size, record_size, vsize;
	uint64_t plain_size;   /* Z, 0 when absent */
	time_t received;
	char guid[DBOX_GUID_HEX_LEN * 2 + 1];
	char mailbox[64];
};
struct walk {
	struct record rec[MAX_RECORDS];
	unsigned int count;
};

static int walk_cb(void *ctx, uint64_t offset, uint64_t body_size,
		   const struct dbox_metadata *md, uint64_t record_size)
{
	struct walk *w = ctx;
	struct record *r;

	assert_true(w->count < MAX_RECORDS);
	r = &w->rec[w->count++];
	r->offset = offset;
	r->body_size = body_size;
	r->record_size = record_size;
	r->received = md->received;
	assert_true(md->has_vsize);
	r->vsize = md->vsize;
	r->plain_size = md->has_plain_size ? md->plain_size : 0;
	snprintf(r->guid, sizeof(r->guid), "%s", md->guid);
	snprintf(r->mailbox, sizeof(r->mailbox), "%s",
		 md->mailbox != NULL ? md->mailbox : "(none)");
	return 0;
}

static void walk_mfile(const struct fix *f, uint32_t file_id,
		       struct walk *w)
{
	char name[16], rel[32];
	char *path;
	int fd;

	dbox_file_name(name, file_id);
	snprintf(rel, sizeof(rel), "storage/%s", name);
	path = store_file(f, rel);
	fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	free(path);
	memset(w, 0, sizeof(*w));
	assert_int_equal(dbox_file_walk(fd, file_id, walk_cb, w, NULL), 0);
	close(fd);
}

/* The record of m is valid dbox and says what the index says. */
static void expect_record(const struct record *r, const struct saved *m,
			  const char *mailbox)
{
	assert_int_equal(r->offset, m->loc.offset);
	assert_int_equal(r->body_size, m->loc.body_size);
	assert_int_equal(r->body_size, m->len);
	assert_int_equal(r->record_size, m->loc.record_size);
	assert_int_equal(r->vsize, m->loc.vsize);
	assert_int_equal(r->vsize, vsize_of(m->body, m->len));
	assert_int_equal(r->received, m->received);
	assert_string_equal(r->guid, m->loc.guid);
	assert_string_equal(r->mailbox, mailbox);
}

static uint64_t mkdir_in(struct dbox_store *st, uint64_t parent,
			 const char *name)
{
	struct dbox_attr attr;

	assert_int_equal(dbox_index_begin(st->index), 0);
	assert_int_equal(dbox_index_create(st->index, parent, name,
					   strlen(name), DBOX_KIND_DIR,
					   S_IFDIR | 0700, getuid(), getgid(),
					   dbox_now_ns(), &attr), 0);
	assert_int_equal(dbox_index_commit(st->index, false), 0);
	return attr.ino;
}

static unsigned int count_entries(const char *path)
{
	DIR *dir = opendir(path);
	struct dirent *d;
	unsigned int n = 0;

	assert_non_null(dir);
	while ((d = readdir(dir)) != NULL)
		if (strcmp(d->d_name, ".") != 0 && strcmp(d->d_name, "..") != 0)
			n++;
	closedir(dir);
	return n;
}

/* Child-side check: a cmocka assert must not run in a fork()ed child. */
#define CHILD_CHECK(expr) do {                                          \
		if (!(expr)) {                                          \
			dprintf(2, "child: %s:%d: %s\n", __FILE__,      \
				__LINE__, #expr);                       \
			_exit(1);                                       \
		}                                                       \
	} while (0)

static void wait_child(pid_t pid)
{
	int status;

	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

/* --- open, layout, lock ----------------------------------------------- */

static void test_layout(void **state)
{
	struct fix *f = *state;
	mode_t old = umask(077);
	struct dbox_attr root;
	int64_t format;

	open_fix(f, 0);
	umask(old);
	assert_int_equal(f->st->rotate_size, DBOX_DEFAULT_ROTATE_SIZE);

	assert_true(S_ISDIR(mode_of(f, ".")));
	assert_int_equal(mode_of(f, ".") & 07777, 0700);
	assert_true(S_ISDIR(mode_of(f, "storage")));
	assert_int_equal(mode_of(f, "storage") & 07777, 0700);
	assert_true(S_ISDIR(mode_of(f, "files")));
	assert_int_equal(mode_of(f, "files") & 07777, 0700);
	assert_true(S_ISREG(mode_of(f, "index.sqlite")));
	assert_int_equal(mode_of(f, "index.sqlite") & 07777, 0600);
	assert_true(S_ISREG(mode_of(f, "lock")));
	assert_int_equal(mode_of(f, "lock") & 07777, 0600);

	/* No m.N yet; the index is a fresh one. */
	char *storage = store_file(f, "storage");
	assert_int_equal(count_entries(storage), 0);
	free(storage);
	assert_int_equal(dbox_index_getattr(f->st->index, DBOX_ROOT_INO,
					    &root), 0);
	assert_int_equal(root.nlink, 2);
	assert_int_equal(dbox_index_meta_get(f->st->index, "format", &format),
			 0);
	assert_int_equal(format, DBOX_INDEX_FORMAT);

	/* It opens again, also without create. */
	mkdir_in(f->st, DBOX_ROOT_INO, "cur");
	close_fix(f);
	assert_int_equal(store_open(f->store, 0, false, &f->st), 0);
	assert_int_equal(dbox_index_lookup(f->st->index, DBOX_ROOT_INO, "cur",
					   3, &root), 0);
	close_fix(f);
	dbox_store_close(&f->st); /* safe on NULL */
}

static void test_missing(void **state)
{
	struct fix *f = *state;
	struct dbox_store *st = (void *)1;

	/* Missing, no create. */
	errors_reset();
	assert_int_equal(store_open(f->store, 0, false, &st), -ENOENT);
	assert_null(st);
	assert_true(error_count >= 1);
	assert_int_equal(access(f->store, F_OK), -1);

	/* An empty directory, no create: refused and left empty. */
	assert_int_equal(mkdir(f->store, 0700), 0);
	assert_int_equal(store_open(f->store, 0, false, &st), -ENOENT);
	assert_int_equal(count_entries(f->store), 0);

	/* An empty directory with create becomes a store. */
	open_fix(f, 0);
	assert_int_equal(mode_of(f, "storage") & S_IFMT, S_IFDIR);
}

static void test_busy(void **state)
{
	struct fix *f = *state;
	struct dbox_store *st2 = NULL;
	pid_t pid;

	open_fix(f, 0);
	errors_reset();
	assert_int_equal(store_open(f->store, 0, true, &st2), -EBUSY);
	assert_null(st2);
	assert_true(error_count >= 1);

	/* Another process too. */
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct dbox_store *st3 = NULL;

		CHILD_CHECK(store_open(f->store, 0, true, &st3) == -EBUSY);
		CHILD_CHECK(st3 == NULL);
		_exit(0);
	}
	wait_child(pid);

	/* The first is unharmed; after it closes, the store opens. */
	mkdir_in(f->st, DBOX_ROOT_INO, "cur");
	close_fix(f);
	assert_int_equal(store_open(f->store, 0, true, &st2), 0);
	dbox_store_close(&st2);
}

static void test_not_empty_refused(void **state)
{
	struct fix *f = *state;
	struct dbox_store *st = NULL;
	char path[256], buf[16];
	int fd;

	/* Someone's Maildir, say. */
	assert_int_equal(mkdir(f->store, 0755), 0);
	snprintf(path, sizeof(path), "%s/cur", f->store);
	assert_int_equal(mkdir(path, 0755), 0);
	snprintf(path, sizeof(path), "%s/dovecot-uidlist", f->store);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "3 V1 N2\n", 8), 8);
	close(fd);

	errors_reset();
	assert_int_equal(store_open(f->store, 0, true, &st), -ENOTEMPTY);
	assert_null(st);
	assert_true(error_count >= 1);
	assert_non_null(strstr(last_error, "not a dbox store"));
	assert_int_equal(store_open(f->store, 0, false, &st), -ENOTEMPTY);

	/* Unchanged: the same two entries, the same bytes and modes. */
	assert_int_equal(count_entries(f->store), 2);
	assert_int_equal(mode_of(f, ".") & 07777, 0755);
	assert_true(S_ISDIR(mode_of(f, "cur")));
	assert_int_equal(mode_of(f, "dovecot-uidlist") & 07777, 0644);
	fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(read(fd, buf, sizeof(buf)), 8);
	assert_memory_equal(buf, "3 V1 N2\n", 8);
	close(fd);
	snprintf(path, sizeof(path), "%s/cur", f->store);
	assert_int_equal(count_entries(path), 0);
}

static void test_bad_index(void **state)
{
	struct fix *f = *state;
	struct dbox_store *st = NULL;
	char *path;
	int fd;

	open_fix(f, 0);
	close_fix(f);
	path = store_file(f, "index.sqlite");
	assert_int_equal(unlink(path), 0);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	for (int i = 0; i < 64; i++)
		assert_int_equal(write(fd, "garbage garbage!", 16), 16);
	close(fd);

	errors_reset();
	assert_int_equal(store_open(f->store, 0, true, &st), -EIO);
	assert_null(st);
	assert_non_null(strstr(last_error, "rebuild"));
	assert_int_equal(mode_of(f, "index.sqlite") & S_IFMT, S_IFREG);
	free(path);
	/* The lock was released. */
	path = store_file(f, "lock");
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), 0);
	close(fd);
	free(path);
}

/* --- saving and reading ----------------------------------------------- */

static void test_save_read(void **state)
{
	struct fix *f = *state;
	static const size_t sizes[] = { 1, 0, 100, 65536 + 17, 4000, 300000 };
	enum { N = sizeof(sizes) / sizeof(sizes[0]) };
	struct saved *m[N];
	struct dbox_msgloc loc;
	struct walk w;
	uint64_t cur, end;
	char name[64];

	open_fix(f, 0);
	cur = mkdir_in(f->st, DBOX_ROOT_INO, "cur");
	for (unsigned int i = 0; i < N; i++) {
		m[i] = new_msg(i, sizes[i]);
		snprintf(name, sizeof(name), "%u.M%uP1.host:2,", 1700000000 + i,
			 i);
		save_msg(f->st, cur, name, "INBOX", m[i]);

		/* Location and sizes as recorded. */
		assert_int_equal(m[i]->loc.file_id, 1);
		assert_int_equal(m[i]->loc.state, DBOX_MSG_COMMITTED);
		assert_int_equal(m[i]->loc.body_size, sizes[i]);
		assert_int_equal(m[i]->loc.vsize,
				 vsize_of(m[i]->body, sizes[i]));
		assert_int_equal(strlen(m[i]->loc.guid), DBOX_GUID_HEX_LEN);
		assert_true(m[i]->loc.record_size >
			    DBOX_MSG_HEADER_SIZE + sizes[i]);
		if (i > 0) {
			assert_int_equal(m[i]->loc.offset,
					 m[i - 1]->loc.offset +
					 m[i - 1]->loc.record_size);
			assert_string_not_equal(m[i]->loc.guid,
						m[i - 1]->loc.guid);
		}
		assert_int_equal(dbox_index_msg_get(f->st->index, m[i]->ino,
						    &loc), 0);
		assert_int_equal(loc.state, DBOX_MSG_COMMITTED);
		assert_int_equal(loc.offset, m[i]->loc.offset);
		assert_int_equal(loc.record_size, m[i]->loc.record_size);
		assert_string_equal(loc.guid, m[i]->loc.guid);

		/* The committed end is the file's end. */
		end = m[i]->loc.offset + m[i]->loc.record_size;
		assert_int_equal(committed_end(f->st, 1), end);
		assert_int_equal(mfile_size(f, 1), (int64_t)end);
	}
	for (unsigned int i = 0; i < N; i++) {
		expect_content(f->st, m[i], 4096);
		expect_content(f->st, m[i], 1);
	}

	/* Valid dbox: every record found, with G, B, R and V. */
	walk_mfile(f, 1, &w);
	assert_int_equal(w.count, N);
	for (unsigned int i = 0; i < N; i++)
		expect_record(&w.rec[i], m[i], "INBOX");

	/* And all of it after a reopen. */
	close_fix(f);
	open_fix(f, 0);
	for (unsigned int i = 0; i < N; i++) {
		expect_content(f->st, m[i], 1000);
		free_msg(m[i]);
	}
	assert_int_equal(mfile_size(f, 1), (int64_t)end);
}

static void test_record_metadata(void **state)
{
	struct fix *f = *state;
	struct saved *a = new_msg(1, 500), *b = new_msg(2, 700);
	uint64_t inbox_cur, lists, lists_cur;
	char *mailbox = NULL;
	struct walk w;

	open_fix(f, 0);
	inbox_cur = mkdir_in(f->st, DBOX_ROOT_INO, "cur");
	lists = mkdir_in(f->st, DBOX_ROOT_INO, ".Lists.Kernel");
	lists_cur = mkdir_in(f->st, lists, "cur");
	assert_int_equal(maildir_mailbox_name(f->st->index, lists_cur,
						 &mailbox), 0);
	save_msg(f->st, inbox_cur, "a", "INBOX", a);
	save_msg(f->st, lists_cur, "b", mailbox, b);
	free(mailbox);

	walk_mfile(f, 1, &w);
	assert_int_equal(w.count, 2);
	expect_record(&w.rec[0], a, "INBOX");
	expect_record(&w.rec[1], b, "Lists/Kernel");
	free_msg(a);
	free_msg(b);
}

static void test_open_reader_checks(void **state)
{
	struct fix *f = *state;
	struct saved *a = new_msg(1, 1000);
	struct dbox_reader *reader = NULL;
	struct dbox_msgloc bad;

	open_fix(f, 0);
	save_msg(f->st, DBOX_ROOT_INO, "a", "INBOX", a);

	/* The index and the record header disagree: -EIO, logged. */
	bad = a->loc;
	bad.body_size++;
	dbox_store_mutex_lock(f->st);
	errors_reset();
	assert_int_equal(dbox_store_open_reader(f->st, &bad, a->len, &reader),
			 -EIO);
	assert_null(reader);
	assert_int_equal(error_count, 1);
	bad = a->loc;
	bad.offset += 1;
	assert_int_equal(dbox_store_open_reader(f->st, &bad, a->len, &reader),
			 -EIO);
	/* A file that does not exist. */
	bad = a->loc;
	bad.file_id = 77;
	assert_int_equal(dbox_store_open_reader(f->st, &bad, a->len, &reader),
			 -EIO);
	assert_int_equal(dbox_store_read_fd(f->st, 77), -EIO);
	/* The real one still reads. */
	assert_true(dbox_store_read_fd(f->st, 1) >= 0);
	dbox_store_mutex_unlock(f->st);
	expect_content(f->st, a, 333);
	free_msg(a);
}

/* A transaction that finished saves, rolled back (dboxadm import after an
   index error): the pool files are cut back to the committed ends the
   index has again, and a file made in that transaction is removed (also
   when, full, it left the pool); the next open finds no record past an
   end (it kept them as mail an older index does not know). */
static void save_in_tx(struct dbox_store *st, const char *name,
		       const char *text)
{
	struct dbox_save *save = NULL;
	struct dbox_msgloc loc;
	struct dbox_attr attr;

	assert_int_equal(dbox_index_create(st->index, DBOX_ROOT_INO, name,
					   strlen(name), DBOX_KIND_MESSAGE,
					   S_IFREG | 0600, 0, 0, dbox_now_ns(),
					   &attr), 0);
	assert_int_equal(dbox_save_begin(st, attr.ino, "INBOX", &save), 0);
	assert_int_equal(dbox_save_write(save, text, strlen(text), 0), 0);
	assert_int_equal(dbox_save_finish(save, 1700000000, false, &loc), 0);
	dbox_save_free(&save);
}

static void test_pool_rolled_back(void **state)
{
	struct fix *f = *state;
	uint64_t end;

	open_fix(f, 0);
	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	save_in_tx(f->st, "kept", "Subject: kept\n\nbody\n");
	assert_int_equal(dbox_index_commit(f->st->index, true), 0);
	end = committed_end(f->st, 1);

	/* Into m.1, then rolled back: cut back to its end. */
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	save_in_tx(f->st, "gone1", "Subject: gone\n\nbody one\n");
	assert_true(mfile_size(f, 1) > (int64_t)end);
	dbox_index_rollback(f->st->index);
	dbox_store_rolled_back(f->st, (uint32_t[]){ 1 }, 1);
	assert_int_equal(mfile_size(f, 1), (int64_t)end);

	/* A save after it lands right at that end. */
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	save_in_tx(f->st, "after", "Subject: after\n\nbody\n");
	assert_int_equal(dbox_index_commit(f->st->index, true), 0);
	assert_int_equal(mfile_size(f, 1), (int64_t)committed_end(f->st, 1));
	dbox_store_mutex_unlock(f->st);
	close_fix(f);

	/* A file made in the rolled-back transaction goes. */
	open_fix(f, 1);  /* rotate at once: every save takes a new m.N */
	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	save_in_tx(f->st, "gone2", "Subject: gone\n\nbody two\n");
	assert_true(mfile_size(f, 2) > 0);
	dbox_index_rollback(f->st->index);
	dbox_store_rolled_back(f->st, (uint32_t[]){ 2 }, 1);
	assert_int_equal(mfile_size(f, 2), -1);
	dbox_store_mutex_unlock(f->st);
	close_fix(f);

	errors_reset();
	open_fix(f, 0);
	assert_int_equal(f->st->kept_records, 0);
	assert_int_equal(error_count, 0);
	close_fix(f);
}

static void test_save_refinish(void **state)
{
	struct fix *f = *state;
	struct dbox_save *save = NULL;
	struct dbox_attr attr;
	struct dbox_msgloc loc1, loc2, loc;
	struct saved m = { .received = 1700000100 };
	struct walk w;

	open_fix(f, 0);
	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_index_create(f->st->index, DBOX_ROOT_INO, "m", 1,
					   DBOX_KIND_MESSAGE, S_IFREG | 0600,
					   0, 0, dbox_now_ns(), &attr), 0);
	assert_int_equal(dbox_save_begin(f->st, attr.ino, "INBOX", &save), 0);
	assert_int_equal(dbox_save_write(save, "hello\n", 6, 0), 0);
	assert_int_equal(dbox_save_finish(save, m.received, true, &loc1), 0);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	assert_int_equal(loc1.body_size, 6);

	/* More writes after a finish: WRITING again, then a new finish
	   rewrites the same record in place. */
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_save_reopen(save), 0);
	assert_int_equal(dbox_index_msg_get(f->st->index, attr.ino, &loc), 0);
	assert_int_equal(loc.state, DBOX_MSG_WRITING);
	assert_int_equal(dbox_save_write(save, "world\n", 6, 6), 0);
	assert_int_equal(dbox_save_truncate(save, 11), 0);
	assert_int_equal(dbox_save_size(save), 11);
	assert_int_equal(dbox_save_finish(save, m.received, false, &loc2), 0);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	assert_int_equal(loc2.offset, loc1.offset);
	assert_string_equal(loc2.guid, loc1.guid);
	assert_int_equal(loc2.body_size, 11);
	assert_int_equal(loc2.state, DBOX_MSG_COMMITTED);
	/* A finish with nothing new changes nothing. */
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_save_finish(save, m.received, false, &loc), 0);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	assert_int_equal(loc.record_size, loc2.record_size);
	dbox_save_free(&save);
	dbox_store_mutex_unlock(f->st);

	assert_int_equal(committed_end(f->st, 1),
			 loc2.offset + loc2.record_size);
	assert_int_equal(mfile_size(f, 1),
			 (int64_t)(loc2.offset + loc2.record_size));
	m.ino = attr.ino;
	m.loc = loc2;
	m.body = "hello\nworld";
	m.len = 11;
	expect_content(f->st, &m, 4);
	walk_mfile(f, 1, &w);
	assert_int_equal(w.count, 1);
	expect_record(&w.rec[0], &m, "INBOX");
}

/* A save freed without a finish gives its bytes back. */
static void test_save_free_unfinished(void **state)
{
	struct fix *f = *state;
	struct saved *a = new_msg(1, 2000), *c = new_msg(3, 50);
	struct dbox_save *save = NULL;
	struct dbox_msgloc where;
	struct dbox_attr attr;
	struct dbox_msgloc loc;
	char *junk = make_body(2, 3000);
	int64_t before;

	open_fix(f, 0);
	save_msg(f->st, DBOX_ROOT_INO, "a", "INBOX", a);
	before = mfile_size(f, 1);
	assert_int_equal(before, (int64_t)(a->loc.offset + a->loc.record_size));

	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_index_create(f->st->index, DBOX_ROOT_INO, "b", 1,
					   DBOX_KIND_MESSAGE, S_IFREG | 0600,
					   0, 0, dbox_now_ns(), &attr), 0);
	assert_int_equal(dbox_save_begin(f->st, attr.ino, "INBOX", &save), 0);
	assert_int_equal(dbox_save_write(save, junk, 3000, 0), 0);
	assert_true(mfile_size(f, 1) >= before + 3000);
	dbox_save_free(&save);
	assert_null(save);
	assert_int_equal(mfile_size(f, 1), before);
	dbox_index_rollback(f->st->index);
	assert_int_equal(dbox_index_msg_get(f->st->index, attr.ino, &loc),
			 -ENOENT);
	assert_int_equal(committed_end(f->st, 1), (uint64_t)before);
	dbox_store_mutex_unlock(f->st);

	/* The next message takes the freed place. */
	save_msg(f->st, DBOX_ROOT_INO, "c", "INBOX", c);
	assert_int_equal(c->loc.file_id, 1);
	assert_int_equal(c->loc.offset, (uint64_t)before);
	expect_content(f->st, a, 512);
	expect_content(f->st, c, 512);

	/* After a reopen m.1, below the rotate size, takes the next save
	   again; freed unfinished, it gives the bytes back just the same. */
	before = mfile_size(f, 1);
	close_fix(f);
	open_fix(f, 0);
	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_index_create(f->st->index, DBOX_ROOT_INO, "d", 1,
					   DBOX_KIND_MESSAGE, S_IFREG | 0600,
					   0, 0, dbox_now_ns(), &attr), 0);
	assert_int_equal(dbox_save_begin(f->st, attr.ino, "INBOX", &save), 0);
	dbox_save_where(save, &where);
	assert_int_equal(where.file_id, 1);
	assert_int_equal(where.offset, (uint64_t)before);
	assert_int_equal(dbox_save_write(save, junk, 3000, 0), 0);
	assert_true(mfile_size(f, 1) >= before + 3000);
	dbox_save_free(&save);
	dbox_index_rollback(f->st->index);
	dbox_store_mutex_unlock(f->st);
	assert_int_equal(mfile_size(f, 1), before);
	assert_int_equal(committed_end(f->st, 1), (uint64_t)before);
	assert_int_equal(mfile_size(f, 2), -1);

	/* A save on a new m.N (m.1 is full at this rotate size), freed
	   unfinished: the file keeps only its header. */
	close_fix(f);
	open_fix(f, (uint64_t)before);
	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_index_create(f->st->index, DBOX_ROOT_INO, "d", 1,
					   DBOX_KIND_MESSAGE, S_IFREG | 0600,
					   0, 0, dbox_now_ns(), &attr), 0);
	assert_int_equal(dbox_save_begin(f->st, attr.ino, "INBOX", &save), 0);
	dbox_save_where(save, &where);
	assert_int_equal(where.file_id, 2);
	assert_int_equal(dbox_save_write(save, junk, 100, 0), 0);
	dbox_save_free(&save);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	dbox_store_mutex_unlock(f->st);
	assert_int_equal(mfile_size(f, 2), (int64_t)committed_end(f->st, 2));
	assert_true(mfile_size(f, 2) < 64);
	assert_int_equal(mfile_size(f, 1), before);
	expect_content(f->st, a, 512);
	expect_content(f->st, c, 512);
	free(junk);
	free_msg(a);
	free_msg(c);
}

/* Two saves at once each own a different m.N. */
static void test_parallel_saves(void **state)
{
	struct fix *f = *state;
	struct dbox_save *s1 = NULL, *s2 = NULL;
	struct dbox_msgloc w1, w2;
	struct dbox_attr a1, a2;
	struct saved m1 = { .body = "first message\n", .len = 14,
			    .received = 1 };
	struct saved m2 = { .body = "second\r\nmessage\n", .len = 16,
			    .received = 2 };
	struct saved *m3 = new_msg(3, 100);
	struct walk w;

	open_fix(f, 0);
	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_index_create(f->st->index, DBOX_ROOT_INO, "1", 1,
					   DBOX_KIND_MESSAGE, S_IFREG | 0600,
					   0, 0, dbox_now_ns(), &a1), 0);
	assert_int_equal(dbox_index_create(f->st->index, DBOX_ROOT_INO, "2", 1,
					   DBOX_KIND_MESSAGE, S_IFREG | 0600,
					   0, 0, dbox_now_ns(), &a2), 0);
	assert_int_equal(dbox_save_begin(f->st, a1.ino, "INBOX", &s1), 0);
	assert_int_equal(dbox_save_begin(f->st, a2.ino, "INBOX", &s2), 0);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	dbox_save_where(s1, &w1);
	dbox_save_where(s2, &w2);
	assert_true(w1.file_id != w2.file_id);

	/* Interleaved writes. */
	assert_int_equal(dbox_save_write(s1, m1.body, 5, 0), 0);
	assert_int_equal(dbox_save_write(s2, m2.body, 8, 0), 0);
	assert_int_equal(dbox_save_write(s1, m1.body + 5, 9, 5), 0);
	assert_int_equal(dbox_save_write(s2, m2.body + 8, 8, 8), 0);

	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_save_finish(s2, 2, false, &m2.loc), 0);
	assert_int_equal(dbox_save_finish(s1, 1, false, &m1.loc), 0);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	dbox_save_free(&s1);
	dbox_save_free(&s2);
	dbox_store_mutex_unlock(f->st);
	m1.ino = a1.ino;
	m2.ino = a2.ino;
	expect_content(f->st, &m1, 3);
	expect_content(f->st, &m2, 3);

	/* The pool keeps both; the next save appends to one of them. */
	save_msg(f->st, DBOX_ROOT_INO, "3", "INBOX", m3);
	assert_true(m3->loc.file_id == m1.loc.file_id ||
		    m3->loc.file_id == m2.loc.file_id);
	assert_int_equal(mfile_size(f, m3->loc.file_id),
			 (int64_t)(m3->loc.offset + m3->loc.record_size));
	walk_mfile(f, m1.loc.file_id, &w);
	assert_int_equal(w.count, m3->loc.file_id == m1.loc.file_id ? 2 : 1);
	expect_record(&w.rec[0], &m1, "INBOX");
	walk_mfile(f, m2.loc.file_id, &w);
	assert_int_equal(w.count, m3->loc.file_id == m2.loc.file_id ? 2 : 1);
	expect_record(&w.rec[0], &m2, "INBOX");
	expect_content(f->st, m3, 50);
	free_msg(m3);
}

/* --- rotation --------------------------------------------------------- */

static void test_rotate(void **state)
{
	struct fix *f = *state;
	enum { N = 12, ROTATE = 4096 };
	struct saved *m[N];
	struct walk w;
	uint32_t max_id = 0, first_new;
	unsigned int records = 0;
	char name[16];

	open_fix(f, ROTATE);
	assert_int_equal(f->st->rotate_size, ROTATE);
	for (unsigned int i = 0; i < N; i++) {
		/* One message bigger than the rotate size on its own. */
		m[i] = new_msg(i, i == 5 ? 3 * ROTATE : 1500);
		snprintf(name, sizeof(name), "m%u", i);
		save_msg(f->st, DBOX_ROOT_INO, name, "INBOX", m[i]);
		/* A message starts only in a file not yet full. */
		assert_true(m[i]->loc.offset < ROTATE);
		if (i > 0) {
			assert_true(m[i]->loc.file_id >= m[i - 1]->loc.file_id);
			if (m[i]->loc.file_id == m[i - 1]->loc.file_id)
				assert_int_equal(m[i]->loc.offset,
						 m[i - 1]->loc.offset +
						 m[i - 1]->loc.record_size);
			else
				assert_int_equal(m[i]->loc.file_id,
						 m[i - 1]->loc.file_id + 1);
		}
		if (m[i]->loc.file_id > max_id)
			max_id = m[i]->loc.file_id;
	}
	assert_true(max_id >= 4);
	/* Full files left the pool (and closed their descriptors). */
	assert_true(f->st->append_count <= 1);
	for (size_t i = 0; i < f->st->append_count; i++) {
		assert_false(f->st->append[i]->busy);
		assert_true(f->st->append[i]->size < ROTATE);
		assert_int_equal(f->st->append[i]->file_id, max_id);
	}

	/* Every file but the last is full; each matches its committed end
	   and holds valid records of the messages placed in it. */
	for (uint32_t id = 1; id <= max_id; id++) {
		int64_t size = mfile_size(f, id);

		assert_int_equal(size, (int64_t)committed_end(f->st, id));
		if (id < max_id)
			assert_true(size >= ROTATE);
		walk_mfile(f, id, &w);
		assert_true(w.count >= 1);
		unsigned int k = 0;
		for (unsigned int i = 0; i < N; i++) {
			if (m[i]->loc.file_id != id)
				continue;
			assert_true(k < w.count);
			expect_record(&w.rec[k++], m[i], "INBOX");
		}
		assert_int_equal(k, w.count);
		records += w.count;
	}
	assert_int_equal(records, N);
	for (unsigned int i = 0; i < N; i++)
		expect_content(f->st, m[i], 1024);

	/* After a reopen, the last m.N (full here) is not appended to: a
	   new file is started past every file the index or the disk knows
	   of.  m.N numbers are never reused. */
	assert_true(committed_end(f->st, max_id) >= ROTATE);
	close_fix(f);
	open_fix(f, ROTATE);
	assert_int_equal(f->st->append_count, 0);
	struct saved *x = new_msg(100, 10);
	save_msg(f->st, DBOX_ROOT_INO, "x", "INBOX", x);
	first_new = x->loc.file_id;
	assert_int_equal(first_new, max_id + 1);
	assert_true(x->loc.offset < 64); /* right after the header line */
	assert_int_equal(mfile_size(f, max_id),
			 (int64_t)committed_end(f->st, max_id));

	/* x's file is below the rotate size: after a reopen it is the one
	   the next message goes to, right after x, and no new file is
	   started. */
	close_fix(f);
	open_fix(f, ROTATE);
	assert_int_equal(f->st->append_count, 1);
	assert_int_equal(f->st->append[0]->file_id, first_new);
	assert_int_equal(f->st->append[0]->size,
			 x->loc.offset + x->loc.record_size);
	assert_false(f->st->append[0]->busy);
	struct saved *x2 = new_msg(103, 100);
	save_msg(f->st, DBOX_ROOT_INO, "x2", "INBOX", x2);
	assert_int_equal(x2->loc.file_id, first_new);
	assert_int_equal(x2->loc.offset, x->loc.offset + x->loc.record_size);
	assert_int_equal(mfile_size(f, first_new + 1), -1);
	walk_mfile(f, first_new, &w);
	assert_int_equal(w.count, 2);
	expect_record(&w.rec[0], x, "INBOX");
	expect_record(&w.rec[1], x2, "INBOX");
	close_fix(f);

	/* An m.N on disk the index does not know (a crash after creating
	   it, or a purge in progress) is not appended to: the last file
	   the index knows still is ... */
	char *storage = store_file(f, "storage");
	int dfd = open(storage, O_RDONLY | O_DIRECTORY);
	uint64_t hdr;
	free(storage);
	assert_true(dfd >= 0);
	int fd = dbox_file_create(dfd, first_new + 5, &hdr);
	assert_true(fd >= 0);
	close(fd);
	open_fix(f, ROTATE);
	struct saved *y = new_msg(101, 10);
	save_msg(f->st, DBOX_ROOT_INO, "y", "INBOX", y);
	assert_int_equal(y->loc.file_id, first_new);
	assert_int_equal(y->loc.offset, x2->loc.offset + x2->loc.record_size);
	assert_int_equal(mfile_size(f, first_new + 5), (int64_t)hdr);
	/* ... until it is full; then, after a reopen, a new file is started
	   past the unknown one. */
	struct saved *big = new_msg(104, 2 * ROTATE);
	save_msg(f->st, DBOX_ROOT_INO, "big", "INBOX", big);
	assert_int_equal(big->loc.file_id, first_new);
	assert_true(committed_end(f->st, first_new) >= ROTATE);
	close_fix(f);
	open_fix(f, ROTATE);
	assert_int_equal(f->st->append_count, 0);
	struct saved *y2 = new_msg(105, 10);
	save_msg(f->st, DBOX_ROOT_INO, "y2", "INBOX", y2);
	assert_int_equal(y2->loc.file_id, first_new + 6);
	assert_int_equal(mfile_size(f, first_new + 5), (int64_t)hdr);
	close_fix(f);

	/* and one the index knows but which is gone from disk: it is not
	   adopted and its number not reused. */
	char name2[16];
	dbox_file_name(name2, y2->loc.file_id);
	assert_int_equal(unlinkat(dfd, name2, 0), 0);
	dbox_file_name(name2, first_new + 5);
	assert_int_equal(unlinkat(dfd, name2, 0), 0);
	close(dfd);
	errors_reset();
	open_fix(f, ROTATE);
	assert_int_equal(f->st->append_count, 0);
	struct saved *z = new_msg(102, 10);
	save_msg(f->st, DBOX_ROOT_INO, "z", "INBOX", z);
	assert_int_equal(z->loc.file_id, first_new + 7);

	for (unsigned int i = 0; i < N; i++) {
		expect_content(f->st, m[i], 4096);
		free_msg(m[i]);
	}
	expect_content(f->st, x, 4096);
	expect_content(f->st, x2, 4096);
	expect_content(f->st, y, 4096);
	expect_content(f->st, big, 4096);
	expect_content(f->st, z, 4096);
	free_msg(x);
	free_msg(x2);
	free_msg(y);
	free_msg(big);
	free_msg(y2);
	free_msg(z);
}

/* --- crash recovery --------------------------------------------------- */

/* What the crashing child tells the parent. */
struct crash_report {
	uint64_t cur;
	struct saved committed[2]; /* bodies not valid in the parent */
	uint64_t writing_ino;
	uint64_t end_before_crash;
};

static void test_crash_recovery(void **state)
{
	struct fix *f = *state;
	struct crash_report rep;
	struct saved *m[2] = { new_msg(10, 3000), new_msg(11, 20000) };
	struct walk w;
	struct dbox_attr attr;
	struct dbox_msgloc loc;
	uint64_t end;
	int pipefd[2];
	pid_t pid;

	assert_int_equal(pipe(pipefd), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct dbox_store *st = NULL;
		struct dbox_save *save = NULL;
		struct dbox_msgloc where;
		char *junk = make_body(99, 5000);

		close(pipefd[0]);
		memset(&rep, 0, sizeof(rep));
		CHILD_CHECK(store_open(f->store, 0, true, &st) == 0);
		dbox_store_mutex_lock(st); /* one thread: held all along */
		CHILD_CHECK(dbox_index_begin(st->index) == 0);
		CHILD_CHECK(dbox_index_create(st->index, DBOX_ROOT_INO, "cur",
					      3, DBOX_KIND_DIR, S_IFDIR | 0700,
					      0, 0, dbox_now_ns(), &attr) == 0);
		CHILD_CHECK(dbox_index_commit(st->index, false) == 0);
		rep.cur = attr.ino;
		/* Two delivered messages ... */
		for (int i = 0; i < 2; i++) {
			char name[16];

			snprintf(name, sizeof(name), "m%d", i);
			CHILD_CHECK(dbox_index_begin(st->index) == 0);
			CHILD_CHECK(dbox_index_create(st->index, rep.cur, name,
						      2, DBOX_KIND_MESSAGE,
						      S_IFREG | 0600, 0, 0,
						      dbox_now_ns(),
						      &attr) == 0);
			CHILD_CHECK(dbox_save_begin(st, attr.ino, "INBOX",
						    &save) == 0);
			CHILD_CHECK(dbox_save_write(save, m[i]->body,
						    m[i]->len, 0) == 0);
			CHILD_CHECK(dbox_save_finish(save, m[i]->received,
						     false,
						     &rep.committed[i].loc) ==
				    0);
			CHILD_CHECK(dbox_index_commit(st->index, false) == 0);
			dbox_save_free(&save);
			rep.committed[i].ino = attr.ino;
		}
		/* ... and one being written when the process dies: its
		   WRITING row is committed, its bytes are on disk. */
		CHILD_CHECK(dbox_index_begin(st->index) == 0);
		CHILD_CHECK(dbox_index_create(st->index, rep.cur, "w", 1,
					      DBOX_KIND_MESSAGE,
					      S_IFREG | 0600, 0, 0,
					      dbox_now_ns(), &attr) == 0);
		CHILD_CHECK(dbox_save_begin(st, attr.ino, "INBOX", &save) ==
			    0);
		CHILD_CHECK(dbox_save_write(save, junk, 5000, 0) == 0);
		CHILD_CHECK(dbox_index_commit(st->index, false) == 0);
		rep.writing_ino = attr.ino;
		dbox_save_where(save, &where);
		rep.end_before_crash = where.offset + DBOX_MSG_HEADER_SIZE +
				       5000;
		CHILD_CHECK(write(pipefd[1], &rep, sizeof(rep)) ==
			    (ssize_t)sizeof(rep));
		_exit(0); /* no finish, no free, no close */
	}
	close(pipefd[1]);
	assert_int_equal(read(pipefd[0], &rep, sizeof(rep)), sizeof(rep));
	close(pipefd[0]);
	wait_child(pid);
	for (int i = 0; i < 2; i++) {
		m[i]->ino = rep.committed[i].ino;
		m[i]->loc = rep.committed[i].loc;
	}
	end = m[1]->loc.offset + m[1]->loc.record_size;
	assert_int_equal(m[0]->loc.file_id, 1);
	assert_int_equal(m[1]->loc.file_id, 1);
	assert_int_equal(mfile_size(f, 1), (int64_t)rep.end_before_crash);
	assert_true(rep.end_before_crash > end);
	/* Before recovery the file holds garbage past the committed end. */
	{
		char *path = store_file(f, "storage/m.1");
		int fd = open(path, O_RDONLY);
		uint64_t bad = 0;

		free(path);
		assert_true(fd >= 0);
		memset(&w, 0, sizeof(w));
		errors_reset();
		assert_int_equal(dbox_file_walk(fd, 1, walk_cb, &w, &bad), -EIO);
		assert_int_equal(bad, end);
		close(fd);
	}

	open_fix(f, 0);
	/* The unfinished message is gone with its name ... */
	assert_int_equal(dbox_index_lookup(f->st->index, rep.cur, "w", 1,
					   &attr), -ENOENT);
	assert_int_equal(dbox_index_getattr(f->st->index, rep.writing_ino,
					    &attr), -ENOENT);
	assert_int_equal(dbox_index_msg_get(f->st->index, rep.writing_ino,
					    &loc), -ENOENT);
	/* ... its bytes are cut off ... */
	assert_int_equal(mfile_size(f, 1), (int64_t)end);
	assert_int_equal(committed_end(f->st, 1), end);
	/* ... and the delivered ones are intact and valid dbox. */
	for (int i = 0; i < 2; i++) {
		assert_int_equal(dbox_index_lookup(f->st->index, rep.cur,
						   i ? "m1" : "m0", 2,
						   &attr), 0);
		assert_int_equal(attr.ino, m[i]->ino);
		assert_int_equal(dbox_index_msg_get(f->st->index, m[i]->ino,
						    &loc), 0);
		assert_int_equal(loc.state, DBOX_MSG_COMMITTED);
		assert_int_equal(loc.offset, m[i]->loc.offset);
		expect_content(f->st, m[i], 4096);
	}
	walk_mfile(f, 1, &w);
	assert_int_equal(w.count, 2);
	expect_record(&w.rec[0], m[0], "INBOX");
	expect_record(&w.rec[1], m[1], "INBOX");

	/* Life goes on: m.1, cut back to its committed end, is whole and
	   below the rotate size, so the next message goes right after m1,
	   where the unfinished bytes were; no new file is started. */
	assert_int_equal(f->st->append_count, 1);
	assert_int_equal(f->st->append[0]->file_id, 1);
	assert_int_equal(f->st->append[0]->size, end);
	struct saved *n = new_msg(12, 777);
	save_msg(f->st, rep.cur, "n", "INBOX", n);
	assert_int_equal(n->loc.file_id, 1);
	assert_int_equal(n->loc.offset, end);
	assert_int_equal(mfile_size(f, 2), -1);
	expect_content(f->st, n, 100);
	close_fix(f);
	open_fix(f, 0);
	expect_content(f->st, n, 100);
	expect_content(f->st, m[0], 100);
	expect_content(f->st, m[1], 100);
	end = n->loc.offset + n->loc.record_size;
	assert_int_equal(mfile_size(f, 1), (int64_t)end);
	assert_int_equal(committed_end(f->st, 1), end);
	walk_mfile(f, 1, &w);
	assert_int_equal(w.count, 3);
	expect_record(&w.rec[0], m[0], "INBOX");
	expect_record(&w.rec[1], m[1], "INBOX");
	expect_record(&w.rec[2], n, "INBOX");
	free_msg(n);
	free_msg(m[0]);
	free_msg(m[1]);
}

/* In a child: open the store with `rotate`, save b as ROOT/b, finish it
   (synced) and die before the index transaction commits.  Returns b's
   location as the child saw it. */
static void crash_before_commit(struct fix *f, uint64_t rotate,
				struct saved *b)
{
	struct dbox_attr attr;
	int pipefd[2];
	pid_t pid;

	assert_int_equal(pipe(pipefd), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct dbox_store *st = NULL;
		struct dbox_save *save = NULL;
		struct dbox_msgloc loc;

		close(pipefd[0]);
		CHILD_CHECK(store_open(f->store, rotate, true, &st) == 0);
		dbox_store_mutex_lock(st); /* one thread: held all along */
		CHILD_CHECK(dbox_index_begin(st->index) == 0);
		CHILD_CHECK(dbox_index_create(st->index, DBOX_ROOT_INO, "b", 1,
					      DBOX_KIND_MESSAGE,
					      S_IFREG | 0600, 0, 0,
					      dbox_now_ns(), &attr) == 0);
		CHILD_CHECK(dbox_save_begin(st, attr.ino, "INBOX", &save) ==
			    0);
		CHILD_CHECK(dbox_save_write(save, b->body, b->len, 0) == 0);
		CHILD_CHECK(dbox_save_finish(save, b->received, true, &loc) ==
			    0);
		CHILD_CHECK(write(pipefd[1], &loc, sizeof(loc)) ==
			    (ssize_t)sizeof(loc));
		_exit(0); /* no commit */
	}
	close(pipefd[1]);
	assert_int_equal(read(pipefd[0], &b->loc, sizeof(b->loc)),
			 sizeof(b->loc));
	close(pipefd[0]);
	wait_child(pid);
}

/* A crash after a record was finished on disk but before the index
   transaction that wrote it committed, with no trace in the index (no
   WRITING row, no inflight.m.N): recovery cannot tell it from a message
   an older index does not know, so the whole record is kept, never cut
   (issue 12.2); the file then takes no new records, and a file the index
   does not know keeps its number.  'dboxadm rebuild' brings such records
   back. */
static void test_crash_before_commit(void **state)
{
	struct fix *f = *state;
	struct saved *a = new_msg(20, 1234), *b = new_msg(21, 4321);
	struct dbox_attr attr;
	struct walk w;
	uint64_t end, size;
	int64_t kept;

	open_fix(f, 0);
	save_msg(f->st, DBOX_ROOT_INO, "a", "INBOX", a);
	close_fix(f);
	end = a->loc.offset + a->loc.record_size;

	/* The child's store took m.1 back (below the rotate size) and wrote
	   b after a: a valid record, but past the committed end. */
	crash_before_commit(f, 0, b);
	assert_int_equal(b->loc.file_id, 1);
	assert_int_equal(b->loc.offset, end);

	open_fix(f, 0);
	assert_int_equal(dbox_index_lookup(f->st->index, DBOX_ROOT_INO, "b", 1,
					   &attr), -ENOENT);
	/* Kept whole, past the committed end the index still has. */
	assert_int_equal(committed_end(f->st, 1), end);
	assert_int_equal(mfile_size(f, 1),
			 (int64_t)(end + b->loc.record_size));
	assert_int_equal(dbox_index_meta_get(f->st->index, "kept.m.1", &kept), 0);
	assert_int_equal(kept, (int64_t)(end + b->loc.record_size));
	walk_mfile(f, 1, &w);
	assert_int_equal(w.count, 2);
	expect_record(&w.rec[1], b, "INBOX");
	expect_content(f->st, a, 4096);
	/* New mail goes to a new file, not after the kept record. */
	struct saved *c = new_msg(22, 10);
	save_msg(f->st, DBOX_ROOT_INO, "c", "INBOX", c);
	assert_int_equal(c->loc.file_id, 2);
	close_fix(f);
	/* The next recovery keeps it again. */
	open_fix(f, 0);
	assert_int_equal(mfile_size(f, 1),
			 (int64_t)(end + b->loc.record_size));
	close_fix(f);

	/* Again, in a file the child creates in its uncommitted transaction
	   (m.2 full for it): the index does not know m.3, but its record is
	   whole and no message has its GUID, so it is kept too. */
	end = c->loc.offset + c->loc.record_size;
	crash_before_commit(f, end, b);
	assert_int_equal(b->loc.file_id, 3);
	open_fix(f, 0);
	assert_int_equal(dbox_index_mfile_get(f->st->index, 3, &size), -ENOENT);
	walk_mfile(f, 3, &w);
	assert_int_equal(w.count, 1);
	expect_record(&w.rec[0], b, "INBOX");
	/* Nothing is appended to it. */
	struct saved *d = new_msg(23, 10);
	save_msg(f->st, DBOX_ROOT_INO, "d", "INBOX", d);
	assert_int_not_equal(d->loc.file_id, 3);
	expect_content(f->st, a, 4096);
	expect_content(f->st, c, 4096);
	expect_content(f->st, d, 4096);
	close_fix(f);
	free_msg(a);
	free_msg(b);
	free_msg(c);
	free_msg(d);
}

/* A crash while a committed message was being rewritten: it was
   finished and committed, then written again (WRITING), growing by
   `extra` bytes over its metadata block, when the process died.
   Recovery drops it, but its record lies inside the committed end, now
   damaged: the file must not take new messages after it, or no walk of
   the file (rebuild, dump, Dovecot) would reach them.  With a small
   `extra` the file does not even grow, so recovery cuts nothing. */
static void crash_while_rewriting(struct fix *f, size_t extra)
{
	struct saved *a = new_msg(30, 1500), *b = new_msg(31, 700);
	char *more = make_body(32, extra);
	struct dbox_attr attr;
	struct dbox_msgloc loc;
	struct walk w;
	uint64_t end, bad = 0;
	int64_t size_after_crash;
	int pipefd[2];
	pid_t pid;

	open_fix(f, 0);
	save_msg(f->st, DBOX_ROOT_INO, "a", "INBOX", a);
	close_fix(f);

	assert_int_equal(pipe(pipefd), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct dbox_store *st = NULL;
		struct dbox_save *save = NULL;

		close(pipefd[0]);
		CHILD_CHECK(store_open(f->store, 0, true, &st) == 0);
		dbox_store_mutex_lock(st); /* one thread: held all along */
		CHILD_CHECK(dbox_index_begin(st->index) == 0);
		CHILD_CHECK(dbox_index_create(st->index, DBOX_ROOT_INO, "b", 1,
					      DBOX_KIND_MESSAGE,
					      S_IFREG | 0600, 0, 0,
					      dbox_now_ns(), &attr) == 0);
		CHILD_CHECK(dbox_save_begin(st, attr.ino, "INBOX", &save) ==
			    0);
		CHILD_CHECK(dbox_save_write(save, b->body, b->len, 0) == 0);
		CHILD_CHECK(dbox_save_finish(save, b->received, false,
					     &b->loc) == 0);
		CHILD_CHECK(dbox_index_commit(st->index, false) == 0);
		/* A write after the close: WRITING again, then more bytes
		   at the body's end, over the metadata block. */
		CHILD_CHECK(dbox_index_begin(st->index) == 0);
		CHILD_CHECK(dbox_save_reopen(save) == 0);
		CHILD_CHECK(dbox_index_commit(st->index, false) == 0);
		CHILD_CHECK(dbox_save_write(save, more, extra, b->len) == 0);
		b->ino = attr.ino;
		CHILD_CHECK(write(pipefd[1], b, sizeof(*b)) ==
			    (ssize_t)sizeof(*b));
		_exit(0); /* no finish, no free, no close */
	}
	close(pipefd[1]);
	{
		char *body = b->body;

		assert_int_equal(read(pipefd[0], b, sizeof(*b)), sizeof(*b));
		b->body = body;
	}
	close(pipefd[0]);
	wait_child(pid);
	free(more);

	/* The child appended b to m.1 (adopted), right after a. */
	end = a->loc.offset + a->loc.record_size;
	assert_int_equal(b->loc.file_id, 1);
	assert_int_equal(b->loc.offset, end);
	end = b->loc.offset + b->loc.record_size;
	size_after_crash = mfile_size(f, 1);
	if (extra < 16)
		assert_int_equal(size_after_crash, (int64_t)end);
	else
		assert_true(size_after_crash > (int64_t)end);

	errors_reset();
	open_fix(f, 0);
	/* The open found (and logged) the damaged record. */
	assert_true(error_count >= 1);
	assert_non_null(strstr(last_error, "m.1 offset"));
	/* b is gone; m.1 ends at its committed end, which still holds
	   b's damaged record; a is intact. */
	assert_int_equal(dbox_index_lookup(f->st->index, DBOX_ROOT_INO, "b", 1,
					   &attr), -ENOENT);
	assert_int_equal(dbox_index_msg_get(f->st->index, b->ino, &loc),
			 -ENOENT);
	assert_int_equal(committed_end(f->st, 1), end);
	assert_int_equal(mfile_size(f, 1), (int64_t)end);
	expect_content(f->st, a, 4096);
	{
		char *path = store_file(f, "storage/m.1");
		int fd = open(path, O_RDONLY);

		free(path);
		assert_true(fd >= 0);
		memset(&w, 0, sizeof(w));
		assert_int_equal(dbox_file_walk(fd, 1, walk_cb, &w, &bad), -EIO);
		close(fd);
	}
	assert_int_equal(bad, b->loc.offset);
	assert_int_equal(w.count, 1);
	expect_record(&w.rec[0], a, "INBOX");

	/* So m.1 is not adopted: the next message starts a new file. */
	assert_int_equal(f->st->append_count, 0);
	struct saved *c = new_msg(33, 300);
	save_msg(f->st, DBOX_ROOT_INO, "c", "INBOX", c);
	assert_int_equal(c->loc.file_id, 2);
	assert_int_equal(mfile_size(f, 1), (int64_t)end);
	walk_mfile(f, 2, &w);
	assert_int_equal(w.count, 1);
	expect_record(&w.rec[0], c, "INBOX");

	/* After a reopen m.2 is the last file and takes the next one. */
	close_fix(f);
	open_fix(f, 0);
	struct saved *d = new_msg(34, 300);
	save_msg(f->st, DBOX_ROOT_INO, "d", "INBOX", d);
	assert_int_equal(d->loc.file_id, 2);
	assert_int_equal(d->loc.offset, c->loc.offset + c->loc.record_size);
	assert_int_equal(mfile_size(f, 1), (int64_t)end);
	walk_mfile(f, 2, &w);
	assert_int_equal(w.count, 2);
	expect_record(&w.rec[0], c, "INBOX");
	expect_record(&w.rec[1], d, "INBOX");
	expect_content(f->st, a, 512);
	expect_content(f->st, c, 512);
	expect_content(f->st, d, 512);
	free_msg(a);
	free_msg(b);
	free_msg(c);
	free_msg(d);
}

static void test_crash_while_rewriting(void **state)
{
	/* The record grows past the committed end: recovery cuts it back
	   to there, through b's body. */
	crash_while_rewriting(*state, 5000);
}

static void test_crash_while_rewriting_in_place(void **state)
{
	/* A few bytes over the metadata magic: the file does not grow. */
	crash_while_rewriting(*state, 4);
}

/* The copy fs/ makes of a committed message before writing to it (or of
   a plain file turned into a message) starts without a WRITING row
   (dbox_save_begin_unindexed) and is copied and sealed outside the store
   lock: killed after its seal, before its finish commits it, it is a
   whole record past the committed end.  With its in-flight mark committed
   before the first byte (as fs/ does) recovery cuts it and the index
   keeps naming the acknowledged record; without one, recovery must take
   it for a record of a newer index and keep it (kept_records) - which is
   why the mark may not be skipped. */
static void crash_after_unlocked_copy(struct fix *f, bool mark)
{
	struct saved *a = new_msg(40, 2500), *c = new_msg(41, 4000);
	struct dbox_msgloc loc;
	uint64_t copy_at[2];
	int pipefd[2];
	pid_t pid;

	open_fix(f, 0);
	save_msg(f->st, DBOX_ROOT_INO, "a", "INBOX", a);
	close_fix(f);

	assert_int_equal(pipe(pipefd), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct dbox_store *st = NULL;
		struct dbox_save *save = NULL;
		struct dbox_msgloc where;

		close(pipefd[0]);
		CHILD_CHECK(store_open(f->store, 0, true, &st) == 0);
		dbox_store_mutex_lock(st); /* one thread: held all along */
		CHILD_CHECK(dbox_index_begin(st->index) == 0);
		CHILD_CHECK(dbox_save_begin_unindexed(st, a->ino, "INBOX",
						      &save) == 0);
		if (mark)
			CHILD_CHECK(dbox_save_note_inflight(save) == 0);
		CHILD_CHECK(dbox_index_commit(st->index, false) == 0);
		/* Unlocked in fs/: the bytes, then the seal. */
		CHILD_CHECK(dbox_save_write(save, c->body, c->len, 0) == 0);
		CHILD_CHECK(dbox_save_seal(save, c->received, NULL, NULL) == 0);
		dbox_save_where(save, &where);
		copy_at[0] = where.file_id;
		copy_at[1] = where.offset;
		CHILD_CHECK(write(pipefd[1], copy_at, sizeof(copy_at)) ==
			    (ssize_t)sizeof(copy_at));
		_exit(0); /* no finish, no free, no close */
	}
	close(pipefd[1]);
	assert_int_equal(read(pipefd[0], copy_at, sizeof(copy_at)),
			 sizeof(copy_at));
	close(pipefd[0]);
	wait_child(pid);
	/* The sealed copy is a whole record on disk past the committed end. */
	assert_true(mfile_size(f, (uint32_t)copy_at[0]) >
		    (int64_t)copy_at[1] + (int64_t)c->len);

	errors_reset();
	open_fix(f, 0);
	/* The index still names the acknowledged record, whole. */
	assert_int_equal(dbox_index_msg_get(f->st->index, a->ino, &loc), 0);
	assert_int_equal(loc.file_id, a->loc.file_id);
	assert_int_equal(loc.offset, a->loc.offset);
	expect_content(f->st, a, 1024);
	if (mark) {
		assert_int_equal(f->st->kept_records, 0);
		assert_int_equal(mfile_size(f, (uint32_t)copy_at[0]),
				 (int64_t)copy_at[1]);
	} else {
		assert_int_equal(f->st->kept_records, 1);
	}
	free_msg(a);
	free_msg(c);
}

static void test_crash_after_unlocked_copy(void **state)
{
	crash_after_unlocked_copy(*state, true);
}

static void test_crash_after_unmarked_copy_keeps_it(void **state)
{
	crash_after_unlocked_copy(*state, false);
}

/* Plain files unlinked while open are removed at the next open. */
static void test_recover_plain_files(void **state)
{
	struct fix *f = *state;
	struct dbox_attr gone, kept;
	uint64_t ino;
	uint32_t nlink;
	char name[64];
	int fd;

	open_fix(f, 0);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_index_create(f->st->index, DBOX_ROOT_INO,
					   ".rsync.tmp", 10, DBOX_KIND_FILE,
					   S_IFREG | 0600, 0, 0, dbox_now_ns(),
					   &gone), 0);
	assert_int_equal(dbox_index_create(f->st->index, DBOX_ROOT_INO,
					   "notes", 5, DBOX_KIND_FILE,
					   S_IFREG | 0600, 0, 0, dbox_now_ns(),
					   &kept), 0);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	snprintf(name, sizeof(name), "%llu", (unsigned long long)gone.ino);
	fd = openat(f->st->files_fd, name, O_WRONLY | O_CREAT, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "temp", 4), 4);
	close(fd);
	snprintf(name, sizeof(name), "%llu", (unsigned long long)kept.ino);
	fd = openat(f->st->files_fd, name, O_WRONLY | O_CREAT, 0600);
	assert_true(fd >= 0);
	close(fd);

	/* Unlinked while still open; then the process goes away. */
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_index_remove(f->st->index, DBOX_ROOT_INO,
					   ".rsync.tmp", 10, false,
					   dbox_now_ns(), &ino, &nlink), 0);
	assert_int_equal(dbox_index_commit(f->st->index, false), 0);
	assert_int_equal(nlink, 0);
	close_fix(f);

	open_fix(f, 0);
	assert_int_equal(dbox_index_getattr(f->st->index, gone.ino, &gone),
			 -ENOENT);
	snprintf(name, sizeof(name), "%llu", (unsigned long long)gone.ino);
	assert_int_equal(faccessat(f->st->files_fd, name, F_OK, 0), -1);
	snprintf(name, sizeof(name), "%llu", (unsigned long long)kept.ino);
	assert_int_equal(faccessat(f->st->files_fd, name, F_OK, 0), 0);
	assert_int_equal(dbox_index_getattr(f->st->index, kept.ino, &kept), 0);
}

#define T(f) cmocka_unit_test_setup_teardown(f, fix_setup, fix_teardown)

/* The R of a finished record follows utime() (dbox_store_set_received):
   rewritten in place when the hex width is the same, -ERANGE otherwise
   (then only the index has the new date). */
static void test_set_received(void **state)
{
	struct fix *f = *state;
	struct saved *a = new_msg(1, 3000), *b = new_msg(2, 100);
	struct walk w;

	open_fix(f, 0);
	save_msg(f->st, DBOX_ROOT_INO, "a", "INBOX", a);
	save_msg(f->st, DBOX_ROOT_INO, "b", "INBOX", b);
	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_store_set_received(f->st, &a->loc, 1234567890), 0);
	errors_reset();
	assert_int_equal(dbox_store_set_received(f->st, &b->loc, 100000),
			 -ERANGE);
	dbox_store_mutex_unlock(f->st);
	assert_int_equal(error_count, 0);
	walk_mfile(f, 1, &w);
	assert_int_equal(w.count, 2);
	assert_int_equal(w.rec[0].received, 1234567890);
	assert_int_equal(w.rec[1].received, b->received);
	a->received = 1234567890;
	expect_record(&w.rec[0], a, "INBOX");
	expect_content(f->st, a, 512);
	free_msg(a);
	free_msg(b);
}

/* A store opened with compress=gz: every non-empty body is a gzip stream
   with Z = the plaintext size, the index keeps the stored size and the
   plaintext V, reads are byte-exact (also after a reopen without
   compression), and plain records join compressed ones in the same m.N,
   as in a Dovecot store where zlib_save was turned on later. */
static void test_save_compressed(void **state)
{
	struct fix *f = *state;
	struct dbox_store_settings set = { .create = true };
	static const size_t sizes[] = { 0, 1, 100, 65536 + 17, 300000 };
	enum { N = sizeof(sizes) / sizeof(sizes[0]) };
	struct saved *m[N + 1];
	uint64_t cur;
	struct walk w;
	char name[64];

	assert_int_equal(dbox_compress_parse("gz:6", &set.compress), 0);
	assert_int_equal(dbox_store_open(f->store, &set, &f->st), 0);
	cur = mkdir_in(f->st, DBOX_ROOT_INO, "cur");
	for (unsigned int i = 0; i < N; i++) {
		m[i] = new_msg(i, sizes[i]);
		snprintf(name, sizeof(name), "%u.gz:2,", i);
		save_msg(f->st, cur, name, "INBOX", m[i]);
		assert_int_equal(m[i]->loc.vsize,
				 vsize_of(m[i]->body, sizes[i]));
		if (sizes[i] > 1000)
			assert_true(m[i]->loc.body_size < sizes[i]);
		expect_content(f->st, m[i], 4096);
	}
	walk_mfile(f, 1, &w);
	assert_int_equal(w.count, N);
	for (unsigned int i = 0; i < N; i++) {
		assert_int_equal(w.rec[i].body_size, m[i]->loc.body_size);
		assert_int_equal(w.rec[i].vsize, m[i]->loc.vsize);
		assert_string_equal(w.rec[i].guid, m[i]->loc.guid);
		/* empty: stored empty, no Z */
		assert_int_equal(w.rec[i].plain_size, sizes[i]);
	}

	/* Reopened without compression: old messages read, a new one is
	   stored plain after them in the same file. */
	close_fix(f);
	open_fix(f, 0);
	m[N] = new_msg(N, 5000);
	save_msg(f->st, cur, "plain:2,", "INBOX", m[N]);
	assert_int_equal(m[N]->loc.file_id, 1);
	assert_int_equal(m[N]->loc.body_size, 5000);
	walk_mfile(f, 1, &w);
	assert_int_equal(w.count, N + 1);
	assert_int_equal(w.rec[N].plain_size, 0);
	for (unsigned int i = 0; i <= N; i++) {
		expect_content(f->st, m[i], 1000);
		free_msg(m[i]);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_layout),
		T(test_missing),
		T(test_busy),
		T(test_not_empty_refused),
		T(test_bad_index),
		T(test_save_read),
		T(test_save_compressed),
		T(test_set_received),
		T(test_record_metadata),
		T(test_open_reader_checks),
		T(test_pool_rolled_back),
		T(test_save_refinish),
		T(test_save_free_unfinished),
		T(test_parallel_saves),
		T(test_rotate),
		T(test_crash_recovery),
		T(test_crash_before_commit),
		T(test_crash_while_rewriting),
		T(test_crash_while_rewriting_in_place),
		T(test_crash_after_unlocked_copy),
		T(test_crash_after_unmarked_copy_keeps_it),
		T(test_recover_plain_files),
	};

	dbox_log_set_sink(capture_sink);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
