"""Where a GPU training step's time goes, kernel by kernel (issue "Training").

A step is forward, loss = out.sum(), backward for x and every parameter, TF32 by default. For each
row, PyTorch eager and convpool.ModelNew each run a few warm steps, then --steps steps under
torch.profiler; the table lists every CUDA kernel's (and memcpy/memset's) device time per step,
largest first, and the step's wall time two ways: one step at a time with a sync after each
(CUDA events, median: the host's time to the first kernel shows), and 20 steps queued back to
back behind a lead-in step as a training loop runs them (the host works ahead of the device;
stream_ms says why the lead-in).

  python bench/profile_train.py [--rows headline:16,k5:8] [--strict] [--no-grad-x] [--steps 5]
                               [--backward fused|dense]   (sets CONVPOOL_TORCH_BACKWARD)
                               [--dtype float32|float16|bfloat16]
                               [--gap-probe] [--timeline [STEPS]]

--gap-probe: how long the device idles waiting for the host within a convpool step, measured
without a profiler (a spin kernel of known length queued at the step's start or after its
forward; the part of it the step absorbs was idle time). --timeline: one convpool step's
kernels with their start times and the gaps before them (torch.profiler); --timeline 8: eight
steps queued back to back, whose later steps show which stream ends a step in a training loop.
"""
import argparse
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train_cpu import ROWS as CPU_ROWS  # noqa: E402  (it puts ../python on the path)
from revision import revision  # noqa: E402
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


def step_fn(model, x, grad_x, spin_at=None, cycles=0):
    """One training step; spin_at ("start" or "after forward") queues a spin kernel of `cycles`
    there (gap_probe)."""
    def spin(where):
        if spin_at == where and cycles:
            torch.cuda._sleep(cycles)

    def step():
        model.zero_grad(set_to_none=True)
        spin("start")
        xi = x.requires_grad_(True) if grad_x else x
        out = model(xi)
        spin("after forward")
        out.sum().backward()
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


def stream_ms(step, n=20, reps=3, cold=None):
    """A step's time as a training loop sees it: n steps queued back to back (no sync between
    them, so the host prepares step i + 1 while the device runs step i) behind a lead-in step,
    CUDA events around the n, the best of reps such runs divided by n; and the host's time a step
    in the same runs (the loop's wall time until its last step is queued, the best of reps,
    divided by n). Where the host's figure is near the device's, the loop is host-bound and a
    faster kernel does not shorten the step.

    The lead-in step takes the time from an idle device to the loop's first kernel (the host's
    Python and dispatch ahead of the first launch, ~0.1 ms), which a training loop pays once, not
    every step; counted over 20 steps, as this function did until the thirty-seventh session, it
    added ~0.005 ms to each step at the headline. cold: a list that receives that older figure
    (the n + 1 steps from the idle device, the best of reps, divided by n + 1) for comparison."""
    best, host, best_cold = float("inf"), float("inf"), float("inf")
    for _ in range(reps):
        a0, a, b = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        torch.cuda.synchronize()
        a0.record()
        t0 = time.perf_counter()
        step()
        a.record()
        for _ in range(n):
            step()
        host = min(host, (time.perf_counter() - t0) * 1e3 / (n + 1))
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) / n)
        best_cold = min(best_cold, a0.elapsed_time(b) / (n + 1))
    if cold is not None:
        cold.append(best_cold)
    return best, host


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


def gap_probe(model, x, grad_x):
    """Where the step waits on the host, without a profiler's own cost: the step's wall time
    with a spin kernel of known length (torch.cuda._sleep) queued at its start or right after
    the forward. Where the host is behind the device, the spin fills idle time and the step
    grows by less than the spin's own length; 'hidden' is that difference."""
    cycles = 400_000  # ~0.2 ms at the H200's ~1.98 GHz
    spin = wall_ms(lambda: torch.cuda._sleep(cycles))
    base = wall_ms(step_fn(model, x, grad_x))
    print("| spin at | spin ms | step ms | step + spin ms | hidden ms |\n|---|---|---|---|---|")
    for where in ("start", "after forward"):
        t = wall_ms(step_fn(model, x, grad_x, where, cycles))
        print(f"| {where} | {spin:.3f} | {base:.3f} | {t:.3f} | {spin - (t - base):.3f} |")


def timeline(step, steps=1):
    """The device timeline of `steps` steps queued back to back (one: a single step from a
    synced start): each kernel (and memset/memcpy) as start and end in us from the first host
    op, with the gap since the latest end before it (negative: it overlaps a kernel of another
    stream), then each step's host span, from torch.profiler's trace. With one step the gaps
    are where the step waits on the host; with several, the later steps show the steady state
    of a training loop, where the host runs ahead and the gaps are the device's own (launch
    latency between dependent kernels, which stream ends the step). The profiler slows the
    host: on the H200 hosts a headline b128 step's host span under it measured ~0.65-1.1 ms on
    one machine (device-bound from the second step) and ~1.3-1.5 ms on another (host-bound,
    gaps of 0.1-0.6 ms before the step's small kernels); compare the host spans printed at
    the end with the device's step before reading the gaps as the device's."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            with record_function(f"step {i}"):
                step()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.time_range.end > e.time_range.start]
    t0 = min(e.time_range.start for e in evs)
    cuda = torch.autograd.DeviceType.CUDA
    dev = sorted((e for e in evs if e.device_type == cuda and not e.name.startswith("step ")),
                 key=lambda e: e.time_range.start)
    print("| start us | end us | gap before us | kernel |\n|---|---|---|---|")
    last = 0.0
    for e in dev:
        a, b = e.time_range.start - t0, e.time_range.end - t0
        print(f"| {a:.1f} | {b:.1f} | {a - last:.1f} | {e.name[:80]} |")
        last = max(last, b)
    if steps > 1:
        print("\n| host span | start us | end us |\n|---|---|---|")
        for e in sorted((e for e in evs if e.device_type != cuda and e.name.startswith("step ")),
                        key=lambda e: e.time_range.start):
            print(f"| {e.name} | {e.time_range.start - t0:.1f} | {e.time_range.end - t0:.1f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="headline:16,headline:128,k5:8,pool3:16")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--no-grad-x", action="store_true")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--gap-probe", action="store_true",
                    help="also measure the host-bound idle time of a convpool step (spin kernels)")
    ap.add_argument("--timeline", type=int, nargs="?", const=1, default=0, metavar="STEPS",
                    help="also print the device timeline (kernel starts, gaps) of one convpool step, "
                         "or of STEPS steps back to back (the steady state of a training loop)")
    ap.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                    help="x's and both models' dtype (default float32)")
    ap.add_argument("--backward", choices=("auto", "fused", "dense"), default="auto",
                    help="which backward a training call takes (default: the binding's routing)")
    args = ap.parse_args()
    if args.backward != "auto":
        os.environ["CONVPOOL_TORCH_BACKWARD"] = args.backward
    torch.backends.cudnn.allow_tf32 = not args.strict
    torch.backends.cuda.matmul.allow_tf32 = not args.strict
    convpool.load()
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, rev {revision()}, "
          f"{'strict' if args.strict else 'TF32'}, {args.dtype}, grad_x {'off' if args.no_grad_x else 'on'}, backward {args.backward}")
    for spec in args.rows.split(","):
        name, batch = spec.split(":")
        shape, init = ROWS[name]
        torch.manual_seed(0)
        dtype = getattr(torch, args.dtype)
        ref = Model(*init).cuda().to(dtype)
        new = convpool.ModelNew(*init).cuda().to(dtype)
        new.load_state_dict(ref.state_dict())
        x = torch.rand(int(batch), *shape, device="cuda", dtype=dtype)
        print(f"\n## {name}, x {'x'.join(map(str, x.shape))}")
        for label, model in (("eager", ref), ("convpool", new)):
            step = step_fn(model, x, not args.no_grad_x)
            for _ in range(3):
                step()
            cold = []
            ms, (loop, host) = wall_ms(step), stream_ms(step, cold=cold)
            print(f"### {label}: step {ms:.3f} ms (median of 10, CUDA events, a sync after each); "
                  f"{loop:.3f} ms a step back to back (20 steps behind a lead-in step, no sync between, "
                  f"best of 3; {cold[0]:.3f} with the lead-in's start from an idle device counted; "
                  f"the host {host:.3f} ms a step to queue them)")
            print("| device ms/step | calls | kernel |\n|---|---|---|")
            for t, n, k in kernels(step, args.steps)[:args.top]:
                print(f"| {t:.3f} | {n} | {k[:110]} |")
            if args.gap_probe and label == "convpool":
                print(f"\n#### idle time a convpool step leaves the device, {name} batch {batch}")
                gap_probe(model, x, not args.no_grad_x)
            if args.timeline and label == "convpool":
                what = "one convpool step" if args.timeline == 1 else f"{args.timeline} convpool steps back to back"
                print(f"\n#### {what}: timeline, {name} batch {batch}")
                timeline(step, args.timeline)


if __name__ == "__main__":
    main()
