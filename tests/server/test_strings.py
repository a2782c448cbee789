"""String (BYTES) tensors through the real tritonserver and the ONNX engine (issue 29).

A scikit-learn pipeline exported by skl2onnx (string and float inputs, a string label out) and a
strings-in, strings-out LabelEncoder model, both auto-configured, answered batched over HTTP and
gRPC and compared with ONNX Runtime's Python results; malformed string bodies get a 400 that
names the input while the rest of the batch is answered.
"""

from __future__ import annotations

import json
import os
import sys
import threading

import numpy as np
import onnxruntime as ort
import pytest
import requests

from conftest import module_server
from tritonserver_harness import REPO_ROOT, ModelRepo, make_client, client_module

sys.path.insert(0, os.path.join(REPO_ROOT, "examples"))
import string_models  # noqa: E402

BATCHED = "max_batch_size: 16\ndynamic_batching { max_queue_delay_microseconds: 50000 }\n"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("string-models"))
    string_models.write_all(out)
    return out


@pytest.fixture(scope="module")
def repo(tmp_path_factory, example_models, models):
    r = ModelRepo(str(tmp_path_factory.mktemp("strings")))
    for name in ("spam_pipeline", "word_map"):
        with open(os.path.join(models, name + ".onnx"), "rb") as f:
            r.add_raw(name, f.read(), f'name: "{name}"\nbackend: "rust"\n{BATCHED}')
    return r


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, repo):
    return module_server(request, tmp_path_factory, repo)


def ort_session(models, name):
    return ort.InferenceSession(os.path.join(models, name + ".onnx"), providers=["CPUExecutionProvider"])


def string_input(mod, name, arr):
    x = mod.InferInput(name, list(arr.shape), "BYTES" if arr.dtype == object else mod.np_to_triton_dtype(arr.dtype))
    x.set_data_from_numpy(arr)
    return x


def infer_strings(client, mod, model, feeds, outputs):
    res = client.infer(model, [string_input(mod, n, a) for n, a in feeds.items()],
                       outputs=[mod.InferRequestedOutput(o) for o in outputs])
    return {o: res.as_numpy(o) for o in outputs}


def as_text(a):
    return np.vectorize(lambda b: b.decode() if isinstance(b, bytes) else b, otypes=[object])(a)


def test_autocomplete_writes_type_string(server):
    cfg = server.http("GET", "/v2/models/spam_pipeline/config").json()
    types = {t["name"]: t["data_type"] for t in cfg["input"] + cfg["output"]}
    assert types == {"city": "TYPE_STRING", "text": "TYPE_STRING", "amount": "TYPE_FP32",
                     "label": "TYPE_STRING", "probabilities": "TYPE_FP32"}, types
    words = server.http("GET", "/v2/models/word_map/config").json()
    assert [t["data_type"] for t in words["input"] + words["output"]] == ["TYPE_STRING"] * 3
    print(f"\n[strings] auto-complete: {types}")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sklearn_pipeline_batched_equals_onnxruntime(server, models, protocol):
    mod = client_module(protocol)
    ref_sess = ort_session(models, "spam_pipeline")
    before = server.stats("spam_pipeline")
    results, errors = {}, []

    def one(i):
        try:
            city, text, amount, _ = string_models.spam_data(1 + i % 4, seed=100 + i)
            client = make_client(server, protocol)
            got = infer_strings(client, mod, "spam_pipeline", {"city": city, "text": text, "amount": amount},
                                ["label", "probabilities"])
            want = ref_sess.run(None, {"city": city, "text": text, "amount": amount})
            results[i] = (got, want)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"request {i}: {e}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    worst, labels = 0.0, 0
    for got, (want_label, want_prob) in results.values():
        assert list(as_text(got["label"]).reshape(-1)) == list(want_label), (got["label"], want_label)
        worst = max(worst, float(np.abs(got["probabilities"] - want_prob).max()))
        labels += len(want_label)
    assert worst <= 1e-6, worst
    after = server.stats_after("spam_pipeline", before, 24)
    runs = int(after["execution_count"]) - int(before["execution_count"])
    rows = int(after["inference_count"]) - int(before["inference_count"])
    assert runs < len(results), f"24 requests ran in {runs} executions: the dynamic batcher should have merged some"
    print(f"\n[strings] spam_pipeline ({protocol}): 24 requests, {labels} labels equal to ONNX Runtime's, "
          f"probabilities max abs diff {worst:.1e}; {rows} rows in {runs} runs")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_strings_in_and_out_of_any_length(server, models, protocol):
    mod = client_module(protocol)
    client = make_client(server, protocol)
    sess = ort_session(models, "word_map")
    cases = [
        np.array([["cat", "dog", "x"]], dtype=object),
        np.array([["café", "", "house"], ["naïve — ünïcödé ✓", "dog", "a" * 5000]], dtype=object),
        np.array([[""]], dtype=object),
    ]
    for words in cases:
        got = infer_strings(client, mod, "word_map", {"words": words}, ["mapped", "echo"])
        mapped, echo = sess.run(None, {"words": words})
        assert as_text(got["mapped"]).tolist() == mapped.tolist()
        assert as_text(got["echo"]).tolist() == words.tolist()
    print(f"\n[strings] word_map ({protocol}): {len(cases)} shapes, unicode, empty and 5000-byte strings round-trip")


def raw_http_infer(server, model, name, shape, body_bytes, outputs):
    """One inference over HTTP with the binary data extension, the BYTES body exactly as given."""
    header = {"inputs": [{"name": name, "shape": shape, "datatype": "BYTES",
                          "parameters": {"binary_data_size": len(body_bytes)}}],
              "outputs": [{"name": o, "parameters": {"binary_data": False}} for o in outputs]}
    h = json.dumps(header).encode()
    return requests.post(f"http://{server.http_url}/v2/models/{model}/infer", data=h + body_bytes,
                         headers={"Inference-Header-Content-Length": str(len(h)),
                                  "Content-Type": "application/octet-stream"}, timeout=60)


def pack(items):
    return b"".join(len(s).to_bytes(4, "little") + s for s in items)


def test_malformed_string_bodies_are_refused_naming_the_input(server):
    ok = raw_http_infer(server, "word_map", "words", [1, 2], pack([b"cat", b"dog"]), ["mapped"])
    assert ok.status_code == 200, ok.text
    assert ok.json()["outputs"][0]["data"] == ["chat", "chien"]
    bad = {
        "a length past the end": pack([b"cat"]) + (100).to_bytes(4, "little") + b"dog",
        "a cut length prefix": pack([b"cat"]) + b"\x03\x00",
        "fewer strings than the shape": pack([b"cat"]),
        "not UTF-8": pack([b"cat", b"\xff\xfe"]),
    }
    seen = {}
    for what, body in bad.items():
        r = raw_http_infer(server, "word_map", "words", [1, 2], body, ["mapped"])
        assert r.status_code == 400, (what, r.status_code, r.text)
        assert "words" in r.json()["error"], (what, r.text)
        seen[what] = r.json()["error"]
    # a bad request among good ones in one batch: the good ones are answered
    results = {}

    def send(i):
        body = bad["not UTF-8"] if i == 3 else pack([b"cat", b"house"])
        results[i] = raw_http_infer(server, "word_map", "words", [1, 2], body, ["mapped"])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[3].status_code == 400
    for i in set(results) - {3}:
        assert results[i].status_code == 200 and results[i].json()["outputs"][0]["data"] == ["chat", "maison"]
    assert server.alive()
    for what, msg in seen.items():
        print(f"\n[strings] {what}: 400 {msg}")
