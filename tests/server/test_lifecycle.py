"""50 load/unload cycles of bert_small with an inference after each load; server RSS must not grow.

bert_small (38 MB of weights, 2 encoder layers) is the model: each load builds a fresh ONNX Runtime
session over real weights (so a leaked session, arena or weight copy shows up as ~40+ MB per cycle),
and a load + inference + unload cycle takes ~1 s on 2 cores, keeping the test well under 2 minutes.
resnet50 would take ~2.5x longer per cycle for the same signal.
"""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from conftest import module_server
from export_models import example_inputs, run_onnxruntime
from tritonserver_harness import ModelRepo, infer, make_client

MODEL = "bert_small"
CYCLES = 50
CHECKPOINTS = (1, 10, 25, 50)
# How RSS is measured. With glibc's default allocator the server's RSS after an unload says little
# about leaks: (1) every load starts a new ONNX Runtime session with new intra-op threads and glibc
# gives new threads new malloc arenas (up to 8 x cores), which keep freed memory; (2) glibc's dynamic
# mmap threshold rises to the size of the largest freed mmapped block (up to 32 MiB), so after the
# first unload the weight buffers come from the heap and fragment it. Measured here (bert_small,
# 150-200 cycles, default allocator): 86 MiB (c1) -> 261 (c10) -> 297 (c50) -> ~370-430 MiB, going
# up AND down by 30-50 MiB steps, plateauing from about cycle 125 -- allocator caching, not a leak,
# and far too noisy for a 10 -> 50 comparison. With a fixed mmap threshold (1 MiB: large buffers are
# always mmapped and given back on free) and 2 arenas, the same runs are flat: 73.3 -> 74.1 MiB and
# 68.3 -> 69.0 MiB from cycle 10 to 50 (72-74 MiB at cycle 150). Any real leak (memory never freed)
# still shows in full under these settings, so the test uses them.
SERVER_ENV = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "1048576"}
# Allowed growth from cycle 10 to 50: 10 MiB. Cycles 1..10 absorb one-time growth (ORT's per-process
# state, thread stacks, Triton's pools being touched). Observed 10 -> 50 growth is < 1 MiB; leaking
# the model's weights (38 MB) even once, or 250 KB per cycle (e.g. a session's small objects), in
# 40 cycles exceeds 10 MiB.
MAX_GROWTH_BYTES = 10 * 1024 * 1024


@pytest.fixture(scope="module")
def repo(tmp_path_factory, example_models):
    r = ModelRepo(str(tmp_path_factory.mktemp("lifecycle-repo")))
    r.add_example(MODEL)
    return r


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, repo):
    return module_server(request, tmp_path_factory, repo, "--model-control-mode=explicit", env=SERVER_ENV)


def test_load_unload_cycles(server, repo):
    feeds = example_inputs(MODEL, 1, seed=50)
    expected = run_onnxruntime(repo.model_file(MODEL), feeds)
    client = make_client(server, "grpc")
    rss = {}
    t0 = time.monotonic()
    for cycle in range(1, CYCLES + 1):
        r = server.load(MODEL)
        assert r.status_code == 200, f"cycle {cycle}: load failed: {r.text}"
        assert server.model_ready(MODEL)
        got = infer(client, "grpc", MODEL, feeds, ["output__0", "output__1"])
        for name, exp in expected.items():
            diff = float(np.max(np.abs(got[name] - exp)))
            assert diff <= 1e-4, f"cycle {cycle}: {name} max abs diff {diff}"
        r = server.unload(MODEL)
        assert r.status_code == 200, f"cycle {cycle}: unload failed: {r.text}"
        # unload returns before the instance is gone; wait for it so RSS reflects the unloaded state
        server.wait_unloaded(MODEL)
        assert server.alive(), f"server died in cycle {cycle}"
        if cycle in CHECKPOINTS:
            rss[cycle] = server.rss_bytes()
            print(f"\n[lifecycle] cycle {cycle:2d}: server RSS {rss[cycle] / 2**20:8.1f} MiB "
                  f"({time.monotonic() - t0:.1f} s)", end="")
    growth = rss[50] - rss[10]
    print(f"\n[lifecycle] RSS growth cycle 10 -> 50: {growth / 2**20:+.1f} MiB "
          f"({100.0 * growth / rss[10]:+.2f}%); cycle 1 -> 50: {(rss[50] - rss[1]) / 2**20:+.1f} MiB")
    assert growth < MAX_GROWTH_BYTES, f"server RSS grew {growth / 2**20:.1f} MiB over 40 load/unload cycles"
    assert "panicked" not in server.log_text()


def test_kind_model_instance_is_refused_at_load(repo, server):
    """KIND_MODEL asks the backend to place instances itself; ours places none, so it says so."""
    with open(repo.model_file(MODEL), "rb") as f:
        body = f.read()
    config = open(f"{repo.root}/{MODEL}/config.pbtxt").read()
    config = config.replace(f'name: "{MODEL}"', 'name: "kind_model"')
    config = re.sub(r"instance_group\s*\[.*?\]", "instance_group [ { count: 1 kind: KIND_MODEL } ]", config, flags=re.S) \
        if "instance_group" in config else config + "\ninstance_group [ { count: 1 kind: KIND_MODEL } ]\n"
    repo.add_raw("kind_model", body, config)
    r = server.load("kind_model")
    assert r.status_code == 400, r.text
    assert "KIND_MODEL is not supported" in r.json()["error"], r.text
    print(f"\n[lifecycle] KIND_MODEL refused at load: {r.json()['error'][:200]}")
    assert server.load(MODEL).status_code == 200, "the server goes on loading other models"
