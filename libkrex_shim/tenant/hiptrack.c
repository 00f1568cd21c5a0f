/*
 * hiptrack.c — what a drain must synchronize of the process's HIP work
 * (hiptrack.h): the devices it used (each thread's current device at its
 * first gated call, each made current or given a context), the streams it
 * created and the events recorded just before its captures began
 * (docs/design/shim.md "HIP gating").  Read as track.c's lists are: a
 * snapshot, then each handle claimed; captures share track.c's count and
 * lock with CUDA's.
 */
#include "hiptrack.h"
#include "hipinterpose.h"
#include "track.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HIP_EVENT_DISABLE_TIMING 0x2u /* hipEventDisableTiming */

__thread int krex_hip_thread_noted __attribute__((tls_model("initial-exec")));

/* Bit d: device d was used (bit 63: 63 or above).  Relaxed: read by the
 * drainer after the call that set a bit returned (its release, the
 * drainer's acquire of the counts), and a bit is never cleared but at fork. */
static _Atomic uint64_t devices;

struct entry {
    void *h;
    int device;
    pid_t tid;    /* pre-capture events of the per-thread stream: its thread */
    void *stream; /* pre-capture events: their stream */
};

struct list {
    struct entry *v;
    size_t n, cap;
};

/* Guards both lists and `busy`; held only for list operations, never
 * across a call that waits on the device (the command's threads take it in
 * hipStreamCreate / hipStreamDestroy and at fork). */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static struct list streams, precaps;
/* The stream a drain synchronizes right now (or whose pre-capture event
 * it does): its destroy waits until the drain moved on. */
static void *busy;

static void note_bit(int device)
{
    if (device < 0)
        return;
    uint64_t bit = 1ull << (device < 63 ? device : 63);
    if (!(atomic_load_explicit(&devices, memory_order_relaxed) & bit))
        atomic_fetch_or_explicit(&devices, bit, memory_order_relaxed);
}

static int current_device(void)
{
    krex_hip_abi_hipGetDevice *get = KREX_HIP_REAL(hipGetDevice);
    int d = 0;
    return get && get(&d) == KREX_HIP_SUCCESS ? d : -1;
}

void krex_hip_note_thread_device(void)
{
    int saved = errno;
    krex_hip_thread_noted = 1;
    note_bit(current_device());
    errno = saved;
}

void krex_hip_note_device(int r, int device)
{
    if (r == KREX_HIP_SUCCESS)
        note_bit(device);
}

uint64_t krex_hip_devices(void) { return atomic_load_explicit(&devices, memory_order_relaxed); }

/* ---- the lists ----------------------------------------------------------------- */

static int list_add(struct list *l, struct entry e)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        struct entry *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = e;
    return 0;
}

static struct entry *list_find(struct list *l, void *h)
{
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i].h == h)
            return &l->v[i];
    return NULL;
}

static struct krex_hip_tracked *snapshot(struct list *l, size_t *n, int *oom)
{
    pthread_mutex_lock(&mu);
    *n = l->n;
    struct krex_hip_tracked *v = NULL;
    if (*n && !(v = malloc(*n * sizeof *v)))
        *oom = 1;
    for (size_t i = 0; v && i < *n; i++)
        v[i] = (struct krex_hip_tracked){l->v[i].h, l->v[i].device};
    pthread_mutex_unlock(&mu);
    if (!v)
        *n = 0;
    return v;
}

struct krex_hip_tracked *krex_hip_stream_snapshot(size_t *n, int *oom)
{
    return snapshot(&streams, n, oom);
}

struct krex_hip_tracked *krex_hip_precap_snapshot(size_t *n, int *oom)
{
    return snapshot(&precaps, n, oom);
}

int krex_hip_claim(void *h, int precap)
{
    pthread_mutex_lock(&mu);
    struct entry *e = list_find(precap ? &precaps : &streams, h);
    if (e)
        busy = precap ? e->stream : e->h;
    pthread_mutex_unlock(&mu);
    return e != NULL;
}

void krex_hip_unclaim(void)
{
    pthread_mutex_lock(&mu);
    busy = NULL;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

/* ---- streams --------------------------------------------------------------------- */

void krex_hip_note_stream_created(int r, void *pstream)
{
    void *s = r == KREX_HIP_SUCCESS && pstream ? *(void **)pstream : NULL;
    if (!s)
        return;
    int saved = errno;
    int device = current_device(); /* a host query, outside the lock */
    note_bit(device);
    pthread_mutex_lock(&mu);
    if (!list_find(&streams, s) && list_add(&streams, (struct entry){s, device, 0, s}) != 0)
        krex_log(KREX_LOG_ERROR, "out of memory: HIP stream %p not tracked for drains", s);
    pthread_mutex_unlock(&mu);
    errno = saved;
}

void krex_hip_note_stream_destroying(void *stream)
{
    if (!stream || stream == KREX_HIP_STREAM_PER_THREAD)
        return;
    int saved = errno;
    void *dead[8];
    size_t ndead = 0;
    pthread_mutex_lock(&mu);
    struct entry *e = list_find(&streams, stream);
    if (e)
        *e = streams.v[--streams.n];
    while (busy == stream)
        pthread_cond_wait(&cv, &mu);
    for (size_t i = 0; i < precaps.n;) {
        if (precaps.v[i].stream == stream) {
            if (ndead < sizeof dead / sizeof dead[0])
                dead[ndead++] = precaps.v[i].h;
            precaps.v[i] = precaps.v[--precaps.n];
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&mu);
    krex_hip_abi_hipEventDestroy *destroy = KREX_HIP_REAL(hipEventDestroy);
    for (size_t i = 0; destroy && i < ndead; i++)
        destroy(dead[i]);
    errno = saved;
}

/* ---- captures -------------------------------------------------------------------- */

void krex_hip_capture_begin_pre(void *stream)
{
    if (atomic_load_explicit(&krex_mode, memory_order_acquire) != KREX_MODE_GATING)
        return;
    int saved = errno;
    pid_t tid = stream == NULL || stream == KREX_HIP_STREAM_PER_THREAD ? gettid() : 0;
    krex_hip_abi_hipEventCreateWithFlags *create = KREX_HIP_REAL(hipEventCreateWithFlags);
    krex_hip_abi_hipEventRecord *record = KREX_HIP_REAL(hipEventRecord);
    krex_hip_abi_hipEventDestroy *destroy = KREX_HIP_REAL(hipEventDestroy);
    if (!create || !record || !destroy)
        goto out;
    void *ev = NULL;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < precaps.n; i++)
        if (precaps.v[i].stream == stream && precaps.v[i].tid == tid) {
            ev = precaps.v[i].h;
            break;
        }
    pthread_mutex_unlock(&mu);
    int fresh = ev == NULL;
    if (fresh && create(&ev, HIP_EVENT_DISABLE_TIMING) != KREX_HIP_SUCCESS)
        goto out;
    /* Re-recording an event a drain may be synchronizing is allowed (this
     * call is counted: no drain is acknowledged before it returns). */
    uint32_t r = record(ev, stream);
    if (r != KREX_HIP_SUCCESS) {
        krex_log(KREX_LOG_WARN, "capture on HIP stream %p: no event before it (%u): work "
                 "queued there before the capture is not drained", stream, r);
        if (fresh)
            destroy(ev);
        goto out;
    }
    if (fresh) {
        int device = current_device();
        pthread_mutex_lock(&mu);
        if (list_add(&precaps, (struct entry){ev, device, tid, stream}) != 0)
            krex_log(KREX_LOG_ERROR, "out of memory: the event before a HIP capture is not "
                     "tracked");
        pthread_mutex_unlock(&mu);
    }
out:
    errno = saved;
}

/* hipErrorStreamCaptureInvalidated: the end of an invalidated capture ends
 * it too (the same number as CUDA's). */
#define HIP_ERROR_CAPTURE_INVALIDATED 901

void krex_hip_note_capture_begin(int r)
{
    krex_note_capture_begin(r == KREX_HIP_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
}

void krex_hip_note_capture_end(int r)
{
    krex_note_capture_end(r == KREX_HIP_SUCCESS                 ? CUDA_SUCCESS
                          : r == HIP_ERROR_CAPTURE_INVALIDATED ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
                                                               : CUDA_ERROR_UNKNOWN);
}

int krex_hip_stream_capturing(void *stream, int spt)
{
    krex_hip_abi_hipStreamIsCapturing *f = KREX_HIP_REAL(hipStreamIsCapturing);
    int32_t st = 0; /* hipStreamCaptureStatusNone */
    if (spt && stream == NULL)
        stream = KREX_HIP_STREAM_PER_THREAD;
    return f && f(stream, &st) == KREX_HIP_SUCCESS && st != 0;
}

/* ---- fork ------------------------------------------------------------------------ */

void krex_hip_track_atfork_prepare(void) { pthread_mutex_lock(&mu); }

void krex_hip_track_atfork_parent(void) { pthread_mutex_unlock(&mu); }

void krex_hip_track_atfork_child(void)
{
    /* The parent's streams and events are not the child's; the devices
     * stay noted (a child's synchronization of a device it cannot use
     * fails harmlessly). */
    pthread_cond_init(&cv, NULL);
    busy = NULL;
    free(streams.v);
    free(precaps.v);
    memset(&streams, 0, sizeof streams);
    memset(&precaps, 0, sizeof precaps);
    pthread_mutex_unlock(&mu);
}
