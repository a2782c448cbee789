"""examples/export_models.py's FP16 models (what bench/gpu/dense_perf.py serves on the GPU):
the graph declares FP16 where the FP32 one declares FLOAT, keeps integer tensors, and ONNX
Runtime on the CPU gives the FP32 model's answer within FP16 rounding."""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import export_models as em  # noqa: E402


def test_fp16_graph_types(tmp_path):
    path = em.build_model("bert_small_fp16", str(tmp_path / "m.onnx"))
    m = onnx.load(path)
    onnx.checker.check_model(m)
    assert [i.type.tensor_type.elem_type for i in m.graph.input] == [TensorProto.INT32] * 3
    assert [o.type.tensor_type.elem_type for o in m.graph.output] == [TensorProto.FLOAT16] * 2
    kinds = {init.data_type for init in m.graph.initializer}
    assert TensorProto.FLOAT not in kinds and TensorProto.FLOAT16 in kinds and TensorProto.INT64 in kinds
    casts = [a.i for n in m.graph.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"]
    assert casts == [TensorProto.FLOAT16]
    # the weights are the FP32 model's, rounded
    fp32 = onnx.load(em.build_model("bert_small", str(tmp_path / "f.onnx")))
    w32 = {i.name: numpy_helper.to_array(i) for i in fp32.graph.initializer}
    for init in m.graph.initializer:
        a = numpy_helper.to_array(init)
        if a.dtype == np.float16:
            assert np.array_equal(a, w32[init.name].astype(np.float16)), init.name


def test_fp16_answers_match_fp32_on_cpu(tmp_path):
    for name in ("bert_small", "identity"):
        f16 = em.build_model(name + "_fp16", str(tmp_path / f"{name}16.onnx"))
        f32 = em.build_model(name, str(tmp_path / f"{name}32.onnx"))
        feeds = em.example_inputs(name, 2)
        want = em.run_onnxruntime(f32, feeds)
        got = em.run_onnxruntime(f16, {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds.items()})
        for k, w in want.items():
            assert got[k].dtype == np.float16
            diff = float(np.abs(got[k].astype(np.float32) - w).max())
            assert diff < 1e-2, (name, k, diff)
            assert np.isfinite(got[k]).all()
