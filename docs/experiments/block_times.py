#!/usr/bin/env python3
"""Per-block end times of k3p2's float16 training forward (K3) and weight_sm90's float16 E/O
instance (WS), from a bench_gpu built with docs/experiments/block_times.patch.

    # here: a worktree at the revision, patched, built for sm_90a, packed as a side
    git worktree add /work/wt/bt HEAD && cd /work/wt/bt && git apply docs/experiments/block_times.patch
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real
    cmake --build build -j2 --target bench_gpu
    cd /work/main && scripts/ab_run.sh pack I /work/wt/bt/build bench/bench_gpu
    # on the device (carry scratch_ab): one file a kernel, every eighth launch printed
    I/bench_gpu --train --batch 128 --iters 20 --warmup 3 > $OUT/k3.txt
    I/bench_gpu --backward w --batch 128 --iters 20 --warmup 3 > $OUT/ws.txt
    # here
    python3 docs/experiments/block_times.py DIR     (DIR holds k3.txt and/or ws.txt)
    python3 docs/experiments/block_times.py --units wu.txt   (docs/experiments/unit_times.patch's
                                                   per-unit phases of weight_sm90)

For the last three printed launches of each: the wait at griddep_wait, the spread of block end
times (from the first block past its wait), the block durations by work (items or units) and
by share (WS: z), and the SMs grouped by the work they held with the range of their last end.
The thirty-fifth session read the forward's 30/31/32-item SMs and weight_sm90's same-share SMs
from it (KERNEL_NOTES, thirty-fifth standing). The patch's printf runs in a later kernel of the
same file, outside the timed blocks; printf inside the timed kernel itself slowed a tenth of
its blocks by up to 400 us.
"""
import collections
import os
import sys


def load(path, tag):
    rows = []
    with open(path) as f:
        for line in f:
            if line.startswith(tag + " "):
                a = line.split()
                rows.append((int(a[1]),) + tuple(int(v) for v in a[2:]))
    return rows


def show(path, tag, n_blocks_hint=None):
    rows = load(path, tag)
    if not rows:
        return
    # a launch prints its blocks 0 .. n-1 in order: split where the index restarts
    launches, cur = [], []
    for r in rows:
        if r[0] == 0 and cur:
            launches.append(cur)
            cur = []
        cur.append(r)
    launches.append(cur)
    print(f"{path} {tag}: {len(launches)} launches, {len(launches[-1])} blocks")
    for la in launches[-3:]:
        rec = [dict(b=r[0], sm=r[1] & 0xFFFFFFFF, work=(r[1] >> 32) & 0xFFFF, z=r[1] >> 48,
                    launch=r[2], t0=r[3], end=r[4]) for r in la]
        t0 = min(r["t0"] for r in rec)
        ends = sorted((r["end"] - t0) / 1000 for r in rec)
        q = lambda f: ends[min(len(ends) - 1, int(f * len(ends)))]
        print(f"  wait {(t0 - min(r['launch'] for r in rec)) / 1000:.2f} us; ends min {ends[0]:.1f} "
              f"p10 {q(.1):.1f} p50 {q(.5):.1f} p90 {q(.9):.1f} max {ends[-1]:.1f}")
        for key in ("work",) + (("z",) if tag == "WS" else ()):
            by = collections.defaultdict(list)
            for r in rec:
                by[r[key]].append((r["end"] - r["t0"]) / 1000)
            for k in sorted(by):
                v = sorted(by[k])
                print(f"    {key} {k}: {len(v)} blocks, duration min {v[0]:.1f} med {v[len(v) // 2]:.1f} "
                      f"max {v[-1]:.1f}")
        sms = collections.defaultdict(list)
        for r in rec:
            sms[r["sm"]].append(r)
        per = collections.defaultdict(list)
        for v in sms.values():
            per[sum(r["work"] for r in v)].append((max(r["end"] for r in v) - t0) / 1000)
        print(f"    SMs {len(sms)}, blocks an SM {dict(collections.Counter(len(v) for v in sms.values()))}")
        print("    work an SM -> last end: " +
              ", ".join(f"{k}: {len(v)} SMs {min(v):.1f}..{max(v):.1f}" for k, v in sorted(per.items())))


def show_units(path):
    """unit_times.patch's WU lines: each unit's phases by kind, medians over the last launch."""
    import statistics
    rows = []
    with open(path) as f:
        for line in f:
            if line.startswith("WU "):
                rows.append(tuple(int(v) for v in line.split()[1:]))
    by = {}
    for b, i, w0, t1, t2, t3 in rows:  # later launches overwrite earlier ones
        by[(b, i)] = (w0, t1, t2, t3)
    phases = collections.defaultdict(lambda: ([], [], [], []))
    for (b, i), (w0, t1, t2, t3) in sorted(by.items()):
        nxt = by.get((b, i + 1))
        if w0 >> 48 == 0xFFFF or nxt is None or nxt[1] < t3:
            continue
        slide, qd = (w0 >> 32) & 1, (w0 >> 16) & 0xFFFF
        kind = ("sliding, odd d-row" if qd % 2 else "sliding, even d-row") if slide else \
            ("a block's first" if i == 0 else "a chunk's first")
        for k, v in enumerate((t2 - t1, t3 - t2, nxt[1] - t3, nxt[1] - t1)):
            phases[kind][k].append(v / 1000)
    print(f"{'unit kind':24} {'n':>5} {'staging':>8} {'E/O build':>10} {'walk':>7} {'unit':>7}  (us, medians)")
    for kind, p in sorted(phases.items()):
        print(f"{kind:24} {len(p[0]):5d} " + " ".join(f"{statistics.median(v):{w}.2f}" for v, w in zip(p, (8, 10, 7, 7))))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--units":
        show_units(sys.argv[2])
        sys.exit(0)
    d = sys.argv[1] if len(sys.argv) > 1 else "."
    for name, tag in (("k3.txt", "K3"), ("ws.txt", "WS")):
        p = os.path.join(d, name)
        if os.path.exists(p):
            show(p, tag)
