/*
 * The block's backward on the CPU from arg-max codes (OpenMP), the CPU twin of
 * src/cuda/backward.cu; convpool_pool_codes_cpu finds the codes in a conv output y.
 *
 * With G[b][c] = grad_pooled[b][c] + grad_out[b] and N pooled windows, autograd sends
 * S[b][c] = (G / N) / divisor (float32, as PyTorch forms it) to each window's arg-max conv
 * position q* and 0 elsewhere. For finite x and weights and a finite nonzero divisor:
 *   grad_weight[c][ci][t] = sum_b S[b][c] * sum_windows x[b][ci][q* + t]
 *   grad_x[b][ci][p]      = sum_c S[b][c] * sum_{windows with p - q* a tap t} w[c][ci][t]
 *   grad_conv_bias[c]     = sum_b N * S[b][c]
 *
 * Layout. x is copied channels-last (x_cl[b][d][h][w][ci]) and the weights to w_cl[c][t][ci], so
 * every (window, tap) touches Cin contiguous floats: the inner loops are vector adds and FMAs
 * over input channels. grad_x is scattered into a channels-last buffer and copied back.
 *
 * Determinism (bit-identical for any thread count):
 *   grad_weight  items (output channel, chunk of CPB_BATCH samples); each sums its samples in
 *                order (per sample a float sum over the windows, scaled by S, added in float),
 *                and the chunks are added in order in double.
 *   grad_x       items (sample, block of pooled d-rows). A block's windows write x rows up to
 *                kd - 1 beyond its own, so blocks run in two phases, even then odd: blocks of
 *                one phase never share a row, and a shared row always receives the even
 *                block's terms first. Inside a block: channels, windows in raster order, taps.
 */
#include "internal.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(_OPENMP)
#define CPB_PRAGMA(x) _Pragma(#x)
#define CPB_SIMD CPB_PRAGMA(omp simd)
#else
#define CPB_SIMD
#endif

/* Samples per grad_weight item. */
#define CPB_BATCH 4
/* Threads beyond this are never started (as convpool_forward_cpu). */
#define CPB_THREADS_MAX 1024

static int cpb_threads(int threads)
{
#ifdef _OPENMP
    int64_t n = threads > 0 ? threads : omp_get_max_threads();
    int64_t cap = omp_get_num_procs();
    const int64_t lim = omp_get_thread_limit();
    if (lim > 0 && lim < cap)
        cap = lim;
    if (cap > CPB_THREADS_MAX)
        cap = CPB_THREADS_MAX;
    if (n > cap)
        n = cap;
    return n < 1 ? 1 : (int)n;
#else
    (void)threads;
    return 1;
#endif
}

static uint32_t cpb_code(const void *codes, int width, int64_t i)
{
    switch (width) {
    case 1: return ((const uint8_t *)codes)[i];
    case 2: return ((const uint16_t *)codes)[i];
    default: return ((const uint32_t *)codes)[i];
    }
}

static float cpb_scale(const float *gp, const float *go, int64_t b, int64_t c, int64_t cout, float windows,
                       float divisor)
{
    const float g = (gp ? gp[b * cout + c] : 0.0f) + (go ? go[b] : 0.0f);
    return (g / windows) / divisor;
}

convpool_status convpool_pool_codes_cpu(const convpool_problem *p, const float *y, void *codes, int threads)
{
    convpool_problem q;
    convpool_status s = convpool_check_inputs(p, y, y, &q);
    if (s != CONVPOOL_OK)
        return s;
    if (!codes)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "codes is NULL");
    const int width = convpool_code_bytes(&q);
    const int64_t B = q.batch, C = q.out_channels, npool = convpool_pooled_count(&q);
    const int64_t plane = q.conv_d * q.conv_h * q.conv_w;
    const convpool_span in[1] = {{"y", y, B * C * plane, 4}};
    const convpool_span outs[1] = {{"codes", codes, B * C * npool, width}};
    s = convpool_check_overlap(outs, 1, in, 1);
    if (s != CONVPOOL_OK)
        return s;
    const float d = (float)q.divisor;
    const int nt = cpb_threads(threads);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t bc = 0; bc < B * C; ++bc) {
        const float *yc = y + bc * plane;
        int64_t win = bc * npool;
        for (int64_t pd = 0; pd < q.pooled_d; ++pd)
            for (int64_t ph = 0; ph < q.pooled_h; ++ph)
                for (int64_t pw = 0; pw < q.pooled_w; ++pw, ++win) {
                    float best = -INFINITY;
                    uint32_t code = 0, pos = 0;
                    for (int64_t i = 0; i < q.pool_d; ++i)
                        for (int64_t j = 0; j < q.pool_h; ++j) {
                            const float *row = yc + ((pd * q.pool_d + i) * q.conv_h + ph * q.pool_h + j) * q.conv_w +
                                               pw * q.pool_w;
                            for (int64_t k = 0; k < q.pool_w; ++k, ++pos) {
                                const float v = row[k] / d;
                                if (v > best || isnan(v)) {
                                    best = v;
                                    code = pos;
                                }
                            }
                        }
                    if (width == 1)
                        ((uint8_t *)codes)[win] = (uint8_t)code;
                    else if (width == 2)
                        ((uint16_t *)codes)[win] = (uint16_t)code;
                    else
                        ((uint32_t *)codes)[win] = code;
                }
    }
    return CONVPOOL_OK;
}

/* A window's arg-max conv position (d, h, w) from its index and code. */
static void cpb_argmax(const convpool_problem *q, int64_t win, uint32_t code, int64_t *qd, int64_t *qh, int64_t *qw)
{
    const int64_t pw = win % q->pooled_w, r = win / q->pooled_w;
    const int64_t ph = r % q->pooled_h, pd = r / q->pooled_h;
    const int64_t phw = q->pool_h * q->pool_w, od = code / phw, rr = code - od * phw;
    const int64_t oh = rr / q->pool_w, ow = rr - oh * q->pool_w;
    *qd = pd * q->pool_d + od;
    *qh = ph * q->pool_h + oh;
    *qw = pw * q->pool_w + ow;
}

/* x86 builds carry an AVX2 clone of the two hot loops, picked at load time (ifunc); the
 * library itself is built for x86-64-v2. Every clone performs the same float operations in the
 * same order, so the results do not depend on which one runs. */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define CPB_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CPB_CLONES
#endif

/* grad_weight item (c, chunk): acc[t][ci] = sum over the chunk's samples b of
 * S[b][c] * (sum over windows of x_cl[b][q* + t][ci]). */
CPB_CLONES static void cpb_weight_item(const convpool_problem *q, const float *cl, const void *codes, int width,
                                       const float *grad_pooled, const float *grad_out, int64_t c, int64_t chunk,
                                       float *acc, float *accb)
{
    const int64_t B = q->batch, C = q->out_channels, CI = q->in_channels, npool = convpool_pooled_count(q);
    const int64_t D = q->in_d, H = q->in_h, W = q->in_w, kd = q->kernel_d, kh = q->kernel_h, kw = q->kernel_w;
    const int64_t taps = kd * kh * kw;
    const float windows = (float)npool, div = (float)q->divisor;
    for (int64_t i = 0; i < taps * CI; ++i)
        acc[i] = 0.0f;
    for (int64_t b = chunk * CPB_BATCH; b < B && b < (chunk + 1) * CPB_BATCH; ++b) {
        for (int64_t i = 0; i < taps * CI; ++i)
            accb[i] = 0.0f;
        const int64_t base = (b * C + c) * npool;
        for (int64_t win = 0; win < npool; ++win) {
            int64_t qd, qh, qw;
            cpb_argmax(q, win, cpb_code(codes, width, base + win), &qd, &qh, &qw);
            const float *xq = cl + ((b * D + qd) * H * W + qh * W + qw) * CI;
            float *dst = accb;
            for (int64_t td = 0; td < kd; ++td)
                for (int64_t th = 0; th < kh; ++th) {
                    const float *src = xq + (td * H * W + th * W) * CI;
                    CPB_SIMD
                    for (int64_t e = 0; e < kw * CI; ++e)
                        dst[e] += src[e];
                    dst += kw * CI;
                }
        }
        const float sc = cpb_scale(grad_pooled, grad_out, b, c, C, windows, div);
        CPB_SIMD
        for (int64_t i = 0; i < taps * CI; ++i)
            acc[i] += sc * accb[i];
    }
}

/* grad_x item (b, pooled d-rows [pd0, pd1)): gx_cl[b][q* + t][ci] += S[b][c] * w_cl[c][t][ci]
 * for every window of the rows, channels in order, windows in raster order. */
CPB_CLONES static void cpb_grad_x_item(const convpool_problem *q, const float *w_cl, const void *codes, int width,
                                       const float *grad_pooled, const float *grad_out, int64_t b, int64_t pd0,
                                       int64_t pd1, float *cl)
{
    const int64_t C = q->out_channels, CI = q->in_channels, npool = convpool_pooled_count(q);
    const int64_t D = q->in_d, H = q->in_h, W = q->in_w, kd = q->kernel_d, kh = q->kernel_h, kw = q->kernel_w;
    const int64_t taps = kd * kh * kw, per_d = q->pooled_h * q->pooled_w;
    const float windows = (float)npool, div = (float)q->divisor;
    for (int64_t c = 0; c < C; ++c) {
        const float sc = cpb_scale(grad_pooled, grad_out, b, c, C, windows, div);
        if (sc == 0.0f)
            continue; /* finite weights: these terms are exact zeros */
        const int64_t base = (b * C + c) * npool;
        const float *wc = w_cl + c * taps * CI;
        for (int64_t win = pd0 * per_d; win < pd1 * per_d; ++win) {
            int64_t qd, qh, qw;
            cpb_argmax(q, win, cpb_code(codes, width, base + win), &qd, &qh, &qw);
            float *gq = cl + ((b * D + qd) * H * W + qh * W + qw) * CI;
            const float *src = wc;
            for (int64_t td = 0; td < kd; ++td)
                for (int64_t th = 0; th < kh; ++th) {
                    float *dst = gq + (td * H * W + th * W) * CI;
                    CPB_SIMD
                    for (int64_t e = 0; e < kw * CI; ++e)
                        dst[e] += sc * src[e];
                    src += kw * CI;
                }
        }
    }
}

convpool_status convpool_backward_cpu(const convpool_problem *p, const float *x, const float *weight,
                                      const void *codes, const float *grad_pooled, const float *grad_out,
                                      float *grad_x, float *grad_weight, float *grad_conv_bias, int threads)
{
    convpool_problem q;
    convpool_status s = convpool_check_inputs(p, x, weight, &q);
    if (s != CONVPOOL_OK)
        return s;
    if (!codes)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "codes is NULL");
    const int width = convpool_code_bytes(&q);
    const int64_t B = q.batch, C = q.out_channels, CI = q.in_channels, npool = convpool_pooled_count(&q);
    const int64_t D = q.in_d, H = q.in_h, W = q.in_w, kd = q.kernel_d, kh = q.kernel_h, kw = q.kernel_w;
    const int64_t taps = kd * kh * kw, nx = convpool_x_numel(&q), nw = convpool_weight_numel(&q);
    const convpool_span in[5] = {
        {"x", x, nx, 4},
        {"weight", weight, nw, 4},
        {"codes", codes, B * C * npool, width},
        {"grad_pooled", grad_pooled, B * C, 4},
        {"grad_out", grad_out, B, 4},
    };
    const convpool_span outs[3] = {
        {"grad_x", grad_x, nx, 4}, {"grad_weight", grad_weight, nw, 4}, {"grad_conv_bias", grad_conv_bias, C, 4}};
    s = convpool_check_overlap(outs, 3, in, 5);
    if (s != CONVPOOL_OK)
        return s;

    const float windows = (float)npool, div = (float)q.divisor;
    const int nt = cpb_threads(threads);
    if (grad_conv_bias)
        for (int64_t c = 0; c < C; ++c) {
            double acc = 0.0;
            for (int64_t b = 0; b < B; ++b)
                acc += (double)cpb_scale(grad_pooled, grad_out, b, c, C, windows, div);
            grad_conv_bias[c] = (float)(acc * (double)npool);
        }
    if (!grad_x && !grad_weight)
        return CONVPOOL_OK;

    /* Buffers: x or grad_x channels-last (one x-sized buffer serves both, in turn), the
     * weights channels-last, grad_weight partials. Sizes are bounded in double first. */
    const int64_t nchunk = (B + CPB_BATCH - 1) / CPB_BATCH;
    const double need = (double)nx * 4.0 + (double)nw * 4.0 + (double)nchunk * (double)C * (double)CI * (double)taps * 4.0;
    if (need > 1.0e15)
        return convpool_fail(CONVPOOL_ERR_OUT_OF_MEMORY, "backward: %.3g bytes of buffers do not fit in memory", need);
    float *cl = (float *)malloc((size_t)nx * sizeof(float));
    float *w_cl = (float *)malloc((size_t)nw * sizeof(float));
    float *part = grad_weight ? (float *)malloc((size_t)(nchunk * C * CI * taps) * sizeof(float)) : NULL;
    float *accs = grad_weight ? (float *)malloc((size_t)(2 * nt * taps * CI) * sizeof(float)) : NULL;
    if (!cl || !w_cl || (grad_weight && (!part || !accs))) {
        free(cl), free(w_cl), free(part), free(accs);
        return convpool_fail(CONVPOOL_ERR_OUT_OF_MEMORY, "backward: cannot allocate %.3g bytes of buffers", need);
    }
    const int64_t dhw = D * H * W;

    if (grad_weight) {
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t bp = 0; bp < B * D; ++bp) {
            const int64_t b = bp / D, d = bp % D;
            for (int64_t i = 0; i < H * W; ++i)
                for (int64_t ci = 0; ci < CI; ++ci)
                    cl[((b * D + d) * H * W + i) * CI + ci] = x[((b * CI + ci) * D + d) * H * W + i];
        }
#pragma omp parallel num_threads(nt)
        {
#ifdef _OPENMP
            const int64_t tid = omp_get_thread_num();
#else
            const int64_t tid = 0;
#endif
            float *acc = accs + 2 * tid * taps * CI, *accb = acc + taps * CI;
#pragma omp for schedule(dynamic)
            for (int64_t item = 0; item < C * nchunk; ++item) {
                const int64_t c = item / nchunk, chunk = item % nchunk;
                cpb_weight_item(&q, cl, codes, width, grad_pooled, grad_out, c, chunk, acc, accb);
                memcpy(part + (chunk * C + c) * taps * CI, acc, (size_t)(taps * CI) * sizeof(float));
            }
        }
        /* grad_weight[c][ci][t] = sum over chunks, in order, in double; part is [chunk][c][t][ci]. */
        for (int64_t c = 0; c < C; ++c)
            for (int64_t ci = 0; ci < CI; ++ci)
                for (int64_t t = 0; t < taps; ++t) {
                    double acc = 0.0;
                    for (int64_t k = 0; k < nchunk; ++k)
                        acc += (double)part[((k * C + c) * taps + t) * CI + ci];
                    grad_weight[(c * CI + ci) * taps + t] = (float)acc;
                }
    }

    if (grad_x) {
        for (int64_t c = 0; c < C; ++c)
            for (int64_t t = 0; t < taps; ++t)
                for (int64_t ci = 0; ci < CI; ++ci)
                    w_cl[(c * taps + t) * CI + ci] = weight[(c * CI + ci) * taps + t];
        memset(cl, 0, (size_t)nx * sizeof(float));
        /* Blocks of pooled d-rows far enough apart that blocks of one phase never share a row. */
        const int64_t bd = q.kernel_d > 1 ? (q.kernel_d - 1 + q.pool_d - 1) / q.pool_d : 1;
        const int64_t nblk = (q.pooled_d + bd - 1) / bd;
        for (int phase = 0; phase < 2; ++phase) {
            const int64_t nphase = (nblk - phase + 1) / 2;
#pragma omp parallel for schedule(dynamic) num_threads(nt)
            for (int64_t item = 0; item < B * nphase; ++item) {
                const int64_t b = item / nphase, blk = 2 * (item % nphase) + phase;
                const int64_t pd0 = blk * bd, pd1 = pd0 + bd < q.pooled_d ? pd0 + bd : q.pooled_d;
                cpb_grad_x_item(&q, w_cl, codes, width, grad_pooled, grad_out, b, pd0, pd1, cl);
            }
        }
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t bp = 0; bp < B * CI; ++bp) {
            const int64_t b = bp / CI, ci = bp % CI;
            for (int64_t i = 0; i < dhw; ++i)
                grad_x[(b * CI + ci) * dhw + i] = cl[(b * dhw + i) * CI + ci];
        }
    }
    free(cl), free(w_cl), free(part), free(accs);
    return CONVPOOL_OK;
}
