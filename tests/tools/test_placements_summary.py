"""bench/gpu/placements_summary.py reads each run of a two-GPU DLRM-v2 call (from its folder,
run.sh's <run>.tgz or the committed runs.tgz) and prints the issue's ratios."""
import io
import json
import os
import sys
import tarfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "gpu"))
import placements_summary  # noqa: E402


def run(mlperf, stream, per_gpu=None):
    dev = per_gpu or {}
    return {"perf": [{"kind": "mlperf", "pairs_per_s": mlperf, "concurrency": 256, "p99_ms": 20.0, "per_device": dev},
                     {"kind": "mlperf", "pairs_per_s": mlperf / 2, "concurrency": 128, "p99_ms": 9.0}],
            "stream": [{"kind": "stream", "pairs_per_s": stream, "concurrency": 128, "p99_ms": 7.0}],
            "exactness": {"lookup": {"pooled_rows": 10, "bad_values": 0, "max_abs_diff": 1e-3,
                                     "per_gpu": {"dlrm_v2_lookup": {"GPU 0": 0.5, "GPU 1": 0.5}}},
                          "prediction": {"max_abs_diff_fp32": 0.02, "bound": 0.05}}}


def test_ratios_from_folders_and_archives(tmp_path, capsys):
    os.makedirs(tmp_path / "replicated_0")
    (tmp_path / "replicated_0" / "runs.json").write_text(json.dumps(run(9e6, 7e6)))
    # replicated_01 as run.sh --pack leaves it, sharded_01 inside the committed runs.tgz
    for name, res, tgz in (("replicated_01", run(18e6, 14e6, {"GPU 0": 9e6, "GPU 1": 9e6}), "replicated_01.tgz"),
                           ("sharded_01", run(12e6, 10e6), "runs.tgz")):
        data = json.dumps(res).encode()
        with tarfile.open(tmp_path / tgz, "w:gz") as t:
            info = tarfile.TarInfo(("./" if tgz == "runs.tgz" else "") + f"{name}/runs.json")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    sys.argv = ["placements_summary.py", str(tmp_path)]
    placements_summary.main()
    out = capsys.readouterr().out
    assert "PASS replicated: two GPUs >= 1.9x one GPU (endless stream): 14.00 / 7.00 M = 2.00x" in out
    assert "MISS sharded >= 0.8x replicated on the same GPUs (endless stream): 10.00 / 14.00 M = 0.71x" in out
    assert "sharded against replicated (perf_analyzer, MLPerf-like): 12.00 / 18.00 M = 0.67x" in out
    assert "18.00 M pairs/s at c=256, p99 20.0 ms (GPU 0 9.00 M, GPU 1 9.00 M)" in out, "the best run, per GPU"
    assert "sharded_01_fp32: sharded, two GPUs, fp32 rows\n  not run" in out
    assert "no ratio (sharded_01_fp32 has no figure)" in out



def test_rounds_in_turn_are_judged_by_their_median(tmp_path, capsys):
    # --rounds 3: sharded_01 against replicated_01 at 0.70x, 0.90x and 0.85x by the stream
    for k, (sharded, replicated) in enumerate([(7e6, 10e6), (9e6, 10e6), (8.5e6, 10e6)], start=1):
        suffix = "" if k == 1 else f"_r{k}"
        for name, stream in (("sharded_01", sharded), ("replicated_01", replicated)):
            os.makedirs(tmp_path / f"{name}{suffix}")
            (tmp_path / f"{name}{suffix}" / "runs.json").write_text(json.dumps(run(stream, stream)))
    sys.argv = ["placements_summary.py", str(tmp_path)]
    placements_summary.main()
    out = capsys.readouterr().out
    assert ("PASS sharded >= 0.8x replicated on the same GPUs (endless stream): 7.00 / 10.00 M = 0.70x; "
            "rounds 0.70x, 0.90x, 0.85x, median 0.85x") in out
    assert "  round 3 stream   8.50 M pairs/s at c=128" in out
    # one round alone is judged by itself
    for k in (2, 3):
        for name in ("sharded_01", "replicated_01"):
            os.remove(tmp_path / f"{name}_r{k}" / "runs.json")
    placements_summary.main()
    assert "MISS sharded >= 0.8x replicated on the same GPUs (endless stream): 7.00 / 10.00 M = 0.70x\n" in capsys.readouterr().out


def test_large_requests_get_their_own_lines_only_where_sent(tmp_path, capsys):
    """Runs with --big-concurrency print their large requests' rate and ratio beside the rest;
    a call without them prints no such lines."""
    with_big = {name: run(m, s) for name, m, s in (("replicated_0", 9e6, 7e6), ("replicated_01", 10e6, 8e6))}
    with_big["replicated_0"]["perf"].append({"kind": "big", "pairs_per_s": 11e6, "concurrency": 8, "p99_ms": 30.0})
    with_big["replicated_01"]["perf"].append({"kind": "big", "pairs_per_s": 21e6, "concurrency": 16, "p99_ms": 31.0})
    for name, res in with_big.items():
        os.makedirs(tmp_path / "big" / name)
        (tmp_path / "big" / name / "runs.json").write_text(json.dumps(res))
        os.makedirs(tmp_path / "plain" / name)
        (tmp_path / "plain" / name / "runs.json").write_text(json.dumps(run(9e6, 7e6)))
    sys.argv = ["placements_summary.py", str(tmp_path / "big")]
    placements_summary.main()
    out = capsys.readouterr().out
    assert "replicated: two GPUs against one GPU (perf_analyzer, large requests): 21.00 / 11.00 M = 1.91x" in out
    assert "big     21.00 M pairs/s at c=16, p99 31.0 ms" in out
    assert "sharded fp32 rows against replicated fp16 (perf_analyzer, large requests): no ratio" in out
    sys.argv = ["placements_summary.py", str(tmp_path / "plain")]
    placements_summary.main()
    plain = capsys.readouterr().out
    assert "large requests" not in plain and "  big " not in plain


def test_c_api_runs_get_their_own_ratio_only_where_measured(tmp_path, capsys):
    """Runs with --capi-concurrency (Triton in perf_analyzer's process, no gRPC) print their rate
    and the two-GPU ratio beside the rest, never judged; a call without them prints none."""
    for name, capi in (("replicated_0", 9e6), ("replicated_01", 17e6)):
        res = run(8e6, 7e6)
        res["perf"].append({"kind": "fixed270_capi", "pairs_per_s": capi, "concurrency": 512, "p99_ms": 12.0})
        os.makedirs(tmp_path / name)
        (tmp_path / name / "runs.json").write_text(json.dumps(res))
    sys.argv = ["placements_summary.py", str(tmp_path)]
    placements_summary.main()
    out = capsys.readouterr().out
    assert "-    replicated: two GPUs against one GPU (in-process, Triton's C API): 17.00 / 9.00 M = 1.89x" in out
    assert "fixed270_capi  17.00 M pairs/s at c=512" in out
    for name in ("replicated_0", "replicated_01"):
        (tmp_path / name / "runs.json").write_text(json.dumps(run(8e6, 7e6)))
    placements_summary.main()
    assert "C API" not in capsys.readouterr().out


def test_the_plot_stacks_each_run_by_gpu_and_names_the_gpus(tmp_path, capsys):
    for name, res in (("replicated_0", run(9e6, 7e6)), ("replicated_01", run(18e6, 14e6))):
        os.makedirs(tmp_path / name)
        res["stream"][0]["per_device"] = {"GPU 0": 7e6} if name == "replicated_0" else {"GPU 0": 8e6, "GPU 1": 6e6}
        (tmp_path / name / "runs.json").write_text(json.dumps(res))
    (tmp_path / "topo.txt").write_text("GPU0\tX\tNV18\nindex, name, memory.total [MiB]\n0, NVIDIA H100 80GB HBM3, 81559 MiB\n"
                                       "1, NVIDIA H100 80GB HBM3, 81559 MiB\n")
    assert placements_summary.gpu_name(str(tmp_path)) == "NVIDIA H100 80GB HBM3"
    png = tmp_path / "placements.png"
    sys.argv = ["placements_summary.py", str(tmp_path), f"--plot={png}"]
    placements_summary.main()
    assert f"plot: {png}" in capsys.readouterr().out and png.stat().st_size > 10_000
    assert placements_summary.plot({"replicated_0": None}, str(tmp_path / "none.png")) is None
