#ifndef DBOXFS_IMPORT_DOVECOT_PRIVATE_H
#define DBOXFS_IMPORT_DOVECOT_PRIVATE_H

/*
 * import-dovecot-private: the state of one adoption (import-dovecot.h),
 * shared by import-dovecot.c (folders, messages, the commit) and
 * import-dovecot-files.c (the Dovecot m.N files: their records, the
 * staged links).  Not for other callers.
 */

#include "engine/import-dovecot.h"
#include "storage/dbox-format.h"

/* A record found in the Dovecot m.N files. */
struct adopt_rec {
	char guid[DBOX_GUID_HEX_LEN * 2 + 1];
	uint32_t dfile;          /* Dovecot's m.<dfile> */
	bool alt;                /* in Dovecot's ALT/storage */
	uint64_t offset, body_size, record_size, plain_size;
	bool external;           /* X metadata: external attachments */
	uint64_t ino;            /* our message inode, 0 until adopted */
	unsigned int names, refcount;
};

/* A Dovecot m.N that holds adopted messages. */
struct adopt_file {
	uint32_t dfile, file_id; /* Dovecot's id, ours */
	bool alt;                /* from Dovecot's ALT, into the store's */
	uint64_t size;
};

struct adopt_folder {
	char *mailbox;           /* Dovecot name (UTF-8) */
	uint64_t dir, cur, new;  /* index inodes; dir 0: not made */
	uint32_t uidvalidity, uidnext;
	char *keywords[DBOX_ADOPT_MAX_KEYWORDS];
	size_t nkeywords;
	bool kw_overflow;
	int uidlist_fd;          /* backing file of dovecot-uidlist, or -1 */
};

struct dbox_adopt {
	struct dbox_store *st;
	struct dbox_index *index;
	struct dbox_adopt_source src;
	const struct dbox_adopt_ops *ops;
	struct dbox_adopt_counts counts;
	bool in_tx, committed, fatal;

	struct adopt_rec *recs;   /* sorted by GUID */
	size_t nrecs, recs_size;
	struct adopt_file *files;
	size_t nfiles, files_size;
	struct adopt_folder *folders;
	size_t nfolders, folders_size;
	size_t last_folder;
};

/* import-dovecot.c */

/* Pass note to the caller (ops->note). */
void adopt_note(struct dbox_adopt *adopt, struct dbox_adopt_note note);
/* The adoption cannot go on after step failed with errno err: noted
   once (DBOX_ADOPT_FATAL).  Returns -err. */
int adopt_fatal(struct dbox_adopt *adopt, const char *step, int err);

/* import-dovecot-files.c */

/* Every record of the Dovecot storage/ (alt: of its ALT) into
   adopt->recs, sorted by GUID; unreadable files and corrupt records are
   noted.  Returns 0 or a negative errno (-ENOMEM, the directory's). */
int adopt_walk_storage(struct dbox_adopt *adopt, bool alt);
/* The record of guid with plaintext size size, or NULL. */
struct adopt_rec *adopt_find_rec(struct dbox_adopt *adopt, const char *guid,
				 uint64_t size);
/* Our m.N number for Dovecot's m.<dfile>, hard-linked in (staged) the
   first time.  Returns 0 or a negative errno (noted; -EXDEV: another
   filesystem). */
int adopt_link_file(struct dbox_adopt *adopt, bool alt, uint32_t dfile,
		    uint32_t *file_id_r);
/* A new empty m.N for new mail, in the index.  Returns 0 or a negative
   errno. */
int adopt_fresh_mfile(struct dbox_adopt *adopt);
/* fdatasync the staged links, sync files/ and the storage directories.
   Returns 0 or a negative errno. */
int adopt_sync(struct dbox_adopt *adopt);
/* Remove the staged links (the adoption was not committed). */
void adopt_drop_staged(struct dbox_adopt *adopt);
/* Give the staged links their m.N names (after the commit).  Returns 0
   or a negative errno (each failure noted). */
int adopt_finish_renames(struct dbox_adopt *adopt);

#endif
