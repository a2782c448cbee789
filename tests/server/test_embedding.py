"""The embedding engine (the HPS replacement) through the real tritonserver.

One server serves every model of this module:
  hps3          HPS interface, three tables: `a` npy fp32, `b` HugeCTR, `c` npy fp16 (with vocabularies)
  hps3_count    the same tables in a store of its own, used only by the metrics-count test
  emb_batched   batched interface (KEYS [3] -> OUTPUT0 [3, 8]) behind the dynamic batcher
  emb_batched_fp16  the same tables, OUTPUT0 declared TYPE_FP16 (rows for an fp16 network)
  live_lookup   HPS lookups of store "live"; live_update writes rows into the same store
  redis_nocache a table with no file, rows from a real redis-server, no cache (gpucacheper 0)
  redis_cached  the same with the default cache

Every comparison is exact (np.array_equal): the store hands out the stored float32 bits.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import threading
import time

import numpy as np
import pytest

from conftest import module_server
from tritonserver_harness import (
    fire_grpc,
    ModelRepo,
    error_status,
    free_ports,
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
LIVE_ROWS, LIVE_DIM, LIVE_DEFAULT = 1000, 4, -2.0
LIVE_TOKEN = "live-update-token-for-tests"
REDIS_DIM, REDIS_DEFAULT, REDIS_ROWS = 8, 7.0, 200


def param(key: str, value) -> str:
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'


def hps_io() -> str:
    return ('input [ { name: "KEYS" data_type: TYPE_INT64 dims: [ -1 ] },\n'
            '        { name: "NUMKEYS" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')


def embedding_config(name: str, io: str, max_batch_size: int = 0, extra: str = "", **params) -> str:
    text = (f'name: "{name}"\nbackend: "rust"\nmax_batch_size: {max_batch_size}\n{io}'
            'instance_group [ { count: 1 kind: KIND_CPU } ]\n' + extra + param("engine", "embedding"))
    for k, v in params.items():
        text += param(k, v)
    return text


def hps3_config(name: str) -> str:
    return embedding_config(
        name, hps_io(),
        embedding_table_names=",".join(HPS_TABLES),
        embedding_vecsize_per_table=",".join(str(t[1]) for t in HPS_TABLES.values()),
        default_value_for_each_table=",".join(str(t[2]) for t in HPS_TABLES.values()),
        vocabulary_size_per_table=",".join(str(t[3]) for t in HPS_TABLES.values()),
        gpucacheper="0.5")


class Redis:
    """A real redis-server on 127.0.0.1:port (no persistence), and a tiny RESP writer (no redis-py)."""

    def __init__(self, port: int, workdir: str, extra_args=()):
        self.port, self.workdir, self.proc = port, workdir, None
        self.extra_args = list(extra_args)

    def start(self) -> "Redis":
        self.proc = subprocess.Popen(
            ["/usr/bin/redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--dir", self.workdir, "--loglevel", "warning",
             *self.extra_args],
            stdout=open(os.path.join(self.workdir, "redis.log"), "ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.command([b"PING"])
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not start "
                                       f"(see {self.workdir}/redis.log)")
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    @staticmethod
    def encode(parts) -> bytes:
        out = [b"*%d\r\n" % len(parts)]
        for p in parts:
            p = p if isinstance(p, bytes) else str(p).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(p), p))
        return b"".join(out)

    def pipeline(self, commands) -> None:
        """Sends every command at once; each must answer a simple string (+OK, +PONG)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            if s.getsockname() == s.getpeername():
                # no server on the port yet, and the kernel gave this socket the port itself as
                # its source (TCP's self-connect, when the port is in the ephemeral range): it
                # would read back its own command
                raise OSError(f"connected to itself on port {self.port}")
            s.sendall(b"".join(self.encode(c) for c in commands))
            buf, replies = b"", 0
            while replies < len(commands):
                chunk = s.recv(65536)
                if not chunk:
                    raise OSError("redis closed the connection")
                buf += chunk
                while b"\r\n" in buf:
                    line, buf = buf.split(b"\r\n", 1)
                    if line.startswith(b"-"):
                        raise RuntimeError(f"redis error: {line.decode()}")
                    assert line.startswith(b"+"), line
                    replies += 1

    def command(self, parts) -> None:
        self.pipeline([parts])

    def set_rows(self, table: str, keys, rows: np.ndarray) -> None:
        self.pipeline([[b"SET", f"{table}:{k}".encode(), np.ascontiguousarray(r, dtype="<f4").tobytes()]
                       for k, r in zip(keys, rows)])


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    r = Redis(free_ports(1)[0], str(tmp_path_factory.mktemp("redis"))).start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def repo(tmp_path_factory, example_models, redis):
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

    # live_lookup + live_update: one store ("live") seen by a lookup and an update model
    write_table(os.path.join(r.root, "live_lookup", "1", "tables"), "u", LIVE_ROWS, LIVE_DIM, 300)
    live = dict(store_name="live", embedding_table_names="u", embedding_vecsize_per_table=LIVE_DIM,
                default_value_for_each_table=LIVE_DEFAULT, gpucacheper="0.25")
    r.write_config("live_lookup", embedding_config("live_lookup", hps_io(), **live))
    os.makedirs(os.path.join(r.root, "live_update", "1"))
    token_file = os.path.join(r.root, "live_update.token")
    with open(token_file, "w") as f:
        f.write(LIVE_TOKEN + "\n")
    r.write_config("live_update", embedding_config(
        "live_update",
        'input [ { name: "KEYS" data_type: TYPE_INT64 dims: [ -1 ] },\n'
        '        { name: "NUMKEYS" data_type: TYPE_INT32 dims: [ -1 ] },\n'
        '        { name: "VECTORS" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "UPDATED" data_type: TYPE_INT64 dims: [ 1 ] } ]\n',
        embedding_interface="update", sparse_files="../../live_lookup/1/tables/u",
        update_credential_file=token_file, **live))

    # redis_*: a table with no file; rows only from redis
    for name, ratio in (("redis_nocache", "0"), ("redis_cached", "0.1")):
        os.makedirs(os.path.join(r.root, name, "1"))
        r.write_config(name, embedding_config(
            name, hps_io(), embedding_table_names="r", embedding_vecsize_per_table=REDIS_DIM,
            default_value_for_each_table=REDIS_DEFAULT, sparse_files="none",
            volatile_db=f"redis:127.0.0.1:{redis.port}", gpucacheper=ratio))
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


def expected_rows(table: np.ndarray, keys: np.ndarray, default: float) -> np.ndarray:
    rows = np.full((len(keys), table.shape[1]), default, dtype=np.float32)
    known = (keys >= 0) & (keys < len(table))
    rows[known] = table[keys[known]]
    return rows


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


def assert_no_panic(server):
    assert server.alive(), f"tritonserver died; log {server.log_path}"
    log = server.log_text()
    assert "panicked" not in log, "a Rust panic is in the server log:\n" + "\n".join(
        line for line in log.splitlines() if "panic" in line)


def tier_hits(server, model, table):
    return {tier: metric_sum(server, "rust_embedding_hits_total", model=model, table=table, tier=tier)
            for tier in ("cache", "host", "redis", "default")}


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


# ---------------------------------------------------------------------------- online updates


def live_lookup(client, keys):
    keys = np.asarray(keys, dtype=np.int64)
    out = infer(client, "http", "live_lookup", {"KEYS": keys, "NUMKEYS": np.array([len(keys)], np.int32)},
                ["OUTPUT0"])["OUTPUT0"]
    return out.reshape(len(keys), LIVE_DIM)


def live_update(client, keys, rows):
    keys = np.asarray(keys, dtype=np.int64)
    out = infer(client, "http", "live_update",
                {"KEYS": keys, "NUMKEYS": np.array([len(keys)], np.int32),
                 "VECTORS": np.ascontiguousarray(rows, dtype=np.float32).ravel()}, ["UPDATED"],
                parameters={"embedding-update-token": LIVE_TOKEN})["UPDATED"]
    assert out.tolist() == [len(keys)], out
    return len(keys)


def test_online_update(server, repo):
    _, table = read_table(os.path.join(repo.root, "live_lookup", "1", "tables", "u"))
    table = np.asarray(table, dtype=np.float32)
    client = make_client(server, "http")
    sent_updates = sent_keys = 0

    # --- phase 1: existing (cached) and new keys
    cached, untouched, new = [3, 7], [50], [5000, 5001]
    for _ in range(2):  # the second lookup hits the cache
        got = live_lookup(client, cached + untouched + new)
        assert np.array_equal(got[:3], table[cached + untouched])
        assert np.all(got[3:] == LIVE_DEFAULT)
    time.sleep(0.7)
    cache_before = metric_sum(server, "rust_embedding_hits_total", model="live_lookup", table="u", tier="cache")
    assert cache_before >= 3, f"keys {cached + untouched} are not in the cache ({cache_before} cache hits)"
    fresh = np.arange(4 * LIVE_DIM, dtype=np.float32).reshape(4, LIVE_DIM) + 0.125
    sent_keys += live_update(client, cached + new, fresh)
    sent_updates += 1
    got = live_lookup(client, cached + untouched + new)
    assert np.array_equal(got[[0, 1, 3, 4]], fresh), "an update is not visible to the next lookup"
    assert np.array_equal(got[2], table[50])
    print(f"\n[live] phase 1: keys {cached} (cached) and {new} (new) updated, next lookup exact")

    # --- phase 2: 2 writers, 2 readers, ~3 s; a row is key*1000 + version in every element
    keys = list(range(200, 216)) + list(range(9000, 9008))  # existing and new keys; *1000 stays exact in fp32
    owned = [keys[0::2], keys[1::2]]

    def encoded(ks, versions):
        return np.repeat((np.asarray(ks, dtype=np.float32) * 1000 + np.asarray(versions))[:, None], LIVE_DIM, axis=1)

    sent_keys += live_update(client, keys, encoded(keys, [1] * len(keys)))
    sent_updates += 1
    committed = {k: 1 for k in keys}
    stop = threading.Event()
    errors: list = []
    counts = {"updates": 0, "update_keys": 0, "lookups": 0, "rows": 0, "capped": 0}
    lock = threading.Lock()

    def writer(w):
        # each writer owns its keys and sends one request at a time: per key, versions only rise
        c = make_client(server, "http")
        rnd = random.Random(w)
        version = {k: 1 for k in owned[w]}
        try:
            while not stop.is_set():
                live = [k for k in owned[w] if version[k] < 999]
                if not live:
                    counts["capped"] += 1
                    break
                ks = [k for k in live if rnd.random() < 0.25] or [rnd.choice(live)]
                for k in ks:
                    version[k] += 1
                n = live_update(c, ks, encoded(ks, [version[k] for k in ks]))
                with lock:
                    for k in ks:
                        committed[k] = version[k]
                    counts["updates"] += 1
                    counts["update_keys"] += n
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(f"writer {w}: {e!r}")
        finally:
            c.close()

    def reader(r):
        c = make_client(server, "http")
        rnd = random.Random(100 + r)
        last = {k: 1 for k in keys}
        try:
            while not stop.is_set():
                ks = keys + rnd.sample(keys, 4)  # every key, some twice
                rnd.shuffle(ks)
                got = live_lookup(c, ks)
                for k, row in zip(ks, got):
                    if not np.all(row == row[0]):
                        errors.append(f"reader {r}: key {k} got a torn row {row.tolist()}")
                        return
                    v = int(row[0])
                    if float(v) != float(row[0]) or v // 1000 != k or v % 1000 < 1:
                        errors.append(f"reader {r}: key {k} got another key's row {row.tolist()}")
                        return
                    if v % 1000 < last[k]:
                        errors.append(f"reader {r}: key {k} went back from version {last[k]} to {v % 1000}")
                        return
                    last[k] = v % 1000
                with lock:
                    counts["lookups"] += 1
                    counts["rows"] += len(ks)
        except Exception as e:  # noqa: BLE001
            errors.append(f"reader {r}: {e!r}")
        finally:
            c.close()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(2)] + \
              [threading.Thread(target=reader, args=(r,)) for r in range(2)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(3.0)
    stop.set()
    for t in threads:
        t.join(60)
    elapsed = time.monotonic() - t0
    sent_updates += counts["updates"]
    sent_keys += counts["update_keys"]
    print(f"[live] phase 2: {elapsed:.1f} s, {counts['updates']} updates ({counts['update_keys']} keys), "
          f"{counts['lookups']} lookups ({counts['rows']} rows checked), highest version "
          f"{max(committed.values())}, writers out of versions (999): {counts['capped']}")
    assert not errors, "\n".join(errors[:10])
    assert counts["updates"] > 20 and counts["lookups"] > 20, counts
    # after the writers stop, every key reads its last committed version (no stale row left in a cache)
    for _ in range(2):
        got = live_lookup(client, keys)
        assert np.array_equal(got, encoded(keys, [committed[k] for k in keys])), (
            "final rows differ from the last committed versions: "
            + str([(k, int(g[0]) % 1000, committed[k]) for k, g in zip(keys, got) if int(g[0]) % 1000 != committed[k]]))
    client.close()

    upd = wait_metric(server, "rust_embedding_updates_total", sent_updates, model="live_update", table="u")
    upd_keys = wait_metric(server, "rust_embedding_updated_keys_total", sent_keys, model="live_update", table="u")
    lag = metric_sum(server, "rust_embedding_update_lag_seconds_total", model="live_update", table="u")
    dropped = metric_sum(server, "rust_embedding_cache_fills_dropped_total", model="live_lookup", table="u")
    print(f"[live] metrics: updates_total {upd:.0f} (sent {sent_updates}), updated_keys_total {upd_keys:.0f} "
          f"(sent {sent_keys}), update lag total {lag:.4f} s, cache fills dropped {dropped:.0f}")
    assert upd == sent_updates and upd_keys == sent_keys
    assert_no_panic(server)


# ---------------------------------------------------------------------------- redis tier


def redis_lookup(client, model, keys, dim=REDIS_DIM):
    keys = np.asarray(keys, dtype=np.int64)
    out = infer(client, "http", model, {"KEYS": keys, "NUMKEYS": np.array([len(keys)], np.int32)}, ["OUTPUT0"])
    return out["OUTPUT0"].reshape(len(keys), dim)


def test_redis_tier(server, redis):
    rng = np.random.default_rng(21)
    rows = (rng.standard_normal((REDIS_ROWS, REDIS_DIM)) * 0.05).astype(np.float32)
    keys_all = np.arange(REDIS_ROWS, dtype=np.int64)
    redis.set_rows("r", keys_all, rows)
    client = make_client(server, "http")
    models = ("redis_nocache", "redis_cached")

    def request_keys():
        ks = np.concatenate([rng.choice(keys_all, 24), [REDIS_ROWS + 5, 10_000]])  # 2 keys redis lacks
        rng.shuffle(ks)
        return ks

    def expected(ks):
        return expected_rows(rows, ks, REDIS_DEFAULT)

    # --- redis up: exact rows from redis
    for model in models:
        for _ in range(5):
            ks = request_keys()
            assert np.array_equal(redis_lookup(client, model, ks), expected(ks)), f"{model}: rows differ from redis"
    time.sleep(0.7)
    up_hits = {m: tier_hits(server, m, "r") for m in models}
    print(f"\n[redis] up: hits by tier {up_hits}")
    assert up_hits["redis_nocache"]["redis"] > 0 and up_hits["redis_nocache"]["cache"] == 0
    assert up_hits["redis_cached"]["redis"] > 0
    errors_before = {m: metric_sum(server, "rust_embedding_redis_errors_total", model=m, table="r") for m in models}

    # a reader that keeps going through the stop and the restart: always answered, each row right or default
    bg_stop, bg = threading.Event(), {"lookups": 0, "exact": 0, "default": 0, "errors": []}

    def background():
        c = make_client(server, "http")
        try:
            while not bg_stop.is_set():
                ks = keys_all[rng_bg.integers(0, REDIS_ROWS, 16)]
                got = redis_lookup(c, "redis_nocache", ks)
                bg["lookups"] += 1
                for k, row in zip(ks, got):
                    if np.array_equal(row, rows[k]):
                        bg["exact"] += 1
                    elif np.all(row == REDIS_DEFAULT):
                        bg["default"] += 1
                    else:
                        bg["errors"].append(f"key {k} got {row.tolist()}")
                time.sleep(0.005)
        except Exception as e:  # noqa: BLE001 - reported by the test
            bg["errors"].append(repr(e))
        finally:
            c.close()

    rng_bg = np.random.default_rng(22)
    bg_thread = threading.Thread(target=background)
    bg_thread.start()
    time.sleep(0.3)

    # --- redis stopped: 200 with the default vector (or, in the cache, the right row), never a wrong one
    redis.stop()
    t0, n, cached_rows, worst = time.monotonic(), 0, 0, 0.0
    while time.monotonic() - t0 < 1.5:
        for model in models:
            ks = request_keys()
            s = time.monotonic()
            got = redis_lookup(client, model, ks)
            worst = max(worst, time.monotonic() - s)
            n += 1
            for k, row in zip(ks, got):
                if np.all(row == REDIS_DEFAULT):
                    continue
                assert model == "redis_cached" and k < REDIS_ROWS and np.array_equal(row, rows[k]), (
                    f"{model}: key {k} got {row.tolist()} with redis down")
                cached_rows += 1
    time.sleep(0.7)
    errors_after = {m: metric_sum(server, "rust_embedding_redis_errors_total", model=m, table="r") for m in models}
    print(f"[redis] down: {n} lookups all answered (slowest {worst * 1000:.0f} ms), {cached_rows} rows from the "
          f"cache, redis_errors_total {errors_before} -> {errors_after}")
    for m in models:
        assert errors_after[m] > errors_before[m], f"{m}: rust_embedding_redis_errors_total did not rise"
    assert server.alive()

    # --- redis back on the same port, repopulated: exact rows again, no server restart
    redis.start()
    redis.set_rows("r", keys_all, rows)
    t1 = time.monotonic()
    recovered = {}
    while len(recovered) < len(models) and time.monotonic() - t1 < 10:
        for model in models:
            if model in recovered:
                continue
            ks = keys_all[rng.permutation(REDIS_ROWS)[:40]]
            if np.array_equal(redis_lookup(client, model, ks), expected(ks)):
                recovered[model] = time.monotonic() - t1
        time.sleep(0.05)
    print(f"[redis] restarted: exact rows again after {recovered} s")
    assert set(recovered) == set(models), f"no recovery within 10 s: {recovered}"
    for model in models:
        ks = request_keys()
        assert np.array_equal(redis_lookup(client, model, ks), expected(ks))
    time.sleep(0.3)
    bg_stop.set()
    bg_thread.join(30)
    print(f"[redis] background reader through stop and restart: {bg['lookups']} lookups, {bg['exact']} exact rows, "
          f"{bg['default']} default rows, problems {bg['errors'][:5]}")
    assert not bg["errors"], bg["errors"][:10]
    assert bg["exact"] > 0 and bg["default"] > 0
    client.close()
    assert_no_panic(server)


def test_server_alive_no_panic(server):
    assert_no_panic(server)
    print(f"\n[server] alive, log {server.log_path} ({len(server.log_text())} bytes), no 'panicked'")
