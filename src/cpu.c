/*
 * convpool_forward_cpu: the fused CPU path. The conv output never reaches memory.
 *
 * Idea. Pooling windows partition the conv rows that survive floor mode, so each conv value is
 * computed once and folded while it is hot. Conv rows of a block of CP_COB output channels are
 * folded element-wise into a per-thread row-max buffer (the NaN-propagating max over the
 * pool_d x pool_h rows of one pooled row); the horizontal sweep then takes the max over each
 * pool_w run, applies conv bias and divisor once per window and adds the window value into
 * per-column double sums.
 *
 * Conv bias and divisor commute with max per channel when the divisor is finite and nonzero
 * and the conv bias is finite: max((y + cb) / d) == (max(y) + cb) / d for d > 0 and
 * (min(y) + cb) / d for d < 0, bit for bit, because float add and divide are monotone; min is
 * taken as -max(-y). Other channel blocks are done literally: every element gets + cb and / d
 * before the max, as PyTorch does (x / 0 = +-inf, 0 / 0 = NaN). The divisor is rounded to float
 * first, as PyTorch does with a Python scalar.
 *
 * Two ways to get the conv values:
 *   direct    a register-blocked microkernel, taps in the fixed order ci, kd, kh, kw: one fmaf
 *             chain per output. Any shape.
 *   winograd  F(2x2, 3x3) over (h, w), direct over (ci, kd): 16 products per 2x2 outputs
 *             instead of 36. Used when kernel_h = kernel_w = 3 and pool_h, pool_w are even, so
 *             each 2x2 output tile lies inside one pooling window and is reduced to its max at
 *             once. The transforms mix neighbouring inputs (an inf would become inf - inf), so
 *             it needs finite, bounded inputs: weights are checked once, and a work item whose
 *             input region holds a NaN, an inf or a value above 2^40 is redone direct.
 *
 * Determinism. Work items are fixed blocks of (batch item, pooled d, h, w) chosen from the
 * problem alone; each writes per-channel partial sums to its own slot, combined in item order.
 * Nothing depends on the thread count, the schedule or the batch size, so results are
 * bit-identical across runs and thread counts, and a sample's result does not depend on the
 * rest of the batch. Every variant performs the same correctly rounded operations per element
 * in the same order (fmaf chains, element-wise adds), so results are also identical across
 * variants.
 *
 * Variants, picked at run time from CPUID (CONVPOOL_CPU_ISA=avx512|avx2|scalar caps the choice,
 * for testing the narrower ones):
 *   avx512  direct 4 channels x 4 vectors (masked loads only at the very end of x); Winograd
 *           products 4 channels x up to 4 vectors of tiles
 *   avx2    the same with FMA on 8 floats, 4 x 3 vectors
 *   scalar  loops over fmaf, for CPUs without AVX2+FMA and non-x86 builds
 * The transforms and the pooling passes are plain element-wise loops compiled once per variant.
 *
 * Training (convpool_forward_train_cpu, convpool_codes_cpu): the same passes also record each
 * window's arg-max code. Winograd items keep the 2x2 outputs of every row (cp_wout_rows) and
 * settle near-ties in double (see the codes section below); direct items keep every conv row
 * once and the forward folds them itself. The training forward's pooled and out are the
 * forward's, bit for bit.
 */
#include "internal.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__GNUC__) && defined(__x86_64__)
#define CP_X86 1
#include <immintrin.h>
#define CP_TARGET_AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl")))
#define CP_TARGET_AVX2 __attribute__((target("avx2,fma")))
#else
#define CP_X86 0
#endif

#if defined(__GNUC__)
#define CP_INLINE static inline __attribute__((always_inline))
#else
#define CP_INLINE static inline
#endif

/* Element-wise loops over tiles: vectorise without runtime alias checks (there are too many
 * streams for GCC to version them). Only element-wise, so no reassociation is allowed. */
#define CP_PRAGMA(x) _Pragma(#x)
#if defined(_OPENMP)
#define CP_SIMD CP_PRAGMA(omp simd)
#define CP_SIMD_OR(v) CP_PRAGMA(omp simd reduction(| : v))
#define CP_SIMD_SUM(v) CP_PRAGMA(omp simd reduction(+ : v))
#define CP_SIMD_MIN(v) CP_PRAGMA(omp simd reduction(min : v))
#elif defined(__GNUC__)
#define CP_SIMD CP_PRAGMA(GCC ivdep)
#define CP_SIMD_OR(v) CP_PRAGMA(GCC ivdep)
#define CP_SIMD_SUM(v) CP_PRAGMA(GCC ivdep)
#define CP_SIMD_MIN(v) CP_PRAGMA(GCC ivdep)
#else
#define CP_SIMD
#define CP_SIMD_OR(v)
#define CP_SIMD_SUM(v)
#define CP_SIMD_MIN(v)
#endif

/* Output channels per microkernel call; weights are zero-padded to a multiple of it. */
#define CP_COB 4
/* Columns per scalar direct call, tiles per scalar Winograd call. */
#define CP_SCALAR_TILE 16
/* Winograd tile rows are padded to a multiple of the widest vector. */
#define CP_TILE_ALIGN 16
/* Work per item (multiply-adds) below which a sample is not split further, and the most
 * items one sample is split into: enough to spread batch 1 over many cores. */
#define CP_ITEM_MIN_MACS (1 << 19)
#define CP_ITEMS_PER_SAMPLE_MAX 64
/* Multiply-adds per dynamic-schedule grab, at least. */
#define CP_GRAB_MACS 4194304.0
/* Floats per cache line; scratch pieces are whole lines. */
#define CP_LINE_FLOATS 16
/* Cap on the partial-sum slots live at once; larger batches run in fixed-size chunks. */
#define CP_PARTIAL_BYTES_MAX ((int64_t)32 << 20)
/* Scratch beyond this (2^56 bytes) can never be allocated; sizes are bounded before int64 math. */
#define CP_SCRATCH_BYTES_MAX 72057594037927936.0
/* Threads beyond this are never started, whatever the caller or OMP_NUM_THREADS asks for. */
#define CP_THREADS_MAX 1024
/* Winograd bound on |x| and |w|: 2^40 keeps every transformed sum far from FLT_MAX. */
#define CP_WINO_LIMIT 1099511627776.0f
#define CP_WINO_LIMIT_BITS 0x53800000 /* 2^40 as float bits */
/* Winograd scratch per thread (floats) above which the direct path is used instead: many
 * input channels would push the transformed planes out of cache anyway. */
#define CP_WINO_SCRATCH_MAX ((int64_t)1 << 21)
/* Columns of a staged chunk: 16 tiles read 34. */
#define CP_WIN_STAGE 48

/* How a channel block turns conv values into pooled values. */
enum { CP_MODE_LITERAL = 0, CP_MODE_MAX = 1, CP_MODE_NEGMAX = 2 };

/* One direct microkernel call: a conv row segment for CP_COB channels, folded into rmax. */
typedef struct cp_tile_args {
    const float *x;           /* x at (b, ci 0, d, h, w0) */
    int64_t s_ci, s_d, s_h;   /* x strides of ci, d, h */
    int64_t cin, kd, kh, kw;
    int64_t valid;            /* columns of this x row from w0 on: in_w - w0 */
    int64_t ncols;            /* conv columns wanted from w0 on (scalar variant) */
    const float *w;           /* packed weights [ci][kd][kh][kw][CP_COB] of the block */
    const float *cb;          /* conv bias of the block, CP_COB floats */
    float div;
    int mode;                 /* CP_MODE_* of the block */
    int first;                /* first conv row of the window row: store, don't fold */
    float *rmax;              /* row-max buffer at (channel co0, column w0 - c0) */
    int64_t rstride;          /* floats between channels in rmax */
} cp_tile_args;

/* Winograd input transform, first half: the column transform d B of whole input rows, done
 * once per row of the item (two row pairs share each row). */
typedef struct cp_wcol_args {
    const float *x;           /* x at (b, ci, plane, first row, c0) */
    int64_t s_h, nrows;
    int64_t nt, tpad;         /* tiles, padded tile count */
    const float *x_end;       /* one past the last element of x */
    float *c;                 /* C [nrows][4][tpad] */
    float *stage;             /* CP_WIN_STAGE floats for a chunk at the very end of x */
    int32_t *margin;          /* NULL, or lowered to the least cp_unfit_bits of the x read */
} cp_wcol_args;

/* Second half: V = B^T (d B) for one row pair, for every (ci, plane). */
typedef struct cp_wrow_args {
    const float *c;           /* C of (ci 0, plane 0) at the pair's first row */
    int64_t s_cp;             /* C stride between (ci, plane) */
    int64_t n;                /* (ci, plane) count */
    int64_t tpad;
    float *v;                 /* V [(ci, plane)][16][tpad] */
} cp_wrow_args;

/* Winograd products: M[xi][co][t] = sum over (ci, kd) of U[xi][co][ci][kd] * V[ci][kd][xi][t]. */
typedef struct cp_wgemm_args {
    const float *v;           /* V at (ci 0, first plane, xi 0, tile 0) */
    int64_t s_ci, s_kd, s_xi; /* V strides */
    int64_t cin, kd;
    const float *u;           /* U [xi][block][ci][kd][CP_COB] */
    int64_t blocks;
    float *m;                 /* M [xi][blocks * CP_COB][tpad] */
    int64_t tpad;             /* tiles, all computed (V is zero-padded) */
} cp_wgemm_args;

/* Winograd output transform Y = A^T M A, 2x2 max, fold into rmax (one entry per tile). */
typedef struct cp_wout_args {
    const float *m;
    int64_t tpad, cpad, cout;
    const unsigned char *mode; /* per channel */
    const float *cb;
    float div;
    int first;
    float *rmax;
    int64_t rstride;
} cp_wout_args;

/* One pooled row: max over pool_w runs, bias and divisor, into per-column double sums. */
typedef struct cp_hpass_args {
    const float *rmax;
    int64_t rstride;
    int64_t cout, npw, pool_w;
    const unsigned char *mode; /* per channel */
    const float *cb;
    float div;
    double *wsum;              /* [cout][npw] */
} cp_hpass_args;

struct cp_plan;  /* below: the table's training passes take them */
struct cp_range;

typedef struct cp_isa {
    const char *name;
    int64_t vec;    /* floats per vector (1 for scalar) */
    int64_t max_nw; /* vectors per direct microkernel call */
    void (*tile)(const cp_tile_args *t, int nw, int tail);
    void (*hpass)(const cp_hpass_args *a);
    int (*wcol)(const cp_wcol_args *a); /* returns 1 if an input is unfit for Winograd */
    void (*wrow)(const cp_wrow_args *a);
    void (*wgemm)(const cp_wgemm_args *g);
    void (*wout)(const cp_wout_args *a);
    /* The training forward's Winograd codes: its conv rows, then their scan (cp_wout_rows_body,
     * cp_scan_wino_body). */
    void (*wout_rows)(const cp_wout_args *a, int64_t nt, float *rows, int64_t cstride, int64_t row0);
    void (*scan_wino)(const struct cp_plan *pl, int64_t b, struct cp_range r, int64_t pd, int64_t ph,
                      const float *rows, void *codes, int width, const float *tol, const float *weight);
} cp_isa;

/* Everything a work item needs; shared read-only by all threads. */
typedef struct cp_plan {
    convpool_problem p;
    const float *x;
    const cp_isa *isa;
    const float *wpack;          /* [blocks][cin][kd][kh][kw][CP_COB] */
    const float *upack;          /* Winograd U [16][blocks][cin][kd][CP_COB], or NULL */
    const float *cb;             /* [blocks * CP_COB], 0 for padding */
    const unsigned char *mode;   /* [blocks * CP_COB] */
    float div;
    int64_t blocks;
    int64_t nbd, nbh, nbw;       /* item blocks along pooled d, h, w */
    int64_t dsz, hsz, wsz;       /* pooled positions per block */
    int64_t items;               /* per sample */
    int64_t rwidth;              /* row-max buffer width (floats per channel) */
    int64_t tpad;                /* Winograd tiles per row, padded */
    int64_t vplanes;             /* Winograd input planes per pooled-d: pool_d + kd - 1 */
} cp_plan;

/* Per-thread scratch. */
typedef struct cp_scratch {
    float *rmax;
    double *wsum;
    float *c, *v, *m, *stage;
} cp_scratch;

/* ---- helpers ---- */

static int64_t cp_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t cp_min(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t cp_max(int64_t a, int64_t b) { return a > b ? a : b; }

/* MaxPool3d's comparison: a NaN seen anywhere wins, and stays. Written as a bit select, which
 * GCC vectorises even where the result is stored back over m. */
CP_INLINE float cp_nanmax(float m, float v)
{
    const uint32_t take = 0u - (uint32_t)((v > m) | (v != v));
    uint32_t um, uv;
    memcpy(&um, &m, sizeof um);
    memcpy(&uv, &v, sizeof uv);
    um = (uv & take) | (um & ~take);
    memcpy(&m, &um, sizeof m);
    return m;
}

/* p rounded up to the next cache line (buffers are over-allocated by one line). */
static void *cp_align_line(void *p)
{
    return (void *)(((uintptr_t)p + CP_LINE_FLOATS * sizeof(float) - 1) &
                    ~(uintptr_t)(CP_LINE_FLOATS * sizeof(float) - 1));
}

/* count * elem fits size_t; returns 0 if not. */
static int cp_bytes(int64_t count, size_t elem, size_t *bytes)
{
    if (count < 0 || (uint64_t)count > SIZE_MAX / elem)
        return 0;
    *bytes = (size_t)count * elem;
    return 1;
}

/* ---- generic pieces, inlined into every variant so they vectorise at its width ---- */

CP_INLINE float cp_window_max(const float *r, int64_t pool_w)
{
    float m = r[0];
    for (int64_t k = 1; k < pool_w; ++k)
        m = cp_nanmax(m, r[k]);
    return m;
}

CP_INLINE void cp_hpass_impl(const cp_hpass_args *a, int64_t pool_w)
{
    const int64_t npw = a->npw;
    const float div = a->div;
    for (int64_t co = 0; co < a->cout; ++co) {
        const float *r = a->rmax + co * a->rstride;
        double *s = a->wsum + co * npw;
        const float cb = a->cb[co];
        if (a->mode[co] == CP_MODE_LITERAL) {
            for (int64_t i = 0; i < npw; ++i)
                s[i] += (double)cp_window_max(r + i * pool_w, pool_w);
        } else if (a->mode[co] == CP_MODE_MAX) {
            for (int64_t i = 0; i < npw; ++i)
                s[i] += (double)((cp_window_max(r + i * pool_w, pool_w) + cb) / div);
        } else {
            for (int64_t i = 0; i < npw; ++i)
                s[i] += (double)((-cp_window_max(r + i * pool_w, pool_w) + cb) / div);
        }
    }
}

CP_INLINE void cp_hpass_generic(const cp_hpass_args *a)
{
    if (a->pool_w == 1)
        cp_hpass_impl(a, 1);
    else if (a->pool_w == 2)
        cp_hpass_impl(a, 2);
    else
        cp_hpass_impl(a, a->pool_w);
}

/* Winograd transforms. B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1] on the input, columns
 * first; A^T = [1 1 1 0; 0 1 -1 -1] on the products. Tiles go in chunks of 16 (tpad is a
 * multiple of 16) so the loops vectorise without remainders at every width. */

/* An input is unfit (NaN, infinite, or above CP_WINO_LIMIT in magnitude) iff this is negative:
 * on the bit pattern |x| orders like an integer and NaN lies above inf. */
CP_INLINE int32_t cp_unfit_bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return (int32_t)CP_WINO_LIMIT_BITS - (int32_t)(u & 0x7fffffffu);
}

CP_INLINE int32_t cp_min32(int32_t a, int32_t b) { return a < b ? a : b; }

/* d B for the first nv (1..16) of 16 tiles of one row; x holds the row from the chunk's first
 * column, and all 34 columns must be readable memory. Tiles past nv read whatever follows the
 * row but come out as zeros and are not checked. Returns the least cp_unfit_bits of the
 * columns used: negative iff one is unfit, else CP_WINO_LIMIT_BITS less the bits of their
 * largest |x| (the training forward's near-tie bound takes that max). */
CP_INLINE int32_t cp_wcol16(const float *x, int64_t nv, float *c, int64_t tpad)
{
    int32_t fit = INT32_MAX;
    CP_SIMD_MIN(fit)
    for (int k = 0; k < 16; ++k) {
        const float x0 = x[2 * k], x1 = x[2 * k + 1], x2 = x[2 * k + 2], x3 = x[2 * k + 3];
        const int valid = k < nv;
        const int32_t u = valid ? cp_min32(cp_unfit_bits(x0), cp_unfit_bits(x1)) : INT32_MAX;
        fit = u < fit ? u : fit;
        c[k] = valid ? x0 - x2 : 0.0f;
        c[tpad + k] = valid ? x1 + x2 : 0.0f;
        c[2 * tpad + k] = valid ? x2 - x1 : 0.0f;
        c[3 * tpad + k] = valid ? x1 - x3 : 0.0f;
    }
    return cp_min32(fit, cp_min32(cp_unfit_bits(x[2 * nv]), cp_unfit_bits(x[2 * nv + 1])));
}

CP_INLINE int cp_wcol_generic(const cp_wcol_args *a)
{
    const int64_t nt = a->nt, tpad = a->tpad, ncol = 2 * nt + 2;
    int32_t fit = INT32_MAX;
    for (int64_t rr = 0; rr < a->nrows; ++rr) {
        const float *x = a->x + rr * a->s_h;
        float *c = a->c + rr * 4 * tpad;
        for (int64_t t0 = 0; t0 < tpad; t0 += 16) {
            const int64_t nv = cp_min(16, nt - t0);
            if (nv <= 0) {
                for (int j = 0; j < 4; ++j)
                    for (int k = 0; k < 16; ++k)
                        c[j * tpad + t0 + k] = 0.0f;
            } else if (2 * t0 + 34 <= a->x_end - x) {
                fit = cp_min32(fit, cp_wcol16(x + 2 * t0, nv, c + t0, tpad));
            } else {
                /* The chunk would read past the end of x: a zero-padded copy. */
                for (int64_t k = 0; k < CP_WIN_STAGE; ++k)
                    a->stage[k] = 2 * t0 + k < ncol ? x[2 * t0 + k] : 0.0f;
                fit = cp_min32(fit, cp_wcol16(a->stage, nv, c + t0, tpad));
            }
        }
    }
    if (a->margin && fit < *a->margin)
        *a->margin = fit;
    return fit < 0;
}

CP_INLINE void cp_wrow_generic(const cp_wrow_args *a)
{
    const int64_t tpad = a->tpad;
    for (int64_t n = 0; n < a->n; ++n) {
        const float *c0 = a->c + n * a->s_cp, *c1 = c0 + 4 * tpad, *c2 = c1 + 4 * tpad,
                    *c3 = c2 + 4 * tpad;
        float *v = a->v + n * 16 * tpad;
        for (int64_t t0 = 0; t0 < tpad; t0 += 16)
            for (int j = 0; j < 4; ++j) {
                const int64_t o = j * tpad + t0;
                CP_SIMD
                for (int k = 0; k < 16; ++k) {
                    const float d0 = c0[o + k], d1 = c1[o + k], d2 = c2[o + k], d3 = c3[o + k];
                    v[o + k] = d0 - d2;
                    v[4 * tpad + o + k] = d1 + d2;
                    v[8 * tpad + o + k] = d2 - d1;
                    v[12 * tpad + o + k] = d1 - d3;
                }
            }
    }
}

/* Y = A^T M A with A^T = [1 1 1 0; 0 1 -1 -1]; then bias/divisor or negation per mode, the
 * max of the 2x2 outputs in PyTorch's scan order, and the fold into rmax. */
CP_INLINE void cp_wout_row(const cp_wout_args *a, int64_t co, const int mode, const int first)
{
    const int64_t xs = a->cpad * a->tpad;
    const float *mb = a->m + co * a->tpad;
    const float cb = a->cb[co], div = a->div;
    float *r = a->rmax + co * a->rstride;
    for (int64_t t0 = 0; t0 < a->tpad; t0 += 16) {
        const float *m = mb + t0;
        float *rt = r + t0;
        CP_SIMD
        for (int k = 0; k < 16; ++k) {
            float s0[4], s1[4];
            for (int j = 0; j < 4; ++j) {
                s0[j] = m[j * xs + k] + m[(4 + j) * xs + k] + m[(8 + j) * xs + k];
                s1[j] = m[(4 + j) * xs + k] - m[(8 + j) * xs + k] - m[(12 + j) * xs + k];
            }
            float y[4] = {s0[0] + s0[1] + s0[2], s0[1] - s0[2] - s0[3], s1[0] + s1[1] + s1[2],
                          s1[1] - s1[2] - s1[3]};
            for (int q = 0; q < 4; ++q) {
                if (mode == CP_MODE_LITERAL)
                    y[q] = (y[q] + cb) / div;
                else if (mode == CP_MODE_NEGMAX)
                    y[q] = -y[q];
            }
            const float mx = cp_nanmax(cp_nanmax(cp_nanmax(y[0], y[1]), y[2]), y[3]);
            rt[k] = first ? mx : cp_nanmax(rt[k], mx);
        }
    }
}

CP_INLINE void cp_wout_generic(const cp_wout_args *a)
{
    for (int64_t co = 0; co < a->cout; ++co) {
        const int mode = a->mode[co];
        if (a->first) {
            if (mode == CP_MODE_LITERAL) cp_wout_row(a, co, CP_MODE_LITERAL, 1);
            else if (mode == CP_MODE_MAX) cp_wout_row(a, co, CP_MODE_MAX, 1);
            else cp_wout_row(a, co, CP_MODE_NEGMAX, 1);
        } else {
            if (mode == CP_MODE_LITERAL) cp_wout_row(a, co, CP_MODE_LITERAL, 0);
            else if (mode == CP_MODE_MAX) cp_wout_row(a, co, CP_MODE_MAX, 0);
            else cp_wout_row(a, co, CP_MODE_NEGMAX, 0);
        }
    }
}

/* ---- scalar variant ---- */

static void cp_tile_scalar(const cp_tile_args *t, int nw, int tail)
{
    (void)nw;
    (void)tail;
    float acc[CP_COB][CP_SCALAR_TILE];
    const int64_t ncols = t->ncols;
    for (int j = 0; j < CP_COB; ++j)
        for (int64_t n = 0; n < ncols; ++n)
            acc[j][n] = 0.0f;
    const float *wp = t->w;
    for (int64_t ci = 0; ci < t->cin; ++ci)
        for (int64_t kd = 0; kd < t->kd; ++kd)
            for (int64_t kh = 0; kh < t->kh; ++kh) {
                const float *xr = t->x + ci * t->s_ci + kd * t->s_d + kh * t->s_h;
                for (int64_t kw = 0; kw < t->kw; ++kw, wp += CP_COB)
                    for (int j = 0; j < CP_COB; ++j)
                        for (int64_t n = 0; n < ncols; ++n)
                            acc[j][n] = fmaf(wp[j], xr[kw + n], acc[j][n]);
            }
    for (int j = 0; j < CP_COB; ++j) {
        float *r = t->rmax + j * t->rstride;
        for (int64_t n = 0; n < ncols; ++n) {
            float v = acc[j][n];
            if (t->mode == CP_MODE_LITERAL)
                v = (v + t->cb[j]) / t->div;
            else if (t->mode == CP_MODE_NEGMAX)
                v = -v;
            r[n] = t->first ? v : cp_nanmax(r[n], v);
        }
    }
}

static void cp_wgemm_scalar(const cp_wgemm_args *g)
{
    const int64_t taps = g->cin * g->kd;
    for (int64_t xi = 0; xi < 16; ++xi)
        for (int64_t blk = 0; blk < g->blocks; ++blk) {
            const float *u0 = g->u + (xi * g->blocks + blk) * taps * CP_COB;
            for (int64_t t0 = 0; t0 < g->tpad; t0 += CP_SCALAR_TILE) {
                const int64_t n = cp_min(CP_SCALAR_TILE, g->tpad - t0);
                float acc[CP_COB][CP_SCALAR_TILE];
                for (int j = 0; j < CP_COB; ++j)
                    for (int64_t k = 0; k < n; ++k)
                        acc[j][k] = 0.0f;
                const float *u = u0;
                for (int64_t ci = 0; ci < g->cin; ++ci)
                    for (int64_t kd = 0; kd < g->kd; ++kd, u += CP_COB) {
                        const float *vr = g->v + ci * g->s_ci + kd * g->s_kd + xi * g->s_xi + t0;
                        for (int j = 0; j < CP_COB; ++j)
                            for (int64_t k = 0; k < n; ++k)
                                acc[j][k] = fmaf(u[j], vr[k], acc[j][k]);
                    }
                float *m = g->m + (xi * g->blocks * CP_COB + blk * CP_COB) * g->tpad + t0;
                for (int j = 0; j < CP_COB; ++j)
                    for (int64_t k = 0; k < n; ++k)
                        m[j * g->tpad + k] = acc[j][k];
            }
        }
}

static void cp_hpass_scalar(const cp_hpass_args *a) { cp_hpass_generic(a); }
static int cp_wcol_scalar(const cp_wcol_args *a) { return cp_wcol_generic(a); }
static void cp_wrow_scalar(const cp_wrow_args *a) { cp_wrow_generic(a); }
static void cp_wout_scalar(const cp_wout_args *a) { cp_wout_generic(a); }

#if CP_X86

/* ---- avx512 variant ---- */

/* The first `lanes` lanes (clamped to 0..16). Branch-free: a branch in the tap loop makes GCC
 * keep the accumulators on the stack. */
CP_TARGET_AVX512 CP_INLINE __mmask16 cp_mask16(int64_t lanes)
{
    const uint32_t n = (uint32_t)cp_max(0, cp_min(16, lanes));
    return (__mmask16)((1u << n) - 1u);
}

CP_TARGET_AVX512 CP_INLINE void cp_tile_avx512_impl(const cp_tile_args *t, const int nw,
                                                    const int tail)
{
    __m512 acc[CP_COB][4];
    for (int j = 0; j < CP_COB; ++j)
        for (int n = 0; n < nw; ++n)
            acc[j][n] = _mm512_setzero_ps();
    const float *wp = t->w;
    for (int64_t ci = 0; ci < t->cin; ++ci)
        for (int64_t kd = 0; kd < t->kd; ++kd)
            for (int64_t kh = 0; kh < t->kh; ++kh) {
                const float *xr = t->x + ci * t->s_ci + kd * t->s_d + kh * t->s_h;
                for (int64_t kw = 0; kw < t->kw; ++kw, wp += CP_COB) {
                    __m512 xv[4];
                    for (int n = 0; n < nw; ++n) {
                        if (tail && n == nw - 1)
                            xv[n] = _mm512_maskz_loadu_ps(cp_mask16(t->valid - kw - 16 * n),
                                                          xr + kw + 16 * n);
                        else
                            xv[n] = _mm512_loadu_ps(xr + kw + 16 * n);
                    }
                    for (int j = 0; j < CP_COB; ++j) {
                        const __m512 wv = _mm512_set1_ps(wp[j]);
                        for (int n = 0; n < nw; ++n)
                            acc[j][n] = _mm512_fmadd_ps(wv, xv[n], acc[j][n]);
                    }
                }
            }
    for (int j = 0; j < CP_COB; ++j) {
        const __m512 cb = _mm512_set1_ps(t->cb[j]);
        const __m512 div = _mm512_set1_ps(t->div);
        float *r = t->rmax + j * t->rstride;
        for (int n = 0; n < nw; ++n) {
            __m512 v = acc[j][n];
            if (t->mode == CP_MODE_LITERAL)
                v = _mm512_div_ps(_mm512_add_ps(v, cb), div);
            else if (t->mode == CP_MODE_NEGMAX)
                v = _mm512_xor_ps(v, _mm512_set1_ps(-0.0f));
            if (!t->first) {
                const __m512 m = _mm512_loadu_ps(r + 16 * n);
                const __mmask16 take = _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ) |
                                       _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
                v = _mm512_mask_blend_ps(take, m, v);
            }
            _mm512_storeu_ps(r + 16 * n, v);
        }
    }
}

CP_TARGET_AVX512 static void cp_tile_avx512(const cp_tile_args *t, int nw, int tail)
{
    switch (nw * 2 + (tail != 0)) {
    case 2: cp_tile_avx512_impl(t, 1, 0); break;
    case 3: cp_tile_avx512_impl(t, 1, 1); break;
    case 4: cp_tile_avx512_impl(t, 2, 0); break;
    case 5: cp_tile_avx512_impl(t, 2, 1); break;
    case 6: cp_tile_avx512_impl(t, 3, 0); break;
    case 7: cp_tile_avx512_impl(t, 3, 1); break;
    case 8: cp_tile_avx512_impl(t, 4, 0); break;
    default: cp_tile_avx512_impl(t, 4, 1); break;
    }
}

/* CP_COB channels x nv vectors of tiles, for one xi and one channel block. */
CP_TARGET_AVX512 CP_INLINE void cp_wgemm_avx512_impl(const cp_wgemm_args *g, const float *v,
                                                     const float *u, float *m, const int nv)
{
    __m512 acc[CP_COB][4];
    for (int j = 0; j < CP_COB; ++j)
        for (int n = 0; n < nv; ++n)
            acc[j][n] = _mm512_setzero_ps();
    for (int64_t ci = 0; ci < g->cin; ++ci)
        for (int64_t kd = 0; kd < g->kd; ++kd, u += CP_COB) {
            const float *vr = v + ci * g->s_ci + kd * g->s_kd;
            __m512 vv[4];
            for (int n = 0; n < nv; ++n)
                vv[n] = _mm512_loadu_ps(vr + 16 * n);
            for (int j = 0; j < CP_COB; ++j) {
                const __m512 uv = _mm512_set1_ps(u[j]);
                for (int n = 0; n < nv; ++n)
                    acc[j][n] = _mm512_fmadd_ps(uv, vv[n], acc[j][n]);
            }
        }
    for (int j = 0; j < CP_COB; ++j)
        for (int n = 0; n < nv; ++n)
            _mm512_storeu_ps(m + j * g->tpad + 16 * n, acc[j][n]);
}

CP_TARGET_AVX512 static void cp_wgemm_avx512(const cp_wgemm_args *g)
{
    const int64_t taps = g->cin * g->kd, nvec = g->tpad / 16;
    for (int64_t xi = 0; xi < 16; ++xi)
        for (int64_t blk = 0; blk < g->blocks; ++blk) {
            const float *u = g->u + (xi * g->blocks + blk) * taps * CP_COB;
            float *m = g->m + (xi * g->blocks * CP_COB + blk * CP_COB) * g->tpad;
            for (int64_t v0 = 0; v0 < nvec; v0 += 4) {
                const float *v = g->v + xi * g->s_xi + 16 * v0;
                switch (cp_min(4, nvec - v0)) {
                case 1: cp_wgemm_avx512_impl(g, v, u, m + 16 * v0, 1); break;
                case 2: cp_wgemm_avx512_impl(g, v, u, m + 16 * v0, 2); break;
                case 3: cp_wgemm_avx512_impl(g, v, u, m + 16 * v0, 3); break;
                default: cp_wgemm_avx512_impl(g, v, u, m + 16 * v0, 4); break;
                }
            }
        }
}

CP_TARGET_AVX512 static void cp_hpass_avx512(const cp_hpass_args *a) { cp_hpass_generic(a); }
CP_TARGET_AVX512 static int cp_wcol_avx512(const cp_wcol_args *a) { return cp_wcol_generic(a); }
CP_TARGET_AVX512 static void cp_wrow_avx512(const cp_wrow_args *a) { cp_wrow_generic(a); }
CP_TARGET_AVX512 static void cp_wout_avx512(const cp_wout_args *a) { cp_wout_generic(a); }

/* ---- avx2 variant ---- */

CP_TARGET_AVX2 CP_INLINE __m256i cp_mask8(int64_t lanes)
{
    const int n = (int)cp_max(0, cp_min(8, lanes));
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

CP_TARGET_AVX2 CP_INLINE void cp_tile_avx2_impl(const cp_tile_args *t, const int nw, const int tail)
{
    __m256 acc[CP_COB][3];
    for (int j = 0; j < CP_COB; ++j)
        for (int n = 0; n < nw; ++n)
            acc[j][n] = _mm256_setzero_ps();
    const float *wp = t->w;
    for (int64_t ci = 0; ci < t->cin; ++ci)
        for (int64_t kd = 0; kd < t->kd; ++kd)
            for (int64_t kh = 0; kh < t->kh; ++kh) {
                const float *xr = t->x + ci * t->s_ci + kd * t->s_d + kh * t->s_h;
                for (int64_t kw = 0; kw < t->kw; ++kw, wp += CP_COB) {
                    __m256 xv[3];
                    for (int n = 0; n < nw; ++n) {
                        if (tail && n == nw - 1)
                            xv[n] = _mm256_maskload_ps(xr + kw + 8 * n,
                                                       cp_mask8(t->valid - kw - 8 * n));
                        else
                            xv[n] = _mm256_loadu_ps(xr + kw + 8 * n);
                    }
                    for (int j = 0; j < CP_COB; ++j) {
                        const __m256 wv = _mm256_set1_ps(wp[j]);
                        for (int n = 0; n < nw; ++n)
                            acc[j][n] = _mm256_fmadd_ps(wv, xv[n], acc[j][n]);
                    }
                }
            }
    for (int j = 0; j < CP_COB; ++j) {
        const __m256 cb = _mm256_set1_ps(t->cb[j]);
        const __m256 div = _mm256_set1_ps(t->div);
        float *r = t->rmax + j * t->rstride;
        for (int n = 0; n < nw; ++n) {
            __m256 v = acc[j][n];
            if (t->mode == CP_MODE_LITERAL)
                v = _mm256_div_ps(_mm256_add_ps(v, cb), div);
            else if (t->mode == CP_MODE_NEGMAX)
                v = _mm256_xor_ps(v, _mm256_set1_ps(-0.0f));
            if (!t->first) {
                const __m256 m = _mm256_loadu_ps(r + 8 * n);
                const __m256 take = _mm256_or_ps(_mm256_cmp_ps(v, m, _CMP_GT_OQ),
                                                 _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
                v = _mm256_blendv_ps(m, v, take);
            }
            _mm256_storeu_ps(r + 8 * n, v);
        }
    }
}

CP_TARGET_AVX2 static void cp_tile_avx2(const cp_tile_args *t, int nw, int tail)
{
    switch (nw * 2 + (tail != 0)) {
    case 2: cp_tile_avx2_impl(t, 1, 0); break;
    case 3: cp_tile_avx2_impl(t, 1, 1); break;
    case 4: cp_tile_avx2_impl(t, 2, 0); break;
    case 5: cp_tile_avx2_impl(t, 2, 1); break;
    case 6: cp_tile_avx2_impl(t, 3, 0); break;
    default: cp_tile_avx2_impl(t, 3, 1); break;
    }
}

CP_TARGET_AVX2 CP_INLINE void cp_wgemm_avx2_impl(const cp_wgemm_args *g, const float *v,
                                                 const float *u, float *m, const int nv)
{
    __m256 acc[CP_COB][3];
    for (int j = 0; j < CP_COB; ++j)
        for (int n = 0; n < nv; ++n)
            acc[j][n] = _mm256_setzero_ps();
    for (int64_t ci = 0; ci < g->cin; ++ci)
        for (int64_t kd = 0; kd < g->kd; ++kd, u += CP_COB) {
            const float *vr = v + ci * g->s_ci + kd * g->s_kd;
            __m256 vv[3];
            for (int n = 0; n < nv; ++n)
                vv[n] = _mm256_loadu_ps(vr + 8 * n);
            for (int j = 0; j < CP_COB; ++j) {
                const __m256 uv = _mm256_set1_ps(u[j]);
                for (int n = 0; n < nv; ++n)
                    acc[j][n] = _mm256_fmadd_ps(uv, vv[n], acc[j][n]);
            }
        }
    for (int j = 0; j < CP_COB; ++j)
        for (int n = 0; n < nv; ++n)
            _mm256_storeu_ps(m + j * g->tpad + 8 * n, acc[j][n]);
}

CP_TARGET_AVX2 static void cp_wgemm_avx2(const cp_wgemm_args *g)
{
    const int64_t taps = g->cin * g->kd, nvec = g->tpad / 8;
    for (int64_t xi = 0; xi < 16; ++xi)
        for (int64_t blk = 0; blk < g->blocks; ++blk) {
            const float *u = g->u + (xi * g->blocks + blk) * taps * CP_COB;
            float *m = g->m + (xi * g->blocks * CP_COB + blk * CP_COB) * g->tpad;
            /* Chunks of 3 vectors, but 2 + 2 rather than 3 + 1 at the end. */
            for (int64_t v0 = 0, nv; v0 < nvec; v0 += nv) {
                nv = nvec - v0 == 4 ? 2 : cp_min(3, nvec - v0);
                const float *v = g->v + xi * g->s_xi + 8 * v0;
                switch (nv) {
                case 1: cp_wgemm_avx2_impl(g, v, u, m + 8 * v0, 1); break;
                case 2: cp_wgemm_avx2_impl(g, v, u, m + 8 * v0, 2); break;
                default: cp_wgemm_avx2_impl(g, v, u, m + 8 * v0, 3); break;
                }
            }
        }
}

CP_TARGET_AVX2 static void cp_hpass_avx2(const cp_hpass_args *a) { cp_hpass_generic(a); }
CP_TARGET_AVX2 static int cp_wcol_avx2(const cp_wcol_args *a) { return cp_wcol_generic(a); }
CP_TARGET_AVX2 static void cp_wrow_avx2(const cp_wrow_args *a) { cp_wrow_generic(a); }
CP_TARGET_AVX2 static void cp_wout_avx2(const cp_wout_args *a) { cp_wout_generic(a); }

#endif /* CP_X86 */

/* ---- dispatch ---- */

/* The training passes' copies, defined with their bodies below. */
#define CP_WOUT_ROWS_ARGS const cp_wout_args *a, int64_t nt, float *rows, int64_t cstride, int64_t row0
#define CP_SCAN_WINO_ARGS                                                                                              \
    const struct cp_plan *pl, int64_t b, struct cp_range r, int64_t pd, int64_t ph, const float *rows, void *codes,  \
        int width, const float *tol, const float *weight
static void cp_wout_rows_scalar(CP_WOUT_ROWS_ARGS);
static void cp_scan_wino_scalar(CP_SCAN_WINO_ARGS);
#if CP_X86
CP_TARGET_AVX2 static void cp_wout_rows_avx2(CP_WOUT_ROWS_ARGS);
CP_TARGET_AVX2 static void cp_scan_wino_avx2(CP_SCAN_WINO_ARGS);
CP_TARGET_AVX512 static void cp_wout_rows_avx512(CP_WOUT_ROWS_ARGS);
CP_TARGET_AVX512 static void cp_scan_wino_avx512(CP_SCAN_WINO_ARGS);
#endif

static const cp_isa cp_isa_scalar = {"scalar", 1, CP_SCALAR_TILE, cp_tile_scalar, cp_hpass_scalar,
                                     cp_wcol_scalar, cp_wrow_scalar, cp_wgemm_scalar,
                                     cp_wout_scalar, cp_wout_rows_scalar, cp_scan_wino_scalar};
#if CP_X86
static const cp_isa cp_isa_avx2 = {"avx2", 8, 3, cp_tile_avx2, cp_hpass_avx2,
                                   cp_wcol_avx2, cp_wrow_avx2, cp_wgemm_avx2, cp_wout_avx2,
                                   cp_wout_rows_avx2, cp_scan_wino_avx2};
static const cp_isa cp_isa_avx512 = {"avx512", 16, 4, cp_tile_avx512, cp_hpass_avx512,
                                     cp_wcol_avx512, cp_wrow_avx512, cp_wgemm_avx512,
                                     cp_wout_avx512, cp_wout_rows_avx512, cp_scan_wino_avx512};
#endif

/* The widest variant this CPU runs, capped by CONVPOOL_CPU_ISA=avx2 or =scalar (for testing
 * the others; any other value caps nothing). */
static const cp_isa *cp_select_isa(void)
{
    const cp_isa *best = &cp_isa_scalar;
#if CP_X86
    __builtin_cpu_init();
    const char *cap = getenv("CONVPOOL_CPU_ISA");
    const int allow_avx2 = !cap || strcmp(cap, "scalar") != 0;
    const int allow_avx512 = allow_avx2 && (!cap || strcmp(cap, "avx2") != 0);
    if (allow_avx2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        best = &cp_isa_avx2;
    if (allow_avx512 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
        best = &cp_isa_avx512;
#endif
    return best;
}

/* ---- plan ---- */

/* Splits one sample into at most CP_ITEMS_PER_SAMPLE_MAX blocks of pooled positions, d first,
 * then h, then w, from the problem's shape alone. */
static void cp_plan_items(cp_plan *pl)
{
    const convpool_problem *p = &pl->p;
    const double macs = (double)p->out_channels * (double)p->in_channels *
                        (double)(p->kernel_d * p->kernel_h * p->kernel_w) *
                        (double)(p->pooled_d * p->pool_d) * (double)(p->pooled_h * p->pool_h) *
                        (double)(p->pooled_w * p->pool_w);
    const double want = macs / (double)CP_ITEM_MIN_MACS;
    const int64_t target = want < 1.0 ? 1
                         : want > (double)CP_ITEMS_PER_SAMPLE_MAX ? CP_ITEMS_PER_SAMPLE_MAX
                                                                   : (int64_t)want;

    int64_t nb = cp_min(p->pooled_d, target);
    pl->dsz = cp_ceil_div(p->pooled_d, nb);
    pl->nbd = cp_ceil_div(p->pooled_d, pl->dsz);

    nb = cp_min(p->pooled_h, cp_ceil_div(target, pl->nbd));
    pl->hsz = cp_ceil_div(p->pooled_h, nb);
    pl->nbh = cp_ceil_div(p->pooled_h, pl->hsz);

    nb = cp_min(p->pooled_w, cp_max(1, target / (pl->nbd * pl->nbh)));
    pl->wsz = cp_ceil_div(p->pooled_w, nb);
    pl->nbw = cp_ceil_div(p->pooled_w, pl->wsz);

    pl->items = pl->nbd * pl->nbh * pl->nbw;
    const int64_t tile_cols = pl->isa->vec * pl->isa->max_nw;
    pl->rwidth = cp_ceil_div(pl->wsz * p->pool_w, tile_cols) * tile_cols;
}

/* U = G g G^T per (co, ci, kd) in double, G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1], packed
 * [xi][block][ci][kd][CP_COB]. Returns 0 (Winograd off) if a weight is non-finite or huge. */
static int cp_pack_winograd(const convpool_problem *p, const float *weight, int64_t blocks,
                            float *u)
{
    static const double G[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
    const int64_t taps = p->in_channels * p->kernel_d;
    for (int64_t i = 0; i < convpool_weight_numel(p); ++i)
        if (!(fabsf(weight[i]) <= CP_WINO_LIMIT))
            return 0;
    for (int64_t co = 0; co < blocks * CP_COB; ++co)
        for (int64_t ci = 0; ci < p->in_channels; ++ci)
            for (int64_t kd = 0; kd < p->kernel_d; ++kd) {
                double g[3][3] = {{0}};
                if (co < p->out_channels)
                    for (int a = 0; a < 3; ++a)
                        for (int b = 0; b < 3; ++b)
                            g[a][b] = weight[convpool_w_offset(p, co, ci, kd, a, b)];
                for (int i = 0; i < 4; ++i)
                    for (int j = 0; j < 4; ++j) {
                        double s = 0.0;
                        for (int a = 0; a < 3; ++a)
                            for (int b = 0; b < 3; ++b)
                                s += G[i][a] * g[a][b] * G[j][b];
                        const int64_t xi = 4 * i + j;
                        u[((xi * blocks + co / CP_COB) * taps + ci * p->kernel_d + kd) * CP_COB +
                          co % CP_COB] = (float)s;
                    }
            }
    return 1;
}

/* ---- work items ---- */

typedef struct cp_range {
    int64_t pd0, pd1, ph0, ph1, pw0, pw1;
} cp_range;

static cp_range cp_item_range(const cp_plan *pl, int64_t item)
{
    const convpool_problem *p = &pl->p;
    const int64_t iw = item % pl->nbw;
    const int64_t ih = (item / pl->nbw) % pl->nbh;
    const int64_t id = item / (pl->nbw * pl->nbh);
    cp_range r;
    r.pd0 = id * pl->dsz;
    r.pd1 = cp_min(p->pooled_d, r.pd0 + pl->dsz);
    r.ph0 = ih * pl->hsz;
    r.ph1 = cp_min(p->pooled_h, r.ph0 + pl->hsz);
    r.pw0 = iw * pl->wsz;
    r.pw1 = cp_min(p->pooled_w, r.pw0 + pl->wsz);
    return r;
}

static cp_hpass_args cp_hpass_setup(const cp_plan *pl, const cp_scratch *s, int64_t npw,
                                    int64_t pool_w)
{
    cp_hpass_args h;
    h.rmax = s->rmax;
    h.rstride = pl->rwidth;
    h.cout = pl->p.out_channels;
    h.npw = npw;
    h.pool_w = pool_w;
    h.mode = pl->mode;
    h.cb = pl->cb;
    h.div = pl->div;
    h.wsum = s->wsum;
    return h;
}

/* The tile arguments every direct call shares. */
static cp_tile_args cp_tile_init(const cp_plan *pl, int64_t rstride)
{
    const convpool_problem *p = &pl->p;
    cp_tile_args t;
    t.s_ci = p->in_d * p->in_h * p->in_w;
    t.s_d = p->in_h * p->in_w;
    t.s_h = p->in_w;
    t.cin = p->in_channels;
    t.kd = p->kernel_d;
    t.kh = p->kernel_h;
    t.kw = p->kernel_w;
    t.div = pl->div;
    t.rstride = rstride;
    return t;
}

/* Conv row (b, d, hh), columns [c0, c1), every channel block, through the direct microkernel
 * into rmax + blk * blk_stride (+ column - c0); mode from the plan, or literal for all. */
static void cp_conv_row(const cp_plan *pl, cp_tile_args *t, int64_t b, int64_t d, int64_t hh, int64_t c0, int64_t c1,
                        float *rmax, int64_t blk_stride, int literal)
{
    const convpool_problem *p = &pl->p;
    const int64_t tile_cols = pl->isa->vec * pl->isa->max_nw;
    const int64_t ktaps = p->in_channels * p->kernel_d * p->kernel_h * p->kernel_w;
    const int64_t x_numel = convpool_x_numel(p);
    for (int64_t blk = 0; blk < pl->blocks; ++blk) {
        t->w = pl->wpack + blk * ktaps * CP_COB;
        t->cb = pl->cb + blk * CP_COB;
        t->mode = literal ? CP_MODE_LITERAL : pl->mode[blk * CP_COB];
        for (int64_t w0 = c0; w0 < c1; w0 += tile_cols) {
            const int64_t ncols = cp_min(tile_cols, c1 - w0);
            const int64_t nw = cp_ceil_div(ncols, pl->isa->vec);
            /* Full vectors may read past the row: harmless garbage in lanes past c1, unless
             * they would read past the end of x. */
            const int tail = convpool_x_offset(p, b, p->in_channels - 1, d + p->kernel_d - 1, hh + p->kernel_h - 1,
                                               w0) + nw * pl->isa->vec + p->kernel_w - 2 >= x_numel;
            t->x = pl->x + convpool_x_offset(p, b, 0, d, hh, w0);
            t->valid = p->in_w - w0;
            t->ncols = ncols;
            t->rmax = rmax + blk * blk_stride + (w0 - c0);
            pl->isa->tile(t, (int)nw, tail);
        }
    }
}

/* Direct: every conv row of the item's windows through the direct microkernel. */
static void cp_item_direct(const cp_plan *pl, int64_t b, cp_range r, const cp_scratch *s)
{
    const convpool_problem *p = &pl->p;
    const int64_t c0 = r.pw0 * p->pool_w, c1 = r.pw1 * p->pool_w;
    cp_tile_args t = cp_tile_init(pl, pl->rwidth);
    const cp_hpass_args h = cp_hpass_setup(pl, s, r.pw1 - r.pw0, p->pool_w);

    for (int64_t pd = r.pd0; pd < r.pd1; ++pd)
        for (int64_t ph = r.ph0; ph < r.ph1; ++ph) {
            for (int64_t i = 0; i < p->pool_d; ++i)
                for (int64_t j = 0; j < p->pool_h; ++j) {
                    t.first = i == 0 && j == 0;
                    cp_conv_row(pl, &t, b, pd * p->pool_d + i, ph * p->pool_h + j, c0, c1, s->rmax,
                                CP_COB * pl->rwidth, 0);
                }
            pl->isa->hpass(&h);
        }
}

/* The training forward (convpool_forward_train_cpu) also writes the arg-max codes: from the
 * Winograd pass itself where the near-tie bound holds (tol set), else through the
 * direct codes path after the item. rows: this thread's codes rows. */
typedef struct cp_codes_ctx {
    void *codes;
    int width;
    const double *tol_coef; /* the near-tie bound's coefficients [2][cpad] (cp_code_tol_coef), or
                             * NULL: the codes take the direct path */
    const float *weight;
    float *rows;
    float *tol;             /* this thread's bound of the pooled d-row being scanned, [cout] */
} cp_codes_ctx;
static void cp_item_codes(const cp_plan *pl, int64_t b, cp_range r, float *rows, void *codes, int width);
static void cp_item_direct_codes(const cp_plan *pl, int64_t b, cp_range r, const cp_scratch *s,
                                 const cp_codes_ctx *cc);
static void cp_code_tol_coef(const convpool_problem *q, const float *weight, const float *cb, int64_t cpad,
                             double *coef);
static void cp_code_tol_at(int64_t cout, int64_t cpad, const double *coef, int32_t margin, float *tol);
static int cp_codes_wino_ok(const convpool_problem *q, float div, const float *conv_bias);

/* Winograd: per pooled d, the column transform of every input row the item reads; then per
 * pooled row and row pair, the row transform, and per conv depth the products and the output
 * transform, which leaves one max per 2x2 tile in rmax. Returns 0 (nothing usable written) if
 * an input is unfit; the caller then redoes the item direct. */
static int cp_item_winograd(const cp_plan *pl, int64_t b, cp_range r, const cp_scratch *s, const cp_codes_ctx *cc)
{
    const convpool_problem *p = &pl->p;
    const int64_t c0 = r.pw0 * p->pool_w;
    const int64_t nt = (r.pw1 - r.pw0) * p->pool_w / 2;
    const int64_t tpad = pl->tpad, planes = pl->vplanes, cpad = pl->blocks * CP_COB;
    const int64_t h_base = r.ph0 * p->pool_h;
    const int64_t nrows = (r.ph1 - r.ph0) * p->pool_h + 2;
    const int64_t s_cp = nrows * 4 * tpad;

    cp_wcol_args wc;
    wc.s_h = p->in_w;
    wc.nrows = nrows;
    wc.nt = nt;
    wc.tpad = tpad;
    wc.stage = s->stage;
    wc.x_end = pl->x + convpool_x_numel(p);

    cp_wrow_args wr;
    wr.s_cp = s_cp;
    wr.n = p->in_channels * planes;
    wr.tpad = tpad;
    wr.v = s->v;

    cp_wgemm_args g;
    g.s_xi = tpad;
    g.s_kd = 16 * tpad;
    g.s_ci = planes * 16 * tpad;
    g.cin = p->in_channels;
    g.kd = p->kernel_d;
    g.u = pl->upack;
    g.blocks = pl->blocks;
    g.m = s->m;
    g.tpad = tpad;

    cp_wout_args wo;
    wo.m = s->m;
    wo.tpad = tpad;
    wo.cpad = cpad;
    wo.cout = p->out_channels;
    wo.mode = pl->mode;
    wo.cb = pl->cb;
    wo.div = pl->div;
    wo.rmax = s->rmax;
    wo.rstride = pl->rwidth;

    const cp_hpass_args h = cp_hpass_setup(pl, s, r.pw1 - r.pw0, p->pool_w / 2);

    for (int64_t pd = r.pd0; pd < r.pd1; ++pd) {
        int bad = 0;
        /* Codes: the largest |x| this pooled d-row's windows read, for their near-tie bound. */
        int32_t margin = INT32_MAX;
        wc.margin = cc ? &margin : NULL;
        for (int64_t ci = 0; ci < p->in_channels; ++ci)
            for (int64_t k = 0; k < planes; ++k) {
                wc.x = pl->x + convpool_x_offset(p, b, ci, pd * p->pool_d + k, h_base, c0);
                wc.c = s->c + (ci * planes + k) * s_cp;
                bad |= pl->isa->wcol(&wc);
            }
        if (bad)
            return 0;
        if (cc)
            cp_code_tol_at(p->out_channels, cpad, cc->tol_coef, margin, cc->tol);
        for (int64_t ph = r.ph0; ph < r.ph1; ++ph) {
            for (int64_t hp = 0; hp < p->pool_h / 2; ++hp) {
                wr.c = s->c + ((ph - r.ph0) * p->pool_h + 2 * hp) * 4 * tpad;
                pl->isa->wrow(&wr);
                for (int64_t i = 0; i < p->pool_d; ++i) {
                    g.v = s->v + i * 16 * tpad;
                    pl->isa->wgemm(&g);
                    wo.first = hp == 0 && i == 0;
                    pl->isa->wout(&wo);
                    if (cc)
                        pl->isa->wout_rows(&wo, nt, cc->rows, p->pool_d * p->pool_h * 2 * tpad, i * p->pool_h + 2 * hp);
                }
            }
            pl->isa->hpass(&h);
            if (cc)
                pl->isa->scan_wino(pl, b, r, pd, ph, cc->rows, cc->codes, cc->width, cc->tol, cc->weight);
        }
    }
    return 1;
}

/* Computes item `item` of sample b: partial[co] = sum of its window values per channel. */
static void cp_run_item(const cp_plan *pl, int64_t b, int64_t item, const cp_scratch *s, double *partial,
                        const cp_codes_ctx *cc)
{
    const cp_range r = cp_item_range(pl, item);
    const int64_t npw = r.pw1 - r.pw0, cout = pl->p.out_channels;

    for (int64_t i = 0; i < cout * npw; ++i)
        s->wsum[i] = 0.0;
    const cp_codes_ctx *wcc = cc && cc->tol_coef ? cc : NULL;
    if (!pl->upack || !cp_item_winograd(pl, b, r, s, wcc)) {
        for (int64_t i = 0; i < cout * npw; ++i)
            s->wsum[i] = 0.0;
        if (cc)
            cp_item_direct_codes(pl, b, r, s, cc); /* the forward and the codes from one conv */
        else
            cp_item_direct(pl, b, r, s);
    } else if (cc && !wcc) {
        cp_item_codes(pl, b, r, cc->rows, cc->codes, cc->width);
    }

    for (int64_t co = 0; co < cout; ++co) {
        double sum = 0.0;
        for (int64_t i = 0; i < npw; ++i)
            sum += s->wsum[co * npw + i];
        partial[co] = sum;
    }
}

/* Combines sample b's item partials in item order into pooled[b][*] and out[b]. */
static void cp_finish_sample(const cp_plan *pl, const double *partials, int64_t b,
                             const float *bias, float *pooled, float *out)
{
    const int64_t cout = pl->p.out_channels;
    const double count = (double)convpool_pooled_count(&pl->p);
    double total = 0.0;
    for (int64_t co = 0; co < cout; ++co) {
        double s = 0.0;
        for (int64_t it = 0; it < pl->items; ++it)
            s += partials[it * cout + co];
        const double mean = s / count;
        pooled[b * cout + co] = (float)mean;
        if (out)
            total += mean + (double)bias[co];
    }
    if (out)
        out[b] = (float)total;
}

/* ---- entry ---- */

/* The most threads a call starts: the processors OpenMP may use (at least 1), within OpenMP's
 * thread limit and CP_THREADS_MAX. Asking libgomp or libomp for tens of thousands of threads
 * kills the process (SIGSEGV, SIGABRT or exit 1), so no request goes past this. Results do not
 * depend on the thread count, so capping changes nothing but speed. */
static int64_t cp_thread_cap(void)
{
#ifdef _OPENMP
    int64_t cap = omp_get_num_procs();
    const int64_t limit = omp_get_thread_limit();
    if (limit > 0)
        cap = cp_min(cap, limit);
    return cp_max(1, cp_min(cap, CP_THREADS_MAX));
#else
    return 1;
#endif
}

int64_t convpool_cpu_threads(int threads, int64_t items)
{
    int64_t nt = threads > 0 ? threads : 1;
#ifdef _OPENMP
    if (threads == 0)
        nt = omp_get_max_threads();
#endif
    return cp_max(1, cp_min(cp_min(nt, cp_thread_cap()), items));
}

int convpool_cpu_thread_count(int threads) { return (int)convpool_cpu_threads(threads, INT64_MAX); }

convpool_status convpool_check_codes_threads(const void *codes, int threads)
{
    if (!codes)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "codes is NULL");
    if (threads < 0)
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "threads must be >= 0 (0 = all cores), got %d",
                             threads);
    return CONVPOOL_OK;
}

/* The forward; with codes, the training forward (convpool_forward_train_cpu). */
/* The plan's layout for pl->p (validated): the ISA, output-channel blocks, work items, the
 * Winograd row pad and planes. Returns whether the call takes the Winograd path (kernel 3 in h
 * and w, even pool_h and pool_w, its per-thread scratch within CP_WINO_SCRATCH_MAX), in which
 * case the row width covers the pad; the weights can still turn it off (cp_pack_winograd). */
static int cp_plan_layout(cp_plan *pl)
{
    const convpool_problem *q = &pl->p;
    pl->isa = cp_select_isa();
    pl->blocks = cp_ceil_div(q->out_channels, CP_COB);
    cp_plan_items(pl);
    pl->tpad = cp_ceil_div(pl->wsz * q->pool_w / 2, CP_TILE_ALIGN) * CP_TILE_ALIGN;
    pl->vplanes = q->pool_d + q->kernel_d - 1;
    const int64_t cpad = pl->blocks * CP_COB;
    /* Winograd scratch per thread, in floats: C, V and M (see cp_item_winograd). */
    const double wino_floats =
        (double)q->in_channels * (double)pl->vplanes * (double)pl->tpad *
            (4.0 * (double)(pl->hsz * q->pool_h + 2) + 16.0) +
        16.0 * (double)cpad * (double)pl->tpad;
    const int wino = q->kernel_h == 3 && q->kernel_w == 3 && q->pool_h % 2 == 0 &&
                     q->pool_w % 2 == 0 && wino_floats <= (double)CP_WINO_SCRATCH_MAX;
    if (wino)
        pl->rwidth = cp_max(pl->rwidth, pl->tpad);
    return wino;
}

int convpool_cpu_winograd(const convpool_problem *p)
{
    cp_plan pl;
    if (!p)
        return 0;
    pl.p = *p;
    if (convpool_problem_validate(&pl.p) != CONVPOOL_OK)
        return 0;
    return cp_plan_layout(&pl);
}

static convpool_status cp_forward(const convpool_problem *p, const float *x, const float *weight,
                                  const float *conv_bias, const float *bias, float *pooled, float *out, int threads,
                                  void *codes)
{
    cp_plan pl;
    convpool_status st = convpool_check_forward_args(p, x, weight, bias, pooled, out, &pl.p);
    if (st != CONVPOOL_OK)
        return st;
    if (threads < 0)
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT,
                             "threads must be >= 0 (0 = all cores), got %d", threads);
    const convpool_problem *q = &pl.p;
    if (codes) {
        st = convpool_check_code_window(q);
        if (st != CONVPOOL_OK)
            return st;
    }

    pl.x = x;
    pl.div = (float)q->divisor;
    const int wino = cp_plan_layout(&pl);
    const int64_t cpad = pl.blocks * CP_COB;

    const int64_t cout = q->out_channels;
    const int64_t ktaps = q->in_channels * q->kernel_d * q->kernel_h * q->kernel_w;
    const int64_t items = pl.items, batch = q->batch;
    const int64_t nt_max = cp_thread_cap();

    /* Every scratch size below is a product of positive factors. Bound each one in double first,
     * with the most threads this call can use, so the int64 arithmetic after it cannot wrap: a
     * problem that passes validation but could never fit in memory (2^61 output channels, say)
     * ends here with a clear error instead of a wrapped size. */
    {
        const double dcpad = (double)pl.blocks * CP_COB, drow = dcpad * (double)pl.rwidth;
        const double dwsum = (double)cout * (double)pl.wsz + CP_LINE_FLOATS;
        const double sizes[] = {
            (double)items * (double)cout * 8.0,                       /* one sample's partials */
            (double)ktaps * dcpad * sizeof(float),                    /* packed weights */
            (double)nt_max * (drow + CP_LINE_FLOATS) * sizeof(float), /* row-max scratch */
            codes ? (double)nt_max * (dcpad * (double)(q->pool_d * q->pool_h) *
                                          (double)cp_max(pl.rwidth, 2 * pl.tpad) + dcpad + 2 * CP_LINE_FLOATS) *
                            sizeof(float)
                  : 0.0, /* training: the codes rows and near-tie bounds */
            (double)nt_max * dwsum * sizeof(double),                  /* window sums */
        };
        double total = 0.0;
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i)
            total += sizes[i];
        if (!(total <= CP_SCRATCH_BYTES_MAX))
            return convpool_fail(CONVPOOL_ERR_OUT_OF_MEMORY,
                                 "cpu: the problem needs %.3g bytes of scratch (out_channels %lld, "
                                 "in_channels x kernel volume %lld), more than this machine can address",
                                 total, (long long)cout, (long long)ktaps);
    }
    st = convpool_check_forward_overlap(q, x, 4, weight, conv_bias, bias, 4, pooled, out, codes, NULL, 0);
    if (st != CONVPOOL_OK)
        return st;
    /* Windows of one position: every code is 0, the window's only position (whatever its value,
     * NaN included), so the training forward is the forward and a fill (the codes rows and scans
     * cost 35% over the forward at bench_train_cpu's pool1 row). */
    if (codes && q->pool_d * q->pool_h * q->pool_w == 1) {
        st = cp_forward(q, x, weight, conv_bias, bias, pooled, out, threads, NULL);
        if (st != CONVPOOL_OK)
            return st;
        const int64_t rows = batch * cout, row_bytes = convpool_pooled_count(q) * convpool_code_bytes(q);
        const int nt_fill = (int)convpool_cpu_threads(threads, rows);
#pragma omp parallel for schedule(static) num_threads(nt_fill)
        for (int64_t i = 0; i < rows; ++i)
            memset((unsigned char *)codes + i * row_bytes, 0, (size_t)row_bytes);
        return CONVPOOL_OK;
    }
    const int64_t chunk_b = cp_max(1, cp_min(batch, CP_PARTIAL_BYTES_MAX / (items * cout * 8)));

    /* threads = 0: OpenMP's default (OMP_NUM_THREADS or all cores); either way at most
     * cp_thread_cap(), so a huge request cannot exhaust the OpenMP runtime. */
    const int64_t nt = convpool_cpu_threads(threads, chunk_b * items);

    /* Per-thread scratch, in floats: row-max, then Winograd C, V, M and the staging row; every
     * piece a whole number of cache lines, so vectors stay aligned and threads share no line. */
    const int64_t rfl = cp_ceil_div(cpad * pl.rwidth, CP_LINE_FLOATS) * CP_LINE_FLOATS;
    const int64_t cfl = wino ? q->in_channels * pl.vplanes * (pl.hsz * q->pool_h + 2) * 4 * pl.tpad : 0;
    const int64_t vfl = wino ? q->in_channels * pl.vplanes * 16 * pl.tpad : 0;
    const int64_t mfl = wino ? 16 * cpad * pl.tpad : 0;
    const int64_t sfl = wino ? CP_LINE_FLOATS * cp_ceil_div(CP_WIN_STAGE, CP_LINE_FLOATS) : 0;
    /* Training: the codes rows (cp_item_codes' layout, or the Winograd planes of 2 tpad a row). */
    const int64_t nrow = q->pool_d * q->pool_h;
    const int64_t kfl = codes ? cp_ceil_div(cpad * nrow * cp_max(pl.rwidth, wino ? 2 * pl.tpad : 0), CP_LINE_FLOATS) *
                                    CP_LINE_FLOATS
                              : 0;
    /* Training: the near-tie bounds of the pooled d-row being scanned (cp_code_tol_at). */
    const int64_t tfl = codes ? cp_ceil_div(cpad, CP_LINE_FLOATS) * CP_LINE_FLOATS : 0;
    const int64_t per_thread = rfl + cfl + vfl + mfl + sfl + kfl + tfl;
    const int64_t wsum_per_thread = cp_ceil_div(cout * pl.wsz, CP_LINE_FLOATS / 2) * (CP_LINE_FLOATS / 2);

    size_t wpack_b, upack_b, partial_b, fscr_b, wsum_b, cb_b, mode_b;
    if (!cp_bytes(pl.blocks * ktaps * CP_COB, sizeof(float), &wpack_b) ||
        !cp_bytes(wino ? 16 * cpad * q->in_channels * q->kernel_d : 0, sizeof(float), &upack_b) ||
        !cp_bytes(chunk_b * items * cout, sizeof(double), &partial_b) ||
        !cp_bytes(nt * per_thread + CP_LINE_FLOATS, sizeof(float), &fscr_b) ||
        !cp_bytes(nt * wsum_per_thread + CP_LINE_FLOATS / 2, sizeof(double), &wsum_b) ||
        !cp_bytes(cpad, sizeof(float), &cb_b) || !cp_bytes(cpad, 1, &mode_b))
        return convpool_fail(CONVPOOL_ERR_OUT_OF_MEMORY, "cpu: scratch size overflows size_t");
    float *wpack = (float *)malloc(wpack_b);
    float *upack = wino ? (float *)malloc(upack_b) : NULL;
    double *partials = (double *)malloc(partial_b);
    float *fscr = (float *)malloc(fscr_b);
    double *wsum = (double *)malloc(wsum_b);
    float *cb = (float *)malloc(cb_b);
    unsigned char *mode = (unsigned char *)malloc(mode_b);
    double *tol_coef = codes ? (double *)malloc(2 * (size_t)cpad * sizeof(double)) : NULL;
    if (!wpack || (wino && !upack) || !partials || !fscr || !wsum || !cb || !mode || (codes && !tol_coef)) {
        free(wpack);
        free(upack);
        free(partials);
        free(fscr);
        free(wsum);
        free(cb);
        free(mode);
        free(tol_coef);
        return convpool_fail(CONVPOOL_ERR_OUT_OF_MEMORY, "cpu: cannot allocate %.3g bytes of scratch",
                             (double)wpack_b + (double)upack_b + (double)partial_b + (double)fscr_b +
                                 (double)wsum_b + (double)cb_b + (double)mode_b);
    }

    /* Weights regrouped so a microkernel walks its block's taps linearly, CP_COB at a time. */
    for (int64_t co = 0; co < cpad; ++co) {
        float *dst = wpack + (co / CP_COB) * ktaps * CP_COB + co % CP_COB;
        for (int64_t k = 0; k < ktaps; ++k)
            dst[k * CP_COB] = co < cout ? weight[co * ktaps + k] : 0.0f;
        cb[co] = co < cout && conv_bias ? conv_bias[co] : 0.0f;
    }
    const int commute = isfinite(pl.div) && pl.div != 0.0f;
    for (int64_t blk = 0; blk < pl.blocks; ++blk) {
        int m = commute ? (pl.div > 0.0f ? CP_MODE_MAX : CP_MODE_NEGMAX) : CP_MODE_LITERAL;
        for (int64_t j = 0; j < CP_COB; ++j)
            if (!isfinite(cb[blk * CP_COB + j]))
                m = CP_MODE_LITERAL;
        for (int64_t j = 0; j < CP_COB; ++j)
            mode[blk * CP_COB + j] = (unsigned char)m;
    }
    if (upack && !cp_pack_winograd(q, weight, pl.blocks, upack)) {
        free(upack);
        upack = NULL;
    }
    /* Training: codes from the Winograd pass where the near-tie bound holds, else direct. */
    const int code_wino = codes && upack && cp_codes_wino_ok(q, pl.div, conv_bias);
    if (code_wino)
        cp_code_tol_coef(q, weight, cb, cpad, tol_coef);
    pl.wpack = wpack;
    pl.upack = upack;
    pl.cb = cb;
    pl.mode = mode;

    const cp_plan *plc = &pl;
    float *fbase = (float *)cp_align_line(fscr);
    double *wbase = (double *)cp_align_line(wsum);
#ifdef _OPENMP
    /* Items handed out per grab: enough work that tiny samples don't thrash the counter. */
    const double item_macs = (double)ktaps * (double)cout * (double)(pl.dsz * q->pool_d) *
                             (double)(pl.hsz * q->pool_h) * (double)(pl.wsz * q->pool_w);
    const int grab = item_macs >= CP_GRAB_MACS ? 1 : (int)(CP_GRAB_MACS / item_macs);
#endif

#ifdef _OPENMP
#pragma omp parallel num_threads((int)nt)
#endif
    {
        int64_t tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        cp_scratch s;
        s.rmax = fbase + tid * per_thread;
        s.c = s.rmax + rfl;
        s.v = s.c + cfl;
        s.m = s.v + vfl;
        s.stage = s.m + mfl;
        s.wsum = wbase + tid * wsum_per_thread;
        const cp_codes_ctx cc = {codes, codes ? convpool_code_bytes(q) : 0, code_wino ? tol_coef : NULL, weight,
                                 s.stage + sfl, s.stage + sfl + kfl};
        /* The codes rows zeroed once: the scan's vector loops read their padding (cp_scan_wino). */
        if (codes)
            memset(cc.rows, 0, (size_t)kfl * sizeof(float));
        for (int64_t b0 = 0; b0 < batch; b0 += chunk_b) {
            const int64_t nb = cp_min(chunk_b, batch - b0);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, grab)
#endif
            for (int64_t i = 0; i < nb * items; ++i)
                cp_run_item(plc, b0 + i / items, i % items, &s, partials + i * cout, codes ? &cc : NULL);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
            for (int64_t bl = 0; bl < nb; ++bl)
                cp_finish_sample(plc, partials + bl * items * cout, b0 + bl, bias, pooled, out);
        }
    }

    free(wpack);
    free(upack);
    free(partials);
    free(fscr);
    free(wsum);
    free(cb);
    free(mode);
    free(tol_coef);
    return CONVPOOL_OK;
}

convpool_status convpool_forward_cpu(const convpool_problem *p, const float *x, const float *weight,
                                     const float *conv_bias, const float *bias, float *pooled, float *out, int threads)
{
    return cp_forward(p, x, weight, conv_bias, bias, pooled, out, threads, NULL);
}

convpool_status convpool_forward_train_cpu(const convpool_problem *p, const float *x, const float *weight,
                                           const float *conv_bias, const float *bias, float *pooled, float *out,
                                           void *codes, int threads)
{
    const convpool_status st = convpool_check_codes_threads(codes, threads);
    if (st != CONVPOOL_OK)
        return st;
    return cp_forward(p, x, weight, conv_bias, bias, pooled, out, threads, codes);
}

/* ---- arg-max codes for training (convpool_codes_cpu) ---- */

#define CP_CODE_CHUNK 64 /* windows scanned together */

/* One item's codes: every conv row of its windows through the direct microkernel in literal
 * mode (the stored value is (conv + conv bias) / divisor in float, the value PyTorch's max pool
 * sees), each row kept in its own slot, then per window PyTorch's scan: raster order, a value
 * replaces the running max (from -inf, code 0) when it is greater or NaN. */
/* The codes of pooled row (pd, ph) of an item from its conv rows (rows: channel co's nrow rows
 * at rows + co * nrow * rwidth, window pw's columns from (pw - pw0) * pool_w), held as the
 * microkernel stores them in mode[co] (NULL: literal for all): literal (y + bias) / divisor,
 * raw y, or -y. q = (y + bias) / divisor and PyTorch's scan (a value replaces the running max,
 * from -inf at code 0, when greater or NaN), CP_CODE_CHUNK windows at a time, branch-free
 * across them (the per-window scan mispredicted about every other comparison). */
static void cp_scan_direct(const cp_plan *pl, int64_t b, cp_range r, int64_t pd, int64_t ph, const float *rows,
                           const unsigned char *mode, void *codes, int width)
{
    const convpool_problem *p = &pl->p;
    const int64_t nrow = p->pool_d * p->pool_h, cout = p->out_channels, npool = convpool_pooled_count(p);
    for (int64_t co = 0; co < cout; ++co) {
        const float *rc = rows + co * nrow * pl->rwidth;
        const int64_t at0 = (b * cout + co) * npool + (pd * p->pooled_h + ph) * p->pooled_w;
        const int m = mode ? mode[co] : CP_MODE_LITERAL;
        const float cb = pl->cb[co], div = pl->div, sg = m == CP_MODE_NEGMAX ? -1.0f : 1.0f;
        for (int64_t w0 = r.pw0; w0 < r.pw1; w0 += CP_CODE_CHUNK) {
            const int64_t n = cp_min(CP_CODE_CHUNK, r.pw1 - w0);
            const float *base = rc + (w0 - r.pw0) * p->pool_w;
            float best[CP_CODE_CHUNK];
            uint32_t code[CP_CODE_CHUNK];
            for (int64_t j = 0; j < n; ++j)
                best[j] = -INFINITY, code[j] = 0;
            uint32_t pos = 0;
            for (int64_t k = 0; k < nrow; ++k)
                for (int64_t e = 0; e < p->pool_w; ++e, ++pos) {
                    const float *src = base + k * pl->rwidth + e;
                    if (m == CP_MODE_LITERAL) {
                        CP_SIMD
                        for (int64_t j = 0; j < n; ++j) {
                            const float v = src[j * p->pool_w];
                            const int take = v > best[j] || v != v;
                            best[j] = take ? v : best[j];
                            code[j] = take ? pos : code[j];
                        }
                    } else {
                        CP_SIMD
                        for (int64_t j = 0; j < n; ++j) {
                            const float v = (sg * src[j * p->pool_w] + cb) / div;
                            const int take = v > best[j] || v != v;
                            best[j] = take ? v : best[j];
                            code[j] = take ? pos : code[j];
                        }
                    }
                }
            for (int64_t j = 0; j < n; ++j)
                convpool_code_store(codes, width, at0 + w0 + j, code[j]);
        }
    }
}

static void cp_item_codes(const cp_plan *pl, int64_t b, cp_range r, float *rows, void *codes, int width)
{
    const convpool_problem *p = &pl->p;
    const int64_t c0 = r.pw0 * p->pool_w, c1 = r.pw1 * p->pool_w, nrow = p->pool_d * p->pool_h;
    cp_tile_args t = cp_tile_init(pl, nrow * pl->rwidth);
    t.first = 1;
    for (int64_t pd = r.pd0; pd < r.pd1; ++pd)
        for (int64_t ph = r.ph0; ph < r.ph1; ++ph) {
            for (int64_t i = 0; i < p->pool_d; ++i)
                for (int64_t j = 0; j < p->pool_h; ++j)
                    cp_conv_row(pl, &t, b, pd * p->pool_d + i, ph * p->pool_h + j, c0, c1,
                                rows + (i * p->pool_h + j) * pl->rwidth, CP_COB * nrow * pl->rwidth, 1);
            cp_scan_direct(pl, b, r, pd, ph, rows, NULL, codes, width);
        }
}

/* The training forward's direct item: every conv row of a pooled row once, in the plan's mode,
 * kept row by row; the forward folds them into rmax in the microkernel's own order (so pooled
 * and out are convpool_forward_cpu's bit for bit) and the codes come from the same rows. */
static void cp_item_direct_codes(const cp_plan *pl, int64_t b, cp_range r, const cp_scratch *s,
                                 const cp_codes_ctx *cc)
{
    const convpool_problem *p = &pl->p;
    const int64_t c0 = r.pw0 * p->pool_w, c1 = r.pw1 * p->pool_w, nrow = p->pool_d * p->pool_h;
    const int64_t cout = p->out_channels, rw = pl->rwidth;
    cp_tile_args t = cp_tile_init(pl, nrow * rw);
    t.first = 1;
    const cp_hpass_args h = cp_hpass_setup(pl, s, r.pw1 - r.pw0, p->pool_w);
    for (int64_t pd = r.pd0; pd < r.pd1; ++pd)
        for (int64_t ph = r.ph0; ph < r.ph1; ++ph) {
            for (int64_t i = 0; i < p->pool_d; ++i)
                for (int64_t j = 0; j < p->pool_h; ++j)
                    cp_conv_row(pl, &t, b, pd * p->pool_d + i, ph * p->pool_h + j, c0, c1,
                                cc->rows + (i * p->pool_h + j) * rw, CP_COB * nrow * rw, 0);
            /* Each column's max over the window's rows, rows in order as before; the row loop
             * outside so the column loop vectorises (inside, it ran scalar: a fifth of the
             * training forward at pool 3). */
            for (int64_t co = 0; co < cout; ++co) {
                const float *rc = cc->rows + co * nrow * rw;
                float *rm = s->rmax + co * rw;
                memcpy(rm, rc, (size_t)(c1 - c0) * sizeof(float));
                for (int64_t k = 1; k < nrow; ++k) {
                    const float *rk = rc + k * rw;
                    CP_SIMD
                    for (int64_t c = 0; c < c1 - c0; ++c)
                        rm[c] = cp_nanmax(rm[c], rk[c]);
                }
            }
            pl->isa->hpass(&h);
            cp_scan_direct(pl, b, r, pd, ph, cc->rows, pl->mode, cc->codes, cc->width);
        }
}

/* The Winograd codes path (kernel 3 in h and w, even pools, finite divisor and conv biases,
 * inputs fit for Winograd): the conv values come from the forward's Winograd pieces (column and
 * row transforms, products) and cp_wout_rows instead of the direct microkernel, and the scan runs
 * branch-free across windows. A window whose best value leads the next by more than tol (below)
 * takes that position; closer windows (near-ties, exact ties included) recompute their
 * candidates in double, round to float and apply PyTorch's rule on (y + bias) / divisor, so a
 * tie resolves as exact arithmetic does. tol = 2 E + 8 eps (A + |bias|) with E = CP_CODE_ERR
 * (Cin kd + 8) eps A and A = max|x| sum|w[c]|, a bound on |y|: Winograd's error is a few eps of
 * the terms' magnitudes, and A is far above the typical |y|, so E is generous, though not a
 * proven worst case. On random inputs at the headline shape the codes matched those of the
 * conv in double at every window (tests/test_backward checks the gradients they give against
 * PyTorch's). At the headline, batch 2, 2 threads: 5.1 ms, against 8.2 for the direct path. */
#define CP_CODE_ERR 4.0
#define CP_CODE_CAND 16 /* near-tie candidates recomputed one by one; more: the whole window */

/* Y = A^T M A for every valid tile of one row pair and depth, raw (no bias, no divisor), into
 * the codes' rows: channel co's rows start at rows + co * cstride, conv row `row0` (and the next)
 * at + row0 * 2 tpad, each row split in two planes (even and odd columns, tpad apart) so that
 * tile t writes element t of both: contiguous stores, one vector loop over the tiles. */
CP_INLINE void cp_wout_rows_body(const cp_wout_args *a, int64_t nt, float *rows, int64_t cstride, int64_t row0)
{
    const int64_t xs = a->cpad * a->tpad, tpad = a->tpad;
    for (int64_t co = 0; co < a->cout; ++co) {
        const float *m = a->m + co * tpad;
        float *r0 = rows + co * cstride + row0 * 2 * tpad, *r1 = r0 + 2 * tpad;
        CP_SIMD
        for (int64_t k = 0; k < nt; ++k) {
            float s0[4], s1[4];
            for (int j = 0; j < 4; ++j) {
                s0[j] = m[j * xs + k] + m[(4 + j) * xs + k] + m[(8 + j) * xs + k];
                s1[j] = m[(4 + j) * xs + k] - m[(8 + j) * xs + k] - m[(12 + j) * xs + k];
            }
            r0[k] = s0[0] + s0[1] + s0[2];
            r0[tpad + k] = s0[1] - s0[2] - s0[3];
            r1[k] = s1[0] + s1[1] + s1[2];
            r1[tpad + k] = s1[1] - s1[2] - s1[3];
        }
    }
}

/* The training forward's own passes over its rows (cp_wout_rows_body, cp_scan_wino_body) have a
 * copy per ISA in the plan's table, as the forward's kernels do: compiled for the baseline
 * (x86-64-v2) their loops ran 4 floats a vector, and they were a fifth of the headline's
 * training forward (perf, batch 8, 2 threads). The arithmetic is the same in every copy (adds
 * and exact products by +-1, so FMA contraction cannot change a value). */
static void cp_wout_rows_scalar(CP_WOUT_ROWS_ARGS) { cp_wout_rows_body(a, nt, rows, cstride, row0); }
#if CP_X86
CP_TARGET_AVX2 static void cp_wout_rows_avx2(CP_WOUT_ROWS_ARGS) { cp_wout_rows_body(a, nt, rows, cstride, row0); }
CP_TARGET_AVX512 static void cp_wout_rows_avx512(CP_WOUT_ROWS_ARGS) { cp_wout_rows_body(a, nt, rows, cstride, row0); }
#endif

/* The exact code of window (b, co, pd, ph, pw) among its candidates (cand: raster positions,
 * ascending): their conv values in double, rounded to float, then q = (y + bias) / divisor in
 * float and PyTorch's scan (a value replaces the running max when greater). */
static uint32_t cp_code_exact(const cp_plan *pl, int64_t b, int64_t co, int64_t pd, int64_t ph, int64_t pw,
                              const float *weight, const uint32_t *cand, int ncand)
{
    const convpool_problem *p = &pl->p;
    const int64_t CI = p->in_channels, kd = p->kernel_d, kh = p->kernel_h, kw = p->kernel_w;
    const int64_t phw = p->pool_h * p->pool_w;
    float best = -INFINITY;
    uint32_t code = cand[0];
    for (int n = 0; n < ncand; ++n) {
        const int64_t pos = cand[n], od = pos / phw, oh = (pos % phw) / p->pool_w, ow = pos % p->pool_w;
        const int64_t d = pd * p->pool_d + od, h = ph * p->pool_h + oh, w = pw * p->pool_w + ow;
        double acc = 0.0;
        for (int64_t ci = 0; ci < CI; ++ci)
            for (int64_t i = 0; i < kd; ++i)
                for (int64_t j = 0; j < kh; ++j) {
                    const float *xr = pl->x + convpool_x_offset(p, b, ci, d + i, h + j, w);
                    const float *wr = weight + (((co * CI + ci) * kd + i) * kh + j) * kw;
                    for (int64_t k = 0; k < kw; ++k)
                        acc += (double)wr[k] * (double)xr[k];
                }
        const float q = ((float)acc + pl->cb[co]) / pl->div;
        if (q > best) {
            best = q;
            code = (uint32_t)pos;
        }
    }
    return code;
}

/* cp_code_exact over every position of the window, in batches of candidates. */
static uint32_t cp_code_exact(const cp_plan *pl, int64_t b, int64_t co, int64_t pd, int64_t ph, int64_t pw,
                              const float *weight, const uint32_t *cand, int ncand);
static uint32_t cp_code_exact_all(const cp_plan *pl, int64_t b, int64_t co, int64_t pd, int64_t ph, int64_t pw,
                                  const float *weight)
{
    const convpool_problem *p = &pl->p;
    const uint32_t vol = (uint32_t)(p->pool_d * p->pool_h * p->pool_w);
    /* The winner of each batch, then the winners in order: the first maximum overall. */
    uint32_t win[2], batch[CP_CODE_CAND];
    int have = 0;
    for (uint32_t p0 = 0; p0 < vol; p0 += CP_CODE_CAND) {
        int n = 0;
        for (uint32_t k = p0; k < vol && n < CP_CODE_CAND; ++k)
            batch[n++] = k;
        win[have++] = cp_code_exact(pl, b, co, pd, ph, pw, weight, batch, n);
        if (have == 2) {
            win[0] = cp_code_exact(pl, b, co, pd, ph, pw, weight, win, 2);
            have = 1;
        }
    }
    return win[0];
}

/* Whether window (b, pd, ph, pw)'s x field (every x its conv values read) holds one finite value
 * per input channel. Its conv values are then one exact number, so the correctly rounded conv
 * ties at every position and PyTorch's rule picks position 0. A zero or flat background makes
 * every window there a near-tie of every channel; this settles them at a read of the field
 * instead of an exact recompute per channel. */
static int cp_field_constant(const cp_plan *pl, int64_t b, int64_t pd, int64_t ph, int64_t pw)
{
    const convpool_problem *p = &pl->p;
    const int64_t rd = p->pool_d + p->kernel_d - 1, rh = p->pool_h + p->kernel_h - 1, rw = p->pool_w + p->kernel_w - 1;
    for (int64_t ci = 0; ci < p->in_channels; ++ci) {
        const float *x0 = pl->x + convpool_x_offset(p, b, ci, pd * p->pool_d, ph * p->pool_h, pw * p->pool_w);
        const float ref = x0[0];
        if (!isfinite(ref))
            return 0;
        for (int64_t i = 0; i < rd; ++i)
            for (int64_t j = 0; j < rh; ++j) {
                const float *row = x0 + (i * p->in_h + j) * p->in_w;
                int diff = 0;
                for (int64_t k = 0; k < rw; ++k)
                    diff |= row[k] != ref;
                if (diff)
                    return 0;
            }
    }
    return 1;
}

/* The codes of pooled row (pd, ph) of an item from its Winograd rows (cp_wout_rows' layout):
 * per channel, the two largest values of each window (z = sign(divisor) y) and the first
 * position holding the largest, branch-free across CP_CODE_CHUNK windows; near-ties exactly. */
/* half = pool_w / 2: window j's elements of one row plane are half apart. */
CP_INLINE void cp_scan_wino_at(const cp_plan *pl, int64_t b, cp_range r, int64_t pd, int64_t ph, const float *rows,
                               void *codes, int width, const float *tol, const float *weight, int64_t half)
{
    const convpool_problem *p = &pl->p;
    const int64_t tpad = pl->tpad, nrow = p->pool_d * p->pool_h, cout = p->out_channels;
    const int64_t npool = convpool_pooled_count(p), cstride = nrow * 2 * tpad;
    const float sgn = pl->div > 0.0f ? 1.0f : -1.0f;
    /* Chunks of CP_CODE_CHUNK windows, every channel of a chunk in turn: whether a window's x
     * field is constant (cp_field_constant) is found once for all its channels' near-ties. */
    for (int64_t w0 = r.pw0; w0 < r.pw1; w0 += CP_CODE_CHUNK) {
        const int64_t n = cp_min(CP_CODE_CHUNK, r.pw1 - w0);
        signed char flat[CP_CODE_CHUNK]; /* -1: not looked at yet */
        memset(flat, -1, sizeof flat);
        for (int64_t co = 0; co < cout; ++co) {
            const float *rc = rows + co * cstride;
            const int64_t at0 = (b * cout + co) * npool + (pd * p->pooled_h + ph) * p->pooled_w;
            /* The two largest values of each window (z = sign(divisor) y) and the first
             * position holding the largest, branch-free across CP_CODE_CHUNK windows. */
            /* Window j's position (k, e): row k, plane e % 2, element j half + e / 2. */
            const float *base = rc + (w0 - r.pw0) * half;
#define CP_WIN_AT(k, e) (base + (k) * 2 * tpad + ((e) % 2) * tpad + (e) / 2)
            /* nv: the windows the vector loops take. With half 1, n rounded up to 16 within the
             * rows' tpad floats: lanes past n read padding (zeros, or finite values of other
             * windows: the thread's rows are zeroed once a call) and their results go unused.
             * With n itself (31 at the headline) every position ended in a scalar tail, a
             * compare and a branch a window. */
            const int64_t nv = half == 1 ? cp_min(cp_min((n + 15) & ~(int64_t)15, CP_CODE_CHUNK), tpad - (w0 - r.pw0))
                                         : n;
            float best[CP_CODE_CHUNK], second[CP_CODE_CHUNK];
            uint32_t first[CP_CODE_CHUNK];
            for (int64_t j = 0; j < CP_CODE_CHUNK; ++j)
                best[j] = -INFINITY, second[j] = -INFINITY;
            for (int64_t k = 0; k < nrow; ++k)
                for (int64_t e = 0; e < p->pool_w; ++e) {
                    const float *src = CP_WIN_AT(k, e);
                    CP_SIMD
                    for (int64_t j = 0; j < nv; ++j) {
                        const float z = sgn * src[j * half];
                        const float lo = best[j] < z ? best[j] : z; /* no NaN here: inputs are fit */
                        second[j] = second[j] > lo ? second[j] : lo;
                        best[j] = best[j] > z ? best[j] : z;
                    }
                }
            /* The first position holding best, walking back from the last; the last position
             * sets first whole (best is some position's value, so one of them matches), which
             * spares a zeroing pass (a rep stos, 5% of the scan). */
            for (int64_t k = nrow - 1; k >= 0; --k)
                for (int64_t e = p->pool_w - 1; e >= 0; --e) {
                    const float *src = CP_WIN_AT(k, e);
                    const uint32_t pos = (uint32_t)(k * p->pool_w + e);
                    if (k == nrow - 1 && e == p->pool_w - 1) {
                        CP_SIMD
                        for (int64_t j = 0; j < nv; ++j)
                            first[j] = sgn * src[j * half] == best[j] ? pos : 0u;
                    } else {
                        CP_SIMD
                        for (int64_t j = 0; j < nv; ++j)
                            first[j] = sgn * src[j * half] == best[j] ? pos : first[j];
                    }
                }
            /* The codes as found, a vector loop for 1-byte codes; then the near-ties (a few
             * percent of the windows) again, exactly. Window by window with the store's width
             * switch and the tie test in one scalar loop, this tail was a third of the scan.
             * A lead beyond tol orders the q = (y + bias) / divisor strictly only while the
             * quotients stay normal: where the two largest divide to the same float (overflow to
             * inf under a tiny divisor, or underflow under a huge one) PyTorch's first-max rule
             * sees a tie, so those windows take the exact path too. */
            const float t = tol[co], cbv = pl->cb[co], dv = pl->div;
            /* The near-tie test of every window (both tests, bitwise, so the loop vectorises),
             * kept a byte a window for the exact pass below (which re-evaluated it, a division
             * a window, one window at a time) and counted in a declared reduction (an undeclared
             * one is a loop-carried dependence that omp simd is told does not exist). */
            int ties = 0;
            unsigned char tie[CP_CODE_CHUNK]; /* the test's result a window, for the exact pass */
            CP_SIMD_SUM(ties)
            for (int64_t j = 0; j < n; ++j) {
                tie[j] = (unsigned char)((!(best[j] - second[j] > t)) |
                                         ((sgn * best[j] + cbv) / dv == (sgn * second[j] + cbv) / dv));
                ties += tie[j];
            }
            if (width == 1) {
                uint8_t *dst = (uint8_t *)codes + at0 + w0;
                CP_SIMD
                for (int64_t j = 0; j < n; ++j)
                    dst[j] = (uint8_t)first[j];
            } else {
                for (int64_t j = 0; j < n; ++j)
                    convpool_code_store(codes, width, at0 + w0 + j, first[j]);
            }
            for (int64_t j = 0; j < n && ties > 0; ++j) {
                if (!tie[j])
                    continue;
                --ties;
                /* A near-tie: in a constant x field (finite weights: a finite tol) an exact
                 * tie at position 0; else the positions within tol of the best, exactly; the
                 * whole window where the best quotient is not a normal float (values far below
                 * the best can divide to the same inf or the same subnormal). */
                if (isfinite(t)) {
                    if (flat[j] < 0)
                        flat[j] = (signed char)cp_field_constant(pl, b, pd, ph, w0 + j);
                    if (flat[j]) {
                        convpool_code_store(codes, width, at0 + w0 + j, 0);
                        continue;
                    }
                }
                const float qb = fabsf((sgn * best[j] + cbv) / dv);
                const int normal = qb >= FLT_MIN && qb <= FLT_MAX;
                uint32_t cand[CP_CODE_CAND];
                int ncand = normal ? 0 : CP_CODE_CAND;
                for (int64_t k = 0; k < nrow && normal; ++k)
                    for (int64_t e = 0; e < p->pool_w; ++e)
                        if (sgn * CP_WIN_AT(k, e)[j * half] >= best[j] - t && ncand < CP_CODE_CAND)
                            cand[ncand++] = (uint32_t)(k * p->pool_w + e);
                const uint32_t code = ncand < CP_CODE_CAND ? cp_code_exact(pl, b, co, pd, ph, w0 + j, weight, cand, ncand)
                                                           : cp_code_exact_all(pl, b, co, pd, ph, w0 + j, weight);
                convpool_code_store(codes, width, at0 + w0 + j, code);
            }
#undef CP_WIN_AT
        }
    }
}

/* Pool width 2 (half 1, the common case) gets its own inlined copy, where the window loops
 * read contiguous floats: with half a run-time value they gathered element by element. */
CP_INLINE void cp_scan_wino_body(const cp_plan *pl, int64_t b, cp_range r, int64_t pd, int64_t ph, const float *rows,
                                  void *codes, int width, const float *tol, const float *weight)
{
    const int64_t half = pl->p.pool_w / 2;
    if (half == 1)
        cp_scan_wino_at(pl, b, r, pd, ph, rows, codes, width, tol, weight, 1);
    else
        cp_scan_wino_at(pl, b, r, pd, ph, rows, codes, width, tol, weight, half);
}
/* Per ISA, as cp_wout_rows_body. */
static void cp_scan_wino_scalar(CP_SCAN_WINO_ARGS) { cp_scan_wino_body(pl, b, r, pd, ph, rows, codes, width, tol, weight); }
#if CP_X86
CP_TARGET_AVX2 static void cp_scan_wino_avx2(CP_SCAN_WINO_ARGS)
{
    cp_scan_wino_body(pl, b, r, pd, ph, rows, codes, width, tol, weight);
}
CP_TARGET_AVX512 static void cp_scan_wino_avx512(CP_SCAN_WINO_ARGS)
{
    cp_scan_wino_body(pl, b, r, pd, ph, rows, codes, width, tol, weight);
}
#endif

/* The near-tie bound tol[co] = 2 E + 8 eps (A + |bias|) (see above) of a pooled d-row, with A =
 * max|x| sum|w[co]| and max|x| over the x that row's windows read (their Winograd column
 * transforms' inputs, cp_wcol's margin): tol = max|x| coef[co] + coef[cpad + co]. A window whose
 * best value leads by more has the exact arg-max, and its q = (y + bias) / divisor are strictly
 * ordered where they are normal floats (the scan checks that they differ). The max was once
 * taken over all of x in a pass of its own (3-4% of the headline's training forward at 2
 * threads, and memory-bound as threads grow); the row's own max is never larger, so the bound
 * stays valid and is tighter where x varies in magnitude. */
static void cp_code_tol_coef(const convpool_problem *q, const float *weight, const float *cb, int64_t cpad,
                             double *coef)
{
    const int64_t ktaps = q->in_channels * q->kernel_d * q->kernel_h * q->kernel_w;
    const double eps = FLT_EPSILON, terms = (double)(q->in_channels * q->kernel_d + 8);
    for (int64_t co = 0; co < q->out_channels; ++co) {
        double wsum = 0.0;
        for (int64_t k = 0; k < ktaps; ++k)
            wsum += fabs((double)weight[co * ktaps + k]);
        coef[co] = (2.0 * CP_CODE_ERR * terms + 8.0) * eps * wsum;
        coef[cpad + co] = 8.0 * eps * fabs((double)cb[co]);
    }
}

/* margin: the least cp_unfit_bits of the x read (>= 0: all fit), so CP_WINO_LIMIT_BITS - margin
 * is the bits of their largest |x|. */
static void cp_code_tol_at(int64_t cout, int64_t cpad, const double *coef, int32_t margin, float *tol)
{
    const uint32_t bits = margin >= 0 && margin <= CP_WINO_LIMIT_BITS ? (uint32_t)(CP_WINO_LIMIT_BITS - margin)
                                                                      : (uint32_t)CP_WINO_LIMIT_BITS;
    float xmax;
    memcpy(&xmax, &bits, sizeof xmax);
    for (int64_t co = 0; co < cout; ++co)
        tol[co] = (float)((double)xmax * coef[co] + coef[cpad + co]);
}

/* The Winograd codes conditions beyond the forward's: a finite nonzero divisor and finite conv
 * biases (the near-tie bound needs them). */
static int cp_codes_wino_ok(const convpool_problem *q, float div, const float *conv_bias)
{
    int ok = isfinite(div) && div != 0.0f;
    for (int64_t co = 0; co < q->out_channels && ok && conv_bias; ++co)
        ok = isfinite(conv_bias[co]);
    return ok;
}

/* The codes alone: the training forward's pass with a scratch pooled output (its Winograd
 * products and direct rows are what the codes need anyway; the window sums cost little). */
convpool_status convpool_codes_cpu(const convpool_problem *p, const float *x, const float *weight,
                                   const float *conv_bias, void *codes, int threads)
{
    convpool_problem q;
    convpool_status st = convpool_check_inputs(p, x, weight, &q);
    if (st != CONVPOOL_OK)
        return st;
    st = convpool_check_codes_threads(codes, threads);
    if (st != CONVPOOL_OK)
        return st;
    size_t pooled_b;
    if (!cp_bytes(q.batch * q.out_channels, sizeof(float), &pooled_b))
        return convpool_fail(CONVPOOL_ERR_OUT_OF_MEMORY, "cpu codes: scratch size overflows size_t");
    float *pooled = (float *)malloc(pooled_b);
    if (!pooled)
        return convpool_fail(CONVPOOL_ERR_OUT_OF_MEMORY, "cpu codes: cannot allocate %.3g bytes of scratch",
                             (double)pooled_b);
    st = cp_forward(&q, x, weight, conv_bias, NULL, pooled, NULL, threads, codes);
    free(pooled);
    return st;
}
