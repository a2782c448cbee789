"""perf_analyzer as bench/gpu/dlrm_v2_perf.py calls it: its calls (--pa-modes) and their command
lines, a run stopped past its time limit (no figure rather than the rest of the call), the
messages of lost connections that send a run again, its CSV read back as numbers, and the C API
runs' concurrency range."""
import csv
import os
import re
import subprocess

import dlrm_v2_report

from .clock import left_s

# perf_analyzer's calls (--pa-modes); those over HTTP are the report's (it is imported here, not
# the other way round, to keep the report light)
PA_MODES = ("sync", "async", "grpcstream", "http", "httpsync")
HTTP_MODES = dlrm_v2_report.HTTP_MODES
NUMBER = re.compile(r"^-?[0-9.]+(e[-+]?[0-9]+)?$")


def read_rows(raw):
    """The rows of a perf_analyzer CSV (one per concurrency), as numbers."""
    with open(raw) as f:
        return [{k: float(v) for k, v in row.items() if k and v not in ("", None) and NUMBER.match(v)}
                for row in csv.DictReader(f)]


def read_row(raw):
    """The first row of a perf_analyzer CSV, as numbers."""
    return read_rows(raw)[0]


CONNECTION_LOST = re.compile(r"Broken pipe|Connection reset by peer|failed to connect to all addresses|"
                             r"Failed to retrieve results from inference request")


def pa_call(a, cmd, env=None, limit=None):
    """perf_analyzer's run, stopped after `limit` seconds (default --pa-timeout-s, or what is
    left of the budget): one that hangs gives no figure (a failed run) instead of taking the
    rest of the call."""
    limit = limit or min(a.pa_timeout_s, max(60, left_s(a)))
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=env)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return subprocess.CompletedProcess(cmd, 124, out, f"perf_analyzer stopped after {limit:.0f} s")


def pa_env(share):
    """perf_analyzer's environment: `share` gRPC calls to a connection (None: its default)."""
    if share is None:
        return None
    return {**os.environ, "TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT": str(share)}


def pa_command(a, model, batch, conc, data, raw, mode):
    """perf_analyzer's command line for one run in `mode` (one of PA_MODES): gRPC on the port
    after --port, HTTP on --port; sync calls hold a thread a request in flight, the async modes
    --pa-threads threads."""
    http = mode in HTTP_MODES
    cmd = [a.perf_analyzer, "-m", model, "-b", str(batch), "--concurrency-range", f"{conc}:{conc}",
           "-i", "http" if http else "grpc", "-u", f"localhost:{a.port if http else a.port + 1}",
           "--shared-memory", a.pa_shm, "--output-shared-memory-size", str(1 << 20),
           "--input-data", data, "--measurement-interval", str(a.interval_ms), "--max-trials", "6", "-f", raw]
    if mode == "grpcstream":
        cmd.append("--streaming")
    if mode in ("async", "grpcstream", "http"):
        cmd.append("--async")
        if a.pa_threads:
            cmd += ["--max-threads", str(a.pa_threads)]
    return cmd


def capi_range(concs):
    """perf_analyzer's --concurrency-range for --capi-concurrency: one value, or an even step."""
    concs = sorted(concs)
    steps = {b - a for a, b in zip(concs, concs[1:])}
    if len(steps) > 1:
        raise ValueError(f"--capi-concurrency {concs}: one value or an even step (perf_analyzer takes START:END:STEP)")
    return f"{concs[0]}:{concs[-1]}:{steps.pop() if steps else 1}"
