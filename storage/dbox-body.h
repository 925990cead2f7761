#ifndef DBOXFS_DBOX_BODY_H
#define DBOXFS_DBOX_BODY_H

/*
 * dbox-body: the plaintext view of a message body being written into a
 * record (dbox-file.h's dbox_append), compressed or not.
 *
 * Callers write, truncate and read plaintext at plaintext offsets; this
 * module decides what the record body holds.  With compression on, every
 * non-empty body is stored as one stream of the codec (gz: a standard
 * single-member gzip stream, as Dovecot's zlib plugin writes with
 * zlib_save = gz), Z metadata = the plaintext size when it differs from
 * the stored size, V computed on the plaintext (dbox-save.c in Dovecot
 * 2.3.21 writes them so; docs/dbox-format.md sections 5, 7).
 *
 * How bytes get there:
 *  - Sequential writes (each at the current plaintext end, the normal case
 *    for deliveries and copies) are compressed as they arrive: the
 *    compressed bytes go straight into the record, so the message is
 *    written once.
 *  - Anything else - a write elsewhere, a truncate to a new non-zero
 *    size, a read, or a write after dbox_body_finish - turns the body
 *    plain first: what was compressed so far is decompressed (into the
 *    record's own tail, then moved to the body start), and the body stays
 *    plain while it is written.  dbox_body_finish then compresses the
 *    plaintext once (again through the tail) before the metadata is
 *    written.  So the stored result does not depend on the write order;
 *    an out-of-order writer only costs one more pass over the body.
 *  - An empty body is stored empty.  A plain body whose first bytes look
 *    like a compressed stream (dbox_detect_compression) is stored
 *    compressed with gz even when compression is off: readers detect
 *    compression from those bytes alone, so it would not read back
 *    otherwise.  (Dovecot refuses to save such mail for the same reason.)
 *  - Reads of a finished compressed body decode it (dbox-read.h) without
 *    changing it.
 *
 * An I/O error while compressed bytes are being written (ENOSPC) leaves
 * the body unusable: that call and every later one return that same
 * error (a full disk stays ENOSPC at write, fsync and close alike), and
 * the caller drops the record (dbox_append_abort).  Errors that leave
 * the body as it was (ENOSPC while decompressing into the tail, EFBIG)
 * are returned and the body stays usable.  Errors are negative errno
 * values (storage/dbox-fault.h).
 *
 * Not thread-safe; the caller serialises calls (the store lock).
 */

#include "dbox-file.h"
#include "dbox-read.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* How new message bodies are stored. */
struct dbox_compress_settings {
	enum dbox_compression method; /* NONE or a codec dboxfs writes (GZ) */
	int level;                    /* codec level; 0 = its default */
};

/* Parse a compression spec: "none", "gz" or "gz:LEVEL" (LEVEL 1-9, the
   zlib_save / zlib_save_level values of Dovecot's zlib plugin).  Returns
   0 and fills *set_r, or -EINVAL (unknown method, a method dboxfs reads
   but does not write, bad level). */
int dbox_compress_parse(const char *spec, struct dbox_compress_settings *set_r);

/* Format set as a spec dbox_compress_parse accepts ("none", "gz:6") into
   buf of size bytes. */
void dbox_compress_format(const struct dbox_compress_settings *set, char *buf,
			  size_t size);

enum dbox_body_mode {
	DBOX_BODY_PLAIN,    /* the record body is the plaintext so far */
	DBOX_BODY_STREAM,   /* compressing sequential writes as they come */
	DBOX_BODY_SEALED,   /* finished: plain or one whole compressed stream */
	DBOX_BODY_BROKEN,   /* a failed write left it unusable */
};

struct dbox_body {
	struct dbox_append *ap;        /* the record; not owned */
	struct dbox_compress_settings set;
	enum dbox_body_mode mode;
	bool compressed;               /* SEALED: the body is a stream */
	uint64_t plain_size;           /* plaintext bytes */
	uint64_t vsize;                /* STREAM, SEALED compressed: V */
	bool prev_cr;                  /* STREAM: plaintext ends in '\r' */
	const struct dbox_codec *codec;/* STREAM, SEALED compressed */
	void *encoder;                 /* STREAM */
	uint8_t *buf;                  /* work buffer, BODY_BUF_SIZE */
	struct dbox_reader *reader;    /* SEALED compressed, for reads */
	int error;                     /* BROKEN: the negative errno that
					  broke it */
	/* PLAIN bytes [0, plain_size) all written in order (appends from
	   0, as a delivery writes): their V and first bytes are known, and
	   sealing reads nothing back. */
	bool in_order;
	bool in_order_cr;              /* they end in '\r' */
	uint64_t in_order_vsize;
	uint8_t head[16];              /* the first min(16, plain_size) */
};

/* Start the body of the record ap has just begun (empty, plain). */
void dbox_body_init(struct dbox_body *body, struct dbox_append *ap,
		    const struct dbox_compress_settings *set);

/* Write plaintext [off, off+len).  Returns 0 or a negative errno: -EFBIG
   past the 4 GiB file limit, -ENOSPC, -ENOMEM, -EIO (the codec failed, or
   the compressed bytes written so far do not read back), -errno of the
   write, or for a broken body the error that broke it. */
int dbox_body_pwrite(struct dbox_body *body, const void *buf, size_t len,
		     uint64_t off);

/* Set the plaintext size (shrink, or grow with zeros).  Returns 0 or a
   negative errno as dbox_body_pwrite. */
int dbox_body_truncate(struct dbox_body *body, uint64_t size);

/* Read plaintext [off, off+len), clipped to the plaintext size.  Returns
   the byte count, or -EIO (corrupt or broken), -ENOMEM, or -errno of
   pread. */
ssize_t dbox_body_pread(struct dbox_body *body, void *buf, size_t len,
			uint64_t off);

/* Plaintext size in bytes. */
uint64_t dbox_body_size(const struct dbox_body *body);

/* 0, or for a body a failed write left unusable the negative errno that
   every later call returns (see above). */
int dbox_body_error(const struct dbox_body *body);

/* Finish: store the body in its final form (compressing it if needed),
   fill md's V and Z from the plaintext (for a plain body V is left to
   dbox_append_finish, which reads it back), and dbox_append_finish() the
   record with md.  May be called again after more writes.  Returns 0 or a
   negative errno as dbox_body_pwrite and dbox_append_finish. */
int dbox_body_finish(struct dbox_body *body, struct dbox_metadata *md);

/* Free the body's buffers and codec states (not the record).  Safe
   twice. */
void dbox_body_free(struct dbox_body *body);

#endif
