"""An endless stream of DLRM-v3 users (bench/gpu/dlrm_v3_perf.py --stream): drawer processes draw
users of the benchmark's shape (examples/dlrm_v3/data.py) without end, none drawn twice, and hand
them to the clients through a bounded queue; the clients take the next one as they send.

Each drawer w draws chunks of `chunk` users, its k-th from the seed `base + k * workers + w`
(generate_batch then seeds user i of a chunk from [seed, i]); `base` (1e9) lies past every seed
the benchmark's fixed requests and --fresh-users pool use, so no user of the stream is one of
theirs. The item ids are folded into the served table's rows and the user ids into the user
table's, as the fixed requests are.

The stream cannot make the server look faster than it is, only slower: when the drawers fall
behind, the clients wait for users. `waited()` says how long they did, so a level can say
whether its rate was the server's or the drawers'.
"""
import multiprocessing
import queue as queue_mod
import threading
import time

BASE_SEED = 1_000_000_000


def _draw(data, items, user_rows, step, worker, workers, chunk, out, stop):
    """A drawer process: chunks of users' feeds into `out` until `stop` is set."""
    from dlrm_v3 import data as dv3_data
    from dlrm_v3.client import feeds

    k = 0
    while not stop.is_set():
        batch = dv3_data.generate_batch(data, chunk, BASE_SEED + k * workers + worker, step)
        batch.hist_item_ids = batch.hist_item_ids % items
        batch.cand_item_ids = batch.cand_item_ids % items
        batch.user_ids = batch.user_ids % user_rows
        jobs = [feeds(r) for r in batch.requests()]
        while not stop.is_set():
            try:
                out.put(jobs, timeout=0.2)
                break
            except queue_mod.Full:
                continue
        k += 1


class UserStream:
    """`processes` drawers started at once (spawned: the caller may hold CUDA), at most `depth`
    chunks drawn ahead. `next()` gives the next user's feeds (a client thread's call; it blocks
    while none is drawn and raises if none comes for `timeout_s`)."""

    def __init__(self, data, items: int, user_rows: int, step, processes: int, chunk: int = 4,
                 depth: int = 64, timeout_s: float = 120.0):
        ctx = multiprocessing.get_context("spawn")
        self.queue, self.stop = ctx.Queue(depth), ctx.Event()
        self.timeout_s, self.processes = timeout_s, max(1, processes)
        self.lock, self.ready = threading.Lock(), []
        self.sent, self.wait_s = 0, 0.0
        self.procs = [ctx.Process(target=_draw, daemon=True,
                                  args=(data, items, user_rows, step, w, self.processes, chunk, self.queue, self.stop))
                      for w in range(self.processes)]
        for p in self.procs:
            p.start()

    def next(self):
        t0 = time.perf_counter()
        with self.lock:
            if not self.ready:
                try:
                    self.ready = self.queue.get(timeout=self.timeout_s)
                except queue_mod.Empty:
                    alive = sum(p.is_alive() for p in self.procs)
                    raise RuntimeError(f"the user stream gave no user for {self.timeout_s:.0f} s "
                                       f"({alive} of {len(self.procs)} drawer processes alive)") from None
            job = self.ready.pop()
            self.sent += 1
            self.wait_s += time.perf_counter() - t0
        return job

    def waited(self) -> tuple:
        """(users handed out, seconds the clients waited in `next`, summed over the clients)."""
        with self.lock:
            return self.sent, self.wait_s

    def close(self) -> None:
        self.stop.set()
        deadline = time.time() + 10
        while any(p.is_alive() for p in self.procs) and time.time() < deadline:
            try:  # a drawer blocked on a full queue: make room so that it sees the stop
                self.queue.get(timeout=0.1)
            except queue_mod.Empty:
                pass
        for p in self.procs:
            if p.is_alive():
                p.terminate()
            p.join(timeout=5)
        self.queue.cancel_join_thread()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
