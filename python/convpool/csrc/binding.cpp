/*
 * PyTorch binding of convpool: registers the custom op
 *
 *   <ns>::forward(Tensor x, Tensor weight, Tensor? conv_bias, Tensor? bias, float divisor,
 *                 int[3] pool, bool tf32) -> (Tensor pooled, Tensor out)
 *
 * with a CPU kernel (convpool_forward_cpu) and, in CUDA builds, a CUDA kernel
 * (convpool_forward_cuda); plus <ns>::reference, the C reference, for tests (CPU only).
 * pooled is P (B, C) float32; out is (B,) float32 with out[b] = sum_c (P[b][c] + bias[c]) when
 * bias is given, else an empty (0,) tensor. The fake (meta) kernel and the autograd formula
 * are registered from Python (convpool/_ops.py).
 *
 * This file is compiled by torch.utils.cpp_extension.load_inline in one translation unit with
 * the text of src/problem.c, src/reference.c, src/cpu.c and src/cuda_stub.c (or, in CUDA builds,
 * next to src/cuda/convpool.cu). It stays thin: argument checks whose messages name the
 * argument, conversion to the library's layouts, then one library call.
 *
 * CONVPOOL_OP_NAMESPACE picks the op namespace (default convpool); CONVPOOL_HAVE_CUDA=1 adds
 * the CUDA kernel.
 */
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/DispatchKeyExtractor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>

#if defined(CONVPOOL_HAVE_CUDA) && CONVPOOL_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/EmptyTensor.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#define CP_WITH_CUDA 1
#else
#define CP_WITH_CUDA 0
#endif

#include "convpool.h"

/* Built as a Python extension module (torch.utils.cpp_extension defines the name): the module
 * adds block_inference_direct (end of file), ModelNew's per-call entry. */
#ifdef TORCH_EXTENSION_NAME
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#endif

/* The fused-or-cuDNN rule of the CUDA forward (choose_route), from docs/BENCHMARKS.md. */
#ifndef CP_CUDNN_MIN_COUT
#define CP_CUDNN_MIN_COUT 64
#endif
#ifndef CP_CUDNN_STRICT_GENERAL_MIN_CHANNELS
#define CP_CUDNN_STRICT_GENERAL_MIN_CHANNELS 512
#endif
/* The CPU's rule (cpu_conv_route). */
#ifndef CP_CPU_CONV_MIN_MACS_PER_OUTPUT
#define CP_CPU_CONV_MIN_MACS_PER_OUTPUT 24576.0
#endif
#ifndef CP_CPU_CONV_MIN_CHANNELS_WIDE_POOL
#define CP_CPU_CONV_MIN_CHANNELS_WIDE_POOL 256
#endif
#ifndef CP_CUDNN_MIN_MACS_PER_OUTPUT
#define CP_CUDNN_MIN_MACS_PER_OUTPUT (128.0 * 64.0 * 27.0)
#endif

#ifndef CONVPOOL_OP_NAMESPACE
#define CONVPOOL_OP_NAMESPACE convpool
#endif
/* One level of indirection so the namespace macro expands before TORCH_LIBRARY pastes it. */
#define CP_TORCH_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define CP_TORCH_LIBRARY_IMPL(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)

/* Shape and value problems raise ValueError, dtype problems TypeError. The message is built
 * by cp_message, never by streaming numbers into an ostream: on the device machine's image
 * (PyTorch 2.11, g++ 13.3) formatting an integer through std::ostream inside a load_inline
 * extension crashed the process, TORCH_CHECK's own formatting included. */
#define CP_CHECK_ARG(cond, ...) TORCH_CHECK_VALUE(cond, cp_message(__VA_ARGS__))
#define CP_CHECK_DTYPE(cond, ...) TORCH_CHECK_TYPE(cond, cp_message(__VA_ARGS__))

namespace {

std::string cp_piece(const char *s) { return s; }
std::string cp_piece(const std::string &s) { return s; }
std::string cp_piece(const c10::Device &d) { return d.str(); }
std::string cp_piece(at::ScalarType t) { return c10::toString(t); }
std::string cp_piece(at::IntArrayRef a)
{
    std::string s = "[";
    for (size_t i = 0; i < a.size(); ++i)
        s += (i ? ", " : "") + std::to_string(a[i]);
    return s + "]";
}
template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
std::string cp_piece(T v)
{
    return std::to_string(v);
}

template <typename... Args>
std::string cp_message(const Args &...args)
{
    std::string s;
    ((s += cp_piece(args)), ...);
    return s;
}

using OptTensor = std::optional<at::Tensor>;

/* A tensor that may be undefined as the optional an op's Tensor? argument takes. */
OptTensor opt(const at::Tensor &t) { return t.defined() ? OptTensor(t) : OptTensor(); }
bool lowp_dtype(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }
using Outputs = std::tuple<at::Tensor, at::Tensor>; /* (pooled, out) */

void check_same_device(const at::Tensor &t, const char *name, const at::Tensor &x)
{
    CP_CHECK_ARG(t.device() == x.device(), name, " is on ", t.device(), " but x is on ", x.device(),
                 ": all tensors must be on the same device");
}

void check_channel_vector(const OptTensor &t, const char *name, int64_t channels,
                          const at::Tensor &x)
{
    if (!t.has_value())
        return;
    check_same_device(*t, name, x);
    CP_CHECK_DTYPE(at::isFloatingType(t->scalar_type()), name,
                   " must be a floating-point tensor, got ", t->scalar_type());
    CP_CHECK_ARG(t->numel() == channels, name, " must have out_channels = ", channels,
                 " elements, got ", t->numel(), " (shape ", t->sizes(), ")");
}

/* The checks every kernel needs, in the order the Python front end makes them. */
void check_args(const at::Tensor &x, const at::Tensor &weight, const OptTensor &conv_bias,
                const OptTensor &bias, at::IntArrayRef pool)
{
    CP_CHECK_ARG(x.dim() == 5, "x must be a 5-D tensor (N, C, D, H, W), got ", x.dim(), "-D");
    CP_CHECK_ARG(weight.dim() == 5, "weight must be a 5-D tensor (C_out, C_in, kD, kH, kW), got ",
                 weight.dim(), "-D");
    CP_CHECK_ARG(x.size(1) == weight.size(1), "x has ", x.size(1),
                 " channels (dim 1) but weight expects in_channels = ", weight.size(1));
    check_same_device(weight, "weight", x);
    CP_CHECK_DTYPE(at::isFloatingType(weight.scalar_type()),
                   "weight must be a floating-point tensor, got ", weight.scalar_type());
    check_channel_vector(conv_bias, "conv_bias", weight.size(0), x);
    check_channel_vector(bias, "bias", weight.size(0), x);
    CP_CHECK_ARG(pool.size() == 3, "pool must have 3 entries (pD, pH, pW), got ", pool);
    CP_CHECK_ARG(x.numel() > 0 && weight.numel() > 0, "x and weight must not be empty, got x ",
                 x.sizes(), " and weight ", weight.sizes());
    for (int i = 0; i < 3; ++i) {
        CP_CHECK_ARG(pool[i] > 0, "pool must be positive, got ", pool);
        CP_CHECK_ARG(x.size(2 + i) >= weight.size(2 + i), "x spatial size (D, H, W) = ",
                     x.sizes().slice(2), " is smaller than the kernel ", weight.sizes().slice(2),
                     " (weight dims 2-4)");
        const int64_t conv = x.size(2 + i) - weight.size(2 + i) + 1;
        CP_CHECK_ARG(conv / pool[i] > 0, "pool ", pool, " is larger than the conv output (",
                     x.size(2) - weight.size(2) + 1, ", ", x.size(3) - weight.size(3) + 1, ", ",
                     x.size(4) - weight.size(4) + 1,
                     ") (x spatial size - kernel + 1): the pooled output would be empty");
    }
}

/* Raises the library's message for a failed call; sizes and arguments are ValueError. */
void throw_status(convpool_status s, const char *call)
{
    const std::string msg = std::string(call) + " failed with " + convpool_status_name(s) + ": " +
                            convpool_last_error();
    switch (s) {
    case CONVPOOL_ERR_NULL_POINTER:
    case CONVPOOL_ERR_INVALID_SIZE:
    case CONVPOOL_ERR_INPUT_TOO_SMALL:
    case CONVPOOL_ERR_EMPTY_OUTPUT:
    case CONVPOOL_ERR_OVERFLOW:
    case CONVPOOL_ERR_INVALID_ARGUMENT:
        TORCH_CHECK_VALUE(false, msg);
    default:
        TORCH_CHECK(false, msg);
    }
}

/* The divisor PyTorch's CUDA division acts with. Model's x / divisor on a CUDA tensor with a
 * Python-number divisor is x * (1 / divisor), the reciprocal taken in float32 (ATen's
 * div_true_kernel_cuda). Where that reciprocal is +-inf (|divisor| below ~2.9e-39, subnormal in
 * float32) every q is then x * inf, which is x / +-0 exactly (0 * inf and 0 / 0 are both NaN);
 * where it is +-0 (divisor +-inf in float32, |divisor| above FLT_MAX) every q is x * 0, which is
 * x / +-inf exactly. The library's literal mode computes those divisions. (A subnormal
 * reciprocal, |divisor| above ~8.5e37, keeps the divisor: the quotients then differ from
 * Model's products in their low bits; the fused backward is not used there, _ops.py.) The
 * CPU's division is IEEE division, as the library's. */
double torch_cuda_divisor(double divisor)
{
    const float f = static_cast<float>(divisor);
    const float r = 1.0f / f;
    if (std::isinf(r))
        return std::copysign(0.0, static_cast<double>(f));
    if (r == 0.0f)
        return std::copysign(INFINITY, static_cast<double>(f));
    return divisor;
}

convpool_problem make_problem(const at::Tensor &x, const at::Tensor &weight, at::IntArrayRef pool,
                              double divisor)
{
    if (x.is_cuda())
        divisor = torch_cuda_divisor(divisor);
    convpool_problem p = convpool_problem_make(x.size(0), x.size(1), weight.size(0), x.size(2),
                                               x.size(3), x.size(4), weight.size(2), weight.size(3),
                                               weight.size(4), pool[0], pool[1], pool[2], divisor);
    const convpool_status s = convpool_problem_validate(&p);
    if (s != CONVPOOL_OK)
        throw_status(s, "convpool_problem_validate");
    return p;
}

/* t as dense row-major float32, which the library reads; no copy (and, on the per-call path,
 * no dispatcher call) when it already is. */
at::Tensor as_float_dense(const at::Tensor &t)
{
    if (t.scalar_type() == at::kFloat && t.is_contiguous())
        return t;
    return t.to(at::kFloat).contiguous();
}

/* A per-channel vector (any shape with out_channels elements) as dense float32. A dense
 * tensor's elements are already in channel order, so no reshape is needed. */
at::Tensor channel_vector(const OptTensor &t)
{
    if (!t.has_value())
        return at::Tensor();
    if (t->scalar_type() == at::kFloat && t->is_contiguous())
        return *t;
    return as_float_dense(t->reshape({-1}));
}

const float *float_ptr_or_null(const at::Tensor &t)
{
    return t.defined() ? t.data_ptr<float>() : nullptr;
}

/* The library computes out only when bias is given. */
float *out_ptr(at::Tensor &out, const at::Tensor &bias)
{
    return bias.defined() ? out.data_ptr<float>() : nullptr;
}

Outputs make_outputs(const at::Tensor &x, const convpool_problem &p, bool with_out)
{
    const auto opts = x.options().dtype(at::kFloat);
    at::Tensor pooled = at::empty({p.batch, p.out_channels}, opts);
    at::Tensor out = at::empty({with_out ? p.batch : 0}, opts);
    return {pooled, out};
}

/* A CPU kernel's arguments: float32 and dense (float16/bfloat16 are upcast: the CPU kernels
 * read float32 only), with the outputs allocated. */
struct CpuCall {
    convpool_problem p;
    at::Tensor x, weight, conv_bias, bias, pooled, out;
};

CpuCall prepare_cpu(const at::Tensor &x_in, const at::Tensor &weight_in,
                    const OptTensor &conv_bias_in, const OptTensor &bias_in, double divisor,
                    at::IntArrayRef pool)
{
    CpuCall c;
    c.p = make_problem(x_in, weight_in, pool, divisor);
    c.x = as_float_dense(x_in);
    c.weight = as_float_dense(weight_in);
    c.conv_bias = channel_vector(conv_bias_in);
    c.bias = channel_vector(bias_in);
    std::tie(c.pooled, c.out) = make_outputs(c.x, c.p, c.bias.defined());
    return c;
}

std::tuple<at::Tensor, at::Tensor> conv_tail_forward(const at::Tensor &x, const at::Tensor &weight,
                                                     const OptTensor &conv_bias, double divisor, at::IntArrayRef pool);

/* A route rule's answer, with its reason written where one is asked for (explain): the rules
 * run on every call, so the reason is not formatted otherwise. */
bool routed(std::string *why, bool taken, const char *reason)
{
    if (why)
        *why = reason;
    return taken;
}

/* CONVPOOL_TORCH_PATH: "fused" or "cudnn" (PyTorch's conv: cuDNN's on CUDA, oneDNN's on the
 * CPU) forces the binding's forward route on either device (tests and benchmarks); else "". */
const char *forced_route()
{
    const char *env = std::getenv("CONVPOOL_TORCH_PATH");
    return env && (std::strcmp(env, "fused") == 0 || std::strcmp(env, "cudnn") == 0) ? env : "";
}

/* Whether a CPU problem runs as PyTorch's conv (oneDNN) followed by convpool's fused divide and
 * max pool (tail_train) and the mean, rather than convpool_forward_cpu: where the fused CPU
 * conv measured slower than PyTorch's (2 cores, inference, twenty-first session;
 * docs/wide_fused_cpu_s21.md). Its direct path (any kernel but 3 in h and w, or odd pools:
 * convpool_cpu_winograd) from Cin x Cout x kernel volume 24576 multiply-adds an output (kernel 5
 * at 16 -> 32: 0.75x eager, 32 -> 32: 0.63x; 1x7x7 at 16 -> 32: 0.85x; pool 3 at 64 -> 64: 0.72x,
 * against 1.40-2.19x at 128 channels and kernel 7 at 8 -> 8, 21952 an output, 1.41x), and its
 * Winograd path with pool 4^3 windows from Cin x Cout 256 (16 -> 16: 0.71x, 64 -> 64: 0.56x,
 * where pool 2x4x4 ran 1.30x and 8 -> 16 4.46x). CONVPOOL_TORCH_PATH=fused|cudnn forces either
 * ("cudnn": PyTorch's conv, oneDNN's on the CPU). */
bool cpu_conv_route(const convpool_problem &p, std::string *why = nullptr)
{
    const char *forced = forced_route();
    if (std::strcmp(forced, "fused") == 0)
        return routed(why, false, "forced by CONVPOOL_TORCH_PATH=fused");
    if (std::strcmp(forced, "cudnn") == 0)
        return routed(why, true, "forced by CONVPOOL_TORCH_PATH=cudnn");
    const int64_t channels = (int64_t)p.in_channels * p.out_channels;
    if (!convpool_cpu_winograd(&p)) {
        if ((double)channels * p.kernel_d * p.kernel_h * p.kernel_w >= CP_CPU_CONV_MIN_MACS_PER_OUTPUT)
            return routed(why, true, "the fused direct path is slower than PyTorch's conv at this width");
        return routed(why, false, "the fused direct path");
    }
    if ((int64_t)p.pool_d * p.pool_h * p.pool_w >= 64 && channels >= CP_CPU_CONV_MIN_CHANNELS_WIDE_POOL)
        return routed(why, true, "the fused Winograd path is slower than PyTorch's conv with pool windows this large");
    return routed(why, false, "the fused Winograd path");
}

/* The CPU forward as the conv-tail route's forward (PyTorch's conv, then convpool's divide and
 * max pool: conv_tail_forward) and Model's mean (adaptive_avg_pool3d, which reduces each
 * (sample, channel) in one thread, so the result does not depend on the thread count beyond the
 * conv's own): cpu_conv_route's problems. pooled and out as convpool_forward_cpu writes them
 * (out = the sum over channels of pooled + bias). */
Outputs forward_cpu_conv(const CpuCall &c)
{
    const at::Tensor m = std::get<0>(
        conv_tail_forward(c.x, c.weight, opt(c.conv_bias), c.p.divisor, {c.p.pool_d, c.p.pool_h, c.p.pool_w}));
    at::Tensor pooled = at::adaptive_avg_pool3d(m, {1, 1, 1}).reshape({c.p.batch, c.p.out_channels});
    at::Tensor out =
        c.bias.defined() ? at::sum(pooled + c.bias.reshape({1, -1}), {1}) : at::empty({0}, pooled.options());
    return {pooled, out};
}

Outputs forward_cpu(const at::Tensor &x_in, const at::Tensor &weight_in,
                    const OptTensor &conv_bias_in, const OptTensor &bias_in, double divisor,
                    at::IntArrayRef pool, bool tf32)
{
    (void)tf32; /* the CPU path is always FP32 */
    check_args(x_in, weight_in, conv_bias_in, bias_in, pool);
    const auto dt = x_in.scalar_type();
    CP_CHECK_DTYPE(dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16,
                   "x must be float32, float16 or bfloat16 on the CPU kernel, got ", dt);
    CpuCall c = prepare_cpu(x_in, weight_in, conv_bias_in, bias_in, divisor, pool);
    if (cpu_conv_route(c.p))
        return forward_cpu_conv(c);
    const convpool_status s = convpool_forward_cpu(
        &c.p, c.x.data_ptr<float>(), c.weight.data_ptr<float>(), float_ptr_or_null(c.conv_bias),
        float_ptr_or_null(c.bias), c.pooled.data_ptr<float>(), out_ptr(c.out, c.bias),
        at::get_num_threads());
    if (s != CONVPOOL_OK)
        throw_status(s, "convpool_forward_cpu");
    return {c.pooled, c.out};
}

Outputs reference_cpu(const at::Tensor &x_in, const at::Tensor &weight_in,
                      const OptTensor &conv_bias_in, const OptTensor &bias_in, double divisor,
                      at::IntArrayRef pool)
{
    check_args(x_in, weight_in, conv_bias_in, bias_in, pool);
    CpuCall c = prepare_cpu(x_in, weight_in, conv_bias_in, bias_in, divisor, pool);
    const convpool_status s = convpool_forward_reference(
        &c.p, c.x.data_ptr<float>(), c.weight.data_ptr<float>(), float_ptr_or_null(c.conv_bias),
        float_ptr_or_null(c.bias), c.pooled.data_ptr<float>(), out_ptr(c.out, c.bias));
    if (s != CONVPOOL_OK)
        throw_status(s, "convpool_forward_reference");
    return {c.pooled, c.out};
}

std::string explain_cpu(const at::Tensor &x, const at::Tensor &weight, at::IntArrayRef pool, double divisor,
                        bool tf32)
{
    (void)tf32;
    check_args(x, weight, std::nullopt, std::nullopt, pool);
    const convpool_problem p = make_problem(x, weight, pool, divisor);
    std::string why;
    if (cpu_conv_route(p, &why))
        return cp_message("cpu: PyTorch's conv3d, then convpool's divide and max pool (tail_train), ",
                          at::get_num_threads(), " threads (", why, ")");
    return cp_message("cpu: fused float32 path (convpool_forward_cpu), ", at::get_num_threads(), " threads (", why,
                      ")");
}

/* ---- training: the fused backward from arg-max codes (CPU and CUDA) ---- */

/* The codes' dtype: unsigned 1-, 2- or 4-byte integers (convpool_code_bytes), held as uint8,
 * int16 and int32 tensors (the kernels read the bits as unsigned). */
at::ScalarType code_dtype(const convpool_problem &p)
{
    const int cb = convpool_code_bytes(&p);
    return cb == 1 ? at::kByte : cb == 2 ? at::kShort : at::kInt;
}

/* The dense backward: conv -> / divisor -> max pool recomputed with PyTorch ops and
 * backpropagated, as autograd does for Model. For non-finite inputs (and any dtype). */
std::tuple<at::Tensor, at::Tensor, at::Tensor>
dense_backward(const at::Tensor &x, const at::Tensor &weight, const OptTensor &conv_bias, const at::Tensor &grad,
               double divisor, at::IntArrayRef pool, std::array<bool, 3> need)
{
    const at::Tensor y = at::conv3d(x, weight, conv_bias) / divisor;
    const std::vector<int64_t> zero{0, 0, 0}, one{1, 1, 1};
    auto [pooled, indices] = at::max_pool3d_with_indices(y, pool, pool, zero, one, false);
    const double count = (double)(pooled.size(2) * pooled.size(3) * pooled.size(4));
    const at::Tensor gmap = (grad / count).view({grad.size(0), grad.size(1), 1, 1, 1}).expand(pooled.sizes());
    const at::Tensor gy = at::max_pool3d_with_indices_backward(gmap, y, pool, pool, zero, one, false, indices) / divisor;
    const bool has_cb = conv_bias.has_value() && conv_bias->defined();
    const std::vector<int64_t> bias_sizes{weight.size(0)};
    auto r = at::convolution_backward(gy, x, weight, has_cb ? at::OptionalIntArrayRef(bias_sizes) : at::OptionalIntArrayRef(),
                                      one, zero, one, false, zero, 1, {need[0], need[1], need[2] && has_cb});
    const at::Tensor none = at::empty({0}, x.options());
    return {need[0] ? std::get<0>(r) : none, need[1] ? std::get<1>(r) : none, need[2] && has_cb ? std::get<2>(r) : none};
}

/* The arguments of both fused backwards, checked and converted once: float32 x and weight,
 * dense, the incoming gradients (either may be absent), and what autograd asks for. */
struct BackwardArgs {
    convpool_problem p;
    at::Tensor x, weight, conv_bias, gp, go, none;
    /* go's element stride: 1 (dense), or 0 on CUDA for autograd's expand of one value over the
     * batch (out.sum()'s gradient), which the CUDA backward reads in place, with no copy. */
    int64_t go_stride = 1;
    at::TensorOptions opts;
    bool has_cb;
    std::array<bool, 3> need; /* grad_x, grad_weight, grad_conv_bias */
    double divisor;
    std::vector<int64_t> pool;
    bool tf32; /* the forward's precision, which the CUDA weight gradient follows (the CPU is FP32) */

    bool nothing_needed() const { return !need[0] && !need[1] && !(need[2] && has_cb); }

    /* Whether x and the weights are all finite (their sum overflowing counts as not): the CPU
     * fused backward's condition; the dense formula takes the rest. (The CUDA backward finds
     * them on the device and needs no such read.) */
    at::Tensor finite() const { return at::isfinite(x.sum() + weight.sum()); }

    /* Every gradient by the dense PyTorch-ops formula (non-finite inputs, or a problem the
     * fused kernels do not take). */
    std::tuple<at::Tensor, at::Tensor, at::Tensor> dense() const
    {
        at::Tensor grad = gp.defined() ? gp : at::zeros({p.batch, p.out_channels}, opts);
        if (go.defined())
            grad = grad + go.unsqueeze(1);
        return dense_backward(x, weight, has_cb ? OptTensor(conv_bias) : std::nullopt, grad, divisor, pool, need);
    }

    /* grad_bias of out = sum_c (P + bias) as Model's autograd forms it: grad_out broadcast over
     * the channels and summed over the batch (its reduction, its bits); zeros without grad_out. */
    at::Tensor model_bias_grad() const
    {
        return go.defined() ? go.reshape({-1, 1}).expand({p.batch, p.out_channels}).sum(0)
                            : at::zeros({p.out_channels}, opts);
    }

    at::Tensor new_codes() const
    {
        return at::empty({p.batch, p.out_channels, p.pooled_d, p.pooled_h, p.pooled_w}, x.options().dtype(code_dtype(p)));
    }

    /* The requested gradients' outputs, an empty (0,) tensor for the others. */
    std::tuple<at::Tensor, at::Tensor, at::Tensor> new_grads() const
    {
        return {need[0] ? at::empty(x.sizes(), opts) : none, need[1] ? at::empty(weight.sizes(), opts) : none,
                need[2] && has_cb ? at::empty({p.out_channels}, opts) : none};
    }
};

BackwardArgs backward_args(const at::Tensor &x_in, const at::Tensor &weight_in, const OptTensor &conv_bias_in,
                           const OptTensor &grad_pooled_in, const OptTensor &grad_out_in, double divisor,
                           at::IntArrayRef pool, bool need_x, bool need_w, bool need_cb, bool tf32)
{
    check_args(x_in, weight_in, conv_bias_in, std::nullopt, pool);
    CP_CHECK_DTYPE(x_in.scalar_type() == at::kFloat && weight_in.scalar_type() == at::kFloat,
                   "the fused backward takes float32 x and weight, got ", x_in.scalar_type(), " and ",
                   weight_in.scalar_type());
    BackwardArgs a;
    a.p = make_problem(x_in, weight_in, pool, divisor);
    a.x = x_in.contiguous();
    a.weight = as_float_dense(weight_in);
    a.has_cb = conv_bias_in.has_value() && conv_bias_in->defined();
    a.conv_bias = a.has_cb ? as_float_dense(*conv_bias_in) : at::Tensor();
    a.opts = a.x.options().dtype(at::kFloat);
    a.gp = grad_pooled_in.has_value() && grad_pooled_in->defined() ? as_float_dense(*grad_pooled_in) : at::Tensor();
    if (grad_out_in.has_value() && grad_out_in->defined()) {
        const at::Tensor &g = *grad_out_in;
        if (x_in.is_cuda() && g.scalar_type() == at::kFloat && g.dim() == 1 && g.numel() > 1 && g.stride(0) == 0) {
            a.go = g; /* read in place at stride 0 (convpool_backward_cuda_strided) */
            a.go_stride = 0;
        } else {
            a.go = as_float_dense(g);
        }
    }
    /* The kernels read batch x out_channels values of grad_pooled and batch of grad_out through
     * raw pointers on x's device: anything else is refused here, before it is read. */
    if (a.gp.defined()) {
        check_same_device(a.gp, "grad_pooled", x_in);
        CP_CHECK_ARG(a.gp.dim() == 2 && a.gp.size(0) == a.p.batch && a.gp.size(1) == a.p.out_channels,
                     "grad_pooled must have shape (batch, out_channels) = (", a.p.batch, ", ", a.p.out_channels,
                     "), got ", a.gp.sizes());
    }
    if (a.go.defined()) {
        check_same_device(a.go, "grad_out", x_in);
        CP_CHECK_ARG(a.go.dim() == 1 && a.go.size(0) == a.p.batch, "grad_out must have shape (batch,) = (",
                     a.p.batch, ",), got ", a.go.sizes());
    }
    a.none = at::empty({0}, a.opts);
    a.need = {need_x, need_w, need_cb};
    a.divisor = divisor;
    a.pool = pool.vec();
    a.tf32 = tf32;
    return a;
}

/* codes as the training forward writes them for a's problem (backward_codes' argument). */
void check_codes(const BackwardArgs &a, const at::Tensor &codes)
{
    TORCH_CHECK(codes.device() == a.x.device() && codes.scalar_type() == code_dtype(a.p) && codes.is_contiguous() &&
                    codes.numel() == a.p.batch * a.p.out_channels * a.p.pooled_d * a.p.pooled_h * a.p.pooled_w,
                "codes: the training forward's codes for this problem are expected, got ", codes.sizes(), " ",
                codes.scalar_type());
}

/* The fused CPU backward from a problem's codes (convpool_backward_cpu): the gradients a asks
 * for, the others empty. Shared by backward_cpu (codes found from x) and backward_codes_cpu
 * (codes from the training forward). */
std::tuple<at::Tensor, at::Tensor, at::Tensor> grads_from_codes_cpu(const BackwardArgs &a, const at::Tensor &codes)
{
    auto [gx, gw, gcb] = a.new_grads();
    const convpool_status s = convpool_backward_cpu(
        &a.p, a.x.data_ptr<float>(), a.weight.data_ptr<float>(), codes.data_ptr(), float_ptr_or_null(a.gp),
        float_ptr_or_null(a.go), a.need[0] ? gx.data_ptr<float>() : nullptr, a.need[1] ? gw.data_ptr<float>() : nullptr,
        gcb.numel() ? gcb.data_ptr<float>() : nullptr, at::get_num_threads());
    if (s != CONVPOOL_OK)
        throw_status(s, "convpool_backward_cpu");
    return {gx, gw, gcb};
}

/* The CPU twin of backward_cuda: the codes straight from x (convpool_codes_cpu: the forward's
 * microkernels, no conv output in memory) and the gradients from them (convpool_backward_cpu;
 * OpenMP, bit-identical for any thread count); the dense formula for non-finite x or weights. */
std::tuple<at::Tensor, at::Tensor, at::Tensor>
backward_cpu(const at::Tensor &x_in, const at::Tensor &weight_in, const OptTensor &conv_bias_in,
             const OptTensor &grad_pooled_in, const OptTensor &grad_out_in, double divisor, at::IntArrayRef pool,
             bool need_x, bool need_w, bool need_cb, bool tf32)
{
    const BackwardArgs a = backward_args(x_in, weight_in, conv_bias_in, grad_pooled_in, grad_out_in, divisor, pool,
                                         need_x, need_w, need_cb, tf32);
    if (a.nothing_needed())
        return {a.none, a.none, a.none};
    if (!a.finite().item<bool>())
        return a.dense();
    at::Tensor codes = a.new_codes();
    convpool_status s = convpool_codes_cpu(&a.p, a.x.data_ptr<float>(), a.weight.data_ptr<float>(),
                                           float_ptr_or_null(a.conv_bias), codes.data_ptr(), at::get_num_threads());
    if (s != CONVPOOL_OK)
        throw_status(s, "convpool_codes_cpu");
    return grads_from_codes_cpu(a, codes);
}

/* The CPU training forward: the forward's pooled and out (bit for bit) and the arg-max codes
 * from the same pass (convpool_forward_train_cpu), which backward_codes_cpu then takes instead
 * of finding them again. float32 x and weights (the fused backward's domain). */
std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_train_cpu(const at::Tensor &x_in, const at::Tensor &weight_in,
                                                                 const OptTensor &conv_bias_in,
                                                                 const OptTensor &bias_in, double divisor,
                                                                 at::IntArrayRef pool, bool tf32)
{
    (void)tf32; /* the CPU path is always FP32 */
    check_args(x_in, weight_in, conv_bias_in, bias_in, pool);
    CP_CHECK_DTYPE(x_in.scalar_type() == at::kFloat && weight_in.scalar_type() == at::kFloat,
                   "the training forward takes float32 x and weight, got ", x_in.scalar_type(), " and ",
                   weight_in.scalar_type());
    CpuCall c = prepare_cpu(x_in, weight_in, conv_bias_in, bias_in, divisor, pool);
    at::Tensor codes = at::empty({c.p.batch, c.p.out_channels, c.p.pooled_d, c.p.pooled_h, c.p.pooled_w},
                                 c.x.options().dtype(code_dtype(c.p)));
    const convpool_status s = convpool_forward_train_cpu(
        &c.p, c.x.data_ptr<float>(), c.weight.data_ptr<float>(), float_ptr_or_null(c.conv_bias),
        float_ptr_or_null(c.bias), c.pooled.data_ptr<float>(), out_ptr(c.out, c.bias), codes.data_ptr(),
        at::get_num_threads());
    if (s != CONVPOOL_OK)
        throw_status(s, "convpool_forward_train_cpu");
    return {c.pooled, c.out, codes};
}

/* backward_cpu with the training forward's codes; need_bias: grad_bias too (out's bias, Model's
 * reduction of grad_out), else an empty (0,) tensor. */
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>
backward_codes_cpu(const at::Tensor &x_in, const at::Tensor &weight_in, const OptTensor &conv_bias_in,
                   const at::Tensor &codes, const OptTensor &grad_pooled_in, const OptTensor &grad_out_in,
                   double divisor, at::IntArrayRef pool, bool need_x, bool need_w, bool need_cb, bool tf32,
                   bool need_bias)
{
    const BackwardArgs a = backward_args(x_in, weight_in, conv_bias_in, grad_pooled_in, grad_out_in, divisor, pool,
                                         need_x, need_w, need_cb, tf32);
    const at::Tensor gb = need_bias ? a.model_bias_grad() : a.none;
    if (a.nothing_needed())
        return {a.none, a.none, a.none, gb};
    check_codes(a, codes);
    auto [gx, gw, gcb] = a.finite().item<bool>() ? grads_from_codes_cpu(a, codes) : a.dense();
    return {gx, gw, gcb, gb};
}

/* The library's dtype of a tensor's; TypeError naming the tensor (name) and where (what) for any
 * other. */
convpool_dtype library_dtype(at::ScalarType dt, const char *name = "x", const char *what = " on the CUDA kernel")
{
    switch (dt) {
    case at::kFloat: return CONVPOOL_DTYPE_F32;
    case at::kHalf: return CONVPOOL_DTYPE_F16;
    case at::kBFloat16: return CONVPOOL_DTYPE_BF16;
    default: break;
    }
    CP_CHECK_DTYPE(false, name, " must be float32, float16 or bfloat16", what, ", got ", dt);
    return CONVPOOL_DTYPE_F32;
}

#if CP_WITH_CUDA
/* The library's precision for PyTorch's TF32 flag as the op received it, for problem p with x
 * of dtype: what Model's nn.Conv3d really runs. Allowing TF32 lets cuDNN choose it, and cuDNN
 * keeps an FP32 kernel for float32 convolutions of up to CP_CUDNN_FP32_MAX_CIN input channels
 * (bench/cudnn_tf32_probe.py, cuDNN 9.19 on an H200: errors against float64 ~1e-7 at Cin 1-3
 * and ~2.5e-4 from Cin 4, for kernels 3^3, 5^3 and 1x3x3 and Cout 16 and 32). Model's conv
 * output, its pooled means and its arg-max picks are FP32's there, so convpool runs strict:
 * TF32 sums would put its output 500x and, through flipped near-tied arg-maxes, its
 * gradients ~100x further from float64 than Model's (an RGB first layer, the commonest
 * Cin 3). 16-bit x is exact in TF32 and keeps it. */
#ifndef CP_CUDNN_FP32_MAX_CIN
#define CP_CUDNN_FP32_MAX_CIN 3
#endif
convpool_precision cuda_precision(const convpool_problem &p, convpool_dtype dtype, bool tf32)
{
    const bool fp32_conv = dtype == CONVPOOL_DTYPE_F32 && p.in_channels <= CP_CUDNN_FP32_MAX_CIN;
    return tf32 && !fp32_conv ? CONVPOOL_PRECISION_TF32 : CONVPOOL_PRECISION_STRICT;
}
/* The training paths' (float32 operands; 16-bit models train on float32 upcasts, so at Cin <= 3
 * they run strict too, where TF32 would already be exact on their 16-bit values: slower than
 * needed, not less accurate). */
convpool_precision cuda_precision(const convpool_problem &p, bool tf32)
{
    return cuda_precision(p, CONVPOOL_DTYPE_F32, tf32);
}

/* x as the kernel reads it: dense, and 16-byte aligned (a sliced view may not be). */
at::Tensor dense_aligned(const at::Tensor &x)
{
    at::Tensor d = x.is_contiguous() ? x : x.contiguous();
    if (reinterpret_cast<std::uintptr_t>(d.data_ptr()) % 16 != 0)
        d = d.clone();
    return d;
}

/* torch.backends.cudnn.allow_tf32: 1 or 0, or -1 where the legacy getter throws (it does once
 * the fp32_precision API was mixed in), which matches neither value of an op's tf32 argument. */
int cudnn_tf32_flag()
{
    try {
        return at::globalContext().allowTF32CuDNN() ? 1 : 0;
    } catch (const std::exception &) {
        return -1;
    }
}

/* How the binding runs a CUDA problem: convpool's fused kernel (the plan's family), or cuDNN's
 * conv3d writing y followed by convpool's pooling kernel (src/cuda/finish.cu), where cuDNN's
 * convolution is faster than the fused kernel. The rule comes from measurements (docs/
 * BENCHMARKS.md, "fused or cuDNN"): the fused kernels win while the block is bound by memory
 * traffic, which they cut to one read of x; cuDNN wins once Cin * Cout and the kernel volume
 * make it bound by the convolution's arithmetic, and always over the scalar generic kernel.
 * CONVPOOL_TORCH_PATH=fused|cudnn forces one of the two (tests and benchmarks). True: the
 * cuDNN route; why, where given, gets the reason (explain). */
bool choose_route(const convpool_problem &p, convpool_cuda_kernel kernel, bool tf32, convpool_precision precision,
                  std::string *why = nullptr)
{
    /* The fused kernel's precision decides against cuDNN (cuda_precision: strict where cuDNN's
     * own conv is FP32 although TF32 is allowed); the flag itself decides whether cuDNN may run. */
    const bool strict = precision == CONVPOOL_PRECISION_STRICT;
    const auto route = [why](bool cudnn, const char *reason) { return routed(why, cudnn, reason); };
    const char *forced = forced_route();
    const bool force_fused = std::strcmp(forced, "fused") == 0;
    const bool force_cudnn = std::strcmp(forced, "cudnn") == 0;
    /* cuDNN follows the global flag; the op's tf32 argument must agree for it to be used (an
     * unreadable flag never agrees: then stay fused). */
    const bool flag_matches = cudnn_tf32_flag() == (tf32 ? 1 : 0);
    if (force_fused)
        return route(false, "forced by CONVPOOL_TORCH_PATH=fused");
    if (force_cudnn && flag_matches)
        return route(true, "forced by CONVPOOL_TORCH_PATH=cudnn");
    if (!flag_matches)
        return route(false, "the op's tf32 argument differs from torch.backends.cudnn.allow_tf32");
    if (kernel == CONVPOOL_CUDA_KERNEL_GENERIC)
        return route(true, "only the scalar generic kernel could fuse this shape");
    /* Strict: cuDNN's FP32 convolution runs on the CUDA cores, the fused 3xTF32 one on the
     * tensor cores; the group kernel measured faster at the widest shape tried (H100: Cin 64 ->
     * Cout 128 at 8x64x16x32x32, 0.97 against 1.14 ms for cuDNN's conv and convpool's pooling).
     * The general kernel is bound by instruction issue (a third of group's rate at narrow
     * channels) and was not measured wide: it keeps the width rule below. */
    if (strict && (kernel == CONVPOOL_CUDA_KERNEL_K3P2 || kernel == CONVPOOL_CUDA_KERNEL_GROUP))
        return route(false, "strict FP32: the fused 3xTF32 tensor-core kernel beats cuDNN's FP32 convolution");
    /* Strict on the general kernel: 2.2-2.3x eager at Cin x Cout 128 (kernel 5, 1x7x7), but parity
     * at 512 (16 -> 32, pool 3: 0.260 against eager's 0.264 ms at b16) and 0.83x at 1024 (32 -> 32,
     * kernel 5: 1.284 against 1.066 at b8; H200, twenty-first session, bench_shapes rows
     * c16_c32_pool3 and c32_c32_k5): its 3xTF32 sums are issue-bound, and the wider the channels
     * the more of them a conv output costs against cuDNN's FP32 kernel. */
    if (strict && kernel == CONVPOOL_CUDA_KERNEL_GENERAL &&
        (int64_t)p.in_channels * p.out_channels >= CP_CUDNN_STRICT_GENERAL_MIN_CHANNELS) {
        if (why)
            *why = cp_message("strict FP32 on the general kernel at Cin x Cout ", (int64_t)p.in_channels * p.out_channels,
                              ": cuDNN's FP32 convolution is faster there");
        return true;
    }
    const double k = (double)p.in_channels * (double)(p.kernel_d * p.kernel_h * p.kernel_w);
    const double wide = (double)p.out_channels * k;
    if (p.out_channels >= CP_CUDNN_MIN_COUT && wide >= CP_CUDNN_MIN_MACS_PER_OUTPUT) {
        if (why)
            *why = cp_message("Cout ", p.out_channels, " x Cin*kernel volume ", (int64_t)k,
                              " is compute-bound: cuDNN's convolution is faster there");
        return true;
    }
    return route(false, "the fused kernel reads x once and never writes the conv output");
}

/* The plan of the fused path for this call (throws on bad arguments). */
convpool_cuda_plan cuda_plan(const convpool_problem &p, convpool_precision precision, convpool_dtype dtype)
{
    convpool_cuda_plan plan;
    const convpool_status s = convpool_cuda_plan_make(&p, precision, dtype, &plan);
    if (s != CONVPOOL_OK)
        throw_status(s, "convpool_cuda_plan_make");
    return plan;
}

/* The plan's kernel and workspace size, cached per (sizes, precision, dtype, device, forced
 * kernel): making a plan formats its description, which a per-call path should not pay. */
struct PlanKey {
    std::array<int64_t, 15> v;
    std::string forced;
    bool operator==(const PlanKey &o) const { return v == o.v && forced == o.forced; }
};
struct PlanKeyHash {
    size_t operator()(const PlanKey &k) const
    {
        size_t h = std::hash<std::string>()(k.forced);
        for (int64_t x : k.v)
            h = h * 1000003u ^ std::hash<int64_t>()(x);
        return h;
    }
};
struct CachedPlan {
    convpool_cuda_kernel kernel;
    size_t workspace_bytes;
};

CachedPlan cached_plan(const convpool_problem &p, convpool_precision precision, convpool_dtype dtype, int device)
{
    static std::mutex mu;
    static std::unordered_map<PlanKey, CachedPlan, PlanKeyHash> cache;
    const char *forced = std::getenv("CONVPOOL_CUDA_KERNEL");
    PlanKey key{{p.batch, p.in_channels, p.out_channels, p.in_d, p.in_h, p.in_w, p.kernel_d, p.kernel_h, p.kernel_w,
                 p.pool_d, p.pool_h, p.pool_w, (int64_t)precision, (int64_t)dtype, (int64_t)device},
                forced ? forced : ""};
    {
        const std::lock_guard<std::mutex> lock(mu);
        const auto it = cache.find(key);
        if (it != cache.end())
            return it->second;
    }
    const convpool_cuda_plan plan = cuda_plan(p, precision, dtype);
    const CachedPlan c{plan.kernel, plan.workspace_bytes};
    const std::lock_guard<std::mutex> lock(mu);
    if (cache.size() >= 4096) /* shapes that keep changing: start over rather than grow */
        cache.clear();
    cache.emplace(std::move(key), c);
    return c;
}

/* cuDNN conv3d (conv bias included) in float32, then the pooling kernel. In TF32, x and the
 * weights go channels-last first: cuDNN's TF32 convolution measured 28-32% faster on
 * channels-last tensors at the widths this route serves (H100, 8x64x16x32x32 -> 128: 0.185
 * against 0.256 ms), more than the 0.04 ms the conversion of x costs, and pool_cl_kernel reads
 * the channels-last output directly. The whole route there: 0.294 against 0.311 ms of device
 * time (bench_shapes, batch 8). Strict FP32 measured slower channels-last (1.15 against 1.08
 * ms) and keeps the dense layout. */
Outputs forward_cudnn(const at::Tensor &x_in, const at::Tensor &weight_in, const at::Tensor &conv_bias,
                      const at::Tensor &bias, const convpool_problem &p, bool tf32)
{
    const auto cl = at::MemoryFormat::ChannelsLast3d;
    const std::optional<at::Tensor> cb = conv_bias.defined() ? std::optional<at::Tensor>(conv_bias) : std::nullopt;
    at::Tensor y;
    bool channels_last = false;
    if (tf32) {
        y = at::conv3d(x_in.to(at::kFloat).contiguous(cl), as_float_dense(weight_in).contiguous(cl), cb);
        channels_last = y.is_contiguous(cl);
        if (!channels_last)
            y = y.contiguous();
    } else {
        y = at::conv3d(x_in.to(at::kFloat), as_float_dense(weight_in), cb).contiguous();
    }
    auto [pooled, out] = make_outputs(y, p, bias.defined());
    size_t ws_bytes = 0;
    convpool_status s = channels_last ? convpool_cuda_pool_cl_workspace_size(&p, &ws_bytes)
                                      : convpool_cuda_pool_workspace_size(&p, &ws_bytes);
    if (s != CONVPOOL_OK)
        throw_status(s, "convpool_cuda_pool_workspace_size");
    const at::Tensor workspace = at::empty({static_cast<int64_t>(ws_bytes)}, y.options().dtype(at::kByte));
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(y.device().index()).stream();
    s = channels_last ? convpool_pool_forward_cl_cuda(&p, y.data_ptr<float>(), float_ptr_or_null(bias),
                                                      pooled.data_ptr<float>(), out_ptr(out, bias),
                                                      workspace.data_ptr(), ws_bytes, stream)
                      : convpool_pool_forward_cuda(&p, y.data_ptr<float>(), float_ptr_or_null(bias),
                                                   pooled.data_ptr<float>(), out_ptr(out, bias), workspace.data_ptr(),
                                                   ws_bytes, stream);
    if (s != CONVPOOL_OK)
        throw_status(s, channels_last ? "convpool_pool_forward_cl_cuda" : "convpool_pool_forward_cuda");
    return {pooled, out};
}

/* A CUDA call's problem, its modes, the fused plan and whether the call takes the cuDNN route,
 * after the argument checks; the caller holds the device guard. */
struct CudaCall {
    convpool_problem p;
    convpool_dtype dtype;
    convpool_precision precision;
    CachedPlan plan;
    bool cudnn;
};

/* The checks come before guard moves to x's device: a CPU x must get check_args' error that
 * names it, not the guard's (test_errors_leave_the_context_usable). */
CudaCall prepare_cuda(const at::Tensor &x, const at::Tensor &weight, const OptTensor &conv_bias,
                      const OptTensor &bias, double divisor, at::IntArrayRef pool, bool tf32,
                      c10::cuda::OptionalCUDAGuard &guard)
{
    check_args(x, weight, conv_bias, bias, pool);
    guard.set_device(x.device());
    CudaCall c;
    c.dtype = library_dtype(x.scalar_type());
    c.p = make_problem(x, weight, pool, divisor);
    c.precision = cuda_precision(c.p, c.dtype, tf32);
    c.plan = cached_plan(c.p, c.precision, c.dtype, x.device().index());
    c.cudnn = choose_route(c.p, c.plan.kernel, tf32, c.precision);
    return c;
}

Outputs forward_cuda(const at::Tensor &x_in, const at::Tensor &weight_in,
                     const OptTensor &conv_bias_in, const OptTensor &bias_in, double divisor,
                     at::IntArrayRef pool, bool tf32)
{
    c10::cuda::OptionalCUDAGuard guard;
    const CudaCall call = prepare_cuda(x_in, weight_in, conv_bias_in, bias_in, divisor, pool, tf32, guard);
    const convpool_problem &p = call.p;
    const at::Tensor conv_bias = channel_vector(conv_bias_in);
    const at::Tensor bias = channel_vector(bias_in);
    if (call.cudnn)
        return forward_cudnn(x_in, weight_in, conv_bias, bias, p, tf32);

    const size_t ws_bytes = call.plan.workspace_bytes;
    const at::Tensor x = dense_aligned(x_in);
    const at::Tensor weight = as_float_dense(weight_in);
    auto [pooled, out] = make_outputs(x, p, bias.defined());
    at::Tensor workspace;
    if (ws_bytes > 0)
        workspace = at::empty({static_cast<int64_t>(ws_bytes)}, x.options().dtype(at::kByte));

    const convpool_status s =
        convpool_forward_cuda(&p, call.precision, call.dtype, x.data_ptr(), weight.data_ptr<float>(),
                              float_ptr_or_null(conv_bias), float_ptr_or_null(bias), pooled.data_ptr<float>(),
                              out_ptr(out, bias), workspace.defined() ? workspace.data_ptr() : nullptr, ws_bytes,
                              at::cuda::getCurrentCUDAStream(x.device().index()).stream());
    if (s != CONVPOOL_OK)
        throw_status(s, "convpool_forward_cuda");
    return {pooled, out};
}

/* block_inference on the fused path in one C call, where its arguments allow: weight, conv bias
 * and bias dense and of x's dtype, bias one value per channel. float32 runs
 * convpool_forward_cuda; float16/bfloat16 convpool_forward_cuda_lowp, which widens the
 * parameters inside the workspace and rounds the block's tail in the finishing kernel as
 * block()'s ATen steps round it (P -> dtype, + bias, sum), so the result is theirs bit for bit
 * (test_fast_path_is_block_bit_for_bit) without their five launches and allocations, which cost
 * a 16-bit call ~40-70 us of host time on the H100 host (61-109 us against 24-38 for float32).
 * Two allocations, neither through the dispatcher: out (at::detail::empty_cuda, what
 * at::empty's CUDA kernel runs) and one block of the caching allocator for the workspace and P,
 * held by its DataPtr until the call returns (freed on the current stream, as a tensor's
 * storage would be; graph capture takes it from the graph's pool the same way). Returns an
 * undefined tensor where it does not apply (the cuDNN route, other dtypes or layouts of the
 * parameters); the caller then takes the general steps. */
at::Tensor block_fused_cuda(const at::Tensor &x_in, const at::Tensor &weight, const OptTensor &conv_bias,
                            const at::Tensor &bias, double divisor, at::IntArrayRef pool, bool tf32)
{
    const at::ScalarType dt = x_in.scalar_type();
    const auto usable = [dt](const at::Tensor &t) { return t.scalar_type() == dt && t.is_contiguous(); };
    if (!usable(weight) || !usable(bias) || (conv_bias.has_value() && !usable(*conv_bias)))
        return at::Tensor();
    c10::cuda::OptionalCUDAGuard guard;
    const CudaCall call = prepare_cuda(x_in, weight, conv_bias, bias, divisor, pool, tf32, guard);
    if (bias.numel() != weight.size(0) || call.cudnn)
        return at::Tensor();
    const convpool_problem &p = call.p;
    const convpool_dtype dtype = call.dtype;
    const convpool_precision precision = call.precision;
    const at::Tensor x = dense_aligned(x_in);
    const int64_t ws_bytes = (static_cast<int64_t>(call.plan.workspace_bytes) + 15) / 16 * 16;
    const c10::DataPtr buf = c10::cuda::CUDACachingAllocator::get()->allocate(
        static_cast<size_t>(ws_bytes + p.batch * p.out_channels * (int64_t)sizeof(float)));
    at::Tensor out = at::detail::empty_cuda({p.batch, 1, 1, 1}, dt, x.device(), std::nullopt);
    unsigned char *base = static_cast<unsigned char *>(buf.get());
    float *pooled = reinterpret_cast<float *>(base + ws_bytes);
    const void *cb = conv_bias.has_value() ? conv_bias->data_ptr() : nullptr;
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(x.device().index()).stream();
    const convpool_status s =
        dt == at::kFloat
            ? convpool_forward_cuda(&p, precision, dtype, x.data_ptr(), weight.data_ptr<float>(),
                                    static_cast<const float *>(cb), bias.data_ptr<float>(), pooled,
                                    out.data_ptr<float>(), base, static_cast<size_t>(ws_bytes), stream)
            : convpool_forward_cuda_lowp(&p, precision, dtype, x.data_ptr(), weight.data_ptr(), cb, bias.data_ptr(),
                                         pooled, out.data_ptr(), base, static_cast<size_t>(ws_bytes), stream);
    if (s != CONVPOOL_OK)
        throw_status(s, dt == at::kFloat ? "convpool_forward_cuda" : "convpool_forward_cuda_lowp");
    return out;
}

#endif

/* out (B,), freshly allocated here, reshaped in place to the block's output shape (B, 1, 1, 1).
 * Not a view: autograd forbids in-place changes to a view returned from a custom Function, and
 * ModelNew's training call returns this tensor (Model's output is not a view either). */
void as_block_shape(at::Tensor &out)
{
    out.resize_({out.size(0), 1, 1, 1});
}

/* forward_cpu or forward_cuda: the device's forward, which the inference ops wrap. */
using ForwardFn = Outputs (*)(const at::Tensor &, const at::Tensor &, const OptTensor &, const OptTensor &, double,
                              at::IntArrayRef, bool);

/* forward_inference's out is the block's own output shape, (B, 1, 1, 1), when bias is given:
 * the module returns it as is (a Python view costs ~1 us per call). */
template <ForwardFn Forward>
Outputs forward_inference(const at::Tensor &x, const at::Tensor &weight, const OptTensor &conv_bias,
                          const OptTensor &bias, double divisor, at::IntArrayRef pool, bool tf32)
{
    auto [pooled, out] = Forward(x, weight, conv_bias, bias, divisor, pool, tf32);
    if (bias.has_value())
        as_block_shape(out);
    return {pooled, out};
}

/* block()'s tail for a 16-bit block on float32 pooled means (B, C): rounded to dt, plus the bias
 * (one value per channel, dt), summed over the channels, as the ATen ops block() runs in Python
 * round it; (B, 1, 1, 1). */
at::Tensor lowp_tail(const at::Tensor &pooled, const at::Tensor &bias, at::ScalarType dt)
{
    return at::sum(pooled.to(dt).view({pooled.size(0), pooled.size(1), 1, 1, 1}) + bias, {1});
}

/* The block's output for the common call, sum over the channels with a per-channel bias (the
 * caller checked that it broadcasts so): float32 x through the fused out; float16/bfloat16 x
 * (weights and bias of x's dtype) through the pooled means, rounded to x's dtype and finished by
 * the same ATen ops block() runs in Python, so the result is that path's, bit for bit, with ~100
 * us less host time (the Python path's checks and per-op dispatch). On CUDA, block_fused_cuda
 * runs the fused path's calls in one C call with the same result. */
template <ForwardFn Forward>
at::Tensor block_inference(const at::Tensor &x, const at::Tensor &weight, const OptTensor &conv_bias,
                           const at::Tensor &bias, double divisor, at::IntArrayRef pool, bool tf32)
{
#if CP_WITH_CUDA
    if constexpr (Forward == &forward_cuda) {
        at::Tensor out = block_fused_cuda(x, weight, conv_bias, bias, divisor, pool, tf32);
        if (out.defined())
            return out;
    }
#endif
    if (x.scalar_type() == at::kFloat) {
        CP_CHECK_DTYPE(bias.scalar_type() == at::kFloat, "bias must be float32 for float32 x, got ",
                       bias.scalar_type());
        return std::get<1>(forward_inference<Forward>(x, weight, conv_bias, bias, divisor, pool, tf32));
    }
    return lowp_tail(std::get<0>(Forward(x, weight, conv_bias, std::nullopt, divisor, pool, tf32)), bias,
                     x.scalar_type());
}

#if CP_WITH_CUDA
/* Whether the fused forward writes this problem's arg-max codes itself (the op's tf32 argument
 * agreeing with torch's cuDNN flag; float32 x): the plan's k3p2 with pool 2^3, or its general
 * kernel where the inference forward runs it too (wide channels go to cuDNN, where the
 * recompute is the faster way to the codes). Near-ties are recomputed: in TF32 the general
 * kernel's in FP32 (general.cu; TF32 picks alone failed test_gradients_vs_float64 at Cin 3,
 * grad_x 4.4% off float64 where eager's cuDNN, FP32 there, was 8e-8); in strict mode every
 * kernel's in double, so the codes are those of the correctly rounded FP32 conv (k3p2.cu). (A
 * general tile whose arg-max state does not fit shared memory is refused: find_codes_cuda then
 * recomputes.)
 * Strict codes came from a cuDNN recompute until 2026-11-27, chosen so that near-ties broke as
 * Model's FP32 conv breaks them (3xTF32 picks without the recheck flipped a window of a 4-step
 * SGD test). That recompute was 4.2 of the 6.9 ms strict step at the headline; the correctly
 * rounded pick is at least as close to float64 as cuDNN's, and cuDNN's own picks change with
 * its algorithm (cudnn.benchmark, GPU, version), so no pick can promise Model's bits. */
bool codes_from_fused_forward(const convpool_problem &p, bool tf32, int device)
{
    if (cudnn_tf32_flag() != (tf32 ? 1 : 0))
        return false;
    const convpool_precision precision = cuda_precision(p, tf32);
    const convpool_cuda_kernel k = cached_plan(p, precision, CONVPOOL_DTYPE_F32, device).kernel;
    if (k == CONVPOOL_CUDA_KERNEL_K3P2)
        return p.pool_d == 2 && p.pool_h == 2 && p.pool_w == 2;
    return k == CONVPOOL_CUDA_KERNEL_GENERAL && !choose_route(p, k, tf32, precision);
}

/* The arg-max codes of a problem into codes, and its pooled means into pooled (out too where
 * both out and bias are given), float32 x and weights: from the fused forward (TF32 or strict
 * as tf32 says) where fused (codes_from_fused_forward) and it accepts the problem, else from a
 * cuDNN recompute of y
 * (in the precision torch's cuDNN flag gives; y is freed on return) and convpool's pooling
 * kernel. The workspace is allocated here, at least min_ws bytes, and returned for the
 * caller's next kernels. */
at::Tensor find_codes_cuda(const convpool_problem &p, const at::Tensor &x, const at::Tensor &weight,
                           const at::Tensor &conv_bias, const at::Tensor &bias, bool fused, bool tf32, at::Tensor &pooled,
                           at::Tensor &out, at::Tensor &codes, size_t min_ws, cudaStream_t stream, bool defer = false)
{
    float *out_p = bias.defined() && out.numel() ? out.data_ptr<float>() : nullptr;
    const float *bias_p = out_p ? bias.data_ptr<float>() : nullptr;
    auto workspace_of = [&](size_t bytes) {
        return at::empty({static_cast<int64_t>(std::max(bytes, min_ws))}, x.options().dtype(at::kByte));
    };
    size_t fw_ws = 0;
    convpool_status s;
    if (fused) {
        const convpool_precision precision = cuda_precision(p, tf32);
        s = convpool_cuda_workspace_size(&p, precision, CONVPOOL_DTYPE_F32, &fw_ws);
        if (s != CONVPOOL_OK)
            throw_status(s, "the training forward's workspace query");
        at::Tensor workspace = workspace_of(fw_ws);
        s = (defer ? convpool_forward_train_cuda_deferred : convpool_forward_train_cuda)(
            &p, precision, x.data_ptr<float>(), weight.data_ptr<float>(), float_ptr_or_null(conv_bias), bias_p,
            pooled.data_ptr<float>(), out_p, codes.data_ptr(), workspace.data_ptr(), workspace.numel(), stream);
        if (s == CONVPOOL_OK)
            return workspace;
        /* UNSUPPORTED touches nothing: a general tile whose arg-max state does not fit. */
        if (s != CONVPOOL_ERR_UNSUPPORTED)
            throw_status(s, "the training forward");
    }
    const at::Tensor y =
        at::conv3d(x, weight, opt(conv_bias)).contiguous();
    s = convpool_cuda_pool_workspace_size(&p, &fw_ws);
    if (s != CONVPOOL_OK)
        throw_status(s, "the training forward's workspace query");
    at::Tensor workspace = workspace_of(fw_ws);
    s = convpool_pool_forward_train_cuda(&p, y.data_ptr<float>(), bias_p, pooled.data_ptr<float>(), out_p,
                                         codes.data_ptr(), workspace.data_ptr(), workspace.numel(), stream);
    if (s != CONVPOOL_OK)
        throw_status(s, "the training forward");
    return workspace;
}

/* Workspace bytes the fused backward kernels need for what a asks (grad_weight or grad_x: the
 * query's size, whose head holds the device-side inf/NaN flags). */
size_t backward_workspace_bytes(const BackwardArgs &a)
{
    size_t bytes = 0;
    if (!a.need[0] && !a.need[1])
        return 0;
    const convpool_status s = convpool_backward_cuda_workspace_size(&a.p, cuda_precision(a.p, a.tf32), &bytes);
    if (s != CONVPOOL_OK)
        throw_status(s, "convpool_backward_cuda_workspace_size");
    return bytes;
}

/* Whether grads_from_codes_cuda runs grad_x on a second stream beside grad_weight. The two are
 * independent (the same inputs, disjoint outputs); on one stream the second kernel waits for
 * the first one's last wave to drain. Both asked and batch x D x H x W at least 2^22, where the
 * step is the device's time: the second library call and the two events cost host time, which
 * a smaller step is made of. H200 (twenty-fifth session): the backward alone at the headline
 * (docs/experiments/concurrent_backward.py, one call / two calls on two streams, ms) batch 128
 * 0.820 / 0.774, batch 16 0.185 / 0.169, the same bits; whole steps, both sides alternating in
 * one process (docs/experiments/split_step_ab.py, back to back), headline batch 128 1.203-1.207
 * / 1.176-1.180, k5 batch 16 1.512-1.519 / 1.512-1.522, and the host-bound steps of batch 8 to
 * 32 and pool 3 batch 16 no better, some worse (0.67-0.74 / 0.73-0.81 at pool 3).
 * CONVPOOL_SPLIT_BACKWARD=1 / 0 forces either (A/B benchmarks, tests). */
bool split_backward(const BackwardArgs &a)
{
    const convpool_problem &p = a.p;
    const char *env = std::getenv("CONVPOOL_SPLIT_BACKWARD");
    if (env && *env)
        return std::strcmp(env, "0") != 0 && a.need[0] && a.need[1];
    return a.need[0] && a.need[1] && p.batch * p.in_d * p.in_h * p.in_w >= (int64_t(1) << 22);
}

/* The fused backward kernels (convpool_backward_cuda) from a problem's codes, without a host
 * synchronisation: x or weights holding an inf or NaN are found on the device, which then adds
 * the dense formula's 0 * inf terms itself. workspace: undefined, or at least
 * backward_workspace_bytes(a) bytes. Large steps run grad_x as a second call on a pool stream
 * (split_backward), with a workspace of its own of CONVPOOL_BACKWARD_X_WORKSPACE_BYTES. */
std::tuple<at::Tensor, at::Tensor, at::Tensor> grads_from_codes_cuda(const BackwardArgs &a, const at::Tensor &codes,
                                                                     at::Tensor workspace, cudaStream_t stream,
                                                                     at::Tensor *gb = nullptr)
{
    const convpool_problem &p = a.p;
    if (!workspace.defined())
        workspace = at::empty({static_cast<int64_t>(std::max<size_t>(backward_workspace_bytes(a), 1))},
                              a.opts.dtype(at::kByte));
    auto [gx, gw, gcb] = a.new_grads();
    float *gx_p = a.need[0] ? gx.data_ptr<float>() : nullptr;
    float *gcb_p = gcb.numel() ? gcb.data_ptr<float>() : nullptr;
    float *grad_bias = gb ? gb->data_ptr<float>() : nullptr;
    auto run = [&](float *grad_x, float *grad_w, float *grad_cb, float *grad_b, const at::Tensor &ws,
                   cudaStream_t st) {
        return convpool_backward_cuda_all(&p, cuda_precision(p, a.tf32), a.x.data_ptr<float>(),
                                          a.weight.data_ptr<float>(), codes.data_ptr(), float_ptr_or_null(a.gp),
                                          float_ptr_or_null(a.go), a.go_stride, grad_x, grad_w, grad_cb, grad_b,
                                          ws.data_ptr(), static_cast<size_t>(ws.numel()), st);
    };
    convpool_status s;
    if (split_backward(a)) {
        /* grad_weight (and grad_conv_bias) here, grad_x on a pool stream: it forks after
         * everything queued so far and the current stream joins it before anything queued later,
         * so the caching allocator's stream-ordered reuse of these tensors stays safe. */
        const c10::DeviceIndex device = a.x.device().index();
        const c10::cuda::CUDAStream current = c10::cuda::getStreamFromExternal(stream, device);
        const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device);
        const at::Tensor ws_x = at::empty({CONVPOOL_BACKWARD_X_WORKSPACE_BYTES}, a.opts.dtype(at::kByte));
        at::cuda::CUDAEvent fork, join;
        fork.record(current);
        fork.block(side);
        s = run(nullptr, gw.data_ptr<float>(), gcb_p, grad_bias, workspace, stream);
        if (s == CONVPOOL_OK)
            s = run(gx_p, nullptr, nullptr, nullptr, ws_x, side.stream());
        join.record(side);
        join.block(current);
    } else {
        s = run(gx_p, a.need[1] ? gw.data_ptr<float>() : nullptr, gcb_p, grad_bias, workspace, stream);
    }
    /* UNSUPPORTED: a sample or channel beyond the kernels' 32-bit indexing (it checks before
     * touching anything; where grad_weight's call ran first, its results are dropped); the
     * dense formula takes those. */
    if (s == CONVPOOL_ERR_UNSUPPORTED) {
        if (gb)
            *gb = a.model_bias_grad();
        return a.dense();
    }
    if (s != CONVPOOL_OK)
        throw_status(s, "convpool_backward_cuda");
    return {gx, gw, gcb};
}

/* (grad_x, grad_weight, grad_conv_bias) of the block's P and out, each an empty (0,) tensor where
 * not needed; float32 x and weights. The forward saved only x and the weights (the op's forward
 * is the inference forward), so this first finds every window's arg-max code (find_codes_cuda),
 * then runs the fused backward kernels from them. */
std::tuple<at::Tensor, at::Tensor, at::Tensor>
backward_cuda(const at::Tensor &x_in, const at::Tensor &weight_in, const OptTensor &conv_bias_in,
              const OptTensor &grad_pooled_in, const OptTensor &grad_out_in, double divisor, at::IntArrayRef pool,
              bool need_x, bool need_w, bool need_cb, bool tf32)
{
    const BackwardArgs a = backward_args(x_in, weight_in, conv_bias_in, grad_pooled_in, grad_out_in, divisor, pool,
                                         need_x, need_w, need_cb, tf32);
    const c10::cuda::CUDAGuard guard(x_in.device()); /* after the checks, which name a CPU x */
    if (a.nothing_needed())
        return {a.none, a.none, a.none};
    const convpool_problem &p = a.p;
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(a.x.device().index()).stream();
    at::Tensor codes = a.new_codes();
    at::Tensor pooled = at::empty({p.batch, p.out_channels}, a.opts), out = a.none;
    const bool fused = codes_from_fused_forward(p, tf32, a.x.device().index());
    const at::Tensor workspace = find_codes_cuda(p, a.x, a.weight, a.conv_bias, at::Tensor(), fused, tf32, pooled, out,
                                                 codes, backward_workspace_bytes(a), stream);
    return grads_from_codes_cuda(a, codes, workspace, stream);
}

/* The CUDA training forward: pooled and out, and the arg-max codes, which backward_codes then
 * takes instead of finding them again (the step runs one forward instead of two). Where the
 * fused forward writes the codes (codes_from_fused_forward) its pooled and out are the
 * inference forward's, bit for bit, and the codes of near-tied windows may still hold the flag
 * value (convpool_forward_train_cuda_deferred): backward_codes settles them, so a forward whose
 * output is never differentiated does not pay for their recompute. Elsewhere pooled and out
 * come from the inference forward and the codes from the same recompute backward_cuda would
 * run. float32 x and weights. */
std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_train_cuda(const at::Tensor &x_in, const at::Tensor &weight_in,
                                                                  const OptTensor &conv_bias_in,
                                                                  const OptTensor &bias_in, double divisor,
                                                                  at::IntArrayRef pool, bool tf32)
{
    check_args(x_in, weight_in, conv_bias_in, bias_in, pool);
    CP_CHECK_DTYPE(x_in.scalar_type() == at::kFloat && weight_in.scalar_type() == at::kFloat,
                   "the training forward takes float32 x and weight, got ", x_in.scalar_type(), " and ",
                   weight_in.scalar_type());
    const c10::cuda::CUDAGuard guard(x_in.device());
    const convpool_problem p = make_problem(x_in, weight_in, pool, divisor);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(x_in.device().index()).stream();
    const at::Tensor x = dense_aligned(x_in), weight = as_float_dense(weight_in);
    const at::Tensor conv_bias = channel_vector(conv_bias_in), bias = channel_vector(bias_in);
    at::Tensor codes = at::empty({p.batch, p.out_channels, p.pooled_d, p.pooled_h, p.pooled_w},
                                 x.options().dtype(code_dtype(p)));
    if (codes_from_fused_forward(p, tf32, x.device().index())) {
        auto [pooled, out] = make_outputs(x, p, bias.defined());
        find_codes_cuda(p, x, weight, conv_bias, bias, true, tf32, pooled, out, codes, 0, stream, true);
        return {pooled, out, codes};
    }
    auto [pooled, out] = forward_cuda(x_in, weight_in, conv_bias_in, bias_in, divisor, pool, tf32);
    at::Tensor scratch_pooled = at::empty({p.batch, p.out_channels}, x.options().dtype(at::kFloat));
    at::Tensor no_out;
    find_codes_cuda(p, x, weight, conv_bias, at::Tensor(), false, tf32, scratch_pooled, no_out, codes, 0, stream);
    return {pooled, out, codes};
}

/* Whether forward_train_cuda's codes of p may hold flagged near-ties for
 * convpool_settle_codes_cuda: the fused forward's codes from the general kernel, and k3p2's in
 * strict (the library's settle_route; where the forward fell back to the pooling kernel the
 * settle finds nothing to do). */
bool codes_deferred(const convpool_problem &p, bool tf32, int device)
{
    if (!codes_from_fused_forward(p, tf32, device))
        return false;
    const convpool_precision precision = cuda_precision(p, tf32);
    return precision == CONVPOOL_PRECISION_STRICT ||
           cached_plan(p, precision, CONVPOOL_DTYPE_F32, device).kernel == CONVPOOL_CUDA_KERNEL_GENERAL;
}

/* backward_cuda with the training forward's codes: their near-ties settled first, into a copy
 * (the op does not write its inputs; the codes are ~1 byte a window, the settle's recompute
 * touches only the flagged ones). */
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>
backward_codes_cuda(const at::Tensor &x_in, const at::Tensor &weight_in, const OptTensor &conv_bias_in,
                    const at::Tensor &codes_in, const OptTensor &grad_pooled_in, const OptTensor &grad_out_in,
                    double divisor, at::IntArrayRef pool, bool need_x, bool need_w, bool need_cb, bool tf32,
                    bool need_bias)
{
    const BackwardArgs a = backward_args(x_in, weight_in, conv_bias_in, grad_pooled_in, grad_out_in, divisor, pool,
                                         need_x, need_w, need_cb, tf32);
    const c10::cuda::CUDAGuard guard(x_in.device()); /* after the checks, which name a CPU x */
    if (a.nothing_needed())
        return {a.none, a.none, a.none, need_bias ? a.model_bias_grad() : a.none};
    check_codes(a, codes_in);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(a.x.device().index()).stream();
    at::Tensor codes = codes_in;
    /* grad_conv_bias alone reads no codes. */
    if ((a.need[0] || a.need[1]) && codes_deferred(a.p, tf32, a.x.device().index())) {
        codes = codes_in.clone();
        const convpool_status s =
            convpool_settle_codes_cuda(&a.p, cuda_precision(a.p, tf32), a.x.data_ptr<float>(), a.weight.data_ptr<float>(),
                                       float_ptr_or_null(a.conv_bias), codes.data_ptr(), stream);
        if (s != CONVPOOL_OK)
            throw_status(s, "convpool_settle_codes_cuda");
    }
    /* need_bias: grad_bias from weight_reduce's launch (convpool_backward_cuda_all), the double
     * sum of grad_out, where Model's autograd would reduce it in a kernel of its own; the dense
     * fallback (a problem past the kernels' indexing) takes Model's reduction. */
    at::Tensor gb = need_bias ? at::empty({a.p.out_channels}, a.opts) : a.none;
    auto [gx, gw, gcb] = grads_from_codes_cuda(a, codes, at::Tensor(), stream, need_bias ? &gb : nullptr);
    return {gx, gw, gcb, gb};
}

std::string explain_cuda(const at::Tensor &x, const at::Tensor &weight, at::IntArrayRef pool, double divisor,
                         bool tf32)
{
    check_args(x, weight, std::nullopt, std::nullopt, pool);
    const convpool_problem p = make_problem(x, weight, pool, divisor);
    const convpool_dtype dtype = library_dtype(x.scalar_type());
    const convpool_precision precision = cuda_precision(p, dtype, tf32);
    const convpool_cuda_plan plan = cuda_plan(p, precision, dtype);
    std::string why;
    const std::string fp32 = tf32 && precision == CONVPOOL_PRECISION_STRICT
                                 ? cp_message("; strict although TF32 is allowed: Model's conv is FP32 at Cin <= ",
                                              CP_CUDNN_FP32_MAX_CIN, " (its library keeps FP32 kernels there)")
                                 : std::string();
    if (choose_route(p, plan.kernel, tf32, precision, &why))
        return "cuda: cuDNN conv3d, then convpool's pooling kernel (" + why + "); the fused plan would be " +
               plan.description + fp32;
    return "cuda: fused " + std::string(plan.description) + " (" + why + ")" + fp32;
}
#endif

/* ---- block_train: ModelNew's training call, its autograd kernel in C++ ----
 *
 * The block's output (B, 1, 1, 1) for 5-D float32 x, a per-channel bias and the sum over the
 * channels, with the gradients of x, the weights, the conv bias and the bias: forward_train
 * (the output and the arg-max codes from one pass) and backward_codes, through the dispatcher
 * (CPU or CUDA kernels), under a C++ autograd Function. A Python autograd.Function did the
 * same with a Python forward and backward on every step's host path; the op's Python formula
 * (forward's, torch.library.register_autograd) costs more still, and stays for torch.compile,
 * which traces block() instead.
 * float16 and bfloat16 x (weights and biases of x's dtype) train the same way in float32
 * (_ops.py's _upcast_training): the forward upcasts x, the weights and the conv bias, and
 * finishes with block()'s 16-bit tail (lowp_tail); the backward upcasts them again from the
 * saved 16-bit inputs (Model keeps the same ones) and rounds each gradient to its input's
 * dtype. block() does the same in Python with autograd-visible casts, at more host time a
 * step (docs/BENCHMARKS.md, twentieth session); the results are the same bit for bit
 * (test_half_module_call_is_blocks). */
#define CP_STR2(x) #x
#define CP_STR(x) CP_STR2(x)

using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Grads4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using TrainForwardFn = Grads(const at::Tensor &, const at::Tensor &, const OptTensor &, const OptTensor &, double,
                             at::IntArrayRef, bool);
using TrainBackwardFn = Grads4(const at::Tensor &, const at::Tensor &, const OptTensor &, const at::Tensor &,
                               const OptTensor &, const OptTensor &, double, at::IntArrayRef, bool, bool, bool, bool,
                               bool);

/* This library's op `name`, typed (the handles below look theirs up once, at first use). */
template <typename Fn> c10::TypedOperatorHandle<Fn> find_op(const char *name)
{
    return c10::Dispatcher::singleton()
        .findSchemaOrThrow((std::string(CP_STR(CONVPOOL_OP_NAMESPACE) "::") + name).c_str(), "")
        .typed<Fn>();
}

const c10::TypedOperatorHandle<TrainForwardFn> &forward_train_op()
{
    static const auto op = find_op<TrainForwardFn>("forward_train");
    return op;
}

const c10::TypedOperatorHandle<TrainBackwardFn> &backward_codes_op()
{
    static const auto op = find_op<TrainBackwardFn>("backward_codes");
    return op;
}

using InferenceFn = Outputs(const at::Tensor &, const at::Tensor &, const OptTensor &, const OptTensor &, double,
                            at::IntArrayRef, bool);
using BackwardFn = Grads(const at::Tensor &, const at::Tensor &, const OptTensor &, const OptTensor &,
                         const OptTensor &, double, at::IntArrayRef, bool, bool, bool, bool);

const c10::TypedOperatorHandle<InferenceFn> &forward_inference_op()
{
    static const auto op = find_op<InferenceFn>("forward_inference");
    return op;
}

const c10::TypedOperatorHandle<BackwardFn> &backward_op()
{
    static const auto op = find_op<BackwardFn>("backward");
    return op;
}

/* Whether BlockTrain's forward writes the codes: on the CPU (its training forward finds them in
 * the same pass), and on CUDA where the fused forward writes them (codes_from_fused_forward).
 * Elsewhere the CUDA codes come from a recompute (cuDNN's conv, then the pooling kernel) that
 * the forward would run beside the inference forward, making a forward with gradients enabled
 * slower than Model's (H200, pool 1x2x2 b16 0.436 against 0.345 ms). There the forward is the
 * inference forward, bit for bit forward_train's pooled and out, and the backward op finds the
 * codes by the same recompute when a gradient is taken: once a step either way. */
bool codes_in_forward(const at::Tensor &x, const at::Tensor &weight, at::IntArrayRef pool, double divisor, bool tf32)
{
#if CP_WITH_CUDA
    if (x.is_cuda())
        return codes_from_fused_forward(make_problem(x, weight, pool, divisor), tf32, x.device().index());
#endif
    (void)x, (void)weight, (void)pool, (void)divisor, (void)tf32;
    return true;
}

bool codes_in_forward(const at::Tensor &x, const at::Tensor &weight, const OptTensor &conv_bias,
                      const at::Tensor &bias, at::IntArrayRef pool, double divisor, bool tf32)
{
#if CP_WITH_CUDA
    if (x.is_cuda())
        check_args(x, weight, conv_bias, bias, pool);
#endif
    (void)conv_bias, (void)bias;
    return codes_in_forward(x, weight, pool, divisor, tf32);
}

/* Whether a training forward's codes are final and all its backward reads besides x and the
 * weights: CUDA float32 codes from the fused forward that settle nothing (codes_deferred) and
 * whose backward the fused kernels take (UNSUPPORTED past 32-bit indexing sends it to the dense
 * formula, which recomputes the picks from the conv bias). Then BlockTrain keeps no copy of the
 * conv bias's values. */
bool codes_final_in_forward(const at::Tensor &x, const at::Tensor &weight, at::IntArrayRef pool, double divisor,
                            bool tf32, const at::Tensor &codes)
{
#if CP_WITH_CUDA
    if (x.is_cuda() && codes.defined() && x.dim() == 5 &&
        x.size(0) * x.size(2) * x.size(3) * x.size(4) <= std::numeric_limits<int32_t>::max())
        return !codes_deferred(make_problem(x, weight, pool, divisor), tf32, x.device().index());
#endif
    (void)x, (void)weight, (void)pool, (void)divisor, (void)tf32, (void)codes;
    return false;
}

/* out of forward_train as (B, 1, 1, 1): resized in place, not a view (autograd forbids changing
 * a custom Function's view output in place, and Model's output may be changed in place). */
at::Tensor block_out(at::Tensor out, int64_t batch) { return out.resize_({batch, 1, 1, 1}); }

/* Model's max pool of q at the forward's picks: for each window the element its code names
 * (raster d, h, w inside the window), as a differentiable gather, so create_graph's recompute
 * backpropagates to exactly the positions the forward picked, whatever q's values are now. q is
 * (B, C, D, H, W) or unbatched (C, D, H, W); codes (B, C, pooled_d, pooled_h, pooled_w) of
 * code_dtype's width, read unsigned. */
at::Tensor pool_at_codes(const at::Tensor &q, const at::Tensor &codes, at::IntArrayRef pool)
{
    const at::Tensor q5 = q.dim() == 4 ? q.unsqueeze(0) : q;
    const int64_t pd = pool[0], ph = pool[1], pw = pool[2];
    const int64_t nd = codes.size(2), nh = codes.size(3), nw = codes.size(4);
    const at::Tensor win = q5.narrow(2, 0, nd * pd)
                               .narrow(3, 0, nh * ph)
                               .narrow(4, 0, nw * pw)
                               .reshape({q5.size(0), q5.size(1), nd, pd, nh, ph, nw, pw})
                               .permute({0, 1, 2, 4, 6, 3, 5, 7})
                               .reshape({q5.size(0), q5.size(1), nd, nh, nw, pd * ph * pw});
    at::Tensor at_code = codes.to(at::kLong);
    if (codes.scalar_type() != at::kByte) /* 2- and 4-byte codes are unsigned */
        at_code = at::bitwise_and(at_code, (int64_t(1) << (8 * codes.element_size())) - 1);
    const at::Tensor picked = at::take_along_dim(win, at_code.unsqueeze(-1), -1).squeeze(-1);
    /* The gather's derivative does not reach q's graph, Model's max pool's does (a zero term
     * for q, so the conv bias gets a zero second-order gradient, not none): q's own max pool
     * as the never-taken side of a where gives the same connection, and its gradient there is
     * exactly zero (a where sends nothing, not 0 times a value, to the side it does not take). */
    const at::Tensor m = at::where(at::zeros_like(picked, at::kBool), at::max_pool3d(q5, pool, pool), picked);
    return q.dim() == 4 ? m.squeeze(0) : m;
}

/* The backward of a C++ autograd Function under create_graph (a gradient penalty, double
 * backward): the fused kernels have no derivative of their own, so grads[0..2] (x, weight,
 * conv bias, each where needed) come from Model's ops recomputed on the saved inputs,
 * out = tail(conv3d(x, weight, cb)), differentiated against grad with create_graph; their graph
 * then carries the second derivative. Only such calls pay for the recompute. The conv bias is
 * the input ctx->saved_data["conv_bias"] (absent: none), which gets Model's second-order
 * gradient (zero: the arg-max has none), with the values of conv_bias, the saved copy of the
 * forward's, where that is defined; undefined, the input's values as they are now, for a tail
 * that pools at the forward's codes (pool_at_codes), whose gradients no conv bias value moves. */
template <typename Tail>
void create_graph_grads(torch::autograd::AutogradContext *ctx, const at::Tensor &x, const at::Tensor &weight,
                        const at::Tensor &conv_bias, bool need_x, bool need_w, bool need_cb, const at::Tensor &grad,
                        torch::autograd::variable_list &grads, Tail tail,
                        std::optional<at::ScalarType> compute = std::nullopt)
{
    /* compute: the dtype the forward computed in where it is not the inputs' (a 16-bit block
     * that trains in float32, BlockTrain's lowp; ConvTail under autocast, whose conv ran in the
     * autocast dtype): the recompute runs on casts inside the graph, whose backward rounds each
     * gradient to its input's dtype, as autocast's and block()'s casts do. */
    const auto up = [compute](const at::Tensor &t) { return compute ? t.to(*compute) : t; };
    std::vector<at::Tensor> wrt;
    if (need_x)
        wrt.push_back(x);
    if (need_w)
        wrt.push_back(weight);
    const bool has_cb = ctx->saved_data.count("conv_bias") > 0;
    const at::Tensor input_cb = has_cb ? ctx->saved_data["conv_bias"].toTensor() : at::Tensor();
    const at::Tensor cb = !has_cb               ? at::Tensor()
                          : conv_bias.defined() ? at::where(at::zeros_like(conv_bias, at::kBool), input_cb, conv_bias)
                                                : input_cb;
    if (need_cb)
        wrt.push_back(cb);
    const at::Tensor out = tail(at::conv3d(up(x), up(weight), has_cb ? OptTensor(up(cb)) : OptTensor()));
    const auto g = torch::autograd::grad({out}, wrt, {up(grad)}, /*retain_graph=*/true, /*create_graph=*/true,
                                         /*allow_unused=*/true);
    size_t i = 0;
    grads[0] = need_x ? g[i++] : at::Tensor();
    grads[1] = need_w ? g[i++] : at::Tensor();
    grads[2] = need_cb ? g[i++] : at::Tensor();
}

/* A 16-bit block's forward in float32 (_ops.py's _upcast_training), for BlockTrain and
 * block_train_plain: x, the weights and the conv bias upcast exactly, the float32 forward's
 * pooled means, then block()'s 16-bit tail (lowp_tail). With with_codes, the training forward
 * where it finds the codes in its own pass (codes_in_forward). The float32 copies are not kept.
 * Returns (out, codes), codes undefined where not found here. */
std::pair<at::Tensor, at::Tensor> lowp_forward(const at::Tensor &x, const at::Tensor &weight,
                                               const OptTensor &conv_bias, const at::Tensor &bias, double divisor,
                                               at::IntArrayRef pool, bool tf32, bool with_codes)
{
    check_args(x, weight, conv_bias, bias, pool);
    const at::Tensor x32 = x.to(at::kFloat), w32 = weight.to(at::kFloat);
    const OptTensor cb32 = conv_bias.has_value() ? OptTensor(conv_bias->to(at::kFloat)) : OptTensor();
    at::Tensor pooled, codes;
    if (with_codes && codes_in_forward(x32, w32, pool, divisor, tf32))
        std::tie(pooled, std::ignore, codes) = forward_train_op().call(x32, w32, cb32, OptTensor(), divisor, pool, tf32);
    else
        pooled = std::get<0>(forward_inference_op().call(x32, w32, cb32, OptTensor(), divisor, pool, tf32));
    return {lowp_tail(pooled, bias, x.scalar_type()), codes};
}

/* Small work of BlockTrain's that needs none of the fused kernels' results, on a pool stream beside
 * them on a large CUDA step, so that it stops costing the step its launch gap (~1-1.5 us on an
 * H200) and its own few microseconds: the backward's bias gradient (a reduction kernel, ~3 us)
 * beside grad_weight's kernel, whose grid leaves a few block slots free. (The forward's copy of
 * the conv bias was tried there too and stays on the current stream: steps with it measured
 * ~10 us slower than without on machines of similar kernel times, not isolated by an A/B; a
 * copy beside k3p2's persistent grid, which holds every SM, may find no slot until the grid
 * drains, and the join then waits for it.) fork() orders the side stream after everything queued so far on the current
 * one; join() (or the destructor, where the caller throws) orders everything queued later on the
 * current stream after the side work, so the caching allocator's stream-ordered reuse stays
 * safe: the side work's outputs are allocated on the current stream, and its inputs outlive the
 * join. Steps under 2^22 x positions (batch x D x H x W) do the work on the current stream,
 * where the events' host time (~5 us) would cost more than the gap saves (split_backward's
 * threshold and reasoning). CONVPOOL_SIDE_STREAM=0 / 1 forces either. */
struct SideStream {
#if CP_WITH_CUDA
    std::optional<at::cuda::CUDAEvent> done;
    std::optional<c10::cuda::CUDAStream> current, side;
#endif
    /* Whether x (5-D, on CUDA) is large enough; then the side stream is forked. */
    bool fork(const at::Tensor &x)
    {
#if CP_WITH_CUDA
        if (!x.is_cuda() || x.dim() != 5)
            return false;
        const char *env = std::getenv("CONVPOOL_SIDE_STREAM");
        const bool big = x.size(0) * x.size(2) * x.size(3) * x.size(4) >= (int64_t(1) << 22);
        if (env && *env ? std::strcmp(env, "0") == 0 : !big)
            return false;
        const c10::DeviceIndex device = x.device().index();
        current = at::cuda::getCurrentCUDAStream(device);
        side = c10::cuda::getStreamFromPool(false, device);
        at::cuda::CUDAEvent fork;
        fork.record(*current);
        fork.block(*side);
        return true;
#else
        (void)x;
        return false;
#endif
    }
    /* f() with the side stream current; then it is done (the join waits for it). */
    template <typename F> void run(F f)
    {
#if CP_WITH_CUDA
        const c10::cuda::CUDAStreamGuard on_side(*side);
        f();
        done.emplace();
        done->record(*side);
#else
        (void)f;
#endif
    }
    void join()
    {
#if CP_WITH_CUDA
        if (done) {
            done->block(*current);
            done.reset();
        }
#endif
    }
    ~SideStream() { join(); }
};

struct BlockTrain : public torch::autograd::Function<BlockTrain> {
    /* conv_bias is an optional, not an undefined tensor: Function::apply takes every at::Tensor
     * argument as a variable input and records its device, which an undefined one lacks
     * ("tensor does not have a device" for a Conv3d with bias=False). */
    static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &x, const at::Tensor &weight,
                              const OptTensor &conv_bias, const at::Tensor &bias, double divisor,
                              at::IntArrayRef pool, bool tf32)
    {
        at::AutoDispatchBelowADInplaceOrView below;
        at::Tensor out, codes; /* codes stay undefined where the backward op finds them */
        const bool lowp = lowp_dtype(x.scalar_type());
        if (lowp) {
            /* A 16-bit block trains in float32; the backward upcasts the saved inputs again. */
            std::tie(out, codes) = lowp_forward(x, weight, conv_bias, bias, divisor, pool, tf32, true);
        } else if (codes_in_forward(x, weight, conv_bias, bias, pool, divisor, tf32)) {
            std::tie(std::ignore, out, codes) =
                forward_train_op().call(x, weight, conv_bias, opt(bias), divisor, pool, tf32);
        } else {
            out = std::get<1>(forward_inference_op().call(x, weight, conv_bias, opt(bias), divisor, pool, tf32));
        }
        /* The conv bias is kept as the input itself, unversioned, which only the create_graph
         * recompute below is connected to, and, where the backward reads its values, as a copy
         * of them now (out_channels floats). Model's autograd saves no conv bias (the conv's
         * backward keeps x and the weight, the max pool its input), so Model lets conv.bias
         * change in place between the forward and the backward (an optimizer or EMA step) and
         * its backward is still the forward's; saving the input raised "modified by an inplace
         * operation" there. As _ops.py's _saved_conv_bias, which always copies. Where the codes
         * are final (codes_final_in_forward) nothing reads the values: the fused backward reads
         * the codes, and create_graph's recompute pools at them. That saves the copy's kernel
         * and its host call on every large CUDA step. */
        const bool final_codes = !lowp && codes_final_in_forward(x, weight, pool, divisor, tf32, codes);
        ctx->save_for_backward(
            {x, weight, conv_bias.has_value() && !final_codes ? conv_bias->clone() : at::Tensor(), codes});
        if (conv_bias.has_value())
            ctx->saved_data["conv_bias"] = *conv_bias;
        ctx->saved_data["final_codes"] = final_codes;
        ctx->saved_data["divisor"] = divisor;
        ctx->saved_data["pool"] = pool.vec();
        ctx->saved_data["tf32"] = tf32;
        ctx->saved_data["bias_shape"] = bias.sizes().vec();
        ctx->saved_data["bias_dtype"] = bias.scalar_type();
        return lowp ? out : block_out(out, x.size(0));
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                   torch::autograd::variable_list grad_outputs)
    {
        const auto saved = ctx->get_saved_variables();
        const at::Tensor &x = saved[0], &weight = saved[1], &codes = saved[3];
        /* The forward's conv bias values: its copy, or where the codes are final (nothing reads
         * the values) the input itself. */
        const bool final_codes = ctx->saved_data["final_codes"].toBool();
        const bool has_cb = ctx->saved_data.count("conv_bias") > 0;
        const at::Tensor conv_bias = saved[2].defined() ? saved[2]
                                     : has_cb           ? ctx->saved_data["conv_bias"].toTensor()
                                                        : at::Tensor();
        torch::autograd::variable_list grads(7);
        if (!grad_outputs[0].defined())
            return grads;
        const at::Tensor grad_out = grad_outputs[0].reshape({-1});
        /* needs_input_grad counts variable inputs only: without a conv bias, bias is the third. */
        const bool need_x = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1);
        const bool need_cb = has_cb && ctx->needs_input_grad(2);
        const bool need_bias = ctx->needs_input_grad(has_cb ? 3 : 2);
        const at::ScalarType dt = x.scalar_type();
        const bool lowp = lowp_dtype(dt);
        /* grad_out broadcast over the channels, (B, C), as Model's autograd forms it. out[b] =
         * sum_c (P[b, c] + bias[c]): every bias[c] gets sum_b grad_out[b], reduced as Model's
         * autograd reduces it (this broadcast summed over the batch): one reduction into a fresh
         * (C) tensor, no copy of an expanded one. */
        const auto broadcast = [&](const at::Tensor &g) {
            return g.reshape({-1, 1}).expand({g.size(0), weight.size(0)});
        };
        /* Where the fused CUDA backward runs on float32 grad_out, the sum comes from its own last
         * launch (backward_codes' need_bias: weight_reduce's, the double sum, rounded once): no
         * kernel of its own, no side stream. The thirty-seventh session measured the headline
         * step without grad_x 3-4 us shorter without that reduction (H200). Elsewhere: on a
         * large CUDA step it runs on a side stream beside the fused kernels (SideStream), else
         * ahead of them, so that their last kernel (weight_reduce) ends the backward and the
         * next call's first kernel can launch behind it (pdl_first); Model's kernel on Model's
         * tensor, its bits. */
        const bool plain_grad = !lowp && !c10::GradMode::is_enabled() && grad_out.scalar_type() == at::kFloat;
        const bool fused_bias =
            need_bias && plain_grad && (need_x || need_w || need_cb) && codes.defined() && x.is_cuda();
        SideStream side;
        at::Tensor bias_grad;
        if (need_bias && !fused_bias) {
            if (plain_grad && side.fork(x)) {
                bias_grad = at::empty({weight.size(0)}, grad_out.options());
                side.run([&] {
                    at::sum_out(bias_grad, broadcast(grad_out), {0});
                });
            } else {
                bias_grad = broadcast(grad_out).sum(0);
            }
        }
        if ((need_x || need_w || need_cb) && c10::GradMode::is_enabled()) {
            const std::vector<int64_t> pool = ctx->saved_data["pool"].toIntVector();
            const c10::Scalar divisor(ctx->saved_data["divisor"].toDouble());
            /* Final codes: Model's max pool at the forward's picks, whatever the conv bias holds
             * now (its values move no gradient once the picks are fixed). */
            create_graph_grads(ctx, x, weight, saved[2], need_x, need_w, need_cb, grad_out, grads,
                               [&](const at::Tensor &y) {
                                   const at::Tensor q = at::div(y, divisor);
                                   return at::adaptive_avg_pool3d(final_codes ? pool_at_codes(q, codes, pool)
                                                                              : at::max_pool3d(q, pool, pool),
                                                                  {1, 1, 1})
                                       .reshape({grad_out.size(0), -1})
                                       .sum(1);
                               },
                               lowp ? std::optional<at::ScalarType>(at::kFloat) : std::nullopt);
        } else if (need_x || need_w || need_cb) {
            const std::vector<int64_t> pool = ctx->saved_data["pool"].toIntVector();
            const double divisor = ctx->saved_data["divisor"].toDouble();
            const bool tf32 = ctx->saved_data["tf32"].toBool();
            /* 16-bit: the float32 ops on fresh upcasts, with the gradient of the pooled means
             * (B, C) as block()'s autograd forms it (grad_out broadcast over the channels, then
             * upcast); each gradient rounded to its input's dtype. */
            const at::Tensor xf = lowp ? x.to(at::kFloat) : x, wf = lowp ? weight.to(at::kFloat) : weight;
            const at::Tensor cbf = lowp && has_cb ? conv_bias.to(at::kFloat) : conv_bias;
            const OptTensor gp =
                lowp ? OptTensor(broadcast(grad_out).to(at::kFloat).contiguous()) : OptTensor();
            const OptTensor go = lowp ? OptTensor() : OptTensor(grad_out);
            at::Tensor gx, gw, gcb, gb;
            if (codes.defined()) {
                std::tie(gx, gw, gcb, gb) = backward_codes_op().call(xf, wf, opt(cbf), codes, gp, go, divisor, pool,
                                                                      need_x, need_w, need_cb, tf32, fused_bias);
                if (fused_bias)
                    bias_grad = gb;
            } else
                std::tie(gx, gw, gcb) =
                    backward_op().call(xf, wf, opt(cbf), gp, go, divisor, pool, need_x, need_w, need_cb, tf32);
            const auto as_input = [lowp, dt](const at::Tensor &g) { return lowp ? g.to(dt) : g; };
            grads[0] = need_x ? as_input(gx) : at::Tensor();
            grads[1] = need_w ? as_input(gw) : at::Tensor();
            grads[2] = need_cb ? as_input(gcb) : at::Tensor();
        }
        side.join();
        if (need_bias)
            grads[3] = bias_grad.to(ctx->saved_data["bias_dtype"].toScalarType())
                           .reshape(ctx->saved_data["bias_shape"].toIntVector());
        return grads;
    }
};

at::Tensor block_train_autograd(const at::Tensor &x, const at::Tensor &weight, const OptTensor &conv_bias,
                                const at::Tensor &bias, double divisor, at::IntArrayRef pool, bool tf32)
{
    return BlockTrain::apply(x, weight, opt(conv_bias.value_or(at::Tensor())), bias, divisor, pool, tf32);
}

/* Below autograd (inference mode, or no input needing a gradient): the output alone, from the
 * inference forward (forward_train's out, bit for bit, without the codes nobody will read). */
at::Tensor block_train_plain(const at::Tensor &x, const at::Tensor &weight, const OptTensor &conv_bias,
                             const at::Tensor &bias, double divisor, at::IntArrayRef pool, bool tf32)
{
    if (lowp_dtype(x.scalar_type())) /* BlockTrain's 16-bit forward without the codes */
        return lowp_forward(x, weight, conv_bias, bias, divisor, pool, tf32, false).first;
    return block_out(std::get<1>(forward_inference_op().call(x, weight, conv_bias, opt(bias), divisor, pool, tf32)),
                     x.size(0));
}

/* ---- the conv-tail route (_ops.py's _conv_tail): the divide and the max pool on a conv output ----
 * Training where the fused backward does not serve (wide channels, bfloat16, autocast, ...):
 * PyTorch's conv, mean and their backwards, with the divide and the max pool in one pass that
 * keeps only the codes (tail_train: m = max_pool3d(y / divisor), bit for bit) and their backward
 * in one pass that writes the conv output's gradient (tail_backward), each step rounded as
 * PyTorch's ops round it in y's dtype (convpool_tail_train_cpu in convpool.h). */

/* The problem of a conv output of y_size: y stands in for x, with a 1x1x1 kernel. */
convpool_problem tail_problem(at::IntArrayRef y_size, at::IntArrayRef pool, double divisor)
{
    CP_CHECK_ARG(y_size.size() == 5, "the conv output must be 5-D (batch, channels, d, h, w), got ", y_size);
    CP_CHECK_ARG(pool.size() == 3, "pool must have 3 entries, got ", pool);
    convpool_problem p = convpool_problem_make(y_size[0], 1, y_size[1], y_size[2], y_size[3], y_size[4], 1, 1, 1,
                                               pool[0], pool[1], pool[2], divisor);
    const convpool_status s = convpool_problem_validate(&p);
    if (s != CONVPOOL_OK)
        throw_status(s, "convpool_problem_validate");
    return p;
}

std::tuple<at::Tensor, at::Tensor> tail_train(const at::Tensor &y_in, double divisor, at::IntArrayRef pool)
{
    const convpool_dtype dt = library_dtype(y_in.scalar_type(), "y", "");
    const convpool_problem p = tail_problem(y_in.sizes(), pool, divisor);
    const at::Tensor y = y_in.contiguous();
    const std::vector<int64_t> pooled = {p.batch, p.out_channels, p.pooled_d, p.pooled_h, p.pooled_w};
    at::Tensor m = at::empty(pooled, y.options());
    at::Tensor codes = at::empty(pooled, y.options().dtype(code_dtype(p)));
    convpool_status s;
#if CP_WITH_CUDA
    if (y.is_cuda()) {
        const c10::cuda::CUDAGuard guard(y.device());
        s = convpool_tail_train_cuda(&p, dt, y.data_ptr(), m.data_ptr(), codes.data_ptr(),
                                     at::cuda::getCurrentCUDAStream(y.device().index()).stream());
        if (s != CONVPOOL_OK)
            throw_status(s, "convpool_tail_train_cuda");
        return {m, codes};
    }
#endif
    s = convpool_tail_train_cpu(&p, dt, y.data_ptr(), m.data_ptr(), codes.data_ptr(), at::get_num_threads());
    if (s != CONVPOOL_OK)
        throw_status(s, "convpool_tail_train_cpu");
    return {m, codes};
}

at::Tensor tail_backward(const at::Tensor &grad_m_in, const at::Tensor &codes_in, at::IntArrayRef y_size,
                         double divisor, at::IntArrayRef pool)
{
    const convpool_dtype dt = library_dtype(grad_m_in.scalar_type(), "grad_m", "");
    const convpool_problem p = tail_problem(y_size, pool, divisor);
    const int64_t windows = p.batch * p.out_channels * p.pooled_d * p.pooled_h * p.pooled_w;
    CP_CHECK_ARG(codes_in.scalar_type() == code_dtype(p) && codes_in.numel() == windows,
                 "codes must be tail_train's (", code_dtype(p), ", ", windows, " elements), got ",
                 codes_in.scalar_type(), " with ", codes_in.numel());
    CP_CHECK_ARG(grad_m_in.numel() == windows, "grad_m must have ", windows, " elements, got ", grad_m_in.numel());
    CP_CHECK_ARG(grad_m_in.device() == codes_in.device(), "grad_m is on ", grad_m_in.device(), " but codes are on ",
                 codes_in.device());
    const at::Tensor codes = codes_in.contiguous(), grad_m = grad_m_in.contiguous();
    at::Tensor grad_y = at::empty(y_size, grad_m.options());
    convpool_status s;
#if CP_WITH_CUDA
    if (codes.is_cuda()) {
        const c10::cuda::CUDAGuard guard(codes.device());
        s = convpool_tail_backward_cuda(&p, dt, codes.data_ptr(), grad_m.data_ptr(), grad_y.data_ptr(),
                                        at::cuda::getCurrentCUDAStream(codes.device().index()).stream());
        if (s != CONVPOOL_OK)
            throw_status(s, "convpool_tail_backward_cuda");
        return grad_y;
    }
#endif
    s = convpool_tail_backward_cpu(&p, dt, codes.data_ptr(), grad_m.data_ptr(), grad_y.data_ptr(),
                                   at::get_num_threads());
    if (s != CONVPOOL_OK)
        throw_status(s, "convpool_tail_backward_cpu");
    return grad_y;
}

using TailTrainFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor &, double, at::IntArrayRef);
using TailBackwardFn = at::Tensor(const at::Tensor &, const at::Tensor &, at::IntArrayRef, double, at::IntArrayRef);

const c10::TypedOperatorHandle<TailTrainFn> &tail_train_op()
{
    static const auto op = find_op<TailTrainFn>("tail_train");
    return op;
}

const c10::TypedOperatorHandle<TailBackwardFn> &tail_backward_op()
{
    static const auto op = find_op<TailBackwardFn>("tail_backward");
    return op;
}

/* m = max_pool3d(conv3d(x, weight, conv_bias) / divisor, pool) through tail_train: conv_tail's
 * forward (below autograd, and inside ConvTail). x may be unbatched (4-D). */
std::tuple<at::Tensor, at::Tensor> conv_tail_forward(const at::Tensor &x, const at::Tensor &weight,
                                                     const OptTensor &conv_bias, double divisor, at::IntArrayRef pool)
{
    const at::Tensor y = at::conv3d(x, weight, conv_bias);
    auto [m, codes] = tail_train_op().call(x.dim() == 4 ? y.unsqueeze(0) : y, divisor, pool);
    return {x.dim() == 4 ? m.squeeze(0) : m, codes};
}

/* Whether ConvTail forms grad_x as a forward convolution: the "full" correlation of grad_y with
 * the weights flipped in d, h and w and with their channel axes swapped,
 *   grad_x = conv3d(grad_y, weight.flip(2, 3, 4).transpose(0, 1), padding = kernel - 1),
 * which is the data gradient of a stride-1 conv without padding, summed in another order.
 * cuDNN runs its dgrad of these problems far slower than a forward conv of the same FLOPs
 * (H200, TF32, docs/experiments/dgrad_as_fprop.py: c16_c32 b32 0.98 ms against 0.32; Cin 3 Cout
 * 64 at 112^2 1.67 against 0.39; kernel 5 1.11 against 0.08), and the dgrad was most of the
 * route's step. Taken for float32 CUDA tensors in TF32 mode with every kernel side at least 3:
 *  - TF32: both calls round grad_y and the weights to TF32 and sum in FP32, and their errors
 *    against float64 matched on every kernel-3 and kernel-5 shape measured. Where cuDNN's
 *    TF32-mode dgrad ran an FP32 kernel (kernel 1x3x3 and 2 in that sweep) the fprop would be
 *    1000x less accurate, so those kernels keep the dgrad. Strict FP32 keeps it too: its fprop
 *    errs 2-5x more than its dgrad, and is slower on some shapes.
 *  - 16-bit tensors gain ~6% of the dgrad and would give up Model's bits: they keep it.
 * The result is not Model's grad_x bit for bit; in TF32 mode grad_weight and grad_conv_bias
 * still are. */
bool grad_x_by_fprop(const at::Tensor &grad_y, const at::Tensor &weight)
{
#if CP_WITH_CUDA
    return grad_y.is_cuda() && grad_y.scalar_type() == at::kFloat && at::globalContext().userEnabledCuDNN() &&
           cudnn_tf32_flag() == 1 && weight.size(2) >= 3 && weight.size(3) >= 3 && weight.size(4) >= 3;
#else
    (void)grad_y, (void)weight;
    return false;
#endif
}

/* Whether ConvTail forms grad_weight as GEMMs over (batch, position) in strict mode:
 *   grad_w[co, ci, tap] = sum over (b, p) of grad_y[b, co, p] x[b, ci, p + tap],
 * one FP32 cuBLAS GEMM a chunk of samples, G = grad_y as [Cout, b p] times the columns
 * cols[ci, tap, b, p] = x[b, ci, p + tap] (weight_grad_by_gemm below). cuDNN's strict FP32 wgrad
 * of these problems runs at ~1 TFLOP/s and was most of the route's strict step (H200,
 * docs/experiments/dgrad_as_fprop.py --wgrad: c16_c32 b32 11.2 ms against 2.8; Cin 3 Cout 64 at
 * 112^2 7.4 against 0.70; c32_c64 5.8 against 2.6; c64_c128 3.1 against 2.7), and the GEMMs'
 * error against float64 was 2-20x smaller than cuDNN's (their K = batch x positions sums in
 * cuBLAS's blocked order). Kernel 5 (125 taps: 14.2 ms against 4.0) keeps cuDNN: taken for 8 to
 * 27 taps. Only where cuBLAS's float32 matmuls are full FP32 (precision "highest", the default),
 * so the GEMMs are what strict means, and where one sample's columns and gradient rows fit a
 * chunk (gemm_sample_floats), so the extra memory stays bounded; the conv bias's gradient is
 * still Model's call. */
constexpr int64_t kGemmChunkBytes = 128 << 20;
/* Floats a sample takes in weight_grad_gemm: its columns or its copy of grad_y, the larger. */
int64_t gemm_sample_floats(const at::Tensor &grad_y, const at::Tensor &weight)
{
    const int64_t taps = weight.size(2) * weight.size(3) * weight.size(4);
    return std::max(weight.size(1) * taps, weight.size(0)) * grad_y.size(2) * grad_y.size(3) * grad_y.size(4);
}
bool weight_grad_by_gemm(const at::Tensor &grad_y, const at::Tensor &weight)
{
#if CP_WITH_CUDA
    const int64_t taps = weight.size(2) * weight.size(3) * weight.size(4);
    if (!grad_y.is_cuda() || grad_y.scalar_type() != at::kFloat || cudnn_tf32_flag() != 0 || taps < 8 || taps > 27 ||
        grad_y.dim() != 5 || 4 * gemm_sample_floats(grad_y, weight) > kGemmChunkBytes)
        return false;
    try {
        return !at::globalContext().allowTF32CuBLAS() &&
               at::globalContext().float32MatmulPrecision() == at::Float32MatmulPrecision::HIGHEST;
    } catch (const std::exception &) {
        return false;
    }
#else
    (void)grad_y, (void)weight;
    return false;
#endif
}

/* grad_weight by GEMMs (weight_grad_by_gemm says where): the columns of a chunk of samples (the
 * columns and the chunk's copy of grad_y each at most kGemmChunkBytes), built by one copy of
 * x's unfolded view (every tap's window of every sample: [b][ci][p][tap] permuted to
 * [ci][tap][b][p]), then out += G cols^T. x may have any strides (channels_last_3d). One copy
 * a tap (27 launches a chunk) cost the host ~0.5 ms a step, which at batch 2 was more than the
 * GEMMs saved on the device (H200, c16_c32 b2 strict step 1.59 ms against eager's 1.37,
 * docs/experiments/small_batch_rule.py). */
at::Tensor weight_grad_gemm(const at::Tensor &grad_y, const at::Tensor &x, const at::Tensor &weight)
{
    const int64_t cout = weight.size(0), cin = weight.size(1), kd = weight.size(2), kh = weight.size(3),
                  kw = weight.size(4), batch = x.size(0);
    const int64_t od = grad_y.size(2), oh = grad_y.size(3), ow = grad_y.size(4), taps = kd * kh * kw;
    const int64_t per = std::max<int64_t>(1, kGemmChunkBytes / (4 * gemm_sample_floats(grad_y, weight)));
    at::Tensor out = at::zeros({cout, cin * taps}, grad_y.options());
    for (int64_t b0 = 0; b0 < batch; b0 += per) {
        const int64_t b1 = std::min(batch, b0 + per), nb = b1 - b0;
        at::Tensor cols = at::empty({cin, taps, nb, od, oh, ow}, grad_y.options());
        /* [b][ci][od][oh][ow][kd][kh][kw], a view of x: unfold's windows are stride-1 slides. */
        const at::Tensor windows = x.slice(0, b0, b1).unfold(2, kd, 1).unfold(3, kh, 1).unfold(4, kw, 1);
        cols.view({cin, kd, kh, kw, nb, od, oh, ow}).copy_(windows.permute({1, 5, 6, 7, 0, 2, 3, 4}));
        const at::Tensor g = grad_y.slice(0, b0, b1).transpose(0, 1).reshape({cout, -1});
        out.addmm_(g, cols.view({cin * taps, -1}).t());
    }
    return out.view({cout, cin, kd, kh, kw}).contiguous(weight.suggest_memory_format());
}

/* The conv-tail route's eager call (_ops.py's _fast_forward), with its autograd in C++ as
 * BlockTrain's: a step's host path runs no convpool Python. The forward keeps x, the weights
 * and the codes (Model's conv keeps x and the weights; its max pool the quotient and 8-byte
 * indices); the backward is tail_backward, then PyTorch's own conv backward
 * (at::convolution_backward, what Model's ConvolutionBackward0 calls), so the gradients are
 * Model's bit for bit, except grad_x where grad_x_by_fprop says it is a forward conv and
 * grad_weight where weight_grad_by_gemm says it is GEMMs. Under CUDA autocast (ModelNew's
 * training call of a float32 model takes this op there since the twentieth session: block()'s
 * Python route measured 0.71-0.98x eager's grad-enabled forward at batch 2) the conv runs in the
 * autocast dtype as Model's does, and the backward casts x, the weights and the conv bias the
 * same way, then rounds each gradient back to its input's dtype. */
struct ConvTail : public torch::autograd::Function<ConvTail> {
    static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &x, const at::Tensor &weight,
                              const OptTensor &conv_bias, double divisor, at::IntArrayRef pool)
    {
        at::AutoDispatchBelowADInplaceOrView below;
        auto [m, codes] = conv_tail_forward(x, weight, conv_bias, divisor, pool);
        /* Under torch.autocast the conv (autocast's kernel, which is still on below autograd)
         * ran in the autocast dtype, on casts of x, the weights and the conv bias, as Model's
         * conv does: the backward casts them the same way and rounds each gradient back to its
         * input's dtype, as the casts' backward does in Model. */
        if (m.scalar_type() != x.scalar_type())
            ctx->saved_data["compute_dtype"] = m.scalar_type();
        /* The conv bias as the input only: nothing reads its values (the create_graph recompute
         * pools at the codes; BlockTrain says why the input is not saved versioned). */
        ctx->save_for_backward({x, weight, codes});
        if (conv_bias.has_value())
            ctx->saved_data["conv_bias"] = *conv_bias;
        ctx->saved_data["divisor"] = divisor;
        ctx->saved_data["pool"] = pool.vec();
        return m;
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                   torch::autograd::variable_list grad_outputs)
    {
        const auto saved = ctx->get_saved_variables();
        const at::Tensor &x = saved[0], &weight = saved[1], &codes = saved[2];
        torch::autograd::variable_list grads(5);
        const at::Tensor &grad_m = grad_outputs[0];
        const bool has_cb = ctx->saved_data.count("conv_bias") > 0;
        const bool need_x = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1);
        const bool need_cb = has_cb && ctx->needs_input_grad(2);
        if (!grad_m.defined() || !(need_x || need_w || need_cb))
            return grads;
        const std::vector<int64_t> pool = ctx->saved_data["pool"].toIntVector();
        const double divisor = ctx->saved_data["divisor"].toDouble();
        const std::optional<at::ScalarType> compute =
            ctx->saved_data.count("compute_dtype")
                ? std::optional<at::ScalarType>(ctx->saved_data["compute_dtype"].toScalarType())
                : std::nullopt;
        if (c10::GradMode::is_enabled()) {
            create_graph_grads(
                ctx, x, weight, at::Tensor(), need_x, need_w, need_cb, grad_m, grads,
                [&](const at::Tensor &y) { return pool_at_codes(at::div(y, c10::Scalar(divisor)), codes, pool); },
                compute);
            return grads;
        }
        const bool unbatched = x.dim() == 4;
        const auto as_compute = [&compute](const at::Tensor &t) { return compute && t.defined() ? t.to(*compute) : t; };
        const at::Tensor x5 = as_compute(unbatched ? x.unsqueeze(0) : x);
        std::vector<int64_t> y_size = {x5.size(0), weight.size(0), x5.size(2) - weight.size(2) + 1,
                                       x5.size(3) - weight.size(3) + 1, x5.size(4) - weight.size(4) + 1};
        const at::Tensor grad_y =
            tail_backward_op().call(unbatched ? grad_m.unsqueeze(0) : grad_m, codes, y_size, divisor, pool);
        at::Tensor gx, gw, gcb;
        const bool fprop_x = need_x && grad_x_by_fprop(grad_y, weight);
        if (fprop_x) {
            const at::Tensor flipped = weight.flip({2, 3, 4}).transpose(0, 1).contiguous();
            gx = at::conv3d(grad_y, flipped, {}, {1, 1, 1}, {weight.size(2) - 1, weight.size(3) - 1, weight.size(4) - 1})
                     .contiguous(x5.suggest_memory_format());
        }
        const bool gemm_w = need_w && weight_grad_by_gemm(grad_y, weight);
        if (gemm_w)
            gw = weight_grad_gemm(grad_y, x5, weight);
        /* Model's conv of an unbatched x runs on x.unsqueeze(0): the same call here. */
        if ((need_x && !fprop_x) || (need_w && !gemm_w) || need_cb) {
            const std::vector<int64_t> bias_sizes = {weight.size(0)};
            auto r = at::convolution_backward(
                grad_y, x5, as_compute(weight), has_cb ? at::OptionalIntArrayRef(bias_sizes) : at::OptionalIntArrayRef(),
                {1, 1, 1}, {0, 0, 0}, {1, 1, 1}, false, {0, 0, 0}, 1, {need_x && !fprop_x, need_w && !gemm_w, need_cb});
            if (!fprop_x)
                gx = std::get<0>(r);
            if (!gemm_w)
                gw = std::get<1>(r);
            gcb = std::get<2>(r);
        }
        /* Under autocast each gradient goes back to its input's dtype, as the casts' backward. */
        const auto as_input = [&compute](const at::Tensor &g, const at::Tensor &input) {
            return compute ? g.to(input.scalar_type()) : g;
        };
        grads[0] = need_x ? as_input(unbatched ? gx.squeeze(0) : gx, x) : at::Tensor();
        grads[1] = need_w ? as_input(gw, weight) : at::Tensor();
        grads[2] = need_cb ? as_input(gcb, ctx->saved_data["conv_bias"].toTensor()) : at::Tensor();
        return grads;
    }
};

at::Tensor conv_tail_autograd(const at::Tensor &x, const at::Tensor &weight, const OptTensor &conv_bias,
                              double divisor, at::IntArrayRef pool)
{
    return ConvTail::apply(x, weight, opt(conv_bias.value_or(at::Tensor())), divisor, pool);
}

/* Below autograd (no input needs a gradient): the forward alone. */
at::Tensor conv_tail_plain(const at::Tensor &x, const at::Tensor &weight, const OptTensor &conv_bias, double divisor,
                           at::IntArrayRef pool)
{
    return std::get<0>(conv_tail_forward(x, weight, conv_bias, divisor, pool));
}

} // namespace

CP_TORCH_LIBRARY(CONVPOOL_OP_NAMESPACE, m)
{
    m.def("forward(Tensor x, Tensor weight, Tensor? conv_bias, Tensor? bias, float divisor, "
          "int[3] pool, bool tf32) -> (Tensor pooled, Tensor out)");
    /* forward without an autograd formula: the same kernels, for calls that need no gradient.
     * forward's formula is registered from Python, so every call of it passes through a Python
     * autograd kernel (~10 us of host time, under no_grad too); this op's Autograd key falls
     * through in C++. Its outputs carry no grad_fn: callers use it only when no input needs a
     * gradient (convpool's own front end checks that). */
    m.def("forward_inference(Tensor x, Tensor weight, Tensor? conv_bias, Tensor? bias, float divisor, "
          "int[3] pool, bool tf32) -> (Tensor pooled, Tensor out)");
    /* The block's output (B, 1, 1, 1) in x's dtype for sum_dim over the channels and a bias that
     * broadcasts per channel; no autograd formula, like forward_inference. ModelNew's per-call
     * path. */
    m.def("block_inference(Tensor x, Tensor weight, Tensor? conv_bias, Tensor bias, float divisor, "
          "int[3] pool, bool tf32) -> Tensor");
    m.def("reference(Tensor x, Tensor weight, Tensor? conv_bias, Tensor? bias, float divisor, "
          "int[3] pool) -> (Tensor pooled, Tensor out)");
    m.def("explain(Tensor x, Tensor weight, int[3] pool, float divisor, bool tf32) -> str");
    m.def("backward(Tensor x, Tensor weight, Tensor? conv_bias, Tensor? grad_pooled, Tensor? grad_out, "
          "float divisor, int[3] pool, bool need_x, bool need_w, bool need_cb, bool tf32) -> "
          "(Tensor grad_x, Tensor grad_weight, Tensor grad_conv_bias)");
    m.def("forward_train(Tensor x, Tensor weight, Tensor? conv_bias, Tensor? bias, float divisor, "
          "int[3] pool, bool tf32) -> (Tensor pooled, Tensor out, Tensor codes)");
    /* need_bias: grad_bias [Cout] of out = sum_c (P + bias) too (sum_b grad_out[b]; on CUDA from the
     * kernels' own launch, in double), else an empty (0,) tensor. */
    m.def("backward_codes(Tensor x, Tensor weight, Tensor? conv_bias, Tensor codes, Tensor? grad_pooled, "
          "Tensor? grad_out, float divisor, int[3] pool, bool need_x, bool need_w, bool need_cb, bool tf32, "
          "bool need_bias=False) -> (Tensor grad_x, Tensor grad_weight, Tensor grad_conv_bias, Tensor grad_bias)");
    /* ModelNew's training call: block_inference's output with gradients, its autograd kernel
     * in C++ (BlockTrain above). For 5-D float32 x (or float16/bfloat16, trained in float32), a
     * per-channel bias, the fused backward's domain (convpool's front end checks). */
    m.def("block_train(Tensor x, Tensor weight, Tensor? conv_bias, Tensor bias, float divisor, "
          "int[3] pool, bool tf32) -> Tensor");
    /* Frees the CPU backward's kept x-sized scratch (convpool_cpu_release_scratch); no tensors,
     * so one kernel for every key. */
    m.def("tail_train(Tensor y, float divisor, int[3] pool) -> (Tensor m, Tensor codes)");
    m.def("tail_backward(Tensor grad_m, Tensor codes, int[5] y_size, float divisor, int[3] pool) -> Tensor");
    m.def("conv_tail(Tensor x, Tensor weight, Tensor? conv_bias, float divisor, int[3] pool) -> Tensor");
    m.def("release_cpu_scratch() -> ()", [] { convpool_cpu_release_scratch(); });
}

CP_TORCH_LIBRARY_IMPL(CONVPOOL_OP_NAMESPACE, CPU, m)
{
    m.impl("forward", &forward_cpu);
    m.impl("forward_inference", &forward_inference<forward_cpu>);
    m.impl("block_inference", &block_inference<forward_cpu>);
    m.impl("reference", &reference_cpu);
    m.impl("explain", &explain_cpu);
    m.impl("backward", &backward_cpu);
    m.impl("forward_train", &forward_train_cpu);
    m.impl("backward_codes", &backward_codes_cpu);
    m.impl("block_train", &block_train_plain);
    m.impl("tail_train", &tail_train);
    m.impl("tail_backward", &tail_backward);
    m.impl("conv_tail", &conv_tail_plain);
}

CP_TORCH_LIBRARY_IMPL(CONVPOOL_OP_NAMESPACE, Autograd, m)
{
    m.impl("block_train", &block_train_autograd);
    m.impl("conv_tail", &conv_tail_autograd);
}

#if CP_WITH_CUDA
CP_TORCH_LIBRARY_IMPL(CONVPOOL_OP_NAMESPACE, CUDA, m)
{
    m.impl("forward", &forward_cuda);
    m.impl("forward_inference", &forward_inference<forward_cuda>);
    m.impl("block_inference", &block_inference<forward_cuda>);
    m.impl("explain", &explain_cuda);
    m.impl("backward", &backward_cuda);
    m.impl("forward_train", &forward_train_cuda);
    m.impl("backward_codes", &backward_codes_cuda);
    m.impl("block_train", &block_train_plain);
    m.impl("tail_train", &tail_train);
    m.impl("tail_backward", &tail_backward);
    m.impl("conv_tail", &conv_tail_plain);
}
#endif

#ifdef TORCH_EXTENSION_NAME
namespace {

/* Would the dispatcher take block_inference straight to its CPU or CUDA kernel for these
 * tensors now? That is: no key above the backend's own but the ones it passes through for this
 * op (BackendSelect, ADInplaceOrView, the Autograd key, which has no kernel here). Anything else
 * -- a tracer, autocast, functorch transforms (vmap, grad), a Python dispatch mode or tensor
 * subclass (FakeTensorMode, FlopCounterMode), conjugate or negative views -- needs the op, so
 * the caller takes it. Computed as the dispatcher computes it (tensor keys, then the
 * thread-local included and excluded sets). */
bool dispatches_plainly(const at::Tensor &x, const at::Tensor &weight, const OptTensor &conv_bias,
                        const at::Tensor &bias)
{
    c10::DispatchKeySet ks = x.key_set() | weight.key_set() | bias.key_set();
    if (conv_bias.has_value())
        ks = ks | conv_bias->key_set();
    const c10::DispatchKeySet eff = c10::impl::computeDispatchKeySet(ks, c10::DispatchKeySet(c10::DispatchKeySet::FULL));
    const c10::DispatchKeySet passes({c10::DispatchKey::Dense, c10::DispatchKey::BackendSelect,
                                      c10::DispatchKey::ADInplaceOrView, c10::DispatchKey::AutogradFunctionality});
    /* operator- removes functionality bits only; the backend bits left say nothing here. */
    return (eff - passes).highestFunctionalityKey() == c10::DispatchKey::Undefined;
}

/* ModelNew's inference call without the op dispatcher's boxing: the same kernel that
 * <ns>::block_inference registers for x's device, called from Python through pybind11 (the
 * torch.ops call packs its 7 arguments into IValues and back: ~3.5 of ~7 us of a call's host
 * time, measured on a 2-core CI host, against ~3.3 for this call). Returns None, having done
 * nothing the caller can see, unless the call is plain inference that the op would run the
 * same way: x 5-D of a served dtype on the CPU or (CUDA builds) a GPU, parameters of x's dtype,
 * bias one value per channel, no input needing a gradient (grad mode on), nonempty tensors,
 * and dispatches_plainly. Errors also return None, so the caller's op call raises them with
 * their usual messages. torch.profiler still sees the call (RECORD_FUNCTION). */
std::optional<at::Tensor> block_inference_direct(const at::Tensor &x, const at::Tensor &weight,
                                                 const OptTensor &conv_bias, const at::Tensor &bias, double divisor,
                                                 std::vector<int64_t> pool, bool tf32)
{
    try {
        if (!x.defined() || !weight.defined() || !bias.defined() || (conv_bias.has_value() && !conv_bias->defined()))
            return std::nullopt;
        const at::ScalarType dt = x.scalar_type();
        if (x.dim() != 5 || weight.dim() != 5 || pool.size() != 3 ||
            (dt != at::kFloat && dt != at::kHalf && dt != at::kBFloat16) || weight.scalar_type() != dt ||
            bias.scalar_type() != dt || (conv_bias.has_value() && conv_bias->scalar_type() != dt))
            return std::nullopt;
        if (x.numel() == 0 || weight.numel() == 0)
            return std::nullopt;
        /* One value per channel: bias's shape, left-padded to 5-D, is (1, C, 1, 1, 1). */
        const int64_t bdim = bias.dim();
        if (bdim > 5 || bias.numel() != weight.size(0) || (bdim >= 4 && bias.size(bdim - 4) != weight.size(0)) ||
            (bdim < 4 && weight.size(0) != 1))
            return std::nullopt;
        if (c10::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad() || bias.requires_grad() ||
                                            (conv_bias.has_value() && conv_bias->requires_grad())))
            return std::nullopt;
        if (!dispatches_plainly(x, weight, conv_bias, bias))
            return std::nullopt;
        RECORD_FUNCTION("convpool::block_inference_direct", std::vector<c10::IValue>({x, weight}));
        if (x.is_cpu())
            return block_inference<forward_cpu>(x, weight, conv_bias, bias, divisor, pool, tf32);
#if CP_WITH_CUDA
        if (x.is_cuda())
            return block_inference<forward_cuda>(x, weight, conv_bias, bias, divisor, pool, tf32);
#endif
        return std::nullopt;
    } catch (const std::exception &) {
        return std::nullopt;
    }
}

/* ModelNew's two training calls, made through the dispatcher from C++: the same ops, so autograd,
 * dispatch modes and the profiler see what they saw, without torch.ops's Python argument
 * packing and, for the conv-tail route, without three tail ops called one by one from Python
 * (F.adaptive_avg_pool3d, +, torch.sum: here at::adaptive_avg_pool3d, the add and at::sum, the
 * same ATen calls, so the output and its gradients are those bit for bit). At small batches the
 * host path is the call: the H200 host spent ~240 us on ModelNew's grad-enabled forward of
 * c16_c32 at batch 2 against Model's ~210, of which ~45 were Python around the ops
 * (docs/experiments/conv_tail_host.py). _ops.py's _fast_forward calls these only without a
 * torch function mode or a tensor subclass, which a torch.ops call would hand
 * __torch_function__. */
using BlockTrainFn = at::Tensor(const at::Tensor &, const at::Tensor &, const OptTensor &, const at::Tensor &, double,
                                at::IntArrayRef, bool);
using ConvTailFn = at::Tensor(const at::Tensor &, const at::Tensor &, const OptTensor &, double, at::IntArrayRef);

at::Tensor block_train_direct(const at::Tensor &x, const at::Tensor &weight, const OptTensor &conv_bias,
                              const at::Tensor &bias, double divisor, std::vector<int64_t> pool, bool tf32)
{
    static const auto op = find_op<BlockTrainFn>("block_train");
    return op.call(x, weight, conv_bias, bias, divisor, pool, tf32);
}

/* The block's output on the conv-tail route: sum(adaptive_avg_pool3d(conv_tail(...), 1) + bias,
 * dim 1), bias one value per channel (the caller checks). */
at::Tensor conv_tail_block_direct(const at::Tensor &x, const at::Tensor &weight, const OptTensor &conv_bias,
                                  const at::Tensor &bias, double divisor, std::vector<int64_t> pool)
{
    static const auto op = find_op<ConvTailFn>("conv_tail");
    const at::Tensor m = op.call(x, weight, conv_bias, divisor, pool);
    return at::sum(at::adaptive_avg_pool3d(m, {1, 1, 1}) + bias, {1});
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.doc() = "convpool's extension: the ops are registered under torch.ops; this module holds "
              "ModelNew's direct inference entry.";
    m.def("block_inference_direct", &block_inference_direct,
          "block_inference for plain inference calls without the op dispatcher, else None");
    m.def(
        "codes_in_forward",
        [](const at::Tensor &x, const at::Tensor &weight, std::vector<int64_t> pool, double divisor, bool tf32) {
            return codes_in_forward(x, weight, pool, divisor, tf32);
        },
          "whether the training forward (op forward_train) finds the codes in its own pass (5-D x) rather than "
          "by a recompute beside the inference forward");
    m.def(
        "cpu_conv_route",
        [](const at::Tensor &x, const at::Tensor &weight, std::vector<int64_t> pool, double divisor) {
            return cpu_conv_route(make_problem(x, weight, pool, divisor));
        },
        "whether the CPU forward of this problem (5-D x) runs as PyTorch's conv and convpool's tail rather than "
        "the fused CPU conv (where that measured slower)");
    m.def("block_train_direct", &block_train_direct, "the op block_train, called from C++ (ModelNew's training call)");
    m.def("conv_tail_block_direct", &conv_tail_block_direct,
          "the conv-tail route's block output: the op conv_tail, then Model's tail ops, called from C++");
    m.attr("has_cuda") = pybind11::bool_(CP_WITH_CUDA != 0);
}
#endif
