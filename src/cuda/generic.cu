/*
 * generic: the scalar fallback. One thread per pool window, FFMA (TF32: operands rounded to
 * TF32 first), a block tree reduction per (b, c, part of up to GEN_WIN_PER_PART windows),
 * grid-strided. About 0.1 TFLOP/s: the plan picks it only for kernels whose staged input plane
 * does not fit the general kernel's shared memory (kernel_h beyond ~40), and the PyTorch binding
 * sends those shapes to cuDNN instead.
 */
#include "kernels.h"

namespace convpool_cuda {

constexpr int GEN_THREADS = 256;
constexpr int GEN_WIN_PER_THREAD = 4;
constexpr int64_t GEN_WIN_PER_PART = (int64_t)GEN_THREADS * GEN_WIN_PER_THREAD;

/* One pool window of the generic path: pool volume conv sums, each Cin * kernel volume FMAs. */
template <typename T, bool TF32>
__device__ float generic_window(const Shape &s, const T *__restrict__ x, const float *__restrict__ w,
                                int64_t b, int64_t c, int64_t win, const ChanMode &m)
{
    const int64_t pw = win % s.pooled_w;
    const int64_t rest = win / s.pooled_w;
    const int64_t ph = rest % s.pooled_h;
    const int64_t pd = rest / s.pooled_h;
    const int64_t kvol = s.k_d * s.k_h * s.k_w;
    float acc = 0.0f;
    bool first = true;
    for (int64_t ed = 0; ed < s.pool_d; ++ed)
        for (int64_t eh = 0; eh < s.pool_h; ++eh)
            for (int64_t ew = 0; ew < s.pool_w; ++ew) {
                const int64_t od = pd * s.pool_d + ed, oh = ph * s.pool_h + eh, ow = pw * s.pool_w + ew;
                float conv = 0.0f;
                for (int64_t ci = 0; ci < s.cin; ++ci) {
                    const T *xp = x + x_index(s, b, ci, od, oh, ow);
                    const float *wp = w + (c * s.cin + ci) * kvol;
                    for (int64_t a = 0; a < s.k_d; ++a)
                        for (int64_t bb = 0; bb < s.k_h; ++bb)
                            for (int64_t cc = 0; cc < s.k_w; ++cc) {
                                float xv = to_float(xp[(a * s.in_h + bb) * s.in_w + cc]);
                                float wv = wp[(a * s.k_h + bb) * s.k_w + cc];
                                if (TF32) {
                                    xv = tf32_round(xv);
                                    wv = tf32_round(wv);
                                }
                                conv = fmaf(xv, wv, conv);
                            }
                }
                const float y = window_elem(conv, m);
                acc = first ? y : window_combine(acc, y, m);
                first = false;
            }
    return window_finish(acc, m);
}

/* Generic path: block = (b, c, part of up to GEN_WIN_PER_PART windows); grid-strided. */
template <typename T, bool TF32>
__global__ void __launch_bounds__(GEN_THREADS)
generic_kernel(const Shape s, const T *__restrict__ x, const float *__restrict__ w,
               const float *__restrict__ conv_bias, float *__restrict__ partials, int64_t parts_per_bc,
               int64_t total_parts)
{
    __shared__ float red[GEN_THREADS];
    const int64_t npool = s.pooled_d * s.pooled_h * s.pooled_w;
    for (int64_t part = blockIdx.x; part < total_parts; part += gridDim.x) {
        const int64_t bc = part / parts_per_bc;
        const int64_t chunk = part - bc * parts_per_bc;
        const int64_t b = bc / s.cout, c = bc - b * s.cout;
        const ChanMode m = chan_mode(conv_bias, c, s.cout, s.divisor);
        float sum = 0.0f;
        for (int k = 0; k < GEN_WIN_PER_THREAD; ++k) {
            const int64_t win = chunk * GEN_WIN_PER_PART + (int64_t)k * GEN_THREADS + threadIdx.x;
            if (win < npool)
                sum += generic_window<T, TF32>(s, x, w, b, c, win, m);
        }
        block_sum_store<GEN_THREADS>(sum, red, partials + part);
    }
}

bool generic_can_implement(const convpool_problem &p, convpool_dtype dt, const DeviceInfo &dev, char *why, size_t n)
{
    (void)p, (void)dt, (void)dev, (void)why, (void)n;
    return true;
}

Workspace generic_workspace(const convpool_problem &p, bool strict)
{
    (void)strict;
    Workspace ws = {};
    ws.parts = ceil_div(p.pooled_d * p.pooled_h * p.pooled_w, GEN_WIN_PER_PART);
    return ws;
}

template <typename T, bool TF32> convpool_status generic_launch(const Plan &plan, const Call &c)
{
    const Shape &s = c.s;
    const int64_t parts_per_bc = plan.ws.parts;
    if (parts_per_bc != ceil_div(s.pooled_d * s.pooled_h * s.pooled_w, GEN_WIN_PER_PART))
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "internal: generic got a plan for another shape");
    const int64_t total = s.batch * s.cout * parts_per_bc;
    /* Grid-strided over parts, capped at 32 blocks per SM: gridDim.x stays small for any size. */
    const int64_t grid = imin(total, (int64_t)c.dev.sms * 32);
    generic_kernel<T, TF32><<<(unsigned)grid, GEN_THREADS, 0, c.stream>>>(
        s, static_cast<const T *>(c.x), c.w, c.conv_bias, c.partials, parts_per_bc, total);
    CP_CUDA_TRY_LAUNCH("generic_kernel");
    return CONVPOOL_OK;
}

convpool_status generic_run(const Plan &plan, const Call &c)
{
    switch (c.dtype) {
    case CONVPOOL_DTYPE_F32:
        return c.strict ? generic_launch<float, false>(plan, c) : generic_launch<float, true>(plan, c);
    case CONVPOOL_DTYPE_F16:
        return c.strict ? generic_launch<__half, false>(plan, c) : generic_launch<__half, true>(plan, c);
    case CONVPOOL_DTYPE_BF16:
        return c.strict ? generic_launch<__nv_bfloat16, false>(plan, c)
                        : generic_launch<__nv_bfloat16, true>(plan, c);
    }
    return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "internal: generic got dtype %d", (int)c.dtype);
}

} // namespace convpool_cuda
