/*
 * dump.c: dboxadm dump STORE m.N - list the records of one storage/m.N
 * file, one tab-separated line each, after a header line:
 *
 *   offset  body_size  guid  received  folder  plain_size
 *
 * (received = R as ISO 8601 UTC, folder = B, plain_size = Z; "-" when the
 * record has none).  Every record in the file is listed, expunged ones
 * too: this shows the bytes, not the index.
 *
 * Works while the store is mounted: the file is only read, and when the
 * index is there the walk stops at the committed end it records, so a
 * message being appended by the mount is not taken for corruption.  A
 * corrupt record ends the listing with an error naming its offset
 * (exit 1).
 */
#include "engine/store-layout.h"
#include "dboxadm.h"

#include "index/index-stats.h"
#include "index/index.h"
#include "storage/dbox-file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct dump {
	uint64_t committed_end;  /* stop after the record ending here;
				    UINT64_MAX: walk to EOF */
	uint64_t records;
	uint64_t end;            /* end of the last record listed */
};

/* A field with tabs, newlines, backslashes and other control bytes
   escaped (\t \n \\ \xNN), so every record stays one line. */
static void print_field(const char *s)
{
	if (s == NULL || *s == '\0') {
		fputc('-', stdout);
		return;
	}
	for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
		if (*p == '\t')
			fputs("\\t", stdout);
		else if (*p == '\n')
			fputs("\\n", stdout);
		else if (*p == '\\')
			fputs("\\\\", stdout);
		else if (*p < 0x20 || *p == 0x7f)
			printf("\\x%02x", *p);
		else
			fputc(*p, stdout);
	}
}

static int record_cb(void *ctx, uint64_t offset, uint64_t body_size,
		     const struct dbox_metadata *md, uint64_t record_size)
{
	struct dump *d = ctx;
	char received[32] = "-";
	struct tm tm;

	if (md->received != 0 && gmtime_r(&md->received, &tm) != NULL)
		strftime(received, sizeof(received), "%Y-%m-%dT%H:%M:%SZ", &tm);
	printf("%llu\t%llu\t", (unsigned long long)offset,
	       (unsigned long long)body_size);
	print_field(md->guid);
	printf("\t%s\t", received);
	print_field(md->mailbox);
	if (md->has_plain_size)
		printf("\t%llu\n", (unsigned long long)md->plain_size);
	else
		fputs("\t-\n", stdout);
	d->records++;
	d->end = offset + record_size;
	return d->end >= d->committed_end ? 1 : 0;
}

/* "m.N" or "N" names STORE/storage/m.N; anything else is a path. */
static bool parse_file_arg(const char *arg, uint32_t *id_r)
{
	const char *p = strncmp(arg, "m.", 2) == 0 ? arg + 2 : arg;
	unsigned long id;
	char *end;

	if (*p < '0' || *p > '9')
		return false;
	errno = 0;
	id = strtoul(p, &end, 10);
	if (*end != '\0' || errno != 0 || id > UINT32_MAX)
		return false;
	*id_r = (uint32_t)id;
	return true;
}

/* The committed end of m.<id> of store, when the file at fd is that m.N
   and the index knows it; UINT64_MAX otherwise. */
static uint64_t committed_end(const char *store, uint32_t id, int fd)
{
	struct dbox_index *index;
	struct stat a, b;
	char *path;
	uint64_t end = UINT64_MAX, size;
	bool same;

	if (asprintf(&path, "%s/" DBOX_STORE_STORAGE "/m.%u", store, id) < 0)
		return end;
	same = stat(path, &a) == 0 && fstat(fd, &b) == 0 &&
		a.st_dev == b.st_dev && a.st_ino == b.st_ino;
	free(path);
	if (!same || asprintf(&path, "%s/" DBOX_STORE_INDEX, store) < 0)
		return end;
	if (dbox_index_open(path, false, &index) == 0) {
		if (dbox_index_reader_setup(index) == 0 &&
		    dbox_index_mfile_get(index, id, &size) == 0)
			end = size;
		dbox_index_close(&index);
	}
	free(path);
	return end;
}

static int dump_main(int argc, char **argv)
{
	struct dump d = { .committed_end = UINT64_MAX };
	const char *base;
	char *path = NULL;
	size_t header_len;
	uint64_t bad = 0;
	struct stat sb;
	uint32_t id = 0;
	int npos, fd, ret;

	if ((ret = adm_parse_args(&adm_verb_dump, argc, argv, NULL, NULL,
				  &npos)) != 0)
		return ret;
	if (npos != 2)
		return adm_usage_error(&adm_verb_dump, "dump: need STORE and m.N");
	if ((ret = adm_store_enter(argv[0])) != 0)
		return ret;
	if (strchr(argv[1], '/') == NULL && parse_file_arg(argv[1], &id)) {
		if (asprintf(&path, "%s/" DBOX_STORE_STORAGE "/m.%u", argv[0], id) < 0)
			path = NULL;
	} else {
		path = strdup(argv[1]);
		base = strrchr(argv[1], '/');
		base = base != NULL ? base + 1 : argv[1];
		if (strncmp(base, "m.", 2) != 0 || !parse_file_arg(base, &id))
			id = 0;
	}
	if (path == NULL) {
		adm_error("out of memory");
		return ADM_EXIT_FAILED;
	}
	if (strchr(argv[1], '/') == NULL) {
		char name[16];

		snprintf(name, sizeof(name), "m.%u", id);
		fd = adm_open_mfile(argv[0], name);
		if (fd < 0)
			errno = -fd;
	} else {
		fd = open(path, O_RDONLY | O_CLOEXEC);
	}
	if (fd < 0 || fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
		adm_error("%s: %s", path, fd < 0 ? strerror(errno) :
			  "not a regular file");
		if (fd >= 0)
			close(fd);
		free(path);
		return ADM_EXIT_USAGE;
	}
	if ((ret = dbox_file_read_header(fd, &header_len)) < 0) {
		adm_error("%s: offset 0: %s", path, ret == -EIO ?
			  "not a dbox v2 file (bad header line)" : strerror(-ret));
		close(fd);
		free(path);
		return ADM_EXIT_FAILED;
	}
	if (id != 0)
		d.committed_end = committed_end(argv[0], id, fd);

	printf("offset\tbody_size\tguid\treceived\tfolder\tplain_size\n");
	if (d.committed_end <= header_len)
		ret = 1; /* no committed record yet */
	else
		ret = dbox_file_walk(fd, id, record_cb, &d, &bad);
	fflush(stdout);
	if (ret < 0) {
		adm_error("%s: offset %llu: %s; %llu records listed before it",
			  path, (unsigned long long)bad,
			  ret == -EIO ? "corrupt record" : strerror(-ret),
			  (unsigned long long)d.records);
	} else if (ret > 0 && (uint64_t)sb.st_size > d.committed_end) {
		adm_warning("%s: %llu bytes after the committed end %llu not "
			    "listed (a message being written, or left by a "
			    "crash)", path,
			    (unsigned long long)(sb.st_size - d.committed_end),
			    (unsigned long long)d.committed_end);
	}
	close(fd);
	free(path);
	if (ferror(stdout)) {
		adm_error("writing the output: %s", strerror(errno));
		return ADM_EXIT_FAILED;
	}
	return ret < 0 ? ADM_EXIT_FAILED : ADM_EXIT_OK;
}

const struct adm_verb adm_verb_dump = {
	.name = "dump",
	.summary = "list the records of one storage/m.N file",
	.usage =
	"usage: dboxadm dump STORE m.N\n"
	"\n"
	"List every record of STORE/storage/m.N (given as m.N, N, or a path to\n"
	"any dbox file), expunged ones included, as tab-separated lines after a\n"
	"header line:\n"
	"\n"
	"  offset  body_size  guid  received  folder  plain_size\n"
	"\n"
	"received is the R date (ISO 8601, UTC), folder the B mailbox, plain_size\n"
	"the Z size of a compressed body; '-' when absent.  Works while STORE is\n"
	"mounted.  A corrupt record ends the list with an error naming its offset\n"
	"(exit status 1).\n",
	.run = dump_main,
};
