/* Problem description: construction, validation, derived sizes and error reporting. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#if defined(__cplusplus)
#define CONVPOOL_THREAD_LOCAL thread_local
#else
#define CONVPOOL_THREAD_LOCAL _Thread_local
#endif

static CONVPOOL_THREAD_LOCAL char last_error[512];

convpool_status convpool_fail(convpool_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

const char *convpool_last_error(void) { return last_error; }

const char *convpool_cuda_kernel_name(convpool_cuda_kernel kernel)
{
    switch (kernel) {
    case CONVPOOL_CUDA_KERNEL_K3P2: return "k3p2";
    case CONVPOOL_CUDA_KERNEL_GROUP: return "group";
    case CONVPOOL_CUDA_KERNEL_GENERAL: return "general";
    case CONVPOOL_CUDA_KERNEL_GENERIC: return "generic";
    }
    return "unknown";
}

const char *convpool_status_name(convpool_status s)
{
    switch (s) {
    case CONVPOOL_OK: return "CONVPOOL_OK";
    case CONVPOOL_ERR_NULL_POINTER: return "CONVPOOL_ERR_NULL_POINTER";
    case CONVPOOL_ERR_INVALID_SIZE: return "CONVPOOL_ERR_INVALID_SIZE";
    case CONVPOOL_ERR_INPUT_TOO_SMALL: return "CONVPOOL_ERR_INPUT_TOO_SMALL";
    case CONVPOOL_ERR_EMPTY_OUTPUT: return "CONVPOOL_ERR_EMPTY_OUTPUT";
    case CONVPOOL_ERR_OVERFLOW: return "CONVPOOL_ERR_OVERFLOW";
    case CONVPOOL_ERR_INVALID_ARGUMENT: return "CONVPOOL_ERR_INVALID_ARGUMENT";
    case CONVPOOL_ERR_OUT_OF_MEMORY: return "CONVPOOL_ERR_OUT_OF_MEMORY";
    case CONVPOOL_ERR_WORKSPACE: return "CONVPOOL_ERR_WORKSPACE";
    case CONVPOOL_ERR_UNSUPPORTED: return "CONVPOOL_ERR_UNSUPPORTED";
    case CONVPOOL_ERR_CUDA: return "CONVPOOL_ERR_CUDA";
    }
    return "CONVPOOL_ERR_UNKNOWN";
}

convpool_problem convpool_problem_make(int64_t batch, int64_t in_channels, int64_t out_channels,
                                       int64_t in_d, int64_t in_h, int64_t in_w,
                                       int64_t kernel_d, int64_t kernel_h, int64_t kernel_w,
                                       int64_t pool_d, int64_t pool_h, int64_t pool_w,
                                       double divisor)
{
    convpool_problem p;
    memset(&p, 0, sizeof p);
    p.batch = batch;
    p.in_channels = in_channels;
    p.out_channels = out_channels;
    p.in_d = in_d;
    p.in_h = in_h;
    p.in_w = in_w;
    p.kernel_d = kernel_d;
    p.kernel_h = kernel_h;
    p.kernel_w = kernel_w;
    p.pool_d = pool_d;
    p.pool_h = pool_h;
    p.pool_w = pool_w;
    p.divisor = divisor;
    return p;
}

convpool_problem convpool_problem_headline(void)
{
    return convpool_problem_make(128, 8, 16, 16, 64, 64, 3, 3, 3, 2, 2, 2, 2.0);
}

/* a * b into *r; returns 0 on int64 overflow (both operands positive here). */
static int mul_ok(int64_t a, int64_t b, int64_t *r)
{
    if (a > INT64_MAX / b)
        return 0;
    *r = a * b;
    return 1;
}

static int product_ok(const int64_t *f, int n, int64_t *r)
{
    int64_t acc = 1;
    for (int i = 0; i < n; ++i)
        if (!mul_ok(acc, f[i], &acc))
            return 0;
    *r = acc;
    return 1;
}

convpool_status convpool_problem_validate(convpool_problem *p)
{
    if (!p)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "problem is NULL");

    const struct { const char *name; int64_t v; } sizes[] = {
        {"batch", p->batch},       {"in_channels", p->in_channels}, {"out_channels", p->out_channels},
        {"in_d", p->in_d},         {"in_h", p->in_h},               {"in_w", p->in_w},
        {"kernel_d", p->kernel_d}, {"kernel_h", p->kernel_h},       {"kernel_w", p->kernel_w},
        {"pool_d", p->pool_d},     {"pool_h", p->pool_h},           {"pool_w", p->pool_w},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i)
        if (sizes[i].v <= 0)
            return convpool_fail(CONVPOOL_ERR_INVALID_SIZE, "%s must be positive, got %lld",
                                 sizes[i].name, (long long)sizes[i].v);

    const struct { const char *in, *k; int64_t iv, kv; } ext[] = {
        {"in_d", "kernel_d", p->in_d, p->kernel_d},
        {"in_h", "kernel_h", p->in_h, p->kernel_h},
        {"in_w", "kernel_w", p->in_w, p->kernel_w},
    };
    for (size_t i = 0; i < 3; ++i)
        if (ext[i].iv < ext[i].kv)
            return convpool_fail(CONVPOOL_ERR_INPUT_TOO_SMALL,
                                 "%s (%lld) is smaller than %s (%lld)", ext[i].in,
                                 (long long)ext[i].iv, ext[i].k, (long long)ext[i].kv);

    const int64_t conv[3] = {p->in_d - p->kernel_d + 1, p->in_h - p->kernel_h + 1,
                             p->in_w - p->kernel_w + 1};
    const int64_t pool[3] = {p->pool_d, p->pool_h, p->pool_w};
    const char *pool_name[3] = {"pool_d", "pool_h", "pool_w"};
    const char *conv_name[3] = {"conv_d", "conv_h", "conv_w"};
    for (int i = 0; i < 3; ++i)
        if (conv[i] / pool[i] == 0)
            return convpool_fail(CONVPOOL_ERR_EMPTY_OUTPUT,
                                 "%s (%lld) is larger than the conv output extent %s (%lld): "
                                 "the pooled output would be empty",
                                 pool_name[i], (long long)pool[i], conv_name[i], (long long)conv[i]);

    int64_t n;
    const int64_t xf[5] = {p->batch, p->in_channels, p->in_d, p->in_h, p->in_w};
    if (!product_ok(xf, 5, &n))
        return convpool_fail(CONVPOOL_ERR_OVERFLOW,
                             "x element count batch*in_channels*in_d*in_h*in_w overflows int64");
    const int64_t wf[5] = {p->out_channels, p->in_channels, p->kernel_d, p->kernel_h, p->kernel_w};
    if (!product_ok(wf, 5, &n))
        return convpool_fail(CONVPOOL_ERR_OVERFLOW,
                             "weight element count out_channels*in_channels*kernel_d*kernel_h*kernel_w "
                             "overflows int64");
    const int64_t yf[5] = {p->batch, p->out_channels, conv[0], conv[1], conv[2]};
    if (!product_ok(yf, 5, &n))
        return convpool_fail(CONVPOOL_ERR_OVERFLOW,
                             "conv output element count batch*out_channels*conv_d*conv_h*conv_w "
                             "overflows int64");
    /* Loop bounds and the FLOP count multiply the conv output by the taps per output. */
    int64_t taps, macs;
    if (!product_ok(wf + 1, 4, &taps) || !mul_ok(n, taps, &macs))
        return convpool_fail(CONVPOOL_ERR_OVERFLOW,
                             "multiply-add count (conv output elements * in_channels * kernel "
                             "volume) overflows int64");

    p->conv_d = conv[0];
    p->conv_h = conv[1];
    p->conv_w = conv[2];
    p->pooled_d = conv[0] / pool[0];
    p->pooled_h = conv[1] / pool[1];
    p->pooled_w = conv[2] / pool[2];
    return CONVPOOL_OK;
}

int64_t convpool_x_numel(const convpool_problem *p)
{
    return p->batch * p->in_channels * p->in_d * p->in_h * p->in_w;
}

int64_t convpool_weight_numel(const convpool_problem *p)
{
    return p->out_channels * p->in_channels * p->kernel_d * p->kernel_h * p->kernel_w;
}

double convpool_problem_flops(const convpool_problem *p)
{
    return 2.0 * (double)p->batch * (double)p->out_channels * (double)p->conv_d *
           (double)p->conv_h * (double)p->conv_w * (double)p->in_channels *
           (double)p->kernel_d * (double)p->kernel_h * (double)p->kernel_w;
}

convpool_status convpool_check_forward_args(const convpool_problem *p, const void *x,
                                            const void *weight, const void *bias,
                                            const void *pooled, const void *out,
                                            convpool_problem *valid)
{
    if (!p)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "problem is NULL");
    convpool_problem q = *p;
    convpool_status s = convpool_problem_validate(&q);
    if (s != CONVPOOL_OK)
        return s;
    if (!x)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "x is NULL");
    if (!weight)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "weight is NULL");
    if (!pooled)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "pooled is NULL");
    if (out && !bias)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "bias is NULL but out is requested");
    *valid = q;
    return CONVPOOL_OK;
}
