/*
 * hip_error.c — HIP error codes: the engine's results in HIP's terms, the
 * thread's last error, and the names and texts of hipGetErrorName and
 * hipGetErrorString (hip_api.h's FH_ERRORS, as ROCm's runtime words them;
 * a code that is not a hipError_t gives "hipErrorUnknown" / "unknown error",
 * as there).
 *
 * Last error: as ROCm 6.2 and later (clr's HIP_RETURN), a call that fails
 * with anything but hipErrorNotReady becomes the thread's last error;
 * hipGetLastError returns it and resets it to hipSuccess,
 * hipPeekAtLastError returns it only.  (HIP 5.2.3 recorded every result,
 * successes included.)
 */
#include "fakehip.h"

static _Thread_local hipError_t tls_last = hipSuccess;

hipError_t fh_ret(hipError_t e)
{
    if (e != hipSuccess && e != hipErrorNotReady)
        tls_last = e;
    return e;
}

hipError_t fh_from_cu(CUresult r)
{
    switch (r) {
    case CUDA_SUCCESS: return hipSuccess;
    case CUDA_ERROR_INVALID_VALUE: return hipErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY: return hipErrorOutOfMemory;
    case CUDA_ERROR_NOT_INITIALIZED: return hipErrorNotInitialized;
    case CUDA_ERROR_DEINITIALIZED: return hipErrorDeinitialized;
    case CUDA_ERROR_NO_DEVICE: return hipErrorNoDevice;
    case CUDA_ERROR_INVALID_DEVICE: return hipErrorInvalidDevice;
    case CUDA_ERROR_INVALID_IMAGE: return hipErrorInvalidImage;
    case CUDA_ERROR_INVALID_CONTEXT: return hipErrorInvalidContext;
    case CUDA_ERROR_CONTEXT_IS_DESTROYED: return hipErrorContextIsDestroyed;
    case CUDA_ERROR_FILE_NOT_FOUND: return hipErrorFileNotFound;
    case CUDA_ERROR_OPERATING_SYSTEM: return hipErrorOperatingSystem;
    case CUDA_ERROR_INVALID_HANDLE: return hipErrorInvalidHandle;
    case CUDA_ERROR_ILLEGAL_STATE: return hipErrorIllegalState;
    case CUDA_ERROR_NOT_FOUND: return hipErrorNotFound;
    case CUDA_ERROR_NOT_READY: return hipErrorNotReady;
    case CUDA_ERROR_ILLEGAL_ADDRESS: return hipErrorIllegalAddress;
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: return hipErrorLaunchOutOfResources;
    case CUDA_ERROR_LAUNCH_FAILED: return hipErrorLaunchFailure;
    case CUDA_ERROR_NOT_SUPPORTED: return hipErrorNotSupported;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: return hipErrorStreamCaptureUnsupported;
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: return hipErrorStreamCaptureInvalidated;
    case CUDA_ERROR_STREAM_CAPTURE_MERGE: return hipErrorStreamCaptureMerge;
    case CUDA_ERROR_STREAM_CAPTURE_UNMATCHED: return hipErrorStreamCaptureUnmatched;
    case CUDA_ERROR_STREAM_CAPTURE_UNJOINED: return hipErrorStreamCaptureUnjoined;
    case CUDA_ERROR_STREAM_CAPTURE_ISOLATION: return hipErrorStreamCaptureIsolation;
    case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: return hipErrorStreamCaptureImplicit;
    case CUDA_ERROR_CAPTURED_EVENT: return hipErrorCapturedEvent;
    case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: return hipErrorStreamCaptureWrongThread;
    /* A faulted MPS server refusing a client: the device cannot be used. */
    case CUDA_ERROR_DEVICE_UNAVAILABLE: return hipErrorInvalidDevice;
    default: return hipErrorUnknown;
    }
}

struct fh_error_desc {
    hipError_t code;
    const char *name;
    const char *text;
};

#define FH_DESC(name, value, text) {name, #name, text},
static const struct fh_error_desc descs[] = {FH_ERRORS(FH_DESC)};
#undef FH_DESC

static const struct fh_error_desc *find(hipError_t e)
{
    for (size_t i = 0; i < sizeof descs / sizeof descs[0]; i++)
        if (descs[i].code == e)
            return &descs[i];
    return NULL;
}

FH_API hipError_t hipGetLastError(void)
{
    FC_ENTRY();
    hipError_t e = tls_last;
    tls_last = hipSuccess;
    return e;
}

FH_API hipError_t hipPeekAtLastError(void)
{
    FC_ENTRY();
    return tls_last;
}

FH_API const char *hipGetErrorName(hipError_t hip_error)
{
    FC_ENTRY();
    const struct fh_error_desc *d = find(hip_error);
    return d ? d->name : "hipErrorUnknown";
}

FH_API const char *hipGetErrorString(hipError_t hipError)
{
    FC_ENTRY();
    const struct fh_error_desc *d = find(hipError);
    return d ? d->text : "unknown error";
}
