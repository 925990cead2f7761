#ifndef DBOXFS_RESTORE_H
#define DBOXFS_RESTORE_H

/*
 * restore: one record of storage/ put back as a message the index did
 * not name: which folder takes it, the name it gets, and its owner and
 * mode.  Shared by 'dboxadm rebuild' (rebuild-restore.c) and by crash
 * recovery of fsync()ed mail (store-restore.c), so that both put mail
 * back alike.
 */

#include "index/index.h"
#include "storage/dbox-format.h"

#include <stdint.h>
#include <time.h>

/* Room for a name made by dbox_restored_name, NUL included. */
#define DBOX_RESTORED_NAME_SIZE 160

/* The Maildir++ directory name (".A.B") of folder B ("A/B"; docs/dbox-
   format.md section 5) into *dir_r (malloc()ed): decoded from modified
   UTF-7 and encoded again by engine/maildir.h's rules, so "A/B" is ".A.B"
   and "A.B" is ".A&AC4-B".  A name that is no modified UTF-7 keeps its
   bytes, '/' -> '.'.  Returns 0, -EINVAL when there is no valid Maildir++
   name for it, or -ENOMEM. */
int dbox_restore_flat_folder(const char *mailbox, char **dir_r);

/* The cur/ directory that takes a restored record of folder B `mailbox`
   (NULL or "": INBOX), looked up only, nothing made: the nested folder
   A/B when each component is a directory, else the Maildir++ folder
   .A.B, else INBOX (the root).  Returns 0 and *cur_r, -ENOENT when that
   folder has no cur/ directory, or the index's errno. */
int dbox_restore_find_cur(struct dbox_index *index, const char *mailbox,
			  uint64_t *cur_r);

/* The name of a restored record, try n (0 first, more when the name is
   taken): "<received>.G<GUID>.rebuild:2,", with the record's place
   (file_id, offset) added for an empty GUID or n > 0.  A foreign or
   damaged GUID may hold any byte: the name gets letters, digits and
   "._-:," only. */
void dbox_restored_name(time_t received, const char *guid, uint32_t file_id,
			uint64_t offset, unsigned int n,
			char name[DBOX_RESTORED_NAME_SIZE]);

/* A new message dir/name for the record at loc (committed; plain_size
   plaintext bytes, received UNIX seconds), with the mode, owner and group
   its fsync() recorded (owner: the record's A line) when it has them,
   else owned as directory dir (dirattr) is and with its mode less the
   execute bits, as Dovecot makes its mail files.  Inside the caller's
   transaction.  Returns 0 and the new inode's attributes in *attr_r (may
   be NULL), -EEXIST when the name is taken, or the index's errno. */
int dbox_restore_message(struct dbox_index *index, uint64_t dir,
			 const struct dbox_attr *dirattr, const char *name,
			 const struct dbox_msgloc *loc, uint64_t plain_size,
			 time_t received, const struct dbox_owner *owner,
			 struct dbox_attr *attr_r);

#endif
