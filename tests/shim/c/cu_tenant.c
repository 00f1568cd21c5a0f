/*
 * cu_tenant — a scriptable CUDA driver program for the interposition tests.
 *
 * Reaches the driver like a soft-linking program (dlopen("libcuda.so.1") +
 * dlsym of each exported name), so under LD_PRELOAD it goes through the
 * shim's dlsym override.  Reads one command per line on stdin and answers
 * one JSON line per command on stdout (flushed):
 *
 *   {"cmd": "launch", "rc": 0, "t0": <ns>, "t1": <ns>, ...}
 *
 * t0/t1: CLOCK_MONOTONIC ns around the command.  Commands:
 *
 *   init [ctx]                 cuInit, device 0, primary context current
 *                              (ctx: a created context, cuCtxCreate_v4)
 *   stream ID [nonblocking]    create stream number ID (1..15)
 *   launch ID N NS             N kernels of NS ns on stream ID (0 = legacy NULL)
 *   bglaunch ID N NS           the same from a new thread; its reply comes when done
 *   bglaunchctx ID N NS        bglaunch from a thread that first makes the context of
 *                              "init" current (cuCtxSetCurrent, then the launches)
 *   bgstart                    start a worker thread with the context of "init" current
 *   bgrun ID N NS              launch N kernels of NS ns on stream ID from that worker;
 *                              its reply ("bglaunch") comes when done
 *   streamdestroy ID           cuStreamDestroy_v2 of stream ID
 *   newctx                     cuCtxCreate_v4 (current on this thread): "ctx" = its number
 *   usectx I | ctxdestroy I    cuCtxSetCurrent / cuCtxDestroy_v2 of context number I
 *                              (0: the context of "init ctx")
 *   meminfo                    cuMemGetInfo_v2: adds "free" and "total" (bytes)
 *   begin ID MODE              cuStreamBeginCapture_v2 (global|thread|relaxed)
 *   end ID                     cuStreamEndCapture + cuGraphInstantiateWithFlags
 *   graph ID                   cuGraphLaunch of the last instantiated graph on ID
 *   sync ID | ctxsync          cuStreamSynchronize / cuCtxSynchronize
 *   region_begin EPOCH L2      krex_shim_region_begin (found with dlsym(RTLD_DEFAULT)):
 *                              adds "flushed" (krex_shim_region_l2_flushed)
 *   region_end                 krex_shim_region_end: adds "sync_ns" and "launches"
 *   region_warm US             krex_shim_region_warm: adds "spent" (its result)
 *   exitflush PATH             exit(0) with 256 KiB of fully buffered output for
 *                              PATH (a FIFO) still in stdio: the exit blocks in
 *                              its final flush until the test reads (no reply)
 *   teardown                   exit(0); an atexit handler registered before the
 *                              first cuInit (so it runs after the shim's) answers
 *                              {"cmd": "teardown"}, reads one more line, "go NS",
 *                              then makes teardown calls: a kernel of NS ns on the
 *                              legacy stream, cuMemAlloc_v2 + cuMemFree_v2,
 *                              cuModuleUnload; answers {"cmd": "go", "rc": ...}
 *   jmpcopy NS                 a kernel of NS ns on the legacy stream, then cuMemcpyDtoH_v2
 *                              (waits for it in the driver); a SIGALRM handler siglongjmps
 *                              out of the copy after 100 ms: rc 1 when it did
 *   cancelcopy NS              the same copy from a new thread, pthread_cancel'ed after
 *                              100 ms (inside the driver's sleep): rc 1 when cancelled
 *   quit
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_STREAMS 16
#define MAX_CTXS 64

#define FN(name) static __typeof__(&name) p_##name
FN(cuInit);
FN(cuDeviceGet);
FN(cuDevicePrimaryCtxRetain);
FN(cuCtxSetCurrent);
FN(cuCtxCreate_v4);
FN(cuCtxSynchronize);
FN(cuModuleLoadData);
FN(cuModuleGetFunction);
FN(cuModuleUnload);
FN(cuMemAlloc_v2);
FN(cuMemFree_v2);
FN(cuStreamCreate);
FN(cuStreamSynchronize);
FN(cuLaunchKernel);
FN(cuStreamBeginCapture_v2);
FN(cuStreamEndCapture);
FN(cuGraphInstantiateWithFlags);
FN(cuGraphLaunch);
FN(cuStreamDestroy_v2);
FN(cuCtxDestroy_v2);
FN(cuMemGetInfo_v2);
FN(cuMemcpyDtoH_v2);

static CUstream streams[MAX_STREAMS];
static CUcontext init_ctx; /* the context of "init" */
static CUcontext ctxs[MAX_CTXS];
static int nctxs = 1; /* ctxs[0]: the context of "init ctx" */
static pthread_mutex_t out_mu = PTHREAD_MUTEX_INITIALIZER;
static CUfunction kernel;
static CUmodule module;
static int tearing_down;
static CUgraphExec graph_exec;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int bind_all(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "cu_tenant: %s\n", dlerror());
        return -1;
    }
#define BIND(name)                                                                     \
    if (!(p_##name = (__typeof__(&name))dlsym(h, #name))) {                            \
        fprintf(stderr, "cu_tenant: %s missing\n", #name);                            \
        return -1;                                                                     \
    }
    BIND(cuInit);
    BIND(cuDeviceGet);
    BIND(cuDevicePrimaryCtxRetain);
    BIND(cuCtxSetCurrent);
    BIND(cuCtxCreate_v4);
    BIND(cuCtxSynchronize);
    BIND(cuModuleLoadData);
    BIND(cuModuleGetFunction);
    BIND(cuModuleUnload);
    BIND(cuMemAlloc_v2);
    BIND(cuMemFree_v2);
    BIND(cuStreamCreate);
    BIND(cuStreamSynchronize);
    BIND(cuLaunchKernel);
    BIND(cuStreamBeginCapture_v2);
    BIND(cuStreamEndCapture);
    BIND(cuGraphInstantiateWithFlags);
    BIND(cuGraphLaunch);
    BIND(cuStreamDestroy_v2);
    BIND(cuCtxDestroy_v2);
    BIND(cuMemGetInfo_v2);
    BIND(cuMemcpyDtoH_v2);
    return 0;
}

static CUstream stream_of(int id)
{
    return id > 0 && id < MAX_STREAMS ? streams[id] : NULL;
}

static int cmd_init(const char *how)
{
    CUdevice dev;
    CUcontext ctx;
    int r = p_cuInit(0);
    if (!r)
        r = p_cuDeviceGet(&dev, 0);
    if (!r && how && !strcmp(how, "ctx") && !(r = p_cuCtxCreate_v4(&ctx, NULL, 0, dev)))
        ctxs[0] = ctx;
    else if (!r && !(r = p_cuDevicePrimaryCtxRetain(&ctx, dev)))
        r = p_cuCtxSetCurrent(ctx);
    if (!r)
        init_ctx = ctx;
    if (!r)
        r = p_cuModuleLoadData(&module, "cu_tenant");
    if (!r)
        r = p_cuModuleGetFunction(&kernel, module, "duration_kernel");
    return r;
}

static int launch(int id, long n, uint64_t ns)
{
    for (long i = 0; i < n; i++) {
        uint64_t d = ns;
        void *params[] = {&d};
        int r = p_cuLaunchKernel(kernel, 1, 1, 1, 32, 1, 1, 0, stream_of(id), params, NULL);
        if (r)
            return r;
    }
    return 0;
}

static void reply(const char *cmd, int r, uint64_t t0)
{
    printf("{\"cmd\": \"%s\", \"rc\": %d, \"t0\": %llu, \"t1\": %llu}\n", cmd, r,
           (unsigned long long)t0, (unsigned long long)now_ns());
    fflush(stdout);
}

/* Registered before the first cuInit: runs after the shim's exit handler,
 * like a library's teardown (the runtime's, a framework's destructors). */
static void teardown_at_exit(void)
{
    if (!tearing_down)
        return;
    reply("teardown", 0, now_ns());
    char line[64] = "";
    if (!fgets(line, sizeof line, stdin) || strncmp(line, "go ", 3) != 0)
        return;
    uint64_t t0 = now_ns();
    int r = launch(0, 1, strtoull(line + 3, NULL, 10));
    CUdeviceptr p = 0;
    if (!r)
        r = p_cuMemAlloc_v2(&p, 1 << 20);
    if (!r)
        r = p_cuMemFree_v2(p);
    if (!r)
        r = p_cuModuleUnload(module);
    reply("go", r, t0);
}

/* SIGUSR1: a gated call from a signal handler (cuInit), answered
 * with write(2) ("sig"). */
static void on_usr1(int sig)
{
    (void)sig;
    int r = p_cuInit(0);
    char buf[64];
    int n = snprintf(buf, sizeof buf, "{\"cmd\": \"sig\", \"rc\": %d}\n", r);
    if (write(1, buf, (size_t)n) < 0) {
    }
}

/* jmpcopy: a SIGALRM timeout handler that siglongjmps out of the call it
 * interrupts, as a C benchmark's watchdog does. */
static sigjmp_buf jmp_env;
static volatile sig_atomic_t jmp_armed;

static void on_alarm(int sig)
{
    (void)sig;
    if (jmp_armed) {
        jmp_armed = 0;
        siglongjmp(jmp_env, 1);
    }
}

/* A kernel of `ns` on the legacy stream, then a synchronous copy that waits
 * for it inside the driver; SIGALRM after 100 ms jumps out of the copy.
 * 1 when it did, else the copy's result. */
static int cmd_jmpcopy(uint64_t ns)
{
    static CUdeviceptr buf;
    static char host[64];
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    int r = sigaction(SIGALRM, &sa, NULL);
    if (!r && !buf)
        r = p_cuMemAlloc_v2(&buf, sizeof host);
    if (!r)
        r = launch(0, 1, ns);
    if (r)
        return r;
    if (sigsetjmp(jmp_env, 1))
        return 1;
    jmp_armed = 1;
    struct itimerval it = {{0, 0}, {0, 100000}};
    setitimer(ITIMER_REAL, &it, NULL);
    r = p_cuMemcpyDtoH_v2(host, buf, sizeof host);
    jmp_armed = 0;
    return r;
}

/* cancelcopy: a thread cancelled inside a synchronous copy (the driver's
 * sleep is a cancellation point). */
static void *copy_thread(void *arg)
{
    static char host[64];
    CUdeviceptr *buf = arg;
    p_cuCtxSetCurrent(init_ctx);
    p_cuMemcpyDtoH_v2(host, *buf, sizeof host);
    return NULL;
}

static int cmd_cancelcopy(uint64_t ns)
{
    static CUdeviceptr buf;
    pthread_t t;
    int r = buf ? 0 : p_cuMemAlloc_v2(&buf, 64);
    if (!r)
        r = launch(0, 1, ns);
    if (r)
        return r;
    if (pthread_create(&t, NULL, copy_thread, &buf) != 0)
        return -3;
    struct timespec tick = {0, 100000000};
    nanosleep(&tick, NULL);
    pthread_cancel(t);
    void *res = NULL;
    pthread_join(t, &res);
    return res == PTHREAD_CANCELED ? 1 : 0;
}

struct bg {
    int id;
    long n;
    uint64_t ns;
    int set_ctx;
};

static void *bg_launch(void *arg)
{
    struct bg *b = arg;
    uint64_t t0 = now_ns();
    int r = b->set_ctx ? p_cuCtxSetCurrent(init_ctx) : 0;
    if (!r)
        r = launch(b->id, b->n, b->ns);
    pthread_mutex_lock(&out_mu);
    printf("{\"cmd\": \"bglaunch\", \"rc\": %d, \"t0\": %llu, \"t1\": %llu}\n", r,
           (unsigned long long)t0, (unsigned long long)now_ns());
    fflush(stdout);
    pthread_mutex_unlock(&out_mu);
    free(b);
    return NULL;
}

static int cmd_bglaunch(int id, long n, uint64_t ns, int set_ctx)
{
    struct bg *b = malloc(sizeof *b);
    pthread_t t;
    if (!b)
        return -3;
    *b = (struct bg){id, n, ns, set_ctx};
    if (pthread_create(&t, NULL, bg_launch, b) != 0)
        return -3;
    pthread_detach(t);
    return 0;
}

/* The worker of bgstart/bgrun: one job at a time. */
static pthread_mutex_t job_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t job_cv = PTHREAD_COND_INITIALIZER;
static struct bg job;
static int job_ready;

static void *bg_worker(void *arg)
{
    int r = p_cuCtxSetCurrent(init_ctx);
    pthread_mutex_lock(&out_mu);
    printf("{\"cmd\": \"bgstart\", \"rc\": %d}\n", r);
    fflush(stdout);
    pthread_mutex_unlock(&out_mu);
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&job_mu);
        while (!job_ready)
            pthread_cond_wait(&job_cv, &job_mu);
        struct bg *b = malloc(sizeof *b);
        if (b)
            *b = job;
        job_ready = 0;
        pthread_mutex_unlock(&job_mu);
        if (b)
            bg_launch(b); /* replies and frees b */
    }
    return NULL;
}

static int cmd_bgstart(void)
{
    pthread_t t;
    if (pthread_create(&t, NULL, bg_worker, NULL) != 0)
        return -3;
    pthread_detach(t);
    return 0;
}

static void cmd_bgrun(int id, long n, uint64_t ns)
{
    pthread_mutex_lock(&job_mu);
    job = (struct bg){id, n, ns, 0};
    job_ready = 1;
    pthread_cond_signal(&job_cv);
    pthread_mutex_unlock(&job_mu);
}

static CUstreamCaptureMode mode_of(const char *s)
{
    if (s && !strcmp(s, "thread"))
        return CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    if (s && !strcmp(s, "relaxed"))
        return CU_STREAM_CAPTURE_MODE_RELAXED;
    return CU_STREAM_CAPTURE_MODE_GLOBAL;
}

int main(void)
{
    if (bind_all() || atexit(teardown_at_exit) != 0)
        return 1;
    int (*region_begin)(uint32_t, int) =
        (int (*)(uint32_t, int))dlsym(RTLD_DEFAULT, "krex_shim_region_begin");
    int (*region_end)(uint64_t *, uint64_t *) =
        (int (*)(uint64_t *, uint64_t *))dlsym(RTLD_DEFAULT, "krex_shim_region_end");
    int (*l2_flushed)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "krex_shim_region_l2_flushed");
    int (*region_warm)(uint32_t) =
        (int (*)(uint32_t))dlsym(RTLD_DEFAULT, "krex_shim_region_warm");
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        char cmd[32] = "", a[200] = "", b[32] = "", c[32] = "";
        if (sscanf(line, "%31s %199s %31s %31s", cmd, a, b, c) < 1)
            continue;
        uint64_t t0 = now_ns(), sync_ns = 0, launches = 0;
        int r = 0, extra = 0, flushed = -1, ctx_no = -1, warmed = 0, spent = 0;
        size_t mfree = 0, mtotal = 0;
        if (!strcmp(cmd, "init")) {
            r = cmd_init(a);
        } else if (!strcmp(cmd, "stream")) {
            int id = atoi(a);
            r = id > 0 && id < MAX_STREAMS
                    ? p_cuStreamCreate(&streams[id],
                                       strcmp(b, "nonblocking") ? 0 : CU_STREAM_NON_BLOCKING)
                    : CUDA_ERROR_INVALID_VALUE;
        } else if (!strcmp(cmd, "launch")) {
            r = launch(atoi(a), atol(b), strtoull(c, NULL, 10));
        } else if (!strcmp(cmd, "bglaunch") || !strcmp(cmd, "bglaunchctx")) {
            if ((r = cmd_bglaunch(atoi(a), atol(b), strtoull(c, NULL, 10),
                                  !strcmp(cmd, "bglaunchctx"))) == 0)
                continue; /* the thread replies */
        } else if (!strcmp(cmd, "bgstart")) {
            if ((r = cmd_bgstart()) == 0)
                continue; /* the worker replies */
        } else if (!strcmp(cmd, "bgrun")) {
            cmd_bgrun(atoi(a), atol(b), strtoull(c, NULL, 10));
            continue; /* the worker replies */
        } else if (!strcmp(cmd, "streamdestroy")) {
            r = p_cuStreamDestroy_v2(stream_of(atoi(a)));
        } else if (!strcmp(cmd, "newctx")) {
            CUdevice dev;
            r = nctxs < MAX_CTXS ? p_cuDeviceGet(&dev, 0) : CUDA_ERROR_INVALID_VALUE;
            if (!r && !(r = p_cuCtxCreate_v4(&ctxs[nctxs], NULL, 0, dev)))
                ctx_no = nctxs++;
        } else if (!strcmp(cmd, "usectx")) {
            r = p_cuCtxSetCurrent(ctxs[atoi(a) % MAX_CTXS]);
        } else if (!strcmp(cmd, "ctxdestroy")) {
            r = p_cuCtxDestroy_v2(ctxs[atoi(a) % MAX_CTXS]);
        } else if (!strcmp(cmd, "meminfo")) {
            r = p_cuMemGetInfo_v2(&mfree, &mtotal);
        } else if (!strcmp(cmd, "begin")) {
            r = p_cuStreamBeginCapture_v2(stream_of(atoi(a)), mode_of(b));
        } else if (!strcmp(cmd, "end")) {
            CUgraph graph = NULL;
            r = p_cuStreamEndCapture(stream_of(atoi(a)), &graph);
            if (!r)
                r = p_cuGraphInstantiateWithFlags(&graph_exec, graph, 0);
        } else if (!strcmp(cmd, "graph")) {
            r = p_cuGraphLaunch(graph_exec, stream_of(atoi(a)));
        } else if (!strcmp(cmd, "sync")) {
            r = p_cuStreamSynchronize(stream_of(atoi(a)));
        } else if (!strcmp(cmd, "ctxsync")) {
            r = p_cuCtxSynchronize();
        } else if (!strcmp(cmd, "region_begin")) {
            r = region_begin ? region_begin((uint32_t)atoi(a), atoi(b)) : -1;
            flushed = l2_flushed ? l2_flushed() : -1;
        } else if (!strcmp(cmd, "region_end")) {
            r = region_end ? region_end(&sync_ns, &launches) : -1;
            extra = 1;
        } else if (!strcmp(cmd, "region_warm")) {
            r = region_warm ? 0 : -1;
            spent = region_warm ? region_warm((uint32_t)strtoul(a, NULL, 10)) : 0;
            warmed = 1;
        } else if (!strcmp(cmd, "exitflush")) {
            FILE *f = fopen(a, "w");
            static char big[1 << 20], chunk[4096];
            if (!f || setvbuf(f, big, _IOFBF, sizeof big) != 0)
                return 3;
            memset(chunk, 'x', sizeof chunk);
            for (int i = 0; i < 64; i++)
                fwrite(chunk, 1, sizeof chunk, f);
            exit(0);
        } else if (!strcmp(cmd, "teardown")) {
            tearing_down = 1;
            exit(0);
        } else if (!strcmp(cmd, "sighandler")) {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = on_usr1;
            r = sigaction(SIGUSR1, &sa, NULL);
        } else if (!strcmp(cmd, "jmpcopy")) {
            r = cmd_jmpcopy(strtoull(a, NULL, 10));
        } else if (!strcmp(cmd, "cancelcopy")) {
            r = cmd_cancelcopy(strtoull(a, NULL, 10));
        } else if (!strcmp(cmd, "quit")) {
            break;
        } else {
            r = -2;
        }
        uint64_t t1 = now_ns();
        pthread_mutex_lock(&out_mu);
        printf("{\"cmd\": \"%s\", \"rc\": %d, \"t0\": %llu, \"t1\": %llu", cmd, r,
               (unsigned long long)t0, (unsigned long long)t1);
        if (ctx_no >= 0)
            printf(", \"ctx\": %d", ctx_no);
        if (!strcmp(cmd, "meminfo"))
            printf(", \"free\": %zu, \"total\": %zu", mfree, mtotal);
        if (extra)
            printf(", \"sync_ns\": %llu, \"launches\": %llu", (unsigned long long)sync_ns,
                   (unsigned long long)launches);
        if (flushed >= 0)
            printf(", \"flushed\": %d", flushed);
        if (warmed)
            printf(", \"spent\": %d", spent);
        printf("}\n");
        fflush(stdout);
        pthread_mutex_unlock(&out_mu);
    }
    return 0;
}
