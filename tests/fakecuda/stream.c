/*
 * stream.c — streams: the legacy default stream of a context, per-thread
 * default streams, created streams; their synchronization and queries, and
 * the common path every stream operation takes (fc_submit).
 *
 * Handles as the real driver reads them: NULL is the legacy default stream
 * for the legacy API family and the calling thread's per-thread default
 * stream for the _ptsz/_ptds family; CU_STREAM_LEGACY and
 * CU_STREAM_PER_THREAD name those two explicitly in either family.
 * Stream structures are recycled through a free list, never freed, so a
 * stale handle reads a dead (or reused) stream, not freed memory.
 */
#include "fakecuda.h"

#include <stdlib.h>
#include <string.h>

/* Per-thread default streams of this thread, by context (a small cache;
 * entries are re-validated on use because contexts can be torn down). */
#define PT_CACHE 4
static _Thread_local struct CUstream_st *tls_pt[PT_CACHE];

struct CUstream_st *fc_stream_new(struct CUctx_st *ctx, enum fc_stream_kind kind,
                                  unsigned int flags, int priority)
{
    struct CUstream_st *s = fc.free_streams;
    if (s)
        fc.free_streams = s->next_free;
    else
        s = malloc(sizeof *s);
    if (s == NULL)
        return NULL;
    memset(s, 0, sizeof *s);
    s->magic = FC_MAGIC_STREAM;
    s->alive = true;
    s->kind = kind;
    s->flags = flags;
    s->priority = priority;
    s->id = kind == FC_STREAM_LEGACY ? 0 : fc.next_stream_id++;
    s->owner = pthread_self();
    s->ctx = ctx;
    s->next = ctx->streams;
    ctx->streams = s;
    return s;
}

void fc_stream_retire(struct CUstream_st *s)
{
    struct CUctx_st *ctx = s->ctx;
    for (struct CUstream_st **pp = &ctx->streams; *pp; pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    }
    /* Work already enqueued still runs: context-wide waits must see it. */
    if (s->tail_ns > ctx->retired_tail_ns)
        ctx->retired_tail_ns = s->tail_ns;
    if (!(s->flags & CU_STREAM_NON_BLOCKING) && s->tail_ns > ctx->retired_blocking_tail_ns)
        ctx->retired_blocking_tail_ns = s->tail_ns;
    if (s->capture)
        fc_capture_leave(s);
    s->alive = false;
    s->next_free = fc.free_streams;
    fc.free_streams = s;
}

static CUresult per_thread_stream(struct CUctx_st *ctx, struct CUstream_st **out)
{
    pthread_t self = pthread_self();
    for (int i = 0; i < PT_CACHE; i++) {
        struct CUstream_st *s = tls_pt[i];
        if (s && s->alive && s->ctx == ctx && s->kind == FC_STREAM_PER_THREAD &&
            pthread_equal(s->owner, self)) {
            *out = s;
            return CUDA_SUCCESS;
        }
    }
    struct CUstream_st *s = fc_stream_new(ctx, FC_STREAM_PER_THREAD, CU_STREAM_DEFAULT, 0);
    if (s == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    memmove(&tls_pt[1], &tls_pt[0], sizeof tls_pt[0] * (PT_CACHE - 1));
    tls_pt[0] = s;
    *out = s;
    return CUDA_SUCCESS;
}

CUresult fc_stream_resolve(CUstream h, bool per_thread, struct CUstream_st **out)
{
    if (h == NULL)
        h = per_thread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
    if (h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        struct CUctx_st *ctx = NULL;
        CUresult r = fc_current_ctx(&ctx);
        if (r != CUDA_SUCCESS)
            return r;
        if (h == CU_STREAM_LEGACY) {
            *out = ctx->legacy;
            return CUDA_SUCCESS;
        }
        return per_thread_stream(ctx, out);
    }
    if (h->magic != FC_MAGIC_STREAM || !h->alive)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!h->ctx->alive)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = h;
    return CUDA_SUCCESS;
}

CUresult fc_submit(struct CUstream_st *s, enum fc_kind kind, uint64_t duration_ns,
                   const struct fc_dataop *op)
{
    if (s->capture) {
        /* Captured work is not executed: it becomes a node of the graph. */
        if (s->capture->invalidated)
            return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        return fc_capture_add(s->capture, kind == FC_KIND_KERNEL ? FC_KIND_GRAPH_KERNEL : kind,
                              duration_ns, op);
    }
    CUresult r = CUDA_SUCCESS;
    if (s->kind == FC_STREAM_LEGACY)
        r = fc_capture_check_legacy(s->ctx);
    uint64_t start = 0, end = 0;
    if (r == CUDA_SUCCESS)
        r = fc_enqueue(s, duration_ns, &start, &end);
    if (r != CUDA_SUCCESS)
        return r;
    if (op)
        fc_dataop_apply(op);
    fc_activity_note(fc.phys[s->ctx->device], start, end);
    fc_timeline_write(s->id, kind, start, end, false);
    return CUDA_SUCCESS;
}

/* ---- entry points ---- */

static CUresult stream_create(CUstream *phStream, unsigned int flags, int priority)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (phStream == NULL || (flags & ~(unsigned int)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    /* Priorities range over [-5, 0] (greatest to least) on this device;
     * values outside are clamped, as the real driver does. */
    priority = priority < -5 ? -5 : priority > 0 ? 0 : priority;
    fc_lock();
    struct CUctx_st *ctx = NULL;
    r = fc_current_ctx(&ctx);
    if (r == CUDA_SUCCESS)
        r = fc_mem_working(fc.phys[ctx->device]);
    if (r == CUDA_SUCCESS) {
        struct CUstream_st *s = fc_stream_new(ctx, FC_STREAM_CREATED, flags, priority);
        if (s)
            *phStream = s;
        else
            r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    fc_unlock();
    return r;
}

FC_API CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    FC_ENTRY();
    return stream_create(phStream, Flags, 0);
}

FC_API CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    FC_ENTRY();
    return stream_create(phStream, flags, priority);
}

FC_API CUresult cuStreamDestroy_v2(CUstream hStream)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (hStream == NULL || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD)
        return CUDA_ERROR_INVALID_HANDLE;
    fc_lock();
    struct CUstream_st *s = NULL;
    r = fc_stream_resolve(hStream, false, &s);
    if (r == CUDA_SUCCESS)
        fc_stream_retire(s);
    fc_unlock();
    return r;
}

static CUresult stream_sync(CUstream hStream, bool per_thread)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    struct CUstream_st *s = NULL;
    r = fc_stream_resolve(hStream, per_thread, &s);
    if (r == CUDA_SUCCESS)
        r = fc_capture_check_sync(s->ctx, s);
    uint64_t until = r == CUDA_SUCCESS ? s->tail_ns : 0;
    fc_unlock();
    if (r == CUDA_SUCCESS)
        fc_sleep_until(until);
    return r;
}

FC_API CUresult cuStreamSynchronize(CUstream hStream)
{
    FC_ENTRY();
    return stream_sync(hStream, false);
}

FC_API CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    FC_ENTRY();
    return stream_sync(hStream, true);
}

static CUresult stream_query(CUstream hStream, bool per_thread)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    struct CUstream_st *s = NULL;
    r = fc_stream_resolve(hStream, per_thread, &s);
    if (r == CUDA_SUCCESS)
        r = fc_capture_check_sync(s->ctx, s);
    if (r == CUDA_SUCCESS && fc_now_ns() < s->tail_ns)
        r = CUDA_ERROR_NOT_READY;
    fc_unlock();
    return r;
}

FC_API CUresult cuStreamQuery(CUstream hStream)
{
    FC_ENTRY();
    return stream_query(hStream, false);
}

FC_API CUresult cuStreamQuery_ptsz(CUstream hStream)
{
    FC_ENTRY();
    return stream_query(hStream, true);
}

static CUresult stream_wait_event(CUstream hStream, CUevent hEvent, unsigned int flags,
                                  bool per_thread)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (flags & ~(unsigned int)CU_EVENT_WAIT_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    struct CUstream_st *s = NULL;
    r = fc_stream_resolve(hStream, per_thread, &s);
    if (r == CUDA_SUCCESS && (hEvent == NULL || hEvent->magic != FC_MAGIC_EVENT || !hEvent->alive))
        r = CUDA_ERROR_INVALID_HANDLE;
    if (r != CUDA_SUCCESS) {
        fc_unlock();
        return r;
    }
    if (hEvent->capture_id != 0) {
        /* The event marks a point of a capture: the stream joins it
         * (cuda.h, cuStreamBeginCapture: "cross-stream dependencies"). */
        if (s->capture && s->capture->id != hEvent->capture_id)
            r = CUDA_ERROR_STREAM_CAPTURE_MERGE;
        else if (!s->capture)
            fc_capture_join(s, hEvent->capture_id);
    } else if (s->capture) {
        /* A capture may only wait on an event of another capture when the
         * wait is marked external. */
        if (!(flags & CU_EVENT_WAIT_EXTERNAL)) {
            s->capture->invalidated = true;
            r = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
        }
    } else if (hEvent->recorded && hEvent->time_ns > s->tail_ns) {
        /* Later work of the stream starts after the event's point. */
        s->tail_ns = hEvent->time_ns;
    }
    fc_unlock();
    return r;
}

FC_API CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    FC_ENTRY();
    return stream_wait_event(hStream, hEvent, Flags, false);
}

FC_API CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    FC_ENTRY();
    return stream_wait_event(hStream, hEvent, Flags, true);
}

static CUresult stream_get_ctx(CUstream hStream, CUcontext *pctx, bool per_thread)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    struct CUstream_st *s = NULL;
    r = fc_stream_resolve(hStream, per_thread, &s);
    if (r == CUDA_SUCCESS)
        *pctx = s->ctx;
    fc_unlock();
    return r;
}

FC_API CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
    FC_ENTRY();
    return stream_get_ctx(hStream, pctx, false);
}

FC_API CUresult cuStreamGetCtx_ptsz(CUstream hStream, CUcontext *pctx)
{
    FC_ENTRY();
    return stream_get_ctx(hStream, pctx, true);
}

FC_API CUresult cuStreamGetCtx_v2(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx)
{
    FC_ENTRY();
    if (pGreenCtx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pGreenCtx = NULL; /* green contexts are not modelled */
    return stream_get_ctx(hStream, pCtx, false);
}

FC_API CUresult cuStreamGetCtx_v2_ptsz(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx)
{
    FC_ENTRY();
    if (pGreenCtx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pGreenCtx = NULL;
    return stream_get_ctx(hStream, pCtx, true);
}
