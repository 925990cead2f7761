/*
 * test-log.c: unit tests (cmocka) of the escaping of logged text
 * (storage/log.h): bytes from files that reach a terminal or a log.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "storage/log.h"

#include <stdio.h>
#include <string.h>

static void expect_escaped(const char *in, const char *want)
{
	char out[256];

	assert_string_equal(dbox_log_escape(out, sizeof(out), in), want);
}

static void test_escape_controls(void **state)
{
	(void)state;
	expect_escaped("plain text, 100% / ok", "plain text, 100% / ok");
	expect_escaped("a\x1b[2Jb", "a\\x1b[2Jb");
	expect_escaped("line\nforged: line", "line\\x0aforged: line");
	expect_escaped("\t\r\a\x7f", "\\x09\\x0d\\x07\\x7f");
	expect_escaped("", "");
}

static void test_escape_utf8(void **state)
{
	(void)state;
	/* Folder names in UTF-8 stay readable. */
	expect_escaped("Entw\xc3\xbcrfe \xe2\x82\xac \xf0\x9f\x93\xa7",
		       "Entw\xc3\xbcrfe \xe2\x82\xac \xf0\x9f\x93\xa7");
	/* The 8-bit CSI, alone or as UTF-8 U+009B, and every C1. */
	expect_escaped("\x9b" "1m", "\\x9b1m");
	expect_escaped("\xc2\x9b" "1m", "\\xc2\\x9b1m");
	expect_escaped("\xc2\x80\xc2\x9f\xc2\xa0", "\\xc2\\x80\\xc2\\x9f\xc2\xa0");
	/* Malformed: truncated, overlong, surrogate-free ranges kept. */
	expect_escaped("\xe2\x82", "\\xe2\\x82");
	expect_escaped("\xc0\xaf", "\\xc0\\xaf");
	expect_escaped("\xe0\x80\xaf", "\\xe0\\x80\\xaf");
	expect_escaped("\xf4\x90\x80\x80", "\\xf4\\x90\\x80\\x80");
	expect_escaped("\xff\xfe", "\\xff\\xfe");
}

static void test_escape_fits(void **state)
{
	char out[8];

	(void)state;
	/* Cut short, never in the middle of an escape, always terminated. */
	assert_string_equal(dbox_log_escape(out, sizeof(out), "ab\x1b\x1b"),
			    "ab\\x1b");
	assert_string_equal(dbox_log_escape(out, 1, "abc"), "");
	/* Escaping escaped text changes nothing (a message logged twice). */
	{
		char once[64], twice[64];

		dbox_log_escape(once, sizeof(once), "x\x1by");
		dbox_log_escape(twice, sizeof(twice), once);
		assert_string_equal(once, twice);
	}
}

static char seen[256];

static void capture(enum dbox_log_level level, const char *fmt, va_list args)
{
	(void)level;
	vsnprintf(seen, sizeof(seen), fmt, args);
}

static void test_log_escapes(void **state)
{
	dbox_log_sink_t *old = dbox_log_get_sink();

	(void)state;
	dbox_log_set_sink(capture);
	dbox_error("m.1 offset %d: GUID '%s'", 16, "\x1b]0;owned\x07");
	dbox_log_set_sink(old);
	assert_string_equal(seen, "m.1 offset 16: GUID '\\x1b]0;owned\\x07'");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_escape_controls),
		cmocka_unit_test(test_escape_utf8),
		cmocka_unit_test(test_escape_fits),
		cmocka_unit_test(test_log_escapes),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
