"""Where a GPU training step's time goes, kernel by kernel (issue "Training").

A step is forward, loss = out.sum(), backward for x and every parameter, TF32 by default. For each
row, PyTorch eager and convpool.ModelNew each run a few warm steps, then --steps steps under
torch.profiler; the table lists every CUDA kernel's (and memcpy/memset's) device time per step,
largest first, and the step's wall time (CUDA events, median).

  python bench/profile_train.py [--rows headline:16,k5:8] [--strict] [--no-grad-x] [--steps 5]
                               [--backward fused|dense]   (sets CONVPOOL_TORCH_BACKWARD)
"""
import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train_cpu import ROWS as CPU_ROWS  # noqa: E402  (it puts ../python on the path)
import convpool  # noqa: E402
from convpool.model import Model  # noqa: E402

# The CPU training bench's rows (headline, k5, pool3, c32_c64: x's shape without the batch, and
# Model's arguments), two more the GPU routing was measured on, and two of the forward sweep's
# families that the fused backward serves with other kernel instances (kernel 1x3x3 with pool
# 1x2x2; pool 2x2x3).
ROWS = dict(CPU_ROWS,
            c16_c32=((16, 16, 32, 32), [16, 32, 3, 2.0, 2, (32, 1, 1, 1), 1]),
            odd_15x61x61=((8, 15, 61, 61), [8, 16, 3, 2.0, 2, (16, 1, 1, 1), 1]),
            k1x3x3=((8, 16, 64, 64), [8, 16, (1, 3, 3), 2.0, (1, 2, 2), (16, 1, 1, 1), 1]),
            pool2x2x3=((8, 16, 64, 64), [8, 16, 3, 2.0, (2, 2, 3), (16, 1, 1, 1), 1]))


def step_fn(model, x, grad_x):
    def step():
        model.zero_grad(set_to_none=True)
        xi = x.requires_grad_(True) if grad_x else x
        model(xi).sum().backward()
        if grad_x:
            x.grad = None
    return step


def wall_ms(step, reps=10):
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


def kernels(step, steps):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = e.self_cuda_time_total
        if t > 0:
            rows.append((t / steps / 1e3, e.count // steps, e.key))
    return sorted(rows, reverse=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="headline:16,headline:128,k5:8,pool3:16")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--no-grad-x", action="store_true")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--backward", choices=("auto", "fused", "dense"), default="auto",
                    help="which backward a training call takes (default: the binding's routing)")
    args = ap.parse_args()
    if args.backward != "auto":
        os.environ["CONVPOOL_TORCH_BACKWARD"] = args.backward
    torch.backends.cudnn.allow_tf32 = not args.strict
    torch.backends.cuda.matmul.allow_tf32 = not args.strict
    convpool.load()
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"{'strict' if args.strict else 'TF32'}, grad_x {'off' if args.no_grad_x else 'on'}, backward {args.backward}")
    for spec in args.rows.split(","):
        name, batch = spec.split(":")
        shape, init = ROWS[name]
        torch.manual_seed(0)
        ref = Model(*init).cuda()
        new = convpool.ModelNew(*init).cuda()
        new.load_state_dict(ref.state_dict())
        x = torch.rand(int(batch), *shape, device="cuda")
        print(f"\n## {name}, x {'x'.join(map(str, x.shape))}")
        for label, model in (("eager", ref), ("convpool", new)):
            step = step_fn(model, x, not args.no_grad_x)
            for _ in range(3):
                step()
            ms = wall_ms(step)
            print(f"### {label}: step {ms:.3f} ms (median of 10, CUDA events)")
            print("| device ms/step | calls | kernel |\n|---|---|---|")
            for t, n, k in kernels(step, args.steps)[:args.top]:
                print(f"| {t:.3f} | {n} | {k[:110]} |")


if __name__ == "__main__":
    main()
