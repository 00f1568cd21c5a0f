/*
 * fakecuda.h — internals of the fake libcuda.so.1 used by krex's tests.
 *
 * The fake driver exports a subset of the CUDA driver API with the real
 * prototypes of cuda.h (built with __CUDA_API_VERSION_INTERNAL so every
 * versioned and per-thread export name is declared, as for the real
 * driver).  It simulates a GPU without threads (tests/fakecuda/README.md
 * "The simulated GPU"):
 *
 *   - each stream has a `tail`, the CLOCK_MONOTONIC time (ns) at which the
 *     last work enqueued on it ends; work enqueued at host time t starts at
 *     max(t, tail, legacy-default-stream dependencies) and ends `duration`
 *     later (simgpu.c);
 *   - a kernel's duration in ns is its first argument
 *     (`*(uint64_t *)kernelParams[0]`, launch.c);
 *   - synchronizing sleeps until the relevant tail (clock_nanosleep, no
 *     spinning); queries compare the clock with the tail;
 *   - every kernel, memset and copy is appended as one line to the file
 *     named by KREX_FAKE_TIMELINE (simgpu.c, format in README.md);
 *   - device memory (memory.c) is counted against a per-GPU capacity shared
 *     by all processes through a small mmap'd state file (memshare.c), which
 *     also holds each process's checkpoint-lock state (checkpoint.c: every
 *     exported function starts with FC_ENTRY()) and its recent GPU
 *     activity (activity.c); share.h has its layout.
 *
 * All driver state of a process is guarded by one mutex, fc.mu.  Calls that
 * wait (synchronize, a full launch queue) compute their deadline under the
 * lock and sleep without it.
 */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#include <cuda.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Marks the functions exported from libcuda.so.1 (everything else is hidden
 * by -fvisibility=hidden, so an entry point not implemented is not exported). */
#define FC_API __attribute__((visibility("default")))

#define FC_DRIVER_VERSION 13000 /* cuDriverGetVersion: CUDA 13.0 */
#define FC_MAX_GPUS 16          /* KREX_FAKE_GPUS upper bound */
#define FC_CTX_STACK_MAX 32     /* depth of a thread's context stack */
#define FC_VIS_LAYERS 2         /* visibility variables applied in turn (fc.vis_env) */
#define FC_QUEUE_DEPTH 1024     /* pending operations per stream before a launch blocks */
#define FC_L2_BYTES (50u * 1024u * 1024u) /* reported L2 cache size (H100/H200 class) */
#define FC_DEFAULT_MEM_BYTES (80ull << 30) /* KREX_FAKE_MEM_BYTES default: 80 GiB */
/* Modelled bandwidths in bytes per ns (1 TB/s on the device, 50 GB/s host link). */
#define FC_DEVICE_BYTES_PER_NS 1000u
#define FC_HOST_BYTES_PER_NS 50u
/* Longest kernel accepted (1000 s): a larger "duration" is almost surely a
 * pointer passed by a real kernel, not a duration kernel. */
#define FC_MAX_KERNEL_NS 1000000000000ull

/* Object tags: a handle whose tag does not match is CUDA_ERROR_INVALID_HANDLE. */
enum fc_magic {
    FC_MAGIC_CTX = 0x78744366u,    /* "fCtx" */
    FC_MAGIC_STREAM = 0x6d745366u, /* "fStm" */
    FC_MAGIC_EVENT = 0x74764566u,  /* "fEvt" */
    FC_MAGIC_MODULE = 0x646f4d66u, /* "fMod" */
    FC_MAGIC_LIBRARY = 0x62694c66u, /* "fLib" */
    FC_MAGIC_FUNC = 0x6e754666u,   /* "fFun" */
    FC_MAGIC_KERNEL = 0x6e724b66u, /* "fKrn" */
    FC_MAGIC_GRAPH = 0x70724766u,  /* "fGrp" */
    FC_MAGIC_EXEC = 0x63784566u,   /* "fExc" */
};

/* Timeline kinds (one letter in the timeline line). */
enum fc_kind {
    FC_KIND_KERNEL = 'K',
    FC_KIND_MEMSET = 'S',
    FC_KIND_COPY = 'C',
    FC_KIND_GRAPH_KERNEL = 'G',
};

/* A memset or copy's effect on (host-backed) device memory; applied when the
 * operation is enqueued, or when a graph holding it is launched. */
enum fc_dataop_kind { FC_OP_NONE = 0, FC_OP_COPY, FC_OP_SET };
struct fc_dataop {
    enum fc_dataop_kind kind;
    void *dst;
    const void *src;    /* FC_OP_COPY */
    size_t count;       /* elements */
    unsigned int elem;  /* element size in bytes: 1 or 4 (memset), 1 (copy) */
    uint32_t value;     /* FC_OP_SET */
    bool dst_device;    /* re-validated at graph replay */
    bool src_device;
};

/* One captured operation of a graph, replayed in order by cuGraphLaunch. */
struct fc_node {
    enum fc_kind kind;  /* timeline kind at replay: G, S or C */
    uint64_t duration_ns;
    struct fc_dataop op;
};

enum fc_stream_kind {
    FC_STREAM_CREATED = 0, /* cuStreamCreate[WithPriority] */
    FC_STREAM_LEGACY,      /* the context's legacy default stream (NULL / CU_STREAM_LEGACY) */
    FC_STREAM_PER_THREAD,  /* a thread's per-thread default stream */
};

/* A stream capture sequence (origin stream plus the streams that joined it
 * through cuStreamWaitEvent on an event recorded in the capture). */
struct fc_capture {
    uint64_t id;
    CUstreamCaptureMode mode;
    pthread_t thread;          /* the thread that began the capture */
    bool invalidated;          /* an unsafe call broke it: EndCapture returns 901 */
    struct CUstream_st *origin;
    struct CUgraph_st *graph;  /* operations captured so far */
};

struct CUctx_st {
    uint32_t magic;
    bool alive;                /* false once destroyed (or primary and released/reset) */
    bool primary;
    int device;                /* visible ordinal */
    unsigned int flags;
    unsigned int refcount;     /* primary contexts: cuDevicePrimaryCtxRetain count */
    uint64_t id;
    struct CUstream_st *legacy;
    struct CUstream_st *streams;   /* every live stream of the context, legacy included */
    uint64_t retired_tail_ns;      /* latest end of work on destroyed streams */
    uint64_t retired_blocking_tail_ns; /* same, blocking streams only */
};

struct CUstream_st {
    uint32_t magic;
    bool alive;
    enum fc_stream_kind kind;
    unsigned int flags;        /* CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING */
    int priority;
    uint64_t id;               /* timeline stream id: 0 for legacy streams */
    pthread_t owner;           /* FC_STREAM_PER_THREAD: its thread */
    struct CUctx_st *ctx;
    uint64_t tail_ns;          /* end of the last work enqueued (CLOCK_MONOTONIC ns) */
    uint32_t pend_head;        /* ring of end times of work not yet finished */
    uint32_t pend_count;
    uint64_t pend[FC_QUEUE_DEPTH];
    struct fc_capture *capture; /* capture this stream takes part in, or NULL */
    struct CUstream_st *next;  /* in ctx->streams */
    struct CUstream_st *next_free;
};

struct CUevent_st {
    uint32_t magic;
    bool alive;
    unsigned int flags;        /* CU_EVENT_* creation flags */
    struct CUctx_st *ctx;
    bool recorded;             /* recorded outside capture at least once */
    uint64_t time_ns;          /* when the recorded point completes on the device */
    uint64_t capture_id;       /* nonzero: last recorded inside this capture */
    struct CUevent_st *next_free;
};

struct CUmod_st {
    uint32_t magic;
    bool alive;
    struct CUfunc_st *funcs;   /* functions handed out, one per name */
};

struct CUlib_st {
    uint32_t magic;
    bool alive;
    struct CUkern_st *kernels; /* kernels handed out, one per name */
};

struct CUfunc_st {
    uint32_t magic;
    struct CUfunc_st *next;    /* in the owning module's or kernel's list */
    char name[128];
};

struct CUkern_st {
    uint32_t magic;
    struct CUfunc_st func;     /* the function cuKernelGetFunction returns */
    struct CUkern_st *next;
};

struct CUgraph_st {
    uint32_t magic;
    struct fc_node *nodes;
    size_t count;
    size_t cap;
};

struct CUgraphExec_st {
    uint32_t magic;
    struct fc_node *nodes;
    size_t count;
};

/* Process-wide driver state (init.c). */
struct fc_state {
    pthread_mutex_t mu;
    _Atomic int ready;         /* 1 once cuInit succeeded (release/acquire) */
    bool init_called;
    CUresult init_result;
    int ndev;                  /* visible devices */
    int phys[FC_MAX_GPUS];     /* visible ordinal -> simulated GPU index */
    int nphys;                 /* KREX_FAKE_GPUS */
    uint64_t mem_bytes;        /* per-GPU capacity */
    uint64_t call_bytes;       /* KREX_FAKE_CALL_BYTES: free memory a call needs */
    int timeline_fd;           /* -1: no timeline */
    struct CUctx_st primary[FC_MAX_GPUS];
    uint64_t next_stream_id;
    uint64_t next_ctx_id;
    uint64_t next_capture_id;
    struct CUstream_st *free_streams;
    struct CUevent_st *free_events;
    _Atomic int sticky;        /* fatal error of this process's own fault (fault.c) */
    /* The variables naming the visible GPUs (read by the first cuInit): layer
     * i is the first set variable of the NULL-terminated list vis_env[i], and
     * picks from the GPUs the layer before left.  This driver: only
     * CUDA_VISIBLE_DEVICES; the fake HIP runtime linking this engine
     * (tests/fakehip) sets its own lists from a constructor, before any call. */
    const char *const *vis_env[FC_VIS_LAYERS];
    /* Set by the fake HIP runtime's constructor: a visibility entry may also
     * name a GPU in ROCr's form, as krexd names a simulated AMD GPU
     * (fc_uuid_rocr_text). */
    bool rocr_uuids;
};

extern struct fc_state fc;

/* init.c */
void fc_lock(void);
void fc_unlock(void);
CUresult fc_check_init(void);   /* CUDA_SUCCESS or CUDA_ERROR_NOT_INITIALIZED */
/* The 16 UUID bytes of simulated GPU `phys`, and their text form
 * "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (41 bytes with the NUL). */
#define FC_UUID_TEXT 41
void fc_uuid_bytes(int phys, char out[16]);
void fc_uuid_text(int phys, char out[FC_UUID_TEXT]);
/* ROCr's form of a GPU's name, "GPU-" and 16 hex digits: krexd's simulated
 * AMD GPU `phys` ("krexfak" in ASCII, then the index byte; krexd.hardware.inventory
 * fake_amd_uuid). */
void fc_uuid_rocr_text(int phys, char out[FC_UUID_TEXT]);

/* simgpu.c: the simulated device */
uint64_t fc_now_ns(void);
void fc_sleep_until(uint64_t t_ns);
/* Enqueue `duration_ns` of work on s (fc.mu held; may drop and retake it
 * while the stream's queue is full).  Sets *start_ns and *end_ns. */
CUresult fc_enqueue(struct CUstream_st *s, uint64_t duration_ns, uint64_t *start_ns,
                    uint64_t *end_ns);
/* Append one timeline line (no-op without KREX_FAKE_TIMELINE). */
void fc_timeline_write(uint64_t stream_id, enum fc_kind kind, uint64_t start_ns,
                       uint64_t end_ns, bool captured);
CUresult fc_timeline_open(const char *path);

/* context.c */
CUresult fc_current_ctx(struct CUctx_st **out);
CUresult fc_check_ctx(struct CUctx_st *ctx);
uint64_t fc_ctx_tail(const struct CUctx_st *ctx);
CUresult fc_ctx_activate(struct CUctx_st *ctx, int device, unsigned int flags, bool primary);
void fc_ctx_teardown(struct CUctx_st *ctx);

/* stream.c */
/* Resolve a stream handle as a call of the legacy (`per_thread` false) or
 * per-thread (_ptsz/_ptds) family sees it; needs a current context for the
 * special handles NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD. */
CUresult fc_stream_resolve(CUstream h, bool per_thread, struct CUstream_st **out);
struct CUstream_st *fc_stream_new(struct CUctx_st *ctx, enum fc_stream_kind kind,
                                  unsigned int flags, int priority);
void fc_stream_retire(struct CUstream_st *s);
/* Submit one operation on a resolved stream: captured into the stream's
 * graph when it is capturing, else enqueued, applied and written to the
 * timeline.  `op` may be NULL. */
CUresult fc_submit(struct CUstream_st *s, enum fc_kind kind, uint64_t duration_ns,
                   const struct fc_dataop *op);

/* graph.c */
struct CUgraph_st *fc_graph_new(void);
void fc_graph_free(struct CUgraph_st *g);
CUresult fc_graph_append(struct CUgraph_st *g, const struct fc_node *node);

/* capture.c */
CUresult fc_capture_add(struct fc_capture *cap, enum fc_kind kind, uint64_t duration_ns,
                        const struct fc_dataop *op);
/* Checks made by calls that are unsafe during a capture (rules in capture.c):
 * return CUDA_SUCCESS, or the error after invalidating the captures broken. */
CUresult fc_capture_check_sync(struct CUctx_st *ctx, struct CUstream_st *target);
CUresult fc_capture_check_ctx_sync(struct CUctx_st *ctx);
CUresult fc_capture_check_legacy(struct CUctx_st *ctx);
void fc_capture_end_all(struct CUctx_st *ctx);
void fc_capture_join(struct CUstream_st *s, uint64_t capture_id);
/* A stream being destroyed leaves its capture (ending it if it began it). */
void fc_capture_leave(struct CUstream_st *s);

/* memshare.c: the per-GPU capacity shared by processes through the state file */
CUresult fc_share_open(const char *path);
/* Count `bytes` against GPU `gpu` (simulated index) for this process; false
 * when the GPU is full even after reclaiming dead processes' usage. */
bool fc_share_reserve(int gpu, uint64_t bytes);
void fc_share_release(int gpu, uint64_t bytes);
uint64_t fc_share_used(int gpu);  /* bytes in use by all processes */
/* A context of this process on GPU `gpu` (simulated index) was created
 * (+1) or torn down (-1): the state file's context mask follows. */
void fc_share_ctx(int gpu, int delta);
void fc_share_exit(void);
void fc_share_atfork_child(void);
/* cuInit: this process's record in the state file (shared with any other
 * copy of the driver loaded in the process). */
void fc_share_attach(void);
/* cuInit mapped a modelled MPS server file: the record says the process is
 * an MPS client (which cuCheckpointProcessLock refuses). */
void fc_share_mark_mps(void);

/* activity.c: an operation enqueued for execution on simulated GPU `gpu`
 * (not captured work); recorded for krexd and the checkpoint lock. */
void fc_activity_note(int gpu, uint64_t start_ns, uint64_t end_ns);

/* checkpoint.c: the entry check of every exported function.  FC_ENTRY(); is
 * the first statement of each FC_API function (test_fakecuda_checkpoint.py
 * checks the sources): while the process is locked by
 * cuCheckpointProcessLock the call sleeps, and from entry to return it
 * counts as in progress, which the lock waits to drain. */
void *fc_gate_enter(void);
void fc_gate_leave(void **token);
#define FC_ENTRY()                                                                     \
    void *fc_entry_token_ __attribute__((cleanup(fc_gate_leave), unused)) = fc_gate_enter()

/* fault.c: fatal faults and the modelled MPS server (KREX_FAKE_MPS) */
CUresult fc_mps_open(void);
bool fc_fault_kernel(const char *name);    /* a "krex_fault*" function */
void fc_fault_raise(int phys);              /* its launch: sticky error from now on */
CUresult fc_fault_sticky(void);             /* CUDA_SUCCESS or the sticky error */
CUresult fc_mps_join(int phys);             /* a context on `phys`: 807 while its server is faulted */

/* memory.c */
/* Validate [p, p+bytes) lies inside one allocation. */
bool fc_mem_valid(const void *p, size_t bytes);
void fc_mem_release_ctx(const struct CUctx_st *ctx);
void fc_dataop_apply(const struct fc_dataop *op);
void fc_mem_atfork_child(void);
/* A call that needs device memory of its own (a context, a module image, a
 * launch's local memory, a graph upload, page tables of a mapping, pinned
 * staging): CUDA_ERROR_OUT_OF_MEMORY when simulated GPU `gpu` has less than
 * fc.call_bytes free (fc.mu held or not; nothing stays reserved). */
CUresult fc_mem_working(int gpu);
/* The simulated GPU of the calling thread's current context (0 without one). */
int fc_current_gpu(void);

#endif /* FAKECUDA_H */
