/*
 * procself.c — this process as the real driver reports it: its pid in the
 * pid namespace of /proc (the host's, unless the process mounted a /proc of
 * its own; NVML lists host pids), and start times in the initial time
 * namespace's terms (a time namespace's boot-time offset taken back out).
 *
 * Records of the state file carry these, so krexd (in the initial
 * namespaces) and every process of the fake driver, whatever namespaces it
 * runs in, name and judge one process alike: a command under `unshare -pf`
 * (no --mount-proc) or `unshare -T --boottime` is listed under its host pid
 * and is not taken for dead by the others' reclaim.
 */
#include "share.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* (getpid() << 32 | the pid /proc gives): recomputed in a forked child.
 * Relaxed: a cache of values any thread computes alike. */
static _Atomic uint64_t self_pid_cache;

pid_t fc_self_pid(void)
{
    pid_t me = getpid();
    uint64_t c = atomic_load_explicit(&self_pid_cache, memory_order_relaxed);
    if ((pid_t)(c >> 32) == me && (uint32_t)c != 0)
        return (pid_t)(uint32_t)c;
    char buf[32];
    ssize_t n = readlink("/proc/self", buf, sizeof buf - 1);
    long v = 0;
    if (n > 0) {
        buf[n] = '\0';
        char *end = NULL;
        v = strtol(buf, &end, 10);
        if (!end || *end || v <= 0 || v > INT32_MAX)
            v = 0;
    }
    pid_t out = v > 0 ? (pid_t)v : me; /* no /proc of ours: the process's own view */
    atomic_store_explicit(&self_pid_cache, (uint64_t)(uint32_t)me << 32 | (uint32_t)out,
                          memory_order_relaxed);
    return out;
}

int64_t fc_boottime_offset_ticks(void)
{
    struct stat a, b;
    if (stat("/proc/self/ns/time", &a) != 0 || stat("/proc/self/ns/time_for_children", &b) != 0 ||
        a.st_ino != b.st_ino)
        return 0; /* none, or the offsets file shows another namespace's */
    FILE *f = fopen("/proc/self/timens_offsets", "re");
    if (!f)
        return 0;
    char line[128];
    long long sec = 0, nsec = 0;
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = sscanf(line, "boottime %lld %lld", &sec, &nsec) == 2;
    fclose(f);
    long hz = sysconf(_SC_CLK_TCK);
    if (!found || hz <= 0 || sec > INT64_MAX / hz / 2 || sec < INT64_MIN / hz / 2)
        return 0;
    return (int64_t)sec * hz + (int64_t)nsec / (1000000000LL / hz);
}
