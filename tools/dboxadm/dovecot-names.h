#ifndef DBOXADM_DOVECOT_NAMES_H
#define DBOXADM_DOVECOT_NAMES_H

/*
 * dovecot-names: turning what `doveadm` prints about an mdbox store into
 * Maildir++ terms, for import-dovecot.c.  Pure functions, no I/O.
 *
 *   mailbox names  Dovecot prints them in UTF-8 with the namespace
 *                  separator '/' (our doveadm config sets it).  A Maildir++
 *                  folder is ".A.B" for "A/B", each component in modified
 *                  UTF-7 (RFC 3501 section 5.1.3, as Courier and Dovecot's
 *                  maildir store folder names); '.' inside a component is
 *                  encoded too ("&AC4-"), since Maildir++ reads '.' as the
 *                  hierarchy separator.  INBOX is the root.
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

/* Maildir++ directory name of a Dovecot mailbox name (UTF-8, '/'
   separated) into a malloc()ed *dir_r: "" for INBOX (the root), else
   ".A.B".  Returns 0, -EINVAL for a name that is not valid UTF-8 or has an
   empty component, -ENAMETOOLONG when the result passes 255 bytes,
   -ENOMEM. */
int dovecot_mailbox_to_maildir(const char *mailbox, char **dir_r);

/* The UTF-8 form of a mailbox name whose components are in modified
   UTF-7 ("&AMQ-rger/2024" -> "Ärger/2024"), for people to read: what
   dbox_index_mailbox_name() returns for a Maildir++ folder.  Decoded by
   iconv's UTF-7-IMAP (glibc 2.36 and later).  Returns 0 and a malloc()ed
   *utf8_r, -EINVAL when name is not valid modified UTF-7 (8-bit bytes, a
   bad base64 run), -ENOSYS when iconv lacks UTF-7-IMAP, -ENOMEM. */
int dovecot_mutf7_to_utf8(const char *name, char **utf8_r);

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

void dovecot_flags_free(struct dovecot_flags *flags);

/* The maildir info letters of flags, in ASCII order ("DFRST" then
   keyword letters), into buf (at least 32 bytes).  keyword_letter(i)
   maps flags->keywords[i] to 'a'..'z', or 0 when it has none (more than
   26 keywords in the folder; it is then left out). */
void dovecot_flags_letters(const struct dovecot_flags *flags,
			   char (*keyword_letter)(void *ctx, const char *kw),
			   void *ctx, char buf[32]);

/* Split one line of tab output (without its '\n') into at most max
   fields, in place: fields[i] point into line.  The last field takes the
   rest of the line, tabs included.  Returns the number of fields. */
size_t dovecot_tab_split(char *line, char **fields, size_t max);

#endif
