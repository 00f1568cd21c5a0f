/*
 * cu_procaddr — cuGetProcAddress answers, one lookup per stdin line
 * (tests/shim/test_procaddr.py).
 *
 * Loads libcuda.so.1 plainly (dlopen), takes cuGetProcAddress_v2 and
 * cuGetProcAddress with dlsym (the shim's hooks when preloaded), and for
 * each line "BASE VERSION PT [4]" (PT 1: per-thread default stream; 4: the
 * 4-argument resolver) prints
 *
 *   {"base": "cuLaunchKernel", "version": 12000, "per_thread": 1, "rc": 0,
 *    "status": 0, "null": 0, "object": "libkrex_shim.so", "symbol": "cuLaunchKernel_ptsz"}
 *
 * "status": symbolStatus (-1 for the 4-argument resolver); "null": the
 * pointer came back NULL; "object"/"symbol": dladdr() of the pointer.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "cu_procaddr: %s\n", dlerror());
        return 1;
    }
    PFN_cuGetProcAddress_v12000 gpa5 = (PFN_cuGetProcAddress_v12000)dlsym(h, "cuGetProcAddress_v2");
    PFN_cuGetProcAddress_v11030 gpa4 = (PFN_cuGetProcAddress_v11030)dlsym(h, "cuGetProcAddress");
    if (!gpa5 || !gpa4)
        return 1;
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        char base[128];
        int version = 0, pt = 0, four = 0;
        if (sscanf(line, "%127s %d %d %d", base, &version, &pt, &four) < 3)
            continue;
        cuuint64_t flags = pt ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                              : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
        void *p = (void *)&main; /* must be overwritten */
        int status = -1, rc;
        if (four == 4) {
            rc = gpa4(base, &p, version, flags);
        } else {
            CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)99;
            rc = gpa5(base, &p, version, flags, &st);
            status = (int)st;
        }
        Dl_info info;
        const char *object = "null", *symbol = "null";
        if (p && dladdr(p, &info)) {
            object = info.dli_fname ? info.dli_fname : "?";
            const char *slash = strrchr(object, '/');
            if (slash)
                object = slash + 1;
            symbol = info.dli_sname ? info.dli_sname : "?";
        }
        printf("{\"base\": \"%s\", \"version\": %d, \"per_thread\": %d, \"rc\": %d, "
               "\"status\": %d, \"null\": %d, \"object\": \"%s\", \"symbol\": \"%s\"}\n",
               base, version, pt, rc, status, p == NULL, object, symbol);
    }
    return 0;
}
