"""Inputs and uses an input audit found ModelNew handling differently from Model (CPU).

Each test sets up the same use for Model and ModelNew and requires Model's result (or an error
where Model errors): a conv bias changed in place between the forward and the backward (Model's
autograd saves no conv bias), weights autocast does not cast (float64) under torch.autocast, and
a ModelNew unpickled in a process that has not built one yet.
"""
import math
import os
import pickle
import subprocess
import sys

import pytest
import torch

import convpool
from _util import assert_close, make_pair

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = (2, 3, 7, 8, 9)


def _x(seed=1):
    return torch.rand(SHAPE, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def _init(sum_dim=1):
    return [3, 4, 3, 2.0, 2, (4, 1, 1, 1), sum_dim]


def _assert_same_grads(got, want, what):
    assert len(got) == len(want), what
    for i, (a, b) in enumerate(zip(got, want)):
        assert (a is None) == (b is None), f"{what}: gradient {i} is {a is None} None against Model's {b is None}"
        if b is not None:
            finite = b[b.isfinite()]
            scale = finite.abs().max().item() if finite.numel() else 0.0
            assert_close(a, b, atol=1e-5 * (scale + 1e-6), what=f"{what}: gradient {i}")


# ----------------------------------------------------------------------------- conv bias in place

def _forward_then_change_conv_bias(model, x):
    """model's forward on a copy of x that requires grad, then conv.bias[1] = inf in place."""
    xi = x.clone().requires_grad_(True)
    y = model(xi)
    with torch.no_grad():
        model.conv.bias[1] = math.inf
    return xi, y


@pytest.mark.parametrize("sum_dim", [1, 0], ids=["module_op", "block"])
def test_conv_bias_changed_in_place_before_backward(sum_dim):
    # Model's autograd keeps x and the weight (the conv's backward) and the conv output (the max
    # pool's), never the conv bias, so an in-place change of conv.bias between the forward and
    # the backward (an optimizer step, an EMA update) is allowed and the backward is the
    # forward's. ModelNew raised "modified by an inplace operation". A NaN in x sends the CPU
    # backward to its dense formula, which recomputes the conv: it must use the forward's conv
    # bias (an inf in channel 1 there would flatten that channel's arg-max).
    x = _x()
    x[0, 1, 2, 3, 4] = math.nan
    results = []
    for model in make_pair(_init(sum_dim)):
        xi, y = _forward_then_change_conv_bias(model, x)
        weights = torch.linspace(0.5, 1.5, y.numel()).view(y.shape)
        results.append([y.detach()] + list(torch.autograd.grad((y * weights).sum(), [xi, *model.parameters()])))
    _assert_same_grads(results[1], results[0], f"sum_dim={sum_dim}")


@pytest.mark.parametrize("sum_dim", [1, 0], ids=["module_op", "block"])
def test_conv_bias_changed_in_place_before_double_backward(sum_dim):
    # The same under create_graph (a gradient penalty), where ModelNew recomputes the conv to
    # differentiate it: with the forward's conv bias (not the changed one), and still connected
    # to conv.bias, which gets Model's (zero) second-order gradient.
    x = _x(2)
    results = []
    for model in make_pair(_init(sum_dim)):
        xi, y = _forward_then_change_conv_bias(model, x)
        gx, = torch.autograd.grad(y.sum(), xi, create_graph=True)
        params = list(model.parameters())
        second = torch.autograd.grad((gx ** 2).sum(), [xi] + params[:2], allow_unused=True)
        results.append([y.detach(), gx.detach()] + list(second))
    _assert_same_grads(results[1], results[0], f"sum_dim={sum_dim}")
    assert results[1][4] is not None  # conv.bias is in the second-order graph, as in Model


# ----------------------------------------------------------------------------- autocast dtypes

@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("name", ["weight", "conv_bias"])
def test_autocast_does_not_cast_float64_weights(name, grad):
    # torch.autocast casts float16/32 operands only: a float64 conv weight or bias stays float64
    # and nn.Conv3d raises (its dtypes differ from the autocast x). ModelNew cast every operand
    # to the autocast dtype and returned a result.
    x = _x()
    for model in make_pair(_init()):
        param = model.conv.weight if name == "weight" else model.conv.bias
        param.data = param.data.double()
        with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=torch.bfloat16):
            if isinstance(model, convpool.ModelNew):
                with pytest.raises(TypeError, match=rf"{name} \(torch.float64\)"):
                    model(x)
            else:
                with pytest.raises(RuntimeError, match="should be the same|expected scalar type"):
                    model(x)


# ----------------------------------------------------------------------------- unpickling

def test_unpickled_in_a_fresh_process(tmp_path):
    # pickle (torch.save of the module, multiprocessing's spawn) recreates ModelNew without its
    # constructor, which loads the extension: the first call in a process that had built no
    # ModelNew failed ('NoneType' object is not callable, KeyError 'block_train_op'); Model's
    # works there.
    ref, new = make_pair(_init())
    x = _x()
    with torch.no_grad():
        want = ref(x)
    path = tmp_path / "model.pkl"
    path.write_bytes(pickle.dumps((new, x)))
    code = (
        "import pickle, sys, torch\n"
        f"model, x = pickle.loads(open({str(path)!r}, 'rb').read())\n"
        "with torch.no_grad():\n"
        "    y = model(x)\n"
        "y2 = model(x)\n"
        "y2.sum().backward()\n"
        "assert model.conv.weight.grad is not None\n"
        "torch.save(y, sys.argv[1])\n"
    )
    out = tmp_path / "y.pt"
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    run = subprocess.run([sys.executable, "-c", code, str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    torch.testing.assert_close(torch.load(out), want, rtol=1e-5, atol=1e-5)
