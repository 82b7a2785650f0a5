/*
 * k3p2: kernel 3^3, Cin <= 8, Cout <= 16, pool 2^3 -- the headline (KernelBench L2 #8) -- and
 * the pools pool_step_any reduces in registers (pool_h in {1, 2, 4}, pool_w in {1, 2, 4, 8},
 * any pool_d; the ANY_POOL instances).
 *
 * The tile of tile.cuh with a ring of 8 input d-planes: a step (2 conv d-rows = one pooled d)
 * needs 4 planes, of which 2 were landed for the previous step, so each plane is read from
 * global memory once. The grid is persistent: two 4-warp blocks per SM stride over work items
 * (b, d-chunk, h-slab, w-slab) and prefetch across items; their barriers drift apart, so one
 * block's staging and pooling overlap the other's MMAs. An item runs every step of its sample's
 * depth unless the batch is too small to fill the GPU (batch 1 at 64x64: 32 items for 264
 * block slots); then the depth is cut into chunks of whole pooling windows, each re-reading
 * the 2 planes of halo it shares with the chunk before (k3p2_workspace picks the chunk).
 *   TF32    weights in registers (108 per thread), each shared-memory x fragment feeds every
 *           output row it touches (72 loads per 216 MMAs); cvt.rna to TF32.
 *   STRICT  3xTF32 (big*big + big*small + small*big); split weights in shared memory, tap-row
 *           outer loop; the big*big products start from zero per tap row and join through FADD
 *           (the tensor cores truncate when they accumulate).
 *   16-bit x is exact in TF32, so STRICT needs 2 MMAs there.
 * CODES (the training forward, f32 x): pool_step<true> also writes every window's arg-max code,
 * so the backward needs no conv recompute. Strict codes are those of the correctly rounded FP32
 * conv: a window whose best and runner-up q lie within the 3xTF32 sums' error bound
 * (strict_tie_tol, from max|x| found first) is flagged, and general.cu's recheck_codes
 * recomputes its conv values in double. (TF32 codes keep the TF32 pick, as a TF32 conv would.)
 * CODES takes pool 2^3 only. The plan picks it for exactly the shapes above whenever its shared
 * memory fits.
 * F16 (TF32 on float32 x, pool 2^3, the inference and the training forward, from 2^21 x
 * positions: k3p2_f16_picks; CONVPOOL_K3P2_F16=0 turns it off, =1 on at every size): the same tile on mma.sync's m16n8k16 float16 MMA, K = two taps x 8 channels
 * (conv_step_f16: 15 MMAs an output row against 27, x converted once an element with cvt.rn to
 * float16, whose 11 significant bits are TF32's). The weights are scaled per output channel by a
 * power of two into float16's range and the pooling undoes it exactly (window8<SCALED>,
 * window8_code<SCALED>). x past 65504, a warp's nonzero x all under 2^-9, or
 * weights outside 2^-86 .. 2^114 or not finite set RANGE_BAD, and the TF32 instance, launched
 * behind it on the same items and gated on that bit, rewrites every output (a call in range pays
 * a launch that exits at once). 236 registers against 239 (inference 233 against 239); the MMA
 * loop 472 instructions a warp-step against 643 (sm_90a SASS). H200 at the headline b128: the
 * training forward 0.411 -> 0.343 ms, the inference one 0.342 -> 0.305 (twenty-sixth session).
 * Its codes epilogue picks on c = v * scale + bias, one compare a position (window8_code<true>),
 * and stores through a pointer formed once an item: 0.343 -> 0.319 ms; its x staging does the
 * lane arithmetic once (stage_pair): 0.319 -> 0.310 (thirtieth session).
 * On a cc 9.0 GPU, TF32 pool-2^3 problems on f32 x whose rows this kernel would pad (W % 4) run
 * k3p2_sm90.cu's wgmma kernel instead (with CODES too), where the build holds sm_90a code and
 * its tiles use their rows (k3p2_sm90_fits says why only there).
 */
#include "kernels.h"
#include "tile.cuh"

namespace convpool_cuda {

/* Strict codes: which of the warp's windows of this step have a constant x field: bit hp * 4 + j
 * for the window of pooled row hp (0, 1) and pooled column j (0 .. 3) of the warp, set where
 * every x value its conv values read (8 channels, the step's 4 planes, conv rows 2 hp .. 2 hp + 1
 * and columns 2 j .. 2 j + 1 with their kernel halo: 4 x 4 per plane) is finite and the same
 * within each channel. Such a window's conv values are all the same exact number (the sum over
 * channels of x_c times the channel's weight sum), so the correctly rounded conv ties at every
 * position and PyTorch's rule picks the first: a near-tie there needs no recheck. Constant
 * regions (a zero or flat background) would otherwise flag every window they hold. Lane
 * (channel lane % 8, plane lane / 8) reads its 6 rows x 10 columns; rows and columns past the
 * input hold zeros or earlier planes' values, which can only clear a bit. */
template <int PITCH>
__device__ __forceinline__ unsigned constant_windows(const float *xs, int base, int warp, int lane)
{
    using namespace fp;
    static_assert(G3::IN_H == 6 && OUT_H == 4, "two pooled rows of 4 x rows a step");
    const int c = lane & 7, di = lane >> 3;
    const float *src = xs + c * PITCH + ((base + di) & SLOT_MASK) * G3::SLOT_ELEMS + 8 * warp;
    float ref[2][4];
    bool ok[2][4];
#pragma unroll
    for (int r = 0; r < G3::IN_H; ++r) {
        const float4 a = *reinterpret_cast<const float4 *>(src + r * ROW);
        const float4 b = *reinterpret_cast<const float4 *>(src + r * ROW + 4);
        const float2 h = *reinterpret_cast<const float2 *>(src + r * ROW + 8);
        const float v[10] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w, h.x, h.y};
#pragma unroll
        for (int hp = 0; hp < 2; ++hp) {
            if (r < 2 * hp || r >= 2 * hp + 4)
                continue;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (r == 2 * hp) {
                    ref[hp][j] = v[2 * j];
                    ok[hp][j] = isfinite(v[2 * j]);
                }
                ok[hp][j] = ok[hp][j] && v[2 * j] == ref[hp][j] && v[2 * j + 1] == ref[hp][j] &&
                            v[2 * j + 2] == ref[hp][j] && v[2 * j + 3] == ref[hp][j];
            }
        }
    }
    unsigned bits = 0;
#pragma unroll
    for (int hp = 0; hp < 2; ++hp)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            /* the same value in every plane: lane c holds the channel's first plane */
            const bool same = __shfl_sync(0xffffffffu, ref[hp][j], c) == ref[hp][j];
            bits |= ok[hp][j] && same ? 1u << (hp * 4 + j) : 0u;
        }
    return __reduce_and_sync(0xffffffffu, bits);
}

/* The range word's bit (k3p2_kernel's F16 instance and its TF32 rerun). */
constexpr unsigned RANGE_BAD = 1u;

/* Kernel 3^3, Cin <= 8, Cout <= 16 (see the top comment). Item = (b, d-chunk dc, h-slab hs,
 * w-slab ws); step = 2 conv d-rows (pool 2^3: one pooled d), d_chunk of them per item, numbered
 * from the sample's first conv d-row. ANY_POOL: the pools of pool_step_any. */
template <typename T, bool STRICT, bool CODES = false, bool ANY_POOL = false, bool F16 = false, bool RERUN = false>
__global__ void __launch_bounds__(fp::THREADS, fp::MIN_BLOCKS)
k3p2_kernel(const Shape s, const T *__restrict__ x, const float *__restrict__ w,
            const float *__restrict__ conv_bias, float *__restrict__ partials, int64_t n_hs,
            int64_t n_ws, int64_t d_chunk, int64_t n_dc, int64_t n_items, int aligned, uint8_t *__restrict__ codes,
            const unsigned *__restrict__ xmax, unsigned *__restrict__ range, int range_n, const FinishFold fold)
{
    using namespace fp;
    static_assert(!F16 || (std::is_same<T, float>::value && !STRICT && !ANY_POOL),
                  "float16 operands: TF32 on float32 x, pool 2^3");
    static_assert(!RERUN || (std::is_same<T, float>::value && !STRICT && !ANY_POOL && !F16),
                  "the rerun is the TF32 instance on float32 x");
    /* RERUN with fold.pooled: the call's finish too (Cout <= 32), a warp a sample; the lane's bias
     * is a call input, loaded before the wait. */
    const int lane0 = threadIdx.x & 31;
    const float fin_bc = RERUN && fold.out && lane0 < s.cout ? fold.bias[lane0] : 0.0f;
    const double windows = (double)s.pooled_d * (double)s.pooled_h * (double)s.pooled_w;
    griddep_wait();
    /* range: range[0] counts the rerun's ended blocks (the F16 instance's block 0 zeroes it);
     * the F16 instance's block b stores range[1 + b], RANGE_BAD where its operands left
     * float16's range (its outputs are then void), else 0 (every block stores its word, so the
     * words need no memset); the rerun (RERUN, the TF32 instance behind it) runs only where one
     * of the range_n words has that bit, and else, given fold, finishes the call at once. */
    if constexpr (RERUN) {
        unsigned bad = 0u;
        for (int i = threadIdx.x; i < range_n; i += THREADS)
            bad |= range[1 + i];
        if (!__syncthreads_or((int)(bad & RANGE_BAD))) {
            if (fold.pooled)
                for (int64_t b = blockIdx.x * (int64_t)WARPS + (threadIdx.x >> 5); b < s.batch;
                     b += (int64_t)gridDim.x * WARPS)
                    finish_warp_sample(partials, fold.parts, s.cout, windows, fin_bc, fold.pooled, fold.out, b);
            return;
        }
    }
    __shared__ unsigned range_bad; /* F16: this block's range word; RERUN: whether it ends last */
    constexpr int PITCH = F16 ? chan_pitch_pairs(RING_ELEMS) : chan_pitch<T>(RING_ELEMS);
    constexpr int TAPS = G3::TAPS;
    /* With the row-wise unaligned staging compiled in, ptxas allocates the f32 variants so that
     * the aligned headline runs 1-3% slower (the 16-bit ones 2-3% faster): f32 keeps the first
     * version's element loop for unaligned rows (pool 2^3 only; ANY_POOL's staging must skip
     * planes past the input, which the row-wise copies do). */
    constexpr bool SYNC_STAGING = !ANY_POOL && (CONVPOOL_K3P2_SYNC_STAGING == 2 ||
                                                (CONVPOOL_K3P2_SYNC_STAGING == 1 && std::is_same<T, float>::value));
    constexpr int XB = F16 ? x_bytes_pairs() : x_bytes<T>();
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *xs = reinterpret_cast<T *>(smem_raw);
    const uint4 *wfrag = reinterpret_cast<const uint4 *>(smem_raw + XB);
    float *red = reinterpret_cast<float *>(smem_raw + XB + (STRICT ? WFRAG_BYTES : 0));

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    int64_t item = blockIdx.x;
    if (item >= n_items) /* never: the grid is at most n_items (the rerun reads every block's word) */
        return;
    if (F16 && tid == 0)
        range_bad = 0u;

    /* Zero the ring once: padded channels and columns must read as finite zeros. */
    for (int i = tid; i < XB / 16; i += THREADS)
        reinterpret_cast<uint4 *>(smem_raw)[i] = make_uint4(0u, 0u, 0u, 0u);

    /* A fragment of tap k: a0 = W[g][t], a1 = W[g+8][t], a2 = W[g][t+4], a3 = W[g+8][t+4]. */
    auto wval = [&](int co, int ci, int tap) -> float {
        return (co < s.cout && ci < s.cin) ? w[((int64_t)co * s.cin + ci) * TAPS + tap] : 0.0f;
    };
    uint32_t wr[STRICT || F16 ? 1 : TAPS][4];
    /* F16: the A fragments of conv_step_f16's tap pairs, each output channel's weights times
     * 2^k (k = 14 - its largest |w|'s exponent, so they span float16's range); wsc = 2^-k undoes
     * it in the pick. Weights outside 2^-86 .. 2^114 (k past +-100) or not finite: RANGE_BAD. */
    uint32_t wp[F16 ? 3 : 1][3][4], wq[F16 ? 3 : 1][4], wrr[F16 ? 3 : 1][2];
    float wsc0 = 1.0f, wsc1 = 1.0f;
    bool weights_bad = false; /* F16: the same in every warp (the lanes cover every weight) */
    if constexpr (F16) {
        float m0 = 0.0f, m1 = 0.0f;
        for (int k = 0; k < TAPS; ++k)
            for (int j = 0; j < 2; ++j) {
                m0 = fmaxf(m0, fabsf(wval(g, 2 * t + j, k)));
                m1 = fmaxf(m1, fabsf(wval(g + 8, 2 * t + j, k)));
            }
        bool bad = false;
        for (int j = 0; j < 2; ++j) {
            const int o = j ? 1 : 2;
            m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, o));
            m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, o));
        }
        float up[2];
        const float ms[2] = {m0, m1};
        for (int h = 0; h < 2; ++h) {
            int k = 0;
            if (!isfinite(ms[h]))
                bad = true;
            else if (ms[h] > 0.0f)
                k = 14 - ilogbf(ms[h]);
            bad = bad || k < -100 || k > 100;
            k = max(-100, min(100, k));
            up[h] = ldexpf(1.0f, k);
            (h ? wsc1 : wsc0) = ldexpf(1.0f, -k);
        }
        weights_bad = __any_sync(0xffffffffu, bad);
        /* A pair of taps (T0: K 0-7, T1: K 8-15; T1 < 0: zero). */
        auto frag = [&](int t0, int t1, uint32_t (&a)[4]) {
            const auto wv = [&](int co, int ci, int tap, float sc) { return tap < 0 ? 0.0f : wval(co, ci, tap) * sc; };
            a[0] = pack_half2(wv(g, 2 * t, t0, up[0]), wv(g, 2 * t + 1, t0, up[0]));
            a[1] = pack_half2(wv(g + 8, 2 * t, t0, up[1]), wv(g + 8, 2 * t + 1, t0, up[1]));
            a[2] = pack_half2(wv(g, 2 * t, t1, up[0]), wv(g, 2 * t + 1, t1, up[0]));
            a[3] = pack_half2(wv(g + 8, 2 * t, t1, up[1]), wv(g + 8, 2 * t + 1, t1, up[1]));
        };
#pragma unroll
        for (int kd = 0; kd < 3; ++kd) {
#pragma unroll
            for (int kh = 0; kh < 3; ++kh)
                frag((kd * 3 + kh) * 3 + 0, (kd * 3 + kh) * 3 + 1, wp[kd][kh]);
            frag((kd * 3 + 0) * 3 + 2, (kd * 3 + 1) * 3 + 2, wq[kd]);
            uint32_t a[4];
            frag((kd * 3 + 2) * 3 + 2, -1, a);
            wrr[kd][0] = a[0];
            wrr[kd][1] = a[1];
        }
    } else if constexpr (!STRICT) {
#pragma unroll
        for (int k = 0; k < TAPS; ++k) {
            wr[k][0] = to_tf32(wval(g, t, k));
            wr[k][1] = to_tf32(wval(g + 8, t, k));
            wr[k][2] = to_tf32(wval(g, t + 4, k));
            wr[k][3] = to_tf32(wval(g + 8, t + 4, k));
        }
    } else {
        uint4 *wf = reinterpret_cast<uint4 *>(smem_raw + x_bytes<T>());
        for (int i = tid; i < TAPS * 32; i += THREADS) {
            const int k = i >> 5, ln = i & 31, gg = ln >> 2, tt = ln & 3;
            const float v[4] = {wval(gg, tt, k), wval(gg + 8, tt, k), wval(gg, tt + 4, k),
                                wval(gg + 8, tt + 4, k)};
            uint32_t big[4], small[4];
            for (int e = 0; e < 4; ++e) {
                big[e] = to_tf32(v[e]);
                small[e] = isfinite(v[e]) ? to_tf32(v[e] - __uint_as_float(big[e])) : 0u;
            }
            wf[i] = make_uint4(big[0], big[1], big[2], big[3]);
            wf[TAPS * 32 + i] = make_uint4(small[0], small[1], small[2], small[3]);
        }
    }
    const ChanMode cm0 = chan_mode(conv_bias, g, s.cout, s.divisor);
    const ChanMode cm1 = chan_mode(conv_bias, g + 8, s.cout, s.divisor);
    /* Strict codes: the near-tie bounds of channels g and g + 8 in v units (strict_tie_tol: a
     * tap row is 3 MMAs, its 9 rows join acc by FADD). */
    constexpr bool TIES = CODES && STRICT;
    float tol0 = 0.0f, tol1 = 0.0f;
    if constexpr (TIES) {
        const float xm = __uint_as_float(*xmax);
        const int64_t K = s.cin * TAPS;
        float l1[2] = {0.0f, 0.0f};
        for (int h = 0; h < 2; ++h)
            if (g + 8 * h < s.cout)
                for (int64_t k = 0; k < K; ++k)
                    l1[h] += fabsf(__ldg(w + (g + 8 * h) * K + k));
        tol0 = strict_tie_tol(l1[0], xm, cm0.bias, s.divisor, 3.0f, 9.0f);
        tol1 = strict_tie_tol(l1[1], xm, cm1.bias, s.divisor, 3.0f, 9.0f);
    }
    const int64_t nparts = n_dc * n_hs * n_ws;
    const int64_t n_steps = ANY_POOL ? fp::tile_steps(s.pooled_d, s.pool_d) : s.pooled_d;
    const int ph_shift = fp::log2_small(s.pool_h), pw_shift = fp::log2_small(s.pool_w);
    float run[2][OUT_H][2]; /* ANY_POOL: windows open across steps */
    zero_regs(run);

    auto decode = [&](int64_t it, int64_t &b, int64_t &dc, int64_t &hs, int64_t &ws) {
        ws = it % n_ws;
        int64_t r = it / n_ws;
        hs = r % n_hs;
        r /= n_hs;
        dc = r % n_dc;
        b = r / n_dc;
    };
    /* This lane's pooled column in w-slab ws (pool 2). */
    const auto pooled_col = [&](int64_t ws) { return ws * (OUT_W / 2) + 4 * warp + t; };
    /* CODES: channel g's code of the step's first window (pooled d step, pooled row 2 hs, this
     * lane's pooled column) of sample b. Formed when an item starts and moved a pooled plane a
     * step; the stores are offsets from it. */
    auto code_at = [&](int64_t b, int64_t hs, int64_t ws, int64_t step) {
        const int64_t pw = pooled_col(ws);
        return CODES ? codes + ((b * s.cout + g) * s.pooled_d + step) * (s.pooled_h * s.pooled_w) +
                           hs * (OUT_H / 2) * s.pooled_w + pw
                     : nullptr;
    };
    /* F16 with 16-byte rows (the headline's instances): stage_planes' aligned copies with their
     * lane arithmetic done here once. Copy j of a channel is row j * RPI + lane / MC of the two
     * planes (plane pi = row / IN_H, row r = row % IN_H), chunk q = lane % MC; lanes under
     * 2 IN_H also copy their row's halo chunk. s_off / d_off: the copy's offset in x from the
     * slab's corner (plane0, h0, w0) and in the ring from slot0, both per channel; int32 where
     * the largest (the second plane's last row and halo) fits (fast_stage). A call then costs a base
     * pointer, the row and column checks, and a 64-bit add a copy: the general loop's
     * divisions and index products took ~150 instructions a channel (sm_90a SASS), ~300 of a
     * step's ~1000, where the kernel is issue-bound. */
    constexpr int EPC = 4, MC = OUT_W / EPC, RPI = 32 / MC, NJ = (2 * G3::IN_H + RPI - 1) / RPI;
    const int64_t plane_hw = s.in_h * s.in_w;
    const bool fast_stage =
        F16 && aligned != 0 && plane_hw + G3::IN_H * s.in_w + OUT_W + EPC < ((int64_t)1 << 31); /* s_off's bound */
    int s_off[NJ + 1], d_off[NJ + 1], r_of[NJ + 1];
    bool copy_on[NJ + 1];
#pragma unroll
    for (int j = 0; j <= NJ; ++j) {
        const int row = j < NJ ? j * RPI + lane / MC : lane, pi = row / G3::IN_H, r = row % G3::IN_H;
        const int col = j < NJ ? (lane % MC) * EPC : OUT_W;
        copy_on[j] = row < 2 * G3::IN_H;
        r_of[j] = r;
        s_off[j] = (int)(pi * plane_hw + r * s.in_w) + col;
        d_off[j] = pi * G3::SLOT_ELEMS + r * ROW + col;
    }
    auto stage_pair = [&](int64_t b, int64_t hs, int64_t ws, int64_t plane0, int slot0) {
        if (!fast_stage) {
            stage_planes<T, 2, G3, SYNC_STAGING, ANY_POOL>(xs, s, x, b, 0, s.cin, hs * OUT_H, ws * OUT_W, plane0,
                                                           slot0, aligned != 0, false, PITCH);
            return;
        }
        const int64_t h0 = hs * OUT_H, w0 = ws * OUT_W;
        const T *src = x + x_index(s, b, 0, plane0, h0, w0);
        const bool col_ok = w0 + (lane % MC) * EPC < s.in_w;
        const int64_t left = s.in_w - (w0 + OUT_W); /* halo columns: those the row goes on for */
        const int halo_bytes = (int)(left < EPC ? left : EPC) * (int)sizeof(T);
#pragma unroll
        for (int k = 0; k < CIN / WARPS; ++k) {
            const int c = warp + k * WARPS;
            if (c >= s.cin)
                break;
            const T *src_c = src + c * (s.in_d * plane_hw);
            T *dst_c = xs + c * PITCH + slot0 * G3::SLOT_ELEMS;
#pragma unroll
            for (int j = 0; j <= NJ; ++j) {
                const bool on = copy_on[j] && h0 + r_of[j] < s.in_h && (j < NJ ? col_ok : left > 0);
                if (on)
                    cp_async16(dst_c + d_off[j], src_c + s_off[j], j < NJ ? 16 : halo_bytes);
            }
        }
    };

    __syncthreads(); /* zeroing before any cp.async lands (and range_bad's) */
    if (F16 && weights_bad && tid == 0)
        range_bad = RANGE_BAD;
    int64_t b, dc, hs, ws;
    decode(item, b, dc, hs, ws);
    int64_t step = dc * d_chunk;                          /* the item's first step */
    int64_t last = imin(n_steps, step + d_chunk) - 1;     /* and its last */
    stage_pair(b, hs, ws, 2 * step, 0);
    stage_pair(b, hs, ws, 2 * step + 2, 2);
    cp_async_commit();

    int base = 0; /* ring slot of the current step's first input plane */
    uint8_t *code_g = TIES ? nullptr : code_at(b, hs, ws, step); /* TIES addresses its own stores */
    const int64_t code_ch8 = 8 * s.pooled_d * s.pooled_h * s.pooled_w; /* channel g + 8's codes */
    float sum0 = 0.0f, sum1 = 0.0f;
    /* This lane's B element: channel t, column g (F16: channel 2t). */
    const T *xw = xs + (F16 ? 2 * t : t) * PITCH + 8 * warp + g;
    __half2 xmax16 = __float2half2_rn(0.0f); /* F16: the largest |x| converted */

    for (;;) {
        cp_async_wait_all();
        __syncthreads(); /* current planes visible; every warp is done with the previous step */

        /* Prefetch the next step into slots this step does not read. */
        int64_t next_item = item, next_step = step + 1;
        int next_base = base + 2;
        int64_t nb = b, ndc = dc, nh = hs, nw = ws;
        if (step == last) {
            next_item = item + gridDim.x;
            next_base = base + 4;
        }
        if (next_item < n_items) {
            if (next_item != item) {
                decode(next_item, nb, ndc, nh, nw);
                next_step = ndc * d_chunk;
                stage_pair(nb, nh, nw, 2 * next_step, next_base & (SLOTS - 1));
                stage_pair(nb, nh, nw, 2 * next_step + 2, (next_base + 2) & (SLOTS - 1));
            } else {
                stage_pair(b, hs, ws, 2 * next_step + 2, (base + 4) & (SLOTS - 1));
            }
        }
        cp_async_commit();

        const int64_t pw = pooled_col(ws);
        const bool active = ANY_POOL ? ws * OUT_W + 8 * warp < s.pooled_w * s.pool_w
                                     : ws * (OUT_W / 2) + 4 * warp < s.pooled_w;
        if (active) {
            float acc[2][OUT_H][4];
            zero_regs(acc);
            if constexpr (F16)
                conv_step_f16<PITCH>(acc, xw, base, wp, wq, wrr, xmax16);
            else
                conv_step<T, STRICT, 3, 3, 3, PITCH>(acc, xw, base, wr, wfrag, lane);
            if constexpr (ANY_POOL) {
                pool_step_any(acc, s, step, hs * OUT_H, ws * OUT_W + 8 * warp + 2 * t, ph_shift, pw_shift, cm0, cm1,
                              run, sum0, sum1);
            } else if constexpr (TIES) {
                uint32_t code[2][2];
                const int64_t ph0 = hs * (OUT_H / 2);
                pool_step_ties(acc, s, ph0, pw, cm0, cm1, sum0, sum1, tol0, tol1, code);
                /* Near-ties in a constant x field are exact ties (constant_windows): code 0,
                 * in a channel whose bound is finite (finite weights) and whose mode is not
                 * literal (there a NaN q picks the last position). Checked only in a step where
                 * some window of the warp was flagged. */
                const bool flagged = code[0][0] == 0xffu || code[0][1] == 0xffu || code[1][0] == 0xffu ||
                                     code[1][1] == 0xffu;
                if (__any_sync(0xffffffffu, flagged)) {
                    const unsigned flat = constant_windows<PITCH>(xs, base, warp, lane);
                    const bool exact[2] = {isfinite(tol0) && cm0.mode != kLiteral,
                                           isfinite(tol1) && cm1.mode != kLiteral};
#pragma unroll
                    for (int hp = 0; hp < 2; ++hp)
#pragma unroll
                        for (int e = 0; e < 2; ++e)
                            if (code[hp][e] == 0xffu && exact[e] && (flat >> (hp * 4 + t)) & 1u)
                                code[hp][e] = 0u;
                }
                const int64_t npool = s.pooled_d * s.pooled_h * s.pooled_w;
                uint8_t *cb = codes + b * s.cout * npool;
#pragma unroll
                for (int hp = 0; hp < 2; ++hp) {
                    const int64_t win = (step * s.pooled_h + ph0 + hp) * s.pooled_w + pw;
                    if (code[hp][0] != 0x100u && g < s.cout)
                        cb[g * npool + win] = (uint8_t)code[hp][0];
                    if (code[hp][1] != 0x100u && g + 8 < s.cout)
                        cb[(g + 8) * npool + win] = (uint8_t)code[hp][1];
                }
            } else {
                pool_step<CODES, F16>(acc, s, hs * (OUT_H / 2), pw, cm0, cm1, sum0, sum1, g, code_g, code_ch8, wsc0,
                                      wsc1);
            }
        }

        if (step == last) {
            write_item_sums(sum0, sum1, red, s, b, 0, (dc * n_hs + hs) * n_ws + ws, nparts, partials);
            sum0 = 0.0f;
            sum1 = 0.0f;
        }

        if (next_item >= n_items)
            break;
        if (next_item != item) {
            b = nb;
            dc = ndc;
            hs = nh;
            ws = nw;
            last = imin(n_steps, next_step + d_chunk) - 1;
            code_g = TIES ? nullptr : code_at(b, hs, ws, next_step);
        } else if (CODES && !TIES) {
            code_g += s.pooled_h * s.pooled_w;
        }
        item = next_item;
        step = next_step;
        base = next_base & (SLOTS - 1);
    }
    griddep_trigger(); /* the gated rerun or finish behind may take this block's slot once it ends */
    if constexpr (F16) {
        /* The warp's largest converted |x| out of range: the TF32 rerun takes the whole call. */
        const float m = fmaxf(__low2float(xmax16), __high2float(xmax16));
        const float wm = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(m)));
        if (lane == 0 && f16_x_out_of_range(wm))
            range_bad = RANGE_BAD;
        __syncthreads();
        if (tid == 0) {
            range[1 + blockIdx.x] = range_bad;
            if (blockIdx.x == 0)
                range[0] = 0u; /* the rerun's count of ended blocks */
        }
    }
    if constexpr (RERUN) {
        if (fold.pooled) {
            /* The rerun's last block to end finishes the call from every block's partials. */
            __threadfence(); /* this thread's partials, before the count */
            __syncthreads();
            if (tid == 0)
                range_bad = atomicAdd(range, 1u) == gridDim.x - 1;
            __syncthreads();
            if (range_bad) {
                __threadfence();
                for (int64_t b = warp; b < s.batch; b += WARPS)
                    finish_warp_sample(partials, fold.parts, s.cout, windows, fin_bc, fold.pooled, fold.out, b);
            }
        }
    }
}

bool k3p2_can_implement(const convpool_problem &p, convpool_dtype dt, const DeviceInfo &dev, char *why, size_t n)
{
    const int smem = dt == CONVPOOL_DTYPE_F32 ? fp::smem_bytes<float, true>() : fp::smem_bytes<__half, true>();
    if (p.kernel_d != 3 || p.kernel_h != 3 || p.kernel_w != 3)
        return snprintf(why, n, "kernel is not 3x3x3"), false;
    if (!fp::tile_pool_ok(p.pool_d, p.pool_h, p.pool_w))
        return snprintf(why, n, "pool needs pool_h in {1, 2, 4} and pool_w in {1, 2, 4, 8}"), false;
    if (p.in_channels > fp::CIN || p.out_channels > fp::COUT)
        return snprintf(why, n, "needs Cin <= %d and Cout <= %d", fp::CIN, fp::COUT), false;
    if (smem > dev.smem_optin)
        return snprintf(why, n, "needs %d B of shared memory, the GPU has %d", smem, dev.smem_optin), false;
    return true;
}

/* The float16 instance's range words a workspace holds per SM: its grid is at most that many
 * blocks an SM (it runs 2; the words are 4 bytes). */
constexpr int64_t K3P2_RANGE_WORDS_PER_SM = 8;

/* Steps per item. An item's time is about its steps plus one (the prologue stages 2 planes of
 * halo, half a step's reading); the batch's items run in waves of SMs x MIN_BLOCKS. The depth
 * is cut only where that shortens ceil(items / slots) x (steps + 1), in chunks of whole
 * pooling windows (a multiple of pool_d / gcd(2, pool_d) steps), so no window spans two
 * items; ties keep the longer chunk. Large batches keep every step in one item. */
int64_t k3p2_d_chunk(const convpool_problem &p, const DeviceInfo &dev)
{
    const int64_t n_steps = fp::tile_steps(p.pooled_d, p.pool_d);
    const int64_t unit = p.pool_d % 2 == 0 ? p.pool_d / 2 : p.pool_d;
    const double base = (double)p.batch * (double)fp::tile_slabs_h(p.pooled_h, p.pool_h) *
                        (double)fp::tile_slabs_w(p.pooled_w, p.pool_w);
    const double slots = (double)imax(1, dev.sms) * fp::MIN_BLOCKS;
    int64_t best = n_steps;
    double best_cost = ceil(base / slots) * (double)(n_steps + 1);
    if (base >= slots)
        return best;
    for (int64_t chunk = unit; chunk < n_steps; chunk += unit) {
        const double cost = ceil(base * (double)ceil_div(n_steps, chunk) / slots) * (double)(chunk + 1);
        if (cost < best_cost) {
            best = chunk;
            best_cost = cost;
        }
    }
    return best;
}

Workspace k3p2_workspace(const convpool_problem &p, bool strict, convpool_dtype dt, const DeviceInfo &dev)
{
    Workspace ws = {};
    if (k3p2_sm90_fits(p, dt, strict, dev)) {
        k3p2_sm90_workspace(p, dev, &ws);
        return ws;
    }
    ws.d_chunk = k3p2_d_chunk(p, dev);
    ws.parts = ceil_div(fp::tile_steps(p.pooled_d, p.pool_d), ws.d_chunk) *
               fp::tile_slabs_h(p.pooled_h, p.pool_h) * fp::tile_slabs_w(p.pooled_w, p.pool_w);
    /* The strict training forward's max|x| (near_tie_xmax); for TF32 the float16 instance's range
     * words, one a block of its grid (at most K3P2_RANGE_WORDS_PER_SM an SM). */
    ws.scratch_bytes = dt != CONVPOOL_DTYPE_F32 ? 0
                       : strict                ? 16
                                               : imax(16, ((int64_t)imax(1, dev.sms) * K3P2_RANGE_WORDS_PER_SM + 1) * 4);
    return ws;
}

/* Internal linkage on purpose: a function-local static of a template with external linkage
 * (the blocks_per_sm cache below) is an STB_GNU_UNIQUE symbol, which the dynamic linker shares
 * between two loaded copies of this code (two PyTorch extensions, RTLD_LOCAL or not); the second
 * copy then skipped raising its own kernel's shared-memory limit and its first launch failed. */
namespace {
/* range: the F16 instance's range words, one a block, of which there are at most *range_n
 * (the grid is cut to that, and *range_n set to the grid); or for the TF32 instance the F16
 * launch's *range_n words, its gate (it runs only where one holds RANGE_BAD); NULL otherwise. */
template <typename T, bool STRICT, bool CODES = false, bool ANY_POOL = false, bool F16 = false, bool RERUN = false>
convpool_status k3p2_launch(const Plan &plan, const Call &c, unsigned *range = nullptr, int *range_n = nullptr,
                            bool dependent = false, const FinishFold *fold = nullptr)
{
    constexpr int smem = F16 ? fp::smem_bytes_pairs() : fp::smem_bytes<T, STRICT>();
    static std::atomic<int> blocks[MAX_DEVICES];
    const Shape &s = c.s;
    const T *x = static_cast<const T *>(c.x);
    const int64_t n_hs = fp::tile_slabs_h(s.pooled_h, s.pool_h), n_ws = fp::tile_slabs_w(s.pooled_w, s.pool_w);
    const int64_t d_chunk = plan.ws.d_chunk;
    const int64_t n_dc = d_chunk > 0 ? ceil_div(fp::tile_steps(s.pooled_d, s.pool_d), d_chunk) : 0;
    if (d_chunk < 1 || n_dc * n_hs * n_ws != plan.ws.parts || ANY_POOL == fp::is_pool2(s.pool_d, s.pool_h, s.pool_w))
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "internal: k3p2 got a plan for another shape");
    int per_sm = 0;
    CP_TRY(blocks_per_sm(k3p2_kernel<T, STRICT, CODES, ANY_POOL, F16, RERUN>, fp::THREADS, smem, blocks, &per_sm));
    /* Strict codes: max|x| before (the near-tie bounds), the flagged windows after. */
    constexpr bool TIES = CODES && STRICT;
    unsigned *xmax = TIES ? reinterpret_cast<unsigned *>(c.scratch) : nullptr;
    if (TIES) {
        if (!xmax)
            return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "internal: k3p2's strict codes got no scratch");
        CP_TRY(near_tie_xmax(c, xmax));
    }
    const int64_t n_items = s.batch * n_dc * n_hs * n_ws;
    int64_t grid = imin(n_items, (int64_t)c.dev.sms * per_sm);
    if (F16) {
        if (!range || !range_n || *range_n < 1)
            return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "internal: k3p2's float16 instance got no range words");
        grid = imin(grid, (int64_t)*range_n); /* the persistent grid strides over the items: any size serves */
        *range_n = (int)grid;
    }
    CP_CUDA_TRY(launch_dependent(dependent && pdl_on(c.dev), k3p2_kernel<T, STRICT, CODES, ANY_POOL, F16, RERUN>,
                                 dim3((unsigned)grid), dim3(fp::THREADS), smem, c.stream, s, x, c.w, c.conv_bias,
                                 c.partials, n_hs, n_ws, d_chunk, n_dc, n_items, rows_aligned(s, x) ? 1 : 0, c.codes,
                                 xmax, range, range && range_n ? *range_n : 0, fold ? *fold : FinishFold{}));
    if (TIES && !c.defer_settle)
        return recheck_codes(c, 0xffu, false); /* flat fields: constant_windows, in the kernel */
    return CONVPOOL_OK;
}

/* Where the float16 instance pays: it saves ~0.6 us a 2^16 x positions (headline channels) but
 * costs ~11 us a call more (the gated TF32 launch, its own prologue, and until the thirty-third
 * session the range word's memset).
 * H200, twenty-sixth session, bench_gpu --batch N at the headline, TF32 alone -> float16:
 * training b16 0.062 -> 0.066 ms, b24 0.088 -> 0.085, b32 0.114 -> 0.105, b128 0.411 -> 0.343;
 * inference b24 0.075 -> 0.077, b32 0.096 -> 0.095, b128 0.342 -> 0.305. The tile pads Cin to 8
 * and Cout to 16, so its work a position does not depend on them: 2^21 positions (b32). */
constexpr int64_t K3P2_F16_MIN_POSITIONS = int64_t(1) << 21;

/* TF32 on float32 x with pool 2^3 (CODES: the training forward): the float16-operand instance,
 * then the TF32 one behind its range word (a launch that exits at once unless the float16 one
 * found x or the weights out of its range), from K3P2_F16_MIN_POSITIONS. CONVPOOL_K3P2_F16=0
 * runs the TF32 instance alone, =1 the float16 one at every size (A/B benchmarks, tests);
 * CONVPOOL_TEST_K3P2_NO_RERUN=1 leaves the rerun out (tests of the
 * float16 instance's own results, in its range only). */
template <bool CODES> convpool_status k3p2_tf32_f32(const Plan &plan, const Call &c)
{
    if (!c.scratch || !k3p2_f16_picks(c.s, false, CONVPOOL_DTYPE_F32))
        return k3p2_launch<float, false, CODES>(plan, c);
    unsigned *range = reinterpret_cast<unsigned *>(c.scratch);
    int range_n = (int)(plan.ws.scratch_bytes / (int64_t)sizeof(unsigned)) - 1; /* range[0]: the count */
    CP_TRY((k3p2_launch<float, false, CODES, false, true>(plan, c, range, &range_n, pdl_first(c.dev))));
    if (env_switch("CONVPOOL_TEST_K3P2_NO_RERUN") == 1)
        return CONVPOOL_OK;
    /* The rerun also finishes the call where c.fold allows: one launch less a forward. */
    CP_TRY((k3p2_launch<float, false, CODES, false, false, true>(plan, c, range, &range_n, true, c.fold)));
    if (c.fold)
        *c.fold_done = true;
    return CONVPOOL_OK;
}

template <bool ANY_POOL> convpool_status k3p2_by_dtype(const Plan &plan, const Call &c)
{
    switch (c.dtype) {
    case CONVPOOL_DTYPE_F32:
        if (!ANY_POOL && !c.strict)
            return k3p2_tf32_f32<false>(plan, c);
        return c.strict ? k3p2_launch<float, true, false, ANY_POOL>(plan, c)
                        : k3p2_launch<float, false, false, ANY_POOL>(plan, c);
    case CONVPOOL_DTYPE_F16:
        return c.strict ? k3p2_launch<__half, true, false, ANY_POOL>(plan, c)
                        : k3p2_launch<__half, false, false, ANY_POOL>(plan, c);
    case CONVPOOL_DTYPE_BF16:
        return c.strict ? k3p2_launch<__nv_bfloat16, true, false, ANY_POOL>(plan, c)
                        : k3p2_launch<__nv_bfloat16, false, false, ANY_POOL>(plan, c);
    }
    return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "internal: k3p2 got dtype %d", (int)c.dtype);
}
} // namespace

bool k3p2_f16_picks(const Shape &s, bool strict, convpool_dtype dt)
{
    if (strict || dt != CONVPOOL_DTYPE_F32 || !fp::is_pool2(s.pool_d, s.pool_h, s.pool_w))
        return false;
    const int f16 = env_switch("CONVPOOL_K3P2_F16");
    return f16 == 1 || (f16 < 0 && s.batch * s.in_d * s.in_h * s.in_w >= K3P2_F16_MIN_POSITIONS);
}

convpool_status k3p2_run(const Plan &plan, const Call &c)
{
    if (plan.ws.sm90)
        return k3p2_sm90_run(plan, c);
    const bool pool2 = fp::is_pool2(c.s.pool_d, c.s.pool_h, c.s.pool_w);
    if (c.codes) { /* the training forward: float32 x and pool 2^3 only (1-byte codes of 8) */
        if (c.dtype != CONVPOOL_DTYPE_F32 || !pool2)
            return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "the training forward takes float32 x and pool 2x2x2");
        return c.strict ? k3p2_launch<float, true, true>(plan, c) : k3p2_tf32_f32<true>(plan, c);
    }
    return pool2 ? k3p2_by_dtype<false>(plan, c) : k3p2_by_dtype<true>(plan, c);
}

} // namespace convpool_cuda
