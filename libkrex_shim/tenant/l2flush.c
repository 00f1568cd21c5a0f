/*
 * l2flush.c — the holder's L2 flush buffers and the runtime that fills them
 * (l2flush.h): the CUDA driver where libcuda is loaded, else the HIP
 * runtime; the buffers, kept until their context or device goes; the
 * clock warm-up's batched memsets.
 */
#include "l2flush.h"
#include "hipinterpose.h"
#include "interpose.h"

#include <errno.h>
#include <pthread.h>

_Static_assert(CUDA_SUCCESS == L2_OK && KREX_HIP_SUCCESS == L2_OK, "success");
_Static_assert(CUDA_ERROR_OUT_OF_MEMORY == L2_OUT_OF_MEMORY &&
                   KREX_HIP_ERROR_OUT_OF_MEMORY == L2_OUT_OF_MEMORY, "out of memory");
_Static_assert(CUDA_ERROR_NOT_FOUND == L2_NOT_FOUND && KREX_HIP_ERROR_NOT_FOUND == L2_NOT_FOUND,
               "not found");

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
 * before use.  Each call is the shim's own: an error it leaves as the
 * thread's last error is forgotten unless the program had one unread
 * (hipinterpose.h, krex_hip_forget_own_error), so that a flush that found
 * no memory is not the program's next hipGetLastError. */

/* The thread's last error before the call, then the call's result `r`:
 * OWN_CALL(r = real(...)) returns r. */
#define OWN_CALL(call)                                                         \
    __extension__({                                                            \
        uint32_t own_before_ = krex_hip_peek_error();                          \
        uint32_t own_r_ = (uint32_t)(call);                                    \
        if (own_r_ != KREX_HIP_SUCCESS)                                        \
            krex_hip_forget_own_error(own_before_);                            \
        own_r_;                                                                \
    })

static int hip_owner(uintptr_t *key)
{
    krex_hip_abi_hipGetDevice *get = KREX_HIP_REAL(hipGetDevice);
    int32_t dev = -1;
    if (!get || OWN_CALL(get(&dev)) != KREX_HIP_SUCCESS || dev < 0)
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
    return (int)OWN_CALL(get_attr(bytes, KREX_HIP_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, *dev));
}

static int hip_alloc(uint64_t *ptr, size_t size)
{
    krex_hip_abi_hipMalloc *alloc = KREX_HIP_REAL(hipMalloc);
    void *p = NULL;
    uint32_t r = alloc ? OWN_CALL(alloc(&p, size)) : KREX_HIP_ERROR_NOT_FOUND;
    if (r == KREX_HIP_SUCCESS)
        *ptr = (uint64_t)(uintptr_t)p;
    return (int)r;
}

static void hip_release(uint64_t ptr)
{
    krex_hip_abi_hipFree *mfree = KREX_HIP_REAL(hipFree);
    if (mfree)
        (void)OWN_CALL(mfree((void *)(uintptr_t)ptr));
}

static int hip_memset(uint64_t ptr, unsigned char value, size_t size)
{
    krex_hip_abi_hipMemset *set = KREX_HIP_REAL(hipMemset);
    return set ? (int)OWN_CALL(set((void *)(uintptr_t)ptr, value, size)) : L2_NOT_FOUND;
}

static int hip_sync(void)
{
    krex_hip_abi_hipDeviceSynchronize *sync = KREX_HIP_REAL(hipDeviceSynchronize);
    return sync ? (int)OWN_CALL(sync()) : L2_NOT_FOUND;
}

static int hip_memset_async(uint64_t ptr, size_t size)
{
    krex_hip_abi_hipMemsetAsync *set = KREX_HIP_REAL(hipMemsetAsync);
    return set ? (int)OWN_CALL(set((void *)(uintptr_t)ptr, 0, size, NULL)) : L2_NOT_FOUND;
}

static int hip_stream_sync(void)
{
    krex_hip_abi_hipStreamSynchronize *ssync = KREX_HIP_REAL(hipStreamSynchronize);
    return ssync ? (int)OWN_CALL(ssync(NULL)) : L2_NOT_FOUND; /* NULL: the null stream */
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
const struct l2_runtime *krex_l2_runtime(void)
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

static void l2_drop(size_t i) { l2[i] = l2[--nl2]; }

/* The flush buffer of `key` (rt->owner's, on this thread); size 0 when the
 * device reports no L2. */
int krex_l2_buffer(const struct l2_runtime *rt, uintptr_t key, uint64_t *ptr, size_t *size)
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

void krex_l2_forget_ctx(CUcontext ctx) { l2_forget(&cuda_l2, 1, (uintptr_t)ctx, 0); }

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

void krex_l2_atfork_prepare(void) { pthread_mutex_lock(&l2_mu); }

void krex_l2_atfork_parent(void) { pthread_mutex_unlock(&l2_mu); }

void krex_l2_atfork_child(void)
{
    nl2 = 0; /* the parent's buffers belong to contexts the child cannot use */
    pthread_mutex_unlock(&l2_mu);
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

/* The warm-up's memsets over the buffer `p` of `size` bytes for about
 * budget_ns; returns 0 or the runtime's error, *spent_ns the time they
 * took. */
int krex_l2_warm(const struct l2_runtime *rt, uint64_t p, size_t size, uint64_t budget_ns,
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
