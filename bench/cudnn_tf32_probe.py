"""Which conv3d problems cuDNN really runs in TF32 when torch allows it.

With torch.backends.cudnn.allow_tf32 = True cuDNN may still pick an FP32 kernel (seen at Cin 3,
twenty-third session). Where it does, Model's output and arg-max picks are FP32's, so convpool's
PyTorch module runs strict there too (binding.cpp's cuda_precision, CP_CUDNN_FP32_MAX_CIN = 3
from this probe on cuDNN 9.19; rerun it after a cuDNN upgrade, and see
test_cuda.py's test_cudnn_fp32_boundary_holds). This prints,
for each input channel count and kernel, the relative error against float64 of the conv output
and of its two gradients (dgrad: x's, wgrad: the weights'), with TF32 allowed and with it off:
a TF32 kernel shows ~1e-4, an FP32 one ~1e-7.

    python3 bench/cudnn_tf32_probe.py [--cin 1-16] [--batch 4]
"""
import argparse

import torch
import torch.nn.functional as F


def rel_err(got, ref):
    return ((got.double() - ref).norm() / ref.norm()).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cin", default="1-16", help="range of input channels, lo-hi")
    ap.add_argument("--cout", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()
    lo, hi = (int(v) for v in args.cin.split("-"))
    dev = torch.device("cuda")
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    print("| Cin | Cout | kernel | x | fprop TF32 allowed / strict | dgrad | wgrad | cuDNN ran (fprop, dgrad, wgrad) |")
    print("|---|---|---|---|---|---|---|---|")
    g = torch.Generator(device="cpu").manual_seed(0)
    for kernel in [(3, 3, 3), (5, 5, 5), (1, 3, 3)]:
        for cout in args.cout:
            for cin in range(lo, hi + 1):
                x = torch.rand(args.batch, cin, 16, 64, 64, generator=g).to(dev)
                w = (torch.rand(cout, cin, *kernel, generator=g) - 0.5).to(dev)
                ref = passes(x.double(), w.double())
                errs = []  # [allow][pass]
                for allow in (True, False):
                    torch.backends.cudnn.allow_tf32 = allow
                    errs.append([rel_err(got, want) for got, want in zip(passes(x, w), ref)])
                torch.backends.cudnn.allow_tf32 = True
                cells = [f"{errs[0][i]:.1e} / {errs[1][i]:.1e}" for i in range(3)]
                ran = ", ".join("TF32" if errs[0][i] > 20 * max(errs[1][i], 1e-9) else "FP32" for i in range(3))
                print(f"| {cin} | {cout} | {kernel} | {tuple(x.shape)} | {' | '.join(cells)} | {ran} |")


def passes(x, w):
    """The conv output and the gradients of sum(y r) for a fixed r: (y, dgrad, wgrad)."""
    x = x.detach().requires_grad_(True)
    w = w.detach().requires_grad_(True)
    y = F.conv3d(x, w)
    r = torch.linspace(-1.0, 1.5, y.numel(), device=y.device, dtype=y.dtype).view(y.shape)
    gx, gw = torch.autograd.grad((y * r).sum(), (x, w))
    return y.detach(), gx, gw

if __name__ == "__main__":
    main()
