/*
 * fakealloc — runs a script of device-memory steps, one per argument, and
 * prints one JSON line per step (flushed), so tests can drive and observe
 * memory use across processes.
 *
 * usage: fakealloc STEP...
 *   device=N      make device N's primary context current (default: device 0,
 *                 set up by the first step that needs a context)
 *   alloc=BYTES   cuMemAlloc; BYTES takes a K/M/G/T suffix (binary, optional
 *                 "iB"); prints rc and, on success, the allocation's index
 *   fill          cuMemAlloc of all the GPU's free memory (cuMemGetInfo)
 *   free=I|all    cuMemFree of allocation I (or all still held)
 *   info          cuMemGetInfo: free and total bytes
 *   wait          print {"op": "wait"} and block until a line (or EOF) on stdin
 *   sleep=SEC     sleep
 *   kill          SIGKILL itself (no cleanup: memory is left to reclaim)
 * Exit status: 0; 1 when a step other than alloc fails; 2 on bad usage.
 * An alloc that fails (e.g. CUDA_ERROR_OUT_OF_MEMORY) is reported, not fatal.
 */
#include <cuda.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define MAX_ALLOCS 4096

static CUdeviceptr ptrs[MAX_ALLOCS];
static size_t nptrs;
static bool have_ctx;

static const char *errname(CUresult r)
{
    const char *s = NULL;
    return cuGetErrorName(r, &s) == CUDA_SUCCESS ? s : "?";
}

static int fail(const char *step, CUresult r)
{
    printf("{\"op\": \"%s\", \"rc\": %d, \"name\": \"%s\"}\n", step, (int)r, errname(r));
    fflush(stdout);
    return 1;
}

static CUresult use_device(int ordinal)
{
    CUdevice dev;
    CUcontext ctx;
    CUresult r = cuInit(0);
    if (r == CUDA_SUCCESS)
        r = cuDeviceGet(&dev, ordinal);
    if (r == CUDA_SUCCESS)
        r = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (r == CUDA_SUCCESS)
        r = cuCtxSetCurrent(ctx);
    have_ctx = r == CUDA_SUCCESS;
    return r;
}

static bool parse_bytes(const char *s, unsigned long long *out)
{
    char *end = NULL;
    if (*s < '0' || *s > '9')
        return false;
    unsigned long long v = strtoull(s, &end, 10);
    const char *units = "KMGT";
    const char *u = *end ? strchr(units, *end & ~0x20) : NULL;
    if (*end && (u == NULL || (strcmp(end + 1, "") && strcmp(end + 1, "iB") &&
                               strcmp(end + 1, "B"))))
        return false;
    if (u)
        v <<= 10 * (u - units + 1);
    *out = v;
    return true;
}

static bool key_is(const char *arg, size_t klen, const char *key)
{
    return klen == strlen(key) && strncmp(arg, key, klen) == 0;
}

static int step(const char *arg)
{
    const char *eq = strchr(arg, '=');
    const char *val = eq ? eq + 1 : "";
    size_t klen = eq ? (size_t)(eq - arg) : strlen(arg);
    CUresult r;
    if (eq && key_is(arg, klen, "device")) {
        r = use_device(atoi(val));
        if (r != CUDA_SUCCESS)
            return fail("device", r);
        printf("{\"op\": \"device\", \"rc\": 0, \"device\": %d}\n", atoi(val));
    } else if ((eq && key_is(arg, klen, "alloc")) || strcmp(arg, "fill") == 0) {
        unsigned long long bytes = 0;
        size_t free_b = 0, total = 0;
        if (!eq) {
            if (!have_ctx && (r = use_device(0)) != CUDA_SUCCESS)
                return fail("device", r);
            if ((r = cuMemGetInfo(&free_b, &total)) != CUDA_SUCCESS)
                return fail("info", r);
            bytes = free_b;
        } else if (!parse_bytes(val, &bytes)) {
            fprintf(stderr, "fakealloc: %s: bad byte count\n", arg);
            exit(2);
        }
        if (!have_ctx && (r = use_device(0)) != CUDA_SUCCESS)
            return fail("device", r);
        CUdeviceptr p = 0;
        r = cuMemAlloc(&p, (size_t)bytes);
        long index = -1;
        if (r == CUDA_SUCCESS && nptrs < MAX_ALLOCS) {
            index = (long)nptrs;
            ptrs[nptrs++] = p;
        }
        printf("{\"op\": \"alloc\", \"bytes\": %llu, \"rc\": %d, \"name\": \"%s\", \"index\": %ld}\n",
               bytes, (int)r, errname(r), index);
    } else if (eq && key_is(arg, klen, "free")) {
        size_t lo = 0, hi = nptrs;
        if (strcmp(val, "all") != 0) {
            lo = (size_t)strtoul(val, NULL, 10);
            hi = lo + 1;
            if (hi > nptrs || ptrs[lo] == 0) {
                fprintf(stderr, "fakealloc: %s: no such allocation\n", arg);
                exit(2);
            }
        }
        for (size_t i = lo; i < hi; i++) {
            if (ptrs[i] && (r = cuMemFree(ptrs[i])) != CUDA_SUCCESS)
                return fail("free", r);
            ptrs[i] = 0;
        }
        printf("{\"op\": \"free\", \"rc\": 0}\n");
    } else if (strcmp(arg, "info") == 0) {
        size_t free_b = 0, total = 0;
        if (!have_ctx && (r = use_device(0)) != CUDA_SUCCESS)
            return fail("device", r);
        if ((r = cuMemGetInfo(&free_b, &total)) != CUDA_SUCCESS)
            return fail("info", r);
        printf("{\"op\": \"info\", \"rc\": 0, \"free\": %zu, \"total\": %zu}\n", free_b, total);
    } else if (strcmp(arg, "wait") == 0) {
        printf("{\"op\": \"wait\"}\n");
        fflush(stdout);
        char line[64];
        (void)!fgets(line, sizeof line, stdin);
        return 0;
    } else if (eq && key_is(arg, klen, "sleep")) {
        double s = atof(val);
        struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
        nanosleep(&ts, NULL);
        printf("{\"op\": \"sleep\"}\n");
    } else if (strcmp(arg, "kill") == 0) {
        fflush(stdout);
        raise(SIGKILL);
    } else {
        fprintf(stderr, "fakealloc: unknown step '%s' (device=N alloc=BYTES fill free=I|all info wait "
                        "sleep=SEC kill)\n", arg);
        exit(2);
    }
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: fakealloc STEP... (device=N alloc=BYTES fill free=I|all info wait "
                        "sleep=SEC kill)\n");
        return 2;
    }
    for (int i = 1; i < argc; i++)
        if (step(argv[i]) != 0)
            return 1;
    return 0;
}
