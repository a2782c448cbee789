"""bench/gpu/dlrm_v2_fair.py's driver, its phases in the order main runs them, each skipped (and
said) where it would not end by --deadline-s: the results folder and the GPU's facts; the fixture
and the packages' exports at once; a precision served (dlrm_v2_perf.py); the references (a child
process); the packages alone (aoti_bare); the report, call.tgz and the console's last lines.
Every phase adds to one dict, `out`, written to results.json as each phase ends."""
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from types import SimpleNamespace

from .clock import T0, phase
from .host_use import gpu_fields
from .dlrm_v2_fair_model import DIM, log
from .dlrm_v2_fair_report import add_figures, peaks_for, summary_lines, write_report
from .dlrm_v2_fair_served import package_path, served_command, served_figures

# the command whose --export-worker and --reference-worker run in child processes
COMMAND = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dlrm_v2_fair.py")
# seconds a phase is expected to take (the driver keeps room for the phases after the one it starts)
SERVED_S = 115             # a served run: its start and pools, the server's load, exactness, stream, 2 perf_analyzer runs
REFERENCE_S = lambda n: 30 + 40 * n  # noqa: E731 - the reference: inputs, tables, then each network
PACKAGE_S = 15             # aoti_bare on one package


def gpu_facts():
    """(the GPU's name, its driver, its memory) from nvidia-smi."""
    return tuple(gpu_fields("unknown GPU,-,-"))


def report_only(folder):
    """--report-only: README.md and fair.png again from folder/results.json."""
    with open(os.path.join(folder, "results.json")) as f:
        out = json.load(f)
    write_report(folder, out)
    log(f"wrote {os.path.join(folder, 'README.md')}")
    return 0


def left(a):
    """Seconds left until --deadline-s."""
    return a.deadline_s - (time.time() - T0)


def save(a, out):
    """results.json, after every phase: a call cut off by its limit keeps what it measured."""
    with open(os.path.join(a.results, "results.json"), "w") as f:
        json.dump(out, f, indent=1)


def mark(out, name, t0):
    """The seconds a phase took, since t0 (results.json's `phases`)."""
    out["phases"][name] = round(time.time() - t0, 1)


def start(a):
    """The results folder without an earlier run's files (run.sh's console.log and host.txt stay),
    the work folder, the GPU's facts and its dense peaks printed: `out`, the results so far."""
    os.makedirs(a.results, exist_ok=True)
    for name in ("README.md", "results.json", "fair.png", "call.tgz"):
        if os.path.exists(os.path.join(a.results, name)):
            os.remove(os.path.join(a.results, name))
    os.makedirs(a.work, exist_ok=True)
    gpu, driver, memory = gpu_facts() if a.device == "cuda" else ("cpu", "-", "-")
    peaks, peak_of = peaks_for(gpu)
    out = {"command": a.command, "gpu": gpu, "driver": driver, "gpu_memory": memory, "peaks_tflops": peaks,
           "peaks_of": peak_of, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "batch": a.batch,
           "big_pairs": a.big_pairs, "instances": a.instances, "cross": a.cross, "scale": a.scale,
           "precisions": a.precision_list, "served": {}, "reference": None, "package": {}, "skipped": [],
           "failures": [], "phases": {}}
    log(f"GPU: {gpu} ({memory}), driver {driver}; peaks (dense, {peak_of}): fp16 {peaks['fp16']:.0f}, "
        f"FP8 {peaks['fp8']:.0f} TFLOP/s")
    for d in ("/dev/shm", "/tmp"):
        if os.path.isdir(d):
            u = shutil.disk_usage(d)
            log(f"  {d}: {u.free / 1e9:.0f} GB free of {u.total / 1e9:.0f} GB")
    return out


def fixture_and_exports(a, out, works, served):
    """The fixture (criteo_fixture, on a thread; only for the served runs) and each precision's
    package exported by a child process of its own, at once. Returns whether the served runs can
    still run (not without the fixture)."""
    phase("the fixture (criteo_fixture) and the packages' exports, at once")
    t0 = time.time()
    fixture = {}
    writer = None
    if served:
        from .fixture import fixture_rows, prepare

        def write_tables():
            try:
                fa = SimpleNamespace(fixture="", scale=a.scale, dim=DIM, work=a.work, fixture_bin=a.fixture_bin,
                                     cache_share=1.0, host_memory="mapped")
                fixture["folder"], _ = prepare(fa, fixture_rows(a.scale))
            except BaseException as e:  # noqa: BLE001 - said below
                fixture["error"] = e

        writer = threading.Thread(target=write_tables, name="fixture")
        writer.start()
    exports = {p: subprocess.Popen([sys.executable, COMMAND, "--cross", a.cross,
                                    "--export-worker", p, works[p], str(a.batch)]) for p in a.precision_list}
    for p, proc in exports.items():
        try:
            rc = proc.wait(timeout=max(30, left(a) - 200))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "timeout"
        if rc != 0 or not os.path.exists(package_path(works[p])):
            out["failures"].append(f"the {p} package's export: exit {rc}")
    if writer is not None:
        writer.join()
        if "error" in fixture:
            out["failures"].append(f"the fixture: {fixture['error']}")
            served = False
    mark(out, "fixture_and_exports", t0)
    save(a, out)
    return served


def serve(a, out, works, prec):
    """`prec` served: dlrm_v2_perf.py in a child process, within the time the later phases leave."""
    if "the fixture" in " ".join(out["failures"]) or not os.path.exists(package_path(works[prec])):
        out["skipped"].append(f"{prec} served: no package or no fixture")
        return
    # the room the later phases need (what they took on an H200): the reference, the other
    # served runs, the packages alone
    later = (0 if out["reference"] else REFERENCE_S(len(a.precision_list))) + PACKAGE_S * len(a.precision_list) \
        + sum(SERVED_S for p in a.precision_list if p not in out["served"] and p != prec)
    budget = min(a.served_budget_s, left(a) - later)
    if budget < 100:  # dlrm_v2_perf.py reaches the stream ~45 s in and runs it with 70 s of budget left
        out["skipped"].append(f"{prec} served: {left(a):.0f} s left")
        log(f"  (skipped: {prec} served; {left(a):.0f} s left)")
        return
    phase(f"{prec} served (dlrm_v2_perf.py, --budget-s {budget:.0f})")
    t0 = time.time()
    cmd = served_command(a, prec, budget)
    log("  " + " ".join(cmd))
    try:
        rc = subprocess.run(cmd, timeout=budget + 120).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    fig = served_figures(os.path.join(a.work, f"served_{prec}"))
    fig["rc"] = rc
    fig["budget_s"] = budget
    out["served"][prec] = fig
    if rc != 0:
        out["failures"].append(f"{prec} served: dlrm_v2_perf.py exit {rc}")
    mark(out, f"served_{prec}", t0)
    save(a, out)


def reference(a, out):
    """The bare PyTorch references of every precision, in a child process (--reference-worker)."""
    if left(a) < REFERENCE_S(len(a.precision_list)) * 0.7:
        out["skipped"].append(f"the reference: {left(a):.0f} s left")
        log(f"  (skipped: the reference; {left(a):.0f} s left)")
        return
    phase("the bare PyTorch reference (F.embedding_bag + the compiled network, CUDA graphs, streams)")
    t0 = time.time()
    path = os.path.join(a.work, "reference.json")
    if os.path.exists(path):
        os.remove(path)
    cmd = [sys.executable, COMMAND, "--reference-worker", path, "--device", a.device,
           "--precisions", ",".join(a.precision_list), "--cross", a.cross, "--scale", str(a.scale),
           "--batch", str(a.batch), "--big-pairs", str(a.big_pairs), "--streams", a.streams, "--iters", str(a.iters),
           "--repeats", str(a.repeats), "--alpha", str(a.alpha)]
    try:
        rc = subprocess.run(cmd, timeout=max(60, min(360, left(a) - 20))).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    if os.path.exists(path):
        with open(path) as f:
            out["reference"] = json.load(f)
    if rc != 0:
        out["failures"].append(f"the reference: exit {rc}")
    mark(out, "reference", t0)
    save(a, out)


def packages(a, out, works):
    """Each served package's network alone, timed by bench/gpu/aoti_bare (absent: skipped, said)."""
    if not os.path.exists(a.aoti_bare):
        out["skipped"].append(f"the packages alone: no {a.aoti_bare}")
        return
    from dlrm_v2_network import package_seconds
    for p in a.precision_list:
        path = package_path(works[p])
        if not os.path.exists(path) or left(a) < 25:
            out["skipped"].append(f"the {p} package alone" + ("" if os.path.exists(path) else ": no package"))
            continue
        phase(f"the {p} package's network alone (aoti_bare, CUDA graph replays)")
        t0 = time.time()
        try:
            secs = package_seconds(SimpleNamespace(aoti_bare=a.aoti_bare, iters=max(20, a.iters)), path, [a.batch])
        except Exception as e:  # noqa: BLE001 - said in the results
            secs = {}
            log(f"  aoti_bare: {e}")
        if a.batch in secs:
            out["package"][p] = {"net_s": secs[a.batch]}
            log(f"  {p} package, batch {a.batch:,}: {secs[a.batch] * 1e3:.3f} ms")
        else:
            out["failures"].append(f"the {p} package alone: no figure")
        mark(out, f"package_{p}", t0)
        save(a, out)


def finish(a, out):
    """The last phase: the figures and ratios, the console's summary, README.md and fair.png,
    call.tgz (run.sh's host.txt, nvidia-smi dmon's samples, both served runs' folders), the skips
    and failures printed; the exit status (1 where anything failed)."""
    phase("results")
    add_figures(out)
    save(a, out)
    for line in summary_lines(out):
        log(line)
    try:
        write_report(a.results, out)
    except Exception as e:  # noqa: BLE001 - results.json is written: --report-only makes it again
        log(f"the report failed ({e}); python3 bench/gpu/dlrm_v2_fair.py --report-only {a.results}")
        out["failures"].append(f"report: {e}")
    # one archive: the host's facts, the GPU's samples, both served runs whole
    with tarfile.open(os.path.join(a.results, "call.tgz"), "w:gz") as tar:
        for path in (os.path.join(a.results, "host.txt"), os.path.join(a.work, "gpu_dmon.log")):
            if os.path.exists(path):
                tar.add(path, arcname=f"call/{os.path.basename(path)}")
        for p in a.precision_list:
            folder = os.path.join(a.work, f"served_{p}")
            if os.path.isdir(folder):
                tar.add(folder, arcname=f"call/served_{p}")
    if os.path.exists(os.path.join(a.results, "host.txt")):
        os.remove(os.path.join(a.results, "host.txt"))  # in call.tgz, and at console.log's head
    for s in out["skipped"]:
        log(f"SKIPPED {s}")
    for f in out["failures"]:
        log(f"FAIL {f}")
    log(f"dlrm_v2_fair: {'every phase ran' if not out['failures'] else str(len(out['failures'])) + ' failures'}; "
        f"{time.time() - T0:.0f} s; results in {a.results}")
    return 1 if out["failures"] else 0
