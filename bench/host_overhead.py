"""Host time of one convpool call, layer by layer (GPU needed).

A forward that launches in less time than the GPU spends on it is free; one whose host work
outlasts the kernel makes every small-batch call host-bound. This prints, per shape, the host
microseconds of each layer, calls enqueued back to back (no sync between; the best of 5 rounds
of 100 calls, since other work on the host only adds time):

  model      ModelNew(x) under no_grad: its Python fast path + the direct entry
             (block_inference_direct, no op dispatcher) + C++ + launches
  via op     the same with the direct entry switched off: the op (block_inference) instead
  direct     block_inference_direct called alone (what model costs less its Python)
  op         the registered op (its autograd formula is Python's) called with detached tensors
  infer      forward_inference, the same kernels without an autograd kernel (ModelNew's path)
  explain    a C++ op that only validates and plans (no allocation, no launch)
  empty      torch.empty on the GPU: the floor of any op call
  eager      Model(x): PyTorch's own block, for scale
  raw C      (with --raw-c BENCH_GPU) convpool_forward_cuda from C, bench_gpu's host time a
             call at the same shape; "over C" is model minus it, which issue "hardware limit"
             wants at or below 10 us

  python bench/host_overhead.py [--rows headline,pool3] [--raw-c build/bench/bench_gpu] [--train]
                               [--trace ROW]

--train adds the training step (zero_grad, ModelNew(x), out.sum(), backward; x needs grad)
at --train-batches: wall microseconds per step with steps back to back, by the default route,
forced fused (CONVPOOL_TORCH_BACKWARD=fused), forced dense (PyTorch's ops) and eager Model;
then the fused route's host time alone for the forward (block_train, graph recorded) and for
loss.backward() of a fresh graph (the C++ autograd kernel).

--trace ROW prints torch.profiler's host self-time table of ROW's fused training step
(every aten op and CUDA runtime call) and a cProfile of its Python side, to see where the
step's host time goes.

--train-parts (at --batch; --no-infer skips the table above) splits the fused training step's
host time: zero_grad, the module's forward, the block_train and forward_train ops, out.sum(),
backward() and the backward_codes op alone, the raw C calls (bench_gpu --train / --backward
xw, with --raw-c), eager Model's halves, the whole step captured in a CUDA graph and replayed
(ModelNew and Model), and backward() of a trivial graph (the autograd engine's floor).
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import convpool  # noqa: E402
from convpool import _ops  # noqa: E402
from convpool.model import Model  # noqa: E402

ROWS = {
    "headline": dict(kernel=3, pool=2),
    "k1": dict(kernel=1, pool=2),
    "pool3": dict(kernel=3, pool=3),
    "k5": dict(kernel=5, pool=2),
    "k2": dict(kernel=2, pool=2),
    "pool1": dict(kernel=3, pool=1),
    "k1x7x7": dict(kernel=(1, 7, 7), pool=2),
    "odd": dict(kernel=3, pool=2, dhw=(15, 61, 61)),  # profile_train.py's odd_15x61x61
}
DHW = (16, 64, 64)  # x's extents where a row names none: the headline's


def host_us(fn, calls=100, rounds=5, warmup=20):
    """Host microseconds a call, enqueued back to back: the best of `rounds` rounds. This host's
    other work only adds time (one device call measured the same code 1.7x slower in its second
    pass), so the minimum is the call's own cost; each round syncs first, so the launch queue
    never fills and blocks the host."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - t0)
    torch.cuda.synchronize()
    return best / calls * 1e6


def backward_us(make_loss, calls=100, rounds=3, warmup=20):
    """host_us of loss.backward(), each call on a fresh graph: every loss host_us will use
    (warm-up plus every round's calls) is built first, then the device is synced."""
    losses = [make_loss() for _ in range(warmup + rounds * calls)]
    torch.cuda.synchronize()
    return host_us(lambda: losses.pop().backward(), calls, rounds=rounds, warmup=warmup)


def wall_us(fn, calls=200):
    """Wall microseconds per call in steady state: calls back to back, the sync counted (a
    host-bound step shows its host time, a device-bound one its device time)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def train_step(model, x, force=""):
    """One training step of model on x (x needs grad), the backward route forced by
    CONVPOOL_TORCH_BACKWARD=force ("" for the default) while it runs."""
    def run():
        if force:
            os.environ["CONVPOOL_TORCH_BACKWARD"] = force
        else:
            os.environ.pop("CONVPOOL_TORCH_BACKWARD", None)
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()
        x.grad = None
    return run


def train_rows(args):
    """The training step's wall time per route, and the fused route's halves (module doc)."""
    print("\n# training step, us per step (wall, steps back to back; best of 3 rounds, routes alternating)")
    print("| row | batch | windows | default route | fused | dense (PyTorch ops) | eager | "
          "fused fwd host | fused bwd host |\n|---|---|---|---|---|---|---|---|---|")
    for batch in (int(b) for b in args.train_batches.split(",")):
        for name in args.rows.split(","):
            mn, m, x = make(name, batch)
            x.requires_grad_(True)
            routes = dict(default=train_step(mn, x), fused=train_step(mn, x, "fused"),
                          dense=train_step(mn, x, "dense"), eager=train_step(m, x))
            best = {k: float("inf") for k in routes}
            for _ in range(3):
                for k, fn in routes.items():
                    best[k] = min(best[k], wall_us(fn))
            os.environ["CONVPOOL_TORCH_BACKWARD"] = "fused"
            losses = []
            t_fwd = host_us(lambda: losses.append(mn(x).sum()), 200)
            losses.clear()
            torch.cuda.synchronize()
            t_bwd = backward_us(lambda: mn(x).sum())
            os.environ.pop("CONVPOOL_TORCH_BACKWARD", None)
            pooled = [(n - k + 1) // p for n, k, p in zip(x.shape[2:], mn.conv.weight.shape[2:],
                                                           _ops._triple(ROWS[name]["pool"], "pool"))]
            windows = batch * 16 * pooled[0] * pooled[1] * pooled[2]
            print(f"| {name} | {batch} | {windows} | " + " | ".join(f"{best[k]:.1f}" for k in routes)
                  + f" | {t_fwd:.1f} | {t_bwd:.1f} |", flush=True)


def graphed_step(model, x):
    """A replay function of model's whole training step (zero grads, forward, out.sum(),
    backward) captured in one CUDA graph after a warm-up on a side stream, as PyTorch's
    CUDA-graphs guide does it; x's storage is the graph's static input."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            x.grad = None
            model(x).sum().backward()
    torch.cuda.current_stream().wait_stream(side)
    model.zero_grad(set_to_none=True)
    x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model(x).sum().backward()
    return graph.replay


def train_parts(args):
    """The fused training step's host time, piece by piece (--train-parts): each piece called
    back to back (host_us), at --batch."""
    ops = getattr(torch.ops, _ops.OP_NAMESPACE)
    print(f"\n# training step host pieces, us per call, batch {args.batch} (best of 3 rounds of 100)")
    print("| row | step (wall) | zero_grad | model fwd | block_train op | forward_train op | out.sum | "
          "backward() | backward_codes op | raw C train fwd | raw C backward | eager fwd | eager backward() | "
          "graphed step | eager graphed step | trivial backward() |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    os.environ.pop("CONVPOOL_TORCH_BACKWARD", None)
    for name in args.rows.split(","):
        mn, m, x = make(name, args.batch)
        x.requires_grad_(True)
        r = ROWS[name]
        pool = list(_ops._triple(r["pool"], "pool"))
        w, cb, b = mn.conv.weight, mn.conv.bias, mn.bias
        tf32 = _ops._tf32_now()
        xd, wd, cbd, bd = x.detach(), w.detach(), cb.detach(), b.detach()
        _, out, codes = ops.forward_train(xd, wd, cbd, bd.reshape(-1), 2.0, pool, tf32)
        go = torch.ones(args.batch, device="cuda")
        t = {"step (wall)": wall_us(train_step(mn, x))}
        t["zero_grad"] = host_us(lambda: mn.zero_grad(set_to_none=True), rounds=3)
        keep = []
        t["model fwd"] = host_us(lambda: keep.append(mn(x)), rounds=3)
        keep.clear()
        bt = _ops._STATE["block_train_op"]
        t["block_train op"] = host_us(lambda: keep.append(bt(x, w, cb, b, 2.0, pool, tf32)), rounds=3)
        keep.clear()
        t["forward_train op"] = host_us(lambda: ops.forward_train(xd, wd, cbd, bd.reshape(-1), 2.0, pool, tf32),
                                        rounds=3)
        t["out.sum"] = host_us(lambda: out.sum(), rounds=3)
        t["backward()"] = backward_us(lambda: mn(x).sum())
        t["backward_codes op"] = host_us(lambda: ops.backward_codes(xd, wd, cbd, codes, None, go, 2.0, pool, True,
                                                                    True, True, tf32), rounds=3)
        if args.raw_c:
            t["raw C train fwd"] = raw_c_us(args.raw_c, name, args.batch, ["--train"])
            t["raw C backward"] = raw_c_us(args.raw_c, name, args.batch, ["--backward", "xw"])
        else:
            t["raw C train fwd"] = t["raw C backward"] = float("nan")
        t["eager fwd"] = host_us(lambda: keep.append(m(x)), rounds=3)
        keep.clear()
        t["eager backward()"] = backward_us(lambda: m(x).sum())
        mn.zero_grad(set_to_none=True)
        m.zero_grad(set_to_none=True)
        x.grad = None
        # The whole step as one CUDA graph replay (wall, replays back to back): what a small
        # batch costs once the host's per-op work is gone.
        t["graphed step"] = wall_us(graphed_step(mn, x))
        t["eager graphed step"] = wall_us(graphed_step(m, x))
        # The autograd engine's own floor on this host: backward() of (x * 2).sum().
        t["trivial backward()"] = backward_us(lambda: (x * 2.0).sum())
        mn.zero_grad(set_to_none=True)
        m.zero_grad(set_to_none=True)
        x.grad = None
        print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in t.values()) + " |", flush=True)


def trace(args):
    from torch.profiler import ProfilerActivity, profile
    mn, _, x = make(args.trace, args.batch)
    x.requires_grad_(True)
    run = train_step(mn, x, "fused")  # the route whose host path is convpool's
    for _ in range(20):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(50):
            run()
        torch.cuda.synchronize()
    print(f"\n# host self time of {args.trace}'s training step, batch {args.batch}, 50 steps")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=70))
    # The Python side of the same steps (torch.profiler lists ops, not Python functions).
    import cProfile
    import io
    import pstats
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(50):
        run()
    torch.cuda.synchronize()
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(20)
    print(f"\n# Python functions of the same step, 50 steps (cProfile, tottime)\n```\n{buf.getvalue()}```")


def make(name, batch):
    r = ROWS[name]
    init = (8, 16, r["kernel"], 2.0, r["pool"], (16, 1, 1, 1), 1)
    torch.manual_seed(0)
    mn = convpool.ModelNew(*init).cuda()
    m = Model(*init).cuda()
    m.load_state_dict(mn.state_dict())
    return mn, m, torch.rand(batch, 8, *r.get("dhw", DHW), device="cuda")


def raw_c_us(bench_gpu, row, batch, extra=()):
    """bench_gpu's host microseconds a convpool_forward_cuda call at the row's shape (TF32), best of
    3 runs."""
    import json
    import subprocess
    r = ROWS[row]
    k, p = _ops._triple(r["kernel"], "kernel"), _ops._triple(r["pool"], "pool")
    d, h, w = r.get("dhw", DHW)
    args = [bench_gpu, "--batch", str(batch), "--d", str(d), "--h", str(h), "--w", str(w),
            "--kd", str(k[0]), "--kh", str(k[1]), "--kw", str(k[2]),
            "--pd", str(p[0]), "--ph", str(p[1]), "--pw", str(p[2]), "--iters", "3", "--warmup", "1", "--json",
            *extra]
    best = float("inf")
    for _ in range(3):  # best of 3, as host_us takes its best round
        out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
        best = min(best, json.loads(out.strip().splitlines()[-1])["host_us"])
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--raw-c", metavar="BENCH_GPU", help="bench_gpu, for the raw C call's host time")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--train-batches", default="1,2,4")
    ap.add_argument("--trace", choices=list(ROWS))
    ap.add_argument("--train-parts", action="store_true",
                    help="the fused training step's host time piece by piece, at --batch")
    ap.add_argument("--no-infer", action="store_true", help="skip the inference table")
    args = ap.parse_args()
    convpool.load()
    print(f"# {torch.cuda.get_device_name(0)}, batch {args.batch}, host us per call")
    raw = " raw C | over C |" if args.raw_c else ""
    if not args.no_infer:
        print("| row | model | via op | direct | op | infer | explain | empty | eager |" + raw +
              "\n|---|---|---|---|---|---|---|---|---|" + ("---|---|" if args.raw_c else ""))
    for name in [] if args.no_infer else args.rows.split(","):
        r = ROWS[name]
        mn, m, x = make(name, args.batch)
        w, cb, b = mn.conv.weight.detach(), mn.conv.bias.detach(), mn.bias.detach().reshape(16)
        op, infer = _ops._STATE["op"], _ops._STATE["infer_op"]
        pool = list(_ops._triple(r["pool"], "pool"))
        ex = getattr(torch.ops, _ops.OP_NAMESPACE).explain
        direct = _ops._STATE["direct"]
        tf32 = _ops._tf32_now()
        with torch.no_grad():
            _ops._STATE["direct"] = None
            via_op = host_us(lambda: mn(x))
            _ops._STATE["direct"] = direct
            t = dict(model=host_us(lambda: mn(x)), via_op=via_op,
                     direct=host_us(lambda: direct(x, w, cb, mn.bias, 2.0, pool, tf32)),
                     op=host_us(lambda: op(x, w, cb, b, 2.0, pool, True)),
                     infer=host_us(lambda: infer(x, w, cb, b, 2.0, pool, True)),
                     explain=host_us(lambda: ex(x, w, pool, 2.0, True)),
                     empty=host_us(lambda: torch.empty(16, device="cuda")),
                     eager=host_us(lambda: m(x)))
        if args.raw_c:
            t["raw C"] = raw_c_us(args.raw_c, name, args.batch)
            t["over C"] = t["model"] - t["raw C"]
        print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in t.values()) + " |", flush=True)
    if args.train:
        train_rows(args)
    if args.train_parts:
        train_parts(args)
    if args.trace:
        trace(args)


if __name__ == "__main__":
    main()
