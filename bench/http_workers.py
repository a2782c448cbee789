#!/usr/bin/env python3
"""Which of tritonserver's HTTP worker threads hold the client's keep-alive connections.

    source scripts/env.sh
    python bench/http_workers.py [--connections 32] [--http-thread-count 8]

Each HTTP worker of Triton's front end (libevhtp) runs its own event loop with its own epoll
instance, and a connection stays on the worker it was handed at accept for its whole life. This
script starts the real tritonserver with the identity model, opens --connections keep-alive
connections three ways (one after another; all at once from as many threads; one after another
with a request on each), and counts the sockets each epoll instance of the server gained
(/proc/<pid>/fdinfo). A front end that spreads its connections shows about
connections / http-thread-count per worker; one worker holding nearly all of them means every
request on those connections is parsed and answered on one core, whatever --http-thread-count
says.
"""

from __future__ import annotations

import argparse
import http.client
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tritonserver_process import serve, server_pid  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sockets_per_epoll(pid: int) -> dict[int, int]:
    """{epoll fd: how many of the process's sockets it watches}."""
    fds = os.listdir(f"/proc/{pid}/fd")
    links = {}
    for fd in fds:
        try:
            links[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            pass
    sockets = {fd for fd, link in links.items() if link.startswith("socket:")}
    out = {}
    for fd, link in links.items():
        if link != "anon_inode:[eventpoll]":
            continue
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                watched = [int(line.split()[1]) for line in f if line.startswith("tfd:")]
        except OSError:
            continue
        out[fd] = sum(1 for w in watched if w in sockets)
    return out


def open_connections(port: int, n: int, how: str) -> list[http.client.HTTPConnection]:
    def one():
        c = http.client.HTTPConnection("localhost", port)
        c.connect()
        if how == "one after another, a request on each":
            c.request("GET", "/v2/health/ready")
            c.getresponse().read()
        return c

    if how != "all at once":
        return [one() for _ in range(n)]
    conns: list = [None] * n
    barrier = threading.Barrier(n)

    def at(i):
        barrier.wait()
        conns[i] = one()

    threads = [threading.Thread(target=at, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return conns


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--http-thread-count", type=int, default=8)
    p.add_argument("--port", type=int, default=18400)
    a = p.parse_args()
    server, ort = os.environ.get("TRITONSERVER"), os.environ.get("ORT_LIB")
    if not server or not ort:
        print("source scripts/env.sh first (TRITONSERVER, ORT_LIB)")
        return 2
    log = "/tmp/http_workers_server.log"
    extra = ["--model-control-mode=explicit", "--load-model=identity", f"--http-thread-count={a.http_thread_count}",
             f"--backend-config=rust,onnxruntime-library={ort}"]
    worst = 0.0
    with serve(server, os.path.join(ROOT, "models"), os.path.join(ROOT, "install", "backends"), a.port, log, extra):
        pid = server_pid(a.port)
        print(f"tritonserver {pid}, --http-thread-count={a.http_thread_count}, {a.connections} keep-alive connections")
        for how in ("one after another", "all at once", "one after another, a request on each"):
            before = sockets_per_epoll(pid)
            conns = open_connections(a.port, a.connections, how)
            time.sleep(0.5)
            after = sockets_per_epoll(pid)
            gained = sorted((after.get(fd, 0) - before.get(fd, 0) for fd in after), reverse=True)
            gained = [g for g in gained if g > 0]
            share = gained[0] / a.connections if gained else 0.0
            worst = max(worst, share)
            print(f"  {how:<38} connections per worker: {gained}  (the busiest holds {share:.0%})")
            for c in conns:
                c.close()
            time.sleep(0.5)
    even = 1 / min(a.http_thread_count, a.connections)
    print(f"even spread would be {even:.0%} per worker; the busiest worker held up to {worst:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
