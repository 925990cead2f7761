#ifndef DBOXFS_TEST_COMMON_H
#define DBOXFS_TEST_COMMON_H

/*
 * Helpers shared by the unit tests (tests/unit/test-*.c); the Makefile
 * links test-common.o into every test binary.  Helpers that can fail do
 * so with a cmocka assertion, which fails the test that called them, so
 * include <cmocka.h> (and what it needs) before this header.
 */

#include "storage/log.h"

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

#endif
