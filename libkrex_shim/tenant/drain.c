/*
 * drain.c — the drainer thread (paper §4.2 step 3: docs/design/architecture.md
 * "The region protocol, step by step") and the synchronization it runs; what
 * to synchronize comes from track.c (track.h).  On a closure by another
 * tenant the drainer waits for the process's calls in flight, synchronizes
 * its contexts (through the REAL driver functions), then acknowledges the
 * epoch; with a capture open, per-stream instead.  No lock the command's own
 * threads need is held while the device is waited on, and at exit nothing
 * acknowledges without synchronizing: docs/design/shim.md "The drainer and
 * capture", "Exit" (and "exit" below).
 */
#include "drain.h"
#include "fault.h"
#include "gate_internal.h"
#include "hipdrain.h"
#include "interpose.h"
#include "marks.h"
#include "track.h"

#include <errno.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "testhook.h"

#define MAX_DEVICES 64
/* How long the exit path waits for calls counted in the threads' marks. */
#define MARKS_AT_EXIT_NS 1000000000LL

/* Serializes the synchronizations themselves (the drainer and a holder's
 * region exit); never taken by a driver call's hook. */
static pthread_mutex_t sync_mu = PTHREAD_MUTEX_INITIALIZER;

/* Exit (see drain_at_exit below): seq_cst flags of a Dekker pairing
 * between the drainer (drain_busy = 1; read exiting) and the exit path
 * (exiting = 1; read drain_busy), so that the driver's teardown, which
 * follows the exit path, never runs under a drain. */
static _Atomic int exiting;
static _Atomic int drain_busy;

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
    krex_fault_note(r, 1); /* a fatal error found by a drain or at exit (fault.c) */
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

static CUresult sync_streams_capture_safe(CUcontext *all, const int *tracked, size_t nall)
{
    CUresult first = CUDA_SUCCESS;
    __typeof__(&cuStreamIsCapturing) is_capturing = KREX_REAL(cuStreamIsCapturing);
    __typeof__(&cuStreamSynchronize) ssync = KREX_REAL(cuStreamSynchronize);
    if (!is_capturing || !ssync)
        return CUDA_ERROR_NOT_FOUND;
    size_t n = 0;
    int oom = 0;
    struct krex_tracked *sv = krex_track_snapshot(KREX_TRACK_STREAMS, &n, &oom);
    if (oom)
        return CUDA_ERROR_OUT_OF_MEMORY;
    for (size_t i = 0; i < n; i++) {
        if (!krex_track_claim(KREX_TRACK_STREAMS, sv[i].h, sv[i].owner))
            continue; /* destroyed since the snapshot */
        KREX_TEST_POINT("drain_stream_claimed");
        CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
        CUresult r = is_capturing((CUstream)sv[i].h, &st);
        if (r == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_NONE)
            r = ssync((CUstream)sv[i].h);
        krex_track_unclaim();
        note(&first, r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ? CUDA_SUCCESS : r);
    }
    free(sv);
    /* Work queued on a stream before its capture began: the event recorded
     * just before (track.c).  An event synchronize from this relaxed-mode
     * thread leaves every capture alone. */
    __typeof__(&cuEventSynchronize) esync = KREX_REAL(cuEventSynchronize);
    struct krex_precap *pv = krex_precap_snapshot(&n, &oom);
    if (oom || (n && !esync)) {
        free(pv);
        return oom ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_NOT_FOUND;
    }
    for (size_t i = 0; i < n; i++) {
        if (!krex_precap_claim(pv[i].ev))
            continue; /* its stream or context went since the snapshot */
        note(&first, esync(pv[i].ev));
        krex_track_unclaim();
    }
    free(pv);
    for (size_t i = 0; i < nall; i++) {
        /* Primaries are retained by the caller; tracked contexts claimed. */
        if (tracked[i] && !krex_track_claim(KREX_TRACK_CTXS, all[i], all[i]))
            continue;
        note(&first, sync_legacy_stream(all[i]));
        if (tracked[i])
            krex_track_unclaim();
    }
    return first;
}

/* Active primary contexts, retained so that their handles stay valid until
 * released by release_primaries().  Returns how many. */
static size_t retain_primaries(CUcontext *prim, CUdevice *prim_dev)
{
    __typeof__(&cuDeviceGetCount) get_count = KREX_REAL(cuDeviceGetCount);
    __typeof__(&cuDeviceGet) get_dev = KREX_REAL(cuDeviceGet);
    __typeof__(&cuDevicePrimaryCtxGetState) get_state = KREX_REAL(cuDevicePrimaryCtxGetState);
    __typeof__(&cuDevicePrimaryCtxRetain) retain = KREX_REAL(cuDevicePrimaryCtxRetain);
    int ndev = 0;
    size_t nprim = 0;
    if (!get_count || !get_dev || !get_state || !retain || get_count(&ndev) != CUDA_SUCCESS)
        return 0;
    for (int d = 0; d < ndev && nprim < MAX_DEVICES; d++) {
        CUdevice dev;
        unsigned int flags = 0;
        int active = 0;
        CUcontext ctx = NULL;
        if (get_dev(&dev, d) == CUDA_SUCCESS && get_state(dev, &flags, &active) == CUDA_SUCCESS &&
            active && retain(&ctx, dev) == CUDA_SUCCESS) {
            prim[nprim] = ctx;
            prim_dev[nprim++] = dev;
        }
    }
    return nprim;
}

static void release_primaries(const CUdevice *prim_dev, size_t nprim)
{
    __typeof__(&cuDevicePrimaryCtxRelease_v2) release = KREX_REAL(cuDevicePrimaryCtxRelease_v2);
    if (!release)
        release = KREX_REAL(cuDevicePrimaryCtxRelease);
    for (size_t i = 0; release && i < nprim; i++)
        release(prim_dev[i]);
}

/* Every context this process uses, primaries first, without duplicates;
 * tracked[i] != 0 for those from the tracking list (claimed before use). */
static CUcontext *all_contexts(const CUcontext *prim, size_t nprim, int **tracked, size_t *nall)
{
    size_t n = 0;
    int oom = 0;
    struct krex_tracked *cv = krex_track_snapshot(KREX_TRACK_CTXS, &n, &oom);
    CUcontext *all = oom ? NULL : malloc((nprim + n + 1) * sizeof *all);
    int *tr = all ? calloc(nprim + n + 1, sizeof *tr) : NULL;
    if (!all || !tr) {
        free(cv);
        free(all);
        return NULL;
    }
    memcpy(all, prim, nprim * sizeof *all);
    *nall = nprim;
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < *nall && all[j] != (CUcontext)cv[i].h)
            j++;
        if (j == *nall) {
            tr[*nall] = 1;
            all[(*nall)++] = (CUcontext)cv[i].h;
        }
    }
    free(cv);
    *tracked = tr;
    return all;
}

/* The CUDA synchronization proper: snapshot under track_mu, then each
 * context (or, while a capture is open, each stream) claimed and
 * synchronized outside it, so the command's threads never wait behind the
 * device. */
static CUresult sync_cuda_locked(int app_thread)
{
    CUresult first = CUDA_SUCCESS;
    CUcontext prim[MAX_DEVICES];
    CUdevice prim_dev[MAX_DEVICES];
    size_t nprim = retain_primaries(prim, prim_dev), nall = 0;
    int *tracked = NULL;
    CUcontext *all = all_contexts(prim, nprim, &tracked, &nall);
    if (!all) {
        release_primaries(prim_dev, nprim);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (krex_captures() == 0) {
        for (size_t i = 0; i < nall; i++) {
            if (tracked[i] && !krex_track_claim(KREX_TRACK_CTXS, all[i], all[i]))
                continue; /* destroyed since the snapshot */
            KREX_TEST_POINT("drain_ctx_claimed");
            CUresult r = sync_ctx(all[i]);
            if (tracked[i])
                krex_track_unclaim();
            if (r == CUDA_ERROR_INVALID_CONTEXT || r == CUDA_ERROR_CONTEXT_IS_DESTROYED)
                krex_note_ctx_destroyed(CUDA_SUCCESS, all[i]); /* gone unseen */
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
            note(&first, sync_streams_capture_safe(all, tracked, nall));
            if (app_thread)
                exch(&mode); /* give the application thread its mode back */
        } else {
            first = CUDA_ERROR_NOT_FOUND;
        }
    }
    free(all);
    free(tracked);
    release_primaries(prim_dev, nprim);
    return first;
}

/* CUDA's half, when a CUDA hook bound the driver (krex_libcuda_bound: no
 * load, no loader lock), then HIP's, when a HIP hook loaded the runtime
 * (hipdrain.c).  A half that could synchronize nothing makes the whole
 * CUDA_ERROR_NOT_FOUND (no acknowledgement); another failure of HIP's,
 * CUDA_ERROR_UNKNOWN (logged there; acknowledged, as for CUDA's). */
static CUresult sync_all_locked(int app_thread)
{
    CUresult r = krex_libcuda_bound() ? sync_cuda_locked(app_thread) : CUDA_SUCCESS;
    enum krex_hip_sync_result h = krex_hip_sync(app_thread);
    if (r == CUDA_ERROR_OUT_OF_MEMORY || r == CUDA_ERROR_NOT_FOUND)
        return r;
    if (h == KREX_HIP_SYNC_NONE)
        return CUDA_ERROR_NOT_FOUND;
    if (h == KREX_HIP_SYNC_ERROR && r == CUDA_SUCCESS)
        return CUDA_ERROR_UNKNOWN;
    return r;
}

CUresult krex_sync_all(int app_thread)
{
    int saved = errno;
    pthread_mutex_lock(&sync_mu);
    CUresult r = sync_all_locked(app_thread);
    pthread_mutex_unlock(&sync_mu);
    errno = saved;
    return r;
}

/* ---- the drainer thread --------------------------------------------------- */

/* A closure by another tenant that slot `s` has not acknowledged: its
 * epoch, else 0. */
static uint32_t pending_epoch(struct krex_slot *s, uint64_t w)
{
    uint32_t epoch = krex_gate_epoch(w);
    if (w != 0 && krex_gate_holder(w) != krex_tenant &&
        atomic_load_explicit(&s->ack_epoch, memory_order_seq_cst) != epoch)
        return epoch;
    return 0;
}

/* Steps 2-3 of a drain once no admitted call is in flight: synchronize,
 * then acknowledge `epoch` (unless nothing could be synchronized). */
static void sync_and_ack(struct krex_slot *s, uint32_t epoch, uint64_t t0)
{
    CUresult r = krex_sync_all(0);
    if (r == CUDA_ERROR_OUT_OF_MEMORY || r == CUDA_ERROR_NOT_FOUND) {
        /* Nothing was synchronized (no memory for the context list, or no
         * capture-mode call while a capture is open): work may still be
         * queued, so no acknowledgement.  The entry then fails with a
         * drain timeout naming this process; the next closure retries. */
        krex_log(KREX_LOG_ERROR, "drain for epoch %u: could not synchronize (%d); "
                 "not acknowledging", epoch, (int)r);
        return;
    }
    if (r != CUDA_SUCCESS)
        krex_log(KREX_LOG_WARN, "drain for epoch %u: synchronization returned %d; "
                 "acknowledging (a failed context runs no more work)", epoch, (int)r);
    krex_gate_ack(s, epoch);
    uint64_t dt = krex_now_ns() - t0;
    atomic_store_explicit(&s->last_drain_ns, dt, memory_order_relaxed);
    krex_log(KREX_LOG_DEBUG, "drained for epoch %u in %llu ns", epoch, (unsigned long long)dt);
}

static void *drainer_main(void *arg)
{
    struct krex_slot *s = arg;
    const struct krex_gate *g = krex_gate_p;
    for (;;) {
        /* seq before word (both seq_cst): a closure that this read of the
         * word misses bumps seq later, so the wait below returns. */
        uint32_t seen = atomic_load_explicit(&g->seq, memory_order_seq_cst);
        uint64_t w = krex_gate_load_word(g);
        uint32_t epoch = pending_epoch(s, w);
        if (epoch) {
            uint64_t t0 = krex_now_ns();
            /* 1. Every admitted call has returned; later ones see the
             *    closed word and park: first the calls counted in the
             *    threads' marks (membarrier, then each mark: marks.h),
             *    then those in the slot's shared count. */
            int mr = krex_marks_quiesce(-1);
            if (mr != 0) {
                /* No barrier could be issued: a marked call may be in
                 * flight unseen.  No acknowledgement (the entry fails with
                 * a drain timeout naming this process). */
                krex_log(KREX_LOG_ERROR, "drain for epoch %u: membarrier failed (%s); "
                         "not acknowledging", epoch, strerror(-mr));
                krex_gate_wait_seq(g, seen, -1);
                continue;
            }
            krex_gate_wait_idle(s);
            /* Announce the drain, then look for the exit (both seq_cst; the
             * exit path stores `exiting` then reads `drain_busy`): either
             * the exit path waits for this drain, or this drain sees the
             * exit and leaves the driver alone. */
            atomic_store_explicit(&drain_busy, 1, memory_order_seq_cst);
            if (!atomic_load_explicit(&exiting, memory_order_seq_cst))
                sync_and_ack(s, epoch, t0); /* 2. work off the GPU, 3. ack */
            else
                krex_log(KREX_LOG_DEBUG, "drain for epoch %u: exiting, synchronized at exit: "
                         "not acknowledging (pending until gone)", epoch);
            atomic_store_explicit(&drain_busy, 0, memory_order_seq_cst);
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

/* ---- exit ------------------------------------------------------------------ */

/* Stop the drainer from touching the driver again, and wait for a drain in
 * progress to finish (its synchronization must not run under the driver's
 * teardown, which follows). */
static void stop_drains(void)
{
    atomic_store_explicit(&exiting, 1, memory_order_seq_cst);
    struct timespec tick = {0, 100000}; /* 100 µs */
    while (atomic_load_explicit(&drain_busy, memory_order_seq_cst))
        nanosleep(&tick, NULL);
}

/* ---- exit: the exiting discipline ----------------------------------------
 *
 * An exiting process runs no drainer (its synchronization must not race
 * the driver's teardown), yet its teardown (library destructors, atexit
 * handlers registered before cuInit, the runtime's own) still makes gated
 * calls, and a region may close meanwhile.  So from the exit
 * synchronization on, each gated call synchronizes the process's work
 * itself, on its own thread and inside its own driver call, before its
 * count drops (krex_leave_exiting), and the slot turns EXITING: krexd
 * counts it drained whenever nothing is in flight.  A call that meets a
 * closed gate parks, its count retracted, so krexd never waits for it;
 * one in flight makes krexd wait only for the work it synchronizes.
 *
 * Ordering.  A call whose leave reads krex_exit_sync == 0 does not
 * synchronize: its work must be covered by the exit synchronization.  The
 * exit path stores krex_exit_sync = 1, then issues membarrier(2) (every
 * thread of the process passes a full barrier), then synchronizes: a leave
 * that read 0 did so before its thread's barrier, so the driver work of
 * that call, earlier in the thread's program order, is visible to the
 * synchronization that follows; a leave after the barrier reads 1.  This
 * keeps the fast path at one plain load (no fence per call).  Without
 * membarrier the slot is never marked EXITING: pending until gone. */
_Atomic int krex_exit_sync;

/* Set when the exit path gave up waiting for the threads' marks: the
 * leave that finds every mark clear then takes the exit step itself. */
static _Atomic int exit_unfinished;

/* The exit step once nothing counts in a mark: synchronize, then the slot
 * turns EXITING (krexd then judges it by the shared count alone).
 * `app_thread` as for krex_sync_all. */
static void exit_step(int app_thread)
{
    struct krex_slot *s = atomic_load_explicit(&krex_slot_p, memory_order_acquire);
    if (!s)
        return;
    CUresult r = krex_sync_all(app_thread);
    if (r == CUDA_ERROR_OUT_OF_MEMORY || r == CUDA_ERROR_NOT_FOUND)
        krex_log(KREX_LOG_ERROR, "synchronization at exit failed (%d): this process "
                 "stays undrained until it is gone", (int)r);
    else if (krex_gate_mark_exiting(krex_gate_p, s, (int32_t)getpid()) != 0)
        krex_log(KREX_LOG_WARN, "slot no longer ours at exit");
}

/* After the exit path's wait for the marks ran out: the exit step, once,
 * by whoever finds every mark clear (the exit path right after setting
 * exit_unfinished, or the leave of the last marked call).  The flag's
 * store and each clear are both followed by the other side's check
 * (seq_cst flag accesses; krex_marks_quiesce's membarrier orders the
 * marks), so one of them sees the other. */
static void exit_step_if_quiet(int app_thread)
{
    if (krex_marks_quiesce(0) != 0)
        return; /* a mark is still counted: its leave comes here again */
    if (atomic_exchange_explicit(&exit_unfinished, 0, memory_order_seq_cst))
        exit_step(app_thread);
}

void krex_leave_exiting(struct krex_slot *s)
{
    int saved = errno;
    /* Still counted (in this thread's mark or the slot's count), and still
     * nested (krex_depth): the synchronization goes to the real
     * functions, never through a hook. */
    CUresult r = krex_sync_all(1);
    krex_depth = 0;
    if (r == CUDA_ERROR_OUT_OF_MEMORY || r == CUDA_ERROR_NOT_FOUND) {
        /* Nothing was synchronized: the count stays taken, so this
         * process stays pending until it is gone (never drained over
         * queued work). */
        krex_log(KREX_LOG_ERROR, "exiting: could not synchronize (%d); this process "
                 "stays undrained until it is gone", (int)r);
        errno = saved;
        return;
    }
    if ((uintptr_t)s & KREX_MARKED) {
        struct krex_mark *m = krex_mark_self;
        if (m)
            krex_mark_clear(m); /* the exit path waits for it (drain_at_exit) */
        /* seq_cst load after the clear: pairs with the exit path's store of
         * the flag before its own check of the marks (exit_step_if_quiet). */
        if (atomic_load_explicit(&exit_unfinished, memory_order_seq_cst))
            exit_step_if_quiet(1);
    } else {
        krex_gate_leave_exiting(s);
    }
    errno = saved;
}

/* Turn the exiting discipline on: krex_exit_sync = 1, then a process-wide
 * barrier (see above).  0, or -errno when no membarrier command works (the
 * discipline is then on but proves nothing). */
static int exiting_discipline_on(void)
{
    int saved = errno, rc = 0;
    long cmd = MEMBARRIER_CMD_PRIVATE_EXPEDITED;
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) != 0)
        cmd = MEMBARRIER_CMD_GLOBAL; /* no registration: slower, once */
    /* seq_cst store; membarrier orders it against every thread's leave. */
    atomic_store_explicit(&krex_exit_sync, 1, memory_order_seq_cst);
    if (syscall(SYS_membarrier, cmd, 0, 0) != 0)
        rc = -errno;
    errno = saved;
    return rc;
}

/* At exit, before the driver's teardown (an atexit handler registered
 * after the first successful cuInit, so it runs before the handlers the
 * driver registered there and before every library destructor): stop the
 * drainer, turn the exiting discipline on, synchronize once more while the
 * driver still works, then mark the slot EXITING.  Nothing acknowledges
 * without synchronizing, and the driver's teardown never runs under the
 * drainer.  The cost: exit waits for the work the process left queued,
 * and each gated call made after this point synchronizes. */
static _Atomic int at_exit_done;

static void drain_at_exit(void)
{
    /* Registered once per runtime (CUDA's cuInit, HIP's first call): the
     * one registered last runs first, before both runtimes' teardown, and
     * does the work. */
    if (atomic_exchange_explicit(&at_exit_done, 1, memory_order_relaxed))
        return;
    stop_drains();
    struct krex_slot *s = atomic_load_explicit(&krex_slot_p, memory_order_acquire);
    if (!s || atomic_load_explicit(&krex_mode, memory_order_acquire) != KREX_MODE_GATING)
        return;
    int barrier = exiting_discipline_on();
    /* Calls counted in the threads' marks from before the discipline: each
     * synchronizes before it uncounts itself (its leave reads
     * krex_exit_sync = 1); later calls count in the slot.  Only once they
     * are done may the slot turn EXITING, whose calls krexd sees in the
     * shared count.  A call that has not returned within a second leaves
     * the step to the leave that clears the last mark (exit_step_if_quiet):
     * until then the slot stays ACTIVE and unacknowledged (pending). */
    if (barrier == 0) {
        int mr = krex_marks_quiesce(MARKS_AT_EXIT_NS);
        if (mr == 0) {
            exit_step(0);
        } else if (mr == -ETIMEDOUT) {
            krex_log(KREX_LOG_INFO, "a gated call still in flight at exit: this process "
                     "stays undrained until it returns");
            atomic_store_explicit(&exit_unfinished, 1, memory_order_seq_cst);
            exit_step_if_quiet(0);
        } else {
            krex_log(KREX_LOG_WARN, "membarrier: %s: this process stays undrained until it "
                     "is gone", strerror(-mr));
        }
        return;
    }
    if (atomic_load_explicit(&krex_marks_on, memory_order_relaxed)) {
        /* Marks were on, the barrier now fails: a marked call may be in
         * flight unseen, so nothing is acknowledged. */
        krex_log(KREX_LOG_WARN, "membarrier: %s: this process stays undrained until it "
                 "is gone", strerror(-barrier));
        return;
    }
    krex_log(KREX_LOG_INFO, "membarrier: %s: closures after exit stay undrained until this "
             "process is gone", strerror(-barrier));
    /* Word, then the count (seq_cst): zero means every later call parks
     * (the drainer's own order); a call in flight leaves the closure to
     * the coordinator's liveness check. */
    uint64_t w = krex_gate_load_word(krex_gate_p);
    uint32_t epoch = pending_epoch(s, w);
    if (epoch && (atomic_load_explicit(&s->inflight, memory_order_seq_cst) & KREX_INFLIGHT_COUNT))
        epoch = 0;
    if (epoch) {
        sync_and_ack(s, epoch, krex_now_ns());
    } else {
        CUresult r = krex_sync_all(0);
        if (r != CUDA_SUCCESS)
            krex_log(KREX_LOG_DEBUG, "synchronization at exit returned %d", (int)r);
    }
}

static void register_exit(_Atomic int *registered)
{
    /* Relaxed: only one caller registers; nothing else is published. */
    if (!atomic_exchange_explicit(registered, 1, memory_order_relaxed) &&
        atexit(drain_at_exit) != 0)
        krex_log(KREX_LOG_WARN, "atexit failed: no synchronization at exit");
}

void krex_note_init(CUresult r)
{
    static _Atomic int registered;
    if (r == CUDA_SUCCESS)
        register_exit(&registered);
}

void krex_note_exit_handler(void)
{
    static _Atomic int registered;
    register_exit(&registered);
}

/* Last resort when the atexit handler never ran (no cuInit through the
 * shim): the drainer stops touching the driver, which its destructors
 * may be tearing down, and acknowledges nothing more. */
__attribute__((destructor)) static void drain_exit(void) { stop_drains(); }

/* ---- fork ------------------------------------------------------------------ */

void krex_drain_atfork_child(void)
{
    /* The child has no drainer: no drain is busy, and a synchronization
     * lock held by the parent's drainer at fork is released by starting
     * it over (the child's only thread owns nothing). */
    atomic_store_explicit(&drain_busy, 0, memory_order_relaxed);
    /* A child forked while its parent exits is not exiting: its drainer
     * (started when it registers) must drain, and its calls need not
     * synchronize.  Relaxed: the child's only thread. */
    atomic_store_explicit(&exiting, 0, memory_order_relaxed);
    atomic_store_explicit(&krex_exit_sync, 0, memory_order_relaxed);
    atomic_store_explicit(&exit_unfinished, 0, memory_order_relaxed);
    atomic_store_explicit(&at_exit_done, 0, memory_order_relaxed);
    pthread_mutex_init(&sync_mu, NULL);
}
