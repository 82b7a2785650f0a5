"""One-off (2026-11-23, H100): cuDNN conv3d NCDHW vs channels-last, and convpool fused vs the
cuDNN route, for the wide-channel rows. Printed numbers are in docs/BENCHMARKS.md (every shape
family, "Where the rest is"). Run: PYTHONPATH=python python3 docs/experiments/conv_layout_wide_channels.py"""
import os, sys, torch, torch.nn.functional as F
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
from bench_gpu import Timer
import convpool
t = Timer(15, 3)
for name, (B, cin, cout, D, H, W) in {"c64_c128": (8, 64, 128, 16, 32, 32), "c32_c64": (16, 32, 64, 16, 32, 32),
                                       "c16_c32": (32, 16, 32, 16, 32, 32)}.items():
    x = torch.rand(B, cin, D, H, W, device="cuda")
    m = convpool.ModelNew(cin, cout, 3, 2.0, 2, (cout, 1, 1, 1), 1).cuda()
    w = m.conv.weight.detach(); cb = m.conv.bias.detach()
    xl = x.contiguous(memory_format=torch.channels_last_3d)
    wl = w.contiguous(memory_format=torch.channels_last_3d)
    for tf32 in (True, False):
        torch.backends.cudnn.allow_tf32 = tf32
        res = {}
        for bm in (False, True):
            torch.backends.cudnn.benchmark = bm
            res[f"ncdhw bm{int(bm)}"] = t(lambda: F.conv3d(x, w, cb))["median_ms"]
            res[f"ndhwc bm{int(bm)}"] = t(lambda: F.conv3d(xl, wl, cb))["median_ms"]
        torch.backends.cudnn.benchmark = False
        res["to_cl"] = t(lambda: x.contiguous(memory_format=torch.channels_last_3d))["median_ms"]
        with torch.no_grad():
            for route in ("fused", "cudnn"):
                os.environ["CONVPOOL_TORCH_PATH"] = route
                res[f"convpool {route}"] = t(lambda: m(x))["median_ms"]
            os.environ.pop("CONVPOOL_TORCH_PATH")
        print(name, "tf32" if tf32 else "strict", " ".join(f"{k}={v:.4f}" for k, v in res.items()), flush=True)
