"""The KernelBench export: one valid, self-contained file importing only torch, embedding the
repository's current sources, with KernelBench's problem definition; and the check command."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from convpool import _build, kernelbench

PYTHON_DIR = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    path = tmp_path_factory.mktemp("kb") / "convpool_kb.py"
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR))
    run = subprocess.run([sys.executable, "-m", "convpool.kernelbench", "export", "-o", str(path)],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return path


def imported_modules(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import in the export"
            yield node.module


def test_export_is_valid_python_importing_only_torch(exported):
    text = exported.read_text()
    tree = ast.parse(text)
    modules = set(imported_modules(tree))
    assert modules and all(m == "torch" or m.startswith("torch.") for m in modules), modules
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert {"ModelNew", "get_inputs", "get_init_inputs"} <= defined
    assert "Model" not in defined
    assert "load_inline" in text and "__global__" in text


def test_export_embeds_current_sources(exported):
    ctx: dict = {}
    exec(compile(exported.read_text(), str(exported), "exec"), ctx)  # defines; builds nothing
    units = _build.standalone_units()
    assert ctx["_CONVPOOL_CPP"] == units["cpp"]
    assert ctx["_CONVPOOL_CUDA"] == units["cuda"]
    assert ctx["_CONVPOOL_CUDA_STUB"] == units["cuda_stub"]
    for rel in _build.C_SOURCES + _build.CUDA_SOURCES:
        body = [ln for ln in _build.read_source(rel).splitlines() if not ln.lstrip().startswith("#include \"")]
        blob = ctx["_CONVPOOL_CUDA"] if rel.endswith(".cu") else ctx["_CONVPOOL_CPP"]
        assert "\n".join(body[-20:]) in blob, f"{rel} is not embedded verbatim"
    for blob in (ctx["_CONVPOOL_CPP"], ctx["_CONVPOOL_CUDA"]):
        assert '#include "convpool.h"' not in blob and '#include "internal.h"' not in blob
    assert ctx["OP_NAMESPACE"] == "convpool_kb_" + ctx["_CONVPOOL_KEY"]


def test_build_lists_every_library_source():
    # The extension's cache key hashes the listed files and the export pastes them: a header
    # left off HEADERS (src/cuda/wgmma.cuh was, for a day) would let an edit to it reuse a
    # stale cached build.
    root = _build.repo_root()
    listed = set(_build.HEADERS + _build.C_SOURCES + _build.CUDA_SOURCES + (_build.CUDA_STUB,))
    tree = {p.relative_to(root).as_posix() for d in ("include", "src") for p in (root / d).rglob("*")
            if p.suffix in (".h", ".cuh", ".c", ".cu")}
    assert tree == listed, f"not listed: {sorted(tree - listed)}; listed but gone: {sorted(listed - tree)}"


def test_export_problem_definition(exported):
    ctx: dict = {}
    exec(compile(exported.read_text(), str(exported), "exec"), ctx)
    assert ctx["get_init_inputs"]() == [8, 16, (3, 3, 3), 2.0, (2, 2, 2), (16, 1, 1, 1), 1]
    assert (ctx["batch_size"], ctx["in_channels"], ctx["depth"], ctx["height"], ctx["width"]) == (128, 8, 16, 64, 64)
    assert "torch.rand(batch_size, in_channels, depth, height, width)" in exported.read_text()


def test_strip_comments_keeps_lines_and_literals():
    src = 'int a; /* one\n two */ int b; // tail\nconst char *s = "/* not */ // kept"; char c = \'/\';\n'
    out = kernelbench.strip_c_comments(src)
    assert out.count("\n") == src.count("\n")
    assert '"/* not */ // kept"' in out and "'/'" in out and "one" not in out and "tail" not in out


def test_check_runs_on_cpu(exported):
    # KernelBench's protocol on the CPU with a small batch: the exported file builds its
    # CPU-only variant, 2 seeded trials must pass allclose(1e-4); timing is skipped without CUDA.
    lines = []
    status = kernelbench.check(exported, trials=2, batch_size=2,
                               device="cuda" if torch.cuda.is_available() else "cpu",
                               perf_trials=5, out=lines.append)
    assert status == 0, "\n".join(lines)
    assert any("correctness: 2/2" in ln for ln in lines), "\n".join(lines)


def test_build_errors_are_readable(tmp_path):
    # A broken source: load() raises BuildError quoting the compiler with the real file and line.
    root = tmp_path / "repo"
    (root / "src" / "cuda").mkdir(parents=True)
    (root / "include").mkdir()
    real = _build.repo_root()
    for rel in (_build.HEADERS + _build.C_SOURCES + _build.CUDA_SOURCES + (_build.CUDA_STUB,)):
        (root / rel).write_text((real / rel).read_text())
    (root / "src" / "cpu.c").write_text('#include "internal.h"\nint cp_broken(void) { return undeclared_name; }\n')
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR), CONVPOOL_ROOT=str(root),
               CONVPOOL_BUILD_CUDA="0", TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))
    code = "import convpool\ntry:\n    convpool.load()\nexcept convpool.BuildError as e:\n    print(e)\n"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert f"{root}/src/cpu.c:2:" in run.stdout and "undeclared_name" in run.stdout, run.stdout + run.stderr
    assert "Full log:" in run.stdout
    assert run.stderr.count("convpool: building") == 1, run.stderr
