/*
 * test-fault.c: unit tests of corruption reported as data
 * (storage/dbox-fault.h) by the parse side of storage/ with cmocka: the
 * parsers (dbox-format.h) and the record reader (dbox-record.h) return
 * -DBOX_ECORRUPT with the reason and where it is in a struct dbox_fault,
 * log nothing, and leave a NULL fault alone.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "storage/dbox-fault.h"
#include "storage/dbox-file.h"
#include "storage/dbox-format.h"
#include "storage/dbox-record.h"
#include "storage/log.h"
#include "test-common.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_msg_header_fault(void **state)
{
	static const struct {
		const char *header;
		uint64_t offset;
		const char *reason;
	} bad[] = {
		{ "\x01\x03N          0000000000000F23\n", 0, "bad magic" },
		{ "\x01\x02X          0000000000000F23\n", 2, "type" },
		{ "\x01\x02N          0000000000000F2G\n", 13, "not hex" },
		{ "\x01\x02N          0000000000000F23 ", 29, "newline" },
	};
	struct dbox_fault fault;
	uint64_t size = 7;

	(void)state;
	errors_reset();
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memset(&fault, 0, sizeof(fault));
		assert_int_equal(dbox_msg_header_parse(
					 (const uint8_t *)bad[i].header, &size,
					 &fault), -DBOX_ECORRUPT);
		assert_int_equal(fault.offset, bad[i].offset);
		if (strstr(fault.reason, bad[i].reason) == NULL)
			fail_msg("reason \"%s\" lacks \"%s\"", fault.reason,
				 bad[i].reason);
		/* Without a fault, the same answer. */
		assert_int_equal(dbox_msg_header_parse(
					 (const uint8_t *)bad[i].header, &size,
					 NULL), -DBOX_ECORRUPT);
	}
	assert_int_equal(size, 7); /* untouched on failure */
	assert_int_equal(error_count, 0);
}

static void test_file_header_and_metadata_fault(void **state)
{
	struct dbox_fault fault = { 0 };
	struct dbox_metadata md;
	unsigned int msg_size;
	size_t header_len, block_len;
	time_t created;
	static const char block[] = "\n\001\003\nR5f5e1000\nVzz\n\n";

	(void)state;
	assert_int_equal(dbox_file_header_parse("2 M20 C5\n", 9, &header_len,
						&msg_size, &created, &fault),
			 -DBOX_ECORRUPT);
	assert_non_null(strstr(fault.reason, "message header size"));
	assert_int_equal(dbox_file_header_parse("3 M1e\n", 6, &header_len,
						&msg_size, &created, &fault),
			 -DBOX_ECORRUPT);
	assert_non_null(strstr(fault.reason, "version"));
	/* The V value is no hex: the fault points at its line. */
	assert_int_equal(dbox_metadata_parse(block, sizeof(block) - 1, &md,
					     &block_len, &fault),
			 -DBOX_ECORRUPT);
	assert_int_equal(fault.offset, 14);
	assert_non_null(strstr(fault.reason, "V value"));
	assert_int_equal(dbox_metadata_parse("\n\001\004\n\n", 5, &md,
					     &block_len, &fault),
			 -DBOX_ECORRUPT);
	assert_non_null(strstr(fault.reason, "magic"));
}

/* dbox_record_verify of a record whose message header is header:
   refused, for reason. */
static void expect_header_reason(int fd, uint64_t offset,
				 const uint8_t header[DBOX_MSG_HEADER_SIZE],
				 const char *reason)
{
	struct dbox_metadata md = { 0 };
	struct dbox_fault fault;
	uint64_t body_size, record_size;

	assert_int_equal(pwrite(fd, header, DBOX_MSG_HEADER_SIZE,
				(off_t)offset), DBOX_MSG_HEADER_SIZE);
	assert_int_equal(dbox_record_verify(fd, offset, UINT64_MAX, &body_size,
					    &md, &record_size, &fault),
			 -DBOX_ECORRUPT);
	assert_non_null(strstr(fault.reason, reason));
	dbox_metadata_clear(&md);
}

static void test_record_verify_fault(void **state)
{
	char dir[64];
	struct dbox_append ap;
	struct dbox_metadata md = { .received = 1600000000 };
	struct dbox_fault fault = { 0 };
	uint64_t size, body_size, record_size, offset;
	int dir_fd, fd;

	(void)state;
	tmpdir_make(dir, sizeof(dir), "test-fault");
	dir_fd = open(dir, O_RDONLY | O_DIRECTORY);
	assert_true(dir_fd >= 0);
	fd = dbox_file_create(dir_fd, 1, &size);
	close(dir_fd);
	assert_true(fd >= 0);
	offset = size;
	assert_int_equal(dbox_append_begin(&ap, fd, offset), 0);
	assert_int_equal(dbox_append_pwrite(&ap, "hello\n", 6, 0), 0);
	assert_int_equal(dbox_append_finish(&ap, &md), 0);
	dbox_metadata_clear(&md);
	assert_int_equal(dbox_record_verify(fd, offset, 6, &body_size, &md,
					    &record_size, &fault), 0);
	assert_int_equal(body_size, 6);
	assert_int_equal(record_size, ap.record_size);
	dbox_metadata_clear(&md);

	/* The index expects another body size. */
	assert_int_equal(dbox_record_verify(fd, offset, 5, &body_size, &md,
					    &record_size, &fault),
			 -DBOX_ECORRUPT);
	assert_int_equal(fault.offset, offset);
	assert_non_null(strstr(fault.reason, "body size 6, index says 5"));
	/* A damaged message header. */
	assert_int_equal(pwrite(fd, "\x07", 1, (off_t)offset), 1);
	errors_reset();
	assert_int_equal(dbox_record_verify(fd, offset, UINT64_MAX, &body_size,
					    &md, &record_size, &fault),
			 -DBOX_ECORRUPT);
	assert_int_equal(fault.offset, offset);
	assert_non_null(strstr(fault.reason, "corrupt message header"));
	assert_int_equal(error_count, 0);
	/* dbox_record_read is the same read with the reason logged. */
	assert_int_equal(dbox_record_read(fd, 1, offset, UINT64_MAX, &body_size,
					  &md, &record_size), -EIO);
	assert_int_equal(error_count, 1);
	assert_non_null(strstr(last_error, "corrupt message header"));
	/* A header no save finished is named so, not called corrupt:
	   dboxfs's placeholder, and Dovecot's zeros. */
	uint8_t header[DBOX_MSG_HEADER_SIZE];

	dbox_msg_header_unsealed(header);
	expect_header_reason(fd, offset, header, "never finished (dboxfs's "
			     "placeholder header)");
	memset(header, 0, sizeof(header));
	expect_header_reason(fd, offset, header, "zeros where the message "
			     "header goes");
	close(fd);
	rm_rf(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_msg_header_fault),
		cmocka_unit_test(test_file_header_and_metadata_fault),
		cmocka_unit_test(test_record_verify_fault),
	};

	dbox_log_set_sink(capture_sink);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
