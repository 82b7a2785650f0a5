"""The CUDA half of the PyTorch binding compiles, on machines without a GPU too.

binding.cpp's CUDA entry points (forward_cuda, the cuDNN route, the backward) sit behind
CONVPOOL_HAVE_CUDA, and the extension is built with them only where torch sees a GPU. CI has a
CUDA toolkit but no GPU, so without this test an edit there would first be compiled on the
device. This runs the host compiler's syntax check over binding.cpp with CONVPOOL_HAVE_CUDA=1
against torch's own headers (which include ATen/cuda even in CPU wheels) and the toolkit's
include directory; it skips, visibly, where either is missing.
"""
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cuda_include():
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "include" / "cuda_runtime_api.h").is_file():
            return Path(home) / "include"
    return None


def test_cuda_half_of_the_binding_compiles():
    from torch.utils import cpp_extension

    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    cuda_inc = _cuda_include()
    torch_incs = [Path(p) for p in cpp_extension.include_paths()]
    if cxx is None:
        pytest.skip("no C++ compiler")
    if cuda_inc is None:
        pytest.skip("no CUDA toolkit headers (CUDA_HOME, /usr/local/cuda)")
    if not any((p / "ATen" / "cuda" / "CUDAContext.h").is_file() for p in torch_incs):
        pytest.skip("this torch ships no ATen/cuda headers")
    # torch 2.10+ requires C++20; older headers compile as C++20 too.
    # TORCH_EXTENSION_NAME: the Python module half (pybind11) too, as cpp_extension builds it.
    cmd = [cxx, "-std=c++20", "-fsyntax-only", "-DCONVPOOL_HAVE_CUDA=1", "-DTORCH_EXTENSION_NAME=convpool_syntax",
           f"-I{ROOT / 'include'}", f"-I{cuda_inc}",
           f"-I{sysconfig.get_paths()['include']}"]
    cmd += [f"-I{p}" for p in torch_incs]
    cmd.append(str(ROOT / "python" / "convpool" / "csrc" / "binding.cpp"))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]


@pytest.mark.parametrize("flags, want, sm90a", [
    # torch's default on an H100/H200 (9.0+PTX): the machine code becomes sm_90a, the PTX stays.
    (["-gencode=arch=compute_90,code=compute_90", "-gencode=arch=compute_90,code=sm_90"],
     ["-gencode=arch=compute_90,code=compute_90", "-gencode=arch=compute_90a,code=sm_90a"], True),
    (["-gencode=arch=compute_90a,code=sm_90a"], ["-gencode=arch=compute_90a,code=sm_90a"], True),
    # Other GPUs only: untouched, and no wgmma kernel.
    (["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_86,code=sm_86"],
     ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_86,code=sm_86"], False),
    (["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90"],
     ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90a,code=sm_90a"], True),
    ([], [], False),
])
def test_cuda_arch_flags_build_sm90a(flags, want, sm90a):
    """The extension's arch flags (convpool/_build.py): sm_90 machine code is built as sm_90a,
    and the plan may pick the wgmma kernel (CONVPOOL_HAVE_SM90A) only where no plain sm_90 image
    is left for the driver to load instead."""
    from convpool._build import cuda_arch_flags

    got = cuda_arch_flags(flags)
    assert [f for f in got if f.startswith("-gencode")] == want
    assert ("-DCONVPOOL_HAVE_SM90A=1" in got) == sm90a
