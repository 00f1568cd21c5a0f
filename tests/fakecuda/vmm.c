/*
 * vmm.c — virtual memory management (cuMemCreate / cuMemMap, the calls
 * PyTorch's expandable segments use) and page-locked host memory.
 *
 * A physical allocation (cuMemCreate) with a device location counts against
 * its GPU's shared capacity like cuMemAlloc (memshare.c) until cuMemRelease
 * or the process's exit.  Address ranges are reserved as inaccessible host
 * mappings; cuMemMap checks its arguments and the device memory its page
 * tables need (fc_mem_working) but does not make the range accessible:
 * copies into mapped ranges are not modelled.  Page-locked host memory is
 * ordinary host memory; allocating or registering it needs working device
 * memory (the driver maps it into the device's address space).
 */
#include "fakecuda.h"

#include <stdlib.h>
#include <sys/mman.h>

#define FC_MAGIC_PHYS 0x73796850u /* "Phys" */

struct fc_phys {
    uint32_t magic;
    int gpu;     /* simulated GPU index */
    size_t size;
};

static struct fc_phys *phys_of(CUmemGenericAllocationHandle h)
{
    struct fc_phys *p = (struct fc_phys *)(uintptr_t)h;
    return p && p->magic == FC_MAGIC_PHYS ? p : NULL;
}

FC_API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (handle == NULL || prop == NULL || size == 0 || flags != 0 ||
        prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.id < 0 || prop->location.id >= fc.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    struct fc_phys *p = malloc(sizeof *p);
    if (p == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (struct fc_phys){FC_MAGIC_PHYS, fc.phys[prop->location.id], size};
    fc_lock();
    bool ok = fc_share_reserve(p->gpu, size);
    fc_unlock();
    if (!ok) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    struct fc_phys *p = phys_of(handle);
    if (p == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    fc_share_release(p->gpu, p->size);
    fc_unlock();
    p->magic = 0;
    free(p);
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                    CUdeviceptr addr, unsigned long long flags)
{
    FC_ENTRY();
    (void)alignment; /* mmap's page alignment serves every test */
    (void)addr;
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (ptr == NULL || size == 0 || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *ptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (ptr == 0 || size == 0 || munmap((void *)(uintptr_t)ptr, size) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    const struct fc_phys *p = phys_of(handle);
    if (ptr == 0 || p == NULL || flags != 0 || offset > p->size || size > p->size - offset)
        return CUDA_ERROR_INVALID_VALUE;
    return fc_mem_working(p->gpu); /* page tables of the mapping */
}

FC_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    return ptr && size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- page-locked host memory ---- */

static CUresult host_alloc(void **pp, size_t bytesize)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (pp == NULL || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    r = fc_mem_working(fc_current_gpu());
    fc_unlock();
    if (r != CUDA_SUCCESS)
        return r;
    *pp = malloc(bytesize);
    return *pp ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

FC_API CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    FC_ENTRY();
    (void)Flags; /* portable / mapped / write-combined change nothing here */
    return host_alloc(pp, bytesize);
}

FC_API CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    FC_ENTRY();
    return host_alloc(pp, bytesize);
}

FC_API CUresult cuMemFreeHost(void *p)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    free(p);
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    FC_ENTRY();
    (void)Flags;
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (p == NULL || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    r = fc_mem_working(fc_current_gpu());
    fc_unlock();
    return r;
}

FC_API CUresult cuMemHostUnregister(void *p)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
