#ifndef DBOXFS_FS_OPTIONS_H
#define DBOXFS_FS_OPTIONS_H

/*
 * options: the allowed ranges of dboxfs's numeric -o options, checked on
 * the text the user gave (fuse_opt's own "%lu"/"%u"/"%lf" conversions
 * take "-1", "12abc", "nan" or "1e999" without complaint):
 *
 *   rotate_size=BYTES      1 .. 4294967295: an m.N stays below 4 GiB,
 *                          Dovecot's map offsets being 32-bit
 *                          (docs/dbox-format.md section 6)
 *   entry_timeout=SECS     0 .. 31536000 (a year), decimal, fractions
 *   attr_timeout=SECS      allowed ("0.5")
 *   purge_threshold=PCT    0 .. 100
 */

/* Check every occurrence of those options in the command line (parsed
   with fuse_opt, as main() parses it; other arguments are ignored).
   Prints "PROG: -o NAME=VALUE: want ... from MIN to MAX" on stderr for
   each bad one.  Returns 0 when all are in range, -1 otherwise (also when
   fuse_opt itself rejects the command line, which it reports). */
int fs_options_check(int argc, char *argv[]);

#endif
