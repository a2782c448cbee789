#!/usr/bin/env python3
"""DLRM, DCNv2 and Wide&Deep: PyTorch reference models, and their Triton deployment.

Each model is split the way HPS deployments split it:
  * the sparse part — one embedding table per categorical feature — is exported to the
    store's table format and served by the rust backend's embedding engine
    (``<name>_sparse``, batched interface: KEYS [26] -> OUTPUT0 [26, dim]);
  * the dense part — everything after the embedding lookup — is exported to ONNX from
    the PyTorch weights (``<name>_dense``, served by the ONNX engine);
  * a Triton ensemble ``<name>`` chains them: (dense [13], sparse [26]) -> prediction [1].

Architectures (random weights, fixed seed; sizes from the DeepLearningExamples / MLPerf; the
first layers' input widths padded with zero columns to a multiple of 8, see ``padding``):
  DLRM    bottom MLP 13-512-256-128, dot interaction of 27 vectors (351 pairs) + the
          bottom output, top MLP 479-1024-1024-512-256-1, sigmoid.
  DCNv2   bottom MLP 13-512-256-128, x0 = [bottom, 26 x 128 embeddings] (3456),
          3 low-rank (512) cross layers x_{l+1} = x0 * (U(V x_l) + b) + x_l,
          deep MLP 3456-1024-1024-512-256-1, sigmoid.
  W&D     per categorical feature a 65-wide row: 64 deep dims + 1 wide weight (one
          lookup serves both parts); wide = sum of wide weights + linear(13 numerical);
          deep = MLP over [26 x 64 embeddings, 13 numerical] 1677-1024-512-256-1;
          sigmoid(wide + deep).

    python examples/recommenders.py --repo models --rows 1000 [--models dlrm,dcnv2,wide_deep]

writes ``models/<name>_sparse/1/tables/t*/``, ``models/<name>_dense/1/model.onnx`` and
``models/<name>_dense/1/reference.pt`` (the PyTorch state dict, for tests); the
config.pbtxt files are committed.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from onnx import TensorProto

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_models import GraphBuilder, save_model  # noqa: E402

NUM_DENSE = 13
NUM_TABLES = 26
# Widths the MLPs' first layers see are padded to a multiple of this (see `padding`):
# bench/gpu/recsys_profile.py measured DLRM's batch-65536 network 3.42 -> 3.10 ms and
# Wide&Deep's 2.91 -> 1.71 ms on an H100 (docs/performance.md).
ALIGN = 8


def padding(width: int, align: int) -> int:
    """Zero columns that make ``width`` a multiple of ``align``: cuBLAS runs its fast FP16 GEMM
    kernels only when a row of the input is a multiple of 16 bytes (else CUTLASS's align-1
    kernels, 1.1-4x slower on an H100: git show 3392834:bench/gpu/results/recsys_h100/network_profile.log), so
    NVIDIA's DLRM pads its interaction's 479 columns to 480. Zero columns (and the weights
    they meet) change no output; ``align=1`` means no padding."""
    return (-width) % align


def mlp(sizes: List[int], last_relu: bool) -> nn.Sequential:
    layers: List[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class Recommender(nn.Module):
    """Shared shape: 13 dense features and 26 categorical ids, one table each. ``align``:
    the widths the first layers of the MLPs see are padded with zero columns to a multiple
    of it (see ``padding``)."""

    def __init__(self, rows: List[int], dim: int, align: int):
        super().__init__()
        self.dim = dim
        self.align = align
        self.dense_pad = padding(NUM_DENSE, align)
        self.embeddings = nn.ModuleList(nn.Embedding(r, dim) for r in rows)
        for e in self.embeddings:
            nn.init.normal_(e.weight, std=0.5)

    def lookup(self, sparse: torch.Tensor) -> torch.Tensor:
        return torch.stack([e(sparse[:, i]) for i, e in enumerate(self.embeddings)], dim=1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        return self.dense_part(dense, self.lookup(sparse))

    def padded_dense(self, dense: torch.Tensor) -> torch.Tensor:
        return F.pad(dense, (0, self.dense_pad)) if self.dense_pad > 0 else dense


class DLRM(Recommender):
    """``interaction``: how the dot products are computed, the same numbers either way.
    ``cat`` stacks the bottom MLP's output on the 26 embeddings and multiplies the 27 vectors
    by themselves; ``split`` multiplies the embeddings by themselves and by the bottom
    output apart, so the 27 x dim stack is never written (at batch 65536 TorchScript's
    fused concatenation alone took 1.4 ms on an H100, bench/gpu/recsys_profile.py). Measured
    bare on an H100, fp16 rows in: batch 65536 2.58 ms ``cat``, 2.08 ms ``split``; batch 4096
    eager 0.52 ms ``cat``, 0.98 ms ``split`` (more, smaller kernels: launch-bound unless
    CUDA-graphed; git show 5644c82:bench/gpu/results/recsys_h100/nov23b_split/profile_split.log). ``triton``
    runs the whole interaction, concatenation and padding included, as one Triton kernel
    (``triton_kernels.dot_interaction``) on CUDA FP16 tensors, for AOTInductor packages;
    ``split`` elsewhere, TorchScript included (a script cannot hold the kernel)."""

    def __init__(self, rows: List[int], dim: int = 128, align: int = ALIGN, interaction: str = "cat"):
        super().__init__(rows, dim, align)
        if interaction not in ("cat", "split", "triton"):
            raise ValueError(f"interaction must be cat, split or triton, not {interaction!r}")
        self.split = interaction != "cat"
        self.triton = interaction == "triton"
        self.bottom = mlp([NUM_DENSE + self.dense_pad, 512, 256, dim], last_relu=True)
        n = NUM_TABLES + 1
        self.pairs = n * (n - 1) // 2
        self.top_pad = padding(dim + self.pairs, align)
        self.top = mlp([dim + self.pairs + self.top_pad, 1024, 1024, 512, 256, 1], last_relu=False)
        li, lj = torch.tril_indices(n, n, offset=-1)
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)

    @torch.jit.unused
    def kernel_interaction(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        from triton_kernels import dot_interaction
        return dot_interaction(x, emb, x.shape[1] + self.pairs + self.top_pad)

    def dense_part(self, dense, emb):
        x = self.bottom(self.padded_dense(dense))
        if self.triton and emb.is_cuda and emb.dtype == torch.float16 and not torch.jit.is_scripting():
            return torch.sigmoid(self.top(self.kernel_interaction(x, emb)))
        if self.split:
            # row i-1 holds vector i's products with vectors 0 (the bottom output) to 26:
            # z[:, i, j] of the stacked form for every i >= 1, which is all the pairs need
            ee = torch.bmm(emb, emb.transpose(1, 2))
            xe = torch.bmm(emb, x.unsqueeze(2))
            pairs = torch.cat([xe, ee], dim=2)[:, self.li - 1, self.lj]
        else:
            t = torch.cat([x.unsqueeze(1), emb], dim=1)
            z = torch.bmm(t, t.transpose(1, 2))
            pairs = z[:, self.li, self.lj]
        top_in = torch.cat([x, pairs], dim=1)
        if self.top_pad > 0:
            top_in = F.pad(top_in, (0, self.top_pad))
        return torch.sigmoid(self.top(top_in))


class DCNv2(Recommender):
    """``cross``: ``torch`` computes each cross layer as written; ``triton`` runs its second
    product and the rest of the layer as one Triton kernel (``triton_kernels.cross_layer``,
    which reads x0 from the bottom output and the embeddings without concatenating them) on
    CUDA FP16 tensors, for AOTInductor packages, and as written elsewhere (TorchScript
    included)."""

    def __init__(self, rows: List[int], dim: int = 128, cross_layers: int = 3, rank: int = 512, align: int = ALIGN,
                 cross: str = "torch"):
        super().__init__(rows, dim, align)
        if cross not in ("torch", "triton"):
            raise ValueError(f"cross must be torch or triton, not {cross!r}")
        self.triton = cross == "triton"
        self.bottom = mlp([NUM_DENSE + self.dense_pad, 512, 256, dim], last_relu=True)
        width = dim * (NUM_TABLES + 1)
        self.v = nn.ModuleList(nn.Linear(width, rank, bias=False) for _ in range(cross_layers))
        self.u = nn.ModuleList(nn.Linear(rank, width) for _ in range(cross_layers))
        self.deep = mlp([width, 1024, 1024, 512, 256, 1], last_relu=False)

    @torch.jit.unused
    def kernel_crosses(self, bottom: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """The cross layers through triton_kernels.cross_layer, x0 = [bottom | emb] never
        concatenated: the first layer's product V x0 taken as two (V's columns for bottom, for emb)."""
        from triton_kernels import cross_layer
        d = bottom.shape[1]
        x = None
        for v, u in zip(self.v, self.u):
            if x is None:
                h = F.linear(bottom, v.weight[:, :d]) + F.linear(emb, v.weight[:, d:])
            else:
                h = v(x)
            x = cross_layer(bottom, emb, x, h, u.weight, u.bias)
        return x

    @torch.jit.unused
    def fp8_kernel_net(self, bottom: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """The cross layers and the deep MLP's first layer once examples/fp8.py has made them FP8
        (per-tensor scales): each layer's second product and the rest of it in one kernel
        (triton_kernels.cross_layer_fp8), which also writes the result quantized for the next
        FP8 layer, so the first product of the next layer (and the deep MLP's first) reads it
        as it is. Returns the deep MLP's output before the sigmoid."""
        from triton_kernels import cross_layer_fp8
        q = self.v[0].quantize(torch.cat([bottom, emb], dim=1))
        x = None
        last = len(self.v) - 1
        for i, (v, u) in enumerate(zip(self.v, self.u)):
            h = v.product(q, bottom.dtype)
            following = self.v[i + 1] if i < last else self.deep[0]
            scales = torch.stack([u.scale_x, u.scale_w, following.inv_scale_x]).float()
            x, q = cross_layer_fp8(bottom, emb, x, u.quantize(h), u.weight, scales, u.bias, i < last)
        y = self.deep[0].product(q, bottom.dtype)
        for i, layer in enumerate(self.deep):
            if i > 0:  # each a submodule as installed (a slice of deep would be a new module, which export refuses)
                y = layer(y)
        return y

    @torch.jit.unused
    def fp8_layers(self) -> bool:
        """Whether examples/fp8.py made the cross layers and the deep MLP's first layer FP8 with
        per-tensor scales (what fp8_kernel_net runs)."""
        return all(getattr(m, "rows", True) is False for m in [*self.v, *self.u, self.deep[0]])

    def dense_part(self, dense, emb):
        bottom = self.bottom(self.padded_dense(dense))
        if self.triton and bottom.is_cuda and bottom.dtype == torch.float16 and not torch.jit.is_scripting():
            if self.fp8_layers():
                return torch.sigmoid(self.fp8_kernel_net(bottom, emb.flatten(1)))
            return torch.sigmoid(self.deep(self.kernel_crosses(bottom, emb.flatten(1))))
        x0 = torch.cat([bottom, emb.flatten(1)], dim=1)
        x = x0
        for v, u in zip(self.v, self.u):
            x = x0 * u(v(x)) + x
        return torch.sigmoid(self.deep(x))


class WideDeep(Recommender):
    DEEP = 64

    def __init__(self, rows: List[int], align: int = ALIGN):
        super().__init__(rows, self.DEEP + 1, align)
        self.dense_pad = 0  # no bottom MLP: the dense features join the deep MLP's padded input
        self.deep_dim = self.DEEP
        self.wide_dense = nn.Linear(NUM_DENSE, 1)
        self.deep_pad = padding(NUM_TABLES * self.DEEP + NUM_DENSE, align)
        self.deep = mlp([NUM_TABLES * self.DEEP + NUM_DENSE + self.deep_pad, 1024, 512, 256, 1], last_relu=False)

    def dense_part(self, dense, emb):
        wide = emb[:, :, self.deep_dim].sum(dim=1, keepdim=True) + self.wide_dense(dense)
        deep_in = torch.cat([emb[:, :, : self.deep_dim].flatten(1), dense], dim=1)
        if self.deep_pad > 0:
            deep_in = F.pad(deep_in, (0, self.deep_pad))
        return torch.sigmoid(wide + self.deep(deep_in))


MODELS = {"dlrm": DLRM, "dcnv2": DCNv2, "wide_deep": WideDeep}
SEEDS = {"dlrm": 11, "dcnv2": 12, "wide_deep": 13}


def make(name: str, rows: List[int], align: int = ALIGN, **options) -> Recommender:
    """``options``: the model's own (DLRM's ``interaction``, DCNv2's ``cross``)."""
    torch.manual_seed(SEEDS[name])
    model = MODELS[name](rows, align=align, **options)
    # He init keeps the activations' scale through the ReLU stacks, so predictions
    # spread over (0, 1) instead of all sitting at sigmoid(0).
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            if m.bias is not None:
                nn.init.normal_(m.bias, std=0.05)
    if isinstance(model, DCNv2):
        for u in model.u:  # cross layers multiply by x0: keep their gain modest
            nn.init.normal_(u.weight, std=0.3 / np.sqrt(u.in_features))
    return model.eval()


class DensePart(nn.Module):
    """The dense part alone, for TorchScript: (dense [B,13], embeddings [B,26,dim]) -> [B,1]."""

    def __init__(self, model: Recommender):
        super().__init__()
        self.model = model

    def forward(self, dense: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        return self.model.dense_part(dense, embeddings)


def dense_torchscript(model: Recommender) -> torch.jit.ScriptModule:
    return torch.jit.script(DensePart(model).eval())


# ------------------------------------------------------------------ dense part -> ONNX


def _weights(model: nn.Module) -> Dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def _linear(g: GraphBuilder, x: str, w: Dict[str, np.ndarray], prefix: str, relu: bool) -> str:
    y = g.op("MatMul", [x, g.const(w[f"{prefix}.weight"].T.copy(), f"{prefix}.weight")], name=f"{prefix}.matmul")
    if f"{prefix}.bias" in w:
        y = g.op("Add", [y, g.const(w[f"{prefix}.bias"], f"{prefix}.bias")], name=f"{prefix}.add")
    return g.op("Relu", [y], name=f"{prefix}.relu") if relu else y


def _mlp(g: GraphBuilder, x: str, seq: nn.Sequential, w, prefix: str) -> str:
    mods = list(seq)
    for i, m in enumerate(mods):
        if isinstance(m, nn.Linear):
            relu = i + 1 < len(mods) and isinstance(mods[i + 1], nn.ReLU)
            x = _linear(g, x, w, f"{prefix}.{i}", relu)
    return x


def _pad_columns(g: GraphBuilder, x: str, n: int, name: str) -> str:
    """``x`` [B, w] -> [B, w + n], the new columns zero (recommenders.padding)."""
    return g.op("Pad", [x, g.i64([0, 0, 0, n], name)], mode="constant")


def dense_onnx(name: str, model: Recommender):
    """The dense part as an ONNX graph: inputs dense [B,13], embeddings [B,26,dim]."""
    g = GraphBuilder(seed=0)
    w = _weights(model)
    dim = model.dim
    dense = dense_raw = g.add_input("dense", TensorProto.FLOAT, ["batch", NUM_DENSE])
    emb = g.add_input("embeddings", TensorProto.FLOAT, ["batch", NUM_TABLES, dim])
    if model.dense_pad:
        dense = _pad_columns(g, dense, model.dense_pad, "dense_pad")
    if isinstance(model, DLRM):
        x = _mlp(g, dense, model.bottom, w, "bottom")
        t = g.op("Concat", [g.op("Unsqueeze", [x, g.i64([1], "axis1")]), emb], axis=1)
        z = g.op("MatMul", [t, g.op("Transpose", [t], perm=[0, 2, 1])])
        n = NUM_TABLES + 1
        flat = g.op("Reshape", [z, g.i64([-1, n * n], "zshape")])
        idx = (model.li * n + model.lj).numpy().astype(np.int64)
        zflat = g.op("Gather", [flat, g.i64(idx, "pairs")], axis=1)
        top_in = g.op("Concat", [x, zflat], axis=1)
        if model.top_pad:
            top_in = _pad_columns(g, top_in, model.top_pad, "top_pad")
        logit = _mlp(g, top_in, model.top, w, "top")
    elif isinstance(model, DCNv2):
        x0 = g.op("Concat", [_mlp(g, dense, model.bottom, w, "bottom"),
                             g.op("Reshape", [emb, g.i64([-1, NUM_TABLES * dim], "flat")])], axis=1)
        x = x0
        for i in range(len(model.v)):
            h = _linear(g, _linear(g, x, w, f"v.{i}", False), w, f"u.{i}", False)
            x = g.op("Add", [g.op("Mul", [x0, h]), x])
        logit = _mlp(g, x, model.deep, w, "deep")
    else:
        deep_dims = g.op("Slice", [emb, g.i64([0], "s0"), g.i64([WideDeep.DEEP], "e0"), g.i64([2], "ax2")])
        wide_w = g.op("Slice", [emb, g.i64([WideDeep.DEEP], "s1"), g.i64([WideDeep.DEEP + 1], "e1"), g.i64([2], "ax2b")])
        wide = g.op("Add", [g.op("ReduceSum", [g.op("Squeeze", [wide_w, g.i64([2], "sq")]), g.i64([1], "rs")], keepdims=1),
                            _linear(g, dense_raw, w, "wide_dense", False)])
        flat = g.op("Reshape", [deep_dims, g.i64([-1, NUM_TABLES * WideDeep.DEEP], "flatd")])
        deep_in = g.op("Concat", [flat, dense_raw], axis=1)
        if model.deep_pad:
            deep_in = _pad_columns(g, deep_in, model.deep_pad, "deep_pad")
        deep = _mlp(g, deep_in, model.deep, w, "deep")
        logit = g.op("Add", [wide, deep])
    g.op("Sigmoid", [logit], outputs=["prediction"])
    g.add_output("prediction", TensorProto.FLOAT, ["batch", 1])
    return g.model(f"{name}_dense", doc=f"{name} dense part, from the PyTorch reference in examples/recommenders.py")


def export(repo: str, name: str, rows: int) -> None:
    model = make(name, [rows] * NUM_TABLES)
    sparse_dir = os.path.join(repo, f"{name}_sparse", "1", "tables")
    for i, e in enumerate(model.embeddings):
        d = os.path.join(sparse_dir, f"t{i}")
        os.makedirs(d, exist_ok=True)
        np.save(os.path.join(d, "keys.npy"), np.arange(rows, dtype=np.int64))
        np.save(os.path.join(d, "vectors.npy"), e.weight.detach().numpy().astype(np.float32))
    dense_dir = os.path.join(repo, f"{name}_dense", "1")
    os.makedirs(dense_dir, exist_ok=True)
    save_model(dense_onnx(name, model), os.path.join(dense_dir, "model.onnx"))
    torch.save({"rows": rows, "state_dict": model.state_dict()}, os.path.join(dense_dir, "reference.pt"))


def load_reference(repo: str, name: str) -> Recommender:
    saved = torch.load(os.path.join(repo, f"{name}_dense", "1", "reference.pt"))
    model = make(name, [saved["rows"]] * NUM_TABLES)
    model.load_state_dict(saved["state_dict"])
    return model.eval()


def sample_inputs(batch: int, rows: int, seed: int = 0, unknown: int = 0):
    """Dense features and categorical ids; the first ``unknown`` ids of table 0 are out of
    the table (the store answers them with the default vector, zeros)."""
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((batch, NUM_DENSE)).astype(np.float32)
    sparse = rng.integers(0, rows, size=(batch, NUM_TABLES), dtype=np.int64)
    sparse[:unknown, 0] = rows + 7
    return dense, sparse


def reference_predict(model: Recommender, dense: np.ndarray, sparse: np.ndarray) -> np.ndarray:
    """The PyTorch model's prediction; unknown ids get a zero row, as the store's default."""
    with torch.no_grad():
        s = torch.from_numpy(sparse)
        embs = []
        for i, e in enumerate(model.embeddings):
            ids = s[:, i]
            known = ids < e.num_embeddings
            rows = e(torch.where(known, ids, torch.zeros_like(ids)))
            embs.append(torch.where(known.unsqueeze(1), rows, torch.zeros_like(rows)))
        return model.dense_part(torch.from_numpy(dense), torch.stack(embs, dim=1)).numpy()


def single_model(repo: str, name: str, dst_repo: str, extra_parameters=()) -> str:
    """Writes `<name>_single` into dst_repo: the recommender as one backend model (engine
    "recommender"), its tables and dense ONNX linked from repo's `<name>_sparse` and
    `<name>_dense`, the ensemble's inputs and output, the sparse step's store parameters."""
    import re

    with open(os.path.join(repo, name, "config.pbtxt")) as f:
        ensemble = f.read()
    with open(os.path.join(repo, f"{name}_sparse", "config.pbtxt")) as f:
        params = [line for line in f.read().splitlines()
                  if line.startswith("parameters") and '"engine"' not in line and "embedding_interface" not in line]
    max_batch = re.search(r"max_batch_size: (\d+)", ensemble).group(1)
    inputs = re.search(r"input \[.*?\n\]", ensemble, re.S).group(0)
    output = next(line for line in ensemble.splitlines() if line.startswith("output"))
    single = f"{name}_single"
    d = os.path.join(dst_repo, single, "1")
    os.makedirs(d, exist_ok=True)
    for link, target in (("tables", os.path.join(repo, f"{name}_sparse", "1", "tables")),
                         ("dense.onnx", os.path.join(repo, f"{name}_dense", "1", "model.onnx"))):
        if not os.path.lexists(os.path.join(d, link)):
            os.symlink(os.path.abspath(target), os.path.join(d, link))
    with open(os.path.join(dst_repo, single, "config.pbtxt"), "w") as f:
        f.write("\n".join([f'name: "{single}"', 'backend: "rust"', f"max_batch_size: {max_batch}", inputs, output,
                           "dynamic_batching { max_queue_delay_microseconds: 100 }",
                           "instance_group [ { count: 1 kind: KIND_CPU } ]",
                           'parameters { key: "engine" value { string_value: "recommender" } }',
                           *params, *extra_parameters, ""]))
    return single


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", default="models")
    p.add_argument("--rows", type=int, default=1000, help="rows per table")
    p.add_argument("--models", default="dlrm,dcnv2,wide_deep")
    p.add_argument("--force", action="store_true")
    a = p.parse_args(argv)
    for name in a.models.split(","):
        marker = os.path.join(a.repo, f"{name}_dense", "1", "reference.pt")
        if os.path.exists(marker) and not a.force:
            print(f"{name}: exists, skipping (use --force to rebuild)")
            continue
        export(a.repo, name, a.rows)
        print(f"{name}: {NUM_TABLES} tables x {a.rows} rows, dense part -> ONNX")
    return 0


if __name__ == "__main__":
    sys.exit(main())
