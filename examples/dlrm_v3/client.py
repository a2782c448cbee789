#!/usr/bin/env python3
"""Asks the example DLRM-v3 model (models/dlrm_v3) for its candidates' scores: requests of the
benchmark's shape at a small size (examples/dlrm_v3/data.py: a user, a history of items with
their categories, times and actions, and the candidates), sent at once so that the server may
batch them, each answer checked against our PyTorch reference rebuilt here from the same seed.

    python examples/dlrm_v3/client.py [--url localhost:8000] [--protocol http|grpc] [--requests 8]

Prints one line a request and exits 1 when an answer is further than --tolerance from the
reference (or a request fails).
"""
from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dlrm_v3 import data as dv3_data  # noqa: E402
from dlrm_v3 import export  # noqa: E402
from dlrm_v3 import model as dv3  # noqa: E402


def feeds(r: dv3.Request) -> dict:
    """A request's inputs, each [1, n]: one user, every input's values ragged."""
    v = {"user_ids": [r.user_id], "query_times": [r.query_time], "hist_lengths": [len(r.item_ids)],
         "hist_item_ids": r.item_ids, "hist_category_ids": r.category_ids, "hist_timestamps": r.timestamps,
         "hist_actions": r.actions, "cand_lengths": [len(r.cand_item_ids)], "cand_item_ids": r.cand_item_ids,
         "cand_category_ids": r.cand_category_ids}
    return {k: np.asarray(torch.as_tensor(x), dtype=np.int64).reshape(1, -1) for k, x in v.items()}


def ask(mod, url: str, r: dv3.Request) -> np.ndarray:
    client = mod.InferenceServerClient(url)
    inputs = []
    for name, arr in feeds(r).items():
        x = mod.InferInput(name, list(arr.shape), "INT64")
        x.set_data_from_numpy(arr)
        inputs.append(x)
    return client.infer("dlrm_v3", inputs, outputs=[mod.InferRequestedOutput("predictions")]).as_numpy("predictions")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=None, help="default localhost:8000 (http) or localhost:8001 (grpc)")
    p.add_argument("--protocol", choices=["http", "grpc"], default="http")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tolerance", type=float, default=1e-4)
    a = p.parse_args(argv)
    if a.protocol == "http":
        import tritonclient.http as mod
    else:
        import tritonclient.grpc as mod
    url = a.url or ("localhost:8000" if a.protocol == "http" else "localhost:8001")
    cfg = dv3_data.DataConfig.tiny(seconds_per_timestamp=3600, min_candidates=2)
    requests = dv3_data.generate_batch(cfg, a.requests, a.seed, 9).requests()
    with ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(lambda r: ask(mod, url, r), requests))
    reference = export.ranker()
    worst = 0.0
    for i, (r, got) in enumerate(zip(requests, answers)):
        want = reference.score_candidates(dv3.Batch.from_requests([r])).numpy()
        diff = float(np.abs(got - want).max())
        worst = max(worst, diff)
        print(f"request {i}: user {r.user_id}, {len(r.item_ids)} history items, {len(r.cand_item_ids)} candidates: "
              f"predictions {[f'{x:.4f}' for x in got[:4, 0]]}{' ...' if len(got) > 4 else ''} "
              f"(|served - reference| {diff:.1e})")
    print(f"{len(requests)} requests over {a.protocol}: largest difference from the reference {worst:.1e} "
          f"({'within' if worst <= a.tolerance else 'PAST'} {a.tolerance:g})")
    return 0 if worst <= a.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
