#ifndef DBOXFS_FD_CACHE_H
#define DBOXFS_FD_CACHE_H

/*
 * fd-cache: a bounded cache of read-only descriptors of storage/m.N
 * files, shared by the mount (engine/store.c) and dboxadm export
 * (engine/export.c).  A store may hold thousands of m.N; one descriptor
 * each would run the process out of descriptors (EMFILE), so at most
 * `max` stay open and the least recently used one is closed to make room.
 *
 * A descriptor returned by dbox_fd_cache_get stays the cache's and valid
 * only until the next call on the cache: whoever needs it longer (a
 * reader, a sync outside the lock) dup()s it first.  Not thread-safe: the
 * owner serialises calls (the store lock).
 */

#include <stddef.h>
#include <stdint.h>

struct dbox_fd_slot {
	uint32_t file_id;
	int fd;
	uint64_t used;       /* the cache's clock at the last get */
};

struct dbox_fd_cache {
	struct dbox_fd_slot *slots;
	size_t count, max;
	uint64_t clock;
};

/* The default bound: a quarter of the soft RLIMIT_NOFILE, from 8 to
   1024 descriptors. */
size_t dbox_fd_cache_default_max(void);

/* Start an empty cache holding at most max descriptors (0:
   dbox_fd_cache_default_max()). */
void dbox_fd_cache_init(struct dbox_fd_cache *cache, size_t max);

/* The O_RDONLY descriptor of m.<file_id> (O_NOFOLLOW), opened in dir_fd
   (the storage/ that holds it: the store's own or the alternate one; not
   owned) when not cached.  File numbers are unique across both, so the
   cache is keyed by number alone.  Out of descriptors (EMFILE, ENFILE),
   it closes cached ones and tries again.  Returns the fd (owned by the
   cache, see above), -ENOMEM, -ENOENT when dir_fd is -1, or -errno of
   openat. */
int dbox_fd_cache_get(struct dbox_fd_cache *cache, int dir_fd,
		      uint32_t file_id);

/* Close the descriptor of m.<file_id>, if cached (the file was removed). */
void dbox_fd_cache_forget(struct dbox_fd_cache *cache, uint32_t file_id);

/* Close every descriptor and free the cache; safe twice. */
void dbox_fd_cache_deinit(struct dbox_fd_cache *cache);

#endif
