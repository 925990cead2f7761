#ifndef DBOXFS_INDEX_PRIVATE_H
#define DBOXFS_INDEX_PRIVATE_H

/* Shared by the files of index/ only: the connection and its statements. */

#include "checkpoint.h"
#include "index.h"
#include "storage/log.h"

#include <pthread.h>
#include <sqlite3.h>
#include <sys/types.h>

/* Every statement the index runs, prepared once at open (index.c). */
enum index_stmt {
	ST_BEGIN, ST_COMMIT, ST_ROLLBACK, ST_SAVEPOINT, ST_RELEASE, ST_ROLLBACK_TO,
	ST_LOOKUP, ST_LOOKUP_RANGE, ST_GETATTR, ST_INODE_INSERT, ST_ENTRY_INSERT,
	ST_ENTRY_GET, ST_RENAME_ENDS, ST_ENTRY_DELETE, ST_ENTRY_MOVE, ST_ENTRY_SET_INO,
	ST_DIR_HAS_ENTRIES, ST_PARENT_OF, ST_NAME_OF, ST_PATH_BEGIN, ST_PATH_END, ST_TOUCH_DIR,
	ST_SET_CTIME,
	ST_NLINK_ADD,
	ST_SETATTR, ST_INODE_DELETE, ST_MSG_DELETE, ST_READDIR,
	ST_MSG_GET, ST_MSG_SET, ST_MSG_FINISH, ST_MSG_SET_STATE,
	ST_MFILE_SET, ST_MFILE_MAX, ST_MFILE_LIST,
	ST_MFILE_WHERE, ST_MFILE_ADD_ALT, ST_SETTING_GET, ST_SETTING_SET,
	ST_META_GET, ST_META_SET, ST_SYMLINK_SET, ST_SYMLINK_GET,
	ST_XATTR_GET, ST_XATTR_INSERT, ST_XATTR_UPDATE, ST_XATTR_DELETE,
	ST_XATTR_LIST, ST_XATTR_USAGE, ST_SYMLINK_DROP, ST_XATTR_DROP,
	ST_COUNT
};

/* Group commit state (wal-sync.c). */
struct index_wal_sync {
	pthread_mutex_t mutex;
	pthread_cond_t cond;
	uint64_t synced;   /* commits known durable */
	bool syncing;      /* a leader runs fdatasync */
	int fd;            /* the WAL, or -1 */
	ino_t ino;
	dev_t dev;
};

/* WAL checkpointer thread (checkpoint.c). */
struct index_checkpointer {
	pthread_mutex_t mutex;
	pthread_cond_t cond;
	pthread_t thread;
	sqlite3 *db;       /* its own connection */
	bool running, stop, wanted;
	bool busy;         /* the thread is checkpointing (mutex; cond is
			      broadcast when it is done) */
	/* A commit found the WAL past DBOX_CHECKPOINT_INLINE_BYTES while
	   the thread checkpointed, and could not checkpoint itself: new
	   changes wait (dbox_index_wal_throttle) until busy is false again
	   (atomic; set and cleared under mutex, cond broadcast at clear). */
	bool behind;
	int woken_pages;   /* WAL pages when the hook last woke the thread,
			      0: not since the WAL started over */
	/* A commit since the thread's last timed sync (atomic; set under
	   mutex), and when that sync is due (CLOCK_REALTIME, mutex). */
	bool sync_pending;
	struct timespec sync_due;
	dbox_index_sync_fn *sync; /* set before the thread starts, kept
				     until the index closes */
	void *sync_ctx;
};

/* The background check of verify.c: its thread and read-only
   connection, while running. */
struct index_verifier {
	pthread_t thread;
	sqlite3 *db;
	bool running;
};

/* Attributes of recently read inodes (index-ns.c), direct-mapped by
   inode number.  An entry is dropped by SQLite's update hook whenever this
   connection changes its inode or message row (any statement), and all
   of them at any rollback; nothing else writes the index while the store
   is locked. */
#define INDEX_ATTR_CACHE 128
struct index_attr_cache {
	bool enabled;    /* dbox_index_cache_attrs() */
	struct dbox_attr attr[INDEX_ATTR_CACHE]; /* ino 0: empty */
};

/* Page size of a new index, in bytes (PRAGMA page_size; SQLite allows
   512 to 65536, powers of two).  Every commit writes each page it
   changed whole into the WAL, and a delivery changes some twenty pages
   (inode, entry and message rows and their indexes, in three
   transactions), so the WAL carries pages, not rows: with SQLite's
   default of 4096 a delivery of a 7 KB message wrote 79 KB of WAL, which
   checkpoints then synced and copied.  1024 bytes cut that by about
   three quarters and gave 1.3-1.4x the deliveries per second (measured
   2026-12-02, docs/design.md section 3); 512 would gain a little more
   but SQLite keeps only about 100 bytes of an index entry on a 512-byte
   page (the rest goes to overflow pages), less than a long maildir name.
   A WAL database keeps the page size it was created with: an older
   index (4096) is rewritten once by dbox_index_convert_pages. */
#define INDEX_PAGE_SIZE 1024
/* Largest index dbox_index_convert_pages rewrites, in bytes: the new
   file is built in memory (about 1.8 million messages with 4096-byte
   pages). */
#define INDEX_REWRITE_MAX (512 * 1024 * 1024)

struct dbox_index {
	sqlite3 *db;
	char *path;
	int page_size;     /* bytes, read when opened */
	bool readonly;     /* opened by dbox_index_open_readonly */
	sqlite3_stmt *stmt[ST_COUNT];
	uint64_t commits;  /* successful commits (atomic: read by wal-sync) */
	struct index_wal_sync wal_sync;
	struct index_checkpointer ckpt;
	int reserve_fd;        /* reserve.h: the reserve, or -1 */
	uint64_t reserve_size; /* its full size in bytes */
	/* reserve.c: when the reserve was last seen whole (monotonic ns,
	   0: not yet) and the process's release count then (atomic both). */
	uint64_t reserve_whole_ns;
	uint64_t reserve_whole_releases;
	struct index_attr_cache attrs;
	/* SQLite said the index is damaged (SQLITE_CORRUPT or NOTADB, here
	   or in the check of verify.c): from then on dbox_index_begin
	   refuses every write transaction (atomic: set by any thread). */
	int damaged;
	struct index_verifier verifier;
	/* Deferred commits (dbox_index_commit_later).  deferred: the open
	   transaction holds operations that ended without a commit; in_op:
	   an operation begun inside it runs in savepoint "op".  Invariant:
	   in_op implies deferred, and either implies a transaction open
	   (sqlite3_get_autocommit false) unless SQLite rolled it back by
	   itself after an error (index_deferred_lost). */
	bool deferred;
	bool in_op;
	/* deferred_inodes: the deferred transaction holds an operation that
	   made inodes (dbox_index_commit_later); undone: index_deferred_undone.
	   stopped: such a transaction was undone; no write transaction is
	   begun from then on (atomic: read by any thread). */
	bool deferred_inodes;
	int stopped;
};

/* path with its directory resolved (realpath(3)) and its last name as
   given, malloc()ed (caller frees), or NULL (errno set).  For every
   SQLite open with SQLITE_OPEN_NOFOLLOW: SQLite refuses a symbolic link
   anywhere in the path, and a store's directory may be reached through
   one (STORE is an admin's path, like ALT), while the index file itself
   must stay refused when it is one. */
char *index_dir_real(const char *path);

/* A write statement about to run outside an operation while operations
   are deferred (index.h, "Deferred commits") - a mark the purge thread
   writes without a transaction of its own, expecting SQLite to commit it
   when the statement ends - would join the deferred transaction instead
   and be lost with it at the death of the daemon (a purge's copies then
   lost their in-flight mark: test_crash.py, session 31).  So the
   deferred ones are committed first (an error is logged by the commit,
   which undoes them).  Every write of the mount passes here: index_stmt
   for the prepared statements, and the few prepared on the spot
   (index-msg.c's meta deletes, index-purge.c); the other statements
   prepared on the spot are reads, or run before anything is deferred
   (recovery at open, rebuild's own index). */
void index_autocommit_point(struct dbox_index *index, sqlite3_stmt *stmt);

/* The statement for id, reset and with bindings cleared (and past
   index_autocommit_point).  The index owns it (prepared at open,
   finalized at close): never finalize it. */
sqlite3_stmt *index_stmt(struct dbox_index *index, enum index_stmt id);

/* Log a SQLite failure (what, plus sqlite3_errmsg) and return -EIO, or
   -ENOSPC / -EDQUOT when SQLite found the disk or the quota full. */
int index_sql_error(struct dbox_index *index, const char *what);

/* Mark the index damaged (index->damaged: every later write transaction
   is refused) and log why, the first time only.  Any thread. */
void index_mark_damaged(struct dbox_index *index, const char *why);

/* Reset stmt (ending its read of the database: a statement left on a row
   would pin the WAL snapshot) and return ret.  Every statement is reset
   as soon as its last row is read. */
int index_done(sqlite3_stmt *stmt, int ret);

/* Run sql (one or more statements, no rows wanted) with sqlite3_exec.
   A failure is logged at level as "index PATH: WHAT: message" (what may
   be NULL) and returns -EIO. */
int index_exec_sql(struct dbox_index *index, enum dbox_log_level level,
		   const char *what, const char *sql);

/* Step a statement that returns no row; 0 or index_sql_error's errno. */
int index_exec_stmt(struct dbox_index *index, sqlite3_stmt *stmt,
		    const char *what);

/* Fill an attr from a row whose columns start at col with
   ino, kind, mode, uid, gid, nlink, size, mtime, ctime, atime, rdev and
   the record size of a committed message (0 else). */
void index_row_attr(sqlite3_stmt *stmt, int col, struct dbox_attr *attr_r);

/* Step stmt to its first row and fill *attr_r from its columns starting
   at col (the caller resets stmt: it may read more columns).  Returns 0,
   -ENOENT when there is no row, or index_sql_error(what). */
int index_step_attr(struct dbox_index *index, sqlite3_stmt *stmt, int col,
		    struct dbox_attr *attr_r, const char *what);

/* Bind attr to parameters ?1..?10 of stmt: ino, kind, mode, uid, gid,
   nlink, size, mtime, ctime, atime (times in dbox time).  A statement
   need not use every one of them. */
void index_bind_attr(sqlite3_stmt *stmt, const struct dbox_attr *attr);

/* The attributes of ino in the attribute cache into *attr_r: true when
   there (index-inode.c). */
bool index_attr_cache_get(struct dbox_index *index, uint64_t ino,
			  struct dbox_attr *attr_r);

/* Forget every cached attribute (a rollback, of the transaction or of
   a savepoint in it; index-inode.c). */
void index_attr_cache_drop(struct dbox_index *index);

/* Keep attr in the attribute cache, when it is on (index-inode.c). */
void index_attr_cache_put(struct dbox_index *index,
			  const struct dbox_attr *attr);

/* The column list index_row_attr() reads, for building statements. */
#define INDEX_ATTR_COLS "i.ino, i.kind, i.mode, i.uid, i.gid, i.nlink, i.size, i.mtime, i.ctime," \
	" coalesce(i.atime, i.mtime), i.rdev," \
	" coalesce((SELECT m.record_size FROM message m WHERE m.ino = i.ino" \
	" AND m.state = 0), 0)"

/* What format 2 added to format 1 (index.c creates and upgrades with
   these): inode.atime in ns (NULL = the same as mtime, as every inode of
   a format 1 store reads), inode.rdev (device number of a character or
   block special file, else 0), a symlink's target, and extended
   attributes.  Both tables are keyed by inode; a trigger deletes their
   rows with the inode, so no deleting path can leave them behind. */
#define INDEX_FORMAT2_INODE_COLS \
	"  atime INTEGER,\n" \
	"  rdev  INTEGER NOT NULL DEFAULT 0\n"
#define INDEX_FORMAT2_TABLES \
	"CREATE TABLE symlink (ino INTEGER PRIMARY KEY, target BLOB NOT NULL);\n" \
	"CREATE TABLE xattr (ino INTEGER NOT NULL, name BLOB NOT NULL,\n" \
	"  value BLOB NOT NULL, PRIMARY KEY (ino, name)) WITHOUT ROWID;\n" \
	INDEX_TRIGGER_INODE_GONE ";\n"
/* The one trigger of the schema, as SQLite keeps its text in
   sqlite_schema.sql (index_check_schema). */
#define INDEX_TRIGGER_INODE_GONE \
	"CREATE TRIGGER inode_gone AFTER DELETE ON inode BEGIN\n" \
	"  DELETE FROM symlink WHERE ino = old.ino;\n" \
	"  DELETE FROM xattr WHERE ino = old.ino;\n" \
	"END"

/* What format 3 added to format 2 (alternate storage, Dovecot's mdbox
   ALT=): mfile.alt (1: the m.N lives in ALT/storage/, 0: in
   STORE/storage/) and a table of text settings (key "alt_path": the ALT
   directory the store was last opened with).  An upgraded store has every
   m.N in STORE/storage/, as before. */
#define INDEX_FORMAT3_MFILE_COLS \
	",\n  alt     INTEGER NOT NULL DEFAULT 0"
#define INDEX_FORMAT3_TABLES \
	"CREATE TABLE setting (key TEXT PRIMARY KEY, value BLOB NOT NULL)" \
	" WITHOUT ROWID;\n"

/* index-schema.c: a new index's schema, format, uidvalidity and root
   directory, in one transaction.  Returns 0 or a negative errno. */
int index_create_schema(struct dbox_index *index);

/* index-schema.c: refuse an index with a trigger or view dboxfs did not
   make (only INDEX_TRIGGER_INODE_GONE is ours).  The index is the store
   owner's file: their trigger would have run inside root's dboxadm and
   the mount.  Checked at open; index_guard covers the time after.  Returns 0, or -EIO (logged, naming
   it). */
int index_check_schema(struct dbox_index *index);

/* index-schema.c: a connection to an index - a file the store's owner
   may have written - set up as SQLite's advice for database files from
   elsewhere asks (docs/durability.md, "Privileges and safety of the
   store"): SQLITE_DBCONFIG_DEFENSIVE (no writable_schema, no writes to
   sqlite_dbpage), SQLITE_DBCONFIG_TRUSTED_SCHEMA off, and no trigger
   fires and no view is read (SQLITE_DBCONFIG_ENABLE_TRIGGER and
   _ENABLE_VIEW off): index_check_schema refuses a foreign trigger or
   view present at open, and this makes one the owner adds while the
   index is open - between root's dboxadm's check and its writes, or
   under a running mount - do nothing (a statement that names a view
   fails; a trigger does not run).  dboxfs's own inode_gone is kept in
   the schema for older versions; dbox_index_delete_inode does its work.
   Returns 0 or -EIO. */
int index_guard(sqlite3 *db);

/* index-schema.c: the index's format into *format_r.  Returns 0, -EIO
   (no format: not a dboxfs index) or -EPROTO (newer than this dboxfs);
   logged. */
int index_check_format(struct dbox_index *index, int64_t *format_r);

/* index-schema.c: bring an index of an older format up to
   DBOX_INDEX_FORMAT, one step per format, in one transaction.  Returns 0,
   or a negative errno (-EROFS when the index cannot be written: an old
   store on read-only media is refused, never half upgraded). */
int index_upgrade_format(struct dbox_index *index, int64_t format);

/* index-schema.c: the partial indexes crash recovery uses (WRITING
   messages, inodes without names), added to stores made before them;
   a failure is no error (recovery then scans). */
void index_add_recovery_indexes(struct dbox_index *index);

#endif
