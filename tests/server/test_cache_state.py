"""Warm restarts under the real tritonserver: a store whose caches save the keys they hold
(`cache_state_dir`) is unloaded and loaded again, and its first requests hit the cache with the
table's rows; a file cut short, damaged or written for another store is a warning in the log, the
model loads with empty caches and answers every request with the right rows. A model whose caches
are pinned (`gpucache_policy: pinned`) to the keys of such a file holds them from load to unload."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from conftest import module_server
from make_tables import read_table, write_table
from tritonserver_harness import ModelRepo, infer, make_client, metric_sum, wait_metric

ROWS, DIM = 20000, 16
MODELS = ("warm", "warm_other")


def config(name: str, **cache) -> str:
    params = dict(engine="embedding", embedding_interface="batched", embedding_table_names="t",
                  embedding_vecsize_per_table=DIM, gpucacheper="0.2", hit_rate_threshold="1.0",
                  **(cache or dict(cache_state_dir="state")))
    return (f'name: "{name}"\nbackend: "rust"\nmax_batch_size: 512\n'
            'input [ { name: "KEYS" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
            f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, {DIM} ] }} ]\n'
            'instance_group [ { count: 1 kind: KIND_CPU } ]\n'
            + "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in params.items()))


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    r = ModelRepo(str(tmp_path_factory.mktemp("cache-state")))
    for seed, name in enumerate(MODELS):
        # warm_other's table has other rows: its state file is another store's
        write_table(os.path.join(r.root, name, "1", "tables"), "t", ROWS + 1000 * seed, DIM, 300 + seed)
        r.write_config(name, config(name))
    # pinned: warm's table, its caches holding the keys of a file warm saved (loaded by its test)
    write_table(os.path.join(r.root, "pinned", "1", "tables"), "t", ROWS, DIM, 300)
    r.write_config("pinned", config("pinned", gpucache_policy="pinned",
                                     gpucache_pinned_keys=os.path.join(r.root, "pinned.cache_keys")))
    return r


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, repo):
    return module_server(request, tmp_path_factory, repo, "--model-control-mode=explicit",
                         *[f"--load-model={m}" for m in MODELS])


def state_file(repo, model: str) -> str:
    return os.path.join(repo.root, model, "1", "state", f"{model}.cpu.cache_keys")


def rows_of(repo, model: str) -> np.ndarray:
    return np.asarray(read_table(os.path.join(repo.root, model, "1", "tables", "t"))[1], dtype=np.float32)


def lookup(client, model: str, keys) -> np.ndarray:
    keys = np.asarray(keys, np.int64).reshape(-1, 1)
    return infer(client, "grpc", model, {"KEYS": keys}, ["OUTPUT0"])["OUTPUT0"].reshape(len(keys), DIM)


def restart(server, model: str) -> None:
    server.unload(model).raise_for_status()
    server.wait_unloaded(model, 120)
    server.load(model).raise_for_status()
    assert server.model_ready(model)


def cache_hits(server, model: str) -> float:
    return metric_sum(server, "rust_embedding_hits_total", model=model, table="t", tier="cache")


HOT = np.random.default_rng(3).choice(ROWS, size=600, replace=False)


def test_a_restarted_model_answers_its_first_requests_from_the_cache(server, repo):
    # the first load found no file: a warning, and the model served
    assert "no cache state at" in server.log_text() and "its caches start empty" in server.log_text()
    client = make_client(server, "grpc")
    rows = rows_of(repo, "warm")
    for _ in range(2):  # the first pass fills the cache, the second hits it
        for part in np.array_split(HOT, 4):
            assert np.array_equal(lookup(client, "warm", part), rows[part])
    held = wait_metric(server, "rust_embedding_cache_rows", len(HOT), model="warm", table="t")
    assert held == len(HOT), f"the cache holds the hot keys before the restart: {held}"
    restart(server, "warm")
    assert os.path.exists(state_file(repo, "warm")), "saved at unload"
    assert "warmed its caches with 600 rows" in server.log_text()
    # the first request after the restart: every key a hit, the table's rows
    held = wait_metric(server, "rust_embedding_cache_rows", len(HOT), model="warm", table="t")
    assert held == len(HOT), f"the restarted cache holds them at once: {held}"
    before = cache_hits(server, "warm")
    assert np.array_equal(lookup(client, "warm", HOT[:500]), rows[HOT[:500]])
    hits = wait_metric(server, "rust_embedding_hits_total", before + 500, model="warm", table="t", tier="cache")
    print(f"[cache state] after a restart: {held:.0f} rows held at load, the first request of 500 keys: "
          f"{hits - before:.0f} cache hits")
    assert hits - before == 500
    client.close()


def test_pinned_caches_hold_the_keys_of_their_file_and_take_no_miss_in(server, repo):
    client = make_client(server, "grpc")
    rows = rows_of(repo, "warm")
    for _ in range(2):
        for part in np.array_split(HOT, 4):
            lookup(client, "warm", part)
    restart(server, "warm")  # saved at unload: the hot keys, another store's file
    shutil.copy(state_file(repo, "warm"), os.path.join(repo.root, "pinned.cache_keys"))
    server.load("pinned").raise_for_status()
    assert server.model_ready("pinned")
    assert "gpucache_pinned_keys: warmed its caches with 600 rows" in server.log_text()
    assert wait_metric(server, "rust_embedding_cache_rows", len(HOT), model="pinned", table="t") == len(HOT)
    cold = np.setdiff1d(np.arange(0, ROWS, 7), HOT)[:2000]
    before = cache_hits(server, "pinned")
    for _ in range(3):  # looked up again and again, never taken in
        for part in np.array_split(cold, 4):
            assert np.array_equal(lookup(client, "pinned", part), rows[part])
    assert np.array_equal(lookup(client, "pinned", HOT[:500]), rows[HOT[:500]])
    hits = wait_metric(server, "rust_embedding_hits_total", before + 500, model="pinned", table="t", tier="cache")
    held = metric_sum(server, "rust_embedding_cache_rows", model="pinned", table="t")
    print(f"[cache state] pinned to 600 keys: {3 * len(cold)} lookups of {len(cold)} other keys, then 500 of "
          f"the pinned: {hits - before:.0f} cache hits, {held:.0f} rows held")
    assert hits - before == 500 and held == len(HOT)
    server.unload("pinned").raise_for_status()
    client.close()


@pytest.mark.parametrize("damage", ["cut", "flipped", "other_store"])
def test_an_unusable_state_file_is_a_warning_and_the_model_serves(server, repo, damage):
    client = make_client(server, "grpc")
    rows = rows_of(repo, "warm")
    lookup(client, "warm", HOT[:100])  # something held, so that a file exists after the unload
    server.unload("warm").raise_for_status()
    server.wait_unloaded("warm", 120)
    path = state_file(repo, "warm")
    if damage == "cut":
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - 12)
        why = "cut short"
    elif damage == "flipped":
        with open(path, "r+b") as f:
            f.seek(-5, os.SEEK_END)
            b = f.read(1)
            f.seek(-5, os.SEEK_END)
            f.write(bytes([b[0] ^ 0x10]))
        why = "damaged"
    else:
        # warm_other's file: another store's name and another table's rows
        lookup(client, "warm_other", HOT[:100])
        restart(server, "warm_other")
        shutil.copy(state_file(repo, "warm_other"), path)
        why = "written for store 'warm_other'"
    log_at = len(server.log_text())
    server.load("warm").raise_for_status()
    assert server.model_ready("warm")
    log = server.log_text()[log_at:]
    assert "is not used" in log and why in log and "its caches start empty" in log, log[-3000:]
    assert wait_metric(server, "rust_embedding_cache_rows", 0, model="warm", table="t") == 0
    keys = np.arange(0, ROWS, 41)
    assert np.array_equal(lookup(client, "warm", keys), rows[keys])
    print(f"[cache state] a {damage} file: refused ({why}), the model served {len(keys)} keys exactly")
    client.close()
