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
 *     not asynchronous; the Async forms return at once;
 *   - hipMalloc3D pads each row to a pitch of the width rounded up to 256
 *     bytes (ROCm's image pitch alignment on AMD GPUs) and allocates pitch x
 *     height x depth bytes; an extent with a zero succeeds with NULL;
 *   - arrays (hipMallocArray, hipMalloc3DArray, hipArrayCreate,
 *     hipArray3DCreate) hold element size x width x height x depth bytes of
 *     device memory (a height or depth of 0 counts as 1), unpadded: ROCm
 *     lays images out with padded rows, which the fake does not model, nor
 *     any access to an array's contents;
 *   - hipMemCreate is the engine's cuMemCreate of the device location
 *     (tests/fakecuda/vmm.c: counted until hipMemRelease or the process's
 *     exit); only HIP 5.2.3's hipMemLocationTypeDevice exists.
 * An array's or physical allocation's handle is the fake's own structure,
 * kept after it is freed (a few bytes each) so that a second free reads as
 * hipErrorInvalidValue, not as freed memory.
 */
#include "fakehip.h"

#include <stdlib.h>
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

/* ---- pitched memory, arrays and physical allocations ---- */

#define FH_PITCH_ALIGN 256u
#define FH_MAGIC_ARRAY 0x79727241u /* "Arry" */
#define FH_MAGIC_PHYS 0x73796850u  /* "Phys" */

/* a * b * c bytes, or 0 when that does not fit a size_t. */
static size_t product(size_t a, size_t b, size_t c)
{
    size_t ab, abc;
    if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc))
        return 0;
    return abc;
}

FH_API hipError_t hipMalloc3D(hipPitchedPtr *pitchedDevPtr, hipExtent extent)
{
    FC_ENTRY();
    if (pitchedDevPtr == NULL)
        return fh_ret(hipErrorInvalidValue);
    *pitchedDevPtr = (hipPitchedPtr){NULL, 0, extent.width, extent.height};
    hipError_t e = fh_begin();
    if (e != hipSuccess || extent.width == 0 || extent.height == 0 || extent.depth == 0)
        return fh_ret(e);
    size_t pitch = extent.width + (FH_PITCH_ALIGN - 1);
    if (pitch < extent.width)
        return fh_ret(hipErrorOutOfMemory);
    pitch -= pitch % FH_PITCH_ALIGN;
    size_t bytes = product(pitch, extent.height, extent.depth);
    if (bytes == 0)
        return fh_ret(hipErrorOutOfMemory);
    CUdeviceptr d = 0;
    e = fh_from_cu(cuMemAlloc_v2(&d, bytes));
    if (e == hipSuccess) {
        pitchedDevPtr->ptr = (void *)(uintptr_t)d;
        pitchedDevPtr->pitch = pitch;
    }
    return fh_ret(e);
}

/* An array: its device memory.  hipArray * handles point to one. */
struct fh_array {
    uint32_t magic; /* FH_MAGIC_ARRAY while allocated, 0 once freed */
    CUdeviceptr data;
};

/* Bytes of an element of `desc` (bits per channel, each 0, 8, 16 or 32), or 0
 * when it describes none. */
static size_t channel_bytes(const hipChannelFormatDesc *desc)
{
    if (desc == NULL || (unsigned)desc->f > (unsigned)hipChannelFormatKindFloat)
        return 0;
    const int bits[4] = {desc->x, desc->y, desc->z, desc->w};
    size_t total = 0;
    for (int i = 0; i < 4; i++) {
        if (bits[i] != 0 && bits[i] != 8 && bits[i] != 16 && bits[i] != 32)
            return 0;
        total += (size_t)bits[i];
    }
    return total / 8;
}

/* Bytes of an element of `format` with `channels` channels (1, 2 or 4), or 0. */
static size_t format_bytes(hipArray_Format format, unsigned int channels)
{
    size_t size = 0;
    switch (format) {
    case HIP_AD_FORMAT_UNSIGNED_INT8:
    case HIP_AD_FORMAT_SIGNED_INT8: size = 1; break;
    case HIP_AD_FORMAT_UNSIGNED_INT16:
    case HIP_AD_FORMAT_SIGNED_INT16:
    case HIP_AD_FORMAT_HALF: size = 2; break;
    case HIP_AD_FORMAT_UNSIGNED_INT32:
    case HIP_AD_FORMAT_SIGNED_INT32:
    case HIP_AD_FORMAT_FLOAT: size = 4; break;
    }
    return channels == 1 || channels == 2 || channels == 4 ? size * channels : 0;
}

static hipError_t array_new(hipArray **out, size_t elem, size_t width, size_t height,
                            size_t depth, unsigned int flags)
{
    const unsigned int known = hipArrayLayered | hipArraySurfaceLoadStore | hipArrayCubemap |
                               hipArrayTextureGather;
    if (out == NULL || elem == 0 || width == 0 || (flags & ~known))
        return hipErrorInvalidValue;
    *out = NULL;
    hipError_t e = fh_begin();
    if (e != hipSuccess)
        return e;
    size_t bytes = product(elem, width, product(height ? height : 1, depth ? depth : 1, 1));
    if (bytes == 0)
        return hipErrorOutOfMemory;
    struct fh_array *a = malloc(sizeof *a);
    if (a == NULL)
        return hipErrorOutOfMemory;
    CUdeviceptr d = 0;
    e = fh_from_cu(cuMemAlloc_v2(&d, bytes));
    if (e != hipSuccess) {
        free(a);
        return e;
    }
    *a = (struct fh_array){FH_MAGIC_ARRAY, d};
    *out = (hipArray *)(void *)a;
    return hipSuccess;
}

static hipError_t array_free(hipArray *array)
{
    hipError_t e = fh_begin();
    if (e != hipSuccess)
        return e;
    struct fh_array *a = (struct fh_array *)(void *)array;
    if (a == NULL || a->magic != FH_MAGIC_ARRAY)
        return hipErrorInvalidValue;
    e = fh_from_cu(cuMemFree_v2(a->data));
    if (e == hipSuccess)
        a->magic = 0;
    return e;
}

FH_API hipError_t hipMallocArray(hipArray **array, const hipChannelFormatDesc *desc, size_t width,
                                 size_t height, unsigned int flags)
{
    FC_ENTRY();
    return fh_ret(array_new(array, channel_bytes(desc), width, height, 0, flags));
}

FH_API hipError_t hipMalloc3DArray(hipArray **array, const struct hipChannelFormatDesc *desc,
                                   struct hipExtent extent, unsigned int flags)
{
    FC_ENTRY();
    return fh_ret(
        array_new(array, channel_bytes(desc), extent.width, extent.height, extent.depth, flags));
}

FH_API hipError_t hipArrayCreate(hipArray **pHandle, const HIP_ARRAY_DESCRIPTOR *pAllocateArray)
{
    FC_ENTRY();
    const HIP_ARRAY_DESCRIPTOR *d = pAllocateArray;
    if (d == NULL)
        return fh_ret(hipErrorInvalidValue);
    return fh_ret(
        array_new(pHandle, format_bytes(d->Format, d->NumChannels), d->Width, d->Height, 0, 0));
}

FH_API hipError_t hipArray3DCreate(hipArray **array, const HIP_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
    FC_ENTRY();
    const HIP_ARRAY3D_DESCRIPTOR *d = pAllocateArray;
    if (d == NULL)
        return fh_ret(hipErrorInvalidValue);
    return fh_ret(array_new(array, format_bytes(d->Format, d->NumChannels), d->Width, d->Height,
                            d->Depth, d->Flags));
}

FH_API hipError_t hipFreeArray(hipArray *array)
{
    FC_ENTRY();
    return fh_ret(array_free(array));
}

FH_API hipError_t hipArrayDestroy(hipArray *array)
{
    FC_ENTRY();
    return fh_ret(array_free(array));
}

/* A physical allocation: the engine's.  hipMemGenericAllocationHandle_t
 * handles point to one. */
struct fh_phys {
    uint32_t magic; /* FH_MAGIC_PHYS until released, then 0 */
    CUmemGenericAllocationHandle cu;
};

FH_API hipError_t hipMemCreate(hipMemGenericAllocationHandle_t *handle, size_t size,
                               const hipMemAllocationProp *prop, unsigned long long flags)
{
    FC_ENTRY();
    if (handle == NULL || prop == NULL || size == 0 || flags != 0 ||
        prop->type != hipMemAllocationTypePinned || prop->location.type != hipMemLocationTypeDevice)
        return fh_ret(hipErrorInvalidValue);
    hipError_t e = fh_init();
    if (e != hipSuccess)
        return fh_ret(e);
    struct fh_phys *p = malloc(sizeof *p);
    if (p == NULL)
        return fh_ret(hipErrorOutOfMemory);
    CUmemAllocationProp cp;
    memset(&cp, 0, sizeof cp);
    cp.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    cp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    cp.location.id = prop->location.id;
    CUmemGenericAllocationHandle h = 0;
    e = fh_from_cu(cuMemCreate(&h, size, &cp, 0));
    if (e != hipSuccess) {
        free(p);
        return fh_ret(e);
    }
    *p = (struct fh_phys){FH_MAGIC_PHYS, h};
    *handle = (hipMemGenericAllocationHandle_t)(void *)p;
    return fh_ret(hipSuccess);
}

FH_API hipError_t hipMemRelease(hipMemGenericAllocationHandle_t handle)
{
    FC_ENTRY();
    hipError_t e = fh_init();
    if (e != hipSuccess)
        return fh_ret(e);
    struct fh_phys *p = (struct fh_phys *)(void *)handle;
    if (p == NULL || p->magic != FH_MAGIC_PHYS)
        return fh_ret(hipErrorInvalidValue);
    e = fh_from_cu(cuMemRelease(p->cu));
    if (e == hipSuccess)
        p->magic = 0;
    return fh_ret(e);
}

/* ---- page-locked host memory ---- */

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
