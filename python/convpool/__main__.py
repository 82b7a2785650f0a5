"""python -m convpool [build|info]: build the extension now (for set-up scripts), or say what
was built and where."""
import argparse
import sys

import torch

from . import _build, _ops


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m convpool", description=__doc__)
    parser.add_argument("command", nargs="?", default="info", choices=["build", "info"])
    args = parser.parse_args(argv)
    has_cuda = _ops.load()
    info = _build.build_info()
    print(f"convpool extension: {info['name']} ({'CUDA + CPU' if has_cuda else 'CPU only'})")
    print(f"  build directory: {info['build_dir']}")
    print(f"  sources: {_build.repo_root()}")
    print(f"  torch {torch.__version__}, CUDA device visible: {torch.cuda.is_available()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
