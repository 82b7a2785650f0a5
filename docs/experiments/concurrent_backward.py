"""Experiment: grad_x and grad_weight of the fused backward on two streams at once.

Each kernel alone is latency-bound (KERNEL_NOTES), so their blocks side by side on one SM may
overlap. The env overrides CONVPOOL_EXP_GX_PER_SM / CONVPOOL_EXP_W_PER_SM capped each kernel's
resident blocks an SM so the other found room; they were a two-line experiment-only patch
(a getenv after blocks_per_sm in grad_x_sm90_launch_as and weight_sm90_launch), not in the tree,
so without it the capped rows repeat the default. Measured on an H200 in the twenty-fifth
session (BENCHMARKS): capping lost; the two streams' gain is the tail overlap. The library's
binding now splits large steps itself (split_backward), so "both, one call" takes two streams
from 2^22 positions unless CONVPOOL_SPLIT_BACKWARD=0.

  PYTHONPATH=python python3 docs/experiments/concurrent_backward.py [batch]
"""
import os
import statistics
import sys

import torch

from convpool._ops import OP_NAMESPACE, load

load()

ops = getattr(torch.ops, OP_NAMESPACE)
B = int(sys.argv[1]) if len(sys.argv) > 1 else 128
torch.manual_seed(0)
x = torch.rand(B, 8, 16, 64, 64, device="cuda")
w = torch.randn(16, 8, 3, 3, 3, device="cuda") * 0.1
cb = torch.randn(16, device="cuda")
bias = torch.randn(16, 1, 1, 1, device="cuda")
pooled, out, codes = ops.forward_train(x, w, cb, bias, 2.0, [2, 2, 2], True)
gp = torch.randn_like(pooled)
args = (x, w, cb, codes, gp, None, 2.0, [2, 2, 2])


def bw(nx, nw):
    return ops.backward_codes(*args, nx, nw, nw, True)


ref = bw(True, True)
main = torch.cuda.current_stream()
s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()


def conc():
    ev = torch.cuda.Event()
    ev.record(main)
    s1.wait_event(ev)
    s2.wait_event(ev)
    with torch.cuda.stream(s2):
        rw = bw(False, True)
    with torch.cuda.stream(s1):
        rx = bw(True, False)
    main.wait_stream(s1)
    main.wait_stream(s2)
    return rx, rw


def timed(fn, n=20):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(main)
        fn()
        b.record(main)
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


print(f"batch {B}, {torch.cuda.get_device_name(0)}")
print("| gx per SM | w per SM | both, one call | x only | w only | x, w on two streams | same bits |")
print("|---|---|---|---|---|---|---|")
for gx, ww in [(None, None), (2, 1), (1, 2), (2, 2), (1, 1), (3, 1), (1, 3), (2, 3)]:
    for k, v in (("CONVPOOL_EXP_GX_PER_SM", gx), ("CONVPOOL_EXP_W_PER_SM", ww)):
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = str(v)
    t_both = timed(lambda: bw(True, True))
    t_x = timed(lambda: bw(True, False))
    t_w = timed(lambda: bw(False, True))
    t_c = timed(conc)
    rx, rw = conc()
    torch.cuda.synchronize()
    same = torch.equal(rx[0], ref[0]) and torch.equal(rw[1], ref[1])
    print(f"| {gx or 'default'} | {ww or 'default'} | {t_both:.4f} | {t_x:.4f} | {t_w:.4f} | {t_c:.4f} | {same} |")
