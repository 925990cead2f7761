/*
 * fuzz-dbox.c: libFuzzer target for the dbox parser (storage/).
 *
 * The input is the content of one storage/m.N file.  It goes through
 * every path that reads m.N bytes the daemon or dboxadm did not write
 * themselves: the header parsers in memory (dbox-format.h), the walk of
 * a file (dbox_file_walk), the scan of a damaged one (dbox_file_scan),
 * reading each record found (dbox_record_read) and its body's plaintext
 * (dbox-read.h, gzip included), and rewriting its R date in place.
 *
 * Besides what ASan and UBSan catch, it checks two promises: a record
 * that walks is found by the scan at the same offset, and the metadata
 * of a record formats back into a block that parses to the same values
 * (dbox-format.c).  A broken promise aborts.
 *
 * Built and run by `make fuzz` (FUZZ_TIME seconds, default 300) with a
 * seed corpus written by gen-seeds.c; `make check` runs it briefly.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "storage/dbox-file.h"
#include "storage/dbox-format.h"
#include "storage/dbox-read.h"
#include "storage/dbox-scan.h"
#include "storage/log.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Plaintext read per record at most: a gzip bomb must not time out. */
#define PLAIN_MAX (1024 * 1024)
#define MAX_RECORDS 256

static void quiet(enum dbox_log_level level, const char *fmt, va_list args)
{
	(void)level;
	(void)fmt;
	(void)args;
}

struct seen {
	int fd;
	uint64_t offset[MAX_RECORDS];
	size_t n;
};

static void check(int cond)
{
	if (!cond)
		abort();
}

/* The metadata formats back into a block that parses to the same. */
static void roundtrip(const struct dbox_metadata *md)
{
	struct dbox_metadata back;
	size_t len;
	char *buf;
	long n = dbox_metadata_format(md, &buf);

	if (n < 0)
		return;
	check(dbox_metadata_parse(buf, (size_t)n, &back, &len, NULL) == 0);
	check(len == (size_t)n);
	check(strcmp(back.guid, md->guid) == 0);
	/* A date before 1970 too: R is its two's complement both ways. */
	check(back.received == md->received);
	check(back.has_vsize == md->has_vsize && back.vsize == md->vsize);
	check(back.has_plain_size == md->has_plain_size &&
	      back.plain_size == md->plain_size);
	if (md->mailbox != NULL && strpbrk(md->mailbox, "\r\n") == NULL)
		check(back.mailbox != NULL &&
		      strcmp(back.mailbox, md->mailbox) == 0);
	dbox_metadata_clear(&back);
	free(buf);
}

static void read_plain(int fd, uint64_t offset, uint64_t body_size,
		       const struct dbox_metadata *md)
{
	uint64_t plain = md->has_plain_size ? md->plain_size : body_size;
	struct dbox_reader *reader;
	static char buf[65536];
	uint64_t off = 0;

	if (plain > PLAIN_MAX)
		plain = PLAIN_MAX;
	if (dbox_reader_open(fd, offset + DBOX_MSG_HEADER_SIZE, body_size,
			     plain, &reader) < 0)
		return;
	while (off < plain) {
		ssize_t n = dbox_reader_pread(reader, buf, sizeof(buf), off);

		if (n <= 0)
			break;
		off += (uint64_t)n;
	}
	/* And backwards: a read behind the position restarts the stream. */
	if (plain > 10)
		(void)dbox_reader_pread(reader, buf, 10, plain / 3);
	dbox_reader_free(&reader);
}

static int walk_cb(void *ctx, uint64_t offset, uint64_t body_size,
		   const struct dbox_metadata *md, uint64_t record_size)
{
	struct seen *s = ctx;
	struct dbox_metadata again;
	uint64_t bs, rs;

	memset(&again, 0, sizeof(again));
	check(dbox_record_read(s->fd, 1, offset, body_size, &bs, &again,
			       &rs) == 0);
	check(bs == body_size && rs == record_size);
	dbox_metadata_clear(&again);
	roundtrip(md);
	read_plain(s->fd, offset, body_size, md);
	if (s->n < MAX_RECORDS)
		s->offset[s->n++] = offset;
	return 0;
}

static int scan_cb(void *ctx, uint64_t offset, uint64_t body_size,
		   const struct dbox_metadata *md, uint64_t record_size)
{
	struct seen *s = ctx;

	(void)body_size;
	(void)md;
	(void)record_size;
	if (s->n < MAX_RECORDS)
		s->offset[s->n++] = offset;
	return 0;
}

/* Every region the scan cannot read says why, about its own start. */
static int bad_cb(void *ctx, uint64_t start, uint64_t end,
		  const struct dbox_fault *fault)
{
	check(start < end && fault->offset == start &&
	      fault->reason[0] != '\0');
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int fd = -1;
	struct seen walked = { 0 }, scanned = { 0 };
	struct dbox_metadata md;
	struct dbox_fault fault;
	size_t header_len, block_len;
	unsigned int msg_header_size;
	uint64_t body_size, bad;
	time_t created;
	int ret;

	if (fd < 0) {
		dbox_log_set_sink(quiet);
		fd = memfd_create("m.1", MFD_CLOEXEC);
		if (fd < 0)
			abort();
	}
	/* The pieces, in memory. */
	/* Corruption comes with its reason (dbox-fault.h). */
	fault.reason[0] = '\0';
	if (dbox_file_header_parse((const char *)data, size, &header_len,
				   &msg_header_size, &created, &fault) < 0)
		check(fault.reason[0] != '\0');
	fault.reason[0] = '\0';
	if (size >= DBOX_MSG_HEADER_SIZE &&
	    dbox_msg_header_parse(data, &body_size, &fault) < 0)
		check(fault.reason[0] != '\0');
	fault.reason[0] = '\0';
	ret = dbox_metadata_parse((const char *)data, size, &md, &block_len,
				  &fault);
	check(ret != -DBOX_ECORRUPT || fault.reason[0] != '\0');
	if (ret == 0) {
		check(block_len <= size);
		roundtrip(&md);
		dbox_metadata_clear(&md);
	}
	(void)dbox_detect_compression(data, size);
	(void)dbox_vsize_add(data, size, false, NULL);

	/* The file. */
	if (ftruncate(fd, 0) < 0 || (size > 0 &&
				     pwrite(fd, data, size, 0) != (ssize_t)size))
		abort();
	walked.fd = scanned.fd = fd;
	ret = dbox_file_walk(fd, 1, walk_cb, &walked, &bad);
	check(dbox_file_scan(fd, 1, UINT64_MAX, scan_cb, bad_cb, &scanned,
			     NULL) == 0);
	/* What walks, scans: every record of a clean walk is found again. */
	if (ret == 0 && walked.n < MAX_RECORDS) {
		check(scanned.n == walked.n);
		for (size_t i = 0; i < walked.n; i++)
			check(scanned.offset[i] == walked.offset[i]);
	}
	/* In-place R rewrite: must not corrupt what it does not own. */
	for (size_t i = 0; i < walked.n && i < 4; i++)
		(void)dbox_record_set_received(fd, 1, walked.offset[i],
					       0x60000000 + (time_t)i);
	return 0;
}
