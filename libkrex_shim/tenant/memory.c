/*
 * memory.c — the process's device memory and co-tenant out-of-memory
 * handling (docs/design/memory.md "3. Co-tenant out-of-memory errors in the
 * shim"; paper §7 names memory-aware scheduling as future work).
 *
 * Accounting: every device allocation the hooks see, CUDA's and HIP's
 * (hipMalloc, hipExtMallocWithFlags, hipMallocManaged,
 * hipMalloc[FromPool]Async, hipMallocPitch, hipMemAllocPitch, hipMalloc3D,
 * hipMemCreate, the arrays), is recorded by address, physical handle or
 * array handle with its size in one of three tables, and the total is
 * published in the slot as `mem_mib`.  Out-of-memory errors: judged by
 * krex_oom_retry() (CUDA) and krex_hip_oom_retry() (HIP), one judgement
 * (oom_retry(), told the error and how to read the card's size), which waits
 * for co-tenants or returns the error now (the table: memory.md section 3).
 */
#include "memory.h"
#include "hipinterpose.h"
#include "interpose.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MIB (1ull << 20)
#define DEFAULT_OOM_WAIT_S 30.0
#define MAX_OOM_WAIT_S 86400.0
/* Waits between attempts: 1 ms doubling to 20 ms (wake-ups on frees come
 * sooner; a co-tenant's exit is noticed within the cap). */
#define FIRST_SLEEP_NS 1000000ull
#define MAX_SLEEP_NS 20000000ull

/* ---- configuration (read once, on the first out-of-memory error) --------- */

static uint64_t oom_wait_ns;
static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;

static void read_config(void)
{
    int saved = errno;
    double secs = DEFAULT_OOM_WAIT_S;
    const char *v = getenv("KREX_OOM_WAIT_S");
    if (v && *v) {
        char *end = NULL;
        errno = 0;
        double d = strtod(v, &end);
        if (errno || end == v || *end || !(d >= 0.0) || d > MAX_OOM_WAIT_S)
            krex_log(KREX_LOG_WARN, "KREX_OOM_WAIT_S=%s is not seconds in [0, %g]: using %g", v,
                     MAX_OOM_WAIT_S, secs);
        else
            secs = d;
    }
    oom_wait_ns = (uint64_t)(secs * 1e9);
    errno = saved;
}

/* ---- allocation tables (address or handle -> bytes) ----------------------- */

/* Open addressing, linear probing, key 0 = empty, deletion by backward
 * shift.  Guarded by `mu`, which also guards proc_bytes. */
struct table {
    uint64_t *keys;
    uint64_t *vals;
    size_t cap; /* a power of two, or 0 */
    size_t n;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
/* Device addresses; physical allocations (cuMemCreate's and hipMemCreate's
 * handles); HIP arrays (their hipArray *, a host object of the runtime's). */
static struct table ptrs, handles, arrays;
static uint64_t proc_bytes;
/* A co-tenant wait of this process ran out: later co-tenant errors return
 * at once until an allocation succeeds.  Relaxed: a hint, no data behind it. */
static _Atomic int gave_up;

static size_t home(uint64_t key, size_t cap)
{
    /* Fibonacci hashing: addresses are aligned, so mix the high bits in. */
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
}

static int table_grow(struct table *t)
{
    size_t cap = t->cap ? t->cap * 2 : 64;
    uint64_t *k = calloc(cap, sizeof *k), *v = calloc(cap, sizeof *v);
    if (!k || !v) {
        free(k);
        free(v);
        return -1;
    }
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->keys[i])
            continue;
        size_t j = home(t->keys[i], cap);
        while (k[j])
            j = (j + 1) & (cap - 1);
        k[j] = t->keys[i];
        v[j] = t->vals[i];
    }
    free(t->keys);
    free(t->vals);
    t->keys = k;
    t->vals = v;
    t->cap = cap;
    return 0;
}

/* Insert or replace; 0 when the host is out of memory (not recorded). */
static int table_put(struct table *t, uint64_t key, uint64_t val)
{
    if ((t->n + 1) * 2 > t->cap && table_grow(t) != 0)
        return 0;
    size_t i = home(key, t->cap);
    while (t->keys[i] && t->keys[i] != key)
        i = (i + 1) & (t->cap - 1);
    if (!t->keys[i])
        t->n++;
    t->keys[i] = key;
    t->vals[i] = val;
    return 1;
}

/* Remove `key`; its value, or 0 when absent. */
static uint64_t table_take(struct table *t, uint64_t key)
{
    if (!t->cap || !key)
        return 0;
    size_t mask = t->cap - 1, i = home(key, t->cap);
    while (t->keys[i] != key) {
        if (!t->keys[i])
            return 0;
        i = (i + 1) & mask;
    }
    uint64_t val = t->vals[i];
    /* Backward shift: move later entries of the probe run into the hole
     * unless their home lies cyclically in (hole, j]. */
    for (size_t j = (i + 1) & mask; t->keys[j]; j = (j + 1) & mask) {
        size_t h = home(t->keys[j], t->cap);
        int stays = i < j ? (h > i && h <= j) : (h > i || h <= j);
        if (!stays) {
            t->keys[i] = t->keys[j];
            t->vals[i] = t->vals[j];
            i = j;
        }
    }
    t->keys[i] = 0;
    t->vals[i] = 0;
    t->n--;
    return val;
}

/* ---- accounting ------------------------------------------------------------- */

/* a x b, or UINT64_MAX when it does not fit (sizes read from a call's
 * arguments). */
static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    uint64_t p;
    return __builtin_mul_overflow(a, b, &p) ? UINT64_MAX : p;
}

static int gating(void)
{
    /* Acquire pairs with shim.c's release store of the mode: krex_gate_p
     * and krex_tenant are set. */
    return atomic_load_explicit(&krex_mode, memory_order_acquire) == KREX_MODE_GATING;
}

static struct krex_slot *my_slot(void)
{
    /* Acquire pairs with the release store in register_process(). */
    return atomic_load_explicit(&krex_slot_p, memory_order_acquire);
}

/* Publish proc_bytes to the slot (under mu, so stores are in order).
 * Relaxed: readers want the latest figure, nothing is published with it. */
static void publish_locked(void)
{
    struct krex_slot *s = my_slot();
    if (!s)
        return;
    uint64_t mib = (proc_bytes + MIB - 1) / MIB;
    atomic_store_explicit(&s->mem_mib, mib > UINT32_MAX ? UINT32_MAX : (uint32_t)mib,
                          memory_order_relaxed);
}

static void note_new(struct table *t, uint64_t key, uint64_t bytes)
{
    pthread_mutex_lock(&mu);
    /* The same key again: its earlier allocation was freed where we did
     * not see it (its context was destroyed). */
    uint64_t stale = table_take(t, key);
    proc_bytes -= stale < proc_bytes ? stale : proc_bytes;
    if (table_put(t, key, bytes))
        proc_bytes += bytes;
    publish_locked();
    pthread_mutex_unlock(&mu);
    if (atomic_load_explicit(&gave_up, memory_order_relaxed))
        atomic_store_explicit(&gave_up, 0, memory_order_relaxed);
}

static uint64_t note_take(struct table *t, uint64_t key)
{
    if (!key || !gating())
        return 0;
    pthread_mutex_lock(&mu);
    uint64_t bytes = table_take(t, key);
    pthread_mutex_unlock(&mu);
    return bytes;
}

static void futex_wait_ns(const _Atomic uint32_t *addr, uint32_t expected, uint64_t ns)
{
    /* Shared (non-PRIVATE) futex on the gate's read-only MAP_SHARED
     * mapping (a wait only reads the word). */
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    syscall(SYS_futex, (const uint32_t *)addr, FUTEX_WAIT, expected, &ts, NULL, 0);
}

static void note_gone(struct table *t, CUresult r, uint64_t key, uint64_t bytes)
{
    if (!gating())
        return;
    if (r != CUDA_SUCCESS) {
        if (bytes) { /* still allocated: put it back */
            pthread_mutex_lock(&mu);
            table_put(t, key, bytes);
            pthread_mutex_unlock(&mu);
        }
        return;
    }
    if (bytes) {
        pthread_mutex_lock(&mu);
        proc_bytes -= bytes < proc_bytes ? bytes : proc_bytes;
        publish_locked();
        pthread_mutex_unlock(&mu);
    }
    /* Tell krexd, which relays it to every waiting co-tenant (the gate's
     * mem_seq).  Relaxed: it only triggers a wake-up; the waiters re-read
     * the summary and retry the allocation. */
    atomic_fetch_add_explicit(&krex_tmem_p->mem_seq, 1, memory_order_relaxed);
}

void krex_mem_alloced(CUresult r, CUdeviceptr ptr, uint64_t bytes)
{
    if (r == CUDA_SUCCESS && ptr && bytes && gating())
        note_new(&ptrs, (uint64_t)ptr, bytes);
}

uint64_t krex_mem_take(CUdeviceptr ptr) { return note_take(&ptrs, (uint64_t)ptr); }

void krex_mem_freed(CUresult r, CUdeviceptr ptr, uint64_t bytes)
{
    note_gone(&ptrs, r, (uint64_t)ptr, bytes);
}

void krex_mem_created(CUresult r, CUmemGenericAllocationHandle handle, uint64_t bytes)
{
    if (r == CUDA_SUCCESS && handle && bytes && gating())
        note_new(&handles, (uint64_t)handle, bytes);
}

uint64_t krex_mem_take_handle(CUmemGenericAllocationHandle handle)
{
    return note_take(&handles, (uint64_t)handle);
}

void krex_mem_released(CUresult r, CUmemGenericAllocationHandle handle, uint64_t bytes)
{
    note_gone(&handles, r, (uint64_t)handle, bytes);
}

void krex_hip_mem_alloced(uint32_t r, void *pptr, uint64_t bytes)
{
    if (r == 0 && pptr)
        krex_mem_alloced(CUDA_SUCCESS, (CUdeviceptr)(uintptr_t) * (void *const *)pptr, bytes);
}

uint64_t krex_hip_mem_take(void *ptr) { return krex_mem_take((CUdeviceptr)(uintptr_t)ptr); }

void krex_hip_mem_freed(uint32_t r, void *ptr, uint64_t bytes)
{
    /* Any failure puts the size back (note_gone): the memory is still held. */
    krex_mem_freed(r == 0 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN, (CUdeviceptr)(uintptr_t)ptr, bytes);
}

void krex_hip_mem_alloced_pitched(uint32_t r, const void *pitched, uint64_t height,
                                  uint64_t depth)
{
    if (r != 0 || !pitched)
        return;
    const struct krex_hip_abi_hipPitchedPtr *p = pitched;
    krex_mem_alloced(CUDA_SUCCESS, (CUdeviceptr)(uintptr_t)p->ptr,
                     mul_sat(mul_sat((uint64_t)p->pitch, height), depth));
}

/* The handle a creation wrote to `*pp` (HIP's handles are pointers), or 0. */
static uint64_t written_handle(uint32_t r, const void *pp)
{
    return r == 0 && pp ? (uint64_t)(uintptr_t) * (void *const *)pp : 0;
}

static void note_created(struct table *t, uint64_t key, uint64_t bytes)
{
    if (key && bytes && gating())
        note_new(t, key, bytes);
}

static void note_freed(struct table *t, uint32_t r, void *key, uint64_t bytes)
{
    /* Any failure puts the size back (note_gone): the memory is still held. */
    note_gone(t, r == 0 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN, (uint64_t)(uintptr_t)key, bytes);
}

void krex_hip_mem_created(uint32_t r, const void *phandle, uint64_t bytes)
{
    note_created(&handles, written_handle(r, phandle), bytes);
}

uint64_t krex_hip_mem_take_handle(void *handle)
{
    return note_take(&handles, (uint64_t)(uintptr_t)handle);
}

void krex_hip_mem_released(uint32_t r, void *handle, uint64_t bytes)
{
    note_freed(&handles, r, handle, bytes);
}

void krex_hip_array_created(uint32_t r, const void *parray, uint64_t bytes)
{
    note_created(&arrays, written_handle(r, parray), bytes);
}

uint64_t krex_hip_array_take(void *array) { return note_take(&arrays, (uint64_t)(uintptr_t)array); }

void krex_hip_array_freed(uint32_t r, void *array, uint64_t bytes)
{
    note_freed(&arrays, r, array, bytes);
}

/* width x height x depth elements of `elem` bytes, a height or depth of 0
 * counting as 1 (1D and 2D arrays). */
static uint64_t array_bytes(uint64_t elem, uint64_t width, uint64_t height, uint64_t depth)
{
    return mul_sat(mul_sat(mul_sat(elem, width), height ? height : 1), depth ? depth : 1);
}

uint64_t krex_hip_array_bytes(const void *desc, uint64_t width, uint64_t height, uint64_t depth)
{
    if (!desc)
        return 0;
    /* Bits per channel (hipChannelFormatDesc x, y, z, w): their sum, in
     * bytes, is the element's size. */
    const struct krex_hip_abi_hipChannelFormatDesc *d = desc;
    const int32_t bits[4] = {d->x, d->y, d->z, d->w};
    uint64_t sum = 0;
    for (int i = 0; i < 4; i++)
        sum += bits[i] > 0 ? (uint64_t)bits[i] : 0;
    return array_bytes((sum + 7) / 8, width, height, depth);
}

/* Bytes of one channel of hipArray_Format `format` (0: unknown). */
static uint64_t format_bytes(uint32_t format)
{
    switch (format) {
    case 0x01: /* HIP_AD_FORMAT_UNSIGNED_INT8 */
    case 0x08: /* HIP_AD_FORMAT_SIGNED_INT8 */
        return 1;
    case 0x02: /* HIP_AD_FORMAT_UNSIGNED_INT16 */
    case 0x09: /* HIP_AD_FORMAT_SIGNED_INT16 */
    case 0x10: /* HIP_AD_FORMAT_HALF */
        return 2;
    case 0x03: /* HIP_AD_FORMAT_UNSIGNED_INT32 */
    case 0x0a: /* HIP_AD_FORMAT_SIGNED_INT32 */
    case 0x20: /* HIP_AD_FORMAT_FLOAT */
        return 4;
    default:
        return 0;
    }
}

uint64_t krex_hip_array_desc_bytes(const void *desc)
{
    if (!desc)
        return 0;
    const struct krex_hip_abi_HIP_ARRAY_DESCRIPTOR *d = desc;
    return array_bytes(format_bytes(d->Format) * d->NumChannels, d->Width, d->Height, 0);
}

uint64_t krex_hip_array3d_desc_bytes(const void *desc)
{
    if (!desc)
        return 0;
    const struct krex_hip_abi_HIP_ARRAY3D_DESCRIPTOR *d = desc;
    return array_bytes(format_bytes(d->Format) * d->NumChannels, d->Width, d->Height, d->Depth);
}

uint64_t krex_mem_device_bytes(size_t size, const CUmemAllocationProp *prop)
{
    return prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? (uint64_t)size : 0;
}

/* ---- out-of-memory judgement ---------------------------------------------------- */

/* What the gate says about the GPU's tenants. */
struct scan {
    uint64_t own_bytes;          /* this tenant: this process exactly, others by slot */
    uint32_t others;             /* live processes of other tenants */
    uint32_t holding;            /* of them, holding memory */
    uint32_t holding_waiting;    /* of those, waiting for memory themselves */
    uint32_t max_waiting_tenant; /* highest tenant id among the waiting */
    uint64_t other_mib;          /* what the other tenants' processes hold */
};

static int alive(int32_t pid)
{
    if (pid <= 0)
        return 0;
    int saved = errno;
    int ok = kill(pid, 0) == 0 || errno == EPERM;
    errno = saved;
    return ok;
}

static void scan_gate(struct scan *sc, struct krex_slot *mine)
{
    const struct krex_gate *g = krex_gate_p;
    memset(sc, 0, sizeof *sc);
    pthread_mutex_lock(&mu);
    sc->own_bytes = proc_bytes;
    pthread_mutex_unlock(&mu);
    /* This tenant's other processes: its own slot memory. */
    for (uint32_t i = 0; i < KREX_TENANT_SLOTS; i++) {
        struct krex_slot *s = &krex_tmem_p->slots[i];
        /* Acquire: the owner's fields were published by its seq_cst
         * ACTIVE CAS.  The memory fields are hints (relaxed).  An EXITING
         * process still holds its memory. */
        uint64_t o = s == mine ? 0 : atomic_load_explicit(&s->owner, memory_order_acquire);
        uint32_t st = krex_owner_state(o);
        if ((st != KREX_SLOT_ACTIVE && st != KREX_SLOT_EXITING) || !alive(krex_owner_pid(o)))
            continue;
        sc->own_bytes += (uint64_t)atomic_load_explicit(&s->mem_mib, memory_order_relaxed) * MIB;
    }
    /* Other tenants: krexd's summary in the gate (relaxed: hints krexd
     * rewrites every few ms; the bound is the constant, not the header). */
    for (uint32_t i = 0; i < KREX_GATE_MAX_TENANTS; i++) {
        const struct krex_gate_tenant *row = &g->tenants[i];
        uint32_t tenant = atomic_load_explicit(&row->tenant, memory_order_relaxed);
        if (tenant == 0 || tenant == krex_tenant)
            continue;
        uint32_t waiting = atomic_load_explicit(&row->holding_waiting, memory_order_relaxed);
        sc->others += atomic_load_explicit(&row->procs, memory_order_relaxed);
        sc->other_mib += atomic_load_explicit(&row->mem_mib, memory_order_relaxed);
        sc->holding += atomic_load_explicit(&row->holding, memory_order_relaxed);
        sc->holding_waiting += waiting;
        if (waiting && tenant > sc->max_waiting_tenant)
            sc->max_waiting_tenant = tenant;
    }
}

/* What the judgement needs of the runtime whose call failed: its error's
 * name (logged) and the size of the calling thread's device (0: unknown).
 * Each runtime is asked through its own real function: a HIP process never
 * loads libcuda, a CUDA one never loads the HIP runtime. */
struct oom_runtime {
    const char *oom_name;
    uint64_t (*device_total)(void);
};

static uint64_t cuda_device_total(void)
{
    __typeof__(&cuMemGetInfo_v2) f = KREX_REAL(cuMemGetInfo_v2);
    size_t free_b = 0, total = 0;
    if (!f || f(&free_b, &total) != CUDA_SUCCESS)
        return 0;
    return (uint64_t)total;
}

static uint64_t hip_device_total(void)
{
    /* The runtime is loaded: this runs after one of its calls failed. */
    krex_hip_abi_hipMemGetInfo *f = KREX_HIP_REAL(hipMemGetInfo);
    size_t free_b = 0, total = 0;
    if (!f || f(&free_b, &total) != KREX_HIP_SUCCESS)
        return 0;
    return (uint64_t)total;
}

static const struct oom_runtime cuda_runtime = {"CUDA_ERROR_OUT_OF_MEMORY", cuda_device_total};
static const struct oom_runtime hip_runtime = {"hipErrorOutOfMemory", hip_device_total};

/* Wait until krexd has audited the gate twice since now (at most 50 ms):
 * the summary read next was made after this call began. */
static void fresh_summary(const struct krex_gate *g)
{
    uint32_t start = atomic_load_explicit(&g->audit_seq, memory_order_seq_cst);
    uint64_t deadline = krex_now_ns() + 50000000ull;
    for (;;) {
        uint32_t cur = atomic_load_explicit(&g->audit_seq, memory_order_seq_cst);
        uint64_t now = krex_now_ns();
        if ((uint32_t)(cur - start) >= 2 || now >= deadline)
            return;
        futex_wait_ns(&g->audit_seq, cur, deadline - now);
    }
}

/* KREX_OOM_NONE: co-tenants' memory, wait for it; else why to return now. */
static enum krex_oom_reason judge(const struct scan *sc, uint64_t bytes, int first,
                                  const struct oom_runtime *rt)
{
    uint64_t total = rt->device_total();
    if (total && sc->own_bytes + bytes > total)
        return KREX_OOM_TOO_LARGE;
    if (sc->others == 0)
        return KREX_OOM_ALONE;
    uint64_t w = krex_gate_load_word(krex_gate_p);
    if (w != 0 && krex_gate_holder(w) == krex_tenant)
        return KREX_OOM_IN_REGION;
    if (krex_depth)
        return KREX_OOM_NESTED;
    if (oom_wait_ns == 0)
        return KREX_OOM_NO_WAIT;
    if (first && atomic_load_explicit(&gave_up, memory_order_relaxed))
        return KREX_OOM_TIMEOUT;
    if (sc->holding > 0 && sc->holding_waiting == sc->holding &&
        krex_tenant > sc->max_waiting_tenant)
        return KREX_OOM_MUTUAL;
    return KREX_OOM_NONE;
}

static int is_own(enum krex_oom_reason why)
{
    return why == KREX_OOM_TOO_LARGE || why == KREX_OOM_ALONE;
}

static const char *reason_text(enum krex_oom_reason why)
{
    switch (why) {
    case KREX_OOM_TIMEOUT: return "co-tenants did not free enough memory in time";
    case KREX_OOM_IN_REGION: return "inside this tenant's critical region (siblings are frozen)";
    case KREX_OOM_NESTED: return "inside another driver call, where it cannot wait";
    case KREX_OOM_NO_WAIT: return "co-tenants hold the memory and waiting is off";
    case KREX_OOM_TOO_LARGE: return "this tenant alone would exceed the GPU's memory";
    case KREX_OOM_ALONE: return "no other tenant uses this GPU";
    case KREX_OOM_MUTUAL: return "every co-tenant holding memory waits for memory too";
    case KREX_OOM_NONE: break;
    }
    return "";
}

enum { EV_NONE, EV_WAITED, EV_FAILED, EV_OWN };

static uint32_t bump(uint32_t word, unsigned shift, uint32_t max)
{
    /* Saturating: below max, +1 cannot carry into the next field. */
    return ((word >> shift) & max) < max ? word + (1u << shift) : word;
}

/* Threads of this process waiting for co-tenants' memory now. */
static _Atomic uint32_t nwaiting;

/* Update the slot's record: count `ev`, remember `why`, and set the
 * WAITING bit while any thread of the process waits.  All seq_cst (a slow
 * path): the count is read after the word in each attempt, so the update
 * that lands last has seen every change of the count made before the
 * updates it follows, and the bit matches the count once they settle. */
static void oom_record(int ev, enum krex_oom_reason why)
{
    struct krex_slot *s = my_slot();
    if (!s)
        return;
    uint32_t old = atomic_load_explicit(&s->oom, memory_order_seq_cst), nw;
    do {
        nw = old;
        if (ev == EV_WAITED)
            nw = bump(nw, KREX_OOM_WAITED_SHIFT, KREX_OOM_WAITED_MAX);
        if (ev == EV_FAILED)
            nw = bump(nw, KREX_OOM_FAILED_SHIFT, KREX_OOM_FAILED_MAX);
        if (ev == EV_OWN)
            nw = bump(nw, KREX_OOM_OWN_SHIFT, KREX_OOM_OWN_MAX);
        if (ev == EV_FAILED || ev == EV_OWN)
            nw = (nw & ~(KREX_OOM_LAST_MAX << KREX_OOM_LAST_SHIFT)) |
                 ((uint32_t)why << KREX_OOM_LAST_SHIFT);
        nw = atomic_load_explicit(&nwaiting, memory_order_seq_cst) ? nw | KREX_OOM_WAITING
                                                                   : nw & ~KREX_OOM_WAITING;
    } while (!atomic_compare_exchange_weak_explicit(&s->oom, &old, nw, memory_order_seq_cst,
                                                    memory_order_seq_cst));
}

static void stop_waiting(struct krex_oom *o, int ev, enum krex_oom_reason why)
{
    if (o->waiting) {
        o->waiting = 0;
        atomic_fetch_sub_explicit(&nwaiting, 1, memory_order_seq_cst);
    }
    oom_record(ev, why);
}

/* krex_oom_retry() for any runtime: the attempt failed for want of device
 * memory (`oom`), succeeded (`ok`), or neither (another error). */
static int oom_retry(struct krex_oom *o, const struct oom_runtime *rt, int oom, int ok,
                     uint64_t bytes)
{
    if (!oom) {
        if (o->waiting) {
            stop_waiting(o, ok ? EV_WAITED : EV_NONE, KREX_OOM_NONE);
            krex_log(KREX_LOG_INFO, "%llu MiB: %s after waiting %.3f s for co-tenants' memory",
                     (unsigned long long)((bytes + MIB - 1) / MIB),
                     !ok ? "failed otherwise" : bytes ? "allocated" : "succeeded",
                     (double)(krex_now_ns() - o->start_ns) / 1e9);
        }
        return 0;
    }
    struct krex_slot *mine = gating() ? my_slot() : NULL;
    if (!mine)
        return 0; /* ungated or not registered: nothing to judge by */
    int saved = errno;
    pthread_once(&cfg_once, read_config);
    const struct krex_gate *g = krex_gate_p;
    unsigned long long mib = (unsigned long long)((bytes + MIB - 1) / MIB);
    char what[48]; /* "for 300 MiB", or a call that needs memory of unknown size */
    if (bytes)
        snprintf(what, sizeof what, "for %llu MiB", mib);
    else
        snprintf(what, sizeof what, "in a call that needs device memory");
    struct scan sc;
    scan_gate(&sc, mine);
    enum krex_oom_reason why = judge(&sc, bytes, !o->waiting, rt);
    if (why == KREX_OOM_ALONE && !o->waiting) {
        /* krexd's summary may predate a co-tenant's first allocation: judge
         * again on a summary made after this failure. */
        fresh_summary(g);
        scan_gate(&sc, mine);
        why = judge(&sc, bytes, 1, rt);
    }
    uint64_t now = krex_now_ns();
    if (why == KREX_OOM_NONE && o->waiting && now >= o->deadline_ns) {
        why = KREX_OOM_TIMEOUT;
        atomic_store_explicit(&gave_up, 1, memory_order_relaxed);
    }
    if (why != KREX_OOM_NONE) {
        stop_waiting(o, is_own(why) ? EV_OWN : EV_FAILED, why);
        if (is_own(why))
            krex_log(KREX_LOG_INFO, "out of memory %s: %s: the tenant's own error", what,
                     reason_text(why));
        else
            krex_log(KREX_LOG_WARN, "out of memory %s: %s (%u co-tenant process(es) "
                     "hold %llu MiB): returning %s, caused by co-tenants",
                     what, reason_text(why), sc.others, (unsigned long long)sc.other_mib,
                     rt->oom_name);
        errno = saved;
        return 0;
    }
    if (!o->waiting) {
        o->waiting = 1;
        o->start_ns = now;
        o->deadline_ns = now + oom_wait_ns;
        o->sleep_ns = FIRST_SLEEP_NS;
        atomic_fetch_add_explicit(&nwaiting, 1, memory_order_seq_cst);
        oom_record(EV_NONE, KREX_OOM_NONE);
        krex_log(KREX_LOG_INFO, "out of memory %s while %u co-tenant process(es) hold "
                 "%llu MiB: waiting up to %.1f s for them to free memory", what, sc.others,
                 (unsigned long long)sc.other_mib, (double)oom_wait_ns / 1e9);
        /* One attempt at once: a free between the failed attempt and this
         * read of mem_seq is then not missed. */
    } else {
        uint64_t left = o->deadline_ns - now;
        futex_wait_ns(&g->mem_seq, o->seq, left < o->sleep_ns ? left : o->sleep_ns);
        o->sleep_ns = o->sleep_ns * 2 < MAX_SLEEP_NS ? o->sleep_ns * 2 : MAX_SLEEP_NS;
    }
    o->seq = atomic_load_explicit(&g->mem_seq, memory_order_seq_cst);
    errno = saved;
    return 1;
}

int krex_oom_retry(struct krex_oom *o, CUresult r, uint64_t bytes)
{
    return oom_retry(o, &cuda_runtime, r == CUDA_ERROR_OUT_OF_MEMORY, r == CUDA_SUCCESS, bytes);
}

int krex_hip_oom_retry(struct krex_oom *o, uint32_t r, uint64_t bytes)
{
    int waited = o->waiting;
    int again = oom_retry(o, &hip_runtime, r == KREX_HIP_ERROR_OUT_OF_MEMORY,
                          r == KREX_HIP_SUCCESS, bytes);
    /* Succeeded after waiting: the failed attempt's hipErrorOutOfMemory is
     * still the thread's last error, and the program never saw it fail.  An
     * error the program left unread before the call is lost with it (the
     * runtime has no way to put it back). */
    if (waited && r == KREX_HIP_SUCCESS)
        krex_hip_forget_own_error(KREX_HIP_SUCCESS);
    return again;
}

/* ---- fork ------------------------------------------------------------------------ */

void krex_memory_atfork_prepare(void) { pthread_mutex_lock(&mu); }

void krex_memory_atfork_parent(void) { pthread_mutex_unlock(&mu); }

/* The child owns no device memory (CUDA state does not survive fork).
 * The inherited tables are dropped, not freed: only async-signal-safe work
 * here, the child of a threaded parent may run no more before exec. */
void krex_memory_atfork_child(void)
{
    pthread_mutex_init(&mu, NULL);
    memset(&ptrs, 0, sizeof ptrs);
    memset(&handles, 0, sizeof handles);
    memset(&arrays, 0, sizeof arrays);
    proc_bytes = 0;
    atomic_store_explicit(&gave_up, 0, memory_order_relaxed);
    atomic_store_explicit(&nwaiting, 0, memory_order_relaxed);
}
