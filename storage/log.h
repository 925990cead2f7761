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

/* Log one message (printf-style, no trailing newline needed). */
void dbox_log(enum dbox_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#define dbox_error(...) dbox_log(DBOX_LOG_ERROR, __VA_ARGS__)
#define dbox_warning(...) dbox_log(DBOX_LOG_WARNING, __VA_ARGS__)
#define dbox_info(...) dbox_log(DBOX_LOG_INFO, __VA_ARGS__)
#define dbox_debug(...) dbox_log(DBOX_LOG_DEBUG, __VA_ARGS__)

#endif
