#!/usr/bin/env python3
"""TorchRec's KeyedJaggedTensor as a request of the embedding store's pooled model
(docs/torchrec.md).

A KJT lays its ids out key-major: every sample's ids of the first feature, then of the next;
``lengths()`` is ``[features × samples]``. The pooled model takes a request's samples one after
the other instead: ``KEYS`` a sample's bags table after table, ``LENGTHS`` ``[samples × tables]``.
Sample-major is what lets Triton batch such requests by putting them end to end, with no
rearranging on the server; this module does the one rearranging, on the client.

    from torchrec_client import kjt_inputs, infer_kjt
    pooled = infer_kjt(client, "ebc", kjt, features)   # [samples, tables, dim], numpy

``features`` names the KJT key that feeds each of the model's tables, in the model's table order
(``embedding_table_names``); for a collection, ``features_of(ebc)`` gives them. Needs numpy and
tritonclient; a KJT's tensors are read with ``.numpy()`` (torch itself is not imported).
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np


def features_of(ebc) -> List[str]:
    """The feature of each table of a TorchRec EmbeddingBagCollection, in its tables' order:
    the served model's tables are imported in that order (examples/import_torchrec.py)."""
    out = []
    for config in ebc.embedding_bag_configs():
        if len(config.feature_names) != 1:
            raise ValueError(f"table '{config.name}' serves features {list(config.feature_names)}: the pooled "
                             "model takes one feature a table (import a shared table once per feature)")
        out.append(config.feature_names[0])
    return out


def sample_major(keys: Sequence[str], values: np.ndarray, lengths: np.ndarray,
                 features: Sequence[str]) -> Dict[str, np.ndarray]:
    """A key-major jagged batch (a KJT's keys, values and lengths) as the pooled model's inputs:
    ``KEYS`` int64 ``[1, ids]`` and ``LENGTHS`` int32 ``[1, samples × tables]``, the features
    in ``features``' order (ids of keys not named there are left out)."""
    keys = list(keys)
    values = np.asarray(values).reshape(-1)
    lengths = np.asarray(lengths).reshape(-1).astype(np.int64)
    if not keys:
        raise ValueError("the KJT has no keys")
    if lengths.size % len(keys):
        raise ValueError(f"lengths holds {lengths.size} entries for {len(keys)} keys: not one per key and sample")
    samples = lengths.size // len(keys)
    if samples == 0:
        raise ValueError("the KJT holds no samples")
    if (lengths < 0).any():
        raise ValueError("lengths holds a negative length")
    if int(lengths.sum()) != values.size:
        raise ValueError(f"lengths sum to {int(lengths.sum())} but values holds {values.size} ids")
    missing = [f for f in features if f not in keys]
    if missing:
        raise ValueError(f"the KJT has no feature {missing} (its keys are {keys})")
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).reshape(len(keys), samples)
    counts = lengths.reshape(len(keys), samples)
    rows = [keys.index(f) for f in features]
    # bag (sample s, table t) in sample-major order: the KJT's bag (rows[t], s)
    bag_start = starts[rows].T.reshape(-1)
    bag_len = counts[rows].T.reshape(-1)
    ends = np.cumsum(bag_len)
    total = int(ends[-1]) if ends.size else 0
    # each id's place in values: its bag's start plus its place in the bag
    index = np.repeat(bag_start - (ends - bag_len), bag_len) + np.arange(total)
    return {"KEYS": values[index].astype(np.int64).reshape(1, -1),
            "LENGTHS": bag_len.astype(np.int32).reshape(1, -1)}


def kjt_inputs(kjt, features: Sequence[str]) -> Dict[str, np.ndarray]:
    """A TorchRec KeyedJaggedTensor as one request of the pooled model (see sample_major)."""
    if kjt.weights_or_none() is not None:
        raise ValueError("a weighted KJT (per-id weights) is not served: the pooled model sums or averages "
                         "its rows unweighted")
    if getattr(kjt, "variable_stride_per_key", lambda: False)():
        raise ValueError("a KJT with a different batch size per key is not served: give every key every sample")
    return sample_major(kjt.keys(), kjt.values().cpu().numpy(), kjt.lengths().cpu().numpy(), features)


def infer_kjt(client, model: str, kjt, features: Sequence[str], output: str = "OUTPUT0") -> np.ndarray:
    """Sends ``kjt`` to ``model`` as one request through ``client`` (tritonclient.http or .grpc)
    and returns the pooled rows, ``[samples, tables, dim]``."""
    if type(client).__module__.startswith("tritonclient.grpc"):
        import tritonclient.grpc as tc
    else:
        import tritonclient.http as tc
    inputs = []
    for name, array in kjt_inputs(kjt, features).items():
        t = tc.InferInput(name, list(array.shape), "INT64" if array.dtype == np.int64 else "INT32")
        t.set_data_from_numpy(array)
        inputs.append(t)
    result = client.infer(model, inputs, outputs=[tc.InferRequestedOutput(output)])
    return result.as_numpy(output)
