"""The run's clock (bench/gpu/dlrm_v2_perf.py): a timestamped line as each phase starts, the
seconds each phase took (setup.json's `phases`), and the seconds left of --budget-s."""
import time

# the run's start: the module is imported as the command starts
T0 = time.time()
PHASES = {}  # {phase: seconds}, and "_open": (the phase under way, its start)


def phase(name):
    """A timestamped line per phase (flushed: a call cut off by its timeout still shows how far it got)."""
    now = time.time()
    if PHASES.get("_open"):
        last, t = PHASES["_open"]
        PHASES[last] = now - t
    PHASES["_open"] = (name, now)
    print(f"[{time.strftime('%H:%M:%S')} +{now - T0:4.0f} s] == {name}", flush=True)


def left_s(a):
    """Seconds left of --budget-s."""
    return a.budget_s - (time.time() - T0)
