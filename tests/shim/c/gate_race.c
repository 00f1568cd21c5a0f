/*
 * gate_race — one tenant-side gate operation on the test variant of the
 * gate library (libkrex_gate_test.so, pause points compiled in;
 * libkrex_shim/gate/testhook.h), so a test can stop it between two statements
 * and run a competing operation at exactly that moment.
 *
 * usage: gate_race GATE SLOTS TENANT OP [ARGS]
 *   reclaim         krex_gate_reclaim_dead on the tenant's slot memory
 *   reclaim-loop    the same, over and over until stdin closes
 *   forget PID      krex_gate_forget_pid
 *   register        krex_gate_register for this process, then leave the
 *                   admitted call and wait for stdin to close (a live
 *                   registrant)
 *
 * GATE is mapped read-only, SLOTS (the tenant's slot memory, e.g.
 * /proc/<pid>/fd/<n>) read-write.  Prints "rc N" (the operation's return
 * value) on stdout.
 */
#define _GNU_SOURCE
#include "krex_gate.h"

#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void wait_stdin(void)
{
    char buf[64];
    while (read(STDIN_FILENO, buf, sizeof buf) > 0)
        ;
}

static int stdin_closed(void)
{
    struct pollfd p = {STDIN_FILENO, POLLIN, 0};
    char buf[64];
    return poll(&p, 1, 0) > 0 && read(STDIN_FILENO, buf, sizeof buf) <= 0;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: gate_race GATE SLOTS TENANT OP [ARGS]\n");
        return 2;
    }
    uint32_t tenant = (uint32_t)atoi(argv[3]);
    int gfd = open(argv[1], O_RDONLY | O_CLOEXEC), sfd = open(argv[2], O_RDWR | O_CLOEXEC);
    const struct krex_gate *g = gfd >= 0 ? krex_gate_map(gfd) : NULL;
    struct krex_tenant_mem *m = sfd >= 0 ? krex_tenant_mem_map(sfd, tenant) : NULL;
    if (!g || !m) {
        perror("gate_race: map");
        return 1;
    }
    struct stat st;
    uint64_t pidns = stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
    const char *op = argv[4];
    long rc;
    if (!strcmp(op, "reclaim")) {
        rc = krex_gate_reclaim_dead(g, m, pidns);
    } else if (!strcmp(op, "reclaim-loop")) {
        rc = 0;
        while (!stdin_closed())
            rc += krex_gate_reclaim_dead(g, m, pidns);
    } else if (!strcmp(op, "forget") && argc == 6) {
        rc = krex_gate_forget_pid(g, m, (int32_t)atoi(argv[5]), pidns);
    } else if (!strcmp(op, "register")) {
        rc = krex_gate_register(g, m, tenant, getpid(), 0, pidns);
        if (rc >= 0)
            krex_gate_leave(&m->slots[rc]);
        printf("rc %ld\n", rc);
        fflush(stdout);
        wait_stdin();
        return 0;
    } else {
        fprintf(stderr, "gate_race: bad operation\n");
        return 2;
    }
    printf("rc %ld\n", rc);
    return 0;
}
