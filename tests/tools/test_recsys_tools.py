"""bench/gpu/recsys_perf.py's own arithmetic, in its modules under bench/gpu/recsys/: the
fixture's rows recomputed from the seed (fixture.py: what the exactness check compares served
rows with) equal the rows criteo_fixture writes, the cache's allocation stays within its budget
and the stationary hit rate is the Zipf law's mass of the cached keys (cache.py), and the
exactness verdict (exactness.py); an endless stream's CPU and GPU shares counted over its sends
alone (host_use.py, gpu_busy.py); and the command itself still starts (its --help)."""
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "bench", "gpu"))
from recsys import cache, exactness, fixture, gpu_busy, host_use  # noqa: E402


def fixture_bin():
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "triton_rust_embedding", "--example", "criteo_fixture"], cwd=ROOT, check=True)
    return os.path.join(ROOT, "target", "release", "examples", "criteo_fixture")


def test_recomputed_rows_equal_the_written_fixture(tmp_path):
    out = tmp_path / "fx"
    # scale 0.0001: 26 tables of 1 .. 4000 rows; dims with and without a whole number of quads
    for dim in (128, 65):
        subprocess.run([fixture_bin(), "--out", str(out / str(dim)), "--scale", "0.0001", "--dim", str(dim), "--seed", "7"],
                       check=True, capture_output=True)
        rows = fixture.fixture_rows(0.0001)
        for t in (0, 5, 10, 25):
            written = np.load(out / str(dim) / f"t{t}" / "vectors.npy")
            assert written.shape == (rows[t], dim)
            keys = np.arange(rows[t])
            assert np.array_equal(written.astype(np.float32), fixture.synthetic_rows(7, t, keys, dim)), (dim, t)
        # and another seed gives other rows
        assert not np.array_equal(np.load(out / str(dim) / "t0" / "vectors.npy").astype(np.float32),
                                  fixture.synthetic_rows(8, 0, np.arange(rows[0]), dim))


def test_store_allocation_caches_small_tables_whole_within_the_budget():
    rows = fixture.fixture_rows(0.8)
    per_table = cache.cache_rows(rows, 0.1, "per_table")
    store = cache.cache_rows(rows, 0.1, "store")
    budget = int(sum(rows) * 0.1)
    assert sum(store) <= budget and budget - sum(store) < len(rows)
    assert sum(per_table) >= budget
    small = [t for t, r in enumerate(rows) if r < 1_000_000]
    assert all(store[t] == 2 * rows[t] for t in small), "small tables whole, at half load"
    big = [store[t] for t, r in enumerate(rows) if r >= 30_000_000]
    assert max(big) - min(big) <= 1 and max(big) < 0.1 * 32_000_000, "the large tables share what is left"


def test_lookups_allocation_weighs_the_large_tables_by_their_keys_a_pair():
    rows = fixture.fixture_rows(1.0)
    hot = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]  # MLPerf DLRM-v2
    store = cache.cache_rows(rows, 0.1, "store")
    by = cache.cache_rows(rows, 0.1, "lookups", hot)
    budget = int(sum(rows) * 0.1)
    assert sum(by) <= budget and budget - sum(by) < len(rows)
    assert cache.cache_rows(rows, 0.1, "lookups", [1] * len(rows)) == store == cache.cache_rows(rows, 0.1, "lookups")
    big = [t for t, r in enumerate(rows) if r == 40_000_000]
    assert by[20] > 8 * by[0] and abs(by[20] / by[19] - 100 / 12) < 1e-3, "slots by keys a pair"
    # more hits for the same slots: the stationary rate, hotness-weighted as the benchmark's
    rate = lambda c: sum(h * cache.stationary_hit_rate([n], [x], 1.05) for n, x, h in zip(rows, c, hot)) / sum(hot)  # noqa: E731
    assert rate(by) > rate(store) + 0.015, (rate(by), rate(store))
    assert all(by[t] > 0 for t in big)


def test_stationary_hit_rate_is_the_cached_keys_mass():
    rows = [1000, 5_000_000]
    # everything cached: every key hits
    assert abs(cache.stationary_hit_rate(rows, rows, 1.2) - 1.0) < 1e-12
    # the exact mass of the top 100 of 1000 ranks, and the continuous tail past 2^20 ranks
    w = np.arange(1, 1001, dtype=np.float64) ** -1.2
    small = w[:100].sum() / w.sum()
    w = np.arange(1, 5_000_001, dtype=np.float64) ** -1.2
    big = w[:2_000_000].sum() / w.sum()
    got = cache.stationary_hit_rate(rows, [100, 2_000_000], 1.2)
    assert abs(got - (small + big) / 2) < 1e-6, (got, small, big)
    # a flatter law hits less
    assert cache.stationary_hit_rate(rows, [100, 2_000_000], 1.05) < got


def test_dlrm_interaction_forms_give_the_same_predictions():
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
    import recommenders
    cat = recommenders.make("dlrm", [50] * 26)
    split = recommenders.make("dlrm", [50] * 26, interaction="split")
    split.load_state_dict(cat.state_dict())
    torch.manual_seed(0)
    dense, emb = torch.randn(9, 13), torch.randn(9, 26, 128) * 0.3
    with torch.no_grad():
        a = torch.jit.script(recommenders.DensePart(cat))(dense, emb)
        b = torch.jit.script(recommenders.DensePart(split))(dense, emb)
    assert float((a - b).abs().max()) < 1e-5 and float(a.std()) > 0.01
    try:
        recommenders.make("dlrm", [5] * 26, interaction="dot")
    except ValueError as e:
        assert "cat, split or triton" in str(e)
    else:
        raise AssertionError("an unknown interaction is refused")


def test_exactness_fails_on_rows_or_on_predictions_past_the_bound():
    ok = {"rows_checked": 10, "rows_max_abs_diff": 0.0, "single_vs_ensemble_max_abs_diff": 3.3e-4}
    assert exactness.exactness_problems(ok, 2e-3) == []
    assert exactness.exactness_problems({"rows_max_abs_diff": 0.0}, 2e-3) == []  # keys-only check
    stale = dict(ok, single_vs_ensemble_max_abs_diff=0.12)
    assert "predictions differ" in " ".join(exactness.exactness_problems(stale, 2e-3))
    nan = dict(ok, single_vs_ensemble_max_abs_diff=float("nan"))
    assert exactness.exactness_problems(nan, 2e-3)
    rows = dict(ok, rows_max_abs_diff=0.5)
    assert "rows differ" in " ".join(exactness.exactness_problems(rows, 2e-3))


def test_the_command_still_parses_its_arguments():
    """recsys_perf.py, the command run.sh calls, imports its modules and answers --help."""
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu", "recsys_perf.py"), "--help"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "Criteo scale through the real tritonserver" in p.stdout and "--stream-concurrency" in p.stdout


def test_an_endless_streams_shares_count_its_sends_alone():
    """The stream's GPU busy share keeps nvidia-smi's samples inside the sends (the key draws
    between passes run on the GPU too), and its CPU figures add the sends' spans alone."""
    import time
    from datetime import datetime
    now = time.time()
    stamp = lambda t: datetime.fromtimestamp(t).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]  # noqa: E731
    lines = [f"{stamp(now + i / 10)}, {v}" for i, v in enumerate([10, 90, 90, 10, 80])] + ["[N/A]"]
    assert gpu_busy.mean_busy(lines) == 56.0
    assert abs(gpu_busy.mean_busy(lines, [(now + 0.05, now + 0.25), (now + 0.35, now + 0.45)]) - 260 / 3) < 1e-9
    assert gpu_busy.mean_busy(lines, [(now + 9, now + 10)]) is None
    # two sends of 1 s each: 100 jiffies of the host's 400 busy, the server 150 jiffies
    # (100 Hz) of two threads of one kind, the client 0.5 s
    s0 = (100, 1000, 50, 0.0, {"1": ("reader-0", 10), "2": ("reader-1", 40)})
    s1 = (150, 1200, 125, 0.25, {"1": ("reader-0", 60), "2": ("reader-1", 65)})
    hz = os.sysconf("SC_CLK_TCK")
    c = host_use.cpu_use_spans([(s0, s1), (s0, s1)], 2.0)
    assert c["host_busy_pct"] == 25.0 and c["client_cores"] == 0.25
    assert abs(c["server_cores"] - 150 / hz / 2) < 1e-9
    assert c["threads_by_kind"] == [["reader", 150 / hz / 2]]


def test_the_servers_kernel_time_is_split_out_by_kind():
    """Each thread's system time is kept beside its total, added per kind and over the sends'
    spans, and the host's kernel share comes from /proc/stat's system, irq and softirq; samples of
    the shape before (no split) still add up, their kernel time zero."""
    hz = os.sysconf("SC_CLK_TCK")
    s0 = (100, 1000, 50, 0.0, {"1": ("reader-0", 10, 2), "2": ("torch-gpu-1", 40, 5)}, 30)
    s1 = (150, 1200, 125, 0.25, {"1": ("reader-0", 60, 12), "2": ("torch-gpu-1", 65, 10)}, 50)
    c = host_use.cpu_use_spans([(s0, s1), (s0, s1)], 2.0)
    assert abs(c["server_kernel_cores"] - 30 / hz / 2) < 1e-9
    assert dict(c["kernel_by_kind"]) == {"reader": 20 / hz / 2, "torch-gpu": 10 / hz / 2}
    assert c["host_kernel_pct"] == 10.0
    assert "in the kernel: host 10%" in host_use.cpu_text(c)
    old = host_use.cpu_use((100, 1000, 50, 0.0, {"1": ("reader-0", 10)}),
                           (150, 1200, 125, 0.25, {"1": ("reader-0", 60)}), 1.0)
    assert old["server_kernel_cores"] == 0 and "host_kernel_pct" not in old
    assert old["threads_by_kind"] == [["reader", 50 / hz]]


def test_the_servers_run_queue_waits_and_the_hosts_steal_are_shown():
    """Each thread's schedstat wait (runnable, no core) is added per kind over the sends' spans,
    and the host's steal share comes from /proc/stat's eighth field; samples without either show
    neither."""
    s0 = (100, 1000, 50, 0.0, {"1": ("reader-0", 10, 2, 1_000_000_000), "2": ("reader-1", 10, 2, 0),
                               "3": ("torch-gpu-1", 40, 5, 0)}, 30, 7)
    s1 = (150, 1200, 125, 0.25, {"1": ("reader-0", 60, 12, 1_500_000_000), "2": ("reader-1", 60, 12, 250_000_000),
                                 "3": ("torch-gpu-1", 65, 10, 50_000_000)}, 50, 27)
    c = host_use.cpu_use_spans([(s0, s1), (s0, s1)], 2.0)
    assert abs(c["server_waiting_cores"] - 1.6 / 2) < 1e-9
    assert dict(c["waiting_by_kind"]) == {"reader": 1.5 / 2, "torch-gpu": 0.1 / 2}
    assert c["host_steal_pct"] == 10.0
    text = host_use.cpu_text(c)
    assert "waiting runnable for a core: tritonserver 0.8 cores (reader 0.8, torch-gpu 0.1)" in text
    assert "stolen by the hypervisor: 10.0% of the host" in text
    bare = host_use.cpu_use((100, 1000, 50, 0.0, {"1": ("reader-0", 10, 2)}, 30),
                            (150, 1200, 125, 0.25, {"1": ("reader-0", 60, 12)}, 50), 1.0)
    assert "server_waiting_cores" not in bare and "host_steal_pct" not in bare
    assert "waiting" not in host_use.cpu_text(bare) and "stolen" not in host_use.cpu_text(bare)
