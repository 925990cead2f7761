/*
 * progress.c: the updating status line of import and export (see
 * progress.h).  Drawn with "\r" + text + erase-to-end-of-line, at most
 * every 0.2 s, never when stderr is not a terminal.
 *
 * `current` is the line on the screen: a process draws at most one, and
 * the log sink has no context argument to reach it otherwise.
 */
#include "progress.h"

#include <stdio.h>
#include <unistd.h>

#define REDRAW_NS 200000000LL

static struct progress *current;

static int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void draw(struct progress *p)
{
	fprintf(stderr, "\r%s %llu %s, %.1f MB\033[K", p->verb,
		(unsigned long long)p->messages, p->unit, p->bytes / 1e6);
	fflush(stderr);
	p->shown = true;
}

void progress_init(struct progress *p, const char *verb)
{
	p->enabled = isatty(STDERR_FILENO);
	p->shown = false;
	p->verb = verb;
	p->unit = "messages";
	p->messages = 0;
	p->bytes = 0;
	clock_gettime(CLOCK_MONOTONIC, &p->last);
	current = p;
}

void progress_add(struct progress *p, uint64_t messages, uint64_t bytes)
{
	int64_t now;

	p->messages += messages;
	p->bytes += bytes;
	if (!p->enabled)
		return;
	now = mono_ns();
	if (now - ((int64_t)p->last.tv_sec * 1000000000 + p->last.tv_nsec) <
	    REDRAW_NS)
		return;
	clock_gettime(CLOCK_MONOTONIC, &p->last);
	draw(p);
}

void progress_clear(void)
{
	if (current == NULL || !current->shown)
		return;
	fputs("\r\033[K", stderr);
	current->shown = false;
}

void progress_finish(struct progress *p)
{
	if (p->enabled) {
		draw(p);
		fputc('\n', stderr);
		p->shown = false;
	}
	if (current == p)
		current = NULL;
}
