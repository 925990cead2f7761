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
 *   messages per folder (the Dovecot mailbox name of their cur/new/tmp)
 *
 * Works while the store is mounted: the index is opened without the store
 * lock and read inside one snapshot.  The storage/ listing is taken after
 * the snapshot, so on a busy mount the byte split is approximate (dead
 * bytes are clamped at 0).
 */
#include "dboxadm.h"
#include "json.h"

#include "index/index-stats.h"
#include "index/index.h"
#include "storage/dbox-file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct folder {
	char *name;
	uint64_t count;
};

struct disk {
	uint64_t files, bytes, blocks_bytes, header_bytes, pending_bytes;
};

struct stats {
	struct dbox_index *index;
	struct dbox_index_stats ix;
	struct disk disk;
	uint64_t dead_bytes;
	struct folder *folders;
	size_t nfolders, folders_size;
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
		(strcmp(dirname, "cur") == 0 || strcmp(dirname, "new") == 0 ||
		 strcmp(dirname, "tmp") == 0);
	free(dirname);
	if (!maildir_sub)
		return add_folder(s, "(outside cur/new/tmp)", count);
	if ((ret = dbox_index_mailbox_name(s->index, dir, &mailbox)) < 0)
		return ret;
	ret = add_folder(s, mailbox, count);
	free(mailbox);
	return ret;
}

static int folder_cmp(const void *a, const void *b)
{
	return strcmp(((const struct folder *)a)->name,
		      ((const struct folder *)b)->name);
}

/* Parse "m.<N>" into *id_r. */
static bool mfile_id(const char *name, uint32_t *id_r)
{
	char *end;
	unsigned long id;

	if (strncmp(name, "m.", 2) != 0 || name[2] < '0' || name[2] > '9')
		return false;
	errno = 0;
	id = strtoul(name + 2, &end, 10);
	if (*end != '\0' || errno != 0 || id > UINT32_MAX)
		return false;
	*id_r = (uint32_t)id;
	return true;
}

/* What storage/ holds on disk, compared with the committed ends the index
   knows. */
static int scan_storage(struct stats *s, const char *store)
{
	struct dirent *de;
	struct stat sb;
	char *path;
	DIR *d;
	int dfd;

	if (asprintf(&path, "%s/storage", store) < 0)
		return -ENOMEM;
	d = opendir(path);
	free(path);
	if (d == NULL)
		return errno == ENOENT ? 0 : -errno;
	dfd = dirfd(d);
	while ((de = readdir(d)) != NULL) {
		uint64_t committed;
		size_t header_len;
		uint32_t id;
		int fd;

		if (!mfile_id(de->d_name, &id) ||
		    fstatat(dfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISREG(sb.st_mode))
			continue;
		s->disk.files++;
		s->disk.bytes += (uint64_t)sb.st_size;
		s->disk.blocks_bytes += (uint64_t)sb.st_blocks * 512;
		fd = openat(dfd, de->d_name, O_RDONLY | O_CLOEXEC);
		if (fd >= 0) {
			if (dbox_file_read_header(fd, &header_len) == 0)
				s->disk.header_bytes += header_len;
			close(fd);
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

static void print_json(const struct stats *s)
{
	printf("{\n"
	       "  \"mfiles\": %llu,\n"
	       "  \"mfile_bytes\": %llu,\n"
	       "  \"mfile_disk_usage\": %llu,\n"
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
	       "  \"folders\": {",
	       (unsigned long long)s->disk.files,
	       (unsigned long long)s->disk.bytes,
	       (unsigned long long)s->disk.blocks_bytes,
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
	       (unsigned long long)s->ix.dirs);
	for (size_t i = 0; i < s->nfolders; i++) {
		printf("%s\n    ", i == 0 ? "" : ",");
		adm_json_string(stdout, s->folders[i].name);
		printf(": %llu", (unsigned long long)s->folders[i].count);
	}
	printf("%s}\n}\n", s->nfolders > 0 ? "\n  " : "");
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

static void print_text(const struct stats *s)
{
	char h[32];

	printf("storage files       %llu m.N, %llu bytes (%s)\n",
	       (unsigned long long)s->disk.files,
	       (unsigned long long)s->disk.bytes, human(s->disk.bytes, h));
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
	printf("messages per folder\n");
	for (size_t i = 0; i < s->nfolders; i++)
		printf("  %10llu  %s\n", (unsigned long long)s->folders[i].count,
		       s->folders[i].name);
}

static int stats_main(int argc, char **argv)
{
	static const char *const flags[] = { "--json", NULL };
	struct stats s = { 0 };
	bool json = false, *flag_r[] = { &json };
	uint64_t used;
	int npos, ret;

	if ((ret = adm_parse_args(&adm_verb_stats, argc, argv, flags, flag_r,
				  &npos)) != 0)
		return ret;
	if (npos != 1)
		return adm_usage_error(&adm_verb_stats, "stats: need STORE");
	if ((ret = adm_open_index(argv[0], &s.index)) != 0)
		return ret;
	ret = dbox_index_snapshot_begin(s.index);
	if (ret == 0)
		ret = dbox_index_stats_get(s.index, &s.ix);
	if (ret == 0)
		ret = dbox_index_stats_per_dir(s.index, dir_count_cb, &s);
	if (ret == 0)
		ret = scan_storage(&s, argv[0]);
	dbox_index_snapshot_end(s.index);
	if (ret == 0) {
		used = s.disk.header_bytes + s.ix.live_record_bytes +
		       s.disk.pending_bytes;
		s.dead_bytes = s.disk.bytes > used ? s.disk.bytes - used : 0;
		if (s.nfolders > 1)
			qsort(s.folders, s.nfolders, sizeof(*s.folders),
			      folder_cmp);
		if (json)
			print_json(&s);
		else
			print_text(&s);
	} else {
		adm_error("%s: reading the store: %s", argv[0], strerror(-ret));
	}
	for (size_t i = 0; i < s.nfolders; i++)
		free(s.folders[i].name);
	free(s.folders);
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
	"usage: dboxadm stats STORE [--json]\n"
	"\n"
	"Print the storage/m.N files and their bytes on disk, the messages, live\n"
	"bytes (records of messages that have a name), dead bytes (m.N bytes no\n"
	"live record uses: expunged or overwritten messages, reclaimable by\n"
	"purge), plaintext vs stored body bytes (compression ratio), and the\n"
	"messages per folder.  Works while STORE is mounted.\n"
	"\n"
	"  --json   one JSON object instead of text\n",
	.run = stats_main,
};
