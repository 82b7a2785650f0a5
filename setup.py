"""Copies the library's C/CUDA sources into the wheel (convpool/_lib/{include,src}) when it is
built, so an installed convpool compiles the same files a checkout does; the repository keeps
the one copy. Everything else is in pyproject.toml."""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
# What python/convpool/_build.py compiles: the public header, the library sources and headers.
LIB_DIRS = ("include", "src")
LIB_SUFFIXES = (".h", ".c", ".cu", ".cuh")


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        dest_root = os.path.join(self.build_lib, "convpool", "_lib")
        for top in LIB_DIRS:
            for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
                for name in files:
                    if not name.endswith(LIB_SUFFIXES):
                        continue
                    src = os.path.join(dirpath, name)
                    dst = os.path.join(dest_root, os.path.relpath(src, ROOT))
                    os.makedirs(os.path.dirname(dst), exist_ok=True)
                    shutil.copyfile(src, dst)


setup(cmdclass={"build_py": BuildPyWithLibrary})
