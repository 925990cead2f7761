/*
 * fd-cache.c: the bounded m.N descriptor cache (see fd-cache.h).
 *
 * Invariant: slots[0..count) hold distinct file ids with open
 * descriptors; count <= max.  A linear scan finds a file: max is small
 * (at most 1024) next to the cost of the read that follows.
 */
#include "fd-cache.h"

#include "dbox-file.h"
#include "io.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

size_t dbox_fd_cache_default_max(void)
{
	struct rlimit rl;
	rlim_t max = 256;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
		max = rl.rlim_cur == RLIM_INFINITY ? 1024 : rl.rlim_cur / 4;
	return max < 8 ? 8 : max > 1024 ? 1024 : (size_t)max;
}

void dbox_fd_cache_init(struct dbox_fd_cache *cache, size_t max)
{
	cache->slots = NULL;
	cache->count = 0;
	cache->max = max != 0 ? max : dbox_fd_cache_default_max();
	cache->clock = 0;
}

/* Close and drop slot i. */
static void slot_drop(struct dbox_fd_cache *cache, size_t i)
{
	close(cache->slots[i].fd);
	cache->slots[i] = cache->slots[--cache->count];
}

/* Close the least recently used descriptor.  False when none is open. */
static bool evict(struct dbox_fd_cache *cache)
{
	size_t lru = 0;

	if (cache->count == 0)
		return false;
	for (size_t i = 1; i < cache->count; i++)
		if (cache->slots[i].used < cache->slots[lru].used)
			lru = i;
	slot_drop(cache, lru);
	return true;
}

int dbox_fd_cache_get(struct dbox_fd_cache *cache, int dir_fd,
		      uint32_t file_id)
{
	char name[16];
	int fd;

	for (size_t i = 0; i < cache->count; i++) {
		if (cache->slots[i].file_id == file_id) {
			cache->slots[i].used = ++cache->clock;
			return cache->slots[i].fd;
		}
	}
	if (dir_fd < 0)
		return -ENOENT;
	if (cache->slots == NULL &&
	    (cache->slots = calloc(cache->max, sizeof(*cache->slots))) == NULL)
		return -ENOMEM;
	dbox_file_name(name, file_id);
	while ((fd = openat(dir_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
			    O_CLOEXEC)) < 0 &&
	       (errno == EMFILE || errno == ENFILE) && evict(cache))
		;
	if (fd < 0)
		return -errno;
	if ((fd = dbox_fd_regular(fd, NULL)) < 0)
		return fd;
	if (cache->count == cache->max)
		evict(cache);
	cache->slots[cache->count++] = (struct dbox_fd_slot){
		.file_id = file_id, .fd = fd, .used = ++cache->clock,
	};
	return fd;
}

void dbox_fd_cache_forget(struct dbox_fd_cache *cache, uint32_t file_id)
{
	for (size_t i = 0; i < cache->count; i++) {
		if (cache->slots[i].file_id == file_id) {
			slot_drop(cache, i);
			return;
		}
	}
}

void dbox_fd_cache_deinit(struct dbox_fd_cache *cache)
{
	while (cache->count > 0)
		slot_drop(cache, cache->count - 1);
	free(cache->slots);
	cache->slots = NULL;
}
