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
 * Three launches: weight_partial_kernel (a block per (b, c): the codes of a chunk of windows
 * decoded to x offsets in shared memory, then a thread per (ci, tap) sums its patch element
 * over them), weight_reduce_kernel (the partials over b in a fixed order, in double) and
 * grad_x_kernel (a thread per x position gathers from the windows whose arg-max patch covers
 * it). No atomics: the results are bit-identical run to run.
 *
 * Used by the PyTorch binding's training path for every shape the CUDA forward serves.
 */
#include "kernels.h"

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
};

/* S[b][c] as autograd forms it, in float: (G / N) / divisor. */
__device__ __forceinline__ float grad_scale(const float *gp, const float *go, int64_t b, int64_t c, int64_t cout,
                                            float windows, float divisor)
{
    const float g = (gp ? gp[b * cout + c] : 0.0f) + (go ? go[b] : 0.0f);
    return (g / windows) / divisor;
}

/* A code (raster position inside its window) as (od, oh, ow). */
__device__ __forceinline__ void decode(const BwParams &P, uint32_t code, int &od, int &oh, int &ow)
{
    od = (int)fdiv(code, P.f_phpw);
    const uint32_t r = code - (uint32_t)od * P.f_phpw.d;
    oh = (int)fdiv(r, P.f_pw);
    ow = (int)(r - (uint32_t)oh * P.f_pw.d);
}

/* Block (b, c): partial[b][c][ci * taps + t] = S[b][c] * sum over windows of x[b][ci][q* + t]. */
template <typename Code>
__global__ void __launch_bounds__(BW_THREADS)
weight_partial_kernel(const BwParams P, const float *__restrict__ x, const void *__restrict__ codes,
                      const float *__restrict__ gp, const float *__restrict__ go, float *__restrict__ partial)
{
    __shared__ int off_s[BW_WINDOWS];
    const Shape &s = P.s;
    const int64_t K = s.cin * (int64_t)P.taps;
    for (int64_t bc = blockIdx.x; bc < s.batch * s.cout; bc += gridDim.x) {
        const int64_t b = bc / s.cout, c = bc - b * s.cout;
        const float scale = grad_scale(gp, go, b, c, s.cout, P.windows, s.divisor);
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

/* grad_w[c][k] = sum over b of partial[b][c][k], in order, in double; grad_cb[c] = sum_b N S. */
__global__ void __launch_bounds__(BW_THREADS)
weight_reduce_kernel(const BwParams P, const float *__restrict__ partial, const float *__restrict__ gp,
                     const float *__restrict__ go, float *__restrict__ grad_w, float *__restrict__ grad_cb)
{
    const Shape &s = P.s;
    const int64_t K = s.cin * (int64_t)P.taps, total = s.cout * K;
    for (int64_t i = blockIdx.x * (int64_t)BW_THREADS + threadIdx.x; i < total; i += (int64_t)gridDim.x * BW_THREADS) {
        if (grad_w) {
            double acc = 0.0;
            for (int64_t b = 0; b < s.batch; ++b)
                acc += (double)partial[b * total + i];
            grad_w[i] = (float)acc;
        }
        if (grad_cb && i % K == 0) {
            const int64_t c = i / K;
            double acc = 0.0;
            for (int64_t b = 0; b < s.batch; ++b)
                acc += (double)grad_scale(gp, go, b, c, s.cout, P.windows, s.divisor);
            grad_cb[c] = (float)(acc * (double)P.npool);
        }
    }
}

/* Thread (b, p): grad_x[b][ci][p] for GX_CI input channels at a time, gathered from every
 * window whose arg-max patch covers p. */
template <typename Code>
__global__ void __launch_bounds__(GX_THREADS)
grad_x_kernel(const BwParams P, const float *__restrict__ w, const void *__restrict__ codes,
              const float *__restrict__ gp, const float *__restrict__ go, float *__restrict__ grad_x)
{
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
                const float scale = grad_scale(gp, go, b, c, s.cout, P.windows, s.divisor);
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

int64_t backward_workspace_bytes(const convpool_problem &p)
{
    return p.batch * p.out_channels * p.in_channels * p.kernel_d * p.kernel_h * p.kernel_w * (int64_t)sizeof(float);
}

BwParams bw_params(const Shape &s)
{
    BwParams P;
    P.s = s;
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

template <typename Code> convpool_status backward_launch(const BackwardCall &c)
{
    const BwParams P = bw_params(c.s);
    const Shape &s = c.s;
    if (c.grad_w) {
        const int64_t grid = imin(s.batch * s.cout, (int64_t)c.dev.sms * 8);
        weight_partial_kernel<Code><<<(unsigned)grid, BW_THREADS, 0, c.stream>>>(P, c.x, c.codes, c.grad_pooled,
                                                                                c.grad_out, c.partial_w);
        CP_CUDA_TRY_LAUNCH("weight_partial_kernel");
    }
    if (c.grad_w || c.grad_cb) {
        const int64_t total = s.cout * s.cin * s.k_d * s.k_h * s.k_w;
        const int64_t grid = imin((total + BW_THREADS - 1) / BW_THREADS, (int64_t)c.dev.sms * 8);
        weight_reduce_kernel<<<(unsigned)grid, BW_THREADS, 0, c.stream>>>(P, c.partial_w, c.grad_pooled, c.grad_out,
                                                                          c.grad_w, c.grad_cb);
        CP_CUDA_TRY_LAUNCH("weight_reduce_kernel");
    }
    if (c.grad_x) {
        const int64_t total = s.batch * s.in_d * s.in_h * s.in_w;
        const int64_t grid = imin((total + GX_THREADS - 1) / GX_THREADS, (int64_t)c.dev.sms * 32);
        grad_x_kernel<Code><<<(unsigned)grid, GX_THREADS, 0, c.stream>>>(P, c.w, c.codes, c.grad_pooled, c.grad_out,
                                                                        c.grad_x);
        CP_CUDA_TRY_LAUNCH("grad_x_kernel");
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
