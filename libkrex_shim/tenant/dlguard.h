/*
 * dlguard.h — the dlopen/dlmopen decisions (dlguard.c), called by the
 * exported entries of dl_x86_64.S.  Internal, hidden.
 */
#ifndef KREX_DLGUARD_H
#define KREX_DLGUARD_H

#include "base.h"

#include <dlfcn.h>

/* The real functions; the x86-64 entries jump through them. */
__attribute__((visibility("hidden"))) extern void *_Atomic krex_real_dlopen_ptr;
__attribute__((visibility("hidden"))) extern void *_Atomic krex_real_dlmopen_ptr;

/* 0: the entry calls the real function (the pointer above is set); 1:
 * refused (the entry returns NULL, dlerror() says why). */
__attribute__((visibility("hidden"))) int krex_dlopen_decide(const char *file, int mode,
                                                             const void *caller);
__attribute__((visibility("hidden"))) int krex_dlmopen_decide(Lmid_t lmid, const char *file,
                                                              int mode, const void *caller);

#endif /* KREX_DLGUARD_H */
