/*
 * Issue "hardware limit": a standalone probe of the Hopper forward's core (sm_90a wgmma), not
 * wired into the library. The headline problem only (x 128x8x16x64x64 float32, 16 channels,
 * kernel 3, pool 2, divisor > 0): per (sample, pooled d) block, the sum over pooled (h, w) of
 * each channel's window max of the raw conv (bias and divisor commute past it), checked against
 * a double-precision reference on the same TF32-rounded operands, and timed with CUDA events.
 *
 *   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o wgmma_conv docs/experiments/wgmma_conv.cu && ./wgmma_conv
 *
 * Layout (KERNEL_NOTES "wgmma" sketch): one warpgroup a block; x rows staged TF32-rounded as two
 * planes [w][4 channels] (16 B a position), so 8 positions of a plane are one no-swizzle core
 * matrix, the channel halves a plane apart (LBO) and the next 8 positions 128 B on (SBO); tap tw
 * is the same descriptor 16 B later. The weights sit in shared memory as [tap][k half][co][4].
 * A conv row of 64 positions x 16 channels is 27 wgmma.m64n16k8 (one a tap). A_REG: A from
 * registers instead (4 LDS a thread a tap-row, each load shared by the conv rows that use it).
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s failed: %s (line %d)\n", #call, cudaGetErrorString(e_), __LINE__); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

namespace {
constexpr int B = 128, CIN = 8, COUT = 16, D = 16, H = 64, W = 64, K = 3;
constexpr int CD = D - K + 1, CH = H - K + 1, CW = W - K + 1; /* 14 62 62 */
constexpr int PD = CD / 2, PH = CH / 2, PW = CW / 2;           /* 7 31 31 */
constexpr int TAPS = K * K * K;
constexpr int WPAD = 72;                     /* staged positions a plane (64 + the tw shift, rounded) */
constexpr int PLANE = WPAD * 16;             /* bytes: [w][4 channels] */
constexpr int ROWB = 2 * PLANE + 64;         /* a staged (d, h) row: two planes, bank skew */
/* h slots: the step's 4 rows, and with PIPE the next step's 2 */
__host__ __device__ constexpr int ring_of(bool pipe) { return pipe ? 6 : 4; }
constexpr int WBYTES = TAPS * 512;           /* [tap][k half][co 16][4] */
constexpr int XCH = 4 * 4 * 2 * 2 * 16 * 4; /* fold: each warp's first two rows, tw 1 and 2 */
__host__ __device__ constexpr int smem_of(bool pipe) { return 4 * ring_of(pipe) * ROWB + WBYTES + XCH; }

__device__ __forceinline__ float tf32r(float v)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return __uint_as_float(r);
}

__device__ __forceinline__ uint64_t desc(uint32_t saddr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((saddr & 0x3ffff) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

__device__ __forceinline__ void mma_ss(float (&d)[8], uint64_t a, uint64_t b, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(a), "l"(b), "r"(acc));
}

/* m64n48k8: the (tw, channel) fold's shape, N = 3 x 16 (PART 3 timing). */
__device__ __forceinline__ void mma_ss48(float (&d)[24], uint64_t a, uint64_t b, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n48k8.f32.tf32.tf32 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
                 "%21, %22, %23}, %24, %25, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23])
                 : "l"(a), "l"(b), "r"(acc));
}

__device__ __forceinline__ void mma_rs(float (&d)[8], const uint32_t (&a)[4], uint64_t b, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
}

/* Stage x rows (d0 + dl, h) for dl = 0..3 and h in [h0, h0 + nh) into their ring slots. */
template <int RING>
__device__ __forceinline__ void stage_rows(unsigned char *rows, const float *__restrict__ x, int b, int d0, int h0,
                                           int nh)
{
    const int items = 4 * nh * 32; /* (dl, h, channel half, 4 positions) */
    for (int it = threadIdx.x; it < items; it += 128) {
        const int w4 = it & 15, cg = (it >> 4) & 1, row = it >> 5, dl = row % 4, h = h0 + row / 4;
        float4 v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
            v[j] = __ldg(reinterpret_cast<const float4 *>(
                x + ((((int64_t)b * CIN + 4 * cg + j) * D + d0 + dl) * H + h) * W + 4 * w4));
        unsigned char *dst = rows + (dl * RING + h % RING) * ROWB + cg * PLANE + 4 * w4 * 16;
        const float4 o0 = make_float4(tf32r(v[0].x), tf32r(v[1].x), tf32r(v[2].x), tf32r(v[3].x));
        const float4 o1 = make_float4(tf32r(v[0].y), tf32r(v[1].y), tf32r(v[2].y), tf32r(v[3].y));
        const float4 o2 = make_float4(tf32r(v[0].z), tf32r(v[1].z), tf32r(v[2].z), tf32r(v[3].z));
        const float4 o3 = make_float4(tf32r(v[0].w), tf32r(v[1].w), tf32r(v[2].w), tf32r(v[3].w));
        reinterpret_cast<float4 *>(dst)[0] = o0;
        reinterpret_cast<float4 *>(dst)[1] = o1;
        reinterpret_cast<float4 *>(dst)[2] = o2;
        reinterpret_cast<float4 *>(dst)[3] = o3;
    }
}

/* The tw fold's epilogue: y[m] = P0[m] + P1[m + 1] + P2[m + 2] per conv row q, from the
 * m64n48 fragments (column block j = 2 tw + (co >= 8)) into acc's m64n16 layout. D fragment:
 * register 4j + e is row m0 + 8 (e >> 1), column 8j + 2 (lane % 4) + (e & 1). Rows m + 1 and
 * m + 2 come from the lanes 4 and 8 on; past a warp's 16 rows, from the next warp's first two
 * rows, published in xch (1 KB a warp). Contains a __syncthreads. */
template <int Q0 = 0, int NQ = 4>
__device__ __forceinline__ void fold_shift_add(const float (&acc48)[4][24], float (&acc)[4][8], float *xch, int warp,
                                               int lane)
{
    const int r4 = lane >> 2, c4 = lane & 3;
    if (r4 < 2)
#pragma unroll
        for (int q = Q0; q < Q0 + NQ; ++q)
#pragma unroll
            for (int tw = 1; tw < 3; ++tw)
#pragma unroll
                for (int jj = 0; jj < 2; ++jj)
#pragma unroll
                    for (int ec = 0; ec < 2; ++ec)
                        xch[((warp * 4 + q) * 2 + tw - 1) * 32 + r4 * 16 + 8 * jj + 2 * c4 + ec] =
                            acc48[q][4 * (2 * tw + jj) + ec];
    __syncthreads();
    const float *nx = warp < 3 ? xch + (warp + 1) * 4 * 2 * 32 : nullptr;
#pragma unroll
    for (int q = Q0; q < Q0 + NQ; ++q)
#pragma unroll
        for (int jj = 0; jj < 2; ++jj)
#pragma unroll
            for (int ec = 0; ec < 2; ++ec) {
                const int co = 8 * jj + 2 * c4 + ec;
                const float a1 = __shfl_sync(0xffffffffu, acc48[q][4 * (2 + jj) + ec], (lane + 4) & 31);
                const float b1 = __shfl_sync(0xffffffffu, acc48[q][4 * (2 + jj) + 2 + ec], (lane + 4) & 31);
                const float a2 = __shfl_sync(0xffffffffu, acc48[q][4 * (4 + jj) + ec], (lane + 8) & 31);
                const float b2 = __shfl_sync(0xffffffffu, acc48[q][4 * (4 + jj) + 2 + ec], (lane + 8) & 31);
                const float n1 = nx ? nx[(q * 2 + 0) * 32 + co] : 0.f;
                const float n2 = nx ? nx[(q * 2 + 1) * 32 + (r4 >= 6 ? r4 - 6 : 0) * 16 + co] : 0.f;
                const float top1 = r4 < 7 ? a1 : b1, top2 = r4 < 6 ? a2 : b2;
                const float bot1 = r4 < 7 ? b1 : n1, bot2 = r4 < 6 ? b2 : n2;
                acc[q][4 * jj + ec] = (acc48[q][4 * jj + ec] + top1) + top2;
                acc[q][4 * jj + 2 + ec] = (acc48[q][4 * jj + 2 + ec] + bot1) + bot2;
            }
}

/* The pooling epilogue of one step: max over the 2x2 (d, h) conv rows, then the w pair (rows
 * m, m + 1: lanes 4 apart), each valid window's max into the thread's channel sums. */
__device__ __forceinline__ void pool_step(const float (&acc)[4][8], float (&sum)[4], int warp, int lane)
{
    const int m0 = 16 * warp + (lane >> 2);
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        float v = fmaxf(fmaxf(acc[0][r], acc[1][r]), fmaxf(acc[2][r], acc[3][r]));
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
        const int m = (r & 2) ? m0 + 8 : m0;
        if (((lane >> 2) & 1) == 0 && m / 2 < PW)
            sum[(r >> 2) * 2 + (r & 1)] += v;
    }
}

/* The block's channel sums into partial[block][16]: lanes with the same lane % 4, then the
 * four warps in order (red: 64 floats of shared memory). */
__device__ __forceinline__ void write_partial(float (&sum)[4], float *red, float *partial, int warp, int lane)
{
#pragma unroll
    for (int i = 0; i < 4; ++i)
        for (int o = 4; o < 32; o <<= 1)
            sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], o);
    __syncthreads();
    if (lane < 4)
        for (int i = 0; i < 4; ++i)
            red[warp * 16 + (i >> 1) * 8 + 2 * lane + (i & 1)] = sum[i];
    __syncthreads();
    if (threadIdx.x < COUT)
        partial[(int64_t)blockIdx.x * COUT + threadIdx.x] =
            (red[threadIdx.x] + red[16 + threadIdx.x]) + (red[32 + threadIdx.x] + red[48 + threadIdx.x]);
}

/* A register that an in-flight wgmma reads or writes: pinned here so the compiler neither
 * reuses it nor moves its reads across the wait (the asm operands of wgmma look finished to
 * the compiler as soon as the instruction is issued). */
__device__ __forceinline__ void fence_reg(uint32_t &r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void fence_reg(float &r) { asm volatile("" : "+f"(r)::"memory"); }

/* m64n48k8 with A from registers (the fold, x fragments loaded from global memory). */
__device__ __forceinline__ void mma_rs48(float (&d)[24], const uint32_t (&a)[4], uint64_t b, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %29, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n48k8.f32.tf32.tf32 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
                 "%21, %22, %23}, {%24, %25, %26, %27}, %28, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
}

/* The fold with A straight from global memory into registers: no staging of x in shared memory
 * at all (only the weights are there). Thread (warp, lane) loads, for each x row, x[c4][m0],
 * x[c4][m0 + 8], x[c4 + 4][m0], x[c4 + 4][m0 + 8] (m0 = 16 warp + lane / 4, c4 = lane % 4):
 * the wgmma A fragment, TF32-rounded. A step's 16 rows (4 d x 4 h) stay in registers; the
 * next step's 2 new h rows are loaded while this step's wgmmas run, and the two shared rows
 * slide. */
/* SPLIT: conv rows q 0-1 and 2-3 in two commit groups; the first pair's shift-add runs while the
 * second pair's wgmmas do. */
/* MMA_ONLY (timing only, wrong sums): the first step's rows for every step, no epilogue. */
template <bool OVERLAP, bool SPLIT = false, bool MMA_ONLY = false>
__global__ void __launch_bounds__(128) wgmma_fold_reg_kernel(const float *__restrict__ x, const float *__restrict__ w,
                                                             float *__restrict__ partial)
{
    extern __shared__ __align__(128) unsigned char smem[];
    float *wsm = reinterpret_cast<float *>(smem);
    float *xch = wsm + WBYTES / 4;
    const int b = blockIdx.x / PD, pd = blockIdx.x % PD, d0 = 2 * pd;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    for (int i = tid; i < COUT * CIN * TAPS; i += 128) {
        const int co = i / (CIN * TAPS), ci = (i / TAPS) % CIN, tap = i % TAPS;
        wsm[(tap / 3) * 384 + (ci >> 2) * 192 + ((tap % 3) * 16 + co) * 4 + (ci & 3)] = tf32r(w[i]);
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const uint32_t w_s = (uint32_t)__cvta_generic_to_shared(wsm);
    const int m0 = 16 * warp + (lane >> 2), c4 = lane & 3;
    const float *xb = x + (((int64_t)b * CIN + c4) * D + d0) * H * W + m0;
    constexpr int64_t CS = (int64_t)4 * D * H * W; /* channel c4 + 4 */
    auto load_row = [&](uint32_t (&a)[4], int dl, int h) {
        const float *p = xb + ((int64_t)dl * H + h) * W;
        a[0] = __float_as_uint(tf32r(__ldg(p)));
        a[1] = __float_as_uint(tf32r(__ldg(p + 8)));
        a[2] = __float_as_uint(tf32r(__ldg(p + CS)));
        a[3] = __float_as_uint(tf32r(__ldg(p + CS + 8)));
    };
    uint32_t cur[4][4][4], nxt[4][2][4];
#pragma unroll
    for (int dl = 0; dl < 4; ++dl)
#pragma unroll
        for (int hl = 0; hl < 4; ++hl)
            load_row(cur[dl][hl], dl, hl);
    float sum[4] = {0.f, 0.f, 0.f, 0.f};
    for (int ph = 0; ph < PH; ++ph) {
        float acc48[4][24];
        wg_fence();
#pragma unroll
        for (int half = 0; half < 2; ++half) {
#pragma unroll
            for (int dl = 0; dl < 4; ++dl)
#pragma unroll
                for (int hl = 0; hl < 4; ++hl)
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        const int td = dl - (q >> 1), th = hl - (q & 1);
                        if (td < 0 || td > 2 || th < 0 || th > 2 || (SPLIT && (q >> 1) != half))
                            continue;
                        if (!SPLIT && half == 1)
                            continue;
                        mma_rs48(acc48[q], cur[dl][hl], desc(w_s + (td * 3 + th) * 1536, 768, 128),
                                 !(td == 0 && th == 0));
                    }
            if (SPLIT || half == 0)
                wg_commit();
        }
        /* Pinning (fence_reg) keeps the compiler from reusing or reading these registers
         * while the wgmmas still read or write them. */
        auto pin_rows = [&] {
#pragma unroll
            for (int dl = 0; dl < 4; ++dl)
#pragma unroll
                for (int hl = 0; hl < 4; ++hl)
#pragma unroll
                    for (int k = 0; k < 4; ++k)
                        fence_reg(cur[dl][hl][k]);
        };
        auto pin_acc = [&](int q0, int q1) {
#pragma unroll
            for (int q = 0; q < 4; ++q)
                if (q >= q0 && q < q1)
#pragma unroll
                    for (int r = 0; r < 24; ++r)
                        fence_reg(acc48[q][r]);
        };
        auto load_next = [&] {
            if (ph + 1 < PH)
#pragma unroll
                for (int dl = 0; dl < 4; ++dl)
#pragma unroll
                    for (int j = 0; j < 2; ++j)
                        load_row(nxt[dl][j], dl, 2 * ph + 4 + j);
        };
        if (MMA_ONLY) {
            wg_wait0();
            pin_rows();
            pin_acc(0, 4);
#pragma unroll
            for (int q = 0; q < 4; ++q)
#pragma unroll
                for (int r = 0; r < 24; ++r)
                    sum[r & 3] += acc48[q][r];
            continue;
        }
        if (OVERLAP)
            load_next();
        float acc[4][8];
        if (SPLIT) {
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
            pin_acc(0, 2);
            fold_shift_add<0, 2>(acc48, acc, xch, warp, lane);
        }
        wg_wait0();
        pin_rows();
        pin_acc(SPLIT ? 2 : 0, 4);
        if (!OVERLAP)
            load_next();
        if (SPLIT)
            fold_shift_add<2, 2>(acc48, acc, xch, warp, lane);
        else
            fold_shift_add(acc48, acc, xch, warp, lane);
        pool_step(acc, sum, warp, lane);
        __syncthreads(); /* xch is read before the next step writes it */
#pragma unroll
        for (int dl = 0; dl < 4; ++dl)
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                cur[dl][0][k] = cur[dl][2][k];
                cur[dl][1][k] = cur[dl][3][k];
                cur[dl][2][k] = nxt[dl][0][k];
                cur[dl][3][k] = nxt[dl][1][k];
            }
    }
    write_partial(sum, xch, partial, warp, lane);
}

/* PIPE: the next step's two new rows are staged while this step's wgmmas run (RING slots).
 * PART (timing only, wrong results): 1 stages only the first step's rows (the MMAs and the
 * epilogue alone), 2 skips the wgmmas (the staging and the epilogue alone), 3 is 1 with the
 * (tw, channel) fold's wgmmas instead: 9 m64n48k8 a conv row (A unshifted, N = tw x 16
 * channels), the shared-memory bytes of the fold without its shift-add epilogue. PART 4 is
 * that fold done right: y[m] = P0[m] + P1[m + 1] + P2[m + 2], rows m + 1 and m + 2 from the
 * lanes 4 and 8 on (shuffles) or, past a warp's 16 rows, from the next warp through shared
 * memory. */
template <bool A_REG, bool PIPE, int PART = 0>
__global__ void __launch_bounds__(128) wgmma_conv_kernel(const float *__restrict__ x, const float *__restrict__ w,
                                                        float *__restrict__ partial)
{
    constexpr int RING = ring_of(PIPE), NROWS = 4 * RING;
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char *rows = smem;
    float *wsm = reinterpret_cast<float *>(smem + NROWS * ROWB);
    const int b = blockIdx.x / PD, pd = blockIdx.x % PD, d0 = 2 * pd;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    float *xch = wsm + WBYTES / 4;
    for (int i = tid; i < COUT * CIN * TAPS; i += 128) {
        const int co = i / (CIN * TAPS), ci = (i / TAPS) % CIN, tap = i % TAPS;
        if (PART >= 3) /* [td th][k half][tw x 16 + co][4] */
            wsm[(tap / 3) * 384 + (ci >> 2) * 192 + ((tap % 3) * 16 + co) * 4 + (ci & 3)] = tf32r(w[i]);
        else
            wsm[tap * 128 + (ci >> 2) * 64 + co * 4 + (ci & 3)] = tf32r(w[i]);
    }
    for (int i = tid; i < NROWS * 2 * (WPAD - W); i += 128) { /* the padding past w = 63 stays zero */
        const int r = i / (2 * (WPAD - W)), rem = i % (2 * (WPAD - W));
        *reinterpret_cast<float4 *>(rows + r * ROWB + (rem / (WPAD - W)) * PLANE + (W + rem % (WPAD - W)) * 16) =
            make_float4(0.f, 0.f, 0.f, 0.f);
    }
    const uint32_t rows_s = (uint32_t)__cvta_generic_to_shared(rows);
    const uint32_t w_s = (uint32_t)__cvta_generic_to_shared(wsm);

    float sum[4] = {0.f, 0.f, 0.f, 0.f}; /* channels 2(t%4) + {0, 1} + 8j, j = 0, 1 */
    if (PIPE) { /* (PART 1 and 3 run without PIPE) */
        stage_rows<RING>(rows, x, b, d0, 0, 4);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    for (int ph = 0; ph < PH; ++ph) {
        __syncthreads(); /* the previous step's wgmmas are complete (waited) in every warp */
        if (!PIPE && ((PART != 1 && PART != 3) || ph == 0)) { /* PART 4 stages every step */
            if (ph == 0)
                stage_rows<RING>(rows, x, b, d0, 0, 4);
            else
                stage_rows<RING>(rows, x, b, d0, 2 * ph + 2, 2);
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncthreads();
        }

        float acc[4][8];
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
            for (int r = 0; r < 8; ++r)
                acc[q][r] = 0.f;
        wg_fence();
        if constexpr (PART == 2) {
        } else if constexpr (PART == 3 || PART == 4) {
            /* The fold: 9 m64n48k8 a conv row from the unshifted staged x rows. */
            float acc48[4][24];
#pragma unroll
            for (int tt = 0; tt < 9; ++tt) {
                const int td = tt / 3, th = tt % 3;
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const int dd = q >> 1, hh = q & 1, h = 2 * ph + hh + th;
                    const uint32_t a = rows_s + ((dd + td) * RING + h % RING) * ROWB;
                    mma_ss48(acc48[q], desc(a, PLANE, 128), desc(w_s + tt * 1536, 768, 128), tt > 0);
                }
            }
            wg_commit();
            if (PART == 3) { /* timing: no shift-add */
                wg_wait0();
#pragma unroll
                for (int q = 0; q < 4; ++q)
#pragma unroll
                    for (int r = 0; r < 8; ++r)
                        acc[q][r] = acc48[q][r] + acc48[q][r + 8] + acc48[q][r + 16];
            } else {
                if (PIPE && ph + 1 < PH) { /* the next step's rows while the wgmmas run */
                    stage_rows<RING>(rows, x, b, d0, 2 * ph + 4, 2);
                    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                }
                wg_wait0();
                fold_shift_add(acc48, acc, xch, warp, lane);
            }
        } else if constexpr (!A_REG) {
            /* Tap outer, conv row inner: consecutive wgmmas write different accumulators. */
#pragma unroll
            for (int tap = 0; tap < TAPS; ++tap) {
                const int td = tap / 9, th = (tap / 3) % 3, tw = tap % 3;
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const int dd = q >> 1, hh = q & 1, h = 2 * ph + hh + th;
                    const uint32_t a = rows_s + ((dd + td) * RING + h % RING) * ROWB + tw * 16;
                    mma_ss(acc[q], desc(a, PLANE, 128), desc(w_s + tap * 512, 256, 128), tap > 0);
                }
            }
        } else {
            /* x row (dl, hl) shifted by tw feeds conv row (dd, hh) at tap (dl - dd, hl - hh, tw). */
            const int m0 = 16 * warp + (lane >> 2), k0 = lane & 3;
#pragma unroll 1
            for (int dl = 0; dl < 4; ++dl)
#pragma unroll
                for (int hl = 0; hl < 4; ++hl)
#pragma unroll
                    for (int tw = 0; tw < 3; ++tw) {
                        const unsigned char *rp = rows + (dl * RING + (2 * ph + hl) % RING) * ROWB + tw * 16;
                        uint32_t a[4];
                        a[0] = *reinterpret_cast<const uint32_t *>(rp + m0 * 16 + k0 * 4);
                        a[1] = *reinterpret_cast<const uint32_t *>(rp + (m0 + 8) * 16 + k0 * 4);
                        a[2] = *reinterpret_cast<const uint32_t *>(rp + PLANE + m0 * 16 + k0 * 4);
                        a[3] = *reinterpret_cast<const uint32_t *>(rp + PLANE + (m0 + 8) * 16 + k0 * 4);
#pragma unroll
                        for (int q = 0; q < 4; ++q) {
                            const int td = dl - (q >> 1), th = hl - (q & 1);
                            if (td < 0 || td > 2 || th < 0 || th > 2)
                                continue;
                            const int tap = (td * 3 + th) * 3 + tw;
                            mma_rs(acc[q], a, desc(w_s + tap * 512, 256, 128), !(td == 0 && th == 0 && tw == 0));
                        }
                    }
        }
        wg_commit();
        if (PIPE && PART != 4 && ph + 1 < PH) {
            stage_rows<RING>(rows, x, b, d0, 2 * ph + 4, 2);
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        }
        wg_wait0();

        pool_step(acc, sum, warp, lane);
    }
    write_partial(sum, reinterpret_cast<float *>(smem), partial, warp, lane);
}

/* Double-precision reference of the same quantity on the same TF32-rounded operands. */
__global__ void ref_kernel(const float *__restrict__ x, const float *__restrict__ w, double *__restrict__ partial)
{
    const int64_t n = (int64_t)B * COUT * PD * PH * PW;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int pw = i % PW, ph = (i / PW) % PH, pd = (i / (PW * PH)) % PD, c = (i / (PW * PH * PD)) % COUT,
                  b = i / ((int64_t)PW * PH * PD * COUT);
        double best = -INFINITY;
        for (int q = 0; q < 8; ++q) {
            const int od = 2 * pd + (q >> 2), oh = 2 * ph + ((q >> 1) & 1), ow = 2 * pw + (q & 1);
            double s = 0.0;
            for (int ci = 0; ci < CIN; ++ci)
                for (int t = 0; t < TAPS; ++t) {
                    const int td = t / 9, th = (t / 3) % 3, tw = t % 3;
                    const float xv = x[((((int64_t)b * CIN + ci) * D + od + td) * H + oh + th) * W + ow + tw];
                    s += (double)tf32r(xv) * (double)tf32r(w[(c * CIN + ci) * TAPS + t]);
                }
            best = fmax(best, s);
        }
        atomicAdd(&partial[((int64_t)b * PD + pd) * COUT + c], best);
    }
}

template <typename Launch> float time_launch(Launch launch, int iters)
{
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> t;
    for (int i = 0; i < iters + 3; ++i) {
        CK(cudaEventRecord(e0));
        launch();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaGetLastError());
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 3)
            t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

template <bool A_REG, bool PIPE, int PART = 0> float time_kernel(const float *dx, const float *dw, float *dp, int iters)
{
    constexpr int SMEM = smem_of(PIPE);
    CK(cudaFuncSetAttribute(wgmma_conv_kernel<A_REG, PIPE, PART>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            SMEM));
    return time_launch([&] { wgmma_conv_kernel<A_REG, PIPE, PART><<<B * PD, 128, SMEM>>>(dx, dw, dp); }, iters);
}

template <bool OVERLAP, bool SPLIT = false, bool MMA_ONLY = false>
float time_fold_reg(const float *dx, const float *dw, float *dp, int iters)
{
    constexpr int SMEM = WBYTES + XCH;
    CK(cudaFuncSetAttribute(wgmma_fold_reg_kernel<OVERLAP, SPLIT, MMA_ONLY>,
                            cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    return time_launch([&] { wgmma_fold_reg_kernel<OVERLAP, SPLIT, MMA_ONLY><<<B * PD, 128, SMEM>>>(dx, dw, dp); },
                       iters);
}

/* PART -1, -2: wgmma_fold_reg_kernel, the next rows' loads under the wgmmas or after them;
 * -3: with the two commit groups (SPLIT). */
template <bool A_REG, bool PIPE, int PART = 0> bool check(const float *dx, const float *dw, float *dp, const std::vector<double> &ref)
{
    CK(cudaMemset(dp, 0xff, (size_t)B * PD * COUT * sizeof(float))); /* poisoned: NaN */
    const float ms = PART == -1 ? time_fold_reg<true>(dx, dw, dp, 20) : PART == -2 ? time_fold_reg<false>(dx, dw, dp, 20) :
                     PART == -3 ? time_fold_reg<true, true>(dx, dw, dp, 20) : time_kernel<A_REG, PIPE, (PART < 0 ? 0 : PART)>(dx, dw, dp, 20);
    std::vector<float> got((size_t)B * PD * COUT);
    CK(cudaMemcpy(got.data(), dp, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, std::fabs((double)got[i] - ref[i]));
        scale = std::max(scale, std::fabs(ref[i]));
        if (!std::isfinite(got[i]))
            worst = INFINITY;
    }
    const double flops = 2.0 * B * COUT * CD * CH * CW * CIN * TAPS;
    const bool ok = worst <= 1e-5 * scale;
    printf("%s%s%s: median %.4f ms (%.1f TFLOP/s of the conv's useful FLOPs), max |err| %.3g of %.3g (%s)\n",
           A_REG ? "A from registers" : "A from smem descriptors", PIPE ? ", next rows staged under the MMAs" : "",
           PART == 4 ? ", tw folded into N (m64n48k8)" : PART == -1 ? ", tw fold, x fragments from global memory, loaded under the wgmmas"
           : PART == -2 ? ", tw fold, x fragments from global memory, loaded after the wgmmas"
           : PART == -3 ? ", tw fold, x fragments from global memory, two commit groups" : "", ms, flops / (ms * 1e-3) / 1e12, worst, scale,
           ok ? "ok" : "WRONG");
    return ok;
}
} // namespace

int main()
{
    const size_t nx = (size_t)B * CIN * D * H * W, nw = (size_t)COUT * CIN * TAPS;
    std::vector<float> hx(nx), hw(nw);
    uint64_t s = 88172645463325252ull;
    auto rnd = [&]() {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        return (double)(s >> 11) * (1.0 / 9007199254740992.0);
    };
    for (auto &v : hx)
        v = (float)rnd();
    for (auto &v : hw)
        v = (float)((2.0 * rnd() - 1.0) / std::sqrt(216.0));
    float *dx, *dw, *dp;
    double *dref;
    CK(cudaMalloc(&dx, nx * 4));
    CK(cudaMalloc(&dw, nw * 4));
    CK(cudaMalloc(&dp, (size_t)B * PD * COUT * 4));
    CK(cudaMalloc(&dref, (size_t)B * PD * COUT * 8));
    CK(cudaMemcpy(dx, hx.data(), nx * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, hw.data(), nw * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(dref, 0, (size_t)B * PD * COUT * 8));
    ref_kernel<<<4096, 256>>>(dx, dw, dref);
    CK(cudaDeviceSynchronize());
    std::vector<double> ref((size_t)B * PD * COUT);
    CK(cudaMemcpy(ref.data(), dref, ref.size() * 8, cudaMemcpyDeviceToHost));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, headline x %dx%dx%dx%dx%d -> %d channels, kernel 3, pool 2\n", prop.name, B, CIN, D, H, W, COUT);
    const bool ok = check<false, false>(dx, dw, dp, ref) & check<false, true>(dx, dw, dp, ref) &
                    check<true, false>(dx, dw, dp, ref) & check<true, true>(dx, dw, dp, ref) &
                    check<false, false, 4>(dx, dw, dp, ref) & check<false, true, 4>(dx, dw, dp, ref) &
                    check<true, false, -1>(dx, dw, dp, ref) & check<true, false, -2>(dx, dw, dp, ref) &
                    check<true, false, -3>(dx, dw, dp, ref);
    printf("parts of the first variant (timing only): MMAs + epilogue %.4f ms, staging + epilogue %.4f ms; "
           "the (tw, channel) fold's MMAs + epilogue %.4f ms; the register fold's wgmmas alone %.4f ms\n",
           time_kernel<false, false, 1>(dx, dw, dp, 20), time_kernel<false, false, 2>(dx, dw, dp, 20),
           time_kernel<false, false, 3>(dx, dw, dp, 20), time_fold_reg<false, false, true>(dx, dw, dp, 20));
    return ok ? 0 : 1;
}
