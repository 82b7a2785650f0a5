#!/usr/bin/env python3
"""Where a kernel's warps wait, by SASS range: ncu's per-instruction stall samples summed.

Input: the CSV that `ncu --section WarpStateStats --section SourceCounters --page source
--print-source sass --csv` prints (scripts/device.sh writes it with NCU_SOURCE=1 as
$OUT/ncu_<kernel>_source.csv.gz; gzip is read as is). Lines before the table (ncu's own and the
benchmark's) are skipped; with several kernels in the file, --kernel picks one by substring.

    python3 scripts/ncu_source.py ncu_grad_x_sm90_source.csv.gz            # blocks of 100 lines
    python3 scripts/ncu_source.py FILE --ranges 0-1200 1200-1460 1460-2050  # named ranges

Prints, for each range of SASS lines (instruction indices as ncu lists them), its share of all
stall samples and of the executed instructions, its top stall reasons, the first instruction
(to find the range in the SASS), then the instructions with the most samples. A range that holds
far more samples than instructions is latency, not work: that is how grad_x_sm90's code staging
(a third of the samples) was found in the twelfth session.
"""
import argparse
import collections
import csv
import gzip
import io
import sys


def read_table(path, kernel=None):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith('"Kernel Name"')]
    if not starts:
        sys.exit(f"{path}: no \"Kernel Name\" line: not ncu's --page source --csv output")
    chosen = None
    for n, i in enumerate(starts):
        if kernel is None or kernel in lines[i]:
            end = starts[n + 1] if n + 1 < len(starts) else len(lines)
            chosen = (lines[i], i + 1, end)
            break
    if chosen is None:
        sys.exit(f"{path}: no kernel matching {kernel!r}")
    name, begin, end = chosen
    rows = list(csv.reader(io.StringIO("\n".join(lines[begin:end]))))
    header, data = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    if "Address" not in header or "Warp Stall Sampling (All Samples)" not in header:
        sys.exit(f"{path}: the table lacks the Address / stall sample columns")
    return name, header, data


def number(text):
    try:
        return int(text.replace(",", ""))
    except ValueError:
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--kernel", help="substring of the kernel's name, where the file holds several")
    ap.add_argument("--ranges", nargs="*", help="SASS line ranges A-B (default: blocks of --block)")
    ap.add_argument("--block", type=int, default=100)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()

    name, header, data = read_table(args.csv, args.kernel)
    col = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    samples = [number(r[col["Warp Stall Sampling (All Samples)"]]) for r in data]
    executed = [number(r[col["Instructions Executed"]]) for r in data]
    total_s, total_e = max(1, sum(samples)), max(1, sum(executed))
    print(name.split('","')[-1].rstrip('",')[:160])
    print(f"{len(data)} SASS lines, {sum(samples)} stall samples, {sum(executed)} warp instructions executed\n")

    if args.ranges:
        ranges = [tuple(int(v) for v in r.split("-")) for r in args.ranges]
    else:
        ranges = [(a, min(a + args.block, len(data))) for a in range(0, len(data), args.block)]
    print("| SASS lines | samples | instructions | top stalls | first instruction |")
    print("|---|---|---|---|---|")
    for a, b in ranges:
        s, e = sum(samples[a:b]), sum(executed[a:b])
        if not args.ranges and s < 0.01 * total_s:
            continue
        by = collections.Counter()
        for r in data[a:b]:
            for h in reasons:
                by[h] += number(r[col[h]])
        top = ", ".join(f"{h[6:]} {100 * v / total_s:.1f}" for h, v in by.most_common(3) if v)
        first = data[a][col["Source"]].strip()[:50] if a < len(data) else ""
        print(f"| {a}-{b} | {100 * s / total_s:.1f}% | {100 * e / total_e:.1f}% | {top} | `{first}` |")

    print(f"\nTop {args.top} instructions by samples:")
    for i in sorted(range(len(data)), key=lambda i: -samples[i])[: args.top]:
        r = data[i]
        why = max(reasons, key=lambda h: number(r[col[h]])) if reasons else ""
        print(f"  {i:5d} {100 * samples[i] / total_s:5.1f}%  {why[6:]:<16} x{executed[i]:<9d} "
              f"{r[col['Source']].strip()[:80]}")


if __name__ == "__main__":
    main()
