"""bench/gpu/timing_summary.py averages the backend's verbose `timing:` lines per kind of line
(the lines as the serving layer, the torch and AOTInductor plugins and the ONNX engine's GPU path write them)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "gpu"))
from timing_summary import averages, medians, summarize  # noqa: E402

LOG = [
    'I1123 15:00:00.1 1 serve.rs:463] "timing: requests 1, rows 128, assemble 4 us, engine 19385 us, outputs into responses 192 us"',
    'I1123 15:00:00.2 1 serve.rs:463] "timing: requests 3, rows 2, assemble 6 us, engine 19000 us, outputs into responses 100 us"',
    'I1123 15:00:00.3 1 gpu.rs:300] "timing: onnx run: input bytes 38535168, inputs staged 4500 us, graph run 14700 us, outputs delivered 40 us"',
    'I1123 15:00:00.4 1 plugin.rs:147] "timing: torch run: handed over 1 us, inputs staged 32 us, graph replayed 35 us, gpu done 1001 us, handed back 5 us, outputs delivered 1120 us"',
    'I1125 15:08:08.2 1 plugin.rs:268] "timing: aoti run: handed over 2 us, inputs staged 3 us, graph replayed 19 us, gpu done 617 us, outputs delivered 34 us, handed back 1 us"',
    'I1123 15:00:00.5 1 lib.rs:807] "timing: batch lookup: keys 1703936, misses 6720, lookup 1369 us, below cache 478 us, scatter 250 us, fill queued 84 us (most misses: t0 3000, t9 2000)"',
    "an unrelated line with engine 5 us",
]


def test_averages_per_kind_and_label():
    got = averages(LOG)
    assert got[("serve", "engine")] == (19192.5, 2)
    assert got[("serve", "requests")] == (2.0, 2)
    assert got[("onnx run", "inputs staged")] == (4500.0, 1)
    assert got[("onnx run", "graph run")] == (14700.0, 1)
    assert got[("onnx run", "input bytes")] == (38535168.0, 1)
    assert got[("torch run", "handed back")] == (5.0, 1)
    assert got[("torch run", "graph replayed")] == (35.0, 1)
    assert not any(label == "engine" and kind != "serve" for kind, label in got)
    assert got[("aoti run", "gpu done")] == (617.0, 1)
    assert got[("aoti run", "graph replayed")] == (19.0, 1)
    assert got[("batch lookup", "fill queued")] == (84.0, 1), "the notes in parentheses are not figures"
    assert got[("batch lookup", "misses")] == (6720.0, 1)
    assert not any(label.startswith(("t", "most")) for kind, label in got if kind == "batch lookup")


def test_medians_are_the_typical_run():
    lines = [f'"timing: aoti run: handed over 0 us, inputs staged {v} us, gpu done 580 us"' for v in (14, 13, 15, 900)]
    got = medians(lines)
    assert got[("aoti run", "inputs staged")] == 15, "the upper median of 13, 14, 15, 900"
    assert averages(lines)[("aoti run", "inputs staged")] == (235.5, 4), "the mean counts the large one"
    assert got[("aoti run", "gpu done")] == 580


def test_the_99th_percentile_says_where_slow_batches_went(tmp_path):
    # 200 batch lookups: 198 read their misses below the cache in 100 us, two in 900 and 950
    lines = [f'"timing: batch lookup: keys 106496, misses 575, lookup 40 us, below cache {v} us, scatter 20 us"'
             for v in [100] * 198 + [900, 950]]
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines) + "\n")
    mean, median, p99, n = summarize(str(log))[("batch lookup", "below cache")]
    assert (median, p99, n) == (100, 900, 200), "nearest rank: index 198 of 200 sorted, the second slowest"
    assert mean == (198 * 100 + 900 + 950) / 200
    assert summarize(str(log))[("batch lookup", "scatter")][2] == 20


def test_the_first_share_of_a_log_can_be_left_out(tmp_path):
    # a warm-up of 25 slow batches, then 75 typical ones: --skip 0.25 leaves the warm-up out
    lines = [f'"timing: batch lookup: keys 10, misses 5, below cache {v} us"' for v in [5000] * 25 + [200] * 75]
    log = tmp_path / "server.log"
    log.write_text("\n".join(["an unrelated line"] * 7 + lines) + "\n")
    assert summarize(str(log))[("batch lookup", "below cache")][3] == 100
    mean, median, p99, n = summarize(str(log), skip=0.25)[("batch lookup", "below cache")]
    assert (mean, median, p99, n) == (200, 200, 200, 75), "a quarter of the timing lines, not of the log's"


def test_reading_cores_from_a_served_streams_medians():
    import cache_runs_summary as crs
    # 170,000 rows a batch read in 26 ms of readers' time, batches of 16,384 pairs at 6.5536 M pairs/s (400 a second)
    stream = {"pairs_per_s": 6.5536e6, "timing": {"batch lookup": {"shares busy": [26000], "rows read": [170000]},
                                                  "serve": {"rows": [16384]}}}
    cores, each = crs.reading_cores(stream)
    assert abs(cores - 10.4) < 1e-9 and abs(each - 170000 / 0.026 / 1e6) < 1e-9
    assert crs.reading_cores({"pairs_per_s": 1.0, "timing": {}}) is None


def test_the_crews_cpu_from_a_served_streams_threads_by_kind():
    import cache_runs_summary as crs
    cpu = {"threads_by_kind": [["reader", 7.6], ["tritonserver", 3.5], ["torch-gpu", 2.5], ["complete dlrm_v", 0.0]]}
    assert crs.crew_cpu({"cpu": cpu}) == (7.6, 3.5, 2.5)
    cpu["threads_by_kind"] = [["reader", 5.0]]
    assert crs.crew_cpu({"cpu": cpu}) == (5.0, 0.0, 0.0), "a kind not listed took nothing"
    assert crs.crew_cpu({"cpu": {"threads_by_kind": [["tritonserver", 12.1]]}}) is None, "all in HBM: no crew"
    assert crs.crew_cpu({}) is None


def test_rows_the_gpu_read_in_place_are_not_the_host_threads():
    import cache_runs_summary as crs
    # a batch of 170,000 misses, 35,000 of them read by the GPU in place: the host threads read
    # 135,000, and the readers' rate a core counts only theirs
    lookup = {"misses": [170000], "rows read": [170000], "read by the gpu": [35000], "shares busy": [20000]}
    stream = {"pairs_per_s": 4.9152e6, "hit_rate": 0.95, "lookups_per_s": 1e9,
              "timing": {"batch lookup": lookup, "serve": {"rows": [16384]}}}
    served, host = crs.misses_read(stream)
    assert abs(served - 50.0) < 1e-9 and abs(host - 50.0 * 135000 / 170000) < 1e-9
    cores, each = crs.reading_cores(stream)
    assert abs(cores - 6.0) < 1e-9 and abs(each - 135000 / 0.020 / 1e6) < 1e-9
    del lookup["read by the gpu"]  # host threads alone: every row read is theirs
    assert abs(crs.misses_read(stream)[1] - 50.0) < 1e-9


def test_the_caches_queue_held_from_a_served_streams_medians():
    import cache_runs_summary as crs
    import timing_summary
    # a batch lookup's timing line with the queue's figures (TRITON_RUST_TIME_QUEUE=1): parsed
    # like the rest, not the notes in brackets after them
    line = ("timing: batch lookup: keys 3506176, misses 169664, shares busy 16503 us, queue lookup 1075 us, "
            "queue fill 247 us (most misses: t20 9000)")
    found = timing_summary.figures([line])
    assert found[("batch lookup", "queue lookup")] == [1075] and found[("batch lookup", "queue fill")] == [247]
    # 1.075 + 0.247 ms a batch at 400 batches a second (6.5536 M pairs/s of 16,384): held 52.88%
    stream = {"pairs_per_s": 6.5536e6, "timing": {"batch lookup": {"queue lookup": [1075], "queue fill": [247]},
                                                  "serve": {"rows": [16384]}}}
    held, lookup, fill = crs.queue_busy(stream)
    assert abs(held - 0.5288) < 1e-9 and (lookup, fill) == (1.075, 0.247)
    # no queue figures (a run without the knob, or every row in HBM): nothing said
    assert crs.queue_busy({"pairs_per_s": 1.0, "timing": {"serve": {"rows": [16384]}}}) is None


def test_the_bus_traffic_is_the_mean_over_the_longest_busy_stretch(tmp_path):
    import cache_runs_summary as crs
    head = ("#Time         gpu  rxpci  txpci     sm    mem\n"
            "#HH:MM:SS     Idx   MB/s   MB/s      %      %\n")
    rows = [("0", "0", "0"), ("5000", "500", "12"), ("0", "0", "0"),  # the tables' load, a pause
            ("30000", "3000", "90"), ("10000", "1000", "30"), ("20000", "2000", "95"),  # serving
            ("0", "0", "0")]
    body = "".join(f" 18:00:{i:02d}  0  {rx}  {tx}  {sm}  10\n" for i, (rx, tx, sm) in enumerate(rows))
    p = tmp_path / "run.dmon.txt"
    p.write_text(head + body)
    up, down = crs.bus_traffic(str(p))
    assert abs(up - 20.0) < 1e-9 and abs(down - 2.0) < 1e-9
    assert crs.bus_traffic(str(tmp_path / "absent.txt")) is None


def test_a_busy_reader_core_against_a_steady_gather_thread_at_the_same_thread_count(tmp_path):
    import cache_runs_summary as crs
    (tmp_path / "plain.txt").write_text(
        "| plain, steady threads (M rows/s): threads | prefetch 4 rows ahead | 8 ahead | 16 ahead | 16 ahead, streaming stores |\n"
        "|---:|---:|---:|---:|---:|\n"
        "| 4 | 41.0 | 40.0 | 39.0 | 30.0 |\n"
        "| 8 | 120.0 | 143.2 | 140.0 | 90.0 |\n"
        "| 16 | 240.0 | 250.0 | 252.0 | 160.0 |\n")
    steady = crs.steady_per_thread(str(tmp_path))
    # each count's best of its plain-store columns, a thread (not the streaming column)
    assert steady == {4: 41.0 / 4, 8: 143.2 / 8, 16: 252.0 / 16}
    # 7.6 busy cores: against 8 threads; 9.5: against 16; more than the table: its most
    ratio, at = crs.per_core_against_steady(8.95, 7.6, steady)
    assert abs(ratio - 0.5) < 1e-9 and at == 8
    ratio, at = crs.per_core_against_steady(7.875, 9.5, steady)
    assert abs(ratio - 0.5) < 1e-9 and at == 16
    assert crs.per_core_against_steady(7.875, 20, steady)[1] == 16
    assert crs.per_core_against_steady(1.0, 4, {}) is None
    assert crs.steady_per_thread(str(tmp_path / "absent")) == {}


def test_misses_a_served_pair():
    import cache_runs_summary as crs
    # 214 keys a pair at hit rate 0.95: 10.7 misses a pair
    stream = {"pairs_per_s": 7e6, "lookups_per_s": 7e6 * 214, "hit_rate": 0.95}
    assert abs(crs.misses_a_pair(stream) - 10.7) < 1e-9
    assert crs.misses_a_pair({"pairs_per_s": 7e6, "lookups_per_s": 1.0}) is None


def test_each_run_against_its_own_all_in_hbm_run():
    import cache_runs_summary as crs
    runs = {"hbm": 1, "hbmb32": 1, "quiet": 1, "quietb32": 1, "quietc99every8": 1}
    assert crs.hbm_of("quietb32", runs) == "hbmb32"
    assert crs.hbm_of("quiet", runs) == "hbm" and crs.hbm_of("quietc99every8", runs) == "hbm"
    assert crs.hbm_of("hbmb32", runs) == "hbmb32" and crs.hbm_of("hbm", runs) == "hbm"
    assert crs.hbm_of("quiet", {"hbmquiet": 1, "hbm": 1}) == "hbmquiet"
    assert crs.hbm_of("quiet", {"quiet": 1}) is None


def test_the_steady_gather_into_several_batches_buffers(tmp_path):
    import cache_runs_summary as crs
    (tmp_path / "plain.txt").write_text(
        "| plain, steady threads (M rows/s): threads | prefetch 4 rows ahead | 8 ahead | 16 ahead | "
        "16 ahead, streaming stores | 16 ahead, into 6 batches' buffers (261 MB) | the same, streaming stores |\n"
        "|---:|---:|---:|---:|---:|---:|---:|\n"
        "| 8 | 120.6 | 134.1 | 141.5 | 105.0 | 113.1 | 102.9 |\n"
        "| 16 | 288.8 | 308.7 | 285.3 | 168.6 | 198.6 | 176.2 |\n")
    assert crs.steady_staged_best(str(tmp_path)) == (198.6, 16, 6)
    # the columns before it read as before
    assert crs.steady_per_thread(str(tmp_path)) == {8: 141.5 / 8, 16: 308.7 / 16}
    (tmp_path / "plain.txt").write_text(
        "| plain, steady threads (M rows/s): threads | prefetch 4 rows ahead | 8 ahead | 16 ahead | 16 ahead, streaming stores |\n"
        "| 16 | 240.0 | 250.0 | 252.0 | 160.0 |\n")
    assert crs.steady_staged_best(str(tmp_path)) is None
    assert crs.steady_staged_best(str(tmp_path / "absent")) is None


def test_the_plain_gather_beside_the_bus_copies_is_read_from_the_plainbus_files(tmp_path):
    import cache_runs_summary as crs
    head = ("| plain, steady threads (M rows/s): threads | prefetch 4 rows ahead | 8 ahead | 16 ahead | "
            "16 ahead, streaming stores | 16 ahead, into 6 batches' buffers (261 MB) | the same, streaming stores |\n"
            "|---:|---:|---:|---:|---:|---:|---:|\n")
    for load, sixteen in (("0", ("214.5", "202.3", "198.2", "144.8", "195.7")),
                          ("20", ("161.9", "175.5", "167.5", "109.8", "151.4"))):
        (tmp_path / f"plainbus.{load}.txt").write_text(
            "table: 62500000 rows\n" + head + "| 8 | 77.2 | 99.4 | 88.0 | 64.3 | 97.3 | 62.2 |\n"
            + "| 16 | " + " | ".join(sixteen) + " | 152.8 |\n")
    (tmp_path / "plainbus.load.txt").write_text("bus load: 20.0 GB/s up for 45 s (20 GB/s asked, copies of 42 MB)\n")
    got = crs.bus_loaded(str(tmp_path))
    # each load's best over every plain-store cell, and its best into the instances' buffers
    assert got == [("0", 214.5, 195.7, None), ("20", 175.5, 151.4, 20.0)]
    assert crs.bus_loaded(str(tmp_path / "none")) == []
