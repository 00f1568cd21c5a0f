/*
 * gate_internal.h — helpers shared by gate.c (both sides, tenant half) and
 * coord.c (krexd's half); not installed, not part of the gate's API.
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

/* Fill `out` from slot `s` (relaxed reads except the owner: a status
 * snapshot, fields may be mutually stale; every word is one aligned load,
 * never torn).  Bounds are the caller's. */
void krex_slot_snapshot(const struct krex_slot *s, uint32_t tenant, uint32_t index,
                        struct krex_slot_info *out);

/* The checks both sides make on a slot memory fd before mapping it
 * (gate.c): 0 or -EPROTO / -EPERM / -errno. */
int krex_slot_fd_check(int fd);

#endif /* KREX_GATE_INTERNAL_H */
