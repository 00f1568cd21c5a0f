/*
 * hip_memory.c — allocations, copies and memsets through HIP, on the
 * engine's memory (tests/fakecuda/memory.c, copy.c, vmm.c): the same shared
 * per-GPU capacity, the same durations (bytes / 1 TB/s on the device, / 50
 * GB/s across the host link), timeline kinds C and S.
 *
 * HIP's rules on top:
 *   - hipMalloc of 0 bytes succeeds with NULL; hipFree(NULL) and
 *     hipHostFree(NULL) do nothing;
 *   - hipMemcpy picks the direction from its kind; hipMemcpyDefault finds
 *     it from the pointers (device memory of this process, else host); a
 *     host-to-host copy is a plain memmove on the calling thread;
 *   - synchronous copies return when the copy has ended, as the engine's;
 *   - hipMemset / hipMemsetD8 / hipMemsetD32 (no stream) wait until the fill
 *     has ended on the null stream, as ROCm's ihipMemset does when it is
 *     not asynchronous; the Async forms return at once.
 */
#include "fakehip.h"

#include <string.h>

#define DPTR(p) ((CUdeviceptr)(uintptr_t)(p))

FH_API hipError_t hipMalloc(void **ptr, size_t size)
{
    FC_ENTRY();
    if (ptr == NULL)
        return fh_ret(hipErrorInvalidValue);
    *ptr = NULL;
    hipError_t e = fh_begin();
    if (e != hipSuccess || size == 0)
        return fh_ret(e);
    CUdeviceptr d = 0;
    e = fh_from_cu(cuMemAlloc_v2(&d, size));
    if (e == hipSuccess)
        *ptr = (void *)(uintptr_t)d;
    return fh_ret(e);
}

FH_API hipError_t hipFree(void *ptr)
{
    FC_ENTRY();
    hipError_t e = fh_begin();
    if (e == hipSuccess && ptr != NULL)
        e = fh_from_cu(cuMemFree_v2(DPTR(ptr)));
    return fh_ret(e);
}

FH_API hipError_t hipMallocAsync(void **dev_ptr, size_t size, hipStream_t stream)
{
    FC_ENTRY();
    if (dev_ptr == NULL)
        return fh_ret(hipErrorInvalidValue);
    *dev_ptr = NULL;
    hipError_t e = fh_begin();
    if (e != hipSuccess || size == 0)
        return fh_ret(e);
    CUdeviceptr d = 0;
    e = fh_from_cu(cuMemAllocAsync(&d, size, (CUstream)(void *)stream));
    if (e == hipSuccess)
        *dev_ptr = (void *)(uintptr_t)d;
    return fh_ret(e);
}

FH_API hipError_t hipFreeAsync(void *dev_ptr, hipStream_t stream)
{
    FC_ENTRY();
    hipError_t e = fh_begin();
    if (e == hipSuccess && dev_ptr != NULL)
        e = fh_from_cu(cuMemFreeAsync(DPTR(dev_ptr), (CUstream)(void *)stream));
    return fh_ret(e);
}

FH_API hipError_t hipHostMalloc(void **ptr, size_t size, unsigned int flags)
{
    FC_ENTRY();
    const unsigned int known = hipHostMallocPortable | hipHostMallocMapped |
                               hipHostMallocWriteCombined | hipHostMallocNumaUser |
                               hipHostMallocCoherent | hipHostMallocNonCoherent;
    if (ptr == NULL || (flags & ~known) ||
        ((flags & hipHostMallocCoherent) && (flags & hipHostMallocNonCoherent)))
        return fh_ret(hipErrorInvalidValue);
    *ptr = NULL;
    hipError_t e = fh_begin();
    if (e != hipSuccess || size == 0)
        return fh_ret(e);
    /* Page-locked host memory is host memory to the engine (vmm.c). */
    return fh_ret(fh_from_cu(cuMemHostAlloc(ptr, size, 0)));
}

FH_API hipError_t hipHostFree(void *ptr)
{
    FC_ENTRY();
    hipError_t e = fh_init();
    if (e == hipSuccess && ptr != NULL)
        e = fh_from_cu(cuMemFreeHost(ptr));
    return fh_ret(e);
}

/* The direction of a hipMemcpyDefault copy, from the pointers. */
static hipMemcpyKind infer_kind(void *dst, const void *src, size_t n)
{
    fc_lock();
    bool dst_dev = fc_mem_valid(dst, n), src_dev = fc_mem_valid(src, n);
    fc_unlock();
    return dst_dev ? (src_dev ? hipMemcpyDeviceToDevice : hipMemcpyHostToDevice)
                   : (src_dev ? hipMemcpyDeviceToHost : hipMemcpyHostToHost);
}

static hipError_t copy(void *dst, const void *src, size_t n, hipMemcpyKind kind,
                       hipStream_t stream, bool sync)
{
    hipError_t e = fh_begin();
    if (e != hipSuccess)
        return e;
    if ((unsigned)kind > (unsigned)hipMemcpyDefault)
        return hipErrorInvalidMemcpyDirection;
    if (n == 0)
        return hipSuccess;
    if (dst == NULL || src == NULL)
        return hipErrorInvalidValue;
    if (kind == hipMemcpyDefault)
        kind = infer_kind(dst, src, n);
    CUstream s = (CUstream)(void *)stream;
    CUresult r = CUDA_SUCCESS;
    switch (kind) {
    case hipMemcpyHostToHost: memmove(dst, src, n); break;
    case hipMemcpyHostToDevice:
        r = sync ? cuMemcpyHtoD_v2(DPTR(dst), src, n) : cuMemcpyHtoDAsync_v2(DPTR(dst), src, n, s);
        break;
    case hipMemcpyDeviceToHost:
        r = sync ? cuMemcpyDtoH_v2(dst, DPTR(src), n) : cuMemcpyDtoHAsync_v2(dst, DPTR(src), n, s);
        break;
    case hipMemcpyDeviceToDevice:
    default:
        r = sync ? cuMemcpyDtoD_v2(DPTR(dst), DPTR(src), n)
                 : cuMemcpyDtoDAsync_v2(DPTR(dst), DPTR(src), n, s);
        break;
    }
    return fh_from_cu(r);
}

FH_API hipError_t hipMemcpy(void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind)
{
    FC_ENTRY();
    return fh_ret(copy(dst, src, sizeBytes, kind, NULL, true));
}

FH_API hipError_t hipMemcpyAsync(void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind,
                                 hipStream_t stream)
{
    FC_ENTRY();
    return fh_ret(copy(dst, src, sizeBytes, kind, stream, false));
}

FH_API hipError_t hipMemcpyHtoD(hipDeviceptr_t dst, void *src, size_t sizeBytes)
{
    FC_ENTRY();
    return fh_ret(copy(dst, src, sizeBytes, hipMemcpyHostToDevice, NULL, true));
}

FH_API hipError_t hipMemcpyDtoH(void *dst, hipDeviceptr_t src, size_t sizeBytes)
{
    FC_ENTRY();
    return fh_ret(copy(dst, src, sizeBytes, hipMemcpyDeviceToHost, NULL, true));
}

FH_API hipError_t hipMemcpyDtoD(hipDeviceptr_t dst, hipDeviceptr_t src, size_t sizeBytes)
{
    FC_ENTRY();
    return fh_ret(copy(dst, src, sizeBytes, hipMemcpyDeviceToDevice, NULL, true));
}

FH_API hipError_t hipMemcpyHtoDAsync(hipDeviceptr_t dst, void *src, size_t sizeBytes,
                                     hipStream_t stream)
{
    FC_ENTRY();
    return fh_ret(copy(dst, src, sizeBytes, hipMemcpyHostToDevice, stream, false));
}

FH_API hipError_t hipMemcpyDtoHAsync(void *dst, hipDeviceptr_t src, size_t sizeBytes,
                                     hipStream_t stream)
{
    FC_ENTRY();
    return fh_ret(copy(dst, src, sizeBytes, hipMemcpyDeviceToHost, stream, false));
}

FH_API hipError_t hipMemcpyDtoDAsync(hipDeviceptr_t dst, hipDeviceptr_t src, size_t sizeBytes,
                                     hipStream_t stream)
{
    FC_ENTRY();
    return fh_ret(copy(dst, src, sizeBytes, hipMemcpyDeviceToDevice, stream, false));
}

/* A fill of `count` elements of 1 or 4 bytes; `sync`: wait until it ends. */
static hipError_t fill(void *dst, uint32_t value, size_t count, unsigned int elem,
                       hipStream_t stream, bool sync)
{
    hipError_t e = fh_begin();
    if (e != hipSuccess)
        return e;
    if (count == 0)
        return hipSuccess;
    CUstream s = (CUstream)(void *)stream;
    CUresult r = elem == 1 ? cuMemsetD8Async(DPTR(dst), (unsigned char)value, count, s)
                           : cuMemsetD32Async(DPTR(dst), value, count, s);
    if (r == CUDA_SUCCESS && sync) {
        fc_lock();
        struct CUstream_st *st = NULL;
        r = fh_stream(stream, &st);
        uint64_t until = r == CUDA_SUCCESS ? st->tail_ns : 0;
        fc_unlock();
        fc_sleep_until(until);
    }
    return fh_from_cu(r);
}

FH_API hipError_t hipMemset(void *dst, int value, size_t sizeBytes)
{
    FC_ENTRY();
    return fh_ret(fill(dst, (uint32_t)value, sizeBytes, 1, NULL, true));
}

FH_API hipError_t hipMemsetAsync(void *dst, int value, size_t sizeBytes, hipStream_t stream)
{
    FC_ENTRY();
    return fh_ret(fill(dst, (uint32_t)value, sizeBytes, 1, stream, false));
}

FH_API hipError_t hipMemsetD8(hipDeviceptr_t dest, unsigned char value, size_t count)
{
    FC_ENTRY();
    return fh_ret(fill(dest, value, count, 1, NULL, true));
}

FH_API hipError_t hipMemsetD8Async(hipDeviceptr_t dest, unsigned char value, size_t count,
                                   hipStream_t stream)
{
    FC_ENTRY();
    return fh_ret(fill(dest, value, count, 1, stream, false));
}

FH_API hipError_t hipMemsetD32(hipDeviceptr_t dest, int value, size_t count)
{
    FC_ENTRY();
    return fh_ret(fill(dest, (uint32_t)value, count, 4, NULL, true));
}

FH_API hipError_t hipMemsetD32Async(hipDeviceptr_t dst, int value, size_t count,
                                    hipStream_t stream)
{
    FC_ENTRY();
    return fh_ret(fill(dst, (uint32_t)value, count, 4, stream, false));
}
