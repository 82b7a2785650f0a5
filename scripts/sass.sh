#!/usr/bin/env bash
# SASS of a kernel without a GPU: registers, spills and the instruction stream of the sm_90a code
# that nvcc built, for counting a loop's instructions before spending device time on it.
#
#   scripts/sass.sh [--res] SOURCE.cu [NAME]
#       compiles SOURCE.cu for sm_90a as CMake's Release build does (-O3, the project's include
#       paths) and prints, for every kernel whose mangled name contains NAME (all when omitted):
#       --res: its resource line (registers, stack = spill space), else its SASS, one
#       instruction a line.
#
# The CUDA toolkit here ships nvcc and ptxas but not cuobjdump or nvdisasm (see below).
# Example: scripts/sass.sh --res src/cuda/backward.cu weight_mma
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
res=0
if [ "${1:-}" = --res ]; then res=1; shift; fi
[ $# -ge 1 ] || { echo "usage: scripts/sass.sh [--res] SOURCE.cu [NAME]" >&2; exit 2; }
src=$1 name=${2:-}

# cuobjdump -sass runs nvdisasm: both from PATH, else NVIDIA's wheels (pip's
# nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm) unpacked into build/tools once.
tools="$root/build/tools"
tool() { # tool NAME: the path of NAME, fetched if need be
  local t
  t=$(command -v "$1" || true)
  [ -n "$t" ] || t=$( (find "$tools" -type f -name "$1" 2>/dev/null || true) | head -1)
  if [ -z "$t" ]; then
    mkdir -p "$tools"
    python3 -m pip download --no-deps --quiet -d "$tools" "nvidia-cuda-$1"
    python3 -m zipfile -e "$(ls "$tools"/nvidia_cuda_"$1"-*.whl | head -1)" "$tools"
    t=$(find "$tools" -type f -name "$1" | head -1)
    chmod +x "$t"
  fi
  echo "$t"
}
cuobjdump=$(tool cuobjdump)
PATH="$(dirname "$(tool nvdisasm)"):$PATH"

cubin=$(mktemp --suffix=.cubin)
trap 'rm -f "$cubin"' EXIT
nvcc -O3 -std=c++17 -arch=sm_90a -DCONVPOOL_HAVE_SM90A=1 -I"$root/include" -I"$root/src" -cubin -o "$cubin" "$src"
if [ "$res" = 1 ]; then
  "$cuobjdump" -res-usage "$cubin" | awk -v n="$name" '/Function/ {f = $2; next} /REG:/ && index(f, n) {print f, $1, $2}'
else
  for f in $("$cuobjdump" -res-usage "$cubin" | awk -v n="$name" '/Function/ {sub(":", "", $2); if (index($2, n)) print $2}'); do
    echo "== $f"
    "$cuobjdump" -sass -fun "$f" "$cubin" | grep -oE '/\*[0-9a-f]{4,}\*/ +[^;]*;' | sed -E 's/ +/ /g'
  done
fi
