#!/usr/bin/env python3
"""Averages (medians, 99th percentiles) of the backend's verbose `timing:` lines in a server log, per kind of
line (server run with --log-verbose=1): where a batch's time goes inside the server.

    python3 bench/gpu/timing_summary.py server.log [--skip 0.25]

--skip F leaves out the first F of the log's timing lines (the warm-up: a cold cache, the first
batches' CUDA graphs).
"""
import re


KINDS = ("batch lookup", "torch run", "onnx run", "aoti run", "resident pooled lookup", "pooled lookup", "execute", "gather")


def figures(lines):
    """{(kind, label): [value, ...]} over the `timing:` lines among `lines`, in the order
    first seen; kind is the line's own prefix (`batch lookup`, `torch run`, `onnx run`, `aoti run`, `resident pooled
    lookup`, `pooled lookup`, `execute`, `gather`) or `serve`."""
    found = {}
    for line in lines:
        if "timing:" not in line:
            continue
        # figures only: a line's parenthesised notes (the tables with the most misses) are not averaged
        body = line.split("timing:", 1)[1].strip().rstrip('"').split(" (", 1)[0]
        kind, _, rest = body.partition(":") if body.startswith(KINDS) else ("serve", "", body)
        for label, value in re.findall(r"([a-z][a-z ]*?) (\d+)(?: us)?(?:,|$)", rest):
            found.setdefault((kind.strip(), label.strip()), []).append(int(value))
    return found


def averages(lines):
    """{(kind, label): (mean, count)}, as figures() finds them."""
    return {k: (sum(v) / len(v), len(v)) for k, v in figures(lines).items()}


def rank(values, q):
    """The value at fraction `q` of `values` sorted (nearest rank: q 0.5 the median, the upper
    one of an even count; q 0.99 the 99th percentile)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def medians(lines):
    """{(kind, label): median} (the upper one of an even count), as figures() finds them: a
    typical run, where a mean also counts the warm-up and any larger batches."""
    return {k: rank(v, 0.5) for k, v in figures(lines).items()}


def summarize(path, skip: float = 0.0):
    """{(kind, label): (mean, median, p99, count)} of a server log's timing lines (the first
    `skip` of them left out): the p99 says which step a slow batch's time went to."""
    with open(path, errors="replace") as f:
        lines = [line for line in f if "timing:" in line]
    found = figures(lines[int(skip * len(lines)):])
    return {k: (sum(v) / len(v), rank(v, 0.5), rank(v, 0.99), len(v)) for k, v in found.items()}


if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("log")
    p.add_argument("--skip", type=float, default=0.0, help="the share of the timing lines left out first")
    a = p.parse_args()
    print(f"{'kind':<14} {'step (us, or a count)':<28} {'mean':>12} {'median':>10} {'p99':>10}")
    for (kind, label), (avg, median, p99, n) in sorted(summarize(a.log, a.skip).items()):
        print(f"{kind:<14} {label:<28} {avg:>12.1f} {median:>10} {p99:>10}  (n={n})")
