"""Online embedding updates fit for production (issue 11), against the real tritonserver
and a real redis-server:

- authenticated: an update model refuses to load without a credential source (unless it
  says updates are open); updates without the credential, or with a wrong one, are
  refused and change nothing; the secret never shows in the config API or the log;
- durable: acknowledged updates survive SIGKILL and a model reload;
- fed from a stream: two servers follow one Redis Stream and converge; one stopped
  mid-stream catches up; the lag metric returns to 0;
- bounded: the overlay is compacted, RSS bounded over 1 M updated rows.

Every model here is a store "upd" with one table "u" (files in emb_lookup/1/tables/u):
emb_lookup serves HPS lookups, emb_update writes rows.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))

from tritonserver_harness import (  # noqa: E402
    TritonServer,
    free_ports,
    infer,
    make_client,
    metric_sum,
    scrape_metrics,
)

ROWS, DIM = 1000, 8
TOKEN = "s3cret-update-token-1f2e"
HEADER = "embedding-update-token"


def param(key: str, value) -> str:
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'


HPS_IO = ('input [ { name: "KEYS" data_type: TYPE_INT64 dims: [ -1 ] },\n'
          '        { name: "NUMKEYS" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
          'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')
UPDATE_IO = ('input [ { name: "KEYS" data_type: TYPE_INT64 dims: [ -1 ] },\n'
             '        { name: "NUMKEYS" data_type: TYPE_INT32 dims: [ -1 ] },\n'
             '        { name: "VECTORS" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
             'output [ { name: "UPDATED" data_type: TYPE_INT64 dims: [ 1 ] } ]\n')


def base_rows(rows=ROWS, dim=DIM):
    keys = np.arange(rows, dtype=np.int64)
    return keys, (keys[:, None] * 10.0 + np.arange(dim)[None, :] * 0.01).astype(np.float32)


def write_repo(root: str, token_file: str | None, rows=ROWS, dim=DIM, **store) -> str:
    """emb_lookup + emb_update (+ any store parameters on both); returns root."""
    tables = os.path.join(root, "emb_lookup", "1", "tables", "u")
    os.makedirs(tables, exist_ok=True)
    keys, vecs = base_rows(rows, dim)
    np.save(os.path.join(tables, "keys.npy"), keys)
    np.save(os.path.join(tables, "vectors.npy"), vecs)
    common = dict(store_name="upd", embedding_table_names="u", embedding_vecsize_per_table=dim,
                  default_value_for_each_table=-1.0, gpucacheper=0.25, **store)
    cfg = lambda name, io, extra: (f'name: "{name}"\nbackend: "rust"\nmax_batch_size: 0\n{io}'  # noqa: E731
                                   'instance_group [ { count: 1 kind: KIND_CPU } ]\n' + param("engine", "embedding")
                                   + "".join(param(k, v) for k, v in {**common, **extra}.items()))
    with open(os.path.join(root, "emb_lookup", "config.pbtxt"), "w") as f:
        f.write(cfg("emb_lookup", HPS_IO, {}))
    os.makedirs(os.path.join(root, "emb_update", "1"), exist_ok=True)
    extra = {"embedding_interface": "update", "sparse_files": "../../emb_lookup/1/tables/u"}
    if token_file:
        extra["update_credential_file"] = token_file
    with open(os.path.join(root, "emb_update", "config.pbtxt"), "w") as f:
        f.write(cfg("emb_update", UPDATE_IO, extra))
    return root


def token_file(dirpath: str) -> str:
    path = os.path.join(dirpath, "update.token")
    with open(path, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(path, 0o600)
    return path


def lookup(client, keys, dim=DIM):
    keys = np.asarray(keys, dtype=np.int64)
    out = infer(client, "http", "emb_lookup", {"KEYS": keys, "NUMKEYS": np.array([len(keys)], np.int32)},
                ["OUTPUT0"])["OUTPUT0"]
    return out.reshape(len(keys), dim)


def update(client, keys, rows, token=TOKEN, protocol="http", **kw):
    keys = np.asarray(keys, dtype=np.int64)
    params = {} if token is None else {HEADER: token}
    out = infer(client, protocol, "emb_update",
                {"KEYS": keys, "NUMKEYS": np.array([len(keys)], np.int32),
                 "VECTORS": np.ascontiguousarray(rows, dtype=np.float32).ravel()}, ["UPDATED"],
                parameters=params, **kw)["UPDATED"]
    assert out.tolist() == [len(keys)], out
    return len(keys)


def rows_for(keys, version, dim=DIM):
    keys = np.asarray(keys, dtype=np.int64)
    return (keys[:, None] * 1000.0 + version + np.arange(dim)[None, :] * 1e-3).astype(np.float32)


def start(repo: str, log_dir: str, *args: str, **kw) -> TritonServer:
    return TritonServer(repo, args, log_dir=log_dir, **kw).start()


# ------------------------------------------------------------------ authentication


def test_updates_need_the_credential_and_never_show_it(tmp_path, example_models):
    repo = write_repo(str(tmp_path / "repo"), token_file(str(tmp_path)))
    srv = start(repo, str(tmp_path / "log"), f"--http-header-forward-pattern={HEADER}",
                f"--grpc-header-forward-pattern={HEADER}", "--log-verbose=1")
    try:
        http = make_client(srv, "http")
        grpc = make_client(srv, "grpc")
        keys = [3, 4]
        before = lookup(http, keys)
        for token, what in ((None, "no credential"), ("wrong-token", "a wrong credential"), (TOKEN[:-1], "a prefix of it")):
            with pytest.raises(Exception) as e:
                update(http, keys, rows_for(keys, 1), token=token)
            msg = str(e.value)
            assert "update refused" in msg and HEADER in msg, msg
            assert TOKEN not in msg
            print(f"\n[auth] {what}: refused: {msg.strip()[:150]}")
        assert np.array_equal(lookup(http, keys), before), "a refused update changed a row"

        update(http, keys, rows_for(keys, 1))  # request parameter over HTTP
        assert np.array_equal(lookup(http, keys), rows_for(keys, 1))
        # the same credential as a header, forwarded by the server as a parameter
        update(http, keys, rows_for(keys, 2), token=None, headers={HEADER: TOKEN})
        assert np.array_equal(lookup(http, keys), rows_for(keys, 2))
        update(grpc, keys, rows_for(keys, 3), token=None, protocol="grpc", headers={HEADER: TOKEN})
        assert np.array_equal(lookup(http, keys), rows_for(keys, 3))
        with pytest.raises(Exception):
            update(grpc, keys, rows_for(keys, 4), token=None, protocol="grpc", headers={HEADER: "nope"})
        assert np.array_equal(lookup(http, keys), rows_for(keys, 3))
        print("[auth] with the credential (request parameter, HTTP header, gRPC metadata): applied")

        time.sleep(0.7)
        refused = metric_sum(srv, "rust_embedding_updates_refused_total", model="emb_update")
        assert refused == 4, refused
        config = srv.http("GET", "/v2/models/emb_update/config").text
        assert "update_credential_file" in config and TOKEN not in config
        srv.stop()
        log = srv.log_text()
        assert TOKEN not in log, "the secret appeared in the server log"
        print(f"[auth] refused counter {refused:.0f}; the secret is in neither the config API's answer "
              f"({len(config)} bytes) nor the server log ({len(log)} bytes)")
    finally:
        srv.stop()


def test_an_update_model_without_a_credential_does_not_load(tmp_path, example_models):
    repo = write_repo(str(tmp_path / "repo"), None)
    srv = start(repo, str(tmp_path / "log"), "--model-control-mode=explicit", "--load-model=emb_lookup")
    try:
        r = srv.load("emb_update")
        assert r.status_code != 200
        assert "update_credential_file" in r.text and "allow_unauthenticated_updates" in r.text, r.text
        print(f"\n[auth] no credential source: load refused: {r.json()['error'][:200]}")
        # saying so explicitly opens it, with a warning in the log
        with open(os.path.join(repo, "emb_update", "config.pbtxt"), "a") as f:
            f.write(param("allow_unauthenticated_updates", "true"))
        r = srv.load("emb_update")
        assert r.status_code == 200, r.text
        client = make_client(srv, "http")
        update(client, [5], rows_for([5], 7), token=None)
        assert np.array_equal(lookup(client, [5]), rows_for([5], 7))
        assert "updates are NOT authenticated" in srv.log_text()
        print("[auth] allow_unauthenticated_updates: true loads, warns, and applies updates")
    finally:
        srv.stop()


# ------------------------------------------------------------------ durability


def test_acknowledged_updates_survive_sigkill_and_reload(tmp_path, example_models):
    repo = write_repo(str(tmp_path / "repo"), token_file(str(tmp_path)))
    args = ("--model-control-mode=explicit", "--load-model=emb_lookup", "--load-model=emb_update")
    srv = start(repo, str(tmp_path / "log1"), *args)
    rng = np.random.default_rng(11)
    expected = {}
    n = 200
    try:
        client = make_client(srv, "http")
        for i in range(n):
            keys = rng.choice(ROWS + 500, size=int(rng.integers(1, 6)), replace=False)  # some keys are new
            update(client, keys, rows_for(keys, i))
            for k, row in zip(keys.tolist(), rows_for(keys, i)):
                expected[k] = row
        srv.proc.kill()  # SIGKILL right after the last acknowledgement
        srv.proc.wait(10)
    finally:
        srv.stop()
    keys = np.array(sorted(expected), dtype=np.int64)
    want = np.stack([expected[k] for k in keys.tolist()])
    srv = start(repo, str(tmp_path / "log2"), *args)
    try:
        client = make_client(srv, "http")
        got = lookup(client, keys)
        assert np.array_equal(got, want), f"{int((got != want).any(axis=1).sum())} of {len(keys)} rows lost"
        untouched = np.setdiff1d(np.arange(ROWS), keys)[:50]
        assert np.array_equal(lookup(client, untouched), base_rows()[1][untouched])
        replayed = metric_sum(srv, "rust_embedding_replayed_rows", model="emb_lookup")
        print(f"\n[durable] {n} acknowledged updates ({len(keys)} distinct keys), SIGKILL, restart: "
              f"all {len(keys)} rows exact ({replayed:.0f} rows replayed from the log)")
        for m in ("emb_update", "emb_lookup"):
            assert srv.unload(m).status_code == 200
        for m in ("emb_update", "emb_lookup"):
            srv.wait_unloaded(m, 30)
        for m in ("emb_lookup", "emb_update"):
            assert srv.load(m).status_code == 200
        assert np.array_equal(lookup(client, keys), want)
        update(client, [1], rows_for([1], 999))
        assert np.array_equal(lookup(client, [1]), rows_for([1], 999))
        print("[durable] unload + load of both models: every row still exact, updates still accepted")
    finally:
        srv.stop()


# ------------------------------------------------------------------ Redis Streams


class RedisServer:
    def __init__(self, workdir: str):
        self.port = free_ports(1)[0]
        self.proc = subprocess.Popen(["/usr/bin/redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--dir", workdir],
                                     stdout=open(os.path.join(workdir, "redis.log"), "ab"), stderr=subprocess.STDOUT)
        import redis

        self.client = redis.Redis(port=self.port)
        for _ in range(100):
            try:
                self.client.ping()
                return
            except Exception:
                time.sleep(0.1)
        raise RuntimeError("redis-server did not start")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


def metric(server, family, **labels):
    """The sum over matching series, or None when the server publishes none (yet)."""
    rows = [v for n, lab, v in scrape_metrics(server) if n == family and all(lab.get(k) == w for k, w in labels.items())]
    return sum(rows) if rows else None


def wait_until(pred, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def test_two_servers_follow_a_stream_and_converge(tmp_path, example_models):
    from publish_updates import publish

    redis = RedisServer(str(tmp_path))
    stream = f"redis:127.0.0.1:{redis.port}/updates"
    repos = {}
    for node in ("a", "b"):
        repos[node] = write_repo(str(tmp_path / f"repo_{node}"), token_file(str(tmp_path)), update_stream=stream)
    servers = {node: start(repos[node], str(tmp_path / f"log_{node}"), f"--backend-config=rust,node-name={node}")
               for node in repos}
    try:
        rng = np.random.default_rng(5)
        expected = {}
        total = 300
        for i in range(total):
            keys = rng.choice(ROWS + 200, size=int(rng.integers(1, 9)), replace=False)
            publish(redis.client, "updates", "u", keys, rows_for(keys, i))
            for k, row in zip(keys.tolist(), rows_for(keys, i)):
                expected[k] = row
            if i == 100:
                servers["b"].stop()  # b stops mid-stream (SIGTERM) while the producer goes on
                print(f"\n[stream] server b stopped after entry {i}")
            if i % 50 == 0:
                time.sleep(0.05)
        # one malformed entry: skipped, counted, acknowledged; it must not block the stream
        redis.client.xadd("updates", {"table": "nope", "keys": b"", "vectors": b""})
        servers["b"] = start(repos["b"], str(tmp_path / "log_b2"), "--backend-config=rust,node-name=b")
        keys = np.array(sorted(expected), dtype=np.int64)
        want = np.stack([expected[k] for k in keys.tolist()])
        for node, srv in servers.items():
            wait_until(lambda: metric(srv, "rust_embedding_stream_lag", model="emb_lookup") == 0
                       and metric(srv, "rust_embedding_stream_pending", model="emb_lookup") == 0
                       and metric(srv, "rust_embedding_stream_connected", model="emb_lookup") == 1, 60,
                       f"server {node} to catch up")
            client = make_client(srv, "http")
            wait_until(lambda: np.array_equal(lookup(client, keys), want), 20, f"server {node}'s rows")
            time.sleep(0.6)  # one more metrics publication (every 250 ms)
            applied = metric_sum(srv, "rust_embedding_stream_applied_total", model="emb_lookup")
            rejected = metric_sum(srv, "rust_embedding_stream_rejected_total", model="emb_lookup")
            assert applied > 0 and rejected == 1, (applied, rejected)
            print(f"[stream] server {node}: lag 0, pending 0, {applied:.0f} entries applied in this run, "
                  f"{rejected:.0f} malformed skipped; all {len(keys)} updated rows equal the producer's last write")
        ga = lookup(make_client(servers["a"], "http"), keys)
        gb = lookup(make_client(servers["b"], "http"), keys)
        assert np.array_equal(ga, gb)
        groups = {g["name"].decode(): g for g in redis.client.xinfo_groups("updates")}
        print(f"[stream] consumer groups: {sorted(groups)}; both servers converged on {total} entries")
    finally:
        for srv in servers.values():
            srv.stop()
        redis.stop()


def test_a_node_that_leaves_the_write_through_to_the_publisher_writes_nothing_to_redis(tmp_path, example_models):
    """update_stream_write_remote: false — the publisher writes a row to the Redis tier once for
    every node; a node applies the stream to its own tiers (durable in its own log) and writes
    nothing to Redis. The default node writes every row through."""
    from publish_updates import publish

    redis = RedisServer(str(tmp_path))
    stream = f"redis:127.0.0.1:{redis.port}/updates"
    remote = f"redis:127.0.0.1:{redis.port}"
    token = token_file(str(tmp_path))
    repos = {"quiet": write_repo(str(tmp_path / "repo_quiet"), token, update_stream=stream, volatile_db=remote,
                                 update_stream_write_remote="false"),
             "writer": write_repo(str(tmp_path / "repo_writer"), token, update_stream=stream, volatile_db=remote)}
    keys = np.array([3, 77, ROWS + 5], dtype=np.int64)  # the last a new row
    try:
        srv = start(repos["quiet"], str(tmp_path / "log_quiet"), "--backend-config=rust,node-name=quiet")
        try:
            publish(redis.client, "updates", "u", keys, rows_for(keys, 1))
            client = make_client(srv, "http")
            wait_until(lambda: np.array_equal(lookup(client, keys), rows_for(keys, 1)), 20, "the quiet node's rows")
            assert redis.client.dbsize() == 1, f"only the stream: {redis.client.keys('*')}"
        finally:
            srv.stop()
        srv = start(repos["writer"], str(tmp_path / "log_writer"), "--backend-config=rust,node-name=writer")
        try:
            client = make_client(srv, "http")
            wait_until(lambda: np.array_equal(lookup(client, keys), rows_for(keys, 1)), 20, "the writer's rows")
            wait_until(lambda: redis.client.dbsize() == 1 + len(keys), 10, "the writer's rows in Redis")
        finally:
            srv.stop()
        print(f"\n[stream] the quiet node wrote no row to Redis; the default node wrote {len(keys)}")
    finally:
        redis.stop()


# ------------------------------------------------------------------ bounded memory


def test_overlay_memory_is_bounded_over_a_million_updated_rows(tmp_path, example_models):
    dim = 64
    repo = write_repo(str(tmp_path / "repo"), token_file(str(tmp_path)), dim=dim, update_compaction_rows=100000)
    srv = start(repo, str(tmp_path / "log"))
    try:
        client = make_client(srv, "http")
        per, total, span = 50_000, 1_000_000, 150_000
        sent = 0
        rss = []  # (rows sent, RSS) every 100 000 rows
        while sent < total:
            keys = (np.arange(sent, sent + per) % span).astype(np.int64)
            update(client, keys, rows_for(keys, sent // per, dim))
            sent += per
            if sent % 100_000 == 0:
                rss.append((sent, srv.rss_bytes()))
        time.sleep(2.0)
        rss.append((sent, srv.rss_bytes()))
        compactions = metric_sum(srv, "rust_embedding_compactions_total", model="emb_lookup")
        overlay = metric_sum(srv, "rust_embedding_overlay_rows", model="emb_lookup")
        check = np.array([0, 7, span - 1], dtype=np.int64)
        last = {k: max(v for v in range(total // per) if (np.arange(v * per, (v + 1) * per) % span == k).any())
                for k in check.tolist()}
        assert np.array_equal(lookup(client, check, dim), np.stack([rows_for([k], last[k], dim)[0] for k in check.tolist()]))
        series = "  ".join(f"{n // 1000}k:{r / 2**20:.0f}" for n, r in rss)
        print(f"\n[bounded] server RSS (MiB) by updated rows: {series}")
        # RSS swings while a compaction holds the old tier, the snapshot and the new tier at
        # once; what must not happen is growth that stays
        (n0, r0), (n1, r1) = rss[0], rss[-1]
        peak = max(r for _, r in rss)
        sent_after = (n1 - n0) * dim * 4
        print(f"[bounded] RSS {r0 / 2**20:.0f} MiB after {n0:,} updated rows -> {r1 / 2**20:.0f} MiB after {n1:,} "
              f"(peak {peak / 2**20:.0f} MiB during compactions; the {n1 - n0:,} rows in between are "
              f"{sent_after / 2**20:.0f} MiB); {compactions:.0f} compactions, overlay now {overlay:.0f} rows")
        # about ten are due; a loaded machine merges more rows into each (4 seen while other
        # tests ran beside this one): the bounded overlay and RSS below are the point
        assert compactions >= 3, compactions
        assert overlay < 2 * 100_000, overlay
        assert r1 - r0 < 64 * 2**20, "RSS grew with the updates: the overlay is not reclaimed"
    finally:
        srv.stop()
