#!/usr/bin/env python3
"""Imports the tables of a trained TorchRec EmbeddingBagCollection into the embedding store's
format, as crates/embedding/examples/import_hugectr.rs does for HPS's files.

TorchRec keeps a collection's tables as ``embedding_bags.<table>.weight`` ([rows, dim]) in the
state dict of the collection, or under the path of the model that holds it (DLRM-v2's is
``sparse_arch.embedding_bag_collection.embedding_bags.<table>.weight``). Every such tensor
becomes ``<out>/<table>/keys.npy`` (0 .. rows-1) and ``vectors.npy`` (fp32, or fp16 with
``--fp16``), and the parameters a pooled model names them with are printed.

    python examples/import_torchrec.py model_state.pt --out models/dlrm_v2/1/tables \\
        [--tables t_cat_0,t_cat_1,...] [--fp16]

The state dict is read with ``torch.load(..., weights_only=True)``: tensors only, no code.
Sharded checkpoints (torch.distributed's ShardedTensor) must be gathered first, as TorchRec's
own ``state_dict`` on one rank gives them.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Dict, List

import numpy as np
import torch

KEY = re.compile(r"(?:^|\.)embedding_bags\.([^.]+)\.weight$")


def tables_of(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """``{table: weight}`` for every ``embedding_bags.<table>.weight`` in ``state``, in order."""
    out = {}
    for key, value in state.items():
        m = KEY.search(key)
        if m is None:
            continue
        if not isinstance(value, torch.Tensor) or value.dim() != 2:
            raise ValueError(f"'{key}' is not a [rows, dim] tensor")
        if m.group(1) in out:
            raise ValueError(f"table '{m.group(1)}' appears twice (under '{key}' too)")
        out[m.group(1)] = value
    return out


def write(tables: Dict[str, torch.Tensor], out_dir: str, fp16: bool) -> List[str]:
    lines = []
    for name, weight in tables.items():
        d = os.path.join(out_dir, name)
        os.makedirs(d, exist_ok=True)
        rows = weight.detach().to("cpu", torch.float32).numpy()
        np.save(os.path.join(d, "keys.npy"), np.arange(rows.shape[0], dtype=np.int64))
        np.save(os.path.join(d, "vectors.npy"), rows.astype(np.float16 if fp16 else np.float32))
        lines.append(f"{name}: {rows.shape[0]:,} rows x {rows.shape[1]}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("state_dict", help="a file torch.save wrote: the collection's or its model's state dict")
    p.add_argument("--out", required=True, help="the tables folder (a model version's tables/)")
    p.add_argument("--tables", help="only these tables, in this order (comma-separated)")
    p.add_argument("--fp16", action="store_true", help="store the rows as fp16")
    a = p.parse_args(argv)
    state = torch.load(a.state_dict, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        print(f"error: '{a.state_dict}' holds a {type(state).__name__}, not a state dict", file=sys.stderr)
        return 2
    found = tables_of(state)
    if a.tables:
        wanted = [t.strip() for t in a.tables.split(",") if t.strip()]
        missing = [t for t in wanted if t not in found]
        if missing:
            print(f"error: no table {missing} in '{a.state_dict}' (it has {list(found)})", file=sys.stderr)
            return 2
        found = {t: found[t] for t in wanted}
    if not found:
        print(f"error: '{a.state_dict}' has no embedding_bags.<table>.weight", file=sys.stderr)
        return 2
    for line in write(found, a.out, a.fp16):
        print(line)
    dims = sorted({int(w.shape[1]) for w in found.values()})
    print(f'parameters {{ key: "embedding_table_names" value {{ string_value: "{",".join(found)}" }} }}')
    print(f'parameters {{ key: "embedding_vecsize_per_table" value {{ string_value: '
          f'"{dims[0] if len(dims) == 1 else ",".join(str(int(w.shape[1])) for w in found.values())}" }} }}')
    return 0


if __name__ == "__main__":
    sys.exit(main())
