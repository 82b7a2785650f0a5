#!/usr/bin/env bash
# cmake --install of this build into a scratch prefix, then examples/c built against that copy
# both ways (find_package with the shared and the static target; pkg-config), each run.
#   tests/test_install.sh <build dir> <source dir>
set -euo pipefail
build=${1:?build dir}
src=${2:?source dir}
work=$(mktemp -d "${TMPDIR:-/tmp}/convpool-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

cmake --install "$build" --prefix "$prefix" >/dev/null
for f in include/convpool.h bin/convpool; do
  [ -e "$prefix/$f" ] || { echo "missing $f in the install"; exit 1; }
done
libdir=$(dirname "$(find "$prefix" -name libconvpool.a | head -1)")
[ -e "$libdir/libconvpool.so" ] || { echo "missing libconvpool.so next to libconvpool.a"; exit 1; }
[ -e "$libdir/cmake/convpool/convpoolConfig.cmake" ] || { echo "missing convpoolConfig.cmake"; exit 1; }
[ -e "$libdir/pkgconfig/convpool.pc" ] || { echo "missing convpool.pc"; exit 1; }

echo "== find_package(convpool)"
cmake -S "$src/examples/c" -B "$work/example" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/example" >/dev/null
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$work/example/convpool_example"
"$work/example/convpool_example_static"
# The shared example must really use the installed libconvpool.so. (ldd's output is taken whole
# first: with pipefail, grep -q leaving early could kill ldd with SIGPIPE and fail the pipe.)
deps=$(LD_LIBRARY_PATH="$libdir" ldd "$work/example/convpool_example")
grep -q "$libdir/libconvpool.so" <<<"$deps" ||
  { echo "convpool_example does not load the installed libconvpool.so"; exit 1; }

echo "== pkg-config"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
pkg-config --exists convpool
cc -O2 "$src/examples/c/main.c" $(pkg-config --cflags --libs convpool) -lm -o "$work/example_pc"
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$work/example_pc"
echo "test_install: all checks passed"
