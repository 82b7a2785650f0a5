"""One-off (2026-11-23, H100): run one general-kernel row for ncu, e.g.
ncu --clock-control none --kernel-name regex:general_kernel --launch-skip 2 --launch-count 1
--section WarpStateStats --section SchedulerStats python3 docs/experiments/ncu_general_rows.py pool3"""
import os, sys, torch
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import convpool
shape = sys.argv[1]
cfg = {"k5": (8, 5, 2), "k1x7x7": (2, (1, 7, 7), 2), "pool3": (8, 3, 3)}[shape]
B, k, pool = cfg
m = convpool.ModelNew(8, 16, k, 2.0, pool, (16, 1, 1, 1), 1).cuda()
x = torch.rand(B, 8, 16, 64, 64, device="cuda")
with torch.no_grad():
    for _ in range(3):
        m(x)
torch.cuda.synchronize()
