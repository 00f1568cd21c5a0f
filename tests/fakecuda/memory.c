/*
 * memory.c — device memory of the simulated GPUs: allocations, their
 * accounting against the shared per-GPU capacity (memshare.c), pointer
 * attributes, and the data effect of copies and memsets.
 *
 * Device memory is backed by private anonymous mappings reserved without
 * swap accounting (MAP_NORESERVE): device pointers are real addresses, so
 * copies and memsets move real data, and only touched pages cost host
 * memory (a memset to zero drops pages instead of writing them).  A
 * process's allocations are kept in a table sorted by address (guarded by
 * fc.mu) to validate device ranges and free by pointer.
 */
#include "fakecuda.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct alloc {
    uintptr_t base;
    size_t size;
    int gpu;                     /* simulated GPU index */
    struct CUctx_st *ctx;
};

static struct alloc *allocs;     /* sorted by base; guarded by fc.mu */
static size_t nallocs, capallocs;

/* Index of the first allocation with base > p. */
static size_t upper_bound(uintptr_t p)
{
    size_t lo = 0, hi = nallocs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (allocs[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static struct alloc *find_containing(uintptr_t p)
{
    size_t i = upper_bound(p);
    if (i == 0)
        return NULL;
    struct alloc *a = &allocs[i - 1];
    return p - a->base < a->size ? a : NULL;
}

bool fc_mem_valid(const void *p, size_t bytes)
{
    const struct alloc *a = find_containing((uintptr_t)p);
    return a && bytes <= a->size - ((uintptr_t)p - a->base);
}

static CUresult mem_alloc(struct CUctx_st *ctx, CUdeviceptr *dptr, size_t bytes)
{
    int g = fc.phys[ctx->device];
    if (!fc_share_reserve(g, bytes))
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (nallocs == capallocs) {
        size_t cap = capallocs ? capallocs * 2 : 64;
        struct alloc *n = realloc(allocs, cap * sizeof *n);
        if (n == NULL) {
            fc_share_release(g, bytes);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        allocs = n;
        capallocs = cap;
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) {
        fc_share_release(g, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    size_t i = upper_bound((uintptr_t)p);
    memmove(&allocs[i + 1], &allocs[i], (nallocs - i) * sizeof *allocs);
    allocs[i] = (struct alloc){.base = (uintptr_t)p, .size = bytes, .gpu = g, .ctx = ctx};
    nallocs++;
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

static void alloc_remove(size_t i)
{
    munmap((void *)allocs[i].base, allocs[i].size);
    fc_share_release(allocs[i].gpu, allocs[i].size);
    memmove(&allocs[i], &allocs[i + 1], (nallocs - i - 1) * sizeof *allocs);
    nallocs--;
}

static CUresult mem_free(CUdeviceptr dptr)
{
    size_t i = upper_bound((uintptr_t)dptr);
    if (i == 0 || allocs[i - 1].base != (uintptr_t)dptr)
        return CUDA_ERROR_INVALID_VALUE;
    alloc_remove(i - 1);
    return CUDA_SUCCESS;
}

void fc_mem_release_ctx(const struct CUctx_st *ctx)
{
    for (size_t i = nallocs; i-- > 0;)
        if (allocs[i].ctx == ctx)
            alloc_remove(i);
}

void fc_mem_atfork_child(void)
{
    /* The child owns no device memory (the mappings it inherited are copies). */
    nallocs = 0;
    fc_share_atfork_child();
}

/* Zero [p, p+n) of anonymous device memory: whole pages are dropped
 * (they read back as zeros) instead of written. */
static void zero_range(unsigned char *p, size_t n)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + page - 1) & ~(page - 1);
    uintptr_t b = ((uintptr_t)p + n) & ~(page - 1);
    if (b <= a || madvise((void *)a, b - a, MADV_DONTNEED) != 0) {
        memset(p, 0, n);
        return;
    }
    memset(p, 0, a - (uintptr_t)p);
    memset((void *)b, 0, (uintptr_t)p + n - b);
}

void fc_dataop_apply(const struct fc_dataop *op)
{
    if (op->kind == FC_OP_COPY) {
        memmove(op->dst, op->src, op->count);
    } else if (op->kind == FC_OP_SET && op->value == 0) {
        zero_range(op->dst, op->count * op->elem);
    } else if (op->kind == FC_OP_SET && op->elem == 1) {
        memset(op->dst, (int)op->value, op->count);
    } else if (op->kind == FC_OP_SET) {
        uint32_t *d = op->dst;
        for (size_t i = 0; i < op->count; i++)
            d[i] = op->value;
    }
}

CUresult fc_mem_working(int gpu)
{
    if (!fc_share_reserve(gpu, fc.call_bytes))
        return CUDA_ERROR_OUT_OF_MEMORY;
    fc_share_release(gpu, fc.call_bytes);
    return CUDA_SUCCESS;
}

int fc_current_gpu(void)
{
    struct CUctx_st *ctx = NULL;
    return fc_current_ctx(&ctx) == CUDA_SUCCESS ? fc.phys[ctx->device] : 0;
}

/* ---- entry points ---- */

FC_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (dptr == NULL || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    struct CUctx_st *ctx = NULL;
    r = fc_current_ctx(&ctx);
    /* cuMemAlloc is one of the calls a capture forbids outside RELAXED mode. */
    if (r == CUDA_SUCCESS)
        r = fc_capture_check_sync(ctx, NULL);
    if (r == CUDA_SUCCESS)
        r = mem_alloc(ctx, dptr, bytesize);
    fc_unlock();
    return r;
}

FC_API CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    const struct alloc *a = find_containing((uintptr_t)dptr);
    if (a == NULL || a->base != (uintptr_t)dptr) {
        fc_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* cuMemFree synchronizes: work of the context still running may use
     * the memory (cuda.h: "may perform implicit synchronization"); so a
     * capture forbids it outside RELAXED mode. */
    r = fc_capture_check_sync(a->ctx, NULL);
    if (r != CUDA_SUCCESS) {
        fc_unlock();
        return r;
    }
    uint64_t until = fc_ctx_tail(a->ctx);
    fc_unlock();
    fc_sleep_until(until);
    fc_lock();
    r = mem_free(dptr); /* INVALID_VALUE if another thread freed it meanwhile */
    fc_unlock();
    return r;
}

FC_API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (free_bytes == NULL || total == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    struct CUctx_st *ctx = NULL;
    r = fc_current_ctx(&ctx);
    if (r == CUDA_SUCCESS) {
        uint64_t used = fc_share_used(fc.phys[ctx->device]);
        *free_bytes = (size_t)(used < fc.mem_bytes ? fc.mem_bytes - used : 0);
        *total = (size_t)fc.mem_bytes;
    }
    fc_unlock();
    return r;
}

/* Stream-ordered allocation: the memory is counted from the call on (the
 * simulated allocator has no pool to reuse from). */
static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize, CUstream hStream, bool per_thread)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (dptr == NULL || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    struct CUstream_st *s = NULL;
    r = fc_stream_resolve(hStream, per_thread, &s);
    if (r == CUDA_SUCCESS)
        r = mem_alloc(s->ctx, dptr, bytesize);
    fc_unlock();
    return r;
}

static CUresult free_async(CUdeviceptr dptr, CUstream hStream, bool per_thread)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    struct CUstream_st *s = NULL;
    r = fc_stream_resolve(hStream, per_thread, &s);
    if (r == CUDA_SUCCESS)
        r = mem_free(dptr);
    fc_unlock();
    return r;
}

FC_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    FC_ENTRY();
    return alloc_async(dptr, bytesize, hStream, false);
}

FC_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    FC_ENTRY();
    return alloc_async(dptr, bytesize, hStream, true);
}

/* Memory pools: each device's default pool only (no pool is ever trimmed:
 * the simulated allocator keeps nothing after a free). */
struct CUmemPoolHandle_st {
    uint32_t magic;
    int device; /* visible ordinal */
};

#define FC_MAGIC_POOL 0x6c6f5066u /* "fPol" */

static struct CUmemPoolHandle_st default_pools[FC_MAX_GPUS];

FC_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (pool_out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= fc.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    default_pools[dev] = (struct CUmemPoolHandle_st){FC_MAGIC_POOL, dev};
    *pool_out = &default_pools[dev];
    return CUDA_SUCCESS;
}

static CUresult alloc_from_pool(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                CUstream hStream, bool per_thread)
{
    if (pool == NULL || pool->magic != FC_MAGIC_POOL)
        return fc_check_init() == CUDA_SUCCESS ? CUDA_ERROR_INVALID_VALUE
                                               : CUDA_ERROR_NOT_INITIALIZED;
    return alloc_async(dptr, bytesize, hStream, per_thread);
}

FC_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                        CUstream hStream)
{
    FC_ENTRY();
    return alloc_from_pool(dptr, bytesize, pool, hStream, false);
}

FC_API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                             CUmemoryPool pool, CUstream hStream)
{
    FC_ENTRY();
    return alloc_from_pool(dptr, bytesize, pool, hStream, true);
}

FC_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    FC_ENTRY();
    return free_async(dptr, hStream, false);
}

FC_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    FC_ENTRY();
    return free_async(dptr, hStream, true);
}

FC_API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (data == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    const struct alloc *a = find_containing((uintptr_t)ptr);
    if (a == NULL) {
        fc_unlock();
        return CUDA_ERROR_INVALID_VALUE; /* not device memory of this process */
    }
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = a->ctx; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned int *)data = CU_MEMORYTYPE_DEVICE; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = ptr; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = a->ctx->device; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = a->base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = a->size; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned int *)data = 0; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(unsigned int *)data = 1; break;
    default: r = CUDA_ERROR_NOT_SUPPORTED; break;
    }
    fc_unlock();
    return r;
}
