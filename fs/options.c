/*
 * options.c: range checks of dboxfs's numeric -o options (options.h).
 * Only checks: the values main() uses still come from its fuse_opt table,
 * and every value that passes here converts the same way there.
 */
#include "fs/options.h"

#include <errno.h>
#include <fuse_opt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct range {
	const char *name;     /* option name, without '=' */
	bool fraction;        /* decimal fraction allowed ("0.5") */
	double min, max;
	const char *what;     /* "a whole number of bytes", ... */
};

static const struct range ranges[] = {
	{ "rotate_size", false, 1, 4294967295.0, "a whole number of bytes" },
	{ "entry_timeout", true, 0, 31536000, "seconds" },
	{ "attr_timeout", true, 0, 31536000, "seconds" },
	{ "purge_threshold", false, 0, 100, "a whole percentage" },
};

#define NRANGES (sizeof(ranges) / sizeof(ranges[0]))

/* One key per range: FUSE_OPT_KEY("name=", i) hands every occurrence to
   check_proc. */
static const struct fuse_opt check_spec[] = {
	FUSE_OPT_KEY("rotate_size=", 0),
	FUSE_OPT_KEY("entry_timeout=", 1),
	FUSE_OPT_KEY("attr_timeout=", 2),
	FUSE_OPT_KEY("purge_threshold=", 3),
	FUSE_OPT_END
};

struct check {
	bool bad;
};

/* Is value a plain decimal number (digits, one '.' if fraction) within
   r?  No sign, no spaces, no exponent, no hex, no inf/nan. */
static bool in_range(const struct range *r, const char *value)
{
	size_t digits = strspn(value, "0123456789");
	const char *rest = value + digits;
	double v;
	char *end;

	if (r->fraction && *rest == '.') {
		size_t frac = strspn(rest + 1, "0123456789");

		digits += frac;
		rest += 1 + frac;
	}
	if (digits == 0 || *rest != '\0')
		return false;
	errno = 0;
	v = strtod(value, &end);
	return *end == '\0' && errno == 0 && isfinite(v) &&
		v >= r->min && v <= r->max;
}

static int check_proc(void *data, const char *arg, int key,
		      struct fuse_args *outargs)
{
	struct check *c = data;
	const struct range *r;

	(void)outargs;
	if (key < 0 || (size_t)key >= NRANGES)
		return 0; /* not ours: main() parses it */
	r = &ranges[key];
	if (!in_range(r, arg + strlen(r->name) + 1)) {
		fprintf(stderr, "dboxfs: -o %s: want %s from %.15g to %.15g\n",
			arg, r->what, r->min, r->max);
		c->bad = true;
	}
	return 0;
}

int fs_options_check(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct check c = { 0 };
	int ret = fuse_opt_parse(&args, &c, check_spec, check_proc);

	fuse_opt_free_args(&args);
	return ret < 0 || c.bad ? -1 : 0;
}
