#!/usr/bin/env python3
"""The summary of one bench/gpu/cache_runs.sh call: per run, the endless stream's pairs/s, its
latencies and hit rate, the host's CPU, the ratio to the `hbm` run of the same call, and the
backend's per-batch steps (medians of its `timing:` lines).

    python3 bench/gpu/cache_runs_summary.py DIR      # DIR: the call's folder (<run>.tgz or <run>/)
"""
import io
import json
import os
import re
import sys
import tarfile


def load(folder, name):
    """The run's runs.json and setup.json, from its folder or its packed .tgz; None where absent."""
    d = os.path.join(folder, name)
    if os.path.isdir(d):
        read = {f: open(os.path.join(d, f)).read() for f in ("runs.json", "setup.json") if os.path.exists(os.path.join(d, f))}
    elif os.path.exists(d + ".tgz"):
        read = {}
        with tarfile.open(d + ".tgz") as t:
            for m in t.getmembers():
                base = os.path.basename(m.name)
                if base in ("runs.json", "setup.json") and m.isfile():
                    read[base] = io.TextIOWrapper(t.extractfile(m)).read()
    else:
        return None
    if "runs.json" not in read:
        return None
    return json.loads(read["runs.json"]), json.loads(read.get("setup.json", "{}"))


def main():
    folder = sys.argv[1]
    names = sorted({f[:-4] if f.endswith(".tgz") else f for f in os.listdir(folder)
                    if f.endswith(".tgz") or os.path.isdir(os.path.join(folder, f))})
    logs = [f[:-4] for f in os.listdir(folder) if f.endswith(".log")]
    order = [n for n in logs if n in names] or names
    order.sort(key=lambda n: os.path.getmtime(os.path.join(folder, n + ".log")) if n + ".log" in os.listdir(folder) else 0)
    runs = {}
    for n in order:
        got = load(folder, n)
        if got and got[0].get("stream"):
            runs[n] = got
    hbm = runs.get("hbm", ({"stream": [{}]},))[0]["stream"][0].get("pairs_per_s")
    print("run        M pairs/s  x hbm   p50 ms   p99 ms  hit rate (expected)  host busy  server cores  GPU busy  host rows")
    for n, (r, setup) in runs.items():
        s = r["stream"][0]
        ratio = f"{s['pairs_per_s'] / hbm:5.2f}" if hbm else "    -"
        hr = "-" if s.get("hit_rate") is None else f"{s['hit_rate']:.4f} ({s['expected_hit_rate']:.4f})"
        cpu = s.get("cpu", {})
        print(f"{n:10s} {s['pairs_per_s'] / 1e6:9.2f}  {ratio}  {s['p50_ms']:7.2f}  {s['p99_ms']:7.2f}  {hr:19s}  "
              f"{cpu.get('host_busy_pct', 0):8.0f}%  {cpu.get('server_cores', 0):12.1f}  "
              f"{'-' if s.get('gpu_busy_pct') is None else format(s['gpu_busy_pct'], '7.0f') + '%'}  {setup.get('host_memory', '-')}")
    for n, (r, _) in runs.items():
        timing = r["stream"][0].get("timing") or {}
        for kind, steps in timing.items():
            text = ", ".join(f"{label} {v[0]}" for label, v in steps.items())
            print(f"  {n}: {kind} (medians, us unless named): {text}")
    # the first pass of the stream after the server started (the cache as the load left it),
    # and the first pass with the measured seconds after it: a restart's first half minute
    for n, (r, _) in runs.items():
        log = os.path.join(folder, n + ".log")
        first = [ln for ln in open(log, errors="replace")] if os.path.exists(log) else []
        first = [ln for ln in first if "warm pass 1:" in ln]
        m = re.search(r"warm pass 1: ([\d,]+) queries in ([\d.]+) s \(([\d.]+) M pairs/s", first[0]) if first else None
        if not m:
            continue
        s = r["stream"][0]
        q1, s1, rate1 = int(m.group(1).replace(",", "")), float(m.group(2)), float(m.group(3))
        pairs = q1 * s["batch"] + s["queries"] * s["batch"]
        both = pairs / (s1 + s["seconds"]) / 1e6
        print(f"  {n}: first pass after the start {rate1:.2f} M pairs/s ({s1:.1f} s, "
              f"{rate1 / (s['pairs_per_s'] / 1e6):.2f}x the measured rate); the first {s1 + s['seconds']:.0f} s "
              f"together {both:.2f} M pairs/s ({both / (s['pairs_per_s'] / 1e6):.2f}x)")
    for n in order:
        if n not in runs:
            print(f"{n}: no stream figure (see {n}.log)")


if __name__ == "__main__":
    main()
