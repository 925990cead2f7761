#ifndef DBOXFS_STORE_LAYOUT_H
#define DBOXFS_STORE_LAYOUT_H

/*
 * store-layout: the names of a store's own files and directories, spelled
 * here and nowhere else (engine/store.h describes what each holds).
 *
 *   STORE/storage/m.N          dbox v2 files, as Dovecot's mdbox storage/
 *                              (an ALT root holds a storage/ of its own)
 *   ALT/dboxfs-alt-id          which store the ALT is (engine/alt-mark.h)
 *   STORE/index.sqlite(-wal)   the SQLite index
 *   STORE/index.sqlite-reserve headroom for a full disk (index/reserve.h)
 *   STORE/files/<ino>          plain files
 *   STORE/lock                 the store lock (engine/store-lock.h)
 *   STORE/lost+found/          copies of bytes recovery or rebuild cut
 *   STORE/index.sqlite-waiting another process waits to write the index of
 *                              the mounted store (engine/store-commit.c)
 */

#define DBOX_STORE_STORAGE    "storage"
#define DBOX_STORE_INDEX      "index.sqlite"
#define DBOX_STORE_FILES      "files"
#define DBOX_STORE_LOCK       "lock"
#define DBOX_STORE_LOST_FOUND "lost+found"
#define DBOX_ALT_MARK         "dboxfs-alt-id"
#define DBOX_STORE_WAITING    "index.sqlite-waiting"

#endif
