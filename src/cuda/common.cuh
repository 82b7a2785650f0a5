/*
 * Shared by every CUDA source of convpool: the error-check macros, the problem sizes as the
 * kernels see them (Shape), the per-device facts, and the device helpers every kernel family
 * uses (TF32 conversion, mma.sync, cp.async, NaN-propagating max/min, and how a pooling
 * window turns raw conv sums into a pooled value).
 *
 * The kernel families live one to a file next to this header; src/cuda/plan.cu decides which
 * one runs (see kernels.h for the interface each family answers).
 */
#ifndef CONVPOOL_CUDA_COMMON_CUH
#define CONVPOOL_CUDA_COMMON_CUH

#include "convpool.h"
#include "internal.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

/* The status of a failed CUDA call: CONVPOOL_ERR_UNSUPPORTED where the runtime finds no usable
 * device (none present, no driver, or one too old for this runtime), as convpool.h documents;
 * CONVPOOL_ERR_CUDA for any other failure. */
static inline convpool_status cp_cuda_status(cudaError_t e)
{
    switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorDevicesUnavailable:
        return CONVPOOL_ERR_UNSUPPORTED;
    default:
        return CONVPOOL_ERR_CUDA;
    }
}

/* One error-check family: each quotes the failing call. */
#define CP_CUDA_TRY(call)                                                                        \
    do {                                                                                         \
        cudaError_t cp_err_ = (call);                                                            \
        if (cp_err_ != cudaSuccess) {                                                            \
            (void)cudaGetLastError();                                                            \
            const convpool_status cp_cst_ = cp_cuda_status(cp_err_);                             \
            return convpool_fail(cp_cst_, "%s%s failed: %s (%s:%d)",                             \
                                 cp_cst_ == CONVPOOL_ERR_UNSUPPORTED ? "no usable CUDA device: " \
                                                                     : "",                       \
                                 #call, cudaGetErrorString(cp_err_), __FILE__, __LINE__);        \
        }                                                                                        \
    } while (0)

#define CP_CUDA_TRY_LAUNCH(kernel_name)                                                          \
    do {                                                                                         \
        cudaError_t cp_err_ = cudaGetLastError();                                                \
        if (cp_err_ != cudaSuccess)                                                              \
            return convpool_fail(CONVPOOL_ERR_CUDA, "launch of %s failed: %s (%s:%d)",           \
                                 kernel_name, cudaGetErrorString(cp_err_), __FILE__, __LINE__);  \
    } while (0)

/* Status check inside a launcher: returns the failure as it is. */
#define CP_TRY(expr)                                                                             \
    do {                                                                                         \
        const convpool_status cp_st_ = (expr);                                                   \
        if (cp_st_ != CONVPOOL_OK)                                                               \
            return cp_st_;                                                                       \
    } while (0)

namespace convpool_cuda {

/* Problem sizes for the device, all int64 so products never wrap. */
struct Shape {
    int64_t batch, cin, cout;
    int64_t in_d, in_h, in_w;
    int64_t k_d, k_h, k_w;
    int64_t pool_d, pool_h, pool_w;
    int64_t pooled_d, pooled_h, pooled_w;
    float divisor;
};

Shape make_shape(const convpool_problem &p);

static inline __host__ __device__ int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline __host__ __device__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline __host__ __device__ int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

/* Per-device facts, read once per device id (no synchronisation involved). */
struct DeviceInfo {
    int ok; /* 1: usable, 0: not */
    int cc_major, cc_minor, sms, smem_optin;
    /* The virtual architecture this build's code for the device was compiled for (90 for the
     * sm_90a SASS, 80 where the driver JIT-compiles the compute_80 PTX): griddep_wait exists
     * only in code compiled for 90 and up, so programmatic dependent launch needs it. */
    int code_arch;
    char why[160];
};
constexpr int MAX_DEVICES = 64;

/* The current device's facts; fails (with a message) when it cannot run these kernels. */
convpool_status device_info(DeviceInfo *info);

/* n / d and n % d for 0 <= n < 2^31 by a multiply-high; the magic is made on the host. */
struct FastDiv {
    uint32_t d, m, s;
};

inline FastDiv make_fastdiv(uint32_t d)
{
    FastDiv f;
    f.d = d;
    f.s = 0;
    while ((1u << f.s) < d)
        ++f.s;
    f.m = (uint32_t)((((uint64_t)1 << 32) * (((uint64_t)1 << f.s) - d)) / d + 1);
    return f;
}

__device__ __forceinline__ uint32_t fdiv(uint32_t n, const FastDiv &f) { return (__umulhi(n, f.m) + n) >> f.s; }

/* The current CUDA device's id, checked against MAX_DEVICES (the per-device caches' size). */
inline convpool_status current_device(int *devid)
{
    CP_CUDA_TRY(cudaGetDevice(devid));
    if (*devid < 0 || *devid >= MAX_DEVICES)
        return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "CUDA device id %d is beyond the %d supported", *devid,
                             MAX_DEVICES);
    return CONVPOOL_OK;
}

/* A routing switch from the environment (CONVPOOL_K3P2_SM90, CONVPOOL_GRADX_SM90): -1 unset or
 * empty (the plan decides), 0 for "0" (never), 1 for anything else (wherever it can run). */
inline int env_switch(const char *name)
{
    const char *e = getenv(name);
    if (!e || !*e)
        return -1;
    return strcmp(e, "0") == 0 ? 0 : 1;
}

/* A tuning constant from the environment (a decimal integer in lo .. hi), else dflt: for A/B
 * measurements of a cost model's constants on the device without a rebuild. */
inline int env_int(const char *name, int dflt, int lo, int hi)
{
    const char *e = getenv(name);
    if (!e || !*e)
        return dflt;
    char *end = nullptr;
    const long v = strtol(e, &end, 10);
    return *end == '\0' && v >= lo && v <= hi ? (int)v : dflt;
}

/* Programmatic dependent launch (cc 9.x). convpool's own kernel chains (the forward's gated
 * TF32 rerun and finish; grad_weight's gated rerun, gather, reduce and NaN fix-up; grad_x's
 * gated kernels) are launched with the programmatic-stream-serialization attribute, so each is
 * scheduled while the kernel ahead of it drains instead of after it has ended and the launch
 * gap has passed. A dependent kernel's blocks start as the primary's last blocks exit, or
 * earlier where the primary triggers (griddep_trigger: once every block of the primary has
 * triggered or exited): k3p2 and weight_sm90 trigger after their main loops, so the gated
 * kernel behind them is resident and waiting when they end (its blocks take the slots the
 * primary's last round leaves idle, and nothing else of the primary needs them: every block of
 * it has started by then); the tiled gather triggers at once. Every kernel launched this way opens
 * with griddep_wait(), which returns once the grid ahead of it has completed and its memory is
 * visible (and at once for a plain launch), so it reads and writes nothing early; the wait is
 * transitive along a chain, as each kernel ends after its own wait. Code compiled for an
 * architecture below sm_90 (the compute_80 PTX, JIT-compiled on a cc 9.x GPU by a build without
 * sm_90 code) has no such wait, so pdl_on is false there (DeviceInfo::code_arch). CONVPOOL_PDL=0 launches
 * them the plain way (H200, headline b128, bench_gpu --backward w: 0.305 -> 0.300 ms with it). */
__device__ __forceinline__ void griddep_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
/* Lets the kernels launched behind this one (programmatic dependent launch) start their blocks
 * once every block of this grid has called it or exited; they still wait, in griddep_wait, for
 * this grid to complete. A no-op without a dependent launch. */
__device__ __forceinline__ void griddep_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
inline bool pdl_on(const DeviceInfo &dev)
{
    return dev.cc_major >= 9 && dev.code_arch >= 90 && env_switch("CONVPOOL_PDL") != 0;
}
/* The attribute on a call's first big kernel (k3p2's float16 instance, weight_sm90's), behind
 * whatever the stream ran before: it opens with griddep_wait, so it reads nothing early after
 * any kernel, ours or not (a plain kernel ahead triggers as it ends; a memset or an event wait
 * ahead leaves the launch plain). It saves the launch gap where the kernel ahead ends, and
 * where that is one of ours that triggers (weight_reduce, the last of a backward), the next
 * step's forward is resident before it ends. CONVPOOL_PDL_FIRST=0 leaves these plain (A/B). */
inline bool pdl_first(const DeviceInfo &dev) { return pdl_on(dev) && env_switch("CONVPOOL_PDL_FIRST") != 0; }
/* kernel<<<grid, block, smem, st>>>(args), with the attribute where pdl. A driver or setting
 * that refuses the attribute (a launch-configuration error, which is not sticky) gets the plain
 * launch instead. */
template <typename... KArgs, typename... Args>
cudaError_t launch_dependent(bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                             Args... args)
{
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = pdl ? &attr : nullptr;
    cfg.numAttrs = pdl ? 1 : 0;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
    if (pdl && (e == cudaErrorNotSupported || e == cudaErrorInvalidValue)) {
        (void)cudaGetLastError(); /* clear the refused launch's error */
        cfg.attrs = nullptr;
        cfg.numAttrs = 0;
        e = cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
    }
    return e;
}

/* Resident blocks per SM of a kernel on the current device with `threads` threads and `smem`
 * bytes of dynamic shared memory, after raising its dynamic shared-memory limit; cached per
 * (kernel, smem, device) by the caller's cache. */
template <typename Kernel>
convpool_status blocks_per_sm(Kernel kernel, int threads, int smem, std::atomic<int> (&cache)[MAX_DEVICES],
                              int *per_sm)
{
    int devid = 0;
    CP_TRY(current_device(&devid));
    int n = cache[devid].load(std::memory_order_acquire);
    if (n == 0) {
        CP_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CP_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
        if (n < 1)
            return convpool_fail(CONVPOOL_ERR_UNSUPPORTED,
                                 "kernel does not fit on this GPU (%d bytes of shared memory)", smem);
        cache[devid].store(n, std::memory_order_release);
    }
    *per_sm = n;
    return CONVPOOL_OK;
}

/* Resident blocks per SM of kernel at smem bytes of dynamic shared memory (below the limit
 * blocks_per_sm raised), remembered per device for the last smem asked: the runtime's occupancy
 * query costs host time on every call, and a model calls with one shape. cache: (smem << 16) |
 * blocks, 0 = none. */
template <typename Kernel>
convpool_status blocks_per_sm_at(Kernel kernel, int threads, int64_t smem, std::atomic<int64_t> (&cache)[MAX_DEVICES],
                                 int *per_sm)
{
    int devid = 0;
    CP_TRY(current_device(&devid));
    const int64_t v = cache[devid].load(std::memory_order_acquire);
    if (v != 0 && (v >> 16) == smem) {
        *per_sm = (int)(v & 0xffff);
        return CONVPOOL_OK;
    }
    int n = 0;
    CP_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, (size_t)smem));
    if (n > 0 && n < 0xffff)
        cache[devid].store((smem << 16) | n, std::memory_order_release);
    *per_sm = n;
    return CONVPOOL_OK;
}

/* 16-byte rows: x is 16-byte aligned and every row starts on a 16-byte boundary. */
template <typename T> bool rows_aligned(const Shape &s, const T *x)
{
    return ((uintptr_t)x % 16 == 0) && (s.in_w % (16 / (int64_t)sizeof(T)) == 0);
}

/* ============================== device helpers ============================== */

/* Zeroes a register array (compile-time extents: the loops unroll, nothing spills). */
template <int A, int B> __device__ __forceinline__ void zero_regs(float (&a)[A][B])
{
#pragma unroll
    for (int i = 0; i < A; ++i)
#pragma unroll
        for (int j = 0; j < B; ++j)
            a[i][j] = 0.0f;
}
template <int A, int B, int C> __device__ __forceinline__ void zero_regs(float (&a)[A][B][C])
{
#pragma unroll
    for (int i = 0; i < A; ++i)
        zero_regs(a[i]);
}

/* Block tree reduction of one float per thread (THREADS a power of two, red[THREADS] in shared
 * memory); thread 0 stores the sum to *dst. Every thread calls it; red is free again after. */
template <int THREADS> __device__ __forceinline__ void block_sum_store(float v, float *red, float *dst)
{
    red[threadIdx.x] = v;
    __syncthreads();
#pragma unroll
    for (int off = THREADS / 2; off > 0; off >>= 1) {
        if ((int)threadIdx.x < off)
            red[threadIdx.x] += red[threadIdx.x + off];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        *dst = red[0];
    __syncthreads();
}

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

/* v << n with PTX's clamp: n past 31 (an unsigned n, so a "negative" one too) gives 0, where C's
 * shift would be undefined. */
__device__ __forceinline__ uint32_t shl_clamp(uint32_t v, uint32_t n)
{
    uint32_t r;
    asm("shl.b32 %0, %1, %2;" : "=r"(r) : "r"(v), "r"(n));
    return r;
}

/* Two floats as a float16 pair, lo in the low half (the lower K index of an MMA operand). */
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi)
{
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}

/* d += A(16x16, row) * B(16x8, col), float16 operands (pairs along K), float32 accumulate: a0 =
 * A[g][2t, 2t + 1], a1 = A[g + 8][2t, 2t + 1], a2 and a3 the same at K + 8; b0 = B[2t, 2t + 1][g],
 * b1 = B[2t + 8, 2t + 9][g]; d as mma_tf32's. */
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Whether x whose largest |x| (over a block's or a warp's share) is m leaves the range of the
 * float16-operand instances (weight_sm90's, k3p2's), whose TF32 instances then rerun the call:
 * past 65504 (float16's inf; an inf or NaN in x too) or, where any x is nonzero, all of it under
 * 2^-9 (float16's subnormals below 2^-14 would round away bits TF32 keeps; from 2^-9 up they
 * cost under 2^-16 of the largest |x|). */
__device__ __forceinline__ bool f16_x_out_of_range(float m) { return !(m <= 65504.0f) || (m > 0.0f && m < 0x1p-9f); }

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
/* Waits until at most N of this thread's newest commit groups are still in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait_group()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
/* float -> T, round to nearest even (what PyTorch's casts and 16-bit ops do). */
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

/* The forward's finish of sample b by one warp, Cout <= 32 (finish.cu's finish_warp_kernel, and
 * k3p2's gated TF32 rerun where it takes the finish on): lane c < cout adds its row of nparts
 * partials in part order (32 loads in flight, the last batch padded with +0.0, which leaves the
 * sum's bits alone), P = sum / windows, and out[b] = the shuffle tree of (P + bias) over the
 * lanes (finish_kernel's 128-thread tree where the other lanes hold +0.0). bc: the lane's bias
 * as float (0 where out is NULL or lane >= cout). Every lane of the warp calls it. The partials
 * are read through L2 (__ldcg): k3p2's rerun finishes in the grid that wrote them. */
constexpr int64_t FINISH_WARP_MAX_COUT = 32; /* finish_warp_sample's channels: a lane each */
template <typename OT>
__device__ __forceinline__ void finish_warp_sample(const float *__restrict__ partials, int64_t nparts, int64_t cout,
                                                   double windows, float bc, float *__restrict__ pooled,
                                                   OT *__restrict__ out, int64_t b)
{
    constexpr int BATCH = 32;
    const int lane = threadIdx.x & 31;
    double acc = 0.0;
    if (lane < cout) {
        const float *row = partials + (b * cout + lane) * nparts;
        double sum = 0.0;
        for (int64_t q = 0; q < nparts; q += BATCH) {
            float v[BATCH];
            if (q + BATCH <= nparts) { /* all loads of a batch in flight before its adds */
#pragma unroll
                for (int j = 0; j < BATCH; ++j)
                    v[j] = __ldcg(row + q + j);
            } else {
#pragma unroll
                for (int j = 0; j < BATCH; ++j)
                    v[j] = q + j < nparts ? __ldcg(row + q + j) : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < BATCH; ++j)
                sum += (double)v[j];
        }
        const float P = (float)(sum / windows);
        pooled[b * cout + lane] = P;
        if (out) {
            if constexpr (std::is_same<OT, float>::value)
                acc = (double)(P + bc);
            else
                acc = (double)to_float(from_float<OT>(to_float(from_float<OT>(P)) + bc));
        }
    }
    if (out) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            acc += __shfl_down_sync(0xffffffffu, acc, off);
        if (lane == 0)
            out[b] = from_float<OT>((float)acc);
    }
}

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

/* 1 / d where d = +-2^k has a normal reciprocal, else 0. For such d, a / d and a * (1 / d) are
 * the same real number, each rounded once to nearest, so the product is bit-identical to
 * float32 division (subnormal, overflowing, infinite and NaN quotients included) at one FMUL
 * instead of a division's ~10 instructions and slow-path branch. Divisors such as 2 and 1 are
 * the common case; the code rules below divide every element of every window. */
__device__ __forceinline__ float pow2_recip(float d)
{
    const uint32_t u = __float_as_uint(d), e = (u >> 23) & 0xffu;
    return (u & 0x7fffffu) == 0 && e >= 1 && e <= 253 ? __uint_as_float((u & 0x80000000u) | ((254u - e) << 23)) : 0.0f;
}

/* a / d as float32 division rounds it; r = pow2_recip(d) (uniform, so the branch does not
 * diverge). */
__device__ __forceinline__ float div_rn(float a, float d, float r) { return r != 0.0f ? a * r : __fdiv_rn(a, d); }

/* The near-tie bound of a strict (3xTF32) training forward's codes, in units of the conv value
 * v: where a window's best v beats its runner-up by more (max for a positive divisor, min for a
 * negative one), the correctly rounded FP32 conv orders q = (v + bias) / divisor the same way
 * and strictly, so the pick is that conv's; the others are recomputed in double
 * (recheck_codes). A q-space bound is this over |divisor|. v is tile.cuh's STRICT conv_step or
 * the general kernel's. Its error E against the exact sum, with L = l1 max|x| (l1 =
 * ||w[c]||_1) bounding every partial sum: per product, the dropped w_small * x_small and the
 * TF32 rounding of each small half (2^-22 |w x| each; 4 with slack for the big halves'
 * 1 + 2^-11); a tap row's row_mmas MMAs accumulate in the tensor core, which truncates (2 x
 * 2^-22 of the row's magnitude a step); joins round-to-nearest FADDs bring the rows, the small
 * terms and the bias into acc (2^-24 each). The bound is 2 E plus the roundings of v, v + bias
 * and the quotient on both sides, which could otherwise merge two values into a tie
 * (2^-24 L + 2^-22 (L + |bias|), times 2, and the subnormal spacings), with slack for this float
 * evaluation. inf or NaN anywhere (x, the weights, the bias) gives an inf or NaN bound: every
 * window is then rechecked. So does a channel whose q could pass float's range (|v + bias| up to
 * L + |bias| against 2^126 |divisor|): there distinct v round to one inf, and PyTorch's rule
 * takes the first of them, not the greatest v. Callers flag every window in the literal mode
 * (divisor 0 or not finite, bias not finite), where q no longer follows v. */
__device__ __forceinline__ float strict_tie_tol(float l1, float xmax, float bias, float divisor, float row_mmas,
                                               float joins)
{
    const float L = l1 * xmax;
    if (!(L + fabsf(bias) < 0x1p126f * fabsf(divisor)))
        return __int_as_float(0x7f800000);
    const float ev = ((4.0f + 2.0f * row_mmas) * 0x1p-22f + (joins + 2.0f) * 0x1p-24f) * L;
    /* + subnormal spacing: of v (2^-126 covers it) and of q (2^-148 |divisor| in v units) */
    return 2.125f * (ev + 0x1p-24f * L + 0x1p-22f * (L + fabsf(bias))) + 0x1p-126f + 0x1p-148f * fabsf(divisor);
}

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

/* SCALED (the float16 tile, whose conv values are v * scale with scale a power of two: its
 * weight scale undone): scale > 0 keeps the max's (min's) place, and one FFMA rounds v * scale +
 * bias as the unscaled FADD rounds v + bias. */
template <bool SCALED = false> __device__ __forceinline__ float window_elem(float v, const ChanMode &m, float scale = 1.0f)
{
    if (m.mode != kLiteral)
        return v;
    return (SCALED ? fmaf(v, scale, m.bias) : v + m.bias) / m.div;
}
__device__ __forceinline__ float window_combine(float acc, float y, const ChanMode &m)
{
    return m.mode == kMinRaw ? nan_min(acc, y) : nan_max(acc, y);
}
template <bool SCALED = false>
__device__ __forceinline__ float window_finish(float acc, const ChanMode &m, float scale = 1.0f)
{
    if (m.mode == kLiteral)
        return acc;
    return (SCALED ? fmaf(acc, scale, m.bias) : acc + m.bias) / m.div;
}

/* N elements of a window reduced by the channel's mode, before window_finish (a window split
 * across threads reduces its parts with this, then joins them with window_combine). The mode
 * depends on the divisor (uniform) and on a channel's bias being finite (uniform but for odd
 * inputs), so these branches do not diverge in practice. */
template <int N, bool SCALED = false>
__device__ __forceinline__ float window_reduce(const float (&v)[N], const ChanMode &m, float scale = 1.0f)
{
    float acc;
    if (m.mode == kMaxRaw) {
        acc = v[0];
#pragma unroll
        for (int i = 1; i < N; ++i)
            acc = nan_max(acc, v[i]);
    } else if (m.mode == kMinRaw) {
        acc = v[0];
#pragma unroll
        for (int i = 1; i < N; ++i)
            acc = nan_min(acc, v[i]);
    } else {
        acc = window_elem<SCALED>(v[0], m, scale);
#pragma unroll
        for (int i = 1; i < N; ++i)
            acc = nan_max(acc, window_elem<SCALED>(v[i], m, scale));
    }
    return acc;
}
template <bool SCALED = false>
__device__ __forceinline__ float window8(const float (&v)[8], const ChanMode &m, float scale = 1.0f)
{
    /* SCALED: the literal mode first, so that the raw modes' reduction compiles to selects
     * behind one branch (reducing through window_reduce<8, true> for every mode put ~30 more
     * branches and convergence barriers into k3p2's F16 inference kernel, sm_90a SASS). */
    if (SCALED && m.mode == kLiteral)
        return window_reduce<8, SCALED>(v, m, scale);
    return window_finish<SCALED>(window_reduce(v, m), m, scale);
}

__device__ __forceinline__ int64_t x_index(const Shape &s, int64_t b, int64_t c, int64_t d, int64_t h, int64_t w)
{
    return (((b * s.cin + c) * s.in_d + d) * s.in_h + h) * s.in_w + w;
}

} // namespace convpool_cuda

#endif /* CONVPOOL_CUDA_COMMON_CUH */
