/*
 * call.h — the per-call protocol (paper §4.2) inlined into every hook:
 * krex_enter[_stream]() before the real call, krex_leave() after it
 * (docs/design/shim.md "The per-call protocol and its memory orders").
 * Header only; its slow paths are the process layer's (shim.h), the exit
 * discipline the drainer's (drain.h), the capture lock track.c's.
 * Internal, hidden.
 */
#ifndef KREX_CALL_H
#define KREX_CALL_H

#include "drain.h"
#include "gate_internal.h"
#include "marks.h"
#include "shim.h"
#include "state.h"
#include "testhook.h"
#include "track.h"

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

/* As krex_enter() for a call into `stream` of `kind` (KREX_STREAM_*,
 * state.h: a CUDA stream, of the per-thread family or not, or a HIP one):
 * when a sibling holds the gate and the stream is capturing, the call
 * passes uncounted (a captured call puts no work on the device):
 * KREX_CAPTURED.  `kind` is a constant in every hook: the fast path is the
 * same instructions for each. */
static KREX_ALWAYS_INLINE struct krex_slot *krex_enter_on(void *stream, int kind)
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
            s = krex_enter_blocked(s, stream, kind);
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

/* A CUDA driver call into `stream` (ptsz: the per-thread family). */
static KREX_ALWAYS_INLINE struct krex_slot *krex_enter_stream(CUstream stream, int ptsz)
{
    return krex_enter_on(stream, ptsz ? KREX_STREAM_CU_PTSZ : KREX_STREAM_CU);
}

/* A HIP runtime call into `stream` (spt: an _spt name, whose NULL stream is
 * the per-thread one). */
static KREX_ALWAYS_INLINE struct krex_slot *krex_enter_hip_stream(void *stream, int spt)
{
    return krex_enter_on(stream, spt ? KREX_STREAM_HIP_SPT : KREX_STREAM_HIP);
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

#endif /* KREX_CALL_H */
