/*
 * import-dovecot-files.c: the Dovecot m.N files of an adoption
 * (import-dovecot.h): the records they hold, found by GUID; their hard
 * links into the store, staged under a name recovery and purge leave
 * alone until the index commit, then renamed; the undo of a store that
 * adopted nothing.
 */
#include "engine/import-dovecot-private.h"
#include "engine/store-dirs.h"
#include "storage/grow.h"
#include "storage/dbox-file.h"

#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The name an adopted m.N has until the index commit. */
#define STAGE_PREFIX ".import-"

/* --- records ------------------------------------------------------------ */

struct walk_ctx {
	struct dbox_adopt *adopt;
	uint32_t dfile;
	bool alt;
};

static int walk_cb(void *ctx, uint64_t offset, uint64_t body_size,
		   const struct dbox_metadata *md, uint64_t record_size)
{
	struct walk_ctx *w = ctx;
	struct dbox_adopt *adopt = w->adopt;
	struct adopt_rec *recs, *r;

	recs = dbox_grow(adopt->recs, adopt->nrecs, &adopt->recs_size,
			 sizeof(*recs));
	if (recs == NULL)
		return -ENOMEM;
	adopt->recs = recs;
	r = &recs[adopt->nrecs++];
	memset(r, 0, sizeof(*r));
	snprintf(r->guid, sizeof(r->guid), "%s", md->guid);
	r->dfile = w->dfile;
	r->alt = w->alt;
	r->offset = offset;
	r->body_size = body_size;
	r->record_size = record_size;
	r->plain_size = md->has_plain_size ? md->plain_size : body_size;
	r->external = md->extra != NULL &&
		(md->extra[0] == 'X' || strstr(md->extra, "\nX") != NULL);
	return 0;
}

static int rec_cmp(const void *a, const void *b)
{
	const struct adopt_rec *x = a, *y = b;
	int c = strcmp(x->guid, y->guid);

	if (c != 0)
		return c;
	if (x->dfile != y->dfile)
		return x->dfile < y->dfile ? -1 : 1;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* The records of one Dovecot m.N (open as fd) into adopt->recs. */
static int walk_file(struct dbox_adopt *adopt, int fd, uint32_t dfile,
		     bool alt)
{
	struct walk_ctx w = { .adopt = adopt, .dfile = dfile, .alt = alt };
	uint64_t bad = 0;
	int ret = dbox_file_walk(fd, dfile, walk_cb, &w, &bad);

	if (ret == -ENOMEM)
		return ret;
	if (ret != 0) {
		adopt_note(adopt, (struct dbox_adopt_note){
			.kind = DBOX_ADOPT_CORRUPT, .file = dfile,
			.root = alt ? adopt->src.alt : adopt->src.root,
			.offset = bad });
		adopt->counts.warnings++;
	}
	return 0;
}

/* Every record of ROOT/storage/m.* (or of Dovecot's ALT/storage/m.*),
   added to adopt->recs, which is then sorted by GUID. */
/* The store's m.N that is the very file sb (a hard link an earlier run
   made), in storage/ or the alternate storage: its number, or 0. */
static uint32_t store_has_file(struct dbox_adopt *adopt, const struct stat *sb,
			       bool *alt_r)
{
	for (int a = 0; a < 2; a++) {
		int dfd = a ? adopt->st->alt_fd : adopt->st->storage_fd;
		int own = dfd >= 0 ? openat(dfd, ".", O_RDONLY | O_DIRECTORY |
					    O_CLOEXEC) : -1;
		DIR *dir = own >= 0 ? fdopendir(own) : NULL;
		struct dirent *de;
		struct stat our;
		uint32_t id, found = 0;

		if (dir == NULL) {
			if (own >= 0)
				close(own);
			continue;
		}
		while (found == 0 && (de = readdir(dir)) != NULL)
			if (dbox_mfile_parse_name(de->d_name, &id) &&
			    fstatat(dfd, de->d_name, &our,
				    AT_SYMLINK_NOFOLLOW) == 0 &&
			    our.st_dev == sb->st_dev && our.st_ino == sb->st_ino)
				found = id;
		closedir(dir);
		if (found != 0) {
			*alt_r = a;
			return found;
		}
	}
	return 0;
}

int adopt_walk_storage(struct dbox_adopt *adopt, bool alt)
{
	int dfd = alt ? adopt->src.alt_fd : adopt->src.storage_fd;
	int own = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *dir = own >= 0 ? fdopendir(own) : NULL;
	struct dirent *de;
	uint32_t dfile;
	int ret = 0, fd;

	if (dir == NULL) {
		ret = -errno;
		if (own >= 0)
			close(own);
		return ret;
	}
	while (ret == 0 && (de = readdir(dir)) != NULL) {
		if (!dbox_mfile_parse_name(de->d_name, &dfile))
			continue;
		fd = openat(dfd, de->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
			    O_CLOEXEC);
		if (fd < 0) {
			adopt_note(adopt, (struct dbox_adopt_note){
				.kind = DBOX_ADOPT_MFILE_UNREADABLE,
				.root = alt ? adopt->src.alt : adopt->src.root,
				.file = dfile, .err = errno });
			adopt->counts.failed++;
			continue;
		}
		{
			struct stat sb;
			bool ours_alt = false;
			uint32_t ours = fstat(fd, &sb) == 0 ?
				store_has_file(adopt, &sb, &ours_alt) : 0;

			if (ours != 0) {
				/* Adopted by an earlier run: a second one
				   would link every file again and fail every
				   message as existing. */
				adopt_note(adopt, (struct dbox_adopt_note){
					.kind = DBOX_ADOPT_ADOPTED_ALREADY,
					.root = alt ? adopt->src.alt :
						adopt->src.root,
					.file = dfile, .count = ours,
					.where = dbox_store_dir_name(adopt->st,
								     ours_alt) });
				close(fd);
				ret = -EEXIST;
				break;
			}
		}
		ret = walk_file(adopt, fd, dfile, alt);
		close(fd);
	}
	closedir(dir);
	if (ret == 0 && adopt->nrecs > 1)
		qsort(adopt->recs, adopt->nrecs, sizeof(*adopt->recs), rec_cmp);
	return ret;
}

/* The record of guid whose plaintext size is size: the first of equal
   ones (Dovecot's rebuild treats same GUID + size as duplicates). */
struct adopt_rec *adopt_find_rec(struct dbox_adopt *adopt, const char *guid,
				 uint64_t size)
{
	size_t lo = 0, hi = adopt->nrecs;
	char key[sizeof(adopt->recs[0].guid)];

	/* A record keeps the first 64 characters of a longer GUID (a
	   maildir base name Dovecot took as GUID): doveadm's is cut alike,
	   or such a message was never found. */
	snprintf(key, sizeof(key), "%s", guid);
	guid = key;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (strcmp(adopt->recs[mid].guid, guid) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < adopt->nrecs && strcmp(adopt->recs[lo].guid, guid) == 0; lo++)
		if (adopt->recs[lo].plain_size == size)
			return &adopt->recs[lo];
	return NULL;
}

/* --- staged links ------------------------------------------------------- */

static void stage_name(char buf[32], uint32_t file_id)
{
	snprintf(buf, 32, STAGE_PREFIX "m.%u", file_id);
}

/* The store's directory of an adopted file: storage/ or ALT/storage/. */
static int our_dir(const struct dbox_adopt *adopt, bool alt)
{
	return alt ? adopt->st->alt_fd : adopt->st->storage_fd;
}

/* Link Dovecot's m.<dfile> (src, in dfd) into the store's directory as
   the staged name of a new m.N number.  Returns 0 and *a filled, or a
   negative errno (noted). */
static int link_in(struct dbox_adopt *adopt, bool alt, uint32_t dfile,
		   struct adopt_file *a)
{
	int dfd = alt ? adopt->src.alt_fd : adopt->src.storage_fd;
	int our = our_dir(adopt, alt), err;
	struct dbox_adopt_note n = {
		.root = alt ? adopt->src.alt : adopt->src.root, .file = dfile,
		.where = dbox_store_dir_name(adopt->st, alt),
	};
	char src[32], dst[32];
	struct stat sb;

	dbox_file_name(src, dfile);
	if (fstatat(dfd, src, &sb, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	/* A link is a second name of the same bytes: the file's owner
	   keeps theirs, and can rewrite what the store serves. */
	if (sb.st_uid != geteuid()) {
		struct dbox_adopt_note w = n;

		w.kind = DBOX_ADOPT_NOT_OURS;
		w.owner = (unsigned)sb.st_uid;
		adopt_note(adopt, w);
	}
	a->dfile = dfile;
	a->alt = alt;
	if ((err = dbox_store_file_id_take(adopt->st, &a->file_id)) < 0)
		return err;
	a->size = (uint64_t)sb.st_size;
	stage_name(dst, a->file_id);
	unlinkat(our, dst, 0);
	if (linkat(dfd, src, our, dst, 0) < 0) {
		n.kind = DBOX_ADOPT_LINK_FAILED;
	} else if (faccessat(our, dst, R_OK | W_OK, 0) < 0) {
		/* Recovery opens every m.N read-write. */
		n.kind = DBOX_ADOPT_NOT_WRITABLE;
	} else {
		return 0;
	}
	n.err = err = errno;
	unlinkat(our, dst, 0);
	adopt_note(adopt, n);
	return -err;
}

/* Our file id for Dovecot's m.<dfile> (in its ALT when alt), linking it
   in (staged) the first time.  Returns 0 or a negative errno (noted). */
int adopt_link_file(struct dbox_adopt *adopt, bool alt, uint32_t dfile,
		    uint32_t *file_id_r)
{
	struct adopt_file *files;
	int ret;

	if (our_dir(adopt, alt) < 0) {
		adopt_note(adopt, (struct dbox_adopt_note){
			.kind = DBOX_ADOPT_NO_ALT, .root = adopt->src.alt,
			.file = dfile });
		return -ENOENT;
	}
	for (size_t i = 0; i < adopt->nfiles; i++) {
		if (adopt->files[i].dfile == dfile && adopt->files[i].alt == alt) {
			*file_id_r = adopt->files[i].file_id;
			return 0;
		}
	}
	files = dbox_grow(adopt->files, adopt->nfiles, &adopt->files_size,
			  sizeof(*files));
	if (files == NULL)
		return -ENOMEM;
	adopt->files = files;
	if ((ret = link_in(adopt, alt, dfile, &files[adopt->nfiles])) < 0)
		return ret;
	*file_id_r = files[adopt->nfiles++].file_id;
	adopt->counts.files = adopt->nfiles;
	return 0;
}

/* Leftovers of an earlier run in dfd: staged links the index knows (the
   run died after its commit) get their final name; others (it died
   before) go. */
static void finish_staged_in(struct dbox_store *st, bool alt,
			     const struct dbox_adopt_ops *ops)
{
	int dfd = alt ? st->alt_fd : st->storage_fd;
	int own = dfd >= 0 ? openat(dfd, ".", O_RDONLY | O_DIRECTORY |
				    O_CLOEXEC) : -1;
	DIR *dir = own >= 0 ? fdopendir(own) : NULL;
	struct dirent *de;
	uint32_t id;
	uint64_t size;
	char final[32];

	if (dir == NULL) {
		if (own >= 0)
			close(own);
		return;
	}
	while ((de = readdir(dir)) != NULL) {
		if (strncmp(de->d_name, STAGE_PREFIX, strlen(STAGE_PREFIX)) != 0 ||
		    !dbox_mfile_parse_name(de->d_name + strlen(STAGE_PREFIX),
					   &id))
			continue;
		dbox_file_name(final, id);
		if (dbox_index_mfile_get(st->index, id, &size) != 0 ||
		    faccessat(dfd, final, F_OK, 0) == 0 || errno != ENOENT) {
			unlinkat(dfd, de->d_name, 0);
		} else if (renameat(dfd, de->d_name, dfd, final) == 0 &&
			   ops != NULL && ops->note != NULL) {
			ops->note(ops->ctx, &(struct dbox_adopt_note){
				.kind = DBOX_ADOPT_FINISHED, .file = id,
				.where = dbox_store_dir_name(st, alt) });
		}
	}
	closedir(dir);
}

void dbox_adopt_finish_staged(struct dbox_store *st,
			      const struct dbox_adopt_ops *ops)
{
	dbox_store_mutex_lock(st);
	finish_staged_in(st, false, ops);
	finish_staged_in(st, true, ops);
	dbox_store_mutex_unlock(st);
}

/* A new, empty m.N: the file the store appends to from now on, so the
   adopted files (shared with the Dovecot root) are never written. */
int adopt_fresh_mfile(struct dbox_adopt *adopt)
{
	struct dbox_store *st = adopt->st;
	uint32_t id;
	uint64_t size;
	int fd = dbox_store_file_id_take(st, &id);

	if (fd < 0 || (fd = dbox_file_create(st->storage_fd, id, &size)) < 0)
		return fd;
	close(fd);
	return dbox_index_mfile_set(adopt->index, id, size);
}

/* Everything the commit refers to is on disk first. */
int adopt_sync(struct dbox_adopt *adopt)
{
	struct dbox_store *st = adopt->st;
	char name[32];
	int fd, err;

	for (size_t i = 0; i < adopt->nfiles; i++) {
		stage_name(name, adopt->files[i].file_id);
		fd = openat(our_dir(adopt, adopt->files[i].alt), name,
			    O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
		if (fd < 0 || fdatasync(fd) < 0) {
			err = errno;
			if (fd >= 0)
				close(fd);
			return -err;
		}
		close(fd);
	}
	if (syncfs(st->files_fd) < 0 || fsync(st->storage_fd) < 0 ||
	    (st->alt_fd >= 0 && fsync(st->alt_fd) < 0))
		return -errno;
	return 0;
}

void adopt_drop_staged(struct dbox_adopt *adopt)
{
	char name[32];

	for (size_t i = 0; i < adopt->nfiles; i++) {
		stage_name(name, adopt->files[i].file_id);
		unlinkat(our_dir(adopt, adopt->files[i].alt), name, 0);
	}
}

/* After the commit: every staged link gets its m.N name.  Returns 0 or
   the errno of the first failure (each noted). */
int adopt_finish_renames(struct dbox_adopt *adopt)
{
	struct dbox_store *st = adopt->st;
	char from[32], to[32];
	int ret = 0;

	for (size_t i = 0; i < adopt->nfiles; i++) {
		int dfd = our_dir(adopt, adopt->files[i].alt);

		stage_name(from, adopt->files[i].file_id);
		dbox_file_name(to, adopt->files[i].file_id);
		if (renameat(dfd, from, dfd, to) == 0)
			continue;
		ret = -errno;
		adopt_note(adopt, (struct dbox_adopt_note){
			.kind = DBOX_ADOPT_RENAME_FAILED,
			.where = dbox_store_dir_name(st, adopt->files[i].alt),
			.name = from, .file = adopt->files[i].file_id,
			.err = errno });
	}
	if ((fsync(st->storage_fd) < 0 ||
	     (st->alt_fd >= 0 && fsync(st->alt_fd) < 0)) && ret == 0)
		ret = -errno;
	return ret;
}

/* --- undoing a new store ------------------------------------------------ */

/* Unlink the staged links (STAGE_PREFIX m.N) of a run in storage/ (sfd,
   closed here). */
static void remove_staged(int sfd)
{
	DIR *dir = fdopendir(sfd);
	struct dirent *de;
	uint32_t id;

	if (dir == NULL) {
		close(sfd);
		return;
	}
	while ((de = readdir(dir)) != NULL) {
		const char *n = de->d_name;

		if (strncmp(n, STAGE_PREFIX, strlen(STAGE_PREFIX)) == 0 &&
		    dbox_mfile_parse_name(n + strlen(STAGE_PREFIX), &id))
			unlinkat(sfd, n, 0);
	}
	closedir(dir);
}

void dbox_adopt_remove_store(const char *path, bool dir_made)
{
	int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int sfd = -1;

	if (dfd >= 0)
		sfd = openat(dfd, DBOX_STORE_STORAGE, O_RDONLY | O_DIRECTORY |
			     O_NOFOLLOW | O_CLOEXEC);
	if (sfd >= 0)
		remove_staged(sfd);
	if (dfd >= 0)
		close(dfd);
	/* The rest, and the plain files the run adopted (the mdbox's own
	   non-mail files), are what any new store holds. */
	dbox_store_remove_new(path, dir_made);
}
