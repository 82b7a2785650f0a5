/*
 * backward: the block's gradients from the arg-max codes of a training forward (finish.cu,
 * pool_train_kernel), never materialising the conv output or its gradient.
 *
 * With G[b][c] = grad_pooled[b][c] + grad_out[b] and N pooled windows, autograd hands every
 * window's arg-max conv position q* the gradient S[b][c] = (G / N) / divisor and every other
 * conv position 0. Then, for finite x and weights and a finite nonzero divisor (the caller's
 * check: otherwise 0 * inf terms of the dense backward make NaNs this sparse form omits):
 *   grad_weight[c][ci][t] = sum_b S[b][c] * sum_windows x[b][ci][q* + t]
 *   grad_x[b][ci][p]      = sum_c S[b][c] * sum_{windows with p - q* a tap t} w[c][ci][t]
 *   grad_conv_bias[c]     = sum_b N * S[b][c]
 * The kernels, in backward_launch's order: nonfinite_kernel (inf/NaN in x or w, a device flag);
 * grad_weight on the tensor cores (weight_sm90_kernel on an H100/H200 for the k3p2 shapes in
 * TF32: wgmma with the one-hot masks as A; else weight_mma_kernel: a GEMM per sample against the
 * one-hot arg-max; both write partials per share of the sample) or an FP32 gather (weight_tile_kernel, else
 * weight_partial_kernel: where the tensor cores cannot, or behind the flag); weight_reduce_kernel
 * (the partials in a fixed order, in double, with grad_conv_bias); grad_x on the tensor cores
 * (grad_x_sm90_kernel on an H100/H200 for the k3p2 shapes, S w rounded once to 11 bits in TF32
 * mode; grad_x_fold_kernel for kernel heights 2 to 5, else grad_x_mma_kernel: a conv of the
 * sparse gradient with the flipped weights, FP32-accurate) or an FP32 gather (grad_x_tile_kernel, else
 * grad_x_kernel); then the fix-ups that add the dense formula's 0 * inf terms. No atomics on
 * the outputs: the results are bit-identical run to run.
 *
 * Used by the PyTorch binding's training path for every shape the CUDA forward serves.
 */
#include "kernels.h"
#include "wgmma.cuh"

#include <algorithm>
#include <type_traits>

namespace convpool_cuda {

constexpr int BW_THREADS = 256;
constexpr int BW_WINDOWS = 256; /* windows decoded per pass of weight_partial_kernel */
constexpr int GX_THREADS = 128;
constexpr int GX_CI = 16; /* input channels a grad_x thread accumulates at once */

/* What the kernels need, with the divisions by pool and pooled extents made multiply-highs:
 * every coordinate inside one sample and channel is below 2^31 (convpool_backward_cuda checks),
 * so the per-window work is 32-bit. */
struct BwParams {
    Shape s;
    int in_d, in_h, in_w, kd, kh, kw, pd, ph, pw, pooled_d, pooled_h, pooled_w;
    int hw, dhw, taps, npool;
    float windows;
    FastDiv f_pw, f_phpw, f_pooled_w, f_pooled_hw, f_in_w, f_hw;
    int64_t go_stride; /* grad_out[b * go_stride] (BackwardCall's) */
};

/* S[b][c] as autograd forms it, in float: (G / N) / divisor. */
__device__ __forceinline__ float grad_scale(const BwParams &P, const float *gp, const float *go, int64_t b, int64_t c)
{
    const float g = (gp ? gp[b * P.s.cout + c] : 0.0f) + (go ? go[b * P.go_stride] : 0.0f);
    return (g / P.windows) / P.s.divisor;
}

/* A code (raster position inside its window) as (od, oh, ow). */
__device__ __forceinline__ void decode(const BwParams &P, uint32_t code, int &od, int &oh, int &ow)
{
    od = (int)fdiv(code, P.f_phpw);
    const uint32_t r = code - (uint32_t)od * P.f_phpw.d;
    oh = (int)fdiv(r, P.f_pw);
    ow = (int)(r - (uint32_t)oh * P.f_pw.d);
}

/* A block index as (sample, tile along d, h, w) over n_td x n_th x n_tw tiles a sample, w
 * fastest: the grid order of both tiled grad_x kernels. */
struct TileIdx {
    int64_t b;
    int td, th, tw;
};

__device__ __forceinline__ TileIdx tile_of(int64_t blk, int64_t n_td, int64_t n_th, int64_t n_tw)
{
    TileIdx t;
    t.tw = (int)(blk % n_tw);
    blk /= n_tw;
    t.th = (int)(blk % n_th);
    blk /= n_th;
    t.td = (int)(blk % n_td);
    t.b = blk / n_td;
    return t;
}

/* The windows whose arg-max may fall in a grad_x tile's conv region: along each axis the region
 * runs from o0 = x0 - k + 1 to the tile's last x position x0 + n - 1 (clipped to the conv
 * positions that pooling covers), which meets pooled windows [lo, lo + count). */
struct RegionWindows {
    int pd_lo, ph_lo, pw_lo, nwd, nwh, nww;
};

__device__ __forceinline__ RegionWindows region_windows(const BwParams &P, int od0, int oh0, int ow0, int xd_last,
                                                        int xh_last, int xw_last)
{
    RegionWindows r;
    r.pd_lo = max(od0, 0) / P.pd, r.ph_lo = max(oh0, 0) / P.ph, r.pw_lo = max(ow0, 0) / P.pw;
    const int pd_hi = min(xd_last, P.pooled_d * P.pd - 1) / P.pd;
    const int ph_hi = min(xh_last, P.pooled_h * P.ph - 1) / P.ph;
    const int pw_hi = min(xw_last, P.pooled_w * P.pw - 1) / P.pw;
    r.nwd = max(0, pd_hi - r.pd_lo + 1), r.nwh = max(0, ph_hi - r.ph_lo + 1), r.nww = max(0, pw_hi - r.pw_lo + 1);
    return r;
}

/* For each window of R in each of ncc channels, its arg-max as an offset (rd, rh, rw) from the
 * region's origin (od0, oh0, ow0): put(cl, rd, rh, rw), which checks the offset against its own
 * extents. code_of(cl, win) reads the code of window win (raster index in the sample's pooled
 * grid) of chunk channel cl. A thread takes a task: a window and a slice of a block of MAXC
 * channels (channels sl, sl + nsl, ... of the block); it decodes the window's place once and
 * loads the slice's codes together, so a thread waits about one memory round trip a task
 * instead of one a (channel, window). Slices keep the THREADS threads busy when the region
 * holds few windows. */
template <int THREADS, int MAXC, typename CodeOf, typename Put>
__device__ __forceinline__ void for_each_argmax(const BwParams &P, const RegionWindows &R, int ncc, int od0, int oh0,
                                                int ow0, CodeOf code_of, Put put)
{
    const int nwin = R.nwd * R.nwh * R.nww;
    if (nwin == 0 || ncc <= 0)
        return;
    const int ncb = (ncc + MAXC - 1) / MAXC, nsl = max(1, min(MAXC, THREADS / (nwin * ncb)));
    for (int task = threadIdx.x; task < nwin * ncb * nsl; task += THREADS) {
        const int q = task / nwin, wi = task - q * nwin, cb = q / nsl, sl = q - cb * nsl;
        const int whd = wi / R.nww, ww = wi - whd * R.nww, wd = whd / R.nwh, wh = whd - wd * R.nwh;
        const int pd = R.pd_lo + wd, ph = R.ph_lo + wh, pw = R.pw_lo + ww;
        const int win = (pd * P.pooled_h + ph) * P.pooled_w + pw;
        uint32_t code[MAXC];
#pragma unroll
        for (int k = 0; k < MAXC; ++k) {
            const int j = sl + k * nsl, cl = cb * MAXC + j;
            code[k] = j < MAXC && cl < ncc ? code_of(cl, win) : 0u;
        }
#pragma unroll
        for (int k = 0; k < MAXC; ++k) {
            const int j = sl + k * nsl, cl = cb * MAXC + j;
            if (j >= MAXC || cl >= ncc)
                break;
            int od, oh, ow;
            decode(P, code[k], od, oh, ow);
            put(cl, pd * P.pd + od - od0, ph * P.ph + oh - oh0, pw * P.pw + ow - ow0);
        }
    }
}

/* Inputs holding an inf or NaN, found on the device (nonfinite_kernel) so the backward never
 * synchronises the host: NF_X, x (checked when grad_weight is asked), NF_W, the weights (when
 * grad_x is). Where a bit is set, the tensor-core kernel of that gradient exits and its FP32
 * gather runs (a Gate each), and a fix-up kernel adds the dense formula's 0 * inf terms. */
constexpr unsigned NF_X = 1u, NF_W = 2u;
/* weight_sm90's float16 instance met x it cannot hold (a block's largest |x| past float16's range,
 * or under 2^-9, where float16 subnormals would lose bits): the TF32 instance, gated on this
 * bit, computes grad_weight's partial sums again. */
constexpr unsigned NF_RANGE = 4u;
/* The workspace's head (all that grad_x alone needs); the weight partials follow. */
constexpr size_t FLAGS_BYTES = CONVPOOL_BACKWARD_X_WORKSPACE_BYTES;
static_assert(FLAGS_BYTES >= sizeof(unsigned) && FLAGS_BYTES % 16 == 0, "the flags, then aligned partials");

/* A kernel with a gate runs only when (flags & bit) != 0 equals when_set; without one
 * (flags null) it always runs. */
struct Gate {
    const unsigned *flags;
    unsigned bit;
    bool when_set;
};

__device__ __forceinline__ bool gate_closed(const Gate &g)
{
    return g.flags && (((*g.flags & g.bit) != 0u) != g.when_set);
}

/* The flags without their memset, where weight_sm90's float16 instance is their only writer (x
 * scanned by it, no grad_x in the call): each of its blocks stores words[block] (NF_X, NF_RANGE
 * or 0, every block one, so nothing needs zeroing), and the TF32 instance behind it ORs the n
 * words, stores the flags word (block 0) that the kernels after it read, zeroes the NaN marks
 * (mark_bytes of them, a slice a block) and runs only where NF_RANGE is among them. words NULL:
 * the flags as before (memset, then atomicOr). */
struct FlagWords {
    unsigned *words;
    int n;
    unsigned *flags;
    uint8_t *marks;
    int64_t mark_bytes;
};

/* Block (b, c): partial[b][c][ci * taps + t] = S[b][c] * sum over windows of x[b][ci][q* + t]. */
template <typename Code>
__global__ void __launch_bounds__(BW_THREADS)
weight_partial_kernel(const BwParams P, const float *__restrict__ x, const void *__restrict__ codes,
                      const float *__restrict__ gp, const float *__restrict__ go, float *__restrict__ partial,
                      const Gate gate)
{
    __shared__ int off_s[BW_WINDOWS];
    if (gate_closed(gate))
        return;
    const Shape &s = P.s;
    const int64_t K = s.cin * (int64_t)P.taps;
    for (int64_t bc = blockIdx.x; bc < s.batch * s.cout; bc += gridDim.x) {
        const int64_t b = bc / s.cout, c = bc - b * s.cout;
        const float scale = grad_scale(P, gp, go, b, c);
        const Code *cd = static_cast<const Code *>(codes) + bc * P.npool;
        const float *xb = x + b * s.cin * (int64_t)P.dhw;
        for (int64_t k0 = 0; k0 < K; k0 += BW_THREADS) {
            const int64_t k = k0 + threadIdx.x;
            const float *xk = xb;
            if (k < K) {
                const int64_t ci = k / P.taps;
                const int t = (int)(k - ci * P.taps), tw = t % P.kw, th = (t / P.kw) % P.kh, td = t / (P.kw * P.kh);
                xk = xb + ci * P.dhw + td * P.hw + th * P.in_w + tw;
            }
            float acc0 = 0.0f, acc1 = 0.0f, acc2 = 0.0f, acc3 = 0.0f;
            for (int w0 = 0; w0 < P.npool; w0 += BW_WINDOWS) {
                const int nwin = min(BW_WINDOWS, P.npool - w0);
                __syncthreads(); /* the previous chunk's offsets are read */
                for (int i = threadIdx.x; i < nwin; i += BW_THREADS) {
                    const uint32_t win = (uint32_t)(w0 + i);
                    const uint32_t pd = fdiv(win, P.f_pooled_hw), r = win - pd * P.f_pooled_hw.d;
                    const uint32_t ph = fdiv(r, P.f_pooled_w), pw = r - ph * P.f_pooled_w.d;
                    int od, oh, ow;
                    decode(P, (uint32_t)cd[win], od, oh, ow);
                    off_s[i] = ((int)pd * P.pd + od) * P.hw + ((int)ph * P.ph + oh) * P.in_w + (int)pw * P.pw + ow;
                }
                __syncthreads();
                if (k < K) {
                    int i = 0;
                    for (; i + 4 <= nwin; i += 4) {
                        acc0 += __ldg(xk + off_s[i]);
                        acc1 += __ldg(xk + off_s[i + 1]);
                        acc2 += __ldg(xk + off_s[i + 2]);
                        acc3 += __ldg(xk + off_s[i + 3]);
                    }
                    for (; i < nwin; ++i)
                        acc0 += __ldg(xk + off_s[i]);
                }
            }
            if (k < K)
                partial[bc * K + k] = scale * ((acc0 + acc1) + (acc2 + acc3));
        }
    }
}

/* grad_w[c][k] = sum over the parts of partial[part][c][k] in double; grad_cb[c] = sum_b N S.
 * A block takes 32 columns; its 32 warps sum 32 contiguous ranges of parts (coalesced rows of
 * 32), then warp 0 adds the 32 sums in order; grad_cb[c] is a warp's: lane l sums samples l,
 * l + 32, ..., then a fixed shuffle tree. A fixed order for a given problem. (8 warps a block,
 * and grad_cb one thread's loop over the batch, took 0.021 ms at the headline b128, latency
 * bound; this takes 0.006, H200, twenty-eighth session.) Where x holds an inf or NaN (NF_X),
 * the entries nf_mask marks (mark_w_nonfinite) are NaN. */
constexpr int RD_THREADS = 1024, RD_GROUPS = RD_THREADS / 32, RD_BATCH = 16;
__global__ void __launch_bounds__(RD_THREADS)
weight_reduce_kernel(const BwParams P, int64_t parts, int64_t parts_nf, const unsigned *__restrict__ flags,
                     const uint8_t *__restrict__ nf_mask, const float *__restrict__ partial,
                     const float *__restrict__ gp, const float *__restrict__ go, float *__restrict__ grad_w,
                     float *__restrict__ grad_cb, float *__restrict__ grad_bias)
{
    __shared__ double sums[RD_GROUPS][32];
    griddep_wait();
    /* The last kernel of a backward: the next call's first kernel (pdl_first) may take its
     * slots as this grid's blocks end, and still waits for all of it. */
    griddep_trigger();
    /* The flags word is waited for only after the sums, so its load's latency and the
     * partials' overlap: the common case (x finite) sums the tensor cores' parts; where x holds
     * an inf or NaN, the gather's parts_nf are summed again. */
    const unsigned fl = flags ? *flags : 0u;
    const Shape &s = P.s;
    const int64_t K = s.cin * (int64_t)P.taps, total = s.cout * K;
    const int lane = threadIdx.x & 31, g = threadIdx.x >> 5;
    /* Group g's share of column i's parts, in order, RD_BATCH loads in flight (a loop of one
     * load and one dependent add waited out a load's latency for each part: 0.022 ms at the
     * headline b128). The last batch is padded with +0.0, which leaves acc's bits as they are
     * (acc starts at +0.0 and a sum is never -0.0 in round-to-nearest unless both terms are),
     * so the tail's loads are in flight together too. */
    const auto column = [&](int64_t np, int64_t i) {
        double acc = 0.0;
        const int64_t q0 = g * np / RD_GROUPS, n = (g + 1) * np / RD_GROUPS - q0;
        /* A pointer stepped by a row a load: the instruction count a load is what bounds this
         * kernel at 32 warps an SM (~15 a load with the offsets multiplied out, 7 so; with the
         * flags' load overlapped, 5.5 -> 5.0 us in the headline b128 step, H200). */
        const float *p = partial + q0 * total + i;
        for (int64_t q = 0; q < n; q += RD_BATCH) {
            float v[RD_BATCH];
#pragma unroll
            for (int j = 0; j < RD_BATCH; ++j) {
                v[j] = q + j < n ? __ldg(p) : 0.0f;
                p += total;
            }
#pragma unroll
            for (int j = 0; j < RD_BATCH; ++j)
                acc += (double)v[j];
        }
        return acc;
    };
    for (int64_t i0 = blockIdx.x * (int64_t)32; i0 < total; i0 += (int64_t)gridDim.x * 32) {
        const int64_t i = i0 + lane;
        if (grad_w) {
            double acc = 0.0;
            if (i < total) {
                acc = column(parts, i);
                if (fl & NF_X)
                    acc = column(parts_nf, i); /* the gather's partials */
            }
            __syncthreads(); /* the previous columns' sums are read */
            sums[g][lane] = acc;
            __syncthreads();
            if (g == 0 && i < total) {
                double t = 0.0;
#pragma unroll
                for (int j = 0; j < RD_GROUPS; ++j)
                    t += sums[j][lane];
                grad_w[i] = (fl & NF_X) && nf_mask[i] ? __int_as_float(0x7fffffff) : (float)t;
            }
        }
        if (grad_cb) {
            /* The channels whose first column lies in this chunk, a warp each, from warp 1 on:
             * warp 0 is still adding the column sums above. The samples' terms four at a time,
             * their loads and divisions in flight together, added in sample order. */
            for (int64_t c = (i0 + K - 1) / K + (g + RD_GROUPS - 1) % RD_GROUPS; c < s.cout && c * K < i0 + 32;
                 c += RD_GROUPS) {
                double acc = 0.0;
                int64_t b = lane;
                for (; b + 96 < s.batch; b += 128) {
                    float t[4];
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        t[j] = grad_scale(P, gp, go, b + 32 * j, c);
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        acc += (double)t[j];
                }
                for (; b < s.batch; b += 32)
                    acc += (double)grad_scale(P, gp, go, b, c);
#pragma unroll
                for (int o = 16; o > 0; o >>= 1)
                    acc += __shfl_xor_sync(0xffffffffu, acc, o);
                if (lane == 0)
                    grad_cb[c] = (float)(acc * (double)P.npool);
            }
        }
    }
    /* grad_bias (convpool_backward_cuda_all): sum_b grad_out[b] for every channel, by the last
     * block's last warp after its columns (it holds a channel of grad_cb only where a chunk of
     * 32 columns starts 31 channels): lane l sums samples l, l + 32, ..., then a butterfly of
     * shuffles, which leaves every lane the same sum. A fixed order for a given batch. In the
     * autograd step this takes the place of Model's own reduction of grad_out (a kernel on a
     * side stream, with its fork and join): 3-4 us of the headline step, H200. */
    if (grad_bias && blockIdx.x == gridDim.x - 1 && g == RD_GROUPS - 1) {
        double acc = 0.0;
        if (go)
            for (int64_t b = lane; b < s.batch; b += 32)
                acc += (double)go[b * P.go_stride];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            acc += __shfl_xor_sync(0xffffffffu, acc, o);
        for (int64_t c = lane; c < s.cout; c += 32)
            grad_bias[c] = (float)acc;
    }
}

/* Thread (b, p): grad_x[b][ci][p] for GX_CI input channels at a time, gathered from every
 * window whose arg-max patch covers p. */
template <typename Code>
__global__ void __launch_bounds__(GX_THREADS)
grad_x_kernel(const BwParams P, const float *__restrict__ w, const void *__restrict__ codes,
              const float *__restrict__ gp, const float *__restrict__ go, float *__restrict__ grad_x, const Gate gate)
{
    if (gate_closed(gate))
        return;
    const Shape &s = P.s;
    const int64_t total = s.batch * (int64_t)P.dhw;
    for (int64_t i = blockIdx.x * (int64_t)GX_THREADS + threadIdx.x; i < total; i += (int64_t)gridDim.x * GX_THREADS) {
        const int64_t b = i / P.dhw;
        const int p = (int)(i - b * P.dhw);
        const int xd = (int)fdiv((uint32_t)p, P.f_hw), r = p - xd * P.hw;
        const int xh = (int)fdiv((uint32_t)r, P.f_in_w), xw = r - xh * P.in_w;
        /* Conv positions whose patch holds p, inside the pooled region, and their windows. */
        const int d_lo = max(0, xd - P.kd + 1), d_hi = min(xd, P.pooled_d * P.pd - 1);
        const int h_lo = max(0, xh - P.kh + 1), h_hi = min(xh, P.pooled_h * P.ph - 1);
        const int w_lo = max(0, xw - P.kw + 1), w_hi = min(xw, P.pooled_w * P.pw - 1);
        const bool any = d_lo <= d_hi && h_lo <= h_hi && w_lo <= w_hi;
        const int wd0 = any ? d_lo / P.pd : 0, wd1 = any ? d_hi / P.pd : -1;
        const int wh0 = any ? h_lo / P.ph : 0, wh1 = any ? h_hi / P.ph : -1;
        const int ww0 = any ? w_lo / P.pw : 0, ww1 = any ? w_hi / P.pw : -1;
        for (int64_t ci0 = 0; ci0 < s.cin; ci0 += GX_CI) {
            const int nci = (int)imin(GX_CI, s.cin - ci0);
            float acc[GX_CI];
#pragma unroll
            for (int j = 0; j < GX_CI; ++j)
                acc[j] = 0.0f;
            for (int64_t c = 0; c < s.cout && any; ++c) {
                const float scale = grad_scale(P, gp, go, b, c);
                if (scale == 0.0f)
                    continue; /* x and w are finite: these terms are exact zeros */
                const Code *cd = static_cast<const Code *>(codes) + (b * s.cout + c) * P.npool;
                const float *wc = w + (c * s.cin + ci0) * P.taps;
                for (int wd = wd0; wd <= wd1; ++wd)
                    for (int wh = wh0; wh <= wh1; ++wh)
                        for (int ww = ww0; ww <= ww1; ++ww) {
                            int od, oh, ow;
                            decode(P, (uint32_t)cd[(wd * P.pooled_h + wh) * P.pooled_w + ww], od, oh, ow);
                            const int td = xd - (wd * P.pd + od), th = xh - (wh * P.ph + oh), tw = xw - (ww * P.pw + ow);
                            if ((unsigned)td >= (unsigned)P.kd || (unsigned)th >= (unsigned)P.kh ||
                                (unsigned)tw >= (unsigned)P.kw)
                                continue;
                            const float *wt = wc + (td * P.kh + th) * P.kw + tw;
#pragma unroll
                            for (int j = 0; j < GX_CI; ++j)
                                if (j < nci)
                                    acc[j] += scale * __ldg(wt + j * P.taps);
                        }
            }
#pragma unroll
            for (int j = 0; j < GX_CI; ++j)
                if (j < nci)
                    grad_x[(b * s.cin + ci0 + j) * P.dhw + p] = acc[j];
        }
    }
}

__device__ __forceinline__ uint32_t load_code(const void *codes, int bytes, int64_t i)
{
    if (bytes == 1)
        return static_cast<const uint8_t *>(codes)[i];
    if (bytes == 2)
        return static_cast<const uint16_t *>(codes)[i];
    return static_cast<const uint32_t *>(codes)[i];
}

/* Whether conv position (od, oh, ow) is the arg-max of its window for (b, c); a position past
 * the pooled windows (the floor-mode remainder) never is. */
__device__ __forceinline__ bool is_argmax(const BwParams &P, const void *codes, int code_bytes, int64_t b, int64_t c,
                                          int od, int oh, int ow)
{
    const int pd = od / P.pd, ph = oh / P.ph, pw = ow / P.pw;
    if (pd >= P.pooled_d || ph >= P.pooled_h || pw >= P.pooled_w)
        return false;
    int cd, ch, cw;
    decode(P, load_code(codes, code_bytes, (b * P.s.cout + c) * P.npool + (pd * P.pooled_h + ph) * P.pooled_w + pw),
           cd, ch, cw);
    return od == pd * P.pd + cd && oh == ph * P.ph + ch && ow == pw * P.pw + cw;
}

/* NF_X (x holds an inf or NaN): nf_mask[c][ci][t] = 1 for each non-finite x[b][ci][p] and each
 * tap t whose conv position o = p - t exists and is not (b, c)'s arg-max (or has S = 0): the
 * dense formula's 0 * inf terms, which make grad_weight[c][ci][t] NaN. weight_reduce_kernel
 * stores the NaN there after its sums (the mask lies after the flags, zeroed with them; a byte
 * is only ever set to 1, so concurrent stores agree). Thread per x element, block `block` of
 * `blocks` over x. */
__device__ void mark_w_nonfinite(const BwParams &P, const float *__restrict__ x, const void *__restrict__ codes,
                                 int code_bytes, const float *__restrict__ gp, const float *__restrict__ go,
                                 uint8_t *__restrict__ nf_mask, int64_t block, int64_t blocks)
{
    const Shape &s = P.s;
    const int conv_d = P.in_d - P.kd + 1, conv_h = P.in_h - P.kh + 1, conv_w = P.in_w - P.kw + 1;
    const int64_t total = s.batch * s.cin * (int64_t)P.dhw;
    for (int64_t i = block * BW_THREADS + threadIdx.x; i < total; i += blocks * BW_THREADS) {
        if (isfinite(__ldg(x + i)))
            continue;
        const int64_t bci = i / P.dhw, b = bci / s.cin, ci = bci - b * s.cin;
        const int p = (int)(i - bci * P.dhw), pz = p / P.hw, py = (p / P.in_w) % P.in_h, px = p % P.in_w;
        for (int td = 0; td < P.kd; ++td)
            for (int th = 0; th < P.kh; ++th)
                for (int tw = 0; tw < P.kw; ++tw) {
                    const int od = pz - td, oh = py - th, ow = px - tw;
                    if (od < 0 || oh < 0 || ow < 0 || od >= conv_d || oh >= conv_h || ow >= conv_w)
                        continue;
                    const int64_t t = (td * P.kh + th) * P.kw + tw;
                    for (int64_t c = 0; c < s.cout; ++c)
                        if (grad_scale(P, gp, go, b, c) == 0.0f ||
                            !is_argmax(P, codes, code_bytes, b, c, od, oh, ow))
                            nf_mask[(c * s.cin + ci) * (int64_t)P.taps + t] = 1;
                }
    }
}

/* ---- The tiled kernels: shared memory instead of scattered global loads ----
 *
 * weight_tile_kernel: block (b, z, pass) owns a fixed share z of sample b's pooled windows,
 * visited as units of one pooled d-row x up to GW_UPH pooled h-rows x up to upw pooled columns.
 * For each unit it stages x's region under the unit (every input channel) in shared memory, and
 * the arg-max of every (channel, window) as an offset into it; thread slot (c, kc) then sums, for
 * each window in order, the staged x at that offset plus its GW_COLS columns k = kc + r * KC
 * (k = ci * taps + t): lanes of one c read neighbouring taps, so one load instruction mostly
 * touches distinct banks. The sums stay in registers across the block's units; the block
 * writes S[b][c] times them as partial (b, z). Output columns beyond 256 threads x GW_COLS run
 * as further passes (grid.y), each staging x again (from L2).
 *
 * grad_x_tile_kernel: block (b, 2 x 4 x 32 tile of x positions), a thread per position. For a
 * chunk of output channels it builds, in shared memory, a bit mask of the arg-max conv positions
 * that can reach the tile (one 64-bit word per conv row: 32 + kw - 1 columns) and S[b][c] *
 * w[c][ci][t] for 8 input channels; each thread then gathers, per (c, group of tap rows (td,
 * th)), the kw bits of each conv row that its position sees into one word and adds the weights
 * of its set bits only. A position receives about taps/|window| terms per channel instead of taps.
 *
 * Both sum in a fixed order that depends on the problem alone (never on the device): the
 * results are bit-identical run to run and across GPUs. Shapes beyond their limits (kw > 32, or
 * shared memory) take the simple kernels above. */
constexpr int GW_COLS = 16;   /* output columns a weight_tile thread sums */
constexpr int GW_UPH = 2;     /* pooled h-rows per unit, at most */
constexpr int GW_UPW = 32;    /* pooled columns per unit, at most */
constexpr int GW_BLOCKS = 1024; /* blocks over the whole batch the weight split aims at */
constexpr int TILE_SMEM = 48 * 1024;
constexpr int GXT_TD = 2, GXT_TH = 4, GXT_TW = 32, GXT_THREADS = GXT_TD * GXT_TH * GXT_TW;

/* The weight kernel's split of one problem; a function of the problem only. */
struct WeightTiling {
    int uph, upw, rd, rh, rw, pitch; /* unit extents (pooled), staged region and its row pitch */
    int64_t units_h, units_w, units; /* units along pooled h, w, and per sample */
    int64_t nz;                      /* blocks (partials) per sample */
    int64_t kc, passes;              /* column chunks per channel; passes of BW_THREADS slots */
    int smem;
    bool ok;
};

WeightTiling weight_tiling(const Shape &s)
{
    WeightTiling t{};
    const int64_t taps = s.k_d * s.k_h * s.k_w, K = s.cin * taps;
    t.uph = (int)imin(GW_UPH, s.pooled_h);
    t.upw = (int)imin(GW_UPW, s.pooled_w);
    for (;;) {
        t.rd = (int)(s.pool_d + s.k_d - 1);
        t.rh = (int)(t.uph * s.pool_h + s.k_h - 1);
        t.rw = (int)(t.upw * s.pool_w + s.k_w - 1);
        t.pitch = t.rw | 1; /* odd: rows of one plane start on different banks */
        const int64_t xb = s.cin * (int64_t)t.rd * t.rh * t.pitch * 4;
        const int64_t ob = s.cout * (int64_t)t.uph * t.upw * 4;
        if (xb + ob <= TILE_SMEM) {
            t.smem = (int)(xb + ob);
            t.ok = true;
            break;
        }
        if (t.uph > 1)
            t.uph = 1;
        else if (t.upw > 1)
            t.upw = (t.upw + 1) / 2;
        else
            break;
    }
    if (!t.ok)
        return t;
    t.units_h = ceil_div(s.pooled_h, t.uph);
    t.units_w = ceil_div(s.pooled_w, t.upw);
    t.units = s.pooled_d * t.units_h * t.units_w;
    t.nz = imax(1, imin(t.units, ceil_div(GW_BLOCKS, s.batch)));
    t.kc = ceil_div(K, GW_COLS);
    t.passes = ceil_div(s.cout * t.kc, BW_THREADS);
    t.ok = t.passes <= 65535;
    return t;
}

/* weight_tile_kernel's share bz = (b, z) of one pass (blockIdx.y). */
template <typename Code>
__device__ __forceinline__ void weight_tile_share(const BwParams &P, const WeightTiling &T, const float *__restrict__ x,
                                                  const void *__restrict__ codes, const float *__restrict__ gp,
                                                  const float *__restrict__ go, float *__restrict__ partial,
                                                  float *tile_smem, int64_t bz)
{
    const Shape &s = P.s;
    const int rd = T.rd, rh = T.rh, pitch = T.pitch, plane = rd * rh * pitch;
    float *xs = tile_smem;
    int *off_s = reinterpret_cast<int *>(tile_smem + s.cin * (int64_t)plane);
    const int upw = T.upw, uwin = T.uph * T.upw;
    const int64_t K = s.cin * (int64_t)P.taps, KC = T.kc;
    const int64_t b = bz / T.nz, z = bz - b * T.nz;
    const int64_t slot = (int64_t)blockIdx.y * BW_THREADS + threadIdx.x;
    const bool active = slot < s.cout * KC;
    const int64_t c = active ? slot / KC : 0, kc = active ? slot - c * KC : 0;

    /* This thread's columns as offsets into the staged region (0 for columns past K). */
    int koff[GW_COLS];
#pragma unroll
    for (int r = 0; r < GW_COLS; ++r) {
        const int64_t k = kc + r * KC;
        koff[r] = 0;
        if (k < K) {
            const int ci = (int)(k / P.taps), t = (int)(k - (int64_t)ci * P.taps);
            const int tw = t % P.kw, th = (t / P.kw) % P.kh, td = t / (P.kw * P.kh);
            koff[r] = ci * plane + (td * rh + th) * pitch + tw;
        }
    }
    float acc[GW_COLS];
#pragma unroll
    for (int r = 0; r < GW_COLS; ++r)
        acc[r] = 0.0f;

    const float *xb = x + b * s.cin * (int64_t)P.dhw;
    const Code *cb = static_cast<const Code *>(codes) + b * s.cout * (int64_t)P.npool;
    const int64_t u0 = z * T.units / T.nz, u1 = (z + 1) * T.units / T.nz;
    for (int64_t u = u0; u < u1; ++u) {
        const int64_t uw = u % T.units_w, uh = (u / T.units_w) % T.units_h, pd = u / (T.units_w * T.units_h);
        const int ph0 = (int)(uh * T.uph), pw0 = (int)(uw * upw);
        const int nh = (int)imin(T.uph, s.pooled_h - ph0), nw = (int)imin(upw, s.pooled_w - pw0);
        const int d0 = (int)pd * P.pd, h0 = ph0 * P.ph, w0 = pw0 * P.pw;
        __syncthreads(); /* the previous unit's staging is read */
        /* Stage x[b][ci][d0 .. d0 + rd)[h0 .. h0 + rh)[w0 .. w0 + rw) (zeros outside x). */
        /* One flat loop over the region: a warp per row idles lanes on rows of 34 or 66 and
         * measured 1.3-2.5x slower. */
        const int rows = s.cin * rd * rh;
        for (int i = threadIdx.x; i < rows * T.rw; i += BW_THREADS) {
            const int row = i / T.rw, col = i - row * T.rw;
            const int ci = row / (rd * rh), dh = row - ci * rd * rh, dd = dh / rh, hh = dh - dd * rh;
            const int d = d0 + dd, h = h0 + hh, w = w0 + col;
            float v = 0.0f;
            if (d < P.in_d && h < P.in_h && w < P.in_w)
                v = __ldg(xb + (int64_t)ci * P.dhw + (d * P.in_h + h) * P.in_w + w);
            xs[ci * plane + (dd * rh + hh) * pitch + col] = v;
        }
        /* Every (channel, window) arg-max as the offset of its patch's origin in the region. */
        for (int i = threadIdx.x; i < s.cout * uwin; i += BW_THREADS) {
            const int cc = i / uwin, wi = i - cc * uwin, wh = wi / upw, ww = wi - wh * upw;
            if (wh < nh && ww < nw) {
                const int win = ((int)pd * P.pooled_h + ph0 + wh) * P.pooled_w + pw0 + ww;
                int od, oh, ow;
                decode(P, (uint32_t)cb[(int64_t)cc * P.npool + win], od, oh, ow);
                off_s[cc * uwin + wh * upw + ww] = (od * rh + wh * P.ph + oh) * pitch + ww * P.pw + ow;
            }
        }
        __syncthreads();
        if (active) {
            const int *oc = off_s + c * uwin;
            for (int wh = 0; wh < nh; ++wh)
                for (int ww = 0; ww < nw; ++ww) {
                    const float *xo = xs + oc[wh * upw + ww];
#pragma unroll
                    for (int r = 0; r < GW_COLS; ++r)
                        acc[r] += xo[koff[r]];
                }
        }
    }
    if (active) {
        const float scale = grad_scale(P, gp, go, b, c);
        float *out = partial + (bz * s.cout + c) * K;
#pragma unroll
        for (int r = 0; r < GW_COLS; ++r) {
            const int64_t k = kc + r * KC;
            if (k < K)
                out[k] = scale * acc[r];
        }
    }
}

template <typename Code>
__global__ void __launch_bounds__(BW_THREADS)
weight_tile_kernel(const BwParams P, const WeightTiling T, const float *__restrict__ x,
                   const void *__restrict__ codes, const float *__restrict__ gp, const float *__restrict__ go,
                   float *__restrict__ partial, const Gate gate, int64_t nbz, const unsigned *__restrict__ flags,
                   uint8_t *__restrict__ nf_mask)
{
    extern __shared__ __align__(16) float tile_smem[];
    griddep_wait();
    griddep_trigger();
    if (!gate_closed(gate))
        for (int64_t bz = blockIdx.x; bz < nbz; bz += gridDim.x)
            weight_tile_share<Code>(P, T, x, codes, gp, go, partial, tile_smem, bz);
    /* Then every block takes its share of grad_w_nonfinite_kernel's marks where NF_X is set:
     * that work without a launch of its own. */
    if (nf_mask && (*flags & NF_X))
        mark_w_nonfinite(P, x, codes, sizeof(Code), gp, go, nf_mask, blockIdx.y * (int64_t)gridDim.x + blockIdx.x,
                         (int64_t)gridDim.x * gridDim.y);
}

/* The grad_x kernel's split: output channels per chunk, tap rows (td, th) gathered into one word. */
struct GradXTiling {
    int cc, grp, rd, rh, smem;
    int64_t n_td, n_th, n_tw;
    bool ok;
};

GradXTiling grad_x_tiling(const Shape &s)
{
    GradXTiling t{};
    const int64_t taps = s.k_d * s.k_h * s.k_w;
    if (s.k_w > 32)
        return t;
    t.rd = (int)(GXT_TD + s.k_d - 1);
    t.rh = (int)(GXT_TH + s.k_h - 1);
    const int64_t per_c = (int64_t)t.rd * t.rh * 8 + taps * 8 * 4 + 4;
    t.cc = (int)imin(imin(s.cout, 16), (TILE_SMEM - 16) / per_c);
    if (t.cc < 1)
        return t;
    t.grp = (int)imax(1, imin(s.k_d * s.k_h, 32 / s.k_w));
    t.smem = (int)(ceil_div(t.cc * (int64_t)t.rd * t.rh * 8, 16) * 16 + t.cc * taps * 32 + t.cc * 4);
    t.n_td = ceil_div(s.in_d, GXT_TD);
    t.n_th = ceil_div(s.in_h, GXT_TH);
    t.n_tw = ceil_div(s.in_w, GXT_TW);
    t.ok = true;
    return t;
}

template <typename Code>
__global__ void __launch_bounds__(GXT_THREADS, 2)
grad_x_tile_kernel(const BwParams P, const GradXTiling T, const float *__restrict__ w, const void *__restrict__ codes,
                   const float *__restrict__ gp, const float *__restrict__ go, float *__restrict__ grad_x,
                   const Gate gate)
{
    extern __shared__ __align__(16) float tile_smem[];
    griddep_wait();
    if (gate_closed(gate))
        return;
    const Shape &s = P.s;
    const int rd = T.rd, rh = T.rh, kd = P.kd, kh = P.kh, kw = P.kw, taps = P.taps;
    unsigned long long *mask_s = reinterpret_cast<unsigned long long *>(tile_smem);
    float *ws_s = tile_smem + ceil_div(T.cc * (int64_t)rd * rh * 8, 16) * 4;
    float *scale_s = ws_s + T.cc * taps * 8;

    /* A grid-stride loop over the tiles: behind a gate the launch is a resident grid, so a
     * closed gate costs a few hundred blocks instead of one per tile. */
    const int64_t nblk = s.batch * T.n_td * T.n_th * T.n_tw;
    for (int64_t blk = blockIdx.x; blk < nblk; blk += gridDim.x) {
        const TileIdx ti = tile_of(blk, T.n_td, T.n_th, T.n_tw);
        const int td_i = ti.td, th_i = ti.th, tw_i = ti.tw;
        const int64_t b = ti.b;
        const int xw_l = threadIdx.x & 31, xh_l = (threadIdx.x >> 5) % GXT_TH, xd_l = threadIdx.x / (32 * GXT_TH);
        const int xd0 = td_i * GXT_TD, xh0 = th_i * GXT_TH, xw0 = tw_i * GXT_TW;
        const int xd = xd0 + xd_l, xh = xh0 + xh_l, xw = xw0 + xw_l;
        const bool inside = xd < P.in_d && xh < P.in_h && xw < P.in_w;
        const int od_lo = xd0 - kd + 1, oh_lo = xh0 - kh + 1, ow_lo = xw0 - kw + 1;
        const RegionWindows R =
            region_windows(P, od_lo, oh_lo, ow_lo, xd0 + GXT_TD - 1, xh0 + GXT_TH - 1, xw0 + GXT_TW - 1);
        const uint32_t kwmask = kw == 32 ? 0xffffffffu : (1u << kw) - 1u;
        const Code *cb = static_cast<const Code *>(codes) + b * s.cout * (int64_t)P.npool;

        for (int64_t ci0 = 0; ci0 < s.cin; ci0 += 8) {
            float acc[8];
    #pragma unroll
            for (int j = 0; j < 8; ++j)
                acc[j] = 0.0f;
            for (int64_t c0 = 0; c0 < s.cout; c0 += T.cc) {
                const int ncc = (int)imin(T.cc, s.cout - c0);
                __syncthreads(); /* the previous chunk's masks and weights are read */
                for (int i = threadIdx.x; i < ncc; i += GXT_THREADS)
                    scale_s[i] = grad_scale(P, gp, go, b, c0 + i);
                for (int i = threadIdx.x; i < ncc * rd * rh; i += GXT_THREADS)
                    mask_s[i] = 0ull;
                __syncthreads();
                /* ws_s[c][(td * kh + th) * kw + jw][j] = S[c] * w[c][ci0 + j][td][th][kw - 1 - jw], a
                 * thread per row of 8. */
                for (int row = threadIdx.x; row < ncc * taps; row += GXT_THREADS) {
                    const int cl = row / taps, tr = row - cl * taps, jw = tr % kw, t = tr - jw + (kw - 1 - jw);
                    const float sc = scale_s[cl];
                    const float *wp = w + ((c0 + cl) * s.cin + ci0) * (int64_t)taps + t;
                    float v[8];
    #pragma unroll
                    for (int j = 0; j < 8; ++j)
                        v[j] = ci0 + j < s.cin ? sc * __ldg(wp + j * (int64_t)taps) : 0.0f;
                    float4 *o = reinterpret_cast<float4 *>(ws_s) + 2 * row;
                    o[0] = make_float4(v[0], v[1], v[2], v[3]);
                    o[1] = make_float4(v[4], v[5], v[6], v[7]);
                }
                /* The arg-max bits: row (od - od_lo, oh - oh_lo), bit ow - ow_lo. */
                for_each_argmax<GXT_THREADS, 8>(
                    P, R, ncc, od_lo, oh_lo, ow_lo,
                    [&](int cl, int win) { return (uint32_t)cb[(c0 + cl) * P.npool + win]; },
                    [&](int cl, int r_d, int r_h, int bit) {
                        if ((unsigned)r_d < (unsigned)rd && (unsigned)r_h < (unsigned)rh && (unsigned)bit < 64u)
                            atomicOr(&mask_s[(cl * rd + r_d) * rh + r_h], 1ull << bit);
                    });
                __syncthreads();
                for (int cl = 0; cl < ncc; ++cl) {
                    if (scale_s[cl] == 0.0f)
                        continue; /* x and w are finite: these terms are exact zeros */
                    /* Tap rows rr = td * kh + th, T.grp of them (kw bits each) to a word. */
                    const unsigned long long *mbase = mask_s + (cl * rd + xd_l + kd - 1) * rh + xh_l + kh - 1;
                    int td = 0, th = 0;
                    for (int rr0 = 0; rr0 < kd * kh; rr0 += T.grp) {
                        const int n = min(T.grp, kd * kh - rr0);
                        uint32_t word = 0;
                        for (int tt = 0; tt < n; ++tt) {
                            word |= ((uint32_t)(mbase[-(td * rh + th)] >> xw_l) & kwmask) << (tt * kw);
                            if (++th == kh)
                                th = 0, ++td;
                        }
                        const float4 *wrow = reinterpret_cast<const float4 *>(ws_s) + ((int64_t)cl * taps + rr0 * kw) * 2;
                        while (word) {
                            const int j = __ffs(word) - 1;
                            word &= word - 1u;
                            const float4 lo = wrow[2 * j], hi = wrow[2 * j + 1];
                            acc[0] += lo.x, acc[1] += lo.y, acc[2] += lo.z, acc[3] += lo.w;
                            acc[4] += hi.x, acc[5] += hi.y, acc[6] += hi.z, acc[7] += hi.w;
                        }
                    }
                }
            }
            if (inside) {
                float *gx = grad_x + (b * s.cin + ci0) * (int64_t)P.dhw + (xd * P.in_h + xh) * P.in_w + xw;
    #pragma unroll
                for (int j = 0; j < 8; ++j)
                    if (ci0 + j < s.cin)
                        gx[j * (int64_t)P.dhw] = acc[j];
            }
        }
    }
}

/* ---- weight_mma_kernel: grad_weight on the tensor cores ----
 *
 * grad_w[c][k] = S[b][c] * sum over conv positions q of onehot_c(q) * x[b][ci][q + tap(k)], with
 * onehot_c(q) = 1 where q is the arg-max of its window in channel c. Per sample that is a GEMM
 * with M = the columns k = ci * taps + t, N = the channels and K = the conv positions, whose B
 * operand (0 or 1) is exact in TF32 and whose A operand is the staged x region read at a
 * per-column offset: an A fragment feeds every channel, so the shared-memory traffic per
 * product is 16x below the gather kernel's. The positions are 8x more than the windows (pool
 * 2^3), but a tensor-core product costs far less than a gathered load.
 *
 * Block (b, z, column group, 16-channel chunk) walks a fixed share z of sample b's units (up to
 * upd pooled d-rows x uph pooled h-rows x upw pooled columns). Per unit it stages x's region
 * under the unit, rounded to TF32 (SPLIT: also the rounding's remainder, so hi + lo carries
 * x to ~22 bits: STRICT's two products instead of one), and a 32-bit mask per conv position of
 * the channels whose arg-max it is. Warp (group, wk) owns up to WM_MT m-tiles of 16 columns
 * and every wk-th conv row (od, oh) of the unit; the accumulators stay in registers across the
 * units, then the group's warps add theirs in order wk = 0, 1, ... and the block writes S times
 * the sums as its partial. Every order is a function of the problem alone: the results are
 * bit-identical run to run. Row pitch, plane and channel strides are padded on the host to cut
 * bank conflicts of the A loads (a host search, cached per geometry). The caller guarantees
 * finite x: the dense form multiplies every staged x by a 0 or a 1. */
constexpr int WM_THREADS = 192, WM_WARPS = WM_THREADS / 32;
constexpr int WM_MT = 7;                /* m-tiles (16 columns each) a warp holds at most */
constexpr int WM_SMEM = 100 * 1024;     /* two blocks per SM */
constexpr int WM_UW = 64;               /* conv columns per unit, at most (8 chunks) */
constexpr int WM_BATCH = 8;             /* staged elements a thread has in flight */

struct WeightMma {
    int upd, uph, upw;          /* unit: pooled extents */
    int ud, uh, cw;             /* unit: conv d-rows, h-rows, chunks of 8 columns */
    int rd, rh, rw;             /* staged region extents */
    int pitch, ps, cs;          /* row pitch, plane (d) stride, channel stride, in floats */
    int nch, region, smem;      /* chunks per unit; floats per staged copy; bytes */
    int mtiles, mtg, gpb, nwk;  /* m-tiles; per warp; groups per block; warps per group */
    int64_t units_d, units_h, units_w, units, nz, passes, cchunks;
    FastDiv f_rw, f_rh, f_nvec, f_chv, f_chw, f_uwin, f_upw, f_uph; /* f_chv, f_chw: a channel's vectors, floats */
    bool vec;       /* 16-byte staging loads (set at launch: needs x 16-byte aligned) */
    int code_bytes; /* set at launch */
    bool ok;
};

/* A-load wavefronts (the sum over m-tiles of the worst bank's distinct addresses) of a layout. */
static int64_t wm_conflicts(const Shape &s, int pitch, int ps, int cs, int mtiles)
{
    const int64_t taps = s.k_d * s.k_h * s.k_w, K = s.cin * taps;
    int64_t total = 0;
    for (int m = 0; m < mtiles; ++m)
        for (int half = 0; half < 2; ++half) {
            int addr[32], n = 0;
            for (int g = 0; g < 8; ++g) {
                const int64_t k = m * 16 + half * 8 + g;
                int off = 0;
                if (k < K) {
                    const int64_t ci = k / taps, t = k - ci * taps;
                    const int64_t tw = t % s.k_w, th = (t / s.k_w) % s.k_h, td = t / (s.k_w * s.k_h);
                    off = (int)(ci * cs + td * ps + th * pitch + tw);
                }
                for (int tt = 0; tt < 4; ++tt) {
                    const int a = off + tt;
                    bool seen = false;
                    for (int i = 0; i < n && !seen; ++i)
                        seen = addr[i] == a;
                    if (!seen)
                        addr[n++] = a;
                }
            }
            int per_bank[32] = {0}, worst = 0;
            for (int i = 0; i < n; ++i)
                worst = std::max(worst, ++per_bank[addr[i] & 31]);
            total += worst;
        }
    return total;
}

/* The value in lo, lo + step, ... below lo + 32 with the smallest cost (the first of equals). */
template <typename Cost> static int argmin_pad(int lo, int step, Cost cost)
{
    int best_v = lo;
    int64_t best = -1;
    for (int v = lo; v < lo + 32; v += step) {
        const int64_t c = cost(v);
        if (best < 0 || c < best)
            best = c, best_v = v;
    }
    return best_v;
}

/* Padded strides of a staged region (row pitch, plane stride, channel stride, in floats), from
 * a greedy search over each in turn, each padded by less than 32 floats. Cached, for both
 * tensor-core kernels, by a key that names the kernel and the geometry: a model calls with one
 * shape, and the search costs ~10-100 us. */
struct PadStrides {
    int64_t key[8];
    int pitch, ps, cs;
};

/* A spin lock (held for a copy): std::mutex would pull libstdc++'s unique symbols into the
 * shared library (tests: test_no_unique_symbols). */
static std::atomic<bool> stride_busy{false};
static PadStrides stride_cache[16];
static int stride_next = 0;

static bool stride_cache_find(const int64_t key[8], PadStrides &out)
{
    bool hit = false;
    while (stride_busy.exchange(true, std::memory_order_acquire)) {
    }
    for (const PadStrides &e : stride_cache)
        if (std::equal(key, key + 8, e.key)) {
            out = e, hit = true;
            break;
        }
    stride_busy.store(false, std::memory_order_release);
    return hit;
}

static void stride_cache_put(const PadStrides &r)
{
    while (stride_busy.exchange(true, std::memory_order_acquire)) {
    }
    stride_cache[stride_next] = r;
    stride_next = (stride_next + 1) % 16;
    stride_busy.store(false, std::memory_order_release);
}

static PadStrides wm_strides(const Shape &s, int rd, int rh, int rw, int mtiles)
{
    mtiles = std::min(mtiles, 64); /* a sample of the columns bounds the search's cost */
    const int64_t key[8] = {0, s.cin, s.k_d, s.k_h, s.k_w, rd, rh, rw}; /* mtiles follows from these */
    PadStrides r;
    if (stride_cache_find(key, r))
        return r;
    std::copy(key, key + 8, r.key);
    /* Multiples of 4, so a staged row starts 16-byte aligned (vector stores). */
    r.pitch = argmin_pad((rw + 3) & ~3, 4, [&](int p) { return wm_conflicts(s, p, rh * p, rd * rh * p, mtiles); });
    r.ps = argmin_pad(rh * r.pitch, 4, [&](int ps) { return wm_conflicts(s, r.pitch, ps, rd * ps, mtiles); });
    r.cs = argmin_pad(rd * r.ps, 4, [&](int cs) { return wm_conflicts(s, r.pitch, r.ps, cs, mtiles); });
    stride_cache_put(r);
    return r;
}

static WeightMma weight_mma_tiling(const Shape &s, bool split)
{
    WeightMma t{};
    const int64_t taps = s.k_d * s.k_h * s.k_w, K = s.cin * taps;
    t.mtiles = (int)imin(ceil_div(K, 16), 1 << 20);
    const int64_t groups = ceil_div(t.mtiles, WM_MT);
    t.mtg = (int)ceil_div(t.mtiles, groups);
    t.gpb = (int)imin(groups, WM_WARPS);
    t.nwk = WM_WARPS / t.gpb;
    t.passes = ceil_div(groups, t.gpb);
    t.cchunks = ceil_div(s.cout, 16);
    t.upw = (int)imax(1, imin(s.pooled_w, WM_UW / s.pool_w));
    /* Larger units stage less halo: try (upd, uph) from the largest down, then narrower units. */
    static const int shapes[5][2] = {{2, 4}, {1, 4}, {2, 2}, {1, 2}, {1, 1}};
    const int64_t red = (int64_t)t.gpb * t.mtg * 256;
    for (;;) {
        for (const auto &sh : shapes) {
            const int upd = (int)imin(sh[0], s.pooled_d), uph = (int)imin(sh[1], s.pooled_h);
            const int64_t ud = upd * s.pool_d, uh = uph * s.pool_h, cw = ceil_div(t.upw * s.pool_w, 8);
            const int64_t rd = ud + s.k_d - 1, rh = uh + s.k_h - 1, rw = cw * 8 + s.k_w - 1;
            const int64_t masks = ud * uh * cw * 8, rowtab = 4 * rd * rh;
            auto bytes = [&](int64_t cs) { return 4 * std::max(s.cin * cs * (split ? 2 : 1) + masks + rowtab, red); };
            if (bytes(rd * rh * rw) > WM_SMEM || rd * rh * rw > (1 << 20))
                continue;
            const PadStrides st = wm_strides(s, (int)rd, (int)rh, (int)rw, t.mtiles);
            if (bytes(st.cs) > WM_SMEM || s.cin * st.cs >= (1 << 16))
                continue;
            t.upd = upd, t.uph = uph;
            t.ud = (int)ud, t.uh = (int)uh, t.cw = (int)cw;
            t.rd = (int)rd, t.rh = (int)rh, t.rw = (int)rw;
            t.pitch = st.pitch, t.ps = st.ps, t.cs = st.cs;
            t.smem = (int)bytes(st.cs);
            t.ok = true;
            break;
        }
        if (t.ok || t.upw == 1)
            break;
        t.upw = (t.upw + 1) / 2;
    }
    if (!t.ok)
        return t;
    t.nch = t.ud * t.uh * t.cw;
    t.region = (int)(s.cin * t.cs);
    t.units_d = ceil_div(s.pooled_d, t.upd);
    t.units_h = ceil_div(s.pooled_h, t.uph);
    t.units_w = ceil_div(s.pooled_w, t.upw);
    t.units = t.units_d * t.units_h * t.units_w;
    t.nz = imax(1, imin(t.units, ceil_div(GW_BLOCKS, s.batch * t.passes * t.cchunks)));
    t.f_rw = make_fastdiv((uint32_t)t.rw);
    t.f_chv = make_fastdiv((uint32_t)(t.rd * t.rh * ((t.rw + 3) / 4)));
    t.f_chw = make_fastdiv((uint32_t)(t.rd * t.rh * t.rw));
    t.f_rh = make_fastdiv((uint32_t)t.rh);
    t.f_nvec = make_fastdiv((uint32_t)((t.rw + 3) / 4));
    t.f_uwin = make_fastdiv((uint32_t)(t.upd * t.uph * t.upw));
    t.f_upw = make_fastdiv((uint32_t)t.upw);
    t.f_uph = make_fastdiv((uint32_t)t.uph);
    t.vec = s.in_w % 4 == 0 && (t.units_w == 1 || (t.upw * s.pool_w) % 4 == 0);
    t.ok = t.passes <= 65535 && t.cchunks <= 65535 && s.batch * t.nz <= 0x7fffffff;
    return t;
}

/* v (finite: the caller's guarantee) rounded to TF32 for an operand, to nearest with ties away
 * as cvt.rna does; a value that would round past the largest TF32 value keeps that value, its
 * truncation, so a finite x stays finite (0 * inf would poison every column). Four
 * instructions: cvt.rna's own inf/NaN care (three more) is not needed here. */
__device__ __forceinline__ uint32_t wm_round(float v)
{
    const float r = __uint_as_float((__float_as_uint(v) + 0x1000u) & 0xffffe000u);
    return __float_as_uint(fminf(fmaxf(r, -0x1.ffcp127f), 0x1.ffcp127f));
}

/* W staged floats as weight_mma_kernel's staging moves them: one load from x, one store of
 * their TF32 roundings (W = 4: a 16-byte vector each way). round(v, rest) returns the
 * roundings and leaves v minus them in rest (the low half of the strict split). */
template <int W> struct WmVec;
template <> struct WmVec<1> {
    using F = float;
    using U = uint32_t;
    static __device__ __forceinline__ F zero() { return 0.0f; }
    static __device__ __forceinline__ F load(const float *p) { return __ldg(p); }
    static __device__ __forceinline__ void store(uint32_t *p, U u) { *p = u; }
    static __device__ __forceinline__ U round(F v, F &rest)
    {
        const U hi = wm_round(v);
        rest = v - __uint_as_float(hi);
        return hi;
    }
};
template <> struct WmVec<4> {
    using F = float4;
    using U = uint4;
    static __device__ __forceinline__ F zero() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
    static __device__ __forceinline__ F load(const float *p) { return __ldg(reinterpret_cast<const float4 *>(p)); }
    static __device__ __forceinline__ void store(uint32_t *p, U u) { *reinterpret_cast<uint4 *>(p) = u; }
    static __device__ __forceinline__ U round(F v, F &rest)
    {
        const U hi = make_uint4(wm_round(v.x), wm_round(v.y), wm_round(v.z), wm_round(v.w));
        rest = make_float4(v.x - __uint_as_float(hi.x), v.y - __uint_as_float(hi.y), v.z - __uint_as_float(hi.z),
                           v.w - __uint_as_float(hi.w));
        return hi;
    }
};

/* The arg-max code of entry i (1, 2 or 4 bytes a code). */
/* Zero an [A][B] array of m16n8 accumulator fragments (4 floats a lane each). */
template <int A, int B> __device__ __forceinline__ void zero_fragments(float (&acc)[A][B][4])
{
#pragma unroll
    for (int a = 0; a < A; ++a)
#pragma unroll
        for (int b = 0; b < B; ++b)
#pragma unroll
            for (int j = 0; j < 4; ++j)
                acc[a][b][j] = 0.0f;
}

/* MT: m-tiles a warp holds (the tiling's mtg rounded up to an instance); NT: 8-channel n-tiles
 * (1 where Cout <= 8). Compile-time, so the hot loop has no branch between its products and
 * the compiler hoists every A load of a chunk ahead of its MMAs. */
template <int MT, int NT, bool SPLIT>
__global__ void __launch_bounds__(WM_THREADS, 2)
weight_mma_kernel(const BwParams P, const WeightMma T, const float *__restrict__ x, const void *__restrict__ codes,
                  const float *__restrict__ gp, const float *__restrict__ go, float *__restrict__ partial,
                  const Gate gate)
{
    extern __shared__ __align__(16) float tile_smem[];
    if (gate_closed(gate))
        return;
    const Shape &s = P.s;
    uint32_t *xs = reinterpret_cast<uint32_t *>(tile_smem);
    uint32_t *mask = xs + T.region * (SPLIT ? 2 : 1);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const int grp = warp / T.nwk, wk = warp - grp * T.nwk;
    const bool computes = grp < T.gpb;
    const int64_t K = s.cin * (int64_t)P.taps;
    const int64_t b = blockIdx.x / T.nz, z = blockIdx.x - b * T.nz;
    const int m0 = (int)(((int64_t)blockIdx.y * T.gpb + grp) * T.mtg);
    const int nmt = computes ? (int)imax(0, imin(T.mtg, T.mtiles - m0)) : 0;
    const int c0 = (int)blockIdx.z * 16, ncc = (int)imin(NT * 8, s.cout - c0);

    /* This lane's A rows (columns k = 16 m + g and + 8) as offsets into the staged region, two
     * 16-bit halves of one register (a region is below 2^16 floats). Rows past the warp's
     * m-tiles or past K point at the region's start: their products are never written. */
    uint32_t koff[MT];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
        koff[mi] = 0;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int64_t k = (int64_t)(m0 + mi) * 16 + h * 8 + g;
            int off = 0;
            if (mi < nmt && k < K) {
                const int ci = (int)(k / P.taps), t = (int)(k - (int64_t)ci * P.taps);
                const int tw = t % P.kw, th = (t / P.kw) % P.kh, td = t / (P.kw * P.kh);
                off = ci * T.cs + td * T.ps + th * T.pitch + tw;
            }
            koff[mi] |= (uint32_t)(off + tq) << (16 * h);
        }
    }
    float acc[MT][NT][4];
    zero_fragments(acc);

    const float *xb = x + b * s.cin * (int64_t)P.dhw;
    const int64_t code0 = (b * s.cout + c0) * (int64_t)P.npool;
    const int rows = (int)s.cin * T.rd * T.rh, uwin = T.upd * T.uph * T.upw;
    const int nsl = (int)imax(1, imin(ncc, WM_THREADS / uwin)); /* the mask build's channel slices */
    const int64_t u0 = z * T.units / T.nz, u1 = (z + 1) * T.units / T.nz;
    /* Each staged row (dd, hh) of a channel: x's offset from the unit's first element, the
     * row's offset in the channel's region, and (dd, hh) for the bounds, once a block, so a
     * staged element costs two divisions and a table load instead of three divisions and their
     * products (the first unit's barrier orders these stores before the loads). */
    int4 *rowtab = reinterpret_cast<int4 *>(mask + T.nch * 8);
    for (int r = threadIdx.x; r < T.rd * T.rh; r += WM_THREADS) {
        const int dd = (int)fdiv((uint32_t)r, T.f_rh), hh = r - dd * T.rh;
        const int64_t rel = ((int64_t)dd * P.in_h + hh) * P.in_w;
        rowtab[r] = make_int4((int)(uint32_t)rel, (int)(rel >> 32), dd * T.ps + hh * T.pitch, (dd << 16) | hh);
    }
    for (int64_t u = u0; u < u1; ++u) {
        const int64_t uw = u % T.units_w, uh = (u / T.units_w) % T.units_h, ud = u / (T.units_w * T.units_h);
        const int pd0 = (int)(ud * T.upd), ph0 = (int)(uh * T.uph), pw0 = (int)(uw * T.upw);
        const int nd = (int)imin(T.upd, s.pooled_d - pd0), nh = (int)imin(T.uph, s.pooled_h - ph0);
        const int nw = (int)imin(T.upw, s.pooled_w - pw0);
        const int d0 = pd0 * P.pd, h0 = ph0 * P.ph, w0 = pw0 * P.pw;
        __syncthreads(); /* the previous unit's region and masks are read */
        const float *xu = xb + ((int64_t)d0 * P.in_h + h0) * P.in_w + w0;
        const int dlim = P.in_d - d0, hlim = P.in_h - h0, wlim = P.in_w - w0;
        /* x's element of channel ci, row e, column col (in: not past the input). */
        const auto row_src = [&](int ci, const int4 &e, int col, bool &in) {
            in = (e.w >> 16) < dlim && (e.w & 0xffff) < hlim && col < wlim;
            return xu + (int64_t)ci * P.dhw + ((int64_t)(uint32_t)e.x | ((int64_t)e.y << 32)) + col;
        };
        /* W floats at a time (W = 4: 16-byte vectors where x's rows and the unit's first column
         * are 4-aligned, so a vector lies wholly inside the input or wholly past it, and the
         * strides are multiples of 4, so it lands as one 16-byte store; else W = 1), WM_BATCH of
         * them a thread at a time: their table entries, then their loads, then the stores, so
         * that the loads are in flight together (the stores to shared memory would otherwise
         * keep the next table load, and so the next global load, behind them). f_ch and f_row
         * divide by a channel's and a row's count of W-float elements. */
        const auto stage = [&](auto width, const FastDiv &f_ch, const FastDiv &f_row) {
            constexpr int W = decltype(width)::value;
            using V = WmVec<W>;
            const int per_row = (T.rw + W - 1) / W, n = rows * per_row, per_ch = T.rd * T.rh * per_row;
            for (int i0 = threadIdx.x; i0 < n; i0 += WM_BATCH * WM_THREADS) {
                int o[WM_BATCH];
                typename V::F v[WM_BATCH];
#pragma unroll
                for (int j = 0; j < WM_BATCH; ++j) {
                    const int i = i0 + j * WM_THREADS;
                    const int ci = (int)fdiv((uint32_t)i, f_ch), ri = i - ci * per_ch;
                    const int row = (int)fdiv((uint32_t)ri, f_row), col = (ri - row * per_row) * W;
                    const int4 e = rowtab[i < n ? row : 0];
                    bool in;
                    const float *src = row_src(ci, e, col, in);
                    o[j] = i < n ? ci * T.cs + e.z + col : -1;
                    v[j] = V::zero();
                    if (in && i < n)
                        v[j] = V::load(src);
                }
#pragma unroll
                for (int j = 0; j < WM_BATCH; ++j) {
                    if (o[j] < 0)
                        break;
                    typename V::F lo;
                    V::store(xs + o[j], V::round(v[j], lo));
                    if (SPLIT)
                        V::store(xs + T.region + o[j], V::round(lo, lo));
                }
            }
        };
        if (T.vec)
            stage(std::integral_constant<int, 4>{}, T.f_chv, T.f_nvec);
        else
            stage(std::integral_constant<int, 1>{}, T.f_chw, T.f_rw);
        for (int i = threadIdx.x; i < T.nch * 8; i += WM_THREADS)
            mask[i] = 0u;
        __syncthreads();
        /* A thread a (window, slice of the chunk's channels): the window's place is worked out
         * once, the slice's codes are loaded together (consecutive threads read consecutive
         * codes of one channel), then each sets its channel's bit at its arg-max position.
         * Slices (channels sl, sl + nsl, ...) keep the threads busy when a unit has few
         * windows (pool 3, kernel 5: 30-40). */
        const auto build_masks = [&](const auto *cp) {
            for (int task = threadIdx.x; task < uwin * nsl; task += WM_THREADS) {
                const int sl = (int)fdiv((uint32_t)task, T.f_uwin), wi = task - sl * uwin;
                const int whd = (int)fdiv((uint32_t)wi, T.f_upw), ww = wi - whd * T.upw;
                const int wd = (int)fdiv((uint32_t)whd, T.f_uph), wh = whd - wd * T.uph;
                if (wd >= nd || wh >= nh || ww >= nw)
                    continue;
                const int64_t win = ((int64_t)(pd0 + wd) * P.pooled_h + ph0 + wh) * P.pooled_w + pw0 + ww;
                const int qbase = (wd * P.pd * T.uh + wh * P.ph) * (T.cw * 8) + ww * P.pw;
                uint32_t code[NT * 8];
#pragma unroll
                for (int k = 0; k < NT * 8; ++k) {
                    const int cl = sl + k * nsl;
                    code[k] = cl < ncc ? (uint32_t)cp[code0 + (int64_t)cl * P.npool + win] : 0u;
                }
#pragma unroll
                for (int k = 0; k < NT * 8; ++k) {
                    const int cl = sl + k * nsl;
                    if (cl >= ncc)
                        break;
                    int od, oh, ow;
                    decode(P, code[k], od, oh, ow);
                    atomicOr(&mask[qbase + (od * T.uh + oh) * (T.cw * 8) + ow], 1u << cl);
                }
            }
        };
        if (T.code_bytes == 1)
            build_masks(static_cast<const uint8_t *>(codes));
        else if (T.code_bytes == 2)
            build_masks(static_cast<const uint16_t *>(codes));
        else
            build_masks(static_cast<const uint32_t *>(codes));
        __syncthreads();
        if (nmt == 0)
            continue;
        /* Conv rows (od, oh) of the unit's windows go to the group's warps in turn; a warp walks
         * its row's chunks of 8 columns from per-row pointers, the chunk's offset an immediate. */
        const int vd = nd * P.pd, vh = nh * P.ph, ncw = (nw * P.pw + 7) / 8;
        int turn = 0;
        for (int od = 0; od < vd; ++od)
            for (int oh = 0; oh < vh; ++oh) {
                const bool mine = turn == wk;
                if (++turn == T.nwk)
                    turn = 0;
                if (!mine)
                    continue;
                const uint32_t *xr = xs + od * T.ps + oh * T.pitch;
                const uint32_t *pa[MT], *pb[MT];
#pragma unroll
                for (int mi = 0; mi < MT; ++mi)
                    pa[mi] = xr + (koff[mi] & 0xffffu), pb[mi] = xr + (koff[mi] >> 16);
                const uint32_t *mr = mask + (od * T.uh + oh) * (T.cw * 8) + tq;
                for (int j0 = 0; j0 < ncw; j0 += 8) {
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        if (j0 + j >= ncw)
                            break;
                        const uint32_t mlo = mr[j * 8], mhi = mr[j * 8 + 4];
                        uint32_t bf[NT][2];
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt) {
                            bf[nt][0] = (mlo >> (nt * 8 + g)) & 1u ? 0x3f800000u : 0u;
                            bf[nt][1] = (mhi >> (nt * 8 + g)) & 1u ? 0x3f800000u : 0u;
                        }
#pragma unroll
                        for (int mi = 0; mi < MT; ++mi) {
                            const uint32_t a[4] = {pa[mi][j * 8], pb[mi][j * 8], pa[mi][j * 8 + 4], pb[mi][j * 8 + 4]};
#pragma unroll
                            for (int nt = 0; nt < NT; ++nt)
                                mma_tf32(acc[mi][nt], a, bf[nt][0], bf[nt][1]);
                            if (SPLIT) {
                                const uint32_t *qa = pa[mi] + T.region, *qb = pb[mi] + T.region;
                                const uint32_t l[4] = {qa[j * 8], qb[j * 8], qa[j * 8 + 4], qb[j * 8 + 4]};
#pragma unroll
                                for (int nt = 0; nt < NT; ++nt)
                                    mma_tf32(acc[mi][nt], l, bf[nt][0], bf[nt][1]);
                            }
                        }
                    }
                    mr += 64;
#pragma unroll
                    for (int mi = 0; mi < MT; ++mi)
                        pa[mi] += 64, pb[mi] += 64;
                }
            }
    }
    /* The group's warps add their sums in order wk = 0, 1, ...: warp wk adds its own to the
     * running sum in shared memory after warp wk - 1. */
    float *red = tile_smem + grp * T.mtg * 256;
    for (int r = 0; r < T.nwk; ++r) {
        __syncthreads();
        if (wk == r && nmt > 0) {
#pragma unroll
            for (int mi = 0; mi < MT; ++mi)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
                    if (mi < nmt) {
                        float4 *q = reinterpret_cast<float4 *>(red + (mi * 2 + nt) * 128) + lane;
                        float4 v = make_float4(acc[mi][nt][0], acc[mi][nt][1], acc[mi][nt][2], acc[mi][nt][3]);
                        if (r > 0) {
                            const float4 o = *q;
                            v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
                        }
                        *q = v;
                        acc[mi][nt][0] = v.x, acc[mi][nt][1] = v.y, acc[mi][nt][2] = v.z, acc[mi][nt][3] = v.w;
                    }
        }
    }
    if (wk != T.nwk - 1 || nmt == 0)
        return;
    float *out = partial + (int64_t)blockIdx.x * s.cout * K;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int c = c0 + nt * 8 + 2 * tq + e;
            if (c - c0 >= ncc)
                continue;
            const float scale = grad_scale(P, gp, go, b, c);
#pragma unroll
            for (int mi = 0; mi < MT; ++mi)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int64_t k = (int64_t)(m0 + mi) * 16 + h * 8 + g;
                    if (mi < nmt && k < K)
                        out[c * K + k] = scale * acc[mi][nt][h * 2 + e];
                }
        }
}

/* ---- grad_x_mma_kernel: grad_x on the tensor cores, FP32-accurate (both precisions) ----
 *
 * grad_x[b][ci][p] = sum over channels c and taps t of w[c][ci][t] * G[c][p - t], where G[c][q]
 * is S[b][c] at the arg-max q of each window and 0 elsewhere: a conv of G with the flipped
 * weights. S = a * m is split (split_scale) into a power of two a, which G holds (one-hot
 * times a: exact in TF32), and m, which goes to the weights' side: B = m * w in two TF32 halves,
 * two MMAs per A fragment. Each product is then S * w to ~2^-22, as an FP32 dgrad computes it.
 * S in TF32 gave relative errors of 3e-4, and eager's dgrad is not always TF32 in TF32 mode
 * (kernel 1: 8e-8), while the gradients must stay within twice eager's error
 * (python/tests/test_cuda_training.py). The second MMA costs little: the A loads, not the
 * tensor cores, bound the kernel.
 *
 * Block (b, tile of GM_XD x GM_XH x-rows of XW columns, 8 input channels): for each chunk of 8
 * output channels it stages G under the tile (a at the arg-max positions, zeros around them),
 * the B fragments and a per-k-step offset table; warp (xh, pair of xd) then runs M = 16
 * columns x XW / 16 m-tiles x 2 rows, N = 8 input channels, K = (channel, tap) pairs, 8 a step.
 * K is ordered (channel, tw, td, th), so the four k of one A load differ in (td, th): with the
 * row pitch and plane stride padded (a host search like the weight kernel's) the four 8-column
 * runs land in distinct banks. With Cin = 8 an A fragment feeds one n-tile: 4 scalar loads per
 * A fragment, so shared-memory bandwidth bounds it (~0.2 ms at the headline batch 128 on the
 * H100, far below what it runs; see docs/KERNEL_NOTES.md).
 * Every sum has a fixed order: bit-identical run to run. Chunks of 8 channels make the chunk's
 * K a multiple of 8 for any kernel volume (a channel past Cout stages zeros and zero weights),
 * so no product ever reads outside the staged G. A NaN or inf S stays in G whole (m = 1, the
 * low half dropped), so it reaches exactly the positions its arg-max patch covers, as in the
 * dense backward. Not covered: |w| above FLT_MAX / 2, where m * w overflows and the zeros of G
 * turn it into NaN (the dense backward gives inf at the patch, 0 elsewhere). */
constexpr int GM_THREADS = 256, GM_XD = 4, GM_XH = 4; /* columns per tile: 64 or 32, a template argument */
constexpr int GM_ROWS = GM_XD * GM_XH / (GM_THREADS / 32); /* x rows a warp computes */
constexpr int GM_CC = 8;               /* channels per staged chunk */
/* Two blocks an SM (16 warps) on an H100. Kernel 5 (153 KB at 32 columns) ran one block an SM
 * at 0.52 ms (b8, H100) against the FP32 gather's 0.44 ms, so a tiling past this takes the gather. */
constexpr int GM_SMEM = 113 * 1024;

struct GradXMma {
    int xw;                     /* x columns per tile: 64, or 32 for narrow x or a region 64 cannot fit */
    int ksteps;                 /* k-steps per chunk: 8 * taps / 8 */
    int gd, gh, gw;             /* G region extents */
    int gp, gps, gcs;           /* its row pitch, plane stride, channel stride (floats) */
    int region, smem;           /* floats of G; bytes in all */
    int64_t n_td, n_th, n_tw;   /* tiles per sample along d, h, w */
    int64_t cchunks, cichunks;  /* output-channel chunks (a loop), input-channel chunks (the grid) */
    bool ok;
};

/* K index k of a chunk as (channel, tap): k = (cl * kw + tw) * (kd * kh) + td * kh + th. */
static inline void gx_k_tap(const Shape &s, int64_t k, int64_t &cl, int64_t &td, int64_t &th, int64_t &tw)
{
    const int64_t r = k % (s.k_d * s.k_h), q = k / (s.k_d * s.k_h);
    td = r / s.k_h, th = r % s.k_h, tw = q % s.k_w, cl = q / s.k_w;
}

/* Offset of k's G element from the x position's own (rowbase + column). */
static inline int64_t gx_goff(const Shape &s, int64_t k, int gp, int gps, int gcs)
{
    int64_t cl, td, th, tw;
    gx_k_tap(s, k, cl, td, th, tw);
    return cl * gcs + (s.k_d - 1 - td) * gps + (s.k_h - 1 - th) * gp + (s.k_w - 1 - tw);
}

/* A-load wavefronts over the first k-steps: lanes (g, tq) read goff(8 ks + tq (+4)) + g. */
static int64_t gx_conflicts(const Shape &s, int ksteps, int gp, int gps, int gcs)
{
    int64_t total = 0;
    for (int ks = 0; ks < std::min(ksteps, 64); ++ks)
        for (int half = 0; half < 2; ++half) {
            int per_bank[32] = {0}, worst = 0;
            for (int tq = 0; tq < 4; ++tq) {
                const int64_t o = gx_goff(s, ks * 8 + half * 4 + tq, gp, gps, gcs);
                for (int g = 0; g < 8; ++g) /* the four runs are distinct addresses */
                    worst = std::max(worst, ++per_bank[(o + g) & 31]);
            }
            total += worst;
        }
    return total;
}

static GradXMma grad_x_mma_tiling_at(const Shape &s, int xw)
{
    GradXMma t{};
    const int64_t taps = s.k_d * s.k_h * s.k_w;
    t.xw = xw;
    t.ksteps = (int)taps; /* GM_CC * taps / 8 */
    t.gd = (int)(GM_XD + s.k_d - 1), t.gh = (int)(GM_XH + s.k_h - 1), t.gw = (int)(xw + s.k_w - 1);
    if (taps > 4096 || t.gw > 4096)
        return t;
    const int64_t key[8] = {1, s.k_d, s.k_h, s.k_w, xw, 0, 0, 0};
    PadStrides st;
    if (!stride_cache_find(key, st)) {
        std::copy(key, key + 8, st.key);
        st.pitch = argmin_pad(t.gw, 1, [&](int p) { return gx_conflicts(s, t.ksteps, p, t.gh * p, t.gd * t.gh * p); });
        st.ps = argmin_pad(t.gh * st.pitch, 1, [&](int ps) { return gx_conflicts(s, t.ksteps, st.pitch, ps, t.gd * ps); });
        st.cs = argmin_pad(t.gd * st.ps, 1, [&](int cs) { return gx_conflicts(s, t.ksteps, st.pitch, st.ps, cs); });
        stride_cache_put(st);
    }
    t.gp = st.pitch, t.gps = st.ps, t.gcs = st.cs;
    t.region = GM_CC * t.gcs; /* a multiple of 8: the uint4 zeroing stays inside it */
    /* G, then the B fragments (uint4 per k-step and lane), the offsets (int2 per k-step and tq),
     * the weight index of each k (int), the chunk's S split (2 floats and an int a channel). */
    const int64_t bytes = 4 * (int64_t)t.region + 16 * (int64_t)t.ksteps * 32 + 8 * (int64_t)t.ksteps * 4 +
                          4 * (int64_t)t.ksteps * 8 + 12 * GM_CC;
    if (bytes > GM_SMEM)
        return t;
    t.smem = (int)bytes;
    t.n_td = ceil_div(s.in_d, GM_XD), t.n_th = ceil_div(s.in_h, GM_XH), t.n_tw = ceil_div(s.in_w, xw);
    t.cchunks = ceil_div(s.cout, GM_CC), t.cichunks = ceil_div(s.cin, 8);
    t.ok = s.batch * t.n_td * t.n_th * t.n_tw * t.cichunks <= 0x7fffffff;
    return t;
}

/* The grad_x tilings' tile width: 64 columns, unless x is at most 32 wide (half of each tile
 * would idle) or their region does not fit two blocks an SM; else 32 columns. */
template <typename Tiling>
static Tiling grad_x_tile_width(const Shape &s, int smem_optin, Tiling (*at)(const Shape &, int))
{
    if (s.in_w > 32) {
        const Tiling t = at(s, 64);
        if (t.ok && t.smem <= smem_optin)
            return t;
    }
    Tiling t = at(s, 32);
    t.ok = t.ok && t.smem <= smem_optin;
    return t;
}

/* Not ok: the gather kernel. */
static GradXMma grad_x_mma_tiling(const Shape &s, int smem_optin)
{
    return grad_x_tile_width(s, smem_optin, grad_x_mma_tiling_at);
}

/* S = a * m with a a power of two (exact in TF32) and |m| in [1, 2): the staged one-hot G holds
 * a, the weights side m * w in two TF32 halves, so a product keeps FP32's precision (the grad_x
 * FP32 eager computes; TF32 rounding of S itself gave errors of 4e-4). S zero, subnormal or not
 * finite is not split: a = S and m = 1, and the caller drops the weights' low half (inf * lo
 * terms of opposite sign would make NaN where S * w is inf). */
__device__ __forceinline__ bool split_scale(float S, float &a, float &m)
{
    const uint32_t bits = __float_as_uint(S), e = bits & 0x7f800000u;
    if (e == 0u || e == 0x7f800000u) {
        a = S, m = 1.0f;
        return false;
    }
    a = __uint_as_float(e);
    m = __uint_as_float((bits & 0x807fffffu) | 0x3f800000u);
    return true;
}

template <int XW>
__global__ void __launch_bounds__(GM_THREADS, 2)
grad_x_mma_kernel(const BwParams P, const GradXMma T, const float *__restrict__ w, const void *__restrict__ codes,
                  int code_bytes, const float *__restrict__ gp, const float *__restrict__ go,
                  float *__restrict__ grad_x, const Gate gate)
{
    constexpr int MT = XW / 16;
    extern __shared__ __align__(16) float tile_smem[];
    if (gate_closed(gate))
        return;
    const Shape &s = P.s;
    uint32_t *gs = reinterpret_cast<uint32_t *>(tile_smem);
    uint4 *bs = reinterpret_cast<uint4 *>(gs + T.region); /* region: a multiple of 8 floats */
    int2 *ks_off = reinterpret_cast<int2 *>(bs + T.ksteps * 32);
    int *wtab = reinterpret_cast<int *>(ks_off + T.ksteps * 4); /* k -> (cl << 16) | tap */
    float *s_a = reinterpret_cast<float *>(wtab + T.ksteps * 8), *s_m = s_a + GM_CC; /* the chunk's S split */
    int *s_split = reinterpret_cast<int *>(s_m + GM_CC);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;

    const int64_t cic = blockIdx.x % T.cichunks;
    const TileIdx ti = tile_of(blockIdx.x / T.cichunks, T.n_td, T.n_th, T.n_tw);
    const int td_i = ti.td, th_i = ti.th, tw_i = ti.tw;
    const int64_t b = ti.b;
    const int xd0 = td_i * GM_XD, xh0 = th_i * GM_XH, xw0 = tw_i * XW;
    const int ci0 = (int)cic * 8;
    /* G's origin: conv position (xd0 - kd + 1, xh0 - kh + 1, xw0 - kw + 1). */
    const int od0 = xd0 - P.kd + 1, oh0 = xh0 - P.kh + 1, ow0 = xw0 - P.kw + 1;
    const RegionWindows R = region_windows(P, od0, oh0, ow0, xd0 + GM_XD - 1, xh0 + GM_XH - 1, xw0 + XW - 1);

    /* Warp: x rows (xd0 + dl0 + r, xh0 + hl) for r < GM_ROWS; the rows share each k-step's
     * offsets and B fragment. */
    const int hl = warp % GM_XH, dl0 = (warp / GM_XH) * GM_ROWS;
    const bool row_in = xd0 + dl0 < P.in_d && xh0 + hl < P.in_h;
    const int rowbase = dl0 * T.gps + hl * T.gp + g;
    float acc[GM_ROWS][MT][4];
    zero_fragments(acc);

    /* The k-step tables, the same for every chunk: G offsets per (k-step, tq) and the weight
     * index of each k. The chunk loop's first barrier publishes them. */
    for (int i = threadIdx.x; i < T.ksteps * 8; i += GM_THREADS) {
        const int r = i % (P.kd * P.kh), q = i / (P.kd * P.kh);
        const int td = r / P.kh, th = r - td * P.kh, tw = q % P.kw, cl = q / P.kw;
        wtab[i] = (cl << 16) | ((td * P.kh + th) * P.kw + tw);
        const int o = cl * T.gcs + (P.kd - 1 - td) * T.gps + (P.kh - 1 - th) * T.gp + (P.kw - 1 - tw);
        const int ks = i >> 3, j = i & 7;
        int *e = reinterpret_cast<int *>(&ks_off[ks * 4 + (j & 3)]);
        e[j >> 2] = o;
    }

    for (int64_t c0 = 0; c0 < s.cout; c0 += GM_CC) {
        const int ncc = (int)imin(GM_CC, s.cout - c0);
        __syncthreads(); /* the previous chunk's G and tables are read */
        for (int i = threadIdx.x * 4; i < T.region; i += GM_THREADS * 4)
            *reinterpret_cast<uint4 *>(gs + i) = make_uint4(0u, 0u, 0u, 0u);
        if (threadIdx.x < ncc) {
            float a, m;
            s_split[threadIdx.x] =
                split_scale(grad_scale(P, gp, go, b, c0 + threadIdx.x), a, m);
            s_a[threadIdx.x] = a, s_m[threadIdx.x] = m;
        }
        __syncthreads();
        /* B fragments: b0 = m(c) w[c][ci0 + g][t] for k = 8 ks + tq = (c, t), b1 for k + 4;
         * high TF32 halves in .x .y, low halves in .z .w. */
        for (int i = threadIdx.x; i < T.ksteps * 32; i += GM_THREADS) {
            const int ks = i >> 5, l = i & 31, gg = l >> 2, qq = l & 3, ci = ci0 + gg;
            uint32_t hi[2], lo[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int e = wtab[ks * 8 + qq + 4 * h], cl = e >> 16;
                hi[h] = lo[h] = 0u;
                if (cl < ncc && ci < s.cin) {
                    const float v = s_m[cl] * __ldg(w + ((c0 + cl) * s.cin + ci) * (int64_t)P.taps + (e & 0xffff));
                    hi[h] = to_tf32(v);
                    if (s_split[cl] && isfinite(v))
                        lo[h] = to_tf32(v - __uint_as_float(hi[h]));
                }
            }
            bs[i] = make_uint4(hi[0], hi[1], lo[0], lo[1]);
        }
        /* S at each window's arg-max inside the region (windows are disjoint: no two writes meet). */
        for_each_argmax<GM_THREADS, GM_CC>(
            P, R, ncc, od0, oh0, ow0,
            [&](int cl, int win) { return load_code(codes, code_bytes, (b * s.cout + c0 + cl) * P.npool + win); },
            [&](int cl, int rd, int rh, int rw) {
                if ((unsigned)rd < (unsigned)T.gd && (unsigned)rh < (unsigned)T.gh && (unsigned)rw < (unsigned)T.gw)
                    gs[cl * T.gcs + rd * T.gps + rh * T.gp + rw] = __float_as_uint(s_a[cl]);
            });
        __syncthreads();
        if (!row_in)
            continue;
        for (int ks = 0; ks < T.ksteps; ++ks) {
            const int2 o = ks_off[ks * 4 + tq];
            const uint4 bb = bs[ks * 32 + lane];
            const uint32_t *pa = gs + rowbase + o.x, *pb = gs + rowbase + o.y;
#pragma unroll
            for (int r = 0; r < GM_ROWS; ++r)
#pragma unroll
                for (int mi = 0; mi < MT; ++mi) {
                    const int e = r * T.gps + mi * 16;
                    const uint32_t a[4] = {pa[e], pa[e + 8], pb[e], pb[e + 8]};
                    mma_tf32(acc[r][mi], a, bb.x, bb.y);
                    mma_tf32(acc[r][mi], a, bb.z, bb.w);
                }
        }
    }
    if (!row_in)
        return;
    const int xh = xh0 + hl;
#pragma unroll
    for (int r = 0; r < GM_ROWS; ++r)
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int xd = xd0 + dl0 + r, xw = xw0 + mi * 16 + g + (j >= 2 ? 8 : 0), ci = ci0 + 2 * tq + (j & 1);
                if (xd < P.in_d && xw < P.in_w && ci < s.cin)
                    grad_x[((b * s.cin + ci) * P.in_d + xd) * (int64_t)P.hw + xh * P.in_w + xw] = acc[r][mi][j];
            }
}

/* ---- grad_x_fold_kernel: grad_x with the weights as the A operand, kernel rows folded ----
 *
 * The same conv of the sparse G with the flipped weights as grad_x_mma_kernel, FP32-accurate the
 * same way (G holds the power of two a of S = a * m, the weights side m * w in two TF32
 * halves), with the operands swapped so that one load of G feeds KH products:
 *   D[(half, ci)][x column] += A[(half, ci)][k] * G[k][column], k = (channel, td, tw),
 * M = 16 rows: the 8 input channels' high TF32 halves, then their low halves (the two halves sum
 * in the lane that holds both, c0 + c2 and c1 + c3, at the end). The kernel row th is not in K:
 * G row r of the warp's strip feeds x row r - (KH - 1) + th for every th, each with its own A
 * fragment and into that row's accumulators, so one 64-bit load of G (a B fragment) serves KH
 * MMAs where grad_x_mma_kernel's four 32-bit loads (an A fragment) served 2.
 *
 * Block (b, GF_ROWS x-rows of 8 / (XW / 16) planes, XW columns, 8 input channels); warp (plane,
 * 16-column group) holds all GF_ROWS rows: acc[row][n-tile]. K is ordered (td, tw, channel), the
 * channel innermost. G is staged with channels c and c + 4 side by side ([pair][d][h][w][2]), so
 * a lane's b0 (k = tq) and b1 (k = tq + 4) are one 64-bit load; a pair stride of 4 or 12 (mod 16)
 * float pairs puts each half-warp's 16 loads in distinct banks. The A fragments (uint4 a lane,
 * k-step and th: hi and lo of m * w for channels tq and tq + 4, input channel g) are built once a
 * chunk into shared memory where they fit (KH <= 3: 9 k-steps x 3 x 512 B at kernel 3); for
 * KH 4 and 5 each k-step builds them in registers from the weights (L1-resident, loaded a step
 * ahead). Every sum has a fixed order (bit-identical run to run); channels past Cout stage zeros
 * and zero weights. Measured (H200, bench_gpu --backward x): docs/KERNEL_NOTES.md. */
constexpr int GF_THREADS = 256, GF_ROWS = 8, GF_CC = 8;
constexpr int GF_SMEM = 113 * 1024; /* two blocks an SM */

__host__ __device__ constexpr bool gf_a_table(int kh) { return kh <= 3; }

struct GradXFold {
    int xw, planes;             /* x columns (64 or 32) and planes a block */
    int gd, gh, gw;             /* G region extents */
    int gp, gps, gcs;           /* row pitch, plane stride, channel-pair stride (float pairs) */
    int region, atab, smem;     /* floats of G; uint4 of the A table (0: none); bytes in all */
    int64_t n_td, n_th, n_tw;   /* tiles a sample along d, h, w */
    int64_t cichunks;           /* input-channel chunks (the grid) */
    bool ok;
};

static GradXFold grad_x_fold_tiling_at(const Shape &s, int xw)
{
    GradXFold t{};
    t.xw = xw, t.planes = 8 / (xw / 16);
    if (s.k_h < 2 || s.k_h > 5 || s.k_d > 64 || s.k_w > 64)
        return t;
    t.gd = (int)(t.planes + s.k_d - 1), t.gh = (int)(GF_ROWS + s.k_h - 1), t.gw = (int)(xw + s.k_w - 1);
    t.gp = (t.gw + 1) & ~1, t.gps = t.gh * t.gp;
    /* A pair stride of 4 or 12 mod 16 pairs: lanes (g, tq) of a half-warp read pair tq, column
     * g + j, 64 bits each, from distinct banks. */
    t.gcs = t.gd * t.gps;
    while (t.gcs % 16 != 4 && t.gcs % 16 != 12)
        ++t.gcs;
    t.region = 8 * t.gcs; /* 4 pairs of 2 floats: a multiple of 32, for the uint4 zeroing */
    t.atab = gf_a_table((int)s.k_h) ? (int)(s.k_d * s.k_w * s.k_h * 32) : 0;
    const int64_t bytes = 4 * (int64_t)t.region + 16 * (int64_t)t.atab + 12 * GF_CC;
    if (bytes > GF_SMEM)
        return t;
    t.smem = (int)bytes;
    t.n_td = ceil_div(s.in_d, t.planes), t.n_th = ceil_div(s.in_h, GF_ROWS), t.n_tw = ceil_div(s.in_w, xw);
    t.cichunks = ceil_div(s.cin, 8);
    t.ok = s.batch * t.n_td * t.n_th * t.n_tw * t.cichunks <= 0x7fffffff;
    return t;
}

/* Not ok: kh outside 2..5 or no tiling fits (grad_x_mma_kernel, then the gather). */
static GradXFold grad_x_fold_tiling(const Shape &s, int smem_optin)
{
    return grad_x_tile_width(s, smem_optin, grad_x_fold_tiling_at);
}

/* A fragment entries for weights v0 (channel tq) and v1 (channel tq + 4): hi, lo, hi, lo (rows
 * g and g + 8 of columns tq and tq + 4); a low half only where S was split and v is finite. */
__device__ __forceinline__ uint4 fold_a(float v0, float v1, bool sp0, bool sp1)
{
    uint4 a;
    a.x = to_tf32(v0), a.z = to_tf32(v1);
    a.y = sp0 && isfinite(v0) ? to_tf32(v0 - __uint_as_float(a.x)) : 0u;
    a.w = sp1 && isfinite(v1) ? to_tf32(v1 - __uint_as_float(a.z)) : 0u;
    return a;
}

template <int XW, int KH>
__global__ void __launch_bounds__(GF_THREADS, 2)
grad_x_fold_kernel(const BwParams P, const GradXFold T, const float *__restrict__ w, const void *__restrict__ codes,
                   int code_bytes, const float *__restrict__ gp, const float *__restrict__ go,
                   float *__restrict__ grad_x, const Gate gate)
{
    constexpr int NT = 2, CG = XW / 16, PLANES = 8 / CG, GR = GF_ROWS + KH - 1;
    constexpr bool ATAB = gf_a_table(KH);
    extern __shared__ __align__(16) float tile_smem[];
    if (gate_closed(gate))
        return;
    const Shape &s = P.s;
    uint32_t *gs = reinterpret_cast<uint32_t *>(tile_smem);
    uint4 *at = reinterpret_cast<uint4 *>(gs + T.region); /* region: a multiple of 32 floats */
    float *s_a = reinterpret_cast<float *>(at + T.atab), *s_m = s_a + GF_CC;
    int *s_split = reinterpret_cast<int *>(s_m + GF_CC);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;

    const int64_t cic = blockIdx.x % T.cichunks;
    const TileIdx ti = tile_of(blockIdx.x / T.cichunks, T.n_td, T.n_th, T.n_tw);
    const int64_t b = ti.b;
    const int xd0 = ti.td * PLANES, xh0 = ti.th * GF_ROWS, xw0 = ti.tw * XW;
    const int ci0 = (int)cic * 8;
    /* G's origin: conv position (xd0 - kd + 1, xh0 - KH + 1, xw0 - kw + 1). */
    const int od0 = xd0 - P.kd + 1, oh0 = xh0 - KH + 1, ow0 = xw0 - P.kw + 1;
    const RegionWindows R = region_windows(P, od0, oh0, ow0, xd0 + PLANES - 1, xh0 + GF_ROWS - 1, xw0 + XW - 1);
    const int nks = P.kd * P.kw;

    const int pl = warp / CG, cg = warp % CG;
    const bool plane_in = xd0 + pl < P.in_d;
    /* Lane's B pair before the k-step's offset: pair tq, plane pl, row 0, column cg * 16 + g. */
    const uint2 *gs2 = reinterpret_cast<const uint2 *>(gs);
    const int lbase = tq * T.gcs + pl * T.gps + cg * 16 + g;
    const int ci = ci0 + g; /* the lane's A rows' input channel */
    float acc[GF_ROWS][NT][4];
    zero_fragments(acc);

    for (int64_t c0 = 0; c0 < s.cout; c0 += GF_CC) {
        const int ncc = (int)imin(GF_CC, s.cout - c0);
        __syncthreads(); /* the previous chunk's G and A table are read */
        for (int i = threadIdx.x * 4; i < T.region; i += GF_THREADS * 4)
            *reinterpret_cast<uint4 *>(gs + i) = make_uint4(0u, 0u, 0u, 0u);
        if (threadIdx.x < GF_CC) {
            float a = 0.0f, m = 0.0f;
            bool sp = false;
            if ((int)threadIdx.x < ncc)
                sp = split_scale(grad_scale(P, gp, go, b, c0 + threadIdx.x), a, m);
            s_split[threadIdx.x] = sp, s_a[threadIdx.x] = a, s_m[threadIdx.x] = m;
        }
        __syncthreads();
        /* S at each window's arg-max inside the region (windows are disjoint: no two writes meet). */
        for_each_argmax<GF_THREADS, GF_CC>(
            P, R, ncc, od0, oh0, ow0,
            [&](int cl, int win) { return load_code(codes, code_bytes, (b * s.cout + c0 + cl) * P.npool + win); },
            [&](int cl, int rd, int rh, int rw) {
                if ((unsigned)rd < (unsigned)T.gd && (unsigned)rh < (unsigned)T.gh && (unsigned)rw < (unsigned)T.gw)
                    gs[((cl & 3) * T.gcs + rd * T.gps + rh * T.gp + rw) * 2 + (cl >> 2)] = __float_as_uint(s_a[cl]);
            });
        /* A fragments: entry (ks, th, lane) for k-step ks = td * kw + tw. */
        if (ATAB) {
            for (int i = threadIdx.x; i < T.atab; i += GF_THREADS) {
                const int l = i & 31, q = i >> 5, th = q % KH, ks = q / KH, td = ks / P.kw, tw = ks - td * P.kw;
                const int lq = l & 3, lci = ci0 + (l >> 2), t = (td * KH + th) * P.kw + tw;
                float v0 = 0.0f, v1 = 0.0f;
                if (lci < s.cin) {
                    if (lq < ncc)
                        v0 = s_m[lq] * __ldg(w + ((c0 + lq) * s.cin + lci) * (int64_t)P.taps + t);
                    if (lq + 4 < ncc)
                        v1 = s_m[lq + 4] * __ldg(w + ((c0 + lq + 4) * s.cin + lci) * (int64_t)P.taps + t);
                }
                at[i] = fold_a(v0, v1, s_split[lq] != 0, s_split[lq + 4] != 0);
            }
        }
        __syncthreads();
        if (!plane_in)
            continue;
        /* KH > 3: this lane's weights for channels tq and tq + 4 (null rows: zeros), a step ahead. */
        const float m0 = s_m[tq], m1 = s_m[tq + 4];
        const bool sp0 = s_split[tq] != 0, sp1 = s_split[tq + 4] != 0;
        const bool in0 = tq < ncc && ci < s.cin, in1 = tq + 4 < ncc && ci < s.cin;
        const float *w0 = w + ((c0 + tq) * s.cin + ci) * (int64_t)P.taps;
        const float *w1 = w0 + 4 * s.cin * (int64_t)P.taps;
        float nv0[KH], nv1[KH];
        const auto load_w = [&](int td, int tw) {
#pragma unroll
            for (int th = 0; th < KH; ++th) {
                const int t = (td * KH + th) * P.kw + tw;
                nv0[th] = in0 ? __ldg(w0 + t) : 0.0f;
                nv1[th] = in1 ? __ldg(w1 + t) : 0.0f;
            }
        };
        if (!ATAB)
            load_w(0, 0);
        for (int ks = 0, td = 0, tw = 0; ks < nks; ++ks) {
            uint4 a[KH];
            if (ATAB) {
#pragma unroll
                for (int th = 0; th < KH; ++th)
                    a[th] = at[(ks * KH + th) * 32 + lane];
            } else {
#pragma unroll
                for (int th = 0; th < KH; ++th)
                    a[th] = fold_a(m0 * nv0[th], m1 * nv1[th], sp0, sp1);
            }
            const uint2 *pb = gs2 + lbase + (P.kd - 1 - td) * T.gps + (P.kw - 1 - tw);
            if (++tw == P.kw)
                tw = 0, ++td;
            if (!ATAB && ks + 1 < nks)
                load_w(td, tw);
            if (ATAB) {
                /* All of the k-step's B fragments first, then th outermost: an accumulator's
                 * next MMA is 16 MMAs after its last, past the MMA latency. */
                uint2 bb[GR][NT];
#pragma unroll
                for (int r = 0; r < GR; ++r)
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
                        bb[r][nt] = pb[r * T.gp + nt * 8];
#pragma unroll
                for (int th = 0; th < KH; ++th)
#pragma unroll
                    for (int xr = 0; xr < GF_ROWS; ++xr)
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt) {
                            const uint2 v = bb[xr + KH - 1 - th][nt];
                            mma_tf32(acc[xr][nt], a[th], v.x, v.y);
                        }
            } else {
#pragma unroll
                for (int r = 0; r < GR; ++r)
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
                        const uint2 bb = pb[r * T.gp + nt * 8];
#pragma unroll
                        for (int th = 0; th < KH; ++th) {
                            const int xr = r - (KH - 1) + th;
                            if (xr >= 0 && xr < GF_ROWS)
                                mma_tf32(acc[xr][nt], a[th], bb.x, bb.y);
                        }
                    }
            }
        }
    }
    if (!plane_in || ci >= s.cin)
        return;
    float *out = grad_x + ((b * s.cin + ci) * P.in_d + xd0 + pl) * (int64_t)P.hw;
#pragma unroll
    for (int r = 0; r < GF_ROWS; ++r) {
        const int xh = xh0 + r;
        if (xh >= P.in_h)
            break;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int xw = xw0 + cg * 16 + nt * 8 + 2 * tq;
            const float v0 = acc[r][nt][0] + acc[r][nt][2], v1 = acc[r][nt][1] + acc[r][nt][3];
            if (xw < P.in_w)
                out[xh * P.in_w + xw] = v0;
            if (xw + 1 < P.in_w)
                out[xh * P.in_w + xw + 1] = v1;
        }
    }
}

/* ---- grad_x_sm90_kernel: grad_x on Hopper's wgmma (k3p2 problems on an H100/H200) ----
 *
 * KERNEL_NOTES ("grad_x on wgmma"): grad_x is the full convolution of G (S at each arg-max)
 * with the weights, k3p2_sm90's forward with the roles turned. A block is one warpgroup; an item
 * is (b, x d-row pair, w tile of 62 x columns (64 in a row's last), chunk of x h-rows). A step makes x rows
 * (xd0 + dd, xh + hh), dd, hh in {0, 1}, from G rows (xd0 - 2 + dl, xh - 2 + hl), dl, hl in
 * 0..3, at tap (td, th) = (dd + 2 - dl, hh + 2 - hl). M = 64 G columns from xw0 - 2; N = 48 =
 * tw' x 16 + half x 8 + ci with kw = 2 - tw' (so the forward's shift-add gives
 * gx[m] = sum_kw G[m - kw] w[kw]); K = the 16 channels, one wgmma.m64n48k16 float16 a (td, th).
 * Precision: in strict mode S w to ~22 bits, as grad_x_fold's two TF32 halves, with float16
 * operands (twice the tensor rate of TF32): A holds a power of two at the arg-max and 0
 * elsewhere (built from the item's codes staged in shared memory), B = the rest of S w, scaled
 * per channel into float16's range, in two float16 pieces (hi, lo: the N halves), per sample in
 * shared memory; the stores multiply by the sample's 2^E (grad_x_sm90_setup says how, and what
 * non-finite S does). In TF32 mode (ONE, since the twenty-fourth session) B is the high piece
 * alone, N = 24 (wgmma.m64n24k16): S w rounded once to float16's 11 bits, where cuDNN's TF32
 * dgrad, which Model runs in that mode at every Cin (bench/cudnn_tf32_probe.py), rounds S and w
 * to TF32's 11 bits each; half the tensor work and half of B.
 * A step runs in four quarters (dh, dlo: one G d-row each), each quarter's A built while the
 * previous quarter's wgmmas run. H200, headline batch 128: 0.437 ms; the TF32 form (K = 8
 * channels, two phases: 72 wgmma.m64n48k8 a step) ran 0.526, grad_x_fold 0.842 (KERNEL_NOTES,
 * "grad_x on wgmma"). */
namespace gx90 {
constexpr int THREADS = 128;
constexpr int TILE_X = 64, TILE_OUT = TILE_X - 2;
/* B: [td th][K half][N][8 channels] float16, N = 48 (two pieces) or 24 (ONE, TF32's one piece). */
__host__ __device__ constexpr int b_words(bool one) { return 9 * (one ? 192 : 384); }
constexpr int XCH_FLOATS = 2 * 4 * 4 * 2 * 32; /* two buffers: steps alternate, one barrier a step */
constexpr int CONST_WORDS = 48;           /* A per channel, the weights' exponents, the output scale */
constexpr int CODE_W = 32;                /* pooled columns a tile's G columns touch */
constexpr int MAX_PH = 46;                /* pooled h rows an item stages (so that ONE's 4 blocks fit an SM) */
constexpr int CODE_BYTES = 16 * 2 * MAX_PH * CODE_W;
__host__ __device__ constexpr int smem_bytes(bool one) { return 4 * (b_words(one) + XCH_FLOATS + CONST_WORDS) + CODE_BYTES; }
constexpr int SMEM = smem_bytes(false);
constexpr int64_t MAX_CHUNK = 2 * (MAX_PH - 3); /* x h-rows an item, even */
constexpr int NO_EXP = -100000;           /* a channel whose weights are all zero */
} // namespace gx90

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* 2^k for k in [-126, 127]. */
__device__ __forceinline__ float pow2(int k) { return __uint_as_float((uint32_t)(k + 127) << 23); }

/* v = m 2^e for a finite v != 0, subnormals included: returns e and sets m in [1, 2) with v's
 * sign, exactly. */
__device__ __forceinline__ int split_exponent(float v, float &m)
{
    uint32_t bits = __float_as_uint(v);
    int bias = 127;
    if ((bits & 0x7f800000u) == 0u)
        bits = __float_as_uint(v * 0x1p64f), bias += 64;
    m = __uint_as_float((bits & 0x807fffffu) | 0x3f800000u);
    return (int)((bits >> 23) & 0xffu) - bias;
}

/* grad_x_sm90_kernel's operands for sample b. With S[c] = m 2^e (m in [1, 2) with S's sign, exact,
 * subnormal S too) and k_c = 13 - floor(log2 max |w[c]|), |m w 2^k_c| < 2^15, so B = m w 2^k_c
 * fits float16 and splits into two float16 pieces, the rounding and its remainder (~22 bits, as
 * the TF32 instance's two halves); A = 2^(e - k_c - E) at the arg-max, with E = max over the
 * channels of (e - k_c) - 15 so that the largest A is 2^15, and the stores multiply by 2^E (two
 * factors: E can pass float's exponent range where the result does not). An A under 2^-14 (a
 * channel whose terms lie 2^29 below the largest channel's) is 0, so no float16 subnormal is ever
 * an operand's whole value. S zero: A is 0. S inf or NaN: A is S in float16 and B = w 2^k_c with no
 * low piece, a nonzero w kept nonzero (2^-14 with its sign), so each term is S * w's inf or NaN
 * as FP32 gives it. w is finite here (the gate). scr: 64 floats of scratch. */
template <bool ONE>
__device__ void grad_x_sm90_setup(const BwParams &P, const float *__restrict__ w, const float *__restrict__ gp,
                                      const float *__restrict__ go, int64_t b, const int *w_exp, uint32_t *abits,
                                      float *out_scale, float *scr, uint32_t *bw)
{
    const Shape &s = P.s;
    const int tid = threadIdx.x;
    if (tid < 32) {
        const int c = tid;
        const bool w_any = c < s.cout && w_exp[c] != gx90::NO_EXP;
        const int k = w_any ? 13 - w_exp[c] : 0;
        int kind = 0, xe = INT_MIN; /* kind: 0 A = 0, 1 a power of two, 2 S inf or NaN */
        float S = 0.0f, m = 1.0f;
        if (c < s.cout) {
            S = grad_scale(P, gp, go, b, c);
            if (!isfinite(S)) {
                kind = 2;
            } else if (S != 0.0f && w_any) {
                kind = 1;
                xe = split_exponent(S, m) - k;
            }
        }
        const int top = __reduce_max_sync(0xffffffffu, xe);
        const int E = top == INT_MIN ? 0 : top - 15;
        if (c < 16) {
            uint32_t a = 0u;
            if (kind == 1 && xe - E >= -14)
                a = (uint32_t)(xe - E + 15) << 10;
            else if (kind == 2)
                a = __half_as_ushort(__float2half_rn(S));
            abits[c] = a;
            const int k1 = min(k, 127);
            scr[c] = m;
            scr[16 + c] = pow2(k1);
            scr[32 + c] = pow2(k - k1);
            scr[48 + c] = (float)kind;
        }
        if (c == 0) {
            const int e1 = max(-126, min(127, E));
            out_scale[0] = pow2(e1);
            out_scale[1] = pow2(max(-126, min(127, E - e1)));
        }
    }
    __syncthreads();
    /* bw[(t, K half, n, channel pair)]: K-major, a core-matrix row 8 channels (16 bytes); n =
     * tw' 16 + piece 8 + ci, or with ONE tw' 8 + ci (the high piece alone). */
    constexpr int NN = ONE ? 24 : 48;
    for (int i = tid; i < gx90::b_words(ONE); i += gx90::THREADS) {
        const int t = i / (8 * NN), k8 = (i / (4 * NN)) % 2, n = (i / 4) % NN, pr = i % 4;
        const int twp = n / (NN / 3), half = ONE ? 0 : (n / 8) % 2, ci = n % 8, td = t / 3, th = t % 3, kw = 2 - twp;
        uint32_t word = 0u;
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
            const int c = 8 * k8 + 2 * pr + e2;
            uint32_t h = 0u;
            if (c < s.cout && ci < s.cin) {
                const float wv = __ldg(w + ((int64_t)c * s.cin + ci) * 27 + (td * 3 + th) * 3 + kw);
                const float v = scr[c] * ((wv * scr[16 + c]) * scr[32 + c]);
                const __half hi = __float2half_rn(v);
                uint32_t hb = __half_as_ushort(hi);
                if (scr[48 + c] == 2.0f) {
                    if (v != 0.0f && (hb & 0x7c00u) == 0u)
                        hb = (hb & 0x8000u) | 0x0400u;
                    h = half ? 0u : hb;
                } else {
                    h = half ? (uint32_t)__half_as_ushort(__float2half_rn(v - __half2float(hi))) : hb;
                }
            }
            word |= h << (16 * e2);
        }
        bw[i] = word;
    }
}
#endif

/* ONE runs 4 blocks an SM (128 registers, 32 B of stack spilled in the per-item set-up, not
 * in the step loop; 55 KB of shared memory with codes for 46 pooled rows): at 2 blocks an SM
 * (146 registers, codes for 64 rows, 81 KB) it was latency-bound at 1.9 warps a scheduler.
 * H200, bench_gpu --backward x, b128 0.372 -> 0.353 ms, b16 0.070 -> 0.065, b4 0.0366 ->
 * 0.0370 (twenty-eighth session). The two-piece instance (194 registers) keeps 2. */
template <bool ONE>
__global__ void __launch_bounds__(gx90::THREADS, ONE ? 4 : 2)
grad_x_sm90_kernel(const BwParams P, const float *__restrict__ w, const uint8_t *__restrict__ codes,
                   const float *__restrict__ gp, const float *__restrict__ go, float *__restrict__ grad_x,
                   int64_t n_wt, int64_t h_chunk, int64_t n_hc, int64_t n_items, const Gate gate)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace gx90;
    griddep_wait();
    if (gate_closed(gate))
        return;
    const Shape &s = P.s;
    extern __shared__ __align__(128) unsigned char smem[];
    float *bsm = reinterpret_cast<float *>(smem);
    float *xch = bsm + b_words(ONE);
    uint32_t *abits = reinterpret_cast<uint32_t *>(xch + XCH_FLOATS);
    int *w_exp = reinterpret_cast<int *>(abits + 16);          /* floor(log2 max |w[c]|), or NO_EXP */
    float *out_scale = reinterpret_cast<float *>(abits + 32); /* 2^E as two factors */
    uint8_t *cs = reinterpret_cast<uint8_t *>(abits + CONST_WORDS);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, r4 = lane >> 2, c4 = lane & 3;
    const int m0 = 16 * warp + r4, odd = r4 & 1;
    const uint32_t b_s = (uint32_t)__cvta_generic_to_shared(bsm);
    const int64_t n_pdx = (s.in_d + 1) / 2;
    {
        /* Each output channel's largest weight, 8 threads a channel (w is finite: the gate). */
        const int c = tid >> 3, part = tid & 7;
        float mx = 0.0f;
        if (c < s.cout)
            for (int k = part; k < s.cin * 27; k += 8)
                mx = fmaxf(mx, fabsf(__ldg(w + (int64_t)c * s.cin * 27 + k)));
#pragma unroll
        for (int o = 1; o < 8; o <<= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float unit;
        if (part == 0)
            w_exp[c] = mx > 0.0f ? split_exponent(mx, unit) : NO_EXP;
        __syncthreads();
    }
    /* Contiguous items a block, so the per-sample B is rebuilt rarely. */
    const int64_t per = (n_items + gridDim.x - 1) / gridDim.x;
    const int64_t i0 = blockIdx.x * per, i1 = imin(n_items, i0 + per);
    int64_t cur_b = -1;
    for (int64_t item = i0; item < i1; ++item) {
        int64_t r = item;
        const int64_t hc = r % n_hc;
        r /= n_hc;
        const int64_t wt = r % n_wt;
        r /= n_wt;
        const int64_t pdx = r % n_pdx, b = r / n_pdx;
        const int64_t xd0 = 2 * pdx, xw0 = (int64_t)TILE_OUT * wt;
        const int64_t xh0 = hc * h_chunk, xh1 = imin(s.in_h, xh0 + h_chunk);
        if (b != cur_b) {
            /* A and B for sample b. The previous item's wgmmas have all completed (wait_group 0
             * in its last step). */
            __syncthreads();
            grad_x_sm90_setup<ONE>(P, w, gp, go, b, w_exp, abits, out_scale, xch, reinterpret_cast<uint32_t *>(bsm));
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncthreads();
            cur_b = b;
        }
        /* The item's codes as one-hot bytes (1 << code; 0 where there is no window, never an
         * arg-max position): [pd pdx - 1 + j][ph from xh0 / 2 - 1][pw from 31 wt - 1][16
         * channels], the channels in the order the A build reads them, 2 c4, 2 c4 + 1, 2 c4 +
         * 8, 2 c4 + 9 at bytes 4 c4 .. 4 c4 + 3, so that one 32-bit load gives a thread its 4
         * channels' bytes of a window and a shift and a mask its target's 4 bits. */
        const int64_t ph_lo = xh0 / 2 - 1, pw_lo = (int64_t)(TILE_OUT / 2) * wt - 1;
        const int nph = (int)((xh1 - xh0 + 1) / 2 + 2);
        __syncthreads(); /* the previous item's reads of cs are done */
        /* A lane a pooled column, a warp 8 of the 32 (channel, pooled d) row sets, 16 rows of
         * one set in flight (coalesced 32-byte loads, one pointer a set): the staging is
         * latency-bound, and with a load at a time, or with a division and a 64-bit index a
         * byte, it was a third of the kernel. */
        {
            const int64_t pw = pw_lo + lane;
            const bool pw_in = pw >= 0 && pw < s.pooled_w;
            /* Rows phi of the item that are pooled rows: ph = ph_lo + phi in [0, pooled_h). */
            const int phi_lo = ph_lo < 0 ? (int)-ph_lo : 0;
            const int phi_hi = (int)imin((int64_t)nph, s.pooled_h - ph_lo);
            for (int cj = warp; cj < 32; cj += 4) {
                const int c = cj >> 1;
                const int64_t pd = pdx - 1 + (cj & 1);
                const bool set_in = pw_in && c < s.cout && pd >= 0 && pd < s.pooled_d;
                const uint8_t *src = codes + ((b * s.cout + c) * s.pooled_d + pd) * (s.pooled_h * s.pooled_w) + pw;
                uint8_t *dst = cs + ((cj & 1) * MAX_PH * CODE_W + lane) * 16 + 4 * ((c & 7) >> 1) +
                               ((c & 1) | (c >> 3) << 1);
                for (int phi0 = 0; phi0 < nph; phi0 += 16) {
                    uint8_t v[16];
                    const uint8_t *row = src + (ph_lo + phi0) * s.pooled_w;
#pragma unroll
                    for (int u = 0; u < 16; ++u, row += s.pooled_w) {
                        const int phi = phi0 + u;
                        v[u] = set_in && phi >= phi_lo && phi < phi_hi ? __ldg(row) : 0xff;
                    }
#pragma unroll
                    for (int u = 0; u < 16; ++u)
                        if (phi0 + u < nph)
                            dst[(phi0 + u) * CODE_W * 16] = v[u] < 8 ? (uint8_t)(1u << v[u]) : (uint8_t)0;
                }
            }
        }
        __syncthreads();
        for (int64_t xh = xh0; xh < xh1; xh += 2) {
            const int phb = (int)((xh - xh0) / 2);
            float p[4][ONE ? 12 : 24];
            /* Four quarters (kk, dh): channels 8 kk.., G rows dl = 2 dh + {0, 1}. Each quarter's A
             * (32 registers, two buffers) is built while the previous quarter's wgmmas run; a
             * buffer is rebuilt after wait_group 1 has retired the quarter that read it. The
             * wgmmas issue in the same order as one group would (the first to reach p[q] is the
             * zero-initialising one). */
            uint32_t cur[2][4][4];
            {
                /* Quarters (dh, dlo): G d-row dl = 2 dh + dlo, all 16 channels in one k16 (a
                 * register holds channels 2 c4 + {0, 1}, or + 8 + {0, 1}). */
                const uint32_t a01 = abits[2 * c4] | abits[2 * c4 + 1] << 16;
                const uint32_t a89 = abits[2 * c4 + 8] | abits[2 * c4 + 9] << 16;
                const uint8_t *cm = cs + (m0 >> 1) * 16 + 4 * c4; /* this thread's window, channels */
#pragma unroll
                for (int qt = 0; qt < 4; ++qt) {
                    const int dh = qt >> 1, dlo = qt & 1;
                    uint32_t (&cq)[4][4] = cur[qt & 1];
                    if (qt >= 2) {
                        wg_wait<1>();
                        pin(cq);
                    }
#pragma unroll
                    for (int hl = 0; hl < 4; ++hl) {
                        /* Bit tgt of a window's byte: the conv position at this row and column is
                         * the arg-max. Each byte's bit to 0x00 / 0xff, then each pair of bytes to
                         * the two channels' halves (column m0, and m0 + 8 four windows on). */
                        const uint32_t tgt = ((dlo * 2 + (hl & 1)) * 2) + odd;
                        const uint8_t *r = cm + (dh * MAX_PH + phb + (hl >> 1)) * (CODE_W * 16);
                        const uint32_t b0 = ((*reinterpret_cast<const uint32_t *>(r) >> tgt) & 0x01010101u) * 0xffu;
                        const uint32_t b8 = ((*reinterpret_cast<const uint32_t *>(r + 64) >> tgt) & 0x01010101u) * 0xffu;
                        cq[hl][0] = __byte_perm(b0, 0u, 0x1100) & a01;
                        cq[hl][1] = __byte_perm(b8, 0u, 0x1100) & a01;
                        cq[hl][2] = __byte_perm(b0, 0u, 0x3322) & a89;
                        cq[hl][3] = __byte_perm(b8, 0u, 0x3322) & a89;
                    }
                    pin(cq);
                    wg_fence();
#pragma unroll
                    for (int hl = 0; hl < 4; ++hl)
#pragma unroll
                        for (int q = 0; q < 4; ++q) {
                            const int dl = 2 * dh + dlo;
                            const int td = (q >> 1) + 2 - dl, th = (q & 1) + 2 - hl;
                            if (td < 0 || td > 2 || th < 0 || th > 2)
                                continue;
                            if constexpr (ONE)
                                wgmma_m64n24k16_f16(p[q], cq[hl], wg_desc(b_s + (td * 3 + th) * 768, 384, 128),
                                                    !(td == 2 && th == 2));
                            else
                                wgmma_m64n48k16_f16(p[q], cq[hl], wg_desc(b_s + (td * 3 + th) * 1536, 768, 128),
                                                    !(td == 2 && th == 2));
                        }
                    wg_commit();
                    pin(cq);
                }
            }
            wg_wait_all();
            pin(cur);
            pin(p);
            float y[4][8];
            /* Step n + 2 writes this buffer again only after the barrier inside step n + 1's
             * shift-add, which every warp reaches after its reads of it here. */
            fold_shift_add<ONE ? 1 : 2>(p, y, xch + (phb & 1) * (XCH_FLOATS / 2), warp, lane);
            const float f1 = out_scale[0], f2 = out_scale[1];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int64_t xd = xd0 + (q >> 1), xr = xh + (q & 1);
                if (xd >= s.in_d || xr >= s.in_h)
                    continue;
#pragma unroll
                for (int h8 = 0; h8 < 2; ++h8) {
                    /* Columns 62 and 63 need G columns xw0 + 62 and + 63, which the shift-add
                     * takes as zeros: right only where they lie past the conv output, i.e. in
                     * the row's last tile. */
                    const int m = m0 + 8 * h8;
                    if ((m >= TILE_OUT && xw0 + TILE_X < s.in_w) || xw0 + m >= s.in_w)
                        continue;
#pragma unroll
                    for (int ec = 0; ec < 2; ++ec) {
                        const int ci = 2 * c4 + ec;
                        if (ci < s.cin)
                            grad_x[((b * s.cin + ci) * s.in_d + xd) * (int64_t)P.hw + xr * s.in_w + xw0 + m] =
                                (ONE ? y[q][2 * h8 + ec] : y[q][2 * h8 + ec] + y[q][4 + 2 * h8 + ec]) * f1 * f2;
                    }
                }
            }
        }
    }
#else
    (void)P, (void)w, (void)codes, (void)gp, (void)go, (void)n_wt, (void)h_chunk, (void)n_hc, (void)gate;
    /* Not sm_90a code: never launched, and loud if it ever runs. */
    for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x)
        if (threadIdx.x == 0)
            grad_x[0] = __int_as_float(0x7fffffff);
#endif
}

/* ---- weight_sm90_kernel: grad_weight on Hopper's wgmma (k3p2 problems on an H100/H200) ----
 *
 * KERNEL_NOTES ("grad_weight on wgmma"): per conv row (qd, qh) of a sample and tap depth td,
 *   D_td[(tw, c)][(th, ci)] += sum over x columns q of A[(tw, c)][q] B_td[q][(th, ci)],
 * A = onehot_c(qd, qh, q - tw) (1 where conv position q - tw is its window's arg-max in channel
 * c; built in registers from 16-bit channel masks, or in the float16 instance up to 64 columns
 * loaded from the E/O one-hot copies, see wg90::CPAD), B_td = x[ci][qd + td][qh + th][q] (TF32-
 * rounded in shared memory). The sum over q is sum over p of onehot_c(p) x[ci][p + (td, th,
 * tw)]: grad_weight's own, with no per-tap gather. M = 64 rows (tw = warp, c = 16 channels; the
 * fourth warp's rows are zero or discarded), N = 24, K = 8 x columns: a k-step is one
 * wgmma.m64n24k8 per td into its own accumulator (3 x 12 floats a thread), all three on the same A. B is K-major
 * because x is staged as [row (hh, slot)][q / 4][ci: 8][4 floats]: a core matrix is 8 channels x
 * 4 columns of one x row (128 B), the next 4 columns are 128 B on (LBO), and N's core matrices
 * th = 0, 1, 2 are the rows (qh + th, slot of plane qd + td), 3 rows apart (SBO).
 *
 * The planes live in a ring: x plane d in slot d % 3. A block is one warpgroup and takes a
 * contiguous share z of sample b's units (a conv d-row and up to HC of its conv h-rows), walked
 * d fastest inside an h chunk, so a unit after the one above it stages only its third plane
 * (the first of a chunk stages three). The accumulators sum all of the block's units, then it
 * writes S times the sums as partial[b * nz + z][c][k], weight_mma_kernel's layout, which
 * weight_reduce_kernel sums in a fixed order: bit-identical run to run. A conv row's wgmmas go
 * in groups of 4 k-steps (32 columns), each group's A built while the previous group's wgmmas
 * run. Served: kernel 3, pool 2, Cin <= 8, Cout <= 16, 1-byte codes, W a multiple of 4 up to
 * 128, x 16-byte aligned, finite x (gate). TF32, and strict as SPLIT: x staged twice, its TF32
 * rounding and the rounding of the remainder (x to ~22 bits, as weight_mma's SPLIT), each
 * k-step's wgmmas issued on both into the same accumulators (A, 0 or 1, is exact).
 * Where the units' planes and rows cover all of x (even conv depth and height, so no pool
 * remainder leaves x rows unstaged), the kernel is also x's inf/NaN check (nf_flags): one FFMA
 * a staged float, NF_X set at the end, and the backward skips nonfinite_kernel's pass over x
 * (0.063 ms, a read of x, at the headline b128). */
namespace wg90 {
constexpr int THREADS = 128;
constexpr int MAX_KQ = 128;                 /* x columns a row (K), a multiple of 32 */
constexpr int MASK_PAD = 8;                 /* mask words before a row's position 0 */
constexpr int HC_MAX = 8;                   /* conv rows a unit (TF32 and float16, up to 64 columns) */
/* A plane's rows a thread stages in flight at once, all of a unit's (hc + 2); the E/O
 * instance's next-plane copy holds that many and converts them in one pass. */
constexpr int PLANE_ROWS = HC_MAX + 2;
/* Shared memory for KQ columns and HC conv rows a unit: the region (SPLIT: two, the high halves
 * then the low ones), then the masks. */
__host__ __device__ constexpr int region_bytes(int kq, int hc) { return (hc + 2) * 3 * kq * 32; }
__host__ __device__ constexpr int mask_words(int kq) { return kq + 2 * MASK_PAD; }
__host__ __device__ constexpr int smem_bytes(int kq, int hc, bool split)
{
    return (split ? 2 : 1) * region_bytes(kq, hc) + hc * mask_words(kq) * 4;
}
/* The float16 instance's A operand comes from the codes, not from mask words: a unit's codes as
 * bytes, [window row][channel][CPAD + window column] (window column -1 and those past the pooled
 * width hold 0xff, no match), and for each pair of conv rows (a window row) its one-hot masks as
 * float16 pairs, two copies: E[j] = positions (2j, 2j + 1), O[j] = (2j - 1, 2j). Warps 0 and 2
 * read E (at j and j - 1), warp 1 reads O, so every A register is one aligned 32-bit load. Two
 * buffers of [conv row of the pair][E, O][channel][EO_PAD + j], EO_ROW words a channel's row
 * (4 mod 32: the lanes' loads, channels r4 and columns c4, fall in 32 distinct banks). */
constexpr int CPAD = 4;
constexpr int EO_PAD = 4;
__host__ __device__ constexpr int code_row_bytes(int kq) { return kq / 2 + CPAD; }
__host__ __device__ constexpr int eo_row_words(int kq) { return (kq / 2 + 31) / 32 * 32 + 4; }
static_assert(eo_row_words(32) >= 16 + EO_PAD && eo_row_words(64) >= 32 + EO_PAD && eo_row_words(96) >= 48 + EO_PAD &&
                  eo_row_words(128) >= 64 + EO_PAD,
              "a channel's E/O row holds its pad and kq / 2 words");
__host__ __device__ constexpr int codes_bytes(int kq, int hc) { return hc / 2 * 16 * code_row_bytes(kq); }
__host__ __device__ constexpr int eo_words(int kq) { return 2 * 2 * 2 * 16 * eo_row_words(kq); }
/* The E/O instance's next plane in flight: a unit that slides (the next conv d-row of its h
 * chunk) stages one x plane whose ring slot the unit before it is still reading, so that unit
 * copies it (cp.async, float32 as in global memory) into this buffer under its own wgmmas, and
 * the sliding unit converts it from here instead of waiting on global memory. Thread t copies
 * the 16-byte chunk of each of the plane's hc + 2 rows that it converts: [row][thread]. */
__host__ __device__ constexpr int next_plane_bytes(int hc) { return (hc + 2) * THREADS * 16; }
/* Half the region (2 bytes an element), then (EO) the codes, the E/O buffers (16-byte
 * aligned) and the next plane, or the mask words. */
__host__ __device__ constexpr int smem_bytes_f16(int kq, int hc, bool eo)
{
    return region_bytes(kq, hc) / 2 + (eo ? (codes_bytes(kq, hc) + 15) / 16 * 16 + eo_words(kq) * 4 +
                                                next_plane_bytes(hc)
                                          : hc * mask_words(kq) * 4);
}
/* The E/O form for x rows up to 64 columns (70 KB at the headline with the next plane, 3 blocks
 * an SM). At 128 columns the E/O buffers alone take 35 KB and the block 74 KB, 3 an SM, and the
 * mask-word form (39 KB, 4 an SM) ran faster (bench_gpu --backward w --batch 32 --w 128: 0.227
 * against 0.239 ms, before the next plane). */
__host__ __device__ constexpr bool f16_eo(int kq) { return kq <= 64; }
constexpr int SMEM_MAX = 112 * 1024;
} // namespace wg90

namespace wg90 {
/* The shares of a sample's units (conv d-rows of an h chunk, walked d fastest) that the blocks
 * take, balanced on an estimate of their time. A unit's cost is ROW_COST_A plus its conv rows,
 * and a unit that stages three planes (the first of an h chunk, the first of a share) costs
 * start_cost more, all in conv rows. The thirty-fifth session timed every block of the headline
 * b128 (H200, globaltimer at each block's end): with the even split by unit count (37/37/38) the
 * middle share, which starts inside an h chunk and so stages three planes four times, ran
 * 262 us (median) and the last, whose units include the chunk of 6 rows, 245. Fitted to the
 * three shares' medians and to SMs whose three blocks ran the same share: a unit ~1.6 us + 0.6
 * us a row, a start 7-10 us (START_ROWS 15 rows; 11 measured the same). share_cost packs
 * ROW_COST_A (bits 0-7) and the start cost (bits 8-23); 0 keeps the even split. Measured and
 * dropped the same session: an L2 prefetch of a start's planes and codes one unit ahead (no
 * change: the start's cost is not HBM latency), and rotating the shares by wave so that an SM's
 * three blocks hold different shares (the GPU's placement is not round robin by block index). */
constexpr int ROW_COST_A = 3, START_ROWS = 15;
/* The cost of units [0, u) of a sample: cd units a chunk, chunks of hc rows (the last of what is
 * left of ch), each chunk's first unit a start. A sample's units and rows fit in 32 bits
 * (backward_fits), the costs are 64-bit. */
inline int64_t units_cost(int u, int cd, int hc, int ch, int64_t a, int64_t pn)
{
    const int k = u / cd, r = u - k * cd;
    const int full = k * (int64_t)hc < ch ? k * hc : ch, left = ch - full, nr = left < hc ? left : hc;
    return k * (cd * a + pn) + (int64_t)cd * full + (r > 0 ? r * (a + nr) + pn : 0);
}
/* Share z's first unit (z = nz: units) under a nonzero share_cost (shares_of keeps the even
 * split for 0). Every share after the first begins with a start (a cut inside a chunk, as it
 * mostly is), so with T = (total + (nz - 1) start) / nz a share, share z begins where the cost
 * before it is nearest to z T - (z - 1) start; exact integers, and nondecreasing in z (nearest
 * points of an increasing sequence to increasing targets), so the shares tile the units. */
inline int share_start(int64_t z, int64_t nz, int units, int cd, int hc, int ch, int share_cost)
{
    if (z <= 0)
        return 0;
    if (z >= nz)
        return units;
    const int64_t a = share_cost & 0xff, pn = (share_cost >> 8) & 0xffff;
    const int64_t total = units_cost(units, cd, hc, ch, a, pn) + (nz - 1) * pn;
    const int64_t t = z * total - (z - 1) * nz * pn; /* nz x the target for units_cost */
    if (t <= 0)
        return (int)(z * units / nz);
    int lo = 0, hi = units; /* the smallest u with nz units_cost(u) >= t */
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (nz * units_cost(mid, cd, hc, ch, a, pn) >= t)
            hi = mid;
        else
            lo = mid + 1;
    }
    if (lo > 0 && t - nz * units_cost(lo - 1, cd, hc, ch, a, pn) < nz * units_cost(lo, cd, hc, ch, a, pn) - t)
        --lo;
    return lo;
}
/* The share_cost argument for nz shares of a sample's units (cd a chunk): balanced where a share
 * spans at least two chunks, the even split otherwise. The cost constants come from shares of
 * 36-39 units (headline b128), where balancing took weight_sm90 from 0.2928 to 0.2902 ms
 * (bench_gpu --backward w --batch 128, H200, three rounds; start costs 11 and 15 measured the
 * same). With shorter shares the same model ran slower than the even split: b64 (6 shares of
 * 18-19 units) 0.1666 -> 0.1684 ms, b32 0.1045 -> 0.1076, b8 0.0576 -> 0.0620. The environment
 * overrides (CONVPOOL_WG90_BALANCE=0: the even split; CONVPOOL_WG90_START_ROWS: the start cost)
 * are for A/B runs. */
inline int share_cost(int64_t units, int64_t nz, int64_t cd)
{
    const int env = env_switch("CONVPOOL_WG90_BALANCE");
    if (env == 0 || (env == -1 && units < 2 * cd * nz))
        return 0;
    return ROW_COST_A | env_int("CONVPOOL_WG90_START_ROWS", START_ROWS, 0, 0xffff) << 8;
}
/* The shares' first units as the kernel takes them: start[z] for z = 0 .. n (start[n] = units),
 * computed on the host by share_start, n = nz; n = 0: the even split, z units / nz, which the
 * kernel computes. The kernel takes it as a __grid_constant__ argument and reads its own two
 * entries from the constant bank. The thirty-fifth session's kernel ran share_start itself at
 * every block's start (out of line: inlined, the search moved the whole kernel's allocation),
 * ~800 SASS instructions of 64-bit products and a binary search ahead of the first unit; the
 * table took weight_sm90 from 0.2900-0.2909 to 0.2874-0.2886 ms (bench_gpu --backward w --batch
 * 128, H200, four rows alternating; strict 0.6494-0.6500 -> 0.6478-0.6484, b64 0.1668-0.1673 ->
 * 0.1663-0.1664, b16 unchanged; the E/O instance's registers unchanged, 167). Balanced shares
 * span two h chunks, so there are at most 64 a sample up to 1024 conv rows: more keep the even
 * split. (The unit loop's division in 32 bits rather than 64, tried beside it, moved the
 * allocations to 168 registers and ran 0.2889-0.2898.) */
constexpr int SHARES_MAX = 64;
struct Shares {
    int n;
    int start[SHARES_MAX + 1];
};
inline Shares shares_of(int64_t units, int64_t nz, int cd, int hc, int ch, int share_cost)
{
    Shares t = {};
    if (share_cost == 0 || nz > SHARES_MAX)
        return t;
    t.n = (int)nz;
    for (int64_t z = 0; z <= nz; ++z)
        t.start[z] = share_start(z, nz, (int)units, cd, hc, ch, share_cost);
    return t;
}
/* x * 0 of a staged chunk added to nf: NaN iff one of its values is inf or NaN (nf_flags). */
__device__ __forceinline__ float nf_add(float nf, const float4 &v)
{
    return fmaf(v.x, 0.0f, fmaf(v.y, 0.0f, fmaf(v.z, 0.0f, fmaf(v.w, 0.0f, nf))));
}
/* The largest |x| so far and a staged chunk's (F16's range check). */
__device__ __forceinline__ float abs_max(float mx, const float4 &v)
{
    return fmaxf(fmaxf(mx, fmaxf(fabsf(v.x), fabsf(v.y))), fmaxf(fabsf(v.z), fabsf(v.w)));
}
} // namespace wg90

/* F16: x staged as float16 (its TF32 rounding's 11 bits where |x| is in float16's normal range)
 * and the masks as float16 ones, one wgmma.m64n24k16 for 16 columns: half the wgmmas of the
 * TF32 instance. A block whose largest staged |x| is past 65504 or under 2^-9 sets NF_RANGE in
 * range_flags and its sums are void: the TF32 instance, gated on NF_RANGE, runs after it.
 * Occupancy: the mask-word instance 4 blocks an SM at 128 registers; the E/O instance, whose
 * next plane (next_plane_bytes) leaves room for 3, up to 168 registers (166, no spill: at 128
 * it spilled 42 B and ran 0.333 ms against 0.305, H200 b128 --backward w). */
template <bool SPLIT, bool F16 = false, bool EO = F16>
__global__ void __launch_bounds__(wg90::THREADS, F16 && !EO ? 4 : 3)
weight_sm90_kernel(const BwParams P, const float *__restrict__ x, const uint8_t *__restrict__ codes,
                   const float *__restrict__ gp, const float *__restrict__ go, float *__restrict__ partial, int kq,
                   int hc, int64_t nz, const __grid_constant__ wg90::Shares shares, const Gate gate,
                   unsigned *__restrict__ nf_flags,
                   unsigned *__restrict__ range_flags, const FlagWords fw)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace wg90;
    static_assert(!(SPLIT && F16), "strict grad_weight keeps TF32's two halves");
    static_assert(F16 || !EO, "the E/O form is the float16 instance's");
    griddep_wait();
    if constexpr (!F16 && !SPLIT)
        if (fw.n > 0) { /* the rerun behind the float16 instance's words (FlagWords) */
            unsigned w = 0u;
            for (int i = threadIdx.x; i < fw.n; i += THREADS)
                w |= fw.words[i];
            const bool x_bad = __syncthreads_or((int)(w & NF_X)), r_bad = __syncthreads_or((int)(w & NF_RANGE));
            if (blockIdx.x == 0 && threadIdx.x == 0)
                *fw.flags = (x_bad ? NF_X : 0u) | (r_bad ? NF_RANGE : 0u);
            for (int64_t i = blockIdx.x * (int64_t)THREADS + threadIdx.x; i < fw.mark_bytes;
                 i += (int64_t)gridDim.x * THREADS)
                fw.marks[i] = 0;
            if (!r_bad)
                return;
        }
    if (gate_closed(gate))
        return;
    __shared__ unsigned blk_max; /* F16: the block's largest staged |x|, as bits */
    if (F16 && threadIdx.x == 0)
        blk_max = 0u;
    const Shape &s = P.s;
    extern __shared__ __align__(128) unsigned char smem[];
    uint32_t *region = reinterpret_cast<uint32_t *>(smem);
    const int region_words = region_bytes(kq, hc) / 4;
    uint32_t *mask = reinterpret_cast<uint32_t *>(smem + (F16 ? region_bytes(kq, hc) / 2 : (SPLIT ? 2 : 1) * region_bytes(kq, hc)));
    /* EO: the codes and the E/O buffers (see smem_bytes_f16). */
    uint8_t *code_s = smem + region_bytes(kq, hc) / 2;
    uint32_t *eo = reinterpret_cast<uint32_t *>(code_s + (codes_bytes(kq, hc) + 15) / 16 * 16);
    float4 *next_plane = reinterpret_cast<float4 *>(eo + eo_words(kq));
    bool next_ready = false; /* EO: this unit's plane is in next_plane (copied by this thread) */
    const int cw = code_row_bytes(kq), rw = eo_row_words(kq);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, r4 = lane >> 2, c4 = lane & 3;
    const uint32_t region_s = (uint32_t)__cvta_generic_to_shared(region);
    const int qc_n = kq / 4, mw = mask_words(kq), groups = kq / 32;
    /* A staged row: kq columns x 8 channels, 4 (TF32) or 2 (F16) bytes each. */
    const uint32_t row_bytes = F16 ? (uint32_t)kq * 16u : (uint32_t)qc_n * 128u;
    const int64_t b = blockIdx.x / nz, z = blockIdx.x - b * nz;
    const int cd = 2 * P.pooled_d, ch = 2 * P.pooled_h;
    const int64_t nhc = (ch + hc - 1) / hc, units = (int64_t)cd * nhc;
    /* The mask-word float16 instance (rows past 64 columns) keeps the even split: at its 128
     * registers the call moved its allocation (16 more bytes of spill). */
    int64_t u0 = z * units / nz, u1 = (z + 1) * units / nz;
    if constexpr (!F16 || EO)
        if (shares.n != 0) {
            u0 = shares.start[z];
            u1 = shares.start[z + 1];
        }
    const float *xb = x + b * s.cin * (int64_t)P.dhw;
    const uint8_t *cb = codes + b * s.cout * (int64_t)P.npool;

    float acc[3][12]; /* [td]: D[(tw, c)][(th, ci)] */
    float nf = 0.0f;  /* x * 0 summed over the staged x: NaN iff one of them is inf or NaN */
    float mx = 0.0f;  /* F16: the largest |x| this thread staged */
#pragma unroll
    for (int td = 0; td < 3; ++td)
#pragma unroll
        for (int i = 0; i < 12; ++i)
            acc[td][i] = 0.0f;

    /* The mask words no window writes (the pad, columns past the pooled windows) stay zero; the
     * first unit's barrier orders these stores before any read. Thread (phl, pw) builds the
     * masks of window (ph0 + phl, pw) in every unit. EO: the code bytes no window writes (column
     * -1, columns past the pooled width, channels past Cout) stay 0xff and the E/O pads zero. */
    if constexpr (EO) {
        for (int i = tid; i < codes_bytes(kq, hc) / 4; i += THREADS)
            reinterpret_cast<uint32_t *>(code_s)[i] = 0xffffffffu;
        for (int i = tid; i < eo_words(kq); i += THREADS)
            eo[i] = 0u;
    } else {
        for (int i = tid; i < hc * mw; i += THREADS)
            mask[i] = 0u;
    }
    const int m_phl = tid / P.pooled_w, m_pw = tid - m_phl * P.pooled_w;
    /* Units run d fastest inside an h chunk: x plane d lives in slot d % 3 of the region, and a
     * unit after the one above it stages only its third plane. EO: unit u's h chunk and conv
     * d-row (hci, qd) are stepped along with it, and (hci_n, qd_n) are the next unit's, where
     * the others divide u by cd and the next plane's test took (u + 1) % cd, both in 64 bits
     * (nvcc tests the operands' high words and divides inline in 32 bits, else calls its 64-bit
     * routine: a test, a branch and a division each), between one unit's wgmmas and the next
     * one's staging. bench_gpu --backward w (H200, rows alternating): b128 0.2871-0.2888 -> 0.2826-
     * 0.2838 ms, b64 0.1665-0.1669 -> 0.1640-0.1642 (168 registers, no spill). ptxas's schedule
     * moves with each such change, so they were measured apart and together: the stepping
     * alone -1 us; with the block's and shares' divisions in 32 bits as well, +2.5 us without
     * the next plane's test and -4 us with it, which without them ran -0.8 us further; the
     * stepping at the loop's end instead, +1.5 us. The other instances keep their code: the
     * stepping there moved the TF32 and strict instances into 40-48 bytes of spill. */
    int hci_n = (int)(u0 / cd), qd_n = (int)(u0 - (int64_t)hci_n * cd);
    for (int64_t u = u0; u < u1; ++u) {
        int hci, qd;
        if constexpr (F16 && EO) {
            hci = hci_n, qd = qd_n;
            if (++qd_n == cd)
                qd_n = 0, ++hci_n;
        } else {
            hci = (int)(u / cd), qd = (int)(u - (int64_t)hci * cd);
        }
        const int qh0 = hci * hc;
        const int nrows = min(hc, ch - qh0);
        const bool slide = u > u0 && qd > 0;
        const int p_first = slide ? 2 : 0, np = 3 - p_first; /* planes qd + p_first ... qd + 2 */
        const int nstaged = (nrows + 2) * np;                  /* SPLIT's staging */
        wg_wait_all(); /* the previous unit's wgmmas have read the region */
        pin(acc);
        __syncthreads();
        /* The codes: thread (phl, pw) loads the 16 codes of window (ph0 + phl, pw) (coalesced
         * along pw, all in flight together). EO stores them as they are, one byte a channel; an
         * odd conv d-row after the even one above it has the same window rows, so their codes are
         * in place. (Storing them after x's rows, to wait on global memory once, held 16 more
         * registers across the x loads: at 128 registers ptxas then kept 3 of the 10 rows in
         * flight, not 10.) Otherwise the thread writes the window's 4 mask words of this conv
         * d-row: the bits of the channels whose arg-max lies there, zeros included (so no
         * clearing pass and no atomics). */
        const bool load_codes = m_phl < nrows / 2 && !(EO && slide && (qd & 1));
        uint32_t code[16]; /* EO: stored after the region's staging, which hides their latency */
        if (load_codes) {
            const uint8_t *cg = cb + ((int64_t)(qd >> 1) * P.pooled_h + (qh0 >> 1) + m_phl) * P.pooled_w + m_pw;
#pragma unroll
            for (int c = 0; c < 16; ++c)
                code[c] = c < s.cout ? cg[(int64_t)c * P.npool] : 0xffu;
            if constexpr (!EO) {
                uint32_t word[4] = {0u, 0u, 0u, 0u}; /* (oh, ow) of the window */
                const uint32_t odd = (uint32_t)(qd & 1);
#pragma unroll
                for (int c = 0; c < 16; ++c)
#pragma unroll
                    for (int q = 0; q < 4; ++q)
                        word[q] |= code[c] == 4u * odd + (uint32_t)q ? 1u << c : 0u;
                uint32_t *mr = mask + 2 * m_phl * mw + MASK_PAD + 2 * m_pw;
                *reinterpret_cast<uint2 *>(mr) = make_uint2(word[0], word[1]);
                *reinterpret_cast<uint2 *>(mr + mw) = make_uint2(word[2], word[3]);
            }
        }
        /* The region: thread (ci = tid % 8, column chunk qc = tid / 8 + 16 k) copies its chunk
         * of every staged row, so a warp's 8 consecutive lanes fill one 128-byte core-matrix row
         * set and each channel's row is read 64 bytes at a time; up to SB rows a thread in flight
         * (rows (hh, slot): plane qd + pi in slot (qd + pi) % 3, row qh0 + hh, for the unit's
         * planes pi = p_first .. 2). Columns past W and
         * channels past Cin are zeros (their products meet zero masks or are never written, but
         * must not be NaN). */
        {
            /* F16: each 16-byte chunk of 4 columns is stored as 4 float16 (8 bytes) in its half
             * of the 16-byte core-matrix row of 8 columns (a row of kq x 8 channels x 2 bytes),
             * and the largest |x| staged is kept for the range check. */
            const int ci = tid & 7, row_words = (int)(row_bytes / 4u);
            const int64_t plane = (int64_t)P.in_h * P.in_w;
            const float *xr0 = xb + ((int64_t)ci * P.in_d + qd) * plane + (int64_t)qh0 * P.in_w;
            for (int qc = tid >> 3; qc < qc_n; qc += THREADS / 8) {
                const bool in = ci < s.cin && 4 * qc < P.in_w;
                uint32_t *dst = F16 ? region + (qc >> 1) * 32 + ci * 4 + (qc & 1) * 2 : region + qc * 32 + ci * 4;
                if constexpr (SPLIT) {
                    /* Strict: the rows of all the unit's planes in one sequence, 8 in flight.
                     * The plane loop below ran its SPLIT instance at 0.790 ms against this
                     * loop's 0.689 (bench_gpu --backward w --batch 128 --precision strict,
                     * H200, same call). */
                    for (int r0 = 0; r0 < nstaged; r0 += 8) {
                        float4 v[8];
                        int row[8];
#pragma unroll
                        for (int j = 0; j < 8; ++j) {
                            const int rr = r0 + j, hh = rr / np, pi = p_first + rr - np * hh;
                            const int slot = (qd + pi) % 3;
                            row[j] = rr < nstaged ? hh * 3 + slot : -1;
                            v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                            if (in && rr < nstaged)
                                v[j] = __ldg(reinterpret_cast<const float4 *>(xr0 + pi * plane + (int64_t)hh * P.in_w + 4 * qc));
                            if (nf_flags)
                                nf = nf_add(nf, v[j]);
                        }
#pragma unroll
                        for (int j = 0; j < 8; ++j) {
                            if (row[j] < 0)
                                continue;
                            float4 lo;
                            *reinterpret_cast<uint4 *>(dst + row[j] * row_words) = WmVec<4>::round(v[j], lo);
                            *reinterpret_cast<uint4 *>(dst + region_words + row[j] * row_words) = WmVec<4>::round(lo, lo);
                        }
                    }
                } else if (EO && next_ready) {
                    /* A sliding unit's plane (pi = 2), copied by the unit before: this thread's
                     * chunks of its rows, converted as the loop below converts them (the copy
                     * zero-filled what that loop would not load). */
                    constexpr int SB = PLANE_ROWS;
                    cp_async_wait_all();
                    uint32_t *dp = dst + ((qd + 2) % 3) * row_words;
#pragma unroll
                    for (int j = 0; j < SB; ++j) {
                        if (j >= nrows + 2)
                            continue;
                        const float4 v = next_plane[j * THREADS + tid];
                        if (nf_flags)
                            nf = nf_add(nf, v);
                        mx = abs_max(mx, v);
                        *reinterpret_cast<uint2 *>(dp + j * 3 * row_words) =
                            make_uint2(pack_half2(v.x, v.y), pack_half2(v.z, v.w));
                    }
                } else {
                    /* A plane's rows, SB in flight (all of them at 8 conv rows a unit), without
                     * divisions: slot and pointer once a plane. */
                    constexpr int SB = PLANE_ROWS; /* a plane's rows at 8 conv rows a unit */
                    for (int pi = p_first; pi < 3; ++pi) {
                        const int slot = (qd + pi) % 3;
                        const float *xp = xr0 + pi * plane + 4 * qc;
                        uint32_t *dp = dst + slot * row_words;
                        for (int h0 = 0; h0 < nrows + 2; h0 += SB) {
                            float4 v[SB];
#pragma unroll
                            for (int j = 0; j < SB; ++j) {
                                const bool here = h0 + j < nrows + 2;
                                v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                                if (in && here)
                                    v[j] = __ldg(reinterpret_cast<const float4 *>(xp + (int64_t)(h0 + j) * P.in_w));
                                if (nf_flags)
                                    nf = nf_add(nf, v[j]);
                                if constexpr (F16)
                                    mx = abs_max(mx, v[j]);
                            }
#pragma unroll
                            for (int j = 0; j < SB; ++j) {
                                if (h0 + j >= nrows + 2)
                                    continue;
                                uint32_t *d = dp + (h0 + j) * 3 * row_words;
                                if constexpr (F16) {
                                    *reinterpret_cast<uint2 *>(d) =
                                        make_uint2(pack_half2(v[j].x, v[j].y), pack_half2(v[j].z, v[j].w));
                                } else {
                                    float4 lo;
                                    *reinterpret_cast<uint4 *>(d) = WmVec<4>::round(v[j], lo);
                                }
                            }
                        }
                    }
                }
            }
        }
        if constexpr (EO) {
            if (load_codes) {
#pragma unroll
                for (int c = 0; c < 16; ++c)
                    code_s[(m_phl * 16 + c) * cw + CPAD + m_pw] = (uint8_t)code[c];
            }
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        if constexpr (EO) {
            /* The next unit slides (the next conv d-row of this h chunk: same rows, one new
             * plane, qd + 3): its plane goes into next_plane now, under this unit's wgmmas. Each
             * thread overwrites only the chunks it converted above. The E/O instance runs only
             * up to 64 columns (f16_eo), so a thread stages at most one column chunk, qc = tid /
             * 8, in the loop above and in this copy alike. */
            next_ready = false;
            if (u + 1 < u1 && qd_n != 0) { /* qd_n: the next unit's conv d-row */
                const int ci = tid & 7, qc = tid >> 3;
                if (qc < qc_n) {
                    const bool in = ci < s.cin && 4 * qc < P.in_w;
                    const float *xp = xb + ((int64_t)ci * P.in_d + qd + 3) * ((int64_t)P.in_h * P.in_w) +
                                      (int64_t)qh0 * P.in_w + 4 * qc;
                    for (int j = 0; j < nrows + 2; ++j)
                        cp_async16(next_plane + j * THREADS + tid, in ? xp + (int64_t)j * P.in_w : x, in ? 16 : 0);
                }
                cp_async_commit();
                next_ready = true;
            }
        }
        /* The conv rows' wgmmas, 4 k-steps a group (32 columns, 12 wgmmas); the next group's A
         * is built while this group's run. Groups walked as (row r, group g) without divisions. */
        const uint32_t one = 0x3f800000u;
        const auto build = [&](uint32_t (&a)[4][4], int r, int g) {
            const uint32_t *mr = mask + r * mw + MASK_PAD + 32 * g + c4 - warp;
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                const uint32_t lo = warp < 3 ? mr[8 * kk] : 0u, hi = warp < 3 ? mr[8 * kk + 4] : 0u;
                a[kk][0] = (lo >> r4) & 1u ? one : 0u;
                a[kk][1] = (lo >> (r4 + 8)) & 1u ? one : 0u;
                a[kk][2] = (hi >> r4) & 1u ? one : 0u;
                a[kk][3] = (hi >> (r4 + 8)) & 1u ? one : 0u;
            }
        };
        const int s0 = qd % 3, s1 = (qd + 1) % 3, s2 = (qd + 2) % 3;
        const auto issue = [&](uint32_t (&a)[4][4], int r, int g) {
            const uint32_t base = region_s + (uint32_t)(3 * r) * row_bytes + (uint32_t)g * 1024u;
            const uint32_t b0 = base + (uint32_t)s0 * row_bytes, b1 = base + (uint32_t)s1 * row_bytes,
                           b2 = base + (uint32_t)s2 * row_bytes;
            pin(a);
            wg_fence();
            /* The high halves' region, then (SPLIT) the low halves' right after it. */
#pragma unroll
            for (int half = 0; half < (SPLIT ? 2 : 1); ++half) {
                const uint32_t off = (uint32_t)half * 4u * (uint32_t)region_words;
#pragma unroll
                for (int kk = 0; kk < 4; ++kk) {
                    wgmma_m64n24k8(acc[0], a[kk], wg_desc(off + b0 + 256u * kk, 128u, 3 * row_bytes), 1);
                    wgmma_m64n24k8(acc[1], a[kk], wg_desc(off + b1 + 256u * kk, 128u, 3 * row_bytes), 1);
                    wgmma_m64n24k8(acc[2], a[kk], wg_desc(off + b2 + 256u * kk, 128u, 3 * row_bytes), 1);
                }
            }
            wg_commit();
            pin(a);
        };
        const auto next = [&](int &r, int &g) {
            if (++g == groups)
                g = 0, ++r;
        };
        /* Every group of the unit's rows, each group's A (two register buffers) built while the
         * previous group's wgmmas run; row_start(r) runs as the walk reaches row r > 0, before
         * it waits on the group before. */
        const auto walk = [&](auto &a0, auto &a1, const auto &build_a, const auto &issue_a, const auto &row_start) {
            int r = 0, g = 0;
            build_a(a0, 0, 0);
            while (r < nrows) {
                issue_a(a0, r, g);
                next(r, g);
                if (r >= nrows)
                    break;
                if (g == 0)
                    row_start(r);
                wg_wait<1>(); /* the group before, which read a1, is done */
                pin(a1);
                build_a(a1, r, g);
                issue_a(a1, r, g);
                next(r, g);
                if (r >= nrows)
                    break;
                if (g == 0)
                    row_start(r);
                wg_wait<1>(); /* the group before, which read a0, is done */
                pin(a0);
                build_a(a0, r, g);
            }
        };
        if constexpr (F16) {
            /* The descriptors of the three slots at row 0, column 0; a group moves the start address
             * (its field holds the address / 16, and shared addresses stay below 2^18). */
            const uint64_t d0 = wg_desc(region_s + (uint32_t)s0 * row_bytes, 128u, 3 * row_bytes),
                           d1 = wg_desc(region_s + (uint32_t)s1 * row_bytes, 128u, 3 * row_bytes),
                           d2 = wg_desc(region_s + (uint32_t)s2 * row_bytes, 128u, 3 * row_bytes);
            const auto issue16 = [&](uint32_t (&a)[2][4], int r, int g) {
                const uint64_t off = (uint64_t)(((uint32_t)(3 * r) * row_bytes + (uint32_t)g * 512u) >> 4);
                pin(a);
                wg_fence();
#pragma unroll
                for (int kk = 0; kk < 2; ++kk) {
                    wgmma_m64n24k16_f16(acc[0], a[kk], d0 + off + 16u * kk, 1);
                    wgmma_m64n24k16_f16(acc[1], a[kk], d1 + off + 16u * kk, 1);
                    wgmma_m64n24k16_f16(acc[2], a[kk], d2 + off + 16u * kk, 1);
                }
                wg_commit();
                pin(a);
            };
            if constexpr (EO) {
                /* Window row k's E/O buffer (k & 1) from its codes: thread (c, j0) writes words j0 ..
                 * j0 + 3 of channel c (and on by 32 where the row is wider), both conv rows, both
                 * copies. Position (rho, e) of the window is code 4 (qd & 1) + 2 rho + e, so the
                 * window's E word of conv row rho is 0x3c00 shifted left by 16 (code - 4 (qd & 1) -
                 * 2 rho): float16 1 in the half of the matching column, and zero (the shift past 31,
                 * or negative, so huge) where the arg-max lies elsewhere or the code is 0xff. */
                const int bc = tid >> 3;
                const uint32_t base16 = 64u * (uint32_t)(qd & 1);
                const auto build_pair = [&](int k) {
                    const uint8_t *cr = code_s + (k * 16 + bc) * cw + CPAD;
                    uint32_t *eb = eo + (k & 1) * 64 * rw + bc * rw + EO_PAD;
                    for (int j0 = 4 * (tid & 7); j0 < kq / 2; j0 += 32) {
                        const uint32_t w4 = *reinterpret_cast<const uint32_t *>(cr + j0);
                        const uint32_t t[5] = {(uint32_t)cr[j0 - 1] << 4, (w4 << 4) & 0xff0u, (w4 >> 4) & 0xff0u,
                                               (w4 >> 12) & 0xff0u, (w4 >> 20) & 0xff0u};
#pragma unroll
                        for (int rho = 0; rho < 2; ++rho) {
                            uint32_t e[5];
#pragma unroll
                            for (int i = 0; i < 5; ++i)
                                e[i] = shl_clamp(0x3c00u, t[i] - base16 - 32u * (uint32_t)rho);
                            uint32_t *er = eb + rho * 32 * rw;
                            *reinterpret_cast<uint4 *>(er + j0) = make_uint4(e[1], e[2], e[3], e[4]);
                            *reinterpret_cast<uint4 *>(er + 16 * rw + j0) =
                                make_uint4(__byte_perm(e[0], e[1], 0x5432), __byte_perm(e[1], e[2], 0x5432),
                                           __byte_perm(e[2], e[3], 0x5432), __byte_perm(e[3], e[4], 0x5432));
                        }
                    }
                };
                /* Register kk holds columns 16 kk + 2 c4 + {0, 1} (+ 8 for a[2], a[3]) of rows (tw, c)
                 * = (warp, r4) and (warp, r4 + 8), conv positions 2 j - tw + {0, 1} for j = 16 g + 8 kk
                 * + c4: E[j] for warp 0, O[j] for warp 1, E[j - 1] for warp 2 (warp 3's rows are
                 * never stored: it reads warp 0's words). */
                const uint32_t *ar = eo + (warp == 1 ? 16 * rw : 0) + r4 * rw + EO_PAD + c4 - (warp == 2);
                const auto load16 = [&](uint32_t (&a)[2][4], int r, int g) {
                    const uint32_t *ag = ar + ((r >> 1) & 1) * 64 * rw + (r & 1) * 32 * rw + 16 * g;
#pragma unroll
                    for (int kk = 0; kk < 2; ++kk) {
                        a[kk][0] = ag[8 * kk];
                        a[kk][1] = ag[8 * rw + 8 * kk];
                        a[kk][2] = ag[8 * kk + 4];
                        a[kk][3] = ag[8 * rw + 8 * kk + 4];
                    }
                };
                /* Window row k's buffer is written after every warp's loads from window row k - 2
                 * (they come before the barrier of window row k - 1 in each warp's program). */
                const auto row_start = [&](int r) {
                    if ((r & 1) == 0) {
                        build_pair(r >> 1);
                        __syncthreads();
                    }
                };
                /* Four A buffers, loaded one group ahead: group n + 1's A is loaded right after
                 * group n is issued, so the wait for older groups (wg_wait<2>) stands between
                 * those loads and group n + 1's wgmma.fence (WARPGROUP.ARRIVE, which waits for
                 * every register write in flight). The buffer they go into was group n - 3's,
                 * which that wait, at the start of step n, has seen complete; up to three groups
                 * run at once. The E/O buffers' reuse is unchanged: a group's A loads come after
                 * its window row's barrier (row_start) and before the next window row's.
                 * H200, headline b128, bench_gpu --backward w: 0.2999 -> 0.2973 ms against the
                 * three-buffer walk that loaded right before the fence (0.305 with two buffers);
                 * wg_wait<1> here ran the same. ncu still puts 8% of the stall samples on the
                 * ARRIVEs (short scoreboard): the wait returns before the loads land. 152
                 * registers then (167 since the codes are held through the staging), 3 blocks
                 * an SM. */
                const auto walk4 = [&](auto &a0, auto &a1, auto &a2, auto &a3, const auto &load_a,
                                       const auto &issue_a, const auto &row_start) {
                    int r = 0, g = 0; /* the group issued next */
                    load_a(a0, 0, 0);
                    const auto step = [&](auto &cur, auto &nxt) {
                        wg_wait<2>(); /* groups up to n - 3 are done: nxt was group n - 3's */
                        issue_a(cur, r, g);
                        next(r, g);
                        if (r >= nrows)
                            return false;
                        if (g == 0)
                            row_start(r);
                        pin(nxt);
                        load_a(nxt, r, g);
                        return true;
                    };
                    while (step(a0, a1) && step(a1, a2) && step(a2, a3) && step(a3, a0)) {
                    }
                };
                build_pair(0);
                __syncthreads();
                uint32_t a0[2][4], a1[2][4], a2[2][4], a3[2][4];
                walk4(a0, a1, a2, a3, load16, issue16, row_start);
            } else {
                /* Register kk holds columns 16 kk + 2 c4 + {0, 1} (+ 8 for a[2], a[3]) of rows (tw, c)
                 * = (warp, r4) and (warp, r4 + 8): float16 ones where the mask bit is set. */
                const uint32_t one_lo = 0x3c00u, one_hi = 0x3c000000u;
                const auto build16 = [&](uint32_t (&a)[2][4], int r, int g) {
                    const uint32_t *mr = mask + r * mw + MASK_PAD + 32 * g + 2 * c4 - warp;
#pragma unroll
                    for (int kk = 0; kk < 2; ++kk) {
                        const uint32_t *m = mr + 16 * kk;
                        const uint32_t w0 = warp < 3 ? m[0] : 0u, w1 = warp < 3 ? m[1] : 0u;
                        const uint32_t w8 = warp < 3 ? m[8] : 0u, w9 = warp < 3 ? m[9] : 0u;
                        a[kk][0] = ((w0 >> r4) & 1u ? one_lo : 0u) | ((w1 >> r4) & 1u ? one_hi : 0u);
                        a[kk][1] = ((w0 >> (r4 + 8)) & 1u ? one_lo : 0u) | ((w1 >> (r4 + 8)) & 1u ? one_hi : 0u);
                        a[kk][2] = ((w8 >> r4) & 1u ? one_lo : 0u) | ((w9 >> r4) & 1u ? one_hi : 0u);
                        a[kk][3] = ((w8 >> (r4 + 8)) & 1u ? one_lo : 0u) | ((w9 >> (r4 + 8)) & 1u ? one_hi : 0u);
                    }
                };
                uint32_t a0[2][4], a1[2][4];
                walk(a0, a1, build16, issue16, [](int) {});
            }
        } else {
            uint32_t a0[4][4], a1[4][4];
            walk(a0, a1, build, issue, [](int) {});
        }
    }
    wg_wait_all();
    pin(acc);
    griddep_trigger(); /* the gated kernel behind may take this block's slot once it ends */
    /* x held an inf or NaN: this block's sums are void, and the kernels after it in the stream
     * (the gather, weight_reduce, the 0 * inf fix-up) read NF_X as if nonfinite_kernel set it. */
    if (!(F16 && fw.words) && nf_flags && __any_sync(0xffffffffu, nf != nf) && lane == 0)
        atomicOr(nf_flags, NF_X);
    if constexpr (F16) {
        /* |x| is never negative, so the float bits order as the values (an inf too). */
        const unsigned m = __reduce_max_sync(0xffffffffu, __float_as_uint(mx));
        __syncthreads(); /* blk_max's initialisation is ordered before (also with no unit) */
        if (lane == 0)
            atomicMax(&blk_max, m);
        const bool nf_bad = fw.words && __syncthreads_or(nf != nf); /* also orders the atomicMax */
        if (!fw.words)
            __syncthreads();
        const float bm = __uint_as_float(blk_max);
        if (fw.words) {
            if (tid == 0)
                fw.words[blockIdx.x] = (nf_bad ? NF_X : 0u) | (f16_x_out_of_range(bm) ? NF_RANGE : 0u);
        } else if (tid == 0 && f16_x_out_of_range(bm)) {
            atomicOr(range_flags, NF_RANGE);
        }
    }
    /* acc[td] register 4 th + e: row 16 warp + r4 + 8 (e >> 1) = (tw, c), column 8 th + 2 c4 +
     * (e & 1) = (th, ci). */
    if (warp == 3)
        return;
    const int64_t K = s.cin * 27;
    float *out = partial + (int64_t)blockIdx.x * s.cout * K;
    /* EO: the partials stored with L2's evict_last policy, so that the x planes the blocks
     * still running stream through L2 do not push them out before weight_reduce reads them. */
    uint64_t keep = 0;
    if constexpr (EO)
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(keep));
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
        const int c = r4 + 8 * hi;
        if (c >= s.cout)
            continue;
        const float scale = grad_scale(P, gp, go, b, c);
#pragma unroll
        for (int td = 0; td < 3; ++td)
#pragma unroll
            for (int th = 0; th < 3; ++th)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int ci = 2 * c4 + e;
                    if (ci < s.cin) {
                        float *o = out + c * K + ci * 27 + td * 9 + th * 3 + warp;
                        const float v = scale * acc[td][4 * th + 2 * hi + e];
                        if constexpr (EO)
                            asm volatile("st.global.L2::cache_hint.f32 [%0], %1, %2;" ::"l"(o), "f"(v), "l"(keep)
                                         : "memory");
                        else
                            *o = v;
                    }
                }
    }
#else
    (void)P, (void)x, (void)codes, (void)gp, (void)go, (void)kq, (void)hc, (void)nz, (void)shares, (void)gate,
        (void)nf_flags, (void)range_flags, (void)fw;
    /* Not sm_90a code: never launched, and loud if it ever runs. */
    if (threadIdx.x == 0)
        partial[0] = __int_as_float(0x7fffffff);
#endif
}

/* ---- inf and NaN in x or the weights, on the device ----
 *
 * The fused kernels sum only the arg-max terms S * w and S * x; the dense backward PyTorch runs
 * also multiplies every other conv position's zero gradient by x and w, and 0 * inf = NaN.
 * With x and w finite those terms are exact zeros; otherwise they decide the answer, and only
 * in two places: grad_weight where x holds an inf or NaN, grad_x where w does (an inf or NaN
 * S is already exact: its extra terms are 0 * finite). nonfinite_kernel sets NF_X / NF_W; the
 * gathers then take the gradient (exactly the arg-max terms, in FP32, so S * inf is inf as in
 * the dense sum) and NaN goes to every output that a 0 * inf term reaches: grad_x by the kernel
 * below, grad_weight by weight_reduce_kernel from the marks of mark_w_nonfinite (made in the
 * tiled gather's launch, or by grad_w_nonfinite_kernel behind weight_partial_kernel).
 * A stored NaN is the same whatever the order: deterministic without atomics on the outputs. */
__global__ void __launch_bounds__(BW_THREADS)
nonfinite_kernel(const float *__restrict__ a, int64_t n, unsigned bit, unsigned *__restrict__ flags)
{
    bool bad = false;
    const int64_t stride = (int64_t)gridDim.x * BW_THREADS, i0 = blockIdx.x * (int64_t)BW_THREADS + threadIdx.x;
    int64_t tail = 0;
    if (reinterpret_cast<uintptr_t>(a) % 16 == 0) {
        const float4 *a4 = reinterpret_cast<const float4 *>(a);
        for (int64_t j = i0; j < n / 4; j += stride) {
            const float4 v = __ldg(a4 + j);
            bad |= !isfinite(v.x) | !isfinite(v.y) | !isfinite(v.z) | !isfinite(v.w);
        }
        tail = n / 4 * 4;
    }
    for (int64_t j = tail + i0; j < n; j += stride)
        bad |= !isfinite(__ldg(a + j));
    if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0)
        atomicOr(flags, bit);
}

/* NF_X: grad_w_nonfinite_kernel marks, in the gather's launch where it is weight_tile_kernel
 * (mark_w_nonfinite) and as its own launch behind weight_partial_kernel, and weight_reduce_kernel
 * stores NaN where marked. */
__global__ void __launch_bounds__(BW_THREADS)
grad_w_nonfinite_kernel(const BwParams P, const float *__restrict__ x, const void *__restrict__ codes, int code_bytes,
                        const float *__restrict__ gp, const float *__restrict__ go,
                        const unsigned *__restrict__ flags, uint8_t *__restrict__ nf_mask)
{
    griddep_wait();
    if (!(*flags & NF_X))
        return;
    mark_w_nonfinite(P, x, codes, code_bytes, gp, go, nf_mask, blockIdx.x, gridDim.x);
}

/* NF_W: grad_x[b][ci][o + t] = NaN for each non-finite w[c][ci][t] and each conv position o
 * that is not (b, c)'s arg-max (or has S = 0). Block per (b, c): it lists the channel's
 * non-finite weights (GF_LIST at a time), then its threads walk the conv positions. */
constexpr int GF_LIST = 1024;
__global__ void __launch_bounds__(BW_THREADS)
grad_x_nonfinite_kernel(const BwParams P, const float *__restrict__ w, const void *__restrict__ codes, int code_bytes,
                        const float *__restrict__ gp, const float *__restrict__ go,
                        const unsigned *__restrict__ flags, float *__restrict__ grad_x)
{
    __shared__ int bad_s[GF_LIST];
    __shared__ int nbad;
    griddep_wait();
    if (!(*flags & NF_W))
        return;
    const Shape &s = P.s;
    const int conv_d = P.in_d - P.kd + 1, conv_h = P.in_h - P.kh + 1, conv_w = P.in_w - P.kw + 1;
    const int64_t K = s.cin * (int64_t)P.taps, nconv = (int64_t)conv_d * conv_h * conv_w;
    for (int64_t bc = blockIdx.x; bc < s.batch * s.cout; bc += gridDim.x) {
        const int64_t b = bc / s.cout, c = bc - b * s.cout;
        const bool zero_s = grad_scale(P, gp, go, b, c) == 0.0f;
        for (int64_t k0 = 0; k0 < K; k0 += GF_LIST) {
            __syncthreads(); /* the previous list is read */
            if (threadIdx.x == 0)
                nbad = 0;
            __syncthreads();
            for (int64_t k = k0 + threadIdx.x; k < imin(K, k0 + GF_LIST); k += BW_THREADS)
                if (!isfinite(__ldg(w + c * K + k)))
                    bad_s[atomicAdd(&nbad, 1)] = (int)(k - k0);
            __syncthreads();
            const int n = nbad;
            if (n == 0)
                continue;
            for (int64_t o = threadIdx.x; o < nconv; o += BW_THREADS) {
                const int od = (int)(o / ((int64_t)conv_h * conv_w)), oh = (int)(o / conv_w % conv_h),
                          ow = (int)(o % conv_w);
                if (!zero_s && is_argmax(P, codes, code_bytes, b, c, od, oh, ow))
                    continue;
                for (int j = 0; j < n; ++j) {
                    const int64_t k = k0 + bad_s[j], ci = k / P.taps;
                    const int t = (int)(k - ci * P.taps), tw = t % P.kw, th = t / P.kw % P.kh, td = t / (P.kw * P.kh);
                    grad_x[((b * s.cin + ci) * P.in_d + od + td) * (int64_t)P.hw + (oh + th) * P.in_w + ow + tw] =
                        __int_as_float(0x7fffffff);
                }
            }
        }
    }
}

template <int XW>
static convpool_status grad_x_mma_launch(const BackwardCall &c, const BwParams &P, const GradXMma &T, const Gate &gate)
{
    static std::atomic<int> fits[MAX_DEVICES];
    int per_sm = 0;
    CP_TRY(blocks_per_sm(grad_x_mma_kernel<XW>, GM_THREADS, std::min(GM_SMEM, c.dev.smem_optin), fits, &per_sm));
    const int64_t blocks = c.s.batch * T.n_td * T.n_th * T.n_tw * T.cichunks;
    grad_x_mma_kernel<XW><<<(unsigned)blocks, GM_THREADS, T.smem, c.stream>>>(P, T, c.w, c.codes, c.code_bytes,
                                                                             c.grad_pooled, c.grad_out, c.grad_x, gate);
    CP_CUDA_TRY_LAUNCH("grad_x_mma_kernel");
    return CONVPOOL_OK;
}

template <int XW, int KH>
static convpool_status grad_x_fold_launch(const BackwardCall &c, const BwParams &P, const GradXFold &T, const Gate &gate)
{
    static std::atomic<int> fits[MAX_DEVICES];
    int per_sm = 0;
    CP_TRY(blocks_per_sm(grad_x_fold_kernel<XW, KH>, GF_THREADS, std::min(GF_SMEM, c.dev.smem_optin), fits, &per_sm));
    const int64_t blocks = c.s.batch * T.n_td * T.n_th * T.n_tw * T.cichunks;
    grad_x_fold_kernel<XW, KH><<<(unsigned)blocks, GF_THREADS, T.smem, c.stream>>>(
        P, T, c.w, c.codes, c.code_bytes, c.grad_pooled, c.grad_out, c.grad_x, gate);
    CP_CUDA_TRY_LAUNCH("grad_x_fold_kernel");
    return CONVPOOL_OK;
}

/* The instance for kh (2 to 5: grad_x_fold_tiling refuses the rest) and the tile width. */
template <int XW>
static convpool_status grad_x_fold_dispatch(const BackwardCall &c, const BwParams &P, const GradXFold &T, const Gate &gate)
{
    switch (P.kh) {
    case 2: return grad_x_fold_launch<XW, 2>(c, P, T, gate);
    case 3: return grad_x_fold_launch<XW, 3>(c, P, T, gate);
    case 4: return grad_x_fold_launch<XW, 4>(c, P, T, gate);
    default: return grad_x_fold_launch<XW, 5>(c, P, T, gate);
    }
}

/* The flags (FLAGS_BYTES), the NaN marks of grad_weight (a byte each, mark_w_nonfinite; 16-byte
 * aligned), then the partials (one per (sample, share) of the weight kernel that runs) as many
 * as either kernel may write: the tensor-core kernel falls back to the tiled one on a GPU
 * without its shared memory or for x holding an inf or NaN, so the workspace is the larger of
 * the two for any device. */
int64_t backward_weight_head_bytes(const Shape &s)
{
    return (int64_t)FLAGS_BYTES + ceil_div(s.cout * s.cin * s.k_d * s.k_h * s.k_w, (int64_t)16) * 16;
}

int64_t backward_partial_count(const Shape &s, bool strict)
{
    const WeightTiling t = weight_tiling(s);
    int64_t parts = t.ok ? s.batch * t.nz : s.batch;
    const WeightMma m = weight_mma_tiling(s, strict);
    if (m.ok)
        parts = imax(parts, s.batch * m.nz);
    return parts;
}

/* ... then a word a part (FlagWords: weight_sm90's blocks, at most the parts). */
int64_t backward_workspace_bytes(const convpool_problem &p, bool strict)
{
    const Shape s = make_shape(p);
    const int64_t parts = backward_partial_count(s, strict);
    return backward_weight_head_bytes(s) +
           parts * p.out_channels * p.in_channels * p.kernel_d * p.kernel_h * p.kernel_w * (int64_t)sizeof(float) +
           parts * (int64_t)sizeof(unsigned);
}

int64_t backward_flags_bytes() { return (int64_t)FLAGS_BYTES; }

BwParams bw_params(const Shape &s, int64_t go_stride)
{
    BwParams P;
    P.s = s;
    P.go_stride = go_stride;
    P.in_d = (int)s.in_d, P.in_h = (int)s.in_h, P.in_w = (int)s.in_w;
    P.kd = (int)s.k_d, P.kh = (int)s.k_h, P.kw = (int)s.k_w;
    P.pd = (int)s.pool_d, P.ph = (int)s.pool_h, P.pw = (int)s.pool_w;
    P.pooled_d = (int)s.pooled_d, P.pooled_h = (int)s.pooled_h, P.pooled_w = (int)s.pooled_w;
    P.hw = P.in_h * P.in_w, P.dhw = P.in_d * P.hw, P.taps = P.kd * P.kh * P.kw;
    P.npool = P.pooled_d * P.pooled_h * P.pooled_w;
    P.windows = (float)P.npool;
    P.f_pw = make_fastdiv((uint32_t)P.pw);
    P.f_phpw = make_fastdiv((uint32_t)(P.ph * P.pw));
    P.f_pooled_w = make_fastdiv((uint32_t)P.pooled_w);
    P.f_pooled_hw = make_fastdiv((uint32_t)(P.pooled_h * P.pooled_w));
    P.f_in_w = make_fastdiv((uint32_t)P.in_w);
    P.f_hw = make_fastdiv((uint32_t)P.hw);
    return P;
}

bool backward_fits(const convpool_problem &p)
{
    const int64_t lim = (int64_t)1 << 31;
    return p.in_d * p.in_h * p.in_w < lim && p.kernel_d * p.kernel_h * p.kernel_w < lim &&
           p.pool_d * p.pool_h * p.pool_w < lim;
}

/* Shares a sample's units are split into for grad_weight's tensor-core kernels, nz <= nz_max
 * (the workspace holds batch x nz_max partials): the fewest waves x units a block over the
 * resident slots, a block's first unit counted twice (weight_sm90 stages three planes for it,
 * not one; weight_mma_kernel's blocks set up and write their partials). `rows` is the grid's
 * blocks per share (batch x column passes x channel chunks). weight_sm90 at the headline b128
 * (112 units a sample, 396 slots): 3 shares, one wave of 38 units a block, where the fixed
 * split (about GW_BLOCKS blocks) gave 8 shares, 3 waves of 14 units, the last 232 blocks.
 * The split sets the order of grad_weight's float sums, so the bits follow the GPU (its SM count
 * and occupancy) as well as the problem: the same on every call on one GPU model.
 * CONVPOOL_WGRAD_BALANCE=0 keeps the fixed split (A/B and a ctest run). */
static int64_t weight_shares(int64_t rows, int64_t units, int64_t nz_max, int64_t slots)
{
    if (env_switch("CONVPOOL_WGRAD_BALANCE") == 0)
        return nz_max;
    /* The smallest nz in 1 .. min(nz_max, units) of least cost(nz) = waves x (ceil(units / nz) +
     * 1), waves = ceil(rows nz / slots), without trying every nz (up to ~1000 a call, ~8 us of
     * host time): among the nz of at most w waves the least cost is at the largest, top, and
     * the smallest nz with its ceil(units / nz) is ceil(units / ceil(units / top)). One such
     * candidate a wave count, in ascending nz, from the first w that admits nz = 1 (a few in
     * all: rows x nz_max is about GW_BLOCKS); the pick equals the exhaustive search's (checked
     * against it on 2.5 million argument sets). */
    const int64_t lim = imin(nz_max, units);
    int64_t best = nz_max, best_cost = INT64_MAX;
    for (int64_t w = ceil_div(rows, slots); lim >= 1; ++w) {
        const int64_t top = imin(lim, w * slots / rows);
        const int64_t nz = ceil_div(units, ceil_div(units, top));
        const int64_t cost = ceil_div(rows * nz, slots) * (ceil_div(units, nz) + 1);
        if (cost < best_cost)
            best = nz, best_cost = cost;
        if (top == lim)
            break;
    }
    return best;
}

template <int MT, int NT, bool SPLIT>
static convpool_status weight_mma_launch(const BackwardCall &c, const BwParams &P, WeightMma &T, const Gate &gate)
{
    static std::atomic<int> fits[MAX_DEVICES];
    static std::atomic<int64_t> resident[MAX_DEVICES];
    int per_sm = 0;
    const int smem_max = std::min(WM_SMEM, c.dev.smem_optin);
    CP_TRY((blocks_per_sm(weight_mma_kernel<MT, NT, SPLIT>, WM_THREADS, smem_max, fits, &per_sm)));
    CP_TRY((blocks_per_sm_at(weight_mma_kernel<MT, NT, SPLIT>, WM_THREADS, T.smem, resident, &per_sm)));
    T.nz = weight_shares(c.s.batch * T.passes * T.cchunks, T.units, T.nz, (int64_t)c.dev.sms * imax(1, per_sm));
    WeightMma t = T;
    t.vec = T.vec && (uintptr_t)c.x % 16 == 0;
    t.code_bytes = c.code_bytes;
    const dim3 grid((unsigned)(c.s.batch * T.nz), (unsigned)T.passes, (unsigned)T.cchunks);
    weight_mma_kernel<MT, NT, SPLIT><<<grid, WM_THREADS, T.smem, c.stream>>>(P, t, c.x, c.codes, c.grad_pooled,
                                                                           c.grad_out, c.partial_w, gate);
    CP_CUDA_TRY_LAUNCH("weight_mma_kernel");
    return CONVPOOL_OK;
}

/* The instance for a tiling: m-tiles per warp rounded up to 2, 4 or 7; one or two channel
 * n-tiles. */
template <bool SPLIT>
static convpool_status weight_mma_dispatch(const BackwardCall &c, const BwParams &P, WeightMma &T, const Gate &gate)
{
    const bool two = c.s.cout > 8;
    if (T.mtg <= 2)
        return two ? weight_mma_launch<2, 2, SPLIT>(c, P, T, gate) : weight_mma_launch<2, 1, SPLIT>(c, P, T, gate);
    if (T.mtg <= 4)
        return two ? weight_mma_launch<4, 2, SPLIT>(c, P, T, gate) : weight_mma_launch<4, 1, SPLIT>(c, P, T, gate);
    return two ? weight_mma_launch<7, 2, SPLIT>(c, P, T, gate) : weight_mma_launch<7, 1, SPLIT>(c, P, T, gate);
}

/* grad_x_sm90_kernel runs where k3p2_sm90 does: sm_90a builds on cc 9.0 GPUs, 1-byte codes,
 * kernel 3 and pool 2, Cin <= 8, Cout <= 16. CONVPOOL_GRADX_SM90: "0" keeps grad_x_fold_kernel,
 * "1" takes this kernel wherever it can run (tests and A/B benchmarks); unset, the plan takes it
 * where it beat grad_x_fold on an H200 (KERNEL_NOTES, "grad_x on wgmma"; bench_gpu --backward x,
 * fold / this kernel, ms) and Cout >= 8. Two float16 pieces (strict): at least 2^19 x positions
 * a channel (batch x D x H x W; the headline from batch 8: 0.062 / 0.057, batch 128 0.842 /
 * 0.437; batch 4 0.041 / 0.042 and batch 2 0.031 / 0.037 lose to the per-block set-up). One
 * piece (TF32 mode, twenty-fifth session): from 2^18 (headline batch 8 0.069 / 0.050, batch 4
 * 0.041 / 0.037; batch 2 0.031 / 0.033 loses). Its time hardly depends on the channels (K and N
 * are padded to 16 and 8), grad_x_fold's grows with Cout and takes 8 input channels a block
 * whatever Cin: at batch 64 Cin 8 Cout 8 0.243 / 0.227, Cin 4 Cout 16 0.418 / 0.227; Cin 3 Cout
 * 5 (16 x 9 x 21 x 133) 0.047 / 0.058 (two pieces). */
static bool grad_x_sm90_one_piece(const BackwardCall &c)
{
    return !c.strict && env_switch("CONVPOOL_GRADX_TWO_PIECES") != 1;
}

static bool grad_x_sm90_default(const Shape &s, bool one_piece)
{
    return s.batch * s.in_d * s.in_h * s.in_w >= ((int64_t)1 << (one_piece ? 18 : 19)) && s.cout >= 8;
}

/* What both sm_90a backward kernels (grad_x_sm90, weight_sm90) need: a cc 9.0 GPU (the sm_90a
 * code), 1-byte codes, kernel 3 and pool 2, Cin <= 8 and Cout <= 16 (padded to 8 and 16). */
static bool sm90_backward_shape(const BackwardCall &c)
{
    const Shape &s = c.s;
    return c.dev.cc_major == 9 && c.dev.cc_minor == 0 && c.code_bytes == 1 && s.k_d == 3 && s.k_h == 3 &&
           s.k_w == 3 && s.pool_d == 2 && s.pool_h == 2 && s.pool_w == 2 && s.cin <= 8 && s.cout <= 16;
}

static bool grad_x_sm90_wanted(const BackwardCall &c)
{
#if defined(CONVPOOL_HAVE_SM90A)
    const int env = env_switch("CONVPOOL_GRADX_SM90");
    const bool runs = sm90_backward_shape(c) && c.dev.smem_optin >= gx90::SMEM;
    return runs && (env == 1 || (env == -1 && grad_x_sm90_default(c.s, grad_x_sm90_one_piece(c))));
#else
    (void)c;
    return false;
#endif
}

/* Items are (b, x d-row pair, w tile, chunk of x h-rows). A row's h splits into n equal chunks
 * (an even number of rows, at least 8, at most MAX_CHUNK; each chunk stages its own two halo
 * rows of codes), n the least that minimises ceil(items / slots) x (steps an item + 1): the
 * items' rounds times an item's time, its code staging about one step. (It was: halve the
 * chunk while the items leave slots empty, and chunks of MAX_CHUNK and the rest past it; at H
 * 130 the equal chunks took grad_x 0.193 -> 0.105 ms, H200 b16, with the 4 blocks an SM.) */
static int64_t grad_x_sm90_chunk(const Shape &s, int64_t base_items, int64_t slots)
{
    const auto even_chunk = [&](int64_t n) { return (ceil_div(s.in_h, n) + 1) / 2 * 2; };
    const auto cost = [&](int64_t n) { return ceil_div(base_items * n, slots) * (even_chunk(n) / 2 + 1); };
    int64_t best = ceil_div(s.in_h, gx90::MAX_CHUNK);
    for (int64_t n = best; even_chunk(n) > 8; ++n)
        if (cost(n + 1) < cost(best))
            best = n + 1;
    return even_chunk(best);
}

/* The float16 pieces of S w grad_x_sm90 sums: one (ONE: S w rounded to float16's 11 bits, as
 * TF32 rounds the operands of cuDNN's TF32 dgrad; half the tensor work) in TF32 mode, two (~22
 * bits, FP32-accurate) in strict mode. CONVPOOL_GRADX_TWO_PIECES=1 keeps two in TF32 too (A/B
 * benchmarks, tests). */
template <bool ONE>
static convpool_status grad_x_sm90_launch_as(const BackwardCall &c, const BwParams &P, const Gate &gate)
{
    static std::atomic<int> fits[MAX_DEVICES];
    int per_sm = 0;
    constexpr int smem = gx90::smem_bytes(ONE);
    CP_TRY(blocks_per_sm(grad_x_sm90_kernel<ONE>, gx90::THREADS, smem, fits, &per_sm));
    const Shape &s = c.s;
    const int64_t slots = (int64_t)c.dev.sms * per_sm;
    const int64_t n_wt = s.in_w <= gx90::TILE_X ? 1 : 1 + ceil_div(s.in_w - gx90::TILE_X, (int64_t)gx90::TILE_OUT);
    const int64_t base_items = s.batch * ((s.in_d + 1) / 2) * n_wt;
    const int64_t h_chunk = grad_x_sm90_chunk(s, base_items, slots);
    const int64_t n_hc = ceil_div(s.in_h, h_chunk);
    const int64_t n_items = base_items * n_hc;
    const int64_t grid = imin(n_items, slots);
    /* Behind the gated gather and grad_x_nonfinite_kernel in the stream: a dependent launch. */
    CP_CUDA_TRY(launch_dependent(pdl_on(c.dev), grad_x_sm90_kernel<ONE>, dim3((unsigned)grid), dim3(gx90::THREADS),
                                 smem, c.stream, P, c.w, static_cast<const uint8_t *>(c.codes), c.grad_pooled,
                                 c.grad_out, c.grad_x, n_wt, h_chunk, n_hc, n_items, gate));
    return CONVPOOL_OK;
}

static convpool_status grad_x_sm90_launch(const BackwardCall &c, const BwParams &P, const Gate &gate)
{
    return grad_x_sm90_one_piece(c) ? grad_x_sm90_launch_as<true>(c, P, gate) : grad_x_sm90_launch_as<false>(c, P, gate);
}

/* weight_sm90_kernel: the k3p2 shapes on sm_90a builds and cc 9.0 GPUs, TF32 and strict (SPLIT),
 * 1-byte codes, x rows of 4 to 128 floats (a multiple of 4) and x
 * 16-byte aligned, where weight_mma's tiling is ok (its workspace holds this kernel's
 * partials: nz is at most its share count). The x columns round up to 32 (K groups of 4
 * wgmmas); units of 8 conv rows up to 64 columns, 4 beyond (SPLIT, twice the region: 4 and 2,
 * two or three blocks an SM). TF32 runs the float16 instance first (the TF32 instance behind
 * it only where x leaves float16's range). It is the default wherever it runs (H200,
 * `bench_gpu --backward w`, grad_weight with its scans and reduction, headline b128: weight_mma
 * 0.753 ms when this kernel came; now this kernel's TF32 instance 0.509 and its float16
 * instance 0.426, W 128 b128 1.003 / 0.802). CONVPOOL_WGRAD_SM90=0 keeps weight_mma (tests and A/B benchmarks). */
struct WeightSm90 {
    int kq, hc, smem;
    int64_t nz;
    bool ok;
    bool scans_x; /* the staged planes and rows are all of x: the kernel sets NF_X itself */
    int64_t units; /* a sample's units */
};

static WeightSm90 weight_sm90_plan(const BackwardCall &c, const WeightMma &TM)
{
    WeightSm90 t{};
#if defined(CONVPOOL_HAVE_SM90A)
    const int env = env_switch("CONVPOOL_WGRAD_SM90");
    const Shape &s = c.s;
    const bool runs = sm90_backward_shape(c) && s.in_w % 4 == 0 && s.in_w <= wg90::MAX_KQ &&
                      (uintptr_t)c.x % 16 == 0 && TM.ok && TM.smem <= c.dev.smem_optin;
    if (!runs || env == 0)
        return t;
    t.kq = (int)(ceil_div(s.in_w, (int64_t)32) * 32);
    t.hc = (t.kq <= 64 ? wg90::HC_MAX : wg90::HC_MAX / 2) / (c.strict ? 2 : 1); /* hc + 2 <= PLANE_ROWS */
    t.smem = wg90::smem_bytes(t.kq, t.hc, c.strict);
    t.units = 2 * s.pooled_d * ceil_div(2 * s.pooled_h, (int64_t)t.hc);
    t.nz = imax(1, imin(t.units, TM.nz)); /* at most; weight_shares picks at launch */
    /* The mask build gives each thread one window of a unit (hc / 2 pooled rows): it must
     * cover them all (at most 4 x 31 or 2 x 63 windows for the served widths). */
    t.ok = t.smem <= c.dev.smem_optin && s.batch * t.nz <= 0x7fffffff &&
           (t.hc / 2) * s.pooled_w <= wg90::THREADS;
    /* Units stage x planes 0 .. 2 pooled_d + 1 and rows 0 .. 2 pooled_h + 1, every column and
     * channel: all of x when the conv depth and height are even. */
    t.scans_x = 2 * s.pooled_d + 2 == s.in_d && 2 * s.pooled_h + 2 == s.in_h;
#else
    (void)c, (void)TM;
#endif
    return t;
}

template <bool SPLIT>
static convpool_status weight_sm90_launch(const BackwardCall &c, const BwParams &P, WeightSm90 &T,
                                          const Gate &gate, FlagWords fw = FlagWords{})
{
    static std::atomic<int> fits[MAX_DEVICES];
    static std::atomic<int64_t> resident[MAX_DEVICES];
    int per_sm = 0;
    /* Raises the kernel's shared-memory limit (and refuses a GPU it does not fit), then the
     * blocks an SM at this call's shared memory. */
    CP_TRY(blocks_per_sm(weight_sm90_kernel<SPLIT>, wg90::THREADS, wg90::SMEM_MAX, fits, &per_sm));
    CP_TRY(blocks_per_sm_at(weight_sm90_kernel<SPLIT>, wg90::THREADS, T.smem, resident, &per_sm));
    /* TF32: the float16 instance, then this instance on the same shares behind NF_RANGE (the
     * float16 one sets NF_X where it scans x; the rerun leaves NF_X as it is), so the limit
     * above is raised for the rerun. The TF32 instance alone under CONVPOOL_WGRAD_F16=0. */
    const bool f16 = !SPLIT && env_switch("CONVPOOL_WGRAD_F16") != 0;
    const bool eo = wg90::f16_eo(T.kq);
    const int smem16 = wg90::smem_bytes_f16(T.kq, T.hc, eo);
    auto *const kernel16 = eo ? weight_sm90_kernel<false, true, true> : weight_sm90_kernel<false, true, false>;
    if (f16) {
        /* Half the region: 4 blocks an SM (mask words) or 3 (E/O), so the shares split by its own. */
        static std::atomic<int> fits16[2][MAX_DEVICES];
        static std::atomic<int64_t> resident16[2][MAX_DEVICES];
        CP_TRY(blocks_per_sm(kernel16, wg90::THREADS, wg90::SMEM_MAX, fits16[eo], &per_sm));
        CP_TRY(blocks_per_sm_at(kernel16, wg90::THREADS, smem16, resident16[eo], &per_sm));
    }
    /* T.nz comes in as the workspace's share count and leaves as the one launched. */
    T.nz = weight_shares(c.s.batch, T.units, T.nz, (int64_t)c.dev.sms * imax(1, per_sm));
    const unsigned grid = (unsigned)(c.s.batch * T.nz);
    const uint8_t *codes = static_cast<const uint8_t *>(c.codes);
    const int cd = 2 * (int)c.s.pooled_d;
    const wg90::Shares sc = wg90::shares_of(T.units, T.nz, cd, T.hc, 2 * (int)c.s.pooled_h,
                                            wg90::share_cost(T.units, T.nz, cd));
    if (f16 && fw.words) {
        /* No memset ahead (FlagWords): the float16 blocks store their words, the rerun combines
         * them into the flags word and gates itself on NF_RANGE among them. */
        fw.n = (int)grid;
        CP_CUDA_TRY(launch_dependent(pdl_first(c.dev), kernel16, dim3(grid), dim3(wg90::THREADS), smem16, c.stream, P,
                                     c.x, codes, c.grad_pooled, c.grad_out, c.partial_w, T.kq, T.hc, T.nz, sc,
                                     Gate{nullptr, 0u, false}, fw.words, fw.words,
                                     FlagWords{fw.words, 0, nullptr, nullptr, 0}));
        CP_CUDA_TRY(launch_dependent(pdl_on(c.dev), weight_sm90_kernel<false>, dim3(grid), dim3(wg90::THREADS),
                                     T.smem, c.stream, P, c.x, codes, c.grad_pooled, c.grad_out, c.partial_w, T.kq,
                                     T.hc, T.nz, sc, Gate{nullptr, 0u, false}, (unsigned *)nullptr,
                                     (unsigned *)nullptr, fw));
        return CONVPOOL_OK;
    }
    if (f16) {
        kernel16<<<grid, wg90::THREADS, smem16, c.stream>>>(
            P, c.x, codes, c.grad_pooled, c.grad_out, c.partial_w, T.kq, T.hc, T.nz, sc, gate,
            T.scans_x ? c.flags : nullptr, c.flags, FlagWords{});
        CP_CUDA_TRY_LAUNCH("weight_sm90_kernel");
        CP_CUDA_TRY(launch_dependent(pdl_on(c.dev), weight_sm90_kernel<false>, dim3(grid), dim3(wg90::THREADS),
                                     T.smem, c.stream, P, c.x, codes, c.grad_pooled, c.grad_out, c.partial_w, T.kq,
                                     T.hc, T.nz, sc, Gate{c.flags, NF_RANGE, true}, (unsigned *)nullptr,
                                     (unsigned *)nullptr, FlagWords{}));
        return CONVPOOL_OK;
    }
    weight_sm90_kernel<SPLIT><<<grid, wg90::THREADS, T.smem, c.stream>>>(
        P, c.x, codes, c.grad_pooled, c.grad_out, c.partial_w, T.kq, T.hc, T.nz, sc, gate,
        T.scans_x ? c.flags : nullptr, nullptr, FlagWords{});
    CP_CUDA_TRY_LAUNCH("weight_sm90_kernel");
    return CONVPOOL_OK;
}

template <typename Code> convpool_status backward_launch(const BackwardCall &c)
{
    const BwParams P = bw_params(c.s, c.go_stride);
    const Shape &s = c.s;
    /* Refuse before any launch: UNSUPPORTED promises nothing was written. */
    const GradXTiling TX = grad_x_tiling(s);
    const int64_t gx_blocks = TX.ok ? s.batch * TX.n_td * TX.n_th * TX.n_tw : 0;
    if (c.grad_x && gx_blocks > 0x7fffffff)
        return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "grad_x needs %lld blocks", (long long)gx_blocks);
    unsigned *flags = c.flags;
    WeightMma TM = c.grad_w ? weight_mma_tiling(s, c.strict) : WeightMma{};
    const bool mma = TM.ok && TM.smem <= c.dev.smem_optin;
    WeightSm90 TW = mma ? weight_sm90_plan(c, TM) : WeightSm90{};
    /* FlagWords: where weight_sm90's float16 instance is the flags' only writer (it scans x,
     * no grad_x here), its blocks store words after the partials and the memset goes. */
    const int64_t ws_parts = backward_partial_count(s, c.strict);
    const bool words = c.grad_w && !c.grad_x && TW.ok && TW.scans_x && !c.strict &&
                       env_switch("CONVPOOL_WGRAD_F16") != 0 && s.batch * TW.nz <= ws_parts &&
                       env_switch("CONVPOOL_FLAG_WORDS") != 0;
    const int64_t total_w = s.cout * s.cin * (int64_t)P.taps;
    const FlagWords fw = words ? FlagWords{reinterpret_cast<unsigned *>(c.partial_w + ws_parts * total_w), 0, flags,
                                           c.nf_mask, backward_weight_head_bytes(s) - backward_flags_bytes()}
                               : FlagWords{};
    if ((c.grad_x || c.grad_w) && !words) {
        /* The flags word, and with grad_weight the NaN marks after it (one memset). */
        CP_CUDA_TRY(cudaMemsetAsync(flags, 0, c.grad_w ? (size_t)backward_weight_head_bytes(c.s) : sizeof(unsigned),
                                    c.stream));
        const struct {
            bool asked;
            const float *a;
            int64_t n;
            unsigned bit;
        } checks[2] = {{c.grad_w != nullptr && !(TW.ok && TW.scans_x), c.x, s.batch * s.cin * (int64_t)P.dhw, NF_X},
                       {c.grad_x != nullptr, c.w, s.cout * s.cin * (int64_t)P.taps, NF_W}};
        for (const auto &k : checks)
            if (k.asked) {
                const int64_t grid = imax(1, imin(ceil_div(k.n, 4 * BW_THREADS), (int64_t)c.dev.sms * 8));
                nonfinite_kernel<<<(unsigned)grid, BW_THREADS, 0, c.stream>>>(k.a, k.n, k.bit, flags);
                CP_CUDA_TRY_LAUNCH("nonfinite_kernel");
            }
    }
    const Gate always{nullptr, 0u, false};
    int64_t parts = s.batch, parts_nf = s.batch;
    if (c.grad_w) {
        /* The gather runs where the tensor cores cannot (gate: always) or, beside them, for x
         * holding an inf or NaN (gate: NF_X set, by nonfinite_kernel or weight_sm90_kernel). */
        const Gate gather = mma ? Gate{flags, NF_X, true} : always;
        if (TW.ok)
            CP_TRY((c.strict ? weight_sm90_launch<true>(c, P, TW, Gate{flags, NF_X, false})
                             : weight_sm90_launch<false>(c, P, TW, Gate{flags, NF_X, false}, fw)));
        else if (mma) {
            const Gate g{flags, NF_X, false};
            CP_TRY((c.strict ? weight_mma_dispatch<true>(c, P, TM, g) : weight_mma_dispatch<false>(c, P, TM, g)));
        }
        /* The gather, and the NaN marks of x's infs and NaNs (NF_X) for weight_reduce: in one
         * launch where the gather is weight_tile_kernel, else a launch each. Behind its gate
         * (the tensor cores took the finite case) the tiled gather is a resident grid striding
         * over its shares, so the launch that exits at once is one wave (1024 blocks at the
         * headline b128 took two). */
        const WeightTiling T = weight_tiling(s);
        if (T.ok) {
            parts_nf = s.batch * T.nz;
            const int64_t gx = gather.flags ? imin(parts_nf, (int64_t)c.dev.sms * 4) : parts_nf;
            const dim3 grid((unsigned)gx, (unsigned)T.passes);
            CP_CUDA_TRY(launch_dependent(pdl_on(c.dev), weight_tile_kernel<Code>, grid, dim3(BW_THREADS), T.smem,
                                         c.stream, P, T, c.x, c.codes, c.grad_pooled, c.grad_out, c.partial_w,
                                         gather, parts_nf, (const unsigned *)flags, c.nf_mask));
        } else {
            const int64_t grid = imin(s.batch * s.cout, (int64_t)c.dev.sms * 8);
            weight_partial_kernel<Code><<<(unsigned)grid, BW_THREADS, 0, c.stream>>>(
                P, c.x, c.codes, c.grad_pooled, c.grad_out, c.partial_w, gather);
            CP_CUDA_TRY_LAUNCH("weight_partial_kernel");
            const int64_t n = s.batch * s.cin * (int64_t)P.dhw;
            const int64_t grid_nf = imax(1, imin(ceil_div(n, BW_THREADS), (int64_t)c.dev.sms * 8));
            grad_w_nonfinite_kernel<<<(unsigned)grid_nf, BW_THREADS, 0, c.stream>>>(
                P, c.x, c.codes, c.code_bytes, c.grad_pooled, c.grad_out, (const unsigned *)flags, c.nf_mask);
            CP_CUDA_TRY_LAUNCH("grad_w_nonfinite_kernel");
        }
        parts = TW.ok ? s.batch * TW.nz : mma ? s.batch * TM.nz : parts_nf;
    }
    if (c.grad_w || c.grad_cb || c.grad_bias) {
        const int64_t total = s.cout * s.cin * s.k_d * s.k_h * s.k_w;
        const int64_t grid = imin(ceil_div(total, 32), (int64_t)c.dev.sms * 8);
        CP_CUDA_TRY(launch_dependent(pdl_on(c.dev) && c.grad_w, weight_reduce_kernel, dim3((unsigned)grid),
                                     dim3(RD_THREADS), 0, c.stream, P, parts, parts_nf,
                                     c.grad_w ? (const unsigned *)flags : nullptr, c.nf_mask, c.partial_w,
                                     c.grad_pooled, c.grad_out, c.grad_w, c.grad_cb, c.grad_bias));
    }
    if (c.grad_x) {
        /* The tensor cores: wgmma for the k3p2 shapes on an H100/H200, else the folded kernel
         * for kernel heights 2 to 5, else grad_x_mma_kernel; the gather only behind them (where
         * w holds an inf or NaN) or where none of them serves. The tensor-core kernel (gated
         * on NF_W clear) and the gather with its NaN stores (gated on NF_W set) never both
         * run, so the tensor-core kernel goes last: on finite w the gated launches, which
         * exit at once, run before it, and none is left on the step's critical path behind it
         * (two launches and their gaps, ~0.009 ms of the headline step on the H200). */
        const bool sm90 = grad_x_sm90_wanted(c);
        const GradXFold TF = sm90 ? GradXFold{} : grad_x_fold_tiling(s, c.dev.smem_optin);
        const GradXMma TG = sm90 || TF.ok ? GradXMma{} : grad_x_mma_tiling(s, c.dev.smem_optin);
        const Gate gather = sm90 || TF.ok || TG.ok ? Gate{flags, NF_W, true} : always;
        const Gate g{flags, NF_W, false};
        if (TX.ok) {
            /* Behind a gate (the tensor cores took the finite case) a resident grid, else a block a tile. */
            const int64_t grid = gather.flags ? imin(gx_blocks, (int64_t)c.dev.sms * 2) : gx_blocks;
            grad_x_tile_kernel<Code><<<(unsigned)grid, GXT_THREADS, TX.smem, c.stream>>>(
                P, TX, c.w, c.codes, c.grad_pooled, c.grad_out, c.grad_x, gather);
            CP_CUDA_TRY_LAUNCH("grad_x_tile_kernel");
        } else {
            const int64_t total = s.batch * s.in_d * s.in_h * s.in_w;
            const int64_t grid = imin((total + GX_THREADS - 1) / GX_THREADS, (int64_t)c.dev.sms * 32);
            grad_x_kernel<Code><<<(unsigned)grid, GX_THREADS, 0, c.stream>>>(P, c.w, c.codes, c.grad_pooled,
                                                                            c.grad_out, c.grad_x, gather);
            CP_CUDA_TRY_LAUNCH("grad_x_kernel");
        }
        const int64_t grid = imax(1, imin(s.batch * s.cout, (int64_t)c.dev.sms * 8));
        CP_CUDA_TRY(launch_dependent(pdl_on(c.dev) && TX.ok, grad_x_nonfinite_kernel, dim3((unsigned)grid),
                                     dim3(BW_THREADS), 0, c.stream, P, c.w, c.codes, c.code_bytes, c.grad_pooled,
                                     c.grad_out, (const unsigned *)flags, c.grad_x));
        if (sm90)
            CP_TRY(grad_x_sm90_launch(c, P, g));
        else if (TF.ok)
            CP_TRY(TF.xw == 64 ? grad_x_fold_dispatch<64>(c, P, TF, g) : grad_x_fold_dispatch<32>(c, P, TF, g));
        else if (TG.ok)
            CP_TRY(TG.xw == 64 ? grad_x_mma_launch<64>(c, P, TG, g) : grad_x_mma_launch<32>(c, P, TG, g));
    }
    return CONVPOOL_OK;
}

convpool_status backward_run(const BackwardCall &c)
{
    switch (c.code_bytes) {
    case 1: return backward_launch<uint8_t>(c);
    case 2: return backward_launch<uint16_t>(c);
    default: return backward_launch<uint32_t>(c);
    }
}

} // namespace convpool_cuda
