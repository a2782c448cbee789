#!/usr/bin/env python3
"""Fair ratios for MLPerf DLRM-v2 (issue 65, point 3): the served model against a bare PyTorch
reference of the same precision and the same overlap, all in ONE device call:

    bash bench/gpu/run.sh dlrm-v2-fair [options]        (carry .carry and .carry_pa)

For each precision of --precisions (default fp8,fp16), at one batch (--batch, 16,384 pairs):

  served     bench/gpu/dlrm_v2_perf.py as the headline run uses it (every row in HBM, fp16 rows,
             the network an AOTInductor package with the cross layers as our Triton kernels,
             --instances KIND_GPU instances, CUDA graphs, dynamic batching), in MLPerf's Offline
             shape: requests of --big-pairs pairs (8,192; two make one execution of 16,384),
             perf_analyzer (gRPC sync, CUDA shared memory) at --big-concurrency and the endless
             stream (examples/stream_client.rs) at --stream-concurrency; its exactness check gives
             the served predictions' max |diff| against the PyTorch fp32 network.
  reference  the same network module the package is exported from (same precision, same Triton
             cross-layer kernels), torch.compile'd (default mode, static shapes) and run as CUDA
             graphs, plus the bare pooled lookup: F.embedding_bag (sum) over the same 26 fp16
             tables at --scale (1.0: 204 M rows, 52 GB in HBM), stacked to [batch, 26, 128].
             Timed by CUDA events: the network alone, the lookup alone, lookup then network one
             after the other on one stream, and overlapped on S CUDA streams (--streams, each
             stream replaying its own graphs of lookup + network, several batches in flight as
             the served instances are), and the ideal overlap batch / max(lookup, network).
             Accuracy: the timed network graph on the served exactness check's 4,320 pairs (the
             same keys: dlrm_v2_perf.draw_pairs, seed 46), their rows pooled by F.embedding_bag
             from the fixture's own rows, against the PyTorch fp32 network on the float64 sums.
  package    the served package's network alone, its CUDA-graph replays by bench/gpu/aoti_bare.

Phases (one call; the device's limit is 600 s): the fixture (criteo_fixture into /dev/shm) and
the packages' exports (one child process each, at once), then the first precision served, the
references of all precisions, the other precisions served, the packages alone, the report. A
served run reuses the package exported for it (recsys.networks.export_aoti's key). Ratios
served / reference for each precision, network TFLOP/s against that precision's dense peak
(H100/H200 SXM: 989 fp16, 1979 FP8), the accuracy beside every figure.

Writes --results: README.md (table, plot), results.json, fair.png, call.tgz (run.sh's host.txt,
moved in; --work's gpu_dmon.log where run.sh's nvidia-smi dmon writes it; both served runs' own
folders); run.sh adds console.log. Five files: the results tree keeps few (its README).

Also:  --report-only DIR   the README and plot again from DIR/results.json
       --device cpu        the reference phase alone on the CPU at a small --scale (a test of the
                           code path: no streams, no graphs, no compile, fp16/fp32 only)
"""
# This file is the command and the order of its phases; what each phase does lives in
# bench/gpu/recsys/dlrm_v2_fair_*.py, one concern a module (its __init__.py lists them), beside the
# modules dlrm_v2_perf.py's steps live in.
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))
# none of these imports torch or numpy: --help, --report-only and the driver run without them
from recsys import dlrm_v2_fair_options  # noqa: E402
from recsys.dlrm_v2_fair_phases import (finish, fixture_and_exports, packages, reference, report_only,  # noqa: E402
                                        serve, start)
from recsys.dlrm_v2_fair_reference import reference_worker  # noqa: E402
from recsys.dlrm_v2_fair_served import export_worker  # noqa: E402


def parse(argv=None):
    """The command's arguments (recsys/dlrm_v2_fair_options.py), its help this file's docstring."""
    return dlrm_v2_fair_options.parse(__doc__, argv)


def main():
    a = parse()
    # the child processes the driver starts: one package's export, the references
    if a.export_worker:
        return export_worker(a)
    if a.reference_worker:
        return reference_worker(a)
    if a.report_only:
        return report_only(a.report_only)
    out = start(a)
    served = a.device == "cuda" and not a.skip_served
    works = {p: os.path.join(a.work, p) for p in a.precision_list}
    # 1. the fixture and the packages, at once
    if served or a.device == "cuda":
        served = fixture_and_exports(a, out, works, served)
    # 2. the first precision served, the references of all precisions (one child process), the
    # other precisions served; 3. the packages alone
    if served:
        serve(a, out, works, a.precision_list[0])
    reference(a, out)
    if served:
        for p in a.precision_list[1:]:
            serve(a, out, works, p)
    if a.device == "cuda":
        packages(a, out, works)
    # 4. the figures, the report, call.tgz
    return finish(a, out)


if __name__ == "__main__":
    sys.exit(main())
