/*
 * maildir.c: the Maildir++ rules (see maildir.h).
 *
 * Modified UTF-7 (RFC 3501 5.1.3): printable ASCII 0x20..0x7e stands for
 * itself except '&', written "&-"; any other run of characters is
 * "&" + base64 (alphabet with ',' instead of '/', no padding) of its
 * UTF-16BE + "-".  Here '.' is put in such runs too, since Maildir++ reads
 * '.' as the hierarchy separator.
 */
#include "engine/maildir.h"
#include "storage/log.h"

#include <errno.h>
#include <iconv.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const maildir_subdirs[MAILDIR_SUBDIR_COUNT] = { "cur", "new", "tmp" };

int maildir_subdir_of(const char *name, size_t len)
{
	for (size_t i = 0; i < MAILDIR_SUBDIR_COUNT; i++)
		if (len == 3 && memcmp(name, maildir_subdirs[i], 3) == 0)
			return (int)i;
	return -1;
}

bool maildir_is_subdir(const char *name, size_t len)
{
	return maildir_subdir_of(name, len) >= 0;
}

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

int maildir_folder_of_mailbox(const char *mailbox, char **dir_r)
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

int maildir_mutf7_to_utf8(const char *name, char **utf8_r)
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

int maildir_mailbox_name(struct dbox_index *index, uint64_t dir,
			    char **name_r)
{
	uint64_t folder;
	int ret;

	/* dir is the cur/new/tmp; its parent is the folder. */
	if ((ret = dbox_index_parent(index, dir, &folder)) < 0)
		return ret;
	return maildir_folder_mailbox(index, folder, name_r);
}

int maildir_folder_mailbox(struct dbox_index *index, uint64_t folder,
			   char **name_r)
{
	char *path = NULL, *comp = NULL, *joined;
	unsigned int depth = 0;
	uint64_t parent;
	int ret;

	while (folder != DBOX_ROOT_INO) {
		if (++depth > DBOX_TREE_MAX_DEPTH) {
			dbox_error("index: the directories above inode %llu "
				   "never reach the root (the index's tree has "
				   "a cycle; run 'dboxadm check')",
				   (unsigned long long)folder);
			free(path);
			return -EIO;
		}
		if ((ret = dbox_index_entry_of(index, folder, &parent,
					       &comp)) < 0) {
			free(path);
			return ret;
		}
		if (path == NULL) {
			joined = comp;
		} else {
			if (asprintf(&joined, "%s/%s", comp, path) < 0)
				joined = NULL;
			free(comp);
			free(path);
			if (joined == NULL)
				return -ENOMEM;
		}
		path = joined;
		folder = parent;
	}
	if (path == NULL) {
		*name_r = strdup("INBOX");
		return *name_r == NULL ? -ENOMEM : 0;
	}
	if (path[0] == '.' && strchr(path, '/') == NULL) {
		/* Maildir++ ".A.B" is the folder A/B. */
		memmove(path, path + 1, strlen(path));
		for (char *p = path; *p != '\0'; p++)
			if (*p == '.')
				*p = '/';
	}
	*name_r = path;
	return 0;
}

