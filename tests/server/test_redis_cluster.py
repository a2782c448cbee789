"""The Redis tier against a real 3-node Redis cluster (volatile_db: redis_cluster:...): rows
written through an update model land on every node and come back exactly through another
store that has no table files, so every row it serves comes from the cluster."""
import os
import subprocess
import time

import numpy as np
import pytest

from tritonserver_harness import ModelRepo, make_client, infer
from embedding_helpers import Redis, embedding_config, hps_io

DIM = 8


def cluster_ports(n: int):
    """Free ports for cluster nodes: each node also listens on its port + 10000 (the cluster
    bus), so the port must be at most 55535 and both must be free."""
    import random
    import socket
    rng = random.Random()
    ports = []
    while len(ports) < n:
        p = rng.randrange(20000, 55535)
        if p in ports:
            continue
        try:
            for q in (p, p + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
        except OSError:
            continue
        ports.append(p)
    return ports


def start_cluster(ports, dir_of):
    """A Redis cluster of real redis-server nodes on 127.0.0.1 `ports` (no replicas, no
    persistence), each working in `dir_of(port)`; returns its nodes (`Redis`, each `stop()`),
    once the cluster's state is ok."""
    nodes = []
    try:
        for p in ports:
            nodes.append(Redis(p, dir_of(p), ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{p}.conf",
                                              "--cluster-node-timeout", "2000"]).start())
        subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports],
                        "--cluster-replicas", "0", "--cluster-yes"], check=True, capture_output=True, timeout=60)
        deadline = time.monotonic() + 30
        while not all("cluster_state:ok" in subprocess.run(["redis-cli", "-p", str(p), "cluster", "info"],
                                                           capture_output=True, text=True).stdout for p in ports):
            if time.monotonic() > deadline:
                raise RuntimeError("the redis cluster did not reach state ok")
            time.sleep(0.2)
        return nodes
    except BaseException:
        for n in nodes:
            n.stop()
        raise


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ports = cluster_ports(3)
    nodes = start_cluster(ports, lambda p: str(tmp_path_factory.mktemp(f"redis-{p}")))
    try:
        yield ports
    finally:
        for n in nodes:
            n.stop()


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, example_models, cluster):
    from conftest import module_server
    repo = ModelRepo(str(tmp_path_factory.mktemp("cluster-repo")))
    spec = "redis_cluster:" + ",".join(f"127.0.0.1:{p}" for p in cluster)
    common = dict(embedding_table_names="t", embedding_vecsize_per_table=DIM, sparse_files="none",
                  default_value_for_each_table="-1", gpucacheper="0", volatile_db=spec)
    update_io = ('input [ { name: "KEYS" data_type: TYPE_INT64 dims: [ -1 ] },\n'
                 '        { name: "NUMKEYS" data_type: TYPE_INT32 dims: [ -1 ] },\n'
                 '        { name: "VECTORS" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
                 'output [ { name: "UPDATED" data_type: TYPE_INT64 dims: [ 1 ] } ]\n')
    for name, io, extra in [("cluster_writer", update_io, dict(embedding_interface="update", store_name="writer",
                                                                      allow_unauthenticated_updates="true")),
                            ("cluster_reader", hps_io(), dict(store_name="reader"))]:
        os.makedirs(os.path.join(repo.root, name, "1"), exist_ok=True)
        repo.write_config(name, embedding_config(name, io, **common, **extra))
    return module_server(request, tmp_path_factory, repo)


def test_rows_round_trip_through_the_cluster(server, cluster):
    client = make_client(server, "grpc")
    rng = np.random.default_rng(3)
    keys = rng.choice(1_000_000, size=300, replace=False).astype(np.int64)
    rows = rng.standard_normal((len(keys), DIM)).astype(np.float32)
    written = infer(client, "grpc", "cluster_writer",
                    {"KEYS": keys, "NUMKEYS": np.array([len(keys)], np.int32), "VECTORS": rows.reshape(-1)}, ["UPDATED"])
    assert int(written["UPDATED"][0]) == len(keys)
    per_node = [int(subprocess.run(["redis-cli", "-p", str(p), "dbsize"], capture_output=True, text=True).stdout)
                for p in cluster]
    print(f"\nrows per cluster node: {per_node}")
    assert sum(per_node) == len(keys) and all(n > 0 for n in per_node), "the rows should spread over every node"
    # the reader's store has no files and no cache: every row comes from the cluster
    unknown = np.array([2_000_001, 2_000_002], np.int64)
    ask = np.concatenate([keys[::-1], unknown])
    got = infer(client, "grpc", "cluster_reader", {"KEYS": ask, "NUMKEYS": np.array([len(ask)], np.int32)},
                ["OUTPUT0"])["OUTPUT0"].reshape(len(ask), DIM)
    assert np.array_equal(got[:len(keys)], rows[::-1])
    assert np.all(got[len(keys):] == -1.0), "keys in no tier get the default value"
