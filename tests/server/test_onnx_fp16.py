"""An FP16 ONNX model (examples/export_models.py's `bert_small_fp16`) served with the config
bench/gpu/dense_perf.py writes for an online model on a GPU — CUDA graph buckets every few rows
(`graph_spec`), the same sizes as the dynamic batcher's preferred batch sizes, and
`model_warmup` for each bucket — here on a KIND_CPU instance: Triton accepts the config, the
warm-up runs through the backend at load, the graphs setting is said to apply to GPU
instances only, and the answers equal ONNX Runtime's own on the same file."""

from __future__ import annotations

import os
import sys

import numpy as np
import onnxruntime as ort

from tritonserver_harness import REPO_ROOT, ModelRepo, infer, make_client

sys.path.insert(0, os.path.join(REPO_ROOT, "examples"))
sys.path.insert(0, os.path.join(REPO_ROOT, "bench", "gpu"))
import dense_perf  # noqa: E402
import export_models  # noqa: E402

BUCKETS = [1, 2, 4, 8]


def config(name: str) -> str:
    """dense_perf's own config for an online model, on a CPU instance instead of GPU 0."""
    ins = [dense_perf.tensor(f"input__{i}", "TYPE_INT32", [384]) for i in range(3)]
    outs = [dense_perf.tensor(f"output__{i}", "TYPE_FP16", [384]) for i in range(2)]
    warm = dense_perf.warmup_block(BUCKETS, [(f"input__{i}", "TYPE_INT32", [384]) for i in range(3)], 2)
    text = dense_perf.config(name, 8, ins, outs, True, delay_us=200, count=1, engine="onnx", buckets=BUCKETS, warmup=warm)
    assert "kind: KIND_GPU gpus: [ 0 ]" in text
    return text.replace("kind: KIND_GPU gpus: [ 0 ]", "kind: KIND_CPU")


def test_fp16_onnx_with_graph_buckets_and_warmup(start_server, tmp_path):
    repo = ModelRepo(str(tmp_path / "repo"))
    path = os.path.join(repo.root, "bert_fp16", "1", "model.onnx")
    export_models.build_model("bert_small_fp16", path)
    repo.write_config("bert_fp16", config("bert_fp16"))
    srv = start_server(repo.root)
    log = srv.log_text()
    assert "optimization.cuda.graphs applies to KIND_GPU instances" in log
    feeds = export_models.example_inputs("bert_small", 3, seed=7)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    for protocol in ("http", "grpc"):
        got = infer(make_client(srv, protocol), protocol, "bert_fp16", feeds, ["output__0", "output__1"])
        for name, w in want.items():
            assert got[name].dtype == np.float16 and got[name].shape == w.shape
            diff = float(np.abs(got[name].astype(np.float32) - w.astype(np.float32)).max())
            print(f"\n[fp16 onnx] {protocol} {name}: max abs diff {diff:.2e} vs ONNX Runtime on the same file")
            assert diff <= 2e-3, (protocol, name, diff)
    stats = srv.http("GET", "/v2/models/bert_fp16/stats").json()["model_stats"][0]
    # model_warmup ran through the backend at load (Triton counts its rows, though not always
    # every one of them: 36 and 33 of 2 x 15 + 6 seen), then our 2 x 3 rows
    count = int(stats["inference_count"])
    print(f"[fp16 onnx] inference_count {count} (warm-up rows and our 6)")
    assert 6 < count <= 2 * sum(BUCKETS) + 6, stats
    assert srv.alive()
