/*
 * track.h — the contexts, streams and captures in use (track.c): the hooks'
 * observations that feed them, what the drainer synchronizes (drain.c),
 * and the capture lock.  Internal to libkrex_shim, not installed.
 */
#ifndef KREX_TRACK_H
#define KREX_TRACK_H

#include "state.h"

/* ---- observations (the hooks, classes.toml [observe]) --------------------- */

void krex_note_stream_created(CUresult r, CUstream *phStream);
void krex_note_stream_destroying(CUstream stream);
void krex_note_capture_begin(CUresult r);
/* Before a capture begins on `stream` (ptsz: the per-thread family): an
 * event recorded there marks the work queued before it. */
void krex_capture_begin_pre(CUstream stream, int ptsz);
void krex_note_capture_end(CUresult r);
void krex_note_ctx_created(CUresult r, CUcontext *pctx);
void krex_note_ctx_destroying(CUcontext ctx);
void krex_note_ctx_destroyed(CUresult r, CUcontext ctx);
void krex_note_green_created(CUresult r, CUgreenCtx *phCtx);
void krex_note_green_destroying(CUgreenCtx green);
void krex_note_ctx_current(CUresult r, CUcontext ctx);

/* What an upper layer keeps per context (the region's L2 flush buffers,
 * region.c) is forgotten through `fn`, called after a context is gone
 * (krex_note_ctx_destroyed, outside the tracking lock).  Set once at
 * initialisation by the process layer (shim.c). */
void krex_track_on_ctx_gone(void (*fn)(CUcontext ctx));

/* ---- captures and the capture lock ---------------------------------------- */

/* Stream captures open in this process. */
uint32_t krex_captures(void);
/* The capture lock: shared by uncounted passes into capturing streams
 * (KREX_CAPTURED, state.h), exclusive for cuStreamEndCapture (pre-call;
 * its post-call note, krex_note_capture_end, releases it). */
void krex_capture_pass_begin(void);
void krex_capture_pass_end(void);
void krex_capture_end_begin(void);

/* ---- what the drainer synchronizes (drain.c) ------------------------------ */

/* A tracked handle: a context (owner: the green context it was converted
 * from, or NULL) or a stream (owner: its context). */
struct krex_tracked {
    void *h;
    void *owner;
};

enum krex_track_list { KREX_TRACK_CTXS, KREX_TRACK_STREAMS };

/* A copy of the list taken under the tracking lock (malloc'd; NULL with
 * *n = 0 when empty; *oom set when the copy could not be made). */
struct krex_tracked *krex_track_snapshot(enum krex_track_list which, size_t *n, int *oom);

/* Claim tracked handle `h` of the list (a context's own legacy stream:
 * KREX_TRACK_CTXS with `ctx` == h) for one synchronization: 0 when it was
 * destroyed since the snapshot (skip it).  One claim at a time (the
 * synchronizations are serialized); krex_track_unclaim() ends it and lets
 * a destroy waiting for it go on. */
int krex_track_claim(enum krex_track_list which, void *h, void *ctx);
void krex_track_unclaim(void);

/* The events recorded just before captures began (krex_capture_begin_pre),
 * one per stream (and thread, for per-thread streams), each synchronized by
 * the drainer while a capture is open: a copy (malloc'd, *n entries). */
struct krex_precap {
    CUevent ev;
    CUstream stream;
    CUcontext ctx;
};
struct krex_precap *krex_precap_snapshot(size_t *n, int *oom);
/* Claim the event of entry `ev` for one synchronization (0: gone since the
 * snapshot); krex_track_unclaim() ends it. */
int krex_precap_claim(CUevent ev);

void krex_track_atfork_prepare(void);
void krex_track_atfork_parent(void);
void krex_track_atfork_child(void);

#endif /* KREX_TRACK_H */
