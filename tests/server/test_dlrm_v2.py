"""MLPerf's DLRM-v2 (multi-hot, sum-pooled) served as one recommender model through the real
tritonserver, against the PyTorch reference (examples/dlrm_v2.py: EmbeddingBag per table and the
DCNv2 network) at a small scale: MLPerf's 26 tables, hotness and network, 2,059 rows."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

from conftest import module_server
from tritonserver_harness import ModelRepo, error_status, fire_grpc, infer, make_client

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import dlrm_v2  # noqa: E402

SCALE = 1e-5


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    r = ModelRepo(str(tmp_path_factory.mktemp("dlrm-v2-repo")))
    dlrm_v2.export(r.root, SCALE, max_batch=256)
    dlrm_v2.ensemble(r.root, max_batch=256)
    # the same model taking TorchRec's values and lengths (ragged keys)
    os.makedirs(os.path.join(r.root, "dlrm_v2_ragged"))
    os.symlink(os.path.join(r.root, "dlrm_v2", "1"), os.path.join(r.root, "dlrm_v2_ragged", "1"))
    r.write_config("dlrm_v2_ragged", dlrm_v2.config("dlrm_v2_ragged", 256, ragged=True).replace(
        "max_queue_delay_microseconds: 100", "max_queue_delay_microseconds: 100000"))
    return r


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, repo):
    return module_server(request, tmp_path_factory, repo)


@pytest.fixture(scope="module")
def reference(repo):
    return dlrm_v2.load_reference(os.path.join(repo.root, "dlrm_v2", "1"))


def predict(model, dense, sparse):
    with torch.no_grad():
        return model(torch.from_numpy(dense), torch.from_numpy(sparse)).numpy()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_served_equal_to_the_pytorch_reference(server, reference, protocol):
    rows = dlrm_v2.scaled_rows(SCALE)
    client = make_client(server, protocol)
    for seed, batch in enumerate((1, 7, 64)):
        dense, sparse = dlrm_v2.sample_inputs(batch, rows, seed=seed)
        got = infer(client, protocol, "dlrm_v2", {"dense": dense, "sparse": sparse}, ["prediction"])["prediction"]
        want = predict(reference, dense, sparse)
        assert got.shape == (batch, 1)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{protocol} batch {batch}")
        print(f"\n[dlrm_v2] {protocol} batch {batch}: max |served - torch| {np.abs(got - want).max():.2e}, "
              f"predictions {want.min():.3f}..{want.max():.3f}")
    client.close()


def test_the_one_model_equals_its_ensemble_form(server, reference):
    """The recommender as one model against the same lookup and network as a Triton ensemble
    (the embedding engine's pooled interface, then the ONNX network): the same predictions."""
    rows = dlrm_v2.scaled_rows(SCALE)
    client = make_client(server, "grpc")
    for seed, batch in enumerate((1, 9, 200)):
        dense, sparse = dlrm_v2.sample_inputs(batch, rows, seed=40 + seed)
        one = infer(client, "grpc", "dlrm_v2", {"dense": dense, "sparse": sparse}, ["prediction"])["prediction"]
        ens = infer(client, "grpc", "dlrm_v2_ensemble", {"dense": dense, "sparse": sparse}, ["prediction"])["prediction"]
        np.testing.assert_allclose(one, ens, rtol=1e-6, atol=1e-7, err_msg=f"batch {batch}")
        np.testing.assert_allclose(one, predict(reference, dense, sparse), rtol=1e-4, atol=1e-5)
        print(f"\n[dlrm_v2] batch {batch}: max |one model - ensemble| {np.abs(one - ens).max():.2e}")
    client.close()


def test_requests_batch_together_and_a_bad_key_fails_alone(server, reference):
    rows = dlrm_v2.scaled_rows(SCALE)
    payloads = [dlrm_v2.sample_inputs(1 + i % 4, rows, seed=100 + i) for i in range(16)]
    negative = payloads[6][1].copy()
    negative[0, 2] = -3
    payloads[6] = (payloads[6][0], negative)
    before = server.stats("dlrm_v2")
    results = fire_grpc(server, "dlrm_v2", None, [{"dense": d, "sparse": s} for d, s in payloads], "prediction")
    for i, (out, err) in enumerate(results):
        if i == 6:
            assert err is not None and "INVALID_ARGUMENT" in error_status(err), err
            assert "input 'sparse': key -3 at element 2 is negative" in str(err), str(err)
        else:
            assert err is None, f"request {i}: {err}"
            np.testing.assert_allclose(out, predict(reference, *payloads[i]), rtol=1e-4, atol=1e-5)
    executions = int(server.stats_after("dlrm_v2", before, len(payloads))["execution_count"]) - int(before["execution_count"])
    print(f"\n[dlrm_v2] {len(payloads)} concurrent requests ran in {executions} executions")
    assert executions < len(payloads), f"the dynamic batcher merged nothing: {executions} executions"


def test_ragged_keys_answer_as_the_padded_form_batched_together_a_bad_length_alone(server, reference):
    """TorchRec's values and lengths (each sample's bags one after the other, `lengths` [26]):
    requests of different lengths batch together and answer as the padded form does; one whose
    lengths do not add up to its keys fails alone, naming the input."""
    rows = dlrm_v2.scaled_rows(SCALE)
    dense, sparse = dlrm_v2.sample_inputs(12, rows, seed=300, full=0.5)
    client = make_client(server, "grpc")
    padded = infer(client, "grpc", "dlrm_v2", {"dense": dense, "sparse": sparse}, ["prediction"])["prediction"]
    requests = []
    for b in range(len(dense)):
        values, lengths = dlrm_v2.ragged_inputs(sparse[b:b + 1])
        requests.append({"dense": dense[b:b + 1], "sparse": values[None, :], "lengths": lengths})
    sizes = sorted({r["sparse"].shape[1] for r in requests})
    assert len(sizes) > 6, f"the samples should differ in length: {sizes}"
    bad = dict(requests[4])
    bad["lengths"] = bad["lengths"].copy()
    bad["lengths"][0, 3] += 2
    requests.append(bad)
    # a negative key: refused where the batch's keys are read, the rest of the batch answered
    negative = dict(requests[7])
    negative["sparse"] = negative["sparse"].copy()
    negative["sparse"][0, 1] = -4
    requests.append(negative)
    client.close()
    before = server.stats("dlrm_v2_ragged")
    results = fire_grpc(server, "dlrm_v2_ragged", None, requests, "prediction")
    for i, (out, err) in enumerate(results):
        if i == len(requests) - 2:
            assert err is not None and "INVALID_ARGUMENT" in error_status(err), err
            assert "input 'lengths'" in str(err), str(err)
            continue
        if i == len(requests) - 1:
            assert err is not None and "INVALID_ARGUMENT" in error_status(err), err
            assert "input 'sparse': key -4 at element 1 is negative" in str(err), str(err)
            continue
        assert err is None, f"request {i}: {err}"
        np.testing.assert_allclose(out, padded[i:i + 1], rtol=1e-6, atol=1e-7, err_msg=f"sample {i}")
    np.testing.assert_allclose(padded, predict(reference, dense, sparse), rtol=1e-4, atol=1e-5)
    executions = (int(server.stats_after("dlrm_v2_ragged", before, len(requests) - 1)["execution_count"])
                  - int(before["execution_count"]))
    print(f"\n[dlrm_v2] {len(requests)} ragged requests ({sizes[0]}..{sizes[-1]} keys) ran in {executions} executions; "
          f"the bad ones: {str(results[len(requests) - 2][1])[:160]}; {str(results[len(requests) - 1][1])[:160]}")
    assert executions < len(requests) - 1, f"the dynamic batcher merged nothing: {executions} executions"
