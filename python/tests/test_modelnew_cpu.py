"""ModelNew against Model on the CPU: shapes, parameters, dtypes, special values, layouts.

Tolerance rule (float32, float16, bfloat16): ModelNew's error against Model run in float64 on
the same operands must be at most twice PyTorch's own error in that precision, plus 8 ulps of the
output's scale (assert_no_worse_than_torch). float64 goes through the PyTorch composite and must
be bit-identical to Model.
"""
import math

import pytest
import torch
import torch.nn.utils.parametrizations  # noqa: F401  (weight_norm)
import torch.nn.utils.prune  # noqa: F401

import convpool
from _util import EPS, RecordOps, assert_close, assert_no_worse_than_torch, direct_calls, make_pair, oracle

# (batch, in_ch, out_ch, (D, H, W), kernel, pool): odd sizes, pool remainders, batch 1,
# single channels, kernel 1, anisotropic kernels and pools, out_ch not a multiple of 4, long rows.
SHAPES = [
    (2, 3, 4, (8, 9, 10), 3, 2),
    (1, 1, 1, (5, 5, 5), 3, 3),
    (3, 2, 5, (7, 11, 13), (1, 2, 3), (2, 1, 3)),
    (1, 8, 16, (6, 10, 12), 3, 2),
    (2, 4, 3, (4, 4, 4), 1, 1),
    (1, 2, 2, (3, 3, 40), 3, (1, 1, 5)),
    (2, 3, 17, (9, 8, 7), 2, (3, 2, 2)),
    (1, 5, 1, (10, 10, 70), 3, 4),
    (1, 1, 6, (3, 3, 3), 3, 1),
]


def init_for(shape, divisor=2.0, bias_shape=None, sum_dim=1):
    batch, cin, cout, spatial, kernel, pool = shape
    bias_shape = (cout, 1, 1, 1) if bias_shape is None else bias_shape
    return [cin, cout, kernel, divisor, pool, bias_shape, sum_dim]


def input_for(shape, seed=1, dtype=torch.float32):
    batch, cin, _, spatial, _, _ = shape
    g = torch.Generator().manual_seed(seed)
    return torch.rand(batch, cin, *spatial, generator=g).to(dtype)


def check_pair(init, x, what, seed=0):
    ref, new = make_pair(init, seed)
    with torch.no_grad():
        got, want = new(x), ref(x)
    assert_no_worse_than_torch(got, want, oracle(ref, x), EPS[x.dtype], what)
    return got, want


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"B{s[0]}-Ci{s[1]}-Co{s[2]}-{s[3]}-k{s[4]}-p{s[5]}")
def test_shapes_headline_bias(shape):
    check_pair(init_for(shape), input_for(shape), f"shape {shape}")


@pytest.mark.parametrize("sum_dim", [0, 1, 2, 3, 4, -1, -4, -5, (1, 2), (0, 1), None])
@pytest.mark.parametrize("bias_shape", [(3, 1, 1, 1), (1, 3, 1, 1, 1), (1,), (), (3, 1, 1),
                                        (1, 1, 1, 1), (2, 1, 1, 1, 1, 1), (4, 3, 1, 1, 1)])
def test_sum_dim_and_bias_shape(sum_dim, bias_shape):
    shape = (4, 2, 3, (6, 7, 8), 3, 2)
    x = input_for(shape)
    init = init_for(shape, bias_shape=bias_shape, sum_dim=sum_dim)
    ref, new = make_pair(init)
    with torch.no_grad():
        try:
            want = ref(x)
        except (IndexError, RuntimeError) as e:  # Model rejects it: so must ModelNew
            with pytest.raises((IndexError, ValueError, RuntimeError)):
                new(x)
            return
        got = new(x)
    assert_no_worse_than_torch(got, want, oracle(ref, x), EPS[torch.float32],
                               f"sum_dim={sum_dim} bias_shape={bias_shape}")


@pytest.mark.parametrize("divisor", [2.0, 3, -1.5, -4, 0.0, -0.0, 1e-30, 1e30, math.inf, -math.inf,
                                     math.nan, True])
def test_divisor_values(divisor):
    shape = (2, 3, 5, (6, 6, 7), 3, 2)
    x = input_for(shape) - 0.5  # signed conv outputs: max and min both matter
    ref, new = make_pair(init_for(shape, divisor=divisor))
    with torch.no_grad():
        got, want = new(x), ref(x)
    assert_no_worse_than_torch(got, want, oracle(ref, x), EPS[torch.float32], f"divisor={divisor}")


# Ints past 2^53 where rounding through a double lands on a float32 midpoint (the first three),
# and the ends of PyTorch's int64 / uint64 scalars.
BIG_INT_DIVISORS = [2 ** 60 + 2 ** 36 + 1, -(2 ** 60 + 2 ** 36 + 1), 2 ** 54 + 2 ** 30 + 1, 2 ** 63 - 1, -2 ** 63,
                    2 ** 64 - 1]


@pytest.mark.parametrize("divisor", BIG_INT_DIVISORS)
def test_big_int_divisors_round_once(divisor):
    # PyTorch's float32 division converts an int scalar to float once (correctly rounded);
    # float(divisor) rounds to 53 bits first, and for the first three an ulp away (2^60 +
    # 2^36 + 1: 2^60 that way, 2^60 + 2^37 in Model). ModelNew's kernels take the int as Model's
    # float: its output and x.grad are those of a ModelNew given that float.
    as_f32 = torch.tensor(divisor, dtype=torch.int64 if divisor < 2 ** 63 else torch.uint64).float().item()
    assert torch.tensor(convpool._ops._as_float(divisor), dtype=torch.float64).float().item() == as_f32
    shape = (2, 3, 5, (6, 6, 7), 3, 2)
    x = (input_for(shape) - 0.5) * abs(as_f32)  # quotients of order 1
    results = []
    for d in (divisor, as_f32):
        ref, new = make_pair(init_for(shape, divisor=d))
        xi = x.clone().requires_grad_(True)
        out = new(xi)
        out.sum().backward()
        results.append((out.detach(), xi.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("divisor", [2.0, 0.0, -3.0])
@pytest.mark.parametrize("special", ["nan_x", "inf_x", "inf_conv_bias", "nan_conv_bias"])
def test_non_finite_values(special, divisor):
    shape = (2, 2, 4, (5, 6, 7), 2, 2)
    x = input_for(shape)
    ref, new = make_pair(init_for(shape, divisor=divisor))
    with torch.no_grad():
        if special == "nan_x":
            x[0, 1, 2, 3, 4] = math.nan
        elif special == "inf_x":
            x[1, 0, 0, 0, 0] = math.inf
        elif special == "inf_conv_bias":
            for m in (ref, new):
                m.conv.bias[1] = math.inf
        else:
            for m in (ref, new):
                m.conv.bias[2] = math.nan
        got, want = new(x), ref(x)
    assert_close(got, want, atol=1e-5, rtol=1e-5, what=f"{special} divisor={divisor}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_models(dtype):
    # A model cast with .half()/.to(bfloat16): ModelNew upcasts x on the CPU, returns Model's dtype.
    shape = (2, 3, 4, (7, 8, 9), 3, 2)
    x = input_for(shape, dtype=dtype)
    for bias_shape, sum_dim in [((4, 1, 1, 1), 1), ((1,), 0)]:
        ref, new = make_pair(init_for(shape, bias_shape=bias_shape, sum_dim=sum_dim))
        ref, new = ref.to(dtype), new.to(dtype)
        with torch.no_grad():
            got, want = new(x), ref(x)
        assert_no_worse_than_torch(got, want, oracle(ref, x), EPS[dtype], f"{dtype} sum_dim={sum_dim}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fast_path_is_block_bit_for_bit(dtype):
    # ModelNew's per-call path (block_inference, which runs the 16-bit rounding steps in C++)
    # returns exactly what block() returns through the op and Python's ops.
    shape = (3, 5, 6, (7, 9, 10), 3, (2, 1, 3))
    x = input_for(shape, dtype=dtype)
    for bias_shape in [(6, 1, 1, 1), (1, 6, 1, 1, 1)]:
        _, new = make_pair(init_for(shape, bias_shape=bias_shape))
        new = new.to(dtype)
        rec = RecordOps()
        with torch.no_grad():
            with rec:
                got = new(x)
            want = convpool.block(x, new.conv.weight, new.conv.bias, new.bias, new.divisor, new.pool_size,
                                  new.sum_dim)
        assert rec.ops == ["block_inference"], rec.ops
        assert got.dtype == dtype and got.shape == want.shape == (3, 1, 1, 1)
        assert torch.equal(got, want), (dtype, bias_shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_direct_entry_is_the_op_bit_for_bit(dtype):
    # Plain inference takes the direct entry (no op dispatcher, binding.cpp's
    # block_inference_direct): once a call, with the op's result bit for bit, also in
    # inference_mode. A bias that does not broadcast per channel (it changes the output's shape)
    # is refused there and takes block().
    from convpool import _ops

    shape = (3, 5, 6, (7, 9, 10), 3, (2, 1, 3))
    x = input_for(shape, dtype=dtype)
    for bias_shape, direct in [((6, 1, 1, 1), 1), ((1, 6, 1, 1, 1), 1), ((6, 1, 1), 0), ((1,), 0)]:
        ref, new = make_pair(init_for(shape, bias_shape=bias_shape))
        new = new.to(dtype)
        with torch.no_grad():
            got, n = direct_calls(lambda: new(x))
            want = torch.ops.convpool.block_inference(x, new.conv.weight, new.conv.bias, new.bias, 2.0,
                                                      [2, 1, 3], False) if direct else ref.to(dtype)(x)
        assert n == direct, (bias_shape, n)
        if direct:
            assert torch.equal(got, want), (dtype, bias_shape)
        else:
            assert got.shape == want.shape
        with torch.inference_mode():
            again, n = direct_calls(lambda: new(x))
        assert n == direct and torch.equal(again, got)
    assert _ops._STATE["direct"] is not None


def test_direct_entry_steps_aside():
    # Where the op must be seen or must run differently, the direct entry returns None and the
    # call takes the op: a gradient needed, autocast, torch.jit.trace (the trace must record the
    # op, not bake the output in as a constant), vmap (functorch's batched tensors), a dispatch
    # mode (RecordOps: test_fast_path_is_block_bit_for_bit), errors (the op raises its message).
    shape = (2, 3, 4, (7, 8, 9), 3, 2)
    x = input_for(shape)
    ref, new = make_pair(init_for(shape))

    y, n = direct_calls(lambda: new(x))  # grad mode on, parameters need gradients
    assert n == 0 and y.requires_grad
    y.sum().backward()
    assert new.conv.weight.grad is not None

    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        _, n = direct_calls(lambda: new(x))
    assert n == 0

    with torch.no_grad():
        traced, n = direct_calls(lambda: torch.jit.trace(new, x, check_trace=False))
        assert n == 0 and "convpool::block_inference" in str(traced.graph)
        x2 = input_for(shape, seed=7)
        assert torch.equal(traced(x2), new(x2))
        assert not torch.equal(traced(x2), traced(x))

        xs = torch.stack([x, x2])
        got, n = direct_calls(lambda: torch.vmap(new)(xs))
        assert n == 0
        for i in range(2):
            assert_no_worse_than_torch(got[i], ref(xs[i]), oracle(ref, xs[i]), EPS[x.dtype], f"vmap {i}")

        with pytest.raises(ValueError, match=r"x has 5 channels"):
            new(torch.rand(2, 5, 7, 9, 10))


def test_float64_is_the_exact_composite():
    shape = (2, 3, 4, (7, 8, 9), 3, 2)
    x = input_for(shape, dtype=torch.float64)
    ref, new = make_pair(init_for(shape))
    ref, new = ref.double(), new.double()
    with torch.no_grad():
        got, want = new(x), ref(x)
    assert got.dtype == torch.float64
    assert torch.equal(got, want)


@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16])
def test_cpu_autocast(autocast_dtype):
    # Under autocast Model's conv sees 16-bit operands; ModelNew casts the same way, so the truth
    # is Model in float64 on the 16-bit-rounded x, weight and conv bias.
    shape = (2, 3, 4, (7, 8, 9), 3, 2)
    x = input_for(shape)
    ref, new = make_pair(init_for(shape))
    with torch.no_grad(), torch.autocast("cpu", dtype=autocast_dtype):
        got, want = new(x), ref(x)
    rounded = make_pair(init_for(shape))[0]
    with torch.no_grad():
        for p in (rounded.conv.weight, rounded.conv.bias):
            p.copy_(p.to(autocast_dtype).float())
    truth = oracle(rounded, x.to(autocast_dtype))
    assert_no_worse_than_torch(got, want, truth, EPS[autocast_dtype], f"autocast {autocast_dtype}")


def test_tf32_flag_does_not_change_cpu_results():
    shape = SHAPES[0]
    x = input_for(shape)
    _, new = make_pair(init_for(shape))
    old = torch.backends.cudnn.allow_tf32
    try:
        with torch.no_grad():
            torch.backends.cudnn.allow_tf32 = True
            a = new(x)
            torch.backends.cudnn.allow_tf32 = False
            b = new(x)
    finally:
        torch.backends.cudnn.allow_tf32 = old
    assert torch.equal(a, b)


@pytest.mark.parametrize("layout", ["channels_last_3d", "sliced", "permuted", "expanded_batch"])
def test_input_layouts(layout):
    shape = (2, 3, 4, (7, 8, 9), 3, 2)
    base = input_for(shape)
    if layout == "channels_last_3d":
        x = base.to(memory_format=torch.channels_last_3d)
    elif layout == "sliced":
        x = input_for((2, 3, 4, (7, 8, 18), 3, 2))[..., ::2]
    elif layout == "permuted":
        x = base.permute(0, 1, 4, 3, 2).contiguous().permute(0, 1, 4, 3, 2)
    else:
        x = base[:1].expand(3, -1, -1, -1, -1)
    assert not x.is_contiguous() or layout == "channels_last_3d"
    ref, new = make_pair(init_for(shape))
    with torch.no_grad():
        got = new(x)
        want = ref(x)
        dense = new(x.contiguous())
    assert torch.equal(got, dense), "layout changed the result"
    assert_no_worse_than_torch(got, want, oracle(ref, x), EPS[torch.float32], layout)


def test_unbatched_input():
    shape = (1, 3, 4, (7, 8, 9), 3, 2)
    x = input_for(shape)[0]
    for bias_shape, sum_dim in [((4, 1, 1, 1), 1), ((4, 1, 1, 1), 0), ((1,), -1)]:
        ref, new = make_pair(init_for(shape, bias_shape=bias_shape, sum_dim=sum_dim))
        with torch.no_grad():
            got, want = new(x), ref(x)
        assert_no_worse_than_torch(got, want, oracle(ref, x), EPS[torch.float32], f"unbatched {sum_dim}")


def test_empty_batch_matches_model():
    shape = (2, 3, 4, (7, 8, 9), 3, 2)
    x = input_for(shape)[:0]
    ref, new = make_pair(init_for(shape))
    with torch.no_grad():
        assert torch.equal(new(x), ref(x))


def test_headline_problem_small_batch():
    init = [8, 16, (3, 3, 3), 2.0, (2, 2, 2), (16, 1, 1, 1), 1]
    x = torch.rand(2, 8, 16, 64, 64, generator=torch.Generator().manual_seed(5))
    ref, new = make_pair(init, seed=42)
    with torch.no_grad():
        got, want = new(x), ref(x)
    assert got.shape == want.shape == (2, 1, 1, 1)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)  # KernelBench's fp32 tolerance
    assert_no_worse_than_torch(got, want, oracle(ref, x), EPS[torch.float32], "headline")


def test_c_reference_op_agrees():
    # The library's own oracle (double accumulation) through the binding, against Model in float64.
    shape = (2, 3, 5, (7, 8, 9), 3, 2)
    x = input_for(shape)
    ref, _ = make_pair(init_for(shape))
    with torch.no_grad():
        pooled, out = torch.ops.convpool.reference(x, ref.conv.weight, ref.conv.bias,
                                                   ref.bias.reshape(-1), 2.0, [2, 2, 2])
        truth = oracle(ref, x)
        m64 = ref.double()
        y = m64.global_avg_pool(m64.max_pool(m64.conv(x.double()) / 2.0)).flatten(1)
    assert_close(pooled, y, atol=4 * EPS[torch.float32] * (y.abs().max().item() + 1), what="reference P")
    assert_close(out, truth.flatten(), atol=64 * EPS[torch.float32] * (truth.abs().max().item() + 1),
                 what="reference out")


def test_thread_count_does_not_change_results():
    shape = (3, 4, 6, (9, 10, 11), 3, 2)
    x = input_for(shape)
    _, new = make_pair(init_for(shape))
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with torch.no_grad():
            a = new(x)
        torch.set_num_threads(max(2, old))
        with torch.no_grad():
            b = new(x)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(a, b), "the CPU kernel must be deterministic across thread counts"


# ----------------------------------------------------------------------------- parameters

INIT = [3, 5, (3, 2, 3), 2.0, (2, 2, 1), (5, 1, 1, 1), 1]


@pytest.mark.parametrize("seed", [0, 7, 1234])
def test_seeded_init_is_identical(seed):
    ref, new = make_pair(INIT, seed)
    rs, ns = ref.state_dict(), new.state_dict()
    assert list(rs) == list(ns) and set(rs) == {"conv.weight", "conv.bias", "bias"}
    for k in rs:
        assert torch.equal(rs[k], ns[k]), k
    # Same number of RNG draws: the generator ends in the same state.
    torch.manual_seed(seed)
    convpool.Model(*INIT)
    after_ref = torch.rand(4)
    torch.manual_seed(seed)
    convpool.ModelNew(*INIT)
    assert torch.equal(after_ref, torch.rand(4))


def test_state_dict_round_trip():
    x = input_for((2, 3, 0, (6, 7, 8), 0, 0))
    ref, _ = make_pair(INIT, seed=3)
    _, new = make_pair(INIT, seed=4)
    new.load_state_dict(ref.state_dict(), strict=True)
    with torch.no_grad():
        assert torch.allclose(new(x), ref(x), atol=1e-5, rtol=1e-5)
    other = convpool.Model(*INIT)
    other.load_state_dict(new.state_dict(), strict=True)
    for k, v in other.state_dict().items():
        assert torch.equal(v, ref.state_dict()[k]), k
    assert [n for n, _ in new.named_parameters()] == [n for n, _ in ref.named_parameters()]


def test_tf32_flag_follows_both_flag_apis():
    from convpool import _ops

    cudnn = torch.backends.cudnn
    old_allow = cudnn.allow_tf32
    try:
        # _tf32_now is the per-call fast form of the same rule: they must agree.
        for rule in (_ops._cudnn_allows_tf32, _ops._tf32_now):
            cudnn.allow_tf32 = False
            assert rule() is False
            cudnn.allow_tf32 = True
            assert rule() is True
            if hasattr(cudnn, "conv"):
                cudnn.conv.fp32_precision = "ieee"  # the new API; the legacy getter now raises
                assert rule() is False
                cudnn.conv.fp32_precision = "tf32"
                assert rule() is True
    finally:
        cudnn.allow_tf32 = old_allow


def test_op_sees_the_arguments_it_should():
    # A dispatch mode records the op's calls: one per forward, pool as a list, tf32 False on CPU.
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.convpool.forward.default, torch.ops.convpool.forward_inference.default,
                        torch.ops.convpool.block_inference.default):
                calls.append(args)
                ops.append(func)
            return func(*args, **(kwargs or {}))

    ops = []
    shape = (2, 3, 4, (7, 8, 9), 3, (2, 1, 3))
    _, new = make_pair(init_for(shape, divisor=3))
    with torch.no_grad(), Record():
        new(input_for(shape))
    # No gradient needed: the op without the Python autograd kernel (host time per call).
    assert ops == [torch.ops.convpool.block_inference.default]
    assert len(calls) == 1
    x, w, cb, b, divisor, pool, tf32 = calls[0]
    assert divisor == 3.0 and list(pool) == [2, 1, 3] and tf32 is False
    # The fused out path: the bias goes in as the parameter itself (any per-channel shape).
    assert b is not None and b.numel() == 4

    # Parameters that need a gradient: the op with the autograd formula (on the CPU its training
    # form, which also saves the codes), and the gradient reaches the weights.
    rec = RecordOps()
    with rec:
        y = new(input_for(shape))
    assert "forward_train" in rec.ops and "block_inference" not in rec.ops, rec.ops
    y.sum().backward()
    assert new.conv.weight.grad is not None and torch.isfinite(new.conv.weight.grad).all()


def test_explain_on_the_cpu():
    _, new = make_pair(init_for(SHAPES[0]))
    x = input_for(SHAPES[0])
    assert convpool.explain(new, x).startswith("cpu: fused float32 path")
    assert convpool.explain(new, x.double()).startswith("composite: PyTorch ops")
    assert "composite" in convpool.explain(new, x[:0])


def test_fast_path_follows_attribute_changes():
    # ModelNew caches what its constructor arguments allow (the per-call fast path); assigning
    # divisor, pool_size, sum_dim or a new bias afterwards must change the result exactly as the
    # same change to Model does, in both directions between the fast path and block().
    shape = (2, 3, 4, (7, 9, 10), 3, 2)
    ref, new = make_pair(init_for(shape))
    x = input_for(shape)
    changes = [
        ("divisor", -3.0), ("divisor", 0.5), ("pool_size", (1, 2, 3)), ("sum_dim", 0),
        ("sum_dim", -4), ("bias", torch.nn.Parameter(torch.randn(1, 4, 1, 1, 1))),
        ("bias", torch.nn.Parameter(torch.randn(4, 1, 1))), ("bias", torch.nn.Parameter(torch.randn(4, 1, 1, 1))),
        ("divisor", 2),
    ]
    for name, value in changes:
        setattr(new, name, value)
        if name == "pool_size":
            ref.max_pool = torch.nn.MaxPool3d(value)
        else:
            setattr(ref, name, value)
        with torch.no_grad():
            got, want = new(x), ref(x)
        assert_no_worse_than_torch(got, want, oracle(ref, x), EPS[x.dtype], f"after {name} = {value!r}")


def test_fast_path_errors_are_the_blocks():
    # Shape errors the op finds on the fast path are raised with block()'s message.
    shape = (2, 3, 4, (7, 9, 10), 3, 2)
    _, new = make_pair(init_for(shape))
    with pytest.raises(ValueError, match=r"x has 5 channels \(dim 1\) but weight expects in_channels = 3"):
        new(torch.rand(2, 5, 7, 9, 10))
    with pytest.raises(ValueError, match="pool_size .* is larger than the conv output"):
        new(torch.rand(2, 3, 3, 9, 10))
    with pytest.raises(ValueError, match="smaller than the kernel"):
        new(torch.rand(2, 3, 2, 9, 10))


def _model_modifications():
    """(name, function applied to a model) pairs: each changes what Model's submodules compute in
    a way the fused block does not, so ModelNew must run Model's own forward to match."""
    def prune_weight(m):
        torch.nn.utils.prune.l1_unstructured(m.conv, "weight", 0.5)
        with torch.no_grad():
            m.conv.weight_orig.mul_(2)  # the hook recomputes weight from this at every call

    class Scaled(torch.nn.Conv3d):
        def forward(self, x):
            return super().forward(x) * 3

    def scaled_conv(m):
        new = Scaled(3, 4, 3)
        new.load_state_dict(m.conv.state_dict())
        m.conv = new

    return [
        ("conv forward hook", lambda m: m.conv.register_forward_hook(lambda mod, i, o: o * -2)),
        ("conv forward pre-hook", lambda m: m.conv.register_forward_pre_hook(lambda mod, i: (i[0] * 0.5,))),
        ("pruned conv weight", prune_weight),
        ("conv padding 1", lambda m: setattr(m.conv, "padding", (1, 1, 1))),
        ("conv stride 2", lambda m: setattr(m.conv, "stride", (2, 2, 2))),
        ("conv dilation 2", lambda m: setattr(m.conv, "dilation", (2, 1, 1))),
        ("Conv3d subclass with its own forward", scaled_conv),
        ("max_pool kernel 3, stride still 2", lambda m: setattr(m.max_pool, "kernel_size", 3)),
        ("max_pool ceil_mode", lambda m: setattr(m.max_pool, "ceil_mode", True)),
        ("max_pool padding 1", lambda m: setattr(m.max_pool, "padding", 1)),
        ("max_pool replaced by AvgPool3d", lambda m: setattr(m, "max_pool", torch.nn.AvgPool3d(2))),
        ("global_avg_pool to 2x1x1", lambda m: setattr(m, "global_avg_pool", torch.nn.AdaptiveAvgPool3d((2, 1, 1)))),
        ("max_pool forward hook", lambda m: m.max_pool.register_forward_hook(lambda mod, i, o: o.abs())),
    ]


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("name,modify", _model_modifications(), ids=[n for n, _ in _model_modifications()])
def test_submodule_changes_mean_what_they_mean_in_model(name, modify, grad):
    # ModelNew has Model's submodules; whatever changes them (hooks, pruning, strides, a
    # replaced module) must change ModelNew's result exactly as Model's. Each change moves
    # Model's output far from the unmodified block, so a path that ignored it fails here.
    shape = (2, 3, 4, (9, 10, 11), 3, 2)
    ref, new = make_pair(init_for(shape))
    x = input_for(shape) - 0.25
    with torch.no_grad():
        before = ref(x)
    modify(ref)
    modify(new)
    with torch.set_grad_enabled(grad):
        want, got = ref(x), new(x)
    assert got.shape == want.shape
    assert want.shape != before.shape or (want - before).abs().max() > 1e-4, \
        f"{name}: the modification changes nothing this test can see"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=name)
    if grad:
        got.sum().backward()
        want.sum().backward()
        for (pn, p), q in zip(new.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=f"{name}: grad of {pn}")


def test_global_module_hook_is_honoured():
    shape = (2, 3, 4, (9, 10, 11), 3, 2)
    ref, new = make_pair(init_for(shape))
    x = input_for(shape)

    def hook(mod, inp, out):
        return out * 2 if isinstance(mod, torch.nn.Conv3d) else None

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        with torch.no_grad():
            want, got = ref(x), new(x)
    finally:
        handle.remove()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with torch.no_grad(), RecordOps() as rec:  # hook gone: the fused op again
        new(x)
    assert rec.ops, "the unmodified model no longer takes the fused op"


def test_plain_model_still_takes_the_fused_op():
    # The guard above must not send the ordinary model to PyTorch's ops: with the default
    # submodules (and a parametrized conv, which keeps nn.Conv3d's forward) the op runs.
    shape = (2, 3, 4, (9, 10, 11), 3, 2)
    ref, new = make_pair(init_for(shape))
    x = input_for(shape)
    _, n = direct_calls(lambda: new(x))
    with torch.no_grad():
        _, n_nograd = direct_calls(lambda: new(x))
    with RecordOps() as rec:
        new(x)
    assert n_nograd == 1 and "forward_train" in rec.ops, (n, n_nograd, rec.ops)
    for m in (ref, new):
        torch.nn.utils.parametrizations.weight_norm(m.conv)
    with RecordOps() as rec:
        got = new(x)
    want = ref(x)
    assert rec.ops, "a parametrized conv no longer takes the fused op"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_model_attributes_and_pool_size_forms():
    # Model's attribute names; pool_size as Model's MaxPool3d takes it (1 or 3 values, lists);
    # a list pool_size edited in place acts as it does in Model (MaxPool3d keeps the list).
    shape = (2, 3, 4, (9, 10, 11), 3, 2)
    x = input_for(shape)
    for pool in [(2,), [3], [2, 1, 3], torch.Size([1, 2, 2])]:
        ref, new = make_pair(init_for(shape)[:4] + [pool] + init_for(shape)[5:])
        assert type(new.max_pool) is torch.nn.MaxPool3d and type(new.global_avg_pool) is torch.nn.AdaptiveAvgPool3d
        with torch.no_grad():
            torch.testing.assert_close(new(x), ref(x), rtol=1e-5, atol=1e-5, msg=f"pool {pool!r}")
    ref, new = make_pair(init_for(shape)[:4] + [[2, 2, 2]] + init_for(shape)[5:])
    with torch.no_grad():
        new(x)
        ref.max_pool.kernel_size[0] = 3  # Model's stride is the same list
        new.pool_size[0] = 3
        want, got = ref(x), new(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert new.max_pool.stride == [3, 2, 2]
    new.pool_size = 2  # window and stride, as nn.MaxPool3d(2)
    assert new.max_pool.kernel_size == 2 and new.max_pool.stride == 2


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_forward_mode_ad(grad):
    # The op has no jvp formula: under forward-mode AD ModelNew runs Model's ops, so the
    # tangent is PyTorch's (and never silently dropped, as it would be under no_grad).
    import torch.autograd.forward_ad as fwAD

    shape = (2, 3, 4, (9, 10, 11), 3, 2)
    ref, new = make_pair(init_for(shape))
    x = input_for(shape)
    t = torch.randn_like(x)
    results = []
    for m in (ref, new):
        with fwAD.dual_level(), torch.set_grad_enabled(grad):
            out = fwAD.unpack_dual(m(fwAD.make_dual(x, t)))
        assert out.tangent is not None
        results.append(out)
    torch.testing.assert_close(results[1].primal, results[0].primal, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results[1].tangent, results[0].tangent, rtol=1e-5, atol=1e-5)
    with fwAD.dual_level():
        xd = fwAD.make_dual(x, t)
        b = convpool.block(xd, new.conv.weight, new.conv.bias, new.bias, 2.0, 2, 1)
        assert fwAD.unpack_dual(b).tangent is not None
