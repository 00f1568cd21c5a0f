/*
 * init.c — cuInit, cuDriverGetVersion, the configuration read from the
 * environment at cuInit, the driver lock and fork handling.
 *
 * Environment (read once, by the first cuInit of a process):
 *   KREX_FAKE_GPUS        simulated GPUs, 1..FC_MAX_GPUS (default 1)
 *   CUDA_VISIBLE_DEVICES  comma-separated GPU indices or UUIDs ("GPU-..." as
 *                         cuDeviceGetUuid's text form, or a unique prefix
 *                         of it); parsing stops at the first invalid
 *                         entry, as the real driver does (fc.vis_env names
 *                         the variables: tests/fakehip reads its own)
 *   KREX_FAKE_CALL_BYTES  free device memory a non-allocating call that
 *                         needs some (context and stream creation, module
 *                         loads, launches, graph instantiation and upload,
 *                         cuMemMap, host allocation) must find, else it fails
 *                         with CUDA_ERROR_OUT_OF_MEMORY (default 1: only a
 *                         full GPU fails them); suffixes as below
 *   KREX_FAKE_MEM_BYTES   per-GPU memory capacity in bytes, optional suffix
 *                         K/M/G/T (binary, also KiB/MiB/GiB/TiB); default 80 GiB
 *   KREX_FAKE_TIMELINE    timeline file (appended; unset: no timeline)
 *   KREX_FAKE_STATE       shared memory-state file; default <timeline>.state,
 *                         or /dev/shm/krex-fakecuda-<uid>.v3 without a timeline
 *   KREX_FAKE_MPS         1 or log: a modelled MPS server spreads fatal faults
 *                         (fault.c; KREX_FAKE_MPS_STATE names its file)
 * A bad value makes cuInit fail with CUDA_ERROR_INVALID_VALUE and a message
 * on stderr that names the variable.
 */
#include "fakecuda.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static const char *const cuda_visible[] = {"CUDA_VISIBLE_DEVICES", NULL};

struct fc_state fc = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .vis_env = {cuda_visible},
    .timeline_fd = -1,
    .next_stream_id = 1,
    .next_ctx_id = 1,
    .next_capture_id = 1,
};

void fc_lock(void)
{
    pthread_mutex_lock(&fc.mu);
}

void fc_unlock(void)
{
    pthread_mutex_unlock(&fc.mu);
}

CUresult fc_check_init(void)
{
    /* Acquire pairs with the release store in cuInit: a thread that sees
     * ready == 1 also sees the configuration cuInit wrote before it. */
    if (!atomic_load_explicit(&fc.ready, memory_order_acquire))
        return CUDA_ERROR_NOT_INITIALIZED;
    return fc_fault_sticky(); /* a fatal fault is sticky (fault.c) */
}

/* Parse "123", "4G", "512MiB" (binary multiples) into bytes; false on error. */
static bool parse_bytes(const char *s, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    if (!isdigit((unsigned char)*s))
        return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0)
        return false;
    unsigned shift = 0;
    switch (toupper((unsigned char)*end)) {
    case '\0': break;
    case 'K': shift = 10; break;
    case 'M': shift = 20; break;
    case 'G': shift = 30; break;
    case 'T': shift = 40; break;
    default: return false;
    }
    if (*end != '\0') {
        end++;
        if (strcmp(end, "") != 0 && strcmp(end, "iB") != 0 && strcmp(end, "B") != 0)
            return false;
    }
    if (shift && v > (UINT64_MAX >> shift))
        return false;
    *out = (uint64_t)v << shift;
    return true;
}

/* The simulated GPU whose UUID text starts with the entry at `p` (up to ','
 * or the end; the real driver accepts a unique prefix too), or -1.  *end is
 * set past the entry. */
static long uuid_entry(const char *p, char **end)
{
    size_t n = strcspn(p, ",");
    *end = (char *)p + n;
    while (n > 0 && p[n - 1] == ' ')
        n--;
    long found = -1;
    for (int i = 0; i < fc.nphys; i++) {
        char text[FC_UUID_TEXT], rocr[FC_UUID_TEXT];
        fc_uuid_text(i, text);
        fc_uuid_rocr_text(i, rocr);
        if ((n <= strlen(text) && strncasecmp(p, text, n) == 0) ||
            (fc.rocr_uuids && n <= strlen(rocr) && strncasecmp(p, rocr, n) == 0)) {
            if (found >= 0)
                return -1; /* ambiguous prefix */
            found = i;
        }
    }
    return found;
}

/* Apply one visibility variable's value `vis` to the GPUs the previous layer
 * left visible (base[0..nbase), simulated indices): entries are indices into
 * that list or UUIDs of its GPUs; the real drivers take entries up to the
 * first invalid one. */
static int apply_visible(const char *vis, const int *base, int nbase, int *out)
{
    int n = 0;
    const char *p = vis;
    while (*p && n < FC_MAX_GPUS) {
        while (*p == ' ')
            p++;
        char *end = NULL;
        long idx;
        if (strncmp(p, "GPU-", 4) == 0) {
            long phys = uuid_entry(p, &end);
            idx = -1;
            for (int i = 0; phys >= 0 && i < nbase; i++)
                if (base[i] == (int)phys)
                    idx = i;
        } else {
            errno = 0;
            idx = strtol(p, &end, 10);
            if (end == p || errno != 0)
                break;
        }
        if (idx < 0 || idx >= nbase)
            break;
        bool dup = false;
        for (int i = 0; i < n; i++)
            dup = dup || out[i] == base[idx];
        if (dup)
            break;
        out[n++] = base[idx];
        p = end;
        while (*p == ' ')
            p++;
        if (*p != ',')
            break;
        p++;
    }
    return n;
}

static CUresult config_gpus(void)
{
    const char *s = getenv("KREX_FAKE_GPUS");
    fc.nphys = 1;
    if (s && *s) {
        char *end = NULL;
        errno = 0;
        long n = strtol(s, &end, 10);
        if (errno != 0 || *end != '\0' || n < 1 || n > FC_MAX_GPUS) {
            fprintf(stderr, "fakecuda: KREX_FAKE_GPUS=%s: expected an integer 1..%d\n", s,
                    FC_MAX_GPUS);
            return CUDA_ERROR_INVALID_VALUE;
        }
        fc.nphys = (int)n;
    }
    fc.ndev = 0;
    for (int i = 0; i < fc.nphys; i++)
        fc.phys[fc.ndev++] = i;
    /* Each layer (fc.vis_env) picks from the GPUs the previous one left. */
    for (int layer = 0; layer < FC_VIS_LAYERS && fc.vis_env[layer]; layer++) {
        const char *vis = NULL;
        for (const char *const *name = fc.vis_env[layer]; *name && vis == NULL; name++)
            vis = getenv(*name);
        if (vis == NULL)
            continue;
        int picked[FC_MAX_GPUS];
        fc.ndev = apply_visible(vis, fc.phys, fc.ndev, picked);
        memcpy(fc.phys, picked, sizeof picked[0] * (size_t)fc.ndev);
    }
    return CUDA_SUCCESS;
}

static CUresult configure(void)
{
    CUresult r = config_gpus();
    if (r != CUDA_SUCCESS)
        return r;
    fc.mem_bytes = FC_DEFAULT_MEM_BYTES;
    const char *mem = getenv("KREX_FAKE_MEM_BYTES");
    if (mem && *mem && (!parse_bytes(mem, &fc.mem_bytes) || fc.mem_bytes == 0)) {
        fprintf(stderr,
                "fakecuda: KREX_FAKE_MEM_BYTES=%s: expected a positive byte count "
                "(e.g. 80G, 1048576)\n",
                mem);
        return CUDA_ERROR_INVALID_VALUE;
    }
    fc.call_bytes = 1;
    const char *call = getenv("KREX_FAKE_CALL_BYTES");
    if (call && *call && (!parse_bytes(call, &fc.call_bytes) || fc.call_bytes == 0)) {
        fprintf(stderr, "fakecuda: KREX_FAKE_CALL_BYTES=%s: expected a positive byte count\n",
                call);
        return CUDA_ERROR_INVALID_VALUE;
    }
    const char *timeline = getenv("KREX_FAKE_TIMELINE");
    if (timeline && *timeline) {
        r = fc_timeline_open(timeline);
        if (r != CUDA_SUCCESS)
            return r;
    }
    char state[4096];
    const char *st = getenv("KREX_FAKE_STATE");
    if (st && *st) {
        snprintf(state, sizeof state, "%s", st);
    } else if (timeline && *timeline) {
        if ((size_t)snprintf(state, sizeof state, "%s.state", timeline) >= sizeof state) {
            fprintf(stderr, "fakecuda: KREX_FAKE_TIMELINE is too long\n");
            return CUDA_ERROR_INVALID_VALUE;
        }
    } else {
        /* The format version in the name: builds of another format never share it. */
        snprintf(state, sizeof state, "/dev/shm/krex-fakecuda-%u.v3", (unsigned)getuid());
    }
    r = fc_share_open(state);
    if (r == CUDA_SUCCESS) {
        fc_share_attach(); /* the process record: checkpoint lock, activity */
        r = fc_mps_open();
    }
    if (r != CUDA_SUCCESS)
        return r;
    return fc.ndev > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

FC_API CUresult cuInit(unsigned int Flags)
{
    FC_ENTRY();
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    if (!fc.init_called) {
        fc.init_called = true;
        fc.init_result = configure();
        /* Release: publishes the configuration to fc_check_init's acquire. */
        if (fc.init_result == CUDA_SUCCESS)
            atomic_store_explicit(&fc.ready, 1, memory_order_release);
    }
    CUresult r = fc.init_result;
    fc_unlock();
    return r;
}

FC_API CUresult cuDriverGetVersion(int *driverVersion)
{
    FC_ENTRY();
    if (driverVersion == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = FC_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

/* fork: the lock is taken around fork so the child's copy is consistent.  As
 * with the real driver, a child of an initialized process cannot use the
 * parent's driver state: every call in it returns CUDA_ERROR_NOT_INITIALIZED
 * (a child that execs starts afresh). */
static void atfork_prepare(void)
{
    fc_lock();
}

static void atfork_parent(void)
{
    fc_unlock();
}

static void atfork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    fc.mu = fresh;
    if (fc.init_called) {
        atomic_store_explicit(&fc.ready, 0, memory_order_relaxed);
        fc.init_result = CUDA_ERROR_NOT_INITIALIZED;
    }
    fc_mem_atfork_child();
}

__attribute__((constructor)) static void fc_load(void)
{
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* Normal process exit returns the process's device memory to the shared
 * capacity; memory of a process that died without running this is reclaimed
 * by the next allocation that finds the device full (memory.c). */
__attribute__((destructor)) static void fc_unload(void)
{
    fc_share_exit();
}
