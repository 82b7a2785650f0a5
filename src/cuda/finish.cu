/*
 * finish: the last launch of every forward. P[b][c] = (sum of the family's partial window sums,
 * in a fixed order, in double) / windows, and out[b] = sum_c (P[b][c] + bias[c]); results are
 * bit-identical run to run (no atomics). For a 16-bit model (convpool_forward_cuda_lowp) bias
 * and out are of its dtype, and each term is rounded as PyTorch's ops on such tensors round it.
 *
 * pool: the unfused second half for callers that materialise the conv output y themselves (the
 * PyTorch binding, with cuDNN, where the plan measured cuDNN faster). One thread per pool
 * window reads y once; partial sums per (b, c, part of POOL_WIN_PER_PART windows), then finish.
 * pool_train: the same, also writing each window's arg-max code for the fused backward
 * (backward.cu), for training.
 * tail_train, tail_backward: the divide and the max pool on a conv output of any dtype, as
 * PyTorch's ops round them, keeping only the codes; and their backward, the dense gradient of
 * the conv output, for callers that differentiate the conv themselves (convpool_tail_train_cuda).
 * pool_cl: the same for y in channels-last layout [b][d][h][w][c], as cuDNN writes it for
 * channels-last tensors (its TF32 convolution is faster there at wide channels): a warp reads
 * 32 consecutive channels of each window element.
 */
#include "kernels.h"

namespace convpool_cuda {

constexpr int FIN_THREADS = 128;
constexpr int POOL_THREADS = 256;
constexpr int POOL_WIN_PER_THREAD = 4;
constexpr int64_t POOL_WIN_PER_PART = (int64_t)POOL_THREADS * POOL_WIN_PER_THREAD;

/* P[b][c] = (sum of parts, fixed order, double) / windows; out[b] = sum_c (P + bias). OT =
 * float: the sum is exact in double, rounded once. OT 16-bit: the steps of the PyTorch block on
 * tensors of that dtype, P -> OT, + bias in float -> OT, the sum in float (here in double: the
 * same value wherever float holds the sum of these 16-bit terms exactly), -> OT.
 * A block per sample. Its partials, [c][part] and contiguous, are staged through shared memory
 * FIN_STAGE floats at a time (all loads of a round in flight), and thread c adds its row from
 * there in part order: the sum of each row is the one the plain loop over global memory forms,
 * bit for bit, without its chain of dependent loads (~4 us of the headline forward's finish at
 * 32 parts, H200). */
constexpr int FIN_STAGE = 2048;
template <typename OT>
__global__ void __launch_bounds__(FIN_THREADS)
finish_kernel(const float *__restrict__ partials, int64_t nparts, int64_t batch, int64_t cout,
              double windows, const OT *__restrict__ bias, float *__restrict__ pooled,
              OT *__restrict__ out)
{
    constexpr bool F32 = std::is_same<OT, float>::value;
    __shared__ double red[FIN_THREADS];
    __shared__ float stage[FIN_STAGE];
    griddep_wait();
    for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
        const float *pb = partials + b * cout * nparts;
        double acc = 0.0;
        for (int64_t c0 = 0; c0 < cout; c0 += FIN_THREADS) {
            const int64_t c = c0 + threadIdx.x;
            const int64_t lo = c0 * nparts, hi = imin(c0 + FIN_THREADS, cout) * nparts;
            const int64_t r0 = c * nparts, r1 = r0 + nparts; /* this thread's row */
            double sum = 0.0;
            for (int64_t s0 = lo; s0 < hi; s0 += FIN_STAGE) {
                const int m = (int)imin(FIN_STAGE, hi - s0);
                __syncthreads(); /* the previous round's adds are done */
                for (int i = threadIdx.x; i < m; i += FIN_THREADS)
                    stage[i] = pb[s0 + i];
                __syncthreads();
                if (c < cout)
                    for (int64_t k = imax(r0, s0), k1 = imin(r1, s0 + m); k < k1; ++k)
                        sum += (double)stage[k - s0];
            }
            if (c < cout) {
                const float P = (float)(sum / windows);
                pooled[b * cout + c] = P;
                if (out) {
                    if constexpr (F32)
                        acc += (double)(P + bias[c]);
                    else
                        acc += (double)to_float(from_float<OT>(to_float(from_float<OT>(P)) + to_float(bias[c])));
                }
            }
        }
        if (out) {
            red[threadIdx.x] = acc;
            __syncthreads();
            for (int off = FIN_THREADS / 2; off > 0; off >>= 1) {
                if ((int)threadIdx.x < off)
                    red[threadIdx.x] += red[threadIdx.x + off];
                __syncthreads();
            }
            if (threadIdx.x == 0)
                out[b] = from_float<OT>((float)red[0]);
        }
        __syncthreads(); /* red and stage are free for the next sample */
    }
}

/* finish_kernel for Cout <= 32 (the k3p2 and headline families): a warp a sample, lane c its
 * channel, no block barriers. The same bits as finish_kernel: lane c adds its row in part order
 * (finish_warp_sample: loads 32 at a time, the last batch padded with +0.0, which leaves the sum's bits as
 * they are: it starts at +0.0 and is never -0.0), and the shuffle tree over the 32 lanes is
 * finish_kernel's 128-thread tree, whose levels 64 and 32 only add +0.0 where Cout <= 32. The
 * bias is loaded before griddep_wait (a call's input, not the primary's output). Headline b128
 * on the H200: finish_kernel took ~5-6 us of the forward, all latency: eight block barriers, a
 * staging round trip, and the bias load after the sums. */
constexpr int FINW_THREADS = 128, FINW_WARPS = FINW_THREADS / 32;
template <typename OT>
__global__ void __launch_bounds__(FINW_THREADS)
finish_warp_kernel(const float *__restrict__ partials, int64_t nparts, int64_t batch, int64_t cout, double windows,
                   const OT *__restrict__ bias, float *__restrict__ pooled, OT *__restrict__ out)
{
    const int lane = threadIdx.x & 31;
    const float bc = out && lane < cout ? to_float(bias[lane]) : 0.0f;
    griddep_wait();
    for (int64_t b = blockIdx.x * (int64_t)FINW_WARPS + (threadIdx.x >> 5); b < batch;
         b += (int64_t)gridDim.x * FINW_WARPS)
        finish_warp_sample(partials, nparts, cout, windows, bc, pooled, out, b);
}

/* Block = (b, c, part); y holds conv + conv bias, so every channel's mode has bias 0. */
__global__ void __launch_bounds__(POOL_THREADS)
pool_kernel(const Shape s, const float *__restrict__ y, float *__restrict__ partials, int64_t parts_per_bc,
            int64_t total_parts)
{
    __shared__ float red[POOL_THREADS];
    const int64_t conv_d = s.in_d - s.k_d + 1, conv_h = s.in_h - s.k_h + 1, conv_w = s.in_w - s.k_w + 1;
    const int64_t npool = s.pooled_d * s.pooled_h * s.pooled_w;
    const ChanMode m = chan_mode(nullptr, 0, s.cout, s.divisor);
    for (int64_t part = blockIdx.x; part < total_parts; part += gridDim.x) {
        const int64_t bc = part / parts_per_bc, chunk = part - bc * parts_per_bc;
        const float *yc = y + bc * conv_d * conv_h * conv_w;
        float sum = 0.0f;
        for (int k = 0; k < POOL_WIN_PER_THREAD; ++k) {
            const int64_t win = chunk * POOL_WIN_PER_PART + (int64_t)k * POOL_THREADS + threadIdx.x;
            if (win >= npool)
                continue;
            const int64_t pw = win % s.pooled_w, rest = win / s.pooled_w;
            const int64_t ph = rest % s.pooled_h, pd = rest / s.pooled_h;
            float acc = 0.0f;
            bool first = true;
            for (int64_t ed = 0; ed < s.pool_d; ++ed)
                for (int64_t eh = 0; eh < s.pool_h; ++eh) {
                    const float *row = yc + ((pd * s.pool_d + ed) * conv_h + ph * s.pool_h + eh) * conv_w + pw * s.pool_w;
                    for (int64_t ew = 0; ew < s.pool_w; ++ew) {
                        const float v = window_elem(__ldg(row + ew), m);
                        acc = first ? v : window_combine(acc, v, m);
                        first = false;
                    }
                }
            sum += window_finish(acc, m);
        }
        block_sum_store<POOL_THREADS>(sum, red, partials + part);
    }
}

/* pool_kernel, also writing each window's code: the position (raster d, h, w inside the
 * window) of the element PyTorch's max_pool3d picks on q = y / divisor in float32 (scan order;
 * a value replaces the running max, which starts at -inf with the window's first element, when
 * it is greater or NaN). The backward sends the window's gradient there. */
template <typename Code>
__global__ void __launch_bounds__(POOL_THREADS)
pool_train_kernel(const Shape s, const float *__restrict__ y, float *__restrict__ partials, Code *__restrict__ codes,
                  int64_t parts_per_bc, int64_t total_parts)
{
    __shared__ float red[POOL_THREADS];
    const int64_t conv_d = s.in_d - s.k_d + 1, conv_h = s.in_h - s.k_h + 1, conv_w = s.in_w - s.k_w + 1;
    const int64_t npool = s.pooled_d * s.pooled_h * s.pooled_w;
    const ChanMode m = chan_mode(nullptr, 0, s.cout, s.divisor);
    for (int64_t part = blockIdx.x; part < total_parts; part += gridDim.x) {
        const int64_t bc = part / parts_per_bc, chunk = part - bc * parts_per_bc;
        const float *yc = y + bc * conv_d * conv_h * conv_w;
        float sum = 0.0f;
        for (int k = 0; k < POOL_WIN_PER_THREAD; ++k) {
            const int64_t win = chunk * POOL_WIN_PER_PART + (int64_t)k * POOL_THREADS + threadIdx.x;
            if (win >= npool)
                continue;
            const int64_t pw = win % s.pooled_w, rest = win / s.pooled_w;
            const int64_t ph = rest % s.pooled_h, pd = rest / s.pooled_h;
            float acc = 0.0f, best = __int_as_float(0xff800000);
            uint32_t pos = 0, code = 0;
            bool first = true;
            for (int64_t ed = 0; ed < s.pool_d; ++ed)
                for (int64_t eh = 0; eh < s.pool_h; ++eh) {
                    const float *row = yc + ((pd * s.pool_d + ed) * conv_h + ph * s.pool_h + eh) * conv_w + pw * s.pool_w;
                    for (int64_t ew = 0; ew < s.pool_w; ++ew, ++pos) {
                        const float raw = __ldg(row + ew);
                        const float v = window_elem(raw, m);
                        acc = first ? v : window_combine(acc, v, m);
                        first = false;
                        const float q = __fdiv_rn(raw, s.divisor);
                        if (q > best || isnan(q)) {
                            best = q;
                            code = pos;
                        }
                    }
                }
            sum += window_finish(acc, m);
            codes[bc * npool + win] = (Code)code;
        }
        block_sum_store<POOL_THREADS>(sum, red, partials + part);
    }
}

/* The tail kernels' sizes in index type I: uint32_t where every flat index fits (the common
 * case: 32-bit division is a few instructions, 64-bit a hundred), else int64_t. */
template <typename I> struct TailDims {
    I conv_d, conv_h, conv_w, pool_d, pool_h, pool_w, pooled_d, pooled_h, pooled_w;
    explicit TailDims(const Shape &s)
        : conv_d((I)(s.in_d - s.k_d + 1)), conv_h((I)(s.in_h - s.k_h + 1)), conv_w((I)(s.in_w - s.k_w + 1)),
          pool_d((I)s.pool_d), pool_h((I)s.pool_h), pool_w((I)s.pool_w), pooled_d((I)s.pooled_d),
          pooled_h((I)s.pooled_h), pooled_w((I)s.pooled_w)
    {
    }
};

/* tail_train (convpool_tail_train_cuda): PyTorch's max_pool3d of q = y / divisor on a conv
 * output y of dtype T, bit for bit, and the codes: a thread per window, pool_train_kernel's scan;
 * q = T(float(y) * inv_d), as CUDA's division by a scalar is a product with its float
 * reciprocal. */
template <typename T, typename Code, typename I>
__global__ void __launch_bounds__(POOL_THREADS)
tail_train_kernel(const TailDims<I> s, const T *__restrict__ y, float inv_d, T *__restrict__ m,
                  Code *__restrict__ codes, I windows)
{
    const I plane = s.conv_d * s.conv_h * s.conv_w;
    for (I win = (I)blockIdx.x * POOL_THREADS + threadIdx.x; win < windows; win += (I)gridDim.x * POOL_THREADS) {
        const I pw = win % s.pooled_w, r1 = win / s.pooled_w;
        const I ph = r1 % s.pooled_h, r2 = r1 / s.pooled_h;
        const I pd = r2 % s.pooled_d, bc = r2 / s.pooled_d;
        const T *base = y + bc * plane + (pd * s.pool_d * s.conv_h + ph * s.pool_h) * s.conv_w + pw * s.pool_w;
        float best = __int_as_float(0xff800000);
        uint32_t pos = 0, code = 0;
        for (I ed = 0; ed < s.pool_d; ++ed)
            for (I eh = 0; eh < s.pool_h; ++eh) {
                const T *row = base + (ed * s.conv_h + eh) * s.conv_w;
                for (I ew = 0; ew < s.pool_w; ++ew, ++pos) {
                    const float q = to_float(from_float<T>(__fmul_rn(to_float(row[ew]), inv_d)));
                    if (q > best || isnan(q)) {
                        best = q;
                        code = pos;
                    }
                }
            }
        m[win] = from_float<T>(best);
        codes[win] = (Code)code;
    }
}

constexpr int TAIL_BW_THREADS = 256;

/* tail_backward (convpool_tail_backward_cuda): a thread per run of pool_w elements of a conv row
 * (b, c, d, h), the runs a window's row covers and then the row's tail past the last window.
 * Every element gets T(0 * inv_d) but its window's code position, which gets T(grad_m * inv_d):
 * the max pool's and the division's backwards as PyTorch's CUDA ops form them. A thread's code
 * and grad_m loads are independent (a warp per row, with the gradient's load behind the code's,
 * was latency-bound: 0.090 ms for a 52 MB grad_y on the H200). */
template <typename T, typename Code, typename I>
__global__ void __launch_bounds__(TAIL_BW_THREADS)
tail_backward_kernel(const TailDims<I> s, const Code *__restrict__ codes, const T *__restrict__ grad_m, float inv_d,
                     T *__restrict__ grad_y, I runs_per_row, I total)
{
    const I npool = s.pooled_d * s.pooled_h * s.pooled_w;
    const T zero = from_float<T>(__fmul_rn(0.0f, inv_d));
    for (I i = (I)blockIdx.x * TAIL_BW_THREADS + threadIdx.x; i < total; i += (I)gridDim.x * TAIL_BW_THREADS) {
        const I run = i % runs_per_row, row = i / runs_per_row;
        const I h = row % s.conv_h, t = row / s.conv_h, d = t % s.conv_d, bc = t / s.conv_d;
        const I pd = d / s.pool_d, ph = h / s.pool_h, w0 = run * s.pool_w;
        const I n = s.conv_w - w0 < s.pool_w ? s.conv_w - w0 : s.pool_w;
        uint32_t e = 0xffffffffu; /* no position of this run */
        T at = zero;
        if (pd < s.pooled_d && ph < s.pooled_h && run < s.pooled_w) {
            const I win = bc * npool + (pd * s.pooled_h + ph) * s.pooled_w + run;
            const uint32_t rel = (uint32_t)(((d - pd * s.pool_d) * s.pool_h + (h - ph * s.pool_h)) * s.pool_w);
            const uint32_t code = (uint32_t)codes[win];
            const float g = to_float(grad_m[win]);
            e = code - rel;
            at = from_float<T>(__fmul_rn(g, inv_d));
        }
        T *gr = grad_y + row * s.conv_w + w0;
        for (I k = 0; k < n; ++k)
            gr[k] = (uint32_t)k == e ? at : zero;
    }
}

template <typename T, typename I>
static void tail_train_launch(const Shape &sh, const T *y, float inv_d, T *m, void *codes, int code_bytes,
                              int64_t windows, unsigned grid, cudaStream_t st)
{
    const TailDims<I> s(sh);
    if (code_bytes == 1)
        tail_train_kernel<<<grid, POOL_THREADS, 0, st>>>(s, y, inv_d, m, static_cast<uint8_t *>(codes), (I)windows);
    else if (code_bytes == 2)
        tail_train_kernel<<<grid, POOL_THREADS, 0, st>>>(s, y, inv_d, m, static_cast<uint16_t *>(codes), (I)windows);
    else
        tail_train_kernel<<<grid, POOL_THREADS, 0, st>>>(s, y, inv_d, m, static_cast<uint32_t *>(codes), (I)windows);
}

template <typename T, typename I>
static void tail_backward_launch(const Shape &sh, const void *codes, int code_bytes, const T *grad_m, float inv_d,
                                 T *grad_y, int64_t runs_per_row, int64_t total, unsigned grid, cudaStream_t st)
{
    const TailDims<I> s(sh);
    if (code_bytes == 1)
        tail_backward_kernel<<<grid, TAIL_BW_THREADS, 0, st>>>(s, static_cast<const uint8_t *>(codes), grad_m, inv_d,
                                                               grad_y, (I)runs_per_row, (I)total);
    else if (code_bytes == 2)
        tail_backward_kernel<<<grid, TAIL_BW_THREADS, 0, st>>>(s, static_cast<const uint16_t *>(codes), grad_m,
                                                               inv_d, grad_y, (I)runs_per_row, (I)total);
    else
        tail_backward_kernel<<<grid, TAIL_BW_THREADS, 0, st>>>(s, static_cast<const uint32_t *>(codes), grad_m,
                                                               inv_d, grad_y, (I)runs_per_row, (I)total);
}

/* Whether every flat index of y (and so of m and the codes) fits 32 bits, with room for a grid
 * stride past the end. */
static bool tail_fits_32(const Shape &s)
{
    const int64_t n = s.batch * s.cout * (s.in_d - s.k_d + 1) * (s.in_h - s.k_h + 1) * (s.in_w - s.k_w + 1);
    return n < ((int64_t)1 << 31);
}

convpool_status tail_train_run(const Shape &s, convpool_dtype dt, const void *y, float inv_d, void *m, void *codes,
                               int code_bytes, const DeviceInfo &dev, cudaStream_t st)
{
    const int64_t windows = s.batch * s.cout * s.pooled_d * s.pooled_h * s.pooled_w;
    const unsigned grid = (unsigned)imin(ceil_div(windows, (int64_t)POOL_THREADS), (int64_t)dev.sms * 16);
    auto launch = [&](auto *yt, auto *mt) {
        using T = std::remove_pointer_t<decltype(mt)>;
        if (tail_fits_32(s))
            tail_train_launch<T, uint32_t>(s, yt, inv_d, mt, codes, code_bytes, windows, grid, st);
        else
            tail_train_launch<T, int64_t>(s, yt, inv_d, mt, codes, code_bytes, windows, grid, st);
    };
    if (dt == CONVPOOL_DTYPE_F16)
        launch(static_cast<const __half *>(y), static_cast<__half *>(m));
    else if (dt == CONVPOOL_DTYPE_BF16)
        launch(static_cast<const __nv_bfloat16 *>(y), static_cast<__nv_bfloat16 *>(m));
    else
        launch(static_cast<const float *>(y), static_cast<float *>(m));
    CP_CUDA_TRY_LAUNCH("tail_train_kernel");
    return CONVPOOL_OK;
}

convpool_status tail_backward_run(const Shape &s, convpool_dtype dt, const void *codes, int code_bytes,
                                  const void *grad_m, float inv_d, void *grad_y, const DeviceInfo &dev,
                                  cudaStream_t st)
{
    const int64_t rows = s.batch * s.cout * (s.in_d - s.k_d + 1) * (s.in_h - s.k_h + 1);
    const int64_t runs_per_row = ceil_div(s.in_w - s.k_w + 1, s.pool_w), total = rows * runs_per_row;
    const unsigned grid = (unsigned)imin(ceil_div(total, (int64_t)TAIL_BW_THREADS), (int64_t)dev.sms * 16);
    auto launch = [&](auto *gmt, auto *gyt) {
        using T = std::remove_pointer_t<decltype(gyt)>;
        if (tail_fits_32(s))
            tail_backward_launch<T, uint32_t>(s, codes, code_bytes, gmt, inv_d, gyt, runs_per_row, total, grid, st);
        else
            tail_backward_launch<T, int64_t>(s, codes, code_bytes, gmt, inv_d, gyt, runs_per_row, total, grid, st);
    };
    if (dt == CONVPOOL_DTYPE_F16)
        launch(static_cast<const __half *>(grad_m), static_cast<__half *>(grad_y));
    else if (dt == CONVPOOL_DTYPE_BF16)
        launch(static_cast<const __nv_bfloat16 *>(grad_m), static_cast<__nv_bfloat16 *>(grad_y));
    else
        launch(static_cast<const float *>(grad_m), static_cast<float *>(grad_y));
    CP_CUDA_TRY_LAUNCH("tail_backward_kernel");
    return CONVPOOL_OK;
}

constexpr int POOL_CL_LANES = 32;  /* consecutive channels, one per lane */
constexpr int POOL_CL_ROWS = 8;    /* warps: windows ROW, ROW + 8, ... of the part */
constexpr int64_t POOL_CL_WIN = 32; /* windows per part */

/* Block (b, part, group of 32 channels): lane = channel, warp = every 8th window of the part. A
 * window's loads do not depend on the running max (it starts at the identity), so the unrolled
 * column loop keeps several in flight; each warp sums its windows in order, then warp 0 adds
 * the 8 warps' sums in order: deterministic. */
__global__ void __launch_bounds__(POOL_CL_LANES * POOL_CL_ROWS)
pool_cl_kernel(const Shape s, const float *__restrict__ y, float *__restrict__ partials, int64_t parts)
{
    __shared__ float red[POOL_CL_ROWS][POOL_CL_LANES];
    const int64_t conv_h = s.in_h - s.k_h + 1, conv_w = s.in_w - s.k_w + 1, conv_d = s.in_d - s.k_d + 1;
    const int64_t npool = s.pooled_d * s.pooled_h * s.pooled_w, C = s.cout;
    const int64_t cgroups = ceil_div(C, (int64_t)POOL_CL_LANES), nblk = s.batch * parts * cgroups;
    const ChanMode m = chan_mode(nullptr, 0, s.cout, s.divisor);
    const float ident = m.mode == kMinRaw ? __int_as_float(0x7f800000) : __int_as_float(0xff800000);
    const int lane = threadIdx.x % POOL_CL_LANES, wrow = threadIdx.x / POOL_CL_LANES;
    for (int64_t blk = blockIdx.x; blk < nblk; blk += gridDim.x) {
        const int64_t cg = blk % cgroups, rest = blk / cgroups;
        const int64_t part = rest % parts, b = rest / parts, c = cg * POOL_CL_LANES + lane;
        const int64_t win1 = imin(npool, (part + 1) * POOL_CL_WIN);
        float sum = 0.0f;
        if (c < C) {
            const float *yb = y + b * conv_d * conv_h * conv_w * C + c;
            for (int64_t win = part * POOL_CL_WIN + wrow; win < win1; win += POOL_CL_ROWS) {
                const int64_t pw = win % s.pooled_w, rest2 = win / s.pooled_w;
                const int64_t ph = rest2 % s.pooled_h, pd = rest2 / s.pooled_h;
                float acc = ident;
                for (int64_t ed = 0; ed < s.pool_d; ++ed)
                    for (int64_t eh = 0; eh < s.pool_h; ++eh) {
                        const float *row =
                            yb + (((pd * s.pool_d + ed) * conv_h + ph * s.pool_h + eh) * conv_w + pw * s.pool_w) * C;
#pragma unroll 4
                        for (int64_t ew = 0; ew < s.pool_w; ++ew)
                            acc = window_combine(acc, window_elem(__ldg(row + ew * C), m), m);
                    }
                sum += window_finish(acc, m);
            }
        }
        red[wrow][lane] = sum;
        __syncthreads();
        if (wrow == 0 && c < C) {
            float tot = 0.0f;
#pragma unroll
            for (int r = 0; r < POOL_CL_ROWS; ++r)
                tot += red[r][lane];
            partials[(b * C + c) * parts + part] = tot;
        }
        __syncthreads();
    }
}

int64_t pool_cl_parts(const convpool_problem &p) { return ceil_div(p.pooled_d * p.pooled_h * p.pooled_w, POOL_CL_WIN); }

convpool_status pool_cl_run(const Shape &s, const float *y, float *partials, int64_t parts, const DeviceInfo &dev,
                            cudaStream_t st)
{
    const int64_t blocks = s.batch * parts * ceil_div(s.cout, (int64_t)POOL_CL_LANES);
    const int64_t grid = imin(blocks, (int64_t)dev.sms * 8);
    pool_cl_kernel<<<(unsigned)grid, POOL_CL_LANES * POOL_CL_ROWS, 0, st>>>(s, y, partials, parts);
    CP_CUDA_TRY_LAUNCH("pool_cl_kernel");
    return CONVPOOL_OK;
}

convpool_status pool_train_run(const Shape &s, const float *y, float *partials, int64_t parts, void *codes,
                               int code_bytes, const DeviceInfo &dev, cudaStream_t st)
{
    const int64_t total = s.batch * s.cout * parts;
    const int64_t grid = imin(total, (int64_t)dev.sms * 16);
    if (code_bytes == 1)
        pool_train_kernel<uint8_t><<<(unsigned)grid, POOL_THREADS, 0, st>>>(s, y, partials, static_cast<uint8_t *>(codes),
                                                                           parts, total);
    else if (code_bytes == 2)
        pool_train_kernel<uint16_t><<<(unsigned)grid, POOL_THREADS, 0, st>>>(
            s, y, partials, static_cast<uint16_t *>(codes), parts, total);
    else
        pool_train_kernel<uint32_t><<<(unsigned)grid, POOL_THREADS, 0, st>>>(
            s, y, partials, static_cast<uint32_t *>(codes), parts, total);
    CP_CUDA_TRY_LAUNCH("pool_train_kernel");
    return CONVPOOL_OK;
}

convpool_status finish_run(const Shape &s, const float *partials, int64_t parts, const void *bias, float *pooled,
                           void *out, convpool_dtype out_dt, const DeviceInfo &dev, cudaStream_t st, bool dependent)
{
    const bool pdl = dependent && pdl_on(dev);
    const int64_t grid = imin(s.batch, (int64_t)dev.sms * 64);
    const double windows = (double)s.pooled_d * (double)s.pooled_h * (double)s.pooled_w;
    const bool narrow = s.cout <= FINISH_WARP_MAX_COUT;
    const int64_t grid_w = imin(ceil_div(s.batch, (int64_t)FINW_WARPS), (int64_t)dev.sms * 16);
    const auto launch = [&](auto *typed_bias, auto *typed_out) {
        using OT = std::remove_const_t<std::remove_pointer_t<decltype(typed_bias)>>;
        if (narrow)
            return launch_dependent(pdl, finish_warp_kernel<OT>, dim3((unsigned)grid_w), dim3(FINW_THREADS), 0, st,
                                    partials, parts, s.batch, s.cout, windows, typed_bias, pooled, typed_out);
        return launch_dependent(pdl, finish_kernel<OT>, dim3((unsigned)grid), dim3(FIN_THREADS), 0, st, partials,
                                parts, s.batch, s.cout, windows, typed_bias, pooled, typed_out);
    };
    if (out_dt == CONVPOOL_DTYPE_F16)
        CP_CUDA_TRY(launch(static_cast<const __half *>(bias), static_cast<__half *>(out)));
    else if (out_dt == CONVPOOL_DTYPE_BF16)
        CP_CUDA_TRY(launch(static_cast<const __nv_bfloat16 *>(bias), static_cast<__nv_bfloat16 *>(out)));
    else
        CP_CUDA_TRY(launch(static_cast<const float *>(bias), static_cast<float *>(out)));
    CP_CUDA_TRY_LAUNCH(narrow ? "finish_warp_kernel" : "finish_kernel");
    return CONVPOOL_OK;
}

int64_t pool_parts(const convpool_problem &p) { return ceil_div(p.pooled_d * p.pooled_h * p.pooled_w, POOL_WIN_PER_PART); }

convpool_status pool_run(const Shape &s, const float *y, float *partials, int64_t parts, const DeviceInfo &dev,
                         cudaStream_t st)
{
    const int64_t total = s.batch * s.cout * parts;
    const int64_t grid = imin(total, (int64_t)dev.sms * 16);
    pool_kernel<<<(unsigned)grid, POOL_THREADS, 0, st>>>(s, y, partials, parts, total);
    CP_CUDA_TRY_LAUNCH("pool_kernel");
    return CONVPOOL_OK;
}

} // namespace convpool_cuda
