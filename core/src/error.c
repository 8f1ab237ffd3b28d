/* error.c: the thread-local last-error message. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[512];

pi_status pi_fail(pi_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

void pi_clear_error(void) { last_error[0] = '\0'; }

const char *pi_last_error(void) { return last_error; }
