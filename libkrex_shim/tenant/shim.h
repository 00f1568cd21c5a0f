/*
 * shim.h — the process layer of libkrex_shim (shim.c): initialisation from
 * the environment, registration with the gate, the slow paths of the
 * per-call protocol (call.h), abandoned calls, fork.  Internal, hidden.
 *
 * The layers of tenant/ and the include rule: docs/design/shim.md
 * "Layering" (tests/shim/test_layers.py keeps them).
 */
#ifndef KREX_SHIM_H
#define KREX_SHIM_H

#include "state.h"

/* Decide the mode from the environment, once (a no-op after that). */
void krex_shim_init(void);

/* The slow path of krex_enter(): initialise, register at the first gated
 * call, or park at a closed gate.  The slot, NULL (pass-through) or
 * KREX_REFUSED. */
struct krex_slot *krex_enter_slow(void);
/* The hook's return when krex_enter() refused (mode REFUSE): the first
 * one logs why. */
CUresult krex_refused(int idx);
/* As krex_refused() for HIP entry `idx` (hip_entrypoints.gen.h): the
 * first line says why; returns hipErrorNotSupported. */
int krex_hip_refused(int idx);
/* A call into `stream` (of `kind`, enum krex_stream_kind) met a closed
 * gate: KREX_CAPTURED when the stream is capturing (the capture lock is
 * then held, shared), else the slot once the gate admits it. */
struct krex_slot *krex_enter_blocked(struct krex_slot *s, void *stream, int kind);
/* Out of line, rare: 1 when the counted call of this thread is live (this
 * call is nested in it and runs under its count), else 0 after releasing
 * what the abandoned call held. */
int krex_reentry(uintptr_t here);

#endif /* KREX_SHIM_H */
