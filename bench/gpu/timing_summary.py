#!/usr/bin/env python3
"""Averages the backend's verbose `timing:` lines in a server log, per kind of line
(server run with --log-verbose=1): where a batch's time goes inside the server.

    python3 bench/gpu/timing_summary.py server.log
"""
import re
import sys


def averages(lines):
    """{(kind, label): (mean, count)} over the `timing:` lines among `lines`, in the order
    first seen; kind is the line's own prefix (`batch lookup`, `torch run`, `onnx run`, `aoti run`) or `serve`."""
    sums, counts = {}, {}
    for line in lines:
        if "timing:" not in line:
            continue
        # figures only: a line's parenthesised notes (the tables with the most misses) are not averaged
        body = line.split("timing:", 1)[1].strip().rstrip('"').split(" (", 1)[0]
        kind, _, rest = body.partition(":") if body.startswith(("batch lookup", "torch run", "onnx run", "aoti run")) else ("serve", "", body)
        for label, value in re.findall(r"([a-z][a-z ]*?) (\d+)(?: us)?(?:,|$)", rest):
            key = (kind.strip(), label.strip())
            sums[key] = sums.get(key, 0) + int(value)
            counts[key] = counts.get(key, 0) + 1
    return {k: (sums[k] / counts[k], counts[k]) for k in sums}


def summarize(path):
    with open(path, errors="replace") as f:
        return averages(f)


if __name__ == "__main__":
    for (kind, label), (avg, n) in sorted(summarize(sys.argv[1]).items()):
        print(f"{kind:<14} {label:<28} {avg:>12.1f}  (n={n})")
