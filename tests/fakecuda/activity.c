/*
 * activity.c — per-process GPU activity in the shared state file (share.h):
 * the model of NVML's per-process utilization that krexd reads
 * (krexd/memory/activity.py) to ask whether a process other than a region's holder
 * ran GPU work during a window.
 *
 * Each operation enqueued for execution (kernel, memset, copy, and a graph
 * launch as one interval; never work captured into a graph) is written to
 * the process's ring of the last FC_RING_OPS intervals, with its simulated
 * GPU, and raises the record's last_end, which the checkpoint lock waits
 * for (checkpoint.c).  Rings are written by their process only (by any copy
 * of the driver in it) and read by others.
 */
#include "share.h"

void fc_activity_note(int gpu, uint64_t start_ns, uint64_t end_ns)
{
    struct proc_slot *s = fc_share_self();
    if (s == NULL)
        return;
    /* Relaxed maximum: a locker reads last_end after the seq_cst decrement
     * of `inflight` at the end of this call, which orders it (checkpoint.c). */
    uint64_t cur = atomic_load_explicit(&s->last_end, memory_order_relaxed);
    while (end_ns > cur && !atomic_compare_exchange_weak_explicit(&s->last_end, &cur, end_ns,
                                                                  memory_order_relaxed,
                                                                  memory_order_relaxed)) {
    }
    /* Relaxed: reserves the entry (two copies of the driver may race). */
    uint64_t n = atomic_fetch_add_explicit(&s->ops, 1, memory_order_relaxed) + 1;
    struct ring_op *e = &fc_share_ring(s)[(n - 1) % FC_RING_OPS];
    /* Release fence: a reader that sees a field of this entry overwritten also
     * sees `ops` advanced past the entry's old sequence number, so it drops
     * the old entry (the reader's rule, docs/design/interfaces.md). */
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&e->start_ns, start_ns, memory_order_relaxed);
    atomic_store_explicit(&e->end_ns, end_ns, memory_order_relaxed);
    atomic_store_explicit(&e->gpu, (uint32_t)gpu, memory_order_relaxed);
    /* Release: the fields are written before the entry says it is operation n. */
    atomic_store_explicit(&e->seq, n, memory_order_release);
}
