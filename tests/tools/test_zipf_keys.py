"""bench/gpu/zipf_keys.py: the keys follow the Zipf law asked for, hot keys are spread over
the key space, every key is a row of its table, and the JSON is what perf_analyzer reads."""
import base64
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "gpu"))
import zipf_keys  # noqa: E402


def discrete_zipf_share(n, alpha, top):
    w = np.arange(1, n + 1, dtype=np.float64) ** -alpha
    return w[:top].sum() / w.sum()


def test_ranks_follow_the_law():
    rng = np.random.default_rng(1)
    for alpha in (1.05, 1.2):
        # a table held whole by the exact head, and one with a tail past it (2^20 ranks)
        for n in (1_000_000, 3_000_000):
            ranks = zipf_keys.zipf_ranks(rng, n, alpha, 400_000)
            assert ranks.min() >= 0 and ranks.max() < n
            for top in (1, 10, 1000, 100_000, 1 << 20, 2_000_000):
                got = float((ranks < top).mean())
                want = discrete_zipf_share(n, alpha, top)
                # 400 k draws: a few standard errors
                sigma = (want * (1 - want) / 400_000) ** 0.5
                assert abs(got - want) < 5 * sigma + 1e-4, (alpha, n, top, got, want)


def test_hot_keys_are_spread_and_every_key_is_a_row():
    n = 3_067_956
    ranks = np.arange(1000)
    keys = zipf_keys.spread(ranks, n)
    assert len(np.unique(keys)) == 1000 and keys.min() >= 0 and keys.max() < n
    assert (keys < 1000).mean() < 0.01, "the hottest keys are not the smallest ids"
    all_keys = zipf_keys.spread(np.arange(7424), 7424)
    assert sorted(all_keys.tolist()) == list(range(7424)), "a bijection of the table's rows"


def test_json_is_whole_batches_for_perf_analyzer(tmp_path):
    out = tmp_path / "keys.json"
    rows = "1000,3,50000"
    subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "bench", "gpu", "zipf_keys.py"), "--rows", rows,
                    "--batch", "64", "--requests", "5", "--alpha", "1.05", "--out", str(out)], check=True)
    data = json.loads(out.read_text())["data"]
    assert len(data) == 5
    limits = np.array([1000, 3, 50000])
    seen = []
    for step in data:
        assert step["sparse"]["shape"] == [64, 3] and step["dense"]["shape"] == [64, 13]
        sparse = np.frombuffer(base64.b64decode(step["sparse"]["b64"]), np.int64).reshape(64, 3)
        dense = np.frombuffer(base64.b64decode(step["dense"]["b64"]), np.float32).reshape(64, 13)
        assert (sparse >= 0).all() and (sparse < limits).all()
        assert np.isfinite(dense).all()
        seen.append(sparse)
    assert not np.array_equal(seen[0], seen[1]), "a different key set every request"
