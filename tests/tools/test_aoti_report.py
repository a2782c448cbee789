"""bench/gpu/aoti_report.py reads a recommender run's console: each one-model figure with how
its package was exported, the network alone, and the same run's TorchScript ensemble and
ceiling; the targets judged, a p99 bound included."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "gpu"))
import aoti_report  # noqa: E402

CONSOLE = """run.sh aoti-recsys --models dlrm --paths ens,one --batches 4096,65536 --one-instances 2 --dlrm-interaction triton --inductor dcnv2:max_autotune=true --inductor coordinate_descent_tuning=true
exported dlrm's network as a CUDA package (7 MB, batch up to 65536, example batch 65536) in 85 s; Inductor settings ['coordinate_descent_tuning=true']
  ceiling dlrm batch 65536: eager 21.04 M/s, graph 21.23 M/s
  bare AOTI network batch 65536: plain 1.343 ms (48.80 M/s), CUDA graph 1.269 ms (51.63 M/s)
  bare AOTI network batch 4096: plain 0.180 ms (22.70 M/s), CUDA graph 0.120 ms (34.10 M/s)
  dlrm_ens   a=1.2  b=65536  c=4    19.42 M inf/s  p99    16.04 ms  hit rate 1.000    284.9 M keys/s  served/ceiling 0.91
      per execution (ms): dlrm_sparse: input 0.01, infer 0.72, output 0.51, queue 0.05; dlrm_dense: input 0.01, infer 3.23, output 0.03, queue 8.32
  dlrm_one   a=1.2  b=65536  c=4    30.81 M inf/s  p99     9.54 ms  hit rate 1.000    443.0 M keys/s  served/ceiling 1.45
      per execution (ms): dlrm_one: input 0.01, infer 4.15, output 0.04, queue 3.81; the package's network alone (aoti_bare): 1.34 ms, CUDA graph 1.27 ms
  dlrm_one   a=1.2  b=4096   c=2    11.38 M inf/s  p99     1.70 ms  hit rate 1.000    166.9 M keys/s  served/ceiling -
      per execution (ms): dlrm_one: input 0.01, infer 0.36, output 0.02, queue 0.04; the package's network alone (aoti_bare): 0.18 ms, CUDA graph 0.12 ms
  dlrm_ens   a=1.2  b=4096   c=2     9.00 M inf/s  p99     1.20 ms  hit rate 1.000    100.0 M keys/s  served/ceiling -
      per execution (ms): dlrm_sparse: input 0.01, infer 0.10, output 0.05, queue 0.01; dlrm_dense: input 0.01, infer 0.30, output 0.03, queue 0.02
"""


def test_recsys_rows(tmp_path):
    (tmp_path / "console.log").write_text(CONSOLE)
    big, small = aoti_report.recsys_rows(str(tmp_path))
    assert big["export"] == "interaction triton; example batch 65536; coordinate_descent_tuning=true"
    assert (big["batch"], big["conc"], big["instances"]) == (65536, 4, 2)
    assert big["ips"] == 30.81e6 and big["infer_ms"] == 4.15
    assert big["network"] == 51.63e6 and big["ts_served"] == 19.42e6 and big["ts_ceiling"] == 21.23e6
    assert big["pass"]
    # 10 M reached but p99 above 1 ms; the ensemble's per-execution line is not the one model's
    assert small["ips"] == 11.38e6 and not small["pass"] and small["infer_ms"] == 0.36
    assert small["ts_served"] == 9.0e6 and small["ts_ceiling"] is None
    assert big["protocol"] == small["protocol"] == "gRPC"
    # two instances, each caching 10% of the rows: 20% in GPU memory in all, said beside the pass
    aoti_report.main(["--recsys", str(tmp_path), "--out", str(tmp_path / "out"), "--no-plots"])
    text = (tmp_path / "out" / "report.md").read_text()
    assert "| 2 x 10% | 4 | 30.81 M |" in text and "PASS with 20% of the rows in GPU caches" in text
    # the same run with the instances sharing one cache per GPU (gpucache_sharing device): 10% in all
    (tmp_path / "console.log").write_text(CONSOLE.replace(
        "exported dlrm", "GPU caches: one per GPU, shared by the single model's 2 instance(s)\nexported dlrm"))
    aoti_report.main(["--recsys", str(tmp_path), "--out", str(tmp_path / "out"), "--no-plots"])
    text = (tmp_path / "out" / "report.md").read_text()
    assert "| 2 sharing 10% | 4 | 30.81 M |" in text and "PASS |" in text and "GPU caches |" not in text
    # caches that keep their rows as fp16 (gpucache_row_type fp16) say so in the instances column
    (tmp_path / "console.log").write_text(CONSOLE.replace(
        "exported dlrm",
        "GPU caches: one per GPU, shared by the single model's 2 instance(s), rows kept as fp16\nexported dlrm"))
    aoti_report.main(["--recsys", str(tmp_path), "--out", str(tmp_path / "out"), "--no-plots"])
    assert "| 2 sharing 10%, fp16 rows | 4 | 30.81 M |" in (tmp_path / "out" / "report.md").read_text()
    (tmp_path / "console.log").write_text(CONSOLE.replace("--paths ens,one", "--paths ens,one --protocol http"))
    assert {r["protocol"] for r in aoti_report.recsys_rows(str(tmp_path))} == {"HTTP"}


def test_export_label_says_the_form():
    line = ("exported dcnv2's network as a CUDA package (35 MB, batch up to 65536, example batch 65536, cross triton) "
            "in 90 s")
    assert aoti_report.export_label("run.sh aoti-recsys --models dcnv2", line, "dcnv2") == "cross triton; example batch 65536"


def test_export_label_defaults():
    line = "exported wide_deep's network as a CUDA package (7 MB, batch up to 131072) in 10 s"
    assert aoti_report.export_label("run.sh aoti-recsys --models wide_deep", line, "wide_deep") == "example batch 4"
    tuned = line + "; Inductor settings ['max_autotune=true', 'max_autotune_gemm_backends=TRITON']"
    assert (aoti_report.export_label("run.sh x", tuned, "dcnv2")
            == "example batch 4; max_autotune=true; max_autotune_gemm_backends=TRITON")


STREAM = """run.sh aoti-recsys --models dcnv2 --paths one --batches 65536 --one-instances 2 --stream-concurrency 4 --protocol grpc,http
exported dcnv2's network as a CUDA package (35 MB, batch up to 65536, example batch 65536, cross triton 128x64x64w8s3) in 97 s
  dcnv2_one  a=1.2  b=65536  c=4    10.07 M inf/s  p99    28.60 ms  hit rate 1.000    135.0 M keys/s  served/ceiling -
  dcnv2_one  a=1.2  b=65536  c=4    10.17 M inf/s  p99    27.00 ms  hit rate 1.000    135.0 M keys/s  served/ceiling -  over http
  dcnv2_one  a=1.2  b=65536  c=4     9.54 M inf/s  p99    36.82 ms  hit rate 0.9954  endless stream (stream_load.py, HTTP; not perf_analyzer)
      p50 27.33 ms, p90 29.34, p95 32.11; a pool of 1882 distinct requests (123,338,752 lookups per table, 25.7 GB of keys in GPU memory; the stream's rate needs 1882), one pass to warm, 1 measured; the endless stream's LRU rate 0.9946: measured - stream +0.0008 (within 0.002)
"""


def test_stream_rows_and_protocols(tmp_path):
    (tmp_path / "console.log").write_text(STREAM)
    grpc, http, stream = aoti_report.recsys_rows(str(tmp_path))
    assert (grpc["protocol"], http["protocol"]) == ("gRPC", "HTTP") and not grpc.get("stream")
    assert stream["stream"] and stream["pool"] == 1882 and stream["gap"] == "+0.0008" and stream["within"] == "within"
    assert stream["lru"] == "0.9946" and stream["ips"] == 9.54e6
    out = tmp_path / "out"
    aoti_report.main(["--recsys", str(tmp_path), "--out", str(out), "--no-plots"])
    text = (out / "report.md").read_text()
    # the throughput target judged at the stream's own hit rate, beside that hit rate's verdict
    assert "MISS at the stream's hit rate; hit rate +0.0008 (PASS; pool of 1882 requests)" in text
