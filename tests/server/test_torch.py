"""The TorchScript engine (libtriton_rust_torch.so) through the real tritonserver: outputs equal
torch's own CPU results, FastPitch items are the same batched or alone, and a server without
libtorch still serves ONNX models while a TorchScript model fails to load, saying what it needs."""
import os
import sys
import threading

import numpy as np
import pytest
import torch

from tritonserver_harness import REPO_ROOT, ModelRepo, make_client, infer

sys.path.insert(0, os.path.join(REPO_ROOT, "examples"))
import torch_models  # noqa: E402

PT_MODELS = ("fastpitch", "resnet50_pt", "bert_small_pt")
FP_OUTPUTS = ["OUTPUT__0", "OUTPUT__1", "OUTPUT__2", "OUTPUT__3"]


@pytest.fixture(scope="module")
def torch_repo(tmp_path_factory, example_models):
    for name in PT_MODELS:
        if not os.path.exists(os.path.join(example_models, name, "1", "model.pt")):
            torch_models.export(example_models, name)
    repo = ModelRepo(str(tmp_path_factory.mktemp("torch-repo")))
    for name in PT_MODELS:
        repo.add_example(name)
    repo.add_example("identity")
    return repo


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, torch_repo):
    from conftest import module_server
    return module_server(request, tmp_path_factory, torch_repo)


def reference(name, *inputs):
    model = torch_models.make(name)
    with torch.no_grad():
        out = model(*[torch.from_numpy(x) for x in inputs])
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_resnet50_and_bert_equal_torch(server, protocol):
    client = make_client(server, protocol)
    x = np.random.default_rng(1).standard_normal((2, 3, 224, 224)).astype(np.float32)
    got = infer(client, protocol, "resnet50_pt", {"INPUT__0": x}, ["OUTPUT__0"])["OUTPUT__0"]
    diff = float(np.abs(got - reference("resnet50_pt", x)[0]).max())
    print(f"\nresnet50_pt ({protocol}) max abs diff vs torch: {diff:.3e}")
    assert diff <= 1e-4

    rng = np.random.default_rng(2)
    ids = rng.integers(1, 30522, (2, 384)).astype(np.int32)
    seg = np.zeros((2, 384), np.int32)
    seg[:, 200:] = 1
    mask = np.ones((2, 384), np.int32)
    mask[1, 300:] = 0
    got = infer(client, protocol, "bert_small_pt", {"input__0": ids, "input__1": seg, "input__2": mask},
                ["output__0", "output__1"])
    ref = reference("bert_small_pt", ids, seg, mask)
    for i, name in enumerate(["output__0", "output__1"]):
        diff = float(np.abs(got[name] - ref[i]).max())
        print(f"bert_small_pt {name} ({protocol}) max abs diff vs torch: {diff:.3e}")
        assert diff <= 1e-4


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_fastpitch_equals_torch(server, protocol):
    client = make_client(server, protocol)
    ids = torch_models.fastpitch_inputs(3, seed=11, max_len=48).numpy()
    got = infer(client, protocol, "fastpitch", {"INPUT__0": ids}, FP_OUTPUTS)
    ref = reference("fastpitch", ids)
    for i, name in enumerate(FP_OUTPUTS):
        assert got[name].shape == ref[i].shape, name
        diff = float(np.abs(got[name].astype(np.float64) - ref[i]).max())
        print(f"\nfastpitch {name} {got[name].shape} ({protocol}) max abs diff vs torch: {diff:.3e}")
        assert diff <= 1e-4


def test_fastpitch_batched_equals_alone(server):
    """Items of different lengths, merged by the dynamic batcher, come back as they do alone."""
    ids = torch_models.fastpitch_inputs(6, seed=21, min_len=8, max_len=64).numpy()
    client = make_client(server, "grpc")
    alone = [infer(client, "grpc", "fastpitch", {"INPUT__0": ids[i:i + 1]}, FP_OUTPUTS) for i in range(len(ids))]
    before = server.stats("fastpitch")
    together = [None] * len(ids)

    def send(i):
        together[i] = infer(make_client(server, "grpc"), "grpc", "fastpitch", {"INPUT__0": ids[i:i + 1]}, FP_OUTPUTS)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(ids))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = server.stats_after("fastpitch", before, len(ids))
    runs = after["execution_count"] - before["execution_count"]
    print(f"\n{len(ids)} concurrent requests ran in {runs} executions")
    worst = 0.0
    for i in range(len(ids)):
        a, b = alone[i], together[i]
        n = int(a["OUTPUT__1"][0, 0])
        assert int(b["OUTPUT__1"][0, 0]) == n, f"item {i}: mel length {b['OUTPUT__1']} vs {n} alone"
        assert a["OUTPUT__0"].shape[2] == n
        worst = max(worst, float(np.abs(b["OUTPUT__0"][0, :, :n] - a["OUTPUT__0"][0]).max()))
        assert not np.any(b["OUTPUT__0"][0, :, n:]), f"item {i}: frames past its length must be zero"
        for name in ("OUTPUT__2", "OUTPUT__3"):
            worst = max(worst, float(np.abs(b[name] - a[name]).max()))
    print(f"max abs diff batched vs alone: {worst:.3e}")
    assert worst <= 1e-4


def test_without_libtorch_onnx_serves_and_torchscript_fails_clearly(start_server, torch_repo):
    env = {"LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", "").replace(os.environ.get("LIBTORCH_DIR", "@@"), ""),
           "TRITON_RUST_LIBTORCH_DIR": ""}
    srv = start_server(torch_repo.root, "--model-control-mode=explicit", "--load-model=identity",
                       libtorch=False, env=env)
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    client = make_client(srv, "http")
    assert np.array_equal(infer(client, "http", "identity", {"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"], x)
    r = srv.http("POST", "/v2/repository/models/fastpitch/load")
    msg = r.json().get("error", "")
    print(f"\nfastpitch without libtorch: {r.status_code} {msg}")
    assert r.status_code == 400
    assert "libtorch 2.11.0" in msg and "libtorch-dir" in msg
    assert not srv.model_ready("fastpitch")
    assert np.array_equal(infer(client, "http", "identity", {"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"], x)
    assert srv.alive()


def test_pytorch_backend_parameters_and_cuda_graph_settings(start_server, torch_repo, tmp_path):
    """Triton's PyTorch-backend parameters are honoured; `optimization.cuda.graphs` on a
    KIND_CPU instance is said in the log and the model serves as usual; a graph_spec batch
    size past max_batch_size fails that model's load, naming it, and the server goes on; so
    does TORCH_FUSION_STRATEGY misspelt, and on a KIND_CPU instance (it is set through the GPU
    helper library)."""
    with open(os.path.join(REPO_ROOT, "models", "bert_small_pt", "config.pbtxt")) as f:
        base = f.read()

    def variant(name, graph_batch, profiling="false", fusion=None):
        return (base.replace('name: "bert_small_pt"', f'name: "{name}"')
                + (f'parameters {{ key: "TORCH_FUSION_STRATEGY" value {{ string_value: "{fusion}" }} }}\n' if fusion else "")
                + f'optimization {{ cuda {{ graphs: true graph_spec [ {{ batch_size: {graph_batch} }} ] }} }}\n'
                + 'parameters { key: "DISABLE_OPTIMIZED_EXECUTION" value { string_value: "true" } }\n'
                + 'parameters { key: "ENABLE_TENSOR_FUSER" value { string_value: "false" } }\n'
                + f'parameters {{ key: "ENABLE_JIT_PROFILING" value {{ string_value: "{profiling}" }} }}\n')
    repo = ModelRepo(str(tmp_path / "repo"))
    repo.add_example("bert_small_pt", as_name="bert_opts", config=variant("bert_opts", 4))
    repo.add_example("bert_small_pt", as_name="bert_bad_graphs", config=variant("bert_bad_graphs", 99))
    repo.add_example("bert_small_pt", as_name="bert_bad_profiling", config=variant("bert_bad_profiling", 4, "maybe"))
    repo.add_example("bert_small_pt", as_name="bert_bad_fusion", config=variant("bert_bad_fusion", 4, fusion="STATIC:many"))
    repo.add_example("bert_small_pt", as_name="bert_cpu_fusion", config=variant("bert_cpu_fusion", 4, fusion="STATIC:20"))
    srv = start_server(repo.root, "--model-control-mode=explicit", "--load-model=bert_opts")
    rng = np.random.default_rng(3)
    ids = rng.integers(1, 30522, (3, 384)).astype(np.int32)
    seg = np.zeros((3, 384), np.int32)
    mask = np.ones((3, 384), np.int32)
    client = make_client(srv, "http")
    got = infer(client, "http", "bert_opts", {"input__0": ids, "input__1": seg, "input__2": mask}, ["output__0", "output__1"])
    ref = reference("bert_small_pt", ids, seg, mask)
    for i, name in enumerate(["output__0", "output__1"]):
        assert float(np.abs(got[name] - ref[i]).max()) <= 1e-4
    assert "optimization.cuda.graphs applies to KIND_GPU instances" in srv.log_text()
    r = srv.load("bert_bad_graphs")
    msg = r.json().get("error", "")
    print(f"\nbad graph_spec: {r.status_code} {msg}")
    assert r.status_code == 400 and "graph_spec batch_size 99 is outside 1..=16" in msg
    r = srv.load("bert_bad_profiling")
    msg = r.json().get("error", "")
    print(f"bad ENABLE_JIT_PROFILING: {r.status_code} {msg}")
    assert r.status_code == 400 and "ENABLE_JIT_PROFILING" in msg
    r = srv.load("bert_bad_fusion")
    msg = r.json().get("error", "")
    print(f"bad TORCH_FUSION_STRATEGY: {r.status_code} {msg}")
    assert r.status_code == 400 and "TORCH_FUSION_STRATEGY" in msg and "'many' is not a count" in msg
    r = srv.load("bert_cpu_fusion")
    msg = r.json().get("error", "")
    print(f"TORCH_FUSION_STRATEGY on KIND_CPU: {r.status_code} {msg}")
    assert r.status_code == 400 and "TORCH_FUSION_STRATEGY" in msg and "KIND_GPU instances only" in msg
    assert srv.alive() and srv.model_ready("bert_opts")
