"""The single model under an endless stream of requests (stream_load.py, our client), beside
perf_analyzer's rows: the pool as large as the stream's hit rate needs."""
import json
import math
import os

from .fixture import SEED, TABLES
from .measure import device_counts, gap_text, scrape


def stream_check(a, m, batch, alpha, rows, plan, streams, out_dir):
    """The one model under an endless stream (stream_load.py, our client): a pool of distinct
    requests holding the lookups per table the stream's hit rate needs (pool_plan), drawn into
    GPU memory, at --stream-concurrency; printed beside perf_analyzer's rows, kept in streams.json."""
    import stream_load
    from kserve_client import Client
    need = max(1, math.ceil(plan["needed_lookups"] / batch))
    cap = max(1, int(a.stream_gb * 1e9 // (batch * TABLES * 8)))
    requests = min(max(need, a.stream_min_requests), cap)
    lru = plan["lru"]
    client_bin = a.stream_client if a.stream_client and os.path.exists(a.stream_client) else None
    results = stream_load.run(lambda: Client(f"localhost:{a.port}"), lambda: scrape(a.port, f"{m}_sparse"), f"{m}_one",
                              rows, batch, requests, alpha, SEED + 17, a.stream_levels, a.stream_passes,
                              gpu=a.kind == "KIND_GPU", client_bin=client_bin, url=f"localhost:{a.port}",
                              devices=lambda: device_counts(a.port, f"{m}_one"))
    for r in results:
        r.update({"model": m, "batch": batch, "alpha": alpha, "lru_hit_rate": lru, "pool_needed_requests": need})
        streams.append(r)
        with open(os.path.join(out_dir, "streams.json"), "w") as f:
            json.dump(streams, f, indent=1)
        gap = None if r["hit_rate"] is None else r["hit_rate"] - lru
        verdict = "-" if gap is None else gap_text(gap, a.hit_rate_bound)
        print(f"  {m + '_one':<10} a={alpha:<4} b={batch:<6} c={r['concurrency']:<2} {r['inferences_per_s'] / 1e6:7.2f} M inf/s  "
              f"p99 {r['p99_ms']:8.2f} ms  hit rate {r['hit_rate'] if r['hit_rate'] is None else round(r['hit_rate'], 4)}  "
              f"endless stream (stream_load.py, HTTP, {r['client']}; not perf_analyzer)", flush=True)
        if len(r["per_device"]) > 1:
            print("      per device: " + ", ".join(f"{d} {v / 1e6:.2f} M inf/s" for d, v in r["per_device"].items()), flush=True)
        print(f"      p50 {r['p50_ms']:.2f} ms, p90 {r['p90_ms']:.2f}, p95 {r['p95_ms']:.2f}; a pool of {requests} distinct requests "
              f"({r['pool_lookups_per_table']:,} lookups per table, {r['pool_gb']:.1f} GB of keys in {'GPU' if a.kind == 'KIND_GPU' else 'shared'} memory; the stream's rate "
              f"needs {need}), one pass to warm, {a.stream_passes} measured; the endless stream's LRU rate {lru:.4f}: "
              f"measured - stream {verdict}", flush=True)
