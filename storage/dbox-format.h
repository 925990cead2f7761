#ifndef DBOXFS_DBOX_FORMAT_H
#define DBOXFS_DBOX_FORMAT_H

/*
 * dbox-format: the bytes of a dbox v2 file, as Dovecot 2.3 writes mdbox
 * storage/m.N files (dovecot/core 2.3.21, src/lib-storage/index/dbox-common/
 * dbox-file.h, dbox-file.c, dbox-save.c; summarised in
 * docs/dbox-format.md sections 2-6).
 *
 * Pure functions over memory buffers: no I/O, no allocation except where a
 * function says so.  The layout of one file is
 *
 *     file header line   "2 M1e C<hex ctime>\n"
 *     record*            message header (30 bytes) | body | metadata block
 *
 * and of one record
 *
 *     0x01 0x02 'N' ' ' <8 spaces> ' ' <16 uppercase hex body size> '\n'
 *     body (body size bytes, possibly compressed)
 *     "\n\x01\x03\n" then lines "<key><value>\n", ended by an empty line.
 */

#include "dbox-fault.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* Size of the per-message header in a v2 file ("M1e"). */
#define DBOX_MSG_HEADER_SIZE 30
/* Room a formatted file header line needs, including the terminating NUL. */
#define DBOX_FILE_HEADER_MAX 64
/* Metadata block magic that follows every body (DBOX_MAGIC_POST). */
#define DBOX_MAGIC_POST "\n\001\003\n"
#define DBOX_MAGIC_POST_LEN 4
/* A GUID as Dovecot writes it: 32 lowercase hex digits (128 bits). */
#define DBOX_GUID_HEX_LEN 32

/* Format the file header line for a new v2 file created at `created` (UNIX
   seconds) into buf (at least DBOX_FILE_HEADER_MAX bytes).  Returns the line
   length in bytes including the '\n' (no NUL counted). */
size_t dbox_file_header_format(char *buf, time_t created);

/* Parse a file header line from buf[0..len).  On success returns 0 and sets
   *header_len_r to the line length including '\n' (the offset of the first
   record), *msg_header_size_r to the M value, *created_r to the C value (0
   when absent).  Returns -DBOX_ECORRUPT when the line is not a v2 header
   (no '\n' within len, version not 2, M missing or not 0x1e), filling
   *fault (may be NULL; offset 0) with the reason.  Unknown tokens are
   ignored. */
int dbox_file_header_parse(const char *buf, size_t len, size_t *header_len_r,
			   unsigned int *msg_header_size_r, time_t *created_r,
			   struct dbox_fault *fault);

/* Fill out[DBOX_MSG_HEADER_SIZE] with the message header for a body of
   body_size bytes (16 uppercase hex digits, as dec2hex writes it). */
void dbox_msg_header_format(uint8_t out[DBOX_MSG_HEADER_SIZE],
			    uint64_t body_size);

/* Fill out[DBOX_MSG_HEADER_SIZE] with the placeholder a record has while
   it is written: the magic, type 'W', spaces and the final '\n'.  dboxfs's
   own (Dovecot writes zeros): a reader takes it for no record (its type
   is not 'N'), and crash recovery for the record of a save in flight
   even when no index row names it (a create whose commit was deferred:
   docs/dbox-format.md section 3). */
void dbox_msg_header_unsealed(uint8_t out[DBOX_MSG_HEADER_SIZE]);

/* Is buf the placeholder dbox_msg_header_unsealed writes? */
bool dbox_msg_header_is_unsealed(const uint8_t buf[DBOX_MSG_HEADER_SIZE]);

/* Is buf all zero bytes: the header Dovecot writes while a record's body
   is written (docs/dbox-format.md section 3), or a torn write? */
bool dbox_msg_header_is_zero(const uint8_t buf[DBOX_MSG_HEADER_SIZE]);

/* Parse a message header: checks the 0x01 0x02 magic, type 'N' and the final
   '\n'; the size accepts upper or lower case hex.  Returns 0 and sets
   *body_size_r, or -DBOX_ECORRUPT when the header is corrupt (including
   any non-hex digit in the size field), filling *fault (may be NULL) with
   the reason and the offset of the bad byte within the header. */
int dbox_msg_header_parse(const uint8_t buf[DBOX_MSG_HEADER_SIZE],
			  uint64_t *body_size_r, struct dbox_fault *fault);

/* Longest L value in bytes: a seal writes none for a longer path,
   and recovery takes a longer L or B as none (engine/store-restore.c),
   so the two agree on what a sealed path promises. */
#define DBOX_SEAL_PATH_MAX 4096

/* A, dboxfs's own key (docs/dbox-format.md section 5): the message's
   permission bits, owner and group when a close or fsync() sealed the
   record, so that recovery gives them back. */
struct dbox_owner {
	bool set;      /* the record has a valid A line */
	uint32_t mode; /* permission bits (0777 only) */
	uint32_t uid, gid;
};

/* The metadata of one record.  Strings are NUL-terminated and owned by the
   struct (see dbox_metadata_clear). */
struct dbox_metadata {
	char guid[DBOX_GUID_HEX_LEN * 2 + 1]; /* G; "" when absent; longer
						 foreign GUIDs are truncated */
	time_t received;      /* R: received date, UNIX seconds; 0 if absent */
	uint64_t vsize;       /* V: size with every LF counted as CRLF */
	bool has_vsize;
	uint64_t plain_size;  /* Z: plaintext size when it differs from the
				 stored body size (compression) */
	bool has_plain_size;
	char *mailbox;        /* B: folder the mail was saved to, or NULL */
	char *msg_path;       /* L, dboxfs's own key (docs/dbox-format.md
				 section 5): the message's path below the
				 maildir root when a close or fsync() sealed
				 the record ("tmp/1.host"), or NULL */
	struct dbox_owner owner; /* A, dboxfs's own key; written only with
				    L */
	char *extra;          /* other lines ("P..\nO..\n"), kept verbatim
				 for copying, or NULL */
};

/* Free what md owns and zero it.  Safe on a zeroed struct. */
void dbox_metadata_clear(struct dbox_metadata *md);

/* Format the metadata block (magic, lines in Dovecot 2.3's order Z R V G B,
   then L and A, then extra, then the empty line) into a malloc()ed buffer.
   Returns the block length in bytes and sets *buf_r (caller frees), or
   -ENOMEM.  A mailbox or path (L) containing CR or LF is omitted, as
   Dovecot does for B. */
long dbox_metadata_format(const struct dbox_metadata *md, char **buf_r);

/* Parse a metadata block starting at buf[0] (which must be the post magic).
   Returns 0, filling *md_r (caller clears) and *block_len_r (bytes from the
   magic to just after the terminating empty line); 1 when buf[0..len) ends
   before the block does (read more and retry); -DBOX_ECORRUPT when the
   block is corrupt (bad magic, a key that is not an uppercase letter, a
   bad hex value, a NUL byte), filling *fault (may be NULL) with the reason
   and the offset of the bad line in buf; -ENOMEM.  Unknown uppercase keys,
   and an A line that does not read as dbox_metadata_format writes it,
   go to extra. */
int dbox_metadata_parse(const char *buf, size_t len, struct dbox_metadata *md_r,
			size_t *block_len_r, struct dbox_fault *fault);

/* Virtual size of buf: its length plus one for every '\n' not preceded by
   '\r'.  `prev_cr` is whether the byte before buf was '\r' (for computing
   over several chunks); *last_cr_r, if not NULL, receives whether buf ends
   in '\r'. */
uint64_t dbox_vsize_add(const void *buf, size_t len, bool prev_cr,
			bool *last_cr_r);

#endif
