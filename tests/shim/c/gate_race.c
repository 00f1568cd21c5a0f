/*
 * gate_race — one gate operation on the test variant of the gate library
 * (libkrex_gate_test.so, pause points compiled in; libkrex_shim/testhook.h),
 * so a test can stop it between two statements and run a competing
 * operation at exactly that moment.
 *
 * usage: gate_race GATE OP [ARGS]
 *   reclaim                        krex_gate_reclaim_dead
 *   forget PID                     krex_gate_forget_pid
 *   reopen HOLDER EPOCH            krex_gate_reopen
 *   drain HOLDER EPOCH TIMEOUT_MS  krex_gate_wait_drained
 *   register TENANT                krex_gate_register for this process, then
 *                                  leave the admitted call and wait for
 *                                  stdin to close (a live registrant)
 *
 * Prints "rc N" (the operation's return value) on stdout.
 */
#define _GNU_SOURCE
#include "krex_gate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: gate_race GATE OP [ARGS]\n");
        return 2;
    }
    struct krex_gate *g = krex_gate_open(argv[1], 0, 0, 0, 0);
    if (!g) {
        perror("gate_race: open gate");
        return 1;
    }
    const char *op = argv[2];
    long rc;
    if (!strcmp(op, "reclaim")) {
        rc = krex_gate_reclaim_dead(g);
    } else if (!strcmp(op, "forget") && argc == 4) {
        rc = krex_gate_forget_pid(g, (int32_t)atoi(argv[3]));
    } else if (!strcmp(op, "reopen") && argc == 5) {
        rc = krex_gate_reopen(g, (uint32_t)atoi(argv[3]), (uint32_t)atoi(argv[4]));
    } else if (!strcmp(op, "drain") && argc == 6) {
        rc = krex_gate_wait_drained(g, (uint32_t)atoi(argv[3]), (uint32_t)atoi(argv[4]),
                                    atoll(argv[5]) * 1000000LL, NULL, NULL);
    } else if (!strcmp(op, "register") && argc == 4) {
        rc = krex_gate_register(g, (uint32_t)atoi(argv[3]), getpid());
        if (rc >= 0)
            krex_gate_leave(g, &g->slots[rc]);
        printf("rc %ld\n", rc);
        fflush(stdout);
        char buf[64];
        while (read(STDIN_FILENO, buf, sizeof buf) > 0)
            ;
        return 0;
    } else {
        fprintf(stderr, "gate_race: bad operation\n");
        return 2;
    }
    printf("rc %ld\n", rc);
    return 0;
}
