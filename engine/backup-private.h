#ifndef DBOXFS_BACKUP_PRIVATE_H
#define DBOXFS_BACKUP_PRIVATE_H

/*
 * backup-private: the state of one backup run, shared by the files of
 * engine/backup*.c (backup.h says what a backup does):
 *   backup.c           the run: DEST.partial, the steps, finishing DEST;
 *   backup-snapshot.c  steps 1-3: the open source files and the snapshot;
 *   backup-copy.c      one file into DEST.partial (kept, linked, copied);
 *   backup-manifest.c  the manifest of what a backup wrote.
 * Not for use outside engine/backup*.c.
 */

#include "engine/backup.h"
#include "index/index-backup.h"

#include <stdio.h>
#include <sys/stat.h>

#define BK_MANIFEST_HEADER "dboxfs-backup 1\n"

/* An open file of the source store: storage/m.<id> or files/<id>. */
struct bk_src {
	uint64_t id;
	int fd;
	bool alt;              /* an m.N found in ALT/storage/ */
};

/* The open files of one kind, sorted by id. */
struct bk_srctab {
	struct bk_src *v;
	size_t n, size;
};

/* What a backup recorded about one file it wrote (one manifest line). */
struct bk_ment {
	char kind;             /* 'm' m.N, 'f' plain file */
	uint64_t id;
	uint64_t len;          /* bytes in the backup */
	uint64_t dev, ino, size;   /* the source, fstat()ed before copying */
	int64_t mtime, ctime;  /* ns */
	int linkable;          /* a later backup may hard-link this copy */
	int64_t copy_mtime;    /* the copy's own mtime (ns) when this entry
				  was written; -1: not known (a manifest
				  from before 2026-12-07) */
};

struct bk_manifest {
	struct bk_ment *v;
	size_t n, size;
};

/* One side of the backup: a store directory and its storage/, files/,
   and (the source only) ALT/storage/; -1 where there is none.  The
   source's storage and alt are the view's (not closed here). */
struct bk_side {
	int dir, storage, files, alt;
};

struct bk {
	const struct dbox_backup_settings *set;
	struct dbox_backup_result *res;
	struct dbox_view *view;
	const char *store;     /* the source's path, for messages */
	char *dest, *partial;  /* DEST (no trailing slash), DEST.partial */
	/* DEST's directory, opened once (backup.c, parent_open): DEST.partial
	   is made, opened and renamed to DEST through it by these names, its
	   files through part.dir (bk_part_path), never by path again. */
	int parent;
	const char *dest_name, *partial_name;
	struct bk_side src, part, prevs;
	struct bk_srctab msrc, fsrc;
	struct bk_manifest old, prevm;   /* the interrupted run's, PREV's */
	FILE *manifest;        /* this run's */
	int64_t start_ns;      /* CLOCK_REALTIME */
	uint32_t last_mfile;   /* the highest m.N of the snapshot */
	char *buf;             /* BK_BUF_SIZE, for copies by read/write */
	/* m.N whose number PREV's manifest has, and of those, the ones
	   whose source it names (same device and inode, whatever their size
	   now): none says PREV is another store's. */
	uint64_t prev_named, prev_kin;
	int failed;            /* writing DEST failed: negative errno */
};

#define BK_BUF_SIZE ((size_t)1 << 20)

/* Room for element n of *v (*size elements of elem bytes allocated),
   doubling when full.  Returns 0 or -ENOMEM (*v unchanged). */
int bk_reserve(void **v, size_t *size, size_t n, size_t elem);

/* ns of a timespec. */
int64_t bk_ts_ns(const struct timespec *ts);

/* A path to name in DEST.partial that reaches it through the open
   part.dir (/proc/self/fd/N/name), for what takes a path (SQLite): the
   directory this run made and checked, whatever DEST.partial names
   now.  malloc()ed (caller frees), or NULL. */
char *bk_part_path(const struct bk *b, const char *name);

/* The test hook of the settings, at point. */
void bk_hook(struct bk *b, const char *point);

/* The name of file id of kind ('m': "m.<id>", 'f': "<id>") into buf. */
void bk_file_name(char *buf, size_t size, char kind, uint64_t id);

/* Report damage of the source to the settings' callback; counted in
   source_errors unless it is DBOX_BACKUP_CHANGED. */
void bk_damage(struct bk *b, int what, char kind, uint64_t id,
	       uint64_t have, uint64_t want);

/* backup-snapshot.c */

/* The open file of id, or NULL. */
struct bk_src *bk_src_find(struct bk_srctab *t, uint64_t id);

/* Close every file of t and free it. */
void bk_src_free(struct bk_srctab *t);

/* Steps 1-3: the index copied to DEST.partial/index.sqlite.partial and
   *snap filled, every file of it open.  Returns 0 or a negative errno
   (logged). */
int bk_take_snapshot(struct bk *b, struct dbox_index_snapshot *snap);

/* backup-manifest.c */

/* Read dir_fd/backup-manifest into *m (sorted).  A missing file is an
   empty manifest; lines that do not parse are skipped (so their files
   are copied again).  Returns 0, -EINVAL when it does not start with the
   header (not ours), or another negative errno. */
int bk_manifest_read(int dir_fd, struct bk_manifest *m);

/* The entry of kind and id, or NULL. */
const struct bk_ment *bk_manifest_find(const struct bk_manifest *m,
				       char kind, uint64_t id);

/* Create this run's manifest in DEST.partial, replacing the interrupted
   run's.  Returns 0 or a negative errno (logged). */
int bk_manifest_create(struct bk *b);

/* Append e to this run's manifest (a write error goes to b->failed). */
void bk_manifest_add(struct bk *b, const struct bk_ment *e);

/* Is st the very file e was copied from, unchanged? */
bool bk_same_source(const struct bk_ment *e, const struct stat *st);

/* backup-copy.c */

/* Back up one file of the snapshot: storage/m.<id> up to committed, or
   files/<id> (committed unused).  Keeps what an interrupted run wrote,
   links from PREV, or copies; records it in the manifest.  Failures to
   write DEST go to b->failed; damage of the source is reported. */
void bk_backup_file(struct bk *b, char kind, uint64_t id, uint64_t committed);

#endif
