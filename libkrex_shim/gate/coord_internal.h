/*
 * coord_internal.h — the state krexd's half of the gate keeps (coord.c,
 * coord_protocol.c); private to libkrex_gate.so, not part of the gate's API.
 *
 * Every size and count looped over here is a constant of krex_gate.h or a
 * field of struct krex_coord, never a value read from shared memory.
 */
#ifndef KREX_COORD_INTERNAL_H
#define KREX_COORD_INTERNAL_H

#include "gate_internal.h"

#include <pthread.h>

struct attached {
    uint32_t tenant;                  /* 0: row unused */
    int fd;
    struct krex_tenant_mem *m;        /* read-only mapping */
    uint32_t last_mem_seq;
    _Atomic uint64_t ignored[KREX_TENANT_SLOTS]; /* owner words judged gone */
};

struct krex_coord {
    struct krex_gate *g;              /* read-write mapping */
    int fd;
    uint32_t gpu;
    _Atomic uint32_t last_epoch;      /* last epoch requested (close) */
    _Atomic uint64_t drain_scans;     /* statistics: scans of krex_coord_wait_change */
    _Atomic uint64_t poll_word;       /* the drain (gate word) the back-off below is of */
    _Atomic int64_t poll_ns;          /* its poll interval now (coord_protocol.c) */
    _Atomic uint32_t poll_last_n;     /* its pending count at the last scan */
    /* The tenant table.  krexd drains from a worker thread while its event
     * loop attaches and detaches slot memory and runs audits: a drain holds
     * it (read) only while it scans, never while it sleeps on a futex.  A
     * futex wait on a slot memory detached meanwhile fails with EFAULT or,
     * if the address was reused, waits at most one slice on the wrong word:
     * the next scan corrects it. */
    pthread_rwlock_t mu;              /* the tenant table */
    struct attached t[KREX_GATE_MAX_TENANTS];
};

/* Is slot `i` of `a`, owned by `o`, judged gone (krex_coord_ignore)? */
static inline int ignored(struct attached *a, uint32_t i, uint64_t o)
{
    return atomic_load_explicit(&a->ignored[i], memory_order_relaxed) == o;
}

#endif /* KREX_COORD_INTERNAL_H */
