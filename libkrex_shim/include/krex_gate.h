/*
 * krex_gate.h — the per-GPU shared-memory gate: one fixed, versioned layout
 * used by both sides of the region protocol (paper §4.2, DESIGN.md "Region
 * entry and exit" steps 2-3 and 7-8).
 *
 *   krexd (coordinator, through ctypes on libkrex_gate.so) creates one gate
 *   file per GPU, closes it for a holder, waits for every sibling slot to
 *   acknowledge the epoch with a zero in-flight counter, and reopens it.
 *
 *   libkrex_shim.so (in every tenant process) claims one slot per process,
 *   counts its in-flight driver calls in it, parks while a sibling holds the
 *   gate, and runs a drainer thread that publishes acknowledgements.
 *
 * Both sides include this header; a change of layout bumps
 * KREX_GATE_VERSION, and krex_gate_open() refuses a file of another version.
 * docs/design/shim.md gives the memory-order argument.
 *
 * Layout (little-endian, one mapping of sizeof(struct krex_gate) bytes):
 *
 *   offset 0    header (one cache line): magic, version, nslots, gpu,
 *               word, seq, ack_seq
 *   offset 64   slots[KREX_GATE_MAX_SLOTS], two cache lines each
 *
 * The gate word packs the holder and the epoch so that closing is one
 * atomic compare-and-swap (step 2: "atomically claims a shared-memory gate,
 * recording the holder's identity and a unique epoch"):
 *
 *   word == 0                       gate open
 *   word == (epoch << 32) | holder  gate closed for tenant `holder`
 *
 * Tenant ids and epochs are never 0.
 *
 * Version history: 1 (initial); 2 adds krex_slot.start_ticks (pid reuse
 * and exec detection) and the in-flight counter's waiter bit; 3 adds
 * krex_slot.mem_mib/oom and the header's mem_seq/mem_waiters (carved from
 * padding) and their fields in struct krex_slot_info; 4: a slot's state and
 * pid become one 64-bit ownership word with a generation (krex_slot.owner,
 * below), so that every ownership transition is one compare-and-swap on the
 * owner's identity (inflight, ack_epoch and captures move up by 4 bytes),
 * and struct krex_slot_info gains the generation; 5: the EXITING slot
 * state (drained with nothing in flight, no acknowledgement) and
 * krex_gate_mark_exiting() / krex_gate_leave_exiting(); 6 adds
 * krex_slot.fault (the slot grows to two cache lines) and its decoded copy
 * in struct krex_slot_info (in place of a reserved word).  Any change of
 * the file layout, of a slot state's meaning, of struct krex_slot_info or
 * of a function's signature bumps
 * the version: krex_gate_open() refuses a file of another version (EPROTO;
 * krex_gate_file_version() says which), and krexd refuses a library of
 * another version (krex_gate_abi_version()).
 */
#ifndef KREX_GATE_H
#define KREX_GATE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KREX_GATE_MAGIC 0x455441475845524BULL /* bytes "KREXGATE" in memory */
#define KREX_GATE_VERSION 6u
#define KREX_GATE_MAX_SLOTS 256u

/* Slot states (the low byte of krex_slot.owner).  Every transition is one
 * compare-and-swap of the whole ownership word (gate.c):
 *
 *   FREE -> CLAIMING     a registrant claims it (its pid enters the word)
 *   CLAIMING -> ACTIVE   the registrant published its fields
 *   ACTIVE -> EXITING    the owner, at exit, after synchronizing
 *                        (krex_gate_mark_exiting)
 *   CLAIMING|ACTIVE|EXITING -> DEAD   the owner is gone, or forgot the slot
 *   DEAD -> FREE         while the gate is open: by the winner of the DEAD
 *                        transition, or by krexd's reopen (whoever's CAS
 *                        succeeds; the other's fails on the generation)
 *
 * There is no other transient state, so a judgement about a slot's owner
 * (dead, or a given pid) always names the exact ownership it was made on. */
enum krex_slot_state {
    KREX_SLOT_FREE = 0,     /* unused */
    KREX_SLOT_CLAIMING = 1, /* a process is filling in its fields */
    KREX_SLOT_ACTIVE = 2,   /* a live process; must acknowledge drains */
    KREX_SLOT_DEAD = 3,     /* its process died or left; while a gate is
                               closed it stays DEAD until the reopen, never
                               reassigned during the region (paper §4.2) */
    KREX_SLOT_EXITING = 4,  /* a live process past its exit
                               synchronization: its drainer is stopped, and
                               each of its gated calls synchronizes before
                               its in-flight count drops, so it is drained
                               whenever nothing is in flight (no
                               acknowledgement; docs/design/shim.md "Exit") */
};

/* krex_slot.owner: a slot's ownership in one word, changed only by
 * compare-and-swap (one word, so that it can later live in memory the
 * owning tenant alone may write):
 *
 *   bits 0-7    state (enum krex_slot_state)
 *   bits 8-31   generation: +1 (mod 2^24) on every transition, so a CAS
 *               from a word read earlier fails once the slot changed
 *               hands, even back to the same state and pid (an ABA needs
 *               2^24 transitions of one slot inside one reclaimer's
 *               read-check-CAS window, a few microseconds)
 *   bits 32-63  pid of the owner (krexd's pid namespace); 0 when FREE */
#define KREX_OWNER_STATE_MASK 0xffu
#define KREX_OWNER_GEN_SHIFT 8u
#define KREX_OWNER_GEN_MASK 0xffffffu

static inline uint32_t krex_owner_state(uint64_t o) { return (uint32_t)o & KREX_OWNER_STATE_MASK; }
static inline uint32_t krex_owner_gen(uint64_t o)
{
    return ((uint32_t)o >> KREX_OWNER_GEN_SHIFT) & KREX_OWNER_GEN_MASK;
}
static inline int32_t krex_owner_pid(uint64_t o) { return (int32_t)(uint32_t)(o >> 32); }
/* The word after a transition of `o` to (state, pid): next generation. */
static inline uint64_t krex_owner_next(uint64_t o, uint32_t state, int32_t pid)
{
    uint32_t gen = (krex_owner_gen(o) + 1u) & KREX_OWNER_GEN_MASK;
    return ((uint64_t)(uint32_t)pid << 32) | ((uint64_t)gen << KREX_OWNER_GEN_SHIFT) | state;
}

/* krex_slot.oom: what libkrex_shim did with CUDA_ERROR_OUT_OF_MEMORY in
 * this process (docs/design/memory.md).  Three saturating counters, the
 * reason of the last error handed back, and a flag set while an
 * allocation waits for co-tenants to free memory (krexd admits nothing
 * to the GPU meanwhile).  Updated by compare-and-swap, owner only. */
#define KREX_OOM_WAITED_SHIFT 0u  /* co-tenant OOMs absorbed: waited, then got it */
#define KREX_OOM_WAITED_MAX 0xfffu
#define KREX_OOM_FAILED_SHIFT 12u /* co-tenant OOMs returned to the program */
#define KREX_OOM_FAILED_MAX 0xffu
#define KREX_OOM_OWN_SHIFT 20u    /* OOMs returned as the tenant's own */
#define KREX_OOM_OWN_MAX 0xffu
#define KREX_OOM_LAST_SHIFT 28u   /* enum krex_oom_reason of the last one returned */
#define KREX_OOM_LAST_MAX 0x7u
#define KREX_OOM_WAITING 0x80000000u

enum krex_oom_reason {
    KREX_OOM_NONE = 0,
    /* Caused by co-tenants (they hold memory; the tenant alone fits): */
    KREX_OOM_TIMEOUT = 1,   /* waited oom_wait_s; not enough was freed */
    KREX_OOM_IN_REGION = 2, /* the tenant holds the region: never wait on
                               frozen siblings */
    KREX_OOM_NESTED = 3,    /* inside another driver call: cannot wait */
    KREX_OOM_NO_WAIT = 4,   /* waiting is off (oom_wait_s = 0) */
    /* The tenant's own: */
    KREX_OOM_TOO_LARGE = 5, /* the tenant alone would exceed the card */
    KREX_OOM_ALONE = 6,     /* no co-tenant process on the GPU */
    /* Co-tenants again: */
    KREX_OOM_MUTUAL = 7,    /* every co-tenant holding memory waits too:
                               the latest admitted tenant gives up */
};

/* krex_slot.fault: the first fatal ("sticky") CUDA error this process saw
 * (libkrex_shim/fault.c, docs/design/faults.md).  Written once, by the
 * owner, with one relaxed store; krexd reads it to tell a GPU-wide fault
 * under MPS (every client of the server gets the error) from a command's
 * own.  0: none seen. */
#define KREX_FAULT_CODE_MASK 0xffffu  /* the CUresult (700 illegal address, ...) */
#define KREX_FAULT_LAUNCHED 0x10000u  /* the process had launched kernels before it
                                         (a process that never launched cannot be
                                         the culprit) */
#define KREX_FAULT_AT_SYNC 0x20000u   /* seen by the shim's own synchronization (a
                                         drain or the exit), not returned to a call */

/* krex_slot.inflight: bits 0-30 count the process's in-flight driver calls;
 * bit 31 is set by the drainer before it parks waiting for zero, so that
 * the submitter's decrement wakes it only when somebody waits (the fast
 * path stays free of system calls). */
#define KREX_INFLIGHT_WAITER 0x80000000u
#define KREX_INFLIGHT_COUNT 0x7fffffffu

struct krex_slot {
    _Atomic uint64_t owner;      /* state | generation | pid, see above */
    _Atomic uint32_t inflight;   /* in-flight driver calls; futex word */
    _Atomic uint32_t ack_epoch;  /* last epoch this process drained for */
    _Atomic uint32_t tenant;     /* owning tenant id */
    _Atomic uint32_t captures;   /* stream captures open in this process */
    _Atomic uint64_t gated_calls;   /* statistics: calls that passed the gate */
    _Atomic uint64_t blocked_calls; /* statistics: calls that parked */
    _Atomic uint64_t last_drain_ns; /* statistics: duration of the last drain */
    _Atomic uint64_t start_ticks;   /* owner's start time (/proc/<pid>/stat
                                       field 22): tells a dead pid from a
                                       reused one */
    /* Device memory (libkrex_shim/memory.c, docs/design/memory.md): zeroed
     * at registration, kept by slot_free() so that krexd can read the
     * record of a process that ended.  Written by the owner only. */
    _Atomic uint32_t mem_mib;       /* device memory the process allocated
                                       through the driver API and has not
                                       freed, MiB rounded up (saturates) */
    _Atomic uint32_t oom;           /* out-of-memory record, KREX_OOM_* */
    /* Version 6: fatal GPU errors (docs/design/faults.md).  Zeroed at
     * registration, kept by slot_free() like the memory record. */
    _Atomic uint32_t fault;         /* KREX_FAULT_*, owner only */
    uint32_t spare_[15];            /* pads the slot to two cache lines */
} __attribute__((aligned(64)));

struct krex_gate {
    uint64_t magic;            /* KREX_GATE_MAGIC */
    uint32_t version;          /* KREX_GATE_VERSION */
    uint32_t nslots;           /* slots in use by this gate (<= MAX) */
    uint32_t gpu;              /* GPU index this gate protects */
    uint32_t reserved_;
    _Atomic uint64_t word;     /* 0 = open, else (epoch << 32) | holder */
    _Atomic uint32_t seq;      /* futex: bumped on every close and reopen;
                                  parked submitters and drainers wait here */
    _Atomic uint32_t ack_seq;  /* futex: bumped after each acknowledgement;
                                  the coordinator waits here */
    _Atomic uint32_t mem_seq;  /* futex: bumped after every device-memory
                                  free; allocations waiting out a
                                  co-tenant OOM wait here (memory.c) */
    _Atomic uint32_t mem_waiters; /* processes waiting on mem_seq (a hint
                                     for the freeing side; may overcount
                                     after a waiter is killed) */
    uint8_t pad_[64 - 8 - 4 * 4 - 8 - 4 * 4];
    struct krex_slot slots[KREX_GATE_MAX_SLOTS];
} __attribute__((aligned(64)));

_Static_assert(sizeof(struct krex_slot) == 128, "slot is two cache lines");
_Static_assert(sizeof(struct krex_gate) == 64 + 128 * KREX_GATE_MAX_SLOTS,
               "gate layout is fixed");
/* The version field sits where every version put it, so that
 * krex_gate_file_version() can name the version of any gate file. */
_Static_assert(offsetof(struct krex_gate, version) == 8, "version field is fixed");

static inline uint32_t krex_gate_holder(uint64_t word) { return (uint32_t)word; }
static inline uint32_t krex_gate_epoch(uint64_t word) { return (uint32_t)(word >> 32); }
static inline uint64_t krex_gate_word(uint32_t holder, uint32_t epoch)
{
    return ((uint64_t)epoch << 32) | holder;
}

/* A plain snapshot of one slot, for krexd's status and tests (ctypes reads
 * this flat struct instead of mirroring the atomic layout). */
struct krex_slot_info {
    uint32_t state;
    uint32_t inflight;  /* count only, waiter bit removed */
    uint32_t ack_epoch;
    int32_t pid;
    uint32_t tenant;
    uint32_t captures;
    uint64_t gated_calls;
    uint64_t blocked_calls;
    uint64_t last_drain_ns;
    uint64_t start_ticks;
    /* Device memory and out-of-memory record (krex_slot.mem_mib and .oom,
     * the oom word decoded): kept after the process ended (slot_free). */
    uint32_t mem_mib;     /* MiB allocated through the driver API, not freed */
    uint32_t oom_waited;  /* co-tenant OOMs absorbed: waited, then allocated */
    uint32_t oom_failed;  /* co-tenant OOMs returned to the program */
    uint32_t oom_own;     /* OOMs returned as the tenant's own */
    uint32_t oom_last;    /* enum krex_oom_reason of the last one returned */
    uint32_t oom_waiting; /* 1 while an allocation waits for co-tenants */
    uint32_t generation; /* of the ownership word (version 4) */
    uint32_t fault;      /* krex_slot.fault (version 6): KREX_FAULT_* */
};

/* Return codes: 0 on success, negative errno values on failure. */

/* ---- both sides --------------------------------------------------------- */

/* Map the gate file at `path`.  create != 0: build a fresh gate for `gpu`
 * and `nslots` with permissions `mode` (umask not applied) in a temporary
 * file beside `path` and rename it over `path`, so a process still mapping
 * an older gate file keeps its own copy and never sees a half-built one.
 * create == 0: map an existing file and check magic and version.  Returns
 * NULL with errno set (EPROTO on a wrong magic or version, EINVAL on a bad
 * nslots or a short file). */
struct krex_gate *krex_gate_open(const char *path, int create, uint32_t gpu,
                                 uint32_t nslots, uint32_t mode);
void krex_gate_unmap(struct krex_gate *g);

/* KREX_GATE_VERSION of the compiled library (ctypes checks it). */
uint32_t krex_gate_abi_version(void);

/* The gate word now (0 = open). */
uint64_t krex_gate_load_word(const struct krex_gate *g);

/* Copy slot `i` into `out`.  -EINVAL when i >= nslots. */
int krex_gate_slot_info(const struct krex_gate *g, uint32_t i,
                        struct krex_slot_info *out);

/* Copy slots 0 .. min(nslots, n) - 1 into out[] (one call for krexd's
 * periodic reads).  Returns how many, -EINVAL for a NULL argument. */
int krex_gate_slots_info(const struct krex_gate *g, struct krex_slot_info *out, uint32_t n);

/* The layout version recorded in the gate file at `path`, read without
 * mapping it, for the message after krex_gate_open() failed with EPROTO:
 * 0 with *version set; -EPROTO when the file is no krex gate (short, or
 * another magic); -errno when it cannot be read. */
int krex_gate_file_version(const char *path, uint32_t *version);

/* ---- coordinator side (krexd) ------------------------------------------ */

/* Step 2: close the gate for `holder` with `epoch`.  -EBUSY if not open,
 * -EINVAL if holder or epoch is 0. */
int krex_gate_close(struct krex_gate *g, uint32_t holder, uint32_t epoch);

/* Step 3: wait until every ACTIVE slot of another tenant has
 * ack_epoch == epoch and inflight == 0, and every EXITING one has
 * inflight == 0.  Slots whose process has died are
 * marked DEAD (bound to that owner, as in krex_gate_reclaim_dead) and
 * skipped.  Spins briefly, then parks on ack_seq.
 * timeout_ns bounds the wait: -ETIMEDOUT, with the indices of the slots
 * still pending written to pending[0..*npending) (pending must hold
 * KREX_GATE_MAX_SLOTS entries; either may be NULL).  -ESTALE if the gate
 * no longer holds (holder, epoch). */
int krex_gate_wait_drained(struct krex_gate *g, uint32_t holder, uint32_t epoch,
                           int64_t timeout_ns, uint32_t *pending,
                           uint32_t *npending);

/* Steps 7-8: reopen the gate only if it still holds (holder, epoch), so a
 * late recovery never reopens a newer region.  Frees DEAD slots and wakes
 * every parked submitter.  -ESTALE if the word differs. */
int krex_gate_reopen(struct krex_gate *g, uint32_t holder, uint32_t epoch);

/* Reclaim slots whose process no longer exists (gone, a zombie, its pid
 * reused, or a pid that is not positive): freed at once while the gate is
 * open, marked DEAD (freed at reopen) while it is closed, so that no slot
 * is reassigned during a region; DEAD slots found while open are freed.
 * Each judgement is bound to the ownership word it was made on (a slot
 * that changed hands meanwhile is left alone).  Returns how many were
 * reclaimed. */
int krex_gate_reclaim_dead(struct krex_gate *g);

/* ---- tenant side (libkrex_shim) ---------------------------------------- */

/* Claim a slot for (tenant, pid).  The slot is published ACTIVE with
 * inflight == 1 and then the gate is read, so registration is serialized
 * with closure exactly like a submission (paper §4.2: "later arrivals must
 * wait for the gate to reopen").  A registrant that finds the gate closed
 * by a sibling has put no work on the GPU yet (registration happens before
 * its first gated call), so it acknowledges that epoch itself and parks
 * until the reopen.  On return (>= 0, the slot index) the registration has
 * passed the gate: the caller must start its drainer (whose first step
 * reads the current gate word) and krex_gate_leave() the call.  When
 * every slot is taken it first reclaims those of dead processes
 * (krex_gate_reclaim_dead); -ENOSPC if none was, -EINVAL for tenant 0. */
int krex_gate_register(struct krex_gate *g, uint32_t tenant, int32_t pid);

/* Free (FREE while open, DEAD while closed) the slots that `pid` claimed
 * in an earlier program image: after an execve the process keeps its pid
 * but loses its drainer.  Call before the new image registers.  The pid
 * is matched in the ownership word the transition is made from.  Returns
 * how many. */
int krex_gate_forget_pid(struct krex_gate *g, int32_t pid);

/* The per-call protocol (paper §4.2 "increment, then check"): called around
 * every gated driver call.  krex_gate_enter() returns once the call may
 * proceed (gate open, or held by this tenant); it parks on the gate's futex
 * while a sibling holds it.  krex_gate_leave() decrements and wakes a
 * drainer waiting for zero. */
void krex_gate_enter(struct krex_gate *g, struct krex_slot *s, uint32_t tenant);
void krex_gate_leave(struct krex_gate *g, struct krex_slot *s);

/* One non-blocking attempt: 1 when admitted (the caller must leave), 0 when
 * a sibling holds the gate (the increment has been retracted; the caller
 * may then decide, e.g. for a launch into a capturing stream, to proceed
 * without counting, or call krex_gate_enter() to park). */
int krex_gate_try_enter(struct krex_gate *g, struct krex_slot *s, uint32_t tenant);

/* Exit (docs/design/shim.md "Exit"): once this process has synchronized
 * at exit and every later gated call of it synchronizes before leaving,
 * turn its slot `s` (ACTIVE, owned by `pid`) EXITING and wake the
 * coordinator.  0, or -ESTALE when the slot is no longer so owned. */
int krex_gate_mark_exiting(struct krex_gate *g, struct krex_slot *s, int32_t pid);

/* krex_gate_leave() for a call that has synchronized the process's work
 * after the driver call: also wakes the coordinator when the count drops
 * to zero (an EXITING slot is drained then, without an acknowledgement). */
void krex_gate_leave_exiting(struct krex_gate *g, struct krex_slot *s);

/* Drainer side: wait until the gate sequence differs from `seen`
 * (futex wait, timeout_ns < 0 for none).  Returns the new sequence. */
uint32_t krex_gate_wait_seq(struct krex_gate *g, uint32_t seen, int64_t timeout_ns);

/* Drainer side: wait until s->inflight == 0 (spin briefly, then park). */
void krex_gate_wait_idle(struct krex_slot *s);

/* Drainer side: publish an acknowledgement of `epoch` and wake the
 * coordinator. */
void krex_gate_ack(struct krex_gate *g, struct krex_slot *s, uint32_t epoch);

#ifdef __cplusplus
}
#endif
#endif /* KREX_GATE_H */
