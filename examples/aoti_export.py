#!/usr/bin/env python3
"""PyTorch 2 AOTInductor packages (``.pt2``) of the example models, for the rust backend's
``aoti`` engine (docs/pytorch2.md).

``package(module, example_inputs, path, ...)`` is the recipe: ``torch.export.export`` with a
dynamic batch dimension (``torch.export.Dim`` on dimension 0 of every input), then
``torch._inductor.aoti_compile_and_package`` with the metadata the engine reads to check the
torch release and to auto-complete a config:

  * ``triton_rust.torch_version``: the exporting torch's ``torch.__version__``;
  * ``triton_rust.inputs`` / ``triton_rust.outputs``: JSON lists, in the package's flat order,
    of ``{"name", "dtype", "shape"}`` (dtype as torch names it without ``torch.``, ``-1`` for a
    dynamic dimension), and for an input that indexes an embedding table ``"range": [0, rows]``
    (``index_ranges``: the engine refuses a request with a value outside it). Names as
    Triton's PyTorch backend spells them: ``INPUT__i`` when the exported call takes positional
    arguments only, else ``ARGS[i]`` and ``KWARGS[name]``; ``OUTPUT__i`` for a tensor, tuple or
    list result, ``RESULT[key]`` for a dict.

The example models are the TorchScript twins' architectures and fixed-seed weights
(``examples/torch_models.py``: ResNet50, BERT QA; ``examples/recommenders.py``: the dense part
of DLRM, DCNv2, Wide&Deep), so a package equals eager PyTorch of the same module:

    python examples/aoti_export.py --repo models [--models resnet50_aoti,...] [--force]
    python examples/aoti_export.py --repo models_gpu --device cuda --half --models resnet50_aoti,bert_large_aoti

writes ``<repo>/<name>/1/model.pt2``; ``dlrm_aoti`` is the recommender as one model (engine
"recommender"): ``<repo>/dlrm_aoti/1/tables/t*/`` (the embedding tables, as
``examples/recommenders.py`` writes ``dlrm_sparse``'s) and ``<repo>/dlrm_aoti/1/dense.pt2``.
The default set (``CPU_MODELS``) is what CI builds, about 30-60 s of compiling each on two
cores; ``bert_large_aoti`` is for a GPU (``--device cuda --half``; ``bench/gpu/aoti_perf.py``
exports BERT-large and ResNet50 there through ``package``).

FastPitch (``fastpitch_aoti``, in the default set): its output length is data-dependent (the mel
length is the sum of the rounded predicted durations). The TorchScript model reads it on the
host (``.item()``) and fills the frames item by item (``repeat_interleave`` in a Python loop
over the batch), which ``torch.export`` cannot trace with a dynamic batch. ``FastPitchExport``
(FastPitch's own modules and weights) writes the length regulator without the loop: each output
frame finds its symbol with ``searchsorted`` over the cumulative durations and gathers it; the
frame count is ``.item()`` of the longest length, an unbacked size bounded with ``torch._check``
(2 to symbols x max_duration: Inductor's bmm lowering cannot decide "frames == 1", so a batch
whose longest item has one frame gets a second, zero frame). Inductor (torch 2.11) cannot lower
a convolution over an unbacked size (``kernel/conv.py`` asks ``size_hints`` of its strides:
"Cannot convert symbols to int"), so the decoder's convolutions, the only ones over the frames,
are ``ShiftedConv1d``: the same function as matrix products of shifted frames. The package
equals the TorchScript twin within float rounding (``OUTPUT__0`` [batch, 80, -1]); its CUDA
package has not been built or checked on a GPU.
"""
from __future__ import annotations

import argparse
import copy
import inspect
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils import _pytree as pytree

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import recommenders  # noqa: E402
import torch_models  # noqa: E402
from model_files import link_spilled, placed  # noqa: E402

TORCH_VERSION_KEY = "triton_rust.torch_version"
INPUTS_KEY = "triton_rust.inputs"
OUTPUTS_KEY = "triton_rust.outputs"

# ------------------------------------------------------------------ metadata


def _leaf_positions(tree: Any) -> List[int]:
    return [i for i in pytree.tree_leaves(tree) if isinstance(i, int)]


def _keyed(entries: Dict[str, Any], kind: str, what: str) -> Dict[int, str]:
    """{flat position: "KIND[key]"} of a dict of leaf positions, each entry one tensor."""
    named = {}
    for key, sub in entries.items():
        leaves = _leaf_positions(sub)
        if len(leaves) != 1:
            raise ValueError(f"{what} '{key}' is {len(leaves)} tensors; {kind}[{key}] names one")
        named[leaves[0]] = f"{kind}[{key}]"
    return named


def io_names(exported: torch.export.ExportedProgram) -> Tuple[List[str], List[str]]:
    """The Triton names of the package's flat inputs and outputs, from its call spec."""
    in_spec, out_spec = exported.call_spec.in_spec, exported.call_spec.out_spec
    args, kwargs = pytree.tree_unflatten(list(range(in_spec.num_leaves)), in_spec)
    if kwargs:
        inputs = {i: f"ARGS[{i}]" for i in _leaf_positions(args)}
        inputs.update(_keyed(kwargs, "KWARGS", "keyword argument"))
    else:
        inputs = {i: f"INPUT__{i}" for i in range(in_spec.num_leaves)}
    result = pytree.tree_unflatten(list(range(out_spec.num_leaves)), out_spec)
    if isinstance(result, dict):
        outputs = _keyed(result, "RESULT", "result entry")
    else:
        outputs = {i: f"OUTPUT__{i}" for i in range(out_spec.num_leaves)}
    return [inputs[i] for i in sorted(inputs)], [outputs[i] for i in sorted(outputs)]


def _tensor_entry(name: str, val: Any) -> Dict[str, Any]:
    if not isinstance(val, torch.Tensor):
        raise ValueError(f"'{name}' is a {type(val).__name__}, not a tensor: the engine serves tensors")
    shape = [int(d) if isinstance(d, int) else -1 for d in val.shape]  # SymInt: dynamic
    return {"name": name, "dtype": str(val.dtype).removeprefix("torch."), "shape": shape}


# what an index passes through on its way from an input to a table, unchanged in value
_SAME_VALUES = ("aten.to.", "aten._to_copy.", "aten.clone.", "aten.view.", "aten.reshape.", "aten.flatten.",
                "aten.unsqueeze.", "aten.squeeze.", "aten.slice.", "aten.select.", "aten.expand.",
                "aten.contiguous.", "aten.alias.", "aten.permute.", "aten.transpose.", "aten.t.")


def index_ranges(exported: torch.export.ExportedProgram) -> Dict[str, Tuple[int, int]]:
    """``{input placeholder: (0, rows)}`` for each input whose values index an embedding table
    (through casts and views): the values the table has rows for. An index outside them fails
    inside the compiled kernel; in a CPU package that check throws inside an OpenMP region,
    which ends the process, so the engine checks these ranges before it runs a batch."""
    ranges: Dict[str, Tuple[int, int]] = {}
    for node in exported.graph.nodes:
        if node.op != "call_function" or str(node.target) != "aten.embedding.default":
            continue
        weight, index = node.args[0], node.args[1]
        while index.op == "call_function" and str(index.target).startswith(_SAME_VALUES):
            index = index.args[0]
        if index.op != "placeholder" or "val" not in weight.meta:
            continue
        rows = int(weight.meta["val"].shape[0])
        lo, hi = ranges.get(index.name, (0, rows))
        ranges[index.name] = (lo, min(hi, rows))
    return ranges


def metadata(exported: torch.export.ExportedProgram) -> Dict[str, str]:
    """The ``triton_rust.*`` metadata of an exported program (see the module doc)."""
    from torch.export.graph_signature import InputKind, OutputKind

    in_names, out_names = io_names(exported)
    nodes = {n.name: n for n in exported.graph.nodes if n.op == "placeholder"}
    user_in = [s.arg.name for s in exported.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    out_node = next(n for n in exported.graph.nodes if n.op == "output")
    user_out = [arg for arg, s in zip(out_node.args[0], exported.graph_signature.output_specs)
                if s.kind == OutputKind.USER_OUTPUT]
    if len(user_in) != len(in_names) or len(user_out) != len(out_names):
        raise ValueError(f"the call spec has {len(in_names)} inputs and {len(out_names)} outputs, the graph "
                         f"{len(user_in)} and {len(user_out)}: only tensor arguments and results are served")
    inputs = [_tensor_entry(name, nodes[n].meta["val"]) for name, n in zip(in_names, user_in)]
    ranges = index_ranges(exported)
    for entry, n in zip(inputs, user_in):
        if n in ranges:
            entry["range"] = list(ranges[n])
    outputs = [_tensor_entry(name, arg.meta["val"]) for name, arg in zip(out_names, user_out)]
    return {TORCH_VERSION_KEY: torch.__version__, INPUTS_KEY: json.dumps(inputs), OUTPUTS_KEY: json.dumps(outputs)}


# ------------------------------------------------------------------ export


def package(module: nn.Module, example_inputs: Sequence[torch.Tensor], path: str, *, dynamic_batch: bool = True,
            max_batch: int = 1 << 17, device: str = "cpu", kwargs: Optional[Dict[str, torch.Tensor]] = None,
            half: bool = False, inductor_configs: Optional[Dict[str, Any]] = None) -> Dict[str, str]:
    """Export ``module`` called as ``module(*example_inputs, **kwargs)`` and write the
    AOTInductor package ``path``; returns the ``triton_rust.*`` metadata written into it.

    ``dynamic_batch``: dimension 0 of every input is ``torch.export.Dim("batch", min=1,
    max=max_batch)`` (the example batch must be at least 2: torch.export specialises a size
    of 1). The example batch is also Inductor's size hint for that dimension: the generated
    GPU kernels' block sizes are chosen for it, so a GPU package is best exported with a batch
    of the size it will mostly run (``example_batch``). ``device``: where the module and the
    inputs are moved (``"cuda"`` makes a CUDA package for this machine's GPU). ``half``: FP16
    weights and floating-point inputs.
    ``inductor_configs``: Inductor's settings for the compile (e.g. ``{"max_autotune": True}``),
    beside the metadata."""
    kwargs = dict(kwargs or {})
    module = module.eval().to(device)
    example = [x.to(device) for x in example_inputs]
    kwargs = {k: v.to(device) for k, v in kwargs.items()}
    if half:
        module = module.half()
        example = [x.half() if x.is_floating_point() else x for x in example]
        kwargs = {k: v.half() if v.is_floating_point() else v for k, v in kwargs.items()}
    dynamic_shapes = None
    if dynamic_batch:
        for x in [*example, *kwargs.values()]:
            if x.shape[0] < 2:
                raise ValueError(f"example batch {x.shape[0]}: use at least 2 for a dynamic batch dimension")
        batch = torch.export.Dim("batch", min=1, max=max_batch)
        bound = inspect.signature(module.forward).bind(*example, **kwargs)
        dynamic_shapes = {arg: {0: batch} for arg in bound.arguments}
    with torch.no_grad():
        exported = torch.export.export(module, tuple(example), kwargs=kwargs or None, dynamic_shapes=dynamic_shapes)
        meta = metadata(exported)
        size = sum(t.numel() * t.element_size() for t in module.state_dict().values())
        where = placed(path, size, "AOTInductor package")
        # The package's folders are named after its file, so it is written under its own name
        # in a folder beside it, then moved.
        with tempfile.TemporaryDirectory(prefix=".export-", dir=os.path.dirname(os.path.abspath(where))) as tmp:
            tmp_file = os.path.join(tmp, os.path.basename(path))
            torch._inductor.aoti_compile_and_package(exported, package_path=tmp_file,
                                                     inductor_configs={**(inductor_configs or {}),
                                                                       "aot_inductor.metadata": meta})
            os.replace(tmp_file, where)
        link_spilled(path, where)
    return meta


def example_batch(asked: int, largest: int) -> int:
    """The batch to export a GPU package with: `asked`, else the largest it will serve (the size
    hint Inductor tunes for, see ``package``); at least 2, as torch.export specialises a size of 1."""
    return max(2, asked or largest)


def parse_inductor_configs(pairs: Sequence[str]) -> Dict[str, Any]:
    """``["max_autotune=1", "coordinate_descent_tuning=true"]`` as Inductor settings: values
    that read as JSON (numbers, true/false) are taken as such, others as text."""
    out: Dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"Inductor setting {pair!r}: KEY=VALUE")
        try:
            out[key] = json.loads(text.lower() if text.lower() in ("true", "false") else text)
        except json.JSONDecodeError:
            out[key] = text
    return out


# ------------------------------------------------------------------ FastPitch


class ShiftedConv1d(nn.Module):
    """A ``Conv1d`` (stride 1, dilation 1, 'same' padding, one group) as matrix products of
    shifted frames: output frame t is the bias plus, for each tap k, weight[:, :, k] times
    input frame t + k - padding (zero outside). The same function as the convolution; what
    Inductor lowers for it is a matmul, which takes a frame count it only knows at run time
    (its convolution lowering does not, torch 2.11)."""

    def __init__(self, conv: nn.Conv1d):
        super().__init__()
        k = conv.kernel_size[0]
        if conv.stride != (1,) or conv.dilation != (1,) or conv.groups != 1 or conv.padding != (k // 2,) or k % 2 != 1:
            raise ValueError(f"{conv}: only odd kernels with stride 1, dilation 1, one group and 'same' padding")
        self.pad = k // 2
        # [k, in, out]: tap k's matrix, applied as frames [.., in] @ weight[k]
        self.weight = nn.Parameter(conv.weight.detach().permute(2, 1, 0).contiguous())
        self.bias = nn.Parameter(conv.bias.detach().clone()) if conv.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [B, C_in, T] as Conv1d takes it
        frames = x.shape[2]
        xt = F.pad(x.transpose(1, 2), (0, 0, self.pad, self.pad))  # [B, T + 2 pad, C_in]
        y = xt[:, 0:frames] @ self.weight[0]
        for k in range(1, self.weight.shape[0]):
            y = y + xt[:, k:k + frames] @ self.weight[k]
        if self.bias is not None:
            y = y + self.bias
        return y.transpose(1, 2)


class FastPitchExport(nn.Module):
    """FastPitch (``torch_models.FastPitch``, its weights) with a length regulator that
    ``torch.export`` can trace: no loop over the batch, the frame count an unbacked size; the
    decoder's convolutions (over that frame count) as ``ShiftedConv1d``."""

    def __init__(self, fp: torch_models.FastPitch):
        super().__init__()
        self.fp = copy.deepcopy(fp)
        for blk in self.fp.decoder:
            blk.conv1 = ShiftedConv1d(blk.conv1)
            blk.conv2 = ShiftedConv1d(blk.conv2)

    def forward(self, ids: torch.Tensor):
        fp = self.fp
        x, reps, mel_len, dur, pitch = fp.encode(ids)
        b, t = ids.shape
        # at least 2 frames: Inductor's bmm lowering cannot decide "frames == 1" of an unbacked
        # size; a batch whose longest item has one frame gets a second, zero (masked) frame
        frames = torch.clamp(mel_len.max(), min=2).item()
        torch._check(frames >= 2)
        torch._check(frames <= t * fp.max_duration)
        ends = torch.cumsum(reps, dim=1)  # frame j of an item is its symbol searchsorted(ends, j, right)
        pos = torch.arange(frames, device=x.device)
        src = torch.searchsorted(ends, pos.unsqueeze(0).expand(b, frames).contiguous(), right=True)
        y = torch.gather(x, 1, src.clamp(max=t - 1).unsqueeze(-1).expand(b, frames, x.shape[2]))
        return fp.decode(y, mel_len, frames), mel_len.unsqueeze(1), dur, pitch


def check_fastpitch(batch: int = 3, seed: int = 11) -> float:
    """Max |FastPitchExport - FastPitch| in eager mode (the rewrite is the same function)."""
    fp = torch_models.make("fastpitch")
    ids = torch_models.fastpitch_inputs(batch, seed=seed, max_len=48)
    with torch.no_grad():
        want = fp(ids)
        got = FastPitchExport(fp).eval()(ids)
    return max(float((g.double() - w.double()).abs().max()) for g, w in zip(got, want))


# ------------------------------------------------------------------ the example models

ROWS = 1000  # rows per table of the recommenders (examples/recommenders.py's default)


def _bert_inputs(batch: int, seq: int = 384):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 30522, (batch, seq), generator=g, dtype=torch.int32)
    seg = torch.zeros(batch, seq, dtype=torch.int32)
    seg[:, seq // 2:] = 1
    mask = torch.ones(batch, seq, dtype=torch.int32)
    mask[-1, seq * 3 // 4:] = 0
    return ids, seg, mask


def _dense_inputs(model: recommenders.Recommender, batch: int):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, recommenders.NUM_DENSE, generator=g),
            torch.randn(batch, recommenders.NUM_TABLES, model.dim, generator=g))


def recommender(name: str) -> recommenders.Recommender:
    """``dlrm``/``dcnv2``/``wide_deep`` with the weights of ``models/<name>_dense``."""
    return recommenders.make(name, [ROWS] * recommenders.NUM_TABLES)


def _dense(name: str):
    model = recommender(name)
    return recommenders.DensePart(model), _dense_inputs(model, 4), 131072 if name == "wide_deep" else 65536


# name -> (module, example inputs, max batch); the module is the TorchScript twin's
EXAMPLES = {
    "resnet50_aoti": lambda: (torch_models.make("resnet50_pt"), (torch.randn(2, 3, 224, 224),), 128),
    "bert_small_aoti": lambda: (torch_models.make("bert_small_pt"), _bert_inputs(2), 16),
    "bert_large_aoti": lambda: (torch_models.make("bert_large_pt"), _bert_inputs(2), 16),
    "dlrm_dense_aoti": lambda: _dense("dlrm"),
    "dcnv2_dense_aoti": lambda: _dense("dcnv2"),
    "wide_deep_dense_aoti": lambda: _dense("wide_deep"),
    "dlrm_aoti": lambda: _dense("dlrm"),
    "fastpitch_aoti": lambda: (FastPitchExport(torch_models.make("fastpitch")), (torch_models.fastpitch_inputs(2),), 64),
}
CPU_MODELS = ("resnet50_aoti", "bert_small_aoti", "dlrm_dense_aoti", "dcnv2_dense_aoti", "wide_deep_dense_aoti",
              "dlrm_aoti", "fastpitch_aoti")


def reference(name: str) -> nn.Module:
    """The eager module a package of ``name`` was exported from (fp32, CPU)."""
    return EXAMPLES[name]()[0].eval()


def package_file(repo: str, name: str) -> str:
    return os.path.join(repo, name, "1", "dense.pt2" if name == "dlrm_aoti" else "model.pt2")


def write_tables(model: recommenders.Recommender, version_dir: str) -> None:
    """The embedding tables in the store's format, as ``recommenders.export`` writes them."""
    for i, e in enumerate(model.embeddings):
        d = os.path.join(version_dir, "tables", f"t{i}")
        os.makedirs(d, exist_ok=True)
        np.save(os.path.join(d, "keys.npy"), np.arange(e.num_embeddings, dtype=np.int64))
        np.save(os.path.join(d, "vectors.npy"), e.weight.detach().numpy().astype(np.float32))


def export(repo: str, name: str, device: str = "cpu", half: bool = False) -> Dict[str, str]:
    module, example, max_batch = EXAMPLES[name]()
    path = package_file(repo, name)
    if name == "dlrm_aoti":
        write_tables(module.model, os.path.dirname(path))
    return package(module, example, path, max_batch=max_batch, device=device, half=half)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", default="models")
    p.add_argument("--models", default=",".join(CPU_MODELS), help=f"of {', '.join(EXAMPLES)}")
    p.add_argument("--device", default="cpu", help="cpu, or cuda for a package of this machine's GPU")
    p.add_argument("--half", action="store_true", help="FP16 weights and inputs (GPU packages)")
    p.add_argument("--force", action="store_true")
    a = p.parse_args(argv)
    for name in a.models.split(","):
        if name not in EXAMPLES:
            p.error(f"unknown model '{name}' (known: {', '.join(EXAMPLES)})")
        path = package_file(a.repo, name)
        if os.path.exists(path) and not a.force:
            print(f"{name}: {path} exists, skipping (use --force to rebuild)")
            continue
        start = time.monotonic()
        meta = export(a.repo, name, a.device, a.half)
        print(f"{name}: AOTInductor package ({a.device}{', fp16' if a.half else ''}) -> {path} "
              f"in {time.monotonic() - start:.0f} s; inputs {meta[INPUTS_KEY]}, outputs {meta[OUTPUTS_KEY]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
