"""Shared by the embedding-engine server tests (test_embedding*.py, test_redis_*.py,
test_settings.py) and bench/publish_to_visible.py: the config text of an embedding model, a real
redis-server with a tiny RESP writer, and the row/metric checks the test modules share.

Not a test module (pytest collects test_*.py only); no fixture lives here.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time

import numpy as np

from tritonserver_harness import infer, metric_sum

REDIS_DIM = 8  # the row width redis_lookup reshapes to unless told another


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


def expected_rows(table: np.ndarray, keys: np.ndarray, default: float) -> np.ndarray:
    rows = np.full((len(keys), table.shape[1]), default, dtype=np.float32)
    known = (keys >= 0) & (keys < len(table))
    rows[known] = table[keys[known]]
    return rows


def assert_no_panic(server):
    assert server.alive(), f"tritonserver died; log {server.log_path}"
    log = server.log_text()
    assert "panicked" not in log, "a Rust panic is in the server log:\n" + "\n".join(
        line for line in log.splitlines() if "panic" in line)


def tier_hits(server, model, table):
    return {tier: metric_sum(server, "rust_embedding_hits_total", model=model, table=table, tier=tier)
            for tier in ("cache", "host", "redis", "default")}


def redis_lookup(client, model, keys, dim=REDIS_DIM):
    keys = np.asarray(keys, dtype=np.int64)
    out = infer(client, "http", model, {"KEYS": keys, "NUMKEYS": np.array([len(keys)], np.int32)}, ["OUTPUT0"])
    return out["OUTPUT0"].reshape(len(keys), dim)
