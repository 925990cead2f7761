#ifndef DBOXFS_DBOX_READ_H
#define DBOXFS_DBOX_READ_H

/*
 * dbox-read: read the plaintext of one message body, whatever its storage.
 *
 * Compression is detected from the first bytes of the body, as Dovecot's
 * compression_detect_handler() does (src/lib-compression/compression.c,
 * 2.3.21; docs/dbox-format.md section 7): gzip 1f 8b, bzip2
 * "BZh" + '1'..'9', xz FD 37 7A 58 5A 00, zstd 28 B5 2F FD, Dovecot's lz4
 * container "Dovecot-LZ4\r\x2a\x9b\xc5".  There is no flag in the record.
 * A plain body is read with pread.  A compressed one keeps its decoder
 * state between calls (dbox-codec.h) so sequential reads cost O(size); a
 * read that starts up to DBOX_READ_WINDOW bytes behind the current
 * position is served from a window of recent plaintext (so reads arriving
 * slightly out of order stay cheap); one further back restarts the stream
 * from the body start.  Every read is correct whatever its offset.
 *
 * A reader is not thread-safe; one per open file handle.
 */

#include "dbox-fault.h"

#include <stdint.h>
#include <sys/types.h>

enum dbox_compression {
	DBOX_COMPRESSION_NONE,
	DBOX_COMPRESSION_GZ,
	DBOX_COMPRESSION_BZ2,
	DBOX_COMPRESSION_XZ,
	DBOX_COMPRESSION_ZSTD,
	DBOX_COMPRESSION_LZ4,    /* Dovecot's lz4 container */
};

/* Plaintext kept behind the read position of a compressed body. */
#define DBOX_READ_WINDOW (1024 * 1024)

struct dbox_reader;

/* Detect the compression of a body from its first bytes (len may be less
   than the magic; then NONE unless a full magic matches). */
enum dbox_compression dbox_detect_compression(const void *head, size_t len);

/* Open a reader for the body at [body_offset, body_offset + body_size) of
   fd (the fd is not owned and must stay open while the reader lives).
   plain_size is the plaintext size from the index (Z metadata, or the
   body size when there is none).  Returns 0 and sets *reader_r, or
   -ENOMEM or the pread error (negative). */
int dbox_reader_open(int fd, uint64_t body_offset, uint64_t body_size,
		     uint64_t plain_size, struct dbox_reader **reader_r);

/* Read up to len plaintext bytes at plaintext offset off into buf.
   Returns the byte count (0 at or past plain_size), -DBOX_ECORRUPT when
   the stored bytes are corrupt or do not hold plain_size bytes (logged,
   naming the body (dbox_reader_set_name) and the codec; the mount answers
   EIO), -ENOMEM, or the pread error.  After an error the next read starts
   the stream afresh. */
ssize_t dbox_reader_pread(struct dbox_reader *reader, void *buf, size_t len,
			  uint64_t off);

/* dbox_reader_pread, with corruption reported into *fault instead of the
   log when fault is not NULL: the reason (e.g. "corrupt gzip stream at
   plaintext offset 0: ..."; the caller names the body) and the body's
   file offset. */
ssize_t dbox_reader_pread_fault(struct dbox_reader *reader, void *buf,
				size_t len, uint64_t off,
				struct dbox_fault *fault);

/* Hand the reader's fd over to the reader: dbox_reader_free() closes it.
   Used with a dup()ed descriptor, so the reader keeps reading its m.N
   even after the file is unlinked and the store's own descriptor closed
   (purge). */
void dbox_reader_own_fd(struct dbox_reader *reader);

/* Name the body in log lines: printf-style, e.g. "STORE/storage/m.3
   offset 4096" (the record), used instead of the default "body at offset
   N" (N the body's file offset).  Copied.  Returns 0, or -ENOMEM (the
   name stays as it was). */
int dbox_reader_set_name(struct dbox_reader *reader, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* The compression of the body the reader reads. */
enum dbox_compression dbox_reader_compression(const struct dbox_reader *reader);

/* Free the reader (closing its fd if it owns it) and set *reader to NULL.
   Safe on NULL. */
void dbox_reader_free(struct dbox_reader **reader);

#endif
