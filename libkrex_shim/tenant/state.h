/*
 * state.h — the process's and each thread's krex state (state.c): what
 * every layer above reads, written by the process layer (shim.c) and the
 * per-call protocol (call.h).  Internal, hidden.
 */
#ifndef KREX_STATE_H
#define KREX_STATE_H

#include "base.h"
#include "krex_gate.h"

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

/* 1 under krex: gating or refusing, or not initialised yet with KREX_GATE
 * set (a load or lookup before the constructor ran, a warm pool's forked
 * command); 0 in a pass-through process.  Reads no more than the mode and
 * the environment (no initialisation). */
int krex_under_krex(void);

/* ---- this thread's gated call (call.h; docs/design/shim.md) --------------- */

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
 * one abandoned by siglongjmp is found out (krex_reentry, shim.c), and its
 * count released. */
extern __thread uintptr_t krex_frame __attribute__((tls_model("initial-exec")));
extern __thread uintptr_t krex_frame_ret __attribute__((tls_model("initial-exec")));
extern __thread struct krex_slot *krex_outer __attribute__((tls_model("initial-exec")));

/* What krex_enter() returns when the process refuses GPU work (mode
 * REFUSE): the hook returns krex_refused() without calling the driver. */
#define KREX_REFUSED ((struct krex_slot *)(uintptr_t)1)
/* What krex_enter_stream() returns for a call into a capturing stream that
 * passes a closed gate uncounted: the capture lock is held (read) until
 * krex_leave(), so the capture cannot end between the check and the call
 * (track.c). */
#define KREX_CAPTURED ((struct krex_slot *)(uintptr_t)2)
/* The stream a gated call goes to, for the capture check at a closed gate
 * (krex_enter_on, call.h; krex_enter_blocked, shim.c). */
enum krex_stream_kind {
    KREX_STREAM_CU = 0,      /* a CUstream */
    KREX_STREAM_CU_PTSZ = 1, /* a CUstream of the per-thread family (_ptsz/_ptds) */
    KREX_STREAM_HIP = 2,     /* a hipStream_t */
    KREX_STREAM_HIP_SPT = 3, /* a hipStream_t of an _spt name */
};
/* krex_enter() returns a slot tagged with this bit for a call counted in
 * its thread's mark (marks.h) rather than in the slot's shared count.
 * Slots are 64-byte aligned, and KREX_REFUSED/KREX_CAPTURED are small
 * values, never a tagged slot. */
#define KREX_MARKED ((uintptr_t)1)

#endif /* KREX_STATE_H */
