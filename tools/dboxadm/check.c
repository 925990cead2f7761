/*
 * check.c: dboxadm check STORE [--json] - the front end of the engine's
 * check (engine/check.h, which says what is verified): print each problem
 * and note as it is found, then a summary line, or with --json one JSON
 * object.  Exit status 0 clean, 1 problems found, 2 usage error or no
 * store.
 *
 * Output: one "problem: ..." line per problem on stdout, notes as
 * "note: ...", then the summary line.
 */
#include "dboxadm.h"
#include "json.h"
#include "progress.h"

#include "engine/check.h"
#include "storage/grow.h"
#include "engine/store-layout.h"
#include "storage/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct strs {
	char **v;
	size_t n, size;
};

struct check_out {
	const char *store;
	bool json;
	struct progress progress;
	struct strs problems, notes;
	unsigned kinds;           /* 1 << kind of every problem found */
};

static void strs_add(struct strs *s, const char *text)
{
	char *copy = strdup(text);
	char **v = copy == NULL ? NULL :
		dbox_grow(s->v, s->n, &s->size, sizeof(*v));

	if (v == NULL) {
		free(copy);
		return;
	}
	s->v = v;
	s->v[s->n++] = copy;
}

static void strs_free(struct strs *s)
{
	for (size_t i = 0; i < s->n; i++)
		free(s->v[i]);
	free(s->v);
}

/* An item of the engine: kept for --json, printed at once as text. */
static void report_cb(void *ctx, const struct dbox_check_item *item)
{
	struct check_out *out = ctx;
	bool problem = item->severity == DBOX_CHECK_PROBLEM;
	char escaped[DBOX_LOG_ESCAPED_SIZE(2048)];

	strs_add(problem ? &out->problems : &out->notes, item->text);
	if (problem)
		out->kinds |= 1u << item->kind;
	if (out->json)
		return;
	progress_clear();
	printf("%s: %s\n", problem ? "problem" : "note",
	       dbox_log_escape(escaped, sizeof(escaped), item->text));
}

static void progress_cb(void *ctx, uint64_t records, uint64_t bytes)
{
	struct check_out *out = ctx;

	progress_add(&out->progress, records, bytes);
}

static void json_strs(const char *key, const struct strs *s)
{
	printf("  \"%s\": [", key);
	for (size_t i = 0; i < s->n; i++) {
		printf("%s\n    ", i == 0 ? "" : ",");
		adm_json_string(stdout, s->v[i]);
	}
	printf("%s],\n", s->n > 0 ? "\n  " : "");
}

static void print_result(const struct check_out *out,
			 const struct dbox_check_summary *sum)
{
	if (out->json) {
		printf("{\n  \"store\": ");
		adm_json_string(stdout, out->store);
		printf(",\n  \"mounted\": %s,\n", sum->mounted ? "true" : "false");
		json_strs("problems", &out->problems);
		json_strs("notes", &out->notes);
		printf("  \"messages\": %llu,\n  \"mfiles\": %zu,\n"
		       "  \"records\": %llu,\n  \"plain_files\": %zu\n}\n",
		       (unsigned long long)sum->messages, sum->mfiles,
		       (unsigned long long)sum->records, sum->plain_files);
		return;
	}
	printf("%s: %llu messages, %zu m.N files (%llu records), %zu plain "
	       "files checked%s: %zu problem%s\n", out->store,
	       (unsigned long long)sum->messages, sum->mfiles,
	       (unsigned long long)sum->records, sum->plain_files,
	       sum->mounted ? " (mounted: one snapshot)" : "",
	       out->problems.n, out->problems.n == 1 ? "" : "s");
}

/* What to do about the kinds of problems found, a line each (text
   output only): the repairs docs/administration.md ("Repairing a
   store") describes. */
static void print_advice(const struct check_out *out, bool import_killed)
{
	const char *s = out->store;
	unsigned k = out->kinds;

	/* First: a rebuild now would not bring the import's uncommitted
	   mail back, and the import run again finishes it (helper-85). */
	if (import_killed)
		printf("advice: run the killed 'dboxadm import' (or "
		       "import-dovecot) again with the same arguments: it "
		       "imports what the killed run had not committed and "
		       "skips what it had (a rebuild does not bring that "
		       "mail back)\n");
	if (k & (1u << DBOX_CHECK_INDEX))
		printf("advice: 'dboxadm rebuild %s' (unmounted) recreates the "
		       "index from " DBOX_STORE_STORAGE "/\n", s);
	if (k & (1u << DBOX_CHECK_STORAGE))
		printf("advice: make the storage named above reachable (the "
		       "alternate storage's disk mounted, its path right); "
		       "its messages read again without a repair\n");
	/* First: a rebuild forgets a plain file whose backing file is
	   missing (helper-81: names lost, bytes in lost+found/). */
	if (k & (1u << DBOX_CHECK_PLAIN_FILE))
		printf("advice: plain files (client state: dovecot-uidlist, "
		       ".mbsyncstate, ...) have no readable " DBOX_STORE_FILES
		       "/<ino>; put " DBOX_STORE_FILES "/ or the files named "
		       "above back (from a backup) before anything else: "
		       "a rebuild forgets such files\n");
	if (k & ((1u << DBOX_CHECK_MFILE) | (1u << DBOX_CHECK_REGION) |
		 (1u << DBOX_CHECK_TAIL) | (1u << DBOX_CHECK_MESSAGE) |
		 (1u << DBOX_CHECK_BODY)))
		printf("advice: bytes of mail are missing or damaged; put the "
		       "m.N named above back from a backup (the store "
		       "unmounted), or run 'dboxadm rebuild %s', which keeps "
		       "every whole record and drops the messages that have "
		       "none; what remains damaged reads EIO until it is "
		       "expunged on the mount "
		       "(docs/administration.md, \"Repairing a store\")\n", s);
}

/* Why the check could not run or stopped; the exit status. */
static int failed(const char *store, const struct dbox_check_summary *sum,
		  int err)
{
	if (sum->opened)
		adm_error("%s: checking stopped: %s", store, strerror(-err));
	else if (err == -ENOMEDIUM)
		adm_error("%s: not a dbox store (no " DBOX_STORE_INDEX ", no "
			  DBOX_STORE_STORAGE "/)", store);
	else if (err == -EPROTO)
		adm_error("%s: the index is from a newer dboxfs; this dboxadm "
			  "cannot check it", store);
	else
		adm_error("%s: %s", store, strerror(-err));
	return ADM_EXIT_USAGE;
}

static int check_main(int argc, char **argv)
{
	static const char *const flags[] = { "--json", NULL };
	struct check_out out = { 0 };
	struct dbox_check_summary sum;
	bool *flag_r[] = { &out.json };
	int npos, ret;

	if ((ret = adm_parse_args(&adm_verb_check, argc, argv, flags, flag_r,
				  &npos)) != 0)
		return ret;
	if ((ret = adm_check_npos(&adm_verb_check, argv, npos, 1,
				  "STORE")) != 0)
		return ret;
	if ((ret = adm_store_enter(argv[0])) != 0)
		return ret;
	out.store = argv[0];
	progress_init(&out.progress, "checked");
	ret = dbox_check_store(out.store, report_cb, progress_cb, &out, &sum);
	progress_finish(&out.progress);
	if (ret < 0) {
		ret = failed(out.store, &sum, ret);
	} else {
		print_result(&out, &sum);
		if (!out.json)
			print_advice(&out, sum.import_killed);
		ret = sum.problems > 0 ? ADM_EXIT_FAILED : ADM_EXIT_OK;
	}
	strs_free(&out.problems);
	strs_free(&out.notes);
	if (fflush(stdout) != 0)
		return ADM_EXIT_USAGE;
	return ret;
}

const struct adm_verb adm_verb_check = {
	.name = "check",
	.summary = "verify the index against " DBOX_STORE_STORAGE "/ and " DBOX_STORE_FILES
		   "/ (mounted or not)",
	.usage =
	"usage: dboxadm check STORE [--json]\n"
	"\n"
	"Verify STORE without changing it: SQLite's integrity check of\n"
	DBOX_STORE_INDEX "; the namespace (names, link counts, directories); every\n"
	DBOX_STORE_STORAGE "/m.N record by record, and every message of the index against its\n"
	"record (offset, body and record size, GUID, V, plaintext size); every\n"
	"compressed body decoded to its end (the codec's own checksum); m.N files\n"
	"missing, shorter than their committed end, or unknown to the index; and\n"
	DBOX_STORE_FILES "/ against the plain files of the index.  Each problem is printed as\n"
	"a line 'problem: ...'; states the next mount's crash recovery cleans up\n"
	"are 'note: ...' lines.\n"
	"\n"
	"Works while STORE is mounted (one snapshot of the index; what the mount\n"
	"is writing at that moment is not checked).  Offline it holds the store\n"
	"lock shared, so the store cannot be mounted until it is done.\n"
	"\n"
	"  --json   one JSON object (problems, notes, counts) instead of text\n"
	"\n"
	"Exit status: 0 no problem, 1 problems found (a missing or unreadable\n"
	"index is one: 'dboxadm rebuild' recreates it), 2 usage error or no store.\n",
	.run = check_main,
};
