#!/usr/bin/env bash
# A/B of a patch on the GPU in one device call: the committed tree (A) against the same tree
# with patches applied (B), built side by side and benchmarked alternately on one machine.
#
#   scripts/ab.sh prepare PATCH [PATCH ...]   (here) writes scratch_ab/: HEAD plus the patches
#   then run on the device, carrying scratch_ab (it is git-ignored):
#     scripts/device.sh env ab                 with AB_BENCH, a ';'-separated list of
#                                              bench_gpu argument sets (default: the backward's
#                                              and the forward's headline rows; none: no
#                                              rows) and AB_TRAINPROF, bench/profile_train.py's
#                                              arguments to profile the training step in A, then B
# stage_ab (scripts/device.sh) builds $build from this tree and scratch_ab/build-ab from the
# copy, 8 jobs each at once, runs ctest's test_cuda_backward on B, then each bench row on A,
# B, A, B and prints both medians of both rounds.
#
#   scripts/ab.sh prebuild                    (here, after prepare) builds both for sm_90a and
#                                              packs the programs into scratch_ab/prebuilt/;
#                                              then `scripts/device.sh abpre` (carry scratch_ab)
#                                              runs B's tests (AB_TESTS) and AB_BENCH without
#                                              building on the device
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
case "${1:-}" in
  prepare)
    shift
    [ $# -gt 0 ] || { echo "ab.sh prepare: name at least one patch" >&2; exit 2; }
    rm -rf scratch_ab
    mkdir scratch_ab
    git archive HEAD | tar -x -C scratch_ab
    for p in "$@"; do
      # From the repository root with --directory: run inside scratch_ab/ (a subdirectory of this
      # repository), git apply skips every path outside it, that is all of them, and says nothing.
      git apply --directory=scratch_ab "$p" || { echo "ab.sh: $p does not apply to HEAD" >&2; exit 1; }
      echo "applied $p: $(git apply --numstat "$p" | awk '{a += $1; d += $2} END {print "+" a " -" d " lines"}')"
    done
    # The copy must differ from HEAD in every file the patches touch.
    for f in $(for p in "$@"; do git apply --numstat "$p" | cut -f3; done | sort -u); do
      if git show "HEAD:$f" 2>/dev/null | cmp -s - "scratch_ab/$f"; then
        echo "ab.sh: scratch_ab/$f is still HEAD's" >&2; exit 1
      fi
    done
    printf '%s\n' "$@" >scratch_ab/.ab_patches
    du -sh scratch_ab
    ;;
  prebuild)
    # Build A (this tree, which should be HEAD) and B (scratch_ab/) here for sm_90a only, and
    # pack the programs the device stage abpre runs into scratch_ab/prebuilt/{A,B}/ (gzipped:
    # ~6 MB each), so an A/B call spends its device time measuring, not compiling (~100 s).
    # Same nvcc (13.0) as the device; the device finds its own CUDA runtime.
    [ -d scratch_ab ] || { echo "ab.sh prebuild: run scripts/ab.sh prepare PATCH first" >&2; exit 1; }
    jobs=$(nproc)
    for side in A B; do
      src=$root; [ "$side" = B ] && src=$root/scratch_ab
      dir=$root/build-ab-pre-$side
      cmake -S "$src" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real >/dev/null
      targets=(bench_gpu); [ "$side" = B ] && targets+=(test_cuda_backward test_cuda)
      cmake --build "$dir" -j"$jobs" --target "${targets[@]}" >"$dir/prebuild.log" 2>&1 ||
        { echo "ab.sh prebuild: $side failed to build (see $dir/prebuild.log)" >&2; exit 1; }
      progs=(bench/bench_gpu); [ "$side" = B ] && progs+=(tests/test_cuda_backward tests/test_cuda)
      "$root/scripts/ab_run.sh" pack "$side" "$dir" "${progs[@]}" >/dev/null
    done
    { echo "A: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src tests bench include || echo ' + working-tree changes')"
      echo "B: that + $(tr '\n' ' ' <scratch_ab/.ab_patches 2>/dev/null || echo 'the prepared patches')"; } >scratch_ab/prebuilt/REVISIONS
    du -sh scratch_ab
    ;;
  *)
    echo "usage: scripts/ab.sh prepare PATCH [PATCH ...] | prebuild" >&2
    exit 2
    ;;
esac
