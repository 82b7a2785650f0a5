#!/usr/bin/env bash
# The wheel and sdist as a user gets them: builds both from the repository root, installs the
# wheel into a fresh virtual environment outside the repository (its torch, numpy and pytest
# come from the project venv through a .pth file; convpool itself only from the wheel), and runs
# the CPU test suite from a folder with no checkout in sight. The extension then compiles from
# the sources inside the wheel (convpool/_lib).
#   scripts/test_wheel.sh            (after scripts/setup-python.sh)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py="$root/.venv/bin/python"
work=$(mktemp -d "${TMPDIR:-/tmp}/convpool-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT

cd "$root"
"$py" -m pip wheel -q --no-deps --no-build-isolation -w "$work/dist" "$root"
"$py" -m build --version >/dev/null 2>&1 && "$py" -m build -q --sdist --no-isolation -o "$work/dist" "$root" ||
  "$py" setup.py -q sdist -d "$work/dist" >/dev/null
wheel=$(ls "$work"/dist/convpool-*.whl)
sdist=$(ls "$work"/dist/convpool-*.tar.gz)
echo "built $(basename "$wheel") and $(basename "$sdist")"

# The wheel must carry the library sources and the binding; the sdist what builds the wheel.
"$py" - "$wheel" "$sdist" <<'PY'
import sys, tarfile, zipfile
wheel, sdist = sys.argv[1:3]
names = set(zipfile.ZipFile(wheel).namelist())
need = ["convpool/_lib/include/convpool.h", "convpool/_lib/src/problem.c", "convpool/_lib/src/cpu.c",
        "convpool/_lib/src/cuda/plan.cu", "convpool/_lib/src/cuda/common.cuh", "convpool/csrc/binding.cpp"]
missing = [n for n in need if n not in names]
assert not missing, f"wheel lacks {missing}"
snames = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n}
smissing = [n for n in ("setup.py", "pyproject.toml", "include/convpool.h", "src/cuda/general.cu",
                        "python/convpool/_build.py") if n not in snames]
assert not smissing, f"sdist lacks {smissing}"
print(f"wheel: {len(names)} files, sources included; sdist complete")
PY

# A fresh venv: only convpool's wheel installed into it.
"$py" -m venv "$work/venv"
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
vsite=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$site" >"$vsite/project_deps.pth"
"$work/venv/bin/python" -m pip install -q --no-deps --no-index "$wheel"

# The CPU suite, copied away from the checkout (no conftest.py putting python/ on the path).
mkdir -p "$work/tests"
cp "$root"/python/tests/_util.py "$root"/python/tests/test_modelnew_cpu.py "$root"/python/tests/test_errors.py \
  "$root"/python/tests/test_autograd_compile.py "$work/tests/"
cd "$work"
env -u CONVPOOL_ROOT -u PYTHONPATH CONVPOOL_BUILD_CUDA=0 TORCH_EXTENSIONS_DIR="$work/ext" \
  "$work/venv/bin/python" - <<'PY'
import convpool, convpool._build as b
root = b.repo_root()
assert root.name == "_lib" and "site-packages" in str(root), f"sources found at {root}, not in the wheel"
print(f"convpool {convpool.__version__} from {convpool.__file__}; sources in {root}")
PY
env -u CONVPOOL_ROOT -u PYTHONPATH CONVPOOL_BUILD_CUDA=0 TORCH_EXTENSIONS_DIR="$work/ext" \
  "$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$work/tests" -k "not cuda"
