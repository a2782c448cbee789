"""bench/gpu/host_qos.py's CPU idle polling: one SCHED_IDLE spinner per CPU while the run lasts,
none left behind when it ends (normally or killed)."""
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GPU_BENCH = os.path.join(HERE, "..", "..", "bench", "gpu")

CHILD = """
import os, sys, time
sys.path.insert(0, {bench!r})
from host_qos import keep_cpus_polling
pids = keep_cpus_polling({mode!r})
print(" ".join(map(str, pids)), flush=True)
time.sleep({hold})
"""


def policy(pid):
    """The scheduling class column of ps for `pid`; None once it is gone or dead (a zombie waiting
    for an init that may never reap it)."""
    out = subprocess.run(["ps", "-o", "stat=,cls=", "-p", str(pid)], capture_output=True, text=True).stdout.split()
    if not out or out[0].startswith("Z"):
        return None
    return out[1]


def gone(pids, timeout=5.0):
    end = time.time() + timeout
    while time.time() < end:
        if all(policy(p) is None for p in pids):
            return True
        time.sleep(0.05)
    return False


def start(mode, hold):
    proc = subprocess.Popen([sys.executable, "-c", CHILD.format(bench=GPU_BENCH, mode=mode, hold=hold)],
                            stdout=subprocess.PIPE, text=True)
    said = proc.stdout.readline()
    assert said.startswith(f"CPU idle polling ({mode}):"), said
    pids = [int(p) for p in proc.stdout.readline().split()]
    return proc, pids


def test_one_idle_spinner_per_cpu_and_none_after_the_run():
    for mode in ("yield", "spin"):
        proc, pids = start(mode, 0.5)
        assert len(pids) == len(os.sched_getaffinity(0))
        assert all(policy(p) == "IDL" for p in pids), [policy(p) for p in pids]
        proc.wait(timeout=10)
        assert gone(pids), f"{mode}: spinners left after the run"


def test_spinners_die_with_a_killed_run():
    proc, pids = start("yield", 60)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert gone(pids), "spinners left after the run was killed"


def test_an_unknown_mode_is_refused():
    sys.path.insert(0, GPU_BENCH)
    from host_qos import keep_cpus_polling
    try:
        keep_cpus_polling("busy")
    except ValueError as e:
        assert "busy" in str(e)
    else:
        raise AssertionError("mode 'busy' accepted")
