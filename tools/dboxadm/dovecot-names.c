/*
 * dovecot-names.c: Dovecot mailbox names, flags and tab output in
 * Maildir++ terms (see dovecot-names.h).
 *
 * Modified UTF-7 (RFC 3501 5.1.3): printable ASCII 0x20..0x7e stands for
 * itself except '&', written "&-"; any other run of characters is
 * "&" + base64 (alphabet with ',' instead of '/', no padding) of its
 * UTF-16BE + "-".  Here '.' is put in such runs too.
 */
#include "dovecot-names.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int dovecot_flags_parse(const char *field, struct dovecot_flags *flags_r)
{
	static const struct {
		const char *name;
		size_t offset;
	} system[] = {
		{ "\\Seen", offsetof(struct dovecot_flags, seen) },
		{ "\\Answered", offsetof(struct dovecot_flags, answered) },
		{ "\\Flagged", offsetof(struct dovecot_flags, flagged) },
		{ "\\Deleted", offsetof(struct dovecot_flags, deleted) },
		{ "\\Draft", offsetof(struct dovecot_flags, draft) },
		{ "\\Recent", offsetof(struct dovecot_flags, recent) },
	};
	const char *p = field;

	memset(flags_r, 0, sizeof(*flags_r));
	while (*p != '\0') {
		size_t len = strcspn(p, " ");

		if (len > 0 && p[0] == '\\') {
			for (size_t i = 0; i < sizeof(system) / sizeof(system[0]); i++)
				if (strlen(system[i].name) == len &&
				    strncasecmp(system[i].name, p, len) == 0)
					*(bool *)((char *)flags_r +
						  system[i].offset) = true;
		} else if (len > 0) {
			char **kw = realloc(flags_r->keywords,
					    (flags_r->nkeywords + 1) * sizeof(*kw));

			if (kw == NULL)
				goto nomem;
			flags_r->keywords = kw;
			if ((kw[flags_r->nkeywords] = strndup(p, len)) == NULL)
				goto nomem;
			flags_r->nkeywords++;
		}
		p += len;
		while (*p == ' ')
			p++;
	}
	return 0;
nomem:
	dovecot_flags_free(flags_r);
	return -ENOMEM;
}

void dovecot_flags_free(struct dovecot_flags *flags)
{
	for (size_t i = 0; i < flags->nkeywords; i++)
		free(flags->keywords[i]);
	free(flags->keywords);
	flags->keywords = NULL;
	flags->nkeywords = 0;
}

static int char_cmp(const void *a, const void *b)
{
	return *(const char *)a - *(const char *)b;
}

void dovecot_flags_letters(const struct dovecot_flags *flags,
			   char (*keyword_letter)(void *ctx, const char *kw),
			   void *ctx, char buf[32])
{
	size_t n = 0, kw_start;

	if (flags->draft)
		buf[n++] = 'D';
	if (flags->flagged)
		buf[n++] = 'F';
	if (flags->answered)
		buf[n++] = 'R';
	if (flags->seen)
		buf[n++] = 'S';
	if (flags->deleted)
		buf[n++] = 'T';
	kw_start = n;
	for (size_t i = 0; i < flags->nkeywords && n < 31; i++) {
		char c = keyword_letter(ctx, flags->keywords[i]);

		if (c != 0 && memchr(buf + kw_start, c, n - kw_start) == NULL)
			buf[n++] = c;
	}
	qsort(buf + kw_start, n - kw_start, 1, char_cmp);
	buf[n] = '\0';
}

size_t dovecot_tab_split(char *line, char **fields, size_t max)
{
	size_t n = 0;
	char *p = line;

	if (max == 0)
		return 0;
	for (;;) {
		char *tab;

		fields[n++] = p;
		if (n == max || (tab = strchr(p, '\t')) == NULL)
			break;
		*tab = '\0';
		p = tab + 1;
	}
	return n;
}
