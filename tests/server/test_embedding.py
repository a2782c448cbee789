"""The embedding engine (the HPS replacement) through the real tritonserver: lookups.

One server serves every model of this module:
  hps3          HPS interface, three tables: `a` npy fp32, `b` HugeCTR, `c` npy fp16 (with vocabularies)
  hps3_count    the same tables in a store of its own, used only by the metrics-count test
  emb_batched   batched interface (KEYS [3] -> OUTPUT0 [3, 8]) behind the dynamic batcher
  emb_batched_fp16  the same tables, OUTPUT0 declared TYPE_FP16 (rows for an fp16 network)

Rows that change under a running server (online updates, the redis tier) are in
test_embedding_updates_redis.py, with a server of their own; the shared config text and checks
in embedding_helpers.py.

Every comparison is exact (np.array_equal): the store hands out the stored float32 bits.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from conftest import module_server
from embedding_helpers import assert_no_panic, embedding_config, expected_rows, hps_io, tier_hits
from tritonserver_harness import (
    fire_grpc,
    ModelRepo,
    error_status,
    infer,
    make_client,
    metric_sum,
    wait_metric,
)
from make_tables import read_table, write_table

# ---------------------------------------------------------------------------- tables and configs

# name: (rows, dim, default value, vocabulary size, format)
HPS_TABLES = {
    "a": (1000, 4, 0.5, 1100, "npy"),
    "b": (500, 8, -1.0, 600, "hugectr"),
    "c": (300, 16, 0.25, 400, "fp16"),
}
BATCHED_TABLES = ["x", "y", "z"]
BATCHED_ROWS, BATCHED_DIM, BATCHED_DEFAULT, BATCHED_VOCAB = 200, 8, 0.75, 250


def hps3_config(name: str) -> str:
    return embedding_config(
        name, hps_io(),
        embedding_table_names=",".join(HPS_TABLES),
        embedding_vecsize_per_table=",".join(str(t[1]) for t in HPS_TABLES.values()),
        default_value_for_each_table=",".join(str(t[2]) for t in HPS_TABLES.values()),
        vocabulary_size_per_table=",".join(str(t[3]) for t in HPS_TABLES.values()),
        gpucacheper="0.5")


@pytest.fixture(scope="module")
def repo(tmp_path_factory, example_models):
    r = ModelRepo(str(tmp_path_factory.mktemp("embedding-repo")))
    # hps3: the three formats
    hps_tables = os.path.join(r.root, "hps3", "1", "tables")
    for seed, (name, (rows, dim, _, _, fmt)) in enumerate(HPS_TABLES.items()):
        write_table(hps_tables, name, rows, dim, 100 + seed,
                    dtype=np.float16 if fmt == "fp16" else np.float32, hugectr=fmt == "hugectr")
    assert os.path.exists(os.path.join(hps_tables, "b", "emb_vector"))
    assert np.load(os.path.join(hps_tables, "c", "vectors.npy"), mmap_mode="r").dtype == np.float16
    r.write_config("hps3", hps3_config("hps3"))
    os.makedirs(os.path.join(r.root, "hps3_count"))
    os.symlink(os.path.join(r.root, "hps3", "1"), os.path.join(r.root, "hps3_count", "1"))
    r.write_config("hps3_count", hps3_config("hps3_count"))

    # emb_batched: three tables of one dim, dynamic batching
    for seed, name in enumerate(BATCHED_TABLES):
        write_table(os.path.join(r.root, "emb_batched", "1", "tables"), name, BATCHED_ROWS, BATCHED_DIM, 200 + seed)
    r.write_config("emb_batched", embedding_config(
        "emb_batched",
        f'input [ {{ name: "KEYS" data_type: TYPE_INT64 dims: [ {len(BATCHED_TABLES)} ] }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {len(BATCHED_TABLES)}, {BATCHED_DIM} ] }} ]\n',
        max_batch_size=64, extra="dynamic_batching { max_queue_delay_microseconds: 100000 }\n",
        embedding_interface="batched", embedding_table_names=",".join(BATCHED_TABLES),
        embedding_vecsize_per_table=BATCHED_DIM, default_value_for_each_table=BATCHED_DEFAULT,
        vocabulary_size_per_table=",".join([str(BATCHED_VOCAB)] * len(BATCHED_TABLES)), gpucacheper="0.25"))

    # emb_batched_fp16: the same tables, rows given as fp16; its GPU caches would keep fp16 rows
    # (gpucache_row_type), which a KIND_CPU instance's cache does not: the same answers either way
    os.makedirs(os.path.join(r.root, "emb_batched_fp16"))
    os.symlink(os.path.join(r.root, "emb_batched", "1"), os.path.join(r.root, "emb_batched_fp16", "1"))
    r.write_config("emb_batched_fp16", embedding_config(
        "emb_batched_fp16",
        f'input [ {{ name: "KEYS" data_type: TYPE_INT64 dims: [ -1, {len(BATCHED_TABLES)} ] }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP16 dims: [ -1, {len(BATCHED_TABLES)}, {BATCHED_DIM} ] }} ]\n',
        embedding_interface="batched", embedding_table_names=",".join(BATCHED_TABLES),
        embedding_vecsize_per_table=BATCHED_DIM, default_value_for_each_table=BATCHED_DEFAULT, gpucacheper="0.25",
        gpucache_row_type="fp16"))
    return r


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, repo):
    return module_server(request, tmp_path_factory, repo)


@pytest.fixture(scope="module")
def hps_rows(repo):
    """{table: float32 [rows, dim]} as stored on disk (fp16 widened exactly to float32)."""
    out = {}
    for name in HPS_TABLES:
        keys, vecs = read_table(os.path.join(repo.root, "hps3", "1", "tables", name))
        assert np.array_equal(keys, np.arange(len(keys)))
        out[name] = np.asarray(vecs).astype(np.float32)
    return out


# ---------------------------------------------------------------------------- helpers


def hps_request(rng, rows_per_table, sizes, unknown):
    """Random keys per table with repeats and `unknown` keys in [rows, vocabulary)."""
    keys = []
    for (rows, vocab), n in zip(rows_per_table, sizes):
        k = rng.integers(0, rows, size=n)
        k[: n // 4] = k[n // 4: 2 * (n // 4)]  # repeats inside the request
        k[-unknown:] = rng.integers(rows, vocab, size=unknown)
        rng.shuffle(k)
        keys.append(k.astype(np.int64))
    return keys


def hps_feeds(keys_per_table):
    return {"KEYS": np.concatenate(keys_per_table).astype(np.int64),
            "NUMKEYS": np.array([len(k) for k in keys_per_table], dtype=np.int32)}


# ---------------------------------------------------------------------------- HPS interface


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_hps_interface_exact_rows(server, hps_rows, protocol):
    client = make_client(server, protocol)
    rng = np.random.default_rng(1 if protocol == "http" else 2)
    specs = [(v[0], v[3]) for v in HPS_TABLES.values()]
    requests_sent = 0
    for i in range(6):
        keys = hps_request(rng, specs, sizes=(40 + i, 17 + i, 9 + 2 * i), unknown=3)
        if i == 5:
            keys[0] = np.zeros(0, dtype=np.int64)  # a table with no keys in this request
        want = np.concatenate([expected_rows(hps_rows[name], k, HPS_TABLES[name][2]).ravel()
                               for name, k in zip(HPS_TABLES, keys)])
        for repeat in range(3):  # the same request again: now partly from the cache
            got = infer(client, protocol, "hps3", hps_feeds(keys), ["OUTPUT0"])["OUTPUT0"]
            requests_sent += 1
            assert got.dtype == np.float32 and got.shape == want.shape, (got.dtype, got.shape, want.shape)
            assert np.array_equal(got, want), (
                f"request {i} repeat {repeat}: {int(np.sum(got != want))} of {want.size} values differ")
    client.close()
    time.sleep(0.7)
    for name in HPS_TABLES:
        hits = tier_hits(server, "hps3", name)
        rate = metric_sum(server, "rust_embedding_cache_hit_rate", model="hps3", table=name)
        rows = metric_sum(server, "rust_embedding_cache_rows", model="hps3", table=name)
        print(f"[hps3 {protocol}] table {name} ({HPS_TABLES[name][4]}): hits by tier {hits}, "
              f"cache hit rate {rate:.3f}, cache rows {rows:.0f}")
        assert hits["cache"] > 0, f"table {name}: repeated requests never hit the cache"
        assert hits["default"] > 0, f"table {name}: unknown keys were not answered with the default"
    print(f"[hps3 {protocol}] {requests_sent} requests, every row exact")


# ---------------------------------------------------------------------------- batched interface


def batched_rows(repo):
    return [np.asarray(read_table(os.path.join(repo.root, "emb_batched", "1", "tables", t))[1], dtype=np.float32)
            for t in BATCHED_TABLES]


def batched_expected(tables, keys: np.ndarray) -> np.ndarray:
    return np.stack([expected_rows(tables[t], keys[:, t], BATCHED_DEFAULT) for t in range(len(tables))], axis=1)


def batch_counts(stats: dict) -> dict:
    s = stats["inference_stats"]
    return {"inference_count": int(stats["inference_count"]), "execution_count": int(stats["execution_count"]),
            "success": int(s["success"]["count"]), "fail": int(s["fail"]["count"])}


def stats_delta(server, before: dict, requests: int) -> dict:
    """The stats change once all `requests` are counted (the harness's stats_after waits for them)."""
    finished = {"inference_stats": {"success": {"count": before["success"]}, "fail": {"count": before["fail"]}}}
    after = batch_counts(server.stats_after("emb_batched", finished, requests))
    return {k: after[k] - before[k] for k in after}


def fire_grpc_batched(server, payloads):
    return fire_grpc(server, "emb_batched", "KEYS", payloads)


def test_batched_interface_exact_and_concurrent(server, repo):
    tables = batched_rows(repo)
    rng = np.random.default_rng(7)
    # single requests over both protocols, with unknown (but in-vocabulary) keys
    for protocol in ("http", "grpc"):
        client = make_client(server, protocol)
        for b in (1, 5, 17):
            keys = rng.integers(0, BATCHED_VOCAB, size=(b, len(BATCHED_TABLES))).astype(np.int64)
            got = infer(client, protocol, "emb_batched", {"KEYS": keys}, ["OUTPUT0"])["OUTPUT0"]
            assert got.shape == (b, len(BATCHED_TABLES), BATCHED_DIM)
            assert np.array_equal(got, batched_expected(tables, keys)), f"{protocol} batch {b}"
        client.close()

    payloads = [rng.integers(0, BATCHED_VOCAB, size=(1 + i % 2, len(BATCHED_TABLES))).astype(np.int64)
                for i in range(32)]
    before = batch_counts(server.stats("emb_batched"))
    results = fire_grpc_batched(server, payloads)
    d = stats_delta(server, before, len(payloads))
    for i, (out, err) in enumerate(results):
        assert err is None, f"request {i} failed: {err}"
        want = batched_expected(tables, payloads[i])
        assert np.array_equal(out, want), (f"request {i} keys {payloads[i].tolist()}: got rows differ "
                                           f"(got {None if out is None else out.tolist()}, want {want.tolist()})")
    rows = sum(len(p) for p in payloads)
    print(f"\n[emb_batched] 32 concurrent requests ({rows} samples): inference_count={d['inference_count']} "
          f"execution_count={d['execution_count']} success={d['success']} fail={d['fail']}")
    assert d["inference_count"] == rows and d["success"] == 32 and d["fail"] == 0, d
    assert d["execution_count"] < d["inference_count"], f"the dynamic batcher merged nothing: {d}"


def test_batched_interface_fp16_rows(server, repo):
    """OUTPUT0 declared TYPE_FP16: the same rows, each rounded to fp16 once (the GPU path's
    kernel does the same rounding, cvt.rn, whether its cache keeps fp32 rows or, with
    gpucache_row_type fp16 as this model asks, fp16 ones; bench/gpu/recsys_perf.py checks it
    there). On a CPU instance the parameter loads and the cache keeps fp32."""
    tables = batched_rows(repo)
    rng = np.random.default_rng(9)
    client = make_client(server, "http")
    for b in (1, 7, 64):
        keys = rng.integers(0, BATCHED_VOCAB, size=(b, len(BATCHED_TABLES))).astype(np.int64)
        got = infer(client, "http", "emb_batched_fp16", {"KEYS": keys}, ["OUTPUT0"])["OUTPUT0"]
        assert got.dtype == np.float16 and got.shape == (b, len(BATCHED_TABLES), BATCHED_DIM)
        assert np.array_equal(got, batched_expected(tables, keys).astype(np.float16)), f"batch {b}"
    client.close()


def test_batched_out_of_vocabulary_fails_alone(server, repo):
    tables = batched_rows(repo)
    rng = np.random.default_rng(8)
    n, bad = 16, 9
    payloads = [rng.integers(0, BATCHED_ROWS, size=(1, len(BATCHED_TABLES))).astype(np.int64) for _ in range(n)]
    payloads[bad][0, 1] = BATCHED_VOCAB + 5
    before = batch_counts(server.stats("emb_batched"))
    results = fire_grpc_batched(server, payloads)
    d = stats_delta(server, before, n)
    for i, (out, err) in enumerate(results):
        if i == bad:
            assert err is not None, "an out-of-vocabulary key was answered"
            print(f"\n[emb_batched] bad request {i}: {err.status()} {err.message()}")
            assert "StatusCode.INVALID_ARGUMENT" in str(err.status())
            assert "KEYS" in err.message() and f"key {BATCHED_VOCAB + 5}" in err.message()
            assert "'y'" in err.message() and f"vocabulary size {BATCHED_VOCAB}" in err.message()
        else:
            assert err is None, f"good request {i} failed because of a bad neighbour: {err}"
            assert np.array_equal(out, batched_expected(tables, payloads[i])), f"request {i} got wrong rows"
    print(f"[emb_batched] stats delta: {d}")
    assert d["execution_count"] < n, f"requests were not batched together ({d}), the case proves nothing"
    assert d["success"] == n - 1 and d["fail"] == 1


# ---------------------------------------------------------------------------- bad input (HPS)


BAD_HPS = {
    "numkeys_length": ({"KEYS": np.array([1, 2, 3], np.int64), "NUMKEYS": np.array([2, 1], np.int32)},
                       ["input 'NUMKEYS' has 2 entries but the store has 3 tables"]),
    "negative_count": ({"KEYS": np.array([1, 2], np.int64), "NUMKEYS": np.array([2, -1, 1], np.int32)},
                       ["input 'NUMKEYS' has a negative count -1"]),
    "sum_mismatch": ({"KEYS": np.array([1, 2, 3, 4], np.int64), "NUMKEYS": np.array([1, 1, 1], np.int32)},
                     ["input 'NUMKEYS' sums to 3 but input 'KEYS' holds 4 keys"]),
    "out_of_vocabulary": ({"KEYS": np.array([1, 2, 600, 3], np.int64), "NUMKEYS": np.array([2, 1, 1], np.int32)},
                          ["input 'KEYS': key 600 is out of range for table 'b' (vocabulary size 600)"]),
    "negative_key": ({"KEYS": np.array([-3, 2, 1], np.int64), "NUMKEYS": np.array([1, 1, 1], np.int32)},
                     ["input 'KEYS': key -3 is out of range for table 'a' (vocabulary size 1100)"]),
}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("case", list(BAD_HPS))
def test_hps_bad_input(server, hps_rows, protocol, case):
    feeds, needles = BAD_HPS[case]
    client = make_client(server, protocol)
    with pytest.raises(Exception) as info:
        infer(client, protocol, "hps3", feeds, ["OUTPUT0"])
    err = info.value
    print(f"\n[hps3 bad {case} {protocol}] {error_status(err)}: {err.message()}")
    assert error_status(err) == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
    for needle in needles:
        assert needle in err.message()
    # the next good request is answered right
    keys = [np.array([5, 1099]), np.array([7]), np.array([3, 3])]
    got = infer(client, protocol, "hps3", hps_feeds(keys), ["OUTPUT0"])["OUTPUT0"]
    want = np.concatenate([expected_rows(hps_rows[n], k, HPS_TABLES[n][2]).ravel() for n, k in zip(HPS_TABLES, keys)])
    assert np.array_equal(got, want)
    client.close()
    assert_no_panic(server)


# ---------------------------------------------------------------------------- metrics match counts


def test_metrics_match_key_counts(server, hps_rows):
    client = make_client(server, "http")
    rng = np.random.default_rng(11)
    specs = [(v[0], v[3]) for v in HPS_TABLES.values()]
    sent = {name: 0 for name in HPS_TABLES}
    for i in range(10):
        keys = hps_request(rng, specs, sizes=(30 + 3 * i, 20, 8 + i), unknown=2)
        if i % 3 == 0:
            keys = [np.concatenate([k, k[:5]]) for k in keys]  # some repeats: cache hits
        got = infer(client, "http", "hps3_count", hps_feeds(keys), ["OUTPUT0"])["OUTPUT0"]
        want = np.concatenate([expected_rows(hps_rows[n], k, HPS_TABLES[n][2]).ravel()
                               for n, k in zip(HPS_TABLES, keys)])
        assert np.array_equal(got, want)
        for name, k in zip(HPS_TABLES, keys):
            sent[name] += len(k)
    client.close()
    total = sum(sent.values())
    got_total = wait_metric(server, "rust_embedding_lookup_keys_total", total, model="hps3_count")
    print(f"\n[hps3_count] sent {sent} = {total} keys; rust_embedding_lookup_keys_total = {got_total:.0f}")
    assert got_total == total
    for name, n in sent.items():
        keys_metric = metric_sum(server, "rust_embedding_lookup_keys_total", model="hps3_count", table=name)
        hits = tier_hits(server, "hps3_count", name)
        print(f"[hps3_count] table {name}: sent {n}, lookup_keys {keys_metric:.0f}, hits by tier {hits} "
              f"(sum {sum(hits.values()):.0f})")
        assert keys_metric == n
        assert sum(hits.values()) == n, f"table {name}: tiers answered {sum(hits.values())} keys of {n}"
        assert hits["redis"] == 0


def test_server_alive_no_panic(server):
    assert_no_panic(server)
    print(f"\n[server] alive, log {server.log_path} ({len(server.log_text())} bytes), no 'panicked'")
