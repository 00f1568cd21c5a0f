/*
 * event.c — events: a recorded event completes when the device reaches the
 * point of its stream where it was recorded (a zero-length operation
 * enqueued with the stream's usual dependencies), so its time is the end
 * of the work before it.  Recorded inside a capture, an event marks a point
 * of the graph instead; a stream that waits on it joins the capture.
 */
#include "fakecuda.h"

#include <stdlib.h>
#include <string.h>

static CUresult check_event(CUevent e)
{
    return e && e->magic == FC_MAGIC_EVENT && e->alive ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

FC_API CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    const unsigned int known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING |
                               CU_EVENT_INTERPROCESS;
    if (phEvent == NULL || (Flags & ~known) ||
        ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)))
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    struct CUctx_st *ctx = NULL;
    r = fc_current_ctx(&ctx);
    if (r == CUDA_SUCCESS) {
        struct CUevent_st *e = fc.free_events;
        if (e)
            fc.free_events = e->next_free;
        else
            e = malloc(sizeof *e);
        if (e) {
            memset(e, 0, sizeof *e);
            e->magic = FC_MAGIC_EVENT;
            e->alive = true;
            e->flags = Flags;
            e->ctx = ctx;
            *phEvent = e;
        } else {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    fc_unlock();
    return r;
}

FC_API CUresult cuEventDestroy_v2(CUevent hEvent)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    r = check_event(hEvent);
    if (r == CUDA_SUCCESS) {
        hEvent->alive = false;
        hEvent->next_free = fc.free_events;
        fc.free_events = hEvent;
    }
    fc_unlock();
    return r;
}

static CUresult event_record(CUevent hEvent, CUstream hStream, unsigned int flags,
                             bool per_thread)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (flags & ~(unsigned int)CU_EVENT_RECORD_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    struct CUstream_st *s = NULL;
    r = check_event(hEvent);
    if (r == CUDA_SUCCESS)
        r = fc_stream_resolve(hStream, per_thread, &s);
    if (r != CUDA_SUCCESS) {
        fc_unlock();
        return r;
    }
    if (s->capture) {
        if (s->capture->invalidated)
            r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        else
            hEvent->capture_id = s->capture->id;
    } else if (flags & CU_EVENT_RECORD_EXTERNAL) {
        r = CUDA_ERROR_INVALID_VALUE; /* only meaningful during capture */
    } else {
        if (s->kind == FC_STREAM_LEGACY)
            r = fc_capture_check_legacy(s->ctx);
        uint64_t start = 0, end = 0;
        if (r == CUDA_SUCCESS)
            r = fc_enqueue(s, 0, &start, &end);
        if (r == CUDA_SUCCESS) {
            hEvent->capture_id = 0;
            hEvent->recorded = true;
            hEvent->time_ns = end;
        }
    }
    fc_unlock();
    return r;
}

FC_API CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    FC_ENTRY();
    return event_record(hEvent, hStream, 0, false);
}

FC_API CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
    FC_ENTRY();
    return event_record(hEvent, hStream, 0, true);
}

FC_API CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    FC_ENTRY();
    return event_record(hEvent, hStream, flags, false);
}

FC_API CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    FC_ENTRY();
    return event_record(hEvent, hStream, flags, true);
}

FC_API CUresult cuEventQuery(CUevent hEvent)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    r = check_event(hEvent);
    if (r == CUDA_SUCCESS)
        r = fc_capture_check_sync(hEvent->ctx, NULL);
    /* Never recorded: complete, as the real driver reports. */
    if (r == CUDA_SUCCESS && hEvent->recorded && fc_now_ns() < hEvent->time_ns)
        r = CUDA_ERROR_NOT_READY;
    fc_unlock();
    return r;
}

FC_API CUresult cuEventSynchronize(CUevent hEvent)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    r = check_event(hEvent);
    if (r == CUDA_SUCCESS)
        r = fc_capture_check_sync(hEvent->ctx, NULL);
    uint64_t until = r == CUDA_SUCCESS && hEvent->recorded ? hEvent->time_ns : 0;
    fc_unlock();
    if (r == CUDA_SUCCESS)
        fc_sleep_until(until);
    return r;
}

static CUresult elapsed(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (pMilliseconds == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    r = check_event(hStart);
    if (r == CUDA_SUCCESS)
        r = check_event(hEnd);
    if (r == CUDA_SUCCESS &&
        (((hStart->flags | hEnd->flags) & CU_EVENT_DISABLE_TIMING) || !hStart->recorded ||
         !hEnd->recorded))
        r = CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS) {
        uint64_t now = fc_now_ns();
        if (now < hStart->time_ns || now < hEnd->time_ns) {
            r = CUDA_ERROR_NOT_READY;
        } else {
            int64_t d = (int64_t)(hEnd->time_ns - hStart->time_ns);
            *pMilliseconds = (float)((double)d / 1e6);
        }
    }
    fc_unlock();
    return r;
}

FC_API CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    FC_ENTRY();
    return elapsed(pMilliseconds, hStart, hEnd);
}

FC_API CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    FC_ENTRY();
    return elapsed(pMilliseconds, hStart, hEnd);
}
