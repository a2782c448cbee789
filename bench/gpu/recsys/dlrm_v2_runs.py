"""bench/gpu/dlrm_v2_perf.py's perf_analyzer runs: one run with its server counts, CPU and console
line (its row in runs.json), one-pair queries from several perf_analyzer processes at once, the
runs of each part of the served phase within the budget, and the 270-pair queries through
Triton's C API after the server stopped."""
import os
import re
import shutil
import subprocess
import time

import dlrm_v2_report

from .clock import left_s
from .dlrm_v2_model import QUERY, WIDTH
from .dlrm_v2_results import save_json
from .host_use import cpu_sample, cpu_text, cpu_use, log_size, timing_of_run
from .measure import METRICS_SETTLE_S, device_counts, metrics_text, per_device, scrape
from .perf_analyzer import (CONNECTION_LOST, HTTP_MODES, capi_range, pa_call, pa_command, pa_env, read_row,
                            read_rows)


def server_stats(client, model):
    """Triton's statistics of `model`: inferences, executions, requests, and the ns spent in each step."""
    st = client.stats(model)
    s = st["inference_stats"]
    return {"inferences": int(st.get("inference_count", 0)), "executions": int(st.get("execution_count", 0)),
            "requests": int(s["success"]["count"]),
            **{k: int(s[k]["ns"]) for k in ("queue", "compute_input", "compute_infer", "compute_output")}}


def perf_run(a, client, kind, model, batch, conc, data, pairs_per_query, runs, failures, mode=None, share=None):
    """One perf_analyzer run (--pa-shm's shared memory), printed and appended to `runs` (and
    runs.json); None where it gave no figure. `batch`: -b (270, or 1 for the twin, whose steps
    carry their own rows); `pairs_per_query`: pairs of one request (the twin: its pool's mean);
    `mode`: one of --pa-modes' calls, gRPC sync or async, the gRPC stream, or HTTP async or sync
    (default: the first of --pa-modes); `share`: gRPC calls to a connection (--pa-channel-shares; None: perf_analyzer's
    default). A run that loses its connections is run once more.
    One perf_analyzer process: two at once cannot share a server with shared memory, since each
    unregisters every region of the server when it starts and when it ends."""
    mode = mode or a.pa_mode_list[0]
    raw = os.path.join(a.work, "raw", f"{kind}_c{conc}_{mode}" + ("" if share is None else f"_share{share}") + ".csv")
    os.makedirs(os.path.dirname(raw), exist_ok=True)
    if os.path.exists(raw):
        os.remove(raw)
    cmd = pa_command(a, model, batch, conc, data, raw, mode)
    stats_model = "dlrm_v2_lookup" if kind == "lookup" else "dlrm_v2"

    def counts():
        """The server's counts, the host's CPU and the time, as a run starts."""
        text = metrics_text(a.port)
        return (*scrape(a.port, stats_model, text), device_counts(a.port, stats_model, text),
                server_stats(client, stats_model), cpu_sample(a), time.time())

    time.sleep(METRICS_SETTLE_S)  # the backend publishes its metrics every 250 ms: the last phase's lookups all counted
    log_at = log_size(a)
    k0, h0, d0, s0, c0, t0 = counts()
    env = pa_env(share)
    done = pa_call(a, cmd, env)
    retried = False
    if done.returncode != 0 and CONNECTION_LOST.search(done.stdout + done.stderr) and left_s(a) > 60:
        # perf_analyzer's gRPC connections break at times with hundreds in flight ("Broken pipe",
        # model_analyzer#357): the run once more, its counts taken afresh
        print(f"  ({kind} c={conc} {mode}: perf_analyzer lost connections; the run once more)", flush=True)
        retried = True
        k0, h0, d0, s0, c0, t0 = counts()
        done = pa_call(a, cmd, env)
    stability = 10  # perf_analyzer's default bound (%) on how far its last windows may differ
    # unstable windows: longer ones and a looser bound, twice at most (as recsys/measure.py does)
    for factor, looser in ((2, 25), (4, 50)):
        if done.returncode == 0 or "stable" not in done.stdout + done.stderr or left_s(a) < 60:
            break
        print(f"  ({kind} c={conc}: unstable at -s {stability}; again with {factor * a.interval_ms} ms windows, -s {looser})",
              flush=True)
        retry = list(cmd)
        retry[retry.index("--measurement-interval") + 1] = str(factor * a.interval_ms)
        done = pa_call(a, retry + ["-s", str(looser)], env)
        stability = looser
    seconds = time.time() - t0
    cpu = cpu_use(c0, cpu_sample(a), seconds)
    time.sleep(METRICS_SETTLE_S)  # the backend publishes its metrics every 250 ms
    text = metrics_text(a.port)
    k1, h1 = scrape(a.port, stats_model, text)
    d1 = device_counts(a.port, stats_model, text)
    s1 = server_stats(client, stats_model)
    if done.returncode != 0 or not os.path.exists(raw):
        print(done.stdout[-3000:], done.stderr[-2000:], flush=True)
        failures.append(f"perf_analyzer gave no figure: {kind} concurrency {conc} ({mode} calls)")
        return None
    csv_row = read_row(raw)
    ips = csv_row["Inferences/Second"]
    queries = ips / pairs_per_query if batch > 1 else ips  # one perf_analyzer inference: a pair (-b 270) or a query
    pairs = queries * pairs_per_query
    delta = {k: s1[k] - s0[k] for k in s1}
    r = {"kind": kind, "model": model, "concurrency": conc, "pa_mode": mode, "retried": retried, "channel_share": share,
         "shm": None if a.pa_shm == "cuda" else a.pa_shm,
         "batch": {"mlperf": a.mlperf_sizes, "probe1": 1, "big": a.big_pairs}.get(kind, QUERY),
         "csv": csv_row, "pairs_per_s": pairs, "queries_per_s": queries, "lookups_per_s": pairs * WIDTH,
         **{f"p{q}_ms": csv_row[f"p{q} latency"] / 1e3 for q in (50, 90, 95, 99)},
         "avg_ms": sum(csv_row[k] for k in dlrm_v2_report.PARTS) / 1e3, "stability_pct": stability,
         "hit_rate": (h1 - h0) / (k1 - k0) if k1 > k0 else None, "keys_per_s": (k1 - k0) / seconds,
         "pairs_per_execution": delta["inferences"] / delta["executions"] if delta["executions"] else None,
         "server_ms_per_request": {k: delta[k] / delta["requests"] / 1e6 for k in
                                   ("queue", "compute_input", "compute_infer", "compute_output")} if delta["requests"] else {},
         "seconds": seconds, "pool": os.path.basename(data), "cpu": cpu, "per_device": per_device(d0, d1, pairs)}
    if a.verbose or a.timing:
        r["timing"] = timing_of_run(a, log_at)
    runs.append(r)
    hr = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.4f}"
    pe = "-" if r["pairs_per_execution"] is None else f"{r['pairs_per_execution']:,.0f}"
    print(f"  {kind:<17} c={conc:<3} {mode:<5}" + ("" if share is None else f" {share} a connection")
          + ("" if a.pa_shm == "cuda" else f" {a.pa_shm} shm")
          + f" {pairs / 1e6:7.2f} M pairs/s {queries:9,.0f} queries/s "
          f"{pairs * WIDTH / 1e9:6.2f} "
          f"G lookups/s  p50 {r['p50_ms']:7.2f}  p99 {r['p99_ms']:7.2f} ms  hit rate {hr}  {pe} pairs per execution"
          + ("" if stability == 10 else f"  (-s {stability})") + ("  (run again: connections lost)" if retried else "")
          + f"\n    {cpu_text(cpu)}" + device_text(r), flush=True)
    return r


def probe_clients_run(a, n, conc, data, runs, failures):
    """One-pair queries from `n` perf_analyzer processes at once (`conc` split among them, async
    calls, inputs in the requests' bodies), their queries/s summed: if n clients give about n
    times one's, the client was the limit; if the sum stays, the server is."""
    procs, raws = [], []
    each = max(1, conc // n)
    for i in range(n):
        raw = os.path.join(a.work, "raw", f"probe1_clients{n}_{i}.csv")
        os.makedirs(os.path.dirname(raw), exist_ok=True)
        if os.path.exists(raw):
            os.remove(raw)
        cmd = [a.perf_analyzer, "-m", "dlrm_v2", "-b", "1", "--concurrency-range", f"{each}:{each}", "-i", "grpc",
               "-u", f"localhost:{a.port + 1}", "--async", "--input-data", data,
               "--measurement-interval", str(a.interval_ms), "--max-trials", "6", "-s", "25", "-f", raw]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        raws.append(raw)
    c0, t0 = cpu_sample(a), time.time()
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(30, min(a.pa_timeout_s, left_s(a))))[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate()[0] + "\n(stopped: past --pa-timeout-s)")
    cpu = cpu_use(c0, cpu_sample(a), time.time() - t0)
    rows = [read_row(r) for r in raws if os.path.exists(r)]
    if len(rows) < n or any(p.returncode != 0 for p in procs):
        for o in outs:
            print(o[-1500:], flush=True)
        failures.append(f"perf_analyzer gave no figure: one-pair queries from {n} processes at concurrency {conc}")
        return None
    qps = sum(r["Inferences/Second"] for r in rows)
    r = {"kind": "probe1_clients", "model": "dlrm_v2", "clients": n, "concurrency": each * n, "pa_mode": "async",
         "queries_per_s": qps, "pairs_per_s": qps, "per_client_queries_per_s": [r["Inferences/Second"] for r in rows],
         "p99_ms": max(r["p99 latency"] for r in rows) / 1e3, "cpu": cpu}
    runs.append(r)
    print(f"  one-pair queries, {n} perf_analyzer process(es) x {each} in flight (request bodies): {qps:,.0f} queries/s "
          f"({', '.join(f'{x:,.0f}' for x in r['per_client_queries_per_s'])}); worst p99 {r['p99_ms']:.2f} ms"
          f"\n    {cpu_text(cpu)}", flush=True)
    return r


def device_text(r):
    """A line of pairs/s per GPU where a run used several."""
    per = r.get("per_device") or {}
    if len(per) < 2:
        return ""
    return "\n    per GPU: " + ", ".join(f"{d} {v / 1e6:.2f} M pairs/s" for d, v in per.items())


def perf_phase(a, client, pool, setup, res, failures, part):
    """The perf_analyzer runs of `part`: "fixed270" (a warm-up, then the 270-pair queries: the
    issue's figure, first), or "rest" (MLPerf-like sizes, 270 through the twin, the lookup)."""
    reserve = 0 if a.no_reference else 100  # seconds kept for the reference and the report
    runs = res["perf"]

    def room(what):
        if left_s(a) - reserve < 30:
            print(f"  (skipped: {what}; {left_s(a):.0f} s left of --budget-s {a.budget_s:.0f})", flush=True)
            return False
        return True

    if part == "fixed270":
        # a first run whose figure is not kept: the cache fills, the graphs of the batches the
        # dynamic batcher forms are captured, before any measured window
        if a.concs and room("the warm-up"):
            perf_run(a, client, "fixed270", "dlrm_v2", QUERY, max(a.concs), pool["fixed270"][0], QUERY, [], [])
            print("  (that run warmed the server up; not kept)", flush=True)
        for c in a.concs:
            for mode in a.pa_mode_list:
                for share in [None] if mode in HTTP_MODES else a.channel_shares or [None]:
                    if room(f"270-pair queries at concurrency {c} ({mode} calls)"):
                        perf_run(a, client, "fixed270", "dlrm_v2", QUERY, c, pool["fixed270"][0], QUERY, runs,
                                 failures, mode, share)
                        save_json(a, res)
        return
    for c in a.mlperf_concs:
        for mode in a.pa_mode_list:
            if room(f"MLPerf-like queries at concurrency {c} ({mode} calls)"):
                perf_run(a, client, "mlperf", "dlrm_v2_queries", 1, c, pool["mlperf"][0], setup["mlperf_mean_pairs"],
                         runs, failures, mode)
                save_json(a, res)
    for c in a.lookup_concs:
        if room(f"the lookup alone at concurrency {c}"):
            perf_run(a, client, "lookup", "dlrm_v2_lookup", QUERY, c, pool["lookup"][0], QUERY, runs, failures)
            save_json(a, res)
    for c in a.probe_concs:
        for mode in a.pa_mode_list:
            if room(f"one-pair queries at concurrency {c} ({mode} calls)"):
                perf_run(a, client, "probe1", "dlrm_v2", 1, c, pool["fixed270"][0], 1, runs, failures, mode)
                save_json(a, res)
    for c in a.big_concs:
        for mode in a.pa_mode_list:
            if room(f"requests of {a.big_pairs} pairs at concurrency {c} ({mode} calls)"):
                perf_run(a, client, "big", "dlrm_v2_queries", 1, c, pool["big"][0], a.big_pairs, runs, failures,
                         mode)
                save_json(a, res)
    for n in a.probe_client_counts:
        for c in a.probe_concs[-1:]:
            if room(f"one-pair queries from {n} perf_analyzer processes at concurrency {c}"):
                probe_clients_run(a, n, c, pool["fixed270"][0], runs, failures)
                save_json(a, res)
    if a.mlperf_concs and not a.quick and room("270-pair queries through the twin"):
        # the same 270-pair queries through the twin: what its ensemble hop costs (last: a comparison)
        perf_run(a, client, "fixed270_ensemble", "dlrm_v2_queries", 1, max(a.mlperf_concs),
                 pool["fixed270_ensemble"][0], QUERY, runs, failures)
        save_json(a, res)


SERVER_COUNTS = re.compile(r"Inference count: (\d+)\s+Execution count: (\d+)")


def capi_phase(a, repo, pool, res, failures):
    """270-pair queries through Triton's C API, after the server has stopped: perf_analyzer loads
    libtritonserver.so from --capi-dir/lib and this backend from --capi-dir/backends and serves
    dlrm_v2 from the same repository in its own process. Triton's scheduler, dynamic batcher and
    this backend run as in tritonserver; the gRPC front end is not in the path. The inputs lie in
    --capi-shm: GPU memory as over gRPC (perf_analyzer registers its own device buffers with the
    server in its process), or host memory, which the backend copies up. One perf_analyzer
    process for every concurrency, the lowest first (its first windows fill the caches and
    capture the graphs)."""
    one = os.path.join(a.work, "capi_repo")
    shutil.rmtree(one, ignore_errors=True)
    os.makedirs(one)
    os.symlink(os.path.join(repo, "dlrm_v2"), os.path.join(one, "dlrm_v2"))
    raw = os.path.join(a.work, "raw", "fixed270_capi.csv")
    os.makedirs(os.path.dirname(raw), exist_ok=True)
    if os.path.exists(raw):
        os.remove(raw)
    cmd = [a.perf_analyzer, "-m", "dlrm_v2", "-b", str(QUERY), "--concurrency-range", capi_range(a.capi_concs),
           "--service-kind", "triton_c_api", "--triton-server-directory", a.capi_dir, "--model-repository", one,
           "--input-data", pool["fixed270"][0], "--shared-memory", a.capi_shm, "--output-shared-memory-size",
           str(1 << 20), "--measurement-interval", str(a.interval_ms), "--max-trials", "10", "-f", raw]
    import torch
    from tritonserver_process import capi_env
    env = capi_env(a.capi_dir, a.libtorch_dir or os.path.join(os.path.dirname(torch.__file__), "lib"))
    print("  " + " ".join(cmd), flush=True)
    c0, t0 = cpu_sample(a), time.time()
    # the reference's share of the budget kept, as perf_phase keeps it
    limit = max(60, min(a.pa_timeout_s * len(a.capi_concs) + 120, left_s(a) - (0 if a.no_reference else 100)))
    done = pa_call(a, cmd, env, limit)
    seconds = time.time() - t0
    cpu = cpu_use(c0, cpu_sample(a), seconds)
    with open(os.path.join(a.work, "raw", "fixed270_capi.log"), "w") as f:
        f.write(done.stdout + "\n--- stderr\n" + done.stderr)
    if not os.path.exists(raw):
        print(done.stdout[-3000:], done.stderr[-2000:], flush=True)
        failures.append(f"perf_analyzer (C API) gave no figure: 270-pair queries at {a.capi_concurrency}")
        return
    if done.returncode != 0:
        # its CSV is written once every concurrency is measured: the figures stand, the exit is a failure
        print(done.stderr[-2000:], flush=True)
        failures.append(f"perf_analyzer (C API) exited with {done.returncode} after writing its figures")
    rows = read_rows(raw)
    counts = SERVER_COUNTS.findall(done.stdout)
    for i, row in enumerate(rows):
        pairs = row["Inferences/Second"]  # -b 270: an inference is a pair
        inf, ex = (int(x) for x in counts[i]) if i < len(counts) else (0, 0)
        r = {"kind": "fixed270_capi", "model": "dlrm_v2", "concurrency": int(row["Concurrency"]), "pa_mode": "capi",
             "shm": a.capi_shm,
             "retried": False, "batch": QUERY, "csv": row, "pairs_per_s": pairs, "queries_per_s": pairs / QUERY,
             "lookups_per_s": pairs * WIDTH, **{f"p{q}_ms": row[f"p{q} latency"] / 1e3 for q in (50, 90, 95, 99)},
             "avg_ms": sum(row.get(k, 0.0) for k in dlrm_v2_report.PARTS) / 1e3, "stability_pct": 10,
             "hit_rate": None, "pairs_per_execution": inf / ex if ex else None, "seconds": seconds,
             "pool": os.path.basename(pool["fixed270"][0]), "cpu": cpu, "per_device": {}}
        res["perf"].append(r)
        pe = "-" if r["pairs_per_execution"] is None else f"{r['pairs_per_execution']:,.0f}"
        print(f"  fixed270 C API ({a.capi_shm:<6}) c={r['concurrency']:<3} {pairs / 1e6:7.2f} M pairs/s {r['queries_per_s']:9,.0f} "
              f"queries/s {pairs * WIDTH / 1e9:6.2f} G lookups/s  p50 {r['p50_ms']:7.2f}  p99 {r['p99_ms']:7.2f} ms  "
              f"{pe} pairs per execution", flush=True)
    print(f"    over the whole perf_analyzer process (Triton inside, {seconds:.0f} s with the load): host "
          f"{cpu['host_busy_pct']:.0f}% busy of {cpu['cpus']}, perf_analyzer {cpu['client_cores']:.1f} cores", flush=True)
    save_json(a, res)
