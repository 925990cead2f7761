#ifndef DBOXFS_CHECK_PRIVATE_H
#define DBOXFS_CHECK_PRIVATE_H

/*
 * check-private: the state of one dbox_check_store() run, shared by
 * check.c (opening, the index side, reporting), check-mfile.c (m.N files
 * scanned record by record), check-records.c (messages of the index
 * against their records) and check-files.c (files/ and lost+found/).
 */

#include "engine/check.h"
#include "engine/view.h"
#include "storage/dbox-format.h"

#include <stdbool.h>
#include <stdint.h>

/* One whole record found in an m.N. */
struct check_rec {
	uint64_t offset, body_size, record_size;
	uint64_t vsize, plain_size;
	bool has_vsize, has_plain_size;
	char guid[DBOX_GUID_HEX_LEN * 2 + 1];
};

/* A region of an m.N that is no whole record, and why. */
struct check_bad {
	uint64_t start, end;
	char *reason;          /* "m.N offset X: ..." (malloc()ed) or NULL */
	bool used;             /* a message of the index has its record here */
};

/* One m.N, as the index and the disk know it. */
struct check_mfile {
	uint32_t id;
	bool known;            /* in the index's mfile table */
	bool exists;           /* a regular file in storage/ or ALT/storage/ */
	bool alt;              /* the index says: in ALT/storage/ */
	bool on_alt;           /* found in ALT/storage/ */
	uint64_t committed;    /* the index's committed end */
	uint64_t size;         /* on disk */
	bool purged;           /* not known: the very file a purge of this
				  index forgot (dbox_store_purged_file) */
	struct check_rec *recs;
	size_t nrecs, recs_size;
	struct check_bad *bads;
	size_t nbads;
	bool vanish_asked;     /* check_mfile_vanished asked the index */
	bool vanished;         /* ... and a purge of the mount removed it */
};

struct check {
	struct dbox_view *view;
	struct dbox_index *index;   /* view->index */
	bool offline;          /* we hold the store lock (shared) */
	bool import_killed;    /* offline, and the index's import mark is
				  set (dbox_check_summary.import_killed) */
	const char *alt_shown; /* the ALT path for names, when the store
				  has one (open or not); else NULL */
	int files_fd;          /* STORE/files/, or -1: files_err */
	int files_err;         /* negative errno of opening it, or 0 */
	dbox_check_report_t *report;
	dbox_check_progress_t *progress;
	void *ctx;
	struct dbox_check_summary *sum;
	struct check_mfile *files;  /* sorted by id once listed */
	size_t nfiles, files_size;
	size_t next_scan;      /* files[] below this are scanned */
	uint64_t *file_inos;   /* plain-file inodes, ascending */
	size_t nfile_inos, file_inos_size;
	int body_fd;           /* m.<body_fd_id> for body reads, or -1 */
	uint32_t body_fd_id;
	uint8_t *body_buf;     /* CHECK_BODY_BUF bytes, or NULL */
};

/* Plaintext decoded per read when verifying a compressed body. */
#define CHECK_BODY_BUF (64 * 1024)

/* Where an item is: the item fields besides severity, kind and text. */
struct check_at {
	uint32_t file_id;
	uint64_t offset, end, ino;
	const char *reason;
};

/* Report a problem or a note of kind at `at` (may be NULL), its text
   printf-style, to the caller of dbox_check_store.  check.c. */
void check_say(struct check *c, enum dbox_check_severity severity,
	       enum dbox_check_kind kind, const struct check_at *at,
	       const char *fmt, ...) __attribute__((format(printf, 5, 6)));
#define check_problem(c, ...) check_say(c, DBOX_CHECK_PROBLEM, __VA_ARGS__)
#define check_note(c, ...) check_say(c, DBOX_CHECK_NOTE, __VA_ARGS__)

/* check-mfile.c: the m.N files of the index (dbox_index_mfile_list) and
   of storage/ and ALT/storage/ into c->files, sorted.  Returns 0 or a
   negative errno. */
int check_mfiles_list(struct check *c);

/* check-mfile.c: scan every file up to and including id (all when id is
   UINT32_MAX), reporting what is wrong with each as a file.  Returns 0
   or a negative errno (or a callback's value). */
int check_mfiles_scan_upto(struct check *c, uint32_t id);

/* check-mfile.c: the m.N of id, or NULL. */
struct check_mfile *check_mfile_get(struct check *c, uint32_t id);

/* check-mfile.c: open m.N of f for reading (storage/ or ALT/storage/).
   Returns the fd or a negative errno. */
int check_mfile_open(const struct check *c, const struct check_mfile *f);

/* check-mfile.c: is f where the index puts it a storage the view could
   not open (ALT's disk not mounted)?  Reachable again, it reads: no
   repair is called for (helper-90: the advice said rebuild). */
bool check_mfile_away(const struct check *c, const struct check_mfile *f);

/* check-mfile.c: how items name m.N of f, "storage/m.N" or
   "ALT/storage/m.N", into buf. */
void check_mfile_shown(const struct check *c, const struct check_mfile *f,
		       char *buf, size_t size);

/* check-mfile.c: on a mounted store (not c->offline) a purge or altmove
   of the mount may remove an m.N after check's index snapshot was taken.
   Is f such a file: the index as it is now no longer knows it?  Asked on
   a new view once per file; false offline or when the index cannot be
   asked. */
bool check_mfile_vanished(struct check *c, struct check_mfile *f);

/* check-mfile.c: free c->files. */
void check_mfiles_free(struct check *c);

/* check-records.c: every committed message of the index against its
   record (dbox_index_check_messages), scanning the m.N files in file
   order on the way.  Returns 0 or a negative errno. */
int check_messages(struct check *c);

/* check-files.c: the plain files of the index against STORE/files/.
   Returns 0 or a negative errno. */
int check_plain_files(struct check *c);

/* check-files.c: notes for the copies in STORE/lost+found/. */
void check_lost_found(struct check *c);

#endif
