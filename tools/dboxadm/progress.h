#ifndef DBOXADM_PROGRESS_H
#define DBOXADM_PROGRESS_H

/*
 * progress: the one updating status line of a long dboxadm run
 * ("imported 1234 messages, 56.7 MB"), on stderr and only when stderr is
 * a terminal; silent when stderr is a pipe or a file.
 */

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

struct progress {
	bool enabled;          /* stderr is a terminal */
	bool shown;            /* a line is on the screen now */
	const char *verb;      /* "imported", "exported"; not owned */
	const char *unit;      /* what is counted: "messages" unless set
				  after progress_init; not owned */
	uint64_t messages;     /* counted so far */
	uint64_t bytes;
	struct timespec last;  /* CLOCK_MONOTONIC of the last redraw */
};

/* Start a progress line for verb (a static string).  Becomes the line
   that progress_clear() erases. */
void progress_init(struct progress *p, const char *verb);

/* Count messages and bytes; redraw when 0.2 s passed since the last
   redraw. */
void progress_add(struct progress *p, uint64_t messages, uint64_t bytes);

/* Erase the line currently shown, if any, so that another message can be
   printed on stderr; the next progress_add() draws it again.  Used by the
   log sink before every message. */
void progress_clear(void);

/* Draw the final counts and end the line; p stops being the current
   line. */
void progress_finish(struct progress *p);

#endif
