/*
 * json.c: the JSON string writer of dboxadm --json output (json.h).
 * It checks the shape of each UTF-8 sequence (lead and continuation
 * bytes) so that a folder name in another charset still gives valid JSON.
 */
#include "json.h"

void adm_json_string(FILE *out, const char *str)
{
	const unsigned char *p = (const unsigned char *)str;

	fputc('"', out);
	while (*p != '\0') {
		size_t len = 0;

		if (*p < 0x80)
			len = 1;
		else if ((*p & 0xe0) == 0xc0 && (p[1] & 0xc0) == 0x80 && *p >= 0xc2)
			len = 2;
		else if ((*p & 0xf0) == 0xe0 && (p[1] & 0xc0) == 0x80 &&
			 (p[2] & 0xc0) == 0x80)
			len = 3;
		else if ((*p & 0xf8) == 0xf0 && *p <= 0xf4 &&
			 (p[1] & 0xc0) == 0x80 && (p[2] & 0xc0) == 0x80 &&
			 (p[3] & 0xc0) == 0x80)
			len = 4;
		if (len == 0 || (len == 1 && (*p < 0x20 || *p == 0x7f))) {
			fprintf(out, "\\u%04x", *p);
			p++;
		} else if (*p == '"' || *p == '\\') {
			fprintf(out, "\\%c", *p);
			p++;
		} else {
			fwrite(p, 1, len, out);
			p += len;
		}
	}
	fputc('"', out);
}
