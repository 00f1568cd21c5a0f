/*
 * shim.h — internal interface of libkrex_shim (not installed).
 *
 * Layering (docs/design/shim.md): exported hook (entrypoints.gen.c)
 *   -> krex_ logic (gate per call here, observation in drain.c / shim.c)
 *   -> real driver function, bound lazily through interpose.c.
 *
 * Everything here is hidden (-fvisibility=hidden); only the hooks, dlsym
 * and the krex_shim_* functions are exported.
 */
#ifndef KREX_SHIM_H
#define KREX_SHIM_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

/* Declare every exported ABI under its own name: the legacy ones (cuda.h
 * keeps them under __CUDA_API_VERSION_INTERNAL) and the _ptsz/_ptds ones
 * (the per-thread macros are on in that mode).  A name in the shim then
 * means exactly the exported symbol of that name. */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "entrypoints.gen.h"
#include "gate_internal.h"
#include "krex_gate.h"
#include "marks.h"
#include "testhook.h"

#define KREX_HOOK __attribute__((visibility("default")))
#define KREX_EXPORT __attribute__((visibility("default")))
#define KREX_LIKELY(x) __builtin_expect(!!(x), 1)
#define KREX_UNLIKELY(x) __builtin_expect(!!(x), 0)
/* The per-call fast path is inlined into every hook, whatever the
 * compiler's size heuristics say (hundreds of hooks made GCC out-line it,
 * adding calls to each gated call). */
#define KREX_ALWAYS_INLINE inline __attribute__((always_inline))

/* ---- logging (stderr; level from KREX_SHIM_LOG, read once at init) ------ */

enum { KREX_LOG_ERROR = 0, KREX_LOG_WARN = 1, KREX_LOG_INFO = 2, KREX_LOG_DEBUG = 3 };
extern int krex_log_level;
void krex_log_write(int level, const char *func, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define krex_log(level, ...)                                                   \
    do {                                                                       \
        if ((level) <= krex_log_level)                                         \
            krex_log_write((level), __func__, __VA_ARGS__);                    \
    } while (0)

/* ---- fatal GPU errors (fault.c) ------------------------------------------ */

/* Record a fatal (sticky) result in this process's gate slot (the first
 * one only); `at_sync`: found by the shim's own synchronization. */
void krex_fault_note(CUresult r, int at_sync);
CUresult krex_fault_result(CUresult r);
/* Every hook returns through this: one compare on the fast path. */
#define KREX_RESULT(r) (KREX_LIKELY((r) == CUDA_SUCCESS) ? (r) : krex_fault_result(r))

/* ---- process state (shim.c) ---------------------------------------------- */

/* PASS: not under krex (KREX_GATE and KREX_TENANT unset): every hook is a
 * pure pass-through.  REFUSE: under krex, but this process cannot be
 * drained (gate or slot memory unusable, no free slot, no drainer thread):
 * every gated call fails with CUDA_ERROR_NOT_PERMITTED instead of running
 * beside a sibling's region unseen (fail closed, docs/design/shim.md). */
enum krex_mode {
    KREX_MODE_UNINIT = 0,
    KREX_MODE_PASS = 1,
    KREX_MODE_GATING = 2,
    KREX_MODE_REFUSE = 3,
};

/* Written once by krex_shim_init() before it publishes krex_mode (release);
 * read after an acquire load of krex_mode. */
extern _Atomic int krex_mode;
extern const struct krex_gate *krex_gate_p;      /* read-only mapping */
extern struct krex_tenant_mem *krex_tmem_p;      /* the tenant's slot memory */
extern uint32_t krex_tenant;
/* This process's slot; NULL until the first gated call registers (and
 * again in a fork child). */
extern _Atomic(struct krex_slot *) krex_slot_p;
/* Kernel launches since the last krex_shim_region_begin(). */
extern _Atomic uint64_t krex_launches;

void krex_shim_init(void);
struct krex_slot *krex_enter_slow(void);
/* 1 under krex: gating or refusing, or not initialised yet with KREX_GATE
 * set (a load or lookup before the constructor ran, a warm pool's forked
 * command); 0 in a pass-through process.  Reads no more than the mode and
 * the environment (no initialisation). */
int krex_under_krex(void);

/* What krex_enter() returns when the process refuses GPU work (mode
 * REFUSE): the hook returns krex_refused() without calling the driver. */
#define KREX_REFUSED ((struct krex_slot *)(uintptr_t)1)
CUresult krex_refused(int idx);
/* What krex_enter_stream() returns for a call into a capturing stream that
 * passes a closed gate uncounted: the capture lock is held (read) until
 * krex_leave(), so the capture cannot end between the check and the call
 * (track.c). */
#define KREX_CAPTURED ((struct krex_slot *)(uintptr_t)2)

/* The capture lock (track.c): shared by uncounted passes into capturing
 * streams, exclusive for cuStreamEndCapture (pre-call; its post-call note,
 * krex_note_capture_end, releases it). */
void krex_capture_pass_begin(void);
void krex_capture_pass_end(void);
void krex_capture_end_begin(void);
struct krex_slot *krex_enter_blocked(struct krex_slot *s, CUstream stream, int ptsz);

/* ---- real driver functions (interpose.c) --------------------------------- */

extern _Atomic(void *) krex_real_fns[KREX_EP_COUNT];
void *krex_bind(int idx);
CUresult krex_missing(int idx);
void *krex_libcuda(void);
/* The driver's handle if this process has loaded it, else NULL (no load). */
void *krex_libcuda_if_loaded(void);
void *krex_dlsym_real(void *handle, const char *name);
int krex_ep_lookup(const char *name);

/* The real function for entry `idx`, bound on first use (acquire pairs
 * with the release store in krex_bind(), so the pointer's target is
 * fully resolved when we call it). */
static inline void *krex_real(int idx)
{
    void *p = atomic_load_explicit(&krex_real_fns[idx], memory_order_acquire);
    return KREX_LIKELY(p) ? p : krex_bind(idx);
}

/* In a hook: `krex_real_fn`, typed like the driver's own declaration. */
#define KREX_BIND(name)                                                        \
    __typeof__(&name) krex_real_fn = (__typeof__(&name))krex_real(KREX_EP_##name); \
    if (KREX_UNLIKELY(krex_real_fn == NULL))                                   \
        return krex_missing(KREX_EP_##name)

/* A real function by name, or NULL when the driver lacks it. */
#define KREX_REAL(name) ((__typeof__(&name))krex_real(KREX_EP_##name))

/* ---- the per-call protocol (paper §4.2) ---------------------------------- */

/* Non-zero while this thread is inside a gated call: a driver call made
 * from within it (a driver or another interposer calling an exported name)
 * is covered by the outer call's count and must not park with it held. */
extern __thread uint32_t krex_depth __attribute__((tls_model("initial-exec")));

/* The outermost gated call of this thread (docs/design/shim.md "Abandoned
 * calls"): its frame (__builtin_frame_address(0) of the hook), the hook's
 * return address, which the live frame's record holds at frame + one word
 * (the frame-record layout of x86-64 and AArch64), and what it holds
 * (krex_enter's result).  A call that finds the thread still counted
 * (krex_depth, or its mark busy) is nested only while that frame is live;
 * one abandoned by siglongjmp is found out here, and its count released. */
extern __thread uintptr_t krex_frame __attribute__((tls_model("initial-exec")));
extern __thread uintptr_t krex_frame_ret __attribute__((tls_model("initial-exec")));
extern __thread struct krex_slot *krex_outer __attribute__((tls_model("initial-exec")));
/* Out of line, rare: 1 when the counted call of this thread is live (this
 * call is nested in it and runs under its count), else 0 after releasing
 * what the abandoned call held. */
int krex_reentry(uintptr_t here);
/* At thread exit (marks.c): the thread is in no call any more. */
void krex_thread_gone(void);

/* Is this thread already counted?  Its depth, or its mark (a signal
 * handler that interrupted the outer call between its mark and its depth). */
static KREX_ALWAYS_INLINE int krex_counted(void)
{
    struct krex_mark *m = krex_mark_self;
    /* Relaxed: only this thread writes its mark. */
    return krex_depth != 0 ||
           (m != NULL && atomic_load_explicit(&m->busy, memory_order_relaxed) != 0);
}

/* Record the outermost call's frame, before it is counted: a handler that
 * then finds the count judges this frame.  The signal fence keeps the
 * compiler from moving these plain stores after the count. */
#define KREX_RECORD_FRAME(here)                                                \
    do {                                                                       \
        krex_frame = (here);                                                   \
        krex_frame_ret = (uintptr_t)__builtin_return_address(0);               \
        atomic_signal_fence(memory_order_seq_cst);                             \
    } while (0)

/* Non-zero once this process has begun exiting (drain.c, "exit"): every
 * gated call then synchronizes the process's work before it leaves. */
extern _Atomic int krex_exit_sync;
void krex_leave_exiting(struct krex_slot *s);

/* krex_enter() returns a slot tagged with this bit for a call counted in
 * its thread's mark (marks.h) rather than in the slot's shared count.
 * Slots are 64-byte aligned, and KREX_REFUSED/KREX_CAPTURED are small
 * values, never a tagged slot. */
#define KREX_MARKED ((uintptr_t)1)

/* The fast path on this thread's mark (marks.h): set it, read the word
 * (no fence: the drainer's membarrier pairs with the compiler barrier),
 * admitted when open or ours and the process is not exiting.  Returns
 * the tagged slot, or NULL (mark clear again) for the shared count's path. */
static KREX_ALWAYS_INLINE struct krex_slot *krex_enter_marked(struct krex_slot *s)
{
    struct krex_mark *m = krex_mark_self;
    if (KREX_UNLIKELY(!m)) {
        if (!atomic_load_explicit(&krex_marks_on, memory_order_relaxed) || !(m = krex_mark_new()))
            return NULL;
    }
    /* Plain count, compiler barrier, relaxed load: ordered for the
     * drainer by its membarrier (marks.h). */
    krex_mark_set(m);
    KREX_TEST_POINT("mark_set");
    atomic_signal_fence(memory_order_seq_cst);
    uint64_t w = atomic_load_explicit(&((struct krex_gate *)krex_gate_p)->word,
                                      memory_order_relaxed);
    /* The exit path sets krex_exit_sync, then membarrier, then waits for
     * the marks: a call that reads 0 here is waited for, one that reads 1
     * counts in the shared count, which an EXITING slot is judged by. */
    if (KREX_LIKELY(krex_gate_admits(w, krex_tenant)) &&
        KREX_LIKELY(!atomic_load_explicit(&krex_exit_sync, memory_order_relaxed))) {
        /* Statistics only (see krex_gate_try_enter_inline). */
        atomic_store_explicit(&s->gated_calls,
                              atomic_load_explicit(&s->gated_calls, memory_order_relaxed) + 1,
                              memory_order_relaxed);
        KREX_TEST_POINT("mark_admitted");
        return (struct krex_slot *)((uintptr_t)s | KREX_MARKED);
    }
    krex_mark_clear(m);
    return NULL;
}

/* Fast path: one acquire load of the mode, one of the slot, then this
 * thread's mark (or, without one, the gate's increment-then-check on the
 * slot's shared count).  Returns the slot to leave (tagged KREX_MARKED
 * when counted in the mark), NULL (pure pass-through, or a nested call),
 * or KREX_REFUSED (the hook returns krex_refused() and does not leave). */
static KREX_ALWAYS_INLINE struct krex_slot *krex_enter(void)
{
    uintptr_t here = (uintptr_t)__builtin_frame_address(0);
    if (KREX_UNLIKELY(krex_counted()) && krex_reentry(here))
        return NULL;
    struct krex_slot *s;
    int mode = atomic_load_explicit(&krex_mode, memory_order_acquire);
    if (KREX_LIKELY(mode == KREX_MODE_GATING) &&
        KREX_LIKELY((s = atomic_load_explicit(&krex_slot_p, memory_order_acquire)) != NULL)) {
        KREX_RECORD_FRAME(here);
        struct krex_slot *marked = krex_enter_marked(s);
        if (KREX_LIKELY(marked != NULL)) {
            KREX_RECORD_FRAME(here); /* again: a handler's own call may have replaced it */
            krex_outer = marked;
            krex_depth = 1;
            return marked;
        }
        if (KREX_UNLIKELY(!krex_gate_try_enter_inline(krex_gate_p, s, krex_tenant)))
            krex_gate_enter(krex_gate_p, s, krex_tenant); /* parks until admitted */
        KREX_TEST_POINT("count_admitted");
    } else if (mode == KREX_MODE_PASS)
        return NULL;
    else if ((s = krex_enter_slow()) == KREX_REFUSED)
        return s;
    KREX_RECORD_FRAME(here);
    krex_outer = s;
    krex_depth = s != NULL;
    return s;
}

/* As krex_enter() for a call into `stream`: when a sibling holds the gate
 * and the stream is capturing, the call passes uncounted (a captured call
 * puts no work on the device): KREX_CAPTURED. */
static KREX_ALWAYS_INLINE struct krex_slot *krex_enter_stream(CUstream stream, int ptsz)
{
    uintptr_t here = (uintptr_t)__builtin_frame_address(0);
    if (KREX_UNLIKELY(krex_counted()) && krex_reentry(here))
        return NULL;
    struct krex_slot *s;
    int mode = atomic_load_explicit(&krex_mode, memory_order_acquire);
    if (KREX_LIKELY(mode == KREX_MODE_GATING) &&
        KREX_LIKELY((s = atomic_load_explicit(&krex_slot_p, memory_order_acquire)) != NULL)) {
        KREX_RECORD_FRAME(here);
        struct krex_slot *marked = krex_enter_marked(s);
        if (KREX_LIKELY(marked != NULL)) {
            KREX_RECORD_FRAME(here); /* again: a handler's own call may have replaced it */
            krex_outer = marked;
            krex_depth = 1;
            return marked;
        }
        if (KREX_UNLIKELY(!krex_gate_try_enter_inline(krex_gate_p, s, krex_tenant)))
            s = krex_enter_blocked(s, stream, ptsz);
        KREX_TEST_POINT("count_admitted");
    } else if (mode == KREX_MODE_PASS) {
        return NULL;
    } else if ((s = krex_enter_slow()) == KREX_REFUSED) {
        return s;
    }
    KREX_RECORD_FRAME(here);
    krex_outer = s;
    krex_depth = s != NULL;
    return s;
}

static KREX_ALWAYS_INLINE void krex_leave(struct krex_slot *s)
{
    if (s) {
        if (KREX_UNLIKELY(s == KREX_CAPTURED)) {
            /* Uncounted, and no device work: nothing to synchronize even
             * while exiting. */
            krex_depth = 0;
            krex_capture_pass_end();
            return;
        }
        /* Relaxed: one plain load on the fast path.  The exit path orders
         * its store against this load with a process-wide barrier
         * (membarrier, drain.c): a call that reads 0 here had its driver
         * work visible before the exit synchronization began.  The
         * signal fence (no instruction) keeps the compiler from moving
         * the load above the driver call. */
        atomic_signal_fence(memory_order_seq_cst);
        if (KREX_UNLIKELY(atomic_load_explicit(&krex_exit_sync, memory_order_relaxed))) {
            krex_leave_exiting(s);
            return;
        }
        krex_depth = 0;
        if (KREX_LIKELY((uintptr_t)s & KREX_MARKED)) {
            struct krex_mark *m = krex_mark_self;
            if (KREX_LIKELY(m != NULL)) /* NULL only in a fork child whose marks went off */
                krex_mark_clear(m);
        } else
            krex_gate_leave_inline(s);
    }
}

static inline void krex_count_launch(void)
{
    /* Statistics: a relaxed load and store, not a locked read-modify-write
     * (about 8 ns on every launch).  Threads launching at the same instant
     * may lose a count; the count never returns to 0 once a launch was
     * counted, which is all fault.c asks of it. */
    atomic_store_explicit(&krex_launches,
                          atomic_load_explicit(&krex_launches, memory_order_relaxed) + 1,
                          memory_order_relaxed);
}

static inline CUstream krex_cfg_stream(const CUlaunchConfig *config)
{
    return config ? config->hStream : NULL;
}

/* ---- observation hooks (drain.c, shim.c, interpose.c) -------------------- */

void krex_note_stream_created(CUresult r, CUstream *phStream);
void krex_note_stream_destroying(CUstream stream);
void krex_note_capture_begin(CUresult r);
/* Before a capture begins on `stream` (ptsz: the per-thread family): an
 * event recorded there marks the work queued before it (track.c). */
void krex_capture_begin_pre(CUstream stream, int ptsz);
void krex_note_capture_end(CUresult r);
void krex_note_ctx_created(CUresult r, CUcontext *pctx);
void krex_note_ctx_destroying(CUcontext ctx);
void krex_note_ctx_destroyed(CUresult r, CUcontext ctx);
void krex_note_green_created(CUresult r, CUgreenCtx *phCtx);
void krex_note_green_destroying(CUgreenCtx green);
void krex_note_init(CUresult r);
void krex_note_ctx_current(CUresult r, CUcontext ctx);
void krex_note_primary_reset(CUresult r, CUdevice dev);
/* Maps the resolver's pointer to our hook; refuses (CUDA_ERROR_NOT_FOUND)
 * a pointer to no export cuda.h declares, under krex.  Returns the result. */
CUresult krex_route_proc_address(CUresult r, const char *symbol, void **pfn, int cudaVersion,
                                 CUdriverProcAddressQueryResult *symbolStatus, int arity);

/* ---- drain.c -------------------------------------------------------------- */

/* Stream captures open in this process. */
uint32_t krex_captures(void);
/* Start the drainer thread for slot `s` (0 or an errno value). */
int krex_drainer_start(struct krex_slot *s);
/* Synchronize every context this process uses (paper §4.2 step 3):
 * contexts it created or made current plus the active primary contexts;
 * per stream instead while a capture is open.  `app_thread` != 0 when
 * called from an application thread (its capture mode is restored).
 * Returns the first error, or CUDA_SUCCESS. */
CUresult krex_sync_all(int app_thread);
void krex_drain_atfork_prepare(void);
void krex_drain_atfork_parent(void);
void krex_drain_atfork_child(void);

/* ---- region.c ------------------------------------------------------------- */

void krex_region_forget_ctx(CUcontext ctx);
/* Event and stream observations for the region record (classes.toml). */
extern _Atomic int krex_region_open;
extern _Atomic uint64_t krex_events_recorded_outside;
void krex_note_event_record_in_region(CUevent ev, CUstream stream);
static KREX_ALWAYS_INLINE void krex_note_event_record(CUresult r, CUevent ev, CUstream stream)
{
    if (r != CUDA_SUCCESS)
        return;
    /* Counts and the ring index: relaxed loads and stores, not locked
     * read-modify-writes, on this per-call path (a locked add cost about
     * 8 ns of every cuEventRecord; an out-of-line call a few more).
     * Threads recording at the same instant may lose a count or share a
     * ring entry: the warnings they feed need "some", not "how many". */
    if (KREX_LIKELY(!atomic_load_explicit(&krex_region_open, memory_order_relaxed))) {
        atomic_store_explicit(
            &krex_events_recorded_outside,
            atomic_load_explicit(&krex_events_recorded_outside, memory_order_relaxed) + 1,
            memory_order_relaxed);
        return;
    }
    krex_note_event_record_in_region(ev, stream);
}
void krex_note_event_elapsed(CUresult r, CUevent start, CUevent end);
void krex_region_stream_destroying(CUstream stream);
void krex_region_atfork_prepare(void);
void krex_region_atfork_parent(void);
void krex_region_atfork_child(void);

/* ---- bind.c --------------------------------------------------------------- */

/* Exit code of a command that tried to create a context on another GPU than
 * the one it is bound to (KREX_GPU_UUID); krex_client.errors.ExitCode.WRONG_GPU. */
#define KREX_EXIT_WRONG_GPU 83
/* Ends the process (KREX_EXIT_WRONG_GPU) when `dev` is not the bound GPU. */
void krex_check_device(CUdevice dev);

/* ---- time ----------------------------------------------------------------- */

uint64_t krex_now_ns(void);

#endif /* KREX_SHIM_H */
