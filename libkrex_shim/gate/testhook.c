/*
 * testhook.c — the pause points of testhook.h, compiled only into the
 * test variants of the libraries (-DKREX_TEST_HOOKS).  Off the fast path
 * of nothing: the normal builds do not contain this file.
 */
#define _GNU_SOURCE
#include "testhook.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef KREX_GATE_EXPORT
#define KREX_TEST_API __attribute__((visibility("default")))
#else
#define KREX_TEST_API __attribute__((visibility("hidden")))
#endif

/* Once per process: a later arrival at the same point runs on. */
static _Atomic int paused;
static _Atomic long skipped;

KREX_TEST_API void krex_test_point(const char *name)
{
    int saved = errno;
    const char *want = getenv("KREX_TEST_PAUSE");
    const char *file = getenv("KREX_TEST_PAUSE_FILE");
    if (!want || !file || strcmp(want, name) != 0)
        goto out;
    /* Armed only while this file exists, when set (a point also passed by
     * the calls that set the test up). */
    const char *arm = getenv("KREX_TEST_PAUSE_ARM");
    if (arm && access(arm, F_OK) != 0)
        goto out;
    /* The first N armed arrivals pass (KREX_TEST_PAUSE_SKIP=N). */
    const char *skip = getenv("KREX_TEST_PAUSE_SKIP");
    if (skip && atomic_fetch_add_explicit(&skipped, 1, memory_order_relaxed) < atol(skip))
        goto out;
    /* Relaxed: a flag for this process's threads only, nothing published. */
    if (atomic_exchange_explicit(&paused, 1, memory_order_relaxed))
        goto out;
    int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
        char buf[32];
        int n = snprintf(buf, sizeof buf, "%d\n", (int)getpid());
        if (write(fd, buf, (size_t)n) < 0) {
            /* the file's existence is what the test waits for */
        }
        close(fd);
    }
    struct timespec tick = {0, 200000}; /* 200 µs */
    for (int i = 0; i < 300000 && access(file, F_OK) == 0; i++)
        nanosleep(&tick, NULL);
out:
    errno = saved;
}
