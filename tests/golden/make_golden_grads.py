#!/usr/bin/env python3
"""Writes the golden gradients the backward tests compare against (tests/golden/grad/).

Each configuration reuses a forward configuration of make_golden.py (same seeded inputs and
parameters), draws an incoming gradient g for out (B,), and stores PyTorch's autograd gradients
of out with respect to x, conv.weight, conv.bias and bias for out.backward(g), computed on the
CPU in float64 (model.double() on x upcast) and in float32.

    .venv/bin/python tests/golden/make_golden_grads.py            # writes grad/*.bin + manifest
    .venv/bin/python tests/golden/make_golden_grads.py --check    # regenerates, compares bytes

File format (little-endian, no padding): magic CPGRADS1 (8 bytes), int64 version 1, int64[12]
sizes as in the forward files, float64 divisor, then float32 x, weight, conv bias, bias, g (B),
then float64 grad_x, grad_weight, grad_conv_bias, grad_bias, then the same four in float32.
"""
import argparse
import os
import struct
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_golden as fwd  # noqa: E402  (the forward configurations and their inputs)

MAGIC = b"CPGRADS1"
OUT_DIR = os.path.join(HERE, "grad")
# Forward configurations whose gradients are stored: odd sizes and pool remainders, kernel 1 and
# 5, an anisotropic kernel and pool, negative divisors, divisor 0, NaN and +-inf in x, constant
# channels (ties in every window: the first element takes the gradient), pool 1 (a dense
# gradient: the CPU backward's separable path).
NAMES = ["odd_remainder", "kernel1", "kernel5", "aniso", "cout1", "batch5", "neg_divisor", "divisor_0",
         "divisor_0_3", "nan_input", "inf_input", "divisor_0_const", "pool3", "lone_nonfinite_kernel1", "pool1"]


def grads(model, x, g):
    x = x.clone().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    out = model(x).reshape(-1)
    out.backward(g)
    return [x.grad, model.conv.weight.grad, model.conv.bias.grad, model.bias.grad.reshape(-1)]


def serialize(c):
    model, x = fwd.make_inputs(c)
    torch.manual_seed(5000 + c["seed"])
    g = torch.randn(c["batch"])
    g32 = grads(model, x, g)
    m64 = fwd.Model(c["cin"], c["cout"], c["kernel"], c["divisor"], c["pool"], (c["cout"], 1, 1, 1), 1)
    m64.load_state_dict(model.state_dict())
    m64 = m64.double()
    g64 = grads(m64, x.double(), g.double())
    kd, kh, kw = fwd.triple(c["kernel"])
    pd, ph, pw = fwd.triple(c["pool"])
    d, h, w = c["dhw"]
    blob = bytearray(MAGIC + struct.pack("<q", 1))
    blob += struct.pack("<12q", c["batch"], c["cin"], c["cout"], d, h, w, kd, kh, kw, pd, ph, pw)
    blob += struct.pack("<d", float(c["divisor"]))
    f32 = lambda t: t.detach().contiguous().to(torch.float32).numpy().astype("<f4").tobytes()  # noqa: E731
    f64 = lambda t: t.detach().contiguous().to(torch.float64).numpy().astype("<f8").tobytes()  # noqa: E731
    for t in (x, model.conv.weight, model.conv.bias, model.bias.reshape(-1), g):
        blob += f32(t)
    for t in g64:
        blob += f64(t)
    for t in g32:
        blob += f32(t)
    return bytes(blob), g64


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(OUT_DIR, exist_ok=True)
    by_name = {c["name"]: c for c in fwd.CONFIGS}
    manifest, bad = [], 0
    for name in NAMES:
        c = by_name[name]
        blob, g64 = serialize(c)
        path = os.path.join(OUT_DIR, name + ".bin")
        manifest.append(f"{name}.bin {c['desc']}")
        if args.check:
            with open(path, "rb") as f:
                if f.read() != blob:
                    print(f"DIFFERS: {name}.bin")
                    bad += 1
        else:
            with open(path, "wb") as f:
                f.write(blob)
        nonfinite = sum(int((~torch.isfinite(t)).sum()) for t in g64)
        print(f"{name + '.bin':28s} {len(blob):8d} B  nonfinite gradient entries {nonfinite}")
    text = "# golden gradient file, then a one-line description. Written by make_golden_grads.py.\n" + \
           "\n".join(manifest) + "\n"
    mpath = os.path.join(OUT_DIR, "manifest.txt")
    if args.check:
        with open(mpath) as f:
            bad += f.read() != text
    else:
        with open(mpath, "w") as f:
            f.write(text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
