/*
 * coord_protocol.c — krexd's steps of the region protocol on the gate
 * (paper §4.2 steps 2, 3 and 8): close the gate for (holder, epoch), wait
 * while the siblings' registrations drain (krex_coord_wait_change, called
 * from a worker thread of krexd), reopen bound to (holder, epoch).  The
 * gate file and the slot memories these read are coord.c's; the tenant's
 * side of each step is gate.c and drain.c.
 *
 * Memory orders: the gate word and the slots' owner and acknowledgement
 * words are read and written seq_cst (the Dekker pairings with the
 * registrants and submitters, docs/design/shim.md "The per-call protocol
 * and its memory orders"); each
 * relaxed access says why it may be.
 */
#define _GNU_SOURCE
#include "coord_internal.h"

/* The longest the coordinator parks on the pending slots' ack_epoch
 * words before scanning again (ns), and how often it polls a slot that
 * acknowledged but shows a transient in-flight call (a retracting
 * submitter, which cannot wake it): first after 50 µs, then twice as
 * late each time the scan finds only such slots again, up to 4 ms.  An
 * honest retraction takes microseconds and is seen at the first poll; a
 * slot that shows `ack == epoch` with a call in flight for longer (a
 * thread frozen mid-retraction, or a tenant writing its own slot) costs
 * about 60 scans over a 200 ms timeout instead of 4,000. */
#define COORD_SLICE_NS 5000000LL
#define COORD_POLL_NS 50000LL
#define COORD_POLL_MAX_NS 4000000LL

KREX_GATE_API uint64_t krex_coord_word(const struct krex_coord *c)
{
    return c ? krex_gate_load_word(c->g) : 0;
}

/* Relaxed (both): a number krexd's own threads compare acknowledgements
 * with (audit); nothing is published with it. */
KREX_GATE_API uint32_t krex_coord_epoch(const struct krex_coord *c)
{
    return c ? atomic_load_explicit(&((struct krex_coord *)c)->last_epoch, memory_order_relaxed)
             : 0;
}

/* Relaxed: a statistic, read by tests and status; nothing is published
 * with it. */
KREX_GATE_API uint64_t krex_coord_drain_scans(const struct krex_coord *c)
{
    return c ? atomic_load_explicit(&((struct krex_coord *)c)->drain_scans, memory_order_relaxed)
             : 0;
}

KREX_GATE_API void krex_coord_set_epoch(struct krex_coord *c, uint32_t epoch)
{
    if (c)
        atomic_store_explicit(&c->last_epoch, epoch, memory_order_relaxed);
}

KREX_GATE_API int krex_coord_close(struct krex_coord *c, uint32_t holder, uint32_t epoch)
{
    if (!c || holder == 0 || epoch == 0)
        return -EINVAL;
    uint64_t expected = 0;
    /* Relaxed: audits compare acknowledgements with it; it is stored
     * before the close, so no honest acknowledgement is ever ahead of it. */
    atomic_store_explicit(&c->last_epoch, epoch, memory_order_relaxed);
    /* Relaxed: read only by a later krexd opening this file (krex_coord_open),
     * after this one has stopped; the kernel's page cache orders that. */
    atomic_store_explicit(&c->g->last_epoch, epoch, memory_order_relaxed);
    /* seq_cst CAS: the "close" half of the Dekker pairing; every later
     * read of owner/ack/inflight by this thread follows it in S. */
    if (!atomic_compare_exchange_strong_explicit(&c->g->word, &expected,
                                                 krex_gate_word(holder, epoch),
                                                 memory_order_seq_cst, memory_order_seq_cst))
        return -EBUSY;
    /* seq_cst RMW after the CAS: a drainer that reads the new seq reads
     * the closed word (it reads seq before the word; see drain.c). */
    atomic_fetch_add_explicit(&c->g->seq, 1, memory_order_seq_cst);
    krex_futex_wake_all(&c->g->seq);
    return 0;
}

/* What a scan tells the wait: where to park (the ack_epoch word of each
 * pending slot that waits for its acknowledgement, with the value read:
 * the first KREX_FUTEX_WAITV_MAX of them), whether to poll instead (some
 * pending slot acknowledged, or is EXITING, but shows a call in flight:
 * nothing wakes us when its count drops), and a fingerprint of the set of
 * tenants with pending slots. */
struct park {
    struct krex_futex_waitv w[KREX_FUTEX_WAITV_MAX];
    uint32_t n;
    int poll;
    uint64_t print;
};

/* The fingerprint of a tenant (splitmix64 over its id); a set's is the
 * sum, so the order of the scan does not matter. */
static uint64_t tenant_print(uint32_t tenant)
{
    uint64_t x = tenant * 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int skipped(uint32_t tenant, const uint32_t *skip, uint32_t nskip)
{
    for (uint32_t k = 0; k < nskip; k++)
        if (skip[k] == tenant)
            return 1;
    return 0;
}

/* Slots still to drain for (holder, epoch), under the read lock; the
 * tenants in skip[0..nskip) are not looked at. */
static uint32_t scan_pending(struct krex_coord *c, uint32_t holder, uint32_t epoch,
                             const uint32_t *skip, uint32_t nskip, struct krex_pending *out,
                             uint32_t max, struct park *park)
{
    uint32_t n = 0;
    park->n = 0;
    park->poll = 0;
    park->print = 0;
    for (uint32_t t = 0; t < KREX_GATE_MAX_TENANTS; t++) {
        struct attached *a = &c->t[t];
        if (a->tenant == 0 || a->tenant == holder)
            continue; /* the holder's own processes are not drained */
        if (skipped(a->tenant, skip, nskip))
            continue; /* drained before, and frozen since (krex_coord_wait_change) */
        uint32_t before = n;
        for (uint32_t i = 0; i < KREX_TENANT_SLOTS; i++) {
            struct krex_slot *s = &a->m->slots[i];
            /* seq_cst: read after our close in S (Dekker with the
             * registrant's ACTIVE CAS then word read).  A CLAIMING slot has
             * not yet published ACTIVE, so its registrant will read the
             * word after our close and block: it needs no drain. */
            uint64_t o = krex_owner_load(s);
            uint32_t st = krex_owner_state(o);
            if (!krex_owner_registered(st) || ignored(a, i, o))
                continue;
            /* An EXITING slot needs no acknowledgement, only nothing in
             * flight: its owner synchronized before it made the slot
             * EXITING (our seq_cst owner load read that CAS), and each of
             * its calls since synchronizes before its decrement.  The
             * count is read after the close: a call it misses sees the
             * gate closed.  Such a slot is polled (nothing wakes us when
             * its count drops). */
            int exiting = st == KREX_SLOT_EXITING;
            uint32_t ack = atomic_load_explicit(&s->ack_epoch, memory_order_seq_cst);
            uint32_t inflight = atomic_load_explicit(&s->inflight, memory_order_seq_cst);
            if ((exiting || ack == epoch) && (inflight & KREX_INFLIGHT_COUNT) == 0)
                continue;
            if (exiting || ack == epoch)
                park->poll = 1;
            else if (park->n < KREX_FUTEX_WAITV_MAX)
                park->w[park->n++] = (struct krex_futex_waitv){
                    .val = ack, .uaddr = (uint64_t)(uintptr_t)&s->ack_epoch,
                    .flags = KREX_FUTEX2_SIZE_U32};
            if (out && n < max)
                out[n] = (struct krex_pending){.tenant = a->tenant, .index = i, .owner = o};
            n++;
        }
        if (n != before)
            park->print += tenant_print(a->tenant);
    }
    park->print |= 1; /* never 0, the "nothing known yet" of krex_coord_wait_change */
    return n;
}

/* Set once futex_waitv is found missing (a kernel before 5.16); relaxed:
 * a drain that misses it tries the call once more. */
static _Atomic int no_waitv;

/* Sleep until an acknowledgement the scan waits for may have come, or
 * `until` (CLOCK_MONOTONIC ns, absolute).  The ack stores ack_epoch before
 * it wakes that word: a wait on the values the scan read cannot miss it.
 * Slots beyond the first KREX_FUTEX_WAITV_MAX are seen at `until`. */
static void park_until(const struct park *p, int64_t now, int64_t until)
{
    if (p->n && !atomic_load_explicit(&no_waitv, memory_order_relaxed)) {
        int r = krex_futex_waitv(p->w, p->n, until);
        if (r == 0 || r == -EAGAIN || r == -ETIMEDOUT || r == -EINTR)
            return;
        /* Refused without waiting: never use it again when the kernel lacks
         * it (before 5.16) or a seccomp profile denies it; any other error
         * (a slot memory detached under the wait: EFAULT) only this time.
         * Either way this slice waits below rather than spin. */
        if (r == -ENOSYS || r == -EPERM)
            atomic_store_explicit(&no_waitv, 1, memory_order_relaxed);
    }
    if (p->n) {
        /* Without futex_waitv: the first pending slot only (the others are
         * seen when it acknowledges, or at `until`). */
        krex_futex_wait((const _Atomic uint32_t *)(uintptr_t)p->w[0].uaddr,
                        (uint32_t)p->w[0].val, until - now);
    } else {
        int64_t left = until - now;
        struct timespec ts = {(time_t)(left / 1000000000LL), (long)(left % 1000000000LL)};
        nanosleep(&ts, NULL);
    }
}

/* Step 3 (krex_gate.h): scan, and park until an acknowledgement may have
 * come; return when drained, when the set of pending tenants changed, or
 * at the timeout.  No spin first: krexd calls it again after each change,
 * and a spin each time would take a core from the drainers it waits for. */
KREX_GATE_API int krex_coord_wait_change(struct krex_coord *c, uint32_t holder, uint32_t epoch,
                                         const uint32_t *skip, uint32_t nskip, int64_t timeout_ns,
                                         uint64_t *seen, struct krex_pending *pending,
                                         uint32_t max, uint32_t *npending)
{
    if (!c || holder == 0 || epoch == 0 || (nskip && !skip) || !seen)
        return -EINVAL;
    int saved = errno;
    const uint64_t w = krex_gate_word(holder, epoch);
    const int64_t start = krex_gate_now_ns();
    const int64_t deadline =
        timeout_ns < 0 || timeout_ns > INT64_MAX - start ? INT64_MAX : start + timeout_ns;
    int rc = 0;
    /* The poll's back-off and the pending count of the scan before carry
     * over from the previous call for the same (holder, epoch): krexd calls
     * again every few ms to judge the pending owners.  Relaxed: only the
     * drains of this gate, one at a time (the region lock), use them. */
    int same = atomic_load_explicit(&c->poll_word, memory_order_relaxed) == w;
    int64_t poll_ns =
        same ? atomic_load_explicit(&c->poll_ns, memory_order_relaxed) : COORD_POLL_NS;
    uint32_t last_n =
        same ? atomic_load_explicit(&c->poll_last_n, memory_order_relaxed) : UINT32_MAX;
    if (npending)
        *npending = 0;
    for (;;) {
        if (krex_gate_load_word(c->g) != w) {
            rc = -ESTALE;
            break;
        }
        struct park park;
        int64_t t = krex_gate_now_ns();
        int last = t >= deadline;
        pthread_rwlock_rdlock(&c->mu);
        uint32_t n = scan_pending(c, holder, epoch, skip, nskip, pending, max, &park);
        pthread_rwlock_unlock(&c->mu);
        /* Relaxed: a statistic (krex_coord_drain_scans); drains of one
         * gate run one at a time, but the add is atomic anyway. */
        atomic_fetch_add_explicit(&c->drain_scans, 1, memory_order_relaxed);
        if (n == 0)
            break;
        if (last || park.print != *seen) {
            if (npending)
                *npending = n < max ? n : max;
            *seen = park.print;
            rc = last ? -ETIMEDOUT : 1;
            break;
        }
        /* A slot waiting for its acknowledgement wakes us (futex); slots
         * that acknowledged with a call in flight are polled, from 50 µs,
         * backing off while a scan finds no fewer pending slots than the
         * one before (see COORD_POLL_NS). */
        if (!park.poll || n < last_n)
            poll_ns = COORD_POLL_NS;
        else if (last_n != UINT32_MAX)
            poll_ns = poll_ns * 2 > COORD_POLL_MAX_NS ? COORD_POLL_MAX_NS : poll_ns * 2;
        last_n = n;
        int64_t until = t + (park.poll ? poll_ns : COORD_SLICE_NS);
        park_until(&park, t, until < deadline ? until : deadline);
    }
    atomic_store_explicit(&c->poll_word, w, memory_order_relaxed);
    atomic_store_explicit(&c->poll_ns, poll_ns, memory_order_relaxed);
    atomic_store_explicit(&c->poll_last_n, last_n, memory_order_relaxed);
    errno = saved;
    return rc;
}

KREX_GATE_API int krex_coord_reopen(struct krex_coord *c, uint32_t holder, uint32_t epoch)
{
    if (!c || holder == 0 || epoch == 0)
        return -EINVAL;
    uint64_t expected = krex_gate_word(holder, epoch);
    /* seq_cst CAS bound to (holder, epoch): a late recovery fails here. */
    if (!atomic_compare_exchange_strong_explicit(&c->g->word, &expected, 0,
                                                 memory_order_seq_cst, memory_order_seq_cst))
        return -ESTALE;
    /* seq_cst RMW after the CAS: a parked submitter read seq before it
     * re-read the word, so either it saw the open word or its futex wait
     * fails on the new seq (or is woken below). */
    atomic_fetch_add_explicit(&c->g->seq, 1, memory_order_seq_cst);
    krex_futex_wake_all(&c->g->seq);
    return 0;
}
