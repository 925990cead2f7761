/*
 * dbox-fault.c: corruption reported as data (dbox-fault.h).
 */
#include "storage/dbox-fault.h"

#include <stdarg.h>
#include <stdio.h>

int dbox_fault_set(struct dbox_fault *fault, uint64_t offset,
		   const char *fmt, ...)
{
	va_list args;

	if (fault != NULL) {
		fault->offset = offset;
		va_start(args, fmt);
		vsnprintf(fault->reason, sizeof(fault->reason), fmt, args);
		va_end(args);
	}
	return -DBOX_ECORRUPT;
}
