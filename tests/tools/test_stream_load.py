"""bench/gpu/stream_load.py draws its key pool by the same law and rank-to-key map as
zipf_keys.py (perf_analyzer's pools), here on CPU tensors: the same keys for the same ranks,
the same distribution of ranks within sampling error, every key a row of its table."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "gpu"))
torch = pytest.importorskip("torch")
import stream_load  # noqa: E402
import zipf_keys  # noqa: E402


def test_spread_is_zipf_keys_map():
    for n in (1, 7, 1000, 40_000_000):
        ranks = np.random.default_rng(1).integers(0, n, 5000)
        assert np.array_equal(stream_load.torch_spread(torch.as_tensor(ranks), n).numpy(), zipf_keys.spread(ranks, n))


@pytest.mark.parametrize("n,alpha", [(40_000_000, 1.2), (3000, 1.05), (40_000_000, 1.0)])
def test_ranks_follow_the_same_law(n, alpha):
    count = 400_000
    got = stream_load.torch_zipf_ranks(torch.Generator().manual_seed(3), n, alpha, count, "cpu").numpy()
    want = zipf_keys.zipf_ranks(np.random.default_rng(3), n, alpha, count)
    assert got.min() >= 0 and got.max() < n
    # the mass below each edge: binomial sampling error is at most ~0.0008 at this count
    for edge in (1, 10, 1000, 1 << 20, n // 2):
        a, b = float((got < edge).mean()), float((want < edge).mean())
        assert abs(a - b) < 0.004, (edge, a, b)


def test_draw_keys_shapes_and_ranges():
    rows = [5, 40_000_000, 1000]
    chunks = list(stream_load.draw_keys(rows, 64, 5, 1.2, seed=7, device="cpu", chunk=2))
    assert [first for first, _ in chunks] == [0, 2, 4]
    keys = torch.cat([k for _, k in chunks])
    assert keys.shape == (5, 64, 3) and keys.dtype == torch.int64
    for t, n in enumerate(rows):
        assert int(keys[:, :, t].min()) >= 0 and int(keys[:, :, t].max()) < n
    again = torch.cat([k for _, k in stream_load.draw_keys(rows, 64, 5, 1.2, seed=7, device="cpu", chunk=2)])
    assert torch.equal(keys, again)  # a seed draws the same pool
