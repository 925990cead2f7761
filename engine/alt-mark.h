#ifndef DBOXFS_ALT_MARK_H
#define DBOXFS_ALT_MARK_H

/*
 * alt-mark: which store an alternate storage belongs to.
 *
 * ALT/storage/m.N are numbered by the store's index like STORE/storage/m.N,
 * so two stores' ALTs hold the same names.  A recorded ALT path that a
 * symbolic link switch (or an admin's typo) leads to another store's ALT
 * would have the store read, purge and back up the other store's m.N
 * under its own numbers (helper-77: `dboxadm backup` exited 0 with the
 * other store's mail; helper-81: a purge removed the other store's m.N).
 * So an ALT carries a mark in its root, DBOX_ALT_MARK
 * (engine/store-layout.h): a random 128-bit id, as 32 lowercase hex
 * digits and a newline, that the index records too (DBOX_SETTING_ALT_ID).
 * Every open of the ALT (the mount, dboxadm's views, rebuild) judges it:
 *
 *   index id  ALT mark  the index places m.N in ALT  verdict
 *   I         I         either                       this store's
 *   I         J != I    either                       another store's
 *   any       none      yes                          by its content (below)
 *   none      J         yes                          by its content; J taken
 *   none      J         no                           another store's
 *   any       none      no                           this store's only while
 *                                                    its storage/ holds no m.N
 *
 * By its content: the first committed message the index places in ALT
 * (dbox_index_alt_first_msg) must be a record with that GUID at that
 * offset of that m.N; one that reads as a whole record with another GUID
 * is another store's mail.  An unreadable or damaged record, or an ALT
 * holding only expunged mail, proves nothing either way and is taken.
 *
 * Only an ALT judged so (and, for the mount, holding the first m.N the
 * index places there) is marked by a writable open: the index's id, or a
 * new one, written into an ALT without a mark, and the ALT's id recorded
 * in an index without one.  The mark is the ALT owner's file like its
 * m.N; dboxfs never follows a symbolic link to it.  Dovecot ignores it
 * (it reads only ALT/storage/).  A copy of a whole store (cp -a) keeps
 * the index's id and so takes the original's ALT as its own: see
 * docs/administration.md.
 */

#include "index/index.h"

#include <stdbool.h>

/* The two sides of the judgement. */
struct dbox_alt_mark {
	char index_id[33];  /* the index's DBOX_SETTING_ALT_ID, "" when none */
	bool index_places;  /* the index places m.N in ALT */
	uint32_t first;     /* the lowest of them, when index_places */
	bool has_msg;       /* msg is the index's first committed ALT message */
	struct dbox_msgloc msg;
	bool want_first;    /* an ALT without m.<first> is not this store's
			       (its disk not mounted yet, a typo) */
	bool write;         /* a writable open: write the mark when missing */
	char alt_id[33];    /* out: the ALT's mark, "" when none (or not 32
			       hex digits: a damaged one, rewritten by a
			       writable open) */
};

/* Fill mark's index side (index_id, index_places, first, has_msg, msg)
   from index; want_first and write stay false, alt_id "".  Returns 0 or
   -EIO (or -ENOMEM). */
int dbox_alt_mark_load(struct dbox_index *index, struct dbox_alt_mark *mark);

/* Judge the ALT whose root is open as alt_fd and whose storage/ is open
   as storage_fd (alt: its path, for the log) by the table above, reading
   its mark into mark->alt_id.  Returns 0 (this store's ALT) or -EXDEV
   (another store's: logged). */
int dbox_alt_mark_judge(int alt_fd, int storage_fd, const char *alt,
			struct dbox_alt_mark *mark);

/* After a judgement that returned 0, with mark->write and no (valid)
   mark in the ALT open as alt_fd: write one, index_id or a new id when
   that is empty, and set mark->alt_id to it.  Written to a temporary
   name, fsynced, renamed over, the directory fsynced; a mark that cannot
   be written (a read-only disk) is logged, and the ALT used unmarked
   (mark->alt_id stays ""). */
void dbox_alt_mark_write(int alt_fd, const char *alt, struct dbox_alt_mark *mark);

/* After a judgement that returned 0 by a writable opener: record
   mark->alt_id in index as DBOX_SETTING_ALT_ID when the index has none
   (or another: a rebuild carrying an old index's).  Returns 0 or the
   -errno of dbox_index_setting_set. */
int dbox_alt_mark_record(struct dbox_index *index,
			 const struct dbox_alt_mark *mark);

#endif
