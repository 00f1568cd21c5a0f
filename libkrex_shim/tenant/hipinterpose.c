/*
 * hipinterpose.c — the real HIP runtime behind the HIP hooks
 * (hip_hooks.gen.c), as interpose.c is the CUDA driver behind the CUDA ones.
 *
 * The runtime is dlopen("libamdhip64.so.6") (else "libamdhip64.so") at the
 * first call of a HIP hook, never before; under krex that call also runs
 * hipInit inside the gate (hipcall.h), and a runtime the table cannot gate
 * is refused (docs/design/shim.md "HIP gating", "HIP runtime versions").
 * Each real function is bound on first use with the real dlsym, under its
 * exported symbol (a C++-linkage name's mangled one, else its plain name).
 */
#include "hipinterpose.h"
#include "interpose.h"
#include "state.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if __ELF_NATIVE_CLASS == 64
#define ST_TYPE ELF64_ST_TYPE
#define ST_BIND ELF64_ST_BIND
#define ST_VISIBILITY ELF64_ST_VISIBILITY
#else
#define ST_TYPE ELF32_ST_TYPE
#define ST_BIND ELF32_ST_BIND
#define ST_VISIBILITY ELF32_ST_VISIBILITY
#endif

_Atomic(void *) krex_hip_real_fns[KREX_HIP_EP_COUNT];

static pthread_once_t hip_once = PTHREAD_ONCE_INIT;
/* Written under hip_once (then read after pthread_once, which orders it),
 * and published with a release store for krex_hip_loaded()'s acquire. */
static void *_Atomic hip_handle;
static int hip_refused; /* REFUSED_RUNTIME, or REFUSED_PROCESS: nothing loaded */
static char refusal[384];
static int init_result = -1; /* hipInit's, when the load initialized the runtime */
enum { REFUSED_RUNTIME = 1, REFUSED_PROCESS = 2 };
/* The thread running load_hip() and the handle it loaded: a HIP hook it
 * reaches meanwhile (the runtime calling its own exported names during
 * hipInit) binds from that handle, not through hip_once (which it holds). */
static __thread int in_load;
static void *loading_handle; /* written and read by the loading thread only */
/* A handle an application got for the runtime (another name or path). */
static void *_Atomic hip_handle_seen;

/* ---- the runtime's exports ------------------------------------------------- */

static int cmp_name(const void *key, const void *elem)
{
    return strcmp((const char *)key, ((const struct krex_hip_ep_desc *)elem)->name);
}

static int cmp_str(const void *key, const void *elem)
{
    return strcmp((const char *)key, *(const char *const *)elem);
}

/* The table's row of `name` (a plain name), or -1. */
static int ep_lookup(const char *name)
{
    const struct krex_hip_ep_desc *d = bsearch(name, krex_hip_ep_desc, KREX_HIP_EP_COUNT,
                                               sizeof krex_hip_ep_desc[0], cmp_name);
    return d ? (int)(d - krex_hip_ep_desc) : -1;
}

/* The row whose exported symbol is `sym` (a C++ mangling), or -1. */
static int ep_lookup_symbol(const char *sym)
{
    for (int i = 0; i < KREX_HIP_EP_COUNT; i++)
        if ((krex_hip_ep_desc[i].flags & KREX_HIP_EPF_CXX) &&
            !strcmp(krex_hip_ep_desc[i].symbol, sym))
            return i;
    return -1;
}

static int known_export(const char *name)
{
    return ep_lookup(name) >= 0 || ep_lookup_symbol(name) >= 0 ||
           bsearch(name, krex_hip_known_exports, KREX_HIP_KNOWN_EXPORTS_N,
                   sizeof krex_hip_known_exports[0], cmp_str) != NULL;
}

/* A name of the HIP API: hip..., __hip..., or a C++ mangling of one. */
static int is_hip_export(const char *name)
{
    return !strncmp(name, "hip", 3) || !strncmp(name, "__hip", 5) ||
           (!strncmp(name, "_Z", 2) && strstr(name, "hip") != NULL);
}

/* A dynamic-section address, relocated (glibc relocates the entries of a
 * writable dynamic section in place; a read-only one keeps link-time
 * values, which lie below the load address of a shared object). */
static const void *dyn_ptr(const struct link_map *lm, ElfW(Addr) p)
{
    return (const void *)(p < lm->l_addr ? p + lm->l_addr : p);
}

/* The number of dynamic symbols, from DT_HASH or DT_GNU_HASH (0: unknown). */
static size_t dynsym_count(const struct link_map *lm, const ElfW(Word) *hash,
                           const uint32_t *gnu)
{
    if (hash)
        return hash[1]; /* nchain */
    if (!gnu)
        return 0;
    uint32_t nbuckets = gnu[0], symoffset = gnu[1], bloom_size = gnu[2];
    const ElfW(Addr) *bloom = (const ElfW(Addr) *)(const void *)&gnu[4];
    const uint32_t *buckets = (const uint32_t *)(const void *)&bloom[bloom_size];
    const uint32_t *chain = &buckets[nbuckets];
    uint32_t last = 0;
    for (uint32_t b = 0; b < nbuckets; b++)
        if (buckets[b] > last)
            last = buckets[b];
    if (last < symoffset)
        return symoffset;
    while (!(chain[last - symoffset] & 1))
        last++;
    (void)lm;
    return (size_t)last + 1;
}

/* The first hip function the runtime exports that the table does not know,
 * copied to `out` (with how many there are in *n); 0 when none, -1 when the
 * exports cannot be read. */
static int unknown_exports(void *handle, char *out, size_t outlen, int *n)
{
    struct link_map *lm = NULL;
    *n = 0;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &lm) != 0 || !lm || !lm->l_ld)
        return -1;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Word) *hash = NULL;
    const uint32_t *gnu = NULL;
    for (const ElfW(Dyn) *d = lm->l_ld; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: symtab = dyn_ptr(lm, d->d_un.d_ptr); break;
        case DT_STRTAB: strtab = dyn_ptr(lm, d->d_un.d_ptr); break;
        case DT_HASH: hash = dyn_ptr(lm, d->d_un.d_ptr); break;
        case DT_GNU_HASH: gnu = dyn_ptr(lm, d->d_un.d_ptr); break;
        default: break;
        }
    }
    size_t count = dynsym_count(lm, hash, gnu);
    if (!symtab || !strtab || count == 0)
        return -1;
    for (size_t i = 1; i < count; i++) {
        const ElfW(Sym) *s = &symtab[i];
        int type = ST_TYPE(s->st_info), bind = ST_BIND(s->st_info);
        if (s->st_shndx == SHN_UNDEF || (type != STT_FUNC && type != STT_GNU_IFUNC) ||
            (bind != STB_GLOBAL && bind != STB_WEAK) ||
            ST_VISIBILITY(s->st_other) != STV_DEFAULT)
            continue;
        const char *name = strtab + s->st_name;
        if (!is_hip_export(name) || known_export(name))
            continue;
        if ((*n)++ == 0)
            snprintf(out, outlen, "%s", name);
    }
    return 0;
}

/* ---- the version check ----------------------------------------------------- */

static int compatible_major(int major)
{
    if (major <= KREX_HIP_EP_VERSION_MAJOR)
        return 1; /* the table's, or older: no entry point it does not know */
    for (int i = 0; i < KREX_HIP_COMPAT_MAJORS_N; i++)
        if (krex_hip_compat_majors[i] == major)
            return 1;
    return 0;
}

/* Empty when the runtime behind `h` may be gated, else why not. */
static void judge_runtime(void *h, char *why, size_t len)
{
    why[0] = 0;
    krex_hip_abi_hipRuntimeGetVersion *get =
        (krex_hip_abi_hipRuntimeGetVersion *)krex_dlsym_real(h, "hipRuntimeGetVersion");
    int v = 0;
    if (!get || get(&v) != KREX_HIP_SUCCESS || v <= 0) {
        snprintf(why, len, "its version cannot be read (hipRuntimeGetVersion)");
        return;
    }
    int major = v / 10000000, minor = v / 100000 % 100;
    char majors[64] = "";
    size_t at = 0;
    for (int i = 0; i < KREX_HIP_COMPAT_MAJORS_N && at < sizeof majors; i++)
        at += (size_t)snprintf(majors + at, sizeof majors - at, ", %d", krex_hip_compat_majors[i]);
    if (!compatible_major(major)) {
        snprintf(why, len, "HIP runtime %d.%d (hipRuntimeGetVersion %d) is newer than the "
                 "shim's HIP table (HIP %d.%d headers; runtime majors %d%s): it may have "
                 "launch entry points the table does not know",
                 major, minor, v, KREX_HIP_EP_VERSION_MAJOR, KREX_HIP_EP_VERSION_MINOR,
                 KREX_HIP_EP_VERSION_MAJOR, majors);
        return;
    }
    if (major < KREX_HIP_EP_VERSION_MAJOR ||
        (major == KREX_HIP_EP_VERSION_MAJOR && minor <= KREX_HIP_EP_VERSION_MINOR))
        return; /* the headers' runtime, or older */
    char first[128] = "";
    int n = 0;
    if (unknown_exports(h, first, sizeof first, &n) != 0)
        snprintf(why, len, "HIP runtime %d.%d is newer than the shim's HIP table (HIP %d.%d "
                 "headers) and its exports cannot be read", major, minor,
                 KREX_HIP_EP_VERSION_MAJOR, KREX_HIP_EP_VERSION_MINOR);
    else if (n > 0)
        snprintf(why, len, "HIP runtime %d.%d exports %d hip function(s) the shim's HIP table "
                 "(HIP %d.%d headers) does not know, %s first: they could start GPU work "
                 "past the gate", major, minor, n, KREX_HIP_EP_VERSION_MAJOR,
                 KREX_HIP_EP_VERSION_MINOR, first);
}

static void load_hip(void)
{
    int saved = errno;
    /* Acquire pairs with shim.c's release store of the mode.  The caller
     * (hipcall.h) entered the gate first: under krex the process is
     * registered and admitted, or refused, by now. */
    int mode = atomic_load_explicit(&krex_mode, memory_order_acquire);
    if (mode == KREX_MODE_REFUSE) {
        /* Refused GPU work: not even the version query (it starts the
         * runtime) runs. */
        hip_refused = REFUSED_PROCESS;
        snprintf(refusal, sizeof refusal, "this process's GPU work is refused");
        errno = saved;
        return;
    }
    void *h = dlopen("libamdhip64.so.6", RTLD_NOW | RTLD_GLOBAL);
    if (!h)
        h = dlopen("libamdhip64.so", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        krex_log(KREX_LOG_ERROR, "cannot load the HIP runtime (libamdhip64.so.6): %s",
                 dlerror());
    } else {
        in_load = 1;
        loading_handle = h;
        char why[320];
        judge_runtime(h, why, sizeof why);
        if (why[0] && krex_under_krex()) {
            hip_refused = REFUSED_RUNTIME;
            snprintf(refusal, sizeof refusal, "%s", why);
        } else if (why[0]) {
            krex_log(KREX_LOG_DEBUG, "not under krex, HIP passes through: %s", why);
        }
        if (!hip_refused && mode == KREX_MODE_GATING) {
            /* The initialization the runtime would do in whichever call
             * came first, here, inside the gate the caller holds. */
            krex_hip_abi_hipInit *init = (krex_hip_abi_hipInit *)krex_dlsym_real(h, "hipInit");
            init_result = init ? (int)init(0) : KREX_HIP_ERROR_NOT_FOUND;
            if (init_result != KREX_HIP_SUCCESS)
                krex_log(KREX_LOG_INFO, "hipInit at the first HIP call returned %d",
                         init_result);
        }
        in_load = 0;
    }
    /* Release: hip_refused and refusal are written before the handle is
     * seen by krex_hip_loaded()'s acquire load (pthread_once orders them
     * for krex_hip_bind's readers). */
    atomic_store_explicit(&hip_handle, h, memory_order_release);
    errno = saved;
}

void *krex_hip_loaded(void) { return atomic_load_explicit(&hip_handle, memory_order_acquire); }

uint32_t krex_hip_peek_error(void)
{
    krex_hip_abi_hipPeekAtLastError *peek = KREX_HIP_REAL(hipPeekAtLastError);
    return peek ? peek() : KREX_HIP_SUCCESS;
}

void krex_hip_forget_own_error(uint32_t before)
{
    if (before != KREX_HIP_SUCCESS || krex_hip_peek_error() == KREX_HIP_SUCCESS)
        return; /* the program's own error stays for it to read */
    krex_hip_abi_hipGetLastError *get = KREX_HIP_REAL(hipGetLastError);
    if (get)
        (void)get();
}

int krex_hip_load(void)
{
    if (in_load)
        return -1; /* reached from inside the load: the loading call goes on */
    pthread_once(&hip_once, load_hip);
    return init_result;
}

int krex_hip_refused_process(void)
{
    pthread_once(&hip_once, load_hip);
    return hip_refused == REFUSED_PROCESS;
}

void *krex_hip_bind(int idx)
{
    int saved = errno;
    void *h, *p = NULL;
    if (KREX_UNLIKELY(in_load)) {
        /* This thread is loading (the runtime's own call of an exported
         * name, during the version query or hipInit): bind from the
         * handle, unpublished; hip_once would wait for this thread. */
        h = loading_handle;
    } else {
        pthread_once(&hip_once, load_hip);
        h = atomic_load_explicit(&hip_handle, memory_order_acquire);
    }
    if (h && !hip_refused) {
        p = krex_dlsym_real(h, krex_hip_ep_desc[idx].symbol);
        if (!p && (krex_hip_ep_desc[idx].flags & KREX_HIP_EPF_CXX))
            p = krex_dlsym_real(h, krex_hip_ep_desc[idx].name); /* exported with C linkage */
    }
    /* Release pairs with the acquire in krex_hip_real(). */
    if (p)
        atomic_store_explicit(&krex_hip_real_fns[idx], p, memory_order_release);
    errno = saved;
    return p;
}

int krex_hip_missing(int idx)
{
    static _Atomic unsigned char warned[KREX_HIP_EP_COUNT];
    static _Atomic int said_refusal;
    pthread_once(&hip_once, load_hip);
    if (hip_refused) {
        /* Relaxed: only decides who prints the one line. */
        if (!atomic_exchange_explicit(&said_refusal, 1, memory_order_relaxed))
            krex_log(KREX_LOG_ERROR, "HIP refused (%s failed): %s; krex cannot gate this "
                     "runtime, so its GPU calls fail with hipErrorNotSupported",
                     krex_hip_ep_desc[idx].name, refusal);
        return KREX_HIP_ERROR_NOT_SUPPORTED;
    }
    if (!atomic_exchange_explicit(&warned[idx], 1, memory_order_relaxed))
        krex_log(KREX_LOG_ERROR, "%s: not in the HIP runtime (libamdhip64); returning "
                 "hipErrorNotFound", krex_hip_ep_desc[idx].name);
    return KREX_HIP_ERROR_NOT_FOUND;
}

/* ---- dlsym ----------------------------------------------------------------- */

static int is_hip_handle(void *handle)
{
    return krex_handle_is_lib(handle, atomic_load_explicit(&hip_handle, memory_order_acquire),
                              &hip_handle_seen, "libamdhip64.so");
}

void *krex_hip_dlsym_decide(void *handle, const char *name)
{
    if (!is_hip_export(name))
        return NULL;
    void *hook = NULL;
    int idx = ep_lookup(name);
    if (idx >= 0)
        hook = krex_hip_ep_hook[idx];
    else if ((idx = ep_lookup_symbol(name)) >= 0)
        hook = krex_hip_ep_symhook[idx];
    if (!hook)
        return NULL;
    if (handle == RTLD_DEFAULT || handle == RTLD_NEXT)
        return hook;
    if (is_hip_handle(handle) && krex_dlsym_real(handle, name))
        return hook; /* only names this runtime has */
    return NULL;
}
