/*
 * group: kernel 1^3, 2^3, 3^3, 1x3x3 or 3x1x1 (a Geo instance each), any Cin and Cout, pool 2^3
 * or (the ANY_POOL instances) the pools pool_step_any reduces in registers: pool_h in {1, 2, 4},
 * pool_w in {1, 2, 4, 8}, any pool_d.
 *
 * The tile of tile.cuh with a work item of (16 output channels, b, h-slab, w-slab), the output
 * group fastest so blocks running side by side share x in L2. Each step (2 conv d-rows) loops
 * over groups of 8 input channels (the last one zero-padded in shared memory: zero weights
 * times a stale inf would be NaN); a unit (step, group) stages its kd + 1 input planes into one
 * half of a double buffer while the other half is computed. The weights are packed once per
 * call (pack.cu) and each unit reads its A fragments as coalesced 16-byte loads through L1.
 * The plan picks it for those kernels and pools where k3p2 does not take the problem.
 */
#include "kernels.h"
#include "tile.cuh"

namespace convpool_cuda {

/* Kernel G (Geo<kd, kh, kw>), any Cin and Cout (see the top comment). Item = (output-channel group
 * cog, b, hs, ws), cog fastest so that blocks running side by side share x in L2; unit = (step
 * pd, input-channel group gi). Units alternate between ring halves at slots 0 and NP. */
template <typename T, bool STRICT, typename G, bool ANY_POOL = false>
__global__ void __launch_bounds__(fp::THREADS, fp::MIN_BLOCKS)
group_kernel(const Shape s, const T *__restrict__ x, const uint4 *__restrict__ wpacked,
             const float *__restrict__ conv_bias, float *__restrict__ partials, int64_t n_hs, int64_t n_ws,
             int64_t n_cog, int64_t n_items, int aligned)
{
    using namespace fp;
    constexpr int NP = G::STEP_PLANES, TAPS = G::TAPS;
    constexpr int PITCH = chan_pitch<T>(group_ring_elems<G>());
    constexpr int NPARTS_W = STRICT ? 2 : 1;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *xs = reinterpret_cast<T *>(smem_raw);
    float *red = reinterpret_cast<float *>(smem_raw + group_x_bytes<T, G>());

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    int64_t item = blockIdx.x;
    if (item >= n_items)
        return;

    /* Zero the ring once: never-staged rows and columns then hold finite values. */
    for (int i = tid; i < group_x_bytes<T, G>() / 16; i += THREADS)
        reinterpret_cast<uint4 *>(smem_raw)[i] = make_uint4(0u, 0u, 0u, 0u);

    const int64_t n_cig = ceil_div(s.cin, CIN);
    const int64_t nparts = n_hs * n_ws;
    const int64_t n_steps = ANY_POOL ? fp::tile_steps(s.pooled_d, s.pool_d) : s.pooled_d;
    const int ph_shift = fp::log2_small(s.pool_h), pw_shift = fp::log2_small(s.pool_w);
    auto decode = [&](int64_t it, int64_t &cog, int64_t &b, int64_t &hs, int64_t &ws) {
        cog = it % n_cog;
        int64_t r = it / n_cog;
        ws = r % n_ws;
        r /= n_ws;
        hs = r % n_hs;
        b = r / n_hs;
    };
    auto stage_unit = [&](int64_t b, int64_t hs, int64_t ws, int64_t pd, int64_t gi, int slot0) {
        const int64_t left = s.cin - gi * CIN;
        stage_planes<T, NP, G, false, ANY_POOL>(xs, s, x, b, gi * CIN, left < CIN ? left : (int64_t)CIN, hs * OUT_H, ws * OUT_W,
                               2 * pd, slot0, aligned != 0, true, PITCH);
    };

    __syncthreads(); /* zeroing before any cp.async lands */
    int64_t cog, b, hs, ws;
    decode(item, cog, b, hs, ws);
    ChanMode cm0 = chan_mode(conv_bias, cog * COUT + g, s.cout, s.divisor);
    ChanMode cm1 = chan_mode(conv_bias, cog * COUT + g + 8, s.cout, s.divisor);
    stage_unit(b, hs, ws, 0, 0, 0);
    cp_async_commit();

    int64_t pd = 0, gi = 0;
    int base = 0; /* ring slot of the current unit's first input plane: 0 or NP */
    float sum0 = 0.0f, sum1 = 0.0f;
    float acc[2][OUT_H][4];
    zero_regs(acc);
    float run[2][OUT_H][2]; /* ANY_POOL: windows open across steps */
    zero_regs(run);
    const T *xw = xs + t * PITCH + 8 * warp + g; /* this lane's B element: channel t, column g */

    for (;;) {
        cp_async_wait_all();
        __syncthreads(); /* current unit visible; every warp is done with the previous one */

        /* Prefetch the next unit into the other half. */
        int64_t next_item = item, next_pd = pd, next_gi = gi + 1;
        if (next_gi >= n_cig) {
            next_gi = 0;
            next_pd = pd + 1;
            if (next_pd >= n_steps) {
                next_pd = 0;
                next_item = item + gridDim.x;
            }
        }
        const int next_base = NP - base;
        if (next_item < n_items) {
            if (next_item != item) {
                int64_t nc, nb, nh, nw;
                decode(next_item, nc, nb, nh, nw);
                stage_unit(nb, nh, nw, next_pd, next_gi, next_base);
            } else {
                stage_unit(b, hs, ws, next_pd, next_gi, next_base);
            }
        }
        cp_async_commit();

        const bool last_group = gi == n_cig - 1;
        const int64_t pw = ws * (OUT_W / 2) + 4 * warp + t; /* this lane's pooled column (pool 2) */
        const bool active = ANY_POOL ? ws * OUT_W + 8 * warp < s.pooled_w * s.pool_w
                                     : ws * (OUT_W / 2) + 4 * warp < s.pooled_w;
        if (active) {
            if (gi == 0) {
                zero_regs(acc);
            }
            const uint4 *wf = wpacked + (cog * n_cig + gi) * (NPARTS_W * TAPS * 32);
            uint32_t wr[STRICT ? 1 : TAPS][4];
            if constexpr (!STRICT) {
#pragma unroll
                for (int k = 0; k < TAPS; ++k) {
                    const uint4 a = __ldg(wf + k * 32 + lane);
                    wr[k][0] = a.x;
                    wr[k][1] = a.y;
                    wr[k][2] = a.z;
                    wr[k][3] = a.w;
                }
            }
            conv_step<T, STRICT, G::D, G::H, G::W, PITCH>(acc, xw, base, wr, wf, lane);
            if (last_group) {
                if constexpr (ANY_POOL)
                    pool_step_any(acc, s, pd, hs * OUT_H, ws * OUT_W + 8 * warp + 2 * t, ph_shift, pw_shift, cm0,
                                  cm1, run, sum0, sum1);
                else
                    pool_step(acc, s, hs * (OUT_H / 2), pw, cm0, cm1, sum0, sum1);
            }
        }

        if (last_group && pd == n_steps - 1) {
            write_item_sums(sum0, sum1, red, s, b, cog * COUT, hs * n_ws + ws, nparts, partials);
            sum0 = 0.0f;
            sum1 = 0.0f;
        }

        if (next_item >= n_items)
            break;
        if (next_item != item) {
            decode(next_item, cog, b, hs, ws);
            cm0 = chan_mode(conv_bias, cog * COUT + g, s.cout, s.divisor);
            cm1 = chan_mode(conv_bias, cog * COUT + g + 8, s.cout, s.divisor);
        }
        item = next_item;
        pd = next_pd;
        gi = next_gi;
        base = next_base;
    }
}

bool group_can_implement(const convpool_problem &p, convpool_dtype dt, const DeviceInfo &dev, char *why, size_t n)
{
    /* 3^3 has the largest ring of the instantiated kernels. */
    const int smem = dt == CONVPOOL_DTYPE_F32 ? fp::group_smem_bytes<float, fp::G3>() : fp::group_smem_bytes<__half, fp::G3>();
    const bool cubic = p.kernel_h == p.kernel_d && p.kernel_w == p.kernel_d && p.kernel_d >= 1 && p.kernel_d <= 3;
    const bool flat = p.kernel_d == 1 && p.kernel_h == 3 && p.kernel_w == 3;
    const bool deep = p.kernel_d == 3 && p.kernel_h == 1 && p.kernel_w == 1;
    if (!cubic && !flat && !deep)
        return snprintf(why, n, "kernel is not 1^3, 2^3, 3^3, 1x3x3 or 3x1x1"), false;
    if (!fp::tile_pool_ok(p.pool_d, p.pool_h, p.pool_w))
        return snprintf(why, n, "pool needs pool_h in {1, 2, 4} and pool_w in {1, 2, 4, 8}"), false;
    if (smem > dev.smem_optin)
        return snprintf(why, n, "needs %d B of shared memory, the GPU has %d", smem, dev.smem_optin), false;
    return true;
}

Workspace group_workspace(const convpool_problem &p, bool strict)
{
    Workspace ws = {};
    ws.parts = fp::tile_slabs_h(p.pooled_h, p.pool_h) * fp::tile_slabs_w(p.pooled_w, p.pool_w);
    ws.scratch_bytes = packed_weight_bytes(p, strict);
    return ws;
}

/* Internal linkage on purpose: a function-local static of a template with external linkage
 * (the blocks_per_sm cache below) is an STB_GNU_UNIQUE symbol, which the dynamic linker shares
 * between two loaded copies of this code (two PyTorch extensions, RTLD_LOCAL or not); the second
 * copy then skipped raising its own kernel's shared-memory limit and its first launch failed. */
namespace {
template <typename T, bool STRICT, typename G, bool ANY_POOL> convpool_status group_launch(const Plan &plan, const Call &c)
{
    constexpr int smem = fp::group_smem_bytes<T, G>();
    static std::atomic<int> blocks[MAX_DEVICES];
    const Shape &s = c.s;
    const T *x = static_cast<const T *>(c.x);
    const int64_t n_hs = fp::tile_slabs_h(s.pooled_h, s.pool_h), n_ws = fp::tile_slabs_w(s.pooled_w, s.pool_w);
    if (n_hs * n_ws != plan.ws.parts || (uintptr_t)c.scratch % 16 != 0 ||
        ANY_POOL == fp::is_pool2(s.pool_d, s.pool_h, s.pool_w))
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "internal: group got a plan for another shape");
    int per_sm = 0;
    CP_TRY(blocks_per_sm(group_kernel<T, STRICT, G, ANY_POOL>, fp::THREADS, smem, blocks, &per_sm));
    const uint4 *packed = reinterpret_cast<const uint4 *>(c.scratch);
    CP_TRY(pack_weights(s, STRICT, c.w, c.scratch, c.dev, c.stream));
    const int64_t n_cog = ceil_div(s.cout, fp::COUT);
    const int64_t n_items = n_cog * s.batch * n_hs * n_ws;
    const int64_t grid = imin(n_items, (int64_t)c.dev.sms * per_sm);
    group_kernel<T, STRICT, G, ANY_POOL><<<(unsigned)grid, fp::THREADS, smem, c.stream>>>(
        s, x, packed, c.conv_bias, c.partials, n_hs, n_ws, n_cog, n_items, rows_aligned(s, x) ? 1 : 0);
    CP_CUDA_TRY_LAUNCH("group_kernel");
    return CONVPOOL_OK;
}
} // namespace

template <typename T, bool STRICT, bool ANY_POOL> convpool_status group_by_kernel(const Plan &plan, const Call &c)
{
    const Shape &s = c.s;
    if (s.k_d == s.k_h && s.k_d == s.k_w) {
        switch (s.k_d) {
        case 1: return group_launch<T, STRICT, fp::Geo<1, 1, 1>, ANY_POOL>(plan, c);
        case 2: return group_launch<T, STRICT, fp::Geo<2, 2, 2>, ANY_POOL>(plan, c);
        case 3: return group_launch<T, STRICT, fp::Geo<3, 3, 3>, ANY_POOL>(plan, c);
        }
    }
    if (s.k_d == 1 && s.k_h == 3 && s.k_w == 3)
        return group_launch<T, STRICT, fp::Geo<1, 3, 3>, ANY_POOL>(plan, c);
    if (s.k_d == 3 && s.k_h == 1 && s.k_w == 1)
        return group_launch<T, STRICT, fp::Geo<3, 1, 1>, ANY_POOL>(plan, c);
    return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "internal: no group kernel for kernel %lldx%lldx%lld",
                         (long long)s.k_d, (long long)s.k_h, (long long)s.k_w);
}

template <bool ANY_POOL> convpool_status group_by_dtype(const Plan &plan, const Call &c)
{
    switch (c.dtype) {
    case CONVPOOL_DTYPE_F32:
        return c.strict ? group_by_kernel<float, true, ANY_POOL>(plan, c)
                        : group_by_kernel<float, false, ANY_POOL>(plan, c);
    case CONVPOOL_DTYPE_F16:
        return c.strict ? group_by_kernel<__half, true, ANY_POOL>(plan, c)
                        : group_by_kernel<__half, false, ANY_POOL>(plan, c);
    case CONVPOOL_DTYPE_BF16:
        return c.strict ? group_by_kernel<__nv_bfloat16, true, ANY_POOL>(plan, c)
                        : group_by_kernel<__nv_bfloat16, false, ANY_POOL>(plan, c);
    }
    return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "internal: group got dtype %d", (int)c.dtype);
}

convpool_status group_run(const Plan &plan, const Call &c)
{
    return fp::is_pool2(c.s.pool_d, c.s.pool_h, c.s.pool_w) ? group_by_dtype<false>(plan, c)
                                                             : group_by_dtype<true>(plan, c);
}

} // namespace convpool_cuda
