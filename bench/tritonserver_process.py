"""The real tritonserver as a child process for the benchmark scripts: started on given
ports, waited for until ready (its log's tail printed if it dies or times out), and
stopped on exit."""
import contextlib
import os
import subprocess
import time
import urllib.error
import urllib.request

from kserve_client import Client


@contextlib.contextmanager
def serve(server: str, repo: str, backends: str, port: int, log_path: str, extra=(), timeout: float = 600):
    """Yields a ready Client on HTTP port `port` (gRPC port+1, metrics port+2)."""
    proc = subprocess.Popen([server, f"--model-repository={repo}", f"--backend-directory={backends}",
                             f"--http-port={port}", f"--grpc-port={port + 1}", f"--metrics-port={port + 2}",
                             "--exit-timeout-secs=5", *extra],
                            stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    client = Client(f"localhost:{port}")
    try:
        deadline = time.time() + timeout
        while not client.ready():
            if proc.poll() is not None or time.time() > deadline:
                print(open(log_path).read()[-5000:])
                raise SystemExit("tritonserver did not become ready")
            time.sleep(0.5)
        yield client
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def server_pid(port: int) -> int:
    """The tritonserver serving HTTP on `port` (found in /proc: the GPU machine has no pgrep)."""
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                cmd = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"tritonserver") and f"--http-port={port}".encode() in cmd:
                return int(d)
    raise SystemExit(f"no tritonserver on port {port}")


def capi_env(capi_dir: str, libtorch_dir: str) -> dict:
    """perf_analyzer's environment in its C API mode (Triton's library in its own process):
    `capi_dir` holds lib/libtritonserver.so and backends/. The mode passes no backend settings,
    so the plugin finds libtorch through TRITON_RUST_LIBTORCH_DIR; perf_analyzer opens
    libtritonserver.so with its symbols local, and a backend finds the TRITONBACKEND_* functions
    among the process's global ones: preloaded, they are there."""
    env = dict(os.environ)
    env["TRITON_RUST_LIBTORCH_DIR"] = libtorch_dir
    env["LD_LIBRARY_PATH"] = os.path.join(capi_dir, "lib") + ":" + env.get("LD_LIBRARY_PATH", "")
    env["LD_PRELOAD"] = os.path.join(capi_dir, "lib", "libtritonserver.so")
    return env


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def gpu_mib(pid: int) -> float:
    """GPU memory nvidia-smi counts for the process (0 on a machine without a GPU)."""
    if not os.path.exists("/dev/nvidiactl"):
        return 0.0
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return sum(float(m) for p, m in (line.split(",") for line in out.splitlines() if line.strip()) if int(p) == pid)


def post(port: int, path: str, timeout: float = 900):
    """POST with an empty body (the repository API: load, unload); returns (status, body)."""
    req = urllib.request.Request(f"http://localhost:{port}{path}", data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
