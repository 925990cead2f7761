/*
 * stats.c: dboxadm stats STORE [--json] - what a store holds and what
 * purge could give back:
 *
 *   m.N files and their bytes on disk
 *   messages (committed, with a name) and their names
 *   live bytes    records (header + body + metadata) of those messages
 *   dead bytes    m.N bytes in no live record and no file header: expunged
 *                 or overwritten messages (and ones unlinked but still open
 *                 on the mount), reclaimable by purge
 *   pending bytes past an m.N's committed end: a write in progress on the
 *                 mount, or leftovers of a crash cut at the next open
 *   plaintext vs stored body bytes (the compression ratio)
 *   messages per folder (the Dovecot mailbox name of their cur/new/tmp,
 *                 shown in UTF-8; on disk its components are in modified
 *                 UTF-7, which --json gives as well)
 *   purge runs so far and what they gave back (index meta, engine/purge.h)
 *   with --files, each m.N: bytes, live and dead bytes, dead share
 *
 * Works while the store is mounted: the index is opened without the store
 * lock and read inside one snapshot.  The storage/ listing is taken after
 * the snapshot, so on a busy mount the byte split is approximate (dead
 * bytes are clamped at 0).  The numbers are engine/stats.h's; this file
 * prints them.
 */
#include "engine/stats.h"
#include "engine/store-layout.h"
#include "dboxadm.h"
#include "json.h"

#include "storage/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double ratio(const struct dbox_stats *s)
{
	return s->ix.body_bytes == 0 ? 1.0 :
		(double)s->ix.plain_bytes / (double)s->ix.body_bytes;
}

/* One "key": value line of the JSON object. */
static void jnum(const char *key, long long value)
{
	printf("  \"%s\": %lld,\n", key, value);
}

/* The same, null when the value is not known. */
static void jknown(const char *key, bool known, long long value)
{
	if (known)
		jnum(key, value);
	else
		printf("  \"%s\": null,\n", key);
}

/* "key": {display: value...} of the folders; raw: the stored names. */
static void json_folders(const struct dbox_stats *s, const char *key, bool raw)
{
	printf("  \"%s\": {", key);
	for (size_t i = 0; i < s->nfolders; i++) {
		printf("%s\n    ", i == 0 ? "" : ",");
		adm_json_string(stdout, s->folders[i].display);
		printf(": ");
		if (raw)
			adm_json_string(stdout, s->folders[i].name);
		else
			printf("%llu", (unsigned long long)s->folders[i].count);
	}
	printf("%s}", s->nfolders > 0 ? "\n  " : "");
}

static void json_files(const struct dbox_stats *s)
{
	printf(",\n  \"files\": [");
	for (size_t i = 0; i < s->nfiles; i++) {
		const struct dbox_stats_mfile *m = &s->files[i];

		printf("%s\n    {\"file\": \"m.%u\", \"bytes\": %llu, "
		       "\"committed\": %llu, \"live_bytes\": %llu, "
		       "\"dead_bytes\": %llu, \"records\": %llu, "
		       "\"in_index\": %s, \"alt\": %s}", i == 0 ? "" : ",",
		       m->file_id,
		       (unsigned long long)m->bytes,
		       (unsigned long long)m->usage.committed,
		       (unsigned long long)m->usage.live_bytes,
		       (unsigned long long)dbox_stats_mfile_dead(m),
		       (unsigned long long)m->usage.records,
		       m->in_index ? "true" : "false",
		       m->alt ? "true" : "false");
	}
	printf("%s]", s->nfiles > 0 ? "\n  " : "");
}

static void print_json(const struct dbox_stats *s, bool files)
{
	const struct { const char *key; uint64_t value; } counts[] = {
		{ "mfiles", s->mfiles }, { "mfile_bytes", s->mfile_bytes },
		{ "mfile_disk_usage", s->disk_bytes },
		{ "alt_mfiles", s->alt_mfiles },
		{ "alt_mfile_bytes", s->alt_bytes },
		{ "missing_mfiles", s->missing_mfiles },
		{ "missing_mfile_bytes", s->missing_bytes },
		{ "missing_alt_mfiles", s->missing_alt_mfiles },
		{ "messages", s->ix.messages },
		{ "message_names", s->ix.message_names },
		{ "live_bytes", s->ix.live_record_bytes },
		{ "dead_bytes", s->dead_bytes },
		{ "pending_bytes", s->pending_bytes },
		{ "header_bytes", s->header_bytes },
		{ "messages_writing", s->ix.writing },
		{ "messages_unlinked_open", s->ix.unlinked },
		{ "plaintext_bytes", s->ix.plain_bytes },
		{ "stored_body_bytes", s->ix.body_bytes },
	};

	printf("{\n");
	for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++)
		jnum(counts[i].key, (long long)counts[i].value);
	printf("  \"compression_ratio\": %.4f,\n", ratio(s));
	jnum("plain_files", (long long)s->ix.files);
	jnum("directories", (long long)s->ix.dirs);
	jnum("purge_runs", s->purge_runs);
	jnum("purge_bytes_freed", s->purge_freed);
	jnum("purge_files_removed", s->purge_files);
	jnum("purge_last_end_ns", s->purge_end_ns);
	/* As `dboxadm purge` prints them; null when not recorded. */
	jknown("purge_records_moved", s->purge_moved_known, s->purge_records);
	jknown("purge_bytes_moved", s->purge_moved_known, s->purge_moved);
	jknown("purge_bytes_given_back", s->purge_moved_known,
	       s->purge_freed - s->purge_moved);
	json_folders(s, "folders", false);
	printf(",\n");
	json_folders(s, "folders_raw", true);
	if (files)
		json_files(s);
	printf("\n}\n");
}

static const char *human(uint64_t bytes, char buf[32])
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double v = (double)bytes;
	int u = 0;

	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	snprintf(buf, 32, u == 0 ? "%.0f %s" : "%.1f %s", v, unit[u]);
	return buf;
}

/* The purge lines: the words and quantities of `dboxadm purge`, summed. */
static void text_purge(const struct dbox_stats *s)
{
	printf("purge runs          %lld\n"
	       "files removed       %lld (%lld bytes)\n",
	       (long long)s->purge_runs, (long long)s->purge_files,
	       (long long)s->purge_freed);
	if (!s->purge_moved_known) {
		printf("records moved       not recorded (purged by an older "
		       "dboxfs)\nbytes given back    not known\n");
		return;
	}
	printf("records moved       %lld (%lld bytes)\n",
	       (long long)s->purge_records, (long long)s->purge_moved);
	printf("bytes given back    %lld\n",
	       (long long)(s->purge_freed - s->purge_moved));
}

static void text_folders(const struct dbox_stats *s)
{
	printf("messages per folder\n");
	for (size_t i = 0; i < s->nfolders; i++) {
		const struct dbox_stats_folder *f = &s->folders[i];
		/* Names come from the index: escaped for the terminal. */
		size_t size = DBOX_LOG_ESCAPED_SIZE(strlen(f->display) +
						    strlen(f->name));
		char *buf = malloc(size);

		if (buf == NULL) {
			printf("  %10llu  (out of memory)\n",
			       (unsigned long long)f->count);
			continue;
		}
		printf("  %10llu  %s", (unsigned long long)f->count,
		       dbox_log_escape(buf, size, f->display));
		if (strcmp(f->display, f->name) != 0)
			printf("  (stored as %s)", dbox_log_escape(buf, size, f->name));
		printf("\n");
		free(buf);
	}
}

static void text_files(const struct dbox_stats *s)
{
	printf("storage files       %12s %12s %12s %5s %8s\n", "bytes",
	       "live", "dead", "dead%", "messages");
	for (size_t i = 0; i < s->nfiles; i++) {
		const struct dbox_stats_mfile *m = &s->files[i];
		uint64_t dead = dbox_stats_mfile_dead(m);
		uint64_t data = m->bytes > m->header_bytes ?
			m->bytes - m->header_bytes : 0;
		char name[24];

		snprintf(name, sizeof(name), "m.%u", m->file_id);
		printf("  %-17s %12llu %12llu %12llu %4llu%% %8llu%s%s\n", name,
		       (unsigned long long)m->bytes,
		       (unsigned long long)m->usage.live_bytes,
		       (unsigned long long)dead,
		       (unsigned long long)(data > 0 ? dead * 100 / data : 0),
		       (unsigned long long)m->usage.records,
		       m->alt ? "  ALT" : "",
		       !m->in_index ? "  (not in the index)" :
		       m->bytes == 0 ? "  (missing)" : "");
	}
}

static void print_text(const struct dbox_stats *s, bool files)
{
	char h[32];

	printf("storage files       %llu m.N, %llu bytes (%s)\n",
	       (unsigned long long)s->mfiles,
	       (unsigned long long)s->mfile_bytes, human(s->mfile_bytes, h));
	if (s->alt_mfiles > 0)
		printf("  of which in ALT   %llu m.N, %llu bytes (%s)\n",
		       (unsigned long long)s->alt_mfiles,
		       (unsigned long long)s->alt_bytes,
		       human(s->alt_bytes, h));
	if (s->missing_mfiles > 0)
		printf("not on disk         %llu m.N, %llu bytes by the index%s\n",
		       (unsigned long long)s->missing_mfiles,
		       (unsigned long long)s->missing_bytes,
		       s->missing_alt_mfiles == s->missing_mfiles ?
		       " (in the alternate storage)" :
		       s->missing_alt_mfiles > 0 ?
		       " (some in the alternate storage)" : "");
	printf("messages            %llu (%llu names)\n",
	       (unsigned long long)s->ix.messages,
	       (unsigned long long)s->ix.message_names);
	printf("live bytes          %llu (%s)\n",
	       (unsigned long long)s->ix.live_record_bytes,
	       human(s->ix.live_record_bytes, h));
	printf("dead bytes          %llu (%s), reclaimable by purge\n",
	       (unsigned long long)s->dead_bytes, human(s->dead_bytes, h));
	if (s->pending_bytes > 0 || s->ix.writing > 0)
		printf("being written       %llu messages, %llu bytes past the "
		       "committed ends\n", (unsigned long long)s->ix.writing,
		       (unsigned long long)s->pending_bytes);
	if (s->ix.unlinked > 0)
		printf("unlinked, open      %llu messages\n",
		       (unsigned long long)s->ix.unlinked);
	printf("plaintext bytes     %llu (%s)\n",
	       (unsigned long long)s->ix.plain_bytes, human(s->ix.plain_bytes, h));
	printf("stored body bytes   %llu (%s), compression ratio %.2f "
	       "(plaintext / stored)\n",
	       (unsigned long long)s->ix.body_bytes, human(s->ix.body_bytes, h),
	       ratio(s));
	printf("plain files         %llu\n", (unsigned long long)s->ix.files);
	printf("directories         %llu (the top one included)\n",
	       (unsigned long long)s->ix.dirs);
	if (s->purge_runs > 0)
		text_purge(s);
	text_folders(s);
	if (files)
		text_files(s);
}

static int stats_main(int argc, char **argv)
{
	static const char *const flags[] = { "--json", "--files", NULL };
	struct dbox_stats s;
	struct dbox_view *view = NULL;
	bool json = false, files = false, *flag_r[] = { &json, &files };
	int ret;

	if ((ret = adm_verb_begin(&adm_verb_stats, argc, argv, flags, flag_r,
				  1, "STORE")) != 0)
		return ret;
	if ((ret = adm_open_view(argv[0], &view)) != 0)
		return ret;
	ret = dbox_stats_get(view, files, &s);
	dbox_view_close(&view);
	if (ret < 0)
		adm_error("%s: reading the store: %s", argv[0], strerror(-ret));
	else if (json)
		print_json(&s, files);
	else
		print_text(&s, files);
	if (ret == 0 && fflush(stdout) != 0) {
		adm_error("writing the output: %s", strerror(errno));
		ret = -EIO;
	} else if (ret == 0 && s.missing_mfiles > 0) {
		/* The figures stand, but some mail cannot be read. */
		adm_error("%s: %llu m.N the index knows are not on disk%s; their "
			  "messages are unreadable (run 'dboxadm check')", argv[0],
			  (unsigned long long)s.missing_mfiles,
			  s.missing_alt_mfiles > 0 ?
			  " (the alternate storage is not available)" : "");
		ret = 1;
	}
	dbox_stats_free(&s);
	return ret == 0 ? ADM_EXIT_OK : ret == 1 || ret == -EIO ?
		ADM_EXIT_FAILED : ADM_EXIT_USAGE;
}

const struct adm_verb adm_verb_stats = {
	.name = "stats",
	.summary = "what a store holds, live and dead bytes (mounted or not)",
	.usage =
	"usage: dboxadm stats STORE [--json] [--files]\n"
	"\n"
	"Print the " DBOX_STORE_STORAGE "/m.N files and their bytes on disk, the messages, live\n"
	"bytes (records of messages that have a name), dead bytes (m.N bytes no\n"
	"live record uses: expunged or overwritten messages, reclaimable by\n"
	"purge), plaintext vs stored body bytes (compression ratio), and the\n"
	"messages per folder (names in UTF-8; as stored, in modified UTF-7, in\n"
	"parentheses and in --json's folders_raw), and what purges gave back so\n"
	"far.  Works while STORE is mounted.  Exit status 1 when m.N the index\n"
	"knows are not on disk (or their alternate storage is not available).\n"
	"\n"
	"  --json   one JSON object instead of text\n"
	"  --files  also each m.N: bytes, live and dead bytes, messages;\n"
	"           ALT for one in the alternate storage\n",
	.run = stats_main,
};
