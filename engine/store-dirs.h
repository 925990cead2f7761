#ifndef DBOXFS_STORE_DIRS_H
#define DBOXFS_STORE_DIRS_H

/*
 * store-dirs: reading the directories of a store (the store directory,
 * storage/, files/; engine/store-layout.h names them): one walk over a
 * directory descriptor, what a name in files/ means, who owns the way to
 * a store's directory (STORE, ALT), and undoing a store just made.
 */

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* Called with each entry name of the directory; return 0 to go on, any
   other value to stop the walk (dbox_dir_walk returns it). */
typedef int dbox_dir_walk_cb_t(void *ctx, const char *name);

/* Call cb for every entry of the directory open as dir_fd but "." and
   "..", in readdir order, from its start.  dir_fd stays the caller's
   (a duplicate is read) and can be walked again.  Returns 0 when every
   entry was seen, the value cb stopped with, or a negative errno (-EMFILE,
   -ENOMEM, -EBADF) when the directory cannot be read. */
int dbox_dir_walk(int dir_fd, dbox_dir_walk_cb_t *cb, void *ctx);

/* Bytes of a name in STORE/files/ with its NUL: 20 digits at most. */
#define DBOX_FILES_NAME_SIZE 24

/* The name of plain file ino's backing file in STORE/files/: its inode
   number in decimal, into buf. */
void dbox_files_name(char buf[DBOX_FILES_NAME_SIZE], uint64_t ino);

/* Is name a plain file's name in STORE/files/: its inode number in
   decimal, no leading zero, no sign?  Then true and *ino_r (not 0). */
bool dbox_files_name_ino(const char *name, uint64_t *ino_r);

/* Who could switch what path names: the owner of the last directory or
   symbolic link on the way to path (each prefix of the path as given,
   compared with lstat(), then of its real path; the longest first) whose
   owner is neither root nor except, or 0 when there is none.  Whoever
   owns a step of the way can put something else beyond it.  Used for
   paths a process of root's opens for a store: STORE itself (dboxadm) and
   its alternate storage. */
uid_t dbox_path_foreign_owner(const char *path, uid_t except);

/* dbox_path_foreign_owner, strict, for a decision root acts on: every
   step of the way must be there to be looked at (one that vanished
   meanwhile may be switched back after the walk), the path must still
   resolve, and a relative path is walked from the steps of the working
   directory on.  opened (may be NULL): what the caller opened or stat'ed
   by path, which path must still name after the walk (-ESTALE).  Returns
   0 and *owner_r (0: none), or -errno (ENOENT: a step is gone). */
struct stat;
int dbox_path_way_owner(const char *path, uid_t except,
			const struct stat *opened, uid_t *owner_r);

/* The directory that holds path ("." for a bare name; trailing slashes
   are not names), malloc()ed (caller frees), or NULL. */
char *dbox_path_parent(const char *path);

/* The owner of the first symbolic link on the way to path as given (each
   prefix, lstat(), longest first) that is not root's, or 0: a link its
   owner may point elsewhere between a check and a use by name (root's
   mount point). */
uid_t dbox_path_link_owner(const char *path);

/* Whose store path is, for a process of root's about to act on it as its
   owner (the mount and dboxadm decide alike).  The directory that decides
   is path, or its parent when path does not exist (a store to be made is
   the parent's owner's); it stays open (fd) while the caller switches to
   the owner, so that dbox_store_owner_still can tell whether the path
   still names it.  Whoever owns a step of the way (dbox_path_foreign_owner)
   decides too: root's directory reached through a user's directory or
   link is that user's store; a user's store reached through a third
   user's is refused. */
struct dbox_store_owner {
	uid_t uid;      /* the owner; 0: root's own store (nothing to switch) */
	gid_t gid;      /* the group of uid's passwd entry, else the
			   directory's; (gid_t)-1: not known (no passwd entry
			   and the way's owner decided) */
	uid_t way;      /* -EPERM: the third user whose way it is */
	bool new_store; /* path does not exist: its parent decided */
	bool shared_dir; /* -EPERM: root's store whose name lies in a
			    directory others may write to (a new store
			    there, or one not sticky) */
	char *what;     /* path or its parent (malloc()ed; for messages) */
	int fd;         /* what, open (-1: none) */
	dev_t dev;      /* what's identity when decided */
	ino_t ino;
};

/* Decide o for path (see struct dbox_store_owner).  Returns 0; -ENOENT
   when neither path nor its parent exists and -ENOTDIR when path is not
   a directory (nothing decided, uid 0: root refuses the path); -EPERM when another user's store is reached
   through a third user's way (uid, way set), or (shared_dir set) when
   root's store's name lies in a directory others may write to (a new
   store in /tmp: another user could put a link there before root opens
   it by name); -ESTALE when the path changed while it was looked at;
   -ENOMEM; other -errno of opening the directory or of a step of the
   way.  o->what is set unless -ENOMEM; always release
   o with dbox_store_owner_free. */
int dbox_store_owner_find(const char *path, struct dbox_store_owner *o);

/* After the caller switched to o->uid: does o->what, resolved with the
   owner's rights now, still name the directory that decided?  Returns 0,
   -ESTALE when it names another one, or -errno of stat(). */
int dbox_store_owner_still(const struct dbox_store_owner *o);

/* Close and free what dbox_store_owner_find holds; o may be released
   twice. */
void dbox_store_owner_free(struct dbox_store_owner *o);

/* storage/ (DBOX_STORE_STORAGE) of the directory open as dir_fd, of a
   store, an ALT or a Dovecot root: opened read-only, never through a
   symbolic link.  Returns the descriptor (the caller's) or -errno. */
int dbox_storage_dir_open(int dir_fd);

/* May a store owned by owner use the alternate storage alt (a directory,
   open as alt_fd)?  Only when alt belongs to owner and is reached through
   no directory or symbolic link of a third user's
   (dbox_path_way_owner): a path recorded in an index its user may
   write, or a step of the way another user may switch, must not make a
   process of another user (root) read, create, cut or remove m.N files
   where that user could not.  Returns 0, or -EPERM with *uid_r the user
   at fault and *way_r false when alt itself is that user's, true when a
   step of the way is; -errno of fstat; -ENOENT or -ESTALE when a step
   went away or alt names another directory than alt_fd by now (the
   way is walked strictly: dbox_path_way_owner). */
int dbox_alt_owner_check(int alt_fd, const char *alt, uid_t owner,
			 uid_t *uid_r, bool *way_r);

/* ALT/storage/ of the alternate storage alt for a store owned by owner:
   alt opened as given (symbolic links on the way followed: an admin's
   path, like STORE), accepted by dbox_alt_owner_check and, as this
   store's, by its mark (dbox_alt_mark_judge with mark, which a writable
   opener filled with dbox_alt_mark_load and write set), and its storage/
   opened without following a link, made first (mode 0700) with create.
   Returns the descriptor (the caller's) or -errno; -EPERM: refused, with
   *uid_r and *way_r as dbox_alt_owner_check sets them; -EXDEV: another
   store's ALT (logged). */
struct dbox_alt_mark;
int dbox_alt_storage_open(const char *alt, uid_t owner, bool create,
			  struct dbox_alt_mark *mark, uid_t *uid_r, bool *way_r);

/* Undo a store that was just made and holds no mail of anyone's yet: in
   directory path, the names dbox_store_open makes (the index and its
   companions, the lock, storage/ with its m.N, files/ with its
   files/<ino>), nothing else, and path itself when dir_made (it did not
   exist before either) and it is empty then.  Errors are ignored: what
   cannot be removed stays. */
void dbox_store_remove_new(const char *path, bool dir_made);

#endif
