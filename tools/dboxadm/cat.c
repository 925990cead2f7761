/*
 * cat.c: dboxadm cat STORE m.N OFFSET - write the plaintext of the record
 * at OFFSET of one dbox file to stdout, decompressed whatever its codec
 * (storage/dbox-read.h: gz, bz2, xz, zstd, Dovecot's lz4).
 *
 * The file is only read, so this works on a mounted store and on any
 * mdbox storage/ Dovecot wrote (STORE is then the mdbox root, or the
 * file is given as a path).  With `dboxadm dump` for the offsets it is
 * the way to look at, or salvage, the messages of one m.N.
 */
#include "engine/mfile-read.h"
#include "engine/store-layout.h"
#include "dboxadm.h"

#include "storage/dbox-read.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CAT_BUF_SIZE (128 * 1024)

/* Open the file arg names: "m.N" or "N" of STORE (storage/, else the
   alternate storage), anything with a '/' a path (its name m.N or N
   gives *file_id_r, else 0).  *path_r (malloc()ed) names it in messages.
   Returns 0, -EINVAL (arg is none of these; *path_r NULL), or a negative
   errno. */
static int open_arg(const char *store, const char *arg,
		    struct dbox_mfile_ref *ref, char **path_r,
		    uint32_t *file_id_r)
{
	const char *base = strrchr(arg, '/');
	int ret;

	*path_r = NULL;
	if (!dbox_mfile_arg_id(base != NULL ? base + 1 : arg, file_id_r))
		*file_id_r = 0;
	if (base != NULL) {
		if ((*path_r = strdup(arg)) == NULL)
			return -ENOMEM;
		return dbox_mfile_open_path(store, arg, 0, ref);
	}
	if (*file_id_r == 0)
		return -EINVAL;
	/* The path of the file found (storage/, else ALT/storage/); when
	   there is none, where it was looked for first. */
	ret = dbox_mfile_open_id(store, *file_id_r, ref, path_r);
	if (ret < 0 && asprintf(path_r, "%s/" DBOX_STORE_STORAGE "/m.%u",
				store, *file_id_r) < 0)
		*path_r = NULL;
	return ret;
}

/* Write the plaintext of reader (plain_size bytes) to stdout.  Returns
   ADM_EXIT_OK, or ADM_EXIT_FAILED after reporting. */
static int cat_plaintext(struct dbox_reader *reader, uint64_t plain_size,
			 const char *path, uint64_t offset)
{
	char *buf = malloc(CAT_BUF_SIZE);
	uint64_t off = 0;
	int ret = ADM_EXIT_OK;

	if (buf == NULL) {
		adm_error("%s: %s", path, strerror(ENOMEM));
		return ADM_EXIT_FAILED;
	}
	while (ret == ADM_EXIT_OK && off < plain_size) {
		ssize_t n = dbox_reader_pread(reader, buf, CAT_BUF_SIZE, off);
		int err;

		if (n <= 0) {
			adm_error("%s: offset %llu: plaintext unreadable at "
				  "%llu: %s", path, (unsigned long long)offset,
				  (unsigned long long)off,
				  n == 0 ? "short" :
				  strerror(-dbox_corrupt_as_eio((int)n)));
			ret = ADM_EXIT_FAILED;
		} else if ((err = adm_write_full(STDOUT_FILENO, buf,
						 (size_t)n)) < 0) {
			adm_error("writing the output: %s", strerror(-err));
			ret = ADM_EXIT_FAILED;
		}
		off += n > 0 ? (uint64_t)n : 0;
	}
	free(buf);
	return ret;
}

static int cat_main(int argc, char **argv)
{
	struct dbox_mfile_ref ref = { .fd = -1 };
	struct dbox_reader *reader = NULL;
	uint64_t offset, plain_size;
	char *path, *end;
	uint32_t id;
	int ret;

	if ((ret = adm_verb_begin(&adm_verb_cat, argc, argv, NULL, NULL, 3,
				  "STORE, m.N and OFFSET")) != 0)
		return ret;
	errno = 0;
	offset = strtoull(argv[2], &end, 10);
	if (errno != 0 || end == argv[2] || *end != '\0')
		return adm_usage_error(&adm_verb_cat, "cat: bad OFFSET '%s'",
				       argv[2]);
	ret = open_arg(argv[0], argv[1], &ref, &path, &id);
	if (ret == -EINVAL && path == NULL)
		return adm_usage_error(&adm_verb_cat, "cat: '%s' is not m.N, "
				       "N or a path", argv[1]);
	if (ret < 0) {
		adm_error("%s: %s", path != NULL ? path : argv[1],
			  ret == -EINVAL ? "not a regular file" : strerror(-ret));
		free(path);
		return ADM_EXIT_USAGE;
	}
	/* Past the end: said as such, not as a damaged record there. */
	{
		struct stat sb;

		if (fstat(ref.fd, &sb) == 0 && offset >= (uint64_t)sb.st_size) {
			adm_error("%s: offset %llu is past the end of the file "
				  "(%llu bytes; dboxadm dump lists its records)",
				  path, (unsigned long long)offset,
				  (unsigned long long)sb.st_size);
			close(ref.fd);
			free(path);
			return ADM_EXIT_FAILED;
		}
	}
	/* The record must be whole (header, body, metadata); its Z, or the
	   stored size, is the plaintext size. */
	ret = dbox_record_open_reader(ref.fd, id, offset, UINT64_MAX, UINT64_MAX,
				      &reader, &plain_size);
	if (ret < 0) {
		adm_error("%s: offset %llu: %s", path,
			  (unsigned long long)offset, ret == -EIO ?
			  "no whole record there (dboxadm dump lists the "
			  "records of an m.N; check says how many whole "
			  "records a lost+found copy holds)" :
			  strerror(-ret));
		ret = ADM_EXIT_FAILED;
	} else {
		(void)dbox_reader_set_name(reader, "%s offset %llu", path,
					   (unsigned long long)offset);
		ret = cat_plaintext(reader, plain_size, path, offset);
	}
	dbox_reader_free(&reader);
	close(ref.fd);
	free(path);
	return ret;
}

const struct adm_verb adm_verb_cat = {
	.name = "cat",
	.summary = "write one record of an m.N as plaintext (mounted or not)",
	.usage =
	"usage: dboxadm cat STORE m.N OFFSET\n"
	"\n"
	"Write the message at byte OFFSET of STORE/" DBOX_STORE_STORAGE "/m.N (given as m.N, N,\n"
	"or a path to any dbox file, e.g. one Dovecot wrote) to stdout as\n"
	"plaintext: compressed bodies (gz, bz2, xz, zstd, Dovecot's lz4) are\n"
	"decompressed.  OFFSET is a record start, as 'dboxadm dump' lists them.\n"
	"Works while STORE is mounted.  Exit status 1 when there is no whole\n"
	"record at OFFSET or its body is corrupt (nothing more is written).\n",
	.run = cat_main,
};
