#!/usr/bin/env bash
# The main job: builds build/convpool and runs it (headline problem on the GPU if there is
# one, else on the CPU). Arguments go to convpool; see `build/convpool --help`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target convpool_cli >/dev/null
exec "$build/convpool" "$@"
