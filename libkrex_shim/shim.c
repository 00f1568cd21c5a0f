/*
 * shim.c — process state of libkrex_shim: initialisation from the
 * environment, registration with the gate, the slow paths of the per-call
 * protocol, fork handling, memory accounting and logging.
 *
 * Environment (docs/design/interfaces.md): KREX_GATE (gate file) and
 * KREX_TENANT (tenant id) turn gating on; without them, or when the gate
 * cannot be mapped, every hook is a pure pass-through.  KREX_SHIM_LOG =
 * debug|info|warn|error sets the stderr log level (default warn).
 */
#include "shim.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int krex_log_level = KREX_LOG_WARN;
_Atomic int krex_mode = KREX_MODE_UNINIT;
struct krex_gate *krex_gate_p;
uint32_t krex_tenant;
_Atomic(struct krex_slot *) krex_slot_p;
_Atomic uint64_t krex_launches;
__thread uint32_t krex_depth __attribute__((tls_model("initial-exec")));

/* Serializes registration (and holds off fork while a thread registers). */
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static _Atomic uint64_t mem_alloc_bytes, mem_allocs, mem_frees;

/* ---- logging -------------------------------------------------------------- */

void krex_log_write(int level, const char *func, const char *fmt, ...)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    int saved = errno;
    char buf[768];
    int n = snprintf(buf, sizeof buf, "krex-shim[%d] %s: %s: ", (int)getpid(),
                     names[level & 3], func);
    if (n < 0)
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof buf - 2)
        len = sizeof buf - 2;
    buf[len++] = '\n';
    /* One write(2): no stdio buffer, no allocation, lines do not interleave. */
    ssize_t w = write(STDERR_FILENO, buf, len);
    (void)w;
    errno = saved;
}

uint64_t krex_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- fork ------------------------------------------------------------------ */

/* The forking thread takes every lock of the shim, so the child never
 * inherits one held by a thread that does not exist there; both sides
 * release them (the child's only thread is their owner). */
static void atfork_prepare(void)
{
    pthread_mutex_lock(&reg_mu);
    krex_drain_atfork_prepare();
    krex_region_atfork_prepare();
}

static void atfork_parent(void)
{
    krex_region_atfork_parent();
    krex_drain_atfork_parent();
    pthread_mutex_unlock(&reg_mu);
}

/* The child has its own pid and no drainer thread: it forgets the parent's
 * slot and registers on its first gated call.  Contexts do not survive
 * fork, so the tracking lists start empty. */
static void atfork_child(void)
{
    atomic_store_explicit(&krex_slot_p, NULL, memory_order_release);
    krex_region_atfork_child();
    krex_drain_atfork_child();
    pthread_mutex_unlock(&reg_mu);
}

/* ---- initialisation ------------------------------------------------------- */

static int parse_level(const char *s)
{
    if (!s || !*s)
        return KREX_LOG_WARN;
    if (!strcmp(s, "debug"))
        return KREX_LOG_DEBUG;
    if (!strcmp(s, "info"))
        return KREX_LOG_INFO;
    if (!strcmp(s, "error"))
        return KREX_LOG_ERROR;
    return KREX_LOG_WARN;
}

static void init_from_env(void)
{
    int saved = errno;
    krex_log_level = parse_level(getenv("KREX_SHIM_LOG"));
    const char *path = getenv("KREX_GATE");
    const char *tenant_s = getenv("KREX_TENANT");
    int mode = KREX_MODE_PASS;
    if (!path || !*path || !tenant_s || !*tenant_s) {
        krex_log(KREX_LOG_DEBUG, "KREX_GATE or KREX_TENANT unset: pass-through");
        goto out;
    }
    char *end = NULL;
    errno = 0;
    unsigned long long t = strtoull(tenant_s, &end, 10);
    if (errno || !end || *end || t == 0 || t > UINT32_MAX) {
        krex_log(KREX_LOG_WARN, "KREX_TENANT=%s is not a tenant id (1..%u): pass-through",
                 tenant_s, UINT32_MAX);
        goto out;
    }
    struct krex_gate *g = krex_gate_open(path, 0, 0, 0, 0);
    if (!g) {
        int err = errno;
        uint32_t version = 0;
        if (err == EPROTO && krex_gate_file_version(path, &version) == 0)
            krex_log(KREX_LOG_WARN,
                     "cannot map gate %s: gate layout version %u, this libkrex_shim.so "
                     "expects %u (krexd and the shim come from different builds): "
                     "pass-through",
                     path, version, KREX_GATE_VERSION);
        else
            krex_log(KREX_LOG_WARN, "cannot map gate %s: %s: pass-through", path,
                     err == EPROTO ? "not a krex gate" : strerror(err));
        goto out;
    }
    /* After an execve this process keeps its pid but lost its drainer:
     * release what an earlier image of it registered. */
    int n = krex_gate_forget_pid(g, (int32_t)getpid());
    if (n > 0)
        krex_log(KREX_LOG_INFO, "released %d slot(s) of an earlier image of this process", n);
    krex_gate_p = g;
    krex_tenant = (uint32_t)t;
    if (pthread_atfork(atfork_prepare, atfork_parent, atfork_child) != 0) {
        krex_log(KREX_LOG_WARN, "pthread_atfork failed: pass-through");
        krex_gate_unmap(g);
        krex_gate_p = NULL;
        goto out;
    }
    mode = KREX_MODE_GATING;
    krex_log(KREX_LOG_INFO, "gating on: tenant %u, gate %s (GPU %u)", krex_tenant, path,
             g->gpu);
out:
    /* Release: krex_gate_p and krex_tenant are visible to every thread
     * that reads the mode with acquire. */
    atomic_store_explicit(&krex_mode, mode, memory_order_release);
    errno = saved;
}

void krex_shim_init(void)
{
    if (KREX_LIKELY(atomic_load_explicit(&krex_mode, memory_order_acquire) != KREX_MODE_UNINIT))
        return;
    pthread_once(&init_once, init_from_env);
}

__attribute__((constructor)) static void krex_shim_ctor(void) { krex_shim_init(); }

/* ---- registration and the slow paths ------------------------------------ */

/* Paper §4.2: "each context process registers before initializing or
 * submitting GPU work" — here, at its first gated call, which the
 * registration itself admits (krex_gate_register returns with the call
 * counted). */
static struct krex_slot *register_process(void)
{
    pthread_mutex_lock(&reg_mu);
    struct krex_slot *s = atomic_load_explicit(&krex_slot_p, memory_order_acquire);
    if (s) {
        pthread_mutex_unlock(&reg_mu);
        krex_gate_enter(krex_gate_p, s, krex_tenant);
        return s;
    }
    if (atomic_load_explicit(&krex_mode, memory_order_acquire) != KREX_MODE_GATING) {
        pthread_mutex_unlock(&reg_mu);
        return NULL;
    }
    int idx = krex_gate_register(krex_gate_p, krex_tenant, (int32_t)getpid());
    if (idx < 0) {
        krex_log(KREX_LOG_WARN, "cannot register with the gate: %s: this process runs ungated",
                 strerror(-idx));
        atomic_store_explicit(&krex_mode, KREX_MODE_PASS, memory_order_release);
        pthread_mutex_unlock(&reg_mu);
        return NULL;
    }
    s = &krex_gate_p->slots[idx];
    atomic_store_explicit(&s->captures, krex_captures(), memory_order_relaxed);
    int err = krex_drainer_start(s);
    if (err) {
        /* Without a drainer this process could not answer drains: give the
         * slot back (it has no GPU work yet) and run ungated, loudly. */
        krex_log(KREX_LOG_ERROR, "cannot start the drainer thread: %s: this process runs "
                 "ungated", strerror(err));
        krex_gate_leave(krex_gate_p, s);
        krex_gate_forget_pid(krex_gate_p, (int32_t)getpid());
        atomic_store_explicit(&krex_mode, KREX_MODE_PASS, memory_order_release);
        pthread_mutex_unlock(&reg_mu);
        return NULL;
    }
    /* Release: the slot's fields are set before any thread uses it. */
    atomic_store_explicit(&krex_slot_p, s, memory_order_release);
    pthread_mutex_unlock(&reg_mu);
    krex_log(KREX_LOG_DEBUG, "registered in slot %d", idx);
    return s;
}

struct krex_slot *krex_enter_slow(void)
{
    int saved = errno;
    krex_shim_init();
    struct krex_slot *s = NULL;
    if (atomic_load_explicit(&krex_mode, memory_order_acquire) == KREX_MODE_GATING) {
        s = atomic_load_explicit(&krex_slot_p, memory_order_acquire);
        if (s)
            krex_gate_enter(krex_gate_p, s, krex_tenant);
        else
            s = register_process();
    }
    errno = saved;
    return s;
}

/* Is `stream` capturing?  The _ptsz query for the per-thread family: a
 * NULL stream means this thread's per-thread stream there. */
static int stream_capturing(CUstream stream, int ptsz)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult r;
    if (ptsz) {
        __typeof__(&cuStreamIsCapturing_ptsz) f = KREX_REAL(cuStreamIsCapturing_ptsz);
        r = f ? f(stream, &st) : CUDA_ERROR_NOT_FOUND;
    } else {
        __typeof__(&cuStreamIsCapturing) f = KREX_REAL(cuStreamIsCapturing);
        r = f ? f(stream, &st) : CUDA_ERROR_NOT_FOUND;
    }
    return r == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
}

struct krex_slot *krex_enter_blocked(struct krex_slot *s, CUstream stream, int ptsz)
{
    int saved = errno;
    /* Only while this process has a capture open is the query worth it. */
    if (krex_captures() != 0 && stream_capturing(stream, ptsz)) {
        errno = saved;
        return NULL; /* captured: passes the closed gate, uncounted */
    }
    krex_gate_enter(krex_gate_p, s, krex_tenant);
    errno = saved;
    return s;
}

/* ---- memory accounting ---------------------------------------------------- */

void krex_note_alloc(CUresult r, uint64_t bytes)
{
    if (r != CUDA_SUCCESS)
        return;
    /* Statistics: relaxed. */
    atomic_fetch_add_explicit(&mem_alloc_bytes, bytes, memory_order_relaxed);
    atomic_fetch_add_explicit(&mem_allocs, 1, memory_order_relaxed);
}

void krex_note_free(CUresult r)
{
    if (r == CUDA_SUCCESS)
        atomic_fetch_add_explicit(&mem_frees, 1, memory_order_relaxed);
}

/* ---- exported ------------------------------------------------------------- */

/* 1 when gating is on in this process (interfaces.md "Shim symbols"). */
KREX_EXPORT int krex_shim_active(void)
{
    krex_shim_init();
    return atomic_load_explicit(&krex_mode, memory_order_acquire) == KREX_MODE_GATING;
}

/* Device memory seen allocated through the driver API (bytes, calls) and
 * frees seen (calls), since the process started.  Always 0. */
KREX_EXPORT int krex_shim_mem_stats(uint64_t *alloc_bytes, uint64_t *allocs, uint64_t *frees)
{
    if (alloc_bytes)
        *alloc_bytes = atomic_load_explicit(&mem_alloc_bytes, memory_order_relaxed);
    if (allocs)
        *allocs = atomic_load_explicit(&mem_allocs, memory_order_relaxed);
    if (frees)
        *frees = atomic_load_explicit(&mem_frees, memory_order_relaxed);
    return 0;
}
