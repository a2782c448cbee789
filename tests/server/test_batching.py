"""Dynamic batching: concurrent requests are merged, each answered with its own data; one bad
request in a merged batch fails alone."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from conftest import module_server
from tritonserver_harness import ModelRepo, make_client, make_inputs
from tritonserver_harness import fire_grpc as harness_fire_grpc

N_REQUESTS = 64

# identity with reject_nonfinite, one instance and a long queue delay so that concurrent requests
# are reliably merged into the same execution (which the test checks through the statistics).
STRICT_CFG = """name: "identity_strict"
backend: "rust"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
dynamic_batching { max_queue_delay_microseconds: 200000 }
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "reject_nonfinite" value { string_value: "true" } }
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory, example_models):
    r = ModelRepo(str(tmp_path_factory.mktemp("batching-repo")))
    r.add_example("identity")
    r.add_built("identity_strict", "identity", STRICT_CFG)
    return r


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, repo):
    return module_server(request, tmp_path_factory, repo)


def counts(stats: dict) -> dict:
    s = stats["inference_stats"]
    return {
        "inference_count": int(stats["inference_count"]),
        "execution_count": int(stats["execution_count"]),
        "success": int(s["success"]["count"]),
        "fail": int(s["fail"]["count"]),
        "queue": int(s["queue"]["count"]),
        "compute_input": int(s["compute_input"]["count"]),
        "compute_infer": int(s["compute_infer"]["count"]),
        "compute_output": int(s["compute_output"]["count"]),
        "batch_sizes": {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", [])},
    }


def delta(after: dict, before: dict) -> dict:
    d = {k: after[k] - before[k] for k in after if k != "batch_sizes"}
    d["batch_sizes"] = {b: n - before["batch_sizes"].get(b, 0) for b, n in after["batch_sizes"].items()
                        if n - before["batch_sizes"].get(b, 0)}
    return d


def fire_grpc(server, model, payloads):
    return harness_fire_grpc(server, model, "INPUT0", payloads)


def fire_http_threads(server, model, payloads):
    """One thread and one HTTP client per payload, released together by a barrier."""
    results = [None] * len(payloads)
    barrier = threading.Barrier(len(payloads))

    def worker(i, x):
        client = make_client(server, "http")
        barrier.wait()
        try:
            r = client.infer(model, make_inputs("http", {"INPUT0": x}))
            results[i] = (r.as_numpy("OUTPUT0"), None)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            results[i] = (None, e)
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(i, x)) for i, x in enumerate(payloads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


FIRE = {"grpc": fire_grpc, "http": fire_http_threads}


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_concurrent_requests_are_batched(server, protocol):
    rng = np.random.default_rng(64)
    # distinct data per request (row count 1 or 2 so merged batches mix request sizes)
    payloads = [rng.standard_normal((1 + i % 2, 16), dtype=np.float32) + 1000 * i for i in range(N_REQUESTS)]
    raw_before = server.stats("identity")
    before = counts(raw_before)
    results = FIRE[protocol](server, "identity", payloads)
    for i, (out, err) in enumerate(results):
        assert err is None, f"request {i} failed: {err}"
        np.testing.assert_array_equal(out, payloads[i], err_msg=f"request {i} got another request's data")
    d = delta(counts(server.stats_after("identity", raw_before, N_REQUESTS)), before)
    rows = sum(len(p) for p in payloads)
    print(f"\n[identity {protocol}] {N_REQUESTS} requests ({rows} rows): inference_count={d['inference_count']} "
          f"execution_count={d['execution_count']} success={d['success']} queue={d['queue']} "
          f"compute_input={d['compute_input']} compute_infer={d['compute_infer']} "
          f"compute_output={d['compute_output']} batch sizes (size: executions)={d['batch_sizes']}")
    assert d["inference_count"] == rows
    assert d["success"] == N_REQUESTS
    assert d["execution_count"] < d["inference_count"], "the dynamic batcher merged nothing"
    assert d["compute_input"] > 0 and d["compute_infer"] > 0 and d["compute_output"] > 0
    assert d["fail"] == 0


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_one_bad_request_fails_alone(server, protocol):
    rng = np.random.default_rng(5)
    n, bad = 16, {5, 11}
    payloads = [rng.standard_normal((1, 16), dtype=np.float32) + 100 * i for i in range(n)]
    payloads[5][0, 7] = np.nan
    payloads[11][0, 0] = np.inf
    raw_before = server.stats("identity_strict")
    before = counts(raw_before)
    results = FIRE[protocol](server, "identity_strict", payloads)
    d = delta(counts(server.stats_after("identity_strict", raw_before, n)), before)
    for i, (out, err) in enumerate(results):
        if i in bad:
            assert err is not None, f"request {i} holds a non-finite value but succeeded"
            print(f"\n[identity_strict {protocol}] request {i}: {err.status()} {err.message()}")
            assert "INPUT0" in err.message() and "NaN or infinite" in err.message()
            assert f"element {7 if i == 5 else 0}" in err.message()
        else:
            assert err is None, f"good request {i} failed because of a bad neighbour: {err}"
            np.testing.assert_array_equal(out, payloads[i])
    print(f"[identity_strict {protocol}] stats delta: {d}")
    # the good and bad requests really shared executions
    assert d["execution_count"] < n, f"requests were not batched together ({d}), the case proves nothing"
    assert d["success"] == n - len(bad)
    assert d["fail"] == len(bad)
