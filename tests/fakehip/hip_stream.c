/*
 * hip_stream.c — streams, events and host functions through HIP, on the
 * engine's streams and events (tests/fakecuda/stream.c, event.c).
 *
 * The null stream (NULL) is the engine's legacy default stream of the
 * current device: it waits for every blocking stream and they wait for it,
 * as HIP's null stream does; hipStreamNonBlocking streams wait for nothing.
 * Priorities are ROCm's three: 1 (low), 0, -1 (high), clamped; they change
 * no timing.
 *
 * Host functions (hipLaunchHostFunc, hipStreamAddCallback) run on one
 * worker thread of the process, in order of the point of their stream they
 * were enqueued at (a zero-length operation with the stream's usual
 * dependencies); the worker sleeps until that point.  Their own run time
 * does not delay the stream's later work (the interval of every operation
 * is fixed when it is enqueued), and they cannot be captured:
 * hipLaunchHostFunc on a capturing stream invalidates the capture and
 * fails with hipErrorStreamCaptureUnsupported.  Synchronizing calls return
 * only after the host functions already due have run.
 */
#include "fakehip.h"

#include <stdlib.h>
#include <time.h>

/* ---- streams ---- */

static hipError_t stream_create(hipStream_t *stream, unsigned int flags, int priority)
{
    if (stream == NULL || (flags & ~(unsigned int)hipStreamNonBlocking))
        return hipErrorInvalidValue;
    hipError_t e = fh_begin();
    if (e != hipSuccess)
        return e;
    CUstream s = NULL;
    e = fh_from_cu(cuStreamCreate(&s, flags));
    if (e != hipSuccess)
        return e;
    fc_lock();
    s->priority = priority < -1 ? -1 : priority > 1 ? 1 : priority;
    fc_unlock();
    *stream = (hipStream_t)(void *)s;
    return hipSuccess;
}

FH_API hipError_t hipStreamCreate(hipStream_t *stream)
{
    FC_ENTRY();
    return fh_ret(stream_create(stream, hipStreamDefault, 0));
}

FH_API hipError_t hipStreamCreateWithFlags(hipStream_t *stream, unsigned int flags)
{
    FC_ENTRY();
    return fh_ret(stream_create(stream, flags, 0));
}

FH_API hipError_t hipStreamCreateWithPriority(hipStream_t *stream, unsigned int flags,
                                              int priority)
{
    FC_ENTRY();
    return fh_ret(stream_create(stream, flags, priority));
}

FH_API hipError_t hipStreamDestroy(hipStream_t stream)
{
    FC_ENTRY();
    hipError_t e = fh_begin();
    if (e == hipSuccess)
        e = fh_from_cu(cuStreamDestroy_v2((CUstream)(void *)stream));
    return fh_ret(e);
}

FH_API hipError_t hipStreamSynchronize(hipStream_t stream)
{
    FC_ENTRY();
    hipError_t e = fh_begin();
    if (e == hipSuccess)
        e = fh_from_cu(cuStreamSynchronize((CUstream)(void *)stream));
    if (e == hipSuccess)
        fh_hostfn_drain();
    return fh_ret(e);
}

FH_API hipError_t hipStreamQuery(hipStream_t stream)
{
    FC_ENTRY();
    hipError_t e = fh_begin();
    if (e == hipSuccess)
        e = fh_from_cu(cuStreamQuery((CUstream)(void *)stream));
    return fh_ret(e);
}

FH_API hipError_t hipStreamWaitEvent(hipStream_t stream, hipEvent_t event, unsigned int flags)
{
    FC_ENTRY();
    if (flags != 0)
        return fh_ret(hipErrorInvalidValue);
    hipError_t e = fh_begin();
    if (e == hipSuccess)
        e = fh_from_cu(cuStreamWaitEvent((CUstream)(void *)stream, (CUevent)(void *)event, 0));
    return fh_ret(e);
}

static hipError_t stream_field(hipStream_t stream, unsigned int *flags, int *priority)
{
    hipError_t e = fh_begin();
    if (e != hipSuccess)
        return e;
    fc_lock();
    struct CUstream_st *s = NULL;
    e = fh_from_cu(fh_stream(stream, &s));
    if (e == hipSuccess && flags)
        *flags = s->flags;
    if (e == hipSuccess && priority)
        *priority = s->priority;
    fc_unlock();
    return e;
}

FH_API hipError_t hipStreamGetFlags(hipStream_t stream, unsigned int *flags)
{
    FC_ENTRY();
    return fh_ret(flags ? stream_field(stream, flags, NULL) : hipErrorInvalidValue);
}

FH_API hipError_t hipStreamGetPriority(hipStream_t stream, int *priority)
{
    FC_ENTRY();
    return fh_ret(priority ? stream_field(stream, NULL, priority) : hipErrorInvalidValue);
}

/* ---- events ---- */

FH_API hipError_t hipEventCreateWithFlags(hipEvent_t *event, unsigned flags)
{
    FC_ENTRY();
    /* Fences at release change nothing on the simulated device. */
    flags &= ~(unsigned)(hipEventReleaseToDevice | hipEventReleaseToSystem);
    hipError_t e = event ? fh_begin() : hipErrorInvalidValue;
    CUevent ev = NULL;
    if (e == hipSuccess)
        e = fh_from_cu(cuEventCreate(&ev, flags));
    if (e == hipSuccess)
        *event = (hipEvent_t)(void *)ev;
    return fh_ret(e);
}

FH_API hipError_t hipEventCreate(hipEvent_t *event)
{
    FC_ENTRY();
    return hipEventCreateWithFlags(event, hipEventDefault);
}

FH_API hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream)
{
    FC_ENTRY();
    hipError_t e = fh_begin();
    if (e == hipSuccess)
        e = fh_from_cu(cuEventRecord((CUevent)(void *)event, (CUstream)(void *)stream));
    return fh_ret(e);
}

FH_API hipError_t hipEventDestroy(hipEvent_t event)
{
    FC_ENTRY();
    hipError_t e = fh_begin();
    if (e == hipSuccess)
        e = fh_from_cu(cuEventDestroy_v2((CUevent)(void *)event));
    return fh_ret(e);
}

FH_API hipError_t hipEventSynchronize(hipEvent_t event)
{
    FC_ENTRY();
    hipError_t e = fh_begin();
    if (e == hipSuccess)
        e = fh_from_cu(cuEventSynchronize((CUevent)(void *)event));
    if (e == hipSuccess)
        fh_hostfn_drain();
    return fh_ret(e);
}

FH_API hipError_t hipEventQuery(hipEvent_t event)
{
    FC_ENTRY();
    hipError_t e = fh_begin();
    if (e == hipSuccess)
        e = fh_from_cu(cuEventQuery((CUevent)(void *)event));
    return fh_ret(e);
}

FH_API hipError_t hipEventElapsedTime(float *ms, hipEvent_t start, hipEvent_t stop)
{
    FC_ENTRY();
    hipError_t e = ms ? fh_begin() : hipErrorInvalidValue;
    if (e == hipSuccess)
        e = fh_from_cu(cuEventElapsedTime(ms, (CUevent)(void *)start, (CUevent)(void *)stop));
    return fh_ret(e);
}

/* ---- host functions ---- */

struct hostfn {
    uint64_t due_ns;           /* the stream point it waits for */
    hipHostFn_t fn;            /* hipLaunchHostFunc, or NULL for a callback */
    hipStreamCallback_t cb;    /* hipStreamAddCallback */
    hipStream_t stream;
    void *arg;
    struct hostfn *next;       /* in `pending`: by due_ns, then enqueue order */
};

/* All guarded by hf_mu.  hf_cv (CLOCK_MONOTONIC) wakes the worker for new
 * work and the drainers when a function has run. */
static pthread_mutex_t hf_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hf_cv;
static struct hostfn *pending;
static uint64_t running_due; /* due time of the function running now; 0: none */
static bool cv_ready, worker_started;

static void *worker(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&hf_mu);
    for (;;) {
        if (pending == NULL) {
            pthread_cond_wait(&hf_cv, &hf_mu);
            continue;
        }
        uint64_t due = pending->due_ns;
        if (fc_now_ns() < due) {
            struct timespec ts = {.tv_sec = (time_t)(due / 1000000000ull),
                                  .tv_nsec = (long)(due % 1000000000ull)};
            /* Sleeps until the earliest function is due, or new work comes. */
            (void)pthread_cond_timedwait(&hf_cv, &hf_mu, &ts);
            continue;
        }
        struct hostfn *h = pending;
        pending = h->next;
        running_due = h->due_ns;
        pthread_mutex_unlock(&hf_mu);
        if (h->fn)
            h->fn(h->arg);
        else
            h->cb(h->stream, hipSuccess, h->arg);
        free(h);
        pthread_mutex_lock(&hf_mu);
        running_due = 0;
        pthread_cond_broadcast(&hf_cv); /* drainers look again */
    }
    return NULL;
}

static void worker_start_locked(void)
{
    if (worker_started)
        return;
    if (!cv_ready) {
        pthread_condattr_t attr;
        pthread_condattr_init(&attr);
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        pthread_cond_init(&hf_cv, &attr);
        pthread_condattr_destroy(&attr);
        cv_ready = true;
    }
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) == 0) {
        pthread_detach(t);
        worker_started = true;
    }
}

void fh_hostfn_drain(void)
{
    uint64_t now = fc_now_ns();
    pthread_mutex_lock(&hf_mu);
    while (worker_started && ((pending && pending->due_ns <= now) ||
                              (running_due != 0 && running_due <= now)))
        pthread_cond_wait(&hf_cv, &hf_mu);
    pthread_mutex_unlock(&hf_mu);
}

static hipError_t host_enqueue(hipStream_t stream, hipHostFn_t fn, hipStreamCallback_t cb,
                               void *arg)
{
    hipError_t e = fh_begin();
    if (e != hipSuccess)
        return e;
    struct hostfn *h = calloc(1, sizeof *h);
    if (h == NULL)
        return hipErrorOutOfMemory;
    fc_lock();
    struct CUstream_st *s = NULL;
    CUresult r = fh_stream(stream, &s);
    if (r == CUDA_SUCCESS && s->capture) {
        s->capture->invalidated = true; /* host nodes are not modelled */
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (r == CUDA_SUCCESS && s->kind == FC_STREAM_LEGACY)
        r = fc_capture_check_legacy(s->ctx);
    uint64_t start = 0, end = 0;
    if (r == CUDA_SUCCESS)
        r = fc_enqueue(s, 0, &start, &end);
    fc_unlock();
    if (r != CUDA_SUCCESS) {
        free(h);
        return fh_from_cu(r);
    }
    *h = (struct hostfn){.due_ns = end, .fn = fn, .cb = cb, .stream = stream, .arg = arg};
    pthread_mutex_lock(&hf_mu);
    worker_start_locked();
    if (!worker_started) {
        pthread_mutex_unlock(&hf_mu);
        free(h);
        return hipErrorOutOfMemory;
    }
    struct hostfn **pp = &pending;
    while (*pp && (*pp)->due_ns <= h->due_ns)
        pp = &(*pp)->next;
    h->next = *pp;
    *pp = h;
    pthread_cond_broadcast(&hf_cv);
    pthread_mutex_unlock(&hf_mu);
    return hipSuccess;
}

FH_API hipError_t hipLaunchHostFunc(hipStream_t stream, hipHostFn_t fn, void *userData)
{
    FC_ENTRY();
    return fh_ret(fn ? host_enqueue(stream, fn, NULL, userData) : hipErrorInvalidValue);
}

FH_API hipError_t hipStreamAddCallback(hipStream_t stream, hipStreamCallback_t callback,
                                       void *userData, unsigned int flags)
{
    FC_ENTRY();
    if (callback == NULL || flags != 0)
        return fh_ret(hipErrorInvalidValue);
    return fh_ret(host_enqueue(stream, NULL, callback, userData));
}
