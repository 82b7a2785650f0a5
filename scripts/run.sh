#!/usr/bin/env bash
# The main job: builds build/convpool and runs it (headline problem on the GPU if there is
# one, else on the CPU). Arguments go to convpool; see `build/convpool --help`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
log="$build/run-build.log"
mkdir -p "$build"
"$root/scripts/setup-deps.sh"
if ! { cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release &&
       cmake --build "$build" -j"$(nproc)" --target convpool_cli; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "run.sh: the build failed (log above, also in $log)" >&2
  exit 1
fi
exec "$build/convpool" "$@"
