#ifndef DBOXFS_DBOX_RECORD_H
#define DBOXFS_DBOX_RECORD_H

/*
 * dbox-record: read one record of an m.N back and verify it, with what is
 * wrong reported as data (dbox-fault.h): the message header (magic, type,
 * size; dbox-format.h), the metadata magic right after the body, and the
 * metadata block up to its terminating empty line (docs/dbox-format.md
 * sections 4-6).  dbox_record_read() (dbox-file.h) is this plus a log
 * line; `dboxadm check`, the scan of a damaged file (dbox-scan.h) and the
 * recovery walk past a committed end use it directly, quietly.
 */

#include "dbox-fault.h"
#include "dbox-format.h"

#include <stdint.h>

/* A metadata block larger than this many bytes is taken as corruption. */
#define DBOX_METADATA_MAX (1024 * 1024)

/* Read and verify the record at byte `offset` of fd: message header, body
   size equal to expected_body_size (not checked when UINT64_MAX), the
   metadata magic and block.  Returns 0, filling *body_size_r, *md_r
   (caller clears) and *record_size_r (header + body + metadata bytes);
   -DBOX_ECORRUPT when the record is corrupt or the file ends inside it,
   with *fault (may be NULL) saying why, its offset the record's offset;
   -ENOMEM; or the pread error. */
int dbox_record_verify(int fd, uint64_t offset, uint64_t expected_body_size,
		       uint64_t *body_size_r, struct dbox_metadata *md_r,
		       uint64_t *record_size_r, struct dbox_fault *fault);

#endif
