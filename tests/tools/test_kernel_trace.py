"""bench/gpu/kernel_trace.py reads the kernel records bench/gpu/kernel_trace.c writes (start_ns,
end_ns, stream, name index; a name once as start 0, its length, then its bytes) and says what ran
beside what over the steady stretch of a trace."""
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "gpu"))
from kernel_trace import intersect, read, steady, summary, union  # noqa: E402

MS = 1_000_000


def write_trace(path, seconds=20, warm=3):
    """Every 10 ms a batch: a network kernel for 6 ms, the probe from 4 to 8 ms (2 ms beside
    the network), the pooling from 8 to 9 ms; the first `warm` seconds a network kernel only each
    50 ms (a server warming up, not steady)."""
    rec = struct.Struct("<QQII")
    names = ["gemm_fp8_kernel", "probe_slots", "pool_probe_h_s16"]
    with open(path, "wb") as f:
        def kernel(s, e, stream, n):
            f.write(rec.pack(s, e, stream, n))
        for i, n in enumerate(names):
            b = n.encode()
            f.write(rec.pack(0, len(b), 0, i))
            f.write(b)
        base = 5_000 * MS
        for t in range(0, warm * 1000, 50):
            kernel(base + t * MS, base + t * MS + 6 * MS, 7, 0)
        base += warm * 1000 * MS
        for t in range(0, (seconds - warm) * 1000, 10):
            s = base + t * MS
            kernel(s, s + 6 * MS, 7, 0)
            kernel(s + 4 * MS, s + 8 * MS, 13, 1)
            kernel(s + 8 * MS, s + 9 * MS, 13, 2)


def test_reads_names_and_kernels(tmp_path):
    p = tmp_path / "t.bin"
    write_trace(p)
    names, kernels = read(p)
    assert names == {0: "gemm_fp8_kernel", 1: "probe_slots", 2: "pool_probe_h_s16"}
    assert len(kernels) == 60 + 3 * 1700


def test_unions_and_intersections():
    assert union([(5, 8), (0, 2), (1, 3), (8, 9)]) == [[0, 3], [5, 9]]
    assert intersect([[0, 3], [5, 9]], [[2, 6]]) == [[2, 3], [5, 6]]


def test_steady_stretch_skips_the_warm_up_and_the_ends(tmp_path):
    p = tmp_path / "t.bin"
    write_trace(p)
    names, kernels = read(p)
    a, b = steady(kernels, names, seconds=10)
    t0 = 5_000 * MS
    # steady from 3 s to 20 s; less a second each end: 4..19 s, its middle 10 s
    assert (a - t0, b - t0) == (6_500 * MS, 16_500 * MS)


def test_shares_of_the_time_and_a_batch(tmp_path):
    p = tmp_path / "t.bin"
    write_trace(p)
    names, kernels = read(p)
    text = "\n".join(summary(names, kernels, seconds=10))
    assert "1000 batches begun (100 a second)" in text
    assert "any kernel 90.0%" in text and "a network kernel 60.0%" in text
    assert "the store's 50.0%, both at once 20.0%" in text
    assert "a batch: 9.000 ms of any kernel running, 5.000 ms of the store's, 6.000 ms of a network's" in text
    probe = next(line for line in text.splitlines() if line.startswith("probe_slots"))
    assert probe.split()[1] == "1000" and probe.endswith("50%")  # 2 of its 4 ms beside the network
    pool = next(line for line in text.splitlines() if line.startswith("pool_probe_h_s16"))
    assert pool.endswith(" 0%")


def test_a_trace_without_networks_says_so(tmp_path):
    p = tmp_path / "t.bin"
    with open(p, "wb") as f:
        f.write(struct.pack("<QQII", 0, 11, 0, 0) + b"probe_slots")
        f.write(struct.pack("<QQII", 10, 20, 1, 0))
    names, kernels = read(p)
    assert summary(names, kernels) == ["no network kernel in the trace: nothing to summarize"]
