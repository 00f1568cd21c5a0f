/*
 * fakelock — drives the checkpoint lock of another process from this one,
 * as krexd does: cuInit only (no context), then the steps in order.
 *
 * usage: fakelock STEP...
 *   lock PID [TIMEOUT_MS]   cuCheckpointProcessLock (timeout 0 or none: no limit)
 *   unlock PID              cuCheckpointProcessUnlock
 *   state PID               cuCheckpointProcessGetState
 *   sleep MS                sleep (to hold a lock between two steps)
 * One JSON line per step:
 *   {"op": "lock", "pid": 123, "result": "CUDA_SUCCESS", "rc": 0,
 *    "start_ns": ..., "end_ns": ..., "elapsed_ms": 12.5}
 * ("result" is the cuGetErrorName of the CUresult, e.g. "CUDA_ERROR_NOT_READY" for a
 * lock whose timeout passed, "CUDA_ERROR_NOT_SUPPORTED" for an MPS client; "?" for
 * an unnamed code; `state` adds "state": "RUNNING" | "LOCKED" | ...; times are
 * CLOCK_MONOTONIC).
 * Exit status: 0 when every step returned CUDA_SUCCESS, 1 when one did not,
 * 2 on bad usage or when cuInit fails.
 */
#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static bool number(const char *s, long *out)
{
    char *end = NULL;
    if (s == NULL || *s == '\0')
        return false;
    *out = strtol(s, &end, 10);
    return *end == '\0' && *out >= 0;
}

static const char *state_name(CUprocessState st)
{
    switch (st) {
    case CU_PROCESS_STATE_RUNNING: return "RUNNING";
    case CU_PROCESS_STATE_LOCKED: return "LOCKED";
    case CU_PROCESS_STATE_CHECKPOINTED: return "CHECKPOINTED";
    case CU_PROCESS_STATE_FAILED: return "FAILED";
    }
    return "?";
}

/* Run the step at argv[*i] (advancing *i past it); -1 on bad usage. */
static int step(int argc, char **argv, int *i)
{
    const char *op = argv[(*i)++];
    long pid = 0, arg = 0;
    if (*i >= argc || !number(argv[(*i)++], &pid))
        return -1;
    if (!strcmp(op, "sleep")) {
        struct timespec ts = {.tv_sec = pid / 1000, .tv_nsec = (pid % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        return 0;
    }
    CUprocessState st = CU_PROCESS_STATE_FAILED;
    CUresult r;
    uint64_t t0 = now_ns();
    if (!strcmp(op, "lock")) {
        if (*i < argc && number(argv[*i], &arg))
            (*i)++;
        CUcheckpointLockArgs args = {.timeoutMs = (unsigned int)arg};
        r = cuCheckpointProcessLock((int)pid, &args);
    } else if (!strcmp(op, "unlock")) {
        CUcheckpointUnlockArgs args = {{0}};
        r = cuCheckpointProcessUnlock((int)pid, &args);
    } else if (!strcmp(op, "state")) {
        r = cuCheckpointProcessGetState((int)pid, &st);
    } else {
        return -1;
    }
    uint64_t t1 = now_ns();
    const char *name = NULL;
    if (cuGetErrorName(r, &name) != CUDA_SUCCESS)
        name = "?";
    printf("{\"op\": \"%s\", \"pid\": %ld, \"result\": \"%s\", \"rc\": %d, \"start_ns\": %llu, "
           "\"end_ns\": %llu, \"elapsed_ms\": %.3f",
           op, pid, name, (int)r, (unsigned long long)t0, (unsigned long long)t1,
           (double)(t1 - t0) / 1e6);
    if (!strcmp(op, "state") && r == CUDA_SUCCESS)
        printf(", \"state\": \"%s\"", state_name(st));
    printf("}\n");
    fflush(stdout);
    return r == CUDA_SUCCESS ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: fakelock {lock PID [TIMEOUT_MS] | unlock PID | state PID | "
                        "sleep MS}...\n");
        return 2;
    }
    CUresult r = cuInit(0);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "fakelock: cuInit: %d\n", (int)r);
        return 2;
    }
    int status = 0;
    for (int i = 1; i < argc;) {
        int s = step(argc, argv, &i);
        if (s < 0) {
            fprintf(stderr, "fakelock: bad step at '%s'\n", argv[i - 1]);
            return 2;
        }
        status |= s;
    }
    return status;
}
