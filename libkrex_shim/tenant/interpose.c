/*
 * interpose.c — how the hooks are reached and how they reach the driver
 * (docs/design/shim.md "How calls reach the hooks": exported names, the
 * dlsym override, cuGetProcAddress routing with krex_route_proc_address(),
 * which keeps the driver's own choice of _v2/_v3/_ptsz/_ptds and refuses
 * under krex a pointer to no export cuda.h declares).  The real driver is
 * dlopen("libcuda.so.1") and each real function is bound on first use with
 * the real dlsym (never linked).
 */
#include "interpose.h"
#include "hipinterpose.h"
#include "state.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Atomic(void *) krex_real_fns[KREX_EP_COUNT];

/* The real dlsym; the x86-64 entry stub jumps through it (hidden). */
__attribute__((visibility("hidden"))) void *_Atomic krex_real_dlsym_ptr;

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static void *_Atomic cuda_handle;
/* A handle an application got for libcuda (same object, maybe another
 * name: libcuda.so, a full path). */
static void *_Atomic cuda_handle_seen;

typedef void *(*dlsym_fn)(void *, const char *);

/* ---- the real dlsym and the driver --------------------------------------- */

static dlsym_fn real_dlsym(void)
{
    void *p = atomic_load_explicit(&krex_real_dlsym_ptr, memory_order_acquire);
    if (KREX_LIKELY(p))
        return (dlsym_fn)p;
    /* glibc >= 2.34 links dlsym@GLIBC_2.34 (libc), older ones
     * dlsym@GLIBC_2.2.5 (libdl).  dlvsym is not overridden. */
    p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!p)
        p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (!p) {
        krex_log(KREX_LOG_ERROR, "cannot find the real dlsym (GLIBC_2.34 / GLIBC_2.2.5)");
        abort();
    }
    /* Release: the pointer is complete for the stub's plain load too. */
    atomic_store_explicit(&krex_real_dlsym_ptr, p, memory_order_release);
    return (dlsym_fn)p;
}

void *krex_dlsym_real(void *handle, const char *name) { return real_dlsym()(handle, name); }

static void load_cuda(void)
{
    int saved = errno;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h)
        krex_log(KREX_LOG_ERROR, "cannot load the CUDA driver: %s", dlerror());
    atomic_store_explicit(&cuda_handle, h, memory_order_release);
    errno = saved;
}

void *krex_libcuda(void)
{
    pthread_once(&cuda_once, load_cuda);
    return atomic_load_explicit(&cuda_handle, memory_order_acquire);
}

void *krex_libcuda_bound(void)
{
    return atomic_load_explicit(&cuda_handle, memory_order_acquire);
}

void *krex_libcuda_if_loaded(void)
{
    void *h = atomic_load_explicit(&cuda_handle, memory_order_acquire);
    if (h)
        return h;
    int saved = errno;
    /* RTLD_NOLOAD: a handle only if the process already loaded the driver. */
    void *probe = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (probe) {
        dlclose(probe); /* drops the reference NOLOAD took; the driver stays */
        h = krex_libcuda();
    }
    errno = saved;
    return h;
}

void *krex_bind(int idx)
{
    int saved = errno;
    void *h = krex_libcuda();
    void *p = h ? krex_dlsym_real(h, krex_ep_desc[idx].name) : NULL;
    /* Release pairs with the acquire in krex_real(). */
    if (p)
        atomic_store_explicit(&krex_real_fns[idx], p, memory_order_release);
    errno = saved;
    return p;
}

CUresult krex_missing(int idx)
{
    static _Atomic unsigned char warned[KREX_EP_COUNT];
    if (!atomic_exchange_explicit(&warned[idx], 1, memory_order_relaxed))
        krex_log(KREX_LOG_ERROR, "%s: not in the CUDA driver (libcuda.so.1); returning "
                 "CUDA_ERROR_NOT_FOUND", krex_ep_desc[idx].name);
    return CUDA_ERROR_NOT_FOUND;
}

static int cmp_name(const void *key, const void *elem)
{
    return strcmp((const char *)key, ((const struct krex_ep_desc *)elem)->name);
}

int krex_ep_lookup(const char *name)
{
    const struct krex_ep_desc *d =
        bsearch(name, krex_ep_desc, KREX_EP_COUNT, sizeof krex_ep_desc[0], cmp_name);
    return d ? (int)(d - krex_ep_desc) : -1;
}

/* ---- dlsym ----------------------------------------------------------------- */

static int is_driver_name(const char *name)
{
    /* cu[A-Z]*: cublas*, cudnn*, curl_* are other libraries' names. */
    return name && name[0] == 'c' && name[1] == 'u' && isupper((unsigned char)name[2]);
}

int krex_handle_is_lib(void *handle, void *known, void *_Atomic *seen, const char *prefix)
{
    /* Relaxed: seen is a cache of a handle already checked below; a stale
     * read only means checking again. */
    if (handle == known || handle == atomic_load_explicit(seen, memory_order_relaxed))
        return handle != NULL;
    struct link_map *lm = NULL;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &lm) != 0 || !lm || !lm->l_name)
        return 0;
    const char *base = strrchr(lm->l_name, '/');
    base = base ? base + 1 : lm->l_name;
    if (strncmp(base, prefix, strlen(prefix)) != 0)
        return 0;
    atomic_store_explicit(seen, handle, memory_order_relaxed);
    return 1;
}

static int is_libcuda_handle(void *handle)
{
    return krex_handle_is_lib(handle, atomic_load_explicit(&cuda_handle, memory_order_acquire),
                              &cuda_handle_seen, "libcuda.so");
}

/* Our answer to dlsym(handle, name), or NULL to forward the call to the
 * real dlsym unchanged.  Driver names looked up in libcuda or globally get
 * our hook; the caller's handle is honoured for everything else.  No
 * initialisation here beyond finding the real dlsym (reference: a heavy
 * init inside dlsym deadlocks loaders that call it from constructors). */
__attribute__((visibility("hidden"))) void *krex_dlsym_decide(void *handle, const char *name)
{
    int saved = errno;
    real_dlsym();
    void *hook = NULL;
    if (name && (name[0] == 'h' || name[0] == '_')) {
        hook = krex_hip_dlsym_decide(handle, name); /* HIP's names (hipinterpose.c) */
    } else if (is_driver_name(name)) {
        int idx = krex_ep_lookup(name);
        if (idx >= 0 && krex_ep_hook[idx]) {
            if (handle == RTLD_DEFAULT || handle == RTLD_NEXT)
                hook = krex_ep_hook[idx];
            else if (is_libcuda_handle(handle) && krex_dlsym_real(handle, name))
                hook = krex_ep_hook[idx]; /* only names this driver has */
        }
    }
    errno = saved;
    return hook;
}

#if !defined(__x86_64__)
/* Without the assembly entry the forwarded call carries our return
 * address: dlsym(RTLD_NEXT, x) for a non-driver name then resolves
 * relative to this library (docs/design/shim.md, "How calls reach the hooks", 2). */
KREX_EXPORT void *dlsym(void *handle, const char *name)
{
    void *hook = krex_dlsym_decide(handle, name);
    return hook ? hook : real_dlsym()(handle, name);
}
#endif

/* ---- cuGetProcAddress routing -------------------------------------------- */

struct route {
    uintptr_t addr; /* the driver's function */
    int idx;        /* its exported name */
};

static pthread_once_t route_once = PTHREAD_ONCE_INIT;
static struct route *routes;
static size_t nroutes;

static int cmp_route(const void *a, const void *b)
{
    const struct route *x = a, *y = b;
    if (x->addr != y->addr)
        return x->addr < y->addr ? -1 : 1;
    return x->idx - y->idx;
}

/* Address of every declared name in this driver, sorted (built once, on
 * the first resolver call; ~600 lookups). */
static void build_routes(void)
{
    int saved = errno;
    void *h = krex_libcuda();
    if (h && (routes = calloc(2 * KREX_EP_COUNT, sizeof *routes))) {
        for (int i = 0; i < KREX_EP_COUNT; i++) {
            void *p = krex_dlsym_real(h, krex_ep_desc[i].name);
            if (p)
                routes[nroutes++] = (struct route){(uintptr_t)p, i};
            /* A driver that takes its functions' addresses through its GOT
             * hands out our hooks already (we interpose on its exports). */
            if (krex_ep_hook[i])
                routes[nroutes++] = (struct route){(uintptr_t)krex_ep_hook[i], i};
        }
        qsort(routes, nroutes, sizeof *routes, cmp_route);
    }
    krex_log(KREX_LOG_DEBUG, "routing table: %zu driver entry points", nroutes);
    errno = saved;
}

/* 1 when `p` is a known export; *hook = its hook (NULL when unhooked).
 * Several names at one address (an alias) pick the first hooked one. */
static int route_lookup(void *p, void **hook)
{
    size_t lo = 0, hi = nroutes;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (routes[mid].addr < (uintptr_t)p)
            lo = mid + 1;
        else
            hi = mid;
    }
    int found = 0;
    *hook = NULL;
    for (size_t i = lo; i < nroutes && routes[i].addr == (uintptr_t)p; i++) {
        found = 1;
        if (krex_ep_hook[routes[i].idx]) {
            *hook = krex_ep_hook[routes[i].idx];
            break;
        }
    }
    return found;
}

/* Names resolved to no export cuda.h declares that are handed out
 * unhooked anyway: query-only, no device work, no context of their own
 * (the driver exports them; their headers are cudaProfiler.h, cudaGL.h,
 * cudaVDPAU.h).  docs/design/shim.md, "How calls reach the hooks", 3. */
static const char *const proc_allow[] = {
    "cuGLGetDevices",   /* the devices of the current GL context */
    "cuProfilerStart",  /* profiler collection on/off: no GPU work */
    "cuProfilerStop",
    "cuVDPAUGetDevice", /* the device of a VDPAU device */
};

static int proc_allowed(const char *symbol)
{
    for (size_t i = 0; i < sizeof proc_allow / sizeof proc_allow[0]; i++)
        if (!strcmp(symbol, proc_allow[i]))
            return 1;
    return 0;
}

/* One error line per refused name (the first 32 names; then silent). */
static void say_refused(const char *symbol, int cudaVersion)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static char said[32][64];
    static int nsaid;
    pthread_mutex_lock(&mu);
    int fresh = 1;
    for (int i = 0; i < nsaid && fresh; i++)
        if (!strncmp(said[i], symbol, sizeof said[i] - 1))
            fresh = 0;
    if (fresh && nsaid < 32)
        snprintf(said[nsaid++], sizeof said[0], "%s", symbol);
    else
        fresh = 0;
    pthread_mutex_unlock(&mu);
    if (fresh)
        krex_log(KREX_LOG_ERROR, "cuGetProcAddress(\"%s\", CUDA %d): the driver returned a "
                 "function cuda.h does not declare (a newer driver?); refused with "
                 "CUDA_ERROR_NOT_FOUND, since its GPU calls would bypass krex's gate",
                 symbol, cudaVersion);
}

CUresult krex_route_proc_address(CUresult r, const char *symbol, void **pfn, int cudaVersion,
                                 CUdriverProcAddressQueryResult *symbolStatus, int arity)
{
    if (r != CUDA_SUCCESS || !pfn || !*pfn)
        return r;
    int saved = errno;
    pthread_once(&route_once, build_routes);
    void *hook = NULL;
    if (!routes) {
        krex_log(KREX_LOG_WARN, "%s: no routing table; pointer left as is",
                 symbol ? symbol : "?");
    } else if (route_lookup(*pfn, &hook)) {
        if (hook)
            *pfn = hook;
    } else if (symbol && (!strcmp(symbol, "cuGetProcAddress") ||
                          !strcmp(symbol, "cuGetProcAddress_v2"))) {
        /* The one guess we allow: the resolver's self-lookup must return
         * our resolver or every later lookup bypasses the shim.  The
         * driver chose the 5-argument ABI from CUDA 12.0 on. */
        *pfn = krex_ep_hook[cudaVersion >= 12000 ? KREX_EP_cuGetProcAddress_v2
                                                 : KREX_EP_cuGetProcAddress];
        krex_log(KREX_LOG_WARN, "self-lookup of %s returned an unknown pointer; "
                 "substituted our resolver for CUDA %d", symbol, cudaVersion);
    } else if ((symbol && proc_allowed(symbol)) || !krex_under_krex()) {
        krex_log(KREX_LOG_DEBUG, "%s (v%d, %d-arg resolver): unknown pointer %p left as is",
                 symbol ? symbol : "?", cudaVersion, arity, *pfn);
    } else {
        /* As the driver answers a name it does not have. */
        say_refused(symbol ? symbol : "?", cudaVersion);
        *pfn = NULL;
        if (symbolStatus)
            *symbolStatus = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        r = CUDA_ERROR_NOT_FOUND;
    }
    errno = saved;
    return r;
}
