/*
 * context.c — primary contexts, created contexts, the per-thread context
 * stack and context-wide synchronization.
 *
 * Context structures are never freed: a destroyed context keeps its tag and
 * alive == false, so a stale handle gives CUDA_ERROR_CONTEXT_IS_DESTROYED
 * instead of touching freed memory.  A primary context is one fixed
 * structure per visible device, activated by the first retain and torn down
 * when the last retain is released or on reset.
 */
#include "fakecuda.h"

#include <stdlib.h>

static _Thread_local struct CUctx_st *tls_stack[FC_CTX_STACK_MAX];
static _Thread_local int tls_depth;

CUresult fc_check_ctx(struct CUctx_st *ctx)
{
    if (ctx == NULL || ctx->magic != FC_MAGIC_CTX)
        return CUDA_ERROR_INVALID_CONTEXT;
    return ctx->alive ? CUDA_SUCCESS : CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

CUresult fc_current_ctx(struct CUctx_st **out)
{
    if (tls_depth == 0 || tls_stack[tls_depth - 1] == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct CUctx_st *ctx = tls_stack[tls_depth - 1];
    CUresult r = fc_check_ctx(ctx);
    if (r == CUDA_SUCCESS)
        *out = ctx;
    return r;
}

uint64_t fc_ctx_tail(const struct CUctx_st *ctx)
{
    uint64_t t = ctx->retired_tail_ns;
    for (const struct CUstream_st *s = ctx->streams; s; s = s->next)
        t = s->tail_ns > t ? s->tail_ns : t;
    return t;
}

CUresult fc_ctx_activate(struct CUctx_st *ctx, int device, unsigned int flags, bool primary)
{
    /* A context makes the process an MPS client (refused by a faulted
     * server before anything reaches the device), then takes device memory. */
    CUresult r = fc_mps_join(fc.phys[device]);
    if (r == CUDA_SUCCESS)
        r = fc_mem_working(fc.phys[device]);
    if (r != CUDA_SUCCESS)
        return r;
    ctx->magic = FC_MAGIC_CTX;
    ctx->primary = primary;
    ctx->device = device;
    ctx->flags = flags;
    ctx->id = fc.next_ctx_id++;
    ctx->streams = NULL;
    ctx->retired_tail_ns = 0;
    ctx->retired_blocking_tail_ns = 0;
    ctx->legacy = fc_stream_new(ctx, FC_STREAM_LEGACY, CU_STREAM_DEFAULT, 0);
    if (ctx->legacy == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ctx->alive = true;
    fc_share_ctx(fc.phys[device], +1);
    return CUDA_SUCCESS;
}

void fc_ctx_teardown(struct CUctx_st *ctx)
{
    fc_capture_end_all(ctx);
    while (ctx->streams)
        fc_stream_retire(ctx->streams);
    ctx->legacy = NULL;
    fc_mem_release_ctx(ctx);
    if (ctx->alive)
        fc_share_ctx(fc.phys[ctx->device], -1);
    ctx->alive = false;
}

static CUresult check_device(CUdevice dev)
{
    return dev >= 0 && dev < fc.ndev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

static CUresult push_ctx(struct CUctx_st *ctx)
{
    if (tls_depth >= FC_CTX_STACK_MAX)
        return CUDA_ERROR_OUT_OF_MEMORY;
    tls_stack[tls_depth++] = ctx;
    return CUDA_SUCCESS;
}

/* ---- primary contexts ---- */

FC_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r == CUDA_SUCCESS)
        r = pctx ? check_device(dev) : CUDA_ERROR_INVALID_VALUE;
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    struct CUctx_st *p = &fc.primary[dev];
    if (!p->alive)
        r = fc_ctx_activate(p, dev, p->flags, true);
    if (r == CUDA_SUCCESS) {
        p->refcount++;
        *pctx = p;
    }
    fc_unlock();
    return r;
}

FC_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r == CUDA_SUCCESS)
        r = check_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    struct CUctx_st *p = &fc.primary[dev];
    if (!p->alive || p->refcount == 0) {
        r = CUDA_ERROR_INVALID_CONTEXT;
    } else if (--p->refcount == 0) {
        fc_ctx_teardown(p);
    }
    fc_unlock();
    return r;
}

FC_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r == CUDA_SUCCESS)
        r = check_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    struct CUctx_st *p = &fc.primary[dev];
    if (p->alive)
        fc_ctx_teardown(p);
    p->refcount = 0;
    p->flags = 0;
    fc_unlock();
    return CUDA_SUCCESS;
}

FC_API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r == CUDA_SUCCESS)
        r = (flags && active) ? check_device(dev) : CUDA_ERROR_INVALID_VALUE;
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    *flags = fc.primary[dev].flags;
    *active = fc.primary[dev].alive ? 1 : 0;
    fc_unlock();
    return CUDA_SUCCESS;
}

/* ---- created contexts ---- */

static CUresult ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CUresult r = fc_check_init();
    if (r == CUDA_SUCCESS)
        r = pctx ? check_device(dev) : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && (flags & ~(unsigned int)CU_CTX_FLAGS_MASK))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r != CUDA_SUCCESS)
        return r;
    struct CUctx_st *ctx = calloc(1, sizeof *ctx);
    if (ctx == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fc_lock();
    r = fc_ctx_activate(ctx, dev, flags, false);
    if (r == CUDA_SUCCESS)
        r = push_ctx(ctx);
    if (r == CUDA_SUCCESS)
        *pctx = ctx;
    else
        fc_ctx_teardown(ctx); /* leaves a dead, never-handed-out structure */
    fc_unlock();
    return r;
}

FC_API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    FC_ENTRY();
    return ctx_create(pctx, flags, dev);
}

FC_API CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                               unsigned int flags, CUdevice dev)
{
    FC_ENTRY();
    (void)paramsArray; /* execution affinity (SM count limits) is not modelled */
    if (numParams < 0)
        return CUDA_ERROR_INVALID_VALUE;
    return ctx_create(pctx, flags, dev);
}

FC_API CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                               unsigned int flags, CUdevice dev)
{
    FC_ENTRY();
    if (ctxCreateParams && ctxCreateParams->cigParams)
        return CUDA_ERROR_NOT_SUPPORTED; /* CUDA-in-graphics contexts */
    return ctx_create(pctx, flags, dev);
}

FC_API CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    r = fc_check_ctx(ctx);
    if (r == CUDA_SUCCESS && ctx->primary)
        r = CUDA_ERROR_INVALID_CONTEXT;
    if (r == CUDA_SUCCESS) {
        fc_ctx_teardown(ctx);
        if (tls_depth > 0 && tls_stack[tls_depth - 1] == ctx)
            tls_depth--;
    }
    fc_unlock();
    return r;
}

/* ---- the calling thread's context stack ---- */

FC_API CUresult cuCtxSetCurrent(CUcontext ctx)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (ctx == NULL) {
        /* NULL pops the top of the stack (no-op on an empty stack). */
        if (tls_depth > 0)
            tls_depth--;
        return CUDA_SUCCESS;
    }
    fc_lock();
    r = fc_check_ctx(ctx);
    fc_unlock();
    if (r != CUDA_SUCCESS)
        return r;
    if (tls_depth == 0)
        return push_ctx(ctx);
    tls_stack[tls_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

FC_API CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = tls_depth > 0 ? tls_stack[tls_depth - 1] : NULL;
    return CUDA_SUCCESS;
}

FC_API CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    r = fc_check_ctx(ctx);
    fc_unlock();
    return r == CUDA_SUCCESS ? push_ctx(ctx) : r;
}

FC_API CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (tls_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct CUctx_st *top = tls_stack[--tls_depth];
    if (pctx)
        *pctx = top;
    return CUDA_SUCCESS;
}

static CUresult ctx_get_device(CUdevice *device, CUcontext ctx)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    r = ctx ? fc_check_ctx(ctx) : fc_current_ctx(&ctx);
    if (r == CUDA_SUCCESS)
        *device = ctx->device;
    fc_unlock();
    return r;
}

FC_API CUresult cuCtxGetDevice(CUdevice *device)
{
    FC_ENTRY();
    return ctx_get_device(device, NULL);
}

FC_API CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    FC_ENTRY();
    return ctx_get_device(device, ctx);
}

/* ---- synchronization ---- */

/* Sleep until every operation enqueued in ctx so far has ended (ctx NULL:
 * the calling thread's current context). */
static CUresult ctx_sync(CUcontext ctx)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    r = ctx ? fc_check_ctx(ctx) : fc_current_ctx(&ctx);
    if (r == CUDA_SUCCESS)
        r = fc_capture_check_ctx_sync(ctx);
    uint64_t until = r == CUDA_SUCCESS ? fc_ctx_tail(ctx) : 0;
    fc_unlock();
    if (r == CUDA_SUCCESS)
        fc_sleep_until(until);
    return r;
}

FC_API CUresult cuCtxSynchronize(void)
{
    FC_ENTRY();
    return ctx_sync(NULL);
}

FC_API CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    FC_ENTRY();
    return ctx_sync(ctx);
}
