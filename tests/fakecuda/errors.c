/*
 * errors.c — cuGetErrorName and cuGetErrorString.  Like the real driver,
 * they work before cuInit and answer CUDA_ERROR_INVALID_VALUE with a NULL
 * string for a code that is not a CUresult.
 */
#include "errors.h"

#include "fakecuda.h"

static const struct fc_error_desc *find(CUresult error)
{
    for (size_t i = 0; i < fc_nerrors; i++)
        if (fc_errors[i].code == error)
            return &fc_errors[i];
    return NULL;
}

FC_API CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    FC_ENTRY();
    if (pStr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    const struct fc_error_desc *d = find(error);
    *pStr = d ? d->name : NULL;
    return d ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FC_API CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    FC_ENTRY();
    if (pStr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    const struct fc_error_desc *d = find(error);
    *pStr = d ? d->description : NULL;
    return d ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
