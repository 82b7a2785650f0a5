"""CPU training step, convpool.ModelNew against PyTorch eager (convpool.model.Model).

A step is forward, loss = out.sum(), backward for x and every parameter. Prints a markdown
table: median of --reps steps, the better of two rounds per model (rounds alternate, so drift
on a shared machine hits both). Threads: torch's (set OMP_NUM_THREADS / --threads).

  python bench/bench_train_cpu.py [--batch 2] [--threads N] [--rows headline,k5,pool3,c32_c64 | all] [--parts]
                                  [--x-zero-half] [--dtype float32|float16|bfloat16]

--parts adds, per fused row, where convpool's step goes: the training forward (forward_train:
output and codes), the inference forward beside it (the codes' share is the difference), and
backward_codes for grad_x alone and for the weight and conv-bias gradients alone (medians).
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import convpool  # noqa: E402
from convpool.model import Model  # noqa: E402
from revision import revision  # noqa: E402  (bench/ is sys.path[0] when run as a script)

ROWS = {
    "headline": ((8, 16, 64, 64), [8, 16, 3, 2.0, 2, (16, 1, 1, 1), 1]),
    "k5": ((8, 16, 64, 64), [8, 16, 5, 2.0, 2, (16, 1, 1, 1), 1]),
    "pool3": ((8, 16, 64, 64), [8, 16, 3, 2.0, 3, (16, 1, 1, 1), 1]),
    "c32_c64": ((32, 16, 32, 32), [32, 64, 3, 2.0, 2, (64, 1, 1, 1), 1]),
    "c16_c32": ((16, 16, 32, 32), [16, 32, 3, 2.0, 2, (32, 1, 1, 1), 1]),
    "c16_c16": ((16, 16, 32, 32), [16, 16, 3, 2.0, 2, (16, 1, 1, 1), 1]),
    "c8_c64": ((8, 16, 32, 32), [8, 64, 3, 2.0, 2, (64, 1, 1, 1), 1]),
    "c64_c32": ((64, 16, 32, 32), [64, 32, 3, 2.0, 2, (32, 1, 1, 1), 1]),
    "c16_c32_pool3": ((16, 16, 32, 32), [16, 32, 3, 2.0, 3, (32, 1, 1, 1), 1]),
    "c32_c32_k5": ((32, 16, 32, 32), [32, 32, 5, 2.0, 2, (32, 1, 1, 1), 1]),
    "c16_c32_k133_p122": ((16, 16, 32, 32), [16, 32, (1, 3, 3), 2.0, (1, 2, 2), (32, 1, 1, 1), 1]),
    "c16_c128_k2": ((16, 16, 32, 32), [16, 128, 2, 2.0, 2, (128, 1, 1, 1), 1]),
    "c64_c64": ((64, 16, 32, 32), [64, 64, 3, 2.0, 2, (64, 1, 1, 1), 1]),
    "c64_c128": ((64, 16, 32, 32), [64, 128, 3, 2.0, 2, (128, 1, 1, 1), 1]),
    # The other families of the forward's CPU sweep (BENCHMARKS, "CPU: every shape family").
    "pool1": ((8, 16, 64, 64), [8, 16, 3, 2.0, 1, (16, 1, 1, 1), 1]),
    "pool1x2x2": ((8, 16, 64, 64), [8, 16, 3, 2.0, (1, 2, 2), (16, 1, 1, 1), 1]),
    "pool2x4x4": ((8, 16, 64, 64), [8, 16, 3, 2.0, (2, 4, 4), (16, 1, 1, 1), 1]),
    "k1x3x3_pool2": ((8, 16, 64, 64), [8, 16, (1, 3, 3), 2.0, 2, (16, 1, 1, 1), 1]),
    "k1x7x7": ((8, 16, 64, 64), [8, 16, (1, 7, 7), 2.0, 2, (16, 1, 1, 1), 1]),
    "k3x1x1": ((8, 16, 64, 64), [8, 16, (3, 1, 1), 2.0, 2, (16, 1, 1, 1), 1]),
    "k1": ((8, 16, 64, 64), [8, 16, 1, 2.0, 2, (16, 1, 1, 1), 1]),
    "cin3_cout64": ((3, 16, 112, 112), [3, 64, 3, 2.0, 2, (64, 1, 1, 1), 1]),
}
DEFAULT_ROWS = "headline,k5,pool3,c32_c64"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rows", default=DEFAULT_ROWS, help=f"comma-separated, 'all' for every row: {', '.join(ROWS)}")
    ap.add_argument("--parts", action="store_true", help="time the step's parts for fused rows")
    ap.add_argument("--x-zero-half", action="store_true",
                    help="x is 0 in the first half of every row (a flat background: every window there ties)")
    ap.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                    help="both models and x in this dtype (model.to(dtype), as a 16-bit user runs them)")
    ap.add_argument("--forward", action="store_true", help="time grad-enabled forwards, not steps")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    if args.threads:
        torch.set_num_threads(args.threads)
    convpool.load()
    print(f"# torch {torch.__version__}, rev {revision()}, {torch.get_num_threads()} threads, batch {args.batch}, "
          f"{args.dtype}")
    what = "grad-enabled forward" if args.forward else "step"
    print(f"| row | x | eager {what} ms | convpool {what} ms | speedup | convpool path |\n|---|---|---|---|---|---|")
    parts = []
    for name in (list(ROWS) if args.rows == "all" else args.rows.split(",")):
        shape, init = ROWS[name]
        torch.manual_seed(0)
        ref = Model(*init)
        new = convpool.ModelNew(*init)
        new.load_state_dict(ref.state_dict())
        ref, new = ref.to(dtype), new.to(dtype)
        x = torch.rand(args.batch, *shape)
        if args.x_zero_half:
            x[..., : x.shape[-1] // 2] = 0.0
        x = x.to(dtype)

        def step(model):
            model.zero_grad(set_to_none=True)
            out = model(x.clone().requires_grad_(True))
            if not args.forward:
                out.sum().backward()

        best = {}
        for label, model in (("eager", ref), ("convpool", new)) * 2:
            step(model)
            times = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                step(model)
                times.append(time.perf_counter() - t0)
            med = sorted(times)[len(times) // 2] * 1e3
            best[label] = min(best.get(label, med), med)
        pool = convpool._ops._triple(init[4], "pool_size")
        fused = convpool._ops._fused_backward_serves(x, new.conv.weight, new.conv.bias, float(init[3]), pool) or \
            convpool._ops._upcast_training(x, new.conv.weight, new.conv.bias, float(init[3]), pool, None)
        route = ("fused backward" if fused else
                 "conv-tail route" if convpool._ops._tail_serves(pool) else
                 "PyTorch ops")
        print(f"| {name} | {'x'.join(map(str, x.shape))} | {best['eager']:.1f} | {best['convpool']:.1f} "
              f"| {best['eager'] / best['convpool']:.2f}x | {route} |", flush=True)
        if args.parts and fused and dtype is torch.float32:
            parts.append((name, step_parts(new, x, pool, float(init[3]), args.reps)))
    for name, t in parts:
        print(f"\n{name} parts (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in t.items()), flush=True)


def step_parts(model, x, pool, divisor, reps):
    """Medians of the fused step's parts, the ops called as ModelNew's training call calls them."""
    ns = getattr(torch.ops, convpool._ops.OP_NAMESPACE)
    w, cb, b = (t.detach() for t in (model.conv.weight, model.conv.bias, model.bias))
    bias = b.reshape(-1)
    _, _, codes = ns.forward_train(x, w, cb, bias, divisor, list(pool), False)
    grad_out = torch.ones(x.shape[0])
    calls = {
        "forward_train": lambda: ns.forward_train(x, w, cb, bias, divisor, list(pool), False),
        "forward_inference": lambda: ns.forward_inference(x, w, cb, bias, divisor, list(pool), False),
        "grad_x": lambda: ns.backward_codes(x, w, cb, codes, None, grad_out, divisor, list(pool), True, False,
                                            False, False),
        "grad_w+cb": lambda: ns.backward_codes(x, w, cb, codes, None, grad_out, divisor, list(pool), False, True,
                                               True, False),
    }
    out = {}
    for key, call in calls.items():
        call()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        out[key] = sorted(times)[len(times) // 2] * 1e3
    return out


if __name__ == "__main__":
    main()
