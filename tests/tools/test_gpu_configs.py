"""The GPU example repository (models_gpu/): every config parses with Triton's own model-config
schema (tritonclient's model_config_pb2), is served by this backend on KIND_GPU instances of
GPU 0, declares the same inputs, outputs and max_batch_size as the model of the same name in
models/ (for dlrm, served as one recommender model, the ensemble models/dlrm), uses only
parameters the docs describe, and asks for CUDA graphs only at batch sizes it can form."""
import glob
import os
import re

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
GPU_DIR = os.path.join(ROOT, "models_gpu")
CPU_DIR = os.path.join(ROOT, "models")
EXPECTED = {"resnet50_pt", "bert_large_pt", "fastpitch", "resnet50", "dlrm", "dlrm_sparse"}
# engines whose instances run CUDA graphs (the embedding store has none)
GRAPH_ENGINES = {"torch", "onnx", "recommender"}


def load(path):
    with open(path) as f:
        return text_format.Parse(f.read(), model_config_pb2.ModelConfig())


def gpu_names():
    return sorted(os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(GPU_DIR, "*", "config.pbtxt")))


def documented_keys():
    """Every `backticked` word of README.md and docs/*.md."""
    text = ""
    for path in [os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "docs", "*.md"))]:
        with open(path) as f:
            text += f.read()
    return set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", text))


def tensors(ios):
    return [(t.name, model_config_pb2.DataType.Name(t.data_type), list(t.dims)) for t in ios]


def test_the_repository_holds_the_gpu_examples():
    assert set(gpu_names()) == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_served_by_this_backend_on_gpu_0(name):
    path = os.path.join(GPU_DIR, name, "config.pbtxt")
    cfg = load(path)
    assert cfg.name == name
    assert cfg.backend == "rust"
    assert cfg.instance_group, f"{name}: no instance_group"
    for group in cfg.instance_group:
        assert group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU, f"{name}: {group}"
        assert list(group.gpus) == [0], f"{name}: {group}"
    with open(path) as f:
        head = f.read().split("\n", 2)[:2]
    assert all(line.startswith("# ") for line in head), f"{name}: starts without its comment"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_same_interface_as_models(name):
    """What clients send and get is what the CPU repository's model of that name declares."""
    gpu = load(os.path.join(GPU_DIR, name, "config.pbtxt"))
    cpu = load(os.path.join(CPU_DIR, name, "config.pbtxt"))
    assert gpu.max_batch_size == cpu.max_batch_size
    assert tensors(gpu.input) == tensors(cpu.input)
    assert tensors(gpu.output) == tensors(cpu.output)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_parameters_are_documented(name):
    keys = set(load(os.path.join(GPU_DIR, name, "config.pbtxt")).parameters)
    assert "engine" in keys, f"{name}: no engine parameter"
    missing = keys - documented_keys()
    assert not missing, f"{name}: parameters {sorted(missing)} are described in neither README.md nor docs/*.md"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_graphs_and_batches_fit(name):
    cfg = load(os.path.join(GPU_DIR, name, "config.pbtxt"))
    engine = cfg.parameters["engine"].string_value
    cuda = cfg.optimization.cuda
    sizes = [s.batch_size for s in cuda.graph_spec]
    if name == "fastpitch" or engine not in GRAPH_ENGINES:
        assert not cuda.graphs and not sizes, f"{name}: CUDA graphs asked of a model that cannot replay them"
    if cuda.graphs:
        assert sizes == sorted(set(sizes)), f"{name}: graph_spec batch sizes not increasing: {sizes}"
        assert all(0 < s <= cfg.max_batch_size for s in sizes), f"{name}: graph_spec {sizes}"
    else:
        assert not sizes, f"{name}: graph_spec without graphs: true"
    preferred = list(cfg.dynamic_batching.preferred_batch_size)
    assert all(0 < b <= cfg.max_batch_size for b in preferred), f"{name}: preferred_batch_size {preferred}"
    if sizes and preferred:
        # a preferred batch that no graph bucket holds would run eagerly
        assert all(b <= sizes[-1] for b in preferred), f"{name}: preferred {preferred} past the graphs {sizes}"


def test_the_recommender_and_its_store_share_one_store():
    one = load(os.path.join(GPU_DIR, "dlrm", "config.pbtxt")).parameters
    sparse = load(os.path.join(GPU_DIR, "dlrm_sparse", "config.pbtxt")).parameters
    assert one["engine"].string_value == "recommender"
    assert sparse["engine"].string_value == "embedding"
    # models sharing a store_name must list the same tables and dims (the store refuses otherwise)
    for key in ("store_name", "embedding_table_names", "embedding_vecsize_per_table", "gpucacheper",
                "gpucache_allocation"):
        assert one[key].string_value == sparse[key].string_value, key
    assert sparse["gpucache_allocation"].string_value == "store"
