/*
 * dlo.c — the libraries of dl_open (tests/shim/test_dlopen.py), one source
 * built several ways:
 *
 *   libdlo_caller.so   (CALLER)    RUNPATH $ORIGIN/dlo; dlo_open() calls dlopen,
 *                                  dlo_mopen() dlmopen, from this library: a bare
 *                                  name is found through its RUNPATH
 *   dlo/libdlo_plain.so (PLAIN)    needs libdlo_leaf.so, found through its own
 *                                  RUNPATH $ORIGIN
 *   dlo/libdlo_leaf.so  (LEAF)
 *   dlo/libdlo_user.so  (USER)     needs libcuda.so.1 (DT_NEEDED): a CUDA driver user
 *   dlo/libdlo_hipuser.so (HIPUSER) needs libamdhip64.so.6 (DT_NEEDED): a HIP user
 */
#define _GNU_SOURCE
#include <dlfcn.h>

#ifdef CALLER
/* Not tail calls: the loader must see this library as the caller. */
static void *volatile last;
void *dlo_open(const char *name, int mode)
{
    last = dlopen(name, mode);
    return last;
}
void *dlo_mopen(const char *name, int mode)
{
    last = dlmopen(LM_ID_NEWLM, name, mode);
    return last;
}
#endif

#ifdef LEAF
int dlo_leaf(void) { return 7; }
#endif

#ifdef PLAIN
int dlo_leaf(void);
int dlo_plain(void) { return dlo_leaf() + 1; }
#endif

#ifdef USER
#include <cuda.h>
/* Bound in this library's scope: with RTLD_DEEPBIND, the driver's own. */
int dlo_user(void) { return (int)cuInit(0); }
#endif

#ifdef HIPUSER
/* HIP's hipInit (hipError_t is an int enum); bound in this library's scope:
 * with RTLD_DEEPBIND, the runtime's own. */
int hipInit(unsigned int flags);
int dlo_user(void) { return hipInit(0); }
#endif
