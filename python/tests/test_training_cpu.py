"""Training on the CPU: ModelNew's gradients through the fused CPU backward (src/cpu_backward.c,
op <ns>::backward) against float64 autograd and Model, its routing, and determinism across
thread counts. The GPU twin is test_cuda_training.py."""
import contextlib
import copy

import pytest
import torch

import convpool
from _util import (RecordOps, assert_close, assert_fused_grads_no_worse, assert_same_half_results,
                   assert_same_nonfinite_grads, finite_scale, func_grads, half_call_and_block_grads, make_pair,
                   penalty_grads, training_grads, x_and_conv_bias_grads)

CASES = [
    ([8, 16, 3, 2.0, 2, (16, 1, 1, 1), 1], (2, 8, 9, 12, 13)),
    ([3, 5, 1, 2.0, 2, (5, 1, 1, 1), 1], (2, 3, 7, 9, 11)),
    ([2, 4, 5, 0.5, (1, 2, 2), (4, 1, 1, 1), 1], (1, 2, 9, 12, 13)),
    ([4, 6, (1, 3, 2), -1.5, (3, 1, 2), (6, 1, 1, 1), 1], (2, 4, 10, 9, 11)),
    ([3, 7, 3, 2.0, 3, (7, 1, 1, 1), 1], (1, 3, 10, 11, 12)),
    ([2, 3, 2, 1.0, (2, 16, 16), (3, 1, 1, 1), 1], (1, 2, 5, 19, 18)),
    ([3, 4, (2, 3, 1), -1.5, (2, 1, 3), (1,), 0], (2, 3, 9, 12, 13)),
    ([3, 4, 3, 2.0, 2, (4, 1, 1, 1), 1], (3, 9, 8, 7)),  # unbatched x
    ([8, 5, 5, 2.0, 2, (5, 1, 1, 1), 1], (2, 8, 7, 9, 11)),  # kernel 5 x Cin 8: the backward's rows of 40
    # Pool 1 (every conv value its own window): the backward's separable path (cpb_backward_pool1).
    ([4, 6, 3, 2.0, 1, (6, 1, 1, 1), 1], (2, 4, 6, 7, 9)),
    ([3, 5, (2, 3, 1), -1.5, 1, (5, 1, 1, 1), 1], (3, 3, 5, 8, 7)),
    ([2, 3, 1, 0.5, 1, (3, 1, 1, 1), 1], (2, 2, 4, 5, 6)),  # kernel 1: every tap range is the one tap
    # Wide problems the CPU trains fused since the twenty-first session (Cin x Cout up to 2048,
    # kernel sides at most 3): pool remainders, a negative divisor, pool 3, an anisotropic kernel.
    ([16, 32, 3, 2.0, 2, (32, 1, 1, 1), 1], (2, 16, 7, 9, 11)),
    ([32, 64, (1, 3, 3), -1.5, 3, (64, 1, 1, 1), 1], (1, 32, 4, 10, 11)),
    ([12, 40, 2, 0.5, (1, 2, 2), (40, 1, 1, 1), 1], (2, 12, 5, 9, 8)),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_gradients_vs_float64(case):
    init, shape = CASES[case]
    ref, new = make_pair(init, seed=case)
    x = torch.rand(shape, generator=torch.Generator().manual_seed(case)) * 2 - 1
    assert_fused_grads_no_worse(ref, new, x)


@pytest.mark.parametrize("case", [0, 9, 13])  # 9: pool 1's separable path; 13: a wide case
def test_bit_identical_across_threads(case):
    init, shape = CASES[case]
    _, new = make_pair(init, seed=1)
    x = torch.rand(shape)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = training_grads(new, x)
        torch.set_num_threads(max(2, old))
        for _ in range(3):
            for a, b in zip(training_grads(new, x), one):
                assert torch.equal(a, b)
    finally:
        torch.set_num_threads(old)


def test_release_cpu_scratch():
    # The CPU backward keeps an x-sized scratch between calls; convpool.release_cpu_scratch()
    # frees it, at any time: the gradients after it, and after a larger problem left a bigger
    # scratch behind, are the same bits as a first run's.
    init, shape = CASES[0]
    _, new = make_pair(init, seed=3)
    x = torch.rand(shape)
    convpool.release_cpu_scratch()
    first = training_grads(new, x)
    training_grads(new, torch.rand((shape[0] * 2,) + shape[1:]))  # a larger scratch stays
    for a, b in zip(training_grads(new, x), first):
        assert torch.equal(a, b)
    convpool.release_cpu_scratch()
    convpool.release_cpu_scratch()  # twice: nothing to free is fine
    for a, b in zip(training_grads(new, x), first):
        assert torch.equal(a, b)


def test_routes(monkeypatch):
    # Wide channels, float64, a zero divisor and the environment's "dense" take PyTorch's own ops
    # (or the conv-tail route) for a training call (the step is then Model's); all give Model's
    # gradients.
    wide = ([48, 48, 3, 2.0, 2, (48, 1, 1, 1), 1], (1, 48, 6, 8, 9))
    # Cin x Cout = 2304, just past the CPU's wide limit of 2048 (CASES[0] is 8 x 16 = 128, the
    # limit for any kernel); 32 x 64 = 2048 at it, and 16 x 16 at kernel 5 past its kernel rule.
    past = ([48, 48, 3, 2.0, 2, (48, 1, 1, 1), 1], (1, 48, 6, 8, 9))
    at = ([32, 64, 3, 2.0, 2, (64, 1, 1, 1), 1], (1, 32, 6, 8, 9))
    k5 = ([16, 16, 5, 2.0, 2, (16, 1, 1, 1), 1], (1, 16, 6, 8, 9))
    zero = ([3, 4, 3, 0.0, 2, (4, 1, 1, 1), 1], (1, 3, 6, 8, 9))
    for (init, shape), force, fused in ((wide, "", False), (wide, "fused", True), (CASES[0], "dense", False),
                                        (zero, "", False), (CASES[0], "", True), (past, "", False),
                                        (at, "", True), (k5, "", False)):
        monkeypatch.setenv("CONVPOOL_TORCH_BACKWARD", force)
        ref, new = make_pair(init, seed=7)
        x = torch.rand(shape)
        rec = RecordOps()
        with rec:
            got = training_grads(new, x)
        assert rec.fused_backward == fused, (init, force, rec.ops)
        for g_new, g_ref in zip(got, training_grads(ref, x)):
            assert_close(g_new, g_ref, atol=1e-4 * (g_ref.abs().max().item() + 1e-6), what=f"route {force!r}")


def _grads16(model, x):
    """model(x) and the gradients of a fixed loss of it for x and each parameter."""
    xi = x.clone().requires_grad_(True)
    y = model(xi)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    loss = (y.double() * g).sum()
    names = ["x"] + [n for n, _ in model.named_parameters()]
    return y.detach(), dict(zip(names, torch.autograd.grad(loss, [xi] + list(model.parameters()))))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("case", [0, 3, 6, 7])
def test_half_models_train_fused(dtype, case):
    # A 16-bit model trains on the CPU through the float32 fused path (x, weights and conv bias
    # upcast: _ops._upcast_training): the fused ops run; the output is the no_grad output bit
    # for bit; every gradient has its input's dtype and, against float64 autograd on the same
    # 16-bit operands, a relative error at most twice Model's plus 1% (Model's 16-bit conv
    # output ties windows that the fused codes order by their float32 values).
    init, shape = CASES[case]
    ref, new = make_pair(init, seed=case)
    ref, new = ref.to(dtype), new.to(dtype)
    x = (torch.rand(shape, generator=torch.Generator().manual_seed(case)) * 2 - 1).to(dtype)
    rec = RecordOps()
    with rec:
        y, got = _grads16(new, x)
    assert "forward_train" in rec.ops and "backward_codes" in rec.ops, rec.ops
    with torch.no_grad():
        assert torch.equal(y, new(x))
    y_ref, want = _grads16(ref, x)
    assert y.dtype == y_ref.dtype == dtype and y.shape == y_ref.shape
    _, truth = _grads16(copy.deepcopy(ref).double(), x.double())
    for name, t in truth.items():
        assert got[name].dtype == want[name].dtype == dtype, name
        err_new = ((got[name].double() - t).norm() / t.norm()).item()
        err_model = ((want[name].double() - t).norm() / t.norm()).item()
        assert err_new <= 2 * err_model + 0.01, f"grad {name}: {err_new:.3g} vs Model's {err_model:.3g}"


@pytest.mark.parametrize("create_graph", [False, True], ids=["grad", "create_graph"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_half_module_call_is_blocks(dtype, create_graph, monkeypatch):
    # ModelNew's 16-bit training call runs in block_train's C++ autograd kernel (BlockTrain
    # upcasts inside); block() runs the same float32 ops between autograd-visible casts. The
    # output and every gradient are the same bit for bit, and so are the second-order gradients
    # of a gradient penalty (create_graph: both recompute with PyTorch's ops on float32 casts).
    init, shape = CASES[0]
    _, new = make_pair(init, seed=31)
    new = new.to(dtype)
    x = (torch.rand(shape, generator=torch.Generator().manual_seed(31)) * 2 - 1).to(dtype)
    assert_same_half_results(half_call_and_block_grads(new, x, create_graph, monkeypatch), create_graph)


def test_half_models_keep_models_ops_where_the_fused_backward_does_not_serve(monkeypatch):
    # 16-bit training is Model's step, bit for bit, past the fused backward's channel limit (the
    # conv-tail route) or forced dense (Model's own ops).
    wide = ([48, 48, 3, 2.0, 2, (48, 1, 1, 1), 1], (1, 48, 6, 8, 9))
    for (init, shape), force, dtype in ((wide, "", torch.float16), (CASES[0], "dense", torch.float16),
                                        (wide, "", torch.bfloat16), (CASES[0], "dense", torch.bfloat16)):
        monkeypatch.setenv("CONVPOOL_TORCH_BACKWARD", force)
        ref, new = make_pair(init, seed=7)
        ref, new = ref.to(dtype), new.to(dtype)
        x = torch.rand(shape).to(dtype)
        rec = RecordOps()
        with rec:
            y, got = _grads16(new, x)
        assert not rec.fused_backward, rec.ops
        y_ref, want = _grads16(ref, x)
        assert torch.equal(y, y_ref)
        for name in want:
            assert torch.equal(got[name], want[name]), name


def test_half_model_inference_tensor_raises_as_model():
    # x made under inference_mode cannot be saved for a backward: Model raises, and so does the
    # float16 fused route (its float32 copy of x must not hide that).
    init, shape = CASES[0]
    ref, new = make_pair(init, seed=2)
    ref, new = ref.half(), new.half()
    with torch.inference_mode():
        x = torch.rand(shape).half()
    for m in (ref, new):
        with pytest.raises(RuntimeError, match="Inference tensors"):
            m(x).sum().backward()


def test_dense_route_is_models_step_bit_for_bit(monkeypatch):
    # A training call the fused backward does not serve runs Model's own ops straight from
    # ModelNew's fast path (no block() detour): the output and every gradient are Model's, bit
    # for bit, including a zero divisor's inf/NaN.
    wide = ([48, 48, 3, 2.0, 2, (48, 1, 1, 1), 1], (2, 48, 6, 8, 9))
    zero = ([3, 4, 3, 0.0, 2, (4, 1, 1, 1), 1], (1, 3, 6, 8, 9))
    for (init, shape), force in ((wide, ""), (zero, ""), (CASES[0], "dense")):
        monkeypatch.setenv("CONVPOOL_TORCH_BACKWARD", force)
        ref, new = make_pair(init, seed=5)
        x = torch.rand(shape) * 2 - 1
        rec = RecordOps()
        with rec:
            out, grads = new(x.clone().requires_grad_(True)), training_grads(new, x)
        assert not rec.fused_backward, (init, force, rec.ops)
        exact = dict(rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(out, ref(x.clone().requires_grad_(True)), **exact)
        for g_new, g_ref in zip(grads, training_grads(ref, x)):
            torch.testing.assert_close(g_new, g_ref, **exact)


def test_dense_route_names_the_argument():
    # The dense route's ATen errors become the block's own message naming the argument.
    _, new = make_pair([48, 48, 3, 2.0, 2, (48, 1, 1, 1), 1], seed=1)
    with pytest.raises(ValueError, match="x has 47 channels"):
        new(torch.rand(1, 47, 6, 8, 9, requires_grad=True))


def test_inference_is_untouched_by_the_training_route():
    # Under no_grad (or with nothing requiring grad) the fused forward runs as before.
    init, shape = CASES[0]
    _, new = make_pair(init, seed=2)
    rec = RecordOps()
    with rec, torch.no_grad():
        new(torch.rand(shape))
    assert rec.ops == ["block_inference"], rec.ops  # the op without the Python autograd kernel


@pytest.mark.parametrize("need_x", [True, False])
def test_training_forward_saves_the_codes(need_x):
    # A CPU training call runs the training forward (pooled, out and the codes in one pass) and
    # the backward from its codes: exactly these two ops, no second search for the codes. Its
    # output is the inference forward's, bit for bit.
    init, shape = CASES[0]
    _, new = make_pair(init, seed=3)
    x = torch.rand(shape)
    rec = RecordOps()
    with rec:
        inp = x.clone().requires_grad_(need_x)
        y = new(inp)
        y.sum().backward()
    assert rec.ops == ["forward_train", "backward_codes"], rec.ops
    with torch.no_grad():
        assert torch.equal(y.detach(), new(x))


@pytest.mark.parametrize("poison", ["nan", "inf"])
def test_non_finite_inputs_match_model(poison):
    init, shape = CASES[1]
    ref, new = make_pair(init, seed=3)
    x = torch.rand(shape)
    x[0, 1, 3, 4, 5] = float(poison)
    assert_same_nonfinite_grads(ref, new, x)


@pytest.mark.parametrize("x_scale, divisor", [(1e9, 1e-30), (1e9, -1e-30), (1.0, 1e-40), (1.0, 3e38)])
@pytest.mark.parametrize("case", [0, 2])
def test_quotients_that_overflow_tie_as_in_model(case, x_scale, divisor):
    # Large conv values over a small divisor send most q = (y + bias) / divisor to +-inf:
    # values far apart in y then tie in q, and Model's max pool takes the first of them. The
    # Winograd codes path (kernel 3 in h and w) decided windows on y's lead alone and took the
    # largest y instead (x.grad's nonzero in another place). Subnormal and huge divisors (the
    # last two) take Model's ops (_fused_backward_divisor). x.grad and the conv bias's
    # gradient (which the codes decide) match Model's NaN/inf pattern exactly. (The weights'
    # gradient sums ~1e37-sized products, and where such sums overflow, inf against NaN depends
    # on the order of summation, which no implementation shares with mkldnn's.)
    init, shape = list(CASES[case][0]), CASES[case][1]
    init[3] = divisor
    if case == 2:
        init[2] = (1, 3, 3)  # kernel 3 in h and w with pool (1, 2, 2): the Winograd codes too
    ref, new = make_pair(init, seed=13)
    x = (torch.rand(shape, generator=torch.Generator().manual_seed(13)) * 2 - 1) * x_scale
    # assert_close requires each NaN and each signed inf in place, the finite entries close.
    for name, g_new, g_ref in zip(("x", "conv_bias"), x_and_conv_bias_grads(new, x), x_and_conv_bias_grads(ref, x)):
        assert_close(g_new, g_ref, atol=1e-4 * finite_scale(g_ref), what=name)


@pytest.mark.parametrize("sum_dim", [1, 0])
def test_double_backward_matches_model(sum_dim):
    # A gradient penalty (create_graph=True, then a loss on x.grad): the fused backward's
    # kernels have no derivative, so under create_graph the C++ autograd kernel (sum_dim 1) and
    # the op's Python formulas (block(), sum_dim 0) take PyTorch's ops instead; every
    # second-order gradient is Model's. (It was silently wrong: PyTorch only warned that
    # backward_codes had no autograd kernel, or the weights got no second-order gradient.)
    init, shape = list(CASES[0][0]), CASES[0][1]
    init[6] = sum_dim
    ref, new = make_pair(init, seed=17)
    x = torch.rand(shape, generator=torch.Generator().manual_seed(17)) * 2 - 1
    for g_new, g_ref in zip(penalty_grads(new, x), penalty_grads(ref, x)):
        assert_close(g_new, g_ref, atol=1e-5 * (g_ref.abs().max().item() + 1e-6), what="double backward")


def test_torch_func_transforms_match_model():
    # torch.func.grad and vjp cannot run a C++ autograd Function: under them the block is
    # Model's own ops, with Model's gradients.
    init, shape = CASES[0]
    ref, new = make_pair(init, seed=19)
    x = torch.rand(shape, generator=torch.Generator().manual_seed(19)) * 2 - 1
    for g_new, g_ref in zip(func_grads(new, x), func_grads(ref, x)):
        assert_close(g_new, g_ref, atol=1e-5 * (g_ref.abs().max().item() + 1e-6), what="torch.func")


@pytest.mark.parametrize("divisor", [1e-46, 5e-324, -1e-46, 10 ** 39 * 1.0])
def test_divisors_that_float32_cannot_hold(divisor):
    # Model divides by the divisor as a float32: 1e-46 is 0 there (every gradient NaN), 1e39 is
    # inf. The fused backward judged the Python double; such divisors now take Model's ops, and
    # the gradients are Model's exactly.
    init, shape = list(CASES[1][0]), CASES[1][1]
    init[3] = divisor
    ref, new = make_pair(init, seed=23)
    x = torch.rand(shape, generator=torch.Generator().manual_seed(23)) * 2 - 1
    for g_new, g_ref in zip(training_grads(new, x), training_grads(ref, x)):
        torch.testing.assert_close(g_new, g_ref, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("divisor", [2 ** 64, -2 ** 63 - 1, 10 ** 40])
def test_int_divisors_model_cannot_take(divisor):
    # A Python int divisor enters PyTorch's division as an int64/uint64 scalar: outside that
    # range Model raises OverflowError, and so does ModelNew (it used to return a result).
    init, shape = list(CASES[1][0]), CASES[1][1]
    init[3] = divisor
    ref, new = make_pair(init, seed=29)
    x = torch.rand(shape)
    with pytest.raises(OverflowError):
        ref(x)
    with pytest.raises(OverflowError):
        new(x)
    with torch.no_grad(), pytest.raises(OverflowError):
        new(x)


def test_backward_op_errors_name_the_argument():
    convpool.load()
    x = torch.rand(1, 2, 5, 6, 7)
    w = torch.rand(3, 2, 3, 3, 3)
    op = torch.ops.convpool.backward
    with pytest.raises(TypeError, match="float32"):
        op(x.double(), w.double(), None, None, None, 2.0, [2, 2, 2], True, True, False, True)
    with pytest.raises(ValueError, match="in_channels"):
        op(x[:, :1], w, None, None, None, 2.0, [2, 2, 2], True, True, False, True)
    with pytest.raises(ValueError, match="pool"):
        op(x, w, None, None, None, 2.0, [9, 2, 2], True, True, False, True)
    # The incoming gradients are read through raw pointers: a wrong shape is refused by name,
    # never read past its end.
    with pytest.raises(ValueError, match=r"grad_pooled must have shape \(batch, out_channels\) = \(1, 3\)"):
        op(x, w, None, torch.ones(3), None, 2.0, [2, 2, 2], True, True, False, True)
    with pytest.raises(ValueError, match="grad_pooled"):
        op(x, w, None, torch.ones(2, 3), None, 2.0, [2, 2, 2], True, True, False, True)
    with pytest.raises(ValueError, match=r"grad_out must have shape \(batch,\) = \(1,\)"):
        op(x, w, None, None, torch.ones(4), 2.0, [2, 2, 2], True, True, False, True)
    with pytest.raises(ValueError, match="grad_out"):
        op(x, w, None, torch.ones(1, 3), torch.ones(1, 1), 2.0, [2, 2, 2], True, True, False, True)
    pooled, _, codes = torch.ops.convpool.forward_train(x, w, None, None, 2.0, [2, 2, 2], False)
    with pytest.raises(ValueError, match="grad_out must have shape"):
        torch.ops.convpool.backward_codes(x, w, None, codes, None, torch.ones(2), 2.0, [2, 2, 2], True, True, False,
                                          False)


@pytest.mark.parametrize("need", [(True, True, True), (False, True, False), (False, False, False)],
                         ids=["all", "w", "none"])
def test_backward_codes_bias_grad_cpu(need):
    # need_bias on the CPU: Model's own reduction of grad_out (broadcast over the channels,
    # summed over the batch), bit for bit, beside the other gradients unchanged; zeros without
    # grad_out; an empty (0,) tensor when not asked.
    convpool.load()
    torch.manual_seed(3)
    x = torch.rand(5, 2, 5, 6, 7)
    w = torch.rand(3, 2, 3, 3, 3) - 0.5
    ops = torch.ops.convpool
    pooled, _, codes = ops.forward_train(x, w, None, None, 2.0, [2, 2, 2], False)
    gp, go = torch.rand_like(pooled), torch.randn(5)
    got = ops.backward_codes(x, w, None, codes, gp, go, 2.0, [2, 2, 2], *need, False, True)
    base = ops.backward_codes(x, w, None, codes, gp, go, 2.0, [2, 2, 2], *need, False)
    assert base[3].shape == (0,)
    for g, h in zip(got[:3], base[:3]):
        assert torch.equal(g, h)
    assert torch.equal(got[3], go.reshape(-1, 1).expand(-1, 3).sum(0))
    zero = ops.backward_codes(x, w, None, codes, gp, None, 2.0, [2, 2, 2], *need, False, True)[3]
    assert torch.equal(zero, torch.zeros(3))


def test_backward_codes_refuses_a_code_past_its_window():
    # The backward addresses x and grad_x by the codes: one that is not a position of its
    # window (here 8 of a 2x2x2 window) is refused with its index and value, not followed.
    convpool.load()
    x = torch.rand(1, 2, 5, 6, 7)
    w = torch.rand(3, 2, 3, 3, 3)
    ops = torch.ops.convpool
    pooled, _, codes = ops.forward_train(x, w, None, None, 2.0, [2, 2, 2], False)
    codes = codes.clone()
    codes.view(-1)[1] = 8
    with pytest.raises(ValueError, match=r"codes\[1\] = 8 is outside its window"):
        ops.backward_codes(x, w, None, codes, torch.ones_like(pooled), None, 2.0, [2, 2, 2], True, True, False,
                           False)


def test_optimizer_steps_match_model():
    # A few SGD steps with momentum through the fused CPU backward end at Model's parameters.
    init, shape = CASES[0]
    ref, new = make_pair(init, seed=5)
    x = torch.rand(shape)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (ref, new)]
    rec = RecordOps()
    for step in range(4):
        for m, opt in zip((ref, new), opts):
            opt.zero_grad()
            with rec if m is new and step == 0 else contextlib.nullcontext():
                m(x).square().sum().backward()
            opt.step()
    assert rec.fused_backward, rec.ops
    for (name, a), b in zip(new.named_parameters(), ref.parameters()):
        assert_close(a, b, atol=1e-5 * (b.abs().max().item() + 1.0), what=name)


def test_module_training_call_function_on_the_cpu():
    # block_train (ModelNew's training call, its autograd kernel in C++) against block(): the
    # same gradients, and its output may be modified in place like Model's (it is not a view,
    # which autograd forbids changing in place for a custom Function).
    from convpool import _ops

    init, shape = CASES[0]
    _, new = make_pair(init, seed=5)
    x = torch.rand(shape, generator=torch.Generator().manual_seed(5))
    params = [new.conv.weight, new.conv.bias, new.bias]

    def grads(call):
        inp = x.clone().requires_grad_(True)
        y = call(inp)
        y.mul_(2.0)
        return torch.autograd.grad(y.sum(), [inp] + params)

    via_function = grads(lambda inp: _ops._STATE["block_train_op"](
        inp, new.conv.weight, new.conv.bias, new.bias, float(new.divisor), list(_ops._triple(new.pool_size, "pool")),
        False))
    via_block = grads(lambda inp: convpool.block(inp, new.conv.weight, new.conv.bias, new.bias, new.divisor,
                                                 new.pool_size, new.sum_dim))
    for name, a, b in zip(("x", "weight", "conv_bias", "bias"), via_function, via_block):
        scale = b.abs().max().item() + 1e-12
        assert a.shape == b.shape and (a - b).abs().max().item() <= 1e-6 * scale, name


@pytest.mark.parametrize("frozen", ["nothing", "bias", "weight", "x"])
def test_conv_without_bias_trains(frozen):
    # conv.bias = None (a Conv3d(bias=False) model): the C++ autograd kernel then has x, weight
    # and bias as its variable inputs (the conv bias is an absent optional, not an undefined
    # tensor, which Function::apply cannot take), and every gradient asked for is Model's.
    init, shape = CASES[0]
    ref, new = make_pair(init, seed=11)
    for m in (ref, new):
        m.conv.bias = None
        if frozen == "bias":
            m.bias.requires_grad_(False)
        if frozen == "weight":
            m.conv.weight.requires_grad_(False)
    x = torch.rand(shape, generator=torch.Generator().manual_seed(11)) * 2 - 1
    rec = RecordOps()
    with rec:
        got = training_grads(new, x, need_x=frozen != "x")
    assert "forward_train" in rec.ops and rec.fused_backward, rec.ops
    want = training_grads(ref, x, need_x=frozen != "x")
    assert len(got) == len(want) == {"nothing": 3, "bias": 2, "weight": 2, "x": 2}[frozen]
    for g_new, g_ref in zip(got, want):
        assert_close(g_new, g_ref, atol=1e-4 * (g_ref.abs().max().item() + 1e-6), what=f"frozen {frozen}")


@pytest.mark.parametrize("needs", ["bias", "weights", "x"])
def test_block_train_op_gradients_asked_for(needs):
    # block_train's C++ autograd kernel computes only the gradients autograd asks for: bias
    # alone (no backward kernel runs), the weights without x, x without the weights; each one
    # equal to block()'s. Under inference_mode the op runs below autograd (its CPU kernel) and
    # gives the same output.
    from convpool import _ops

    init, shape = CASES[0]
    _, new = make_pair(init, seed=7)
    x = torch.rand(shape, generator=torch.Generator().manual_seed(7))
    pool = list(_ops._triple(new.pool_size, "pool"))
    w, cb, b = (t.detach().clone() for t in (new.conv.weight, new.conv.bias, new.bias))
    wants = {"bias": [b], "weights": [w, cb], "x": [x]}[needs]

    def grads(call):
        leaves = [t.detach().clone().requires_grad_(any(t is u for u in wants)) for t in (x, w, cb, b)]
        y = call(*leaves)
        weights = torch.linspace(0.5, 1.5, y.numel()).view(y.shape)
        asked = [t for t in leaves if t.requires_grad]
        return y.detach(), torch.autograd.grad((y * weights).sum(), asked)

    y_op, g_op = grads(lambda xi, wi, cbi, bi: _ops._STATE["block_train_op"](xi, wi, cbi, bi, float(new.divisor),
                                                                          pool, False))
    y_blk, g_blk = grads(lambda xi, wi, cbi, bi: convpool.block(xi, wi, cbi, bi, new.divisor, new.pool_size,
                                                               new.sum_dim))
    assert y_op.shape == y_blk.shape == (shape[0], 1, 1, 1)
    assert torch.equal(y_op, y_blk)
    assert len(g_op) == len(wants)
    for a, ref in zip(g_op, g_blk):
        assert a.shape == ref.shape and (a - ref).abs().max().item() <= 1e-6 * (ref.abs().max().item() + 1e-12)
    with torch.inference_mode():
        y_inf = _ops._STATE["block_train_op"](x, w, cb, b, float(new.divisor), pool, False)
    assert torch.equal(y_inf, y_op)


# (constructor arguments, x's shape, the forward's path): CPU problems where the fused CPU conv
# measured slower than PyTorch's run PyTorch's conv and convpool's divide and max pool (binding.cpp,
# cpu_conv_route): the direct path from 24576 multiply-adds an output (kernel 5 at 16 -> 32,
# pool 3 at 32 -> 32) and the Winograd path with pool 4^3 windows from Cin x Cout 256.
CPU_ROUTES = [
    ([16, 32, 5, 2.0, 2, (32, 1, 1, 1), 1], (2, 16, 9, 11, 13), "conv3d"),
    ([32, 32, 3, -1.5, 3, (32, 1, 1, 1), 1], (2, 32, 10, 11, 13), "conv3d"),
    ([16, 16, 3, 0.5, 4, (16,), 0], (2, 16, 10, 11, 13), "conv3d"),
    ([8, 16, 5, 2.0, 2, (16, 1, 1, 1), 1], (2, 8, 9, 11, 13), "fused"),
    ([16, 32, 3, 2.0, 2, (32, 1, 1, 1), 1], (2, 16, 9, 11, 13), "fused"),
    ([8, 16, 3, 2.0, 4, (16, 1, 1, 1), 1], (2, 8, 10, 11, 13), "fused"),
]


@pytest.mark.parametrize("case", range(len(CPU_ROUTES)))
def test_cpu_forward_route(case, monkeypatch):
    # The forward's path as explain() names it; PyTorch's conv route gives Model's output bit for
    # bit (the same conv, then the divide and max pool as PyTorch's ops round them, and the mean)
    # in inference and in a grad-enabled forward (the conv-tail route: the fused backward does not
    # take these), and forcing either path (CONVPOOL_TORCH_PATH) keeps the result within the
    # fused path's tolerance of Model's.
    init, shape, path = CPU_ROUTES[case]
    ref, new = make_pair(init, seed=case)
    x = torch.rand(shape, generator=torch.Generator().manual_seed(case)) * 2 - 1
    assert (path in convpool.explain(new, x)), convpool.explain(new, x)
    with torch.no_grad():
        got, want = new(x), ref(x)
    if path == "conv3d":
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        rec = RecordOps()
        with rec:
            y, grads = new(x.clone().requires_grad_(True)), training_grads(new, x)
        assert not rec.fused_backward, rec.ops
        torch.testing.assert_close(y, ref(x.clone().requires_grad_(True)), rtol=0, atol=0)
        for g_new, g_ref in zip(grads, training_grads(ref, x)):
            torch.testing.assert_close(g_new, g_ref, rtol=0, atol=0)
    for force in ("fused", "cudnn"):
        monkeypatch.setenv("CONVPOOL_TORCH_PATH", force)
        assert ("fused" if force == "fused" else "conv3d") in convpool.explain(new, x)
        with torch.no_grad():
            assert_close(new(x), want, atol=1e-5 * (want.abs().max().item() + 1), what=f"forced {force}")
    monkeypatch.delenv("CONVPOOL_TORCH_PATH")


def test_cpu_route_problems_train_on_the_conv_tail_route():
    # Within the CPU's wide limit (Cin x Cout 2048, kernel sides 3) a problem whose forward is
    # PyTorch's conv trains on the conv-tail route (its fused training forward would be the slower
    # conv); a Winograd pool-2 problem of the same width trains fused.
    for (init, shape, path) in (CPU_ROUTES[1], CPU_ROUTES[2], CPU_ROUTES[4]):
        ref, new = make_pair(init, seed=3)
        x = torch.rand(shape) * 2 - 1
        rec = RecordOps()
        with rec:
            training_grads(new, x)
        assert rec.fused_backward == (path == "fused"), (init, rec.ops)


def test_wide_training_errors_name_the_argument():
    # The CPU's wide rule asks the extension about the forward's path; a problem the op refuses
    # must still get the block's own message, not the query's.
    _, new = make_pair([16, 16, 3, 2.0, 2, (16, 1, 1, 1), 1], seed=1)
    with pytest.raises(ValueError, match="smaller than the kernel"):
        new(torch.rand(1, 16, 2, 8, 9, requires_grad=True))
    with pytest.raises(ValueError, match="x has 15 channels"):
        new(torch.rand(1, 15, 6, 8, 9, requires_grad=True))
