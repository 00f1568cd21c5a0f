/*
 * coord.c — krexd's half of the gate: the gate file, the tenants' slot
 * memories and what krexd reads of them (snapshots, audit).  The region
 * protocol's steps 2, 3 and 8 are coord_protocol.c; the shared half and the
 * tenant's are gate.c.  Built only into libkrex_gate.so, which krexd loads
 * through ctypes (krexd/gate/).  krexd alone writes the gate and never a
 * slot memory; it loops only over its own sizes and maps slot memory only
 * once sealed, and keeps its judgements of a slot's owner here, bound to
 * their ownership word (krex_coord_ignore): docs/design/shim.md "Who writes
 * what".
 */
#define _GNU_SOURCE
#include "coord_internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

/* No process has this many driver calls in flight at once. */
#define MAX_PLAUSIBLE_INFLIGHT (1u << 20)

/* ---- creation ------------------------------------------------------------- */

static int make_gate_file(const char *tmp, uint32_t mode, uint32_t gpu, struct krex_gate **out)
{
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -errno;
    int err = 0;
    /* fchmod: the requested mode exactly, whatever the umask.  The space
     * is reserved now (posix_fallocate returns the error number), so a
     * full file system fails here, at start, never as a SIGBUS later. */
    if (fchmod(fd, (mode_t)mode) != 0)
        err = errno;
    else
        err = posix_fallocate(fd, 0, (off_t)sizeof(struct krex_gate));
    void *p = MAP_FAILED;
    if (!err) {
        p = mmap(NULL, sizeof(struct krex_gate), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
            err = errno;
    }
    if (err) {
        close(fd);
        unlink(tmp);
        return -err;
    }
    struct krex_gate *g = p;
    memset(g, 0, sizeof *g); /* open gate, empty summary */
    g->version = KREX_GATE_VERSION;
    g->ntenants = KREX_GATE_MAX_TENANTS;
    g->gpu = gpu;
    g->magic = KREX_GATE_MAGIC;
    *out = g;
    return fd;
}

KREX_GATE_API struct krex_coord *krex_coord_create(const char *path, const char *keep,
                                                   uint32_t gpu, uint32_t mode)
{
    if (!path || (mode & ~07777u)) {
        errno = EINVAL;
        return NULL;
    }
    char tmp[4096];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    if (n < 0 || (size_t)n >= sizeof tmp) {
        errno = ENAMETOOLONG;
        return NULL;
    }
    struct krex_coord *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    struct krex_gate *g = NULL;
    int fd = make_gate_file(tmp, mode, gpu, &g);
    if (fd < 0) {
        free(c);
        errno = -fd;
        return NULL;
    }
    int err = 0;
    if (keep && ((unlink(keep) != 0 && errno != ENOENT) || link(tmp, keep) != 0))
        err = errno;
    /* Built completely before the rename makes it visible. */
    if (!err && rename(tmp, path) != 0)
        err = errno;
    if (err) {
        unlink(tmp);
        munmap(g, sizeof *g);
        close(fd);
        free(c);
        errno = err;
        return NULL;
    }
    c->g = g;
    c->fd = fd;
    c->gpu = gpu;
    pthread_rwlock_init(&c->mu, NULL);
    for (uint32_t i = 0; i < KREX_GATE_MAX_TENANTS; i++)
        c->t[i].fd = -1;
    return c;
}

/* Check an existing gate file krexd made before a restart: a regular file
 * owned by this process's user (root), writable by nobody else, of exactly
 * the layout's size (so the mapping never faults past its end), with the
 * magic, version and GPU (any for UINT32_MAX).  0 or -errno (-EPERM untrusted, -EPROTO layout). */
static int check_own_gate(int fd, uint32_t gpu, struct krex_gate **out)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return -errno;
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 0022))
        return -EPERM;
    if (st.st_size != (off_t)sizeof(struct krex_gate))
        return -EPROTO;
    void *p = mmap(NULL, sizeof(struct krex_gate), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return -errno;
    struct krex_gate *g = p;
    if (g->magic != KREX_GATE_MAGIC || g->version != KREX_GATE_VERSION ||
        (gpu != UINT32_MAX && g->gpu != gpu)) {
        munmap(p, sizeof *g);
        return -EPROTO;
    }
    *out = g;
    return 0;
}

KREX_GATE_API struct krex_coord *krex_coord_open(const char *path, const char *keep, uint32_t gpu)
{
    if (!path) {
        errno = EINVAL;
        return NULL;
    }
    /* The second link first: it lives in a directory only root writes, so
     * it names the file krexd made even if `path` was replaced meanwhile. */
    int fd = keep ? open(keep, O_RDWR | O_CLOEXEC | O_NOFOLLOW) : -1;
    if (fd < 0)
        fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return NULL;
    struct krex_gate *g = NULL;
    int r = check_own_gate(fd, gpu, &g);
    struct krex_coord *c = r ? NULL : calloc(1, sizeof *c);
    if (!c) {
        if (g)
            munmap(g, sizeof *g);
        close(fd);
        errno = r ? -r : ENOMEM;
        return NULL;
    }
    c->g = g;
    c->fd = fd;
    c->gpu = gpu;
    /* At least the epoch the gate holds (closed by the krexd before):
     * acknowledgements of it are honest.  krexd seeds the rest
     * (krex_coord_set_epoch). */
    uint32_t held = krex_gate_epoch(krex_gate_load_word(g));
    uint32_t closed = atomic_load_explicit(&g->last_epoch, memory_order_relaxed);
    /* The later of the two (mod 2^32): the word is 0 once reopened, the
     * header keeps the last epoch closed (version 9). */
    atomic_store_explicit(&c->last_epoch,
                          (uint32_t)(closed - held) - 1u < 0x7fffffffu ? closed : held,
                          memory_order_relaxed);
    pthread_rwlock_init(&c->mu, NULL);
    for (uint32_t i = 0; i < KREX_GATE_MAX_TENANTS; i++)
        c->t[i].fd = -1;
    /* The tenants' summary rows name tenants of the slot memories attached
     * before: cleared until each is attached again (relaxed: hints). */
    for (uint32_t i = 0; i < KREX_GATE_MAX_TENANTS; i++)
        atomic_store_explicit(&g->tenants[i].tenant, 0, memory_order_relaxed);
    return c;
}

static void drop(struct attached *a)
{
    if (a->m)
        munmap(a->m, sizeof *a->m);
    if (a->fd >= 0)
        close(a->fd);
    a->m = NULL;
    a->fd = -1;
    a->tenant = 0;
}

KREX_GATE_API void krex_coord_destroy(struct krex_coord *c)
{
    if (!c)
        return;
    for (uint32_t i = 0; i < KREX_GATE_MAX_TENANTS; i++)
        drop(&c->t[i]);
    munmap(c->g, sizeof *c->g);
    close(c->fd);
    pthread_rwlock_destroy(&c->mu);
    free(c);
}

KREX_GATE_API int krex_coord_fd(const struct krex_coord *c) { return c ? c->fd : -EINVAL; }

KREX_GATE_API int krex_coord_relink(struct krex_coord *c, const char *path, const char *keep)
{
    if (!c || !path)
        return -EINVAL;
    struct stat mine, st;
    if (fstat(c->fd, &mine) != 0)
        return -errno;
    if (stat(path, &st) == 0 && st.st_dev == mine.st_dev && st.st_ino == mine.st_ino)
        return 1;
    /* Removed or replaced: put our file back under its name, from the
     * second link in the private directory (an unlinked file cannot be
     * linked again from its fd). */
    if (!keep || stat(keep, &st) != 0)
        return -ENOENT;
    if (st.st_dev != mine.st_dev || st.st_ino != mine.st_ino)
        return -ESTALE;
    char tmp[4096];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    if (n < 0 || (size_t)n >= sizeof tmp)
        return -ENAMETOOLONG;
    unlink(tmp);
    if (link(keep, tmp) != 0)
        return -errno;
    if (rename(tmp, path) != 0) {
        int err = errno;
        unlink(tmp);
        return -err;
    }
    return 0;
}

/* ---- slot memories ----------------------------------------------------- */

static struct attached *find(struct krex_coord *c, uint32_t tenant)
{
    for (uint32_t i = 0; i < KREX_GATE_MAX_TENANTS; i++)
        if (c->t[i].tenant == tenant)
            return &c->t[i];
    return NULL;
}

KREX_GATE_API int krex_coord_attach(struct krex_coord *c, uint32_t tenant, int fd)
{
    if (!c || tenant == 0 || fd < 0)
        return -EINVAL;
    int r = krex_slot_fd_check(fd);
    if (r)
        return r;
    int mine = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (mine < 0)
        return -errno;
    void *p = mmap(NULL, sizeof(struct krex_tenant_mem), PROT_READ, MAP_SHARED, mine, 0);
    if (p == MAP_FAILED) {
        r = -errno;
        close(mine);
        return r;
    }
    struct krex_tenant_mem *m = p;
    if (m->magic != KREX_SLOTS_MAGIC || m->version != KREX_GATE_VERSION || m->tenant != tenant) {
        munmap(p, sizeof *m);
        close(mine);
        return -EPROTO;
    }
    pthread_rwlock_wrlock(&c->mu);
    struct attached *a = find(c, tenant) ? NULL : find(c, 0);
    r = find(c, tenant) ? -EEXIST : a ? 0 : -ENOSPC;
    if (a) {
        a->tenant = tenant;
        a->fd = mine;
        a->m = m;
        a->last_mem_seq = atomic_load_explicit(&m->mem_seq, memory_order_relaxed);
        for (uint32_t i = 0; i < KREX_TENANT_SLOTS; i++)
            atomic_store_explicit(&a->ignored[i], 0, memory_order_relaxed);
    }
    pthread_rwlock_unlock(&c->mu);
    if (r) {
        munmap(p, sizeof *m);
        close(mine);
    }
    return r;
}

KREX_GATE_API int krex_coord_detach(struct krex_coord *c, uint32_t tenant)
{
    if (!c || tenant == 0)
        return -EINVAL;
    pthread_rwlock_wrlock(&c->mu);
    struct attached *a = find(c, tenant);
    if (a) {
        struct krex_gate_tenant *row = &c->g->tenants[a - c->t];
        /* Relaxed: the summary is a hint the shims re-read. */
        atomic_store_explicit(&row->tenant, 0, memory_order_relaxed);
        atomic_store_explicit(&row->procs, 0, memory_order_relaxed);
        atomic_store_explicit(&row->holding, 0, memory_order_relaxed);
        atomic_store_explicit(&row->holding_waiting, 0, memory_order_relaxed);
        atomic_store_explicit(&row->mem_mib, 0, memory_order_relaxed);
        drop(a);
    }
    pthread_rwlock_unlock(&c->mu);
    return a ? 0 : -ENOENT;
}

KREX_GATE_API int krex_coord_ignore(struct krex_coord *c, uint32_t tenant, uint32_t index,
                                    uint64_t owner)
{
    if (!c || index >= KREX_TENANT_SLOTS || owner == 0)
        return -EINVAL;
    pthread_rwlock_rdlock(&c->mu);
    struct attached *a = find(c, tenant);
    /* Relaxed: a drain that misses it counts the slot once more. */
    if (a)
        atomic_store_explicit(&a->ignored[index], owner, memory_order_relaxed);
    pthread_rwlock_unlock(&c->mu);
    return a ? 0 : -ENOENT;
}

/* ---- status and audit -------------------------------------------------------- */

KREX_GATE_API int krex_coord_slots(const struct krex_coord *cc, struct krex_slot_info *out,
                                   uint32_t max)
{
    struct krex_coord *c = (struct krex_coord *)cc;
    if (!c || !out)
        return -EINVAL;
    uint32_t n = 0;
    pthread_rwlock_rdlock(&c->mu);
    for (uint32_t t = 0; t < KREX_GATE_MAX_TENANTS && n < max; t++) {
        struct attached *a = &c->t[t];
        if (a->tenant == 0)
            continue;
        for (uint32_t i = 0; i < KREX_TENANT_SLOTS && n < max; i++) {
            struct krex_slot_info info;
            krex_slot_snapshot(&a->m->slots[i], a->tenant, i, &info);
            if (info.state == KREX_SLOT_FREE && info.generation == 0)
                continue; /* never used */
            info.ignored = ignored(a, i, info.owner);
            out[n++] = info;
        }
    }
    pthread_rwlock_unlock(&c->mu);
    return (int)n;
}

struct tally {
    uint32_t procs, holding, holding_waiting;
    uint64_t mib;
};

static void note(struct krex_finding *out, uint32_t max, uint32_t *n, uint32_t tenant,
                 uint32_t kind, uint32_t index, uint32_t value)
{
    if (*n < max)
        out[*n] = (struct krex_finding){tenant, kind, index, value};
    (*n)++;
}

/* One slot of tenant `a`: findings and its part of the summary. */
static void audit_slot(struct attached *a, uint32_t i, uint32_t last, struct tally *tl,
                       struct krex_finding *out, uint32_t max, uint32_t *n)
{
    struct krex_slot *s = &a->m->slots[i];
    uint64_t o = krex_owner_load(s);
    uint32_t st = krex_owner_state(o);
    if (st > KREX_SLOT_EXITING) {
        note(out, max, n, a->tenant, KREX_BAD_STATE, i, st);
        return;
    }
    if (!krex_owner_registered(st) && st != KREX_SLOT_CLAIMING)
        return;
    uint32_t claimed = atomic_load_explicit(&s->tenant, memory_order_relaxed);
    uint32_t ack = atomic_load_explicit(&s->ack_epoch, memory_order_relaxed);
    uint32_t inflight = atomic_load_explicit(&s->inflight, memory_order_relaxed);
    if (krex_owner_registered(st) && claimed != a->tenant)
        note(out, max, n, a->tenant, KREX_BAD_TENANT, i, claimed);
    /* Ahead of the last epoch requested (mod 2^32): never requested. */
    if (ack != 0 && (last == 0 || (uint32_t)(ack - last) - 1u < 0x7fffffffu))
        note(out, max, n, a->tenant, KREX_BAD_ACK, i, ack);
    if ((inflight & KREX_INFLIGHT_COUNT) > MAX_PLAUSIBLE_INFLIGHT)
        note(out, max, n, a->tenant, KREX_BAD_INFLIGHT, i, inflight);
    /* An EXITING process still holds its memory. */
    if (!krex_owner_registered(st) || ignored(a, i, o))
        return;
    uint32_t mib = atomic_load_explicit(&s->mem_mib, memory_order_relaxed);
    uint32_t oom = atomic_load_explicit(&s->oom, memory_order_relaxed);
    tl->procs++;
    tl->mib += mib;
    if (mib) {
        tl->holding++;
        if (oom & KREX_OOM_WAITING)
            tl->holding_waiting++;
    }
}

static void publish(struct krex_gate_tenant *row, uint32_t tenant, const struct tally *tl)
{
    /* Relaxed: hints the shims re-read at least every 20 ms; nothing else
     * is published with them. */
    atomic_store_explicit(&row->procs, tl->procs, memory_order_relaxed);
    atomic_store_explicit(&row->holding, tl->holding, memory_order_relaxed);
    atomic_store_explicit(&row->holding_waiting, tl->holding_waiting, memory_order_relaxed);
    atomic_store_explicit(&row->mem_mib, tl->mib > UINT32_MAX ? UINT32_MAX : (uint32_t)tl->mib,
                          memory_order_relaxed);
    atomic_store_explicit(&row->tenant, tenant, memory_order_relaxed);
}

KREX_GATE_API int krex_coord_audit(struct krex_coord *c, struct krex_finding *out, uint32_t max)
{
    if (!c || (!out && max))
        return -EINVAL;
    uint32_t n = 0, last = krex_coord_epoch(c);
    int freed = 0;
    pthread_rwlock_rdlock(&c->mu);
    for (uint32_t t = 0; t < KREX_GATE_MAX_TENANTS; t++) {
        struct attached *a = &c->t[t];
        if (a->tenant == 0)
            continue;
        struct krex_tenant_mem *m = a->m;
        if (m->magic != KREX_SLOTS_MAGIC || m->version != KREX_GATE_VERSION ||
            m->tenant != a->tenant)
            note(out, max, &n, a->tenant, KREX_BAD_HEADER, 0, m->tenant);
        struct tally tl = {0};
        for (uint32_t i = 0; i < KREX_TENANT_SLOTS; i++)
            audit_slot(a, i, last, &tl, out, max, &n);
        publish(&c->g->tenants[t], a->tenant, &tl);
        /* Relaxed: a changed count only triggers a wake-up. */
        uint32_t seq = atomic_load_explicit(&m->mem_seq, memory_order_relaxed);
        if (seq != a->last_mem_seq) {
            a->last_mem_seq = seq; /* audits are serialized by krexd */
            freed = 1;
        }
    }
    pthread_rwlock_unlock(&c->mu);
    if (freed) {
        /* seq_cst: a waiter reads mem_seq, re-judges, then waits on the
         * value it read; this bump makes that wait return. */
        atomic_fetch_add_explicit(&c->g->mem_seq, 1, memory_order_seq_cst);
        krex_futex_wake_all(&c->g->mem_seq);
    }
    /* seq_cst RMW after the summary's stores: a shim that reads the new
     * value reads a summary at least this fresh.  A wake-up only when
     * someone waits would need a waiter count in the read-only gate:
     * the wake is one system call per audit, cheap without waiters. */
    atomic_fetch_add_explicit(&c->g->audit_seq, 1, memory_order_seq_cst);
    krex_futex_wake_all(&c->g->audit_seq);
    return (int)(n < max ? n : max);
}
