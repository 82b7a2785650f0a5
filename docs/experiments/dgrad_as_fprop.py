"""Probe: is cuDNN's data gradient of a conv3d slower than the same sum run as a forward conv?

For stride 1, no padding and no dilation, the gradient of conv3d's input is the "full"
correlation of grad_y with the weights flipped in every spatial axis and with in/out channels
swapped:
    grad_x = conv3d(grad_y, w.flip(2, 3, 4).transpose(0, 1), padding=k - 1)
The conv-tail training route (Cin x Cout past 128, bfloat16) spends most of its step in
cuDNN's dgrad (c16_c32 b32: 0.897 ms of a 1.9 ms step at ~16 TFLOP/s, where cuDNN's fprop of the
same FLOPs runs at ~72). This script times, per row, precision and cudnn.benchmark setting:
  dgrad      aten.convolution_backward, input gradient only (what Model's backward runs)
  fprop      conv3d of grad_y with the flipped, transposed weights (NCDHW)
  fprop_cl   the same in channels_last_3d (grad_y converted inside the timing)
  bwd_all    convolution_backward for input, weight and bias together
  fprop+wb   fprop, then convolution_backward for weight and bias only
and each variant's grad_x error against float64 (max |g - ref| / max |ref|, on the first two
samples), so the choice keeps grad_x within twice eager's own error.

  python docs/experiments/dgrad_as_fprop.py [--iters 20] [--out file.md] [--sweep | --wgrad]
"""
import argparse
import statistics
import sys

import torch
import torch.nn.functional as F

ROWS = [  # name, x shape, Cout, kernel, dtype
    ("c16_c32", (32, 16, 16, 32, 32), 32, 3, torch.float32),
    ("c32_c64", (16, 32, 16, 32, 32), 64, 3, torch.float32),
    ("c64_c128", (8, 64, 16, 32, 32), 128, 3, torch.float32),
    ("cin3_cout64_112", (2, 3, 16, 112, 112), 64, 3, torch.float32),
    ("headline_bf16", (16, 8, 16, 64, 64), 16, 3, torch.bfloat16),
    ("c16_c32_bf16", (32, 16, 16, 32, 32), 32, 3, torch.bfloat16),
    ("k5_c16_c32", (16, 16, 16, 32, 32), 32, 5, torch.float32),
]


def flush_l2(buf):
    buf.zero_()


def timed(fn, iters, buf):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(iters):
        flush_l2(buf)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def variants(x, w, gy, k):
    wf = lambda: w.flip(2, 3, 4).transpose(0, 1).contiguous()  # noqa: E731
    bias_sizes = [w.shape[0]]
    cb = torch.ops.aten.convolution_backward

    def dgrad():
        return cb(gy, x, w, bias_sizes, [1] * 3, [0] * 3, [1] * 3, False, [0] * 3, 1, [True, False, False])[0]

    def fprop():
        return F.conv3d(gy, wf(), padding=k - 1)

    def fprop_cl():
        g = gy.contiguous(memory_format=torch.channels_last_3d)
        return F.conv3d(g, wf().contiguous(memory_format=torch.channels_last_3d), padding=k - 1).contiguous()

    def bwd_all():
        return cb(gy, x, w, bias_sizes, [1] * 3, [0] * 3, [1] * 3, False, [0] * 3, 1, [True, True, True])[0]

    def fprop_wb():
        g = F.conv3d(gy, wf(), padding=k - 1)
        cb(gy, x, w, bias_sizes, [1] * 3, [0] * 3, [1] * 3, False, [0] * 3, 1, [False, True, True])
        return g
    return dict(dgrad=dgrad, fprop=fprop, fprop_cl=fprop_cl, bwd_all=bwd_all, fprop_wb=fprop_wb)


# --sweep: TF32 mode, cudnn.benchmark off, more channel counts and kernels: whether cuDNN's
# TF32-mode dgrad is itself TF32 (error ~1e-4) or FP32-accurate (~1e-7) at each, against the fprop.
SWEEP = [  # x shape, Cout, kernel
    ((4, 8, 16, 32, 32), 17, 3), ((4, 8, 16, 32, 32), 32, 3), ((4, 8, 16, 32, 32), 64, 3),
    ((4, 4, 16, 32, 32), 64, 3), ((4, 16, 16, 32, 32), 16, 3), ((4, 12, 16, 32, 32), 12, 3),
    ((4, 24, 16, 32, 32), 24, 3), ((4, 32, 16, 32, 32), 8, 3), ((4, 64, 16, 32, 32), 4, 3),
    ((4, 1, 16, 32, 32), 256, 3), ((4, 16, 16, 32, 32), 16, 5), ((4, 8, 16, 32, 32), 32, (1, 3, 3)),
    ((4, 8, 15, 61, 61), 32, 3), ((4, 128, 8, 16, 16), 128, 3), ((4, 9, 16, 32, 32), 33, 2),
    ((32, 8, 16, 64, 64), 16, 3), ((4, 3, 16, 112, 112), 64, 3), ((4, 16, 16, 32, 32), 32, 1),
]


def sweep(args, dev, buf):
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = False
    lines = ["| x | Cout | kernel | dgrad ms | fprop ms | err dgrad | err fprop |", "|" + "---|" * 7]
    for shape, cout, k in SWEEP:
        k3 = (k,) * 3 if isinstance(k, int) else k
        torch.manual_seed(0)
        x = torch.rand(shape, device=dev)
        w = (torch.rand(cout, shape[1], *k3, device=dev) * 2 - 1)
        oshape = (shape[0], cout) + tuple(s - kk + 1 for s, kk in zip(shape[2:], k3))
        gy = torch.randn(oshape, device=dev) * (torch.rand(oshape, device=dev) < 0.125)
        cb = torch.ops.aten.convolution_backward
        wf = w.flip(2, 3, 4).transpose(0, 1).contiguous()
        pad = [kk - 1 for kk in k3]
        fns = dict(
            dgrad=lambda: cb(gy, x, w, [cout], [1] * 3, [0] * 3, [1] * 3, False, [0] * 3, 1, [True, False, False])[0],
            fprop=lambda: F.conv3d(gy, wf, padding=pad))
        ref = F.conv_transpose3d(gy.double(), w.double())
        t = {n: timed(f, args.iters, buf) for n, f in fns.items()}
        e = {n: ((f().double() - ref).abs().max() / ref.abs().max()).item() for n, f in fns.items()}
        lines.append(f"| {'x'.join(map(str, shape))} | {cout} | {k} | {t['dgrad']:.4f} | {t['fprop']:.4f} | "
                     f"{e['dgrad']:.2e} | {e['fprop']:.2e} |")
        print(lines[-1], flush=True)
    return lines


def wgrad_variants(x, w, gy):
    """Ways to form grad_weight: cuDNN's wgrad (NCDHW and channels-last), per-tap GEMMs over
    (batch, position) with cuBLAS, and cuDNN's fprop with batch and channels swapped."""
    cout, cin, kd, kh, kw = w.shape
    b = x.shape[0]
    od, oh, ow = gy.shape[2:]
    cb = torch.ops.aten.convolution_backward

    def wgrad():
        return cb(gy, x, w, None, [1] * 3, [0] * 3, [1] * 3, False, [0] * 3, 1, [False, True, False])[1]

    def wgrad_cl():
        xc = x.contiguous(memory_format=torch.channels_last_3d)
        gc = gy.contiguous(memory_format=torch.channels_last_3d)
        return cb(gc, xc, w, None, [1] * 3, [0] * 3, [1] * 3, False, [0] * 3, 1, [False, True, False])[1]

    def gemm_taps():
        g = gy.transpose(0, 1).reshape(cout, -1)
        out = torch.empty(cout, cin, kd * kh * kw, device=x.device, dtype=torch.float32)
        t = 0
        for td in range(kd):
            for th in range(kh):
                for tw in range(kw):
                    xs = x[:, :, td:td + od, th:th + oh, tw:tw + ow].transpose(0, 1).reshape(cin, -1)
                    torch.mm(g, xs.t(), out=out[:, :, t])
                    t += 1
        return out.view(cout, cin, kd, kh, kw)

    def fprop_swapped():
        return F.conv3d(x.transpose(0, 1), gy.transpose(0, 1)).transpose(0, 1)

    def wgrad_3x():
        # 3xTF32: both operands split into TF32-exact halves (truncation), three TF32 wgrads.
        old = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = True
        xh, xl = tf32_split(x)
        gh, gl = tf32_split(gy)
        r = cb(gh, xh, w, None, [1] * 3, [0] * 3, [1] * 3, False, [0] * 3, 1, [False, True, False])[1]
        r += cb(gl, xh, w, None, [1] * 3, [0] * 3, [1] * 3, False, [0] * 3, 1, [False, True, False])[1]
        r += cb(gh, xl, w, None, [1] * 3, [0] * 3, [1] * 3, False, [0] * 3, 1, [False, True, False])[1]
        torch.backends.cudnn.allow_tf32 = old
        return r

    def dgrad_3x():
        # grad_x the same way: three TF32 forward convs of the flipped weights.
        old = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = True
        wf = w.flip(2, 3, 4).transpose(0, 1).contiguous()
        wh, wl = tf32_split(wf)
        gh, gl = tf32_split(gy)
        pad = [kd - 1, kh - 1, kw - 1]
        r = F.conv3d(gh, wh, padding=pad)
        r += F.conv3d(gl, wh, padding=pad)
        r += F.conv3d(gh, wl, padding=pad)
        torch.backends.cudnn.allow_tf32 = old
        return r
    def unfold(dt, chunk_bytes=256 << 20):
        # One GEMM over (batch, position) a chunk of samples: cols[ci, tap, b, p] = x[b, ci, p + tap],
        # G = gy as [Cout, b p]; grad_w = sum over chunks G cols^T, in dt (float32 or float64).
        taps = kd * kh * kw
        p = od * oh * ow
        per = max(1, chunk_bytes // (cin * taps * p * torch.finfo(dt).bits // 8))
        out = torch.zeros(cout, cin * taps, device=x.device, dtype=dt)
        for b0 in range(0, b, per):
            b1 = min(b, b0 + per)
            cols = torch.empty(cin, taps, b1 - b0, od, oh, ow, device=x.device, dtype=dt)
            t = 0
            for td in range(kd):
                for th in range(kh):
                    for tw in range(kw):
                        cols[:, t].copy_(x[b0:b1, :, td:td + od, th:th + oh, tw:tw + ow].transpose(0, 1))
                        t += 1
            g = gy[b0:b1].transpose(0, 1).to(dt).reshape(cout, -1)
            out.addmm_(g, cols.view(cin * taps, -1).t())
        return out.view(cout, cin, kd, kh, kw).to(x.dtype)

    if x.dtype != torch.float32:
        return dict(wgrad=wgrad, wgrad_cl=wgrad_cl, gemm_taps=gemm_taps, fprop_swapped=fprop_swapped,
                    wgrad_3x=wgrad, dgrad_3x=lambda: F.conv_transpose3d(gy, w), unfold_f32=wgrad,
                    unfold_f64=wgrad)
    return dict(wgrad=wgrad, wgrad_cl=wgrad_cl, gemm_taps=gemm_taps, fprop_swapped=fprop_swapped,
                wgrad_3x=wgrad_3x, dgrad_3x=dgrad_3x, unfold_f32=lambda: unfold(torch.float32),
                unfold_f64=lambda: unfold(torch.float64))


def tf32_split(t):
    """t = hi + lo + (below 2^-21 of t): hi and lo TF32-exact (low 13 bits zero, truncated)."""
    hi = (t.view(torch.int32) & -8192).view(torch.float32)
    lo = ((t - hi).view(torch.int32) & -8192).view(torch.float32)
    return hi, lo


def wgrad_table(args, dev, buf):
    names = ("wgrad", "gemm_taps", "wgrad_3x", "dgrad_3x", "unfold_f32", "unfold_f64")
    lines = ["| row | tf32 | " + " | ".join(names) + " | " + " | ".join("err " + n for n in names) + " |",
             "|" + "---|" * (2 + 2 * len(names))]
    torch.backends.cudnn.benchmark = False
    for name, shape, cout, k, dt in ROWS:
        if dt != torch.float32:
            continue
        torch.manual_seed(0)
        x = torch.rand(shape, device=dev)
        w = torch.rand(cout, shape[1], k, k, k, device=dev)
        oshape = (shape[0], cout) + tuple(s - k + 1 for s in shape[2:])
        gy = torch.randn(oshape, device=dev) * (torch.rand(oshape, device=dev) < 0.125)
        ref = None
        for tf32 in (False, True):
            torch.backends.cudnn.allow_tf32 = tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32
            vs = wgrad_variants(x, w, gy)
            times = {n: timed(f, args.iters, buf) for n, f in vs.items()}
            if ref is None:
                ref = wgrad_variants(x.double(), w.double(), gy.double())["wgrad"]()
                ref_x = F.conv_transpose3d(gy.double(), w.double())
            errs = {n: ((f().double() - (ref_x if n == "dgrad_3x" else ref)).abs().max() /
                        (ref_x if n == "dgrad_3x" else ref).abs().max()).item() for n, f in vs.items()}
            lines.append(f"| {name} | {tf32} | " + " | ".join(f"{times[n]:.4f}" for n in names) + " | " +
                         " | ".join(f"{errs[n]:.2e}" for n in names) + " |")
            print(lines[-1], flush=True)
        del x, w, gy, ref, ref_x
        torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = False
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default=None)
    ap.add_argument("--sweep", action="store_true", help="the SWEEP table (TF32 mode) instead of ROWS")
    ap.add_argument("--wgrad", action="store_true", help="grad_weight's variants (float32 ROWS) instead")
    args = ap.parse_args()
    dev = torch.device("cuda")
    buf = torch.empty(64 << 20, dtype=torch.float32, device=dev)  # 256 MB: past the L2
    if args.sweep or args.wgrad:
        text = "\n".join(sweep(args, dev, buf) if args.sweep else wgrad_table(args, dev, buf)) + "\n"
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
        return 0
    lines = [f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN "
             f"{torch.backends.cudnn.version()}. Medians of {args.iters}, ms, L2 flushed. "
             "err = max|g - ref| / max|ref| against float64 on samples 0-1.", "",
             "| row | dtype | tf32 | benchmark | dgrad | fprop | fprop_cl | bwd_all | fprop+wb | "
             "err dgrad | err fprop | err fprop_cl |", "|" + "---|" * 12]
    for name, shape, cout, k, dt in ROWS:
        torch.manual_seed(0)
        x = torch.rand(shape, device=dev, dtype=dt)
        w = (torch.rand(cout, shape[1], k, k, k, device=dev) * 2 - 1).div_((shape[1] * k ** 3) ** 0.5).to(dt)
        oshape = (shape[0], cout) + tuple(s - k + 1 for s in shape[2:])
        # The tail's gradient: one value a 2x2x2 window, zeros elsewhere.
        gy = torch.randn(oshape, device=dev) * (torch.rand(oshape, device=dev) < 0.125)
        gy = gy.to(dt)
        ref = None
        for tf32 in (True, False):
            if dt != torch.float32 and not tf32:
                continue
            for bench in (False, True):
                torch.backends.cudnn.allow_tf32 = tf32
                torch.backends.cudnn.benchmark = bench
                vs = variants(x, w, gy, k)
                times = {n: timed(f, args.iters, buf) for n, f in vs.items()}
                # Errors on the first two samples.
                vs2 = variants(x[:2], w, gy[:2], k)
                if ref is None:
                    ref = F.conv_transpose3d(gy[:2].double(), w.double())
                errs = {}
                for n in ("dgrad", "fprop", "fprop_cl"):
                    g = vs2[n]().double()
                    errs[n] = ((g - ref).abs().max() / ref.abs().max()).item()
                lines.append(f"| {name} | {str(dt)[6:]} | {tf32} | {bench} | " +
                             " | ".join(f"{times[n]:.4f}" for n in ("dgrad", "fprop", "fprop_cl", "bwd_all", "fprop_wb")) +
                             " | " + " | ".join(f"{errs[n]:.2e}" for n in ("dgrad", "fprop", "fprop_cl")) + " |")
                print(lines[-1], flush=True)
        del x, w, gy, ref
        torch.cuda.empty_cache()
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
