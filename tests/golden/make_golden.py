#!/usr/bin/env python3
"""Writes the golden files the C tests compare against (format: README.md in this folder).

Each configuration builds the KernelBench L2 #8 Model with nn.Conv3d / nn.MaxPool3d /
nn.AdaptiveAvgPool3d, seeded, and stores its inputs, parameters and outputs computed by
PyTorch on the CPU twice: in float32 and in float64 (model.double() on the float32 inputs
upcast, so both runs see exactly the same values).

    .venv/bin/python tests/golden/make_golden.py            # writes *.bin and manifest.txt here
    .venv/bin/python tests/golden/make_golden.py --check    # regenerates in memory, compares bytes
"""
import argparse
import copy
import math
import os
import struct
import sys

import torch
import torch.nn as nn

MAGIC = b"CPGOLDEN"
VERSION = 1
HERE = os.path.dirname(os.path.abspath(__file__))


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from convpool.model import Model  # noqa: E402  (the reference block, KernelBench L2 #8)


def pooled(model, x):
    """P: the same modules as Model.forward, stopped before + bias; shape (B, C)."""
    y = model.global_avg_pool(model.max_pool(model.conv(x) / model.divisor))
    return y.reshape(y.shape[0], y.shape[1])


def cfg(name, desc, batch, cin, cout, dhw, kernel, pool, divisor, init="rand", seed=0, edit=None,
        f32_front=False):
    return dict(name=name, desc=desc, batch=batch, cin=cin, cout=cout, dhw=dhw, kernel=kernel,
                pool=pool, divisor=divisor, init=init, seed=seed, edit=edit, f32_front=f32_front)


def put_nan(x, w, cb):
    x[0, 0, 1, 2, 3] = float("nan")
    x[0, x.shape[1] - 1, x.shape[2] - 1, x.shape[3] - 1, x.shape[4] - 1] = float("nan")


def put_inf(x, w, cb):
    d, h, wd = x.shape[2:]
    x[0, 0, 1, 1, 1] = float("inf")                  # one +inf: each channel +inf or -inf by weight sign
    x[0, 0, d - 2, h - 2, wd - 2] = float("-inf")
    x[1, 1, d // 2, h // 2, wd // 2] = float("inf")  # +inf and -inf close by: products of both signs -> NaN
    x[1, 0, d // 2, h // 2, wd // 2 + 1] = float("-inf")


def lone_nonfinite(x, w, cb):
    # Kernel 1: each input voxel reaches exactly one conv position, so one NaN sits at a
    # non-first position of its pool window (item 0), or in the floor-mode remainder that the
    # pool drops (item 1: P stays finite); a lone -inf gives -inf or +inf by weight sign, and
    # a window max ignores the -inf while the +inf wins.
    x[0, 1, 1, 1, 1] = float("nan")
    x[1, 0, 6, 6, 6] = float("nan")
    x[1, 1, 3, 2, 3] = float("-inf")


def const_channels(x, w, cb):
    # Channel 0: zero weights and zero conv bias -> conv is exactly 0 -> 0/0 = NaN.
    # Channel 1: zero weights, conv bias -0.5 -> -inf everywhere. Channel 2: +0.25 -> +inf.
    w[0].zero_()
    cb[0] = 0.0
    w[1].zero_()
    cb[1] = -0.5
    w[2].zero_()
    cb[2] = 0.25


def big_values(x, w, cb):
    x.mul_(1000.0)


def conv_overflow(x, w, cb):
    # Item 0: x = 3e38 everywhere and each channel's weights positive, summing to 2, so every
    # conv value is 6e38 + cb: inf in float32 (PyTorch's conv output), while a double pipeline
    # would divide by 4 and get a finite 1.5e38. Item 1 stays ordinary.
    x[0].fill_(3e38)
    w.abs_()
    w.mul_(2.0 / w.flatten(1).sum(1).view(-1, 1, 1, 1, 1))
    cb.mul_(0.01)


def subnormal_divisor_edit(x, w, cb):
    # Divisor 1e-39 (subnormal in float32, so rounding it to float32 moves it by ~1e-6).
    # Channel 0: conv bias 1, tiny weights: every value ~1 / 1e-39 overflows float32, P = +inf.
    # The other channels: conv values ~1e-2, quotients ~1e37, finite with a wide margin.
    w.mul_(0.01)
    cb.mul_(0.01)
    cb[0] = 1.0


CONFIGS = [
    cfg("headline_small", "headline block (8->16, k3, pool 2, divisor 2, torch.rand) at batch 2, 16x32x32",
        2, 8, 16, (16, 32, 32), 3, 2, 2.0, "rand", 1),
    cfg("headline_small_randn", "headline shapes at batch 2, 16x32x32 with torch.randn inputs",
        2, 8, 16, (16, 32, 32), 3, 2, 2.0, "randn", 2),
    cfg("odd_remainder", "odd sizes 11x13x15, k3 -> conv 9x11x13, pool (2,3,4): remainder 1,2,1 in every axis",
        2, 3, 5, (11, 13, 15), 3, (2, 3, 4), 2.0, "randn", 3),
    cfg("kernel1", "kernel 1 (conv is a per-voxel channel mix), 7x9x10, pool 2 with remainders",
        2, 4, 6, (7, 9, 10), 1, 2, 2.0, "rand", 4),
    cfg("kernel5", "kernel 5, 12x13x14 -> conv 8x9x10, pool 2 with remainder in h",
        2, 3, 4, (12, 13, 14), 5, 2, 2.0, "randn", 5),
    cfg("aniso", "anisotropic kernel (1,3,5), pool (1,2,3), 6x11x17 -> conv 6x9x13 -> pooled 6x4x4",
        2, 3, 5, (6, 11, 17), (1, 3, 5), (1, 2, 3), 2.0, "randn", 6),
    cfg("cin1", "a single input channel", 2, 1, 4, (9, 10, 11), 3, 2, 2.0, "rand", 7),
    cfg("cout1", "a single output channel", 2, 5, 1, (9, 10, 11), 3, 2, 2.0, "randn", 8),
    cfg("cout64", "64 output channels, 4 input channels, 8x10x12", 2, 4, 64, (8, 10, 12), 3, 2, 2.0, "randn", 9),
    cfg("batch1", "batch 1, headline channels, 10x20x18", 1, 8, 16, (10, 20, 18), 3, 2, 2.0, "rand", 10),
    cfg("batch5", "batch 5, small spatial 6x7x8", 5, 3, 7, (6, 7, 8), 3, 2, 2.0, "randn", 11),
    cfg("neg_divisor", "negative divisor -1.5: max of x/d is min of x divided by d",
        2, 4, 6, (9, 10, 11), 3, 2, -1.5, "randn", 12),
    cfg("neg_divisor_rand", "negative divisor -2 with torch.rand inputs", 2, 8, 16, (8, 12, 12), 3, 2, -2.0, "rand", 13),
    cfg("divisor_0", "divisor 0: x/0 = +-inf elementwise, then pooled (mixed signs give NaN means)",
        2, 3, 6, (8, 9, 10), 3, 2, 0.0, "randn", 347),
    cfg("divisor_0_rand", "divisor 0 with torch.rand inputs, pool 3 over a 1-wide remainder",
        2, 3, 6, (8, 9, 10), 3, 3, 0.0, "rand", 15),
    cfg("divisor_0_const", "divisor 0 with constant channels: 0/0 = NaN, -0.5/0 = -inf, 0.25/0 = +inf",
        2, 3, 5, (7, 8, 9), 3, 2, 0.0, "randn", 16, const_channels),
    cfg("divisor_0_3", "divisor 0.3 (not a power of two)", 2, 4, 6, (9, 10, 11), 3, 2, 0.3, "randn", 17),
    cfg("divisor_inf", "divisor +inf: every finite conv value becomes +-0", 2, 3, 4, (7, 8, 9), 3, 2,
        math.inf, "randn", 18),
    cfg("divisor_nan", "divisor NaN: everything NaN", 2, 3, 4, (7, 8, 9), 3, 2, math.nan, "randn", 19),
    cfg("nan_input", "NaN in two input voxels of batch item 0 (item 1 stays finite)",
        2, 3, 4, (8, 9, 10), 3, 2, 2.0, "randn", 20, put_nan),
    cfg("inf_input", "+inf and -inf input voxels in items 0 and 1 (item 2 finite)",
        3, 3, 4, (8, 9, 10), 3, 2, 2.0, "randn", 21, put_inf),
    cfg("inf_input_neg_divisor", "+-inf inputs with a negative divisor", 3, 3, 4, (8, 9, 10), 3, 2, -0.5,
        "randn", 22, put_inf),
    cfg("lone_nonfinite_kernel1", "kernel 1, pool 2, 7^3: a NaN inside a window (not its first element), "
        "a NaN in the dropped remainder, a lone -inf", 2, 2, 3, (7, 7, 7), 1, 2, 2.0, "randn", 27, lone_nonfinite),
    cfg("pool3", "pool 3 in every axis with remainders (conv 10x11x13)", 2, 3, 5, (12, 13, 15), 3, 3, 2.0,
        "randn", 23),
    cfg("pool4_kernel2", "kernel 2, pool 4: conv 9x10x11 -> pooled 2x2x2", 2, 3, 5, (10, 11, 12), 2, 4, 2.0,
        "rand", 24),
    cfg("global_pool", "pool equal to the conv extent: one pooled position, a global max",
        2, 3, 4, (6, 7, 8), 3, (4, 5, 6), 2.0, "randn", 25),
    cfg("big_values", "inputs scaled by 1000, divisor 1e-3", 2, 3, 4, (7, 8, 9), 3, 2, 1e-3, "randn", 26,
        big_values),
    cfg("conv_overflow", "float32 conv output overflows to inf (x = 3e38, weights summing to 2), divisor 4; "
        "float64 results model PyTorch's float32 conv and division", 2, 2, 3, (6, 7, 8), 3, 2, 4.0, "rand", 28,
        conv_overflow, f32_front=True),
    cfg("subnormal_divisor", "divisor 1e-39 (subnormal in float32): one channel overflows to inf, the others "
        "~1e37; float64 results model PyTorch's float32 conv and division", 2, 3, 4, (7, 8, 9), 3, 2, 1e-39,
        "rand", 29, subnormal_divisor_edit, f32_front=True),
    cfg("subnormal_results", "divisor 3e38: conv values / d are subnormal float32 (spacing 2^-149); float64 "
        "results model PyTorch's float32 conv and division", 2, 3, 4, (7, 8, 9), 3, 2, 3e38, "randn", 30,
        f32_front=True),
    # torch.rand inputs: with pool 1, P is the mean of every conv value, and with torch.randn they
    # cancel to |P| ~ 1e-3 of the values, below what test_golden's reference-vs-float64 bound
    # allows for the reference's per-element float rounding (its rtol is relative to |P|).
    cfg("pool1", "pool 1 (every conv value is its own window: a dense gradient), kernel (2,3,4), 6x8x9, "
        "divisor -1.25", 2, 3, 5, (6, 8, 9), (2, 3, 4), 1, -1.25, "rand", 31),
]


def pooled_f32_front(m64, x64):
    """P in float64 but with the two float32 roundings of Model's front end: the conv output
    (float64 conv, rounded to float32: inf beyond FLT_MAX) and the division (the float32 tensor
    divided by the divisor rounded to float32, one rounding, as PyTorch's CPU kernel divides).
    Pooling and the mean run in float64. This is what the C reference computes."""
    y = m64.conv(x64).float().double()
    d = float(torch.tensor(float(m64.divisor), dtype=torch.float32))
    y = (y / d).float().double()
    p = m64.global_avg_pool(m64.max_pool(y))
    return p.reshape(p.shape[0], p.shape[1])


def make_inputs(c):
    torch.manual_seed(1000 + c["seed"])
    k = c["kernel"]
    model = Model(c["cin"], c["cout"], k, c["divisor"], c["pool"], (c["cout"], 1, 1, 1), 1).float()
    shape = (c["batch"], c["cin"]) + tuple(c["dhw"])
    x = torch.rand(shape) if c["init"] == "rand" else torch.randn(shape)
    with torch.no_grad():
        if c["edit"] is not None:
            c["edit"](x, model.conv.weight, model.conv.bias)
    return model, x


def triple(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v, v)


def compute(c):
    model, x = make_inputs(c)
    with torch.no_grad():
        out32 = model(x).reshape(-1)
        p32 = pooled(model, x)
        m64 = Model(c["cin"], c["cout"], c["kernel"], c["divisor"], c["pool"], (c["cout"], 1, 1, 1), 1)
        m64.load_state_dict(model.state_dict())
        m64 = m64.double()
        x64 = x.double()
        if c["f32_front"]:
            p64 = pooled_f32_front(m64, x64)
            out64 = (p64 + m64.bias.reshape(1, -1)).sum(1)
        else:
            out64 = m64(x64).reshape(-1)
            p64 = pooled(m64, x64)
    # The float32 and float64 runs must agree on which results are NaN / +inf / -inf;
    # otherwise the configuration is too close to a rounding-dependent sign and is no test.
    for a, b, what in ((out32, out64, "out"), (p32, p64, "P")):
        a64 = a.double()
        same = (torch.isnan(a64) == torch.isnan(b)) & (torch.isposinf(a64) == torch.isposinf(b)) & \
               (torch.isneginf(a64) == torch.isneginf(b))
        if not bool(same.all()):
            raise SystemExit(f"{c['name']}: float32 and float64 disagree on NaN/Inf in {what}")
    return model, x, out32, p32, out64, p64


def sign_margin(model, x):
    """Under divisor 0 each P is +inf, -inf or NaN by the signs of its window maxima. Returns
    the smallest distance, relative to S = max|x| * sum|w[c]| + |conv_bias[c]|, by which a
    window maximum would have to move to change some P's class."""
    with torch.no_grad():
        m = model.double()
        mx = m.max_pool(m.conv(x.double())).flatten(2)
        s = x.double().abs().flatten(1).max(1).values[:, None] * m.conv.weight.abs().flatten(1).sum(1)[None, :] \
            + m.conv.bias.abs()[None, :]
    worst = math.inf
    for b in range(mx.shape[0]):
        for c in range(mx.shape[1]):
            if s[b, c] == 0:
                continue  # conv exactly 0 everywhere: 0/0, no rounding involved
            v = mx[b, c] / s[b, c]
            pos, neg = v[v > 0], -v[v < 0]
            if len(neg) == 0:
                worst = min(worst, float(pos.min()))   # all +inf: the smallest positive max
            elif len(pos) == 0:
                worst = min(worst, float(neg.min()))   # all -inf
            else:
                worst = min(worst, float(min(pos.max(), neg.max())))  # NaN: one sign must vanish
    return worst


# A TF32 GPU may move a conv value by up to ~5 * 2^-11 * S (worst case); keep each divisor-0
# class at least twice that away from flipping.
DIV0_MARGIN = 0.005


def serialize(c):
    model, x, out32, p32, out64, p64 = compute(c)
    if c["divisor"] == 0.0:
        margin = sign_margin(copy.deepcopy(model), x)
        if margin < DIV0_MARGIN:
            raise SystemExit(f"{c['name']}: a divisor-0 class hinges on a conv value {margin:.3g} S from 0")
    kd, kh, kw = triple(c["kernel"])
    pd, ph, pw = triple(c["pool"])
    d, h, w = c["dhw"]
    sizes = (c["batch"], c["cin"], c["cout"], d, h, w, kd, kh, kw, pd, ph, pw)
    blob = bytearray()
    blob += MAGIC
    blob += struct.pack("<q", VERSION)
    blob += struct.pack("<12q", *sizes)
    blob += struct.pack("<d", float(c["divisor"]))

    def f32(t):
        return t.detach().contiguous().to(torch.float32).numpy().astype("<f4").tobytes()

    def f64(t):
        return t.detach().contiguous().to(torch.float64).numpy().astype("<f8").tobytes()

    blob += f32(x)
    blob += f32(model.conv.weight)
    blob += f32(model.conv.bias)
    blob += f32(model.bias.reshape(-1))
    blob += f32(out32)
    blob += f32(p32)
    blob += f64(out64)
    blob += f64(p64)
    return bytes(blob), (out32, p32, out64, p64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=HERE, help="folder for the .bin files and manifest.txt")
    ap.add_argument("--check", action="store_true", help="compare with the files on disk instead of writing")
    args = ap.parse_args()
    torch.set_num_threads(1)  # fixed reduction order, so regenerating gives the same bytes
    manifest = []
    bad = 0
    total = 0
    for c in CONFIGS:
        blob, (out32, p32, out64, p64) = serialize(c)
        fname = c["name"] + ".bin"
        path = os.path.join(args.out, fname)
        total += len(blob)
        manifest.append(f"{fname} {c['desc']}")
        if args.check:
            with open(path, "rb") as f:
                if f.read() != blob:
                    print(f"DIFFERS: {fname}")
                    bad += 1
        else:
            with open(path, "wb") as f:
                f.write(blob)
        fin = torch.isfinite(p64)
        err = (p32.double() - p64)[fin].abs().max().item() if bool(fin.any()) else 0.0
        print(f"{fname:28s} {len(blob):9d} B  out64[0]={out64[0].item():+.6g}  "
              f"nonfinite P {int((~fin).sum())}/{p64.numel()}  max|P32-P64| {err:.3g}")
    text = "# golden file, then a one-line description. Written by make_golden.py.\n" + \
           "\n".join(manifest) + "\n"
    mpath = os.path.join(args.out, "manifest.txt")
    if args.check:
        with open(mpath) as f:
            if f.read() != text:
                print("DIFFERS: manifest.txt")
                bad += 1
    else:
        with open(mpath, "w") as f:
            f.write(text)
    print(f"{len(CONFIGS)} configurations, {total} bytes" + (f", {bad} differ" if args.check else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
