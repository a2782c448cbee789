"""A small DLRM-v3 served through the real tritonserver (issue 68, CI's part): the sequence
recommender engine looks each id up as one row in the embedding store (the item, user and
category tables written from our reference's weights, in fp16 as the benchmark's) and hands them,
jagged and as stored (fp16), to the network package (examples/dlrm_v3/network.py, exported here;
about a minute of compiling). The example model (models/dlrm_v3, fp32 tables and rows) is served
by test_readme.py.

- Requests of different history and candidate counts, sent at once over HTTP and gRPC, are
  batched together (the statistics count fewer executions than requests) and each answer equals
  the reference's scores for that request alone. The attention's normaliser is fixed
  (Config.attn_norm_len): with the reference's own, a request's scores move with its batch
  (docs/dlrm-v3.md), and no served answer could be held to one number.
- A request whose lengths disagree with what it sent, or whose ids are past their table, is
  refused naming the input, and the requests batched with it are answered as if alone.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import zipfile

import numpy as np
import pytest
import torch

from conftest import module_server
from tritonserver_harness import REPO_ROOT, ModelRepo, infer, make_client

sys.path.insert(0, os.path.join(REPO_ROOT, "examples"))
sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "tools"))
from dlrm_v3 import export  # noqa: E402
from dlrm_v3 import model as dv3  # noqa: E402
from dlrm_v3.client import feeds  # noqa: E402
from test_dlrm_v3_reference import FIXED_NORM, edge_requests, mixed_batch  # noqa: E402

MODEL = "dlrm_v3"
# max |served - reference| (fp32 on the CPU): the package alone gives 2.4e-7 against the reference
TOLERANCE = 1e-5
INPUTS = ["user_ids", "query_times", "hist_lengths", "hist_item_ids", "hist_category_ids", "hist_timestamps",
          "hist_actions", "cand_lengths", "cand_item_ids", "cand_category_ids"]
MAX_LENGTH = 100  # the longest history or candidate list a request may send here


def config(cfg: dv3.Config) -> str:
    tensors = ",\n".join(f'  {{ name: "{n}" data_type: TYPE_INT64 dims: [ -1 ] allow_ragged_batch: true }}'
                         for n in INPUTS)
    params = {"engine": "sequence_recommender", "embedding_table_names": ",".join(export.TABLES),
              "embedding_vecsize_per_table": str(cfg.table_dim),
              "vocabulary_size_per_table": f"{cfg.num_item_rows},{cfg.num_user_rows},{cfg.num_category_rows}",
              "sequence_max_length": str(MAX_LENGTH)}
    return f"""name: "{MODEL}"
backend: "rust"
max_batch_size: 64
input [
{tensors}
]
output [ {{ name: "predictions" data_type: TYPE_FP32 dims: [ 1 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 300000 }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
""" + "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in params.items())


@pytest.fixture(scope="module")
def ranker():
    return dv3.HstuRanker(dv3.Config.tiny(attn_norm_len=FIXED_NORM, table_dtype=torch.float16)).eval()


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, ranker):
    repo = ModelRepo(str(tmp_path_factory.mktemp("dlrm-v3-repo")))
    package = export.write_version(os.path.join(repo.root, MODEL, "1"), ranker, mixed_batch())
    # the rows the network takes are the tables' fp16 ones (the path under test), as its metadata says
    with zipfile.ZipFile(package) as z:
        meta = next(json.loads(z.read(n)) for n in z.namelist() if n.endswith("wrapper_metadata.json"))
    rows = {t["name"]: t["dtype"] for t in json.loads(meta["triton_rust.inputs"]) if t["name"].endswith("_rows")}
    assert len(rows) == 5 and set(rows.values()) == {"float16"}, rows
    repo.write_config(MODEL, config(ranker.cfg))
    return module_server(request, tmp_path_factory, repo)


def expected(ranker, r: dv3.Request) -> np.ndarray:
    return ranker.score_candidates(dv3.Batch.from_requests([r])).numpy()


def send_all(server, jobs):
    """Sends every (protocol, feeds) at once, each from its own thread; [answer or exception]."""
    got = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def one(i, protocol, f):
        client = make_client(server, protocol)
        start.wait()
        try:
            got[i] = infer(client, protocol, MODEL, f, ["predictions"])["predictions"]
        except Exception as e:  # noqa: BLE001 (the answer under test)
            got[i] = e

    threads = [threading.Thread(target=one, args=(i, p, f)) for i, (p, f) in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def test_ragged_requests_batched_together_equal_the_reference(server, ranker):
    requests = mixed_batch(seed=5).requests() + edge_requests()
    before = server.stats(MODEL)
    jobs = [("http" if i % 2 else "grpc", feeds(r)) for i, r in enumerate(requests)]
    got = send_all(server, jobs)
    for r, g in zip(requests, got):
        assert not isinstance(g, Exception), g
        want = expected(ranker, r)
        assert g.shape == want.shape, (g.shape, want.shape)
        assert np.abs(g - want).max() <= TOLERANCE, np.abs(g - want).max()
    stats = server.stats_after(MODEL, before, len(requests))
    executions = int(stats["execution_count"]) - int(before["execution_count"])
    print(f"{len(requests)} requests (histories of {sorted(len(r.item_ids) for r in requests)}) in {executions} executions; "
          f"largest difference {max(float(np.abs(g - expected(ranker, r)).max()) for r, g in zip(requests, got)):.2e}")
    assert 0 < executions < len(requests), f"{executions} executions for {len(requests)} requests"
    lengths = {len(r.item_ids) for r in requests}
    assert len(lengths) > 3, lengths  # the batches held histories of different lengths


def bad(r: dv3.Request, what: str) -> dict:
    f = feeds(r)
    if what == "short history":
        f["hist_category_ids"] = f["hist_category_ids"][:, :-1]
    elif what == "lengths past the values":
        f["cand_lengths"] = f["cand_lengths"] + 1
    elif what == "an item past its table":
        f["cand_item_ids"] = f["cand_item_ids"].copy()
        f["cand_item_ids"][0, 0] = 4096
    elif what == "a negative category":
        f["hist_category_ids"] = f["hist_category_ids"].copy()
        f["hist_category_ids"][0, 0] = -1
    elif what == "no candidates":
        f["cand_lengths"] = np.zeros((1, 1), np.int64)
        f["cand_item_ids"] = np.zeros((1, 0), np.int64)
        f["cand_category_ids"] = np.zeros((1, 0), np.int64)
    elif what == "a history past the bound":
        n = MAX_LENGTH + 1
        f["hist_lengths"] = np.full((1, 1), n, np.int64)
        for k in ("hist_item_ids", "hist_category_ids", "hist_timestamps", "hist_actions"):
            f[k] = np.resize(f[k], (1, n))
    elif what == "two users":
        f["user_ids"] = np.array([[1, 2]], np.int64)
    return f


BAD = {"short history": "hist_category_ids", "lengths past the values": "cand_item_ids",
       "an item past its table": "cand_item_ids", "a negative category": "hist_category_ids",
       "no candidates": "cand_lengths", "a history past the bound": "hist_lengths", "two users": "user_ids"}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_lengths_and_ids_are_refused_alone(server, ranker, protocol):
    good = mixed_batch(seed=6).requests()[:4]
    kinds = list(BAD)
    jobs = [(protocol, feeds(r)) for r in good] + [(protocol, bad(good[i % len(good)], k)) for i, k in enumerate(kinds)]
    got = send_all(server, jobs)
    for r, g in zip(good, got):
        assert not isinstance(g, Exception), g
        assert np.abs(g - expected(ranker, r)).max() <= TOLERANCE
    for kind, g in zip(kinds, got[len(good):]):
        assert isinstance(g, Exception), f"{kind}: answered {g}"
        print(f"{protocol}, {kind}: {g}")
        assert f"'{BAD[kind]}'" in str(g), f"{kind}: {g}"
    assert server.alive()
