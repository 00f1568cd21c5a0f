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
#include "drain.h"
#include "gate_internal.h"
#include "hipinterpose.h"
#include "interpose.h"
#include "track.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>

/* ---- the L2 flush buffers and the runtime that fills them ------------------ */

/* What the flush and the warm-up need of the process's runtime: the CUDA
 * driver where libcuda is loaded, else the HIP runtime where a HIP hook
 * loaded it (hipinterpose.c).  Each operation calls the runtime's real
 * functions, never its hooks (the shim's own work must not count as the
 * tenant's: launches, device memory, gated calls).  Results are the
 * runtime's codes, CUresult or hipError_t, which share the values tested
 * here: */
#define L2_OK 0
#define L2_OUT_OF_MEMORY 2
#define L2_NOT_FOUND 500 /* a real function missing */
_Static_assert(CUDA_SUCCESS == L2_OK && KREX_HIP_SUCCESS == L2_OK, "success");
_Static_assert(CUDA_ERROR_OUT_OF_MEMORY == L2_OUT_OF_MEMORY &&
                   KREX_HIP_ERROR_OUT_OF_MEMORY == L2_OUT_OF_MEMORY, "out of memory");
_Static_assert(CUDA_ERROR_NOT_FOUND == L2_NOT_FOUND && KREX_HIP_ERROR_NOT_FOUND == L2_NOT_FOUND,
               "not found");

struct l2buf;

struct l2_runtime {
    const char *name;
    /* The owner of the calling thread's flush buffer: its current context
     * (CUDA) or its current device (HIP).  0 when it has none. */
    int (*owner)(uintptr_t *key);
    /* The owner's device (current on this thread) and its L2 size in bytes. */
    int (*l2_size)(uintptr_t key, int *dev, int *bytes);
    int (*alloc)(uint64_t *ptr, size_t size);
    void (*release)(uint64_t ptr);
    /* 0 when the runtime says the buffer is no longer its owner's (NULL:
     * nothing to ask, the observations keep the list). */
    int (*valid)(const struct l2buf *b);
    /* The flush: a memset of `value` on the null (legacy) stream, then the
     * owner's work waited for (context or device). */
    int (*memset)(uint64_t ptr, unsigned char value, size_t size);
    int (*sync)(void);
    /* The warm-up: memsets queued on the null stream, then that stream
     * waited for. */
    int (*memset_async)(uint64_t ptr, size_t size);
    int (*stream_sync)(void);
};

struct l2buf {
    const struct l2_runtime *rt;
    uintptr_t key; /* rt->owner's */
    int dev;
    uint64_t ptr;
    size_t size;
};

/* -- CUDA: the current context's buffer, in that context --------------------- */

static int cuda_owner(uintptr_t *key)
{
    __typeof__(&cuCtxGetCurrent) get_cur = KREX_REAL(cuCtxGetCurrent);
    CUcontext ctx = NULL;
    if (!get_cur || get_cur(&ctx) != CUDA_SUCCESS || !ctx)
        return 0;
    *key = (uintptr_t)ctx;
    return 1;
}

static int cuda_l2_size(uintptr_t key, int *dev, int *bytes)
{
    (void)key; /* current on this thread */
    __typeof__(&cuCtxGetDevice) get_dev = KREX_REAL(cuCtxGetDevice);
    __typeof__(&cuDeviceGetAttribute) get_attr = KREX_REAL(cuDeviceGetAttribute);
    if (!get_dev || !get_attr)
        return L2_NOT_FOUND;
    CUdevice d;
    CUresult r;
    if ((r = get_dev(&d)) != CUDA_SUCCESS ||
        (r = get_attr(bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, d)) != CUDA_SUCCESS)
        return (int)r;
    *dev = (int)d;
    return L2_OK;
}

static int cuda_alloc(uint64_t *ptr, size_t size)
{
    __typeof__(&cuMemAlloc_v2) alloc = KREX_REAL(cuMemAlloc_v2);
    CUdeviceptr p;
    CUresult r = alloc ? alloc(&p, size) : CUDA_ERROR_NOT_FOUND;
    if (r == CUDA_SUCCESS)
        *ptr = (uint64_t)p;
    return (int)r;
}

static void cuda_release(uint64_t ptr)
{
    __typeof__(&cuMemFree_v2) mfree = KREX_REAL(cuMemFree_v2);
    if (mfree)
        mfree((CUdeviceptr)ptr);
}

/* A buffer of ours that the driver no longer knows (its context was torn
 * down and the handle reused) is found out before it is written. */
static int cuda_valid(const struct l2buf *b)
{
    __typeof__(&cuPointerGetAttribute) get = KREX_REAL(cuPointerGetAttribute);
    if (!get)
        return 1; /* cannot check; destroy and reset observations keep the list */
    CUcontext owner = NULL;
    return get(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, (CUdeviceptr)b->ptr) == CUDA_SUCCESS &&
           (uintptr_t)owner == b->key;
}

static int cuda_memset(uint64_t ptr, unsigned char value, size_t size)
{
    __typeof__(&cuMemsetD8_v2) memset8 = KREX_REAL(cuMemsetD8_v2);
    return memset8 ? (int)memset8((CUdeviceptr)ptr, value, size) : L2_NOT_FOUND;
}

static int cuda_sync(void)
{
    __typeof__(&cuCtxSynchronize) sync = KREX_REAL(cuCtxSynchronize);
    return sync ? (int)sync() : L2_NOT_FOUND;
}

static int cuda_memset_async(uint64_t ptr, size_t size)
{
    __typeof__(&cuMemsetD8Async) memset8 = KREX_REAL(cuMemsetD8Async);
    return memset8 ? (int)memset8((CUdeviceptr)ptr, 0, size, NULL) : L2_NOT_FOUND;
}

static int cuda_stream_sync(void)
{
    __typeof__(&cuStreamSynchronize) ssync = KREX_REAL(cuStreamSynchronize);
    return ssync ? (int)ssync(NULL) : L2_NOT_FOUND; /* NULL: the legacy stream */
}

static const struct l2_runtime cuda_l2 = {
    .name = "CUDA",
    .owner = cuda_owner,
    .l2_size = cuda_l2_size,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .valid = cuda_valid,
    .memset = cuda_memset,
    .sync = cuda_sync,
    .memset_async = cuda_memset_async,
    .stream_sync = cuda_stream_sync,
};

/* -- HIP: the current device's buffer, in its primary context ------------------
 * HIP's work goes to the calling thread's current device.  A device's
 * memory goes only with a reset of it (hipDeviceReset,
 * hipDevicePrimaryCtxReset: krex_hip_note_reset), so nothing is checked
 * before use. */

static int hip_owner(uintptr_t *key)
{
    krex_hip_abi_hipGetDevice *get = KREX_HIP_REAL(hipGetDevice);
    int32_t dev = -1;
    if (!get || get(&dev) != KREX_HIP_SUCCESS || dev < 0)
        return 0;
    *key = (uintptr_t)dev;
    return 1;
}

static int hip_l2_size(uintptr_t key, int *dev, int *bytes)
{
    krex_hip_abi_hipDeviceGetAttribute *get_attr = KREX_HIP_REAL(hipDeviceGetAttribute);
    if (!get_attr)
        return L2_NOT_FOUND;
    *dev = (int)key;
    return (int)get_attr(bytes, KREX_HIP_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, *dev);
}

static int hip_alloc(uint64_t *ptr, size_t size)
{
    krex_hip_abi_hipMalloc *alloc = KREX_HIP_REAL(hipMalloc);
    void *p = NULL;
    uint32_t r = alloc ? alloc(&p, size) : KREX_HIP_ERROR_NOT_FOUND;
    if (r == KREX_HIP_SUCCESS)
        *ptr = (uint64_t)(uintptr_t)p;
    return (int)r;
}

static void hip_release(uint64_t ptr)
{
    krex_hip_abi_hipFree *mfree = KREX_HIP_REAL(hipFree);
    if (mfree)
        mfree((void *)(uintptr_t)ptr);
}

static int hip_memset(uint64_t ptr, unsigned char value, size_t size)
{
    krex_hip_abi_hipMemset *set = KREX_HIP_REAL(hipMemset);
    return set ? (int)set((void *)(uintptr_t)ptr, value, size) : L2_NOT_FOUND;
}

static int hip_sync(void)
{
    krex_hip_abi_hipDeviceSynchronize *sync = KREX_HIP_REAL(hipDeviceSynchronize);
    return sync ? (int)sync() : L2_NOT_FOUND;
}

static int hip_memset_async(uint64_t ptr, size_t size)
{
    krex_hip_abi_hipMemsetAsync *set = KREX_HIP_REAL(hipMemsetAsync);
    return set ? (int)set((void *)(uintptr_t)ptr, 0, size, NULL) : L2_NOT_FOUND;
}

static int hip_stream_sync(void)
{
    krex_hip_abi_hipStreamSynchronize *ssync = KREX_HIP_REAL(hipStreamSynchronize);
    return ssync ? (int)ssync(NULL) : L2_NOT_FOUND; /* NULL: the null stream */
}

static const struct l2_runtime hip_l2 = {
    .name = "HIP",
    .owner = hip_owner,
    .l2_size = hip_l2_size,
    .alloc = hip_alloc,
    .release = hip_release,
    .valid = NULL, /* see above */
    .memset = hip_memset,
    .sync = hip_sync,
    .memset_async = hip_memset_async,
    .stream_sync = hip_stream_sync,
};

/* The runtime this process's flush and warm-up use; NULL when it loaded
 * neither (no device work of it can need one).  A process that loaded
 * libcuda uses the driver, as before HIP was gated. */
static const struct l2_runtime *l2_runtime(void)
{
    if (krex_libcuda_if_loaded())
        return &cuda_l2;
    if (krex_hip_loaded())
        return &hip_l2;
    return NULL;
}

static pthread_mutex_t l2_mu = PTHREAD_MUTEX_INITIALIZER;
static struct l2buf *l2; /* one per owner that flushed; grows, never evicts */
static size_t nl2, l2cap;
static _Atomic uint32_t region_epoch;
static _Atomic int l2_flushed;

/* Events and streams, for the region record.  All relaxed: statistics,
 * written by the hooks of any thread and read by the client's thread after
 * krex_shim_region_end(); a record racing with begin or end may land on
 * either side, as it would without the shim. */
#define RECENT_EVENTS 64
_Atomic int krex_region_open;        /* 1 from region_begin to region_end (region.h) */
_Atomic uint64_t krex_events_recorded_outside; /* region.h, krex_note_event_record */
static _Atomic uint64_t events_timed_outside;
static _Atomic(CUstream) timed_stream; /* stream of the last event recorded in the region */
static _Atomic int timed_stream_known;
static _Atomic(CUevent) recent_events[RECENT_EVENTS]; /* recorded in regions */
static _Atomic uint32_t recent_next;
static _Atomic uint64_t other_streams_ns = UINT64_MAX;

static void l2_drop(size_t i) { l2[i] = l2[--nl2]; }

/* The flush buffer of `key` (rt->owner's, on this thread); size 0 when the
 * device reports no L2. */
static int l2_buffer(const struct l2_runtime *rt, uintptr_t key, uint64_t *ptr, size_t *size)
{
    int r = L2_OK;
    *size = 0;
    pthread_mutex_lock(&l2_mu);
    for (size_t i = 0; i < nl2; i++) {
        if (l2[i].rt != rt || l2[i].key != key)
            continue;
        if (!rt->valid || rt->valid(&l2[i])) {
            *ptr = l2[i].ptr;
            *size = l2[i].size;
            goto out;
        }
        l2_drop(i);
        break;
    }
    int dev = -1, bytes = 0;
    if ((r = rt->l2_size(key, &dev, &bytes)) != L2_OK)
        goto out;
    if (bytes <= 0)
        goto out;
    uint64_t p;
    if ((r = rt->alloc(&p, (size_t)bytes)) != L2_OK)
        goto out;
    if (nl2 == l2cap) {
        size_t cap = l2cap ? 2 * l2cap : 8;
        struct l2buf *v = realloc(l2, cap * sizeof *v);
        if (!v) {
            /* Not remembered, so not reusable: give it back now. */
            rt->release(p);
            r = L2_OUT_OF_MEMORY;
            goto out;
        }
        l2 = v;
        l2cap = cap;
    }
    l2[nl2++] = (struct l2buf){rt, key, dev, p, (size_t)bytes};
    *ptr = p;
    *size = (size_t)bytes;
    krex_log(KREX_LOG_DEBUG, "L2 flush buffer of %d bytes on %s device %d", bytes, rt->name, dev);
out:
    pthread_mutex_unlock(&l2_mu);
    return r;
}

/* Forget rt's buffers of `key` (by_key), else of device `dev`: their
 * memory went with a context or a reset. */
static void l2_forget(const struct l2_runtime *rt, int by_key, uintptr_t key, int dev)
{
    pthread_mutex_lock(&l2_mu);
    for (size_t i = 0; i < nl2;)
        if (l2[i].rt == rt && (by_key ? l2[i].key == key : l2[i].dev == dev))
            l2_drop(i);
        else
            i++;
    pthread_mutex_unlock(&l2_mu);
}

/* [observe.post] of cuEventRecord*: in a region, remember the stream (the
 * timed one) and the event; outside, one relaxed increment. */
void krex_note_event_record_in_region(CUevent ev, CUstream stream)
{
    /* The ring index: relaxed loads and stores (see krex_note_event_record
     * in region.h). */
    atomic_store_explicit(&timed_stream, stream, memory_order_relaxed);
    atomic_store_explicit(&timed_stream_known, 1, memory_order_relaxed);
    uint32_t i = atomic_load_explicit(&recent_next, memory_order_relaxed);
    atomic_store_explicit(&recent_next, i + 1, memory_order_relaxed);
    atomic_store_explicit(&recent_events[i % RECENT_EVENTS], ev, memory_order_relaxed);
}

static int recorded_in_region(CUevent ev)
{
    for (int i = 0; i < RECENT_EVENTS; i++)
        if (atomic_load_explicit(&recent_events[i], memory_order_relaxed) == ev)
            return 1;
    return 0;
}

/* [observe.post] of cuEventElapsedTime*: timing outside a region, unless
 * both events were recorded in a region (read after it ended). */
void krex_note_event_elapsed(CUresult r, CUevent start, CUevent end)
{
    if (r != CUDA_SUCCESS || atomic_load_explicit(&krex_region_open, memory_order_relaxed))
        return;
    if (recorded_in_region(start) && recorded_in_region(end))
        return;
    atomic_fetch_add_explicit(&events_timed_outside, 1, memory_order_relaxed);
}

/* [observe.pre] of cuStreamDestroy*: the exit never synchronizes a freed stream. */
void krex_region_stream_destroying(CUstream stream)
{
    if (atomic_load_explicit(&timed_stream_known, memory_order_relaxed) &&
        atomic_load_explicit(&timed_stream, memory_order_relaxed) == stream)
        atomic_store_explicit(&timed_stream_known, 0, memory_order_relaxed);
}

void krex_region_forget_ctx(CUcontext ctx)
{
    /* The timed stream may be one of the context's: forget it. */
    atomic_store_explicit(&timed_stream_known, 0, memory_order_relaxed);
    l2_forget(&cuda_l2, 1, (uintptr_t)ctx, 0);
}

/* A reset primary context loses its memory; forget the device's buffers
 * (a created context's buffer forgotten here is only re-made). */
void krex_note_primary_reset(CUresult r, CUdevice dev)
{
    if (r != CUDA_SUCCESS)
        return;
    int saved = errno;
    l2_forget(&cuda_l2, 0, 0, (int)dev);
    errno = saved;
}

/* [observe.post] of hipDeviceReset (dev < 0: the calling thread's current
 * device) and hipDevicePrimaryCtxReset: the device's memory is gone. */
void krex_hip_note_reset(uint32_t r, int32_t dev)
{
    if (r != KREX_HIP_SUCCESS)
        return;
    int saved = errno;
    uintptr_t cur;
    if (dev < 0 && hip_owner(&cur))
        dev = (int32_t)cur;
    if (dev >= 0)
        l2_forget(&hip_l2, 0, 0, dev);
    errno = saved;
}

void krex_region_atfork_prepare(void) { pthread_mutex_lock(&l2_mu); }

void krex_region_atfork_parent(void) { pthread_mutex_unlock(&l2_mu); }

void krex_region_atfork_child(void)
{
    nl2 = 0; /* the parent's buffers belong to contexts the child cannot use */
    atomic_store_explicit(&region_epoch, 0, memory_order_relaxed);
    atomic_store_explicit(&l2_flushed, 0, memory_order_relaxed);
    atomic_store_explicit(&krex_region_open, 0, memory_order_relaxed);
    atomic_store_explicit(&timed_stream_known, 0, memory_order_relaxed);
    pthread_mutex_unlock(&l2_mu);
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
    const struct l2_runtime *rt = l2_flush ? l2_runtime() : NULL;
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
    if ((r = l2_buffer(rt, key, &p, &size)) == L2_OUT_OF_MEMORY) {
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

/* The exit synchronization: the timed stream first (when known), then
 * every context; the second part's duration goes to other_streams_ns. */
static CUresult exit_sync(void)
{
    __typeof__(&cuStreamSynchronize) ssync = KREX_REAL(cuStreamSynchronize);
    int known = atomic_exchange_explicit(&timed_stream_known, 0, memory_order_relaxed);
    if (!known || !ssync || krex_captures() != 0)
        return krex_sync_all(1); /* a capture: per-stream rules apply (drain.c) */
    CUresult r = ssync(atomic_load_explicit(&timed_stream, memory_order_relaxed));
    uint64_t t1 = krex_now_ns();
    CUresult r2 = krex_sync_all(1);
    if (r == CUDA_SUCCESS)
        atomic_store_explicit(&other_streams_ns, krex_now_ns() - t1, memory_order_relaxed);
    return r != CUDA_SUCCESS ? r : r2;
}

/* krex_shim_region_end(&sync_ns, &launches): synchronizes every context of
 * this process (work left on a private side stream must not run alongside
 * the siblings once they thaw; HIP: every device it used, as a drain
 * does), the timed stream first when an event was
 * recorded in the region (exit_sync), and returns how long that took and
 * the launches made in the region. */
int krex_region_end(uint64_t *sync_ns, uint64_t *launches)
{
    int saved = errno;
    uint64_t t0 = krex_now_ns();
    /* A HIP process (no driver loaded) records no CUDA event: the drain's
     * synchronization, HIP's half only (exit_sync would load the driver).
     * Neither runtime loaded: no work of this process can be running. */
    CUresult r = krex_libcuda_if_loaded() ? exit_sync()
                 : krex_hip_loaded()      ? krex_sync_all(1)
                                          : CUDA_SUCCESS;
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

/* CUDA events this process recorded (cuEventRecord*) and timed
 * (cuEventElapsedTime*) outside any region so far: timing done outside a
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

/* The clock warm-up.  A region often begins on an idle GPU (the drain
 * emptied it, the tenants were compiling), and an idle GPU lowers its SM
 * clock: two configurations timed in two regions can then run at two
 * clocks (docs/bench/autotune-h200.md).  Busy work brings the clock back;
 * the client decides how long from NVML (docs/design/region-log.md).
 *
 * The work is memsets of the L2 flush buffer (no allocation beyond the
 * one region_begin makes anyway) on the current context's legacy stream
 * (HIP: the current device's null stream),
 * enqueued in batches so the GPU never idles between two of them, and
 * synchronized per batch so the budget is checked between batches.  The
 * batch doubles from one memset (a synchronization's host overhead is
 * amortized over more of them), but holds no more than the time per
 * memset measured in the previous batch says fit in what is left: the
 * budget is overshot by at most the first memset, whose length is not
 * known before it runs, and one synchronization's overhead. */
#define WARM_BATCH_MAX 64

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

/* Runs the batches; returns 0 or the runtime's error, *spent_ns the time
 * they took. */
static int warm_batches(const struct l2_runtime *rt, uint64_t p, size_t size, uint64_t budget_ns,
                        uint64_t *spent_ns)
{
    int r = L2_OK;
    uint64_t t0 = krex_now_ns(), per = 0; /* ns per memset, from the last batch */
    uint64_t n = 0;
    for (;;) {
        uint64_t b0 = krex_now_ns();
        if (b0 - t0 >= budget_ns)
            break;
        n = n ? 2 * n : 1;
        if (n > WARM_BATCH_MAX)
            n = WARM_BATCH_MAX;
        if (per && n > (budget_ns - (b0 - t0)) / per)
            n = (budget_ns - (b0 - t0)) / per;
        if (n == 0)
            break; /* one more would overshoot */
        for (uint64_t i = 0; i < n && r == L2_OK; i++)
            r = rt->memset_async(p, size);
        int r2 = rt->stream_sync();
        if (r != L2_OK || (r = r2) != L2_OK)
            break;
        per = (krex_now_ns() - b0) / n;
        if (per == 0)
            per = 1;
    }
    *spent_ns = krex_now_ns() - t0;
    return r;
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
    const struct l2_runtime *rt = budget_us ? l2_runtime() : NULL;
    if (!rt || krex_captures() != 0)
        goto out;
    uintptr_t key;
    if (!rt->owner(&key))
        goto out;
    uint64_t p = 0;
    size_t size = 0;
    int r = l2_buffer(rt, key, &p, &size);
    if (r == L2_OUT_OF_MEMORY || (r == L2_OK && size == 0))
        goto out; /* as in region_begin: run the region unwarmed */
    uint64_t spent_ns = 0;
    if (r == L2_OK)
        r = warm_batches(rt, p, size, (uint64_t)budget_us * 1000u, &spent_ns);
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
