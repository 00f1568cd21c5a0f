/*
 * base.h — the tenant library's base layer (base.c): the CUDA declarations
 * every unit sees, attributes, logging and the clock.  Includes nothing of
 * the shim; every other unit of tenant/ builds on it.  Internal, hidden.
 */
#ifndef KREX_BASE_H
#define KREX_BASE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

/* Declare every exported ABI under its own name: the legacy ones (cuda.h
 * keeps them under __CUDA_API_VERSION_INTERNAL) and the _ptsz/_ptds ones
 * (the per-thread macros are on in that mode).  A name in the shim then
 * means exactly the exported symbol of that name. */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define KREX_HOOK __attribute__((visibility("default")))
#define KREX_EXPORT __attribute__((visibility("default")))
#define KREX_LIKELY(x) __builtin_expect(!!(x), 1)
#define KREX_UNLIKELY(x) __builtin_expect(!!(x), 0)
/* The per-call fast path is inlined into every hook, whatever the
 * compiler's size heuristics say (hundreds of hooks made GCC out-line it,
 * adding calls to each gated call). */
#define KREX_ALWAYS_INLINE inline __attribute__((always_inline))

/* ---- logging (stderr; level from KREX_SHIM_LOG, read once at init) ------ */

enum { KREX_LOG_ERROR = 0, KREX_LOG_WARN = 1, KREX_LOG_INFO = 2, KREX_LOG_DEBUG = 3 };
extern int krex_log_level;
/* Set krex_log_level from KREX_SHIM_LOG = debug|info|warn|error (default
 * warn); called once, at initialisation. */
void krex_log_init(void);
void krex_log_write(int level, const char *func, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define krex_log(level, ...)                                                   \
    do {                                                                       \
        if ((level) <= krex_log_level)                                         \
            krex_log_write((level), __func__, __VA_ARGS__);                    \
    } while (0)

/* ---- time ----------------------------------------------------------------- */

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t krex_now_ns(void);

#endif /* KREX_BASE_H */
