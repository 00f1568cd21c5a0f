/*
 * shim.c — the process layer of libkrex_shim (shim.h): initialisation from
 * the environment, registration with the gate, the slow paths of the
 * per-call protocol, abandoned calls, and the fork handlers (the one
 * pthread_atfork of the library, calling each unit's hooks in the order
 * written at "fork" below).  The variables it reads (KREX_GATE,
 * KREX_TENANT, KREX_SLOTS_FD / KREX_SLOTS, KREX_SHIM_LOG, KREX_SHIM_DEFER):
 * docs/design/interfaces.md "Environment of a tenant command"; without
 * KREX_GATE every hook passes through, and under krex a process that cannot
 * be drained fails closed (krex_refused: docs/design/shim.md "Fail closed").
 */
#include "shim.h"
#include "drain.h"
#include "gate_internal.h"
#include "hipinterpose.h"
#include "hiptrack.h"
#include "interpose.h"
#include "marks.h"
#include "memory.h"
#include "region.h"
#include "testhook.h"
#include "track.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* This image's identity for krexd (krex_slot.image, .pidns), set at init. */
static uint64_t my_image, my_pidns;
/* Why this process refuses GPU work (mode REFUSE), for krex_refused(). */
static char refuse_why[256];

/* Serializes registration (and holds off fork while a thread registers). */
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/* ---- fork ------------------------------------------------------------------ */

/* The library's one pthread_atfork (registered when gating starts, attach()):
 * every unit that keeps a lock or per-process state has a prepare / parent /
 * child hook, called from here and nowhere else.
 *
 *   prepare  takes every lock of the shim, outermost first, the order in
 *            which the units may nest them: registration (reg_mu, here),
 *            tracking (track.c), HIP tracking (hiptrack.c, a leaf: it never
 *            nests with track.c's), the L2 buffers (region.c), the memory
 *            accounting (memory.c, a leaf lock);
 *   parent   releases them in the reverse order;
 *   child    the child has its own pid and no drainer thread: it forgets
 *            the parent's slot (and registers at its first gated call),
 *            then each unit starts over, innermost first: memory, region,
 *            drain, HIP tracking, tracking (contexts and streams do not
 *            survive fork: the lists start empty), the thread marks;
 *            registration's lock last.
 *
 * The forking thread holds every lock across fork(), so the child never
 * inherits one held by a thread that does not exist there; both sides
 * release them (the child's only thread is their owner). */
static void atfork_prepare(void)
{
    pthread_mutex_lock(&reg_mu);
    krex_track_atfork_prepare();
    krex_hip_track_atfork_prepare();
    krex_region_atfork_prepare();
    krex_memory_atfork_prepare();
}

static void atfork_parent(void)
{
    krex_memory_atfork_parent();
    krex_region_atfork_parent();
    krex_hip_track_atfork_parent();
    krex_track_atfork_parent();
    pthread_mutex_unlock(&reg_mu);
}

static void atfork_child(void)
{
    atomic_store_explicit(&krex_slot_p, NULL, memory_order_release);
    krex_memory_atfork_child();
    krex_region_atfork_child();
    krex_drain_atfork_child();
    krex_hip_track_atfork_child();
    krex_track_atfork_child();
    krex_marks_atfork_child();
    pthread_mutex_unlock(&reg_mu);
}

/* ---- initialisation ------------------------------------------------------- */

static void thread_gone(void);

/* Fail closed: every later gated call returns CUDA_ERROR_NOT_PERMITTED,
 * and the first says why.  Called before the mode is published (init) or
 * under reg_mu (registration). */
static int refuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int refuse(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(refuse_why, sizeof refuse_why, fmt, ap);
    va_end(ap);
    return KREX_MODE_REFUSE;
}

static void say_refused(const char *name)
{
    static _Atomic int said;
    /* Relaxed: only decides who prints the one line. */
    if (!atomic_exchange_explicit(&said, 1, memory_order_relaxed))
        krex_log(KREX_LOG_ERROR,
                 "GPU work refused (%s failed): %s; krex cannot drain this process, so it may "
                 "not use the GPU beside other tenants",
                 name, refuse_why);
}

CUresult krex_refused(int idx)
{
    say_refused(krex_ep_desc[idx].name);
    return CUDA_ERROR_NOT_PERMITTED;
}

int krex_hip_refused(int idx)
{
    say_refused(krex_hip_ep_desc[idx].name);
    return KREX_HIP_ERROR_NOT_SUPPORTED;
}

/* The executable mapping that holds this function, as krex_slot.image
 * (start | pages): krexd finds it in /proc/<pid>/map_files while this
 * image lives; a program exec'd without the shim does not have it. */
static uint64_t image_token(void)
{
    uintptr_t here = (uintptr_t)&image_token;
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f)
        return 0;
    char line[512];
    uint64_t token = 0;
    while (fgets(line, sizeof line, f)) {
        uintptr_t lo, hi;
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR, &lo, &hi) == 2 && lo <= here && here < hi) {
            uint64_t pages = (uint64_t)(hi - lo) >> 12;
            if (pages <= KREX_IMAGE_PAGE_MASK && !(lo & KREX_IMAGE_PAGE_MASK))
                token = (uint64_t)lo | pages;
            break;
        }
    }
    fclose(f);
    return token;
}

/* The tenant's slot memory: the inherited fd KREX_SLOTS_FD if it is still
 * the right memfd, else the path KREX_SLOTS (the launcher's fd through
 * /proc, for processes whose parent closed the inherited one). */
static struct krex_tenant_mem *map_slots(uint32_t tenant, int *err)
{
    const char *fd_s = getenv("KREX_SLOTS_FD");
    const char *path = getenv("KREX_SLOTS");
    *err = ENOENT;
    if (fd_s && *fd_s) {
        char *end = NULL;
        long fd = strtol(fd_s, &end, 10);
        if (end && !*end && fd >= 0 && fd < INT32_MAX) {
            struct krex_tenant_mem *m = krex_tenant_mem_map((int)fd, tenant);
            if (m)
                return m;
            *err = errno;
        }
    }
    if (path && *path) {
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0) {
            *err = errno;
            return NULL;
        }
        struct krex_tenant_mem *m = krex_tenant_mem_map(fd, tenant);
        *err = errno;
        close(fd); /* the mapping stays */
        return m;
    }
    return NULL;
}

static const char *map_error(int err)
{
    return err == EPROTO ? "not a krex gate"
           : err == EPERM ? "not owned by root or writable by others: not krexd's"
                          : strerror(err);
}

/* Map the gate (read-only) and the slot memory; the mode to publish. */
static int attach(const char *path, uint32_t tenant)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    const struct krex_gate *g = fd >= 0 ? krex_gate_map(fd) : NULL;
    int err = errno;
    if (fd >= 0)
        close(fd); /* the mapping stays */
    uint32_t version = 0;
    if (!g && err == EPROTO && krex_gate_file_version(path, &version) == 0 &&
        version != KREX_GATE_VERSION)
        return refuse("cannot map gate %s: gate layout version %u, this libkrex_shim.so "
                      "expects %u (krexd and the shim come from different builds)",
                      path, version, KREX_GATE_VERSION);
    if (!g)
        return refuse("cannot map gate %s: %s", path, map_error(err));
    struct krex_tenant_mem *m = map_slots(tenant, &err);
    if (!m) {
        krex_gate_unmap(g);
        return refuse("cannot map the tenant's slot memory (KREX_SLOTS_FD/KREX_SLOTS): %s",
                      err == EPROTO ? "not this tenant's, or of another layout"
                      : err == EPERM ? "not a sealed memfd"
                                     : strerror(err));
    }
    struct stat st;
    my_pidns = stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
    my_image = image_token();
    /* After an execve this process keeps its pid but lost its drainer:
     * release what an earlier image of it registered. */
    int n = krex_gate_forget_pid(g, m, (int32_t)getpid(), my_pidns);
    if (n > 0)
        krex_log(KREX_LOG_INFO, "released %d slot(s) of an earlier image of this process", n);
    krex_gate_p = g;
    krex_tmem_p = m;
    krex_tenant = tenant;
    if (pthread_atfork(atfork_prepare, atfork_parent, atfork_child) != 0)
        return refuse("pthread_atfork failed");
    krex_marks_init(thread_gone); /* before the mode is published: marks.h */
    krex_log(KREX_LOG_INFO, "gating on: tenant %u, gate %s (GPU %u)", tenant, path, g->gpu);
    return KREX_MODE_GATING;
}

static void init_from_env(void)
{
    int saved = errno;
    krex_log_init();
    /* Before any context can be observed gone (the region's L2 buffers are
     * made only after initialisation): the region forgets its buffers. */
    krex_track_on_ctx_gone(krex_region_forget_ctx);
    const char *path = getenv("KREX_GATE");
    const char *tenant_s = getenv("KREX_TENANT");
    int mode = KREX_MODE_PASS;
    if (!path || !*path) {
        /* Not gated by krex (no krexd, or an exclusive lease).  A tenant
         * process that unset KREX_GATE is seen by krexd's fail-closed check
         * instead (it has the GPU open without a registration). */
        krex_log(KREX_LOG_DEBUG, "KREX_GATE unset: pass-through");
        goto out;
    }
    char *end = NULL;
    errno = 0;
    unsigned long long t = tenant_s ? strtoull(tenant_s, &end, 10) : 0;
    if (!tenant_s || errno || !end || *end || t == 0 || t > UINT32_MAX)
        mode = refuse("KREX_TENANT=%s is not a tenant id (1..%u)", tenant_s ? tenant_s : "",
                      UINT32_MAX);
    else
        mode = attach(path, (uint32_t)t);
    if (mode == KREX_MODE_REFUSE)
        krex_log(KREX_LOG_WARN, "%s: GPU work will be refused", refuse_why);
out:
    /* Release: krex_gate_p, krex_tmem_p and krex_tenant are visible to
     * every thread that reads the mode with acquire. */
    atomic_store_explicit(&krex_mode, mode, memory_order_release);
    errno = saved;
}

void krex_shim_init(void)
{
    if (KREX_LIKELY(atomic_load_explicit(&krex_mode, memory_order_acquire) != KREX_MODE_UNINIT))
        return;
    pthread_once(&init_once, init_from_env);
}

/* Initialise now unless KREX_SHIM_DEFER=1 (a warm pool's zygote): then the
 * first gated call, in a forked command, does it (krex_enter_slow). */
__attribute__((constructor)) static void krex_shim_ctor(void)
{
    const char *defer = getenv("KREX_SHIM_DEFER");
    if (defer && !strcmp(defer, "1"))
        return;
    krex_shim_init();
}

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
    int mode = atomic_load_explicit(&krex_mode, memory_order_acquire);
    if (mode != KREX_MODE_GATING) {
        pthread_mutex_unlock(&reg_mu);
        return mode == KREX_MODE_REFUSE ? KREX_REFUSED : NULL;
    }
    int idx = krex_gate_register(krex_gate_p, krex_tmem_p, krex_tenant, (int32_t)getpid(),
                                 my_image, my_pidns);
    if (idx < 0) {
        refuse("cannot register with the gate: %s",
               idx == -ENOSPC ? "every slot of this tenant is taken" : strerror(-idx));
        goto refused;
    }
    s = &krex_tmem_p->slots[idx];
    atomic_store_explicit(&s->captures, krex_captures(), memory_order_relaxed);
    int err = krex_drainer_start(s);
    if (err) {
        /* Without a drainer this process could not answer drains: give the
         * slot back (it has no GPU work yet) and refuse GPU work. */
        krex_gate_leave(s);
        krex_gate_forget_pid(krex_gate_p, krex_tmem_p, (int32_t)getpid(), my_pidns);
        refuse("cannot start the drainer thread: %s", strerror(err));
        goto refused;
    }
    /* Release: the slot's fields are set before any thread uses it. */
    atomic_store_explicit(&krex_slot_p, s, memory_order_release);
    pthread_mutex_unlock(&reg_mu);
    krex_log(KREX_LOG_DEBUG, "registered in slot %d", idx);
    return s;
refused:
    atomic_store_explicit(&krex_mode, KREX_MODE_REFUSE, memory_order_release);
    pthread_mutex_unlock(&reg_mu);
    return KREX_REFUSED;
}

struct krex_slot *krex_enter_slow(void)
{
    int saved = errno;
    krex_shim_init();
    struct krex_slot *s = NULL;
    int mode = atomic_load_explicit(&krex_mode, memory_order_acquire);
    if (mode == KREX_MODE_GATING) {
        s = atomic_load_explicit(&krex_slot_p, memory_order_acquire);
        if (s)
            krex_gate_enter(krex_gate_p, s, krex_tenant);
        else
            s = register_process();
    } else if (mode == KREX_MODE_REFUSE) {
        s = KREX_REFUSED;
    }
    errno = saved;
    return s;
}

/* ---- abandoned calls (docs/design/shim.md "Abandoned calls") -------------- */

/* Release what this thread's counted call holds: every count in its mark
 * (only this thread writes it), and, when its depth says a call is in
 * flight, the shared count or the capture lock that call took.  Called
 * only once that call is proven gone (its frame is dead, or the thread is
 * exiting). */
static void release_abandoned(void)
{
    struct krex_mark *m = krex_mark_self;
    if (m && atomic_load_explicit(&m->busy, memory_order_relaxed) != 0) {
        /* Release: the abandoned call's driver work happens-before the
         * drainer's acquire read of 0 (then it synchronizes), as for a
         * normal clear (marks.h). */
        atomic_store_explicit(&m->busy, 0, memory_order_release);
        /* seq_cst fence: the store above is ordered before the read of
         * the waiters count (a drainer that registered as a waiter before
         * its membarrier is woken); out of the fast path, so a real fence. */
        atomic_thread_fence(memory_order_seq_cst);
        if (atomic_load_explicit(&krex_mark_waiters, memory_order_relaxed) != 0)
            krex_mark_wake(m);
    }
    struct krex_slot *o = krex_outer;
    if (krex_depth != 0 && o != NULL) {
        if (o == KREX_CAPTURED)
            krex_capture_pass_end();
        else if (o != KREX_REFUSED && !((uintptr_t)o & KREX_MARKED))
            krex_gate_leave_inline(o); /* the shared count it took */
    }
    krex_outer = NULL;
    krex_frame = 0;
    krex_depth = 0;
}

/* Is the stack pointer `here` on this thread's alternate signal stack,
 * and `frame` not on it?  Then `frame` lies on another stack and its
 * address says nothing about its liveness (a handler on sigaltstack). */
static int on_other_stack(uintptr_t here, uintptr_t frame)
{
    stack_t ss;
    if (sigaltstack(NULL, &ss) != 0 || !(ss.ss_flags & SS_ONSTACK))
        return 0;
    uintptr_t lo = (uintptr_t)ss.ss_sp, hi = lo + ss.ss_size;
    return here >= lo && here < hi && !(frame >= lo && frame < hi);
}

int krex_reentry(uintptr_t here)
{
    int saved = errno;
    uintptr_t frame = krex_frame;
    /* The outer call's frame record holds its return address one word
     * above the frame address while the frame is live.  A frame that
     * lies at or below ours on this stack has returned or been abandoned
     * (longjmp'd out of): stacks grow down, and a live caller lies above
     * its callees.  One above ours is live if its record still holds the
     * hook's return address (an abandoned frame's memory, reused by a
     * deeper call chain, holds that chain's data; documented limit: it may
     * hold the same word by chance, then the call runs nested until a
     * later call from at or above the frame finds it out). */
    int live = 0;
    if (frame != 0) {
        /* A plain read of this thread's own stack (mapped: at or above a
         * frame it used); volatile: the compiler must not assume it. */
        uintptr_t ret = *(volatile const uintptr_t *)(frame + sizeof(uintptr_t));
        if (ret == krex_frame_ret)
            live = frame > here || on_other_stack(here, frame);
    }
    if (!live) {
        static _Atomic int said;
        release_abandoned();
        /* Relaxed: only decides who logs the one line. */
        if (!atomic_exchange_explicit(&said, 1, memory_order_relaxed))
            krex_log(KREX_LOG_WARN, "a gated call of this thread was abandoned (longjmp out "
                     "of a driver call?): its in-flight count is released");
    }
    errno = saved;
    return live;
}

static void thread_gone(void)
{
    /* At thread exit, on the exiting thread (a key destructor): no frame
     * of it is in a driver call any more, so whatever its count says is
     * abandoned (pthread_cancel or pthread_exit out of a call). */
    if (krex_depth != 0 ||
        (krex_mark_self && atomic_load_explicit(&krex_mark_self->busy, memory_order_relaxed)))
        krex_log(KREX_LOG_INFO, "a thread ended inside a gated call: its count is released");
    release_abandoned();
}

/* Is `stream` capturing?  The _ptsz query for the per-thread family: a
 * NULL stream means this thread's per-thread stream there.  A HIP stream:
 * the HIP runtime's query (hiptrack.c). */
static int stream_capturing(void *stream, int kind)
{
    if (kind == KREX_STREAM_HIP || kind == KREX_STREAM_HIP_SPT)
        return krex_hip_stream_capturing(stream, kind == KREX_STREAM_HIP_SPT);
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult r;
    if (kind == KREX_STREAM_CU_PTSZ) {
        __typeof__(&cuStreamIsCapturing_ptsz) f = KREX_REAL(cuStreamIsCapturing_ptsz);
        r = f ? f(stream, &st) : CUDA_ERROR_NOT_FOUND;
    } else {
        __typeof__(&cuStreamIsCapturing) f = KREX_REAL(cuStreamIsCapturing);
        r = f ? f(stream, &st) : CUDA_ERROR_NOT_FOUND;
    }
    return r == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
}

struct krex_slot *krex_enter_blocked(struct krex_slot *s, void *stream, int kind)
{
    int saved = errno;
    /* Only while this process has a capture open is the query worth it.
     * The check and the call are one step for the capture's end: the
     * capture lock is held (shared) from the check until krex_leave(), and
     * cuStreamEndCapture takes it exclusively, so a capture cannot end
     * between them and turn the uncounted call into device work. */
    if (krex_captures() != 0) {
        krex_capture_pass_begin();
        if (stream_capturing(stream, kind)) {
            KREX_TEST_POINT("capture_checked");
            errno = saved;
            return KREX_CAPTURED; /* captured: passes the closed gate, uncounted */
        }
        krex_capture_pass_end();
    }
    krex_gate_enter(krex_gate_p, s, krex_tenant);
    errno = saved;
    return s;
}

/* ---- exported ------------------------------------------------------------- */

/* krex_shim_region_begin/_end/_warm (region.c): the shim is initialised
 * first, as by every hook (a warm pool's command may call them before its
 * first driver call). */
KREX_EXPORT int krex_shim_region_begin(uint32_t epoch, int l2_flush)
{
    krex_shim_init();
    return krex_region_begin(epoch, l2_flush);
}

KREX_EXPORT int krex_shim_region_end(uint64_t *sync_ns, uint64_t *launches)
{
    krex_shim_init();
    return krex_region_end(sync_ns, launches);
}

KREX_EXPORT int krex_shim_region_warm(uint32_t budget_us)
{
    krex_shim_init();
    return krex_region_warm(budget_us);
}

/* 1 when gating is on in this process (interfaces.md "Shim symbols"). */
KREX_EXPORT int krex_shim_active(void)
{
    krex_shim_init();
    return atomic_load_explicit(&krex_mode, memory_order_acquire) == KREX_MODE_GATING;
}

/* The process's mode (enum krex_mode: 0 not initialised yet, 1 pass-through,
 * 2 gating, 3 refusing), read without initialising: a warm pool's zygote
 * serves only while it is 0 (docs/design/warm.md). */
KREX_EXPORT int krex_shim_mode(void)
{
    /* Acquire: pairs with the release store that publishes the mode. */
    return atomic_load_explicit(&krex_mode, memory_order_acquire);
}
