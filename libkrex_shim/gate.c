/*
 * gate.c — the gate protocol, both sides (paper §4.2; krex_gate.h).
 *
 * Built into libkrex_shim.so (tenant side, symbols hidden) and alone into
 * libkrex_gate.so (krexd loads it through ctypes; symbols exported).
 *
 * Memory orders.  Every access to the two words of the Dekker pairing —
 * the gate `word` and each slot's `inflight` — and to slot `state` is
 * seq_cst, so all of them lie in one total order S:
 *
 *   submitter:   inflight += 1 ; read word          (increment, then check)
 *   coordinator: CAS word      ; read state/acks    (close, then read)
 *   drainer:     read word     ; read inflight == 0 (capture epoch, drain)
 *
 * If the drainer's read of `inflight` (after the close in S) misses a
 * submitter's increment, that increment is later in S, so the submitter's
 * read of `word` comes after the close and sees the gate closed: a racing
 * submission is either drained or blocked before it reaches the driver.
 * The same pairing (owner = ACTIVE ; read word) serializes registration
 * with closure.  An EXITING slot needs no acknowledgement: each of its
 * calls synchronizes before its decrement, so a zero read after the close
 * means none of its work is queued (see "exiting process" below).
 * docs/design/shim.md gives the argument in full.
 * Statistics use relaxed orders: nothing is ordered by them.
 *
 * Slot ownership.  A slot's state, generation and owner pid are one word
 * (krex_slot.owner) and every transition is a seq_cst compare-and-swap
 * from the exact word the caller judged: "this owner is dead", "this
 * owner has pid P".  Any transition in between changes the generation, so
 * the CAS fails and the judgement is dropped instead of being applied to
 * a later owner.  Only the winner of a transition acts on it (frees the
 * slot), and it frees by CAS from the DEAD word it made itself, so a
 * reopen that freed the slot first, and whoever claimed it next, are left
 * alone.
 */
#define _GNU_SOURCE
#include "krex_gate.h"
#include "testhook.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifdef KREX_GATE_EXPORT
#define KREX_GATE_API __attribute__((visibility("default")))
#else
#define KREX_GATE_API __attribute__((visibility("hidden")))
#endif

_Static_assert(sizeof(_Atomic uint32_t) == sizeof(uint32_t), "futex word is 32 bits");
_Static_assert(sizeof(_Atomic uint64_t) == sizeof(uint64_t), "word is 64 bits");

/* Iterations of the drainer's busy phase before parking (a few tens of
 * µs), and how long the coordinator scans before parking (ns). */
#define SPIN_ITERS 2000
#define COORD_SPIN_NS 50000LL
/* While the coordinator waits it re-checks liveness of pending slots this
 * often (ns): a dead sibling never bumps ack_seq. */
#define LIVENESS_PERIOD_NS 5000000LL

/* ---- small utilities --------------------------------------------------- */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The gate lives in a MAP_SHARED file mapping used by several processes,
 * so the futex operations are the shared (non-PRIVATE) kind. */
static int futex_wait(_Atomic uint32_t *addr, uint32_t expected, int64_t timeout_ns)
{
    struct timespec ts, *tsp = NULL;
    if (timeout_ns >= 0) {
        ts.tv_sec = (time_t)(timeout_ns / 1000000000LL);
        ts.tv_nsec = (long)(timeout_ns % 1000000000LL);
        tsp = &ts;
    }
    long r = syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, expected, tsp, NULL, 0);
    return r == 0 ? 0 : -errno;
}

static void futex_wake_all(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Process start time (clock ticks since boot, /proc/<pid>/stat field 22)
 * and whether it is a zombie.  -ENOENT when the process is gone. */
static int proc_stat(int32_t pid, uint64_t *start_ticks, int *zombie)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -ENOENT;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -ENOENT;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    if (!p || p[1] != ' ')
        return -EINVAL;
    p += 2;
    *zombie = (*p == 'Z' || *p == 'X');
    /* p points at field 3 (state); field 22 is 19 spaces further. */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return -EINVAL;
        p++;
    }
    *start_ticks = strtoull(p, NULL, 10);
    return 0;
}

/* A slot's process is gone, a zombie (its contexts are torn down), or its
 * pid now names another process (start time differs; 0: not checked).  A
 * pid that is not positive names no process: garbage, hence dead (a
 * registrant's pid is in the ownership word from its claim on). */
static int process_dead(int32_t pid, uint64_t start_ticks)
{
    int saved = errno, dead = 0;
    if (pid <= 0) {
        dead = 1;
    } else if (kill(pid, 0) != 0 && errno == ESRCH) {
        dead = 1;
    } else {
        uint64_t ticks = 0;
        int zombie = 0;
        int r = proc_stat(pid, &ticks, &zombie);
        if (r == -ENOENT)
            dead = 1;
        else if (r == 0)
            dead = zombie || (start_ticks != 0 && ticks != start_ticks);
    }
    errno = saved;
    return dead;
}

/* The ownership word (seq_cst: it is the slot's half of the pairing of
 * registration with closure, and every transition reads it fresh). */
static inline uint64_t owner_load(struct krex_slot *s)
{
    return atomic_load_explicit(&s->owner, memory_order_seq_cst);
}

/* One ownership transition from the word `o` the caller judged to
 * (state, pid) of the next generation; 1 for the winner.  seq_cst CAS:
 * also releases the fields the caller wrote before it (a claimer's) and
 * acquires those of the previous owner. */
static int owner_cas(struct krex_slot *s, uint64_t o, uint32_t state, int32_t pid)
{
    return atomic_compare_exchange_strong_explicit(&s->owner, &o,
                                                   krex_owner_next(o, state, pid),
                                                   memory_order_seq_cst, memory_order_seq_cst);
}

/* A slot state whose owner is a live registrant (drained, reclaimed when
 * it dies). */
static inline int owner_registered(uint32_t st)
{
    return st == KREX_SLOT_ACTIVE || st == KREX_SLOT_EXITING;
}

/* Is the owner that `o` names gone?  ACTIVE/EXITING: pid and start time; CLAIMING:
 * pid only (this owner may not have written start_ticks yet, and what is
 * there is the previous owner's).  The relaxed read of start_ticks is
 * ordered by the seq_cst load of `o` (acquire) after the claimer's write;
 * if a later owner rewrote it meanwhile, the caller's CAS on `o` fails. */
static int owner_dead(struct krex_slot *s, uint64_t o)
{
    uint64_t ticks = owner_registered(krex_owner_state(o))
                         ? atomic_load_explicit(&s->start_ticks, memory_order_relaxed)
                         : 0;
    return process_dead(krex_owner_pid(o), ticks);
}

/* Retire the ownership `o` (CLAIMING, ACTIVE or EXITING) whose process is dead or
 * has left: DEAD, then FREE if the gate is open (paper §4.2: "registration
 * entries for the processes being drained cannot be reassigned to
 * replacement processes until the region ends", so while it is closed the
 * reopen frees it).  Returns 1 for the winner of the DEAD transition; a
 * loser (the slot changed hands since `o` was read) does nothing. */
static int slot_retire(struct krex_gate *g, struct krex_slot *s, uint64_t o)
{
    if (!owner_cas(s, o, KREX_SLOT_DEAD, krex_owner_pid(o)))
        return 0;
    KREX_TEST_POINT("reclaim_marked");
    /* seq_cst: ordered after the DEAD CAS, so a close that we miss here
     * sees the slot DEAD (and skips it) in its own scan.  The free is a
     * CAS from our own DEAD word: it fails if the reopen freed it first. */
    if (atomic_load_explicit(&g->word, memory_order_seq_cst) == 0)
        owner_cas(s, krex_owner_next(o, KREX_SLOT_DEAD, krex_owner_pid(o)), KREX_SLOT_FREE, 0);
    return 1;
}

/* Wake the coordinator: seq_cst RMW after the caller's stores, so a
 * coordinator that reads the new ack_seq also sees them; its futex wait
 * on the old value then returns at once. */
static void bump_ack_seq(struct krex_gate *g)
{
    atomic_fetch_add_explicit(&g->ack_seq, 1, memory_order_seq_cst);
    futex_wake_all(&g->ack_seq);
}

/* Wake a drainer parked in krex_gate_wait_idle: clear the waiter bit, then
 * wake.  seq_cst so the drainer's re-read (seq_cst) sees the cleared bit
 * or the futex value check fails and it does not sleep. */
static void wake_idle(struct krex_slot *s)
{
    atomic_fetch_and_explicit(&s->inflight, ~KREX_INFLIGHT_WAITER, memory_order_seq_cst);
    futex_wake_all(&s->inflight);
}

/* Undo an increment that met a closed gate (`w`).  The decrement is
 * seq_cst like the increment.  If it brings the count to zero it wakes a
 * drainer waiting for zero and, when this slot already acknowledged the
 * epoch or is EXITING (drained at zero, no acknowledgement), the
 * coordinator, which may have seen the transient 1. */
static void retract(struct krex_gate *g, struct krex_slot *s, uint64_t w)
{
    uint32_t prev = atomic_fetch_sub_explicit(&s->inflight, 1, memory_order_seq_cst);
    if ((prev & KREX_INFLIGHT_COUNT) != 1)
        return;
    if (prev & KREX_INFLIGHT_WAITER)
        wake_idle(s);
    if (atomic_load_explicit(&s->ack_epoch, memory_order_seq_cst) == krex_gate_epoch(w) ||
        krex_owner_state(owner_load(s)) == KREX_SLOT_EXITING)
        bump_ack_seq(g);
}

static inline int admits(uint64_t w, uint32_t tenant)
{
    return w == 0 || krex_gate_holder(w) == tenant;
}

/* ---- both sides ---------------------------------------------------------- */

KREX_GATE_API uint32_t krex_gate_abi_version(void) { return KREX_GATE_VERSION; }

static struct krex_gate *map_fd(int fd)
{
    void *p = mmap(NULL, sizeof(struct krex_gate), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : (struct krex_gate *)p;
}

static struct krex_gate *gate_create(const char *path, uint32_t gpu, uint32_t nslots,
                                     uint32_t mode)
{
    char tmp[4096];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    if (n < 0 || (size_t)n >= sizeof tmp) {
        errno = ENAMETOOLONG;
        return NULL;
    }
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return NULL;
    struct krex_gate *g = NULL;
    /* fchmod: the requested mode exactly, whatever the umask. */
    if (fchmod(fd, (mode_t)mode) != 0 || ftruncate(fd, sizeof(struct krex_gate)) != 0 ||
        !(g = map_fd(fd)))
        goto fail;
    /* The file is zero-filled (open gate, FREE slots); only the header is
     * written, before the rename makes the file visible to anyone. */
    g->version = KREX_GATE_VERSION;
    g->nslots = nslots;
    g->gpu = gpu;
    g->magic = KREX_GATE_MAGIC;
    if (rename(tmp, path) != 0)
        goto fail;
    close(fd);
    return g;
fail: {
    int saved = errno;
    if (g)
        munmap(g, sizeof *g);
    unlink(tmp);
    close(fd);
    errno = saved;
    return NULL;
}
}

static struct krex_gate *gate_attach(const char *path)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    struct krex_gate *g = NULL;
    if (fstat(fd, &st) != 0)
        goto fail;
    if (st.st_size < (off_t)sizeof(struct krex_gate)) {
        errno = EPROTO;
        goto fail;
    }
    if (!(g = map_fd(fd)))
        goto fail;
    if (g->magic != KREX_GATE_MAGIC || g->version != KREX_GATE_VERSION) {
        errno = EPROTO;
        goto fail;
    }
    if (g->nslots == 0 || g->nslots > KREX_GATE_MAX_SLOTS) {
        errno = EINVAL;
        goto fail;
    }
    close(fd);
    return g;
fail: {
    int saved = errno;
    if (g)
        munmap(g, sizeof *g);
    close(fd);
    errno = saved;
    return NULL;
}
}

KREX_GATE_API struct krex_gate *krex_gate_open(const char *path, int create, uint32_t gpu,
                                               uint32_t nslots, uint32_t mode)
{
    if (!path) {
        errno = EINVAL;
        return NULL;
    }
    if (create) {
        if (nslots == 0 || nslots > KREX_GATE_MAX_SLOTS || (mode & ~07777u)) {
            errno = EINVAL;
            return NULL;
        }
        return gate_create(path, gpu, nslots, mode);
    }
    return gate_attach(path);
}

KREX_GATE_API void krex_gate_unmap(struct krex_gate *g)
{
    if (g)
        munmap(g, sizeof *g);
}

KREX_GATE_API uint64_t krex_gate_load_word(const struct krex_gate *g)
{
    /* seq_cst like every other access to the word (status reads only). */
    return atomic_load_explicit(&((struct krex_gate *)g)->word, memory_order_seq_cst);
}

KREX_GATE_API int krex_gate_slot_info(const struct krex_gate *g, uint32_t i,
                                      struct krex_slot_info *out)
{
    if (!g || !out || i >= g->nslots)
        return -EINVAL;
    struct krex_slot *s = (struct krex_slot *)&g->slots[i];
    /* A status snapshot: relaxed reads, fields may be mutually stale. */
    uint64_t o = atomic_load_explicit(&s->owner, memory_order_relaxed);
    out->state = krex_owner_state(o);
    out->pid = krex_owner_pid(o);
    out->generation = krex_owner_gen(o);
    out->fault = atomic_load_explicit(&s->fault, memory_order_relaxed); /* a status hint */
    out->inflight = atomic_load_explicit(&s->inflight, memory_order_relaxed) &
                    KREX_INFLIGHT_COUNT;
    out->ack_epoch = atomic_load_explicit(&s->ack_epoch, memory_order_relaxed);
    out->tenant = atomic_load_explicit(&s->tenant, memory_order_relaxed);
    out->captures = atomic_load_explicit(&s->captures, memory_order_relaxed);
    out->gated_calls = atomic_load_explicit(&s->gated_calls, memory_order_relaxed);
    out->blocked_calls = atomic_load_explicit(&s->blocked_calls, memory_order_relaxed);
    out->last_drain_ns = atomic_load_explicit(&s->last_drain_ns, memory_order_relaxed);
    out->start_ticks = atomic_load_explicit(&s->start_ticks, memory_order_relaxed);
    /* Relaxed too: each word is one aligned 32-bit load (never torn), and
     * krexd only sums and compares counts that its next read refreshes. */
    out->mem_mib = atomic_load_explicit(&s->mem_mib, memory_order_relaxed);
    uint32_t oom = atomic_load_explicit(&s->oom, memory_order_relaxed);
    out->oom_waited = (oom >> KREX_OOM_WAITED_SHIFT) & KREX_OOM_WAITED_MAX;
    out->oom_failed = (oom >> KREX_OOM_FAILED_SHIFT) & KREX_OOM_FAILED_MAX;
    out->oom_own = (oom >> KREX_OOM_OWN_SHIFT) & KREX_OOM_OWN_MAX;
    out->oom_last = (oom >> KREX_OOM_LAST_SHIFT) & KREX_OOM_LAST_MAX;
    out->oom_waiting = (oom & KREX_OOM_WAITING) != 0;
    return 0;
}

KREX_GATE_API int krex_gate_slots_info(const struct krex_gate *g, struct krex_slot_info *out,
                                       uint32_t n)
{
    if (!g || !out)
        return -EINVAL;
    uint32_t count = g->nslots < n ? g->nslots : n;
    for (uint32_t i = 0; i < count; i++)
        krex_gate_slot_info(g, i, &out[i]);
    return (int)count;
}

KREX_GATE_API int krex_gate_file_version(const char *path, uint32_t *version)
{
    if (!path || !version)
        return -EINVAL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    /* magic and version: the first 12 bytes of every version's header. */
    unsigned char head[12];
    ssize_t n = pread(fd, head, sizeof head, 0);
    int saved = errno;
    close(fd);
    if (n < 0)
        return -saved;
    uint64_t magic;
    if ((size_t)n < sizeof head || (memcpy(&magic, head, 8), magic != KREX_GATE_MAGIC))
        return -EPROTO;
    memcpy(version, head + 8, 4);
    return 0;
}

/* ---- coordinator side ---------------------------------------------------- */

KREX_GATE_API int krex_gate_close(struct krex_gate *g, uint32_t holder, uint32_t epoch)
{
    if (!g || holder == 0 || epoch == 0)
        return -EINVAL;
    uint64_t expected = 0;
    /* seq_cst CAS: the "close" half of the Dekker pairing; every later
     * read of state/ack/inflight by this thread follows it in S. */
    if (!atomic_compare_exchange_strong_explicit(&g->word, &expected,
                                                 krex_gate_word(holder, epoch),
                                                 memory_order_seq_cst,
                                                 memory_order_seq_cst))
        return -EBUSY;
    /* seq_cst RMW after the CAS: a drainer that reads the new seq reads
     * the closed word (it reads seq before the word; see drain.c). */
    atomic_fetch_add_explicit(&g->seq, 1, memory_order_seq_cst);
    futex_wake_all(&g->seq);
    return 0;
}

/* Is slot `s` (state `st`, ACTIVE or EXITING) drained for `epoch`?  ACTIVE:
 * acknowledged, and nothing in flight.  EXITING: nothing in flight: the
 * owner synchronized before it made the slot EXITING (the caller's seq_cst
 * owner load read that CAS, so the synchronization happened before), and
 * each of its calls since synchronizes before its decrement.  The count is
 * read after the close (seq_cst): a call it misses sees the gate closed. */
static int slot_drained(struct krex_slot *s, uint32_t st, uint32_t epoch)
{
    if (st == KREX_SLOT_ACTIVE &&
        atomic_load_explicit(&s->ack_epoch, memory_order_seq_cst) != epoch)
        return 0;
    return (atomic_load_explicit(&s->inflight, memory_order_seq_cst) & KREX_INFLIGHT_COUNT) == 0;
}

/* Slots still to drain for (holder, epoch); with `check_live`, dead ones
 * are reclaimed instead of listed. */
static uint32_t scan_pending(struct krex_gate *g, uint32_t holder, uint32_t epoch,
                             int check_live, uint32_t *pending)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < g->nslots; i++) {
        struct krex_slot *s = &g->slots[i];
        /* seq_cst: read after our close in S (Dekker with the
         * registrant's ACTIVE CAS then word read).  A CLAIMING slot has
         * not yet published ACTIVE, so its registrant will read the word
         * after our close and block: it needs no drain. */
        uint64_t o = owner_load(s);
        uint32_t st = krex_owner_state(o);
        if (!owner_registered(st))
            continue;
        /* Written before ACTIVE was published; the seq_cst load above
         * acquired them. */
        if (atomic_load_explicit(&s->tenant, memory_order_relaxed) == holder)
            continue; /* the holder's own processes are not drained */
        if (slot_drained(s, st, epoch))
            continue;
        if (check_live && owner_dead(s, o)) {
            KREX_TEST_POINT("scan_judged");
            /* Lost: the slot changed hands since `o`; count it pending
             * and judge the new owner in the next scan. */
            if (slot_retire(g, s, o))
                continue;
        }
        if (pending)
            pending[n] = i;
        n++;
    }
    return n;
}

KREX_GATE_API int krex_gate_wait_drained(struct krex_gate *g, uint32_t holder, uint32_t epoch,
                                         int64_t timeout_ns, uint32_t *pending,
                                         uint32_t *npending)
{
    if (!g || holder == 0 || epoch == 0)
        return -EINVAL;
    int saved = errno;
    const uint64_t w = krex_gate_word(holder, epoch);
    const int64_t start = now_ns();
    const int64_t deadline =
        timeout_ns < 0 || timeout_ns > INT64_MAX - start ? INT64_MAX : start + timeout_ns;
    int64_t next_live = 0; /* when pending slots are next checked for liveness */
    int spinning = 1;
    uint32_t n = 0;
    int rc = 0;
    if (npending)
        *npending = 0;
    for (;;) {
        /* Read ack_seq before scanning (seq_cst): an acknowledgement the
         * scan misses has not bumped ack_seq yet, so the futex wait below
         * on this value returns when it does (no lost wake-up). */
        uint32_t a = atomic_load_explicit(&g->ack_seq, memory_order_seq_cst);
        if (atomic_load_explicit(&g->word, memory_order_seq_cst) != w) {
            rc = -ESTALE;
            break;
        }
        int64_t t = now_ns();
        if (spinning && t - start >= COORD_SPIN_NS)
            spinning = 0;
        int check_live = !spinning && t >= next_live;
        if (check_live)
            next_live = t + LIVENESS_PERIOD_NS;
        n = scan_pending(g, holder, epoch, check_live, pending);
        if (n == 0)
            break;
        if (spinning) {
            cpu_relax();
            continue;
        }
        if (t >= deadline) {
            /* Final scan with liveness, so the list names only the living. */
            n = scan_pending(g, holder, epoch, 1, pending);
            if (n != 0) {
                if (npending)
                    *npending = n;
                rc = -ETIMEDOUT;
            }
            break;
        }
        int64_t slice = deadline - t;
        if (slice > LIVENESS_PERIOD_NS)
            slice = LIVENESS_PERIOD_NS;
        futex_wait(&g->ack_seq, a, slice);
    }
    errno = saved;
    return rc;
}

KREX_GATE_API int krex_gate_reopen(struct krex_gate *g, uint32_t holder, uint32_t epoch)
{
    if (!g || holder == 0 || epoch == 0)
        return -EINVAL;
    uint64_t expected = krex_gate_word(holder, epoch);
    /* seq_cst CAS bound to (holder, epoch): a late recovery fails here. */
    if (!atomic_compare_exchange_strong_explicit(&g->word, &expected, 0,
                                                 memory_order_seq_cst,
                                                 memory_order_seq_cst))
        return -ESTALE;
    /* The region is over: DEAD slots may be reassigned now. */
    for (uint32_t i = 0; i < g->nslots; i++) {
        uint64_t o = owner_load(&g->slots[i]);
        if (krex_owner_state(o) != KREX_SLOT_DEAD)
            continue;
        KREX_TEST_POINT("reopen_judged");
        /* From the DEAD word read: a reclaimer that freed it first makes
         * this CAS fail, and the slot's next owner is left alone. */
        owner_cas(&g->slots[i], o, KREX_SLOT_FREE, 0);
    }
    /* seq_cst RMW after the CAS: a parked submitter read seq before it
     * re-read the word, so either it saw the open word or its futex wait
     * fails on the new seq (or is woken below). */
    atomic_fetch_add_explicit(&g->seq, 1, memory_order_seq_cst);
    futex_wake_all(&g->seq);
    return 0;
}

KREX_GATE_API int krex_gate_reclaim_dead(struct krex_gate *g)
{
    if (!g)
        return -EINVAL;
    int n = 0;
    for (uint32_t i = 0; i < g->nslots; i++) {
        struct krex_slot *s = &g->slots[i];
        uint64_t o = owner_load(s);
        uint32_t st = krex_owner_state(o);
        if (st == KREX_SLOT_DEAD) {
            /* Left DEAD while open (its retirer died before freeing it):
             * seq_cst word read after the owner read, as in slot_retire. */
            if (atomic_load_explicit(&g->word, memory_order_seq_cst) == 0)
                n += owner_cas(s, o, KREX_SLOT_FREE, 0);
            continue;
        }
        if (!owner_registered(st) && st != KREX_SLOT_CLAIMING)
            continue;
        if (owner_dead(s, o)) {
            KREX_TEST_POINT("reclaim_judged");
            n += slot_retire(g, s, o);
        }
    }
    return n;
}

/* ---- tenant side --------------------------------------------------------- */

KREX_GATE_API int krex_gate_try_enter(struct krex_gate *g, struct krex_slot *s,
                                      uint32_t tenant)
{
    /* Increment, then check: both seq_cst (the submitter half of the
     * Dekker pairing; on x86 the RMW is a locked instruction and the load
     * a plain one). */
    atomic_fetch_add_explicit(&s->inflight, 1, memory_order_seq_cst);
    uint64_t w = atomic_load_explicit(&g->word, memory_order_seq_cst);
    if (__builtin_expect(admits(w, tenant), 1)) {
        /* Statistics only: a relaxed load and store, not a locked
         * read-modify-write, so the fast path keeps one locked increment
         * and one locked decrement; threads racing here may lose a count. */
        atomic_store_explicit(&s->gated_calls,
                              atomic_load_explicit(&s->gated_calls, memory_order_relaxed) + 1,
                              memory_order_relaxed);
        return 1;
    }
    retract(g, s, w);
    return 0;
}

static void __attribute__((noinline)) enter_slow(struct krex_gate *g, struct krex_slot *s,
                                                 uint32_t tenant)
{
    int saved = errno;
    atomic_fetch_add_explicit(&s->blocked_calls, 1, memory_order_relaxed);
    for (;;) {
        /* seq before word (both seq_cst): if the word still reads closed,
         * the reopen's seq bump comes later in S, so the futex wait on
         * `seen` cannot miss it. */
        uint32_t seen = atomic_load_explicit(&g->seq, memory_order_seq_cst);
        uint64_t w = atomic_load_explicit(&g->word, memory_order_seq_cst);
        if (admits(w, tenant)) {
            if (krex_gate_try_enter(g, s, tenant))
                break;
            continue;
        }
        /* Parked: no CPU until the gate changes (paper §4.2). */
        futex_wait(&g->seq, seen, -1);
    }
    errno = saved;
}

KREX_GATE_API void krex_gate_enter(struct krex_gate *g, struct krex_slot *s, uint32_t tenant)
{
    if (__builtin_expect(krex_gate_try_enter(g, s, tenant), 1))
        return;
    enter_slow(g, s, tenant);
}

KREX_GATE_API void krex_gate_leave(struct krex_gate *g, struct krex_slot *s)
{
    (void)g;
    /* seq_cst like every RMW on inflight (one total order with the
     * drainer's reads); it also releases the driver call's effects to the
     * drainer that reads zero before synchronizing the contexts. */
    uint32_t prev = atomic_fetch_sub_explicit(&s->inflight, 1, memory_order_seq_cst);
    if (__builtin_expect(prev == (KREX_INFLIGHT_WAITER | 1u), 0))
        wake_idle(s);
}

/* Claim a FREE slot for (tenant, pid): CLAIMING with our pid, fields
 * filled, then ACTIVE with inflight == 1.  Returns its index or -ENOSPC. */
static int claim_slot(struct krex_gate *g, uint32_t tenant, int32_t pid, uint64_t ticks)
{
    for (uint32_t i = 0; i < g->nslots; i++) {
        struct krex_slot *s = &g->slots[i];
        uint64_t o = owner_load(s);
        /* seq_cst CAS: claims the slot exclusively (the pid is in the word
         * from now on, so nobody judges this claim by an older owner). */
        if (krex_owner_state(o) != KREX_SLOT_FREE || !owner_cas(s, o, KREX_SLOT_CLAIMING, pid))
            continue;
        uint64_t claimed = krex_owner_next(o, KREX_SLOT_CLAIMING, pid);
        /* Relaxed: published by the seq_cst ACTIVE CAS below.  Every field
         * of the previous owner is overwritten here (a freed slot keeps
         * them, so that krexd can read the record of a process that
         * ended). */
        atomic_store_explicit(&s->tenant, tenant, memory_order_relaxed);
        atomic_store_explicit(&s->start_ticks, ticks, memory_order_relaxed);
        atomic_store_explicit(&s->ack_epoch, 0, memory_order_relaxed);
        atomic_store_explicit(&s->captures, 0, memory_order_relaxed);
        atomic_store_explicit(&s->gated_calls, 0, memory_order_relaxed);
        atomic_store_explicit(&s->blocked_calls, 0, memory_order_relaxed);
        atomic_store_explicit(&s->last_drain_ns, 0, memory_order_relaxed);
        atomic_store_explicit(&s->mem_mib, 0, memory_order_relaxed);
        atomic_store_explicit(&s->oom, 0, memory_order_relaxed);
        atomic_store_explicit(&s->fault, 0, memory_order_relaxed);
        atomic_store_explicit(&s->inflight, 1, memory_order_seq_cst);
        KREX_TEST_POINT("claim_filled");
        /* Publish (seq_cst CAS): the registration half of the Dekker
         * pairing with close-then-scan; the caller reads the word next.
         * It fails only if our claim was retired meanwhile (judged dead
         * or forgotten by pid): the slot is no longer ours, try another. */
        if (owner_cas(s, claimed, KREX_SLOT_ACTIVE, pid))
            return (int)i;
    }
    return -ENOSPC;
}

KREX_GATE_API int krex_gate_register(struct krex_gate *g, uint32_t tenant, int32_t pid)
{
    if (!g || tenant == 0 || pid <= 0)
        return -EINVAL;
    int saved = errno;
    uint64_t ticks = 0;
    int zombie = 0;
    if (proc_stat(pid, &ticks, &zombie) != 0)
        ticks = 0;
    int idx = claim_slot(g, tenant, pid, ticks);
    /* Full: slots of processes that exited stay ACTIVE until the
     * coordinator or a drain reclaims them.  Reclaim here once. */
    if (idx == -ENOSPC && krex_gate_reclaim_dead(g) > 0)
        idx = claim_slot(g, tenant, pid, ticks);
    if (idx < 0) {
        errno = saved;
        return idx;
    }
    struct krex_slot *s = &g->slots[idx];
    /* Check after publishing (seq_cst). */
    uint64_t w = atomic_load_explicit(&g->word, memory_order_seq_cst);
    if (admits(w, tenant)) {
        atomic_fetch_add_explicit(&s->gated_calls, 1, memory_order_relaxed);
    } else {
        /* Closed by a sibling: this process has no GPU work yet and no
         * drainer, so it answers every closure itself while it is parked
         * here.  Retract first, then ack, so the coordinator never sees
         * the ack with a non-zero count and nothing left to wake it. */
        atomic_fetch_sub_explicit(&s->inflight, 1, memory_order_seq_cst);
        atomic_fetch_add_explicit(&s->blocked_calls, 1, memory_order_relaxed);
        for (;;) {
            /* seq before word, as in enter_slow(). */
            uint32_t seen = atomic_load_explicit(&g->seq, memory_order_seq_cst);
            w = atomic_load_explicit(&g->word, memory_order_seq_cst);
            if (admits(w, tenant)) {
                if (krex_gate_try_enter(g, s, tenant))
                    break;
                continue;
            }
            if (atomic_load_explicit(&s->ack_epoch, memory_order_seq_cst) !=
                krex_gate_epoch(w))
                krex_gate_ack(g, s, krex_gate_epoch(w));
            futex_wait(&g->seq, seen, -1);
        }
    }
    errno = saved;
    return idx;
}

KREX_GATE_API int krex_gate_forget_pid(struct krex_gate *g, int32_t pid)
{
    if (!g || pid <= 0)
        return -EINVAL;
    int n = 0;
    for (uint32_t i = 0; i < g->nslots; i++) {
        struct krex_slot *s = &g->slots[i];
        uint64_t o = owner_load(s);
        uint32_t st = krex_owner_state(o);
        /* The pid is matched in the same word the CAS is made from. */
        if ((owner_registered(st) || st == KREX_SLOT_CLAIMING) && krex_owner_pid(o) == pid) {
            KREX_TEST_POINT("forget_matched");
            n += slot_retire(g, s, o);
        }
    }
    return n;
}

KREX_GATE_API uint32_t krex_gate_wait_seq(struct krex_gate *g, uint32_t seen,
                                          int64_t timeout_ns)
{
    int saved = errno;
    int64_t start = now_ns();
    int64_t deadline =
        timeout_ns < 0 || timeout_ns > INT64_MAX - start ? INT64_MAX : start + timeout_ns;
    uint32_t cur;
    /* seq_cst: the drainer then reads the word, which the close/reopen
     * wrote before bumping seq. */
    while ((cur = atomic_load_explicit(&g->seq, memory_order_seq_cst)) == seen) {
        int64_t left = -1;
        if (timeout_ns >= 0) {
            left = deadline - now_ns();
            if (left <= 0)
                break;
        }
        futex_wait(&g->seq, seen, left);
    }
    errno = saved;
    return cur;
}

KREX_GATE_API void krex_gate_wait_idle(struct krex_slot *s)
{
    int saved = errno;
    /* seq_cst reads: the drainer half of the pairing (after its read of
     * the closed word).  Zero read here means every later increment sees
     * the gate closed. */
    for (int i = 0; i < SPIN_ITERS; i++) {
        if ((atomic_load_explicit(&s->inflight, memory_order_seq_cst) &
             KREX_INFLIGHT_COUNT) == 0)
            goto out;
        cpu_relax();
    }
    for (;;) {
        uint32_t v = atomic_load_explicit(&s->inflight, memory_order_seq_cst);
        if ((v & KREX_INFLIGHT_COUNT) == 0)
            break;
        if (!(v & KREX_INFLIGHT_WAITER)) {
            /* Announce a waiter before parking so that the decrement to
             * zero takes the waking branch; the CAS fails if the count
             * changed meanwhile, and we re-read. */
            if (!atomic_compare_exchange_weak_explicit(&s->inflight, &v,
                                                       v | KREX_INFLIGHT_WAITER,
                                                       memory_order_seq_cst,
                                                       memory_order_seq_cst))
                continue;
            v |= KREX_INFLIGHT_WAITER;
        }
        futex_wait(&s->inflight, v, -1);
    }
out:
    errno = saved;
}

KREX_GATE_API void krex_gate_ack(struct krex_gate *g, struct krex_slot *s, uint32_t epoch)
{
    /* seq_cst store, then the seq_cst ack_seq bump: a coordinator that
     * reads the bumped ack_seq reads this ack in its scan. */
    atomic_store_explicit(&s->ack_epoch, epoch, memory_order_seq_cst);
    bump_ack_seq(g);
}

/* ---- tenant side: an exiting process ------------------------------------- */

KREX_GATE_API int krex_gate_mark_exiting(struct krex_gate *g, struct krex_slot *s,
                                         int32_t pid)
{
    uint64_t o = owner_load(s);
    /* A seq_cst CAS from our own ACTIVE word: it releases the exit
     * synchronization made before it to the coordinator whose seq_cst
     * owner load reads EXITING (scan_pending), and fails if the slot was
     * retired meanwhile (then it is not ours to mark). */
    if (krex_owner_state(o) != KREX_SLOT_ACTIVE || krex_owner_pid(o) != pid ||
        !owner_cas(s, o, KREX_SLOT_EXITING, pid))
        return -ESTALE;
    /* A coordinator waiting for our acknowledgement rescans now. */
    bump_ack_seq(g);
    return 0;
}

KREX_GATE_API void krex_gate_leave_exiting(struct krex_gate *g, struct krex_slot *s)
{
    /* seq_cst like every RMW on inflight; it releases the caller's
     * synchronization to the coordinator that reads zero. */
    uint32_t prev = atomic_fetch_sub_explicit(&s->inflight, 1, memory_order_seq_cst);
    if ((prev & KREX_INFLIGHT_COUNT) != 1)
        return;
    if (prev & KREX_INFLIGHT_WAITER)
        wake_idle(s); /* the stopped drainer may still wait for zero */
    /* At zero an EXITING slot is drained: wake a coordinator that may be
     * waiting.  The word is read after the decrement (both seq_cst): a
     * closure this read misses comes later in S, and its scan reads the
     * count after it, zero. */
    if (atomic_load_explicit(&g->word, memory_order_seq_cst) != 0)
        bump_ack_seq(g);
}
