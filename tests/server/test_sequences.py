"""The sequence batcher with implicit state through the real tritonserver (issue 29).

Silero VAD keeps its state between calls; with `sequence_batching { state [...] }` the server
keeps it per sequence and the client sends audio (and `sr`) only. 64 concurrent sequences of 20
chunks each over gRPC must each equal ONNX Runtime run chunk by chunk on that sequence alone:
with the `direct` strategy (Silero as shipped, one sequence per run) and with `oldest` and
`direct` batching several sequences per run (Silero behind a batch-first adapter,
examples/sequence_models.py). The START and CORRID controls reach an ONNX and a TorchScript
model as the config names them; a sequence that never ends is reclaimed by the idle timeout
without a leak; decoupled configs are refused at load.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time

import numpy as np
import onnxruntime as ort
import pytest

from conftest import module_server
from tritonserver_harness import REPO_ROOT, ModelRepo, make_client

sys.path.insert(0, os.path.join(REPO_ROOT, "examples"))
import sequence_models  # noqa: E402

SEQUENCES, CHUNKS = 64, 20
ZERO_STATE = 'initial_state {{ name: "silence" data_type: TYPE_FP32 dims: [ {dims} ] zero_data: true }}'


def vad_state(input_name, output_name, dims):
    d = ", ".join(map(str, dims))
    return (f'state [ {{ input_name: "{input_name}" output_name: "{output_name}" data_type: TYPE_FP32 '
            f'dims: [ {d} ] {ZERO_STATE.format(dims=d)} }} ]')


CONFIGS = {
    # Silero as shipped: no batching (rank-0 sr, state [2, batch, 128]); inputs auto-completed
    "vad_direct": ("silero", 'backend: "rust"\ninstance_group [ { count: 2 kind: KIND_CPU } ]\n'
                   'sequence_batching { max_sequence_idle_microseconds: 60000000 direct { }\n  '
                   + vad_state("state", "stateN", [2, 1, 128]) + "\n}\n"),
    "vad_oldest": ("vad_batched", 'backend: "rust"\nmax_batch_size: 64\n'
                   'input [ { name: "input" data_type: TYPE_FP32 dims: [ 512 ] } ]\n'
                   'output [ { name: "output" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                   'instance_group [ { count: 1 kind: KIND_CPU } ]\n'
                   'sequence_batching { max_sequence_idle_microseconds: 60000000\n'
                   '  oldest { max_candidate_sequences: 64 preferred_batch_size: [ 16, 32 ] max_queue_delay_microseconds: 5000 }\n  '
                   + vad_state("state", "state_out", [2, 128]) + "\n}\n"),
    "vad_slots": ("vad_batched", 'backend: "rust"\nmax_batch_size: 16\n'
                  'input [ { name: "input" data_type: TYPE_FP32 dims: [ 512 ] } ]\n'
                  'output [ { name: "output" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                  'instance_group [ { count: 1 kind: KIND_CPU } ]\n'
                  'sequence_batching { max_sequence_idle_microseconds: 60000000\n'
                  '  direct { max_queue_delay_microseconds: 2000 minimum_slot_utilization: 0.5 }\n  '
                  + vad_state("state", "state_out", [2, 128]) + "\n}\n"),
    # short idle timeout: sequences left open are reclaimed
    "vad_idle": ("vad_batched", 'backend: "rust"\nmax_batch_size: 8\n'
                 'input [ { name: "input" data_type: TYPE_FP32 dims: [ 512 ] } ]\n'
                 'output [ { name: "output" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                 'instance_group [ { count: 1 kind: KIND_CPU } ]\n'
                 'sequence_batching { max_sequence_idle_microseconds: 500000\n'
                 '  oldest { max_candidate_sequences: 16 max_queue_delay_microseconds: 1000 }\n  '
                 + vad_state("state", "state_out", [2, 128]) + "\n}\n"),
}

ACCUMULATOR_SEQUENCE = (
    'sequence_batching {{ max_sequence_idle_microseconds: 60000000 {strategy}\n'
    '  control_input [ {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},\n'
    '                  {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid} }} ] }} ]\n'
    '  state [ {{ input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 4 ]\n'
    '            initial_state {{ name: "zero" data_type: TYPE_FP32 dims: [ 4 ] zero_data: true }} }} ]\n}}\n')


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("sequence-models"))
    sequence_models.write_all(out)
    return out


@pytest.fixture(scope="module")
def repo(tmp_path_factory, example_models, models):
    r = ModelRepo(str(tmp_path_factory.mktemp("sequences")))
    silero = sequence_models.silero_bytes()
    for name, (source, config) in CONFIGS.items():
        if source == "silero":
            body = silero
        else:
            with open(os.path.join(models, source + ".onnx"), "rb") as f:
                body = f.read()
        r.add_raw(name, body, f'name: "{name}"\n' + config)
    with open(os.path.join(models, "accumulator.onnx"), "rb") as f:
        r.add_raw("accumulator", f.read(), 'name: "accumulator"\nbackend: "rust"\nmax_batch_size: 8\n'
                  'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
                  'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "ID" data_type: TYPE_UINT64 dims: [ 1 ] } ]\n'
                  + ACCUMULATOR_SEQUENCE.format(strategy="oldest { max_candidate_sequences: 8 max_queue_delay_microseconds: 2000 }", corrid="TYPE_UINT64"))
    # string correlation ids; STATE_OUT listed as an output so a client may ask for it
    with open(os.path.join(models, "accumulator_str.onnx"), "rb") as f:
        r.add_raw("accumulator_str", f.read(), 'name: "accumulator_str"\nbackend: "rust"\nmax_batch_size: 8\n'
                  'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
                  'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 4 ] },\n'
                  '         { name: "ID" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
                  + ACCUMULATOR_SEQUENCE.format(strategy="oldest { max_candidate_sequences: 8 max_queue_delay_microseconds: 2000 }", corrid="TYPE_STRING"))
    os.makedirs(os.path.join(r.root, "accumulator_pt", "1"))
    shutil.copy(os.path.join(models, "accumulator_pt.pt"), os.path.join(r.root, "accumulator_pt", "1", "model.pt"))
    # TorchScript has no signature: the config lists the state's output where the result has it
    r.write_config("accumulator_pt", 'name: "accumulator_pt"\nbackend: "rust"\nmax_batch_size: 8\n'
                   'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
                   'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 4 ] },\n'
                   '         { name: "ID" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
                   + ACCUMULATOR_SEQUENCE.format(strategy="direct { }", corrid="TYPE_INT64"))
    return r


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, repo):
    return module_server(request, tmp_path_factory, repo)


def audio(seq: int) -> np.ndarray:
    """Sequence `seq`'s CHUNKS chunks of 512 samples: noise, then a tone, at a level of its own."""
    rng = np.random.default_rng(1000 + seq)
    t = np.arange(CHUNKS * 512) / 16000.0
    tone = np.sin(2 * np.pi * (150 + 10 * seq) * t) * (0.3 if seq % 2 else 0.0)
    x = rng.standard_normal(CHUNKS * 512) * (0.02 + 0.01 * (seq % 5)) + tone
    return x.astype(np.float32).reshape(CHUNKS, 1, 512)


def silero_alone(seq: int, session) -> np.ndarray:
    """ONNX Runtime, the wheel's Silero, chunk by chunk on this sequence alone."""
    state, out = np.zeros((2, 1, 128), np.float32), []
    for chunk in audio(seq):
        prob, state = session.run(None, {"input": chunk, "state": state, "sr": np.array(16000, np.int64)})
        out.append(prob.reshape(-1)[0])
    return np.array(out, np.float32)


@pytest.fixture(scope="module")
def references():
    session = ort.InferenceSession(sequence_models.silero_bytes(), providers=["CPUExecutionProvider"])
    return {seq: silero_alone(seq, session) for seq in range(SEQUENCES)}


def run_sequences(server, model, with_sr, first_id=1, end=True, count=SEQUENCES, chunks=CHUNKS):
    """`count` concurrent sequences over gRPC, each on its own connection; returns {seq: probs}."""
    import tritonclient.grpc as grpcclient

    got, errors = {}, []

    def one(seq):
        try:
            client = grpcclient.InferenceServerClient(server.grpc_url)
            probs = []
            for k, chunk in enumerate(audio(seq)[:chunks]):
                x = grpcclient.InferInput("input", [1, 512], "FP32")
                x.set_data_from_numpy(chunk)
                inputs = [x]
                if with_sr:
                    sr = grpcclient.InferInput("sr", [1], "INT64")
                    sr.set_data_from_numpy(np.array([16000], np.int64))
                    inputs.append(sr)
                res = client.infer(model, inputs, outputs=[grpcclient.InferRequestedOutput("output")],
                                   sequence_id=first_id + seq, sequence_start=(k == 0),
                                   sequence_end=(end and k == chunks - 1))
                probs.append(res.as_numpy("output").reshape(-1)[0])
            got[seq] = np.array(probs, np.float32)
            client.close()
        except Exception as e:  # noqa: BLE001 - reported by the caller
            errors.append(f"sequence {seq}: {e}")

    threads = [threading.Thread(target=one, args=(s,)) for s in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    return got


def runs_and_rows(server, model, before):
    after = server.stats_after(model, before, SEQUENCES * CHUNKS)
    return (int(after["execution_count"]) - int(before["execution_count"]),
            int(after["inference_count"]) - int(before["inference_count"]))


@pytest.mark.parametrize("model", ["vad_direct", "vad_oldest", "vad_slots"])
def test_silero_sequences_keep_their_state_in_the_server(server, references, model):
    before = server.stats(model)
    t0 = time.monotonic()
    got = run_sequences(server, model, with_sr=(model == "vad_direct"))
    secs = time.monotonic() - t0
    worst = max(float(np.abs(got[s] - references[s]).max()) for s in range(SEQUENCES))
    assert worst <= 1e-5, f"{model}: max abs diff {worst}"
    # the sequences differ (the comparison would be empty if every sequence gave the same answers)
    assert len({round(float(got[s][-1]), 4) for s in range(SEQUENCES)}) > 8
    runs, rows = runs_and_rows(server, model, before)
    if model != "vad_direct":
        assert runs < rows, f"{model}: {rows} requests in {runs} runs: sequences were never batched together"
    print(f"\n[sequences] {model}: {SEQUENCES} sequences x {CHUNKS} chunks over gRPC in {secs:.1f} s, each equal to "
          f"ONNX Runtime alone (max abs diff {worst:.1e}); {rows} requests in {runs} runs "
          f"({rows / max(runs, 1):.1f} sequences per run)")


def test_inputs_are_autocompleted_without_the_state(server):
    cfg = server.http("GET", "/v2/models/vad_direct/config").json()
    assert sorted(t["name"] for t in cfg["input"]) == ["input", "sr"], cfg["input"]


def accumulate_at_once(server, model, chunks: dict, corrid_of, outputs=("OUTPUT", "ID")):
    """One gRPC client per sequence, all at once; each sends its chunks as one sequence (id
    `corrid_of(seq)`) and checks that ID echoes it. Returns ({seq: [OUTPUT rows]}, [errors])."""
    import tritonclient.grpc as grpcclient

    got, errors = {}, []

    def one(seq):
        try:
            client = grpcclient.InferenceServerClient(server.grpc_url)
            outs, corr = [], corrid_of(seq)
            for k, c in enumerate(chunks[seq]):
                x = grpcclient.InferInput("INPUT", [1, 4], "FP32")
                x.set_data_from_numpy(c.reshape(1, 4))
                res = client.infer(model, [x], outputs=[grpcclient.InferRequestedOutput(o) for o in outputs],
                                   sequence_id=corr, sequence_start=(k == 0), sequence_end=(k == len(chunks[seq]) - 1))
                echoed = res.as_numpy("ID").reshape(-1)[0]
                echoed = echoed.decode() if isinstance(echoed, bytes) else echoed
                assert echoed == corr, (echoed, corr)
                outs.append(res.as_numpy("OUTPUT").reshape(4))
            got[seq] = outs
        except Exception as e:  # noqa: BLE001
            errors.append(f"sequence {seq!r}: {e}")

    threads = [threading.Thread(target=one, args=(s,)) for s in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got, errors


@pytest.mark.parametrize("model", ["accumulator", "accumulator_pt"])
def test_controls_and_state_reach_onnx_and_torchscript_models(server, model):
    rng = np.random.default_rng(7)
    chunks = {seq: [rng.integers(-5, 6, 4).astype(np.float32) for _ in range(6)] for seq in range(8)}
    # above 2^32: the CORRID control carries all 64 bits
    got, errors = accumulate_at_once(server, model, chunks, lambda seq: 7_000_000_000 + seq)
    assert not errors, errors
    for seq, outs in got.items():
        np.testing.assert_array_equal(np.array(outs), np.array(sequence_models.accumulate_reference(chunks[seq])))
    print(f"\n[sequences] {model}: 8 sequences of 6 requests: running sums kept by the server, CORRID above 2^32 delivered")


def test_string_correlation_ids_keep_each_sequence_exact(server):
    """Triton fills a TYPE_STRING CORRID control from a buffer sized for its longest id: ids of
    different lengths, several sequences at once, each equal to its own running sum."""
    rng = np.random.default_rng(11)
    ids = ["a", "seq-2", "a-much-longer-correlation-id-0003", "x4", "sequence five", "6"]
    chunks = {s: [rng.integers(-5, 6, 4).astype(np.float32) for _ in range(5)] for s in ids}
    got, errors = accumulate_at_once(server, "accumulator_str", chunks, lambda seq: seq)
    assert not errors, errors
    for seq, outs in got.items():
        np.testing.assert_array_equal(np.array(outs), np.array(sequence_models.accumulate_reference(chunks[seq])))
    print(f"\n[sequences] accumulator_str: {len(ids)} sequences with string ids of 1 to {max(map(len, ids))} bytes, "
          "each its own running sum, each id echoed")


def test_a_request_whose_output_cannot_be_delivered_leaves_the_state(server):
    """The client asks for the state output and for ID in a system shared-memory region too small
    for it: Triton cannot take ID, the request fails, and the sequence's state stays as the
    previous request left it (a retry counts once)."""
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    client = httpclient.InferenceServerClient(server.http_url)
    key = f"/seq-small-{os.getpid()}"
    region = shm.create_shared_memory_region("seq_small", key, 4)  # ID needs 4 + len(id) bytes
    client.register_system_shared_memory("seq_small", key, 4)
    try:
        def send(values, small=False):
            x = httpclient.InferInput("INPUT", [1, 4], "FP32")
            x.set_data_from_numpy(np.full((1, 4), values, np.float32))
            outs = [httpclient.InferRequestedOutput("OUTPUT", binary_data=True),
                    httpclient.InferRequestedOutput("STATE_OUT", binary_data=True)]
            ident = httpclient.InferRequestedOutput("ID", binary_data=True)
            if small:
                ident.set_shared_memory("seq_small", 4)
            outs.append(ident)
            return client.infer("accumulator_str", [x], outputs=outs, sequence_id="retry",
                                sequence_start=(values == 1.0), sequence_end=(values == 4.0))

        assert send(1.0).as_numpy("OUTPUT").tolist() == [[1.0] * 4]
        with pytest.raises(Exception) as e:
            send(2.0, small=True)
        print(f"\n[sequences] the undeliverable request: {e.value}")
        again = send(3.0).as_numpy("OUTPUT").tolist()
        assert again == [[4.0] * 4], f"the failed request moved the state: 1 + 3 = 4 expected, got {again}"
        assert send(4.0).as_numpy("OUTPUT").tolist() == [[8.0] * 4]
    finally:
        client.unregister_system_shared_memory("seq_small")
        shm.destroy_shared_memory_region(region)
    print("[sequences] after it the sequence went on from the last delivered sum (1 + 3 = 4, then 8)")


def test_an_abandoned_sequence_is_reclaimed_without_a_leak(server, references):
    model = "vad_idle"
    # warm up: the first sequences grow the server's pools
    run_sequences(server, model, with_sr=False, first_id=10_000, count=16, chunks=3)
    rss = []
    for cycle in range(6):
        # 16 sequences that never send END, then longer than the idle timeout (0.5 s)
        run_sequences(server, model, with_sr=False, first_id=20_000 + cycle * 100, end=False, count=16, chunks=3)
        time.sleep(1.5)
        rss.append(server.rss_bytes())
    # a sequence started after the reclaim gets a fresh state, and the slots are free again
    got = run_sequences(server, model, with_sr=False, first_id=90_000, count=16)
    worst = max(float(np.abs(got[s] - references[s]).max()) for s in range(16))
    assert worst <= 1e-5
    log = server.log_text()
    growth = rss[-1] - rss[1]
    print(f"\n[sequences] {model}: 6 cycles of 16 abandoned sequences, each reclaimed after 0.5 s idle; "
          f"RSS MiB by cycle {[round(r / 2**20, 1) for r in rss]}, growth after cycle 2: {growth / 2**20:.1f} MiB; "
          f"16 new sequences after that equal ONNX Runtime (max abs diff {worst:.1e})")
    assert growth < 8 * 2**20, f"RSS grew {growth / 2**20:.1f} MiB over 4 cycles of abandoned sequences"
    assert "panicked" not in log


def test_decoupled_batch_input_and_stateless_configs_are_refused_at_load(make_repo, start_server, models):
    with open(os.path.join(models, "accumulator.onnx"), "rb") as f:
        body = f.read()
    repo = make_repo("refused")
    good = ('name: "accumulator"\nbackend: "rust"\nmax_batch_size: 8\n'
            'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
            + ACCUMULATOR_SEQUENCE.format(strategy="direct { }", corrid="TYPE_UINT64"))
    repo.add_raw("accumulator", body, good)
    server = start_server(repo.root, "--model-control-mode=explicit", "--load-model=accumulator")
    refused = {
        "decoupled": ('model_transaction_policy { decoupled: true }\n', "decoupled"),
        "batch_input": ('', "batch_input"),
        "bad_state": ('', "'NEXT'"),
    }
    configs = {
        "decoupled": good.replace('name: "accumulator"', 'name: "decoupled"') + refused["decoupled"][0],
        # ragged batching's batch tensors (allow_ragged_batch itself is served: test_pooled.py)
        "batch_input": good.replace('name: "accumulator"', 'name: "batch_input"').replace(
            "dims: [ 4 ] } ]", 'dims: [ 4 ] allow_ragged_batch: true } ]\n'
            'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_FP32 source_input: "INPUT" } ]', 1),
        # a state whose output_name is not an output of the model
        "bad_state": good.replace('name: "accumulator"', 'name: "bad_state"').replace('output_name: "STATE_OUT"', 'output_name: "NEXT"'),
    }
    for name, config in configs.items():
        repo.add_raw(name, body, config)
        r = server.load(name)
        assert r.status_code == 400, (name, r.text)
        assert refused[name][1] in r.json()["error"], (name, r.text)
        print(f"\n[sequences] {name} refused at load: {r.json()['error'][:220]}")
    # libtorch has no UINT64: the TorchScript engine says so at load, naming the tensor
    os.makedirs(os.path.join(repo.root, "torch_uint64", "1"))
    shutil.copy(os.path.join(models, "accumulator_pt.pt"), os.path.join(repo.root, "torch_uint64", "1", "model.pt"))
    repo.write_config("torch_uint64", good.replace('name: "accumulator"', 'name: "torch_uint64"')
                      .replace("input [", 'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\ninput [', 1))
    r = server.load("torch_uint64")
    assert r.status_code == 400 and "tensor 'CORRID'" in r.json()["error"] and "UINT64" in r.json()["error"], r.text
    print(f"\n[sequences] torch_uint64 refused at load: {r.json()['error'][:220]}")
    assert server.model_ready("accumulator"), "the server goes on serving"
