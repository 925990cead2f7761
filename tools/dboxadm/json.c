/*
 * json.c: the JSON string writer of dboxadm --json output (json.h).
 * Each character is checked as a log line's is (dbox_text_char_len):
 * a folder name in another charset still gives valid JSON, and no
 * control (C1 included) reaches a terminal that shows the output.
 */
#include "json.h"

#include "storage/log.h"

void adm_json_string(FILE *out, const char *str)
{
	fputc('"', out);
	while (*str != '\0') {
		const unsigned char *p = (const unsigned char *)str;
		size_t len = dbox_text_char_len(str);

		if (len == 0 && p[0] == 0xc2 && p[1] >= 0x80 && p[1] < 0xa0) {
			/* A C1 control: the same character, inert on a
			   terminal. */
			fprintf(out, "\\u%04x", p[1]);
			len = 2;
		} else if (len == 0) {
			fprintf(out, "\\u%04x", *p);
			len = 1;
		} else if (*p == '"' || *p == '\\') {
			fprintf(out, "\\%c", *p);
		} else {
			fwrite(p, 1, len, out);
		}
		str += len;
	}
	fputc('"', out);
}
