#ifndef DBOXFS_ARRAY_H
#define DBOXFS_ARRAY_H

/*
 * array: the one "append to a growing array" helper of the engine (the
 * records a scan of an m.N finds, the m.N of a directory, ...).
 */

#include <stddef.h>

/* Make room for element n of *array (elements of elem bytes, *size of
   them allocated): when n < *size nothing changes, else the array is
   realloc()ed to twice its size (first 64 elements) and *size updated.
   Returns 0, or -ENOMEM (the array and *size are then unchanged; it stays
   the caller's to free). */
int dbox_array_room(void **array, size_t n, size_t *size, size_t elem);

#endif
