/*
 * The 4-warp tensor-core tile shared by the pool-2^3 kernels (k3p2.cu, group.cu).
 *
 * mma.sync.m16n8k8 TF32 with M = 16 output channels (A = weights), N = 8 conv columns along w
 * (B = x from shared memory), K = 8 input channels of one tap. A thread's accumulators c0,c1
 * are the w-pair (2t, 2t+1) of one output channel, and each warp keeps 2 (d) x 4 (h) conv rows,
 * so every 2x2x2 pool window is 8 registers of one thread: the max is register work and only
 * the window sums are reduced. A block (WARPS warps) owns (batch, 4 conv rows, 8 * WARPS conv
 * columns) and marches along d through input d-planes staged in shared memory by cp.async
 * (channel-planar; channel pitch = 32 bytes mod 128, so the B-fragment loads of lanes (g, t)
 * hit 32 distinct banks).
 */
#ifndef CONVPOOL_CUDA_TILE_CUH
#define CONVPOOL_CUDA_TILE_CUH

#include "common.cuh"

namespace convpool_cuda {

/* Tuning switches (compile-time; the defaults measured best on an H200, see docs/KERNEL_NOTES.md). */
#ifndef CONVPOOL_FAST_WARPS
#define CONVPOOL_FAST_WARPS 4 /* warps per block = n8 column chunks per slab (2, 4 or 8) */
#endif
/* STRICT: 1 keeps the tap-row loop over kh rolled: no register spills, but 25% slower. */
#ifndef CONVPOOL_STRICT_ROW_LOOP
#define CONVPOOL_STRICT_ROW_LOOP 0
#endif
/* Unaligned rows in k3p2_kernel: 0 row-wise copies (cp.async for 32-bit x) in every variant, 1 the
 * first version's element loop in the f32 variants, 2 in all of them (see docs/KERNEL_NOTES.md). */
#ifndef CONVPOOL_K3P2_SYNC_STAGING
#define CONVPOOL_K3P2_SYNC_STAGING 1
#endif

/* Fast-path geometry. */
namespace fp {
constexpr int WARPS = CONVPOOL_FAST_WARPS;
constexpr int THREADS = WARPS * 32;
constexpr int MIN_BLOCKS = 8 / WARPS;         /* resident blocks per SM the registers must allow */
constexpr int CIN = 8;                        /* K of one MMA; fewer channels are zero-padded */
constexpr int COUT = 16;                      /* M of the MMA; fewer channels are zero-padded */
constexpr int OUT_H = 4;                      /* conv rows per slab = 2 pooled rows */
constexpr int OUT_W = 8 * WARPS;              /* conv columns per slab: one n8 chunk per warp */
constexpr int ROW = OUT_W + 8;                /* smem row pitch (elements): >= IN_W, 16-byte rows */
constexpr int SLOT_MASK = 7;                  /* ring slots are indexed mod 8 */
constexpr int RED_BYTES = WARPS * COUT * 4;
static_assert(WARPS == 2 || WARPS == 4 || WARPS == 8, "CONVPOOL_FAST_WARPS must be 2, 4 or 8");

/* Extents that follow from the conv kernel: a step = 2 conv d-rows, fed by KD + 1 input planes. */
template <int KD, int KH, int KW> struct Geo {
    static constexpr int D = KD, H = KH, W = KW;
    static constexpr int TAPS = KD * KH * KW;
    static constexpr int IN_H = OUT_H + KH - 1;
    static constexpr int IN_W = OUT_W + KW - 1;
    static constexpr int STEP_PLANES = KD + 1;
    static constexpr int SLOT_ELEMS = IN_H * ROW;
    static_assert(ROW >= IN_W && (ROW * 2) % 16 == 0, "rows must hold the halo and stay 16-byte aligned");
};
using G3 = Geo<3, 3, 3>;

/* Channel pitch in elements: the ring rounded up to 128 bytes, plus 32 bytes, so lanes (g, t)
 * reading channel t at column g touch 32 distinct banks. */
template <typename T> __host__ __device__ constexpr int chan_pitch(int ring_elems)
{
    return (ring_elems * (int)sizeof(T) + 127) / 128 * (128 / (int)sizeof(T)) + 32 / (int)sizeof(T);
}

/* The float16-operand tile (k3p2_kernel's F16 instance) reads channels 2t and 2t + 1 at column
 * g: a float32 channel pitch of 16 bytes mod 128 puts those lanes on 32 distinct banks. */
__host__ __device__ constexpr int chan_pitch_pairs(int ring_elems) { return (ring_elems * 4 + 127) / 128 * 32 + 4; }

/* k3p2_kernel: 8 slots, 4 in use + up to 4 in flight. */
constexpr int SLOTS = 8;
constexpr int RING_ELEMS = SLOTS * G3::SLOT_ELEMS;
constexpr int WFRAG_BYTES = 2 * G3::TAPS * 32 * 16; /* STRICT: big and small A fragments, per lane */
template <typename T> __host__ __device__ constexpr int x_bytes() { return CIN * chan_pitch<T>(RING_ELEMS) * (int)sizeof(T); }
template <typename T, bool STRICT> __host__ __device__ constexpr int smem_bytes()
{
    return x_bytes<T>() + (STRICT ? WFRAG_BYTES : 0) + RED_BYTES;
}
__host__ __device__ constexpr int x_bytes_pairs() { return CIN * chan_pitch_pairs(RING_ELEMS) * 4; }
__host__ __device__ constexpr int smem_bytes_pairs() { return x_bytes_pairs() + RED_BYTES; }

/* The pools the tile reduces: 2^3 (pool_step, which can also write arg-max codes), and with
 * pool_step_any pool_h in {1, 2, 4}, pool_w in {1, 2, 4, 8} and any pool_d. */
__host__ __device__ inline bool is_pool2(int64_t pd, int64_t ph, int64_t pw) { return pd == 2 && ph == 2 && pw == 2; }
__host__ __device__ inline bool tile_pool_ok(int64_t pd, int64_t ph, int64_t pw)
{
    return pd >= 1 && (ph == 1 || ph == 2 || ph == 4) && (pw == 1 || pw == 2 || pw == 4 || pw == 8);
}
__host__ __device__ inline int log2_small(int64_t v) { return v >= 8 ? 3 : v >= 4 ? 2 : v >= 2 ? 1 : 0; }
/* Steps (2 conv d-rows each) that cover the pooled d extent. */
__host__ __device__ inline int64_t tile_steps(int64_t pooled_d, int64_t pd) { return (pooled_d * pd + 1) / 2; }
/* Slabs (OUT_H conv rows, OUT_W conv columns) that cover the pooled extent: the item grid and the
 * parts each (b, channel) has. */
__host__ __device__ inline int64_t tile_slabs_h(int64_t pooled_h, int64_t ph) { return (pooled_h * ph + OUT_H - 1) / OUT_H; }
__host__ __device__ inline int64_t tile_slabs_w(int64_t pooled_w, int64_t pw) { return (pooled_w * pw + OUT_W - 1) / OUT_W; }

/* group_kernel: two halves of STEP_PLANES slots (the step in use, the next one in flight). */
template <typename G> __host__ __device__ constexpr int group_ring_elems() { return 2 * G::STEP_PLANES * G::SLOT_ELEMS; }
template <typename T, typename G> __host__ __device__ constexpr int group_x_bytes()
{
    return CIN * chan_pitch<T>(group_ring_elems<G>()) * (int)sizeof(T);
}
template <typename T, typename G> __host__ __device__ constexpr int group_smem_bytes() { return group_x_bytes<T, G>() + RED_BYTES; }
static_assert(2 * Geo<3, 3, 3>::STEP_PLANES <= SLOT_MASK + 1, "group halves must not wrap");
} // namespace fp

/* Copies NP input d-planes (plane0 ...; channels c0 .. c0 + nch - 1; the slab's IN_H rows; the
 * IN_W columns from w0) into ring slots slot0 ... (consecutive, never wrapping), channel c0 + c
 * to smem channel c. Aligned rows: warp c moves channel c, one 16-byte chunk per lane and RPI
 * rows per instruction, with compile-time row arithmetic. Planes, rows and columns past the
 * input are skipped: they only feed conv outputs that floor-mode pooling drops, and an MMA keeps
 * each output row and column to itself. Planes past the input (DGUARD, the pool_step_any
 * instances: the second conv d-row of a last step whose conv d extent is odd) too; with pool
 * 2^3 every staged plane exists, and the check alone made ptxas spill more in the STRICT
 * headline kernel. With pad, smem channels nch .. CIN - 1 are zeroed instead: they meet
 * zero weights, and a stale inf or NaN there would make 0 * inf = NaN in every column. */
template <typename T, int NP, typename G, bool SYNC = false, bool DGUARD = false>
__device__ __forceinline__ void stage_planes(T *xs, const Shape &s, const T *__restrict__ x, int64_t b, int64_t c0,
                                             int64_t nch, int64_t h0, int64_t w0, int64_t plane0, int slot0,
                                             bool aligned, bool pad, int pitch)
{
    constexpr int EPC = 16 / (int)sizeof(T); /* elements per 16-byte chunk */
    constexpr int MC = fp::OUT_W / EPC;      /* chunks of the main columns */
    constexpr int RPI = 32 / MC;             /* rows per warp instruction */
    constexpr int ROWS = NP * G::IN_H;       /* rows per channel */
    constexpr bool HALO = G::IN_W > fp::OUT_W;
    static_assert(ROWS <= 32, "halo rows are one per lane");
    static_assert(!(SYNC && DGUARD), "the SYNC element loop has no plane check");
    static_assert(G::IN_W - fp::OUT_W <= EPC, "the halo is one chunk");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t hw = s.in_h * s.in_w;
    const T *base = x + x_index(s, b, c0, plane0, h0, w0);
    T *dbase = xs + slot0 * G::SLOT_ELEMS;
    if (aligned) {
        const int q = lane % MC;
        const bool col_ok = w0 + (int64_t)q * EPC < s.in_w;
        const bool halo = HALO && w0 + fp::OUT_W < s.in_w; /* halo columns exist only if the row goes on */
        for (int c = warp; c < nch; c += fp::WARPS) {
            const T *src_c = base + c * (s.in_d * hw);
            T *dst_c = dbase + c * pitch;
#pragma unroll
            for (int j = 0; j < (ROWS + RPI - 1) / RPI; ++j) {
                const int row = j * RPI + lane / MC;
                const int pi = row / G::IN_H, r = row % G::IN_H;
                if (col_ok && row < ROWS && h0 + r < s.in_h && (!DGUARD || plane0 + pi < s.in_d))
                    cp_async16(dst_c + pi * G::SLOT_ELEMS + r * fp::ROW + q * EPC,
                               src_c + pi * hw + r * s.in_w + q * EPC, 16);
            }
            if (halo && lane < ROWS) {
                const int pi = lane / G::IN_H, r = lane % G::IN_H;
                const int64_t left = s.in_w - (w0 + fp::OUT_W);
                if (h0 + r < s.in_h && (!DGUARD || plane0 + pi < s.in_d))
                    cp_async16(dst_c + pi * G::SLOT_ELEMS + r * fp::ROW + fp::OUT_W,
                               src_c + pi * hw + r * s.in_w + fp::OUT_W,
                               (int)(left < EPC ? left : EPC) * (int)sizeof(T));
            }
        }
    } else {
        /* Unaligned rows (W not a multiple of the chunk, or x not 16-byte aligned): one element
         * per copy, the lanes of warp c along the rows of channel c. 32-bit x: 4-byte cp.async.
         * 16-bit x: plain copies, RB rows of loads in flight before their stores, visible after
         * the next barrier. SYNC: the element loop of the first version, kept for the kernel
         * whose register allocation the other code upsets (see the caller). */
        if constexpr (SYNC) {
            const int n = (int)nch * G::IN_H * NP * G::IN_W;
            for (int i = threadIdx.x; i < n; i += fp::THREADS) {
                const int col = i % G::IN_W, rest = i / G::IN_W;
                const int r = rest % G::IN_H, pc = rest / G::IN_H;
                const int pi = pc % NP, c = pc / NP;
                if (h0 + r < s.in_h && w0 + col < s.in_w)
                    dbase[c * pitch + pi * G::SLOT_ELEMS + r * fp::ROW + col] =
                        base[c * (s.in_d * hw) + pi * hw + r * s.in_w + col];
            }
        } else {
            constexpr int NCP = (G::IN_W + 31) / 32; /* column passes */
            bool col_ok[NCP];
#pragma unroll
            for (int k = 0; k < NCP; ++k)
                col_ok[k] = lane + 32 * k < G::IN_W && w0 + lane + 32 * k < s.in_w;
            for (int c = warp; c < nch; c += fp::WARPS) {
                const T *src_c = base + c * (s.in_d * hw) + lane;
                T *dst_c = dbase + c * pitch + lane;
                if constexpr (sizeof(T) == 4) {
#pragma unroll
                    for (int row = 0; row < ROWS; ++row) {
                        const int pi = row / G::IN_H, r = row % G::IN_H;
                        if (h0 + r < s.in_h && (!DGUARD || plane0 + pi < s.in_d)) {
#pragma unroll
                            for (int k = 0; k < NCP; ++k)
                                if (col_ok[k])
                                    cp_async4(dst_c + pi * G::SLOT_ELEMS + r * fp::ROW + 32 * k,
                                              src_c + pi * hw + r * s.in_w + 32 * k);
                        }
                    }
                } else {
                    constexpr int RB = 4;
#pragma unroll
                    for (int r0 = 0; r0 < ROWS; r0 += RB) {
                        T v[RB][NCP];
#pragma unroll
                        for (int u = 0; u < RB; ++u) {
                            const int row = r0 + u, pi = row / G::IN_H, r = row % G::IN_H;
#pragma unroll
                            for (int k = 0; k < NCP; ++k)
                                if (row < ROWS && h0 + r < s.in_h && (!DGUARD || plane0 + pi < s.in_d) && col_ok[k])
                                    v[u][k] = src_c[pi * hw + r * s.in_w + 32 * k];
                        }
#pragma unroll
                        for (int u = 0; u < RB; ++u) {
                            const int row = r0 + u, pi = row / G::IN_H, r = row % G::IN_H;
#pragma unroll
                            for (int k = 0; k < NCP; ++k)
                                if (row < ROWS && h0 + r < s.in_h && (!DGUARD || plane0 + pi < s.in_d) && col_ok[k])
                                    dst_c[pi * G::SLOT_ELEMS + r * fp::ROW + 32 * k] = v[u][k];
                        }
                    }
                }
            }
        }
    }
    if (pad && nch < fp::CIN) {
        /* Plain stores into slots no warp reads this step; visible after the next barrier. */
        constexpr int CHUNKS = NP * G::SLOT_ELEMS * (int)sizeof(T) / 16;
        static_assert((NP * G::SLOT_ELEMS * (int)sizeof(T)) % 16 == 0, "slots are whole 16-byte chunks");
        const int n = (fp::CIN - (int)nch) * CHUNKS;
        for (int i = threadIdx.x; i < n; i += fp::THREADS) {
            const int c = (int)nch + i / CHUNKS;
            reinterpret_cast<uint4 *>(dbase + c * pitch)[i % CHUNKS] = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

/* One step's MMAs for one group of 8 input channels: acc[dd][hh] += conv of output rows
 * (2 d-rows dd, OUT_H h-rows hh) x (this warp's 8 columns) x 16 channels. The step's input
 * planes sit in ring slots (base + di) & SLOT_MASK. xw: this lane's B element (channel t,
 * column g) in slot 0. TF32: wr holds the A fragment of every tap. STRICT: wfrag points at the
 * big A fragments of the taps, then the small ones, 32 lanes each. */
template <typename T, bool STRICT, int KD, int KH, int KW, int PITCH>
__device__ __forceinline__ void conv_step(float (&acc)[2][fp::OUT_H][4], const T *xw, int base,
                                          const uint32_t (&wr)[STRICT ? 1 : KD * KH * KW][4],
                                          const uint4 *wfrag, int lane)
{
    using G = fp::Geo<KD, KH, KW>;
    using fp::OUT_H;
    using fp::ROW;
    constexpr int TAPS = G::TAPS, IN_H = G::IN_H, NP = G::STEP_PLANES;
    constexpr bool X16 = !std::is_same<T, float>::value; /* 16-bit x is exact in TF32 */
    if constexpr (!STRICT) {
        (void)wfrag;
        (void)lane;
        int soff[NP];
#pragma unroll
        for (int di = 0; di < NP; ++di)
            soff[di] = ((base + di) & fp::SLOT_MASK) * G::SLOT_ELEMS;
        /* Input-row order: each x fragment is loaded once and feeds every (output row, tap)
         * pair that reads it. */
#pragma unroll
        for (int o = 0; o < NP * IN_H * KW; ++o) {
            const int di = o / (IN_H * KW), hi = (o / KW) % IN_H, kw = o % KW;
            const T *p = xw + soff[di] + hi * ROW + kw;
            const float v0 = to_float(p[0]), v1 = to_float(p[4 * PITCH]);
            const uint32_t b0 = X16 ? __float_as_uint(v0) : to_tf32(v0);
            const uint32_t b1 = X16 ? __float_as_uint(v1) : to_tf32(v1);
#pragma unroll
            for (int dd = 0; dd < 2; ++dd) {
                const int kd = di - dd;
                if (kd < 0 || kd >= KD)
                    continue;
#pragma unroll
                for (int hh = 0; hh < OUT_H; ++hh) {
                    const int kh = hi - hh;
                    if (kh < 0 || kh >= KH)
                        continue;
                    mma_tf32(acc[dd][hh], wr[(kd * KH + kh) * KW + kw], b0, b1);
                }
            }
        }
    } else {
        (void)wr;
        /* Tap order: the split weight fragments are loaded once per tap. The tensor cores
         * truncate when they accumulate, so the big*big products of each (kd, kh) tap row
         * start from zero and join acc through a round-to-nearest FADD; the small cross terms
         * (2^-11 of the total) keep their own tensor-core accumulator. */
        constexpr int KH_UNROLL = CONVPOOL_STRICT_ROW_LOOP ? 1 : KH;
        float accs[2][OUT_H][4];
        zero_regs(accs);
#pragma unroll 1
        for (int kd = 0; kd < KD; ++kd) {
            const int so[2] = {((base + kd) & fp::SLOT_MASK) * G::SLOT_ELEMS,
                               ((base + kd + 1) & fp::SLOT_MASK) * G::SLOT_ELEMS};
#pragma unroll KH_UNROLL
            for (int kh = 0; kh < KH; ++kh) {
                uint4 abig[KW], asmall[KW];
#pragma unroll
                for (int kw = 0; kw < KW; ++kw) {
                    const int k = (kd * KH + kh) * KW + kw;
                    abig[kw] = wfrag[k * 32 + lane];
                    asmall[kw] = wfrag[(TAPS + k) * 32 + lane];
                }
#pragma unroll
                for (int dd = 0; dd < 2; ++dd)
#pragma unroll
                    for (int hh = 0; hh < OUT_H; ++hh) {
                        float tmp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                        for (int kw = 0; kw < KW; ++kw) {
                            const T *p = xw + so[dd] + (hh + kh) * ROW + kw;
                            const float v0 = to_float(p[0]), v1 = to_float(p[4 * PITCH]);
                            if constexpr (X16) {
                                const uint32_t b0 = __float_as_uint(v0), b1 = __float_as_uint(v1);
                                mma_tf32(accs[dd][hh], asmall[kw], b0, b1);
                                mma_tf32(tmp, abig[kw], b0, b1);
                            } else {
                                const uint32_t b0 = to_tf32(v0), b1 = to_tf32(v1);
                                const uint32_t s0 = tf32_operand_unchecked(v0 - __uint_as_float(b0));
                                const uint32_t s1 = tf32_operand_unchecked(v1 - __uint_as_float(b1));
                                mma_tf32(accs[dd][hh], asmall[kw], b0, b1);
                                mma_tf32(accs[dd][hh], abig[kw], s0, s1);
                                mma_tf32(tmp, abig[kw], b0, b1);
                            }
                        }
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            acc[dd][hh][e] += tmp[e];
                    }
            }
        }
        /* The small terms are finite unless x holds inf/NaN; then w_small * inf can carry the
         * opposite sign of w_big * inf, and the big part alone is the right answer. */
#pragma unroll
        for (int dd = 0; dd < 2; ++dd)
#pragma unroll
            for (int hh = 0; hh < OUT_H; ++hh)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    acc[dd][hh][e] += isfinite(accs[dd][hh][e]) ? accs[dd][hh][e] : 0.0f;
    }
}

/* conv_step for kernel 3^3 on float16 operands (mma.sync m16n8k16): K = two taps x 8 input
 * channels. The 27 taps of a kd form 5 MMAs an output row: the (kw 0, kw 1) pairs of kh 0, 1 and
 * 2 (one input row: B = its columns g and g + 1), the kw 2 pair of kh 0 and 1 (two input rows)
 * and kh 2's kw 2 alone (the A's second half zero, B's second register 0): 15 MMAs an output row
 * against 27. wp[kd][kh], wq[kd], wr[kd] hold those A fragments (weights scaled per output
 * channel to float16's range; the caller undoes the scale). xw: this lane's first B element,
 * channel 2t at column g (channel 2t + 1 PITCH on). Each input element is converted once per
 * step, with cvt.rn to float16 (11 significant bits, as TF32's rounding keeps), and xmax keeps
 * the largest |x| converted (the caller's range check: past 65504 float16 is inf, and under
 * 2^-14 its subnormals keep fewer bits than TF32). */
template <int PITCH>
__device__ __forceinline__ void conv_step_f16(float (&acc)[2][fp::OUT_H][4], const float *xw, int base,
                                              const uint32_t (&wp)[3][3][4], const uint32_t (&wq)[3][4],
                                              const uint32_t (&wr)[3][2], __half2 &xmax)
{
    using G = fp::G3;
    using fp::OUT_H;
    using fp::ROW;
    constexpr int NP = G::STEP_PLANES, IN_H = G::IN_H;
    int soff[NP];
#pragma unroll
    for (int di = 0; di < NP; ++di)
        soff[di] = ((base + di) & fp::SLOT_MASK) * G::SLOT_ELEMS;
#pragma unroll
    for (int di = 0; di < NP; ++di) {
        uint32_t x2prev = 0u;
#pragma unroll
        for (int hi = 0; hi < IN_H; ++hi) {
            uint32_t xr[3];
#pragma unroll
            for (int kw = 0; kw < 3; ++kw) {
                const float *p = xw + soff[di] + hi * ROW + kw;
                xr[kw] = pack_half2(p[0], p[PITCH]);
                const __half2 h = *reinterpret_cast<const __half2 *>(&xr[kw]);
                xmax = __hmax2(xmax, __habs2(h));
            }
#pragma unroll
            for (int dd = 0; dd < 2; ++dd) {
                const int kd = di - dd;
                if (kd < 0 || kd >= 3)
                    continue;
#pragma unroll
                for (int hh = 0; hh < OUT_H; ++hh) {
                    const int kh = hi - hh;
                    if (kh < 0 || kh >= 3)
                        continue;
                    mma_f16(acc[dd][hh], wp[kd][kh], xr[0], xr[1]);
                    if (kh == 1)
                        mma_f16(acc[dd][hh], wq[kd], x2prev, xr[2]);
                    if (kh == 2) {
                        const uint32_t a[4] = {wr[kd][0], wr[kd][1], 0u, 0u};
                        mma_f16(acc[dd][hh], a, xr[2], 0u);
                    }
                }
            }
            x2prev = xr[2];
        }
    }
}

/* The arg-max code of a 2x2x2 window (raster position) as pool_train_kernel (finish.cu) picks
 * it on q = (v + bias) / divisor in float32 (a product where pow2_recip makes that exact): a
 * value replaces the running max, which starts at -inf with code 0, when it is greater or NaN.
 * best: the max of q, which is window8's value bit for bit: (v + bias) / d is monotone in v
 * (non-increasing for d < 0), so the max of the quotients is the quotient of the max (min) of
 * the raw values; a NaN anywhere leaves best NaN; in the literal mode both take the max of the
 * same quotients. */
template <bool SCALED = false>
__device__ __forceinline__ uint32_t window8_code(const float (&v)[8], const ChanMode &m, float &best,
                                                 float scale = 1.0f)
{
    /* One uniform branch around the window, each side the same interleaved pick. SCALED: v are
     * the conv values times 1 / scale, a power of two (the float16 tile's weight scale): v *
     * scale is exact, so one FFMA rounds v * scale + bias as the unscaled FADD would. */
    const auto pick = [&](auto quotient) {
        best = __int_as_float(0xff800000);
        uint32_t code = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const float q = quotient(SCALED ? fmaf(v[i], scale, m.bias) : v[i] + m.bias);
            if (q > best || isnan(q)) {
                best = q;
                code = (uint32_t)i;
            }
        }
        return code;
    };
    const float r = pow2_recip(m.div);
    if constexpr (SCALED) {
        /* The float16 tile in a raw mode: its v are finite (x and w in float16's range, else the
         * call is void and rerun) or, for a NaN weight, which the range check does not see, all
         * NaN in that channel (c_best is then NaN and the pick on q below decides). q = c * r,
         * c = v * scale + bias, with r a power of two orders the window as c does (reversed
         * for r < 0) wherever that scaling is exact. The pick runs on c, one compare a
         * position, and q_best = c_best * r is the same float: where it is normal and finite,
         * no other c of the window can round onto it, so the first position of the greatest q
         * is the first of the best c. Otherwise (a q that underflows or overflows, or NaN) the
         * pick on q decides. */
        if (m.mode != kLiteral && r != 0.0f) {
            const bool up = m.mode == kMaxRaw;
            float cb = fmaf(v[0], scale, m.bias);
            uint32_t code = 0;
#pragma unroll
            for (int i = 1; i < 8; ++i) {
                const float c = fmaf(v[i], scale, m.bias);
                const bool take = up ? c > cb : c < cb;
                cb = take ? c : cb;
                code = take ? (uint32_t)i : code;
            }
            best = cb * r;
            if (fabsf(best) >= 0x1p-126f && fabsf(best) < __int_as_float(0x7f800000))
                return code;
        }
    }
    if (r != 0.0f)
        return pick([r](float a) { return a * r; });
    return pick([&m](float a) { return __fdiv_rn(a, m.div); });
}

/* Strict codes: the first position of the window's greatest raw v (least for a negative
 * divisor), or 0xff (recheck_codes recomputes it) where the runner-up lies within tol of it
 * (strict_tie_tol, v units: beyond it the correctly rounded conv's q has the same unique max),
 * a NaN is in the window, or the channel's mode is literal. No quotient is formed: q follows v
 * outside the literal mode, and the flagged windows get PyTorch's rule on q from the recheck. */
__device__ __forceinline__ uint32_t window8_tie_code(const float (&v)[8], const ChanMode &m, float tol)
{
    if (m.mode == kLiteral)
        return 0xffu;
    const float sgn = m.mode == kMinRaw ? -1.0f : 1.0f;
    float best = __int_as_float(0xff800000), second = best;
    uint32_t code = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float u = sgn * v[i];
        if (u > best || isnan(u)) {
            second = best;
            best = u;
            code = (uint32_t)i;
        } else {
            second = fmaxf(second, u);
        }
    }
    return best - second > tol ? code : 0xffu; /* NaN in best - second (a NaN, inf - inf) flags */
}

/* The 8 conv values of window hp (0, 1) of a step for channel g (v0) and g + 8 (v1). */
__device__ __forceinline__ void window_values(const float (&acc)[2][fp::OUT_H][4], int hp, float (&v0)[8],
                                              float (&v1)[8])
{
#pragma unroll
    for (int dd = 0; dd < 2; ++dd)
#pragma unroll
        for (int e = 0; e < 2; ++e)
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                v0[dd * 4 + e * 2 + k] = acc[dd][2 * hp + e][k];
                v1[dd * 4 + e * 2 + k] = acc[dd][2 * hp + e][2 + k];
            }
}

/* Strict codes of one step (pool_step's layout): code[hp][0 / 1] for channels g / g + 8 by
 * window8_tie_code with their bounds tol0 / tol1 (0xff: a near-tie), 0x100 where window hp is
 * past the pooled extent; the pooled sums are window8's, as in the inference forward. */
__device__ __forceinline__ void pool_step_ties(const float (&acc)[2][fp::OUT_H][4], const Shape &s, int64_t ph0,
                                               int64_t pw, const ChanMode &cm0, const ChanMode &cm1, float &sum0,
                                               float &sum1, float tol0, float tol1, uint32_t (&code)[2][2])
{
#pragma unroll
    for (int hp = 0; hp < 2; ++hp) {
        code[hp][0] = code[hp][1] = 0x100u;
        if (ph0 + hp < s.pooled_h && pw < s.pooled_w) {
            float v0[8], v1[8];
            window_values(acc, hp, v0, v1);
            code[hp][0] = window8_tie_code(v0, cm0, tol0);
            code[hp][1] = window8_tie_code(v1, cm1, tol1);
            sum0 += window8(v0, cm0);
            sum1 += window8(v1, cm1);
        }
    }
}

/* Pools one step: c0,c1 = channel g, columns (2t, 2t+1); c2,c3 = channel g+8. ph0: the slab's
 * first pooled row; pw: this lane's pooled column. CODES (the training forward) also writes the
 * codes of channels g and g + 8: code_g points at channel g's code of the step's first window
 * (pooled d, row ph0, column pw) in the [b][cout][windows] codes; the second row is pooled_w
 * bytes on, channel g + 8 ch8 (8 channels' windows) on. SCALED: acc holds the conv values times
 * 1 / sc0 (1 / sc1), powers of two (the float16 tile's weight scale), undone exactly in the
 * pooling. */
template <bool CODES = false, bool SCALED = false>
__device__ __forceinline__ void pool_step(const float (&acc)[2][fp::OUT_H][4], const Shape &s, int64_t ph0,
                                          int64_t pw, const ChanMode &cm0, const ChanMode &cm1, float &sum0,
                                          float &sum1, int g = 0, uint8_t *__restrict__ code_g = nullptr,
                                          int64_t ch8 = 0, float sc0 = 1.0f, float sc1 = 1.0f)
{
#pragma unroll
    for (int hp = 0; hp < 2; ++hp) {
        if (ph0 + hp < s.pooled_h && pw < s.pooled_w) {
            float v0[8], v1[8];
            window_values(acc, hp, v0, v1);
            if constexpr (CODES) {
                float q0, q1;
                const uint32_t code0 = window8_code<SCALED>(v0, cm0, q0, sc0);
                const uint32_t code1 = window8_code<SCALED>(v1, cm1, q1, sc1);
                sum0 += q0;
                sum1 += q1;
                uint8_t *row = code_g + hp * s.pooled_w;
                if (g < s.cout)
                    row[0] = (uint8_t)code0;
                if (g + 8 < s.cout)
                    row[ch8] = (uint8_t)code1;
            } else {
                sum0 += window8<SCALED>(v0, cm0, sc0);
                sum1 += window8<SCALED>(v1, cm1, sc1);
            }
        }
    }
}

/* Pools other than 2^3 (the ANY_POOL instances of k3p2 and group). pool_h in {1, 2, 4} divides
 * the slab's OUT_H conv rows and pool_w in {1, 2, 4, 8} a warp's 8 columns, so a window's rows
 * are one thread's registers and its columns the thread's pair (2t, 2t + 1), then lanes t ^ 1
 * and t ^ 2 by shuffles; pool_d is any. A step computes conv d-rows 2 step and 2 step + 1, so a
 * window still open at the end of a step keeps its running max (min) in run[channel][row][pair
 * column] for the next one. Conv d-rows past the pooled extent (floor mode) are skipped. The
 * lane holding a window's first column adds it to the sums, in a fixed order: deterministic.
 * h0: the slab's first conv row; w_lane: this lane's first conv column; shifts: log2 of
 * pool_h and pool_w. Every lane of the warp calls it (the shuffles). */
__device__ __forceinline__ void pool_step_any(const float (&acc)[2][fp::OUT_H][4], const Shape &s, int64_t step,
                                              int64_t h0, int64_t w_lane, int ph_shift, int pw_shift,
                                              const ChanMode &cm0, const ChanMode &cm1,
                                              float (&run)[2][fp::OUT_H][2], float &sum0, float &sum1)
{
    using fp::OUT_H;
    const int ph = 1 << ph_shift, pw = 1 << pw_shift;
#pragma unroll
    for (int dd = 0; dd < 2; ++dd) {
        const int64_t cd = 2 * step + dd;
        if (cd >= s.pooled_d * s.pool_d)
            break;
        const int64_t m = cd % s.pool_d;
        float v[2][OUT_H][2];
#pragma unroll
        for (int ch = 0; ch < 2; ++ch) {
            const ChanMode &cm = ch ? cm1 : cm0;
#pragma unroll
            for (int hh = 0; hh < OUT_H; ++hh)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    v[ch][hh][e] = window_elem(acc[dd][hh][2 * ch + e], cm);
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                if (ph >= 2) {
                    v[ch][0][e] = window_combine(v[ch][0][e], v[ch][1][e], cm);
                    v[ch][2][e] = window_combine(v[ch][2][e], v[ch][3][e], cm);
                }
                if (ph >= 4)
                    v[ch][0][e] = window_combine(v[ch][0][e], v[ch][2][e], cm);
            }
#pragma unroll
            for (int hh = 0; hh < OUT_H; ++hh) {
                if (pw >= 2)
                    v[ch][hh][0] = window_combine(v[ch][hh][0], v[ch][hh][1], cm);
                if (pw >= 4)
                    v[ch][hh][0] = window_combine(v[ch][hh][0], __shfl_xor_sync(0xffffffffu, v[ch][hh][0], 1), cm);
                if (pw >= 8)
                    v[ch][hh][0] = window_combine(v[ch][hh][0], __shfl_xor_sync(0xffffffffu, v[ch][hh][0], 2), cm);
            }
#pragma unroll
            for (int hh = 0; hh < OUT_H; ++hh)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    run[ch][hh][e] = m == 0 ? v[ch][hh][e] : window_combine(run[ch][hh][e], v[ch][hh][e], cm);
        }
        if (m != s.pool_d - 1)
            continue;
#pragma unroll
        for (int hh = 0; hh < OUT_H; ++hh) {
            if ((hh & (ph - 1)) != 0 || ((h0 + hh) >> ph_shift) >= s.pooled_h)
                continue;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int64_t col = w_lane + e;
                if ((e && pw > 1) || (col & (pw - 1)) != 0 || (col >> pw_shift) >= s.pooled_w)
                    continue;
                sum0 += window_finish(run[0][hh][e], cm0);
                sum1 += window_finish(run[1][hh][e], cm1);
            }
        }
    }
}

/* Item done: fixed-order reduction over lanes t, then over warps; writes the item's part of
 * channels c_first .. c_first + 15 (those < Cout). Every thread of the block calls it. */
__device__ __forceinline__ void write_item_sums(float sum0, float sum1, float *red, const Shape &s, int64_t b,
                                                int64_t c_first, int64_t part, int64_t nparts,
                                                float *__restrict__ partials)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    sum0 += __shfl_xor_sync(0xffffffffu, sum0, 1);
    sum0 += __shfl_xor_sync(0xffffffffu, sum0, 2);
    sum1 += __shfl_xor_sync(0xffffffffu, sum1, 1);
    sum1 += __shfl_xor_sync(0xffffffffu, sum1, 2);
    if (t == 0) {
        red[warp * fp::COUT + g] = sum0;
        red[warp * fp::COUT + g + 8] = sum1;
    }
    __syncthreads();
    if (tid < fp::COUT && c_first + tid < s.cout) {
        float tot = 0.0f;
        for (int k = 0; k < fp::WARPS; ++k)
            tot += red[k * fp::COUT + tid];
        partials[(b * s.cout + c_first + tid) * nparts + part] = tot;
    }
}

} // namespace convpool_cuda

#endif /* CONVPOOL_CUDA_TILE_CUH */
