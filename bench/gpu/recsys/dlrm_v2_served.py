"""bench/gpu/dlrm_v2_perf.py's served phase (steps 4 and 5): tritonserver started on the repository
(and stopped at the end), the exactness check, then perf_analyzer's 270-pair queries, the endless
stream, and the other perf_analyzer runs (MLPerf-like sizes, the lookup alone, one-pair and large
requests, the twin)."""
import os

from .clock import left_s, phase
from .dlrm_v2_exactness import exactness
from .dlrm_v2_results import save_json
from .dlrm_v2_runs import perf_phase
from .dlrm_v2_stream import stream_phase, stream_room_s


def serve_and_measure(a, repo, rows, plan, pool, setup, res, failures):
    """Everything measured through the server, into `res` and runs.json; a failure ends the
    phase early (said, counted) and what was measured stays. Returns the server log's path."""
    from tritonserver_process import serve
    log_path = os.path.join(a.work, "server.log")
    extra = [f"--cuda-memory-pool-byte-size={g}:{a.cuda_pool_gb << 30}" for g in (a.gpus or "0").split(",")]
    extra += a.server_arg
    if a.libtorch_dir:
        extra.append(f"--backend-config=rust,libtorch-dir={a.libtorch_dir}")
    if a.verbose:
        extra.append("--log-verbose=1")
    if a.timing:
        os.environ["TRITON_RUST_TIMING"] = "1"  # the server inherits it
    phase("tritonserver: loading dlrm_v2, dlrm_v2_lookup, dlrm_v2_queries")
    try:
        with serve(a.server, repo, a.backends, a.port, log_path, extra=extra, timeout=max(120, left_s(a) - 60)) as client:
            with open(log_path, errors="replace") as f:
                for ln in f:
                    if "sharded rows:" in ln:  # where the plan put the tables (gpucache_placement sharded)
                        print("  server: " + ln.strip()[-220:], flush=True)
            phase("exactness")
            try:
                res["exactness"] = exactness(a, rows, failures)
            except Exception as e:  # noqa: BLE001 - a model that cannot answer is a failure; the runs are tried still
                print(f"  FAIL exactness: {e}", flush=True)
                failures.append(f"exactness: {str(e)[:300]}")
                res["exactness"] = {}
            res["exactness"]["failures"] = list(failures)
            save_json(a, res)
            phase("perf_analyzer: 270-pair queries")
            perf_phase(a, client, pool, setup, res, failures, "fixed270")
            if a.stream_levels and os.path.exists(a.stream_client) and left_s(a) > stream_room_s(a) + 40:
                phase("the endless stream")
                setup["stream_note"] = (f"queries of {a.stream_pairs} pairs sent by examples/stream_client.rs (HTTP, keys in one CUDA "
                                        "shared-memory pool drawn on the GPU), dlrm_v2 batching them; "
                                        f"{a.stream_warm_passes} warm pass(es) of the pool before the measured ones"
                                        + ("; the pool drawn again (new keys) before every pass, so no query repeats"
                                           if a.stream_fresh else "; the measured passes repeat the warm pass's queries"))
                stream_phase(a, client, rows, plan, res, failures)
            elif a.stream_levels:
                why = "no stream_client" if not os.path.exists(a.stream_client) else "too little time left"
                print(f"  (the endless stream skipped: {why})", flush=True)
                setup["stream_note"] = f"not run ({why})"
            phase("perf_analyzer: MLPerf-like query sizes, the lookup alone")
            perf_phase(a, client, pool, setup, res, failures, "rest")
    except (Exception, SystemExit) as e:  # noqa: BLE001 - what was measured is still written (step 7)
        print(f"  the served phase ended early: {e}", flush=True)
        failures.append(f"the served phase: {str(e)[:300]}")
    return log_path
