/*
 * hiptrack.h — what a drain must synchronize of a process's HIP work
 * (hiptrack.c): the devices it used, its streams, the events recorded just
 * before its captures began; the HIP side of the capture count and lock
 * (track.c's, shared with CUDA).  Handles are `void *` (the table's ABI
 * types: no HIP header).  Internal, hidden.
 */
#ifndef KREX_HIPTRACK_H
#define KREX_HIPTRACK_H

#include "state.h"

/* ---- observations (the HIP hooks, hip_classes.toml [observe]) ------------- */

/* Set once this thread's current device has been noted (its first gated
 * HIP call, or hipSetDevice). */
extern __thread int krex_hip_thread_noted __attribute__((tls_model("initial-exec")));
void krex_hip_note_thread_device(void);

/* Before each gated HIP call: a thread's first notes its current device
 * (HIP's work goes to it), one thread-local load after that. */
static KREX_ALWAYS_INLINE void krex_hip_thread_check(void)
{
    if (KREX_UNLIKELY(!krex_hip_thread_noted))
        krex_hip_note_thread_device();
}

void krex_hip_note_device(int r, int device);
void krex_hip_note_stream_created(int r, void *pstream);
void krex_hip_note_stream_destroying(void *stream);
/* Before a capture begins on `stream`: an event recorded there marks the
 * work queued before it. */
void krex_hip_capture_begin_pre(void *stream);
void krex_hip_note_capture_begin(int r);
/* After hipStreamEndCapture: the capture count, then the capture lock its
 * pre-call hook took is released. */
void krex_hip_note_capture_end(int r);

/* Is `stream` capturing (spt: the per-thread family, where NULL names this
 * thread's per-thread stream)?  Through the real runtime. */
int krex_hip_stream_capturing(void *stream, int spt);

/* ---- what the drainer synchronizes (hipdrain.c) --------------------------- */

/* The devices noted (bit d: device d; bit 63 also stands for every device
 * above 62). */
uint64_t krex_hip_devices(void);

struct krex_hip_tracked {
    void *h;    /* a stream, or an event recorded before a capture */
    int device; /* its device */
};

/* Copies taken under the tracking lock (malloc'd; NULL with *n = 0 when
 * empty; *oom set when the copy could not be made): the streams, and the
 * pre-capture events. */
struct krex_hip_tracked *krex_hip_stream_snapshot(size_t *n, int *oom);
struct krex_hip_tracked *krex_hip_precap_snapshot(size_t *n, int *oom);
/* Claim a stream (or a pre-capture event: precap != 0) for one
 * synchronization: 0 when gone since the snapshot.  A destroy of the
 * stream waits until krex_hip_unclaim(). */
int krex_hip_claim(void *h, int precap);
void krex_hip_unclaim(void);

void krex_hip_track_atfork_prepare(void);
void krex_hip_track_atfork_parent(void);
void krex_hip_track_atfork_child(void);

#endif /* KREX_HIPTRACK_H */
