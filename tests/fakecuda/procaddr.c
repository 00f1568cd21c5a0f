/*
 * procaddr.c — cuGetProcAddress (4 arguments, CUDA 11.3 ABI),
 * cuGetProcAddress_v2 (5 arguments, CUDA 12 ABI) and cuGetExportTable.
 *
 * A request names a base symbol ("cuMemAlloc"), the CUDA version whose ABI
 * the caller expects and a stream flavour.  The answer is the export whose
 * ABI was current at that version: among the table rows of the base name
 * with min_version <= cudaVersion, the one with the highest min_version;
 * its per-thread export when the caller asks for per-thread default stream
 * semantics.  The rows reproduce the real driver's answers (compared with
 * the resolutions measured on driver 580.159.04 by test_procaddr.py); the
 * version thresholds are those of cudaTypedefs.h's PFN_<name>_v<version>.
 * Rows are listed only for implemented exports, so older ABIs of a few
 * names (e.g. the CUDA 2.0 cuCtxCreate) resolve as VERSION_NOT_SUFFICIENT.
 */
#include "fakecuda.h"

#include <stdlib.h>
#include <string.h>

struct proc_row {
    const char *base;
    int min_version;
    const char *legacy;     /* export for LEGACY_STREAM / DEFAULT */
    const char *per_thread; /* export for PER_THREAD_DEFAULT_STREAM (NULL: same) */
    void *fn_legacy;
    void *fn_per_thread;
};

#define ROW(base, ver, fn) {#base, ver, #fn, NULL, (void *)fn, NULL}
#define ROWPT(base, ver, fn, pt) {#base, ver, #fn, #pt, (void *)fn, (void *)pt}

static const struct proc_row rows[] = {
    ROW(cuInit, 2000, cuInit),
    ROW(cuDriverGetVersion, 2020, cuDriverGetVersion),
    ROW(cuDeviceGet, 2000, cuDeviceGet),
    ROW(cuDeviceGetCount, 2000, cuDeviceGetCount),
    ROW(cuDeviceGetName, 2000, cuDeviceGetName),
    ROW(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute),
    ROW(cuDeviceTotalMem, 3020, cuDeviceTotalMem_v2),
    ROW(cuDeviceGetUuid, 9020, cuDeviceGetUuid),
    ROW(cuDeviceGetUuid, 11040, cuDeviceGetUuid_v2),
    ROW(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain),
    ROW(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2),
    ROW(cuDevicePrimaryCtxGetState, 7000, cuDevicePrimaryCtxGetState),
    ROW(cuDevicePrimaryCtxReset, 11000, cuDevicePrimaryCtxReset_v2),
    ROW(cuCtxCreate, 3020, cuCtxCreate_v2),
    ROW(cuCtxCreate, 11040, cuCtxCreate_v3),
    ROW(cuCtxCreate, 12050, cuCtxCreate_v4),
    ROW(cuCtxDestroy, 4000, cuCtxDestroy_v2),
    ROW(cuCtxSetCurrent, 4000, cuCtxSetCurrent),
    ROW(cuCtxGetCurrent, 4000, cuCtxGetCurrent),
    ROW(cuCtxPushCurrent, 4000, cuCtxPushCurrent_v2),
    ROW(cuCtxPopCurrent, 4000, cuCtxPopCurrent_v2),
    ROW(cuCtxSynchronize, 2000, cuCtxSynchronize),
    ROW(cuCtxSynchronize, 13000, cuCtxSynchronize_v2),
    ROW(cuCtxGetDevice, 2000, cuCtxGetDevice),
    ROW(cuCtxGetDevice, 13000, cuCtxGetDevice_v2),
    ROW(cuStreamCreate, 2000, cuStreamCreate),
    ROW(cuStreamCreateWithPriority, 5050, cuStreamCreateWithPriority),
    ROW(cuStreamDestroy, 4000, cuStreamDestroy_v2),
    ROWPT(cuStreamSynchronize, 2000, cuStreamSynchronize, cuStreamSynchronize_ptsz),
    ROWPT(cuStreamQuery, 2000, cuStreamQuery, cuStreamQuery_ptsz),
    ROWPT(cuStreamWaitEvent, 3020, cuStreamWaitEvent, cuStreamWaitEvent_ptsz),
    ROWPT(cuStreamGetCtx, 9020, cuStreamGetCtx, cuStreamGetCtx_ptsz),
    ROWPT(cuStreamGetCtx, 12050, cuStreamGetCtx_v2, cuStreamGetCtx_v2_ptsz),
    ROW(cuEventCreate, 2000, cuEventCreate),
    ROWPT(cuEventRecord, 2000, cuEventRecord, cuEventRecord_ptsz),
    ROWPT(cuEventRecordWithFlags, 11010, cuEventRecordWithFlags, cuEventRecordWithFlags_ptsz),
    ROW(cuEventSynchronize, 2000, cuEventSynchronize),
    ROW(cuEventQuery, 2000, cuEventQuery),
    ROW(cuEventElapsedTime, 2000, cuEventElapsedTime),
    ROW(cuEventElapsedTime, 12080, cuEventElapsedTime_v2),
    ROW(cuEventDestroy, 4000, cuEventDestroy_v2),
    ROW(cuModuleLoadData, 2000, cuModuleLoadData),
    ROW(cuModuleGetFunction, 2000, cuModuleGetFunction),
    ROW(cuModuleUnload, 2000, cuModuleUnload),
    ROW(cuLibraryLoadData, 12000, cuLibraryLoadData),
    ROW(cuLibraryGetKernel, 12000, cuLibraryGetKernel),
    ROW(cuLibraryUnload, 12000, cuLibraryUnload),
    ROW(cuKernelGetFunction, 12000, cuKernelGetFunction),
    ROWPT(cuLaunchKernel, 4000, cuLaunchKernel, cuLaunchKernel_ptsz),
    ROWPT(cuLaunchKernelEx, 11060, cuLaunchKernelEx, cuLaunchKernelEx_ptsz),
    ROW(cuMemAlloc, 3020, cuMemAlloc_v2),
    ROW(cuMemFree, 3020, cuMemFree_v2),
    ROW(cuMemGetInfo, 3020, cuMemGetInfo_v2),
    ROW(cuPointerGetAttribute, 4000, cuPointerGetAttribute),
    ROWPT(cuMemAllocAsync, 11020, cuMemAllocAsync, cuMemAllocAsync_ptsz),
    ROWPT(cuMemFreeAsync, 11020, cuMemFreeAsync, cuMemFreeAsync_ptsz),
    ROW(cuDeviceGetDefaultMemPool, 11020, cuDeviceGetDefaultMemPool),
    ROWPT(cuMemAllocFromPoolAsync, 11020, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz),
    ROW(cuMemCreate, 10020, cuMemCreate),
    ROW(cuMemRelease, 10020, cuMemRelease),
    ROW(cuMemAddressReserve, 10020, cuMemAddressReserve),
    ROW(cuMemAddressFree, 10020, cuMemAddressFree),
    ROW(cuMemMap, 10020, cuMemMap),
    ROW(cuMemUnmap, 10020, cuMemUnmap),
    ROW(cuMemHostAlloc, 2020, cuMemHostAlloc),
    ROW(cuMemAllocHost, 3020, cuMemAllocHost_v2),
    ROW(cuMemFreeHost, 2000, cuMemFreeHost),
    ROW(cuMemHostRegister, 6050, cuMemHostRegister_v2),
    ROW(cuMemHostUnregister, 4000, cuMemHostUnregister),
    ROWPT(cuMemcpyHtoD, 3020, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds),
    ROWPT(cuMemcpyDtoH, 3020, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds),
    ROWPT(cuMemcpyDtoD, 3020, cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds),
    ROWPT(cuMemcpyHtoDAsync, 3020, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz),
    ROWPT(cuMemcpyDtoHAsync, 3020, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz),
    ROWPT(cuMemcpyDtoDAsync, 3020, cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz),
    ROWPT(cuMemsetD8, 3020, cuMemsetD8_v2, cuMemsetD8_v2_ptds),
    ROWPT(cuMemsetD32, 3020, cuMemsetD32_v2, cuMemsetD32_v2_ptds),
    ROWPT(cuMemsetD8Async, 3020, cuMemsetD8Async, cuMemsetD8Async_ptsz),
    ROWPT(cuMemsetD32Async, 3020, cuMemsetD32Async, cuMemsetD32Async_ptsz),
    ROWPT(cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz),
    ROWPT(cuStreamEndCapture, 10000, cuStreamEndCapture, cuStreamEndCapture_ptsz),
    ROWPT(cuStreamIsCapturing, 10000, cuStreamIsCapturing, cuStreamIsCapturing_ptsz),
    ROW(cuThreadExchangeStreamCaptureMode, 10010, cuThreadExchangeStreamCaptureMode),
    ROW(cuGraphInstantiateWithFlags, 11040, cuGraphInstantiateWithFlags),
    ROWPT(cuGraphLaunch, 10000, cuGraphLaunch, cuGraphLaunch_ptsz),
    ROWPT(cuGraphUpload, 11010, cuGraphUpload, cuGraphUpload_ptsz),
    ROWPT(cuGraphInstantiateWithParams, 12000, cuGraphInstantiateWithParams,
          cuGraphInstantiateWithParams_ptsz),
    ROW(cuGraphExecDestroy, 10000, cuGraphExecDestroy),
    ROW(cuGraphDestroy, 10000, cuGraphDestroy),
    ROW(cuCheckpointProcessGetState, 12080, cuCheckpointProcessGetState),
    ROW(cuCheckpointProcessLock, 12080, cuCheckpointProcessLock),
    ROW(cuCheckpointProcessUnlock, 12080, cuCheckpointProcessUnlock),
    ROW(cuGetErrorString, 6000, cuGetErrorString),
    ROW(cuGetErrorName, 6000, cuGetErrorName),
    ROW(cuGetProcAddress, 11030, cuGetProcAddress),
    ROW(cuGetProcAddress, 12000, cuGetProcAddress_v2),
    ROW(cuGetExportTable, 3000, cuGetExportTable),
};

/* KREX_FAKE_NEWER_DRIVER=1: the driver also resolves "cuFooBar", a name no
 * cuda.h declares, to a function of its own that is not exported (a driver
 * newer than the headers the shim was built from). */
static CUresult fake_foo_bar(void) { return CUDA_SUCCESS; }

static CUresult lookup(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status)
{
    if (symbol == NULL || pfn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    const char *newer = getenv("KREX_FAKE_NEWER_DRIVER");
    if (newer && !strcmp(newer, "1") && !strcmp(symbol, "cuFooBar") &&
        cudaVersion <= FC_DRIVER_VERSION) {
        *pfn = (void *)fake_foo_bar;
        if (status)
            *status = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    /* cuda.h: a version above the driver's is CUDA_ERROR_INVALID_VALUE. */
    if (cudaVersion > FC_DRIVER_VERSION)
        return CUDA_ERROR_INVALID_VALUE;
    bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct proc_row *best = NULL;
    bool known = false;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (strcmp(rows[i].base, symbol) != 0)
            continue;
        known = true;
        if (rows[i].min_version <= cudaVersion &&
            (best == NULL || rows[i].min_version > best->min_version))
            best = &rows[i];
    }
    if (best == NULL) {
        if (status)
            *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = per_thread && best->fn_per_thread ? best->fn_per_thread : best->fn_legacy;
    if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

FC_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    FC_ENTRY();
    return lookup(symbol, pfn, cudaVersion, flags, NULL);
}

FC_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
    FC_ENTRY();
    return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

/* Export tables are the runtime's private interface to the driver; the fake
 * driver has none (so libcudart cannot run on it; tests use the driver API). */
FC_API CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
    FC_ENTRY();
    (void)pExportTableId;
    if (ppExportTable)
        *ppExportTable = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}
