/*
 * plan: the one place that decides which CUDA kernel family runs a problem, and the public CUDA
 * entry points that follow that decision.
 *
 * The families are asked in order of speed (k3p2, group, general, generic) whether they can
 * implement the problem on this device; the first that can is the plan. Each answers the same
 * three questions (kernels.h): can_implement, workspace, run. The plan also fixes the workspace
 * layout: [batch][cout][parts] float partial sums, 16 bytes of alignment slack, then the
 * family's scratch (packed weights).
 *
 * CONVPOOL_CUDA_KERNEL=k3p2|group|general|generic in the environment forces a family where it
 * can implement the problem (tests and benchmarks use it to reach every path).
 */
#include "kernels.h"
#include "tile.cuh" /* fp::tile_steps, fp::is_pool2: k3p2's step count and its codes' pool */

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

namespace convpool_cuda {

/* A kernel with no work: its attributes say whether the build holds code for the device. */
__global__ void probe_kernel() {}

namespace {

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
        const cudaError_t e = cudaFuncGetAttributes(&fa, probe_kernel);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            d.ok = 0;
            snprintf(d.why, sizeof d.why, "no kernel image for compute capability %d.%d: %s", d.cc_major,
                     d.cc_minor, cudaGetErrorString(e));
        } else {
            d.code_arch = fa.ptxVersion; /* every kernel file is built for the same architectures */
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

} // namespace

/* The current device's facts; fails (with a message) when it cannot run these kernels. */
convpool_status device_info(DeviceInfo *info)
{
    int dev = 0;
    CP_TRY(current_device(&dev));
    const cudaError_t e = read_device_info(dev, info);
    if (e != cudaSuccess)
        return convpool_fail(cp_cuda_status(e), "%s", info->why);
    if (!info->ok)
        return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "%s", info->why);
    return CONVPOOL_OK;
}

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

namespace {

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

/* Bytes of x padded per pass when W is not a whole 16-byte chunk (Plan::pad_w). */
constexpr int64_t PAD_CHUNK_BYTES = (int64_t)64 << 20;
/* A sample larger than this is not padded (its rows are staged element by element instead). */
constexpr int64_t PAD_MAX_SAMPLE_BYTES = (int64_t)512 << 20;

/* The device a plan is made for when no GPU is usable: an sm_90 part (H100/H200). */
DeviceInfo assumed_device()
{
    DeviceInfo d = {};
    d.ok = 0;
    d.cc_major = 9;
    d.cc_minor = 0;
    d.sms = 132;
    d.smem_optin = 227 * 1024;
    return d;
}

/* The family CONVPOOL_CUDA_KERNEL names, or -1. */
int forced_kernel()
{
    const char *e = getenv("CONVPOOL_CUDA_KERNEL");
    if (!e || !*e)
        return -1;
    for (int k = CONVPOOL_CUDA_KERNEL_K3P2; k <= CONVPOOL_CUDA_KERNEL_GENERIC; ++k)
        if (strcmp(e, convpool_cuda_kernel_name((convpool_cuda_kernel)k)) == 0)
            return k;
    return -1;
}

/* Appends printf-style text to buf (length n), truncating. */
void append(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void append(char *buf, size_t n, const char *fmt, ...)
{
    const size_t used = strlen(buf);
    if (used + 1 >= n)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, n - used, fmt, ap);
    va_end(ap);
}

bool can_implement(int k, const convpool_problem &p, convpool_dtype dt, const DeviceInfo &dev, char *why, size_t n)
{
    switch (k) {
    case CONVPOOL_CUDA_KERNEL_K3P2: return k3p2_can_implement(p, dt, dev, why, n);
    case CONVPOOL_CUDA_KERNEL_GROUP: return group_can_implement(p, dt, dev, why, n);
    case CONVPOOL_CUDA_KERNEL_GENERAL: return general_can_implement(p, dt, dev, why, n);
    default: return generic_can_implement(p, dt, dev, why, n);
    }
}

Workspace workspace_of(int k, const convpool_problem &p, bool strict, convpool_dtype dt, const DeviceInfo &dev)
{
    switch (k) {
    case CONVPOOL_CUDA_KERNEL_K3P2: return k3p2_workspace(p, strict, dt, dev);
    case CONVPOOL_CUDA_KERNEL_GROUP: return group_workspace(p, strict);
    case CONVPOOL_CUDA_KERNEL_GENERAL: return general_workspace(p, strict, dt, dev);
    default: return generic_workspace(p, strict);
    }
}

/* The plan for a validated problem; desc (may be NULL) gets the one-line explanation. */
convpool_status make_plan(const convpool_problem &p, bool strict, convpool_dtype dt, const DeviceInfo &dev,
                          bool assumed, Plan *plan, char *desc, size_t desc_n)
{
    char reasons[384] = "";
    const int forced = forced_kernel();
    int chosen = -1;
    for (int k = CONVPOOL_CUDA_KERNEL_K3P2; k <= CONVPOOL_CUDA_KERNEL_GENERIC && chosen < 0; ++k) {
        if (forced >= 0 && k != forced && k != CONVPOOL_CUDA_KERNEL_GENERIC)
            continue;
        char why[160] = "";
        if (can_implement(k, p, dt, dev, why, sizeof why))
            chosen = k;
        else
            append(reasons, sizeof reasons, "%s%s: %s", reasons[0] ? "; " : "",
                   convpool_cuda_kernel_name((convpool_cuda_kernel)k), why);
    }
    const Workspace ws = workspace_of(chosen, p, strict, dt, dev);
    const double partial = (double)p.batch * (double)p.out_channels * (double)ws.parts * 4.0;
    if (partial + 16.0 + (double)ws.scratch_bytes > 9.0e18)
        return convpool_fail(CONVPOOL_ERR_OVERFLOW, "workspace size overflows");
    plan->kernel = (convpool_cuda_kernel)chosen;
    plan->ws = ws;
    plan->partial_bytes = p.batch * p.out_channels * ws.parts * (int64_t)sizeof(float);
    plan->total_bytes = plan->partial_bytes + (ws.scratch_bytes > 0 ? 16 + ws.scratch_bytes : 0);
    /* The tensor-core families stage 16-byte chunks of x rows: rows that are not whole chunks
     * are padded into the workspace first (pad.cu), a chunk of samples at a time. */
    plan->pad_w = plan->pad_batch = plan->pad_offset = plan->pad_bytes = 0;
    const int64_t pad_w = padded_width(p.in_w, dt);
    /* (k3p2_sm90 loads its A fragments element by element: any row is fine.) */
    if (chosen != CONVPOOL_CUDA_KERNEL_GENERIC && !ws.sm90 && pad_w != p.in_w) {
        const double sample = (double)p.in_channels * (double)p.in_d * (double)p.in_h * (double)pad_w *
                              (dt == CONVPOOL_DTYPE_F32 ? 4.0 : 2.0);
        if (sample <= (double)PAD_MAX_SAMPLE_BYTES) {
            plan->pad_w = pad_w;
            plan->pad_batch = imax(1, imin(p.batch, (int64_t)((double)PAD_CHUNK_BYTES / sample)));
            plan->pad_offset = (plan->total_bytes + 15) / 16 * 16;
            plan->pad_bytes = plan->pad_batch * (int64_t)sample;
            plan->total_bytes = plan->pad_offset + plan->pad_bytes + 16; /* + alignment slack */
        }
    }
    plan->param_offset = 0;
    if (dt != CONVPOOL_DTYPE_F32) {
        plan->param_offset = (plan->total_bytes + 15) / 16 * 16;
        plan->total_bytes = plan->param_offset + (convpool_weight_numel(&p) + p.out_channels) * (int64_t)sizeof(float);
    }
    if (desc && desc_n) {
        desc[0] = '\0';
        append(desc, desc_n, "%s", convpool_cuda_kernel_name(plan->kernel));
        if (chosen == CONVPOOL_CUDA_KERNEL_GENERAL) {
            const GeneralTile &t = ws.tile;
            append(desc, desc_n,
                   " (item: 16 out channels x %lldx%lld pooled windows x %lld pooled d-rows = %lldx%lld conv "
                   "positions a d-row in %lldx%lld sub-tiles of 4x32; %lld B shared memory)",
                   (long long)t.wh, (long long)t.ww, (long long)t.pd_chunk, (long long)(t.wh * p.pool_h),
                   (long long)(t.ww * p.pool_w), (long long)t.n_sh, (long long)t.n_sw, (long long)t.smem);
        }
        const int64_t steps = fp::tile_steps(p.pooled_d, p.pool_d);
        if (chosen == CONVPOOL_CUDA_KERNEL_K3P2 && ws.sm90)
            append(desc, desc_n, " (sm_90a wgmma: item = pooled d x 31 pooled w x %lld of %lld pooled h rows)",
                   (long long)ws.h_chunk, (long long)p.pooled_h);
        else if (chosen == CONVPOOL_CUDA_KERNEL_K3P2 && ws.d_chunk < steps)
            append(desc, desc_n, " (item: %lld of the %lld 2-row d-steps, so a small batch fills the GPU)",
                   (long long)ws.d_chunk, (long long)steps);
        if (chosen == CONVPOOL_CUDA_KERNEL_K3P2 && !ws.sm90 && k3p2_f16_picks(make_shape(p), strict, dt))
            append(desc, desc_n, " (float16-operand MMAs, the TF32 instance rerun where x or w leaves float16's range)");
        if (plan->pad_w)
            append(desc, desc_n, ", x rows padded %lld -> %lld elements (%lld samples a pass)", (long long)p.in_w,
                   (long long)plan->pad_w, (long long)plan->pad_batch);
        append(desc, desc_n, ", %s, x %s, workspace %lld B",
               strict ? "STRICT (3xTF32)" : "TF32",
               dt == CONVPOOL_DTYPE_F32 ? "f32" : dt == CONVPOOL_DTYPE_F16 ? "f16" : "bf16",
               (long long)plan->total_bytes);
        if (forced >= 0)
            append(desc, desc_n, "; forced by CONVPOOL_CUDA_KERNEL=%s", getenv("CONVPOOL_CUDA_KERNEL"));
        if (reasons[0])
            append(desc, desc_n, "; not %s", reasons);
        if (assumed)
            append(desc, desc_n, "; no usable GPU: planned for sm_90, 132 SMs, 227 KB shared memory");
    }
    return CONVPOOL_OK;
}

/* The plan on the current device, or on the assumed one when there is none. */
convpool_status plan_here(const convpool_problem &q, convpool_precision precision, convpool_dtype dtype, Plan *plan,
                          char *desc, size_t desc_n)
{
    DeviceInfo dev;
    bool assumed = false;
    if (convpool_cuda_available()) {
        CP_TRY(device_info(&dev));
    } else {
        dev = assumed_device();
        assumed = true;
    }
    return make_plan(q, precision == CONVPOOL_PRECISION_STRICT, dtype, dev, assumed, plan, desc, desc_n);
}

convpool_status run_family(const Plan &plan, const Call &c)
{
    switch (plan.kernel) {
    case CONVPOOL_CUDA_KERNEL_K3P2: return k3p2_run(plan, c);
    case CONVPOOL_CUDA_KERNEL_GROUP: return group_run(plan, c);
    case CONVPOOL_CUDA_KERNEL_GENERAL: return general_run(plan, c);
    case CONVPOOL_CUDA_KERNEL_GENERIC: return generic_run(plan, c);
    }
    return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "internal: plan names kernel %d", (int)plan.kernel);
}

/* The problem (validated into *q) and modes of a query. */
convpool_status validate_query(const convpool_problem *p, convpool_precision precision, convpool_dtype dtype,
                               convpool_problem *q)
{
    if (!p)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "problem is NULL");
    *q = *p;
    CP_TRY(convpool_problem_validate(q));
    return check_modes(precision, dtype);
}

convpool_status check_workspace(size_t need, const void *workspace, size_t workspace_bytes)
{
    if (need > 0 && !workspace)
        return convpool_fail(CONVPOOL_ERR_WORKSPACE, "workspace is NULL but %zu bytes are needed", need);
    if (workspace_bytes < need)
        return convpool_fail(CONVPOOL_ERR_WORKSPACE, "workspace_bytes is %zu, need %zu", workspace_bytes, need);
    if ((uintptr_t)workspace % sizeof(float) != 0)
        return convpool_fail(CONVPOOL_ERR_WORKSPACE, "workspace must be 4-byte aligned");
    return CONVPOOL_OK;
}

} // namespace
} // namespace convpool_cuda

using namespace convpool_cuda;

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

extern "C" convpool_status convpool_cuda_plan_make(const convpool_problem *p, convpool_precision precision,
                                                   convpool_dtype dtype, convpool_cuda_plan *plan)
{
    if (!plan)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "plan is NULL");
    convpool_problem q;
    CP_TRY(validate_query(p, precision, dtype, &q));
    Plan pl;
    char desc[sizeof plan->description];
    CP_TRY(plan_here(q, precision, dtype, &pl, desc, sizeof desc));
    plan->kernel = pl.kernel;
    plan->workspace_bytes = (size_t)pl.total_bytes;
    plan->parts = pl.ws.parts;
    memcpy(plan->description, desc, sizeof desc);
    return CONVPOOL_OK;
}

extern "C" convpool_status convpool_cuda_workspace_size(const convpool_problem *p, convpool_precision precision,
                                                        convpool_dtype dtype, size_t *bytes)
{
    if (!bytes)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "bytes is NULL");
    convpool_problem q;
    CP_TRY(validate_query(p, precision, dtype, &q));
    Plan pl;
    CP_TRY(plan_here(q, precision, dtype, &pl, nullptr, 0));
    *bytes = (size_t)pl.total_bytes;
    return CONVPOOL_OK;
}

namespace {
/* The forward, and with codes the training forward (convpool_forward_train_cuda: k3p2 with
 * pool 2^3, whose pool_step writes the codes, and the general kernel's CODES instance). lowp
 * (convpool_forward_cuda_lowp): weight, conv_bias, bias and out are of x's 16-bit dtype, else
 * float32. */
convpool_status forward(const convpool_problem *p, convpool_precision precision, convpool_dtype dtype, const void *x,
                        const void *weight, const void *conv_bias, const void *bias, float *pooled, void *out,
                        uint8_t *codes, void *workspace, size_t workspace_bytes, void *stream, bool lowp = false,
                        bool defer_settle = false)
{
    convpool_problem q;
    CP_TRY(convpool_check_forward_args(p, x, weight, bias, pooled, out, &q));
    CP_TRY(check_modes(precision, dtype));
    if (codes)
        CP_TRY(convpool_check_code_window(&q));
    if (lowp && dtype == CONVPOOL_DTYPE_F32)
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT,
                             "dtype must be CONVPOOL_DTYPE_F16 or CONVPOOL_DTYPE_BF16 for convpool_forward_cuda_lowp "
                             "(float32 models take convpool_forward_cuda)");
    DeviceInfo dev;
    CP_TRY(device_info(&dev));
    const bool strict = precision == CONVPOOL_PRECISION_STRICT;
    Plan plan;
    CP_TRY(make_plan(q, strict, dtype, dev, false, &plan, nullptr, 0));
    const int code_bytes = convpool_code_bytes(&q);
    if (codes) {
        if ((uintptr_t)codes % (uintptr_t)code_bytes != 0)
            return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "codes must be %d-byte aligned", code_bytes);
        const bool k3p2 = plan.kernel == CONVPOOL_CUDA_KERNEL_K3P2 && fp::is_pool2(q.pool_d, q.pool_h, q.pool_w);
        const bool general = plan.kernel == CONVPOOL_CUDA_KERNEL_GENERAL && general_codes_fit(plan.ws.tile, dev);
        if (dtype != CONVPOOL_DTYPE_F32 || !(k3p2 || general))
            return convpool_fail(CONVPOOL_ERR_UNSUPPORTED,
                                 "the training forward writes codes from the k3p2 kernel (pool 2x2x2) and the general "
                                 "kernel on float32 x only (this problem plans %s%s): use "
                                 "convpool_pool_forward_train_cuda on a conv output",
                                 convpool_cuda_kernel_name(plan.kernel),
                                 plan.kernel == CONVPOOL_CUDA_KERNEL_GENERAL ? ", whose arg-max state does not fit" : "");
    }
    CP_TRY(check_workspace((size_t)plan.total_bytes, workspace, workspace_bytes));
    CP_TRY(convpool_check_forward_overlap(&q, x, dtype == CONVPOOL_DTYPE_F32 ? 4 : 2, weight, conv_bias, bias,
                                          lowp ? 2 : 4, pooled, out, codes, workspace, (int64_t)plan.total_bytes));

    unsigned char *wsp = static_cast<unsigned char *>(workspace);
    Call c;
    c.s = make_shape(q);
    c.strict = strict;
    c.dtype = dtype;
    c.x = x;
    c.w = static_cast<const float *>(weight);
    c.conv_bias = static_cast<const float *>(conv_bias);
    c.partials = reinterpret_cast<float *>(wsp);
    const uintptr_t at = (uintptr_t)(wsp + plan.partial_bytes);
    c.scratch = plan.ws.scratch_bytes > 0 ? wsp + plan.partial_bytes + (16 - at % 16) % 16 : nullptr;
    c.codes = codes;
    c.code_bytes = code_bytes;
    c.defer_settle = defer_settle;
    c.dev = dev;
    c.stream = static_cast<cudaStream_t>(stream);
    if (lowp) {
        float *params = reinterpret_cast<float *>(wsp + plan.param_offset);
        const int64_t nw = convpool_weight_numel(&q);
        CP_TRY(widen_params(dtype, weight, nw, conv_bias, conv_bias ? q.out_channels : 0, params, dev, c.stream));
        c.w = params;
        c.conv_bias = conv_bias ? params + nw : nullptr;
    }
    bool fold_done = false;
    const FinishFold fold = {static_cast<const float *>(bias), pooled, static_cast<float *>(out), plan.ws.parts};
    if (plan.pad_w == 0) {
        /* One pass over x: the family's last kernel may take the finish on (float32 bias and out,
         * finish_warp_sample's channels). */
        if (!lowp && q.out_channels <= FINISH_WARP_MAX_COUT) {
            c.fold = &fold;
            c.fold_done = &fold_done;
        }
        CP_TRY(run_family(plan, c));
    } else {
        /* A chunk of samples at a time: pad its rows into the workspace, then run the family on
         * the copy as a problem of that batch whose rows are pad_w long. Partial sums are
         * [b][c][part], so a chunk's start at sample b0 is b0 * cout * parts floats in. */
        const Shape full = c.s;
        const int64_t esize = dtype == CONVPOOL_DTYPE_F32 ? 4 : 2;
        const int64_t rows_per_sample = full.cin * full.in_d * full.in_h;
        /* The workspace is only 4-byte aligned: the copy starts on the next 16 bytes (the plan
         * leaves 16 bytes of slack for that). */
        const uintptr_t pad_at = (uintptr_t)(wsp + plan.pad_offset);
        unsigned char *padded = wsp + plan.pad_offset + (16 - pad_at % 16) % 16;
        for (int64_t b0 = 0; b0 < full.batch; b0 += plan.pad_batch) {
            const int64_t nb = imin(plan.pad_batch, full.batch - b0);
            const unsigned char *xb = static_cast<const unsigned char *>(x) + b0 * rows_per_sample * full.in_w * esize;
            CP_TRY(pad_rows(xb, nb * rows_per_sample, full.in_w, plan.pad_w, dtype, padded, dev, c.stream));
            Call cc = c;
            cc.s.batch = nb;
            cc.s.in_w = plan.pad_w;
            cc.x = padded;
            cc.partials = c.partials + b0 * full.cout * plan.ws.parts;
            cc.codes = codes ? codes + b0 * full.cout * convpool_pooled_count(&q) * c.code_bytes : nullptr;
            CP_TRY(run_family(plan, cc));
        }
    }
    if (fold_done)
        return CONVPOOL_OK;
    return finish_run(c.s, c.partials, plan.ws.parts, bias, pooled, out, lowp ? dtype : CONVPOOL_DTYPE_F32, dev,
                      c.stream, true);
}
} // namespace

extern "C" convpool_status convpool_forward_cuda(const convpool_problem *p, convpool_precision precision,
                                                 convpool_dtype dtype, const void *x, const float *weight,
                                                 const float *conv_bias, const float *bias, float *pooled,
                                                 float *out, void *workspace, size_t workspace_bytes,
                                                 void *stream)
{
    return forward(p, precision, dtype, x, weight, conv_bias, bias, pooled, out, nullptr, workspace,
                   workspace_bytes, stream);
}

extern "C" convpool_status convpool_forward_cuda_lowp(const convpool_problem *p, convpool_precision precision,
                                                      convpool_dtype dtype, const void *x, const void *weight,
                                                      const void *conv_bias, const void *bias, float *pooled,
                                                      void *out, void *workspace, size_t workspace_bytes,
                                                      void *stream)
{
    return forward(p, precision, dtype, x, weight, conv_bias, bias, pooled, out, nullptr, workspace,
                   workspace_bytes, stream, true);
}

extern "C" convpool_status convpool_forward_train_cuda(const convpool_problem *p, convpool_precision precision,
                                                       const float *x, const float *weight, const float *conv_bias,
                                                       const float *bias, float *pooled, float *out, void *codes,
                                                       void *workspace, size_t workspace_bytes, void *stream)
{
    if (!codes)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "codes is NULL");
    return forward(p, precision, CONVPOOL_DTYPE_F32, x, weight, conv_bias, bias, pooled, out,
                   static_cast<uint8_t *>(codes), workspace, workspace_bytes, stream);
}

extern "C" convpool_status convpool_forward_train_cuda_deferred(const convpool_problem *p, convpool_precision precision,
                                                                const float *x, const float *weight,
                                                                const float *conv_bias, const float *bias,
                                                                float *pooled, float *out, void *codes,
                                                                void *workspace, size_t workspace_bytes, void *stream)
{
    if (!codes)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "codes is NULL");
    return forward(p, precision, CONVPOOL_DTYPE_F32, x, weight, conv_bias, bias, pooled, out,
                   static_cast<uint8_t *>(codes), workspace, workspace_bytes, stream, false, true);
}

namespace {

/* Whether the training forward of this plan leaves near-tied codes flagged when its last step
 * is deferred, and with which flag value and recheck: the general kernel's codes in both
 * precisions (where they fit and the code width has a spare value: general_launch's P.recheck),
 * k3p2's in strict (k3p2_launch's TIES; its flat fields are settled in the kernel). Every other
 * route writes final codes (k3p2 in TF32, k3p2_sm90, the pooling kernel on a conv output). */
bool settle_route(const Plan &plan, const convpool_problem &q, bool strict, const DeviceInfo &dev, uint32_t *flag,
                  bool *flat_first)
{
    if (plan.kernel == CONVPOOL_CUDA_KERNEL_K3P2) {
        *flag = 0xffu;
        *flat_first = false;
        return strict && !plan.ws.sm90 && fp::is_pool2(q.pool_d, q.pool_h, q.pool_w);
    }
    if (plan.kernel != CONVPOOL_CUDA_KERNEL_GENERAL || !general_codes_fit(plan.ws.tile, dev))
        return false;
    const int cb = convpool_code_bytes(&q);
    *flag = cb >= 4 ? 0xffffffffu : (1u << (8 * cb)) - 1u;
    *flat_first = true;
    return q.pool_d * q.pool_h * q.pool_w <= (int64_t)*flag;
}

} // namespace

extern "C" convpool_status convpool_settle_codes_cuda(const convpool_problem *p, convpool_precision precision,
                                                      const float *x, const float *weight, const float *conv_bias,
                                                      void *codes, void *stream)
{
    convpool_problem q;
    CP_TRY(convpool_check_inputs(p, x, weight, &q));
    CP_TRY(check_modes(precision, CONVPOOL_DTYPE_F32));
    if (!codes)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "codes is NULL");
    CP_TRY(convpool_check_code_window(&q));
    const int cb = convpool_code_bytes(&q);
    if ((uintptr_t)codes % (uintptr_t)cb != 0)
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "codes must be %d-byte aligned", cb);
    const convpool_span in[3] = {
        {"x", x, convpool_x_numel(&q), 4},
        {"weight", weight, convpool_weight_numel(&q), 4},
        {"conv_bias", conv_bias, q.out_channels, 4},
    };
    const convpool_span outs[1] = {{"codes", codes, q.batch * q.out_channels * convpool_pooled_count(&q), cb}};
    CP_TRY(convpool_check_overlap(outs, 1, in, 3));
    DeviceInfo dev;
    CP_TRY(device_info(&dev));
    const bool strict = precision == CONVPOOL_PRECISION_STRICT;
    Plan plan;
    CP_TRY(make_plan(q, strict, CONVPOOL_DTYPE_F32, dev, false, &plan, nullptr, 0));
    uint32_t flag = 0;
    bool flat_first = false;
    if (!settle_route(plan, q, strict, dev, &flag, &flat_first))
        return CONVPOOL_OK;
    Call c;
    c.s = make_shape(q);
    c.strict = strict;
    c.dtype = CONVPOOL_DTYPE_F32;
    c.x = x;
    c.w = weight;
    c.conv_bias = conv_bias;
    c.partials = nullptr;
    c.scratch = nullptr;
    c.codes = static_cast<uint8_t *>(codes);
    c.code_bytes = cb;
    c.dev = dev;
    c.stream = static_cast<cudaStream_t>(stream);
    return recheck_codes(c, flag, flat_first);
}

namespace {

/* The partial sums the unfused second half needs: (b, c, part) floats, parts as the pooling
 * kernel of that layout counts them. */
convpool_status pool_workspace_size(const convpool_problem *p, size_t *bytes, bool channels_last)
{
    if (!bytes)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "bytes is NULL");
    if (!p)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "problem is NULL");
    convpool_problem q = *p;
    CP_TRY(convpool_problem_validate(&q));
    const int64_t parts = channels_last ? pool_cl_parts(q) : pool_parts(q);
    *bytes = (size_t)(q.batch * q.out_channels * parts) * sizeof(float);
    return CONVPOOL_OK;
}

} // namespace

extern "C" convpool_status convpool_cuda_pool_workspace_size(const convpool_problem *p, size_t *bytes)
{
    return pool_workspace_size(p, bytes, false);
}

namespace {

/* The unfused second half, writing the arg-max codes too when codes is not NULL (NCDHW y only);
 * channels_last: y is [b][d][h][w][c]. */
convpool_status pool_forward(const convpool_problem *p, const float *y, const float *bias, float *pooled, float *out,
                             void *codes, void *workspace, size_t workspace_bytes, void *stream,
                             bool channels_last = false)
{
    if (!y)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "y is NULL");
    convpool_problem q;
    /* No x or weight here: y stands in for both in the shared pointer check. */
    CP_TRY(convpool_check_forward_args(p, y, y, bias, pooled, out, &q));
    if (codes)
        CP_TRY(convpool_check_code_window(&q));
    const int64_t parts = channels_last ? pool_cl_parts(q) : pool_parts(q);
    const int64_t ws_need = q.batch * q.out_channels * parts * (int64_t)sizeof(float);
    CP_TRY(check_workspace((size_t)ws_need, workspace, workspace_bytes));
    const int cb = convpool_code_bytes(&q);
    if ((uintptr_t)codes % (uintptr_t)cb != 0)
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "codes must be %d-byte aligned", cb);
    const convpool_span in[2] = {{"y", y, q.batch * q.out_channels * q.conv_d * q.conv_h * q.conv_w, 4},
                                 {"bias", out ? bias : nullptr, q.out_channels, 4}};
    const convpool_span outs[4] = {{"pooled", pooled, q.batch * q.out_channels, 4},
                                   {"out", out, q.batch, 4},
                                   {"codes", codes, q.batch * q.out_channels * convpool_pooled_count(&q), cb},
                                   {"workspace", workspace, ws_need, 1}};
    CP_TRY(convpool_check_overlap(outs, 4, in, 2));
    DeviceInfo dev;
    CP_TRY(device_info(&dev));
    const Shape s = make_shape(q);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    float *partials = static_cast<float *>(workspace);
    if (channels_last)
        CP_TRY(pool_cl_run(s, y, partials, parts, dev, st));
    else if (codes)
        CP_TRY(pool_train_run(s, y, partials, parts, codes, cb, dev, st));
    else
        CP_TRY(pool_run(s, y, partials, parts, dev, st));
    return finish_run(s, partials, parts, bias, pooled, out, CONVPOOL_DTYPE_F32, dev, st);
}

} // namespace

extern "C" convpool_status convpool_cuda_pool_cl_workspace_size(const convpool_problem *p, size_t *bytes)
{
    return pool_workspace_size(p, bytes, true);
}

extern "C" convpool_status convpool_pool_forward_cl_cuda(const convpool_problem *p, const float *y, const float *bias,
                                                         float *pooled, float *out, void *workspace,
                                                         size_t workspace_bytes, void *stream)
{
    return pool_forward(p, y, bias, pooled, out, nullptr, workspace, workspace_bytes, stream, true);
}

extern "C" convpool_status convpool_pool_forward_cuda(const convpool_problem *p, const float *y, const float *bias,
                                                      float *pooled, float *out, void *workspace,
                                                      size_t workspace_bytes, void *stream)
{
    return pool_forward(p, y, bias, pooled, out, nullptr, workspace, workspace_bytes, stream);
}

extern "C" convpool_status convpool_pool_forward_train_cuda(const convpool_problem *p, const float *y,
                                                            const float *bias, float *pooled, float *out, void *codes,
                                                            void *workspace, size_t workspace_bytes, void *stream)
{
    if (!y)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "y is NULL");
    if (!codes)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "codes is NULL");
    return pool_forward(p, y, bias, pooled, out, codes, workspace, workspace_bytes, stream);
}

extern "C" convpool_status convpool_backward_cuda_workspace_size(const convpool_problem *p,
                                                                 convpool_precision precision, size_t *bytes)
{
    if (!bytes)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "bytes is NULL");
    if (!p)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "problem is NULL");
    CP_TRY(check_modes(precision, CONVPOOL_DTYPE_F32));
    convpool_problem q = *p;
    CP_TRY(convpool_problem_validate(&q));
    const double n = (double)q.batch * (double)q.out_channels * (double)q.in_channels * (double)q.kernel_d *
                     (double)q.kernel_h * (double)q.kernel_w * 4.0;
    if (n > 9.0e18)
        return convpool_fail(CONVPOOL_ERR_OVERFLOW, "backward workspace size overflows");
    *bytes = (size_t)backward_workspace_bytes(q, precision == CONVPOOL_PRECISION_STRICT);
    return CONVPOOL_OK;
}

extern "C" convpool_status convpool_backward_cuda_all(const convpool_problem *p, convpool_precision precision,
                                                      const float *x, const float *weight, const void *codes,
                                                      const float *grad_pooled, const float *grad_out,
                                                      int64_t grad_out_stride, float *grad_x, float *grad_weight,
                                                      float *grad_conv_bias, float *grad_bias, void *workspace,
                                                      size_t workspace_bytes, void *stream)
{
    if (grad_out_stride < 0)
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "grad_out_stride must be 0 or more, got %lld",
                             (long long)grad_out_stride);
    convpool_problem q;
    CP_TRY(convpool_check_inputs(p, x, weight, &q));
    CP_TRY(check_modes(precision, CONVPOOL_DTYPE_F32));
    const bool strict = precision == CONVPOOL_PRECISION_STRICT;
    if (!codes)
        return convpool_fail(CONVPOOL_ERR_NULL_POINTER, "codes is NULL");
    CP_TRY(convpool_check_code_window(&q));
    if (!backward_fits(q))
        return convpool_fail(CONVPOOL_ERR_UNSUPPORTED,
                             "the fused backward needs in_d*in_h*in_w, the kernel volume and the pool volume below 2^31");
    const int cb = convpool_code_bytes(&q);
    if ((uintptr_t)codes % (uintptr_t)cb != 0)
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "codes must be %d-byte aligned", cb);
    /* grad_weight: the flags and the partials; grad_x alone: the flags; grad_conv_bias alone:
     * nothing. */
    const int64_t need =
        grad_weight ? backward_workspace_bytes(q, strict) : grad_x ? backward_flags_bytes() : 0;
    CP_TRY(check_workspace((size_t)need, workspace, workspace_bytes));
    const int64_t B = q.batch, C = q.out_channels;
    const convpool_span in[5] = {
        {"x", x, convpool_x_numel(&q), 4},
        {"weight", weight, convpool_weight_numel(&q), 4},
        {"codes", codes, B * C * convpool_pooled_count(&q), cb},
        {"grad_pooled", grad_pooled, B * C, 4},
        {"grad_out", grad_out, (B - 1) * grad_out_stride + 1, 4},
    };
    const convpool_span outs[5] = {
        {"grad_x", grad_x, convpool_x_numel(&q), 4},
        {"grad_weight", grad_weight, convpool_weight_numel(&q), 4},
        {"grad_conv_bias", grad_conv_bias, C, 4},
        {"grad_bias", grad_bias, C, 4},
        {"workspace", need ? workspace : nullptr, need, 1},
    };
    CP_TRY(convpool_check_overlap(outs, 5, in, 5));
    DeviceInfo dev;
    CP_TRY(device_info(&dev));
    BackwardCall c;
    c.s = make_shape(q);
    c.x = x;
    c.w = weight;
    c.grad_pooled = grad_pooled;
    c.grad_out = grad_out;
    c.go_stride = grad_out_stride;
    c.codes = codes;
    c.code_bytes = cb;
    c.grad_x = grad_x;
    c.grad_w = grad_weight;
    c.grad_cb = grad_conv_bias;
    c.grad_bias = grad_bias;
    c.flags = need ? static_cast<unsigned *>(workspace) : nullptr;
    c.nf_mask = grad_weight ? static_cast<uint8_t *>(workspace) + backward_flags_bytes() : nullptr;
    c.partial_w = grad_weight ? reinterpret_cast<float *>(static_cast<char *>(workspace) +
                                                          backward_weight_head_bytes(c.s))
                              : nullptr;
    c.strict = strict;
    c.dev = dev;
    c.stream = static_cast<cudaStream_t>(stream);
    return backward_run(c);
}

extern "C" convpool_status convpool_backward_cuda(const convpool_problem *p, convpool_precision precision,
                                                  const float *x, const float *weight, const void *codes,
                                                  const float *grad_pooled, const float *grad_out, float *grad_x,
                                                  float *grad_weight, float *grad_conv_bias, void *workspace,
                                                  size_t workspace_bytes, void *stream)
{
    return convpool_backward_cuda_all(p, precision, x, weight, codes, grad_pooled, grad_out, 1, grad_x, grad_weight,
                                      grad_conv_bias, nullptr, workspace, workspace_bytes, stream);
}

extern "C" convpool_status convpool_backward_cuda_strided(const convpool_problem *p, convpool_precision precision,
                                                          const float *x, const float *weight, const void *codes,
                                                          const float *grad_pooled, const float *grad_out,
                                                          int64_t grad_out_stride, float *grad_x, float *grad_weight,
                                                          float *grad_conv_bias, void *workspace,
                                                          size_t workspace_bytes, void *stream)
{
    return convpool_backward_cuda_all(p, precision, x, weight, codes, grad_pooled, grad_out, grad_out_stride, grad_x,
                                      grad_weight, grad_conv_bias, nullptr, workspace, workspace_bytes, stream);
}

namespace {

/* convpool_check_tail, then the alignment the CUDA kernels' loads and stores need. */
convpool_status tail_check(const convpool_problem *p, convpool_dtype dtype, int backward, const void *codes,
                           const void *in, const void *out, convpool_problem *q, int64_t *elem)
{
    CP_TRY(convpool_check_tail(p, dtype, backward, codes, in, out, q, elem));
    const int cb = convpool_code_bytes(q);
    if ((uintptr_t)codes % (uintptr_t)cb != 0)
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "codes must be %d-byte aligned", cb);
    if ((uintptr_t)in % (uintptr_t)*elem != 0 || (uintptr_t)out % (uintptr_t)*elem != 0)
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "%s must be %d-byte aligned",
                             backward ? "grad_m and grad_y" : "y and m", (int)*elem);
    return CONVPOOL_OK;
}

} // namespace

/* PyTorch's CUDA division by a scalar: a product with the float32 reciprocal, formed on the host
 * as PyTorch forms it (opmath_t(1) / (float)divisor). */
static float torch_cuda_reciprocal(double divisor) { return 1.0f / (float)divisor; }

extern "C" convpool_status convpool_tail_train_cuda(const convpool_problem *p, convpool_dtype dtype, const void *y,
                                                    void *m, void *codes, void *stream)
{
    convpool_problem q;
    int64_t elem = 0;
    CP_TRY(tail_check(p, dtype, 0, codes, y, m, &q, &elem));
    DeviceInfo dev;
    CP_TRY(device_info(&dev));
    return tail_train_run(make_shape(q), dtype, y, torch_cuda_reciprocal(q.divisor), m, codes,
                          convpool_code_bytes(&q), dev, static_cast<cudaStream_t>(stream));
}

extern "C" convpool_status convpool_tail_backward_cuda(const convpool_problem *p, convpool_dtype dtype,
                                                       const void *codes, const void *grad_m, void *grad_y,
                                                       void *stream)
{
    convpool_problem q;
    int64_t elem = 0;
    CP_TRY(tail_check(p, dtype, 1, codes, grad_m, grad_y, &q, &elem));
    DeviceInfo dev;
    CP_TRY(device_info(&dev));
    return tail_backward_run(make_shape(q), dtype, codes, convpool_code_bytes(&q), grad_m,
                             torch_cuda_reciprocal(q.divisor), grad_y, dev, static_cast<cudaStream_t>(stream));
}
