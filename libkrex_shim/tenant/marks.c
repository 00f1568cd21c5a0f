/*
 * marks.c — per-thread in-flight marks and the drainer's asymmetric barrier
 * (marks.h; docs/design/shim.md, "Thread marks").
 */
#define _GNU_SOURCE
#include "marks.h"
#include "base.h"
#include "gate_internal.h"
#include "testhook.h"

#include <errno.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

__thread struct krex_mark *krex_mark_self __attribute__((tls_model("initial-exec")));
_Atomic int krex_marks_on;
_Atomic uint32_t krex_mark_waiters;

/* Every mark ever made, newest first; marks are never freed. */
static struct krex_mark *_Atomic marks_head;
static pthread_key_t mark_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static int key_ok;
/* The layer above's step at a thread's exit (krex_marks_init).  Release
 * store, acquire load: set before gating is published, read on a thread
 * that made a gated call; the pair keeps that order explicit. */
static void (*_Atomic thread_gone)(void);

/* Iterations of the busy phase before a wait parks (a few µs). */
#define MARK_SPIN_ITERS 200

/* A thread that exits gives its mark back, cleared; release so that the
 * next owner's claim (acquire CAS) sees the mark as this thread left it. */
static void mark_release(void *p)
{
    struct krex_mark *m = p;
    /* A call this thread left counted (cancelled or pthread_exit'd out of
     * a driver call, or longjmp'd out and never called again) is over:
     * the thread runs its key destructors, in no call.  Its count goes
     * (the call layer's step, handed over at krex_marks_init). */
    void (*gone)(void) = atomic_load_explicit(&thread_gone, memory_order_acquire);
    if (gone)
        gone();
    krex_mark_self = NULL;
    atomic_store_explicit(&m->used, 0, memory_order_release);
}

static void make_key(void) { key_ok = pthread_key_create(&mark_key, mark_release) == 0; }

/* The membarrier registration (again in a fork child). */
static void marks_register(void)
{
    const char *env = getenv("KREX_SHIM_THREAD_MARKS");
    int on = !(env && !strcmp(env, "0")) &&
             syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
    pthread_once(&key_once, make_key);
    /* Relaxed: published to other threads by the release store of
     * krex_mode (init) or krex_slot_p (a fork child registering). */
    atomic_store_explicit(&krex_marks_on, on && key_ok, memory_order_relaxed);
    if (!on)
        krex_log(KREX_LOG_DEBUG, "thread marks off: every gated call counts in the slot");
}

void krex_marks_init(void (*at_thread_exit)(void))
{
    atomic_store_explicit(&thread_gone, at_thread_exit, memory_order_release);
    marks_register();
}

/* Claim a free mark, else make one. */
static struct krex_mark *claim_mark(void)
{
    /* Acquire: the list's marks are fully initialized (release push). */
    for (struct krex_mark *m = atomic_load_explicit(&marks_head, memory_order_acquire); m;
         m = atomic_load_explicit(&m->next, memory_order_acquire)) {
        uint32_t free_ = 0;
        /* Acquire pairs with mark_release: the mark is clear. */
        if (atomic_load_explicit(&m->used, memory_order_relaxed) == 0 &&
            atomic_compare_exchange_strong_explicit(&m->used, &free_, 1, memory_order_acquire,
                                                    memory_order_relaxed))
            return m;
    }
    struct krex_mark *m = aligned_alloc(64, sizeof *m);
    if (!m)
        return NULL;
    atomic_init(&m->busy, 0);
    atomic_init(&m->used, 1);
    struct krex_mark *head = atomic_load_explicit(&marks_head, memory_order_relaxed);
    do {
        atomic_store_explicit(&m->next, head, memory_order_relaxed);
        /* Release: a drainer that finds the mark through the list sees it
         * initialized. */
    } while (!atomic_compare_exchange_weak_explicit(&marks_head, &head, m, memory_order_release,
                                                    memory_order_relaxed));
    return m;
}

struct krex_mark *krex_mark_new(void)
{
    if (!atomic_load_explicit(&krex_marks_on, memory_order_relaxed))
        return NULL;
    int saved = errno;
    struct krex_mark *m = claim_mark();
    if (m && pthread_setspecific(mark_key, m) != 0) {
        /* Without the key the mark would never be given back: do not use it. */
        atomic_store_explicit(&m->used, 0, memory_order_release);
        m = NULL;
    }
    krex_mark_self = m;
    errno = saved;
    return m;
}

void krex_mark_wake(struct krex_mark *m)
{
    int saved = errno;
    syscall(SYS_futex, (uint32_t *)&m->busy, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
    errno = saved;
}

/* Wait until mark `m` is clear, at most until `deadline` (ns, CLOCK_MONOTONIC;
 * INT64_MAX: no limit).  0 or -ETIMEDOUT. */
static int wait_clear(struct krex_mark *m, int64_t deadline)
{
    /* Acquire: the cleared call's driver work happens-before what the
     * caller does next (it synchronizes the contexts). */
    for (int i = 0; i < MARK_SPIN_ITERS; i++) {
        if (!atomic_load_explicit(&m->busy, memory_order_acquire))
            return 0;
        krex_cpu_relax();
    }
    uint32_t busy;
    while ((busy = atomic_load_explicit(&m->busy, memory_order_acquire)) != 0) {
        struct timespec ts, *tsp = NULL;
        if (deadline != INT64_MAX) {
            int64_t left = deadline - krex_gate_now_ns();
            if (left <= 0)
                return -ETIMEDOUT;
            ts.tv_sec = (time_t)(left / 1000000000LL);
            ts.tv_nsec = (long)(left % 1000000000LL);
            tsp = &ts;
        }
        /* Sleeps only while the mark still reads `busy`: a change after
         * our read fails the value check or wakes us (a clearing thread
         * reads the waiters count after its store; see marks.h). */
        syscall(SYS_futex, (uint32_t *)&m->busy, FUTEX_WAIT_PRIVATE, busy, tsp, NULL, 0);
    }
    return 0;
}

int krex_marks_quiesce(int64_t timeout_ns)
{
    if (!atomic_load_explicit(&krex_marks_on, memory_order_relaxed))
        return 0;
    int saved = errno, rc = 0;
    int64_t now = krex_gate_now_ns();
    int64_t deadline = timeout_ns < 0 || timeout_ns > INT64_MAX - now ? INT64_MAX
                                                                      : now + timeout_ns;
    /* seq_cst RMW before the barrier: a mark cleared after its thread's
     * barrier reads the count non-zero and wakes us. */
    atomic_fetch_add_explicit(&krex_mark_waiters, 1, memory_order_seq_cst);
    KREX_TEST_POINT("marks_quiesce");
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0 &&
        syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) != 0) {
        rc = -errno;
        goto out;
    }
    for (struct krex_mark *m = atomic_load_explicit(&marks_head, memory_order_acquire); m;
         m = atomic_load_explicit(&m->next, memory_order_acquire)) {
        if ((rc = wait_clear(m, deadline)) != 0)
            break;
    }
out:
    atomic_fetch_sub_explicit(&krex_mark_waiters, 1, memory_order_seq_cst);
    errno = saved;
    return rc;
}

void krex_marks_atfork_child(void)
{
    /* The child's only thread: relaxed stores suffice.  A mark the parent's
     * other threads held busy at the fork would otherwise stall every
     * drain of the child. */
    for (struct krex_mark *m = atomic_load_explicit(&marks_head, memory_order_relaxed); m;
         m = atomic_load_explicit(&m->next, memory_order_relaxed)) {
        if (m == krex_mark_self)
            continue;
        atomic_store_explicit(&m->busy, 0, memory_order_relaxed);
        atomic_store_explicit(&m->used, 0, memory_order_relaxed);
    }
    atomic_store_explicit(&krex_mark_waiters, 0, memory_order_relaxed);
    /* A new process: its membarrier registration is made again (the marks
     * turn off, and this thread's with them, if it fails). */
    marks_register();
    if (!atomic_load_explicit(&krex_marks_on, memory_order_relaxed) && krex_mark_self) {
        atomic_store_explicit(&krex_mark_self->used, 0, memory_order_relaxed);
        krex_mark_self = NULL;
    }
}
