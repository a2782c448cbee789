"""Model parameters: a misspelt one loads and serves as before, and the server log names it with
the closest known parameter; a parameter Triton itself reads is not warned about."""

from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import module_server
from tritonserver_harness import ModelRepo, infer, make_client

MISSPELT = """name: "misspelt"
backend: "rust"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_cont" value { string_value: "1" } }
parameters { key: "reject_nonfinite" value { string_value: "true" } }
parameters { key: "EXECUTION_ENV_PATH" value { string_value: "/nowhere/env.tar.gz" } }
"""


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, example_models):
    repo = ModelRepo(str(tmp_path_factory.mktemp("settings-repo")))
    repo.add_example("identity", "misspelt", MISSPELT)
    return module_server(request, tmp_path_factory, repo)


def test_a_misspelt_parameter_is_named_and_the_model_serves(server):
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    got = infer(make_client(server, "http"), "http", "misspelt", {"INPUT0": x}, ["OUTPUT0"])
    np.testing.assert_array_equal(got["OUTPUT0"], x)
    log = server.log_text()
    assert ("model 'misspelt': parameter 'intra_op_thread_cont' is not known; "
            "did you mean 'intra_op_thread_count'?") in log, log[-3000:]
    assert "'reject_nonfinite' is not known" not in log
    assert "'EXECUTION_ENV_PATH' is not known" not in log, "a parameter Triton reads is not warned about"


def test_an_hps_device_list_that_the_placement_cannot_meet_fails_the_load(request, tmp_path_factory, example_models):
    """HPS's deployed_device_list is checked against Triton's placement: on a KIND_CPU model it
    names GPUs no instance uses, and a malformed one names its bad entry; sharded rows on a
    KIND_CPU model have no GPUs to spread over. Each fails the load with the parameter named,
    and the server goes on."""
    from make_tables import write_table
    from embedding_helpers import embedding_config, hps_io
    repo = ModelRepo(str(tmp_path_factory.mktemp("devices-repo")))
    cases = (("devices_cpu", {"deployed_device_list": "0,1"}), ("devices_bad", {"deployed_device_list": "0,x"}),
             ("sharded_cpu", {"gpucache_placement": "sharded", "gpucacheper": "1.0"}), ("devices_none", {}))
    for name, extra in cases:
        write_table(os.path.join(repo.root, name, "1", "tables"), "u", 100, 4, 1)
        repo.write_config(name, embedding_config(name, hps_io(), embedding_table_names="u",
                                                 embedding_vecsize_per_table=4, **extra))
    server = module_server(request, tmp_path_factory, repo, "--model-control-mode=explicit")
    for name, param, words in (("devices_cpu", "deployed_device_list", "use no GPU"),
                               ("devices_bad", "deployed_device_list", "'x' is not a GPU id"),
                               ("sharded_cpu", "gpucache_placement", "KIND_CPU")):
        r = server.load(name)
        assert r.status_code == 400, r.text
        assert param in r.json()["error"] and words in r.json()["error"], r.text
        print(f"\n[settings] {name}: {r.json()['error'][:240]}")
    assert server.load("devices_none").status_code == 200, "the server goes on loading other models"
