#ifndef DBOXFS_GROW_H
#define DBOXFS_GROW_H

/*
 * grow: the growable array every list of the index, the engine and
 * dboxadm keeps (rows salvaged from an old index, names of a directory,
 * records of an m.N, m.N files touched by a batch).  One helper, so there
 * is one growth rule.  Here, in the lowest layer, because index/ uses it
 * too.
 */

#include <stddef.h>

/* Room for element n of array (*size elements of elem bytes allocated):
   the array itself while n < *size, else the array reallocated to twice
   the size (64 elements at first) with *size updated.  Returns the array,
   or NULL when out of memory (the old array is then still valid and
   still the caller's to free). */
void *dbox_grow(void *array, size_t n, size_t *size, size_t elem);

#endif
