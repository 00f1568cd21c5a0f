/*
 * dlguard.c — dlopen and dlmopen of the CUDA driver or the HIP runtime past
 * the hooks (docs/design/shim.md, "Loading the driver past the hooks").
 *
 * dlopen(x, RTLD_DEEPBIND) of the driver (runtime) or of an object that
 * needs it, and dlmopen(LM_ID_NEWLM, x) of it, would bind cu* (hip*) names
 * to the driver itself; under krex (gating or refusing) both are refused:
 * one line on stderr, NULL, and a dlerror() naming why.  The check finds
 * the file the way the loader will, from the caller's own search list (the
 * assembly entries, dl_x86_64.S, keep the caller's return address), and
 * reads its dynamic section; only direct dependencies are checked.
 */
#include "dlguard.h"
#include "state.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The real functions; the x86-64 entries jump through them (hidden). */
__attribute__((visibility("hidden"))) void *_Atomic krex_real_dlopen_ptr;
__attribute__((visibility("hidden"))) void *_Atomic krex_real_dlmopen_ptr;

typedef void *(*dlopen_fn)(const char *, int);
typedef void *(*dlmopen_fn)(Lmid_t, const char *, int);

static void *find_real(void *_Atomic *slot, const char *name, const char *v_new,
                       const char *v_old)
{
    void *p = atomic_load_explicit(slot, memory_order_acquire);
    if (KREX_LIKELY(p))
        return p;
    /* glibc >= 2.34: libc's GLIBC_2.34 version; older: libdl's.  dlvsym
     * is not overridden. */
    p = dlvsym(RTLD_NEXT, name, v_new);
    if (!p)
        p = dlvsym(RTLD_NEXT, name, v_old);
    if (!p) {
        krex_log(KREX_LOG_ERROR, "cannot find the real %s (%s / %s)", name, v_new, v_old);
        abort();
    }
    /* Release: the pointer is complete for the entry's plain load too. */
    atomic_store_explicit(slot, p, memory_order_release);
    return p;
}

static dlopen_fn real_dlopen(void)
{
    return (dlopen_fn)find_real(&krex_real_dlopen_ptr, "dlopen", "GLIBC_2.34", "GLIBC_2.2.5");
}

static dlmopen_fn real_dlmopen(void)
{
    return (dlmopen_fn)find_real(&krex_real_dlmopen_ptr, "dlmopen", "GLIBC_2.34",
                                 "GLIBC_2.3.4");
}

static const char *base_of(const char *path)
{
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}

/* What a load would bring past the hooks. */
enum gpu_lib { GPU_LIB_NONE, GPU_LIB_CUDA, GPU_LIB_HIP };

static enum gpu_lib gpu_lib_of(const char *name)
{
    const char *b = base_of(name);
    if (strncmp(b, "libcuda.so", 10) == 0)
        return GPU_LIB_CUDA;
    if (strncmp(b, "libamdhip64.so", 14) == 0)
        return GPU_LIB_HIP;
    return GPU_LIB_NONE;
}

/* ---- the file's dynamic section ------------------------------------------ */

#if UINTPTR_MAX == 0xffffffffffffffffu
#define KREX_ELFCLASS ELFCLASS64
#else
#define KREX_ELFCLASS ELFCLASS32
#endif

static int read_at(int fd, void *buf, size_t n, off_t off)
{
    return pread(fd, buf, n, off) == (ssize_t)n ? 0 : -1;
}

/* Which GPU library the ELF object at `path` is (DT_SONAME libcuda.so*,
 * libamdhip64.so*) or needs directly (DT_NEEDED); GPU_LIB_NONE otherwise,
 * and for anything that is not a readable object of this machine's class
 * (the loader would not load it either). */
static enum gpu_lib elf_uses_gpu_lib(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return GPU_LIB_NONE;
    enum gpu_lib found = GPU_LIB_NONE;
    ElfW(Phdr) *ph = NULL;
    ElfW(Dyn) *dyn = NULL;
    char *str = NULL;
    ElfW(Ehdr) eh;
    if (read_at(fd, &eh, sizeof eh, 0) != 0 || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
        eh.e_ident[EI_CLASS] != KREX_ELFCLASS || eh.e_phentsize != sizeof(ElfW(Phdr)) ||
        eh.e_phnum == 0 || eh.e_phnum > 512)
        goto out;
    ph = calloc(eh.e_phnum, sizeof *ph);
    if (!ph || read_at(fd, ph, eh.e_phnum * sizeof *ph, (off_t)eh.e_phoff) != 0)
        goto out;
    const ElfW(Phdr) *pdyn = NULL;
    for (int i = 0; i < eh.e_phnum; i++)
        if (ph[i].p_type == PT_DYNAMIC)
            pdyn = &ph[i];
    if (!pdyn || pdyn->p_filesz == 0 || pdyn->p_filesz > (1u << 20))
        goto out;
    size_t ndyn = pdyn->p_filesz / sizeof *dyn;
    dyn = malloc(ndyn * sizeof *dyn);
    if (!dyn || read_at(fd, dyn, ndyn * sizeof *dyn, (off_t)pdyn->p_offset) != 0)
        goto out;
    ElfW(Addr) strtab = 0;
    size_t strsz = 0;
    for (size_t i = 0; i < ndyn && dyn[i].d_tag != DT_NULL; i++) {
        if (dyn[i].d_tag == DT_STRTAB)
            strtab = dyn[i].d_un.d_ptr;
        else if (dyn[i].d_tag == DT_STRSZ)
            strsz = dyn[i].d_un.d_val;
    }
    if (!strtab || !strsz || strsz > (16u << 20))
        goto out;
    /* The string table's file offset: through the PT_LOAD that maps it. */
    off_t stroff = -1;
    for (int i = 0; i < eh.e_phnum; i++)
        if (ph[i].p_type == PT_LOAD && ph[i].p_vaddr <= strtab &&
            strtab - ph[i].p_vaddr < ph[i].p_filesz)
            stroff = (off_t)(strtab - ph[i].p_vaddr + ph[i].p_offset);
    if (stroff < 0 || !(str = malloc(strsz + 1)) || read_at(fd, str, strsz, stroff) != 0)
        goto out;
    str[strsz] = '\0';
    for (size_t i = 0; i < ndyn && dyn[i].d_tag != DT_NULL && !found; i++)
        if ((dyn[i].d_tag == DT_NEEDED || dyn[i].d_tag == DT_SONAME) &&
            dyn[i].d_un.d_val < strsz)
            found = gpu_lib_of(str + dyn[i].d_un.d_val);
out:
    free(str);
    free(dyn);
    free(ph);
    close(fd);
    return found;
}

/* ---- where the loader will find a name ------------------------------------ */

static int readable_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, R_OK) == 0;
}

/* The loader's cache (the new format, glibc >= 2.32 writes only that):
 * the first entry for `name` whose file exists. */
static int search_cache(const char *name, char *out, size_t n)
{
    static const char magic[] = "glibc-ld.so.cache1.1";
    struct header {
        char magic[17];
        char version[3];
        uint32_t nlibs, len_strings;
        uint8_t flags, pad[3];
        uint32_t extension_offset, unused[3];
    };
    struct entry {
        int32_t flags;
        uint32_t key, value, osversion;
        uint64_t hwcap;
    };
    int fd = open("/etc/ld.so.cache", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    struct stat st;
    int found = 0;
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof(struct header) ||
        st.st_size > (64 << 20)) {
        close(fd);
        return 0;
    }
    size_t size = (size_t)st.st_size;
    const char *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return 0;
    struct header h;
    memcpy(&h, map, sizeof h);
    if (memcmp(map, magic, sizeof magic - 1) == 0 &&
        h.nlibs <= (size - sizeof h) / sizeof(struct entry)) {
        for (uint32_t i = 0; i < h.nlibs && !found; i++) {
            struct entry e;
            memcpy(&e, map + sizeof h + i * sizeof e, sizeof e);
            if (e.key >= size || e.value >= size ||
                strnlen(map + e.key, size - e.key) == size - e.key ||
                strnlen(map + e.value, size - e.value) == size - e.value)
                continue;
            if (strcmp(map + e.key, name) == 0 && readable_file(map + e.value) &&
                (size_t)snprintf(out, n, "%s", map + e.value) < n)
                found = 1;
        }
    }
    munmap((void *)map, size);
    return found;
}

/* The directory of the object holding `caller`, for $ORIGIN. */
static int origin_of(struct link_map *lm, char *out, size_t n)
{
    const char *name = lm && lm->l_name && lm->l_name[0] ? lm->l_name : NULL;
    char exe[4096];
    if (!name) { /* the main program */
        ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (len <= 0)
            return 0;
        exe[len] = '\0';
        name = exe;
    }
    const char *slash = strrchr(name, '/');
    if (!slash)
        return 0;
    size_t len = (size_t)(slash - name);
    if (len >= n)
        return 0;
    memcpy(out, name, len);
    out[len] = '\0';
    return 1;
}

/* The file the loader will open for `file`, asked by code at `caller`:
 * 1 with its path in `out`, 0 when it cannot tell (not found, or a dynamic
 * string token other than $ORIGIN). */
static int resolve(const char *file, const void *caller, char *out, size_t n)
{
    struct link_map *lm = NULL;
    Dl_info info;
    if (!caller || !dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP))
        lm = NULL;
    if (strchr(file, '/')) {
        const char *dollar = strchr(file, '$');
        if (!dollar)
            return (size_t)snprintf(out, n, "%s", file) < n;
        /* $ORIGIN or ${ORIGIN} leading a path: the caller's directory. */
        const char *rest = !strncmp(file, "$ORIGIN", 7)     ? file + 7
                           : !strncmp(file, "${ORIGIN}", 9) ? file + 9
                                                            : NULL;
        char dir[4096];
        if (!rest || strchr(rest, '$') || !origin_of(lm, dir, sizeof dir))
            return 0;
        return (size_t)snprintf(out, n, "%s%s", dir, rest) < n;
    }
    /* A bare name: the caller's search list in the loader's order
     * (RPATH, LD_LIBRARY_PATH, RUNPATH), the cache, then the defaults. */
    int found = 0;
    Dl_serinfo size, *si = NULL;
    if (lm && dlinfo(lm, RTLD_DI_SERINFOSIZE, &size) == 0 && (si = malloc(size.dls_size)) &&
        dlinfo(lm, RTLD_DI_SERINFOSIZE, si) == 0 && dlinfo(lm, RTLD_DI_SERINFO, si) == 0) {
        for (unsigned i = 0; i < si->dls_cnt && !found; i++)
            if (!(si->dls_serpath[i].dls_flags & LA_SER_DEFAULT) &&
                (size_t)snprintf(out, n, "%s/%s", si->dls_serpath[i].dls_name, file) < n &&
                readable_file(out))
                found = 1;
        if (!found)
            found = search_cache(file, out, n);
        for (unsigned i = 0; i < si->dls_cnt && !found; i++)
            if ((si->dls_serpath[i].dls_flags & LA_SER_DEFAULT) &&
                (size_t)snprintf(out, n, "%s/%s", si->dls_serpath[i].dls_name, file) < n &&
                readable_file(out))
                found = 1;
    } else {
        found = search_cache(file, out, n);
    }
    free(si);
    return found;
}

/* Would loading `file` (asked from `caller`) put the driver or the HIP
 * runtime in the new scope: the library itself, or an object that needs it
 * directly.  Which one, or GPU_LIB_NONE. */
static enum gpu_lib brings_gpu_lib(const char *file, const void *caller)
{
    enum gpu_lib lib = gpu_lib_of(file);
    if (lib != GPU_LIB_NONE)
        return lib;
    char path[4096];
    return resolve(file, caller, path, sizeof path) ? elf_uses_gpu_lib(path) : GPU_LIB_NONE;
}

static const char *lib_text(enum gpu_lib lib, int itself)
{
    if (lib == GPU_LIB_HIP)
        return itself ? "the HIP runtime" : "a HIP runtime user";
    return itself ? "the CUDA driver" : "a CUDA driver user";
}

/* Say why on stderr (always: a refused load is not a debug matter), and
 * leave dlerror() describing it: the real loader fails to open a path that
 * cannot exist (/dev/null is no directory) and names it. */
static void refuse_load(const char *fn, const char *file, const char *what)
{
    char line[640];
    int len = snprintf(line, sizeof line,
                       "krex: refused %s(\"%s\"): %s: its GPU calls would bypass krex's gate\n",
                       fn, file, what);
    if (len > 0) {
        size_t m = (size_t)len < sizeof line ? (size_t)len : sizeof line - 1;
        line[m - 1] = '\n';
        ssize_t w = write(STDERR_FILENO, line, m);
        (void)w;
    }
    char path[320];
    snprintf(path, sizeof path, "/dev/null/krex refused %s of %s (%s, see stderr)", fn,
             base_of(file), what);
    void *h = real_dlopen()(path, RTLD_LAZY);
    if (h) /* cannot happen: the path cannot exist */
        dlclose(h);
}

/* 0: the entry calls the real dlopen; 1: refused (the entry returns NULL). */
__attribute__((visibility("hidden"))) int krex_dlopen_decide(const char *file, int mode,
                                                             const void *caller)
{
    int saved = errno;
    real_dlopen(); /* the entry jumps through the pointer */
    int refused = 0;
    enum gpu_lib lib;
    if (KREX_UNLIKELY(file && (mode & RTLD_DEEPBIND)) && krex_under_krex() &&
        (lib = brings_gpu_lib(file, caller)) != GPU_LIB_NONE) {
        char what[80];
        snprintf(what, sizeof what, "RTLD_DEEPBIND of %s",
                 lib_text(lib, gpu_lib_of(file) != GPU_LIB_NONE));
        refuse_load("dlopen", file, what);
        refused = 1;
    }
    if (!refused)
        errno = saved;
    return refused;
}

__attribute__((visibility("hidden"))) int krex_dlmopen_decide(Lmid_t lmid, const char *file,
                                                              int mode, const void *caller)
{
    int saved = errno;
    real_dlmopen();
    real_dlopen(); /* for refuse_load */
    int refused = 0;
    enum gpu_lib lib;
    /* Into the base namespace it is a dlopen; elsewhere no hook is seen. */
    if (file && (lmid != LM_ID_BASE || (mode & RTLD_DEEPBIND)) && krex_under_krex() &&
        (lib = brings_gpu_lib(file, caller)) != GPU_LIB_NONE) {
        char what[96];
        if (lmid != LM_ID_BASE)
            snprintf(what, sizeof what, "%s (or %s) in another link-map namespace",
                     lib_text(lib, 1), lib_text(lib, 0));
        else
            snprintf(what, sizeof what, "RTLD_DEEPBIND of %s", lib_text(lib, 0));
        refuse_load("dlmopen", file, what);
        refused = 1;
    }
    if (!refused)
        errno = saved;
    return refused;
}

#if !defined(__x86_64__)
/* Without the assembly entries the forwarded call carries our return
 * address: a bare name then resolves through this library's search list,
 * not the caller's RUNPATH (docs/design/shim.md). */
KREX_EXPORT void *dlopen(const char *file, int mode)
{
    const void *caller = __builtin_return_address(0);
    return krex_dlopen_decide(file, mode, caller) ? NULL : real_dlopen()(file, mode);
}

KREX_EXPORT void *dlmopen(Lmid_t lmid, const char *file, int mode)
{
    const void *caller = __builtin_return_address(0);
    return krex_dlmopen_decide(lmid, file, mode, caller) ? NULL
                                                         : real_dlmopen()(lmid, file, mode);
}
#endif
