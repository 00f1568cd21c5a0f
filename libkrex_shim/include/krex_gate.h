/*
 * krex_gate.h — the per-GPU gate and the per-tenant slot memory: one fixed,
 * versioned layout used by both sides of the region protocol (paper §4.2;
 * docs/design/architecture.md "The region protocol, step by step").  Who
 * creates, writes and maps each part, and why: docs/design/shim.md "Who
 * writes what".  The gate word packs holder and epoch so that closing is
 * one compare-and-swap (struct krex_gate); tenant ids and epochs are never
 * 0.  The layout's versions: at KREX_GATE_VERSION.
 */
#ifndef KREX_GATE_H
#define KREX_GATE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KREX_GATE_MAGIC 0x455441475845524BULL /* bytes "KREXGATE" in memory */
#define KREX_SLOTS_MAGIC 0x53544f4c5845524BULL /* bytes "KREXLOTS" in memory */
/* Version history: 1 (initial); 2 adds krex_slot.start_ticks (pid reuse
 * and exec detection) and the in-flight counter's waiter bit; 3 adds
 * krex_slot.mem_mib/oom and the header's mem_seq/mem_waiters; 4: a slot's
 * state and pid become one 64-bit ownership word with a generation; 5 (two
 * lines of development took this number; neither file exists any more):
 * the EXITING slot state (drained with nothing in flight, no
 * acknowledgement) and krex_gate_mark_exiting() /
 * krex_gate_leave_exiting(), and, separately, the slots moved out of the
 * gate into per-tenant sealed slot memory (tenants map the gate
 * read-only), a slot of two cache lines (the owner's image token and pid
 * namespace, for krexd's verification), the coordinator waiting on each
 * slot's ack_epoch (no shared ack_seq) and krexd's per-tenant memory
 * summary in the gate; 6 is reserved (a fault word); 7: both of 5's
 * changes together: EXITING slots live in the tenant's slot memory, the
 * exiting process marks its own slot, and the drain counts an EXITING slot
 * with nothing in flight as drained; 8 adds krex_slot.fault (the first
 * fatal CUDA error the process saw, written by the owner in its tenant's
 * slot memory, carved from the slot's padding) and its decoded copy in
 * struct krex_slot_info (the MPS fault work had numbered this field's
 * first form 6, in a gate file that no longer holds slots); 9 adds the
 * header's last_epoch (carved from its padding), so that a krexd adopting
 * the gate continues the epochs after the watchdog reopened it.  Any
 * change of a layout, of a slot state's meaning, of struct krex_slot_info
 * or of a function's signature bumps the version: krex_gate_map() and
 * krex_coord_attach() refuse memory of another version (EPROTO;
 * krex_gate_file_version() says which), and krexd refuses a library of
 * another version (krex_gate_abi_version()). */
#define KREX_GATE_VERSION 9u
/* Processes of one tenant that can be registered at once (slots in its
 * slot memory), and tenants one gate summarizes. */
#define KREX_TENANT_SLOTS 128u
#define KREX_GATE_MAX_TENANTS 64u

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
 * (libkrex_shim/tenant/fault.c, docs/design/faults.md).  Written once, by the
 * owner, with one relaxed store, in the tenant's slot memory; krexd reads
 * it (untrusted input: bits outside KREX_FAULT_KNOWN are dropped) to tell
 * a GPU-wide fault under MPS (every client of the server gets the error)
 * from a command's own.  0: none seen. */
#define KREX_FAULT_CODE_MASK 0xffffu  /* the CUresult (700 illegal address, ...) */
#define KREX_FAULT_LAUNCHED 0x10000u  /* the process had launched kernels before it
                                         (a process that never launched cannot be
                                         the culprit) */
#define KREX_FAULT_AT_SYNC 0x20000u   /* seen by the shim's own synchronization (a
                                         drain or the exit), not returned to a call */
#define KREX_FAULT_KNOWN (KREX_FAULT_CODE_MASK | KREX_FAULT_LAUNCHED | KREX_FAULT_AT_SYNC)

/* krex_slot.inflight: bits 0-30 count the process's in-flight driver calls;
 * bit 31 is set by the drainer before it parks waiting for zero, so that
 * the submitter's decrement wakes it only when somebody waits (the fast
 * path stays free of system calls). */
#define KREX_INFLIGHT_WAITER 0x80000000u
#define KREX_INFLIGHT_COUNT 0x7fffffffu

struct krex_slot {
    _Atomic uint64_t owner;      /* state | generation | pid, see above */
    _Atomic uint32_t inflight;   /* in-flight driver calls; futex word */
    _Atomic uint32_t ack_epoch;  /* last epoch this process drained for;
                                    futex word: the coordinator waits here */
    _Atomic uint32_t tenant;     /* owning tenant id (krexd checks it
                                    against the slot memory's tenant) */
    _Atomic uint32_t captures;   /* stream captures open in this process */
    _Atomic uint64_t gated_calls;   /* statistics: calls that passed the gate */
    _Atomic uint64_t blocked_calls; /* statistics: calls that parked */
    _Atomic uint64_t last_drain_ns; /* statistics: duration of the last drain */
    _Atomic uint64_t start_ticks;   /* owner's start time (/proc/<pid>/stat
                                       field 22): tells a dead pid from a
                                       reused one */
    /* Device memory (libkrex_shim/tenant/memory.c, docs/design/memory.md): zeroed
     * at registration, kept by a freed slot so that krexd can read the
     * record of a process that ended.  Written by the owner only. */
    _Atomic uint32_t mem_mib;       /* device memory the process allocated
                                       through the driver API and has not
                                       freed, MiB rounded up (saturates) */
    _Atomic uint32_t oom;           /* out-of-memory record, KREX_OOM_* */
    /* Identity for krexd (version 5), written before ACTIVE is published: */
    _Atomic uint64_t image;         /* the shim's executable mapping in the
                                       owner: start address | pages (below
                                       KREX_IMAGE_PAGE_MASK); a new program
                                       image (execve) does not have it */
    _Atomic uint64_t pidns;         /* inode of the owner's pid namespace
                                       (its pid is in that namespace) */
    /* Version 8: fatal GPU errors (docs/design/faults.md).  Zeroed at
     * registration, kept by a freed slot like the memory record.  krexd
     * reads it as untrusted input: only the bits below are kept. */
    _Atomic uint32_t fault;         /* KREX_FAULT_*, owner only */
    uint8_t pad_[44];               /* pads the slot to two cache lines */
} __attribute__((aligned(64)));

/* krex_slot.image: page-aligned start of the mapping | its length in pages. */
#define KREX_IMAGE_PAGE_MASK 0xfffull

/* One tenant's slot memory: a sealed memfd (F_SEAL_SHRINK | F_SEAL_GROW |
 * F_SEAL_SEAL) of exactly sizeof(struct krex_tenant_mem) bytes, reserved
 * with fallocate, created by the launcher; written by the tenant's
 * processes only. */
struct krex_tenant_mem {
    uint64_t magic;            /* KREX_SLOTS_MAGIC */
    uint32_t version;          /* KREX_GATE_VERSION */
    uint32_t tenant;           /* tenant id, written by the launcher */
    _Atomic uint32_t mem_seq;  /* bumped after every device-memory free by
                                  one of the tenant's processes; krexd
                                  relays it to the gate's mem_seq */
    uint8_t pad_[64 - 8 - 4 - 4 - 4];
    struct krex_slot slots[KREX_TENANT_SLOTS];
} __attribute__((aligned(64)));

/* krexd's summary of one tenant's registered processes, published in the
 * gate (krex_coord_audit, every few ms) for the shims' out-of-memory
 * judgement (memory.c): only krexd writes it, from its own reading of each
 * tenant's slot memory. */
struct krex_gate_tenant {
    _Atomic uint32_t tenant;          /* 0: row unused */
    _Atomic uint32_t procs;           /* live registered processes */
    _Atomic uint32_t holding;         /* of them, holding device memory */
    _Atomic uint32_t holding_waiting; /* of those, waiting for memory */
    _Atomic uint32_t mem_mib;         /* device memory they hold (MiB, saturates) */
    uint32_t reserved_[3];
};

struct krex_gate {
    uint64_t magic;            /* KREX_GATE_MAGIC */
    uint32_t version;          /* KREX_GATE_VERSION */
    uint32_t ntenants;         /* rows of tenants[] (informational) */
    uint32_t gpu;              /* GPU index this gate protects */
    uint32_t reserved_;
    _Atomic uint64_t word;     /* 0 = open, else (epoch << 32) | holder */
    _Atomic uint32_t seq;      /* futex: bumped on every close and reopen;
                                  parked submitters and drainers wait here */
    _Atomic uint32_t mem_seq;  /* futex: bumped by krexd when a tenant freed
                                  device memory; allocations waiting out a
                                  co-tenant OOM wait here (memory.c) */
    _Atomic uint32_t audit_seq; /* futex: bumped after every audit, once the
                                   summary below is fresh (memory.c waits
                                   for one before it calls an OOM its own) */
    _Atomic uint32_t last_epoch; /* version 9: the last epoch krexd closed the
                                    gate for, kept when the gate reopens, so
                                    that a krexd adopting the gate (after a
                                    crash, a hang or the watchdog's reopen)
                                    never takes an honest acknowledgement of
                                    it for a forgery, and never repeats it */
    uint8_t pad_[64 - 8 - 4 * 4 - 8 - 4 * 4];
    struct krex_gate_tenant tenants[KREX_GATE_MAX_TENANTS];
} __attribute__((aligned(64)));

_Static_assert(sizeof(struct krex_slot) == 128, "slot is two cache lines");
_Static_assert(sizeof(struct krex_gate_tenant) == 32, "summary row is 32 bytes");
_Static_assert(sizeof(struct krex_gate) == 64 + 32 * KREX_GATE_MAX_TENANTS,
               "gate layout is fixed");
_Static_assert(sizeof(struct krex_tenant_mem) == 64 + 128 * KREX_TENANT_SLOTS,
               "slot memory layout is fixed");
/* The version field sits where every version put it, so that
 * krex_gate_file_version() can name the version of any gate file. */
_Static_assert(offsetof(struct krex_gate, version) == 8, "version field is fixed");
_Static_assert(offsetof(struct krex_tenant_mem, version) == 8, "version field is fixed");

static inline uint32_t krex_gate_holder(uint64_t word) { return (uint32_t)word; }
static inline uint32_t krex_gate_epoch(uint64_t word) { return (uint32_t)(word >> 32); }
static inline uint64_t krex_gate_word(uint32_t holder, uint32_t epoch)
{
    return ((uint64_t)epoch << 32) | holder;
}

/* A plain snapshot of one slot, for krexd's status and tests (ctypes reads
 * this flat struct instead of mirroring the atomic layout).  `tenant` is
 * the tenant whose slot memory holds the slot (krexd's own table), and
 * `claimed_tenant` what the slot itself says. */
struct krex_slot_info {
    uint32_t state;
    uint32_t inflight;  /* count only, waiter bit removed */
    uint32_t ack_epoch;
    int32_t pid;        /* in the owner's pid namespace (pidns) */
    uint32_t tenant;
    uint32_t captures;
    uint64_t gated_calls;
    uint64_t blocked_calls;
    uint64_t last_drain_ns;
    uint64_t start_ticks;
    /* Device memory and out-of-memory record (krex_slot.mem_mib and .oom,
     * the oom word decoded): kept after the process ended. */
    uint32_t mem_mib;     /* MiB allocated through the driver API, not freed */
    uint32_t oom_waited;  /* co-tenant OOMs absorbed: waited, then allocated */
    uint32_t oom_failed;  /* co-tenant OOMs returned to the program */
    uint32_t oom_own;     /* OOMs returned as the tenant's own */
    uint32_t oom_last;    /* enum krex_oom_reason of the last one returned */
    uint32_t oom_waiting; /* 1 while an allocation waits for co-tenants */
    uint32_t generation;  /* of the ownership word */
    uint32_t index;       /* slot index in its tenant's slot memory */
    uint64_t owner;       /* the raw ownership word (krex_coord_ignore) */
    uint64_t image;       /* krex_slot.image */
    uint64_t pidns;       /* krex_slot.pidns */
    uint32_t claimed_tenant; /* krex_slot.tenant as written by the tenant */
    uint32_t ignored;     /* 1: krexd judged this owner gone (krex_coord_ignore) */
    uint32_t fault;       /* krex_slot.fault (version 8), masked to KREX_FAULT_* bits */
    uint32_t reserved_;
};

/* One slot still to drain (krex_coord_wait_change). */
struct krex_pending {
    uint32_t tenant;
    uint32_t index;
    uint64_t owner;       /* the ownership word it was pending under */
};

/* What krex_coord_audit found that krexd's protocol cannot have produced. */
enum krex_finding_kind {
    KREX_BAD_HEADER = 1,  /* slot memory header changed (magic, version, tenant) */
    KREX_BAD_STATE = 2,   /* a slot state that does not exist */
    KREX_BAD_TENANT = 3,  /* a registered slot claims another tenant */
    KREX_BAD_ACK = 4,     /* an acknowledgement of an epoch krexd never requested */
    KREX_BAD_INFLIGHT = 5, /* an in-flight count no process can have */
};

struct krex_finding {
    uint32_t tenant;      /* whose slot memory */
    uint32_t kind;        /* enum krex_finding_kind */
    uint32_t index;       /* slot index (0 for a header) */
    uint32_t value;       /* the offending value (truncated to 32 bits) */
};

/* Return codes: 0 on success, negative errno values on failure. */

/* ---- both sides --------------------------------------------------------- */

/* KREX_GATE_VERSION of the compiled library (ctypes checks it). */
uint32_t krex_gate_abi_version(void);

/* The layout version recorded in the gate file at `path`, read without
 * mapping it, for the message after a map failed with EPROTO: 0 with
 * *version set; -EPROTO when the file is no krex gate (short, or another
 * magic); -errno when it cannot be read. */
int krex_gate_file_version(const char *path, uint32_t *version);

/* The gate word now (0 = open). */
uint64_t krex_gate_load_word(const struct krex_gate *g);

/* ---- coordinator side (krexd) ------------------------------------------ */

/* krexd's private handle: the gate's read-write mapping and fd, and the
 * attached slot memories, with every size and count krexd loops over. */
struct krex_coord;

/* Build a fresh, open gate for `gpu` at `path` with permissions `mode`
 * (umask not applied; 0644: tenants read it, krexd alone writes it).  The
 * file is built beside `path`, its space reserved with posix_fallocate
 * (ENOSPC on a full file system, before anything is mapped), then renamed
 * over `path`; a second link `keep` (may be NULL), in a directory only
 * root may write, lets krex_coord_relink() restore `path` if it is
 * removed or replaced.  NULL with errno set. */
struct krex_coord *krex_coord_create(const char *path, const char *keep, uint32_t gpu,
                                     uint32_t mode);
/* Map the gate krexd made before a restart again, read-write, from `keep`
 * when it exists, else `path` (krex_coord_relink() then restores `path`):
 * tenants keep the mapping of this very file, so a restarted krexd must
 * write the same one.  Checks that it is a regular file of this process's
 * user (root) that nobody else may write, of exactly the layout's size,
 * with the magic, version and `gpu` (UINT32_MAX: any GPU, for the
 * watchdog that only reopens it).  No slot memory is attached (krexd
 * attaches each tenant's again) and the last epoch requested is the one
 * the gate word holds, 0 when open (krexd seeds its own:
 * krex_coord_set_epoch).  NULL with errno set: EPERM for a file it does
 * not trust, EPROTO for another layout or GPU. */
struct krex_coord *krex_coord_open(const char *path, const char *keep, uint32_t gpu);
/* Unmap everything and close the fds (the files stay). */
void krex_coord_destroy(struct krex_coord *c);
/* The gate's fd (krexd keeps it open for the gate's whole life). */
int krex_coord_fd(const struct krex_coord *c);
/* 1 when `path` names the gate krexd holds, 0 when not (missing or
 * replaced: then it is restored from `keep`), -errno when it cannot be. */
int krex_coord_relink(struct krex_coord *c, const char *path, const char *keep);

/* Attach tenant `tenant`'s slot memory from `fd` (krexd's own open file
 * description of the launcher's memfd; dup'ed, the caller keeps `fd`).
 * Checks that it is a memfd sealed against shrinking, growing and further
 * sealing, of exactly sizeof(struct krex_tenant_mem) bytes, with the magic,
 * version and tenant in its header; maps it read-only.  -EEXIST when the
 * tenant is attached, -ENOSPC when KREX_GATE_MAX_TENANTS are, -EPERM for
 * missing seals, -EPROTO for a wrong size, magic, version or tenant. */
int krex_coord_attach(struct krex_coord *c, uint32_t tenant, int fd);
/* Forget tenant `tenant`'s slot memory (its summary row is cleared).
 * -ENOENT when not attached.  May run while a drain waits (krexd ends a
 * tenant on its event loop): the scan holds the read lock, and a futex
 * wait on the unmapped memory fails once with EFAULT (coord_protocol.c park_until). */
int krex_coord_detach(struct krex_coord *c, uint32_t tenant);

/* Step 2: close the gate for `holder` with `epoch`.  -EBUSY if not open,
 * -EINVAL if holder or epoch is 0.  Records `epoch` as the last one
 * requested (krex_coord_audit's bound for acknowledgements). */
int krex_coord_close(struct krex_coord *c, uint32_t holder, uint32_t epoch);

/* Step 3, tenant by tenant: wait until every ACTIVE slot of every
 * attached tenant other than `holder` has ack_epoch == epoch and
 * inflight == 0, and every EXITING one has inflight == 0 (no
 * acknowledgement), skipping the owners krexd judged gone
 * (krex_coord_ignore) and the tenants in skip[0..nskip) (drained before,
 * and frozen since: krexd freezes each sibling tenant as soon as it has
 * drained).  Parks on the ack_epoch of every pending slot at once
 * (futex_waitv; where it is missing or refused, on the first one's).
 * Returns 0 when drained; 1 as soon as the set of tenants with pending
 * slots differs from the one whose fingerprint is *seen (0: none known, so
 * the first scan that finds a pending slot returns), with the pending
 * slots in pending[0..*npending) (at most `max`) and that set's
 * fingerprint in *seen (a fingerprint can collide: a change then shows at
 * the timeout); -ETIMEDOUT after timeout_ns, pending and *seen written
 * likewise (krexd judges the owners and waits again); -ESTALE if the gate
 * no longer holds (holder, epoch); -EINVAL. */
int krex_coord_wait_change(struct krex_coord *c, uint32_t holder, uint32_t epoch,
                           const uint32_t *skip, uint32_t nskip, int64_t timeout_ns,
                           uint64_t *seen, struct krex_pending *pending, uint32_t max,
                           uint32_t *npending);

/* Skip slot `index` of tenant `tenant` in drains and summaries for as long
 * as its ownership word is `owner` (krexd judged that owner gone: its
 * process is dead, or exec'd, or not the tenant's).  A later owner of the
 * slot has another word and is judged afresh.  -ENOENT, -EINVAL. */
int krex_coord_ignore(struct krex_coord *c, uint32_t tenant, uint32_t index, uint64_t owner);

/* Steps 7-8: reopen the gate only if it still holds (holder, epoch), so a
 * late recovery never reopens a newer region; wakes every parked
 * submitter.  -ESTALE if the word differs. */
int krex_coord_reopen(struct krex_coord *c, uint32_t holder, uint32_t epoch);

/* The gate word now. */
uint64_t krex_coord_word(const struct krex_coord *c);

/* The last epoch krexd requested (close), and a floor for it after a
 * restart: acknowledgements of epochs after it are forgeries. */
uint32_t krex_coord_epoch(const struct krex_coord *c);
void krex_coord_set_epoch(struct krex_coord *c, uint32_t epoch);

/* Statistics: the scans krex_coord_wait_change made on this gate since it
 * was created or opened (each wake-up of a drain is one scan). */
uint64_t krex_coord_drain_scans(const struct krex_coord *c);

/* Snapshot the non-FREE slots (and FREE ones with a memory record) of
 * every attached tenant into out[0..max).  Returns how many. */
int krex_coord_slots(const struct krex_coord *c, struct krex_slot_info *out, uint32_t max);

/* Validate every attached slot memory and publish the summary: writes
 * up to `max` findings (states krexd's protocol cannot have produced) to
 * out[] and returns how many (the caller ends those tenants); rewrites the
 * gate's per-tenant memory summary; bumps and wakes the gate's mem_seq
 * when a tenant freed memory since the last audit.  Bounded: at most
 * KREX_GATE_MAX_TENANTS x KREX_TENANT_SLOTS slots are read. */
int krex_coord_audit(struct krex_coord *c, struct krex_finding *out, uint32_t max);

/* What a launcher writes to create tenant `tenant`'s slot memory, for a
 * launcher that does not link this library (krex run gets it from krexd):
 * the memfd's exact size, and its first bytes (magic, version, tenant;
 * the rest is zero).  Returns the header's length (<= n) or -EINVAL. */
uint64_t krex_tenant_mem_size(void);
int krex_tenant_mem_header(uint32_t tenant, void *buf, uint32_t n);

/* ---- tenant side (libkrex_shim) ---------------------------------------- */

/* Map the gate read-only from `fd` after checking it: a regular file owned
 * by root and writable by no one else, at least sizeof(struct krex_gate)
 * bytes, with the magic and version.  NULL with errno set (EPERM for an
 * untrusted file, EPROTO for a wrong size, magic or version). */
const struct krex_gate *krex_gate_map(int fd);
void krex_gate_unmap(const struct krex_gate *g);

/* Map a tenant's slot memory read-write from `fd` after the same checks
 * krexd makes (seals, exact size, magic, version, tenant).  NULL with
 * errno set. */
struct krex_tenant_mem *krex_tenant_mem_map(int fd, uint32_t tenant);
void krex_tenant_mem_unmap(struct krex_tenant_mem *m);

/* Claim a slot of `m` for (tenant, pid).  The slot is published ACTIVE
 * with inflight == 1 (and the identity fields: start time, `image`,
 * `pidns`; the start time as krexd reads it, in the initial pid and time
 * namespaces, whatever /proc and time namespace the caller has) and then the gate is read, so registration is serialized with
 * closure exactly like a submission (paper §4.2: "later arrivals must wait
 * for the gate to reopen").  A registrant that finds the gate closed by a
 * sibling has put no work on the GPU yet, so it acknowledges that epoch
 * itself and parks until the reopen.  On return (>= 0, the slot index) the
 * registration has passed the gate: the caller must start its drainer and
 * krex_gate_leave() the call.  When every slot is taken it first reclaims
 * those of dead processes of its own pid namespace; -ENOSPC if none was,
 * -EINVAL for tenant 0. */
int krex_gate_register(const struct krex_gate *g, struct krex_tenant_mem *m, uint32_t tenant,
                       int32_t pid, uint64_t image, uint64_t pidns);

/* Reclaim the slots of `m` whose process (in pid namespace `pidns`) no
 * longer exists: DEAD, then FREE while the gate is open (never reassigned
 * during a region).  Returns how many. */
int krex_gate_reclaim_dead(const struct krex_gate *g, struct krex_tenant_mem *m, uint64_t pidns);

/* Retire the slots of `m` that `pid` (of pid namespace `pidns`) claimed
 * in an earlier program image: after an execve the process keeps its pid
 * but loses its drainer.  Call before the new image registers.  Returns
 * how many. */
int krex_gate_forget_pid(const struct krex_gate *g, struct krex_tenant_mem *m, int32_t pid,
                         uint64_t pidns);

/* The per-call protocol (paper §4.2 "increment, then check"): called around
 * every gated driver call.  krex_gate_enter() returns once the call may
 * proceed (gate open, or held by this tenant); it parks on the gate's futex
 * while a sibling holds it.  krex_gate_leave() decrements and wakes a
 * drainer waiting for zero. */
void krex_gate_enter(const struct krex_gate *g, struct krex_slot *s, uint32_t tenant);
void krex_gate_leave(struct krex_slot *s);

/* One non-blocking attempt: 1 when admitted (the caller must leave), 0 when
 * a sibling holds the gate (the increment has been retracted). */
int krex_gate_try_enter(const struct krex_gate *g, struct krex_slot *s, uint32_t tenant);

/* Exit (docs/design/shim.md "Exit"): once this process has synchronized
 * at exit and every later gated call of it synchronizes before leaving,
 * turn its own slot `s` (ACTIVE, owned by `pid`, in its tenant's slot
 * memory) EXITING and wake a coordinator waiting on it (a closed gate's
 * epoch is acknowledged: the exit synchronization covers it).  0, or
 * -ESTALE when the slot is no longer so owned. */
int krex_gate_mark_exiting(const struct krex_gate *g, struct krex_slot *s, int32_t pid);

/* krex_gate_leave() for a call that has synchronized the process's work
 * after the driver call (an EXITING slot is drained when its count is
 * zero, without an acknowledgement; the coordinator polls such a slot). */
void krex_gate_leave_exiting(struct krex_slot *s);

/* Drainer side: wait until the gate sequence differs from `seen`
 * (futex wait, timeout_ns < 0 for none).  Returns the new sequence. */
uint32_t krex_gate_wait_seq(const struct krex_gate *g, uint32_t seen, int64_t timeout_ns);

/* Drainer side: wait until s->inflight == 0 (spin briefly, then park). */
void krex_gate_wait_idle(struct krex_slot *s);

/* Drainer side: publish an acknowledgement of `epoch` in the process's own
 * slot and wake the coordinator (which waits on ack_epoch). */
void krex_gate_ack(struct krex_slot *s, uint32_t epoch);

#ifdef __cplusplus
}
#endif
#endif /* KREX_GATE_H */
