/*
 * THE REFERENCE: convpool_forward_reference, the oracle every other path is tested against.
 *
 * It computes the block literally and unfused, one (batch, channel) plane at a time:
 *   1. the whole conv plane, accumulated in double (x and weight promoted to double, + conv
 *      bias), then rounded to float: PyTorch's conv output is a float32 tensor,
 *   2. every element divided by the divisor in float32 arithmetic, as PyTorch divides a float32
 *      tensor (the exact quotient of two floats, rounded once to float: computing it in double
 *      and rounding gives the same float, since 53 >= 2 * 24 + 2 bits),
 *   3. max pooling (stride = window, floor mode) that propagates NaN as PyTorch does,
 *   4. the mean of the pooled plane in double, stored to pooled[b][c] as float,
 *   5. out[b] = sum over c of (mean + bias[c]), in double from the double means.
 *
 * Steps 1 and 2 model the two float32 roundings whose effect is not small: a conv value beyond
 * FLT_MAX is inf in PyTorch (and in the fused paths), and so is a quotient beyond it (a
 * subnormal divisor, say), where a double pipeline would give a finite number. PyTorch rounds
 * the Python divisor to float32 first (1e-50 becomes 0 and gives inf/NaN as PyTorch does).
 *
 * Plain loops, no threads, no tricks beyond a loop order (taps outside, the plane inside) that
 * keeps the inner loop contiguous. Only correctness matters here.
 */
#include "internal.h"

#include <math.h>
#include <stdlib.h>

/* conv plane [conv_d][conv_h][conv_w] of output channel c for batch item b. */
static void conv_plane(const convpool_problem *p, const float *x, const float *weight,
                       const float *conv_bias, int64_t b, int64_t c, double *plane)
{
    const int64_t n = p->conv_d * p->conv_h * p->conv_w;
    const double bias = conv_bias ? (double)conv_bias[c] : 0.0;
    for (int64_t i = 0; i < n; ++i)
        plane[i] = bias;

    for (int64_t ci = 0; ci < p->in_channels; ++ci)
        for (int64_t kd = 0; kd < p->kernel_d; ++kd)
            for (int64_t kh = 0; kh < p->kernel_h; ++kh)
                for (int64_t kw = 0; kw < p->kernel_w; ++kw) {
                    const double w = (double)weight[convpool_w_offset(p, c, ci, kd, kh, kw)];
                    for (int64_t d = 0; d < p->conv_d; ++d)
                        for (int64_t h = 0; h < p->conv_h; ++h) {
                            const float *xrow = x + convpool_x_offset(p, b, ci, d + kd, h + kh, kw);
                            double *prow = plane + (d * p->conv_h + h) * p->conv_w;
                            for (int64_t ow = 0; ow < p->conv_w; ++ow)
                                prow[ow] += w * (double)xrow[ow];
                        }
                }
}

/* Mean over pooled positions of max_pool3d(plane); a NaN anywhere in a window wins. */
static double pooled_mean(const convpool_problem *p, const double *plane)
{
    double sum = 0.0;
    for (int64_t pd = 0; pd < p->pooled_d; ++pd)
        for (int64_t ph = 0; ph < p->pooled_h; ++ph)
            for (int64_t pw = 0; pw < p->pooled_w; ++pw) {
                double m = -INFINITY;
                int first = 1;
                for (int64_t i = 0; i < p->pool_d; ++i)
                    for (int64_t j = 0; j < p->pool_h; ++j)
                        for (int64_t k = 0; k < p->pool_w; ++k) {
                            const int64_t d = pd * p->pool_d + i;
                            const int64_t h = ph * p->pool_h + j;
                            const int64_t w = pw * p->pool_w + k;
                            const double v = plane[(d * p->conv_h + h) * p->conv_w + w];
                            if (first || v > m || isnan(v))
                                m = v;
                            first = 0;
                        }
                sum += m;
            }
    return sum / (double)convpool_pooled_count(p);
}

convpool_status convpool_forward_reference(const convpool_problem *p, const float *x,
                                           const float *weight, const float *conv_bias,
                                           const float *bias, float *pooled, float *out)
{
    convpool_problem q;
    convpool_status s = convpool_check_forward_args(p, x, weight, bias, pooled, out, &q);
    if (s != CONVPOOL_OK)
        return s;
    s = convpool_check_forward_overlap(&q, x, 4, weight, conv_bias, bias, 4, pooled, out, NULL, NULL, 0);
    if (s != CONVPOOL_OK)
        return s;

    const int64_t plane_n = q.conv_d * q.conv_h * q.conv_w;
    if ((uint64_t)plane_n > SIZE_MAX / sizeof(double))
        return convpool_fail(CONVPOOL_ERR_OUT_OF_MEMORY,
                             "reference: conv plane of %lld doubles does not fit in memory",
                             (long long)plane_n);
    double *plane = (double *)malloc((size_t)plane_n * sizeof(double));
    if (!plane)
        return convpool_fail(CONVPOOL_ERR_OUT_OF_MEMORY,
                             "reference: cannot allocate the conv plane (%lld doubles)",
                             (long long)plane_n);

    const double divisor = (double)(float)q.divisor;
    for (int64_t b = 0; b < q.batch; ++b) {
        double total = 0.0;
        for (int64_t c = 0; c < q.out_channels; ++c) {
            conv_plane(&q, x, weight, conv_bias, b, c, plane);
            for (int64_t i = 0; i < plane_n; ++i)
                plane[i] = (double)(float)((double)(float)plane[i] / divisor);
            const double mean = pooled_mean(&q, plane);
            pooled[b * q.out_channels + c] = (float)mean;
            if (out)
                total += mean + (double)bias[c];
        }
        if (out)
            out[b] = (float)total;
    }
    free(plane);
    return CONVPOOL_OK;
}

/* ---- the backward (see convpool_backward_reference in convpool.h) ---- */

/* Marks the arg-max of every pooled window of q (the float32 values conv / divisor, held in
 * double) with 1 in mark, by PyTorch's max_pool3d rule: scan d, h, w; replace the running max
 * (starting at -inf, index at the window's first element) when a value is greater or NaN. */
static void mark_argmax(const convpool_problem *p, const double *q, unsigned char *mark)
{
    const int64_t n = p->conv_d * p->conv_h * p->conv_w;
    for (int64_t i = 0; i < n; ++i)
        mark[i] = 0;
    for (int64_t pd = 0; pd < p->pooled_d; ++pd)
        for (int64_t ph = 0; ph < p->pooled_h; ++ph)
            for (int64_t pw = 0; pw < p->pooled_w; ++pw) {
                double m = -INFINITY;
                int64_t arg = ((pd * p->pool_d) * p->conv_h + ph * p->pool_h) * p->conv_w + pw * p->pool_w;
                for (int64_t i = 0; i < p->pool_d; ++i)
                    for (int64_t j = 0; j < p->pool_h; ++j)
                        for (int64_t k = 0; k < p->pool_w; ++k) {
                            const int64_t at = ((pd * p->pool_d + i) * p->conv_h + ph * p->pool_h + j) * p->conv_w +
                                               pw * p->pool_w + k;
                            if (q[at] > m || isnan(q[at])) {
                                m = q[at];
                                arg = at;
                            }
                        }
                mark[arg] = 1;
            }
}

convpool_status convpool_backward_reference(const convpool_problem *p, const float *x, const float *weight,
                                            const float *conv_bias, const float *grad_pooled, const float *grad_out,
                                            float *grad_x, float *grad_weight, float *grad_conv_bias,
                                            float *grad_bias)
{
    convpool_problem q;
    convpool_status s = convpool_check_inputs(p, x, weight, &q);
    if (s != CONVPOOL_OK)
        return s;
    const int64_t C = q.out_channels, B = q.batch;
    const convpool_span in[5] = {
        {"x", x, convpool_x_numel(&q), 4},           {"weight", weight, convpool_weight_numel(&q), 4},
        {"conv_bias", conv_bias, C, 4},              {"grad_pooled", grad_pooled, B * C, 4},
        {"grad_out", grad_out, B, 4},
    };
    const convpool_span outs[4] = {
        {"grad_x", grad_x, convpool_x_numel(&q), 4},  {"grad_weight", grad_weight, convpool_weight_numel(&q), 4},
        {"grad_conv_bias", grad_conv_bias, C, 4},     {"grad_bias", grad_bias, C, 4},
    };
    s = convpool_check_overlap(outs, 4, in, 5);
    if (s != CONVPOOL_OK)
        return s;

    const int64_t plane_n = q.conv_d * q.conv_h * q.conv_w;
    const int64_t xs_n = convpool_x_numel(&q) / B, w_n = convpool_weight_numel(&q);
    if ((uint64_t)plane_n > SIZE_MAX / 32 || (uint64_t)xs_n > SIZE_MAX / 8 || (uint64_t)w_n > SIZE_MAX / 8)
        return convpool_fail(CONVPOOL_ERR_OUT_OF_MEMORY, "reference backward: buffers do not fit in memory");
    double *plane = (double *)malloc((size_t)plane_n * sizeof(double));
    double *dy = (double *)malloc((size_t)plane_n * sizeof(double));
    unsigned char *mark = (unsigned char *)malloc((size_t)plane_n);
    double *gx = grad_x ? (double *)malloc((size_t)xs_n * sizeof(double)) : NULL;
    double *gw = (double *)calloc((size_t)w_n, sizeof(double));
    double *gcb = (double *)calloc((size_t)C, sizeof(double));
    if (!plane || !dy || !mark || (grad_x && !gx) || !gw || !gcb) {
        free(plane), free(dy), free(mark), free(gx), free(gw), free(gcb);
        return convpool_fail(CONVPOOL_ERR_OUT_OF_MEMORY, "reference backward: cannot allocate its buffers");
    }

    const double divisor = (double)(float)q.divisor;
    const double windows = (double)convpool_pooled_count(&q);
    for (int64_t b = 0; b < B; ++b) {
        if (gx)
            for (int64_t i = 0; i < xs_n; ++i)
                gx[i] = 0.0;
        for (int64_t c = 0; c < C; ++c) {
            const double g = (grad_pooled ? (double)grad_pooled[b * C + c] : 0.0) + (grad_out ? (double)grad_out[b] : 0.0);
            conv_plane(&q, x, weight, conv_bias, b, c, plane);
            for (int64_t i = 0; i < plane_n; ++i)
                plane[i] = (double)(float)((double)(float)plane[i] / divisor);
            mark_argmax(&q, plane, mark);
            double sum = 0.0;
            for (int64_t i = 0; i < plane_n; ++i) {
                dy[i] = (mark[i] ? g / windows : 0.0) / divisor;
                sum += dy[i];
            }
            gcb[c] += sum;
            for (int64_t ci = 0; ci < q.in_channels; ++ci)
                for (int64_t kd = 0; kd < q.kernel_d; ++kd)
                    for (int64_t kh = 0; kh < q.kernel_h; ++kh)
                        for (int64_t kw = 0; kw < q.kernel_w; ++kw) {
                            const int64_t wi = convpool_w_offset(&q, c, ci, kd, kh, kw);
                            const double w = (double)weight[wi];
                            double acc = 0.0;
                            for (int64_t d = 0; d < q.conv_d; ++d)
                                for (int64_t h = 0; h < q.conv_h; ++h) {
                                    const int64_t xo = convpool_x_offset(&q, b, ci, d + kd, h + kh, kw);
                                    const float *xrow = x + xo;
                                    const double *drow = dy + (d * q.conv_h + h) * q.conv_w;
                                    double *gxrow = gx ? gx + (xo - b * xs_n) : NULL;
                                    for (int64_t ow = 0; ow < q.conv_w; ++ow) {
                                        acc += drow[ow] * (double)xrow[ow];
                                        if (gxrow)
                                            gxrow[ow] += drow[ow] * w;
                                    }
                                }
                            gw[wi] += acc;
                        }
        }
        if (grad_x)
            for (int64_t i = 0; i < xs_n; ++i)
                grad_x[b * xs_n + i] = (float)gx[i];
    }
    if (grad_weight)
        for (int64_t i = 0; i < w_n; ++i)
            grad_weight[i] = (float)gw[i];
    if (grad_conv_bias)
        for (int64_t c = 0; c < C; ++c)
            grad_conv_bias[c] = (float)gcb[c];
    if (grad_bias) {
        double go = 0.0;
        for (int64_t b = 0; grad_out && b < B; ++b)
            go += (double)grad_out[b];
        for (int64_t c = 0; c < C; ++c)
            grad_bias[c] = (float)go;
    }
    free(plane), free(dy), free(mark), free(gx), free(gw), free(gcb);
    return CONVPOOL_OK;
}
