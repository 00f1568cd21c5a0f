/*
 * region.c — the holder's side of a critical region (paper §4.2 steps 5
 * and 7: docs/design/architecture.md "The region protocol, step by step";
 * docs/design/shim.md "Holder side (region.c)"), called by krex_client
 * through ctypes after krexd granted the region and before it reports the
 * exit.  Each krex_shim_region_* entry says what it does below (their
 * prototypes: docs/design/interfaces.md "Shim symbols the Python client
 * calls"); begin, end and warm are exported by shim.c, which initialises
 * the shim first and calls krex_region_*.  The driver calls go to the real
 * functions; the region record (docs/design/region-log.md) reports what
 * the entries say.
 */
#include "region.h"
#include "l2flush.h"
#include "drain.h"
#include "gate_internal.h"
#include "hipinterpose.h"
#include "interpose.h"
#include "track.h"

#include <errno.h>
#include <limits.h>

static _Atomic uint32_t region_epoch;
static _Atomic int l2_flushed;

/* Events and streams, for the region record: CUDA's and HIP's alike (both
 * are pointers; an event or stream is kept as its address).  All relaxed:
 * statistics, written by the hooks of any thread and read by the client's
 * thread after krex_shim_region_end(); a record racing with begin or end
 * may land on either side, as it would without the shim. */
#define RECENT_EVENTS 64
_Atomic int krex_region_open;        /* 1 from region_begin to region_end (region.h) */
_Atomic uint64_t krex_events_recorded_outside; /* region.h, krex_note_record */
static _Atomic uint64_t events_timed_outside;
static _Atomic uintptr_t timed_stream; /* stream of the last event recorded in the region */
/* 0: no timed stream; else the runtime it belongs to (enum krex_region_rt). */
static _Atomic int timed_stream_known;
static _Atomic uintptr_t recent_events[RECENT_EVENTS]; /* recorded in regions */
static _Atomic uint32_t recent_next;
static _Atomic uint64_t other_streams_ns = UINT64_MAX;

/* [observe.post] of cuEventRecord* and hipEventRecord (region.h): in a
 * region, remember the stream (the timed one, of runtime `rt`) and the
 * event; outside, one relaxed increment. */
void krex_note_event_record_in_region(const void *ev, const void *stream, int rt)
{
    /* The ring index: relaxed loads and stores (see krex_note_record in
     * region.h).  The stream before its runtime, both relaxed: a racing
     * reader may pair one event's stream with another's runtime only when
     * two runtimes record at the same instant, which the exit then
     * synchronizes whole anyway (exit_sync's second part). */
    atomic_store_explicit(&timed_stream, (uintptr_t)stream, memory_order_relaxed);
    atomic_store_explicit(&timed_stream_known, rt, memory_order_relaxed);
    uint32_t i = atomic_load_explicit(&recent_next, memory_order_relaxed);
    atomic_store_explicit(&recent_next, i + 1, memory_order_relaxed);
    atomic_store_explicit(&recent_events[i % RECENT_EVENTS], (uintptr_t)ev, memory_order_relaxed);
}

static int recorded_in_region(uintptr_t ev)
{
    for (int i = 0; i < RECENT_EVENTS; i++)
        if (atomic_load_explicit(&recent_events[i], memory_order_relaxed) == ev)
            return 1;
    return 0;
}

/* Timing outside a region, unless both events were recorded in a region
 * (read after it ended). */
static void note_elapsed(int ok, uintptr_t start, uintptr_t end)
{
    if (!ok || atomic_load_explicit(&krex_region_open, memory_order_relaxed))
        return;
    if (recorded_in_region(start) && recorded_in_region(end))
        return;
    atomic_fetch_add_explicit(&events_timed_outside, 1, memory_order_relaxed);
}

/* [observe.post] of cuEventElapsedTime*. */
void krex_note_event_elapsed(CUresult r, CUevent start, CUevent end)
{
    note_elapsed(r == CUDA_SUCCESS, (uintptr_t)start, (uintptr_t)end);
}

/* [observe.post] of hipEventElapsedTime. */
void krex_hip_note_event_elapsed(uint32_t r, void *start, void *stop)
{
    note_elapsed(r == KREX_HIP_SUCCESS, (uintptr_t)start, (uintptr_t)stop);
}

/* [observe.pre] of cuStreamDestroy* and hipStreamDestroy: the exit never
 * synchronizes a freed stream. */
void krex_region_stream_destroying(const void *stream)
{
    if (atomic_load_explicit(&timed_stream_known, memory_order_relaxed) &&
        atomic_load_explicit(&timed_stream, memory_order_relaxed) == (uintptr_t)stream)
        atomic_store_explicit(&timed_stream_known, 0, memory_order_relaxed);
}

/* [observe.post] of hipDeviceReset and hipDevicePrimaryCtxReset: a timed
 * HIP stream may have been one of the device's (relaxed, as above). */
void krex_region_hip_reset(uint32_t r)
{
    if (r != KREX_HIP_SUCCESS)
        return;
    int rt = KREX_REGION_RT_HIP;
    atomic_compare_exchange_strong_explicit(&timed_stream_known, &rt, 0, memory_order_relaxed,
                                            memory_order_relaxed);
}

void krex_region_forget_ctx(CUcontext ctx)
{
    /* A timed CUDA stream may be one of the context's: forget it (relaxed,
     * as above). */
    int rt = KREX_REGION_RT_CUDA;
    atomic_compare_exchange_strong_explicit(&timed_stream_known, &rt, 0, memory_order_relaxed,
                                            memory_order_relaxed);
    krex_l2_forget_ctx(ctx);
}

void krex_region_atfork_prepare(void) { krex_l2_atfork_prepare(); }

void krex_region_atfork_parent(void) { krex_l2_atfork_parent(); }

void krex_region_atfork_child(void)
{
    atomic_store_explicit(&region_epoch, 0, memory_order_relaxed);
    atomic_store_explicit(&l2_flushed, 0, memory_order_relaxed);
    atomic_store_explicit(&krex_region_open, 0, memory_order_relaxed);
    atomic_store_explicit(&timed_stream_known, 0, memory_order_relaxed);
    krex_l2_atfork_child();
}

/* Does this process hold region `epoch` of the gate?  Under krex only the
 * holder may begin it (the L2 flush is device work beside the frozen
 * siblings); without a gate (pass-through) the region is advisory.  Epoch 0
 * is a region krexd records without enforcing ([region] enforce = false, an
 * --exclusive tenant): it may begin only while the gate is open, so that no
 * sibling's flush lands inside another tenant's region. */
static int holds_region(uint32_t epoch)
{
    /* Acquire: krex_gate_p and krex_tenant are published with krex_mode. */
    int mode = atomic_load_explicit(&krex_mode, memory_order_acquire);
    if (mode == KREX_MODE_PASS)
        return 1;
    if (mode != KREX_MODE_GATING)
        return 0;
    uint64_t word = krex_gate_load_word(krex_gate_p);
    if (epoch == 0)
        return word == 0;
    return word == krex_gate_word(krex_tenant, epoch);
}

/* krex_shim_region_begin(epoch, l2_flush): under krex only in the gate's
 * holder of `epoch` (else CUDA_ERROR_NOT_PERMITTED, nothing done); resets
 * the launch counter and flushes L2: a memset over a buffer of
 * CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE bytes, allocated once per context in
 * the calling thread's current context, then synchronized.  The buffer
 * lives as long as its context (forgotten when the context is destroyed or
 * its primary reset: the memory goes with it).  A HIP process (the runtime
 * loaded, libcuda not) gets the same through HIP: hipDeviceAttributeL2CacheSize
 * bytes, one buffer per device, on the calling thread's current device,
 * hipMemset then hipDeviceSynchronize; forgotten when the device is reset.
 * Returns 0 or a CUresult (a hipError_t when the HIP flush failed). */
int krex_region_begin(uint32_t epoch, int l2_flush)
{
    int saved = errno;
    int r = L2_OK;
    if (!holds_region(epoch)) {
        /* A sibling (or a stale epoch): no state changes, no device work. */
        atomic_store_explicit(&l2_flushed, 0, memory_order_relaxed);
        krex_log(KREX_LOG_WARN, "region %u: this process does not hold it: refused", epoch);
        errno = saved;
        return (int)CUDA_ERROR_NOT_PERMITTED;
    }
    atomic_store_explicit(&region_epoch, epoch, memory_order_relaxed);
    atomic_store_explicit(&krex_launches, 0, memory_order_relaxed);
    /* Relaxed: read back by the same thread (the client) after the call. */
    atomic_store_explicit(&l2_flushed, 0, memory_order_relaxed);
    atomic_store_explicit(&timed_stream_known, 0, memory_order_relaxed);
    atomic_store_explicit(&other_streams_ns, UINT64_MAX, memory_order_relaxed);
    atomic_store_explicit(&krex_region_open, 1, memory_order_relaxed);
    const struct l2_runtime *rt = l2_flush ? krex_l2_runtime() : NULL;
    if (!rt)
        goto out; /* no runtime loaded: no context, nothing to flush */
    if (krex_captures() != 0) {
        /* Legacy-stream work and a context synchronization would
         * invalidate the open capture (docs/design/shim.md "Capture"). */
        krex_log(KREX_LOG_WARN, "region %u: a stream capture is open: no L2 flush", epoch);
        goto out;
    }
    uintptr_t key;
    if (!rt->owner(&key)) {
        krex_log(KREX_LOG_DEBUG, "no current context: no L2 flush");
        goto out;
    }
    uint64_t p = 0;
    size_t size = 0;
    if ((r = krex_l2_buffer(rt, key, &p, &size)) == L2_OUT_OF_MEMORY) {
        /* The GPU is full (frozen siblings keep their memory): waiting for
         * room would deadlock the region, failing it would lose the
         * command.  Run it unflushed and say so. */
        krex_log(KREX_LOG_WARN, "region %u: no memory for the L2 flush buffer: no L2 flush", epoch);
        r = L2_OK;
        goto out;
    }
    if (r != L2_OK || size == 0)
        goto out;
    if ((r = rt->memset(p, (unsigned char)(epoch & 0xff), size)) == L2_OK &&
        (r = rt->sync()) == L2_OK)
        atomic_store_explicit(&l2_flushed, 1, memory_order_relaxed);
out:
    if (r != L2_OK)
        krex_log(KREX_LOG_WARN, "region %u: L2 flush failed: %d", epoch, r);
    errno = saved;
    return r;
}

/* The launches made since the last krex_shim_region_begin() so far (the
 * client subtracts its clock warm-up's from the region's). */
KREX_EXPORT uint64_t krex_shim_region_launches(void)
{
    /* Relaxed: a statistic, read by the client's thread between its
     * region_begin and region_end; it orders nothing else. */
    return atomic_load_explicit(&krex_launches, memory_order_relaxed);
}

/* 1 when the last krex_shim_region_begin() did flush L2, else 0 (no
 * context, an open capture, no memory for the buffer, an error), so the
 * region's record says what happened, not what was asked. */
KREX_EXPORT int krex_shim_region_l2_flushed(void)
{
    return atomic_load_explicit(&l2_flushed, memory_order_relaxed);
}

/* Synchronize the timed stream `stream` of runtime `rt` through the real
 * function (only of a runtime this process loaded: nothing is loaded
 * here).  Its result (a CUresult, or a hipError_t), or -1 when it could not
 * be asked. */
static int sync_timed(int rt, uintptr_t stream)
{
    if (rt == KREX_REGION_RT_CUDA && krex_libcuda_if_loaded()) {
        __typeof__(&cuStreamSynchronize) ssync = KREX_REAL(cuStreamSynchronize);
        return ssync ? (int)ssync((CUstream)stream) : -1;
    }
    if (rt == KREX_REGION_RT_HIP && krex_hip_loaded()) {
        krex_hip_abi_hipStreamSynchronize *ssync = KREX_HIP_REAL(hipStreamSynchronize);
        return ssync ? (int)ssync((void *)stream) : -1;
    }
    return -1;
}

/* The exit synchronization: the timed stream first (when known), then
 * every context (HIP: every device); the second part's duration goes to
 * other_streams_ns. */
static CUresult exit_sync(void)
{
    int rt = atomic_exchange_explicit(&timed_stream_known, 0, memory_order_relaxed);
    /* A capture: per-stream rules apply (drain.c, hipdrain.c). */
    int r = rt && krex_captures() == 0
                ? sync_timed(rt, atomic_load_explicit(&timed_stream, memory_order_relaxed))
                : -1;
    if (r < 0)
        return krex_sync_all(1);
    uint64_t t1 = krex_now_ns();
    CUresult r2 = krex_sync_all(1);
    if (r == 0)
        atomic_store_explicit(&other_streams_ns, krex_now_ns() - t1, memory_order_relaxed);
    return r != 0 ? (CUresult)r : r2;
}

/* krex_shim_region_end(&sync_ns, &launches): synchronizes every context of
 * this process (work left on a private side stream must not run alongside
 * the siblings once they thaw; HIP: every device it used, as a drain
 * does), the timed stream first when an event was recorded in the region
 * (exit_sync: CUDA's or HIP's, by the runtime that recorded it), and
 * returns how long that took and the launches made in the region. */
int krex_region_end(uint64_t *sync_ns, uint64_t *launches)
{
    int saved = errno;
    uint64_t t0 = krex_now_ns();
    /* Neither runtime loaded: no work of this process can be running. */
    CUresult r = krex_libcuda_if_loaded() || krex_hip_loaded() ? exit_sync() : CUDA_SUCCESS;
    uint64_t dt = krex_now_ns() - t0;
    atomic_store_explicit(&krex_region_open, 0, memory_order_relaxed);
    if (sync_ns)
        *sync_ns = dt;
    if (launches)
        *launches = atomic_load_explicit(&krex_launches, memory_order_relaxed);
    uint32_t epoch = atomic_exchange_explicit(&region_epoch, 0, memory_order_relaxed);
    if (epoch && atomic_load_explicit(&krex_mode, memory_order_acquire) == KREX_MODE_GATING &&
        krex_gate_load_word(krex_gate_p) != krex_gate_word(krex_tenant, epoch))
        krex_log(KREX_LOG_WARN, "region %u: the gate no longer holds it (ended by recovery?)",
                 epoch);
    if (r != CUDA_SUCCESS)
        krex_log(KREX_LOG_WARN, "region %u: exit synchronization returned %d", epoch, (int)r);
    errno = saved;
    return (int)r;
}

/* How long exit_sync's second part took: device time of work left on
 * streams other than the timed one when the region ended (UINT64_MAX when
 * no event was recorded in the region, or a capture was open). */
KREX_EXPORT uint64_t krex_shim_region_other_streams_ns(void)
{
    return atomic_load_explicit(&other_streams_ns, memory_order_relaxed);
}

/* Events this process recorded (cuEventRecord*, hipEventRecord, the
 * events of HIP's launches that take them) and timed (cuEventElapsedTime*,
 * hipEventElapsedTime) outside any region so far: timing done outside a
 * region.  Timing events recorded in one of the last RECENT_EVENTS regions
 * after the region ended is not counted. */
KREX_EXPORT int krex_shim_region_events_outside(uint64_t *recorded, uint64_t *timed)
{
    if (recorded)
        *recorded = atomic_load_explicit(&krex_events_recorded_outside, memory_order_relaxed);
    if (timed)
        *timed = atomic_load_explicit(&events_timed_outside, memory_order_relaxed);
    return 0;
}

/* The clock warm-up (krex_l2_warm says how): busy work in the holder's
 * region so that the GPU's SM clock ramps up before the timed code runs. */

/* Whether this process holds the region it began: 0 outside a region, or
 * when the gate no longer holds its epoch (ended by recovery). */
static int warm_allowed(void)
{
    if (!atomic_load_explicit(&krex_region_open, memory_order_relaxed))
        return 0;
    uint32_t epoch = atomic_load_explicit(&region_epoch, memory_order_relaxed);
    /* Acquire: krex_gate_p and krex_tenant are published with krex_mode. */
    if (atomic_load_explicit(&krex_mode, memory_order_acquire) != KREX_MODE_GATING)
        return 1; /* pass-through: no gate to ask, the region is advisory */
    return epoch && krex_gate_load_word(krex_gate_p) == krex_gate_word(krex_tenant, epoch);
}

/* krex_shim_region_warm(budget_us): inside the holder's region only, keeps
 * the GPU busy for about budget_us microseconds (memsets of the L2 flush
 * buffer) so that its SM clock ramps up before the timed code runs;
 * returns the microseconds spent, or a negative CUresult (hipError_t in a
 * HIP process). */
int krex_region_warm(uint32_t budget_us)
{
    int saved = errno;
    int ret = 0;
    if (!warm_allowed()) {
        ret = -(int)CUDA_ERROR_NOT_PERMITTED;
        goto out;
    }
    /* No runtime, an open capture (null-stream work would invalidate it),
     * no context or no buffer: nothing to warm with, 0 spent. */
    const struct l2_runtime *rt = budget_us ? krex_l2_runtime() : NULL;
    if (!rt || krex_captures() != 0)
        goto out;
    uintptr_t key;
    if (!rt->owner(&key))
        goto out;
    uint64_t p = 0;
    size_t size = 0;
    int r = krex_l2_buffer(rt, key, &p, &size);
    if (r == L2_OUT_OF_MEMORY || (r == L2_OK && size == 0))
        goto out; /* as in region_begin: run the region unwarmed */
    uint64_t spent_ns = 0;
    if (r == L2_OK)
        r = krex_l2_warm(rt, p, size, (uint64_t)budget_us * 1000u, &spent_ns);
    if (r != L2_OK) {
        krex_log(KREX_LOG_WARN, "region clock warm-up failed: %d", r);
        ret = -r;
        goto out;
    }
    ret = spent_ns / 1000u > INT_MAX ? INT_MAX : (int)(spent_ns / 1000u);
out:
    errno = saved;
    return ret;
}
