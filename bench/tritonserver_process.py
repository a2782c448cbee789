"""The real tritonserver as a child process for the benchmark scripts: started on given
ports, waited for until ready (its log's tail printed if it dies or times out), and
stopped on exit."""
import contextlib
import subprocess
import time

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
