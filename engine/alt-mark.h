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
 * other store's mail).  So the first writable open of an ALT leaves in
 * its root a mark, DBOX_ALT_MARK (engine/store-layout.h): a random
 * 128-bit id, as 32 lowercase hex digits and a newline, that the index
 * records too (DBOX_SETTING_ALT_ID).  Every open of the ALT (the mount,
 * dboxadm's views, rebuild) judges it:
 *
 *   index id  ALT mark  the index places m.N in ALT   verdict
 *   I         I         either                         this store's
 *   I         J != I    either                         another store's
 *   I         none      either                         this store's (an ALT
 *                                                      made before marks, or
 *                                                      copied without it)
 *   none      J         yes                            this store's (an index
 *                                                      made before marks, or
 *                                                      a rebuild's): J adopted
 *   none      J         no                             another store's
 *   none      none      either                         this store's
 *
 * A writable open then writes the index's id into an ALT without a mark
 * (a new one when the index has none) and records the ALT's id in an
 * index without one.  The mark is the ALT owner's file like its m.N;
 * dboxfs never follows a symbolic link to it.  Dovecot ignores it (it
 * reads only ALT/storage/).
 */

#include "index/index.h"

#include <stdbool.h>

/* The two sides of the judgement. */
struct dbox_alt_mark {
	char index_id[33];  /* the index's DBOX_SETTING_ALT_ID, "" when none */
	bool index_places;  /* the index places m.N in ALT */
	uint32_t first;     /* the lowest of them, when index_places */
	bool want_first;    /* an ALT without m.<first> is not this store's
			       (its disk not mounted yet, a typo) */
	bool write;         /* a writable open: write the mark when missing */
	char alt_id[33];    /* out: the ALT's mark, "" when none (or not 32
			       hex digits: a damaged one, rewritten by a
			       writable open) */
};

/* Fill mark's index side (index_id, index_places) from index; write stays
   false and alt_id "".  Returns 0 or -EIO (or -ENOMEM). */
int dbox_alt_mark_load(struct dbox_index *index, struct dbox_alt_mark *mark);

/* Judge the ALT whose root is open as alt_fd (alt: its path, for the log)
   by the table above, reading its mark into mark->alt_id.  Returns 0
   (this store's ALT) or -EXDEV (another store's: logged). */
int dbox_alt_mark_judge(int alt_fd, const char *alt, struct dbox_alt_mark *mark);

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
