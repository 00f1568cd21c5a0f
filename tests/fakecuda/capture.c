/*
 * capture.c — stream capture.
 *
 * Work submitted to a capturing stream is not executed and not written to
 * the timeline: it becomes a node of the capture's graph (cuda.h: "all
 * operations pushed into the stream will not be executed, but will instead
 * be captured into a graph"); graph.c runs graphs.
 *
 * Calls that are unsafe during a capture break it the way the real driver
 * does (synchronize and query rules as measured on driver 580.159.04 with an
 * H200, the others as cuda.h describes them): a context-wide synchronize
 * of the capture's context, in any capture mode; a stream/event
 * synchronize or query, cuMemAlloc or cuMemFree from a thread not in
 * RELAXED mode while a GLOBAL capture, or the caller's own THREAD_LOCAL
 * capture, is active; legacy-stream work while a blocking stream captures.
 * The call fails and the capture is invalidated (cuStreamEndCapture then
 * returns CUDA_ERROR_STREAM_CAPTURE_INVALIDATED).
 */
#include "fakecuda.h"

#include <stdlib.h>

static _Thread_local CUstreamCaptureMode tls_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

CUresult fc_capture_add(struct fc_capture *cap, enum fc_kind kind, uint64_t duration_ns,
                        const struct fc_dataop *op)
{
    struct fc_node node = {.kind = kind, .duration_ns = duration_ns};
    if (op)
        node.op = *op;
    return fc_graph_append(cap->graph, &node);
}

static void capture_free(struct CUctx_st *ctx, struct fc_capture *cap)
{
    for (struct CUstream_st *s = ctx->streams; s; s = s->next)
        if (s->capture == cap)
            s->capture = NULL;
    if (cap->graph)
        fc_graph_free(cap->graph);
    free(cap);
}

void fc_capture_end_all(struct CUctx_st *ctx)
{
    for (struct CUstream_st *s = ctx->streams; s; s = s->next)
        if (s->capture && s->capture->origin == s)
            capture_free(ctx, s->capture);
}

void fc_capture_leave(struct CUstream_st *s)
{
    struct fc_capture *cap = s->capture;
    cap->invalidated = true;
    if (cap->origin == s)
        capture_free(s->ctx, cap);
    s->capture = NULL;
}

void fc_capture_join(struct CUstream_st *s, uint64_t capture_id)
{
    for (struct CUstream_st *x = s->ctx->streams; x; x = x->next) {
        if (x->capture && x->capture->id == capture_id) {
            s->capture = x->capture;
            return;
        }
    }
    /* The capture has ended: the wait is a no-op, as for an event never
     * recorded outside a capture. */
}

CUresult fc_capture_check_ctx_sync(struct CUctx_st *ctx)
{
    CUresult r = CUDA_SUCCESS;
    for (struct CUstream_st *s = ctx->streams; s; s = s->next) {
        if (s->capture) {
            s->capture->invalidated = true;
            r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    }
    return r;
}

CUresult fc_capture_check_sync(struct CUctx_st *ctx, struct CUstream_st *target)
{
    if (target && target->capture) {
        target->capture->invalidated = true;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (tls_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_SUCCESS;
    CUresult r = CUDA_SUCCESS;
    pthread_t self = pthread_self();
    for (struct CUstream_st *s = ctx->streams; s; s = s->next) {
        struct fc_capture *cap = s->capture;
        if (cap && (cap->mode == CU_STREAM_CAPTURE_MODE_GLOBAL ||
                    (cap->mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
                     pthread_equal(cap->thread, self)))) {
            cap->invalidated = true;
            r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    }
    return r;
}

CUresult fc_capture_check_legacy(struct CUctx_st *ctx)
{
    CUresult r = CUDA_SUCCESS;
    for (struct CUstream_st *s = ctx->streams; s; s = s->next) {
        if (s->capture && !(s->flags & CU_STREAM_NON_BLOCKING)) {
            s->capture->invalidated = true;
            r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        }
    }
    return r;
}

/* ---- capture entry points ---- */

static CUresult begin_capture(CUstream hStream, CUstreamCaptureMode mode, bool per_thread)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    struct CUstream_st *s = NULL;
    r = fc_stream_resolve(hStream, per_thread, &s);
    if (r == CUDA_SUCCESS && s->kind == FC_STREAM_LEGACY)
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy stream cannot capture */
    else if (r == CUDA_SUCCESS && s->capture)
        r = CUDA_ERROR_ILLEGAL_STATE;
    struct fc_capture *cap = NULL;
    if (r == CUDA_SUCCESS) {
        cap = calloc(1, sizeof *cap);
        if (cap == NULL || (cap->graph = fc_graph_new()) == NULL) {
            free(cap);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if (r == CUDA_SUCCESS) {
        cap->id = fc.next_capture_id++;
        cap->mode = mode;
        cap->thread = pthread_self();
        cap->origin = s;
        s->capture = cap;
    }
    fc_unlock();
    return r;
}

FC_API CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    FC_ENTRY();
    return begin_capture(hStream, mode, false);
}

FC_API CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
    FC_ENTRY();
    return begin_capture(hStream, mode, true);
}

static CUresult end_capture(CUstream hStream, CUgraph *phGraph, bool per_thread)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (phGraph == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    struct CUstream_st *s = NULL;
    r = fc_stream_resolve(hStream, per_thread, &s);
    struct fc_capture *cap = r == CUDA_SUCCESS ? s->capture : NULL;
    if (r == CUDA_SUCCESS && cap == NULL)
        r = CUDA_ERROR_ILLEGAL_STATE;
    else if (r == CUDA_SUCCESS && cap->origin != s)
        r = CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
    else if (r == CUDA_SUCCESS && cap->mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
             !pthread_equal(cap->thread, pthread_self()))
        r = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    if (r == CUDA_SUCCESS) {
        *phGraph = NULL;
        if (cap->invalidated) {
            r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        } else {
            *phGraph = cap->graph;
            cap->graph = NULL; /* handed to the caller */
        }
        capture_free(s->ctx, cap);
    }
    fc_unlock();
    return r;
}

FC_API CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    FC_ENTRY();
    return end_capture(hStream, phGraph, false);
}

FC_API CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    FC_ENTRY();
    return end_capture(hStream, phGraph, true);
}

static CUresult is_capturing(CUstream hStream, CUstreamCaptureStatus *status, bool per_thread)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (status == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    struct CUstream_st *s = NULL;
    r = fc_stream_resolve(hStream, per_thread, &s);
    if (r == CUDA_SUCCESS && s->kind == FC_STREAM_LEGACY) {
        /* Asking about the legacy stream while a blocking stream captures
         * would be an implicit dependency on the capture. */
        for (struct CUstream_st *x = s->ctx->streams; x; x = x->next)
            if (x->capture && !(x->flags & CU_STREAM_NON_BLOCKING))
                r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
    if (r == CUDA_SUCCESS)
        *status = s->capture == NULL        ? CU_STREAM_CAPTURE_STATUS_NONE
                  : s->capture->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                            : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    fc_unlock();
    return r;
}

FC_API CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    FC_ENTRY();
    return is_capturing(hStream, captureStatus, false);
}

FC_API CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    FC_ENTRY();
    return is_capturing(hStream, captureStatus, true);
}

FC_API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    FC_ENTRY();
    if (mode == NULL ||
        (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
         *mode != CU_STREAM_CAPTURE_MODE_RELAXED))
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = tls_mode;
    tls_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}
