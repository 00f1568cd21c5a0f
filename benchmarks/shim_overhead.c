/*
 * shim_overhead — nanoseconds libkrex_shim adds to a gated driver call.
 *
 * Run under LD_PRELOAD=libkrex_shim.so (benchmarks/shim_overhead.py does
 * it, with a gate that stays open: the uncontended case).  In one process
 * it calls each function two ways, in alternating batches:
 *
 *   real   the driver's own function, found with the real dlsym (the one
 *          the shim uses), so no hook is on the path;
 *   hook   the function as a program gets it, dlsym(libcuda handle, name),
 *          which the shim answers with its hook: gate enter, call, leave.
 *
 * Functions: cuCtxSetCurrent(current context) (class C: gate only),
 * cuLaunchKernel of a 0 ns kernel (class A, stream-aware, counted as a
 * launch) and cuEventRecord (class A).  Prints one JSON document:
 *
 *   {"gating": 1, "calls": N, "rounds": R, "functions": [
 *     {"name": ..., "real_ns": <median ns/call>, "hook_ns": ..., "added_ns": ...,
 *      "added_ns_min": <min over rounds of hook - real>}, ...]}
 *
 * usage: shim_overhead [--calls N] [--rounds R] [--cpu C]
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void *(*dlsym_fn)(void *, const char *);

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* What one batch calls: function kind and its two pointers. */
/* An empty kernel taking one u64 (the fake driver reads it as the kernel's
 * duration in ns: 0), as PTX so the real driver can load it too. */
static const char KERNEL_PTX[] = ".version 8.0\n.target sm_80\n.address_size 64\n"
                                 ".visible .entry k(.param .u64 p) { ret; }\n";

enum kind { SET_CURRENT, LAUNCH, EVENT_RECORD };

struct target {
    const char *name;
    enum kind kind;
    void *real, *hook;
};

static CUcontext ctx;
static CUfunction kernel;
static CUstream stream;
static CUevent event;

static int batch(const struct target *t, void *fn, long calls)
{
    int bad = 0;
    switch (t->kind) {
    case SET_CURRENT: {
        __typeof__(&cuCtxSetCurrent) f = (__typeof__(&cuCtxSetCurrent))fn;
        for (long i = 0; i < calls; i++)
            bad |= f(ctx);
        break;
    }
    case LAUNCH: {
        __typeof__(&cuLaunchKernel) f = (__typeof__(&cuLaunchKernel))fn;
        uint64_t zero = 0;
        void *params[] = {&zero};
        for (long i = 0; i < calls; i++)
            bad |= f(kernel, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL);
        break;
    }
    case EVENT_RECORD: {
        __typeof__(&cuEventRecord) f = (__typeof__(&cuEventRecord))fn;
        for (long i = 0; i < calls; i++)
            bad |= f(event, stream);
        break;
    }
    }
    return bad;
}

int main(int argc, char **argv)
{
    long calls = 200000;
    int rounds = 21, cpu = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--calls") && i + 1 < argc)
            calls = atol(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cpu") && i + 1 < argc)
            cpu = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: shim_overhead [--calls N] [--rounds R] [--cpu C]\n");
            return 2;
        }
    }
    if (calls < 1 || rounds < 1 || rounds > 1001) {
        fprintf(stderr, "shim_overhead: --calls >= 1, --rounds 1..1001\n");
        return 2;
    }
    if (cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0)
            perror("shim_overhead: sched_setaffinity");
    }
    dlsym_fn real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym)
        real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h || !real_dlsym) {
        fprintf(stderr, "shim_overhead: %s\n", h ? "no real dlsym" : dlerror());
        return 1;
    }
#define HOOK(name) ((__typeof__(&name))dlsym(h, #name))
    CUdevice dev;
    CUmodule mod;
    if (HOOK(cuInit)(0) || HOOK(cuDeviceGet)(&dev, 0) ||
        HOOK(cuDevicePrimaryCtxRetain)(&ctx, dev) || HOOK(cuCtxSetCurrent)(ctx) ||
        HOOK(cuModuleLoadData)(&mod, KERNEL_PTX) ||
        HOOK(cuModuleGetFunction)(&kernel, mod, "k") ||
        HOOK(cuStreamCreate)(&stream, CU_STREAM_NON_BLOCKING) ||
        HOOK(cuEventCreate)(&event, CU_EVENT_DISABLE_TIMING)) {
        fprintf(stderr, "shim_overhead: driver setup failed\n");
        return 1;
    }
    struct target targets[] = {
        {"cuCtxSetCurrent", SET_CURRENT, NULL, NULL},
        {"cuLaunchKernel", LAUNCH, NULL, NULL},
        {"cuEventRecord", EVENT_RECORD, NULL, NULL},
    };
    const int nt = (int)(sizeof targets / sizeof targets[0]);
    for (int t = 0; t < nt; t++) {
        targets[t].real = real_dlsym(h, targets[t].name);
        targets[t].hook = dlsym(h, targets[t].name);
        if (!targets[t].real || !targets[t].hook) {
            fprintf(stderr, "shim_overhead: %s not found\n", targets[t].name);
            return 1;
        }
    }
    int (*active)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "krex_shim_active");
    printf("{\"gating\": %d, \"calls\": %ld, \"rounds\": %d, \"functions\": [",
           active ? active() : -1, calls, rounds);
    static double real_ns[1001], hook_ns[1001], diff_ns[1001];
    for (int t = 0; t < nt; t++) {
        int bad = batch(&targets[t], targets[t].hook, calls / 10); /* warm up both */
        bad |= batch(&targets[t], targets[t].real, calls / 10);
        for (int r = 0; r < rounds; r++) {
            /* Alternate the order so a drift favours neither. */
            for (int k = 0; k < 2; k++) {
                int hook_first = (r + k) % 2 == 0;
                void *fn = hook_first ? targets[t].hook : targets[t].real;
                uint64_t t0 = now_ns();
                bad |= batch(&targets[t], fn, calls);
                double per = (double)(now_ns() - t0) / (double)calls;
                (hook_first ? hook_ns : real_ns)[r] = per;
            }
            diff_ns[r] = hook_ns[r] - real_ns[r];
        }
        if (bad) {
            fprintf(stderr, "shim_overhead: %s returned an error\n", targets[t].name);
            return 1;
        }
        double dmin = diff_ns[0];
        for (int r = 1; r < rounds; r++)
            if (diff_ns[r] < dmin)
                dmin = diff_ns[r];
        double rm = median(real_ns, rounds), hm = median(hook_ns, rounds);
        printf("%s{\"name\": \"%s\", \"real_ns\": %.2f, \"hook_ns\": %.2f, \"added_ns\": %.2f, "
               "\"added_ns_min\": %.2f}",
               t ? ", " : "", targets[t].name, rm, hm, median(diff_ns, rounds), dmin);
    }
    printf("]}\n");
    return 0;
}
