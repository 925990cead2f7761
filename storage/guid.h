#ifndef DBOXFS_GUID_H
#define DBOXFS_GUID_H

/* A new message GUID as Dovecot writes it in G metadata: 32 lowercase hex
   digits of 128 bits and a NUL, into buf (at least 33 bytes).  Unique in
   the process and, with a per-process random key, between processes (see
   guid.c); thread-safe; no syscall but the first per process. */
void dbox_guid_generate(char buf[33]);

#endif
