/*
 * guid.c: new message GUIDs for the G metadata line, in the form Dovecot
 * writes: 32 lowercase hex digits of a random 128-bit value (libuuid).
 */
#include "guid.h"

#include <uuid/uuid.h>

void dbox_guid_generate(char buf[33])
{
	static const char hex[] = "0123456789abcdef";
	uuid_t uuid;

	uuid_generate(uuid);
	for (int i = 0; i < 16; i++) {
		buf[i * 2] = hex[uuid[i] >> 4];
		buf[i * 2 + 1] = hex[uuid[i] & 0xf];
	}
	buf[32] = '\0';
}
