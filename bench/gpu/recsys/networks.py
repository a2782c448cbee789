"""The recommender's dense network: built from examples/recommenders.py (fp16 behind fp32
inputs and output), scripted for the torch engine, or exported as a CUDA AOTInductor package
(examples/aoti_export.py) for the single model."""
import json
import os
import time

from .fixture import TABLES

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "..")


PRECISIONS = ("fp32", "fp16", "fp8", "fp8-rows")


def dense_network(name, precision, device, interaction="cat", cross="torch", calibration=None):
    """The recommender's dense network as an nn.Module (fp16: behind fp32 inputs and output);
    `interaction`: DLRM's form, `cross`: DCNv2's (examples/recommenders.py). `fp8`, `fp8-rows`:
    the fp16 network with its large linear layers in FP8 (examples/fp8.py: per-tensor scales, the
    inputs' calibrated on `calibration` (dense, embeddings); per-row scales), GPU only."""
    import recommenders
    from all_models import HalfDense  # the fp16 network behind fp32 inputs, as the six-model run serves it

    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")
    # the dense part does not depend on the tables' sizes: one-row tables keep it small
    # an FP8 network is calibrated in its torch form (the kernels skip the layers' own calls, which
    # calibration watches), then given its kernels
    fp8_kernels = precision.startswith("fp8") and name == "dcnv2" and cross == "triton"
    options = {"dlrm": {"interaction": interaction},
               "dcnv2": {"cross": "torch" if fp8_kernels else cross}}.get(name, {})
    part = recommenders.DensePart(recommenders.make(name, [1] * TABLES, **options))
    m = part if precision == "fp32" else HalfDense(part)
    m = m.to(device).eval()
    if precision.startswith("fp8"):
        import fp8
        if calibration is None:
            raise ValueError("an fp8 network needs calibration inputs (dense, embeddings)")
        dense, emb = (t.to(device) for t in calibration)
        fp8.to_fp8(m, lambda mod: mod(dense, emb), rows=precision == "fp8-rows")
    if fp8_kernels:
        part.model.triton = True
    return m


def linear_flops(net):
    """(FLOPs of one row's matrix products: 2 x in x out over every linear layer, FP8 or not; the
    number of those layers)."""
    import torch
    import fp8
    linear = [m for m in net.modules() if isinstance(m, (torch.nn.Linear, fp8.Fp8Linear))]
    return sum(2 * m.in_features * m.out_features for m in linear), len(linear)


def dense_module(name, precision, device, interaction="cat"):
    import torch
    # a script cannot hold the Triton kernels: TorchScript runs the same numbers in the torch forms
    return torch.jit.script(dense_network(name, precision, device, "split" if interaction == "triton" else interaction))


def model_settings(pairs, name):
    """The `--inductor` settings for model `name`: KEY=VALUE for every model, MODEL:KEY=VALUE for
    that model alone."""
    out = []
    for pair in pairs:
        model, sep, rest = pair.partition(":")
        if sep and "=" not in model:
            if model == name:
                out.append(rest)
        else:
            out.append(pair)
    return out


def examples_digest():
    """A digest of the model code a package is exported from (examples/*.py)."""
    import hashlib
    h = hashlib.sha256()
    folder = os.path.join(ROOT, "examples")
    for f in sorted(os.listdir(folder)):
        if f.endswith(".py"):
            with open(os.path.join(folder, f), "rb") as src:
                h.update(f.encode() + src.read())
    return h.hexdigest()[:16]


def export_aoti(name, a, rows_type, max_batch):
    """The recommender's dense network as a CUDA AOTInductor package (examples/aoti_export.py),
    exported here with the same weights as the TorchScript file; returns its path."""
    import torch
    import aoti_export
    net = dense_network(name, a.precision, "cuda", a.aoti_dlrm_interaction, a.dcnv2_cross,
                        getattr(a, "calibration", None))
    emb = torch.float16 if rows_type == "TYPE_FP16" else torch.float32
    eb = aoti_export.example_batch(a.example_batch, max_batch)
    example = (torch.rand(eb, 13, device="cuda"), (torch.randn(eb, TABLES, a.dim, device="cuda") * 0.05).to(emb))
    path = os.path.join(a.work, f"{name}_dense.pt2")
    t0 = time.time()
    settings = model_settings(a.inductor, name)
    if a.cross_config:
        os.environ["TRITON_RUST_CROSS"] = a.cross_config  # read when the cross-layer kernel is traced
    cross = a.dcnv2_cross
    if cross == "triton":
        import triton_kernels
        cross += " " + (triton_kernels.cross_fp8_config_text() if a.precision == "fp8"
                        else triton_kernels.cross_config_text())
    form = {"dlrm": f", interaction {a.aoti_dlrm_interaction}", "dcnv2": f", cross {cross}"}.get(name, "")
    # everything the package depends on: a later run on this machine with the same settings
    # (another protocol, say) serves the package already here instead of exporting it again
    key = json.dumps({"model": name, "precision": a.precision, "rows": rows_type, "form": form, "example_batch": eb,
                      "max_batch": max_batch, "inductor": settings, "torch": torch.__version__,
                      "examples": examples_digest()}, sort_keys=True)
    reused = False
    if os.path.exists(path) and os.path.exists(path + ".key"):
        with open(path + ".key") as f:
            reused = f.read() == key
    if not reused:
        with torch.no_grad():
            aoti_export.package(net, example, path, dynamic_batch=True, max_batch=max_batch, device="cuda",
                                inductor_configs=aoti_export.parse_inductor_configs(settings))
        with open(path + ".key", "w") as f:
            f.write(key)
    print(f"exported {name}'s network as a CUDA package ({os.path.getsize(path) / 1e6:.0f} MB, batch up to {max_batch}, "
          f"example batch {eb}{form}) "
          + ("earlier on this machine, with the same settings (reused)" if reused else f"in {time.time() - t0:.0f} s")
          + (f"; Inductor settings {settings}" if settings else ""), flush=True)
    del net
    torch.cuda.empty_cache()
    return path
