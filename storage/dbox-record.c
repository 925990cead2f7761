/*
 * dbox-record.c: read one record back and verify it, the reason of any
 * corruption as data (dbox-record.h).
 */
#include "dbox-record.h"

#include "io.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Read the metadata block of the record at `offset`, which starts at file
   offset pos, growing the buffer until the block's end is in it.  Returns
   0, -DBOX_ECORRUPT (fault), -ENOMEM or the pread error. */
static int metadata_read(int fd, uint64_t offset, uint64_t pos,
			 struct dbox_metadata *md_r, size_t *block_len_r,
			 struct dbox_fault *fault)
{
	size_t size = 512, len = 0;
	char *buf = NULL;
	int ret;

	for (;;) {
		char *p = realloc(buf, size);
		ssize_t got;

		if (p == NULL) {
			ret = -ENOMEM;
			break;
		}
		buf = p;
		got = dbox_pread_full(fd, buf + len, size - len, pos + len);
		if (got < 0) {
			ret = (int)got;
			break;
		}
		len += (size_t)got;
		if (len < DBOX_MAGIC_POST_LEN) {
			ret = dbox_fault_set(fault, offset, "file ends before "
					     "the metadata block (body "
					     "truncated?)");
			break;
		}
		if (memcmp(buf, DBOX_MAGIC_POST, DBOX_MAGIC_POST_LEN) != 0) {
			ret = dbox_fault_set(fault, offset, "no metadata magic "
					     "after the body (at %llu)",
					     (unsigned long long)pos);
			break;
		}
		ret = dbox_metadata_parse(buf, len, md_r, block_len_r, fault);
		if (ret == -DBOX_ECORRUPT && fault != NULL) {
			char why[sizeof(fault->reason)];

			memcpy(why, fault->reason, sizeof(why));
			ret = dbox_fault_set(fault, offset, "corrupt metadata "
					     "block (at %llu): %s",
					     (unsigned long long)pos, why);
		}
		if (ret <= 0)
			break;
		if (len < size) {
			ret = dbox_fault_set(fault, offset, "file ends inside "
					     "the metadata block");
			break;
		}
		if (size >= DBOX_METADATA_MAX) {
			ret = dbox_fault_set(fault, offset, "metadata block "
					     "longer than %d bytes",
					     DBOX_METADATA_MAX);
			break;
		}
		size *= 2;
	}
	free(buf);
	return ret;
}

int dbox_record_verify(int fd, uint64_t offset, uint64_t expected_body_size,
		       uint64_t *body_size_r, struct dbox_metadata *md_r,
		       uint64_t *record_size_r, struct dbox_fault *fault)
{
	uint8_t header[DBOX_MSG_HEADER_SIZE];
	uint64_t body_size;
	size_t block_len;
	ssize_t got = dbox_pread_full(fd, header, sizeof(header), offset);
	int ret;

	if (got < 0)
		return (int)got;
	if (got < DBOX_MSG_HEADER_SIZE)
		return dbox_fault_set(fault, offset, "file ends inside the "
				      "message header");
	/* dboxfs's placeholder (dbox-format.h) and Dovecot's zeros are a
	   header no save finished: named so, not called corrupt. */
	if (dbox_msg_header_is_unsealed(header))
		return dbox_fault_set(fault, offset, "a record whose write "
				      "never finished (dboxfs's placeholder "
				      "header)");
	if (dbox_msg_header_is_zero(header))
		return dbox_fault_set(fault, offset, "zeros where the message "
				      "header goes (a write that never "
				      "finished, or a torn one)");
	if (dbox_msg_header_parse(header, &body_size, NULL) < 0)
		return dbox_fault_set(fault, offset, "corrupt message header "
				      "(bad magic, type or size)");
	if (expected_body_size != UINT64_MAX && body_size != expected_body_size)
		return dbox_fault_set(fault, offset, "body size %llu, index "
				      "says %llu", (unsigned long long)body_size,
				      (unsigned long long)expected_body_size);
	if (body_size > (uint64_t)INT64_MAX - offset - DBOX_MSG_HEADER_SIZE)
		return dbox_fault_set(fault, offset, "body size %llu is "
				      "impossible", (unsigned long long)body_size);
	ret = metadata_read(fd, offset, offset + DBOX_MSG_HEADER_SIZE +
			    body_size, md_r, &block_len, fault);
	if (ret < 0)
		return ret;
	*body_size_r = body_size;
	*record_size_r = DBOX_MSG_HEADER_SIZE + body_size + block_len;
	return 0;
}
