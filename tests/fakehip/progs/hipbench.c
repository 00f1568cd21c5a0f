/*
 * hipbench — a GPU benchmark stand-in for HIP: launches duration kernels in
 * a loop through the HIP runtime API and prints a JSON summary on exit.
 *
 * usage: hipbench [--link direct|dlsym] [--mode launch|module|graph]
 *                 [--count N | --seconds S] [--kernel-ns NS] [--streams K]
 *                 [--nonblocking] [--capture N] [--sync-every K] [--device D]
 *                 [--fault-after N]
 *        hipbench --info
 *
 *   --link direct    calls the functions it is linked against (DT_NEEDED
 *                    libamdhip64.so.6, found by rpath or LD_LIBRARY_PATH)
 *   --link dlsym     dlopen("libamdhip64.so.6") + dlsym of each function
 *   --mode launch    hipLaunchKernel of a host function (default)
 *   --mode module    hipModuleLaunchKernel of a function of a loaded module
 *   --mode graph     capture --capture N module launches on the first stream
 *                    into a graph, then hipGraphLaunch it
 *   --count N        launches (kernels, or graph launches); default 10
 *   --seconds S      launch until S seconds have passed instead
 *   --kernel-ns NS   kernel duration in ns (the kernels' first argument); default 1000000
 *   --streams K      streams used round-robin; 0 = the null stream; default 1
 *   --capture N      kernels per graph (--mode graph); default 1
 *   --sync-every K   hipStreamSynchronize every stream after every K launches
 *   --fault-after N  after N launches, launch one faulting kernel ("krex_fault_kernel")
 *   --info           print the devices as hipGetDeviceProperties (both layouts),
 *                    hipDeviceGetUuid and the versions report them, and exit
 * SIGTERM/SIGINT end the loop early; the summary is printed all the same.
 * For each function the summary names the symbol and object file its pointer
 * belongs to (dladdr), so a test sees whether an interposer was hit.
 * Exit status: 0, 1 on a HIP error (named in the summary), 2 on bad usage.
 */
#include "hip_api.h"

#include <dlfcn.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* The host functions that are this program's kernels (hipLaunchKernel keys;
 * -rdynamic exports them so the runtime's dladdr names them).  Their bodies
 * differ so that no two are folded into one address. */
volatile int kernel_marks[2];
void duration_kernel(uint64_t ns);
void krex_fault_kernel(uint64_t ns);
void duration_kernel(uint64_t ns)
{
    kernel_marks[0] = (int)ns;
}
void krex_fault_kernel(uint64_t ns)
{
    kernel_marks[1] = (int)ns + 1;
}

#define API(X)                                                                                    \
    X(hipInit) X(hipSetDevice) X(hipDeviceSynchronize) X(hipStreamCreateWithFlags)              \
    X(hipStreamDestroy) X(hipStreamSynchronize) X(hipLaunchKernel) X(hipModuleLoadData)           \
    X(hipModuleGetFunction) X(hipModuleLaunchKernel) X(hipStreamBeginCapture)                     \
    X(hipStreamEndCapture) X(hipGraphInstantiate) X(hipGraphLaunch) X(hipGraphExecDestroy)        \
    X(hipGraphDestroy) X(hipGetErrorName)

struct api {
#define FIELD(name) __typeof__(name) *name;
    API(FIELD)
#undef FIELD
};

static const char *const names[] = {
#define NAME(name) #name,
    API(NAME)
#undef NAME
};
#define NAPI (sizeof names / sizeof names[0])

struct options {
    const char *link;
    const char *mode;
    long count;
    double seconds;
    uint64_t kernel_ns;
    int streams;
    bool nonblocking;
    long capture;
    long sync_every;
    int device;
    long fault_after; /* -1: never */
};

struct summary {
    long launches, graph_launches, kernels, syncs;
    uint64_t start_ns, first_launch_ns, end_ns;
    const char *err_call;
    hipError_t err;
};

static volatile sig_atomic_t stop;
static struct api api;

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

static void *slot(size_t i)
{
    void *p;
    memcpy(&p, (char *)&api + i * sizeof(void *), sizeof p);
    return p;
}

/* Fill `api`; NULL on success, else a message. */
static const char *bind(const char *link)
{
    if (strcmp(link, "direct") == 0) {
#define DIRECT(name) api.name = name;
        API(DIRECT)
#undef DIRECT
        return NULL;
    }
    if (strcmp(link, "dlsym") != 0)
        return "unknown --link (direct, dlsym)";
    void *h = dlopen("libamdhip64.so.6", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        return dlerror();
    for (size_t i = 0; i < NAPI; i++) {
        void *p = dlsym(h, names[i]);
        if (p == NULL)
            return dlerror();
        memcpy((char *)&api + i * sizeof(void *), &p, sizeof p);
    }
    return NULL;
}

static const char *symbol_name(void *addr)
{
    Dl_info info;
    return addr && dladdr(addr, &info) && info.dli_sname ? info.dli_sname : "?";
}

static uintptr_t symbol_offset(void *addr)
{
    Dl_info info;
    return addr && dladdr(addr, &info) ? (uintptr_t)addr - (uintptr_t)info.dli_fbase : 0;
}

static const char *symbol_object(void *addr)
{
    Dl_info info;
    if (!addr || !dladdr(addr, &info) || !info.dli_fname)
        return "?";
    const char *slash = strrchr(info.dli_fname, '/');
    return slash ? slash + 1 : info.dli_fname;
}

#define CHECK(call, expr)                                                                         \
    do {                                                                                          \
        hipError_t e_ = (expr);                                                                   \
        if (e_ != hipSuccess) {                                                                   \
            sum->err_call = call;                                                                 \
            sum->err = e_;                                                                        \
            return;                                                                               \
        }                                                                                         \
    } while (0)

static void run(const struct options *o, struct summary *sum)
{
    static const char image[] = "fake hip code object";
    const bool module = strcmp(o->mode, "launch") != 0;
    const bool graph = strcmp(o->mode, "graph") == 0;
    hipModule_t mod = NULL;
    hipFunction_t fn = NULL, fault_fn = NULL;
    CHECK("hipInit", api.hipInit(0));
    CHECK("hipSetDevice", api.hipSetDevice(o->device));
    if (module) {
        CHECK("hipModuleLoadData", api.hipModuleLoadData(&mod, image));
        CHECK("hipModuleGetFunction", api.hipModuleGetFunction(&fn, mod, "duration_kernel"));
        CHECK("hipModuleGetFunction",
              api.hipModuleGetFunction(&fault_fn, mod, "krex_fault_kernel"));
    }
    int nstreams = o->streams > 0 ? o->streams : 1;
    hipStream_t *streams = calloc((size_t)nstreams, sizeof *streams);
    if (streams == NULL)
        abort();
    for (int i = 0; i < o->streams; i++)
        CHECK("hipStreamCreateWithFlags",
              api.hipStreamCreateWithFlags(&streams[i],
                                           o->nonblocking ? hipStreamNonBlocking : 0));

    uint64_t dur = o->kernel_ns;
    void *params[] = {&dur};
    const dim3 one = {1, 1, 1};
    hipGraph_t g = NULL;
    hipGraphExec_t exec = NULL;
    if (graph) {
        CHECK("hipStreamBeginCapture",
              api.hipStreamBeginCapture(streams[0], hipStreamCaptureModeGlobal));
        for (long i = 0; i < o->capture; i++)
            CHECK("hipModuleLaunchKernel",
                  api.hipModuleLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, streams[0], params, NULL));
        CHECK("hipStreamEndCapture", api.hipStreamEndCapture(streams[0], &g));
        CHECK("hipGraphInstantiate", api.hipGraphInstantiate(&exec, g, NULL, NULL, 0));
    }

    uint64_t deadline = o->seconds > 0 ? now_ns() + (uint64_t)(o->seconds * 1e9) : 0;
    long n = 0;
    while (!stop && (deadline ? now_ns() < deadline : n < o->count)) {
        hipStream_t s = streams[n % nstreams];
        if (n == o->fault_after) { /* one illegal-address kernel */
            if (module)
                CHECK("hipModuleLaunchKernel",
                      api.hipModuleLaunchKernel(fault_fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
            else
                CHECK("hipLaunchKernel",
                      api.hipLaunchKernel((const void *)krex_fault_kernel, one, one, params, 0,
                                          s));
        }
        if (sum->first_launch_ns == 0)
            sum->first_launch_ns = now_ns();
        if (graph) {
            CHECK("hipGraphLaunch", api.hipGraphLaunch(exec, s));
            sum->graph_launches++;
            sum->kernels += o->capture;
        } else if (module) {
            CHECK("hipModuleLaunchKernel",
                  api.hipModuleLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
            sum->kernels++;
        } else {
            CHECK("hipLaunchKernel",
                  api.hipLaunchKernel((const void *)duration_kernel, one, one, params, 0, s));
            sum->kernels++;
        }
        sum->launches = ++n;
        if (o->sync_every > 0 && n % o->sync_every == 0) {
            for (int i = 0; i < nstreams; i++)
                CHECK("hipStreamSynchronize", api.hipStreamSynchronize(streams[i]));
            sum->syncs++;
        }
    }
    CHECK("hipDeviceSynchronize", api.hipDeviceSynchronize());
    sum->end_ns = now_ns();
    if (exec)
        CHECK("hipGraphExecDestroy", api.hipGraphExecDestroy(exec));
    if (g)
        CHECK("hipGraphDestroy", api.hipGraphDestroy(g));
    for (int i = 0; i < o->streams; i++)
        CHECK("hipStreamDestroy", api.hipStreamDestroy(streams[i]));
    free(streams);
}

static void print_summary(const struct options *o, const struct summary *sum)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    uint64_t cpu_ns = ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000ull +
                      ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000ull;
    printf("{\"pid\": %ld, \"link\": \"%s\", \"mode\": \"%s\", ", (long)getpid(), o->link,
           o->mode);
    printf("\"launches\": %ld, \"graph_launches\": %ld, \"kernels\": %ld, \"syncs\": %ld, ",
           sum->launches, sum->graph_launches, sum->kernels, sum->syncs);
    printf("\"kernel_ns\": %" PRIu64 ", \"streams\": %d, \"start_ns\": %" PRIu64
           ", \"first_launch_ns\": %" PRIu64 ", \"end_ns\": %" PRIu64 ", \"cpu_ns\": %" PRIu64
           ", \"symbols\": {",
           o->kernel_ns, o->streams, sum->start_ns, sum->first_launch_ns, sum->end_ns, cpu_ns);
    for (size_t i = 0; i < NAPI; i++)
        printf("%s\"%s\": {\"name\": \"%s\", \"object\": \"%s\", \"offset\": %ju}", i ? ", " : "",
               names[i], symbol_name(slot(i)), symbol_object(slot(i)),
               (uintmax_t)symbol_offset(slot(i)));
    printf("}, \"error\": ");
    if (sum->err_call)
        printf("{\"call\": \"%s\", \"code\": %d, \"name\": \"%s\"}", sum->err_call, (int)sum->err,
               api.hipGetErrorName ? api.hipGetErrorName(sum->err) : "?");
    else
        printf("null");
    printf("}\n");
    fflush(stdout);
}

static void hex(const char *bytes, size_t n)
{
    for (size_t i = 0; i < n; i++)
        printf("%02x", (unsigned char)bytes[i]);
}

/* --info: one JSON document; 1 when a call fails (named on stderr). */
static int info(void)
{
    int count = 0, runtime = 0, driver = 0;
    hipError_t e;
    if ((e = hipGetDeviceCount(&count)) != hipSuccess ||
        (e = hipRuntimeGetVersion(&runtime)) != hipSuccess ||
        (e = hipDriverGetVersion(&driver)) != hipSuccess) {
        fprintf(stderr, "hipbench: %s\n", hipGetErrorName(e));
        return 1;
    }
    printf("{\"count\": %d, \"runtime_version\": %d, \"driver_version\": %d, \"devices\": [",
           count, runtime, driver);
    for (int d = 0; d < count; d++) {
        hipDeviceProp_tR0600 p;
        hipDeviceProp_t old;
        hipUUID uuid;
        char bus[32];
        int l2 = 0;
        if ((e = hipGetDevicePropertiesR0600(&p, d)) != hipSuccess ||
            (e = hipGetDeviceProperties(&old, d)) != hipSuccess ||
            (e = hipDeviceGetUuid(&uuid, d)) != hipSuccess ||
            (e = hipDeviceGetPCIBusId(bus, sizeof bus, d)) != hipSuccess ||
            (e = hipDeviceGetAttribute(&l2, hipDeviceAttributeL2CacheSize, d)) != hipSuccess) {
            fprintf(stderr, "hipbench: device %d: %s\n", d, hipGetErrorName(e));
            return 1;
        }
        printf("%s{\"name\": \"%s\", \"gcnArchName\": \"%s\", \"totalGlobalMem\": %zu, "
               "\"l2CacheSize\": %d, \"warpSize\": %d, \"multiProcessorCount\": %d, "
               "\"major\": %d, \"minor\": %d, \"pciBusID\": %d, \"pciBusId\": \"%s\", "
               "\"attr_l2CacheSize\": %d, \"uuid\": \"",
               d ? ", " : "", p.name, p.gcnArchName, p.totalGlobalMem, p.l2CacheSize, p.warpSize,
               p.multiProcessorCount, p.major, p.minor, p.pciBusID, bus, l2);
        hex(p.uuid.bytes, sizeof p.uuid.bytes);
        printf("\", \"uuid_call\": \"");
        hex(uuid.bytes, sizeof uuid.bytes);
        printf("\", \"r0000\": {\"name\": \"%s\", \"totalGlobalMem\": %zu, \"l2CacheSize\": %d, "
               "\"gcnArchName\": \"%s\", \"pciBusID\": %d}}",
               old.name, old.totalGlobalMem, old.l2CacheSize, old.gcnArchName, old.pciBusID);
    }
    printf("]}\n");
    return 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: hipbench [--link direct|dlsym] [--mode launch|module|graph]\n"
            "                [--count N | --seconds S] [--kernel-ns NS] [--streams K]\n"
            "                [--nonblocking] [--capture N] [--sync-every K] [--device D]\n"
            "                [--fault-after N]\n"
            "       hipbench --info\n");
    exit(2);
}

static long parse_long(const char *s, const char *opt, long min)
{
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < min) {
        fprintf(stderr, "hipbench: %s %s: expected an integer >= %ld\n", opt, s, min);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    struct options o = {.link = "direct", .mode = "launch", .count = 10, .kernel_ns = 1000000,
                        .streams = 1, .capture = 1, .fault_after = -1};
    static const struct option longopts[] = {
        {"link", required_argument, NULL, 'l'},       {"mode", required_argument, NULL, 'm'},
        {"count", required_argument, NULL, 'n'},      {"seconds", required_argument, NULL, 't'},
        {"kernel-ns", required_argument, NULL, 'k'},  {"streams", required_argument, NULL, 's'},
        {"nonblocking", no_argument, NULL, 'B'},      {"capture", required_argument, NULL, 'c'},
        {"sync-every", required_argument, NULL, 'y'}, {"device", required_argument, NULL, 'd'},
        {"fault-after", required_argument, NULL, 'F'}, {"info", no_argument, NULL, 'I'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'l': o.link = optarg; break;
        case 'm': o.mode = optarg; break;
        case 'n': o.count = parse_long(optarg, "--count", 0); break;
        case 't': {
            char *end = NULL;
            o.seconds = strtod(optarg, &end);
            if (*optarg == '\0' || *end != '\0' || !(o.seconds > 0)) {
                fprintf(stderr, "hipbench: --seconds %s: expected a positive number\n", optarg);
                return 2;
            }
            break;
        }
        case 'k': o.kernel_ns = (uint64_t)parse_long(optarg, "--kernel-ns", 0); break;
        case 's': o.streams = (int)parse_long(optarg, "--streams", 0); break;
        case 'B': o.nonblocking = true; break;
        case 'c': o.capture = parse_long(optarg, "--capture", 1); break;
        case 'y': o.sync_every = parse_long(optarg, "--sync-every", 1); break;
        case 'd': o.device = (int)parse_long(optarg, "--device", 0); break;
        case 'F': o.fault_after = parse_long(optarg, "--fault-after", 0); break;
        case 'I': return info();
        default: usage();
        }
    }
    if (optind != argc || (strcmp(o.mode, "launch") != 0 && strcmp(o.mode, "module") != 0 &&
                           strcmp(o.mode, "graph") != 0))
        usage();
    if (strcmp(o.mode, "graph") == 0 && o.streams == 0) {
        fprintf(stderr, "hipbench: --mode graph needs --streams >= 1 (the null stream cannot "
                        "capture)\n");
        return 2;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    struct summary sum = {.start_ns = now_ns()};
    const char *err = bind(o.link);
    if (err) {
        fprintf(stderr, "hipbench: --link %s: %s\n", o.link, err);
        return 2;
    }
    run(&o, &sum);
    print_summary(&o, &sum);
    return sum.err_call ? 1 : 0;
}
