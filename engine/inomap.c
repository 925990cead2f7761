/*
 * inomap.c: open-addressing hash map of inode identities (see inomap.h),
 * linear probing, kept at most half full.
 */
#include "engine/inomap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static size_t slot_of(const struct inomap *map, uint64_t key1, uint64_t key2)
{
	uint64_t h = key1 * 0x9e3779b97f4a7c15ULL ^ key2;

	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	return (size_t)h & (map->size - 1);
}

static struct inomap_entry *find(struct inomap *map, uint64_t key1,
				 uint64_t key2)
{
	size_t i = slot_of(map, key1, key2);

	while (map->tab[i].used &&
	       (map->tab[i].key1 != key1 || map->tab[i].key2 != key2))
		i = (i + 1) & (map->size - 1);
	return &map->tab[i];
}

struct inomap_entry *inomap_get(struct inomap *map, uint64_t key1,
				uint64_t key2)
{
	struct inomap_entry *e;

	if (map->size == 0)
		return NULL;
	e = find(map, key1, key2);
	return e->used ? e : NULL;
}

static int grow(struct inomap *map)
{
	struct inomap old = *map;

	map->size = old.size == 0 ? 64 : old.size * 2;
	map->tab = calloc(map->size, sizeof(*map->tab));
	if (map->tab == NULL) {
		*map = old;
		return -ENOMEM;
	}
	for (size_t i = 0; i < old.size; i++)
		if (old.tab[i].used)
			*find(map, old.tab[i].key1, old.tab[i].key2) = old.tab[i];
	free(old.tab);
	return 0;
}

int inomap_put(struct inomap *map, uint64_t key1, uint64_t key2,
	       uint64_t value, const char *path)
{
	struct inomap_entry *e;
	char *copy = NULL;

	if ((map->count + 1) * 2 > map->size && grow(map) < 0)
		return -ENOMEM;
	if (path != NULL && (copy = strdup(path)) == NULL)
		return -ENOMEM;
	e = find(map, key1, key2);
	if (e->used)
		free(e->path);
	else
		map->count++;
	e->used = 1;
	e->key1 = key1;
	e->key2 = key2;
	e->value = value;
	e->path = copy;
	return 0;
}

void inomap_free(struct inomap *map)
{
	for (size_t i = 0; i < map->size; i++)
		free(map->tab[i].path);
	free(map->tab);
	memset(map, 0, sizeof(*map));
}
