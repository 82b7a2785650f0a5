"""PyTorch CPU eager baseline for bench_cpu: the KernelBench Model at the same shape and thread
count, wall time per forward (no_grad), median and p20/p80 over --iters runs after --warmup runs,
GFLOP/s from the same count as convpool_problem_flops (2 x the direct convolution's
multiply-adds). Prints one line, or one JSON object with --json (same keys as bench_cpu's).

  python bench/bench_cpu_torch.py --threads 16                 # headline problem
  python bench/bench_cpu_torch.py --threads 16 --batch 8 --json
  build/bench_cpu --threads 16 --batch 8 --json                # the fused path, same shape
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import torch


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from convpool.model import Model  # noqa: E402  (the reference block, KernelBench L2 #8)
from revision import revision  # noqa: E402  (bench/ is sys.path[0] when run as a script)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--in-channels", type=int, default=8)
    ap.add_argument("--out-channels", type=int, default=16)
    ap.add_argument("--depth", type=int, default=16)
    ap.add_argument("--height", type=int, default=64)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--kernel", type=int, default=3, help="all three kernel extents")
    ap.add_argument("--kernel-d", type=int)
    ap.add_argument("--kernel-h", type=int)
    ap.add_argument("--kernel-w", type=int)
    ap.add_argument("--pool", type=int, default=2, help="all three pool extents")
    ap.add_argument("--pool-d", type=int)
    ap.add_argument("--pool-h", type=int)
    ap.add_argument("--pool-w", type=int)
    ap.add_argument("--divisor", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads; 0 = PyTorch's default")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.iters < 1 or a.warmup < 0:
        ap.error("--iters must be >= 1 and --warmup >= 0")

    k = (a.kernel_d or a.kernel, a.kernel_h or a.kernel, a.kernel_w or a.kernel)
    pool = (a.pool_d or a.pool, a.pool_h or a.pool, a.pool_w or a.pool)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    threads = torch.get_num_threads()

    torch.manual_seed(0)
    model = Model(a.in_channels, a.out_channels, k, a.divisor, pool, (a.out_channels, 1, 1, 1), 1).eval()
    x = torch.rand(a.batch, a.in_channels, a.depth, a.height, a.width)
    conv = [n - kk + 1 for n, kk in zip((a.depth, a.height, a.width), k)]
    if min(conv) < 1 or any(c // p == 0 for c, p in zip(conv, pool)):
        ap.error("the shape gives an empty conv or pooled output")
    flops = 2.0 * a.batch * a.out_channels * conv[0] * conv[1] * conv[2] * a.in_channels * k[0] * k[1] * k[2]

    times = []
    with torch.no_grad():
        for i in range(a.warmup + a.iters):
            t0 = time.perf_counter()
            model(x)
            t1 = time.perf_counter()
            if i >= a.warmup:
                times.append(t1 - t0)
    times.sort()
    q = lambda f: times[min(len(times) - 1, int(f * len(times)))]
    med = statistics.median(times)
    shape = (f"B{a.batch} {a.in_channels}->{a.out_channels} {a.depth}x{a.height}x{a.width} "
             f"k{k[0]}x{k[1]}x{k[2]} p{pool[0]}x{pool[1]}x{pool[2]} d{a.divisor:g}")
    row = dict(variant="torch_eager_cpu", shape=shape, batch=a.batch, threads=threads,
               median_ms=round(med * 1e3, 4), p20_ms=round(q(0.2) * 1e3, 4), p80_ms=round(q(0.8) * 1e3, 4),
               GFLOPs=round(flops / med * 1e-9, 2), torch=torch.__version__,
               cpu_capability=torch.backends.cpu.get_cpu_capability(), cpu=cpu_name(),
               date=datetime.date.today().isoformat(), rev=revision())
    if a.json:
        print(json.dumps(row))
    else:
        print(f"torch_eager_cpu  {shape}  threads {threads}: median {row['median_ms']:.3f} ms "
              f"(p20 {row['p20_ms']:.3f}, p80 {row['p80_ms']:.3f})  {row['GFLOPs']:.1f} GFLOP/s  "
              f"[{row['cpu']}, torch {torch.__version__} {row['cpu_capability']}]")


if __name__ == "__main__":
    main()
