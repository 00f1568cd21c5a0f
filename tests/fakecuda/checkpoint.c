/*
 * checkpoint.c — the driver's checkpoint lock across processes
 * (cuCheckpointProcessLock / Unlock / GetState) and the entry check every
 * exported function makes (FC_ENTRY, fakecuda.h).
 *
 * The lock state is a word of the target's process record in the shared
 * state file (share.h), so the lock reaches every copy of the driver the
 * target has loaded.  Each driver call of a process counts itself in its
 * record's `inflight` from entry to return; a call that starts while the
 * process is locked (or being locked) sleeps on a futex on the `lock` word
 * until it is RUNNING again.  Nested calls (an entry point calling another)
 * are counted once, by the outermost.
 *
 * ---- The modelled semantics: adjust here when the real driver differs ----
 * (NVIDIA's documentation of the calls; to be confirmed on an H200 by
 * benchmarks/checkpoint_lock.py.)
 *
 *   Lock(pid, args)    caller: cuInit only (no context needed).
 *     - pid with no live record (never called cuInit, gone)   INVALID_VALUE
 *     - pid == the caller's own pid (could never drain)       INVALID_VALUE
 *     - reserved fields of args not zero                      INVALID_VALUE
 *     - target not RUNNING (locked, or a lock in progress)    ILLEGAL_STATE
 *     - else the target is marked LOCKING: its calls that start block.  The
 *       call returns CUDA_SUCCESS (target LOCKED) once (a) no call of the
 *       target is between entry and return (a synchronize counts until its
 *       wait ends and it returns) and (b) all work it enqueued has ended on
 *       the simulated timeline (its record's last_end <= now).
 *     - args->timeoutMs > 0 and (a)+(b) not met in time: the target is
 *       RUNNING again (blocked calls resume)                   TIMEOUT
 *       timeoutMs == 0 (or args NULL): no limit.
 *     - the target dies while being locked                     INVALID_VALUE
 *   Unlock(pid, args)
 *     - no live record / reserved args not zero                INVALID_VALUE
 *     - target not LOCKED                                      ILLEGAL_STATE
 *     - else RUNNING, its blocked calls wake                   SUCCESS
 *   GetState(pid, *state)
 *     - state NULL or no live record                           INVALID_VALUE
 *     - LOCKED once a Lock returned, else RUNNING (also while a Lock drains)
 *   A lock outlives its locker (the target stays LOCKED until unlocked);
 *   a locker that dies while draining leaves the target RUNNING (its blocked
 *   calls notice within POLL_NS).  A locked target that dies leaks nothing:
 *   its record is reclaimed like any dead process's (memshare.c).
 * -------------------------------------------------------------------------
 */
#include "share.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define CK_UNKNOWN_PID CUDA_ERROR_INVALID_VALUE /* no live record for pid */
#define CK_SELF CUDA_ERROR_INVALID_VALUE        /* a process locking itself */
#define CK_BAD_ARGS CUDA_ERROR_INVALID_VALUE    /* reserved fields not zero */
#define CK_NOT_RUNNING CUDA_ERROR_ILLEGAL_STATE /* lock of a locked process */
#define CK_NOT_LOCKED CUDA_ERROR_ILLEGAL_STATE  /* unlock of a running process */
#define CK_TIMED_OUT CUDA_ERROR_TIMEOUT         /* timeoutMs passed */
#define CK_GONE CUDA_ERROR_INVALID_VALUE        /* target died while being locked */
#define POLL_NS 20000000ull                     /* liveness checks while waiting: 20 ms */

void fc_futex_wait(_Atomic uint32_t *word, uint32_t expect, uint64_t timeout_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(timeout_ns / 1000000000ull),
                          .tv_nsec = (long)(timeout_ns % 1000000000ull)};
    /* Shared futex (no FUTEX_PRIVATE_FLAG): the word is in a MAP_SHARED file.
     * EAGAIN (the word changed), EINTR and ETIMEDOUT all mean: look again. */
    (void)syscall(SYS_futex, (void *)word, FUTEX_WAIT, expect, &ts, NULL, 0);
}

void fc_futex_wake(_Atomic uint32_t *word)
{
    (void)syscall(SYS_futex, (void *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* ---- the entry check ---- */

static _Thread_local unsigned call_depth; /* driver calls of this thread, nested */

/* A call of the process ends: if a lock waits for the calls to drain and
 * this was the last one, wake the locker. */
static void call_end(struct proc_slot *s)
{
    /* The record may have been freed at exit by another thread (then it is
     * no longer ours and must not be touched). */
    if (atomic_load_explicit(&s->pid, memory_order_relaxed) != (int32_t)getpid())
        return;
    /* seq_cst decrement and load: if the locker read `inflight` before this
     * decrement, its CAS of `lock` precedes it in the single total order and
     * this load sees the lock, so the locker is woken (no lost wake-up).
     * The decrement also releases this call's last_end update to the locker. */
    if (atomic_fetch_sub_explicit(&s->inflight, 1, memory_order_seq_cst) == 1 &&
        atomic_load_explicit(&s->lock, memory_order_seq_cst) != FC_LK_RUNNING)
        fc_futex_wake(&s->inflight);
}

/* A locker that died while draining leaves the process RUNNING again. */
static void recover_dead_locker(struct proc_slot *s)
{
    /* Relaxed: a hint for liveness only; the CAS below decides. */
    int32_t locker = atomic_load_explicit(&s->locker, memory_order_relaxed);
    if (locker <= 0 || kill(locker, 0) == 0 || errno != ESRCH)
        return;
    uint32_t expect = FC_LK_LOCKING;
    if (atomic_compare_exchange_strong_explicit(&s->lock, &expect, FC_LK_RUNNING,
                                                memory_order_seq_cst, memory_order_relaxed))
        fc_futex_wake(&s->lock);
}

void *fc_gate_enter(void)
{
    struct proc_slot *s = fc_share_self();
    if (call_depth++ > 0 || s == NULL)
        return NULL; /* nested (the outer call counts), or no record (before cuInit) */
    for (;;) {
        /* seq_cst increment, then seq_cst load of `lock`; the locker does a
         * seq_cst CAS of `lock`, then a seq_cst load of `inflight` (Dekker):
         * either this call sees the lock, or the locker sees the call. */
        atomic_fetch_add_explicit(&s->inflight, 1, memory_order_seq_cst);
        if (atomic_load_explicit(&s->lock, memory_order_seq_cst) == FC_LK_RUNNING)
            return s;
        call_end(s);
        uint32_t st;
        /* Acquire: pairs with the seq_cst CAS that made the process RUNNING again. */
        while ((st = atomic_load_explicit(&s->lock, memory_order_acquire)) != FC_LK_RUNNING) {
            if (st == FC_LK_LOCKING)
                recover_dead_locker(s);
            fc_futex_wait(&s->lock, st, 5 * POLL_NS);
        }
    }
}

void fc_gate_leave(void **token)
{
    call_depth--;
    if (*token)
        call_end(*token);
}

/* ---- the checkpoint calls ---- */

/* Is the record still that of the process (pid, start time) being locked? */
static bool same_target(struct proc_slot *t, pid_t pid, uint64_t start)
{
    return atomic_load_explicit(&t->pid, memory_order_acquire) == (int32_t)pid &&
           fc_proc_alive(pid, start);
}

/* Wait for (a) no call of the target in progress and (b) its enqueued work
 * ended; `deadline` 0: no limit. */
static CUresult drain(struct proc_slot *t, pid_t pid, uint64_t start, uint64_t deadline)
{
    for (;;) {
        if (!same_target(t, pid, start))
            return CK_GONE;
        /* seq_cst: the locker's half of the Dekker pairing (fc_gate_enter),
         * and it acquires the calls' last_end updates released by call_end. */
        uint32_t calls = atomic_load_explicit(&t->inflight, memory_order_seq_cst);
        uint64_t now = fc_now_ns(), wait = POLL_NS;
        if (calls == 0) {
            /* Relaxed: ordered by the seq_cst load above (no call runs now). */
            uint64_t end = atomic_load_explicit(&t->last_end, memory_order_relaxed);
            if (end <= now)
                return CUDA_SUCCESS;
            wait = end - now < wait ? end - now : wait;
        }
        if (deadline && now >= deadline)
            return CK_TIMED_OUT;
        if (deadline && deadline - now < wait)
            wait = deadline - now;
        if (calls)
            fc_futex_wait(&t->inflight, calls, wait);
        else
            fc_sleep_until(now + wait);
    }
}

static bool zeroed(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return false;
    return true;
}

FC_API CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (args && (args->reserved0 || !zeroed(args->reserved1, sizeof args->reserved1)))
        return CK_BAD_ARGS;
    if (pid == getpid())
        return CK_SELF;
    struct proc_slot *t = fc_share_find(pid);
    if (t == NULL)
        return CK_UNKNOWN_PID;
    uint64_t start = atomic_load_explicit(&t->start_time, memory_order_relaxed);
    uint32_t expect = FC_LK_RUNNING;
    /* seq_cst: the Dekker pairing with fc_gate_enter (see there). */
    if (!atomic_compare_exchange_strong_explicit(&t->lock, &expect, FC_LK_LOCKING,
                                                 memory_order_seq_cst, memory_order_relaxed))
        return CK_NOT_RUNNING;
    /* Relaxed: read only as a liveness hint by recover_dead_locker. */
    atomic_store_explicit(&t->locker, (int32_t)getpid(), memory_order_relaxed);
    uint64_t timeout_ns = args ? (uint64_t)args->timeoutMs * 1000000ull : 0;
    r = drain(t, pid, start, timeout_ns ? fc_now_ns() + timeout_ns : 0);
    if (r == CK_GONE)
        return r; /* the record is reclaimed with the dead process */
    atomic_store_explicit(&t->locker, 0, memory_order_relaxed);
    expect = FC_LK_LOCKING;
    uint32_t to = r == CUDA_SUCCESS ? FC_LK_LOCKED : FC_LK_RUNNING;
    /* seq_cst: a state change the target's calls read (acquire) before they run. */
    if (!atomic_compare_exchange_strong_explicit(&t->lock, &expect, to, memory_order_seq_cst,
                                                 memory_order_relaxed))
        return CK_NOT_RUNNING; /* taken back meanwhile (we were thought dead) */
    if (to == FC_LK_RUNNING)
        fc_futex_wake(&t->lock);
    return r;
}

FC_API CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (args && !zeroed(args->reserved, sizeof args->reserved))
        return CK_BAD_ARGS;
    struct proc_slot *t = fc_share_find(pid);
    if (t == NULL)
        return CK_UNKNOWN_PID;
    uint32_t expect = FC_LK_LOCKED;
    /* seq_cst: the blocked calls' acquire loads see RUNNING after the wake. */
    if (!atomic_compare_exchange_strong_explicit(&t->lock, &expect, FC_LK_RUNNING,
                                                 memory_order_seq_cst, memory_order_relaxed))
        return CK_NOT_LOCKED;
    fc_futex_wake(&t->lock);
    return CUDA_SUCCESS;
}

FC_API CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (state == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct proc_slot *t = fc_share_find(pid);
    if (t == NULL)
        return CK_UNKNOWN_PID;
    /* Relaxed: a snapshot of a state that may change right after anyway. */
    uint32_t st = atomic_load_explicit(&t->lock, memory_order_relaxed);
    *state = st == FC_LK_LOCKED ? CU_PROCESS_STATE_LOCKED : CU_PROCESS_STATE_RUNNING;
    return CUDA_SUCCESS;
}
