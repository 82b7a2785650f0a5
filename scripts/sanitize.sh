#!/usr/bin/env bash
# The CPU test suite under AddressSanitizer (with LeakSanitizer) and UndefinedBehaviorSanitizer:
# a separate Debug build in build-asan/ (gcc, no CUDA), then `ctest -L cpu`. Any sanitizer
# report fails the test that triggered it. Environment: CC (gcc), ASAN_BUILD_DIR (build-asan).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ASAN_BUILD_DIR:-$root/build-asan}
jobs=$(nproc)

start=$(date +%s)
CC=${CC:-gcc} cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Debug -DCONVPOOL_ENABLE_CUDA=OFF \
  -DCMAKE_C_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake --build "$build" -j"$jobs"
echo "sanitize.sh: built in $(($(date +%s) - start)) s"

# halt_on_error: the first report ends the process (ctest then shows the test as failed).
# LeakSanitizer is on (detect_leaks=1, the default on x86-64 Linux); tests/lsan.supp lists the
# OpenMP runtimes' allocations that live until exit, and says why each is not a leak.
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/tests/lsan.supp:print_suppressions=0}
# test_install is left out: it installs this build and links examples/c against the installed
# libraries with plain cc (pkg-config), which cannot link ASan-instrumented objects; it checks
# packaging, not memory safety, and scripts/test.sh runs it on the normal build.
ctest --test-dir "$build" -L cpu -E '^test_install$' --output-on-failure -j"$jobs"
echo "sanitize.sh: done in $(($(date +%s) - start)) s"
