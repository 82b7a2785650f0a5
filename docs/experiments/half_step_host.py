"""Probe: a 16-bit model's training step at small batches, where the host path decides it.
Eager (Model) against ModelNew (block_train's C++ kernel, which upcasts inside) and against
block() (the same float32 ops between Python autograd casts), TF32 and strict. Per step: the
synced time (CUDA events around forward + backward, a sync after each; median of --steps) and
the host time to enqueue the step (perf_counter around the same calls, before the sync).

  PYTHONPATH=python python docs/experiments/half_step_host.py [--batches 2,8] [--steps 200]
"""
import argparse
import statistics
import time

import torch

import convpool
from convpool.model import Model

INIT = [8, 16, 3, 2.0, 2, (16, 1, 1, 1), 1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="2,8")
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    convpool.load()
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}: 16-bit headline training step "
          f"(median of {args.steps}; ms synced / host us to enqueue)\n")
    print("| dtype | batch | mode | eager | ModelNew | block() | ModelNew speed-up |")
    print("|---|---|---|---|---|---|---|")
    for dt in (torch.float16, torch.bfloat16):
        for batch in (int(b) for b in args.batches.split(",")):
            for tf32 in (True, False):
                torch.backends.cudnn.allow_tf32 = tf32
                torch.manual_seed(0)
                ref = Model(*INIT).cuda().to(dt)
                new = convpool.ModelNew(*INIT).cuda().to(dt)
                new.load_state_dict(ref.state_dict())
                x = torch.rand(batch, 8, 16, 64, 64, device="cuda", dtype=dt).requires_grad_(True)

                def block_call(inp, m=new):
                    return convpool.block(inp, m.conv.weight, m.conv.bias, m.bias, m.divisor, m.pool_size, m.sum_dim)

                res = []
                for fn in (ref, new, block_call):
                    def step():
                        fn(x).sum().backward()
                    for _ in range(10):
                        step()
                    ts, hs = [], []
                    for _ in range(args.steps):
                        torch.cuda.synchronize()
                        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        a.record()
                        t0 = time.perf_counter()
                        step()
                        hs.append((time.perf_counter() - t0) * 1e6)
                        b.record()
                        b.synchronize()
                        ts.append(a.elapsed_time(b))
                    res.append((statistics.median(ts), statistics.median(hs)))
                cells = " | ".join(f"{t:.3f} / {h:.0f}" for t, h in res)
                print(f"| {str(dt)[6:]} | {batch} | {'TF32' if tf32 else 'strict'} | {cells} | "
                      f"{res[0][0] / res[1][0]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
