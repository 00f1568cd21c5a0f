/*
 * simgpu.c — the simulated device: when enqueued work runs, how long a
 * synchronizing call sleeps, and the timeline file.
 *
 * No thread executes anything.  Each stream keeps `tail_ns`, the
 * CLOCK_MONOTONIC time at which its last enqueued work ends.  Work enqueued
 * at host time t with duration d on stream s runs on [start, start + d) with
 *
 *   start = max(t, s.tail, deps)
 *   deps  = s is the legacy default stream: tails of every blocking stream of
 *           the context (legacy synchronization: it waits for all of them);
 *           s is a blocking stream: the legacy stream's tail (they wait for it);
 *           s is CU_STREAM_NON_BLOCKING: none.
 *
 * so work of one stream never overlaps and different streams overlap freely.
 * The interval is decided at enqueue time: work keeps "running" when the
 * process is frozen or killed, like a real GPU's.  Streams accept at most
 * FC_QUEUE_DEPTH unfinished operations; a further launch blocks (sleeping)
 * until the oldest finishes, as a full real launch queue does.
 *
 * Timeline line (one write(2) on an O_APPEND descriptor, so lines of many
 * processes never interleave):
 *
 *   pid tid stream_id kind start_ns end_ns captured
 */
#include "fakecuda.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define NS_PER_S 1000000000ull

uint64_t fc_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

void fc_sleep_until(uint64_t t_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(t_ns / NS_PER_S), .tv_nsec = (long)(t_ns % NS_PER_S)};
    /* Absolute deadline, so a signal that interrupts the sleep loses nothing. */
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static uint64_t max_u64(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

/* Drop the end times of finished operations from the stream's queue. */
static void queue_reap(struct CUstream_st *s, uint64_t now)
{
    while (s->pend_count > 0 && s->pend[s->pend_head] <= now) {
        s->pend_head = (s->pend_head + 1) % FC_QUEUE_DEPTH;
        s->pend_count--;
    }
}

CUresult fc_enqueue(struct CUstream_st *s, uint64_t duration_ns, uint64_t *start_ns,
                    uint64_t *end_ns)
{
    for (;;) {
        queue_reap(s, fc_now_ns());
        if (s->pend_count < FC_QUEUE_DEPTH)
            break;
        /* Queue full: wait, without the lock, for its oldest operation. */
        uint64_t oldest = s->pend[s->pend_head];
        fc_unlock();
        fc_sleep_until(oldest);
        fc_lock();
        if (!s->alive)
            return CUDA_ERROR_INVALID_HANDLE;
    }
    struct CUctx_st *ctx = s->ctx;
    uint64_t start = max_u64(fc_now_ns(), s->tail_ns);
    if (s->kind == FC_STREAM_LEGACY) {
        for (const struct CUstream_st *x = ctx->streams; x; x = x->next)
            if (!(x->flags & CU_STREAM_NON_BLOCKING))
                start = max_u64(start, x->tail_ns);
        start = max_u64(start, ctx->retired_blocking_tail_ns);
    } else if (!(s->flags & CU_STREAM_NON_BLOCKING)) {
        start = max_u64(start, ctx->legacy->tail_ns);
    }
    uint64_t end = start + duration_ns;
    s->tail_ns = end;
    /* End times are pushed in increasing order (tails only grow), so the
     * ring's head is always the operation that finishes first. */
    s->pend[(s->pend_head + s->pend_count) % FC_QUEUE_DEPTH] = end;
    s->pend_count++;
    *start_ns = start;
    *end_ns = end;
    return CUDA_SUCCESS;
}

CUresult fc_timeline_open(const char *path)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        fprintf(stderr, "fakecuda: KREX_FAKE_TIMELINE=%s: cannot open: %s\n", path,
                strerror(errno));
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    /* Tenants of other users append to the same file (mode 0666 despite umask). */
    (void)fchmod(fd, 0666);
    fc.timeline_fd = fd;
    return CUDA_SUCCESS;
}

void fc_timeline_write(uint64_t stream_id, enum fc_kind kind, uint64_t start_ns,
                       uint64_t end_ns, bool captured)
{
    static bool reported; /* guarded by fc.mu, held by every caller */
    if (fc.timeline_fd < 0)
        return;
    char line[160];
    int n = snprintf(line, sizeof line, "%ld %ld %" PRIu64 " %c %" PRIu64 " %" PRIu64 " %d\n",
                     (long)getpid(), (long)gettid(), stream_id, (char)kind, start_ns, end_ns,
                     captured ? 1 : 0);
    /* One write(2) per line: with O_APPEND the kernel positions and writes
     * it as one unit, so concurrent appenders never interleave lines. */
    ssize_t w = write(fc.timeline_fd, line, (size_t)n);
    if (w != (ssize_t)n && !reported) {
        reported = true;
        fprintf(stderr, "fakecuda: timeline write failed (%zd of %d bytes): %s\n", w, n,
                w < 0 ? strerror(errno) : "short write");
    }
}
