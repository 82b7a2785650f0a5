/* Internal helpers shared by the library's C and CUDA sources. Not installed. */
#ifndef CONVPOOL_INTERNAL_H
#define CONVPOOL_INTERNAL_H

#include "convpool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Records a printf-style message as this thread's last error and returns status. */
convpool_status convpool_fail(convpool_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Validates the problem (a copy: the caller's struct is not touched) and the pointers
 * every forward needs: x, weight, pooled non-NULL; bias non-NULL when out is. On success
 * *valid holds the problem with its derived fields. */
convpool_status convpool_check_forward_args(const convpool_problem *p, const void *x,
                                            const void *weight, const void *bias,
                                            const void *pooled, const void *out,
                                            convpool_problem *valid);

/* Flat offsets, 64-bit. */
static inline int64_t convpool_x_offset(const convpool_problem *p, int64_t b, int64_t ci,
                                        int64_t d, int64_t h, int64_t w)
{
    return (((b * p->in_channels + ci) * p->in_d + d) * p->in_h + h) * p->in_w + w;
}

static inline int64_t convpool_w_offset(const convpool_problem *p, int64_t co, int64_t ci,
                                        int64_t kd, int64_t kh, int64_t kw)
{
    return (((co * p->in_channels + ci) * p->kernel_d + kd) * p->kernel_h + kh) * p->kernel_w + kw;
}

static inline int64_t convpool_pooled_count(const convpool_problem *p)
{
    return p->pooled_d * p->pooled_h * p->pooled_w;
}

#ifdef __cplusplus
}
#endif

#endif /* CONVPOOL_INTERNAL_H */
