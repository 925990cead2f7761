#ifndef DBOXADM_DOVECOT_NAMES_H
#define DBOXADM_DOVECOT_NAMES_H

/*
 * dovecot-names: turning what `doveadm` prints about an mdbox store into
 * Maildir++ terms, for import-dovecot.c.  Pure functions, no I/O.
 *
 *   mailbox names  Dovecot prints them in UTF-8 with the namespace
 *                  separator '/' (our doveadm config sets it); the Maildir++
 *                  folder of one is engine/maildir.h's business.
 *   flags          IMAP system flags to maildir info letters (maildir(5),
 *                  Dovecot's maildir: \Draft D, \Flagged F, \Answered R,
 *                  \Seen S, \Deleted T); \Recent has no letter; keywords
 *                  become the letters a..z by their index in the folder's
 *                  dovecot-keywords file.
 *   tab output     `doveadm -f tab`: a header line of field names, then
 *                  one line per item, fields separated by tabs.
 */

#include <stdbool.h>
#include <stddef.h>

/* The IMAP flags of one message, parsed from doveadm's space-separated
   flags field. */
struct dovecot_flags {
	bool seen, answered, flagged, deleted, draft, recent;
	char **keywords;      /* malloc()ed strings, in the order given */
	size_t nkeywords;
};

/* Parse a flags field ("\Seen \Recent $Label1 Work").  Returns 0 and
   fills *flags_r (free with dovecot_flags_free), or -ENOMEM.  Unknown
   system flags (a backslash word Dovecot does not define) are ignored. */
int dovecot_flags_parse(const char *field, struct dovecot_flags *flags_r);

/* Free the keywords of flags (from dovecot_flags_parse) and leave it
   empty; fine on a zeroed struct and twice. */
void dovecot_flags_free(struct dovecot_flags *flags);

/* The maildir info letters of flags, in ASCII order ("DFRST" then
   keyword letters), into buf (at least 32 bytes).  keyword_letter(ctx,
   kw) maps each keyword kw of flags->keywords to 'a'..'z', or 0 when it
   has none (more than 26 keywords in the folder; it is then left out). */
void dovecot_flags_letters(const struct dovecot_flags *flags,
			   char (*keyword_letter)(void *ctx, const char *kw),
			   void *ctx, char buf[32]);

/* Split one line of tab output (without its '\n') into at most max
   fields, in place: fields[i] point into line.  The last field takes the
   rest of the line, tabs included.  Returns the number of fields. */
size_t dovecot_tab_split(char *line, char **fields, size_t max);

#endif
