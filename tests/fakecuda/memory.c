/*
 * memory.c — device memory of the simulated GPUs.
 *
 * Capacity (KREX_FAKE_MEM_BYTES per GPU) is shared by every process that
 * uses the same state file (KREX_FAKE_STATE): a small mmap'd file holding,
 * per GPU, an atomic count of bytes in use, and per process a slot
 * (pid, start time, bytes in use per GPU).  A process returns its memory
 * when it frees it or exits normally (destructor); the usage of a process
 * that died without doing so (SIGKILL) is reclaimed by the next allocation
 * that finds the device full, and by cuMemGetInfo.
 *
 * Accounting order keeps   used[g] >= sum of the slots' used[g]   at every
 * instant, so a process killed between two steps can only leak a few bytes
 * until reclaimed, never make the count wrap: allocation adds to the GPU
 * count first and to the slot second; freeing subtracts from the slot first.
 *
 * Device memory is backed by private anonymous mappings reserved without
 * swap accounting (MAP_NORESERVE): device pointers are real addresses, so
 * copies and memsets move real data, and only touched pages cost host
 * memory (a memset to zero gives pages back instead of writing them).
 */
#include "fakecuda.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define STATE_MAGIC 0x3176736b66786572ull /* "rexfksv1" in memory; the last byte is the layout version */
#define STATE_PROCS 1024

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "shared-memory atomics must be lock-free to work across processes");

struct proc_slot {
    _Atomic int32_t pid;         /* 0 free; > 0 owner; < 0 being reclaimed */
    uint32_t pad;
    _Atomic uint64_t start_time; /* owner's start time (/proc/<pid>/stat field 22) */
    _Atomic uint64_t used[FC_MAX_GPUS];
};

struct shared_state {
    _Atomic uint64_t magic;      /* 0 in a fresh (zero-filled) file */
    uint64_t pad[7];
    _Atomic uint64_t used[FC_MAX_GPUS];
    struct proc_slot procs[STATE_PROCS];
};

struct alloc {
    uintptr_t base;
    size_t size;
    int gpu;                     /* simulated GPU index */
    const struct CUctx_st *ctx;
};

static struct shared_state *sh;
static int my_slot = -1;
static struct alloc *allocs;     /* sorted by base; guarded by fc.mu */
static size_t nallocs, capallocs;

CUresult fc_mem_open(const char *path, int nphys)
{
    (void)nphys;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        fprintf(stderr, "fakecuda: memory state file %s: %s\n", path, strerror(errno));
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    /* Other users' processes may share the file (mode 0666 despite umask). */
    (void)fchmod(fd, 0666);
    struct stat st;
    if (fstat(fd, &st) != 0 ||
        ((size_t)st.st_size < sizeof *sh && ftruncate(fd, (off_t)sizeof *sh) != 0)) {
        fprintf(stderr, "fakecuda: memory state file %s: %s\n", path, strerror(errno));
        close(fd);
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    void *p = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        fprintf(stderr, "fakecuda: memory state file %s: mmap: %s\n", path, strerror(errno));
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    struct shared_state *s = p;
    /* A zero-filled file is a valid empty state; the magic only claims it.
     * Relaxed: nothing else is published through the magic. */
    uint64_t expect = 0;
    if (!atomic_compare_exchange_strong_explicit(&s->magic, &expect, STATE_MAGIC,
                                                 memory_order_relaxed, memory_order_relaxed) &&
        expect != STATE_MAGIC) {
        fprintf(stderr, "fakecuda: memory state file %s has another layout; remove it\n", path);
        munmap(p, sizeof *sh);
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    sh = s;
    return CUDA_SUCCESS;
}

/* State and start time of a process from /proc/<pid>/stat; false if gone. */
static bool proc_stat(pid_t pid, char *state, uint64_t *start_time)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    /* Fields after the command name, which ends at the last ')'. */
    char *p = strrchr(buf, ')');
    if (p == NULL || p[1] == '\0')
        return false;
    *state = p[2];
    p += 2;
    /* field 3 is the state; the start time is field 22 */
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    *start_time = p ? strtoull(p, NULL, 10) : 0;
    return true;
}

static bool proc_alive(pid_t pid, uint64_t start_time)
{
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return false;
    char state = '?';
    uint64_t now_start = 0;
    if (!proc_stat(pid, &state, &now_start))
        return errno != ENOENT; /* unreadable /proc: assume alive */
    if (state == 'Z' || state == 'X')
        return false;
    /* The pid was reused by another process. */
    return start_time == 0 || now_start == 0 || now_start == start_time;
}

/* Return dead processes' usage to the shared counts; how many were freed. */
static int reclaim_dead(void)
{
    int freed = 0;
    for (int i = 0; i < STATE_PROCS; i++) {
        struct proc_slot *slot = &sh->procs[i];
        int32_t pid = atomic_load_explicit(&slot->pid, memory_order_acquire);
        if (pid <= 0 || i == my_slot)
            continue;
        uint64_t start = atomic_load_explicit(&slot->start_time, memory_order_relaxed);
        if (proc_alive(pid, start))
            continue;
        /* Claim the slot for reclaiming: only one process wins the CAS. */
        int32_t expect = pid;
        if (!atomic_compare_exchange_strong_explicit(&slot->pid, &expect, -pid,
                                                     memory_order_acq_rel, memory_order_relaxed))
            continue;
        for (int g = 0; g < FC_MAX_GPUS; g++) {
            uint64_t u = atomic_exchange_explicit(&slot->used[g], 0, memory_order_relaxed);
            if (u)
                atomic_fetch_sub_explicit(&sh->used[g], u, memory_order_relaxed);
        }
        atomic_store_explicit(&slot->start_time, 0, memory_order_relaxed);
        /* Release: the zeroed counters are visible before the slot is free. */
        atomic_store_explicit(&slot->pid, 0, memory_order_release);
        freed++;
    }
    return freed;
}

static bool claim_slot(void)
{
    int32_t me = (int32_t)getpid();
    char state;
    uint64_t start = 0;
    (void)proc_stat(me, &state, &start);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < STATE_PROCS; i++) {
            int32_t expect = 0;
            /* Acquire pairs with the release that freed the slot. */
            if (atomic_compare_exchange_strong_explicit(&sh->procs[i].pid, &expect, me,
                                                        memory_order_acq_rel,
                                                        memory_order_relaxed)) {
                atomic_store_explicit(&sh->procs[i].start_time, start, memory_order_relaxed);
                my_slot = i;
                return true;
            }
        }
        if (reclaim_dead() == 0)
            break;
    }
    fprintf(stderr, "fakecuda: no free process slot in the memory state file\n");
    return false;
}

/* Reserve n bytes of GPU g's capacity; false when it would exceed it. */
static bool reserve(int g, uint64_t n)
{
    uint64_t cur = atomic_load_explicit(&sh->used[g], memory_order_relaxed);
    /* Relaxed: the count is the only data; the CAS makes check-and-add atomic. */
    do {
        if (n > fc.mem_bytes || cur > fc.mem_bytes - n)
            return false;
    } while (!atomic_compare_exchange_weak_explicit(&sh->used[g], &cur, cur + n,
                                                    memory_order_relaxed, memory_order_relaxed));
    return true;
}

static void unaccount(int g, uint64_t n)
{
    atomic_fetch_sub_explicit(&sh->procs[my_slot].used[g], n, memory_order_relaxed);
    atomic_fetch_sub_explicit(&sh->used[g], n, memory_order_relaxed);
}

/* Index of the first allocation with base > p. */
static size_t upper_bound(uintptr_t p)
{
    size_t lo = 0, hi = nallocs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (allocs[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static struct alloc *find_containing(uintptr_t p)
{
    size_t i = upper_bound(p);
    if (i == 0)
        return NULL;
    struct alloc *a = &allocs[i - 1];
    return p - a->base < a->size ? a : NULL;
}

bool fc_mem_valid(const void *p, size_t bytes)
{
    const struct alloc *a = find_containing((uintptr_t)p);
    return a && bytes <= a->size - ((uintptr_t)p - a->base);
}

static CUresult mem_alloc(struct CUctx_st *ctx, CUdeviceptr *dptr, size_t bytes)
{
    int g = fc.phys[ctx->device];
    if (my_slot < 0 && !claim_slot())
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!reserve(g, bytes) && (reclaim_dead() == 0 || !reserve(g, bytes)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    atomic_fetch_add_explicit(&sh->procs[my_slot].used[g], bytes, memory_order_relaxed);
    if (nallocs == capallocs) {
        size_t cap = capallocs ? capallocs * 2 : 64;
        struct alloc *n = realloc(allocs, cap * sizeof *n);
        if (n == NULL) {
            unaccount(g, bytes);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        allocs = n;
        capallocs = cap;
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) {
        unaccount(g, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    size_t i = upper_bound((uintptr_t)p);
    memmove(&allocs[i + 1], &allocs[i], (nallocs - i) * sizeof *allocs);
    allocs[i] = (struct alloc){.base = (uintptr_t)p, .size = bytes, .gpu = g, .ctx = ctx};
    nallocs++;
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

static void alloc_remove(size_t i)
{
    munmap((void *)allocs[i].base, allocs[i].size);
    unaccount(allocs[i].gpu, allocs[i].size);
    memmove(&allocs[i], &allocs[i + 1], (nallocs - i - 1) * sizeof *allocs);
    nallocs--;
}

static CUresult mem_free(CUdeviceptr dptr)
{
    size_t i = upper_bound((uintptr_t)dptr);
    if (i == 0 || allocs[i - 1].base != (uintptr_t)dptr)
        return CUDA_ERROR_INVALID_VALUE;
    alloc_remove(i - 1);
    return CUDA_SUCCESS;
}

void fc_mem_release_ctx(const struct CUctx_st *ctx)
{
    for (size_t i = nallocs; i-- > 0;)
        if (allocs[i].ctx == ctx)
            alloc_remove(i);
}

void fc_mem_atfork_child(void)
{
    /* The child owns no device memory: the parent's slot stays the parent's. */
    my_slot = -1;
    nallocs = 0;
}

void fc_mem_exit(void)
{
    if (sh == NULL || my_slot < 0)
        return;
    struct proc_slot *slot = &sh->procs[my_slot];
    if (atomic_load_explicit(&slot->pid, memory_order_relaxed) != (int32_t)getpid())
        return;
    for (int g = 0; g < FC_MAX_GPUS; g++) {
        uint64_t u = atomic_exchange_explicit(&slot->used[g], 0, memory_order_relaxed);
        if (u)
            atomic_fetch_sub_explicit(&sh->used[g], u, memory_order_relaxed);
    }
    /* Release: the zeroed counters are visible before the slot is free. */
    atomic_store_explicit(&slot->pid, 0, memory_order_release);
    my_slot = -1;
}

/* Zero [p, p+n) of anonymous device memory: whole pages are dropped
 * (they read back as zeros) instead of written. */
static void zero_range(unsigned char *p, size_t n)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + page - 1) & ~(page - 1);
    uintptr_t b = ((uintptr_t)p + n) & ~(page - 1);
    if (b <= a || madvise((void *)a, b - a, MADV_DONTNEED) != 0) {
        memset(p, 0, n);
        return;
    }
    memset(p, 0, a - (uintptr_t)p);
    memset((void *)b, 0, (uintptr_t)p + n - b);
}

void fc_dataop_apply(const struct fc_dataop *op)
{
    if (op->kind == FC_OP_COPY) {
        memmove(op->dst, op->src, op->count);
    } else if (op->kind == FC_OP_SET && op->value == 0) {
        zero_range(op->dst, op->count * op->elem);
    } else if (op->kind == FC_OP_SET && op->elem == 1) {
        memset(op->dst, (int)op->value, op->count);
    } else if (op->kind == FC_OP_SET) {
        uint32_t *d = op->dst;
        for (size_t i = 0; i < op->count; i++)
            d[i] = op->value;
    }
}

/* ---- entry points ---- */

FC_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (dptr == NULL || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    struct CUctx_st *ctx = NULL;
    r = fc_current_ctx(&ctx);
    if (r == CUDA_SUCCESS)
        r = mem_alloc(ctx, dptr, bytesize);
    fc_unlock();
    return r;
}

FC_API CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    const struct alloc *a = find_containing((uintptr_t)dptr);
    if (a == NULL || a->base != (uintptr_t)dptr) {
        fc_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* cuMemFree synchronizes: work of the context still running may use
     * the memory (cuda.h: "may perform implicit synchronization"). */
    uint64_t until = fc_ctx_tail(a->ctx);
    fc_unlock();
    fc_sleep_until(until);
    fc_lock();
    r = mem_free(dptr); /* INVALID_VALUE if another thread freed it meanwhile */
    fc_unlock();
    return r;
}

FC_API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (free_bytes == NULL || total == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    struct CUctx_st *ctx = NULL;
    r = fc_current_ctx(&ctx);
    if (r == CUDA_SUCCESS) {
        reclaim_dead();
        uint64_t used = atomic_load_explicit(&sh->used[fc.phys[ctx->device]], memory_order_relaxed);
        *free_bytes = (size_t)(used < fc.mem_bytes ? fc.mem_bytes - used : 0);
        *total = (size_t)fc.mem_bytes;
    }
    fc_unlock();
    return r;
}

/* Stream-ordered allocation: the memory is counted from the call on (the
 * simulated allocator has no pool to reuse from). */
static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize, CUstream hStream, bool per_thread)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (dptr == NULL || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    fc_lock();
    struct CUstream_st *s = NULL;
    r = fc_stream_resolve(hStream, per_thread, &s);
    if (r == CUDA_SUCCESS)
        r = mem_alloc(s->ctx, dptr, bytesize);
    fc_unlock();
    return r;
}

static CUresult free_async(CUdeviceptr dptr, CUstream hStream, bool per_thread)
{
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    fc_lock();
    struct CUstream_st *s = NULL;
    r = fc_stream_resolve(hStream, per_thread, &s);
    if (r == CUDA_SUCCESS)
        r = mem_free(dptr);
    fc_unlock();
    return r;
}

FC_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_async(dptr, bytesize, hStream, false);
}

FC_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_async(dptr, bytesize, hStream, true);
}

FC_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream, false);
}

FC_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream, true);
}
