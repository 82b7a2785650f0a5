"""Probe: the host time of each convpool call a training step makes, op by op and under the ops
(the C library's entry points called through ctypes on the same device pointers), so the
binding's share and the library's share of a call show apart. Headline problem at a small
batch (the device idles, so no call waits on the launch queue); a sync before each timed call;
median of --reps, microseconds. Follows host_step_profile.py, which found ~120 us of self CPU
time in <ns>::forward_train a step.

  PYTHONPATH=python python docs/experiments/host_call_costs.py [--batch 2] [--reps 300]
"""
import argparse
import ctypes
import statistics
import time

import torch

import convpool
from convpool._ops import OP_NAMESPACE


class Problem(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("batch", "in_channels", "out_channels", "in_d", "in_h", "in_w",
                                               "kernel_d", "kernel_h", "kernel_w", "pool_d", "pool_h", "pool_w")] + \
               [("divisor", ctypes.c_double)] + \
               [(n, ctypes.c_int64) for n in ("conv_d", "conv_h", "conv_w", "pooled_d", "pooled_h", "pooled_w")]


def timed(fn, reps):
    out = []
    for _ in range(reps + 20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(out[20:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--reps", type=int, default=300)
    args = ap.parse_args()
    convpool.load()
    # The loaded extension's shared object, as the process mapped it.
    with open("/proc/self/maps") as f:
        so = next(line.split()[-1] for line in f if "convpool_cuda" in line and line.rstrip().endswith(".so"))
    lib = ctypes.CDLL(so)
    ops = getattr(torch.ops, OP_NAMESPACE)
    B = args.batch
    dev = "cuda"
    x = torch.rand(B, 8, 16, 64, 64, device=dev)
    w = torch.randn(16, 8, 3, 3, 3, device=dev) * 0.1
    cb = torch.randn(16, device=dev)
    b = torch.randn(16, 1, 1, 1, device=dev)
    pool = [2, 2, 2]
    lib.convpool_problem_make.restype = Problem
    lib.convpool_problem_make.argtypes = [ctypes.c_int64] * 12 + [ctypes.c_double]
    p = lib.convpool_problem_make(B, 8, 16, 16, 64, 64, 3, 3, 3, 2, 2, 2, 2.0)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    ws_bytes = ctypes.c_size_t(0)
    assert lib.convpool_cuda_workspace_size(ctypes.byref(p), 0, 0, ctypes.byref(ws_bytes)) == 0
    ws = torch.empty(max(ws_bytes.value, 1), dtype=torch.uint8, device=dev)
    pooled = torch.empty(B, 16, device=dev)
    out = torch.empty(B, device=dev)
    codes = torch.empty(B, 16, 7, 31, 31, dtype=torch.uint8, device=dev)
    bw_bytes = ctypes.c_size_t(0)
    assert lib.convpool_backward_cuda_workspace_size(ctypes.byref(p), 0, ctypes.byref(bw_bytes)) == 0
    bws = torch.empty(max(bw_bytes.value, 1), dtype=torch.uint8, device=dev)
    gw = torch.empty_like(w)
    gcb = torch.empty_like(cb)
    go = torch.ones(B, device=dev)
    null = ctypes.c_void_p(0)

    def c_train():
        s = ctypes.c_size_t(0)
        lib.convpool_cuda_workspace_size(ctypes.byref(p), 0, 0, ctypes.byref(s))
        r = lib.convpool_forward_train_cuda_deferred(ctypes.byref(p), 0, ptr(x), ptr(w), ptr(cb), ptr(b), ptr(pooled),
                                                     ptr(out), ptr(codes), ptr(ws), ctypes.c_size_t(ws.numel()), stream)
        assert r == 0, r

    def c_infer():
        r = lib.convpool_forward_cuda(ctypes.byref(p), 0, 0, ptr(x), ptr(w), ptr(cb), ptr(b), ptr(pooled), ptr(out),
                                      ptr(ws), ctypes.c_size_t(ws.numel()), stream)
        assert r == 0, r

    def c_backward_w():
        s = ctypes.c_size_t(0)
        lib.convpool_backward_cuda_workspace_size(ctypes.byref(p), 0, ctypes.byref(s))
        r = lib.convpool_backward_cuda(ctypes.byref(p), 0, ptr(x), ptr(w), ptr(codes), null, ptr(go), null, ptr(gw),
                                       ptr(gcb), ptr(bws), ctypes.c_size_t(bws.numel()), stream)
        assert r == 0, r

    tf32 = torch.backends.cudnn.allow_tf32
    c_train()
    go_exp = torch.ones((), device=dev).expand(B)
    rows = [
        ("ctypes call of nothing (convpool_code_bytes)", lambda: lib.convpool_code_bytes(ctypes.byref(p))),
        ("torch.empty x 3 (B x 16 floats, codes, workspace)",
         lambda: (torch.empty(B, 16, device=dev), torch.empty(B, 16, 7, 31, 31, dtype=torch.uint8, device=dev),
                  torch.empty(ws.numel(), dtype=torch.uint8, device=dev))),
        ("C: convpool_forward_cuda (inference)", c_infer),
        ("C: workspace query + convpool_forward_train_cuda_deferred", c_train),
        ("C: backward workspace query + convpool_backward_cuda (grad_w, grad_cb)", c_backward_w),
        ("op block_inference", lambda: ops.block_inference(x, w, cb, b, 2.0, pool, tf32)),
        ("op forward_train", lambda: ops.forward_train(x, w, cb, b, 2.0, pool, tf32)),
        ("op backward_codes (grad_w, grad_cb; grad_out an expand)",
         lambda: ops.backward_codes(x, w, cb, codes, None, go_exp, 2.0, pool, False, True, True, tf32)),
        ("op backward_codes (grad_w, grad_cb; grad_out dense)",
         lambda: ops.backward_codes(x, w, cb, codes, None, go, 2.0, pool, False, True, True, tf32)),
        ("grad_out.contiguous() of an expand", lambda: go_exp.contiguous()),
        ("cb.clone()", lambda: cb.clone()),
    ]
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}: host us a call (median of {args.reps}, "
          f"synced before each), headline x at batch {B}, TF32\n")
    print("| call | host us |\n|---|---|")
    for name, fn in rows:
        print(f"| {name} | {timed(fn, args.reps):.1f} |")


if __name__ == "__main__":
    main()
