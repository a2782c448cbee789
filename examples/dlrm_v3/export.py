#!/usr/bin/env python3
"""Writes the example DLRM-v3 model of the repository (models/dlrm_v3, served by the sequence
recommender engine on the CPU): the item, user and category tables in the store's format and
the network package, from our reference at Config.tiny() and its seed (random weights; about a
minute of compiling on two cores). The config is committed (models/dlrm_v3/config.pbtxt).

The attention's normaliser is fixed at the longest sequence the example takes (1 + 128 history
items + 16 candidates): with the reference's own (the batch's padded length) a request's scores
would move with whatever Triton batches it with (docs/dlrm-v3.md).

    python examples/dlrm_v3/export.py --repo models [--force]
"""
from __future__ import annotations

import argparse
import copy
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # examples/: dlrm_v3, aoti_export, model_files
from dlrm_v3 import data as dv3_data  # noqa: E402
from dlrm_v3 import model as dv3  # noqa: E402
from dlrm_v3 import network as net  # noqa: E402

NAME = "dlrm_v3"
# the store's table name -> the reference's table
TABLES = {"item_id": "item_table", "user_id": "user_table", "category": "category_table"}


def config() -> dv3.Config:
    """The example's model: the tiny one, its normaliser fixed at its longest sequence."""
    tiny = dv3.Config.tiny()
    return dv3.Config.tiny(attn_norm_len=1 + tiny.max_seq_len + tiny.max_candidates)


def ranker() -> dv3.HstuRanker:
    """The example's weights (a fixed seed): clients rebuild it to check their answers."""
    return dv3.HstuRanker(config()).eval()


def example_batch() -> dv3.Batch:
    """The export's example: a few requests of the tiny generator (histories of mixed lengths)."""
    cfg = dv3_data.DataConfig.tiny(seconds_per_timestamp=3600, min_candidates=2)
    return dv3_data.generate_batch(cfg, 6, 0, 9)


def write_version(version: str, model: dv3.HstuRanker, example: dv3.Batch, device: str = "cpu") -> str:
    """`model`'s tables (`version`/tables/<name>: keys.npy, vectors.npy) and its network package
    (`version`/network.pt2, exported on `example`): what the sequence recommender loads. `device`:
    where the package runs ("cuda": a CUDA package, its attention our Triton kernel); `model` stays
    where it is."""
    for table, attr in TABLES.items():
        rows = net.as_stored(getattr(model, attr).detach().cpu()).numpy()  # fp16 tables stay fp16
        d = os.path.join(version, "tables", table)
        os.makedirs(d, exist_ok=True)
        np.save(os.path.join(d, "keys.npy"), np.arange(len(rows), dtype=np.int64))
        np.save(os.path.join(d, "vectors.npy"), rows)
    package = os.path.join(version, "network.pt2")
    with torch.no_grad():
        rows = {k: v.to(device) for k, v in net.rows_of(model, example).items()}
        there = model if device == "cpu" else copy.deepcopy(model).to(device)
        net.package(net.HstuNetwork(there).eval(), rows, package)
    return package


def write(repo: str, force: bool = False) -> str:
    version = os.path.join(repo, NAME, "1")
    package = os.path.join(version, "network.pt2")
    if os.path.isfile(package) and not force:
        print(f"{NAME}: {package} exists, skipping (use --force to rebuild)")
        return package
    write_version(version, ranker(), example_batch())
    print(f"{NAME}: tables and the network package -> {version}")
    return package


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", default="models")
    p.add_argument("--force", action="store_true")
    a = p.parse_args(argv)
    write(a.repo, a.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
