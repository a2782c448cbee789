"""bench/gpu/dlrm_v3_perf.py's served item table larger than the reference's (--item-rows): the
table written in the store's format (keys.npy int64 0..N-1, vectors.npy fp16, row k the
reference's row k % P, across chunk boundaries), and requests folded for the reference without
touching the served ids. (The served run itself: `dlrm_v3_perf.py --device cpu --tiny --items 1000
--item-rows 5000`, answers within 1.2e-7 of the reference.)"""
import os
import sys

import numpy as np
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "bench", "gpu"))

import dlrm_v3_perf  # noqa: E402
from dlrm_v3 import model as dv3  # noqa: E402


def test_the_item_table_repeats_the_reference_rows_in_fp16(tmp_path):
    base = torch.randn(7, 8, generator=torch.Generator().manual_seed(3))
    dlrm_v3_perf.write_item_table(str(tmp_path), base, 40, chunk=16)  # chunks of 16: 3, the last short
    keys = np.load(tmp_path / "keys.npy")
    vectors = np.load(tmp_path / "vectors.npy")
    assert keys.dtype == np.int64 and keys.tolist() == list(range(40))
    assert vectors.dtype == np.float16 and vectors.shape == (40, 8)
    want = base.half().numpy()
    for k in (0, 6, 7, 15, 16, 33, 39):
        assert np.array_equal(vectors[k], want[k % 7]), k
    # written again over itself: the same files, not appended to
    dlrm_v3_perf.write_item_table(str(tmp_path), base, 9, chunk=4)
    assert np.load(tmp_path / "vectors.npy").shape == (9, 8)


def test_requests_fold_for_the_reference_only():
    r = dv3.Request(user_id=1, item_ids=torch.tensor([3, 12, 25]), category_ids=torch.tensor([0, 1, 2]),
                    timestamps=torch.tensor([1, 2, 3]), actions=torch.tensor([0, 1, 0]),
                    cand_item_ids=torch.tensor([10, 4]), cand_category_ids=torch.tensor([1, 1]), query_time=9)
    (f,) = dlrm_v3_perf.folded([r], 10)
    assert f.item_ids.tolist() == [3, 2, 5] and f.cand_item_ids.tolist() == [0, 4]
    assert f.category_ids.tolist() == [0, 1, 2] and f.query_time == 9
    assert r.item_ids.tolist() == [3, 12, 25]  # the served request keeps its ids


def test_the_cache_share_is_the_item_tables_unless_asked_for_each_table():
    """The served config: the --cache share of the item table alone, the user and category tables
    whole, in embedding_table_names' order (`--cache-tables each`: gpucacheper alone, HPS's
    meaning); `--cache-rows fp16` asks for fp16 cache rows. (Served with them on the CPU:
    `dlrm_v3_perf.py --device cpu --tiny --cache 0.1,1.0 --cache-rows fp16`, the item cache 416
    rows of 4,096, the others whole, answers within 1.8e-7.)"""
    import argparse
    cfg = dv3.Config.tiny()

    base = dict(device="cuda", instances=2, max_batch=8, item_rows=0)

    def config(tables="items", rows="fp32"):
        a = argparse.Namespace(**base, cache_tables=tables, cache_rows=rows)
        return dlrm_v3_perf.model_config(cfg, a, "0.1")

    def param(text, key):
        line = [x for x in text.splitlines() if f'key: "{key}"' in x]
        return line[0].split('string_value: "')[1].split('"')[0] if line else None

    text = config()
    # the predictions one variable dimension, so that perf_analyzer's shared memory holds a request's
    assert 'name: "predictions" data_type: TYPE_FP32 dims: [ -1 ]' in text
    assert param(text, "embedding_table_names") == "item_id,user_id,category"
    assert param(text, "gpucacheper") == "0.1" and param(text, "gpucacheper_per_table") == "0.1,1.0,1.0"
    assert param(text, "gpucache_row_type") is None
    each = config("each", "fp16")
    assert param(each, "gpucacheper_per_table") is None and param(each, "gpucache_row_type") == "fp16"
