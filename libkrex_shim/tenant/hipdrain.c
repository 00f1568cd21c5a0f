/*
 * hipdrain.c — the HIP half of a drain (hipdrain.h), run by krex_sync_all
 * (drain.c) under its lock: the drainer's, a holder's region exit, the exit
 * discipline's.  Through the REAL runtime functions only.  Without an open
 * capture each device the process used (hiptrack.c) is made current and
 * synchronized (hipDeviceSynchronize); with one open (track.c's count,
 * shared with CUDA) this thread switches to the relaxed capture mode and
 * synchronizes each tracked stream not capturing, each event recorded just
 * before a capture began, and each device's null stream
 * (docs/design/shim.md "HIP gating").
 */
#include "hipdrain.h"
#include "drain.h"
#include "hipinterpose.h"
#include "hiptrack.h"
#include "track.h"

#include <errno.h>
#include <stdlib.h>

#include "testhook.h"

#define HIP_CAPTURE_MODE_RELAXED 2 /* hipStreamCaptureModeRelaxed */

_Atomic int krex_hip_exit_registered;

void krex_hip_first_success(void)
{
    /* Relaxed: only one caller registers; the exit handler orders itself. */
    if (!atomic_exchange_explicit(&krex_hip_exit_registered, 1, memory_order_relaxed))
        krex_note_exit_handler();
}

/* No runtime, a device or context gone, a runtime not initialized (a fork
 * child): nothing of ours can still run there. */
static int benign(uint32_t r)
{
    return r == KREX_HIP_SUCCESS || r == 3 /* hipErrorNotInitialized */ ||
           r == 4 /* hipErrorDeinitialized */ || r == 100 /* hipErrorNoDevice */ ||
           r == 101 /* hipErrorInvalidDevice */ || r == 201 /* hipErrorInvalidContext */ ||
           r == 709 /* hipErrorContextIsDestroyed */;
}

static void note(uint32_t *first, uint32_t r)
{
    if (!benign(r) && *first == KREX_HIP_SUCCESS)
        *first = r;
    if (r != KREX_HIP_SUCCESS)
        krex_hip_fault_note(r, 1); /* found by the shim's own synchronization */
}

static uint32_t sync_devices(uint64_t mask, krex_hip_abi_hipSetDevice *set,
                             krex_hip_abi_hipDeviceSynchronize *dsync)
{
    uint32_t first = KREX_HIP_SUCCESS;
    for (int d = 0; d < 64; d++) {
        if (!(mask & (1ull << d)))
            continue;
        uint32_t r = set(d);
        if (r == KREX_HIP_SUCCESS) {
            KREX_TEST_POINT("hip_drain_device");
            r = dsync();
        }
        note(&first, r);
    }
    return first;
}

/* While a capture is open: from this thread, already in the relaxed mode. */
static enum krex_hip_sync_result sync_capture_safe(uint64_t mask, krex_hip_abi_hipSetDevice *set,
                                                   uint32_t *first)
{
    krex_hip_abi_hipStreamIsCapturing *is_capturing = KREX_HIP_REAL(hipStreamIsCapturing);
    krex_hip_abi_hipStreamSynchronize *ssync = KREX_HIP_REAL(hipStreamSynchronize);
    krex_hip_abi_hipEventSynchronize *esync = KREX_HIP_REAL(hipEventSynchronize);
    if (!is_capturing || !ssync || !esync)
        return KREX_HIP_SYNC_NONE;
    size_t n = 0;
    int oom = 0;
    struct krex_hip_tracked *sv = krex_hip_stream_snapshot(&n, &oom);
    if (oom)
        return KREX_HIP_SYNC_NONE;
    for (size_t i = 0; i < n; i++) {
        if (!krex_hip_claim(sv[i].h, 0))
            continue; /* destroyed since the snapshot */
        int32_t st = 0;
        uint32_t r = is_capturing(sv[i].h, &st);
        if (r == KREX_HIP_SUCCESS && st == 0)
            r = ssync(sv[i].h);
        krex_hip_unclaim();
        note(first, r == 906 /* hipErrorStreamCaptureImplicit */ ? KREX_HIP_SUCCESS : r);
    }
    free(sv);
    struct krex_hip_tracked *pv = krex_hip_precap_snapshot(&n, &oom);
    if (oom)
        return KREX_HIP_SYNC_NONE;
    for (size_t i = 0; i < n; i++) {
        if (!krex_hip_claim(pv[i].h, 1))
            continue; /* its stream went since the snapshot */
        note(first, esync(pv[i].h));
        krex_hip_unclaim();
    }
    free(pv);
    for (int d = 0; d < 64; d++) {
        if (!(mask & (1ull << d)))
            continue;
        uint32_t r = set(d);
        if (r == KREX_HIP_SUCCESS)
            r = ssync(NULL); /* the device's null stream */
        note(first, r == 906 ? KREX_HIP_SUCCESS : r);
    }
    return KREX_HIP_SYNCED;
}

enum krex_hip_sync_result krex_hip_sync(int app_thread)
{
    if (!krex_hip_loaded())
        return KREX_HIP_SYNCED; /* no HIP hook called: nothing of HIP runs */
    int saved = errno;
    enum krex_hip_sync_result res = KREX_HIP_SYNCED;
    uint64_t mask = krex_hip_devices();
    krex_hip_abi_hipGetDevice *get = KREX_HIP_REAL(hipGetDevice);
    krex_hip_abi_hipSetDevice *set = KREX_HIP_REAL(hipSetDevice);
    krex_hip_abi_hipDeviceSynchronize *dsync = KREX_HIP_REAL(hipDeviceSynchronize);
    krex_hip_abi_hipThreadExchangeStreamCaptureMode *exch =
        KREX_HIP_REAL(hipThreadExchangeStreamCaptureMode);
    if (!mask)
        goto out;
    if (!get || !set || !dsync) {
        res = KREX_HIP_SYNC_NONE;
        goto out;
    }
    int dev = 0;
    int have_dev = app_thread && get(&dev) == KREX_HIP_SUCCESS;
    uint32_t first = KREX_HIP_SUCCESS;
    if (krex_captures() == 0) {
        first = sync_devices(mask, set, dsync);
    } else {
        int32_t mode = HIP_CAPTURE_MODE_RELAXED;
        if (!exch || exch(&mode) != KREX_HIP_SUCCESS) {
            res = KREX_HIP_SYNC_NONE;
        } else {
            res = sync_capture_safe(mask, set, &first);
            if (app_thread)
                exch(&mode); /* give the application thread its mode back */
        }
    }
    if (have_dev)
        set(dev);
    if (res == KREX_HIP_SYNCED && first != KREX_HIP_SUCCESS) {
        krex_log(KREX_LOG_WARN, "HIP synchronization returned %u", first);
        res = KREX_HIP_SYNC_ERROR;
    }
out:
    errno = saved;
    return res;
}
