/*
 * gate.c — the gate protocol, both sides (paper §4.2; krex_gate.h).
 *
 * What both sides share and the tenant's half; krexd's half is coord.c (the
 * gate's creation, attaching slot memories, audit) and coord_protocol.c
 * (close, drain, reopen).  Built into libkrex_shim.so (tenant side, symbols
 * hidden) and, with those two, into libkrex_gate.so (krexd loads it through
 * ctypes; symbols exported).  Why the memory orders make a racing
 * submission either drained or parked: docs/design/shim.md "The per-call
 * protocol and its memory orders"; the slots' ownership word and its
 * transitions: shim.md "Slot ownership".  Statistics use relaxed orders.
 */
#define _GNU_SOURCE
#include "gate_internal.h"
#include "procid.h"
#include "testhook.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <stddef.h>
#include <sys/stat.h>

/* Iterations of the drainer's busy phase before parking (a few tens of
 * µs). */
#define SPIN_ITERS 2000

/* ---- liveness (tenant side: reclaiming the tenant's own slots) --------- */

/* A slot's process is gone, a zombie (its contexts are torn down), or its
 * pid now names another process (start time differs; 0: not checked).  A
 * pid that is not positive names no process: garbage, hence dead. */
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
        /* pid is of the caller's namespace, whatever /proc it has; the
         * time comes normalised, 0 when it cannot be told (procid.c). */
        int r = krex_proc_start(pid, &ticks, &zombie);
        if (r == -ENOENT)
            dead = 1;
        else if (r == 0)
            dead = zombie || (start_ticks != 0 && ticks != 0 && ticks != start_ticks);
    }
    errno = saved;
    return dead;
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

/* Is the owner that `o` names gone?  Judged only for owners of the
 * caller's pid namespace `pidns` (a pid of another namespace means nothing
 * here: 0, never judged).  ACTIVE: pid and start time; CLAIMING: pid only
 * (this owner may not have written start_ticks yet).  The relaxed reads
 * are ordered by the seq_cst load of `o` (acquire) after the claimer's
 * writes; if a later owner rewrote them meanwhile, the caller's CAS on `o`
 * fails. */
static int owner_dead(struct krex_slot *s, uint64_t o, uint64_t pidns)
{
    int active = krex_owner_registered(krex_owner_state(o));
    if (active && atomic_load_explicit(&s->pidns, memory_order_relaxed) != pidns)
        return 0;
    uint64_t ticks = active ? atomic_load_explicit(&s->start_ticks, memory_order_relaxed) : 0;
    return process_dead(krex_owner_pid(o), ticks);
}

/* Retire the ownership `o` (CLAIMING or ACTIVE) whose process is dead or
 * has left: DEAD, then FREE if the gate is open (paper §4.2: "registration
 * entries for the processes being drained cannot be reassigned to
 * replacement processes until the region ends").  Returns 1 for the winner
 * of the DEAD transition; a loser (the slot changed hands since `o` was
 * read) does nothing. */
static int slot_retire(const struct krex_gate *g, struct krex_slot *s, uint64_t o)
{
    if (!owner_cas(s, o, KREX_SLOT_DEAD, krex_owner_pid(o)))
        return 0;
    KREX_TEST_POINT("reclaim_marked");
    /* seq_cst: ordered after the DEAD CAS.  The free is a CAS from our own
     * DEAD word: it fails if another reclaimer freed it first. */
    if (krex_gate_load_word(g) == 0)
        owner_cas(s, krex_owner_next(o, KREX_SLOT_DEAD, krex_owner_pid(o)), KREX_SLOT_FREE, 0);
    return 1;
}

/* Wake a drainer parked in krex_gate_wait_idle: clear the waiter bit, then
 * wake.  seq_cst so the drainer's re-read (seq_cst) sees the cleared bit
 * or the futex value check fails and it does not sleep. */
void krex_gate_wake_idle(struct krex_slot *s)
{
    atomic_fetch_and_explicit(&s->inflight, ~KREX_INFLIGHT_WAITER, memory_order_seq_cst);
    krex_futex_wake_all(&s->inflight);
}

/* Undo an increment that met a closed gate.  The decrement is seq_cst
 * like the increment; if it brings the count to zero it wakes a drainer
 * waiting for zero.  (A coordinator that saw the transient 1 in an
 * acknowledged slot polls it again within COORD_POLL_NS: it cannot wait on
 * this word, which it maps read-only and whose waiter bit is the
 * drainer's.) */
void krex_gate_retract(struct krex_slot *s)
{
    uint32_t prev = atomic_fetch_sub_explicit(&s->inflight, 1, memory_order_seq_cst);
    if ((prev & KREX_INFLIGHT_COUNT) == 1 && (prev & KREX_INFLIGHT_WAITER))
        krex_gate_wake_idle(s);
}

/* ---- both sides ---------------------------------------------------------- */

KREX_GATE_API uint32_t krex_gate_abi_version(void) { return KREX_GATE_VERSION; }

KREX_GATE_API uint64_t krex_gate_load_word(const struct krex_gate *g)
{
    /* seq_cst like every other access to the word. */
    return atomic_load_explicit(&((struct krex_gate *)g)->word, memory_order_seq_cst);
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

void krex_slot_snapshot(const struct krex_slot *cs, uint32_t tenant, uint32_t index,
                        struct krex_slot_info *out)
{
    struct krex_slot *s = (struct krex_slot *)cs;
    uint64_t o = krex_owner_load(s);
    out->state = krex_owner_state(o);
    out->pid = krex_owner_pid(o);
    out->generation = krex_owner_gen(o);
    out->owner = o;
    out->index = index;
    out->tenant = tenant;
    out->ignored = 0;
    out->inflight = atomic_load_explicit(&s->inflight, memory_order_relaxed) &
                    KREX_INFLIGHT_COUNT;
    out->ack_epoch = atomic_load_explicit(&s->ack_epoch, memory_order_relaxed);
    out->claimed_tenant = atomic_load_explicit(&s->tenant, memory_order_relaxed);
    out->captures = atomic_load_explicit(&s->captures, memory_order_relaxed);
    out->gated_calls = atomic_load_explicit(&s->gated_calls, memory_order_relaxed);
    out->blocked_calls = atomic_load_explicit(&s->blocked_calls, memory_order_relaxed);
    out->last_drain_ns = atomic_load_explicit(&s->last_drain_ns, memory_order_relaxed);
    out->start_ticks = atomic_load_explicit(&s->start_ticks, memory_order_relaxed);
    out->image = atomic_load_explicit(&s->image, memory_order_relaxed);
    out->pidns = atomic_load_explicit(&s->pidns, memory_order_relaxed);
    out->mem_mib = atomic_load_explicit(&s->mem_mib, memory_order_relaxed);
    uint32_t oom = atomic_load_explicit(&s->oom, memory_order_relaxed);
    out->oom_waited = (oom >> KREX_OOM_WAITED_SHIFT) & KREX_OOM_WAITED_MAX;
    out->oom_failed = (oom >> KREX_OOM_FAILED_SHIFT) & KREX_OOM_FAILED_MAX;
    out->oom_own = (oom >> KREX_OOM_OWN_SHIFT) & KREX_OOM_OWN_MAX;
    out->oom_last = (oom >> KREX_OOM_LAST_SHIFT) & KREX_OOM_LAST_MAX;
    out->oom_waiting = (oom & KREX_OOM_WAITING) != 0;
    /* Relaxed: a status hint the owner stores once; krexd's fault monitor
     * reads it again on its next pass.  Tenant-written, so only the
     * defined bits are kept (krexd.orchestration.faults validates the code). */
    out->fault = atomic_load_explicit(&s->fault, memory_order_relaxed) & KREX_FAULT_KNOWN;
    out->reserved_ = 0;
}

/* The checks both sides make on a slot memory fd before mapping it: a
 * memfd sealed against shrinking, growing and further sealing (so no
 * mapping of it can ever fault past its end: no SIGBUS), of exactly the
 * layout's size. */
int krex_slot_fd_check(int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return -errno;
    if (!S_ISREG(st.st_mode) || st.st_size != (off_t)sizeof(struct krex_tenant_mem))
        return -EPROTO;
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0)
        return -EPERM; /* not a memfd (or sealing not allowed) */
    const int need = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
    if ((seals & need) != need)
        return -EPERM;
    return 0;
}

KREX_GATE_API uint64_t krex_tenant_mem_size(void) { return sizeof(struct krex_tenant_mem); }

KREX_GATE_API int krex_tenant_mem_header(uint32_t tenant, void *buf, uint32_t n)
{
    struct krex_tenant_mem h; /* only its first cache line is used */
    if (!buf || tenant == 0 || n < offsetof(struct krex_tenant_mem, slots))
        return -EINVAL;
    memset(&h, 0, offsetof(struct krex_tenant_mem, slots));
    h.magic = KREX_SLOTS_MAGIC;
    h.version = KREX_GATE_VERSION;
    h.tenant = tenant;
    memcpy(buf, &h, offsetof(struct krex_tenant_mem, slots));
    return (int)offsetof(struct krex_tenant_mem, slots);
}

/* ---- tenant side: mapping ----------------------------------------------- */

KREX_GATE_API const struct krex_gate *krex_gate_map(int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return NULL;
    /* Only krexd (root) may write the gate: a file anyone else could write
     * or truncate is not one krexd made. */
    if (!S_ISREG(st.st_mode) || st.st_uid != 0 || (st.st_mode & 0022)) {
        errno = EPERM;
        return NULL;
    }
    if (st.st_size < (off_t)sizeof(struct krex_gate)) {
        errno = EPROTO;
        return NULL;
    }
    void *p = mmap(NULL, sizeof(struct krex_gate), PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return NULL;
    const struct krex_gate *g = p;
    if (g->magic != KREX_GATE_MAGIC || g->version != KREX_GATE_VERSION) {
        munmap(p, sizeof *g);
        errno = EPROTO;
        return NULL;
    }
    return g;
}

KREX_GATE_API void krex_gate_unmap(const struct krex_gate *g)
{
    if (g)
        munmap((void *)g, sizeof *g);
}

KREX_GATE_API struct krex_tenant_mem *krex_tenant_mem_map(int fd, uint32_t tenant)
{
    int r = krex_slot_fd_check(fd);
    if (r) {
        errno = -r;
        return NULL;
    }
    void *p = mmap(NULL, sizeof(struct krex_tenant_mem), PROT_READ | PROT_WRITE, MAP_SHARED,
                   fd, 0);
    if (p == MAP_FAILED)
        return NULL;
    struct krex_tenant_mem *m = p;
    if (m->magic != KREX_SLOTS_MAGIC || m->version != KREX_GATE_VERSION || m->tenant != tenant) {
        munmap(p, sizeof *m);
        errno = EPROTO;
        return NULL;
    }
    return m;
}

KREX_GATE_API void krex_tenant_mem_unmap(struct krex_tenant_mem *m)
{
    if (m)
        munmap(m, sizeof *m);
}

/* ---- tenant side: the per-call protocol ---------------------------------- */

KREX_GATE_API int krex_gate_try_enter(const struct krex_gate *g, struct krex_slot *s,
                                      uint32_t tenant)
{
    return krex_gate_try_enter_inline(g, s, tenant);
}

static void __attribute__((noinline)) enter_slow(const struct krex_gate *g,
                                                 struct krex_slot *s, uint32_t tenant)
{
    int saved = errno;
    atomic_fetch_add_explicit(&s->blocked_calls, 1, memory_order_relaxed);
    for (;;) {
        /* seq before word (both seq_cst): if the word still reads closed,
         * the reopen's seq bump comes later in S, so the futex wait on
         * `seen` cannot miss it. */
        uint32_t seen = atomic_load_explicit(&g->seq, memory_order_seq_cst);
        uint64_t w = krex_gate_load_word(g);
        if (krex_gate_admits(w, tenant)) {
            if (krex_gate_try_enter(g, s, tenant))
                break;
            continue;
        }
        /* Parked: no CPU until the gate changes (paper §4.2). */
        krex_futex_wait(&g->seq, seen, -1);
    }
    errno = saved;
}

KREX_GATE_API void krex_gate_enter(const struct krex_gate *g, struct krex_slot *s,
                                   uint32_t tenant)
{
    if (__builtin_expect(krex_gate_try_enter(g, s, tenant), 1))
        return;
    enter_slow(g, s, tenant);
}

KREX_GATE_API void krex_gate_leave(struct krex_slot *s)
{
    krex_gate_leave_inline(s);
}

/* ---- tenant side: registration -------------------------------------------- */

struct claim {
    uint32_t tenant;
    int32_t pid;
    uint64_t ticks, image, pidns;
};

/* Claim a FREE slot of `m`: CLAIMING with our pid, fields filled, then
 * ACTIVE with inflight == 1.  Returns its index or -ENOSPC. */
static int claim_slot(struct krex_tenant_mem *m, const struct claim *c)
{
    for (uint32_t i = 0; i < KREX_TENANT_SLOTS; i++) {
        struct krex_slot *s = &m->slots[i];
        uint64_t o = krex_owner_load(s);
        /* seq_cst CAS: claims the slot exclusively (the pid is in the word
         * from now on, so nobody judges this claim by an older owner). */
        if (krex_owner_state(o) != KREX_SLOT_FREE || !owner_cas(s, o, KREX_SLOT_CLAIMING, c->pid))
            continue;
        uint64_t claimed = krex_owner_next(o, KREX_SLOT_CLAIMING, c->pid);
        /* Relaxed: published by the seq_cst ACTIVE CAS below.  Every field
         * of the previous owner is overwritten here. */
        atomic_store_explicit(&s->tenant, c->tenant, memory_order_relaxed);
        atomic_store_explicit(&s->start_ticks, c->ticks, memory_order_relaxed);
        atomic_store_explicit(&s->image, c->image, memory_order_relaxed);
        atomic_store_explicit(&s->pidns, c->pidns, memory_order_relaxed);
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
        if (owner_cas(s, claimed, KREX_SLOT_ACTIVE, c->pid))
            return (int)i;
    }
    return -ENOSPC;
}

/* Closed by a sibling at registration: this process has no GPU work yet
 * and no drainer, so it answers every closure itself while it is parked
 * here.  Retract first, then ack, so the coordinator never sees the ack
 * with a non-zero count. */
static void register_parked(const struct krex_gate *g, struct krex_slot *s, uint32_t tenant)
{
    atomic_fetch_sub_explicit(&s->inflight, 1, memory_order_seq_cst);
    atomic_fetch_add_explicit(&s->blocked_calls, 1, memory_order_relaxed);
    for (;;) {
        /* seq before word, as in enter_slow(). */
        uint32_t seen = atomic_load_explicit(&g->seq, memory_order_seq_cst);
        uint64_t w = krex_gate_load_word(g);
        if (krex_gate_admits(w, tenant)) {
            if (krex_gate_try_enter(g, s, tenant))
                return;
            continue;
        }
        if (atomic_load_explicit(&s->ack_epoch, memory_order_seq_cst) != krex_gate_epoch(w))
            krex_gate_ack(s, krex_gate_epoch(w));
        krex_futex_wait(&g->seq, seen, -1);
    }
}

KREX_GATE_API int krex_gate_register(const struct krex_gate *g, struct krex_tenant_mem *m,
                                     uint32_t tenant, int32_t pid, uint64_t image,
                                     uint64_t pidns)
{
    if (!g || !m || tenant == 0 || pid <= 0)
        return -EINVAL;
    int saved = errno;
    struct claim c = {.tenant = tenant, .pid = pid, .image = image, .pidns = pidns};
    /* The start time as krexd will read it (procid.c): the caller's own
     * through /proc/self (the shim registers itself), else through a pidfd. */
    int zombie = 0;
    if (pid == getpid())
        c.ticks = krex_self_start_ticks();
    else if (krex_proc_start(pid, &c.ticks, &zombie) != 0)
        c.ticks = 0;
    int idx = claim_slot(m, &c);
    /* Full: slots of processes that exited stay ACTIVE until a registrant
     * reclaims them.  Reclaim here once. */
    if (idx == -ENOSPC && krex_gate_reclaim_dead(g, m, pidns) > 0)
        idx = claim_slot(m, &c);
    if (idx < 0) {
        errno = saved;
        return idx;
    }
    struct krex_slot *s = &m->slots[idx];
    /* Check after publishing (seq_cst). */
    if (krex_gate_admits(krex_gate_load_word(g), tenant))
        atomic_fetch_add_explicit(&s->gated_calls, 1, memory_order_relaxed);
    else
        register_parked(g, s, tenant);
    errno = saved;
    return idx;
}

KREX_GATE_API int krex_gate_reclaim_dead(const struct krex_gate *g, struct krex_tenant_mem *m,
                                         uint64_t pidns)
{
    if (!g || !m)
        return -EINVAL;
    int n = 0;
    for (uint32_t i = 0; i < KREX_TENANT_SLOTS; i++) {
        struct krex_slot *s = &m->slots[i];
        uint64_t o = krex_owner_load(s);
        uint32_t st = krex_owner_state(o);
        if (st == KREX_SLOT_DEAD) {
            /* Left DEAD while open (its retirer died before freeing it, or
             * it was retired during a region): seq_cst word read after the
             * owner read, as in slot_retire. */
            if (krex_gate_load_word(g) == 0)
                n += owner_cas(s, o, KREX_SLOT_FREE, 0);
            continue;
        }
        if (!krex_owner_registered(st) && st != KREX_SLOT_CLAIMING)
            continue;
        if (owner_dead(s, o, pidns)) {
            KREX_TEST_POINT("reclaim_judged");
            n += slot_retire(g, s, o);
        }
    }
    return n;
}

KREX_GATE_API int krex_gate_forget_pid(const struct krex_gate *g, struct krex_tenant_mem *m,
                                       int32_t pid, uint64_t pidns)
{
    if (!g || !m || pid <= 0)
        return -EINVAL;
    int n = 0;
    for (uint32_t i = 0; i < KREX_TENANT_SLOTS; i++) {
        struct krex_slot *s = &m->slots[i];
        uint64_t o = krex_owner_load(s);
        uint32_t st = krex_owner_state(o);
        /* The pid is matched in the same word the CAS is made from; an
         * owner of another pid namespace is another process. */
        if ((!krex_owner_registered(st) && st != KREX_SLOT_CLAIMING) || krex_owner_pid(o) != pid)
            continue;
        if (krex_owner_registered(st) &&
            atomic_load_explicit(&s->pidns, memory_order_relaxed) != pidns)
            continue;
        KREX_TEST_POINT("forget_matched");
        n += slot_retire(g, s, o);
    }
    return n;
}

/* ---- tenant side: the drainer --------------------------------------------- */

KREX_GATE_API uint32_t krex_gate_wait_seq(const struct krex_gate *g, uint32_t seen,
                                          int64_t timeout_ns)
{
    int saved = errno;
    int64_t start = krex_gate_now_ns();
    int64_t deadline =
        timeout_ns < 0 || timeout_ns > INT64_MAX - start ? INT64_MAX : start + timeout_ns;
    uint32_t cur;
    /* seq_cst: the drainer then reads the word, which the close/reopen
     * wrote before bumping seq. */
    while ((cur = atomic_load_explicit(&g->seq, memory_order_seq_cst)) == seen) {
        int64_t left = -1;
        if (timeout_ns >= 0) {
            left = deadline - krex_gate_now_ns();
            if (left <= 0)
                break;
        }
        krex_futex_wait(&g->seq, seen, left);
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
        krex_cpu_relax();
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
        krex_futex_wait(&s->inflight, v, -1);
    }
out:
    errno = saved;
}

KREX_GATE_API void krex_gate_ack(struct krex_slot *s, uint32_t epoch)
{
    /* seq_cst store, then wake the coordinator parked on this very word
     * (it read the old value before it parked, so either the wait fails
     * on the new value or this wake reaches it). */
    atomic_store_explicit(&s->ack_epoch, epoch, memory_order_seq_cst);
    krex_futex_wake_all(&s->ack_epoch);
}

/* ---- tenant side: an exiting process ------------------------------------- */

KREX_GATE_API int krex_gate_mark_exiting(const struct krex_gate *g, struct krex_slot *s,
                                         int32_t pid)
{
    uint64_t o = krex_owner_load(s);
    /* A seq_cst CAS from our own ACTIVE word: it releases the exit
     * synchronization made before it to the coordinator whose seq_cst
     * owner load reads EXITING (coord_protocol.c scan_pending), and fails if the
     * slot was retired meanwhile (then it is not ours to mark). */
    if (krex_owner_state(o) != KREX_SLOT_ACTIVE || krex_owner_pid(o) != pid ||
        !owner_cas(s, o, KREX_SLOT_EXITING, pid))
        return -ESTALE;
    /* A coordinator may be parked on our ack_epoch.  Word read after the
     * CAS (seq_cst): a closure it misses comes later in S and its scan
     * reads EXITING.  For a closure it sees, the exit synchronization made
     * before the CAS covers the epoch: acknowledging it is honest, and the
     * store changes the futex word, so the wait cannot miss the wake. */
    uint64_t w = krex_gate_load_word(g);
    if (w != 0)
        krex_gate_ack(s, krex_gate_epoch(w));
    return 0;
}

KREX_GATE_API void krex_gate_leave_exiting(struct krex_slot *s)
{
    /* seq_cst like every RMW on inflight; it releases the caller's
     * synchronization to the coordinator that reads zero (it polls an
     * EXITING slot with calls in flight: coord_protocol.c). */
    uint32_t prev = atomic_fetch_sub_explicit(&s->inflight, 1, memory_order_seq_cst);
    if ((prev & KREX_INFLIGHT_COUNT) == 1 && (prev & KREX_INFLIGHT_WAITER))
        krex_gate_wake_idle(s); /* the stopped drainer may still wait for zero */
}
