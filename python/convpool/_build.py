"""Builds the convpool PyTorch extension from the repository's own sources.

One copy of each source: the extension is compiled with torch.utils.cpp_extension.load from
the text of the library files, read at run time from ``<root>/include`` and ``<root>/src`` and
written into the build directory (only when their text changed, so ninja's incremental build
stays a no-op for a built version).
The root is ``CONVPOOL_ROOT`` if set; else ``convpool/_lib`` inside an installed wheel (setup.py
copies include/ and src/ there when it builds the wheel); else the checkout this package sits in
(``python/convpool/../../``, an editable install).

  C++ translation unit: python/convpool/csrc/binding.cpp + src/problem.c + src/reference.c +
                        src/cpu.c (+ src/cuda_stub.c in CPU-only builds), compiled as C++.
  CUDA translation units: the kernel families src/cuda/*.cu (CUDA_SOURCES), one each, as the
                        CMake build compiles them (CUDA builds only), so ninja compiles them in
                        parallel (MAX_JOBS, default every core): the kernel files hold many
                        template instances each and one concatenated unit took minutes.

Each unit is preceded by a ``#line`` directive, so compiler errors name the real file and line.
The C sources share one translation unit, so macros a .c file defines are #undef'd after it;
static names must not clash across src/*.c.

CUDA is built when torch sees a GPU and nvcc is found (CUDA_HOME); otherwise a CPU-only build.
``CONVPOOL_BUILD_CUDA=1`` forces the CUDA build (for compile checks on a machine without a GPU;
the arch then defaults to TORCH_CUDA_ARCH_LIST or 9.0), ``CONVPOOL_BUILD_CUDA=0`` forces CPU-only.

The build is cached by torch in its extension directory (``TORCH_EXTENSIONS_DIR`` or
``~/.cache/torch_extensions/<py><cu>/``) under a name that carries a hash of every source text and
flag, so it happens once per source version, across processes. The first build prints one line
to stderr.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import re
import sys
from pathlib import Path

import torch

PACKAGE_DIR = Path(__file__).resolve().parent
GLUE = PACKAGE_DIR / "csrc" / "binding.cpp"

C_SOURCES = ("src/problem.c", "src/reference.c", "src/cpu.c", "src/cpu_backward.c")
CUDA_SOURCES = ("src/cuda/plan.cu", "src/cuda/finish.cu", "src/cuda/pack.cu", "src/cuda/pad.cu", "src/cuda/backward.cu",
                "src/cuda/k3p2.cu", "src/cuda/k3p2_sm90.cu",
                "src/cuda/group.cu", "src/cuda/general.cu", "src/cuda/generic.cu")
CUDA_STUB = "src/cuda_stub.c"
HEADERS = ("include/convpool.h", "src/internal.h", "src/cuda/common.cuh", "src/cuda/tile.cuh",
           "src/cuda/wgmma.cuh", "src/cuda/kernels.h")

# The C++ standard is torch's own (C++20 for torch 2.15); the sources are C++17-clean.
# x86-64-v2 (SSE4.2, no FMA: the same floating-point results) as the CMake build uses, so the
# library and the extension vectorize the same loops (the AVX2/AVX-512 kernels pick themselves
# at run time either way).
CFLAGS = ["-O3", "-fopenmp"] + (["-march=x86-64-v2"] if platform.machine() in ("x86_64", "AMD64") else [])
CUDA_CFLAGS = ["-O3"]
LDFLAGS = ["-fopenmp"]


class BuildError(RuntimeError):
    """The extension failed to compile; the message carries the compiler's errors."""


class SourcesNotFoundError(RuntimeError):
    """The repository's C/CUDA sources are not where the package expects them."""


def _has_sources(root: Path) -> bool:
    return (root / "src" / "problem.c").is_file() and (root / "include" / "convpool.h").is_file()


def repo_root() -> Path:
    """The folder holding include/ and src/: CONVPOOL_ROOT, the wheel's copy, or the checkout."""
    env = os.environ.get("CONVPOOL_ROOT")
    if env:
        root = Path(env).resolve()
    elif _has_sources(PACKAGE_DIR / "_lib"):
        root = PACKAGE_DIR / "_lib"
    else:
        root = PACKAGE_DIR.parents[1]
    if not _has_sources(root):
        raise SourcesNotFoundError(
            f"convpool: the library sources are not under {root} (expected src/problem.c and "
            "include/convpool.h). A wheel carries them in convpool/_lib; an editable install "
            "(pip install -e . at the repository root) reads the checkout; CONVPOOL_ROOT "
            "overrides both.")
    return root


def read_source(rel: str, root: Path | None = None) -> str:
    root = root or repo_root()
    path = root / rel
    if not path.is_file():
        raise SourcesNotFoundError(f"convpool: missing source file {path}")
    return path.read_text(encoding="utf-8")


def cuda_build_wanted() -> tuple[bool, str]:
    """(build the CUDA path?, why) from the environment, torch and the toolkit."""
    forced = os.environ.get("CONVPOOL_BUILD_CUDA", "").strip()
    if forced == "0":
        return False, "CONVPOOL_BUILD_CUDA=0"
    cpp_extension = _quiet_cpp_extension()

    nvcc_ok = cpp_extension.CUDA_HOME is not None and torch.version.cuda is not None
    if forced == "1":
        if not nvcc_ok:
            raise BuildError("convpool: CONVPOOL_BUILD_CUDA=1 but torch has no CUDA or nvcc "
                             "(CUDA_HOME) was not found")
        return True, "CONVPOOL_BUILD_CUDA=1"
    if not torch.cuda.is_available():
        return False, "no CUDA device visible to torch"
    if not nvcc_ok:
        return False, "no nvcc (CUDA_HOME) found"
    return True, "CUDA device and nvcc found"


_DEFINE_RE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)


def unit(rel: str, text: str, line_name: str, undef_macros: bool) -> str:
    """One source as a block of a shared translation unit."""
    parts = [f'#line 1 "{line_name}"', text.rstrip("\n")]
    if undef_macros:
        names = dict.fromkeys(n for n in _DEFINE_RE.findall(text) if not re.match(r"_[A-Z_]", n))
        if names:
            parts.append(f"/* end of {rel}: its macros are file-local */")
            parts.extend(f"#undef {n}" for n in names)
    return "\n".join(parts) + "\n"


def translation_units(with_cuda: bool, root: Path | None = None) -> tuple[str, list]:
    """(C++ source, [(file stem, CUDA source)] or []) as the extension compiles them: project
    headers come from the include paths; #line names the files in the checkout."""
    root = root or repo_root()
    blocks = [unit("binding.cpp", GLUE.read_text(encoding="utf-8"), str(GLUE), undef_macros=False)]
    c_files = list(C_SOURCES) + ([] if with_cuda else [CUDA_STUB])
    blocks += [unit(rel, read_source(rel, root), str(root / rel), undef_macros=True)
               for rel in c_files]
    cpp = "\n".join(blocks)
    cus = [(Path(rel).stem, unit(rel, read_source(rel, root), str(root / rel), undef_macros=False))
           for rel in CUDA_SOURCES] if with_cuda else []
    return cpp, cus


def _write_if_changed(path: str, text: str) -> None:
    """Writes text to path unless it holds that text already (ninja rebuilds on a newer mtime)."""
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    except OSError:
        pass
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


_QUOTED_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[ \t]*(?://.*|/\*.*\*/[ \t]*)?$')


def _inline_includes(text: str, rel: str, root: Path, seen: set) -> str:
    """text with each project header it includes pasted in (once per translation unit),
    #line directives keeping compiler messages on the original files."""
    here = (root / rel).parent
    out: list[str] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        m = _QUOTED_INCLUDE.match(line)
        if not m:
            out.append(line)
            continue
        target = None
        for base in (here, root / "include", root / "src"):
            if (base / m.group(1)).is_file():
                target = (base / m.group(1)).resolve()
                break
        if target is None:
            out.append(line)  # not a project header; left for the compiler
            continue
        target_rel = target.relative_to(root.resolve()).as_posix()
        if target_rel not in seen:
            seen.add(target_rel)
            out.append(f'#line 1 "{target_rel}"')
            out.append(_inline_includes(target.read_text(encoding="utf-8"), target_rel, root, seen))
        out.append(f'#line {lineno + 1} "{rel}"')
    return "\n".join(out)


def standalone_units(root: Path | None = None) -> dict:
    """Self-contained sources for a single-file build (the KernelBench export): project headers
    pasted in, #line naming repository-relative paths.

    Returns {"cpp": binding + C sources, "cuda_stub": the stub for CPU-only builds (appended to
    cpp), "cuda": the CUDA source}.
    """
    root = root or repo_root()
    seen: set = set()
    glue_rel = "python/convpool/csrc/binding.cpp"
    blocks = [f'#line 1 "{glue_rel}"\n' + _inline_includes(GLUE.read_text(encoding="utf-8"),
                                                          glue_rel, root, seen)]
    for rel in C_SOURCES:
        blocks.append(unit(rel, _inline_includes(read_source(rel, root), rel, root, seen), rel,
                           undef_macros=True))
    stub = unit(CUDA_STUB, _inline_includes(read_source(CUDA_STUB, root), CUDA_STUB, root, seen),
                CUDA_STUB, undef_macros=True)
    cuda_seen: set = set()
    cuda = "\n".join(unit(rel, _inline_includes(read_source(rel, root), rel, root, cuda_seen), rel,
                          undef_macros=False) for rel in CUDA_SOURCES)
    return {"cpp": "\n".join(blocks), "cuda_stub": stub, "cuda": cuda}


def _arch_env(with_cuda: bool) -> None:
    """Without a visible GPU torch cannot pick an arch; default to Hopper (what CMake builds)."""
    if with_cuda and not torch.cuda.is_available() and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"


def cuda_arch_flags(flags: list) -> list:
    """torch's -gencode flags with sm_90 machine code made sm_90a, plus -DCONVPOOL_HAVE_SM90A=1
    when no plain sm_90 code is left beside it (as CMakeLists.txt decides): every cc 9.0 GPU
    runs sm_90a code, which admits the wgmma kernel of src/cuda/k3p2_sm90.cu; with both images
    present the driver could load the plain one, whose wgmma body is empty."""
    out = [f.replace("arch=compute_90,code=sm_90", "arch=compute_90a,code=sm_90a") if
           f.endswith("arch=compute_90,code=sm_90") else f for f in flags]
    if any(f.endswith("code=sm_90a") for f in out) and not any(f.endswith("code=sm_90") for f in out):
        out.append("-DCONVPOOL_HAVE_SM90A=1")
    return out


def _quiet_cpp_extension():
    """Import cpp_extension without its 'No CUDA runtime is found' warning on CPU machines."""
    log = logging.getLogger("torch.utils.cpp_extension")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension
    finally:
        log.setLevel(level)
    return cpp_extension


_ERROR_LINE = re.compile(r"(error|Error|undefined reference|multiple definition|fatal)")


def _compiler_errors(log: str, limit: int = 80) -> str:
    """The lines of a ninja/gcc/nvcc log that say what failed, with gcc's context lines."""
    # torch prefixes ninja's output with "Error building extension 'name': ", on the line of the
    # first compile command.
    log = re.sub(r"^Error building extension '[^']*':\s*", "", log)
    lines = log.splitlines()
    keep: list[str] = []
    i = 0
    while i < len(lines) and len(keep) < limit:
        line = lines[i]
        is_cmd = line.startswith("[") and ("c++ " in line or "nvcc " in line or "g++ " in line)
        if _ERROR_LINE.search(line) and not is_cmd and not line.startswith("FAILED:"):
            keep.append(line)
            # gcc prints the offending source line and a caret after an error.
            for extra in lines[i + 1:i + 3]:
                if extra.startswith(" ") and not _ERROR_LINE.search(extra):
                    keep.append(extra)
        i += 1
    return "\n".join(keep) if keep else "\n".join(lines[-40:])


def _build_key(cpp: str, cu: str | None, flags: list) -> str:
    h = hashlib.sha256()
    for part in (cpp, cu or "", repr(flags), torch.__version__, str(torch.version.cuda),
                 sys.version):
        h.update(part.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _build_guard(build_dir: str, cpp_extension):
    """Holds a build against a stale lock file of an older torch.

    Torches whose cpp_extension uses a FileBaton (2.11 among them) mark a build in progress by
    creating ``<build_dir>/lock`` and make every other process wait, without a time limit, until
    that file is gone. A build killed part-way (Ctrl-C on the first import, a job's time limit)
    leaves the file, and every later import of convpool hangs: a device run of this project
    waited ~400 s on the lock of a build that the previous run's time limit had killed. Here
    each convpool build of the directory first takes an advisory lock (flock) of
    ``<build_dir>/convpool.flock``, which the kernel releases when its holder dies; holding it,
    no other convpool process is building, so a ``lock`` file in the directory is stale and is
    removed. Torches that lock with FileLock (an OS lock; 2.15 here) need none of this, nor do
    systems without fcntl."""
    baton_torch = hasattr(cpp_extension, "FileBaton") and not hasattr(cpp_extension, "FileLock")
    try:
        import fcntl
    except ImportError:
        fcntl = None
    if not baton_torch or fcntl is None:
        yield
        return
    os.makedirs(build_dir, exist_ok=True)
    with open(os.path.join(build_dir, "convpool.flock"), "a") as guard:
        try:
            fcntl.flock(guard, fcntl.LOCK_EX)
        except OSError:  # a file system without flock: torch's own file alone, as before
            yield
            return
        try:
            baton = os.path.join(build_dir, "lock")
            if os.path.exists(baton):
                print(f"convpool: removing {baton}, left by a build that did not finish",
                      file=sys.stderr, flush=True)
                with contextlib.suppress(FileNotFoundError):
                    os.remove(baton)
            yield
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)


_LOADED: dict = {}


def load_extension():
    """Compile (once, cached) and load the extension; returns (True if it has the CUDA path,
    the extension's Python module).

    Loading registers the C++ ops (torch.ops.convpool.*); the module holds
    block_inference_direct, ModelNew's per-call entry (binding.cpp).
    """
    if "cuda" in _LOADED:
        return _LOADED["cuda"], _LOADED["module"]
    with_cuda, why = cuda_build_wanted()
    root = repo_root()
    cpp, cus = translation_units(with_cuda, root)
    cu = "".join(f"/* {stem} */\n{text}" for stem, text in cus)
    cflags = CFLAGS + (["-DCONVPOOL_HAVE_CUDA=1"] if with_cuda else [])
    cuda_cflags = CUDA_CFLAGS + ["-DCONVPOOL_HAVE_CUDA=1"] if with_cuda else []
    includes = [str(root / "include"), str(root / "src"), str(root / "src" / "cuda")]
    _arch_env(with_cuda)
    cpp_extension = _quiet_cpp_extension()
    # The arch torch compiles for (TORCH_CUDA_ARCH_LIST, else the visible GPUs' capabilities),
    # passed explicitly so sm_90 becomes sm_90a (torch adds no arch flags of its own then). A
    # torch without the private helper builds its own default: plain sm_90, no wgmma kernel.
    arch_of = getattr(cpp_extension, "_get_cuda_arch_flags", None)
    if with_cuda and arch_of is not None:
        cuda_cflags = cuda_cflags + cuda_arch_flags(arch_of())
    headers = "".join(read_source(h, root) for h in HEADERS)  # included, not pasted: hash them too
    key = _build_key(cpp + headers, cu, [cflags, cuda_cflags, LDFLAGS, includes])
    name = f"convpool_{'cuda' if with_cuda else 'cpu'}_{key}"

    build_dir = cpp_extension._get_build_directory(name, verbose=False)
    if not os.path.exists(os.path.join(build_dir, f"{name}.so")):
        kind = "CUDA" if with_cuda else f"CPU-only ({why})"
        print(f"convpool: building the {kind} extension in {build_dir} (once per source "
              "version; cached)", file=sys.stderr, flush=True)
    # binding.cpp includes what it needs (no torch/extension.h is prepended, as load_inline
    # would); each CUDA file is its own unit, as in the CMake build.
    sources = [os.path.join(build_dir, "convpool_host.cpp")]
    _write_if_changed(sources[0], cpp)
    for stem, text in cus:
        sources.append(os.path.join(build_dir, f"convpool_{stem}.cu"))
        _write_if_changed(sources[-1], text)
    try:
        with _build_guard(build_dir, cpp_extension):
            module = cpp_extension.load(
                name=name, sources=sources, extra_cflags=cflags, extra_cuda_cflags=cuda_cflags,
                extra_ldflags=LDFLAGS, extra_include_paths=includes, build_directory=build_dir,
                verbose=False, with_cuda=with_cuda, is_python_module=True)
    except RuntimeError as e:
        log = str(e)
        log_path = os.path.join(build_dir, "convpool_build_error.log")
        try:
            with open(log_path, "w", encoding="utf-8") as f:
                f.write(log)
        except OSError:
            log_path = "(could not be written)"
        raise BuildError(
            f"convpool: compiling the extension failed (build directory {build_dir}).\n"
            f"Compiler errors:\n{_compiler_errors(log)}\n"
            f"Full log: {log_path}\n"
            "Note: binding.cpp and src/*.c are compiled as one C++ translation unit, so static "
            "names must not clash across the .c files; each src/cuda/*.cu is its own unit.") from None
    _LOADED["cuda"] = with_cuda
    _LOADED["module"] = module
    _LOADED["name"] = name
    _LOADED["build_dir"] = build_dir
    return with_cuda, module


def build_info() -> dict:
    """What load_extension built (empty before the first load)."""
    return dict(_LOADED)

