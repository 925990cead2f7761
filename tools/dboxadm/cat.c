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
#include "engine/store-layout.h"
#include "dboxadm.h"

#include "storage/dbox-file.h"
#include "storage/dbox-format.h"
#include "storage/dbox-read.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CAT_BUF_SIZE (128 * 1024)

/* "m.N" or "N" names STORE/storage/m.N; anything with a '/' is a path.
   Returns a malloc()ed path and sets *id_r (0 when unknown), or NULL. */
static char *file_path(const char *store, const char *arg, uint32_t *id_r)
{
	const char *base = strrchr(arg, '/'), *p;
	unsigned long id;
	char *end, *path;

	base = base != NULL ? base + 1 : arg;
	p = strncmp(base, "m.", 2) == 0 ? base + 2 : base;
	errno = 0;
	id = strtoul(p, &end, 10);
	*id_r = *p >= '0' && *p <= '9' && *end == '\0' && errno == 0 &&
		id <= UINT32_MAX ? (uint32_t)id : 0;
	if (strchr(arg, '/') != NULL)
		return strdup(arg);
	if (*id_r == 0 || asprintf(&path, "%s/" DBOX_STORE_STORAGE "/m.%u", store, *id_r) < 0)
		return NULL;
	return path;
}

/* Open the file of arg: a path as given, an m.N of the store never
   through a symbolic link.  Returns the fd or -errno. */
static int open_file(const char *store, const char *arg, const char *path,
		     uint32_t id)
{
	char name[16];
	int fd;

	if (strchr(arg, '/') != NULL) {
		fd = open(path, O_RDONLY | O_CLOEXEC);
		return fd < 0 ? -errno : fd;
	}
	snprintf(name, sizeof(name), "m.%u", id);
	return adm_open_mfile(store, name);
}

static int write_full(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len > 0) {
		ssize_t n = write(fd, p, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static int cat_main(int argc, char **argv)
{
	struct dbox_metadata md = { 0 };
	struct dbox_reader *reader = NULL;
	uint64_t offset, body_size, record_size, plain_size, off = 0;
	char *path, *end, *buf = NULL;
	uint32_t id;
	int npos, fd, ret;

	if ((ret = adm_parse_args(&adm_verb_cat, argc, argv, NULL, NULL,
				  &npos)) != 0)
		return ret;
	if (npos != 3)
		return adm_usage_error(&adm_verb_cat,
				       "cat: need STORE, m.N and OFFSET");
	if ((ret = adm_store_enter(argv[0])) != 0)
		return ret;
	errno = 0;
	offset = strtoull(argv[2], &end, 10);
	if (errno != 0 || end == argv[2] || *end != '\0')
		return adm_usage_error(&adm_verb_cat, "cat: bad OFFSET '%s'",
				       argv[2]);
	if ((path = file_path(argv[0], argv[1], &id)) == NULL)
		return adm_usage_error(&adm_verb_cat, "cat: '%s' is not m.N, "
				       "N or a path", argv[1]);
	fd = open_file(argv[0], argv[1], path, id);
	if (fd < 0) {
		adm_error("%s: %s", path, strerror(-fd));
		free(path);
		return ADM_EXIT_USAGE;
	}
	/* The record must be whole (header, body, metadata); its Z, or the
	   stored size, is the plaintext size. */
	if ((ret = dbox_record_read(fd, id, offset, UINT64_MAX, &body_size, &md,
				    &record_size)) < 0) {
		adm_error("%s: offset %llu: %s", path,
			  (unsigned long long)offset, ret == -EIO ?
			  "no whole record there (see dboxadm dump)" :
			  strerror(-ret));
		ret = ADM_EXIT_FAILED;
		goto out;
	}
	plain_size = md.has_plain_size ? md.plain_size : body_size;
	if ((buf = malloc(CAT_BUF_SIZE)) == NULL ||
	    (ret = dbox_reader_open(fd, offset + DBOX_MSG_HEADER_SIZE,
				    body_size, plain_size, &reader)) < 0) {
		adm_error("%s: %s", path, strerror(buf == NULL ? ENOMEM : -ret));
		ret = ADM_EXIT_FAILED;
		goto out;
	}
	(void)dbox_reader_set_name(reader, "%s offset %llu", path,
				   (unsigned long long)offset);
	ret = ADM_EXIT_OK;
	while (off < plain_size) {
		ssize_t n = dbox_reader_pread(reader, buf, CAT_BUF_SIZE, off);

		if (n <= 0) {
			adm_error("%s: offset %llu: plaintext unreadable at "
				  "%llu: %s", path, (unsigned long long)offset,
				  (unsigned long long)off,
				  n == 0 ? "short" :
				  strerror(-dbox_corrupt_as_eio((int)n)));
			ret = ADM_EXIT_FAILED;
			break;
		}
		if (write_full(STDOUT_FILENO, buf, (size_t)n) < 0) {
			adm_error("writing the output: %s", strerror(errno));
			ret = ADM_EXIT_FAILED;
			break;
		}
		off += (uint64_t)n;
	}
out:
	dbox_reader_free(&reader);
	dbox_metadata_clear(&md);
	free(buf);
	close(fd);
	free(path);
	return ret;
}

const struct adm_verb adm_verb_cat = {
	.name = "cat",
	.summary = "write the plaintext of one record of an m.N to stdout",
	.usage =
	"usage: dboxadm cat STORE m.N OFFSET\n"
	"\n"
	"Write the message at byte OFFSET of STORE/storage/m.N (given as m.N, N,\n"
	"or a path to any dbox file, e.g. one Dovecot wrote) to stdout as\n"
	"plaintext: compressed bodies (gz, bz2, xz, zstd, Dovecot's lz4) are\n"
	"decompressed.  OFFSET is a record start, as 'dboxadm dump' lists them.\n"
	"Works while STORE is mounted.  Exit status 1 when there is no whole\n"
	"record at OFFSET or its body is corrupt (nothing more is written).\n",
	.run = cat_main,
};
