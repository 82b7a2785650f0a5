"""Host time of one convpool call, layer by layer (GPU needed).

A forward that launches in less time than the GPU spends on it is free; one whose host work
outlasts the kernel makes every small-batch call host-bound. This prints, per shape, the host
microseconds of each layer, calls enqueued back to back (no sync between):

  model      ModelNew(x) under no_grad: Python block() + op + C++ + launches
  op         the registered op (its autograd formula is Python's) called with detached tensors
  infer      forward_inference, the same kernels without an autograd kernel (ModelNew's path)
  explain    a C++ op that only validates and plans (no allocation, no launch)
  empty      torch.empty on the GPU: the floor of any op call
  eager      Model(x): PyTorch's own block, for scale

  python bench/host_overhead.py [--rows headline,pool3]
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import convpool  # noqa: E402
from convpool import _ops  # noqa: E402
from convpool.model import Model  # noqa: E402

ROWS = {
    "headline": dict(kernel=3, pool=2),
    "k1": dict(kernel=1, pool=2),
    "pool3": dict(kernel=3, pool=3),
    "k5": dict(kernel=5, pool=2),
    "k2": dict(kernel=2, pool=2),
    "pool1": dict(kernel=3, pool=1),
    "k1x7x7": dict(kernel=(1, 7, 7), pool=2),
}


def host_us(fn, calls=500):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    convpool.load()
    print(f"# {torch.cuda.get_device_name(0)}, batch {args.batch}, host us per call")
    print("| row | model | op | infer | explain | empty | eager |\n|---|---|---|---|---|---|---|")
    for name in args.rows.split(","):
        r = ROWS[name]
        init = (8, 16, r["kernel"], 2.0, r["pool"], (16, 1, 1, 1), 1)
        torch.manual_seed(0)
        mn = convpool.ModelNew(*init).cuda()
        m = Model(*init).cuda()
        x = torch.rand(args.batch, 8, 16, 64, 64, device="cuda")
        w, cb, b = mn.conv.weight.detach(), mn.conv.bias.detach(), mn.bias.detach().reshape(16)
        op, infer = _ops._STATE["op"], _ops._STATE["infer_op"]
        pool = list(_ops._triple(r["pool"], "pool"))
        ex = getattr(torch.ops, _ops.OP_NAMESPACE).explain
        with torch.no_grad():
            t = dict(model=host_us(lambda: mn(x)),
                     op=host_us(lambda: op(x, w, cb, b, 2.0, pool, True)),
                     infer=host_us(lambda: infer(x, w, cb, b, 2.0, pool, True)),
                     explain=host_us(lambda: ex(x, w, pool, 2.0, True)),
                     empty=host_us(lambda: torch.empty(16, device="cuda")),
                     eager=host_us(lambda: m(x)))
        print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in t.values()) + " |", flush=True)


if __name__ == "__main__":
    main()
