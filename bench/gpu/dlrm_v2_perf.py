#!/usr/bin/env python3
"""MLPerf Inference's DLRM-v2 served through the real tritonserver, against the bare PyTorch
reference measured in the same call (issue 46's benchmark). Needs an NVIDIA GPU; run through
`bash bench/gpu/run.sh dlrm-v2` (carry .carry and .carry_pa), one device call at scale 1.0.

1. Tables: MLPerf DLRM-v2's 26 tables at --scale (1.0: 204 M rows, 52 GB fp16), written by
   criteo_fixture into /dev/shm unless already there (recsys/fixture.py), on a thread of its own
   while 2. runs.
2. The network: DCNv2's dense part (DLRM-v2's network) exported as a CUDA fp16 AOTInductor package
   (recsys/networks.py, the pooled rows read as fp16); meanwhile a child process compiles the
   reference's network (torch.compile at --ref-batches, --ref-compile-mode) to fill Inductor's
   on-disk caches, killed past --ref-compile-budget-s (then the default mode).
3. The repository: `dlrm_v2`, one recommender model (examples/dlrm_v2.py's config, --instances
   KIND_GPU instances, dynamic batching, GPU cache share --cache with fp16 rows, CUDA graphs);
   `dlrm_v2_lookup`, the embedding engine alone on the same store (pooled, fp16 [26, 128] out);
   `dlrm_v2_queries`, a non-batching ensemble in front of `dlrm_v2` whose requests carry their own
   number of pairs (how perf_analyzer sends queries of varying size; dlrm_v2 still batches them).
4. Exactness before timing: pooled rows of dlrm_v2_lookup against float64 sums of the fixture's
   rows, dlrm_v2's predictions against the PyTorch fp32 network on those sums.
5. perf_analyzer (gRPC, CUDA shared memory): queries of 270 pairs (-b 270 on dlrm_v2) over
   --concurrency; MLPerf-like query sizes (--mlperf-sizes, through dlrm_v2_queries) over
   --mlperf-concurrency; the lookup alone (-b 270 on dlrm_v2_lookup) over --lookup-concurrency;
   requests of --big-pairs pairs (MLPerf's Offline shape, through dlrm_v2_queries) over
   --big-concurrency; the cache's hit rate from the server's metrics. After the 270-pair runs,
   an endless stream of queries of --stream-pairs pairs (270; examples/stream_client.rs, keys in
   one CUDA pool) at --stream-concurrency, its pool as large as the cache's LRU hit rate needs
   (recsys/cache.py).
6. The bare PyTorch reference after the server stopped: fp16 tables in HBM, F.embedding_bag per
   table, the compiled network, timed with CUDA events: lookup alone, network alone, both.
7. Ratios and the issue's targets printed as PASS/MISS; the results folder (README.md, plots,
   setup.json, runs.json, perf.tgz) written by bench/gpu/dlrm_v2_report.py.

Exits non-zero when an exactness check failed or a run gave no figure (after writing results);
a target MISS is reported, not an error.
"""
# This file is the command and the order of its steps; what each step does lives in
# bench/gpu/recsys/, one concern a module (dlrm_v2_*.py, perf_analyzer.py, host_use.py, clock.py;
# its __init__.py lists them).
import os
import shutil
import sys
import threading
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from recsys import dlrm_v2_options  # noqa: E402
from recsys.clock import left_s, phase  # noqa: E402
from recsys.dlrm_v2_model import DIM, ROW_BYTES, WIDTH, calibration  # noqa: E402
from recsys.dlrm_v2_plan import cache_plan, pools  # noqa: E402
from recsys.dlrm_v2_reference import (compile_network, finish_compile_warmer, reference_phase,  # noqa: E402
                                      start_compile_warmer)
from recsys.dlrm_v2_repository import graph_batches, write_repository  # noqa: E402
from recsys.dlrm_v2_results import clear_results, finish, gpu_facts, save_json  # noqa: E402
from recsys.dlrm_v2_runs import capi_phase  # noqa: E402
from recsys.dlrm_v2_served import serve_and_measure  # noqa: E402
from recsys.fixture import fixture_rows, prepare  # noqa: E402

# Names other files import from here, where they lived before the steps moved to recsys/:
# tests/tools/test_dlrm_v2_perf_args.py (perf_analyzer's calls) and dlrm_v2_network.py
# (cuda_seconds). draw_pairs (the exactness check's pairs) stays because dlrm_v2_fair.py's help
# names it dlrm_v2_perf.draw_pairs; that script's code imports it from recsys/dlrm_v2_plan.py.
from recsys.dlrm_v2_plan import draw_pairs  # noqa: E402,F401
from recsys.dlrm_v2_reference import cuda_seconds  # noqa: E402,F401
from recsys.perf_analyzer import CONNECTION_LOST, capi_range, pa_call, pa_command, pa_env  # noqa: E402,F401


def parse(argv=None):
    """The command's arguments (recsys/dlrm_v2_options.py), its help this file's docstring."""
    return dlrm_v2_options.parse(__doc__, argv)


def describe_run(a):
    """setup.json's record of the run (the GPU, the tables, the cache's plan, the settings), and its
    first lines printed: (setup, rows per table, the CUDA graphs' batches, the cache's plan)."""
    import torch
    gpu, driver = gpu_facts()
    rows = fixture_rows(a.scale)
    params = sum(rows) * DIM
    graphs = graph_batches(a.graph_batches, a.max_batch)
    plan = cache_plan(rows, a.cache, a.allocation, a.alpha, a.hit_rate_bound)
    setup = {"command": a.command, "argv": sys.argv, "gpu": gpu, "driver": driver, "torch": torch.__version__,
             "pa_modes": a.pa_mode_list, "pa_threads": a.pa_threads,
             "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "scale": a.scale, "rows": sum(rows),
             "rows_per_table": rows, "parameters": params, "table_gb": sum(rows) * ROW_BYTES / 1e9, "cache": a.cache,
             "allocation": a.allocation, "cached_rows": sum(plan["cached_per_table"]), "cache_plan": plan,
             "cache_policy": a.cache_policy, "cache_key_index": a.cache_key_index, "cache_hit_stamp_every": a.cache_hit_stamp_every, "miss_reads": a.miss_reads, "host_memory": a.host_memory, "stream_fresh": a.stream_fresh, "stream_warm_passes": a.stream_warm_passes,
             "instances": a.instances, "gpus": a.gpus, "server_args": a.server_arg, "placement": a.placement, "replicate_share": a.replicate_share, "sharded_memory_gb": a.sharded_memory_gb, "cache_rows": a.cache_rows, "max_queue_delay_us": a.max_queue_delay_us, "max_batch": a.max_batch,
             "graph_batches": ("the backend's powers of two" if graphs is None else
                               ",".join(map(str, graphs)) if graphs else "none (off)"),
             "dcnv2_cross": a.dcnv2_cross, "network_precision": a.network_precision, "alpha": a.alpha, "interval_ms": a.interval_ms, "quick": a.quick,
             "stream_note": "not run"}
    print(f"GPU: {gpu}, driver {driver}; torch {torch.__version__}", flush=True)
    print(f"DLRM-v2 at scale {a.scale}: {sum(rows):,} rows ({params / 1e9:.1f} B parameters, "
          f"{setup['table_gb']:.1f} GB fp16), {WIDTH} lookups per pair; GPU cache {a.cache} ({a.allocation}, {a.cache_policy}, misses read by the {a.miss_reads}, "
          f"{setup['cached_rows']:,} slots); alpha {a.alpha}: hit rate stationary {plan['stationary']:.4f}, "
          f"LRU on an endless stream {plan['lru']:.4f} (hotness-weighted)", flush=True)
    return setup, rows, graphs, plan


def tables_and_network(a, rows, setup):
    """Steps 1 and 2: the tables written by criteo_fixture on a thread of their own (the export
    and the compile need none), the network exported as the package, the key pools drawn, and
    the reference's compile warming Inductor's caches in a child process meanwhile. Returns (the
    tables' folder, the package, the pools, the reference's compile: (mode, note, seconds) or
    None with --no-reference)."""
    # 1. the tables, on a thread of their own: the export and the compile need none
    fa = SimpleNamespace(fixture=a.fixture, scale=a.scale, dim=DIM, work=a.work, fixture_bin=a.fixture_bin,
                         cache_share=a.cache, host_memory=a.host_memory)
    fixture = {}

    def write_tables():
        try:
            fixture["folder"], fixture["t0"] = prepare(fa, rows)
            fixture["seconds"] = time.time() - fixture["t0"]
        except BaseException as e:  # noqa: BLE001 - raised again on the main thread
            fixture["error"] = e

    writer = threading.Thread(target=write_tables, name="fixture")
    writer.start()
    warmer = None if a.no_reference else start_compile_warmer(a)

    # 2. the network: the package, and the reference's compile
    from recsys.networks import export_aoti
    ea = SimpleNamespace(precision=a.network_precision, aoti_dlrm_interaction="triton", dcnv2_cross=a.dcnv2_cross,
                         example_batch=0, work=a.work, inductor=a.inductor, cross_config="", dim=DIM,
                         calibration=calibration(a))
    t0 = time.time()
    package = export_aoti("dcnv2", ea, "TYPE_FP16", a.max_batch)
    setup["export_seconds"] = time.time() - t0
    pool = pools(a, rows, setup)
    print("  pools: " + "; ".join(setup["pools"].values()), flush=True)
    if warmer is not None:
        mode, note = finish_compile_warmer(a, warmer)
        warm_s = time.time() - warmer[1]
    writer.join()
    if "error" in fixture:
        raise fixture["error"]
    setup["fixture"], setup["fixture_seconds"] = fixture["folder"], fixture["seconds"]
    a.host_memory = setup["host_memory"] = fa.host_memory  # huge_pages falls back where it would not fit
    print(f"  tables in {fixture['folder']} ({fixture['seconds']:.0f} s, written or found)", flush=True)
    return fixture["folder"], package, pool, None if warmer is None else (mode, note, warm_s)


def main():
    a = parse()
    clear_results(a.results)
    os.makedirs(a.work, exist_ok=True)
    shutil.rmtree(os.path.join(a.work, "raw"), ignore_errors=True)
    setup, rows, graphs, plan = describe_run(a)
    failures = []
    res = {"perf": [], "stream": [], "reference": None, "exactness": None}

    # 1.-2. the tables, beside them the package's export and the reference's compile
    phase("tables (criteo_fixture), the export and the reference's compile beside it")
    fixture, package, pool, compiled = tables_and_network(a, rows, setup)

    # 3. the repository
    repo = os.path.join(a.work, "repo")
    write_repository(a, repo, fixture, package, graphs)
    save_json(a, res, setup)

    # 4.-5. the server: exactness, then the timed runs
    log_path = serve_and_measure(a, repo, rows, plan, pool, setup, res, failures)
    # the server has stopped: HBM is the C API runs', then the reference's
    if a.capi_concs and os.path.isdir(os.path.join(a.work, "repo", "dlrm_v2")):
        phase("perf_analyzer through Triton's C API (no gRPC front end)")
        if left_s(a) - (0 if a.no_reference else 100) > 60:
            capi_phase(a, repo, pool, res, failures)
        else:
            print(f"  (skipped: {left_s(a):.0f} s left of --budget-s {a.budget_s:.0f})", flush=True)

    # 6. the bare PyTorch reference
    if compiled is not None:
        phase("the bare PyTorch reference (the server stopped)")
        try:
            res["reference"] = reference_phase(a, rows, *compiled)
        except Exception as e:  # noqa: BLE001 - the served figures are kept; the failure is said and counted
            print(f"  the reference failed: {e}", flush=True)
            failures.append(f"the bare PyTorch reference: {str(e)[:300]}")

    # 7. ratios, targets, the results folder
    return finish(a, setup, res, failures, log_path)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--compile-worker"]:  # start_compile_warmer's child: MODE BATCHES
        compile_network(sys.argv[2], [int(b) for b in sys.argv[3].split(",")], "compile child")
        sys.exit(0)
    sys.exit(main())
