"""Helpers for the convpool tests: seeded model pairs, a float64 oracle and verbose comparisons."""
import copy

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import convpool

EPS = {torch.float32: 2.0 ** -23, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7,
       torch.float64: 2.0 ** -52}



def make_pair(init, seed=0):
    """(Model, ModelNew) built from the same seed: identical parameters."""
    torch.manual_seed(seed)
    ref = convpool.Model(*init)
    torch.manual_seed(seed)
    new = convpool.ModelNew(*init)
    return ref, new


def oracle(model, x):
    """Model in float64 on the given operands (already rounded to their dtype): the truth."""
    m64 = copy.deepcopy(model).to(torch.float64)
    with torch.no_grad():
        return m64(x.to(torch.float64))


def describe_mismatch(actual, expected, bad, limit=5):
    """The first few mismatching pairs, the count, and NaN/Inf disagreements."""
    a, e, b = actual.flatten(), expected.flatten(), bad.flatten()
    idx = b.nonzero().flatten()
    lines = [f"{idx.numel()} of {b.numel()} elements mismatch"]
    for i in idx[:limit].tolist():
        lines.append(f"  [{i}] got {a[i].item()!r} expected {e[i].item()!r}")
    nan_dis = (a.isnan() != e.isnan()).sum().item()
    inf_dis = ((a.isinf() | e.isinf()) & (a != e) & ~a.isnan() & ~e.isnan()).sum().item()
    if nan_dis or inf_dis:
        lines.append(f"  NaN disagreements: {nan_dis}, Inf disagreements: {inf_dis}")
    return "\n".join(lines)


def assert_close(actual, expected, atol, rtol=0.0, what=""):
    """|actual - expected| <= atol + rtol * |expected| elementwise; NaN and Inf must agree."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a, e = actual.detach().to(torch.float64).cpu(), expected.detach().to(torch.float64).cpu()
    finite = a.isfinite() & e.isfinite()
    same_special = (a == e) | (a.isnan() & e.isnan())
    tol = atol + rtol * e.abs()
    ok = torch.where(finite, (a - e).abs() <= tol, same_special)
    if not bool(ok.all()):
        raise AssertionError(f"{what}: atol={atol:.3g} rtol={rtol:.3g}\n{describe_mismatch(a, e, ~ok)}")


def assert_no_worse_than_torch(new, torch_out, truth, eps, what="", floor_ulps=8.0):
    """ModelNew's error against the float64 truth is at most 2x PyTorch's own error in the same
    precision, plus a floor of floor_ulps ulps (eps) of the result's scale (PyTorch can be exact
    by luck). Non-finite values must match the truth exactly."""
    assert new.shape == torch_out.shape, f"{what}: shape {tuple(new.shape)} != {tuple(torch_out.shape)}"
    assert new.dtype == torch_out.dtype, f"{what}: dtype {new.dtype} != {torch_out.dtype}"
    t = truth.detach().to(torch.float64).cpu()
    n = new.detach().to(torch.float64).cpu()
    p = torch_out.detach().to(torch.float64).cpu()
    finite = t.isfinite()
    scale = t[finite].abs().max().item() + 1.0 if bool(finite.any()) else 1.0
    torch_err = (p - t)[finite & p.isfinite()].abs().max().item() if bool(finite.any()) else 0.0
    atol = 2.0 * torch_err + floor_ulps * eps * scale
    assert_close(n, t, atol=atol, what=f"{what} (PyTorch's own error {torch_err:.3g})")


def cuda_available():
    return torch.cuda.is_available() and convpool.load()


# ---- training (test_training_cpu.py, test_cuda_training.py) ----

class RecordOps(TorchDispatchMode):
    """Names of the convpool ops dispatched inside the block (ops: 'forward', 'backward', ...)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.name())
        if name.startswith("convpool"):
            self.ops.append(name.split("::")[1])
        return func(*args, **(kwargs or {}))

    @property
    def fused_backward(self):
        """A fused backward ran: 'backward' (codes found again) or 'backward_codes' (the CPU
        training forward's codes)."""
        return "backward" in self.ops or "backward_codes" in self.ops


def direct_calls(fn):
    """(fn()'s result, how many times it took ModelNew's direct entry, which bypasses the op
    dispatcher and so no dispatch mode sees it: counted from torch.profiler's events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = fn()
    names = [e.name for e in prof.events()]
    return result, names.count("convpool::block_inference_direct")


GRAD_NAMES = ("x", "weight", "conv_bias", "bias")


def training_grads(model, x, need_x=True):
    """Gradients of a loss over model(x) for x (when need_x) and every parameter that requires
    one. The loss weights do not sum to zero: a symmetric loss makes the true bias gradient 0."""
    inp = x.clone().requires_grad_(need_x)
    y = model(inp)
    loss = (y * torch.linspace(0.5, 1.5, y.numel(), device=y.device, dtype=y.dtype).view(y.shape)).sum()
    wrt = ([inp] if need_x else []) + [p for p in model.parameters() if p.requires_grad]
    return torch.autograd.grad(loss, wrt)


def x_and_conv_bias_grads(model, x):
    """x.grad and conv.bias.grad of a loss over model(x) whose weights do not sum to zero."""
    xi = x.clone().requires_grad_(True)
    y = model(xi)
    (y * torch.linspace(0.5, 1.5, y.numel(), device=y.device).view(y.shape)).sum().backward()
    return xi.grad, model.conv.bias.grad


def penalty_grads(model, x):
    """x's and every parameter's gradient of out.sum() + |d out.sum() / dx|^2, the second term
    through create_graph (a gradient penalty: second-order gradients)."""
    xi = x.clone().requires_grad_(True)
    out = model(xi)
    gx, = torch.autograd.grad(out.sum(), xi, create_graph=True)
    assert gx.requires_grad
    (out.sum() + (gx ** 2).sum()).backward()
    return [xi.grad] + [p.grad for p in model.parameters()]


def func_grads(model, x):
    """The parameters' gradients by torch.func.grad (sorted by name) and x's by torch.func.vjp, of
    model(x).sum()."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    g = torch.func.grad(lambda p, xx: torch.func.functional_call(model, p, (xx,)).sum())(params, x)
    out, vjp = torch.func.vjp(model, x)
    return [g[k] for k in sorted(g)] + [vjp(torch.ones_like(out))[0]]


def finite_scale(t):
    """max |t| over its finite entries (0 where there are none)."""
    finite = t[t.isfinite()]
    return finite.abs().max().item() if finite.numel() else 0.0


def assert_fused_grads_no_worse(ref, new, x):
    """ModelNew's gradients through the fused backward (the op must run) against float64
    autograd: each relative (Frobenius) error at most twice Model's in the same precision, plus
    1e-5."""
    truth = training_grads(copy.deepcopy(ref).double(), x.double())
    rec = RecordOps()
    with rec:
        got = training_grads(new, x)
    assert rec.fused_backward, rec.ops
    for name, g_new, g_ref, t in zip(GRAD_NAMES, got, training_grads(ref, x), truth):
        assert g_new.shape == t.shape and g_new.dtype == g_ref.dtype, name
        err_new = ((g_new.double() - t).norm() / t.norm()).item()
        err_ref = ((g_ref.double() - t).norm() / t.norm()).item()
        assert err_new <= 2 * err_ref + 1e-5, (name, err_new, err_ref)


def assert_same_nonfinite_grads(ref, new, x):
    """Model's pattern of NaN and inf exactly, and its finite gradient values."""
    for name, g_new, g_ref in zip(GRAD_NAMES, training_grads(new, x), training_grads(ref, x)):
        assert torch.equal(g_new.isnan(), g_ref.isnan()), name
        assert torch.equal(g_new.isinf(), g_ref.isinf()), name
        finite = g_ref.isfinite()
        if bool(finite.any()):
            assert_close(g_new[finite], g_ref[finite], atol=1e-4 * (g_ref[finite].abs().max().item() + 1e-6),
                         what=name)


def count_state_calls(monkeypatch, *keys):
    """Wrap each of convpool._ops._STATE's entries named (those that are set) so that a call
    appends its first argument's dtype to the returned list."""
    calls = []
    for key in keys:
        def counted(*args, _f=convpool._ops._STATE[key]):
            calls.append(args[0].dtype)
            return _f(*args)

        if convpool._ops._STATE[key] is not None:
            monkeypatch.setitem(convpool._ops._STATE, key, counted)
    return calls


def half_call_and_block_grads(new, x, create_graph, monkeypatch):
    """The output and gradients of ModelNew's call and of block() with its parameters, recorded
    ops included: first-order, or (create_graph) the gradients of a penalty on x's and the
    weight's gradients, None where a parameter gets none. ModelNew's call must be one
    block_train call (its C++ autograd kernel), through the op or its direct entry."""
    calls = count_state_calls(monkeypatch, "block_train_op", "train_direct")

    def block_call(inp):
        return convpool.block(inp, new.conv.weight, new.conv.bias, new.bias, new.divisor, new.pool_size,
                              new.sum_dim)

    results = []
    for call in (new, block_call):
        rec = RecordOps()
        with rec:
            xi = x.clone().requires_grad_(True)
            y = call(xi)
            g = torch.linspace(-1, 1, y.numel(), device=y.device).view(y.shape).to(y.dtype)
            params = [xi] + list(new.parameters())
            grads = torch.autograd.grad((y * g).sum(), params, create_graph=create_graph)
            if create_graph:
                penalty = sum((gr.float() ** 2).sum() for gr in grads[:2])
                grads = torch.autograd.grad(penalty, params, allow_unused=True)
        results.append((y.detach(), grads, rec.ops))
        if call is new:
            assert calls == [x.dtype], calls
    return results


def assert_same_half_results(results, create_graph):
    (y_new, g_new, ops_new), (y_blk, g_blk, _) = results
    if not create_graph:
        assert "forward_train" in ops_new and "backward_codes" in ops_new, ops_new
    assert y_new.dtype == y_blk.dtype and torch.equal(y_new, y_blk)
    for i, (a, b) in enumerate(zip(g_new, g_blk)):
        assert (a is None) == (b is None), i
        if a is not None:
            assert a.dtype == b.dtype and torch.equal(a, b), i
