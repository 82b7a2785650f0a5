"""Which conv3d problems cuDNN really runs in TF32 when torch allows it.

With torch.backends.cudnn.allow_tf32 = True cuDNN may still pick an FP32 kernel (seen at Cin 3,
twenty-third session). convpool's TF32 training codes are judged against eager's gradients, so
where eager is FP32 in "TF32 mode" its codes are exact and convpool's must be too. This prints,
for each input channel count and kernel, the conv output's relative error against float64 with
TF32 allowed and with it off: a TF32 kernel shows ~1e-4, an FP32 one ~1e-7.

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
    print("| Cin | Cout | kernel | x | err TF32 allowed | err strict | cuDNN ran |")
    print("|---|---|---|---|---|---|---|")
    g = torch.Generator(device="cpu").manual_seed(0)
    for kernel in [(3, 3, 3), (5, 5, 5), (1, 3, 3)]:
        for cout in args.cout:
            for cin in range(lo, hi + 1):
                x = torch.rand(args.batch, cin, 16, 64, 64, generator=g).to(dev)
                w = (torch.rand(cout, cin, *kernel, generator=g) - 0.5).to(dev)
                ref = F.conv3d(x.double(), w.double())
                errs = []
                for allow in (True, False):
                    torch.backends.cudnn.allow_tf32 = allow
                    errs.append(rel_err(F.conv3d(x, w), ref))
                torch.backends.cudnn.allow_tf32 = True
                ran = "TF32" if errs[0] > 20 * max(errs[1], 1e-9) else "FP32"
                print(f"| {cin} | {cout} | {kernel} | {tuple(x.shape)} | {errs[0]:.2e} | {errs[1]:.2e} | {ran} |")


if __name__ == "__main__":
    main()
