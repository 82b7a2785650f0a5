"""The CLI's file I/O: --input X.npy, --weights W.safetensors, --output OUT.npy, --pooled P.npy.

1. End to end against the real PyTorch Model: the state dict saved with safetensors.torch and x
   saved with np.save go through `convpool --device cpu`, and the files it writes must match
   Model (in float64) on the same operands.
2. Problem-size flags given explicitly must agree with the files (exit 2 naming flag and file).
3. Corrupt files (npy and safetensors, written byte by byte here) give exit status 2 and exactly
   one line on stderr naming the file; never a crash.

The CLI is $CONVPOOL_CLI, else <repo>/build/convpool; the module is skipped if it is absent.
"""
import json
import os
import struct
import subprocess

import numpy as np
import pytest
import torch

import convpool

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("CONVPOOL_CLI") or os.path.join(REPO, "build", "convpool")

if not (os.path.isfile(CLI) and os.access(CLI, os.X_OK)):
    pytest.skip(f"convpool CLI not found at {CLI} (build it with cmake, or set CONVPOOL_CLI)",
                allow_module_level=True)

_probe = subprocess.run([CLI, "--input", os.devnull], capture_output=True, text=True, timeout=60)
if "no cJSON" in _probe.stderr:
    pytest.skip("this convpool CLI was built without cJSON (install libcjson-dev): no file input/output",
                allow_module_level=True)
safetensors_torch = pytest.importorskip("safetensors.torch", reason="pip install safetensors")

TIMEOUT_S = 60


def run_cli(*args):
    """Runs the CLI; returns the CompletedProcess. Fails (not hangs) past TIMEOUT_S."""
    cmd = [CLI, *[str(a) for a in args]]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"CLI timed out after {TIMEOUT_S} s: {' '.join(cmd)}")


def describe(proc):
    return (f"exit status {proc.returncode}\n--- stdout ---\n{proc.stdout}"
            f"\n--- stderr ---\n{proc.stderr}")


def assert_not_crashed(proc):
    assert proc.returncode >= 0, f"CLI killed by signal {-proc.returncode}\n{describe(proc)}"
    assert proc.returncode < 128, f"CLI crashed (exit status {proc.returncode})\n{describe(proc)}"


def tuple3(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v, v)


def spec_arg(v):
    """3 -> '3', (1, 3, 5) -> '1,3,5' (the CLI's K|KD,KH,KW form)."""
    return ",".join(str(i) for i in v) if isinstance(v, (tuple, list)) else str(v)


# ------------------------------------------------------------------------------------------------
# 1. End to end against PyTorch
# ------------------------------------------------------------------------------------------------

# name, batch (None = a 4-D single-sample x file), Cin, Cout, (D, H, W), kernel, pool, divisor,
# x file dtype, weights file dtype
CONFIGS = [
    ("headline_small", 2, 8, 16, (6, 12, 14), 3, 2, 2.0, torch.float32, torch.float32),
    ("anisotropic", 3, 4, 6, (5, 9, 13), (1, 3, 5), (1, 2, 3), -1.5, torch.float32, torch.float32),
    ("single_sample_4d", None, 3, 5, (7, 8, 9), 3, 2, 2.0, torch.float32, torch.float32),
    ("x_float16", 2, 4, 8, (6, 10, 12), 3, 2, 2.0, torch.float16, torch.float32),
    ("weights_f16", 2, 4, 8, (6, 10, 12), 3, 2, 0.75, torch.float32, torch.float16),
    ("weights_bf16", 2, 4, 8, (6, 10, 12), 3, 2, 3.0, torch.float32, torch.bfloat16),
    ("kernel5_pool3", 2, 4, 6, (9, 11, 13), 5, 3, 2.0, torch.float32, torch.float32),
]


def make_case(tmp_path, batch, cin, cout, dhw, kernel, pool, divisor, x_dtype, w_dtype, seed=0,
              bias_shape_in_file=None):
    """Writes x.npy and w.safetensors; returns (model in float64 holding the file's parameter
    values, x in float64 as 5-D holding the file's values, x path, weights path)."""
    torch.manual_seed(seed)
    model = convpool.Model(cin, cout, kernel, divisor, pool, (cout, 1, 1, 1), 1)
    shape = (cin, *dhw) if batch is None else (batch, cin, *dhw)
    x = torch.rand(*shape).to(x_dtype)  # U[0,1): never all zeros
    x_path = tmp_path / "x.npy"
    np.save(x_path, x.numpy())
    w_path = tmp_path / "w.safetensors"
    state = {k: v.detach().to(w_dtype).contiguous() for k, v in model.state_dict().items()}
    saved = dict(state)
    if bias_shape_in_file is not None:  # same Cout values, another shape
        saved["bias"] = state["bias"].reshape(bias_shape_in_file).contiguous()
    safetensors_torch.save_file(saved, str(w_path))
    # The reference sees exactly the values in the files (float16/bfloat16 rounding included),
    # upcast to float64.
    model = model.double()
    with torch.no_grad():
        for k, v in model.state_dict().items():
            v.copy_(state[k].to(torch.float64))
    x64 = x.to(torch.float64)
    if batch is None:
        x64 = x64.unsqueeze(0)  # a 4-D file is a batch of one
    return model, x64, x_path, w_path


def reference(model, x64):
    """(out (N,), P (N, Cout)) of Model in float64."""
    with torch.no_grad():
        out = model(x64).reshape(x64.shape[0])
        pooled = model.global_avg_pool(model.max_pool(model.conv(x64) / model.divisor))
    return out, pooled.reshape(x64.shape[0], -1)


def assert_matches(got, ref, what):
    # The CLI computes in float32 with float32 accumulation; at these sizes (<= a few thousand
    # taps, values O(1)) its error is ~1e-6 relative to the result's scale, so 1e-4 * (1 + max|ref|)
    # leaves ~100x headroom while still catching any indexing/layout/dtype mistake.
    ref = ref.numpy()
    assert got.dtype == np.float32, f"{what}: dtype {got.dtype}, expected float32"
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, expected {ref.shape}"
    assert np.isfinite(got).all(), f"{what}: non-finite values {got}"
    err = np.abs(got.astype(np.float64) - ref).max()
    tol = 1e-4 * (1.0 + np.abs(ref).max())
    assert err <= tol, f"{what}: max abs err {err:.3g} > tol {tol:.3g}\ngot {got}\nref {ref}"


@pytest.mark.parametrize("name, batch, cin, cout, dhw, kernel, pool, divisor, x_dtype, w_dtype",
                         CONFIGS, ids=[c[0] for c in CONFIGS])
def test_end_to_end_matches_pytorch(tmp_path, name, batch, cin, cout, dhw, kernel, pool, divisor,
                                    x_dtype, w_dtype):
    model, x64, x_path, w_path = make_case(tmp_path, batch, cin, cout, dhw, kernel, pool, divisor,
                                           x_dtype, w_dtype)
    out_path, p_path = tmp_path / "out.npy", tmp_path / "pooled.npy"
    proc = run_cli("--device", "cpu", "--iters", "1", "--check-batch", "1",
                   f"--divisor={divisor!r}", f"--pool={spec_arg(pool)}",
                   "--input", x_path, "--weights", w_path, "--output", out_path, "--pooled", p_path)
    assert_not_crashed(proc)
    assert proc.returncode == 0, describe(proc)
    assert "PASS" in proc.stdout, describe(proc)
    assert out_path.is_file() and p_path.is_file(), describe(proc)
    ref_out, ref_p = reference(model, x64)
    n = x64.shape[0]
    got_out, got_p = np.load(out_path), np.load(p_path)
    assert got_out.shape == (n,) and got_p.shape == (n, cout), (got_out.shape, got_p.shape)
    assert_matches(got_p, ref_p, f"{name}: pooled")
    assert_matches(got_out, ref_out, f"{name}: out")


@pytest.mark.parametrize("bias_shape", [(6, 1, 1, 1), (1, 6, 1, 1, 1)])
def test_bias_of_per_channel_shapes(tmp_path, bias_shape):
    model, x64, x_path, w_path = make_case(tmp_path, 2, 4, 6, (6, 7, 8), 3, 2, 2.0,
                                           torch.float32, torch.float32,
                                           bias_shape_in_file=bias_shape)
    out_path = tmp_path / "out.npy"
    proc = run_cli("--device", "cpu", "--iters", "1", "--check-batch", "1", "--divisor=2",
                   "--pool=2", "--input", x_path, "--weights", w_path, "--output", out_path)
    assert_not_crashed(proc)
    assert proc.returncode == 0, describe(proc)
    assert_matches(np.load(out_path), reference(model, x64)[0], f"out, bias file shape {bias_shape}")


@pytest.mark.parametrize("bias_shape", [(6,), (1, 6), (6, 1, 1), (1, 1, 1, 6)])
def test_bias_that_pytorch_broadcasts_elsewhere_is_refused(tmp_path, bias_shape):
    # A Model built with these bias shapes adds the bias along other axes than the channels
    # and returns another shape (e.g. (N, 1, 1, 6) for (6,)): the CLI, which computes one bias
    # value a channel, must refuse the file rather than answer what that model does not compute.
    torch.manual_seed(0)
    m = convpool.Model(4, 6, 3, 2.0, 2, bias_shape, 1)
    with torch.no_grad():
        assert m(torch.rand(2, 4, 6, 7, 8)).shape != (2, 1, 1, 1)
    _, _, x_path, w_path = make_case(tmp_path, 2, 4, 6, (6, 7, 8), 3, 2, 2.0, torch.float32, torch.float32,
                                     bias_shape_in_file=bias_shape)
    out_path = tmp_path / "out.npy"
    proc = run_cli("--device", "cpu", "--iters", "1", "--input", x_path, "--weights", w_path, "--output", out_path)
    assert_not_crashed(proc)
    assert proc.returncode == 2, describe(proc)
    assert "is not one value a channel" in proc.stderr, describe(proc)
    assert not out_path.exists()


def test_explicit_flags_that_agree_are_accepted(tmp_path):
    model, x64, x_path, w_path = make_case(tmp_path, 2, 4, 6, (6, 7, 8), 3, 2, 2.0,
                                           torch.float32, torch.float32)
    out_path = tmp_path / "out.npy"
    proc = run_cli("--device", "cpu", "--iters", "1", "--check-batch", "1",
                   "--batch", 2, "--in-channels", 4, "--out-channels", 6, "--depth", 6,
                   "--height", 7, "--width", 8, "--kernel", "3,3,3", "--pool", 2, "--divisor", 2,
                   "--input", x_path, "--weights", w_path, "--output", out_path)
    assert_not_crashed(proc)
    assert proc.returncode == 0, describe(proc)
    assert_matches(np.load(out_path), reference(model, x64)[0], "out")


# ------------------------------------------------------------------------------------------------
# 2. Explicit flags disagreeing with the files
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def good_files(tmp_path_factory):
    """A valid pair: x (2, 8, 6, 12, 14) float32, weights for Cin 8, Cout 16, kernel 3."""
    d = tmp_path_factory.mktemp("good")
    _, _, x_path, w_path = make_case(d, 2, 8, 16, (6, 12, 14), 3, 2, 2.0,
                                     torch.float32, torch.float32)
    good_x, good_w = d / "good_x.npy", d / "good_w.safetensors"
    os.rename(x_path, good_x)
    os.rename(w_path, good_w)
    return good_x, good_w


# flag, value, which file(s) may be named ("x", "w"): the one the flag's size comes from
DISAGREEING = [
    ("--in-channels", 3, ("x", "w")),
    ("--kernel", 5, ("w",)),
    ("--kernel", "3,3,5", ("w",)),
    ("--out-channels", 4, ("w",)),
    ("--batch", 5, ("x",)),
    ("--depth", 7, ("x",)),
    ("--height", 11, ("x",)),
    ("--width", 15, ("x",)),
]


@pytest.mark.parametrize("flag, value, named", DISAGREEING,
                         ids=[f"{f}={v}" for f, v, _ in DISAGREEING])
def test_flag_disagreeing_with_file(good_files, flag, value, named):
    x_path, w_path = good_files
    proc = run_cli("--device", "cpu", "--iters", "1", "--check-batch", "0",
                   "--input", x_path, "--weights", w_path, flag, value)
    assert_not_crashed(proc)
    assert proc.returncode == 2, describe(proc)
    assert flag in proc.stderr, f"stderr does not name {flag}\n{describe(proc)}"
    names = [{"x": x_path, "w": w_path}[k].name for k in named]
    assert any(n in proc.stderr for n in names), f"stderr names none of {names}\n{describe(proc)}"


def test_files_disagreeing_with_each_other(tmp_path, good_files):
    """x with 4 channels against weights for 8: exit 2, naming a file."""
    _, w_path = good_files
    x_path = tmp_path / "x4.npy"
    np.save(x_path, np.random.default_rng(0).random((2, 4, 6, 12, 14), dtype=np.float32))
    proc = run_cli("--device", "cpu", "--iters", "1", "--input", x_path, "--weights", w_path)
    assert_not_crashed(proc)
    assert proc.returncode == 2, describe(proc)
    assert x_path.name in proc.stderr or w_path.name in proc.stderr, describe(proc)


# ------------------------------------------------------------------------------------------------
# 3. Corrupt files
# ------------------------------------------------------------------------------------------------

def npy_bytes(shape, descr="<f4", fortran=False, data=None, magic=b"\x93NUMPY",
              header_len=None, header=None):
    """A version-1.0 .npy file, built by hand so that every field can be broken."""
    if header is None:
        header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (
            descr, fortran, repr(tuple(shape)))
    header = header.encode("latin1")
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + b" " * (pad % 64) + b"\n"
    hl = len(header) if header_len is None else header_len
    if data is None:
        count = int(np.prod(shape)) if len(shape) else 1
        data = np.random.default_rng(0).random(count).astype(np.dtype(descr)).tobytes()
    return magic + b"\x01\x00" + struct.pack("<H", hl) + header + data


GOOD_X_SHAPE = (2, 8, 6, 12, 14)
GOOD_X_BYTES = 4 * int(np.prod(GOOD_X_SHAPE))


def _good_npy():
    return npy_bytes(GOOD_X_SHAPE)


NPY_CASES = {
    "nonexistent": None,
    "empty": b"",
    "only_magic": b"\x93NUMPY",
    "bad_magic": b"\x89PNG\r\n" + _good_npy()[6:],
    "bad_version": _good_npy()[:6] + b"\x07\x00" + _good_npy()[8:],
    "truncated_data": _good_npy()[:-GOOD_X_BYTES // 2],
    "truncated_in_header": _good_npy()[:40],
    "dtype_f8": npy_bytes(GOOD_X_SHAPE, descr="<f8"),
    "dtype_i4": npy_bytes(GOOD_X_SHAPE, descr="<i4"),
    "dtype_big_endian_f4": npy_bytes(GOOD_X_SHAPE, descr=">f4"),
    "fortran_order": npy_bytes(GOOD_X_SHAPE, fortran=True),
    "shape_3d": npy_bytes((8, 12, 14)),
    "shape_6d": npy_bytes((1, 2, 8, 6, 12, 14)),
    "shape_2pow40_tiny_file": npy_bytes((2 ** 11, 8, 2 ** 10, 2 ** 8, 2 ** 8), data=b"\0" * 64),
    "shape_product_overflows_64bit": npy_bytes((2 ** 32, 8, 2 ** 32, 2 ** 32, 1), data=b"\0" * 64),
    "shape_negative": npy_bytes((2, 8, 6, 12, 14), header=(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -8, 6, 12, 14), }")),
    "header_len_past_eof": npy_bytes((2, 8, 2, 2, 2), header_len=60000, data=b""),
    "header_garbage": npy_bytes((2,), header="this is not a python dict at all"),
}


@pytest.mark.parametrize("case", list(NPY_CASES))
def test_corrupt_input_npy(tmp_path, good_files, case):
    _, w_path = good_files
    bad = tmp_path / f"bad_{case}.npy"
    if NPY_CASES[case] is not None:
        bad.write_bytes(NPY_CASES[case])
    proc = run_cli("--device", "cpu", "--iters", "1", "--input", bad, "--weights", w_path,
                   "--output", tmp_path / "out.npy")
    assert_one_line_error(proc, bad)


ST_DTYPES = {np.dtype("float32"): "F32", np.dtype("float16"): "F16"}


def st_bytes(tensors, edit=None, header_len=None, raw_header=None, cut=None):
    """A safetensors file built by hand from {name: np.ndarray}; edit(header dict) may break
    the header, header_len overrides the 8-byte length, cut truncates the file to that size."""
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": ST_DTYPES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    header["__metadata__"] = {"format": "pt"}
    if edit is not None:
        edit(header)
    hb = raw_header if raw_header is not None else json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    hl = len(hb) if header_len is None else header_len
    out = struct.pack("<Q", hl) + hb + b"".join(blobs)
    return out if cut is None else out[:cut]


def _good_tensors():
    rng = np.random.default_rng(1)
    return {"conv.weight": rng.standard_normal((16, 8, 3, 3, 3)).astype(np.float32),
            "conv.bias": rng.standard_normal(16).astype(np.float32),
            "bias": rng.standard_normal((16, 1, 1, 1)).astype(np.float32)}


def _set(key, field, value):
    def edit(h):
        h[key][field] = value
    return edit


def _without(key):
    """A valid file whose only defect is that it lacks the tensor `key` (data removed too)."""
    t = _good_tensors()
    del t[key]
    return t


_W_END = sum(a.nbytes for a in _good_tensors().values())
_cw = _good_tensors()["conv.weight"]

ST_CASES = {
    "nonexistent": None,
    "empty": b"",
    "shorter_than_length_field": b"\x10\x00\x00\x00",
    "header_len_beyond_file": st_bytes(_good_tensors(), header_len=10 ** 6),
    "header_len_2pow63": st_bytes(_good_tensors(), header_len=2 ** 63),
    "header_not_json": st_bytes(_good_tensors(), raw_header=b"this is {not json"),
    "header_json_not_object": st_bytes(_good_tensors(), raw_header=b"[1, 2, 3]"),
    "missing_conv_weight": st_bytes(_without("conv.weight")),
    "missing_conv_bias": st_bytes(_without("conv.bias")),
    "missing_bias": st_bytes(_without("bias")),
    "data_offsets_past_end": st_bytes(_good_tensors(), edit=_set(
        "bias", "data_offsets", [_W_END - 64, _W_END + 4096])),
    "data_offsets_huge": st_bytes(_good_tensors(), edit=_set(
        "bias", "data_offsets", [2 ** 63, 2 ** 63 + 64])),
    "data_offsets_reversed": st_bytes(_good_tensors(), edit=_set(
        "conv.bias", "data_offsets", [_cw.nbytes + 64, _cw.nbytes])),
    "data_offsets_size_mismatch": st_bytes(_good_tensors(), edit=_set(
        "conv.weight", "data_offsets", [0, _cw.nbytes - 4])),
    "data_truncated": st_bytes(_good_tensors(), cut=-100),
    "dtype_I32": st_bytes(_good_tensors(), edit=_set("conv.weight", "dtype", "I32")),
    "dtype_F64": st_bytes(_good_tensors(), edit=_set("conv.bias", "dtype", "F64")),
    "dtype_unknown": st_bytes(_good_tensors(), edit=_set("bias", "dtype", "Q7")),
    "huge_shape_2pow40": st_bytes(_good_tensors(), edit=_set(
        "conv.weight", "shape", [2 ** 20, 8, 2 ** 10, 2 ** 7, 1])),
    "shape_product_overflows_64bit": st_bytes(_good_tensors(), edit=_set(
        "conv.weight", "shape", [2 ** 32, 8, 2 ** 32, 2 ** 32, 1])),
    "conv_weight_4d": st_bytes(_good_tensors(), edit=_set("conv.weight", "shape", [16, 8, 9, 3])),
    "conv_bias_wrong_count": st_bytes({**_good_tensors(), "conv.bias": np.zeros(15, np.float32)}),
    "bias_wrong_count": st_bytes({**_good_tensors(), "bias": np.zeros((17, 1, 1, 1), np.float32)}),
}


@pytest.mark.parametrize("case", list(ST_CASES))
def test_corrupt_weights_safetensors(tmp_path, good_files, case):
    x_path, _ = good_files
    bad = tmp_path / f"bad_{case}.safetensors"
    if ST_CASES[case] is not None:
        bad.write_bytes(ST_CASES[case])
    proc = run_cli("--device", "cpu", "--iters", "1", "--input", x_path, "--weights", bad,
                   "--output", tmp_path / "out.npy")
    assert_one_line_error(proc, bad)


def test_hand_built_files_are_valid(tmp_path, good_files):
    """The builders above write files that numpy/safetensors accept and the CLI runs: so each
    corrupt case differs from a good file only by its defect."""
    x_path, w_path = good_files
    gx, gw = tmp_path / "hand_x.npy", tmp_path / "hand_w.safetensors"
    gx.write_bytes(_good_npy())
    gw.write_bytes(st_bytes(_good_tensors()))
    assert np.load(gx).shape == GOOD_X_SHAPE
    gx2 = tmp_path / "hand_x_v2.npy"  # .npy version 2.0 (4-byte header length) is valid too
    with open(gx2, "wb") as f:
        np.lib.format.write_array(f, np.load(gx), version=(2, 0))
    assert set(safetensors_torch.load_file(str(gw))) == {"conv.weight", "conv.bias", "bias"}
    for xp, wp in [(gx, w_path), (gx2, w_path), (x_path, gw)]:
        proc = run_cli("--device", "cpu", "--iters", "1", "--check-batch", "1",
                       "--input", xp, "--weights", wp)
        assert_not_crashed(proc)
        assert proc.returncode == 0, describe(proc)


def assert_one_line_error(proc, bad):
    assert_not_crashed(proc)
    assert proc.returncode == 2, describe(proc)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), \
        f"expected exactly one non-empty line on stderr\n{describe(proc)}"
    assert str(bad) in lines[0] or bad.name in lines[0], \
        f"stderr does not name the file {bad.name}\n{describe(proc)}"
