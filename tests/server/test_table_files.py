"""Table files changed under a serving tritonserver, as an operator's deploy script changes them:
one copied over in place (cut first, then written) and one rewritten at its full size, while
requests keep coming. The server lives on and every other model answers; the changed model's
lookups fail naming the table and its file (rows read from the file's mapping, `host_memory:
mapped`) or keep serving the rows loaded (rows copied at load, `huge_pages`), and a reload
serves the new file.

Without the guard in `crates/os/src/guard.rs`, the first read past a cut file's end raises
SIGBUS and tritonserver exits with -7, every model gone.
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from conftest import module_server
from make_tables import read_table, write_table
from tritonserver_harness import ModelRepo, infer, make_client

ROWS, DIM = 8192, 256  # 1 KiB rows: 8 MiB a table, so a cut leaves whole pages past its end
MODELS = {"cut_mapped": "mapped", "rewritten_mapped": "mapped", "cut_copied": "huge_pages",
          "bystander": "mapped"}


def config(name: str, host_memory: str) -> str:
    params = dict(engine="embedding", embedding_interface="batched", embedding_table_names="t",
                  embedding_vecsize_per_table=DIM, gpucacheper="0.01", host_memory=host_memory)
    return (f'name: "{name}"\nbackend: "rust"\nmax_batch_size: 64\n'
            'input [ { name: "KEYS" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
            f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, {DIM} ] }} ]\n'
            'instance_group [ { count: 2 kind: KIND_CPU } ]\ndynamic_batching { }\n'
            + "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in params.items()))


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    r = ModelRepo(str(tmp_path_factory.mktemp("table-files")))
    for seed, (name, placement) in enumerate(MODELS.items()):
        write_table(os.path.join(r.root, name, "1", "tables"), "t", ROWS, DIM, 900 + seed)
        r.write_config(name, config(name, placement))
    return r


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, repo):
    return module_server(request, tmp_path_factory, repo, "--model-control-mode=explicit",
                         *[f"--load-model={m}" for m in MODELS])


def table_dir(repo, model: str) -> str:
    return os.path.join(repo.root, model, "1", "tables", "t")


def rows_of(repo, model: str) -> np.ndarray:
    return np.asarray(read_table(table_dir(repo, model))[1], dtype=np.float32).copy()


def lookup(client, model: str, keys) -> np.ndarray:
    keys = np.asarray(keys, np.int64).reshape(-1, 1)
    return infer(client, "grpc", model, {"KEYS": keys}, ["OUTPUT0"])["OUTPUT0"].reshape(len(keys), DIM)


def cut(path: str, keep_rows: int) -> None:
    """The file cut to its header and first rows in place, as `cp` over it first does."""
    with open(path, "r+b") as f:
        head = f.read(128)
        at = head.index(b"\n") + 1  # .npy v1: the header ends at its newline
        f.truncate(at + keep_rows * DIM * 4)


def rewrite(path: str, seed: int) -> None:
    """The same file written again in place at its full size with other rows."""
    rng = np.random.default_rng(seed)
    with open(path, "r+b") as f:
        head = f.read(128)
        at = head.index(b"\n") + 1
        f.seek(at)
        f.write((rng.standard_normal((ROWS, DIM), dtype=np.float32)).tobytes())


class Load:
    """Requests to every model on threads, each answer checked against the rows loaded; what
    each model answered and refused is counted."""

    def __init__(self, server, loaded):
        self.server, self.loaded, self.stop = server, loaded, threading.Event()
        self.answers = {m: 0 for m in loaded}
        self.errors = {m: [] for m in loaded}
        self.wrong = {m: 0 for m in loaded}
        self.threads = [threading.Thread(target=self.run, args=(m, i), daemon=True)
                        for i, m in enumerate(loaded)]

    def run(self, model, seed):
        rng = np.random.default_rng(seed)
        client = make_client(self.server, "grpc")
        while not self.stop.is_set():
            keys = rng.integers(0, ROWS, size=16)
            try:
                got = lookup(client, model, keys)
            except Exception as e:  # noqa: BLE001 - an answer refused is what is counted
                self.errors[model].append(str(e))
                time.sleep(0.01)
                continue
            self.answers[model] += 1
            if not np.array_equal(got, self.loaded[model][keys]):
                self.wrong[model] += 1
        client.close()

    def __enter__(self):
        for t in self.threads:
            t.start()
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        time.sleep(0.5)
        self.stop.set()
        for t in self.threads:
            t.join(30)


def reload(server, model: str, timeout: float = 120.0) -> None:
    """The model unloaded, then loaded again from its files. A load of the loaded model, its
    config unchanged, kept the old one; and Triton's unload returns before the model has gone
    (a load sent then was answered by the old one on a busy machine): wait until the index
    says it is unloaded."""
    server.unload(model).raise_for_status()
    server.wait_unloaded(model, timeout)
    server.load(model).raise_for_status()
    assert server.model_ready(model)


def test_files_changed_under_load_never_take_the_server_down(server, repo):
    loaded = {m: rows_of(repo, m) for m in MODELS}
    with Load(server, loaded) as load:
        before = dict(load.answers)
        cut(os.path.join(table_dir(repo, "cut_mapped"), "vectors.npy"), keep_rows=100)
        cut(os.path.join(table_dir(repo, "cut_copied"), "vectors.npy"), keep_rows=100)
        time.sleep(2.0)
        rewrite(os.path.join(table_dir(repo, "rewritten_mapped"), "vectors.npy"), seed=77)
        time.sleep(2.0)
    assert server.alive(), f"tritonserver died:\n{server.log_text()[-3000:]}"
    for m in MODELS:  # what each model was refused, for a failure below
        print(f"[table files] {m}: {len(load.errors[m])} refused, last: {load.errors[m][-1:]}")
    print("\n[table files] answers during the load: "
          + ", ".join(f"{m} {load.answers[m] - before[m]} more, {len(load.errors[m])} refused" for m in MODELS))
    # the bystander and the model whose rows were copied at load answered throughout, exactly
    for m in ("bystander", "cut_copied"):
        assert not load.errors[m], load.errors[m][:3]
        assert load.wrong[m] == 0 and load.answers[m] > before[m]
    # the changed mapped models refuse, naming the table and its file, and never answer wrong
    for m, why in (("cut_mapped", "cut (truncated)"), ("rewritten_mapped", "changed since it was loaded")):
        assert load.wrong[m] == 0, f"{m} answered rows that are not the ones loaded"
        assert load.errors[m], f"{m} kept answering from a changed file"
        last = load.errors[m][-1]
        assert "table 't'" in last and f"{m}/1/tables/t/vectors.npy" in last and why in last, last
        assert "loaded again" in last, last
    # the bystander still answers exactly after the load, and a reload serves the new files
    client = make_client(server, "grpc")
    keys = np.arange(0, ROWS, 131)  # 63 keys: under max_batch_size
    assert np.array_equal(lookup(client, "bystander", keys), loaded["bystander"][keys])
    rewritten = rows_of(repo, "rewritten_mapped")
    reload(server, "rewritten_mapped")
    assert np.array_equal(lookup(client, "rewritten_mapped", keys), rewritten[keys])
    client.close()
