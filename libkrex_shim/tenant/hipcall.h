/*
 * hipcall.h — how a HIP hook (hip_hooks.gen.c) reaches its real function
 * (docs/design/shim.md "HIP gating", "Initialization").  Header only, next
 * to call.h; included by the HIP hooks alone.  Internal, hidden.  Every
 * hooked name binds through krex_hip_hook_real(): until the runtime is
 * loaded its slow path enters the gate (registering the process), loads the
 * runtime, calls hipInit under krex, checks the visible devices (bind.c)
 * and leaves, so the runtime's implicit initialization never runs outside
 * the gate; after that each bind is one acquire load.
 */
#ifndef KREX_HIPCALL_H
#define KREX_HIPCALL_H

#include "bind.h"
#include "call.h"
#include "hipdrain.h"
#include "hipinterpose.h"
#include "shim.h"

#include <errno.h>

/* The first load, inside the gate.  A refused process loads nothing: its
 * hooks fail (krex_hip_unbound). */
static __attribute__((noinline, cold, unused)) void krex_hip_load_gated(void)
{
    int saved = errno;
    struct krex_slot *s = krex_enter();
    if (s == KREX_REFUSED) {
        krex_hip_load(); /* notes the refusal */
    } else {
        int r = krex_hip_load();
        if (r == KREX_HIP_SUCCESS)
            krex_hip_check_bound(); /* may end the process (bind.h) */
        krex_leave(s);
        if (r == KREX_HIP_SUCCESS)
            krex_hip_after((uint32_t)r); /* the runtime is up: the exit handler */
    }
    errno = saved;
}

static __attribute__((noinline, cold, unused)) void *krex_hip_first_bind(int idx)
{
    if (!krex_hip_loaded())
        krex_hip_load_gated();
    return krex_hip_bind(idx);
}

/* The real function for entry `idx` (acquire: pairs with the release store
 * in krex_hip_bind(), so the pointer's target is resolved when called). */
static KREX_ALWAYS_INLINE void *krex_hip_hook_real(int idx)
{
    void *p = atomic_load_explicit(&krex_hip_real_fns[idx], memory_order_acquire);
    return KREX_LIKELY(p) ? p : krex_hip_first_bind(idx);
}

/* A hook's return when it has no real function: the process's refusal
 * (hipErrorNotSupported after krex_refused's one line), else the runtime's
 * (refused, or lacking the name: krex_hip_missing). */
static __attribute__((noinline, cold, unused)) int krex_hip_unbound(int idx)
{
    if (krex_hip_refused_process())
        return krex_hip_refused(idx);
    return krex_hip_missing(idx);
}

/* In a hook: `krex_real_fn`, typed as the table's ABI prototype; `fail`
 * returned when there is none. */
#define KREX_HIP_HOOK_BIND(name, fail)                                         \
    krex_hip_abi_##name *krex_real_fn =                                       \
        (krex_hip_abi_##name *)krex_hip_hook_real(KREX_HIP_EP_##name);         \
    if (KREX_UNLIKELY(krex_real_fn == NULL))                                   \
    return fail

#endif /* KREX_HIPCALL_H */
