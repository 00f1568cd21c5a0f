/*
 * hip_api.h — the subset of the HIP runtime API the fake libamdhip64
 * implements: types, enum values, flags and prototypes as ROCm declares them.
 *
 * Taken from HIP 5.2.3 (Debian's libamdhip64-dev 5.2.3-8:
 * hip/hip_runtime_api.h, hip/driver_types.h, hip/hip_ext.h), except
 * hipDeviceProp_tR0600 and hipGetDevicePropertiesR0600, which ROCm 6.0
 * added (the ROCm 6 hip_runtime_api.h).  Only what the fake implements is
 * declared, so the build needs no ROCm.  Built with FAKEHIP_REAL_HEADERS
 * (`make -C tests/fakehip check-headers`, run by every build where
 * $(HIP_INCLUDE)/hip/hip_runtime_api.h exists), this file includes ROCm's
 * header instead and checks every value below against it, and every source
 * is compiled against the real prototypes.
 *
 * The X-macro lists (FH_ERRORS, FH_ATTRS) give each name its value once: in
 * the enum here, in the checks against the real header, in the name tables.
 */
#ifndef FAKEHIP_HIP_API_H
#define FAKEHIP_HIP_API_H

#include <stddef.h>
#include <stdint.h>

/* hipError_t: every code of HIP 5.2.3, with hipGetErrorName's name (the
 * enumerator) and hipGetErrorString's text as ROCm's runtime returns them
 * (clr hipamd/src/hip_error.cpp). */
#define FH_ERRORS(X)                                                                              \
    X(hipSuccess, 0, "no error")                                                                  \
    X(hipErrorInvalidValue, 1, "invalid argument")                                                \
    X(hipErrorOutOfMemory, 2, "out of memory")                                                    \
    X(hipErrorNotInitialized, 3, "initialization error")                                          \
    X(hipErrorDeinitialized, 4, "driver shutting down")                                           \
    X(hipErrorProfilerDisabled, 5, "profiler disabled while using external profiling tool")       \
    X(hipErrorProfilerNotInitialized, 6, "profiler is not initialized")                           \
    X(hipErrorProfilerAlreadyStarted, 7, "profiler already started")                              \
    X(hipErrorProfilerAlreadyStopped, 8, "profiler already stopped")                              \
    X(hipErrorInvalidConfiguration, 9, "invalid configuration argument")                          \
    X(hipErrorInvalidPitchValue, 12, "invalid pitch argument")                                    \
    X(hipErrorInvalidSymbol, 13, "invalid device symbol")                                         \
    X(hipErrorInvalidDevicePointer, 17, "invalid device pointer")                                 \
    X(hipErrorInvalidMemcpyDirection, 21, "invalid copy direction for memcpy")                    \
    X(hipErrorInsufficientDriver, 35, "driver version is insufficient for runtime version")       \
    X(hipErrorMissingConfiguration, 52, "__global__ function call is not configured")             \
    X(hipErrorPriorLaunchFailure, 53, "unspecified launch failure in prior launch")               \
    X(hipErrorInvalidDeviceFunction, 98, "invalid device function")                               \
    X(hipErrorNoDevice, 100, "no ROCm-capable device is detected")                                \
    X(hipErrorInvalidDevice, 101, "invalid device ordinal")                                       \
    X(hipErrorInvalidImage, 200, "device kernel image is invalid")                                \
    X(hipErrorInvalidContext, 201, "invalid device context")                                      \
    X(hipErrorContextAlreadyCurrent, 202, "context is already current context")                   \
    X(hipErrorMapFailed, 205, "mapping of buffer object failed")                                  \
    X(hipErrorUnmapFailed, 206, "unmapping of buffer object failed")                              \
    X(hipErrorArrayIsMapped, 207, "array is mapped")                                              \
    X(hipErrorAlreadyMapped, 208, "resource already mapped")                                      \
    X(hipErrorNoBinaryForGpu, 209, "no kernel image is available for execution on the device")    \
    X(hipErrorAlreadyAcquired, 210, "resource already acquired")                                  \
    X(hipErrorNotMapped, 211, "resource not mapped")                                              \
    X(hipErrorNotMappedAsArray, 212, "resource not mapped as array")                              \
    X(hipErrorNotMappedAsPointer, 213, "resource not mapped as pointer")                          \
    X(hipErrorECCNotCorrectable, 214, "uncorrectable ECC error encountered")                      \
    X(hipErrorUnsupportedLimit, 215, "limit is not supported on this architecture")               \
    X(hipErrorContextAlreadyInUse, 216,                                                           \
      "exclusive-thread device already in use by a different thread")                             \
    X(hipErrorPeerAccessUnsupported, 217,                                                         \
      "peer access is not supported between these two devices")                                   \
    X(hipErrorInvalidKernelFile, 218, "invalid kernel file")                                      \
    X(hipErrorInvalidGraphicsContext, 219, "invalid OpenGL or DirectX context")                   \
    X(hipErrorInvalidSource, 300, "device kernel image is invalid")                               \
    X(hipErrorFileNotFound, 301, "file not found")                                                \
    X(hipErrorSharedObjectSymbolNotFound, 302, "shared object symbol not found")                  \
    X(hipErrorSharedObjectInitFailed, 303, "shared object initialization failed")                 \
    X(hipErrorOperatingSystem, 304, "OS call failed or operation not supported on this OS")       \
    X(hipErrorInvalidHandle, 400, "invalid resource handle")                                      \
    X(hipErrorIllegalState, 401, "the operation cannot be performed in the present state")        \
    X(hipErrorNotFound, 500, "named symbol not found")                                            \
    X(hipErrorNotReady, 600, "device not ready")                                                  \
    X(hipErrorIllegalAddress, 700, "an illegal memory access was encountered")                    \
    X(hipErrorLaunchOutOfResources, 701, "too many resources requested for launch")               \
    X(hipErrorLaunchTimeOut, 702, "the launch timed out and was terminated")                      \
    X(hipErrorPeerAccessAlreadyEnabled, 704, "peer access is already enabled")                    \
    X(hipErrorPeerAccessNotEnabled, 705, "peer access has not been enabled")                      \
    X(hipErrorSetOnActiveProcess, 708, "cannot set while device is active in this process")       \
    X(hipErrorContextIsDestroyed, 709, "context is destroyed")                                    \
    X(hipErrorAssert, 710, "device-side assert triggered")                                        \
    X(hipErrorHostMemoryAlreadyRegistered, 712,                                                   \
      "part or all of the requested memory range is already mapped")                              \
    X(hipErrorHostMemoryNotRegistered, 713,                                                       \
      "pointer does not correspond to a registered memory region")                                \
    X(hipErrorLaunchFailure, 719, "unspecified launch failure")                                   \
    X(hipErrorCooperativeLaunchTooLarge, 720, "too many blocks in cooperative launch")            \
    X(hipErrorNotSupported, 801, "operation not supported")                                       \
    X(hipErrorStreamCaptureUnsupported, 900, "operation not permitted when stream is capturing")  \
    X(hipErrorStreamCaptureInvalidated, 901,                                                      \
      "operation failed due to a previous error during capture")                                  \
    X(hipErrorStreamCaptureMerge, 902,                                                            \
      "operation would result in a merge of separate capture sequences")                          \
    X(hipErrorStreamCaptureUnmatched, 903, "capture was not ended in the same stream as it began")\
    X(hipErrorStreamCaptureUnjoined, 904, "capturing stream has unjoined work")                   \
    X(hipErrorStreamCaptureIsolation, 905,                                                        \
      "dependency created on uncaptured work in another stream")                                  \
    X(hipErrorStreamCaptureImplicit, 906,                                                         \
      "operation would make the legacy stream depend on a capturing blocking stream")             \
    X(hipErrorCapturedEvent, 907,                                                                 \
      "operation not permitted on an event last recorded in a capturing stream")                  \
    X(hipErrorStreamCaptureWrongThread, 908,                                                      \
      "attempt to terminate a thread-local capture sequence from another thread")                 \
    X(hipErrorGraphExecUpdateFailure, 910,                                                        \
      "the graph update was not performed because it included changes which violated "            \
      "constraints specific to instantiated graph update")                                        \
    X(hipErrorUnknown, 999, "unknown error")                                                      \
    X(hipErrorRuntimeMemory, 1052, "runtime memory call returned error")                          \
    X(hipErrorRuntimeOther, 1053, "runtime call other than memory returned error")

/* hipDeviceAttribute_t values the fake answers (the others: hipErrorInvalidValue). */
#define FH_ATTRS(X)                                                                               \
    X(hipDeviceAttributeEccEnabled, 0)                                                            \
    X(hipDeviceAttributeAsyncEngineCount, 2)                                                      \
    X(hipDeviceAttributeCanMapHostMemory, 3)                                                      \
    X(hipDeviceAttributeClockRate, 5)                                                             \
    X(hipDeviceAttributeComputeMode, 6)                                                           \
    X(hipDeviceAttributeConcurrentKernels, 8)                                                     \
    X(hipDeviceAttributeCooperativeLaunch, 10)                                                    \
    X(hipDeviceAttributeIntegrated, 16)                                                           \
    X(hipDeviceAttributeL2CacheSize, 19)                                                          \
    X(hipDeviceAttributeComputeCapabilityMajor, 23)                                               \
    X(hipDeviceAttributeManagedMemory, 24)                                                        \
    X(hipDeviceAttributeMaxBlockDimX, 26)                                                         \
    X(hipDeviceAttributeMaxBlockDimY, 27)                                                         \
    X(hipDeviceAttributeMaxBlockDimZ, 28)                                                         \
    X(hipDeviceAttributeMaxGridDimX, 29)                                                          \
    X(hipDeviceAttributeMaxGridDimY, 30)                                                          \
    X(hipDeviceAttributeMaxGridDimZ, 31)                                                          \
    X(hipDeviceAttributeMaxThreadsPerBlock, 56)                                                   \
    X(hipDeviceAttributeMaxThreadsPerMultiProcessor, 57)                                          \
    X(hipDeviceAttributeMemoryBusWidth, 59)                                                       \
    X(hipDeviceAttributeMemoryClockRate, 60)                                                      \
    X(hipDeviceAttributeComputeCapabilityMinor, 61)                                               \
    X(hipDeviceAttributeMultiprocessorCount, 63)                                                  \
    X(hipDeviceAttributePciBusId, 67)                                                             \
    X(hipDeviceAttributePciDeviceId, 68)                                                          \
    X(hipDeviceAttributePciDomainID, 69)                                                          \
    X(hipDeviceAttributeMaxRegistersPerBlock, 71)                                                 \
    X(hipDeviceAttributeMaxSharedMemoryPerBlock, 74)                                              \
    X(hipDeviceAttributeStreamPrioritiesSupported, 78)                                            \
    X(hipDeviceAttributeTotalConstantMemory, 83)                                                  \
    X(hipDeviceAttributeUnifiedAddressing, 85)                                                    \
    X(hipDeviceAttributeWarpSize, 87)                                                             \
    X(hipDeviceAttributeMemoryPoolsSupported, 88)                                                 \
    X(hipDeviceAttributeClockInstructionRate, 10000)                                              \
    X(hipDeviceAttributeMaxSharedMemoryPerMultiprocessor, 10002)                                  \
    X(hipDeviceAttributeIsLargeBar, 10011)                                                        \
    X(hipDeviceAttributePhysicalMultiProcessorCount, 10015)

/* Flags and special handles (hip_runtime_api.h), checked like the enums. */
#define FH_CONSTANTS(X)                                                                           \
    X(hipStreamDefault, 0x00)                                                                     \
    X(hipStreamNonBlocking, 0x01)                                                                 \
    X(hipEventDefault, 0x0)                                                                       \
    X(hipEventBlockingSync, 0x1)                                                                  \
    X(hipEventDisableTiming, 0x2)                                                                 \
    X(hipEventInterprocess, 0x4)                                                                  \
    X(hipEventReleaseToDevice, 0x40000000)                                                        \
    X(hipEventReleaseToSystem, 0x80000000)                                                        \
    X(hipHostMallocDefault, 0x0)                                                                  \
    X(hipHostMallocPortable, 0x1)                                                                 \
    X(hipHostMallocMapped, 0x2)                                                                   \
    X(hipHostMallocWriteCombined, 0x4)                                                            \
    X(hipHostMallocNumaUser, 0x20000000)                                                          \
    X(hipHostMallocCoherent, 0x40000000)                                                          \
    X(hipHostMallocNonCoherent, 0x80000000)                                                       \
    X(hipMemcpyHostToHost, 0)                                                                     \
    X(hipMemcpyHostToDevice, 1)                                                                   \
    X(hipMemcpyDeviceToHost, 2)                                                                   \
    X(hipMemcpyDeviceToDevice, 3)                                                                 \
    X(hipMemcpyDefault, 4)                                                                        \
    X(hipStreamCaptureModeGlobal, 0)                                                              \
    X(hipStreamCaptureModeThreadLocal, 1)                                                         \
    X(hipStreamCaptureModeRelaxed, 2)                                                             \
    X(hipStreamCaptureStatusNone, 0)                                                              \
    X(hipStreamCaptureStatusActive, 1)                                                            \
    X(hipStreamCaptureStatusInvalidated, 2)                                                       \
    X(hipArrayDefault, 0x00)                                                                      \
    X(hipArrayLayered, 0x01)                                                                      \
    X(hipArraySurfaceLoadStore, 0x02)                                                             \
    X(hipArrayCubemap, 0x04)                                                                      \
    X(hipArrayTextureGather, 0x08)                                                                \
    X(hipChannelFormatKindSigned, 0)                                                              \
    X(hipChannelFormatKindUnsigned, 1)                                                            \
    X(hipChannelFormatKindFloat, 2)                                                               \
    X(hipChannelFormatKindNone, 3)                                                                \
    X(HIP_AD_FORMAT_UNSIGNED_INT8, 0x01)                                                          \
    X(HIP_AD_FORMAT_UNSIGNED_INT16, 0x02)                                                         \
    X(HIP_AD_FORMAT_UNSIGNED_INT32, 0x03)                                                         \
    X(HIP_AD_FORMAT_SIGNED_INT8, 0x08)                                                            \
    X(HIP_AD_FORMAT_SIGNED_INT16, 0x09)                                                           \
    X(HIP_AD_FORMAT_SIGNED_INT32, 0x0a)                                                           \
    X(HIP_AD_FORMAT_HALF, 0x10)                                                                   \
    X(HIP_AD_FORMAT_FLOAT, 0x20)                                                                  \
    X(hipMemLocationTypeInvalid, 0)                                                               \
    X(hipMemLocationTypeDevice, 1)                                                                \
    X(hipMemAllocationTypeInvalid, 0)                                                             \
    X(hipMemAllocationTypePinned, 1)                                                              \
    X(hipMemHandleTypeNone, 0)

/* Sizes and offsets of the structures the memory calls take, on LP64 (the
 * HIP 5.2.3 layouts; asserted in both modes, against the real header there):
 * tests/fakehip/hipgpu.py builds them with ctypes. */
#define FH_STRUCT_LAYOUTS(X)                                                                      \
    X(hipExtent, 24, depth, 16)                                                                   \
    X(hipPitchedPtr, 32, ysize, 24)                                                               \
    X(hipChannelFormatDesc, 20, f, 16)                                                            \
    X(HIP_ARRAY_DESCRIPTOR, 24, NumChannels, 20)                                                  \
    X(HIP_ARRAY3D_DESCRIPTOR, 40, Flags, 32)                                                      \
    X(hipMemLocation, 8, id, 4)                                                                   \
    X(hipMemAllocationProp, 32, location, 4)

/* Size of the HIP 5.2.3 hipDeviceProp_t and of ROCm 6's hipDeviceProp_tR0600
 * on LP64 (asserted for both in own mode, the first against the real header). */
#define FH_PROP_R0000_SIZE 792
#define FH_PROP_R0600_SIZE 1472

#ifdef FAKEHIP_REAL_HEADERS

#include <hip/hip_runtime_api.h>

#define FH_CHECK_VALUE(name, value, ...)                                                          \
    _Static_assert((long long)(name) == (long long)(value), #name " differs from HIP's header");
FH_ERRORS(FH_CHECK_VALUE)
FH_ATTRS(FH_CHECK_VALUE)
FH_CONSTANTS(FH_CHECK_VALUE)
_Static_assert((uintptr_t)hipStreamPerThread == 2, "hipStreamPerThread");
_Static_assert((uintptr_t)HIP_LAUNCH_PARAM_BUFFER_POINTER == 1, "HIP_LAUNCH_PARAM_BUFFER_POINTER");
_Static_assert((uintptr_t)HIP_LAUNCH_PARAM_BUFFER_SIZE == 2, "HIP_LAUNCH_PARAM_BUFFER_SIZE");
_Static_assert((uintptr_t)HIP_LAUNCH_PARAM_END == 3, "HIP_LAUNCH_PARAM_END");
_Static_assert(sizeof(hipDeviceProp_t) == FH_PROP_R0000_SIZE, "hipDeviceProp_t size");
#undef FH_CHECK_VALUE

/* hip_ext.h is C++ only (default arguments): its declaration, without them. */
hipError_t hipExtModuleLaunchKernel(hipFunction_t f, uint32_t globalWorkSizeX,
                                    uint32_t globalWorkSizeY, uint32_t globalWorkSizeZ,
                                    uint32_t localWorkSizeX, uint32_t localWorkSizeY,
                                    uint32_t localWorkSizeZ, size_t sharedMemBytes,
                                    hipStream_t hStream, void **kernelParams, void **extra,
                                    hipEvent_t startEvent, hipEvent_t stopEvent, uint32_t flags);

#else /* the declarations of HIP 5.2.3 */

#define FH_ENUM_ENTRY(name, value, ...) name = value,
typedef enum hipError_t { FH_ERRORS(FH_ENUM_ENTRY) hipErrorTbd } hipError_t;
typedef enum hipDeviceAttribute_t { FH_ATTRS(FH_ENUM_ENTRY) } hipDeviceAttribute_t;
#undef FH_ENUM_ENTRY

typedef enum hipMemcpyKind {
    hipMemcpyHostToHost = 0,
    hipMemcpyHostToDevice = 1,
    hipMemcpyDeviceToHost = 2,
    hipMemcpyDeviceToDevice = 3,
    hipMemcpyDefault = 4
} hipMemcpyKind;

typedef enum hipStreamCaptureMode {
    hipStreamCaptureModeGlobal = 0,
    hipStreamCaptureModeThreadLocal,
    hipStreamCaptureModeRelaxed
} hipStreamCaptureMode;

typedef enum hipStreamCaptureStatus {
    hipStreamCaptureStatusNone = 0,
    hipStreamCaptureStatusActive,
    hipStreamCaptureStatusInvalidated
} hipStreamCaptureStatus;

#define hipStreamDefault 0x00
#define hipStreamNonBlocking 0x01
#define hipEventDefault 0x0
#define hipEventBlockingSync 0x1
#define hipEventDisableTiming 0x2
#define hipEventInterprocess 0x4
#define hipEventReleaseToDevice 0x40000000
#define hipEventReleaseToSystem 0x80000000
#define hipHostMallocDefault 0x0
#define hipHostMallocPortable 0x1
#define hipHostMallocMapped 0x2
#define hipHostMallocWriteCombined 0x4
#define hipHostMallocNumaUser 0x20000000
#define hipHostMallocCoherent 0x40000000
#define hipHostMallocNonCoherent 0x80000000
#define HIP_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define HIP_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)
#define HIP_LAUNCH_PARAM_END ((void *)0x03)

typedef int hipDevice_t;
typedef void *hipDeviceptr_t;
typedef struct ihipStream_t *hipStream_t;
typedef struct ihipEvent_t *hipEvent_t;
typedef struct ihipModule_t *hipModule_t;
typedef struct ihipModuleSymbol_t *hipFunction_t;
typedef struct ihipGraph *hipGraph_t;
typedef struct hipGraphNode *hipGraphNode_t;
typedef struct hipGraphExec *hipGraphExec_t;
typedef void (*hipHostFn_t)(void *userData);
typedef void (*hipStreamCallback_t)(hipStream_t stream, hipError_t status, void *userData);

#define hipStreamPerThread ((hipStream_t)2)
#define hipArrayDefault 0x00
#define hipArrayLayered 0x01
#define hipArraySurfaceLoadStore 0x02
#define hipArrayCubemap 0x04
#define hipArrayTextureGather 0x08

typedef struct hipExtent {
    size_t width; /* in elements for arrays, in bytes for linear memory */
    size_t height;
    size_t depth;
} hipExtent;

typedef struct hipPitchedPtr {
    void *ptr;
    size_t pitch;
    size_t xsize;
    size_t ysize;
} hipPitchedPtr;

typedef enum hipChannelFormatKind {
    hipChannelFormatKindSigned = 0,
    hipChannelFormatKindUnsigned = 1,
    hipChannelFormatKindFloat = 2,
    hipChannelFormatKindNone = 3
} hipChannelFormatKind;

typedef struct hipChannelFormatDesc {
    int x;
    int y;
    int z;
    int w;
    enum hipChannelFormatKind f;
} hipChannelFormatDesc;

typedef enum hipArray_Format {
    HIP_AD_FORMAT_UNSIGNED_INT8 = 0x01,
    HIP_AD_FORMAT_UNSIGNED_INT16 = 0x02,
    HIP_AD_FORMAT_UNSIGNED_INT32 = 0x03,
    HIP_AD_FORMAT_SIGNED_INT8 = 0x08,
    HIP_AD_FORMAT_SIGNED_INT16 = 0x09,
    HIP_AD_FORMAT_SIGNED_INT32 = 0x0a,
    HIP_AD_FORMAT_HALF = 0x10,
    HIP_AD_FORMAT_FLOAT = 0x20
} hipArray_Format;

typedef struct HIP_ARRAY_DESCRIPTOR {
    size_t Width;
    size_t Height;
    enum hipArray_Format Format;
    unsigned int NumChannels;
} HIP_ARRAY_DESCRIPTOR;

typedef struct HIP_ARRAY3D_DESCRIPTOR {
    size_t Width;
    size_t Height;
    size_t Depth;
    enum hipArray_Format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} HIP_ARRAY3D_DESCRIPTOR;

/* HIP declares the structure; the fake's arrays are its own (hip_memory.c)
 * and never read as one. */
typedef struct hipArray hipArray;

typedef enum hipMemLocationType {
    hipMemLocationTypeInvalid = 0,
    hipMemLocationTypeDevice = 1
} hipMemLocationType;

typedef struct hipMemLocation {
    hipMemLocationType type;
    int id;
} hipMemLocation;

typedef enum hipMemAllocationType {
    hipMemAllocationTypeInvalid = 0x0,
    hipMemAllocationTypePinned = 0x1,
    hipMemAllocationTypeMax = 0x7FFFFFFF
} hipMemAllocationType;

typedef enum hipMemAllocationHandleType {
    hipMemHandleTypeNone = 0x0,
    hipMemHandleTypePosixFileDescriptor = 0x1,
    hipMemHandleTypeWin32 = 0x2,
    hipMemHandleTypeWin32Kmt = 0x4
} hipMemAllocationHandleType;

/* HIP 5.2.3's layout (ROCm 6 reordered it: the fake is HIP 5.2.3's). */
typedef struct hipMemAllocationProp {
    unsigned char compressionType;
    hipMemLocation location;
    hipMemAllocationHandleType requestedHandleType;
    hipMemAllocationType type;
    unsigned short usage;
    void *win32HandleMetaData;
} hipMemAllocationProp;

typedef struct ihipMemGenericAllocationHandle *hipMemGenericAllocationHandle_t;

typedef struct dim3 {
    uint32_t x;
    uint32_t y;
    uint32_t z;
} dim3;

typedef struct {
    unsigned hasGlobalInt32Atomics : 1;
    unsigned hasGlobalFloatAtomicExch : 1;
    unsigned hasSharedInt32Atomics : 1;
    unsigned hasSharedFloatAtomicExch : 1;
    unsigned hasFloatAtomicAdd : 1;
    unsigned hasGlobalInt64Atomics : 1;
    unsigned hasSharedInt64Atomics : 1;
    unsigned hasDoubles : 1;
    unsigned hasWarpVote : 1;
    unsigned hasWarpBallot : 1;
    unsigned hasWarpShuffle : 1;
    unsigned hasFunnelShift : 1;
    unsigned hasThreadFenceSystem : 1;
    unsigned hasSyncThreadsExt : 1;
    unsigned hasSurfaceFuncs : 1;
    unsigned has3dGrid : 1;
    unsigned hasDynamicParallelism : 1;
} hipDeviceArch_t;

typedef struct hipUUID_t {
    char bytes[16];
} hipUUID;

/* HIP 5.2.3's hipDeviceProp_t (ROCm 6 keeps this layout as hipDeviceProp_tR0000). */
typedef struct hipDeviceProp_t {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int regsPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int clockRate;
    int memoryClockRate;
    int memoryBusWidth;
    size_t totalConstMem;
    int major;
    int minor;
    int multiProcessorCount;
    int l2CacheSize;
    int maxThreadsPerMultiProcessor;
    int computeMode;
    int clockInstructionRate;
    hipDeviceArch_t arch;
    int concurrentKernels;
    int pciDomainID;
    int pciBusID;
    int pciDeviceID;
    size_t maxSharedMemoryPerMultiProcessor;
    int isMultiGpuBoard;
    int canMapHostMemory;
    int gcnArch;
    char gcnArchName[256];
    int integrated;
    int cooperativeLaunch;
    int cooperativeMultiDeviceLaunch;
    int maxTexture1DLinear;
    int maxTexture1D;
    int maxTexture2D[2];
    int maxTexture3D[3];
    unsigned int *hdpMemFlushCntl;
    unsigned int *hdpRegFlushCntl;
    size_t memPitch;
    size_t textureAlignment;
    size_t texturePitchAlignment;
    int kernelExecTimeoutEnabled;
    int ECCEnabled;
    int tccDriver;
    int cooperativeMultiDeviceUnmatchedFunc;
    int cooperativeMultiDeviceUnmatchedGridDim;
    int cooperativeMultiDeviceUnmatchedBlockDim;
    int cooperativeMultiDeviceUnmatchedSharedMem;
    int isLargeBar;
    int asicRevision;
    int managedMemory;
    int directManagedMemAccessFromHost;
    int concurrentManagedAccess;
    int pageableMemoryAccess;
    int pageableMemoryAccessUsesHostPageTables;
} hipDeviceProp_t;
_Static_assert(sizeof(hipDeviceProp_t) == FH_PROP_R0000_SIZE, "hipDeviceProp_t size");

hipError_t hipInit(unsigned int flags);
hipError_t hipDriverGetVersion(int *driverVersion);
hipError_t hipRuntimeGetVersion(int *runtimeVersion);
hipError_t hipGetDeviceCount(int *count);
hipError_t hipGetDevice(int *deviceId);
hipError_t hipSetDevice(int deviceId);
hipError_t hipDeviceGet(hipDevice_t *device, int ordinal);
hipError_t hipDeviceGetName(char *name, int len, hipDevice_t device);
hipError_t hipDeviceTotalMem(size_t *bytes, hipDevice_t device);
hipError_t hipDeviceGetUuid(hipUUID *uuid, hipDevice_t device);
hipError_t hipDeviceGetPCIBusId(char *pciBusId, int len, int device);
hipError_t hipGetDeviceProperties(hipDeviceProp_t *prop, int deviceId);
hipError_t hipDeviceGetAttribute(int *pi, hipDeviceAttribute_t attr, int deviceId);
hipError_t hipDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority);
hipError_t hipDeviceSynchronize(void);
hipError_t hipMemGetInfo(size_t *free, size_t *total);
hipError_t hipMalloc(void **ptr, size_t size);
hipError_t hipFree(void *ptr);
hipError_t hipMallocAsync(void **dev_ptr, size_t size, hipStream_t stream);
hipError_t hipFreeAsync(void *dev_ptr, hipStream_t stream);
hipError_t hipMalloc3D(hipPitchedPtr *pitchedDevPtr, hipExtent extent);
hipError_t hipMallocArray(hipArray **array, const hipChannelFormatDesc *desc, size_t width,
                          size_t height, unsigned int flags);
hipError_t hipMalloc3DArray(hipArray **array, const struct hipChannelFormatDesc *desc,
                            struct hipExtent extent, unsigned int flags);
hipError_t hipArrayCreate(hipArray **pHandle, const HIP_ARRAY_DESCRIPTOR *pAllocateArray);
hipError_t hipArray3DCreate(hipArray **array, const HIP_ARRAY3D_DESCRIPTOR *pAllocateArray);
hipError_t hipFreeArray(hipArray *array);
hipError_t hipArrayDestroy(hipArray *array);
hipError_t hipMemCreate(hipMemGenericAllocationHandle_t *handle, size_t size,
                        const hipMemAllocationProp *prop, unsigned long long flags);
hipError_t hipMemRelease(hipMemGenericAllocationHandle_t handle);
hipError_t hipHostMalloc(void **ptr, size_t size, unsigned int flags);
hipError_t hipHostFree(void *ptr);
hipError_t hipMemcpy(void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind);
hipError_t hipMemcpyAsync(void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind,
                          hipStream_t stream);
hipError_t hipMemcpyHtoD(hipDeviceptr_t dst, void *src, size_t sizeBytes);
hipError_t hipMemcpyDtoH(void *dst, hipDeviceptr_t src, size_t sizeBytes);
hipError_t hipMemcpyDtoD(hipDeviceptr_t dst, hipDeviceptr_t src, size_t sizeBytes);
hipError_t hipMemcpyHtoDAsync(hipDeviceptr_t dst, void *src, size_t sizeBytes, hipStream_t stream);
hipError_t hipMemcpyDtoHAsync(void *dst, hipDeviceptr_t src, size_t sizeBytes, hipStream_t stream);
hipError_t hipMemcpyDtoDAsync(hipDeviceptr_t dst, hipDeviceptr_t src, size_t sizeBytes,
                              hipStream_t stream);
hipError_t hipMemset(void *dst, int value, size_t sizeBytes);
hipError_t hipMemsetAsync(void *dst, int value, size_t sizeBytes, hipStream_t stream);
hipError_t hipMemsetD8(hipDeviceptr_t dest, unsigned char value, size_t count);
hipError_t hipMemsetD8Async(hipDeviceptr_t dest, unsigned char value, size_t count,
                            hipStream_t stream);
hipError_t hipMemsetD32(hipDeviceptr_t dest, int value, size_t count);
hipError_t hipMemsetD32Async(hipDeviceptr_t dst, int value, size_t count, hipStream_t stream);
hipError_t hipStreamCreate(hipStream_t *stream);
hipError_t hipStreamCreateWithFlags(hipStream_t *stream, unsigned int flags);
hipError_t hipStreamCreateWithPriority(hipStream_t *stream, unsigned int flags, int priority);
hipError_t hipStreamDestroy(hipStream_t stream);
hipError_t hipStreamQuery(hipStream_t stream);
hipError_t hipStreamSynchronize(hipStream_t stream);
hipError_t hipStreamWaitEvent(hipStream_t stream, hipEvent_t event, unsigned int flags);
hipError_t hipStreamGetFlags(hipStream_t stream, unsigned int *flags);
hipError_t hipStreamGetPriority(hipStream_t stream, int *priority);
hipError_t hipStreamAddCallback(hipStream_t stream, hipStreamCallback_t callback, void *userData,
                                unsigned int flags);
hipError_t hipLaunchHostFunc(hipStream_t stream, hipHostFn_t fn, void *userData);
hipError_t hipEventCreateWithFlags(hipEvent_t *event, unsigned flags);
hipError_t hipEventCreate(hipEvent_t *event);
hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream);
hipError_t hipEventDestroy(hipEvent_t event);
hipError_t hipEventSynchronize(hipEvent_t event);
hipError_t hipEventElapsedTime(float *ms, hipEvent_t start, hipEvent_t stop);
hipError_t hipEventQuery(hipEvent_t event);
hipError_t hipGetLastError(void);
hipError_t hipPeekAtLastError(void);
const char *hipGetErrorName(hipError_t hip_error);
const char *hipGetErrorString(hipError_t hipError);
hipError_t hipModuleLoad(hipModule_t *module, const char *fname);
hipError_t hipModuleUnload(hipModule_t module);
hipError_t hipModuleGetFunction(hipFunction_t *function, hipModule_t module, const char *kname);
hipError_t hipModuleLoadData(hipModule_t *module, const void *image);
hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int gridDimX, unsigned int gridDimY,
                                 unsigned int gridDimZ, unsigned int blockDimX,
                                 unsigned int blockDimY, unsigned int blockDimZ,
                                 unsigned int sharedMemBytes, hipStream_t stream,
                                 void **kernelParams, void **extra);
hipError_t hipLaunchKernel(const void *function_address, dim3 numBlocks, dim3 dimBlocks,
                           void **args, size_t sharedMemBytes, hipStream_t stream);
hipError_t hipExtModuleLaunchKernel(hipFunction_t f, uint32_t globalWorkSizeX,
                                    uint32_t globalWorkSizeY, uint32_t globalWorkSizeZ,
                                    uint32_t localWorkSizeX, uint32_t localWorkSizeY,
                                    uint32_t localWorkSizeZ, size_t sharedMemBytes,
                                    hipStream_t hStream, void **kernelParams, void **extra,
                                    hipEvent_t startEvent, hipEvent_t stopEvent, uint32_t flags);
hipError_t hipStreamBeginCapture(hipStream_t stream, hipStreamCaptureMode mode);
hipError_t hipStreamEndCapture(hipStream_t stream, hipGraph_t *pGraph);
hipError_t hipStreamIsCapturing(hipStream_t stream, hipStreamCaptureStatus *pCaptureStatus);
hipError_t hipThreadExchangeStreamCaptureMode(hipStreamCaptureMode *mode);
hipError_t hipGraphDestroy(hipGraph_t graph);
hipError_t hipGraphInstantiate(hipGraphExec_t *pGraphExec, hipGraph_t graph,
                               hipGraphNode_t *pErrorNode, char *pLogBuffer, size_t bufferSize);
hipError_t hipGraphInstantiateWithFlags(hipGraphExec_t *pGraphExec, hipGraph_t graph,
                                        unsigned long long flags);
hipError_t hipGraphLaunch(hipGraphExec_t graphExec, hipStream_t stream);
hipError_t hipGraphExecDestroy(hipGraphExec_t graphExec);

#endif /* FAKEHIP_REAL_HEADERS */

#define FH_CHECK_LAYOUT(type, size, field, offset)                                                \
    _Static_assert(sizeof(type) == (size), #type " size");                                        \
    _Static_assert(offsetof(type, field) == (offset), #type "." #field " offset");
FH_STRUCT_LAYOUTS(FH_CHECK_LAYOUT)
#undef FH_CHECK_LAYOUT

/* ROCm 6.0's hipDeviceProp_t (hipDeviceProp_tR0600), which ROCm 6 programs
 * pass to hipGetDevicePropertiesR0600 (HIP 5.2.3 has neither). */
typedef struct hipDeviceProp_tR0600 {
    char name[256];
    hipUUID uuid;
    char luid[8];
    unsigned int luidDeviceNodeMask;
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int regsPerBlock;
    int warpSize;
    size_t memPitch;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int clockRate;
    size_t totalConstMem;
    int major;
    int minor;
    size_t textureAlignment;
    size_t texturePitchAlignment;
    int deviceOverlap;
    int multiProcessorCount;
    int kernelExecTimeoutEnabled;
    int integrated;
    int canMapHostMemory;
    int computeMode;
    int maxTexture1D;
    int maxTexture1DMipmap;
    int maxTexture1DLinear;
    int maxTexture2D[2];
    int maxTexture2DMipmap[2];
    int maxTexture2DLinear[3];
    int maxTexture2DGather[2];
    int maxTexture3D[3];
    int maxTexture3DAlt[3];
    int maxTextureCubemap;
    int maxTexture1DLayered[2];
    int maxTexture2DLayered[3];
    int maxTextureCubemapLayered[2];
    int maxSurface1D;
    int maxSurface2D[2];
    int maxSurface3D[3];
    int maxSurface1DLayered[2];
    int maxSurface2DLayered[3];
    int maxSurfaceCubemap;
    int maxSurfaceCubemapLayered[2];
    size_t surfaceAlignment;
    int concurrentKernels;
    int ECCEnabled;
    int pciBusID;
    int pciDeviceID;
    int pciDomainID;
    int tccDriver;
    int asyncEngineCount;
    int unifiedAddressing;
    int memoryClockRate;
    int memoryBusWidth;
    int l2CacheSize;
    int persistingL2CacheMaxSize;
    int maxThreadsPerMultiProcessor;
    int streamPrioritiesSupported;
    int globalL1CacheSupported;
    int localL1CacheSupported;
    size_t sharedMemPerMultiprocessor;
    int regsPerMultiprocessor;
    int managedMemory;
    int isMultiGpuBoard;
    int multiGpuBoardGroupID;
    int hostNativeAtomicSupported;
    int singleToDoublePrecisionPerfRatio;
    int pageableMemoryAccess;
    int concurrentManagedAccess;
    int computePreemptionSupported;
    int canUseHostPointerForRegisteredMem;
    int cooperativeLaunch;
    int cooperativeMultiDeviceLaunch;
    size_t sharedMemPerBlockOptin;
    int pageableMemoryAccessUsesHostPageTables;
    int directManagedMemAccessFromHost;
    int maxBlocksPerMultiProcessor;
    int accessPolicyMaxWindowSize;
    size_t reservedSharedMemPerBlock;
    int hostRegisterSupported;
    int sparseHipArraySupported;
    int hostRegisterReadOnlySupported;
    int timelineSemaphoreInteropSupported;
    int memoryPoolsSupported;
    int gpuDirectRDMASupported;
    unsigned int gpuDirectRDMAFlushWritesOptions;
    int gpuDirectRDMAWritesOrdering;
    unsigned int memoryPoolSupportedHandleTypes;
    int deferredMappingHipArraySupported;
    int ipcEventSupported;
    int clusterLaunch;
    int unifiedFunctionPointers;
    int reserved[63];
    int hipReserved[32];
    char gcnArchName[256];
    size_t maxSharedMemoryPerMultiProcessor;
    int clockInstructionRate;
    hipDeviceArch_t arch;
    unsigned int *hdpMemFlushCntl;
    unsigned int *hdpRegFlushCntl;
    int cooperativeMultiDeviceUnmatchedFunc;
    int cooperativeMultiDeviceUnmatchedGridDim;
    int cooperativeMultiDeviceUnmatchedBlockDim;
    int cooperativeMultiDeviceUnmatchedSharedMem;
    int isLargeBar;
    int asicRevision;
} hipDeviceProp_tR0600;
_Static_assert(sizeof(hipDeviceProp_tR0600) == FH_PROP_R0600_SIZE, "hipDeviceProp_tR0600 size");

hipError_t hipGetDevicePropertiesR0600(hipDeviceProp_tR0600 *prop, int deviceId);

#endif /* FAKEHIP_HIP_API_H */
