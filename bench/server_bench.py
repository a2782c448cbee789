#!/usr/bin/env python3
"""Closed-loop latency/throughput benchmark of libtriton_rust.so inside the real tritonserver.

    source scripts/env.sh
    python bench/server_bench.py                                  # gRPC, concurrency 1,8,64, 5 s each
    python bench/server_bench.py --protocol http --duration 10
    python bench/server_bench.py --perf-analyzer                  # measure with perf_analyzer instead

One server is started with two models:
  - identity   : examples' identity ONNX model served by OUR backend (models/identity/config.pbtxt:
                 FP32 [16], max batch 256, dynamic batching 100 us, 2 CPU instances);
  - the REFERENCE, chosen in this order:
      * identity_python: the same contract (same config, same batching) served by Triton's own
        python backend, which ships in the pytriton wheel (.deps/pytriton/tritonserver/backends/python),
        returning its input as a numpy array. The ratio then compares our backend's per-request
        path with NVIDIA's python backend on the same server, same client, same settings.
      * if the python backend cannot load (stub/libpython missing), identity_nobatch: our backend
        again with dynamic batching off. The ratio then says what the dynamic batcher buys.
For each concurrency C, C requests are kept in flight for --duration seconds (closed loop: a
request is sent as soon as one completes), batch 1 x 16 floats, and every response is checked
against its input. The table shows requests/s, p50/p99 latency, and server executions vs requests
(from /v2/models/<m>/stats, so executions < requests means requests were merged).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "server"))

from tritonserver_harness import (  # noqa: E402
    BACKEND_DIR,
    DEPS_DIR,
    MODELS_DIR,
    HarnessError,
    ModelRepo,
    TritonServer,
    _rename,
    check_prerequisites,
    ensure_example_models,
    make_client,
    make_inputs,
)

PY_BACKEND_SRC = os.path.join(DEPS_DIR, "pytriton", "tritonserver", "backends", "python")
PY_STUBS = os.path.join(DEPS_DIR, "pytriton", "tritonserver", "python_backend_stubs")

PY_MODEL = '''import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
'''


def python_backend_dir(tmp: str) -> str | None:
    """A backend directory holding our rust/ and the wheel's python backend with this Python's stub."""
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = os.path.join(PY_STUBS, ver, "triton_python_backend_stub")
    if not (os.path.isfile(os.path.join(PY_BACKEND_SRC, "libtriton_python.so")) and os.path.isfile(stub)):
        return None
    d = os.path.join(tmp, "backends")
    os.makedirs(os.path.join(d, "python"))
    os.symlink(os.path.join(BACKEND_DIR, "rust"), os.path.join(d, "rust"))
    for f in ("libtriton_python.so", "triton_python_backend_utils.py"):
        os.symlink(os.path.join(PY_BACKEND_SRC, f), os.path.join(d, "python", f))
    os.symlink(stub, os.path.join(d, "python", "triton_python_backend_stub"))
    return d


def identity_config(name: str, backend: str, batching: bool = True) -> str:
    with open(os.path.join(MODELS_DIR, "identity", "config.pbtxt")) as f:
        cfg = _rename(f.read(), name)
    cfg = cfg.replace('backend: "rust"', f'backend: "{backend}"')
    if not batching:
        cfg = re.sub(r"dynamic_batching\s*\{[^}]*\}\n?", "", cfg)
    return cfg


# --------------------------------------------------------------------------- closed loop


def closed_loop_grpc(server, model, concurrency, duration, payloads):
    """C requests in flight through gRPC async_infer; each completion sends the next."""
    client = make_client(server, "grpc")
    lat, errors, lock = [], [], threading.Lock()
    done = threading.Event()
    active = [concurrency]
    deadline = [0.0]

    def send(slot, seq):
        x = payloads[(slot * 7919 + seq) % len(payloads)]
        t0 = time.perf_counter()

        def cb(result, error):
            t1 = time.perf_counter()
            ok = error is None and np.array_equal(result.as_numpy("OUTPUT0"), x)
            with lock:
                if ok:
                    lat.append(t1 - t0)
                else:
                    errors.append(error or "wrong output")
            if t1 < deadline[0]:
                send(slot, seq + 1)
            else:
                with lock:
                    active[0] -= 1
                    if active[0] == 0:
                        done.set()

        client.async_infer(model, make_inputs("grpc", {"INPUT0": x}), callback=cb)

    start = time.perf_counter()
    deadline[0] = start + duration
    for s in range(concurrency):
        send(s, 0)
    done.wait(duration + 60)
    elapsed = time.perf_counter() - start
    client.close()
    return lat, errors, elapsed


def closed_loop_http(server, model, concurrency, duration, payloads):
    """C threads, one HTTP client each, each sending its next request when the last completes."""
    lat, errors, lock = [], [], threading.Lock()
    start = time.perf_counter()
    deadline = start + duration

    def worker(slot):
        client = make_client(server, "http")
        seq = 0
        mine = []
        while True:
            x = payloads[(slot * 7919 + seq) % len(payloads)]
            t0 = time.perf_counter()
            try:
                r = client.infer(model, make_inputs("http", {"INPUT0": x}))
                ok = np.array_equal(r.as_numpy("OUTPUT0"), x)
                err = None if ok else "wrong output"
            except Exception as e:  # noqa: BLE001 - counted and reported
                err = e
            t1 = time.perf_counter()
            if err is None:
                mine.append(t1 - t0)
            else:
                with lock:
                    errors.append(err)
            seq += 1
            if t1 >= deadline:
                break
        client.close()
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return lat, errors, time.perf_counter() - start


def perf_analyzer(server, model, concurrency, duration, protocol):
    exe = os.environ.get("PERF_ANALYZER") or shutil.which("perf_analyzer")
    if not exe or not os.path.isfile(exe):
        raise HarnessError("perf_analyzer not found: source scripts/env.sh (PERF_ANALYZER)")
    url = server.grpc_url if protocol == "grpc" else server.http_url
    cmd = [exe, "-m", model, "-u", url, "-i", protocol, "-b", "1", "--shape", "INPUT0:16",
           "--concurrency-range", f"{concurrency}:{concurrency}", "--measurement-mode", "time_windows",
           "--measurement-interval", str(int(duration * 1000)), "--percentile", "99",
           "--stability-percentage", "999", "--max-trials", "3"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=duration * 10 + 120)
    elapsed = time.perf_counter() - t0
    out = p.stdout + p.stderr
    if p.returncode != 0:
        raise HarnessError(f"perf_analyzer failed ({p.returncode}): {' '.join(cmd)}\n{out[-3000:]}")
    m = re.search(r"Concurrency: \d+, throughput: ([\d.]+) infer/sec, latency (\d+) usec", out)
    p50 = re.search(r"p50 latency: (\d+) usec", out)
    p99 = re.search(r"p99 latency: (\d+) usec", out)
    if not m:
        raise HarnessError(f"cannot parse perf_analyzer output:\n{out[-3000:]}")
    return {"rps": float(m.group(1)), "p50": int(p50.group(1)) / 1000 if p50 else float("nan"),
            "p99": int(p99.group(1)) / 1000 if p99 else float("nan"), "errors": 0, "elapsed": elapsed}


def measure(server, model, concurrency, args, payloads):
    before = server.stats(model)
    if args.perf_analyzer:
        r = perf_analyzer(server, model, concurrency, args.duration, args.protocol)
    else:
        loop = closed_loop_grpc if args.protocol == "grpc" else closed_loop_http
        lat, errors, elapsed = loop(server, model, concurrency, args.duration, payloads)
        lat_ms = np.array(lat) * 1000.0
        r = {"rps": len(lat) / elapsed, "p50": float(np.percentile(lat_ms, 50)) if len(lat) else float("nan"),
             "p99": float(np.percentile(lat_ms, 99)) if len(lat) else float("nan"), "errors": len(errors),
             "elapsed": elapsed}
        if errors:
            print(f"  !! {model} c={concurrency}: {len(errors)} failed requests, first: {errors[0]}", flush=True)
    after = server.stats(model)
    r["requests"] = int(after["inference_stats"]["success"]["count"]) - int(before["inference_stats"]["success"]["count"])
    r["executions"] = int(after["execution_count"]) - int(before["execution_count"])
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per measurement (default 5)")
    ap.add_argument("--concurrency", default="1,8,64", help="comma-separated in-flight request counts")
    ap.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    ap.add_argument("--perf-analyzer", action="store_true", help="measure with $PERF_ANALYZER instead of Python")
    ap.add_argument("--reference", choices=["auto", "python", "nobatch", "none"], default="auto",
                    help="reference model (default: python backend if it loads, else identity without batching)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary repository and server log")
    args = ap.parse_args(argv)
    concurrencies = [int(c) for c in args.concurrency.split(",") if c.strip()]

    try:
        check_prerequisites()
        ensure_example_models(("identity",))
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    tmp = tempfile.mkdtemp(prefix="server-bench-")
    repo = ModelRepo(os.path.join(tmp, "repo"))
    repo.add_example("identity")
    backend_dir = None
    ref_kind = args.reference
    if ref_kind in ("auto", "python"):
        backend_dir = python_backend_dir(tmp)
        if backend_dir is None:
            if ref_kind == "python":
                print("error: the wheel's python backend or its stub for this Python is missing", file=sys.stderr)
                return 2
            ref_kind = "nobatch"
        else:
            d = os.path.join(repo.root, "identity_python", "1")
            os.makedirs(d)
            with open(os.path.join(d, "model.py"), "w") as f:
                f.write(PY_MODEL)
            repo.write_config("identity_python", identity_config("identity_python", "python"))
    if ref_kind in ("nobatch", "auto"):
        repo.add_example("identity", as_name="identity_nobatch", config=identity_config("identity_nobatch", "rust", False))

    server = None
    try:
        server = TritonServer(repo.root, ["--model-control-mode=explicit", "--load-model=identity"],
                              log_dir=os.path.join(tmp, "log"), backend_directory=backend_dir,
                              # the python backend's stub embeds the system libpython: give it our numpy
                              env={"PYTHONPATH": os.pathsep.join(p for p in sys.path if p.endswith("site-packages"))})
        server.start()
        reference = None
        if ref_kind in ("auto", "python"):
            r = server.load("identity_python")
            if r.status_code == 200:
                reference = ("identity_python", "Triton's python backend (numpy identity), same config and batching")
            elif ref_kind == "python":
                print(f"error: python backend model failed to load: {r.text}", file=sys.stderr)
                return 2
            else:
                print(f"note: python backend reference did not load ({r.text.strip()}); "
                      "falling back to our backend without dynamic batching", flush=True)
                ref_kind = "nobatch"
        if ref_kind == "nobatch":
            r = server.load("identity_nobatch")
            if r.status_code != 200:
                print(f"error: identity_nobatch failed to load: {r.text}", file=sys.stderr)
                return 2
            reference = ("identity_nobatch", "our backend with dynamic batching OFF (what the batcher buys)")

        rng = np.random.default_rng(0)
        payloads = [rng.standard_normal((1, 16), dtype=np.float32) for _ in range(256)]
        models = [("identity", "ours")] + ([(reference[0], "reference")] if reference else [])
        how = "perf_analyzer" if args.perf_analyzer else f"python {args.protocol} closed loop"
        print(f"\ntritonserver pid {server.pid}, {how}, batch 1 x 16 FP32, {args.duration:g} s per point, "
              f"{os.cpu_count()} CPU cores (client and server share them)")
        for m, role in models:  # warm-up: first requests pay for connections, instance threads, arenas
            measure(server, m, 1, argparse.Namespace(**{**vars(args), "duration": 0.5, "perf_analyzer": False}), payloads)
        rows = []
        for c in concurrencies:
            for m, role in models:
                r = measure(server, m, c, args, payloads)
                rows.append((c, m, role, r))
                print(f"  measured {m:17s} c={c:<3d} {r['rps']:9.1f} req/s", flush=True)

        print()
        hdr = f"{'conc':>4}  {'model':17s} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'executions':>10} {'requests':>9} {'req/exec':>8} {'errors':>6}"
        print(hdr)
        print("-" * len(hdr))
        for c, m, role, r in rows:
            per = r["requests"] / r["executions"] if r["executions"] else float("nan")
            print(f"{c:>4}  {m:17s} {r['rps']:9.1f} {r['p50']:8.3f} {r['p99']:8.3f} {r['executions']:>10} "
                  f"{r['requests']:>9} {per:8.2f} {r['errors']:>6}")
        if reference:
            print(f"\nratio = ours ({models[0][0]}) / reference ({reference[0]}: {reference[1]})")
            print(f"{'conc':>4}  {'req/s ratio':>11} {'p50 ratio':>10} {'p99 ratio':>10}")
            by = {(c, role): r for c, m, role, r in rows}
            for c in concurrencies:
                o, ref = by[(c, "ours")], by[(c, "reference")]
                print(f"{c:>4}  {o['rps'] / ref['rps']:11.2f} {o['p50'] / ref['p50']:10.2f} {o['p99'] / ref['p99']:10.2f}")
            print("(req/s ratio > 1: ours serves more; latency ratio < 1: ours answers faster)")
        failed = sum(r["errors"] for *_, r in rows)
        alive = server.alive()
        print(f"\nserver alive at the end: {alive}; failed requests: {failed}; log: {server.log_path}")
        return 0 if alive and failed == 0 else 1
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if server is not None:
            server.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
