"""Probe: where the host's time goes in ModelNew's training step (issue "Training", the step
without grad_x at the headline, which some device machines' hosts could not queue in 0.6 ms).

At a small batch the device finishes first, so the host's own cost shows without waiting on a
full launch queue. For each mode (x without grad, x with grad):
  1. each piece of the step timed on the host with a sync before it (median of --steps, us):
     zero_grad, ModelNew's forward, out.sum(), backward() (which returns once the autograd
     engine has queued every kernel);
  2. torch.profiler (CPU activity only) over 20 steps: the ops and CUDA runtime calls by self
     CPU time a step, and how many kernel launches a step makes.

  PYTHONPATH=python python docs/experiments/host_step_profile.py [--batch 2] [--steps 200]
"""
import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

import convpool
from convpool.model import Model

INIT = [8, 16, 3, 2.0, 2, (16, 1, 1, 1), 1]


def pieces(model, x, steps):
    times = {"zero_grad": [], "forward": [], "out.sum()": [], "backward()": []}
    for i in range(steps + 10):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        out = model(x)
        t2 = time.perf_counter()
        loss = out.sum()
        t3 = time.perf_counter()
        loss.backward()
        t4 = time.perf_counter()
        if i >= 10:
            for k, a, b in (("zero_grad", t0, t1), ("forward", t1, t2), ("out.sum()", t2, t3),
                            ("backward()", t3, t4)):
                times[k].append((b - a) * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def cpu_profile(model, x, steps=20):
    def step():
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    launches = sum(e.count for e in prof.key_averages()
                   if e.key in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchKernelEx",
                                "cudaMemsetAsync", "cudaMemcpyAsync"))
    print(f"\nlaunches and async memsets/copies a step: {launches / steps:.1f}")
    print("| self CPU us a step | calls a step | op |\n|---|---|---|")
    for e in rows[:28]:
        print(f"| {e.self_cpu_time_total / steps:.1f} | {e.count / steps:.1f} | {e.key[:90]} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    convpool.load()
    torch.manual_seed(0)
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, headline x at batch {args.batch}, "
          f"TF32, float32")
    for grad_x in (False, True):
        for name, cls in (("eager", Model), ("ModelNew", convpool.ModelNew)):
            torch.manual_seed(0)
            model = cls(*INIT).cuda()
            x = torch.rand(args.batch, 8, 16, 64, 64, device="cuda").requires_grad_(grad_x)
            p = pieces(model, x, args.steps)
            print(f"\n## {name}, x {'with' if grad_x else 'without'} grad: host us, synced pieces "
                  f"(median of {args.steps}): " + ", ".join(f"{k} {v:.0f}" for k, v in p.items())
                  + f"; sum {sum(p.values()):.0f}")
            if name == "ModelNew":
                cpu_profile(model, x)


if __name__ == "__main__":
    main()
