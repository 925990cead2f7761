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
#include <iconv.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define DIR_NAME_MAX 255

static const char b64[] =
	"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+,";

struct buf {
	char *p;
	size_t len, size;
};

static int put(struct buf *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->size) {
		size_t size = (b->len + n + 1) * 2;
		char *p = realloc(b->p, size);

		if (p == NULL)
			return -ENOMEM;
		b->p = p;
		b->size = size;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
	return 0;
}

/* Decode one UTF-8 character at s (len bytes left).  Returns its length
   and *cp_r, or 0 when invalid. */
static size_t utf8_next(const unsigned char *s, size_t len, uint32_t *cp_r)
{
	uint32_t cp;
	size_t n;

	if (s[0] < 0x80) {
		*cp_r = s[0];
		return 1;
	}
	if (s[0] >= 0xc2 && s[0] <= 0xdf) {
		n = 2;
		cp = s[0] & 0x1f;
	} else if (s[0] >= 0xe0 && s[0] <= 0xef) {
		n = 3;
		cp = s[0] & 0x0f;
	} else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
		n = 4;
		cp = s[0] & 0x07;
	} else {
		return 0;
	}
	if (len < n)
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
	    (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	*cp_r = cp;
	return n;
}

static bool direct(uint32_t cp)
{
	return cp >= 0x20 && cp <= 0x7e && cp != '&' && cp != '.';
}

/* Encode the UTF-16BE of a run of non-direct characters as base64. */
static int put_run(struct buf *b, const unsigned char *s, size_t len)
{
	uint32_t bits = 0, cp;
	int nbits = 0, ret;
	size_t n;

	if ((ret = put(b, "&", 1)) < 0)
		return ret;
	while (len > 0) {
		uint16_t units[2];
		int nunits = 1;

		n = utf8_next(s, len, &cp);
		if (cp >= 0x10000) {
			cp -= 0x10000;
			units[0] = (uint16_t)(0xd800 | cp >> 10);
			units[1] = (uint16_t)(0xdc00 | (cp & 0x3ff));
			nunits = 2;
		} else {
			units[0] = (uint16_t)cp;
		}
		for (int u = 0; u < nunits; u++) {
			bits = bits << 16 | units[u];
			nbits += 16;
			while (nbits >= 6) {
				nbits -= 6;
				if ((ret = put(b, &b64[(bits >> nbits) & 0x3f],
					       1)) < 0)
					return ret;
			}
		}
		s += n;
		len -= n;
	}
	if (nbits > 0 &&
	    (ret = put(b, &b64[(bits << (6 - nbits)) & 0x3f], 1)) < 0)
		return ret;
	return put(b, "-", 1);
}

/* Append one mailbox name component, encoded. */
static int put_component(struct buf *b, const char *comp, size_t len)
{
	const unsigned char *s = (const unsigned char *)comp;
	size_t i = 0, n;
	uint32_t cp;
	int ret;

	if (len == 0)
		return -EINVAL;
	while (i < len) {
		n = utf8_next(s + i, len - i, &cp);
		if (n == 0)
			return -EINVAL;
		if (direct(cp)) {
			ret = put(b, comp + i, 1);
			i++;
		} else if (cp == '&') {
			ret = put(b, "&-", 2);
			i++;
		} else {
			size_t start = i;

			while (i < len && (n = utf8_next(s + i, len - i, &cp)) > 0 &&
			       !direct(cp) && cp != '&')
				i += n;
			if (i < len && n == 0)
				return -EINVAL;
			ret = put_run(b, s + start, i - start);
		}
		if (ret < 0)
			return ret;
	}
	return 0;
}

int dovecot_mailbox_to_maildir(const char *mailbox, char **dir_r)
{
	struct buf b = { 0 };
	const char *p = mailbox, *slash;
	int ret;

	*dir_r = NULL;
	if (strcmp(mailbox, "INBOX") == 0) {
		*dir_r = strdup("");
		return *dir_r == NULL ? -ENOMEM : 0;
	}
	do {
		slash = strchr(p, '/');
		if ((ret = put(&b, ".", 1)) < 0 ||
		    (ret = put_component(&b, p, slash != NULL ?
					 (size_t)(slash - p) : strlen(p))) < 0) {
			free(b.p);
			return ret;
		}
		p = slash + 1;
	} while (slash != NULL);
	if (b.len > DIR_NAME_MAX) {
		free(b.p);
		return -ENAMETOOLONG;
	}
	*dir_r = b.p;
	return 0;
}

int dovecot_mutf7_to_utf8(const char *name, char **utf8_r)
{
	size_t inleft = strlen(name), outleft = inleft * 3 + 1;
	char *in = (char *)name, *out, *buf = malloc(outleft);
	iconv_t cd;
	int ret = 0;

	/* Each input byte gives at most 3 output bytes: a 4-byte UTF-8
	   character needs 8 base64 bytes (a surrogate pair). */
	if (buf == NULL)
		return -ENOMEM;
	if ((cd = iconv_open("UTF-8", "UTF-7-IMAP")) == (iconv_t)-1) {
		free(buf);
		return errno == EINVAL ? -ENOSYS : -errno;
	}
	out = buf;
	if (iconv(cd, &in, &inleft, &out, &outleft) == (size_t)-1 ||
	    iconv(cd, NULL, NULL, &out, &outleft) == (size_t)-1)
		ret = errno == ENOMEM ? -ENOMEM : -EINVAL;
	iconv_close(cd);
	if (ret == 0 && memchr(buf, '\0', (size_t)(out - buf)) != NULL)
		ret = -EINVAL; /* "&AAA-": an encoded NUL */
	if (ret < 0) {
		free(buf);
		return ret;
	}
	*out = '\0';
	*utf8_r = buf;
	return 0;
}

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
