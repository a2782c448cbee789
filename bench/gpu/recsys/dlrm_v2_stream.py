"""bench/gpu/dlrm_v2_perf.py's endless stream: queries of --stream-pairs pairs from one key pool in
GPU memory (drawn there under the Zipf law), sent by examples/stream_client.rs at each level of
--stream-concurrency, the pool as large as the cache's LRU hit rate needs (or drawn again before
every pass with --stream-fresh); each level's row in runs.json."""
import json
import math
import subprocess
import time

import numpy as np

from .clock import left_s
from .dlrm_v2_model import HOT, QUERY, START, WIDTH
from .dlrm_v2_plan import expected_pool_rate
from .dlrm_v2_results import save_json
from .dlrm_v2_runs import device_text
from .fixture import SEED
from .gpu_busy import GpuBusy
from .host_use import cpu_sample, cpu_text, cpu_use_spans, log_size, timing_of_run
from .measure import METRICS_SETTLE_S, device_counts, metrics_text, per_device, scrape


def stream_room_s(a):
    """Seconds a level of the endless stream needs: with every row in HBM its pool is small
    (2,048 queries) and a level takes seconds; below, the pool the LRU rate needs takes minutes."""
    return 30 if a.cache >= 1.0 else 120


def stream_phase(a, client, rows, plan, res, failures):
    """Queries of --stream-pairs pairs (270) from one pool in GPU memory (drawn there, the same Zipf law), sent by
    examples/stream_client.rs over HTTP to dlrm_v2: --stream-warm-passes passes warm the cache,
    then at least --stream-seconds (and one pass) per level of --stream-concurrency. With
    --stream-fresh the pool is drawn again before every pass: no query repeats, and the
    expected rate is the policy's on an endless stream (LRU's, or LFU's the stationary rate)."""
    import torch
    import stream_load
    from cuda_shm import Region
    q = a.stream_pairs
    qbytes, dbytes, obytes = q * WIDTH * 8, q * 13 * 4, q * 4
    if a.cache < 1.0:
        want = max(1, math.ceil(plan["need_pairs"] / q))
    else:
        want = 2048  # every row in HBM: no hit rate to reach, a pool of distinct queries is enough
    free = torch.cuda.mem_get_info()[0]
    cap = int(min(a.stream_gb * 1e9, free - (6 << 30)) // qbytes)
    n = max(16, min(want, cap))
    if a.cache >= 1.0:
        expected = 1.0
    elif a.stream_fresh:
        # pinned caches hold what a stationary LFU held
        expected = plan["stationary"] if a.cache_policy in ("lfu", "pinned") else plan["lru"]
    else:
        expected = expected_pool_rate(plan, n * q)
    print(f"  pool: {n:,} queries of {q} pairs ({n * qbytes / 1e9:.1f} GB of keys in GPU memory; the LRU rate needs "
          f"{want:,}); expected measured hit rate {expected:.4f}, the endless stream's LRU rate {plan['lru']:.4f}, "
          f"stationary {plan['stationary']:.4f}", flush=True)
    made = []
    try:
        keys = Region(client, "dlrm_v2_stream_keys", n * qbytes)
        made.append(keys)
        dense = Region(client, "dlrm_v2_stream_dense", 16 * dbytes)
        made.append(dense)
        for i in range(max(a.stream_levels)):
            made.append(Region(client, f"dlrm_v2_stream_out_{i}", obytes))
        gen = torch.Generator(device="cuda").manual_seed(SEED + 46)

        def draw():
            step = max(1, 512 * QUERY // q)  # about 1 GB of keys drawn at a time
            for first in range(0, n, step):
                m = min(step, n - first)
                k = torch.empty((m, q, WIDTH), dtype=torch.int64, device="cuda")
                for t, (r, h) in enumerate(zip(rows, HOT)):
                    ranks = stream_load.torch_zipf_ranks(gen, r, a.alpha, m * q * h, "cuda")
                    k[:, :, START[t]:START[t] + h] = stream_load.torch_spread(ranks, r).view(m, q, h)
                keys.write_tensor(k, first * qbytes)
                del k
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

        t0 = time.time()
        draw()
        dense.write(np.random.default_rng(5).random((16, q, 13), dtype=np.float32))
        print(f"  pool drawn in {time.time() - t0:.0f} s" + ("; drawn again before every pass (--stream-fresh)"
                                                            if a.stream_fresh else ""), flush=True)
        at = 0

        spans = []  # the CPU samples around each send of the measured passes
        sent = []  # and each send's start and end (time.time())

        def send(count, conc):
            nonlocal at
            c0, t_send = cpu_sample(a), time.time()
            cmd = [a.stream_client, "--url", f"localhost:{a.port}", "--model", "dlrm_v2", "--start", str(at),
                   "--count", str(count), "--concurrency", str(conc),
                   "--input", f"sparse,INT64,{q}x{WIDTH},{keys.name},{qbytes},{n}",
                   "--input", f"dense,FP32,{q}x13,{dense.name},{dbytes},16",
                   "--output", f"prediction,dlrm_v2_stream_out_,{obytes}"]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(60, int(left_s(a))))
            if p.returncode != 0:
                raise RuntimeError(f"stream_client failed: {p.stderr.strip()[-2000:]}")
            at += count
            spans.append((c0, cpu_sample(a)))
            sent.append((t_send, time.time()))
            out = json.loads(p.stdout)
            return out["seconds"], sorted(out["latencies_ms"])

        def passes(count, conc):
            """`count` queries; with --stream-fresh a pass of the pool at a time, each of new keys
            (the draw between passes is not timed): (seconds, sorted latencies)."""
            if not a.stream_fresh:
                return send(count, conc)
            seconds, lat, left = 0.0, [], count
            while left > 0:
                draw()
                s_, l_ = send(min(n, left), conc)
                seconds, lat, left = seconds + s_, lat + l_, left - min(n, left)
            return seconds, sorted(lat)

        for w in range(max(1, a.stream_warm_passes)):
            if w > 0 and a.stream_fresh:
                draw()
            warm_s, _ = send(n, max(a.stream_levels))
            rate = n * q / warm_s
            print(f"  warm pass {w + 1}: {n:,} queries in {warm_s:.1f} s ({rate / 1e6:.2f} M pairs/s, the cache filling)",
                  flush=True)
        for c in a.stream_levels:
            if left_s(a) < stream_room_s(a):
                print(f"  (skipped: the stream at concurrency {c}; {left_s(a):.0f} s left)", flush=True)
                continue
            count = max(n, math.ceil(rate * a.stream_seconds / q))
            if a.stream_fresh:
                count = math.ceil(count / n) * n  # whole passes, each of new keys
            time.sleep(METRICS_SETTLE_S)  # the metrics published after the warm passes' last lookups
            text = metrics_text(a.port)
            k0, h0 = scrape(a.port, "dlrm_v2", text)
            d0 = device_counts(a.port, "dlrm_v2", text)
            log_at = log_size(a)
            busy = GpuBusy(int((a.gpus or "0").split(",")[0]))
            spans.clear()
            sent.clear()
            seconds, lat = passes(count, c)
            gpu_busy = busy.stop(sent)  # the sends only, not the key draws (on the GPU) between
            cpu = cpu_use_spans(spans, seconds)  # the passes' sends only, not the key draws between
            time.sleep(METRICS_SETTLE_S)
            text = metrics_text(a.port)
            k1, h1 = scrape(a.port, "dlrm_v2", text)
            d1 = device_counts(a.port, "dlrm_v2", text)
            rate = count * q / seconds
            r = {"kind": "stream", "model": "dlrm_v2", "batch": q, "concurrency": c, "pairs_per_s": rate,
                 "queries_per_s": count / seconds, "lookups_per_s": rate * WIDTH,
                 **{f"p{pc}_ms": stream_load.percentile(lat, pc) for pc in (50, 90, 95, 99)},
                 "hit_rate": (h1 - h0) / (k1 - k0) if k1 > k0 else None, "expected_hit_rate": expected,
                 "pool_queries": n, "pool_gb": n * qbytes / 1e9, "queries": count, "seconds": seconds, "cpu": cpu,
                 "gpu_busy_pct": gpu_busy,
                 "per_device": per_device(d0, d1, rate)}
            if a.verbose or a.timing:
                r["timing"] = timing_of_run(a, log_at)
            res["stream"].append(r)
            hr = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.4f}"
            print(f"  stream            c={c:<3} {rate / 1e6:7.2f} M pairs/s {r['queries_per_s']:9,.0f} queries/s "
                  f"{r['lookups_per_s'] / 1e9:6.2f} G lookups/s  p50 {r['p50_ms']:7.2f}  p99 {r['p99_ms']:7.2f} ms  "
                  f"hit rate {hr} (expected {expected:.4f})\n    {cpu_text(cpu)}"
                  + ("" if gpu_busy is None else f"; GPU busy {gpu_busy:.0f}% (nvidia-smi)") + device_text(r), flush=True)
            save_json(a, res)
    except Exception as e:  # noqa: BLE001 - the stream is one figure among several: said, counted, the run goes on
        print(f"  the endless stream failed: {e}", flush=True)
        failures.append(f"the endless stream: {str(e)[:300]}")
    finally:
        for region in reversed(made):
            try:
                region.__exit__(None, None, None)
            except Exception:  # noqa: BLE001
                pass
        torch.cuda.empty_cache()
