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

/* Validates the problem (a copy: the caller's struct is not touched) into *valid, and that x
 * and weight are not NULL: what every forward and backward needs first. */
convpool_status convpool_check_inputs(const convpool_problem *p, const void *x, const void *weight,
                                      convpool_problem *valid);

/* Validates the problem (a copy: the caller's struct is not touched) and the pointers
 * every forward needs: x, weight, pooled non-NULL; bias non-NULL when out is. On success
 * *valid holds the problem with its derived fields. */
convpool_status convpool_check_forward_args(const convpool_problem *p, const void *x,
                                            const void *weight, const void *bias,
                                            const void *pooled, const void *out,
                                            convpool_problem *valid);

/* A buffer a forward call reads or writes: name (for the message), address, length in bytes
 * as count * elem_size (saturating, so a huge count cannot wrap). NULL or empty spans are
 * skipped. */
typedef struct convpool_span {
    const char *name;
    const void *ptr;
    int64_t count;
    int64_t elem_size;
} convpool_span;

/* CONVPOOL_ERR_INVALID_ARGUMENT naming both buffers when an output overlaps an input or
 * another output (the kernels read inputs after writing outputs, so any overlap silently gives
 * garbage). Inputs may overlap each other. */
convpool_status convpool_check_overlap(const convpool_span *outputs, int n_outputs, const convpool_span *inputs,
                                       int n_inputs);

/* The overlap check of a forward call: inputs x (x_elem_size bytes an element), weight,
 * conv_bias, bias (read only when out is given; param_elem_size bytes an element, as out);
 * outputs the training forward's codes (or NULL), pooled (float32), out and the workspace. */
convpool_status convpool_check_forward_overlap(const convpool_problem *q, const void *x, int64_t x_elem_size,
                                               const void *weight, const void *conv_bias, const void *bias,
                                               int64_t param_elem_size, const void *pooled, const void *out,
                                               const void *codes, const void *workspace, int64_t workspace_bytes);

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

/* Training codes (convpool_code_bytes wide): element i of codes, read and written. */
static inline uint32_t convpool_code_at(const void *codes, int width, int64_t i)
{
    return width == 1 ? ((const uint8_t *)codes)[i]
         : width == 2 ? ((const uint16_t *)codes)[i]
                      : ((const uint32_t *)codes)[i];
}
static inline void convpool_code_store(void *codes, int width, int64_t i, uint32_t code)
{
    if (width == 1)
        ((uint8_t *)codes)[i] = (uint8_t)code;
    else if (width == 2)
        ((uint16_t *)codes)[i] = (uint16_t)code;
    else
        ((uint32_t *)codes)[i] = code;
}

/* Training codes are at most 32 bits wide: a window may hold at most this many positions. */
#define CONVPOOL_CODE_WINDOW_MAX ((int64_t)1 << 32)

/* CONVPOOL_ERR_INVALID_ARGUMENT naming pool_d, pool_h and pool_w when a window of the validated
 * problem q has more positions than a code can name (the codes would wrap): every entry that
 * writes or reads codes calls it before it touches a buffer. */
convpool_status convpool_check_code_window(const convpool_problem *q);

/* The checks both conv-tail entries of each device make (convpool_tail_train_{cpu,cuda}: in = y,
 * out = m; convpool_tail_backward_{cpu,cuda}, backward 1: in = grad_m, out = grad_y): the problem
 * valid (*valid, as convpool_check_inputs), dtype one of convpool_dtype, codes, in and out not
 * NULL, a window a code can name, and no output overlapping an input or another output. *elem
 * is the bytes of one element of dtype. (problem.c) */
convpool_status convpool_check_tail(const convpool_problem *p, convpool_dtype dtype, int backward, const void *codes,
                                    const void *in, const void *out, convpool_problem *valid, int64_t *elem);

/* The checks every CPU codes and backward entry adds to convpool_check_inputs: codes given,
 * threads >= 0 (0 = all cores), as convpool_forward_cpu asks. */
convpool_status convpool_check_codes_threads(const void *codes, int threads);

/* The threads a CPU call starts for `threads` (0: OpenMP's default), at most
 * convpool_forward_cpu's cap (the processors OpenMP may use, within its thread limit and 1024)
 * and at most `items`; at least 1. (cpu.c) */
int64_t convpool_cpu_threads(int threads, int64_t items);

#ifdef __cplusplus
}
#endif

#endif /* CONVPOOL_INTERNAL_H */
