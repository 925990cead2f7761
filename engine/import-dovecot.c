/*
 * import-dovecot.c: an adoption of a Dovecot mdbox store
 * (import-dovecot.h): the folders of its mailboxes, each message's names
 * and inode over its record, the dovecot-uidlist and dovecot-keywords
 * files, and the one commit.  The m.N files themselves are
 * import-dovecot-files.c's.
 */
#include "engine/import-dovecot-private.h"
#include "storage/grow.h"
#include "engine/maildir.h"
#include "engine/save-fd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void adopt_note(struct dbox_adopt *adopt, struct dbox_adopt_note note)
{
	if (adopt->ops->note != NULL)
		adopt->ops->note(adopt->ops->ctx, &note);
}

/* The adoption cannot go on: note it once.  Returns -err (negative). */
int adopt_fatal(struct dbox_adopt *adopt, const char *step, int err)
{
	if (!adopt->fatal)
		adopt_note(adopt, (struct dbox_adopt_note){
			.kind = DBOX_ADOPT_FATAL, .name = step, .err = err });
	adopt->fatal = true;
	return -err;
}

/* --- the tree ----------------------------------------------------------- */

/* dir/name as a directory: looked up, or created. */
static int ensure_dir(struct dbox_adopt *adopt, uint64_t parent,
		      const char *name, uint64_t *ino_r)
{
	struct dbox_attr attr;
	int ret;

	ret = dbox_index_lookup(adopt->index, parent, name, strlen(name), &attr);
	if (ret == 0 && attr.kind != DBOX_KIND_DIR)
		return -ENOTDIR;
	if (ret == -ENOENT)
		ret = dbox_index_create(adopt->index, parent, name, strlen(name),
					DBOX_KIND_DIR, S_IFDIR | 0700, getuid(),
					getgid(), dbox_now_ns(), &attr);
	if (ret == 0)
		*ino_r = attr.ino;
	return ret;
}

/* A plain file dir/name with content; *fd_r (if not NULL) gets its
   backing file open for appending more.  An existing name is kept
   (-EEXIST). */
static int plain_file(struct dbox_adopt *adopt, uint64_t dir,
		      const char *name, const char *content, int *fd_r)
{
	struct dbox_attr attr;
	size_t len = strlen(content);
	int fd, ret;

	ret = dbox_index_lookup(adopt->index, dir, name, strlen(name), &attr);
	if (ret != -ENOENT)
		return ret == 0 ? -EEXIST : ret;
	if ((ret = dbox_index_create(adopt->index, dir, name, strlen(name),
				     DBOX_KIND_FILE, S_IFREG | 0600, getuid(),
				     getgid(), dbox_now_ns(), &attr)) < 0)
		return ret;
	if ((fd = dbox_store_file_create(adopt->st, attr.ino, true)) < 0)
		return fd;
	if (len > 0 && write(fd, content, len) != (ssize_t)len) {
		ret = errno != 0 ? -errno : -EIO;
		close(fd);
		return ret;
	}
	if (fd_r != NULL)
		*fd_r = fd;
	else
		close(fd);
	return 0;
}

static struct adopt_folder *find_folder(struct dbox_adopt *adopt,
					const char *mailbox)
{
	if (adopt->last_folder < adopt->nfolders &&
	    strcmp(adopt->folders[adopt->last_folder].mailbox, mailbox) == 0)
		return &adopt->folders[adopt->last_folder];
	for (size_t i = 0; i < adopt->nfolders; i++) {
		if (strcmp(adopt->folders[i].mailbox, mailbox) == 0) {
			adopt->last_folder = i;
			return &adopt->folders[i];
		}
	}
	return NULL;
}

/* The folder's directories and files under the Maildir++ directory dir
   ("" for INBOX: the root).  guid: the mailbox GUID for the uidlist. */
static int make_folder(struct dbox_adopt *adopt, struct adopt_folder *fo,
		       const char *dir, const char *guid)
{
	char header[128];
	uint64_t tmp;
	int ret = 0;

	fo->dir = DBOX_ROOT_INO;
	if (*dir != '\0')
		ret = ensure_dir(adopt, DBOX_ROOT_INO, dir, &fo->dir);
	if (ret == 0)
		ret = ensure_dir(adopt, fo->dir, "cur", &fo->cur);
	if (ret == 0)
		ret = ensure_dir(adopt, fo->dir, "new", &fo->new);
	if (ret == 0)
		ret = ensure_dir(adopt, fo->dir, "tmp", &tmp);
	if (ret == 0 && *dir != '\0') {
		ret = plain_file(adopt, fo->dir, "maildirfolder", "", NULL);
		ret = ret == -EEXIST ? 0 : ret;
	}
	snprintf(header, sizeof(header), "3 V%u N%u G%s\n", fo->uidvalidity,
		 fo->uidnext, guid);
	if (ret == 0) {
		ret = plain_file(adopt, fo->dir, "dovecot-uidlist", header,
				 &fo->uidlist_fd);
		if (ret == -EEXIST) {
			adopt_note(adopt, (struct dbox_adopt_note){
				.kind = DBOX_ADOPT_HAS_UIDLIST,
				.name = *dir != '\0' ? dir : "INBOX" });
			adopt->counts.warnings++;
			ret = 0;
		}
	}
	return ret;
}

int dbox_adopt_mailbox(struct dbox_adopt *adopt, const char *mailbox,
		       uint32_t uidvalidity, uint32_t uidnext,
		       const char *guid)
{
	struct adopt_folder *folders, *fo;
	char *dir = NULL;
	int ret;

	folders = dbox_grow(adopt->folders, adopt->nfolders,
			    &adopt->folders_size, sizeof(*folders));
	if (folders == NULL)
		return adopt_fatal(adopt, "mailbox", ENOMEM);
	adopt->folders = folders;
	fo = &folders[adopt->nfolders];
	memset(fo, 0, sizeof(*fo));
	fo->uidlist_fd = -1;
	if ((fo->mailbox = strdup(mailbox)) == NULL)
		return adopt_fatal(adopt, "mailbox", ENOMEM);
	fo->uidvalidity = uidvalidity;
	fo->uidnext = uidnext;
	adopt->counts.folders = ++adopt->nfolders;

	if ((ret = maildir_folder_of_mailbox(mailbox, &dir)) < 0) {
		adopt_note(adopt, (struct dbox_adopt_note){
			.kind = DBOX_ADOPT_BAD_MAILBOX, .mailbox = mailbox,
			.err = -ret });
		adopt->counts.failed++;
		return ret == -ENOMEM ? adopt_fatal(adopt, "mailbox", ENOMEM) : 0;
	}
	if ((ret = make_folder(adopt, fo, dir, guid)) < 0) {
		adopt_note(adopt, (struct dbox_adopt_note){
			.kind = DBOX_ADOPT_FOLDER_FAILED, .mailbox = mailbox,
			.name = *dir != '\0' ? dir : "(root)", .err = -ret });
		if (ret != -ENOTDIR && ret != -EEXIST)
			adopt_fatal(adopt, "index", -ret);
		fo->dir = 0;
	}
	free(dir);
	return adopt->fatal ? -EIO : 0;
}

char dbox_adopt_keyword_letter(struct dbox_adopt *adopt, const char *mailbox,
			       const char *kw)
{
	struct adopt_folder *fo = find_folder(adopt, mailbox);

	if (fo == NULL)
		return 0;
	for (size_t i = 0; i < fo->nkeywords; i++)
		if (strcmp(fo->keywords[i], kw) == 0)
			return (char)('a' + i);
	if (fo->nkeywords == DBOX_ADOPT_MAX_KEYWORDS) {
		if (!fo->kw_overflow)
			adopt_note(adopt, (struct dbox_adopt_note){
				.kind = DBOX_ADOPT_KEYWORDS_FULL,
				.mailbox = mailbox, .name = kw });
		fo->kw_overflow = true;
		return 0;
	}
	if ((fo->keywords[fo->nkeywords] = strdup(kw)) == NULL)
		return 0;
	return (char)('a' + fo->nkeywords++);
}

/* --- messages ----------------------------------------------------------- */

/* The first name of record r: an inode over it (its m.N linked in),
   named name in dir.  Returns 0 (also when the message failed: noted,
   counted) or a negative errno after a fatal note. */
static int adopt_inode(struct dbox_adopt *adopt, const struct dbox_adopt_msg *m,
		       struct adopt_rec *r, uint64_t dir, const char *name)
{
	struct dbox_msgloc loc = { 0 };
	struct dbox_attr attr;
	int ret = adopt_link_file(adopt, r->alt, r->dfile, &loc.file_id);

	if (ret < 0) {
		adopt->counts.failed++;
		return ret == -ENOMEM || ret == -EXDEV ?
			adopt_fatal(adopt, "adopting storage", -ret) : 0;
	}
	ret = dbox_index_create(adopt->index, dir, name, strlen(name),
				DBOX_KIND_MESSAGE, S_IFREG | 0600, getuid(),
				getgid(), dbox_now_ns(), &attr);
	if (ret == -EEXIST)
		return ret;
	if (ret == 0) {
		attr.size = m->size;
		attr.mtime_ns = attr.atime_ns = dbox_time_make(m->received, 0);
		ret = dbox_index_setattr(adopt->index, &attr);
	}
	if (ret == 0) {
		loc.offset = r->offset;
		loc.body_size = r->body_size;
		loc.record_size = r->record_size;
		loc.vsize = m->vsize;
		loc.state = DBOX_MSG_COMMITTED;
		snprintf(loc.guid, sizeof(loc.guid), "%.32s", r->guid);
		ret = dbox_index_msg_set(adopt->index, attr.ino, &loc);
	}
	if (ret < 0)
		return adopt_fatal(adopt, "index", -ret);
	r->ino = attr.ino;
	adopt->counts.messages++;
	if (adopt->ops->progress != NULL)
		adopt->ops->progress(adopt->ops->ctx, m->size);
	return 0;
}

/* The record of m, or NULL after noting why it cannot be adopted. */
static struct adopt_rec *message_rec(struct dbox_adopt *adopt,
				     const struct dbox_adopt_msg *m,
				     struct adopt_folder *fo)
{
	struct dbox_adopt_note n = { .mailbox = m->mailbox, .uid = m->uid,
				     .guid = m->guid, .size = m->size,
				     .root = adopt->src.root };
	struct adopt_rec *r = NULL;

	if (fo == NULL)
		n.kind = DBOX_ADOPT_NOT_LISTED;
	else if (fo->dir == 0)
		;  /* the folder failed: noted then */
	else if ((r = adopt_find_rec(adopt, m->guid, m->size)) == NULL)
		n.kind = DBOX_ADOPT_NOT_FOUND;
	else if (r->external)
		n.kind = DBOX_ADOPT_EXTERNAL;
	else
		return r;
	if (fo == NULL || fo->dir != 0)
		adopt_note(adopt, n);
	adopt->counts.failed++;
	return NULL;
}

int dbox_adopt_message(struct dbox_adopt *adopt,
		       const struct dbox_adopt_msg *m)
{
	struct adopt_folder *fo = find_folder(adopt, m->mailbox);
	struct adopt_rec *r = message_rec(adopt, m, fo);
	struct dbox_attr attr;
	char name[256], line[300], letters[32] = "";
	uint64_t dir;
	int ret, len;

	if (r == NULL)
		return 0;
	if (!m->to_new)
		m->letters(m->letters_ctx, letters);
	snprintf(name, sizeof(name), "%lld.V%uU%lu.dovecot-import,S=%llu,"
		 "W=%llu%s%s", (long long)m->received, fo->uidvalidity, m->uid,
		 (unsigned long long)m->size, (unsigned long long)m->vsize,
		 m->to_new ? "" : ":2,", letters);
	dir = m->to_new ? fo->new : fo->cur;
	if (r->ino == 0) {
		ret = adopt_inode(adopt, m, r, dir, name);
		if (ret < 0 && ret != -EEXIST)
			return ret;
		if (ret == 0 && r->ino == 0)
			return 0; /* failed, noted */
	} else {
		ret = dbox_index_link(adopt->index, r->ino, dir, name,
				      strlen(name), dbox_now_ns(), &attr);
		if (ret < 0 && ret != -EEXIST)
			return adopt_fatal(adopt, "index", -ret);
		if (ret == 0)
			adopt->counts.links++;
	}
	if (ret == -EEXIST) {
		adopt_note(adopt, (struct dbox_adopt_note){
			.kind = DBOX_ADOPT_EXISTS, .mailbox = m->mailbox,
			.uid = m->uid, .name = name });
		adopt->counts.failed++;
		return 0;
	}
	r->names++;
	r->refcount = m->refcount;
	if (fo->uidlist_fd < 0)
		return 0;
	len = snprintf(line, sizeof(line), "%lu W%llu :%s\n", m->uid,
		       (unsigned long long)m->vsize, name);
	if (write(fo->uidlist_fd, line, (size_t)len) != len)
		return adopt_fatal(adopt, "writing dovecot-uidlist",
				   errno != 0 ? errno : EIO);
	return 0;
}

/* --- the end ------------------------------------------------------------ */

/* "<index> <name>" lines of a folder's keywords, malloc()ed. */
static char *keywords_text(const struct adopt_folder *fo)
{
	char *content = NULL;
	size_t len = 0;
	FILE *mem = open_memstream(&content, &len);

	if (mem == NULL)
		return NULL;
	for (size_t k = 0; k < fo->nkeywords; k++)
		fprintf(mem, "%zu %s\n", k, fo->keywords[k]);
	if (fclose(mem) != 0) {
		free(content);
		return NULL;
	}
	return content;
}

/* dovecot-keywords of every folder that uses keywords; the uidlist
   files closed. */
static int finish_folders(struct dbox_adopt *adopt)
{
	int ret = 0;

	for (size_t i = 0; i < adopt->nfolders; i++) {
		struct adopt_folder *fo = &adopt->folders[i];
		char *content;

		if (fo->uidlist_fd >= 0) {
			close(fo->uidlist_fd);
			fo->uidlist_fd = -1;
		}
		if (ret < 0 || fo->dir == 0 || fo->nkeywords == 0)
			continue;
		if ((content = keywords_text(fo)) == NULL)
			return -ENOMEM;
		ret = plain_file(adopt, fo->dir, "dovecot-keywords", content, NULL);
		if (ret == -EEXIST) {
			adopt_note(adopt, (struct dbox_adopt_note){
				.kind = DBOX_ADOPT_HAS_KEYWORDS,
				.mailbox = fo->mailbox });
			adopt->counts.warnings++;
			ret = 0;
		}
		free(content);
	}
	return ret;
}

/* Records Dovecot counts more references to than names were made. */
static void check_refcounts(struct dbox_adopt *adopt)
{
	for (size_t i = 0; i < adopt->nrecs; i++) {
		const struct adopt_rec *r = &adopt->recs[i];

		if (r->ino == 0 || r->refcount <= r->names)
			continue;
		adopt_note(adopt, (struct dbox_adopt_note){
			.kind = DBOX_ADOPT_REFCOUNT, .guid = r->guid,
			.count = r->refcount, .found = r->names });
		adopt->counts.warnings++;
	}
}

/* The adopted m.N in the index (with a new one for new mail). */
static int record_files(struct dbox_adopt *adopt)
{
	int ret = adopt->nfiles > 0 ? adopt_fresh_mfile(adopt) : 0;

	for (size_t i = 0; ret == 0 && i < adopt->nfiles; i++) {
		const struct adopt_file *f = &adopt->files[i];

		ret = f->alt ?
			dbox_index_mfile_add_alt(adopt->index, f->file_id,
						 f->size) :
			dbox_index_mfile_set(adopt->index, f->file_id, f->size);
	}
	return ret;
}

int dbox_adopt_commit(struct dbox_adopt *adopt)
{
	int ret = adopt->fatal ? -EIO : finish_folders(adopt);

	if (ret == 0)
		check_refcounts(adopt);
	if (ret == 0 && (ret = record_files(adopt)) == 0 &&
	    (ret = dbox_store_import_mark(adopt->st, false)) == 0)
		ret = adopt_sync(adopt);
	if (ret < 0)
		return ret;
	adopt->in_tx = false;
	if ((ret = dbox_index_commit(adopt->index, true)) < 0) {
		adopt_drop_staged(adopt);
		(void)dbox_store_import_mark_commit(adopt->st, false);
		return ret;
	}
	adopt->committed = true;
	return adopt_finish_renames(adopt);
}

int dbox_adopt_begin(struct dbox_store *st, const struct dbox_adopt_source *src,
		     const struct dbox_adopt_ops *ops,
		     struct dbox_adopt **adopt_r)
{
	static const struct dbox_adopt_ops no_ops = { 0 };
	struct dbox_adopt *adopt = calloc(1, sizeof(*adopt));
	int ret;

	if (adopt == NULL)
		return -ENOMEM;
	dbox_store_mutex_lock(st); /* held until dbox_adopt_free */
	adopt->st = st;
	adopt->index = st->index;
	adopt->src = *src;
	adopt->ops = ops != NULL ? ops : &no_ops;
	/* Marked before the first file is adopted: should the run be
	   killed, recovery takes what it had not committed out of the way
	   (store.h, DBOX_META_IMPORT_RUNNING). */
	if ((ret = adopt_walk_storage(adopt, false)) < 0 ||
	    (src->alt_fd >= 0 && (ret = adopt_walk_storage(adopt, true)) < 0) ||
	    (ret = dbox_store_import_mark_commit(st, true)) < 0 ||
	    (ret = dbox_index_begin(adopt->index)) < 0) {
		dbox_adopt_free(&adopt);
		return ret;
	}
	adopt->in_tx = true;
	*adopt_r = adopt;
	return 0;
}

bool dbox_adopt_committed(const struct dbox_adopt *adopt)
{
	return adopt->committed;
}

const struct dbox_adopt_counts *dbox_adopt_counts(const struct dbox_adopt *adopt)
{
	return &adopt->counts;
}

void dbox_adopt_free(struct dbox_adopt **adoptp)
{
	struct dbox_adopt *adopt = *adoptp;

	if (adopt == NULL)
		return;
	*adoptp = NULL;
	if (adopt->in_tx) {
		dbox_index_rollback(adopt->index);
		adopt_drop_staged(adopt);
		/* Undone: nothing of this run is left to judge. */
		(void)dbox_store_import_mark_commit(adopt->st, false);
	}
	for (size_t i = 0; i < adopt->nfolders; i++) {
		if (adopt->folders[i].uidlist_fd >= 0)
			close(adopt->folders[i].uidlist_fd);
		for (size_t k = 0; k < adopt->folders[i].nkeywords; k++)
			free(adopt->folders[i].keywords[k]);
		free(adopt->folders[i].mailbox);
	}
	free(adopt->folders);
	free(adopt->recs);
	free(adopt->files);
	dbox_store_mutex_unlock(adopt->st);
	free(adopt);
}
