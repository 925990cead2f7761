/*
 * index-time.c: inode times as the index stores them (index.h, "Times").
 *
 * A time is nanoseconds since the epoch kept in 64 bits modulo 2^64 and
 * read back in the window [DBOX_TIME_MIN_SEC, DBOX_TIME_MIN_SEC + 2^64 ns),
 * 1901-12-13 to 2486: ext4's whole range fits, to the nanosecond, and every
 * value a store written by older code holds for 1901..2262 reads as it
 * did, so no row is rewritten.  Values are clamped on the way in exactly
 * as the kernel clamps them for ext4 (timestamp_truncate(): the seconds to
 * the range, and the nanoseconds dropped at either end of it).
 */
#include "index.h"

#define NS 1000000000LL

/* The window's start in ns (fits int64: -2.1e18). */
#define WINDOW_START_NS (DBOX_TIME_MIN_SEC * NS)

int64_t dbox_time_make(int64_t sec, int64_t nsec)
{
	uint64_t off;

	/* A timespec with nsec out of 0..999999999 is normalised first. */
	if (nsec < 0 || nsec >= NS) {
		int64_t carry = nsec / NS - (nsec % NS < 0);

		if ((carry > 0 && sec > INT64_MAX - carry) ||
		    (carry < 0 && sec < INT64_MIN - carry))
			sec = carry > 0 ? INT64_MAX : INT64_MIN;
		else
			sec += carry;
		nsec -= carry * NS;
	}
	if (sec <= DBOX_TIME_MIN_SEC) {
		sec = DBOX_TIME_MIN_SEC;
		nsec = 0;
	} else if (sec >= DBOX_TIME_MAX_SEC) {
		sec = DBOX_TIME_MAX_SEC;
		nsec = 0;
	}
	off = (uint64_t)(sec - DBOX_TIME_MIN_SEC) * NS + (uint64_t)nsec;
	return (int64_t)(off + (uint64_t)WINDOW_START_NS);
}

/* Offset of t from the window's start, 0 .. 2^64-1 ns. */
static uint64_t window_off(int64_t t)
{
	return (uint64_t)t - (uint64_t)WINDOW_START_NS;
}

void dbox_time_split(int64_t t, int64_t *sec_r, int64_t *nsec_r)
{
	uint64_t off = window_off(t);

	*sec_r = DBOX_TIME_MIN_SEC + (int64_t)(off / NS);
	*nsec_r = (int64_t)(off % NS);
}

int64_t dbox_time_sec(int64_t t)
{
	return DBOX_TIME_MIN_SEC + (int64_t)(window_off(t) / NS);
}

int dbox_time_cmp(int64_t a, int64_t b)
{
	uint64_t x = window_off(a), y = window_off(b);

	return x < y ? -1 : x > y;
}
