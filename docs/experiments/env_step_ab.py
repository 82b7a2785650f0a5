"""A/B of an environment switch of the binding on whole training steps (headline b128 by
default), both sides in one process, alternating, so host and clock drift hit both alike; as
split_step_ab.py, for any switch read at call time (CONVPOOL_SIDE_STREAM, CONVPOOL_SPLIT_BACKWARD,
CONVPOOL_PDL...).

  PYTHONPATH=python python3 docs/experiments/env_step_ab.py CONVPOOL_SIDE_STREAM 0 1 [--no-grad-x]
      [--rows headline:128,headline:16] [--rounds 3]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from profile_train import ROWS, step_fn, stream_ms  # noqa: E402
import convpool  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("env")
ap.add_argument("values", nargs="+")
ap.add_argument("--no-grad-x", action="store_true")
ap.add_argument("--rows", default="headline:128")
ap.add_argument("--rounds", type=int, default=3)
a = ap.parse_args()

print(torch.cuda.get_device_name(0), f"grad_x {'off' if a.no_grad_x else 'on'}")
print(f"| row | batch | " + " | ".join(f"{a.env}={v}: back to back ms (host ms)" for v in a.values) + " |")
print("|---|---|" + "---|" * len(a.values))
for item in a.rows.split(","):
    row, batch = item.split(":")
    shape, init = ROWS[row]
    torch.manual_seed(0)
    model = convpool.ModelNew(*init).cuda()
    x = torch.rand(int(batch), *shape, device="cuda")
    step = step_fn(model, x, not a.no_grad_x)
    res = {v: [] for v in a.values}
    for _ in range(a.rounds):
        for v in a.values:
            os.environ[a.env] = v
            for _ in range(3):
                step()
            res[v].append(stream_ms(step))
    fmt = lambda r: " ".join(f"{d:.3f} ({h:.3f})" for d, h in r)  # noqa: E731
    print(f"| {row} | {batch} | " + " | ".join(fmt(res[v]) for v in a.values) + " |", flush=True)
