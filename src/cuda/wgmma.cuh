/*
 * wgmma.cuh: Hopper warpgroup MMA helpers shared by the sm_90a kernels (k3p2_sm90.cu's forward,
 * backward.cu's grad_x_sm90_kernel): the shared-memory descriptor, fence / commit / wait, the
 * register pins an in-flight wgmma needs, wgmma.m64n48k8 / m64n72k8 TF32 and the tw fold's
 * shift-add.
 * Only where nvcc compiles for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL).
 */
#ifndef CONVPOOL_CUDA_WGMMA_CUH
#define CONVPOOL_CUDA_WGMMA_CUH

#include <stdint.h>

namespace convpool_cuda {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace {

/* A no-swizzle shared-memory matrix descriptor: start, leading and stride byte offsets. */
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((saddr & 0x3ffff) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
/* Wait until at most N committed groups are still in flight. */
template <int N> __device__ __forceinline__ void wg_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* A register an in-flight wgmma reads or writes: the asm operands of wgmma look consumed as soon
 * as it issues, so without this the compiler reuses A registers for the next loads, or reads
 * accumulators, before wgmma.wait_group (wrong sums, seen on the device). */
__device__ __forceinline__ void pin(uint32_t &r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void pin(float &r) { asm volatile("" : "+f"(r)::"memory"); }
template <typename T, int N> __device__ __forceinline__ void pin(T (&a)[N])
{
#pragma unroll
    for (int i = 0; i < N; ++i)
        pin(a[i]);
}

/* d (+)= A (64 x 8, registers) * B (8 x 48, shared memory); acc = 0 starts from zero. */
__device__ __forceinline__ void wgmma_m64n48k8(float (&d)[24], const uint32_t (&a)[4], uint64_t b, int acc)
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

/* d (+)= A (64 x 16 float16, registers) * B (16 x 48 float16, shared memory, K-major); acc = 0
 * starts from zero. Twice the MACs of m64n48k8 TF32 in the same tensor time (grad_x_sm90's F16
 * instance). A register holds two K-adjacent elements, the lower K in the low half. */
__device__ __forceinline__ void wgmma_m64n48k16_f16(float (&d)[24], const uint32_t (&a)[4], uint64_t b, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %29, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n48k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
                 "%21, %22, %23}, {%24, %25, %26, %27}, %28, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
}

/* d (+)= A (64 x 8, registers) * B (8 x 72, shared memory); acc = 0 starts from zero. grad_weight's
 * step: the masks times the 9 x rows of a conv row (backward.cu's weight_sm90_kernel). */
__device__ __forceinline__ void wgmma_m64n72k8(float (&d)[36], const uint32_t (&a)[4], uint64_t b, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %41, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n72k8.f32.tf32.tf32 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35}, "
                 "{%36, %37, %38, %39}, %40, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
                   "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
                   "+f"(d[35])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
}

/* d (+)= A (64 x 16 float16, registers) * B (16 x 24 float16, shared memory, K-major); acc = 0
 * starts from zero. weight_sm90's float16 instance. */
__device__ __forceinline__ void wgmma_m64n24k16_f16(float (&d)[12], const uint32_t (&a)[4], uint64_t b, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %17, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n24k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11}, "
                 "{%12, %13, %14, %15}, %16, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
}

/* d (+)= A (64 x 8, registers) * B (8 x 24, shared memory); acc = 0 starts from zero. */
__device__ __forceinline__ void wgmma_m64n24k8(float (&d)[12], const uint32_t (&a)[4], uint64_t b, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %17, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n24k8.f32.tf32.tf32 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11}, "
                 "{%12, %13, %14, %15}, %16, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
}

/* The fold's shift-add: y[q][.] = P0[m] + P1[m + 1] + P2[m + 2] for conv row q, from the
 * m64n(24 JJ) fragments (JJ column blocks of 8 a tw: column block j = JJ tw + jj, jj = co >= 8
 * where JJ is 2) into an m64n(8 JJ) layout (y[q][4 jj + .]; JJ 1 leaves y[q][4 ..] unset).
 * Fragment register 4j + e is row m0 + 8 (e >> 1), column 8j + 2 (lane % 4) + (e & 1). The two
 * rows past a warp's 16 come from the next warp's first two, published in xch; the last warp's
 * rows 62 and 63 are past every tile's conv columns and get zeros. Contains a barrier. */
template <int JJ = 2>
__device__ __forceinline__ void fold_shift_add(const float (&p)[4][12 * JJ], float (&y)[4][8], float *xch, int warp,
                                               int lane)
{
    const int r4 = lane >> 2, c4 = lane & 3;
    if (r4 < 2)
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
            for (int tw = 1; tw < 3; ++tw)
#pragma unroll
                for (int jj = 0; jj < JJ; ++jj)
#pragma unroll
                    for (int ec = 0; ec < 2; ++ec)
                        xch[((warp * 4 + q) * 2 + tw - 1) * 32 + r4 * 16 + 8 * jj + 2 * c4 + ec] =
                            p[q][4 * (JJ * tw + jj) + ec];
    __syncthreads();
    const float *nx = warp < 3 ? xch + (warp + 1) * 4 * 2 * 32 : nullptr;
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int jj = 0; jj < JJ; ++jj)
#pragma unroll
            for (int ec = 0; ec < 2; ++ec) {
                const int co = 8 * jj + 2 * c4 + ec;
                const float a1 = __shfl_sync(0xffffffffu, p[q][4 * (JJ + jj) + ec], (lane + 4) & 31);
                const float b1 = __shfl_sync(0xffffffffu, p[q][4 * (JJ + jj) + 2 + ec], (lane + 4) & 31);
                const float a2 = __shfl_sync(0xffffffffu, p[q][4 * (2 * JJ + jj) + ec], (lane + 8) & 31);
                const float b2 = __shfl_sync(0xffffffffu, p[q][4 * (2 * JJ + jj) + 2 + ec], (lane + 8) & 31);
                const float n1 = nx ? nx[(q * 2 + 0) * 32 + co] : 0.f;
                const float n2 = nx ? nx[(q * 2 + 1) * 32 + (r4 >= 6 ? r4 - 6 : 0) * 16 + co] : 0.f;
                const float top1 = r4 < 7 ? a1 : b1, top2 = r4 < 6 ? a2 : b2;
                const float bot1 = r4 < 7 ? b1 : n1, bot2 = r4 < 6 ? b2 : n2;
                y[q][4 * jj + ec] = (p[q][4 * jj + ec] + top1) + top2;
                y[q][4 * jj + 2 + ec] = (p[q][4 * jj + 2 + ec] + bot1) + bot2;
            }
}

} // namespace
#endif
} // namespace convpool_cuda

#endif /* CONVPOOL_CUDA_WGMMA_CUH */
