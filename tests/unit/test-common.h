#ifndef DBOXFS_TEST_COMMON_H
#define DBOXFS_TEST_COMMON_H

/*
 * Helpers shared by the unit tests (tests/unit/test-*.c); the Makefile
 * links test-common.o into every test binary.  Helpers that can fail do
 * so with a cmocka assertion, which fails the test that called them, so
 * include <cmocka.h> (and what it needs) before this header.
 */

#include "index/index.h"
#include "storage/log.h"

#include <stdbool.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* --- log capture ------------------------------------------------------- */

/* What capture_sink saw since the last errors_reset(): how many messages
   at capture_level or more severe, and the text of the last of them. */
extern char last_error[512];
extern int error_count;
/* The least severe level capture_sink counts: DBOX_LOG_ERROR unless a
   test sets it before logging starts. */
extern enum dbox_log_level capture_level;

/* Log sink for dbox_log_set_sink(): counts and keeps messages as above
   and prints nothing, so a test's expected errors do not clutter its
   output. */
void capture_sink(enum dbox_log_level level, const char *fmt, va_list args);

/* Empty last_error and set error_count to 0. */
void errors_reset(void);

/* --- deterministic test data ------------------------------------------ */

/* The next value of the xorshift64 sequence whose state is *state (never
   0), which it advances. */
uint64_t xorshift64(uint64_t *state);

/* Mail-like text of exactly `size` bytes in a malloc()ed buffer (NUL at
   buf[size]; the caller frees): "From: Test <t@example.org>", the line
   `subject` and an empty line, then words[] and hex numbers, each word
   followed by a space, picked by the xorshift64 sequence *rng_state, so
   the same state gives the same text. */
char *mail_text(uint64_t *rng_state, size_t size, const char *subject,
		const char *const words[], size_t nwords);

/* --- files ------------------------------------------------------------- */

/* Make a fresh directory "/tmp/<name>.XXXXXX" (mkdtemp) and put its path in
   dir (size bytes). */
void tmpdir_make(char *dir, size_t size, const char *name);

/* Remove path and everything below it, not following symbolic links.
   Errors are ignored (it is for teardown). */
void rm_rf(const char *path);

/* The counter `field` ("rchar", "wchar", ...) of /proc/self/io: bytes this
   process read or wrote through system calls so far; 0 when the line is
   missing. */
uint64_t proc_self_io(const char *field);

/* --- a small real store ------------------------------------------------ */

/* A store built with the store engine (engine/store.h) in a mkdtemp()
   directory, for the tests of what reads stores (engine/view.h and its
   users).  tree_build makes, messages gz-compressed:
     cur/ m0 m1 (m1 also as cur/m1-link)   new/ m2, and "w" still WRITING
     notes (plain file, tree_plain_bytes)  ln -> tree_link_target
     sub/deep/ (empty)
   and closes the store again (f->st is NULL after it). */
#define TREE_NMSG 3

struct dbox_store;
struct dbox_view;

struct tree_fix {
	char dir[64];
	char store[128];
	char alt[128];
	struct dbox_store *st;
	struct dbox_view *view;
	uint64_t cur, sub, deep;       /* directory inodes */
	uint64_t msg_ino[TREE_NMSG], file_ino, link_ino, writing_ino;
	struct dbox_msgloc loc[TREE_NMSG];
	char *body[TREE_NMSG];
	size_t len[TREE_NMSG];
};

extern const char tree_plain_bytes[];
extern const char tree_link_target[];

/* cmocka setup and teardown: a fresh struct tree_fix in *state (paths
   set, nothing built), and everything closed and removed. */
int tree_setup(void **state);
int tree_teardown(void **state);

/* Build the tree at f->store; with_alt: with the alternate storage f->alt
   (created) recorded in the index. */
void tree_build(struct tree_fix *f, bool with_alt);

/* "STORE/rel", malloc()ed (the caller frees). */
char *tree_path(const struct tree_fix *f, const char *rel);

/* dbox_view_open of the store into f->view (closed by teardown). */
void tree_open_view(struct tree_fix *f);

/* Replace STORE/storage/m.1 by a symbolic link to a copy of it. */
void tree_symlink_m1(struct tree_fix *f);

/* --- a store ----------------------------------------------------------- */

/* A new store in a fresh temporary directory, with an INBOX (cur/ new/
   tmp/ at its root), open; the calling thread holds st->lock from
   inbox_fix_open to inbox_fix_close (tests run on one thread). */
struct inbox_fix {
	char dir[64];          /* /tmp/<name>.XXXXXX */
	char store[128];       /* dir/store */
	struct dbox_store *st;
	uint64_t cur;          /* cur/ of the INBOX */
};

/* Make, open and lock f's store (tmpdir_make(name)); asserts on failure. */
void inbox_fix_open(struct inbox_fix *f, const char *name);

/* Unlock (when held) and close f's store and remove its directory. */
void inbox_fix_close(struct inbox_fix *f);

#endif
