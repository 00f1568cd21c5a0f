/*
 * procid.c — a process's start time as krexd sees it, read from whatever
 * /proc and time namespace the caller has (docs/design/shim.md
 * "Registration in namespaces").  A registration carries it so that krexd
 * can tell its process from a later one given the same pid: /proc/self when
 * /proc is an ancestor namespace's, another process's through a pidfd, a
 * time namespace's boot-time offset taken back out.  What cannot be read
 * comes back as 0 ("unknown").
 */
#define _GNU_SOURCE
#include "procid.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

/* Field 22 and the state of the stat file at `path`: 0, -ENOENT when it
 * cannot be opened (no such process there), -EINVAL when unreadable. */
static int stat_file(const char *path, uint64_t *ticks, int *zombie)
{
    char buf[1024];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -ENOENT;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -ENOENT;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    if (!p || p[1] != ' ')
        return -EINVAL;
    p += 2;
    *zombie = (*p == 'Z' || *p == 'X');
    /* p points at field 3 (state); field 22 is 19 spaces further. */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return -EINVAL;
        p++;
    }
    *ticks = strtoull(p, NULL, 10);
    return 0;
}

/* The caller's boot-time offset in clock ticks (0 in the initial time
 * namespace); 0 with *known = 0 when it cannot be told.  timens_offsets
 * shows the namespace of the caller's future children: it is the caller's
 * own only when /proc/self/ns/time and time_for_children are the same. */
static int64_t boottime_offset_ticks(int *known)
{
    struct stat a, b;
    *known = 0;
    if (stat("/proc/self/ns/time", &a) != 0) {
        *known = errno == ENOENT; /* a kernel without time namespaces: no offset */
        return 0;
    }
    if (stat("/proc/self/ns/time_for_children", &b) != 0 || a.st_ino != b.st_ino)
        return 0;
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
    /* Offsets the kernel accepts are far smaller; refuse what would not fit. */
    if (!found || hz <= 0 || sec > INT64_MAX / hz / 2 || sec < INT64_MIN / hz / 2)
        return 0;
    *known = 1;
    return (int64_t)sec * hz + (int64_t)nsec / (1000000000LL / hz);
}

/* `ticks` read by the caller, in the initial time namespace's terms; 0 when
 * the caller's offset cannot be told. */
static uint64_t normalise(uint64_t ticks)
{
    int known = 0;
    int64_t off = boottime_offset_ticks(&known);
    if (!known || ticks == 0 || ticks > INT64_MAX)
        return 0;
    int64_t v = (int64_t)ticks - off;
    return v > 0 ? (uint64_t)v : 0;
}

uint64_t krex_self_start_ticks(void)
{
    uint64_t ticks = 0;
    int zombie = 0;
    if (stat_file("/proc/self/stat", &ticks, &zombie) != 0)
        return 0; /* /proc of an unrelated pid namespace, or none */
    return normalise(ticks);
}

/* The number /proc gives the process of pidfd `pfd`: >0, 0 when it is not
 * in /proc's namespace, -1 when it has been reaped, -2 unreadable. */
static int proc_number(int pfd)
{
    char path[64], line[128];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", pfd);
    FILE *f = fopen(path, "re");
    if (!f)
        return -2;
    int n = -2, v = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Pid: %d", &v) == 1) {
            n = v;
            break;
        }
    fclose(f);
    return n;
}

int krex_proc_start(int32_t pid, uint64_t *ticks, int *zombie)
{
    if (pid <= 0)
        return -ENOENT;
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pfd < 0)
        return errno == ESRCH ? -ENOENT : -EINVAL; /* no pidfds: cannot tell */
    int r = -EINVAL, n = proc_number(pfd);
    if (n == -1) {
        r = -ENOENT;
    } else if (n > 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/stat", n);
        r = stat_file(path, ticks, zombie);
        /* Still the same process (not reaped, its number not reused
         * meanwhile)?  The pidfd says. */
        if (proc_number(pfd) != n)
            r = -ENOENT;
        else if (r == 0)
            *ticks = normalise(*ticks);
    }
    close(pfd);
    return r;
}
