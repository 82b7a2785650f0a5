"""KernelBench export and check for convpool (level 2, problem 8).

    python -m convpool.kernelbench export [-o FILE] [--strip-comments]
    python -m convpool.kernelbench check FILE [--trials 5] [--perf-trials 100] [--seed 42]
                                              [--device cuda|cpu] [--batch-size N]
    python -m convpool.kernelbench reference [-o FILE]

export writes one self-contained Python file in KernelBench's format: it imports only torch (and
torch.utils.cpp_extension), embeds the repository's sources as string literals (binding.cpp,
src/problem.c, src/reference.c, src/cpu.c, src/cuda_stub.c and src/cuda/*.cu, with the
project headers pasted in), builds them with load_inline on first use, and defines ModelNew,
get_inputs and get_init_inputs exactly as KernelBench's problem file does. ModelNew is the
package's own code (convpool/_ops.py), embedded too, under its own op namespace
(convpool_kb_<hash>) so it can live in one process with the package.

check runs KernelBench's evaluation protocol (src/kernelbench/eval.py and timing.py) against the
reference Model:
  - the file is exec'd into a fresh namespace, as KernelBench's load_custom_model does;
  - both models are built under torch.no_grad() after torch.manual_seed(seed);
  - correctness: `trials` input sets, each from its own seed drawn from the base seed; a shape
    check, then torch.allclose(atol=rtol=1e-4) (KernelBench's fp32 tolerance);
  - performance (CUDA only): CUDA events around each call with the L2 flushed before it (a
    256 MiB fill), 3 warm-up calls, the first timed call discarded, `perf-trials` timed calls.
    ModelNew is timed as eval_kernel_against_ref does (grad mode on), the references as
    measure_ref_program_time does (under no_grad, 5 warm-ups): PyTorch eager and torch.compile
    (inductor, default mode). Prints the speedups over both.
  - TF32: left at PyTorch's defaults, which KernelBench does not change: cuDNN convolutions may
    use TF32 (torch.backends.cudnn.allow_tf32 = True), so the reference's nn.Conv3d runs in TF32
    and ModelNew, which follows the same flag, does too. The flags in force are printed.
On a machine without CUDA, check runs the correctness part on the CPU (the exported file then
builds its CPU-only variant), says that timing needs CUDA, and exits 0 if correct.
--batch-size shrinks the batch (a deviation from the protocol, for quick CPU runs).
Exit status: 0 correct (and timed, on CUDA), 1 incorrect, 2 usage or build errors.
"""
import argparse
import ast
import hashlib
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from . import _build

# KernelBench level 2 problem 8, as the benchmark writes it.
REFERENCE_SRC = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Model that performs a 3D convolution, divides by a constant, applies max pooling,
    global average pooling, adds a bias term, and sums along a specific dimension.
    """
    def __init__(self, in_channels, out_channels, kernel_size, divisor, pool_size, bias_shape, sum_dim):
        super(Model, self).__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.divisor = divisor
        self.max_pool = nn.MaxPool3d(pool_size)
        self.global_avg_pool = nn.AdaptiveAvgPool3d((1, 1, 1))
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.sum_dim = sum_dim

    def forward(self, x):
        x = self.conv(x)
        x = x / self.divisor
        x = self.max_pool(x)
        x = self.global_avg_pool(x)
        x = x + self.bias
        x = torch.sum(x, dim=self.sum_dim)
        return x

''' + '''batch_size = 128
in_channels = 8
out_channels = 16
depth, height, width = 16, 64, 64
kernel_size = (3, 3, 3)
divisor = 2.0
pool_size = (2, 2, 2)
bias_shape = (out_channels, 1, 1, 1)
sum_dim = 1


def get_inputs():
    return [torch.rand(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, divisor, pool_size, bias_shape, sum_dim]
'''

PROBLEM_TAIL = REFERENCE_SRC[REFERENCE_SRC.index("batch_size = 128"):]

_HEADER = '''"""convpool for KernelBench level 2 problem 8 (Conv3d, divide, MaxPool3d, global
average pool, bias add, sum).

ModelNew runs the whole block as one fused kernel: the convolution output never reaches memory.
The C/CUDA sources below are the convpool repository's own ({sources}), with the project
headers pasted in, embedded by `python -m convpool.kernelbench export`{revision}. Regenerate
this file rather than edit it.

Build: torch.utils.cpp_extension.load_inline on the first ModelNew(), cached by torch under
the name convpool_kb_<cuda|cpu>_{key}. With a CUDA device and nvcc it builds the CUDA path;
otherwise a CPU-only build (OpenMP).
Precision: float32 input uses TF32 tensor-core products when torch.backends.cudnn.allow_tf32 is
set (PyTorch's default, under which the reference nn.Conv3d uses TF32 too), FP32-accurate ones
otherwise. float16/bfloat16 are served by the kernel too. PyTorch ops (F.conv3d and friends)
appear below only for float64 input (an exact composite of Model's own ops) and in the
gradient formula, which recomputes the forward with them; the forward of float32/16-bit input
runs in the kernel alone.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils import cpp_extension

_CONVPOOL_KEY = "{key}"

# python/convpool/csrc/binding.cpp, src/problem.c, src/reference.c, src/cpu.c
_CONVPOOL_CPP = {cpp}

# src/cuda_stub.c (CPU-only builds)
_CONVPOOL_CUDA_STUB = {stub}

# src/cuda/*.cu (the kernel families, plan.cu first)
_CONVPOOL_CUDA = {cuda}


def _load_extension():
    """Compile (once; torch caches the build) and load the kernels: (True if CUDA is built,
    the extension's Python module)."""
    with_cuda = torch.cuda.is_available() and cpp_extension.CUDA_HOME is not None
    cflags = ["-O3", "-fopenmp", "-DCONVPOOL_OP_NAMESPACE=convpool_kb_" + _CONVPOOL_KEY]
    cuda_cflags = ["-O3", "-DCONVPOOL_HAVE_CUDA=1"]
    if with_cuda:
        cflags.append("-DCONVPOOL_HAVE_CUDA=1")
        # sm_90 code as sm_90a (the wgmma kernel; convpool/_build.py cuda_arch_flags says why).
        arch_of = getattr(cpp_extension, "_get_cuda_arch_flags", lambda: [])
        arch = [f.replace("compute_90,code=sm_90", "compute_90a,code=sm_90a") if f.endswith("compute_90,code=sm_90")
                else f for f in arch_of()]
        if any(f.endswith("code=sm_90a") for f in arch) and not any(f.endswith("code=sm_90") for f in arch):
            arch.append("-DCONVPOOL_HAVE_SM90A=1")
        cuda_cflags += arch
    kwargs = dict()
    if "no_implicit_headers" in cpp_extension.load_inline.__code__.co_varnames:
        kwargs["no_implicit_headers"] = True
    module = cpp_extension.load_inline(
        name="convpool_kb_" + ("cuda_" if with_cuda else "cpu_") + _CONVPOOL_KEY,
        cpp_sources=[_CONVPOOL_CPP if with_cuda else _CONVPOOL_CPP + _CONVPOOL_CUDA_STUB],
        cuda_sources=[_CONVPOOL_CUDA] if with_cuda else None,
        extra_cflags=cflags,
        extra_cuda_cflags=cuda_cflags if with_cuda else None,
        extra_ldflags=["-fopenmp"],
        with_cuda=with_cuda,
        is_python_module=True,
        verbose=False,
        **kwargs,
    )
    return with_cuda, module


# ---------------------------------------------------------------- python/convpool/_ops.py
'''

_OPS_BEGIN = "# ---- package-only begin"
_OPS_END = "# ---- package-only end"
_OPS_NAMESPACE_LINE = 'OP_NAMESPACE = "convpool"'


def _ops_text(namespace: str) -> str:
    """convpool/_ops.py as the export embeds it: standalone, under its own op namespace."""
    text = (Path(__file__).resolve().parent / "_ops.py").read_text(encoding="utf-8")
    begin, end = text.index(_OPS_BEGIN), text.index(_OPS_END)
    text = text[:begin] + text[end + len(_OPS_END):].lstrip("\n")
    if text.count(_OPS_NAMESPACE_LINE) != 1:
        raise RuntimeError(f"convpool/_ops.py must contain the line {_OPS_NAMESPACE_LINE!r} once")
    return text.replace(_OPS_NAMESPACE_LINE, f'OP_NAMESPACE = "{namespace}"')


def _py_literal(text: str) -> str:
    """A Python literal for text: a raw triple-quoted string when that round-trips."""
    raw = 'r"""' + text + '"""'
    if '"""' not in text and not text.endswith("\\"):
        if ast.literal_eval(raw) == text:
            return raw
    lines = text.splitlines(keepends=True)
    return "(\n" + "\n".join("    " + repr(line) for line in lines) + "\n)"


_C_TOKEN = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.DOTALL)


def strip_c_comments(text: str) -> str:
    """text without C/C++ comments; string and char literals and line numbers kept."""
    def repl(m):
        s = m.group(0)
        if s.startswith("/"):
            return "\n" * s.count("\n") if s.startswith("/*") else ""
        return s
    return _C_TOKEN.sub(repl, text)


def _git_revision(root: Path) -> str:
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "src",
                                "include", "python/convpool"], capture_output=True, text=True,
                               timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    if out.returncode != 0:
        return ""
    return out.stdout.strip() + ("+local changes" if dirty.stdout.strip() else "")


def export_source(root=None, strip_comments: bool = False) -> str:
    """The text of the KernelBench file."""
    root = Path(root) if root else _build.repo_root()
    units = _build.standalone_units(root)
    if strip_comments:
        units = {k: strip_c_comments(v) for k, v in units.items()}
    key = hashlib.sha256("\0".join([units["cpp"], units["cuda_stub"], units["cuda"],
                                    _ops_text("convpool_kb")]).encode("utf-8")).hexdigest()[:12]
    revision = _git_revision(root)
    values = {"sources": "src/, include/, python/convpool/csrc/",
              "revision": f" at revision {revision}" if revision else "", "key": key,
              "cpp": _py_literal(units["cpp"]), "stub": _py_literal(units["cuda_stub"]),
              "cuda": _py_literal(units["cuda"])}
    header = re.sub(r"\{(sources|revision|key|cpp|stub|cuda)\}", lambda m: values[m.group(1)],
                    _HEADER)
    body = _ops_text(f"convpool_kb_{key}")
    rule = "# " + "-" * 64 + " the problem (KernelBench level 2 #8)"
    return header + body.rstrip("\n") + "\n\n\n" + rule + "\n" + PROBLEM_TAIL


def export(path=None, strip_comments: bool = False) -> str:
    text = export_source(strip_comments=strip_comments)
    compile(text, path or "<convpool export>", "exec")
    if path:
        Path(path).write_text(text, encoding="utf-8")
    return text


# ----------------------------------------------------------------------------- static scan

_BYPASS_PATTERNS = [(r"\btry\s*:", "try-except"), (r"\bexcept\s*:", "try-except"),
                    (r"\bexcept\s+\w+", "try-except"), (r"\bpass\b", "'pass'")]


def static_findings(text: str) -> list:
    """Lines KernelBench's static checker (kernel_static_checker.check_code_bypass) would flag.

    Like the checker, this strips only '#' and '//' comments, so words in C block comments count.
    """
    found = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        for marker in ("#", "//"):
            if marker in line:
                line = line[:line.index(marker)]
        for pattern, what in _BYPASS_PATTERNS:
            if re.search(pattern, line):
                found.append(f"line {lineno}: {what}: {line.strip()[:80]}")
    return found


# ----------------------------------------------------------------------------- check

def _timing_stats(times_ms):
    return {"mean": statistics.fmean(times_ms), "std": statistics.pstdev(times_ms),
            "min": min(times_ms), "max": max(times_ms), "median": statistics.median(times_ms),
            "num_trials": len(times_ms)}


def _time_cuda_events(fn, args, device, num_warmup=3, num_trials=100, discard_first=1):
    """KernelBench's time_execution_with_cuda_event: cold L2, one call per event pair."""
    import torch

    with torch.cuda.device(device):
        for _ in range(num_warmup):
            fn(*args)
            torch.cuda.synchronize(device=device)
        torch.cuda.empty_cache()
        times = []
        for trial in range(num_trials + discard_first):
            torch.cuda.synchronize(device=device)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            dummy = torch.empty((32, 1024, 1024), dtype=torch.int64, device=device)
            dummy.fill_(42)  # flush L2 (256 MiB)
            del dummy
            start.record()
            fn(*args)
            end.record()
            torch.cuda.synchronize(device=device)
            if trial >= discard_first:
                times.append(start.elapsed_time(end))
    return times


def _set_seed(seed):
    import torch

    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed(seed)


def check(path, trials=5, perf_trials=100, seed=42, device=None, batch_size=None, out=print) -> int:
    import torch

    source = Path(path).read_text(encoding="utf-8")
    ref_src = REFERENCE_SRC
    if batch_size is not None:
        ref_src = ref_src.replace("batch_size = 128", f"batch_size = {int(batch_size)}")
    ref_ctx: dict = {}
    exec(compile(ref_src, "<KernelBench level 2 #8 reference>", "exec"), ref_ctx)
    Model, get_inputs = ref_ctx["Model"], ref_ctx["get_inputs"]
    get_init_inputs = ref_ctx["get_init_inputs"]

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        out("check: --device cuda but no CUDA device is available")
        return 2
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    out(f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; "
        f"torch {torch.__version__}")
    out(f"TF32 flags: torch.backends.cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}, "
        f"torch.backends.cuda.matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32} "
        "(KernelBench leaves PyTorch's defaults)")
    findings = static_findings(source)
    if findings:
        out(f"note: KernelBench's static bypass check would flag {len(findings)} line(s) "
            "(export --strip-comments removes those in C comments):")
        for f in findings[:10]:
            out(f"  {f}")

    # Load the custom file as KernelBench's load_custom_model does: exec into a fresh dict.
    context: dict = {}
    t0 = time.perf_counter()
    exec(compile(source, str(path), "exec"), context)
    ModelNew = context.get("ModelNew")
    if ModelNew is None:
        out(f"check: {path} defines no ModelNew")
        return 2
    kb_get_inputs = context.get("get_inputs")
    kb_get_init = context.get("get_init_inputs")
    if kb_get_inputs is None or kb_get_init is None:
        out(f"check: {path} lacks get_inputs/get_init_inputs")
        return 2

    _set_seed(seed)
    init_inputs = get_init_inputs()
    if list(kb_get_init()) != list(init_inputs) and batch_size is None:
        out(f"check: get_init_inputs differs from KernelBench's: {kb_get_init()} vs {init_inputs}")
        return 1
    with torch.no_grad():
        _set_seed(seed)
        ref = Model(*init_inputs)
        _set_seed(seed)
        new = ModelNew(*init_inputs)  # builds the extension on first use
        ref = ref.to(device=device, dtype=torch.float32)
        new = new.to(device=device, dtype=torch.float32)
    out(f"ModelNew built and loaded in {time.perf_counter() - t0:.1f} s")

    _set_seed(seed)
    trial_seeds = [torch.randint(0, 2 ** 32 - 1, (1,)).item() for _ in range(trials)]
    passed = 0
    with torch.no_grad():
        for i, trial_seed in enumerate(trial_seeds):
            _set_seed(trial_seed)
            inputs = [t.to(device=device, dtype=torch.float32) if isinstance(t, torch.Tensor) else t
                      for t in get_inputs()]
            expected = ref(*inputs)
            got = new(*inputs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if got.shape != expected.shape:
                out(f"trial {i}: FAIL shape {tuple(got.shape)} != {tuple(expected.shape)}")
                return 1
            diff = (got.float() - expected.float()).abs()
            ok = torch.allclose(got, expected, atol=1e-4, rtol=1e-4)
            passed += bool(ok)
            out(f"trial {i} (seed {trial_seed}): {'pass' if ok else 'FAIL'}  max|diff| "
                f"{diff.max().item():.3e}  mean|diff| {diff.mean().item():.3e}")
    out(f"correctness: {passed}/{trials} trials within atol=rtol=1e-4")
    if passed != trials:
        return 1
    if device.type != "cuda":
        out("performance: skipped, timing needs a CUDA device (correctness ran on the CPU)")
        return 0

    _set_seed(seed)
    inputs = [t.to(device=device, dtype=torch.float32) if isinstance(t, torch.Tensor) else t
              for t in get_inputs()]
    rows = {}
    rows["ModelNew"] = _timing_stats(_time_cuda_events(new, inputs, device, num_trials=perf_trials))
    with torch.no_grad():
        rows["ModelNew (no_grad)"] = _timing_stats(
            _time_cuda_events(new, inputs, device, num_trials=perf_trials))
        rows["PyTorch eager"] = _timing_stats(
            _time_cuda_events(ref, inputs, device, num_warmup=5, num_trials=perf_trials))
        torch._dynamo.reset()
        compiled = torch.compile(ref, backend="inductor", mode="default")
        rows["torch.compile"] = _timing_stats(
            _time_cuda_events(compiled, inputs, device, num_warmup=5, num_trials=perf_trials))
    out(f"performance over {perf_trials} trials (ms, CUDA events, L2 flushed before each):")
    for name, s in rows.items():
        out(f"  {name:20s} mean {s['mean']:.4f}  median {s['median']:.4f}  std {s['std']:.4f}  "
            f"min {s['min']:.4f}  max {s['max']:.4f}")
    new_ms = rows["ModelNew"]["mean"]
    out(f"speedup over eager:         {rows['PyTorch eager']['mean'] / new_ms:.2f}x")
    out(f"speedup over torch.compile: {rows['torch.compile']['mean'] / new_ms:.2f}x")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m convpool.kernelbench",
                                     description="KernelBench export and check for convpool")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_export = sub.add_parser("export", help="write the self-contained KernelBench file")
    p_export.add_argument("-o", "--output", help="file to write (default: stdout)")
    p_export.add_argument("--strip-comments", action="store_true",
                          help="drop C/CUDA comments from the embedded sources")
    p_check = sub.add_parser("check", help="run KernelBench's protocol on FILE against Model")
    p_check.add_argument("file")
    p_check.add_argument("--trials", type=int, default=5)
    p_check.add_argument("--perf-trials", type=int, default=100)
    p_check.add_argument("--seed", type=int, default=42)
    p_check.add_argument("--device", choices=["cuda", "cpu"])
    p_check.add_argument("--batch-size", type=int,
                         help="override batch_size (deviates from the protocol; quick CPU runs)")
    p_ref = sub.add_parser("reference", help="write KernelBench's reference problem file")
    p_ref.add_argument("-o", "--output")
    args = parser.parse_args(argv)

    if args.cmd == "export":
        text = export(args.output, strip_comments=args.strip_comments)
        if args.output:
            print(f"wrote {args.output} ({len(text)} bytes)", file=sys.stderr)
        else:
            sys.stdout.write(text)
        return 0
    if args.cmd == "reference":
        if args.output:
            Path(args.output).write_text(REFERENCE_SRC, encoding="utf-8")
        else:
            sys.stdout.write(REFERENCE_SRC)
        return 0
    if not os.path.isfile(args.file):
        print(f"check: no such file: {args.file}", file=sys.stderr)
        return 2
    try:
        return check(args.file, trials=args.trials, perf_trials=args.perf_trials, seed=args.seed,
                     device=args.device, batch_size=args.batch_size)
    except RuntimeError as e:
        if "Error building extension" not in str(e):
            raise
        print(f"check: building {args.file} failed. Compiler errors:\n"
              f"{_build._compiler_errors(str(e))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
