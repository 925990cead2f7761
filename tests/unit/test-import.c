/*
 * test-import.c: unit tests of saving from a file descriptor
 * (engine/save-fd.h), the maildir import (engine/import.h) and the
 * adoption of Dovecot m.N files (engine/import-dovecot.h), each on a real
 * store in its own mkdtemp() directory.
 *
 * The bytes are read back through the store's own reader and the m.N
 * records walked with storage/'s parser, so a test sees what the mount
 * would serve and what Dovecot would read.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "engine/import-dovecot.h"
#include "engine/import.h"
#include "engine/save-fd.h"
#include "engine/store.h"
#include "index/index.h"
#include "storage/dbox-file.h"
#include "storage/dbox-format.h"
#include "storage/dbox-read.h"
#include "test-common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* --- fixture ------------------------------------------------------------ */

struct fix {
	char dir[64];
	char store[128];
	char src[128];      /* a maildir, or a file to save */
	struct dbox_store *st;
};

static int fix_setup(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	tmpdir_make(f->dir, sizeof(f->dir), "test-import");
	snprintf(f->store, sizeof(f->store), "%s/store", f->dir);
	snprintf(f->src, sizeof(f->src), "%s/src", f->dir);
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

static void open_store(struct fix *f, bool gz)
{
	struct dbox_store_settings set = { .create = true };

	if (gz)
		assert_int_equal(dbox_compress_parse("gz", &set.compress), 0);
	assert_int_equal(dbox_store_open(f->store, &set, &f->st), 0);
}

/* path (relative to f->dir) with content, mtime mtime (0: now). */
static void write_file(const struct fix *f, const char *rel,
		       const char *content, size_t len, time_t mtime)
{
	char path[512];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", f->dir, rel);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0640);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, content, len), (ssize_t)len);
	if (mtime != 0) {
		struct timespec ts[2] = { { mtime, 0 }, { mtime, 0 } };

		assert_int_equal(futimens(fd, ts), 0);
	}
	close(fd);
}

static void make_dir(const struct fix *f, const char *rel)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/%s", f->dir, rel);
	assert_int_equal(mkdir(path, 0750), 0);
}

/* The inode at path ("a/b/c") from the root, or -ENOENT. */
static int lookup_path(struct dbox_store *st, const char *path,
		       struct dbox_attr *attr_r)
{
	char *copy = strdup(path), *save = NULL;
	uint64_t dir = DBOX_ROOT_INO;
	int ret = 0;

	assert_non_null(copy);
	attr_r->ino = DBOX_ROOT_INO;
	for (char *c = strtok_r(copy, "/", &save); c != NULL && ret == 0;
	     c = strtok_r(NULL, "/", &save)) {
		ret = dbox_index_lookup(st->index, dir, c, strlen(c), attr_r);
		dir = attr_r->ino;
	}
	free(copy);
	return ret;
}

/* All plaintext bytes of message ino (malloc()ed, *len_r). */
static char *read_message(struct dbox_store *st, uint64_t ino, size_t *len_r)
{
	struct dbox_reader *reader = NULL;
	struct dbox_msgloc loc;
	struct dbox_attr attr;
	char *buf;
	ssize_t n;

	assert_int_equal(dbox_index_getattr(st->index, ino, &attr), 0);
	assert_int_equal(dbox_index_msg_get(st->index, ino, &loc), 0);
	assert_int_equal(loc.state, DBOX_MSG_COMMITTED);
	dbox_store_mutex_lock(st);
	assert_int_equal(dbox_store_open_reader(st, &loc, attr.size, &reader), 0);
	dbox_store_mutex_unlock(st);
	buf = malloc(attr.size + 1);
	assert_non_null(buf);
	n = dbox_reader_pread(reader, buf, attr.size + 1, 0);
	assert_int_equal(n, (ssize_t)attr.size);
	dbox_reader_free(&reader);
	*len_r = (size_t)n;
	return buf;
}

struct meta {
	uint64_t offset;
	time_t received;
	char mailbox[64];
	char guid[DBOX_GUID_HEX_LEN * 2 + 1];
	uint64_t plain, body, record;
};

static int meta_cb(void *ctx, uint64_t offset, uint64_t body_size,
		   const struct dbox_metadata *md, uint64_t record_size)
{
	struct meta *m = ctx;

	if (offset != m->offset)
		return 0;
	m->received = md->received;
	snprintf(m->mailbox, sizeof(m->mailbox), "%s",
		 md->mailbox != NULL ? md->mailbox : "");
	snprintf(m->guid, sizeof(m->guid), "%s", md->guid);
	m->plain = md->has_plain_size ? md->plain_size : body_size;
	m->body = body_size;
	m->record = record_size;
	return 1;
}

/* The metadata of the record at loc, as the dbox parser reads it. */
static void record_meta(const struct fix *f, const struct dbox_msgloc *loc,
			struct meta *m)
{
	char path[512], name[16];
	int fd;

	dbox_file_name(name, loc->file_id);
	snprintf(path, sizeof(path), "%s/" DBOX_STORE_STORAGE "/%s", f->store,
		 name);
	fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	memset(m, 0, sizeof(*m));
	m->offset = loc->offset;
	assert_int_equal(dbox_file_walk(fd, loc->file_id, meta_cb, m, NULL), 1);
	close(fd);
}

static uint64_t new_message(struct dbox_store *st, const char *name)
{
	struct dbox_attr attr;

	assert_int_equal(dbox_index_create(st->index, DBOX_ROOT_INO, name,
					   strlen(name), DBOX_KIND_MESSAGE,
					   S_IFREG | 0600, getuid(), getgid(),
					   dbox_now_ns(), &attr), 0);
	return attr.ino;
}

/* --- save from a file descriptor ----------------------------------------- */

/* The bytes of a file become a committed record: read back equal, the
   received date in R, B the mailbox, the sizes the file's. */
static void save_fd_roundtrip(struct fix *f, bool gz)
{
	uint64_t rng = 42;
	size_t len = 300 * 1024 + 17, back_len;
	char *text = mail_text(&rng, len, "Subject: save-fd", (const char *[]){
		"alpha", "beta", "gamma" }, 3), *back;
	struct dbox_msgloc loc, row;
	struct meta m;
	uint64_t ino, end;
	int64_t n;
	int fd;

	open_store(f, gz);
	write_file(f, "src", text, len, 0);
	fd = open(f->src, O_RDONLY);
	assert_true(fd >= 0);
	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	ino = new_message(f->st, "m1");
	n = dbox_save_from_fd(f->st, ino, "Archive/2024", fd, 1700000000, NULL, &loc);
	assert_int_equal(n, (int64_t)len);
	assert_int_equal(dbox_index_commit(f->st->index, true), 0);
	dbox_store_mutex_unlock(f->st);
	close(fd);

	assert_int_equal(dbox_index_msg_get(f->st->index, ino, &row), 0);
	assert_int_equal(row.state, DBOX_MSG_COMMITTED);
	assert_int_equal(row.offset, loc.offset);
	assert_int_equal(row.record_size, loc.record_size);
	assert_int_equal(dbox_index_mfile_get(f->st->index, loc.file_id, &end), 0);
	assert_int_equal(end, loc.offset + loc.record_size);
	record_meta(f, &loc, &m);
	assert_int_equal(m.received, 1700000000);
	assert_string_equal(m.mailbox, "Archive/2024");
	assert_string_equal(m.guid, loc.guid);
	assert_int_equal(m.plain, len);
	assert_int_equal(m.body, loc.body_size);
	assert_int_equal(m.record, loc.record_size);
	if (gz)
		assert_true(loc.body_size < len);
	else
		assert_int_equal(loc.body_size, len);

	{	/* the inode's size is the caller's: set, then read back */
		struct dbox_attr attr;

		assert_int_equal(dbox_index_getattr(f->st->index, ino, &attr), 0);
		attr.size = (uint64_t)n;
		assert_int_equal(dbox_index_setattr(f->st->index, &attr), 0);
	}
	back = read_message(f->st, ino, &back_len);
	assert_int_equal(back_len, len);
	assert_memory_equal(back, text, len);
	free(back);
	free(text);
}

static void test_save_fd_roundtrip(void **state)
{
	save_fd_roundtrip(*state, false);
}

static void test_save_fd_roundtrip_compressed(void **state)
{
	save_fd_roundtrip(*state, true);
}

/* A descriptor that cannot be read (a directory: EISDIR) leaves no index
   row and no byte in the m.N: the next message starts where it would
   have. */
static void test_save_fd_unreadable(void **state)
{
	struct fix *f = *state;
	struct dbox_msgloc loc, first, second;
	struct stat sb;
	char path[512], name[16];
	uint64_t ino, ino2;
	int dfd, fd;

	open_store(f, false);
	write_file(f, "src", "Subject: one\n\nbody\n", 19, 0);
	fd = open(f->src, O_RDONLY);
	assert_true(fd >= 0);
	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	ino = new_message(f->st, "m1");
	assert_int_equal(dbox_save_from_fd(f->st, ino, "INBOX", fd, 1, NULL, &first),
			 19);
	dfd = open(f->dir, O_RDONLY | O_DIRECTORY);
	assert_true(dfd >= 0);
	ino2 = new_message(f->st, "m2");
	assert_int_equal(dbox_save_from_fd(f->st, ino2, "INBOX", dfd, 1, NULL, &loc),
			 -EISDIR);
	close(dfd);
	assert_int_equal(dbox_index_msg_get(f->st->index, ino2, &loc), -ENOENT);
	assert_int_equal(dbox_index_commit(f->st->index, true), 0);
	dbox_store_mutex_unlock(f->st);

	/* Nothing of it on disk: the m.N ends at the first record. */
	dbox_file_name(name, first.file_id);
	snprintf(path, sizeof(path), "%s/" DBOX_STORE_STORAGE "/%s", f->store,
		 name);
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal((uint64_t)sb.st_size, first.offset + first.record_size);
	/* and the next save starts right there */
	assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	assert_int_equal(dbox_save_from_fd(f->st, ino2, "INBOX", fd, 2, NULL, &second),
			 19);
	assert_int_equal(dbox_index_commit(f->st->index, true), 0);
	dbox_store_mutex_unlock(f->st);
	assert_int_equal(second.file_id, first.file_id);
	assert_int_equal(second.offset, first.offset + first.record_size);
	close(fd);
}

/* A plain file's backing file: the bytes, mode 0600 and the times given;
   an unreadable source leaves no backing file. */
static void test_file_from_fd(void **state)
{
	struct fix *f = *state;
	struct timespec times[2] = { { 1600000000, 5 }, { 1500000000, 7 } };
	char path[512], buf[64];
	struct stat sb;
	int fd, dfd;

	open_store(f, false);
	write_file(f, "src", "3 V1 N1\n", 8, 0);
	fd = open(f->src, O_RDONLY);
	assert_true(fd >= 0);
	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_store_file_from_fd(f->st, 77, fd, times, NULL), 8);
	dbox_store_mutex_unlock(f->st);
	close(fd);
	snprintf(path, sizeof(path), "%s/" DBOX_STORE_FILES "/77", f->store);
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal(sb.st_mode & 07777, 0600);
	assert_int_equal(sb.st_size, 8);
	assert_int_equal(sb.st_mtim.tv_sec, 1500000000);
	assert_int_equal(sb.st_mtim.tv_nsec, 7);
	assert_int_equal(sb.st_atim.tv_sec, 1600000000);
	fd = open(path, O_RDONLY);
	assert_int_equal(read(fd, buf, sizeof(buf)), 8);
	assert_memory_equal(buf, "3 V1 N1\n", 8);
	close(fd);

	dfd = open(f->dir, O_RDONLY | O_DIRECTORY);
	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_store_file_from_fd(f->st, 78, dfd, NULL, NULL), -EISDIR);
	dbox_store_mutex_unlock(f->st);
	close(dfd);
	snprintf(path, sizeof(path), "%s/" DBOX_STORE_FILES "/78", f->store);
	assert_int_equal(stat(path, &sb), -1);
	assert_int_equal(errno, ENOENT);
}

/* --- the maildir import -------------------------------------------------- */

struct notes {
	int count[DBOX_IMPORT_DIR_TIMES + 1];
	char last_path[512];
	int last_err;
};

static void note_cb(void *ctx, const struct dbox_import_note *n)
{
	struct notes *notes = ctx;

	notes->count[n->kind]++;
	snprintf(notes->last_path, sizeof(notes->last_path), "%s", n->path);
	notes->last_err = n->err;
}

static int run_import(struct fix *f, struct notes *notes,
		      struct dbox_import_counts *c)
{
	struct dbox_import_ops ops = { .note = note_cb, .ctx = notes };
	int fd = open(f->src, O_RDONLY | O_DIRECTORY), ret;

	assert_true(fd >= 0);
	memset(notes, 0, sizeof(*notes));
	ret = dbox_import_maildir(f->st, fd, f->src, false, &ops, c);
	close(fd);
	return ret;
}

/* A small Maildir++ tree: INBOX with a message in cur/ and one in new/, a
   folder ".Work.2024" with a message and its maildirfolder, a
   dovecot-uidlist, a second name of one message, a symbolic link. */
static void make_maildir(struct fix *f)
{
	static const char *const dirs[] = {
		"src", "src/cur", "src/new", "src/tmp", "src/.Work.2024",
		"src/.Work.2024/cur", "src/.Work.2024/new", "src/.Work.2024/tmp",
	};
	char a[512], b[512];

	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
		make_dir(f, dirs[i]);
	write_file(f, "src/cur/1000.M1.host:2,FS", "Subject: a\n\nA\n", 14,
		   1000000000);
	write_file(f, "src/new/1001.M2.host", "Subject: b\n\nBB\n", 15,
		   1000000100);
	write_file(f, "src/.Work.2024/cur/1002.M3.host:2,RSa",
		   "Subject: c\n\nCCC\n", 16, 1000000200);
	write_file(f, "src/.Work.2024/maildirfolder", "", 0, 0);
	write_file(f, "src/dovecot-uidlist", "3 V1 N4\n", 8, 0);
	snprintf(a, sizeof(a), "%s/src/cur/1000.M1.host:2,FS", f->dir);
	snprintf(b, sizeof(b), "%s/src/.Work.2024/cur/1000.M1.host:2,S", f->dir);
	assert_int_equal(link(a, b), 0);
	snprintf(b, sizeof(b), "%s/src/latest", f->dir);
	assert_int_equal(symlink("cur/1000.M1.host:2,FS", b), 0);
}

/* The message at path: its bytes, mtime, received date and mailbox. */
static void expect_message(struct fix *f, const char *path, const char *text,
			   time_t mtime, const char *mailbox)
{
	struct dbox_attr attr;
	struct dbox_msgloc loc;
	struct meta m;
	size_t len;
	char *back;

	assert_int_equal(lookup_path(f->st, path, &attr), 0);
	assert_int_equal(attr.kind, DBOX_KIND_MESSAGE);
	assert_int_equal(attr.size, strlen(text));
	assert_int_equal(dbox_time_sec(attr.mtime_ns), mtime);
	assert_int_equal(attr.mode, S_IFREG | 0640);
	back = read_message(f->st, attr.ino, &len);
	assert_int_equal(len, strlen(text));
	assert_memory_equal(back, text, len);
	free(back);
	assert_int_equal(dbox_index_msg_get(f->st->index, attr.ino, &loc), 0);
	record_meta(f, &loc, &m);
	assert_int_equal(m.received, mtime);
	assert_string_equal(m.mailbox, mailbox);
}

static void test_import_maildir(void **state)
{
	struct fix *f = *state;
	struct dbox_import_counts c;
	struct dbox_attr attr, other;
	struct notes notes;
	char *target = NULL;
	int fd;

	make_maildir(f);
	fd = open(f->src, O_RDONLY | O_DIRECTORY);
	assert_true(dbox_import_is_maildir(fd));
	close(fd);
	open_store(f, false);
	assert_int_equal(run_import(f, &notes, &c), 0);
	assert_int_equal(c.messages, 3);
	assert_int_equal(c.files, 2);   /* uidlist, maildirfolder */
	assert_int_equal(c.others, 1);  /* the symlink */
	assert_int_equal(c.dirs_made, 7);
	assert_int_equal(c.linked, 1);
	assert_int_equal(c.failed, 0);
	assert_int_equal(c.present, 0);

	/* Names with their flags byte for byte; B is the folder's mailbox:
	   of the folder met first for a message with two names (".Work.2024"
	   sorts before "cur"). */
	expect_message(f, "cur/1000.M1.host:2,FS", "Subject: a\n\nA\n",
		       1000000000, "Work/2024");
	expect_message(f, "new/1001.M2.host", "Subject: b\n\nBB\n", 1000000100,
		       "INBOX");
	expect_message(f, ".Work.2024/cur/1002.M3.host:2,RSa",
		       "Subject: c\n\nCCC\n", 1000000200, "Work/2024");
	/* The hard link stays one inode. */
	assert_int_equal(lookup_path(f->st, "cur/1000.M1.host:2,FS", &attr), 0);
	assert_int_equal(lookup_path(f->st, ".Work.2024/cur/1000.M1.host:2,S",
				     &other), 0);
	assert_int_equal(other.ino, attr.ino);
	assert_int_equal(other.nlink, 2);
	/* Plain files and the symlink. */
	assert_int_equal(lookup_path(f->st, "dovecot-uidlist", &attr), 0);
	assert_int_equal(attr.kind, DBOX_KIND_FILE);
	assert_int_equal(attr.size, 8);
	assert_int_equal(lookup_path(f->st, ".Work.2024/maildirfolder", &attr), 0);
	assert_int_equal(attr.kind, DBOX_KIND_FILE);
	assert_int_equal(lookup_path(f->st, "latest", &attr), 0);
	assert_int_equal(attr.kind, DBOX_KIND_SYMLINK);
	assert_int_equal(dbox_index_readlink(f->st->index, attr.ino, &target), 0);
	assert_string_equal(target, "cur/1000.M1.host:2,FS");
	free(target);
	/* The root took the source root's mode (0750). */
	assert_int_equal(dbox_index_getattr(f->st->index, DBOX_ROOT_INO, &attr), 0);
	assert_int_equal(attr.mode, S_IFDIR | 0750);
}

/* Run again: everything is present; a file changed since fails alone,
   noted with its path, and the store keeps the first bytes. */
static void test_import_again_and_conflict(void **state)
{
	struct fix *f = *state;
	struct dbox_import_counts c;
	struct notes notes;

	make_maildir(f);
	open_store(f, false);
	assert_int_equal(run_import(f, &notes, &c), 0);
	assert_int_equal(run_import(f, &notes, &c), 0);
	assert_int_equal(c.messages + c.files + c.others + c.linked, 0);
	/* 4 message names, 2 plain files, the symlink */
	assert_int_equal(c.present, 7);
	assert_int_equal(c.failed, 0);

	write_file(f, "src/new/1001.M2.host", "Subject: b\n\nXX\n", 15,
		   1000000100);
	assert_int_equal(run_import(f, &notes, &c), 0);
	assert_int_equal(c.failed, 1);
	assert_int_equal(notes.count[DBOX_IMPORT_DIFFERENT], 1);
	assert_non_null(strstr(notes.last_path, "/src/new/1001.M2.host"));
	expect_message(f, "new/1001.M2.host", "Subject: b\n\nBB\n", 1000000100,
		       "INBOX");
}

/* A source name that is a directory where the store has a message fails
   (EEXIST) without stopping the import; a tree without cur/new/tmp is
   not a maildir. */
static void test_import_kind_conflict(void **state)
{
	struct fix *f = *state;
	struct dbox_import_counts c;
	struct notes notes;
	int fd;

	make_dir(f, "src");
	make_dir(f, "src/x");
	fd = open(f->src, O_RDONLY | O_DIRECTORY);
	assert_false(dbox_import_is_maildir(fd));
	close(fd);
	make_dir(f, "src/cur");
	write_file(f, "src/cur/m", "Subject: m\n\n", 12, 0);
	open_store(f, false);
	dbox_store_mutex_lock(f->st);
	assert_int_equal(dbox_index_begin(f->st->index), 0);
	new_message(f->st, "x");
	assert_int_equal(dbox_index_commit(f->st->index, true), 0);
	dbox_store_mutex_unlock(f->st);
	assert_int_equal(run_import(f, &notes, &c), 0);
	assert_int_equal(c.failed, 1);
	assert_int_equal(notes.count[DBOX_IMPORT_FAILED], 1);
	assert_int_equal(notes.last_err, EEXIST);
	assert_int_equal(c.messages, 1);
}

/* --- adopting Dovecot m.N files ------------------------------------------ */

struct dove_msg {
	const char *text;
	struct dbox_msgloc loc;
};

/* A Dovecot-like root f->dir/dove whose storage/ holds the records of
   msgs (written by our own engine: the same dbox format). */
static void make_dove(struct fix *f, struct dove_msg *msgs, size_t n)
{
	struct dbox_store_settings set = { .create = true };
	struct dbox_store *dove = NULL;
	char path[512];
	int fd;

	snprintf(path, sizeof(path), "%s/dove", f->dir);
	assert_int_equal(dbox_store_open(path, &set, &dove), 0);
	dbox_store_mutex_lock(dove);
	assert_int_equal(dbox_index_begin(dove->index), 0);
	for (size_t i = 0; i < n; i++) {
		char name[24];

		snprintf(name, sizeof(name), "d%zu", i);
		write_file(f, "src", msgs[i].text, strlen(msgs[i].text), 0);
		fd = open(f->src, O_RDONLY);
		assert_int_equal(dbox_save_from_fd(dove, new_message(dove, name),
						   "INBOX", fd, 5, NULL,
						   &msgs[i].loc),
				 (int64_t)strlen(msgs[i].text));
		close(fd);
	}
	assert_int_equal(dbox_index_commit(dove->index, true), 0);
	dbox_store_mutex_unlock(dove);
	dbox_store_close(&dove);
}

struct adopt_notes {
	int count[DBOX_ADOPT_FATAL + 1];
};

static void adopt_note_cb(void *ctx, const struct dbox_adopt_note *n)
{
	((struct adopt_notes *)ctx)->count[n->kind]++;
}

struct kw_ctx {
	struct dbox_adopt *adopt;
	const char *mailbox, *keyword;
};

static void letters_cb(void *ctx, char buf[32])
{
	struct kw_ctx *k = ctx;
	char c = dbox_adopt_keyword_letter(k->adopt, k->mailbox, k->keyword);

	snprintf(buf, 32, "S%c", c);
}

/* The content of plain file path in the store. */
static void expect_plain(struct fix *f, const char *path, const char *content)
{
	struct dbox_attr attr;
	char file[512], buf[512];
	ssize_t n;
	int fd;

	assert_int_equal(lookup_path(f->st, path, &attr), 0);
	assert_int_equal(attr.kind, DBOX_KIND_FILE);
	snprintf(file, sizeof(file), "%s/" DBOX_STORE_FILES "/%llu", f->store,
		 (unsigned long long)attr.ino);
	fd = open(file, O_RDONLY);
	assert_true(fd >= 0);
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	assert_true(n >= 0);
	buf[n] = '\0';
	assert_string_equal(buf, content);
}

/* Two Dovecot records: one in INBOX and, as a copy, in Work/2024 (one
   inode, two names); one \Recent in new/; one message whose record is
   missing fails alone.  The m.N is hard-linked, not copied. */
static void test_adopt(void **state)
{
	struct fix *f = *state;
	struct dove_msg msgs[2] = { { .text = "Subject: a\n\nAAA\n" },
				    { .text = "Subject: b\n\nB\n" } };
	struct adopt_notes notes = { { 0 } };
	const struct dbox_adopt_ops ops = { .note = adopt_note_cb, .ctx = &notes };
	struct dbox_adopt_source src = { .root = "dove", .alt_fd = -1 };
	struct dbox_adopt *adopt = NULL;
	struct kw_ctx kw = { .keyword = "$Label1" };
	struct dbox_adopt_msg m = { .received = 1700000000, .refcount = 2,
				    .letters = letters_cb, .letters_ctx = &kw };
	struct dbox_attr a1, a2, b;
	struct stat ours, theirs;
	char path[512], name[16], uid1[160], uidlist[1024];
	size_t len;
	char *back;

	make_dove(f, msgs, 2);
	open_store(f, false);
	snprintf(path, sizeof(path), "%s/dove/" DBOX_STORE_STORAGE, f->dir);
	src.storage_fd = open(path, O_RDONLY | O_DIRECTORY);
	assert_true(src.storage_fd >= 0);
	assert_int_equal(dbox_adopt_begin(f->st, &src, &ops, &adopt), 0);
	kw.adopt = adopt;
	assert_int_equal(dbox_adopt_mailbox(adopt, "INBOX", 7, 4, "g1"), 0);
	assert_int_equal(dbox_adopt_mailbox(adopt, "Work/2024", 8, 2, "g2"), 0);

	m.mailbox = kw.mailbox = "INBOX";
	m.uid = 1;
	m.guid = msgs[0].loc.guid;
	m.size = strlen(msgs[0].text);
	m.vsize = m.size + 3;
	assert_int_equal(dbox_adopt_message(adopt, &m), 0);
	m.mailbox = kw.mailbox = "Work/2024";
	assert_int_equal(dbox_adopt_message(adopt, &m), 0);
	m.mailbox = "INBOX";
	m.uid = 2;
	m.guid = msgs[1].loc.guid;
	m.size = m.vsize = strlen(msgs[1].text);
	m.refcount = 1;
	m.to_new = true;
	assert_int_equal(dbox_adopt_message(adopt, &m), 0);
	m.uid = 3;
	m.guid = "0123456789abcdef0123456789abcdef";
	assert_int_equal(dbox_adopt_message(adopt, &m), 0);
	assert_int_equal(notes.count[DBOX_ADOPT_NOT_FOUND], 1);
	assert_int_equal(dbox_adopt_commit(adopt), 0);
	assert_true(dbox_adopt_committed(adopt));
	assert_int_equal(dbox_adopt_counts(adopt)->messages, 2);
	assert_int_equal(dbox_adopt_counts(adopt)->links, 1);
	assert_int_equal(dbox_adopt_counts(adopt)->failed, 1);
	assert_int_equal(dbox_adopt_counts(adopt)->files, 1);
	dbox_adopt_free(&adopt);
	close(src.storage_fd);

	snprintf(uid1, sizeof(uid1), "1700000000.V7U1.dovecot-import,S=%zu,"
		 "W=%zu:2,Sa", strlen(msgs[0].text), strlen(msgs[0].text) + 3);
	snprintf(path, sizeof(path), "cur/%s", uid1);
	assert_int_equal(lookup_path(f->st, path, &a1), 0);
	snprintf(path, sizeof(path), ".Work.2024/cur/1700000000.V8U1.dovecot-"
		 "import,S=%zu,W=%zu:2,Sa", strlen(msgs[0].text),
		 strlen(msgs[0].text) + 3);
	assert_int_equal(lookup_path(f->st, path, &a2), 0);
	assert_int_equal(a1.ino, a2.ino);
	assert_int_equal(a1.nlink, 2);
	assert_int_equal(dbox_time_sec(a1.mtime_ns), 1700000000);
	back = read_message(f->st, a1.ino, &len);
	assert_int_equal(len, strlen(msgs[0].text));
	assert_memory_equal(back, msgs[0].text, len);
	free(back);
	snprintf(path, sizeof(path), "new/1700000000.V7U2.dovecot-import,S=%zu,"
		 "W=%zu", strlen(msgs[1].text), strlen(msgs[1].text));
	assert_int_equal(lookup_path(f->st, path, &b), 0);
	assert_int_equal(b.kind, DBOX_KIND_MESSAGE);

	/* The uidlist keeps Dovecot's UIDs; keywords got letters. */
	snprintf(uidlist, sizeof(uidlist), "3 V7 N4 Gg1\n1 W%zu :1700000000."
		 "V7U1.dovecot-import,S=%zu,W=%zu:2,Sa\n2 W%zu :%s\n",
		 strlen(msgs[0].text) + 3, strlen(msgs[0].text),
		 strlen(msgs[0].text) + 3, strlen(msgs[1].text), path + 4);
	expect_plain(f, "dovecot-uidlist", uidlist);
	expect_plain(f, "dovecot-keywords", "0 $Label1\n");
	expect_plain(f, ".Work.2024/maildirfolder", "");

	/* The store's m.N is Dovecot's, by hard link, under its final name. */
	dbox_file_name(name, msgs[0].loc.file_id);
	snprintf(path, sizeof(path), "%s/dove/" DBOX_STORE_STORAGE "/%s",
		 f->dir, name);
	assert_int_equal(stat(path, &theirs), 0);
	{
		struct dbox_msgloc loc;

		assert_int_equal(dbox_index_msg_get(f->st->index, a1.ino, &loc), 0);
		dbox_file_name(name, loc.file_id);
	}
	snprintf(path, sizeof(path), "%s/" DBOX_STORE_STORAGE "/%s", f->store,
		 name);
	assert_int_equal(stat(path, &ours), 0);
	assert_int_equal(ours.st_ino, theirs.st_ino);
}

/* Names in the store's storage/ that start with ".import-". */
static int count_staged(const struct fix *f)
{
	char path[512];
	struct dirent *de;
	DIR *d;
	int n = 0;

	snprintf(path, sizeof(path), "%s/" DBOX_STORE_STORAGE, f->store);
	d = opendir(path);
	assert_non_null(d);
	while ((de = readdir(d)) != NULL)
		n += strncmp(de->d_name, ".import-", 8) == 0;
	closedir(d);
	return n;
}

/* An adoption freed before its commit leaves no staged link and no row;
   a staged link left by a run that died is removed by the next. */
static void test_adopt_rollback(void **state)
{
	struct fix *f = *state;
	struct dove_msg msgs[1] = { { .text = "Subject: a\n\nA\n" } };
	struct dbox_adopt_source src = { .root = "dove", .alt_fd = -1 };
	struct dbox_adopt *adopt = NULL;
	struct dbox_adopt_msg m = { .mailbox = "INBOX", .uid = 1,
				    .received = 1, .refcount = 1,
				    .to_new = true };
	struct dbox_attr attr;
	char path[512];
	int fd;

	make_dove(f, msgs, 1);
	open_store(f, false);
	snprintf(path, sizeof(path), "%s/dove/" DBOX_STORE_STORAGE, f->dir);
	src.storage_fd = open(path, O_RDONLY | O_DIRECTORY);
	assert_int_equal(dbox_adopt_begin(f->st, &src, NULL, &adopt), 0);
	assert_int_equal(dbox_adopt_mailbox(adopt, "INBOX", 1, 2, "g"), 0);
	m.guid = msgs[0].loc.guid;
	m.size = m.vsize = strlen(msgs[0].text);
	assert_int_equal(dbox_adopt_message(adopt, &m), 0);
	assert_int_equal(dbox_adopt_counts(adopt)->files, 1);
	dbox_adopt_free(&adopt);
	close(src.storage_fd);
	assert_int_equal(lookup_path(f->st, "new", &attr), -ENOENT);
	assert_int_equal(count_staged(f), 0);

	/* A link a dead run staged, unknown to the index: removed. */
	snprintf(path, sizeof(path), "%s/" DBOX_STORE_STORAGE "/.import-m.99",
		 f->store);
	fd = open(path, O_WRONLY | O_CREAT, 0600);
	close(fd);
	assert_int_equal(count_staged(f), 1);
	dbox_adopt_finish_staged(f->st, NULL);
	assert_int_equal(count_staged(f), 0);
}

int main(void)
{
#define T(t) cmocka_unit_test_setup_teardown(t, fix_setup, fix_teardown)
	const struct CMUnitTest tests[] = {
		T(test_save_fd_roundtrip),
		T(test_save_fd_roundtrip_compressed),
		T(test_save_fd_unreadable),
		T(test_file_from_fd),
		T(test_import_maildir),
		T(test_import_again_and_conflict),
		T(test_import_kind_conflict),
		T(test_adopt),
		T(test_adopt_rollback),
	};

	dbox_log_set_sink(capture_sink);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
