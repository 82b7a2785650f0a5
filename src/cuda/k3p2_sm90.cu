/*
 * k3p2_sm90: the k3p2 problem (kernel 3^3, Cin <= 8, Cout <= 16, pool 2^3) in TF32 on f32 x, on
 * Hopper's warpgroup MMA (wgmma, sm_90a); with CODES also the training forward's arg-max codes.
 *
 * A block is one warpgroup (4 warps); an item is (b, pooled d, w tile, chunk of pooled h rows).
 * A tile's 64 x columns are wgmma's M. The kernel column tw is folded into N: one
 * wgmma.m64n48k8 multiplies an unshifted x row (K = the 8 input channels) by the weights of one
 * (td, th) for all three tw (N = 3 x 16 output channels), so a conv row is 9 wgmmas, and
 * y[m] = P0[m] + P1[m + 1] + P2[m + 2] afterwards: rows m + 1 and m + 2 come from the lanes 4
 * and 8 on, or, past a warp's 16 rows, from the next warp through shared memory. A tile thus
 * yields 62 conv columns, 31 pooled windows. A comes from registers: each thread loads its own
 * A fragment of every x row straight from global memory, TF32-rounded; a step's 16 rows (4 d x
 * 4 h) stay in registers and the next step's 8 new rows load while this step's wgmmas run. The
 * weights sit in shared memory (13.5 KB) instead of k3p2's 108 registers. The pooling epilogue
 * is k3p2's rule (tile.cuh): a window's 2x2 (d, h) are a thread's 4 conv rows, its w pair two
 * lanes 4 apart.
 * KERNEL_NOTES ("wgmma") has the measurements behind this layout; the probe it came from is
 * docs/experiments/wgmma_conv.cu.
 *
 * The body exists only where nvcc compiles for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); the build
 * says so with CONVPOOL_HAVE_SM90A, without which the plan never picks it. Compiled for any
 * other target the kernel writes NaN partial sums, so a mismatched build is loud, not wrong.
 */
#include "kernels.h"
#include "tile.cuh"
#include "wgmma.cuh"

namespace convpool_cuda {

namespace sm90 {
constexpr int THREADS = 128;
constexpr int TILE_X = 64;                  /* x columns a tile (wgmma M) */
constexpr int TILE_PW = (TILE_X - 2) / 2;   /* pooled windows a tile: 31 */
constexpr int W_BYTES = 9 * 1536;           /* [td th][K half][tw x 16 + co][4 ci], TF32 */
constexpr int XCH_FLOATS = 4 * 4 * 2 * 32;  /* [warp][conv row][tw 1, 2][2 rows x 16 channels] */
constexpr int RED_FLOATS = 4 * 16;          /* [warp][channel] */
constexpr int SMEM = W_BYTES + 4 * (XCH_FLOATS + RED_FLOATS);
constexpr int MIN_BLOCKS = 2;               /* 2 x 128 threads at up to 255 registers */
} // namespace sm90

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace {

/* One step's windows without codes (see the kernel's epilogue for the split of a lane pair).
 * MODE: kMaxRaw or kMinRaw where every channel of the block reduces that way (the common case,
 * one uniform branch a step), else -1: each channel's own mode. window_col(e): the pooled column
 * of window e, or -1 where it is past the tile or the output. */
template <int MODE, typename Col>
__device__ __forceinline__ void pool_windows(const float (&y)[4][8], const ChanMode (&cm)[4], const ChanMode (&cmw)[2],
                                             float rdiv, int odd, Col window_col, float (&sum)[2])
{
    float part[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int k = 2 * (e >> 2) + (e & 1);
        if (MODE == kMaxRaw)
            part[e] = nan_max(nan_max(y[0][e], y[1][e]), nan_max(y[2][e], y[3][e]));
        else if (MODE == kMinRaw)
            part[e] = nan_min(nan_min(y[0][e], y[1][e]), nan_min(y[2][e], y[3][e]));
        else
            part[e] = window_reduce<4>({y[0][e], y[1][e], y[2][e], y[3][e]}, cm[k]);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const ChanMode &m = cmw[e & 1];
        const float got = __shfl_xor_sync(0xffffffffu, odd ? part[e] : part[e + 4], 4);
        const float mine = odd ? part[e + 4] : part[e];
        const float a = MODE == kMaxRaw   ? nan_max(mine, got)
                        : MODE == kMinRaw ? nan_min(mine, got)
                                          : window_combine(mine, got, m);
        if (window_col(e + 4 * odd) >= 0)
            sum[e & 1] += MODE < 0 && m.mode == kLiteral ? a : div_rn(a + m.bias, m.div, rdiv);
    }
}

} // namespace
#endif

/* Item = (b, pooled d, w tile wt of 64 x columns from 62 wt, chunk hc of h_chunk pooled h rows);
 * items stride over a persistent grid. Partial sums: [b][c][(pd n_wt + wt) n_hc + hc]. */
template <bool CODES>
__global__ void __launch_bounds__(sm90::THREADS, sm90::MIN_BLOCKS)
k3p2_sm90_kernel(const Shape s, const float *__restrict__ x, const float *__restrict__ w,
                 const float *__restrict__ conv_bias, float *__restrict__ partials, int64_t n_wt, int64_t h_chunk,
                 int64_t n_hc, int64_t n_items, uint8_t *__restrict__ codes)
{
    const int64_t parts = s.pooled_d * n_wt * n_hc;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace sm90;
    constexpr int TAPS = 27;
    extern __shared__ __align__(128) unsigned char smem[];
    float *wsm = reinterpret_cast<float *>(smem);
    float *xch = reinterpret_cast<float *>(smem + W_BYTES);
    float *red = xch + XCH_FLOATS;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, r4 = lane >> 2, c4 = lane & 3;

    /* B tiles: for each (td, th), [K half][tw x 16 + co][4 channels], 8-row core matrices 128 B
     * apart (SBO) and the K halves 768 B apart (LBO). Padded channels are zero. */
    for (int i = tid; i < 16 * 8 * TAPS; i += THREADS) {
        const int co = i / (8 * TAPS), ci = (i / TAPS) % 8, tap = i % TAPS;
        const float v = co < s.cout && ci < s.cin ? w[((int64_t)co * s.cin + ci) * TAPS + tap] : 0.0f;
        wsm[(tap / 3) * 384 + (ci >> 2) * 192 + ((tap % 3) * 16 + co) * 4 + (ci & 3)] = tf32_round(v);
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const uint32_t w_s = (uint32_t)__cvta_generic_to_shared(wsm);

    /* This thread's channels 8 jj + 2 c4 + ec, as sum[2 jj + ec]. */
    ChanMode cm[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
        cm[k] = chan_mode(conv_bias, 8 * (k >> 1) + 2 * c4 + (k & 1), s.cout, s.divisor);

    /* Every channel of the block pooled by max (min) of the raw sums: one uniform branch a step. */
    bool mine_max = true, mine_min = true;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        mine_max = mine_max && cm[k].mode == kMaxRaw;
        mine_min = mine_min && cm[k].mode == kMinRaw;
    }
    const bool all_max = __syncthreads_and(mine_max), all_min = __syncthreads_and(mine_min);
    /* The two channels whose windows this lane finishes (see the epilogue). */
    const int odd = (r4 & 1);
    ChanMode cmw[2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
        cmw[i] = odd ? cm[2 + i] : cm[i];
    const float rdiv = pow2_recip(s.divisor);

    /* A fragment rows m0, m0 + 8 and channels c4, c4 + 4 (odd: m0 is a window's second column). */
    const int m0 = 16 * warp + r4;
    const int64_t plane = s.in_h * s.in_w, chan = s.in_d * plane;
    const bool cv0 = c4 < s.cin, cv1 = c4 + 4 < s.cin;
    const int64_t npool = s.pooled_d * s.pooled_h * s.pooled_w;

    for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
        int64_t r = item;
        const int64_t hc = r % n_hc;
        r /= n_hc;
        const int64_t wt = r % n_wt;
        r /= n_wt;
        const int64_t pd = r % s.pooled_d, b = r / s.pooled_d;
        const int64_t ph0 = hc * h_chunk, ph1 = imin(s.pooled_h, ph0 + h_chunk), w0 = (int64_t)(TILE_X - 2) * wt;
        const bool mv0 = w0 + m0 < s.in_w, mv1 = w0 + m0 + 8 < s.in_w;
        /* The pooled column of this lane's window ew (see the epilogue), or -1 past the tile or
         * the output. */
        auto window_col = [&](int ew) -> int64_t {
            const int m = m0 - odd + 8 * ((ew >> 1) & 1);
            const int64_t pw = (int64_t)TILE_PW * wt + m / 2;
            return m / 2 < TILE_PW && pw < s.pooled_w ? pw : -1;
        };
        /* x rows 2 pd .. 2 pd + 3 of d; the loads past the row or the channels read zeros. */
        const int64_t base = (b * s.cin + c4) * chan + 2 * pd * plane + w0 + m0;
        auto load_row = [&](float (&a)[4], int dl, int64_t h) {
            const int64_t o = base + dl * plane + h * s.in_w;
            a[0] = cv0 && mv0 ? __ldg(x + o) : 0.0f;
            a[1] = cv0 && mv1 ? __ldg(x + o + 8) : 0.0f;
            a[2] = cv1 && mv0 ? __ldg(x + o + 4 * chan) : 0.0f;
            a[3] = cv1 && mv1 ? __ldg(x + o + 4 * chan + 8) : 0.0f;
        };
        /* cur: TF32 A fragments; nxt: the next step's raw rows, rounded only when they slide in,
         * after this step's wgmmas (rounding at the load would wait for it before them). */
        uint32_t cur[4][4][4];
        float nxt[4][2][4];
#pragma unroll
        for (int dl = 0; dl < 4; ++dl)
#pragma unroll
            for (int hl = 0; hl < 4; ++hl) {
                float a[4];
                load_row(a, dl, 2 * ph0 + hl);
#pragma unroll
                for (int k = 0; k < 4; ++k)
                    cur[dl][hl][k] = to_tf32(a[k]);
            }
        float sum2[2] = {0.0f, 0.0f}; /* this lane's channels 8 odd + 2 c4 + {0, 1} */
        for (int64_t ph = ph0; ph < ph1; ++ph) {
            /* Conv row q = (dd, hh) takes x row (dl, hl) at tap (dl - dd, hl - hh). */
            float p[4][24];
            /* The A registers are final before the first wgmma: a move the compiler sank into the
             * wgmma sequence would make ptxas serialise it (C7513). */
            pin(cur);
            wg_fence();
#pragma unroll
            for (int dl = 0; dl < 4; ++dl)
#pragma unroll
                for (int hl = 0; hl < 4; ++hl)
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        const int td = dl - (q >> 1), th = hl - (q & 1);
                        if (td < 0 || td > 2 || th < 0 || th > 2)
                            continue;
                        wgmma_m64n48k8(p[q], cur[dl][hl], wg_desc(w_s + (td * 3 + th) * 1536, 768, 128),
                                       !(td == 0 && th == 0));
                    }
            wg_commit();
            /* The next step's rows load while the wgmmas run. */
            if (ph + 1 < ph1)
#pragma unroll
                for (int dl = 0; dl < 4; ++dl)
#pragma unroll
                    for (int j = 0; j < 2; ++j)
                        load_row(nxt[dl][j], dl, 2 * ph + 4 + j);
            wg_wait_all();
            pin(cur);
            pin(p);
            float y[4][8];
            fold_shift_add(p, y, xch, warp, lane);

            /* Windows. Register e = 4 jj + 2 half + ec is row m0 + 8 half, channel 8 jj + 2 c4 + ec; a
             * window's columns are rows m, m + 1, lanes 4 apart. The pair splits the work: the lane
             * of the even row takes channels 0-7 (e < 4), the other channels 8-15, each getting the
             * partner's values for its windows by one exchange. */
            if constexpr (CODES) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int ew = e + 4 * odd;
                    float v[8]; /* raster order (dd, hh, ww): conv row q = 2 dd + hh, column ww */
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        const float got = __shfl_xor_sync(0xffffffffu, odd ? y[q][e] : y[q][e + 4], 4);
                        v[2 * q] = odd ? got : y[q][e];
                        v[2 * q + 1] = odd ? y[q][e + 4] : got;
                    }
                    const int64_t pw = window_col(ew);
                    if (pw >= 0) {
                        float best;
                        const uint32_t code = window8_code(v, cmw[e & 1], best);
                        sum2[e & 1] += best;
                        const int64_t co = 8 * odd + 2 * c4 + (e & 1);
                        if (co < s.cout)
                            codes[(b * s.cout + co) * npool + (pd * s.pooled_h + ph) * s.pooled_w + pw] =
                                (uint8_t)code;
                    }
                }
            } else if (all_max) {
                pool_windows<kMaxRaw>(y, cm, cmw, rdiv, odd, window_col, sum2);
            } else if (all_min) {
                pool_windows<kMinRaw>(y, cm, cmw, rdiv, odd, window_col, sum2);
            } else {
                pool_windows<-1>(y, cm, cmw, rdiv, odd, window_col, sum2);
            }
            __syncthreads(); /* xch is read before the next step writes it */
#pragma unroll
            for (int dl = 0; dl < 4; ++dl)
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    cur[dl][0][k] = cur[dl][2][k];
                    cur[dl][1][k] = cur[dl][3][k];
                    cur[dl][2][k] = to_tf32(nxt[dl][0][k]);
                    cur[dl][3][k] = to_tf32(nxt[dl][1][k]);
                }
        }
        /* Lanes of one c4 hold the same channels (channel 8 jj + 2 c4 + ec as sum[2 jj + ec]): add
         * them, then the warps in a fixed order. */
        float sum[4] = {odd ? 0.0f : sum2[0], odd ? 0.0f : sum2[1], odd ? sum2[0] : 0.0f, odd ? sum2[1] : 0.0f};
#pragma unroll
        for (int k = 0; k < 4; ++k)
            for (int o = 4; o < 32; o <<= 1)
                sum[k] += __shfl_xor_sync(0xffffffffu, sum[k], o);
        if (lane < 4)
#pragma unroll
            for (int k = 0; k < 4; ++k)
                red[warp * 16 + 8 * (k >> 1) + 2 * lane + (k & 1)] = sum[k];
        __syncthreads();
        if (tid < s.cout) {
            const int64_t part = (pd * n_wt + wt) * n_hc + hc;
            partials[(b * s.cout + tid) * parts + part] =
                (red[tid] + red[16 + tid]) + (red[32 + tid] + red[48 + tid]);
        }
        __syncthreads(); /* red is read before the next item writes it */
    }
#else
    (void)w;
    (void)conv_bias;
    (void)h_chunk;
    (void)codes;
    /* Not sm_90a code: never planned, and loud if it ever runs. */
    for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
        const int64_t part = item % parts, b = item / parts;
        for (int64_t c = threadIdx.x; c < s.cout; c += blockDim.x)
            partials[(b * s.cout + c) * parts + part] = __int_as_float(0x7fffffff);
    }
    (void)x;
#endif
}

/* ---- host ---- */

namespace {

/* w tiles a row of pooled_w windows takes (31 a tile). */
int64_t w_tiles(int64_t pooled_w) { return ceil_div(pooled_w, (int64_t)sm90::TILE_PW); }

} // namespace

bool k3p2_sm90_fits(const convpool_problem &p, convpool_dtype dt, bool strict, const DeviceInfo &dev)
{
#if defined(CONVPOOL_HAVE_SM90A)
    /* CONVPOOL_K3P2_SM90: "0" keeps k3p2 on mma.sync, "1" takes wgmma wherever it can run (tests
     * and benchmarks); unset, the plan decides by the tile's use of its 64 rows. */
    const int env = env_switch("CONVPOOL_K3P2_SM90");
    if (env == 0 || dt != CONVPOOL_DTYPE_F32 || strict || dev.cc_major != 9 || dev.cc_minor != 0 ||
        dev.smem_optin < sm90::SMEM || !fp::is_pool2(p.pool_d, p.pool_h, p.pool_w))
        return false;
    /* Measured on an H200 (KERNEL_NOTES "wgmma"): at rows of whole 16-byte chunks the mma.sync
     * kernel is as fast or faster (headline 0.342 against 0.351 ms); where it would first pad
     * every row into the workspace (W % 4 != 0) this one, reading rows in place, wins (15x61x61
     * 0.429 -> 0.250 ms, W 126 1.010 -> 0.601). A tile computes 31 windows whatever the width,
     * so it also needs ~80% of them used. */
    const int64_t n_wt = w_tiles(p.pooled_w);
    const bool pads = padded_width(p.in_w, dt) != p.in_w;
    return env == 1 || (pads && 5 * p.pooled_w >= 4 * sm90::TILE_PW * n_wt);
#else
    (void)p;
    (void)dt;
    (void)strict;
    (void)dev;
    return false;
#endif
}

/* Pooled h rows per item: all of them unless the batch has too few items to fill the GPU; an
 * item costs its steps plus about one (the first step loads 4 x rows of h instead of 2), and
 * items run in waves of SMs x MIN_BLOCKS. */
void k3p2_sm90_workspace(const convpool_problem &p, const DeviceInfo &dev, Workspace *ws)
{
    const int64_t n_wt = w_tiles(p.pooled_w);
    const double base = (double)p.batch * (double)p.pooled_d * (double)n_wt;
    const double slots = (double)imax(1, dev.sms) * sm90::MIN_BLOCKS;
    int64_t best = p.pooled_h;
    double best_cost = ceil(base / slots) * (double)(p.pooled_h + 1);
    for (int64_t chunk = 1; chunk < p.pooled_h && base < slots; ++chunk) {
        const double cost = ceil(base * (double)ceil_div(p.pooled_h, chunk) / slots) * (double)(chunk + 1);
        if (cost < best_cost) {
            best = chunk;
            best_cost = cost;
        }
    }
    ws->sm90 = 1;
    ws->h_chunk = best;
    ws->parts = p.pooled_d * n_wt * ceil_div(p.pooled_h, best);
    ws->scratch_bytes = 0;
}

namespace {
template <bool CODES> convpool_status k3p2_sm90_launch(const Plan &plan, const Call &c)
{
    static std::atomic<int> blocks[MAX_DEVICES];
    const Shape &s = c.s;
    const int64_t n_wt = w_tiles(s.pooled_w), h_chunk = plan.ws.h_chunk;
    const int64_t n_hc = h_chunk > 0 ? ceil_div(s.pooled_h, h_chunk) : 0;
    if (!plan.ws.sm90 || h_chunk < 1 || s.pooled_d * n_wt * n_hc != plan.ws.parts || s.cin > 8 || s.cout > 16)
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "internal: k3p2_sm90 got a plan for another shape");
    int per_sm = 0;
    CP_TRY(blocks_per_sm(k3p2_sm90_kernel<CODES>, sm90::THREADS, sm90::SMEM, blocks, &per_sm));
    const int64_t n_items = s.batch * s.pooled_d * n_wt * n_hc;
    const int64_t grid = imin(n_items, (int64_t)c.dev.sms * per_sm);
    k3p2_sm90_kernel<CODES><<<(unsigned)grid, sm90::THREADS, sm90::SMEM, c.stream>>>(
        s, static_cast<const float *>(c.x), c.w, c.conv_bias, c.partials, n_wt, h_chunk, n_hc, n_items, c.codes);
    CP_CUDA_TRY_LAUNCH("k3p2_sm90_kernel");
    return CONVPOOL_OK;
}
} // namespace

convpool_status k3p2_sm90_run(const Plan &plan, const Call &c)
{
    if (c.dtype != CONVPOOL_DTYPE_F32 || c.strict)
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "internal: k3p2_sm90 runs TF32 on float32 x only");
    return c.codes ? k3p2_sm90_launch<true>(plan, c) : k3p2_sm90_launch<false>(plan, c);
}

} // namespace convpool_cuda
