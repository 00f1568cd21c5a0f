/*
 * share.h — the layout of the state file every process of the fake driver
 * maps (KREX_FAKE_STATE), for the files that use it: memshare.c (memory and
 * the process records), checkpoint.c (the checkpoint lock) and activity.c
 * (per-process GPU activity).
 *
 * The layout is an interface: docs/design/interfaces.md ("Simulated GPU
 * memory state") declares it for krexd's readers (krexd/memory/sources.py,
 * krexd/memory/activity.py).  Change that table, the readers and the magic's last
 * byte (the version) with these structures.
 *
 *   offset 0        struct shared_state: magic, per-GPU bytes in use, the
 *                   FC_SHARE_PROCS process records
 *   FC_RING_OFFSET  one ring of FC_RING_OPS operation intervals per record
 */
#ifndef FAKECUDA_SHARE_H
#define FAKECUDA_SHARE_H

#include "fakecuda.h"

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

/* "rexfksv3" in memory.  Version 3: records of 184 bytes (checkpoint lock,
 * activity), every cuInit gets a record, and the rings after the records. */
#define FC_SHARE_MAGIC 0x3376736b66786572ull
#define FC_SHARE_PROCS 1024
#define FC_RING_OPS 256 /* operation intervals kept per process */

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "shared-memory atomics must be lock-free to work across processes");

/* Checkpoint-lock states of a process (the record's `lock` futex word). */
enum fc_lock_state {
    FC_LK_RUNNING = 0, /* calls run */
    FC_LK_LOCKING = 1, /* a cuCheckpointProcessLock is draining it: calls block */
    FC_LK_LOCKED = 2,  /* locked: calls block until cuCheckpointProcessUnlock */
};

/* Record flags. */
#define FC_REC_LISTED 1u /* allocated or had a context: krexd's memory reader lists it */
#define FC_REC_MPS 2u    /* an MPS client (its cuInit mapped an MPS server file) */

struct proc_slot {
    _Atomic int32_t pid;         /* 0 free; > 0 owner; < 0 being reclaimed */
    _Atomic uint32_t ctx_mask;   /* bit g: a live context on GPU g */
    _Atomic uint64_t start_time; /* owner's start time (/proc/<pid>/stat field 22) */
    _Atomic uint64_t used[FC_MAX_GPUS];
    _Atomic uint32_t lock;       /* enum fc_lock_state; a futex word */
    _Atomic uint32_t inflight;   /* driver calls between entry and return; a futex word */
    _Atomic int32_t locker;      /* FC_LK_LOCKING: the thread (or pid) whose lock call drains it */
    _Atomic uint32_t flags;      /* FC_REC_* */
    _Atomic uint32_t copies;     /* copies of the driver in the process using the record */
    uint32_t reserved;
    _Atomic uint64_t last_end;   /* latest end of the process's enqueued work (ns) */
    _Atomic uint64_t ops;        /* operations recorded in the ring so far */
};
_Static_assert(sizeof(struct proc_slot) == 184, "record layout (interfaces.md)");

struct shared_state {
    _Atomic uint64_t magic; /* 0 in a fresh (zero-filled) file */
    uint64_t pad[7];
    _Atomic uint64_t used[FC_MAX_GPUS];
    struct proc_slot procs[FC_SHARE_PROCS];
};

/* One operation's interval on the simulated GPU timeline.  `seq` is written
 * last: the n-th operation of the process (from 1), in entry (n-1) % FC_RING_OPS. */
struct ring_op {
    _Atomic uint64_t seq;
    _Atomic uint64_t start_ns;
    _Atomic uint64_t end_ns;
    _Atomic uint32_t gpu;   /* simulated GPU index */
    uint32_t reserved;
};
_Static_assert(sizeof(struct ring_op) == 32, "ring entry layout (interfaces.md)");

#define FC_RING_OFFSET (sizeof(struct shared_state))
#define FC_SHARE_BYTES (FC_RING_OFFSET + (size_t)FC_SHARE_PROCS * FC_RING_OPS * sizeof(struct ring_op))

/* memshare.c */
extern struct shared_state *fc_sh;  /* the mapping (NULL before cuInit) */
struct proc_slot *fc_share_self(void); /* this process's record, or NULL */
struct ring_op *fc_share_ring(const struct proc_slot *slot);
/* The live record of process `pid`, or NULL (a record of a dead process
 * with that pid is reclaimed on the way). */
struct proc_slot *fc_share_find(pid_t pid);
bool fc_proc_alive(pid_t pid, uint64_t start_time);
/* The start time of process `pid` (/proc/<pid>/stat field 22, in the
 * initial time namespace's terms), 0 when unreadable. */
uint64_t fc_proc_start_time(pid_t pid);

/* procself.c: this process's pid as /proc (and NVML) names it; this
 * process's boot-time offset in clock ticks (0 outside a time namespace). */
pid_t fc_self_pid(void);
int64_t fc_boottime_offset_ticks(void);

/* checkpoint.c: futexes on words of the shared mapping (not private: the
 * waiters and wakers are different processes). */
void fc_futex_wait(_Atomic uint32_t *word, uint32_t expect, uint64_t timeout_ns);
void fc_futex_wake(_Atomic uint32_t *word);

#endif /* FAKECUDA_SHARE_H */
