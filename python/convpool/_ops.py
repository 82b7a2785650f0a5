"""convpool's PyTorch front end: the custom op's Python half, the functional block and ModelNew.

The C++ half (csrc/binding.cpp) defines the op

    <ns>::forward(Tensor x, Tensor weight, Tensor? conv_bias, Tensor? bias, float divisor,
                  int[3] pool, bool tf32) -> (Tensor pooled, Tensor out)

with CPU and CUDA kernels. pooled is P (B, C) float32, the mean of the max-pooled, divided conv
output; out is (B,) float32, out[b] = sum_c (P[b, c] + bias[c]), when bias is given (else
empty). This module registers its fake kernel (shapes only, so torch.compile traces it with
fullgraph=True) and its autograd formula (the backward recomputes conv -> / divisor -> max pool
with PyTorch ops and backpropagates through them: same gradients as Model).

What ModelNew computes, by input:
  float32 on CPU or CUDA      the fused kernel. On CUDA the convolution uses TF32 when
                              torch.backends.cudnn.allow_tf32 is set (PyTorch's default, and what
                              nn.Conv3d uses), else FP32-accurate products; read at call time.
                              At 1-3 input channels it is FP32-accurate either way, as nn.Conv3d's
                              cuDNN conv is (binding.cpp's cuda_precision).
  float16 / bfloat16          CUDA: the kernel reads x in that dtype (if the kernel lacks the
                              variant, x is upcast to float32 first); CPU: x is upcast to float32.
                              Weights and biases are used as float32 copies of their values.
                              P is rounded to x's dtype, then + bias and the sum run in PyTorch,
                              so the output dtype is Model's.
  under torch.autocast        as Model: x, weight and conv bias are cast to the autocast dtype
                              (the operands nn.Conv3d would see), the kernel accumulates in
                              float32, and P is given the dtype Model's pooled tensor has under
                              the same autocast (the autocast dtype on CUDA; float32 on CPU,
                              where max_pool3d autocasts to float32). Values are more accurate
                              than Model's (no rounding of the conv output to 16 bits).
  float64, other devices, empty tensors, a tensor divisor
                              an exact composite of the same PyTorch ops Model runs.
  4-D (unbatched) x           as nn.Conv3d does: treated as a batch of one, result shaped as
                              Model's.
  submodules that are not Model's plain ones (a hook on conv, max_pool or global_avg_pool or a
  global module hook, torch.nn.utils.prune, a conv stride, padding, dilation or groups, a max
  pool stride other than its window, padding or ceil_mode, a replaced module), and forward-mode
  AD (fwAD.dual_level)
                              ModelNew runs Model's forward through its submodules, so the
                              result is PyTorch's by construction.
The last step, (P + bias).sum(dim=sum_dim), runs in PyTorch ops for any bias shape and sum_dim;
for the per-channel bias with sum_dim=1 in float32 (KernelBench's case) the kernel's own out is
returned instead, which saves two launches.

Errors are raised before any kernel runs, naming the argument: ValueError for shapes, sizes and
devices, TypeError for dtypes, IndexError for sum_dim.

This module imports only torch and the standard library: the KernelBench export embeds its text
(without the package-only block, and with OP_NAMESPACE rewritten).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

_ENVIRON = {}  # the process environment in the package (below); the KernelBench export has none

# ---- package-only begin
from os import environ as _ENVIRON  # noqa: F811
from ._build import load_extension as _load_extension
# ---- package-only end

OP_NAMESPACE = "convpool"

_SERVED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_STATE = {"loaded": False, "cuda": False, "op": None, "train_op": None, "infer_op": None, "block_op": None,
          "direct": None, "codes_in_forward": None, "train_direct": None, "tail_direct": None,
          "cpu_conv_route": None}


def _autocast_pools_in_fp32():
    """Per device type: does autocast run max_pool3d / adaptive_avg_pool3d in float32?"""
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    pools = ("aten::max_pool3d", "aten::adaptive_avg_pool3d")
    return {device: any(has_kernel(op, key) for op in pools)
            for device, key in (("cpu", "AutocastCPU"), ("cuda", "AutocastCUDA"))}


_AUTOCAST_FP32_POOL = _autocast_pools_in_fp32()


# ----------------------------------------------------------------------------- checks

def _triple(value, name):
    """(d, h, w) from an int or a sequence of 1 or 3 ints, as nn.MaxPool3d takes them."""
    t = (value,) * 3 if hasattr(value, "__index__") else value
    if isinstance(t, (tuple, list, torch.Size)) and len(t) == 1:
        t = tuple(t) * 3
    if not isinstance(t, (tuple, list, torch.Size)) or len(t) != 3 or not all(
            hasattr(v, "__index__") and not isinstance(v, bool) for v in t):
        raise ValueError(f"{name} must be an int or a tuple of 1 or 3 ints (D, H, W), got {value!r}")
    return tuple(v.__index__() for v in t)


def _check_core(x, weight, conv_bias, pool):
    """Checks shared by the op (5-D x) and the block (4-D or 5-D x); x.dim() is already valid."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 5:
        got = f"{weight.dim()}-D" if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight must be a 5-D tensor (C_out, C_in, kD, kH, kW), got {got}")
    cin, cdim = x.shape[-4], x.dim() - 4
    if cin != weight.shape[1]:
        raise ValueError(f"x has {cin} channels (dim {cdim}) but weight expects in_channels = "
                         f"{weight.shape[1]}")
    if weight.device != x.device:
        raise ValueError(f"weight is on {weight.device} but x is on {x.device}: all tensors must "
                         "be on the same device")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    if not weight.is_floating_point():
        raise TypeError(f"weight must be a floating-point tensor, got {weight.dtype}")
    channels = weight.shape[0]
    if conv_bias is not None:
        if conv_bias.device != x.device:
            raise ValueError(f"conv_bias is on {conv_bias.device} but x is on {x.device}: all "
                             "tensors must be on the same device")
        if conv_bias.dim() != 1 or conv_bias.shape[0] != channels:
            raise ValueError(f"conv_bias must have shape (out_channels,) = ({channels},), got "
                             f"{tuple(conv_bias.shape)}")
    if len(pool) != 3 or any(p <= 0 for p in pool):
        raise ValueError(f"pool_size must be 3 positive ints (pD, pH, pW), got {tuple(pool)}")
    spatial, kernel = tuple(x.shape[-3:]), tuple(weight.shape[2:])
    if any(s < k for s, k in zip(spatial, kernel)):
        raise ValueError(f"x spatial size (D, H, W) = {spatial} is smaller than the kernel "
                         f"{kernel} (weight dims 2-4)")
    conv = tuple(s - k + 1 for s, k in zip(spatial, kernel))
    if any(c // p == 0 for c, p in zip(conv, pool)):
        raise ValueError(f"pool_size {tuple(pool)} is larger than the conv output {conv} "
                         "(x spatial size - kernel + 1): the pooled output would be empty")


def _check_op_args(x, weight, conv_bias, bias, pool):
    """The op's own checks (the C++ kernels make the same ones)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 5:
        got = f"{x.dim()}-D" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a 5-D tensor (N, C, D, H, W), got {got}")
    _check_core(x, weight, conv_bias, pool)
    if bias is not None:
        if bias.device != x.device:
            raise ValueError(f"bias is on {bias.device} but x is on {x.device}: all tensors must "
                             "be on the same device")
        if bias.numel() != weight.shape[0]:
            raise ValueError(f"bias must have out_channels = {weight.shape[0]} elements, got "
                             f"{bias.numel()} (shape {tuple(bias.shape)})")


def _broadcast_shape(a, b):
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    out = []
    for u, v in zip(a, b):
        if u != v and u != 1 and v != 1:
            return None
        out.append(v if u == 1 else u)
    return tuple(out)


def _autocast_dtype(x):
    """The dtype autocast gives nn.Conv3d's operands for x, or None when it does not apply."""
    device = x.device.type
    if device not in ("cpu", "cuda") or x.dtype not in _SERVED_DTYPES:
        return None
    if not torch.is_autocast_enabled(device):
        return None
    return torch.get_autocast_dtype(device)


def check_block_args(x, weight, conv_bias, bias, pool, sum_dim):
    """Every check the block makes before computing; raises with a message naming the argument."""
    if not isinstance(x, torch.Tensor) or x.dim() not in (4, 5):
        got = f"{x.dim()}-D" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError("x must be a 5-D tensor (N, C, D, H, W) or a 4-D unbatched tensor "
                         f"(C, D, H, W), got {got}")
    _check_core(x, weight, conv_bias, pool)
    if _autocast_dtype(x) is None:
        for name, t in (("weight", weight), ("conv_bias", conv_bias)):
            if t is not None and t.dtype != x.dtype:
                raise TypeError(f"x ({x.dtype}) and {name} ({t.dtype}) must have the same dtype, "
                                "as nn.Conv3d requires outside torch.autocast")
    else:
        # autocast casts floating-point operands other than float64 (ATen's is_eligible): a
        # float64 (or integer) weight or conv bias reaches nn.Conv3d as it is, which then raises.
        for name, t in (("weight", weight), ("conv_bias", conv_bias)):
            if t is not None and (t.dtype == torch.float64 or not t.is_floating_point()):
                raise TypeError(f"{name} ({t.dtype}) is not cast by torch.autocast, so it must have "
                                "a floating-point dtype other than float64, as nn.Conv3d requires "
                                f"under torch.autocast (x is {x.dtype})")
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias must be a tensor, got {type(bias).__name__}")
    if bias.device != x.device:
        raise ValueError(f"bias is on {bias.device} but x is on {x.device}: all tensors must be "
                         "on the same device")
    pooled_shape = ((x.shape[0],) if x.dim() == 5 else ()) + (weight.shape[0], 1, 1, 1)
    result = _broadcast_shape(pooled_shape, tuple(bias.shape))
    if result is None:
        raise ValueError(f"bias of shape {tuple(bias.shape)} does not broadcast against the pooled "
                         f"tensor of shape {pooled_shape}")
    dims = sum_dim if isinstance(sum_dim, (tuple, list)) else (sum_dim,)
    for d in dims:
        if d is not None and not -len(result) <= d < len(result):
            raise IndexError(f"sum_dim {sum_dim!r} is out of range for the {len(result)}-D tensor "
                             f"(pooled + bias) of shape {result}")


# ----------------------------------------------------------------------------- op: fake + autograd

def _forward_fake(x, weight, conv_bias, bias, divisor, pool, tf32):
    _check_op_args(x, weight, conv_bias, bias, pool)
    batch, channels = x.shape[0], weight.shape[0]
    pooled = x.new_empty((batch, channels), dtype=torch.float32)
    out = x.new_empty((batch,) if bias is not None else (0,), dtype=torch.float32)
    return pooled, out


def _forward_inference_fake(x, weight, conv_bias, bias, divisor, pool, tf32):
    # forward_inference's out is (B, 1, 1, 1), the block's output, when bias is given.
    pooled, out = _forward_fake(x, weight, conv_bias, bias, divisor, pool, tf32)
    if bias is not None:  # a new tensor, not a view: a fake output must not alias another
        out = x.new_empty((x.shape[0], 1, 1, 1), dtype=torch.float32)
    return pooled, out


def _block_inference_fake(x, weight, conv_bias, bias, divisor, pool, tf32):
    _check_op_args(x, weight, conv_bias, bias, pool)
    return x.new_empty((x.shape[0], 1, 1, 1))


def _bias_grad(grad_out, channels):
    """The bias gradient of out[b] = sum_c (P[b, c] + bias[c]): sum_b grad_out[b] for every
    channel, as Model's autograd forms it (grad_out broadcast to (B, C), summed over the batch):
    the same reduction, so the same bits, with no copy of an expanded tensor. The C++ autograd
    kernel (binding.cpp, BlockTrain) does the same."""
    return grad_out.reshape(-1, 1).expand(-1, channels).sum(0)


def pooled_backward(x, weight, conv_bias, divisor, pool, grad_pooled, grad_out=None,
                    needs_input_grad=(True, True, True)):
    """Gradients of P (and out = sum_c (P + bias)) for x, weight, conv_bias; also bias's.

    Recomputes conv -> / divisor -> max pool (with indices) in PyTorch ops and backpropagates
    through them and the mean, as autograd does for Model. Works in x's dtype promoted to at least
    float32 and returns each gradient in its input's dtype (None where not needed).
    """
    dtype = torch.promote_types(x.dtype, torch.float32)
    xf, wf = x.to(dtype), weight.to(dtype)
    cbf = conv_bias.to(dtype) if conv_bias is not None else None
    grad = grad_pooled.to(dtype)
    if grad_out is not None:
        grad = grad + grad_out.to(dtype).unsqueeze(1)
    pool = list(pool)
    y = F.conv3d(xf, wf, cbf) / divisor
    pooled, indices = torch.ops.aten.max_pool3d_with_indices(y, pool, pool, [0, 0, 0], [1, 1, 1],
                                                             False)
    count = pooled.shape[2] * pooled.shape[3] * pooled.shape[4]
    grad_pooled_map = (grad / count)[:, :, None, None, None].expand(pooled.shape)
    grad_y = torch.ops.aten.max_pool3d_with_indices_backward(
        grad_pooled_map, y, pool, pool, [0, 0, 0], [1, 1, 1], False, indices) / divisor
    need_x, need_w, need_cb = needs_input_grad
    gx, gw, gcb = torch.ops.aten.convolution_backward(
        grad_y, xf, wf, [wf.shape[0]] if cbf is not None else None, [1, 1, 1], [0, 0, 0],
        [1, 1, 1], False, [0, 0, 0], 1, [need_x, need_w, need_cb and cbf is not None])
    gx = gx.to(x.dtype) if need_x else None
    gw = gw.to(weight.dtype) if need_w else None
    gcb = gcb.to(conv_bias.dtype) if need_cb and conv_bias is not None else None
    # out[b] = sum_c (P[b, c] + bias[c]): every bias[c] gets sum_b grad_out[b], reduced as
    # Model's autograd does (broadcast over the channels, summed over the batch).
    gbias = _bias_grad(grad_out, wf.shape[0]) if grad_out is not None else None
    return gx, gw, gcb, gbias


def _saved_conv_bias(ctx, conv_bias):
    """The conv bias as the backward keeps it: a copy of its values now, which the backward
    reads (the fused backward's arg-max, the dense formula and create_graph's recompute of the
    conv), and the input itself, unversioned, which only create_graph's recompute is connected
    to (_ops_backward). Model's autograd saves no conv bias (the conv's backward keeps x and the
    weight, the max pool its input), so Model lets conv.bias change in place between the forward
    and the backward (an optimizer or EMA step), and its backward is still the forward's;
    saving the input itself raised "modified by an inplace operation" there. The copy is
    out_channels values a training call. The C++ autograd kernel (binding.cpp, BlockTrain), which
    ModelNew's eager training call runs, keeps the copy only where its backward reads the values
    (codes_final_in_forward: not with CUDA TF32 codes, whose create_graph recompute pools at the
    codes); this path, torch.compile's, always copies."""
    ctx.conv_bias_input = conv_bias
    return None if conv_bias is None else conv_bias.detach().clone()


def _setup_context(ctx, inputs, output):
    x, weight, conv_bias, bias, divisor, pool, tf32 = inputs
    ctx.save_for_backward(x, weight, _saved_conv_bias(ctx, conv_bias))
    ctx.tf32 = tf32  # the backward's products follow the forward's precision
    ctx.divisor = divisor
    ctx.pool = list(pool)
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.bias_shape = None if bias is None else bias.shape  # any shape of out_channels elements


def _backward(ctx, grad_pooled, grad_out):
    x, weight, conv_bias = ctx.saved_tensors
    # Grad mode on inside a backward means create_graph: the fused kernels have no derivative,
    # so the gradients then come from PyTorch's ops (pooled_backward), which have one.
    if torch.is_grad_enabled() or not _fused_backward_serves(x, weight, conv_bias, ctx.divisor, ctx.pool):
        return _ops_backward(ctx, x, weight, conv_bias, grad_pooled, grad_out)
    need_x, need_w, need_cb = ctx.needs_input_grad[:3]
    need_cb = need_cb and conv_bias is not None
    gx, gw, gcb = getattr(torch.ops, OP_NAMESPACE).backward(
        x, weight, conv_bias, grad_pooled, grad_out if ctx.bias_dtype is not None else None, ctx.divisor,
        ctx.pool, need_x, need_w, need_cb, ctx.tf32)
    return _formula_grads(ctx, weight, grad_out, gx if need_x else None, gw if need_w else None,
                          gcb if need_cb else None)


def _formula_grads(ctx, weight, grad_out, gx, gw, gcb):
    """The op formulas' return value: the given x, weight and conv-bias gradients, the bias's
    (sum_b grad_out[b] per channel, in the bias's dtype and shape) where it is asked for."""
    gbias = None
    if ctx.bias_dtype is not None and ctx.needs_input_grad[3]:
        gbias = _bias_grad(grad_out, weight.shape[0]).to(ctx.bias_dtype).reshape(ctx.bias_shape)
    return gx, gw, gcb, gbias, None, None, None


def _ops_backward(ctx, x, weight, conv_bias, grad_pooled, grad_out):
    """The op formulas' backward through PyTorch's ops (pooled_backward): where the fused
    backward does not serve, and under create_graph."""
    with_out = ctx.bias_dtype is not None
    if conv_bias is not None and torch.is_grad_enabled():
        # create_graph: the forward's conv bias values (_saved_conv_bias) in the graph of the
        # input, which then gets Model's second-order gradient (zero: the arg-max has none).
        conv_bias = torch.where(torch.zeros_like(conv_bias, dtype=torch.bool), ctx.conv_bias_input, conv_bias)
    gx, gw, gcb, _ = pooled_backward(x, weight, conv_bias, ctx.divisor, ctx.pool, grad_pooled,
                                     grad_out if with_out else None, ctx.needs_input_grad[:3])
    return _formula_grads(ctx, weight, grad_out, gx, gw, gcb)


def _backward_op_fake(x, weight, conv_bias, grad_pooled, grad_out, divisor, pool, need_x, need_w, need_cb, tf32):
    f32 = torch.float32
    gx = x.new_empty(x.shape if need_x else (0,), dtype=f32)
    gw = x.new_empty(weight.shape if need_w else (0,), dtype=f32)
    gcb = x.new_empty((weight.shape[0] if need_cb and conv_bias is not None else 0,), dtype=f32)
    return gx, gw, gcb


# The CPU training forward (the op <ns>::forward_train): the forward's outputs and the arg-max
# codes from the same pass, saved for the backward (<ns>::backward_codes), which then does not
# find them again. block() takes it for CPU training calls the fused backward serves.
def _code_dtype(pool):
    volume = pool[0] * pool[1] * pool[2]
    return torch.uint8 if volume <= 256 else torch.int16 if volume <= 65536 else torch.int32


def _forward_train_fake(x, weight, conv_bias, bias, divisor, pool, tf32):
    pooled, out = _forward_fake(x, weight, conv_bias, bias, divisor, pool, tf32)
    dims = [(size - k + 1) // p for size, k, p in zip(x.shape[2:], weight.shape[2:], pool)]
    codes = x.new_empty((x.shape[0], weight.shape[0], *dims), dtype=_code_dtype(pool))
    return pooled, out, codes


def _save_train_state(ctx, inputs, codes):
    """What _backward_train reads: x, the weights and the codes, and the block's arguments."""
    x, weight, conv_bias, bias, divisor, pool, tf32 = inputs
    ctx.save_for_backward(x, weight, _saved_conv_bias(ctx, conv_bias), codes)
    ctx.tf32 = tf32
    ctx.divisor = divisor
    ctx.pool = list(pool)
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.bias_shape = None if bias is None else bias.shape


def _setup_context_train(ctx, inputs, output):
    codes = output[2]
    ctx.mark_non_differentiable(codes)
    _save_train_state(ctx, inputs, codes)


def _backward_train(ctx, grad_pooled, grad_out, grad_codes):
    x, weight, conv_bias, codes = ctx.saved_tensors
    if torch.is_grad_enabled():  # create_graph: PyTorch's ops, which have a derivative (_backward)
        return _ops_backward(ctx, x, weight, conv_bias, grad_pooled, grad_out)
    need_x, need_w, need_cb = ctx.needs_input_grad[:3]
    need_cb = need_cb and conv_bias is not None
    gx, gw, gcb, _ = getattr(torch.ops, OP_NAMESPACE).backward_codes(
        x, weight, conv_bias, codes, grad_pooled, grad_out if ctx.bias_dtype is not None else None, ctx.divisor,
        ctx.pool, need_x, need_w, need_cb, ctx.tf32)
    return _formula_grads(ctx, weight, grad_out, gx if need_x else None, gw if need_w else None,
                          gcb if need_cb else None)


def _backward_codes_fake(x, weight, conv_bias, codes, grad_pooled, grad_out, divisor, pool, need_x, need_w,
                         need_cb, tf32, need_bias=False):
    gx, gw, gcb = _backward_op_fake(x, weight, conv_bias, grad_pooled, grad_out, divisor, pool, need_x, need_w,
                                    need_cb, tf32)
    return gx, gw, gcb, x.new_empty((weight.shape[0] if need_bias else 0,), dtype=torch.float32)


# The conv-tail route (the ops <ns>::tail_train and <ns>::tail_backward): training where the
# fused backward does not serve. PyTorch's conv, mean and their backwards; the divide and the max
# pool in one pass, m = F.max_pool3d(y / divisor, pool) bit for bit, which keeps a code a window
# (a byte for windows of up to 256 positions) where Model keeps the quotient (y's size) and its
# max-pool indices (8 bytes a window); their backward in one pass writing the conv output's
# gradient, where Model's max pool backward zero-fills and scatters it and its division reads and
# writes it again. Every step rounds as Model's ops round it, so the output and the gradients are
# Model's, bit for bit, wherever PyTorch's own conv backward is deterministic.
def _tail_train_fake(y, divisor, pool):
    dims = (y.shape[0], y.shape[1], *[size // p for size, p in zip(y.shape[2:], pool)])
    return y.new_empty(dims), y.new_empty(dims, dtype=_code_dtype(pool))


def _tail_backward_fake(grad_m, codes, y_size, divisor, pool):
    return grad_m.new_empty(tuple(y_size))


def _conv_tail_fake(x, weight, conv_bias, divisor, pool):
    unbatched = x.dim() == 4
    xb = x.unsqueeze(0) if unbatched else x
    y = xb.new_empty((xb.shape[0], weight.shape[0], *[s - k + 1 for s, k in zip(xb.shape[2:], weight.shape[2:])]))
    m = _tail_train_fake(y, divisor, pool)[0]
    return m.squeeze(0) if unbatched else m


def _setup_context_tail(ctx, inputs, output):
    y, divisor, pool = inputs
    codes = output[1]
    ctx.mark_non_differentiable(codes)
    ctx.save_for_backward(codes)
    ctx.y_size, ctx.divisor, ctx.pool = list(y.shape), divisor, list(pool)


def _backward_tail(ctx, grad_m, grad_codes):
    (codes,) = ctx.saved_tensors
    if grad_m is None:
        return None, None, None
    if torch.is_grad_enabled():
        # create_graph: the same gradient from PyTorch's differentiable ops (the max pool's
        # backward from indices made of the codes, then the division), so it has a derivative.
        return _tail_backward_ops(ctx, codes, grad_m), None, None
    return getattr(torch.ops, OP_NAMESPACE).tail_backward(grad_m, codes, ctx.y_size, ctx.divisor, ctx.pool), None, None


def _tail_backward_ops(ctx, codes, grad_m):
    """_backward_tail through aten's max_pool3d backward (flat indices in the conv output's
    (d, h, w) plane rebuilt from the codes) and a division, which autograd can differentiate."""
    (pd, ph, pw), (cd, ch, cw) = ctx.pool, ctx.y_size[2:]
    # The codes are unsigned; the int16 and int32 tensors that hold them read back signed.
    c = codes.long() & {torch.uint8: 0xFF, torch.int16: 0xFFFF, torch.int32: 0xFFFFFFFF}[codes.dtype]
    od, rest = c // (ph * pw), c % (ph * pw)
    oh, ow = rest // pw, rest % pw
    dev = codes.device
    bd = torch.arange(codes.shape[2], device=dev).view(-1, 1, 1) * pd
    bh = torch.arange(codes.shape[3], device=dev).view(1, -1, 1) * ph
    bw = torch.arange(codes.shape[4], device=dev).view(1, 1, -1) * pw
    idx = ((bd + od) * ch + bh + oh) * cw + bw + ow
    shape_of_y = grad_m.new_empty(ctx.y_size)
    g = torch.ops.aten.max_pool3d_with_indices_backward(grad_m, shape_of_y, ctx.pool, ctx.pool, [0, 0, 0],
                                                        [1, 1, 1], False, idx)
    return g / ctx.divisor


def _tail_serves(pool):
    """Whether a training call the fused backward does not take runs the conv-tail route: a
    window a code can name (at most 2^32 positions), no torch.func transform (the route's
    autograd is a Python one, which they cannot run), and not forced to Model's ops
    (CONVPOOL_TORCH_BACKWARD=dense). Its conv is Model's call: an inference tensor raises there as
    in Model."""
    if pool[0] * pool[1] * pool[2] > 1 << 32:
        return False
    if _ENVIRON.get("CONVPOOL_TORCH_BACKWARD", "") == "dense":
        return False
    if _PEEK_FUNCTORCH is not None and not torch.compiler.is_compiling() and _PEEK_FUNCTORCH() is not None:
        return False
    return True


class _ConvTailConv(torch.autograd.Function):
    """F.conv3d with the conv-tail route's backward, as ConvTail's in binding.cpp, so block()'s
    route and ModelNew's give the same gradients: grad_x as a forward conv of grad_y with the
    weights flipped in d, h and w and their channel axes swapped (padding kernel - 1) where
    binding.cpp's grad_x_by_fprop holds (TF32), grad_weight as GEMMs over (batch, position)
    where its weight_grad_by_gemm holds (strict), anything else Model's own call
    (aten.convolution_backward). Its backward is made of differentiable ops, so create_graph
    works through it."""

    @staticmethod
    def forward(ctx, x, weight, conv_bias, fprop_x, gemm_w):
        ctx.save_for_backward(x, weight)
        ctx.has_cb, ctx.fprop_x, ctx.gemm_w = conv_bias is not None, fprop_x, gemm_w
        return F.conv3d(x, weight, conv_bias)

    @staticmethod
    def backward(ctx, gy):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_cb = ctx.needs_input_grad[:3]
        need_cb = need_cb and ctx.has_cb
        fprop_x, gemm_w = need_x and ctx.fprop_x, need_w and ctx.gemm_w
        gx = gw = gcb = None
        x5, gy5 = (x.unsqueeze(0), gy.unsqueeze(0)) if x.dim() == 4 else (x, gy)
        if fprop_x:
            flipped = weight.flip(2, 3, 4).transpose(0, 1).contiguous()
            gx = F.conv3d(gy.contiguous(), flipped, padding=[k - 1 for k in weight.shape[2:]])
            if x.dim() == 5 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last_3d):
                gx = gx.contiguous(memory_format=torch.channels_last_3d)
        if gemm_w:
            gw = _weight_grad_gemm(gy5.contiguous(), x5, weight)
        if (need_x and not fprop_x) or (need_w and not gemm_w) or need_cb:
            rx, rw, gcb = torch.ops.aten.convolution_backward(
                gy5, x5, weight, [weight.shape[0]] if ctx.has_cb else None, [1, 1, 1], [0, 0, 0], [1, 1, 1],
                False, [0, 0, 0], 1, [need_x and not fprop_x, need_w and not gemm_w, need_cb])
            if need_x and not fprop_x:
                gx = rx.squeeze(0) if x.dim() == 4 else rx
            if need_w and not gemm_w:
                gw = rw
        return gx, gw, gcb if need_cb else None, None, None


_GEMM_CHUNK_BYTES = 128 << 20


def _gemm_sample_floats(y_shape, w_shape):
    """binding.cpp's gemm_sample_floats: a sample's columns or its copy of grad_y, the larger."""
    return max(w_shape[1] * w_shape[2] * w_shape[3] * w_shape[4], w_shape[0]) * y_shape[-3] * y_shape[-2] * y_shape[-1]


def _weight_grad_gemm(gy, x, weight):
    """binding.cpp's weight_grad_gemm: grad_w[co, ci, tap] = sum over (b, p) of gy[b, co, p]
    x[b, ci, p + tap] as one FP32 GEMM a chunk of samples (columns cols[ci, tap, b, p] =
    x[b, ci, p + tap], at most _GEMM_CHUNK_BYTES of them, one copy of x's unfolded view)."""
    cout, cin, kd, kh, kw = weight.shape
    od, oh, ow = gy.shape[2:]
    per = max(1, _GEMM_CHUNK_BYTES // (4 * _gemm_sample_floats(gy.shape, weight.shape)))
    taps = kd * kh * kw
    out = gy.new_zeros((cout, cin * taps))
    for b0 in range(0, x.shape[0], per):
        windows = x[b0:b0 + per].unfold(2, kd, 1).unfold(3, kh, 1).unfold(4, kw, 1)
        nb = windows.shape[0]
        cols = gy.new_empty((cin, taps, nb, od, oh, ow))
        cols.view(cin, kd, kh, kw, nb, od, oh, ow).copy_(windows.permute(1, 5, 6, 7, 0, 2, 3, 4))
        out.addmm_(gy[b0:b0 + per].transpose(0, 1).reshape(cout, -1), cols.view(cin * taps, -1).t())
    out = out.view(weight.shape)
    if not weight.is_contiguous() and weight.is_contiguous(memory_format=torch.channels_last_3d):
        out = out.contiguous(memory_format=torch.channels_last_3d)
    return out


def _tail_conv_rules(x, weight):
    """(grad_x as a forward conv, grad_weight as GEMMs) for block()'s route: binding.cpp's
    grad_x_by_fprop and weight_grad_by_gemm (float32 CUDA tensors; TF32 mode and every kernel
    side at least 3 for the first, strict mode with 8 to 27 taps, full-FP32 cuBLAS matmuls and a
    sample's columns within a chunk for the second); neither under autocast (its conv is 16-bit)
    or torch.compile (whose graph keeps aten's conv backward)."""
    if not (x.is_cuda and x.dtype is torch.float32 and weight.dtype is torch.float32) or (
            torch.is_autocast_enabled("cuda") or torch.compiler.is_compiling()):
        return False, False
    tf32 = _tf32_now()
    k = weight.shape[2:]
    fprop_x = tf32 and torch.backends.cudnn.enabled and min(k) >= 3
    y_shape = [s - kk + 1 for s, kk in zip(x.shape[-3:], k)]
    gemm_w = (not tf32 and 8 <= k[0] * k[1] * k[2] <= 27
              and 4 * _gemm_sample_floats(y_shape, weight.shape) <= _GEMM_CHUNK_BYTES)
    if gemm_w:
        try:  # the legacy getter raises once the fp32_precision API was mixed in (as C++'s)
            gemm_w = (not torch.backends.cuda.matmul.allow_tf32
                      and torch.get_float32_matmul_precision() == "highest")
        except RuntimeError:
            gemm_w = False
    return fprop_x, gemm_w


def _conv_tail(x, weight, conv_bias, bias, divisor, div, pool, sum_dim):
    """Model.forward with its divide and max pool as the op <ns>::tail_train (see above)."""
    fprop_x, gemm_w = _tail_conv_rules(x, weight)
    if fprop_x or gemm_w:
        y = _ConvTailConv.apply(x, weight, conv_bias, fprop_x, gemm_w)
    else:
        y = F.conv3d(x, weight, conv_bias)
    yb = y.unsqueeze(0) if y.dim() == 4 else y
    m = _STATE["tail_op"](yb, div, list(pool))[0]
    if y.dim() == 4:
        m = m.squeeze(0)
    return torch.sum(F.adaptive_avg_pool3d(m, (1, 1, 1)) + bias, dim=sum_dim)


# The fused backward's gathers grow with Cin * Cout faster than the dense backward does. With the
# tiled kernels (H100, bench/profile_train.py, TF32 step against eager's): Cin * Cout = 128 won
# (headline 1.5x at batch 16 and 2.7-3x at 128, kernel 5 2.4x, pool 3 1.8x); 16 x 32 = 512 lost
# (0.65x) and 32 x 64 = 2048 lost (0.29x). On 2 CPU cores 1.12-2.61x at 128 and 0.83x at 2048;
# 512 was not measured there, so the CPU keeps the same limit. Where it does not serve, a
# training call runs the conv-tail route (_conv_tail: Model's step bit for bit, with the divide
# and max pool fused; until the eighteenth session PyTorch's own ops). Small CUDA problems, whose step
# is host time, used to take PyTorch's ops too (below 2^18 pooled windows: the Python autograd
# Function and a host read in the backward made the fused step lose there, 0.92x at 201,600).
# With the C++ autograd kernel (block_train) the fused step wins at every size measured (H200,
# 2026-11-26, batch 1-2, 25,600-215,264 windows: TF32 2.0-4.4x eager, strict 1.3-4.3x, while
# PyTorch's ops through convpool ran 0.87-1.0x), so CUDA has no size threshold now. Measured in
# docs/BENCHMARKS.md ("Training"); CONVPOOL_TORCH_BACKWARD=fused|dense forces either (dense:
# PyTorch's own ops, not the conv-tail route).
_FUSED_BACKWARD_MAX_CHANNEL_PRODUCT = 128
# Wider problems train fused too, where the twenty-first session measured the fused step ahead of
# the conv-tail route (docs/wide_fused_h200_s21.md for CUDA, docs/wide_fused_cpu_s21.md for the
# CPU). Up to Cin x Cout 2048 on both devices, and:
# - CUDA (H200, docs/experiments/small_batch_rule.py --fused), float32 models whose forward is the
#   group kernel (below) and Cin at most 32. Steps over eager, TF32 / strict, route -> fused:
#   c16_c32 (512) b1-b64: 0.99-1.59x -> 1.14-1.84x / 1.11-3.29x -> 1.43-9.32x;
#   c32_c64 (2048) b1-b64: 0.99-1.31x -> 1.28-1.79x / 1.04-2.00x -> 1.33-3.14x;
#   c16_c128, c8_c128 (2048, 1024) b2 and b16: 1.12-1.68x -> 1.38-2.66x / 1.38-9.47x -> 1.66-13.96x;
#   cin3_cout64 at 112^2 (192) b1-b64: 1.53-2.36x -> 2.03-4.12x / 3.61-8.39x -> 5.29-11.23x;
#   and the grad-enabled forwards 1.04-1.21x -> 1.35-3.70x (the group kernel's inference forward:
#   its codes come from a recompute in the backward, which the steps above include). Where Cin is
#   64 (c64_c32, c64_c64: 0.62-1.03x), at kernel 5 (c32_c32: 0.45-0.72x) and at Cin x Cout 4096
#   (c32_c128 b16 TF32 1.35x against the route's 1.39x) the route stays; pools the group kernel
#   does not take (pool 3: the general kernel, whose forward writes the codes) lost in the
#   forwards (0.64-0.93x) and stay too. 16-bit CUDA models keep the limit of 128 (their Model is
#   cuDNN's 16-bit conv; not measured wide).
# - CPU (2 cores, bench/bench_train_cpu.py with CONVPOOL_TORCH_BACKWARD=fused against the route),
#   every kernel side at most 3, any dtype: float32 steps at b2 and b8 took 0.31-0.96x the route's
#   time (c16_c16 to c32_c64, c64_c32, c8_c64, c16_c128 at kernel 2, pool 3, 1x3x3 with pool
#   1x2x2), the grad-enabled forwards 0.50-1.04x; bfloat16, whose conv PyTorch runs slowly on the
#   CPU, 17-42x eager (steps and forwards) against the route's 0.81-1.11x. Kernel 5 (c32_c32:
#   forward 1.60x the route's time) and Cin x Cout 8192 (c64_c128: forward 1.23x) keep the
#   route, though their steps were faster fused.
_FUSED_BACKWARD_WIDE_MAX_PRODUCT = 2048
_FUSED_BACKWARD_WIDE_CUDA_MAX_CIN = 32
# The group kernel's kernels (src/cuda/group.cu, group_can_implement) and its pools: pool_h in
# {1, 2, 4} and pool_w in {1, 2, 4, 8} (tile_pool_ok), any pool_d.
_GROUP_KERNELS = frozenset([(1, 1, 1), (2, 2, 2), (3, 3, 3), (1, 3, 3), (3, 1, 1)])


def _wide_fused_serves(x, weight, pool, divisor, dtype):
    """Whether a problem past _FUSED_BACKWARD_MAX_CHANNEL_PRODUCT still trains fused (see above):
    Cin x Cout at most 2048, and on the CPU every kernel side at most 3 and a forward that is the
    fused CPU conv (binding.cpp's cpu_conv_route sends problems where that conv is slower than
    PyTorch's to PyTorch's conv; their training forward would be that slower conv); on CUDA a
    float32 model (dtype None), Cin at most 32 and a kernel and pool of the group kernel's."""
    cout, cin = weight.shape[0], weight.shape[1]
    if cin * cout > _FUSED_BACKWARD_WIDE_MAX_PRODUCT:
        return False
    kernel = tuple(weight.shape[2:])
    if x.is_cpu:
        if max(kernel) > 3:
            return False
        route = _STATE["cpu_conv_route"]
        if route is None or torch.compiler.is_compiling():
            return True
        try:
            return not route(x if x.dim() == 5 else x.unsqueeze(0), weight, list(pool), float(divisor))
        except (ValueError, TypeError, IndexError, RuntimeError):
            return True  # a problem the op refuses: its call raises the block's own message
    return (dtype is None and cin <= _FUSED_BACKWARD_WIDE_CUDA_MAX_CIN and kernel in _GROUP_KERNELS
            and pool[1] in (1, 2, 4) and pool[2] in (1, 2, 4, 8))


# The innermost active torch.func transform, or None (torch's private API; absent: no check).
_PEEK_FUNCTORCH = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None)
# Whether a torch function mode is active (torch's private API; absent: assume one is).
_TORCH_FUNCTION_MODE_ON = getattr(torch._C, "_is_torch_function_mode_enabled", lambda: True)
# Tensor types whose calls need no __torch_function__ (Parameter disables its own).
_PLAIN_TYPES = (torch.Tensor, nn.Parameter)


def _f32_reciprocal_is_normal(divisor):
    """Exactly: is 1 / divisor, formed as PyTorch's CUDA division forms it (the divisor rounded
    to float32, its reciprocal in float32), a normal float32? (CPU tensors, same IEEE
    arithmetic.)"""
    f = torch.tensor(divisor, dtype=torch.float32)
    r = float(torch.tensor(1.0, dtype=torch.float32) / f)
    return 2.0 ** -126 <= abs(r) < float("inf")


def _max_normal_reciprocal_divisor():
    """The largest |divisor| for which _f32_reciprocal_is_normal holds (~8.5e37), found once by
    bisection: the per-call test is then a comparison, which torch.compile traces. (Below, the
    reciprocal first overflows at ~2.9e-39, under float32's smallest normal 2**-126, which
    _fused_backward_divisor requires of the divisor itself.)"""
    false_at, true_at = 1e38, 1e30
    while True:
        mid = (false_at + true_at) / 2
        if mid in (false_at, true_at):
            return true_at
        if _f32_reciprocal_is_normal(mid):
            true_at = mid
        else:
            false_at = mid


_MAX_NORMAL_RECIPROCAL_DIVISOR = _max_normal_reciprocal_divisor()


def _fused_backward_divisor(divisor):
    """Divisors the fused backward takes, on either device: a normal float32 whose float32
    reciprocal, formed as PyTorch's CUDA division forms it (float32 divisor, float32
    reciprocal, then x * reciprocal), is normal too: |divisor| in [2**-126, ~8.5e37]. On CUDA a
    reciprocal that is inf, 0 or subnormal changes Model's quotients themselves (x * inf, x * 0,
    or quantized to the subnormal's few bits), and its arg-max ties follow those products (the
    forward maps inf and 0 onto the divisors 0 and inf exactly: binding.cpp,
    torch_cuda_divisor); on both devices the gradient's scale 1 / divisor is then near
    float32's overflow, where whether a sum ends at inf or NaN depends on its order (a CPU fuzz
    against Model found such differences at every subnormal divisor). Model's own ops give its
    answer there exactly, and no real model divides by 1e-39. Zero, inf and NaN (also as a
    double that float32 rounds to 0 or inf, 1e-46 or 1e39) fail the comparisons."""
    return 2.0 ** -126 <= abs(divisor) <= _MAX_NORMAL_RECIPROCAL_DIVISOR


def _fused_backward_serves(x, weight, conv_bias, divisor, pool, dtype=None):
    """The fused backward (the op <ns>::backward): float32 (x's dtype, or dtype when autocast
    will cast to it) on the CPU or CUDA, a finite nonzero divisor (zero or inf makes every dense
    gradient NaN, which only the dense backward reproduces; a normal float32 whose reciprocal
    is normal, _fused_backward_divisor) and channels where it measured
    faster (Cin x Cout <= 128; up to 2048 on the CPU with kernel sides at most 3, and on CUDA for
    float32 models of the group kernel's shapes with Cin at most 32: _wide_fused_serves). x or
    weights that are not finite: the CPU op sends them to the dense backward; the CUDA kernels
    find them on the device and add the dense formula's 0 * inf terms themselves (no host
    synchronisation). x may be unbatched (4-D); pool is (pD, pH, pW)."""
    f32 = torch.float32
    if dtype is None and not (x.dtype is f32 and weight.dtype is f32 and (conv_bias is None or conv_bias.dtype is f32)):
        return False
    if dtype is not None and dtype is not f32:
        return False
    if not (x.device.type == "cpu" or (_STATE["cuda"] and x.is_cuda)):
        return False
    # torch.func transforms (grad, vjp, jacrev, ...) cannot run a C++ autograd Function, which
    # the fused backward is: under them the block is Model's own ops, which they differentiate.
    if _PEEK_FUNCTORCH is not None and not torch.compiler.is_compiling() and _PEEK_FUNCTORCH() is not None:
        return False
    if not _fused_backward_divisor(divisor):
        return False
    force = _ENVIRON.get("CONVPOOL_TORCH_BACKWARD", "")
    if force in ("fused", "dense"):
        return force == "fused"
    if weight.shape[0] * weight.shape[1] <= _FUSED_BACKWARD_MAX_CHANNEL_PRODUCT:
        return True
    return _wide_fused_serves(x, weight, pool, divisor, dtype)


def _register_python_kernels():
    namespace = getattr(torch.ops, OP_NAMESPACE)
    # Once per process: a second copy of this code (KernelBench exec's a file per evaluation)
    # finds the first copy's kernels, which are the same code.
    if getattr(namespace, "_convpool_python_kernels", False):
        return
    qualname = f"{OP_NAMESPACE}::forward"
    torch.library.register_fake(qualname)(_forward_fake)
    torch.library.register_autograd(qualname, _backward, setup_context=_setup_context)
    torch.library.register_fake(f"{OP_NAMESPACE}::forward_inference")(_forward_inference_fake)
    torch.library.register_fake(f"{OP_NAMESPACE}::block_inference")(_block_inference_fake)
    torch.library.register_fake(f"{OP_NAMESPACE}::backward")(_backward_op_fake)
    train = f"{OP_NAMESPACE}::forward_train"
    torch.library.register_fake(train)(_forward_train_fake)
    torch.library.register_autograd(train, _backward_train, setup_context=_setup_context_train)
    torch.library.register_fake(f"{OP_NAMESPACE}::backward_codes")(_backward_codes_fake)
    torch.library.register_fake(f"{OP_NAMESPACE}::block_train")(_block_inference_fake)
    tail = f"{OP_NAMESPACE}::tail_train"
    torch.library.register_fake(tail)(_tail_train_fake)
    torch.library.register_autograd(tail, _backward_tail, setup_context=_setup_context_tail)
    torch.library.register_fake(f"{OP_NAMESPACE}::tail_backward")(_tail_backward_fake)
    torch.library.register_fake(f"{OP_NAMESPACE}::conv_tail")(_conv_tail_fake)
    namespace._convpool_python_kernels = True


def load():
    """Build (once, cached on disk) and load the extension; registers the op. Idempotent.

    Returns True when the extension has the CUDA path. ModelNew calls this in its constructor;
    call it yourself before torch.compile of a function that uses block() directly.
    """
    if not _STATE["loaded"]:
        cuda, module = _load_extension()
        _STATE["cuda"] = bool(cuda)
        # ModelNew's inference entry past the op dispatcher (binding.cpp, block_inference_direct).
        _STATE["direct"] = getattr(module, "block_inference_direct", None)
        _STATE["codes_in_forward"] = getattr(module, "codes_in_forward", None)
        # Whether a CPU forward runs as PyTorch's conv and convpool's tail (binding.cpp,
        # cpu_conv_route): such problems keep the conv-tail route for training (_wide_fused_serves).
        _STATE["cpu_conv_route"] = getattr(module, "cpu_conv_route", None)
        # ModelNew's training calls made from C++ (binding.cpp, block_train_direct and
        # conv_tail_block_direct): the same ops without torch.ops's Python packing.
        _STATE["train_direct"] = getattr(module, "block_train_direct", None)
        _STATE["tail_direct"] = getattr(module, "conv_tail_block_direct", None)
        _register_python_kernels()
        _STATE["op"] = getattr(torch.ops, OP_NAMESPACE).forward.default
        _STATE["train_op"] = getattr(torch.ops, OP_NAMESPACE).forward_train.default
        _STATE["infer_op"] = getattr(torch.ops, OP_NAMESPACE).forward_inference.default
        _STATE["block_op"] = getattr(torch.ops, OP_NAMESPACE).block_inference.default
        _STATE["block_train_op"] = getattr(torch.ops, OP_NAMESPACE).block_train.default
        _STATE["tail_op"] = getattr(torch.ops, OP_NAMESPACE).tail_train.default
        _STATE["conv_tail_op"] = getattr(torch.ops, OP_NAMESPACE).conv_tail.default
        _STATE["loaded"] = True
    return _STATE["cuda"]


def forward_op(x, weight, conv_bias, bias, divisor, pool, tf32):
    """The raw op: (P (B, C) float32, out (B,) float32 or empty). x must be 5-D."""
    load()
    return _STATE["op"](x, weight, conv_bias, bias, divisor, list(pool), tf32)


# ----------------------------------------------------------------------------- the block

def _cudnn_allows_tf32():
    """Does nn.Conv3d use TF32 for float32 on CUDA now? (PyTorch's default: yes.)"""
    if torch.compiler.is_compiling():
        return bool(torch.backends.cudnn.allow_tf32)  # dynamo reads this flag and guards on it
    conv = getattr(torch.backends.cudnn, "conv", None)
    if conv is None:  # torch before the fp32_precision API
        return bool(torch.backends.cudnn.allow_tf32)
    # The conv's own setting, whichever API (legacy allow_tf32 or fp32_precision) set it; the
    # legacy getter raises when the two APIs were mixed.
    return conv.fp32_precision == "tf32"


# The conv's fp32 precision, read without the Python property's overhead where torch has it
# (_cudnn_allows_tf32 is the full rule; _tf32_now is its fast form for the per-call path).
_PREC_GETTER = getattr(torch._C, "_get_fp32_precision_getter", None)
_CONV_PREC = getattr(torch.backends.cudnn, "conv", None)
_CONV_PREC_KEY = (_CONV_PREC.backend, _CONV_PREC.op) if _CONV_PREC is not None and _PREC_GETTER else None


def _tf32_now():
    if _CONV_PREC_KEY is None:
        return _cudnn_allows_tf32()
    return _PREC_GETTER(*_CONV_PREC_KEY) == "tf32"


def _as_float(divisor):
    """The divisor as the kernel's double, or None for what only the composite serves. A Python
    int goes into PyTorch's division as an int64 (or uint64) scalar: outside [-2**63, 2**64)
    Model raises OverflowError, which the composite then raises too."""
    if isinstance(divisor, float):
        return divisor
    if isinstance(divisor, int) and -2 ** 63 <= divisor < 2 ** 64:
        return _int_as_float(divisor)
    return None


def _int_as_float(n):
    """An int divisor as the served dtypes' division sees it: PyTorch's float32 opmath converts
    the int64 (uint64) scalar to float once, correctly rounded, and the kernels take the double
    this returns to float exactly. float(n) alone would round twice past 2^53, to 53 bits and
    then to 24, which can land an ulp away (2^60 + 2^36 + 1: 2^60 through the double, 2^60 +
    2^37 in Model). Only the served dtypes use it (float64 runs Model's own ops)."""
    a = abs(n)
    if a <= 2 ** 53:
        return float(n)
    shift = a.bit_length() - 24
    q, r = divmod(a, 1 << shift)
    half = 1 << (shift - 1)
    if r > half or (r == half and q & 1):
        q += 1
    v = float(q << shift)
    return -v if n < 0 else v


def _per_channel(bias, channels):
    """Does bias broadcast against (B, C, 1, 1, 1) as one value per channel?"""
    if bias.dim() > 5:
        return False
    shape = (1,) * (5 - bias.dim()) + tuple(bias.shape)
    return shape[0] == 1 and shape[1] == channels and shape[2:] == (1, 1, 1)


def _upcast_training(x, weight, conv_bias, divisor, pool, autocast):
    """Whether a float16 or bfloat16 model trains through the float32 fused path: x, the
    weights and the conv bias upcast (exactly), the training forward and the fused backward in
    float32, the pooled means rounded to x's dtype and the block's tail in Model's 16-bit ops,
    as the inference forward does; each gradient rounded to its input's dtype. ModelNew's call
    runs it in block_train's C++ autograd kernel (BlockTrain, binding.cpp); block() with
    autograd-visible casts around the ops (the same results).
    Why: PyTorch's 16-bit conv backward is no faster than its float32 one on CUDA (cuDNN's
    dense dgrad and wgrad plus layout transposes: the bfloat16 headline step at b16 was 1.34 ms
    eager, and the conv-tail route only 0.96-0.98x of it), and on the CPU it has no fast kernel
    at all (2-core machine, headline batch 2: float16 1636 ms and bfloat16 724 ms a step
    against 21.8 ms for float32; the conv-tail route took 751 ms in bfloat16).
    The gradients differ from Model's where Model's 16-bit rounding of the conv output ties a
    window's best values (its max pool then picks the first, the fused codes the float32
    maximum). bfloat16's 8-bit rounding ties many windows, so there they move often: the fused
    gradients are the ones closer to float64 autograd on the same operands
    (test_half_models_train_fused checks both dtypes against twice Model's error). Past the
    fused backward's channel limits (Cin x Cout 128 on CUDA; 2048, kernel sides 3 on the CPU) a
    16-bit model takes the conv-tail route, Model's step bit for bit; under
    CONVPOOL_TORCH_BACKWARD=dense, Model's own ops. Inputs Model would refuse to save for the
    backward (inference tensors) stay on Model's ops: the upcast copies would hide them. Same
    conditions as float32's fused backward otherwise."""
    if autocast is not None or x.dtype not in (torch.float16, torch.bfloat16):
        return False
    if weight.dtype is not x.dtype or (conv_bias is not None and conv_bias.dtype is not x.dtype):
        return False
    if x.is_inference() or weight.is_inference() or (conv_bias is not None and conv_bias.is_inference()):
        return False
    return _fused_backward_serves(x, weight, conv_bias, divisor, pool, dtype=torch.float32)


def _composite(x, weight, conv_bias, bias, divisor, pool, sum_dim):
    """Model's own ops: bit-identical to Model."""
    y = F.conv3d(x, weight, conv_bias)
    y = y / divisor
    y = F.max_pool3d(y, pool)
    y = F.adaptive_avg_pool3d(y, (1, 1, 1))
    return torch.sum(y + bias, dim=sum_dim)


def _composite_reason(x, weight, div, compute):
    """Why the block runs as PyTorch's composite rather than a convpool kernel, or None."""
    if div is None:
        return "the divisor is not a Python number"
    if compute not in _SERVED_DTYPES:
        return f"dtype {compute} is not served by the kernels"
    if x.numel() == 0 or weight.numel() == 0:
        return "empty input or weight"
    if not (x.device.type == "cpu" or (x.device.type == "cuda" and _STATE["cuda"])):
        return f"no convpool kernel for device {x.device}"
    return None


def block(x, weight, conv_bias, bias, divisor, pool_size, sum_dim):
    """Model.forward as a function of its parameters, through the fused kernel where it serves."""
    pool = _triple(pool_size, "pool_size")
    check_block_args(x, weight, conv_bias, bias, pool, sum_dim)
    div = _as_float(divisor)
    device = x.device.type
    autocast = _autocast_dtype(x)
    compute = autocast if autocast is not None else x.dtype
    if not _STATE["loaded"]:
        load()
    if _FORWARD_AD._current_level >= 0 or _composite_reason(x, weight, div, compute) is not None:
        return _composite(x, weight, conv_bias, bias, divisor, pool, sum_dim)

    unbatched = x.dim() == 4
    xb = x.unsqueeze(0) if unbatched else x
    batch, channels = xb.shape[0], weight.shape[0]
    tf32 = (_cudnn_allows_tf32() if torch.compiler.is_compiling() else _tf32_now()) if device == "cuda" else False
    op = _STATE["infer_op"]  # no gradient needed: the op without a Python autograd kernel
    upcast = False
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or bias.requires_grad or (
            conv_bias is not None and conv_bias.requires_grad)):
        op = _STATE["op"]
        # Training: the fused backward where it serves and measured faster than PyTorch's (for a
        # 16-bit model on float32 copies); elsewhere the conv-tail route, Model's step bit for
        # bit with the divide and max pool fused; Model's own ops where neither serves.
        if not _fused_backward_serves(x, weight, conv_bias, div, pool, dtype=autocast):
            upcast = _upcast_training(x, weight, conv_bias, div, pool, autocast)
            if not upcast:
                if _tail_serves(pool):
                    return _conv_tail(x, weight, conv_bias, bias, divisor, div, pool, sum_dim)
                return _composite(x, weight, conv_bias, bias, divisor, pool, sum_dim)
        if device == "cpu" and autocast is None:
            # The CPU training forward saves the codes (forward_train); its third output is
            # dropped here and kept by autograd for the backward.
            op = _STATE["train_op"]
        elif upcast and not torch.compiler.is_compiling() and _STATE["codes_in_forward"] is not None and _STATE[
                "codes_in_forward"](xb, weight, list(pool), div, tf32):
            # A 16-bit model on CUDA where the fused forward writes the codes in its own pass:
            # the training forward, so the backward does not run the forward again.
            op = _STATE["train_op"]

    if autocast is not None:
        xb, weight = xb.to(autocast), weight.to(autocast)
        conv_bias = conv_bias.to(autocast) if conv_bias is not None else None
        pooled_dtype = torch.float32 if _AUTOCAST_FP32_POOL.get(device, False) else autocast
    else:
        pooled_dtype = x.dtype
    if upcast:
        # The inference forward's own first step (the CPU op upcasts 16-bit x and weights to
        # float32), here as autograd-visible casts: their backward rounds each gradient to its
        # input's dtype.
        xb, weight = xb.float(), weight.float()
        conv_bias = conv_bias.float() if conv_bias is not None else None
    fuse = (not unbatched and type(sum_dim) is int and sum_dim in (1, -4)
            and pooled_dtype == torch.float32 and bias.dtype == torch.float32
            and _per_channel(bias, channels))
    pooled, out = op(xb, weight, conv_bias, bias.reshape(channels) if fuse else None, div, list(pool), tf32)[:2]
    if fuse:
        return out.view(batch, 1, 1, 1)
    shape = (channels, 1, 1, 1) if unbatched else (batch, channels, 1, 1, 1)
    pooled = pooled.to(pooled_dtype).view(shape)
    return torch.sum(pooled + bias, dim=sum_dim)


def release_cpu_scratch():
    """Free the x-sized scratch the CPU training backward keeps between calls (one per process,
    reused while x's size stays within 4x of it; 17 MB for x of 8x8x16x64x64 float32). Call it
    after CPU training to give the memory back; the next CPU backward allocates again."""
    load()
    getattr(torch.ops, OP_NAMESPACE).release_cpu_scratch()


def explain(model, x):
    """The path model(x) takes, as one line: on CUDA the fused kernel family the plan picked (its
    tile and why the faster families were passed over) or cuDNN's conv followed by convpool's
    pooling kernel; on the CPU the fused CPU path; else PyTorch's composite and why.
    model is a ModelNew (or anything with conv, divisor and pool_size or max_pool)."""
    pool_size = getattr(model, "pool_size", None)
    if pool_size is None:
        pool_size = model.max_pool.kernel_size
    pool = _triple(pool_size, "pool_size")
    weight = model.conv.weight.detach()
    load()
    div = _as_float(model.divisor)
    autocast = _autocast_dtype(x)
    compute = autocast if autocast is not None else x.dtype
    device = x.device.type
    why = _composite_reason(x, weight, div, compute)
    if why is not None:
        return f"composite: PyTorch ops ({why})"
    xb = x.unsqueeze(0) if x.dim() == 4 else x
    if autocast is not None:
        xb = xb.to(autocast)
    tf32 = _cudnn_allows_tf32() if device == "cuda" else False
    return getattr(torch.ops, OP_NAMESPACE).explain(xb.detach(), weight, list(pool), div, tf32)


_FORWARD_AD = torch.autograd.forward_ad
_CONV3D_FORWARD, _CONV3D_CONV_FORWARD = nn.Conv3d.forward, nn.Conv3d._conv_forward
# nn.Module's process-wide hooks (torch.nn.modules.module; mutated in place by
# register_module_forward_hook and friends, so holding the dicts sees every registration).
_GLOBAL_HOOKS = tuple(d for d in (getattr(torch.nn.modules.module, n, None) for n in (
    "_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks",
    "_global_backward_hooks")) if d is not None)


def _hooked(d):
    """Does the module whose __dict__ is d have hooks? (per call: dict reads, not attributes)"""
    return bool(d["_forward_hooks"] or d["_forward_pre_hooks"] or d["_backward_hooks"]
                or d["_backward_pre_hooks"])


def _plain_modules(conv, max_pool, avg_pool):
    """Would Model's three submodules compute exactly what the fused block computes? That is:
    an nn.Conv3d whose forward is nn.Conv3d's (a subclass that only adds parametrizations is
    fine) with stride 1, no padding, dilation 1 and one group; an nn.MaxPool3d whose stride is
    its kernel (no padding, dilation 1, floor mode); an nn.AdaptiveAvgPool3d to 1 x 1 x 1; and
    no module hooks on any of them (torch.nn.utils.prune, the old weight_norm, a user's hook).
    Anything else runs Model's own forward through the modules, so it means what it means in
    PyTorch. Called on every forward, hence the reads from the modules' __dict__."""
    t = type(conv)
    if t is not nn.Conv3d and not (isinstance(conv, nn.Conv3d) and t.forward is _CONV3D_FORWARD
                                   and t._conv_forward is _CONV3D_CONV_FORWARD):
        return False
    if type(max_pool) is not nn.MaxPool3d or type(avg_pool) is not nn.AdaptiveAvgPool3d:
        return False
    c, p, a = conv.__dict__, max_pool.__dict__, avg_pool.__dict__
    if _hooked(c) or _hooked(p) or _hooked(a) or any(_GLOBAL_HOOKS):
        return False
    ks, stride = p["kernel_size"], p["stride"]
    return (c["stride"] == (1, 1, 1) and c["padding"] == (0, 0, 0) and c["dilation"] == (1, 1, 1)
            and c["groups"] == 1 and (stride is ks or stride == ks)
            and p["padding"] in (0, (0, 0, 0)) and p["dilation"] in (1, (1, 1, 1))
            and not p["ceil_mode"] and not p["return_indices"] and a["output_size"] in (1, (1, 1, 1)))


class ModelNew(nn.Module):
    """Drop-in for Model: same constructor, parameters (conv.weight, conv.bias, bias) and RNG use,
    same output shape and dtype; the block runs as one fused kernel (see the module docstring)."""

    def __init__(self, in_channels, out_channels, kernel_size, divisor, pool_size, bias_shape,
                 sum_dim):
        super().__init__()
        # Model's modules, in Model's order (the pooling modules hold no parameters and draw no
        # random numbers, so the RNG stream and the state_dict are Model's).
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.divisor = divisor
        self.max_pool = nn.MaxPool3d(pool_size)
        self.global_avg_pool = nn.AdaptiveAvgPool3d((1, 1, 1))
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.sum_dim = sum_dim
        load()

    @property
    def pool_size(self):
        """The max pool's window (max_pool.kernel_size); assigning it sets the window and the
        stride, as constructing nn.MaxPool3d(pool_size) does."""
        return self.max_pool.kernel_size

    @pool_size.setter
    def pool_size(self, value):
        self.max_pool.kernel_size = value
        self.max_pool.stride = value

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name in ("divisor", "pool_size", "sum_dim", "max_pool"):
            self.__dict__["_fast_cfg"] = None

    def __setstate__(self, state):
        # Unpickling (pickle, torch.load of the module, multiprocessing's spawn) skips
        # __init__, whose load() the per-call path relies on: a process that had built no
        # ModelNew then found no op to call.
        super().__setstate__(state)
        load()

    def _fast_config(self):
        """(pool list, divisor as float, the max pool's kernel_size as read) when the
        constructor arguments allow the per-call fast path (a Python-number divisor, a valid
        pool, sum_dim over the channels), else False. Recomputed when divisor, pool_size or
        sum_dim is assigned, and when the max pool's kernel_size differs from the one read
        (reassigned on the submodule or a list edited in place)."""
        cfg = False
        ks = self.max_pool.kernel_size
        try:
            pool = _triple(ks, "pool_size")
        except ValueError:
            pool = None
        div = _as_float(self.divisor)
        sd = self.sum_dim
        if pool is not None and div is not None and type(sd) is int and sd in (1, -4):
            cfg = (list(pool), div, list(ks) if type(ks) is list else ks)
        self.__dict__["_fast_cfg"] = cfg
        return cfg

    def _model_forward(self, x):
        """Model.forward itself, through the submodules."""
        x = self.conv(x)
        x = x / self.divisor
        x = self.max_pool(x)
        x = self.global_avg_pool(x)
        x = x + self.bias
        return torch.sum(x, dim=self.sum_dim)

    def _fast_forward(self, x):
        """The common call in few Python steps: 5-D x of a served dtype (float32, float16,
        bfloat16) on a served device, no autocast, weights and biases of x's dtype, a
        per-channel bias, sum over the channels; and when a gradient is needed, float32 where
        the fused backward serves. It returns None for anything else (block() then makes
        every check and picks the path). The op checks shapes and devices itself; when it
        refuses, block()'s checks run to raise the block's own message.

        This is the per-call host path, so it reads the parameters from the modules' own dicts
        (nn.Module.__getattr__ costs ~1 us per name) and calls ops without a Python autograd
        kernel: block_inference, which returns the block's output (16-bit x: block()'s own
        rounding steps, run in C++), or for training block_train, whose autograd kernel is C++
        (the training forward saves the codes, the backward reads them; binding.cpp). Both
        dicts are the live ones: a reassigned conv, weight or bias is seen on the next call."""
        cfg = self.__dict__.get("_fast_cfg")
        if cfg is None or (cfg is not False and self._modules["max_pool"].kernel_size != cfg[2]):
            cfg = self._fast_config()
        dt = x.dtype
        if cfg is False or dt not in _SERVED_DTYPES or x.dim() != 5:
            return None
        conv = self._modules.get("conv")
        cp = getattr(conv, "_parameters", None)
        if cp is None:
            return None
        w, cb, b = cp.get("weight"), cp.get("bias"), self._parameters.get("bias")
        if w is None or b is None or w.dtype is not dt or b.dtype is not dt or (
                cb is not None and cb.dtype is not dt):
            return None
        train = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or b.requires_grad or (
            cb is not None and cb.requires_grad))
        # Plain inference goes past the op dispatcher (~3.5 us a call); the C++ side makes the
        # checks below and those of dispatch (autocast, tracing, modes) and returns None for
        # anything else, which then takes the op as before. (A training call it would refuse,
        # so it is not asked.)
        direct = _STATE["direct"]
        if direct is not None and not train:
            out = direct(x, w, cb, b, cfg[1], cfg[0], x.is_cuda and _tf32_now())
            if out is not None:
                return out
        autocast = False
        if x.is_cuda:
            if not _STATE["cuda"]:
                return None
            autocast = torch.is_autocast_enabled("cuda")
            if autocast and not (train and dt is torch.float32):
                return None
            tf32 = _tf32_now()
        elif x.is_cpu:
            if torch.is_autocast_enabled("cpu"):
                return None
            tf32 = False
        else:
            return None
        bshape, channels = b.shape, w.shape[0]
        d = self.__dict__
        if bshape != d.get("_fast_bias_shape") or channels != d.get("_fast_channels"):
            if not _per_channel(b, channels):
                return None
            d["_fast_bias_shape"], d["_fast_channels"] = bshape, channels
        if x.numel() == 0 or w.numel() == 0:
            return None
        if autocast:
            # Training a float32 model under CUDA autocast: the conv-tail route from C++ (its
            # conv runs in the autocast dtype, as Model's does; ConvTail in binding.cpp).
            # block()'s Python route measured 0.71-0.98x eager's forward at batch 2 (H200,
            # docs/experiments/small_batch_rule.py --autocast).
            dense = True
        else:
            # Training the fused backward does not serve (wide channels, 16-bit past its limits,
            # a zero or non-finite divisor) runs the conv-tail route (or Model's own ops where it
            # does not serve), called from here rather than through block() and its checks
            # (which run only when the ops raise, for the named message). A 16-bit model trains
            # through the float32 fused path where it serves (_upcast_training), in
            # block_train's C++ autograd kernel as float32 does.
            upcast = train and dt is not torch.float32 and _upcast_training(x, w, cb, cfg[1], cfg[0], None)
            dense = train and not upcast and not (dt is torch.float32 and
                                                  _fused_backward_serves(x, w, cb, cfg[1], cfg[0]))
        # Training calls go through the dispatcher from C++ (load() says why) unless a torch
        # function mode or a tensor subclass would want the op call handed to __torch_function__.
        plain = train and (type(x) is torch.Tensor and type(w) in _PLAIN_TYPES and type(b) in _PLAIN_TYPES
                           and (cb is None or type(cb) in _PLAIN_TYPES) and not _TORCH_FUNCTION_MODE_ON())
        try:
            if dense:
                if not _tail_serves(cfg[0]):
                    return _composite(x, w, cb, b, self.divisor, cfg[0], self.sum_dim)
                # The conv-tail route (_conv_tail) through its op with a C++ autograd kernel.
                if plain and _STATE["tail_direct"] is not None:
                    return _STATE["tail_direct"](x, w, cb, b, cfg[1], cfg[0])
                m = _STATE["conv_tail_op"](x, w, cb, cfg[1], cfg[0])
                return torch.sum(F.adaptive_avg_pool3d(m, (1, 1, 1)) + b, dim=self.sum_dim)
            if train:
                if plain and _STATE["train_direct"] is not None:
                    return _STATE["train_direct"](x, w, cb, b, cfg[1], cfg[0], tf32)
                return _STATE["block_train_op"](x, w, cb, b, cfg[1], cfg[0], tf32)
            return _STATE["block_op"](x, w, cb, b, cfg[1], cfg[0], tf32)
        except (ValueError, TypeError, IndexError, RuntimeError):
            check_block_args(x, w, cb, b, tuple(cfg[0]), self.sum_dim)  # the block's message
            raise

    def forward(self, x):
        mods = self._modules
        if _FORWARD_AD._current_level >= 0 or not _plain_modules(
                mods.get("conv"), mods.get("max_pool"), mods.get("global_avg_pool")):
            # Forward-mode AD (the op has no jvp formula), or submodules the fused block would
            # not reproduce (hooks, pruning, strides or paddings, a replaced module): Model's
            # forward, so the result is PyTorch's by construction.
            return self._model_forward(x)
        if not torch.compiler.is_compiling():
            out = self._fast_forward(x)
            if out is not None:
                return out
        return block(x, self.conv.weight, self.conv.bias, self.bias, self.divisor, self.pool_size,
                     self.sum_dim)

    def extra_repr(self):
        return f"divisor={self.divisor}, pool_size={self.pool_size}, sum_dim={self.sum_dim}"
