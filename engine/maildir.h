#ifndef DBOXFS_MAILDIR_H
#define DBOXFS_MAILDIR_H

/*
 * maildir: the Maildir++ rules, in one place (docs/design.md section 1).
 *
 *   mailbox      a directory with the subdirectories cur/ new/ tmp/
 *                (maildir(5)); messages are named "unique:2,flags" in
 *                cur/ and "unique" in new/.
 *   INBOX        the store's root directory.
 *   folders      the mailbox "A/B" is the root's directory ".A.B"
 *                (Maildir++, as Courier and Dovecot's maildir store it):
 *                each component in modified UTF-7 (RFC 3501 section
 *                5.1.3), '.' inside a component encoded too ("&AC4-").
 *                Directories elsewhere (a nested tree some clients make)
 *                are named by their path, '/'-separated.
 *
 * The mailbox name is what the B (mailbox) metadata of a message's dbox
 * record says (docs/dbox-format.md); rebuild uses it to put a message
 * back into its folder.
 */

#include "index/index.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MAILDIR_SUBDIR_COUNT 3

/* A mailbox's subdirectories, in the order of maildir_subdirs. */
enum maildir_subdir { MAILDIR_CUR, MAILDIR_NEW, MAILDIR_TMP };

/* "cur", "new", "tmp". */
extern const char *const maildir_subdirs[MAILDIR_SUBDIR_COUNT];

/* Which of cur, new, tmp name[0..len) is (enum maildir_subdir), or -1
   when it is none of them. */
int maildir_subdir_of(const char *name, size_t len);

/* Is name[0..len) one of cur, new, tmp? */
bool maildir_is_subdir(const char *name, size_t len);

/* The mailbox name of the folder whose cur/new/tmp directory is subdir:
   "INBOX" for the root, "A/B" for the Maildir++ folder ".A.B" (components
   left in modified UTF-7, as stored), a nested directory's path
   otherwise.  Reads the index (needs the store lock, or a read-only
   connection).  Returns 0 and a malloc()ed *name_r, -ENOENT when subdir
   is unknown, -ENOMEM, or -EIO (logged; also when the way up to the root
   is longer than DBOX_TREE_MAX_DEPTH directories: a damaged or hostile
   index whose tree has a cycle). */
int maildir_mailbox_name(struct dbox_index *index, uint64_t subdir,
			 char **name_r);

/* maildir_mailbox_name for the folder directory itself (its cur/new/tmp's
   parent; DBOX_ROOT_INO: "INBOX"), for a caller that read the parent
   already.  Returns as maildir_mailbox_name. */
int maildir_folder_mailbox(struct dbox_index *index, uint64_t folder,
			   char **name_r);

/* The Maildir++ directory name of a mailbox name (UTF-8, '/' separated,
   as Dovecot prints it) into a malloc()ed *dir_r: "" for INBOX (the
   root), else ".A.B".  Returns 0, -EINVAL for a name that is not valid
   UTF-8 or has an empty component, -ENAMETOOLONG when the result passes
   255 bytes, -ENOMEM. */
int maildir_folder_of_mailbox(const char *mailbox, char **dir_r);

/* The UTF-8 form of a mailbox name whose components are in modified
   UTF-7 ("&AMQ-rger/2024" -> "Ärger/2024"), for people to read.  Decoded
   by iconv's UTF-7-IMAP (glibc 2.36 and later).  Returns 0 and a
   malloc()ed *utf8_r, -EINVAL when name is not valid modified UTF-7
   (8-bit bytes, a bad base64 run), -ENOSYS when iconv lacks UTF-7-IMAP,
   -ENOMEM. */
int maildir_mutf7_to_utf8(const char *name, char **utf8_r);

#endif
