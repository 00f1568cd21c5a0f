/*
 * gate_tenant — a tenant process for the gate protocol tests, without any
 * driver: it registers in a gate, runs a drainer thread like the shim's
 * (minus the context synchronization) and makes "calls" from worker
 * threads through krex_gate_enter/leave.
 *
 * usage: gate_tenant GATE SLOTS TENANT STATS [options]
 *   GATE is the gate file (mapped read-only), SLOTS the tenant's slot
 *   memory (a path such as /proc/<pid>/fd/<n>, as the shim's KREX_SLOTS)
 *   --threads K      submitting threads (default 1)
 *   --call-us U      each call busy-waits a random 0..U µs (default 20)
 *   --gap-us G       pause between a thread's calls, random 0..G µs (default 0)
 *   --calls N        calls per thread, 0 = until killed (default 0)
 *   --stuck          one more thread enters a call and never leaves
 *   --no-ack         the drainer never acknowledges
 *   --exec           after registering, exec this program again (same
 *                    arguments minus --exec): the new image forgets the slot
 *                    of the old one, as the shim does at start
 *
 * STATS is a file this program maps and updates (struct stats below, all
 * little-endian u64): calls started (after enter returned), calls finished
 * (before leave), the slot index, drains acknowledged, a ready flag, slots
 * forgotten at start.  The tests read it while the program runs.
 */
#define _GNU_SOURCE
#include "krex_gate.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct stats {
    _Atomic uint64_t started;
    _Atomic uint64_t finished;
    _Atomic uint64_t slot;
    _Atomic uint64_t acks;
    _Atomic uint64_t ready;
    _Atomic uint64_t forgotten;
};

static const struct krex_gate *g;
static struct krex_tenant_mem *m;
static struct krex_slot *slot;
static uint32_t tenant;
static struct stats *st;
static unsigned call_us = 20, gap_us = 0;
static unsigned long calls = 0;
static int no_ack;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void spin_us(unsigned us)
{
    uint64_t end = now_ns() + (uint64_t)us * 1000u;
    while (now_ns() < end)
        ;
}

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg * 7919u + (unsigned)getpid();
    for (unsigned long i = 0; calls == 0 || i < calls; i++) {
        krex_gate_enter(g, slot, tenant);
        atomic_fetch_add(&st->started, 1);
        if (call_us)
            spin_us((unsigned)rand_r(&seed) % (call_us + 1));
        atomic_fetch_add(&st->finished, 1);
        krex_gate_leave(slot);
        if (gap_us)
            usleep((unsigned)rand_r(&seed) % (gap_us + 1));
    }
    return NULL;
}

static void *stuck(void *arg)
{
    (void)arg;
    krex_gate_enter(g, slot, tenant);
    for (;;)
        pause();
    return NULL;
}

/* The shim's drainer loop without the driver. */
static void *drainer(void *arg)
{
    (void)arg;
    for (;;) {
        uint32_t seen = atomic_load(&g->seq);
        uint64_t w = atomic_load(&g->word);
        uint32_t epoch = krex_gate_epoch(w);
        if (w && krex_gate_holder(w) != tenant && atomic_load(&slot->ack_epoch) != epoch &&
            !no_ack) {
            krex_gate_wait_idle(slot);
            krex_gate_ack(slot, epoch);
            atomic_fetch_add(&st->acks, 1);
        }
        krex_gate_wait_seq(g, seen, -1);
    }
    return NULL;
}

static void die(const char *what)
{
    fprintf(stderr, "gate_tenant: %s: %s\n", what, strerror(errno));
    exit(1);
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: gate_tenant GATE SLOTS TENANT STATS [options]\n");
        return 2;
    }
    tenant = (uint32_t)strtoul(argv[3], NULL, 10);
    int threads = 1, want_stuck = 0, want_exec = 0;
    for (int i = 5; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--call-us") && i + 1 < argc)
            call_us = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--gap-us") && i + 1 < argc)
            gap_us = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--calls") && i + 1 < argc)
            calls = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--stuck"))
            want_stuck = 1;
        else if (!strcmp(argv[i], "--no-ack"))
            no_ack = 1;
        else if (!strcmp(argv[i], "--exec"))
            want_exec = 1;
        else {
            fprintf(stderr, "gate_tenant: bad argument %s\n", argv[i]);
            return 2;
        }
    }
    int fd = open(argv[4], O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, sizeof *st) != 0)
        die("stats file");
    st = mmap(NULL, sizeof *st, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (st == MAP_FAILED)
        die("mmap stats");
    int gfd = open(argv[1], O_RDONLY | O_CLOEXEC);
    g = gfd >= 0 ? krex_gate_map(gfd) : NULL;
    if (!g)
        die("map gate");
    close(gfd);
    int sfd = open(argv[2], O_RDWR | O_CLOEXEC);
    m = sfd >= 0 ? krex_tenant_mem_map(sfd, tenant) : NULL;
    if (!m)
        die("map slot memory");
    close(sfd);
    struct stat ns;
    uint64_t pidns = stat("/proc/self/ns/pid", &ns) == 0 ? (uint64_t)ns.st_ino : 0;
    /* As the shim at start: slots of an earlier image of this process. */
    int forgotten = krex_gate_forget_pid(g, m, getpid(), pidns);
    atomic_fetch_add(&st->forgotten, (uint64_t)(forgotten > 0 ? forgotten : 0));

    /* No shim mapping to show krexd: image 0 (tests that need krexd's
     * verification use the real shim). */
    int idx = krex_gate_register(g, m, tenant, getpid(), 0, pidns);
    if (idx < 0) {
        errno = -idx;
        die("register");
    }
    slot = &m->slots[idx];
    atomic_store(&st->slot, (uint64_t)idx);
    if (want_exec) {
        char *args[32];
        int n = 0;
        for (int i = 0; i < argc && n < 31; i++)
            if (strcmp(argv[i], "--exec"))
                args[n++] = argv[i];
        args[n] = NULL;
        execv("/proc/self/exe", args);
        die("execv");
    }
    pthread_t t;
    if (pthread_create(&t, NULL, drainer, NULL) != 0)
        die("drainer");
    krex_gate_leave(slot); /* the registration's admitted call */
    pthread_t w[64];
    if (threads > 64)
        threads = 64;
    for (int i = 0; i < threads; i++)
        if (pthread_create(&w[i], NULL, worker, (void *)(uintptr_t)i) != 0)
            die("worker");
    if (want_stuck && pthread_create(&t, NULL, stuck, NULL) != 0)
        die("stuck");
    atomic_store(&st->ready, 1);
    for (int i = 0; i < threads; i++)
        pthread_join(w[i], NULL);
    while (want_stuck) /* the stuck call keeps the process alive */
        pause();
    return 0;
}
