#!/usr/bin/env python3
"""Publish-to-visible across several tritonservers that share one Redis cluster (issue 47, "beyond
one host", simulated on one machine).

Starts a Redis cluster of --nodes nodes and --servers real tritonservers with libtriton_rust.so.
Each server serves one embedding model (`emb`, KIND_CPU, HPS interface) with:
- no table files: the cluster is the parameter tier (`volatile_db: redis_cluster:...`);
- its own cache in host memory (`gpucacheper`, the share of --rows);
- its own update log (`update_log_dir`);
- a subscription to one Redis Stream of updates (`update_stream`). The stream's key lives on a
  node of the cluster.

`--writes servers` (the default): every server writes each update through to the cluster.
`--writes publisher`: the publisher writes each row to the cluster once, then appends it to the
stream. The servers then skip the write-through (`update_stream_write_remote: false`) and keep
the rows durable in their own logs. The cluster's SET commands per update are counted in both
modes.

The base rows are published through the stream first. Then, while client threads keep every
server busy with lookups of Zipf keys, it publishes --updates updates, one at a time. Each update
gives a hot key a new row. A poller per server asks for that key until the new row comes back.
For each update it records the time from the XADD to each server's first answer with the new row.
"every server" is the slowest of them. Printed and written to --results (README.md, runs.json):
p50, p90, p99 and max per server and for every server, and the lookups/s that ran meanwhile.

    .venv/bin/python bench/publish_to_visible.py --results bench/results/publish-to-visible
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, HERE)
from kserve_client import Client  # noqa: E402
from publish_updates import publish  # noqa: E402
from embedding_helpers import embedding_config, hps_io  # noqa: E402
from test_redis_cluster import cluster_ports, start_cluster  # noqa: E402
from tritonserver_harness import TritonServer  # noqa: E402


class Cluster:
    """A Redis cluster of real redis-server processes on 127.0.0.1, no replicas, no persistence."""

    def __init__(self, n, workdir):
        self.ports = cluster_ports(n)

        def dir_of(p):
            d = os.path.join(workdir, f"redis-{p}")
            os.makedirs(d)
            return d
        self.nodes = start_cluster(self.ports, dir_of)

    @staticmethod
    def cli(port, *args):
        return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True).stdout

    def key_on(self, port, prefix):
        """A key whose slot the node on `port` serves (a stream lives on one node; another node
        answers MOVED)."""
        for i in range(10_000):
            name = f"{prefix}{i}"
            if self.cli(port, "xlen", name).strip() == "0":
                return name
        raise SystemExit(f"no key found on the node of port {port}")

    def spec(self):
        return "redis_cluster:" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def stop(self):
        for n in self.nodes:
            n.stop()


def write_repo(root, dim, rows, cache_share, cluster, stream, write_remote):
    os.makedirs(os.path.join(root, "emb", "1"))
    cfg = embedding_config(
        "emb", hps_io(), store_name="emb", embedding_table_names="u", embedding_vecsize_per_table=dim,
        vocabulary_size_per_table=rows, default_value_for_each_table=-1.0, sparse_files="none",
        gpucacheper=cache_share, volatile_db=cluster, update_log_dir="updates", update_stream=stream,
        update_stream_write_remote=str(write_remote).lower()).replace("count: 1 ", "count: 2 ")
    with open(os.path.join(root, "emb", "config.pbtxt"), "w") as f:
        f.write(cfg)


def lookup(client, keys, dim):
    keys = np.asarray(keys, np.int64)
    out = client.infer("emb", {"KEYS": keys, "NUMKEYS": np.array([len(keys)], np.int32)}, ["OUTPUT0"])["OUTPUT0"]
    return out.reshape(len(keys), dim)


def cluster_sets(cluster):
    """SET commands the cluster's nodes have run so far (INFO commandstats)."""
    total = 0
    for p in cluster.ports:
        for line in cluster.cli(p, "info", "commandstats").splitlines():
            if line.startswith("cmdstat_set:"):
                total += int(line.split("calls=", 1)[1].split(",", 1)[0])
    return total


def pct(xs, q):
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", type=int, default=3)
    p.add_argument("--nodes", type=int, default=3, help="Redis cluster nodes")
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--cache-share", type=float, default=0.25)
    p.add_argument("--updates", type=int, default=200)
    p.add_argument("--load-threads", type=int, default=1, help="lookup clients per server, beside the poller")
    p.add_argument("--load-keys", type=int, default=512, help="keys per load request (Zipf 1.05)")
    p.add_argument("--gap-ms", type=float, default=20.0, help="pause after each update is seen everywhere")
    p.add_argument("--timeout-s", type=float, default=10.0, help="an update not seen by then counts as lost")
    p.add_argument("--writes", default="servers", choices=["servers", "publisher"],
                   help="who writes the updated rows to the cluster: every server (write-through), or the publisher "
                        "once (servers with update_stream_write_remote: false)")
    p.add_argument("--results", default="", help="folder to write README.md and runs.json into (replaced)")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, repositories)")
    a = p.parse_args()
    import redis

    work = tempfile.mkdtemp(prefix="p2v-")
    cluster, servers = None, []
    t_start = time.time()
    try:
        cluster = Cluster(a.nodes, work)
        stream_key = cluster.key_on(cluster.ports[0], "updates")
        stream = f"redis:127.0.0.1:{cluster.ports[0]}/{stream_key}"
        print(f"Redis cluster of {a.nodes} nodes {cluster.ports}; the stream '{stream_key}' on the first", flush=True)
        for i in range(a.servers):
            root = os.path.join(work, f"repo{i}")
            write_repo(root, a.dim, a.rows, a.cache_share, cluster.spec(), stream, a.writes == "servers")
            s = TritonServer(root, [f"--backend-config=rust,node-name=server{i}"],
                             log_dir=os.path.join(work, f"log{i}"))
            servers.append(s.start())
        print(f"{a.servers} tritonservers ready ({time.time() - t_start:.0f} s)", flush=True)
        pub = redis.Redis(port=cluster.ports[0])
        rows_to = None
        if a.writes == "publisher":
            from redis.cluster import ClusterNode, RedisCluster
            rows_to = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in cluster.ports])

        def send(keys, vectors):
            """One update: written to the cluster by the publisher first (--writes publisher),
            then appended to the stream."""
            if rows_to is not None:
                pipe = rows_to.pipeline()
                for k, row in zip(keys.tolist(), vectors):
                    pipe.set(f"u:{k}", np.ascontiguousarray(row, "<f4").tobytes())
                pipe.execute()
            publish(pub, stream_key, "u", keys, vectors)

        # the base rows, through the stream (and the cluster, as --writes says)
        rng = np.random.default_rng(1)
        base = rng.standard_normal((a.rows, a.dim)).astype(np.float32)
        for lo in range(0, a.rows, 5000):
            keys = np.arange(lo, min(lo + 5000, a.rows), dtype=np.int64)
            send(keys, base[keys])
        clients = [Client(s.http_url.replace("http://", "")) for s in servers]
        probe = np.array([0, a.rows // 2, a.rows - 1], np.int64)
        deadline = time.monotonic() + 120
        while not all(np.array_equal(lookup(c, probe, a.dim), base[probe]) for c in clients):
            if time.monotonic() > deadline:
                raise SystemExit("the base rows did not reach every server")
            time.sleep(0.2)
        print(f"base rows ({a.rows:,} x {a.dim}) applied by every server ({time.time() - t_start:.0f} s)", flush=True)

        # load: Zipf keys on every server until told to stop
        stop = threading.Event()
        served = [0] * a.servers
        ranks = 1.0 / np.arange(1, a.rows + 1) ** 1.05
        cdf = np.cumsum(ranks) / ranks.sum()

        def load(i, seed):
            c = Client(servers[i].http_url.replace("http://", ""))
            r = np.random.default_rng(seed)
            while not stop.is_set():
                keys = np.searchsorted(cdf, r.random(a.load_keys)).astype(np.int64)
                lookup(c, keys, a.dim)
                served[i] += len(keys)
            c.close()

        loaders = [threading.Thread(target=load, args=(i, 100 + 10 * i + t), daemon=True)
                   for i in range(a.servers) for t in range(a.load_threads)]
        for t in loaders:
            t.start()
        time.sleep(1.0)

        seen = [[] for _ in range(a.servers)]
        everywhere, lost = [], 0
        hot = list(range(100))
        t_load = time.perf_counter()
        served0 = list(served)
        sets0 = cluster_sets(cluster)
        for u in range(a.updates):
            key = hot[u % len(hot)]
            value = float(1000 + u)
            row = np.full((1, a.dim), value, np.float32)
            got = [None] * a.servers
            ready = threading.Barrier(a.servers + 1)
            t0 = [0.0]

            def poll(i):
                c = clients[i]
                ready.wait()
                while time.perf_counter() - t0[0] < a.timeout_s:
                    if lookup(c, [key], a.dim)[0, 0] == value:
                        got[i] = time.perf_counter() - t0[0]
                        return

            pollers = [threading.Thread(target=poll, args=(i,)) for i in range(a.servers)]
            for t in pollers:
                t.start()
            t0[0] = time.perf_counter()
            send(np.array([key], np.int64), row)
            ready.wait()
            for t in pollers:
                t.join()
            if any(g is None for g in got):
                lost += 1
            else:
                for i, g in enumerate(got):
                    seen[i].append(g * 1e3)
                everywhere.append(max(got) * 1e3)
            time.sleep(a.gap_ms / 1e3)
        load_s = time.perf_counter() - t_load
        sets_per_update = (cluster_sets(cluster) - sets0) / a.updates
        stop.set()
        for t in loaders:
            t.join(30)
        lookups_per_s = [(served[i] - served0[i]) / load_s for i in range(a.servers)]

        cores = os.cpu_count()
        lines = [f"# Publish-to-visible across {a.servers} tritonservers sharing one Redis cluster", "",
                 f"Command: `.venv/bin/python bench/publish_to_visible.py {' '.join(sys.argv[1:])}`", "",
                 f"Host: {platform.processor() or platform.machine()}, {cores} CPUs (every server, every Redis node and "
                 f"every client on this one machine); {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
                 f"- A Redis cluster of {a.nodes} nodes, no replicas, is the parameter tier (`volatile_db: "
                 f"redis_cluster:...`, no table files). The stream of updates is a key on its first node.",
                 f"- {a.servers} tritonservers each serve `emb` (KIND_CPU, 2 instances): {a.rows:,} rows of dim {a.dim}, "
                 f"a cache in host memory of {a.cache_share:.0%} of the rows, their own update log, "
                 f"each following the stream in its own consumer group.",
                 f"- Load: {a.load_threads} client thread(s) per server, {a.load_keys} Zipf(1.05) keys per request, "
                 f"{sum(lookups_per_s) / 1e6:.2f} M lookups/s over all servers while the updates ran "
                 f"({', '.join(f'{x / 1e3:.0f} k' for x in lookups_per_s)}).",
                 f"- {a.updates} updates, one at a time: a hot key gets a new row (one XADD). A poller per server "
                 f"asks for it until the new row comes back. Time is from the XADD to that answer, in ms.", "",
                 "| who | p50 | p90 | p99 | max | updates |", "|---|---:|---:|---:|---:|---:|"]
        for i in range(a.servers):
            s = seen[i]
            lines.append(f"| server {i} | {pct(s, 50):.2f} | {pct(s, 90):.2f} | {pct(s, 99):.2f} | "
                         f"{max(s) if s else float('nan'):.2f} | {len(s)} |")
        lines.append(f"| every server (the slowest of them) | {pct(everywhere, 50):.2f} | {pct(everywhere, 90):.2f} | "
                     f"{pct(everywhere, 99):.2f} | {max(everywhere) if everywhere else float('nan'):.2f} | "
                     f"{len(everywhere)} |")
        who = ("every server writes each update through to the cluster" if a.writes == "servers" else
               "the publisher writes each update to the cluster once, before the XADD; the servers skip the "
               "write-through (`update_stream_write_remote: false`)")
        lines += ["", f"Writes to the cluster: {who}. The cluster ran {sets_per_update:.2f} SET commands per update "
                      f"(one updated row each).",
                  "", f"Updates not seen by every server within {a.timeout_s:.0f} s: {lost}."]
        text = "\n".join(lines) + "\n"
        print(text, flush=True)
        if a.results:
            shutil.rmtree(a.results, ignore_errors=True)
            os.makedirs(a.results)
            with open(os.path.join(a.results, "README.md"), "w") as f:
                f.write(text)
            with open(os.path.join(a.results, "runs.json"), "w") as f:
                json.dump({"args": vars(a), "per_server_ms": seen, "every_server_ms": everywhere, "lost": lost,
                           "cluster_sets_per_update": sets_per_update,
                           "lookups_per_s": lookups_per_s, "cpus": cores}, f)
        return 1 if lost else 0
    finally:
        for s in servers:
            s.stop()
        if cluster:
            cluster.stop()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


if __name__ == "__main__":
    sys.exit(main())
