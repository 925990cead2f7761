/*
 * array.c: room for one more element of a growing array (array.h).
 */
#include "engine/array.h"

#include <errno.h>
#include <stdlib.h>

int dbox_array_room(void **array, size_t n, size_t *size, size_t elem)
{
	size_t want = *size == 0 ? 64 : *size, bytes;
	void *grown;

	if (n < *size)
		return 0;
	if (*size != 0 && __builtin_mul_overflow(want, 2, &want))
		return -ENOMEM;
	if (__builtin_mul_overflow(want, elem, &bytes) ||
	    (grown = realloc(*array, bytes)) == NULL)
		return -ENOMEM;
	*array = grown;
	*size = want;
	return 0;
}
