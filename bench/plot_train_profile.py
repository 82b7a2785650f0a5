"""Stacked bar of where a training step's device time goes, from bench/profile_train.py output.

Each convpool kernel line is put in one part of the step: forward (the fused forward),
codes (the k3p2 training forward that writes them with the max|x| scan and the near-tie
recheck, or the cuDNN recompute of the conv output with its layout transposes and bias add and
the pooling kernel that records them; the finite check's reductions), grad_w, grad_x; "rest" is the step's wall time
less those (kernels below the listing's --top, and time the device waits on the host).
Eager's step is drawn beside each row.

  python bench/plot_train_profile.py docs/train_profile_h100_tf32.md [more.md ...] -o out.png
"""
import argparse
import re

PARTS = (
    ("forward", r"k3p2_kernel|general_kernel|group_kernel|generic_kernel|finish|pad_rows"),
    ("codes", r"k3p2_kernel<\w+, \w+, true\b|xmma_fprop|nchwToNhwc|nhwcToNchw|pool_train|CUDAFunctor_add|reduce_kernel<"
              r"|absmax_kernel|recheck_kernel"),
    ("grad_w", r"weight_mma|weight_sm90|weight_tile|weight_partial|weight_reduce"),
    ("grad_x", r"grad_x"),
)


def parse(path):
    rows, row, who = [], None, None
    for line in open(path):
        m = re.match(r"## (\S+), x (\S+)", line)
        if m:
            row = {"name": f"{m.group(1)} {m.group(2).split('x')[0]}", "parts": dict.fromkeys([p for p, _ in PARTS], 0.0)}
            rows.append(row)
            continue
        m = re.match(r"### (eager|convpool): step ([0-9.]+) ms", line)
        if m:
            who = m.group(1)
            row[who] = float(m.group(2))
            continue
        m = re.match(r"\| ([0-9.]+) \| \d+ \| (.*)\|", line)
        if m and who == "convpool":
            # codes first: the training forward's k3p2 instance (CODES = true) is a codes kernel
            for part, pat in sorted(PARTS, key=lambda p: p[0] != "codes"):
                if re.search(pat, m.group(2)):
                    row["parts"][part] += float(m.group(1))
                    break
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profiles", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--title", default="training step, device time by part")
    ap.add_argument("--ms", action="store_true", help="bars in ms instead of fractions of eager's step")
    args = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = []
    for p in args.profiles:
        tag = "strict" if "strict" in p else ("no grad_x" if "nogx" in p else "TF32")
        for r in parse(p):
            r["name"] += f"\n{tag}"
            rows.append(r)
    fig, ax = plt.subplots(figsize=(1.6 * len(rows) + 2, 4.5))
    xs = range(len(rows))
    bottom = [0.0] * len(rows)
    unit = [1.0 if args.ms else r["eager"] for r in rows]
    for part, _ in PARTS:
        vals = [r["parts"][part] / u for r, u in zip(rows, unit)]
        ax.bar(xs, vals, 0.6, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, vals)]
    rest = [max(0.0, r["convpool"] / u - b) for r, u, b in zip(rows, unit, bottom)]
    ax.bar(xs, rest, 0.6, bottom=bottom, label="rest (host, small kernels)", color="lightgrey")
    top = [max(r["convpool"] / u, b) for r, u, b in zip(rows, unit, bottom)]
    for x, r, u, b, t in zip(xs, rows, unit, bottom, top):
        # grad_x and grad_w on two streams (the binding's split backward) overlap: their bars
        # then add to more than the step, and the label says so.
        over = "\nkernels overlap" if b * u > r["convpool"] * 1.001 else ""
        ax.text(x, t * 1.01, f"{r['convpool']:.2f} ms\n{r['eager'] / r['convpool']:.1f}x{over}",
                ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 1.25 * max(top))
    ax.set_xticks(list(xs), [r["name"] for r in rows], fontsize=8)
    ax.set_ylabel("device ms" if args.ms else "fraction of eager's step (1.0 = eager)")
    ax.set_title(args.title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    for r in rows:
        print(r["name"].replace("\n", " "), r["eager"], r["convpool"], {k: round(v, 3) for k, v in r["parts"].items()})


if __name__ == "__main__":
    main()
