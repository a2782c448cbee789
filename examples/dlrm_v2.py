#!/usr/bin/env python3
"""MLPerf Inference's DLRM-v2 (DLRM-DCNv2 on Criteo 1TB, multi-hot): the PyTorch reference, and
its Triton deployment as one recommender model with pooled lookups.

Sizes as mlcommons/inference `recommendation/dlrm_v2` serves them:
  26 tables of dim 128 (ROWS below: 204,184,588 rows at scale 1.0, 26.1 B parameters), each
  sample a bag of HOTNESS[t] keys per table (214 in all), sum-pooled (TorchRec's
  EmbeddingBagCollection); 13 dense features; the network is examples/recommenders.py's DCNv2
  (bottom MLP 512-256-128, three low-rank (512) cross layers over the 27 x 128 concatenation,
  top MLP 1024-1024-512-256-1, sigmoid).
Weights are random with fixed seeds (none can be downloaded); the tables' rows are scaled by
``--scale`` (each table keeps at least one row).

    python examples/dlrm_v2.py --repo /tmp/repo --scale 1e-5

writes ``<repo>/dlrm_v2/1/tables/t*/`` (the store's npy format), ``<repo>/dlrm_v2/1/dense.onnx``
(the network, exported from the PyTorch weights), ``<repo>/dlrm_v2/1/reference.pt`` and
``<repo>/dlrm_v2/config.pbtxt``: the recommender engine, ``sparse`` INT64 [214] (each table's
bag, padded with -1 where shorter) and ``dense`` FP32 [13] -> ``prediction`` FP32 [1].
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import recommenders  # noqa: E402
from export_models import save_model  # noqa: E402

ROWS = [40_000_000, 39_060, 17_295, 7_424, 20_265, 3, 7_122, 1_543, 63, 40_000_000, 3_067_956, 405_282, 10,
        2_209, 11_938, 155, 4, 976, 14, 40_000_000, 40_000_000, 40_000_000, 590_152, 12_973, 108, 36]
HOTNESS = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
DIM = 128
NUM_DENSE = recommenders.NUM_DENSE
SEED = 46
PAD = -1
assert len(ROWS) == len(HOTNESS) == recommenders.NUM_TABLES and sum(HOTNESS) == 214


def scaled_rows(scale: float) -> List[int]:
    return [max(1, int(round(r * scale))) for r in ROWS]


class DLRMv2(nn.Module):
    """EmbeddingBag(sum) per table, then the DCNv2 network on [dense, the 26 pooled rows]."""

    def __init__(self, rows: List[int]):
        super().__init__()
        torch.manual_seed(SEED)
        self.bags = nn.ModuleList(nn.EmbeddingBag(r, DIM, mode="sum") for r in rows)
        for b in self.bags:
            # a bag sums up to 100 rows: small rows keep the pooled values in the network's range
            nn.init.normal_(b.weight, std=0.05)
        # the network: DLRM-v2's is DCNv2's, with its own seed (its per-table embeddings unused)
        self.net = recommenders.make("dcnv2", [1] * recommenders.NUM_TABLES)

    def pooled(self, sparse: torch.Tensor) -> torch.Tensor:
        """``sparse`` [B, 214], each table's bag padded with -1 -> [B, 26, DIM] (empty bags zero)."""
        out, at = [], 0
        for t, (bag, h) in enumerate(zip(self.bags, HOTNESS)):
            keys = sparse[:, at:at + h]
            mask = keys != PAD
            flat = keys[mask]
            offsets = torch.cat([torch.zeros(1, dtype=torch.int64, device=sparse.device), mask.sum(1).cumsum(0)[:-1]])
            out.append(bag(flat, offsets))
            at += h
        return torch.stack(out, dim=1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        return self.net.dense_part(dense, self.pooled(sparse))


def config(name: str, max_batch: int, instance_kind: str = "KIND_CPU", network: str = "dense.onnx",
           ragged: bool = False) -> str:
    """``ragged``: the keys as TorchRec's values and lengths (``sparse`` INT64 ``[-1]`` with
    ``allow_ragged_batch``, each sample's bags one after the other; ``lengths`` INT32 ``[26]``)
    instead of ``[214]`` padded with -1."""
    params = dict(engine="recommender", recommender_dense_model=network, embedding_interface="pooled",
                  embedding_table_names=",".join(f"t{i}" for i in range(len(ROWS))),
                  embedding_vecsize_per_table=DIM, embedding_hotness_per_table=",".join(map(str, HOTNESS)),
                  embedding_combiner="sum", default_value_for_each_table=0)
    sparse = ('{ name: "sparse" data_type: TYPE_INT64 dims: [ -1 ] allow_ragged_batch: true },\n'
              f'        {{ name: "lengths" data_type: TYPE_INT32 dims: [ {len(ROWS)} ] }} ]' if ragged else
              f'{{ name: "sparse" data_type: TYPE_INT64 dims: [ {sum(HOTNESS)} ] }} ]')
    lines = [f'name: "{name}"', 'backend: "rust"', f"max_batch_size: {max_batch}",
             'input [ { name: "dense" data_type: TYPE_FP32 dims: [ 13 ] },',
             f'        {sparse}',
             'output [ { name: "prediction" data_type: TYPE_FP32 dims: [ 1 ] } ]',
             "dynamic_batching { max_queue_delay_microseconds: 100 }",
             f"instance_group [ {{ count: 1 kind: {instance_kind} }} ]"]
    lines += [f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}' for k, v in params.items()]
    return "\n".join(lines) + "\n"


def export(repo: str, scale: float, name: str = "dlrm_v2", max_batch: int = 1024, instance_kind: str = "KIND_CPU",
           network: str = "onnx") -> DLRMv2:
    """``network``: ``onnx`` (dense.onnx, for KIND_CPU) or ``torchscript`` (dense.pt, which reads
    the pooled rows in GPU memory on a KIND_GPU instance)."""
    rows = scaled_rows(scale)
    model = DLRMv2(rows).eval()
    version = os.path.join(repo, name, "1")
    for i, bag in enumerate(model.bags):
        d = os.path.join(version, "tables", f"t{i}")
        os.makedirs(d, exist_ok=True)
        np.save(os.path.join(d, "keys.npy"), np.arange(rows[i], dtype=np.int64))
        np.save(os.path.join(d, "vectors.npy"), bag.weight.detach().numpy().astype(np.float32))
    if network == "onnx":
        dense_file = "dense.onnx"
        save_model(recommenders.dense_onnx(name, model.net), os.path.join(version, dense_file))
    else:
        dense_file = "dense.pt"
        recommenders.dense_torchscript(model.net).save(os.path.join(version, dense_file))
    torch.save({"scale": scale, "state_dict": model.state_dict()}, os.path.join(version, "reference.pt"))
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(config(name, max_batch, instance_kind, dense_file))
    return model


def ensemble(repo: str, name: str = "dlrm_v2", max_batch: int = 1024) -> str:
    """Writes the same model as a Triton ensemble beside the one-model form ``export`` wrote:
    ``<name>_sparse`` (the embedding engine's pooled interface over the same tables), ``<name>_dense``
    (the same dense.onnx) and ``<name>_ensemble`` chaining them, with the one model's inputs and
    output. Returns the ensemble's name."""
    version = os.path.abspath(os.path.join(repo, name, "1"))
    tables = ",".join(f"t{i}" for i in range(len(ROWS)))
    sparse, dense, whole = f"{name}_sparse", f"{name}_dense", f"{name}_ensemble"
    store = dict(engine="embedding", embedding_interface="pooled", embedding_table_names=tables,
                 embedding_vecsize_per_table=DIM, embedding_hotness_per_table=",".join(map(str, HOTNESS)),
                 embedding_combiner="sum", default_value_for_each_table=0,
                 sparse_files=",".join(os.path.join(version, "tables", f"t{i}") for i in range(len(ROWS))))
    configs = {
        sparse: [f'name: "{sparse}"', 'backend: "rust"', f"max_batch_size: {max_batch}",
                 f'input [ {{ name: "KEYS" data_type: TYPE_INT64 dims: [ {sum(HOTNESS)} ] }} ]',
                 f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {len(ROWS)}, {DIM} ] }} ]',
                 "dynamic_batching { max_queue_delay_microseconds: 100 }", "instance_group [ { count: 1 kind: KIND_CPU } ]"]
        + [f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}' for k, v in store.items()],
        dense: [f'name: "{dense}"', 'backend: "rust"', f"max_batch_size: {max_batch}",
                f'input [ {{ name: "dense" data_type: TYPE_FP32 dims: [ {NUM_DENSE} ] }},',
                f'        {{ name: "embeddings" data_type: TYPE_FP32 dims: [ {len(ROWS)}, {DIM} ] }} ]',
                'output [ { name: "prediction" data_type: TYPE_FP32 dims: [ 1 ] } ]',
                "dynamic_batching { max_queue_delay_microseconds: 100 }", "instance_group [ { count: 1 kind: KIND_CPU } ]"],
        whole: [f'name: "{whole}"', 'platform: "ensemble"', f"max_batch_size: {max_batch}",
                f'input [ {{ name: "dense" data_type: TYPE_FP32 dims: [ {NUM_DENSE} ] }},',
                f'        {{ name: "sparse" data_type: TYPE_INT64 dims: [ {sum(HOTNESS)} ] }} ]',
                'output [ { name: "prediction" data_type: TYPE_FP32 dims: [ 1 ] } ]',
                "ensemble_scheduling { step [",
                f'  {{ model_name: "{sparse}" model_version: -1 input_map {{ key: "KEYS" value: "sparse" }} '
                'output_map { key: "OUTPUT0" value: "embeddings" } },',
                f'  {{ model_name: "{dense}" model_version: -1 input_map {{ key: "dense" value: "dense" }} '
                'input_map { key: "embeddings" value: "embeddings" } output_map { key: "prediction" value: "prediction" } } ] }'],
    }
    for model, lines in configs.items():
        os.makedirs(os.path.join(repo, model, "1"), exist_ok=True)
        with open(os.path.join(repo, model, "config.pbtxt"), "w") as f:
            f.write("\n".join(lines) + "\n")
    link = os.path.join(repo, dense, "1", "model.onnx")
    if not os.path.lexists(link):
        os.symlink(os.path.join(version, "dense.onnx"), link)
    return whole


def load_reference(version_dir: str) -> DLRMv2:
    saved = torch.load(os.path.join(version_dir, "reference.pt"))
    model = DLRMv2(scaled_rows(saved["scale"]))
    model.load_state_dict(saved["state_dict"])
    return model.eval()


def sample_inputs(batch: int, rows: List[int], seed: int = 0, full: float = 0.7):
    """Dense features and each sample's bags: a bag full (its table's hotness) with
    probability ``full``, else 0 to hotness-1 keys padded with -1."""
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((batch, NUM_DENSE)).astype(np.float32)
    sparse = np.full((batch, sum(HOTNESS)), PAD, dtype=np.int64)
    for b in range(batch):
        at = 0
        for t, h in enumerate(HOTNESS):
            n = h if rng.random() < full else int(rng.integers(0, h))
            sparse[b, at:at + n] = rng.integers(0, rows[t], size=n)
            at += h
    return dense, sparse


def ragged_inputs(sparse: np.ndarray):
    """``sparse`` [B, 214] padded with -1 as TorchRec's values and lengths: each sample's keys
    without the padding, one sample after the other, and ``lengths`` INT32 [B, 26]."""
    lengths = np.zeros((sparse.shape[0], len(HOTNESS)), np.int32)
    at = 0
    for t, h in enumerate(HOTNESS):
        lengths[:, t] = (sparse[:, at:at + h] != PAD).sum(axis=1)
        at += h
    return sparse[sparse != PAD].astype(np.int64), lengths


def calibration_inputs(batch: int = 4096, seed: int = 0, row_std: float = 0.055):
    """Inputs shaped like served ones, for FP8 calibration (examples/fp8.py): dense features
    uniform in [0, 1) as the benchmark draws them, each table's pooled row a sum of its hotness
    of independent rows of element std ``row_std`` (criteo_fixture's rows: magnitudes 2^-7 to
    2^-4, std about 0.055). Float32 tensors ``[batch, 13]``, ``[batch, 26, DIM]``."""
    g = torch.Generator().manual_seed(seed)
    std = row_std * torch.tensor(HOTNESS, dtype=torch.float32).sqrt()
    return torch.rand(batch, NUM_DENSE, generator=g), torch.randn(batch, len(ROWS), DIM, generator=g) * std[None, :, None]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", default="models")
    p.add_argument("--scale", type=float, default=1e-5, help="the tables' rows, as a share of MLPerf's")
    p.add_argument("--max-batch", type=int, default=1024)
    a = p.parse_args(argv)
    rows = scaled_rows(a.scale)
    export(a.repo, a.scale, max_batch=a.max_batch)
    params = sum(rows) * DIM
    print(f"dlrm_v2: {len(rows)} tables, {sum(rows):,} rows ({params:,} parameters in the tables at scale {a.scale}), "
          f"{sum(HOTNESS)} lookups per sample; network -> ONNX")
    return 0


if __name__ == "__main__":
    sys.exit(main())
