/*
 * module.c — modules, libraries, kernels and functions.  Any image is
 * accepted and every name resolves: all functions are "duration kernels"
 * (launch.c).  Functions and kernels are kept for the life of the process
 * (one per module/library and name), so handles stay valid after unload.
 */
#include "fakecuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

FC_API CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (module == NULL || image == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    struct CUctx_st *ctx = NULL;
    r = fc_current_ctx(&ctx); /* modules load into the current context */
    if (r == CUDA_SUCCESS)
        r = fc_mem_working(fc.phys[ctx->device]); /* the image goes to device memory */
    if (r == CUDA_SUCCESS) {
        struct CUmod_st *m = calloc(1, sizeof *m);
        if (m) {
            m->magic = FC_MAGIC_MODULE;
            m->alive = true;
            *module = m;
        } else {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    fc_unlock();
    return r;
}

/* Handle checks read `alive`, which unloading changes: call with fc.mu held. */
static bool module_ok(CUmodule m)
{
    return m && m->magic == FC_MAGIC_MODULE && m->alive;
}

static bool library_ok(CUlibrary l)
{
    return l && l->magic == FC_MAGIC_LIBRARY && l->alive;
}

FC_API CUresult cuModuleUnload(CUmodule hmod)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    if (module_ok(hmod))
        hmod->alive = false;
    else
        r = CUDA_ERROR_INVALID_HANDLE;
    fc_unlock();
    return r;
}

static struct CUfunc_st *func_find(struct CUfunc_st **list, const char *name)
{
    for (struct CUfunc_st *f = *list; f; f = f->next)
        if (strcmp(f->name, name) == 0)
            return f;
    struct CUfunc_st *f = calloc(1, sizeof *f);
    if (f == NULL)
        return NULL;
    f->magic = FC_MAGIC_FUNC;
    snprintf(f->name, sizeof f->name, "%s", name);
    f->next = *list;
    *list = f;
    return f;
}

FC_API CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (hfunc == NULL || name == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    struct CUfunc_st *f = NULL;
    if (!module_ok(hmod))
        r = CUDA_ERROR_INVALID_HANDLE;
    else if ((f = func_find(&hmod->funcs, name)) == NULL)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    else
        *hfunc = f;
    fc_unlock();
    return r;
}

FC_API CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                  void **jitOptionsValues, unsigned int numJitOptions,
                                  CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                  unsigned int numLibraryOptions)
{
    FC_ENTRY();
    (void)jitOptions;
    (void)jitOptionsValues;
    (void)libraryOptions;
    (void)libraryOptionValues;
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (library == NULL || code == NULL || (numJitOptions && !jitOptions) ||
        (numLibraryOptions && !libraryOptions))
        return CUDA_ERROR_INVALID_VALUE;
    /* Libraries are context-independent: no current context needed (the
     * image is loaded into the current one, if any, or device 0's). */
    fc_lock();
    r = fc_mem_working(fc_current_gpu());
    fc_unlock();
    if (r != CUDA_SUCCESS)
        return r;
    struct CUlib_st *l = calloc(1, sizeof *l);
    if (l == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    l->magic = FC_MAGIC_LIBRARY;
    l->alive = true;
    *library = l;
    return CUDA_SUCCESS;
}

FC_API CUresult cuLibraryUnload(CUlibrary library)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    if (library_ok(library))
        library->alive = false;
    else
        r = CUDA_ERROR_INVALID_HANDLE;
    fc_unlock();
    return r;
}

FC_API CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (pKernel == NULL || name == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    if (!library_ok(library)) {
        fc_unlock();
        return CUDA_ERROR_INVALID_HANDLE;
    }
    struct CUkern_st *k = library->kernels;
    while (k && strcmp(k->func.name, name) != 0)
        k = k->next;
    if (k == NULL && (k = calloc(1, sizeof *k)) != NULL) {
        k->magic = FC_MAGIC_KERNEL;
        k->func.magic = FC_MAGIC_FUNC;
        snprintf(k->func.name, sizeof k->func.name, "%s", name);
        k->next = library->kernels;
        library->kernels = k;
    }
    if (k)
        *pKernel = k;
    fc_unlock();
    return k ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

FC_API CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (pFunc == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (kernel == NULL || kernel->magic != FC_MAGIC_KERNEL)
        return CUDA_ERROR_INVALID_HANDLE;
    fc_lock();
    struct CUctx_st *ctx = NULL;
    r = fc_current_ctx(&ctx); /* the function of the kernel in the current context */
    if (r == CUDA_SUCCESS)
        *pFunc = &kernel->func;
    fc_unlock();
    return r;
}
