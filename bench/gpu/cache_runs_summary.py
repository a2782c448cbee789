#!/usr/bin/env python3
"""The summary of one bench/gpu/cache_runs.sh call: per run, the endless stream's pairs/s, its
latencies and hit rate, the host's CPU, the ratio to the same call's all-in-HBM run (`hbm`, or
`hbm` and the run's own ending: quietb32 against hbmb32), and the
backend's per-batch steps (medians of its `timing:` lines). Then each cached run's misses read
from the host a second, served (the stream's keys a second times its miss rate; the rows read,
fewer when a batch reads each missed row once, from the timing line's medians), beside the
plain gathers of the same call's `plain` run (served_reads_bench: the host alone, every core):
the batched one, 16 threads started for each batch, and the steady one, threads started once
that never pause (the host's rate, 2.2-3.7x the batched on the H200 hosts of 2026-11-30; issue
66's first target reads against it), rewriting one batch's buffer, which the CPU's caches hold, and
writing as many batches' buffers in turn as the served instances do (0.70-0.86x that on 1 December). And where the reads' cores went: the readers' busy time a batch
(the timing line's `shares busy`) times the batches a second is how many cores read on average;
the rows each of them read a second, beside the plain gather's a thread, says whether the gap to
the plain gather is slower reads or fewer cores reading; beside the steady gather's a thread at
the readers' busy cores (the same thread count, as far as its table goes). And the misses a pair
costs: at DLRM-v2's hit rate, misses served a second are the pairs a second times about 10.4, so
100 M of them would take about 0.84x the all-in-HBM rate.

    python3 bench/gpu/cache_runs_summary.py DIR      # DIR: the call's folder (<run>.tgz or <run>/)
"""
import io
import json
import os
import re
import sys
import tarfile

PLAIN_ROW = re.compile(r"^\|\s*([0-9.]+)\s*\|")


def plain_rate(folder):
    """The `plain` run's plain gather on the whole host: (M rows/s, its table line, the row, its
    threads or None); None when the call had no such run."""
    path = os.path.join(folder, "plain.txt")
    if not os.path.exists(path):
        return None
    text = open(path, errors="replace").read()
    threads = re.search(r"the plain gathers (\d+)", text)
    lines = text.splitlines()
    for i, ln in enumerate(lines):
        m = PLAIN_ROW.match(ln)
        if m and i >= 2 and "plain, whole host" in lines[i - 2]:
            return float(m.group(1)), lines[i - 2], ln, int(threads.group(1)) if threads else None
    return None


def steady_table(folder, name="plain.txt"):
    """The `plain` run's steady gather (threads that never pause) as plain.txt (or `name`, a
    `plainbus` file) has it: {threads: {rows prefetched ahead: M rows/s}}, plain stores only (not
    its streaming column); {} when the file has no such table."""
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return {}
    table, inside = {}, False
    for ln in open(path, errors="replace"):
        if "plain, steady threads" in ln:
            inside = True
            continue
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if inside and cells and cells[0].isdigit():
            table[int(cells[0])] = {ahead: float(c) for ahead, c in zip((4, 8, 16), cells[1:4])}
    return table


def steady_staged_best(folder, name="plain.txt"):
    """The steady gather's best into several batches' buffers written in turn (plain.txt's, or
    `name`'s, column "16 ahead, into N batches' buffers", plain stores), as the served instances
    write their staging: (M rows/s, its threads, N); None where the file has no such column."""
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return None
    best, col, batches = None, None, None
    for ln in open(path, errors="replace"):
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if "plain, steady threads" in ln:
            col = next((i for i, c in enumerate(cells) if "batches' buffers" in c and "streaming" not in c), None)
            m = re.search(r"into (\d+) batches' buffers", ln)
            batches = int(m.group(1)) if m else None
            continue
        if col is not None and cells and cells[0].isdigit() and len(cells) > col:
            rate = float(cells[col])
            if best is None or rate > best[0]:
                best = (rate, int(cells[0]), batches)
    return best


def bus_loaded(folder):
    """The `plainbus` run's steady gathers, each beside the GPU's copies of its load (`0`: none,
    `20`: 20 GB/s up, `max`: as fast as the bus goes): [(load, best M rows/s one buffer, best into
    the instances' buffers or None, GB/s the copies kept or None)], in that order; [] without it."""
    kept = []
    path = os.path.join(folder, "plainbus.load.txt")
    if os.path.exists(path):
        kept = [float(m.group(1)) for m in re.finditer(r"bus load: ([\d.]+) GB/s", open(path, errors="replace").read())]
    out = []
    for load in ("0", "20", "max"):
        name = f"plainbus.{load}.txt"
        rates = [r for row in steady_table(folder, name).values() for r in row.values()]
        if not rates:
            continue
        staged = steady_staged_best(folder, name)
        gbps = None if load == "0" else (kept.pop(0) if kept else None)
        out.append((load, max(rates), staged[0] if staged else None, gbps))
    return out


def hbm_of(name, runs):
    """The all-in-HBM run a run is held against: `hbm` with the longest end of its name that
    names a run of the call (quietb32: hbmb32; quiet: hbmquiet where that ran, else hbm); None
    when there is none."""
    for i in range(len(name) + 1):
        ref = "hbm" + name[i:]
        if ref in runs:
            return ref
    return None


def plain_steady(folder):
    """The steady gather's best: (M rows/s, its threads, its prefetch depth); None without it."""
    rates = [(rate, threads, ahead) for threads, row in steady_table(folder).items() for ahead, rate in row.items()]
    return max(rates, key=lambda r: r[0]) if rates else None


def steady_per_thread(folder):
    """The steady gather a thread, by its thread count: {threads: M rows/s a thread}, each
    count's best prefetch depth; {} without the table."""
    return {threads: max(row.values()) / threads for threads, row in steady_table(folder).items()}


def per_core_against_steady(each, cores, steady):
    """(ratio, threads) of a busy reader core's rows a second (`each`) to a steady plain-gather
    thread's at the fewest threads of `steady` that are at least the readers' busy `cores` (the
    most there are, when none is): the same thread count, as far as the table has it; None
    without a table."""
    if not steady:
        return None
    at = min((t for t in steady if t >= cores), default=max(steady))
    return each / steady[at], at


def misses_a_pair(stream):
    """Misses a served pair costs (its keys a pair times the miss rate); None without a hit rate."""
    if stream.get("hit_rate") is None or not stream.get("pairs_per_s"):
        return None
    return stream["lookups_per_s"] / stream["pairs_per_s"] * (1 - stream["hit_rate"])


def host_rows(steps):
    """Rows a batch's host threads read (medians of the `batch lookup` timing steps: `rows read`
    less those `read by the gpu` in place); 0 where the line has none."""
    return max(0, steps.get("rows read", [0])[0] - steps.get("read by the gpu", [0])[0])


def misses_read(stream):
    """(misses a second, rows read from the host a second by host threads) of a served stream,
    M: its keys a second times its miss rate, and the rows the batches' host threads read
    against their `misses` (timing medians; the misses where it has none). None without a hit
    rate."""
    if stream.get("hit_rate") is None or not stream.get("lookups_per_s"):
        return None
    misses = stream["lookups_per_s"] * (1 - stream["hit_rate"]) / 1e6
    steps = (stream.get("timing") or {}).get("batch lookup", {})
    m, read = steps.get("misses", [0])[0], host_rows(steps)
    return misses, misses * read / m if m and read else misses


def reading_cores(stream):
    """(cores reading on average, M rows read a second by each) of a served stream, from its
    timing medians (`shares busy` us a batch, the host threads' rows, the batch's `rows`); None
    without them."""
    timing = stream.get("timing") or {}
    lookup, serve = timing.get("batch lookup", {}), timing.get("serve", {})
    busy, read, pairs = lookup.get("shares busy", [0])[0], host_rows(lookup), serve.get("rows", [0])[0]
    if not (busy and read and pairs and stream.get("pairs_per_s")):
        return None
    batches = stream["pairs_per_s"] / pairs
    return busy * 1e-6 * batches, read / (busy * 1e-6) / 1e6


def crew_cpu(stream):
    """(the reader crew's members' CPU in cores, the instances' threads', the network's threads')
    of a served stream, from its CPU line's threads by kind (`reader`, `tritonserver`,
    `torch-gpu`; a kind not listed counts 0); None without the reader crew among them."""
    kinds = dict((k, c) for k, c in (stream.get("cpu") or {}).get("threads_by_kind", []))
    if "reader" not in kinds:
        return None
    return kinds["reader"], kinds.get("tritonserver", 0.0), kinds.get("torch-gpu", 0.0)


def queue_busy(stream):
    """(share of the time the caches' queue was held, its lookup ms, its fill ms a batch) of a
    served stream: the `queue lookup` and `queue fill` medians (GPU time by events, a run under
    TRITON_RUST_TIME_QUEUE=1) times the batches a second. Every instance of the GPU queues its
    lookup and its fill there one after the other, so near 1.0 that queue holds the rate. None
    without them."""
    timing = stream.get("timing") or {}
    lookup, serve = timing.get("batch lookup", {}), timing.get("serve", {})
    probe, fill = lookup.get("queue lookup", [0])[0], lookup.get("queue fill", [0])[0]
    pairs = serve.get("rows", [0])[0]
    if not (probe and pairs and stream.get("pairs_per_s")):
        return None
    batches = stream["pairs_per_s"] / pairs
    return (probe + fill) * 1e-6 * batches, probe / 1e3, fill / 1e3


def bus_traffic(path):
    """(GB/s up, GB/s down) means of a run's `nvidia-smi dmon -s tu` samples over its longest
    stretch of busy seconds (SM share over 5% in each: the warm passes and the stream). A sample a
    second swings between NVML's shorter windows (the SM share 30% and 100% in turn under a
    steady load), so means, and no SM share: the stream's own GPU busy figure is the one to read;
    None without samples."""
    if not os.path.exists(path):
        return None
    cols, rows = None, []
    for ln in open(path, errors="replace"):
        f = ln.split()
        if ln.startswith("#") and "rxpci" in ln:
            cols = [c.lstrip("#") for c in f]
        elif cols and not ln.startswith("#") and len(f) == len(cols):
            try:
                rows.append({c: float(v) for c, v in zip(cols, f) if c in ("sm", "rxpci", "txpci")})
            except ValueError:
                continue
    rows = [r for r in rows if len(r) == 3]
    if not rows:
        return None
    serving, stretch = [], []
    for r in rows + [{"sm": 0}]:
        if r["sm"] > 5:
            stretch.append(r)
        else:
            serving, stretch = max(serving, stretch, key=len), []
    if not serving:
        return None
    mean = lambda k: sum(r[k] for r in serving) / len(serving)
    return mean("rxpci") / 1e3, mean("txpci") / 1e3


def echo(folder, name, title, keep=lambda ln: True):
    """A file of the call's (a tool's output) under `title`, the lines `keep` takes, indented;
    nothing where it is absent."""
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return
    print(title)
    for ln in open(path, errors="replace"):
        if keep(ln):
            print("  " + ln.rstrip())


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
    def hbm_rate(n):
        ref = hbm_of(n, runs)
        return runs[ref][0]["stream"][0].get("pairs_per_s") if ref else None

    print("run        M pairs/s  x hbm   p50 ms   p99 ms  hit rate (expected)  host busy  server cores  GPU busy  host rows")
    for n, (r, setup) in runs.items():
        s = r["stream"][0]
        hbm = hbm_rate(n)
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
    # the CPU time spent in the kernel (system time): page faults, futex waits and wake-ups, yields
    for n, (r, _) in runs.items():
        cpu = r["stream"][0].get("cpu", {})
        if "server_kernel_cores" in cpu:
            by = ", ".join(f"{k} {c:.2f}" for k, c in cpu.get("kernel_by_kind", []))
            host = f"host {cpu['host_kernel_pct']:.1f}% of its time, " if "host_kernel_pct" in cpu else ""
            print(f"  {n}: in the kernel: {host}tritonserver {cpu['server_kernel_cores']:.2f} of its "
                  f"{cpu.get('server_cores', 0):.1f} cores (by kind: {by})")
        # runnable, no core free (more threads than cores, or the hypervisor's steal)
        if "server_waiting_cores" in cpu:
            by = ", ".join(f"{k} {c:.2f}" for k, c in cpu.get("waiting_by_kind", []))
            steal = f"; the host's steal {cpu['host_steal_pct']:.1f}%" if "host_steal_pct" in cpu else ""
            print(f"  {n}: waiting runnable for a core: tritonserver {cpu['server_waiting_cores']:.2f} cores "
                  f"(by kind: {by}){steal}")
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
    plain = plain_rate(folder)
    if plain:
        print(f"plain gather, the host alone, same call (plain.txt): {plain[0]:.1f} M rows/s on the whole host, "
              "16 threads started for each batch")
    steady = plain_steady(folder)
    if steady:
        print(f"plain gather, steady threads, same call (plain.txt): best {steady[0]:.1f} M rows/s "
              f"({steady[1]} threads, {steady[2]} rows prefetched ahead)")
    staged = steady_staged_best(folder)
    if staged:
        print(f"plain gather, steady threads into {staged[2]} batches' buffers in turn, as the instances write "
              f"them, same call (plain.txt): best {staged[0]:.1f} M rows/s ({staged[1]} threads)")
    loaded = bus_loaded(folder)
    for copies, one, staged_rate, gbps in loaded:
        beside = "alone" if copies == "0" else f"beside the GPU's copies at {gbps if gbps is not None else copies} GB/s up"
        into = f", into the instances' buffers {staged_rate:.1f}" if staged_rate is not None else ""
        print(f"plain gather, steady threads, {beside}, same call (plainbus.{copies}.txt): best {one:.1f} M rows/s{into}")
    # the steady gather beside the bus's copies at the served rate: into the instances' buffers
    served_like = next((x[2] if x[2] is not None else x[1] for x in loaded if x[0] == "20"), None)
    for n, (r, _) in runs.items():
        got = misses_read(r["stream"][0])
        if got and got[0] > 0:
            versus = f"; {got[1] / plain[0]:.2f}x the batched plain gather" if plain else ""
            if steady:
                versus += f", {got[1] / steady[0]:.2f}x its steady best"
            if staged:
                versus += f", {got[1] / staged[0]:.2f}x its steady best into {staged[2]} batches' buffers"
            if served_like:
                versus += (f"; {got[1] / served_like:.2f}x the steady gather beside the bus's copies at the served "
                           f"rate ({served_like:.1f} M)")
            print(f"  {n}: misses served {got[0]:.1f} M/s, rows read from the host {got[1]:.1f} M/s{versus}")
            m, hbm = misses_a_pair(r["stream"][0]), hbm_rate(n)
            if m and hbm:
                need = 100.0 / m
                print(f"  {n}: {m:.2f} misses a pair: 100 M misses a second would take {need:.2f} M pairs/s "
                      f"({need * 1e6 / hbm:.2f}x hbm)")
            cores, each = reading_cores(r["stream"][0]) or (None, None)
            threads = plain[3] if plain else None
            if cores:
                per = f" against the batched plain gather's {plain[0] / threads:.2f} M a thread ({threads} threads)" if plain and threads else ""
                print(f"  {n}: its readers busy {cores:.1f} cores on average, {each:.2f} M rows/s a busy core{per}")
                crew = crew_cpu(r["stream"][0])
                if crew:
                    print(f"  {n}: CPU: the crew's members {crew[0]:.1f} cores (the shares' wall time {cores:.1f}: "
                          f"{max(0.0, 1 - crew[0] / cores):.0%} of it off their cores or read by the callers), "
                          f"the instances' threads {crew[1]:.1f} (reading their own shares among the rest), "
                          f"the network's threads {crew[2]:.1f}")
                against = per_core_against_steady(each, cores, steady_per_thread(folder))
                if against:
                    print(f"  {n}: a busy reader core {against[0]:.2f}x a steady plain-gather thread at "
                          f"{against[1]} threads, same call")
    for n in runs:
        got = bus_traffic(os.path.join(folder, n + ".dmon.txt"))
        if got:
            print(f"  {n}: while serving (nvidia-smi dmon, means): {got[0]:.1f} GB/s up the bus, "
                  f"{got[1]:.1f} GB/s down")
    echo(folder, "pcie.txt", "the bus alone, same call (pcie.txt):")
    for n, (r, _) in runs.items():
        got = queue_busy(r["stream"][0])
        if got:
            print(f"  {n}: the caches' queue held {100 * got[0]:.0f}% of the time: a batch's lookup "
                  f"{got[1]:.3f} ms and fill {got[2]:.3f} ms on it (GPU time, medians)")
    echo(folder, "grid.txt", "the GPU's in-place reads alone, by grid, same call (grid.txt):",
         lambda ln: ln.startswith(("|", "rows:")))
    for n in order:
        if n not in runs and n not in ("plain", "grid"):
            print(f"{n}: no stream figure (see {n}.log)")


if __name__ == "__main__":
    main()
