/*
 * test-common.c: helpers shared by the unit tests (see test-common.h).
 * Not a test itself: the Makefile leaves it out of the test binaries.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "test-common.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
