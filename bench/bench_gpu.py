"""GPU benchmark: convpool against PyTorch, side by side, in one run.

Variants per shape (all on the same GPU, cold L2, CUDA events, median of --iters runs):
  eager_tf32 / eager_strict      the PyTorch Model, cuDNN TF32 on / off
  compile / compile_max          torch.compile default / max-autotune-no-cudagraphs (TF32)
  unfused                        cuDNN conv3d writing y, then one pooling pass over y (TF32):
                                 the best a non-fused pipeline can do
  convpool_c_tf32 / _strict      the raw C entry point, timed by build/bench_gpu
  convpool_py_tf32 / _strict     convpool.ModelNew called from Python
  eager_f16 / _bf16,             the headline with the model and x in float16 / bfloat16 (issue
  convpool_py_f16 / _bf16        "hardware limit"'s 16-bit row): Model against ModelNew

Ceilings are measured in the same run: device-to-device copy bandwidth, and the TF32, FP32 and
FP16 matmul rates. Floors: x bytes / copy bandwidth, FLOPs / TF32 rate, FLOPs / FP32 rate
(strict rows), FLOPs / FP16 rate (16-bit rows, whose x is half the bytes).
Writes bench.json (one row per variant and shape), bench_table.md and speedup_vs_batch.png.
"""
import argparse
import copy
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HEADLINE = dict(batch=128, cin=8, cout=16, d=16, h=64, w=64, k=3, pool=2, divisor=2.0)


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from convpool.model import Model  # noqa: E402  (the reference block, KernelBench L2 #8)
from revision import revision  # noqa: E402  (bench/ is sys.path[0] when run as a script)


def unfused(model, x):
    # Divisor folded into the conv weights (d > 0): one conv write and one pool read of y.
    y = F.conv3d(x, model.conv.weight / model.divisor, model.conv.bias / model.divisor)
    p = F.max_pool3d(y, model.max_pool.kernel_size).mean(dim=(2, 3, 4), keepdim=True)
    return (p + model.bias).sum(dim=model.sum_dim)


class Timer:
    """CUDA-event timing with the L2 flushed (a 2x-L2 buffer rewritten) before every run."""

    def __init__(self, iters, warmup):
        self.iters, self.warmup = iters, warmup
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        self.flush_buf = torch.empty(max(2 * l2, 64 << 20), dtype=torch.uint8, device="cuda")

    def __call__(self, fn, hide_host=False):
        """hide_host: a ~1 ms spin kernel runs before the start event, so the host enqueues all
        of fn while the GPU is busy and the result is device time only (no launch gaps)."""
        for _ in range(self.warmup):
            fn()
        times = []
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(self.iters):
            self.flush_buf.zero_()
            if hide_host:
                torch.cuda._sleep(2_000_000)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        times.sort()
        q = lambda f: times[min(len(times) - 1, int(f * len(times)))]
        return dict(median_ms=statistics.median(times), p20_ms=q(0.2), p80_ms=q(0.8))


def host_us(fn, calls=200):
    """Host time of one call: `calls` calls enqueued back to back, no sync between."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def measure_ceilings(timer):
    n = 1 << 28  # 1 GiB of float32
    a = torch.empty(n, device="cuda")
    b = torch.empty_like(a)
    t = timer(lambda: b.copy_(a))["median_ms"]
    copy_tbs = 2 * a.numel() * 4 / (t * 1e-3) / 1e12
    del a, b
    m = 8192
    a = torch.randn(m, m, device="cuda")
    b = torch.randn(m, m, device="cuda")
    rates = {}
    for name, tf32 in (("tf32", True), ("fp32", False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        t = timer(lambda: a @ b)["median_ms"]
        rates[name] = 2 * m ** 3 / (t * 1e-3) / 1e12
    torch.backends.cuda.matmul.allow_tf32 = False
    ah, bh = a.half(), b.half()
    t = timer(lambda: ah @ bh)["median_ms"]
    rates["fp16"] = 2 * m ** 3 / (t * 1e-3) / 1e12
    return dict(copy_TBps=copy_tbs, tf32_TFLOPs=rates["tf32"], fp32_TFLOPs=rates["fp32"],
                fp16_TFLOPs=rates["fp16"])


def shape_stats(s):
    cd, ch, cw = s["d"] - s["k"] + 1, s["h"] - s["k"] + 1, s["w"] - s["k"] + 1
    flops = 2.0 * s["batch"] * s["cout"] * cd * ch * cw * s["cin"] * s["k"] ** 3
    xbytes = 4.0 * s["batch"] * s["cin"] * s["d"] * s["h"] * s["w"]
    return flops, xbytes


def shape_name(s):
    return "B{batch} {cin}->{cout} {d}x{h}x{w} k{k} p{pool}".format(**s)


def run_c_bench(build, s, precision, iters):
    exe = os.path.join(build, "bench", "bench_gpu")
    cmd = [exe, "--json", "--iters", str(iters), "--precision", precision,
           "--batch", str(s["batch"]), "--cin", str(s["cin"]), "--cout", str(s["cout"]),
           "--d", str(s["d"]), "--h", str(s["h"]), "--w", str(s["w"]),
           "--k", str(s["k"]), "--pool", str(s["pool"]), "--divisor", str(s["divisor"])]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    row = json.loads(r.stdout.strip().splitlines()[-1])
    return dict(median_ms=row["median_ms"], p20_ms=row["p20_ms"], p80_ms=row["p80_ms"], host_us=row["host_us"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build-device")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="headline only, no torch.compile")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    torch.manual_seed(0)
    gpu = torch.cuda.get_device_name(0)
    rev = revision()
    date = datetime.date.today().isoformat()
    timer = Timer(args.iters, args.warmup)
    ceil = measure_ceilings(timer)
    print(f"# {gpu}  copy {ceil['copy_TBps']:.2f} TB/s  TF32 {ceil['tf32_TFLOPs']:.0f} TFLOP/s  "
          f"FP32 {ceil['fp32_TFLOPs']:.1f} TFLOP/s", flush=True)

    try:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
        import convpool
        have_py = True
    except Exception as e:  # reported, not fatal: the C numbers still stand
        print(f"# convpool Python package unavailable: {e}", flush=True)
        have_py = False

    shapes = [dict(HEADLINE)]
    if not args.quick:
        shapes += [dict(HEADLINE, batch=b) for b in (1, 8, 32, 512)]
        shapes += [dict(HEADLINE, cin=3, d=16, h=32, w=32), dict(HEADLINE, batch=16, cin=32, cout=64, d=16, h=32, w=32)]

    rows = []
    for s in shapes:
        flops, xbytes = shape_stats(s)
        init = (s["cin"], s["cout"], (s["k"],) * 3, s["divisor"], (s["pool"],) * 3, (s["cout"], 1, 1, 1), 1)
        torch.manual_seed(0)
        model = Model(*init).cuda()
        x = torch.rand(s["batch"], s["cin"], s["d"], s["h"], s["w"], device="cuda")
        variants = {}

        def cudnn_tf32(flag, fn):
            def g():
                torch.backends.cudnn.allow_tf32 = flag
                return fn()
            return g

        with torch.no_grad():
            variants["eager_tf32"] = cudnn_tf32(True, lambda: model(x))
            variants["eager_strict"] = cudnn_tf32(False, lambda: model(x))
            variants["unfused"] = cudnn_tf32(True, lambda: unfused(model, x))
            if not args.quick:
                torch.backends.cudnn.allow_tf32 = True
                variants["compile"] = cudnn_tf32(True, lambda m=torch.compile(model): m(x))
                if s == HEADLINE:
                    mc = torch.compile(model, mode="max-autotune-no-cudagraphs")
                    variants["compile_max"] = cudnn_tf32(True, lambda: mc(x))
            if have_py:
                torch.manual_seed(0)
                mn = convpool.ModelNew(*init).cuda()
                mn.load_state_dict(model.state_dict())
                variants["convpool_py_tf32"] = cudnn_tf32(True, lambda: mn(x))
                variants["convpool_py_strict"] = cudnn_tf32(False, lambda: mn(x))
            if s == HEADLINE:  # 16-bit models: x, weights and biases in that dtype, as users run them
                for tag, dt in (("f16", torch.float16), ("bf16", torch.bfloat16)):
                    xh, mh = x.to(dt), copy.deepcopy(model).to(dt)
                    variants[f"eager_{tag}"] = cudnn_tf32(True, lambda mh=mh, xh=xh: mh(xh))
                    if have_py:
                        nh = copy.deepcopy(mn).to(dt)
                        variants[f"convpool_py_{tag}"] = cudnn_tf32(True, lambda nh=nh, xh=xh: nh(xh))
            results = {}
            for name, fn in variants.items():
                t0 = time.time()
                try:
                    results[name] = timer(fn)
                    if name.startswith(("convpool_py", "eager")):
                        results[name]["host_us"] = host_us(fn)
                except Exception as e:
                    print(f"# {shape_name(s)} {name} failed: {e}", flush=True)
                print(f"# {shape_name(s)} {name}: {results.get(name, {}).get('median_ms', float('nan')):.4f} ms "
                      f"({time.time() - t0:.0f}s)", flush=True)
        for prec in ("tf32", "strict"):
            try:
                results[f"convpool_c_{prec}"] = run_c_bench(args.build, s, prec, args.iters)
            except Exception as e:
                print(f"# {shape_name(s)} convpool_c_{prec} failed: {e}", flush=True)
        torch.backends.cudnn.allow_tf32 = True
        del x, model
        torch.cuda.empty_cache()

        base = results.get("eager_tf32", {}).get("median_ms")
        base_strict = results.get("eager_strict", {}).get("median_ms")
        comp = results.get("compile", {}).get("median_ms")
        floors = dict(read_ms=xbytes / (ceil["copy_TBps"] * 1e12) * 1e3,
                      tf32_ms=flops / (ceil["tf32_TFLOPs"] * 1e12) * 1e3,
                      fp32_ms=flops / (ceil["fp32_TFLOPs"] * 1e12) * 1e3,
                      fp16_ms=flops / (ceil["fp16_TFLOPs"] * 1e12) * 1e3)
        for name, r in results.items():
            ms = r["median_ms"]
            prec = name.rsplit("_", 1)[1] if name.endswith(("_strict", "_f16", "_bf16")) else "tf32"
            lowp = prec in ("f16", "bf16")
            base_same = {"tf32": base, "strict": base_strict}.get(prec) or results.get(f"eager_{prec}", {}).get("median_ms")
            floor_compute = floors["fp32_ms" if prec == "strict" else "fp16_ms" if lowp else "tf32_ms"]
            row = dict(variant=name, shape=shape_name(s), batch=s["batch"], precision=prec,
                       **r, TFLOPs=flops / (ms * 1e-3) / 1e12, GBps=xbytes / (2 if lowp else 1) / (ms * 1e-3) / 1e9,
                       pct_read_floor=100 * floors["read_ms"] / (2 if lowp else 1) / ms,
                       pct_compute_floor=100 * floor_compute / ms,
                       speedup_vs_eager=base_same / ms if base_same else None,
                       speedup_vs_compile=comp / ms if comp and prec == "tf32" else None,
                       gpu=gpu, date=date, rev=rev)
            rows.append(row)
        write_results(args.out, gpu, date, rev, ceil, rows)


def write_results(out, gpu, date, rev, ceil, rows):
    """Writes bench.json, bench_table.md and the plot; called after every shape, so a run cut
    short still leaves what it measured."""
    with open(os.path.join(out, "bench.json"), "w") as f:
        json.dump(dict(gpu=gpu, date=date, rev=rev, ceilings=ceil, rows=rows), f, indent=1)
    lines = [f"GPU: {gpu}, {date}, rev {rev}. Ceilings: copy {ceil['copy_TBps']:.2f} TB/s, "
             f"TF32 matmul {ceil['tf32_TFLOPs']:.0f} TFLOP/s, FP32 matmul {ceil['fp32_TFLOPs']:.1f} TFLOP/s, "
             f"FP16 matmul {ceil['fp16_TFLOPs']:.0f} TFLOP/s.", "",
             "| shape | variant | median ms | p20 | p80 | TFLOP/s | GB/s | % read floor | % compute floor | vs eager | vs compile | host us/call |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda v, f: "-" if v is None else format(v, f)
    for r in rows:
        lines.append(f"| {r['shape']} | {r['variant']} | {r['median_ms']:.4f} | {r['p20_ms']:.4f} | {r['p80_ms']:.4f} "
                     f"| {r['TFLOPs']:.1f} | {r['GBps']:.0f} | {r['pct_read_floor']:.1f} | {r['pct_compute_floor']:.1f} "
                     f"| {fmt(r['speedup_vs_eager'], '.2f')} | {fmt(r['speedup_vs_compile'], '.2f')} "
                     f"| {fmt(r.get('host_us'), '.1f')} |")
    lines.append("")
    for r in rows:
        if r["variant"].startswith("convpool_py"):
            c = next((q for q in rows if q["shape"] == r["shape"] and q["variant"] == r["variant"].replace("_py_", "_c_")), None)
            if c and c.get("host_us") is not None and r.get("host_us") is not None:
                lines.append(f"Python call overhead over the raw C call, {r['shape']} {r['precision']}: "
                             f"{r['host_us'] - c['host_us']:.1f} us host time per call "
                             f"({r['host_us']:.1f} vs {c['host_us']:.1f}); "
                             f"event-timed median {1e3 * (r['median_ms'] - c['median_ms']):+.1f} us")
    with open(os.path.join(out, "bench_table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    plot(rows, os.path.join(out, "speedup_vs_batch.png"), gpu)


def plot(rows, path, gpu):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    sweep = [r for r in rows if r["shape"].split(" ", 1)[1] == shape_name(HEADLINE).split(" ", 1)[1]]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for v in ("convpool_c_tf32", "convpool_c_strict", "convpool_py_tf32", "compile", "unfused"):
        pts = sorted((r["batch"], r["speedup_vs_eager"]) for r in sweep if r["variant"] == v and r["speedup_vs_eager"])
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=v)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("batch (8->16 ch, 16x64x64, k3, pool 2)")
    ax.set_ylabel("speedup over PyTorch eager (same precision)")
    ax.set_title(f"convpool speedup vs batch, {gpu}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
