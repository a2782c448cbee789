"""The served phase (steps 3 to 5 of recsys_perf.py): tritonserver on the repository, the
exactness checks before the load (cold and warm cache), perf_analyzer over the sweep for every
alpha, model, path and protocol (each run's console lines and its row in runs.json), the
endless stream where asked, and the exactness checks after the load."""
import json
import os
import time

from tritonserver_process import serve

from .exactness import exactness, exactness_cuda_shm, exactness_problems
from .measure import gap_text, model_stats, per_model, perf
from .stream import stream_check


def serve_and_measure(a, sweep, rows, repo, device, out_dir, setup, plans, pools, ceilings, bare_aoti):
    """Runs the server and everything measured through it; returns the exactness after the load
    ({model: figures}, empty with --no-final-exactness). `setup` gains server_ready_seconds."""
    runs, streams = [], []
    log_path = os.path.join(out_dir, "server.log")
    # Triton's GPU memory pool holds the ensemble's intermediate tensors (the embeddings,
    # 872 MB per request at batch 65536); its 64 MB default sends them through host memory
    extra = [f"--cuda-memory-pool-byte-size=0:{a.cuda_pool_gb << 30}"] if device == "cuda" else []
    if a.verbose:
        extra.append("--log-verbose=1")
    if a.libtorch_dir:
        extra.append(f"--backend-config=rust,libtorch-dir={a.libtorch_dir}")
    t0 = time.time()
    with serve(a.server, repo, a.backends, a.port, log_path, extra=extra, timeout=1800) as client:
        setup["server_ready_seconds"] = time.time() - t0
        print(f"server ready in {setup['server_ready_seconds']:.0f} s", flush=True)
        check_before(client, a, sweep, rows, pools)
        for alpha_i, alpha in enumerate(sweep.alphas):
            plan = sweep.points(alpha_i)
            for m in sweep.models:
                if m == "wide_deep":
                    # its seed: a batch sweep at concurrency 1 (issue 8's figure is batch 131072),
                    # and requests of 2048 rows at growing concurrency; the first alpha only
                    if alpha_i > 0:
                        continue
                    plan_m = sweep.wd_plan
                else:
                    plan_m = plan
                for batch, conc in plan_m:
                    data = pools.data_file(batch, alpha)
                    for path, proto in [(x, y) for x in a.paths.split(",") for y in a.protocols]:
                        r = measure_run(client, a, m, path, proto, alpha, batch, conc, data, out_dir, setup, plans,
                                        pools, ceilings, bare_aoti)
                        if r is None:
                            continue
                        runs.append(r)
                        with open(os.path.join(out_dir, "runs.json"), "w") as f:
                            json.dump(runs, f, indent=1)
                if a.stream_levels and "one" in a.paths.split(","):
                    for batch in sorted({b for b, _ in plan_m}):
                        stream_check(a, m, batch, alpha, rows, plans[alpha], streams, out_dir)
        return check_after(client, a, sweep, rows, pools)


def check_before(client, a, sweep, rows, pools):
    """Served rows and predictions before the load; a wrong answer ends the run."""
    alphas = sweep.alphas
    # cold caches: every key misses and fills; then the same keys again, now hits
    for m in sweep.models:
        for when in ("cold", "warm"):
            e = exactness(client, m, rows, a.dim, pools.requests(a.conc_batch, alphas[0])[:1])
            print(f"  exactness {m} ({when} cache): {e}", flush=True)
            if exactness_problems(e, a.prediction_bound):
                raise SystemExit(f"{m}: " + "; ".join(exactness_problems(e, a.prediction_bound)))
        if a.shared_memory == "cuda":
            # the path the runs below take: keys from CUDA shared memory, read on the GPU
            e = exactness_cuda_shm(client, m, a.dim, pools.requests(a.conc_batch, alphas[0])[1:2])
            print(f"  exactness {m} (keys in CUDA shared memory): {e}", flush=True)
            if e["rows_max_abs_diff"] != 0.0:
                raise SystemExit(f"served rows differ from the fixture's for {m}, keys in CUDA shared memory")


def measure_run(client, a, m, path, proto, alpha, batch, conc, data, out_dir, setup, plans, pools, ceilings, bare_aoti):
    """One perf_analyzer run of <m>_<path> over `proto`, printed; its row of runs.json (None:
    perf_analyzer gave no figure)."""
    model = f"{m}_{path}"
    composing = [f"{m}_sparse", f"{m}_dense"] if path == "ens" else [model]
    st0 = model_stats(client, composing)
    started = time.time()
    tag = f"{m}_{path}_a{alpha}" + ("" if proto == "grpc" else f"_{proto}")
    r = perf(a.perf_analyzer, a.port, model, batch, conc, data, out_dir, tag,
             f"{m}_sparse", a.interval_ms, a.shared_memory, proto)
    if r is None:
        return None
    # wall-clock span, to line the run up with run.sh's vmstat and GPU samples
    r["started"], r["ended"] = started, time.time()
    r["per_model_ms"] = per_model(st0, model_stats(client, composing))
    ceil = ceilings.get(m, {}).get(batch) or ceilings.get(m, {}).get(str(batch))
    best = max(x for x in (ceil or {}).values() if x) if ceil else None
    lru = plans[alpha]["lru"]
    r.update({"model": m, "path": path, "alpha": alpha, "batch": batch, "concurrency": conc,
              "ceiling_ips": best, "pool_requests": pools.size(batch, alpha), "protocol": proto,
              "stationary_hit_rate": setup["stationary_hit_rate"][str(alpha)], "lru_hit_rate": lru,
              "dense": "aoti" if path == "one" and a.dense == "aoti" else "torchscript"})
    aoti_net = (bare_aoti.get(m) or {}).get(batch)
    if path == "one" and aoti_net:
        r["bare_aoti_network"] = aoti_net
    hr = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.3f}"
    ratio = f"{r['Inferences/Second'] / best:.2f}" if best else "-"
    print(f"  {model:<10} a={alpha:<4} b={batch:<6} c={conc:<2} {r['Inferences/Second'] / 1e6:7.2f} M inf/s  "
          f"p99 {r['p99 latency'] / 1e3:8.2f} ms  hit rate {hr}  {r['keys_per_s'] / 1e6:7.1f} M keys/s  "
          f"served/ceiling {ratio}" + ("" if proto == "grpc" else f"  over {proto}"), flush=True)
    print("      per execution (ms): " + "; ".join(
        f"{k}: " + ", ".join(f"{x} {v:.2f}" for x, v in d.items()) for k, d in r["per_model_ms"].items())
        + (f"; the package's network alone (aoti_bare): {aoti_net['plain_p50_ms']:.2f} ms, "
           f"CUDA graph {aoti_net['graph_p50_ms'] or float('nan'):.2f} ms" if r.get("bare_aoti_network") else ""),
        flush=True)
    if r["hit_rate"] is not None:
        gap = r["hit_rate"] - lru
        print(f"      hit rate {r['hit_rate']:.4f} measured over a pool of {r['pool_requests']} requests; "
              f"the endless stream's: {lru:.4f} through this LRU cache, "
              f"{r['stationary_hit_rate']:.4f} holding the hottest keys; measured - stream "
              f"{gap_text(gap, a.hit_rate_bound)}", flush=True)
    return r


def check_after(client, a, sweep, rows, pools):
    """Served rows and predictions after the load: {model: figures} (empty with --no-final-exactness)."""
    exact = {}
    alphas = sweep.alphas
    for m in sweep.models if not a.no_final_exactness else []:
        # distinct requests of one size, one more than the single model's instances: some
        # instance serves two, the second with its CUDA graph for that size captured, so on
        # a GPU its lookup writes straight into the graph's input (run_in_graph_input)
        n = max(4, a.one_instances + 1)
        exact[m] = exactness(client, m, rows, a.dim, pools.requests(a.conc_batch, alphas[-1])[:n])
        print(f"  exactness {m}: {exact[m]}", flush=True)
        # one request of the largest batch (capped at 65536 rows: 872 MB of rows back
        # through gRPC): its keys go up in pieces on several threads (BatchLookup::run)
        big = min(65536, sweep.largest_batch(m))
        e = exactness(client, m, rows, a.dim, pools.requests(big, alphas[0])[:1], batch=big)
        exact[m]["largest_batch"] = dict(e, batch=big)
        print(f"  exactness {m} (one request of {big} rows): {e}", flush=True)
        if a.shared_memory == "cuda":
            e = exactness_cuda_shm(client, m, a.dim, pools.requests(big, alphas[0])[:1], batch=big)
            exact[m]["cuda_shm"] = dict(e, batch=big)
            print(f"  exactness {m} (one request of {big} rows, keys in CUDA shared memory): {e}", flush=True)
    return exact
