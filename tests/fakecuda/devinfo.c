/*
 * devinfo.c — device enumeration and properties of the simulated GPUs.
 *
 * Every simulated GPU looks like an H200-class device (compute capability
 * 9.0, 132 SMs, 50 MiB L2) with KREX_FAKE_MEM_BYTES of memory.  Ordinals are
 * the visible ones (CUDA_VISIBLE_DEVICES); PCI bus id and UUID identify the
 * simulated GPU behind an ordinal, so two processes with different
 * visibility agree on which GPU they share.
 */
#include "fakecuda.h"

#include <stdio.h>
#include <string.h>

static CUresult check_device(CUdevice dev)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    return dev >= 0 && dev < fc.ndev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

FC_API CUresult cuDeviceGetCount(int *count)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *count = fc.ndev;
    return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= fc.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    FC_ENTRY();
    CUresult r = check_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    if (name == NULL || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "NVIDIA H200 (fake)");
    return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    FC_ENTRY();
    CUresult r = check_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    if (bytes == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = (size_t)fc.mem_bytes;
    return CUDA_SUCCESS;
}

/* krexd computes the same bytes (krexd/hardware/inventory.py fake_uuid): keep them in step. */
void fc_uuid_bytes(int phys, char out[16])
{
    static const char stem[12] = {'k', 'r', 'e', 'x', '-', 'f', 'a', 'k', 'e', '-', 'g', 'p'};
    memcpy(out, stem, sizeof stem);
    memset(out + sizeof stem, 0, 16 - sizeof stem);
    out[15] = (char)phys;
}

void fc_uuid_text(int phys, char out[FC_UUID_TEXT])
{
    unsigned char b[16];
    fc_uuid_bytes(phys, (char *)b);
    snprintf(out, FC_UUID_TEXT,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

void fc_uuid_rocr_text(int phys, char out[FC_UUID_TEXT])
{
    snprintf(out, FC_UUID_TEXT, "GPU-%s%02x", "6b72657866616b", phys & 0xff);
}

static CUresult get_uuid(CUuuid *uuid, CUdevice dev)
{
    CUresult r = check_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    if (uuid == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fc_uuid_bytes(fc.phys[dev], uuid->bytes);
    return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    FC_ENTRY();
    return get_uuid(uuid, dev);
}

FC_API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    FC_ENTRY();
    return get_uuid(uuid, dev);
}

FC_API CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    FC_ENTRY();
    CUresult r = check_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    if (pi == NULL || attrib < CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK ||
        attrib >= CU_DEVICE_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    int v = 0; /* attributes not listed: feature absent / not modelled */
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = 49152; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = 1980000; break; /* kHz */
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: v = 512; break;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = 132; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT: v = 512; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = 0x18 + 0x10 * fc.phys[dev]; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: v = 2619000; break; /* kHz */
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = 6144; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: v = (int)FC_L2_BYTES; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = 2048; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: v = 3; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: v = 233472; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO: v = 2; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: v = 232448; break;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE: v = (int)(FC_L2_BYTES / 4 * 3); break;
    case CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE: v = 134213632; break;
    case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT: v = 4; break;
    case CU_DEVICE_ATTRIBUTE_NUMA_ID: v = -1; break;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: v = -1; break;
    default: break;
    }
    *pi = v;
    return CUDA_SUCCESS;
}
