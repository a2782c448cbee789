#!/usr/bin/env bash
# On the GPU machine: what the host offers that host-side latency depends on (read only):
# processor, CPU idle states and their wake-up latencies, the frequency governor, whether PM QoS
# (/dev/cpu_dma_latency) can be held, the GPU's clocks as the driver reports them, and one thread
# waking another with CPUs halting and kept polling (wake_probe.py).
set -u
echo "== $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
grep -m1 -o 'hypervisor' /proc/cpuinfo >/dev/null && echo "virtual machine (hypervisor flag)"
d=/sys/devices/system/cpu
echo "cpuidle driver: $(cat $d/cpuidle/current_driver 2>/dev/null || echo none), governor: $(cat $d/cpuidle/current_governor_ro $d/cpuidle/current_governor 2>/dev/null | head -1)"
for s in $d/cpu0/cpuidle/state*; do
    [ -d "$s" ] && echo "  $(cat "$s/name"): exit latency $(cat "$s/latency") us, disabled $(cat "$s/disable"), used $(cat "$s/usage") times"
done
echo "cpufreq governor: $(cat $d/cpu0/cpufreq/scaling_governor 2>/dev/null || echo none)"
if [ -e /dev/cpu_dma_latency ]; then
    ls -l /dev/cpu_dma_latency
    python3 -c 'import os, struct; fd = os.open("/dev/cpu_dma_latency", os.O_RDWR); os.write(fd, struct.pack("i", 0)); print("PM QoS can be held (wrote 0 us)")' 2>&1
else
    echo "no /dev/cpu_dma_latency"
fi
nvidia-smi --query-gpu=name,persistence_mode,clocks.sm,clocks.max.sm,clocks.mem,power.draw,pstate --format=csv 2>&1
python3 "$(dirname "${BASH_SOURCE[0]}")/wake_probe.py" --rounds 2000 2>&1
