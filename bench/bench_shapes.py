"""GPU benchmark: convpool against PyTorch for every shape family, in one run.

Each row of SHAPES is one shape family (kernel sizes, pool sizes, channel counts, 16-bit input,
odd extents, batch 1). The batch is picked per row: start at 2 and double until PyTorch eager
(TF32) takes >= 0.3 ms, so every row is timed where the GPU is busy rather than launch-bound;
x stays under 4 GiB and the conv output under 8 GiB. The batch1 row is fixed at batch 1.

Variants per row, all timed in this process with bench_gpu.Timer (L2 flushed before every run,
CUDA events, median / p20 / p80 of --iters runs):
  eager_tf32 / eager_strict      convpool.model.Model, cuDNN and matmul TF32 on / off; the better
                                 of torch.backends.cudnn.benchmark off and on (every eager and
                                 convpool variant below takes the better of the two as well)
  compile                        torch.compile(Model) default mode, TF32 (better of benchmark
                                 off / on); slow to build, so --no-compile / --compile-rows
  unfused                        bench_gpu.unfused: cuDNN conv, then one pooling pass (TF32,
                                 better of benchmark off / on)
  convpool_tf32 / _strict        convpool.ModelNew with the Model's parameters; it follows
                                 torch.backends.cudnn.allow_tf32
  (every variant above runs under torch.no_grad: the inference forward)
  eager_*_grad / convpool_*_grad the forward with grad mode on and the parameters requiring
                                 grad, as a user's plain model(x) runs it: ModelNew's training
                                 forward, which also writes the arg-max codes (its near-tie
                                 recheck waits for a backward)
  train_*_tf32 / _strict         a training step (--train-rows): forward, out.sum(), backward
                                 for x and every parameter

16-bit rows (headline_f16, headline_bf16): x is float16 / bfloat16, and both Model and ModelNew
are cast to x's dtype (model.to(dtype)), which is what a PyTorch user with 16-bit data runs
(nn.Conv3d needs weights of x's dtype). ModelNew reads the 16-bit x natively and multiplies in
TF32 (or 3xTF32) with float32 accumulation; the accuracy check measures both against the same
float64 truth.

Accuracy, checked before timing: the float64 reference is Model in float64 on the same x
(upcast) and the same float32 parameters. rel_err = max |out - ref| / max |ref|, recorded for
convpool and eager at both precisions. A convpool row is flagged "(!)" when rel_err exceeds
5e-3 (TF32) or 1e-4 (strict); for 16-bit x the limit is at least 4 ulp of x's dtype
(4 * finfo.eps), since ModelNew rounds the pooled means to x's dtype as Model does.

Derived per row: speedup_tf32 = eager_tf32 / convpool_tf32, speedup_strict = eager_strict /
convpool_strict, vs_compile = compile / convpool_tf32, vs_unfused = unfused / convpool_tf32;
FLOPs = 2 B Cout Cin kd kh kw Dc Hc Wc (conv output extents) and convpool's TFLOP/s at TF32;
floor_ms = max(x bytes / copy bandwidth, FLOPs / TF32 matmul rate), both ceilings measured at
the start (bench_gpu.measure_ceilings); pct_of_floor = floor_ms / convpool_tf32. plan is the
string convpool.explain(model, x) returns (the dispatch the library picked), "" where the
package has no explain().

Writes to --out: shapes.json (a list of row dicts, each with gpu, date, rev and command),
shapes_table.md and speedup_by_shape.png; json and md are rewritten after every row, so a run
cut short keeps what it measured. --max-seconds stops starting new rows (and skips compile in a
row already started) past that many seconds.
"""
import argparse
import collections
import copy
import datetime
import gc
import json
import math
import os
import shlex
import sys
import time

import torch

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(BENCH_DIR, "..", "python"))
sys.path.insert(0, BENCH_DIR)
from bench_gpu import Timer, host_us, measure_ceilings, unfused  # noqa: E402
from convpool.model import Model  # noqa: E402
from revision import revision  # noqa: E402  (git's word and the sources hash: bench/revision.py)

Shape = collections.namedtuple("Shape", "name cin cout d h w kernel pool dtype batch")


def S(name, cin=8, cout=16, d=16, h=64, w=64, kernel=3, pool=2, dtype="float32", batch=None):
    return Shape(name, cin, cout, d, h, w, kernel, pool, dtype, batch)


SHAPES = [
    S("headline"),
    S("headline_f16", dtype="float16"),
    S("headline_bf16", dtype="bfloat16"),
    S("k1", kernel=1),
    S("k2", kernel=2),
    S("k5", kernel=5),
    S("k1x7x7", kernel=(1, 7, 7)),
    S("k3x1x1", kernel=(3, 1, 1)),
    S("pool1", pool=1),
    S("pool3", pool=3),
    S("pool4", pool=4),
    S("pool1x2x2", pool=(1, 2, 2)),
    S("pool2x4x4", pool=(2, 4, 4)),
    S("cin3_cout64_112", cin=3, cout=64, d=16, h=112, w=112),
    # Cin <= 3 at the headline's size: TF32 mode runs strict there, as cuDNN's conv does
    # (binding.cpp's cuda_precision), so their TF32 column is a strict kernel against cuDNN's FP32.
    S("cin1", cin=1),
    S("cin3", cin=3),
    S("c16_c32", cin=16, cout=32, d=16, h=32, w=32),
    S("c32_c64", cin=32, cout=64, d=16, h=32, w=32),
    S("c64_c128", cin=64, cout=128, d=16, h=32, w=32),
    # Wide rows of the other routes (twenty-first session): the general kernel at wide channels
    # (pool 3, kernel 5), and Cin 64 on the group kernel; all three train on the conv-tail route.
    S("c16_c32_pool3", cin=16, cout=32, d=16, h=32, w=32, pool=3),
    S("c32_c32_k5", cin=32, cout=32, d=16, h=32, w=32, kernel=5),
    S("c64_c64", cin=64, cout=64, d=16, h=32, w=32),
    S("odd_15x61x61", d=15, h=61, w=61),
    S("batch1", batch=1),
]

DIVISOR = 2.0
SUM_DIM = 1
PROBE_START_BATCH = 2
PROBE_TARGET_MS = 0.3
X_CAP_BYTES = 4 << 30
CONV_CAP_BYTES = 8 << 30
REF_CHUNK_BYTES = 1 << 30          # float64 conv output per reference chunk
TOL = {"tf32": 5e-3, "strict": 1e-4}
VARIANTS = ("eager_tf32", "eager_strict", "compile", "unfused", "convpool_tf32", "convpool_strict",
            "eager_tf32_grad", "eager_strict_grad", "convpool_tf32_grad", "convpool_strict_grad", "train_eager_tf32", "train_convpool_tf32",
            "train_eager_strict", "train_convpool_strict", "eager_tf32_device", "convpool_tf32_device")
BENCHMARK_BOTH = (False, True)


# ----------------------------------------------------------------------------- helpers

def triple(v):
    return (v,) * 3 if isinstance(v, int) else tuple(v)


def fmt_triple(v):
    t = triple(v)
    return str(t[0]) if len(set(t)) == 1 else "x".join(map(str, t))


def short(e):
    """One line of an exception, for the json and the table notes."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:300] if lines else ''}"


def conv_extent(s):
    k = triple(s.kernel)
    return (s.d - k[0] + 1, s.h - k[1] + 1, s.w - k[2] + 1)


def set_precision(tf32, benchmark=False):
    # The legacy flags only: the fp32_precision API must not be mixed with them (PyTorch raises
    # on reading the legacy getters then), and ModelNew reads whichever set the conv's mode.
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = benchmark


def dynamo_reset():
    import torch._dynamo
    torch._dynamo.reset()


def rand_x(s, batch, dtype, seed):
    # A generator of its own: x is the same whatever ran before it in this process.
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.rand(batch, s.cin, s.d, s.h, s.w, device="cuda", generator=gen)
    if X_ZERO_HALF:
        x[..., : s.w // 2] = 0  # a flat background: every window there ties in every channel
    return x if dtype == torch.float32 else x.to(dtype)


def time_best(timer, fn, tf32, benchmark_modes):
    """Timer result for fn under the given TF32 flag; with several cudnn.benchmark modes, the one
    with the lowest median, plus every mode's median."""
    runs, errs = {}, []
    for bm in benchmark_modes:
        set_precision(tf32, bm)
        try:
            runs[bm] = timer(fn)
        except Exception as e:
            errs.append(f"cudnn.benchmark={bm}: {short(e)}")
    set_precision(True)
    if not runs:
        raise RuntimeError("; ".join(errs))
    best = min(runs, key=lambda k: runs[k]["median_ms"])
    r = dict(runs[best])
    if len(benchmark_modes) > 1:
        r["cudnn_benchmark"] = best
        r["median_ms_by_cudnn_benchmark"] = {str(k): v["median_ms"] for k, v in runs.items()}
    if errs:
        r["partial_errors"] = errs
    return r


FIXED_BATCH = {}  # --batch: row name -> batch
X_ZERO_HALF = False  # --x-zero-half


def choose_batch(s, eager, dtype, seed, probe_timer, row):
    """Double the batch from 2 until eager TF32 takes >= PROBE_TARGET_MS or a cap would be hit."""
    if s.batch:
        return s.batch
    if FIXED_BATCH.get(s.name):
        row["batch_fixed"] = True
        return FIXED_BATCH[s.name]
    esize = torch.empty(0, dtype=dtype).element_size()
    per_x = s.cin * s.d * s.h * s.w * esize
    per_conv = s.cout * math.prod(conv_extent(s)) * esize
    batch, probes = PROBE_START_BATCH, []
    set_precision(True)
    while True:
        x = None
        try:
            x = rand_x(s, batch, dtype, seed)
            ms = probe_timer(lambda: eager(x))["median_ms"]
        except torch.cuda.OutOfMemoryError:
            if batch == PROBE_START_BATCH:
                raise
            batch //= 2
            probes.append([batch * 2, "out of memory"])
            break
        finally:
            del x
            torch.cuda.empty_cache()
        probes.append([batch, round(ms, 4)])
        if ms >= PROBE_TARGET_MS or 2 * batch * per_x >= X_CAP_BYTES or 2 * batch * per_conv >= CONV_CAP_BYTES:
            break
        batch *= 2
    row["batch_probe"] = probes
    return batch


def reference(model32, x, s):
    """Model in float64 on x upcast, same parameters, in batch chunks to bound memory."""
    m64 = copy.deepcopy(model32).double()
    per_sample = s.cout * math.prod(conv_extent(s)) * 8
    chunk = max(1, REF_CHUNK_BYTES // per_sample)
    out = torch.cat([m64(x[i:i + chunk].double()) for i in range(0, x.shape[0], chunk)])
    del m64
    return out


def rel_err(out, ref):
    out, ref = out.double().reshape(-1), ref.reshape(-1)
    return ((out - ref).abs().max() / ref.abs().max()).item()


# ----------------------------------------------------------------------------- one row

def run_row(s, seed, row, args, timer, probe_timer, convpool, deadline):
    """Fills row in place (so whatever was measured survives an exception part way)."""
    dtype = getattr(torch, s.dtype)
    init = (s.cin, s.cout, s.kernel, DIVISOR, s.pool, (s.cout, 1, 1, 1), SUM_DIM)
    torch.manual_seed(seed)
    model32 = Model(*init).cuda()
    eager = model32 if dtype == torch.float32 else copy.deepcopy(model32).to(dtype)

    with torch.no_grad():
        batch = choose_batch(s, eager, dtype, seed, probe_timer, row)
        x = rand_x(s, batch, dtype, seed)
        row["batch"] = batch
        row["x_shape"] = list(x.shape)
        print(f"# {s.name}: batch {batch}, x {'x'.join(map(str, x.shape))} {s.dtype}"
              + (f" (probe {row['batch_probe']})" if "batch_probe" in row else ""), flush=True)

        mn = None
        if convpool is None:
            row["errors"]["convpool"] = "convpool package unavailable"
        else:
            try:
                torch.manual_seed(seed)
                mn = convpool.ModelNew(*init).cuda()
                mn.load_state_dict(model32.state_dict())
                if dtype != torch.float32:
                    mn = mn.to(dtype)
            except Exception as e:
                row["errors"]["convpool"] = short(e)
                mn = None

        # Dispatch plan, per precision (the library may pick differently with TF32 off).
        explain = getattr(convpool, "explain", None) if convpool is not None else None
        row["plan"] = ""
        if explain is not None and mn is not None:
            try:
                set_precision(True)
                row["plan"] = str(explain(mn, x))
                set_precision(False)
                strict_plan = str(explain(mn, x))
                if strict_plan != row["plan"]:
                    row["plan_strict"] = strict_plan
            except Exception as e:
                row["plan"] = f"explain failed: {short(e)}"
            set_precision(True)

        # Accuracy against float64, before any timing.
        try:
            ref = reference(model32, x, s)
            checks = [("eager_tf32", eager, True), ("eager_strict", eager, False)]
            if mn is not None:
                checks += [("convpool_tf32", mn, True), ("convpool_strict", mn, False)]
            for name, m, tf32 in checks:
                try:
                    set_precision(tf32)
                    row["rel_err"][name] = rel_err(m(x), ref)
                except Exception as e:
                    row["errors"][f"check_{name}"] = short(e)
            del ref
        except Exception as e:
            row["errors"]["reference"] = short(e)
        set_precision(True)
        torch.cuda.empty_cache()
        eps = torch.finfo(dtype).eps if dtype != torch.float32 else 0.0
        for prec in ("tf32", "strict"):
            tol = max(TOL[prec], 4 * eps)
            row["tolerance"][prec] = tol
            err = row["rel_err"].get(f"convpool_{prec}")
            if err is not None and not err <= tol:  # `not <=` also catches NaN
                row["accuracy_warning"].append(f"convpool_{prec} rel_err {err:.3g} > {tol:.3g}")
                print(f"# WARNING {s.name}: convpool_{prec} rel_err {err:.3g} > {tol:.3g}", flush=True)
        row["rel_err_str"] = ", ".join(f"{k} {v:.2g}" for k, v in row["rel_err"].items())
        print(f"# {s.name}: rel_err {row['rel_err_str']}", flush=True)

        want_compile = not args.no_compile and (args.compile_rows is None or s.name in args.compile_rows)
        variants = [
            ("eager_tf32", lambda: eager(x), True, BENCHMARK_BOTH),
            ("eager_strict", lambda: eager(x), False, BENCHMARK_BOTH),
            ("unfused", lambda: unfused(eager, x), True, BENCHMARK_BOTH),
        ]
        if want_compile:
            variants.append(("compile", None, True, BENCHMARK_BOTH))
        if mn is not None:
            # The better of cudnn.benchmark off and on, as for eager: the routes that run
            # cuDNN (wide channels; training where the fused backward does not serve) get
            # the algorithm a user with benchmark on would.
            variants += [("convpool_tf32", lambda: mn(x), True, BENCHMARK_BOTH),
                         ("convpool_strict", lambda: mn(x), False, BENCHMARK_BOTH)]

        # Grad mode on (run_row's variants run under no_grad) and the parameters requiring grad:
        # a user's plain model(x), which for ModelNew is its training forward.
        def with_grad(model):
            def fn():
                with torch.enable_grad():
                    return model(x)
            return fn
        variants += [("eager_tf32_grad", with_grad(eager), True, BENCHMARK_BOTH),
                     ("eager_strict_grad", with_grad(eager), False, BENCHMARK_BOTH)]
        if mn is not None:
            variants += [("convpool_tf32_grad", with_grad(mn), True, BENCHMARK_BOTH),
                         ("convpool_strict_grad", with_grad(mn), False, BENCHMARK_BOTH)]

        for name, fn, tf32, modes in variants:
            t0 = time.time()
            try:
                if name == "compile":
                    if time.time() > deadline:
                        raise RuntimeError("skipped: past --max-seconds")
                    # A fresh dynamo state per row: Model.forward is one code object for every
                    # row, and its recompile limit would otherwise send later rows to eager.
                    dynamo_reset()
                    compiled = torch.compile(eager)
                    fn = lambda: compiled(x)  # noqa: E731
                row["times"][name] = time_best(timer, fn, tf32, modes)
                t = row["times"][name]
                extra = f" cudnn.benchmark={t['cudnn_benchmark']}" if "cudnn_benchmark" in t else ""
                print(f"# {s.name} {name}: {t['median_ms']:.4f} ms (p20 {t['p20_ms']:.4f}, "
                      f"p80 {t['p80_ms']:.4f}){extra} [{time.time() - t0:.1f}s]", flush=True)
            except Exception as e:
                row["times"][name] = None
                row["errors"][name] = short(e)
                print(f"# {s.name} {name} failed: {short(e)}", flush=True)
            set_precision(True)
        if want_compile:
            dynamo_reset()  # frees the compiled graphs with the row

        # Where the time goes: device time alone (the host's enqueueing hidden behind a spin
        # kernel) and host time per call (calls enqueued back to back), for eager and convpool.
        # A row whose wall time is far above its device time is bound by the host, not the GPU.
        row["host_us"] = {}
        for name, fn in (("eager_tf32", lambda: eager(x)), ("convpool_tf32", lambda: mn(x) if mn else None)):
            if name.startswith("convpool") and mn is None:
                continue
            try:
                set_precision(True)
                row["times"][name + "_device"] = timer(fn, hide_host=True)
                row["host_us"][name] = host_us(fn)
                print(f"# {s.name} {name}: device {row['times'][name + '_device']['median_ms']:.4f} ms, "
                      f"host {row['host_us'][name]:.1f} us/call", flush=True)
            except Exception as e:
                row["errors"][name + "_device"] = short(e)

    # A training step (forward, loss = out.sum(), backward for x and every parameter), TF32 and
    # strict, on the rows --train-rows names: issue "Training" measures convpool's step against
    # eager's.
    if mn is not None and (args.train_rows is None or s.name in args.train_rows) and time.time() < deadline:
        xg = x.detach().clone().requires_grad_(True)
        for name, model, tf32 in (("train_eager_tf32", eager, True), ("train_convpool_tf32", mn, True),
                                  ("train_eager_strict", eager, False), ("train_convpool_strict", mn, False)):
            def step(model=model):
                model.zero_grad(set_to_none=True)
                xg.grad = None
                model(xg).sum().backward()
            try:
                with torch.enable_grad():
                    row["times"][name] = time_best(timer, step, tf32, BENCHMARK_BOTH)
                print(f"# {s.name} {name}: {row['times'][name]['median_ms']:.4f} ms", flush=True)
            except Exception as e:
                row["times"][name] = None
                row["errors"][name] = short(e)
            set_precision(True)


def derive(row, s, ceil):
    """Speedups, FLOPs and the floor for one row, from its medians."""
    med = {v: (row["times"].get(v) or {}).get("median_ms") for v in VARIANTS}
    ratio = lambda a, b: a / b if a and b else None  # noqa: E731
    cp = med["convpool_tf32"]
    row["speedup_tf32"] = ratio(med["eager_tf32"], cp)
    row["speedup_strict"] = ratio(med["eager_strict"], med["convpool_strict"])
    row["speedup_train"] = ratio(med["train_eager_tf32"], med["train_convpool_tf32"])
    row["speedup_train_strict"] = ratio(med["train_eager_strict"], med["train_convpool_strict"])
    row["speedup_grad_tf32"] = ratio(med["eager_tf32_grad"], med["convpool_tf32_grad"])
    row["speedup_grad_strict"] = ratio(med["eager_strict_grad"], med["convpool_strict_grad"])
    row["speedup_device"] = ratio(med["eager_tf32_device"], med["convpool_tf32_device"])
    row["vs_compile"] = ratio(med["compile"], cp)
    row["vs_unfused"] = ratio(med["unfused"], cp)
    if "batch" not in row:
        return
    k = triple(s.kernel)
    flops = 2.0 * row["batch"] * s.cout * s.cin * math.prod(k) * math.prod(conv_extent(s))
    x_bytes = float(math.prod(row["x_shape"]) * torch.empty(0, dtype=getattr(torch, s.dtype)).element_size())
    row["flops"] = flops
    row["x_bytes"] = x_bytes
    row["convpool_tf32_TFLOPs"] = flops / (cp * 1e-3) / 1e12 if cp else None
    if ceil:
        row["floor_ms"] = max(x_bytes / (ceil["copy_TBps"] * 1e12), flops / (ceil["tf32_TFLOPs"] * 1e12)) * 1e3
        row["pct_of_floor"] = 100 * row["floor_ms"] / cp if cp else None


# ----------------------------------------------------------------------------- outputs

def geomean(vals):
    vals = [v for v in vals if v]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def summary(rows):
    done = [r for r in rows if not r.get("skipped")]
    out = {}
    for key in ("speedup_tf32", "speedup_strict"):
        vals = [r for r in done if r.get(key)]
        out[key] = dict(geomean=geomean([r[key] for r in vals]), rows=len(vals),
                        min_row=min(vals, key=lambda r: r[key])["name"] if vals else None,
                        min=min((r[key] for r in vals), default=None))
    return out


def markdown(rows, meta, ceil):
    f = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    x = lambda v: "" if v is None else "x"  # noqa: E731

    def t(r, v):
        if v not in r["times"]:
            return "-"
        return "err" if r["times"][v] is None else f"{r['times'][v]['median_ms']:.4f}"

    lines = [f"GPU: {meta['gpu']}, {meta['date']}, rev {meta['rev']}, torch {meta['torch']}. "
             f"Command: `{meta['command']}`."]
    if ceil:
        lines.append(f"Ceilings: copy {ceil['copy_TBps']:.2f} TB/s (read + write), TF32 matmul "
                     f"{ceil['tf32_TFLOPs']:.0f} TFLOP/s, FP32 matmul {ceil['fp32_TFLOPs']:.1f} TFLOP/s.")
    lines += ["", "Times are medians in ms (L2 flushed, CUDA events). Speedups are eager / convpool at the "
              "same precision. % of floor: max(x read, FLOPs at the TF32 matmul rate) / convpool TF32. "
              "(!) marks a convpool accuracy warning.", "",
              "| row | x shape | Cout | kernel | pool | dtype | batch | eager tf32 | eager strict | compile "
              "| unfused | convpool tf32 | convpool strict | speedup tf32 | speedup strict | % of floor | plan |",
              "|" + "---|" * 17]
    done = [r for r in rows if not r.get("skipped")]
    for r in done:
        name = r["name"] + (" (!)" if r["accuracy_warning"] else "")
        shape = "x".join(map(str, r["x_shape"])) if "x_shape" in r else "-"
        plan = r.get("plan", "")
        if r.get("plan_strict"):
            plan += f" / strict: {r['plan_strict']}"
        plan = plan.replace("|", "\\|").replace("\n", "; ")
        lines.append(
            f"| {name} | {shape} | {r['cout']} | {r['kernel_str']} | {r['pool_str']} | {r['dtype']} "
            f"| {r.get('batch', '-')} | {t(r, 'eager_tf32')} | {t(r, 'eager_strict')} | {t(r, 'compile')} "
            f"| {t(r, 'unfused')} | {t(r, 'convpool_tf32')} | {t(r, 'convpool_strict')} "
            f"| {f(r.get('speedup_tf32'), '.2f')}{x(r.get('speedup_tf32'))} "
            f"| {f(r.get('speedup_strict'), '.2f')}{x(r.get('speedup_strict'))} "
            f"| {f(r.get('pct_of_floor'), '.1f')} | {plan} |")
    lines.append("")
    for key, label in (("speedup_tf32", "TF32"), ("speedup_strict", "strict")):
        s = summary(rows)[key]
        if s["geomean"]:
            lines.append(f"Geometric mean speedup, {label}: **{s['geomean']:.2f}x** over {s['rows']} rows; "
                         f"lowest {s['min']:.2f}x ({s['min_row']}).")
    split = [r for r in done if r.get("host_us")]
    if split:
        lines += ["", "Device time alone (host enqueueing hidden behind a spin kernel) and host time per call, "
                  "TF32. Wall time near host time means the row is bound by the host, not the GPU:", "",
                  "| row | batch | eager device ms | convpool device ms | device speedup | eager host us "
                  "| convpool host us |", "|---|---|---|---|---|---|---|"]
        for r in split:
            hu = r["host_us"]
            lines.append(f"| {r['name']} | {r.get('batch', '-')} | {t(r, 'eager_tf32_device')} "
                         f"| {t(r, 'convpool_tf32_device')} | {f(r.get('speedup_device'), '.2f')}{x(r.get('speedup_device'))} "
                         f"| {f(hu.get('eager_tf32'), '.1f')} | {f(hu.get('convpool_tf32'), '.1f')} |")
    graded = [r for r in done if r.get("speedup_grad_tf32") or r.get("speedup_grad_strict")]
    if graded:
        lines += ["", "The forward with grad mode on and the parameters requiring grad (the table above runs "
                  "under torch.no_grad): a user's plain model(x), which for ModelNew is its training "
                  "forward (it also writes the arg-max codes):", "",
                  "| row | batch | eager tf32 | convpool tf32 | speedup | eager strict | convpool strict | speedup |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['name']} | {r.get('batch', '-')} | {t(r, 'eager_tf32_grad')} | {t(r, 'convpool_tf32_grad')} "
                  f"| {f(r.get('speedup_grad_tf32'), '.2f')}{x(r.get('speedup_grad_tf32'))} "
                  f"| {t(r, 'eager_strict_grad')} | {t(r, 'convpool_strict_grad')} "
                  f"| {f(r.get('speedup_grad_strict'), '.2f')}{x(r.get('speedup_grad_strict'))} |"
                  for r in graded]
    trained = [r for r in done if r.get("speedup_train") or r.get("speedup_train_strict")]
    if trained:
        lines += ["", "Training step (forward, out.sum(), backward for x and every parameter):", "",
                  "| row | batch | eager tf32 ms | convpool tf32 ms | speedup | eager strict ms "
                  "| convpool strict ms | speedup |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['name']} | {r.get('batch', '-')} | {t(r, 'train_eager_tf32')} | {t(r, 'train_convpool_tf32')} "
                  f"| {f(r.get('speedup_train'), '.2f')}{x(r.get('speedup_train'))} "
                  f"| {t(r, 'train_eager_strict')} | {t(r, 'train_convpool_strict')} "
                  f"| {f(r.get('speedup_train_strict'), '.2f')}{x(r.get('speedup_train_strict'))} |"
                  for r in trained]
    # The product rule (no argument and no mode slower than the PyTorch block): every ratio
    # below 1 in one list, with the route the row took, so a run says at once what breaks it.
    rule = [("inference forward, TF32", "speedup_tf32"), ("inference forward, strict", "speedup_strict"),
            ("grad-enabled forward, TF32", "speedup_grad_tf32"), ("grad-enabled forward, strict", "speedup_grad_strict"),
            ("training step, TF32", "speedup_train"), ("training step, strict", "speedup_train_strict")]
    below = [(r, label, r[key]) for r in done for label, key in rule if r.get(key) and r[key] < 1.0]
    lines += ["", "Below eager (the product rule: no row and mode slower than the PyTorch block): "
              + ("none." if not below else f"{len(below)}:"), ""]
    lines += [f"- {r['name']} (batch {r.get('batch', '-')}), {label}: {v:.2f}x" for r, label, v in below]
    notes = []
    for r in done:
        if r["accuracy_warning"]:
            notes.append(f"- {r['name']}: accuracy warning: {'; '.join(r['accuracy_warning'])}")
        for k, v in r["errors"].items():
            notes.append(f"- {r['name']}: {k}: {v}")
        if r.get("error"):
            notes.append(f"- {r['name']}: row aborted: {r['error']}")
    skipped = [r for r in rows if r.get("skipped")]
    if skipped:
        notes.append(f"- not run: {', '.join(r['name'] for r in skipped)} ({skipped[0]['skipped']})")
    if notes:
        lines += ["", "Notes:"] + notes
    lines += ["", "Relative errors against float64 (max |out - ref| / max |ref|):", ""]
    lines += [f"- {r['name']}: {r.get('rel_err_str', '-')}" for r in done]
    return "\n".join(lines) + "\n"


def plot(rows, path, gpu):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    done = [r for r in rows if not r.get("skipped") and (r.get("speedup_tf32") or r.get("speedup_strict"))]
    if not done:
        return
    fig, ax = plt.subplots(figsize=(8, 1.5 + 0.35 * len(done)))
    ys = range(len(done))
    h = 0.38
    for off, key, label in ((-h / 2, "speedup_tf32", "TF32"), (h / 2, "speedup_strict", "strict")):
        ax.barh([y + off for y in ys], [r.get(key) or 0 for r in done], height=h, label=label)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_yticks(list(ys))
    ax.set_yticklabels([f"{r['name']} (B{r.get('batch', '?')})" for r in done])
    ax.invert_yaxis()
    ax.set_xlabel("speedup over PyTorch eager, same precision (x)")
    ax.set_title(f"convpool speedup by shape, {gpu}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(out, rows, meta, ceil):
    with open(os.path.join(out, "shapes.json"), "w") as f:
        json.dump(rows, f, indent=1)
    md = markdown(rows, meta, ceil)
    with open(os.path.join(out, "shapes_table.md"), "w") as f:
        f.write(md)
    try:
        plot(rows, os.path.join(out, "speedup_by_shape.png"), meta["gpu"])
    except Exception as e:  # a plot is not worth losing the run over
        print(f"# plot failed: {short(e)}", flush=True)
    return md


# ----------------------------------------------------------------------------- main

def name_list(text, ap, flag):
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in {s.name for s in SHAPES}]
    if unknown:
        ap.error(f"{flag}: unknown rows {unknown}; known: {', '.join(s.name for s in SHAPES)}")
    return set(names)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", help="comma-separated row names to run (default: all)")
    ap.add_argument("--probe-ms", type=float, default=PROBE_TARGET_MS,
                    help="pick each row's batch so eager TF32 takes at least this long (default 0.3)")
    ap.add_argument("--batch", default="",
                    help="row=N,... : run these rows at batch N instead of probing (to compare runs "
                         "at the batch an earlier table used)")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", default="out")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant")
    ap.add_argument("--train-rows", default="headline,k5,pool3,c32_c64",
                    help="comma-separated rows that also time a training step, 'all' for every row "
                         "(default: %(default)s)")
    ap.add_argument("--x-zero-half", action="store_true",
                    help="x is 0 in the first half of every row (a flat background: every window there "
                         "ties in every channel)")
    ap.add_argument("--compile-rows", help="comma-separated rows that get torch.compile (default: all)")
    ap.add_argument("--max-seconds", type=float, default=420.0,
                    help="start no new row (and no compile) after this many seconds (default 420)")
    args = ap.parse_args()
    globals()["PROBE_TARGET_MS"] = args.probe_ms
    for item in filter(None, args.batch.split(",")):
        name, _, n = item.partition("=")
        if not n.isdigit() or int(n) < 1:
            ap.error(f"--batch: {item!r} is not row=N with N >= 1")
        FIXED_BATCH[name] = int(n)
    name_list(",".join(FIXED_BATCH), ap, "--batch")
    selected = name_list(args.rows, ap, "--rows")
    args.compile_rows = name_list(args.compile_rows, ap, "--compile-rows")
    args.train_rows = None if args.train_rows == "all" else name_list(args.train_rows, ap, "--train-rows")
    globals()["X_ZERO_HALF"] = args.x_zero_half
    shapes = [(i, s) for i, s in enumerate(SHAPES) if selected is None or s.name in selected]
    if not torch.cuda.is_available():
        sys.exit("bench_shapes.py needs a CUDA GPU")
    os.makedirs(args.out, exist_ok=True)
    t_start = time.time()
    deadline = t_start + args.max_seconds

    meta = dict(gpu=torch.cuda.get_device_name(0), date=datetime.date.today().isoformat(), rev=revision(),
                command=shlex.join(sys.argv), torch=torch.__version__)
    timer = Timer(args.iters, args.warmup)
    probe_timer = Timer(5, 2)
    try:
        ceil = measure_ceilings(timer)
        print(f"# {meta['gpu']}  copy {ceil['copy_TBps']:.2f} TB/s  TF32 {ceil['tf32_TFLOPs']:.0f} TFLOP/s  "
              f"FP32 {ceil['fp32_TFLOPs']:.1f} TFLOP/s", flush=True)
    except Exception as e:
        ceil = None
        print(f"# ceilings failed, no floors: {short(e)}", flush=True)
    meta["ceilings"] = ceil
    set_precision(True)
    torch.cuda.empty_cache()

    try:
        import convpool
        t0 = time.time()
        meta["convpool_cuda"] = bool(convpool.load())
        print(f"# convpool loaded in {time.time() - t0:.1f}s, CUDA path: {meta['convpool_cuda']}", flush=True)
        if not meta["convpool_cuda"]:
            print("# WARNING: convpool has no CUDA path; ModelNew falls back to PyTorch ops", flush=True)
    except Exception as e:
        convpool = None
        print(f"# convpool unavailable, eager rows only: {short(e)}", flush=True)

    rows = []
    stop_reason = None
    for seed, s in shapes:
        if stop_reason is None and time.time() > deadline:
            stop_reason = f"past --max-seconds {args.max_seconds:g}"
        base = dict(name=s.name, cin=s.cin, cout=s.cout, d=s.d, h=s.h, w=s.w, kernel=list(triple(s.kernel)),
                    pool=list(triple(s.pool)), kernel_str=fmt_triple(s.kernel), pool_str=fmt_triple(s.pool),
                    dtype=s.dtype)
        if stop_reason:
            rows.append(dict(base, skipped=stop_reason, **meta))
            continue
        row = dict(base, times={}, errors={}, rel_err={}, tolerance={}, accuracy_warning=[])
        t0 = time.time()
        try:
            run_row(s, seed, row, args, timer, probe_timer, convpool, deadline)
        except Exception as e:
            row["error"] = short(e)
            print(f"# {s.name} aborted: {short(e)}", flush=True)
        set_precision(True)
        derive(row, s, ceil)
        row["seconds"] = round(time.time() - t0, 1)
        row.update(meta)
        rows.append(row)
        gc.collect()
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception as e:
            # A sticky CUDA error (e.g. an illegal address) poisons the context for every later row.
            stop_reason = f"CUDA context unusable after {s.name}: {short(e)}"
            print(f"# {stop_reason}", flush=True)
        write_outputs(args.out, rows, meta, ceil)
        print(f"# {s.name}: speedup tf32 {row.get('speedup_tf32') or float('nan'):.2f}x, strict "
              f"{row.get('speedup_strict') or float('nan'):.2f}x [{row['seconds']}s, "
              f"{time.time() - t_start:.0f}s total]", flush=True)

    skipped = [r["name"] for r in rows if r.get("skipped")]
    if skipped:
        print(f"# skipped ({stop_reason}): {', '.join(skipped)}", flush=True)
    md = write_outputs(args.out, rows, meta, ceil)
    print()
    print(md)


if __name__ == "__main__":
    main()
