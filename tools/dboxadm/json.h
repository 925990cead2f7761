#ifndef DBOXADM_JSON_H
#define DBOXADM_JSON_H

/*
 * json: what every `dboxadm VERB --json` shares (stats now; check and
 * others may adopt it).  The convention, documented in dboxadm(8):
 *
 *   - stdout carries exactly one JSON object, UTF-8, keys in snake_case,
 *     sizes as integers in bytes; nothing else is printed on stdout;
 *   - messages (errors, warnings, progress) still go to stderr as
 *     "dboxadm: ...";
 *   - the exit status is the same as without --json (ADM_EXIT_* in
 *     dboxadm.h), so a monitor can read both;
 *   - keys may be added later; consumers ignore keys they do not know.
 *
 * The object itself is written with printf and these helpers.
 */

#include <stdio.h>

/* Write str as a JSON string literal (with the quotes) to out.  Quotes,
   backslashes and control characters (C1 U+0080-U+009F too) are
   escaped; a byte that does not start a well-formed UTF-8 sequence (a
   Latin-1 folder name, say) is written as \u00XX, so the output is
   always valid JSON and inert on a terminal.  str is NUL-terminated;
   write errors are left for the caller's fflush/ferror. */
void adm_json_string(FILE *out, const char *str);

#endif
