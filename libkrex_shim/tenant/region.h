/*
 * region.h — the holder's side of a critical region and the region record
 * (region.c; paper §4.2 steps 5 and 7).  Internal, hidden; the exported
 * krex_shim_region_* entries are region.c's, the three that initialise the
 * shim first are shim.c's (they call krex_region_begin/_end/_warm).
 */
#ifndef KREX_REGION_H
#define KREX_REGION_H

#include "l2flush.h" /* the reset observations the hooks call */
#include "state.h"

/* krex_shim_region_begin/_end/_warm, after the shim is initialised. */
int krex_region_begin(uint32_t epoch, int l2_flush);
int krex_region_end(uint64_t *sync_ns, uint64_t *launches);
int krex_region_warm(uint32_t budget_us);

/* A context is gone (krex_track_on_ctx_gone): its L2 flush buffer with it. */
void krex_region_forget_ctx(CUcontext ctx);

/* ---- observations for the region record (classes.toml) -------------------- */

extern _Atomic int krex_region_open;
extern _Atomic uint64_t krex_events_recorded_outside;
void krex_note_event_record_in_region(CUevent ev, CUstream stream);
static KREX_ALWAYS_INLINE void krex_note_event_record(CUresult r, CUevent ev, CUstream stream)
{
    if (r != CUDA_SUCCESS)
        return;
    /* Counts and the ring index: relaxed loads and stores, not locked
     * read-modify-writes, on this per-call path (a locked add cost about
     * 8 ns of every cuEventRecord; an out-of-line call a few more).
     * Threads recording at the same instant may lose a count or share a
     * ring entry: the warnings they feed need "some", not "how many". */
    if (KREX_LIKELY(!atomic_load_explicit(&krex_region_open, memory_order_relaxed))) {
        atomic_store_explicit(
            &krex_events_recorded_outside,
            atomic_load_explicit(&krex_events_recorded_outside, memory_order_relaxed) + 1,
            memory_order_relaxed);
        return;
    }
    krex_note_event_record_in_region(ev, stream);
}
void krex_note_event_elapsed(CUresult r, CUevent start, CUevent end);
void krex_region_stream_destroying(CUstream stream);

/* Fork (shim.c's handlers): the L2 buffers' lock (l2flush.c); the child
 * forgets the region and the buffers. */
void krex_region_atfork_prepare(void);
void krex_region_atfork_parent(void);
void krex_region_atfork_child(void);

#endif /* KREX_REGION_H */
