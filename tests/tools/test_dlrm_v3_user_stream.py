"""bench/gpu/dlrm_v3_perf.py --stream's users (bench/gpu/recsys/user_stream.py): drawn by processes
without end, none twice, each one of the users its drawer's seeds give, folded into the served
tables' rows; the clients' wait counted; closing leaves no drawer behind. (The served run:
`dlrm_v3_perf.py --device cpu --tiny --stream`, each level's line with its users and wait.)"""
import os
import sys

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "bench", "gpu"))
sys.path.insert(0, os.path.join(ROOT, "examples"))

from dlrm_v3 import data as dv3_data  # noqa: E402
from dlrm_v3.client import feeds  # noqa: E402
from recsys.user_stream import BASE_SEED, UserStream  # noqa: E402

ITEMS, USERS, STEP, WORKERS, CHUNK = 50, 7, 9, 2, 3


def key(job):
    return tuple(np.concatenate([job["user_ids"][0], job["hist_item_ids"][0], job["cand_item_ids"][0],
                                 job["hist_timestamps"][0]]).tolist())


def test_the_stream_draws_new_users_folded_and_counts_the_wait():
    data = dv3_data.DataConfig.tiny(seconds_per_timestamp=3600, min_candidates=2)
    with UserStream(data, ITEMS, USERS, STEP, WORKERS, chunk=CHUNK, depth=4) as stream:
        got = [stream.next() for _ in range(30)]
        sent, wait_s = stream.waited()
        procs = stream.procs
    assert not any(p.is_alive() for p in procs)
    assert sent == 30 and wait_s > 0  # the first user had to be drawn while the client waited
    keys = [key(j) for j in got]
    assert len(set(keys)) == 30, "a user came twice"
    for j in got:
        assert j["hist_item_ids"].max() < ITEMS and j["cand_item_ids"].max() < ITEMS and j["user_ids"].max() < USERS
    # 30 users are 10 chunks: at most chunk 9 of either drawer, seeds BASE_SEED + k * WORKERS + w
    drawn = set()
    for seed in range(BASE_SEED, BASE_SEED + 10 * WORKERS):
        batch = dv3_data.generate_batch(data, CHUNK, seed, STEP)
        batch.hist_item_ids, batch.cand_item_ids = batch.hist_item_ids % ITEMS, batch.cand_item_ids % ITEMS
        batch.user_ids = batch.user_ids % USERS
        drawn.update(key(feeds(r)) for r in batch.requests())
    assert set(keys) <= drawn
    # none of them is one of the fixed requests (generate_batch's seed 1)
    fixed = dv3_data.generate_batch(data, 32, 1, STEP)
    fixed.hist_item_ids, fixed.cand_item_ids = fixed.hist_item_ids % ITEMS, fixed.cand_item_ids % ITEMS
    fixed.user_ids = fixed.user_ids % USERS
    assert not set(keys) & {key(feeds(r)) for r in fixed.requests()}
