/*
 * gate_internal.h — helpers shared by gate.c (both sides, tenant half) and
 * coord.c, coord_protocol.c (krexd's half); not installed, not part of the
 * gate's API.
 */
#ifndef KREX_GATE_INTERNAL_H
#define KREX_GATE_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "krex_gate.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifdef KREX_GATE_EXPORT
#define KREX_GATE_API __attribute__((visibility("default")))
#else
#define KREX_GATE_API __attribute__((visibility("hidden")))
#endif

_Static_assert(sizeof(_Atomic uint32_t) == sizeof(uint32_t), "futex word is 32 bits");
_Static_assert(sizeof(_Atomic uint64_t) == sizeof(uint64_t), "word is 64 bits");

static inline void krex_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

static inline int64_t krex_gate_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The gate and the slot memories are MAP_SHARED mappings used by several
 * processes, so the futex operations are the shared (non-PRIVATE) kind.
 * FUTEX_WAIT only reads the word: it works on a read-only mapping (the
 * tenants' view of the gate, krexd's view of a slot memory). */
static inline int krex_futex_wait(const _Atomic uint32_t *addr, uint32_t expected,
                                  int64_t timeout_ns)
{
    struct timespec ts, *tsp = NULL;
    if (timeout_ns >= 0) {
        ts.tv_sec = (time_t)(timeout_ns / 1000000000LL);
        ts.tv_nsec = (long)(timeout_ns % 1000000000LL);
        tsp = &ts;
    }
    long r = syscall(SYS_futex, (const uint32_t *)addr, FUTEX_WAIT, expected, tsp, NULL, 0);
    return r == 0 ? 0 : -errno;
}

static inline void krex_futex_wake_all(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* futex_waitv (Linux 5.16): wait on several 32-bit words at once.  The
 * layout and number are the kernel's, spelled out here so that older
 * headers build too (the number is the same on every architecture). */
#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif
#define KREX_FUTEX2_SIZE_U32 0x02u /* shared (no FUTEX2_PRIVATE), like every futex here */
#define KREX_FUTEX_WAITV_MAX 128u

struct krex_futex_waitv {
    uint64_t val;
    uint64_t uaddr;
    uint32_t flags;
    uint32_t reserved_;
};

/* Wait until one of the `n` words no longer holds its value, or it is
 * woken, or CLOCK_MONOTONIC reaches `deadline_ns` (absolute).  Only reads
 * the words (read-only mappings are fine).  0 when woken, else -errno:
 * -EAGAIN (a value differed), -ETIMEDOUT, -EINTR, -ENOSYS (older kernel). */
static inline int krex_futex_waitv(const struct krex_futex_waitv *w, uint32_t n,
                                   int64_t deadline_ns)
{
    struct timespec ts = {(time_t)(deadline_ns / 1000000000LL), (long)(deadline_ns % 1000000000LL)};
    long r = syscall(SYS_futex_waitv, w, n, 0, &ts, CLOCK_MONOTONIC);
    return r >= 0 ? 0 : -errno;
}

/* The ownership word (seq_cst: it is the slot's half of the pairing of
 * registration with closure, and every transition reads it fresh). */
static inline uint64_t krex_owner_load(const struct krex_slot *s)
{
    return atomic_load_explicit(&((struct krex_slot *)s)->owner, memory_order_seq_cst);
}

/* A slot state whose owner is a live registrant: drained, counted in
 * summaries and reclaimed when it dies (ACTIVE, or EXITING: past its exit
 * synchronization). */
static inline int krex_owner_registered(uint32_t st)
{
    return st == KREX_SLOT_ACTIVE || st == KREX_SLOT_EXITING;
}

/* ---- the per-call protocol's fast path (paper §4.2) ----------------------
 *
 * One definition, inlined both into the shim's hooks (tenant/call.h) and into the
 * exported krex_gate_try_enter()/krex_gate_leave() of gate.c: the hooks'
 * fast path is then straight-line code with no call besides the driver's
 * (an out-of-line call per step cost several ns per gated call). */

/* Out of line, rare: undo an increment that met a closed gate; wake a
 * drainer waiting for zero in krex_gate_wait_idle (gate.c). */
__attribute__((visibility("hidden"))) void krex_gate_retract(struct krex_slot *s);
__attribute__((visibility("hidden"))) void krex_gate_wake_idle(struct krex_slot *s);

static inline __attribute__((always_inline)) int krex_gate_admits(uint64_t w, uint32_t tenant)
{
    return w == 0 || krex_gate_holder(w) == tenant;
}

static inline __attribute__((always_inline)) int
krex_gate_try_enter_inline(const struct krex_gate *g, struct krex_slot *s, uint32_t tenant)
{
    /* Increment, then check: both seq_cst (the submitter half of the
     * Dekker pairing; on x86 the RMW is a locked instruction and the load
     * a plain one). */
    atomic_fetch_add_explicit(&s->inflight, 1, memory_order_seq_cst);
    uint64_t w = atomic_load_explicit(&((struct krex_gate *)g)->word, memory_order_seq_cst);
    if (__builtin_expect(krex_gate_admits(w, tenant), 1)) {
        /* Statistics only: a relaxed load and store, not a locked
         * read-modify-write, so the fast path keeps one locked increment
         * and one locked decrement; threads racing here may lose a count. */
        atomic_store_explicit(&s->gated_calls,
                              atomic_load_explicit(&s->gated_calls, memory_order_relaxed) + 1,
                              memory_order_relaxed);
        return 1;
    }
    krex_gate_retract(s);
    return 0;
}

static inline __attribute__((always_inline)) void krex_gate_leave_inline(struct krex_slot *s)
{
    /* seq_cst like every RMW on inflight (one total order with the
     * drainer's reads); it also releases the driver call's effects to the
     * drainer that reads zero before synchronizing the contexts. */
    uint32_t prev = atomic_fetch_sub_explicit(&s->inflight, 1, memory_order_seq_cst);
    if (__builtin_expect(prev == (KREX_INFLIGHT_WAITER | 1u), 0))
        krex_gate_wake_idle(s);
}

/* Fill `out` from slot `s` (relaxed reads except the owner: a status
 * snapshot, fields may be mutually stale; every word is one aligned load,
 * never torn).  Bounds are the caller's. */
void krex_slot_snapshot(const struct krex_slot *s, uint32_t tenant, uint32_t index,
                        struct krex_slot_info *out);

/* The checks both sides make on a slot memory fd before mapping it
 * (gate.c): 0 or -EPROTO / -EPERM / -errno. */
int krex_slot_fd_check(int fd);

#endif /* KREX_GATE_INTERNAL_H */
