/* CUDA runtime checks shared by the GPU tests; include only where CONVPOOL_HAVE_CUDA is set. */
#ifndef CONVPOOL_CHECK_CUDA_H
#define CONVPOOL_CHECK_CUDA_H

#include "check.h"

#include <cuda_runtime_api.h>

/* Records a failed CUDA call as a test failure (quoting it) and returns 0; 1 on success. */
static inline int cuda_ok_at(cudaError_t e, const char *expr, const char *file, int line)
{
    if (e == cudaSuccess)
        return 1;
    check_fail(file, line, expr, "CUDA error %s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
    return 0;
}
#define CUDA_OK(call) cuda_ok_at((call), #call, __FILE__, __LINE__)

#endif /* CONVPOOL_CHECK_CUDA_H */
