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
#include "engine/mfile-read.h"
#include "engine/store-layout.h"
#include "dboxadm.h"

#include "storage/dbox-file.h"
#include "storage/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct dump {
	uint64_t committed_end;  /* stop after the record ending here;
				    UINT64_MAX: walk to EOF */
	uint64_t records;
	uint64_t end;            /* end of the last record listed */
};

/* A field with tabs, newlines and backslashes escaped (\t \n \\),
   and every other byte that could act on a terminal (controls, C1 too,
   bytes of no well-formed UTF-8 sequence: dbox_text_char_len) as \xNN,
   so every record stays one line and reaches root's terminal inert. */
static void print_field(const char *s)
{
	if (s == NULL || *s == '\0') {
		fputc('-', stdout);
		return;
	}
	while (*s != '\0') {
		size_t len = dbox_text_char_len(s);

		if (*s == '\t' || *s == '\n' || *s == '\\') {
			fputc('\\', stdout);
			fputc(*s == '\t' ? 't' : *s == '\n' ? 'n' : '\\', stdout);
			len = 1;
		} else if (len == 0) {
			printf("\\x%02x", (unsigned char)*s);
			len = 1;
		} else {
			fwrite(s, 1, len, stdout);
		}
		s += len;
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

/* Open the file arg names: "m.N" or "N" of STORE (storage/, else the
   alternate storage), anything else a path.  Sets *path_r (malloc()ed,
   for messages: STORE/storage/m.N for an m.N) and *file_id_r (0 when the
   path is not named m.N).  Returns 0 or a negative errno. */
static int open_arg(const char *store, const char *arg,
		    struct dbox_mfile_ref *ref, char **path_r,
		    uint32_t *file_id_r)
{
	const char *base = strrchr(arg, '/');
	uint32_t id = 0;

	if (base == NULL && dbox_mfile_arg_id(arg, &id)) {
		int ret;

		*file_id_r = id;
		/* The path of the file found (storage/, else ALT/storage/);
		   when there is none, where it was looked for first. */
		ret = dbox_mfile_open_id(store, id, ref, path_r);
		if (ret < 0 && asprintf(path_r, "%s/" DBOX_STORE_STORAGE
					"/m.%u", store, id) < 0)
			*path_r = NULL;
		return ret;
	}
	base = base != NULL ? base + 1 : arg;
	if (strncmp(base, "m.", 2) != 0 || !dbox_mfile_arg_id(base, &id))
		id = 0;
	*file_id_r = id;
	if ((*path_r = strdup(arg)) == NULL)
		return -ENOMEM;
	return dbox_mfile_open_path(store, arg, id, ref);
}

/* List the records up to the committed end; report what stopped it.
   Returns ADM_EXIT_OK or ADM_EXIT_FAILED (a corrupt record). */
static int dump_records(const char *path, uint32_t id,
			const struct dbox_mfile_ref *ref, size_t header_len)
{
	struct dump d = { .committed_end = ref->committed_end };
	uint64_t bad = 0;
	int ret;

	printf("offset\tbody_size\tguid\treceived\tfolder\tplain_size\n");
	if (d.committed_end <= header_len)
		ret = 1; /* no committed record yet */
	else
		ret = dbox_file_walk(ref->fd, id, record_cb, &d, &bad);
	fflush(stdout);
	if (ret < 0) {
		adm_error("%s: offset %llu: %s; %llu records listed before it",
			  path, (unsigned long long)bad,
			  ret == -EIO ? "corrupt record" : strerror(-ret),
			  (unsigned long long)d.records);
	} else if (ret > 0 && ref->size > d.committed_end) {
		adm_warning("%s: %llu bytes after the committed end %llu not "
			    "listed (a message being written, or left by a "
			    "crash)", path,
			    (unsigned long long)(ref->size - d.committed_end),
			    (unsigned long long)d.committed_end);
	}
	return ret < 0 ? ADM_EXIT_FAILED : ADM_EXIT_OK;
}

static int dump_main(int argc, char **argv)
{
	struct dbox_mfile_ref ref = { .fd = -1 };
	char *path = NULL;
	size_t header_len;
	uint32_t id = 0;
	int ret;

	if ((ret = adm_verb_begin(&adm_verb_dump, argc, argv, NULL, NULL, 2,
				  "STORE and m.N")) != 0)
		return ret;
	ret = open_arg(argv[0], argv[1], &ref, &path, &id);
	if (path == NULL) {
		adm_error("out of memory");
		return ADM_EXIT_FAILED;
	}
	if (ret < 0) {
		adm_error("%s: %s", path, ret == -EINVAL ?
			  "not a regular file" : strerror(-ret));
		free(path);
		return ADM_EXIT_USAGE;
	}
	if ((ret = dbox_file_read_header(ref.fd, &header_len)) < 0) {
		adm_error("%s: offset 0: %s", path, ret == -EIO ?
			  "not a dbox v2 file (bad header line)" : strerror(-ret));
		ret = ADM_EXIT_FAILED;
	} else {
		ret = dump_records(path, id, &ref, header_len);
	}
	close(ref.fd);
	free(path);
	if (ret == ADM_EXIT_OK && ferror(stdout)) {
		adm_error("writing the output: %s", strerror(errno));
		return ADM_EXIT_FAILED;
	}
	return ret;
}

const struct adm_verb adm_verb_dump = {
	.name = "dump",
	.summary = "list the records of one " DBOX_STORE_STORAGE "/m.N file "
		   "(mounted or not)",
	.usage =
	"usage: dboxadm dump STORE m.N\n"
	"\n"
	"List every record of STORE/" DBOX_STORE_STORAGE "/m.N (given as m.N, N, or a path to\n"
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
