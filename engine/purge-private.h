#ifndef DBOXFS_PURGE_PRIVATE_H
#define DBOXFS_PURGE_PRIVATE_H

/*
 * purge-private: the state of one purge or altmove run, shared by
 * engine/purge.c (which files, in what order) and engine/purge-file.c
 * (one file: copy its records, switch the index, remove it).  Not for use
 * outside engine/purge*.c.
 */

#include "engine/purge.h"

#include <pthread.h>

/* Bytes copied per pread/pwrite (struct purge's buf). */
#define COPY_SIZE (1024 * 1024)

/* A pool file taking copies, and where it ended before this file's
   copies (to cut them off again when the switch does not happen). */
struct dest {
	struct dbox_mfile *mf;
	uint64_t start_size;
};

struct purge {
	struct dbox_store *st;
	const struct dbox_purge_settings *set;
	struct dbox_purge_result *res;
	char *buf;                  /* COPY_SIZE */
	struct dest *dests;
	size_t ndests, dests_size;
	/* The file being purged lives in the alternate storage, or this is an
	   altmove: copies go to ALT m.N files of this run (alts, the last one
	   taking more), never to the append pool. */
	bool to_alt;
	bool from_alt; /* the file being purged lives in the alternate storage */
	struct dbox_mfile **alts;
	size_t nalts;
};

static inline void purge_lock(struct purge *p)
{
	dbox_store_mutex_lock(p->st);
}

static inline void purge_unlock(struct purge *p)
{
	dbox_store_mutex_unlock(p->st);
}

/* Is m.<file_id> in the append pool?  Needs st->lock. */
bool purge_in_pool(const struct dbox_store *st, uint32_t file_id);

/* Purge one sealed m.N (or, for an altmove, move its selected records to
   the alternate storage), counting into p->res.  Takes st->lock as
   needed.  Returns 0, -ECANCELED, or a negative errno (logged). */
int purge_file(struct purge *p, uint32_t file_id);

#endif
