"""Start and stop the real tritonserver with libtriton_rust.so, and build model repositories.

Shared by the pytest suite (tests/server/conftest.py) and the benchmark (bench/server_bench.py).
Nothing here is skipped: a missing server binary, backend library or ONNX Runtime library is an
error that says how to get it (scripts/setup.sh and the cmake build).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, Iterable, List, Optional, Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS_DIR = os.path.join(REPO_ROOT, "models")
# TRITON_RUST_BACKEND_DIR: another build's backends/ (scripts/test_other_torch.sh)
BACKEND_DIR = os.environ.get("TRITON_RUST_BACKEND_DIR") or os.path.join(REPO_ROOT, "install", "backends")
BACKEND_LIB = os.path.join(BACKEND_DIR, "rust", "libtriton_rust.so")
DEPS_DIR = os.path.join(REPO_ROOT, ".deps")

SETUP_HINT = ("run `bash scripts/setup.sh`, then `cmake -B build -S . && cmake --build build --target install`, "
              "then `source scripts/env.sh`")

if os.path.join(REPO_ROOT, "examples") not in sys.path:
    sys.path.insert(0, os.path.join(REPO_ROOT, "examples"))


class HarnessError(RuntimeError):
    pass


def tritonserver_path() -> str:
    path = os.environ.get("TRITONSERVER") or os.path.join(DEPS_DIR, "pytriton", "tritonserver", "bin", "tritonserver")
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise HarnessError(f"tritonserver binary not found at '{path}': {SETUP_HINT}")
    return path


def ort_library_path() -> str:
    path = os.environ.get("ORT_LIB", "")
    if not path:
        found = sorted(glob.glob(os.path.join(REPO_ROOT, ".venv", "lib", "python3*", "site-packages",
                                              "onnxruntime", "capi", "libonnxruntime.so.*")))
        path = found[0] if found else ""
    if not path or not os.path.isfile(path):
        raise HarnessError(f"ONNX Runtime library not found (ORT_LIB='{path}'): {SETUP_HINT}")
    return os.path.abspath(path)


def check_prerequisites() -> None:
    """Raise HarnessError with a how-to-fix message when anything needed is missing."""
    tritonserver_path()
    ort_library_path()
    if not os.path.isfile(BACKEND_LIB):
        raise HarnessError(f"backend library not found at '{BACKEND_LIB}': {SETUP_HINT}")


def free_ports(n: int) -> List[int]:
    """n distinct free TCP ports (bound then released; the kernel will not hand them out again at once)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


# --------------------------------------------------------------------------- models


def ensure_example_models(names: Sequence[str] = ("resnet50", "bert_small", "identity")) -> None:
    """Write models/<name>/1/model.onnx with examples/export_models.py where it is missing."""
    from export_models import build_model

    for name in names:
        cfg = os.path.join(MODELS_DIR, name, "config.pbtxt")
        if not os.path.isfile(cfg):
            raise HarnessError(f"'{cfg}' is missing (it is committed in the repository)")
        path = os.path.join(MODELS_DIR, name, "1", "model.onnx")
        if not os.path.isfile(path):
            print(f"[harness] exporting {name} -> {path}", flush=True)
            build_model(name, path)


def two_input_dynamic_model():
    """OUTPUT0 = INPUT0 + INPUT1 with FP32 [batch, n] and n free (the `simple` model has n = 16)."""
    import onnx
    from onnx import TensorProto, helper

    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "n"]) for n in ("INPUT0", "INPUT1")]
    outs = [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", "n"])]
    graph = helper.make_graph([helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"])], "dyn_add", ins, outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


class ModelRepo:
    """A temporary model repository: example models symlinked from models/, test models written here."""

    def __init__(self, root: Optional[str] = None):
        self.root = root or tempfile.mkdtemp(prefix="triton-repo-")
        os.makedirs(self.root, exist_ok=True)

    def add_example(self, name: str, as_name: Optional[str] = None, config: Optional[str] = None) -> str:
        """Link models/<name>'s version dir; copy its config (or write `config`, e.g. a variant)."""
        dst_name = as_name or name
        dst = os.path.join(self.root, dst_name)
        os.makedirs(dst, exist_ok=True)
        os.symlink(os.path.join(MODELS_DIR, name, "1"), os.path.join(dst, "1"))
        if config is None:
            with open(os.path.join(MODELS_DIR, name, "config.pbtxt")) as f:
                config = f.read()
            if as_name:
                config = _rename(config, dst_name)
        self.write_config(dst_name, config)
        return dst

    def add_built(self, name: str, builder: str, config: str) -> str:
        """Write model `name` from export_models' BUILDERS[builder] and the given config text."""
        from export_models import build_model

        build_model(builder, os.path.join(self.root, name, "1", "model.onnx"))
        self.write_config(name, config)
        return os.path.join(self.root, name)

    def add_raw(self, name: str, model_bytes: bytes, config: str) -> str:
        """A model whose model.onnx holds exactly `model_bytes` (e.g. garbage)."""
        d = os.path.join(self.root, name, "1")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(model_bytes)
        self.write_config(name, config)
        return os.path.join(self.root, name)

    def add_onnx(self, name: str, model, config: str) -> str:
        """A model from an onnx.ModelProto built by the test itself."""
        return self.add_raw(name, model.SerializeToString(), config)

    def write_config(self, name: str, config: str) -> None:
        os.makedirs(os.path.join(self.root, name), exist_ok=True)
        with open(os.path.join(self.root, name, "config.pbtxt"), "w") as f:
            f.write(config)

    def model_file(self, name: str) -> str:
        return os.path.realpath(os.path.join(self.root, name, "1", "model.onnx"))

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _rename(config: str, new_name: str) -> str:
    out = []
    for line in config.splitlines():
        if line.strip().startswith("name:") and not line.startswith((" ", "\t")):
            line = f'name: "{new_name}"'
        out.append(line)
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- server


class TritonServer:
    """The real tritonserver on free ports, logging to <log_dir>/tritonserver.log."""

    def __init__(self, model_repository: str, extra_args: Iterable[str] = (), log_dir: Optional[str] = None,
                 backend_directory: Optional[str] = None, ready_timeout: float = 120.0,
                 env: Optional[Dict[str, str]] = None, libtorch: bool = True):
        check_prerequisites()
        # libtorch for the torch plugin (scripts/env.sh finds the venv's torch/lib);
        # libtorch=False starts a server that has none, as on a machine without it.
        self.libtorch_dir = os.environ.get("LIBTORCH_DIR", "") if libtorch else ""
        self.model_repository = model_repository
        self.extra_args = list(extra_args)
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="triton-log-")
        os.makedirs(self.log_dir, exist_ok=True)
        self.log_path = os.path.join(self.log_dir, "tritonserver.log")
        self.backend_directory = backend_directory or BACKEND_DIR
        self.ready_timeout = ready_timeout
        self.env = env
        self.proc: Optional[subprocess.Popen] = None
        self._log_file = None
        self.http_port = self.grpc_port = self.metrics_port = 0

    # ---- addresses
    @property
    def http_url(self) -> str:
        return f"localhost:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"localhost:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://localhost:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    # ---- lifecycle
    def start(self) -> "TritonServer":
        for attempt in range(3):  # a port grabbed by someone else between pick and bind: retry
            self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
            cmd = [
                tritonserver_path(),
                f"--model-repository={self.model_repository}",
                f"--backend-directory={self.backend_directory}",
                f"--backend-config=rust,onnxruntime-library={ort_library_path()}",
                *([f"--backend-config=rust,libtorch-dir={self.libtorch_dir}"] if self.libtorch_dir else []),
                f"--http-port={self.http_port}",
                f"--grpc-port={self.grpc_port}",
                f"--metrics-port={self.metrics_port}",
                "--allow-metrics=true",
                # a client keeping an HTTP connection open would otherwise hold SIGTERM for 30 s
                *([] if any(a.startswith("--exit-timeout-secs") for a in self.extra_args) else ["--exit-timeout-secs=5"]),
                *self.extra_args,
            ]
            self._log_file = open(self.log_path, "ab")
            self._log_file.write(("\n[harness] " + " ".join(cmd) + "\n").encode())
            self._log_file.flush()
            env = dict(os.environ)
            if self.env:
                env.update(self.env)
            self.proc = subprocess.Popen(cmd, stdout=self._log_file, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
            if self._wait_ready():
                return self
            early_rc = self.proc.poll()
            self.stop()
            log = self.log_text()
            if attempt < 2 and "address already in use" in log.lower():
                continue
            why = (f"exited with code {early_rc}" if early_rc is not None
                   else f"did not become ready in {self.ready_timeout:.0f} s")
            raise HarnessError(f"tritonserver {why}; log {self.log_path}:\n{log[-6000:]}")
        raise HarnessError("tritonserver could not bind free ports after 3 attempts")

    def _wait_ready(self) -> bool:
        import requests

        deadline = time.monotonic() + self.ready_timeout
        url = f"http://localhost:{self.http_port}/v2/health/ready"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if requests.get(url, timeout=1).status_code == 200:
                    return True
            except requests.RequestException:
                pass
            time.sleep(0.2)
        return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def rss_bytes(self) -> int:
        import psutil

        return psutil.Process(self.pid).memory_info().rss

    def stop(self, timeout: float = 30.0) -> Optional[int]:
        """SIGTERM, wait up to `timeout` s, then SIGKILL. Returns the exit code."""
        rc = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
            rc = self.proc.returncode
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return rc

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- small HTTP helpers (plain requests, so errors come back verbatim)
    def http(self, method: str, path: str, **kw):
        import requests

        kw.setdefault("timeout", 120)
        return requests.request(method, f"http://localhost:{self.http_port}{path}", **kw)

    def load(self, model: str, timeout: float = 300):
        return self.http("POST", f"/v2/repository/models/{model}/load", timeout=timeout)

    def unload(self, model: str, timeout: float = 300):
        return self.http("POST", f"/v2/repository/models/{model}/unload", timeout=timeout)

    def wait_unloaded(self, model: str, timeout: float = 60.0) -> None:
        """Until the repository index says `model` is unloaded. Triton answers an unload before
        the model has gone: not ready, but still unloading, and a load sent then was answered
        by the old model on a busy machine."""
        deadline = time.monotonic() + timeout
        while True:
            index = self.http("POST", "/v2/repository/index").json()
            state = next((m.get("state") for m in index if m.get("name") == model), None)
            if state not in ("READY", "UNLOADING", "LOADING"):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{model} still {state} {timeout:.0f} s after its unload")
            time.sleep(0.05)

    def stats(self, model: str) -> dict:
        r = self.http("GET", f"/v2/models/{model}/stats")
        r.raise_for_status()
        return r.json()["model_stats"][0]

    def stats_after(self, model: str, before: dict, requests: int, timeout: float = 120.0) -> dict:
        """The model's statistics once they count `requests` more finished requests (successes
        and failures) than `before`. The backend keeps Triton's order: it sends an execution's
        responses, then reports its statistics, so a client holding every answer can read the
        statistics before they include the last; on a busy machine that gap can be long. Tests
        read statistics through this, never right after their answers; it fails rather than
        return incomplete figures."""
        def finished(stats):
            s = stats["inference_stats"]
            return int(s["success"]["count"]) + int(s["fail"]["count"])
        want = finished(before) + requests
        deadline = time.monotonic() + timeout
        while True:
            stats = self.stats(model)
            if finished(stats) >= want:
                return stats
            if time.monotonic() > deadline:
                raise AssertionError(f"{model}: statistics count {finished(stats) - finished(before)} of "
                                     f"{requests} requests {timeout:.0f} s after the last answer")
            time.sleep(0.02)

    def model_ready(self, model: str) -> bool:
        return self.http("GET", f"/v2/models/{model}/ready").status_code == 200


# --------------------------------------------------------------------------- clients


def client_module(protocol: str):
    if protocol == "http":
        import tritonclient.http as mod
    elif protocol == "grpc":
        import tritonclient.grpc as mod
    else:
        raise ValueError(f"protocol must be http or grpc, not {protocol!r}")
    return mod


def make_client(server: TritonServer, protocol: str, **kw):
    mod = client_module(protocol)
    url = server.http_url if protocol == "http" else server.grpc_url
    return mod.InferenceServerClient(url, **kw)


def make_inputs(protocol: str, feeds: Dict[str, "object"], dtypes: Optional[Dict[str, str]] = None):
    """InferInput list from {name: ndarray}; `dtypes` overrides the wire data type per input."""
    mod = client_module(protocol)
    inputs = []
    for name, arr in feeds.items():
        dt = (dtypes or {}).get(name) or mod.np_to_triton_dtype(arr.dtype)
        x = mod.InferInput(name, list(arr.shape), dt)
        if protocol == "http":
            x.set_data_from_numpy(arr, binary_data=True)
        else:
            x.set_data_from_numpy(arr)
        inputs.append(x)
    return inputs


def infer(client, protocol: str, model: str, feeds: Dict[str, "object"], outputs: Sequence[str],
          dtypes: Optional[Dict[str, str]] = None, **kw):
    """Run one request; returns {output name: ndarray}. Raises InferenceServerException on error."""
    mod = client_module(protocol)
    req_outputs = [mod.InferRequestedOutput(o, binary_data=True) if protocol == "http" else mod.InferRequestedOutput(o)
                   for o in outputs]
    res = client.infer(model, make_inputs(protocol, feeds, dtypes), outputs=req_outputs, **kw)
    return {o: res.as_numpy(o) for o in outputs}


def error_status(e) -> str:
    """The status of an InferenceServerException as text ('400', 'StatusCode.INVALID_ARGUMENT')."""
    return str(e.status())


# --------------------------------------------------------------------------- metrics


def scrape_metrics(server: TritonServer) -> List[tuple]:
    """The Prometheus endpoint parsed: [(family, {label: value}, float value)] (comments skipped)."""
    import re
    import requests

    text = requests.get(server.metrics_url, timeout=10).text
    rows = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$', line)
        if not m:
            continue
        labels = dict(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        rows.append((m.group(1), labels, float(m.group(3))))
    return rows


def metric_sum(server: TritonServer, family: str, **labels: str) -> float:
    """Sum of `family` over the series whose labels include `labels` (0.0 when none)."""
    return sum(v for name, lab, v in scrape_metrics(server)
               if name == family and all(lab.get(k) == str(want) for k, want in labels.items()))


def wait_metric(server: TritonServer, family: str, want: float, timeout: float = 5.0, **labels: str) -> float:
    """Polls until metric_sum(...) == want (the backend publishes every 250 ms); returns the last value."""
    deadline = time.monotonic() + timeout
    time.sleep(0.7)
    while True:
        got = metric_sum(server, family, **labels)
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.25)


def fire_grpc(server: "TritonServer", model: str, input_name, payloads, output_name: str = "OUTPUT0"):
    """Sends every payload at once with gRPC async_infer (so the dynamic batcher can merge
    them); returns [(ndarray or None, error or None)] in payload order. `input_name` None:
    each payload is a request's whole {input: array}."""
    import queue
    client = make_client(server, "grpc")
    done: "queue.Queue" = queue.Queue()
    for i, x in enumerate(payloads):
        client.async_infer(model, make_inputs("grpc", x if input_name is None else {input_name: x}),
                           callback=lambda result, error, i=i: done.put((i, result, error)))
    results = [None] * len(payloads)
    for _ in payloads:
        i, result, error = done.get(timeout=120)
        results[i] = (None if error else result.as_numpy(output_name), error)
    client.close()
    return results
