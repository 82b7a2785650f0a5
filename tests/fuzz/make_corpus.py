#!/usr/bin/env python3
"""Writes the committed seed corpora of the fuzz targets:
    tests/fuzz/corpus/validate/   seeds for fuzz_validate.c
    tests/fuzz/corpus/forward/    seeds for fuzz_forward.c
    tests/fuzz/corpus/readers/    seeds for fuzz_readers.c (a format byte, then a .npy or
                                  safetensors file)
Each seed is a small binary file in the input format documented at the top of its target. Run
it again after changing a format (it rewrites both folders); scripts/fuzz.sh fuzzes a copy,
so fuzzing never changes the committed files."""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

# ---- fuzz_validate: one flags byte, then fields as selector + payload (see pick()) ----


def small(v):  # 1..16
    assert 1 <= v <= 16
    return bytes([0, v - 1])


def tiny(v):  # -2..2
    assert -2 <= v <= 2
    return bytes([5, v + 2])


def neg(v):  # any negative value: -(u64 >> 1) - 1
    assert v < 0
    return bytes([6]) + struct.pack("<Q", (-(v + 1)) << 1)


def near31(k, d=0):  # 2^k + d, k in 28..34, d in -2..2
    return bytes([7, k - 28, d + 2])


def near62(k, d=0):  # 2^k + d, k in 58..62
    return bytes([8, k - 58, d + 2])


def imax(minus=0):  # INT64_MAX - minus, minus in 0..3
    return bytes([9, minus])


def raw(v):  # any int64
    return bytes([10]) + struct.pack("<q", v)


def pow2(k, d=0):  # 2^k + d, k in 0..62, d in -1..1
    return bytes([11, k, d + 1])


ROOTS = [128, 129, 6208, 6209, 55108, 55109, 2097151, 2097152, 2097153, 3037000499, 3037000500,
         2147483647, 2147483648, 4294967295, 4294967296, 4398046511104]


def root(v, d=0):  # a value of the roots table, +- 1
    return bytes([12 + (128 if d else 0), ROOTS.index(v)] + ([d + 1] if d else []))


def any_value(v):
    if 1 <= v <= 16:
        return small(v)
    if -2 <= v <= 2:
        return tiny(v)
    if v > 0 and (v & (v - 1)) == 0 and v < 2**63:
        return pow2(v.bit_length() - 1)
    return raw(v)


DIVISORS = {2.0: 0, 0.0: 1, -1.5: 2, "inf": 3, "nan": 4, 1e-39: 5, "-0": 6}


def flags(structured=False, divisor=2.0):
    if isinstance(divisor, bytes):
        return bytes([(1 if structured else 0) | 7 << 1]), divisor
    return bytes([(1 if structured else 0) | DIVISORS[divisor] << 1]), b""


def plain(fields, divisor=2.0):
    """The 12 fields in struct order: batch, cin, cout, in d h w, kernel d h w, pool d h w."""
    assert len(fields) == 12
    head, tail = flags(False, divisor)
    return head + b"".join(f if isinstance(f, bytes) else any_value(f) for f in fields) + tail


def structured(batch, cin, cout, axes, divisor=2.0):
    """axes: three (kernel, pool, extra); in = kernel + pool - 1 + extra."""
    head, tail = flags(True, divisor)
    body = b"".join(f if isinstance(f, bytes) else any_value(f) for f in (batch, cin, cout))
    for k, p, e in axes:
        body += b"".join(f if isinstance(f, bytes) else any_value(f) for f in (k, p, e))
    return head + body + tail


def validate_seeds():
    seeds = {}
    seeds["ok_headline"] = plain([128, 8, 16, 16, 64, 64, 3, 3, 3, 2, 2, 2])
    seeds["ok_ones"] = plain([1] * 12)
    seeds["ok_divisor_nan_bits"] = plain([2, 3, 4, 5, 6, 7, 2, 2, 2, 2, 2, 2],
                                         divisor=struct.pack("<Q", 0x7FF8DEADBEEF0001))
    seeds["ok_divisor_zero"] = plain([1, 1, 1, 4, 4, 4, 3, 3, 3, 2, 2, 2], divisor=0.0)
    seeds["size_batch_zero"] = plain([0, 1, 1, 4, 4, 4, 1, 1, 1, 1, 1, 1])
    seeds["size_pool_w_negative"] = plain([1, 1, 1, 4, 4, 4, 1, 1, 1, 1, 1, -2], divisor="inf")
    seeds["size_in_h_int64_min"] = plain([1, 1, 1, 4, neg(-2**63), 4, 1, 1, 1, 1, 1, 1])
    seeds["too_small_in_w"] = plain([1, 1, 1, 4, 4, 2, 3, 3, 3, 1, 1, 1])
    seeds["empty_output_pool_d"] = plain([1, 1, 1, 4, 4, 4, 3, 3, 3, 3, 1, 1], divisor=-1.5)
    # x element count exactly 2^62 (fits), multiply-add count 2^62 too.
    seeds["ok_x_count_2p62"] = plain([pow2(21), pow2(21), 1, 128, 128, 64, 1, 1, 1, 1, 1, 1])
    # x element count 2^63: the first overflow.
    seeds["overflow_x_2p63"] = plain([pow2(21), pow2(21), 1, 128, 128, 128, 1, 1, 1, 1, 1, 1])
    # One extent INT64_MAX, the rest 1: every count is exactly INT64_MAX.
    seeds["ok_in_d_int64_max"] = plain([1, 1, 1, imax(), 1, 1, 1, 1, 1, 1, 1, 1], divisor="-0")
    seeds["overflow_in_d_int64_max_batch2"] = plain([2, 1, 1, imax(), 1, 1, 1, 1, 1, 1, 1, 1])
    # Only the weight count overflows.
    seeds["overflow_weight"] = plain([1, root(3037000500), root(3037000500), 1, 1, 1, 1, 1, 1, 1, 1, 1])
    # Only the conv output count overflows (x and weight fit).
    seeds["overflow_conv_output"] = plain([1, 1, near62(62), 2, 2, 2, 1, 1, 1, 1, 1, 1])
    # Only the multiply-add count overflows: x 2^30, weight 2^47, conv output ~2^47, MACs ~2^74.
    seeds["overflow_macs"] = plain([1, 1, pow2(20), 1024, 1024, 1024, 512, 512, 512, 1, 1, 1])
    # Structured: kernel + pool - 1 + extra, so the sizes line up and the products decide.
    seeds["structured_near_2p31"] = structured(near31(31), 1, 1, [(1, 1, near31(30)), (2, 2, 0), (3, 1, 5)])
    seeds["structured_roots"] = structured(root(2097152), root(2097151, -1), 1,
                                           [(1, 1, root(2097152, -1)), (1, 1, 0), (1, 1, 0)])
    seeds["structured_extra_negative"] = structured(1, 2, 3, [(3, 2, -1), (3, 2, 0), (3, 2, 0)], divisor=0.0)
    seeds["structured_near_2p62"] = structured(1, 1, 1, [(near62(61), 1, near62(61)), (1, 1, 0), (1, 1, 1)],
                                               divisor=1e-39)
    return seeds


# ---- fuzz_forward: a 15-byte header, then value bytes (the rest comes from a generator) ----

FWD_DIVISORS = [2.0, -1.5, 0.5, 0.0, "inf", "nan", 1e-39, 3.0]


def forward(batch=1, cin=1, cout=1, kernel=(1, 1, 1), pool=(1, 1, 1), extra=(0, 0, 0), divisor=2.0,
            no_conv_bias=False, no_out=False, no_bias=False, bias_alias=False, xmode=0, wmode=0,
            scale_log2=0, values=b""):
    head = [batch - 1, cin - 1, cout - 1]
    for k, p, e in zip(kernel, pool, extra):
        base = k + p - 1
        assert base + e <= 12
        # e < 3: the small branch (e % 3); else the wide branch (e % (13 - base)) with bit 7.
        head += [k - 1, p - 1, e if e < 3 else 0x80 + (e - (0x80 % (13 - base))) % (13 - base)]
    head.append(FWD_DIVISORS.index(divisor))
    head.append((1 if no_conv_bias else 0) | (2 if no_out else 0) | (4 if no_bias else 0) |
                (8 if bias_alias else 0) | xmode << 4 | wmode << 6)
    head.append(scale_log2 + 20)
    return bytes(head) + values


def forward_seeds():
    seeds = {}
    seeds["winograd_k3_p2"] = forward(2, 3, 4, (3, 3, 3), (2, 2, 2), (1, 2, 3))
    seeds["direct_k1_p1_negdiv"] = forward(1, 2, 5, (1, 1, 1), (1, 1, 1), (2, 4, 7), divisor=-1.5)
    seeds["k3_odd_pool"] = forward(3, 6, 6, (3, 3, 3), (3, 3, 1), (0, 1, 2), divisor=3.0, wmode=1)
    seeds["k4_p4_max_extent"] = forward(1, 2, 2, (4, 4, 4), (4, 4, 4), (5, 5, 5), divisor=0.5, xmode=1, wmode=1)
    seeds["aniso"] = forward(2, 1, 3, (1, 2, 4), (4, 1, 2), (0, 3, 1), divisor=2.0, xmode=1)
    seeds["div_zero_grid"] = forward(1, 2, 2, (2, 2, 2), (2, 2, 2), (1, 1, 1), divisor=0.0)
    seeds["div_inf"] = forward(1, 1, 2, (3, 3, 3), (2, 2, 2), (0, 0, 0), divisor="inf", xmode=1)
    seeds["div_nan"] = forward(2, 2, 1, (2, 1, 3), (1, 2, 2), (0, 0, 0), divisor="nan")
    seeds["div_subnormal"] = forward(1, 3, 3, (3, 3, 3), (2, 2, 2), (0, 1, 0), divisor=1e-39, xmode=1, wmode=1)
    seeds["div_subnormal_tiny_values"] = forward(1, 1, 2, (1, 1, 1), (2, 2, 2), (1, 1, 1), divisor=1e-39,
                                                 scale_log2=-20)
    seeds["wide_values"] = forward(1, 2, 3, (3, 3, 3), (2, 2, 2), (2, 2, 2), xmode=2, wmode=2)
    seeds["big_scale"] = forward(1, 4, 4, (2, 3, 3), (1, 2, 2), (1, 1, 1), divisor=-1.5, scale_log2=20,
                                 xmode=1, wmode=1)
    # x holds NaN, +inf, -inf, 3e38, a subnormal, -0 at the front (specials mode).
    special_x = bytes([0xF0, 0xF2, 0xF3, 0xF4, 0xF8, 0xFB, 0x10, 8, 0x20, 16])
    seeds["specials_in_x_winograd"] = forward(1, 2, 2, (3, 3, 3), (2, 2, 2), (1, 1, 1), xmode=3,
                                              values=special_x)
    seeds["specials_in_x_direct"] = forward(2, 1, 2, (2, 2, 2), (1, 1, 1), (0, 0, 0), divisor=-1.5, xmode=3,
                                            values=special_x)
    seeds["specials_in_weights"] = forward(1, 1, 3, (1, 3, 3), (1, 2, 2), (0, 0, 0), wmode=3)
    seeds["no_conv_bias"] = forward(2, 2, 2, (3, 3, 3), (2, 2, 2), (0, 0, 0), no_conv_bias=True, xmode=1)
    seeds["no_out_no_bias"] = forward(1, 2, 2, (2, 2, 2), (2, 2, 2), (0, 0, 0), no_out=True, no_bias=True)
    seeds["bias_aliases_conv_bias"] = forward(3, 1, 6, (1, 1, 1), (3, 3, 3), (0, 0, 0), bias_alias=True,
                                              divisor=0.5)
    return seeds


# ---- fuzz_readers: byte 0 even = .npy, odd = safetensors; the file follows ----


def npy(descr, shape, payload, version=1):
    """A .npy file as numpy.lib.format writes it: preamble, dict padded to 64 bytes, data."""
    dims = "".join(f"{d}, " for d in shape) if len(shape) != 1 else f"{shape[0]},"
    text = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, dims.rstrip(", ") if len(shape) > 1 else dims)
    pre = 10 if version == 1 else 12
    hlen = -(-(pre + len(text) + 1) // 64) * 64 - pre
    head = text.ljust(hlen - 1) + "\n"
    size = struct.pack("<H", hlen) if version == 1 else struct.pack("<I", hlen)
    return b"\x93NUMPY" + bytes([version, 0]) + size + head.encode() + payload


def safetensors(tensors):
    """tensors: name -> (dtype, shape, raw bytes); offsets follow the insertion order."""
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def readers_seeds():
    f32 = lambda n: struct.pack(f"<{n}f", *[0.25 * (i % 7) - 0.5 for i in range(n)])  # noqa: E731
    f16 = lambda n: struct.pack(f"<{n}e", *[0.5 * (i % 5) for i in range(n)])  # noqa: E731
    model = {"conv.weight": ("F32", (2, 1, 1, 1, 2), f32(4)), "conv.bias": ("F32", (2,), f32(2)),
             "bias": ("F32", (2, 1, 1, 1), f32(2))}
    return {
        "npy_f32_4d": b"\x00" + npy("<f4", (2, 3, 4, 5), f32(120)),
        "npy_f16_2d": b"\x00" + npy("<f2", (3, 4), f16(12)),
        "npy_v2_1d": b"\x00" + npy("<f4", (5,), f32(5), version=2),
        "st_f32": b"\x01" + safetensors(model),
        "st_f16_bf16": b"\x01" + safetensors({"conv.weight": ("F16", (1, 1, 2, 1, 1), f16(2)),
                                              "conv.bias": ("BF16", (1,), b"\x80\x3f"),
                                              "bias": ("F32", (1,), f32(1))}),
    }


def write(folder, seeds):
    path = os.path.join(HERE, "corpus", folder)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    for name, data in sorted(seeds.items()):
        with open(os.path.join(path, name), "wb") as f:
            f.write(data)
    print(f"{path}: {len(seeds)} seeds")


if __name__ == "__main__":
    write("validate", validate_seeds())
    write("forward", forward_seeds())
    write("readers", readers_seeds())
