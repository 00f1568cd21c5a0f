/*
 * copy.c — memcpy and memset entry points.  Each is one stream operation
 * (timeline kind C or S) whose modelled duration is its size over a
 * bandwidth: FC_HOST_BYTES_PER_NS across the host link, FC_DEVICE_BYTES_PER_NS
 * on the device.  Device ranges must lie inside one allocation
 * (CUDA_ERROR_INVALID_VALUE otherwise); data really moves (memory.c).
 *
 * Synchronous copies (cuMemcpyXtoY_v2[_ptds]) return when the copy has
 * ended on the device; synchronous memsets are asynchronous with respect to
 * the host for device memory, as cuda.h's \note_memset says.  The _ptds and
 * _ptsz forms use the per-thread default stream for NULL.
 */
#include "fakecuda.h"

enum direction { H2D, D2H, D2D };

static uint64_t duration_ns(size_t bytes, uint64_t bytes_per_ns)
{
    return ((uint64_t)bytes + bytes_per_ns - 1) / bytes_per_ns;
}

static CUresult copy(void *dst, const void *src, size_t n, enum direction dir, CUstream hStream,
                     bool per_thread, bool sync)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (dst == NULL || src == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    struct CUstream_st *s = NULL;
    r = fc_stream_resolve(hStream, per_thread, &s);
    if (r == CUDA_SUCCESS && ((dir != D2H && !fc_mem_valid(dst, n)) ||
                              (dir != H2D && !fc_mem_valid(src, n))))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && sync && s->capture) {
        s->capture->invalidated = true; /* a synchronous copy cannot be captured */
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    uint64_t until = 0;
    if (r == CUDA_SUCCESS && n > 0) {
        struct fc_dataop op = {.kind = FC_OP_COPY,
                               .dst = dst,
                               .src = src,
                               .count = n,
                               .elem = 1,
                               .dst_device = dir != D2H,
                               .src_device = dir != H2D};
        uint64_t bw = dir == D2D ? FC_DEVICE_BYTES_PER_NS : FC_HOST_BYTES_PER_NS;
        r = fc_submit(s, FC_KIND_COPY, duration_ns(n, bw), &op);
        until = s->tail_ns;
    }
    fc_unlock();
    if (r == CUDA_SUCCESS && sync)
        fc_sleep_until(until);
    return r;
}

#define DPTR(p) ((void *)(uintptr_t)(p))

FC_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    FC_ENTRY();
    return copy(DPTR(dstDevice), srcHost, ByteCount, H2D, NULL, false, true);
}

FC_API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    FC_ENTRY();
    return copy(DPTR(dstDevice), srcHost, ByteCount, H2D, NULL, true, true);
}

FC_API CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    FC_ENTRY();
    return copy(dstHost, DPTR(srcDevice), ByteCount, D2H, NULL, false, true);
}

FC_API CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    FC_ENTRY();
    return copy(dstHost, DPTR(srcDevice), ByteCount, D2H, NULL, true, true);
}

FC_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    FC_ENTRY();
    return copy(DPTR(dstDevice), DPTR(srcDevice), ByteCount, D2D, NULL, false, true);
}

FC_API CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                     size_t ByteCount)
{
    FC_ENTRY();
    return copy(DPTR(dstDevice), DPTR(srcDevice), ByteCount, D2D, NULL, true, true);
}

FC_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                                     CUstream hStream)
{
    FC_ENTRY();
    return copy(DPTR(dstDevice), srcHost, ByteCount, H2D, hStream, false, false);
}

FC_API CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost,
                                          size_t ByteCount, CUstream hStream)
{
    FC_ENTRY();
    return copy(DPTR(dstDevice), srcHost, ByteCount, H2D, hStream, true, false);
}

FC_API CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                     CUstream hStream)
{
    FC_ENTRY();
    return copy(dstHost, DPTR(srcDevice), ByteCount, D2H, hStream, false, false);
}

FC_API CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                          CUstream hStream)
{
    FC_ENTRY();
    return copy(dstHost, DPTR(srcDevice), ByteCount, D2H, hStream, true, false);
}

FC_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                     size_t ByteCount, CUstream hStream)
{
    FC_ENTRY();
    return copy(DPTR(dstDevice), DPTR(srcDevice), ByteCount, D2D, hStream, false, false);
}

FC_API CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                          size_t ByteCount, CUstream hStream)
{
    FC_ENTRY();
    return copy(DPTR(dstDevice), DPTR(srcDevice), ByteCount, D2D, hStream, true, false);
}

static CUresult set(CUdeviceptr dst, uint32_t value, size_t count, unsigned int elem,
                    CUstream hStream, bool per_thread)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (dst % elem != 0 || count > SIZE_MAX / elem)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    struct CUstream_st *s = NULL;
    r = fc_stream_resolve(hStream, per_thread, &s);
    if (r == CUDA_SUCCESS && !fc_mem_valid(DPTR(dst), count * elem))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && count > 0) {
        struct fc_dataop op = {.kind = FC_OP_SET,
                               .dst = DPTR(dst),
                               .count = count,
                               .elem = elem,
                               .value = value,
                               .dst_device = true};
        r = fc_submit(s, FC_KIND_MEMSET, duration_ns(count * elem, FC_DEVICE_BYTES_PER_NS), &op);
    }
    fc_unlock();
    return r;
}

FC_API CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    FC_ENTRY();
    return set(dstDevice, uc, N, 1, NULL, false);
}

FC_API CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    FC_ENTRY();
    return set(dstDevice, uc, N, 1, NULL, true);
}

FC_API CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    FC_ENTRY();
    return set(dstDevice, ui, N, 4, NULL, false);
}

FC_API CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    FC_ENTRY();
    return set(dstDevice, ui, N, 4, NULL, true);
}

FC_API CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                CUstream hStream)
{
    FC_ENTRY();
    return set(dstDevice, uc, N, 1, hStream, false);
}

FC_API CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                     CUstream hStream)
{
    FC_ENTRY();
    return set(dstDevice, uc, N, 1, hStream, true);
}

FC_API CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N,
                                 CUstream hStream)
{
    FC_ENTRY();
    return set(dstDevice, ui, N, 4, hStream, false);
}

FC_API CUresult cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N,
                                      CUstream hStream)
{
    FC_ENTRY();
    return set(dstDevice, ui, N, 4, hStream, true);
}
