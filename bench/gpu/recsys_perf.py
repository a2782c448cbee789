#!/usr/bin/env python3
"""Recommenders at Criteo scale through the real tritonserver (issue 8).

One run gives every figure of the issue for DLRM and DCNv2 (and Wide&Deep, `--models
wide_deep --dim 65`: its batch sweep at --wide-deep-batches, default 131072 alone, and requests
of --wide-deep-conc-batch rows over --concurrency):

1. the Criteo-scale store: the 26 Criteo-1TB tables scaled by --scale (0.8: 163 M rows,
   20.9 B parameters, fp16, 43 GB), written by `criteo_fixture` (carried, built by
   bench/gpu/pack.sh) unless already there, with its progress;
2. the bare ceiling: the same dense network (TorchScript, fp16) in torch with every table in
   HBM (one fp16 tensor of all rows, one gather), eager and CUDA-graphed, keys already on the
   GPU; then the tables are freed before the server starts;
3. the served paths, both on KIND_GPU instances and both non-batching (max_batch_size 0, a
   whole request per perf_analyzer step; see bench/gpu/zipf_keys.py): `<m>_ens`, Triton's
   ensemble of the embedding model (`<m>_sparse`, GPU cache of --cache-share of each table's
   rows) and the TorchScript dense model (`<m>_dense`), as HPS users deploy it; and `<m>_one`,
   the recommender engine (lookup and network in one backend model, rows read by the network
   in place on the GPU);
   With `--dense aoti` the single model's network is a CUDA AOTInductor package of the same
   network (`dense.pt2`, exported in this run by examples/aoti_export.py), measured alone by
   aoti_bare (`--aoti-bare`); the ensemble keeps the TorchScript network;
4. perf_analyzer (gRPC, system shared memory; `--shared-memory cuda` puts the inputs on the GPU) at batch --batches, concurrency 1, and at
   --conc-batch over --concurrency, for every Zipf exponent of --alphas, the keys of a pool of
   --requests distinct requests (bench/gpu/zipf_keys.py, hot keys spread over each table);
   the cache's hit rate and keys/s for each run from the server's own metrics (`/metrics`),
   against the hit rate of an endless stream through this LRU cache. perf_analyzer cycles the
   pool, and a pool smaller than the cache's reach fits in it whole (every lookup hits after the
   first pass): `--requests auto` sizes each pool to twice the largest LRU characteristic time
   (pool_plan), at most --pool-gb, and says how large it is and the rate it expects;
5. the exactness check: rows the embedding model served under this load against the rows the
   fixture defines (recomputed here from the seed), max abs diff must be 0; and the single
   model's predictions against the ensemble's, at most --prediction-bound apart. After the runs
   it sends one more distinct request than the single model has instances, so that on a GPU
   some instance answers one from the lookup written straight into its CUDA graph's input.

Writes $OUT/recsys/: one CSV per run in perf_analyzer's columns with Inferences/Second
multiplied by the batch (perf_analyzer counts requests of one step), `runs.json` (every run's
row, hit rate, keys/s), `ceiling.json`, `exact.json`, `setup.json`; bench/gpu/recsys_report.py
turns it into the tables and plots of docs/perf/.

    python3 bench/gpu/recsys_perf.py --server .../tritonserver --backends /tmp/rust_backends \\
        --perf-analyzer /tmp/pa/perf_analyzer/bin/perf_analyzer --fixture-bin .carry/criteo_fixture
"""
# This file is the command and the order of its steps; what each step does lives in
# bench/gpu/recsys/, one concern a module (its __init__.py lists them).
import json
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from recsys import options, runs  # noqa: E402
from recsys.bare import aoti_bare_figures, ceiling  # noqa: E402
from recsys.cache import cache_rows, pool_plan, stationary_hit_rate  # noqa: E402
from recsys.exactness import exactness_problems  # noqa: E402
from recsys.fixture import TABLES, fixture_rows, prepare as prepare_fixture  # noqa: E402
from recsys.networks import dense_module, export_aoti  # noqa: E402
from recsys.plan import KeyPools, Sweep  # noqa: E402
from recsys.repository import write_models  # noqa: E402


def store_setup(a, rows, fixture, alphas, t0):
    """setup.json's record of the store and its cache, printed; and each alpha's pool_plan."""
    params = sum(rows) * a.dim
    setup = {"tables": TABLES, "rows": sum(rows), "rows_per_table": rows, "dim": a.dim, "parameters": params,
             "table_gb_fp16": sum(rows) * a.dim * 2 / 1e9, "cache_share": a.cache_share,
             "allocation": a.allocation, "cached_rows_per_table": cache_rows(rows, a.cache_share, a.allocation),
             "cached_rows": sum(cache_rows(rows, a.cache_share, a.allocation)), "fixture": fixture,
             "graphs": a.graphs, "graph_rows": a.graph_rows, "host_memory": a.host_memory,
             "dlrm_interaction": a.dlrm_interaction, "one_instances": a.one_instances, "cache_sharing": a.cache_sharing,
             "cache_rows": a.cache_rows,
             "aoti_dlrm_interaction": a.aoti_dlrm_interaction, "dcnv2_cross": a.dcnv2_cross,
             "stationary_hit_rate": {str(x): stationary_hit_rate(rows, cache_rows(rows, a.cache_share, a.allocation), x) for x in alphas},
             "fixture_seconds": time.time() - t0, "precision": a.precision, "requests_per_pool": a.requests,
             "dense": a.dense}
    print(f"store: {TABLES} tables, {sum(rows):,} rows, {params / 1e9:.1f} B parameters, dim {a.dim}, "
          f"{setup['table_gb_fp16']:.1f} GB fp16 in {fixture}; GPU cache {setup['cached_rows']:,} rows "
          f"({setup['cached_rows'] / sum(rows):.1%}, {a.allocation}): {setup['cached_rows_per_table']}", flush=True)
    # aoti_report.py reads this line: without it (runs before gpucache_sharing) each instance had its own
    print(f"GPU caches: {'one per GPU, shared by the single model' if a.cache_sharing == 'device' else 'one per instance of the single model'}"
          f"'s {a.one_instances} instance(s), rows kept as {a.cache_rows}", flush=True)
    cached = cache_rows(rows, a.cache_share, a.allocation)
    plans = {x: pool_plan(rows, cached, x, 1, a.hit_rate_bound) for x in alphas}
    setup["lru_hit_rate"] = {str(x): plans[x]["lru"] for x in alphas}
    setup["pool_needed_lookups_per_table"] = {str(x): plans[x]["needed_lookups"] for x in alphas}
    for x, h in setup["stationary_hit_rate"].items():
        print(f"  stationary hit rate at alpha {x} (an endless stream, this cache holding the hottest keys): {h:.4f}; "
              f"the same stream through this LRU cache (Che's approximation): {plans[float(x)]['lru']:.4f}", flush=True)
    return setup, plans


def prepare_models(a, sweep, rows, fixture, repo, rows_type, device, setup, pools):
    """Each model's network saved (and exported), its four models written into `repo`, and the
    figures without the server: ({model: ceiling}, {model: aoti_bare's figures})."""
    ceilings, bare_aoti = {}, {}
    for m in sweep.models:
        mod = dense_module(m, a.precision, device, a.dlrm_interaction)
        pt = os.path.join(a.work, f"{m}_dense.pt")
        mod.save(pt)
        all_batches = sweep.model_batches(m)
        pt2 = export_aoti(m, a, rows_type, max(all_batches)) if a.dense == "aoti" else None
        write_models(repo, m, pt, fixture, a.dim, a.cache_share, a.kind, a.allocation, a.graphs, a.host_memory,
                     [int(r) for r in a.graph_rows.split(",") if r], a.one_instances, rows_type, a.pipeline_parts,
                     tuple(int(x) for x in a.key_upload.split(",")) if a.key_upload else None,
                     [tuple(kv.split("=", 1)) for kv in a.torch_param], one_pt2=pt2,
                     hit_rate_threshold=a.hit_rate_threshold, cache_sharing=a.cache_sharing,
                     cache_rows_type=a.cache_rows, gpus=a.gpus)
        if device == "cuda" and not a.no_ceiling:
            print(f"ceiling: {m} bare in torch, every table in HBM ({setup['table_gb_fp16']:.1f} GB fp16; "
                  "the TorchScript network)", flush=True)
            # a few requests of each pool: the ceiling cycles them
            ceilings[m] = ceiling(m, mod, rows, a.dim, all_batches, lambda b: pools.requests(b, sweep.alphas[0])[:16])
        if pt2 and a.aoti_bare:
            bare_aoti[m] = aoti_bare_figures(a.aoti_bare, pt2, all_batches)
        del mod
    return ceilings, bare_aoti


def main():
    a = options.parse(__doc__)
    out_dir = os.path.join(os.environ.get("OUT", "/tmp/out"), "recsys")
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    rows = fixture_rows(a.scale)
    sweep = Sweep(a)
    device = "cuda" if a.kind == "KIND_GPU" else "cpu"

    # 1. the fixture, and the store's cache
    fixture, t0 = prepare_fixture(a, rows)
    setup, plans = store_setup(a, rows, fixture, sweep.alphas, t0)

    # 2. keys: a pool of distinct requests per (batch, alpha), drawn when first used
    pools = KeyPools(a, rows, plans)

    repo = os.path.join(a.work, "repo")
    shutil.rmtree(repo, ignore_errors=True)
    rows_type = {"fp16": "TYPE_FP16", "fp32": "TYPE_FP32"}[a.rows_type or ("fp16" if a.precision == "fp16" else "fp32")]
    print(f"embeddings between lookup and network: {rows_type}", flush=True)
    setup["rows_type"] = rows_type
    setup["pipeline_parts"] = a.pipeline_parts
    setup["shared_memory"] = a.shared_memory
    setup["key_upload"] = a.key_upload or "backend default"
    ceilings, bare_aoti = prepare_models(a, sweep, rows, fixture, repo, rows_type, device, setup, pools)
    with open(os.path.join(out_dir, "ceiling.json"), "w") as f:
        json.dump(ceilings, f, indent=1)
    if bare_aoti:
        with open(os.path.join(out_dir, "bare_aoti.json"), "w") as f:
            json.dump(bare_aoti, f, indent=1)

    # 3.-5. the server: exactness before the load, the runs, exactness after it
    exact = runs.serve_and_measure(a, sweep, rows, repo, device, out_dir, setup, plans, pools, ceilings, bare_aoti)
    with open(os.path.join(out_dir, "exact.json"), "w") as f:
        json.dump(exact, f, indent=1)
    with open(os.path.join(out_dir, "setup.json"), "w") as f:
        json.dump(setup, f, indent=1)
    bad = {m: p for m, e in exact.items()
           if (p := [x for part in (e, e["largest_batch"], e.get("cuda_shm", {}))
                     for x in exactness_problems(part, a.prediction_bound)])}
    if bad:
        raise SystemExit("; ".join(f"{m}: {', '.join(p)}" for m, p in bad.items()))


if __name__ == "__main__":
    main()
