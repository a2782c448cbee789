"""The embedding engine through the real tritonserver: rows that change under a running server.

One server serves every model of this module:
  live_lookup   HPS lookups of store "live"; live_update writes rows into the same store
  redis_nocache a table with no file, rows from a real redis-server, no cache (gpucacheper 0)
  redis_cached  the same with the default cache

The lookups of rows loaded from files (HPS and batched interfaces, bad input, metric counts)
are in test_embedding.py; the shared config text and checks in embedding_helpers.py.

Every comparison is exact (np.array_equal): the store hands out the stored float32 bits.
"""

from __future__ import annotations

import os
import random
import threading
import time

import numpy as np
import pytest

from conftest import module_server
from embedding_helpers import (
    REDIS_DIM,
    Redis,
    assert_no_panic,
    embedding_config,
    expected_rows,
    hps_io,
    redis_lookup,
    tier_hits,
)
from tritonserver_harness import ModelRepo, free_ports, infer, make_client, metric_sum, wait_metric
from make_tables import read_table, write_table

# ---------------------------------------------------------------------------- tables and configs

LIVE_ROWS, LIVE_DIM, LIVE_DEFAULT = 1000, 4, -2.0
LIVE_TOKEN = "live-update-token-for-tests"
REDIS_DEFAULT, REDIS_ROWS = 7.0, 200


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    r = Redis(free_ports(1)[0], str(tmp_path_factory.mktemp("redis"))).start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def repo(tmp_path_factory, example_models, redis):
    r = ModelRepo(str(tmp_path_factory.mktemp("embedding-updates-repo")))
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

