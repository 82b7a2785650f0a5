#!/usr/bin/env bash
# Runs every test: builds the C library, CLI and tests (CUDA code compiles whenever nvcc is
# present), runs ctest (GPU tests show as skipped without a GPU), then the pytest suite.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
"$root/scripts/setup-deps.sh"
"$root/scripts/setup-python.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j"$(nproc)"
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" --label-exclude gpu_big
"$root/.venv/bin/python" -m pytest "$root/python/tests" -rs -q
"$root/scripts/test_wheel.sh"
"$root/scripts/sanitize.sh"; "$root/scripts/fuzz.sh"
