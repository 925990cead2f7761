/*
 * gen-seeds.c: write the seed corpus of fuzz-dbox into DIR: m.N files
 * made with the storage/ writer (so they are what dboxfs writes), and
 * variants Dovecot writes (gzip bodies with Z, extra metadata keys, an
 * R before 1970 as two's complement, an old header line with an A
 * token), one file per case.
 *
 *   gen-seeds DIR
 */
#include "storage/dbox-file.h"
#include "storage/dbox-format.h"
#include "storage/guid.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static int dir_fd;
static uint32_t next_id = 1;

/* gzip of buf (a single member, as Dovecot's zlib plugin writes). */
static unsigned char *gz(const char *buf, size_t len, size_t *out_len)
{
	z_stream zs = { 0 };
	size_t cap = len + 1024;
	unsigned char *out = malloc(cap);

	if (out == NULL || deflateInit2(&zs, 6, Z_DEFLATED, 31, 8,
					Z_DEFAULT_STRATEGY) != Z_OK)
		exit(1);
	zs.next_in = (unsigned char *)buf;
	zs.avail_in = (uInt)len;
	zs.next_out = out;
	zs.avail_out = (uInt)cap;
	if (deflate(&zs, Z_FINISH) != Z_STREAM_END)
		exit(1);
	*out_len = zs.total_out;
	deflateEnd(&zs);
	return out;
}

struct rec {
	const char *body;
	size_t len;
	bool compress;
	const char *mailbox;
	const char *extra;
	time_t received;       /* R; 0: 1700000000 + its index */
};

static void file(const struct rec *recs, size_t n)
{
	uint64_t size;
	int fd = dbox_file_create(dir_fd, next_id++, &size);

	if (fd < 0)
		exit(1);
	for (size_t i = 0; i < n; i++) {
		struct dbox_metadata md = {
			.received = recs[i].received != 0 ? recs[i].received :
				    1700000000 + (time_t)i,
		};
		struct dbox_append ap;
		const void *body = recs[i].body;
		size_t len = recs[i].len;
		unsigned char *z = NULL;

		dbox_guid_generate(md.guid);
		md.mailbox = (char *)recs[i].mailbox;
		md.extra = (char *)recs[i].extra;
		if (recs[i].compress) {
			z = gz(recs[i].body, recs[i].len, &len);
			body = z;
			md.plain_size = recs[i].len;
			md.has_plain_size = true;
			md.vsize = recs[i].len * 2;
			md.has_vsize = true;
		}
		if (dbox_append_begin(&ap, fd, size) < 0 ||
		    (len > 0 && dbox_append_pwrite(&ap, body, len, 0) < 0) ||
		    dbox_append_finish(&ap, &md) < 0)
			exit(1);
		size += ap.record_size;
		free(z);
	}
	close(fd);
}

int main(int argc, char **argv)
{
	static const char mail[] =
		"From: a@example.org\nTo: b@example.org\nSubject: seed\n\n"
		"Hello.\r\nA CRLF line and an LF line.\nBye.\n";
	char big[20000];

	if (argc != 2 || (mkdir(argv[1], 0700) < 0 && access(argv[1], W_OK) < 0) ||
	    (dir_fd = open(argv[1], O_RDONLY | O_DIRECTORY)) < 0) {
		fprintf(stderr, "usage: gen-seeds DIR\n");
		return 2;
	}
	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = i % 79 == 78 ? '\n' : 'a' + (char)(i % 26);
	file((struct rec[]){
		{ mail, sizeof(mail) - 1, false, "INBOX", NULL, 0 },
	}, 1);
	file((struct rec[]){
		{ mail, sizeof(mail) - 1, false, "INBOX", NULL, 0 },
		{ "", 0, false, "Sent", NULL, -86400 }, /* 1969 */
		{ big, sizeof(big), false, "Lists/dovecot", "POLDUIDL\nO17\n", 0 },
	}, 3);
	file((struct rec[]){
		{ big, sizeof(big), true, "Archive", NULL, 0 },
		{ mail, sizeof(mail) - 1, true, NULL, NULL, 0 },
	}, 2);
	file((struct rec[]){
		{ "\x01\x02N                 body with a fake header\n", 44, false,
		  "INBOX", NULL, 0 },
		{ "\n\x01\x03\n", 4, false, "INBOX", NULL, 0 },
	}, 2);
	/* A Dovecot 1.x-style header line with an A token and no C. */
	{
		int fd = openat(dir_fd, "m.old", O_WRONLY | O_CREAT | O_TRUNC, 0600);
		static const char line[] = "2 A0 M1e\n";

		if (fd < 0 || write(fd, line, sizeof(line) - 1) < 0)
			return 1;
		close(fd);
	}
	close(dir_fd);
	return 0;
}
