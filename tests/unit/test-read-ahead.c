/*
 * test-read-ahead: index/read-ahead.c against a file in memory whose
 * reads are counted: the bytes are the file's, neighbouring reads share
 * one read of the file, scattered ones go to it one by one, and what a
 * forget dropped is read again (a change is seen).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "index/read-ahead.h"

#include <string.h>

#define PAGE 1024
#define PAGES 256

/* A database file of PAGES pages in memory; xRead as the unix VFS's:
   a read past the end is short, the rest zeroed. */
struct memfile {
	sqlite3_file base;
	unsigned char data[PAGES * PAGE];
	int reads;
};

static int mem_read(sqlite3_file *f, void *buf, int amt, sqlite3_int64 off)
{
	struct memfile *m = (struct memfile *)f;
	sqlite3_int64 have = off < (sqlite3_int64)sizeof(m->data) ?
		(sqlite3_int64)sizeof(m->data) - off : 0;

	m->reads++;
	if (have >= amt) {
		memcpy(buf, m->data + off, (size_t)amt);
		return SQLITE_OK;
	}
	memcpy(buf, m->data + off, (size_t)have);
	memset((char *)buf + have, 0, (size_t)(amt - have));
	return SQLITE_IOERR_SHORT_READ;
}

static const sqlite3_io_methods mem_methods = { .iVersion = 1,
						.xRead = mem_read };

static void mem_init(struct memfile *m)
{
	memset(m, 0, sizeof(*m));
	m->base.pMethods = &mem_methods;
	for (size_t i = 0; i < sizeof(m->data); i++)
		m->data[i] = (unsigned char)(i * 7 + i / PAGE);
}

/* Page n through ra, compared with the file's bytes. */
static void read_page(struct read_ahead *ra, struct memfile *m, int n)
{
	unsigned char buf[PAGE];

	assert_int_equal(read_ahead_read(ra, &m->base, buf, PAGE,
					 (sqlite3_int64)n * PAGE), SQLITE_OK);
	assert_memory_equal(buf, m->data + n * PAGE, PAGE);
}

/* A walk through neighbouring pages (every other page, as a B-tree's
   leaves between another tree's) reads the file once per
   READ_AHEAD_BYTES, after the first single read. */
static void test_neighbours_share_reads(void **state)
{
	static struct memfile m;
	struct read_ahead ra;
	const int per_chunk = READ_AHEAD_BYTES / PAGE;

	(void)state;
	mem_init(&m);
	read_ahead_init(&ra);
	for (int n = 0; n < 64; n += 2)
		read_page(&ra, &m, n);
	/* The first read alone, then one chunk per per_chunk pages. */
	assert_int_equal(m.reads, 1 + (64 - 2 + per_chunk - 1) / per_chunk);
	read_ahead_free(&ra);
}

/* Scattered reads go to the file one by one, with nothing kept. */
static void test_scattered_reads_pass_through(void **state)
{
	static struct memfile m;
	struct read_ahead ra;
	const int pages[] = { 200, 3, 150, 40, 90, 10 };

	(void)state;
	mem_init(&m);
	read_ahead_init(&ra);
	for (size_t i = 0; i < sizeof(pages) / sizeof(pages[0]); i++)
		read_page(&ra, &m, pages[i]);
	assert_int_equal(m.reads, 6);
	read_ahead_free(&ra);
}

/* After a forget the file's new bytes are read, not the kept ones; a
   chunk that runs past the end is not kept, and the read is as asked. */
static void test_forget_and_end(void **state)
{
	static struct memfile m;
	struct read_ahead ra;
	unsigned char buf[PAGE];

	(void)state;
	mem_init(&m);
	read_ahead_init(&ra);
	read_page(&ra, &m, 10);
	read_page(&ra, &m, 11); /* fills a chunk from page 11 */
	memset(m.data + 12 * PAGE, 0xee, PAGE);
	read_ahead_forget(&ra);
	read_page(&ra, &m, 12);
	/* Near the end: the chunk would be short; each read goes through. */
	read_page(&ra, &m, PAGES - 3);
	m.reads = 0;
	read_page(&ra, &m, PAGES - 2);
	read_page(&ra, &m, PAGES - 1);
	assert_int_equal(m.reads, 4); /* two failed chunks, two pages */
	assert_int_equal(read_ahead_read(&ra, &m.base, buf, PAGE,
					 (sqlite3_int64)PAGES * PAGE),
			 SQLITE_IOERR_SHORT_READ);
	read_ahead_free(&ra);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_neighbours_share_reads),
		cmocka_unit_test(test_scattered_reads_pass_through),
		cmocka_unit_test(test_forget_and_end),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
