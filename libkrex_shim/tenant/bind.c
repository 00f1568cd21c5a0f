/*
 * bind.c — GPU binding by identity: a command creates contexts only on the
 * GPU krexd gave it (docs/design/security.md "6. GPU binding").
 *
 * krex_check_device(), before every call that creates a context on a
 * device (cuCtxCreate*, cuDevicePrimaryCtxRetain, cuGreenCtxCreate;
 * classes.toml [observe.pre]), and krex_hip_check_bound(), right after the
 * HIP runtime's initialization inside the gate (hipcall.h), compare the
 * device's UUID with KREX_GPU_UUID and, on a mismatch, print one line
 * naming both and end the process with KREX_EXIT_WRONG_GPU (83).  Without
 * KREX_GPU_UUID (not run by krex) nothing is checked.
 */
#include "bind.h"
#include "hipinterpose.h"
#include "interpose.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define KREX_UUID_TEXT 41 /* "GPU-" + 36 + NUL */

static pthread_once_t bound_once = PTHREAD_ONCE_INIT;
static char bound_uuid[KREX_UUID_TEXT + 23]; /* room for a "MIG-"-style or longer value */
static int bound_set;

static void read_bound(void)
{
    const char *v = getenv("KREX_GPU_UUID");
    if (v != NULL && *v != '\0' && strlen(v) < sizeof bound_uuid) {
        strcpy(bound_uuid, v);
        bound_set = 1;
    }
}

static void uuid_text(const CUuuid *u, char out[KREX_UUID_TEXT])
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, KREX_UUID_TEXT,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

/* UUID text of `dev`; 0 on success, else the driver's error (the real call
 * that follows then fails the same way, e.g. CUDA_ERROR_INVALID_DEVICE). */
static CUresult device_uuid(CUdevice dev, char out[KREX_UUID_TEXT])
{
    CUuuid u;
    CUresult r = CUDA_ERROR_NOT_FOUND;
    __typeof__(&cuDeviceGetUuid_v2) get_v2 = KREX_REAL(cuDeviceGetUuid_v2);
    if (get_v2 != NULL) {
        r = get_v2(&u, dev);
    } else {
        __typeof__(&cuDeviceGetUuid) get = KREX_REAL(cuDeviceGetUuid);
        if (get != NULL)
            r = get(&u, dev);
    }
    if (r == CUDA_SUCCESS)
        uuid_text(&u, out);
    return r;
}

void krex_check_device(CUdevice dev)
{
    pthread_once(&bound_once, read_bound);
    if (!bound_set)
        return;
    char have[KREX_UUID_TEXT];
    if (device_uuid(dev, have) != CUDA_SUCCESS)
        return; /* no such device: the driver refuses the call itself */
    if (strcasecmp(have, bound_uuid) == 0)
        return;
    fprintf(stderr,
            "krex: refusing to create a CUDA context on %s: this command is bound to %s "
            "(KREX_GPU_UUID); a krex tenant may use only its own GPU (exit %d)\n",
            have, bound_uuid, KREX_EXIT_WRONG_GPU);
    _exit(KREX_EXIT_WRONG_GPU);
}

/* ---- HIP ---------------------------------------------------------------------------- */

/* ROCr's name of a HIP device from its hipUUID bytes: "GPU-" and the 16
 * characters when they are hex digits (ROCm's form), else the bytes as a
 * UUID (another runtime's); "" when all zero (no UUID). */
static void hip_uuid_text(const unsigned char b[16], char out[KREX_UUID_TEXT])
{
    int hex = 1, zero = 1;
    for (int i = 0; i < 16; i++) {
        hex &= isxdigit(b[i]) != 0;
        zero &= b[i] == 0;
    }
    if (zero)
        out[0] = '\0';
    else if (hex)
        snprintf(out, KREX_UUID_TEXT, "GPU-%.16s", (const char *)b);
    else
        uuid_text((const CUuuid *)(const void *)b, out);
}

static void check_hip_devices(void)
{
    pthread_once(&bound_once, read_bound);
    if (!bound_set)
        return;
    krex_hip_abi_hipGetDeviceCount *count = KREX_HIP_REAL(hipGetDeviceCount);
    krex_hip_abi_hipDeviceGetUuid *get = KREX_HIP_REAL(hipDeviceGetUuid);
    int32_t n = 0;
    if (!count || !get || count(&n) != KREX_HIP_SUCCESS)
        return; /* no device visible: there is nothing to use */
    for (int32_t d = 0; d < n; d++) {
        unsigned char b[16];
        char have[KREX_UUID_TEXT];
        if (get(b, d) != KREX_HIP_SUCCESS)
            memset(b, 0, sizeof b);
        hip_uuid_text(b, have);
        if (have[0] == '\0') {
            /* krexd binds only GPUs with a UUID; one HIP cannot name is
             * not a GPU krexd gave any command (its node is denied). */
            krex_log(KREX_LOG_WARN, "HIP device %d has no UUID: cannot check it against %s",
                     (int)d, bound_uuid);
            continue;
        }
        if (strcasecmp(have, bound_uuid) == 0)
            continue;
        fprintf(stderr,
                "krex: refusing HIP work: HIP device %d is %s, but this command is bound to %s "
                "(KREX_GPU_UUID); a krex tenant may see and use only its own GPU (exit %d)\n",
                (int)d, have, bound_uuid, KREX_EXIT_WRONG_GPU);
        _exit(KREX_EXIT_WRONG_GPU);
    }
}

void krex_hip_check_bound(void)
{
    static pthread_once_t checked = PTHREAD_ONCE_INIT;
    pthread_once(&checked, check_hip_devices);
}
