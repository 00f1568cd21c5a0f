/*
 * fakecall — calls, one per step, the driver entry points other than plain
 * allocations that can fail with CUDA_ERROR_OUT_OF_MEMORY, and prints one
 * JSON line per step (flushed), so tests can see how each behaves when the
 * simulated GPU is full (tests/memory/test_oom_paths.py).
 *
 * usage: fakecall STEP...
 *   prepare     cuInit, device 0's primary context current, and the handles
 *               the calls use: a module's function, a stream, an (empty)
 *               captured graph and its executable graph, the default memory
 *               pool, a reserved address range with a 2 MiB physical
 *               allocation to map into it, a host buffer
 *   call=NAME   one call (NAME below); prints rc, name and its duration (ms)
 *   wait        print {"op": "wait"} and block until a line (or EOF) on stdin
 * NAME: launch launchex module library ctx primary stream graphinst
 *       graphparams graphupload graphlaunch memcreate memmap alloc allocasync
 *       allocpool hostalloc allochost hostregister
 * ctx and primary need only cuInit (call them without prepare to create the
 * process's first context).  Exit status: 0; 1 when prepare fails; 2 on bad
 * usage.  A failing call is reported, not fatal.
 */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MIB (1ull << 20)

static CUfunction func;
static CUstream stream;
static CUgraph graph;
static CUgraphExec exec_graph;
static CUmemoryPool pool;
static CUdeviceptr range;
static CUmemGenericAllocationHandle phys;
static void *host_buf;

static const char *errname(CUresult r)
{
    const char *s = NULL;
    return cuGetErrorName(r, &s) == CUDA_SUCCESS ? s : "?";
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static CUresult prepare(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUresult r = cuInit(0);
    if (!r) r = cuDeviceGet(&dev, 0);
    if (!r) r = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (!r) r = cuCtxSetCurrent(ctx);
    if (!r) r = cuModuleLoadData(&mod, "image");
    if (!r) r = cuModuleGetFunction(&func, mod, "kernel");
    if (!r) r = cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
    if (!r) r = cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED);
    if (!r) r = cuStreamEndCapture(stream, &graph);
    if (!r) r = cuGraphInstantiateWithFlags(&exec_graph, graph, 0);
    if (!r) r = cuDeviceGetDefaultMemPool(&pool, dev);
    if (!r) r = cuMemAddressReserve(&range, 2 * MIB, 0, 0, 0);
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    if (!r) r = cuMemCreate(&phys, 2 * MIB, &prop, 0);
    host_buf = malloc(MIB);
    return r;
}

static CUresult call(const char *name)
{
    uint64_t duration = 1000;
    void *params[] = {&duration};
    CUdeviceptr p = 0;
    void *hp = NULL;
    if (!strcmp(name, "launch"))
        return cuLaunchKernel(func, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL);
    if (!strcmp(name, "launchex")) {
        CUlaunchConfig cfg = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 1,
                              .blockDimY = 1, .blockDimZ = 1, .hStream = stream};
        return cuLaunchKernelEx(&cfg, func, params, NULL);
    }
    if (!strcmp(name, "module")) {
        CUmodule m;
        return cuModuleLoadData(&m, "image");
    }
    if (!strcmp(name, "library")) {
        CUlibrary l;
        return cuLibraryLoadData(&l, "image", NULL, NULL, 0, NULL, NULL, 0);
    }
    if (!strcmp(name, "ctx") || !strcmp(name, "primary")) {
        CUdevice dev;
        CUcontext c;
        CUresult r = cuInit(0);
        if (!r) r = cuDeviceGet(&dev, 0);
        if (r)
            return r;
        return name[0] == 'c' ? cuCtxCreate(&c, NULL, 0, dev) : cuDevicePrimaryCtxRetain(&c, dev);
    }
    if (!strcmp(name, "stream")) {
        CUstream s;
        return cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    }
    if (!strcmp(name, "graphinst")) {
        CUgraphExec e;
        return cuGraphInstantiateWithFlags(&e, graph, 0);
    }
    if (!strcmp(name, "graphparams")) {
        CUgraphExec e;
        CUDA_GRAPH_INSTANTIATE_PARAMS ip = {.flags = 0, .hUploadStream = stream};
        return cuGraphInstantiateWithParams(&e, graph, &ip);
    }
    if (!strcmp(name, "graphupload"))
        return cuGraphUpload(exec_graph, stream);
    if (!strcmp(name, "graphlaunch"))
        return cuGraphLaunch(exec_graph, stream);
    if (!strcmp(name, "memcreate")) {
        CUmemGenericAllocationHandle h;
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
        return cuMemCreate(&h, MIB, &prop, 0);
    }
    if (!strcmp(name, "memmap"))
        return cuMemMap(range, 2 * MIB, 0, phys, 0);
    if (!strcmp(name, "alloc"))
        return cuMemAlloc(&p, MIB);
    if (!strcmp(name, "allocasync"))
        return cuMemAllocAsync(&p, MIB, stream);
    if (!strcmp(name, "allocpool"))
        return cuMemAllocFromPoolAsync(&p, MIB, pool, stream);
    if (!strcmp(name, "hostalloc"))
        return cuMemHostAlloc(&hp, MIB, 0);
    if (!strcmp(name, "allochost"))
        return cuMemAllocHost(&hp, MIB);
    if (!strcmp(name, "hostregister"))
        return cuMemHostRegister(host_buf, MIB, 0);
    fprintf(stderr, "fakecall: unknown call '%s'\n", name);
    exit(2);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: fakecall STEP... (prepare call=NAME wait)\n");
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "prepare")) {
            CUresult r = prepare();
            printf("{\"op\": \"prepare\", \"rc\": %d, \"name\": \"%s\"}\n", (int)r, errname(r));
            fflush(stdout);
            if (r)
                return 1;
        } else if (!strncmp(arg, "call=", 5)) {
            double t0 = now_ms();
            CUresult r = call(arg + 5);
            printf("{\"op\": \"call\", \"call\": \"%s\", \"rc\": %d, \"name\": \"%s\", "
                   "\"ms\": %.3f}\n", arg + 5, (int)r, errname(r), now_ms() - t0);
        } else if (!strcmp(arg, "wait")) {
            printf("{\"op\": \"wait\"}\n");
            fflush(stdout);
            char line[64];
            (void)!fgets(line, sizeof line, stdin);
        } else {
            fprintf(stderr, "fakecall: unknown step '%s'\n", arg);
            return 2;
        }
        fflush(stdout);
    }
    return 0;
}
