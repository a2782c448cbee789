#!/usr/bin/env python3
"""What ran on the GPU while a server served, from bench/gpu/kernel_trace.c's file: every
kernel's start and end on the GPU. Over the steady stretch (the longest run of seconds whose
count of network kernels is at least 80% of the busiest second's, less a second at each end, its
middle --seconds at most) it prints the share of the time the GPU ran any kernel, a network
kernel (anything that is not the store's), one of the GPU cache's or pooling kernels, both at
once, and each kernel's count, time and how much of that time a network kernel ran beside it;
and a batch's GPU time (any kernel running, over the batches the stretch began: a batch's first
cache or pooling kernel, `probe_slots`, `batch_lookup*` or `pool_resident*`).

    python3 bench/gpu/kernel_trace.py TRACE [--seconds 10] [--top 12]
"""
import argparse
import re
import struct
import sys

# the store's kernels (crates/cuda/src/kernels/*.cu): the rest are the networks'
STORE = re.compile(r"^(probe_slots|pool_|dedupe_misses|batch_|sketch_count|gather_keys|scatter_rows|"
                   r"read_host_rows|cache_|resident_write|copy_parts)")
# the kernel that begins a batch's lookup, whichever path it takes
BATCH = re.compile(r"^(probe_slots|batch_lookup|pool_resident)")
RECORD = struct.Struct("<QQII")


def read(path):
    """(names by index, [(start_ns, end_ns, stream, name index)])."""
    names, kernels = {}, []
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at + RECORD.size <= len(data):
        start, end, stream, name = RECORD.unpack_from(data, at)
        at += RECORD.size
        if start == 0:  # a name: `end` bytes follow
            names[name] = data[at:at + end].decode("utf-8", "replace")
            at += end
        elif end >= start:
            kernels.append((start, end, stream, name))
    return names, kernels


def union(intervals):
    """The intervals merged, sorted."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def length(merged):
    return sum(e - s for s, e in merged)


def intersect(a, b):
    """Two merged lists' common time, merged."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append([s, e])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def stores(names):
    """{name index: whether it is one of the store's kernels}."""
    return {i: bool(STORE.match(n)) for i, n in names.items()}


def steady(kernels, names, seconds):
    """(from_ns, to_ns) of the steady stretch: see the module's docstring; None without one."""
    store = stores(names)
    net = [k[0] for k in kernels if not store.get(k[3], False)]
    if not net:
        return None
    t0 = min(net)
    bins = {}
    for s in net:
        b = (s - t0) // 1_000_000_000
        bins[b] = bins.get(b, 0) + 1
    top = max(bins.values())
    best, run = (0, 0), None
    for b in range(max(bins) + 1):
        if bins.get(b, 0) >= 0.8 * top:
            run = (run[0], b + 1) if run else (b, b + 1)
            if run[1] - run[0] > best[1] - best[0]:
                best = run
        else:
            run = None
    lo, hi = best[0] + 1, best[1] - 1  # a second off each end
    if hi <= lo:
        lo, hi = best
    if hi - lo > seconds:
        mid = (lo + hi) / 2
        lo, hi = mid - seconds / 2, mid + seconds / 2
    return t0 + int(lo * 1e9), t0 + int(hi * 1e9)


def summary(names, kernels, seconds=10.0, top=12):
    """The printed lines (a list of str)."""
    window = steady(kernels, names, seconds)
    if window is None:
        return ["no network kernel in the trace: nothing to summarize"]
    a, b = window
    inside = [(max(s, a), min(e, b), st, n) for s, e, st, n in kernels if e > a and s < b]
    span = b - a
    is_store = stores(names)
    net = union([(s, e) for s, e, _, n in inside if not is_store.get(n, False)])
    store = union([(s, e) for s, e, _, n in inside if is_store.get(n, False)])
    both = intersect(net, store)
    every = union([(s, e) for s, e, _, _ in inside])
    batches = sum(1 for s, _, _, n in inside if s >= a and BATCH.match(names.get(n, "?")))
    pct = lambda x: 100.0 * x / span
    lines = [f"steady stretch: {span / 1e9:.1f} s, {len(inside)} kernels, {batches} batches begun "
             f"({batches / (span / 1e9):.0f} a second)",
             f"GPU running any kernel {pct(length(every)):.1f}% of the time; a network kernel "
             f"{pct(length(net)):.1f}%, the store's {pct(length(store)):.1f}%, both at once "
             f"{pct(length(both)):.1f}% (the store's alone {pct(length(store) - length(both)):.1f}%, "
             f"the networks' alone {pct(length(net) - length(both)):.1f}%, none {pct(span - length(every)):.1f}%)"]
    if batches:
        lines.append(f"a batch: {length(every) / batches / 1e6:.3f} ms of any kernel running, "
                     f"{length(store) / batches / 1e6:.3f} ms of the store's, {length(net) / batches / 1e6:.3f} ms of a network's")
    per = {}
    for s, e, _, n in inside:
        per.setdefault(n, []).append((s, e))
    rows = sorted(per.items(), key=lambda kv: -sum(e - s for s, e in kv[1]))[:top]
    lines.append(f"{'kernel':48} {'count':>7} {'ms total':>9} {'us each':>8} {'network beside':>15}")
    for n, iv in rows:
        busy = sum(e - s for s, e in iv)
        beside = "-"
        if is_store.get(n, False):
            own = union(iv)
            beside = format(100.0 * length(intersect(own, net)) / max(1, length(own)), "14.0f") + "%"
        lines.append(f"{names.get(n, '?')[:48]:48} {len(iv):7d} {busy / 1e6:9.1f} {busy / len(iv) / 1e3:8.1f} {beside}")
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--top", type=int, default=12)
    a = p.parse_args()
    names, kernels = read(a.trace)
    if not kernels:
        sys.exit(f"{a.trace}: no kernel recorded")
    print("\n".join(summary(names, kernels, a.seconds, a.top)))


if __name__ == "__main__":
    main()
