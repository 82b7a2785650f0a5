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

/* The factors of the checked products, and the caller-set field each one is blamed on. */
enum { F_BATCH, F_CIN, F_COUT, F_IN_D, F_IN_H, F_IN_W, F_KD, F_KH, F_KW, F_CONV_D, F_CONV_H, F_CONV_W, F_COUNT };
static const char *const factor_name[F_COUNT] = {"batch", "in_channels", "out_channels", "in_d", "in_h", "in_w",
                                                 "kernel_d", "kernel_h", "kernel_w", "conv_d", "conv_h", "conv_w"};
static const int factor_field[F_COUNT] = {F_BATCH, F_CIN, F_COUT, F_IN_D, F_IN_H, F_IN_W,
                                          F_KD, F_KH, F_KW, F_IN_D, F_IN_H, F_IN_W};

/* "in_w (1099511627776) is too large: the multiply-add count batch 1 * ... overflows int64":
 * the largest factor is the one blamed (first named, so the CLI names its flag). */
static convpool_status overflow_fail(const char *what, const int *idx, int n, const int64_t *val)
{
    int big = idx[0];
    for (int k = 1; k < n; ++k)
        if (val[idx[k]] > val[big])
            big = idx[k];
    char expr[512] = "";
    size_t used = 0;
    for (int k = 0; k < n && used < sizeof expr; ++k)
        used += (size_t)snprintf(expr + used, sizeof expr - used, "%s%s %lld", k ? " * " : "",
                                 factor_name[idx[k]], (long long)val[idx[k]]);
    const int field = factor_field[big];
    return convpool_fail(CONVPOOL_ERR_OVERFLOW, "%s (%lld) is too large: the %s %s overflows int64",
                         factor_name[field], (long long)val[field], what, expr);
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

    /* Each element count, then the multiply-add count, must fit in int64. The message blames
     * the largest factor (a conv extent blames its input extent) and lists every factor. */
    const struct {
        const char *what;
        int n;
        int idx[9];
    } products[] = {
        {"x element count", 5, {F_BATCH, F_CIN, F_IN_D, F_IN_H, F_IN_W}},
        {"weight element count", 5, {F_COUT, F_CIN, F_KD, F_KH, F_KW}},
        {"conv output element count", 5, {F_BATCH, F_COUT, F_CONV_D, F_CONV_H, F_CONV_W}},
        {"multiply-add count", 9, {F_BATCH, F_COUT, F_CONV_D, F_CONV_H, F_CONV_W, F_CIN, F_KD, F_KH, F_KW}},
    };
    const int64_t val[F_COUNT] = {p->batch, p->in_channels, p->out_channels, p->in_d, p->in_h, p->in_w,
                                  p->kernel_d, p->kernel_h, p->kernel_w, conv[0], conv[1], conv[2]};
    for (size_t i = 0; i < sizeof products / sizeof products[0]; ++i) {
        int64_t f[9];
        for (int k = 0; k < products[i].n; ++k)
            f[k] = val[products[i].idx[k]];
        int64_t n;
        if (!product_ok(f, products[i].n, &n))
            return overflow_fail(products[i].what, products[i].idx, products[i].n, val);
    }

    p->conv_d = conv[0];
    p->conv_h = conv[1];
    p->conv_w = conv[2];
    p->pooled_d = conv[0] / pool[0];
    p->pooled_h = conv[1] / pool[1];
    p->pooled_w = conv[2] / pool[2];
    return CONVPOOL_OK;
}

/* The product of n positive factors, or -1 when one is not positive or it overflows int64
 * (the element counts of a problem that was never validated). */
static int64_t numel_or_sentinel(const int64_t *f, int n)
{
    for (int i = 0; i < n; ++i)
        if (f[i] <= 0)
            return -1;
    int64_t r;
    return product_ok(f, n, &r) ? r : -1;
}

int64_t convpool_x_numel(const convpool_problem *p)
{
    if (!p)
        return -1;
    const int64_t f[5] = {p->batch, p->in_channels, p->in_d, p->in_h, p->in_w};
    return numel_or_sentinel(f, 5);
}

int convpool_code_bytes(const convpool_problem *p)
{
    if (!p)
        return 0;
    const double n = (double)p->pool_d * (double)p->pool_h * (double)p->pool_w;
    return n <= 256.0 ? 1 : n <= 65536.0 ? 2 : 4;
}

convpool_status convpool_check_code_window(const convpool_problem *q)
{
    const double n = (double)q->pool_d * (double)q->pool_h * (double)q->pool_w;
    if (n > (double)CONVPOOL_CODE_WINDOW_MAX)
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT,
                             "pool_d * pool_h * pool_w = %lld * %lld * %lld is %.17g window positions, more than "
                             "the 2^32 a training code can name",
                             (long long)q->pool_d, (long long)q->pool_h, (long long)q->pool_w, n);
    return CONVPOOL_OK;
}

convpool_status convpool_codes_size(const convpool_problem *p, size_t *bytes)
{
    if (!p)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "problem is NULL");
    if (!bytes)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "bytes is NULL");
    convpool_problem q = *p;
    convpool_status s = convpool_problem_validate(&q);
    if (s != CONVPOOL_OK)
        return s;
    s = convpool_check_code_window(&q);
    if (s != CONVPOOL_OK)
        return s;
    const double n = (double)q.batch * (double)q.out_channels * (double)convpool_pooled_count(&q) *
                     (double)convpool_code_bytes(&q);
    if (n > 9.0e18)
        return convpool_fail(CONVPOOL_ERR_OVERFLOW, "the codes' size overflows");
    *bytes = (size_t)(q.batch * q.out_channels * convpool_pooled_count(&q) * convpool_code_bytes(&q));
    return CONVPOOL_OK;
}

int64_t convpool_weight_numel(const convpool_problem *p)
{
    if (!p)
        return -1;
    const int64_t f[5] = {p->out_channels, p->in_channels, p->kernel_d, p->kernel_h, p->kernel_w};
    return numel_or_sentinel(f, 5);
}

double convpool_problem_flops(const convpool_problem *p)
{
    return 2.0 * (double)p->batch * (double)p->out_channels * (double)p->conv_d *
           (double)p->conv_h * (double)p->conv_w * (double)p->in_channels *
           (double)p->kernel_d * (double)p->kernel_h * (double)p->kernel_w;
}

convpool_status convpool_check_inputs(const convpool_problem *p, const void *x, const void *weight,
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
    *valid = q;
    return CONVPOOL_OK;
}

convpool_status convpool_check_forward_args(const convpool_problem *p, const void *x,
                                            const void *weight, const void *bias,
                                            const void *pooled, const void *out,
                                            convpool_problem *valid)
{
    convpool_problem q;
    const convpool_status s = convpool_check_inputs(p, x, weight, &q);
    if (s != CONVPOOL_OK)
        return s;
    if (!pooled)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "pooled is NULL");
    if (out && !bias)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "bias is NULL but out is requested");
    *valid = q;
    return CONVPOOL_OK;
}

/* [begin, end) of a span, saturating at the top of the address space. */
static void span_range(const convpool_span *s, uintptr_t *begin, uintptr_t *end)
{
    *begin = (uintptr_t)s->ptr;
    uintptr_t bytes = UINTPTR_MAX;
    if (s->count >= 0 && s->elem_size > 0 && (uintmax_t)s->count <= UINTPTR_MAX / (uintmax_t)s->elem_size)
        bytes = (uintptr_t)s->count * (uintptr_t)s->elem_size;
    *end = bytes > UINTPTR_MAX - *begin ? UINTPTR_MAX : *begin + bytes;
}

static int spans_overlap(const convpool_span *a, const convpool_span *b)
{
    if (!a->ptr || !b->ptr || a->count <= 0 || b->count <= 0)
        return 0;
    uintptr_t a0, a1, b0, b1;
    span_range(a, &a0, &a1);
    span_range(b, &b0, &b1);
    return a0 < b1 && b0 < a1;
}

convpool_status convpool_check_overlap(const convpool_span *outputs, int n_outputs, const convpool_span *inputs,
                                       int n_inputs)
{
    for (int i = 0; i < n_outputs; ++i) {
        for (int j = 0; j < n_inputs; ++j)
            if (spans_overlap(&outputs[i], &inputs[j]))
                return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT,
                                     "%s and %s overlap in memory: an output must not share memory with an "
                                     "input",
                                     outputs[i].name, inputs[j].name);
        for (int j = i + 1; j < n_outputs; ++j)
            if (spans_overlap(&outputs[i], &outputs[j]))
                return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT,
                                     "%s and %s overlap in memory: outputs must not share memory",
                                     outputs[i].name, outputs[j].name);
    }
    return CONVPOOL_OK;
}

convpool_status convpool_check_forward_overlap(const convpool_problem *q, const void *x, int64_t x_elem_size,
                                               const void *weight, const void *conv_bias, const void *bias,
                                               int64_t param_elem_size, const void *pooled, const void *out,
                                               const void *codes, const void *workspace, int64_t workspace_bytes)
{
    const convpool_span in[4] = {
        {"x", x, convpool_x_numel(q), x_elem_size},
        {"weight", weight, convpool_weight_numel(q), param_elem_size},
        {"conv_bias", conv_bias, q->out_channels, param_elem_size},
        {"bias", out ? bias : NULL, q->out_channels, param_elem_size},
    };
    const convpool_span outs[4] = {
        {"codes", codes, q->batch * q->out_channels * convpool_pooled_count(q), convpool_code_bytes(q)},
        {"pooled", pooled, q->batch * q->out_channels, 4},
        {"out", out, q->batch, param_elem_size},
        {"workspace", workspace, workspace_bytes, 1},
    };
    return convpool_check_overlap(outs, 4, in, 4);
}

convpool_status convpool_check_tail(const convpool_problem *p, convpool_dtype dtype, int backward, const void *codes,
                                    const void *in, const void *out, convpool_problem *valid, int64_t *elem)
{
    if (!p)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "problem is NULL");
    convpool_problem q = *p;
    convpool_status s = convpool_problem_validate(&q);
    if (s != CONVPOOL_OK)
        return s;
    if (dtype != CONVPOOL_DTYPE_F32 && dtype != CONVPOOL_DTYPE_F16 && dtype != CONVPOOL_DTYPE_BF16)
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "dtype must be F32 (0), F16 (1) or BF16 (2), got %d",
                             (int)dtype);
    const char *in_name = backward ? "grad_m" : "y", *out_name = backward ? "grad_y" : "m";
    if (!codes)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "codes is NULL");
    if (!in)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "%s is NULL", in_name);
    if (!out)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "%s is NULL", out_name);
    s = convpool_check_code_window(&q);
    if (s != CONVPOOL_OK)
        return s;
    const int64_t e = dtype == CONVPOOL_DTYPE_F32 ? 4 : 2, width = convpool_code_bytes(&q);
    const int64_t bc = q.batch * q.out_channels, windows = bc * convpool_pooled_count(&q);
    const int64_t ys = bc * q.conv_d * q.conv_h * q.conv_w;
    const convpool_span code_span = {"codes", codes, windows, width};
    if (backward) {
        const convpool_span ins[2] = {code_span, {"grad_m", in, windows, e}};
        const convpool_span outs[1] = {{"grad_y", out, ys, e}};
        s = convpool_check_overlap(outs, 1, ins, 2);
    } else {
        const convpool_span ins[1] = {{"y", in, ys, e}};
        const convpool_span outs[2] = {{"m", out, windows, e}, code_span};
        s = convpool_check_overlap(outs, 2, ins, 1);
    }
    if (s != CONVPOOL_OK)
        return s;
    *valid = q;
    *elem = e;
    return CONVPOOL_OK;
}
