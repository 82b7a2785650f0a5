"""CPU training step, convpool.ModelNew against PyTorch eager (convpool.model.Model).

A step is forward, loss = out.sum(), backward for x and every parameter. Prints a markdown
table: median of --reps steps, the better of two rounds per model (rounds alternate, so drift
on a shared machine hits both). Threads: torch's (set OMP_NUM_THREADS / --threads).

  python bench/bench_train_cpu.py [--batch 2] [--threads N] [--rows headline,k5,pool3,c32_c64]
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import convpool  # noqa: E402
from convpool.model import Model  # noqa: E402

ROWS = {
    "headline": ((8, 16, 64, 64), [8, 16, 3, 2.0, 2, (16, 1, 1, 1), 1]),
    "k5": ((8, 16, 64, 64), [8, 16, 5, 2.0, 2, (16, 1, 1, 1), 1]),
    "pool3": ((8, 16, 64, 64), [8, 16, 3, 2.0, 3, (16, 1, 1, 1), 1]),
    "c32_c64": ((32, 16, 32, 32), [32, 64, 3, 2.0, 2, (64, 1, 1, 1), 1]),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rows", default=",".join(ROWS))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    convpool.load()
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}")
    print("| row | x | eager step ms | convpool step ms | speedup | convpool path |\n|---|---|---|---|---|---|")
    for name in args.rows.split(","):
        shape, init = ROWS[name]
        torch.manual_seed(0)
        ref = Model(*init)
        new = convpool.ModelNew(*init)
        new.load_state_dict(ref.state_dict())
        x = torch.rand(args.batch, *shape)

        def step(model):
            model.zero_grad(set_to_none=True)
            model(x.clone().requires_grad_(True)).sum().backward()

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
        fused = convpool._ops._fused_backward_serves(x, new.conv.weight, new.conv.bias, float(init[3]), pool)
        print(f"| {name} | {'x'.join(map(str, x.shape))} | {best['eager']:.1f} | {best['convpool']:.1f} "
              f"| {best['eager'] / best['convpool']:.2f}x | {'fused backward' if fused else 'PyTorch ops'} |",
              flush=True)


if __name__ == "__main__":
    main()
