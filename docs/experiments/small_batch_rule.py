"""Probe: the product rule at small batches, where host time decides. Eager (Model) and ModelNew
are timed interleaved, call by call (so host drift hits both alike): a grad-enabled forward and
a training step (forward, out.sum(), backward for x and every parameter), synced, CUDA events;
medians of --iters pairs, with the host time to enqueue each call.

  PYTHONPATH=python python docs/experiments/small_batch_rule.py [--iters 300] [--strict]
      [--autocast bfloat16|float16] [--batches 2,16]

--autocast runs the float32 cases under torch.autocast("cuda", dtype) (the conv-tail route's
block() path); --batches replaces each case's batch; --cases keeps the cases whose name holds
one of its comma-separated words; --fused adds a third model to each interleaved round, ModelNew
with CONVPOOL_TORCH_BACKWARD=fused (the fused backward forced where the rule would take the
conv-tail route), and its speed-up over eager.
"""
import os
import contextlib
import argparse
import statistics
import time

import torch

import convpool
from convpool.model import Model

def case(name, cin, cout, kernel=3, pool=2, batch=2, spatial=(16, 32, 32), dtype=torch.float32):
    """A float32 case unless named: Model's arguments (divisor 2, a per-channel bias, sum_dim 1)
    and x's shape from the channels, kernel, pool and spatial extents."""
    return (f"{name} b{batch}", (batch, cin) + tuple(spatial), [cin, cout, kernel, 2.0, pool, (cout, 1, 1, 1), 1],
            dtype)


HEADLINE = (16, 64, 64)
CASES = [
    case("headline f32", 8, 16, spatial=HEADLINE),
    case("headline f16", 8, 16, spatial=HEADLINE, dtype=torch.float16),
    case("headline bf16", 8, 16, spatial=HEADLINE, dtype=torch.bfloat16),
    case("c16_c32", 16, 32),
    case("c32_c64", 32, 64),
    case("c64_c128", 64, 128),
    case("cin3_cout64_112", 3, 64, batch=1, spatial=(16, 112, 112)),
    case("k5", 8, 16, kernel=5, spatial=HEADLINE),
    case("pool3", 8, 16, pool=3, spatial=HEADLINE),
]

# Only where --cases names them: the channel widths around the fused backward's limit.
EXTRA_CASES = [
    case("c16_c128", 16, 128),
    case("c8_c128", 8, 128),
    case("c64_c32", 64, 32),
    case("c64_c64", 64, 64),
    case("c32_c128", 32, 128),
    case("c32_c32_k5", 32, 32, kernel=5),
    case("c16_c32_pool3", 16, 32, pool=3),
    case("c16_c32_k1", 16, 32, kernel=1),
    case("c16_c32_k2", 16, 32, kernel=2),
    case("c16_c32_k133", 16, 32, kernel=(1, 3, 3)),
    case("c16_c32_k311", 16, 32, kernel=(3, 1, 1)),
    case("c16_c32_p122", 16, 32, pool=(1, 2, 2)),
    case("c16_c32_p4", 16, 32, pool=4),
    case("c32_c64_p1", 32, 64, pool=1, spatial=(8, 32, 32)),
    case("c8_c256", 8, 256),
]

def timed(fn):
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    t0 = time.perf_counter()
    fn()
    h = (time.perf_counter() - t0) * 1e6
    b.record()
    b.synchronize()
    return a.elapsed_time(b), h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--autocast", choices=("bfloat16", "float16"))
    ap.add_argument("--batches", default="")
    ap.add_argument("--cases", default="")
    ap.add_argument("--fused", action="store_true")
    args = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = not args.strict
    convpool.load()
    mode = ("strict" if args.strict else "TF32") + (f", autocast {args.autocast}" if args.autocast else "")
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, {mode}: eager / ModelNew, "
          f"ms synced (host us to enqueue), medians of {args.iters} interleaved pairs\n")
    if args.fused:
        print("(each cell: eager / ModelNew / ModelNew with CONVPOOL_TORCH_BACKWARD=fused; speed-ups over eager)\n")
        print("| case | forward (grad on) | speed-up | fused | training step | speed-up | fused |")
        print("|---|---|---|---|---|---|---|")
    else:
        print("| case | forward (grad on) | speed-up | training step | speed-up |")
        print("|---|---|---|---|---|")
    named = CASES + (EXTRA_CASES if args.cases else [])
    cases = [(n, (b,) + s[1:], i, d) for n, s, i, d in named for b in
             ([int(v) for v in args.batches.split(",")] if args.batches else [s[0]])]
    if args.autocast:
        cases = [c for c in cases if c[3] is torch.float32]
    if args.cases:
        cases = [c for c in cases if any(w in c[0] for w in args.cases.split(","))]
    for name, shape, init, dt in cases:
        if args.batches:
            name = f"{name.rsplit(' ', 1)[0]} b{shape[0]}"
        torch.manual_seed(0)
        ref = Model(*init).cuda().to(dt)
        new = convpool.ModelNew(*init).cuda().to(dt)
        new.load_state_dict(ref.state_dict())
        x = torch.rand(shape, device="cuda", dtype=dt).requires_grad_(True)
        cells = []
        for kind in ("fwd", "step"):
            def call(m):
                ctx = (lambda: torch.autocast("cuda", dtype=getattr(torch, args.autocast))) if args.autocast \
                    else contextlib.nullcontext

                def fwd():
                    with ctx():
                        return m(x)
                if kind == "fwd":
                    return fwd
                return lambda: fwd().float().sum().backward()
            fe, fn = call(ref), call(new)

            def forced(f=fn):
                os.environ["CONVPOOL_TORCH_BACKWARD"] = "fused"
                try:
                    f()
                finally:
                    del os.environ["CONVPOOL_TORCH_BACKWARD"]
            fns = [fe, fn] + ([forced] if args.fused else [])
            for _ in range(10):
                for f in fns:
                    f()
            ts = [[] for _ in fns]
            for _ in range(args.iters):
                for f, t in zip(fns, ts):
                    t.append(timed(f))
            ms = [statistics.median(t for t, _ in v) for v in ts]
            hs = [statistics.median(h for _, h in v) for v in ts]
            cells.append(" / ".join(f"{m:.3f} ({h:.0f})" for m, h in zip(ms, hs)) + " | " +
                         " | ".join(f"{ms[0] / m:.2f}x" for m in ms[1:]))
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
