"""bench/gpu/dlrm_v2_fair.py's arguments, with what follows from them: the precisions and the comma
lists as numbers, the checks that refuse what cannot run, the command line to record."""
import argparse
import os
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", ".."))


def parse(description, argv=None):
    """The parsed arguments, with what follows from them (the precisions and the comma lists as
    numbers, the command line to record); `description`: the command's help text (dlrm_v2_fair.py's
    docstring). Refuses, as argparse does, what cannot run."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default="")
    p.add_argument("--backends", default="")
    p.add_argument("--perf-analyzer", default="")
    p.add_argument("--fixture-bin", default=os.path.join(ROOT, ".carry", "criteo_fixture"))
    p.add_argument("--stream-client", default=os.path.join(ROOT, ".carry", "stream_client"))
    p.add_argument("--aoti-bare", default="/tmp/aoti_bare", help="bench/gpu/aoti_bare.cpp's binary (absent: no package figure)")
    p.add_argument("--libtorch-dir", default="")
    p.add_argument("--results", default=os.path.join(os.environ.get("OUT", "/tmp/out"), "dlrm-v2-fair"))
    p.add_argument("--work", default="/tmp/dlrm_v2_fair")
    p.add_argument("--command", default="", help="the command line to record (run.sh passes its own)")
    p.add_argument("--precisions", default="fp8,fp16", help="network precisions, each served and referenced")
    p.add_argument("--cross", default="triton", choices=["triton", "torch"],
                   help="DCNv2's cross layers in both the served package and the reference module")
    p.add_argument("--scale", type=float, default=1.0, help="MLPerf's rows times this (1.0: 204 M rows, 52 GB fp16)")
    p.add_argument("--batch", type=int, default=16384, help="pairs of the reference's batch and the served max_batch_size")
    p.add_argument("--instances", type=int, default=6, help="the served model's KIND_GPU instances")
    p.add_argument("--big-pairs", type=int, default=8192, help="pairs of one served request (MLPerf's Offline shape)")
    p.add_argument("--big-concurrency", default="8,24", help="perf_analyzer's requests in flight (the headline's: 8)")
    p.add_argument("--stream-concurrency", default="24", help="the endless stream's requests in flight (0: none)")
    p.add_argument("--served-budget-s", type=float, default=150.0, help="dlrm_v2_perf.py's --budget-s for each served run")
    p.add_argument("--served-arg", action="append", default=[], metavar="ARG",
                   help="one more argument for every dlrm_v2_perf.py run (repeatable)")
    p.add_argument("--streams", default="2,3,6", help="the reference's CUDA streams when overlapped")
    p.add_argument("--iters", type=int, default=120, help="the reference's batches per timed window")
    p.add_argument("--repeats", type=int, default=3, help="timed windows per figure (the median kept)")
    p.add_argument("--alpha", type=float, default=1.05, help="Zipf exponent of every table's keys (as served)")
    p.add_argument("--deadline-s", type=float, default=550.0,
                   help="phases that would not end by this many seconds from the start are skipped (printed)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: the reference phase alone, a test")
    p.add_argument("--skip-served", action="store_true", help="no served runs (the reference and packages only)")
    p.add_argument("--report-only", default="", metavar="DIR", help="README.md and fair.png again from DIR/results.json")
    # the workers this script starts
    p.add_argument("--export-worker", nargs=3, metavar=("PRECISION", "WORK", "MAX_BATCH"), help=argparse.SUPPRESS)
    p.add_argument("--reference-worker", metavar="JSON", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.precision_list = [x.strip() for x in a.precisions.split(",") if x.strip()]
    if not a.precision_list or any(x not in ("fp8", "fp16") for x in a.precision_list):
        p.error(f"--precisions: a comma list of fp8 and fp16, not {a.precisions!r}")
    ints = lambda s: [int(x) for x in str(s).split(",") if x.strip() and int(x) > 0]  # noqa: E731
    a.stream_list, a.big_list, a.served_streams = ints(a.streams), ints(a.big_concurrency), ints(a.stream_concurrency)
    if not a.stream_list:
        p.error("--streams: at least one number of streams")
    if a.batch % a.big_pairs:
        p.error("--batch must be a multiple of --big-pairs (the served executions are whole requests)")
    if a.device == "cpu" and "fp8" in a.precision_list and a.reference_worker is None and not a.report_only:
        p.error("--device cpu: FP8 needs a GPU (--precisions fp16)")
    if (not a.report_only and a.reference_worker is None and a.export_worker is None and a.device == "cuda"
            and not a.skip_served and not (a.server and a.backends and a.perf_analyzer)):
        p.error("the served runs need --server, --backends and --perf-analyzer (run.sh passes them)")
    a.command = a.command or " ".join([os.path.relpath(sys.argv[0], ROOT)] + (argv if argv is not None else sys.argv[1:]))
    return a
