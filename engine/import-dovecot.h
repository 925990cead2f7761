#ifndef DBOXFS_IMPORT_DOVECOT_H
#define DBOXFS_IMPORT_DOVECOT_H

/*
 * import-dovecot: adopt a Dovecot mdbox store in place (`dboxadm
 * import-dovecot`): its storage/m.N files become m.N files of the store
 * by hard link (no message byte is copied or changed), and the index
 * gets the Maildir++ tree that Dovecot's own view of its mailboxes
 * describes.  The caller reads that view (doveadm, in dboxadm) and hands
 * it over mailbox by mailbox, message by message; this module finds each
 * message's record in the m.N files and makes the tree.
 *
 * Where the facts come from:
 *   folders, UIDs, flags, keywords, received dates, sizes, refcounts
 *       the caller (Dovecot's map and mailbox indexes, read by doveadm;
 *       docs/dovecot.md says why).
 *   where each message's bytes are
 *       a walk of the Dovecot root's storage/m.N (and its ALT's) with our
 *       own dbox reader: GUID -> file, offset, sizes.  The GUID (with the
 *       plaintext size, as Dovecot's rebuild matches duplicates) finds
 *       the record.
 *
 * What is made:
 *   mailbox "INBOX" -> the root, "A/B" -> ".A.B" (engine/maildir.h), each
 *     with cur/ new/ tmp/, "maildirfolder" (not INBOX), "dovecot-keywords"
 *     (when keywords are used: "<index> <name>" lines) and
 *     "dovecot-uidlist" (UIDVALIDITY, next UID, mailbox GUID and a line
 *     per message), so Dovecot on the mount keeps the same UIDs;
 *   message -> "<received>.V<uidvalidity>U<uid>.dovecot-import,S=<size>,
 *     W=<vsize>" in new/ when it is \Recent with no other flag or keyword
 *     (as Dovecot's maildir keeps it), else in cur/ with ":2,<letters>";
 *     mtime = the received date; one inode for all the mailboxes sharing
 *     a stored message (refcount > 1), so st_nlink = refcount.
 *
 * Crash safety: the m.N are linked as storage/.import-m.N (names recovery
 * and purge do not touch - recovery cuts m.N files the index does not
 * know, which would cut the shared inode); everything goes into the index
 * in one durable transaction (dbox_adopt_commit); then the links are
 * renamed to m.N.  A run that died before the commit left only
 * .import-m.N links: dbox_adopt_finish_staged removes them.  One that
 * died after it left links the index knows but without their final name:
 * dbox_adopt_finish_staged renames them.  New mail goes to a new, empty
 * m.N (the adopted files are never appended to), so the Dovecot root
 * keeps its bytes as they were.
 *
 * Nothing is printed: problems reach the caller as notes (struct
 * dbox_adopt_note), the totals as counts.
 */

#include "engine/store.h"

#include <stdbool.h>
#include <stdint.h>

/* The most keywords a folder's maildir names carry: the letters a..z. */
#define DBOX_ADOPT_MAX_KEYWORDS 26

enum dbox_adopt_note_kind {
	/* Errors: that item is not adopted (counted in failed). */
	DBOX_ADOPT_MFILE_UNREADABLE, /* file (in root) unreadable: err */
	DBOX_ADOPT_ADOPTED_ALREADY, /* file (in root) is m.<count> of the
				     store (`where`) already: an earlier run
				     adopted this root; the run stops */
	DBOX_ADOPT_NO_ALT,        /* file is in Dovecot's ALT, the store has
				     no alternate storage */
	DBOX_ADOPT_LINK_FAILED,   /* file cannot be linked into the store's
				     directory `where`: err (EXDEV: another
				     filesystem) */
	DBOX_ADOPT_NOT_WRITABLE,  /* the linked file is not writable for us:
				     err */
	DBOX_ADOPT_BAD_MAILBOX,   /* mailbox has no Maildir++ name: err */
	DBOX_ADOPT_FOLDER_FAILED, /* mailbox -> folder `name` failed: err */
	DBOX_ADOPT_NOT_LISTED,    /* uid of a mailbox the caller never gave */
	DBOX_ADOPT_NOT_FOUND,     /* uid: guid, size not in any m.N */
	DBOX_ADOPT_EXTERNAL,      /* uid: stored with external attachments */
	DBOX_ADOPT_EXISTS,        /* uid: its maildir name exists already */
	DBOX_ADOPT_RENAME_FAILED, /* staged `name` of file in `where` could
				     not get its final name: err */
	/* Warnings: adopted, but the caller should know. */
	DBOX_ADOPT_NOT_OURS,      /* file belongs to `owner`, not to the
				     store's owner (this process): its owner
				     can still rewrite the store's mail
				     through their own name of it (helper-79
				     F2) */
	DBOX_ADOPT_CORRUPT,       /* file has a corrupt record at offset: the
				     records after it cannot be found */
	DBOX_ADOPT_FINISHED,      /* file in `where`: an earlier run's
				     adoption finished */
	DBOX_ADOPT_HAS_UIDLIST,   /* folder `name` has a dovecot-uidlist */
	DBOX_ADOPT_HAS_KEYWORDS,  /* mailbox has a dovecot-keywords file */
	DBOX_ADOPT_KEYWORDS_FULL, /* mailbox: keyword `name` and later ones
				     find no letter */
	DBOX_ADOPT_REFCOUNT,      /* guid: Dovecot counts `count` references,
				     `found` names were made */
	/* The adoption stops: step `name` failed with err. */
	DBOX_ADOPT_FATAL,
};

struct dbox_adopt_note {
	enum dbox_adopt_note_kind kind;
	const char *root;     /* the Dovecot root (or ALT) of file */
	const char *where;    /* the store directory (path) of a link */
	uint32_t file;        /* Dovecot's m.<file> */
	const char *mailbox;  /* as the caller gave it */
	unsigned long uid;
	const char *guid;
	uint64_t size, offset;
	const char *name;     /* a folder, file or keyword name; a step */
	unsigned int count, found;
	unsigned int owner;   /* a file's owner (NOT_OURS) */
	int err;              /* a positive errno, or 0 */
};

struct dbox_adopt_ops {
	void (*note)(void *ctx, const struct dbox_adopt_note *note);
	/* one message (bytes: its size) adopted */
	void (*progress)(void *ctx, uint64_t bytes);
	void *ctx;
};

/* The Dovecot store to adopt from. */
struct dbox_adopt_source {
	const char *root;     /* its root (for notes) */
	int storage_fd;       /* ROOT/storage, the caller's */
	const char *alt;      /* its ALT root, or NULL */
	int alt_fd;           /* ALT/storage, or -1; the caller's */
};

/* One message as Dovecot lists it in one mailbox. */
struct dbox_adopt_msg {
	const char *mailbox;  /* a name given to dbox_adopt_mailbox */
	unsigned long uid;
	const char *guid;     /* Dovecot's GUID (hex) */
	uint64_t size;        /* the plaintext size (size.physical) */
	uint64_t vsize;       /* with CRLF line ends (size.virtual) */
	int64_t received;     /* UNIX seconds */
	unsigned int refcount;
	bool to_new;          /* \Recent and nothing else: into new/ */
	/* The maildir info letters (":2," is added) into buf (32 bytes):
	   asked for only when the message's record is found, as its
	   keywords then get their letters (dbox_adopt_keyword_letter). */
	void (*letters)(void *ctx, char buf[32]);
	void *letters_ctx;
};

struct dbox_adopt_counts {
	unsigned long messages;  /* adopted (inodes) */
	unsigned long links;     /* more names of copies */
	size_t folders;          /* mailboxes given */
	size_t files;            /* m.N files adopted */
	unsigned long failed;    /* items not adopted (noted) */
	unsigned long warnings;
};

struct dbox_adopt;

/* Begin adopting src into the store st (opened read-write by the caller,
   so this process holds STORE/lock, store-lock.h): every record of src's m.N files is read,
   and an index transaction begins.  The adoption holds st->lock from
   here until dbox_adopt_free (the caller must not hold it).  Returns 0 and *adopt_r (free with
   dbox_adopt_free), or a negative errno (-ENOMEM; an unreadable storage
   directory; the index's). */
int dbox_adopt_begin(struct dbox_store *st, const struct dbox_adopt_source *src,
		     const struct dbox_adopt_ops *ops,
		     struct dbox_adopt **adopt_r);

/* The folder of a mailbox (with its UIDVALIDITY, next UID and GUID, as
   Dovecot reports them): made in the index with cur/ new/ tmp/ and its
   dovecot-uidlist (and maildirfolder), or merged into.  A mailbox that
   cannot become a folder is noted (its messages then fail).  Returns 0,
   or a negative errno after a DBOX_ADOPT_FATAL note (the adoption must
   stop: dbox_adopt_free). */
int dbox_adopt_mailbox(struct dbox_adopt *adopt, const char *mailbox,
		       uint32_t uidvalidity, uint32_t uidnext,
		       const char *guid);

/* The letter ('a'..'z') of keyword kw in the folder of mailbox,
   assigning the next free one; 0 when the folder has 26 already (noted
   once) or mailbox is unknown. */
char dbox_adopt_keyword_letter(struct dbox_adopt *adopt, const char *mailbox,
			       const char *kw);

/* One message of a mailbox: the first time its record is seen an inode
   over that record (its m.N linked in, staged), later times another
   name of that inode, and a dovecot-uidlist line.  A message that cannot
   be adopted is noted and counted.  Returns 0, or a negative errno after
   a DBOX_ADOPT_FATAL note. */
int dbox_adopt_message(struct dbox_adopt *adopt,
		       const struct dbox_adopt_msg *msg);

/* Finish: the dovecot-keywords files, a new empty m.N for new mail, the
   adopted m.N in the index, everything synced, one durable commit, then
   the staged links renamed to their m.N names.  Returns 0, or a negative
   errno: before the commit nothing is left (dbox_adopt_free rolls back);
   after it (a rename failed: noted) the store is whole and the next
   dbox_adopt_finish_staged finishes the names. */
int dbox_adopt_commit(struct dbox_adopt *adopt);

/* Was the index transaction committed (durable)? */
bool dbox_adopt_committed(const struct dbox_adopt *adopt);

/* The totals so far. */
const struct dbox_adopt_counts *dbox_adopt_counts(const struct dbox_adopt *adopt);

/* Free everything; an adoption not committed is rolled back with its
   staged links.  *adopt = NULL.  Safe on NULL. */
void dbox_adopt_free(struct dbox_adopt **adopt);

/* What an earlier run left in st's storage directories (and the ALT's):
   staged links the index knows get their m.N name (noted
   DBOX_ADOPT_FINISHED), the others are removed.  Takes st->lock for the
   call (the caller must not hold it). */
void dbox_adopt_finish_staged(struct dbox_store *st,
			      const struct dbox_adopt_ops *ops);

/* Undo a store made by a run that adopted nothing: in directory path,
   the names dbox_store_open and an adoption make (the index and its
   companions, the lock, storage/ with its m.N and staged links, files/),
   nothing else, and path itself when dir_made (it did not exist either)
   and it is empty then. */
void dbox_adopt_remove_store(const char *path, bool dir_made);

#endif
