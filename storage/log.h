#ifndef DBOXFS_LOG_H
#define DBOXFS_LOG_H

/*
 * The one logging sink shared by storage/, index/, fs/ and tools/.
 *
 * storage/ and index/ must not know where messages end up (syslog for the
 * daemon, stderr for dboxadm), so they call dbox_log() and the program that
 * owns the process installs the sink once at start-up with dbox_log_set_sink().
 * Before that, messages go to stderr.
 */

#include <stdarg.h>
#include <stddef.h>

enum dbox_log_level {
	DBOX_LOG_ERROR,   /* an operation failed: data unreadable, I/O error */
	DBOX_LOG_WARNING, /* something was wrong but was handled */
	DBOX_LOG_INFO,    /* notable events: mount, recovery, purge */
	DBOX_LOG_DEBUG,   /* only shown with -d */
};

typedef void dbox_log_sink_t(enum dbox_log_level level, const char *fmt,
			     va_list args);

/* Install the sink for all later messages; NULL restores the stderr sink.
   Not thread-safe: call before starting threads. */
void dbox_log_set_sink(dbox_log_sink_t *sink);

/* The sink installed now (never NULL), e.g. to restore it later. */
dbox_log_sink_t *dbox_log_get_sink(void);

/* Log one message (printf-style, no trailing newline needed).  The
   formatted text reaches the sink escaped (dbox_log_escape): bytes read
   from files and names put into a message cannot act on a terminal or
   split a log line. */
void dbox_log(enum dbox_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Copy the NUL-terminated text src into dst (dst_size bytes, always
   NUL-terminated, cut short when it does not fit) with every byte that
   could act on a terminal or a log written as \xNN: control bytes
   (below 0x20, and 0x7f; a newline too, so a message stays one line),
   bytes outside a well-formed UTF-8 sequence, and the C1 controls
   U+0080-U+009F (an 8-bit CSI).  Everything else, UTF-8 folder names
   included, is copied as is.  Returns dst. */
char *dbox_log_escape(char *dst, size_t dst_size, const char *src);

/* The length in bytes of the character at text (NUL-terminated) when
   it may reach a terminal as it is: a well-formed UTF-8 sequence that is
   no control (C0 below 0x20, 0x7f, C1 U+0080-U+009F; Unicode's table
   3-7 of well-formed sequences); 0 for a byte to escape, the NUL too.
   What dbox_log_escape, dboxadm dump and --json use. */
size_t dbox_text_char_len(const char *text);

/* Bytes dbox_log_escape needs at most for len bytes of text. */
#define DBOX_LOG_ESCAPED_SIZE(len) ((len) * 4 + 1)

#define dbox_error(...) dbox_log(DBOX_LOG_ERROR, __VA_ARGS__)
#define dbox_warning(...) dbox_log(DBOX_LOG_WARNING, __VA_ARGS__)
#define dbox_info(...) dbox_log(DBOX_LOG_INFO, __VA_ARGS__)
#define dbox_debug(...) dbox_log(DBOX_LOG_DEBUG, __VA_ARGS__)

#endif
