"""Gradients, the op registration (opcheck) and torch.compile on the CPU.

Gradient tolerance: the backward recomputes the forward with the same PyTorch ops Model uses, so
gradients agree with Model's to float32 rounding of the incoming gradient (the fused forward's
output differs from Model's by a few ulps, and d(y^2) = 2y carries that): rtol 1e-5 plus 1e-6 of
each gradient's scale.
"""
import copy

import pytest
import torch

import convpool
from _util import assert_close, make_pair

CASES = [
    # init, x shape, loss: out -> scalar
    ([3, 4, 3, 2.0, 2, (4, 1, 1, 1), 1], (2, 3, 7, 8, 9)),        # fused out path
    ([3, 4, (2, 3, 1), -1.5, (2, 1, 3), (1,), 0], (2, 3, 6, 7, 9)),  # generic path
    ([2, 3, 2, 0.5, 3, (3, 1, 1), -1], (3, 2, 7, 8, 7)),           # bias broadcasting to more dims
    ([2, 5, 3, 2.0, 2, (5, 1, 1, 1), 1], (2, 9, 8, 7)),            # unbatched
]


def grads(model, x, upstream_seed=3, call=None):
    """Gradients of a fixed scalar loss of model(x) (or call(x)) for x and each parameter."""
    x = x.clone().requires_grad_(True)
    y = (call if call is not None else model)(x)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(upstream_seed)).to(y.dtype)
    loss = (y * g).sum() + (y ** 2).sum()
    names = ["x"] + [n for n, _ in model.named_parameters()]
    return dict(zip(names, torch.autograd.grad(loss, [x] + list(model.parameters()))))


@pytest.mark.parametrize("case", range(len(CASES)))
def test_gradients_match_model(case):
    init, shape = CASES[case]
    ref, new = make_pair(init)
    x = torch.rand(shape, generator=torch.Generator().manual_seed(case))
    want, got = grads(ref, x), grads(new, x)
    assert list(want) == list(got)
    for name in want:
        scale = want[name].abs().max().item() + 1e-12
        assert_close(got[name], want[name], atol=1e-6 * scale, rtol=1e-5, what=f"grad {name}")


def test_gradients_half_model():
    # In bfloat16 Model's conv output is rounded to 8 bits, so max-pool ties route x's gradient
    # differently from ModelNew (which pools the float32 conv). The rule: ModelNew's relative
    # error against float64 autograd on the same operands is at most twice Model's, plus 1%.
    init, shape = CASES[0]
    ref, new = make_pair(init)
    ref, new = ref.to(torch.bfloat16), new.to(torch.bfloat16)
    x = torch.rand(shape, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    want, got = grads(ref, x), grads(new, x)
    truth_model = copy.deepcopy(ref).double()
    truth = grads(truth_model, x.double())
    for name in want:
        assert got[name].dtype == want[name].dtype == torch.bfloat16, name
        t = truth[name]
        err_new = ((got[name].double() - t).norm() / t.norm()).item()
        err_model = ((want[name].double() - t).norm() / t.norm()).item()
        assert err_new <= 2 * err_model + 0.01, f"grad {name}: {err_new:.3g} vs Model's {err_model:.3g}"


class _CompositeWithFormula(torch.autograd.Function):
    """The composite forward with convpool's registered gradient formula (pooled_backward), so
    gradcheck in float64 checks the very formula the op's autograd registration uses."""

    @staticmethod
    def forward(ctx, x, weight, conv_bias, bias, divisor, pool):
        ctx.save_for_backward(x, weight, conv_bias)
        ctx.divisor, ctx.pool = divisor, pool
        y = torch.nn.functional.conv3d(x, weight, conv_bias) / divisor
        pooled = torch.nn.functional.max_pool3d(y, pool).mean(dim=(2, 3, 4))
        return pooled, (pooled + bias).sum(1)

    @staticmethod
    def backward(ctx, grad_pooled, grad_out):
        x, weight, conv_bias = ctx.saved_tensors
        gx, gw, gcb, gb = convpool.pooled_backward(x, weight, conv_bias, ctx.divisor, ctx.pool,
                                                   grad_pooled, grad_out, ctx.needs_input_grad[:3])
        return gx, gw, gcb, gb, None, None


@pytest.mark.parametrize("divisor", [2.0, -0.75])
def test_gradcheck_formula_float64(divisor):
    g = torch.Generator().manual_seed(11)
    x = torch.rand(2, 2, 5, 6, 5, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 2, 2, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    cb = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    fn = lambda *a: _CompositeWithFormula.apply(*a, divisor, [2, 2, 2])  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w, cb, b), eps=1e-6, atol=1e-6, fast_mode=True)


def test_opcheck_registration():
    # Schema, fake kernel, autograd registration and AOT dispatch of the op itself (float32 CPU).
    convpool.load()
    g = torch.Generator().manual_seed(2)
    x = torch.rand(2, 3, 6, 7, 8, generator=g, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, 3, generator=g, requires_grad=True)
    cb = torch.randn(4, generator=g, requires_grad=True)
    b = torch.randn(4, generator=g, requires_grad=True)
    op = torch.ops.convpool.forward.default
    for args in [(x, w, cb, b, 2.0, [2, 2, 2], True), (x, w, None, None, -1.0, [1, 2, 3], False)]:
        torch.library.opcheck(op, args)
    # The inference op (no autograd formula): schema, fake kernel and AOT dispatch.
    op = torch.ops.convpool.forward_inference.default
    xd, wd, cbd, bd = x.detach(), w.detach(), cb.detach(), b.detach()
    for args in [(xd, wd, cbd, bd, 2.0, [2, 2, 2], True), (xd, wd, None, None, -1.0, [1, 2, 3], False)]:
        torch.library.opcheck(op, args)


def test_op_gradients_match_model_pooled():
    # Straight through the op (no ModelNew): P's gradient against autograd on Model's ops.
    convpool.load()
    g = torch.Generator().manual_seed(4)
    x = torch.rand(2, 3, 6, 7, 8, generator=g, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, 3, generator=g, requires_grad=True)
    cb = torch.randn(4, generator=g, requires_grad=True)
    up = torch.randn(2, 4, generator=g)
    pooled, _ = convpool.forward_op(x, w, cb, None, 2.0, [2, 2, 2], False)
    got = torch.autograd.grad((pooled * up).sum(), [x, w, cb])
    y = torch.nn.functional.max_pool3d(torch.nn.functional.conv3d(x, w, cb) / 2.0, 2)
    want = torch.autograd.grad((torch.nn.functional.adaptive_avg_pool3d(y, 1).flatten(1) * up).sum(),
                               [x, w, cb])
    for name, a, b in zip(["x", "weight", "conv_bias"], got, want):
        assert_close(a, b, atol=1e-6 * (b.abs().max().item() + 1e-12), rtol=1e-5, what=name)


def test_torch_compile_fullgraph_cpu():
    # One small case (inductor on the CPU compiles C++): forward and backward, no graph breaks.
    init, shape = CASES[0]
    ref, new = make_pair(init)
    compiled = torch.compile(new, fullgraph=True)
    x = torch.rand(shape, generator=torch.Generator().manual_seed(0))
    got = grads(new, x, call=compiled)
    want = grads(ref, x)
    with torch.no_grad():
        assert_close(compiled(x), ref(x), atol=1e-5, rtol=1e-5, what="compiled forward")
    for name in want:
        scale = want[name].abs().max().item() + 1e-12
        assert_close(got[name], want[name], atol=1e-6 * scale, rtol=1e-5, what=f"compiled grad {name}")
