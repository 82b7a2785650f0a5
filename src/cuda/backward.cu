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
constexpr int GX_CI = 8; /* input channels a grad_x thread accumulates at once */

/* S[b][c] as autograd forms it, in float: (G / N) / divisor. */
__device__ __forceinline__ float grad_scale(const float *gp, const float *go, int64_t b, int64_t c, int64_t cout,
                                            float windows, float divisor)
{
    const float g = (gp ? gp[b * cout + c] : 0.0f) + (go ? go[b] : 0.0f);
    return (g / windows) / divisor;
}

template <typename Code> __device__ __forceinline__ uint32_t code_at(const void *codes, int64_t i)
{
    return (uint32_t) static_cast<const Code *>(codes)[i];
}

/* Block (b, c): partial[b][c][ci * taps + t] = S[b][c] * sum over windows of x[b][ci][q* + t]. */
template <typename Code>
__global__ void __launch_bounds__(BW_THREADS)
weight_partial_kernel(const Shape s, const float *__restrict__ x, const void *__restrict__ codes,
                      const float *__restrict__ gp, const float *__restrict__ go, float *__restrict__ partial)
{
    __shared__ int64_t off_s[BW_WINDOWS];
    const int64_t taps = s.k_d * s.k_h * s.k_w, K = s.cin * taps;
    const int64_t npool = s.pooled_d * s.pooled_h * s.pooled_w, hw = s.in_h * s.in_w;
    const float windows = (float)npool;
    for (int64_t bc = blockIdx.x; bc < s.batch * s.cout; bc += gridDim.x) {
        const int64_t b = bc / s.cout, c = bc - b * s.cout;
        const float scale = grad_scale(gp, go, b, c, s.cout, windows, s.divisor);
        const Code *cd = static_cast<const Code *>(codes) + bc * npool;
        const float *xb = x + b * s.cin * s.in_d * hw;
        for (int64_t k0 = 0; k0 < K; k0 += BW_THREADS) {
            const int64_t k = k0 + threadIdx.x;
            int64_t toff = 0, ci = 0;
            if (k < K) {
                ci = k / taps;
                const int64_t t = k - ci * taps, tw = t % s.k_w, th = (t / s.k_w) % s.k_h, td = t / (s.k_w * s.k_h);
                toff = ci * s.in_d * hw + td * hw + th * s.in_w + tw;
            }
            float acc = 0.0f;
            for (int64_t w0 = 0; w0 < npool; w0 += BW_WINDOWS) {
                const int nwin = (int)imin(BW_WINDOWS, npool - w0);
                __syncthreads(); /* the previous chunk's offsets are read */
                for (int i = threadIdx.x; i < nwin; i += BW_THREADS) {
                    const int64_t win = w0 + i, pw = win % s.pooled_w, r = win / s.pooled_w;
                    const int64_t ph = r % s.pooled_h, pd = r / s.pooled_h;
                    const int64_t code = (int64_t)cd[win];
                    const int64_t ow = code % s.pool_w, oh = (code / s.pool_w) % s.pool_h,
                                  od = code / (s.pool_w * s.pool_h);
                    off_s[i] = (pd * s.pool_d + od) * hw + (ph * s.pool_h + oh) * s.in_w + pw * s.pool_w + ow;
                }
                __syncthreads();
                if (k < K) {
                    const float *xk = xb + toff;
#pragma unroll 4
                    for (int i = 0; i < nwin; ++i)
                        acc += __ldg(xk + off_s[i]);
                }
            }
            if (k < K)
                partial[bc * K + k] = scale * acc;
        }
    }
}

/* grad_w[c][k] = sum over b of partial[b][c][k], in order, in double; grad_cb[c] = sum_b N S. */
__global__ void __launch_bounds__(BW_THREADS)
weight_reduce_kernel(const Shape s, const float *__restrict__ partial, const float *__restrict__ gp,
                     const float *__restrict__ go, float *__restrict__ grad_w, float *__restrict__ grad_cb)
{
    const int64_t K = s.cin * s.k_d * s.k_h * s.k_w, total = s.cout * K;
    const int64_t npool = s.pooled_d * s.pooled_h * s.pooled_w;
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
                acc += (double)grad_scale(gp, go, b, c, s.cout, (float)npool, s.divisor);
            grad_cb[c] = (float)(acc * (double)npool);
        }
    }
}

/* Thread (b, p): grad_x[b][ci][p] for GX_CI input channels at a time, gathered from every
 * window whose arg-max patch covers p. */
template <typename Code>
__global__ void __launch_bounds__(GX_THREADS)
grad_x_kernel(const Shape s, const float *__restrict__ w, const void *__restrict__ codes,
              const float *__restrict__ gp, const float *__restrict__ go, float *__restrict__ grad_x)
{
    const int64_t hw = s.in_h * s.in_w, dhw = s.in_d * hw, total = s.batch * dhw;
    const int64_t taps = s.k_d * s.k_h * s.k_w, npool = s.pooled_d * s.pooled_h * s.pooled_w;
    const int64_t pd_end = s.pooled_d * s.pool_d, ph_end = s.pooled_h * s.pool_h, pw_end = s.pooled_w * s.pool_w;
    const float windows = (float)npool;
    for (int64_t i = blockIdx.x * (int64_t)GX_THREADS + threadIdx.x; i < total; i += (int64_t)gridDim.x * GX_THREADS) {
        const int64_t b = i / dhw, p = i - b * dhw;
        const int64_t xd = p / hw, xh = (p / s.in_w) % s.in_h, xw = p % s.in_w;
        /* Conv positions whose patch holds p, inside the pooled region: [lo, hi] per axis. */
        const int64_t d_lo = imax(0, xd - s.k_d + 1), d_hi = imin(xd, pd_end - 1);
        const int64_t h_lo = imax(0, xh - s.k_h + 1), h_hi = imin(xh, ph_end - 1);
        const int64_t w_lo = imax(0, xw - s.k_w + 1), w_hi = imin(xw, pw_end - 1);
        for (int64_t ci0 = 0; ci0 < s.cin; ci0 += GX_CI) {
            float acc[GX_CI];
#pragma unroll
            for (int j = 0; j < GX_CI; ++j)
                acc[j] = 0.0f;
            if (d_lo <= d_hi && h_lo <= h_hi && w_lo <= w_hi) {
                for (int64_t c = 0; c < s.cout; ++c) {
                    const float scale = grad_scale(gp, go, b, c, s.cout, windows, s.divisor);
                    if (scale == 0.0f)
                        continue; /* x and w are finite: these terms are exact zeros */
                    const Code *cd = static_cast<const Code *>(codes) + (b * s.cout + c) * npool;
                    const float *wc = w + (c * s.cin + ci0) * taps;
                    for (int64_t wd = d_lo / s.pool_d; wd <= d_hi / s.pool_d; ++wd)
                        for (int64_t wh = h_lo / s.pool_h; wh <= h_hi / s.pool_h; ++wh)
                            for (int64_t ww = w_lo / s.pool_w; ww <= w_hi / s.pool_w; ++ww) {
                                const int64_t code = (int64_t)cd[(wd * s.pooled_h + wh) * s.pooled_w + ww];
                                const int64_t ow = code % s.pool_w, oh = (code / s.pool_w) % s.pool_h,
                                              od = code / (s.pool_w * s.pool_h);
                                const int64_t td = xd - (wd * s.pool_d + od), th = xh - (wh * s.pool_h + oh),
                                              tw = xw - (ww * s.pool_w + ow);
                                if (td < 0 || td >= s.k_d || th < 0 || th >= s.k_h || tw < 0 || tw >= s.k_w)
                                    continue;
                                const float *wt = wc + (td * s.k_h + th) * s.k_w + tw;
#pragma unroll
                                for (int j = 0; j < GX_CI; ++j)
                                    if (ci0 + j < s.cin)
                                        acc[j] += scale * __ldg(wt + j * taps);
                            }
                }
            }
#pragma unroll
            for (int j = 0; j < GX_CI; ++j)
                if (ci0 + j < s.cin)
                    grad_x[(b * s.cin + ci0 + j) * dhw + p] = acc[j];
        }
    }
}

int64_t backward_workspace_bytes(const convpool_problem &p)
{
    return p.batch * p.out_channels * p.in_channels * p.kernel_d * p.kernel_h * p.kernel_w * (int64_t)sizeof(float);
}

template <typename Code> convpool_status backward_launch(const BackwardCall &c)
{
    const Shape &s = c.s;
    if (c.grad_w) {
        const int64_t grid = imin(s.batch * s.cout, (int64_t)c.dev.sms * 8);
        weight_partial_kernel<Code><<<(unsigned)grid, BW_THREADS, 0, c.stream>>>(s, c.x, c.codes, c.grad_pooled,
                                                                                c.grad_out, c.partial_w);
        CP_CUDA_TRY_LAUNCH("weight_partial_kernel");
    }
    if (c.grad_w || c.grad_cb) {
        const int64_t total = s.cout * s.cin * s.k_d * s.k_h * s.k_w;
        const int64_t grid = imin((total + BW_THREADS - 1) / BW_THREADS, (int64_t)c.dev.sms * 8);
        weight_reduce_kernel<<<(unsigned)grid, BW_THREADS, 0, c.stream>>>(s, c.partial_w, c.grad_pooled, c.grad_out,
                                                                          c.grad_w, c.grad_cb);
        CP_CUDA_TRY_LAUNCH("weight_reduce_kernel");
    }
    if (c.grad_x) {
        const int64_t total = s.batch * s.in_d * s.in_h * s.in_w;
        const int64_t grid = imin((total + GX_THREADS - 1) / GX_THREADS, (int64_t)c.dev.sms * 32);
        grad_x_kernel<Code><<<(unsigned)grid, GX_THREADS, 0, c.stream>>>(s, c.w, c.codes, c.grad_pooled, c.grad_out,
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
