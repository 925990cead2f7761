#ifndef DBOXFS_STORE_H
#define DBOXFS_STORE_H

/*
 * store: one dbox store directory opened by one process: the lock, the
 * index, the m.N files being appended to, and read descriptors.  This is
 * the one context fs/ and tools/ pass around; there is no global state.
 *
 * The files of a store are named in engine/store-layout.h.
 *
 * Locking: st->lock (the store lock; dbox_store_mutex_lock) serialises
 * the index and the append pool.  Callers take it around every index call
 * and around dbox_save_begin/finish/free; dbox_save_write/truncate and
 * reads of committed data need no lock (the writer owns its m.N tail;
 * committed bytes never change).  Every entry point that needs it checks
 * that the calling thread holds it (dbox_store_assert_locked), in every
 * build without NDEBUG (the default, ASan and TSan builds).
 *
 * LOCK ORDER - the one place it is written; other headers point here.
 * Take a lock on the left before one on its right, never the other way
 * round:
 *
 *   fs_handle.read_lock, fs_dirhandle.lock   (fs/: one open file's
 *        |                                    reader, one listing)
 *   inode busy                               (fs/: fs_busy_begin)
 *        |
 *   SQLite's WAL checkpoint lock             (index/checkpoint.c: its
 *        |                                    WAL sync runs the round;
 *        |                                    under st->lock only tried)
 *   st->presync_mutex                        (store-sync.c: a round of
 *        |                                    syncs before a WAL sync;
 *        |                                    under st->lock only tried)
 *   st->lock                                 (this file; the deferred-
 *        |                                    commit thread, store-
 *        |                                    commit.c, takes it alone)
 *        |
 *   fs_purge.lock                            (fs/fs-purge.c: the list
 *        |                                    of files to purge)
 *   index wal_sync.mutex, ckpt.mutex         (index/wal-sync.c,
 *                                             index/checkpoint.c)
 *
 * - inode busy is a per-inode exclusion, not a mutex: taken under
 *   st->lock and held without it (a message's bytes are written, copied,
 *   sealed or read back unlocked).  A thread holds at most one inode busy
 *   and never waits for an inode to be idle (or for any request) while it
 *   does, so a busy holder only ever waits for st->lock, which nobody
 *   waiting for idle holds (dbox_store_mutex_wait drops it).
 * - A save's references (dbox_save_ref: an fsync using it between its
 *   steps, outside the lock) are no lock: nobody waits for them.
 * - purge (engine/purge.h) and the purge thread (fs/fs-purge.c) take
 *   st->lock for their index work only, never across copying bytes; they
 *   are entered without it (dbox_store_assert_unlocked).
 * - A checkpoint syncs the WAL by the store's round (reserve.h,
 *   dbox_reserve_wal_sync_by) while it holds SQLite's checkpoint lock
 *   (and WAL read-lock 0).  Under st->lock a checkpoint is PASSIVE,
 *   which never waits for that lock, and the inline one is skipped while
 *   the thread's runs (checkpoint.c, wal_hook); readers under st->lock
 *   never need read-lock 0 while a checkpoint has frames to copy.  When
 *   the WAL outgrows its bound meanwhile, requests wait for the thread's
 *   checkpoint before they take st->lock (dbox_store_wal_throttle, in
 *   fs_lock), holding at most the locks above "inode busy" and an inode
 *   busy, none of which the checkpoint or its round ever takes.
 * - The index mutexes are leaves: wal_sync's group commit
 *   (dbox_index_sync_upto) is waited for WITHOUT st->lock, the
 *   checkpointer has its own connection; neither takes another lock.
 */

#include "index/index.h"
#include "engine/store-layout.h"
#include "storage/dbox-body.h"
#include "storage/dbox-file.h"
#include "storage/fd-cache.h"

#include <assert.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <stdint.h>
#include <time.h>

/* Dovecot's mdbox_rotate_size default: start a new m.N past 10 MiB. */
#define DBOX_DEFAULT_ROTATE_SIZE (10 * 1024 * 1024)

struct dbox_store_settings {
	uint64_t rotate_size; /* bytes; 0 = default */
	bool create;          /* create STORE if it does not exist */
	bool readonly;        /* open for reading only (dboxfs -o ro): see
				 dbox_store_open */
	struct dbox_compress_settings compress; /* new message bodies */
	/* compress was chosen by the caller (dboxfs -o compress=, dboxadm
	   import --compress=): recorded in the index (unless readonly) as
	   the store's (DBOX_SETTING_COMPRESS).  Without it the recorded one
	   is used, else compress (a default). */
	bool compress_given;
	/* The alternate storage directory (absolute; ALT/storage/ holds its
	   m.N), or NULL: the one the index recorded, if any.  A path given
	   here is recorded in the index (unless readonly) for later opens
	   and dboxadm; see dbox_store_open. */
	const char *alt_path;
};

/* An m.N open for appending.  busy while a save owns its tail: only
   that save (or purge) appends, past size.  refs counts the holders: a
   save keeps its m.N from begin to free, also after its finish gave the
   tail back (dbox_save_yield), so that an fsync after the close still
   has the descriptor.  Freed once no pool has it (pooled) and refs is 0.
   Needs st->lock, except fd and file_id, fixed while a holder has it. */
struct dbox_mfile {
	uint32_t file_id;
	int fd;
	uint64_t size; /* current end = committed end when not busy */
	unsigned refs;
	bool busy;
	bool pooled; /* in st->append */
	bool cut_failed; /* bytes past size may remain (an ftruncate back to
			    size failed): the file leaves the pool at release,
			    and the next open's recovery cuts them */
	bool unsynced; /* listed in st->unsynced (store-sync.c) */
	bool fresh;    /* just made by dbox_store_pool_take (its index row
			  in the taker's open transaction); read and
			  cleared by the save that takes it */
	uint64_t mark_seq; /* the index commit (dbox_index_commit_seq) that
			      holds the last change of inflight.m.N: a
			      record appended after it is restorable from
			      its path only once that commit is on disk
			      (an fsync syncs up to it: store-restore.c) */
};

/* The store lock: a mutex that knows which thread holds it, so the entry
   points that need it can check (dbox_store_assert_locked).  Taken and
   dropped only through dbox_store_mutex_lock/unlock/wait. */
struct dbox_store_mutex {
	pthread_mutex_t mutex;
	uintptr_t owner; /* the holder's thread token (store.c, thread_token), 0: free
			    (atomic: read by threads that do not hold it) */
};

struct dbox_store {
	char *path;
	char *index_path;
	int dir_fd, storage_fd, files_fd, lock_fd;
	bool readonly;              /* opened with set->readonly */
	struct dbox_index *index;
	uint64_t rotate_size;
	struct dbox_compress_settings compress;
	struct dbox_store_mutex lock; /* st->lock: see "Locking" above */

	struct dbox_mfile **append; /* files that may take more messages */
	size_t append_count;
	/* Numbers of the m.N files finishes wrote into without a sync since
	   the checkpointer's last timed sync, while it runs (timed_sync):
	   store-sync.c. */
	uint32_t *unsynced;
	size_t unsynced_count, unsynced_size;
	const uint32_t *round_ids;  /* the list a round syncs without st->lock
				       (store-sync.c), or NULL; a WAL sync
				       under st->lock syncs them again */
	size_t round_count;
	/* The same for plain files (their inode numbers): one renamed over
	   another name since the last round has its backing file synced
	   before the WAL sync that makes the rename durable, as ext4 flushes
	   a file renamed over another before the rename's commit
	   (auto_da_alloc; helper-69: it came back empty). */
	uint64_t *unsynced_files;
	size_t unsynced_files_count, unsynced_files_size;
	const uint64_t *round_files;
	size_t round_files_count;
	bool timed_sync;
	/* Backing files (files/<ino>) of plain files whose deletion is
	   committed, removed only once a WAL sync has made that commit
	   durable (store-sync.c; helper-68: removed at once, a power loss
	   brought the name back without its file: EIO for good), and those
	   removed, whose file_gone keys the next deleting transaction drops
	   (namespace.c).  Numbers (ino). */
	uint64_t *doomed, *unlinked;
	size_t doomed_count, doomed_size, unlinked_count, unlinked_size;
	/* Held across a round of those syncs, so that a WAL sync after a
	   round never overtakes another round still syncing; taken without
	   st->lock, which it takes inside (lock order: presync_mutex, then
	   st->lock). */
	pthread_mutex_t presync_mutex;
	uint32_t next_file_id;

	char *alt_path;             /* the alternate storage, or NULL */
	int alt_fd;                 /* ALT/storage/, or -1 (none, or missing:
				       alt_err says why) */
	int alt_err;                /* errno of opening ALT/storage/ */
	int64_t alt_tried;          /* when it was last tried (CLOCK_MONOTONIC
				       seconds): see dbox_store_alt_fd */
	int64_t alt_said;           /* alt_tried + 1 once its failure was
				       logged: one line per try of the ALT,
				       not one per message read */

	struct dbox_fd_cache read_fds; /* m.N O_RDONLY, bounded (LRU) */
	bool import_killed;         /* recovery found DBOX_META_IMPORT_RUNNING */
	unsigned long kept_records; /* whole records recovery kept past what
				       the index knows (index older than
				       storage/) */
	uint32_t *unjudged;         /* m.N recovery could not look at (ALT
				       missing, the file unreadable): their
				       in-flight marks stay for a recovery
				       that can (malloc()ed) */
	size_t unjudged_count;
	bool wal_left;              /* the open found index.sqlite-wal not
				       empty: left by a process that died
				       (dbox_store_verify_start) */
	struct dbox_store_defer {   /* deferred commits (store-commit.c) */
		bool on;            /* the thread runs: operations may defer */
		bool stop;          /* the thread is asked to end */
		pthread_t thread;
		pthread_cond_t cond; /* on st->lock; CLOCK_MONOTONIC */
		int64_t since_ns;   /* CLOCK_MONOTONIC time of the oldest
				       deferred operation, when there is one */
		bool idle;          /* the thread waits with no deadline: a
				       first deferral must wake it */
		int64_t hold_until_ns; /* CLOCK_MONOTONIC: nothing is deferred
					  before it (another process waits
					  to write: DBOX_STORE_WAITING) */
	} defer;
};

/* Longest time in milliseconds an operation stays deferred (not
   committed) once its call returned: docs/durability.md, "Deferred
   commits". */
#define DBOX_DEFER_MS 10

/* Start the thread that commits deferred operations (a message's rename
   within its directory: dbox_store_commit_later) at most DBOX_DEFER_MS
   after the first of them.  Without it (dboxadm) nothing is deferred.
   For a writable store, once.  Takes st->lock itself.  Returns 0 or a
   -errno of pthread_create (nothing is deferred then). */
int dbox_store_defer_start(struct dbox_store *st);

/* Stop that thread, after it committed what is deferred.  Call without
   st->lock; a no-op when it was not started.  dbox_store_close calls
   it. */
void dbox_store_defer_stop(struct dbox_store *st);

/* End the operation in the open index transaction (dbox_index_begin):
   defer its commit while the thread runs, else commit it now.
   made_inodes: it made inodes (a create), whose numbers the kernel
   learns before the commit (dbox_index_commit_later).  Needs st->lock.
   Returns 0 or the error of dbox_index_commit_later / dbox_index_commit
   (the operation is then undone). */
int dbox_store_commit_later(struct dbox_store *st, bool made_inodes);

/* How long the mount defers nothing once it saw the mark of another
   process that waits to write the index (DBOX_STORE_WAITING), in
   milliseconds: its transaction then finds the write lock free between
   operations, not held from one deferred commit to the next. */
#define DBOX_DEFER_HOLD_MS 1000

/* A mark older than this (seconds) is one its process left behind (it
   died waiting) and is ignored. */
#define DBOX_WAITING_STALE_SEC 60

/* Another process (dboxadm) is about to write the index of a store that
   may be mounted: leave the mark (DBOX_STORE_WAITING in directory
   dir_fd, STORE) that makes the mount stop deferring commits for a
   while (docs/durability.md, "Deferred commits").  Never follows a link
   nor opens a FIFO; best effort (without the mark the write may only
   wait longer).  dbox_store_writer_done takes the mark away. */
void dbox_store_writer_waits(int dir_fd);
void dbox_store_writer_done(int dir_fd);

/* Commit the deferred operations now (before something that must see
   them committed: a sync point).  Needs st->lock, outside an operation.
   Returns 0 or the commit's error (they are then undone, logged). */
int dbox_store_commit_deferred(struct dbox_store *st);

/* pthread_cond_timedwait(cond, abstime) on st->lock, as
   dbox_store_mutex_wait; abstime on the clock cond was made with.
   Returns 0 or ETIMEDOUT. */
int dbox_store_mutex_timedwait(struct dbox_store *st, pthread_cond_t *cond,
			       const struct timespec *abstime);

/* Take st->lock (the store lock; lock order above), recording the
   calling thread as its holder.  Never fails (a mutex error aborts). */
void dbox_store_mutex_lock(struct dbox_store *st);

/* Drop st->lock, held by the calling thread. */
void dbox_store_mutex_unlock(struct dbox_store *st);

/* pthread_cond_wait(cond) on st->lock: dropped while waiting, held again
   (by the calling thread) on return.  For the waits of fs/ (an inode
   becoming idle). */
void dbox_store_mutex_wait(struct dbox_store *st, pthread_cond_t *cond);

/* Does the calling thread hold st->lock?  For assertions only: another
   thread's holding is not reported. */
bool dbox_store_mutex_held(const struct dbox_store *st);

/* Assertions at the entry points: "needs st->lock" (the calling thread
   holds it) and "takes st->lock itself" (the calling thread must not
   hold it: it would deadlock).  Active unless NDEBUG is defined (the
   Makefile never defines it: default, ASan and TSan builds all check);
   a failure aborts with the function's name (assert(3)).  Add the first
   as the first line of every new engine function documented "Needs
   st->lock". */
#define dbox_store_assert_locked(st) assert(dbox_store_mutex_held(st))
#define dbox_store_assert_unlocked(st) assert(!dbox_store_mutex_held(st))


/* Index meta key: an import (dboxadm import, import-dovecot) is writing
   to the store,
   committed (1) before its first byte and cleared (0) in its last
   transaction.  Found by crash recovery, it means the import was killed:
   every byte the index does not know (past an m.N's committed end, in an
   m.N or files/<ino> it does not know) is the import's uncommitted work,
   which its next run imports again; recovery copies it to lost+found/
   and cuts it, instead of keeping it as mail of a newer index.
   dbox_store_import_mark sets and clears it. */
#define DBOX_META_IMPORT_RUNNING "import.running"

/* Set (running) or clear DBOX_META_IMPORT_RUNNING in the index's current
   transaction.  Needs st->lock.  Returns 0 or a negative errno. */
int dbox_store_import_mark(struct dbox_store *st, bool running);

/* The same in a durable transaction of its own (no transaction may be
   open).  Needs st->lock.  Returns 0 or a negative errno. */
int dbox_store_import_mark_commit(struct dbox_store *st, bool running);

/* Is DBOX_META_IMPORT_RUNNING set in index?  With nobody holding the
   store (recovery, an offline check) it means the import was killed.
   An unreadable mark reads as not set. */
bool dbox_store_import_marked(struct dbox_index *index);

/* The index meta keys of m.<file_id> for crash recovery: inflight = the
   offset where the record last appended (or being appended) to it
   starts; kept = the end of the whole records past the committed end
   that recovery kept (an index older than storage/). */
void dbox_store_tail_keys(uint32_t file_id, char inflight[32], char kept[32]);

/* Delete the inflight.m.N marks once nothing is in flight (after the
   open's recovery, at close), but those of the m.N recovery could not
   look at (st->unjudged: ALT missing, the file unreadable), which the
   next recovery that reaches them judges.  The caller has the store to
   itself (open, close).  Failures leave marks, which cost nothing below
   a committed end. */
void dbox_store_drop_inflight_marks(struct dbox_store *st);

/* The lowest mark at or past the committed end (bytes) of m.<file_id>
   where a copy or purge started writing (inflight.m.N), or where a write
   in flight started that an earlier recovery could not cut (uncut.m.N,
   while the file still has the size file_size it had then); -1 when
   none.  Records from there on are no mail of their own. */
int64_t dbox_store_copy_mark(struct dbox_index *index, uint32_t file_id,
			     uint64_t committed, uint64_t file_size);

/* Where the whole records of m.<file_id> (open as fd) that crash
   recovery puts back (dbox_store_restore_sealed: sealed with their
   path, or copies of such) end, from its committed end `committed` and
   stopping before `stop` (dbox_store_copy_mark; UINT64_MAX: none);
   *count_r how many.  Reads the file only: what `dboxadm check` of a
   store not mounted says the next mount does.  Returns committed (and
   0) when there are none or the file cannot be read. */
uint64_t dbox_store_restorable_end(int fd, uint32_t file_id,
				   uint64_t committed, uint64_t stop,
				   size_t *count_r);

/* store-copies.c: are the whole records of m.<file_id> (open as fd) from
   offset `from` on - an in-flight mark - each a copy of a committed
   message the index still has elsewhere, its body the same bytes (a
   purge's or a copy-on-write rewrite's copies whose commit a crash
   took)?  Then cutting them loses nothing, and they need no copy in
   lost+found/.  storage_fd and alt_fd (either may be -1) hold the other
   m.N.  *count_r gets the number of whole records.  false when there
   are none, when any is no such copy (another GUID, other bytes, none),
   past 65,536 records, or on any error: the caller then keeps a copy. */
bool dbox_store_tail_copies(struct dbox_index *index, int storage_fd,
			    int alt_fd, int fd, uint32_t file_id,
			    uint64_t from, long *count_r);

/* The bytes of m.<file_id> past its committed end (bytes) as crash
   recovery and check judge them, from the index: *inflight_r the offset
   where a write in flight starts - a delivery's WRITING row, the
   inflight.m.N mark of a copy or purge, or the uncut.m.N mark recovery
   leaves when it could not cut, while the file still has the size
   (file_size, bytes) it had then (the lowest of them at or past the
   committed end) - or -1 when none; *kept_r the end of the whole records
   an earlier recovery kept there (committed when none). */
void dbox_store_tail_state(struct dbox_index *index, uint32_t file_id,
			   uint64_t committed, uint64_t file_size,
			   int64_t *inflight_r, uint64_t *kept_r);

/* Record, in the caller's transaction, that a purge of this index
   forgot m.<file_id>, the file with inode number ino (meta key
   purged.m.N = ino).  Returns 0 or a negative errno. */
int dbox_store_purged_mark(struct dbox_index *index, uint32_t file_id,
			   uint64_t ino);

/* The file purged.m.<file_id> names is gone (unlinked): forget its inode
   number, which the filesystem may give to a later file (an m.N copied
   back from a backup) that must not be taken for it.  On its own (a
   commit) or in the caller's transaction.  Returns 0 or a negative
   errno (then the mark stays: harmless but for that reuse). */
int dbox_store_purged_forget(struct dbox_index *index, uint32_t file_id);

/* Is sb (an m.<file_id> found on disk, in storage/ or ALT/storage/) the
   very file a purge of this index forgot, so that its records are copies
   left by a crash before the purge's unlink: garbage, not messages of a
   newer index?  Only when purged.m.N holds sb's inode number: another
   file of that number (an ALT of another store given by mistake, a copy
   restored from elsewhere) or a mark from before 2026-12-02 (1: no
   number) is not, and its whole records are kept.  Returns true or
   false. */
bool dbox_store_purged_file(struct dbox_index *index, uint32_t file_id,
			    const struct stat *sb);

/* Tell crash recovery that a record about to be appended to mf (at
   mf->size) is in flight until committed (meta inflight.m.N): for a
   writer that leaves no WRITING row there (a copy-on-write copy; purge's
   copies, done by dbox_store_mfile_acquire).  In the caller's transaction
   (or on its own), before the first byte; sets mf->mark_seq.  Needs
   st->lock.  Returns 0 or a negative errno. */
int dbox_store_note_inflight(struct dbox_store *st, struct dbox_mfile *mf);

/* dbox_store_note_inflight for a save's record, forgotten again when the
   save finishes or is freed unfinished (a stale inflight.m.N equal to the
   committed end would make recovery with an older copy of the index cut
   records appended later).  In the caller's transaction; a caller that
   rolls it back calls dbox_save_inflight_lost.  Needs st->lock.  Returns
   0 or a negative errno. */
struct dbox_save;
int dbox_save_note_inflight(struct dbox_save *save);

/* The transaction that held dbox_save_note_inflight's mark was rolled
   back: the save is not marked in flight any more.  Needs st->lock. */
void dbox_save_inflight_lost(struct dbox_save *save);

/* Forget inflight.m.N of mf (the writer committed or gave its bytes
   back), in the caller's transaction; sets mf->mark_seq.  Needs
   st->lock. */
void dbox_store_clear_inflight(struct dbox_store *st, struct dbox_mfile *mf);

/* Does m.<file_id> (open as fd; an m.N the index does not know and did
   not purge) hold a whole record - possibly the only copy of a message of
   an index newer than this one, which recovery keeps and purge must not
   remove?  Unreadable counts as yes.  Needs st->lock.  Returns 1 or 0. */
int dbox_store_unknown_records(struct dbox_store *st, int fd, uint32_t file_id);

/* Is the store path (as given: relative to the working directory, or
   absolute) short enough for SQLite to open its index
   (dbox_index_path_check)?  Checked before anything is created or
   renamed: a path too long failed as an unreadable index, after a new
   store's directories were made, and rebuild set a whole index aside
   (helper-87).  Returns 0 or -ENAMETOOLONG (logged), -errno of
   getcwd. */
int dbox_store_path_fits(const char *path);

/* Open the store at path: create it when missing and set->create (an
   existing non-empty directory that is not a store is refused with
   -ENOTEMPTY), take the lock (-EBUSY when another process holds it), open
   the index, and recover from a crash (unfinished writes dropped, the
   record in flight at an m.N's end cut; whole records past what the index
   knows are kept, never cut, other cut bytes copied to lost+found/; what
   was done is logged).  The last
   m.N the index knows takes new messages again when it is below the
   rotate size and holds only whole records up to its committed end;
   otherwise the first save starts a new m.N (numbers are never reused).
   With set->readonly nothing in the store is written or created: the
   store must exist, the lock is taken shared (dbox_store_lock_shared),
   the index is opened read-only (dbox_index_open_readonly), and there is
   no crash recovery (a reader sees only committed messages anyway); the
   caller must not save.  Every refusal is logged with the reason.  Returns 0 and *st_r, or a
   negative errno. */
int dbox_store_open(const char *path, const struct dbox_store_settings *set,
		    struct dbox_store **st_r);

/* Close everything and release the lock; *st = NULL.  Safe on NULL. */
void dbox_store_close(struct dbox_store **st);

/* Close a store this process has just made, that holds nothing of anyone
   else's and that no client has used, and remove it
   (dbox_store_remove_new: its index, lock, storage/ and files/, and the
   directory too when dir_made) before its lock is released.  For a
   mount that failed before it was up.  *stp becomes NULL. */
void dbox_store_close_new(struct dbox_store **stp, bool dir_made);

/* Close the index connection before fork() and open it again in the
   process that goes on using the store.  SQLite connections, and the
   POSIX locks they hold on the WAL, must not cross fork(): a connection
   without its locks lets other readers checkpoint and delete the WAL it
   is still writing.  Everything else (the store lock file, descriptors)
   is inherited.  resume returns 0 or a negative errno (logged). */
void dbox_store_index_suspend(struct dbox_store *st);
int dbox_store_index_resume(struct dbox_store *st);

/* Seconds between tries to open a missing alternate storage again. */
#define DBOX_ALT_RETRY_SECONDS 10

/* The descriptor of ALT/storage/, or -1 while there is none.  A missing
   or unreadable ALT (its disk not mounted yet) is tried again at most
   every DBOX_ALT_RETRY_SECONDS, so a mount serves its messages again once
   it is back (logged); one refused for its owner (EPERM) is not.  Needs
   st->lock. */
int dbox_store_alt_fd(struct dbox_store *st);

/* Start the index's WAL checkpointer thread (index/checkpoint.h) of a
   store opened read-write, in the process that goes on using it (not
   before fork()).  Before each of its timed syncs of the WAL it syncs
   the m.N files that messages were closed into since the last one
   (store-sync.c).  Returns 0, or a negative errno (-EIO, logged): the
   index then checkpoints inside its commits.  Takes st->lock itself
   (from its thread). */
int dbox_store_checkpointer_start(struct dbox_store *st);

/* Before a request takes st->lock (fs/: fs_lock): wait while the WAL
   has outgrown its bound during a checkpoint of the checkpointer's,
   whose WAL sync needs st->lock, so that no commit could wait for it
   (index/checkpoint.h, dbox_index_wal_throttle).  Needs st->lock NOT
   held.  Returns at once in the usual case. */
void dbox_store_wal_throttle(struct dbox_store *st);

/* Sync the m.N files listed for the checkpointer's next timed sync now
   (store-sync.c): before any other sync of the WAL (fsync, fsyncdir),
   and at close after the checkpointer stopped.  Returns once every
   round started before it has synced its files.  Best called without
   st->lock (it takes it itself); with st->lock held it syncs under it
   and does not wait for a round another thread runs.  Errors are
   logged. */
void dbox_store_sync_unsynced(struct dbox_store *st);

/* Plain file ino was renamed over another name just now (the commit
   made last): its backing file is synced by the next round, before the
   WAL sync that makes the rename durable (a power loss must not leave
   the new name on a file whose bytes never reached the disk).  Nothing
   when no checkpointer runs; logged when the list cannot grow.  Needs
   st->lock. */
void dbox_store_note_unsynced_file(struct dbox_store *st, uint64_t ino);

/* The backing file of plain file ino, deleted (or made a message) by
   the commit just made, goes once a WAL sync has made that commit
   durable: the next round of the checkpointer's (within a second), an
   fsync's or fsyncdir's, or the close's.  At once when no checkpointer
   runs (dboxadm), or when the list cannot grow.  Needs st->lock. */
void dbox_store_doom_file(struct dbox_store *st, uint64_t ino);

/* The same, and then the WAL with every row committed so far, with no
   commit between the last m.N sync and the WAL's (store-sync.c: the WAL
   is synced under st->lock) - unless a sync that covered commit point
   (dbox_index_commit_seq; 0: none) ran meanwhile.  Best called without
   st->lock.  Returns 0, or -EIO when the WAL cannot be synced
   (logged). */
int dbox_store_sync_wal(struct dbox_store *st, uint64_t point);

/* When the open found a WAL a crash left (st->wal_left), start the
   index's check in the background (index/verify.h): damage it finds, as
   when a backup's index.sqlite was copied over the crashed store and got
   that WAL's pages, stops every change to the index.  Else nothing.
   Like the checkpointer, in the process that goes on using the store.
   Returns 0 or a negative errno (logged; the store stays usable). */
int dbox_store_verify_start(struct dbox_store *st);

/* May data (message bytes, plain files' bytes) take disk space now?  0
   when the index reserve is whole (or refilled now); -ENOSPC while the
   reserve is in use, so that what the index freed stays the index's
   (index/reserve.h).  Needs no lock. */
int dbox_store_data_room(struct dbox_store *st);

/* A read-only descriptor of m.<file_id> from the store's bounded cache
   (storage/fd-cache.h): owned by the store, valid only while st->lock is
   held, so a caller that uses it after unlocking dup()s it first.
   Returns the fd, -EMFILE/-ENFILE when out of descriptors, or -EIO when
   the file is missing or unreadable (logged).  Needs st->lock. */
int dbox_store_read_fd(struct dbox_store *st, uint32_t file_id);

/* Open m.<file_id> wherever it lives (STORE/storage/ or, when the index
   says so, ALT/storage/) with open(2) flags (O_NOFOLLOW|O_CLOEXEC are
   added).  Returns the fd (the caller's to close), or -EIO when the file
   or the alternate storage is missing or unreadable (logged with the
   full path).  Needs st->lock. */
int dbox_store_mfile_open(struct dbox_store *st, uint32_t file_id, int flags);

/* The directory fd holding m.<file_id> (storage_fd or alt_fd) and, in
   *alt_r, whether it is the alternate storage.  Returns the fd (owned by
   the store), -ENOENT when the index does not know the file (then
   storage_fd's is the natural place: *alt_r = false, and -ENOENT is
   returned), or -EIO (ALT missing; logged).  Needs st->lock. */
int dbox_store_mfile_dir(struct dbox_store *st, uint32_t file_id, bool *alt_r);

/* The root whose storage/ holds the file, for log lines ("%s/storage/m.N"):
   st->path, or the ALT path when alt (valid while the store is open). */
const char *dbox_store_dir_name(const struct dbox_store *st, bool alt);

/* The root whose storage/ holds m.<file_id> as the index says (st->path
   when it does not know the file or cannot tell), for log lines; valid
   while the store is open.  One index query: for error paths.  Needs
   st->lock. */
const char *dbox_store_mfile_root(struct dbox_store *st, uint32_t file_id);

/* Set the R metadata of a finished message record to received (UNIX
   seconds), in place (dbox_record_set_received).  Returns 0 or a negative
   errno (-ERANGE when it cannot be set in place: the new date does not
   fit the old width, or the m.N has other names - hard links into
   another store, never written; then only the index has it; other errors
   are logged). */
int dbox_store_set_received(struct dbox_store *st, const struct dbox_msgloc *loc,
			    time_t received);

/* One message being saved: its record is appended to an m.N whose tail
   this save owns until it is finished and yielded (dbox_save_yield) or
   its last reference is dropped (dbox_save_free).
   Opaque (engine/save.c); its states: WRITTEN (bytes changed since the
   last seal), SEALED (metadata and header written for the body as it
   stands: dbox_save_seal), FINISHED (sealed, and the index names the
   record: dbox_save_finish).  Finished implies sealed; a write or
   truncate makes it WRITTEN again. */
struct dbox_save;

/* Start saving the message of inode ino (saved to folder mailbox, copied)
   into an m.N with room, creating a new one past the rotate size.  Records
   the message as WRITING in the index (inside the caller's transaction).
   Needs st->lock.  Returns 0 and *save_r, or a negative errno. */
int dbox_save_begin(struct dbox_store *st, uint64_t ino, const char *mailbox,
		    struct dbox_save **save_r);

/* dbox_save_begin without the WRITING row: the index keeps whatever it
   has for ino (a committed record, or a plain file) until
   dbox_save_finish commits the new record.  For the bytes of a message
   or plain file copied into a new record outside the store lock (a crash
   meanwhile leaves the index as it was; recovery cuts the copy).  Needs
   st->lock, and a transaction when a new m.N may be created.  Returns 0
   and *save_r, or a negative errno. */
int dbox_save_begin_unindexed(struct dbox_store *st, uint64_t ino,
			      const char *mailbox, struct dbox_save **save_r);

/* Start a copy of the message or plain file ino (saved to folder
   mailbox) in a transaction of its own, committed (not synced):
   dbox_save_begin_unindexed and its in-flight mark
   (dbox_save_note_inflight), so that recovery cuts the copy if it is
   never finished instead of keeping it as a message the index lost.  The
   commit's number is kept for dbox_save_inflight_seq; the caller makes
   it durable (dbox_ns_sync_upto) before the copy's first byte, as any
   sync of the m.N may come before the commit that finishes the copy.
   Needs st->lock and no open transaction.  Returns 0 and *save_r, or a
   negative errno (everything rolled back). */
int dbox_save_begin_copy(struct dbox_store *st, uint64_t ino,
			 const char *mailbox, struct dbox_save **save_r);

/* Write plaintext bytes [off, off+len) of the message (compressed as
   the store's settings say; storage/dbox-body.h).  No lock needed beyond
   one caller per save at a time.  Returns 0 or a negative errno (-ENOSPC,
   also while the index reserve is in use (index/reserve.h); -EFBIG,
   -EIO). */
int dbox_save_write(struct dbox_save *save, const void *buf, size_t len,
		    uint64_t off);

/* Set the message size in bytes.  No lock needed.  Returns 0 or a
   negative errno of the body (dbox-body.h: -EFBIG, -ENOSPC, -EIO). */
int dbox_save_truncate(struct dbox_save *save, uint64_t size);

/* Read plaintext bytes [off, off+len) of the message being saved (clipped
   to its size).  May turn a body being compressed plain until the finish
   (dbox-body.h), so it needs the same exclusion as dbox_save_write.
   Returns the byte count or a negative errno. */
ssize_t dbox_save_read(struct dbox_save *save, void *buf, size_t len,
		       uint64_t off);

/* Current message (plaintext) size in bytes. */
uint64_t dbox_save_size(const struct dbox_save *save);

/* The save's state (see struct dbox_save): finished (the index names
   its record as it stands), sealed (its metadata and header are written
   for the body as it stands), and how many times it was sealed (a caller
   that synced the bytes of one seal compares it to see a reseal since).
   Read under the exclusion of dbox_save_write (in fs/: st->lock with the
   inode idle). */
bool dbox_save_finished(const struct dbox_save *save);

/* Was the save's m.N made for it (dbox_store_pool_take), in the
   transaction of its begin?  (Stays true for the save's life.)  That
   transaction must commit before a byte of the file is relied on:
   recovery takes an m.N the index does not know for one whose creation
   never committed (store-recover.c).  Needs st->lock. */
bool dbox_save_made_mfile(const struct dbox_save *save);
bool dbox_save_sealed(const struct dbox_save *save);
uint64_t dbox_save_seals(const struct dbox_save *save);

/* The bytes of seal number seals (dbox_save_seals) are on disk: the
   caller synced them (dbox_save_sync) and saw no reseal since.  A finish
   of that seal then leaves its m.N off the timed sync's list
   (store-sync.c): an fsync would otherwise sync it twice.  Needs
   st->lock. */
void dbox_save_synced(struct dbox_save *save, uint64_t seals);

/* Forget the seal: the metadata must be written again at the next seal
   or finish (the received date changed).  A finished save stays
   finished (its record is what the index names); the caller makes a new
   save for it.  Same exclusion as dbox_save_write. */
void dbox_save_unseal(struct dbox_save *save);

/* The commit sequence number (index/wal-sync.h) of the commit that
   marked the save in flight (dbox_save_begin_copy), while the mark is
   still there, else 0: the copy's maker syncs the index up to it before
   the first byte (dbox_ns_sync_upto), so that a durable record past the
   committed end always has a durable mark and is cut by recovery, not
   kept or put back as a second message.  Needs st->lock. */
uint64_t dbox_save_inflight_seq(const struct dbox_save *save);

/* fdatasync() the m.N the save appends to.  Reads only the save's m.N
   descriptor, which stays open while the caller holds a reference, so it
   needs no lock and may run beside a writer of the save.  Returns 0 or a
   negative errno (logged with the file). */
int dbox_save_sync(struct dbox_save *save);

/* Where the save's record is: *loc_r gets its m.N, offset and GUID,
   with the sizes and V of its last seal, and the state WRITING until it
   is finished (then COMMITTED: what the index names).  Same exclusion
   as dbox_save_write. */
void dbox_save_where(const struct dbox_save *save, struct dbox_msgloc *loc_r);

/* Take another reference to the save (a thread using it outside
   st->lock, between the steps of an fsync): dbox_save_free drops one,
   and only the last one frees it.  Needs st->lock. */
void dbox_save_ref(struct dbox_save *save);

/* Finish the record (metadata with GUID, received = received_sec, V, B,
   and Z for a compressed body), and record it COMMITTED in the index with its sizes, inside the caller's
   transaction.  A no-op when nothing changed since the last finish.  With
   sync, the m.N bytes are fdatasync()ed first.  Needs st->lock.  Returns 0
   or a negative errno; *loc_r gets the location. */
int dbox_save_finish(struct dbox_save *save, time_t received_sec, bool sync,
		     struct dbox_msgloc *loc_r);

/* Give the m.N's tail back after a finish whose transaction committed:
   the next save may append to the same m.N at once, before this save is
   freed (a client's close, then its RELEASE later: deliveries one after
   the other share one m.N).  The save keeps the file open for
   dbox_save_sync; a later dbox_save_finish of it leaves the m.N's
   committed end alone.  Needs st->lock; the save finished. */
void dbox_save_yield(struct dbox_save *save);

/* Write the record's metadata and header for the body as it stands (the
   bytes dbox_save_finish would write) without touching the index, so
   they can be fdatasync()ed outside the store lock before the index
   commit.  Writes after it undo it.  The heavy part of a finish (V of a
   plain body is read back, a body written out of order is compressed),
   so it needs no store lock, only the exclusion of dbox_save_write (one
   caller per save at a time).  msg_path (may be NULL) is the message's
   path below the maildir root, written as L, and owner (may be NULL) its
   mode, owner and group, written as A with L: the close or fsync() of a
   new message seals with them (dbox_msg_seal_note), so that recovery
   can put the record back there, as it was, when a power loss takes its
   index row (store-restore.c).
   Returns 0 or a negative errno. */
int dbox_save_seal(struct dbox_save *save, time_t received_sec,
		   const char *msg_path, const struct dbox_owner *owner);

/* Does the record as written now carry its path, L (the last seal had
   one, and no write undid it)? */
bool dbox_save_sealed_with_path(const struct dbox_save *save);

/* The index commit that holds the last change of the in-flight mark of
   the save's m.N (struct dbox_mfile, mark_seq; 0: none since the open):
   recovery stops at a mark, so a record sealed with its path is
   restorable only once that commit is on disk.  Needs st->lock. */
uint64_t dbox_save_mark_seq(const struct dbox_save *save);

/* The empty version of a message a close acknowledged while its save
   goes on (fs/fs-write.c, message_flush): a shell's `> file` closes the
   descriptor it opened before the command writes through its dup, and
   Python's mailbox.Maildir.add closes its first descriptor before it
   writes through a second.  Such a close commits the meta key
   DBOX_META_ACKED_EMPTY<ino> (its value the mtime then) instead of finishing
   the record, so the writes after it go on in the same record (no copy,
   no dead empty record).  The key goes in the finish's transaction; if
   the process dies first, recovery keeps the message (a WRITING row is
   not dropped) and stores it empty with the inode's mtime
   (dbox_msg_restore_empty). */
#define DBOX_META_ACKED_EMPTY "acked_empty."

/* The key of ino into key: DBOX_META_ACKED_EMPTY followed by ino in
   decimal. */
void dbox_save_acked_empty_key(char key[48], uint64_t ino);

/* Set the key of the save's inode to mtime_ns (a dbox time) inside the
   caller's transaction; dbox_save_finish deletes it inside the finish's
   transaction.  The save must be unfinished and empty.  Needs
   st->lock.  Returns 0, the error of a body a failed write broke (-ENOSPC:
   storage/dbox-body.h), or the index's errno. */
int dbox_save_ack_empty(struct dbox_save *save, int64_t mtime_ns);

/* Is the save's empty version acknowledged (dbox_save_ack_empty, not
   finished since)?  Same exclusion as dbox_save_write. */
bool dbox_save_acked_empty(const struct dbox_save *save);

/* Mark the index row WRITING again.  Recovery drops a WRITING message
   with all its names, so this is only for a record nobody was told is
   stored; fs/ never writes a finished record again (it makes a copy):
   the tests make with it the state a damaged index may hold.  Needs
   st->lock and a transaction; returns 0 or the index's errno. */
int dbox_save_reopen(struct dbox_save *save);


/* Drop a reference (*save = NULL; safe on NULL).  The last one releases
   the m.N: a save that never finished is cut off the file (its index row
   is the caller's to delete).  Needs st->lock. */
void dbox_save_free(struct dbox_save **save);

/* Read plaintext of a committed message: a thin wrapper that opens a
   reader (storage/dbox-read.h) on the right m.N after checking the whole
   record (header, body size, metadata block, GUID) against the index.
   The reader holds a descriptor of its own (closed by dbox_reader_free),
   so it goes on reading the same bytes after a purge moved the message
   and removed the m.N.  Needs st->lock (released by the caller before
   reading).  Returns 0 and *reader_r, -EMFILE/-ENFILE when out of
   descriptors, or -EIO (logged). */
struct dbox_reader;
int dbox_store_open_reader(struct dbox_store *st, const struct dbox_msgloc *loc,
			   uint64_t plain_size, struct dbox_reader **reader_r);

/* For purge (engine/purge.h), needs st->lock:
   acquire: an m.N of the append pool with room (or a new one), now owned
   (busy) by the caller, who may append at mf->size and must keep mf->size
   at the end of what it wrote (marked in flight for crash recovery,
   dbox_store_note_inflight); 0 or a negative errno.
   release: give it back (a full one leaves the pool): yield, then put.
   yield: give the tail back (others may append past mf->size now) but
   keep holding mf: its fd stays open (a finished save's later fsync).
   put: drop a hold; the last one closes an m.N that left the pool.
   seal: take m.<file_id> out of the append pool, so nothing is appended
   to it any more; 0 (also when it was not in the pool), -EBUSY when a
   save owns it now.
   read_fd_forget: close the cached read descriptor of m.<file_id> (after
   the file was removed); readers keep their own. */
int dbox_store_mfile_acquire(struct dbox_store *st, struct dbox_mfile **mf_r);
void dbox_store_mfile_release(struct dbox_store *st, struct dbox_mfile *mf);
void dbox_store_mfile_yield(struct dbox_store *st, struct dbox_mfile *mf);
void dbox_store_mfile_put(struct dbox_store *st, struct dbox_mfile *mf);
int dbox_store_mfile_seal(struct dbox_store *st, uint32_t file_id);

/* After a transaction that finished saves into the m.N files ids[0..n)
   was rolled back (dboxadm import's batch after an index error): each
   is cut back to the committed end the index has again, and one the
   index no longer knows (made in that transaction) is removed, in the
   append pool or not (a full one left it).  Else the records of the
   rolled-back saves stay past an end, and the next open takes them for
   mail an older index does not know.  A file a save owns now is left as
   it is; a failed cut is logged and takes the file out of the pool.
   Needs st->lock. */
void dbox_store_rolled_back(struct dbox_store *st, const uint32_t *ids,
			    size_t n);
void dbox_store_read_fd_forget(struct dbox_store *st, uint32_t file_id);

/* For altmove and the purge of files in the alternate storage: create
   m.<next id> in ALT/storage/ (header only), recorded in the index as an
   ALT file whose committed end is its header (autocommit: the caller
   must not be in a transaction), owned by the caller (not in the append
   pool; close mf->fd and free mf when done).  Needs st->lock.  Returns 0
   and *mf_r, -ENOENT when there is no alternate storage (logged), or a
   negative errno. */
int dbox_store_alt_create(struct dbox_store *st, struct dbox_mfile **mf_r);

/* Hand out the next m.N number into *id_r (numbers are never reused):
   for the append pool's new files, and for a file made outside it (an
   m.N adopted from Dovecot, engine/import-dovecot.h), which the caller
   creates or links and records in the index in the same transaction.
   Needs st->lock.  Returns 0, or -ENOSPC when no number is left (an
   m.4294967295 exists; logged). */
int dbox_store_file_id_take(struct dbox_store *st, uint32_t *id_r);

#endif
