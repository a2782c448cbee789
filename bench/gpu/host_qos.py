"""The host's CPU wake-up latency, held low for a benchmark run (PM QoS).

A served request passes between threads that sleep when idle (Triton's gRPC/HTTP threads, its
scheduler, the instance thread), while a bare engine's loop never sleeps. On a virtual machine
a sleeping CPU halts into the hypervisor, and waking it costs tens of microseconds per hand-off.
Writing a latency bound to /dev/cpu_dma_latency (as tuned's latency-performance profile does)
keeps idle CPUs in shallow states for as long as the file stays open; closing it (the process
ending) restores the default. bench/gpu/run.sh --cpu-poll-idle / --cpu-latency-qos runs this
module beside a benchmark (off by default: a user's server runs without it).

Where the host has no cpuidle driver (the lent GPU machines: a virtual machine whose idle CPUs
halt into the hypervisor whatever PM QoS says), `keep_cpus_polling` does what the kernel's
`idle=poll` would: one process per CPU spinning at SCHED_IDLE, which any waking thread preempts
at once, so that no CPU halts while the run lasts. By default the spinners yield on every turn, so
that a busy host (many clients) loses no scheduler slice to them; "spin" is the bare loop, which
such a host pays for. The spinners die with the process that
started them (PR_SET_PDEATHSIG).
"""
import atexit
import ctypes
import os
import signal
import struct


def hold_cpu_latency(us=0):
    """Holds every CPU's wake-up latency at most `us` while the returned descriptor stays
    open; None, said, where the host refuses."""
    try:
        fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
        os.write(fd, struct.pack("i", us))
    except OSError as e:
        print(f"CPU latency QoS not held: {e}", flush=True)
        return None
    print(f"CPU latency QoS: {us} us held for this run (/dev/cpu_dma_latency)", flush=True)
    return fd


def _spin(cpu, yielding, parent):
    """A child's life: pinned to `cpu`, SCHED_IDLE, spinning until its parent dies. `parent` is
    the pid the parent read of itself before the fork: read here, after the fork, it would already
    be the reaper's if the parent died first, and the check below would pass."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the signal was set
            os._exit(0)
        os.sched_setaffinity(0, {cpu})
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError:
        os._exit(1)
    if yielding:
        # yielding on every turn: a runnable thread that the scheduler would let wait behind a
        # spinner's slice (a busy host, e.g. 64 clients) gets the CPU back within microseconds
        while os.getppid() == parent:
            os.sched_yield()
        os._exit(0)
    while True:
        pass


POLL_MODES = ("yield", "spin")


def keep_cpus_polling(mode="yield"):
    """Keeps every CPU this process may use from halting while the run lasts (see the module's
    note); `mode`: "yield" (the spinners yield on every turn) or "spin" (a bare loop); returns
    the spinners' pids, which are killed at exit."""
    if mode not in POLL_MODES:
        raise ValueError(f"CPU idle polling: mode {mode!r}, not one of {POLL_MODES}")
    pids = []
    me = os.getpid()
    for cpu in sorted(os.sched_getaffinity(0)):
        pid = os.fork()
        if pid == 0:
            _spin(cpu, mode == "yield", me)
        pids.append(pid)

    def stop():
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
    atexit.register(stop)
    print(f"CPU idle polling ({mode}): {len(pids)} spinners at SCHED_IDLE, one per CPU, for this run", flush=True)
    return pids


_held = []  # what apply_host_args holds for the run (the PM QoS descriptor stays open while listed)


def add_host_args(parser):
    """The host options every GPU benchmark takes: --cpu-latency-qos and --cpu-poll-idle."""
    parser.add_argument("--cpu-latency-qos", action="store_true",
                        help="hold the host's CPU wake-up latency at 0 us for the run (bench/gpu/host_qos.py)")
    parser.add_argument("--cpu-poll-idle", nargs="?", const="yield", default=None, choices=POLL_MODES,
                        help="keep every CPU from halting for the run, as idle=poll would: one SCHED_IDLE spinner "
                             "per CPU, yielding on every turn (default) or a bare loop (spin) (bench/gpu/host_qos.py; "
                             "for hosts without a cpuidle driver)")


def apply_host_args(args):
    """Holds what the options of add_host_args asked for until the process ends."""
    if args.cpu_latency_qos:
        _held.append(hold_cpu_latency())
    if args.cpu_poll_idle:
        _held.append(keep_cpus_polling(args.cpu_poll_idle))


if __name__ == "__main__":
    # bench/gpu/run.sh's opt-in helper: holds what the options ask for until this process is
    # ended (the spinners die with it)
    import argparse

    parser = argparse.ArgumentParser(description="hold a host tuning while a benchmark runs, until killed")
    add_host_args(parser)
    apply_host_args(parser.parse_args())
    while True:
        signal.pause()
