#ifndef DBOXFS_DBOX_FILE_H
#define DBOXFS_DBOX_FILE_H

/*
 * dbox-file: I/O on one storage/m.N file: create it, append one record at a
 * time, read a record's header and metadata back, and walk all records.
 *
 * Ownership rule kept by callers (engine/store.c): a file is appended to by
 * at most one writer at a time, and only at its end; committed records are
 * never rewritten.  This module does not lock; it only does the byte work.
 * All offsets and sizes are in bytes.  Errors are negative errno values
 * (storage/dbox-fault.h); a corrupt or truncated record is -EIO.
 */

#include "dbox-format.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* Create storage/m.<file_id> in dirfd with O_EXCL and mode 0600 and write
   its header line (created = now).  Returns the open read-write fd and sets
   *size_r to the header length (the offset of the first record), or
   -EEXIST when the file exists, or -errno of openat/pwrite (-ENOSPC...;
   the file is then removed again). */
int dbox_file_create(int dirfd, uint32_t file_id, uint64_t *size_r);

/* Format "m.<file_id>" into buf (at least 16 bytes). */
void dbox_file_name(char *buf, uint32_t file_id);

/* Parse the name of a storage/ entry as an m.N file: "m." and then a
   file_id in decimal from 1 to UINT32_MAX, without leading zeros, sign or
   anything after it ("m.0", "m.01", "m.1.broken" are no m.N).  Returns true
   and sets *file_id_r, or false (*file_id_r untouched).  errno is not
   touched.
   Source: docs/dbox-format.md section 1 ("m." + decimal file_id). */
bool dbox_mfile_parse_name(const char *name, uint32_t *file_id_r);

/* Read and check the header line of an open m.N.  Returns 0 and sets
   *header_len_r, or -EIO (corrupt header) or -errno of pread. */
int dbox_file_read_header(int fd, size_t *header_len_r);

/*
 * Appending one record.  The writer owns the tail of the file from `offset`
 * on: dbox_append_begin() writes a 30-byte placeholder header
 * (dbox_msg_header_unsealed: where Dovecot writes zeros, one recovery
 * tells from a torn record), body bytes go to offset + 30 + body offset, and
 * dbox_append_finish() writes the metadata block after the body, the real
 * message header over the placeholder, and truncates anything after the
 * block.  finish may be called again after more writes (the block is then
 * rewritten after the new body end).
 */
struct dbox_append {
	int fd;                /* m.N, open read-write; not owned */
	uint64_t offset;       /* record start */
	uint64_t body_size;    /* bytes of body written so far (high mark) */
	uint64_t record_size;  /* header+body+metadata after the last finish;
				  0 before */
	uint64_t end;          /* file offset past every byte the record may
				  have written (a failed pwrite included):
				  finish cuts the file back only below it */
};

/* Does a record being written start at offset of fd: the placeholder
   header of dbox_append_begin, not yet replaced by the real one?  false
   also when it cannot be read. */
bool dbox_append_unsealed_at(int fd, uint64_t offset);

/* Start a record at `offset`, the current end of the file (nothing may
   lie past it: see dbox_append_finish).  Returns 0,
   -EFBIG past the 4 GiB - 1 file offset limit, or -errno of pwrite. */
int dbox_append_begin(struct dbox_append *ap, int fd, uint64_t offset);

/* Write body bytes [off, off+len) of the message.  Returns 0, -EFBIG when
   the record would pass 4 GiB - 1 of file offset, or -errno of
   pwrite/ftruncate (-ENOSPC, -EBADF...). */
int dbox_append_pwrite(struct dbox_append *ap, const void *buf, size_t len,
		       uint64_t off);

/* Set the body size to `size` bytes (shrink or grow with zeros).  Returns
   0, -EFBIG (as dbox_append_pwrite) or -errno of ftruncate. */
int dbox_append_truncate(struct dbox_append *ap, uint64_t size);

/* Finish the record: write md as the metadata block after the body, the
   message header at offset, and ftruncate the file to the end of the
   block when this record wrote past it before (ap->end: a longer block,
   a failed write); a plain append needs no ftruncate.  Bytes that were
   in the file past offset before dbox_append_begin are not looked at:
   the caller begins records only at the file's real end.  md->vsize
   and has_vsize are filled in by reading the body back (uncompressed
   bodies only; a compressed body's caller sets them).
   Sets ap->record_size.  Returns 0, -EFBIG, -ENOMEM, -EIO (the body is
   shorter than ap->body_size) or -errno of pread/pwrite/ftruncate. */
int dbox_append_finish(struct dbox_append *ap, struct dbox_metadata *md);

/* Drop the record: truncate the file back to ap->offset.  For a record
   that was never committed to the index.  Returns 0 or -errno of
   ftruncate. */
int dbox_append_abort(struct dbox_append *ap);

/* Read and verify the record at `offset` of fd: message header magic, body
   size equal to expected_body_size (skip the check when it is
   UINT64_MAX), metadata magic and block.  Fills *md_r (caller clears) and
   *record_size_r.  Returns 0, -EIO when the record is corrupt or truncated
   (and logs what is wrong, naming file_id and offset; file_id 0, a file
   that is no m.N such as a lost+found copy, logs nothing: the caller names
   the file), -ENOMEM, or -errno
   of pread.  dbox_record_verify (dbox-record.h) is the same read with the
   reason handed back as data instead of logged. */
int dbox_record_read(int fd, uint32_t file_id, uint64_t offset,
		     uint64_t expected_body_size, uint64_t *body_size_r,
		     struct dbox_metadata *md_r, uint64_t *record_size_r);

/* Rewrite the R (received date) value of the finished record at `offset`
   in place, as the received date is part of a message's identity only in
   the index and clients set it after delivery (mbsync, Dovecot utime()
   the file).  Only a value of the same hex width is written, so no other
   byte of the file moves: any date from 1978 to 2106 against one in the
   same range.  Returns 0, -ERANGE (width differs), -ENOENT (no R line),
   -EIO (record unreadable) or -errno of pread/pwrite. */
int dbox_record_set_received(int fd, uint32_t file_id, uint64_t offset,
			     time_t received);

/* Called by dbox_file_walk for each record: offset of the record, its body
   size, metadata.  Return 0 to go on, non-zero to stop the walk (that value
   is then returned by dbox_file_walk; a negative errno for an error). */
typedef int dbox_walk_cb_t(void *ctx, uint64_t offset, uint64_t body_size,
			   const struct dbox_metadata *md,
			   uint64_t record_size);

/* Walk every record of an m.N from the first to EOF.  Returns 0 at a clean
   EOF, the callback's non-zero value if it stopped the walk, or -EIO at the
   first corrupt record (*bad_offset_r, if not NULL, gets its offset;
   records before it were delivered), -ENOMEM or -errno of fstat/pread
   (*bad_offset_r likewise). */
int dbox_file_walk(int fd, uint32_t file_id, dbox_walk_cb_t *cb, void *ctx,
		   uint64_t *bad_offset_r);

#endif
