"""What a run measures: the (batch, concurrency) sweep, and for each (batch, alpha) the pool of
distinct requests that perf_analyzer cycles (its size, its keys, its JSON file)."""
import json
import os
import time

import numpy as np

import zipf_keys

from .cache import predicted_pool_rate
from .fixture import TABLES


def sweep_plan(batches, conc_batch, concs):
    """(batch, concurrency) pairs: every batch at concurrency 1, then requests of conc_batch rows
    at each concurrency (0: none), its concurrency-1 point not measured twice."""
    plan = [(b, 1) for b in batches]
    if conc_batch:
        plan += [(conc_batch, c) for c in concs if c != 1 or conc_batch not in batches]
    return plan


class Sweep:
    """What the arguments ask to measure: the models, the batches at concurrency 1 and the
    concurrency values (requests of --conc-batch rows), the Zipf exponents, and Wide&Deep's own
    plan (its batch sweep at concurrency 1, then its concurrency sweep if asked)."""

    def __init__(self, a):
        self.a = a
        self.models = [m for m in a.models.split(",") if m]
        self.batches = [int(b) for b in a.batches.split(",")]
        self.concs = [int(c) for c in a.concurrency.split(",")]
        self.wd_plan = sweep_plan([int(b) for b in a.wide_deep_batches.split(",")], a.wide_deep_conc_batch, self.concs)
        self.wd_plan_batches = {b for b, _ in self.wd_plan}
        self.alphas = [float(x) for x in a.alphas.split(",")]

    def points(self, alpha_i):
        """The (batch, concurrency) pairs at the alpha_i-th alpha: the whole sweep at the first,
        --other-alpha-batches at concurrency 1 at the others (Wide&Deep: its own plan, wd_plan)."""
        a = self.a
        sweep = self.batches if alpha_i == 0 else [int(b) for b in a.other_alpha_batches.split(",")]
        return sweep_plan(sweep, a.conc_batch if alpha_i == 0 else 0, self.concs)

    def model_batches(self, model):
        """Every batch `model` is measured at (the first alpha's), smallest first."""
        return sorted(self.wd_plan_batches if model == "wide_deep" else set(self.batches) | {self.a.conc_batch})

    def largest_batch(self, model):
        """The largest of --batches (Wide&Deep: of every batch in its plan)."""
        return max(self.wd_plan_batches) if model == "wide_deep" else max(self.batches)


class KeyPools:
    """The pools of distinct requests, one per (batch, alpha), drawn when first asked for:
    `plans` holds each alpha's pool_plan, which --requests auto sizes the pools by."""

    def __init__(self, a, rows, plans):
        self.a, self.rows, self.plans = a, rows, plans
        self.pools = {}
        self.pool_sizes = {}

    def size(self, batch, alpha):
        """Distinct requests in the pool of (batch, alpha), said once per pool."""
        a = self.a
        if (batch, alpha) in self.pool_sizes:
            return self.pool_sizes[(batch, alpha)]
        plan = self.plans[alpha]
        if a.requests != "auto":
            # perf_analyzer reads the whole pool as JSON: fewer distinct requests at the largest batches
            n = int(a.requests)
            n = n if batch <= 4096 else max(4, n // (2 if batch <= 16384 else 4))
        else:
            need = max(16, int(np.ceil(plan["needed_lookups"] / batch)))
            cap = max(4, int(a.pool_gb * 1e9 // (batch * (TABLES * 8 + 13 * 4))))
            n = min(need, cap)
        need_n = int(np.ceil(plan["needed_lookups"] / batch))
        predicted = predicted_pool_rate(plan, n * batch)
        gap = predicted - plan["lru"]
        print(f"  key pool at batch {batch}, alpha {alpha}: {n} distinct requests ({n * batch:,} lookups per table, "
              f"{n * batch * (TABLES * 8 + 13 * 4) / 1e9:.2f} GB); the stream's hit rate needs >= {need_n} "
              f"({plan['needed_lookups']:.3g} lookups per table: twice the largest LRU characteristic time); "
              f"expected measured rate {predicted:.4f} vs the stream's {plan['lru']:.4f} "
              f"({'within' if abs(gap) <= a.hit_rate_bound else 'NOT within'} {a.hit_rate_bound})", flush=True)
        self.pool_sizes[(batch, alpha)] = n
        return n

    def requests(self, batch, alpha):
        """The pool's (sparse, dense) requests."""
        if (batch, alpha) not in self.pools:
            t0 = time.time()
            self.pools[(batch, alpha)] = zipf_keys.make_requests(self.rows, batch, self.size(batch, alpha), alpha,
                                                                 seed=int(batch * 10 + alpha * 100))
            if time.time() - t0 > 5:
                print(f"  (pool of batch {batch}, alpha {alpha} drawn in {time.time() - t0:.0f} s)", flush=True)
        return self.pools[(batch, alpha)]

    def data_file(self, batch, alpha):
        """The pool as perf_analyzer's --input-data JSON, in --work (written once)."""
        path = os.path.join(self.a.work, f"keys_b{batch}_a{alpha}_n{self.size(batch, alpha)}.json")
        if not os.path.exists(path):
            # written a request at a time: a large pool is never one string in memory
            with open(path + ".tmp", "w") as f:
                f.write('{"data": [')
                for i, (s, d) in enumerate(self.requests(batch, alpha)):
                    f.write(("," if i else "") + json.dumps({"sparse": {"b64": zipf_keys.b64(s), "shape": list(s.shape)},
                                                            "dense": {"b64": zipf_keys.b64(d), "shape": list(d.shape)}}))
                f.write("]}")
            os.replace(path + ".tmp", path)
        return path
