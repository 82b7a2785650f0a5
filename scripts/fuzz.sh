#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/: validate, forward, and readers when cJSON is
# installed) with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer into build-fuzz/, and runs each over a copy of its committed seed
# corpus (tests/fuzz/corpus/<target>/, never modified here).
#   scripts/fuzz.sh [seconds]     total fuzzing time, split evenly between the targets (60)
# readers is the CLI's .npy and safetensors readers (cli/io.c), linked with cJSON.
# Exits non-zero if a target crashes, trips a sanitizer or finds a disagreement; the input is
# left in build-fuzz/artifacts/<target>/ (reproduce: build-fuzz/fuzz_<target> FILE, with
# CONVPOOL_FUZZ_VERBOSE=1 to print the decoded problem). Environment: CC (clang),
# FUZZ_BUILD_DIR (build-fuzz).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
total=${1:-60}
if ! [[ $total =~ ^[0-9]+$ ]] || ((total < 2)); then
  echo "usage: $0 [seconds >= 2]" >&2
  exit 2
fi
cc=${CC:-clang}
build=${FUZZ_BUILD_DIR:-$root/build-fuzz}
targets=(validate forward)
have_cjson=0
if printf '#include <cjson/cJSON.h>\nint main(void) { return cJSON_Version() == 0; }\n' |
    "${CC:-clang}" -x c - -lcjson -o /dev/null >/dev/null 2>&1; then
  have_cjson=1
  targets+=(readers)
else
  echo "fuzz.sh: no cJSON (libcjson-dev): the readers target is skipped" >&2
fi
mkdir -p "$build/obj"

# OpenMP if this clang has it (libomp); the library compiles without it too (cpu.c guards
# omp.h with _OPENMP), the fuzz targets then run single-threaded.
omp=-fopenmp
if ! printf '#include <omp.h>\nint main(void) { return omp_get_max_threads() < 1; }\n' |
    "$cc" -fopenmp -x c - -o "$build/omp_check" >/dev/null 2>&1; then
  echo "fuzz.sh: $cc -fopenmp does not work here (libomp missing?): building without OpenMP" >&2
  omp=
fi

san=(-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g)
echo "== building the fuzz targets ($cc${omp:+, $omp})"
start=$(date +%s)
objs=() pids=()
for src in problem reference cpu cpu_backward cuda_stub; do
  "$cc" -std=c11 -O2 -march=x86-64-v2 "${san[@]}" -fsanitize=fuzzer-no-link $omp -Wall -Wextra \
    -Wno-pass-failed -I"$root/include" -I"$root/src" -c "$root/src/$src.c" -o "$build/obj/$src.o" &
  pids+=($!)
  objs+=("$build/obj/$src.o")
done
for pid in "${pids[@]}"; do
  wait "$pid"
done
for t in "${targets[@]}"; do
  if [[ $t == readers ]]; then
    "$cc" -std=c11 -O1 "${san[@]}" -fsanitize=fuzzer -Wall -Wextra -Werror -I"$root/cli" \
      "$root/tests/fuzz/fuzz_readers.c" "$root/cli/io.c" -lcjson -o "$build/fuzz_readers"
  else
    "$cc" -std=c11 -O1 "${san[@]}" -fsanitize=fuzzer $omp -Wall -Wextra -Werror -I"$root/include" \
      "$root/tests/fuzz/fuzz_$t.c" "${objs[@]}" -lm -o "$build/fuzz_$t"
  fi
done
echo "   built in $(($(date +%s) - start)) s"

export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/tests/lsan.supp:print_suppressions=0}
unset CONVPOOL_CPU_ISA CONVPOOL_FUZZ_VERBOSE

status=0
share=$((total / ${#targets[@]}))
for i in "${!targets[@]}"; do
  t=${targets[$i]}
  secs=$share
  ((i == ${#targets[@]} - 1)) && secs=$((total - share * (${#targets[@]} - 1)))
  corpus=$build/corpus/$t
  artifacts=$build/artifacts/$t
  log=$build/fuzz_$t.log
  rm -rf "$corpus" "$artifacts"
  mkdir -p "$corpus" "$artifacts"
  cp "$root/tests/fuzz/corpus/$t/"* "$corpus/"
  extra=(-max_len=4096)
  [[ $t == validate ]] && extra=(-max_len=256 -use_value_profile=1)
  echo "== fuzz_$t for ${secs} s (log: $log)"
  if "$build/fuzz_$t" -max_total_time="$secs" -print_final_stats=1 -timeout=60 -rss_limit_mb=2048 \
      -artifact_prefix="$artifacts/" "${extra[@]}" "$corpus" >"$log" 2>&1; then
    :
  else
    rc=$?
    status=1
    echo "FAIL: fuzz_$t exited with $rc; the end of its log:" >&2
    grep -v -E '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse|RELOAD)|^[[:space:]]+NEW_FUNC' "$log" | tail -n 60 >&2 || true
    for f in "$artifacts"/*; do
      [[ -e $f ]] && echo "  reproducer: $f (run: $build/fuzz_$t $f)" >&2
    done
  fi
done

echo "== executed inputs"
for t in "${targets[@]}"; do
  n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$build/fuzz_$t.log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$build/fuzz_$t.log" | tail -n 1)
  echo "fuzz_$t: stat::number_of_executed_units: ${n:-?} (${rate:-?}/s)"
done
exit $status
