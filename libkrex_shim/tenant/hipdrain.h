/*
 * hipdrain.h — the HIP half of a drain (hipdrain.c): every HIP device a
 * process used synchronized through the real runtime, per stream while a
 * capture is open; and the exit handler's registration for HIP processes.
 * Internal, hidden.
 */
#ifndef KREX_HIPDRAIN_H
#define KREX_HIPDRAIN_H

#include "fault.h"
#include "state.h"

/* What krex_hip_sync() found. */
enum krex_hip_sync_result {
    KREX_HIP_SYNCED = 0,  /* synchronized (or nothing of HIP to synchronize) */
    KREX_HIP_SYNC_ERROR,  /* synchronized, some call failed (logged) */
    KREX_HIP_SYNC_NONE,   /* nothing could be synchronized: no acknowledgement */
};

/* Synchronize the process's HIP work (krex_sync_all's HIP half, called
 * under its lock): each device noted (hiptrack.h), or while a capture is
 * open each tracked stream that is not capturing, each pre-capture event
 * and each device's null stream, from this thread in the relaxed capture
 * mode.  `app_thread`: the calling thread's device and capture mode are
 * restored.  A process that never called a HIP hook: KREX_HIP_SYNCED at
 * once (the runtime is never loaded here). */
enum krex_hip_sync_result krex_hip_sync(int app_thread);

/* After each gated HIP call (hip_hooks.gen.c): the process's first
 * successful one registers the exit handler (drain.c), after the runtime
 * initialized itself and registered its own teardown; a fatal result is
 * recorded in the slot (fault.c). */
extern _Atomic int krex_hip_exit_registered;
void krex_hip_first_success(void);
static KREX_ALWAYS_INLINE void krex_hip_after(uint32_t r)
{
    if (KREX_UNLIKELY(r != 0)) {
        krex_hip_fault_note(r, 0);
        return;
    }
    /* Relaxed: a hint; the registration itself is idempotent. */
    if (KREX_UNLIKELY(!atomic_load_explicit(&krex_hip_exit_registered, memory_order_relaxed)))
        krex_hip_first_success();
}

#endif /* KREX_HIPDRAIN_H */
