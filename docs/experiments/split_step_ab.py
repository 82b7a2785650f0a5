"""A/B of the backward's second stream (CONVPOOL_SPLIT_BACKWARD=0 / 1) on whole training steps,
both sides in one process, alternating, so host and clock drift hit both alike.

  PYTHONPATH=python python3 docs/experiments/split_step_ab.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from profile_train import ROWS, step_fn, stream_ms, wall_ms  # noqa: E402
import convpool  # noqa: E402

print(torch.cuda.get_device_name(0))
print("| row | batch | one stream: back to back / synced ms | two streams: back to back / synced ms |")
print("|---|---|---|---|")
for row, batch in [("headline", 8), ("headline", 16), ("headline", 32), ("headline", 128), ("pool3", 16), ("k5", 16)]:
    shape, init = ROWS[row]
    torch.manual_seed(0)
    model = convpool.ModelNew(*init).cuda()
    x = torch.rand(batch, *shape, device="cuda")
    step = step_fn(model, x, True)
    res = {"0": [], "1": []}
    for _ in range(3):
        for side in ("0", "1"):
            os.environ["CONVPOOL_SPLIT_BACKWARD"] = side
            for _ in range(3):
                step()
            res[side].append((stream_ms(step), wall_ms(step)))
    fmt = lambda v: " ".join(f"{a:.3f}/{b:.3f}" for a, b in v)  # noqa: E731
    print(f"| {row} | {batch} | {fmt(res['0'])} | {fmt(res['1'])} |", flush=True)
