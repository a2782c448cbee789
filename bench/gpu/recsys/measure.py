"""Measuring the server: a perf_analyzer run (its CSV, the batch's inferences/s, the cache's hit
rate and keys/s from the server's metrics) and Triton's per-model statistics."""
import csv
import os
import re
import subprocess
import time
import urllib.request


def metrics_text(port):
    """The server's Prometheus metrics, as text."""
    return urllib.request.urlopen(f"http://localhost:{port + 2}/metrics", timeout=30).read().decode()


# The backend publishes its metrics every 250 ms (src/metrics.rs): a scrape this long after the
# server went quiet sees every lookup counted, keys and hits alike.
METRICS_SETTLE_S = 0.6


def scrape(port, model, text=None):
    """(keys looked up, cache hits) summed over tables, from the server's metrics (`text`: an
    earlier `metrics_text`, else fetched)."""
    text = metrics_text(port) if text is None else text
    keys = hits = 0.0
    for line in text.splitlines():
        if f'model="{model}"' not in line:
            continue
        if line.startswith("rust_embedding_lookup_keys_total"):
            keys += float(line.rsplit(" ", 1)[1])
        elif line.startswith("rust_embedding_hits_total") and 'tier="cache"' in line:
            hits += float(line.rsplit(" ", 1)[1])
    return keys, hits


def device_counts(port, model, text=None):
    """{device: inferences run there} of `model`'s instances, from the backend's
    rust_device_inferences_total (KIND_GPU models; `text` as for `scrape`)."""
    text = metrics_text(port) if text is None else text
    out = {}
    for line in text.splitlines():
        if line.startswith("rust_device_inferences_total") and f'model="{model}"' in line:
            device = line.split('device="', 1)[1].split('"', 1)[0]
            out[device] = out.get(device, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def per_device(d0, d1, rate):
    """{device: its share of the inferences run between two device_counts, times `rate`} (a
    non-batching model counts one inference a request, whatever its rows: shares, not counts)."""
    ran = {d: d1[d] - d0.get(d, 0.0) for d in sorted(d1)}
    whole = sum(ran.values())
    return {d: rate * v / whole for d, v in ran.items()} if whole > 0 else {}


def model_stats(client, models):
    """{model: (count, compute_input_ns, compute_infer_ns, compute_output_ns, queue_ns)} from Triton."""
    out = {}
    for m in models:
        st = client.stats(m)["inference_stats"]
        out[m] = [st["success"]["count"]] + [st[k]["ns"] for k in ("compute_input", "compute_infer", "compute_output", "queue")]
    return out


def per_model(before, after):
    """Average per-execution times (ms) of each model between two model_stats calls."""
    res = {}
    for m in after:
        n = after[m][0] - before[m][0]
        if n > 0:
            res[m] = {k: (after[m][i] - before[m][i]) / n / 1e6 for i, k in enumerate(("input", "infer", "output", "queue"), 1)}
    return res


def perf(pa, port, model, batch, conc, data, out_dir, tag, metrics_model, interval_ms, shm="system", protocol="grpc"):
    raw = os.path.join(out_dir, "raw", f"{tag}_b{batch}_c{conc}.csv")
    os.makedirs(os.path.dirname(raw), exist_ok=True)
    grpc = protocol.startswith("grpc")
    url = f"localhost:{port + 1}" if grpc else f"localhost:{port}"
    cmd = [pa, "-m", model, "-b", "1", "--concurrency-range", f"{conc}:{conc}", "-i", "grpc" if grpc else "http",
           "-u", url] + (["--streaming"] if protocol == "grpc-streaming" else []) + [
           "--shared-memory", shm, "--output-shared-memory-size", str(max(1 << 20, batch * 4 * 2)),
           "--input-data", data, "--measurement-interval", str(interval_ms), "--max-trials", "6", "-f", raw]
    time.sleep(METRICS_SETTLE_S)
    k0, h0 = scrape(port, metrics_model)
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    stability = 10  # perf_analyzer's default bound (%) on how far its last windows may differ
    # a window's throughput or latency moved by more than the bound: longer windows and a looser
    # bound, twice at most (the console line says which runs were retried; the row keeps the
    # bound it was measured under, and the report lists the rows not measured at 10%)
    for factor, looser in ((2, 25), (4, 50)):
        if p.returncode == 0 or "stable" not in p.stdout + p.stderr:
            break
        print(f"  ({model} b={batch} c={conc}: unstable at -s {stability}; retrying with {factor * interval_ms} ms "
              f"windows and -s {looser})", flush=True)
        retry = cmd[:-2]
        retry[retry.index("--measurement-interval") + 1] = str(factor * interval_ms)
        p = subprocess.run(retry + ["-s", str(looser), "-f", raw], capture_output=True, text=True, timeout=900)
        stability = looser
    secs = time.time() - t0
    time.sleep(METRICS_SETTLE_S)
    k1, h1 = scrape(port, metrics_model)
    if p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-2000:])
        print(f"perf_analyzer gave no figure: {' '.join(cmd)}", flush=True)
        return None
    with open(raw) as f:
        rows = list(csv.DictReader(f))
    row = rows[0]
    # one perf_analyzer step is one whole request of `batch` rows
    row["Inferences/Second"] = str(float(row["Inferences/Second"]) * batch)
    row["Batch"] = str(batch)
    path = os.path.join(out_dir, f"{tag}_b{batch}_c{conc}.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    r = {k: float(v) for k, v in row.items() if v not in ("", None) and re.match(r"^-?[0-9.e+]+$", v)}
    r["stability_pct"] = stability
    r["hit_rate"] = (h1 - h0) / (k1 - k0) if k1 > k0 else None
    # keys over the whole perf_analyzer call (its trials and warm-up), a lower bound
    r["keys_per_s"] = (k1 - k0) / secs
    return r


def gap_text(gap, bound):
    """A measured hit rate's distance from the stream's, and whether it is within `bound`."""
    return f"{gap:+.4f} ({'within' if abs(gap) <= bound else 'NOT within'} {bound})"
