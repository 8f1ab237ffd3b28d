/* error.c: thread-local last-error message and the build's system info line. */
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

const char *pi_system_info(void) {
    return "AVX = "
#ifdef __AVX__
        "1"
#else
        "0"
#endif
        " | AVX2 = "
#ifdef __AVX2__
        "1"
#else
        "0"
#endif
        " | AVX512F = "
#ifdef __AVX512F__
        "1"
#else
        "0"
#endif
        " | AVX512_VNNI = "
#ifdef __AVX512VNNI__
        "1"
#else
        "0"
#endif
        " | F16C = "
#ifdef __F16C__
        "1"
#else
        "0"
#endif
        " | FMA = "
#ifdef __FMA__
        "1"
#else
        "0"
#endif
        " | NEON = "
#ifdef __ARM_NEON
        "1"
#else
        "0"
#endif
        ;
}
