"""Probe: where a grad-enabled forward of the conv-tail route (Cin x Cout past the fused
backward's limit) spends its host time at batch 2, piece by piece against Model's forward.
Each piece is timed interleaved with the others, synced, median host us to enqueue of --iters.

  PYTHONPATH=python python docs/experiments/conv_tail_host.py [--iters 300]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import convpool
from convpool import _ops
from convpool.model import Model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=300)
    args = ap.parse_args()
    convpool.load()
    for init, shape in (([16, 32, 3, 2.0, 2, (32, 1, 1, 1), 1], (2, 16, 16, 32, 32)),
                        ([3, 64, 3, 2.0, 2, (64, 1, 1, 1), 1], (1, 3, 16, 112, 112))):
        torch.manual_seed(0)
        ref = Model(*init).cuda()
        new = convpool.ModelNew(*init).cuda()
        new.load_state_dict(ref.state_dict())
        x = torch.rand(shape, device="cuda")
        w, cb, b = new.conv.weight, new.conv.bias, new.bias
        op = _ops._STATE["conv_tail_op"]
        m = op(x, w, cb, 2.0, [2, 2, 2])
        y = F.conv3d(x, w, cb)
        pieces = {
            "Model": lambda: ref(x),
            "ModelNew": lambda: new(x),
            "conv3d": lambda: F.conv3d(x, w, cb),
            "conv_tail op": lambda: op(x, w, cb, 2.0, [2, 2, 2]),
            "tail_train op": lambda: _ops._STATE["tail_op"](y, 2.0, [2, 2, 2]),
            "div + max_pool3d": lambda: F.max_pool3d(y / 2.0, 2),
            "mean + add + sum": lambda: torch.sum(F.adaptive_avg_pool3d(m, (1, 1, 1)) + b, dim=1),
            "conv bias clone": lambda: cb.clone(),
            "empty op": lambda: torch.empty(0, device="cuda"),
        }
        hs = {k: [] for k in pieces}
        for _ in range(10):
            for f in pieces.values():
                f()
        for _ in range(args.iters):
            for k, f in pieces.items():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                f()
                hs[k].append((time.perf_counter() - t0) * 1e6)
        print(f"## x {tuple(shape)}, Cout {init[1]}: median host us a call, grad mode on")
        for k, v in hs.items():
            print(f"- {k}: {statistics.median(v):.1f}")
        print(flush=True)


if __name__ == "__main__":
    main()
