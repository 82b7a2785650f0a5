/*
 * pad: x copied to rows of a 16-byte multiple, for the fused kernels, when W is not one.
 *
 * The fused kernels stage x rows into shared memory with 16-byte cp.async; a row whose start
 * is not 16-byte aligned (W % 4 != 0 for f32, W % 8 != 0 for 16-bit x) falls back to one
 * copy per element, which made the staging, not the MMAs, the cost of the whole kernel (the
 * odd 15x61x61 row ran 3.6x slower per element than the headline). The plan (plan.cu) instead
 * copies a chunk of samples at a time into the workspace with the row pitch rounded up, and
 * runs the family on that copy: one extra read and write of x, which these kernels, bound by
 * their arithmetic rather than by memory, absorb. The padded columns are zero; no conv value
 * that a pooling window reads depends on them (a window reads conv columns < pooled_w * pool_w
 * <= W - kw + 1, which read x columns < W), and an MMA keeps each output column to itself.
 */
#include "kernels.h"

namespace convpool_cuda {

constexpr int PAD_THREADS = 256;

/* rows rows of w elements each -> rows of pitch elements, the tail zeroed. One thread per
 * 16-byte output chunk; 64-bit indices. */
template <typename T>
__global__ void __launch_bounds__(PAD_THREADS)
pad_rows_kernel(const T *__restrict__ x, int64_t rows, int64_t w, int64_t pitch, T *__restrict__ out)
{
    constexpr int EPC = 16 / (int)sizeof(T);
    const int64_t chunks_per_row = pitch / EPC, total = rows * chunks_per_row;
    for (int64_t i = blockIdx.x * (int64_t)PAD_THREADS + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * PAD_THREADS) {
        const int64_t row = i / chunks_per_row, col = (i - row * chunks_per_row) * EPC;
        const T *src = x + row * w + col;
        union {
            uint4 v;
            T e[EPC];
        } u;
        u.v = make_uint4(0u, 0u, 0u, 0u); /* +0.0 in every dtype */
#pragma unroll
        for (int e = 0; e < EPC; ++e)
            if (col + e < w)
                u.e[e] = src[e];
        *reinterpret_cast<uint4 *>(out + row * pitch + col) = u.v;
    }
}

int64_t padded_width(int64_t w, convpool_dtype dt)
{
    const int64_t epc = dt == CONVPOOL_DTYPE_F32 ? 4 : 8;
    return (w + epc - 1) / epc * epc;
}

convpool_status pad_rows(const void *x, int64_t rows, int64_t w, int64_t pitch, convpool_dtype dt, void *out,
                         const DeviceInfo &dev, cudaStream_t st)
{
    const int64_t epc = dt == CONVPOOL_DTYPE_F32 ? 4 : 8;
    const int64_t total = rows * (pitch / epc);
    const int64_t grid = imin((total + PAD_THREADS - 1) / PAD_THREADS, (int64_t)dev.sms * 16);
    if (dt == CONVPOOL_DTYPE_F32)
        pad_rows_kernel<float><<<(unsigned)grid, PAD_THREADS, 0, st>>>(static_cast<const float *>(x), rows, w,
                                                                        pitch, static_cast<float *>(out));
    else if (dt == CONVPOOL_DTYPE_F16)
        pad_rows_kernel<__half><<<(unsigned)grid, PAD_THREADS, 0, st>>>(static_cast<const __half *>(x), rows, w,
                                                                         pitch, static_cast<__half *>(out));
    else
        pad_rows_kernel<__nv_bfloat16><<<(unsigned)grid, PAD_THREADS, 0, st>>>(
            static_cast<const __nv_bfloat16 *>(x), rows, w, pitch, static_cast<__nv_bfloat16 *>(out));
    CP_CUDA_TRY_LAUNCH("pad_rows_kernel");
    return CONVPOOL_OK;
}

} // namespace convpool_cuda
