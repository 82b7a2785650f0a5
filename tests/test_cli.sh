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
# A --divisor beyond a double's range is refused, not silently made inf or 0; the spellings of
# inf, -inf and nan stay accepted.
expect 2 "^convpool: --divisor: '1e999' is beyond the range of a double" "${small[@]}" --divisor 1e999
expect 2 "^convpool: --divisor: .*become -inf" "${small[@]}" --divisor -1e999
expect 2 "^convpool: --divisor: .*become 0" "${small[@]}" --divisor 1e-400
expect 0 'result +PASS' "${small[@]}" --divisor inf
expect 0 'result +PASS' "${small[@]}" --divisor -inf
expect 0 'result +PASS' "${small[@]}" --divisor nan
# OMP_NUM_THREADS far beyond the machine: the CLI's own input filler obeys the library's cap, and
# the device line gives the threads started, not the ones asked for.
OMP_NUM_THREADS=100000 expect 0 'result +PASS' --device cpu --batch 1 --depth 6 --height 8 --width 8 --iters 1
OMP_NUM_THREADS=100000 reject '100000 threads' --device cpu --batch 1 --depth 6 --height 8 --width 8 --iters 1
reject '4000 threads' "${small[@]}" --threads 4000
if "$cli" --explain 2>&1 | grep -q "built without CUDA"; then
  echo "test_cli: built without CUDA, --explain checks skipped"
  # --help: exit 1 is a failed check, out of memory or a CUDA error; this is a usage error.
  expect 2 'built without CUDA' --explain
else
  expect 0 '^plan k3p2' --explain
  expect 0 '^plan general' --explain --kernel 5 --pool 3
  expect 0 '^plan general' --explain --kernel 2,3,11 --width 20
  expect 0 '^plan generic' --explain --kernel 1,200,3 --depth 4 --height 210 --width 8 --pool 1
fi

# ---- files (the build has cJSON when --output is not refused for want of it) ----
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# npy FILE SHAPE NUMEL: float32 zeros, version 1.0 header of 118 bytes.
npy() {
  { printf '\x93NUMPY\x01\x00\x76\x00'
    printf '%-117s\n' "{'descr': '<f4', 'fortran_order': False, 'shape': $2, }"
    head -c $(($3 * 4)) /dev/zero; } >"$1"
}
# st FILE JSON DATA_BYTES: a safetensors file of zeros.
st() {
  local n=${#2}
  { printf "$(printf '\\x%02x\\x%02x' $((n & 255)) $((n >> 8 & 255)))\\x00\\x00\\x00\\x00\\x00\\x00"
    printf '%s' "$2"
    head -c "$3" /dev/zero; } >"$1"
}
t_w='"conv.weight":{"dtype":"F32","shape":[3,2,3,3,3],"data_offsets":[0,648]}'
t_b='"bias":{"dtype":"F32","shape":[3,1,1,1],"data_offsets":[660,672]}'
npy "$dir/x.npy" '(2, 2, 6, 8, 8)' 1536
st "$dir/w.st" "{$t_w,\"conv.bias\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[648,660]},$t_b}" 672
files=(--device cpu --iters 1 --input "$dir/x.npy" --weights "$dir/w.st")
if "$cli" "${files[@]}" --output "$dir/probe.npy" 2>&1 | grep -q "no cJSON"; then
  echo "test_cli: built without cJSON, file checks skipped"
else
  expect 0 'result +PASS' "${files[@]}"
  # conv.bias is nn.Conv3d's: 1-D [Cout]. No two tensors share bytes; no key twice.
  st "$dir/cb2d.st" "{$t_w,\"conv.bias\":{\"dtype\":\"F32\",\"shape\":[3,1],\"data_offsets\":[648,660]},$t_b}" 672
  expect 2 'conv.bias must be 1-D \[Cout = 3\], got shape \[3, 1\]' "${files[@]/w.st/cb2d.st}"
  st "$dir/alias.st" "{$t_w,\"conv.bias\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},$t_b}" 672
  expect 2 "tensors 'conv.(bias|weight)' and 'conv.(bias|weight)' overlap" "${files[@]/w.st/alias.st}"
  st "$dir/dup.st" "{$t_w,\"conv.bias\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[648,660]},$t_b,$t_b}" 672
  expect 2 "holds key 'bias' twice" "${files[@]/w.st/dup.st}"

  # An output that names an input or the other output is refused, naming both flags; the
  # input is left intact.
  cp "$dir/x.npy" "$dir/x.keep"
  expect 2 "^convpool: --output: .* is the same file as --input" "${files[@]}" --output "$dir/./x.npy"
  expect 2 "^convpool: --pooled: .* is the same file as --weights" "${files[@]}" --pooled "$dir/../${dir##*/}/w.st"
  ln -s x.npy "$dir/xlink.npy"
  expect 2 "^convpool: --pooled: .* is the same file as --input" "${files[@]}" --pooled "$dir/xlink.npy"
  expect 2 "^convpool: --pooled: .* is the same file as --output" "${small[@]}" --output "$dir/o.npy" \
    --pooled "$dir/./o.npy"
  cmp -s "$dir/x.npy" "$dir/x.keep" || { echo "FAIL: a refused run changed --input"; fails=$((fails + 1)); }

  # Outputs are created before the run: one that cannot be is reported before any computing,
  # and the other output is not written.
  expect 2 'nodir/p.npy: cannot create' "${small[@]}" --output "$dir/o1.npy" --pooled "$dir/nodir/p.npy"
  reject 'result' "${small[@]}" --output "$dir/o1.npy" --pooled "$dir/nodir/p.npy"
  [ ! -e "$dir/o1.npy" ] || { echo "FAIL: --output written though --pooled could not be"; fails=$((fails + 1)); }
  # A directory is no output file: refused before the run too.
  mkdir -p "$dir/adir"
  expect 2 'adir: is a directory' "${small[@]}" --output "$dir/adir"
  reject 'result' "${small[@]}" --output "$dir/adir"

  # A failed write (here EFBIG from a file-size limit of 0) leaves both files as they were, no
  # temporary behind, and no JSON report on stdout; exit 2.
  expect 0 'result +PASS' "${small[@]}" --output "$dir/o.npy" --pooled "$dir/p.npy"
  cp "$dir/o.npy" "$dir/o.keep"
  cp "$dir/p.npy" "$dir/p.keep"
  out=$( (trap '' XFSZ; ulimit -f 0; "$cli" "${small[@]}" --seed 7 --json --output "$dir/o.npy" \
    --pooled "$dir/p.npy" 2>/dev/null; echo "rc=$?") | cat)
  if [[ "$out" != "rc=2" ]] || ! cmp -s "$dir/o.npy" "$dir/o.keep" || ! cmp -s "$dir/p.npy" "$dir/p.keep" ||
    ls "$dir" | grep -qE '\.npy\.......$'; then
    echo "FAIL: a failed write: stdout+rc '$out', or a file changed, or a temporary left:"
    ls "$dir" | sed 's/^/    /'
    fails=$((fails + 1))
  fi
  # A successful run replaces them.
  expect 0 'result +PASS' "${small[@]}" --seed 7 --output "$dir/o.npy" --pooled "$dir/p.npy"
  ! cmp -s "$dir/o.npy" "$dir/o.keep" || { echo "FAIL: --output not replaced"; fails=$((fails + 1)); }
fi

if [ "$fails" -ne 0 ]; then
  echo "test_cli: $fails failure(s)"
  exit 1
fi
echo "test_cli: all checks passed"
