"""The conv-tail training route (_ops._conv_tail; the ops <ns>::tail_train and <ns>::tail_backward,
convpool_tail_{train,backward}_{cpu,cuda}): training calls the fused backward does not take (wide
channels, autocast, a zero or non-finite divisor) run PyTorch's conv, mean and their
backwards with the divide and max pool fused. Every step rounds as Model's ops round it, so the
output and every gradient are Model's bit for bit, on the CPU and (deterministic cuDNN) on CUDA,
except two on float32 CUDA tensors: in TF32 mode with every kernel side at least 3 grad_x is a
forward conv of the same grad_y (binding.cpp, grad_x_by_fprop), which these tests hold to that
conv bit for bit and to float64 within TF32 rounding; in strict mode with 8 to 27 taps
grad_weight is GEMMs over (batch, position) (weight_grad_by_gemm), held to the Python twin bit
for bit and to an error against float64 at most twice Model's. Each case checks that the route
ran (the ops recorded), so none can pass on Model's own ops."""
import contextlib
import math

import pytest
import torch
import torch.nn.functional as F

import convpool
from _util import RecordOps, count_state_calls, cuda_available, make_pair

def ops():
    convpool.load()
    return getattr(torch.ops, convpool._ops.OP_NAMESPACE)

# (constructor arguments, x's shape). Past the fused backward's limits on both devices (Cin x Cout
# past 2048; the CPU trains fused up to 2048 with kernel sides at most 3, CUDA float32 up to Cin 32
# and Cin x Cout 2048 for the group kernel's shapes) unless a dtype or divisor sends the case here.
C = 48  # Cin and Cout: 48 x 48 = 2304
WIDE = [C, C, 3, 2.0, 2, (C, 1, 1, 1), 1]
CASES = {
    "wide": (WIDE, (2, C, 7, 9, 11)),
    "wide_pool3_remainders": ([C, C, 3, -1.5, 3, (C, 1, 1, 1), 1], (2, C, 10, 11, 13)),
    "anisotropic_sum0": ([C, C, (1, 3, 2), 3.0, (2, 3, 1), (C,), 0], (2, C, 7, 9, 11)),
    "pool1_sum2": ([C, C, 2, 0.5, 1, (C, 1, 1), 2], (2, C, 4, 5, 6)),
    "unbatched": ([C, C, 3, 2.0, 2, (C, 1, 1, 1), 1], (C, 6, 8, 7)),
    "bias_scalar_sum_last": ([C, C, 3, 2, 2, (1,), -1], (1, C, 6, 6, 8)),  # an int divisor
    "window_512": ([C, C, 2, 1.0, (2, 16, 16), (C, 1, 1, 1), 1], (1, C, 5, 19, 18)),
}


def _grads(model, x, seed=3):
    """model(x) and the gradients of a fixed random loss of it for x and every parameter."""
    xi = x.clone().requires_grad_(True)
    y = model(xi)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed)).to(y.dtype).to(y.device)
    return y.detach(), torch.autograd.grad((y * g).sum(), [xi] + list(model.parameters()))


def _assert_bitwise(a, b, what):
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{what}: {m}")


def _grad_x_is_fprop(device, dtype, kernel):
    """Whether the route's grad_x is a forward conv (binding.cpp, grad_x_by_fprop): float32 CUDA
    tensors, cuDNN in TF32 mode, every kernel side at least 3."""
    return (device == "cuda" and dtype == torch.float32 and torch.backends.cudnn.enabled
            and torch.backends.cudnn.allow_tf32 and min(kernel) >= 3)


def _weight_grad_is_gemm(device, dtype, kernel):
    """Whether the route's grad_weight is GEMMs over (batch, position) (binding.cpp,
    weight_grad_by_gemm): float32 CUDA tensors, strict mode, 8 to 27 taps, full-FP32 matmuls
    (and a sample's columns within 128 MB, which every shape of these tests is)."""
    taps = kernel[0] * kernel[1] * kernel[2]
    return (device == "cuda" and dtype == torch.float32 and not torch.backends.cudnn.allow_tf32
            and 8 <= taps <= 27 and not torch.backends.cuda.matmul.allow_tf32
            and torch.get_float32_matmul_precision() == "highest")


def _assert_gemm_weight_grad(got, want, gy, x, weight, what):
    """grad_weight as GEMMs: the Python twin's (_ops._weight_grad_gemm, the same calls as
    binding.cpp's) result bit for bit, and its largest error against float64 at most twice that
    of Model's (cuDNN's FP32 wgrad) plus 2^-20 of the largest weight gradient."""
    gy, x, weight = gy.detach().contiguous(), x.detach(), weight.detach()
    if x.dim() == 4:
        gy, x = gy.unsqueeze(0), x.unsqueeze(0)
    _assert_bitwise(got, convpool._ops._weight_grad_gemm(gy, x, weight), what)
    ref = torch.ops.aten.convolution_backward(gy.double(), x.double(), weight.double(), None, [1] * 3, [0] * 3,
                                              [1] * 3, False, [0] * 3, 1, [False, True, False])[1]
    scale = ref.abs().max().item()
    err_got, err_want = (got.double() - ref).abs().max().item(), (want.double() - ref).abs().max().item()
    assert err_got <= 2 * err_want + 2.0 ** -20 * scale, (what, err_got, err_want, scale)


def _model_grad_y(ref, x, seed=3):
    """Model's gradient of its conv output for _grads' loss (Model.forward's ops, y kept)."""
    y = ref.conv(x)
    out = torch.sum(ref.global_avg_pool(ref.max_pool(y / ref.divisor)) + ref.bias, dim=ref.sum_dim)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.dtype).to(out.device)
    return torch.autograd.grad((out * g).sum(), [y])[0]


def _assert_fprop_grad_x(got, gy, weight, what):
    """grad_x formed as conv3d(grad_y, weight flipped and transposed, padding kernel - 1): that
    call's result bit for bit (deterministic cuDNN), and the transposed conv in float64 within
    TF32 rounding elementwise (both operands rounded to 11 bits: 2^-10 of sum |gy| |w|, with room
    for FP32 accumulation), where the float64 sum is finite."""
    gy, weight = gy.detach().contiguous(), weight.detach()  # the route's grad_y is contiguous
    pad = [k - 1 for k in weight.shape[2:]]
    _assert_bitwise(got, F.conv3d(gy, weight.flip(2, 3, 4).transpose(0, 1).contiguous(), padding=pad), what)
    ref = F.conv_transpose3d(gy.double(), weight.double())
    bound = F.conv_transpose3d(gy.double().abs(), weight.double().abs()) * 2.0 ** -9 + 1e-30
    check = torch.isfinite(ref) & (bound < 1e37)
    err = (got.double() - ref).abs()
    assert bool((err[check] <= bound[check]).all()), f"{what}: {(err / bound)[check].max().item()} x the bound"
    assert not torch.isfinite(got[~torch.isfinite(ref)]).any(), f"{what}: finite where float64 is not"
    assert check.any() or not torch.isfinite(ref).any()


def _check_model_step(init, shape, dtype, device="cpu", x_fn=None, seed=0):
    ref, new = make_pair(init, seed=seed)
    ref, new = ref.to(device, dtype), new.to(device, dtype)
    gen = torch.Generator().manual_seed(seed)
    x = (torch.rand(shape, generator=gen) * 2 - 1)
    if x_fn is not None:
        x = x_fn(x)
    x = x.to(device, dtype)
    rec = RecordOps()
    with rec:
        y_new, g_new = _grads(new, x)
    assert "tail_train" in rec.ops and "tail_backward" in rec.ops, rec.ops
    assert not rec.fused_backward, rec.ops
    y_ref, g_ref = _grads(ref, x)
    assert y_new.dtype == y_ref.dtype
    _assert_bitwise(y_new, y_ref, "output")
    names = ["x"] + [n for n, _ in ref.named_parameters()]
    for name, a, b in zip(names, g_new, g_ref):
        assert a.dtype == b.dtype, name
        if name == "x" and _grad_x_is_fprop(device, dtype, ref.conv.kernel_size):
            _assert_fprop_grad_x(a, _model_grad_y(ref, x), ref.conv.weight, "grad x (a forward conv)")
        elif name == "conv.weight" and _weight_grad_is_gemm(device, dtype, ref.conv.kernel_size):
            _assert_gemm_weight_grad(a, b, _model_grad_y(ref, x), x, ref.conv.weight, "grad weight (GEMMs)")
        else:
            _assert_bitwise(a, b, f"grad {name}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("case", list(CASES))
def test_cpu_step_is_models(case, dtype):
    init, shape = CASES[case]
    _check_model_step(init, shape, dtype)


@pytest.mark.parametrize("divisor", [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-40, 3e38, -7.25])
def test_cpu_every_divisor(divisor):
    init = list(WIDE)
    init[3] = divisor
    _check_model_step(init, CASES["wide"][1], torch.float32)


def test_cpu_nonfinite_x():
    def poison(x):
        x[0, 1, 2, 3, 4], x[1, 0, 0, 0, 0], x[0, 5, 6, 8, 10] = math.nan, math.inf, -math.inf
        return x
    _check_model_step(WIDE, CASES["wide"][1], torch.float32, x_fn=poison)


def _check_autocast_step(device, dtype, init=None, shape=None):
    """Under torch.autocast the route runs (autocast's conv gives a 16-bit y; on the CPU through
    block(), on CUDA through ConvTail, which casts for its backward as autocast did) and the
    output and gradients are Model's bit for bit."""
    if init is None:
        init, shape = CASES["wide"]
    ref, new = make_pair(init, seed=4)
    ref, new = ref.to(device), new.to(device)
    x = (torch.rand(shape) * 2 - 1).to(device)
    results = []
    for model in (new, ref):
        rec = RecordOps()
        with rec, torch.autocast(device, dtype=dtype):
            results.append(_grads(model, x))
        if model is new:
            assert "tail_train" in rec.ops, rec.ops
    (y_new, g_new), (y_ref, g_ref) = results
    _assert_bitwise(y_new, y_ref, "output")
    for a, b in zip(g_new, g_ref):
        _assert_bitwise(a, b, "gradient")


def test_autocast_cpu_step_is_models():
    _check_autocast_step("cpu", torch.bfloat16)


def test_dense_environment_keeps_models_ops(monkeypatch):
    monkeypatch.setenv("CONVPOOL_TORCH_BACKWARD", "dense")
    init, shape = CASES["wide"]
    _, new = make_pair(init)
    rec = RecordOps()
    with rec:
        _grads(new, torch.rand(shape))
    assert "tail_train" not in rec.ops and not rec.fused_backward, rec.ops


@pytest.mark.parametrize("case", ["wide_pool3_remainders", "anisotropic_sum0", "window_49152_sum0"])
def test_create_graph_matches_model(case):
    # A gradient penalty: under create_graph the route's backward runs differentiable ops
    # (ModelNew's call: Model's ops recomputed; block()'s: aten's max-pool backward from indices
    # rebuilt from the codes, whose 2-byte codes past 32767 read back signed), so the
    # second-order gradients are Model's.
    init, shape = CASES[case] if case in CASES else (
        [12, 16, 5, 2.0, (4, 128, 96), (16,), 0], (2, 12, 8, 132, 100))  # a third of the positions past 32767
    x = torch.rand(shape) * 2 - 1
    results = []
    for model in make_pair(init, seed=6):
        xi = x.clone().requires_grad_(True)
        y = model(xi)
        gx, = torch.autograd.grad(y.sum(), xi, create_graph=True)
        params = list(model.parameters())
        second = torch.autograd.grad((gx ** 2).sum(), [xi] + params[:2], allow_unused=True)
        results.append([y.detach(), gx.detach()] + [s for s in second])
    for a, b in zip(*results):
        # x's second-order gradient is zero: Model's graph leaves it unconnected (None), the
        # route's connects it through the custom op with zeros.
        if a is None or b is None:
            assert (a is None or not a.any()) and (b is None or not b.any())
            continue
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * (b.abs().max().item() + 1e-12))


def test_compiled_training_step_fullgraph():
    # torch.compile(fullgraph=True) of the module (the ops' fake kernels and Python autograd
    # trace without a graph break); its forward and backward against Model's (aot_eager: the
    # ops run as traced, no codegen).
    init, shape = CASES["wide"]
    ref, new = make_pair(init, seed=8)
    compiled = torch.compile(new, fullgraph=True, backend="aot_eager")
    x = torch.rand(shape) * 2 - 1
    from torch.profiler import profile
    with profile() as prof:
        y_got, got = _grads(compiled, x)
    names = {e.name for e in prof.events()}
    assert "convpool::tail_train" in names and "convpool::tail_backward" in names, sorted(names)[:40]
    y_want, want = _grads(ref, x)
    _assert_bitwise(y_got, y_want, "compiled output")
    for a, b in zip(got, want):
        _assert_bitwise(a, b, "compiled gradient")


def _check_ops(dtype, device, w, cases):
    """The ops alone, against F.max_pool3d(y / divisor) and its autograd: NaN, inf and a tied
    window in y, each (divisor, pool) of cases."""
    y = (torch.randn(2, 3, 7, 9, w) * 4).to(dtype)
    y[0, 0, 0, 0, :4] = 1.0  # a tied window
    y[0, 1, 1, 2, 3], y[1, 2, 3, 4, 5], y[1, 0, 6, 8, w - 1] = math.nan, math.inf, -math.inf
    y = y.to(device)
    for divisor, pool in cases:
        m, codes = ops().tail_train(y, divisor, pool)
        yr = y.clone().requires_grad_(True)
        want = F.max_pool3d(yr / divisor, pool)
        _assert_bitwise(m, want.detach(), f"m, divisor {divisor}, pool {pool}")
        gm = torch.randn(want.shape).to(dtype).to(device)
        gy, = torch.autograd.grad(want, yr, gm)
        got = ops().tail_backward(gm, codes, list(y.shape), divisor, pool)
        _assert_bitwise(got, gy, f"grad_y, divisor {divisor}, pool {pool}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
def test_ops_are_max_pool_and_its_backward(dtype):
    _check_ops(dtype, "cpu", 10, ((2.0, [2, 2, 2]), (-0.3, [3, 2, 1]), (0.0, [1, 3, 4])))


def test_op_errors_name_the_argument():
    y = torch.rand(1, 2, 4, 4, 4)
    with pytest.raises(TypeError, match="y must be float32, float16 or bfloat16"):
        ops().tail_train(y.double(), 2.0, [2, 2, 2])
    with pytest.raises(ValueError, match="5-D"):
        ops().tail_train(y[0], 2.0, [2, 2, 2])
    m, codes = ops().tail_train(y, 2.0, [2, 2, 2])
    with pytest.raises(ValueError, match="codes must be"):
        ops().tail_backward(m, codes.int(), list(y.shape), 2.0, [2, 2, 2])
    with pytest.raises(ValueError, match="grad_m must have"):
        ops().tail_backward(m[:, :1], codes, list(y.shape), 2.0, [2, 2, 2])


# ---- CUDA ----

needs_cuda = pytest.mark.skipif(not cuda_available(), reason="no CUDA device (or convpool built without CUDA)")


@pytest.fixture
def deterministic_cudnn():
    old = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = old


@needs_cuda
@pytest.mark.parametrize("tf32", [False, True], ids=["strict", "tf32"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_step_is_models(case, dtype, tf32, deterministic_cudnn):
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        init, shape = CASES[case]
        _check_model_step(init, shape, dtype, device="cuda")
    finally:
        torch.backends.cudnn.allow_tf32 = old


@needs_cuda
@pytest.mark.parametrize("divisor", [0.0, math.inf, math.nan, 1e-40, 3e38, -7.25])
def test_cuda_every_divisor(divisor, deterministic_cudnn):
    init = list(WIDE)
    init[3] = divisor
    _check_model_step(init, CASES["wide"][1], torch.float32, device="cuda")


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
def test_cuda_ops_are_max_pool_and_its_backward(dtype):
    # 70 columns: runs of a row past one warp's; pool 2x4x16 leaves a 6-column tail.
    _check_ops(dtype, "cuda", 70, ((2.0, [2, 2, 2]), (-0.3, [3, 2, 1]), (0.0, [1, 3, 4]), (0.7, [2, 4, 16])))


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("case", ["wide", "fused_channels"])
def test_cuda_autocast_step_is_models(case, dtype, deterministic_cudnn, monkeypatch):
    # ModelNew's training call under CUDA autocast takes the route from C++ (one
    # conv_tail_block_direct call), for channels the fused backward would take without autocast
    # too; Model's step bit for bit.
    init, shape = CASES["wide"] if case == "wide" else ([4, 6, 3, 2.0, 2, (6, 1, 1, 1), 1], (2, 4, 7, 9, 11))
    calls = count_state_calls(monkeypatch, "tail_direct")
    _check_autocast_step("cuda", dtype, init, shape)
    assert calls == [torch.float32], calls


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_cuda_autocast_create_graph_is_models(dtype, deterministic_cudnn):
    # A gradient penalty under CUDA autocast: ConvTail's create_graph recompute runs its conv
    # on casts to the autocast dtype, as Model's; first- and second-order gradients bit for bit.
    init, shape = CASES["wide"]
    ref, new = make_pair(init, seed=8)
    ref, new = ref.cuda(), new.cuda()
    x = (torch.rand(shape, generator=torch.Generator().manual_seed(8)) * 2 - 1).cuda()
    results = []
    for model in (new, ref):
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=dtype):
            y = model(xi)
        params = [xi] + list(model.parameters())
        first = torch.autograd.grad(y.float().sum(), params, create_graph=True)
        penalty = sum((g.float() ** 2).sum() for g in first[:2])
        second = torch.autograd.grad(penalty, params, allow_unused=True)
        results.append((y.detach(), first, second))
    _assert_bitwise(results[0][0], results[1][0], "output")
    for i, (a, b) in enumerate(zip(results[0][1] + results[0][2], results[1][1] + results[1][2])):
        assert (a is None) == (b is None), i
        if a is not None:
            assert a.dtype == b.dtype, i
            _assert_bitwise(a.detach(), b.detach(), f"gradient {i}")


def _conv_tail_op_and_models_ops(unbatched, device, seed):
    """(x, w, cb) on device, x 5-D or unbatched 4-D, and two functions of them: the op
    <ns>::conv_tail and Model's ops, F.max_pool3d(F.conv3d(x, w, cb) / divisor)."""
    torch.manual_seed(seed)
    x = (torch.rand((3, 6, 7, 9) if unbatched else (2, 3, 6, 7, 9)) * 2 - 1).to(device)
    w, cb = torch.randn(5, 3, 3, 2, 3).to(device), torch.randn(5).to(device)
    return (x, w, cb), (lambda xi, wi, ci: ops().conv_tail(xi, wi, ci, -1.5, [2, 3, 2]),
                        lambda xi, wi, ci: F.max_pool3d(F.conv3d(xi, wi, ci) / -1.5, [2, 3, 2]))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
@pytest.mark.parametrize("unbatched", [False, True], ids=["batched", "unbatched"])
def test_conv_tail_op_is_models_ops(unbatched, device, deterministic_cudnn):
    # <ns>::conv_tail (ModelNew's eager call of the route, C++ autograd) on its own: m and every
    # gradient equal F.max_pool3d(F.conv3d(x, w, cb) / divisor) and its autograd, for 5-D and
    # unbatched 4-D x (ModelNew sends only 5-D x; the op is public).
    inputs, fns = _conv_tail_op_and_models_ops(unbatched, device, seed=11)
    g = torch.randn(fns[1](*inputs).shape).to(device)
    results = []
    for fn in fns:
        xi, wi, ci = (t.clone().requires_grad_(True) for t in inputs)
        m = fn(xi, wi, ci)
        results.append([m.detach()] + list(torch.autograd.grad(m, [xi, wi, ci], g)))
    for a, b in zip(*results):
        _assert_bitwise(a, b, "conv_tail")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
@pytest.mark.parametrize("unbatched", [False, True], ids=["batched", "unbatched"])
def test_conv_tail_op_create_graph_is_models_ops(unbatched, device, deterministic_cudnn):
    # A gradient penalty through <ns>::conv_tail: its create_graph recompute pools at the saved
    # codes (pool_at_codes, binding.cpp; it keeps no copy of the conv bias), for 5-D and
    # unbatched 4-D x. x's gradient and the second-order gradients of the weights and the conv
    # bias are those of F.max_pool3d(F.conv3d(...)) and its autograd; the conv bias's is a zero
    # tensor, not None, as Model's max pool connects it.
    inputs, fns = _conv_tail_op_and_models_ops(unbatched, device, seed=12)
    results = []
    for fn in fns:
        xi, wi, ci = (t.clone().requires_grad_(True) for t in inputs)
        gx, = torch.autograd.grad(fn(xi, wi, ci).sum(), xi, create_graph=True)
        results.append([gx.detach()] + list(torch.autograd.grad((gx ** 2).sum(), [wi, ci], allow_unused=True)))
    for i, (a, b) in enumerate(zip(*results)):
        assert (a is None) == (b is None), f"gradient {i}: {a is None} None against Model's {b is None}"
        if b is not None:
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6 * (b.abs().max().item() + 1.0)), f"gradient {i}"


@needs_cuda
@pytest.mark.parametrize("layout", ["batched", "unbatched", "channels_last"])
@pytest.mark.parametrize("kernel", [3, (3, 5, 4), (1, 3, 3)], ids=["k3", "k354", "k133"])
def test_cuda_conv_tail_gradients(kernel, layout, deterministic_cudnn):
    # The op's grad_x in TF32 mode: a forward conv where every kernel side is at least 3 (checked
    # against that conv and float64), Model's dgrad bit for bit otherwise (kernel 1x3x3) and in
    # strict mode; grad_weight in strict mode GEMMs for 8 to 27 taps (kernels 3 and 1x3x3:
    # checked against the Python twin and float64), else Model's; grad_conv_bias Model's in
    # every mode. The layout of grad_x follows x's (channels_last_3d x gets a channels-last
    # gradient, as from the dgrad).
    torch.manual_seed(5)
    k3 = (kernel,) * 3 if isinstance(kernel, int) else kernel
    shape = (6, 7, 9, 11) if layout == "unbatched" else (2, 6, 7, 9, 11)
    x = (torch.rand(shape) * 2 - 1).cuda()
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last_3d)
    w, cb = torch.randn(24, 6, *k3).cuda(), torch.randn(24).cuda()
    pool = [2, 2, 1]
    old = torch.backends.cudnn.allow_tf32
    try:
        for tf32 in (True, False):
            torch.backends.cudnn.allow_tf32 = tf32
            got, want = [], []
            for fn, out in ((lambda xi, wi, ci: ops().conv_tail(xi, wi, ci, 2.0, pool), got),
                            (lambda xi, wi, ci: F.max_pool3d(F.conv3d(xi, wi, ci) / 2.0, pool), want)):
                xi, wi, ci = (t.clone().requires_grad_(True) for t in (x, w, cb))
                m = fn(xi, wi, ci)
                g = torch.randn(m.shape, generator=torch.Generator().manual_seed(1)).cuda()
                out.extend([m.detach()] + list(torch.autograd.grad(m, [xi, wi, ci], g)))
            _assert_bitwise(got[0], want[0], "m")
            _assert_bitwise(got[3], want[3], "grad conv bias")
            assert got[1].shape == x.shape and got[1].stride() == want[1].stride()
            y = F.conv3d(x, w, cb).requires_grad_(True)
            m = F.max_pool3d(y / 2.0, pool)
            g = torch.randn(m.shape, generator=torch.Generator().manual_seed(1)).cuda()
            gy = torch.autograd.grad(m, [y], g)[0]
            if tf32 and min(k3) >= 3:
                _assert_fprop_grad_x(got[1], gy, w, "grad x (a forward conv)")
            else:
                _assert_bitwise(got[1], want[1], "grad x (Model's dgrad)")
            if _weight_grad_is_gemm("cuda", torch.float32, k3):
                assert not tf32 and k3 != (3, 5, 4)
                _assert_gemm_weight_grad(got[2], want[2], gy, x, w, "grad weight (GEMMs)")
            else:
                _assert_bitwise(got[2], want[2], "grad weight")
    finally:
        torch.backends.cudnn.allow_tf32 = old


@pytest.mark.parametrize("unbatched", [False, True], ids=["batched", "unbatched"])
@pytest.mark.parametrize("kernel", [3, (3, 2, 3), (1, 3, 3)], ids=["k3", "k323", "k133"])
def test_conv_tail_conv_formulas(kernel, unbatched, monkeypatch):
    # block()'s route's conv (_ops._ConvTailConv) with both of its formulas forced, in float64 on
    # the CPU (the route takes them only for float32 CUDA tensors): grad_x as a forward conv of
    # the flipped weights and grad_weight as GEMMs over (batch, position) -- chunks of one sample,
    # so the chunk loop runs -- against F.conv3d's own autograd, then gradcheck and gradgradcheck
    # (create_graph goes through these backwards).
    monkeypatch.setattr(convpool._ops, "_GEMM_CHUNK_BYTES", 1)
    k3 = (kernel,) * 3 if isinstance(kernel, int) else kernel
    gen = torch.Generator().manual_seed(4)
    shape = (3, 5, 6, 7) if unbatched else (3, 3, 5, 6, 7)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    w = torch.randn((4, 3) + k3, generator=gen, dtype=torch.float64)
    cb = torch.randn(4, generator=gen, dtype=torch.float64)
    conv = convpool._ops._ConvTailConv
    y = F.conv3d(x, w, cb)
    g = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    results = []
    for fn in (lambda a, b, c: conv.apply(a, b, c, True, True), F.conv3d):
        xi, wi, ci = (t.clone().requires_grad_(True) for t in (x, w, cb))
        out = fn(xi, wi, ci)
        results.append([out.detach()] + list(torch.autograd.grad(out, [xi, wi, ci], g)))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # gradcheck's cost grows with the inputs' and the output's sizes: a smaller problem.
    small = (torch.randn(((2,) if unbatched else (1, 2)) + tuple(k + 1 for k in k3), generator=gen,
                         dtype=torch.float64), torch.randn((2, 2) + k3, generator=gen, dtype=torch.float64),
             torch.randn(2, generator=gen, dtype=torch.float64))
    inputs = tuple(t.requires_grad_(True) for t in small)
    f = lambda a, b, c: conv.apply(a, b, c, True, True)  # noqa: E731
    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)


@pytest.mark.parametrize("route", ["conv_tail", "fused"])
def test_module_calls_from_cpp_unless_torch_function_wants_them(route, monkeypatch):
    # ModelNew's training calls go through the dispatcher from C++ (binding.cpp,
    # conv_tail_block_direct and block_train_direct): one direct call, the same output and
    # gradients as the torch.ops path bit for bit. Under a torch function mode the torch.ops
    # path runs instead (that call would be handed to the mode), with the same results.
    from torch.overrides import TorchFunctionMode

    class Passing(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    init, shape = (WIDE, CASES["wide"][1]) if route == "conv_tail" else (
        [4, 6, 3, 2.0, 2, (6, 1, 1, 1), 1], (2, 4, 7, 9, 11))
    key = "tail_direct" if route == "conv_tail" else "train_direct"
    _, new = make_pair(init, seed=6)
    x = torch.rand(shape) * 2 - 1
    assert convpool._ops._STATE[key] is not None
    calls = count_state_calls(monkeypatch, key)
    results = []
    for mode in (None, Passing()):
        rec = RecordOps()
        with rec, (mode if mode is not None else contextlib.nullcontext()):
            results.append(_grads(new, x))
        assert ("tail_train" in rec.ops) == (route == "conv_tail"), rec.ops
        assert len(calls) == 1, (mode, calls)  # the direct entry ran once, not under the mode
    (y0, g0), (y1, g1) = results
    _assert_bitwise(y0, y1, "output")
    for a, b in zip(g0, g1):
        _assert_bitwise(a, b, "gradient")
