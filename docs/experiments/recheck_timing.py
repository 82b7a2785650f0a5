"""Time the general kernel's training codes and their FP32 recheck (src/cuda/general.cu) on
the pool 3 (batch 16) and kernel 5 (batch 8) training shapes, as flagged and with every window
rechecked (CONVPOOL_TEST_RECHECK_ALL=1), and check both give the same codes.

    python3 docs/experiments/recheck_timing.py        (on a GPU machine, from the repo root)

The ratio of the two recheck times is about the share of windows flagged as near-ties.
"""
import os, sys, torch
sys.path.insert(0, "python")
import convpool
from convpool import _ops
from torch.profiler import profile, ProfilerActivity
_ops.load()
op = _ops._STATE["train_op"]
torch.manual_seed(0)
for name, (B, k, pool) in dict(pool3=(16, 3, 3), k5=(8, 5, 2)).items():
    conv = torch.nn.Conv3d(8, 16, k).cuda()
    x = torch.rand(B, 8, 16, 64, 64, device="cuda")
    bias = torch.randn(16, device="cuda")
    for allf in ("0", "1"):
        os.environ["CONVPOOL_TEST_RECHECK_ALL"] = allf
        for _ in range(3):
            r = op(x, conv.weight.detach(), conv.bias.detach(), bias, 2.0, [pool] * 3, True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                r = op(x, conv.weight.detach(), conv.bias.detach(), bias, 2.0, [pool] * 3, True)
            torch.cuda.synchronize()
        for e in prof.key_averages():
            if "recheck" in e.key or "general" in e.key:
                print(name, "all=" + allf, "%.3f ms" % (e.self_device_time_total / 10 / 1e3), e.key[:60])
        if allf == "0":
            codes0 = r[2].clone()
        else:
            print(name, "codes differ between normal and all:", (codes0 != r[2]).sum().item(), "of", r[2].numel())
