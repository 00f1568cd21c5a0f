/*
 * memshare.c — the per-GPU memory capacity shared by every process using
 * the same state file (KREX_FAKE_STATE).
 *
 * The file is one mmap'd struct shared_state: per GPU an atomic count of
 * bytes in use, and per process a slot (pid, start time, bytes in use per
 * GPU).  krexd reads it for --fake-gpus: the format is an interface,
 * declared in docs/design/interfaces.md ("Simulated GPU memory state");
 * change that table with this struct (tests/memory/test_sources.py checks
 * krexd's reader against this writer).  A process claims a slot at its
 * first allocation or context and gives it back at normal exit
 * (fc_share_exit, from the library destructor).  The slot also says on
 * which GPUs the process has a context (krexd's view of who has the GPU
 * open, as NVML's compute processes on a real GPU).  The usage
 * of a process that died without that (SIGKILL) is reclaimed when an
 * allocation finds the GPU full, and when cuMemGetInfo reads the count.
 *
 * Accounting order keeps   used[g] >= sum of the slots' used[g]   at every
 * instant, so a process killed between two steps can only leak a few bytes
 * until reclaimed, never make the count wrap: a reservation adds to the GPU
 * count first and to the slot second; a release subtracts from the slot
 * first.  All counters are only ever changed by atomic read-modify-writes,
 * which is what makes them correct; the orders below are about ownership of
 * a slot changing hands.
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

/* The last byte is the layout version; another layout is refused.
 * Version 2: a process record's second word is the mask of GPUs on which
 * the process has a live context (it was reserved in version 1). */
#define STATE_MAGIC 0x3276736b66786572ull /* "rexfksv2" in memory */
#define STATE_PROCS 1024

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "shared-memory atomics must be lock-free to work across processes");

struct proc_slot {
    _Atomic int32_t pid;         /* 0 free; > 0 owner; < 0 being reclaimed */
    _Atomic uint32_t ctx_mask;   /* bit g: a live context on GPU g */
    _Atomic uint64_t start_time; /* owner's start time (/proc/<pid>/stat field 22) */
    _Atomic uint64_t used[FC_MAX_GPUS];
};

struct shared_state {
    _Atomic uint64_t magic;      /* 0 in a fresh (zero-filled) file */
    uint64_t pad[7];
    _Atomic uint64_t used[FC_MAX_GPUS];
    struct proc_slot procs[STATE_PROCS];
};

static struct shared_state *sh;
static int my_slot = -1;

CUresult fc_share_open(const char *path)
{
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
    /* A zero-filled file is a valid empty state; the magic only marks it.
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

/* State letter and start time of a process from /proc/<pid>/stat; false
 * (errno set) when it cannot be read. */
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
    /* The command name (field 2) may hold spaces; it ends at the last ')'. */
    char *p = strrchr(buf, ')');
    if (p == NULL || p[1] != ' ' || p[2] == '\0')
        return false;
    p += 2; /* field 3, the state */
    *state = *p;
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
        return false; /* exited, not yet reaped */
    /* A different start time: the pid now belongs to another process. */
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
        /* Only the process whose CAS wins reclaims the slot. */
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
        atomic_store_explicit(&slot->ctx_mask, 0, memory_order_relaxed);
        /* Release: the zeroed slot is complete before it can be claimed. */
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
                atomic_store_explicit(&sh->procs[i].ctx_mask, 0, memory_order_relaxed);
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

/* Add n to GPU g's count unless that would exceed the capacity. */
static bool try_reserve(int g, uint64_t n)
{
    uint64_t cur = atomic_load_explicit(&sh->used[g], memory_order_relaxed);
    do {
        if (n > fc.mem_bytes || cur > fc.mem_bytes - n)
            return false;
    } while (!atomic_compare_exchange_weak_explicit(&sh->used[g], &cur, cur + n,
                                                    memory_order_relaxed, memory_order_relaxed));
    return true;
}

bool fc_share_reserve(int gpu, uint64_t bytes)
{
    if (my_slot < 0 && !claim_slot())
        return false;
    if (!try_reserve(gpu, bytes) && (reclaim_dead() == 0 || !try_reserve(gpu, bytes)))
        return false;
    atomic_fetch_add_explicit(&sh->procs[my_slot].used[gpu], bytes, memory_order_relaxed);
    return true;
}

void fc_share_release(int gpu, uint64_t bytes)
{
    atomic_fetch_sub_explicit(&sh->procs[my_slot].used[gpu], bytes, memory_order_relaxed);
    atomic_fetch_sub_explicit(&sh->used[gpu], bytes, memory_order_relaxed);
}

/* Live contexts of this process per GPU; the mask bit mirrors "> 0". */
static unsigned ctx_count[FC_MAX_GPUS];

void fc_share_ctx(int gpu, int delta)
{
    if (sh == NULL || gpu < 0 || gpu >= FC_MAX_GPUS || (my_slot < 0 && !claim_slot()))
        return;
    unsigned before = ctx_count[gpu];
    ctx_count[gpu] = delta > 0 ? before + 1 : before ? before - 1 : 0;
    /* Relaxed: a status bit krexd polls; nothing is published with it. */
    if (!before && ctx_count[gpu])
        atomic_fetch_or_explicit(&sh->procs[my_slot].ctx_mask, 1u << gpu, memory_order_relaxed);
    else if (before && !ctx_count[gpu])
        atomic_fetch_and_explicit(&sh->procs[my_slot].ctx_mask, ~(1u << gpu),
                                  memory_order_relaxed);
}

uint64_t fc_share_used(int gpu)
{
    reclaim_dead();
    return atomic_load_explicit(&sh->used[gpu], memory_order_relaxed);
}

void fc_share_atfork_child(void)
{
    my_slot = -1; /* the parent's slot stays the parent's */
    memset(ctx_count, 0, sizeof ctx_count); /* contexts do not survive fork */
}

void fc_share_exit(void)
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
    atomic_store_explicit(&slot->start_time, 0, memory_order_relaxed);
    atomic_store_explicit(&slot->ctx_mask, 0, memory_order_relaxed);
    /* Release: the zeroed slot is complete before it can be claimed. */
    atomic_store_explicit(&slot->pid, 0, memory_order_release);
    my_slot = -1;
}
