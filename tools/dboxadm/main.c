/*
 * main.c: the dboxadm command line: global options, the verb table,
 * per-verb --help, the log sink (stderr, "dboxadm: ...") and the helpers
 * shared by the verbs (argument parsing, error messages, opening an index
 * without the store lock).
 *
 *   dboxadm [--help | --version]
 *   dboxadm VERB [--help] ARGS...
 */
#include "dboxadm.h"
#include "progress.h"

#include "index/index-stats.h"
#include "index/index.h"
#include "storage/log.h"

#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const struct adm_verb *const verbs[] = {
	&adm_verb_import, &adm_verb_export, &adm_verb_stats, &adm_verb_dump,
	&adm_verb_purge, &adm_verb_import_dovecot,
	&adm_verb_cat,
	&adm_verb_check, &adm_verb_rebuild,
	&adm_verb_backup,
};
#define N_VERBS (sizeof(verbs) / sizeof(verbs[0]))

static void usage(FILE *out)
{
	fprintf(out,
		"usage: dboxadm VERB [--help] ARGS...\n"
		"       dboxadm --help | --version\n"
		"\n"
		"Administer a dboxfs store (a Dovecot multi-dbox store with a SQLite\n"
		"index).  Verbs:\n");
	for (size_t i = 0; i < N_VERBS; i++)
		fprintf(out, "  %-15s %s\n", verbs[i]->name, verbs[i]->summary);
	fprintf(out,
		"\n"
		"'dboxadm VERB --help' describes a verb.  Exit status: 0 done, 1 some\n"
		"items failed (each reported), 2 usage error or store refused.\n");
}

static void vmessage(const char *prefix, const char *fmt, va_list args)
{
	progress_clear();
	fprintf(stderr, "dboxadm: %s", prefix);
	vfprintf(stderr, fmt, args);
	fputc('\n', stderr);
}

void adm_error(const char *fmt, ...)
{
	va_list args;

	va_start(args, fmt);
	vmessage("", fmt, args);
	va_end(args);
}

void adm_warning(const char *fmt, ...)
{
	va_list args;

	va_start(args, fmt);
	vmessage("warning: ", fmt, args);
	va_end(args);
}

int adm_usage_error(const struct adm_verb *verb, const char *fmt, ...)
{
	const char *nl;
	va_list args;

	va_start(args, fmt);
	vmessage("", fmt, args);
	va_end(args);
	/* The first line of the verb's usage is its synopsis. */
	nl = strchr(verb->usage, '\n');
	fprintf(stderr, "%.*s\n(dboxadm %s --help for more)\n",
		nl != NULL ? (int)(nl - verb->usage) : (int)strlen(verb->usage),
		verb->usage, verb->name);
	return ADM_EXIT_USAGE;
}

int adm_parse_args(const struct adm_verb *verb, int argc, char **argv,
		   const char *const *flags, bool **flag_r, int *npos_r)
{
	struct option opts[8];
	int nflags = 0, c, npos = 0;

	while (flags != NULL && flags[nflags] != NULL && nflags < 7) {
		opts[nflags] = (struct option){ flags[nflags] + 2, no_argument,
						NULL, 'A' + nflags };
		nflags++;
	}
	opts[nflags] = (struct option){ 0 };
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c >= 'A' && c < 'A' + nflags) {
			*flag_r[c - 'A'] = true;
			continue;
		}
		return adm_usage_error(verb, "%s: unknown option '%s'",
				       verb->name, argv[optind - 1]);
	}
	for (int i = optind; i < argc; i++)
		argv[npos++] = argv[i];
	*npos_r = npos;
	return ADM_EXIT_OK;
}

int adm_open_index(const char *store, struct dbox_index **index_r)
{
	struct stat sb;
	char *path;
	int ret;

	if (stat(store, &sb) < 0) {
		adm_error("%s: %s", store, strerror(errno));
		return ADM_EXIT_USAGE;
	}
	if (!S_ISDIR(sb.st_mode)) {
		adm_error("%s: not a directory", store);
		return ADM_EXIT_USAGE;
	}
	if (asprintf(&path, "%s/index.sqlite", store) < 0) {
		adm_error("out of memory");
		return ADM_EXIT_USAGE;
	}
	ret = dbox_index_open(path, false, index_r);
	free(path);
	if (ret == 0 && (ret = dbox_index_reader_setup(*index_r)) < 0)
		dbox_index_close(index_r);
	if (ret == -ENOENT)
		adm_error("%s: not a dbox store (no index.sqlite)", store);
	else if (ret < 0)
		adm_error("%s: cannot open the index: %s", store, strerror(-ret));
	return ret < 0 ? ADM_EXIT_USAGE : ADM_EXIT_OK;
}

int adm_path_init(struct adm_path *path, const char *root)
{
	path->len = strlen(root);
	path->size = path->len + 1;
	if ((path->buf = strdup(root)) == NULL)
		return -ENOMEM;
	while (path->len > 1 && path->buf[path->len - 1] == '/')
		path->buf[--path->len] = '\0';
	return 0;
}

size_t adm_path_push(struct adm_path *path, const char *name)
{
	size_t old = path->len, len = strlen(name);

	if (old + len + 2 > path->size) {
		size_t size = (old + len + 2) * 2;
		char *p = realloc(path->buf, size);

		if (p == NULL)
			return old;
		path->buf = p;
		path->size = size;
	}
	path->buf[old] = '/';
	memcpy(path->buf + old + 1, name, len + 1);
	path->len = old + 1 + len;
	return old;
}

void adm_path_pop(struct adm_path *path, size_t len)
{
	path->len = len;
	path->buf[len] = '\0';
}

void adm_path_free(struct adm_path *path)
{
	free(path->buf);
	path->buf = NULL;
}

void *adm_grow(void *array, size_t n, size_t *size, size_t elem)
{
	size_t new_size = *size == 0 ? 64 : *size * 2;
	void *p;

	if (n < *size)
		return array;
	if ((p = realloc(array, new_size * elem)) != NULL)
		*size = new_size;
	return p;
}

/* Log sink for storage/ and index/: the same "dboxadm: " form. */
static void log_sink(enum dbox_log_level level, const char *fmt, va_list args)
{
	if (level == DBOX_LOG_DEBUG && getenv("DBOXADM_DEBUG") == NULL)
		return;
	vmessage(level == DBOX_LOG_WARNING ? "warning: " : "", fmt, args);
}

static bool is_help(const char *arg)
{
	return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0;
}

int main(int argc, char *argv[])
{
	const struct adm_verb *verb = NULL;

	dbox_log_set_sink(log_sink);
	if (argc < 2) {
		usage(stderr);
		return ADM_EXIT_USAGE;
	}
	if (is_help(argv[1])) {
		usage(stdout);
		return ADM_EXIT_OK;
	}
	if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0) {
		printf("dboxadm %s (index format %d)\n", DBOXADM_VERSION,
		       DBOX_INDEX_FORMAT);
		return ADM_EXIT_OK;
	}
	for (size_t i = 0; i < N_VERBS; i++)
		if (strcmp(argv[1], verbs[i]->name) == 0)
			verb = verbs[i];
	if (verb == NULL) {
		adm_error("unknown verb '%s'", argv[1]);
		usage(stderr);
		return ADM_EXIT_USAGE;
	}
	for (int i = 2; i < argc && strcmp(argv[i], "--") != 0; i++) {
		if (is_help(argv[i])) {
			fputs(verb->usage, stdout);
			return ADM_EXIT_OK;
		}
	}
	return verb->run(argc - 1, argv + 1);
}
