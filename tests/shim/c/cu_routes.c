/*
 * cu_routes — where do a program's driver lookups land?
 *
 * Loads libcuda.so.1 the way soft-linking programs do (dlopen), but with
 * RTLD_DEEPBIND so that the driver's own function table keeps the driver's
 * addresses even when a preloaded library exports the same names (the real
 * driver behaves so; a plainly loaded test driver would hand out the
 * preloaded hooks through its relocations and hide routing mistakes).
 * Then it resolves names through dlsym and through cuGetProcAddress_v2 and
 * its self-lookup, and prints one JSON line per lookup:
 *
 *   {"how": "procaddr", "base": "cuLaunchKernel", "version": 4000,
 *    "per_thread": 1, "status": 0, "object": "libkrex_shim.so",
 *    "symbol": "cuLaunchKernel_ptsz"}
 *
 * "object" and "symbol" come from dladdr() of the returned pointer.
 * Exit status 0, or 1 when the driver cannot be loaded.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static void where(const char *how, const char *base, int version, int per_thread, int status,
                  void *p)
{
    Dl_info info;
    const char *object = "null", *symbol = "null";
    if (p && dladdr(p, &info)) {
        object = info.dli_fname ? info.dli_fname : "?";
        const char *slash = strrchr(object, '/');
        if (slash)
            object = slash + 1;
        symbol = info.dli_sname ? info.dli_sname : "?";
    }
    printf("{\"how\": \"%s\", \"base\": \"%s\", \"version\": %d, \"per_thread\": %d, "
           "\"status\": %d, \"object\": \"%s\", \"symbol\": \"%s\"}\n",
           how, base, version, per_thread, status, object, symbol);
}

int main(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_DEEPBIND);
    if (!h) {
        fprintf(stderr, "cu_routes: %s\n", dlerror());
        return 1;
    }
    static const char *const by_dlsym[] = {
        "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuMemcpyHtoD_v2", "cuStreamSynchronize",
        "cuDeviceGetCount", "cuMemAlloc_v2", "cuGetProcAddress", "cuGetProcAddress_v2",
        "cuNoSuchFunction",
    };
    for (size_t i = 0; i < sizeof by_dlsym / sizeof by_dlsym[0]; i++) {
        where("dlsym", by_dlsym[i], 0, 0, 0, dlsym(h, by_dlsym[i]));
        where("dlsym_default", by_dlsym[i], 0, 0, 0, dlsym(RTLD_DEFAULT, by_dlsym[i]));
    }
    /* A non-driver name through RTLD_NEXT resolves relative to this program. */
    where("dlsym_next", "open", 0, 0, 0, dlsym(RTLD_NEXT, "open"));

    PFN_cuGetProcAddress_v12000 gpa = (PFN_cuGetProcAddress_v12000)dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) {
        fprintf(stderr, "cu_routes: no cuGetProcAddress_v2\n");
        return 1;
    }
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    void *self = NULL;
    int r = gpa("cuGetProcAddress", &self, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    where("self", "cuGetProcAddress", 13000, 0, r ? r : (int)st, self);
    void *self11 = NULL;
    r = gpa("cuGetProcAddress", &self11, 11030, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    where("self", "cuGetProcAddress", 11030, 0, r ? r : (int)st, self11);
    if (!self)
        return 0;
    static const struct {
        const char *base;
        int version;
    } asks[] = {
        {"cuInit", 2000},          {"cuLaunchKernel", 4000},   {"cuLaunchKernelEx", 11060},
        {"cuMemcpyHtoD", 3020},    {"cuMemsetD8Async", 3020},  {"cuStreamSynchronize", 2000},
        {"cuCtxCreate", 11040},    {"cuCtxCreate", 13000},     {"cuCtxSynchronize", 13000},
        {"cuMemAlloc", 3020},      {"cuDeviceGetCount", 2000}, {"cuStreamBeginCapture", 10010},
        {"cuGraphLaunch", 10000},  {"cuEventRecord", 2000},    {"cuGetProcAddress", 12000},
        {"cuNoSuchFunction", 2000},
    };
    for (int pt = 0; pt <= 1; pt++) {
        cuuint64_t flags = pt ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                              : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
        for (size_t i = 0; i < sizeof asks / sizeof asks[0]; i++) {
            void *p = NULL;
            st = CU_GET_PROC_ADDRESS_SUCCESS;
            r = ((PFN_cuGetProcAddress_v12000)self)(asks[i].base, &p, asks[i].version, flags, &st);
            where("procaddr", asks[i].base, asks[i].version, pt, r ? r : (int)st, p);
        }
    }
    /* The 4-argument resolver reached through the self-lookup at 11.3. */
    if (self11) {
        void *p = NULL;
        r = ((PFN_cuGetProcAddress_v11030)self11)("cuLaunchKernel", &p, 4000,
                                                   CU_GET_PROC_ADDRESS_DEFAULT);
        where("procaddr4", "cuLaunchKernel", 4000, 0, r, p);
    }
    return 0;
}
