"""Bad requests and bad models against ONE running server (explicit model control).

Each case asserts the error status and that the message names the input / file / problem, then
sends a good request and checks it is still answered correctly. The server must survive all of it
and its log must hold no Rust panic. Every error message is printed (run with -s to see them).
"""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from conftest import module_server
from tritonserver_harness import ModelRepo, error_status, infer, make_client, two_input_dynamic_model

PROTOCOLS = ["http", "grpc"]
BAD_STATUS = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}

DYN_CFG = """name: "dyn_add"
backend: "rust"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ -1 ] }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { }
parameters { key: "reject_nonfinite" value { string_value: "true" } }
"""

NO_ORT_LIB = "/nonexistent/dir/libonnxruntime.so.1.99"

BOOL_CFG = """name: "bool_not"
backend: "rust"
max_batch_size: 8
input [ { name: "FLAG" data_type: TYPE_BOOL dims: [ 4 ] } ]
output [ { name: "NOT" data_type: TYPE_BOOL dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 300000 }
"""


def bool_not_model():
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("Not", ["FLAG"], ["NOT"])], "bool_not",
                          [helper.make_tensor_value_info("FLAG", TensorProto.BOOL, ["batch", 4])],
                          [helper.make_tensor_value_info("NOT", TensorProto.BOOL, ["batch", 4])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

# Models that must fail to load: name -> (builder or raw bytes, config, substrings the message must hold)
MISMATCH_CFG = """name: "{name}"
backend: "rust"
max_batch_size: 8
input [ {{ name: "{iname}" data_type: {itype} dims: [ {idims} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory, example_models):
    r = ModelRepo(str(tmp_path_factory.mktemp("bad-input-repo")))
    r.add_example("identity")
    r.add_onnx("dyn_add", two_input_dynamic_model(), DYN_CFG)
    r.add_onnx("bool_not", bool_not_model(), BOOL_CFG)
    r.add_raw("corrupt", b"\x08\x07this is not an ONNX protobuf\xff\xfe" * 20,
              'name: "corrupt"\nbackend: "rust"\nmax_batch_size: 4\n')
    r.add_built("no_ort", "identity",
                'name: "no_ort"\nbackend: "rust"\nmax_batch_size: 4\n'
                f'parameters {{ key: "onnxruntime_library" value {{ string_value: "{NO_ORT_LIB}" }} }}\n')
    r.add_built("mismatch_dims", "identity",
                MISMATCH_CFG.format(name="mismatch_dims", iname="INPUT0", itype="TYPE_FP32", idims="32"))
    r.add_built("mismatch_name", "identity",
                MISMATCH_CFG.format(name="mismatch_name", iname="IMAGE", itype="TYPE_FP32", idims="16"))
    r.add_built("mismatch_type", "identity",
                MISMATCH_CFG.format(name="mismatch_type", iname="INPUT0", itype="TYPE_INT32", idims="16"))
    return r


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, repo):
    return module_server(request, tmp_path_factory, repo, "--model-control-mode=explicit",
                         "--load-model=identity", "--load-model=dyn_add", "--load-model=bool_not")


_good_seed = [0]


def assert_still_serving(server, protocol="http"):
    """A good identity request is answered with its own input; the dyn_add model still adds."""
    _good_seed[0] += 1
    rng = np.random.default_rng(_good_seed[0])
    x = rng.standard_normal((2, 16), dtype=np.float32)
    client = make_client(server, protocol)
    out = infer(client, protocol, "identity", {"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
    np.testing.assert_array_equal(out, x)
    a, b = rng.standard_normal((1, 5), dtype=np.float32), rng.standard_normal((1, 5), dtype=np.float32)
    out = infer(client, protocol, "dyn_add", {"INPUT0": a, "INPUT1": b}, ["OUTPUT0"])["OUTPUT0"]
    np.testing.assert_allclose(out, a + b, rtol=0, atol=1e-6)
    assert server.alive(), "tritonserver died"


def expect_infer_error(server, protocol, model, feeds, outputs, must_contain, dtypes=None, case=""):
    client = make_client(server, protocol)
    with pytest.raises(InferenceServerException) as ei:
        infer(client, protocol, model, feeds, outputs, dtypes=dtypes)
    e = ei.value
    status, msg = error_status(e), e.message()
    print(f"\n[{case} / {protocol}] status={status} message={msg!r}")
    assert status == BAD_STATUS[protocol], f"{case}: expected a client error status, got {status}: {msg}"
    for s in must_contain:
        assert s.lower() in msg.lower(), f"{case}: message should mention {s!r}: {msg}"
    assert_still_serving(server, protocol)
    return msg


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


# --------------------------------------------------------------------------- request errors


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_wrong_dtype(server, protocol):
    expect_infer_error(server, protocol, "identity", {"INPUT0": f32(1, 16).astype(np.float64)}, ["OUTPUT0"],
                       ["INPUT0", "FP64", "FP32"], case="wrong dtype")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_wrong_shape(server, protocol):
    expect_infer_error(server, protocol, "identity", {"INPUT0": f32(1, 8)}, ["OUTPUT0"],
                       ["INPUT0", "shape"], case="wrong shape")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_batch_above_max(server, protocol):
    expect_infer_error(server, protocol, "identity", {"INPUT0": f32(257, 16)}, ["OUTPUT0"],
                       ["batch", "256"], case="batch above max")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_missing_input(server, protocol):
    expect_infer_error(server, protocol, "dyn_add", {"INPUT0": f32(1, 4)}, ["OUTPUT0"],
                       ["INPUT1", "missing"], case="missing input")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_extra_input(server, protocol):
    expect_infer_error(server, protocol, "dyn_add",
                       {"INPUT0": f32(1, 4), "INPUT1": f32(1, 4), "INPUT2": f32(1, 4)}, ["OUTPUT0"],
                       ["INPUT2"], case="extra input")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_empty_tensor_zero_inner_dim(server, protocol):
    # dims [-1] allow a zero-length row; the backend must refuse it per request.
    expect_infer_error(server, protocol, "dyn_add",
                       {"INPUT0": np.zeros((1, 0), np.float32), "INPUT1": np.zeros((1, 0), np.float32)},
                       ["OUTPUT0"], ["INPUT0", "empty"], case="empty tensor [1,0]")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_empty_tensor_zero_batch(server, protocol):
    # Triton core answers a zero batch itself (byte size mismatch); it must still be a 4xx naming an input.
    expect_infer_error(server, protocol, "identity", {"INPUT0": np.zeros((0, 16), np.float32)}, ["OUTPUT0"],
                       ["INPUT0"], case="empty tensor [0,16]")


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_nonfinite_rejected(server, protocol, bad):
    b = f32(2, 6, seed=3)
    b[1, 2] = bad  # flat element 8
    expect_infer_error(server, protocol, "dyn_add", {"INPUT0": f32(2, 6), "INPUT1": b}, ["OUTPUT0"],
                       ["INPUT1", "NaN or infinite", "element 8"], case=f"non-finite {bad}")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_inputs_with_inconsistent_shapes(server, protocol):
    """INPUT0 [1,16] with INPUT1 [1,8] to a model that adds them: the request is the client's fault.

    Expected: a 4xx naming the inputs. (Observed: 500 'ONNX Runtime run failed: ... Attempting to
    broadcast an axis by a dimension other than 1. 8 by 16' -- reported as a backend bug.)"""
    expect_infer_error(server, protocol, "dyn_add", {"INPUT0": f32(1, 16), "INPUT1": f32(1, 8)}, ["OUTPUT0"],
                       ["INPUT0", "INPUT1"], case="inconsistent input shapes")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bool_byte_other_than_0_or_1_fails_only_its_request(server, protocol):
    """A BOOL input whose byte is 2 (a client's raw bytes) is refused with an error naming the
    input; a good request batched with it (the batcher waits 300 ms) is still answered."""
    from concurrent.futures import ThreadPoolExecutor
    good = np.array([[True, False, True, False]])
    bad = np.array([[1, 2, 0, 1]], dtype=np.uint8).view(np.bool_)

    def send(x):
        try:
            return infer(make_client(server, protocol), protocol, "bool_not", {"FLAG": x}, ["NOT"])["NOT"]
        except InferenceServerException as e:
            return e
    before = server.http("GET", "/v2/models/bool_not/stats").json()["model_stats"][0]["execution_count"]
    with ThreadPoolExecutor(2) as pool:
        ok, refused = list(pool.map(send, [good, bad]))
    after = server.http("GET", "/v2/models/bool_not/stats").json()["model_stats"][0]["execution_count"]
    print(f"\n[bool byte 2 / {protocol}] {refused}; executions {after - before}")
    np.testing.assert_array_equal(ok, ~good)
    assert isinstance(refused, InferenceServerException), refused
    assert error_status(refused) == BAD_STATUS[protocol]
    assert "FLAG" in refused.message() and "other than 0 or 1" in refused.message()
    assert after - before == 1, "the two requests were one execution"
    assert_still_serving(server, protocol)


# --------------------------------------------------------------------------- model load errors


def expect_load_error(server, model, must_contain, case):
    r = server.load(model)
    msg = r.text
    print(f"\n[{case}] load {model}: HTTP {r.status_code} {msg}")
    assert r.status_code == 400, f"{case}: load should fail with 400, got {r.status_code}: {msg}"
    for s in must_contain:
        assert s in msg, f"{case}: message should mention {s!r}: {msg}"
    assert not server.model_ready(model)
    assert server.alive(), "tritonserver died on a failed load"
    assert_still_serving(server)
    return msg


def test_corrupt_model_file(server, repo):
    expect_load_error(server, "corrupt", [repo.model_file("corrupt"), "ONNX Runtime cannot load model file"],
                      case="corrupt model.onnx")


def test_missing_onnxruntime_library(server):
    expect_load_error(server, "no_ort", [NO_ORT_LIB, "ONNX Runtime library not found", "onnxruntime_library"],
                      case="missing ONNX Runtime library")


@pytest.mark.parametrize("model,needles", [
    ("mismatch_dims", ["INPUT0", "[32]", "[-1, 16]"]),
    ("mismatch_name", ["IMAGE", "INPUT0"]),
    ("mismatch_type", ["INPUT0", "TYPE_INT32", "TYPE_FP32"]),
])
def test_config_model_mismatch(server, model, needles):
    expect_load_error(server, model, needles, case=f"config/model mismatch ({model})")


def test_failed_load_twice_then_good_model_reloads(server):
    """Retrying a failed load fails the same way; reloading a good model still works afterwards."""
    first = server.load("corrupt").text
    second = server.load("corrupt").text
    assert "ONNX Runtime cannot load model file" in second, second
    assert first == second
    r = server.load("identity")
    assert r.status_code == 200, r.text
    assert_still_serving(server)


# --------------------------------------------------------------------------- the end


def test_zz_server_survived(server):
    """Runs last in this module (pytest keeps file order): process alive, no panic in the log."""
    assert_still_serving(server, "http")
    assert_still_serving(server, "grpc")
    assert server.alive()
    log = server.log_text()
    assert "panicked" not in log, "a Rust panic is in the server log:\n" + "\n".join(
        line for line in log.splitlines() if "panick" in line)
    print(f"\n[server] alive after the battery, log {server.log_path} ({len(log)} bytes), no 'panicked'")
