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
 *   grad_weight  items (sample, run of windows in raster order), fixed by the problem (about
 *                CPB_ITEMS); each sums its windows in raster order in float for every channel at
 *                once and scales by S; the items are added in order in double.
 *   grad_x       items (sample, block of pooled d-rows). A block's windows write x rows up to
 *                kd - 1 beyond its own, so blocks run in two phases, even then odd: blocks of
 *                one phase never share a row, and a shared row always receives the even
 *                block's terms first. Inside a block: windows in raster order, channels, taps;
 *                row length 24: pooled h-rows, channels, the row's windows, taps
 *                (cpb_grad_x_body_strip); 40: per window, channels grouped by arg-max
 *                position (cpb_grad_x_body_reg).
 *   pool 1x1x1   neither: the gradient is dense and both sums are separable passes over
 *                (sample, input channel) items in double (cpb_backward_pool1).
 */
#if defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE 1 /* posix_memalign, madvise under -std=c11 */
#endif
#include "internal.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

/* A scratch of x's size, on 2 MiB pages where the kernel grants them (madvise): a fresh
 * 4 KiB-paged buffer costs a page fault per 4 KiB on first touch (about 4000 for the
 * headline's batch 8, 65000 at 128), and faults serialise on the process's memory map as the
 * threads touch it. Freed with free(). Kept between calls: cpb_slot below. */
static void *cpb_alloc_big(size_t bytes)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const size_t huge = (size_t)2 << 20;
    if (bytes >= huge) {
        void *p = NULL;
        const size_t rounded = (bytes + huge - 1) / huge * huge;
        if (posix_memalign(&p, huge, rounded) == 0) {
            (void)madvise(p, rounded, MADV_HUGEPAGE); /* advice: refused, it is plain pages */
            return p;
        }
        return NULL;
    }
#endif
    return malloc(bytes);
}

/* The x-sized scratch outlives the call, in one process-wide slot: a training loop calls the
 * backward every step, and a fresh buffer's first touch is page faults that the kernel serves
 * by zeroing pages (perf, headline batch 8 at 2 threads, the whole training step: 6% of it in
 * clear_page_erms under the backward's first pass over the scratch; six alternating rounds
 * of 9 steps, median ms: 39.9-42.1 kept against 40.8-63.1 fresh). A call takes the slot's
 * buffer when it is there and fits (not more than 4x too large), else allocates its own; at
 * the end it leaves its buffer in the slot, freeing the one there (two concurrent calls: each
 * has its own buffer, the later one stays). convpool_cpu_release_scratch frees the slot's. */
typedef struct cpb_scratch {
    void *p;
    size_t bytes;
} cpb_scratch;
static cpb_scratch *cpb_slot = NULL;

static void cpb_scratch_free(cpb_scratch *s)
{
    if (s)
        free(s->p), free(s);
}

/* Puts v in the slot and returns what was there, atomically. (The GCC/Clang builtin: this file
 * is also compiled as C++ inside the PyTorch extension, where C11's <stdatomic.h> is not.)
 * Elsewhere there is no slot: every call allocates and frees its own. */
static cpb_scratch *cpb_slot_swap(cpb_scratch *v)
{
#if defined(__GNUC__)
    return __atomic_exchange_n(&cpb_slot, v, __ATOMIC_ACQ_REL);
#else
    cpb_scratch_free(v);
    return NULL;
#endif
}

static cpb_scratch *cpb_scratch_take(size_t bytes)
{
    cpb_scratch *s = cpb_slot_swap(NULL);
    if (s && s->bytes >= bytes && s->bytes / 4 <= bytes)
        return s;
    cpb_scratch_free(s);
    s = (cpb_scratch *)malloc(sizeof *s);
    if (!s)
        return NULL;
    s->bytes = bytes;
    s->p = cpb_alloc_big(bytes);
    if (!s->p) {
        free(s);
        return NULL;
    }
    return s;
}

static void cpb_scratch_give(cpb_scratch *s) { cpb_scratch_free(cpb_slot_swap(s)); }

void convpool_cpu_release_scratch(void) { cpb_scratch_free(cpb_slot_swap(NULL)); }

#if defined(_OPENMP)
#define CPB_PRAGMA(x) _Pragma(#x)
#define CPB_SIMD CPB_PRAGMA(omp simd)
#else
#define CPB_SIMD
#endif

/* The item bodies are instantiated once per row length (see cpb_weight_item24). */
#if defined(__GNUC__)
#define CPB_INLINE static inline __attribute__((always_inline))
#else
#define CPB_INLINE static inline
#endif

/* grad_weight items in all (about; at least one per sample): enough to share out, few enough
 * that the partials stay small. */
#define CPB_ITEMS 64

static int64_t cpb_min64(int64_t a, int64_t b) { return a < b ? a : b; }
static float cpb_scale(const float *gp, const float *go, int64_t b, int64_t c, int64_t cout, float windows,
                       float divisor)
{
    const float g = (gp ? gp[b * cout + c] : 0.0f) + (go ? go[b] : 0.0f);
    return (g / windows) / divisor;
}

/* scale[b][c] = S[b][c] for the whole batch. */
static void cpb_scales(const float *gp, const float *go, int64_t B, int64_t C, float windows, float divisor,
                       float *scale)
{
    for (int64_t b = 0; b < B; ++b)
        for (int64_t c = 0; c < C; ++c)
            scale[b * C + c] = cpb_scale(gp, go, b, c, C, windows, divisor);
}

/* The calling thread's index in its OpenMP team (0 without OpenMP): its slice of a per-thread
 * scratch. */
static int64_t cpb_thread(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* grad_conv_bias[c] = sum_b N * S[b][c] (NULL: not asked). */
static void cpb_grad_conv_bias(const float *gp, const float *go, int64_t B, int64_t C, float windows, float divisor,
                               int64_t npool, float *grad_conv_bias)
{
    if (!grad_conv_bias)
        return;
    for (int64_t c = 0; c < C; ++c) {
        double acc = 0.0;
        for (int64_t b = 0; b < B; ++b)
            acc += (double)cpb_scale(gp, go, b, c, C, windows, divisor);
        grad_conv_bias[c] = (float)(acc * (double)npool);
    }
}

convpool_status convpool_pool_codes_cpu(const convpool_problem *p, const float *y, void *codes, int threads)
{
    if (!p)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "problem is NULL");
    if (!y)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "y is NULL");
    convpool_problem q = *p;
    convpool_status s = convpool_problem_validate(&q);
    if (s != CONVPOOL_OK)
        return s;
    s = convpool_check_codes_threads(codes, threads);
    if (s != CONVPOOL_OK)
        return s;
    s = convpool_check_code_window(&q);
    if (s != CONVPOOL_OK)
        return s;
    const int width = convpool_code_bytes(&q);
    const int64_t B = q.batch, C = q.out_channels, npool = convpool_pooled_count(&q);
    const int64_t plane = q.conv_d * q.conv_h * q.conv_w;
    const convpool_span in[1] = {{"y", y, B * C * plane, 4}};
    const convpool_span outs[1] = {{"codes", codes, B * C * npool, width}};
    s = convpool_check_overlap(outs, 1, in, 1);
    if (s != CONVPOOL_OK)
        return s;
    const float d = (float)q.divisor;
    const int nt = (int)convpool_cpu_threads(threads, INT64_MAX);
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
                    convpool_code_store(codes, width, win, code);
                }
    }
    return CONVPOOL_OK;
}

/* Channels-last offset, in floats, of a window element from the window's first element, per
 * code: ((od * H + oh) * W + ow) * Cin. A table (built once a call) when the window has at most
 * CPB_TABLE_MAX positions, so the per-window work has no division; else computed. */
#define CPB_TABLE_MAX ((int64_t)1 << 20)

typedef struct cpb_geo {
    int64_t D, H, W, CI, kd, kh, kw, taps, npool;
    const int64_t *off; /* [pool volume] or NULL */
} cpb_geo;

static int64_t cpb_offset(const convpool_problem *q, const cpb_geo *g, uint32_t code)
{
    if (g->off)
        return g->off[code];
    const int64_t phw = q->pool_h * q->pool_w, od = code / phw, r = code - od * phw;
    const int64_t oh = r / q->pool_w, ow = r - oh * q->pool_w;
    return ((od * g->H + oh) * g->W + ow) * g->CI;
}

/* x86 builds carry an AVX2 clone of the two hot loops, picked at load time (ifunc); the
 * library itself is built for x86-64-v2. Every clone performs the same float operations in the
 * same order, so the results do not depend on which one runs. */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define CPB_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CPB_CLONES
#endif

/* grad_weight item (b, windows [win0, win1) of the sample in raster order): part[c][t][ci] =
 * S[b][c] * sum over the windows of x_cl[b][q*(c) + t][ci], all channels in one walk over the
 * windows (a window's x region stays in L1 for every channel). */
CPB_INLINE void
cpb_weight_body(const convpool_problem *q, const cpb_geo *g, const float *cl, const void *codes, int width,
                const float *scale, int64_t b, int64_t win0, int64_t win1, float *accb, float *part, const int64_t L)
{
    const int64_t C = q->out_channels, CI = g->CI, kd = g->kd, kh = g->kh;
    const int64_t K = g->taps * CI, hwc = g->H * g->W * CI, wc = g->W * CI;
    const int64_t pw_n = q->pooled_w, phw = q->pooled_h * q->pooled_w;
    for (int64_t i = 0; i < C * K; ++i)
        accb[i] = 0.0f;
    const float *xb = cl + b * g->D * hwc;
    for (int64_t win = win0; win < win1; ++win) {
        const int64_t pd = win / phw, r = win - pd * phw, ph = r / pw_n, pw = r - ph * pw_n;
        const int64_t row = ((pd * q->pool_d * g->H + ph * q->pool_h) * g->W + pw * q->pool_w) * CI;
        for (int64_t c = 0; c < C; ++c) {
            const float *xq = xb + row + cpb_offset(q, g, convpool_code_at(codes, width, (b * C + c) * g->npool + win));
            float *dst = accb + c * K;
            for (int64_t td = 0; td < kd; ++td)
                for (int64_t th = 0; th < kh; ++th) {
                    const float *src = xq + td * hwc + th * wc;
                    CPB_SIMD
                    for (int64_t e = 0; e < L; ++e)
                        dst[e] += src[e];
                    dst += L;
                }
        }
    }
    for (int64_t c = 0; c < C; ++c) {
        const float sc = scale[b * C + c];
        CPB_SIMD
        for (int64_t i = 0; i < K; ++i)
            part[c * K + i] = sc * accb[c * K + i];
    }
}

#if defined(__GNUC__)
/* The same item with the sums in registers, for row lengths that are multiples of 8 up to 40
 * (the 24 and 40 instances): per chunk of CPB_WCHUNK windows (their x regions stay in L1) and
 * per channel, the windows' patch offsets once, then per tap row (td, th) L / 8 vector
 * accumulators over the chunk's windows, loaded from and stored to accb once a chunk. Each
 * accb element still adds its windows in raster order with the same float adds, so the bits
 * are cpb_weight_body's. (The window-major body stores its accumulator row after every add,
 * one store per vector add.) GCC vector types, not loops: GCC swapped an array-accumulator's
 * loops into scalar code. */
typedef float cpb_v8 __attribute__((vector_size(32)));
#define CPB_WCHUNK 32
#define CPB_HAVE_REG 1

CPB_INLINE void
cpb_weight_body_reg(const convpool_problem *q, const cpb_geo *g, const float *cl, const void *codes, int width,
                    const float *scale, int64_t b, int64_t win_lo, int64_t win_hi, float *accb, float *part,
                    int64_t *wbuf, const int NV)
{
    const int64_t L = 8 * NV;
    const int64_t C = q->out_channels, CI = g->CI, kh = g->kh, R = g->kd * g->kh;
    const int64_t K = g->taps * CI, hwc = g->H * g->W * CI, wc = g->W * CI;
    const int64_t pw_n = q->pooled_w, phw = q->pooled_h * q->pooled_w;
    for (int64_t i = 0; i < C * K; ++i)
        accb[i] = 0.0f;
    const float *xb = cl + b * g->D * hwc;
    const int64_t win0 = win_lo, nwin = win_hi - win_lo;
    int64_t *rowoff = wbuf, *off = wbuf + CPB_WCHUNK;
    for (int64_t w0 = 0; w0 < nwin; w0 += CPB_WCHUNK) {
        const int64_t nw = cpb_min64(CPB_WCHUNK, nwin - w0);
        for (int64_t i = 0; i < nw; ++i) {
            const int64_t w = win0 + w0 + i, pd = w / phw, r = w - pd * phw, ph = r / pw_n, pw = r - ph * pw_n;
            rowoff[i] = ((pd * q->pool_d * g->H + ph * q->pool_h) * g->W + pw * q->pool_w) * CI;
        }
        for (int64_t c = 0; c < C; ++c) {
            const int64_t cbase = (b * C + c) * g->npool + win0 + w0;
            for (int64_t i = 0; i < nw; ++i)
                off[i] = rowoff[i] + cpb_offset(q, g, convpool_code_at(codes, width, cbase + i));
            float *dst = accb + c * K;
            for (int64_t rr = 0; rr < R; ++rr, dst += L) {
                const int64_t td = rr / kh, th = rr - td * kh;
                const float *base = xb + td * hwc + th * wc;
                cpb_v8 acc[5], t;
                for (int v = 0; v < NV; ++v)
                    memcpy(&acc[v], dst + 8 * v, sizeof t);
                for (int64_t i = 0; i < nw; ++i) {
                    const float *src = base + off[i];
                    for (int v = 0; v < NV; ++v) {
                        memcpy(&t, src + 8 * v, sizeof t);
                        acc[v] += t;
                    }
                }
                for (int v = 0; v < NV; ++v)
                    memcpy(dst + 8 * v, &acc[v], sizeof t);
            }
        }
    }
    for (int64_t c = 0; c < C; ++c) {
        const float sc = scale[b * C + c];
        CPB_SIMD
        for (int64_t i = 0; i < K; ++i)
            part[c * K + i] = sc * accb[c * K + i];
    }
}
#else
#define CPB_WCHUNK 1
#define CPB_HAVE_REG 0
/* Without GCC vector types: the window-major body at the same length. */
CPB_INLINE void
cpb_weight_body_reg(const convpool_problem *q, const cpb_geo *g, const float *cl, const void *codes, int width,
                    const float *scale, int64_t b, int64_t win_lo, int64_t win_hi, float *accb, float *part,
                    int64_t *wbuf, const int NV)
{
    (void)wbuf;
    cpb_weight_body(q, g, cl, codes, width, scale, b, win_lo, win_hi, accb, part, 8 * NV);
}
#endif

/* grad_x item (b, pooled d-rows [pd0, pd1)): gx_cl[b][q* + t][ci] += S[b][c] * w_cl[c][t][ci]
 * for every window of the rows in raster order, channels in order inside a window. */
CPB_INLINE void
cpb_grad_x_body(const convpool_problem *q, const cpb_geo *g, const float *w_cl, const void *codes, int width,
                const float *scale, int64_t b, int64_t pd0, int64_t pd1, float *cl, const int64_t L)
{
    const int64_t C = q->out_channels, CI = g->CI, kd = g->kd, kh = g->kh;
    const int64_t K = g->taps * CI, hwc = g->H * g->W * CI, wc = g->W * CI;
    float *gb = cl + b * g->D * hwc;
    int64_t win = pd0 * q->pooled_h * q->pooled_w;
    for (int64_t pd = pd0; pd < pd1; ++pd)
        for (int64_t ph = 0; ph < q->pooled_h; ++ph) {
            int64_t row = ((pd * q->pool_d * g->H + ph * q->pool_h) * g->W) * CI;
            for (int64_t pw = 0; pw < q->pooled_w; ++pw, ++win, row += q->pool_w * CI)
                for (int64_t c = 0; c < C; ++c) {
                    const float sc = scale[b * C + c];
                    if (sc == 0.0f)
                        continue; /* finite weights: these terms are exact zeros */
                    float *gq = gb + row + cpb_offset(q, g, convpool_code_at(codes, width, (b * C + c) * g->npool + win));
                    const float *src = w_cl + c * K;
                    for (int64_t td = 0; td < kd; ++td)
                        for (int64_t th = 0; th < kh; ++th) {
                            float *dst = gq + td * hwc + th * wc;
                            CPB_SIMD
                            for (int64_t e = 0; e < L; ++e)
                                dst[e] += sc * src[e];
                            src += L;
                        }
                }
        }
}

#if CPB_HAVE_REG
/* grad_x item for row length 40 (kernel 5 x Cin 8) and at most CPB_GX_CMAX channels: per window, the
 * channels that share an arg-max position are summed first, in registers (per tap row, NV
 * vectors of S[b][c] * w_cl[c] over the group's channels in order), and the patch receives one
 * add per group, groups in ascending position. cpb_grad_x_body stores the patch once per
 * channel (a read-modify-write per vector product); this once per distinct position (16
 * channels over 8 positions: about 6). A different order of the same terms: deterministic,
 * and the same for any thread count, but not cpb_grad_x_body's bits. */
#define CPB_GX_CMAX 64
CPB_INLINE void
cpb_grad_x_body_reg(const convpool_problem *q, const cpb_geo *g, const float *w_cl, const void *codes, int width,
                    const float *scale, int64_t b, int64_t pd0, int64_t pd1, float *cl, const int NV)
{
    const int64_t L = 8 * NV;
    const int64_t C = q->out_channels, CI = g->CI, kh = g->kh, R = g->kd * g->kh;
    const int64_t K = g->taps * CI, hwc = g->H * g->W * CI, wc = g->W * CI;
    float *gb = cl + b * g->D * hwc;
    uint32_t key[CPB_GX_CMAX];
    int chan[CPB_GX_CMAX];
    int64_t win = pd0 * q->pooled_h * q->pooled_w;
    for (int64_t pd = pd0; pd < pd1; ++pd)
        for (int64_t ph = 0; ph < q->pooled_h; ++ph) {
            int64_t row = ((pd * q->pool_d * g->H + ph * q->pool_h) * g->W) * CI;
            for (int64_t pw = 0; pw < q->pooled_w; ++pw, ++win, row += q->pool_w * CI) {
                /* (position, channel) pairs, sorted by position, channels ascending within one
                 * (insertion sort of <= 64; S = 0 terms are exact zeros: left out). */
                int n = 0;
                for (int64_t c = 0; c < C; ++c) {
                    if (scale[b * C + c] == 0.0f)
                        continue;
                    const uint32_t k = convpool_code_at(codes, width, (b * C + c) * g->npool + win);
                    int i = n++;
                    for (; i > 0 && key[i - 1] > k; --i)
                        key[i] = key[i - 1], chan[i] = chan[i - 1];
                    key[i] = k, chan[i] = (int)c;
                }
                for (int i0 = 0; i0 < n;) {
                    int i1 = i0 + 1;
                    while (i1 < n && key[i1] == key[i0])
                        ++i1;
                    float *gq = gb + row + cpb_offset(q, g, key[i0]);
                    for (int64_t rr = 0, td = 0, th = 0; rr < R; ++rr) {
                        float *dst = gq + td * hwc + th * wc;
                        if (++th == kh)
                            th = 0, ++td;
                        cpb_v8 acc[5], t, d;
                        const float *src = w_cl + chan[i0] * K + rr * L;
                        const float sc0 = scale[b * C + chan[i0]];
                        for (int v = 0; v < NV; ++v) {
                            memcpy(&t, src + 8 * v, sizeof t);
                            acc[v] = sc0 * t;
                        }
                        for (int i = i0 + 1; i < i1; ++i) {
                            const float sc = scale[b * C + chan[i]];
                            src = w_cl + chan[i] * K + rr * L;
                            for (int v = 0; v < NV; ++v) {
                                memcpy(&t, src + 8 * v, sizeof t);
                                acc[v] += sc * t;
                            }
                        }
                        for (int v = 0; v < NV; ++v) {
                            memcpy(&d, dst + 8 * v, sizeof d);
                            d += acc[v];
                            memcpy(dst + 8 * v, &d, sizeof d);
                        }
                    }
                    i0 = i1;
                }
            }
        }
}
#endif

/* grad_x item by strips: per pooled h-row (its x region, 4 x 4 rows of W x Cin floats at the
 * headline, stays in L1) each channel in turn scatters S * w (scaled once a strip) into the
 * patches of its windows along the row. A channel's consecutive windows touch nearly disjoint
 * patches, so the read-modify-writes overlap in flight; window-major, the 16 channels of one
 * window hit the same few rows back to back. Order: strips, channels, windows, taps. */
#define CPB_KMAX 1024
CPB_INLINE void
cpb_grad_x_body_strip(const convpool_problem *q, const cpb_geo *g, const float *w_cl, const void *codes, int width,
                      const float *scale, int64_t b, int64_t pd0, int64_t pd1, float *cl, const int64_t L)
{
    const int64_t C = q->out_channels, CI = g->CI, kd = g->kd, kh = g->kh;
    const int64_t K = g->taps * CI, hwc = g->H * g->W * CI, wc = g->W * CI;
    float *gb = cl + b * g->D * hwc;
    float sw[CPB_KMAX];
    for (int64_t pd = pd0; pd < pd1; ++pd)
        for (int64_t ph = 0; ph < q->pooled_h; ++ph) {
            const int64_t row0 = ((pd * q->pool_d * g->H + ph * q->pool_h) * g->W) * CI;
            const int64_t win0 = (pd * q->pooled_h + ph) * q->pooled_w;
            for (int64_t c = 0; c < C; ++c) {
                const float sc = scale[b * C + c];
                if (sc == 0.0f)
                    continue; /* finite weights: these terms are exact zeros */
                const float *src = w_cl + c * K;
                CPB_SIMD
                for (int64_t i = 0; i < K; ++i)
                    sw[i] = sc * src[i];
                const int64_t cbase = (b * C + c) * g->npool + win0;
                int64_t row = row0;
                for (int64_t pw = 0; pw < q->pooled_w; ++pw, row += q->pool_w * CI) {
                    float *gq = gb + row + cpb_offset(q, g, convpool_code_at(codes, width, cbase + pw));
                    const float *sr = sw;
                    for (int64_t td = 0; td < kd; ++td)
                        for (int64_t th = 0; th < kh; ++th) {
                            float *dst = gq + td * hwc + th * wc;
                            CPB_SIMD
                            for (int64_t e = 0; e < L; ++e)
                                dst[e] += sr[e];
                            sr += L;
                        }
                }
            }
        }
}

/* Measured per row length (2 threads, batch 8, grad_x alone): at 24 (kernel 3) the strips take
 * 11 -> 9.2 ms and the grouping lost (18 ms: a 27-tap patch saves fewer stores than the sort
 * and the group loops cost); at 40 (kernel 5) the grouping takes 53 -> 36.4 ms and the strips
 * did nothing (52.8). */

/* The items, with the row length L = kernel width x Cin a compile-time 24 for the headline's
 * shape (kernel width 3, Cin 8): a window's rows then unroll into straight-line whole vectors,
 * grad_weight 2.9 -> 1.9 ms and grad_x 3.3 -> 2.7 ms (headline, batch 2, 2 cores); and 40 for
 * kernel 5 x Cin 8: grad_x 59 -> 51 ms, grad_weight 36 -> 31.5 ms (batch 8, 2 threads, C
 * library, alternating runs). Other lengths run the same body with L at run time. The same
 * float operation per element either way, so the results do not depend on the path. */
#define CPB_ITEM_ARGS_W                                                                                             \
    const convpool_problem *q, const cpb_geo *g, const float *cl, const void *codes, int width, const float *scale,  \
        int64_t b, int64_t win0, int64_t win1, float *accb, float *part, int64_t *wbuf
#define CPB_ITEM_ARGS_X                                                                                             \
    const convpool_problem *q, const cpb_geo *g, const float *w_cl, const void *codes, int width,                   \
        const float *scale, int64_t b, int64_t pd0, int64_t pd1, float *cl
/* One function per length, so the run-time one compiles as it did alone. */
CPB_CLONES static void cpb_weight_item24(CPB_ITEM_ARGS_W)
{
    cpb_weight_body_reg(q, g, cl, codes, width, scale, b, win0, win1, accb, part, wbuf, 3);
}
CPB_CLONES static void cpb_weight_item40(CPB_ITEM_ARGS_W)
{
    cpb_weight_body_reg(q, g, cl, codes, width, scale, b, win0, win1, accb, part, wbuf, 5);
}
CPB_CLONES static void cpb_weight_item_any(CPB_ITEM_ARGS_W)
{
    (void)wbuf;
    cpb_weight_body(q, g, cl, codes, width, scale, b, win0, win1, accb, part, g->kw * g->CI);
}
CPB_CLONES static void cpb_grad_x_item24(CPB_ITEM_ARGS_X)
{
    if (g->taps * g->CI <= CPB_KMAX) {
        cpb_grad_x_body_strip(q, g, w_cl, codes, width, scale, b, pd0, pd1, cl, 24);
        return;
    }
    cpb_grad_x_body(q, g, w_cl, codes, width, scale, b, pd0, pd1, cl, 24);
}
CPB_CLONES static void cpb_grad_x_item40(CPB_ITEM_ARGS_X)
{
#if CPB_HAVE_REG
    if (q->out_channels <= CPB_GX_CMAX) {
        cpb_grad_x_body_reg(q, g, w_cl, codes, width, scale, b, pd0, pd1, cl, 5);
        return;
    }
#endif
    cpb_grad_x_body(q, g, w_cl, codes, width, scale, b, pd0, pd1, cl, 40);
}
CPB_CLONES static void cpb_grad_x_item_any(CPB_ITEM_ARGS_X)
{
    cpb_grad_x_body(q, g, w_cl, codes, width, scale, b, pd0, pd1, cl, g->kw * g->CI);
}
static void cpb_weight_item(CPB_ITEM_ARGS_W)
{
    const int64_t L = g->kw * g->CI;
    (L == 24 ? cpb_weight_item24 : L == 40 ? cpb_weight_item40 : cpb_weight_item_any)(q, g, cl, codes, width, scale, b,
                                                                                     win0, win1, accb, part, wbuf);
}
static void cpb_grad_x_item(CPB_ITEM_ARGS_X)
{
    const int64_t L = g->kw * g->CI;
    (L == 24 ? cpb_grad_x_item24 : L == 40 ? cpb_grad_x_item40 : cpb_grad_x_item_any)(q, g, w_cl, codes, width, scale, b,
                                                                                     pd0, pd1, cl);
}

/* Windows of one position (pool 1x1x1): every conv value is its window's arg-max, so the
 * incoming gradient S[b][c] reaches every conv position and the backward is linear in x and the
 * weights (the codes are all 0 and need no reading):
 *   grad_weight[c][ci][t] = sum_b S[b][c] * box[b][ci][t], box = the sum of x[b][ci] over the
 *                           conv positions shifted by tap t;
 *   grad_x[b][ci][p]      = sum of V[b][ci][t] over the taps t with p - t a conv position,
 *                           V[b][ci][t] = sum_c S[b][c] * w[c][ci][t].
 * Whether p - t is a conv position is one range of taps per axis ([max(0, p - conv + 1),
 * min(k - 1, p)]), so both are separable passes: one read of x (row sums over the kw shifted
 * column ranges, then the kh rows, then the kd planes) and one write of grad_x (partial sums of V
 * over each axis's range). The general path gathered and scattered a full receptive field per
 * conv position: 13.5 and 10.0 ms for grad_x and grad_weight at the pool-1 row of
 * bench_train_cpu (2 threads, batch 2) against ~1 ms each this way. Sums in double; (b, ci)
 * items, each summed in a fixed order, so the bits do not depend on the thread count. */
static convpool_status cpb_backward_pool1(const convpool_problem *q, const float *x, const float *weight,
                                          const float *grad_pooled, const float *grad_out, float *grad_x,
                                          float *grad_weight, float *grad_conv_bias, float windows, float div, int nt)
{
    const int64_t B = q->batch, C = q->out_channels, CI = q->in_channels, npool = convpool_pooled_count(q);
    const int64_t D = q->in_d, H = q->in_h, W = q->in_w, kd = q->kernel_d, kh = q->kernel_h, kw = q->kernel_w;
    const int64_t Dc = q->conv_d, Hc = q->conv_h, Wc = q->conv_w, taps = kd * kh * kw;
    /* Per (b, ci): box or V (taps doubles); per thread: row sums (kw), plane sums (kh kw) and,
     * for grad_x, V's partial sums over w (kd kh W) and then h (kd H W). */
    const double per_thread = (double)(kw + kh * kw) + (double)kd * (double)(kh + H) * (double)W;
    const double need = ((double)B * (double)CI * (double)taps + (double)nt * per_thread) * 8.0 + (double)(B * C) * 4.0;
    if (need > 1.0e15)
        return convpool_fail(CONVPOOL_ERR_OUT_OF_MEMORY, "backward: %.3g bytes of buffers do not fit in memory", need);
    const int64_t per = kw + kh * kw + kd * (kh + H) * W;
    float *scale = (float *)malloc((size_t)(B * C) * sizeof(float));
    double *box = (double *)malloc((size_t)(B * CI * taps) * sizeof(double));
    double *work = (double *)malloc((size_t)(nt * per) * sizeof(double));
    if (!scale || !box || !work) {
        free(scale), free(box), free(work);
        return convpool_fail(CONVPOOL_ERR_OUT_OF_MEMORY, "backward: cannot allocate %.3g bytes of buffers", need);
    }
    /* Nothing can fail from here on: the outputs are written only now. */
    cpb_grad_conv_bias(grad_pooled, grad_out, B, C, windows, div, npool, grad_conv_bias);
    cpb_scales(grad_pooled, grad_out, B, C, windows, div, scale);

    if (grad_weight) {
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t bc = 0; bc < B * CI; ++bc) {
            double *rs = work + cpb_thread() * per;
            double *ps = rs + kw, *bx = box + bc * taps;
            for (int64_t t = 0; t < taps; ++t)
                bx[t] = 0.0;
            const float *xp = x + bc * D * H * W;
            for (int64_t d = 0; d < D; ++d) {
                for (int64_t i = 0; i < kh * kw; ++i)
                    ps[i] = 0.0;
                for (int64_t h = 0; h < H; ++h) {
                    /* rs[tw] = the row's sum over columns [tw, tw + Wc). */
                    const float *row = xp + (d * H + h) * W;
                    double all = 0.0;
                    for (int64_t w = 0; w < W; ++w)
                        all += (double)row[w];
                    double head = 0.0;
                    for (int64_t tw = 0; tw < kw; ++tw) {
                        double tail = 0.0;
                        for (int64_t w = tw + Wc; w < W; ++w)
                            tail += (double)row[w];
                        rs[tw] = all - head - tail;
                        head += (double)row[tw];
                    }
                    for (int64_t th = 0; th < kh; ++th)
                        if (h >= th && h < th + Hc)
                            for (int64_t tw = 0; tw < kw; ++tw)
                                ps[th * kw + tw] += rs[tw];
                }
                for (int64_t td = 0; td < kd; ++td)
                    if (d >= td && d < td + Dc)
                        for (int64_t i = 0; i < kh * kw; ++i)
                            bx[td * kh * kw + i] += ps[i];
            }
        }
        /* grad_weight[c][ci][t] = sum over the batch, in order, in double. */
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t c = 0; c < C; ++c)
            for (int64_t ci = 0; ci < CI; ++ci)
                for (int64_t t = 0; t < taps; ++t) {
                    double acc = 0.0;
                    for (int64_t b = 0; b < B; ++b)
                        acc += (double)scale[b * C + c] * box[(b * CI + ci) * taps + t];
                    grad_weight[(c * CI + ci) * taps + t] = (float)acc;
                }
    }

    if (grad_x) {
        /* V[b][ci][t], into box (grad_weight is done with it). */
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t bc = 0; bc < B * CI; ++bc) {
            const int64_t b = bc / CI, ci = bc % CI;
            for (int64_t t = 0; t < taps; ++t) {
                double acc = 0.0;
                for (int64_t c = 0; c < C; ++c)
                    acc += (double)scale[b * C + c] * (double)weight[(c * CI + ci) * taps + t];
                box[bc * taps + t] = acc;
            }
        }
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t bc = 0; bc < B * CI; ++bc) {
            double *aw = work + cpb_thread() * per;
            double *ah = aw + kd * kh * W; /* after aw: kd kh W, then kd H W */
            const double *v = box + bc * taps;
            /* aw[td][th][pw] = sum of V over tw in [max(0, pw - Wc + 1), min(kw - 1, pw)]. */
            for (int64_t i = 0; i < kd * kh; ++i)
                for (int64_t pw = 0; pw < W; ++pw) {
                    const int64_t lo = pw - Wc + 1 > 0 ? pw - Wc + 1 : 0, hi = pw < kw - 1 ? pw : kw - 1;
                    double acc = 0.0;
                    for (int64_t tw = lo; tw <= hi; ++tw)
                        acc += v[i * kw + tw];
                    aw[i * W + pw] = acc;
                }
            /* ah[td][ph][pw] = sum of aw over th in ph's range. */
            for (int64_t td = 0; td < kd; ++td)
                for (int64_t ph = 0; ph < H; ++ph) {
                    const int64_t lo = ph - Hc + 1 > 0 ? ph - Hc + 1 : 0, hi = ph < kh - 1 ? ph : kh - 1;
                    double *dst = ah + (td * H + ph) * W;
                    for (int64_t pw = 0; pw < W; ++pw)
                        dst[pw] = 0.0;
                    for (int64_t th = lo; th <= hi; ++th) {
                        const double *src = aw + (td * kh + th) * W;
                        for (int64_t pw = 0; pw < W; ++pw)
                            dst[pw] += src[pw];
                    }
                }
            /* grad_x[b][ci][pd] = sum of ah over td in pd's range. */
            float *gx = grad_x + bc * D * H * W;
            for (int64_t pd = 0; pd < D; ++pd) {
                const int64_t lo = pd - Dc + 1 > 0 ? pd - Dc + 1 : 0, hi = pd < kd - 1 ? pd : kd - 1;
                float *dst = gx + pd * H * W;
                for (int64_t i = 0; i < H * W; ++i) {
                    double acc = 0.0;
                    for (int64_t td = lo; td <= hi; ++td)
                        acc += ah[td * H * W + i];
                    dst[i] = (float)acc;
                }
            }
        }
    }
    free(scale), free(box), free(work);
    return CONVPOOL_OK;
}

convpool_status convpool_backward_cpu(const convpool_problem *p, const float *x, const float *weight,
                                      const void *codes, const float *grad_pooled, const float *grad_out,
                                      float *grad_x, float *grad_weight, float *grad_conv_bias, int threads)
{
    convpool_problem q;
    convpool_status s = convpool_check_inputs(p, x, weight, &q);
    if (s != CONVPOOL_OK)
        return s;
    s = convpool_check_codes_threads(codes, threads);
    if (s != CONVPOOL_OK)
        return s;
    s = convpool_check_code_window(&q);
    if (s != CONVPOOL_OK)
        return s;
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
    const int nt = (int)convpool_cpu_threads(threads, INT64_MAX);
    /* Every code must name a position of its window: the gathers and scatters below address
     * x and grad_x by it. One pass over the codes (a byte a window at most windows of 256)
     * before anything is written; the first bad one is named. */
    const int64_t pool_vol = q.pool_d * q.pool_h * q.pool_w, ncodes = B * C * npool;
    int64_t bad = ncodes;
#pragma omp parallel for schedule(static) reduction(min : bad) num_threads(nt)
    for (int64_t i = 0; i < ncodes; ++i)
        if ((int64_t)convpool_code_at(codes, width, i) >= pool_vol && i < bad)
            bad = i;
    if (bad < ncodes)
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT,
                             "codes[%lld] = %lld is outside its window of %lld positions (codes come from the "
                             "training forward)",
                             (long long)bad, (long long)convpool_code_at(codes, width, bad), (long long)pool_vol);
    if (!grad_x && !grad_weight) {
        cpb_grad_conv_bias(grad_pooled, grad_out, B, C, windows, div, npool, grad_conv_bias);
        return CONVPOOL_OK;
    }
    if (pool_vol == 1)
        return cpb_backward_pool1(&q, x, weight, grad_pooled, grad_out, grad_x, grad_weight, grad_conv_bias,
                                  windows, div, nt);

    /* Buffers: x or grad_x channels-last (one x-sized buffer serves both, in turn), the
     * weights channels-last, S[b][c], grad_weight partials and per-thread sums. grad_weight
     * items are (sample, run of bdw windows in raster order) with about CPB_ITEMS of them in
     * all, a partition of the problem alone. (Blocks of pooled d-rows made 56 items at the
     * headline's batch 8, 3.5 rounds of 16 threads; runs of windows make 64.) Sizes are
     * bounded in double first. */
    const int64_t K = taps * CI;
    const int64_t nblk_w = cpb_min64(npool, (CPB_ITEMS + B - 1) / B);
    const int64_t bdw = (npool + nblk_w - 1) / nblk_w, nitems_w = B * ((npool + bdw - 1) / bdw);
    const double need = (double)nx * 4.0 + (double)nw * 4.0 + (double)nitems_w * (double)C * (double)K * 4.0 +
                        (double)nt * (double)C * (double)K * 4.0;
    if (need > 1.0e15)
        return convpool_fail(CONVPOOL_ERR_OUT_OF_MEMORY, "backward: %.3g bytes of buffers do not fit in memory", need);
    cpb_scratch *big = cpb_scratch_take((size_t)nx * sizeof(float));
    float *cl = big ? (float *)big->p : NULL;
    float *w_cl = (float *)malloc((size_t)nw * sizeof(float));
    float *scale = (float *)malloc((size_t)(B * C) * sizeof(float));
    float *part = grad_weight ? (float *)malloc((size_t)(nitems_w * C * K) * sizeof(float)) : NULL;
    float *accs = grad_weight ? (float *)malloc((size_t)(nt * C * K) * sizeof(float)) : NULL;
    int64_t *wbufs = grad_weight ? (int64_t *)malloc((size_t)nt * 2 * CPB_WCHUNK * sizeof(int64_t)) : NULL;
    int64_t *off = pool_vol <= CPB_TABLE_MAX ? (int64_t *)malloc((size_t)pool_vol * sizeof(int64_t)) : NULL;
    if (!cl || !w_cl || !scale || (grad_weight && (!part || !accs || !wbufs)) || (pool_vol <= CPB_TABLE_MAX && !off)) {
        cpb_scratch_give(big);
        free(w_cl), free(scale), free(part), free(accs), free(wbufs), free(off);
        return convpool_fail(CONVPOOL_ERR_OUT_OF_MEMORY, "backward: cannot allocate %.3g bytes of buffers", need);
    }
    /* Nothing can fail from here on: the outputs are written only now. */
    cpb_grad_conv_bias(grad_pooled, grad_out, B, C, windows, div, npool, grad_conv_bias);
    cpb_geo geo = {D, H, W, CI, kd, kh, kw, taps, npool, NULL};
    if (off) {
        for (int64_t code = 0; code < pool_vol; ++code)
            off[code] = cpb_offset(&q, &geo, (uint32_t)code);
        geo.off = off;
    }
    cpb_scales(grad_pooled, grad_out, B, C, windows, div, scale);

    if (grad_weight) {
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t bp = 0; bp < B * D; ++bp) {
            const int64_t b = bp / D, d = bp % D;
            for (int64_t i = 0; i < H * W; ++i)
                for (int64_t ci = 0; ci < CI; ++ci)
                    cl[((b * D + d) * H * W + i) * CI + ci] = x[((b * CI + ci) * D + d) * H * W + i];
        }
        const int64_t per_b = nitems_w / B;
#pragma omp parallel num_threads(nt)
        {
            const int64_t tid = cpb_thread();
#pragma omp for schedule(dynamic)
            for (int64_t item = 0; item < nitems_w; ++item) {
                const int64_t b = item / per_b, w0 = (item % per_b) * bdw;
                const int64_t w1 = w0 + bdw < npool ? w0 + bdw : npool;
                cpb_weight_item(&q, &geo, cl, codes, width, scale, b, w0, w1, accs + tid * C * K,
                                part + item * C * K, wbufs + tid * 2 * CPB_WCHUNK);
            }
        }
        /* grad_weight[c][ci][t] = sum over the items, in order, in double; part is
         * [item][c][t][ci]. */
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t c = 0; c < C; ++c)
            for (int64_t ci = 0; ci < CI; ++ci)
                for (int64_t t = 0; t < taps; ++t) {
                    double acc = 0.0;
                    for (int64_t k = 0; k < nitems_w; ++k)
                        acc += (double)part[(k * C + c) * K + t * CI + ci];
                    grad_weight[(c * CI + ci) * taps + t] = (float)acc;
                }
    }

    if (grad_x) {
        for (int64_t c = 0; c < C; ++c)
            for (int64_t t = 0; t < taps; ++t)
                for (int64_t ci = 0; ci < CI; ++ci)
                    w_cl[(c * taps + t) * CI + ci] = weight[(c * CI + ci) * taps + t];
        /* Zeroed in parallel: one core's memset of an x-sized buffer (16.7 MB at the headline's
         * batch 8, 268 MB at 128) was a serial stretch of the step at 16 threads. */
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t bp = 0; bp < B * D; ++bp)
            memset(cl + bp * H * W * CI, 0, (size_t)(H * W * CI) * sizeof(float));
        /* Blocks of pooled d-rows far enough apart that blocks of one phase never share a row. */
        const int64_t bd = q.kernel_d > 1 ? (q.kernel_d - 1 + q.pool_d - 1) / q.pool_d : 1;
        const int64_t nblk = (q.pooled_d + bd - 1) / bd;
        for (int phase = 0; phase < 2; ++phase) {
            const int64_t nphase = (nblk - phase + 1) / 2;
#pragma omp parallel for schedule(dynamic) num_threads(nt)
            for (int64_t item = 0; item < B * nphase; ++item) {
                const int64_t b = item / nphase, blk = 2 * (item % nphase) + phase;
                const int64_t pd0 = blk * bd, pd1 = pd0 + bd < q.pooled_d ? pd0 + bd : q.pooled_d;
                cpb_grad_x_item(&q, &geo, w_cl, codes, width, scale, b, pd0, pd1, cl);
            }
        }
        /* Back to x's layout by (sample, d-plane), as x came in: each thread reads its planes of
         * cl once, in order, and writes CI contiguous rows. (By (sample, channel), every thread
         * read all of its sample's cl with a stride of CI floats: CI times the traffic, which
         * the memory bus, not the cores, limits at 16 threads.) */
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t bp = 0; bp < B * D; ++bp) {
            const int64_t b = bp / D, d = bp % D;
            const float *src = cl + bp * H * W * CI;
            for (int64_t i = 0; i < H * W; ++i)
                for (int64_t ci = 0; ci < CI; ++ci)
                    grad_x[((b * CI + ci) * D + d) * H * W + i] = src[i * CI + ci];
        }
    }
    cpb_scratch_give(big);
    free(w_cl), free(scale), free(part), free(accs), free(wbufs), free(off);
    return CONVPOOL_OK;
}

/* ---- the block's second half on a conv output (convpool_tail_train_cpu, _backward_cpu) ---- */

/* float32 <-> float16 and bfloat16 bits, round to nearest even, NaN to a quiet NaN: the
 * conversions of PyTorch's c10::Half and c10::BFloat16, in integer arithmetic (no reliance on
 * the FPU's rounding mode or on flush-to-zero). */
static uint16_t cp_f16_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7e00u;
    if (a >= 0x477ff000u) /* 65520 and above round to inf */
        return sign | 0x7c00u;
    if (a >= 0x38800000u) { /* a normal half: rebias the exponent, round at bit 13 */
        const uint32_t r = a - 0x38000000u;
        return (uint16_t)(sign | ((r + 0x0fffu + ((r >> 13) & 1u)) >> 13));
    }
    if (a <= 0x33000000u) /* at most 2^-25: rounds to (even) zero */
        return sign;
    /* A subnormal half, in units of 2^-24: the 24-bit significand shifted right by 126 - e. */
    const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    q += rem > half || (rem == half && (q & 1u));
    return (uint16_t)(sign | q);
}

static float cp_f16_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0 && m != 0) {
        const float v = ldexpf((float)m, -24);
        return sign ? -v : v;
    }
    const uint32_t x = e == 0x1fu ? sign | 0x7f800000u | (m << 13) : e ? sign | ((e + 112u) << 23) | (m << 13) : sign;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

static uint16_t cp_bf16_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if (isnan(f))
        return 0x7fc0u;
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static float cp_bf16_float(uint16_t h)
{
    const uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

/* Element i of a dtype array as float, and v rounded to dtype (as float). */
static inline float cp_tail_load(const void *a, convpool_dtype dt, int64_t i)
{
    return dt == CONVPOOL_DTYPE_F32   ? ((const float *)a)[i]
         : dt == CONVPOOL_DTYPE_F16 ? cp_f16_float(((const uint16_t *)a)[i])
                                      : cp_bf16_float(((const uint16_t *)a)[i]);
}

static inline float cp_tail_round(float v, convpool_dtype dt)
{
    return dt == CONVPOOL_DTYPE_F32 ? v : dt == CONVPOOL_DTYPE_F16 ? cp_f16_float(cp_f16_bits(v)) : cp_bf16_float(cp_bf16_bits(v));
}

static inline void cp_tail_store(void *a, convpool_dtype dt, int64_t i, float v)
{
    if (dt == CONVPOOL_DTYPE_F32)
        ((float *)a)[i] = v;
    else
        ((uint16_t *)a)[i] = dt == CONVPOOL_DTYPE_F16 ? cp_f16_bits(v) : cp_bf16_bits(v);
}

/* Floats of the train call's per-thread buffers: a chunk of a window row's quotients. */
#define CP_TAIL_BUF 1024
/* Window positions up to which the backward looks code offsets up in a table. */
#define CP_TAIL_TABLE ((int64_t)1 << 16)

/* q[e] = y[at + e] / d rounded to dtype, for n elements: one typed loop per dtype. */
static void cp_tail_quotients(const void *y, convpool_dtype dt, int64_t at, int64_t n, float d, float *q)
{
    if (dt == CONVPOOL_DTYPE_F32) {
        const float *p = (const float *)y + at;
        for (int64_t e = 0; e < n; ++e)
            q[e] = p[e] / d;
    } else if (dt == CONVPOOL_DTYPE_F16) {
        const uint16_t *p = (const uint16_t *)y + at;
        for (int64_t e = 0; e < n; ++e)
            q[e] = cp_f16_float(cp_f16_bits(cp_f16_float(p[e]) / d));
    } else {
        const uint16_t *p = (const uint16_t *)y + at;
        for (int64_t e = 0; e < n; ++e)
            q[e] = cp_bf16_float(cp_bf16_bits(cp_bf16_float(p[e]) / d));
    }
}

/* n elements of a dtype array from at set to the dtype's value v (already representable). */
static void cp_tail_fill(void *a, convpool_dtype dt, int64_t at, int64_t n, float v)
{
    if (dt == CONVPOOL_DTYPE_F32) {
        float *p = (float *)a + at;
        for (int64_t e = 0; e < n; ++e)
            p[e] = v;
    } else {
        const uint16_t bits = dt == CONVPOOL_DTYPE_F16 ? cp_f16_bits(v) : cp_bf16_bits(v);
        uint16_t *p = (uint16_t *)a + at;
        for (int64_t e = 0; e < n; ++e)
            p[e] = bits;
    }
}

/* The offset in y, in elements, of window position c (raster d, h, w) from the window's first. */
static inline int64_t cp_tail_offset(const convpool_problem *q, int64_t c)
{
    return ((c / (q->pool_h * q->pool_w)) * q->conv_h + (c / q->pool_w) % q->pool_h) * q->conv_w + c % q->pool_w;
}

convpool_status convpool_tail_train_cpu(const convpool_problem *p, convpool_dtype dtype, const void *y, void *m,
                                        void *codes, int threads)
{
    convpool_problem q;
    int64_t elem = 0;
    convpool_status s = convpool_check_codes_threads(codes, threads);
    if (s == CONVPOOL_OK)
        s = convpool_check_tail(p, dtype, 0, codes, y, m, &q, &elem);
    if (s != CONVPOOL_OK)
        return s;
    const int width = convpool_code_bytes(&q);
    const int64_t plane = q.conv_d * q.conv_h * q.conv_w;
    const float d = (float)q.divisor;
    /* Items: (sample, channel, pooled d-row). A row of windows runs in chunks of up to
     * CP_TAIL_BUF / pool_w windows: each window row's quotients for the chunk are formed at
     * once (contiguous, typed: the division vectorises), then scanned in window order. */
    const int64_t items = q.batch * q.out_channels * q.pooled_d;
    const int64_t per_chunk = q.pool_w <= CP_TAIL_BUF ? CP_TAIL_BUF / q.pool_w : 0;
    const int nt = (int)convpool_cpu_threads(threads, items);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t it = 0; it < items; ++it) {
        const int64_t pd = it % q.pooled_d, bc = it / q.pooled_d;
        const int64_t y0 = bc * plane;
        float buf[CP_TAIL_BUF], best[CP_TAIL_BUF];
        uint32_t code[CP_TAIL_BUF];
        for (int64_t ph = 0; ph < q.pooled_h; ++ph) {
            const int64_t win0 = (it * q.pooled_h + ph) * q.pooled_w;
            if (per_chunk == 0) { /* windows wider than the buffer: element by element */
                for (int64_t pw = 0; pw < q.pooled_w; ++pw) {
                    float b = -INFINITY;
                    uint32_t c = 0, pos = 0;
                    for (int64_t i = 0; i < q.pool_d; ++i)
                        for (int64_t j = 0; j < q.pool_h; ++j) {
                            const int64_t row = y0 + ((pd * q.pool_d + i) * q.conv_h + ph * q.pool_h + j) * q.conv_w +
                                                pw * q.pool_w;
                            for (int64_t k = 0; k < q.pool_w; ++k, ++pos) {
                                float v;
                                cp_tail_quotients(y, dtype, row + k, 1, d, &v);
                                if (v > b || isnan(v)) {
                                    b = v;
                                    c = pos;
                                }
                            }
                        }
                    cp_tail_store(m, dtype, win0 + pw, b);
                    convpool_code_store(codes, width, win0 + pw, c);
                }
                continue;
            }
            for (int64_t pw0 = 0; pw0 < q.pooled_w; pw0 += per_chunk) {
                const int64_t nw = q.pooled_w - pw0 < per_chunk ? q.pooled_w - pw0 : per_chunk;
                for (int64_t c = 0; c < nw; ++c)
                    best[c] = -INFINITY, code[c] = 0;
                uint32_t pos = 0;
                for (int64_t i = 0; i < q.pool_d; ++i)
                    for (int64_t j = 0; j < q.pool_h; ++j, pos += (uint32_t)q.pool_w) {
                        const int64_t row =
                            y0 + ((pd * q.pool_d + i) * q.conv_h + ph * q.pool_h + j) * q.conv_w + pw0 * q.pool_w;
                        cp_tail_quotients(y, dtype, row, nw * q.pool_w, d, buf);
                        for (int64_t c = 0; c < nw; ++c) {
                            const float *qv = buf + c * q.pool_w;
                            float b = best[c];
                            uint32_t cd = code[c];
                            for (int64_t k = 0; k < q.pool_w; ++k)
                                if (qv[k] > b || isnan(qv[k])) {
                                    b = qv[k];
                                    cd = pos + (uint32_t)k;
                                }
                            best[c] = b, code[c] = cd;
                        }
                    }
                for (int64_t c = 0; c < nw; ++c) {
                    cp_tail_store(m, dtype, win0 + pw0 + c, best[c]);
                    convpool_code_store(codes, width, win0 + pw0 + c, code[c]);
                }
            }
        }
    }
    return CONVPOOL_OK;
}

convpool_status convpool_tail_backward_cpu(const convpool_problem *p, convpool_dtype dtype, const void *codes,
                                           const void *grad_m, void *grad_y, int threads)
{
    convpool_problem q;
    int64_t elem = 0;
    convpool_status s = convpool_check_codes_threads(codes, threads);
    if (s == CONVPOOL_OK)
        s = convpool_check_tail(p, dtype, 1, codes, grad_m, grad_y, &q, &elem);
    if (s != CONVPOOL_OK)
        return s;
    const int width = convpool_code_bytes(&q);
    const int64_t B = q.batch, C = q.out_channels, npool = convpool_pooled_count(&q);
    const float d = (float)q.divisor;
    const float zero = cp_tail_round(0.0f / d, dtype);
    /* Items: (sample, channel, block of pool_d conv d-planes; the last block may be a partial
     * one past the last whole window). Each block is filled with the zero's quotient (one
     * contiguous run), then each window writes its gradient's quotient at its code's offset
     * in y, from a table built once (window positions up to CP_TAIL_TABLE): no branch on
     * whether a row holds a window's pick, which mispredicted a quarter of the time. */
    const int64_t wpos = q.pool_d * q.pool_h * q.pool_w;
    int64_t *tab = NULL;
    if (wpos <= CP_TAIL_TABLE) {
        tab = (int64_t *)malloc((size_t)wpos * sizeof(int64_t));
        if (!tab)
            return convpool_fail(CONVPOOL_ERR_OUT_OF_MEMORY, "cannot allocate the %lld-entry code table",
                                 (long long)wpos);
        for (int64_t c = 0; c < wpos; ++c)
            tab[c] = cp_tail_offset(&q, c);
    }
    const int64_t dblocks = (q.conv_d + q.pool_d - 1) / q.pool_d, items = B * C * dblocks;
    const int nt = (int)convpool_cpu_threads(threads, items);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t it = 0; it < items; ++it) {
        const int64_t pd = it % dblocks, bc = it / dblocks, d0 = pd * q.pool_d;
        const int64_t nd = q.conv_d - d0 < q.pool_d ? q.conv_d - d0 : q.pool_d;
        const int64_t g0 = (bc * q.conv_d + d0) * q.conv_h * q.conv_w;
        cp_tail_fill(grad_y, dtype, g0, nd * q.conv_h * q.conv_w, zero);
        if (pd >= q.pooled_d)
            continue;
        int64_t win = bc * npool + pd * q.pooled_h * q.pooled_w;
        for (int64_t ph = 0; ph < q.pooled_h; ++ph)
            for (int64_t pw = 0; pw < q.pooled_w; ++pw, ++win) {
                const int64_t c = (int64_t)convpool_code_at(codes, width, win);
                if (c >= wpos)
                    continue; /* not a position of the window: no gradient */
                const int64_t off = tab ? tab[c] : cp_tail_offset(&q, c);
                cp_tail_store(grad_y, dtype, g0 + ph * q.pool_h * q.conv_w + pw * q.pool_w + off,
                              cp_tail_round(cp_tail_load(grad_m, dtype, win) / d, dtype));
            }
    }
    free(tab);
    return CONVPOOL_OK;
}
