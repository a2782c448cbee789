"""The host's CPU wake-up latency, held low for a benchmark run (PM QoS).

A served request passes between threads that sleep when idle (Triton's gRPC/HTTP threads, its
scheduler, the instance thread), while a bare engine's loop never sleeps. On a virtual machine
a sleeping CPU halts into the hypervisor, and waking it costs tens of microseconds per hand-off.
Writing a latency bound to /dev/cpu_dma_latency (as tuned's latency-performance profile does)
keeps idle CPUs in shallow states for as long as the file stays open; closing it (the process
ending) restores the default. bench/gpu/host_probe.sh shows what a host offers.
"""
import os
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
