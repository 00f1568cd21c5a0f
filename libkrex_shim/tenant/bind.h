/*
 * bind.h — GPU binding by identity (bind.c; docs/design/security.md).
 * Internal, hidden.
 */
#ifndef KREX_BIND_H
#define KREX_BIND_H

#include "base.h"

/* Exit code of a command that tried to create a context on another GPU than
 * the one it is bound to (KREX_GPU_UUID); krex_client.errors.ExitCode.WRONG_GPU. */
#define KREX_EXIT_WRONG_GPU 83
/* Ends the process (KREX_EXIT_WRONG_GPU) when `dev` is not the bound GPU. */
void krex_check_device(CUdevice dev);
/* Ends the process (KREX_EXIT_WRONG_GPU) when a visible HIP device is not the
 * bound GPU; once per process, after the runtime's initialization (hipcall.h). */
void krex_hip_check_bound(void);

#endif /* KREX_BIND_H */
