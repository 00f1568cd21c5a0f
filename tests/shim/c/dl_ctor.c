/*
 * dl_ctor — linked against libctor.so, whose constructor calls cuInit.
 * Prints "init=<CUresult> active=<krex_shim_active()>" (active=-1 without
 * the shim).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

extern int ctor_init_result;

int main(void)
{
    int (*active)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "krex_shim_active");
    printf("init=%d active=%d\n", ctor_init_result, active ? active() : -1);
    return 0;
}
