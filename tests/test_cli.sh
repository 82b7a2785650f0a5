#!/usr/bin/env bash
# The CLI's argument handling: every reproducer of the "Hardening" issue exits with a one-line
# error naming the right flag (exit 2), or runs and passes its check (exit 0).
#   tests/test_cli.sh build/convpool
set -u
cli=${1:?usage: test_cli.sh path/to/convpool}
fails=0

# expect CODE PATTERN ARGS...: exit status CODE and PATTERN (grep -E) in stdout+stderr.
expect() {
  local code=$1 pattern=$2
  shift 2
  local out rc
  out=$("$cli" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL: convpool $* -> exit $rc (want $code), output must match /$pattern/:"
    sed 's/^/    /' <<<"$out" | head -8
    fails=$((fails + 1))
  fi
}
# reject PATTERN ARGS...: PATTERN must NOT appear in the output.
reject() {
  local pattern=$1
  shift
  if "$cli" "$@" 2>&1 | grep -qE -- "$pattern"; then
    echo "FAIL: convpool $* mentions /$pattern/"
    fails=$((fails + 1))
  fi
}

small=(--device cpu --batch 2 --depth 6 --height 8 --width 8 --in-channels 2 --out-channels 3 --iters 1)

# An overflowing size blames its own flag, not another factor of the product.
expect 2 '^convpool: --width: .*in_w \(1099511627776\) is too large' --width 1099511627776
reject '--in-channels' --width 1099511627776
expect 2 '^convpool: --out-channels: ' --out-channels 2305843009213693952 --in-channels 1 --batch 1
# Caps: a clear error and exit 2, documented in --help.
expect 2 '^convpool: --iters: expected an integer from 1 to 1000000' --iters 99999999999999
expect 2 '^convpool: --iters: ' --iters 2147483648
expect 2 '^convpool: --threads: expected at most 4096' --threads 100000
expect 0 'timed runs \(median reported\), at most 1000000' --help
expect 0 'CPU threads, 0 = all cores; at most 4096' --help
# float32 edges the reference now models as PyTorch does: no false FAIL.
expect 0 'result +PASS' "${small[@]}" --divisor 1e-39
expect 0 'result +PASS' "${small[@]}" --divisor 3e38
expect 0 'result +PASS' "${small[@]}" --divisor 1e-45
# The plan is printed without a GPU (in builds with the CUDA path).
if "$cli" --explain 2>&1 | grep -q "built without CUDA"; then
  echo "test_cli: built without CUDA, --explain checks skipped"
  expect 1 'built without CUDA' --explain
else
  expect 0 '^plan k3p2' --explain
  expect 0 '^plan general' --explain --kernel 5 --pool 3
  expect 0 '^plan general' --explain --kernel 2,3,11 --width 20
  expect 0 '^plan generic' --explain --kernel 1,200,3 --depth 4 --height 210 --width 8 --pool 1
fi

if [ "$fails" -ne 0 ]; then
  echo "test_cli: $fails failure(s)"
  exit 1
fi
echo "test_cli: all checks passed"
