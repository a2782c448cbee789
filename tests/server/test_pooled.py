"""Pooled (multi-hot) lookups through the real tritonserver: each sample sends a bag of keys per
table (its hotness, padded with -1), and each bag's rows come back reduced to one row, as
TorchRec's EmbeddingBag and HPS's combiner reduce them.

Models (one server, KIND_CPU, the dynamic batcher on):
  pooled_sum    three tables of dim 8, hotness 3,1,4, combiner sum, vocabularies checked
  pooled_mean   the same tables, combiner mean
  pooled_fp16   the same, sum, OUTPUT0 declared TYPE_FP16
  pooled_ragged the same tables, bags of any length: KEYS ragged (allow_ragged_batch) and
                LENGTHS [tables] per sample, TorchRec's values and lengths
  pooled_torchrec  tables imported from a TorchRec-shaped state dict (examples/import_torchrec.py)

The reference is torch.nn.EmbeddingBag over the same stored rows.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

from conftest import module_server
from tritonserver_harness import ModelRepo, error_status, fire_grpc, infer, make_client
from make_tables import read_table, write_table

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import import_torchrec  # noqa: E402

TABLES = ["p0", "p1", "p2"]
HOTNESS = [3, 1, 4]
ROWS, DIM, VOCAB = 500, 8, 500
WIDTH = sum(HOTNESS)


def param(key: str, value) -> str:
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'


def pooled_config(name: str, combiner: str, out_type: str = "TYPE_FP32") -> str:
    text = (f'name: "{name}"\nbackend: "rust"\nmax_batch_size: 64\n'
            f'input [ {{ name: "KEYS" data_type: TYPE_INT64 dims: [ {WIDTH} ] }} ]\n'
            f'output [ {{ name: "OUTPUT0" data_type: {out_type} dims: [ {len(TABLES)}, {DIM} ] }} ]\n'
            'instance_group [ { count: 2 kind: KIND_CPU } ]\n'
            'dynamic_batching { max_queue_delay_microseconds: 100000 }\n')
    for k, v in dict(engine="embedding", embedding_interface="pooled", embedding_table_names=",".join(TABLES),
                     embedding_vecsize_per_table=DIM, embedding_hotness_per_table=",".join(map(str, HOTNESS)),
                     embedding_combiner=combiner, vocabulary_size_per_table=VOCAB, gpucacheper="0.2").items():
        text += param(k, v)
    return text


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    r = ModelRepo(str(tmp_path_factory.mktemp("pooled-repo")))
    for seed, t in enumerate(TABLES):
        write_table(os.path.join(r.root, "pooled_sum", "1", "tables"), t, ROWS, DIM, 400 + seed)
    r.write_config("pooled_sum", pooled_config("pooled_sum", "sum"))
    for name, combiner, out in (("pooled_mean", "mean", "TYPE_FP32"), ("pooled_fp16", "sum", "TYPE_FP16")):
        os.makedirs(os.path.join(r.root, name))
        os.symlink(os.path.join(r.root, "pooled_sum", "1"), os.path.join(r.root, name, "1"))
        r.write_config(name, pooled_config(name, combiner, out))
    os.makedirs(os.path.join(r.root, "pooled_ragged"))
    os.symlink(os.path.join(r.root, "pooled_sum", "1"), os.path.join(r.root, "pooled_ragged", "1"))
    ragged_io = ('input [ { name: "KEYS" data_type: TYPE_INT64 dims: [ -1 ] allow_ragged_batch: true },\n'
                 f'        {{ name: "LENGTHS" data_type: TYPE_INT32 dims: [ {len(TABLES)} ] }} ]\n')
    text = pooled_config("pooled_ragged", "sum").replace(
        f'input [ {{ name: "KEYS" data_type: TYPE_INT64 dims: [ {WIDTH} ] }} ]\n', ragged_io)
    r.write_config("pooled_ragged", text)

    # a model's EmbeddingBagCollection as TorchRec lays out its state dict, under DLRM-v2's path
    ebc = trained_collection()
    state = {f"sparse_arch.embedding_bag_collection.{k}": v
             for k, v in ebc.state_dict().items()}
    state["dense_arch.model.0.weight"] = torch.zeros(4, 4)  # not a table: left alone
    torch.save(state, os.path.join(r.root, "model_state.pt"))
    tables_dir = os.path.join(r.root, "pooled_torchrec", "1", "tables")
    assert import_torchrec.main([os.path.join(r.root, "model_state.pt"), "--out", tables_dir]) == 0
    r.write_config("pooled_torchrec", pooled_config("pooled_torchrec", "sum").replace(
        'string_value: "p0,p1,p2"', 'string_value: "cat_0,cat_1,cat_2"'))
    return r


def trained_collection() -> torch.nn.Module:
    """Three EmbeddingBags in a ModuleDict named embedding_bags, TorchRec's layout."""
    torch.manual_seed(5)
    ebc = torch.nn.Module()
    ebc.embedding_bags = torch.nn.ModuleDict(
        {f"cat_{t}": torch.nn.EmbeddingBag(ROWS, DIM, mode="sum") for t in range(len(TABLES))})
    return ebc


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, repo):
    return module_server(request, tmp_path_factory, repo)


@pytest.fixture(scope="module")
def rows(repo):
    return [np.asarray(read_table(os.path.join(repo.root, "pooled_sum", "1", "tables", t))[1], dtype=np.float32)
            for t in TABLES]


def random_keys(rng, batch: int, empty_share: float = 0.2) -> np.ndarray:
    """[batch, WIDTH] keys: each bag a random length from 0 to its hotness, padded with -1."""
    keys = np.full((batch, WIDTH), -1, dtype=np.int64)
    for b in range(batch):
        at = 0
        for h in HOTNESS:
            n = 0 if rng.random() < empty_share else int(rng.integers(1, h + 1))
            keys[b, at:at + n] = rng.integers(0, ROWS, size=n)
            at += h
    return keys


def reference(rows, keys: np.ndarray, mode: str) -> np.ndarray:
    """torch.nn.EmbeddingBag over the stored rows, table by table: [batch, tables, DIM]."""
    out, at = [], 0
    for t, h in enumerate(HOTNESS):
        bags = [[int(k) for k in sample[at:at + h] if k != -1] for sample in keys]
        flat = torch.tensor([k for bag in bags for k in bag], dtype=torch.int64)
        offsets = torch.tensor(np.cumsum([0] + [len(b) for b in bags[:-1]]), dtype=torch.int64)
        bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(rows[t].copy()), mode=mode)
        out.append(bag(flat, offsets).numpy())
        at += h
    return np.stack(out, axis=1)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model,mode", [("pooled_sum", "sum"), ("pooled_mean", "mean")])
def test_pooled_rows_equal_embedding_bag(server, rows, protocol, model, mode):
    rng = np.random.default_rng(11)
    client = make_client(server, protocol)
    for batch in (1, 7, 33):
        keys = random_keys(rng, batch)
        got = infer(client, protocol, model, {"KEYS": keys}, ["OUTPUT0"])["OUTPUT0"]
        want = reference(rows, keys, mode)
        assert got.shape == (batch, len(TABLES), DIM)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"{model} {protocol} batch {batch}")
    # a sample whose every bag is empty: zeros
    empty = np.full((1, WIDTH), -1, dtype=np.int64)
    got = infer(client, protocol, model, {"KEYS": empty}, ["OUTPUT0"])["OUTPUT0"]
    assert np.array_equal(got, np.zeros((1, len(TABLES), DIM), np.float32))
    client.close()


def test_pooled_fp16_rows_are_the_sum_rounded_once(server, rows):
    rng = np.random.default_rng(12)
    keys = random_keys(rng, 16)
    client = make_client(server, "http")
    got = infer(client, "http", "pooled_fp16", {"KEYS": keys}, ["OUTPUT0"])["OUTPUT0"]
    client.close()
    assert got.dtype == np.float16
    want = reference(rows, keys, "sum")
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float16).astype(np.float32), rtol=0, atol=0)


def test_requests_are_batched_and_a_bad_one_fails_alone(server, rows):
    rng = np.random.default_rng(13)
    payloads = [random_keys(rng, 1 + i % 3) for i in range(24)]
    bad_key, out_of_vocab = payloads[5].copy(), payloads[9].copy()
    bad_key[0, 0] = -7
    out_of_vocab[0, 3] = VOCAB + 2  # table p1's one key
    payloads[5], payloads[9] = bad_key, out_of_vocab
    s = server.stats("pooled_sum")["inference_stats"]
    before = {"inference_stats": {"success": {"count": int(s["success"]["count"])},
                                  "fail": {"count": int(s["fail"]["count"])}}}
    count0 = int(server.stats("pooled_sum")["execution_count"])
    results = fire_grpc(server, "pooled_sum", "KEYS", payloads)
    after = server.stats_after("pooled_sum", before, len(payloads))
    for i, (out, err) in enumerate(results):
        if i == 5:
            assert err is not None and "INVALID_ARGUMENT" in error_status(err)
            assert "input 'KEYS'" in str(err) and "-7" in str(err), str(err)
        elif i == 9:
            assert err is not None and "INVALID_ARGUMENT" in error_status(err)
            assert f"key {VOCAB + 2} is out of range for table 'p1'" in str(err), str(err)
        else:
            assert err is None, f"request {i}: {err}"
            np.testing.assert_allclose(out, reference(rows, payloads[i], "sum"), rtol=1e-6, atol=1e-6)
    executions = int(after["execution_count"]) - count0
    print(f"\n[pooled_sum] {len(payloads)} concurrent requests ran in {executions} executions")
    assert executions < len(payloads) - 2, f"the dynamic batcher merged nothing: {executions} executions"


def ragged_request(rng, most: int = 12):
    """One sample: (KEYS [1, n], LENGTHS [1, tables]) with each bag 0..most keys long."""
    lengths = rng.integers(0, most + 1, size=len(TABLES)).astype(np.int32)
    keys = rng.integers(0, ROWS, size=int(lengths.sum())).astype(np.int64)
    return keys.reshape(1, -1), lengths.reshape(1, -1)


def ragged_reference(rows, keys: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """torch.nn.EmbeddingBag (sum) per table over one sample's bags: [1, tables, DIM]."""
    out, at = [], 0
    for t, n in enumerate(lengths[0]):
        bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(rows[t].copy()), mode="sum")
        out.append(bag(torch.from_numpy(keys[0, at:at + n].copy()), torch.tensor([0])).numpy())
        at += n
    return np.stack(out, axis=1)


def fire_ragged(server, payloads):
    """Every (keys, lengths) at once over gRPC; [(OUTPUT0 or None, error or None)] in order."""
    import queue
    from tritonserver_harness import make_inputs
    client = make_client(server, "grpc")
    done: "queue.Queue" = queue.Queue()
    for i, (keys, lengths) in enumerate(payloads):
        client.async_infer("pooled_ragged", make_inputs("grpc", {"KEYS": keys, "LENGTHS": lengths}),
                           callback=lambda result, error, i=i: done.put((i, result, error)))
    results = [None] * len(payloads)
    for _ in payloads:
        i, result, error = done.get(timeout=120)
        results[i] = (None if error else result.as_numpy("OUTPUT0"), error)
    client.close()
    return results


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_ragged_bags_equal_embedding_bag(server, rows, protocol):
    rng = np.random.default_rng(21)
    client = make_client(server, protocol)
    for _ in range(5):
        keys, lengths = ragged_request(rng)
        got = infer(client, protocol, "pooled_ragged", {"KEYS": keys, "LENGTHS": lengths}, ["OUTPUT0"])["OUTPUT0"]
        np.testing.assert_allclose(got, ragged_reference(rows, keys, lengths), rtol=1e-6, atol=1e-6)
    # a sample with no key at all: every bag empty, zeros
    got = infer(client, protocol, "pooled_ragged",
                {"KEYS": np.zeros((1, 0), np.int64), "LENGTHS": np.zeros((1, len(TABLES)), np.int32)},
                ["OUTPUT0"])["OUTPUT0"]
    assert np.array_equal(got, np.zeros((1, len(TABLES), DIM), np.float32))
    client.close()


def test_ragged_requests_of_different_lengths_batch_together_and_bad_lengths_fail_alone(server, rows):
    rng = np.random.default_rng(22)
    payloads = [ragged_request(rng, most=3 + 4 * (i % 5)) for i in range(30)]
    assert len({p[0].shape[1] for p in payloads}) > 5, "requests of many lengths"
    short = (payloads[4][0], payloads[4][1] + np.array([[1, 0, 0]], np.int32))
    negative = (payloads[11][0], np.array([[-2, 1, int(payloads[11][0].shape[1]) + 1]], np.int32))
    payloads[4], payloads[11] = short, negative
    s = server.stats("pooled_ragged")
    before = {"inference_stats": {"success": {"count": int(s["inference_stats"]["success"]["count"])},
                                  "fail": {"count": int(s["inference_stats"]["fail"]["count"])}}}
    executions0 = int(s["execution_count"])
    results = fire_ragged(server, payloads)
    after = server.stats_after("pooled_ragged", before, len(payloads))
    for i, (out, err) in enumerate(results):
        if i == 4:
            assert err is not None and "input 'LENGTHS'" in str(err) and "keys" in str(err), str(err)
        elif i == 11:
            assert err is not None and "input 'LENGTHS'" in str(err) and "negative length -2" in str(err), str(err)
        else:
            assert err is None, f"request {i}: {err}"
            np.testing.assert_allclose(out, ragged_reference(rows, *payloads[i]), rtol=1e-6, atol=1e-6,
                                       err_msg=f"request {i}")
    executions = int(after["execution_count"]) - executions0
    print(f"\n[pooled_ragged] {len(payloads)} requests of {len({p[0].shape[1] for p in payloads})} lengths "
          f"ran in {executions} executions")
    assert executions < len(payloads) - 2, f"requests of different lengths were not batched: {executions}"


def test_tables_imported_from_torchrec_serve_the_collections_own_pooling(server):
    ebc = trained_collection()
    rng = np.random.default_rng(31)
    keys = random_keys(rng, 9)
    rows = [ebc.embedding_bags[f"cat_{t}"].weight.detach().numpy() for t in range(len(TABLES))]
    client = make_client(server, "grpc")
    got = infer(client, "grpc", "pooled_torchrec", {"KEYS": keys}, ["OUTPUT0"])["OUTPUT0"]
    client.close()
    np.testing.assert_allclose(got, reference(rows, keys, "sum"), rtol=1e-6, atol=1e-6)


def test_the_importer_refuses_what_it_cannot_take(tmp_path, capsys):
    torch.save({"dense.weight": torch.zeros(2, 2)}, tmp_path / "none.pt")
    assert import_torchrec.main([str(tmp_path / "none.pt"), "--out", str(tmp_path / "t")]) == 2
    assert "no embedding_bags.<table>.weight" in capsys.readouterr().err
    torch.save({"embedding_bags.a.weight": torch.zeros(3, 2)}, tmp_path / "one.pt")
    assert import_torchrec.main([str(tmp_path / "one.pt"), "--out", str(tmp_path / "t"), "--tables", "a,b"]) == 2
    assert "no table ['b']" in capsys.readouterr().err
    assert import_torchrec.main([str(tmp_path / "one.pt"), "--out", str(tmp_path / "t"), "--fp16"]) == 0
    assert np.load(tmp_path / "t" / "a" / "vectors.npy").dtype == np.float16
