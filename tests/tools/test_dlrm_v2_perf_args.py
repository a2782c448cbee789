"""bench/gpu/dlrm_v2_perf.py's perf_analyzer options, on the CPU: the call modes and the large
requests are checked at parse time, a perf_analyzer that hangs is stopped and counts as a run
with no figure, and the messages of lost gRPC connections are what sends a run again."""
import os
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "bench", "gpu"))

import dlrm_v2_perf  # noqa: E402

BASE = ["--server", "s", "--backends", "b", "--perf-analyzer", "p"]


def test_modes_probe_and_big_requests_parse_and_refuse():
    a = dlrm_v2_perf.parse(BASE + ["--pa-modes", "sync, grpcstream,http,httpsync", "--probe-concurrency", "64,256",
                                   "--probe-clients", "1,2", "--big-concurrency", "4", "--big-pairs", "8192"])
    assert a.pa_mode_list == ["sync", "grpcstream", "http", "httpsync"]
    assert a.probe_concs == [64, 256] and a.probe_client_counts == [1, 2] and a.big_concs == [4]
    assert a.big_queries == 16 and a.stream_pairs == 270
    assert dlrm_v2_perf.parse(BASE).pa_mode_list == ["sync"]  # perf_analyzer's own default
    for bad in (["--pa-modes", "sync,quic"], ["--pa-modes", ","],
                ["--big-concurrency", "4", "--big-pairs", "20000"], ["--big-concurrency", "4", "--big-pairs", "0"],
                ["--big-concurrency", "4", "--big-queries", "0"], ["--stream-pairs", "0"], ["--stream-pairs", "20000"]):
        with pytest.raises(SystemExit):
            dlrm_v2_perf.parse(BASE + bad)


def test_a_hung_perf_analyzer_is_stopped_and_gives_no_figure():
    a = dlrm_v2_perf.parse(BASE + ["--pa-timeout-s", "1", "--budget-s", "600"])
    done = dlrm_v2_perf.pa_call(a, ["sh", "-c", "echo started; sleep 30"])
    assert done.returncode == 124
    assert "started" in done.stdout and "stopped after 1 s" in done.stderr
    assert dlrm_v2_perf.pa_call(a, ["sh", "-c", "echo ok"]).returncode == 0


@pytest.mark.parametrize("text, lost", [
    ("Thread [8] had error: failed to connect to all addresses; last error: UNAVAILABLE: "
     "ipv4:127.0.0.1:18951: Broken pipe", True),
    ("Failed to connect to remote host: Connection reset by peer", True),
    ("Failed to retrieve results from inference request.", True),
    ("Failed to obtain stable measurement within 6 measurement windows", False),
    ("unable to allocate memory of 14024704 bytes on gpu for output: out of memory", False),
])
def test_only_lost_connections_send_a_run_again(text, lost):
    assert bool(dlrm_v2_perf.CONNECTION_LOST.search(text)) == lost


def test_channel_shares_and_the_c_api_runs_parse_and_refuse():
    a = dlrm_v2_perf.parse(BASE + ["--pa-channel-shares", "6,64", "--capi-concurrency", "256,512,768",
                                   "--capi-dir", "/tmp/capi"])
    assert a.channel_shares == [6, 64] and a.capi_concs == [256, 512, 768]
    assert dlrm_v2_perf.capi_range(a.capi_concs) == "256:768:256"
    assert dlrm_v2_perf.capi_range([512]) == "512:512:1"
    assert dlrm_v2_perf.parse(BASE).capi_concs == []  # none unless asked
    for bad in (["--capi-concurrency", "256"],  # no --capi-dir
                ["--capi-concurrency", "128,256,768", "--capi-dir", "/tmp/capi"]):  # no even step
        with pytest.raises(SystemExit):
            dlrm_v2_perf.parse(BASE + bad)


def test_a_channel_share_reaches_perf_analyzer_through_its_environment():
    assert dlrm_v2_perf.pa_env(None) is None  # perf_analyzer's default (6)
    a = dlrm_v2_perf.parse(BASE + ["--budget-s", "600"])
    done = dlrm_v2_perf.pa_call(a, ["sh", "-c", "echo $TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT"],
                                dlrm_v2_perf.pa_env(64))
    assert done.stdout.strip() == "64"


def test_the_shared_memory_of_the_network_runs_parses_and_refuses():
    assert dlrm_v2_perf.parse(BASE).pa_shm == "cuda"  # as before the option: GPU memory
    assert dlrm_v2_perf.parse(BASE + ["--pa-shm", "system"]).pa_shm == "system"
    with pytest.raises(SystemExit):
        dlrm_v2_perf.parse(BASE + ["--pa-shm", "none"])


def test_network_package_forms_parse_and_refuse():
    """dlrm_v2_network.py --packages: PRECISION[:triton][:autotune]."""
    import dlrm_v2_network

    assert dlrm_v2_network.package_form("fp16") == ("fp16", "torch", None)
    assert dlrm_v2_network.package_form("fp8:triton") == ("fp8", "triton", None)
    assert dlrm_v2_network.package_form("fp8:triton:autotune") == ("fp8", "triton", {"max_autotune": True})
    for bad in ("fp4", "fp8:cutlass", "fp8:triton:triton", "fp8:"):
        with pytest.raises(SystemExit):
            dlrm_v2_network.package_form(bad)


def test_each_mode_makes_its_perf_analyzer_command():
    """HTTP modes go to the HTTP port with -i http; only the async modes pass --async."""
    a = dlrm_v2_perf.parse(BASE + ["--port", "9000", "--pa-threads", "8"])
    for mode, proto, port, is_async in (("sync", "grpc", 9001, False), ("async", "grpc", 9001, True),
                                        ("grpcstream", "grpc", 9001, True), ("http", "http", 9000, True),
                                        ("httpsync", "http", 9000, False)):
        cmd = dlrm_v2_perf.pa_command(a, "dlrm_v2", 270, 512, "pool.json", "out.csv", mode)
        assert cmd[cmd.index("-i") + 1] == proto and cmd[cmd.index("-u") + 1] == f"localhost:{port}", mode
        assert ("--async" in cmd) == is_async and ("--max-threads" in cmd) == is_async, mode
        assert ("--streaming" in cmd) == (mode == "grpcstream"), mode
