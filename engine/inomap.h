#ifndef DBOXADM_INOMAP_H
#define DBOXADM_INOMAP_H

/*
 * inomap: a hash map from an inode identity (two 64-bit keys: st_dev and
 * st_ino of a source file, or 0 and an index inode number) to what it
 * became (an index inode number, or an exported path).  Used to turn hard
 * links into hard links on import and export.  Only files with a link
 * count above 1 go in, so it stays small.
 */

#include <stddef.h>
#include <stdint.h>

struct inomap_entry {
	uint64_t key1, key2;
	uint64_t value;   /* e.g. the index inode number */
	char *path;       /* owned, or NULL */
	int used;
};

struct inomap {
	struct inomap_entry *tab;
	size_t size;      /* slots, a power of two (0 before the first put) */
	size_t count;
};

/* The entry for (key1, key2), or NULL.  Valid until the next put. */
struct inomap_entry *inomap_get(struct inomap *map, uint64_t key1,
				uint64_t key2);

/* Add (key1, key2) -> value, path (path copied when not NULL); replaces
   an existing entry.  Returns 0 or -ENOMEM. */
int inomap_put(struct inomap *map, uint64_t key1, uint64_t key2,
	       uint64_t value, const char *path);

/* Free everything the map holds; it is empty and reusable after. */
void inomap_free(struct inomap *map);

#endif
