/*
 * fakebench — a GPU benchmark stand-in: launches duration kernels in a
 * loop through the CUDA driver API and prints a JSON summary on exit.
 *
 * It reaches the driver the way a given kind of program does (--link):
 *   direct    calls the functions it is linked against (DT_NEEDED libcuda.so.1)
 *   dlsym     dlopen("libcuda.so.1") + dlsym of each export (CuPy-style soft linking)
 *   procaddr  dlopen + dlsym("cuGetProcAddress_v2"), then the self-lookup of
 *             "cuGetProcAddress" through it and every other function through
 *             the resolver that returned (libcudart's bootstrap)
 *
 * usage: fakebench [--link direct|dlsym|procaddr] [--count N | --seconds S]
 *                  [--kernel-ns NS] [--streams K] [--nonblocking] [--per-thread]
 *                  [--capture N [--capture-only]] [--sync-every K] [--device D]
 *                  [--cuda-version V] [--fault-after N]
 *
 *   --count N        launches (kernels, or graph launches with --capture); default 10
 *   --seconds S      launch until S seconds have passed instead
 *   --kernel-ns NS   kernel duration in ns (the kernels' first argument); default 1000000
 *   --streams K      streams used round-robin; 0 = the NULL stream; default 1
 *   --capture N      capture N kernels into a graph, then launch the graph
 *   --capture-only   capture and instantiate, launch nothing
 *   --sync-every K   synchronize every stream after every K launches
 *   --per-thread     per-thread default stream API flavour (_ptsz exports)
 *   --cuda-version V version passed to cuGetProcAddress (procaddr); default 13000
 *   --fault-after N  after N launches, launch one faulting kernel (the fake
 *                    driver's "krex_fault" function: an illegal address, sticky)
 * SIGTERM/SIGINT end the loop early; the summary is printed all the same.
 * The summary names, for each function, the symbol and the object file its
 * pointer belongs to (dladdr), so a test sees whether an interposer was hit.
 * Exit status: 0, 1 on a CUDA error (named in the summary), 2 on bad usage.
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* Per-thread exports are declared by cuda.h only for per-thread builds. */
extern __typeof__(cuLaunchKernel) cuLaunchKernel_ptsz;
extern __typeof__(cuStreamSynchronize) cuStreamSynchronize_ptsz;
extern __typeof__(cuStreamBeginCapture_v2) cuStreamBeginCapture_v2_ptsz;
extern __typeof__(cuStreamEndCapture) cuStreamEndCapture_ptsz;
extern __typeof__(cuGraphLaunch) cuGraphLaunch_ptsz;

struct api {
    PFN_cuInit_v2000 Init;
    PFN_cuDeviceGet_v2000 DeviceGet;
    PFN_cuDevicePrimaryCtxRetain_v7000 PrimaryCtxRetain;
    PFN_cuDevicePrimaryCtxRelease_v11000 PrimaryCtxRelease;
    PFN_cuCtxSetCurrent_v4000 CtxSetCurrent;
    PFN_cuCtxSynchronize_v2000 CtxSynchronize;
    PFN_cuModuleLoadData_v2000 ModuleLoadData;
    PFN_cuModuleGetFunction_v2000 ModuleGetFunction;
    PFN_cuStreamCreate_v2000 StreamCreate;
    PFN_cuStreamDestroy_v4000 StreamDestroy;
    PFN_cuStreamSynchronize_v2000 StreamSynchronize;
    PFN_cuLaunchKernel_v4000 LaunchKernel;
    PFN_cuStreamBeginCapture_v10010 StreamBeginCapture;
    PFN_cuStreamEndCapture_v10000 StreamEndCapture;
    PFN_cuGraphInstantiateWithFlags_v11040 GraphInstantiate;
    PFN_cuGraphLaunch_v10000 GraphLaunch;
    PFN_cuGraphExecDestroy_v10000 GraphExecDestroy;
    PFN_cuGraphDestroy_v10000 GraphDestroy;
    PFN_cuGetErrorName_v6000 GetErrorName;
};

/* One row per function: where it goes in struct api, its base name and ABI
 * version (what cuGetProcAddress is asked for, as libcudart asks), and the
 * export names of its legacy and per-thread flavours. */
struct entry {
    size_t offset;
    const char *base;
    int version;
    const char *legacy;
    const char *per_thread;
    void *direct;
    void *direct_pt;
};

#define E(field, base, ver, leg, pt)                                                          \
    {offsetof(struct api, field), #base, ver, #leg, #pt, (void *)leg, (void *)pt}

static const struct entry entries[] = {
    E(Init, cuInit, 2000, cuInit, cuInit),
    E(DeviceGet, cuDeviceGet, 2000, cuDeviceGet, cuDeviceGet),
    E(PrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain,
      cuDevicePrimaryCtxRetain),
    E(PrimaryCtxRelease, cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2,
      cuDevicePrimaryCtxRelease_v2),
    E(CtxSetCurrent, cuCtxSetCurrent, 4000, cuCtxSetCurrent, cuCtxSetCurrent),
    E(CtxSynchronize, cuCtxSynchronize, 2000, cuCtxSynchronize, cuCtxSynchronize),
    E(ModuleLoadData, cuModuleLoadData, 2000, cuModuleLoadData, cuModuleLoadData),
    E(ModuleGetFunction, cuModuleGetFunction, 2000, cuModuleGetFunction, cuModuleGetFunction),
    E(StreamCreate, cuStreamCreate, 2000, cuStreamCreate, cuStreamCreate),
    E(StreamDestroy, cuStreamDestroy, 4000, cuStreamDestroy_v2, cuStreamDestroy_v2),
    E(StreamSynchronize, cuStreamSynchronize, 2000, cuStreamSynchronize,
      cuStreamSynchronize_ptsz),
    E(LaunchKernel, cuLaunchKernel, 4000, cuLaunchKernel, cuLaunchKernel_ptsz),
    E(StreamBeginCapture, cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2,
      cuStreamBeginCapture_v2_ptsz),
    E(StreamEndCapture, cuStreamEndCapture, 10000, cuStreamEndCapture, cuStreamEndCapture_ptsz),
    E(GraphInstantiate, cuGraphInstantiateWithFlags, 11040, cuGraphInstantiateWithFlags,
      cuGraphInstantiateWithFlags),
    E(GraphLaunch, cuGraphLaunch, 10000, cuGraphLaunch, cuGraphLaunch_ptsz),
    E(GraphExecDestroy, cuGraphExecDestroy, 10000, cuGraphExecDestroy, cuGraphExecDestroy),
    E(GraphDestroy, cuGraphDestroy, 10000, cuGraphDestroy, cuGraphDestroy),
    E(GetErrorName, cuGetErrorName, 6000, cuGetErrorName, cuGetErrorName),
};
#define NENTRIES (sizeof entries / sizeof entries[0])

struct options {
    const char *link;
    long count;
    double seconds;
    uint64_t kernel_ns;
    int streams;
    bool nonblocking;
    bool per_thread;
    long capture;
    bool capture_only;
    long sync_every;
    int device;
    int cuda_version;
    long fault_after;  /* -1: never */
};

struct summary {
    long launches, graph_launches, kernels, syncs;
    uint64_t start_ns, first_launch_ns, end_ns;
    const char *resolver;
    const char *err_call;
    CUresult err;
};

static volatile sig_atomic_t stop;
static struct api api;
static void *resolved[NENTRIES];

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static const char *symbol_name(void *addr)
{
    Dl_info info;
    return addr && dladdr(addr, &info) && info.dli_sname ? info.dli_sname : "?";
}

/* Offset of addr in the object defining it: comparable across processes. */
static uintptr_t symbol_offset(void *addr)
{
    Dl_info info;
    return addr && dladdr(addr, &info) ? (uintptr_t)addr - (uintptr_t)info.dli_fbase : 0;
}

/* File name (without directory) of the object defining addr: shows whether
 * a call reaches the driver or an interposer. */
static const char *symbol_object(void *addr)
{
    Dl_info info;
    if (!addr || !dladdr(addr, &info) || !info.dli_fname)
        return "?";
    const char *slash = strrchr(info.dli_fname, '/');
    return slash ? slash + 1 : info.dli_fname;
}

/* Fill `api` through the chosen path; NULL on success, else a message. */
static const char *bind(const struct options *o, struct summary *sum)
{
    const bool pt = o->per_thread;
    if (strcmp(o->link, "direct") == 0) {
        for (size_t i = 0; i < NENTRIES; i++)
            resolved[i] = pt ? entries[i].direct_pt : entries[i].direct;
    } else {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (h == NULL)
            return dlerror();
        if (strcmp(o->link, "dlsym") == 0) {
            for (size_t i = 0; i < NENTRIES; i++) {
                const char *name = pt ? entries[i].per_thread : entries[i].legacy;
                if ((resolved[i] = dlsym(h, name)) == NULL)
                    return dlerror();
            }
        } else if (strcmp(o->link, "procaddr") == 0) {
            PFN_cuGetProcAddress_v12000 gpa = (PFN_cuGetProcAddress_v12000)dlsym(h,
                                                                        "cuGetProcAddress_v2");
            if (gpa == NULL)
                return dlerror();
            cuuint64_t flags = pt ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                  : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
            void *self = NULL;
            CUdriverProcAddressQueryResult st;
            if (gpa("cuGetProcAddress", &self, o->cuda_version, flags, &st) != CUDA_SUCCESS ||
                self == NULL)
                return "self-lookup of cuGetProcAddress failed";
            sum->resolver = symbol_name(self);
            for (size_t i = 0; i < NENTRIES; i++) {
                CUresult r;
                if (o->cuda_version >= 12000)
                    r = ((PFN_cuGetProcAddress_v12000)self)(entries[i].base, &resolved[i],
                                                            entries[i].version, flags, &st);
                else
                    r = ((PFN_cuGetProcAddress_v11030)self)(entries[i].base, &resolved[i],
                                                            entries[i].version, flags);
                if (r != CUDA_SUCCESS || resolved[i] == NULL) {
                    static char msg[160];
                    snprintf(msg, sizeof msg, "cuGetProcAddress(%s) failed: %d", entries[i].base,
                             (int)r);
                    return msg;
                }
            }
        } else {
            return "unknown --link (direct, dlsym, procaddr)";
        }
    }
    for (size_t i = 0; i < NENTRIES; i++)
        memcpy((char *)&api + entries[i].offset, &resolved[i], sizeof(void *));
    return NULL;
}

#define CHECK(call, expr)                                                                     \
    do {                                                                                      \
        CUresult r_ = (expr);                                                                 \
        if (r_ != CUDA_SUCCESS) {                                                             \
            sum->err_call = call;                                                             \
            sum->err = r_;                                                                    \
            return;                                                                           \
        }                                                                                     \
    } while (0)

static void run(const struct options *o, struct summary *sum)
{
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    static const char image[] = "fake cubin";
    CHECK("cuInit", api.Init(0));
    CHECK("cuDeviceGet", api.DeviceGet(&dev, o->device));
    CHECK("cuDevicePrimaryCtxRetain", api.PrimaryCtxRetain(&ctx, dev));
    CHECK("cuCtxSetCurrent", api.CtxSetCurrent(ctx));
    CHECK("cuModuleLoadData", api.ModuleLoadData(&mod, image));
    CHECK("cuModuleGetFunction", api.ModuleGetFunction(&fn, mod, "duration_kernel"));
    CUfunction fault_fn = NULL;
    if (o->fault_after >= 0)
        CHECK("cuModuleGetFunction", api.ModuleGetFunction(&fault_fn, mod, "krex_fault_kernel"));

    int nstreams = o->streams > 0 ? o->streams : 1;
    CUstream *streams = calloc((size_t)nstreams, sizeof *streams);
    if (streams == NULL)
        abort();
    for (int i = 0; i < o->streams; i++)
        CHECK("cuStreamCreate",
              api.StreamCreate(&streams[i], o->nonblocking ? CU_STREAM_NON_BLOCKING : 0));

    uint64_t dur = o->kernel_ns;
    void *params[] = {&dur};
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    if (o->capture > 0) {
        CHECK("cuStreamBeginCapture",
              api.StreamBeginCapture(streams[0], CU_STREAM_CAPTURE_MODE_GLOBAL));
        for (long i = 0; i < o->capture; i++)
            CHECK("cuLaunchKernel",
                  api.LaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, streams[0], params, NULL));
        CHECK("cuStreamEndCapture", api.StreamEndCapture(streams[0], &graph));
        CHECK("cuGraphInstantiateWithFlags", api.GraphInstantiate(&exec, graph, 0));
    }

    uint64_t deadline = o->seconds > 0 ? now_ns() + (uint64_t)(o->seconds * 1e9) : 0;
    long n = 0;
    while (!stop && (deadline ? now_ns() < deadline : n < o->count) &&
           !(o->capture > 0 && o->capture_only)) {
        CUstream s = streams[n % nstreams];
        if (fault_fn && n == o->fault_after) /* one illegal-address kernel */
            CHECK("cuLaunchKernel",
                  api.LaunchKernel(fault_fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
        if (sum->first_launch_ns == 0)
            sum->first_launch_ns = now_ns();
        if (exec) {
            CHECK("cuGraphLaunch", api.GraphLaunch(exec, s));
            sum->graph_launches++;
            sum->kernels += o->capture;
        } else {
            CHECK("cuLaunchKernel", api.LaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
            sum->kernels++;
        }
        sum->launches = ++n;
        if (o->sync_every > 0 && n % o->sync_every == 0) {
            for (int i = 0; i < nstreams; i++)
                CHECK("cuStreamSynchronize", api.StreamSynchronize(streams[i]));
            sum->syncs++;
        }
    }
    CHECK("cuCtxSynchronize", api.CtxSynchronize());
    sum->end_ns = now_ns();
    if (exec)
        CHECK("cuGraphExecDestroy", api.GraphExecDestroy(exec));
    if (graph)
        CHECK("cuGraphDestroy", api.GraphDestroy(graph));
    for (int i = 0; i < o->streams; i++)
        CHECK("cuStreamDestroy", api.StreamDestroy(streams[i]));
    free(streams);
    CHECK("cuDevicePrimaryCtxRelease", api.PrimaryCtxRelease(dev));
}

static void print_summary(const struct options *o, const struct summary *sum)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    uint64_t cpu_ns = ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000ull +
                      ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000ull;
    printf("{\"pid\": %ld, \"link\": \"%s\", \"per_thread\": %s, \"cuda_version\": %d, ",
           (long)getpid(), o->link, o->per_thread ? "true" : "false", o->cuda_version);
    printf("\"launches\": %ld, \"graph_launches\": %ld, \"kernels\": %ld, \"syncs\": %ld, ",
           sum->launches, sum->graph_launches, sum->kernels, sum->syncs);
    printf("\"kernel_ns\": %" PRIu64 ", \"streams\": %d, \"start_ns\": %" PRIu64
           ", \"first_launch_ns\": %" PRIu64 ", \"end_ns\": %" PRIu64 ", \"cpu_ns\": %" PRIu64
           ", ",
           o->kernel_ns, o->streams, sum->start_ns, sum->first_launch_ns, sum->end_ns, cpu_ns);
    printf("\"resolver\": %s%s%s, \"symbols\": {", sum->resolver ? "\"" : "",
           sum->resolver ? sum->resolver : "null", sum->resolver ? "\"" : "");
    for (size_t i = 0; i < NENTRIES; i++)
        printf("%s\"%s\": {\"name\": \"%s\", \"object\": \"%s\", \"offset\": %ju}",
               i ? ", " : "", entries[i].base, symbol_name(resolved[i]),
               symbol_object(resolved[i]), (uintmax_t)symbol_offset(resolved[i]));
    printf("}, \"error\": ");
    if (sum->err_call) {
        const char *name = NULL;
        if (api.GetErrorName == NULL || api.GetErrorName(sum->err, &name) != CUDA_SUCCESS)
            name = "?";
        printf("{\"call\": \"%s\", \"code\": %d, \"name\": \"%s\"}", sum->err_call, (int)sum->err,
               name);
    } else {
        printf("null");
    }
    printf("}\n");
    fflush(stdout);
}

static void usage(void)
{
    fprintf(stderr,
            "usage: fakebench [--link direct|dlsym|procaddr] [--count N | --seconds S]\n"
            "                 [--kernel-ns NS] [--streams K] [--nonblocking] [--per-thread]\n"
            "                 [--capture N [--capture-only]] [--sync-every K] [--device D]\n"
            "                 [--cuda-version V] [--fault-after N]\n");
    exit(2);
}

static long parse_long(const char *s, const char *opt, long min)
{
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < min) {
        fprintf(stderr, "fakebench: %s %s: expected an integer >= %ld\n", opt, s, min);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    struct options o = {.link = "direct", .count = 10, .kernel_ns = 1000000, .streams = 1,
                        .cuda_version = 13000, .fault_after = -1};
    static const struct option longopts[] = {
        {"link", required_argument, NULL, 'l'},       {"count", required_argument, NULL, 'n'},
        {"seconds", required_argument, NULL, 't'},    {"kernel-ns", required_argument, NULL, 'k'},
        {"streams", required_argument, NULL, 's'},    {"nonblocking", no_argument, NULL, 'B'},
        {"per-thread", no_argument, NULL, 'p'},       {"capture", required_argument, NULL, 'c'},
        {"capture-only", no_argument, NULL, 'C'},     {"sync-every", required_argument, NULL, 'y'},
        {"device", required_argument, NULL, 'd'},     {"cuda-version", required_argument, NULL, 'v'},
        {"fault-after", required_argument, NULL, 'F'},
        {"help", no_argument, NULL, 'h'},             {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'l': o.link = optarg; break;
        case 'n': o.count = parse_long(optarg, "--count", 0); break;
        case 't': {
            char *end = NULL;
            o.seconds = strtod(optarg, &end);
            if (*optarg == '\0' || *end != '\0' || !(o.seconds > 0)) {
                fprintf(stderr, "fakebench: --seconds %s: expected a positive number\n", optarg);
                return 2;
            }
            break;
        }
        case 'k': o.kernel_ns = (uint64_t)parse_long(optarg, "--kernel-ns", 0); break;
        case 's': o.streams = (int)parse_long(optarg, "--streams", 0); break;
        case 'B': o.nonblocking = true; break;
        case 'p': o.per_thread = true; break;
        case 'c': o.capture = parse_long(optarg, "--capture", 1); break;
        case 'C': o.capture_only = true; break;
        case 'y': o.sync_every = parse_long(optarg, "--sync-every", 1); break;
        case 'd': o.device = (int)parse_long(optarg, "--device", 0); break;
        case 'v': o.cuda_version = (int)parse_long(optarg, "--cuda-version", 11030); break;
        case 'F': o.fault_after = parse_long(optarg, "--fault-after", 0); break;
        default: usage();
        }
    }
    if (optind != argc)
        usage();
    if (o.capture > 0 && o.streams == 0) {
        fprintf(stderr, "fakebench: --capture needs --streams >= 1 (the NULL stream cannot capture)\n");
        return 2;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    struct summary sum = {.start_ns = now_ns()};
    const char *err = bind(&o, &sum);
    if (err) {
        fprintf(stderr, "fakebench: --link %s: %s\n", o.link, err);
        return 2;
    }
    run(&o, &sum);
    print_summary(&o, &sum);
    return sum.err_call ? 1 : 0;
}
