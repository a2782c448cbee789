"""bench/gpu/aoti_perf.py's C API A/B: `--capi-variants` names the builds and schedulers to serve
in turn, and a C API run of a variant serves its plugin and its config (without dynamic batching
where it says so) beside the exported package, putting nothing into the measured repository."""
import os
import sys
import types

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "gpu"))
import aoti_perf  # noqa: E402


def test_variants_in_turn_round_after_round():
    got = aoti_perf.capi_variants("a=/x/a.so,b=/x/b.so:nobatcher", 2)
    assert [v["file_label"] for v in got] == ["a_r1", "b_r1", "a_r2", "b_r2"]
    assert [v["no_batcher"] for v in got] == [False, True, False, True]
    assert got[1]["plugin"] == "/x/b.so"
    assert aoti_perf.capi_variants("", 3) == []


@pytest.mark.parametrize("bad", ["a", "=/x.so", "a=", "a=/x.so:fast"])
def test_a_variant_that_is_not_label_plugin_is_refused(bad):
    with pytest.raises(SystemExit, match="LABEL=PLUGIN"):
        aoti_perf.capi_variants(bad, 1)


def test_a_variant_serves_its_plugin_and_config(tmp_path, monkeypatch):
    repo, capi = tmp_path / "repo", tmp_path / "capi"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "1" / "model.pt2").write_text("package")
    config = 'name: "m"\nbackend: "rust"\ndynamic_batching { max_queue_delay_microseconds: 0 }\nmax_batch_size: 8\n'
    (repo / "m" / "config.pbtxt").write_text(config)
    (capi / "backends" / "rust").mkdir(parents=True)
    plugin = tmp_path / "variant.so"
    plugin.write_text("variant build")
    seen = {}

    def fake_run(cmd, **kw):
        served = cmd[cmd.index("--model-repository") + 1]
        seen["config"] = open(os.path.join(served, "m", "config.pbtxt")).read()
        seen["package"] = open(os.path.join(served, "m", "1", "model.pt2")).read()
        seen["csv"] = cmd[cmd.index("-f") + 1]
        return types.SimpleNamespace(returncode=1, stdout="", stderr="")

    monkeypatch.setattr(aoti_perf.subprocess, "run", fake_run)
    a = types.SimpleNamespace(work=str(tmp_path / "work"), capi_dir=str(capi), perf_analyzer="pa", interval_ms=1,
                              max_trials=1, libtorch_dir="/lib")
    os.makedirs(a.work)
    v = aoti_perf.capi_variants(f"nb={plugin}:nobatcher", 1)[0]
    out = tmp_path / "out"
    out.mkdir()
    assert aoti_perf.perf_capi(a, str(repo), "m", 1, str(out), [], types.SimpleNamespace(__file__="/t/__init__.py"),
                               variant=v) is None
    assert "dynamic_batching" not in seen["config"] and "max_batch_size: 8" in seen["config"]
    assert seen["package"] == "package"
    assert seen["csv"].endswith("m_b1_c1_capi_nb_r1.csv")
    assert (capi / "backends" / "rust" / "libtriton_rust_aoti.so").read_text() == "variant build"
    assert (repo / "m" / "config.pbtxt").read_text() == config, "the measured repository is untouched"
