#!/usr/bin/env bash
# The one GPU script: builds, tests and benchmarks everything on a machine with a GPU, in a
# single call, writing logs under $OUT (./out when OUT is unset).
#
#   scripts/device.sh [stage ...]     stages: env build ctest big sanitize sansm90 sanbw pytest kb cpubench traincpu trainprof profile ncu bwbench ab abpre envab probe cudnnprobe bench shapes rule ddp host
#                                     ncu (one kernel's detailed ncu sections: NCU_KERNEL, NCU_ARGS)
#                                     shapes (every shape family against PyTorch: bench/bench_shapes.py)
#                                     rule (bench_shapes for the product rule: grad-enabled forwards and
#                                     training steps too, uniform and zero-half x; RULE_ARGS)
#                                     ddp (examples/train_ddp.py under torchrun; NCCL tests on 2 GPUs)
#                                     (default: all of them, in that order; the full benchmark
#                                     alone takes ~5 minutes, so long sessions split the call)
#
# Each stage logs to $OUT/logs/<stage>.log (packed into $OUT/logs.tgz at the end, so few files
# come back); benchmark results land in $OUT directly. A pass/fail summary is printed last.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OUT=${OUT:-$root/out}
mkdir -p "$OUT/logs"
build=${BUILD_DIR:-$root/build-device}
py=${PYTHON:-python3}
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(env build ctest big sanitize pytest kb cpubench traincpu trainprof profile bench shapes ddp host)
summary=()

stage_env() {
  nvidia-smi
  nvcc --version | tail -2
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
  git log -1 --oneline 2>/dev/null || true
  nproc
}
# configure SRC BUILD: the device build's CMake settings, one place for the stages that build.
configure() { cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="90a-real;80-virtual"; }
stage_build() { configure "$root" "$build" && cmake --build "$build" -j"$(nproc)"; }
# CTEST_R: a ctest -R regex (e.g. "backward" after a backward kernel change); default: all but gpu_big.
stage_ctest() { ctest --test-dir "$build" --output-on-failure -j4 --label-exclude gpu_big --timeout 600 ${CTEST_R:+-R "$CTEST_R"}; }
stage_big() { ctest --test-dir "$build" --output-on-failure -L gpu_big --timeout 600; }
# compute-sanitizer runs go through `san LABEL [ENV=V ...] -- TOOL-ARGS...`: up to SAN_JOBS of
# them at a time (default half the cores; each is one process on the GPU, most of its time on
# the host), each logged apart; san_collect waits for them all, prints the logs in the order the
# runs were queued and fails if any failed. The full set (~50 runs) took ~6 minutes one at a time.
san_n=0
san() {
  local label=$1 envs=() log
  shift
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  san_n=$((san_n + 1))
  mkdir -p "$OUT/logs/san"
  log=$(printf '%s/logs/san/%03d.log' "$OUT" "$san_n")
  ( echo "== compute-sanitizer $label"
    env "${envs[@]}" compute-sanitizer --error-exitcode 3 "$@"
    echo "exit $?" ) >"$log" 2>&1 &
  while [ "$(jobs -rp | wc -l)" -ge "${SAN_JOBS:-$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))}" ]; do wait -n; done
}
san_collect() {
  local rc=0 f
  wait
  for f in "$OUT/logs/san"/*.log; do
    [ -f "$f" ] || continue
    cat "$f"
    tail -n 1 "$f" | grep -qx 'exit 0' || { echo "!! FAILED: $(head -n 1 "$f")"; rc=1; }
  done
  rm -rf "$OUT/logs/san"
  return $rc
}
stage_sanitize() {
  local cli="$build/convpool"
  local small=(--device cuda --batch 2 --in-channels 3 --out-channels 5 --depth 7 --height 9 --width 11 --iters 2 --check-batch 1)
  local head=(--device cuda --batch 1 --depth 6 --height 18 --width 34 --iters 2 --check-batch 1)
  local group=(--device cuda --batch 1 --in-channels 12 --out-channels 20 --depth 6 --height 10 --width 13 --iters 2 --check-batch 1)
  local general=(--device cuda --batch 2 --in-channels 9 --out-channels 17 --depth 9 --height 13 --width 37 --kernel 2,3,5 --pool 3,2,4 --iters 2 --check-batch 1)
  local general_tiles=(--device cuda --batch 1 --in-channels 8 --out-channels 16 --depth 5 --height 14 --width 64 --pool 3 --iters 2 --check-batch 1)
  local general_k7=(--device cuda --batch 1 --in-channels 3 --out-channels 5 --depth 7 --height 11 --width 40 --kernel 1,7,7 --pool 1,2,2 --iters 2 --check-batch 1)
  local general_wide=(--device cuda --batch 1 --in-channels 2 --out-channels 3 --depth 5 --height 6 --width 50 --kernel 2,2,11 --pool 2,1,3 --iters 2 --check-batch 1)
  # Tile pools (pool_step_any): k3p2 with a conv d extent of 5 that pool_d 5 covers exactly (the
  # last step's plane past the input is skipped), group k2 with windows across lanes, group 1x3x3.
  local tilepool=(--device cuda --batch 1 --in-channels 5 --out-channels 9 --depth 7 --height 10 --width 37 --pool 5,2,8 --iters 2 --check-batch 1)
  # k3p2 with its depth cut into items of whole windows (pool_d 3: 3-step chunks), pool_step_any.
  local tilesplit=(--device cuda --batch 1 --in-channels 8 --out-channels 16 --depth 14 --height 10 --width 37 --pool 3,2,2 --iters 2 --check-batch 1)
  local grouppool=(--device cuda --batch 1 --in-channels 12 --out-channels 20 --depth 7 --height 9 --width 21 --kernel 2 --pool 3,1,4 --iters 2 --check-batch 1)
  local groupflat=(--device cuda --batch 1 --in-channels 12 --out-channels 20 --depth 5 --height 9 --width 21 --kernel 1,3,3 --pool 1,2,2 --iters 2 --check-batch 1)
  local generic=(--device cuda --batch 1 --in-channels 2 --out-channels 3 --depth 3 --height 130 --width 9 --kernel 1,125,2 --pool 1 --iters 2 --check-batch 1)
  local tool prec args
  for tool in memcheck racecheck; do
    for prec in tf32 strict; do
      for args in small head group general general_tiles general_k7 general_wide tilepool tilesplit grouppool groupflat generic; do
        local -n a=$args
        san "--tool $tool $args $prec" -- --tool "$tool" "$cli" "${a[@]}" --precision "$prec"
      done
    done
    # The training kernels (pool_train, the fused backward), the channels-last pooling kernel
    # (the binding's cuDNN route) and the 16-bit-parameter forward are not reachable from the CLI.
    # test_cuda_backward once each way grad_weight's wgmma kernel splits its units.
    san "--tool $tool test_cuda_backward" -- --tool "$tool" "$build/tests/test_cuda_backward"
    # grad_x_sm90_kernel on every k3p2 shape of the suite (the plan takes it from 2^19 positions).
    san "--tool $tool test_cuda_backward gradx_sm90" CONVPOOL_GRADX_SM90=1 -- --tool "$tool" \
      "$build/tests/test_cuda_backward"
    san "--tool $tool test_cuda_backward (fixed split)" CONVPOOL_WGRAD_BALANCE=0 -- --tool "$tool" "$build/tests/test_cuda_backward"
    san "--tool $tool test_cuda --channels-last" -- --tool "$tool" "$build/tests/test_cuda" --channels-last
    san "--tool $tool test_cuda --lowp" -- --tool "$tool" "$build/tests/test_cuda" --lowp
    san "--tool $tool test_tail cuda" -- --tool "$tool" "$build/tests/test_tail" cuda
  done
  sansm90_runs
  san_collect
}
# compute-sanitizer over k3p2_sm90 (the wgmma kernel), forced where the plan would not pick it:
# the CLI's k3p2 shapes and the training suite (its CODES instance).
sansm90_runs() {
  local cli="$build/convpool" tool args
  local shapes=("--batch 2 --in-channels 3 --out-channels 5 --depth 7 --height 9 --width 11"
                "--batch 1 --depth 6 --height 18 --width 34"
                "--batch 3 --in-channels 8 --out-channels 16 --depth 9 --height 21 --width 133 --divisor -1.5")
  for tool in memcheck racecheck; do
    for args in "${shapes[@]}"; do
      # shellcheck disable=SC2086  # args is a word list
      san "--tool $tool k3p2_sm90 $args" CONVPOOL_K3P2_SM90=1 -- --tool "$tool" "$cli" --device cuda $args \
        --iters 2 --check-batch 1 --precision tf32
    done
    san "--tool $tool k3p2_sm90 test_cuda_backward" CONVPOOL_K3P2_SM90=1 -- --tool "$tool" "$build/tests/test_cuda_backward"
  done
}
stage_sansm90() { sansm90_runs; san_collect; }
# compute-sanitizer over the training kernels alone (a check while working on them). Six runs
# under the sanitizers: ~5 minutes on an H200 (twenty-third session), so with a build it fills
# most of a 10-minute call; give it a call of its own.
stage_sanbw() {
  local tool
  for tool in memcheck racecheck; do
    san "--tool $tool test_cuda_backward" -- --tool "$tool" "$build/tests/test_cuda_backward"
    # grad_x_sm90_kernel on every k3p2 shape of the suite (the plan takes it from 2^19 positions).
    san "--tool $tool test_cuda_backward gradx_sm90" CONVPOOL_GRADX_SM90=1 -- --tool "$tool" \
      "$build/tests/test_cuda_backward"
    san "--tool $tool test_tail cuda" -- --tool "$tool" "$build/tests/test_tail" cuda
  done
  san_collect
}
# PYTEST_FILES: test files (relative to the root) instead of all of python/tests, e.g. the CUDA
# ones after a kernel change: "python/tests/test_cuda.py python/tests/test_cuda_training.py".
# PYTEST_K: a pytest -k expression (e.g. "sm90").
# PYTEST_JOBS: that many pytest-xdist workers on the one GPU (where xdist is installed; the
# extension is built first, once, so the workers only load it). The whole suite took over
# 6 minutes in one process.
stage_pytest() {
  local files=() f par=()
  for f in ${PYTEST_FILES:-python/tests}; do files+=("$root/$f"); done
  if [ -n "${PYTEST_JOBS:-}" ] && "$py" -c 'import xdist' 2>/dev/null; then
    "$py" -c 'import convpool; convpool.load()' || return 1
    par=(-n "$PYTEST_JOBS")
  fi
  CONVPOOL_CLI="$build/convpool" "$py" -m pytest "${files[@]}" "${par[@]}" ${PYTEST_K:+-k "$PYTEST_K"} -rs -q -x
}
# ncu's detailed sections for one kernel of one bench_gpu run (NCU_KERNEL: a regex of kernel
# names; NCU_ARGS: bench_gpu's arguments), the report kept as $OUT/ncu_<kernel>.txt. NCU_SOURCE=1
# also keeps the per-instruction stall samples as $OUT/ncu_<kernel>_source.csv.gz, which
# scripts/ncu_source.py sums by SASS range (how grad_x_sm90's staging cost was found).
stage_ncu() {
  local k="${NCU_KERNEL:-grad_x_sm90|grad_x_fold}"
  local tag="$OUT/ncu_${k//[^A-Za-z0-9_]/_}"
  local prof=(ncu --clock-control none --kernel-name regex:"$k" --launch-skip 2 --launch-count 1)
  local run=("$build/bench/bench_gpu" ${NCU_ARGS:---batch 128 --backward x} --iters 3 --warmup 2)
  if [ "${NCU_SOURCE:-0}" = 1 ]; then
    "${prof[@]}" --section WarpStateStats --section SourceCounters --page source --print-source sass --csv \
      "${run[@]}" >"${tag}_source.csv" && gzip -f "${tag}_source.csv" || return 1
  fi
  "${prof[@]}" --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --section InstructionStats "${run[@]}" | tee "$tag.txt"
}
stage_kb() {
  "$py" -m convpool.kernelbench export -o "$OUT/convpool_kb.py" &&
    "$py" -m convpool.kernelbench check "$OUT/convpool_kb.py"
}
stage_profile() {
  # Hardware counters of the fused kernel at the headline, one launch per precision.
  local prec
  for prec in tf32 strict; do
    echo "== ncu headline $prec"
    ncu --clock-control none --kernel-name regex:'k3p2|group|wino' --launch-skip 2 --launch-count 1 \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread \
      "$build/bench/bench_gpu" --precision "$prec" --iters 3 --warmup 2 || return 1
  done
}
# DistributedDataParallel: the example under torchrun on every GPU there is (NCCL; one GPU is a
# world of 1), by the default route and with convpool's fused backward forced, then the 2-rank
# gradient tests (their NCCL cases need 2 GPUs, else they skip).
stage_ddp() {
  local n
  n=$(nvidia-smi -L | wc -l)
  torchrun --nproc_per_node "$n" "$root/examples/train_ddp.py" --device cuda --steps 3 --save "$OUT/ddp.pt" &&
    CONVPOOL_TORCH_BACKWARD=fused torchrun --nproc_per_node "$n" "$root/examples/train_ddp.py" --device cuda \
      --steps 3 --save "$OUT/ddp_fused.pt" &&
    "$py" -m pytest "$root/python/tests/test_ddp.py" -rs -v
}
# torch.compile costs seconds per row: by default only four rows get it, to fit one call.
stage_shapes() {
  "$py" "$root/bench/bench_shapes.py" --out "$OUT" \
    ${SHAPES_ARGS:---compile-rows headline,k5,pool3,c64_c128 --max-seconds 480}
}
# The product rule in one call (~2 minutes with the extension built): every shape family's
# inference forward, grad-enabled forward and training step in both precisions against eager's,
# on uniform x and with x zero in half of every row; each table ends with the rows below eager.
stage_rule() {
  mkdir -p "$OUT/rule" "$OUT/rule_zero_half"
  "$py" "$root/bench/bench_shapes.py" --out "$OUT/rule" --no-compile --train-rows all --iters 20 \
    --max-seconds 240 ${RULE_ARGS:-} &&
    "$py" "$root/bench/bench_shapes.py" --out "$OUT/rule_zero_half" --x-zero-half --no-compile --train-rows all \
      --iters 20 --max-seconds 180 ${RULE_ARGS:-} &&
    for f in "$OUT/rule/shapes_table.md" "$OUT/rule_zero_half/shapes_table.md"; do
      echo "== $f"
      awk '/^Below eager/ { on = 1 } on { print; if ($0 == "" && ++blank == 2) exit }' "$f"
    done
}
# Host microseconds per call, layer by layer (HOST_ARGS: bench/host_overhead.py's).
stage_host() {
  local raw=()
  [ -x "$build/bench/bench_gpu" ] && raw=(--raw-c "$build/bench/bench_gpu")
  "$py" "$root/bench/host_overhead.py" "${raw[@]}" ${HOST_ARGS:-} | tee "$OUT/host_overhead.md"
}
# The fused backward's kernels alone (bench_gpu --backward, random codes): grad_weight, grad_x,
# both, per precision, at the training rows' shapes. BWBENCH_ROWS picks rows by name.
stage_bwbench() {
  local -A rows=([headline_b128]="--batch 128" [headline_b16]="--batch 16" [k5_b8]="--batch 8 --k 5"
                 [pool3_b16]="--batch 16 --pool 3" [c32_c64_b8]="--batch 8 --cin 32 --cout 64 --d 16 --h 32 --w 32")
  local names=(${BWBENCH_ROWS:-headline_b128 headline_b16 k5_b8 pool3_b16 c32_c64_b8}) rc=0
  for name in "${names[@]}"; do
    for prec in tf32 strict; do
      for what in w x xw; do
        echo -n "$name $prec $what: "
        "$build/bench/bench_gpu" ${rows[$name]} --precision "$prec" --backward "$what" --iters 20 --warmup 3 --json |
          tee -a "$OUT/bwbench.jsonl" || rc=1
      done
    done
  done
  return $rc
}
# The A/B stages' bench_gpu rows where AB_BENCH is unset.
AB_BENCH_DEFAULT="--backward x --batch 128;--backward w --batch 128;--backward x --batch 128 --precision strict;--batch 128"
# ab_rows EXE_A EXE_B: each AB_BENCH row (';'-separated bench_gpu argument sets; none: no rows)
# on A, B, A, B, the medians of 20 printed and appended to $OUT/ab.txt.
ab_rows() {
  local exe_a=$1 exe_b=$2 rc=0 rows_arr row
  IFS=';' read -r -a rows_arr <<<"${AB_BENCH:-$AB_BENCH_DEFAULT}"
  [ "${AB_BENCH:-}" = none ] && rows_arr=()
  for row in "${rows_arr[@]}"; do
    local args res=() round side exe m
    read -r -a args <<<"$row"
    for round in 1 2; do
      for side in A B; do
        exe=$exe_a; [ "$side" = B ] && exe=$exe_b
        m=$("$exe" "${args[@]}" --iters 20 --warmup 3 --json | sed -n 's/.*"median_ms": \([0-9.]*\).*/\1/p') || true
        [ -n "$m" ] || { m=FAIL; rc=1; }
        res+=("$side$round=$m")
      done
    done
    echo "ab | $row | ${res[*]}" | tee -a "$OUT/ab.txt"
  done
  return $rc
}
# b_test LOG NAME CMD...: one of B's test programs (test_cuda gets the golden data), its last
# line or its failures; status 1 when it fails.
b_test() {
  local log=$1 name=$2 args=()
  shift 2
  [ "$name" = test_cuda ] && args=("$root/tests/golden")
  if "$@" "${args[@]}" >"$log" 2>&1; then
    echo "B: $name: $(tail -1 "$log")"
  else
    echo "B: $name FAILED"; grep -iE "fail|error" "$log" | head; return 1
  fi
}
# A/B of one build under two environments: the routing switches (CONVPOOL_WGRAD_SM90,
# CONVPOOL_GRADX_SM90, CONVPOOL_K3P2_SM90) pick kernels at run time, so no second build is
# needed. AB_ENV_A / AB_ENV_B: VAR=value lists (default CONVPOOL_WGRAD_SM90=0 / =1); AB_BENCH
# rows as for ab; AB_TESTS (optional) run under B's environment first.
stage_envab() {
  local bin rc=0 t exe="$build/bench/bench_gpu"
  bin=$(mktemp -d) || return 1
  printf '#!/bin/sh\nexec env %s "%s" "$@"\n' "${AB_ENV_A:-CONVPOOL_WGRAD_SM90=0}" "$exe" >"$bin/a"
  printf '#!/bin/sh\nexec env %s "%s" "$@"\n' "${AB_ENV_B:-CONVPOOL_WGRAD_SM90=1}" "$exe" >"$bin/b"
  chmod +x "$bin/a" "$bin/b"
  for t in ${AB_TESTS:-}; do
    b_test "$OUT/logs/envab_$t.log" "$t" env ${AB_ENV_B:-CONVPOOL_WGRAD_SM90=1} "$build/tests/$t" || rc=1
  done
  echo "A: ${AB_ENV_A:-CONVPOOL_WGRAD_SM90=0}  B: ${AB_ENV_B:-CONVPOOL_WGRAD_SM90=1}"
  ab_rows "$bin/a" "$bin/b" || rc=1
  return $rc
}
# A/B of scratch_ab/ (scripts/ab.sh prepare PATCH ...) against this tree; see scripts/ab.sh.
stage_ab() {
  local ab="$root/scratch_ab" rc=0
  [ -d "$ab" ] || { echo "no scratch_ab/: run scripts/ab.sh prepare PATCH first and carry it"; return 1; }
  local jobs=$(( $(nproc) / 2 )); [ "$jobs" -ge 1 ] || jobs=1
  configure "$root" "$build" >/dev/null && configure "$ab" "$ab/build-ab" >/dev/null || return 1
  cmake --build "$build" -j"$jobs" >"$OUT/logs/ab_build_a.log" 2>&1 & local pa=$!
  cmake --build "$ab/build-ab" -j"$jobs" >"$OUT/logs/ab_build_b.log" 2>&1 & local pb=$!
  wait $pa || { echo "A failed to build"; return 1; }
  wait $pb || { echo "B failed to build"; return 1; }
  # B's GPU tests: AB_CTEST, a ctest -R regex (default test_cuda_backward alone; e.g. "sm90" for
  # the wgmma kernel's forced instances).
  local re=${AB_CTEST:-^test_cuda_backward\$}
  if ctest --test-dir "$ab/build-ab" -R "$re" --output-on-failure --timeout 600 >"$OUT/logs/ab_test_b.log" 2>&1; then
    echo "B: ctest -R '$re': $(grep -E 'tests passed|tests failed' "$OUT/logs/ab_test_b.log" | tail -1)"
  else
    echo "B: ctest -R '$re' FAILED"; grep -E "Failed|\*\*\*" "$OUT/logs/ab_test_b.log" | head; rc=1
  fi
  ab_rows "$build/bench/bench_gpu" "$ab/build-ab/bench/bench_gpu" || rc=1
  # AB_TRAINPROF: bench/profile_train.py's arguments; each tree builds its own extension (the
  # name carries a hash of the sources) and profiles the step, A then B.
  if [ -n "${AB_TRAINPROF:-}" ]; then
    local side tree
    for side in A B; do
      tree=$root; [ "$side" = B ] && tree=$ab
      PYTHONPATH="$tree/python" "$py" "$tree/bench/profile_train.py" $AB_TRAINPROF >"$OUT/ab_trainprof_$side.md" 2>&1 || rc=1
      grep -E "^## |step" "$OUT/ab_trainprof_$side.md" | sed "s/^/ab trainprof $side | /" | tee -a "$OUT/ab.txt"
    done
  fi
  return $rc
}
# The standalone wgmma rate probe (docs/experiments/wgmma_rate.cu): TF32 wgmma throughput by N,
# operand source and blocks an SM, the table kept as $OUT/wgmma_rate.md.
stage_probe() {
  mkdir -p "$build" && nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -diag-suppress 177 \
    -o "$build/wgmma_rate" "$root/docs/experiments/wgmma_rate.cu" && "$build/wgmma_rate" | tee "$OUT/wgmma_rate.md"
}
# The same A/B from binaries built here (scripts/ab.sh prebuild: scratch_ab/prebuilt/{A,B}/*.gz,
# sm_90a only), so the call spends no device time building: B's AB_TESTS (space-separated test
# programs, default test_cuda_backward; test_cuda gets the golden directory), then AB_BENCH,
# through scripts/ab_run.sh (its logs in logs/abpre/, its rows appended to ab.txt).
stage_abpre() {
  local pre="$root/scratch_ab/prebuilt" t tests=() rows=${AB_BENCH:-$AB_BENCH_DEFAULT} rc=0
  [ -d "$pre" ] || { echo "no scratch_ab/prebuilt/: run scripts/ab.sh prebuild first and carry scratch_ab"; return 1; }
  [ "$rows" = none ] && rows=
  cat "$pre/REVISIONS" 2>/dev/null
  for t in ${AB_TESTS:-test_cuda_backward}; do tests+=("B/$t"); done
  OUT="$OUT/logs/abpre" SIDES="A B" TESTS="$(IFS=';'; echo "${tests[*]}")" ROWS="$rows" \
    "$root/scripts/ab_run.sh" run || rc=1
  cat "$OUT/logs/abpre/ab.txt" >>"$OUT/ab.txt" 2>/dev/null
  return $rc
}
# cudnnprobe: which conv3d problems cuDNN really runs in TF32 when torch allows it.
stage_cudnnprobe() { "$py" "$root/bench/cudnn_tf32_probe.py" ${CUDNNPROBE_ARGS:-} | tee "$OUT/cudnn_tf32_probe.md"; }
stage_bench() { "$py" "$root/bench/bench_gpu.py" --build "$build" --out "$OUT" ${BENCH_ARGS:-}; }
stage_cpubench() { "$py" "$root/bench/run_cpu_bench.py" --build "$build" --out "$OUT"; }
# The CPU training step (issue "Training": 3x eager at batch 8 on all cores is the target).
# Where a GPU training step's time goes, kernel by kernel (TRAINPROF_ARGS: bench/profile_train.py's).
stage_trainprof() { "$py" "$root/bench/profile_train.py" ${TRAINPROF_ARGS:-} | tee "$OUT/train_profile.md"; }
stage_traincpu() {
  "$py" "$root/bench/bench_train_cpu.py" --batch 8 --parts | tee "$OUT/train_cpu.md" &&
    "$py" "$root/bench/bench_train_cpu.py" --batch 128 --rows headline --reps 3 | tee -a "$OUT/train_cpu.md" &&
    "$py" "$root/bench/bench_train_cpu.py" --batch 8 --rows headline,pool3 --reps 3 --dtype float16 |
      tee -a "$OUT/train_cpu.md" &&
    "$py" "$root/bench/bench_train_cpu.py" --batch 8 --rows headline --reps 3 --dtype bfloat16 | tee -a "$OUT/train_cpu.md"
}

for s in "${stages[@]}"; do
  t0=$(date +%s)
  echo "### stage $s"
  if "stage_$s" >"$OUT/logs/$s.log" 2>&1; then r=ok; else r=FAIL; fi
  t1=$(date +%s)
  tail -n 25 "$OUT/logs/$s.log"
  summary+=("$(printf '%-9s %-4s %4ss' "$s" "$r" "$((t1 - t0))")")
done
tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "### summary"
printf '%s\n' "${summary[@]}"
for t in bench_table.md bench_cpu_table.md shapes_table.md; do [ -f "$OUT/$t" ] && cat "$OUT/$t"; done
exit 0
