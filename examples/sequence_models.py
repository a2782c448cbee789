"""Stateful models for the sequence batcher with implicit state (docs/sequences.md).

- `vad_batched`: Silero VAD (the silero-vad wheel's `silero_vad.onnx`) made batchable across
  sequences. Silero keeps its state as [2, batch, 128] and takes one rank-0 sample rate per
  call; Triton's batcher stacks every input on a leading batch dimension. The adapter
  transposes the state to [batch, 2, 128] on the way in and out and fixes the sample rate at
  16 kHz (one `sr` per call cannot differ between the sequences of a batch). The Silero graph
  inside is untouched.
- `accumulator` (ONNX) and `accumulator_pt` (TorchScript): a running sum per sequence that
  also takes the sequence batcher's START and CORRID controls: OUTPUT = INPUT + STATE_IN *
  (1 - START), STATE_OUT = OUTPUT, ID = CORRID. A small model whose every answer depends on
  the controls and the state reaching it, for ONNX Runtime and libtorch alike.

    python examples/sequence_models.py --out DIR   # writes DIR/<name>.onnx / .pt
"""

from __future__ import annotations

import argparse
import glob
import os
import zipfile

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SILERO_WHEEL = ("silero_vad-6.2.3", "silero_vad/data/silero_vad.onnx")
SAMPLE_RATE = 16000
CHUNK = 512  # samples per call at 16 kHz, as Silero expects


def silero_bytes() -> bytes:
    """The silero-vad wheel's model (scripts/setup.sh downloads the wheel into .deps/model-wheels)."""
    wheel, member = SILERO_WHEEL
    found = glob.glob(os.path.join(REPO_ROOT, ".deps", "model-wheels", wheel + "-*.whl"))
    if not found:
        raise FileNotFoundError(f"{wheel} is not in .deps/model-wheels: run scripts/setup.sh")
    return zipfile.ZipFile(found[0]).read(member)


def vad_batched():
    """Silero VAD with batch-first state [B, 2, 128] and the sample rate fixed at 16 kHz."""
    import onnx
    from onnx import TensorProto, compose, helper, numpy_helper

    vad = onnx.load_from_string(silero_bytes())
    opsets = list(vad.opset_import)
    pre = helper.make_graph(
        [helper.make_node("Identity", ["input"], ["audio"]),
         helper.make_node("Transpose", ["state"], ["state_t"], perm=[1, 0, 2]),
         helper.make_node("Constant", [], ["sr16k"], value=numpy_helper.from_array(np.array(SAMPLE_RATE, np.int64)))],
        "vad_in",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", CHUNK]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, ["batch", 2, 128])],
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch", CHUNK]),
         helper.make_tensor_value_info("state_t", TensorProto.FLOAT, [2, "batch", 128]),
         helper.make_tensor_value_info("sr16k", TensorProto.INT64, [])])
    pre_model = helper.make_model(pre, opset_imports=opsets, ir_version=vad.ir_version)
    merged = compose.merge_models(pre_model, vad, io_map=[("audio", "input"), ("state_t", "state"), ("sr16k", "sr")],
                                  prefix2="silero/")
    post = helper.make_graph(
        [helper.make_node("Identity", ["speech"], ["output"]),
         helper.make_node("Transpose", ["state_next"], ["state_out"], perm=[1, 0, 2])],
        "vad_out",
        [helper.make_tensor_value_info("speech", TensorProto.FLOAT, ["batch", 1]),
         helper.make_tensor_value_info("state_next", TensorProto.FLOAT, [2, "batch", 128])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 1]),
         helper.make_tensor_value_info("state_out", TensorProto.FLOAT, ["batch", 2, 128])])
    post_model = helper.make_model(post, opset_imports=opsets, ir_version=vad.ir_version)
    model = compose.merge_models(merged, post_model, io_map=[("silero/output", "speech"), ("silero/stateN", "state_next")])
    onnx.checker.check_model(model)
    return model


def accumulator_onnx(corrid=None):
    """A running sum per sequence; ID echoes the CORRID control (UINT64, or STRING with
    `corrid="string"`: Triton's string correlation ids)."""
    import onnx
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    corrid_type = TensorProto.STRING if corrid == "string" else TensorProto.UINT64
    nodes = [
        helper.make_node("Cast", ["START"], ["start_f"], to=f),
        helper.make_node("Sub", ["one", "start_f"], ["keep"]),
        helper.make_node("Mul", ["STATE_IN", "keep"], ["carried"]),
        helper.make_node("Add", ["INPUT", "carried"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
        helper.make_node("Identity", ["CORRID"], ["ID"]),
    ]
    graph = helper.make_graph(
        nodes, "accumulator",
        [helper.make_tensor_value_info("INPUT", f, ["batch", 4]),
         helper.make_tensor_value_info("START", TensorProto.INT32, ["batch", 1]),
         helper.make_tensor_value_info("CORRID", corrid_type, ["batch", 1]),
         helper.make_tensor_value_info("STATE_IN", f, ["batch", 4])],
        [helper.make_tensor_value_info("OUTPUT", f, ["batch", 4]),
         helper.make_tensor_value_info("STATE_OUT", f, ["batch", 4]),
         helper.make_tensor_value_info("ID", corrid_type, ["batch", 1])],
        initializer=[helper.make_tensor("one", f, [], [1.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def accumulator_torchscript():
    import torch

    class Accumulator(torch.nn.Module):
        def forward(self, x: torch.Tensor, start: torch.Tensor, corrid: torch.Tensor, state: torch.Tensor):
            out = x + state * (1 - start.to(x.dtype))
            return out, out.clone(), corrid

    return torch.jit.script(Accumulator())


def accumulate_reference(chunks: list) -> list:
    """What `accumulator` answers for one sequence's INPUT rows, in order."""
    total, out = np.zeros(4, np.float32), []
    for c in chunks:
        total = (total + c).astype(np.float32)
        out.append(total.copy())
    return out


def write_all(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    import onnx

    onnx.save(vad_batched(), os.path.join(out_dir, "vad_batched.onnx"))
    onnx.save(accumulator_onnx(), os.path.join(out_dir, "accumulator.onnx"))
    onnx.save(accumulator_onnx("string"), os.path.join(out_dir, "accumulator_str.onnx"))
    accumulator_torchscript().save(os.path.join(out_dir, "accumulator_pt.pt"))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    write_all(ap.parse_args().out)
    print(f"wrote vad_batched.onnx, accumulator.onnx, accumulator_pt.pt to {ap.parse_args().out}")
