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

/* ---- observations for the region record (classes.toml, hip_classes.toml) ---
 * One set of counters for both runtimes: CUDA's events and streams and
 * HIP's (hipEvent_t, hipStream_t: pointers too) are told apart only by the
 * runtime a timed stream belongs to, which the exit synchronizes it with. */

/* The runtime of the timed stream (region.c). */
enum krex_region_rt { KREX_REGION_RT_CUDA = 1, KREX_REGION_RT_HIP = 2 };

extern _Atomic int krex_region_open;
extern _Atomic uint64_t krex_events_recorded_outside;
void krex_note_event_record_in_region(const void *ev, const void *stream, int rt);
/* An event recorded on `stream` (ok: the call succeeded), by runtime `rt`. */
static KREX_ALWAYS_INLINE void krex_note_record(int ok, const void *ev, const void *stream,
                                                int rt)
{
    if (!ok)
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
    krex_note_event_record_in_region(ev, stream, rt);
}
/* [observe.post] of cuEventRecord*. */
static KREX_ALWAYS_INLINE void krex_note_event_record(CUresult r, CUevent ev, CUstream stream)
{
    krex_note_record(r == CUDA_SUCCESS, ev, stream, KREX_REGION_RT_CUDA);
}
/* [observe.post] of hipEventRecord (r: the hipError_t, hipSuccess is 0). */
static KREX_ALWAYS_INLINE void krex_hip_note_event_record(uint32_t r, void *ev, void *stream)
{
    krex_note_record(r == 0, ev, stream, KREX_REGION_RT_HIP);
}
/* [observe.post] of the HIP launches that record a start and a stop event
 * around their kernel (hipExtModuleLaunchKernel, hipHccModuleLaunchKernel,
 * hipExtLaunchKernel): each given one counts as recorded on the stream. */
static KREX_ALWAYS_INLINE void krex_hip_note_launch_events(uint32_t r, void *start, void *stop,
                                                           void *stream)
{
    if (start)
        krex_note_record(r == 0, start, stream, KREX_REGION_RT_HIP);
    if (stop)
        krex_note_record(r == 0, stop, stream, KREX_REGION_RT_HIP);
}
/* [observe.post] of cuEventElapsedTime* and hipEventElapsedTime. */
void krex_note_event_elapsed(CUresult r, CUevent start, CUevent end);
void krex_hip_note_event_elapsed(uint32_t r, void *start, void *stop);
/* [observe.pre] of cuStreamDestroy* and hipStreamDestroy: the exit never
 * synchronizes a freed stream. */
void krex_region_stream_destroying(const void *stream);
/* [observe.post] of hipDeviceReset and hipDevicePrimaryCtxReset: the
 * device's streams are gone, a timed HIP stream perhaps with them. */
void krex_region_hip_reset(uint32_t r);

/* Fork (shim.c's handlers): the L2 buffers' lock (l2flush.c); the child
 * forgets the region and the buffers. */
void krex_region_atfork_prepare(void);
void krex_region_atfork_parent(void);
void krex_region_atfork_child(void);

#endif /* KREX_REGION_H */
