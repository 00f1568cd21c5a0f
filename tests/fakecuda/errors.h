/*
 * errors.h — the CUresult name and description table (errors.gen.c,
 * generated from cuda.h by tools/gen_errors.py).
 */
#ifndef FAKECUDA_ERRORS_H
#define FAKECUDA_ERRORS_H

#include <cuda.h>
#include <stddef.h>

struct fc_error_desc {
    CUresult code;
    const char *name;        /* cuGetErrorName */
    const char *description; /* cuGetErrorString */
};

extern const struct fc_error_desc fc_errors[];
extern const size_t fc_nerrors;

#endif /* FAKECUDA_ERRORS_H */
