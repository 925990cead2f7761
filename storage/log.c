/* log.c: the process-wide log sink (see log.h). */
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void stderr_sink(enum dbox_log_level level, const char *fmt,
			va_list args)
{
	static const char *const prefix[] = {
		[DBOX_LOG_ERROR] = "error: ",
		[DBOX_LOG_WARNING] = "warning: ",
		[DBOX_LOG_INFO] = "",
		[DBOX_LOG_DEBUG] = "debug: ",
	};
	fputs(prefix[level], stderr);
	vfprintf(stderr, fmt, args);
	fputc('\n', stderr);
}

/* The only mutable global outside the store context: set once at start-up. */
static dbox_log_sink_t *log_sink = stderr_sink;

void dbox_log_set_sink(dbox_log_sink_t *sink)
{
	log_sink = sink != NULL ? sink : stderr_sink;
}

dbox_log_sink_t *dbox_log_get_sink(void)
{
	return log_sink;
}

size_t dbox_text_char_len(const char *text)
{
	const unsigned char *p = (const unsigned char *)text;

	if (*p < 0x20 || *p == 0x7f)
		return 0;
	if (*p < 0x80)
		return 1;
	if (*p >= 0xc2 && *p <= 0xdf && (p[1] & 0xc0) == 0x80)
		return *p == 0xc2 && p[1] < 0xa0 ? 0 : 2;
	if ((*p & 0xf0) == 0xe0 && (p[1] & 0xc0) == 0x80 &&
	    (p[2] & 0xc0) == 0x80 && (*p != 0xe0 || p[1] >= 0xa0))
		return 3;
	if (*p >= 0xf0 && *p <= 0xf4 && (p[1] & 0xc0) == 0x80 &&
	    (p[2] & 0xc0) == 0x80 && (p[3] & 0xc0) == 0x80 &&
	    (*p != 0xf0 || p[1] >= 0x90) && (*p != 0xf4 || p[1] < 0x90))
		return 4;
	return 0;
}

char *dbox_log_escape(char *dst, size_t dst_size, const char *src)
{
	const unsigned char *p = (const unsigned char *)src;
	size_t out = 0;

	if (dst_size == 0)
		return dst;
	while (*p != '\0') {
		size_t len = dbox_text_char_len((const char *)p);

		if (len == 0) {
			if (out + 4 >= dst_size)
				break;
			snprintf(dst + out, 5, "\\x%02x", *p);
			out += 4;
			p++;
			continue;
		}
		if (out + len >= dst_size)
			break;
		memcpy(dst + out, p, len);
		out += len;
		p += len;
	}
	dst[out] = '\0';
	return dst;
}

/* Hand the sink a finished text (through a va_list, as it wants one). */
static void sink_text(enum dbox_log_level level, const char *fmt, ...)
{
	va_list args;

	va_start(args, fmt);
	log_sink(level, fmt, args);
	va_end(args);
}

void dbox_log(enum dbox_log_level level, const char *fmt, ...)
{
	char *text = NULL, *escaped;
	va_list args;
	int len;

	va_start(args, fmt);
	len = vasprintf(&text, fmt, args);
	va_end(args);
	if (len < 0) {
		sink_text(level, "%s", "(out of memory formatting a message)");
		return;
	}
	escaped = malloc(DBOX_LOG_ESCAPED_SIZE((size_t)len));
	if (escaped != NULL)
		sink_text(level, "%s", dbox_log_escape(
				  escaped, DBOX_LOG_ESCAPED_SIZE((size_t)len), text));
	else
		sink_text(level, "%s", "(out of memory formatting a message)");
	free(escaped);
	free(text);
}
