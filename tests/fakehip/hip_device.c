/*
 * hip_device.c — what the simulated GPUs look like through HIP: names,
 * properties (both layouts: HIP 5's hipDeviceProp_t and ROCm 6's
 * hipDeviceProp_tR0600), attributes, UUIDs, PCI ids, memory.
 *
 * Every simulated GPU looks like an MI300X-class device (gfx942, 304 compute
 * units, wavefronts of 64, 4 MiB of L2) with the engine's
 * KREX_FAKE_MEM_BYTES of memory.  Its UUID is ROCm's form of the name krexd
 * gives the simulated AMD GPU (hipDeviceGetUuid's 16 bytes are the hex
 * digits of "GPU-6b72657866616b<NN>", krexd's fake_amd_uuid) and its PCI bus
 * the fake CUDA driver's, so both fakes find one simulated GPU at one
 * address.
 */
#include "fakehip.h"

#include <stdio.h>
#include <string.h>

/* ROCm's UUID bytes: the 16 hex digits of the name ROCr gives the GPU
 * ("GPU-<16 hex>", fc_uuid_rocr_text: krexd's name of simulated AMD GPU N),
 * as characters, no NUL. */
static void rocm_uuid(int phys, char out[16])
{
    char text[FC_UUID_TEXT];
    fc_uuid_rocr_text(phys, text);
    memcpy(out, text + 4, 16);
}

#define FH_NAME "AMD Instinct MI300X (fake)"
#define FH_ARCH_NAME "gfx942:sramecc+:xnack-"
#define FH_CUS 304
#define FH_L2_BYTES (4 * 1024 * 1024)
#define FH_CLOCK_KHZ 2100000
#define FH_MEM_CLOCK_KHZ 1300000
#define FH_BUS_WIDTH 8192
#define FH_LDS_BYTES 65536 /* shared memory per block and per CU */

static int pci_bus(int dev)
{
    return 0x18 + 0x10 * fc.phys[dev]; /* as the engine's CU_DEVICE_ATTRIBUTE_PCI_BUS_ID */
}

static hipError_t check_device(int dev)
{
    hipError_t e = fh_init();
    if (e == hipSuccess && (dev < 0 || dev >= fc.ndev))
        e = hipErrorInvalidDevice;
    return e;
}

/* The fields both layouts share, by name. */
#define FH_FILL_COMMON(p, dev)                                                                    \
    do {                                                                                          \
        snprintf((p)->name, sizeof (p)->name, "%s", FH_NAME);                                     \
        snprintf((p)->gcnArchName, sizeof (p)->gcnArchName, "%s", FH_ARCH_NAME);                  \
        (p)->totalGlobalMem = (size_t)fc.mem_bytes;                                               \
        (p)->sharedMemPerBlock = FH_LDS_BYTES;                                                    \
        (p)->regsPerBlock = 65536;                                                                \
        (p)->warpSize = 64;                                                                       \
        (p)->maxThreadsPerBlock = 1024;                                                           \
        (p)->maxThreadsDim[0] = (p)->maxThreadsDim[1] = (p)->maxThreadsDim[2] = 1024;             \
        (p)->maxGridSize[0] = (p)->maxGridSize[1] = (p)->maxGridSize[2] = 2147483647;             \
        (p)->clockRate = FH_CLOCK_KHZ;                                                            \
        (p)->memoryClockRate = FH_MEM_CLOCK_KHZ;                                                  \
        (p)->memoryBusWidth = FH_BUS_WIDTH;                                                       \
        (p)->totalConstMem = 2147483647;                                                          \
        (p)->major = 9;                                                                           \
        (p)->minor = 4;                                                                           \
        (p)->multiProcessorCount = FH_CUS;                                                        \
        (p)->l2CacheSize = FH_L2_BYTES;                                                           \
        (p)->maxThreadsPerMultiProcessor = 2048;                                                  \
        (p)->clockInstructionRate = 100000;                                                       \
        (p)->concurrentKernels = 1;                                                               \
        (p)->pciBusID = pci_bus(dev);                                                             \
        (p)->maxSharedMemoryPerMultiProcessor = FH_LDS_BYTES;                                     \
        (p)->canMapHostMemory = 1;                                                                \
        (p)->cooperativeLaunch = 1;                                                               \
        (p)->cooperativeMultiDeviceLaunch = 1;                                                    \
        (p)->memPitch = 2147483647;                                                               \
        (p)->textureAlignment = 256;                                                              \
        (p)->texturePitchAlignment = 256;                                                         \
        (p)->ECCEnabled = 1;                                                                      \
        (p)->isLargeBar = 1;                                                                      \
        (p)->managedMemory = 1;                                                                   \
        (p)->concurrentManagedAccess = 1;                                                         \
        (p)->arch.hasGlobalInt32Atomics = (p)->arch.hasSharedInt32Atomics = 1;                    \
        (p)->arch.hasGlobalInt64Atomics = (p)->arch.hasSharedInt64Atomics = 1;                    \
        (p)->arch.hasFloatAtomicAdd = (p)->arch.hasDoubles = 1;                                   \
        (p)->arch.hasWarpVote = (p)->arch.hasWarpBallot = (p)->arch.hasWarpShuffle = 1;           \
        (p)->arch.hasFunnelShift = (p)->arch.hasThreadFenceSystem = 1;                            \
        (p)->arch.hasSyncThreadsExt = (p)->arch.has3dGrid = 1;                                    \
    } while (0)

FH_API hipError_t hipGetDeviceProperties(hipDeviceProp_t *prop, int deviceId)
{
    FC_ENTRY();
    hipError_t e = prop ? check_device(deviceId) : hipErrorInvalidValue;
    if (e != hipSuccess)
        return fh_ret(e);
    memset(prop, 0, sizeof *prop);
    FH_FILL_COMMON(prop, deviceId);
    prop->gcnArch = 942;
    return fh_ret(hipSuccess);
}

FH_API hipError_t hipGetDevicePropertiesR0600(hipDeviceProp_tR0600 *prop, int deviceId)
{
    FC_ENTRY();
    hipError_t e = prop ? check_device(deviceId) : hipErrorInvalidValue;
    if (e != hipSuccess)
        return fh_ret(e);
    memset(prop, 0, sizeof *prop);
    FH_FILL_COMMON(prop, deviceId);
    rocm_uuid(fc.phys[deviceId], prop->uuid.bytes);
    prop->asyncEngineCount = 2;
    prop->unifiedAddressing = 1;
    prop->streamPrioritiesSupported = 1;
    prop->sharedMemPerMultiprocessor = FH_LDS_BYTES;
    prop->regsPerMultiprocessor = 65536;
    prop->sharedMemPerBlockOptin = FH_LDS_BYTES;
    prop->maxBlocksPerMultiProcessor = 2;
    prop->memoryPoolsSupported = 1;
    prop->hostRegisterSupported = 1;
    return fh_ret(hipSuccess);
}

static bool attr_value(hipDeviceAttribute_t attr, int dev, int *v)
{
    switch (attr) {
    case hipDeviceAttributeEccEnabled: *v = 1; break;
    case hipDeviceAttributeAsyncEngineCount: *v = 2; break;
    case hipDeviceAttributeCanMapHostMemory: *v = 1; break;
    case hipDeviceAttributeClockRate: *v = FH_CLOCK_KHZ; break;
    case hipDeviceAttributeComputeMode: *v = 0; break;
    case hipDeviceAttributeConcurrentKernels: *v = 1; break;
    case hipDeviceAttributeCooperativeLaunch: *v = 1; break;
    case hipDeviceAttributeIntegrated: *v = 0; break;
    case hipDeviceAttributeL2CacheSize: *v = FH_L2_BYTES; break;
    case hipDeviceAttributeComputeCapabilityMajor: *v = 9; break;
    case hipDeviceAttributeManagedMemory: *v = 1; break;
    case hipDeviceAttributeMaxBlockDimX:
    case hipDeviceAttributeMaxBlockDimY:
    case hipDeviceAttributeMaxBlockDimZ: *v = 1024; break;
    case hipDeviceAttributeMaxGridDimX:
    case hipDeviceAttributeMaxGridDimY:
    case hipDeviceAttributeMaxGridDimZ: *v = 2147483647; break;
    case hipDeviceAttributeMaxThreadsPerBlock: *v = 1024; break;
    case hipDeviceAttributeMaxThreadsPerMultiProcessor: *v = 2048; break;
    case hipDeviceAttributeMemoryBusWidth: *v = FH_BUS_WIDTH; break;
    case hipDeviceAttributeMemoryClockRate: *v = FH_MEM_CLOCK_KHZ; break;
    case hipDeviceAttributeComputeCapabilityMinor: *v = 4; break;
    case hipDeviceAttributeMultiprocessorCount: *v = FH_CUS; break;
    case hipDeviceAttributePciBusId: *v = pci_bus(dev); break;
    case hipDeviceAttributePciDeviceId: *v = 0; break;
    case hipDeviceAttributePciDomainID: *v = 0; break;
    case hipDeviceAttributeMaxRegistersPerBlock: *v = 65536; break;
    case hipDeviceAttributeMaxSharedMemoryPerBlock: *v = FH_LDS_BYTES; break;
    case hipDeviceAttributeStreamPrioritiesSupported: *v = 1; break;
    case hipDeviceAttributeTotalConstantMemory: *v = 2147483647; break;
    case hipDeviceAttributeUnifiedAddressing: *v = 1; break;
    case hipDeviceAttributeWarpSize: *v = 64; break;
    case hipDeviceAttributeMemoryPoolsSupported: *v = 1; break;
    case hipDeviceAttributeClockInstructionRate: *v = 100000; break;
    case hipDeviceAttributeMaxSharedMemoryPerMultiprocessor: *v = FH_LDS_BYTES; break;
    case hipDeviceAttributeIsLargeBar: *v = 1; break;
    case hipDeviceAttributePhysicalMultiProcessorCount: *v = FH_CUS; break;
    default: return false;
    }
    return true;
}

FH_API hipError_t hipDeviceGetAttribute(int *pi, hipDeviceAttribute_t attr, int deviceId)
{
    FC_ENTRY();
    hipError_t e = pi ? check_device(deviceId) : hipErrorInvalidValue;
    if (e == hipSuccess && !attr_value(attr, deviceId, pi))
        e = hipErrorInvalidValue; /* an attribute the fake does not model */
    return fh_ret(e);
}

FH_API hipError_t hipDeviceGetName(char *name, int len, hipDevice_t device)
{
    FC_ENTRY();
    hipError_t e = name && len > 0 ? check_device(device) : hipErrorInvalidValue;
    if (e == hipSuccess)
        snprintf(name, (size_t)len, "%s", FH_NAME);
    return fh_ret(e);
}

FH_API hipError_t hipDeviceTotalMem(size_t *bytes, hipDevice_t device)
{
    FC_ENTRY();
    hipError_t e = bytes ? check_device(device) : hipErrorInvalidValue;
    if (e == hipSuccess)
        *bytes = (size_t)fc.mem_bytes;
    return fh_ret(e);
}

FH_API hipError_t hipDeviceGetUuid(hipUUID *uuid, hipDevice_t device)
{
    FC_ENTRY();
    hipError_t e = uuid ? check_device(device) : hipErrorInvalidValue;
    if (e == hipSuccess)
        rocm_uuid(fc.phys[device], uuid->bytes);
    return fh_ret(e);
}

FH_API hipError_t hipDeviceGetPCIBusId(char *pciBusId, int len, int device)
{
    FC_ENTRY();
    hipError_t e = pciBusId && len > 0 ? check_device(device) : hipErrorInvalidValue;
    if (e == hipSuccess)
        snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", pci_bus(device));
    return fh_ret(e);
}

/* ROCm's stream priorities: 1 (low), 0 (normal), -1 (high). */
FH_API hipError_t hipDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    FC_ENTRY();
    hipError_t e = fh_init();
    if (e == hipSuccess) {
        if (leastPriority)
            *leastPriority = 1;
        if (greatestPriority)
            *greatestPriority = -1;
    }
    return fh_ret(e);
}

FH_API hipError_t hipMemGetInfo(size_t *free, size_t *total)
{
    FC_ENTRY();
    hipError_t e = free && total ? fh_begin() : hipErrorInvalidValue;
    if (e == hipSuccess)
        e = fh_from_cu(cuMemGetInfo_v2(free, total));
    return fh_ret(e);
}
