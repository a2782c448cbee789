"""DLRM, DCNv2 and Wide&Deep served as Triton ensembles (sparse step: our embedding store,
batched interface; dense step: the ONNX engine) against their PyTorch references.

The models are written by examples/recommenders.py (1000 rows per table) when missing.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import module_server
from tritonserver_harness import MODELS_DIR, REPO_ROOT, ModelRepo, infer, make_client, wait_metric

MODELS = ("dlrm", "dcnv2", "wide_deep")
ROWS = 1000
BATCH = 64
UNKNOWN = 3
TOLERANCE = 1e-5
NUM_TABLES = 26


def exported(name: str) -> bool:
    return (os.path.isfile(os.path.join(MODELS_DIR, f"{name}_dense", "1", "reference.pt"))
            and os.path.isfile(os.path.join(MODELS_DIR, f"{name}_dense", "1", "model.onnx"))
            and all(os.path.isfile(os.path.join(MODELS_DIR, f"{name}_sparse", "1", "tables", f"t{i}", "vectors.npy"))
                    for i in range(NUM_TABLES)))


@pytest.fixture(scope="module")
def recommenders(example_models):
    missing = [m for m in MODELS if not exported(m)]
    if missing:
        print(f"\n[recommenders] exporting {missing} ({ROWS} rows per table)", flush=True)
        subprocess.run([sys.executable, os.path.join(REPO_ROOT, "examples", "recommenders.py"), "--repo", MODELS_DIR,
                        "--rows", str(ROWS), "--models", ",".join(missing), "--force"], check=True)
    assert all(exported(m) for m in MODELS)
    from recommenders import load_reference

    return {m: load_reference(MODELS_DIR, m) for m in MODELS}


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, recommenders):
    repo = ModelRepo(MODELS_DIR)  # the committed repository, read only; explicit control loads just these
    return module_server(request, tmp_path_factory, repo, "--model-control-mode=explicit",
                         *[f"--load-model={m}" for m in MODELS])


@pytest.mark.parametrize("name", MODELS)
def test_ensemble_matches_pytorch(server, recommenders, name):
    from recommenders import reference_predict, sample_inputs

    model = recommenders[name]
    rows = model.embeddings[0].num_embeddings
    assert server.model_ready(name) and server.model_ready(f"{name}_sparse") and server.model_ready(f"{name}_dense")
    sent = 0
    for i, protocol in enumerate(("http", "grpc")):
        dense, sparse = sample_inputs(BATCH, rows, seed=100 * MODELS.index(name) + i, unknown=UNKNOWN)
        assert (sparse[:UNKNOWN, 0] >= rows).all()
        client = make_client(server, protocol)
        got = infer(client, protocol, name, {"dense": dense, "sparse": sparse}, ["prediction"])["prediction"]
        client.close()
        want = reference_predict(model, dense, sparse)
        assert got.shape == want.shape == (BATCH, 1), (got.shape, want.shape)
        diff = float(np.max(np.abs(got - want)))
        print(f"\n[{name} {protocol}] batch {BATCH} ({UNKNOWN} unknown ids): max |triton - pytorch| = {diff:.3g}, "
              f"predictions in [{float(got.min()):.4f}, {float(got.max()):.4f}]")
        assert diff <= TOLERANCE, f"{name} over {protocol}: max abs diff {diff} > {TOLERANCE}"
        sent += BATCH
        # the sparse step really went through our store: one key per table per sample
        keys = wait_metric(server, "rust_embedding_lookup_keys_total", sent * NUM_TABLES, model=f"{name}_sparse")
        t0 = wait_metric(server, "rust_embedding_lookup_keys_total", sent, model=f"{name}_sparse", table="t0")
        defaults = wait_metric(server, "rust_embedding_hits_total", (i + 1) * UNKNOWN,
                               model=f"{name}_sparse", table="t0", tier="default")
        print(f"[{name} {protocol}] {name}_sparse: rust_embedding_lookup_keys_total = {keys:.0f} "
              f"(want {sent} x {NUM_TABLES} = {sent * NUM_TABLES}), table t0 {t0:.0f}, t0 defaults {defaults:.0f}")
        assert keys == sent * NUM_TABLES and t0 == sent
        assert defaults == (i + 1) * UNKNOWN


def test_server_alive_no_panic(server):
    assert server.alive()
    assert "panicked" not in server.log_text()


def test_single_model_matches_pytorch(start_server, recommenders, tmp_path):
    """Store and dense network in one backend model: equal to the PyTorch reference, unknown
    ids served their default rows, keys past the vocabulary refused per request."""
    from recommenders import reference_predict, sample_inputs, single_model

    repo = ModelRepo(str(tmp_path / "repo"))
    for name in MODELS:
        # dlrm's tables declare a vocabulary (keys past it are the client's mistake)
        vocab = ['parameters { key: "vocabulary_size_per_table" value { string_value: "2000" } }'] if name == "dlrm" else []
        single_model(MODELS_DIR, name, repo.root, vocab)
    srv = start_server(repo.root, "--model-control-mode=explicit", *[f"--load-model={m}_single" for m in MODELS])
    for i, name in enumerate(MODELS):
        model = recommenders[name]
        rows = model.embeddings[0].num_embeddings
        dense, sparse = sample_inputs(BATCH, rows, seed=7 + i, unknown=UNKNOWN)
        for protocol in ("http", "grpc"):
            client = make_client(srv, protocol)
            got = infer(client, protocol, f"{name}_single", {"dense": dense, "sparse": sparse}, ["prediction"])["prediction"]
            client.close()
            want = reference_predict(model, dense, sparse)
            diff = float(np.max(np.abs(got - want)))
            print(f"\n[{name}_single {protocol}] batch {BATCH}: max |triton - pytorch| = {diff:.3g}")
            assert got.shape == (BATCH, 1) and diff <= TOLERANCE
        keys = wait_metric(srv, "rust_embedding_lookup_keys_total", 2 * BATCH * NUM_TABLES, model=f"{name}_single")
        assert keys == 2 * BATCH * NUM_TABLES
    # a key past the vocabulary is the client's mistake, named, and the model goes on serving
    dense, sparse = sample_inputs(2, 1000, seed=1)
    sparse[1, 4] = 5000
    client = make_client(srv, "http")
    with pytest.raises(Exception) as e:
        infer(client, "http", "dlrm_single", {"dense": dense, "sparse": sparse}, ["prediction"])
    print(f"key past the vocabulary: {e.value}")
    assert "input 'sparse': key 5000 is out of range for table 't4'" in str(e.value)
    dense, sparse = sample_inputs(2, 1000, seed=2)
    assert infer(client, "http", "dlrm_single", {"dense": dense, "sparse": sparse}, ["prediction"])["prediction"].shape == (2, 1)
    assert srv.alive() and "panicked" not in srv.log_text()
