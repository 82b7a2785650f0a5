/*
 * pack: the weights as mma.sync A fragments, once per call, for the kernels that read them
 * per unit from global memory (group.cu, general.cu). Layout [output group of 16][input group
 * of 8][part][tap][lane] uint4; part 0 holds the TF32-rounded weights, part 1 (STRICT only) the
 * residual w - tf32(w), rounded again. Channels past Cin or Cout are zero.
 * widen: a float16/bfloat16 model's weights and conv bias as float32, into the workspace, for
 * convpool_forward_cuda_lowp (every family reads float32 weights).
 */
#include "kernels.h"
#include "tile.cuh"

namespace convpool_cuda {

constexpr int PACK_THREADS = 256;

/* A fragments per (16-channel output group, 8-channel input group):
 * [part][tap][lane] uint4, part 0 = TF32-rounded weights, part 1 (STRICT) = the residual
 * w - tf32(w) rounded again. Lane (g, t) holds W[g][t], W[g+8][t], W[g][t+4], W[g+8][t+4];
 * channels past Cin or Cout are zero. */
__global__ void __launch_bounds__(PACK_THREADS)
pack_weights_kernel(const float *__restrict__ w, int64_t cin, int64_t cout, int64_t taps, int64_t n_cig,
                    int64_t nparts_w, int64_t total, uint4 *__restrict__ packed)
{
    for (int64_t i = blockIdx.x * (int64_t)PACK_THREADS + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * PACK_THREADS) {
        const int lane = (int)(i & 31), g = lane >> 2, t = lane & 3;
        int64_t r = i >> 5;
        const int64_t tap = r % taps;
        r /= taps;
        const int64_t gi = r % n_cig, cog = r / n_cig;
        const int64_t co[2] = {cog * fp::COUT + g, cog * fp::COUT + g + 8};
        const int64_t ci[2] = {gi * fp::CIN + t, gi * fp::CIN + t + 4};
        float v[4];
        for (int e = 0; e < 4; ++e) {
            const int64_t o = co[e & 1], c = ci[e >> 1];
            v[e] = (o < cout && c < cin) ? w[(o * cin + c) * taps + tap] : 0.0f;
        }
        uint32_t big[4], small[4];
        for (int e = 0; e < 4; ++e) {
            big[e] = to_tf32(v[e]);
            small[e] = isfinite(v[e]) ? to_tf32(v[e] - __uint_as_float(big[e])) : 0u;
        }
        uint4 *dst = packed + ((cog * n_cig + gi) * nparts_w * taps + tap) * 32 + lane;
        dst[0] = make_uint4(big[0], big[1], big[2], big[3]);
        if (nparts_w > 1)
            dst[taps * 32] = make_uint4(small[0], small[1], small[2], small[3]);
    }
}

/* A 16-bit model's parameters as float32: weights then conv bias, one grid-stride loop. */
template <typename T>
__global__ void __launch_bounds__(PACK_THREADS)
widen_kernel(const T *__restrict__ w, int64_t nw, const T *__restrict__ cb, int64_t ncb, float *__restrict__ dst)
{
    for (int64_t i = blockIdx.x * (int64_t)PACK_THREADS + threadIdx.x; i < nw + ncb;
         i += (int64_t)gridDim.x * PACK_THREADS)
        dst[i] = to_float(i < nw ? w[i] : cb[i - nw]);
}

convpool_status widen_params(convpool_dtype dt, const void *w, int64_t nw, const void *cb, int64_t ncb, float *dst,
                             const DeviceInfo &dev, cudaStream_t st)
{
    const int64_t grid = imax(1, imin(ceil_div(nw + ncb, PACK_THREADS), (int64_t)dev.sms * 4));
    if (dt == CONVPOOL_DTYPE_F16)
        widen_kernel<<<(unsigned)grid, PACK_THREADS, 0, st>>>(static_cast<const __half *>(w), nw,
                                                              static_cast<const __half *>(cb), ncb, dst);
    else
        widen_kernel<<<(unsigned)grid, PACK_THREADS, 0, st>>>(static_cast<const __nv_bfloat16 *>(w), nw,
                                                              static_cast<const __nv_bfloat16 *>(cb), ncb, dst);
    CP_CUDA_TRY_LAUNCH("widen_kernel");
    return CONVPOOL_OK;
}

int64_t packed_weight_bytes(const convpool_problem &p, bool strict)
{
    return ceil_div(p.out_channels, fp::COUT) * ceil_div(p.in_channels, fp::CIN) *
           (p.kernel_d * p.kernel_h * p.kernel_w) * 32 * 16 * (strict ? 2 : 1);
}

convpool_status pack_weights(const Shape &s, bool strict, const float *w, void *packed, const DeviceInfo &dev,
                             cudaStream_t st)
{
    if ((uintptr_t)packed % 16 != 0)
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "internal: packed weights must be 16-byte aligned");
    const int64_t taps = s.k_d * s.k_h * s.k_w;
    const int64_t n_cog = ceil_div(s.cout, fp::COUT), n_cig = ceil_div(s.cin, fp::CIN);
    const int64_t total = n_cog * n_cig * taps * 32;
    const int64_t grid = imin(ceil_div(total, PACK_THREADS), (int64_t)dev.sms * 16);
    pack_weights_kernel<<<(unsigned)grid, PACK_THREADS, 0, st>>>(w, s.cin, s.cout, taps, n_cig, strict ? 2 : 1,
                                                                 total, static_cast<uint4 *>(packed));
    CP_CUDA_TRY_LAUNCH("pack_weights_kernel");
    return CONVPOOL_OK;
}

} // namespace convpool_cuda
