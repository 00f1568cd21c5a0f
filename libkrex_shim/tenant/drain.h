/*
 * drain.h — the drainer (paper §4.2 step 3), the synchronization it runs,
 * and the exit discipline (drain.c).  Internal, hidden.
 */
#ifndef KREX_DRAIN_H
#define KREX_DRAIN_H

#include "state.h"

/* Start the drainer thread for slot `s` (0 or an errno value). */
int krex_drainer_start(struct krex_slot *s);
/* Synchronize every context this process uses (paper §4.2 step 3):
 * contexts it created or made current plus the active primary contexts;
 * per stream instead while a capture is open; and every HIP device it used
 * (hipdrain.h).  `app_thread` != 0 when
 * called from an application thread (its capture mode is restored).
 * Returns the first error, or CUDA_SUCCESS. */
CUresult krex_sync_all(int app_thread);

/* Non-zero once this process has begun exiting ("exit" in drain.c): every
 * gated call then synchronizes the process's work before it leaves. */
extern _Atomic int krex_exit_sync;
void krex_leave_exiting(struct krex_slot *s);

/* [observe.post] of cuInit: the exit handler is registered after the
 * driver's first successful initialisation. */
void krex_note_init(CUresult r);
/* The same for HIP's first successful gated call (hipdrain.c): registered
 * again if CUDA's came first, so that it runs before the teardown of
 * whichever runtime initialised last; it runs once. */
void krex_note_exit_handler(void);

/* In a fork child (shim.c's fork handlers): no drainer, not exiting. */
void krex_drain_atfork_child(void);

#endif /* KREX_DRAIN_H */
