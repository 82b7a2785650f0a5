#!/usr/bin/env bash
# Several prebuilt variants measured side by side in one device call, with whatever else that
# call should do: tests of any variant under any environment, bench_gpu rows alternating the
# variants, compute-sanitizer and ncu (per-instruction stall samples) on one variant, pytest
# files and bench/profile_train.py steps on the working tree's extension, SM clocks beside the
# rows. The thirty-first session ran its twelve device calls through this (as scratch_ab/run4.sh).
#
# Here (no GPU needed), one variant a build directory:
#   scripts/ab_run.sh pack SIDE BUILD_DIR [PROGRAM ...]
#                                           gzips BUILD_DIR's PROGRAMs (default: bench/bench_gpu,
#                                           tests/test_cuda_backward and tests/test_cuda, those
#                                           built) into scratch_ab/prebuilt/SIDE/ (scripts/ab.sh
#                                           prebuild packs its two sides so)
#   e.g. cmake -S . -B build-x -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real &&
#        cmake --build build-x -j2 --target bench_gpu test_cuda_backward test_cuda &&
#        scripts/ab_run.sh pack A build-x
#   (~6 MB a program; the working tree plus carry must stay under 64 MiB, so pack 2-3 sides).
# On the device (carry scratch_ab), `scripts/ab_run.sh run` with any of:
#   SIDES="A B"            the variants, in scratch_ab/prebuilt/ (default: every directory there;
#                          scripts/device.sh abpre runs this with A and B)
#   TESTS="B/test_cuda_backward;CONVPOOL_PDL=0 B/test_cuda"   ';'-separated, ENV=V words first
#   TEST_TIMEOUT=150       seconds a test
#   ROWS="--backward w --batch 128;--train --batch 128"       bench_gpu rows: two rounds of every
#                          side in turn, medians of 20 (ab.txt; clocks.csv holds the SM clocks)
#   SAN="--tool racecheck --kernel-name kns=weight_sm90 test_cuda_backward"  ';'-separated
#                          compute-sanitizer runs of SAN_SIDE's program (default: the last side)
#   NCU="weight_sm90:--backward w --batch 128"   ';'-separated KERNEL_REGEX:bench_gpu args: the
#                          third matching launch of NCU_SIDE's bench_gpu (default: the last
#                          side), stall samples by SASS line (scripts/ncu_source.py reads the
#                          .csv.gz) and the summary sections
#   PYTEST_FILES="python/tests/test_cuda_training.py"   pytest on the working tree's extension
#                          (built in the background while the tests run)
#   STEP="--rows headline:128 --no-grad-x --top 16"     bench/profile_train.py, two rounds for each
#                          CONVPOOL_PDL value in STEP_PDL (default: unset, i.e. the default)
#   EXTRA_STEPS="--rows headline:128 --top 16;--rows headline:128 --strict --top 16"   more
#                          profile_train.py runs, one each, into extraN.md (e.g. the listings)
#   ENV_AB="CONVPOOL_SIDE_STREAM 0 1 --no-grad-x"   ';'-separated docs/experiments/env_step_ab.py
#                          argument lists (an environment switch's sides alternating on whole
#                          steps in one process; AB_ROUNDS rounds, default 3), into env_abN.txt
#   TAR=1                  $OUT packed into all.tgz at the end, the files removed: a device call
#                          returns only a few files, so pack them when there are many
# Everything lands in $OUT; the summary lines print as they come. The status is 1 where a test
# failed (a skip, status 77, is not a failure), a bench row did not run, pytest or a sanitizer
# run failed. Wrap the call in `timeout`; the thirty-fourth session's calls ran it as
#   SIDES="A B" TESTS="B/test_cuda;B/test_cuda_backward" ROWS="--batch 128;--train --batch 128" \
#   STEP="--rows headline:128 --no-grad-x --top 16" ENV_AB="CONVPOOL_PDL_FIRST 0 1 --no-grad-x" \
#   TAR=1 timeout 540 scripts/ab_run.sh run
# with carry ["scratch_ab"].
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
progs=(bench/bench_gpu tests/test_cuda_backward tests/test_cuda)

case "${1:-}" in
  pack)
    side=${2:?usage: scripts/ab_run.sh pack SIDE BUILD_DIR [PROGRAM ...]}
    dir=${3:?usage: scripts/ab_run.sh pack SIDE BUILD_DIR [PROGRAM ...]}
    shift 3
    [ $# -gt 0 ] && progs=("$@")
    rm -rf "scratch_ab/prebuilt/$side"
    mkdir -p "scratch_ab/prebuilt/$side"
    for p in "${progs[@]}"; do
      if [ -x "$dir/$p" ]; then
        gzip -c "$dir/$p" >"scratch_ab/prebuilt/$side/$(basename "$p").gz"
      elif [ $# -gt 0 ]; then
        echo "ab_run.sh pack: $dir/$p is not built" >&2
        exit 1
      fi
    done
    echo "$side: packed from $dir when HEAD was $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src include tests bench || echo ' + working-tree changes') (the build is what $dir last built)" \
      >"scratch_ab/prebuilt/$side/REVISION"
    ls "scratch_ab/prebuilt/$side"; du -sh scratch_ab
    exit 0
    ;;
  run) ;;
  *)
    echo "usage: scripts/ab_run.sh pack SIDE BUILD_DIR [PROGRAM ...] | run (see the header)" >&2
    exit 2
    ;;
esac

OUT=${OUT:-$root/out}
mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$root/scratch_ab/.ext}
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
read -r -a sides <<<"${SIDES:-$(cd scratch_ab/prebuilt && for d in */; do printf '%s ' "${d%/}"; done)}"
last=${sides[${#sides[@]}-1]}
bin=$(mktemp -d)
rc=0
for s in "${sides[@]}"; do
  mkdir -p "$bin/$s"
  for f in scratch_ab/prebuilt/$s/*.gz; do
    [ -f "$f" ] || continue
    gunzip -c "$f" >"$bin/$s/$(basename "$f" .gz)" && chmod +x "$bin/$s/$(basename "$f" .gz)"
  done
  cat "scratch_ab/prebuilt/$s/REVISION" 2>/dev/null
done
nvidia-smi -L
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv

wants_ext=${PYTEST_FILES:-}${STEP:-}${EXTRA_STEPS:-}${ENV_AB:-}
extpid=
if [ -n "$wants_ext" ]; then
  (MAX_JOBS=$(nproc) timeout 300 python3 -c "import convpool; convpool.load(); print('extension built')") \
    >"$OUT/ext.log" 2>&1 &
  extpid=$!
fi

IFS=';' read -r -a tests <<<"${TESTS:-}"
n=0
for t in "${tests[@]}"; do
  [ -n "$t" ] || continue
  n=$((n + 1))
  read -r -a words <<<"$t"
  envs=() prog=
  for w in "${words[@]}"; do case "$w" in *=*) envs+=("$w") ;; *) prog=$w ;; esac; done
  args=()
  case "$prog" in */test_cuda) args=("$root/tests/golden") ;; esac
  start=$(date +%s)
  env "${envs[@]}" timeout "${TEST_TIMEOUT:-150}" "$bin/$prog" "${args[@]}" >"$OUT/test$n.log" 2>&1
  trc=$?
  echo "TEST [$t] rc=$trc $(($(date +%s) - start)) s: $(tail -n 1 "$OUT/test$n.log")"
  if [ $trc -ne 0 ] && [ $trc -ne 77 ]; then
    grep -iE "FAIL" "$OUT/test$n.log" | head -5
    rc=1
  fi
done

if [ -n "$extpid" ]; then
  wait "$extpid"
  tail -n 1 "$OUT/ext.log"
fi

nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 250 >"$OUT/clocks.csv" 2>&1 &
smi=$!
IFS=';' read -r -a rows <<<"${ROWS:-}"
for row in "${rows[@]}"; do
  [ -n "$row" ] || continue
  read -r -a a <<<"$row"
  res=()
  for round in 1 2; do
    for s in "${sides[@]}"; do
      m=$(timeout 60 "$bin/$s/bench_gpu" "${a[@]}" --iters 20 --warmup 3 --json 2>/dev/null |
        sed -n 's/.*"median_ms": \([0-9.]*\).*/\1/p')
      [ -n "$m" ] || rc=1
      res+=("$s$round=${m:-FAIL}")
    done
  done
  echo "ab | $row | ${res[*]}" | tee -a "$OUT/ab.txt"
done

if [ -n "${PYTEST_FILES:-}" ]; then
  start=$(date +%s)
  timeout "${PYTEST_TIMEOUT:-200}" python3 -m pytest $PYTEST_FILES -q -x -rs ${PYTEST_K:+-k "$PYTEST_K"} \
    >"$OUT/pytest.log" 2>&1
  prc=$?
  [ $prc -eq 0 ] || rc=1
  echo "PYTEST rc=$prc $(($(date +%s) - start)) s: $(tail -n 1 "$OUT/pytest.log")"
fi

if [ -n "${STEP:-}" ]; then
  for round in 1 2; do
    for pdl in ${STEP_PDL:-default}; do
      echo "=== step round $round CONVPOOL_PDL=$pdl" >>"$OUT/step.txt"
      if [ "$pdl" = default ]; then
        timeout 150 python3 bench/profile_train.py $STEP >>"$OUT/step.txt" 2>&1
      else
        CONVPOOL_PDL=$pdl timeout 150 python3 bench/profile_train.py $STEP >>"$OUT/step.txt" 2>&1
      fi
      echo "step round $round CONVPOOL_PDL=$pdl: $(grep -E '^### convpool: step' "$OUT/step.txt" | tail -n 1)"
    done
  done
fi
kill "$smi" 2>/dev/null

IFS=';' read -r -a extra <<<"${EXTRA_STEPS:-}"
k=0
for e in "${extra[@]}"; do
  [ -n "$e" ] || continue
  k=$((k + 1))
  timeout 150 python3 bench/profile_train.py $e >"$OUT/extra$k.md" 2>&1 || rc=1
  echo "EXTRA [$e]: $(grep -E '^### convpool: step' "$OUT/extra$k.md" | tail -n 1)"
done

IFS=';' read -r -a envabs <<<"${ENV_AB:-}"
k=0
for e in "${envabs[@]}"; do
  [ -n "$e" ] || continue
  k=$((k + 1))
  timeout 150 python3 docs/experiments/env_step_ab.py $e --rounds "${AB_ROUNDS:-3}" >"$OUT/env_ab$k.txt" 2>&1 || rc=1
  echo "ENV_AB [$e]:"
  tail -n 3 "$OUT/env_ab$k.txt"
done

if [ -n "${SAN:-}" ]; then
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  IFS=';' read -r -a sans <<<"$SAN"
  k=0
  for t in "${sans[@]}"; do
    k=$((k + 1))
    read -r -a w <<<"$t"
    timeout 300 "$san" "${w[@]:0:${#w[@]}-1}" "$bin/${SAN_SIDE:-$last}/${w[-1]}" >"$OUT/san$k.log" 2>&1
    src=$?
    [ $src -eq 0 ] || rc=1
    echo "SAN [$t] rc=$src: $(tail -n 1 "$OUT/san$k.log")"
  done
fi

if [ -n "${NCU:-}" ]; then
  IFS=';' read -r -a ncus <<<"$NCU"
  for t in "${ncus[@]}"; do
    name=${t%%:*}
    read -r -a a <<<"${t#*:}"
    tag="$OUT/ncu_${name//[^A-Za-z0-9_]/_}"
    prof=(ncu --clock-control none --kernel-name regex:"$name" --launch-skip 2 --launch-count 1)
    run=("$bin/${NCU_SIDE:-$last}/bench_gpu" "${a[@]}" --iters 3 --warmup 2)
    timeout 240 "${prof[@]}" --section WarpStateStats --section SourceCounters --page source --print-source sass \
      --csv "${run[@]}" >"${tag}_source.csv" 2>"$tag.err" && gzip -f "${tag}_source.csv"
    timeout 200 "${prof[@]}" --section SpeedOfLight --section Occupancy --section SchedulerStats \
      --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis "${run[@]}" >"$tag.txt" 2>&1
    echo "NCU $name: $(grep -E 'Duration' "$tag.txt" | head -n 1 | tr -s ' ')"
  done
fi
if [ -n "${TAR:-}" ] && [ -n "$(cd "$OUT" && find . -type f ! -name all.tgz)" ]; then
  (cd "$OUT" && tar czf all.tgz --exclude ./all.tgz . && find . -type f ! -name all.tgz -delete)
fi
exit $rc
