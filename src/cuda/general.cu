/*
 * general: any kernel extents (kd any; kh and kw while a staged plane fits in shared memory:
 * kh up to ~40 for f32 x and ~80 for 16-bit x, kw into the thousands), any pool extents
 * (anisotropic and 1 included), any Cin and Cout, any W alignment, x in f32, f16 or bf16, TF32
 * or STRICT (3xTF32).
 *
 * Implicit GEMM on mma.sync.m16n8k8 TF32 as in tile.cuh: M = 16 output channels (A = packed
 * weights, pack.cu, read per tap through L1), N = 8 conv columns (B = x from shared memory),
 * K = 8 input channels of one tap; the taps are run-time loops. A work item is (16 output
 * channels, b, wh x ww pooled windows in (h, w), pd_chunk pooled d-rows). Each conv d-row of
 * its region is computed in sub-tiles of 4 conv rows x 32 conv columns (a warp: 4 rows x 8
 * columns, 16 accumulators). A unit = (conv d-row, sub-tile, group of 8 input channels, tap
 * plane kd) stages one input plane (8 channels, rows 4 + kh - 1, columns 32 + kw - 1) into a
 * ring of SLOTS slots by cp.async, SLOTS - 1 units ahead of the one computed. One plane a unit
 * keeps the shared memory small for any kd, so several blocks share an SM.
 *
 * The conv values never leave the chip, but a pool window no longer fits one thread's
 * registers: after a sub-tile's last input group the warps write its conv values to a shared
 * conv tile, and each (channel, window) pair of the item, owned by one thread for the whole
 * item, folds the part of its window that lies in the sub-tile into a running max (min for a
 * negative divisor) kept in shared memory. A window is finished after its last conv d-row and
 * added to the pair's running sum; at the end of the item 16 threads add their channel's pairs
 * in a fixed order. Every choice is fixed by the problem, so results are deterministic.
 *
 * f32 x in TF32 mode is rounded to TF32 in shared memory once, by the thread that staged it
 * (after its own cp.async lands, before the barrier), instead of once per MMA.
 *
 * The plan picks it for every shape k3p2 and group do not take, as long as its shared memory
 * fits; the scalar generic kernel takes the rest.
 *
 * CODES (the training forward, f32 x): each (channel, window) pair also keeps its arg-max, the
 * raster position within the window of the value pool_train_kernel (finish.cu) would pick on
 * q = (v + bias) / divisor. The fold visits a window's positions out of raster order (a window
 * can straddle sub-tiles), so the running pick is order-free (code_beats): any NaN beats a
 * number and the later NaN beats an earlier one; among numbers the greater wins, the earlier
 * on a tie, which is the raster scan's "replace when greater or NaN" from -inf at position 0.
 * It runs on the inference plan's tile (same items, same partial sums: pooled and out are the
 * inference forward's, bit for bit) with 12 more bytes of shared memory per pair.
 *
 * Near-ties (TF32): a code picked from TF32 sums can differ from the FP32 conv's where two
 * positions' q lie within the sums' error, and a flipped window moves a whole gradient patch
 * (at Cin 3, where cuDNN's "TF32" conv is FP32, that was 4% of grad_x). So the pair also keeps
 * the runner-up q, and a window whose best and runner-up are within the error bound
 *   min(worst, spread) max|x| / |divisor|                              (K = Cin x taps)
 *   worst  = 2 (2^-10 + K 2^-23) ||w[c]||_1
 *   spread = 4.6 2^-10 ||w[c]||_2 + 2 sqrt(K) 2^-23 ||w[c]||_1
 * gets the code `flag` (a value past the window) instead; recheck_kernel then recomputes each
 * flagged window's conv values in FP32 and picks as pool_train_kernel does. `worst` bounds the
 * difference of two sums of products of TF32-rounded operands (round to nearest: 2^-11 each)
 * with FP32 accumulation; `spread` is eight standard deviations of that difference when the
 * roundings are independent (2^-11 sqrt(2/3) per product, sqrt(2) for the difference), which
 * flags 5x (K 216) to 12x (K 1000) fewer windows: with `worst` alone 20-40% of the windows of
 * x ~ U(0,1) were rechecked, 1.1 ms at pool 3, batch 16 (H100), more than the codes saved.
 * A window whose roundings all lean one way can flip past `spread`; its TF32 pick is then as
 * far from FP32's as a TF32 conv's own (eager's cuDNN in TF32 mode) can be. max|x| comes from
 * absmax_kernel. Windows whose code width has no spare value (exactly 256 or 65536 positions)
 * keep the TF32 pick.
 */
#include "kernels.h"
#include "tile.cuh"

namespace convpool_cuda {

namespace gen {
constexpr int WARPS = 4;
constexpr int THREADS = WARPS * 32;
constexpr int SUB_H = 4;                     /* conv rows of a sub-tile: one accumulator row each */
constexpr int SUB_W = 8 * WARPS;             /* conv columns of a sub-tile: 8 per warp */
constexpr int CIN = 8, COUT = 16;            /* K and M of one MMA */
constexpr int ROW = 48;                      /* staged row pitch for kw <= ROW_MAX_KW, elements */
constexpr int SLOTS = 3;                     /* staged planes: one computed, SLOTS - 1 in flight */
constexpr int ROW_MAX_KW = ROW - SUB_W + 1 - 7; /* shift (up to 7) + SUB_W + kw - 1 <= ROW */
constexpr int CONV_PITCH = SUB_H * SUB_W + 8; /* floats per channel of the conv tile */
constexpr int MAX_WIN = 128;                 /* pooled windows per item */
constexpr int MAX_WH = 8, MAX_WW = 32;
static_assert(ROW % 8 == 0, "rows must stay 16-byte aligned for 16-bit x");
} // namespace gen

struct GenParams {
    Shape s;
    int64_t wh, ww, n_sh, n_sw, n_th, n_tw, pd_chunk, n_pdc, n_cog, n_cig, n_items, nparts;
    int kd, kh, kw, taps;
    int in_h;    /* staged rows of a plane: SUB_H + kh - 1 */
    int row;     /* staged row pitch, elements: ROW, or wider for kw > ROW_MAX_KW */
    int plane;   /* in_h * row elements: one slot of one channel */
    int pitch;   /* elements per staged channel (all slots), bank-skewed */
    int nchunk;  /* 16-byte chunks per staged row */
    int aligned; /* 16-byte rows */
    int x_bytes; /* the staging ring, bytes */
    int nsets;   /* channel sets a staged (row, chunk) pair is split into: 1 (8 channels) or 2 */
    FastDiv div_nchunk, div_nwin;
    /* CODES: recheck near-ties (windows with a spare code value), that value, the raw weights
     * and max|x| as float bits (workspace; NaN under CONVPOOL_TEST_RECHECK_ALL: near_tie_xmax). */
    int recheck;
    uint32_t flag;
    const float *wraw;
    const unsigned *xmax;
};

/* Where a block is: item (cog, b, th, tw, pdc) and unit (pdl, ed, sh, sw, gi, kd) inside it.
 * All but item and b are below 2^30 (general_can_implement). */
struct UnitPos {
    int64_t item, b;
    int cog, th, tw, pdc, pd_count;
    int pdl, ed, sh, sw, gi, kd;
};

__device__ __forceinline__ void decode_item(const GenParams &P, int64_t item, UnitPos &u)
{
    u.item = item;
    int64_t r = item;
    u.cog = (int)(r % P.n_cog);
    r /= P.n_cog;
    u.tw = (int)(r % P.n_tw);
    r /= P.n_tw;
    u.th = (int)(r % P.n_th);
    r /= P.n_th;
    u.pdc = (int)(r % P.n_pdc);
    u.b = r / P.n_pdc;
    u.pd_count = (int)imin(P.pd_chunk, P.s.pooled_d - u.pdc * P.pd_chunk);
    u.pdl = u.ed = u.sh = u.sw = u.gi = u.kd = 0;
}

/* The unit after u (in a new item: item + gridDim.x; past the last, item >= n_items). */
__device__ __forceinline__ UnitPos next_unit(const GenParams &P, UnitPos u)
{
    if (++u.kd < P.kd)
        return u;
    u.kd = 0;
    if (++u.gi < P.n_cig)
        return u;
    u.gi = 0;
    if (++u.sw < P.n_sw)
        return u;
    u.sw = 0;
    if (++u.sh < P.n_sh)
        return u;
    u.sh = 0;
    if (++u.ed < P.s.pool_d)
        return u;
    u.ed = 0;
    if (++u.pdl < u.pd_count)
        return u;
    const int64_t item = u.item + gridDim.x;
    if (item < P.n_items)
        decode_item(P, item, u);
    else
        u.item = item;
    return u;
}

/* The unit's input plane and the origin of its sub-tile in conv coordinates. */
__device__ __forceinline__ int64_t unit_plane(const GenParams &P, const UnitPos &u)
{
    return ((int64_t)u.pdc * P.pd_chunk + u.pdl) * P.s.pool_d + u.ed + u.kd;
}
__device__ __forceinline__ int64_t unit_h0(const GenParams &P, const UnitPos &u)
{
    return (int64_t)u.th * P.wh * P.s.pool_h + u.sh * gen::SUB_H;
}
__device__ __forceinline__ int64_t unit_w0(const GenParams &P, const UnitPos &u)
{
    return (int64_t)u.tw * P.ww * P.s.pool_w + u.sw * gen::SUB_W;
}

/* Staging is laid out by (row r, 16-byte chunk q) pairs of a staged plane: thread i takes jobs
 * i, i + THREADS, ...; a job is a pair and a set of channels of the input group, and copies the
 * pair for those channels, so the address arithmetic runs once per job and a channel is one
 * pointer step (in_d * in_h * in_w elements in x, pitch in shared memory). A pair is one job of
 * all 8 channels, or, where a plane has at most THREADS / 2 pairs (3x3 planes: 60 for f32 x, 36
 * for 16-bit), two jobs of 4 channels: otherwise the first warp or two stage and round every
 * channel while the others wait at the barrier (pool 3, k3: 6% of the kernel's time, H100).
 * The same assignment stages, zero-pads and (f32 TF32) rounds, so a thread only touches its own
 * chunks before the barrier. (A flat (channel, row, chunk) index cost two divisions and a
 * 64-bit address per chunk: ncu counted ~31 instructions per MMA at pool 3.) */
struct Pair {
    int r, q;
};
__device__ __forceinline__ Pair pair_of(const GenParams &P, uint32_t i)
{
    Pair k;
    const uint32_t r = fdiv(i, P.div_nchunk);
    k.q = (int)(i - r * P.div_nchunk.d);
    k.r = (int)r;
    return k;
}

/* Columns are staged from w0 rounded down to a whole 16-byte chunk; the sub-tile's first column
 * sits `shift` elements into the staged row. */
template <typename T> __device__ __forceinline__ int unit_shift(const GenParams &P, const UnitPos &u)
{
    return (int)(unit_w0(P, u) % (16 / (int)sizeof(T)));
}

/* Stages unit u's plane into ring slot `slot`. Channels past Cin are zeroed (zero weights times
 * a stale inf would be NaN); rows and columns past the input are skipped: they only feed conv
 * values no window reads, and an MMA keeps each output row and column to itself. */
template <typename T>
__device__ __forceinline__ void stage_unit(const GenParams &P, T *xs, const T *__restrict__ x, const UnitPos &u,
                                           int slot)
{
    constexpr int EPC = 16 / (int)sizeof(T);
    const Shape &s = P.s;
    const int64_t plane = unit_plane(P, u), h0 = unit_h0(P, u), w0 = unit_w0(P, u) - unit_shift<T>(P, u);
    const int64_t c0 = (int64_t)u.gi * gen::CIN;
    const int nch = (int)imin(gen::CIN, s.cin - c0);
    const uint32_t pairs = (uint32_t)(P.in_h * P.nchunk);
    const int64_t hw = s.in_h * s.in_w, cstride = s.in_d * hw;
    const T *xc = x + ((u.b * s.cin + c0) * s.in_d + plane) * hw;
    const int cpj = gen::CIN / P.nsets;
    for (uint32_t j = threadIdx.x; j < pairs * (uint32_t)P.nsets; j += gen::THREADS) {
        const uint32_t set = j >= pairs ? 1u : 0u, i = j - set * pairs;
        const Pair k = pair_of(P, i);
        const int clo = (int)set * cpj;
        T *dst = xs + slot * P.plane + k.r * P.row + k.q * EPC + clo * P.pitch;
        const int64_t gh = h0 + k.r, gw = w0 + (int64_t)k.q * EPC;
        const bool inside = gh < s.in_h && gw < s.in_w;
        const T *src = xc + gh * s.in_w + gw + clo * cstride;
        const int64_t left = s.in_w - gw;
        const int n = (int)(left < EPC ? left : EPC);
#pragma unroll 1
        for (int c = clo; c < clo + cpj; ++c, dst += P.pitch, src += cstride) {
            if (c >= nch) {
                *reinterpret_cast<uint4 *>(dst) = make_uint4(0u, 0u, 0u, 0u);
                continue;
            }
            if (!inside)
                continue;
            if (P.aligned) {
                cp_async16(dst, src, n * (int)sizeof(T));
            } else if constexpr (sizeof(T) == 4) {
                for (int e = 0; e < n; ++e)
                    cp_async4(dst + e, src + e);
            } else {
                for (int e = 0; e < n; ++e)
                    dst[e] = src[e];
            }
        }
    }
}

/* f32 x, TF32: rounds this thread's chunks of a slot in place (after its copies landed). */
__device__ __forceinline__ void round_own_chunks(const GenParams &P, float *xs, int slot)
{
    const uint32_t pairs = (uint32_t)(P.in_h * P.nchunk);
    const int cpj = gen::CIN / P.nsets;
    for (uint32_t j = threadIdx.x; j < pairs * (uint32_t)P.nsets; j += gen::THREADS) {
        const uint32_t set = j >= pairs ? 1u : 0u, i = j - set * pairs;
        const Pair k = pair_of(P, i);
        const int clo = (int)set * cpj;
        float *row = xs + slot * P.plane + k.r * P.row + k.q * 4;
#pragma unroll 4
        for (int c = clo; c < clo + cpj; ++c) {
            uint4 *p = reinterpret_cast<uint4 *>(row + c * P.pitch);
            uint4 v = *p;
            v.x = to_tf32(__uint_as_float(v.x));
            v.y = to_tf32(__uint_as_float(v.y));
            v.z = to_tf32(__uint_as_float(v.z));
            v.w = to_tf32(__uint_as_float(v.w));
            *p = v;
        }
    }
}

/* Whether (q, pos) replaces the running pick (bq, bp) of a window: see CODES above. */
__device__ __forceinline__ bool code_beats(float q, int pos, float bq, int bp)
{
    if (isnan(q))
        return !isnan(bq) || pos > bp;
    if (isnan(bq))
        return false;
    return q > bq || (q == bq && pos < bp);
}

__device__ __forceinline__ void store_code(void *codes, int code_bytes, int64_t i, int code)
{
    if (code_bytes == 1)
        static_cast<uint8_t *>(codes)[i] = (uint8_t)code;
    else if (code_bytes == 2)
        static_cast<uint16_t *>(codes)[i] = (uint16_t)code;
    else
        static_cast<uint32_t *>(codes)[i] = (uint32_t)code;
}

/* B operand of an x element: f32 in TF32 mode was rounded in shared memory already; 16-bit
 * values are exact in TF32. */
template <typename T> __device__ __forceinline__ uint32_t b_operand(T v)
{
    if constexpr (std::is_same<T, float>::value)
        return __float_as_uint(v);
    else
        return __float_as_uint(to_float(v));
}

/* One unit's MMAs: acc[hh] += conv of sub-tile row hh (nrows of them) over the kh x kw taps of
 * plane kd and 8 input channels. xw: this lane's B element (channel t, column g) in the unit's
 * slot; wf: the A fragments of the input group. KH, KW > 0 fix the tap extents at compile time
 * (the loops unroll and a tap row's weight loads are in flight together); 0 reads them from P. */
template <typename T, bool STRICT, int KH, int KW>
__device__ __forceinline__ void conv_unit(const GenParams &P, float (&acc)[gen::SUB_H][4], const T *xw,
                                          const uint4 *__restrict__ wf, int kd, int lane, int nrows)
{
    constexpr bool X16 = !std::is_same<T, float>::value;
    const int kh_n = KH ? KH : P.kh, kw_n = KW ? KW : P.kw;
    const int rp = KW ? gen::ROW : P.row; /* compile-time for the fixed-extent variants */
    const T *xw4 = xw + 4 * P.pitch; /* channel t + 4 */
    const uint4 *wt = wf + kd * kh_n * kw_n * 32 + lane;
    if constexpr (!STRICT && KH > 1 && KW > 0) {
        /* Staged row r feeds sub-tile row hh through tap row kh = r - hh: with the KH A
         * fragments of one tap column in registers, each staged row's B values are loaded once
         * and used by up to KH MMAs, (SUB_H + KH - 1) B loads a tap column instead of
         * SUB_H * KH. Every index is a compile-time constant, so acc stays in registers. */
#pragma unroll
        for (int kw = 0; kw < KW; ++kw) {
            uint4 a[KH];
#pragma unroll
            for (int kh = 0; kh < KH; ++kh)
                a[kh] = __ldg(wt + (kh * KW + kw) * 32);
#pragma unroll
            for (int r = 0; r < gen::SUB_H + KH - 1; ++r) {
                const uint32_t b0 = b_operand(xw[r * gen::ROW + kw]), b1 = b_operand(xw4[r * gen::ROW + kw]);
#pragma unroll
                for (int kh = 0; kh < KH; ++kh) {
                    const int hh = r - kh;
                    if (hh >= 0 && hh < gen::SUB_H && hh < nrows)
                        mma_tf32(acc[hh], a[kh], b0, b1);
                }
            }
        }
    } else if constexpr (!STRICT) {
#pragma unroll(KH ? KH : 1)
        for (int kh = 0; kh < kh_n; ++kh) {
            const T *row = xw + kh * rp, *row4 = xw4 + kh * rp;
#pragma unroll(KW ? KW : 1)
            for (int kw = 0; kw < kw_n; ++kw) {
                const uint4 a = __ldg(wt + (kh * kw_n + kw) * 32);
#pragma unroll
                for (int hh = 0; hh < gen::SUB_H; ++hh)
                    if (hh < nrows)
                        mma_tf32(acc[hh], a, b_operand(row[hh * rp + kw]), b_operand(row4[hh * rp + kw]));
            }
        }
    } else {
        /* As tile.cuh's STRICT conv_step: the big*big products of each tap row start from zero
         * and join acc by a round-to-nearest FADD; the small cross terms keep their own
         * tensor-core accumulator, dropped where x is not finite. */
        const uint4 *ws = wt + P.taps * 32;
        float accs[gen::SUB_H][4];
        zero_regs(accs);
#pragma unroll(KH ? KH : 1)
        for (int kh = 0; kh < kh_n; ++kh) {
            const T *row = xw + kh * rp, *row4 = xw4 + kh * rp;
            float tmp[gen::SUB_H][4];
            zero_regs(tmp);
#pragma unroll(KW ? KW : 1)
            for (int kw = 0; kw < kw_n; ++kw) {
                const uint4 abig = __ldg(wt + (kh * kw_n + kw) * 32);
                const uint4 asmall = __ldg(ws + (kh * kw_n + kw) * 32);
#pragma unroll
                for (int hh = 0; hh < gen::SUB_H; ++hh) {
                    if (hh >= nrows)
                        continue;
                    const float v0 = to_float(row[hh * rp + kw]), v1 = to_float(row4[hh * rp + kw]);
                    if constexpr (X16) {
                        const uint32_t b0 = __float_as_uint(v0), b1 = __float_as_uint(v1);
                        mma_tf32(accs[hh], asmall, b0, b1);
                        mma_tf32(tmp[hh], abig, b0, b1);
                    } else {
                        const uint32_t b0 = to_tf32(v0), b1 = to_tf32(v1);
                        const uint32_t s0 = tf32_operand_unchecked(v0 - __uint_as_float(b0));
                        const uint32_t s1 = tf32_operand_unchecked(v1 - __uint_as_float(b1));
                        mma_tf32(accs[hh], asmall, b0, b1);
                        mma_tf32(accs[hh], abig, s0, s1);
                        mma_tf32(tmp[hh], abig, b0, b1);
                    }
                }
            }
#pragma unroll
            for (int hh = 0; hh < gen::SUB_H; ++hh)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    acc[hh][e] += tmp[hh][e];
        }
#pragma unroll
        for (int hh = 0; hh < gen::SUB_H; ++hh)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                acc[hh][e] += isfinite(accs[hh][e]) ? accs[hh][e] : 0.0f;
    }
}

__device__ __forceinline__ float window_identity(const ChanMode &m)
{
    return m.mode == kMinRaw ? __int_as_float(0x7f800000) : __int_as_float(0xff800000);
}

template <typename T, bool STRICT, int KH, int KW, bool CODES>
__global__ void __launch_bounds__(gen::THREADS)
general_kernel(const GenParams P, const T *__restrict__ x, const uint4 *__restrict__ wpacked,
               const float *__restrict__ conv_bias, float *__restrict__ partials, void *__restrict__ codes,
               int code_bytes)
{
    using namespace gen;
    constexpr bool ROUND_IN_SMEM = std::is_same<T, float>::value && !STRICT;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *xs = reinterpret_cast<T *>(smem_raw);
    float *conv_s = reinterpret_cast<float *>(smem_raw + P.x_bytes);
    const int nwin = (int)(P.wh * P.ww);
    float *win_s = conv_s + COUT * CONV_PITCH; /* [channel][wh][ww] running max (or min) */
    float *sum_s = win_s + COUT * nwin;        /* [channel][wh][ww] sum over finished windows */
    ChanMode *cm_s = reinterpret_cast<ChanMode *>(sum_s + COUT * nwin);
    float *bq_s = reinterpret_cast<float *>(cm_s + COUT); /* CODES: [channel][wh][ww] pick's q */
    int *bp_s = reinterpret_cast<int *>(bq_s + COUT * nwin); /* and its raster position */
    float *sq_s = reinterpret_cast<float *>(bp_s + COUT * nwin); /* the runner-up's q */
    float *tol_s = sq_s + COUT * nwin;                          /* [channel] near-tie bound */

    const Shape &s = P.s;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    if ((int64_t)blockIdx.x >= P.n_items)
        return;

    for (int i = tid; i < P.x_bytes / 16; i += THREADS)
        reinterpret_cast<uint4 *>(smem_raw)[i] = make_uint4(0u, 0u, 0u, 0u);

    const int npairs = COUT * nwin;
    auto reset_item = [&](int64_t cog) {
        if (tid < COUT)
            cm_s[tid] = chan_mode(conv_bias, cog * COUT + tid, s.cout, s.divisor);
        if constexpr (CODES) {
            if (tid < COUT && P.recheck) {
                const int64_t ch = cog * COUT + tid, K = s.cin * (int64_t)P.taps;
                float l1 = 0.0f, l2 = 0.0f;
                if (ch < s.cout)
                    for (int64_t k = 0; k < K; ++k) {
                        const float wk = __ldg(P.wraw + ch * K + k);
                        l1 += fabsf(wk);
                        l2 = fmaf(wk, wk, l2);
                    }
                const float xm = __uint_as_float(*P.xmax);
                if constexpr (STRICT) {
                    /* q-space; the literal mode (divisor 0, inf or NaN) flags every window */
                    const float tol = strict_tie_tol(l1, xm, cm_s[tid].bias, s.divisor, (float)P.kw,
                                                     (float)P.n_cig * (float)P.kd * (float)P.kh);
                    tol_s[tid] = cm_s[tid].mode == kLiteral ? NAN : tol / fabsf(s.divisor);
                } else {
                    const float worst = 2.0f * (0x1p-10f + (float)K * 0x1p-23f) * l1;
                    const float spread = 4.6f * 0x1p-10f * sqrtf(l2) + 2.0f * sqrtf((float)K) * 0x1p-23f * l1;
                    tol_s[tid] = fminf(worst, spread) * xm / fabsf(s.divisor);
                }
            }
        }
        for (int p = tid; p < npairs; p += THREADS) {
            const int c = (int)fdiv((uint32_t)p, P.div_nwin);
            win_s[p] = window_identity(chan_mode(conv_bias, cog * COUT + c, s.cout, s.divisor));
            sum_s[p] = 0.0f;
            if constexpr (CODES)
                bq_s[p] = -INFINITY, bp_s[p] = 0, sq_s[p] = -INFINITY;
        }
    };

    UnitPos u;
    decode_item(P, blockIdx.x, u);
    reset_item(u.cog);
    __syncthreads(); /* zeroing before any cp.async lands */
    /* The ring: unit k sits in slot k % SLOTS; pf is the next unit to stage. One commit group per
     * unit (empty past the end), so wait_group<SLOTS - 2> means "this unit has landed". */
    UnitPos pf = u;
    int pf_slot = 0;
    for (int k = 0; k < SLOTS - 1; ++k) {
        if (pf.item < P.n_items) {
            stage_unit(P, xs, x, pf, pf_slot);
            pf = next_unit(P, pf);
        }
        cp_async_commit();
        pf_slot = pf_slot + 1 == SLOTS ? 0 : pf_slot + 1;
    }

    const int region_h = (int)(P.wh * s.pool_h), region_w = (int)(P.ww * s.pool_w);
    const int ph = (int)s.pool_h, pw = (int)s.pool_w, wh_n = (int)P.wh, ww_n = (int)P.ww;
    int slot = 0;
    float acc[SUB_H][4];
    for (;;) {
        cp_async_wait_group<SLOTS - 2>();
        if constexpr (ROUND_IN_SMEM)
            round_own_chunks(P, xs, slot);
        __syncthreads(); /* this unit's plane is visible; every warp is done with the unit before */

        if (pf.item < P.n_items) {
            stage_unit(P, xs, x, pf, pf_slot);
            pf = next_unit(P, pf);
        }
        cp_async_commit();
        pf_slot = pf_slot + 1 == SLOTS ? 0 : pf_slot + 1;

        const int r0 = (int)u.sh * SUB_H, c0 = (int)u.sw * SUB_W; /* sub-tile origin in the region */
        const int nrows = min(SUB_H, region_h - r0), ncols = min(SUB_W, region_w - c0);
        const bool active = 8 * warp < ncols;
        if (u.gi == 0 && u.kd == 0) {
            zero_regs(acc);
        }
        if (active) {
            const int64_t per_group = (STRICT ? 2 : 1) * (int64_t)P.taps * 32;
            const uint4 *wf = wpacked + (u.cog * P.n_cig + u.gi) * per_group;
            const T *xw = xs + t * P.pitch + slot * P.plane + unit_shift<T>(P, u) + 8 * warp + g;
            conv_unit<T, STRICT, KH, KW>(P, acc, xw, wf, (int)u.kd, lane, nrows);
        }

        if (u.gi == P.n_cig - 1 && u.kd == P.kd - 1) {
            /* The sub-tile is complete: its conv values go to the shared tile, then the windows
             * it touches fold their part in. Thread (c = tid / 8, j = tid % 8) takes channel c's
             * windows j, j + 8, ...; a window finishes in the sub-tile holding its last row and
             * column of its last conv d-row. */
            if (active) {
                const int col = 8 * warp + 2 * t;
#pragma unroll
                for (int hh = 0; hh < SUB_H; ++hh) {
                    *reinterpret_cast<float2 *>(conv_s + g * CONV_PITCH + hh * SUB_W + col) =
                        make_float2(acc[hh][0], acc[hh][1]);
                    *reinterpret_cast<float2 *>(conv_s + (g + 8) * CONV_PITCH + hh * SUB_W + col) =
                        make_float2(acc[hh][2], acc[hh][3]);
                }
            }
            __syncthreads();
            const int wh_lo = r0 / ph, wh_hi = min(wh_n - 1, (r0 + nrows - 1) / ph);
            const int ww_lo = c0 / pw, ww_hi = min(ww_n - 1, (c0 + ncols - 1) / pw);
            const int nw = ww_hi - ww_lo + 1, nwh = (wh_hi - wh_lo + 1) * nw;
            const int c = tid >> 3;
            const ChanMode m = cm_s[c];
            const float *cs = conv_s + c * CONV_PITCH;
            const bool last_d = u.ed == s.pool_d - 1;
            int wh = wh_lo + (tid & 7) / nw, ww = ww_lo + (tid & 7) % nw;
            for (int j = tid & 7; j < nwh; j += 8) {
                const int a0 = max(wh * ph, r0), a1 = min((wh + 1) * ph, r0 + SUB_H);
                const int b0 = max(ww * pw, c0), b1 = min((ww + 1) * pw, c0 + SUB_W);
                const int p = c * nwin + wh * ww_n + ww;
                float st = win_s[p];
                float bq = 0.0f, sq = 0.0f;
                int bp = 0;
                float rdiv = 0.0f;
                if constexpr (CODES)
                    bq = bq_s[p], bp = bp_s[p], sq = sq_s[p], rdiv = pow2_recip(m.div);
                for (int r = a0; r < a1; ++r)
                    for (int q = b0; q < b1; ++q) {
                        const float v = cs[(r - r0) * SUB_W + (q - c0)];
                        st = window_combine(st, window_elem(v, m), m);
                        if constexpr (CODES) {
                            const float qv = div_rn(v + m.bias, m.div, rdiv);
                            const int pos = (u.ed * ph + r - wh * ph) * pw + q - ww * pw;
                            if (code_beats(qv, pos, bq, bp))
                                sq = fmaxf(sq, bq), bq = qv, bp = pos;
                            else
                                sq = fmaxf(sq, qv);
                        }
                    }
                if (last_d && (wh + 1) * ph <= r0 + SUB_H && (ww + 1) * pw <= c0 + SUB_W) {
                    const int64_t gh = u.th * P.wh + wh, gw = u.tw * P.ww + ww;
                    if (gh < s.pooled_h && gw < s.pooled_w) {
                        sum_s[p] += window_finish(st, m);
                        if constexpr (CODES) {
                            const int64_t ch = u.cog * COUT + c;
                            if (ch < s.cout) {
                                const int64_t pd = (int64_t)u.pdc * P.pd_chunk + u.pdl;
                                const int64_t win = (pd * s.pooled_h + gh) * s.pooled_w + gw;
                                /* NaN anywhere in bq - sq (a NaN pick, an inf bound) flags too. */
                                const bool tie = P.recheck && !(bq - sq > tol_s[c]);
                                store_code(codes, code_bytes, (u.b * s.cout + ch) * (s.pooled_d * s.pooled_h * s.pooled_w) + win,
                                           tie ? (int)P.flag : bp);
                            }
                        }
                    }
                    st = window_identity(m);
                    bq = -INFINITY, bp = 0, sq = -INFINITY;
                }
                win_s[p] = st;
                if constexpr (CODES)
                    bq_s[p] = bq, bp_s[p] = bp, sq_s[p] = sq;
                ww += 8;
                while (ww > ww_hi) {
                    ww -= nw;
                    ++wh;
                }
            }
        }

        const UnitPos nu = next_unit(P, u);
        if (nu.item != u.item) {
            /* Item done: 16 threads add their channel's windows in a fixed order. */
            __syncthreads();
            if (tid < COUT && u.cog * COUT + tid < s.cout) {
                float tot = 0.0f;
                for (int wi = 0; wi < nwin; ++wi)
                    tot += sum_s[tid * nwin + wi];
                const int64_t part = (u.pdc * P.n_th + u.th) * P.n_tw + u.tw;
                partials[(u.b * s.cout + u.cog * COUT + tid) * P.nparts + part] = tot;
            }
            __syncthreads();
            if (nu.item >= P.n_items)
                break;
            reset_item(nu.cog);
        }
        u = nu;
        slot = slot + 1 == SLOTS ? 0 : slot + 1;
    }
    cp_async_wait_all();
}

/* max |x| over n floats into *xmax as float bits (zeroed by the caller; the bits of
 * non-negative floats order as the floats, and a NaN's above inf's: a NaN flags every window). */
__global__ void __launch_bounds__(256) absmax_kernel(const float *__restrict__ x, int64_t n, unsigned *xmax)
{
    __shared__ unsigned red[8];
    unsigned m = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        m = max(m, __float_as_uint(x[i]) & 0x7fffffffu);
    for (int o = 16; o > 0; o >>= 1)
        m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < (int)(blockDim.x >> 5); ++i)
            m = max(m, red[i]);
        atomicMax(xmax, m);
    }
}

/* The flagged windows' codes again, from FP32 conv values (Acc float; strict: double, rounded to
 * float): a warp per 32 codes; for each flagged one the warp computes every position's conv
 * value in a fixed order (the same bits each run), adds the conv bias, divides and picks as
 * pool_train_kernel does. A staged field with one value per channel (flat_field) takes one dot
 * product (flat_pick).
 *
 * Staged (the common case): the warp first copies the window's receptive field (Cin x (pool +
 * kernel - 1) per dimension, at most RECHECK_STAGE floats) into one of its two slices of shared
 * memory (the field's own size in whole 128 B) with cp.async while it sums the previous flagged
 * window from the other slice.
 * Three int32 tables built once per block hold every index the loops need: each field
 * element's offset in x, each (channel, tap)'s in the field, each window position's. Windows of
 * up to 32 positions sum all positions at once (recheck_pick_wide: one offset and one weight
 * load a k for P FMAs, a transposing butterfly, one division a lane); larger ones take the
 * lanes over K, RECHECK_POS positions at a time with a shuffle tree each (recheck_pick).
 * Otherwise (a larger field, K past RECHECK_STAGE_K, or x past int32 offsets) the warp gathers
 * from x with recheck_pick, with a 64-bit (channel, tap) table up to RECHECK_GLOBAL_K.
 *
 * History (pool 3, batch 16): with 64-bit divisions decomposing positions and field elements in
 * the loops and one field load in flight per lane, a window took ~20 us of a warp (H100: all
 * 409,600 windows rechecked in 4.5 ms, the 6% flagged 0.29 ms). ncu of the recheck_pick form
 * with every window rechecked (H200, 2026-11-26): ~2,960 warp instructions a window, ~400 of
 * them 64-bit index divisions (now 32-bit where the codes allow), 5 shuffles and an IEEE
 * division per position, L1/shared 83% busy; the wide form and 4 blocks an SM (128 registers,
 * no spill) took the flagged recheck from 0.170 to 0.137 ms in the training step. */
constexpr int RECHECK_WARPS = 4;
constexpr int RECHECK_POS = 4;          /* window positions summed together */
constexpr int RECHECK_SCAN = 16;        /* chunks of 32 codes a warp reads at once */
constexpr int64_t RECHECK_STAGE = 2048; /* floats of a warp's receptive-field slice */
constexpr int64_t RECHECK_STAGE_K = 4096;
constexpr int64_t RECHECK_GLOBAL_K = 6144;
/* The staged layout at its largest: fields, then K, field and vol (<= field) int32 offsets. */
constexpr int64_t RECHECK_SMEM_MAX = (RECHECK_WARPS * 2 * RECHECK_STAGE + RECHECK_STAGE_K + 2 * RECHECK_STAGE) * 4;

struct RecheckGeom {
    int64_t taps, K, vol, rd, rh, rw, field; /* field: Cin x rd x rh x rw */
    int64_t pitch;                           /* floats of a warp's slice: the field in whole 128 B */
    int staged;
};

__host__ __device__ inline RecheckGeom recheck_geom(const Shape &s)
{
    RecheckGeom g;
    g.taps = s.k_d * s.k_h * s.k_w;
    g.K = s.cin * g.taps;
    g.vol = s.pool_d * s.pool_h * s.pool_w;
    g.rd = s.pool_d + s.k_d - 1, g.rh = s.pool_h + s.k_h - 1, g.rw = s.pool_w + s.k_w - 1;
    g.field = s.cin * g.rd * g.rh * g.rw;
    g.pitch = (g.field + 31) / 32 * 32;
    g.staged = g.field <= RECHECK_STAGE && g.K <= RECHECK_STAGE_K && s.cin * s.in_d * s.in_h * s.in_w < INT32_MAX;
    return g;
}

/* Dynamic shared memory of recheck_kernel. */
inline size_t recheck_smem(const RecheckGeom &g)
{
    if (g.staged)
        return (size_t)(RECHECK_WARPS * 2 * g.pitch + g.K + g.field + g.vol) * 4;
    return g.K <= RECHECK_GLOBAL_K ? (size_t)g.K * sizeof(int64_t) : 0;
}

/* Offset of element k = (ci, td, th, tw) of a kd x kh x kw box in a box of d x h x w per channel. */
__device__ __forceinline__ int64_t box_offset(int64_t k, int64_t kd, int64_t kh, int64_t kw, int64_t d, int64_t h,
                                              int64_t w)
{
    const int64_t taps = kd * kh * kw, ci = k / taps, t = k - ci * taps;
    const int64_t tw = t % kw, th = (t / kw) % kh, td = t / (kw * kh);
    return ((ci * d + td) * h + th) * w + tw;
}

/* The window's pick from RECHECK_POS-position groups: src[pos_off(pos) + off(k)] is x of
 * (position, k). */
template <typename Acc, typename PosFn, typename OffFn>
__device__ __forceinline__ int recheck_pick(const float *src, int K, int vol, const float *wc, float cb, float divisor,
                                            int lane, PosFn pos_off, OffFn off)
{
    float best = __int_as_float(0xff800000);
    int code = 0;
    for (int pos0 = 0; pos0 < vol; pos0 += RECHECK_POS) {
        const float *xp[RECHECK_POS];
#pragma unroll
        for (int j = 0; j < RECHECK_POS; ++j)
            xp[j] = src + pos_off(min(pos0 + j, vol - 1)); /* past the end: a duplicate, dropped */
        Acc acc[RECHECK_POS];
#pragma unroll
        for (int j = 0; j < RECHECK_POS; ++j)
            acc[j] = 0;
        for (int k = lane; k < K; k += 32) {
            const auto o = off(k);
            const Acc wk = __ldg(wc + k);
#pragma unroll
            for (int j = 0; j < RECHECK_POS; ++j)
                acc[j] = fma((Acc)xp[j][o], wk, acc[j]);
        }
#pragma unroll
        for (int j = 0; j < RECHECK_POS; ++j)
            for (int o = 16; o > 0; o >>= 1)
                acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
#pragma unroll
        for (int j = 0; j < RECHECK_POS; ++j) {
            const float q = __fdiv_rn((float)acc[j] + cb, divisor);
            if (pos0 + j < vol && (q > best || isnan(q))) {
                best = q;
                code = pos0 + j;
            }
        }
    }
    return code;
}

/* The window's pick from its staged field for windows of at most P positions (P = 8, 16, 32):
 * each lane sums its share of K (k = lane, lane + 32, ...) for every position at once, P
 * accumulators fed by one (channel, tap) offset and one weight load a k; a transposing
 * butterfly then leaves position p's sum in the lanes whose high bits spell p (P = 32: lane p),
 * after 31 shuffles for 32 positions instead of 5 a position; each lane divides its own sum
 * once and the lanes' picks meet by code_beats. A fixed order throughout: the same bits each
 * run. po: every position's offset in the field (uniform registers, past vol a duplicate). */
template <typename Acc, int P>
__device__ __forceinline__ int recheck_pick_wide(const float *field, const int *soff, const int (&po)[P], int K, int vol,
                                                 const float *__restrict__ wc, float cb, float divisor, int lane)
{
    Acc acc[P];
#pragma unroll
    for (int p = 0; p < P; ++p)
        acc[p] = 0;
    for (int k = lane; k < K; k += 32) {
        const float *src = field + soff[k];
        const Acc wk = __ldg(wc + k);
#pragma unroll
        for (int p = 0; p < P; ++p)
            acc[p] = fma((Acc)src[po[p]], wk, acc[p]);
    }
    /* Level o: the lanes with bit o keep the upper half of their values, the others the lower,
     * each adding the partner's copy of the half it keeps. */
    constexpr int LEVELS = P == 32 ? 5 : P == 16 ? 4 : 3; /* log2(P) */
#pragma unroll
    for (int lvl = 0; lvl < LEVELS; ++lvl) {
        const int half = (P >> lvl) / 2, o = 16 >> lvl;
        const bool upper = (lane & o) != 0;
#pragma unroll
        for (int j = 0; j < P / 2; ++j)
            if (j < half) {
                const Acc send = upper ? acc[j] : acc[j + half];
                const Acc keep = upper ? acc[j + half] : acc[j];
                acc[j] = keep + __shfl_xor_sync(0xffffffffu, send, o);
            }
    }
#pragma unroll
    for (int o = 16 >> LEVELS; o > 0; o >>= 1) /* the lanes left with the same position */
        acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], o);
    const int pos = lane >> (5 - LEVELS);
    float best = __fdiv_rn((float)acc[0] + cb, divisor);
    int code = pos < vol ? pos : INT_MAX;
    if (pos >= vol)
        best = __int_as_float(0xff800000);
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float ob = __shfl_xor_sync(0xffffffffu, best, o);
        const int oc = __shfl_xor_sync(0xffffffffu, code, o);
        if (code_beats(ob, oc, best, code))
            best = ob, code = oc;
    }
    return code;
}

/* Whether a staged field holds one value per channel (bitwise but for the sign of zero, which
 * no q compares by): then every window position's conv value is the same number. A zero or flat
 * background flags every window it holds (its TF32 or 3xTF32 sums tie). Leaves at the first
 * 32 elements that differ, so a field that is not flat costs a chunk or two. */
__device__ __forceinline__ bool flat_field(const float *field, int cin, int chv, int lane)
{
    for (int ci = 0; ci < cin; ++ci) {
        const float *f = field + ci * chv;
        const float first = f[0];
        for (int e0 = 0; e0 < chv; e0 += 32) {
            const int e = e0 + lane;
            if (!__all_sync(0xffffffffu, e >= chv || f[e] == first))
                return false;
        }
    }
    return true;
}

/* The pick of a flat field's window (flat_field): every position has position 0's q, so
 * PyTorch's rule keeps the first, or where q is NaN the last (each NaN replaces the pick). One
 * dot product instead of vol, lanes over K (w read coalesced). xk(k): x of (channel, tap) k at
 * position 0 (in a flat field any position's: the same value but for the sign of zero, which no
 * NaN test sees). */
template <typename Acc, typename XFn>
__device__ __forceinline__ int flat_pick(XFn xk, int K, int vol, const float *__restrict__ wc, float cb, float divisor,
                                         int lane)
{
    Acc acc = 0;
    for (int k = lane; k < K; k += 32)
        acc = fma((Acc)xk(k), (Acc)__ldg(wc + k), acc);
    for (int o = 16; o > 0; o >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    return isnan(__fdiv_rn((float)acc + cb, divisor)) ? vol - 1 : 0;
}

/* Flat fields, settled once a window for all channels (before recheck_kernel). A zero or flat
 * background ties every window it holds exactly in every channel (each position's conv value is
 * the same sum of the same products), so each of its (channel, window) pairs is flagged, and
 * recheck_kernel would stage and test the same field once a channel (half of x zero: pool 3 b16
 * TF32 0.33 -> 1.34 ms, kernel 5 b8 0.37 -> 2.16). Here a warp takes FLAT_WIN windows of one
 * sample (lane l: window l % FLAT_WIN, channels l / FLAT_WIN, + 4, ...). A window whose channels
 * are all flagged has its field tested in x once (flat_field's test: one value per channel, the
 * first 32 elements, then rounds of FLAT_LOADS elements a lane); a flat one gets flat_pick's rule
 * in every channel, position 0 or the last where q is NaN, reused from the warp's last flat
 * window where the field's values are the same. Everything else stays
 * flagged for recheck_kernel, so the all-flagged test is only a filter: it keeps the field test
 * off the windows of random data, where a few channels are near-ties. The field's elements and K
 * decompose in 32 bits (the launcher checks that they fit). */
constexpr int FLAT_WIN = 8;   /* windows a warp */
constexpr int FLAT_LOADS = 8; /* field elements a lane in flight */

struct FlatDivs {
    FastDiv chv, rw, rh, taps;
};

template <typename Code, typename Acc>
__global__ void __launch_bounds__(128, 8) flat_codes_kernel(const Shape s, const float *__restrict__ x,
                                                         const float *__restrict__ w,
                                                         const float *__restrict__ conv_bias,
                                                         Code *__restrict__ codes, uint32_t flag, const FlatDivs dv)
{
    constexpr int LPW = 32 / FLAT_WIN; /* lanes a window */
    const int lane = threadIdx.x & 31, wl = lane % FLAT_WIN, cl = lane / FLAT_WIN;
    const RecheckGeom g = recheck_geom(s);
    const int K = (int)g.K, vol = (int)imin(g.vol, INT32_MAX), field = (int)g.field;
    const int64_t npool = s.pooled_d * s.pooled_h * s.pooled_w, nwc = (npool + FLAT_WIN - 1) / FLAT_WIN;
    const int64_t nchunks = s.batch * nwc, dhw = s.in_d * s.in_h * s.in_w;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    bool have_prev = false; /* the last flat window's channel values and codes (below) */
    uint32_t prev_bits = 0u;
    int prev_code = 0;
    for (int64_t chunk = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); chunk < nchunks;
         chunk += warps) {
        const int64_t b = chunk / nwc, win0 = (chunk - b * nwc) * FLAT_WIN;
        Code *cw = codes + b * s.cout * npool + win0; /* channel c, window win0 + j: cw[c npool + j] */
        bool all = win0 + wl < npool;
        for (int64_t c = cl; c < s.cout && all; c += LPW)
            all = cw[c * npool + wl] == flag;
#pragma unroll
        for (int o = FLAT_WIN; o < 32; o <<= 1)
            all &= __shfl_xor_sync(0xffffffffu, all, o) != 0;
        for (unsigned todo = __ballot_sync(0xffffffffu, all) & ((1u << FLAT_WIN) - 1u); todo; todo &= todo - 1u) {
            const int j = __ffs(todo) - 1;
            const int64_t win = win0 + j;
            const int64_t pw = win % s.pooled_w, ph = (win / s.pooled_w) % s.pooled_h,
                          pd = win / (s.pooled_w * s.pooled_h);
            const float *xw = x + x_index(s, b, 0, pd * s.pool_d, ph * s.pool_h, pw * s.pool_w);
            /* Element e of the field (channel e / chv, then d, h, w in rd x rh x rw) and its
             * channel's first; past the field, the last element again. Branch-free, so that a
             * round's loads are all in flight before its compares (behind a branch each, the
             * eight loads went one at a time). */
            const auto load = [&](int e, float &v, float &f) {
                const uint32_t ec = (uint32_t)min(e, field - 1), ci = fdiv(ec, dv.chv), r = ec - ci * dv.chv.d;
                const uint32_t rr = fdiv(r, dv.rw), fw = r - rr * dv.rw.d, fd = fdiv(rr, dv.rh), fh = rr - fd * dv.rh.d;
                const float *xc = xw + ci * dhw;
                v = __ldg(xc + ((int64_t)fd * s.in_h + fh) * s.in_w + fw);
                f = __ldg(xc);
            };
            float v0, f0;
            load(lane, v0, f0);
            bool flat = __all_sync(0xffffffffu, v0 == f0);
            for (int e0 = 32; e0 < field && flat; e0 += 32 * FLAT_LOADS) {
                float v[FLAT_LOADS], f[FLAT_LOADS];
#pragma unroll
                for (int u = 0; u < FLAT_LOADS; ++u)
                    load(e0 + 32 * u + lane, v[u], f[u]);
                bool same = true;
#pragma unroll
                for (int u = 0; u < FLAT_LOADS; ++u)
                    same &= v[u] == f[u];
                flat = __all_sync(0xffffffffu, same);
            }
            if (!flat)
                continue;
            /* Every position's q is position 0's: flat_pick a channel, as recheck_kernel's. A
             * background repeats its values window after window, so with Cin and Cout up to 32
             * the warp keeps the last flat window's channel values (lane ci, as bits) and codes
             * (lane c) and reuses the codes where the values are the same bits: the same dot
             * products, the same q. */
            const bool cacheable = s.cin <= 32 && s.cout <= 32;
            const uint32_t vbits = lane < s.cin ? __float_as_uint(__ldg(xw + lane * dhw)) : 0u;
            if (!(cacheable && have_prev && __all_sync(0xffffffffu, vbits == prev_bits))) {
                for (int64_t c = 0; c < s.cout; ++c) {
                    const int pick = flat_pick<Acc>(
                        [&](int k) { return __ldg(xw + fdiv((uint32_t)k, dv.taps) * dhw); }, K, vol, w + c * g.K,
                        conv_bias ? conv_bias[c] : 0.0f, s.divisor, lane);
                    if (cacheable && lane == c)
                        prev_code = pick;
                    else if (!cacheable && lane == 0)
                        cw[c * npool + j] = (Code)pick;
                }
                prev_bits = vbits;
                have_prev = cacheable;
            }
            if (cacheable && lane < s.cout)
                cw[lane * npool + j] = (Code)prev_code;
        }
    }
}

/* Window index decomposition in 32 bits where the code count allows (the 64-bit divisions cost
 * ~400 instructions a window). */
struct RecheckDivs {
    FastDiv npool, cout, pw, ph;
    int use32;
};

template <typename Code, int P, typename Acc>
__global__ void __launch_bounds__(RECHECK_WARPS * 32, 4) recheck_kernel(const Shape s, const float *__restrict__ x,
                                                                     const float *__restrict__ w,
                                                                     const float *__restrict__ conv_bias,
                                                                     Code *__restrict__ codes, uint32_t flag,
                                                                     const RecheckDivs dv)
{
    extern __shared__ __align__(16) unsigned char recheck_smem_raw[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t npool = s.pooled_d * s.pooled_h * s.pooled_w, n = s.batch * s.cout * npool;
    const RecheckGeom g = recheck_geom(s);
    const int K = (int)g.K, vol = (int)imin(g.vol, INT32_MAX), field_n = (int)imin(g.field, INT32_MAX);
    float *field = reinterpret_cast<float *>(recheck_smem_raw) + warp * 2 * g.pitch; /* two slices */
    int *soff = reinterpret_cast<int *>(recheck_smem_raw) + RECHECK_WARPS * 2 * g.pitch; /* [K] in the field */
    int *foff = soff + K;         /* [field] in x, from the window's first element */
    int *poff = foff + field_n;   /* [vol] in the field */
    int64_t *goff = reinterpret_cast<int64_t *>(recheck_smem_raw); /* global path: [K] in x */
    const bool gtable = !g.staged && g.K <= RECHECK_GLOBAL_K;
    if (g.staged) {
        for (int k = threadIdx.x; k < K; k += blockDim.x)
            soff[k] = (int)box_offset(k, s.k_d, s.k_h, s.k_w, g.rd, g.rh, g.rw);
        for (int e = threadIdx.x; e < field_n; e += blockDim.x)
            foff[e] = (int)box_offset(e, g.rd, g.rh, g.rw, s.in_d, s.in_h, s.in_w);
        for (int p = threadIdx.x; p < vol; p += blockDim.x)
            poff[p] = (int)box_offset(p, s.pool_d, s.pool_h, s.pool_w, g.rd, g.rh, g.rw);
    } else if (gtable) {
        for (int64_t k = threadIdx.x; k < g.K; k += blockDim.x)
            goff[k] = box_offset(k, s.k_d, s.k_h, s.k_w, s.in_d, s.in_h, s.in_w);
    }
    __syncthreads();
    int po[P > 0 ? P : 1];
    if constexpr (P > 0) {
#pragma unroll
        for (int p = 0; p < P; ++p)
            po[p] = g.staged ? poff[p < vol ? p : 0] : 0;
    }
    struct Win {
        const float *xw, *wc;
        float cb;
    };
    auto window = [&](int64_t i) {
        int64_t b, c, pd, ph, pw;
        if (dv.use32) {
            const uint32_t i32 = (uint32_t)i, bc = fdiv(i32, dv.npool), win = i32 - bc * (uint32_t)npool;
            const uint32_t b32 = fdiv(bc, dv.cout), r = fdiv(win, dv.pw), pd32 = fdiv(r, dv.ph);
            b = b32, c = bc - b32 * (uint32_t)s.cout;
            pw = win - r * (uint32_t)s.pooled_w, ph = r - pd32 * (uint32_t)s.pooled_h, pd = pd32;
        } else {
            const int64_t bc = i / npool, win = i - bc * npool;
            b = bc / s.cout, c = bc - b * s.cout;
            pw = win % s.pooled_w, ph = (win / s.pooled_w) % s.pooled_h, pd = win / (s.pooled_w * s.pooled_h);
        }
        Win wv;
        wv.cb = conv_bias ? conv_bias[c] : 0.0f;
        wv.wc = w + c * g.K;
        wv.xw = x + x_index(s, b, 0, pd * s.pool_d, ph * s.pool_h, pw * s.pool_w);
        return wv;
    };
    /* The warp's flagged windows in order: it reads RECHECK_SCAN chunks of 32 codes at once
     * (loads in flight together; each code read before any of them is rewritten), a ballot a
     * chunk, then the set bits. Every lane runs it. */
    const int64_t stride = (int64_t)gridDim.x * RECHECK_WARPS * 32 * RECHECK_SCAN;
    int64_t base = (blockIdx.x * (int64_t)RECHECK_WARPS + warp) * 32 * RECHECK_SCAN;
    unsigned masks[RECHECK_SCAN];
    int next_chunk = RECHECK_SCAN;
    int64_t chunk = 0;
    unsigned todo = 0;
    bool started = false;
    auto next_flagged = [&]() -> int64_t {
        for (;;) {
            if (todo) {
                const int j = __ffs(todo) - 1;
                todo &= todo - 1u;
                return chunk + j;
            }
            if (next_chunk < RECHECK_SCAN) {
                todo = masks[next_chunk];
                chunk = base + 32 * next_chunk++;
                continue;
            }
            if (started)
                base += stride;
            started = true;
            if (base >= n)
                return -1;
            uint32_t v[RECHECK_SCAN];
#pragma unroll
            for (int u = 0; u < RECHECK_SCAN; ++u) {
                const int64_t mine = base + 32 * u + lane;
                v[u] = mine < n ? (uint32_t)codes[mine] : 0u; /* flag is never 0 */
            }
#pragma unroll
            for (int u = 0; u < RECHECK_SCAN; ++u)
                masks[u] = __ballot_sync(0xffffffffu, v[u] == flag);
            next_chunk = 0;
        }
    };
    if (g.staged) {
        const int chv = (int)(g.rd * g.rh * g.rw); /* field elements a channel */
        /* Two slices a warp: the next flagged window's field is copied (cp.async, no registers)
         * while this one's conv values are summed, so the copy's latency hides behind them. */
        auto stage = [&](float *dst, const float *xw) {
            for (int e = lane; e < field_n; e += 32)
                cp_async4(dst + e, xw + foff[e]);
            cp_async_commit();
        };
        int64_t cur = next_flagged();
        Win wcur = {};
        if (cur >= 0) {
            wcur = window(cur);
            stage(field, wcur.xw);
        }
        int sel = 0;
        while (cur >= 0) {
            const int64_t nxt = next_flagged();
            Win wnxt = {};
            if (nxt >= 0) {
                wnxt = window(nxt);
                stage(field + (sel ^ 1) * g.pitch, wnxt.xw);
                cp_async_wait_group<1>();
            } else {
                cp_async_wait_all();
            }
            __syncwarp();
            const float *fcur = field + sel * g.pitch;
            int code;
            if (flat_field(fcur, (int)s.cin, chv, lane))
                code = flat_pick<Acc>([&](int k) { return fcur[soff[k] + poff[0]]; }, K, vol, wcur.wc, wcur.cb,
                                      s.divisor, lane);
            else if constexpr (P > 0)
                code = recheck_pick_wide<Acc, P>(fcur, soff, po, K, vol, wcur.wc, wcur.cb, s.divisor, lane);
            else
                code = recheck_pick<Acc>(fcur, K, vol, wcur.wc, wcur.cb, s.divisor, lane,
                                    [=](int pos) { return poff[pos]; }, [=](int k) { return soff[k]; });
            if (lane == 0)
                codes[cur] = (Code)code;
            __syncwarp(); /* this slice is read before the copy after next overwrites it */
            cur = nxt;
            wcur = wnxt;
            sel ^= 1;
        }
        return;
    }
    for (int64_t i = next_flagged(); i >= 0; i = next_flagged()) {
        const Win wv = window(i);
        const int code = recheck_pick<Acc>(
            wv.xw, (int)imin(g.K, INT32_MAX), vol, wv.wc, wv.cb, s.divisor, lane,
            [=](int pos) { return box_offset(pos, s.pool_d, s.pool_h, s.pool_w, s.in_d, s.in_h, s.in_w); },
            [=](int k) { return gtable ? goff[k] : box_offset(k, s.k_d, s.k_h, s.k_w, s.in_d, s.in_h, s.in_w); });
        if (lane == 0)
            codes[i] = (Code)code;
    }
}

/* ================================== launcher ================================== */

namespace {

int64_t elem_bytes(convpool_dtype dt) { return dt == CONVPOOL_DTYPE_F32 ? 4 : 2; }

/* Elements per staged channel (all slots), bank-skewed as tile.cuh's chan_pitch: rounded up to
 * 128 bytes plus 32, so lanes (g, t) reading channel t at column g hit 32 distinct banks. */
int64_t general_pitch(int64_t slot_elems, int64_t esize)
{
    return (slot_elems * esize + 127) / 128 * (128 / esize) + 32 / esize;
}

/* The staged row pitch: ROW, or for wider kernels the shift (up to 7), the sub-tile and the
 * halo rounded up to 16-byte chunks of 16-bit x. */
int64_t general_row(int64_t kernel_w)
{
    return kernel_w <= gen::ROW_MAX_KW ? gen::ROW : (gen::SUB_W + kernel_w - 1 + 7 + 7) / 8 * 8;
}

int64_t general_x_bytes(int64_t kernel_h, int64_t kernel_w, int64_t esize)
{
    const int64_t plane = (gen::SUB_H + kernel_h - 1) * general_row(kernel_w);
    return gen::CIN * general_pitch(gen::SLOTS * plane, esize) * esize;
}

int64_t general_smem(int64_t kernel_h, int64_t kernel_w, int64_t esize, int64_t nwin)
{
    return general_x_bytes(kernel_h, kernel_w, esize) + (int64_t)(gen::COUT * gen::CONV_PITCH + 2 * gen::COUT * nwin) * 4 +
           gen::COUT * (int64_t)sizeof(ChanMode);
}

/* The CODES instance's extra shared memory: a pick (q, position) and the runner-up's q per
 * (channel, window), a near-tie bound per channel. */
int64_t general_codes_smem(int64_t nwin) { return 3 * gen::COUT * nwin * 4 + gen::COUT * 4; }

/* The window counts worth trying along one axis: for each count of sub-tiles (extent `sub`) the
 * item's conv extent needs, the most windows (<= cap) with that count. Fewer windows at the
 * same sub-tile count would only add items, never shorten one. Returns how many it wrote. */
int window_candidates(int64_t pool, int64_t pooled, int64_t sub, int64_t cap, int64_t *out, int n_max)
{
    const int64_t top = imin(cap, pooled);
    int n = 0;
    for (int64_t w = 1; w <= top && n < n_max; ++w)
        if (w == top || ceil_div((w + 1) * pool, sub) > ceil_div(w * pool, sub))
            out[n++] = w;
    return n;
}

/* Items one block runs at a time on an SM: shared memory allows (227 KB + 1 KB reserved per
 * block) / (smem + 1 KB); registers (128 threads) allow about GEN_MAX_BLOCKS. */
constexpr int64_t GEN_MAX_BLOCKS = 4;

/* The item tile. Each candidate (windows along h and w, pooled d-rows per item) is costed as
 * waves x units: a unit is one barrier-separated step of the ring (one staged input plane of 8
 * channels and its MMAs), an item runs pd_chunk * pool_d * n_sh * n_sw * n_cig * kd of them in
 * order, and waves = ceil(items / (SMs x resident blocks)). Small problems get small items
 * that fill the GPU (pool 3 at batch 2 had 80 items, 27 units each, on 132 SMs under the older
 * rule, which split only pooled d); large ones, where waves x units tends to all units / slots,
 * keep the windows that waste the least of their sub-tiles. Ties go to fewer items (fewer
 * partial sums and less halo staged). */
GeneralTile general_tile(const convpool_problem &p, convpool_dtype dt, const DeviceInfo &dev)
{
    int64_t whs[gen::MAX_WH], wws[gen::MAX_WW];
    const int nwh = window_candidates(p.pool_h, p.pooled_h, gen::SUB_H, gen::MAX_WH, whs, gen::MAX_WH);
    const int nww = window_candidates(p.pool_w, p.pooled_w, gen::SUB_W, gen::MAX_WW, wws, gen::MAX_WW);
    const int64_t cog = ceil_div(p.out_channels, gen::COUT), cig = ceil_div(p.in_channels, gen::CIN);
    const int64_t esize = elem_bytes(dt);
    GeneralTile best = {};
    double best_cost = -1.0, best_items = 0.0;
    for (int i = 0; i < nwh; ++i) {
        for (int j = 0; j < nww; ++j) {
            const int64_t wh = whs[i], ww = wws[j];
            if (wh * ww > gen::MAX_WIN)
                continue;
            const int64_t smem = general_smem(p.kernel_h, p.kernel_w, esize, wh * ww);
            const int64_t blocks = imax(1, imin(GEN_MAX_BLOCKS, ((int64_t)dev.smem_optin + 1024) / (smem + 1024)));
            const double slots = (double)imax(1, dev.sms) * (double)blocks;
            const int64_t n_sh = ceil_div(wh * p.pool_h, gen::SUB_H), n_sw = ceil_div(ww * p.pool_w, gen::SUB_W);
            const int64_t n_th = ceil_div(p.pooled_h, wh), n_tw = ceil_div(p.pooled_w, ww);
            const double plane_items = (double)cog * (double)p.batch * (double)n_th * (double)n_tw;
            /* pooled d-rows per item: all of them, then halved (at most 12 tries) */
            int64_t pdc = p.pooled_d;
            for (int tries = 0; tries < 12; ++tries) {
                const double items = plane_items * (double)ceil_div(p.pooled_d, pdc);
                const double units = (double)(pdc * p.pool_d * n_sh * n_sw * cig * p.kernel_d);
                const double cost = ceil(items / slots) * units;
                if (best_cost < 0.0 || cost < best_cost * (1.0 - 1e-12) ||
                    (cost <= best_cost * (1.0 + 1e-12) && items < best_items)) {
                    best_cost = cost;
                    best_items = items;
                    best.wh = wh;
                    best.ww = ww;
                    best.pd_chunk = pdc;
                    best.smem = smem;
                }
                if (pdc == 1)
                    break;
                pdc = ceil_div(pdc, 2);
            }
        }
    }
    GeneralTile &t = best;
    t.n_sh = ceil_div(t.wh * p.pool_h, gen::SUB_H);
    t.n_sw = ceil_div(t.ww * p.pool_w, gen::SUB_W);
    t.n_th = ceil_div(p.pooled_h, t.wh);
    t.n_tw = ceil_div(p.pooled_w, t.ww);
    t.n_pdc = ceil_div(p.pooled_d, t.pd_chunk);
    t.row = general_row(p.kernel_w);
    return t;
}

} // namespace

bool general_can_implement(const convpool_problem &p, convpool_dtype dt, const DeviceInfo &dev, char *why, size_t n)
{
    /* Indices inside an item are 32-bit. */
    const int64_t lim = (int64_t)1 << 30;
    if (p.kernel_h > 4096 || p.kernel_d > 4096 || p.kernel_w > 4096 || p.in_d >= lim || p.in_h >= lim || p.in_w >= lim ||
        p.in_channels >= lim || p.out_channels >= lim)
        return snprintf(why, n, "an extent or channel count is 2^30 or more"), false;
    const int64_t smem = general_smem(p.kernel_h, p.kernel_w, elem_bytes(dt), gen::MAX_WIN);
    if (smem > dev.smem_optin)
        return snprintf(why, n, "a staged plane needs %lld B of shared memory, the GPU has %d", (long long)smem,
                        dev.smem_optin),
               false;
    return true;
}

bool general_codes_fit(const GeneralTile &t, const DeviceInfo &dev)
{
    return t.smem + general_codes_smem(t.wh * t.ww) <= dev.smem_optin;
}

Workspace general_workspace(const convpool_problem &p, bool strict, convpool_dtype dt, const DeviceInfo &dev)
{
    Workspace ws = {};
    ws.tile = general_tile(p, dt, dev);
    ws.parts = ws.tile.n_pdc * ws.tile.n_th * ws.tile.n_tw;
    ws.scratch_bytes = packed_weight_bytes(p, strict) + 16; /* + the training forward's max|x| */
    return ws;
}

/* Internal linkage on purpose: a function-local static of a template with external linkage
 * (the blocks_per_sm cache below) is an STB_GNU_UNIQUE symbol, which the dynamic linker shares
 * between two loaded copies of this code (two PyTorch extensions, RTLD_LOCAL or not); the second
 * copy then skipped raising its own kernel's shared-memory limit and its first launch failed. */
namespace {
template <typename T, bool STRICT, int KH, int KW, bool CODES = false>
convpool_status general_instance(const GenParams &P, int64_t smem, const T *x, const uint4 *wp, const Call &c)
{
    /* The shared-memory limit is raised to the device's once; the occupancy at this tile's
     * shared memory is remembered for the last size asked. */
    static std::atomic<int> blocks[MAX_DEVICES];
    static std::atomic<int64_t> at_smem[MAX_DEVICES];
    int per_sm = 0;
    CP_TRY(blocks_per_sm(general_kernel<T, STRICT, KH, KW, CODES>, gen::THREADS, c.dev.smem_optin, blocks, &per_sm));
    CP_TRY(blocks_per_sm_at(general_kernel<T, STRICT, KH, KW, CODES>, gen::THREADS, smem, at_smem, &per_sm));
    if (per_sm < 1)
        return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "general kernel does not fit on this GPU (%lld B of shared memory)",
                             (long long)smem);
    const int64_t grid = imin(P.n_items, (int64_t)c.dev.sms * per_sm);
    general_kernel<T, STRICT, KH, KW, CODES><<<(unsigned)grid, gen::THREADS, smem, c.stream>>>(
        P, x, wp, c.conv_bias, c.partials, c.codes, c.code_bytes);
    CP_CUDA_TRY_LAUNCH("general_kernel");
    return CONVPOOL_OK;
}

/* recheck_kernel over the codes (see it): the shared-memory limit raised once per device to the
 * staged layout's largest, then the problem's own size. */
template <typename Code, int P, typename Acc>
convpool_status launch_recheck_p(const Shape &s, const RecheckGeom &g, const float *x, const Call &c, Code *codes,
                                 uint32_t flag, unsigned grid, const RecheckDivs &dv)
{
    static std::atomic<int> blocks[MAX_DEVICES];
    static std::atomic<int64_t> at_smem[MAX_DEVICES];
    int per_sm = 0;
    CP_TRY(blocks_per_sm(recheck_kernel<Code, P, Acc>, RECHECK_WARPS * 32, (int)RECHECK_SMEM_MAX, blocks, &per_sm));
    CP_TRY(blocks_per_sm_at(recheck_kernel<Code, P, Acc>, RECHECK_WARPS * 32, (int64_t)recheck_smem(g), at_smem,
                            &per_sm));
    /* One wave: each block builds its offset tables once. */
    grid = (unsigned)imax(1, imin((int64_t)grid, (int64_t)c.dev.sms * imax(1, per_sm)));
    recheck_kernel<Code, P, Acc><<<grid, RECHECK_WARPS * 32, recheck_smem(g), c.stream>>>(s, x, c.w, c.conv_bias,
                                                                                         codes, flag, dv);
    CP_CUDA_TRY_LAUNCH("recheck_kernel");
    return CONVPOOL_OK;
}

/* The staged windows of up to 32 positions take recheck_pick_wide with P accumulators (the
 * volume rounded up to 8, 16 or 32); larger windows and the global path recheck_pick. */
template <typename Code, typename Acc>
convpool_status launch_recheck(const Shape &s, const float *x, const Call &c, Code *codes, uint32_t flag, unsigned grid)
{
    const RecheckGeom g = recheck_geom(s);
    const int64_t npool = s.pooled_d * s.pooled_h * s.pooled_w;
    RecheckDivs dv = {};
    dv.use32 = s.batch * s.cout * npool < (int64_t)INT32_MAX ? 1 : 0;
    if (dv.use32) {
        dv.npool = make_fastdiv((uint32_t)npool);
        dv.cout = make_fastdiv((uint32_t)s.cout);
        dv.pw = make_fastdiv((uint32_t)s.pooled_w);
        dv.ph = make_fastdiv((uint32_t)s.pooled_h);
    }
    if (g.staged && g.vol <= 8)
        return launch_recheck_p<Code, 8, Acc>(s, g, x, c, codes, flag, grid, dv);
    if (g.staged && g.vol <= 16)
        return launch_recheck_p<Code, 16, Acc>(s, g, x, c, codes, flag, grid, dv);
    if (g.staged && g.vol <= 32)
        return launch_recheck_p<Code, 32, Acc>(s, g, x, c, codes, flag, grid, dv);
    return launch_recheck_p<Code, 0, Acc>(s, g, x, c, codes, flag, grid, dv);
}

/* flat_codes_kernel over the codes (see it), where the field's elements and K decompose in 32 bits;
 * elsewhere recheck_kernel settles every flagged window. A warp a chunk of FLAT_WIN windows. */
template <typename Code, typename Acc>
convpool_status launch_flat(const Shape &s, const float *x, const Call &c, Code *codes, uint32_t flag)
{
    const RecheckGeom g = recheck_geom(s);
    if (g.field >= INT32_MAX || g.K >= INT32_MAX)
        return CONVPOOL_OK;
    FlatDivs dv;
    dv.chv = make_fastdiv((uint32_t)(g.rd * g.rh * g.rw));
    dv.rw = make_fastdiv((uint32_t)g.rw);
    dv.rh = make_fastdiv((uint32_t)g.rh);
    dv.taps = make_fastdiv((uint32_t)g.taps);
    const int64_t npool = s.pooled_d * s.pooled_h * s.pooled_w, chunks = s.batch * ceil_div(npool, FLAT_WIN);
    const unsigned grid = (unsigned)imax(1, imin(ceil_div(chunks, 4), (int64_t)c.dev.sms * 16));
    flat_codes_kernel<Code, Acc><<<grid, 128, 0, c.stream>>>(s, x, c.w, c.conv_bias, codes, flag, dv);
    CP_CUDA_TRY_LAUNCH("flat_codes_kernel");
    return CONVPOOL_OK;
}

template <typename Code, typename Acc>
convpool_status recheck_codes_as(const Call &c, Code *codes, uint32_t flag, unsigned grid, bool flat_first)
{
    const float *x = static_cast<const float *>(c.x);
    if (flat_first)
        CP_TRY((launch_flat<Code, Acc>(c.s, x, c, codes, flag)));
    return launch_recheck<Code, Acc>(c.s, x, c, codes, flag, grid);
}

template <typename Acc> convpool_status recheck_codes_acc(const Call &c, uint32_t flag, unsigned grid, bool flat_first)
{
    if (c.code_bytes == 1)
        return recheck_codes_as<uint8_t, Acc>(c, c.codes, flag, grid, flat_first);
    if (c.code_bytes == 2)
        return recheck_codes_as<uint16_t, Acc>(c, reinterpret_cast<uint16_t *>(c.codes), flag, grid, flat_first);
    return recheck_codes_as<uint32_t, Acc>(c, reinterpret_cast<uint32_t *>(c.codes), flag, grid, flat_first);
}
} // namespace

convpool_status near_tie_xmax(const Call &c, unsigned *xmax)
{
    /* CONVPOOL_TEST_RECHECK_ALL=1 (tests only): a NaN max|x| makes every bound NaN, so every
     * window is a near-tie and the recheck writes every code. */
    const char *all = getenv("CONVPOOL_TEST_RECHECK_ALL");
    if (all && all[0] == '1') {
        CP_CUDA_TRY(cudaMemsetAsync(xmax, 0xff, sizeof(unsigned), c.stream));
        return CONVPOOL_OK;
    }
    const int64_t n = c.s.batch * c.s.cin * c.s.in_d * c.s.in_h * c.s.in_w;
    CP_CUDA_TRY(cudaMemsetAsync(xmax, 0, sizeof(unsigned), c.stream));
    absmax_kernel<<<(unsigned)imax(1, imin(ceil_div(n, 256 * 8), (int64_t)c.dev.sms * 8)), 256, 0, c.stream>>>(
        static_cast<const float *>(c.x), n, xmax);
    CP_CUDA_TRY_LAUNCH("absmax_kernel");
    return CONVPOOL_OK;
}

convpool_status recheck_codes(const Call &c, uint32_t flag, bool flat_first)
{
    const Shape &s = c.s;
    const int64_t ncodes = s.batch * s.cout * s.pooled_d * s.pooled_h * s.pooled_w;
    /* A warp a RECHECK_SCAN-chunk run of codes; launch_recheck_p caps it at one wave. */
    const unsigned grid = (unsigned)imax(1, imin(ceil_div(ncodes, RECHECK_WARPS * 32 * RECHECK_SCAN), INT32_MAX));
    return c.strict ? recheck_codes_acc<double>(c, flag, grid, flat_first)
                    : recheck_codes_acc<float>(c, flag, grid, flat_first);
}

template <typename T, bool STRICT> convpool_status general_launch(const Plan &plan, const Call &c)
{
    const GeneralTile &t = plan.ws.tile;
    const Shape &s = c.s;
    const T *x = static_cast<const T *>(c.x);
    if (t.n_th * t.n_tw * t.n_pdc != plan.ws.parts || (uintptr_t)c.scratch % 16 != 0)
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "internal: general got a plan for another shape");

    GenParams P;
    P.s = s;
    P.wh = t.wh;
    P.ww = t.ww;
    P.n_sh = t.n_sh;
    P.n_sw = t.n_sw;
    P.n_th = t.n_th;
    P.n_tw = t.n_tw;
    P.pd_chunk = t.pd_chunk;
    P.n_pdc = t.n_pdc;
    P.n_cog = ceil_div(s.cout, gen::COUT);
    P.n_cig = ceil_div(s.cin, gen::CIN);
    P.n_items = P.n_cog * s.batch * t.n_th * t.n_tw * t.n_pdc;
    P.nparts = plan.ws.parts;
    P.kd = (int)s.k_d;
    P.kh = (int)s.k_h;
    P.kw = (int)s.k_w;
    P.taps = P.kd * P.kh * P.kw;
    P.in_h = gen::SUB_H + P.kh - 1;
    P.row = (int)t.row;
    P.plane = P.in_h * P.row;
    P.pitch = (int)general_pitch((int64_t)gen::SLOTS * P.plane, (int64_t)sizeof(T));
    P.nchunk = (int)ceil_div(gen::SUB_W + P.kw - 1 + 16 / (int64_t)sizeof(T) - 1, 16 / (int64_t)sizeof(T));
    P.aligned = rows_aligned(s, x) ? 1 : 0;
    P.x_bytes = (int)general_x_bytes(s.k_h, s.k_w, (int64_t)sizeof(T));
    P.nsets = 2 * P.in_h * P.nchunk <= gen::THREADS ? 2 : 1;
    P.div_nchunk = make_fastdiv((uint32_t)P.nchunk);
    P.div_nwin = make_fastdiv((uint32_t)(t.wh * t.ww));
    const int64_t vol = s.pool_d * s.pool_h * s.pool_w;
    P.flag = c.code_bytes >= 4 ? 0xffffffffu : (1u << (8 * c.code_bytes)) - 1u;
    P.recheck = c.codes && vol <= (int64_t)P.flag ? 1 : 0;
    P.wraw = c.w;
    /* max|x| sits in the last 16 bytes of the scratch, which general_workspace adds after the
     * packed weights. */
    unsigned *xmax = reinterpret_cast<unsigned *>(c.scratch + plan.ws.scratch_bytes - 16);
    P.xmax = xmax;

    CP_TRY(pack_weights(s, STRICT, c.w, c.scratch, c.dev, c.stream));
    const int64_t smem = t.smem; /* the plan sized it for this tile and dtype */
    const uint4 *wp = reinterpret_cast<const uint4 *>(c.scratch);
    const int64_t kh = s.k_h, kw = s.k_w;
    if constexpr (std::is_same<T, float>::value) {
        if (c.codes) {
            /* The training forward: the inference tile (general_codes_fit checked the shared
             * memory); compile-time taps for the TF32 3x3, 5x5 and 7x7 only (with runtime taps
             * kernel 1x7x7's codes took 2.9x its inference forward, H200). Near-ties: max|x|
             * first, the flagged windows after (see CODES above). */
            const int64_t smem_c = smem + general_codes_smem(t.wh * t.ww);
            if (P.recheck)
                CP_TRY(near_tie_xmax(c, xmax));
            convpool_status st = CONVPOOL_OK;
            if constexpr (!STRICT) {
                if (kh == kw && kh == 3)
                    st = general_instance<T, STRICT, 3, 3, true>(P, smem_c, x, wp, c);
                else if (kh == kw && kh == 5)
                    st = general_instance<T, STRICT, 5, 5, true>(P, smem_c, x, wp, c);
                else if (kh == kw && kh == 7)
                    st = general_instance<T, STRICT, 7, 7, true>(P, smem_c, x, wp, c);
                else
                    st = general_instance<T, STRICT, 0, 0, true>(P, smem_c, x, wp, c);
            } else {
                st = general_instance<T, STRICT, 0, 0, true>(P, smem_c, x, wp, c);
            }
            if (st != CONVPOOL_OK || !P.recheck || c.defer_settle)
                return st;
            return recheck_codes(c, P.flag, true);
        }
    }
    /* Compile-time tap extents for the common square (kh, kw); STRICT is 3x the MMAs and gains
     * less from the unrolled loads, so only 3x3 has its own variant there. */
    if (kh == kw && kh == 3)
        return general_instance<T, STRICT, 3, 3>(P, smem, x, wp, c);
    if constexpr (!STRICT) {
        if (kh == kw && kh == 1)
            return general_instance<T, STRICT, 1, 1>(P, smem, x, wp, c);
        if (kh == kw && kh == 5)
            return general_instance<T, STRICT, 5, 5>(P, smem, x, wp, c);
        if (kh == kw && kh == 7)
            return general_instance<T, STRICT, 7, 7>(P, smem, x, wp, c);
    }
    return general_instance<T, STRICT, 0, 0>(P, smem, x, wp, c);
}

convpool_status general_run(const Plan &plan, const Call &c)
{
    switch (c.dtype) {
    case CONVPOOL_DTYPE_F32:
        return c.strict ? general_launch<float, true>(plan, c) : general_launch<float, false>(plan, c);
    case CONVPOOL_DTYPE_F16:
        return c.strict ? general_launch<__half, true>(plan, c) : general_launch<__half, false>(plan, c);
    case CONVPOOL_DTYPE_BF16:
        return c.strict ? general_launch<__nv_bfloat16, true>(plan, c)
                        : general_launch<__nv_bfloat16, false>(plan, c);
    }
    return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "internal: general got dtype %d", (int)c.dtype);
}

} // namespace convpool_cuda
