"""Every rejected input raises before any kernel runs, with a message naming the argument.

ModelNew (Python checks, shared with the op's fake kernel) and the op itself (C++ checks in
binding.cpp) are both covered. Shapes/sizes/devices raise ValueError, dtypes TypeError, sum_dim
IndexError; Model rejects the same inputs (with PyTorch's own messages).
"""
import re

import pytest
import torch

import convpool
from _util import make_pair

INIT = [3, 4, 3, 2.0, 2, (4, 1, 1, 1), 1]


def x_of(*shape, dtype=torch.float32):
    return torch.rand(*shape).to(dtype)


@pytest.mark.parametrize("x, exc, message", [
    (x_of(3, 8, 8, 8)[0], ValueError,
     "x must be a 5-D tensor (N, C, D, H, W) or a 4-D unbatched tensor (C, D, H, W), got 3-D"),
    (x_of(1, 2, 3, 8, 8, 8), ValueError, "got 6-D"),
    (x_of(2, 5, 8, 8, 8), ValueError, "x has 5 channels (dim 1) but weight expects in_channels = 3"),
    (x_of(5, 8, 8, 8), ValueError, "x has 5 channels (dim 0) but weight expects in_channels = 3"),
    (x_of(2, 3, 2, 8, 8), ValueError, "x spatial size (D, H, W) = (2, 8, 8) is smaller than the kernel (3, 3, 3)"),
    (x_of(2, 3, 8, 3, 8), ValueError, "pool_size (2, 2, 2) is larger than the conv output (6, 1, 6)"),
    (torch.randint(0, 5, (2, 3, 8, 8, 8)), TypeError, "x must be a floating-point tensor, got torch.int64"),
    (x_of(2, 3, 8, 8, 8, dtype=torch.float64), TypeError,
     "x (torch.float64) and weight (torch.float32) must have the same dtype"),
    (x_of(2, 3, 8, 8, 8, dtype=torch.float16), TypeError,
     "x (torch.float16) and weight (torch.float32) must have the same dtype"),
])
def test_modelnew_rejects(x, exc, message):
    ref, new = make_pair(INIT)
    with pytest.raises(exc, match=re.escape(message)):
        new(x)
    with pytest.raises(Exception):
        ref(x)  # Model rejects it too


def test_devices_must_match():
    _, new = make_pair(INIT)
    x = x_of(2, 3, 8, 8, 8)
    for attr, label in [("conv.weight", "weight"), ("conv.bias", "conv_bias"), ("bias", "bias")]:
        _, m = make_pair(INIT)
        owner = m.conv if attr.startswith("conv.") else m
        name = attr.split(".")[-1]
        setattr(owner, name, torch.nn.Parameter(getattr(owner, name).detach().to("meta")))
        with pytest.raises(ValueError, match=re.escape(f"{label} is on meta but x is on cpu")):
            m(x)


def test_pool_size_and_bias_and_sum_dim():
    x = x_of(2, 3, 8, 8, 8)
    for pool, message in [((2, 2), "pool_size must be an int or a tuple of 1 or 3 ints (D, H, W), got (2, 2)"),
                          ((2, 0, 2), "pool_size must be 3 positive ints (pD, pH, pW), got (2, 0, 2)")]:
        _, m = make_pair([3, 4, 3, 2.0, pool, (4, 1, 1, 1), 1])
        with pytest.raises(ValueError, match=re.escape(message)):
            m(x)
    _, m = make_pair([3, 4, 3, 2.0, 2, (3, 1, 1, 1), 1])
    with pytest.raises(ValueError, match=re.escape("bias of shape (3, 1, 1, 1) does not broadcast against "
                                                   "the pooled tensor of shape (2, 4, 1, 1, 1)")):
        m(x)
    _, m = make_pair([3, 4, 3, 2.0, 2, (4, 1, 1, 1), 5])
    with pytest.raises(IndexError, match=re.escape("sum_dim 5 is out of range for the 5-D tensor")):
        m(x)


def test_op_checks_in_cpp():
    # The op called directly: the binding's own named checks.
    convpool.load()
    op = torch.ops.convpool.forward
    x, w, cb, b = x_of(2, 3, 8, 8, 8), torch.randn(4, 3, 3, 3, 3), torch.randn(4), torch.randn(4)
    cases = [
        ((x[0], w, cb, b, 2.0, [2, 2, 2], True), ValueError, "x must be a 5-D tensor (N, C, D, H, W), got 4-D"),
        ((x, w[0], cb, b, 2.0, [2, 2, 2], True), ValueError,
         "weight must be a 5-D tensor (C_out, C_in, kD, kH, kW), got 4-D"),
        ((x[:, :2], w, cb, b, 2.0, [2, 2, 2], True), ValueError,
         "x has 2 channels (dim 1) but weight expects in_channels = 3"),
        ((x, w, cb[:3], b, 2.0, [2, 2, 2], True), ValueError, "conv_bias must have out_channels = 4 elements, got 3"),
        ((x, w, cb, b[:2], 2.0, [2, 2, 2], True), ValueError, "bias must have out_channels = 4 elements, got 2"),
        ((x, w, cb, b, 2.0, [2, 0, 2], True), ValueError, "pool must be positive, got [2, 0, 2]"),
        ((x[..., :2], w, cb, b, 2.0, [2, 2, 2], True), ValueError,
         "x spatial size (D, H, W) = [8, 8, 2] is smaller than the kernel [3, 3, 3]"),
        ((x, w, cb, b, 2.0, [7, 2, 2], True), ValueError, "pool [7, 2, 2] is larger than the conv output (6, 6, 6)"),
        ((x.double(), w, cb, b, 2.0, [2, 2, 2], True), TypeError,
         "x must be float32, float16 or bfloat16 on the CPU kernel, got Double"),
        ((x, w.to("meta"), cb, b, 2.0, [2, 2, 2], True), ValueError, "weight is on meta but x is on cpu"),
        ((x[:0], w, cb, b, 2.0, [2, 2, 2], True), ValueError, "x and weight must not be empty"),
    ]
    for args, exc, message in cases:
        with pytest.raises(exc, match=re.escape(message)):
            op(*args)
    # The fake kernel (torch.compile's view of the op) makes the same checks.
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fx = mode.from_tensor(x)
        with pytest.raises(ValueError, match=re.escape("x has 2 channels (dim 1)")):
            op(fx[:, :2], mode.from_tensor(w), None, None, 2.0, [2, 2, 2], True)


def test_library_errors_surface_with_the_status():
    # A problem only the library's validation refuses: the conv output element count overflows
    # int64 (expanded views, so nothing is allocated; validation runs before any conversion).
    convpool.load()
    x = torch.zeros(1).expand(2 ** 31, 1, 1, 1, 1)
    w = torch.zeros(1).expand(2 ** 33, 1, 1, 1, 1)
    with pytest.raises(ValueError, match=r"convpool_problem_validate failed with CONVPOOL_ERR_OVERFLOW: "
                                         r"out_channels \(8589934592\) is too large: the conv output element count .* overflows int64"):
        torch.ops.convpool.forward(x, w, None, None, 1.0, [1, 1, 1], False)


def test_state_survives_errors():
    # After any rejected call the next valid one works and gives the same answer as before.
    ref, new = make_pair(INIT)
    x = x_of(2, 3, 8, 8, 8)
    with torch.no_grad():
        before = new(x)
        for bad in (x[:, :2], x[..., :2], x.double()):
            with pytest.raises((ValueError, TypeError)):
                new(bad)
        assert torch.equal(new(x), before)
