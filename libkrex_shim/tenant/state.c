/*
 * state.c — the process's and each thread's krex state (state.h).
 */
#include "state.h"

#include <stdlib.h>

_Atomic int krex_mode = KREX_MODE_UNINIT;
const struct krex_gate *krex_gate_p;
struct krex_tenant_mem *krex_tmem_p;
uint32_t krex_tenant;
_Atomic(struct krex_slot *) krex_slot_p;
_Atomic uint64_t krex_launches;
__thread uint32_t krex_depth __attribute__((tls_model("initial-exec")));
__thread uintptr_t krex_frame __attribute__((tls_model("initial-exec")));
__thread uintptr_t krex_frame_ret __attribute__((tls_model("initial-exec")));
__thread struct krex_slot *krex_outer __attribute__((tls_model("initial-exec")));

int krex_under_krex(void)
{
    /* Acquire: pairs with the release store that publishes the mode. */
    int mode = atomic_load_explicit(&krex_mode, memory_order_acquire);
    if (mode != KREX_MODE_UNINIT)
        return mode != KREX_MODE_PASS;
    const char *g = getenv("KREX_GATE");
    return g && *g;
}
