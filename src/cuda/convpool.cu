/*
 * convpool CUDA path: Conv3d -> divide -> MaxPool3d -> global mean -> + bias -> sum over channels,
 * reading x once. The conv output lives only in registers.
 *
 * Output: P[b][c] = mean over pooled windows of max_window((conv + conv_bias) / divisor), and
 * out[b] = sum_c (P[b][c] + bias[c]). The main kernel writes one partial window sum per
 * (b, c, part) to the workspace; a small finishing kernel adds the parts in a fixed order, so
 * results are bit-identical run to run (no atomics).
 *
 * Fast path idea (pool 2^3): the conv is an implicit GEMM on the tensor cores,
 * mma.sync.m16n8k8 with M = 16 output channels, N = 8 output columns along w, K = 8 input
 * channels of one tap. A thread's accumulators c0,c1 are the w-pair (2t, 2t+1) of one output
 * channel, and each warp keeps 2 (d) x 4 (h) output rows, so every 2x2x2 pool window is 8
 * registers of one thread: the max is register work, only the window sums are reduced. A block
 * (4 warps) owns (batch, 4 conv rows of h, 32 conv columns of w) and marches along d through a
 * ring of input d-planes in shared memory, filled by cp.async one step ahead (channel-planar,
 * channel pitch = 32 bytes mod 128 so the B-fragment loads hit 32 distinct banks). The grid is
 * persistent: two blocks per SM stride over work items and prefetch across items; their
 * barriers drift apart, so one block's staging and pooling overlap the other's MMAs.
 *
 * Variants:
 *   k3p2_kernel<float, TF32>    kernel 3^3, Cin <= 8, Cout <= 16 (the headline): a ring of 8
 *                               planes, each landed once and reused by two steps; weights in
 *                               registers (108), each smem x fragment feeds every output row it
 *                               touches (72 loads per 216 MMAs); cvt.rna to TF32.
 *   k3p2_kernel<float, STRICT>  3xTF32 (big*big + big*small + small*big) for FP32 accuracy; split
 *                               weights in smem, tap-row-outer loop; big*big products start from
 *                               zero per tap row and are added with FADD (the tensor cores
 *                               truncate when they accumulate).
 *   k3p2_kernel<half|bf16, *>   same kernels; 16-bit x is exact in TF32, so STRICT needs 2 MMAs.
 *   group_kernel<T, STRICT, K>  kernel K^3 (K = 1, 2, 3), any Cin and Cout: work item = (16
 *                               output channels, b, slab); each step loops over groups of 8 input
 *                               channels (the last one zero-padded), restaging the step's K + 1
 *                               planes per group in one half of a double buffer. Weights are
 *                               packed per (channel group, tap, lane) into the workspace by
 *                               pack_weights_kernel and read through L1.
 *   generic_kernel<T, TF32?>    any shape: one thread per pool window, FFMA (TF32: rounded
 *                               operands), block tree reduction per (b, c, part).
 *   finish_kernel               sums parts in double, writes P and out.
 */
#include "convpool.h"
#include "internal.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <type_traits>

/* One error-check family: each quotes the failing call. */
#define CP_CUDA_TRY(call)                                                                        \
    do {                                                                                         \
        cudaError_t cp_err_ = (call);                                                            \
        if (cp_err_ != cudaSuccess) {                                                            \
            (void)cudaGetLastError();                                                            \
            return convpool_fail(CONVPOOL_ERR_CUDA, "%s failed: %s (%s:%d)", #call,              \
                                 cudaGetErrorString(cp_err_), __FILE__, __LINE__);               \
        }                                                                                        \
    } while (0)

#define CP_CUDA_TRY_LAUNCH(kernel_name)                                                          \
    do {                                                                                         \
        cudaError_t cp_err_ = cudaGetLastError();                                                \
        if (cp_err_ != cudaSuccess)                                                              \
            return convpool_fail(CONVPOOL_ERR_CUDA, "launch of %s failed: %s (%s:%d)",           \
                                 kernel_name, cudaGetErrorString(cp_err_), __FILE__, __LINE__);  \
    } while (0)

namespace {

/* Problem sizes for the device, all int64 so products never wrap. */
struct Shape {
    int64_t batch, cin, cout;
    int64_t in_d, in_h, in_w;
    int64_t k_d, k_h, k_w;
    int64_t pool_d, pool_h, pool_w;
    int64_t pooled_d, pooled_h, pooled_w;
    float divisor;
};

static inline __host__ __device__ int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

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
/* Kernel extents K (bit K-1) that take group_kernel; 0 sends those shapes to generic_kernel. */
#ifndef CONVPOOL_GROUP_KERNELS
#define CONVPOOL_GROUP_KERNELS 0x7
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

/* k3p2_kernel: 8 slots, 4 in use + up to 4 in flight. */
constexpr int SLOTS = 8;
constexpr int RING_ELEMS = SLOTS * G3::SLOT_ELEMS;
constexpr int WFRAG_BYTES = 2 * G3::TAPS * 32 * 16; /* STRICT: big and small A fragments, per lane */
template <typename T> __host__ __device__ constexpr int x_bytes() { return CIN * chan_pitch<T>(RING_ELEMS) * (int)sizeof(T); }
template <typename T, bool STRICT> __host__ __device__ constexpr int smem_bytes()
{
    return x_bytes<T>() + (STRICT ? WFRAG_BYTES : 0) + RED_BYTES;
}

/* group_kernel: two halves of STEP_PLANES slots (the step in use, the next one in flight). */
template <int K> __host__ __device__ constexpr int group_ring_elems() { return 2 * Geo<K, K, K>::STEP_PLANES * Geo<K, K, K>::SLOT_ELEMS; }
template <typename T, int K> __host__ __device__ constexpr int group_x_bytes()
{
    return CIN * chan_pitch<T>(group_ring_elems<K>()) * (int)sizeof(T);
}
template <typename T, int K> __host__ __device__ constexpr int group_smem_bytes() { return group_x_bytes<T, K>() + RED_BYTES; }
static_assert(2 * Geo<3, 3, 3>::STEP_PLANES <= SLOT_MASK + 1, "group halves must not wrap");
} // namespace fp

constexpr int GEN_THREADS = 256;
constexpr int GEN_WIN_PER_THREAD = 4;
constexpr int64_t GEN_WIN_PER_PART = (int64_t)GEN_THREADS * GEN_WIN_PER_THREAD;
constexpr int FIN_THREADS = 128;
constexpr int PACK_THREADS = 256;

/* ============================== device helpers ============================== */

__device__ __forceinline__ uint32_t to_tf32(float f)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(f));
    return r;
}

__device__ __forceinline__ float tf32_round(float f) { return __uint_as_float(to_tf32(f)); }

/* d += A(16x8, row) * B(8x8, col); A = weights [cout][cin], B = x [cin][column]. */
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint4 &a, uint32_t b0, uint32_t b1)
{
    const uint32_t av[4] = {a.x, a.y, a.z, a.w};
    mma_tf32(d, av, b0, b1);
}

/* src_bytes < 16 zero-fills the rest and reads nothing past src + src_bytes. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

/* MaxPool3d propagates NaN; fmaxf would drop it. max.NaN (sm_80+) is one instruction. */
__device__ __forceinline__ float nan_max(float a, float b)
{
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float nan_min(float a, float b)
{
    float r;
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

/* MMA operand for a value known to be finite or NaN-from-inf: the tensor cores read only the
 * top 19 bits, so adding half a TF32 ulp is round-to-nearest-away. A NaN (inf - inf in the
 * 3xTF32 residual of an infinite x) wraps to -0, so the big part alone carries the inf. */
__device__ __forceinline__ uint32_t tf32_operand_unchecked(float f) { return __float_as_uint(f) + 0x1000u; }

/* How one output channel turns a window of raw conv sums into a pooled value. For finite
 * nonzero d and finite bias, (v + bias) / d is monotone in v (rounding is monotone), so the
 * max of the divided values is the max (d > 0) or min (d < 0) of the raw ones, divided once:
 * bit-identical to the literal order. Otherwise (d = 0, inf, NaN, bias inf/NaN) every element
 * is divided first, as PyTorch does. */
enum WindowMode { kMaxRaw = 0, kMinRaw = 1, kLiteral = 2 };
struct ChanMode {
    float bias, div;
    int mode;
};

__device__ __forceinline__ ChanMode chan_mode(const float *conv_bias, int64_t c, int64_t cout, float d)
{
    ChanMode m;
    m.bias = (conv_bias && c < cout) ? conv_bias[c] : 0.0f;
    m.div = d;
    const bool fast = isfinite(d) && d != 0.0f && isfinite(m.bias);
    m.mode = fast ? (d > 0.0f ? kMaxRaw : kMinRaw) : kLiteral;
    return m;
}

__device__ __forceinline__ float window_elem(float v, const ChanMode &m)
{
    return m.mode == kLiteral ? (v + m.bias) / m.div : v;
}
__device__ __forceinline__ float window_combine(float acc, float y, const ChanMode &m)
{
    return m.mode == kMinRaw ? nan_min(acc, y) : nan_max(acc, y);
}
__device__ __forceinline__ float window_finish(float acc, const ChanMode &m)
{
    return m.mode == kLiteral ? acc : (acc + m.bias) / m.div;
}

/* The mode depends on the divisor (uniform) and on a channel's bias being finite (uniform but
 * for odd inputs), so these branches do not diverge in practice. */
__device__ __forceinline__ float window8(const float (&v)[8], const ChanMode &m)
{
    float acc;
    if (m.mode == kMaxRaw) {
        acc = v[0];
#pragma unroll
        for (int i = 1; i < 8; ++i)
            acc = nan_max(acc, v[i]);
    } else if (m.mode == kMinRaw) {
        acc = v[0];
#pragma unroll
        for (int i = 1; i < 8; ++i)
            acc = nan_min(acc, v[i]);
    } else {
        acc = window_elem(v[0], m);
#pragma unroll
        for (int i = 1; i < 8; ++i)
            acc = nan_max(acc, window_elem(v[i], m));
    }
    return window_finish(acc, m);
}

__device__ __forceinline__ int64_t x_index(const Shape &s, int64_t b, int64_t c, int64_t d, int64_t h, int64_t w)
{
    return (((b * s.cin + c) * s.in_d + d) * s.in_h + h) * s.in_w + w;
}

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

/* Copies NP input d-planes (plane0 ...; channels c0 .. c0 + nch - 1; the slab's IN_H rows; the
 * IN_W columns from w0) into ring slots slot0 ... (consecutive, never wrapping), channel c0 + c
 * to smem channel c. Aligned rows: warp c moves channel c, one 16-byte chunk per lane and RPI
 * rows per instruction, with compile-time row arithmetic. Rows and columns past the input are
 * skipped: they only feed conv outputs that floor-mode pooling drops, and an MMA keeps each
 * output column to itself. With pad, smem channels nch .. CIN - 1 are zeroed instead: they meet
 * zero weights, and a stale inf or NaN there would make 0 * inf = NaN in every column. */
template <typename T, int NP, typename G, bool SYNC = false>
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
                if (col_ok && row < ROWS && h0 + r < s.in_h)
                    cp_async16(dst_c + pi * G::SLOT_ELEMS + r * fp::ROW + q * EPC,
                               src_c + pi * hw + r * s.in_w + q * EPC, 16);
            }
            if (halo && lane < ROWS) {
                const int pi = lane / G::IN_H, r = lane % G::IN_H;
                const int64_t left = s.in_w - (w0 + fp::OUT_W);
                if (h0 + r < s.in_h)
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
                        if (h0 + r < s.in_h) {
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
                                if (row < ROWS && h0 + r < s.in_h && col_ok[k])
                                    v[u][k] = src_c[pi * hw + r * s.in_w + 32 * k];
                        }
#pragma unroll
                        for (int u = 0; u < RB; ++u) {
                            const int row = r0 + u, pi = row / G::IN_H, r = row % G::IN_H;
#pragma unroll
                            for (int k = 0; k < NCP; ++k)
                                if (row < ROWS && h0 + r < s.in_h && col_ok[k])
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
#pragma unroll
        for (int dd = 0; dd < 2; ++dd)
#pragma unroll
            for (int hh = 0; hh < OUT_H; ++hh)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    accs[dd][hh][e] = 0.0f;
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

/* Pools one step: c0,c1 = channel g, columns (2t, 2t+1); c2,c3 = channel g+8. ph0: the slab's
 * first pooled row; pw: this lane's pooled column. */
__device__ __forceinline__ void pool_step(const float (&acc)[2][fp::OUT_H][4], const Shape &s, int64_t ph0,
                                          int64_t pw, const ChanMode &cm0, const ChanMode &cm1, float &sum0,
                                          float &sum1)
{
#pragma unroll
    for (int hp = 0; hp < 2; ++hp) {
        if (ph0 + hp < s.pooled_h && pw < s.pooled_w) {
            float v0[8], v1[8];
#pragma unroll
            for (int dd = 0; dd < 2; ++dd)
#pragma unroll
                for (int e = 0; e < 2; ++e)
#pragma unroll
                    for (int k = 0; k < 2; ++k) {
                        v0[dd * 4 + e * 2 + k] = acc[dd][2 * hp + e][k];
                        v1[dd * 4 + e * 2 + k] = acc[dd][2 * hp + e][2 + k];
                    }
            sum0 += window8(v0, cm0);
            sum1 += window8(v1, cm1);
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

/* ================================== kernels ================================== */

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
        red[threadIdx.x] = sum;
        __syncthreads();
        for (int off = GEN_THREADS / 2; off > 0; off >>= 1) {
            if ((int)threadIdx.x < off)
                red[threadIdx.x] += red[threadIdx.x + off];
            __syncthreads();
        }
        if (threadIdx.x == 0)
            partials[part] = red[0];
        __syncthreads();
    }
}

/* A fragments for group_kernel, per (16-channel output group, 8-channel input group):
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

/* Kernel 3^3, Cin <= 8, Cout <= 16 (see the top comment). Item = (b, h-slab hs, w-slab ws);
 * step = one pooled d. */
template <typename T, bool STRICT>
__global__ void __launch_bounds__(fp::THREADS, fp::MIN_BLOCKS)
k3p2_kernel(const Shape s, const T *__restrict__ x, const float *__restrict__ w,
            const float *__restrict__ conv_bias, float *__restrict__ partials, int64_t n_hs,
            int64_t n_ws, int64_t n_items, int aligned)
{
    using namespace fp;
    constexpr int PITCH = chan_pitch<T>(RING_ELEMS);
    constexpr int TAPS = G3::TAPS;
    /* With the row-wise unaligned staging compiled in, ptxas allocates the f32 variants so that
     * the aligned headline runs 1-3% slower (the 16-bit ones 2-3% faster): f32 keeps the first
     * version's element loop for unaligned rows. */
    constexpr bool SYNC_STAGING = CONVPOOL_K3P2_SYNC_STAGING == 2 ||
                                  (CONVPOOL_K3P2_SYNC_STAGING == 1 && std::is_same<T, float>::value);
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *xs = reinterpret_cast<T *>(smem_raw);
    const uint4 *wfrag = reinterpret_cast<const uint4 *>(smem_raw + x_bytes<T>());
    float *red = reinterpret_cast<float *>(smem_raw + x_bytes<T>() + (STRICT ? WFRAG_BYTES : 0));

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    int64_t item = blockIdx.x;
    if (item >= n_items)
        return;

    /* Zero the ring once: padded channels and columns must read as finite zeros. */
    for (int i = tid; i < x_bytes<T>() / 16; i += THREADS)
        reinterpret_cast<uint4 *>(smem_raw)[i] = make_uint4(0u, 0u, 0u, 0u);

    /* A fragment of tap k: a0 = W[g][t], a1 = W[g+8][t], a2 = W[g][t+4], a3 = W[g+8][t+4]. */
    auto wval = [&](int co, int ci, int tap) -> float {
        return (co < s.cout && ci < s.cin) ? w[((int64_t)co * s.cin + ci) * TAPS + tap] : 0.0f;
    };
    uint32_t wr[STRICT ? 1 : TAPS][4];
    if constexpr (!STRICT) {
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
    const int64_t nparts = n_hs * n_ws;

    auto decode = [&](int64_t it, int64_t &b, int64_t &hs, int64_t &ws) {
        ws = it % n_ws;
        const int64_t r = it / n_ws;
        hs = r % n_hs;
        b = r / n_hs;
    };
    auto stage_pair = [&](int64_t b, int64_t hs, int64_t ws, int64_t plane0, int slot0) {
        stage_planes<T, 2, G3, SYNC_STAGING>(xs, s, x, b, 0, s.cin, hs * OUT_H, ws * OUT_W, plane0, slot0,
                                             aligned != 0, false, PITCH);
    };

    __syncthreads(); /* zeroing before any cp.async lands */
    int64_t b, hs, ws;
    decode(item, b, hs, ws);
    stage_pair(b, hs, ws, 0, 0);
    stage_pair(b, hs, ws, 2, 2);
    cp_async_commit();

    int64_t pd = 0;
    int base = 0; /* ring slot of the current step's first input plane */
    float sum0 = 0.0f, sum1 = 0.0f;
    const T *xw = xs + t * PITCH + 8 * warp + g; /* this lane's B element: channel t, column g */

    for (;;) {
        cp_async_wait_all();
        __syncthreads(); /* current planes visible; every warp is done with the previous step */

        /* Prefetch the next step into slots this step does not read. */
        int64_t next_item = item, next_pd = pd + 1;
        int next_base = base + 2;
        if (next_pd >= s.pooled_d) {
            next_item = item + gridDim.x;
            next_pd = 0;
            next_base = base + 4;
        }
        if (next_item < n_items) {
            if (next_pd == 0) {
                int64_t nb, nh, nw;
                decode(next_item, nb, nh, nw);
                stage_pair(nb, nh, nw, 0, next_base & (SLOTS - 1));
                stage_pair(nb, nh, nw, 2, (next_base + 2) & (SLOTS - 1));
            } else {
                stage_pair(b, hs, ws, 2 * next_pd + 2, (base + 4) & (SLOTS - 1));
            }
        }
        cp_async_commit();

        const int64_t pw = ws * (OUT_W / 2) + 4 * warp + t; /* this lane's pooled column */
        const bool active = ws * (OUT_W / 2) + 4 * warp < s.pooled_w;
        if (active) {
            float acc[2][OUT_H][4];
#pragma unroll
            for (int dd = 0; dd < 2; ++dd)
#pragma unroll
                for (int hh = 0; hh < OUT_H; ++hh)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        acc[dd][hh][e] = 0.0f;
            conv_step<T, STRICT, 3, 3, 3, PITCH>(acc, xw, base, wr, wfrag, lane);
            pool_step(acc, s, hs * (OUT_H / 2), pw, cm0, cm1, sum0, sum1);
        }

        if (pd == s.pooled_d - 1) {
            write_item_sums(sum0, sum1, red, s, b, 0, hs * n_ws + ws, nparts, partials);
            sum0 = 0.0f;
            sum1 = 0.0f;
        }

        if (next_item >= n_items)
            break;
        if (next_item != item)
            decode(next_item, b, hs, ws);
        item = next_item;
        pd = next_pd;
        base = next_base & (SLOTS - 1);
    }
}

/* Pool 2^3, kernel K^3, any Cin and Cout (see the top comment). Item = (output-channel group
 * cog, b, hs, ws), cog fastest so that blocks running side by side share x in L2; unit = (step
 * pd, input-channel group gi). Units alternate between ring halves at slots 0 and NP. */
template <typename T, bool STRICT, int K>
__global__ void __launch_bounds__(fp::THREADS, fp::MIN_BLOCKS)
group_kernel(const Shape s, const T *__restrict__ x, const uint4 *__restrict__ wpacked,
             const float *__restrict__ conv_bias, float *__restrict__ partials, int64_t n_hs, int64_t n_ws,
             int64_t n_cog, int64_t n_items, int aligned)
{
    using namespace fp;
    using G = Geo<K, K, K>;
    constexpr int NP = G::STEP_PLANES, TAPS = G::TAPS;
    constexpr int PITCH = chan_pitch<T>(group_ring_elems<K>());
    constexpr int NPARTS_W = STRICT ? 2 : 1;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *xs = reinterpret_cast<T *>(smem_raw);
    float *red = reinterpret_cast<float *>(smem_raw + group_x_bytes<T, K>());

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    int64_t item = blockIdx.x;
    if (item >= n_items)
        return;

    /* Zero the ring once: never-staged rows and columns then hold finite values. */
    for (int i = tid; i < group_x_bytes<T, K>() / 16; i += THREADS)
        reinterpret_cast<uint4 *>(smem_raw)[i] = make_uint4(0u, 0u, 0u, 0u);

    const int64_t n_cig = ceil_div(s.cin, CIN);
    const int64_t nparts = n_hs * n_ws;
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
        stage_planes<T, NP, G>(xs, s, x, b, gi * CIN, left < CIN ? left : (int64_t)CIN, hs * OUT_H, ws * OUT_W,
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
#pragma unroll
    for (int dd = 0; dd < 2; ++dd)
#pragma unroll
        for (int hh = 0; hh < OUT_H; ++hh)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                acc[dd][hh][e] = 0.0f;
    const T *xw = xs + t * PITCH + 8 * warp + g; /* this lane's B element: channel t, column g */

    for (;;) {
        cp_async_wait_all();
        __syncthreads(); /* current unit visible; every warp is done with the previous one */

        /* Prefetch the next unit into the other half. */
        int64_t next_item = item, next_pd = pd, next_gi = gi + 1;
        if (next_gi >= n_cig) {
            next_gi = 0;
            next_pd = pd + 1;
            if (next_pd >= s.pooled_d) {
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
        const int64_t pw = ws * (OUT_W / 2) + 4 * warp + t; /* this lane's pooled column */
        const bool active = ws * (OUT_W / 2) + 4 * warp < s.pooled_w;
        if (active) {
            if (gi == 0) {
#pragma unroll
                for (int dd = 0; dd < 2; ++dd)
#pragma unroll
                    for (int hh = 0; hh < OUT_H; ++hh)
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            acc[dd][hh][e] = 0.0f;
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
            conv_step<T, STRICT, K, K, K, PITCH>(acc, xw, base, wr, wf, lane);
            if (last_group)
                pool_step(acc, s, hs * (OUT_H / 2), pw, cm0, cm1, sum0, sum1);
        }

        if (last_group && pd == s.pooled_d - 1) {
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

/* P[b][c] = (sum of parts, fixed order, double) / windows; out[b] = sum_c (P + bias). */
__global__ void __launch_bounds__(FIN_THREADS)
finish_kernel(const float *__restrict__ partials, int64_t nparts, int64_t batch, int64_t cout,
              double windows, const float *__restrict__ bias, float *__restrict__ pooled,
              float *__restrict__ out)
{
    __shared__ double red[FIN_THREADS];
    for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
        double acc = 0.0;
        for (int64_t c = threadIdx.x; c < cout; c += FIN_THREADS) {
            const float *pp = partials + (b * cout + c) * nparts;
            double sum = 0.0;
            for (int64_t k = 0; k < nparts; ++k)
                sum += (double)pp[k];
            const float P = (float)(sum / windows);
            pooled[b * cout + c] = P;
            if (out)
                acc += (double)(P + bias[c]);
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
                out[b] = (float)red[0];
            __syncthreads();
        }
    }
}

/* ================================= launchers ================================= */

/* Per-device facts, read once per device id (no synchronisation involved). */
struct DeviceInfo {
    int ok; /* 1: usable, 0: not */
    int cc_major, cc_minor, sms, smem_optin;
    char why[160];
};
constexpr int MAX_DEVICES = 64;
DeviceInfo g_dev[MAX_DEVICES];
/* 0: not read, 1: one thread is storing it, 2: ready. */
std::atomic<int> g_dev_state[MAX_DEVICES];

/* Reads the facts of device dev into *info without touching convpool_last_error(); returns the
 * CUDA error of a failed query (info->why says which). */
cudaError_t read_device_info(int dev, DeviceInfo *info)
{
    if (g_dev_state[dev].load(std::memory_order_acquire) == 2) {
        *info = g_dev[dev];
        return cudaSuccess;
    }
    DeviceInfo d = {};
    const cudaDeviceAttr attrs[4] = {cudaDevAttrComputeCapabilityMajor, cudaDevAttrComputeCapabilityMinor,
                                     cudaDevAttrMultiProcessorCount, cudaDevAttrMaxSharedMemoryPerBlockOptin};
    int *vals[4] = {&d.cc_major, &d.cc_minor, &d.sms, &d.smem_optin};
    for (int i = 0; i < 4; ++i) {
        const cudaError_t e = cudaDeviceGetAttribute(vals[i], attrs[i], dev);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            snprintf(info->why, sizeof info->why, "cudaDeviceGetAttribute(device %d) failed: %s", dev,
                     cudaGetErrorString(e));
            info->ok = 0;
            return e;
        }
    }
    d.ok = 1;
    if (d.cc_major < 8) {
        d.ok = 0;
        snprintf(d.why, sizeof d.why,
                 "GPU compute capability %d.%d is below 8.0 (mma.sync TF32 and cp.async need sm_80+)", d.cc_major,
                 d.cc_minor);
    } else {
        /* The build must hold code this device can run (sm_90 SASS or compute_80 PTX). */
        cudaFuncAttributes fa;
        const cudaError_t e = cudaFuncGetAttributes(&fa, finish_kernel);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            d.ok = 0;
            snprintf(d.why, sizeof d.why, "no kernel image for compute capability %d.%d: %s", d.cc_major,
                     d.cc_minor, cudaGetErrorString(e));
        }
    }
    int expected = 0;
    if (g_dev_state[dev].compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
        g_dev[dev] = d;
        g_dev_state[dev].store(2, std::memory_order_release);
    }
    *info = d;
    return cudaSuccess;
}

/* The current device's facts; fails (with a message) when it cannot run these kernels. */
convpool_status device_info(DeviceInfo *info)
{
    int dev = 0;
    CP_CUDA_TRY(cudaGetDevice(&dev));
    if (dev < 0 || dev >= MAX_DEVICES)
        return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "CUDA device id %d is beyond the %d supported",
                             dev, MAX_DEVICES);
    const cudaError_t e = read_device_info(dev, info);
    if (e != cudaSuccess)
        return convpool_fail(CONVPOOL_ERR_CUDA, "%s", info->why);
    if (!info->ok)
        return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "%s", info->why);
    return CONVPOOL_OK;
}

/* Resident blocks per SM of a fast kernel on the current device, after raising its dynamic
 * shared-memory limit; cached per (kernel instantiation, device). */
template <typename Kernel>
convpool_status fast_blocks_per_sm(Kernel kernel, int smem, std::atomic<int> (&cache)[MAX_DEVICES], int *per_sm)
{
    int devid = 0;
    CP_CUDA_TRY(cudaGetDevice(&devid));
    if (devid < 0 || devid >= MAX_DEVICES)
        return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "CUDA device id %d is beyond the %d supported", devid,
                             MAX_DEVICES);
    int n = cache[devid].load(std::memory_order_acquire);
    if (n == 0) {
        CP_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CP_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, fp::THREADS, smem));
        if (n < 1)
            return convpool_fail(CONVPOOL_ERR_UNSUPPORTED,
                                 "fast kernel does not fit on this GPU (%d bytes of shared memory)", smem);
        cache[devid].store(n, std::memory_order_release);
    }
    *per_sm = n;
    return CONVPOOL_OK;
}

template <typename T>
bool rows_aligned(const Shape &s, const T *x)
{
    return ((uintptr_t)x % 16 == 0) && (s.in_w % (16 / (int64_t)sizeof(T)) == 0);
}

template <typename T, bool STRICT>
convpool_status launch_k3p2(const Shape &s, const T *x, const float *w, const float *cb, float *partials,
                            int64_t n_hs, int64_t n_ws, const DeviceInfo &dev, cudaStream_t st)
{
    constexpr int smem = fp::smem_bytes<T, STRICT>();
    static std::atomic<int> blocks[MAX_DEVICES];
    if (s.k_d != 3 || s.k_h != 3 || s.k_w != 3 || s.pool_d != 2 || s.pool_h != 2 || s.pool_w != 2 ||
        s.cin > fp::CIN || s.cout > fp::COUT || n_hs * n_ws < 1)
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "internal: k3p2 launcher got an unsupported shape");
    int per_sm = 0;
    const convpool_status stt = fast_blocks_per_sm(k3p2_kernel<T, STRICT>, smem, blocks, &per_sm);
    if (stt != CONVPOOL_OK)
        return stt;
    const int64_t n_items = s.batch * n_hs * n_ws;
    const int64_t resident = (int64_t)dev.sms * per_sm;
    const int64_t grid = n_items < resident ? n_items : resident;
    k3p2_kernel<T, STRICT><<<(unsigned)grid, fp::THREADS, smem, st>>>(s, x, w, cb, partials, n_hs, n_ws, n_items,
                                                                      rows_aligned(s, x) ? 1 : 0);
    CP_CUDA_TRY_LAUNCH("k3p2_kernel");
    return CONVPOOL_OK;
}

/* Packs the weights into `packed` (16-byte aligned, group_pack_bytes long), then runs the
 * group kernel; the two launches are ordered by the stream. */
template <typename T, bool STRICT, int K>
convpool_status launch_group(const Shape &s, const T *x, const float *w, const float *cb, float *partials,
                             uint4 *packed, int64_t n_hs, int64_t n_ws, const DeviceInfo &dev, cudaStream_t st)
{
    constexpr int smem = fp::group_smem_bytes<T, K>();
    constexpr int64_t taps = fp::Geo<K, K, K>::TAPS;
    static std::atomic<int> blocks[MAX_DEVICES];
    if (s.k_d != K || s.k_h != K || s.k_w != K || s.pool_d != 2 || s.pool_h != 2 || s.pool_w != 2 ||
        n_hs * n_ws < 1 || (uintptr_t)packed % 16 != 0)
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "internal: group launcher got an unsupported shape");
    int per_sm = 0;
    const convpool_status stt = fast_blocks_per_sm(group_kernel<T, STRICT, K>, smem, blocks, &per_sm);
    if (stt != CONVPOOL_OK)
        return stt;
    const int64_t n_cog = ceil_div(s.cout, fp::COUT), n_cig = ceil_div(s.cin, fp::CIN);
    const int64_t total = n_cog * n_cig * taps * 32;
    const int64_t pack_cap = (int64_t)dev.sms * 16;
    const int64_t pack_grid = ceil_div(total, PACK_THREADS) < pack_cap ? ceil_div(total, PACK_THREADS) : pack_cap;
    pack_weights_kernel<<<(unsigned)pack_grid, PACK_THREADS, 0, st>>>(w, s.cin, s.cout, taps, n_cig,
                                                                      STRICT ? 2 : 1, total, packed);
    CP_CUDA_TRY_LAUNCH("pack_weights_kernel");
    const int64_t n_items = n_cog * s.batch * n_hs * n_ws;
    const int64_t resident = (int64_t)dev.sms * per_sm;
    const int64_t grid = n_items < resident ? n_items : resident;
    group_kernel<T, STRICT, K><<<(unsigned)grid, fp::THREADS, smem, st>>>(s, x, packed, cb, partials, n_hs, n_ws,
                                                                          n_cog, n_items, rows_aligned(s, x) ? 1 : 0);
    CP_CUDA_TRY_LAUNCH("group_kernel");
    return CONVPOOL_OK;
}

template <typename T, bool TF32>
convpool_status launch_generic(const Shape &s, const T *x, const float *w, const float *cb, float *partials,
                               int64_t parts_per_bc, const DeviceInfo &dev, cudaStream_t st)
{
    if (parts_per_bc != ceil_div(s.pooled_d * s.pooled_h * s.pooled_w, GEN_WIN_PER_PART))
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "internal: generic launcher got a wrong part count");
    const int64_t total = s.batch * s.cout * parts_per_bc;
    /* Grid-strided over parts, capped at 32 blocks per SM: gridDim.x stays small for any size. */
    const int64_t cap = (int64_t)dev.sms * 32;
    const int64_t grid = total < cap ? total : cap;
    generic_kernel<T, TF32><<<(unsigned)grid, GEN_THREADS, 0, st>>>(s, x, w, cb, partials, parts_per_bc, total);
    CP_CUDA_TRY_LAUNCH("generic_kernel");
    return CONVPOOL_OK;
}

convpool_status launch_finish(const Shape &s, const float *partials, int64_t nparts, const float *bias,
                              float *pooled, float *out, const DeviceInfo &dev, cudaStream_t st)
{
    const int64_t cap = (int64_t)dev.sms * 64;
    const int64_t grid = s.batch < cap ? s.batch : cap;
    const double windows = (double)s.pooled_d * (double)s.pooled_h * (double)s.pooled_w;
    finish_kernel<<<(unsigned)grid, FIN_THREADS, 0, st>>>(partials, nparts, s.batch, s.cout, windows, bias,
                                                          pooled, out);
    CP_CUDA_TRY_LAUNCH("finish_kernel");
    return CONVPOOL_OK;
}

/* ================================== dispatch ================================== */

Shape make_shape(const convpool_problem &p)
{
    Shape s;
    s.batch = p.batch;
    s.cin = p.in_channels;
    s.cout = p.out_channels;
    s.in_d = p.in_d;
    s.in_h = p.in_h;
    s.in_w = p.in_w;
    s.k_d = p.kernel_d;
    s.k_h = p.kernel_h;
    s.k_w = p.kernel_w;
    s.pool_d = p.pool_d;
    s.pool_h = p.pool_h;
    s.pool_w = p.pool_w;
    s.pooled_d = p.pooled_d;
    s.pooled_h = p.pooled_h;
    s.pooled_w = p.pooled_w;
    s.divisor = (float)p.divisor; /* PyTorch divides a float32 tensor by the scalar in float32 */
    return s;
}

/* Which kernel a shape takes when the device has the shared memory for it. */
enum Path { kGeneric, kK3P2, kGroup };

Path fast_path(const convpool_problem &p)
{
    if (p.pool_d != 2 || p.pool_h != 2 || p.pool_w != 2 || p.kernel_h != p.kernel_d || p.kernel_w != p.kernel_d)
        return kGeneric;
    const int64_t k = p.kernel_d;
    if (k == 3 && p.in_channels <= fp::CIN && p.out_channels <= fp::COUT)
        return kK3P2;
    if (k >= 1 && k <= 3 && ((CONVPOOL_GROUP_KERNELS >> (k - 1)) & 1))
        return kGroup;
    return kGeneric;
}

int64_t fast_parts(const convpool_problem &p)
{
    return ceil_div(p.pooled_h, fp::OUT_H / 2) * ceil_div(p.pooled_w, fp::OUT_W / 2);
}

int64_t generic_parts(const convpool_problem &p)
{
    return ceil_div(p.pooled_d * p.pooled_h * p.pooled_w, GEN_WIN_PER_PART);
}

/* Workspace: the partial sums (room for whichever path the device ends up taking), then, for
 * the group path, 16 bytes of alignment slack and the packed weight fragments. */
struct Workspace {
    int64_t parts, partial_bytes, pack_bytes, total;
};

convpool_status workspace_layout(const convpool_problem &p, bool strict, Workspace *ws)
{
    const Path path = fast_path(p);
    int64_t parts = generic_parts(p);
    if (path != kGeneric && fast_parts(p) > parts)
        parts = fast_parts(p);
    double pack = 0.0;
    if (path == kGroup)
        pack = (double)ceil_div(p.out_channels, fp::COUT) * (double)ceil_div(p.in_channels, fp::CIN) *
               (double)(p.kernel_d * p.kernel_h * p.kernel_w) * 32.0 * 16.0 * (strict ? 2.0 : 1.0);
    const double n = (double)p.batch * (double)p.out_channels * (double)parts * 4.0 + pack + 16.0;
    if (n > 9.0e18)
        return convpool_fail(CONVPOOL_ERR_OVERFLOW, "workspace size overflows");
    ws->parts = parts;
    ws->partial_bytes = p.batch * p.out_channels * parts * (int64_t)sizeof(float);
    ws->pack_bytes = (int64_t)pack;
    ws->total = ws->partial_bytes + (path == kGroup ? 16 + ws->pack_bytes : 0);
    return CONVPOOL_OK;
}

convpool_status check_modes(convpool_precision precision, convpool_dtype dtype)
{
    if (precision != CONVPOOL_PRECISION_TF32 && precision != CONVPOOL_PRECISION_STRICT)
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "precision must be TF32 (0) or STRICT (1), got %d",
                             (int)precision);
    if (dtype != CONVPOOL_DTYPE_F32 && dtype != CONVPOOL_DTYPE_F16 && dtype != CONVPOOL_DTYPE_BF16)
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "dtype must be F32 (0), F16 (1) or BF16 (2), got %d",
                             (int)dtype);
    return CONVPOOL_OK;
}

template <typename T, bool STRICT>
convpool_status run_group(const Shape &s, const T *x, const float *w, const float *cb, float *partials,
                          uint4 *packed, int64_t n_hs, int64_t n_ws, const DeviceInfo &dev, cudaStream_t st)
{
    switch (s.k_d) {
    case 1:
        return launch_group<T, STRICT, 1>(s, x, w, cb, partials, packed, n_hs, n_ws, dev, st);
    case 2:
        return launch_group<T, STRICT, 2>(s, x, w, cb, partials, packed, n_hs, n_ws, dev, st);
    case 3:
        return launch_group<T, STRICT, 3>(s, x, w, cb, partials, packed, n_hs, n_ws, dev, st);
    default:
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "internal: no group kernel for kernel size %lld",
                             (long long)s.k_d);
    }
}

template <typename T>
convpool_status run_main(const convpool_problem &p, bool strict, const T *x, const float *w, const float *cb,
                         unsigned char *workspace, const Workspace &ws, int64_t *nparts, const DeviceInfo &dev,
                         cudaStream_t st)
{
    const Shape s = make_shape(p);
    float *partials = reinterpret_cast<float *>(workspace);
    const int64_t n_hs = ceil_div(p.pooled_h, fp::OUT_H / 2), n_ws = ceil_div(p.pooled_w, fp::OUT_W / 2);
    const Path path = fast_path(p);
    if (path == kK3P2 && fp::smem_bytes<T, true>() <= dev.smem_optin) {
        *nparts = n_hs * n_ws;
        return strict ? launch_k3p2<T, true>(s, x, w, cb, partials, n_hs, n_ws, dev, st)
                      : launch_k3p2<T, false>(s, x, w, cb, partials, n_hs, n_ws, dev, st);
    }
    if (path == kGroup && fp::group_smem_bytes<T, 3>() <= dev.smem_optin) {
        *nparts = n_hs * n_ws;
        const uintptr_t at = (uintptr_t)(workspace + ws.partial_bytes);
        uint4 *packed = reinterpret_cast<uint4 *>(workspace + ws.partial_bytes + ((16 - at % 16) % 16));
        return strict ? run_group<T, true>(s, x, w, cb, partials, packed, n_hs, n_ws, dev, st)
                      : run_group<T, false>(s, x, w, cb, partials, packed, n_hs, n_ws, dev, st);
    }
    *nparts = generic_parts(p);
    return strict ? launch_generic<T, false>(s, x, w, cb, partials, *nparts, dev, st)
                  : launch_generic<T, true>(s, x, w, cb, partials, *nparts, dev, st);
}

} // namespace

/* A query: it never fails, so it leaves convpool_last_error() alone. */
extern "C" int convpool_cuda_available(void)
{
    int n = 0, dev = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0 || cudaGetDevice(&dev) != cudaSuccess || dev < 0 ||
        dev >= MAX_DEVICES) {
        (void)cudaGetLastError();
        return 0;
    }
    DeviceInfo info;
    return read_device_info(dev, &info) == cudaSuccess && info.ok ? 1 : 0;
}

extern "C" convpool_status convpool_cuda_workspace_size(const convpool_problem *p, convpool_precision precision,
                                                        convpool_dtype dtype, size_t *bytes)
{
    if (!bytes)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "bytes is NULL");
    if (!p)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "problem is NULL");
    convpool_problem q = *p;
    convpool_status st = convpool_problem_validate(&q);
    if (st != CONVPOOL_OK)
        return st;
    st = check_modes(precision, dtype);
    if (st != CONVPOOL_OK)
        return st;
    Workspace ws = {0, 0, 0, 0};
    st = workspace_layout(q, precision == CONVPOOL_PRECISION_STRICT, &ws);
    if (st != CONVPOOL_OK)
        return st;
    *bytes = (size_t)ws.total;
    return CONVPOOL_OK;
}

extern "C" convpool_status convpool_forward_cuda(const convpool_problem *p, convpool_precision precision,
                                                 convpool_dtype dtype, const void *x, const float *weight,
                                                 const float *conv_bias, const float *bias, float *pooled,
                                                 float *out, void *workspace, size_t workspace_bytes,
                                                 void *stream)
{
    convpool_problem q;
    convpool_status st = convpool_check_forward_args(p, x, weight, bias, pooled, out, &q);
    if (st != CONVPOOL_OK)
        return st;
    st = check_modes(precision, dtype);
    if (st != CONVPOOL_OK)
        return st;
    const bool strict = precision == CONVPOOL_PRECISION_STRICT;
    Workspace ws = {0, 0, 0, 0};
    st = workspace_layout(q, strict, &ws);
    if (st != CONVPOOL_OK)
        return st;
    const size_t need = (size_t)ws.total;
    if (need > 0 && !workspace)
        return convpool_fail(CONVPOOL_ERR_WORKSPACE, "workspace is NULL but %zu bytes are needed", need);
    if (workspace_bytes < need)
        return convpool_fail(CONVPOOL_ERR_WORKSPACE, "workspace_bytes is %zu, need %zu", workspace_bytes, need);
    if ((uintptr_t)workspace % sizeof(float) != 0)
        return convpool_fail(CONVPOOL_ERR_WORKSPACE, "workspace must be 4-byte aligned");
    DeviceInfo dev;
    st = device_info(&dev);
    if (st != CONVPOOL_OK)
        return st;

    cudaStream_t cs = static_cast<cudaStream_t>(stream);
    unsigned char *wsp = static_cast<unsigned char *>(workspace);
    int64_t nparts = 0;
    switch (dtype) {
    case CONVPOOL_DTYPE_F32:
        st = run_main<float>(q, strict, static_cast<const float *>(x), weight, conv_bias, wsp, ws, &nparts, dev, cs);
        break;
    case CONVPOOL_DTYPE_F16:
        st = run_main<__half>(q, strict, static_cast<const __half *>(x), weight, conv_bias, wsp, ws, &nparts, dev,
                              cs);
        break;
    case CONVPOOL_DTYPE_BF16:
        st = run_main<__nv_bfloat16>(q, strict, static_cast<const __nv_bfloat16 *>(x), weight, conv_bias, wsp, ws,
                                     &nparts, dev, cs);
        break;
    }
    if (st != CONVPOOL_OK)
        return st;
    return launch_finish(make_shape(q), reinterpret_cast<float *>(wsp), nparts, bias, pooled, out, dev, cs);
}
