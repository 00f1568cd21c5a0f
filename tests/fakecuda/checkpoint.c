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
 * Measured on an H100, driver 580.159.04 (benchmarks/checkpoint_lock.py),
 * called from another root process with no context; [inferred] marks what
 * was not measured.
 *
 *   Lock(pid, args)    caller: cuInit only (no context needed).
 *     - reserved fields of args not zero            [inferred] INVALID_VALUE
 *     - pid <= 0, or the caller's own pid (could never drain)
 *                                                   [inferred] INVALID_VALUE
 *     - the target's cgroup (v2) is frozen: measured, the real call never
 *       returns for a frozen target (its timeout is not honoured); the fake
 *       waits until it is thawed (polling every FROZEN_POLL_NS), then goes
 *       on below, the timeout counted from there.  A target that dies
 *       meanwhile is a dead pid.  [inferred: this wait comes before the
 *       checks below, also for a process that never initialized CUDA]
 *     - no such process (or a zombie)                       OPERATING_SYSTEM
 *     - a live process that never initialized CUDA (no record: never
 *       called cuInit, e.g. `sleep`, or Python that imported torch only)
 *                                                            NOT_INITIALIZED
 *     - an MPS client (its cuInit mapped a modelled MPS server file, fault.c;
 *       measured with a real MPS daemon), at once              NOT_SUPPORTED
 *     - target not RUNNING (locked, or a lock in progress)
 *                                                   [inferred] ILLEGAL_STATE
 *     - else the target is marked LOCKING: its calls that start block.  The
 *       call returns CUDA_SUCCESS (target LOCKED) once (a) no call of the
 *       target is between entry and return (a synchronize counts until its
 *       wait ends and it returns) and (b) all work it enqueued has ended on
 *       the simulated timeline (its record's last_end <= now).  Measured:
 *       0.13 ms p50 for an idle process; over ~950 ms of queued GEMMs it
 *       returned 0.5 ms after the last one ended; during a cuCtxSynchronize
 *       of the target it succeeded once the work ended; the target's further
 *       calls blocked for exactly as long as it was held.
 *     - args->timeoutMs > 0 and (a)+(b) not met in time: the target is
 *       RUNNING again (blocked calls resume)                       NOT_READY
 *       (measured: 200 ms over 2 s of queued work returned after 200.5 ms,
 *       target RUNNING).  timeoutMs == 0 (or args NULL): no limit.
 *     - the target dies while being locked        [inferred] OPERATING_SYSTEM
 *   Unlock(pid, args)
 *     - reserved args not zero                      [inferred] INVALID_VALUE
 *     - the target's cgroup is frozen: as for Lock, the fake waits until it
 *       is thawed (measured: no return in 8 s for a frozen locked process)
 *     - no live record (dead, never initialized)    [inferred] INVALID_VALUE
 *     - target not LOCKED (also an MPS client)      [inferred] ILLEGAL_STATE
 *     - else RUNNING, its blocked calls wake (measured 0.10 ms p50)  SUCCESS
 *   GetState(pid, *state)                          [inferred; no frozen wait]
 *     - state NULL or no live record                           INVALID_VALUE
 *     - LOCKED once a Lock returned, else RUNNING (also while a Lock drains)
 *   A locked process can be frozen (measured 0.19 ms), thawed, then unlocked.
 *   A lock outlives its locker (the target stays LOCKED until unlocked);
 *   a locker that dies while draining leaves the target RUNNING (its blocked
 *   calls notice within POLL_NS).  A locked target that dies leaks nothing:
 *   its record is reclaimed like any dead process's (memshare.c).
 * -------------------------------------------------------------------------
 */
#include "share.h"

#include <errno.h>
#include <fcntl.h>
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

#define CK_UNKNOWN_PID CUDA_ERROR_INVALID_VALUE  /* unlock, state: no live record for pid */
#define CK_NO_PROCESS CUDA_ERROR_OPERATING_SYSTEM /* lock: no such process */
#define CK_NO_CUDA CUDA_ERROR_NOT_INITIALIZED    /* lock: a live process without CUDA */
#define CK_MPS_CLIENT CUDA_ERROR_NOT_SUPPORTED   /* lock of an MPS client */
#define CK_BAD_PID CUDA_ERROR_INVALID_VALUE      /* lock: pid <= 0 or the caller's own */
#define CK_BAD_ARGS CUDA_ERROR_INVALID_VALUE     /* reserved fields not zero */
#define CK_NOT_RUNNING CUDA_ERROR_ILLEGAL_STATE  /* lock of a locked process */
#define CK_NOT_LOCKED CUDA_ERROR_ILLEGAL_STATE   /* unlock of a running process */
#define CK_TIMED_OUT CUDA_ERROR_NOT_READY        /* timeoutMs passed */
#define CK_GONE CK_NO_PROCESS                    /* target died while being locked */
#define POLL_NS 20000000ull                      /* liveness checks while waiting: 20 ms */
#define FROZEN_POLL_NS 1000000ull                /* frozen-cgroup checks while waiting: 1 ms */

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
    if (atomic_load_explicit(&s->pid, memory_order_relaxed) != (int32_t)fc_self_pid())
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
    /* /proc's number (fc_self_pid): asked of /proc, not kill(2). */
    if (locker <= 0 || fc_proc_alive(locker, 0))
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

/* ---- frozen cgroups ---- */

/* The NUL-terminated contents (at most size - 1 bytes) of a small file;
 * false when it cannot be read. */
static bool read_small(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    if (n < 0)
        return false;
    buf[n] = '\0';
    return true;
}

/* /proc/self/mounts writes space, tab, newline and backslash as \ooo. */
static void unescape_octal(char *s)
{
    char *w = s;
    for (const char *r = s; *r;) {
        if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' &&
            r[3] >= '0' && r[3] <= '7') {
            *w++ = (char)(((r[1] - '0') << 6) | ((r[2] - '0') << 3) | (r[3] - '0'));
            r += 4;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
}

/* The line after the one `l` points into, or NULL after the last. */
static char *next_line(char *l)
{
    char *nl = strchr(l, '\n');
    return nl ? nl + 1 : NULL;
}

static char cg2_mount[PATH_MAX]; /* "" when there is no cgroup2 mount */
static pthread_once_t cg2_once = PTHREAD_ONCE_INIT;

/* The first cgroup2 mount of /proc/self/mounts (on hybrid hosts
 * /sys/fs/cgroup/unified).  Found once: pthread_once orders the write
 * before every reader's return from pthread_once. */
static void find_cgroup2(void)
{
    FILE *f = fopen("/proc/self/mounts", "re");
    if (f == NULL)
        return;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        char *save = NULL;
        (void)strtok_r(line, " ", &save);
        char *dir = strtok_r(NULL, " ", &save), *type = strtok_r(NULL, " ", &save);
        if (dir && type && strcmp(type, "cgroup2") == 0) {
            unescape_octal(dir);
            if (strlen(dir) < sizeof cg2_mount)
                memcpy(cg2_mount, dir, strlen(dir) + 1);
            break;
        }
    }
    free(line);
    fclose(f);
}

/* Does the cgroup (v2) of process `pid` report "frozen 1" in its
 * cgroup.events?  False also when that cannot be read (no such process, no
 * cgroup2 mount, a cgroup outside this mount). */
static bool cgroup_frozen(pid_t pid)
{
    (void)pthread_once(&cg2_once, find_cgroup2);
    if (cg2_mount[0] == '\0')
        return false;
    char path[PATH_MAX + 64], buf[8192];
    snprintf(path, sizeof path, "/proc/%ld/cgroup", (long)pid);
    if (!read_small(path, buf, sizeof buf))
        return false;
    char *cg = NULL;
    for (char *l = buf; l != NULL && *l; l = next_line(l))
        if (strncmp(l, "0::", 3) == 0) {
            cg = l + 3;
            break;
        }
    if (cg == NULL)
        return false;
    cg[strcspn(cg, "\n")] = '\0';
    if ((size_t)snprintf(path, sizeof path, "%s%s/cgroup.events", cg2_mount, cg) >= sizeof path ||
        !read_small(path, buf, sizeof buf))
        return false;
    for (char *l = buf; l != NULL && *l; l = next_line(l))
        if (strncmp(l, "frozen 1", 8) == 0 && (l[8] == '\n' || l[8] == '\0'))
            return true;
    return false;
}

/* Measured: the real call never returns for a frozen target (nor honours a
 * timeout); the fake waits until it is thawed, or dead (then the caller
 * finds a dead pid).  Polled every FROZEN_POLL_NS, no timeout. */
static void wait_thawed(pid_t pid)
{
    if (!cgroup_frozen(pid))
        return;
    uint64_t start = fc_proc_start_time(pid); /* a pid reused meanwhile is another process */
    while (cgroup_frozen(pid) && fc_proc_alive(pid, start))
        fc_sleep_until(fc_now_ns() + FROZEN_POLL_NS);
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

/* Who takes a lock: the calling thread (one process may lock from many
 * threads at once, as krexd does), by /proc's number; the process's number
 * when it lives in another pid namespace (its thread ids are not /proc's). */
static int32_t locker_id(void)
{
    pid_t self = fc_self_pid();
    return self == getpid() ? (int32_t)syscall(SYS_gettid) : (int32_t)self;
}

/* Give a lock taken on a record back (LOCKING -> RUNNING, waking its
 * blocked calls) if this process took it: the record's process died and
 * the record may now be another process's, which must not stay blocked. */
static void undo_locking(struct proc_slot *t)
{
    /* Relaxed: the CAS below decides; a freed record has locker 0 and RUNNING. */
    if (atomic_load_explicit(&t->locker, memory_order_relaxed) != locker_id())
        return;
    atomic_store_explicit(&t->locker, 0, memory_order_relaxed);
    uint32_t expect = FC_LK_LOCKING;
    /* seq_cst: a state change the blocked calls read (acquire) before they run. */
    if (atomic_compare_exchange_strong_explicit(&t->lock, &expect, FC_LK_RUNNING,
                                                memory_order_seq_cst, memory_order_relaxed))
        fc_futex_wake(&t->lock);
}

/* Test-only: KREX_FAKE_LOCK_PAUSE_MS holds each lock between finding the
 * target's record and taking its lock word (a race window made wide). */
static void test_pause(void)
{
    const char *ms = getenv("KREX_FAKE_LOCK_PAUSE_MS");
    if (ms && *ms) {
        uint64_t ns = strtoull(ms, NULL, 10) * 1000000ull;
        fc_sleep_until(fc_now_ns() + ns);
    }
}

FC_API CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)
{
    FC_ENTRY();
    CUresult r = fc_check_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (args && (args->reserved0 || !zeroed(args->reserved1, sizeof args->reserved1)))
        return CK_BAD_ARGS;
    if (pid <= 0 || pid == fc_self_pid())
        return CK_BAD_PID;
    wait_thawed(pid);
    struct proc_slot *t = fc_share_find(pid);
    if (t == NULL)
        return fc_proc_alive(pid, 0) ? CK_NO_CUDA : CK_NO_PROCESS;
    /* Relaxed: a status bit set at the target's cuInit; nothing is read through it. */
    if (atomic_load_explicit(&t->flags, memory_order_relaxed) & FC_REC_MPS)
        return CK_MPS_CLIENT;
    uint64_t start = atomic_load_explicit(&t->start_time, memory_order_relaxed);
    test_pause();
    uint32_t expect = FC_LK_RUNNING;
    /* seq_cst: the Dekker pairing with fc_gate_enter (see there). */
    if (!atomic_compare_exchange_strong_explicit(&t->lock, &expect, FC_LK_LOCKING,
                                                 memory_order_seq_cst, memory_order_relaxed))
        return same_target(t, pid, start) ? CK_NOT_RUNNING : CK_GONE;
    /* Relaxed: read only as a liveness hint by recover_dead_locker, and by
     * undo_locking (this thread's own store: another thread of the caller may
     * be locking the record's next owner). */
    atomic_store_explicit(&t->locker, locker_id(), memory_order_relaxed);
    uint64_t timeout_ns = args ? (uint64_t)args->timeoutMs * 1000000ull : 0;
    /* drain() checks the target first: a record that changed hands since the
     * find (its process died, a new one claimed it) answers CK_GONE, and the
     * lock word taken is the new owner's, given back here.  (The real driver
     * locks a process, not a record: nothing there can change hands.) */
    r = drain(t, pid, start, timeout_ns ? fc_now_ns() + timeout_ns : 0);
    if (r == CK_GONE) {
        undo_locking(t);
        return r;
    }
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
    if (pid > 0)
        wait_thawed(pid);
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
