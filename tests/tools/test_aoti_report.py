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
