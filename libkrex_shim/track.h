/*
 * track.h — what the drainer synchronizes (track.c), for drain.c.  Internal
 * to libkrex_shim, not installed.
 */
#ifndef KREX_TRACK_H
#define KREX_TRACK_H

#include "shim.h"

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
