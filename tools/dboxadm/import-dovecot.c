/*
 * import-dovecot.c: dboxadm import-dovecot STORE DOVECOT_MDBOX_ROOT - adopt
 * a Dovecot mdbox store in place: its storage/m.N files become m.N files
 * of STORE by hard link (no message byte is copied or changed), and the
 * index gets the Maildir++ tree Dovecot's indexes describe.
 *
 * Where the facts come from:
 *   folders, UIDs, flags, keywords, received dates, sizes, refcounts
 *       `doveadm fetch` / `doveadm mailbox status` run against the root
 *       (direct mode: no Dovecot server; a temporary dovecot.conf with
 *       mail_location=mdbox:ROOT).  Dovecot reads its own map and mailbox
 *       indexes - base files plus transaction logs - the only place these
 *       facts are kept; docs/dovecot.md says why this beats
 *       parsing those files here.
 *   where each message's bytes are
 *       a walk of ROOT/storage/m.N (our own dbox reader): GUID -> file,
 *       offset, sizes.  doveadm does not print map locations; the GUID
 *       (with the plaintext size, as Dovecot's rebuild matches
 *       duplicates) finds the record.
 *
 * What is made:
 *   mailbox "INBOX" -> the root, "A/B" -> ".A.B" (dovecot-names.h), each
 *     with cur/ new/ tmp/, "maildirfolder" (not INBOX), "dovecot-keywords"
 *     (when keywords are used: "<index> <name>" lines) and
 *     "dovecot-uidlist" (UIDVALIDITY, next UID, mailbox GUID and a line per
 *     message), so Dovecot on the mount keeps the same UIDs;
 *   message -> "<received>.V<uidvalidity>U<uid>.dovecot-import,S=<size>,
 *     W=<vsize>" in new/ when it is \Recent with no other flag or keyword
 *     (as Dovecot's maildir keeps it), else in cur/ with ":2,<letters>";
 *     mtime = date.received; one inode for all the mailboxes sharing a
 *     stored message (refcount > 1), so st_nlink = refcount;
 *   expunged-but-not-purged messages (refcount 0) are in no mailbox and so
 *     are not adopted; their bytes stay as dead bytes until a purge.
 *
 * Crash safety: the m.N are linked as storage/.import-m.N (names recovery
 * and purge do not touch - recovery cuts m.N files the index does not
 * know, which would cut the shared inode); everything goes into the index
 * in one durable transaction; then the links are renamed to m.N.  A run
 * that died before the commit left only .import-m.N links: the next run
 * removes them.  One that died after it left links the index knows but
 * without their final name: the next run (of any arguments) renames them.
 * New mail goes to a new, empty m.N (the adopted files are never appended
 * to), so the Dovecot root keeps its bytes as they were.
 */
#include "engine/maildir.h"
#include "engine/store-layout.h"
#include "dboxadm.h"
#include "dovecot-names.h"
#include "progress.h"

#include "engine/store.h"
#include "storage/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define STAGE_PREFIX ".import-"
#define FETCH_FIELDS "uid guid flags refcount date.received.unixtime " \
	"size.physical size.virtual mailbox"
#define MAX_KEYWORDS 26

/* A record found in the Dovecot m.N files. */
struct rec {
	char guid[DBOX_GUID_HEX_LEN * 2 + 1];
	uint32_t dfile;          /* Dovecot's m.<dfile> */
	bool alt;                /* in Dovecot's ALT=/storage */
	uint64_t offset, body_size, record_size, plain_size;
	bool external;           /* X metadata: external attachments */
	uint64_t ino;            /* our message inode, 0 until adopted */
	unsigned int names, refcount;
};

/* A Dovecot m.N that holds adopted messages. */
struct adopted {
	uint32_t dfile, file_id; /* Dovecot's id, ours */
	bool alt;                /* from Dovecot's ALT, into STORE's ALT */
	uint64_t size;
};

struct folder {
	char *mailbox;           /* Dovecot name (UTF-8) */
	uint64_t dir, cur, new;  /* index inodes */
	uint32_t uidvalidity, uidnext;
	char guid[64];
	char *keywords[MAX_KEYWORDS];
	size_t nkeywords;
	bool kw_overflow;
	int uidlist_fd;          /* backing file of dovecot-uidlist, or -1 */
	uint64_t messages;
};

struct imp {
	struct dbox_store *st;
	struct dbox_index *index;
	const char *root;
	int storage_dfd;         /* ROOT/storage */
	int alt_dfd;             /* Dovecot's ALT/storage, or -1 */
	const char *dalt;        /* Dovecot's ALT root (--dovecot-alt) */
	char *location;          /* mail_location */
	const char *doveadm;
	char tmpdir[64];
	bool tmpdir_made;
	char *conf;
	uid_t owner_uid;
	gid_t owner_gid;
	bool zlib;               /* load Dovecot's zlib plugin */
	bool zlib_missing;       /* doveadm said it cannot load that plugin */
	bool committed;          /* the index transaction is durable */
	struct progress progress;

	struct rec *recs;
	size_t nrecs, recs_size;
	struct adopted *files;
	size_t nfiles, files_size;
	struct folder *folders;
	size_t nfolders, folders_size;
	size_t last_folder;

	unsigned long messages, links, failed, not_found, warnings;
	bool fatal;
};

static void fatal(struct imp *imp, const char *what, int err)
{
	if (!imp->fatal)
		adm_error("%s: %s", what, strerror(err));
	imp->fatal = true;
}

/* --- doveadm ------------------------------------------------------------ */

/* The temporary dovecot.conf doveadm runs with: the root as its only
   namespace, '/' as separator, doveadm's privileges = the owner of the
   root (doveadm drops to them when run as root), and the zlib plugin, so
   that compressed mail is read as Dovecot wrote it (without it Dovecot
   takes a compressed body for a broken one and drops cached sizes). */
static int write_config(struct imp *imp)
{
	FILE *f;

	if (!imp->tmpdir_made) {
		if (mkdtemp(imp->tmpdir) == NULL)
			return -errno;
		imp->tmpdir_made = true;
	}
	if (imp->conf == NULL &&
	    asprintf(&imp->conf, "%s/dovecot.conf", imp->tmpdir) < 0) {
		imp->conf = NULL;
		return -ENOMEM;
	}
	if ((f = fopen(imp->conf, "w")) == NULL)
		return -errno;
	fprintf(f,
		"# written by dboxadm import-dovecot for one run\n"
		"mail_location = %s\n"
		"base_dir = %s\n"
		"state_dir = %s\n"
		"log_path = /dev/stderr\n"
		"protocols =\n"
		"ssl = no\n"
		"mail_uid = %u\n"
		"mail_gid = %u\n"
		"first_valid_uid = %u\n"
		"first_valid_gid = %u\n"
		"%s"
		"namespace inbox {\n"
		"  inbox = yes\n"
		"  separator = /\n"
		"}\n",
		imp->location, imp->tmpdir, imp->tmpdir,
		(unsigned)imp->owner_uid, (unsigned)imp->owner_gid,
		(unsigned)imp->owner_uid, (unsigned)imp->owner_gid,
		imp->zlib ? "mail_plugins = zlib\n" : "");
	if (fclose(f) != 0)
		return -errno;
	/* doveadm chdirs to its home (this directory) as the owner. */
	if (geteuid() == 0 &&
	    chown(imp->tmpdir, imp->owner_uid, imp->owner_gid) < 0)
		return -errno;
	return 0;
}

static void remove_config(struct imp *imp)
{
	if (imp->conf != NULL)
		unlink(imp->conf);
	if (imp->tmpdir_made)
		rmdir(imp->tmpdir);
	free(imp->conf);
}

typedef int line_cb_t(struct imp *imp, char **fields, size_t nfields);

/* Pass what doveadm wrote to stderr (the memfd errfd) on to ours, and
   note whether it says the zlib plugin cannot be loaded: Dovecot's
   module loader names the plugin ("Plugin 'zlib' not found from
   directory ...") or its file (lib20_zlib_plugin.so, when dlopen
   fails).  Any other error is doveadm's own and is not retried. */
static void doveadm_errors(struct imp *imp, int errfd)
{
	char buf[4096], *text = NULL;
	size_t len = 0;
	FILE *mem = open_memstream(&text, &len);
	ssize_t n;
	off_t off = 0;

	while ((n = pread(errfd, buf, sizeof(buf), off)) > 0) {
		fwrite(buf, 1, (size_t)n, stderr);
		if (mem != NULL)
			fwrite(buf, 1, (size_t)n, mem);
		off += n;
	}
	if (mem == NULL || fclose(mem) != 0)
		return;
	if (strstr(text, "Plugin 'zlib'") != NULL ||
	    strstr(text, "_zlib_plugin") != NULL)
		imp->zlib_missing = true;
	free(text);
}

/* Run `doveadm -c CONF -f tab ARGS...` and call cb for every line after
   the header, with the fields in the order of names (columns found by
   the header; -EPROTO when one is missing).  Returns 0 or a negative
   errno (reported). */
static int run_doveadm(struct imp *imp, const char *const *args,
		       const char *const *names, size_t nnames, line_cb_t *cb)
{
	const char *argv[16];
	size_t argc = 0, col[16], ncols = 0;
	char *line = NULL, *fields[32], *ordered[16];
	size_t line_size = 0;
	int pipefd[2], errfd, status, ret = 0;
	bool header = true;
	ssize_t len;
	pid_t pid;
	FILE *in;

	argv[argc++] = imp->doveadm;
	argv[argc++] = "-c";
	argv[argc++] = imp->conf;
	argv[argc++] = "-f";
	argv[argc++] = "tab";
	for (size_t i = 0; args[i] != NULL && argc < 15; i++)
		argv[argc++] = args[i];
	argv[argc] = NULL;
	/* doveadm's stderr is kept to be told apart (see doveadm_errors)
	   and then passed on as it was. */
	if ((errfd = memfd_create("doveadm-stderr", MFD_CLOEXEC)) < 0)
		return -errno;
	if (pipe2(pipefd, O_CLOEXEC) < 0) {
		ret = -errno;
		close(errfd);
		return ret;
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		ret = -errno;
		close(pipefd[0]);
		close(pipefd[1]);
		close(errfd);
		return ret;
	}
	if (pid == 0) {
		dup2(pipefd[1], STDOUT_FILENO);
		dup2(errfd, STDERR_FILENO);
		/* Only what doveadm needs; USER names the (static) user. */
		clearenv();
		setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:"
		       "/usr/bin:/sbin:/bin", 1);
		setenv("USER", "dboxadm", 1);
		setenv("HOME", imp->tmpdir, 1);
		execvp(argv[0], (char *const *)argv);
		dprintf(STDERR_FILENO, "dboxadm: cannot run %s: %s%s\n",
			argv[0], strerror(errno), errno == ENOENT ?
			" (install Dovecot: apt-get install dovecot-core, or "
			"give --doveadm=PATH)" : "");
		_exit(127);
	}
	close(pipefd[1]);
	in = fdopen(pipefd[0], "r");
	if (in == NULL) {
		ret = -errno;
		close(pipefd[0]);
	}
	while (in != NULL && (len = getline(&line, &line_size, in)) >= 0) {
		size_t n;

		if (len > 0 && line[len - 1] == '\n')
			line[--len] = '\0';
		if (ret < 0 || imp->fatal)
			continue; /* drain, so doveadm is not killed by EPIPE */
		n = dovecot_tab_split(line, fields, 32);
		if (header) {
			header = false;
			for (size_t i = 0; i < nnames && ret == 0; i++) {
				size_t c;

				for (c = 0; c < n && strcmp(fields[c], names[i]) != 0; c++)
					;
				if (c == n) {
					adm_error("doveadm %s printed no '%s' "
						  "column", args[0], names[i]);
					ret = -EPROTO;
				}
				col[ncols++] = c;
			}
			continue;
		}
		if (n < ncols || (n == 1 && *fields[0] == '\0'))
			continue;
		for (size_t i = 0; i < nnames; i++)
			ordered[i] = fields[col[i]];
		ret = cb(imp, ordered, nnames);
	}
	free(line);
	if (in != NULL)
		fclose(in);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	doveadm_errors(imp, errfd);
	close(errfd);
	if (ret == 0 && (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
		adm_error("doveadm %s failed (exit %d; its messages are above)",
			  args[0], WIFEXITED(status) ? WEXITSTATUS(status) : -1);
		ret = -EIO;
	}
	return ret;
}

/* --- the m.N walk ------------------------------------------------------- */

struct walk_ctx {
	struct imp *imp;
	uint32_t dfile;
	bool alt;
};

static int walk_cb(void *ctx, uint64_t offset, uint64_t body_size,
		   const struct dbox_metadata *md, uint64_t record_size)
{
	struct walk_ctx *w = ctx;
	struct imp *imp = w->imp;
	struct rec *recs, *r;

	recs = adm_grow(imp->recs, imp->nrecs, &imp->recs_size, sizeof(*recs));
	if (recs == NULL)
		return -ENOMEM;
	imp->recs = recs;
	r = &recs[imp->nrecs++];
	memset(r, 0, sizeof(*r));
	snprintf(r->guid, sizeof(r->guid), "%s", md->guid);
	r->dfile = w->dfile;
	r->alt = w->alt;
	r->offset = offset;
	r->body_size = body_size;
	r->record_size = record_size;
	r->plain_size = md->has_plain_size ? md->plain_size : body_size;
	r->external = md->extra != NULL &&
		(md->extra[0] == 'X' || strstr(md->extra, "\nX") != NULL);
	return 0;
}

static int rec_cmp(const void *a, const void *b)
{
	const struct rec *x = a, *y = b;
	int c = strcmp(x->guid, y->guid);

	if (c != 0)
		return c;
	if (x->dfile != y->dfile)
		return x->dfile < y->dfile ? -1 : 1;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Every record of ROOT/storage/m.* (or of Dovecot's ALT/storage/m.*),
   added to imp->recs, sorted by GUID. */
static int walk_storage(struct imp *imp, int dfd, bool alt)
{
	const char *root = alt ? imp->dalt : imp->root;
	DIR *dir = fdopendir(dup(dfd));
	struct dirent *de;
	int ret = 0;

	if (dir == NULL)
		return -errno;
	rewinddir(dir);
	while (ret == 0 && (de = readdir(dir)) != NULL) {
		struct walk_ctx w = { .imp = imp, .alt = alt };
		uint64_t bad = 0;
		int fd, r;

		if (!dbox_mfile_parse_name(de->d_name, &w.dfile))
			continue;
		fd = openat(dfd, de->d_name, O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			adm_error("%s/storage/%s: %s", root, de->d_name,
				  strerror(errno));
			imp->failed++;
			continue;
		}
		r = dbox_file_walk(fd, w.dfile, walk_cb, &w, &bad);
		close(fd);
		if (r == -ENOMEM) {
			ret = r;
		} else if (r != 0) {
			adm_warning("%s/storage/%s: corrupt record at %llu; "
				    "messages after it cannot be found (run "
				    "'doveadm force-resync' first)", root,
				    de->d_name, (unsigned long long)bad);
			imp->warnings++;
		}
	}
	closedir(dir);
	if (ret == 0 && imp->nrecs > 1)
		qsort(imp->recs, imp->nrecs, sizeof(*imp->recs), rec_cmp);
	return ret;
}

/* The record of guid whose plaintext size is size: the first of equal
   ones (Dovecot's rebuild treats same GUID + size as duplicates). */
static struct rec *find_rec(struct imp *imp, const char *guid, uint64_t size)
{
	size_t lo = 0, hi = imp->nrecs;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (strcmp(imp->recs[mid].guid, guid) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < imp->nrecs && strcmp(imp->recs[lo].guid, guid) == 0; lo++)
		if (imp->recs[lo].plain_size == size)
			return &imp->recs[lo];
	return NULL;
}

/* --- storage: staging links --------------------------------------------- */

static void stage_name(char buf[32], uint32_t file_id)
{
	snprintf(buf, 32, STAGE_PREFIX "m.%u", file_id);
}

/* Our directory of an adopted file: STORE/storage or ALT/storage. */
static int our_dir(const struct imp *imp, bool alt)
{
	return alt ? imp->st->alt_fd : imp->st->storage_fd;
}

/* Our file id for Dovecot's m.<dfile> (in its ALT when alt), linking it
   in (staged) the first time: into STORE/storage, or from Dovecot's ALT
   into the store's ALT/storage. */
static int adopt_file(struct imp *imp, bool alt, uint32_t dfile,
		      uint32_t *file_id_r)
{
	struct dbox_store *st = imp->st;
	struct adopted *files, *a;
	char src[32], dst[32];
	struct stat sb;
	int dfd = alt ? imp->alt_dfd : imp->storage_dfd;
	int our = our_dir(imp, alt);
	const char *root = alt ? imp->dalt : imp->root;

	if (our < 0) {
		adm_error("%s/storage/m.%u: in Dovecot's alternate storage, "
			  "and the store has none: give --alt=PATH", root,
			  dfile);
		return -ENOENT;
	}
	for (size_t i = 0; i < imp->nfiles; i++) {
		if (imp->files[i].dfile == dfile && imp->files[i].alt == alt) {
			*file_id_r = imp->files[i].file_id;
			return 0;
		}
	}
	files = adm_grow(imp->files, imp->nfiles, &imp->files_size,
			 sizeof(*files));
	if (files == NULL)
		return -ENOMEM;
	imp->files = files;
	dbox_file_name(src, dfile);
	if (fstatat(dfd, src, &sb, 0) < 0)
		return -errno;
	a = &files[imp->nfiles];
	a->dfile = dfile;
	a->alt = alt;
	a->file_id = st->next_file_id;
	a->size = (uint64_t)sb.st_size;
	stage_name(dst, a->file_id);
	unlinkat(our, dst, 0);
	if (linkat(dfd, src, our, dst, 0) < 0) {
		int err = errno;

		adm_error("%s/storage/%s: cannot link it into %s/storage: %s%s",
			  root, src, dbox_store_dir_name(st, alt), strerror(err),
			  err == EXDEV ? " (the store must be on the same "
			  "filesystem as the Dovecot root: adopting moves no "
			  "bytes)" : "");
		return -err;
	}
	/* Recovery opens every m.N read-write. */
	if (faccessat(our, dst, R_OK | W_OK, 0) < 0) {
		int err = errno;

		unlinkat(our, dst, 0);
		adm_error("%s/storage/%s: %s (run as root or as the owner of "
			  "the Dovecot files)", root, src, strerror(err));
		return -err;
	}
	st->next_file_id++;
	imp->nfiles++;
	*file_id_r = a->file_id;
	return 0;
}

/* Leftovers of an earlier run: staged links the index knows (the run
   died after its commit) get their final name; others (it died before)
   go. */
static void finish_staged_in(struct imp *imp, bool alt)
{
	struct dbox_store *st = imp->st;
	int dfd = our_dir(imp, alt);
	DIR *dir = dfd >= 0 ? fdopendir(dup(dfd)) : NULL;
	struct dirent *de;
	uint32_t id;
	uint64_t size;
	char final[32];

	if (dir == NULL)
		return;
	rewinddir(dir);
	while ((de = readdir(dir)) != NULL) {
		if (strncmp(de->d_name, STAGE_PREFIX, strlen(STAGE_PREFIX)) != 0 ||
		    !dbox_mfile_parse_name(de->d_name + strlen(STAGE_PREFIX),
					   &id))
			continue;
		dbox_file_name(final, id);
		if (dbox_index_mfile_get(st->index, id, &size) == 0 &&
		    faccessat(dfd, final, F_OK, 0) < 0 &&
		    errno == ENOENT) {
			if (renameat(dfd, de->d_name, dfd, final) == 0)
				adm_warning("%s/storage/%s: finished the "
					    "adoption an earlier run began",
					    dbox_store_dir_name(st, alt), final);
		} else {
			unlinkat(dfd, de->d_name, 0);
		}
	}
	closedir(dir);
}

static void finish_staged(struct imp *imp)
{
	finish_staged_in(imp, false);
	finish_staged_in(imp, true);
}

/* --- the index ------------------------------------------------------------ */

/* dir/name as a directory: looked up, or created. */
static int ensure_dir(struct imp *imp, uint64_t parent, const char *name,
		      uint64_t *ino_r)
{
	struct dbox_attr attr;
	int ret;

	ret = dbox_index_lookup(imp->index, parent, name, strlen(name), &attr);
	if (ret == 0 && attr.kind != DBOX_KIND_DIR)
		return -ENOTDIR;
	if (ret == -ENOENT)
		ret = dbox_index_create(imp->index, parent, name, strlen(name),
					DBOX_KIND_DIR, S_IFDIR | 0700, getuid(),
					getgid(), dbox_now_ns(), &attr);
	if (ret == 0)
		*ino_r = attr.ino;
	return ret;
}

/* A plain file dir/name with content; *fd_r (if not NULL) gets its
   backing file open for appending more.  An existing name is kept
   (-EEXIST). */
static int plain_file(struct imp *imp, uint64_t dir, const char *name,
		      const char *content, int *fd_r)
{
	struct dbox_attr attr;
	char backing[24];
	size_t len = strlen(content);
	int fd, ret;

	ret = dbox_index_lookup(imp->index, dir, name, strlen(name), &attr);
	if (ret != -ENOENT)
		return ret == 0 ? -EEXIST : ret;
	if ((ret = dbox_index_create(imp->index, dir, name, strlen(name),
				     DBOX_KIND_FILE, S_IFREG | 0600, getuid(),
				     getgid(), dbox_now_ns(), &attr)) < 0)
		return ret;
	snprintf(backing, sizeof(backing), "%llu", (unsigned long long)attr.ino);
	fd = openat(imp->st->files_fd, backing,
		    O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_NOFOLLOW |
		    O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (len > 0 && write(fd, content, len) != (ssize_t)len) {
		ret = -errno;
		close(fd);
		return ret;
	}
	if (fd_r != NULL)
		*fd_r = fd;
	else
		close(fd);
	return 0;
}

static struct folder *find_folder(struct imp *imp, const char *mailbox)
{
	if (imp->last_folder < imp->nfolders &&
	    strcmp(imp->folders[imp->last_folder].mailbox, mailbox) == 0)
		return &imp->folders[imp->last_folder];
	for (size_t i = 0; i < imp->nfolders; i++) {
		if (strcmp(imp->folders[i].mailbox, mailbox) == 0) {
			imp->last_folder = i;
			return &imp->folders[i];
		}
	}
	return NULL;
}

/* `doveadm mailbox status`: one folder per mailbox, made in the index. */
static int status_cb(struct imp *imp, char **f, size_t n)
{
	struct folder *folders, *fo;
	char *dir = NULL, header[128];
	uint64_t tmp;
	int ret;

	folders = adm_grow(imp->folders, imp->nfolders, &imp->folders_size,
			   sizeof(*folders));
	if (folders == NULL)
		return -ENOMEM;
	imp->folders = folders;
	fo = &folders[imp->nfolders];
	memset(fo, 0, sizeof(*fo));
	fo->uidlist_fd = -1;
	if ((fo->mailbox = strdup(f[0])) == NULL)
		return -ENOMEM;
	fo->uidvalidity = (uint32_t)strtoul(f[1], NULL, 10);
	fo->uidnext = (uint32_t)strtoul(f[2], NULL, 10);
	snprintf(fo->guid, sizeof(fo->guid), "%s", f[3]);
	imp->nfolders++;

	ret = maildir_folder_of_mailbox(fo->mailbox, &dir);
	if (ret < 0) {
		adm_error("mailbox '%s': no Maildir++ name for it (%s); its "
			  "messages are not adopted", fo->mailbox,
			  strerror(-ret));
		imp->failed++;
		return ret == -ENOMEM ? ret : 0;
	}
	fo->dir = DBOX_ROOT_INO;
	if (*dir != '\0')
		ret = ensure_dir(imp, DBOX_ROOT_INO, dir, &fo->dir);
	if (ret == 0)
		ret = ensure_dir(imp, fo->dir, "cur", &fo->cur);
	if (ret == 0)
		ret = ensure_dir(imp, fo->dir, "new", &fo->new);
	if (ret == 0)
		ret = ensure_dir(imp, fo->dir, "tmp", &tmp);
	if (ret == 0 && *dir != '\0') {
		ret = plain_file(imp, fo->dir, "maildirfolder", "", NULL);
		ret = ret == -EEXIST ? 0 : ret;
	}
	snprintf(header, sizeof(header), "3 V%u N%u G%s\n", fo->uidvalidity,
		 fo->uidnext, fo->guid);
	if (ret == 0) {
		ret = plain_file(imp, fo->dir, "dovecot-uidlist", header,
				 &fo->uidlist_fd);
		if (ret == -EEXIST) {
			adm_warning("%s: has a dovecot-uidlist already; not "
				    "written", *dir != '\0' ? dir : "INBOX");
			imp->warnings++;
			ret = 0;
		}
	}
	if (ret < 0) {
		adm_error("mailbox '%s' -> %s: %s", fo->mailbox,
			  *dir != '\0' ? dir : "(root)", strerror(-ret));
		if (ret != -ENOTDIR && ret != -EEXIST)
			fatal(imp, "index", -ret);
		fo->dir = 0;
	}
	free(dir);
	return imp->fatal ? -EIO : 0;
}

/* The keyword letter of kw in the folder, assigning the next free one. */
static char keyword_letter(void *ctx, const char *kw)
{
	struct folder *fo = ctx;

	for (size_t i = 0; i < fo->nkeywords; i++)
		if (strcmp(fo->keywords[i], kw) == 0)
			return (char)('a' + i);
	if (fo->nkeywords == MAX_KEYWORDS) {
		if (!fo->kw_overflow)
			adm_warning("mailbox '%s': more than %d keywords; "
				    "maildir names cannot carry '%s' and later "
				    "ones", fo->mailbox, MAX_KEYWORDS, kw);
		fo->kw_overflow = true;
		return 0;
	}
	if ((fo->keywords[fo->nkeywords] = strdup(kw)) == NULL)
		return 0;
	return (char)('a' + fo->nkeywords++);
}

/* `doveadm fetch`: one message name (and, the first time a stored
   message is seen, its inode). */
static int fetch_cb(struct imp *imp, char **f, size_t n)
{
	struct dovecot_flags flags;
	struct folder *fo = find_folder(imp, f[7]);
	struct dbox_attr attr;
	struct dbox_msgloc loc;
	char letters[32], name[256], line[300];
	uint64_t size = strtoull(f[5], NULL, 10);
	uint64_t vsize = strtoull(f[6], NULL, 10);
	long long received = strtoll(f[4], NULL, 10);
	unsigned long uid = strtoul(f[0], NULL, 10);
	uint64_t dir;
	struct rec *r;
	bool to_new;
	int ret;

	if (fo == NULL || fo->dir == 0) {
		if (fo == NULL)
			adm_error("mailbox '%s' uid %lu: mailbox not listed by "
				  "doveadm mailbox status", f[7], uid);
		imp->failed++;
		return 0;
	}
	if ((r = find_rec(imp, f[1], size)) == NULL) {
		adm_error("mailbox '%s' uid %lu: message %s (%llu bytes) not "
			  "found in %s/storage%s", f[7], uid, f[1],
			  (unsigned long long)size, imp->root,
			  imp->dalt != NULL ? " nor in the alternate storage" :
			  " (alternate storage: --dovecot-alt=PATH)");
		imp->not_found++;
		imp->failed++;
		return 0;
	}
	if (r->external) {
		adm_error("mailbox '%s' uid %lu: stored with external "
			  "attachments (mail_attachment_dir), which dboxfs "
			  "cannot read; not adopted", f[7], uid);
		imp->failed++;
		return 0;
	}
	if ((ret = dovecot_flags_parse(f[2], &flags)) < 0)
		return ret;
	to_new = flags.recent && !flags.seen && !flags.answered &&
		!flags.flagged && !flags.deleted && !flags.draft &&
		flags.nkeywords == 0;
	dovecot_flags_letters(&flags, keyword_letter, fo, letters);
	dovecot_flags_free(&flags);
	snprintf(name, sizeof(name), "%lld.V%uU%lu.dovecot-import,S=%llu,W=%llu%s%s",
		 received, fo->uidvalidity, uid, (unsigned long long)size,
		 (unsigned long long)vsize, to_new ? "" : ":2,",
		 to_new ? "" : letters);
	dir = to_new ? fo->new : fo->cur;

	if (r->ino == 0) {
		memset(&loc, 0, sizeof(loc));
		ret = adopt_file(imp, r->alt, r->dfile, &loc.file_id);
		if (ret < 0) {
			if (ret == -ENOMEM || ret == -EXDEV)
				fatal(imp, "adopting storage", -ret);
			imp->failed++;
			return imp->fatal ? ret : 0;
		}
		ret = dbox_index_create(imp->index, dir, name, strlen(name),
					DBOX_KIND_MESSAGE, S_IFREG | 0600,
					getuid(), getgid(), dbox_now_ns(), &attr);
		if (ret == -EEXIST) {
			adm_error("mailbox '%s' uid %lu: %s exists already",
				  f[7], uid, name);
			imp->failed++;
			return 0;
		}
		if (ret == 0) {
			attr.size = size;
			attr.mtime_ns = attr.atime_ns =
				dbox_time_make(received, 0);
			ret = dbox_index_setattr(imp->index, &attr);
		}
		if (ret == 0) {
			loc.offset = r->offset;
			loc.body_size = r->body_size;
			loc.record_size = r->record_size;
			loc.vsize = vsize;
			loc.state = DBOX_MSG_COMMITTED;
			snprintf(loc.guid, sizeof(loc.guid), "%.32s", r->guid);
			ret = dbox_index_msg_set(imp->index, attr.ino, &loc);
		}
		if (ret < 0) {
			fatal(imp, "index", -ret);
			return ret;
		}
		r->ino = attr.ino;
		imp->messages++;
		progress_add(&imp->progress, 1, size);
	} else {
		ret = dbox_index_link(imp->index, r->ino, dir, name,
				      strlen(name), dbox_now_ns(), &attr);
		if (ret == -EEXIST) {
			adm_error("mailbox '%s' uid %lu: %s exists already",
				  f[7], uid, name);
			imp->failed++;
			return 0;
		}
		if (ret < 0) {
			fatal(imp, "index", -ret);
			return ret;
		}
		imp->links++;
	}
	r->names++;
	r->refcount = (unsigned int)strtoul(f[3], NULL, 10);
	fo->messages++;
	if (fo->uidlist_fd >= 0) {
		int len = snprintf(line, sizeof(line), "%lu W%llu :%s\n", uid,
				   (unsigned long long)vsize, name);

		if (write(fo->uidlist_fd, line, (size_t)len) != len) {
			fatal(imp, "writing dovecot-uidlist", errno);
			return -EIO;
		}
	}
	return 0;
}

/* dovecot-keywords of every folder that uses keywords; the uidlist
   files closed. */
static int finish_folders(struct imp *imp)
{
	int ret = 0;

	for (size_t i = 0; i < imp->nfolders; i++) {
		struct folder *fo = &imp->folders[i];
		char *content = NULL;
		size_t len = 0;
		FILE *mem;

		if (fo->uidlist_fd >= 0) {
			close(fo->uidlist_fd);
			fo->uidlist_fd = -1;
		}
		if (ret < 0 || fo->dir == 0 || fo->nkeywords == 0)
			continue;
		if ((mem = open_memstream(&content, &len)) == NULL)
			return -ENOMEM;
		for (size_t k = 0; k < fo->nkeywords; k++)
			fprintf(mem, "%zu %s\n", k, fo->keywords[k]);
		if (fclose(mem) != 0) {
			free(content);
			return -ENOMEM;
		}
		ret = plain_file(imp, fo->dir, "dovecot-keywords", content, NULL);
		if (ret == -EEXIST) {
			adm_warning("mailbox '%s': has a dovecot-keywords file "
				    "already; keyword letters follow the new "
				    "order and it is not rewritten", fo->mailbox);
			imp->warnings++;
			ret = 0;
		}
		free(content);
	}
	return ret;
}

/* A new, empty m.N: the file the store appends to from now on, so the
   adopted files (shared with the Dovecot root) are never written. */
static int fresh_mfile(struct imp *imp)
{
	struct dbox_store *st = imp->st;
	uint64_t size;
	int fd = dbox_file_create(st->storage_fd, st->next_file_id, &size);

	if (fd < 0)
		return fd;
	close(fd);
	return dbox_index_mfile_set(imp->index, st->next_file_id++, size);
}

/* Everything the commit refers to is on disk first. */
static int sync_all(struct imp *imp)
{
	char name[32];

	for (size_t i = 0; i < imp->nfiles; i++) {
		int fd;

		stage_name(name, imp->files[i].file_id);
		fd = openat(our_dir(imp, imp->files[i].alt), name,
			    O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0 || fdatasync(fd) < 0) {
			int err = errno;

			if (fd >= 0)
				close(fd);
			return -err;
		}
		close(fd);
	}
	if (syncfs(imp->st->files_fd) < 0 || fsync(imp->st->storage_fd) < 0 ||
	    (imp->st->alt_fd >= 0 && fsync(imp->st->alt_fd) < 0))
		return -errno;
	return 0;
}

static void drop_staged(struct imp *imp)
{
	char name[32];

	for (size_t i = 0; i < imp->nfiles; i++) {
		stage_name(name, imp->files[i].file_id);
		unlinkat(our_dir(imp, imp->files[i].alt), name, 0);
	}
}

static int finish_renames(struct imp *imp)
{
	char from[32], to[32];
	int ret = 0;

	for (size_t i = 0; i < imp->nfiles; i++) {
		stage_name(from, imp->files[i].file_id);
		dbox_file_name(to, imp->files[i].file_id);
		int dfd = our_dir(imp, imp->files[i].alt);

		if (renameat(dfd, from, dfd, to) < 0) {
			ret = -errno;
			adm_error("%s/storage/%s: rename to %s: %s (run "
				  "import-dovecot again to finish)",
				  dbox_store_dir_name(imp->st, imp->files[i].alt),
				  from, to, strerror(errno));
		}
	}
	if ((fsync(imp->st->storage_fd) < 0 ||
	     (imp->st->alt_fd >= 0 && fsync(imp->st->alt_fd) < 0)) && ret == 0)
		ret = -errno;
	return ret;
}

static int run(struct imp *imp)
{
	static const char *const status_args[] = {
		"mailbox", "status", "uidvalidity uidnext guid", "*", NULL };
	static const char *const status_cols[] = {
		"mailbox", "uidvalidity", "uidnext", "guid" };
	static const char *const fetch_args[] = {
		"fetch", FETCH_FIELDS, "mailbox", "*", "all", NULL };
	static const char *const fetch_cols[] = {
		"uid", "guid", "flags", "refcount", "date.received.unixtime",
		"size.physical", "size.virtual", "mailbox" };
	int ret;

	imp->nrecs = 0;
	if ((ret = walk_storage(imp, imp->storage_dfd, false)) < 0 ||
	    (imp->alt_dfd >= 0 &&
	     (ret = walk_storage(imp, imp->alt_dfd, true)) < 0))
		return ret;
	if ((ret = dbox_index_begin(imp->index)) < 0)
		return ret;
	ret = run_doveadm(imp, status_args, status_cols, 4, status_cb);
	if (ret == -EIO && imp->zlib && imp->zlib_missing &&
	    imp->nfolders == 0) {
		adm_warning("retrying without Dovecot's zlib plugin; "
			    "compressed mail may not be adopted");
		imp->warnings++;
		imp->zlib = false;
		if ((ret = write_config(imp)) == 0)
			ret = run_doveadm(imp, status_args, status_cols, 4,
					  status_cb);
	}
	if (ret == 0 && !imp->fatal)
		ret = run_doveadm(imp, fetch_args, fetch_cols, 8, fetch_cb);
	if (ret == 0 && !imp->fatal)
		ret = finish_folders(imp);
	for (size_t i = 0; ret == 0 && i < imp->nrecs; i++) {
		const struct rec *r = &imp->recs[i];

		if (r->ino != 0 && r->refcount > r->names) {
			adm_warning("message %s: Dovecot counts %u references, "
				    "%u found in the mailboxes listed", r->guid,
				    r->refcount, r->names);
			imp->warnings++;
		}
	}
	if (ret == 0 && !imp->fatal && imp->nfiles > 0)
		ret = fresh_mfile(imp);
	for (size_t i = 0; ret == 0 && i < imp->nfiles; i++)
		ret = imp->files[i].alt ?
			dbox_index_mfile_add_alt(imp->index,
						 imp->files[i].file_id,
						 imp->files[i].size) :
			dbox_index_mfile_set(imp->index, imp->files[i].file_id,
					     imp->files[i].size);
	if (ret == 0 && !imp->fatal)
		ret = sync_all(imp);
	if (ret < 0 || imp->fatal) {
		dbox_index_rollback(imp->index);
		drop_staged(imp);
		return ret < 0 ? ret : -EIO;
	}
	if ((ret = dbox_index_commit(imp->index, true)) < 0) {
		drop_staged(imp);
		return ret;
	}
	imp->committed = true;
	return finish_renames(imp);
}

static void imp_free(struct imp *imp)
{
	for (size_t i = 0; i < imp->nfolders; i++) {
		if (imp->folders[i].uidlist_fd >= 0)
			close(imp->folders[i].uidlist_fd);
		for (size_t k = 0; k < imp->folders[i].nkeywords; k++)
			free(imp->folders[i].keywords[k]);
		free(imp->folders[i].mailbox);
	}
	free(imp->folders);
	free(imp->recs);
	free(imp->files);
	free(imp->location);
	if (imp->alt_dfd >= 0)
		close(imp->alt_dfd);
	imp->alt_dfd = -1;
}

/* Undo a store this run created (STORE had no index.sqlite) when the run
   adopted nothing: the names dbox_store_open and this run make, nothing
   else; the directory itself only when it did not exist either.  A name
   that is not ours keeps its directory. */
static void remove_new_store(const char *path, bool dir_made)
{
	static const char *const names[] = {
		DBOX_STORE_INDEX, DBOX_STORE_INDEX "-wal", DBOX_STORE_INDEX "-shm",
		DBOX_STORE_INDEX "-journal", DBOX_STORE_INDEX "-reserve",
		DBOX_STORE_LOCK };
	int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int sfd;

	if (dfd < 0)
		return;
	sfd = openat(dfd, DBOX_STORE_STORAGE, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (sfd >= 0) {
		DIR *dir = fdopendir(sfd);
		struct dirent *de;
		uint32_t id;

		while (dir != NULL && (de = readdir(dir)) != NULL) {
			const char *n = de->d_name;

			if (strncmp(n, STAGE_PREFIX, strlen(STAGE_PREFIX)) == 0)
				n += strlen(STAGE_PREFIX);
			if (dbox_mfile_parse_name(n, &id))
				unlinkat(sfd, de->d_name, 0);
		}
		if (dir != NULL)
			closedir(dir);
		else
			close(sfd);
	}
	unlinkat(dfd, DBOX_STORE_STORAGE, AT_REMOVEDIR);
	unlinkat(dfd, DBOX_STORE_FILES, AT_REMOVEDIR);
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		unlinkat(dfd, names[i], 0);
	close(dfd);
	if (dir_made)
		rmdir(path);
}

static int import_dovecot_main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "doveadm", required_argument, NULL, 'd' },
		{ "mail-location", required_argument, NULL, 'l' },
		{ "dovecot-alt", required_argument, NULL, 'D' },
		{ "alt", required_argument, NULL, 'a' },
		{ 0 },
	};
	struct dbox_store_settings set = { .create = true };
	struct imp imp = { .doveadm = "doveadm", .storage_dfd = -1,
			   .alt_dfd = -1, .zlib = true };
	const char *location = NULL;
	char *root_real, *index_path = NULL, *dalt_real = NULL;
	bool store_new, dir_made;
	struct stat sb;
	int c, ret;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 'd')
			imp.doveadm = optarg;
		else if (c == 'l')
			location = optarg;
		else if (c == 'D')
			imp.dalt = optarg;
		else if (c == 'a')
			set.alt_path = optarg;
		else
			return adm_usage_error(&adm_verb_import_dovecot,
					       "import-dovecot: unknown option "
					       "'%s'", argv[optind - 1]);
	}
	if (argc - optind != 2)
		return adm_usage_error(&adm_verb_import_dovecot,
				       "import-dovecot: need STORE and "
				       "DOVECOT_MDBOX_ROOT");
	if ((ret = adm_store_enter(argv[optind])) != 0)
		return ret;
	imp.root = argv[optind + 1];
	if ((root_real = realpath(imp.root, NULL)) == NULL ||
	    stat(root_real, &sb) < 0 || !S_ISDIR(sb.st_mode)) {
		adm_error("%s: %s", imp.root, root_real == NULL ?
			  strerror(errno) : "not a directory");
		free(root_real);
		return ADM_EXIT_USAGE;
	}
	imp.owner_uid = sb.st_uid;
	imp.owner_gid = sb.st_gid;
	if (imp.dalt != NULL &&
	    ((dalt_real = realpath(imp.dalt, NULL)) == NULL ||
	     (imp.alt_dfd = adm_open_in_store(dalt_real, DBOX_STORE_STORAGE, NULL,
					      0)) < 0)) {
		adm_error("%s/storage: %s (not Dovecot's ALT= root?)", imp.dalt,
			  dalt_real == NULL ? strerror(errno) :
			  strerror(-imp.alt_dfd));
		free(root_real);
		free(dalt_real);
		return ADM_EXIT_USAGE;
	}
	if (set.alt_path != NULL && set.alt_path[0] != '/') {
		adm_error("--alt=%s: the store's alternate storage must be an "
			  "absolute path", set.alt_path);
		free(root_real);
		free(dalt_real);
		if (imp.alt_dfd >= 0)
			close(imp.alt_dfd);
		return ADM_EXIT_USAGE;
	}
	ret = location != NULL ? asprintf(&imp.location, "%s", location) :
		dalt_real != NULL ?
		asprintf(&imp.location, "mdbox:%s:ALT=%s", root_real, dalt_real) :
		asprintf(&imp.location, "mdbox:%s", root_real);
	free(root_real);
	free(dalt_real);
	if (ret < 0)
		return ADM_EXIT_FAILED;
	imp.storage_dfd = openat(AT_FDCWD, imp.root, O_RDONLY | O_DIRECTORY |
				 O_CLOEXEC);
	if (imp.storage_dfd >= 0) {
		int dfd = openat(imp.storage_dfd, DBOX_STORE_STORAGE,
				 O_RDONLY | O_DIRECTORY | O_CLOEXEC);

		close(imp.storage_dfd);
		imp.storage_dfd = dfd;
	}
	if (imp.storage_dfd < 0) {
		adm_error("%s/storage: %s (not a Dovecot mdbox root?)", imp.root,
			  strerror(errno));
		imp_free(&imp);
		return ADM_EXIT_USAGE;
	}
	if (imp.owner_uid == 0) {
		/* doveadm runs as mail_uid = the root's owner, and Dovecot
		   never opens mail as root ("Mail access not allowed for
		   root"): refuse before anything is made. */
		adm_error("%s: owned by root (uid 0); doveadm reads the mdbox "
			  "as the owner of the root and Dovecot refuses mail "
			  "access as root, so nothing was imported or created. "
			  "Give the root to the user Dovecot used for it, e.g. "
			  "'chown -R mail:mail %s' (or its real owner), and run "
			  "import-dovecot again", imp.root, imp.root);
		close(imp.storage_dfd);
		imp_free(&imp);
		return ADM_EXIT_USAGE;
	}
	umask(077);
	dir_made = access(argv[optind], F_OK) < 0 && errno == ENOENT;
	if (asprintf(&index_path, "%s/" DBOX_STORE_INDEX, argv[optind]) < 0) {
		close(imp.storage_dfd);
		imp_free(&imp);
		return ADM_EXIT_FAILED;
	}
	store_new = access(index_path, F_OK) < 0 && errno == ENOENT;
	free(index_path);
	if (dbox_store_open(argv[optind], &set, &imp.st) < 0) {
		close(imp.storage_dfd);
		imp_free(&imp);
		return ADM_EXIT_USAGE; /* the store said why */
	}
	imp.index = imp.st->index;
	finish_staged(&imp);
	strcpy(imp.tmpdir, "/tmp/dboxadm-dovecot.XXXXXX");
	signal(SIGPIPE, SIG_IGN);
	progress_init(&imp.progress, "adopted");
	ret = write_config(&imp);
	if (ret < 0)
		adm_error("writing a doveadm config in /tmp: %s", strerror(-ret));
	else
		ret = run(&imp);
	progress_finish(&imp.progress);
	remove_config(&imp);
	if (ret < 0 && !imp.fatal && ret != -EIO && ret != -EPROTO)
		adm_error("%s: %s", imp.root, strerror(-ret));
	if (ret == 0)
		printf("adopted %lu messages (%lu more names for copies) in %zu "
		       "folders from %zu m.N files, without copying them\n",
		       imp.messages, imp.links, imp.nfolders, imp.nfiles);
	if (imp.failed > 0)
		adm_error("%lu messages or folders failed (see above)",
			  imp.failed);
	close(imp.storage_dfd);
	dbox_store_close(&imp.st);
	imp_free(&imp);
	if (ret < 0 && !imp.committed && store_new) {
		remove_new_store(argv[optind], dir_made);
		adm_error("%s: removed the store this run had created (nothing "
			  "was adopted)", argv[optind]);
	}
	if (ret < 0)
		return ADM_EXIT_FAILED;
	return imp.failed > 0 ? ADM_EXIT_FAILED : ADM_EXIT_OK;
}

const struct adm_verb adm_verb_import_dovecot = {
	.name = "import-dovecot",
	.summary = "adopt a Dovecot mdbox store in place (no bytes copied)",
	.usage =
	"usage: dboxadm import-dovecot STORE DOVECOT_MDBOX_ROOT\n"
	"         [--doveadm=PATH] [--mail-location=LOCATION]\n"
	"         [--dovecot-alt=PATH --alt=PATH]\n"
	"\n"
	"Adopt the Dovecot mdbox store at DOVECOT_MDBOX_ROOT (what Dovecot's\n"
	"mail_location = mdbox:DOVECOT_MDBOX_ROOT points at) into STORE, created\n"
	"when missing, without copying message bytes: its storage/m.N files are\n"
	"hard-linked into STORE/storage (same filesystem needed), and Dovecot's\n"
	"mailboxes, UIDs, flags, keywords and received dates - as `doveadm`\n"
	"reports them - become the Maildir++ tree of the mount.  Messages\n"
	"expunged but not purged are left out; a message in several mailboxes\n"
	"becomes one inode with several names.  Stop Dovecot for this root\n"
	"first, and do not use the root with Dovecot afterwards (its m.N files\n"
	"are shared with STORE until you delete the root).\n"
	"\n"
	"  --doveadm=PATH           the doveadm to run (default: doveadm in PATH)\n"
	"  --mail-location=LOC      Dovecot's mail_location, when it has more than\n"
	"                           the root (e.g. mdbox:/r:INDEX=/i)\n"
	"  --dovecot-alt=PATH       Dovecot's alternate storage (mail_location's\n"
	"                           ALT=PATH): its storage/m.N are adopted too,\n"
	"                           hard-linked into the store's alternate storage\n"
	"  --alt=PATH               the store's alternate storage (recorded in the\n"
	"                           store; on the filesystem of --dovecot-alt)\n",
	.run = import_dovecot_main,
};
