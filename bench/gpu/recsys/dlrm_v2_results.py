"""bench/gpu/dlrm_v2_perf.py's results folder: runs.json after every run and setup.json, an earlier
run's files cleared, perf.tgz (raw CSVs, pools, configs, the server log's end), the GPU's facts
for setup.json; and the last step: the ratios and the issue's targets printed (PASS/MISS), the
report written (bench/gpu/dlrm_v2_report.py), the failures listed, the exit status."""
import json
import os
import tarfile
import time

import dlrm_v2_report

from .clock import PHASES, T0, phase
from .host_use import gpu_fields


def save_json(a, res, setup=None):
    """runs.json (after every run: a call cut off by its timeout keeps what it measured), and setup.json."""
    with open(os.path.join(a.results, "runs.json"), "w") as f:
        json.dump(res, f, indent=1)
    if setup is not None:
        with open(os.path.join(a.results, "setup.json"), "w") as f:
            json.dump(setup, f, indent=1)


def clear_results(folder):
    """The benchmark's own files from an earlier run (run.sh's console.log and host.txt stay)."""
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
        if name in ("README.md", "setup.json", "runs.json", "perf.tgz") or name.endswith(".png"):
            os.remove(os.path.join(folder, name))


def pack(a, log_path):
    """perf.tgz: the raw perf_analyzer CSVs, the pools' descriptions, the configs and the server
    log's end (a device call returns at most 8 files)."""
    with tarfile.open(os.path.join(a.results, "perf.tgz"), "w:gz") as tar:
        raw = os.path.join(a.work, "raw")
        if os.path.isdir(raw):
            tar.add(raw, arcname="perf/raw")
        for name in ("pools.txt", "gpu_dmon.log"):  # gpu_dmon.log: run.sh's nvidia-smi dmon, where it ran
            if os.path.exists(os.path.join(a.work, name)):
                tar.add(os.path.join(a.work, name), arcname=f"perf/{name}")
        for m in ("dlrm_v2", "dlrm_v2_lookup", "dlrm_v2_queries"):
            cfg = os.path.join(a.work, "repo", m, "config.pbtxt")
            if os.path.exists(cfg):
                tar.add(cfg, arcname=f"perf/configs/{m}.pbtxt")
        if os.path.exists(log_path):
            tail = os.path.join(a.work, "server_tail.log")
            with open(log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(log_path) - 2_000_000))
                data = f.read()
            with open(tail, "wb") as f:
                f.write(data)
            tar.add(tail, arcname="perf/server_tail.log")


def gpu_facts():
    """(the GPU's name and memory, its driver) from nvidia-smi."""
    name, driver, memory = gpu_fields("unknown GPU, unknown, -")
    return f"{name}, {memory}", driver


def finish(a, setup, res, failures, log_path):
    """Step 7: each phase's seconds into setup.json, the ratios and the issue's targets printed (a
    target MISS is reported, not a failure), the report and perf.tgz written, the failures
    printed; the exit status (1 where anything failed)."""
    phase("results")
    PHASES.pop("_open", None)
    setup["phases"] = {k: v for k, v in PHASES.items()}
    save_json(a, res, setup)
    for line in dlrm_v2_report.ratios(res):
        print(line, flush=True)
    for t, v, d in dlrm_v2_report.targets(setup, res):
        print(f"{v:4s} {t}: {d}", flush=True)
    try:
        print(f"wrote {dlrm_v2_report.write(a.results, setup, res)}", flush=True)
    except Exception as e:  # noqa: BLE001 - setup.json and runs.json are written: the report can be made again
        print(f"the report failed ({e}); python3 bench/gpu/dlrm_v2_report.py --results {a.results}", flush=True)
        failures.append(f"report: {e}")
    pack(a, log_path)
    for f in failures:
        print(f"FAIL {f}", flush=True)
    print(f"dlrm_v2_perf: {'every check passed' if not failures else f'{len(failures)} failures'}; "
          f"{time.time() - T0:.0f} s; results in {a.results}", flush=True)
    return 1 if failures else 0
