#ifndef DBOXFS_GUID_H
#define DBOXFS_GUID_H

/* A new random message GUID as Dovecot writes it in G metadata: 32 lowercase
   hex digits (a 128-bit UUID from libuuid, dashes removed) and a NUL, into
   buf (at least 33 bytes). */
void dbox_guid_generate(char buf[33]);

#endif
