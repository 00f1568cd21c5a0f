/*
 * drain.c — the drainer thread (paper §4.2 step 3) and what it needs to
 * know: the contexts and streams this process uses and its open stream
 * captures.
 *
 * On a closure by another tenant the drainer captures the epoch, waits for
 * the in-flight counter to reach zero, synchronizes every context the
 * process created or made current plus the active primary contexts
 * (through the REAL driver functions: nothing here is gated or observed),
 * then publishes the epoch.  While a stream capture is open in the process
 * a context-wide synchronization would invalidate it, so the drainer
 * switches its own thread to the relaxed capture mode and synchronizes the
 * tracked streams that are not capturing and each context's legacy stream
 * instead (docs/design/shim.md "Capture").
 */
#include "shim.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEVICES 64

struct handles {
    void **v;
    size_t n, cap;
};

/* Guards both lists.  Held during a drain's synchronization so that a
 * stream or context cannot be destroyed under it (stream destruction is
 * not gated; see classes.toml [observe.pre]). */
static pthread_mutex_t track_mu = PTHREAD_MUTEX_INITIALIZER;
static struct handles ctxs;    /* created through the API or made current */
static struct handles streams; /* created through the API */
static _Atomic uint32_t captures;
static _Atomic int exiting;

/* ---- tracking ------------------------------------------------------------- */

static void handles_add(struct handles *h, void *p)
{
    for (size_t i = 0; i < h->n; i++)
        if (h->v[i] == p)
            return;
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 16;
        void **v = realloc(h->v, cap * sizeof *v);
        if (!v) {
            krex_log(KREX_LOG_ERROR, "out of memory: handle %p not tracked for drains", p);
            return;
        }
        h->v = v;
        h->cap = cap;
    }
    h->v[h->n++] = p;
}

static void handles_remove(struct handles *h, void *p)
{
    for (size_t i = 0; i < h->n; i++)
        if (h->v[i] == p) {
            h->v[i] = h->v[--h->n];
            return;
        }
}

static void handles_clear(struct handles *h)
{
    free(h->v);
    h->v = NULL;
    h->n = h->cap = 0;
}

static void track(struct handles *h, void *p, int add)
{
    int saved = errno;
    pthread_mutex_lock(&track_mu);
    if (add)
        handles_add(h, p);
    else
        handles_remove(h, p);
    pthread_mutex_unlock(&track_mu);
    errno = saved;
}

void krex_note_stream_created(CUresult r, CUstream *phStream)
{
    if (r == CUDA_SUCCESS && phStream && *phStream)
        track(&streams, *phStream, 1);
}

void krex_note_stream_destroying(CUstream stream)
{
    if (stream && stream != CU_STREAM_LEGACY && stream != CU_STREAM_PER_THREAD)
        track(&streams, stream, 0);
}

void krex_note_ctx_created(CUresult r, CUcontext *pctx)
{
    if (r == CUDA_SUCCESS && pctx && *pctx)
        track(&ctxs, *pctx, 1);
}

/* Frameworks make the same context current over and over: the last one
 * recorded is remembered so that the repeat costs one load, no lock. */
static _Atomic(CUcontext) last_current;

void krex_note_ctx_current(CUresult r, CUcontext ctx)
{
    if (r != CUDA_SUCCESS || !ctx ||
        atomic_load_explicit(&last_current, memory_order_relaxed) == ctx)
        return;
    track(&ctxs, ctx, 1);
    /* Relaxed: a hint only; a stale value costs one more locked add. */
    atomic_store_explicit(&last_current, ctx, memory_order_relaxed);
}

void krex_note_ctx_destroyed(CUresult r, CUcontext ctx)
{
    if (r != CUDA_SUCCESS || !ctx)
        return;
    atomic_store_explicit(&last_current, NULL, memory_order_relaxed);
    track(&ctxs, ctx, 0);
    krex_region_forget_ctx(ctx);
}

static void mirror_captures(uint32_t n)
{
    struct krex_slot *s = atomic_load_explicit(&krex_slot_p, memory_order_acquire);
    if (s) /* status for krexd only: relaxed */
        atomic_store_explicit(&s->captures, n, memory_order_relaxed);
}

/* Capture begin is gated ([gate_also]): the increment happens before the
 * call's krex_gate_leave (a seq_cst RMW, hence a release), so a drainer
 * that then reads the counter at zero (seq_cst, hence acquire) reads the
 * new capture count. */
void krex_note_capture_begin(CUresult r)
{
    if (r == CUDA_SUCCESS)
        mirror_captures(atomic_fetch_add_explicit(&captures, 1, memory_order_acq_rel) + 1);
}

/* EndCapture ends the capture when it succeeds and when it reports the
 * capture invalidated; other errors leave it open. */
void krex_note_capture_end(CUresult r)
{
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
        return;
    uint32_t n = atomic_load_explicit(&captures, memory_order_acquire);
    while (n > 0 && !atomic_compare_exchange_weak_explicit(&captures, &n, n - 1,
                                                           memory_order_acq_rel,
                                                           memory_order_acquire))
        ;
    mirror_captures(n > 0 ? n - 1 : 0);
}

uint32_t krex_captures(void)
{
    return atomic_load_explicit(&captures, memory_order_acquire);
}

/* ---- synchronization ------------------------------------------------------ */

static int benign(CUresult r)
{
    /* No driver, or a context already gone: nothing can still run there. */
    return r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_INITIALIZED ||
           r == CUDA_ERROR_DEINITIALIZED || r == CUDA_ERROR_INVALID_CONTEXT ||
           r == CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

static void note(CUresult *first, CUresult r)
{
    if (!benign(r) && *first == CUDA_SUCCESS)
        *first = r;
}

/* Context-wide synchronization from any thread: cuCtxSynchronize_v2(ctx)
 * (CUDA 13), else push / cuCtxSynchronize / pop on this thread's stack. */
static CUresult sync_ctx(CUcontext ctx)
{
    __typeof__(&cuCtxSynchronize_v2) sync2 = KREX_REAL(cuCtxSynchronize_v2);
    if (sync2)
        return sync2(ctx);
    __typeof__(&cuCtxPushCurrent_v2) push = KREX_REAL(cuCtxPushCurrent_v2);
    __typeof__(&cuCtxSynchronize) sync = KREX_REAL(cuCtxSynchronize);
    __typeof__(&cuCtxPopCurrent_v2) pop = KREX_REAL(cuCtxPopCurrent_v2);
    if (!push || !sync || !pop)
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = push(ctx);
    if (r != CUDA_SUCCESS)
        return r;
    r = sync();
    CUcontext popped;
    pop(&popped);
    return r;
}

/* While a capture is open: the legacy stream of `ctx`, from this thread
 * (relaxed capture mode already set by the caller). */
static CUresult sync_legacy_stream(CUcontext ctx)
{
    __typeof__(&cuCtxPushCurrent_v2) push = KREX_REAL(cuCtxPushCurrent_v2);
    __typeof__(&cuCtxPopCurrent_v2) pop = KREX_REAL(cuCtxPopCurrent_v2);
    __typeof__(&cuStreamSynchronize) ssync = KREX_REAL(cuStreamSynchronize);
    if (!push || !pop || !ssync)
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = push(ctx);
    if (r != CUDA_SUCCESS)
        return r;
    r = ssync(CU_STREAM_LEGACY);
    CUcontext popped;
    pop(&popped);
    return r;
}

static CUresult sync_streams_capture_safe(CUcontext *all, size_t nall)
{
    CUresult first = CUDA_SUCCESS;
    __typeof__(&cuStreamIsCapturing) is_capturing = KREX_REAL(cuStreamIsCapturing);
    __typeof__(&cuStreamSynchronize) ssync = KREX_REAL(cuStreamSynchronize);
    if (!is_capturing || !ssync)
        return CUDA_ERROR_NOT_FOUND;
    for (size_t i = 0; i < streams.n; i++) {
        CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
        CUresult r = is_capturing((CUstream)streams.v[i], &st);
        if (r == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_NONE)
            r = ssync((CUstream)streams.v[i]);
        note(&first, r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ? CUDA_SUCCESS : r);
    }
    for (size_t i = 0; i < nall; i++)
        note(&first, sync_legacy_stream(all[i]));
    return first;
}

CUresult krex_sync_all(int app_thread)
{
    int saved = errno;
    CUresult first = CUDA_SUCCESS;
    CUcontext prim[MAX_DEVICES];
    CUdevice prim_dev[MAX_DEVICES];
    size_t nprim = 0;

    /* Active primary contexts: retained for the duration, so their handles
     * stay valid until the synchronization returns (paper §4.2). */
    __typeof__(&cuDeviceGetCount) get_count = KREX_REAL(cuDeviceGetCount);
    __typeof__(&cuDeviceGet) get_dev = KREX_REAL(cuDeviceGet);
    __typeof__(&cuDevicePrimaryCtxGetState) get_state = KREX_REAL(cuDevicePrimaryCtxGetState);
    __typeof__(&cuDevicePrimaryCtxRetain) retain = KREX_REAL(cuDevicePrimaryCtxRetain);
    __typeof__(&cuDevicePrimaryCtxRelease_v2) release = KREX_REAL(cuDevicePrimaryCtxRelease_v2);
    if (!release)
        release = KREX_REAL(cuDevicePrimaryCtxRelease);
    int ndev = 0;
    if (get_count && get_dev && get_state && retain && release &&
        get_count(&ndev) == CUDA_SUCCESS) {
        for (int d = 0; d < ndev && nprim < MAX_DEVICES; d++) {
            CUdevice dev;
            unsigned int flags = 0;
            int active = 0;
            CUcontext ctx = NULL;
            if (get_dev(&dev, d) == CUDA_SUCCESS &&
                get_state(dev, &flags, &active) == CUDA_SUCCESS && active &&
                retain(&ctx, dev) == CUDA_SUCCESS) {
                prim[nprim] = ctx;
                prim_dev[nprim++] = dev;
            }
        }
    }

    pthread_mutex_lock(&track_mu);
    /* All contexts, primaries first, without duplicates. */
    size_t nall = nprim;
    CUcontext *all = malloc((nprim + ctxs.n + 1) * sizeof *all);
    if (!all) {
        pthread_mutex_unlock(&track_mu);
        first = CUDA_ERROR_OUT_OF_MEMORY;
        goto release;
    }
    memcpy(all, prim, nprim * sizeof *all);
    for (size_t i = 0; i < ctxs.n; i++) {
        size_t j = 0;
        while (j < nall && all[j] != (CUcontext)ctxs.v[i])
            j++;
        if (j == nall)
            all[nall++] = (CUcontext)ctxs.v[i];
    }

    if (krex_captures() == 0) {
        for (size_t i = 0; i < nall; i++) {
            CUresult r = sync_ctx(all[i]);
            if (r == CUDA_ERROR_INVALID_CONTEXT || r == CUDA_ERROR_CONTEXT_IS_DESTROYED) {
                handles_remove(&ctxs, all[i]); /* gone without our seeing it */
                atomic_store_explicit(&last_current, NULL, memory_order_relaxed);
            }
            note(&first, r);
        }
    } else {
        /* Reference §3: context-wide synchronization (any thread, any
         * mode) invalidates an open capture; per-stream synchronization
         * from a thread in relaxed mode does not. */
        __typeof__(&cuThreadExchangeStreamCaptureMode) exch =
            KREX_REAL(cuThreadExchangeStreamCaptureMode);
        CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        if (exch && exch(&mode) == CUDA_SUCCESS) {
            note(&first, sync_streams_capture_safe(all, nall));
            if (app_thread)
                exch(&mode); /* give the application thread its mode back */
        } else {
            first = CUDA_ERROR_NOT_FOUND;
        }
    }
    pthread_mutex_unlock(&track_mu);
    free(all);

release:
    for (size_t i = 0; i < nprim; i++)
        release(prim_dev[i]);
    errno = saved;
    return first;
}

/* ---- the drainer thread --------------------------------------------------- */

static void *drainer_main(void *arg)
{
    struct krex_slot *s = arg;
    struct krex_gate *g = krex_gate_p;
    const uint32_t tenant = krex_tenant;
    for (;;) {
        /* seq before word (both seq_cst): a closure that this read of the
         * word misses bumps seq later, so the wait below returns. */
        uint32_t seen = atomic_load_explicit(&g->seq, memory_order_seq_cst);
        uint64_t w = atomic_load_explicit(&g->word, memory_order_seq_cst);
        uint32_t epoch = krex_gate_epoch(w);
        if (w != 0 && krex_gate_holder(w) != tenant &&
            atomic_load_explicit(&s->ack_epoch, memory_order_seq_cst) != epoch) {
            uint64_t t0 = krex_now_ns();
            /* 1. Every admitted call has returned; later ones see the
             *    closed word and park. */
            krex_gate_wait_idle(s);
            /* 2. Their work has left the GPU. */
            CUresult r = CUDA_SUCCESS;
            if (!atomic_load_explicit(&exiting, memory_order_relaxed))
                r = krex_sync_all(0);
            if (r == CUDA_ERROR_OUT_OF_MEMORY || r == CUDA_ERROR_NOT_FOUND) {
                /* Nothing was synchronized (no memory for the context list, or
                 * no capture-mode call while a capture is open): work may still
                 * be queued, so no acknowledgement.  The entry then fails with
                 * a drain timeout naming this process; the next closure retries. */
                krex_log(KREX_LOG_ERROR, "drain for epoch %u: could not synchronize (%d); "
                         "not acknowledging", epoch, (int)r);
                krex_gate_wait_seq(g, seen, -1);
                continue;
            }
            if (r != CUDA_SUCCESS)
                krex_log(KREX_LOG_WARN, "drain for epoch %u: synchronization returned %d; "
                         "acknowledging (a failed context runs no more work)", epoch, (int)r);
            /* 3. Acknowledge this epoch. */
            krex_gate_ack(g, s, epoch);
            uint64_t dt = krex_now_ns() - t0;
            atomic_store_explicit(&s->last_drain_ns, dt, memory_order_relaxed);
            krex_log(KREX_LOG_DEBUG, "drained for tenant %u epoch %u in %llu ns",
                     krex_gate_holder(w), epoch, (unsigned long long)dt);
        }
        krex_gate_wait_seq(g, seen, -1);
    }
    return NULL;
}

int krex_drainer_start(struct krex_slot *s)
{
    pthread_attr_t attr;
    pthread_t tid;
    sigset_t all, old;
    int err = pthread_attr_init(&attr);
    if (err)
        return err;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* The drainer takes no signal meant for the application: it starts
     * with every signal blocked. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    err = pthread_create(&tid, &attr, drainer_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (!err)
        pthread_setname_np(tid, "krex-drainer");
    return err;
}

/* At exit the driver tears its state down while the drainer may still be
 * parked: a drain that starts after this acknowledges without touching
 * the driver (the process's contexts die with it). */
__attribute__((destructor)) static void drain_exit(void)
{
    atomic_store_explicit(&exiting, 1, memory_order_relaxed);
}

/* ---- fork ------------------------------------------------------------------ */

void krex_drain_atfork_prepare(void) { pthread_mutex_lock(&track_mu); }

void krex_drain_atfork_parent(void) { pthread_mutex_unlock(&track_mu); }

void krex_drain_atfork_child(void)
{
    atomic_store_explicit(&last_current, NULL, memory_order_relaxed);
    handles_clear(&ctxs);
    handles_clear(&streams);
    atomic_store_explicit(&captures, 0, memory_order_relaxed);
    pthread_mutex_unlock(&track_mu);
}
