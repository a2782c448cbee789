#!/usr/bin/env python3
"""Build the ONNX models served by libtriton_rust from numpy, with onnx.helper.

No framework is needed (torch is not available on the build machine): each architecture is
written out node by node, with random weights drawn from ``np.random.default_rng(seed)``, so the
same seed always yields the same file contents. Opset 17.

    python examples/export_models.py --repo models [--models resnet50,bert_small] [--force]

Models (name -> models/<name>/1/model.onnx):
  resnet50    ResNet50 v1.5 (stride on the 3x3 conv), BatchNormalization kept (eval mode),
              INPUT__0 FP32 [batch,3,224,224] -> OUTPUT__0 FP32 [batch,1000] logits
  bert_large  BERT-large QA: 24 layers, hidden 1024, 16 heads, FFN 4096, seq 384
              input__0/1/2 INT32 [batch,384] (ids, segment ids, mask)
              -> output__0/1 FP32 [batch,384] (start/end logits)
  bert_small  same graph with 2 layers, hidden 256, 4 heads, FFN 1024 (fast tests)
  identity    INPUT0 FP32 [batch,16] -> OUTPUT0 FP32 [batch,16]
  simple      INPUT0, INPUT1 FP32 [batch,16] -> OUTPUT0 = INPUT0+INPUT1, OUTPUT1 = INPUT0*INPUT1
              (test helper, not exported by default)

Tests import this module: ``build_model(name, path)`` writes one model file,
``example_inputs(name, batch)`` makes matching inputs, ``run_onnxruntime(path, feeds)`` runs it.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_files import finish, placed, tmp_path  # noqa: E402

OPSET = 17
IR_VERSION = 8  # ONNX Runtime releases back to 1.13 read IR 8 + opset 17
PROTOBUF_LIMIT = 2 * 1024**3 - 64 * 1024**2  # stay clear of the 2 GiB message limit


# --------------------------------------------------------------------------- graph building


class GraphBuilder:
    """Accumulates nodes and initializers; hands out unique tensor names."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: List[onnx.NodeProto] = []
        self.initializers: List[onnx.TensorProto] = []
        self.inputs: List[onnx.ValueInfoProto] = []
        self.outputs: List[onnx.ValueInfoProto] = []
        self._counter: Dict[str, int] = {}

    # names -------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        n = self._counter.get(base, 0)
        self._counter[base] = n + 1
        return base if n == 0 else f"{base}_{n}"

    # graph I/O -----------------------------------------------------------------
    def add_input(self, name: str, elem_type: int, shape: Sequence) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def add_output(self, name: str, elem_type: int, shape: Sequence) -> str:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    # constants -----------------------------------------------------------------
    def const(self, array: np.ndarray, name: str) -> str:
        name = self.fresh(name)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def normal(self, shape: Sequence[int], std: float, name: str, mean: float = 0.0) -> str:
        a = self.rng.standard_normal(tuple(shape), dtype=np.float32)
        a *= np.float32(std)
        if mean:
            a += np.float32(mean)
        return self.const(a, name)

    def uniform(self, shape: Sequence[int], low: float, high: float, name: str) -> str:
        a = self.rng.uniform(low, high, size=tuple(shape)).astype(np.float32)
        return self.const(a, name)

    def i64(self, values, name: str) -> str:
        return self.const(np.asarray(values, dtype=np.int64), name)

    def f32(self, values, name: str) -> str:
        return self.const(np.asarray(values, dtype=np.float32), name)

    # nodes ---------------------------------------------------------------------
    def op(self, op_type: str, inputs: Sequence[str], name: Optional[str] = None,
           outputs: Optional[Sequence[str]] = None, n_out: int = 1, **attrs):
        base = self.fresh(name or op_type.lower())
        if outputs is None:
            outputs = [base] if n_out == 1 else [f"{base}:{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs), name=base, **attrs))
        return outputs[0] if len(outputs) == 1 else list(outputs)

    # layers --------------------------------------------------------------------
    def linear(self, x: str, d_in: int, d_out: int, name: str, std: Optional[float] = None,
               out: Optional[str] = None) -> str:
        """x[..., d_in] @ W[d_in, d_out] + b (how torch.onnx exports nn.Linear on 3-D input)."""
        if std is None:
            std = 1.0 / math.sqrt(d_in)
        w = self.normal((d_in, d_out), std, f"{name}.weight")
        b = self.normal((d_out,), 0.02, f"{name}.bias")
        y = self.op("MatMul", [x, w], name=f"{name}.matmul")
        return self.op("Add", [y, b], name=f"{name}.add", outputs=[out] if out else None)

    def layer_norm(self, x: str, dim: int, name: str, eps: float) -> str:
        gamma = self.normal((dim,), 0.02, f"{name}.weight", mean=1.0)
        beta = self.normal((dim,), 0.02, f"{name}.bias")
        return self.op("LayerNormalization", [x, gamma, beta], name=name, axis=-1, epsilon=eps)

    def gelu_erf(self, x: str, name: str) -> str:
        """0.5 * x * (1 + erf(x / sqrt(2))), the exact GELU of BERT."""
        inv_sqrt2 = self.f32(1.0 / math.sqrt(2.0), "const.inv_sqrt2")
        one = self.f32(1.0, "const.one")
        half = self.f32(0.5, "const.half")
        t = self.op("Mul", [x, inv_sqrt2], name=f"{name}.scale")
        t = self.op("Erf", [t], name=f"{name}.erf")
        t = self.op("Add", [t, one], name=f"{name}.add1")
        t = self.op("Mul", [x, t], name=f"{name}.mulx")
        return self.op("Mul", [t, half], name=f"{name}.half")

    def conv_bn(self, x: str, c_in: int, c_out: int, k: int, stride: int, name: str,
                relu: bool, gamma_scale: float = 1.0) -> str:
        """Conv (no bias, He-normal) + BatchNormalization (eval, random running stats) [+ ReLU]."""
        fan_in = c_in * k * k
        w = self.normal((c_out, c_in, k, k), math.sqrt(2.0 / fan_in), f"{name}.conv.weight")
        pad = k // 2
        y = self.op("Conv", [x, w], name=f"{name}.conv", kernel_shape=[k, k],
                    strides=[stride, stride], pads=[pad, pad, pad, pad])
        rng = self.rng
        scale = (gamma_scale * (1.0 + 0.1 * rng.standard_normal(c_out))).astype(np.float32)
        bias = (0.05 * rng.standard_normal(c_out)).astype(np.float32)
        mean = (0.05 * rng.standard_normal(c_out)).astype(np.float32)
        var = rng.uniform(0.8, 1.2, size=c_out).astype(np.float32)
        y = self.op("BatchNormalization",
                    [y, self.const(scale, f"{name}.bn.weight"), self.const(bias, f"{name}.bn.bias"),
                     self.const(mean, f"{name}.bn.running_mean"),
                     self.const(var, f"{name}.bn.running_var")],
                    name=f"{name}.bn", epsilon=1e-5, momentum=0.9)
        if relu:
            y = self.op("Relu", [y], name=f"{name}.relu")
        return y

    # finish --------------------------------------------------------------------
    def model(self, graph_name: str, doc: str = "") -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, graph_name, self.inputs, self.outputs,
                                  initializer=self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="libtriton_rust/examples/export_models.py",
                                  doc_string=doc)
        model.ir_version = IR_VERSION
        return model


# --------------------------------------------------------------------------- ResNet50 v1.5


def build_resnet50(seed: int = 50, num_classes: int = 1000) -> onnx.ModelProto:
    g = GraphBuilder(seed)
    x = g.add_input("INPUT__0", TensorProto.FLOAT, ["batch", 3, 224, 224])

    # stem: 7x7/2 conv 64, BN, ReLU, 3x3/2 max pool
    y = g.conv_bn(x, 3, 64, 7, 2, "conv1", relu=True)
    y = g.op("MaxPool", [y], name="maxpool", kernel_shape=[3, 3], strides=[2, 2],
             pads=[1, 1, 1, 1])

    c_in = 64
    stages = [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]
    for si, (width, blocks, stride) in enumerate(stages, start=1):
        for bi in range(blocks):
            s = stride if bi == 0 else 1
            c_out = width * 4
            p = f"layer{si}.{bi}"
            # bottleneck: 1x1 reduce, 3x3 (carries the stride: v1.5), 1x1 expand.
            # The last BN starts small so the residual sum keeps its scale through 16 blocks.
            r = g.conv_bn(y, c_in, width, 1, 1, f"{p}.1", relu=True)
            r = g.conv_bn(r, width, width, 3, s, f"{p}.2", relu=True)
            r = g.conv_bn(r, width, c_out, 1, 1, f"{p}.3", relu=False, gamma_scale=0.2)
            if bi == 0:  # projection shortcut: conv1x1 (stride) + BN
                sc = g.conv_bn(y, c_in, c_out, 1, s, f"{p}.downsample", relu=False)
            else:
                sc = y
            y = g.op("Add", [r, sc], name=f"{p}.add")
            y = g.op("Relu", [y], name=f"{p}.relu")
            c_in = c_out

    y = g.op("GlobalAveragePool", [y], name="avgpool")           # [B,2048,1,1]
    y = g.op("Flatten", [y], name="flatten", axis=1)             # [B,2048]
    w = g.normal((num_classes, 2048), 1.0 / math.sqrt(2048), "fc.weight")
    b = g.normal((num_classes,), 0.01, "fc.bias")
    g.op("Gemm", [y, w, b], name="fc", outputs=["OUTPUT__0"], transB=1)
    g.add_output("OUTPUT__0", TensorProto.FLOAT, ["batch", num_classes])
    return g.model("resnet50_v1_5", "ResNet50 v1.5, random weights (seed %d)" % seed)


# --------------------------------------------------------------------------- BERT QA


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden: int = 1024
    layers: int = 24
    heads: int = 16
    intermediate: int = 4096
    max_positions: int = 512
    type_vocab: int = 2
    seq_len: int = 384
    ln_eps: float = 1e-12
    init_std: float = 0.02


BERT_LARGE = BertConfig()
BERT_SMALL = BertConfig(hidden=256, layers=2, heads=4, intermediate=1024)


def build_bert_qa(cfg: BertConfig, seed: int = 384, name: str = "bert_qa") -> onnx.ModelProto:
    g = GraphBuilder(seed)
    H, S, nh = cfg.hidden, cfg.seq_len, cfg.heads
    hd = H // nh
    std = cfg.init_std

    ids = g.add_input("input__0", TensorProto.INT32, ["batch", S])
    seg = g.add_input("input__1", TensorProto.INT32, ["batch", S])
    mask = g.add_input("input__2", TensorProto.INT32, ["batch", S])

    # embeddings: word + position (0..S-1) + token type, then LayerNorm
    word_emb = g.normal((cfg.vocab_size, H), std, "embeddings.word_embeddings.weight")
    pos_emb = g.normal((cfg.max_positions, H), std, "embeddings.position_embeddings.weight")
    type_emb = g.normal((cfg.type_vocab, H), std, "embeddings.token_type_embeddings.weight")
    pos_ids = g.i64(np.arange(S, dtype=np.int64)[None, :], "embeddings.position_ids")
    e_word = g.op("Gather", [word_emb, ids], name="embeddings.word", axis=0)      # [B,S,H]
    e_type = g.op("Gather", [type_emb, seg], name="embeddings.type", axis=0)      # [B,S,H]
    e_pos = g.op("Gather", [pos_emb, pos_ids], name="embeddings.position", axis=0)  # [1,S,H]
    e = g.op("Add", [e_word, e_type], name="embeddings.add1")
    e = g.op("Add", [e, e_pos], name="embeddings.add2")
    x = g.layer_norm(e, H, "embeddings.LayerNorm", cfg.ln_eps)

    # additive attention mask: (1 - mask) * -10000, shaped [B,1,1,S]
    m = g.op("Cast", [mask], name="mask.cast", to=TensorProto.FLOAT)
    m = g.op("Sub", [g.f32(1.0, "const.one"), m], name="mask.invert")
    m = g.op("Mul", [m, g.f32(-10000.0, "const.neg10000")], name="mask.scale")
    m = g.op("Unsqueeze", [m, g.i64([1, 2], "const.axes_1_2")], name="mask.unsqueeze")

    shape_bsnh = g.i64([0, 0, nh, hd], "const.shape_bsnh")
    shape_bsh = g.i64([0, 0, H], "const.shape_bsh")
    inv_sqrt_hd = g.f32(1.0 / math.sqrt(hd), "const.inv_sqrt_head_dim")

    for li in range(cfg.layers):
        p = f"encoder.layer.{li}"
        q = g.linear(x, H, H, f"{p}.attention.self.query", std=std)
        k = g.linear(x, H, H, f"{p}.attention.self.key", std=std)
        v = g.linear(x, H, H, f"{p}.attention.self.value", std=std)
        q = g.op("Reshape", [q, shape_bsnh], name=f"{p}.q.reshape")
        k = g.op("Reshape", [k, shape_bsnh], name=f"{p}.k.reshape")
        v = g.op("Reshape", [v, shape_bsnh], name=f"{p}.v.reshape")
        q = g.op("Transpose", [q], name=f"{p}.q.transpose", perm=[0, 2, 1, 3])  # [B,nh,S,hd]
        k = g.op("Transpose", [k], name=f"{p}.k.transpose", perm=[0, 2, 3, 1])  # [B,nh,hd,S]
        v = g.op("Transpose", [v], name=f"{p}.v.transpose", perm=[0, 2, 1, 3])  # [B,nh,S,hd]
        s = g.op("MatMul", [q, k], name=f"{p}.scores")                           # [B,nh,S,S]
        s = g.op("Mul", [s, inv_sqrt_hd], name=f"{p}.scores.scale")
        s = g.op("Add", [s, m], name=f"{p}.scores.mask")
        a = g.op("Softmax", [s], name=f"{p}.probs", axis=-1)
        c = g.op("MatMul", [a, v], name=f"{p}.context")                          # [B,nh,S,hd]
        c = g.op("Transpose", [c], name=f"{p}.context.transpose", perm=[0, 2, 1, 3])
        c = g.op("Reshape", [c, shape_bsh], name=f"{p}.context.reshape")         # [B,S,H]
        o = g.linear(c, H, H, f"{p}.attention.output.dense", std=std)
        o = g.op("Add", [o, x], name=f"{p}.attention.output.residual")
        x = g.layer_norm(o, H, f"{p}.attention.output.LayerNorm", cfg.ln_eps)
        f = g.linear(x, H, cfg.intermediate, f"{p}.intermediate.dense", std=std)
        f = g.gelu_erf(f, f"{p}.intermediate.gelu")
        f = g.linear(f, cfg.intermediate, H, f"{p}.output.dense", std=std)
        f = g.op("Add", [f, x], name=f"{p}.output.residual")
        x = g.layer_norm(f, H, f"{p}.output.LayerNorm", cfg.ln_eps)

    # QA head: Linear(H -> 2), split into start / end logits [B,S]
    logits = g.linear(x, H, 2, "qa_outputs", std=std)                             # [B,S,2]
    start, end = g.op("Split", [logits, g.i64([1, 1], "const.split_1_1")], name="qa.split",
                      n_out=2, axis=-1)
    axes_last = g.i64([-1], "const.axes_last")
    g.op("Squeeze", [start, axes_last], name="qa.start", outputs=["output__0"])
    g.op("Squeeze", [end, axes_last], name="qa.end", outputs=["output__1"])
    g.add_output("output__0", TensorProto.FLOAT, ["batch", S])
    g.add_output("output__1", TensorProto.FLOAT, ["batch", S])
    return g.model(name, "BERT QA (%d layers, hidden %d, %d heads), random weights (seed %d)"
                   % (cfg.layers, H, nh, seed))


# --------------------------------------------------------------------------- small models


def build_identity(width: int = 16) -> onnx.ModelProto:
    g = GraphBuilder(0)
    g.add_input("INPUT0", TensorProto.FLOAT, ["batch", width])
    g.op("Identity", ["INPUT0"], name="identity", outputs=["OUTPUT0"])
    g.add_output("OUTPUT0", TensorProto.FLOAT, ["batch", width])
    return g.model("identity")


def build_simple(width: int = 16) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 * INPUT1 (all FP32 [batch, width])."""
    g = GraphBuilder(0)
    g.add_input("INPUT0", TensorProto.FLOAT, ["batch", width])
    g.add_input("INPUT1", TensorProto.FLOAT, ["batch", width])
    g.op("Add", ["INPUT0", "INPUT1"], name="add", outputs=["OUTPUT0"])
    g.op("Mul", ["INPUT0", "INPUT1"], name="mul", outputs=["OUTPUT1"])
    g.add_output("OUTPUT0", TensorProto.FLOAT, ["batch", width])
    g.add_output("OUTPUT1", TensorProto.FLOAT, ["batch", width])
    return g.model("simple")


# --------------------------------------------------------------------------- registry


BUILDERS: Dict[str, Callable[[], onnx.ModelProto]] = {
    "resnet50": build_resnet50,
    "bert_large": lambda: build_bert_qa(BERT_LARGE, name="bert_large"),
    "bert_small": lambda: build_bert_qa(BERT_SMALL, name="bert_small"),
    "identity": build_identity,
    "simple": build_simple,
}
DEFAULT_MODELS = ["resnet50", "bert_small", "bert_large", "identity"]


def save_model(model: onnx.ModelProto, path: str) -> None:
    """Save in one file when it fits in a protobuf message, else with external data beside it."""
    where = placed(path, model.ByteSize(), "ONNX model")
    tmp = tmp_path(where)
    if model.ByteSize() < PROTOBUF_LIMIT:
        with open(tmp, "wb") as f:
            f.write(model.SerializeToString())
    else:
        if where != path:
            raise SystemExit(f"ONNX model: {path} has external data and cannot be spilled; free "
                             f"{model.ByteSize() >> 20} MiB beside it")
        onnx.save_model(model, tmp, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=os.path.basename(path) + ".data", size_threshold=1024)
    finish(path, where)


def to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same graph in FP16, as the seeds deploy it: every FLOAT initializer rounded to
    FLOAT16, FLOAT graph inputs and outputs declared FLOAT16, and `Cast(to=FLOAT)` made
    `Cast(to=FLOAT16)`. Integer tensors (ids, shapes, axes) are left alone. The weights are
    the FP32 model's, rounded, so the FP32 model run by ONNX Runtime on the CPU is the
    reference for the FP16 one (within FP16 tolerance)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    for i, init in enumerate(g.initializer):
        if init.data_type == TensorProto.FLOAT:
            a = numpy_helper.to_array(init).astype(np.float16)
            g.initializer[i].CopyFrom(numpy_helper.from_array(a, init.name))
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    for node in g.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
                attr.i = TensorProto.FLOAT16
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == TensorProto.FLOAT:
                attr.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attr.t).astype(np.float16), attr.t.name))
    return m


def build_model(name: str, path: str) -> str:
    """Build model `name` and write it to `path` (a .onnx file). Returns the path."""
    fp16 = name.endswith("_fp16")
    base = name[: -len("_fp16")] if fp16 else name
    if base not in BUILDERS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(BUILDERS)} (each also as <name>_fp16)")
    model = BUILDERS[base]()
    if fp16:
        model = to_fp16(model)
    save_model(model, path)
    return path


def example_inputs(name: str, batch: int = 1, seed: int = 0) -> Dict[str, np.ndarray]:
    """Inputs matching model `name`, reproducible from `seed`."""
    rng = np.random.default_rng(seed)
    if name == "resnet50":
        return {"INPUT__0": rng.standard_normal((batch, 3, 224, 224), dtype=np.float32)}
    if name.startswith("bert"):
        return bert_inputs(batch, seed=seed)
    if name == "identity":
        return {"INPUT0": rng.standard_normal((batch, 16), dtype=np.float32)}
    if name == "simple":
        return {"INPUT0": rng.standard_normal((batch, 16), dtype=np.float32),
                "INPUT1": rng.standard_normal((batch, 16), dtype=np.float32)}
    raise KeyError(name)


def bert_inputs(batch: int = 1, seq_len: int = 384, seed: int = 0,
                vocab_size: int = 30522) -> Dict[str, np.ndarray]:
    """A fake tokenized question/context pair per row: [CLS] q [SEP] c [SEP] then padding.

    Segment ids are 0 for the question part, 1 for the context; mask 1 on tokens, 0 on padding.
    """
    rng = np.random.default_rng(seed)
    ids = np.zeros((batch, seq_len), dtype=np.int32)
    seg = np.zeros((batch, seq_len), dtype=np.int32)
    mask = np.zeros((batch, seq_len), dtype=np.int32)
    for b in range(batch):
        q_len = int(rng.integers(8, 32))
        c_len = int(rng.integers(seq_len // 2, seq_len - q_len - 3))
        total = q_len + c_len + 3
        toks = rng.integers(1000, vocab_size, size=total, dtype=np.int32)
        toks[0] = 101                   # [CLS]
        toks[q_len + 1] = 102           # [SEP]
        toks[total - 1] = 102           # [SEP]
        ids[b, :total] = toks
        seg[b, q_len + 2:total] = 1
        mask[b, :total] = 1
    return {"input__0": ids, "input__1": seg, "input__2": mask}


def run_onnxruntime(path: str, feeds: Dict[str, np.ndarray], threads: int = 0):
    import onnxruntime as ort

    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def verify(name: str, path: str, batch: int = 2) -> bool:
    """Run the model on example inputs; print stats; True when outputs look sane."""
    feeds = example_inputs(name, batch)
    t0 = time.perf_counter()
    outs = run_onnxruntime(path, feeds)
    dt = time.perf_counter() - t0
    ok = True
    for oname, arr in outs.items():
        finite = bool(np.isfinite(arr).all())
        spread = float(arr.std()) if arr.size else 0.0
        print(f"  {oname}: shape={list(arr.shape)} dtype={arr.dtype} min={arr.min():.4g} "
              f"max={arr.max():.4g} mean={arr.mean():.4g} std={spread:.4g} finite={finite}")
        # rows must differ from each other and not be constant
        if not finite or spread == 0.0:
            ok = False
        if batch > 1 and arr.shape[0] > 1 and np.array_equal(arr[0], arr[1]):
            ok = False
    if name == "resnet50":
        top5 = np.argsort(-outs["OUTPUT__0"], axis=1)[:, :5]
        print(f"  top-5 classes per row: {top5.tolist()}")
    if name.startswith("bert"):
        m = feeds["input__2"].astype(bool)
        s = np.where(m, outs["output__0"], -np.inf).argmax(axis=1)
        e = np.where(m, outs["output__1"], -np.inf).argmax(axis=1)
        print(f"  best start/end positions per row: {list(zip(s.tolist(), e.tolist()))}")
    if name == "identity":
        ok = ok and np.array_equal(outs["OUTPUT0"], feeds["INPUT0"])
    if name == "simple":
        ok = ok and np.allclose(outs["OUTPUT0"], feeds["INPUT0"] + feeds["INPUT1"]) \
            and np.allclose(outs["OUTPUT1"], feeds["INPUT0"] * feeds["INPUT1"])
    print(f"  onnxruntime run (batch {batch}): {dt:.2f} s -> {'OK' if ok else 'BAD'}")
    return ok


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", default="models", help="model repository directory (default: models)")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS),
                    help="comma-separated names from: " + ", ".join(BUILDERS))
    ap.add_argument("--force", action="store_true", help="rebuild models whose file exists")
    ap.add_argument("--no-verify", action="store_true", help="skip the onnxruntime check")
    args = ap.parse_args(argv)

    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        ap.error(f"unknown model(s): {', '.join(unknown)}")

    failed = []
    for name in names:
        path = os.path.join(args.repo, name, "1", "model.onnx")
        if os.path.exists(path) and not args.force:
            print(f"{name}: {path} exists, skipping (use --force to rebuild)")
            continue
        t0 = time.perf_counter()
        build_model(name, path)
        dt = time.perf_counter() - t0
        size = os.path.getsize(path)
        if os.path.exists(path + ".data"):
            size += os.path.getsize(path + ".data")
        print(f"{name}: wrote {path} ({size / 1e6:.1f} MB) in {dt:.1f} s")
        if not args.no_verify and not verify(name, path):
            failed.append(name)
    if failed:
        print(f"FAILED verification: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
