/*
 * dbox-format.c: format and parse the pieces of a dbox v2 file in memory
 * (file header line, 30-byte message header, metadata block) and count
 * virtual sizes.  See dbox-format.h and docs/dbox-format.md
 * sections 2-6.  No I/O here; dbox-file.c does the reading and writing.
 *
 * Parsers never read past the length they are given and never trust a
 * value they have not checked: a record they accept can be written back
 * byte for byte by the formatters (modulo line order of unknown keys).
 */
#include "dbox-format.h"
#include "dbox-fault.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Largest hex value we accept: 16 digits fill a uint64_t. */
#define HEX_MAX_DIGITS 16

static int hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Parse exactly len hex digits (1..16, either case).  Returns 0 or -1. */
static int hex_parse(const char *p, size_t len, uint64_t *value_r)
{
	uint64_t value = 0;

	if (len == 0 || len > HEX_MAX_DIGITS)
		return -1;
	for (size_t i = 0; i < len; i++) {
		int d = hex_digit(p[i]);
		if (d < 0)
			return -1;
		value = value << 4 | (uint64_t)d;
	}
	*value_r = value;
	return 0;
}

size_t dbox_file_header_format(char *buf, time_t created)
{
	unsigned long long stamp = created < 0 ? 0 : (unsigned long long)created;
	int len = snprintf(buf, DBOX_FILE_HEADER_MAX, "2 M%x C%llx\n",
			   DBOX_MSG_HEADER_SIZE, stamp);

	return (size_t)len;
}

int dbox_file_header_parse(const char *buf, size_t len, size_t *header_len_r,
			   unsigned int *msg_header_size_r, time_t *created_r,
			   struct dbox_fault *fault)
{
	const char *end = memchr(buf, '\n', len);
	const char *p, *tok_end;
	uint64_t value, msg_header_size = 0, created = 0;

	if (end == NULL)
		return dbox_fault_set(fault, 0, "no end of line in the first "
				      "%zu bytes", len);
	if (end - buf < 2 || buf[0] != '2' || buf[1] != ' ')
		return dbox_fault_set(fault, 0, "version is not 2");

	/* Tokens "<key letter><hex>" separated by single spaces. */
	for (p = buf + 2; p < end; p = tok_end + 1) {
		tok_end = memchr(p, ' ', (size_t)(end - p));
		if (tok_end == NULL)
			tok_end = end;
		if (tok_end == p)
			continue;
		if (hex_parse(p + 1, (size_t)(tok_end - p - 1), &value) < 0)
			value = 0; /* Dovecot's hex2dec gives 0 on junk too */
		if (*p == 'M')
			msg_header_size = value;
		else if (*p == 'C')
			created = value;
	}
	if (msg_header_size != DBOX_MSG_HEADER_SIZE)
		return dbox_fault_set(fault, 0, "message header size (M) is "
				      "%llx, not %x",
				      (unsigned long long)msg_header_size,
				      DBOX_MSG_HEADER_SIZE);

	*header_len_r = (size_t)(end - buf) + 1;
	*msg_header_size_r = (unsigned int)msg_header_size;
	*created_r = (time_t)created;
	return 0;
}

/* Offsets inside the 30-byte message header. */
#define MSG_HDR_TYPE 2
#define MSG_HDR_SIZE 13
#define MSG_HDR_SIZE_LEN 16

void dbox_msg_header_format(uint8_t out[DBOX_MSG_HEADER_SIZE],
			    uint64_t body_size)
{
	static const char hex[] = "0123456789ABCDEF";

	memset(out, ' ', DBOX_MSG_HEADER_SIZE);
	out[0] = 0x01;
	out[1] = 0x02;
	out[MSG_HDR_TYPE] = 'N';
	for (int i = MSG_HDR_SIZE_LEN - 1; i >= 0; i--) {
		out[MSG_HDR_SIZE + i] = (uint8_t)hex[body_size & 0xf];
		body_size >>= 4;
	}
	out[DBOX_MSG_HEADER_SIZE - 1] = '\n';
}

void dbox_msg_header_unsealed(uint8_t out[DBOX_MSG_HEADER_SIZE])
{
	memset(out, ' ', DBOX_MSG_HEADER_SIZE);
	out[0] = 0x01;
	out[1] = 0x02;
	out[MSG_HDR_TYPE] = 'W';
	out[DBOX_MSG_HEADER_SIZE - 1] = '\n';
}

bool dbox_msg_header_is_unsealed(const uint8_t buf[DBOX_MSG_HEADER_SIZE])
{
	uint8_t placeholder[DBOX_MSG_HEADER_SIZE];

	dbox_msg_header_unsealed(placeholder);
	return memcmp(buf, placeholder, DBOX_MSG_HEADER_SIZE) == 0;
}

bool dbox_msg_header_is_zero(const uint8_t buf[DBOX_MSG_HEADER_SIZE])
{
	for (size_t i = 0; i < DBOX_MSG_HEADER_SIZE; i++)
		if (buf[i] != 0)
			return false;
	return true;
}

int dbox_msg_header_parse(const uint8_t buf[DBOX_MSG_HEADER_SIZE],
			  uint64_t *body_size_r, struct dbox_fault *fault)
{
	if (buf[0] != 0x01 || buf[1] != 0x02)
		return dbox_fault_set(fault, 0, "bad magic");
	if (buf[MSG_HDR_TYPE] != 'N')
		return dbox_fault_set(fault, MSG_HDR_TYPE, "type is not 'N'");
	if (buf[DBOX_MSG_HEADER_SIZE - 1] != '\n')
		return dbox_fault_set(fault, DBOX_MSG_HEADER_SIZE - 1,
				      "no newline at its end");
	if (hex_parse((const char *)buf + MSG_HDR_SIZE, MSG_HDR_SIZE_LEN,
		      body_size_r) < 0)
		return dbox_fault_set(fault, MSG_HDR_SIZE,
				      "body size is not hex");
	return 0;
}

void dbox_metadata_clear(struct dbox_metadata *md)
{
	free(md->mailbox);
	free(md->msg_path);
	free(md->extra);
	memset(md, 0, sizeof(*md));
}

long dbox_metadata_format(const struct dbox_metadata *md, char **buf_r)
{
	char *buf = NULL;
	size_t size = 0;
	FILE *f = open_memstream(&buf, &size);
	bool ok;

	if (f == NULL)
		return -ENOMEM;
	fputs(DBOX_MAGIC_POST, f);
	if (md->has_plain_size)
		fprintf(f, "Z%llx\n", (unsigned long long)md->plain_size);
	/* As Dovecot writes it (dbox-save.c: the time_t cast to unsigned):
	   a date before 1970 is its 64-bit two's complement, which reads
	   back as the same negative time_t. */
	fprintf(f, "R%llx\n", (unsigned long long)(int64_t)md->received);
	if (md->has_vsize)
		fprintf(f, "V%llx\n", (unsigned long long)md->vsize);
	if (md->guid[0] != '\0')
		fprintf(f, "G%s\n", md->guid);
	if (md->mailbox != NULL && strpbrk(md->mailbox, "\r\n") == NULL)
		fprintf(f, "B%s\n", md->mailbox);
	if (md->msg_path != NULL && strpbrk(md->msg_path, "\r\n") == NULL)
		fprintf(f, "L%s\n", md->msg_path);
	if (md->owner.set)
		fprintf(f, "A%o %u %u\n", (unsigned int)(md->owner.mode & 0777),
			(unsigned int)md->owner.uid, (unsigned int)md->owner.gid);
	if (md->extra != NULL && md->extra[0] != '\0') {
		size_t len = strlen(md->extra);
		fputs(md->extra, f);
		if (md->extra[len - 1] != '\n')
			fputc('\n', f); /* keep the block's line structure */
	}
	fputc('\n', f);
	ok = !ferror(f);
	if (fclose(f) != 0 || !ok) {
		free(buf);
		return -ENOMEM;
	}
	*buf_r = buf;
	return (long)size;
}

/* A decimal number of 1 to 10 digits up to UINT32_MAX at *p, which moves
   past it.  Returns false when there is none. */
static bool u32_parse(const char **p, const char *end, uint32_t *v_r)
{
	uint64_t v = 0;
	const char *s = *p;

	while (s < end && *s >= '0' && *s <= '9' && s - *p < 10)
		v = v * 10 + (uint64_t)(*s++ - '0');
	if (s == *p || v > UINT32_MAX || (s < end && *s >= '0' && *s <= '9'))
		return false;
	*p = s;
	*v_r = (uint32_t)v;
	return true;
}

/* The value of an A line, "<mode octal> <uid> <gid>" as
   dbox_metadata_format writes it, into *owner.  Returns false (owner
   untouched) when it is not that. */
static bool owner_parse(const char *value, size_t len, struct dbox_owner *owner)
{
	const char *p = value, *end = value + len;
	uint32_t mode = 0, uid, gid;

	while (p < end && *p >= '0' && *p <= '7' && p - value < 3)
		mode = mode * 8 + (uint32_t)(*p++ - '0');
	if (p == value || p == end || *p++ != ' ' ||
	    !u32_parse(&p, end, &uid) || p == end || *p++ != ' ' ||
	    !u32_parse(&p, end, &gid) || p != end)
		return false;
	*owner = (struct dbox_owner){ .set = true, .mode = mode, .uid = uid,
				      .gid = gid };
	return true;
}

/* The lines of a block no key of ours takes, as they are gathered: len
   bytes in md->extra (NUL-terminated), room for cap. */
struct extra_buf {
	size_t len, cap;
};

/* Append line[0..len) and '\n' to *extra (eb: its length and room, grown
   by doubling: a block of many short unknown lines costs linear time).
   Returns 0 or -ENOMEM. */
static int extra_append(char **extra, struct extra_buf *eb, const char *line,
			size_t len)
{
	if (eb->len + len + 2 > eb->cap) {
		size_t cap = eb->cap < 64 ? 64 : eb->cap;
		char *p;

		while (cap < eb->len + len + 2)
			cap *= 2;
		if ((p = realloc(*extra, cap)) == NULL)
			return -ENOMEM;
		*extra = p;
		eb->cap = cap;
	}
	memcpy(*extra + eb->len, line, len);
	eb->len += len;
	(*extra)[eb->len++] = '\n';
	(*extra)[eb->len] = '\0';
	return 0;
}

/* Apply one metadata line "<key><value>" (no '\n', key already checked to
   be an uppercase letter; at offset `at` of the block) to md.  Returns 0,
   -DBOX_ECORRUPT (fault filled) when the value is corrupt, or -ENOMEM. */
static int metadata_line(struct dbox_metadata *md, struct extra_buf *eb,
			 const char *line, size_t len, size_t at,
			 struct dbox_fault *fault)
{
	const char *value = line + 1;
	size_t value_len = len - 1;
	uint64_t num;

	if (memchr(line, '\0', len) != NULL) /* would be cut as a string */
		return dbox_fault_set(fault, at, "NUL byte in the %c line",
				      line[0]);
	switch (line[0]) {
	case 'G':
		if (value_len > sizeof(md->guid) - 1)
			value_len = sizeof(md->guid) - 1;
		memcpy(md->guid, value, value_len);
		md->guid[value_len] = '\0';
		return 0;
	case 'B':
		free(md->mailbox);
		md->mailbox = strndup(value, value_len);
		return md->mailbox == NULL ? -ENOMEM : 0;
	case 'L':
		free(md->msg_path);
		md->msg_path = strndup(value, value_len);
		return md->msg_path == NULL ? -ENOMEM : 0;
	case 'A':
		if (owner_parse(value, value_len, &md->owner))
			return 0;
		return extra_append(&md->extra, eb, line, len);
	case 'R':
	case 'V':
	case 'Z':
		if (hex_parse(value, value_len, &num) < 0)
			return dbox_fault_set(fault, at, "the %c value is not "
					      "1 to 16 hex digits", line[0]);
		if (line[0] == 'R') {
			md->received = (time_t)num;
		} else if (line[0] == 'V') {
			md->vsize = num;
			md->has_vsize = true;
		} else {
			md->plain_size = num;
			md->has_plain_size = true;
		}
		return 0;
	default:
		return extra_append(&md->extra, eb, line, len);
	}
}

int dbox_metadata_parse(const char *buf, size_t len, struct dbox_metadata *md_r,
			size_t *block_len_r, struct dbox_fault *fault)
{
	struct extra_buf eb = { 0 };
	size_t pos = DBOX_MAGIC_POST_LEN;
	int ret = 1;

	memset(md_r, 0, sizeof(*md_r));
	if (memcmp(buf, DBOX_MAGIC_POST,
		   len < DBOX_MAGIC_POST_LEN ? len : DBOX_MAGIC_POST_LEN) != 0)
		return dbox_fault_set(fault, 0, "no metadata magic");

	while (pos < len) {
		const char *line = buf + pos;
		const char *nl = memchr(line, '\n', len - pos);

		/* An empty line ends the block; so does a line starting with
		   a space (v1 padding), which belongs to the block. */
		if (line[0] != '\n' && line[0] != ' ' &&
		    (line[0] < 'A' || line[0] > 'Z')) {
			ret = dbox_fault_set(fault, pos, "a line starts with "
					     "byte 0x%02x, not a key letter",
					     (unsigned char)line[0]);
			break;
		}
		if (nl == NULL)
			break; /* ret = 1: need more */
		if (line[0] == '\n' || line[0] == ' ') {
			*block_len_r = (size_t)(nl - buf) + 1;
			return 0;
		}
		if ((ret = metadata_line(md_r, &eb, line, (size_t)(nl - line),
					 pos, fault)) < 0)
			break;
		pos = (size_t)(nl - buf) + 1;
		ret = 1;
	}
	dbox_metadata_clear(md_r);
	return ret;
}

uint64_t dbox_vsize_add(const void *buf, size_t len, bool prev_cr,
			bool *last_cr_r)
{
	const uint8_t *p = buf, *end = p + len, *lf;
	uint64_t vsize = len;

	/* memchr() finds the LFs: the bytes between them need no look (a
	   byte loop was 8% of a delivery's instructions, callgrind). */
	for (const uint8_t *at = p;
	     at < end && (lf = memchr(at, '\n', (size_t)(end - at))) != NULL;
	     at = lf + 1)
		if (!(lf > p ? lf[-1] == '\r' : prev_cr))
			vsize++;
	if (last_cr_r != NULL)
		*last_cr_r = len > 0 ? p[len - 1] == '\r' : prev_cr;
	return vsize;
}
