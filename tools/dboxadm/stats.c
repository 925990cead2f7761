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
 * bytes are clamped at 0).
 */
#include "engine/maildir.h"
#include "engine/store-layout.h"
#include "dboxadm.h"
#include "dovecot-names.h"
#include "json.h"

#include "index/index-purge.h"
#include "index/index-stats.h"
#include "index/index.h"
#include "engine/purge.h"
#include "storage/dbox-file.h"
#include "storage/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct folder {
	char *name;       /* as stored: components in modified UTF-7 */
	char *display;    /* UTF-8 for people (may be name itself) */
	uint64_t count;
};

struct disk {
	uint64_t files, bytes, blocks_bytes, header_bytes, pending_bytes;
	uint64_t alt_files, alt_bytes; /* of those, in the alternate storage */
};

/* One m.N, for --files: on disk, and what the index says of it. */
struct mfile {
	uint32_t id;
	uint64_t bytes, header_bytes;
	bool in_index;
	struct dbox_file_usage usage;
};

struct stats {
	struct dbox_index *index;
	struct dbox_index_stats ix;
	struct disk disk;
	uint64_t dead_bytes;
	struct folder *folders;
	size_t nfolders, folders_size;
	struct mfile *mfiles;       /* by id, with --files */
	size_t nmfiles, mfiles_size;
	int64_t purge_runs, purge_freed, purge_files, purge_end_ns;
	int64_t purge_moved, purge_records;
	bool purge_moved_known;     /* the index has the moved totals */
};

static int add_folder(struct stats *s, const char *name, uint64_t count)
{
	for (size_t i = 0; i < s->nfolders; i++) {
		if (strcmp(s->folders[i].name, name) == 0) {
			s->folders[i].count += count;
			return 0;
		}
	}
	if (s->nfolders == s->folders_size) {
		size_t size = s->folders_size == 0 ? 16 : s->folders_size * 2;
		struct folder *f = realloc(s->folders, size * sizeof(*f));

		if (f == NULL)
			return -ENOMEM;
		s->folders = f;
		s->folders_size = size;
	}
	if ((s->folders[s->nfolders].name = strdup(name)) == NULL)
		return -ENOMEM;
	s->folders[s->nfolders].display = NULL;
	s->folders[s->nfolders++].count = count;
	return 0;
}

/* Messages in directory dir: counted for the folder it belongs to. */
static int dir_count_cb(void *ctx, uint64_t dir, uint64_t count)
{
	struct stats *s = ctx;
	char *dirname = NULL, *mailbox = NULL;
	bool maildir_sub;
	int ret;

	if ((ret = dbox_index_name_of(s->index, dir, &dirname)) < 0 &&
	    ret != -ENOENT)
		return ret;
	maildir_sub = dirname != NULL &&
		maildir_is_subdir(dirname, strlen(dirname));
	free(dirname);
	if (!maildir_sub)
		return add_folder(s, "(outside cur/new/tmp)", count);
	if ((ret = maildir_mailbox_name(s->index, dir, &mailbox)) < 0)
		return ret;
	ret = add_folder(s, mailbox, count);
	free(mailbox);
	return ret;
}

static int folder_cmp(const void *a, const void *b)
{
	return strcmp(((const struct folder *)a)->display,
		      ((const struct folder *)b)->display);
}

/* Give every folder its UTF-8 name, and sort by it.  A name that is not
   modified UTF-7 (a folder made with a UTF-8 name on the mount) is shown
   as it is; should two folders then show the same, both are shown as
   stored, so no two lines (JSON keys) are the same. */
static int decode_folders(struct stats *s)
{
	char *utf8;
	int ret;

	for (size_t i = 0; i < s->nfolders; i++) {
		struct folder *f = &s->folders[i];

		ret = maildir_mutf7_to_utf8(f->name, &utf8);
		if (ret == -ENOMEM)
			return ret;
		f->display = ret == 0 ? utf8 : f->name;
	}
	qsort(s->folders, s->nfolders, sizeof(*s->folders), folder_cmp);
	for (size_t i = 1; i < s->nfolders; i++) {
		struct folder *a = &s->folders[i - 1], *b = &s->folders[i];

		if (strcmp(a->display, b->display) != 0)
			continue;
		if (a->display != a->name)
			free(a->display);
		if (b->display != b->name)
			free(b->display);
		a->display = a->name;
		b->display = b->name;
	}
	qsort(s->folders, s->nfolders, sizeof(*s->folders), folder_cmp);
	return 0;
}

static int add_mfile(struct stats *s, uint32_t id, uint64_t bytes,
		     uint64_t header_bytes)
{
	struct mfile *m;

	if (s->nmfiles == s->mfiles_size) {
		size_t size = s->mfiles_size == 0 ? 64 : s->mfiles_size * 2;

		if ((m = realloc(s->mfiles, size * sizeof(*m))) == NULL)
			return -ENOMEM;
		s->mfiles = m;
		s->mfiles_size = size;
	}
	m = &s->mfiles[s->nmfiles++];
	memset(m, 0, sizeof(*m));
	m->id = id;
	m->bytes = bytes;
	m->header_bytes = header_bytes;
	return 0;
}

static int mfile_cmp(const void *a, const void *b)
{
	uint32_t x = ((const struct mfile *)a)->id;
	uint32_t y = ((const struct mfile *)b)->id;

	return x < y ? -1 : x > y;
}

/* The index's view of each m.N, joined to the files on disk. */
static int usage_cb(void *ctx, const struct dbox_file_usage *u)
{
	struct stats *s = ctx;
	struct mfile key = { .id = u->file_id }, *m;

	m = bsearch(&key, s->mfiles, s->nmfiles, sizeof(*m), mfile_cmp);
	if (m == NULL) {
		/* Known to the index, missing on disk. */
		if (add_mfile(s, u->file_id, 0, 0) < 0)
			return -ENOMEM;
		m = &s->mfiles[s->nmfiles - 1];
		m->usage = *u;
		m->in_index = true;
		qsort(s->mfiles, s->nmfiles, sizeof(*s->mfiles), mfile_cmp);
		return 0;
	}
	m->usage = *u;
	m->in_index = true;
	return 0;
}

/* Dead bytes of one m.N: committed bytes after the header that no
   message row uses (all of it when the index does not know the file). */
static uint64_t mfile_dead(const struct mfile *m)
{
	uint64_t used;

	if (!m->in_index)
		return m->bytes > m->header_bytes ? m->bytes - m->header_bytes : 0;
	used = m->header_bytes + m->usage.live_bytes;
	return m->usage.committed > used ? m->usage.committed - used : 0;
}

/* What storage/ (or ALT/storage/, alt) holds on disk, compared with the
   committed ends the index knows. */
static int scan_storage(struct stats *s, const char *store, bool alt)
{
	struct dirent *de;
	struct stat sb;
	DIR *d;
	int dfd;

	dfd = alt ? adm_open_alt_storage(store, s->index) :
		adm_open_in_store(store, DBOX_STORE_STORAGE, NULL, 0);
	if (alt && dfd < 0)
		return 0; /* none, or reported */
	if (dfd < 0)
		return dfd == -ENOENT ? 0 : dfd;
	if ((d = fdopendir(dfd)) == NULL) {
		close(dfd);
		return -errno;
	}
	dfd = dirfd(d);
	while ((de = readdir(d)) != NULL) {
		uint64_t committed;
		size_t header_len;
		uint32_t id;
		int fd;

		if (!dbox_mfile_parse_name(de->d_name, &id) ||
		    fstatat(dfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISREG(sb.st_mode))
			continue;
		s->disk.files++;
		s->disk.bytes += (uint64_t)sb.st_size;
		if (alt) {
			s->disk.alt_files++;
			s->disk.alt_bytes += (uint64_t)sb.st_size;
		}
		s->disk.blocks_bytes += (uint64_t)sb.st_blocks * 512;
		header_len = 0;
		fd = openat(dfd, de->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (fd >= 0) {
			if (dbox_file_read_header(fd, &header_len) == 0)
				s->disk.header_bytes += header_len;
			else
				header_len = 0;
			close(fd);
		}
		if (add_mfile(s, id, (uint64_t)sb.st_size, header_len) < 0) {
			closedir(d);
			return -ENOMEM;
		}
		/* An m.N the index does not know is all dead. */
		if (dbox_index_mfile_get(s->index, id, &committed) == 0 &&
		    (uint64_t)sb.st_size > committed)
			s->disk.pending_bytes += (uint64_t)sb.st_size - committed;
	}
	closedir(d);
	return 0;
}

static double ratio(const struct stats *s)
{
	return s->ix.body_bytes == 0 ? 1.0 :
		(double)s->ix.plain_bytes / (double)s->ix.body_bytes;
}

static void print_json(const struct stats *s, bool files)
{
	printf("{\n"
	       "  \"mfiles\": %llu,\n"
	       "  \"mfile_bytes\": %llu,\n"
	       "  \"mfile_disk_usage\": %llu,\n"
	       "  \"alt_mfiles\": %llu,\n"
	       "  \"alt_mfile_bytes\": %llu,\n"
	       "  \"messages\": %llu,\n"
	       "  \"message_names\": %llu,\n"
	       "  \"live_bytes\": %llu,\n"
	       "  \"dead_bytes\": %llu,\n"
	       "  \"pending_bytes\": %llu,\n"
	       "  \"header_bytes\": %llu,\n"
	       "  \"messages_writing\": %llu,\n"
	       "  \"messages_unlinked_open\": %llu,\n"
	       "  \"plaintext_bytes\": %llu,\n"
	       "  \"stored_body_bytes\": %llu,\n"
	       "  \"compression_ratio\": %.4f,\n"
	       "  \"plain_files\": %llu,\n"
	       "  \"directories\": %llu,\n"
	       "  \"purge_runs\": %lld,\n"
	       "  \"purge_bytes_freed\": %lld,\n"
	       "  \"purge_files_removed\": %lld,\n"
	       "  \"purge_last_end_ns\": %lld,\n",
	       (unsigned long long)s->disk.files,
	       (unsigned long long)s->disk.bytes,
	       (unsigned long long)s->disk.blocks_bytes,
	       (unsigned long long)s->disk.alt_files,
	       (unsigned long long)s->disk.alt_bytes,
	       (unsigned long long)s->ix.messages,
	       (unsigned long long)s->ix.message_names,
	       (unsigned long long)s->ix.live_record_bytes,
	       (unsigned long long)s->dead_bytes,
	       (unsigned long long)s->disk.pending_bytes,
	       (unsigned long long)s->disk.header_bytes,
	       (unsigned long long)s->ix.writing,
	       (unsigned long long)s->ix.unlinked,
	       (unsigned long long)s->ix.plain_bytes,
	       (unsigned long long)s->ix.body_bytes,
	       ratio(s),
	       (unsigned long long)s->ix.files,
	       (unsigned long long)s->ix.dirs,
	       (long long)s->purge_runs, (long long)s->purge_freed,
	       (long long)s->purge_files, (long long)s->purge_end_ns);
	/* As `dboxadm purge` prints them; null when not recorded. */
	if (s->purge_moved_known)
		printf("  \"purge_records_moved\": %lld,\n"
		       "  \"purge_bytes_moved\": %lld,\n"
		       "  \"purge_bytes_given_back\": %lld,\n",
		       (long long)s->purge_records, (long long)s->purge_moved,
		       (long long)(s->purge_freed - s->purge_moved));
	else
		printf("  \"purge_records_moved\": null,\n"
		       "  \"purge_bytes_moved\": null,\n"
		       "  \"purge_bytes_given_back\": null,\n");
	printf("  \"folders\": {");
	for (size_t i = 0; i < s->nfolders; i++) {
		printf("%s\n    ", i == 0 ? "" : ",");
		adm_json_string(stdout, s->folders[i].display);
		printf(": %llu", (unsigned long long)s->folders[i].count);
	}
	printf("%s},\n  \"folders_raw\": {", s->nfolders > 0 ? "\n  " : "");
	for (size_t i = 0; i < s->nfolders; i++) {
		printf("%s\n    ", i == 0 ? "" : ",");
		adm_json_string(stdout, s->folders[i].display);
		printf(": ");
		adm_json_string(stdout, s->folders[i].name);
	}
	printf("%s}", s->nfolders > 0 ? "\n  " : "");
	if (files) {
		printf(",\n  \"files\": [");
		for (size_t i = 0; i < s->nmfiles; i++) {
			const struct mfile *m = &s->mfiles[i];

			printf("%s\n    {\"file\": \"m.%u\", \"bytes\": %llu, "
			       "\"committed\": %llu, \"live_bytes\": %llu, "
			       "\"dead_bytes\": %llu, \"records\": %llu, "
			       "\"in_index\": %s}", i == 0 ? "" : ",", m->id,
			       (unsigned long long)m->bytes,
			       (unsigned long long)m->usage.committed,
			       (unsigned long long)m->usage.live_bytes,
			       (unsigned long long)mfile_dead(m),
			       (unsigned long long)m->usage.records,
			       m->in_index ? "true" : "false");
		}
		printf("%s]", s->nmfiles > 0 ? "\n  " : "");
	}
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

static void print_text(const struct stats *s, bool files)
{
	char h[32];

	printf("storage files       %llu m.N, %llu bytes (%s)\n",
	       (unsigned long long)s->disk.files,
	       (unsigned long long)s->disk.bytes, human(s->disk.bytes, h));
	if (s->disk.alt_files > 0)
		printf("  of which in ALT   %llu m.N, %llu bytes (%s)\n",
		       (unsigned long long)s->disk.alt_files,
		       (unsigned long long)s->disk.alt_bytes,
		       human(s->disk.alt_bytes, h));
	printf("messages            %llu (%llu names)\n",
	       (unsigned long long)s->ix.messages,
	       (unsigned long long)s->ix.message_names);
	printf("live bytes          %llu (%s)\n",
	       (unsigned long long)s->ix.live_record_bytes,
	       human(s->ix.live_record_bytes, h));
	printf("dead bytes          %llu (%s), reclaimable by purge\n",
	       (unsigned long long)s->dead_bytes, human(s->dead_bytes, h));
	if (s->disk.pending_bytes > 0 || s->ix.writing > 0)
		printf("being written       %llu messages, %llu bytes past the "
		       "committed ends\n", (unsigned long long)s->ix.writing,
		       (unsigned long long)s->disk.pending_bytes);
	if (s->ix.unlinked > 0)
		printf("unlinked, open      %llu messages\n",
		       (unsigned long long)s->ix.unlinked);
	printf("plaintext bytes     %llu (%s)\n",
	       (unsigned long long)s->ix.plain_bytes, human(s->ix.plain_bytes, h));
	printf("stored body bytes   %llu (%s), compression ratio %.2f\n",
	       (unsigned long long)s->ix.body_bytes, human(s->ix.body_bytes, h),
	       ratio(s));
	printf("plain files         %llu\n", (unsigned long long)s->ix.files);
	printf("directories         %llu\n", (unsigned long long)s->ix.dirs);
	if (s->purge_runs > 0) {
		/* The words and quantities of `dboxadm purge`, summed. */
		printf("purge runs          %lld\n"
		       "files removed       %lld (%lld bytes)\n",
		       (long long)s->purge_runs, (long long)s->purge_files,
		       (long long)s->purge_freed);
		if (s->purge_moved_known)
			printf("records moved       %lld (%lld bytes)\n"
			       "bytes given back    %lld\n",
			       (long long)s->purge_records,
			       (long long)s->purge_moved,
			       (long long)(s->purge_freed - s->purge_moved));
		else
			printf("records moved       not recorded (purged by an "
			       "older dboxfs)\n"
			       "bytes given back    not known\n");
	}
	printf("messages per folder\n");
	for (size_t i = 0; i < s->nfolders; i++) {
		const struct folder *f = &s->folders[i];
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
	if (!files)
		return;
	printf("storage files       %12s %12s %12s %5s %8s\n", "bytes",
	       "live", "dead", "dead%", "messages");
	for (size_t i = 0; i < s->nmfiles; i++) {
		const struct mfile *m = &s->mfiles[i];
		uint64_t dead = mfile_dead(m);
		uint64_t data = m->bytes > m->header_bytes ?
			m->bytes - m->header_bytes : 0;
		char name[24];

		snprintf(name, sizeof(name), "m.%u", m->id);
		printf("  %-17s %12llu %12llu %12llu %4llu%% %8llu%s\n", name,
		       (unsigned long long)m->bytes,
		       (unsigned long long)m->usage.live_bytes,
		       (unsigned long long)dead,
		       (unsigned long long)(data > 0 ? dead * 100 / data : 0),
		       (unsigned long long)m->usage.records,
		       !m->in_index ? "  (not in the index)" :
		       m->bytes == 0 ? "  (missing)" : "");
	}
}

static int stats_main(int argc, char **argv)
{
	static const char *const flags[] = { "--json", "--files", NULL };
	struct stats s = { 0 };
	bool json = false, files = false, *flag_r[] = { &json, &files };
	uint64_t used;
	int npos, ret;

	if ((ret = adm_parse_args(&adm_verb_stats, argc, argv, flags, flag_r,
				  &npos)) != 0)
		return ret;
	if (npos != 1)
		return adm_usage_error(&adm_verb_stats, "stats: need STORE");
	if ((ret = adm_store_enter(argv[0])) != 0)
		return ret;
	if ((ret = adm_open_index(argv[0], &s.index)) != 0)
		return ret;
	ret = dbox_index_snapshot_begin(s.index);
	if (ret == 0)
		ret = dbox_index_stats_get(s.index, &s.ix);
	if (ret == 0)
		ret = dbox_index_stats_per_dir(s.index, dir_count_cb, &s);
	if (ret == 0) /* empty folders too, with 0 */
		ret = dbox_index_stats_maildirs(s.index, dir_count_cb, &s);
	if (ret == 0)
		ret = scan_storage(&s, argv[0], false);
	if (ret == 0)
		ret = scan_storage(&s, argv[0], true);
	if (ret == 0 && s.nmfiles > 1)
		qsort(s.mfiles, s.nmfiles, sizeof(*s.mfiles), mfile_cmp);
	if (ret == 0 && files)
		ret = dbox_index_file_usage_all(s.index, usage_cb, &s);
	if (ret == 0) {
		dbox_index_meta_get(s.index, DBOX_META_PURGE_RUNS, &s.purge_runs);
		dbox_index_meta_get(s.index, DBOX_META_PURGE_FREED,
				    &s.purge_freed);
		dbox_index_meta_get(s.index, DBOX_META_PURGE_FILES,
				    &s.purge_files);
		dbox_index_meta_get(s.index, DBOX_META_PURGE_END,
				    &s.purge_end_ns);
		s.purge_moved_known =
			dbox_index_meta_get(s.index, DBOX_META_PURGE_MOVED,
					    &s.purge_moved) == 0;
		dbox_index_meta_get(s.index, DBOX_META_PURGE_RECORDS,
				    &s.purge_records);
		if (s.purge_runs == 0)
			s.purge_moved_known = true; /* nothing to know */
	}
	dbox_index_snapshot_end(s.index);
	if (ret == 0) {
		used = s.disk.header_bytes + s.ix.live_record_bytes +
		       s.disk.pending_bytes;
		s.dead_bytes = s.disk.bytes > used ? s.disk.bytes - used : 0;
		ret = decode_folders(&s);
	}
	if (ret == 0) {
		if (json)
			print_json(&s, files);
		else
			print_text(&s, files);
	} else {
		adm_error("%s: reading the store: %s", argv[0], strerror(-ret));
	}
	for (size_t i = 0; i < s.nfolders; i++) {
		if (s.folders[i].display != s.folders[i].name)
			free(s.folders[i].display);
		free(s.folders[i].name);
	}
	free(s.folders);
	free(s.mfiles);
	dbox_index_close(&s.index);
	if (ret == 0 && fflush(stdout) != 0) {
		adm_error("writing the output: %s", strerror(errno));
		return ADM_EXIT_FAILED;
	}
	return ret == 0 ? ADM_EXIT_OK : ADM_EXIT_USAGE;
}

const struct adm_verb adm_verb_stats = {
	.name = "stats",
	.summary = "what a store holds, live and dead bytes (mounted or not)",
	.usage =
	"usage: dboxadm stats STORE [--json] [--files]\n"
	"\n"
	"Print the storage/m.N files and their bytes on disk, the messages, live\n"
	"bytes (records of messages that have a name), dead bytes (m.N bytes no\n"
	"live record uses: expunged or overwritten messages, reclaimable by\n"
	"purge), plaintext vs stored body bytes (compression ratio), and the\n"
	"messages per folder (names in UTF-8; as stored, in modified UTF-7, in\n"
	"parentheses and in --json's folders_raw), and what purges gave back so\n"
	"far.  Works while STORE is mounted.\n"
	"\n"
	"  --json   one JSON object instead of text\n"
	"  --files  also each m.N: bytes, live and dead bytes, messages\n",
	.run = stats_main,
};
