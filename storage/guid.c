/*
 * guid.c: new message GUIDs for the G metadata line, in the form Dovecot
 * writes: 32 lowercase hex digits of 128 bits.
 *
 * A GUID must be unique, not secret, and costs no syscall: a 128-bit key
 * is read from getrandom() once per process (and again in a child after
 * fork(), which would otherwise repeat its parent's GUIDs), and GUID n of
 * the process is mix(k0 ^ n) mix(k1 ^ n), where mix is a bijection of 64
 * bits (the splitmix64 finalizer): within a process no two GUIDs share
 * their first half, and two processes repeat one only if both halves of
 * their random keys line up (about n^2 / 2^128).  libuuid, used before,
 * made five syscalls per GUID (getrandom, getpid, getuid, getppid, gettid).
 * This key is process state as libc's random() state is; it is never
 * part of a store.
 */
#include "guid.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

static struct {
	uint64_t key[2];
	uint64_t next;     /* GUIDs made with this key (atomic) */
} guid_state;
static pthread_once_t guid_once = PTHREAD_ONCE_INIT;

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* A fresh key: getrandom(), else /dev/urandom, else the clock and pid
   (never fails: GUIDs are made inside saves that must go on). */
static void guid_rekey(void)
{
	uint64_t key[2];
	size_t got = 0;

	while (got < sizeof(key)) {
		ssize_t n = getrandom((char *)key + got, sizeof(key) - got, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += n;
	}
	if (got < sizeof(key)) {
		int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
		struct timespec ts;

		if (fd < 0 || read(fd, key, sizeof(key)) != sizeof(key)) {
			clock_gettime(CLOCK_REALTIME, &ts);
			key[0] = mix64((uint64_t)ts.tv_sec * 1000000000 + ts.tv_nsec);
			key[1] = mix64(key[0] ^ (uint64_t)getpid());
		}
		if (fd >= 0)
			close(fd);
	}
	guid_state.key[0] = key[0];
	guid_state.key[1] = key[1];
	__atomic_store_n(&guid_state.next, 0, __ATOMIC_RELAXED);
}

static void guid_init(void)
{
	guid_rekey();
	pthread_atfork(NULL, NULL, guid_rekey);
}

void dbox_guid_generate(char buf[33])
{
	static const char hex[] = "0123456789abcdef";
	uint64_t n, half[2];

	pthread_once(&guid_once, guid_init);
	n = __atomic_fetch_add(&guid_state.next, 1, __ATOMIC_RELAXED);
	half[0] = mix64(guid_state.key[0] ^ n);
	half[1] = mix64(guid_state.key[1] ^ n);
	for (int i = 0; i < 32; i++)
		buf[i] = hex[(half[i / 16] >> (60 - 4 * (i % 16))) & 0xf];
	buf[32] = '\0';
}
