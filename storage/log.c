/* log.c: the process-wide log sink (see log.h). */
#include "log.h"

#include <stdio.h>

static void stderr_sink(enum dbox_log_level level, const char *fmt,
			va_list args)
{
	static const char *const prefix[] = {
		[DBOX_LOG_ERROR] = "error: ",
		[DBOX_LOG_WARNING] = "warning: ",
		[DBOX_LOG_INFO] = "",
		[DBOX_LOG_DEBUG] = "debug: ",
	};
	fputs(prefix[level], stderr);
	vfprintf(stderr, fmt, args);
	fputc('\n', stderr);
}

/* The only mutable global outside the store context: set once at start-up. */
static dbox_log_sink_t *log_sink = stderr_sink;

void dbox_log_set_sink(dbox_log_sink_t *sink)
{
	log_sink = sink != NULL ? sink : stderr_sink;
}

dbox_log_sink_t *dbox_log_get_sink(void)
{
	return log_sink;
}

void dbox_log(enum dbox_log_level level, const char *fmt, ...)
{
	va_list args;

	va_start(args, fmt);
	log_sink(level, fmt, args);
	va_end(args);
}
