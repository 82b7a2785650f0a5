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
    du -sh scratch_ab
    ;;
  *)
    echo "usage: scripts/ab.sh prepare PATCH [PATCH ...]" >&2
    exit 2
    ;;
esac
