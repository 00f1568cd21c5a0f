/*
 * ctor.c — libctor.so: calls the driver from its constructor, before
 * main() and possibly before the shim's own constructor has run (the
 * "called from another library's constructor" case).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>

int ctor_init_result = -1;

__attribute__((constructor)) static void ctor_calls_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h)
        return;
    __typeof__(&cuInit) init = (__typeof__(&cuInit))dlsym(h, "cuInit");
    ctor_init_result = init ? (int)init(0) : -2;
}
