"""CPU benchmark driver: fused CPU path, reference and PyTorch CPU eager at equal thread counts.

Runs build/bench/bench_cpu (fused + reference) and bench_cpu_torch.py (PyTorch eager) at the
headline size and at batch 8, with 16 threads and with 1 thread, and writes bench_cpu.json
and bench_cpu_table.md under --out.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_json(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--threads", type=int, nargs="+", default=[16, 1])
    args = ap.parse_args()
    rows = []
    for batch in (128, 8):
        for t in args.threads:
            if batch == 128 and t == 1:
                continue  # tens of seconds per call; batch 8 shows the single-thread ratio
            common = ["--batch", str(batch), "--threads", str(t), "--json"]
            iters = ["--iters", "5" if batch == 128 else "10", "--warmup", "1"]
            fused = run_json([os.path.join(args.build, "bench", "bench_cpu"), *common, *iters, "--ref-batch", "1"])
            torch_rows = run_json([sys.executable, os.path.join(HERE, "bench_cpu_torch.py"), *common, *iters])
            for r in fused + torch_rows:
                r["threads_requested"] = t
                rows.append(r)
                print(json.dumps(r), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_cpu.json"), "w") as f:
        json.dump(rows, f, indent=1)
    lines = ["| shape | threads | variant | median ms | GFLOP/s | fused speedup |", "|---|---|---|---|---|---|"]
    for r in rows:
        fused = next((q for q in rows if q["variant"] == "convpool_cpu" and q["shape"] == r["shape"]
                      and q["threads_requested"] == r["threads_requested"]), None)
        sp = r["median_ms"] / fused["median_ms"] if fused else float("nan")
        lines.append(f"| {r['shape']} | {r['threads']} | {r['variant']} | {r['median_ms']:.1f} | {r['GFLOPs']:.1f} | {sp:.2f} |")
    with open(os.path.join(args.out, "bench_cpu_table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
