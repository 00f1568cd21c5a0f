/*
 * memshare.c — the state file every process of the fake driver maps
 * (KREX_FAKE_STATE; layout in share.h): the per-GPU memory capacity they
 * share, and one record per process.
 *
 * Per GPU an atomic count of bytes in use; per process a record (pid,
 * start time, bytes in use per GPU, the GPUs it has a context on, its
 * checkpoint-lock state and its recent GPU activity).  krexd reads it for
 * --fake-gpus: the format is an interface, declared in
 * docs/design/interfaces.md ("Simulated GPU memory state"); change that
 * table with share.h (tests/memory/test_sources.py checks krexd's reader
 * against this writer).  A process claims its record at cuInit and gives it
 * back at normal exit (fc_share_exit, from the library destructor); it is
 * listed for krexd's memory view (FC_REC_LISTED) from its first allocation
 * or context.  Every copy of the driver loaded in one process (a plugin's
 * RTLD_DEEPBIND or dlmopen copy) uses the same record, so the checkpoint
 * lock, which is per pid, reaches all of them; the last copy to unload
 * frees it.  The record of a process that died without that (SIGKILL) is
 * reclaimed when an allocation finds the GPU full, when cuMemGetInfo reads
 * the count, when no record is free, and when a checkpoint call or a new
 * process with the same pid meets it.
 *
 * Accounting order keeps   used[g] >= sum of the slots' used[g]   at every
 * instant, so a process killed between two steps can only leak a few bytes
 * until reclaimed, never make the count wrap: a reservation adds to the GPU
 * count first and to the slot second; a release subtracts from the slot
 * first.  All counters are only ever changed by atomic read-modify-writes,
 * which is what makes them correct; the orders below are about ownership of
 * a slot changing hands.
 */
#include "share.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct shared_state *fc_sh;
static int my_slot = -1; /* this copy's record (per copy of the driver, like all statics) */

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
        ((size_t)st.st_size < FC_SHARE_BYTES && ftruncate(fd, (off_t)FC_SHARE_BYTES) != 0)) {
        fprintf(stderr, "fakecuda: memory state file %s: %s\n", path, strerror(errno));
        close(fd);
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    void *p = mmap(NULL, FC_SHARE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        fprintf(stderr, "fakecuda: memory state file %s: mmap: %s\n", path, strerror(errno));
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    struct shared_state *s = p;
    /* A zero-filled file is a valid empty state; the magic only marks it.
     * Relaxed: nothing else is published through the magic. */
    uint64_t expect = 0;
    if (!atomic_compare_exchange_strong_explicit(&s->magic, &expect, FC_SHARE_MAGIC,
                                                 memory_order_relaxed, memory_order_relaxed) &&
        expect != FC_SHARE_MAGIC) {
        fprintf(stderr, "fakecuda: memory state file %s has another layout; remove it\n", path);
        munmap(p, FC_SHARE_BYTES);
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    fc_sh = s;
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
    uint64_t ticks = p ? strtoull(p, NULL, 10) : 0;
    /* As krexd reads it: without this process's boot-time offset. */
    int64_t off = fc_boottime_offset_ticks();
    *start_time = ticks > 0 && ticks <= INT64_MAX && (int64_t)ticks > off
                      ? (uint64_t)((int64_t)ticks - off)
                      : 0;
    return true;
}

uint64_t fc_proc_start_time(pid_t pid)
{
    char state;
    uint64_t start = 0;
    return proc_stat(pid, &state, &start) ? start : 0;
}

bool fc_proc_alive(pid_t pid, uint64_t start_time)
{
    /* pid is /proc's number (fc_self_pid), not necessarily one of this
     * process's pid namespace: /proc alone is asked, not kill(2). */
    char state = '?';
    uint64_t now_start = 0;
    if (!proc_stat(pid, &state, &now_start))
        return errno != ENOENT; /* unreadable /proc: assume alive */
    if (state == 'Z' || state == 'X')
        return false; /* exited, not yet reaped */
    /* A different start time: the pid now belongs to another process. */
    return start_time == 0 || now_start == 0 || now_start == start_time;
}

struct ring_op *fc_share_ring(const struct proc_slot *slot)
{
    size_t i = (size_t)(slot - fc_sh->procs);
    return (struct ring_op *)((char *)fc_sh + FC_RING_OFFSET) + i * FC_RING_OPS;
}

/* Empty the record `slot` (pid already negative or about to be unowned) and
 * free it: its usage goes back to the GPU counts, every other word to 0. */
static void slot_free(struct proc_slot *slot)
{
    for (int g = 0; g < FC_MAX_GPUS; g++) {
        uint64_t u = atomic_exchange_explicit(&slot->used[g], 0, memory_order_relaxed);
        if (u)
            atomic_fetch_sub_explicit(&fc_sh->used[g], u, memory_order_relaxed);
    }
    /* Relaxed stores: the release store of pid below publishes them all. */
    atomic_store_explicit(&slot->start_time, 0, memory_order_relaxed);
    atomic_store_explicit(&slot->ctx_mask, 0, memory_order_relaxed);
    atomic_store_explicit(&slot->lock, FC_LK_RUNNING, memory_order_relaxed);
    atomic_store_explicit(&slot->inflight, 0, memory_order_relaxed);
    atomic_store_explicit(&slot->locker, 0, memory_order_relaxed);
    atomic_store_explicit(&slot->flags, 0, memory_order_relaxed);
    atomic_store_explicit(&slot->copies, 0, memory_order_relaxed);
    atomic_store_explicit(&slot->last_end, 0, memory_order_relaxed);
    atomic_store_explicit(&slot->ops, 0, memory_order_relaxed);
    struct ring_op *ring = fc_share_ring(slot);
    for (int i = 0; i < FC_RING_OPS; i++)
        atomic_store_explicit(&ring[i].seq, 0, memory_order_relaxed);
    /* Release: the zeroed slot is complete before it can be claimed. */
    atomic_store_explicit(&slot->pid, 0, memory_order_release);
}

/* Reclaim record i if its process is gone; true when it was freed here. */
static bool reclaim_slot(int i)
{
    struct proc_slot *slot = &fc_sh->procs[i];
    /* Acquire pairs with the claim's CAS: the start time read is the owner's. */
    int32_t pid = atomic_load_explicit(&slot->pid, memory_order_acquire);
    if (pid <= 0 || i == my_slot)
        return false;
    uint64_t start = atomic_load_explicit(&slot->start_time, memory_order_relaxed);
    if (fc_proc_alive(pid, start))
        return false;
    /* Only the process whose CAS wins reclaims the slot. */
    int32_t expect = pid;
    if (!atomic_compare_exchange_strong_explicit(&slot->pid, &expect, -pid, memory_order_acq_rel,
                                                 memory_order_relaxed))
        return false;
    slot_free(slot);
    return true;
}

/* Return dead processes' records; how many were freed. */
static int reclaim_dead(void)
{
    int freed = 0;
    for (int i = 0; i < FC_SHARE_PROCS; i++)
        freed += reclaim_slot(i);
    return freed;
}

struct proc_slot *fc_share_find(pid_t pid)
{
    if (fc_sh == NULL || pid <= 0)
        return NULL;
    for (int i = 0; i < FC_SHARE_PROCS; i++) {
        struct proc_slot *slot = &fc_sh->procs[i];
        /* seq_cst, as the claim's CAS: see claim_slot (one record per pid). */
        if (atomic_load_explicit(&slot->pid, memory_order_seq_cst) != (int32_t)pid)
            continue;
        if (!reclaim_slot(i))
            return slot;
    }
    return NULL;
}

/* A record of this process that another copy of the driver claimed before
 * `below` (start time 0: being claimed right now), or -1.  A record with our
 * pid and another start time is a dead predecessor's: reclaimed. */
static int own_record(int32_t me, uint64_t start, int below)
{
    for (int i = 0; i < below; i++) {
        struct proc_slot *slot = &fc_sh->procs[i];
        if (atomic_load_explicit(&slot->pid, memory_order_seq_cst) != me)
            continue;
        uint64_t st = atomic_load_explicit(&slot->start_time, memory_order_relaxed);
        if (st == 0 || start == 0 || st == start)
            return i;
        (void)reclaim_slot(i);
    }
    return -1;
}

/* Take a free record with a CAS 0 -> pid; its index or -1. */
static int take_free(int32_t me, uint64_t start)
{
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < FC_SHARE_PROCS; i++) {
            int32_t expect = 0;
            /* seq_cst (also acquire, pairing with slot_free's release): two copies
             * of the driver claiming at once see each other's claim in own_record. */
            if (atomic_compare_exchange_strong_explicit(&fc_sh->procs[i].pid, &expect, me,
                                                        memory_order_seq_cst,
                                                        memory_order_relaxed)) {
                atomic_store_explicit(&fc_sh->procs[i].start_time, start, memory_order_relaxed);
                return i;
            }
        }
        if (reclaim_dead() == 0)
            break;
    }
    return -1;
}

/* This copy's record: the one another copy of the driver in this process
 * already uses, else a free one.  Two copies claiming at once both take one;
 * the one that took the higher index gives it back and joins the lower. */
static bool claim_slot(void)
{
    int32_t me = (int32_t)fc_self_pid();
    char state;
    uint64_t start = 0;
    (void)proc_stat(me, &state, &start);
    int i = own_record(me, start, FC_SHARE_PROCS);
    if (i < 0) {
        i = take_free(me, start);
        if (i < 0) {
            fprintf(stderr, "fakecuda: no free process record in the state file\n");
            return false;
        }
        int lower = own_record(me, start, i);
        if (lower >= 0) {
            atomic_store_explicit(&fc_sh->procs[i].start_time, 0, memory_order_relaxed);
            atomic_store_explicit(&fc_sh->procs[i].pid, 0, memory_order_release);
            i = lower;
        }
    }
    /* Relaxed: a count only this process's copies change. */
    atomic_fetch_add_explicit(&fc_sh->procs[i].copies, 1, memory_order_relaxed);
    my_slot = i;
    return true;
}

void fc_share_attach(void)
{
    if (fc_sh != NULL && my_slot < 0)
        (void)claim_slot(); /* without a record: no lock, no activity (message printed) */
}

struct proc_slot *fc_share_self(void)
{
    return my_slot >= 0 ? &fc_sh->procs[my_slot] : NULL;
}

/* The process is listed in krexd's memory view from now on. */
static void mark_listed(void)
{
    /* Relaxed: a status bit krexd polls; nothing is published with it. */
    atomic_fetch_or_explicit(&fc_sh->procs[my_slot].flags, FC_REC_LISTED, memory_order_relaxed);
}

void fc_share_mark_mps(void)
{
    /* Relaxed: a status bit a locker reads; nothing is published with it. */
    if (my_slot >= 0)
        atomic_fetch_or_explicit(&fc_sh->procs[my_slot].flags, FC_REC_MPS, memory_order_relaxed);
}

/* Add n to GPU g's count unless that would exceed the capacity. */
static bool try_reserve(int g, uint64_t n)
{
    uint64_t cur = atomic_load_explicit(&fc_sh->used[g], memory_order_relaxed);
    do {
        if (n > fc.mem_bytes || cur > fc.mem_bytes - n)
            return false;
    } while (!atomic_compare_exchange_weak_explicit(&fc_sh->used[g], &cur, cur + n,
                                                    memory_order_relaxed, memory_order_relaxed));
    return true;
}

bool fc_share_reserve(int gpu, uint64_t bytes)
{
    if (my_slot < 0 && !claim_slot())
        return false;
    mark_listed();
    if (!try_reserve(gpu, bytes) && (reclaim_dead() == 0 || !try_reserve(gpu, bytes)))
        return false;
    atomic_fetch_add_explicit(&fc_sh->procs[my_slot].used[gpu], bytes, memory_order_relaxed);
    return true;
}

void fc_share_release(int gpu, uint64_t bytes)
{
    atomic_fetch_sub_explicit(&fc_sh->procs[my_slot].used[gpu], bytes, memory_order_relaxed);
    atomic_fetch_sub_explicit(&fc_sh->used[gpu], bytes, memory_order_relaxed);
}

/* Live contexts of this process per GPU; the mask bit mirrors "> 0". */
static unsigned ctx_count[FC_MAX_GPUS];

void fc_share_ctx(int gpu, int delta)
{
    if (fc_sh == NULL || gpu < 0 || gpu >= FC_MAX_GPUS || (my_slot < 0 && !claim_slot()))
        return;
    mark_listed();
    unsigned before = ctx_count[gpu];
    ctx_count[gpu] = delta > 0 ? before + 1 : before ? before - 1 : 0;
    /* Relaxed: a status bit krexd polls; nothing is published with it. */
    if (!before && ctx_count[gpu])
        atomic_fetch_or_explicit(&fc_sh->procs[my_slot].ctx_mask, 1u << gpu,
                                 memory_order_relaxed);
    else if (before && !ctx_count[gpu])
        atomic_fetch_and_explicit(&fc_sh->procs[my_slot].ctx_mask, ~(1u << gpu),
                                  memory_order_relaxed);
}

uint64_t fc_share_used(int gpu)
{
    reclaim_dead();
    return atomic_load_explicit(&fc_sh->used[gpu], memory_order_relaxed);
}

void fc_share_atfork_child(void)
{
    my_slot = -1; /* the parent's record stays the parent's; the child has none */
    memset(ctx_count, 0, sizeof ctx_count); /* contexts do not survive fork */
}

void fc_share_exit(void)
{
    if (fc_sh == NULL || my_slot < 0)
        return;
    struct proc_slot *slot = &fc_sh->procs[my_slot];
    my_slot = -1;
    if (atomic_load_explicit(&slot->pid, memory_order_relaxed) != (int32_t)fc_self_pid())
        return;
    /* Relaxed: the copies of one process only count themselves down.  The
     * last one frees the record (earlier ones leave their usage to it). */
    if (atomic_fetch_sub_explicit(&slot->copies, 1, memory_order_relaxed) > 1)
        return;
    int32_t me = (int32_t)fc_self_pid();
    if (atomic_compare_exchange_strong_explicit(&slot->pid, &me, -me, memory_order_acq_rel,
                                                memory_order_relaxed))
        slot_free(slot);
}
