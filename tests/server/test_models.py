"""Served outputs equal ONNX Runtime's own Python results, over HTTP and gRPC; config auto-complete."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from conftest import module_server
from export_models import example_inputs, run_onnxruntime
from tritonserver_harness import ModelRepo, infer, make_client

PROTOCOLS = ["http", "grpc"]
TOLERANCE = 1e-4

AUTO_CFG = 'name: "simple_auto"\nbackend: "rust"\n'

OUTPUTS = {"resnet50": ["OUTPUT__0"], "bert_small": ["output__0", "output__1"]}


@pytest.fixture(scope="module")
def repo(tmp_path_factory, example_models):
    r = ModelRepo(str(tmp_path_factory.mktemp("models-repo")))
    r.add_example("resnet50")
    r.add_example("bert_small")
    r.add_built("simple_auto", "simple", AUTO_CFG)
    return r


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, repo):
    return module_server(request, tmp_path_factory, repo)


@functools.lru_cache(maxsize=None)
def reference(model_file: str, model: str, batch: int, seed: int):
    feeds = example_inputs(model, batch, seed)
    return feeds, run_onnxruntime(model_file, feeds)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model,batch", [("resnet50", 1), ("resnet50", 3), ("bert_small", 2)])
def test_matches_onnxruntime(server, repo, protocol, model, batch):
    feeds, expected = reference(repo.model_file(model), model, batch, 7 + batch)
    client = make_client(server, protocol, network_timeout=300.0) if protocol == "http" else make_client(server, protocol)
    got = infer(client, protocol, model, feeds, OUTPUTS[model],
                **({"client_timeout": 300} if protocol == "grpc" else {}))
    for name in OUTPUTS[model]:
        assert got[name].shape == expected[name].shape, (name, got[name].shape, expected[name].shape)
        assert got[name].dtype == np.float32
        diff = float(np.max(np.abs(got[name].astype(np.float64) - expected[name])))
        print(f"\n[{model} batch {batch} {protocol}] {name}: max abs diff vs onnxruntime = {diff:.3e}")
        assert np.isfinite(got[name]).all()
        assert diff <= TOLERANCE, f"{model}/{name}: max abs diff {diff} > {TOLERANCE}"
    if batch > 1:  # rows must differ: a batch that repeats row 0 would still match a bad reference
        first = OUTPUTS[model][0]
        assert not np.allclose(got[first][0], got[first][1])


def test_autocomplete_config(server):
    r = server.http("GET", "/v2/models/simple_auto/config")
    assert r.status_code == 200, r.text
    cfg = r.json()
    print(f"\n[auto-complete] config: max_batch_size={cfg.get('max_batch_size')} "
          f"inputs={[(i['name'], i['data_type'], i['dims']) for i in cfg.get('input', [])]} "
          f"outputs={[(o['name'], o['data_type'], o['dims']) for o in cfg.get('output', [])]} "
          f"dynamic_batching={'dynamic_batching' in cfg}")
    assert cfg["max_batch_size"] == 4
    ins = {i["name"]: i for i in cfg["input"]}
    outs = {o["name"]: o for o in cfg["output"]}
    assert set(ins) == {"INPUT0", "INPUT1"}
    assert set(outs) == {"OUTPUT0", "OUTPUT1"}
    for t in list(ins.values()) + list(outs.values()):
        assert t["data_type"] == "TYPE_FP32", t
        assert [int(d) for d in t["dims"]] == [16], t
    assert "dynamic_batching" in cfg


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_autocompleted_model_serves(server, protocol):
    feeds = example_inputs("simple", 3, seed=11)
    client = make_client(server, protocol)
    got = infer(client, protocol, "simple_auto", feeds, ["OUTPUT0", "OUTPUT1"])
    np.testing.assert_allclose(got["OUTPUT0"], feeds["INPUT0"] + feeds["INPUT1"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(got["OUTPUT1"], feeds["INPUT0"] * feeds["INPUT1"], rtol=1e-6, atol=1e-6)
    # batch 5 is above the auto-completed max_batch_size 4: Triton core rejects it
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as ei:
        infer(client, protocol, "simple_auto", example_inputs("simple", 5), ["OUTPUT0"])
    print(f"\n[auto-complete {protocol}] batch 5 -> {ei.value.message()}")
    assert "4" in ei.value.message()
