/*
 * fault.c — fatal GPU faults, and a modelled MPS server that spreads them.
 *
 * A kernel whose function name starts with "krex_fault" is an
 * illegal-address kernel: its launch succeeds (launches are asynchronous)
 * and from then on every call of the process that checks the driver state
 * (fc_check_init) returns CUDA_ERROR_ILLEGAL_ADDRESS: the error is sticky,
 * the process must end.  Without MPS nobody else notices.
 *
 * KREX_FAKE_MPS=1 models one MPS server per simulated GPU, shared by every
 * process that maps the same server file: a fatal fault in one client is
 * returned to every client of that GPU at its next call, until the server
 * is restarted.  The server file is
 *   $CUDA_MPS_PIPE_DIRECTORY/fakecuda-mps-server   (krexd gives each tenant
 *       its GPU's MPS pipe folder; tests/mps/fake-mps-control removes the
 *       file when it starts a control daemon: a restart heals the server),
 *   else KREX_FAKE_MPS_STATE; with neither the process is no MPS client
 *   (as a real one that finds no control daemon) and only its own faults hit it.
 * A process becomes a client with its first context (refused with
 * CUDA_ERROR_DEVICE_UNAVAILABLE while the server is faulted, as the real
 * one on the H200 refuses new clients until the old ones are gone).  It keeps the file
 * it mapped at cuInit, so after a restart the old clients stay broken and
 * new ones are healthy.  For the checkpoint lock a process that mapped the
 * file is a client from cuInit on (FC_REC_MPS in its record, share.h):
 * cuCheckpointProcessLock refuses it with CUDA_ERROR_NOT_SUPPORTED, as the
 * real driver refuses a client of a real MPS daemon (checkpoint.c).
 * KREX_FAKE_MPS=log also appends the server's log line naming the faulting
 * client to $CUDA_MPS_LOG_DIRECTORY/server.log, in the form krexd parses
 * (docs/design/faults.md lists it as an assumption about the real server).
 */
#include "fakecuda.h"
#include "share.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FC_FAULT_PREFIX "krex_fault"

struct mps_server {
    _Atomic int32_t culprit[FC_MAX_GPUS]; /* pid whose kernel faulted; 0: healthy */
};

static struct mps_server *srv;
static bool srv_log;
static _Atomic int joined; /* 1 once a context made this process a client */

bool fc_fault_kernel(const char *name)
{
    return strncmp(name, FC_FAULT_PREFIX, sizeof FC_FAULT_PREFIX - 1) == 0;
}

CUresult fc_mps_open(void)
{
    const char *mode = getenv("KREX_FAKE_MPS");
    if (mode == NULL || *mode == '\0' || strcmp(mode, "0") == 0)
        return CUDA_SUCCESS;
    if (strcmp(mode, "1") != 0 && strcmp(mode, "log") != 0) {
        fprintf(stderr, "fakecuda: KREX_FAKE_MPS=%s: expected 0, 1 or log\n", mode);
        return CUDA_ERROR_INVALID_VALUE;
    }
    srv_log = strcmp(mode, "log") == 0;
    char path[4096];
    const char *pipe = getenv("CUDA_MPS_PIPE_DIRECTORY");
    const char *explicit_path = getenv("KREX_FAKE_MPS_STATE");
    if (pipe && *pipe)
        snprintf(path, sizeof path, "%s/fakecuda-mps-server", pipe);
    else if (explicit_path && *explicit_path)
        snprintf(path, sizeof path, "%s", explicit_path);
    else
        return CUDA_SUCCESS; /* no MPS server to reach */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0 || (fchmod(fd, 0666), 0) ||
        ftruncate(fd, (off_t)sizeof *srv) != 0) { /* grows a new file; never shrinks */
        fprintf(stderr, "fakecuda: MPS server file %s: %s\n", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    void *p = mmap(NULL, sizeof *srv, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        fprintf(stderr, "fakecuda: MPS server file %s: mmap: %s\n", path, strerror(errno));
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    srv = p;
    fc_share_mark_mps(); /* a client from cuInit on: the checkpoint lock refuses it */
    return CUDA_SUCCESS;
}

CUresult fc_fault_sticky(void)
{
    /* Relaxed loads: each word is a self-contained flag; a call racing
     * with the fault may go either way, as on the real device. */
    int own = atomic_load_explicit(&fc.sticky, memory_order_relaxed);
    if (own)
        return (CUresult)own;
    if (srv && atomic_load_explicit(&joined, memory_order_relaxed))
        for (int i = 0; i < fc.ndev; i++)
            if (atomic_load_explicit(&srv->culprit[fc.phys[i]], memory_order_relaxed) != 0)
                return CUDA_ERROR_ILLEGAL_ADDRESS;
    return CUDA_SUCCESS;
}

CUresult fc_mps_join(int phys)
{
    if (srv == NULL)
        return CUDA_SUCCESS;
    /* The real server refuses new clients while it recovers from a fault:
     * on the H200 (driver 580) with CUDA_ERROR_DEVICE_UNAVAILABLE. */
    if (atomic_load_explicit(&srv->culprit[phys], memory_order_relaxed) != 0)
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    atomic_store_explicit(&joined, 1, memory_order_relaxed); /* a flag; publishes nothing */
    return CUDA_SUCCESS;
}

static void log_fault(int pid)
{
    const char *dir = getenv("CUDA_MPS_LOG_DIRECTORY");
    if (!srv_log || dir == NULL || *dir == '\0')
        return;
    char path[4096], line[256], stamp[64];
    snprintf(path, sizeof path, "%s/server.log", dir);
    time_t now = time(NULL);
    struct tm tm;
    strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S.000", localtime_r(&now, &tm));
    /* The real server's wording (driver 580, H200): it names *a* client, not
     * necessarily the one whose kernel faulted, so krexd only detects from it. */
    int n = snprintf(line, sizeof line,
                     "[%s Server 1] Client {PID: %d, Context: 1} encountered a fatal GPU error.\n",
                     stamp, pid);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        if (write(fd, line, (size_t)n) != n)
            fprintf(stderr, "fakecuda: %s: short write\n", path);
        close(fd);
    }
}

void fc_fault_raise(int phys)
{
    atomic_store_explicit(&fc.sticky, (int)CUDA_ERROR_ILLEGAL_ADDRESS, memory_order_relaxed);
    if (srv == NULL)
        return;
    int32_t none = 0;
    /* Relaxed CAS: the first culprit wins; nothing else is published. */
    if (atomic_compare_exchange_strong_explicit(&srv->culprit[phys], &none, (int32_t)fc_self_pid(),
                                                memory_order_relaxed, memory_order_relaxed))
        log_fault((int)fc_self_pid());
}
