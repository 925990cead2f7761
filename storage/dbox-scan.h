#ifndef DBOXFS_DBOX_SCAN_H
#define DBOXFS_DBOX_SCAN_H

/*
 * dbox-scan: walk a possibly damaged m.N and find every whole record in
 * it, for `dboxadm check` and `dboxadm rebuild`.
 *
 * Where dbox_file_walk() stops at the first corrupt record, a scan goes
 * on: it searches forward for the next offset where a whole record reads
 * back (message header magic 0x01 0x02 'N', a hex size, the metadata
 * magic right after that many body bytes, a well-formed metadata block),
 * as Dovecot's dbox_file_fix() resynchronises on the magics
 * (dovecot/core 2.3.21 src/lib-storage/index/dbox-common/dbox-file-fix.c;
 * docs/dbox-format.md section 6).  The bytes in between are
 * reported as one unreadable region.  A bad file header line makes the
 * search start at offset 0.
 *
 * Only reads; never changes the file.  A body that itself contains a
 * whole dbox record (a mail carrying an m.N as text) can be taken for a
 * record when the search starts inside it: callers that know where
 * records are (the index) must prefer that knowledge.
 */

#include "dbox-fault.h"
#include "dbox-file.h"

#include <stdint.h>

/* Called for each unreadable region [start, end) of the file (bytes that
   belong to no whole record, the file header line excepted), with what is
   wrong at its start (fault->offset = start; the reason, e.g. "corrupt
   message header (bad magic, type or size)"; valid during the call).
   Return 0 to go on, non-zero to stop the scan (that value is
   returned). */
typedef int dbox_bad_cb_t(void *ctx, uint64_t start, uint64_t end,
			  const struct dbox_fault *fault);

/* Scan m.<file_id> (open as fd) from its start up to `end` bytes (the
   file size when end is UINT64_MAX or past it): cb for every whole record
   that ends at or before `end`, in file order, and bad_cb (may be NULL)
   for every region in between that is no record.  *header_ok_r, if not
   NULL, tells whether the file header line was valid.  Nothing is
   logged.  Returns 0 when the scan reached `end`, the non-zero value of a
   callback that stopped it, or a negative errno for a read error or
   -ENOMEM (not for corruption, which is what bad_cb reports).  file_id
   is the N of m.N. */
int dbox_file_scan(int fd, uint32_t file_id, uint64_t end,
		   dbox_walk_cb_t *cb, dbox_bad_cb_t *bad_cb, void *ctx,
		   bool *header_ok_r);

/* Count the whole records that follow each other in m.<file_id> (open as
   fd) from offset start: the walk stops at the first offset that holds
   no whole record, at the end of the file, or at offset stop (a record
   that would cross stop is not counted).  *end_r gets the end of the last
   whole record counted (start when none); cb (may be NULL) is called for
   each, its return value ignored.  Used by crash recovery and check for
   the bytes past an m.N's committed end.  Returns the count or a negative
   errno for a read error or -ENOMEM, *end_r then the end of the records
   counted before it (corruption just ends the walk, unlogged). */
long dbox_file_tail_records(int fd, uint32_t file_id, uint64_t start,
			    uint64_t stop, uint64_t *end_r,
			    dbox_walk_cb_t *cb, void *ctx);

#endif
