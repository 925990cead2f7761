/*
 * grow.c: the one growable-array rule (grow.h).
 */
#include "storage/grow.h"

#include <stdlib.h>

void *dbox_grow(void *array, size_t n, size_t *size, size_t elem)
{
	size_t new_size = *size == 0 ? 64 : *size * 2;
	void *p;

	if (n < *size)
		return array;
	if ((p = realloc(array, new_size * elem)) != NULL)
		*size = new_size;
	return p;
}
