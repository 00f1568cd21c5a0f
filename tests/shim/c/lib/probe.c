/*
 * probe.c — built twice, as libprobe_a.so (WHICH "a") and libprobe_b.so
 * (WHICH "b"), for dl_next: both define probe_id(); only a defines
 * probe_next(), which asks dlsym(RTLD_NEXT, "probe_id") for the definition
 * after its own, as an interposing library does.
 */
#define _GNU_SOURCE
#include <dlfcn.h>

const char *probe_id(void) { return WHICH; }

#ifdef WITH_NEXT
const char *probe_next(void)
{
    const char *(*next)(void) = (const char *(*)(void))dlsym(RTLD_NEXT, "probe_id");
    return next ? next() : "none";
}
#endif
