/*
 * marks.h — per-thread in-flight marks: the per-call fast path without a
 * locked instruction (marks.c; docs/design/shim.md, "Thread marks").
 *
 * A submitting thread sets its mark, then reads the gate word with only a
 * compiler barrier between; the drainer, after reading the closed word,
 * runs membarrier(2) and reads every mark (an asymmetric fence, as in
 * liburcu and folly).  A call admitted on the marks counts in its thread's
 * mark only; every other path counts in the slot's shared `inflight`, so
 * krexd's half (coord_protocol.c) is unchanged: a process acknowledges a
 * closure only after its marks and its shared count are all zero.
 */
#ifndef KREX_MARKS_H
#define KREX_MARKS_H

#include <stdatomic.h>
#include <stdint.h>

/* One per thread that made a gated call; never freed: a thread's exit
 * gives it back for reuse (`used` = 0).  One cache line each, so that two
 * threads' marks never share a line. */
struct krex_mark {
    /* Calls of this thread admitted on the mark and not yet returned: 1, or
     * more when a signal handler's gated call interrupted one (a count, not
     * a flag, so that the inner call's leave does not clear the outer's).
     * Written only by its thread (plain load, add, store: a handler runs to
     * its end before the interrupted code resumes); private futex word. */
    _Atomic uint32_t busy;
    _Atomic uint32_t used; /* 1 while a live thread owns it */
    struct krex_mark *_Atomic next; /* every mark made, newest first (push only) */
} __attribute__((aligned(64)));

/* This thread's mark, NULL until its first gated call (or marks are off). */
extern __thread struct krex_mark *krex_mark_self __attribute__((tls_model("initial-exec")));
/* Non-zero once membarrier is registered for this process: marks may be used. */
extern _Atomic int krex_marks_on;
/* Drains or exits waiting in krex_marks_quiesce(): a clearing thread wakes them. */
extern _Atomic uint32_t krex_mark_waiters;

/* Turn marks on for this process (membarrier registration) unless
 * KREX_SHIM_THREAD_MARKS=0; called once at initialization, before gating
 * is published (a fork child's marks start over in krex_marks_atfork_child).
 * `at_thread_exit` runs first at the exit of a thread that has a mark, on
 * that thread: the call layer's release of a call the thread left counted
 * (shim.c), handed down because marks lie below it. */
void krex_marks_init(void (*at_thread_exit)(void));
/* A mark for this thread (reused or new), set in krex_mark_self; NULL when
 * marks are off or no memory (the call then counts in the shared count). */
struct krex_mark *krex_mark_new(void);
/* Wake the waiters of mark `m` (out of line, rare). */
void krex_mark_wake(struct krex_mark *m);
/* The drainer's half: membarrier(2), then wait until no mark is busy, at
 * most `timeout_ns` (< 0: no limit).  0, -ETIMEDOUT, or -errno when no
 * barrier could be issued (nothing is proven then). */
int krex_marks_quiesce(int64_t timeout_ns);
/* In a fork child (its only thread): every other thread's mark is free. */
void krex_marks_atfork_child(void);

/* Count a call in this thread's mark: a plain load and store (relaxed),
 * ordered before the caller's read of the gate word by the drainer's
 * membarrier (see above). */
static inline __attribute__((always_inline)) void krex_mark_set(struct krex_mark *m)
{
    atomic_store_explicit(&m->busy, atomic_load_explicit(&m->busy, memory_order_relaxed) + 1,
                          memory_order_relaxed);
}

/* Uncount a call after it returned: a release store (publishes the call's
 * driver work to the drainer that reads 0), then the waiters count,
 * ordered after the store by the drainer's membarrier (see above; the
 * signal fence only stops the compiler from swapping the two). */
static inline __attribute__((always_inline)) void krex_mark_clear(struct krex_mark *m)
{
    atomic_store_explicit(&m->busy, atomic_load_explicit(&m->busy, memory_order_relaxed) - 1,
                          memory_order_release);
    atomic_signal_fence(memory_order_seq_cst);
    if (__builtin_expect(atomic_load_explicit(&krex_mark_waiters, memory_order_relaxed) != 0, 0))
        krex_mark_wake(m);
}

#endif /* KREX_MARKS_H */
