#ifndef DBOXFS_FS_PURGE_H
#define DBOXFS_FS_PURGE_H

/*
 * fs-purge: purge (engine/purge.h) while the store is mounted, in one
 * background thread of the daemon:
 *
 *   on request   `dboxadm purge STORE` finds the daemon by the pid it
 *                wrote into STORE/lock and sends SIGUSR1; the thread runs
 *                a full purge (every m.N with a dead byte, also the one
 *                taking new mail unless a save owns it) and records its
 *                start time under DBOX_META_PURGE_REQUEST_START in the
 *                index, which dboxadm waits for;
 *   automatically  expunges and rewrites note the m.N whose record died;
 *                about two seconds after the first note, the noted files
 *                that are sealed (no longer taking new mail) are purged
 *                when their dead share reaches -o purge_threshold
 *                (percent, default DBOX_PURGE_DEFAULT_THRESHOLD, 0 = off).
 *
 * The purge takes the store lock only for its index work, so the mount
 * keeps serving while bytes are copied.  Lock order: engine/store.h.
 */

#include "fs/fs.h"

#include <stdint.h>

/* Start the thread, write the daemon's pid into STORE/lock and install
   the SIGUSR1 handler.  Call after daemonizing (the pid is final) and
   with the index open.  Returns 0 or a negative errno (logged). */
int fs_purge_start(struct fs *fs);

/* Stop the thread (a purge under way is cancelled between records; the
   file it was on is kept whole) and clear the pid.  Safe when never
   started. */
void fs_purge_stop(struct fs *fs);

/* A record in m.<file_id> has become garbage (expunge, rewrite).  Cheap;
   called with the store lock held.  No-op when not started. */
void fs_purge_note(struct fs *fs, uint32_t file_id);

#endif
