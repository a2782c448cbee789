"""The README's "Using it" command, run as written on this checkout.

The bash block under "## Using it" is taken from README.md and run line by line in one bash
process from the repository root (set-up, build and export are idempotent, so on a set-up
checkout they return quickly); its last command starts the real tritonserver on the ports the
README names. The test then asks an ONNX model and a TorchScript model for an answer and checks
it against ONNX Runtime and libtorch run on the same files, and runs the README's client line.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PORTS = (8000, 8001, 8002)  # tritonserver's defaults, which the README's command keeps


def readme_section(title: str) -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, re.S | re.M)
    assert m, f"README.md has no '## {title}' section"
    return m.group(1)


def using_it_block() -> str:
    m = re.search(r"```bash\n(.*?)```", readme_section("Using it"), re.S)
    assert m, "README 'Using it' has no bash block"
    return m.group(1)


def client_line() -> str:
    m = re.search(r"`(source scripts/env\.sh && python examples/client\.py[^`]*)`",
                  readme_section("Using it"))
    assert m, "README 'Using it' names no client command"
    return m.group(1)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture(scope="module")
def readme_server(tmp_path_factory):
    busy = [p for p in PORTS if not port_free(p)]
    if busy:
        pytest.fail(f"ports {busy} are taken: the README's command serves on 8000-8002", pytrace=False)
    log_path = tmp_path_factory.mktemp("readme") / "server.log"
    log = open(log_path, "w")
    script = "set -euo pipefail\n" + using_it_block()
    proc = subprocess.Popen(["bash", "-c", script], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    import tritonclient.http as http

    client = http.InferenceServerClient("localhost:8000")
    deadline = time.time() + 1200  # a checkout that is not set up yet installs and builds first
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the README command ended (exit {proc.returncode}):\n"
                            + open(log_path).read()[-4000:], pytrace=False)
            try:
                if client.is_server_ready():
                    break
            except Exception:
                pass
            if time.time() > deadline:
                pytest.fail("the README's server was not ready in 20 minutes:\n"
                            + open(log_path).read()[-4000:], pytrace=False)
            time.sleep(1)
        yield client, log_path
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def resnet_input() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((1, 3, 224, 224), dtype=np.float32)


def infer(client, model: str, x: np.ndarray) -> np.ndarray:
    import tritonclient.http as http

    inp = http.InferInput("INPUT__0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp]).as_numpy("OUTPUT__0")


def test_every_example_model_is_served(readme_server):
    client, _ = readme_server
    names = {m["name"] for m in client.get_model_repository_index() if m.get("state") == "READY"}
    configs = {d for d in os.listdir(os.path.join(ROOT, "models"))
               if os.path.exists(os.path.join(ROOT, "models", d, "config.pbtxt"))}
    assert configs and configs <= names, f"not ready: {sorted(configs - names)}"
    said = re.search(r"serves\s+all (\d+) example models", readme_section("Using it"))
    assert said and int(said.group(1)) == len(configs), f"the README says {said and said.group(1)}, models/ holds {len(configs)}"


def test_onnx_model_answers_as_onnxruntime(readme_server):
    import onnxruntime as ort

    client, _ = readme_server
    x = resnet_input()
    got = infer(client, "resnet50", x)
    sess = ort.InferenceSession(os.path.join(ROOT, "models/resnet50/1/model.onnx"))
    want = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    assert got.shape == want.shape
    assert np.max(np.abs(got - want)) <= 1e-4, np.max(np.abs(got - want))


def test_torchscript_model_answers_as_libtorch(readme_server):
    import torch

    client, _ = readme_server
    x = resnet_input()
    got = infer(client, "resnet50_pt", x)
    module = torch.jit.load(os.path.join(ROOT, "models/resnet50_pt/1/model.pt")).eval()
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    assert got.shape == want.shape
    assert np.max(np.abs(got - want)) <= 1e-4, np.max(np.abs(got - want))


def test_readme_client_line(readme_server):
    out = subprocess.run(["bash", "-c", "set -e\n" + client_line()], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout + out.stderr
    print(out.stdout)


def test_dlrm_v3_client_answers_as_the_reference(readme_server):
    """The README's DLRM-v3 client: requests of mixed history lengths sent at once, each answer
    within its tolerance of the reference rebuilt from the example's seed (it exits 1 otherwise)."""
    assert "python examples/dlrm_v3/client.py" in readme_section("Using it")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "dlrm_v3", "client.py")], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout + out.stderr
    print(out.stdout)
