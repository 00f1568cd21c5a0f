/*
 * base.c — logging and the clock of libkrex_shim (base.h).
 */
#include "base.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int krex_log_level = KREX_LOG_WARN;

void krex_log_init(void)
{
    const char *s = getenv("KREX_SHIM_LOG");
    int level = KREX_LOG_WARN;
    if (s && !strcmp(s, "debug"))
        level = KREX_LOG_DEBUG;
    else if (s && !strcmp(s, "info"))
        level = KREX_LOG_INFO;
    else if (s && !strcmp(s, "error"))
        level = KREX_LOG_ERROR;
    krex_log_level = level;
}

void krex_log_write(int level, const char *func, const char *fmt, ...)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    int saved = errno;
    char buf[768];
    int n = snprintf(buf, sizeof buf, "krex-shim[%d] %s: %s: ", (int)getpid(),
                     names[level & 3], func);
    if (n < 0)
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof buf - 2)
        len = sizeof buf - 2;
    buf[len++] = '\n';
    /* One write(2): no stdio buffer, no allocation, lines do not interleave. */
    ssize_t w = write(STDERR_FILENO, buf, len);
    (void)w;
    errno = saved;
}

uint64_t krex_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
