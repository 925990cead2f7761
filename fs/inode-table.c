/*
 * inode-table.c: open-addressing hash of struct fs_inode (see
 * inode-table.h).  Invariant: the load factor stays <= 1/2, and every
 * entry is reachable from its home slot without crossing an empty slot
 * (kept on removal by shifting later entries back).
 */
#include "inode-table.h"

#include <errno.h>
#include <stdlib.h>

/* An entry per inode the kernel knows: a million after an `ls -l` of a
   million messages.  Up to 72 bytes is an 80-byte malloc chunk (glibc:
   the size and 8 bytes of its own, rounded up to 16; inode-table.h). */
_Static_assert(sizeof(struct fs_inode) <= 72, "struct fs_inode grew");

static size_t home_slot(const struct fs_inode_table *table, uint64_t ino)
{
	return (size_t)((ino * 0x9E3779B97F4A7C15ULL) >> 20) & (table->size - 1);
}

int fs_inode_table_init(struct fs_inode_table *table)
{
	table->size = 1024;
	table->count = 0;
	table->slots = calloc(table->size, sizeof(*table->slots));
	return table->slots == NULL ? -ENOMEM : 0;
}

void fs_inode_table_deinit(struct fs_inode_table *table)
{
	for (size_t i = 0; i < table->size; i++)
		free(table->slots[i]);
	free(table->slots);
	table->slots = NULL;
	table->size = table->count = 0;
}

static size_t find_slot(const struct fs_inode_table *table, uint64_t ino)
{
	size_t i = home_slot(table, ino);

	while (table->slots[i] != NULL && table->slots[i]->ino != ino)
		i = (i + 1) & (table->size - 1);
	return i;
}

struct fs_inode *fs_inode_get(struct fs_inode_table *table, uint64_t ino)
{
	return table->slots[find_slot(table, ino)];
}

static int grow(struct fs_inode_table *table)
{
	struct fs_inode **old = table->slots;
	size_t old_size = table->size;

	table->slots = calloc(old_size * 2, sizeof(*table->slots));
	if (table->slots == NULL) {
		table->slots = old;
		return -ENOMEM;
	}
	table->size = old_size * 2;
	for (size_t i = 0; i < old_size; i++)
		if (old[i] != NULL)
			table->slots[find_slot(table, old[i]->ino)] = old[i];
	free(old);
	return 0;
}

struct fs_inode *fs_inode_add(struct fs_inode_table *table, uint64_t ino)
{
	struct fs_inode *inode;
	size_t i;

	if ((inode = fs_inode_get(table, ino)) != NULL)
		return inode;
	if ((table->count + 1) * 2 > table->size && grow(table) < 0)
		return NULL;
	if ((inode = calloc(1, sizeof(*inode))) == NULL)
		return NULL;
	inode->ino = ino;
	i = find_slot(table, ino);
	table->slots[i] = inode;
	table->count++;
	return inode;
}

bool fs_inode_unused(const struct fs_inode *inode)
{
	return inode->nlookup == 0 && inode->nopen == 0 &&
	       inode->nlisting == 0 && !inode->busy;
}

void fs_inode_remove(struct fs_inode_table *table, uint64_t ino)
{
	size_t mask = table->size - 1;
	size_t i = find_slot(table, ino), j = i;

	if (table->slots[i] == NULL)
		return;
	free(table->slots[i]);
	table->slots[i] = NULL;
	table->count--;
	/* Shift back entries whose probe sequence crossed slot i. */
	for (;;) {
		size_t home;

		j = (j + 1) & mask;
		if (table->slots[j] == NULL)
			break;
		home = home_slot(table, table->slots[j]->ino);
		if (((j - home) & mask) >= ((j - i) & mask)) {
			table->slots[i] = table->slots[j];
			table->slots[j] = NULL;
			i = j;
		}
	}
}
