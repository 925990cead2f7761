#ifndef DBOXFS_MFILE_READ_H
#define DBOXFS_MFILE_READ_H

/*
 * mfile-read: the m.N files of a store as a reader sees them, for the
 * dboxadm verbs that only read (stats, export, dump, cat; check and
 * backup may use them too): the walk over every m.N of storage/ and of
 * the alternate storage, the read descriptor of one m.N, a plaintext
 * reader on one record after checking it whole, and one m.N (or any dbox
 * file) opened with the committed end the index records.
 *
 * Nothing here writes or takes the store lock; opens inside the store
 * never follow a symbolic link (O_NOFOLLOW: -ELOOP).  Errors are negative
 * errno values; corruption is -EIO, logged naming the file and offset
 * (storage/dbox-file.h).
 */

#include "engine/view.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

struct dbox_fd_cache;
struct dbox_reader;

/* One entry named m.N of a storage/ directory. */
struct dbox_mfile_ent {
	uint32_t file_id;    /* N */
	const char *name;    /* "m.N", in dir_fd; valid during the callback */
	int dir_fd;          /* the storage/ holding it (not the caller's) */
	bool alt;            /* in the alternate storage */
	struct stat st;      /* fstatat without following: a symbolic link
				or special file is handed over as such
				(dboxfs never follows or reads one) */
};

/* Called per m.N; return 0 to go on, anything else stops the walk and is
   returned. */
typedef int dbox_mfile_walk_cb_t(void *ctx, const struct dbox_mfile_ent *ent);

/* Every entry of storage/ directory dir_fd whose name is an m.N
   (dbox_mfile_parse_name), in directory order; entries removed since the
   listing (a purge) are passed over.  alt is copied into each entry.
   dir_fd stays the caller's.  Returns 0, the callback's non-zero value,
   or a negative errno (-ENOMEM, or opening the listing failed). */
int dbox_mfile_walk_dir(int dir_fd, bool alt, dbox_mfile_walk_cb_t *cb,
			void *ctx);

/* dbox_mfile_walk_dir over the view's storage/, then over its alternate
   storage (when open; view->alt_err says why not).  A store without
   storage/ (view->storage_err -ENOENT) has no m.N; another error of
   opening it is returned.  Returns as dbox_mfile_walk_dir. */
int dbox_view_mfile_walk(struct dbox_view *view, dbox_mfile_walk_cb_t *cb,
			 void *ctx);

/* The read descriptor of m.<file_id> of the view from cache (a
   storage/fd-cache.h the caller owns): in the alternate storage when
   the index says so, else in storage/.  The fd is the cache's, valid
   until the next call on it; *alt_r (may be NULL) tells which of the
   two, for messages.  Returns the fd or a negative errno (-ENOENT: not
   there, -ELOOP: a symbolic link, -EMFILE; an ALT that could not be
   opened: its view->alt_err). */
int dbox_view_mfile_fd(struct dbox_view *view, struct dbox_fd_cache *cache,
		       uint32_t file_id, bool *alt_r);

/* Check the whole record at byte offset of fd (m.<file_id>, named in log
   lines): message header, body size (expected_body_size, or UINT64_MAX:
   any), metadata block; then open a plaintext reader on its body
   (storage/dbox-read.h).  plain_size is the plaintext size to read, or
   UINT64_MAX for the record's own (its Z, or the body size when there is
   none), given back in *plain_size_r (may be NULL).  The reader reads fd,
   which must stay open while it lives (not owned).  Returns 0 and
   *reader_r (free with dbox_reader_free), -EIO when there is no whole
   record at offset (logged), -ENOMEM, or the read error. */
int dbox_record_open_reader(int fd, uint32_t file_id, uint64_t offset,
			    uint64_t expected_body_size, uint64_t plain_size,
			    struct dbox_reader **reader_r,
			    uint64_t *plain_size_r);

/* "m.N" or "N" (decimal, 1 to UINT32_MAX) as a file number: true and
   *file_id_r, or false. */
bool dbox_mfile_arg_id(const char *arg, uint32_t *file_id_r);

/* A dbox file opened for reading by dump and cat. */
struct dbox_mfile_ref {
	int fd;                 /* O_RDONLY, the caller's to close */
	uint64_t size;          /* bytes on disk when opened */
	uint64_t committed_end; /* where the index says the committed records
				   of this m.N end, or UINT64_MAX: unknown
				   (no index there, or not the store's m.N) */
};

/* Open m.<file_id> of the store at store: STORE/storage/m.N, else the
   one in the alternate storage the index records; never through a
   symbolic link; committed_end from the store's index.  Works on a
   directory without an index too (a Dovecot mdbox root: committed_end
   is then unknown).  path_r (may be NULL): the path of the file opened,
   STORE/storage/m.N or ALT/storage/m.N (malloc()ed, the caller frees;
   NULL on failure).  Returns 0 and *ref_r, or a negative errno: -ENOENT
   (neither), -ELOOP, -EINVAL (not a regular file), -ENOMEM. */
int dbox_mfile_open_id(const char *store, uint32_t file_id,
		       struct dbox_mfile_ref *ref_r, char **path_r);

/* Open the dbox file at path (as given: whoever runs the verb named it).
   When file_id is not 0 and the file is m.<file_id> of the store at
   store (the same inode), committed_end is what its index records.
   Returns 0 and *ref_r, or a negative errno (open's, -EINVAL: not a
   regular file). */
int dbox_mfile_open_path(const char *store, const char *path,
			 uint32_t file_id, struct dbox_mfile_ref *ref_r);

#endif
