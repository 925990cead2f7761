/*
 * sqlcount.so: counts the SQL statements a process runs, for the counts
 * benchmark (b_counts.py).  LD_PRELOAD it with SQLCOUNT_FILE=PATH: PATH
 * (created) holds two native-endian uint64 counters, updated in place
 * through a shared mapping so the benchmark can read them at any moment:
 *   [0] statements started (sqlite3_step() on a statement not yet running)
 *   [1] of them COMMITs (transactions written)
 * Only calls into libsqlite3 from outside it are seen (dboxfs's prepared
 * statements and sqlite3_exec(); not the statements SQLite runs itself).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

static uint64_t *counters;
static int (*real_step)(sqlite3_stmt *);

__attribute__((constructor)) static void sqlcount_init(void)
{
	const char *path = getenv("SQLCOUNT_FILE");
	int fd;

	real_step = (int (*)(sqlite3_stmt *))dlsym(RTLD_NEXT, "sqlite3_step");
	if (path == NULL || (fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600)) < 0)
		return;
	if (ftruncate(fd, 2 * sizeof(uint64_t)) == 0) {
		void *p = mmap(NULL, 2 * sizeof(uint64_t), PROT_READ | PROT_WRITE,
			       MAP_SHARED, fd, 0);

		if (p != MAP_FAILED)
			counters = p;
	}
	close(fd);
}

int sqlite3_step(sqlite3_stmt *stmt)
{
	if (counters != NULL && !sqlite3_stmt_busy(stmt)) {
		const char *sql = sqlite3_sql(stmt);

		__atomic_add_fetch(&counters[0], 1, __ATOMIC_RELAXED);
		if (sql != NULL && strncasecmp(sql, "COMMIT", 6) == 0)
			__atomic_add_fetch(&counters[1], 1, __ATOMIC_RELAXED);
	}
	return real_step(stmt);
}
