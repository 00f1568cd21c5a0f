/*
 * track.c — what a drain must synchronize: the contexts and streams this
 * process uses, and its open stream captures (docs/design/shim.md "The
 * drainer and capture").  The drainer (drain.c) reads them through track.h:
 * a snapshot of a list, then each handle claimed for its synchronization.
 * Captures: a count of those open in the process, and a read-write lock
 * that makes an uncounted launch's "is this stream capturing?" check and the
 * launch itself atomic with respect to that capture's end
 * (krex_capture_pass / krex_capture_end_begin).
 */
#include "track.h"
#include "interpose.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct handles {
    struct krex_tracked *v;
    size_t n, cap;
};

/* Guards both lists and `busy`.  Held only for list operations, never
 * across a driver call that waits on the device: the command's own
 * threads take it in cuStreamCreate / cuStreamDestroy / cuCtxDestroy
 * hooks and at fork, and must not wait behind a drain (a kernel waiting
 * for host progress made after such a call would deadlock). */
static pthread_mutex_t track_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t track_cv = PTHREAD_COND_INITIALIZER;
static struct handles ctxs;    /* created through the API or made current */
static struct handles streams; /* created through the API; owner = context */
/* The handle a drain is synchronizing right now (and its context): a
 * destroy of either waits until the drain moved on, so the driver never
 * gets a handle freed under it (stream destruction is not gated). */
static void *busy, *busy_ctx;
static _Atomic uint32_t captures;
/* Events recorded just before a capture began (krex_capture_begin_pre):
 * one per (stream, thread) pair; the thread matters only for the
 * per-thread stream handles (CU_STREAM_PER_THREAD, NULL in the _ptsz
 * family), which name another stream on each thread. */
struct precap_entry {
    struct krex_precap p;
    pid_t tid; /* 0 unless the handle is per-thread */
};
static struct precap_entry *precaps;
static size_t nprecaps, precap_cap;
/* Readers: an uncounted launch into a capturing stream, from the check to
 * the call's return; writer: cuStreamEndCapture.  Writers are preferred so
 * that a stream of captured launches cannot starve the end of a capture. */
static pthread_rwlock_t capture_rw = PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;
/* krex_track_on_ctx_gone: what an upper layer forgets of a context gone. */
static void (*_Atomic ctx_gone)(CUcontext);

/* ---- the lists -------------------------------------------------------------- */

static struct krex_tracked *handles_find(struct handles *h, void *p)
{
    for (size_t i = 0; i < h->n; i++)
        if (h->v[i].h == p)
            return &h->v[i];
    return NULL;
}

static void handles_add(struct handles *h, void *p, void *owner)
{
    if (handles_find(h, p))
        return; /* already tracked (a green context's keeps its owner) */
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 16;
        struct krex_tracked *v = realloc(h->v, cap * sizeof *v);
        if (!v) {
            krex_log(KREX_LOG_ERROR, "out of memory: handle %p not tracked for drains", p);
            return;
        }
        h->v = v;
        h->cap = cap;
    }
    h->v[h->n++] = (struct krex_tracked){p, owner};
}

static void handles_remove(struct handles *h, void *p)
{
    for (size_t i = 0; i < h->n; i++)
        if (h->v[i].h == p) {
            h->v[i] = h->v[--h->n];
            return;
        }
}

/* Remove every entry owned by `owner` (a context's streams). */
static void handles_remove_owned(struct handles *h, void *owner)
{
    for (size_t i = 0; i < h->n;)
        if (h->v[i].owner == owner)
            h->v[i] = h->v[--h->n];
        else
            i++;
}

static void handles_clear(struct handles *h)
{
    free(h->v);
    h->v = NULL;
    h->n = h->cap = 0;
}

/* Frameworks make the same context current over and over: the last one
 * recorded is remembered so that the repeat costs one load, no lock.  It
 * is written under track_mu only, together with the list, so it always
 * names a tracked context (or NULL). */
static _Atomic(CUcontext) last_current;

/* Under track_mu: forget context `ctx` and its streams; then wait until a
 * drain synchronizing it (or one of its streams) has moved on. */
/* Under track_mu: drop the pre-capture events of `stream` (NULL: any) in
 * context `ctx` (NULL: any); their handles go to `dead` (up to *ndead),
 * destroyed by the caller outside the lock. */
static void precap_remove_locked(CUstream stream, CUcontext ctx, CUevent *dead, size_t *ndead,
                                 size_t max)
{
    for (size_t i = 0; i < nprecaps;) {
        if ((!stream || precaps[i].p.stream == stream) && (!ctx || precaps[i].p.ctx == ctx)) {
            if (*ndead < max)
                dead[(*ndead)++] = precaps[i].p.ev;
            precaps[i] = precaps[--nprecaps];
        } else {
            i++;
        }
    }
}

static void destroy_events(const CUevent *ev, size_t n)
{
    __typeof__(&cuEventDestroy_v2) destroy = KREX_REAL(cuEventDestroy_v2);
    for (size_t i = 0; destroy && i < n; i++)
        destroy(ev[i]);
}

static void forget_ctx_locked(CUcontext ctx)
{
    handles_remove(&ctxs, ctx);
    handles_remove_owned(&streams, ctx);
    /* The context's events die with it: forgotten, not destroyed. */
    size_t nd = 0;
    precap_remove_locked(NULL, ctx, NULL, &nd, 0);
    /* Relaxed: written and read under track_mu (the lock orders it). */
    if (atomic_load_explicit(&last_current, memory_order_relaxed) == ctx)
        atomic_store_explicit(&last_current, NULL, memory_order_relaxed);
    while (busy_ctx == (void *)ctx)
        pthread_cond_wait(&track_cv, &track_mu);
}

/* The context of `stream` (its owner for the tracking list). */
static CUcontext stream_ctx(CUstream stream)
{
    __typeof__(&cuStreamGetCtx) get = KREX_REAL(cuStreamGetCtx);
    CUcontext ctx = NULL;
    if (!get || get(stream, &ctx) != CUDA_SUCCESS)
        return NULL;
    return ctx;
}

void krex_note_stream_created(CUresult r, CUstream *phStream)
{
    if (r != CUDA_SUCCESS || !phStream || !*phStream)
        return;
    int saved = errno;
    CUcontext ctx = stream_ctx(*phStream); /* a host query, outside the lock */
    pthread_mutex_lock(&track_mu);
    handles_add(&streams, *phStream, ctx);
    pthread_mutex_unlock(&track_mu);
    errno = saved;
}

void krex_note_stream_destroying(CUstream stream)
{
    if (!stream || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD)
        return;
    int saved = errno;
    CUevent dead[8];
    size_t ndead = 0;
    pthread_mutex_lock(&track_mu);
    handles_remove(&streams, stream);
    /* busy is the stream while a drain syncs it or its pre-capture event. */
    while (busy == (void *)stream)
        pthread_cond_wait(&track_cv, &track_mu);
    precap_remove_locked(stream, NULL, dead, &ndead, sizeof dead / sizeof dead[0]);
    pthread_mutex_unlock(&track_mu);
    destroy_events(dead, ndead);
    errno = saved;
}

void krex_capture_begin_pre(CUstream stream, int ptsz)
{
    if (atomic_load_explicit(&krex_mode, memory_order_acquire) != KREX_MODE_GATING)
        return;
    int saved = errno;
    int per_thread = stream == CU_STREAM_PER_THREAD || (ptsz && stream == NULL);
    pid_t tid = per_thread ? gettid() : 0;
    CUcontext ctx = NULL;
    __typeof__(&cuCtxGetCurrent) get_cur = KREX_REAL(cuCtxGetCurrent);
    if (!stream || stream == CU_STREAM_LEGACY || per_thread) {
        if (get_cur)
            get_cur(&ctx);
    } else {
        ctx = stream_ctx(stream);
    }
    __typeof__(&cuEventCreate) create = KREX_REAL(cuEventCreate);
    __typeof__(&cuEventRecord) record = KREX_REAL(cuEventRecord);
    __typeof__(&cuEventRecord_ptsz) record_ptsz = KREX_REAL(cuEventRecord_ptsz);
    if (!ctx || !create || !record || (ptsz && !record_ptsz))
        goto out;
    CUevent ev = NULL;
    pthread_mutex_lock(&track_mu);
    for (size_t i = 0; i < nprecaps; i++)
        if (precaps[i].p.stream == stream && precaps[i].tid == tid && precaps[i].p.ctx == ctx) {
            ev = precaps[i].p.ev;
            break;
        }
    pthread_mutex_unlock(&track_mu);
    int fresh = ev == NULL;
    if (fresh && create(&ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
        goto out;
    /* Re-recording an event a drain may be synchronizing is allowed: the
     * drain then waits for the new record or the old one, both before the
     * capture (this call is counted, so no drain is acknowledged before it
     * returns anyway). */
    CUresult r = ptsz ? record_ptsz(ev, stream) : record(ev, stream);
    if (r != CUDA_SUCCESS) {
        krex_log(KREX_LOG_WARN, "capture on stream %p: no event before it (%d): work "
                 "queued there before the capture is not drained", (void *)stream, (int)r);
        if (fresh) {
            __typeof__(&cuEventDestroy_v2) destroy = KREX_REAL(cuEventDestroy_v2);
            if (destroy)
                destroy(ev);
        }
        goto out;
    }
    if (fresh) {
        pthread_mutex_lock(&track_mu);
        if (nprecaps == precap_cap) {
            size_t cap = precap_cap ? 2 * precap_cap : 16;
            struct precap_entry *v = realloc(precaps, cap * sizeof *v);
            if (v) {
                precaps = v;
                precap_cap = cap;
            }
        }
        if (nprecaps < precap_cap)
            precaps[nprecaps++] = (struct precap_entry){{ev, stream, ctx}, tid};
        else
            krex_log(KREX_LOG_ERROR, "out of memory: the event before a capture is not tracked");
        pthread_mutex_unlock(&track_mu);
    }
out:
    errno = saved;
}

struct krex_precap *krex_precap_snapshot(size_t *n, int *oom)
{
    pthread_mutex_lock(&track_mu);
    *n = nprecaps;
    struct krex_precap *v = NULL;
    if (*n && !(v = malloc(*n * sizeof *v)))
        *oom = 1;
    for (size_t i = 0; v && i < *n; i++)
        v[i] = precaps[i].p;
    pthread_mutex_unlock(&track_mu);
    if (!v)
        *n = 0;
    return v;
}

int krex_precap_claim(CUevent ev)
{
    pthread_mutex_lock(&track_mu);
    int ok = 0;
    for (size_t i = 0; i < nprecaps; i++)
        if (precaps[i].p.ev == ev) {
            /* A destroy of its stream or context waits until unclaimed. */
            busy = precaps[i].p.stream;
            busy_ctx = precaps[i].p.ctx;
            ok = 1;
            break;
        }
    pthread_mutex_unlock(&track_mu);
    return ok;
}

void krex_note_ctx_created(CUresult r, CUcontext *pctx)
{
    if (r != CUDA_SUCCESS || !pctx || !*pctx)
        return;
    int saved = errno;
    pthread_mutex_lock(&track_mu);
    handles_add(&ctxs, *pctx, NULL);
    pthread_mutex_unlock(&track_mu);
    errno = saved;
}

/* A green context's work runs in the context converted from it
 * (cuCtxFromGreenCtx): track that one, owned by the green context. */
void krex_note_green_created(CUresult r, CUgreenCtx *phCtx)
{
    if (r != CUDA_SUCCESS || !phCtx || !*phCtx)
        return;
    int saved = errno;
    __typeof__(&cuCtxFromGreenCtx) conv = KREX_REAL(cuCtxFromGreenCtx);
    CUcontext ctx = NULL;
    if (!conv || conv(&ctx, *phCtx) != CUDA_SUCCESS || !ctx) {
        krex_log(KREX_LOG_WARN, "green context %p: no context to synchronize it through",
                 (void *)*phCtx);
    } else {
        pthread_mutex_lock(&track_mu);
        handles_add(&ctxs, ctx, *phCtx);
        pthread_mutex_unlock(&track_mu);
    }
    errno = saved;
}

void krex_note_green_destroying(CUgreenCtx green)
{
    if (!green)
        return;
    int saved = errno;
    pthread_mutex_lock(&track_mu);
    for (size_t i = 0; i < ctxs.n; i++)
        if (ctxs.v[i].owner == (void *)green) {
            forget_ctx_locked((CUcontext)ctxs.v[i].h);
            break;
        }
    pthread_mutex_unlock(&track_mu);
    errno = saved;
}

/* Is `ctx` still a context (not destroyed)?  Without the query, assume so. */
static int ctx_alive(CUcontext ctx)
{
    __typeof__(&cuCtxGetApiVersion) ver = KREX_REAL(cuCtxGetApiVersion);
    unsigned int v = 0;
    return !ver || ver(ctx, &v) == CUDA_SUCCESS;
}

void krex_note_ctx_current(CUresult r, CUcontext ctx)
{
    /* Relaxed: a hint; a stale read only takes the locked path. */
    if (r != CUDA_SUCCESS || !ctx ||
        atomic_load_explicit(&last_current, memory_order_relaxed) == ctx)
        return;
    int saved = errno;
    pthread_mutex_lock(&track_mu);
    /* Another thread may have destroyed `ctx` after it was made current
     * here; its removal note takes this lock after the driver destroyed
     * it, so checking liveness under the lock never re-adds a dead one. */
    if (handles_find(&ctxs, ctx) || ctx_alive(ctx)) {
        handles_add(&ctxs, ctx, NULL);
        atomic_store_explicit(&last_current, ctx, memory_order_relaxed);
    }
    pthread_mutex_unlock(&track_mu);
    errno = saved;
}

void krex_note_ctx_destroying(CUcontext ctx)
{
    if (!ctx)
        return;
    int saved = errno;
    pthread_mutex_lock(&track_mu);
    forget_ctx_locked(ctx);
    pthread_mutex_unlock(&track_mu);
    errno = saved;
}

void krex_note_ctx_destroyed(CUresult r, CUcontext ctx)
{
    if (r != CUDA_SUCCESS || !ctx)
        return;
    int saved = errno;
    /* Again after the call: a set-current racing with the destroy may
     * have re-added it between the pre-call removal and the destroy. */
    pthread_mutex_lock(&track_mu);
    forget_ctx_locked(ctx);
    pthread_mutex_unlock(&track_mu);
    void (*gone)(CUcontext) = atomic_load_explicit(&ctx_gone, memory_order_acquire);
    if (gone)
        gone(ctx);
    errno = saved;
}

void krex_track_on_ctx_gone(void (*fn)(CUcontext ctx))
{
    /* Release, paired with the acquire load above: set once at
     * initialisation, read by any thread's destroy observation. */
    atomic_store_explicit(&ctx_gone, fn, memory_order_release);
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
 * capture invalidated; other errors leave it open.  Called after the call,
 * with the capture lock its pre-call hook took (krex_capture_end_begin):
 * released here, after the count changed. */
void krex_note_capture_end(CUresult r)
{
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) {
        pthread_rwlock_unlock(&capture_rw);
        return;
    }
    uint32_t n = atomic_load_explicit(&captures, memory_order_acquire);
    while (n > 0 && !atomic_compare_exchange_weak_explicit(&captures, &n, n - 1,
                                                           memory_order_acq_rel,
                                                           memory_order_acquire))
        ;
    mirror_captures(n > 0 ? n - 1 : 0);
    pthread_rwlock_unlock(&capture_rw);
}

uint32_t krex_captures(void)
{
    return atomic_load_explicit(&captures, memory_order_acquire);
}

/* ---- claims (track.h) -------------------------------------------------------- */

/* While claimed, a destroy of the handle or of its context waits in its
 * hook (forget_ctx_locked, krex_note_stream_destroying), so the handle
 * stays valid for the drain. */
int krex_track_claim(enum krex_track_list which, void *h, void *ctx)
{
    struct handles *list = which == KREX_TRACK_CTXS ? &ctxs : &streams;
    pthread_mutex_lock(&track_mu);
    int ok = handles_find(list, h) != NULL;
    if (ok) {
        busy = h;
        busy_ctx = ctx;
    }
    pthread_mutex_unlock(&track_mu);
    return ok;
}

void krex_track_unclaim(void)
{
    pthread_mutex_lock(&track_mu);
    busy = busy_ctx = NULL;
    pthread_cond_broadcast(&track_cv);
    pthread_mutex_unlock(&track_mu);
}

struct krex_tracked *krex_track_snapshot(enum krex_track_list which, size_t *n, int *oom)
{
    struct handles *list = which == KREX_TRACK_CTXS ? &ctxs : &streams;
    pthread_mutex_lock(&track_mu);
    *n = list->n;
    struct krex_tracked *v = NULL;
    if (*n && !(v = malloc(*n * sizeof *v)))
        *oom = 1;
    else if (*n)
        memcpy(v, list->v, *n * sizeof *v);
    pthread_mutex_unlock(&track_mu);
    if (!v)
        *n = 0;
    return v;
}

/* ---- capture passes ---------------------------------------------------------- */

void krex_capture_pass_begin(void) { pthread_rwlock_rdlock(&capture_rw); }

void krex_capture_pass_end(void) { pthread_rwlock_unlock(&capture_rw); }

void krex_capture_end_begin(void)
{
    int saved = errno;
    pthread_rwlock_wrlock(&capture_rw);
    errno = saved;
}

/* ---- fork -------------------------------------------------------------------- */

void krex_track_atfork_prepare(void) { pthread_mutex_lock(&track_mu); }

void krex_track_atfork_parent(void) { pthread_mutex_unlock(&track_mu); }

void krex_track_atfork_child(void)
{
    /* Contexts do not survive fork: the lists start empty, no capture is
     * open, nothing is claimed, and no other thread holds the capture
     * lock in the child. */
    pthread_cond_init(&track_cv, NULL);
    busy = busy_ctx = NULL;
    atomic_store_explicit(&last_current, NULL, memory_order_relaxed);
    handles_clear(&ctxs);
    handles_clear(&streams);
    free(precaps);
    precaps = NULL;
    nprecaps = precap_cap = 0;
    atomic_store_explicit(&captures, 0, memory_order_relaxed);
    pthread_rwlock_t fresh = PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;
    capture_rw = fresh; /* a reader of the parent's may have held it at fork */
    pthread_mutex_unlock(&track_mu);
}
